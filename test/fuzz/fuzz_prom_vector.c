/* Target prom_vector: the Prometheus /api/v1/query answer parser
 * (scaler/prom_source.c prom_parse_vector) and what the scaler does with its
 * result: scaler_state_prom_ok on a state holding a few targets, a tick, the
 * decisions and the /metrics and /models renderings.
 *
 * Input: the response body. Label "model_name" (thaw-scaler's default).
 * Checks: success gives label values and finite, non-negative values (0 for
 * NaN/Inf/negative, which are flagged invalid), failure a one-line reason and nothing to free; decisions
 * stay within [0, POLICY_MAX_REPLICAS]. Then again with an allocation failing. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <jansson.h>

#include "alloc.h"
#include "fuzz.h"
#include "metadata.h"
#include "policy.h"
#include "prom_source.h"
#include "state.h"

static const char *const models[] = {"llama-8b", "mistral", "qwen", "m\"odel{x=\"1\"}"};
#define NMODELS (sizeof(models) / sizeof(models[0]))

static struct target *targets[NMODELS];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    fuzz_jansson_no_oom();
    return 0;
}

static void on_change(void *ud, struct target *t, const struct policy_decision *old,
                      const struct policy_decision *now)
{
    (void)ud;
    (void)t;
    (void)old;
    FUZZ_CHECK(now->desired >= 0 && now->desired <= POLICY_MAX_REPLICAS, "desired %ld",
               (long)now->desired);
}

static struct scaler_state *make_state(int64_t now)
{
    struct scaler_state_config cfg = {.staleness_limit_ms = 60000,
                                      .scale_down_window_ms = 300000,
                                      .bursty_scale_down_window_ms = 300000,
                                      .wake_hold_ms = 5000,
                                      .target_expiry_ms = 3600000};
    struct scaler_state *st = scaler_state_new(&cfg, now, on_change, NULL);
    if (!st)
        return NULL;
    for (size_t i = 0; i < NMODELS; i++) {
        const char *keys[] = {"model"};
        const char *values[] = {models[i]};
        struct scaler_spec spec;
        char err[128];
        targets[i] = NULL;
        if (metadata_parse(keys, values, 1, &spec, NULL, NULL, err, sizeof(err)) != 0)
            continue;
        targets[i] = scaler_state_upsert(st, "ns", models[i], &spec, now);
        metadata_spec_finish(&spec);
    }
    return st;
}

static void run(const uint8_t *data, size_t size, bool checks)
{
    (void)checks; /* its checks hold under allocation failure too */
    /* An exact copy, not NUL-terminated: the parser takes a length. */
    char *body = malloc(size ? size : 1);
    if (!body)
        return;
    if (size)
        memcpy(body, data, size);
    struct prom_sample *s = (struct prom_sample *)(uintptr_t)1;
    size_t n = 12345;
    char err[256];
    memset(err, 'X', sizeof(err));
    int rc = prom_parse_vector(body, size, "model_name", &s, &n, err, sizeof(err));
    free(body);
    if (rc != 0) {
        FUZZ_CHECK(rc == -1, "rc %d", rc);
        FUZZ_CHECK(s == NULL && n == 0, "failure returned samples");
        size_t elen = strnlen(err, sizeof(err));
        FUZZ_CHECK(elen < sizeof(err) && elen > 0, "reason empty or not terminated");
        for (size_t i = 0; i < elen; i++)
            FUZZ_CHECK((unsigned char)err[i] >= 0x20 && err[i] != 0x7f,
                       "control byte in the reason");
        return;
    }
    FUZZ_CHECK(n == 0 || s != NULL, "%zu samples, no array", n);
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(s[i].label_value != NULL, "sample %zu without label", i);
        FUZZ_CHECK(isfinite(s[i].value) && s[i].value >= 0, "sample %zu value %g", i,
                   s[i].value);
        FUZZ_CHECK(!s[i].invalid || s[i].value == 0, "invalid sample %zu not 0", i);
    }
    int64_t now = 1000000;
    struct scaler_state *st = make_state(now);
    if (st) {
        scaler_state_prom_ok(st, s, n, now + 5000);
        scaler_state_tick(st, now + 10000);
        for (size_t i = 0; i < NMODELS; i++) {
            if (!targets[i])
                continue;
            const struct policy_decision *d = target_decision(targets[i]);
            FUZZ_CHECK(d->desired >= 0 && d->desired <= POLICY_MAX_REPLICAS, "desired %ld",
                       (long)d->desired);
        }
        struct evbuffer *out = evbuffer_new();
        if (out) {
            scaler_state_write_metrics(st, out, now + 10000);
            scaler_state_write_models_json(st, out, now + 10000);
            evbuffer_free(out);
        }
        scaler_state_free(st);
    }
    prom_samples_free(s, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_run_with_oom(run, data, size);
    return 0;
}
