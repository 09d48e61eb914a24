/* Unit tests for activator/holdq: tier order, bounds, shedding, deadlines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "holdq.h"

static void test_order(void **state)
{
    (void)state;
    struct holdq q;
    holdq_init(&q, 10, 1000);
    struct holdq_node n[6];
    memset(n, 0, sizeof(n));
    enum tier tiers[6] = {TIER_NORMAL, TIER_LOW, TIER_HIGH, TIER_NORMAL, TIER_HIGH, TIER_LOW};
    for (int i = 0; i < 6; i++) {
        assert_true(holdq_fits(&q, 10));
        holdq_push(&q, &n[i], tiers[i], 10, i, 1000 + i);
    }
    assert_int_equal(q.count, 6);
    assert_int_equal(q.bytes, 60);
    assert_int_equal(q.count_by_tier[TIER_HIGH], 2);
    int want[6] = {2, 4, 0, 3, 1, 5};
    for (int i = 0; i < 6; i++) {
        struct holdq_node *p = holdq_pop(&q);
        assert_ptr_equal(p, &n[want[i]]);
        assert_false(p->queued);
        if (i == 2) {
            /* A released entry that must wait again goes back to its place. */
            holdq_push_front(&q, p);
            assert_ptr_equal(holdq_pop(&q), p);
        }
    }
    assert_null(holdq_pop(&q));
    assert_int_equal(q.count, 0);
    assert_int_equal(q.bytes, 0);
}

static void test_bounds_and_shed(void **state)
{
    (void)state;
    struct holdq q;
    holdq_init(&q, 3, 100);
    struct holdq_node a = {0}, b = {0}, c = {0}, d = {0};
    holdq_push(&q, &a, TIER_LOW, 10, 0, 100);
    holdq_push(&q, &b, TIER_NORMAL, 10, 0, 100);
    holdq_push(&q, &c, TIER_LOW, 10, 0, 100);
    assert_false(holdq_fits(&q, 1)); /* count bound */
    /* A low request cannot shed anything; a normal one sheds the newest low. */
    assert_null(holdq_victim(&q, TIER_LOW, 1));
    assert_ptr_equal(holdq_victim(&q, TIER_NORMAL, 1), &c);
    assert_ptr_equal(holdq_victim(&q, TIER_HIGH, 1), &c);
    holdq_remove(&q, &c);
    holdq_remove(&q, &c); /* second remove is a no-op */
    assert_int_equal(q.count, 2);
    assert_true(holdq_fits(&q, 80));
    assert_false(holdq_fits(&q, 81)); /* byte bound */
    assert_null(holdq_victim(&q, TIER_HIGH, 101)); /* can never fit */
    holdq_push(&q, &d, TIER_HIGH, 80, 0, 100);
    assert_ptr_equal(holdq_victim(&q, TIER_HIGH, 5), &a);
    holdq_remove(&q, &a);
    assert_ptr_equal(holdq_victim(&q, TIER_HIGH, 15), &b);
    assert_null(holdq_victim(&q, TIER_NORMAL, 15)); /* b is not lower than normal */
    holdq_set_limits(&q, 10, 1000);
    assert_true(holdq_fits(&q, 15));
}

static void test_deadlines(void **state)
{
    (void)state;
    struct holdq q;
    holdq_init(&q, 10, 1000);
    assert_int_equal(holdq_next_deadline(&q), INT64_MAX);
    struct holdq_node a = {0}, b = {0}, c = {0};
    holdq_push(&q, &a, TIER_NORMAL, 1, 0, 500);
    holdq_push(&q, &b, TIER_NORMAL, 1, 100, 600);
    holdq_push(&q, &c, TIER_HIGH, 1, 200, 700);
    assert_int_equal(holdq_next_deadline(&q), 500);
    assert_null(holdq_pop_expired(&q, 499));
    assert_ptr_equal(holdq_pop_expired(&q, 500), &a);
    assert_null(holdq_pop_expired(&q, 500));
    assert_int_equal(holdq_next_deadline(&q), 600);
    assert_ptr_equal(holdq_pop_expired(&q, 10000), &c);
    assert_ptr_equal(holdq_pop_expired(&q, 10000), &b);
    assert_null(holdq_pop_expired(&q, 10000));
    assert_int_equal(q.count, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_bounds_and_shed),
        cmocka_unit_test(test_deadlines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
