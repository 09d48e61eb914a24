/* metadata: ScaledObject trigger metadata to a scaling spec. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "alloc.h"
#include "metadata.h"

static int unknown_calls;
static char last_unknown[64];

static void on_unknown(void *ud, const char *key)
{
    unknown_calls++;
    strncpy(last_unknown, key, sizeof(last_unknown) - 1);
}

/* Key/value pairs, NULL-terminated. */
static int parse_kv(struct scaler_spec *spec, char *err, size_t errlen, ...)
{
    const char *k[24], *v[24];
    size_t n = 0;
    va_list ap;
    va_start(ap, errlen);
    for (;;) {
        const char *key = va_arg(ap, const char *);
        if (!key || n == 24)
            break;
        k[n] = key;
        v[n++] = va_arg(ap, const char *);
    }
    va_end(ap);
    return metadata_parse(k, v, n, spec, on_unknown, NULL, err, errlen);
}

#define PARSE(spec, err, ...) parse_kv(spec, err, sizeof(err), __VA_ARGS__, (const char *)NULL)

static void test_defaults(void **unused)
{
    struct scaler_spec s;
    char err[256];
    unknown_calls = 0;
    assert_int_equal(PARSE(&s, err, "model", "llama-3-8b", "scalerAddress", "thaw:9090"), 0);
    assert_string_equal(s.model, "llama-3-8b");
    assert_true(s.target_tokens_per_second == 1000);
    assert_true(s.target_queue_length == 10);
    assert_string_equal(s.redis_key, "thaw:queue:llama-3-8b");
    assert_null(s.redis_stream_group);
    assert_true(s.activation_token_rate == 0);
    assert_int_equal(unknown_calls, 0); /* KEDA's own keys are not unknown */
    metadata_spec_finish(&s);
}

static void test_all_keys(void **unused)
{
    struct scaler_spec s;
    char err[256];
    unknown_calls = 0;
    assert_int_equal(PARSE(&s, err, "model", "m", "targetTokensPerSecond", "2500.5",
                           "targetQueueLength", "4", "redisKey", "jobs", "redisStreamGroup",
                           "workers", "activationTokenRate", "10", "activationQueueLength", "0",
                           "colour", "blue"),
                     0);
    assert_true(s.target_tokens_per_second == 2500.5);
    assert_true(s.target_queue_length == 4);
    assert_string_equal(s.redis_key, "jobs");
    assert_string_equal(s.redis_stream_group, "workers");
    assert_true(s.activation_token_rate == 10);
    assert_int_equal(unknown_calls, 1);
    assert_string_equal(last_unknown, "colour");
    metadata_spec_finish(&s);
}

static void test_errors_name_the_key(void **unused)
{
    struct scaler_spec s;
    char err[256];
    assert_int_equal(PARSE(&s, err, "scalerAddress", "x"), -1);
    assert_string_equal(err, "metadata key 'model' is required");
    assert_int_equal(PARSE(&s, err, "model", ""), -1);
    assert_int_equal(PARSE(&s, err, "model", "m", "targetTokensPerSecond", "fast"), -1);
    assert_non_null(strstr(err, "'targetTokensPerSecond'"));
    assert_int_equal(PARSE(&s, err, "model", "m", "targetTokensPerSecond", "0"), -1);
    assert_int_equal(PARSE(&s, err, "model", "m", "targetQueueLength", "-3"), -1);
    assert_non_null(strstr(err, "'targetQueueLength'"));
    assert_int_equal(PARSE(&s, err, "model", "m", "activationTokenRate", "NaN"), -1);
    assert_int_equal(PARSE(&s, err, "model", "m", "activationQueueLength", "1e999"), -1);
    assert_int_equal(PARSE(&s, err, "model", "m", "targetQueueLength", "5x"), -1);
    assert_int_equal(PARSE(&s, err, "model", "bad\nname"), -1);
    assert_non_null(strstr(err, "control characters"));
    assert_int_equal(PARSE(&s, err, "model", "m\xff"), -1);
    assert_string_equal(err, "metadata key 'model': value is not valid UTF-8");
    assert_int_equal(PARSE(&s, err, "model", "m", "query", "up\xc0\xaf"), -1);
    assert_string_equal(err, "metadata key 'query': value is not valid UTF-8");
    assert_int_equal(PARSE(&s, err, "model", "m", "k\xed\xa0\x80", "v"), -1);
    assert_string_equal(err, "a metadata key is not valid UTF-8");
    assert_int_equal(PARSE(&s, err, "model", "m", "redisKey", ""), -1);
    char big[METADATA_MAX_VALUE + 2];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(PARSE(&s, err, "model", big), -1);
    assert_non_null(strstr(err, "longer than"));
    /* A key as long, unknown or not, is refused before it is remembered
     * (unknown keys are kept to be logged once). */
    char bigkey[METADATA_MAX_KEY + 2];
    memset(bigkey, 'k', sizeof(bigkey) - 1);
    bigkey[sizeof(bigkey) - 1] = '\0';
    unknown_calls = 0;
    assert_int_equal(PARSE(&s, err, "model", "m", bigkey, "v"), -1);
    assert_non_null(strstr(err, "longer than 256 bytes"));
    assert_int_equal(unknown_calls, 0);
    bigkey[METADATA_MAX_KEY] = '\0'; /* at the limit: an unknown key, ignored */
    assert_int_equal(PARSE(&s, err, "model", "m", bigkey, "v"), 0);
    assert_int_equal(unknown_calls, 1);
    metadata_spec_finish(&s);
    /* Hex is not a number here (strtod would read 0x10 as 16). */
    assert_int_equal(PARSE(&s, err, "model", "m", "targetTokensPerSecond", "0x10"), -1);
    assert_non_null(strstr(err, "'targetTokensPerSecond'"));
    assert_int_equal(PARSE(&s, err, "model", "m", "scaleDownWindowSeconds", "0X1p4"), -1);
    assert_non_null(strstr(err, "'scaleDownWindowSeconds'"));
    /* zero activation is allowed, and trailing spaces are tolerated */
    assert_int_equal(PARSE(&s, err, "model", "m", "activationTokenRate", "0",
                           "targetQueueLength", "3 "), 0);
    metadata_spec_finish(&s);
}

static void test_out_of_memory(void **unused)
{
    struct scaler_spec s;
    char err[256];
    for (long n = 0; n < 3; n++) {
        alloc_fail_after(n);
        int rc = PARSE(&s, err, "model", "m", "redisStreamGroup", "g");
        alloc_fail_after(-1);
        assert_int_equal(rc, -1);
        assert_string_equal(err, "out of memory");
    }
    assert_int_equal(PARSE(&s, err, "model", "m", "redisStreamGroup", "g"), 0);
    metadata_spec_finish(&s);
}

static void test_metric_name_and_equal(void **unused)
{
    char name[256];
    metadata_metric_name("Llama-3.1/8B_instruct", name, sizeof(name));
    assert_string_equal(name, "thaw-llama-3-1-8b-instruct");
    char longm[400];
    memset(longm, 'x', sizeof(longm) - 1);
    longm[sizeof(longm) - 1] = '\0';
    metadata_metric_name(longm, name, sizeof(name));
    assert_int_equal(strlen(name), 200);

    struct scaler_spec a, b;
    char err[256];
    assert_int_equal(PARSE(&a, err, "model", "m", "targetQueueLength", "4"), 0);
    assert_int_equal(PARSE(&b, err, "model", "m", "targetQueueLength", "4"), 0);
    assert_true(metadata_spec_equal(&a, &b));
    b.target_queue_length = 5;
    assert_false(metadata_spec_equal(&a, &b));
    metadata_spec_finish(&a);
    metadata_spec_finish(&b);
}

/* The policy keys: v2 defaults, every knob settable in its unit, bounds
 * named in the error, v1 selectable, and the scaler's scale-down default. */
static void test_policy_keys(void **unused)
{
    struct scaler_spec s;
    struct policy_params p, def;
    char err[256];
    policy_params_defaults(&def);
    assert_int_equal(PARSE(&s, err, "model", "m", "targetTokensPerSecond", "500"), 0);
    assert_false(s.policy_v1);
    metadata_policy_params(&s, 123000, 456000, &p);
    assert_true(p.target_tokens_per_second == 500);
    assert_true(p.cold_start_ms == def.cold_start_ms);
    assert_true(p.target_utilisation == def.target_utilisation);
    assert_true(p.keep_warm_cost == def.keep_warm_cost);
    assert_true(p.scale_down_window_ms == 123000); /* the scaler's flags */
    assert_true(p.bursty_scale_down_window_ms == 456000);
    metadata_spec_finish(&s);

    assert_int_equal(PARSE(&s, err, "model", "m", "coldStartSeconds", "2.5", "targetUtilisation",
                           "0.7", "trendWindowSeconds", "0", "rateWindowSeconds", "30",
                           "queueWindowSeconds", "10", "keepWarmCost", "0", "keepWarmMaxSeconds",
                           "600", "surgeHoldSeconds", "5", "tokensPerRequest", "128",
                           "drainTimeFactor", "0.5", "wakeBacklogShare", "1",
                           "scaleDownWindowSeconds", "20", "panicWindowSeconds", "12.5",
                           "wakeRequestCost", "2", "burstinessThreshold", "0",
                           "burstyTargetUtilisation", "0.95", "panicLookahead", "0.5",
                           "replicaConcurrency", "64", "staffingBeta", "0.5",
                           "lateAfterSeconds", "1", "lateClearSeconds", "120",
                           "burstyScaleDownWindowSeconds", "0"),
                     0);
    metadata_policy_params(&s, 123000, 456000, &p);
    assert_true(p.cold_start_ms == 2500);
    assert_true(p.target_utilisation == 0.7);
    assert_true(p.trend_window_ms == 0);
    assert_true(p.rate_window_ms == 30000);
    assert_true(p.queue_window_ms == 10000);
    assert_true(p.keep_warm_cost == 0);
    assert_true(p.keep_warm_max_ms == 600000);
    assert_true(p.surge_hold_ms == 5000);
    assert_true(p.tokens_per_request == 128);
    assert_true(p.drain_time_factor == 0.5);
    assert_true(p.wake_backlog_share == 1);
    assert_true(p.scale_down_window_ms == 20000);
    assert_true(p.bursty_scale_down_window_ms == 0); /* 0 given: not the flag */
    assert_true(p.panic_window_ms == 12500);
    assert_true(p.wake_request_cost == 2);
    assert_true(p.burst_cv == 0);
    assert_true(p.bursty_utilisation == 0.95);
    assert_true(p.panic_lookahead == 0.5);
    assert_true(p.replica_slots == 64);
    assert_true(p.staffing_beta == 0.5);
    assert_true(p.late_after_ms == 1000);
    assert_true(p.late_clear_ms == 120000);
    struct scaler_spec t;
    assert_int_equal(PARSE(&t, err, "model", "m", "coldStartSeconds", "2.5"), 0);
    assert_false(metadata_spec_equal(&s, &t)); /* a knob change is a spec change */
    metadata_spec_finish(&t);
    struct scaler_spec u, w;
    assert_int_equal(PARSE(&u, err, "model", "m", "burstyScaleDownWindowSeconds", "300"), 0);
    assert_int_equal(PARSE(&w, err, "model", "m", "burstyScaleDownWindowSeconds", "240"), 0);
    assert_false(metadata_spec_equal(&u, &w)); /* the bursty window is part of the spec */
    metadata_spec_finish(&u);
    metadata_spec_finish(&w);
    metadata_spec_finish(&s);

    assert_int_equal(PARSE(&s, err, "model", "m", "policy", "v1", "coldStartSeconds", "9"), 0);
    assert_true(s.policy_v1);
    struct policy_params v1;
    policy_params_v1(&v1);
    metadata_policy_params(&s, 300000, 456000, &p);
    assert_true(p.cold_start_ms == v1.cold_start_ms); /* v2 knobs unused by v1 */
    assert_true(p.bursty_scale_down_window_ms == 0); /* v1 has one window */
    assert_true(p.target_utilisation == v1.target_utilisation);
    assert_true(p.keep_warm_cost == 0);
    assert_true(p.scale_down_window_ms == 300000);
    metadata_spec_finish(&s);

    assert_int_equal(PARSE(&s, err, "model", "m", "policy", "v3"), -1);
    assert_string_equal(err, "metadata key 'policy': expected 'v2' or 'v1', got 'v3'");

    /* idleSignal: the token rate unless the operator says every request
     * passes through the activators. */
    assert_int_equal(PARSE(&s, err, "model", "m"), 0);
    metadata_policy_params(&s, 90000, 240000, &p);
    assert_false(p.idle_by_activators);
    assert_int_equal(PARSE(&t, err, "model", "m", "idleSignal", "activators"), 0);
    metadata_policy_params(&t, 90000, 240000, &p);
    assert_true(p.idle_by_activators);
    assert_false(metadata_spec_equal(&s, &t));
    metadata_spec_finish(&t);
    assert_int_equal(PARSE(&t, err, "model", "m", "idleSignal", "tokenRate"), 0);
    assert_true(metadata_spec_equal(&s, &t));
    metadata_spec_finish(&t);
    metadata_spec_finish(&s);
    assert_int_equal(PARSE(&s, err, "model", "m", "policy", "v1", "idleSignal", "activators"), 0);
    metadata_policy_params(&s, 90000, 240000, &p);
    assert_false(p.idle_by_activators); /* v1 is v1 */
    metadata_spec_finish(&s);
    assert_int_equal(PARSE(&s, err, "model", "m", "idleSignal", "inflight"), -1);
    assert_string_equal(
        err, "metadata key 'idleSignal': expected 'tokenRate' or 'activators', got 'inflight'");
    assert_int_equal(PARSE(&s, err, "model", "m", "burstyTargetUtilisation", "0"), -1);
    assert_string_equal(err,
                        "metadata key 'burstyTargetUtilisation': expected a number in (0, 1], got '0'");
    assert_int_equal(PARSE(&s, err, "model", "m", "burstinessThreshold", "-1"), -1);
    assert_int_equal(PARSE(&s, err, "model", "m", "lateClearSeconds", "0"), -1);
    assert_string_equal(err,
                        "metadata key 'lateClearSeconds': expected a number in (0, 86400], got '0'");
    assert_int_equal(PARSE(&s, err, "model", "m", "targetUtilisation", "0"), -1);
    assert_string_equal(err, "metadata key 'targetUtilisation': expected a number in (0, 1], got '0'");
    assert_int_equal(PARSE(&s, err, "model", "m", "targetUtilisation", "1.5"), -1);
    assert_int_equal(PARSE(&s, err, "model", "m", "coldStartSeconds", "-1"), -1);
    assert_non_null(strstr(err, "'coldStartSeconds'"));
    assert_int_equal(PARSE(&s, err, "model", "m", "scaleDownWindowSeconds", "x"), -1);
    assert_non_null(strstr(err, "'scaleDownWindowSeconds'"));
    assert_int_equal(PARSE(&s, err, "model", "m", "burstyScaleDownWindowSeconds", "-5"), -1);
    assert_string_equal(
        err, "metadata key 'burstyScaleDownWindowSeconds': expected a number in [0, 86400], got '-5'");
    assert_int_equal(PARSE(&s, err, "model", "m", "tokensPerRequest", "0"), -1);
    assert_int_equal(PARSE(&s, err, "model", "m", "replicaConcurrency", "0.001"), -1);
    assert_string_equal(
        err, "metadata key 'replicaConcurrency': expected a whole number in [0, 1e+06], got '0.001'");
    assert_int_equal(PARSE(&s, err, "model", "m", "replicaConcurrency", "-16"), -1);
    assert_int_equal(PARSE(&s, err, "model", "m", "replicaConcurrency", "0"), 0);
    metadata_spec_finish(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_all_keys),
        cmocka_unit_test(test_errors_name_the_key),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_metric_name_and_equal),
        cmocka_unit_test(test_policy_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
