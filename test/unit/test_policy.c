/* policy: v1 (the replica formula, stabilization window, fail-safe) and
 * the v2 terms (utilisation target, forecast, demand by conservation,
 * backlog, wake sizing, tokens-per-request learning, keep-warm). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

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

/* As run, with the activators' in-flight count known (idleSignal activators). */
static struct policy_decision run_inflight(const struct policy_params *p, struct policy_state *st,
                                           double rate, double queue, double held,
                                           double inflight, int64_t now)
{
    struct policy_inputs in = {.token_rate = rate, .queue = queue, .held = held,
                               .inflight = inflight, .inflight_known = true};
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
    assert_string_equal(policy_reason_to_str(POLICY_REASON_KEEP_WARM), "keep_warm");
    assert_string_equal(policy_reason_to_str(POLICY_REASON_FORECAST), "forecast");
    assert_string_equal(policy_reason_to_str(POLICY_REASON_RESTORED), "restored");
}

/* ---- v1 parameters ------------------------------------------------------ */

static void test_v1_params_are_v1(void **unused)
{
    struct policy_params p;
    policy_params_v1(&p);
    assert_true(p.target_tokens_per_second == 1000);
    assert_true(p.target_queue_length == 10);
    assert_int_equal(p.scale_down_window_ms, 300000);
    assert_true(p.tokens_per_request == 0); /* counts only */
    assert_true(p.keep_warm_cost == 0);
    /* Idle after busy: inactive at once (no keep-warm), window kept. */
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = run(&p, &st, 5000, 0, 0, 1000);
    assert_int_equal(d.desired, 5);
    d = run(&p, &st, 0, 0, 0, 2000);
    assert_false(d.active);
    assert_int_equal(d.desired, 5);
    assert_int_equal(d.reason, POLICY_REASON_STABILIZING);
    /* The queue counts at once, without persistence. */
    d = run(&p, &st, 0, 95, 0, 3000);
    assert_int_equal(d.desired, 10);
}

static void test_defaults_are_sane(void **unused)
{
    struct policy_params p;
    policy_params_defaults(&p);
    assert_true(p.target_utilisation > 0 && p.target_utilisation <= 1);
    assert_true(p.tokens_per_request > 0);
    assert_true(p.cold_start_ms > 0);
    assert_true(p.keep_warm_cost > 0);
    assert_true(p.rate_window_ms > 0);
    assert_true(p.keep_warm_max_ms >= p.cold_start_ms);
}

/* ---- v2 ----------------------------------------------------------------- */

/* A v2 parameter set with round numbers; each test changes what it needs. */
static struct policy_params v2(void)
{
    struct policy_params p;
    policy_params_defaults(&p);
    p.target_tokens_per_second = 100;
    p.target_queue_length = 10;
    p.target_utilisation = 1;
    p.scale_down_window_ms = 0;
    p.bursty_scale_down_window_ms = 0;
    p.surge_hold_ms = 0;
    p.trend_window_ms = 0;
    p.cold_start_ms = 60000;
    p.rate_window_ms = 60000;
    p.queue_window_ms = 10000;
    p.tokens_per_request = 100;
    p.keep_warm_cost = 1;
    p.keep_warm_max_ms = 1800000;
    p.drain_time_factor = 1;
    p.wake_backlog_share = 0;
    p.panic_window_ms = 0;
    p.panic_lookahead = 0;
    p.replica_slots = 0;
    p.wake_request_cost = 0;
    p.burst_cv = 0;
    return p;
}

/* Bursty demand for the tests: 0 and 1200 tokens/s alternating every 20 s
 * (mean 600, cv 1). */
static double burst_rate(int t)
{
    return (t / 20) % 2 ? 1200 : 0;
}

static void test_utilisation_target(void **unused)
{
    struct policy_params p = v2();
    p.target_utilisation = 0.8;
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = run(&p, &st, 100, 0, 0, 0);
    assert_int_equal(d.desired, 2); /* 100 / (100 x 0.8) = 1.25 */
    d = run(&p, &st, 80, 0, 0, 1000);
    assert_int_equal(d.desired, 1);
    /* Out-of-range utilisation counts as 1, not as a division by zero. */
    p.target_utilisation = 0;
    d = run(&p, &st, 100, 0, 0, 2000);
    assert_int_equal(d.desired, 1);
}

/* Steady demand at rate r on replicas of 16 batch slots; the decision at 100 s. */
static struct policy_decision staffed(const struct policy_params *p, double r)
{
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = {0};
    for (int t = 0; t <= 100; t++)
        d = run(p, &st, r, 0, 0, (int64_t)t * 1000);
    return d;
}

static void test_square_root_staffing_when_the_batch_is_known(void **unused)
{
    struct policy_params p = v2();
    p.target_utilisation = 0.5; /* not used for steady demand once S is known */
    p.replica_slots = 16;
    p.staffing_beta = 1;
    /* x replicas of work get x + sqrt(x / 16): 25 % headroom for one replica,
     * 8 % for ten, 6 % for sixteen. */
    assert_int_equal(staffed(&p, 100).desired, 2);   /* 1 + 0.25 */
    assert_int_equal(staffed(&p, 1000).desired, 11); /* 10 + 0.79 */
    assert_int_equal(staffed(&p, 1600).desired, 17); /* 16 + 1 */
    assert_int_equal(staffed(&p, 1500).desired, 16); /* 15 + 0.97 */
    /* /models and the gauge show the share of capacity planned for. */
    struct policy_state st;
    policy_state_init(&st);
    for (int t = 0; t <= 100; t++)
        run(&p, &st, 1600, 0, 0, (int64_t)t * 1000);
    assert_true(fabs(st.utilisation - 16.0 / 17.0) < 1e-9);
    /* beta 0: no headroom at all. */
    struct policy_params none = p;
    none.staffing_beta = 0;
    assert_int_equal(staffed(&none, 1000).desired, 10);
    /* Batch unknown: the utilisation target (1000 / (100 x 0.5)). */
    struct policy_params unknown = p;
    unknown.replica_slots = 0;
    assert_int_equal(staffed(&unknown, 1000).desired, 20);
    /* A flat rate is token_rate, not forecast: the rate's own count has the
     * same headroom. */
    assert_int_equal(staffed(&p, 1000).reason, POLICY_REASON_TOKEN_RATE);
    /* The surge adds to the staffed level: one replica of work (1.25) and a
     * steady queue of 58, 48 over Q cleared in 60 s (0.8): 2.05 -> 3. */
    policy_state_init(&st);
    struct policy_decision d = {0};
    for (int t = 0; t <= 30; t++)
        d = run(&p, &st, 100, 58, 0, (int64_t)t * 1000);
    assert_int_equal(d.desired, 3);
    assert_int_equal(d.reason, POLICY_REASON_QUEUE);
}

/* Bursty demand (coefficient of variation over 5 minutes above burst_cv)
 * is sized with bursty_utilisation; steady demand with target_utilisation;
 * less than a minute of history is never bursty. */
static void test_bursty_demand_uses_its_own_utilisation(void **unused)
{
    struct policy_params p = v2();
    p.target_utilisation = 0.5;
    p.bursty_utilisation = 1;
    p.burst_cv = 0.8;
    struct policy_state steady, bursty, off;
    policy_state_init(&steady);
    policy_state_init(&bursty);
    policy_state_init(&off);
    struct policy_params q = p;
    q.burst_cv = 0; /* off: always target_utilisation */
    struct policy_decision ds = {0}, db = {0}, doff = {0};
    /* After the first rate window (demand not recorded yet), 5 minutes of
     * 400 tokens/s steady, and of 0 / 1200 alternating every 20 s (mean
     * 600, cv 1). */
    for (int t = 0; t <= 425; t++) {
        int64_t now = (int64_t)t * 1000;
        double r = burst_rate(t);
        ds = run(&p, &steady, 400, 0, 0, now);
        db = run(&p, &bursty, r, 0, 0, now);
        doff = run(&q, &off, r, 0, 0, now);
        if (t == 90) {
            /* 30 s of recorded demand: not enough to judge */
            assert_false(bursty.bursty);
            assert_true(bursty.utilisation == 0.5);
        }
    }
    assert_false(steady.bursty);
    assert_true(steady.utilisation == 0.5);
    assert_int_equal(ds.desired, 8); /* 400 / (100 x 0.5) */
    assert_true(bursty.bursty);
    assert_true(bursty.utilisation == 1);
    assert_int_equal(db.desired, 12); /* 1200 / (100 x 1) at t = 425 (in a burst) */
    assert_false(off.bursty);
    assert_int_equal(doff.desired, 24); /* 1200 / (100 x 0.5) */

    /* With the batch size known, steady demand is square-root staffed
     * (4 + sqrt(4 / 16) -> 5) but bursty demand keeps bursty_utilisation. */
    struct policy_params s16 = p;
    s16.replica_slots = 16;
    policy_state_init(&steady);
    policy_state_init(&bursty);
    for (int t = 0; t <= 425; t++) {
        int64_t now = (int64_t)t * 1000;
        double r = burst_rate(t);
        ds = run(&s16, &steady, 400, 0, 0, now);
        db = run(&s16, &bursty, r, 0, 0, now);
    }
    assert_int_equal(ds.desired, 5);
    assert_true(bursty.bursty);
    assert_int_equal(db.desired, 12);
}

/* While the demand is bursty, and for one burst window (5 minutes) after it
 * last was, the level is held over the bursty window; steady demand uses
 * the shorter steady one. The bursty window never shortens a longer steady
 * one. The window used is recorded for /metrics. */
static void test_bursty_demand_holds_its_level_longer(void **unused)
{
    struct policy_params p = v2();
    p.burst_cv = 0.8;
    p.bursty_utilisation = 1;
    p.scale_down_window_ms = 30000;
    p.bursty_scale_down_window_ms = 120000;
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = {0};
    /* 0 / 1200 tokens/s alternating every 20 s (cv 1): bursty. */
    int t = 0;
    for (; t <= 439; t++)
        d = run(&p, &st, burst_rate(t), 0, 0, (int64_t)t * 1000);
    assert_true(st.bursty);
    assert_int_equal(st.down_window_ms, 120000);
    assert_int_equal(d.desired, 12);
    /* In the next lull (demand 0, shorter than the keep-warm time) the
     * burst's 12 is held. */
    for (; t <= 455; t++)
        d = run(&p, &st, 0, 0, 0, (int64_t)t * 1000);
    assert_int_equal(d.desired, 12);
    assert_int_equal(d.reason, POLICY_REASON_STABILIZING);

    /* Then steady 200 tokens/s: the demand stops being bursty once the
     * bursts leave its 5-minute history, yet the bursty window holds for
     * 5 minutes more, so 12 stays until 120 s after the last burst. */
    int64_t last_bursty_ms = -1;
    for (; t <= 1500; t++) {
        d = run(&p, &st, 200, 0, 0, (int64_t)t * 1000);
        if (st.down_window_ms == 120000)
            last_bursty_ms = (int64_t)t * 1000;
        if (t == 555)
            assert_int_equal(d.desired, 12); /* the last burst ended at t = 439 */
        if (t == 565)
            assert_int_equal(d.desired, 2);
    }
    assert_false(st.bursty);
    assert_int_equal(st.down_window_ms, 30000);
    assert_int_equal(d.desired, 2);
    /* The verdict was last bursty somewhere in the mixed history after the
     * steady demand began, and the longer window ended 5 minutes after it. */
    assert_true(last_bursty_ms > 456000);
    assert_true(last_bursty_ms < 1500000);
    assert_int_equal(last_bursty_ms - st.bursty_seen_ms, POLICY_BURST_WINDOW_MS);

    /* Steady demand that falls is scaled down after the steady window (a
     * step of 2x is not bursty: the cv of such a mix stays below 0.35). */
    for (; t <= 1600; t++)
        d = run(&p, &st, 400, 0, 0, (int64_t)t * 1000);
    assert_int_equal(d.desired, 4);
    assert_int_equal(st.down_window_ms, 30000);
    for (; t <= 1640; t++)
        d = run(&p, &st, 200, 0, 0, (int64_t)t * 1000);
    assert_int_equal(d.desired, 2); /* 40 s later: past the 30 s window */
    assert_int_equal(st.down_window_ms, 30000);

    /* A longer steady window is never shortened by the bursty one. */
    struct policy_params q = p;
    q.scale_down_window_ms = 200000;
    policy_state_init(&st);
    for (t = 0; t <= 425; t++)
        d = run(&q, &st, burst_rate(t), 0, 0, (int64_t)t * 1000);
    assert_true(st.bursty);
    assert_int_equal(st.down_window_ms, 200000);

    /* burst_cv 0 (never bursty): the steady window only, so 200 tokens/s
     * after the same bursts is met with 2 replicas 35 s after the last one,
     * where the bursty window (above) still held 12. */
    q = p;
    q.burst_cv = 0;
    policy_state_init(&st);
    for (t = 0; t <= 439; t++)
        d = run(&q, &st, burst_rate(t), 0, 0, (int64_t)t * 1000);
    assert_int_equal(st.down_window_ms, 30000);
    for (; t <= 474; t++)
        d = run(&q, &st, 200, 0, 0, (int64_t)t * 1000);
    assert_int_equal(d.desired, 2);
}

/* A fall of 10x in steady demand is let go after the steady window; when
 * the 5-minute history, half before and half after the fall, later reads as
 * bursty, the longer window must not bring the old level back. */
static void test_a_fall_let_go_stays_gone(void **unused)
{
    struct policy_params p = v2();
    p.burst_cv = 1;
    p.bursty_utilisation = 1;
    p.scale_down_window_ms = 30000;
    p.bursty_scale_down_window_ms = 240000;
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = {0};
    int t = 0;
    for (; t <= 600; t++)
        d = run(&p, &st, 2000, 0, 0, (int64_t)t * 1000);
    assert_int_equal(d.desired, 20);
    bool went_bursty = false;
    for (; t <= 900; t++) {
        d = run(&p, &st, 200, 0, 0, (int64_t)t * 1000);
        went_bursty = went_bursty || st.bursty;
        if (t >= 640) /* past the steady window and a bucket */
            assert_int_equal(d.desired, 2);
    }
    assert_true(went_bursty); /* the mix of 2000 and 200 did read as bursty */
}

static void test_forecast_follows_a_trend(void **unused)
{
    struct policy_params p = v2();
    p.trend_window_ms = 120000;
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = {0};
    /* A clean ramp of 1 token/s per second: 100 -> 400 over 300 s. */
    for (int t = 0; t <= 300; t++)
        d = run(&p, &st, 100 + t, 0, 0, (int64_t)t * 1000);
    /* Rate alone: ceil(400 / 100) = 4; horizon cold start + half the rate
     * window = 90 s adds 90 tokens/s: 5. */
    assert_int_equal(d.desired, 5);
    assert_int_equal(d.reason, POLICY_REASON_FORECAST);
}

static void test_forecast_ignores_noise(void **unused)
{
    struct policy_params p = v2();
    p.trend_window_ms = 120000;
    struct policy_state st;
    policy_state_init(&st);
    /* Bursty traffic around a flat level: the slope's lower confidence
     * bound stays below zero, so nothing is extrapolated. */
    for (int t = 0; t <= 400; t++) {
        double r = (t / 5) % 2 ? 2000 : 0;
        struct policy_decision d = run(&p, &st, r, 0, 0, (int64_t)t * 1000);
        long by_rate = (long)(r / 100);
        assert_true(d.desired <= (by_rate > 1 ? by_rate : 1)); /* 1: kept warm */
        assert_int_not_equal(d.reason, POLICY_REASON_FORECAST);
    }
}

static void test_demand_by_conservation(void **unused)
{
    struct policy_params p = v2();
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = {0};
    /* Saturated: the rate stays at 200 while the queue grows 1 request/s.
     * Demand = 200 + 100 tokens/request x 1/s = 300 -> 3 replicas, plus
     * clearing the backlog above Q within a cold start. */
    for (int t = 0; t <= 70; t++)
        d = run(&p, &st, 200, t, 0, (int64_t)t * 1000);
    assert_int_equal(d.desired, 4);
    assert_int_equal(d.reason, POLICY_REASON_QUEUE);
    /* The same queue growth without a request-size model counts only. */
    struct policy_params v1 = p;
    v1.tokens_per_request = 0;
    policy_state_init(&st);
    for (int t = 0; t <= 70; t++)
        d = run(&v1, &st, 200, t, 0, (int64_t)t * 1000);
    assert_int_equal(d.desired, 7); /* ceil(70 / 10) */
}

static void test_backlog_that_drains_or_bursts_adds_nothing(void **unused)
{
    struct policy_params p = v2();
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = {0};
    /* A burst shorter than the queue window: its requests count as demand
     * over the rate window (they did arrive), but no backlog replicas. */
    for (int t = 0; t < 100; t++) {
        double q = t >= 50 && t < 56 ? 200 : 0;
        d = run(&p, &st, 100, q, 0, (int64_t)t * 1000);
        assert_int_not_equal(d.reason, POLICY_REASON_QUEUE);
    }
    /* A long backlog draining fast (gone well within a cold start). */
    policy_state_init(&st);
    for (int t = 0; t < 40; t++)
        d = run(&p, &st, 100, 400, 0, (int64_t)t * 1000);
    assert_true(d.desired > 1); /* persistent backlog: replicas to clear it */
    for (int t = 40; t < 50; t++)
        d = run(&p, &st, 100, 400 - (t - 39) * 30.0, 0, (int64_t)t * 1000);
    assert_int_equal(d.desired, 1);
}

/* With late requests last in the activators a backlog delays only itself,
 * so it is cleared over late_clear (here 300 s), not drain_time_factor cold
 * starts (60 s); a late_clear shorter than those changes nothing. */
static void test_late_requests_last_clear_the_backlog_slowly(void **unused)
{
    struct policy_params p = v2();
    int64_t late_after[3] = {0, 1000, 1000}, late_clear[3] = {300000, 300000, 30000};
    /* 390 requests over Q, 100 tokens each, 100 tokens/s per replica:
     * 6.5 replicas over 60 s, 1.3 over 300 s; plus 1 for the rate. */
    long want[3] = {8, 3, 8};
    for (int i = 0; i < 3; i++) {
        p.late_after_ms = late_after[i];
        p.late_clear_ms = late_clear[i];
        struct policy_state st;
        policy_state_init(&st);
        struct policy_decision d = {0};
        for (int t = 0; t < 40; t++)
            d = run(&p, &st, 100, 400, 0, (int64_t)t * 1000);
        assert_int_equal(d.desired, want[i]);
        assert_int_equal(d.reason, POLICY_REASON_QUEUE);
    }
}

static void test_wake_sized_by_arrivals(void **unused)
{
    struct policy_params p = v2();
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = {0};
    /* Held requests arriving at 5/s for 20 s, 100 tokens each, 100 tokens/s
     * per replica: 5 replicas for the arrivals. */
    for (int t = 0; t <= 20; t++)
        d = run(&p, &st, 0, 0, 1 + 5 * t, (int64_t)t * 1000);
    assert_int_equal(d.desired, 5);
    assert_int_equal(d.reason, POLICY_REASON_HELD);
    assert_true(d.active);
    /* Clearing the backlog within a cold start as well: the 101 held plus
     * 40 s more at 5/s over 60 s adds 5. */
    p.wake_backlog_share = 1;
    policy_state_init(&st);
    for (int t = 0; t <= 20; t++)
        d = run(&p, &st, 0, 0, 1 + 5 * t, (int64_t)t * 1000);
    assert_int_equal(d.desired, 10);
    /* A burst that ended stops growing: one replica. */
    p.wake_backlog_share = 0;
    policy_state_init(&st);
    for (int t = 0; t <= 30; t++)
        d = run(&p, &st, 0, 0, 50, (int64_t)t * 1000);
    assert_int_equal(d.desired, 1);
}

static void test_released_arrivals_stand_in_for_the_rate(void **unused)
{
    struct policy_params p = v2();
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = {0};
    /* Held requests arriving at 5/s (5 replicas of work), released at 21 s
     * to replicas the rate has not seen yet (0 for the whole minute). */
    for (int t = 0; t <= 20; t++)
        run(&p, &st, 0, 0, 1 + 5 * t, (int64_t)t * 1000);
    for (int t = 21; t <= 80; t++) {
        d = run(&p, &st, 0, 0, 0, (int64_t)t * 1000);
        assert_int_equal(d.desired, 5); /* the arrival rate, for a rate window */
        assert_int_equal(d.reason, POLICY_REASON_HELD);
    }
    /* A rate window after the release, still no rate: back to the level. */
    d = run(&p, &st, 0, 0, 0, 81000);
    assert_int_equal(d.desired, 1);
    /* A burst that had ended before the release leaves nothing to hold. */
    policy_state_init(&st);
    for (int t = 0; t <= 30; t++)
        run(&p, &st, 0, 0, 50, (int64_t)t * 1000);
    d = run(&p, &st, 0, 0, 0, 31000);
    assert_int_equal(d.desired, 1);
}

static void test_tokens_per_request_learned_from_a_wake(void **unused)
{
    struct policy_params p = v2();
    struct policy_state st;
    policy_state_init(&st);
    int64_t t = 0;
    /* A wake holding 10 requests, released with nothing left queued, then
     * 200 tokens/s for 30 s and 100 tokens/s after: the estimate closes one
     * rate window (60 s) after the backlog was gone, 200 x 30 + 100 x 30 =
     * 9000 tokens over 10 requests = 900 tokens per request. The tokens after
     * that window belong to requests that were never held. */
    for (; t <= 5; t++)
        run(&p, &st, 0, 0, 10, t * 1000);
    for (; t < 36; t++)
        run(&p, &st, 200, 0, 0, t * 1000);
    for (; t < 200; t++)
        run(&p, &st, 100, 0, 0, t * 1000);
    struct policy_decision d = run(&p, &st, 0, 0, 0, t * 1000);
    assert_true(d.active); /* idle, kept warm */
    /* Much later a wake with 1 request/s: 1 x 900 / 100 = 9 replicas, where
     * the 100-token prior would give 1 (and counting to the idle, 2x more). */
    int64_t w = 10000;
    for (int k = 0; k <= 20; k++)
        d = run(&p, &st, 0, 0, 1 + k, (w + k) * 1000);
    assert_int_equal(d.desired, 9);
}

/* A wake from 0: 2 requests/s held for 20 s (41 held); returns the time (s)
 * of the next call, the first one after the release. */
static int64_t wake_41_held(const struct policy_params *p, struct policy_state *st)
{
    int64_t t = 0;
    for (; t <= 20; t++)
        run(p, st, 0, 0, 1 + 2 * (double)t, t * 1000);
    return t;
}

static void test_tokens_per_request_counts_arrivals_after_release(void **unused)
{
    struct policy_params p = v2();
    struct policy_state st;
    policy_state_init(&st);
    /* 41 held, released into a queue that takes 10 s to empty while they
     * keep arriving: 41 + 2 x 10 = 61 requests; 122 tokens/s for 70 s =
     * 8540 tokens: 140 per request. */
    int64_t t = wake_41_held(&p, &st);
    for (int k = 0; k < 10; k++, t++)
        run(&p, &st, 122, 40 - 4 * k, 0, t * 1000);
    for (int k = 0; k <= 60; k++, t++)
        run(&p, &st, 122, 0, 0, t * 1000);
    for (; t < 300; t++)
        run(&p, &st, 50, 0, 0, t * 1000);
    /* A wake at 5 requests/s: 5 x 140 / 100 = 7 replicas. */
    struct policy_decision d = {0};
    int64_t w = 10000;
    for (int k = 0; k <= 20; k++)
        d = run(&p, &st, 0, 0, 1 + 5 * k, (w + k) * 1000);
    assert_int_equal(d.desired, 7);
}

static void test_tokens_per_request_not_learned_when_demand_changes_after_release(void **unused)
{
    struct policy_params p = v2();
    struct policy_state st;
    policy_state_init(&st);
    /* The wake of the test above (41 held at 2/s), but a step follows the
     * release: the backlog grows to 300 in 30 s (far more than 41 + 2/s
     * arrived) at 2000 tokens/s, then empties. Charged to the 41 + 2/s
     * requests the episode counts, that would be ~1 800 tokens per request;
     * it is not learned, and the prior (100) stays. */
    int64_t t = wake_41_held(&p, &st);
    for (int k = 0; k < 30; k++, t++)
        run(&p, &st, 2000, 41 + 9 * k, 0, t * 1000);
    for (int k = 0; k < 30; k++, t++)
        run(&p, &st, 2000, 300 - 10 * k, 0, t * 1000);
    for (int k = 0; k <= 70; k++, t++)
        run(&p, &st, 2000, 0, 0, t * 1000);
    assert_int_equal(st.nkappa, 0);
    assert_true(policy_tokens_per_request(&p, &st) == p.tokens_per_request);
    /* The same wake with the backlog draining as counted teaches: the
     * backlog may grow a little (Poisson noise: 41 + 2/s x 5 s = 51, plus
     * 3 x sqrt(51) + 5, about 77) without losing the episode. */
    policy_state_init(&st);
    t = wake_41_held(&p, &st);
    for (int k = 0; k < 5; k++, t++)
        run(&p, &st, 122, 41 + 6 * k, 0, t * 1000);
    for (int k = 0; k < 10; k++, t++)
        run(&p, &st, 122, 65 - 6 * k, 0, t * 1000);
    for (int k = 0; k <= 70; k++, t++)
        run(&p, &st, 122, 0, 0, t * 1000);
    assert_int_equal(st.nkappa, 1);
    assert_true(policy_tokens_per_request(&p, &st) != p.tokens_per_request);
}

/* A wake episode: `held` requests held for 6 s from t, then `rate` tokens/s
 * until the estimate closes a rate window after the release (61 calls of
 * 1 s: 61 x rate tokens), then idle. */
static void episode(const struct policy_params *p, struct policy_state *st, int64_t t,
                    double held, double rate)
{
    for (int k = 0; k <= 5; k++)
        run(p, st, 0, 0, held, (t + k) * 1000);
    for (int k = 6; k <= 70; k++)
        run(p, st, rate, 0, 0, (t + k) * 1000);
    for (int k = 71; k < 200; k++)
        run(p, st, 0, 0, 0, (t + k) * 1000);
}

static void test_tokens_per_request_pools_episodes_without_outliers(void **unused)
{
    struct policy_params p = v2();
    struct policy_state st;
    policy_state_init(&st);
    /* Two small episodes of 3 requests at ~100 tokens each, a large one of
     * 30 requests at ~250 and an outlier of 3 requests at ~2000 (a second
     * burst's tokens). Per 61/60: the median of the four is 175, the
     * request-weighted median 254; the totals without the outlier (more than
     * 3x the weighted median) give (300 + 300 + 7500) / 36 = 225; with it
     * 361.5. */
    episode(&p, &st, 0, 3, 5);
    episode(&p, &st, 200, 3, 5);
    episode(&p, &st, 400, 30, 125);
    episode(&p, &st, 600, 3, 100);
    assert_int_equal(st.nkappa, 4);
    /* A wake at 1 request/s: 229 / 100 -> 3 replicas (the median: 2; the
     * totals with the outlier: 4). */
    struct policy_decision d = {0};
    for (int k = 0; k <= 20; k++)
        d = run(&p, &st, 0, 0, 1 + k, (10000 + k) * 1000);
    assert_int_equal(d.desired, 3);
}

static void test_tokens_per_request_two_episodes_and_broken_totals(void **unused)
{
    struct policy_params p = v2();
    struct policy_state st;
    policy_state_init(&st);
    /* Two episodes: 30 requests at ~250 tokens and an outlier of 3 at
     * ~2000. An unweighted median (their mean, 1 140) would keep the outlier
     * and drop the good one; weighted by requests the centre is 254 and the
     * outlier goes: a wake at 1 request/s gets 3 replicas, not 19. */
    episode(&p, &st, 0, 30, 125);
    episode(&p, &st, 200, 3, 100);
    struct policy_decision d = {0};
    for (int k = 0; k <= 20; k++)
        d = run(&p, &st, 0, 0, 1 + k, (10000 + k) * 1000);
    assert_int_equal(d.desired, 3);

    /* A broken source's finite but absurd rate (1e306 tokens/s) in three
     * episodes: their totals overflow. The prior stands in, so a steady
     * 5 000 tokens/s still gets its 50 replicas (an infinite kappa made the
     * demand NaN and the level 0). */
    policy_state_init(&st);
    for (int i = 0; i < 3; i++)
        episode(&p, &st, 200 * i, 3, 1e306);
    for (int k = 0; k < 120; k++)
        d = run(&p, &st, 5000, 0, 0, (1000 + k) * 1000);
    assert_int_equal(d.desired, 50);
}

/* A token-rate source unrelated to the held requests (1e6 tokens/s after
 * wakes of 3 requests: ~2e7 tokens per request against a prior of 100)
 * teaches nothing: the next wake is sized as with no episode at all (with
 * the episodes learned it asked for the maximum). A plausible episode (~250
 * against 100) still counts. */
static void test_tokens_per_request_ignores_implausible_episodes(void **unused)
{
    struct policy_params p = v2();
    struct policy_state fresh, st;
    policy_state_init(&fresh);
    policy_state_init(&st);
    for (int i = 0; i < 3; i++)
        episode(&p, &st, 200 * i, 3, 1e6);
    assert_int_equal(st.nkappa, 0);
    struct policy_decision d = {0}, want = {0};
    for (int k = 0; k <= 20; k++) {
        d = run(&p, &st, 0, 0, 1 + k, (10000 + k) * 1000);
        want = run(&p, &fresh, 0, 0, 1 + k, (10000 + k) * 1000);
    }
    assert_int_equal(d.desired, want.desired);
    assert_true(d.desired <= 2);

    /* Nor does one as far below: 3 requests and ~0.007 tokens in all
     * (1e-4 tokens/s), ~2e-3 per request against 100. */
    policy_state_init(&st);
    episode(&p, &st, 0, 3, 1e-4);
    assert_int_equal(st.nkappa, 0);

    policy_state_init(&st);
    episode(&p, &st, 0, 30, 125);
    assert_int_equal(st.nkappa, 1);
}

/* A wake holding `held` requests from t for 6 s, then their tokens at 300/s
 * until the rate window after the release is over; idle at t + 66 with 3
 * replicas. Returns the decision when going idle. */
static struct policy_decision wake_then_idle(const struct policy_params *p, struct policy_state *st,
                                             int64_t t, double held)
{
    for (int k = 0; k <= 5; k++)
        run(p, st, 0, 0, held, (t + k) * 1000);
    for (int k = 6; k <= 65; k++)
        run(p, st, 300, 0, 0, (t + k) * 1000);
    return run(p, st, 0, 0, 0, (t + 66) * 1000);
}

static void test_keep_warm_counts_held_requests(void **unused)
{
    struct policy_params p = v2();
    p.wake_request_cost = 2; /* GPU-seconds per held request */
    struct policy_state st;
    policy_state_init(&st);
    /* Wakes holding 30 requests each, 3 replicas when going idle, idle gaps
     * of 100 s: K = 60 s + 2 s x 30 / 3 = 80 s < 100 s, so going cold
     * at once is cheaper... */
    int64_t t = 0;
    for (int i = 0; i < 4; i++, t += 166)
        wake_then_idle(&p, &st, t, 30);
    assert_int_equal(st.idle_replicas, 3);
    struct policy_decision d = wake_then_idle(&p, &st, t, 30);
    d = run(&p, &st, 0, 0, 0, (t + 67) * 1000);
    assert_false(d.active);
    /* ... but with wakes holding 90 requests K = 120 s > 100 s: keep warm
     * over the gaps. */
    policy_state_init(&st);
    for (t = 0; t < 4 * 166; t += 166)
        wake_then_idle(&p, &st, t, 90);
    wake_then_idle(&p, &st, t, 90);
    d = run(&p, &st, 0, 0, 0, (t + 67) * 1000);
    assert_true(d.active);
    d = run(&p, &st, 0, 0, 0, (t + 66 + 99) * 1000);
    assert_true(d.active);
    d = run(&p, &st, 0, 0, 0, (t + 66 + 110) * 1000);
    assert_false(d.active); /* just over the gaps seen, not for ever */
    /* Without the request cost the same wakes go cold at once. */
    p.wake_request_cost = 0;
    policy_state_init(&st);
    for (t = 0; t < 4 * 166; t += 166)
        wake_then_idle(&p, &st, t, 90);
    wake_then_idle(&p, &st, t, 90);
    d = run(&p, &st, 0, 0, 0, (t + 67) * 1000);
    assert_false(d.active);
}

static void test_released_backlog_stays_busy_for_a_rate_window(void **unused)
{
    struct policy_params p = v2();
    p.keep_warm_cost = 0.1; /* K = 6 s: goes cold soon after going idle */
    struct policy_state st;
    policy_state_init(&st);
    /* A wake holds 20 requests for 10 s; they are released to the replicas
     * at 10 s. The rate shows their tokens only a rate window (60 s) later:
     * until then nothing says busy but the backlog just seen. */
    for (int t = 0; t < 10; t++)
        run(&p, &st, 0, 0, 20, (int64_t)t * 1000);
    struct policy_decision d = {0};
    for (int t = 10; t < 69; t++) {
        d = run(&p, &st, 0, 0, 0, (int64_t)t * 1000);
        assert_true(d.active);
    }
    assert_int_equal(st.ngaps, 0); /* no false idle gap learned */
    /* A rate window after the last held request, still nothing: idle, and
     * after K not active. */
    for (int t = 69; t < 80; t++)
        d = run(&p, &st, 0, 0, 0, (int64_t)t * 1000);
    assert_false(d.active);
    /* Queued requests count too (a queue handed to replicas at once): still
     * busy 30 s later, where K (6 s) would have run out. */
    policy_state_init(&st);
    run(&p, &st, 0, 5, 0, 0);
    for (int t = 1; t <= 30; t++)
        d = run(&p, &st, 0, 0, 0, (int64_t)t * 1000);
    assert_true(d.active);
    assert_int_equal(st.ngaps, 0);
    /* v1 has no rate window: inactive as soon as the inputs are. */
    struct policy_params v1;
    policy_params_v1(&v1);
    policy_state_init(&st);
    run(&v1, &st, 0, 5, 0, 0);
    d = run(&v1, &st, 0, 0, 0, 1000);
    assert_false(d.active);
}

static void test_idle_by_activators(void **unused)
{
    struct policy_params p = v2();
    p.keep_warm_cost = 0.1; /* K = 6 s */
    struct policy_state st;
    policy_state_init(&st);
    /* Busy while requests are in flight; when the last one ends the rate
     * still shows a window of tokens, but the model is idle once nothing has
     * been carried for POLICY_ACTIVATORS_IDLE_MS (2 s) and goes cold K later. */
    p.idle_by_activators = true;
    struct policy_decision d = {0};
    for (int t = 0; t < 30; t++) {
        d = run_inflight(&p, &st, 300, 0, 0, 4, (int64_t)t * 1000);
        assert_true(d.active);
    }
    assert_int_equal(d.desired, 3);
    /* One read of 0 between requests is not idle. */
    run_inflight(&p, &st, 300, 0, 0, 0, 30000);
    run_inflight(&p, &st, 300, 0, 0, 0, 30900);
    assert_true(st.busy);
    d = run_inflight(&p, &st, 300, 0, 0, 2, 32000);
    assert_int_equal(st.ngaps, 0); /* no idle moment, no gap */
    for (int t = 33; t < 38; t++)
        d = run_inflight(&p, &st, 300, 0, 0, 0, (int64_t)t * 1000);
    assert_false(st.busy); /* idle since 34 s */
    assert_true(d.active); /* kept warm */
    for (int t = 38; t <= 41; t++)
        d = run_inflight(&p, &st, 300, 0, 0, 0, (int64_t)t * 1000);
    assert_false(d.active); /* 34 s + K */
    assert_int_equal(d.desired, 0);
    /* A queue or held requests still count without anything in flight. */
    d = run_inflight(&p, &st, 0, 5, 0, 0, 38000);
    assert_true(d.active);
    policy_state_init(&st);
    d = run_inflight(&p, &st, 0, 0, 3, 0, 0);
    assert_true(d.active);

    /* Off (the default), or with the count unknown or its source failing:
     * the rate decides, so the same inputs keep the model busy. */
    struct policy_params off = p;
    off.idle_by_activators = false;
    policy_state_init(&st);
    for (int t = 0; t <= 40; t++)
        d = run_inflight(&off, &st, 300, 0, 0, t < 30 ? 4 : 0, (int64_t)t * 1000);
    assert_true(d.active);
    assert_int_equal(d.desired, 3);
    policy_state_init(&st);
    for (int t = 0; t <= 40; t++)
        d = run(&p, &st, 300, 0, 0, (int64_t)t * 1000);
    assert_true(d.active);
    policy_state_init(&st);
    for (int t = 0; t <= 40; t++) {
        struct policy_inputs in = {.token_rate = 300, .inflight = 0, .inflight_known = true,
                                   .held_stale = t >= 30};
        policy_decide(&p, &st, &in, (int64_t)t * 1000, &d);
    }
    assert_true(d.active);
}

/* Tokens the activators do not carry (clients calling the model servers
 * directly, or the activators' fields lost with Redis's data): once the rate
 * has outlived its window and the scrape lag, the rate decides again, rather
 * than keeping a model with traffic at zero. A stale rate (a model at zero
 * whose series are gone keeps its last one) never does. */
static void test_idle_by_activators_unseen_traffic(void **unused)
{
    struct policy_params p = v2();
    p.keep_warm_cost = 0.1; /* K = 6 s */
    p.idle_by_activators = true;
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = {0};
    int t = 0;
    for (; t < 10; t++)
        d = run_inflight(&p, &st, 300, 0, 0, 4, (int64_t)t * 1000);
    assert_int_equal(d.desired, 3);
    /* The activators carry nothing from 10 s on; the rate stays at 300. */
    for (; t < 60; t++)
        d = run_inflight(&p, &st, 300, 0, 0, 0, (int64_t)t * 1000);
    assert_false(d.active); /* the activators' word, within the rate's lag */
    int64_t unseen_at = 9000 + p.rate_window_ms + POLICY_ACTIVATORS_DISAGREE_MS;
    for (; (int64_t)t * 1000 <= unseen_at; t++)
        d = run_inflight(&p, &st, 300, 0, 0, 0, (int64_t)t * 1000);
    assert_false(d.active);
    d = run_inflight(&p, &st, 300, 0, 0, 0, (int64_t)t * 1000);
    assert_true(d.active);
    assert_int_equal(d.desired, 3);

    /* The same with the rate stale: the activators' idle stands. */
    policy_state_init(&st);
    for (t = 0; t < 10; t++)
        d = run_inflight(&p, &st, 300, 0, 0, 4, (int64_t)t * 1000);
    for (; t < 200; t++) {
        struct policy_inputs in = {.token_rate = 300, .inflight = 0, .inflight_known = true,
                                   .token_rate_stale = t >= 20};
        policy_decide(&p, &st, &in, (int64_t)t * 1000, &d);
    }
    assert_false(d.active);

    /* Never carried anything since the scaler started: counted from there. */
    policy_state_init(&st);
    for (t = 0; t <= 95; t++)
        d = run_inflight(&p, &st, 300, 0, 0, 0, (int64_t)t * 1000);
    assert_true(d.active);
    assert_int_equal(d.desired, 3);
}

static void test_idle_by_activators_still_learns_tokens_per_request(void **unused)
{
    struct policy_params p = v2();
    p.idle_by_activators = true;
    p.keep_warm_cost = 0.1;
    struct policy_state st;
    policy_state_init(&st);
    /* A wake holds 10 requests for 6 s; released, they run for 4 s and the
     * model is idle at 10 s. The rate shows their 200 tokens/s from 6 s to
     * 36 s: 6000 tokens, 600 per request. The episode runs on past the idle
     * moment to its rate window, or it would teach nothing. */
    int t = 0;
    for (; t <= 5; t++)
        run_inflight(&p, &st, 0, 0, 10, 10, (int64_t)t * 1000);
    for (; t < 36; t++)
        run_inflight(&p, &st, 200, 0, 0, t < 10 ? 10 : 0, (int64_t)t * 1000);
    assert_false(st.busy); /* idle since 12 s, before the rate window closed */
    for (; t < 200; t++)
        run_inflight(&p, &st, 0, 0, 0, 0, (int64_t)t * 1000);
    /* A later wake at 1 request/s: 1 x 600 / 100 = 6 replicas (the prior of
     * 100 tokens would give 1). */
    struct policy_decision d = {0};
    int64_t w = 10000;
    for (int k = 0; k <= 20; k++)
        d = run_inflight(&p, &st, 0, 0, 1 + k, 1 + k, (w + k) * 1000);
    assert_int_equal(d.desired, 6);
}

static void test_keep_warm_break_even(void **unused)
{
    struct policy_params p = v2();
    struct policy_state st;
    policy_state_init(&st);
    /* No gap seen yet: keep warm for one cold start (K = 60 s). */
    run(&p, &st, 100, 0, 0, 0);
    struct policy_decision d = run(&p, &st, 0, 0, 0, 1000);
    assert_true(d.active);
    assert_int_equal(d.desired, 1);
    assert_int_equal(d.reason, POLICY_REASON_KEEP_WARM);
    d = run(&p, &st, 0, 0, 0, 60999);
    assert_true(d.active);
    d = run(&p, &st, 0, 0, 0, 61001);
    assert_false(d.active);
    assert_int_equal(d.desired, 0);

    /* Gaps of 200 s, longer than K: going cold at once is cheaper. */
    policy_state_init(&st);
    int64_t t = 0;
    for (int i = 0; i < 6; i++) {
        run(&p, &st, 100, 0, 0, t);
        run(&p, &st, 0, 0, 0, t + 5000);
        t += 205000;
    }
    run(&p, &st, 100, 0, 0, t);
    d = run(&p, &st, 0, 0, 0, t + 1000);
    assert_false(d.active);

    /* Gaps of 30 s: keep warm just over them. */
    policy_state_init(&st);
    t = 0;
    for (int i = 0; i < 6; i++) {
        run(&p, &st, 100, 0, 0, t);
        run(&p, &st, 0, 0, 0, t + 5000);
        t += 35000;
    }
    run(&p, &st, 100, 0, 0, t);
    run(&p, &st, 0, 0, 0, t + 1000);
    d = run(&p, &st, 0, 0, 0, t + 30000);
    assert_true(d.active);
    d = run(&p, &st, 0, 0, 0, t + 32000);
    assert_false(d.active); /* the shortest T covering every gap, not the cap */
}

static void test_zero_forgets_the_windows(void **unused)
{
    struct policy_params p = v2();
    p.scale_down_window_ms = 300000;
    p.keep_warm_cost = 0.1; /* keep warm 6 s */
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = run(&p, &st, 1000, 0, 0, 0);
    assert_int_equal(d.desired, 10);
    d = run(&p, &st, 0, 0, 0, 1000);
    assert_int_equal(d.desired, 10); /* held by the window while warm */
    d = run(&p, &st, 0, 0, 0, 10000);
    assert_false(d.active);
    assert_int_equal(d.desired, 0);
    /* The step to zero is idle's (dashboards count scale-to-zero by reason),
     * not the window's that held 10 until then. */
    assert_int_equal(d.reason, POLICY_REASON_IDLE);
    assert_int_equal(d.direction, POLICY_DOWN);
    /* A wake later starts from the wake term, not from the old 10. */
    d = run(&p, &st, 0, 0, 1, 20000);
    assert_true(d.active);
    assert_int_equal(d.desired, 1);
}

static void test_v2_stale_hold(void **unused)
{
    struct policy_params p = v2();
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = run(&p, &st, 500, 0, 0, 0);
    assert_int_equal(d.desired, 5);
    struct policy_inputs in = {.token_rate_stale = true};
    policy_decide(&p, &st, &in, 100000, &d);
    assert_int_equal(d.desired, 5); /* not even keep-warm expiry goes down */
    assert_true(d.active);
    assert_int_equal(d.reason, POLICY_REASON_STALE_HOLD);
}

/* A floor read back after a restart holds the replicas a busy model had
 * until its time is up, then the demand decides again. */
static void test_restore_floor_holds_until_its_time(void **unused)
{
    struct policy_params p = v2();
    struct policy_state st;
    policy_state_init(&st);
    policy_state_restore(&st, 6, 30000);
    struct policy_decision d = run(&p, &st, 150, 0, 0, 0); /* the demand asks for 2 */
    assert_int_equal(d.desired, 6);
    assert_int_equal(d.raw, 2);
    assert_true(d.active);
    assert_int_equal(d.reason, POLICY_REASON_RESTORED);
    d = run(&p, &st, 150, 0, 0, 29999);
    assert_int_equal(d.desired, 6);
    d = run(&p, &st, 750, 0, 0, 29999); /* more demand than the floor: the demand */
    assert_int_equal(d.desired, 8);
    assert_int_equal(d.reason, POLICY_REASON_TOKEN_RATE);
    d = run(&p, &st, 150, 0, 0, 30000);
    assert_int_equal(d.desired, 2);
    assert_int_equal(d.reason, POLICY_REASON_TOKEN_RATE);
    assert_int_equal(d.direction, POLICY_DOWN);
    /* Once let go it stays gone. */
    d = run(&p, &st, 150, 0, 0, 31000);
    assert_int_equal(d.desired, 2);
}

/* A model idle since the restart stays active at the floor until its time
 * (the replicas are up; the lost keep-warm would have decided); one seen
 * busy and then idle goes to zero as it would have without a restart. */
static void test_restore_floor_and_idle(void **unused)
{
    struct policy_params p = v2();
    struct policy_state st;
    policy_state_init(&st);
    policy_state_restore(&st, 3, 20000);
    struct policy_decision d = run(&p, &st, 0, 0, 0, 0);
    assert_int_equal(d.desired, 3);
    assert_true(d.active);
    assert_int_equal(d.reason, POLICY_REASON_RESTORED);
    d = run(&p, &st, 0, 0, 0, 20000);
    assert_int_equal(d.desired, 0);
    assert_false(d.active);
    assert_int_equal(d.reason, POLICY_REASON_IDLE);

    p.keep_warm_max_ms = 0; /* idle means zero at once */
    policy_state_init(&st);
    policy_state_restore(&st, 3, 20000);
    d = run(&p, &st, 150, 0, 0, 0);
    assert_int_equal(d.desired, 3);
    d = run(&p, &st, 0, 0, 0, 5000);
    assert_int_equal(d.desired, 0);
    assert_false(d.active);
    d = run(&p, &st, 150, 0, 0, 6000); /* busy again: the floor is gone */
    assert_int_equal(d.desired, 2);
}

/* With counts only (v1) an idle model's window holds an answer while it is
 * inactive, and that answer is what gets read back: the floor holds the
 * count, not activity. */
static void test_restore_floor_counts_only(void **unused)
{
    struct policy_params p;
    policy_params_v1(&p);
    p.target_tokens_per_second = 100;
    p.target_queue_length = 10;
    struct policy_state st;
    policy_state_init(&st);
    policy_state_restore(&st, 3, 20000);
    struct policy_decision d = run(&p, &st, 0, 0, 0, 0);
    assert_int_equal(d.desired, 3);
    assert_false(d.active);
    d = run(&p, &st, 150, 0, 0, 1000);
    assert_int_equal(d.desired, 3);
    assert_true(d.active);
    d = run(&p, &st, 0, 0, 0, 2000); /* busy, then idle: v1 keeps its count */
    assert_false(d.active);
    assert_int_equal(d.desired, 3);
    d = run(&p, &st, 150, 0, 0, 20000);
    assert_int_equal(d.desired, 2);
}

/* Nothing to restore, or a time already past, leaves the state alone; the
 * fail-safe still never goes below the restored answer. */
static void test_restore_floor_edges(void **unused)
{
    struct policy_params p = v2();
    struct policy_state st;
    policy_state_init(&st);
    policy_state_restore(&st, 0, 20000);
    struct policy_decision d = run(&p, &st, 150, 0, 0, 0);
    assert_int_equal(d.desired, 2);
    policy_state_restore(&st, 5, 0); /* not after the last decision */
    d = run(&p, &st, 150, 0, 0, 1000);
    assert_int_equal(d.desired, 2);
    policy_state_restore(&st, POLICY_MAX_REPLICAS + 5L, 10000);
    d = run(&p, &st, 150, 0, 0, 2000);
    assert_int_equal(d.desired, POLICY_MAX_REPLICAS);
    struct policy_inputs in = {.token_rate_stale = true};
    policy_decide(&p, &st, &in, 12000, &d);
    assert_int_equal(d.desired, POLICY_MAX_REPLICAS);
    assert_int_equal(d.reason, POLICY_REASON_STALE_HOLD);
}

/* A backlog above Q growing 2 requests/s from t0 with one replica's worth
 * of rate; returns the decision at t0 + at_s. */
static struct policy_decision overload(const struct policy_params *p, struct policy_state *st,
                                       int64_t t0, int at_s)
{
    struct policy_decision d = {0};
    for (int t = 0; t <= at_s; t++)
        d = run(p, st, 100, 11 + 2.0 * t, 0, (t0 + t) * 1000);
    return d;
}

/* v2 with a 40 s queue window and a 10 s panic window. */
static struct policy_params panicky(void)
{
    struct policy_params p = v2();
    p.queue_window_ms = 40000;
    p.panic_window_ms = 10000;
    return p;
}

/* An empty queue from `from` to `to` seconds, one replica's worth of rate. */
static void calm(const struct policy_params *p, struct policy_state *st, int64_t from, int64_t to)
{
    for (int64_t t = from; t < to; t++)
        run(p, st, 100, 0, 0, t * 1000);
}

static void test_panic_on_new_overloads_only(void **unused)
{
    struct policy_params p = panicky();
    struct policy_state st;
    policy_state_init(&st);
    calm(&p, &st, 0, 100);
    /* Nothing like it seen before: after the panic window the growth counts
     * (demand 100 + 100 x 2 = 300 tokens/s), long before the queue window. */
    struct policy_decision d = overload(&p, &st, 100, 14);
    assert_true(d.desired >= 3);
    assert_int_equal(d.reason, POLICY_REASON_QUEUE);
    /* Without panic the same overload only counts after the queue window. */
    struct policy_params off = p;
    off.panic_window_ms = 0;
    struct policy_state st2;
    policy_state_init(&st2);
    calm(&off, &st2, 0, 100);
    d = overload(&off, &st2, 100, 14);
    assert_true(d.desired <= 2);

    /* Overloads that all ended after 20 s, far shorter than a cold start:
     * the next one is a burst like them until it outlasts them. */
    policy_state_init(&st);
    int64_t t0 = 0;
    for (int i = 0; i < 6; i++, t0 += 200) {
        calm(&p, &st, t0, t0 + 100);
        overload(&p, &st, t0 + 100, 20);
        run(&p, &st, 100, 0, 0, (t0 + 121) * 1000); /* over after 21 s */
    }
    calm(&p, &st, t0, t0 + 100);
    d = overload(&p, &st, t0 + 100, 14);
    assert_true(d.desired <= 2); /* like the bursts: no replicas */
    for (int t = 15; t <= 26; t++)
        d = run(&p, &st, 100, 11 + 2.0 * t, 0, (t0 + 100 + t) * 1000);
    assert_true(d.desired >= 3); /* longer than every burst seen: panic */
}

static void test_panic_holds_until_the_overload_ends(void **unused)
{
    struct policy_params p = panicky();
    struct policy_state st;
    policy_state_init(&st);
    /* One overload that lasted 80 s: a new one that has lasted 10 s is
     * likely to go on for another cold start (60 s), so it panics. */
    calm(&p, &st, 0, 100);
    overload(&p, &st, 100, 79);
    calm(&p, &st, 180, 300);
    struct policy_decision d = overload(&p, &st, 300, 10);
    assert_true(d.desired >= 3);
    /* At 25 s the history alone would call it off (80 s is not 25 s plus a
     * cold start); the panic holds until this overload ends. Without it
     * only the level would count (2) until the queue window (40 s). */
    for (int t = 11; t <= 25; t++)
        d = run(&p, &st, 100, 11 + 2.0 * t, 0, (300 + t) * 1000);
    assert_true(d.desired >= 3);
    assert_int_equal(d.reason, POLICY_REASON_QUEUE);
    assert_true(st.over_panic);
    /* When the overload ends the next one decides afresh. */
    calm(&p, &st, 326, 330);
    assert_false(st.over_panic);
}

static void test_no_panic_while_bursty(void **unused)
{
    struct policy_params p = panicky();
    p.burst_cv = 0.8;
    p.bursty_utilisation = 1;
    struct policy_params steady = p;
    steady.burst_cv = 0;
    struct policy_state b, s;
    policy_state_init(&b);
    policy_state_init(&s);
    /* Five minutes of 0 / 1200 tokens/s alternating every 20 s (cv 1). */
    for (int t = 0; t <= 425; t++) {
        double r = burst_rate(t);
        run(&p, &b, r, 0, 0, (int64_t)t * 1000);
        run(&steady, &s, r, 0, 0, (int64_t)t * 1000);
    }
    assert_true(b.bursty);
    struct policy_decision db = overload(&p, &b, 426, 14);
    struct policy_decision ds = overload(&steady, &s, 426, 14);
    assert_true(b.bursty);
    assert_true(db.desired <= 2);     /* the level only, until the queue window */
    assert_true(ds.desired >= 3);     /* the same overload panics when not bursty */
    assert_int_equal(ds.reason, POLICY_REASON_QUEUE);
}

static void test_panic_clears_the_growth_until_its_replicas_arrive(void **unused)
{
    struct policy_params p = panicky();
    struct policy_state st;
    policy_state_init(&st);
    calm(&p, &st, 0, 100);
    /* The panic starts at 10 s. At 14 s the queue (39) has grown 1.86/s
     * over the overload so far (14 s) and its minimum over the panic window
     * is 19; the replicas asked for at 10 s arrive at 70 s, 56 s from now, to
     * a backlog of 19 + 1.86 x 56 = 123: demand 1.65, + growth (100 + 186
     * tokens/s -> 2.86), + 113 requests over 60 s -> 4.74 -> 5 (without the
     * growth to come: 3). */
    struct policy_decision d = overload(&p, &st, 100, 14);
    assert_true(st.over_panic);
    assert_int_equal(d.desired, 5);
    /* The horizon is the first replicas' arrival, not a cold start from each
     * call: the same growth asks for the same replicas all cold start long,
     * not for later ones that would arrive after the first had cleared it. */
    long most = 0;
    for (int t = 15; t <= 70; t++) {
        d = run(&p, &st, 100, 11 + 2.0 * t, 0, (100 + t) * 1000);
        if (d.desired > most)
            most = d.desired;
    }
    assert_true(most <= 6);
    /* The overload ends; the next one's panic looks ahead from its own start
     * (the last one outlasted a cold start, so it panics at once too). */
    calm(&p, &st, 171, 400);
    d = overload(&p, &st, 400, 14);
    assert_true(st.over_panic);
    assert_int_equal(d.desired, 5);
    /* A horizon of a cold start from every call (panic_lookahead 1) asks for
     * more and more as the queue grows. */
    struct policy_params ahead = p;
    ahead.panic_lookahead = 1;
    policy_state_init(&st);
    calm(&ahead, &st, 0, 100);
    d = overload(&ahead, &st, 100, 70);
    assert_true(d.desired >= 7);
    /* Outside a panic (the queue window's path) nothing is projected. */
    ahead.panic_window_ms = 0;
    p.panic_window_ms = 0;
    struct policy_state a, b;
    policy_state_init(&a);
    policy_state_init(&b);
    calm(&p, &a, 0, 100);
    calm(&ahead, &b, 0, 100);
    struct policy_decision now = overload(&p, &a, 100, 45);
    struct policy_decision later = overload(&ahead, &b, 100, 45);
    assert_int_equal(now.desired, later.desired);
}

/* A panic on a queue growing 5 requests/s on average in uneven steps (0-10
 * a second): the lowest and highest ask from 25 s to 60 s and the largest
 * change from one second to the next. */
static void panic_asks(const struct policy_params *p, long *lo, long *hi, long *jump)
{
    static const int steps[] = {0, 10, 3, 7, 9, 1, 6, 4, 2, 8}; /* mean 5 */
    struct policy_state st;
    policy_state_init(&st);
    calm(p, &st, 0, 100);
    double q = 11;
    long prev = -1;
    *lo = POLICY_MAX_REPLICAS;
    *hi = *jump = 0;
    for (int t = 0; t <= 60; t++) {
        q += steps[t % 10];
        struct policy_decision d = run(p, &st, 100, q, 0, (100 + t) * 1000);
        if (t >= 25) {
            assert_true(st.over_panic);
            *lo = d.raw < *lo ? d.raw : *lo;
            *hi = d.raw > *hi ? d.raw : *hi;
            if (prev >= 0 && labs(d.raw - prev) > *jump)
                *jump = labs(d.raw - prev);
        }
        prev = d.raw;
    }
}

/* A panic's ask follows the backlog's sustained growth, not its noise.
 * Measured over the 3 s panic window alone (in 2 s history slots), the
 * growth swung with every step, and the look-ahead (up to a cold start,
 * here 120 s) made the ask jump by several replicas a second. */
static void test_panic_growth_is_the_overloads_not_the_last_seconds(void **unused)
{
    struct policy_params p = v2();
    p.cold_start_ms = 120000;
    p.queue_window_ms = 45000;
    p.panic_window_ms = 3000;
    p.late_after_ms = 1500; /* late requests last, as the example activators */
    long lo, hi, jump;
    panic_asks(&p, &lo, &hi, &jump);
    /* 5 requests/s at 100 tokens each is 5 replicas at 100 tokens/s, plus
     * the backlog projected to the first replicas' arrival, cleared over
     * late_clear_ms: 8-9 replicas from 25 s to 60 s. Over the panic window
     * alone: 6-10, a second apart by up to 4. */
    assert_true(lo >= 8);
    assert_true(hi - lo <= 2);
    assert_true(jump <= 2);
    /* FIFO activators keep the panic window's growth (see policy.c): 9-14. */
    p.late_after_ms = 0;
    panic_asks(&p, &lo, &hi, &jump);
    assert_true(jump >= 4);
}

/* The same traffic decided once a second or four times a second ends in
 * the same place: history lives in time slots, not in calls. */
static void test_call_rate_does_not_matter(void **unused)
{
    struct policy_params p = v2();
    p.trend_window_ms = 120000;
    p.scale_down_window_ms = 120000;
    p.surge_hold_ms = 60000;
    struct policy_state a, b;
    policy_state_init(&a);
    policy_state_init(&b);
    struct policy_decision da = {0}, db = {0};
    for (int64_t ms = 0; ms <= 400000; ms += 250) {
        double r = 100 + (double)ms / 1000.0;
        double q = ms > 200000 && ms < 260000 ? (double)(ms - 200000) / 1000.0 : 0;
        if (ms % 1000 == 0)
            da = run(&p, &a, r, q, 0, ms);
        db = run(&p, &b, r, q, 0, ms);
        /* Slot minima and maxima see a few more samples, so a rounding may
         * flip (and a window then holds it): never more than one replica.
         * History kept per call would expire four times sooner here. */
        if (ms % 1000 == 0)
            assert_true(labs(da.desired - db.desired) <= 1);
    }
    assert_int_equal(da.desired, db.desired);
}

/* Times are monotonic and non-negative in the scaler (clock_mono_ms), but
 * the policy must stay defined whatever it is given: times before 0 and
 * near INT64_MAX, and jumps between them, with every term active. Out of
 * range times act as the nearest valid one, so the window still holds (the
 * normal build checks that). The undefined behaviour the clamps prevent (a
 * negative remainder indexing the windows, a window added to a time near
 * INT64_MAX) is reported only by the ASan+UBSan setup, `meson test --setup
 * asan`, which scripts/test.sh runs: UBSan alone prints and continues. */
static void test_times_out_of_range_are_clamped(void **unused)
{
    struct policy_params p;
    policy_params_defaults(&p);
    p.target_tokens_per_second = 1000;
    p.scale_down_window_ms = 60000;
    p.replica_slots = 0;
    p.target_utilisation = 1;
    p.burst_cv = 0;
    struct policy_state st;
    policy_state_init(&st);
    struct policy_decision d = run(&p, &st, 5000, 0, 0, -10000);
    assert_int_equal(d.desired, 5);
    d = run(&p, &st, 1000, 0, 0, -7500);
    assert_int_equal(d.desired, 5); /* held: both times act as 0 */
    assert_int_equal(d.reason, POLICY_REASON_STABILIZING);
    const int64_t times[] = {-1,        -1875,         -60001,         INT64_MIN + 1,
                             INT64_MAX, INT64_MAX - 1, 0,              123456789,
                             -7500,     INT64_MAX / 2, INT64_MIN / 2, 50};
    for (int round = 0; round < 4; round++) {
        for (size_t i = 0; i < sizeof(times) / sizeof(times[0]); i++) {
            d = run(&p, &st, 3000.0 * (double)(i % 3), (double)(i % 4) * 20, (double)(i % 5 == 0),
                    times[i]);
            assert_true(d.desired >= 0 && d.desired <= POLICY_MAX_REPLICAS);
            assert_true(d.raw >= 0 && d.raw <= POLICY_MAX_REPLICAS);
        }
    }
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
        cmocka_unit_test(test_v1_params_are_v1),
        cmocka_unit_test(test_defaults_are_sane),
        cmocka_unit_test(test_utilisation_target),
        cmocka_unit_test(test_square_root_staffing_when_the_batch_is_known),
        cmocka_unit_test(test_bursty_demand_uses_its_own_utilisation),
        cmocka_unit_test(test_bursty_demand_holds_its_level_longer),
        cmocka_unit_test(test_a_fall_let_go_stays_gone),
        cmocka_unit_test(test_forecast_follows_a_trend),
        cmocka_unit_test(test_forecast_ignores_noise),
        cmocka_unit_test(test_demand_by_conservation),
        cmocka_unit_test(test_backlog_that_drains_or_bursts_adds_nothing),
        cmocka_unit_test(test_late_requests_last_clear_the_backlog_slowly),
        cmocka_unit_test(test_wake_sized_by_arrivals),
        cmocka_unit_test(test_released_arrivals_stand_in_for_the_rate),
        cmocka_unit_test(test_tokens_per_request_learned_from_a_wake),
        cmocka_unit_test(test_tokens_per_request_counts_arrivals_after_release),
        cmocka_unit_test(test_tokens_per_request_not_learned_when_demand_changes_after_release),
        cmocka_unit_test(test_tokens_per_request_pools_episodes_without_outliers),
        cmocka_unit_test(test_tokens_per_request_two_episodes_and_broken_totals),
        cmocka_unit_test(test_tokens_per_request_ignores_implausible_episodes),
        cmocka_unit_test(test_keep_warm_counts_held_requests),
        cmocka_unit_test(test_released_backlog_stays_busy_for_a_rate_window),
        cmocka_unit_test(test_keep_warm_break_even),
        cmocka_unit_test(test_idle_by_activators),
        cmocka_unit_test(test_idle_by_activators_unseen_traffic),
        cmocka_unit_test(test_idle_by_activators_still_learns_tokens_per_request),
        cmocka_unit_test(test_zero_forgets_the_windows),
        cmocka_unit_test(test_v2_stale_hold),
        cmocka_unit_test(test_restore_floor_holds_until_its_time),
        cmocka_unit_test(test_restore_floor_and_idle),
        cmocka_unit_test(test_restore_floor_edges),
        cmocka_unit_test(test_restore_floor_counts_only),
        cmocka_unit_test(test_call_rate_does_not_matter),
        cmocka_unit_test(test_panic_on_new_overloads_only),
        cmocka_unit_test(test_panic_holds_until_the_overload_ends),
        cmocka_unit_test(test_no_panic_while_bursty),
        cmocka_unit_test(test_panic_clears_the_growth_until_its_replicas_arrive),
        cmocka_unit_test(test_panic_growth_is_the_overloads_not_the_last_seconds),
        cmocka_unit_test(test_times_out_of_range_are_clamped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
