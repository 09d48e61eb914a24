/* state: targets, shared signals, fail-safe and staleness, driven with fake time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>

#include "alloc.h"
#include "prom_source.h"
#include "redis_source.h"
#include "state.h"

static int changes;
static struct policy_decision last_change;

static void on_change(void *ud, struct target *t, const struct policy_decision *old,
                      const struct policy_decision *now)
{
    changes++;
    last_change = *now;
}

static const struct scaler_state_config cfg = {
    .staleness_limit_ms = 10000,
    .scale_down_window_ms = 0,
    .wake_hold_ms = 5000,
    .target_expiry_ms = 60000,
};

/* Policy v1: these tests are about the state's bookkeeping, and v1's plain
 * arithmetic keeps their expected numbers obvious (test_policy covers v2;
 * test_policy_v2_reaches_the_decision below checks the state passes it on). */
static struct scaler_spec spec_for(const char *model, const char *key)
{
    struct scaler_spec s;
    char err[128];
    const char *k[] = {"model", "policy", "redisKey"};
    const char *v[] = {model, "v1", key};
    assert_int_equal(metadata_parse(k, v, key ? 3 : 2, &s, NULL, NULL, err, sizeof(err)), 0);
    return s;
}

/* Every queue reads empty, as after a first Redis round trip. */
static void queues_empty(struct scaler_state *st, int64_t now)
{
    const struct redis_queue_query *q;
    size_t n = scaler_state_queue_batch(st, &q);
    long long zeros[8] = {0};
    assert_true(n <= 8);
    scaler_state_queue_ok(st, zeros, n, now);
}

/* Every source read once with nothing in it: the scaler's first reads
 * after targets appear. Until then a target awaits its first reading. */
static void sources_read_empty(struct scaler_state *st, int64_t now)
{
    scaler_state_prom_ok(st, NULL, 0, now);
    queues_empty(st, now);
    const char *const *models;
    size_t n = scaler_state_held_batch(st, &models);
    long long zeros[8] = {0};
    assert_true(n <= 8);
    scaler_state_held_ok(st, zeros, NULL, NULL, NULL, NULL, n, now);
}

/* /metrics then /models as one NUL-terminated text, kept in *b (caller frees). */
static const char *render(const struct scaler_state *st, int64_t now_ms, struct evbuffer **b)
{
    *b = evbuffer_new();
    assert_non_null(*b);
    scaler_state_write_metrics(st, *b, now_ms);
    scaler_state_write_models_json(st, *b, now_ms);
    evbuffer_add(*b, "", 1);
    return (const char *)evbuffer_pullup(*b, -1);
}

static void test_targets_share_signals(void **unused)
{
    struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
    struct scaler_spec a = spec_for("m1", NULL);
    struct scaler_spec b = spec_for("m1", "custom");
    struct target *t1 = scaler_state_upsert(st, "ns", "so1", &a, 0);
    struct target *t2 = scaler_state_upsert(st, "ns", "so2", &b, 0);
    assert_non_null(t1);
    assert_ptr_equal(scaler_state_upsert(st, "ns", "so1", &a, 10), t1);
    assert_int_equal(scaler_state_target_count(st), 2);
    sources_read_empty(st, 50);

    struct prom_sample s[] = {{"m1", 1500, false}, {"other", 9999, false}};
    scaler_state_prom_ok(st, s, 2, 100);
    assert_int_equal(target_decision(t1)->desired, 2);
    assert_int_equal(target_decision(t2)->desired, 2);

    const struct redis_queue_query *q;
    size_t nq = scaler_state_queue_batch(st, &q);
    assert_int_equal(nq, 2); /* two distinct keys */
    long long lengths[2];
    for (size_t i = 0; i < nq; i++)
        lengths[i] = strcmp(q[i].key, "custom") == 0 ? 55 : -1;
    scaler_state_queue_ok(st, lengths, nq, 200);
    assert_int_equal(target_decision(t2)->desired, 6);
    assert_int_equal(target_decision(t2)->reason, POLICY_REASON_QUEUE);
    assert_int_equal(target_decision(t1)->desired, 2); /* -1 (wrong type) counts as 0 */
    /* A stream without the consumer group: its whole length (-2 - n) waits. */
    for (size_t i = 0; i < nq; i++)
        lengths[i] = strcmp(q[i].key, "custom") == 0 ? -2 - 75 : -1;
    scaler_state_queue_ok(st, lengths, nq, 250);
    assert_int_equal(target_decision(t2)->desired, 8);

    /* A busy model missing from the next answer is a gap in the data, not
     * idleness: its rate is kept (stale) up to the staleness limit... */
    scaler_state_prom_ok(st, NULL, 0, 300);
    assert_int_equal(target_decision(t1)->desired, 2);
    assert_true(target_decision(t1)->active);
    scaler_state_prom_ok(st, NULL, 0, 10300);
    assert_int_equal(target_decision(t1)->desired, 2);
    assert_false(target_beyond_staleness(st, t1, 10300));
    /* ...and past it too while the model is active (its idle series would
     * be there, at 0): the target is then beyond the limit, so GetMetrics
     * fails and KEDA's fallback applies, and it is never read as idle. */
    scaler_state_prom_ok(st, NULL, 0, 10301);
    scaler_state_prom_ok(st, NULL, 0, 60000);
    assert_int_equal(target_decision(t1)->desired, 2);
    assert_true(target_decision(t1)->active);
    assert_true(target_beyond_staleness(st, t1, 60000));
    /* Present again with 0: idle at once, and current again. */
    struct prom_sample zero[] = {{"m1", 0, false}};
    scaler_state_prom_ok(st, zero, 1, 60100);
    assert_int_equal(target_decision(t1)->desired, 0);
    assert_false(target_beyond_staleness(st, t1, 60100));
    metadata_spec_finish(&a);
    metadata_spec_finish(&b);
    scaler_state_free(st);
}

/* A model no target keeps active (here below its activation rate) whose
 * series vanish has had its pods removed: past the staleness limit its rate
 * reads 0 and it is not beyond the limit (IsActive would refuse to answer
 * inactive for ever otherwise). */
static void test_absent_inactive_model_reads_zero(void **unused)
{
    struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
    struct scaler_spec a;
    char err[128];
    const char *k[] = {"model", "policy", "activationTokenRate"};
    const char *v[] = {"m1", "v1", "100"};
    assert_int_equal(metadata_parse(k, v, 3, &a, NULL, NULL, err, sizeof(err)), 0);
    struct target *t = scaler_state_upsert(st, "ns", "so", &a, 0);
    sources_read_empty(st, 50);
    struct prom_sample s[] = {{"m1", 50, false}};
    scaler_state_prom_ok(st, s, 1, 100);
    assert_false(target_decision(t)->active);
    scaler_state_prom_ok(st, NULL, 0, 200);
    scaler_state_prom_ok(st, NULL, 0, 200 + cfg.staleness_limit_ms + 1);
    assert_false(target_beyond_staleness(st, t, 200 + cfg.staleness_limit_ms + 1));
    assert_int_equal(target_decision(t)->desired, 0);
    metadata_spec_finish(&a);
    scaler_state_free(st);
}

static void test_held_and_wake(void **unused)
{
    struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
    struct scaler_spec a = spec_for("m1", NULL);
    struct target *t = scaler_state_upsert(st, "ns", "so", &a, 0);
    scaler_state_prom_ok(st, NULL, 0, 1);
    queues_empty(st, 1);
    const char *const *models;
    assert_int_equal(scaler_state_held_batch(st, &models), 1);
    assert_string_equal(models[0], "m1");
    long long held = 4;
    scaler_state_held_ok(st, &held, NULL, NULL, NULL, NULL, 1, 10);
    assert_true(target_decision(t)->active);
    assert_int_equal(target_decision(t)->reason, POLICY_REASON_HELD);
    held = 0;
    scaler_state_held_ok(st, &held, NULL, NULL, NULL, NULL, 1, 20);
    assert_false(target_decision(t)->active);

    changes = 0;
    assert_int_equal(scaler_state_wake(st, "m1", NULL, 1, 1000), 1);
    assert_int_equal(changes, 1);
    assert_true(last_change.active);
    /* A held poll racing the wake does not flip it back... */
    scaler_state_held_ok(st, &held, NULL, NULL, NULL, NULL, 1, 1100);
    assert_true(target_decision(t)->active);
    /* ...until the wake hold expires. */
    scaler_state_tick(st, 6001);
    assert_false(target_decision(t)->active);
    assert_int_equal(scaler_state_wake(st, "unknown", NULL, 1, 7000), 0);
    metadata_spec_finish(&a);
    scaler_state_free(st);
}

static int new_targets, fresh_targets;
static void count_new(void *ud, struct target *t) { new_targets++; }
static void count_fresh(void *ud, struct target *t) { fresh_targets++; }

/* After a restart (or for a new ScaledObject) a target's first decision is
 * made on zeros nobody read: it must not pass for a reading. The target
 * awaits its first reading until Prometheus, its queue and the held counts
 * have all answered since it appeared, and its idle guess never lowers what
 * the first real reading says. */
static void test_new_target_awaits_its_first_reading(void **unused)
{
    struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
    new_targets = fresh_targets = 0;
    scaler_state_set_target_hooks(st, count_new, NULL, count_fresh, NULL);
    struct scaler_spec a = spec_for("m1", NULL);
    struct target *t = scaler_state_upsert(st, "ns", "so", &a, 0);
    assert_int_equal(new_targets, 1);
    assert_true(target_awaiting_data(t));
    assert_false(target_decision(t)->active); /* the guess the service holds back */

    /* Each source alone is not enough. */
    struct prom_sample busy[] = {{"m1", 3000, false}};
    scaler_state_prom_ok(st, busy, 1, 10);
    assert_true(target_awaiting_data(t));
    queues_empty(st, 20);
    assert_true(target_awaiting_data(t));
    assert_int_equal(fresh_targets, 0);
    const char *const *models;
    assert_int_equal(scaler_state_held_batch(st, &models), 1);
    long long zero = 0;
    scaler_state_held_ok(st, &zero, NULL, NULL, NULL, NULL, 1, 30);
    assert_false(target_awaiting_data(t));
    assert_int_equal(fresh_targets, 1);
    assert_int_equal(target_decision(t)->desired, 3);
    assert_true(target_decision(t)->active);
    struct evbuffer *b;
    assert_non_null(strstr(render(st, 40, &b), "\"awaitingData\":false"));
    evbuffer_free(b);

    /* A second ScaledObject for the model and queue already read is fresh
     * at once; one for a new model and key waits for the next Prometheus
     * answer, even with its queue and held count read, and is decided from
     * that answer. */
    scaler_state_prom_ok(st, busy, 1, 50);
    struct target *t2 = scaler_state_upsert(st, "ns", "so2", &a, 60);
    assert_false(target_awaiting_data(t2));
    assert_int_equal(new_targets, 1);
    assert_int_equal(fresh_targets, 2);
    struct scaler_spec c = spec_for("m2", NULL);
    struct target *t3 = scaler_state_upsert(st, "ns", "so3", &c, 70);
    assert_int_equal(new_targets, 2);
    assert_true(target_awaiting_data(t3));
    assert_non_null(strstr(render(st, 75, &b), "\"awaitingData\":true"));
    evbuffer_free(b);
    long long held2[2] = {0, 0};
    assert_int_equal(scaler_state_held_batch(st, &models), 2);
    scaler_state_held_ok(st, held2, NULL, NULL, NULL, NULL, 2, 80);
    queues_empty(st, 85); /* its queue key is new too */
    assert_true(target_awaiting_data(t3));
    struct prom_sample both[] = {{"m1", 3000, false}, {"m2", 5000, false}};
    scaler_state_prom_ok(st, both, 2, 90);
    assert_false(target_awaiting_data(t3));
    assert_int_equal(fresh_targets, 3);
    assert_int_equal(target_decision(t3)->desired, 5);

    /* The held count is read per model: a batch taken before a model
     * appeared does not cover it, even though it succeeds after. */
    struct scaler_spec e = spec_for("m5", NULL);
    assert_int_equal(scaler_state_held_batch(st, &models), 2); /* m1, m2 */
    struct target *t5 = scaler_state_upsert(st, "ns", "so5", &e, 91);
    scaler_state_held_ok(st, held2, NULL, NULL, NULL, NULL, 2, 92);
    struct prom_sample three[] = {{"m1", 3000, false}, {"m2", 5000, false}, {"m5", 1000, false}};
    scaler_state_prom_ok(st, three, 3, 93);
    queues_empty(st, 94);
    assert_true(target_awaiting_data(t5));
    long long held3[3] = {0, 0, 0};
    assert_int_equal(scaler_state_held_batch(st, &models), 3);
    scaler_state_held_ok(st, held3, NULL, NULL, NULL, NULL, 3, 95);
    assert_false(target_awaiting_data(t5));

    /* A source failing at the start keeps a new target waiting. */
    scaler_state_source_failed(st, SOURCE_PROMETHEUS, "HTTP 503", 100);
    assert_true(scaler_state_source_failing(st));
    struct scaler_spec d = spec_for("m3", NULL);
    struct target *t4 = scaler_state_upsert(st, "ns", "so4", &d, 110);
    scaler_state_tick(st, 1110);
    assert_true(target_awaiting_data(t4));
    metadata_spec_finish(&a);
    metadata_spec_finish(&c);
    metadata_spec_finish(&d);
    metadata_spec_finish(&e);
    scaler_state_free(st);
}

/* A series that says NaN, ±Inf or a negative rate is no reading: the model's
 * last good rate is kept (stale), as for a failing source, never read as 0
 * (a busy model to zero) nor summed into an infinity (a /models it cannot
 * render). Past the staleness limit the target is beyond it (UNAVAILABLE). */
static void test_invalid_token_rate_keeps_last_good(void **unused)
{
    struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
    struct scaler_spec a = spec_for("m1", NULL);
    struct target *t = scaler_state_upsert(st, "ns", "so", &a, 0);
    sources_read_empty(st, 1);
    struct prom_sample busy[] = {{"m1", 3000, false}};
    scaler_state_prom_ok(st, busy, 1, 10);
    assert_int_equal(target_decision(t)->desired, 3);

    struct prom_sample nan[] = {{"m1", 0, true}, {"m1", 500, false}};
    scaler_state_prom_ok(st, nan, 2, 20);
    assert_int_equal(target_decision(t)->desired, 3);
    assert_true(target_decision(t)->active);
    struct evbuffer *b;
    const char *text = render(st, 30, &b);
    assert_non_null(strstr(text, "\"tokenRate\":3000"));
    assert_non_null(strstr(text, "\"tokenRateStale\":true"));
    evbuffer_free(b);
    assert_false(target_beyond_staleness(st, t, 20 + cfg.staleness_limit_ms));
    assert_true(target_beyond_staleness(st, t, 21 + cfg.staleness_limit_ms));

    /* Two finite series whose sum overflows. */
    struct prom_sample valid[] = {{"m1", 1000, false}};
    scaler_state_prom_ok(st, valid, 1, 40);
    assert_false(target_beyond_staleness(st, t, 41 + cfg.staleness_limit_ms));
    struct prom_sample huge[] = {{"m1", 1e308, false}, {"m1", 1e308, false}};
    scaler_state_prom_ok(st, huge, 2, 50);
    text = render(st, 60, &b);
    assert_non_null(strstr(text, "\"tokenRate\":1000"));
    assert_non_null(strstr(text, "\"tokenRateStale\":true"));
    evbuffer_free(b);
    assert_int_equal(target_decision(t)->desired, 1); /* the fail-safe holds the last */

    /* Valid again: a reading, stale no more. */
    scaler_state_prom_ok(st, valid, 1, 70);
    assert_int_equal(target_decision(t)->desired, 1);
    assert_false(target_beyond_staleness(st, t, 71 + cfg.staleness_limit_ms));

    /* A new model whose series is NaN from the start: every source has
     * answered, so its calls need not wait, yet it has no reading. */
    struct scaler_spec c = spec_for("m2", NULL);
    struct target *t2 = scaler_state_upsert(st, "ns", "so2", &c, 80);
    assert_true(target_first_read_due(t2));
    queues_empty(st, 85);
    const char *const *models;
    long long zeros[2] = {0, 0};
    assert_int_equal(scaler_state_held_batch(st, &models), 2);
    scaler_state_held_ok(st, zeros, NULL, NULL, NULL, NULL, 2, 86);
    assert_true(target_first_read_due(t2)); /* no Prometheus answer since it came */
    struct prom_sample nan2[] = {{"m1", 1000, false}, {"m2", 0, true}};
    scaler_state_prom_ok(st, nan2, 2, 90);
    assert_true(target_awaiting_data(t2));
    assert_false(target_first_read_due(t2));
    metadata_spec_finish(&a);
    metadata_spec_finish(&c);
    scaler_state_free(st);
}

/* The held input /models shows for the first target. */
static double held_input(const struct scaler_state *st, int64_t now_ms)
{
    struct evbuffer *b;
    const char *text = render(st, now_ms, &b);
    const char *p = strstr(text, "\"heldRequests\":");
    assert_non_null(p);
    double v = strtod(p + strlen("\"heldRequests\":"), NULL);
    evbuffer_free(b);
    return v;
}

/* Wakes posted with an activator's id and held count (Redis down): counts of
 * different activators add up, an activator's newer count replaces its older
 * one, an unnamed wake (a Redis message) is not added on top, and Redis's own
 * count wins when larger. */
static void test_wake_claims(void **unused)
{
    struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
    struct scaler_spec a = spec_for("m1", NULL);
    scaler_state_upsert(st, "ns", "so1", &a, 0);
    assert_int_equal(held_input(st, 0), 0);
    scaler_state_wake(st, "m1", NULL, 1, 1000);
    assert_int_equal(held_input(st, 1000), 1);
    scaler_state_wake(st, "m1", "act-a", 30, 1100);
    assert_int_equal(held_input(st, 1100), 30); /* not 31: one wake, two paths */
    scaler_state_wake(st, "m1", "act-b", 12, 1200);
    assert_int_equal(held_input(st, 1200), 42);
    scaler_state_wake(st, "m1", "act-a", 40, 2100); /* act-a's renewal */
    assert_int_equal(held_input(st, 2100), 52);
    scaler_state_wake(st, "m1", "act-c", 0, 2200); /* a wake is at least 1 */
    assert_int_equal(held_input(st, 2200), 53);
    /* act-b's claim (1200 + 5000) ends; act-a's and act-c's go on. */
    assert_int_equal(held_input(st, 6300), 41);
    const char *const *models;
    assert_int_equal(scaler_state_held_batch(st, &models), 1);
    long long held = 100;
    scaler_state_held_ok(st, &held, NULL, NULL, NULL, NULL, 1, 6400);
    assert_int_equal(held_input(st, 6400), 100);
    held = 0;
    scaler_state_held_ok(st, &held, NULL, NULL, NULL, NULL, 1, 6500);
    assert_int_equal(held_input(st, 6500), 41);
    assert_int_equal(held_input(st, 7300), 0); /* every claim ended */
    /* More activators than slots: the claims ending first make room. */
    char id[16];
    for (int i = 0; i < WAKE_CLAIMS + 4; i++) {
        snprintf(id, sizeof(id), "act-%d", i);
        scaler_state_wake(st, "m1", id, 1, 8000 + i);
    }
    assert_int_equal(held_input(st, 8000 + WAKE_CLAIMS + 4), WAKE_CLAIMS);
    metadata_spec_finish(&a);
    scaler_state_free(st);

    /* With a cap, the claims of many instance ids add up to the cap at
     * most; Redis's own count is not capped. */
    struct scaler_state_config capped = cfg;
    capped.max_wake_held = 50;
    st = scaler_state_new(&capped, 0, on_change, NULL);
    a = spec_for("m1", NULL);
    scaler_state_upsert(st, "ns", "so1", &a, 0);
    for (int i = 0; i < 4; i++) {
        snprintf(id, sizeof(id), "act-%d", i);
        scaler_state_wake(st, "m1", id, 30, 1000 + i);
    }
    assert_int_equal(held_input(st, 1010), 50);
    assert_int_equal(scaler_state_held_batch(st, &models), 1);
    held = 70;
    scaler_state_held_ok(st, &held, NULL, NULL, NULL, NULL, 1, 1020);
    assert_int_equal(held_input(st, 1020), 70);
    metadata_spec_finish(&a);
    scaler_state_free(st);
}

static void test_fail_safe_and_staleness(void **unused)
{
    struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
    struct scaler_spec a = spec_for("m1", NULL);
    struct target *t = scaler_state_upsert(st, "ns", "so", &a, 0);
    queues_empty(st, 1);
    struct prom_sample s[] = {{"m1", 3000, false}};
    scaler_state_prom_ok(st, s, 1, 100);
    assert_int_equal(target_decision(t)->desired, 3);
    scaler_state_source_failed(st, SOURCE_PROMETHEUS, "HTTP 503", 1000);
    assert_int_equal(target_decision(t)->desired, 3);
    assert_true(target_decision(t)->active);
    assert_false(target_beyond_staleness(st, t, 10100));
    assert_true(target_beyond_staleness(st, t, 10101));
    /* Redis failing too changes nothing in the answer. */
    scaler_state_source_failed(st, SOURCE_REDIS_HELD, "not connected", 2000);
    scaler_state_tick(st, 20000);
    assert_int_equal(target_decision(t)->desired, 3);
    assert_true(target_decision(t)->active);
    /* Recovery with fresh data scales down at once (window 0). */
    struct prom_sample zero[] = {{"m1", 0, false}};
    scaler_state_prom_ok(st, zero, 1, 21000);
    const char *const *models;
    assert_int_equal(scaler_state_held_batch(st, &models), 1);
    long long held = 0;
    scaler_state_held_ok(st, &held, NULL, NULL, NULL, NULL, 1, 21000);
    assert_int_equal(target_decision(t)->desired, 0);
    assert_false(target_beyond_staleness(st, t, 21001));

    struct evbuffer *b;
    const char *text = render(st, 22000, &b);
    assert_non_null(strstr(text, "thaw_scaler_source_errors_total{source=\"prometheus\"} 1"));
    assert_non_null(strstr(text, "thaw_scaler_desired_replicas{namespace=\"ns\",scaledobject=\"so\",model=\"m1\"} 0"));
    assert_non_null(strstr(text, "\"reason\":\"idle\""));
    evbuffer_free(b);
    metadata_spec_finish(&a);
    scaler_state_free(st);
}

static void test_spec_change_and_gc(void **unused)
{
    struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
    struct scaler_spec a = spec_for("m1", "k1");
    struct scaler_spec b = spec_for("m1", "k2");
    struct target *t = scaler_state_upsert(st, "ns", "so", &a, 0);
    const struct redis_queue_query *q;
    assert_int_equal(scaler_state_queue_batch(st, &q), 1);
    long long len = 70;
    scaler_state_queue_ok(st, &len, 1, 5);
    assert_int_equal(target_decision(t)->desired, 7);
    /* redisKey changes: until the new key is read, the decision holds. */
    assert_ptr_equal(scaler_state_upsert(st, "ns", "so", &b, 10), t);
    assert_string_equal(target_spec(t)->redis_key, "k2");
    assert_int_equal(target_decision(t)->desired, 7);
    assert_true(target_decision(t)->active);
    scaler_state_gc(st, 20);
    assert_int_equal(scaler_state_queue_batch(st, &q), 1); /* k1 is gone */
    assert_string_equal(q[0].key, "k2");

    target_ref(t);
    scaler_state_gc(st, 100000);
    assert_int_equal(scaler_state_target_count(st), 1); /* streams keep it */
    target_unref(t);
    scaler_state_gc(st, 100000);
    assert_int_equal(scaler_state_target_count(st), 0);
    assert_int_equal(scaler_state_queue_batch(st, &q), 0);
    metadata_spec_finish(&a);
    metadata_spec_finish(&b);
    scaler_state_free(st);
}

/* New targets past max_targets are refused and counted; known ones are
 * still served, and one expires to make room. */
static void test_target_limit(void **unused)
{
    struct scaler_state_config small = cfg;
    small.max_targets = 2;
    struct scaler_state *st = scaler_state_new(&small, 0, on_change, NULL);
    struct scaler_spec a = spec_for("m1", NULL), b = spec_for("m2", NULL);
    struct target *t1 = scaler_state_upsert(st, "ns", "so1", &a, 0);
    assert_non_null(t1);
    assert_false(scaler_state_full(st));
    struct target *t2 = scaler_state_upsert(st, "ns", "so2", &b, 0);
    assert_non_null(t2);
    assert_true(scaler_state_full(st));
    assert_null(scaler_state_upsert(st, "ns", "so3", &a, 1000));
    assert_null(scaler_state_upsert(st, "ns", "so1", &b, 1000)); /* same name, new model */
    assert_int_equal(scaler_state_target_count(st), 2);
    /* Known targets are still found, and keep being asked about. */
    assert_ptr_equal(scaler_state_upsert(st, "ns", "so1", &a, 50000), t1);
    struct evbuffer *buf;
    const char *text = render(st, 50000, &buf);
    assert_non_null(strstr(text, "thaw_scaler_targets 2\n"));
    assert_non_null(strstr(text, "thaw_scaler_targets_max 2\n"));
    assert_non_null(strstr(text, "thaw_scaler_targets_refused_total 2\n"));
    evbuffer_free(buf);
    /* so2 was last asked about at 0: expired at 70 s, its slot is free. */
    scaler_state_gc(st, 70000);
    assert_int_equal(scaler_state_target_count(st), 1);
    assert_false(scaler_state_full(st));
    assert_non_null(scaler_state_upsert(st, "ns", "so3", &b, 70000));
    metadata_spec_finish(&a);
    metadata_spec_finish(&b);
    scaler_state_free(st);
}

static void test_out_of_memory_never_crashes(void **unused)
{
    struct scaler_spec a = spec_for("m1", NULL);
    for (long n = 0; n < 40; n++) {
        alloc_fail_after(n);
        struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
        if (st) {
            scaler_state_upsert(st, "ns", "so", &a, 0);
            const struct redis_queue_query *q;
            const char *const *m;
            scaler_state_queue_batch(st, &q);
            scaler_state_held_batch(st, &m);
            scaler_state_gc(st, 0);
        }
        alloc_fail_after(-1);
        scaler_state_free(st);
    }
    metadata_spec_finish(&a);
}

/* A page built in steps of any size is the page built at once. */
static char *page_text(const struct scaler_state *st, struct scaler_page *pg, int64_t now_ms,
                       size_t budget, int *steps)
{
    struct evbuffer *b = evbuffer_new();
    assert_non_null(b);
    assert_non_null(pg);
    int rc, n = 0;
    while ((rc = scaler_page_step(pg, st, b, now_ms, budget)) == 0)
        n++;
    assert_int_equal(rc, 1);
    assert_int_equal(scaler_page_step(pg, st, b, now_ms, budget), 1); /* stays complete */
    scaler_page_free(pg);
    if (steps)
        *steps = n + 1;
    size_t len = evbuffer_get_length(b);
    char *text = malloc(len + 1);
    assert_non_null(text);
    evbuffer_remove(b, text, len);
    text[len] = '\0';
    evbuffer_free(b);
    return text;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static struct scaler_state *state_with_targets(struct scaler_spec *specs, int n)
{
    struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
    char model[16], name[16];
    for (int i = 0; i < n; i++) {
        snprintf(model, sizeof(model), "m%d", i % 3);
        snprintf(name, sizeof(name), "so%d", i);
        specs[i] = spec_for(model, NULL);
        assert_non_null(scaler_state_upsert(st, "ns", name, &specs[i], 0));
    }
    queues_empty(st, 1);
    return st;
}

static void test_pages_in_steps_are_the_whole_page(void **unused)
{
    struct scaler_spec specs[7];
    struct scaler_state *st = state_with_targets(specs, 7);
    struct prom_sample rate = {"m1", 2500, false};
    scaler_state_prom_ok(st, &rate, 1, 2);
    struct evbuffer *whole = evbuffer_new();
    scaler_state_write_metrics(st, whole, 3);
    evbuffer_add(whole, "", 1);
    const char *metrics = (const char *)evbuffer_pullup(whole, -1);
    /* 7 targets x 11 families, 3 models x 5, their wake and to-zero series
     * and one decision each. */
    assert_int_equal(count_of(metrics, "thaw_scaler_desired_replicas{"), 7);
    assert_int_equal(count_of(metrics, "thaw_scaler_input_token_rate{"), 3);
    assert_non_null(strstr(metrics, "thaw_scaler_input_token_rate{model=\"m1\"} 2500\n"));
    for (size_t budget = 1; budget <= 64; budget *= 4) {
        int steps;
        char *text = page_text(st, scaler_state_metrics_page(st, 3), 3, budget, &steps);
        assert_string_equal(text, metrics);
        /* Steps of `budget` samples: many of one, few of 64. */
        assert_true(budget > 1 || steps > 7 * 11);
        assert_true(budget < 64 || steps < 10);
        free(text);
    }
    evbuffer_drain(whole, evbuffer_get_length(whole));
    scaler_state_write_models_json(st, whole, 3);
    evbuffer_add(whole, "", 1);
    const char *models = (const char *)evbuffer_pullup(whole, -1);
    assert_int_equal(models[0], '[');
    assert_int_equal(count_of(models, "\"scaledObject\":"), 7);
    for (size_t budget = 1; budget <= 8; budget *= 2) {
        char *text = page_text(st, scaler_state_models_page(st, 3), 3, budget, NULL);
        assert_string_equal(text, models);
        free(text);
    }
    evbuffer_free(whole);
    scaler_state_free(st);
    for (int i = 0; i < 7; i++)
        metadata_spec_finish(&specs[i]);
}

/* Between two steps the state changes and targets come and go: a metrics
 * page reads as of its start, a models page leaves out what was removed and
 * waits with what was added, and neither touches freed memory (ASan). */
static void test_pages_outlive_changes_between_steps(void **unused)
{
    struct scaler_spec specs[4];
    struct scaler_state *st = state_with_targets(specs, 4);
    struct evbuffer *before = evbuffer_new();
    scaler_state_write_metrics(st, before, 5);
    evbuffer_add(before, "", 1);

    struct scaler_page *mp = scaler_state_metrics_page(st, 5);
    struct scaler_page *jp = scaler_state_models_page(st, 5);
    struct evbuffer *m = evbuffer_new(), *j = evbuffer_new();
    assert_int_equal(scaler_page_step(mp, st, m, 5, 1), 0);
    assert_int_equal(scaler_page_step(jp, st, j, 5, 1), 0); /* "[" and the first target */

    /* A new target, a new rate, and every old target expired and freed. */
    struct scaler_spec late = spec_for("m9", NULL);
    struct target *t = scaler_state_upsert(st, "ns", "late", &late, 70000);
    assert_non_null(t);
    struct prom_sample rate = {"m0", 9000, false};
    scaler_state_prom_ok(st, &rate, 1, 70001);
    scaler_state_gc(st, 70002);
    assert_int_equal(scaler_state_target_count(st), 1);

    int rc;
    while ((rc = scaler_page_step(mp, st, m, 70003, 1)) == 0)
        ;
    assert_int_equal(rc, 1);
    evbuffer_add(m, "", 1);
    assert_string_equal((const char *)evbuffer_pullup(m, -1),
                        (const char *)evbuffer_pullup(before, -1));
    while ((rc = scaler_page_step(jp, st, j, 70003, 1)) == 0)
        ;
    assert_int_equal(rc, 1);
    evbuffer_add(j, "", 1);
    const char *models = (const char *)evbuffer_pullup(j, -1);
    /* The one target rendered before the gc, none after; "late" is not in it. */
    assert_int_equal(count_of(models, "\"scaledObject\":"), 1);
    assert_null(strstr(models, "\"late\""));
    assert_int_equal(models[strlen(models) - 1], ']');
    scaler_page_free(mp);
    scaler_page_free(jp);
    evbuffer_free(m);
    evbuffer_free(j);
    evbuffer_free(before);
    scaler_state_free(st);
    metadata_spec_finish(&late);
    for (int i = 0; i < 4; i++)
        metadata_spec_finish(&specs[i]);
}

/* alloc_fail_after reaches Thaw's own allocations (a page's rows, arena,
 * long lines), not libevent's or jansson's. */
static void test_pages_out_of_memory(void **unused)
{
    struct scaler_spec specs[3];
    struct scaler_state *st = state_with_targets(specs, 3);
    int failed = 0;
    for (long n = 0; n < 60; n++) {
        struct evbuffer *b = evbuffer_new();
        alloc_fail_after(n);
        struct scaler_page *pg = scaler_state_metrics_page(st, 1);
        int rc = pg ? 0 : -1;
        while (rc == 0)
            rc = scaler_page_step(pg, st, b, 1, 2);
        scaler_page_free(pg);
        pg = scaler_state_models_page(st, 1);
        int rc2 = pg ? 0 : -1;
        while (rc2 == 0)
            rc2 = scaler_page_step(pg, st, b, 1, 1);
        scaler_page_free(pg);
        alloc_fail_after(-1);
        failed += rc < 0 || rc2 < 0;
        evbuffer_free(b);
    }
    assert_true(failed > 0); /* the failures were reached, and reported */
    scaler_state_free(st);
    for (int i = 0; i < 3; i++)
        metadata_spec_finish(&specs[i]);
}

/* Requests waiting at activators' concurrency caps are a backlog, added to
 * the job queue: they scale like queued jobs, not like a wake. */
static void test_queued_at_cap_is_backlog(void **unused)
{
    struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
    struct scaler_spec a = spec_for("m1", "jobs");
    struct target *t = scaler_state_upsert(st, "ns", "so", &a, 0);
    scaler_state_prom_ok(st, NULL, 0, 1);
    const struct redis_queue_query *q;
    assert_int_equal(scaler_state_queue_batch(st, &q), 1);
    long long jobs = 5;
    scaler_state_queue_ok(st, &jobs, 1, 1);
    const char *const *models;
    assert_int_equal(scaler_state_held_batch(st, &models), 1);
    long long held = 0, queued = 25;
    scaler_state_held_ok(st, &held, &queued, NULL, NULL, NULL, 1, 2);
    /* v1: ceil((5 + 25) / 10) */
    assert_int_equal(target_decision(t)->desired, 3);
    assert_true(target_decision(t)->active);
    assert_int_equal(target_decision(t)->reason, POLICY_REASON_QUEUE);

    struct evbuffer *b;
    const char *text = render(st, 3, &b);
    assert_non_null(strstr(text, "thaw_scaler_input_queued_requests{model=\"m1\"} 25"));
    assert_non_null(strstr(text, "\"queuedRequests\":25"));
    assert_non_null(strstr(text, "\"queueLength\":5"));
    /* v1: all of the capacity */
    assert_non_null(strstr(
        text, "thaw_scaler_utilisation_target{namespace=\"ns\",scaledobject=\"so\",model=\"m1\"} 1"));
    /* v1 has no request-size model and no keep-warm: 0 and no sample. */
    assert_non_null(strstr(
        text, "thaw_scaler_tokens_per_request{namespace=\"ns\",scaledobject=\"so\",model=\"m1\"} 0\n"));
    assert_null(strstr(text, "thaw_scaler_keep_warm_seconds{"));
    evbuffer_free(b);

    /* Gone from the activators: only the jobs are left. */
    queued = 0;
    scaler_state_held_ok(st, &held, &queued, NULL, NULL, NULL, 1, 4);
    assert_int_equal(target_decision(t)->desired, 1);
    metadata_spec_finish(&a);
    scaler_state_free(st);
}

/* One model's inputs each second from now, for `seconds` seconds: the token
 * rate of s, the activators' in-flight and silent counts, nothing held or
 * queued; the scaler's 1 s timer after each. Returns the next second. */
static int64_t feed_seconds(struct scaler_state *st, const struct prom_sample *s,
                            long long inflight, long long silent, int64_t now, int seconds)
{
    long long zero = 0;
    for (int i = 0; i < seconds; i++, now += 1000) {
        scaler_state_prom_ok(st, s, 1, now);
        scaler_state_held_ok(st, &zero, &zero, NULL, &inflight, &silent, 1, now);
        scaler_state_tick(st, now); /* keep-warm runs out on the timer */
    }
    return now;
}

/* The activators' in-flight count: shown as an input, and the idle signal of
 * a target with idleSignal activators (the same model's token-rate target
 * stays busy on a rate the activators say is history). */
static void test_inflight_is_the_activators_idle_signal(void **unused)
{
    struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
    char err[128];
    struct scaler_spec by_act, by_rate;
    const char *k[] = {"model", "coldStartSeconds", "keepWarmCost", "idleSignal"};
    const char *v[] = {"m1", "2", "1", "activators"};
    assert_int_equal(metadata_parse(k, v, 4, &by_act, NULL, NULL, err, sizeof(err)), 0);
    assert_int_equal(metadata_parse(k, v, 3, &by_rate, NULL, NULL, err, sizeof(err)), 0);
    struct target *ta = scaler_state_upsert(st, "ns", "act", &by_act, 0);
    struct target *tr = scaler_state_upsert(st, "ns", "rate", &by_rate, 0);
    queues_empty(st, 1);
    const char *const *models;
    assert_int_equal(scaler_state_held_batch(st, &models), 1);
    struct prom_sample s[] = {{"m1", 500, false}};
    int64_t now = feed_seconds(st, s, 7, 0, 1000, 10);
    assert_true(target_decision(ta)->active);
    struct evbuffer *b;
    const char *text = render(st, now, &b);
    assert_non_null(strstr(text, "thaw_scaler_input_inflight_requests{model=\"m1\"} 7"));
    assert_non_null(strstr(text, "\"inflightRequests\":7"));
    assert_non_null(strstr(text, "\"idleSignal\":\"activators\""));
    assert_non_null(strstr(text, "\"idleSignal\":\"tokenRate\""));
    evbuffer_free(b);
    /* The last request ends; the rate still shows 500 tokens/s. After the
     * 2 s keep-warm, the activators' target goes to zero, the other stays. */
    now = feed_seconds(st, s, 0, 0, now, 5);
    assert_false(target_decision(ta)->active);
    assert_int_equal(target_decision(ta)->desired, 0);
    assert_true(target_decision(tr)->active);
    assert_true(target_decision(tr)->desired >= 1);

    /* Busy again; then the sum says 0 but an activator stopped reporting
     * while it carried requests (its field went stale): unknown, so the
     * token rate decides and the model stays up while it shows tokens. */
    now = feed_seconds(st, s, 3, 0, now, 4);
    assert_true(target_decision(ta)->active);
    now = feed_seconds(st, s, 0, 1, now, 9);
    assert_true(target_decision(ta)->active);
    text = render(st, now, &b);
    assert_non_null(strstr(text, "\"silentActivators\":1"));
    evbuffer_free(b);
    now = feed_seconds(st, s, 0, 0, now, 7);
    assert_false(target_decision(ta)->active);
    metadata_spec_finish(&by_act);
    metadata_spec_finish(&by_rate);
    scaler_state_free(st);
}

/* While activators report a queue, the lateAfterSeconds they publish with it
 * is the one the policy clears the backlog by (slowly when > 0), whatever the
 * ScaledObject says; while none says one, the ScaledObject's applies. */
static void test_activators_late_setting_wins(void **unused)
{
    static const struct {
        const char *metadata; /* the ScaledObject's lateAfterSeconds */
        long long published;  /* the activators' (ms; -1: none says) */
        long desired;
        const char *late, *from;
    } runs[] = {
        /* FIFO activators, whatever the ScaledObject says: the 1 990 requests
         * over Q cleared within a third of a cold start, 2 + 1990 x 256 /
         * (880 x 20) */
        {"1", 0, 31, "\"lateAfterSeconds\":0", "\"lateAfterFrom\":\"activators\""},
        /* late-last activators: over lateClearSeconds, 2 + 1990 x 256 / (880 x 300) */
        {"0", 1000, 4, "\"lateAfterSeconds\":1", "\"lateAfterFrom\":\"activators\""},
        /* none says: the ScaledObject's */
        {"1", -1, 4, "\"lateAfterSeconds\":1", "\"lateAfterFrom\":\"scaledObject\""},
    };
    for (size_t run = 0; run < sizeof(runs) / sizeof(runs[0]); run++) {
        const char *k[] = {"model", "coldStartSeconds", "surgeHoldSeconds", "trendWindowSeconds",
                           "queueWindowSeconds", "lateAfterSeconds"};
        const char *v[] = {"m1", "60", "0", "0", "1", runs[run].metadata};
        struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
        struct scaler_spec a;
        char err[128];
        assert_int_equal(metadata_parse(k, v, 6, &a, NULL, NULL, err, sizeof(err)), 0);
        struct target *t = scaler_state_upsert(st, "ns", "so", &a, 0);
        queues_empty(st, 1);
        const char *const *models;
        assert_int_equal(scaler_state_held_batch(st, &models), 1);
        struct prom_sample s[] = {{"m1", 1000, false}};
        long long held = 0, queued = 2000, late = runs[run].published;
        for (int64_t now = 100; now <= 120100; now += 1000) {
            scaler_state_prom_ok(st, s, 1, now);
            scaler_state_held_ok(st, &held, &queued, &late, NULL, NULL, 1, now);
            scaler_state_tick(st, now);
        }
        assert_int_equal(target_decision(t)->desired, runs[run].desired);
        struct evbuffer *b;
        const char *text = render(st, 120100, &b);
        assert_non_null(strstr(text, runs[run].late));
        assert_non_null(strstr(text, runs[run].from));
        evbuffer_free(b);
        metadata_spec_finish(&a);
        scaler_state_free(st);
    }
}

/* The spec's policy (v2 by default, knobs from the metadata) is what decides:
 * the utilisation target sizes up, and an idle model is kept warm for
 * coldStartSeconds x keepWarmCost before going inactive. */
static void test_policy_v2_reaches_the_decision(void **unused)
{
    struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
    struct scaler_spec a;
    char err[128];
    const char *k[] = {"model", "coldStartSeconds", "surgeHoldSeconds", "trendWindowSeconds",
                       "keepWarmCost"};
    const char *v[] = {"m1", "10", "0", "0", "1.5"};
    assert_int_equal(metadata_parse(k, v, 5, &a, NULL, NULL, err, sizeof(err)), 0);
    struct target *t = scaler_state_upsert(st, "ns", "so", &a, 0);
    queues_empty(st, 1);
    const char *const *models;
    assert_int_equal(scaler_state_held_batch(st, &models), 1);
    long long held = 0;
    scaler_state_held_ok(st, &held, NULL, NULL, NULL, NULL, 1, 1);
    struct prom_sample s[] = {{"m1", 3000, false}};
    scaler_state_prom_ok(st, s, 1, 100);
    /* ceil(3000 / (1000 x 0.88)) = 4, where v1 says 3 */
    assert_int_equal(target_decision(t)->desired, 4);
    struct prom_sample zero[] = {{"m1", 0, false}};
    scaler_state_prom_ok(st, zero, 1, 1000);
    assert_true(target_decision(t)->active);
    scaler_state_tick(st, 1000 + 14000);
    assert_true(target_decision(t)->active);
    assert_int_equal(target_decision(t)->reason, POLICY_REASON_KEEP_WARM);
    /* What the policy plans with is exported: the tokens-per-request prior
     * (no wake learned yet), the keep-warm prior (1.5 x 10 s), no panic. */
    struct evbuffer *b;
    const char *text = render(st, 1000 + 14000, &b);
    const char *labels = "{namespace=\"ns\",scaledobject=\"so\",model=\"m1\"}";
    char want[256];
    snprintf(want, sizeof(want), "thaw_scaler_tokens_per_request%s 256\n", labels);
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof(want), "thaw_scaler_keep_warm_seconds%s 15\n", labels);
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof(want), "thaw_scaler_panicking%s 0\n", labels);
    assert_non_null(strstr(text, want));
    /* The window the decision used: the scaler's (0 here), the demand steady. */
    snprintf(want, sizeof(want), "thaw_scaler_scale_down_window_seconds%s 0\n", labels);
    assert_non_null(strstr(text, want));
    assert_non_null(strstr(text, "\"tokensPerRequest\":256"));
    assert_non_null(strstr(text, "\"tokensPerRequestEpisodes\":0"));
    evbuffer_free(b);
    scaler_state_tick(st, 1000 + 16000);
    assert_false(target_decision(t)->active);
    metadata_spec_finish(&a);
    scaler_state_free(st);
}

/* A ScaledObject edited while its model is kept warm: the new knobs decide
 * the keep-warm time at once (it is otherwise computed at an idle moment). */
static void test_spec_change_recomputes_keep_warm(void **unused)
{
    struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
    struct scaler_spec a, off, v1;
    char err[128];
    const char *k[] = {"model", "coldStartSeconds", "keepWarmCost", "wakeRequestCost", "policy"};
    const char *va[] = {"m1", "60", "1", "0", "v2"};
    const char *voff[] = {"m1", "60", "0", "0", "v2"};
    const char *vv1[] = {"m1", "60", "1", "0", "v1"};
    assert_int_equal(metadata_parse(k, va, 5, &a, NULL, NULL, err, sizeof(err)), 0);
    assert_int_equal(metadata_parse(k, voff, 5, &off, NULL, NULL, err, sizeof(err)), 0);
    assert_int_equal(metadata_parse(k, vv1, 5, &v1, NULL, NULL, err, sizeof(err)), 0);
    for (int round = 0; round < 2; round++) {
        struct target *t = scaler_state_upsert(st, "ns", round ? "so-v1" : "so", &a, 0);
        assert_non_null(t);
        queues_empty(st, 1);
        const char *const *models;
        assert_int_equal(scaler_state_held_batch(st, &models), 1);
        long long held = 0;
        scaler_state_held_ok(st, &held, NULL, NULL, NULL, NULL, 1, 1);
        struct prom_sample busy[] = {{"m1", 3000, false}};
        scaler_state_prom_ok(st, busy, 1, 100);
        struct prom_sample zero[] = {{"m1", 0, false}};
        scaler_state_prom_ok(st, zero, 1, 1000);
        scaler_state_tick(st, 5000);
        /* keepWarmCost 1 with a 60 s cold start: idle, kept warm for 60 s */
        assert_true(target_decision(t)->active);
        assert_int_equal(target_decision(t)->raw, 0);
        /* keepWarmCost 0 (or policy v1: nothing kept warm): to zero at once */
        assert_ptr_equal(scaler_state_upsert(st, "ns", round ? "so-v1" : "so", round ? &v1 : &off,
                                             6000),
                         t);
        scaler_state_tick(st, 7000);
        assert_false(target_decision(t)->active);
        assert_int_equal(target_decision(t)->desired, 0);
        scaler_state_gc(st, 1000000);
    }
    metadata_spec_finish(&a);
    metadata_spec_finish(&off);
    metadata_spec_finish(&v1);
    scaler_state_free(st);
}

/* One round trip of the activators' held/queued counts for model m1, then
 * the tick. */
static void held_round(struct scaler_state *st, long long held, long long queued, int64_t now)
{
    const char *const *models;
    assert_int_equal(scaler_state_held_batch(st, &models), 1);
    scaler_state_held_ok(st, &held, &queued, NULL, NULL, NULL, 1, now);
    scaler_state_tick(st, now); /* the scaler's 1 s tick decides every target */
}

/* A v2 target's exported plan follows its policy state: a wake whose
 * tokens the rate then shows teaches tokens per request (the gauge leaves
 * the prior, /models counts the episode), and a queue overload with no
 * history of short ones panics (the gauge goes to 1). */
static void test_v2_exports_what_it_learned(void **unused)
{
    struct scaler_state *st = scaler_state_new(&cfg, 0, on_change, NULL);
    struct scaler_spec a;
    char err[128];
    const char *k[] = {"model", "coldStartSeconds", "rateWindowSeconds", "surgeHoldSeconds"};
    const char *v[] = {"m1", "10", "1", "0"};
    assert_int_equal(metadata_parse(k, v, 4, &a, NULL, NULL, err, sizeof(err)), 0);
    struct target *t = scaler_state_upsert(st, "ns", "so", &a, 0);
    const char *labels = "{namespace=\"ns\",scaledobject=\"so\",model=\"m1\"}";
    char want[256];
    struct prom_sample zero[] = {{"m1", 0, false}}, busy[] = {{"m1", 300, false}};
    int64_t now = 1000;
    queues_empty(st, now);
    scaler_state_prom_ok(st, zero, 1, now);
    /* 3 requests held for 5 s, released, their tokens at 300/s for 3 s. */
    for (; now <= 6000; now += 1000)
        held_round(st, 3, 0, now);
    for (; now <= 9000; now += 1000) {
        scaler_state_prom_ok(st, busy, 1, now);
        held_round(st, 0, 0, now);
    }
    for (; now <= 14000; now += 1000) {
        held_round(st, 0, 0, now);
        scaler_state_prom_ok(st, zero, 1, now);
    }
    struct evbuffer *b;
    const char *text = render(st, now, &b);
    assert_non_null(strstr(text, "\"tokensPerRequestEpisodes\":1"));
    snprintf(want, sizeof(want), "thaw_scaler_tokens_per_request%s ", labels);
    const char *g = strstr(text, want);
    assert_non_null(g);
    double learned = strtod(g + strlen(want), NULL);
    assert_true(learned > 100 && learned < 1000 && learned != 256);
    snprintf(want, sizeof(want), "thaw_scaler_panicking%s 0\n", labels);
    assert_non_null(strstr(text, want));
    evbuffer_free(b);

    /* 50 requests queued at the activators' caps (Q = 10) for 5 s. */
    for (int i = 0; i < 6; i++, now += 1000) {
        held_round(st, 0, 50, now);
        scaler_state_prom_ok(st, busy, 1, now);
    }
    assert_int_equal(target_decision(t)->reason, POLICY_REASON_QUEUE);
    text = render(st, now, &b);
    snprintf(want, sizeof(want), "thaw_scaler_panicking%s 1\n", labels);
    assert_non_null(strstr(text, want));
    assert_non_null(strstr(text, "\"panicking\":true"));
    evbuffer_free(b);
    metadata_spec_finish(&a);
    scaler_state_free(st);
}

/* The read-back: a new target waits for it as for a first reading, with
 * its series left out of /metrics, then holds its floor for the shorter of
 * the restore window and its own scale-down window from when it appeared; a
 * target appearing later (KEDA failing over from another replica) gets its
 * own read-back. */
static void test_restore_holds_floors(void **unused)
{
    struct scaler_state_config c = cfg;
    c.scale_down_window_ms = 30000;
    c.bursty_scale_down_window_ms = 60000;
    c.restore_window_ms = 45000;
    struct scaler_state *st = scaler_state_new(&c, 0, on_change, NULL);
    /* Policy v2: its bursty window counts in the hold (v1 has one window). */
    struct scaler_spec a;
    char err[128];
    const char *k[] = {"model"};
    const char *v[] = {"m1"};
    assert_int_equal(metadata_parse(k, v, 1, &a, NULL, NULL, err, sizeof(err)), 0);
    assert_false(scaler_state_restore_wanted(st));
    struct target *t1 = scaler_state_upsert(st, "ns", "so1", &a, 0);
    assert_true(scaler_state_restore_wanted(st));
    sources_read_empty(st, 100);
    assert_true(target_awaiting_data(t1)); /* read, but the read-back is not in */
    assert_true(target_first_read_due(t1));
    struct evbuffer *hidden;
    assert_null(strstr(render(st, 100, &hidden), "thaw_scaler_desired_replicas{"));
    evbuffer_free(hidden);
    struct prom_sample back[] = {{"ns/so1/m1", 4.2, false}, {"ns/so2/m1", 3, false},
                                 {"ns/so1", 9, false},      {"ns/so3/m1", 0, false},
                                 {"ns/so4/m2", 8, false}};
    scaler_state_restore_done(st, back, 5, NULL, 1000);
    assert_false(scaler_state_restore_wanted(st));
    assert_false(target_awaiting_data(t1));
    assert_int_equal(scaler_state_restored_floors(st), 1);
    assert_int_equal(target_decision(t1)->desired, 5); /* 4.2 rounded up */
    assert_true(target_decision(t1)->active);
    assert_int_equal(target_decision(t1)->reason, POLICY_REASON_RESTORED);
    struct evbuffer *why;
    const char *text = render(st, 1000, &why);
    assert_non_null(strstr(text, "reason=\"restored\""));
    assert_non_null(strstr(text, "thaw_scaler_desired_replicas{namespace=\"ns\",scaledobject="
                                 "\"so1\",model=\"m1\"} 5\n"));
    evbuffer_free(why);

    /* Later targets wait for their own read-back. so4 reads m2's answer
     * only for its m2 target. */
    struct target *t2 = scaler_state_upsert(st, "ns", "so2", &a, 2000);
    struct target *t3 = scaler_state_upsert(st, "ns", "so3", &a, 2000);
    struct target *t4 = scaler_state_upsert(st, "ns", "so4", &a, 2000);
    assert_true(scaler_state_restore_wanted(st));
    sources_read_empty(st, 2100);
    assert_true(target_awaiting_data(t2));
    scaler_state_restore_done(st, back, 5, NULL, 3000);
    assert_int_equal(target_decision(t2)->desired, 3);
    assert_int_equal(target_decision(t3)->desired, 0); /* last reported 0: nothing to hold */
    assert_false(target_decision(t3)->active);
    assert_int_equal(target_decision(t4)->desired, 0);
    assert_int_equal(scaler_state_restored_floors(st), 2);
    assert_int_equal(target_decision(t1)->desired, 5); /* not read back twice */

    /* min(45 s, max(30 s, 60 s)) from each target's appearance. */
    scaler_state_tick(st, 44999);
    assert_int_equal(target_decision(t1)->desired, 5);
    scaler_state_tick(st, 45000);
    assert_int_equal(target_decision(t1)->desired, 0);
    assert_int_equal(target_decision(t2)->desired, 3);
    scaler_state_tick(st, 47000);
    assert_int_equal(target_decision(t2)->desired, 0);

    struct evbuffer *b;
    text = render(st, 47000, &b);
    assert_non_null(strstr(text, "\nthaw_scaler_restored_floors_total 2\n"));
    assert_non_null(strstr(text, "\nthaw_scaler_restore_reads_total{result=\"ok\"} 2\n"));
    assert_non_null(strstr(text, "\nthaw_scaler_restore_reads_total{result=\"failed\"} 0\n"));
    evbuffer_free(b);
    metadata_spec_finish(&a);
    scaler_state_free(st);
}

/* A target's own scale-down window shorter than the restore window bounds
 * the hold. A read-back that failed answers the waiting targets without a
 * floor, and a later one gives them none (KEDA may have acted on that
 * answer). An expired target waits no more; with no window to hold, or the
 * read-back off, nothing waits. */
static void test_restore_bounds_and_failure(void **unused)
{
    struct scaler_state_config c = cfg;
    c.scale_down_window_ms = 10000;
    c.restore_window_ms = 45000;
    struct scaler_state *st = scaler_state_new(&c, 0, on_change, NULL);
    struct scaler_spec a = spec_for("m1", NULL);
    struct target *t1 = scaler_state_upsert(st, "ns", "so1", &a, 0);
    sources_read_empty(st, 100);
    struct prom_sample back[] = {{"ns/so1/m1", 7, false}, {"ns/so2/m1", 7, false}};
    scaler_state_restore_done(st, back, 2, NULL, 1000);
    assert_int_equal(target_decision(t1)->desired, 7);
    scaler_state_tick(st, 9999);
    assert_int_equal(target_decision(t1)->desired, 7);
    scaler_state_tick(st, 10000);
    assert_int_equal(target_decision(t1)->desired, 0);

    struct target *t2 = scaler_state_upsert(st, "ns", "so2", &a, 11000);
    sources_read_empty(st, 11100);
    assert_true(target_awaiting_data(t2));
    struct evbuffer *hidden;
    assert_null(strstr(render(st, 11100, &hidden), "scaledobject=\"so2\""));
    evbuffer_free(hidden);
    scaler_state_restore_done(st, NULL, 0, "HTTP 503", 12000);
    assert_false(target_awaiting_data(t2)); /* answered, without a floor */
    assert_false(scaler_state_restore_wanted(st));
    assert_int_equal(target_decision(t2)->desired, 0);
    struct evbuffer *shown;
    assert_non_null(strstr(render(st, 12000, &shown), "scaledobject=\"so2\""));
    evbuffer_free(shown);
    struct target *t3 = scaler_state_upsert(st, "ns", "so3", &a, 13000);
    scaler_state_restore_done(st, back, 2, NULL, 14000); /* so3's; not so2's any more */
    assert_int_equal(target_decision(t2)->desired, 0);
    (void)t3;
    assert_int_equal(scaler_state_restored_floors(st), 1);
    struct evbuffer *b;
    assert_non_null(strstr(render(st, 14000, &b),
                           "\nthaw_scaler_restore_reads_total{result=\"failed\"} 1\n"));
    evbuffer_free(b);

    scaler_state_upsert(st, "ns", "gone", &a, 31000);
    assert_true(scaler_state_restore_wanted(st));
    scaler_state_gc(st, 31000 + c.target_expiry_ms + 1);
    assert_false(scaler_state_restore_wanted(st));
    scaler_state_free(st);

    /* No scale-down window: no floor could hold, so nothing waits. */
    c.scale_down_window_ms = 0;
    st = scaler_state_new(&c, 0, on_change, NULL);
    t1 = scaler_state_upsert(st, "ns", "so1", &a, 0);
    assert_false(scaler_state_restore_wanted(st));
    sources_read_empty(st, 100);
    assert_false(target_awaiting_data(t1));
    scaler_state_free(st);

    c.scale_down_window_ms = 10000;
    c.restore_window_ms = 0;
    st = scaler_state_new(&c, 0, on_change, NULL);
    t1 = scaler_state_upsert(st, "ns", "so1", &a, 0);
    assert_false(scaler_state_restore_wanted(st));
    sources_read_empty(st, 100);
    assert_false(target_awaiting_data(t1));
    metadata_spec_finish(&a);
    scaler_state_free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_targets_share_signals),
        cmocka_unit_test(test_absent_inactive_model_reads_zero),
        cmocka_unit_test(test_held_and_wake),
        cmocka_unit_test(test_new_target_awaits_its_first_reading),
        cmocka_unit_test(test_invalid_token_rate_keeps_last_good),
        cmocka_unit_test(test_wake_claims),
        cmocka_unit_test(test_queued_at_cap_is_backlog),
        cmocka_unit_test(test_inflight_is_the_activators_idle_signal),
        cmocka_unit_test(test_activators_late_setting_wins),
        cmocka_unit_test(test_fail_safe_and_staleness),
        cmocka_unit_test(test_spec_change_and_gc),
        cmocka_unit_test(test_target_limit),
        cmocka_unit_test(test_out_of_memory_never_crashes),
        cmocka_unit_test(test_pages_in_steps_are_the_whole_page),
        cmocka_unit_test(test_pages_outlive_changes_between_steps),
        cmocka_unit_test(test_pages_out_of_memory),
        cmocka_unit_test(test_policy_v2_reaches_the_decision),
        cmocka_unit_test(test_spec_change_recomputes_keep_warm),
        cmocka_unit_test(test_v2_exports_what_it_learned),
        cmocka_unit_test(test_restore_holds_floors),
        cmocka_unit_test(test_restore_bounds_and_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
