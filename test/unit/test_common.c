/* common: exposition writer, options table, string map, log quoting. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/buffer.h>

#include "alloc.h"
#include "expo.h"
#include "log.h"
#include "model_name.h"
#include "utf8.h"
#include "options.h"
#include "strmap.h"

static char *drain(struct evbuffer *b)
{
    size_t n = evbuffer_get_length(b);
    char *s = malloc(n + 1);
    evbuffer_remove(b, s, n);
    s[n] = '\0';
    return s;
}

static void test_expo_samples_and_labels(void **unused)
{
    struct evbuffer *b = evbuffer_new();
    char labels[128];
    assert_true(expo_labels(labels, sizeof(labels), "model", "a\"b\\c\nd", "code", "OK",
                            (char *)NULL) > 0);
    assert_string_equal(labels, "model=\"a\\\"b\\\\c\\nd\",code=\"OK\"");
    assert_int_equal(expo_labels(labels, 10, "model", "much too long for ten", (char *)NULL), -1);
    assert_string_equal(labels, "");
    expo_family(b, "x_total", "counter", "Help with \\ and\nnewline.");
    expo_sample(b, "x_total", "a=\"1\"", 3);
    expo_sample(b, "x_total", NULL, 0.25);
    expo_sample(b, "x_total", "", 1.0 / 0.0);
    expo_sample(b, "x_total", "", 0.0 / 0.0);
    char *s = drain(b);
    assert_string_equal(s, "# HELP x_total Help with \\\\ and\\nnewline.\n# TYPE x_total counter\n"
                           "x_total{a=\"1\"} 3\nx_total 0.25\nx_total +Inf\nx_total NaN\n");
    free(s);
    evbuffer_free(b);
}

/* Whole numbers take a path of their own (not printf); every spelling must
 * still read back as the value, and a second label list joins the first. */
static void test_expo_numbers_and_label_parts(void **unused)
{
    struct evbuffer *b = evbuffer_new();
    const double values[] = {0, -0.0, 7, -7, 1e14, 999999999999999, -999999999999999, 1e15,
                             9007199254740993.0, 0.1, -2.5e-7, 1e300, -1.0 / 0.0};
    const char *spelled[] = {"0", "0", "7", "-7", "100000000000000", "999999999999999",
                             "-999999999999999", "1e+15", "9007199254740992", "0.1", "-2.5e-07",
                             "1e+300", "-Inf"};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        expo_sample(b, "v", NULL, values[i]);
        char *s = drain(b);
        char want[64];
        snprintf(want, sizeof(want), "v %s\n", spelled[i]);
        assert_string_equal(s, want);
        if (isfinite(values[i]))
            assert_true(strtod(s + 2, NULL) == values[i]);
        free(s);
    }
    expo_sample_more(b, "d", "model=\"m\"", "direction=\"up\"", 2);
    expo_sample_more(b, "d", NULL, "direction=\"up\"", 2);
    expo_sample_more(b, "d", "model=\"m\"", "", 2);
    expo_sample_more(b, "d", "", NULL, 2);
    char *s = drain(b);
    assert_string_equal(s, "d{model=\"m\",direction=\"up\"} 2\nd{direction=\"up\"} 2\n"
                           "d{model=\"m\"} 2\nd 2\n");
    free(s);
    /* A line longer than the writer's stack buffer is written whole. */
    char big[3000];
    memset(big, 'x', sizeof(big));
    memcpy(big, "k=\"", 3);
    big[sizeof(big) - 2] = '"';
    big[sizeof(big) - 1] = '\0';
    expo_sample(b, "long", big, 1);
    s = drain(b);
    assert_int_equal(strlen(s), strlen("long{} 1\n") + strlen(big));
    assert_memory_equal(s + 5, big, strlen(big));
    assert_string_equal(s + 5 + strlen(big), "} 1\n");
    free(s);
    evbuffer_free(b);
}

static void test_expo_histogram(void **unused)
{
    static const double bounds[] = {0.00005, 0.1, 1};
    struct expo_histogram h;
    assert_int_equal(expo_histogram_init(&h, bounds, 3), 0);
    expo_histogram_observe(&h, 0.00001);
    expo_histogram_observe(&h, 0.1); /* le is inclusive */
    expo_histogram_observe(&h, 5);
    struct evbuffer *b = evbuffer_new();
    expo_histogram_write(b, "lat_seconds", "m=\"x\"", &h);
    char *s = drain(b);
    assert_string_equal(s, "lat_seconds_bucket{m=\"x\",le=\"5e-05\"} 1\n"
                           "lat_seconds_bucket{m=\"x\",le=\"0.1\"} 2\n"
                           "lat_seconds_bucket{m=\"x\",le=\"1\"} 2\n"
                           "lat_seconds_bucket{m=\"x\",le=\"+Inf\"} 3\n"
                           "lat_seconds_sum{m=\"x\"} 5.10001\n"
                           "lat_seconds_count{m=\"x\"} 3\n");
    free(s);
    evbuffer_free(b);
    expo_histogram_finish(&h);
    alloc_fail_after(0);
    assert_int_equal(expo_histogram_init(&h, bounds, 3), -1);
    alloc_fail_after(-1);
}

struct opts {
    char *listen;
    long n;
    double ratio;
    enum log_level level;
};

static const struct opt_def defs[] = {
    {"listen", OPT_STRING, offsetof(struct opts, listen), "0.0.0.0:1", 0, 0, "addr", "listen"},
    {"count", OPT_INT, offsetof(struct opts, n), "5", 1, 10, "n", "count"},
    {"ratio", OPT_DOUBLE, offsetof(struct opts, ratio), "0.5", 0, 1, "r", NULL},
    {"log-level", OPT_LOG_LEVEL, offsetof(struct opts, level), "info", 0, 0, "lvl", "logLevel"},
    {"config", OPT_STRING, 0, NULL, 0, 0, "cfg", NULL},
};

static enum options_result parse(struct opts *o, char *err, size_t errlen, int argc, char **argv)
{
    memset(o, 0, sizeof(*o));
    /* "config" aliases listen's slot in this table only to test the file path. */
    return options_parse(defs, 4, o, argc, argv, "t", "test", NULL, NULL, stdout, err, errlen);
}

static void test_options_precedence_and_errors(void **unused)
{
    struct opts o;
    char err[256];
    char *a1[] = {"t", NULL};
    unsetenv("THAW_COUNT");
    assert_int_equal(parse(&o, err, sizeof(err), 1, a1), OPTIONS_OK);
    assert_string_equal(o.listen, "0.0.0.0:1");
    assert_int_equal(o.n, 5);
    assert_int_equal(o.level, LOG_LEVEL_INFO);
    options_free(defs, 4, &o);

    setenv("THAW_COUNT", "7", 1);
    char *a2[] = {"t", "--listen=127.0.0.1:9", "--log-level", "debug", NULL};
    assert_int_equal(parse(&o, err, sizeof(err), 4, a2), OPTIONS_OK);
    assert_int_equal(o.n, 7); /* environment over default */
    assert_string_equal(o.listen, "127.0.0.1:9");
    assert_int_equal(o.level, LOG_LEVEL_DEBUG);
    options_free(defs, 4, &o);

    char *a3[] = {"t", "--count", "9", NULL};
    assert_int_equal(parse(&o, err, sizeof(err), 3, a3), OPTIONS_OK);
    assert_int_equal(o.n, 9); /* flag over environment */
    options_free(defs, 4, &o);
    unsetenv("THAW_COUNT");

    char *bad[][3] = {{"t", "--count", "11"}, {"t", "--count", "2.5"}, {"t", "--ratio", "x"},
                      {"t", "--log-level", "loud"}, {"t", "--nope", "1"}};
    const char *expect[] = {"--count: 11 is outside", "--count: expected a whole number",
                            "--ratio: expected a number", "--log-level: unknown level",
                            "unknown option '--nope'"};
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(parse(&o, err, sizeof(err), 3, bad[i]), OPTIONS_ERROR);
        assert_non_null(strstr(err, expect[i]));
        options_free(defs, 4, &o);
    }
    char *missing[] = {"t", "--count", NULL};
    assert_int_equal(parse(&o, err, sizeof(err), 2, missing), OPTIONS_ERROR);
    assert_string_equal(err, "--count: missing value");
    options_free(defs, 4, &o);
    setenv("THAW_LOG_LEVEL", "shouty", 1);
    assert_int_equal(parse(&o, err, sizeof(err), 1, a1), OPTIONS_ERROR);
    assert_non_null(strstr(err, "THAW_LOG_LEVEL"));
    unsetenv("THAW_LOG_LEVEL");
    options_free(defs, 4, &o);
}

struct cfg_opts {
    char *listen;
    long n;
    char *config;
};

static const struct opt_def cfg_defs[] = {
    {"listen", OPT_STRING, offsetof(struct cfg_opts, listen), "a", 0, 0, "addr", "listen"},
    {"count", OPT_INT, offsetof(struct cfg_opts, n), "5", 1, 10, "n", "count"},
    {"config", OPT_STRING, offsetof(struct cfg_opts, config), NULL, 0, 0, "cfg", NULL},
};

static void test_options_config_file(void **unused)
{
    char path[] = "/tmp/thaw-opt-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *json = "{\"listen\": \"from-file\", \"count\": 8, \"models\": []}";
    assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    struct cfg_opts o;
    char err[256];
    const char *extra[] = {"models", NULL};
    char *argv[] = {"t", "--config", path, "--count", "3", NULL};
    memset(&o, 0, sizeof(o));
    assert_int_equal(options_parse(cfg_defs, 3, &o, 5, argv, "t", "s", "config", extra, stdout,
                                   err, sizeof(err)),
                     OPTIONS_OK);
    assert_string_equal(o.listen, "from-file"); /* file over default */
    assert_int_equal(o.n, 3);                   /* flag over file */
    options_free(cfg_defs, 3, &o);

    memset(&o, 0, sizeof(o));
    assert_int_equal(options_parse(cfg_defs, 3, &o, 3, argv, "t", "s", "config", NULL, stdout,
                                   err, sizeof(err)),
                     OPTIONS_ERROR);
    assert_non_null(strstr(err, "unknown key 'models'"));
    options_free(cfg_defs, 3, &o);

    fd = open(path, O_WRONLY | O_TRUNC);
    assert_int_equal(write(fd, "{\"count\": 99}", 13), 13);
    close(fd);
    memset(&o, 0, sizeof(o));
    assert_int_equal(options_parse(cfg_defs, 3, &o, 3, argv, "t", "s", "config", NULL, stdout,
                                   err, sizeof(err)),
                     OPTIONS_ERROR);
    assert_non_null(strstr(err, "key 'count'"));
    options_free(cfg_defs, 3, &o);

    fd = open(path, O_WRONLY | O_TRUNC);
    assert_int_equal(write(fd, "{\"count\": ", 10), 10);
    close(fd);
    memset(&o, 0, sizeof(o));
    assert_int_equal(options_parse(cfg_defs, 3, &o, 3, argv, "t", "s", "config", NULL, stdout,
                                   err, sizeof(err)),
                     OPTIONS_ERROR);
    assert_non_null(strstr(err, "line 1"));
    options_free(cfg_defs, 3, &o);
    unlink(path);
}

static void test_split_hostport(void **unused)
{
    char host[64];
    int port;
    assert_int_equal(options_split_hostport("127.0.0.1:9090", host, sizeof(host), &port), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 9090);
    assert_int_equal(options_split_hostport("[::1]:0", host, sizeof(host), &port), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 0);
    assert_int_equal(options_split_hostport("nohost", host, sizeof(host), &port), -1);
    assert_int_equal(options_split_hostport(":80", host, sizeof(host), &port), -1);
    assert_int_equal(options_split_hostport("h:70000", host, sizeof(host), &port), -1);
    assert_int_equal(options_split_hostport("h:8x", host, sizeof(host), &port), -1);
}

static void test_strmap(void **unused)
{
    struct strmap *m = strmap_new();
    char key[32];
    static int values[5000];
    for (int i = 0; i < 5000; i++) {
        snprintf(key, sizeof(key), "model-%d", i);
        assert_int_equal(strmap_put(m, key, &values[i]), 0);
    }
    assert_int_equal(strmap_count(m), 5000);
    for (int i = 0; i < 5000; i += 2) {
        snprintf(key, sizeof(key), "model-%d", i);
        assert_ptr_equal(strmap_remove(m, key), &values[i]);
    }
    for (int i = 0; i < 5000; i++) {
        snprintf(key, sizeof(key), "model-%d", i);
        /* removal re-seats probe runs: every odd key is still found */
        assert_ptr_equal(strmap_get(m, key), (i % 2) ? &values[i] : NULL);
    }
    size_t cur = 0, seen = 0;
    const char *k;
    void *v;
    while (strmap_next(m, &cur, &k, &v))
        seen++;
    assert_int_equal(seen, 2500);
    assert_null(strmap_remove(m, "absent"));
    assert_int_equal(strmap_put(m, "model-1", &values[0]), 0); /* replace */
    assert_ptr_equal(strmap_get(m, "model-1"), &values[0]);
    assert_int_equal(strmap_count(m), 2500);
    alloc_fail_after(0);
    assert_int_equal(strmap_put(m, "new-key", &values[0]), -1);
    alloc_fail_after(-1);
    assert_null(strmap_get(m, "new-key"));
    strmap_free(m);
    alloc_fail_after(0);
    assert_null(strmap_new());
    alloc_fail_after(-1);
}

static char captured[4096];
static void capture(void *ud, const char *line, size_t len)
{
    snprintf(captured, sizeof(captured), "%.*s", (int)len, line);
}

/* The first warning of a flood is logged, then one per LOG_THROTTLE_MS. */
static void test_log_throttle(void **unused)
{
    (void)unused;
    int64_t last = 0;
    assert_true(log_throttle(&last, 5));
    assert_int_equal(last, 5);
    assert_false(log_throttle(&last, 5 + LOG_THROTTLE_MS - 1));
    assert_int_equal(last, 5);
    assert_true(log_throttle(&last, 5 + LOG_THROTTLE_MS));
    assert_int_equal(last, 5 + LOG_THROTTLE_MS);
}

static void test_log(void **unused)
{
    char q[64];
    assert_string_equal(log_quote(q, sizeof(q), "plain"), "plain");
    assert_string_equal(log_quote(q, sizeof(q), "two words"), "\"two words\"");
    assert_string_equal(log_quote(q, sizeof(q), "a\"b\nc"), "\"a\\\"b\\nc\"");
    assert_string_equal(log_quote(q, sizeof(q), ""), "\"\"");
    /* Credentials in URLs never reach the log; the rest stays readable. */
    char u[128];
    assert_string_equal(log_quote_url(u, sizeof(u), "redis://:s3cret@redis:6379/2"),
                        "redis://:REDACTED@redis:6379/2");
    assert_string_equal(log_quote_url(u, sizeof(u), "http://thaw:pa:ss@prom:9090/x?a=b@c"),
                        "\"http://thaw:REDACTED@prom:9090/x?a=b@c\""); /* '=' is quoted */
    assert_string_equal(log_quote_url(u, sizeof(u), "http://user@prom:9090"),
                        "http://user@prom:9090");
    assert_string_equal(log_quote_url(u, sizeof(u), "http://prom:9090/a:b@c"),
                        "http://prom:9090/a:b@c");
    assert_string_equal(log_quote_url(u, sizeof(u), "redis://u:p w@h"), "redis://u:REDACTED@h");
    /* A Redis password may hold '/': the parsers take the last '@'. */
    assert_string_equal(log_quote_url(u, sizeof(u), "redis://:pa/ss@h:6379/1"),
                        "redis://:REDACTED@h:6379/1");
    assert_string_equal(log_quote_url(u, sizeof(u), "rediss://u:a/b?c#d@h"), "rediss://u:REDACTED@h");
    assert_string_equal(log_quote_url(u, sizeof(u), NULL), "\"\"");
    log_set_sink(capture, NULL);
    log_set_level(LOG_LEVEL_WARN);
    captured[0] = '\0';
    LOG_INFO("ignored", "x=%d", 1);
    assert_string_equal(captured, "");
    LOG_WARN("seen", "x=%d", 2);
    assert_non_null(strstr(captured, "level=warn event=seen x=2\n"));
    assert_true(strncmp(captured, "ts=", 3) == 0);
    log_set_sink(NULL, NULL);
    log_set_level(LOG_LEVEL_INFO);
    enum log_level l;
    assert_int_equal(log_level_parse("warning", &l), 0);
    assert_int_equal(l, LOG_LEVEL_WARN);
    assert_int_equal(log_level_parse("verbose", &l), -1);
}

/* The shared model-name rule and the /wake query decoder. */
static void test_model_name(void **state)
{
    (void)state;
    char big[MODEL_NAME_MAX + 2];
    memset(big, 'x', sizeof(big));
    assert_true(model_name_valid("llama-8b", 8));
    assert_true(model_name_valid("org/m 1 \xc3\xa9", 10)); /* space and UTF-8 allowed */
    assert_true(model_name_valid(big, MODEL_NAME_MAX));
    assert_false(model_name_valid(big, MODEL_NAME_MAX + 1));
    assert_false(model_name_valid("", 0));
    assert_false(model_name_valid("a\nb", 3));
    assert_false(model_name_valid("a\0b", 3));
    assert_false(model_name_valid("a\x7f", 2));
    assert_false(model_name_valid("\xc2\x85", 2));         /* C1 control NEL */
    assert_false(model_name_valid("\xff", 1));             /* not UTF-8 */
    assert_false(model_name_valid("\xc0\xaf", 2));         /* overlong '/' */
    assert_false(model_name_valid("\xed\xa0\x80", 3));     /* surrogate */
    assert_false(model_name_valid("\xf4\x90\x80\x80", 4)); /* past U+10FFFF */
    assert_false(model_name_valid("\xe2\x82", 2));         /* cut short */
    char out[MODEL_NAME_MAX + 1];
    assert_int_equal(model_name_from_query("org%2Fm+1", 9, out, sizeof(out)), 7);
    assert_string_equal(out, "org/m 1");
    assert_int_equal(model_name_from_query("%41b", 4, out, sizeof(out)), 2);
    assert_string_equal(out, "Ab");
    assert_int_equal(model_name_from_query("ab%00cd", 7, out, sizeof(out)), -1);
    assert_int_equal(model_name_from_query("a%4X", 3, out, sizeof(out)), -1); /* ends at "%4" */
    assert_int_equal(model_name_from_query("a%2B", 4, out, sizeof(out)), 2);
    assert_string_equal(out, "a+");
    assert_int_equal(model_name_from_query("%F0%9F%A6%99", 12, out, sizeof(out)), 4);
    assert_true(model_name_valid("\xf0\x9f\xa6\x99", 4)); /* 4-byte UTF-8 */
    assert_false(model_name_valid("a\x80", 2));             /* lone continuation byte */
    assert_int_equal(model_name_from_query("a%", 2, out, sizeof(out)), -1);
    assert_int_equal(model_name_from_query("a%zz", 4, out, sizeof(out)), -1);
    assert_int_equal(model_name_from_query("", 0, out, sizeof(out)), -1);
    assert_int_equal(model_name_from_query(big, MODEL_NAME_MAX + 1, out, sizeof(out)), -1);
    assert_int_equal(model_name_from_query(big, MODEL_NAME_MAX, out, sizeof(out)), MODEL_NAME_MAX);
    /* utf8_valid: the encoding alone; control characters and NUL are text. */
    assert_true(utf8_valid("", 0));
    assert_true(utf8_valid("a\nb\0\x7f", 5));
    assert_true(utf8_valid("\xc2\x85\xf0\x9f\xa6\x99\xef\xbf\xbf", 9));
    assert_false(utf8_valid("ok\xff", 3));
    assert_false(utf8_valid("\xc0\xaf", 2));
    assert_false(utf8_valid("\xed\xa0\x80", 3));
    assert_false(utf8_valid("\xf4\x90\x80\x80", 4));
    assert_false(utf8_valid("\xe2\x82", 2));
    assert_false(utf8_valid("\x80", 1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expo_samples_and_labels),
        cmocka_unit_test(test_expo_numbers_and_label_parts),
        cmocka_unit_test(test_expo_histogram),
        cmocka_unit_test(test_options_precedence_and_errors),
        cmocka_unit_test(test_options_config_file),
        cmocka_unit_test(test_split_hostport),
        cmocka_unit_test(test_strmap),
        cmocka_unit_test(test_log),
        cmocka_unit_test(test_log_throttle),
        cmocka_unit_test(test_model_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
