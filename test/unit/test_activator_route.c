/* Unit tests for activator/route: JSON "model" scanning on whole and
 * truncated bodies, globs, name/alias/host lookup. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

#include "config.h"
#include "route.h"

static enum route_json_result scan(const char *s, struct route_json_info *info)
{
    return route_json_scan(s, strlen(s), info);
}

static void test_json_found(void **state)
{
    (void)state;
    struct route_json_info info;
    assert_int_equal(scan("{\"model\":\"m1\",\"stream\":true}", &info), ROUTE_JSON_FOUND);
    assert_string_equal(info.model, "m1");
    assert_true(info.stream_seen);
    assert_true(info.stream);
    const char *body = " {\n \"messages\": [{\"role\": \"user\", \"content\": \"say \\\"}\\\" {[\"}],"
                       " \"n\": -1.5e3, \"x\": null, \"ok\": false, \"o\": {\"model\": \"inner\"},"
                       " \"model\" : \"m1-lora-\\u00e9\\ud83d\\ude00\", \"stream\": false }";
    assert_int_equal(scan(body, &info), ROUTE_JSON_FOUND);
    assert_string_equal(info.model, "m1-lora-\xc3\xa9\xf0\x9f\x98\x80");
    assert_true(info.stream_seen);
    assert_false(info.stream);
    /* Every truncation before the model value's end asks for more; after it, found. */
    const char *mend = strstr(body, "\\ude00\"") + 7;
    for (size_t cut = 0; cut < strlen(body); cut++) {
        enum route_json_result r = route_json_scan(body, cut, &info);
        if (body + cut < mend) {
            if (r != ROUTE_JSON_MORE)
                fail_msg("cut %zu: %d", cut, r);
        } else {
            assert_int_equal(r, ROUTE_JSON_FOUND);
            assert_string_equal(info.model, "m1-lora-\xc3\xa9\xf0\x9f\x98\x80");
        }
    }
}

static void test_json_absent_invalid(void **state)
{
    (void)state;
    struct route_json_info info;
    assert_int_equal(scan("{}", &info), ROUTE_JSON_ABSENT);
    assert_int_equal(scan("{\"a\": 1, \"b\": [1,2,{\"model\":\"x\"}]}", &info), ROUTE_JSON_ABSENT);
    assert_int_equal(scan("", &info), ROUTE_JSON_MORE);
    assert_int_equal(scan("  ", &info), ROUTE_JSON_MORE);
    assert_int_equal(scan("[1]", &info), ROUTE_JSON_INVALID);
    assert_int_equal(scan("model=m1", &info), ROUTE_JSON_INVALID);
    assert_int_equal(scan("{\"model\": 12}", &info), ROUTE_JSON_INVALID);
    assert_int_equal(scan("{\"model\": \"a\\q\"}", &info), ROUTE_JSON_INVALID);
    assert_int_equal(scan("{\"model\": \"a\nb\"}", &info), ROUTE_JSON_INVALID);
    assert_int_equal(scan("{\"model\": \"\\udc00\"}", &info), ROUTE_JSON_INVALID);
    assert_int_equal(scan("{\"a\" 1}", &info), ROUTE_JSON_INVALID);
    assert_int_equal(scan("{\"a\": tru }", &info), ROUTE_JSON_INVALID);
    assert_int_equal(scan("{\"a\": 1 \"b\": 2}", &info), ROUTE_JSON_INVALID);
    assert_int_equal(scan("{\"model\": \"a\", \"model\": \"b\"}", &info), ROUTE_JSON_INVALID);
    assert_int_equal(scan("{\"model\": \"a\", \"model\": \"a\"}", &info), ROUTE_JSON_FOUND);
    /* A name longer than any model's (MODEL_NAME_MAX) cannot route; the
     * longest can. */
    char big[11 + MODEL_NAME_MAX + 1 + 3];
    memset(big, 'x', sizeof(big));
    memcpy(big, "{\"model\": \"", 11);
    memcpy(big + sizeof(big) - 3, "\"}", 3);
    assert_int_equal(scan(big, &info), ROUTE_JSON_INVALID);
    memcpy(big + sizeof(big) - 4, "\"}", 3);
    assert_int_equal(scan(big, &info), ROUTE_JSON_FOUND);
    assert_int_equal(strlen(info.model), MODEL_NAME_MAX);
    /* A key longer than the scanner's key buffer is skipped, not confused with "model". */
    assert_int_equal(scan("{\"modelmodelmodelmodel\": \"a\"}", &info), ROUTE_JSON_ABSENT);
    assert_int_equal(scan("{\"a\": 12", &info), ROUTE_JSON_MORE);
    assert_int_equal(scan("{\"a\": [1, \"]\"", &info), ROUTE_JSON_MORE);
}

static void test_glob(void **state)
{
    (void)state;
    struct {
        const char *p, *s;
        bool nocase, want;
    } cases[] = {
        {"m1-lora-*", "m1-lora-abc", false, true}, {"m1-lora-*", "m1-lora-", false, true},
        {"m1-lora-*", "m1-lor", false, false},     {"*", "", false, true},
        {"a*b*c", "aXXbYYc", false, true},         {"a*b*c", "aXXbYY", false, false},
        {"a*b", "abab", false, true},              {"abc", "ABC", false, false},
        {"*.Example.com", "api.example.COM", true, true},
        {"*.example.com", "example.com", true, false},
        {"", "", false, true},                     {"", "a", false, false},
        {"**a", "xa", false, true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bool got = route_glob(cases[i].p, cases[i].s, strlen(cases[i].s), cases[i].nocase);
        if (got != cases[i].want)
            fail_msg("glob %zu: %s vs %s", i, cases[i].p, cases[i].s);
    }
}

static void test_lookup(void **state)
{
    (void)state;
    const char *text =
        "{\"models\":["
        "{\"name\":\"base\",\"backend\":\"http://127.0.0.1:1\",\"aliases\":[\"m1-*\"],"
        "\"hosts\":[\"*.base.local\"]},"
        "{\"name\":\"m1-special\",\"backend\":\"http://127.0.0.1:2\"},"
        "{\"name\":\"other\",\"backend\":\"http://127.0.0.1:3\",\"aliases\":[\"m1-exact\"],"
        "\"hosts\":[\"other.example\", \"[::1]\"]}]}";
    char err[256];
    struct config *cfg = config_parse(text, strlen(text), err, sizeof(err));
    assert_non_null(cfg);
    assert_int_equal(route_by_name(cfg, "base", 4), 0);
    assert_int_equal(route_by_name(cfg, "m1-special", 10), 1); /* name beats glob alias */
    assert_int_equal(route_by_name(cfg, "m1-exact", 8), 2);    /* exact alias beats glob */
    assert_int_equal(route_by_name(cfg, "m1-lora-7", 9), 0);
    assert_int_equal(route_by_name(cfg, "bas", 3), -1);
    assert_int_equal(route_by_name(cfg, "basex", 5), -1);
    assert_int_equal(route_by_host(cfg, "OTHER.example:8080", 18), 2);
    assert_int_equal(route_by_host(cfg, "other.example", 13), 2);
    assert_int_equal(route_by_host(cfg, "a.base.local", 12), 0);
    assert_int_equal(route_by_host(cfg, "[::1]:80", 8), 2);
    assert_int_equal(route_by_host(cfg, "nobody", 6), -1);
    /* The hash index answers exactly like the linear lookup. */
    struct route_table *t = route_table_new(cfg);
    assert_non_null(t);
    const char *names[] = {"base", "m1-special", "m1-exact", "m1-lora-7", "bas", "basex", "other",
                           "m1-", "", "m1"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        assert_int_equal(route_table_lookup(t, names[i]),
                         route_by_name(cfg, names[i], strlen(names[i])));
    route_table_free(t);
    route_table_free(NULL);
    config_free(cfg);
}

/* Many models: every name and alias found; allocation failures give NULL. */
static void test_table_many(void **state)
{
    (void)state;
    char *text = malloc(2000000);
    assert_non_null(text);
    size_t o = (size_t)sprintf(text, "{\"models\":[");
    for (int i = 0; i < 5000; i++)
        o += (size_t)sprintf(text + o, "%s{\"name\":\"m%d\",\"backend\":\"http://127.0.0.1:1\","
                                       "\"aliases\":[\"a%d\",\"g%d-*\"]}",
                             i ? "," : "", i, i, i);
    sprintf(text + o, "]}");
    char err[256];
    struct config *cfg = config_parse(text, strlen(text), err, sizeof(err));
    free(text);
    assert_non_null(cfg);
    struct route_table *t = route_table_new(cfg);
    assert_non_null(t);
    for (int i = 0; i < 5000; i += 7) {
        char n[32];
        sprintf(n, "m%d", i);
        assert_int_equal(route_table_lookup(t, n), i);
        sprintf(n, "a%d", i);
        assert_int_equal(route_table_lookup(t, n), i);
        sprintf(n, "g%d-x", i);
        assert_int_equal(route_table_lookup(t, n), i);
    }
    assert_int_equal(route_table_lookup(t, "nope"), -1);
    route_table_free(t);
    for (long n = 0; n < 40; n++) {
        alloc_fail_after(n);
        t = route_table_new(cfg);
        alloc_fail_after(-1);
        route_table_free(t);
    }
    config_free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_found),
        cmocka_unit_test(test_json_absent_invalid),
        cmocka_unit_test(test_glob),
        cmocka_unit_test(test_lookup),
        cmocka_unit_test(test_table_many),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
