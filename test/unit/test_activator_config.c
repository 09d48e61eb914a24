/* Unit tests for activator/config: defaults, limits, every error naming its
 * field, allocation failures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "config.h"

static struct config *parse(const char *s, char *err, size_t errlen)
{
    return config_parse(s, strlen(s), err, errlen);
}

static void test_full(void **state)
{
    (void)state;
    const char *text =
        "{\"limits\":{\"maxHeaderBytes\":4096,\"idleTimeoutSeconds\":1.5},"
        "\"defaults\":{\"holdTimeoutSeconds\":30,\"healthPath\":\"/ready\"},"
        "\"apiKeyTiers\":{\"sk-gold\":\"high\",\"sk-batch\":\"low\"},"
        "\"models\":[{\"name\":\"m1\",\"backend\":\"http://127.0.0.1:8001\","
        "\"aliases\":[\"m1-lora-*\"],\"maxHeldRequests\":10,\"maxHeldBytes\":1000,"
        "\"holdTimeoutSeconds\":600,\"maxConcurrencyPerEndpoint\":4,\"lateAfterSeconds\":1.5,"
        "\"dnsRefreshWakingSeconds\":0.25,\"splitConcurrencyAcrossActivators\":false,"
        "\"fallbackBackend\":\"http://small.models:8000\",\"fallbackAfterSeconds\":2.5,"
        "\"wakeWith\":[\"m2\"]},"
        "{\"name\":\"m2\",\"endpointsFile\":\"/tmp/eps\",\"hosts\":[\"m2.local\"]}]}";
    char err[256] = "";
    struct config *cfg = parse(text, err, sizeof(err));
    if (!cfg)
        fail_msg("%s", err);
    assert_int_equal(cfg->limits.max_header_bytes, 4096);
    assert_int_equal(cfg->limits.idle_timeout_ms, 1500);
    assert_int_equal(cfg->limits.max_headers, 100); /* default */
    assert_int_equal(cfg->nmodels, 2);
    const struct model_config *m1 = &cfg->models[0], *m2 = &cfg->models[1];
    assert_string_equal(m1->backend_host, "127.0.0.1");
    assert_int_equal(m1->backend_port, 8001);
    assert_int_equal(m1->hold_timeout_ms, 600000);
    assert_int_equal(m2->hold_timeout_ms, 30000); /* from defaults */
    assert_string_equal(m1->health_path, "/ready");
    assert_int_equal(m1->max_held_requests, 10);
    assert_int_equal(m2->max_held_requests, 1000);
    assert_int_equal(m1->max_concurrency_per_endpoint, 4);
    assert_int_equal(m1->split_concurrency, 0);
    assert_int_equal(m2->split_concurrency, 1); /* default: shared with peers */
    assert_string_equal(m1->fallback_host, "small.models");
    assert_int_equal(m1->fallback_port, 8000);
    assert_int_equal(m1->fallback_after_ms, 2500);
    assert_null(m2->fallback_backend);
    assert_int_equal(m2->fallback_after_ms, 30000); /* default */
    assert_int_equal(m1->late_after_ms, 1500);
    assert_int_equal(m2->late_after_ms, 0); /* FIFO unless asked */
    assert_int_equal(m1->probe_initial_ms, 10);
    assert_int_equal(m1->probe_max_ms, 25);
    assert_int_equal(m1->dns_refresh_ms, 5000);
    assert_int_equal(m1->dns_refresh_waking_ms, 250);
    assert_int_equal(m2->dns_refresh_waking_ms, 500); /* default */
    assert_int_equal(m1->naliases, 1);
    assert_int_equal(m1->nwake_with, 1);
    assert_null(m2->backend);
    assert_string_equal(m2->endpoints_file, "/tmp/eps");
    assert_int_equal(m2->nhosts, 1);
    assert_int_equal(cfg->napi_keys, 2);
    assert_int_equal(config_model_index(cfg, "m2"), 1);
    assert_int_equal(config_model_index(cfg, "m3"), -1);
    config_free(cfg);
    config_free(NULL);
}

/* The upstream timeouts come from the built-in default, then "defaults",
 * then the model; the body idle timeout is a limit. */
static void test_timeouts(void **state)
{
    (void)state;
    char err[256] = "";
    struct config *cfg = parse("{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\"}]}",
                               err, sizeof(err));
    if (!cfg)
        fail_msg("%s", err);
    assert_int_equal(cfg->limits.body_idle_timeout_ms, 30000);
    assert_int_equal(cfg->models[0].response_header_timeout_ms, 300000);
    assert_int_equal(cfg->models[0].response_idle_timeout_ms, 600000);
    config_free(cfg);

    const char *text =
        "{\"limits\":{\"bodyIdleTimeoutSeconds\":2.5},"
        "\"defaults\":{\"responseHeaderTimeoutSeconds\":45,\"responseIdleTimeoutSeconds\":0.25},"
        "\"models\":[{\"name\":\"a\",\"backend\":\"http://a\","
        "\"responseHeaderTimeoutSeconds\":0.5},"
        "{\"name\":\"b\",\"backend\":\"http://b\",\"responseIdleTimeoutSeconds\":3600}]}";
    cfg = parse(text, err, sizeof(err));
    if (!cfg)
        fail_msg("%s", err);
    assert_int_equal(cfg->limits.body_idle_timeout_ms, 2500);
    assert_int_equal(cfg->models[0].response_header_timeout_ms, 500);  /* own */
    assert_int_equal(cfg->models[0].response_idle_timeout_ms, 250);    /* defaults */
    assert_int_equal(cfg->models[1].response_header_timeout_ms, 45000); /* defaults */
    assert_int_equal(cfg->models[1].response_idle_timeout_ms, 3600000); /* own */
    config_free(cfg);
}

/* The send timeout and the lingering close: defaults (nginx's values for
 * send_timeout, lingering_timeout and lingering_time), overrides, bounds. */
static void test_send_and_linger(void **state)
{
    (void)state;
    char err[256] = "";
    struct config *cfg = parse("{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\"}]}",
                               err, sizeof(err));
    if (!cfg)
        fail_msg("%s", err);
    assert_int_equal(cfg->limits.send_timeout_ms, 60000);
    assert_int_equal(cfg->limits.lingering_timeout_ms, 5000);
    assert_int_equal(cfg->limits.lingering_time_ms, 30000);
    assert_int_equal(cfg->limits.lingering_max_bytes, 64L << 20);
    assert_int_equal(cfg->limits.max_lingering, 512);
    config_free(cfg);

    cfg = parse("{\"limits\":{\"sendTimeoutSeconds\":0.5,\"lingeringTimeoutSeconds\":0,"
                "\"lingeringTimeSeconds\":2,\"lingeringMaxBytes\":1000,"
                "\"maxLingeringConnections\":3},"
                "\"models\":[{\"name\":\"a\",\"backend\":\"http://a\"}]}",
                err, sizeof(err));
    if (!cfg)
        fail_msg("%s", err);
    assert_int_equal(cfg->limits.send_timeout_ms, 500);
    assert_int_equal(cfg->limits.lingering_timeout_ms, 0); /* lingering off */
    assert_int_equal(cfg->limits.lingering_time_ms, 2000);
    assert_int_equal(cfg->limits.lingering_max_bytes, 1000);
    assert_int_equal(cfg->limits.max_lingering, 3);
    config_free(cfg);

    cfg = parse("{\"limits\":{\"sendTimeoutSeconds\":0},"
                "\"models\":[{\"name\":\"a\",\"backend\":\"http://a\"}]}",
                err, sizeof(err));
    assert_null(cfg);
    assert_non_null(strstr(err, "limits.sendTimeoutSeconds: expected a number in 0.01..86400"));
    cfg = parse("{\"limits\":{\"lingeringTimeSeconds\":-1},"
                "\"models\":[{\"name\":\"a\",\"backend\":\"http://a\"}]}",
                err, sizeof(err));
    assert_null(cfg);
    assert_non_null(strstr(err, "limits.lingeringTimeSeconds"));
}

static void test_errors(void **state)
{
    (void)state;
    struct {
        const char *text, *want;
    } cases[] = {
        {"{", "line 1"},
        {"[]", "top level"},
        {"{\"models\":[]}", "models: expected a non-empty array"},
        {"{\"modls\":[]}", "modls: unknown field"},
        {"{\"models\":[{\"backend\":\"http://a\"}]}", "models[0].name: required"},
        {"{\"models\":[{\"name\":\"a\"}]}", "exactly one of backend and endpointsFile"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\",\"endpointsFile\":\"/x\"}]}",
         "exactly one"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"https://a\"}]}", "models[0].backend"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a:99999\"}]}", "models[0].backend"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a/v1\"}]}", "models[0].backend"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\",\"maxHeldRequests\":0}]}",
         "models[0].maxHeldRequests: expected a number in 1..1e+07"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\",\"maxHeldRequests\":1.5}]}",
         "models[0].maxHeldRequests: expected a whole number"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\",\"maxHeldRequests\":\"5\"}]}",
         "models[0].maxHeldRequests: expected a number"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\",\"holdTimeout\":5}]}",
         "models[0].holdTimeout: unknown field"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\",\"aliases\":[\"x\",3]}]}",
         "models[0].aliases[1]: expected a non-empty string"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\",\"healthPath\":\"health\"}]}",
         "models[0].healthPath: must start with '/'"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\",\"healthPath\":\"/health#x\"}]}",
         "models[0].healthPath: must not hold spaces, control characters or '#' (a fragment is "
         "not sent)"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\",\"aliases\":[\"x\",\"y\\u0007\"]}]}",
         "models[0].aliases[1]: expected 1-512 bytes without control characters"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\",\"probeInitialMs\":500,"
         "\"probeMaxMs\":100}]}",
         "models[0].probeMaxMs"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\"},{\"name\":\"a\","
         "\"backend\":\"http://b\"}]}",
         "models[1].name: duplicate model 'a'"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\",\"wakeWith\":[\"zz\"]}]}",
         "models[0].wakeWith[0]: unknown model 'zz'"},
        {"{\"defaults\":{\"name\":\"x\"},\"models\":[{\"name\":\"a\",\"backend\":\"http://a\"}]}",
         "defaults.name: unknown field"},
        {"{\"limits\":{\"maxHeaders\":1000},\"models\":[{\"name\":\"a\",\"backend\":\"http://a\"}]}",
         "limits.maxHeaders"},
        {"{\"apiKeyTiers\":{\"k\":\"urgent\"},\"models\":[{\"name\":\"a\",\"backend\":\"http://a\"}]}",
         "apiKeyTiers.k"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\",\"name\":\"b\"}]}", "duplicate"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\","
         "\"responseHeaderTimeoutSeconds\":0}]}",
         "models[0].responseHeaderTimeoutSeconds: expected a number in 0.01..86400"},
        {"{\"defaults\":{\"responseIdleTimeoutSeconds\":\"600\"},"
         "\"models\":[{\"name\":\"a\",\"backend\":\"http://a\"}]}",
         "defaults.responseIdleTimeoutSeconds: expected a number"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\"},{\"name\":\"b\","
         "\"backend\":\"http://b\",\"responseIdleTimeoutSeconds\":-1}]}",
         "models[1].responseIdleTimeoutSeconds: expected a number in 0.01..86400"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\","
         "\"fallbackBackend\":\"https://b\"}]}",
         "models[0].fallbackBackend: expected http://HOST[:PORT]"},
        {"{\"models\":[{\"name\":\"a\",\"backend\":\"http://a\","
         "\"splitConcurrencyAcrossActivators\":1}]}",
         "models[0].splitConcurrencyAcrossActivators: expected true or false"},
        {"{\"limits\":{\"bodyIdleTimeoutSeconds\":7200},"
         "\"models\":[{\"name\":\"a\",\"backend\":\"http://a\"}]}",
         "limits.bodyIdleTimeoutSeconds: expected a number in 0.01..3600"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[256] = "";
        struct config *cfg = parse(cases[i].text, err, sizeof(err));
        if (cfg) {
            config_free(cfg);
            fail_msg("case %zu parsed: %s", i, cases[i].text);
        }
        if (!strstr(err, cases[i].want))
            fail_msg("case %zu: err '%s' lacks '%s'", i, err, cases[i].want);
    }
}

static void test_backend_url(void **state)
{
    (void)state;
    char host[64];
    int port;
    assert_int_equal(config_parse_backend_url("http://svc.ns:8000/", host, sizeof(host), &port), 0);
    assert_string_equal(host, "svc.ns");
    assert_int_equal(port, 8000);
    assert_int_equal(config_parse_backend_url("http://[::1]:9", host, sizeof(host), &port), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 9);
    assert_int_equal(config_parse_backend_url("http://h", host, sizeof(host), &port), 0);
    assert_int_equal(port, 80);
    assert_int_equal(config_parse_backend_url("http://", host, sizeof(host), &port), -1);
    assert_int_equal(config_parse_backend_url("http://u@h", host, sizeof(host), &port), -1);
    assert_int_equal(config_parse_backend_url("http://h:0", host, sizeof(host), &port), -1);
    assert_int_equal(config_parse_backend_url("http://[::1", host, sizeof(host), &port), -1);
}

/* Every allocation failure point gives NULL and an error, never a crash or leak. */
static void test_oom(void **state)
{
    (void)state;
    const char *text =
        "{\"apiKeyTiers\":{\"k\":\"high\"},\"models\":[{\"name\":\"m1\",\"backend\":"
        "\"http://h:1\",\"aliases\":[\"a\",\"b\"]},{\"name\":\"m2\",\"endpointsFile\":\"/f\"}]}";
    int failures = 0;
    for (long n = 0; n < 200; n++) {
        char err[256] = "";
        alloc_fail_after(n);
        struct config *cfg = parse(text, err, sizeof(err));
        alloc_fail_after(-1);
        if (cfg) {
            config_free(cfg);
            break;
        }
        assert_true(strlen(err) > 0);
        failures++;
    }
    assert_true(failures > 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_timeouts),
        cmocka_unit_test(test_send_and_linger),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_backend_url),
        cmocka_unit_test(test_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
