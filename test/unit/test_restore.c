/* restore: the read-back's query text and the floors kept from its answer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "policy.h"
#include "prom_source.h"
#include "restore.h"

static void test_query_text(void **unused)
{
    char q[512];
    assert_int_equal(restore_query(q, sizeof(q), "thaw_scaler_desired_replicas", 180000), 0);
    assert_string_equal(q, "max by (thaw_restore_target) (label_join(last_over_time("
                           "thaw_scaler_desired_replicas[180s]), \"thaw_restore_target\", "
                           "\"/\", \"namespace\", \"scaledobject\", \"model\"))");
    assert_int_equal(
        restore_query(q, sizeof(q), "thaw_scaler_desired_replicas{job=\"thaw-scaler\"}", 90500),
        0);
    assert_non_null(strstr(q, "(thaw_scaler_desired_replicas{job=\"thaw-scaler\"}[90s])"));
    assert_int_equal(restore_query(q, sizeof(q), "x{job=~\"a[bc]\"}", 60000), 0);
    assert_int_equal(restore_query(q, sizeof(q), "ns:x_y", 60000), 0);
    /* Not a selector that takes a range, under a second, or no room. */
    const char *bad[] = {"", "x[5m]", "sum(x)", "x offset 5m", "x{a=\"b\"} or y", "x{a=\"b\"",
                         "9x", "x y", "{a=\"b\"}", "x{}{}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(restore_query(q, sizeof(q), bad[i], 180000), -1);
    assert_int_equal(restore_query(q, sizeof(q), NULL, 180000), -1);
    assert_int_equal(restore_query(q, sizeof(q), "x", 999), -1);
    assert_int_equal(restore_query(q, 40, "thaw_scaler_desired_replicas", 180000), -1);
}

static void test_book_keeps_floors(void **unused)
{
    struct restore_book *b = restore_book_new();
    assert_non_null(b);
    assert_int_equal(restore_book_floor(b, "ns/a/m"), 0); /* empty */
    struct prom_sample s[] = {
        {"ns/a/m", 2.0, false},      {"ns/b/m", 2.0000000001, false}, {"ns/c/org/m", 3.4, false},
        {"ns/big/m", 1e12, false},   {"ns/nan/m", 0, true},           {"ns/low/m", 0.9, false},
        {"ns/zero/m", 0, false},     {"ns/a", 4, false},              {"/x/m", 4, false},
        {"ns//m", 4, false},         {"ns/x/", 4, false},             {NULL, 4, false},
        {"ns/a/m", 5, false},        {"ns/a/m", 1, false},
    };
    size_t skipped = 99;
    assert_int_equal(restore_book_fill(b, s, sizeof(s) / sizeof(s[0]), 0, &skipped), 3);
    assert_int_equal(skipped, 7); /* not ns/low and ns/zero: answers of 0, nothing to hold */
    assert_int_equal(restore_book_floor(b, "ns/a/m"), 5);     /* a repeat: the higher */
    assert_int_equal(restore_book_floor(b, "ns/b/m"), 2);     /* float noise: not 3 */
    assert_int_equal(restore_book_floor(b, "ns/c/org/m"), 4); /* rounded up; a model with '/' */
    assert_int_equal(restore_book_floor(b, "ns/big/m"), 0); /* over any answer: skipped */
    assert_int_equal(restore_book_floor(b, "ns/low/m"), 0);
    assert_int_equal(restore_book_floor(b, "ns/a/other"), 0); /* another model's */
    assert_int_equal(restore_book_count(b), 3);
    struct prom_sample edge[] = {{"ns/max/m", POLICY_MAX_REPLICAS, false},
                                 {"ns/over/m", POLICY_MAX_REPLICAS + 0.5, false}};
    assert_int_equal(restore_book_fill(b, edge, 2, 0, &skipped), 1);
    assert_int_equal(skipped, 1);
    assert_int_equal(restore_book_floor(b, "ns/max/m"), POLICY_MAX_REPLICAS);

    /* A new answer replaces the old; the cap counts floors kept. */
    assert_int_equal(restore_book_fill(b, s + 1, 3, 2, &skipped), 2);
    assert_int_equal(skipped, 1);
    assert_int_equal(restore_book_floor(b, "ns/a/m"), 0);
    assert_int_equal(restore_book_floor(b, "ns/b/m"), 2);
    assert_int_equal(restore_book_floor(b, "ns/big/m"), 0);
    restore_book_clear(b);
    assert_int_equal(restore_book_count(b), 0);
    assert_int_equal(restore_book_fill(b, NULL, 0, 0, &skipped), 0);
    assert_int_equal(restore_book_floor(b, "ns/b/m"), 0);
    restore_book_free(b);
    restore_book_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_query_text),
        cmocka_unit_test(test_book_keeps_floors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
