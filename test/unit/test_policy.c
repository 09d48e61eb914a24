/* policy: the replica formula, stabilization window and fail-safe. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "policy.h"

static const struct policy_params base_params = {
    .target_tokens_per_second = 1000,
    .target_queue_length = 10,
    .activation_token_rate = 0,
    .activation_queue_length = 0,
    .scale_down_window_ms = 0,
};

static struct policy_decision run(const struct policy_params *p, struct policy_state *st,
                                  double rate, double queue, double held, int64_t now)
{
    struct policy_inputs in = {.token_rate = rate, .queue = queue, .held = held};
    struct policy_decision d;
    policy_decide(p, st, &in, now, &d);
    return d;
}

static void test_formula_terms(void **unused)
{
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = run(&base_params, &st, 0, 0, 0, 0);
    assert_int_equal(d.desired, 0);
    assert_false(d.active);
    assert_int_equal(d.reason, POLICY_REASON_IDLE);

    d = run(&base_params, &st, 2500, 0, 0, 1000);
    assert_int_equal(d.desired, 3); /* ceil(2.5) */
    assert_true(d.active);
    assert_int_equal(d.reason, POLICY_REASON_TOKEN_RATE);
    assert_int_equal(d.direction, POLICY_UP);

    d = run(&base_params, &st, 2500, 41, 0, 2000);
    assert_int_equal(d.desired, 5); /* ceil(4.1) beats 3 */
    assert_int_equal(d.reason, POLICY_REASON_QUEUE);

    d = run(&base_params, &st, 0, 0, 7, 3000);
    assert_int_equal(d.desired, 1); /* held requests need exactly one replica */
    assert_int_equal(d.reason, POLICY_REASON_HELD);
    assert_int_equal(d.direction, POLICY_DOWN);
    assert_true(d.active);

    d = run(&base_params, &st, 1000, 0, 0, 4000);
    assert_int_equal(d.desired, 1); /* exactly at target: no extra replica */
    d = run(&base_params, &st, 1000.001, 0, 0, 5000);
    assert_int_equal(d.desired, 2);
}

static void test_activation_thresholds(void **unused)
{
    struct policy_params p = base_params;
    p.activation_token_rate = 50;
    p.activation_queue_length = 5;
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = run(&p, &st, 50, 5, 0, 0);
    assert_false(d.active); /* strictly above the thresholds */
    assert_int_equal(d.desired, 1);
    d = run(&p, &st, 50.5, 0, 0, 1);
    assert_true(d.active);
    d = run(&p, &st, 0, 6, 0, 2);
    assert_true(d.active);
    d = run(&p, &st, 0, 0, 1, 3);
    assert_true(d.active); /* held requests always activate */
}

static void test_garbage_inputs_count_as_zero(void **unused)
{
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = run(&base_params, &st, -5, 0.0 / 0.0, 0, 0);
    assert_int_equal(d.desired, 0);
    d = run(&base_params, &st, 1.0 / 0.0, 0, 0, 1);
    assert_int_equal(d.desired, 0); /* Inf is not a real rate */
    d = run(&base_params, &st, 1e300, 0, 0, 2);
    assert_int_equal(d.desired, POLICY_MAX_REPLICAS);
}

static void test_scale_down_window(void **unused)
{
    struct policy_params p = base_params;
    p.scale_down_window_ms = 60000;
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = run(&p, &st, 5000, 0, 0, 0);
    assert_int_equal(d.desired, 5);
    d = run(&p, &st, 1000, 0, 0, 10000);
    assert_int_equal(d.desired, 5); /* held up inside the window */
    assert_int_equal(d.raw, 1);
    assert_int_equal(d.reason, POLICY_REASON_STABILIZING);
    d = run(&p, &st, 3000, 0, 0, 30000);
    assert_int_equal(d.desired, 5);
    /* The 5 leaves the window after 60 s (plus at most one bucket); the 3 stays. */
    d = run(&p, &st, 0, 0, 0, 62000);
    assert_int_equal(d.desired, 3);
    d = run(&p, &st, 0, 0, 0, 92000);
    assert_int_equal(d.desired, 0);
    assert_int_equal(d.direction, POLICY_DOWN);
    /* Scale-up is never delayed. */
    d = run(&p, &st, 9000, 0, 0, 92001);
    assert_int_equal(d.desired, 9);
}

static void test_stale_sources_never_scale_down(void **unused)
{
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = run(&base_params, &st, 4000, 0, 0, 0);
    assert_int_equal(d.desired, 4);
    assert_true(d.active);
    /* Prometheus fails: the last good value may be anything, even 0. */
    struct policy_inputs in = {.token_rate = 0, .token_rate_stale = true};
    policy_decide(&base_params, &st, &in, 1000, &d);
    assert_int_equal(d.desired, 4);
    assert_true(d.active);
    assert_int_equal(d.reason, POLICY_REASON_STALE_HOLD);
    /* Scale-up still works while stale. */
    in.queue = 100;
    policy_decide(&base_params, &st, &in, 2000, &d);
    assert_int_equal(d.desired, 10);
    /* Recovery: fresh zeros scale down again. */
    struct policy_inputs fresh = {0};
    policy_decide(&base_params, &st, &fresh, 3000, &d);
    assert_int_equal(d.desired, 0);
    assert_false(d.active);
}

static void test_stale_without_history_reports_inputs(void **unused)
{
    struct policy_state st;
    policy_state_init(&st);
    struct policy_inputs in = {.token_rate_stale = true};
    struct policy_decision d;
    policy_decide(&base_params, &st, &in, 0, &d);
    assert_int_equal(d.desired, 0);
    assert_false(d.active);
}

static void test_strings(void **unused)
{
    assert_string_equal(policy_reason_to_str(POLICY_REASON_HELD), "held_requests");
    assert_string_equal(policy_reason_to_str(POLICY_REASON_COUNT), "unknown");
    assert_string_equal(policy_direction_to_str(POLICY_DOWN), "down");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formula_terms),
        cmocka_unit_test(test_activation_thresholds),
        cmocka_unit_test(test_garbage_inputs_count_as_zero),
        cmocka_unit_test(test_scale_down_window),
        cmocka_unit_test(test_stale_sources_never_scale_down),
        cmocka_unit_test(test_stale_without_history_reports_inputs),
        cmocka_unit_test(test_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
