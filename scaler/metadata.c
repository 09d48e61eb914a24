#include "metadata.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "utf8.h"

static const char *const keda_keys[] = {
    "scalerAddress", "enableTLS", "unsafeSsl", "caCert", "tlsClientCert", "tlsClientKey",
    "tlsCertFile", "metricType", "useCachedMetrics",
};

struct number_key {
    const char *key;
    size_t offset;
    double def;
    int allow_zero;
};

static const struct number_key number_keys[] = {
    {"targetTokensPerSecond", offsetof(struct scaler_spec, target_tokens_per_second), 1000, 0},
    {"targetQueueLength", offsetof(struct scaler_spec, target_queue_length), 10, 0},
    {"activationTokenRate", offsetof(struct scaler_spec, activation_token_rate), 0, 1},
    {"activationQueueLength", offsetof(struct scaler_spec, activation_queue_length), 0, 1},
};
#define NUMBER_KEYS (sizeof(number_keys) / sizeof(number_keys[0]))

/* Policy v2 knobs (docs/scaling-policy.md). Times are given in seconds, as
 * KEDA's own settings are, and kept in ms. */
enum knob_unit { KNOB_NUMBER, KNOB_SECONDS, KNOB_COUNT /* a whole number */ };
struct policy_key {
    const char *key;
    size_t offset; /* in struct policy_params */
    enum knob_unit unit;
    double min, max; /* inclusive */
    bool min_open;   /* min itself is refused */
};

#define PK(name, field, unit, lo, hi, open) \
    {name, offsetof(struct policy_params, field), unit, lo, hi, open}
static const struct policy_key policy_keys[] = {
    PK("coldStartSeconds", cold_start_ms, KNOB_SECONDS, 0, 86400, false),
    PK("targetUtilisation", target_utilisation, KNOB_NUMBER, 0, 1, true),
    PK("trendWindowSeconds", trend_window_ms, KNOB_SECONDS, 0, 3600, false),
    PK("rateWindowSeconds", rate_window_ms, KNOB_SECONDS, 0, 3600, false),
    PK("queueWindowSeconds", queue_window_ms, KNOB_SECONDS, 0, 3600, false),
    PK("keepWarmCost", keep_warm_cost, KNOB_NUMBER, 0, 1000, false),
    PK("keepWarmMaxSeconds", keep_warm_max_ms, KNOB_SECONDS, 0, 86400, false),
    PK("surgeHoldSeconds", surge_hold_ms, KNOB_SECONDS, 0, 86400, false),
    PK("tokensPerRequest", tokens_per_request, KNOB_NUMBER, 0, 1e7, true),
    PK("drainTimeFactor", drain_time_factor, KNOB_NUMBER, 0, 100, true),
    PK("lateAfterSeconds", late_after_ms, KNOB_SECONDS, 0, 3600, false),
    PK("lateClearSeconds", late_clear_ms, KNOB_SECONDS, 0, 86400, true),
    PK("wakeBacklogShare", wake_backlog_share, KNOB_NUMBER, 0, 100, false),
    PK("panicWindowSeconds", panic_window_ms, KNOB_SECONDS, 0, 3600, false),
    PK("panicLookahead", panic_lookahead, KNOB_NUMBER, 0, 100, false),
    PK("replicaConcurrency", replica_slots, KNOB_COUNT, 0, 1e6, false),
    PK("staffingBeta", staffing_beta, KNOB_NUMBER, 0, 100, false),
    PK("wakeRequestCost", wake_request_cost, KNOB_NUMBER, 0, 1e6, false),
    PK("burstinessThreshold", burst_cv, KNOB_NUMBER, 0, 1000, false),
    PK("burstyTargetUtilisation", bursty_utilisation, KNOB_NUMBER, 0, 1, true),
};
#undef PK
#define POLICY_KEYS (sizeof(policy_keys) / sizeof(policy_keys[0]))

/* A finite decimal number, surrounding spaces allowed. strtod alone would
 * also take hex ("0x10" as 16), which YAML readers of the ScaledObject
 * would not read as that number. */
static bool parse_decimal(const char *value, double *out)
{
    if (strpbrk(value, "xX"))
        return false;
    char *end = NULL;
    errno = 0;
    double v = strtod(value, &end);
    while (end && isspace((unsigned char)*end))
        end++;
    if (errno || end == value || !end || *end != '\0' || !isfinite(v))
        return false;
    *out = v;
    return true;
}

static int parse_bounded(const char *key, const char *value, double lo, double hi, bool lo_open,
                         double *out, char *err, size_t errlen)
{
    double v = 0;
    if (!parse_decimal(value, &v) || v < lo || v > hi || (lo_open && v == lo)) {
        snprintf(err, errlen, "metadata key '%s': expected a number in %c%g, %g], got '%.64s'",
                 key, lo_open ? '(' : '[', lo, hi, value);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_policy_key(const struct policy_key *k, const char *value,
                            struct policy_params *p, char *err, size_t errlen)
{
    double v;
    if (parse_bounded(k->key, value, k->min, k->max, k->min_open, &v, err, errlen) != 0)
        return -1;
    if (k->unit == KNOB_COUNT && v != floor(v)) {
        /* A batch of 0.001 sequences would ask for thousands of replicas. */
        snprintf(err, errlen, "metadata key '%s': expected a whole number in [%g, %g], got '%.64s'",
                 k->key, k->min, k->max, value);
        return -1;
    }
    void *slot = (char *)p + k->offset;
    if (k->unit == KNOB_SECONDS)
        *(int64_t *)slot = (int64_t)llround(v * 1000.0);
    else
        *(double *)slot = v;
    return 0;
}

void metadata_policy_params(const struct scaler_spec *spec, int64_t default_scale_down_ms,
                            int64_t default_bursty_scale_down_ms, struct policy_params *out)
{
    if (spec->policy_v1)
        policy_params_v1(out);
    else
        *out = spec->policy;
    out->target_tokens_per_second = spec->target_tokens_per_second;
    out->target_queue_length = spec->target_queue_length;
    out->activation_token_rate = spec->activation_token_rate;
    out->activation_queue_length = spec->activation_queue_length;
    out->scale_down_window_ms =
        spec->scale_down_window_ms >= 0 ? spec->scale_down_window_ms : default_scale_down_ms;
    if (!spec->policy_v1) /* v1 had one window */
        out->bursty_scale_down_window_ms = spec->bursty_scale_down_window_ms >= 0
                                               ? spec->bursty_scale_down_window_ms
                                               : default_bursty_scale_down_ms;
}

static int parse_number(const struct number_key *k, const char *value, double *out, char *err,
                        size_t errlen)
{
    double v = 0;
    if (!parse_decimal(value, &v) || v < 0 || (!k->allow_zero && v == 0)) {
        snprintf(err, errlen, "metadata key '%s': expected a number %s, got '%.64s'", k->key,
                 k->allow_zero ? ">= 0" : "> 0", value);
        return -1;
    }
    *out = v;
    return 0;
}

static int valid_text(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return 0;
    return 1;
}

int metadata_parse(const char *const *keys, const char *const *values, size_t n,
                   struct scaler_spec *spec, metadata_unknown_fn unknown, void *ud, char *err,
                   size_t errlen)
{
    memset(spec, 0, sizeof(*spec));
    for (size_t k = 0; k < NUMBER_KEYS; k++)
        *(double *)(void *)((char *)spec + number_keys[k].offset) = number_keys[k].def;
    policy_params_defaults(&spec->policy);
    spec->scale_down_window_ms = -1;
    spec->bursty_scale_down_window_ms = -1;
    const char *model = NULL, *redis_key = NULL, *group = NULL;

    for (size_t i = 0; i < n; i++) {
        const char *key = keys[i], *value = values[i] ? values[i] : "";
        /* protobuf-c does not check proto3's UTF-8 rule; these strings reach
         * Prometheus labels and JSON, where one bad byte fails the page. */
        if (!utf8_valid(key, strlen(key))) {
            snprintf(err, errlen, "a metadata key is not valid UTF-8");
            return -1;
        }
        if (!utf8_valid(value, strlen(value))) {
            snprintf(err, errlen, "metadata key '%.64s': value is not valid UTF-8", key);
            return -1;
        }
        /* An unknown key is remembered to be logged once: its length must
         * be bounded like a value's, or a few calls pin gigabytes. */
        if (strlen(key) > METADATA_MAX_KEY) {
            snprintf(err, errlen, "metadata key '%.64s...': longer than %d bytes", key,
                     METADATA_MAX_KEY);
            return -1;
        }
        if (strlen(value) > METADATA_MAX_VALUE) {
            snprintf(err, errlen, "metadata key '%.64s': value longer than %d bytes", key,
                     METADATA_MAX_VALUE);
            return -1;
        }
        if (strcmp(key, "model") == 0) {
            model = value;
            continue;
        }
        if (strcmp(key, "redisKey") == 0) {
            redis_key = value;
            continue;
        }
        if (strcmp(key, "redisStreamGroup") == 0) {
            group = value;
            continue;
        }
        if (strcmp(key, "policy") == 0) {
            if (strcmp(value, "v1") != 0 && strcmp(value, "v2") != 0) {
                snprintf(err, errlen, "metadata key 'policy': expected 'v2' or 'v1', got '%.64s'",
                         value);
                return -1;
            }
            spec->policy_v1 = strcmp(value, "v1") == 0;
            continue;
        }
        if (strcmp(key, "idleSignal") == 0) {
            /* Opt-in: with traffic that bypasses the activators (a job queue's
             * workers, clients calling the model's Service), their in-flight
             * count says idle while replicas still serve. */
            if (strcmp(value, "activators") != 0 && strcmp(value, "tokenRate") != 0) {
                snprintf(err, errlen,
                         "metadata key 'idleSignal': expected 'tokenRate' or 'activators', "
                         "got '%.64s'",
                         value);
                return -1;
            }
            spec->policy.idle_by_activators = strcmp(value, "activators") == 0;
            continue;
        }
        int64_t *window = strcmp(key, "scaleDownWindowSeconds") == 0 ? &spec->scale_down_window_ms
                          : strcmp(key, "burstyScaleDownWindowSeconds") == 0
                              ? &spec->bursty_scale_down_window_ms
                              : NULL;
        if (window) {
            double v;
            if (parse_bounded(key, value, 0, 86400, false, &v, err, errlen) != 0)
                return -1;
            *window = (int64_t)llround(v * 1000.0);
            continue;
        }
        int matched = 0;
        for (size_t k = 0; k < POLICY_KEYS && !matched; k++) {
            if (strcmp(key, policy_keys[k].key) == 0) {
                if (parse_policy_key(&policy_keys[k], value, &spec->policy, err, errlen) != 0)
                    return -1;
                matched = 1;
            }
        }
        for (size_t k = 0; k < NUMBER_KEYS && !matched; k++) {
            if (strcmp(key, number_keys[k].key) == 0) {
                double *slot = (double *)(void *)((char *)spec + number_keys[k].offset);
                if (parse_number(&number_keys[k], value, slot, err, errlen) != 0)
                    return -1;
                matched = 1;
            }
        }
        for (size_t k = 0; k < sizeof(keda_keys) / sizeof(keda_keys[0]) && !matched; k++)
            matched = strcmp(key, keda_keys[k]) == 0;
        if (!matched && unknown)
            unknown(ud, key);
    }
    if (!model || !*model) {
        snprintf(err, errlen, "metadata key 'model' is required");
        return -1;
    }
    if (!valid_text(model) || (redis_key && !valid_text(redis_key)) ||
        (group && !valid_text(group))) {
        snprintf(err, errlen, "metadata keys 'model', 'redisKey' and 'redisStreamGroup' must "
                              "not contain control characters");
        return -1;
    }
    if (redis_key && !*redis_key) {
        snprintf(err, errlen, "metadata key 'redisKey' must not be empty");
        return -1;
    }
    spec->model = thaw_strdup(model);
    if (redis_key) {
        spec->redis_key = thaw_strdup(redis_key);
    } else if (spec->model) {
        size_t len = strlen(model) + sizeof("thaw:queue:");
        spec->redis_key = thaw_malloc(len);
        if (spec->redis_key)
            snprintf(spec->redis_key, len, "thaw:queue:%s", model);
    }
    if (group && *group)
        spec->redis_stream_group = thaw_strdup(group);
    if (!spec->model || !spec->redis_key || (group && *group && !spec->redis_stream_group)) {
        metadata_spec_finish(spec);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

void metadata_spec_finish(struct scaler_spec *spec)
{
    if (!spec)
        return;
    thaw_free(spec->model);
    thaw_free(spec->redis_key);
    thaw_free(spec->redis_stream_group);
    memset(spec, 0, sizeof(*spec));
}

int metadata_check_key_prefix(const struct scaler_spec *spec, const char *key_prefix, char *err,
                              size_t errlen)
{
    if (!key_prefix || !*key_prefix ||
        strncmp(spec->redis_key, key_prefix, strlen(key_prefix)) == 0)
        return 0;
    snprintf(err, errlen,
             "metadata key 'redisKey': must start with '%.64s' (the operator's "
             "--redis-key-prefix)",
             key_prefix);
    return -1;
}

int metadata_spec_copy(struct scaler_spec *dst, const struct scaler_spec *src)
{
    *dst = *src;
    dst->model = thaw_strdup(src->model);
    dst->redis_key = thaw_strdup(src->redis_key);
    dst->redis_stream_group = src->redis_stream_group ? thaw_strdup(src->redis_stream_group) : NULL;
    if (!dst->model || !dst->redis_key || (src->redis_stream_group && !dst->redis_stream_group)) {
        metadata_spec_finish(dst);
        return -1;
    }
    return 0;
}

static int str_equal(const char *a, const char *b)
{
    if (!a || !b)
        return a == b;
    return strcmp(a, b) == 0;
}

/* Only the fields a key can set differ between specs. */
static bool policy_knobs_equal(const struct policy_params *a, const struct policy_params *b)
{
    for (size_t k = 0; k < POLICY_KEYS; k++) {
        const char *pa = (const char *)a + policy_keys[k].offset;
        const char *pb = (const char *)b + policy_keys[k].offset;
        if (policy_keys[k].unit == KNOB_SECONDS ? *(const int64_t *)(const void *)pa !=
                                                      *(const int64_t *)(const void *)pb
                                                : *(const double *)(const void *)pa !=
                                                      *(const double *)(const void *)pb)
            return false;
    }
    return a->idle_by_activators == b->idle_by_activators;
}

int metadata_spec_equal(const struct scaler_spec *a, const struct scaler_spec *b)
{
    return str_equal(a->model, b->model) && str_equal(a->redis_key, b->redis_key) &&
           str_equal(a->redis_stream_group, b->redis_stream_group) &&
           a->target_tokens_per_second == b->target_tokens_per_second &&
           a->target_queue_length == b->target_queue_length &&
           a->activation_token_rate == b->activation_token_rate &&
           a->activation_queue_length == b->activation_queue_length &&
           a->policy_v1 == b->policy_v1 && a->scale_down_window_ms == b->scale_down_window_ms &&
           a->bursty_scale_down_window_ms == b->bursty_scale_down_window_ms &&
           policy_knobs_equal(&a->policy, &b->policy);
}

void metadata_metric_name(const char *model, char *out, size_t outlen)
{
    size_t o = (size_t)snprintf(out, outlen, "thaw-");
    size_t limit = outlen < 201 ? outlen : 201;
    for (const unsigned char *p = (const unsigned char *)model; *p && o + 1 < limit; p++) {
        unsigned char c = (unsigned char)tolower(*p);
        out[o++] = (char)((isalnum(c) && c < 0x80) || c == '-' ? c : '-');
    }
    out[o] = '\0';
}
