/* Unit tests for prom_parse_vector: the pure parser of /api/v1/query answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloc.h"
#include "prom_source.h"

#define LABEL "model_name"

struct parsed {
    int rc;
    struct prom_sample *s;
    size_t n;
    char err[256];
};

static struct parsed parse(const char *body)
{
    struct parsed p;
    memset(&p, 0, sizeof(p));
    p.n = 12345; /* must be overwritten */
    p.rc = prom_parse_vector(body, strlen(body), LABEL, &p.s, &p.n, p.err, sizeof(p.err));
    return p;
}

/* Checks a failure: rc -1, nothing returned, err contains `want`. */
static void expect_fail(const char *body, const char *want)
{
    struct parsed p = parse(body);
    if (p.rc != -1 || !strstr(p.err, want))
        print_error("body: %s\nerr: \"%s\" (want substring \"%s\")\n", body, p.err, want);
    assert_int_equal(p.rc, -1);
    assert_null(p.s);
    assert_int_equal(p.n, 0);
    assert_non_null(strstr(p.err, want));
    assert_null(strchr(p.err, '\n'));
}

static double value_of(const struct parsed *p, size_t i) { return p->s[i].value; }

static void test_vector_several_series(void **state)
{
    struct parsed p = parse(
        "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":["
        "{\"metric\":{\"model_name\":\"llama-8b\",\"pod\":\"a\"},\"value\":[1700000000.123,\"4\"]},"
        "{\"metric\":{\"model_name\":\"mistral\"},\"value\":[1700000000,\"0.5\"]},"
        "{\"metric\":{\"model_name\":\"qwen\"},\"value\":[1700000000.5,\"-2e3\"]}]}}");
    assert_int_equal(p.rc, 0);
    assert_int_equal(p.n, 3);
    assert_string_equal(p.s[0].label_value, "llama-8b");
    assert_true(value_of(&p, 0) == 4.0);
    assert_string_equal(p.s[1].label_value, "mistral");
    assert_true(value_of(&p, 1) == 0.5);
    assert_string_equal(p.s[2].label_value, "qwen");
    assert_true(value_of(&p, 2) == 0.0); /* parsed, but a negative rate is no reading */
    assert_true(p.s[2].invalid);
    prom_samples_free(p.s, p.n);
}

static void test_series_without_label_skipped(void **state)
{
    struct parsed p = parse(
        "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":["
        "{\"metric\":{},\"value\":[1,\"9\"]},"
        "{\"metric\":{\"model\":\"x\"},\"value\":[1,\"8\"]},"
        "{\"metric\":{\"model_name\":\"m1\"},\"value\":[1,\"7\"]}]}}");
    assert_int_equal(p.rc, 0);
    assert_int_equal(p.n, 1);
    assert_string_equal(p.s[0].label_value, "m1");
    assert_true(value_of(&p, 0) == 7.0);
    prom_samples_free(p.s, p.n);

    /* Series, none with the label (renamed by relabelling, or dropped by the
     * query): an error, not "no model has traffic". */
    expect_fail("{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":["
                "{\"metric\":{\"model\":\"m1\"},\"value\":[1,\"9\"]},"
                "{\"metric\":{},\"value\":[1,\"2\"]}]}}",
                "2 series, none with the label model_name");
    /* Only {} at 0 (a query's `or vector(0)` when no model has series): none. */
    p = parse("{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":["
              "{\"metric\":{},\"value\":[1,\"0\"]}]}}");
    assert_int_equal(p.rc, 0);
    assert_int_equal(p.n, 0);
    assert_null(p.s);
    /* {} with tokens: the label summed away (`sum(rate(...))` without `by`). */
    expect_fail("{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":["
                "{\"metric\":{},\"value\":[1,\"1234.5\"]}]}}",
                "1 series, none with the label model_name");
}

/* A scalar names no model: an error, not one unlabelled sample. */
static void test_scalar(void **state)
{
    expect_fail(
        "{\"status\":\"success\",\"data\":{\"resultType\":\"scalar\",\"result\":[1700000000.1,\"2\"]}}",
        "resultType scalar has no model_name label");
}

static void test_empty_result(void **state)
{
    struct parsed p =
        parse("{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":[]}}");
    assert_int_equal(p.rc, 0);
    assert_int_equal(p.n, 0);
    assert_null(p.s);
}

static void test_status_error(void **state)
{
    expect_fail("{\"status\":\"error\",\"errorType\":\"bad_data\",\"error\":\"parse error at char 5\"}",
                "status error: bad_data: parse error at char 5");
    /* Missing fields in the envelope still give one line. */
    expect_fail("{\"status\":\"error\"}", "status error: unknown: (no error text)");
    /* Multi-line error text is flattened so err stays one line. */
    expect_fail("{\"status\":\"error\",\"errorType\":\"execution\",\"error\":\"a\\nb\"}",
                "status error: execution: a b");
    expect_fail("{\"status\":\"pending\",\"data\":{}}", "status pending");
    expect_fail("{\"data\":{\"resultType\":\"vector\",\"result\":[]}}", "missing status");
    expect_fail("{\"status\":7}", "missing status");
}

static void test_not_json(void **state)
{
    expect_fail("hello", "invalid JSON at line 1 column");
    expect_fail("", "invalid JSON");
    expect_fail("<html>502 Bad Gateway</html>", "invalid JSON");
    expect_fail("[1,2,3]", "response is not a JSON object");

    /* NULL body with length 0 is an empty body, not a crash. */
    struct prom_sample *s = NULL;
    size_t n = 3;
    char err[128];
    assert_int_equal(prom_parse_vector(NULL, 0, LABEL, &s, &n, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "invalid JSON"));
    assert_int_equal(n, 0);
}

static void test_truncated_json(void **state)
{
    const char *full = "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":["
                       "{\"metric\":{\"model_name\":\"m1\"},\"value\":[1,\"3\"]}]}}";
    size_t len = strlen(full);
    /* Every proper prefix must fail cleanly, never parse as something else. */
    for (size_t cut = 0; cut < len; cut++) {
        struct prom_sample *s = NULL;
        size_t n = 99;
        char err[128] = "";
        int rc = prom_parse_vector(full, cut, LABEL, &s, &n, err, sizeof(err));
        if (rc != -1)
            print_error("prefix of %zu bytes parsed\n", cut);
        assert_int_equal(rc, -1);
        assert_null(s);
        assert_int_equal(n, 0);
        assert_non_null(strstr(err, "invalid JSON"));
    }
    struct parsed p = parse(full);
    assert_int_equal(p.rc, 0);
    prom_samples_free(p.s, p.n);
}

#define VEC_PREFIX "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":["
#define VEC_SUFFIX "]}}"

static void test_wrong_types(void **state)
{
    expect_fail("{\"status\":\"success\"}", "missing data");
    expect_fail("{\"status\":\"success\",\"data\":[]}", "missing data");
    expect_fail("{\"status\":\"success\",\"data\":{\"result\":[]}}", "missing data.resultType");
    expect_fail("{\"status\":\"success\",\"data\":{\"resultType\":5,\"result\":[]}}",
                "missing data.resultType");
    expect_fail("{\"status\":\"success\",\"data\":{\"resultType\":\"vector\"}}",
                "missing data.result");
    expect_fail("{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":{}}}",
                "data.result is not an array");
    expect_fail("{\"status\":\"success\",\"data\":{\"resultType\":\"matrix\",\"result\":[]}}",
                "resultType matrix not supported");
    expect_fail("{\"status\":\"success\",\"data\":{\"resultType\":\"string\",\"result\":[1,\"x\"]}}",
                "resultType string not supported");
    expect_fail(VEC_PREFIX "7" VEC_SUFFIX, "data.result[0] is not an object");
    expect_fail(VEC_PREFIX "{\"value\":[1,\"1\"]}" VEC_SUFFIX,
                "data.result[0].metric is not an object");
    expect_fail(VEC_PREFIX "{\"metric\":\"m\",\"value\":[1,\"1\"]}" VEC_SUFFIX,
                "data.result[0].metric is not an object");
    /* value not an array */
    expect_fail(VEC_PREFIX "{\"metric\":{\"model_name\":\"a\"},\"value\":\"1\"}" VEC_SUFFIX,
                "data.result[0].value: not a [time, \"value\"] pair");
    expect_fail(VEC_PREFIX "{\"metric\":{\"model_name\":\"a\"}}" VEC_SUFFIX,
                "data.result[0].value: not a [time, \"value\"] pair");
    expect_fail(VEC_PREFIX "{\"metric\":{\"model_name\":\"a\"},\"value\":[1,\"1\",2]}" VEC_SUFFIX,
                "data.result[0].value: not a [time, \"value\"] pair");
    expect_fail(VEC_PREFIX "{\"metric\":{\"model_name\":\"a\"},\"value\":[1]}" VEC_SUFFIX,
                "data.result[0].value: not a [time, \"value\"] pair");
    expect_fail(VEC_PREFIX "{\"metric\":{\"model_name\":\"a\"},\"value\":[\"1\",\"1\"]}" VEC_SUFFIX,
                "data.result[0].value: sample time is not a number");
    expect_fail(VEC_PREFIX "{\"metric\":{\"model_name\":\"a\"},\"value\":[1,1]}" VEC_SUFFIX,
                "data.result[0].value: sample value is not a string");
    /* value string not numeric, in several ways */
    static const char *const bad_numbers[] = {"abc", "12abc", "", " 1", "1 ", "\\t1", "--1", "1e"};
    for (size_t i = 0; i < sizeof(bad_numbers) / sizeof(bad_numbers[0]); i++) {
        char body[512];
        snprintf(body, sizeof(body),
                 VEC_PREFIX "{\"metric\":{\"model_name\":\"a\"},\"value\":[1,\"1\"]},"
                            "{\"metric\":{\"model_name\":\"b\"},\"value\":[1,\"%s\"]}" VEC_SUFFIX,
                 bad_numbers[i]);
        expect_fail(body, "data.result[1].value: sample value is not a number");
    }
    /* A broken value fails the answer even in a series we would skip. */
    expect_fail(VEC_PREFIX "{\"metric\":{},\"value\":[1,\"x\"]}" VEC_SUFFIX,
                "data.result[0].value: sample value is not a number");
    /* label present but not a string */
    expect_fail(VEC_PREFIX "{\"metric\":{\"model_name\":3},\"value\":[1,\"1\"]}" VEC_SUFFIX,
                "data.result[0].metric.model_name is not a string");
}

/* A body of `series` series, each named m<i> (with brackets inside the
 * label value when tricky, which must not count). Caller frees. */
static char *many_series(size_t series, bool tricky)
{
    size_t cap = 64 + series * 80;
    char *b = malloc(cap);
    assert_non_null(b);
    size_t o = (size_t)snprintf(b, cap, "%s", VEC_PREFIX);
    for (size_t i = 0; i < series; i++)
        o += (size_t)snprintf(b + o, cap - o, "%s{\"metric\":{\"model_name\":\"m%zu%s\"},"
                              "\"value\":[1,\"1\"]}", i ? "," : "", i, tricky ? "[{\\\"[" : "");
    snprintf(b + o, cap - o, "%s", VEC_SUFFIX);
    return b;
}

/* The parse runs on the event loop: an answer with more series than
 * PROM_MAX_SERIES (or as many bare objects) is refused before any tree is
 * built, whatever its byte size. */
static void test_series_limit(void **state)
{
    char *ok = many_series(PROM_MAX_SERIES, true);
    struct parsed p = parse(ok);
    assert_int_equal(p.rc, 0);
    assert_int_equal(p.n, PROM_MAX_SERIES);
    assert_string_equal(p.s[7].label_value, "m7[{\"[");
    prom_samples_free(p.s, p.n);
    free(ok);

    /* +2: the count leaves room for a warnings list in the envelope. */
    char *over = many_series(PROM_MAX_SERIES + 2, false);
    expect_fail(over, "more than 50000 series");
    free(over);

    /* 4 MB of empty objects: 1.3 M of them. */
    size_t n = 4u << 20;
    char *empties = malloc(n + 1);
    assert_non_null(empties);
    empties[0] = '[';
    for (size_t i = 1; i + 3 < n; i += 3)
        memcpy(empties + i, "{},", 3);
    memcpy(empties + n - 3, "{}]", 3);
    empties[n] = '\0';
    expect_fail(empties, "more than 50000 series");
    /* 4 MB of bare numbers: 2 M values, no container past the root. */
    empties[0] = '[';
    for (size_t i = 1; i + 2 < n; i += 2)
        memcpy(empties + i, "1,", 2);
    memcpy(empties + n - 2, "1]", 2);
    expect_fail(empties, "more than 50000 series");
    free(empties);

    /* Series with PROM_MAX_LABELS labels each, as many as the limit, pass
     * (commas inside label values do not count). */
    size_t cap = 64 + (size_t)PROM_MAX_SERIES * (40 + PROM_MAX_LABELS * 12);
    char *wide = malloc(cap);
    assert_non_null(wide);
    size_t o = (size_t)snprintf(wide, cap, "%s", VEC_PREFIX);
    for (size_t i = 0; i < PROM_MAX_SERIES; i++) {
        o += (size_t)snprintf(wide + o, cap - o, "%s{\"metric\":{\"model_name\":\"m%zu,,\"",
                              i ? "," : "", i);
        for (int l = 1; l < PROM_MAX_LABELS; l++)
            o += (size_t)snprintf(wide + o, cap - o, ",\"l%d\":\"v\"", l);
        o += (size_t)snprintf(wide + o, cap - o, "},\"value\":[1,\"1\"]}");
    }
    snprintf(wide + o, cap - o, "%s", VEC_SUFFIX);
    struct parsed w = parse(wide);
    assert_int_equal(w.rc, 0);
    assert_int_equal(w.n, PROM_MAX_SERIES);
    prom_samples_free(w.s, w.n);
    free(wide);
}

static void test_nan_inf(void **state)
{
    struct parsed p = parse(VEC_PREFIX
                            "{\"metric\":{\"model_name\":\"a\"},\"value\":[1,\"NaN\"]},"
                            "{\"metric\":{\"model_name\":\"b\"},\"value\":[1,\"+Inf\"]},"
                            "{\"metric\":{\"model_name\":\"c\"},\"value\":[1,\"-Inf\"]},"
                            "{\"metric\":{\"model_name\":\"d\"},\"value\":[1,\"5\"]}" VEC_SUFFIX);
    assert_int_equal(p.rc, 0);
    assert_int_equal(p.n, 4);
    assert_true(value_of(&p, 0) == 0.0);
    assert_true(value_of(&p, 1) == 0.0);
    assert_true(value_of(&p, 2) == 0.0);
    assert_true(value_of(&p, 3) == 5.0);
    /* Flagged: 0 here is not a reading (the state keeps the last good rate). */
    assert_true(p.s[0].invalid && p.s[1].invalid && p.s[2].invalid);
    assert_false(p.s[3].invalid);
    prom_samples_free(p.s, p.n);

    p = parse(VEC_PREFIX "{\"metric\":{\"model_name\":\"a\"},\"value\":[1,\"-3\"]}" VEC_SUFFIX);
    assert_int_equal(p.rc, 0);
    assert_true(p.s[0].invalid); /* a rate is never negative */
    assert_true(value_of(&p, 0) == 0.0);
    prom_samples_free(p.s, p.n);

}

static void test_huge_numbers(void **state)
{
    struct parsed p =
        parse(VEC_PREFIX
              "{\"metric\":{\"model_name\":\"max\"},\"value\":[1e300,\"1.7976931348623157e+308\"]},"
              "{\"metric\":{\"model_name\":\"over\"},\"value\":[1,\"1e400\"]},"
              "{\"metric\":{\"model_name\":\"negover\"},\"value\":[1,\"-1e400\"]},"
              "{\"metric\":{\"model_name\":\"tiny\"},\"value\":[1,\"4.9e-324\"]},"
              "{\"metric\":{\"model_name\":\"big\"},\"value\":[1,\"123456789012345678901234567890\"]}"
              VEC_SUFFIX);
    assert_int_equal(p.rc, 0);
    assert_int_equal(p.n, 5);
    assert_true(value_of(&p, 0) == 1.7976931348623157e+308);
    assert_true(value_of(&p, 1) == 0.0); /* overflow is +Inf, reported as 0 */
    assert_true(value_of(&p, 2) == 0.0);
    assert_true(p.s[1].invalid && p.s[2].invalid);
    assert_false(p.s[0].invalid || p.s[3].invalid || p.s[4].invalid);
    assert_true(value_of(&p, 3) > 0.0 && value_of(&p, 3) < 1e-300);
    assert_true(value_of(&p, 4) > 1.2e29 && value_of(&p, 4) < 1.3e29);
    prom_samples_free(p.s, p.n);

    /* A timestamp jansson cannot hold is a JSON error, not a crash. */
    expect_fail(VEC_PREFIX "{\"metric\":{\"model_name\":\"a\"},"
                           "\"value\":[123456789012345678901234567890,\"1\"]}" VEC_SUFFIX,
                "invalid JSON");
    expect_fail(VEC_PREFIX "{\"metric\":{\"model_name\":\"a\"},\"value\":[1e999,\"1\"]}" VEC_SUFFIX,
                "invalid JSON");
}

static void test_duplicate_labels_kept(void **state)
{
    struct parsed p = parse(VEC_PREFIX
                            "{\"metric\":{\"model_name\":\"m\",\"pod\":\"a\"},\"value\":[1,\"2\"]},"
                            "{\"metric\":{\"model_name\":\"m\",\"pod\":\"b\"},\"value\":[1,\"3\"]},"
                            "{\"metric\":{\"model_name\":\"n\"},\"value\":[1,\"1\"]}" VEC_SUFFIX);
    assert_int_equal(p.rc, 0);
    assert_int_equal(p.n, 3);
    double sum_m = 0;
    size_t count_m = 0;
    for (size_t i = 0; i < p.n; i++) {
        if (strcmp(p.s[i].label_value, "m") == 0) {
            sum_m += p.s[i].value;
            count_m++;
        }
    }
    assert_int_equal(count_m, 2);
    assert_true(sum_m == 5.0);
    prom_samples_free(p.s, p.n);
}

static void test_small_err_buffer_and_bad_args(void **state)
{
    struct prom_sample *s = NULL;
    size_t n = 0;
    char err[8];
    memset(err, 'x', sizeof(err));
    const char *body = "{\"status\":\"error\",\"errorType\":\"bad_data\",\"error\":\"long text\"}";
    assert_int_equal(prom_parse_vector(body, strlen(body), LABEL, &s, &n, err, sizeof(err)), -1);
    assert_int_equal(strlen(err), sizeof(err) - 1);
    assert_memory_equal(err, "status ", 7);
    /* No err buffer at all is allowed. */
    assert_int_equal(prom_parse_vector(body, strlen(body), LABEL, &s, &n, NULL, 0), -1);
    /* Bad arguments fail without touching anything. */
    char e2[64];
    assert_int_equal(prom_parse_vector(body, strlen(body), NULL, &s, &n, e2, sizeof(e2)), -1);
    assert_string_equal(e2, "invalid arguments");
    assert_int_equal(prom_parse_vector(body, strlen(body), LABEL, NULL, &n, e2, sizeof(e2)), -1);
    assert_int_equal(prom_parse_vector(NULL, 5, LABEL, &s, &n, e2, sizeof(e2)), -1);
    prom_samples_free(NULL, 3);
}

/* Label values are parsed from a non-NUL-terminated buffer: the length counts. */
static void test_length_not_nul(void **state)
{
    const char *body = VEC_PREFIX "{\"metric\":{\"model_name\":\"a\"},\"value\":[1,\"6\"]}" VEC_SUFFIX "GARBAGE";
    size_t len = strlen(body) - strlen("GARBAGE");
    struct prom_sample *s = NULL;
    size_t n = 0;
    char err[128];
    assert_int_equal(prom_parse_vector(body, len, LABEL, &s, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 1);
    assert_true(s[0].value == 6.0);
    prom_samples_free(s, n);
    assert_int_equal(prom_parse_vector(body, strlen(body), LABEL, &s, &n, err, sizeof(err)), -1);
}

/* Every thaw_* allocation the parser makes is made to fail in turn: each
 * failure must give -1 "out of memory" with nothing leaked (valgrind/ASan
 * check the leak part), and with enough allocations the parse succeeds. */
static void test_alloc_failure(void **state)
{
    const char *vec = VEC_PREFIX "{\"metric\":{\"model_name\":\"a\"},\"value\":[1,\"1\"]},"
                                 "{\"metric\":{},\"value\":[1,\"9\"]},"
                                 "{\"metric\":{\"model_name\":\"b\"},\"value\":[1,\"2\"]},"
                                 "{\"metric\":{\"model_name\":\"c\"},\"value\":[1,\"3\"]}" VEC_SUFFIX;
    const char *bodies[] = {vec};
    const size_t want_n[] = {3};
    const long want_allocs[] = {4}; /* array + one string per kept sample */
    for (size_t b = 0; b < 1; b++) {
        long failures = 0;
        long k;
        for (k = 0; k < 100; k++) {
            struct prom_sample *s = NULL;
            size_t n = 77;
            char err[128] = "";
            alloc_fail_after(k);
            int rc = prom_parse_vector(bodies[b], strlen(bodies[b]), LABEL, &s, &n, err,
                                       sizeof(err));
            alloc_fail_after(-1);
            if (rc == 0) {
                assert_int_equal(n, want_n[b]);
                prom_samples_free(s, n);
                break;
            }
            assert_string_equal(err, "out of memory");
            assert_null(s);
            assert_int_equal(n, 0);
            failures++;
        }
        assert_int_equal(k, want_allocs[b]);
        assert_int_equal(failures, want_allocs[b]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vector_several_series),
        cmocka_unit_test(test_series_without_label_skipped),
        cmocka_unit_test(test_scalar),
        cmocka_unit_test(test_empty_result),
        cmocka_unit_test(test_status_error),
        cmocka_unit_test(test_not_json),
        cmocka_unit_test(test_truncated_json),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_nan_inf),
        cmocka_unit_test(test_huge_numbers),
        cmocka_unit_test(test_duplicate_labels_kept),
        cmocka_unit_test(test_small_err_buffer_and_bad_args),
        cmocka_unit_test(test_length_not_nul),
        cmocka_unit_test(test_alloc_failure),
        cmocka_unit_test(test_series_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
