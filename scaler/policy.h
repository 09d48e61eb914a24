/* policy: the scaling decision, a pure function of inputs, state and time.
 *
 * Policy v1:
 *   raw     = max(ceil(token_rate / target_tokens_per_second),
 *                 ceil(queue / target_queue_length),
 *                 held > 0 ? 1 : 0)
 *   desired = max(raw over the last scale_down_window_ms)   (scale-down stabilization)
 *   active  = token_rate > activation_token_rate || queue > activation_queue_length
 *             || held > 0
 * Fail-safe: while any input is stale (its source failing), the decision never
 * goes down: desired >= the last desired, and a model last seen active stays
 * active. The same code runs in thaw-scaler, the unit tests and the replay
 * benchmark; it does no I/O and reads no clock. */
#ifndef THAW_POLICY_H
#define THAW_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#define POLICY_MAX_REPLICAS 100000
#define POLICY_WINDOW_BUCKETS 64

struct policy_params {
    double target_tokens_per_second; /* > 0 */
    double target_queue_length;      /* > 0 */
    double activation_token_rate;    /* >= 0 */
    double activation_queue_length;  /* >= 0 */
    int64_t scale_down_window_ms;    /* >= 0; 0 = scale down at once */
};

struct policy_inputs {
    double token_rate;   /* generation tokens/s, last good value */
    double queue;        /* queued jobs, last good value */
    double held;         /* requests held by activators, last good value */
    bool token_rate_stale;
    bool queue_stale;
    bool held_stale;
};

enum policy_direction { POLICY_HOLD = 0, POLICY_UP, POLICY_DOWN };

/* Why the decision is what it is; stable strings for metrics and logs. */
enum policy_reason {
    POLICY_REASON_IDLE = 0,         /* nothing to do: zero */
    POLICY_REASON_TOKEN_RATE,       /* the token rate term is the largest */
    POLICY_REASON_QUEUE,            /* the queue term is the largest */
    POLICY_REASON_HELD,             /* held requests keep one replica */
    POLICY_REASON_STABILIZING,      /* held up by the scale-down window */
    POLICY_REASON_STALE_HOLD,       /* a source is failing: no scale-down */
    POLICY_REASON_COUNT
};

struct policy_decision {
    long desired;     /* what GetMetrics reports */
    long raw;         /* before stabilization and fail-safe */
    bool active;      /* what IsActive reports */
    enum policy_direction direction; /* vs the previous decision */
    enum policy_reason reason;
};

/* Per target; storage owned by the caller, zeroed by policy_state_init. */
struct policy_state {
    int64_t bucket_start_ms[POLICY_WINDOW_BUCKETS];
    long bucket_max[POLICY_WINDOW_BUCKETS];
    bool has_decision;
    struct policy_decision last;
};

void policy_state_init(struct policy_state *st);

/* Decides at now_ms (monotonic, non-decreasing across calls) and updates st. */
void policy_decide(const struct policy_params *p, struct policy_state *st,
                   const struct policy_inputs *in, int64_t now_ms, struct policy_decision *out);

const char *policy_reason_to_str(enum policy_reason r);
const char *policy_direction_to_str(enum policy_direction d);

#endif
