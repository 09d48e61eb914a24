#include "policy.h"

#include <math.h>
#include <string.h>

static const char *const reason_names[POLICY_REASON_COUNT] = {
    "idle", "token_rate", "queue", "held_requests", "stabilizing", "stale_source_hold",
};

const char *policy_reason_to_str(enum policy_reason r)
{
    return (r >= 0 && r < POLICY_REASON_COUNT) ? reason_names[r] : "unknown";
}

const char *policy_direction_to_str(enum policy_direction d)
{
    switch (d) {
    case POLICY_UP: return "up";
    case POLICY_DOWN: return "down";
    case POLICY_HOLD: return "none";
    }
    return "unknown";
}

void policy_state_init(struct policy_state *st)
{
    memset(st, 0, sizeof(*st));
    for (int i = 0; i < POLICY_WINDOW_BUCKETS; i++)
        st->bucket_start_ms[i] = INT64_MIN;
}

/* ceil(num / den), clamped, for finite non-negative inputs; garbage counts as 0. */
static long replicas_for(double num, double den)
{
    if (!(num > 0) || !(den > 0) || !isfinite(num))
        return 0;
    double r = ceil(num / den);
    if (!(r < POLICY_MAX_REPLICAS))
        return POLICY_MAX_REPLICAS;
    return (long)r;
}

/* The window is cut into equal buckets holding the max raw value seen in
 * them: bounded memory and O(buckets) per decision whatever the call rate.
 * A bucket is counted while any part of it is inside the window, so the
 * stabilization errs on the side of keeping replicas up to one bucket longer. */
static long window_max(struct policy_state *st, int64_t window_ms, int64_t now_ms, long raw)
{
    if (window_ms <= 0)
        return raw;
    int64_t width = window_ms / POLICY_WINDOW_BUCKETS;
    if (width < 1)
        width = 1;
    int64_t slot_start = now_ms - (now_ms % width);
    int idx = (int)((now_ms / width) % POLICY_WINDOW_BUCKETS);
    if (st->bucket_start_ms[idx] != slot_start) {
        st->bucket_start_ms[idx] = slot_start;
        st->bucket_max[idx] = raw;
    } else if (raw > st->bucket_max[idx]) {
        st->bucket_max[idx] = raw;
    }
    long best = raw;
    for (int i = 0; i < POLICY_WINDOW_BUCKETS; i++) {
        if (st->bucket_start_ms[i] == INT64_MIN)
            continue;
        if (st->bucket_start_ms[i] + width > now_ms - window_ms && st->bucket_max[i] > best)
            best = st->bucket_max[i];
    }
    return best;
}

void policy_decide(const struct policy_params *p, struct policy_state *st,
                   const struct policy_inputs *in, int64_t now_ms, struct policy_decision *out)
{
    long by_tokens = replicas_for(in->token_rate, p->target_tokens_per_second);
    long by_queue = replicas_for(in->queue, p->target_queue_length);
    long by_held = in->held > 0 ? 1 : 0;

    struct policy_decision d = {0};
    d.raw = by_tokens;
    d.reason = by_tokens > 0 ? POLICY_REASON_TOKEN_RATE : POLICY_REASON_IDLE;
    if (by_queue > d.raw) {
        d.raw = by_queue;
        d.reason = POLICY_REASON_QUEUE;
    }
    if (by_held > d.raw) {
        d.raw = by_held;
        d.reason = POLICY_REASON_HELD;
    }
    d.active = (in->token_rate > p->activation_token_rate) ||
               (in->queue > p->activation_queue_length) || (in->held > 0);

    d.desired = window_max(st, p->scale_down_window_ms, now_ms, d.raw);
    if (d.desired > d.raw)
        d.reason = POLICY_REASON_STABILIZING;

    bool stale = in->token_rate_stale || in->queue_stale || in->held_stale;
    if (stale && st->has_decision) {
        if (st->last.desired > d.desired) {
            d.desired = st->last.desired;
            d.reason = POLICY_REASON_STALE_HOLD;
        }
        if (st->last.active && !d.active) {
            d.active = true;
            d.reason = POLICY_REASON_STALE_HOLD;
        }
    }

    if (!st->has_decision)
        d.direction = d.desired > 0 ? POLICY_UP : POLICY_HOLD;
    else if (d.desired > st->last.desired)
        d.direction = POLICY_UP;
    else if (d.desired < st->last.desired)
        d.direction = POLICY_DOWN;
    else
        d.direction = POLICY_HOLD;

    st->last = d;
    st->has_decision = true;
    *out = d;
}
