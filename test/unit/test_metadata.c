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
    const char *k[16], *v[16];
    size_t n = 0;
    va_list ap;
    va_start(ap, errlen);
    for (;;) {
        const char *key = va_arg(ap, const char *);
        if (!key || n == 16)
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
    assert_int_equal(PARSE(&s, err, "model", "m", "redisKey", ""), -1);
    char big[METADATA_MAX_VALUE + 2];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(PARSE(&s, err, "model", big), -1);
    assert_non_null(strstr(err, "longer than"));
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_all_keys),
        cmocka_unit_test(test_errors_name_the_key),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_metric_name_and_equal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
