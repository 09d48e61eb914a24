/* policy: the scaling decision, a pure function of inputs, state and time.
 *
 * Policy v2 (docs/scaling-policy.md has the derivation and the benchmark
 * behind every default). With C = target_tokens_per_second (what one
 * replica sustains), u = target_utilisation, Q = target_queue_length:
 *
 *   u        = bursty_utilisation while the demand is bursty (its coefficient
 *              of variation over the last 5 minutes above burst_cv; a burst
 *              of several times the level is met by the queue terms, not by
 *              headroom), else target_utilisation; 1 when replica_slots is
 *              known (S > 0) and the demand is not bursty: then the level
 *              has square-root headroom instead (below)
 *   demand   D = max(r, forecast of r over cold_start_ms + rate_lag_ms)
 *              forecast: least-squares trend of r over trend_window_ms
 *   backlog  B = queue that persisted for queue_window_ms (its minimum),
 *              counted only while it is not draining on its own
 *   level    = ceil(L), L = D / (C u), or with S known and steady demand
 *              L = x + staffing_beta x sqrt(x / S), x = D / C (square-root
 *              staffing in batch slots); held at its max over
 *              scale_down_window_ms, or over bursty_scale_down_window_ms
 *              if longer while the demand is bursty or was within the last
 *              5 minutes (bursty demand returns after a lull; steady demand
 *              that falls has fallen), never reaching back past what the
 *              steady window already let go
 *   surge    = ceil(L + B / Q) and the wake term, held at their max
 *              over surge_hold_ms (a backlog is transient: no long hold)
 *   wake term (nothing ready, h requests held, growing at lambda lately):
 *              lambda plus wake_backlog_share x the backlog at release
 *              (h + lambda x cold start left) per cold start, in replicas:
 *              x kappa / (C u); kappa = tokens per request over the last
 *              wake episodes (tokens the rate showed from the release until
 *              one rate window after the backlog was first gone, over the
 *              requests held plus those arriving at lambda until then): their
 *              totals, leaving out episodes more than 3x off the
 *              request-weighted median episode (and never learning one more
 *              than 10 000x off the prior, nor one whose backlog after the
 *              release outgrew what it counts: the demand changed); else the
 *              tokens_per_request prior
 *   after a release, for rate_window_ms (the rate cannot show the released
 *              requests yet), the wake term is lambda at the release x kappa /
 *              (C u), staffed like the level
 *   B        = 0 for one cold start after a wake's backlog is released (the
 *              wake term sized for it), and 0 while the queue drains on its
 *              own faster than a new replica could start
 *   panic    (panic_window_ms > 0): a backlog above Q for the panic window
 *              counts before queue_window_ms when most past overloads that
 *              lasted as long went on for another cold start, or none did;
 *              once it counts it counts until the overload ends; it does not
 *              start while the demand is bursty. While it counts, the backlog is projected
 *              at its growth (with late_after_ms set, over the overload so far, at
 *              most 20 s back) to when the replicas asked for at the panic's
 *              start arrive (a cold start after it), and at least panic_lookahead
 *              cold starts ahead
 *   desired  = max(level, surge, active ? 1 : 0)
 *   active   = busy, or idle for less than the keep-warm time
 *   busy     = r > activation_token_rate || queue > activation_queue_length
 *              || held > 0, or either of the last two within rate_window_ms
 *              (the rate has not shown the released backlog's tokens yet);
 *              with idle_by_activators and their in-flight count known:
 *              inflight > 0 || queue > activation_queue_length || held > 0,
 *              or inflight > 0 within POLICY_ACTIVATORS_IDLE_MS (the
 *              activators see the last request end; the rate shows it a
 *              window later)
 *   keep-warm: the T minimising the cost of the last idle gaps g_i,
 *              sum(g_i <= T ? g_i : T + K), K = keep_warm_cost x cold_start_ms
 *              + wake_request_cost x (mean requests held by the last wakes)
 *              / (replicas when going idle): a wake costs the replicas'
 *              loading time and the requests it holds; K before any gap
 *              (the ski-rental break-even).
 * Fail-safe: while any input is stale (its source failing), the decision never
 * goes down: desired >= the last desired, and a model last seen active stays
 * active. Restored floor (policy_state_restore, after a restart): desired >=
 * the answer read back until its time is up. The same code runs in
 * thaw-scaler, the unit tests and the replay benchmark; it does no I/O and
 * reads no clock. Any call rate works: history is kept in time slots, not
 * per call. */
#ifndef THAW_POLICY_H
#define THAW_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#define POLICY_MAX_REPLICAS 100000
#define POLICY_WINDOW_BUCKETS 32
#define POLICY_RATE_SLOTS 64    /* demand history, one slot per 5 s */
#define POLICY_QUEUE_SLOTS 64   /* queue history, one slot per 2 s */
#define POLICY_GAPS 32          /* idle gaps remembered for keep-warm */
#define POLICY_HELD_SLOTS 16    /* held history during a wake, one slot per 2 s */
#define POLICY_OVERLOADS 16     /* overload (backlog above Q) durations remembered */
#define POLICY_BURST_WINDOW_MS 300000 /* demand history judged for burstiness */
#define POLICY_MAX_TIME_MS (INT64_MAX / 4) /* later times act as this one */
/* With idle_by_activators, nothing carried for this long is idle: one read of
 * 0 between two requests is not. */
#define POLICY_ACTIVATORS_IDLE_MS 2000
/* With idle_by_activators, a current token rate still above the activation
 * rate this long (past its own window) after the activators last carried a
 * request means they do not see this model's traffic (clients calling the
 * model servers directly, their fields lost with Redis's data): the rate
 * decides again. Covers Prometheus's scrape interval and the query's. */
#define POLICY_ACTIVATORS_DISAGREE_MS 30000

struct policy_params {
    double target_tokens_per_second; /* > 0: tokens/s one replica sustains */
    double target_queue_length;      /* > 0: queued requests one replica absorbs */
    double activation_token_rate;    /* >= 0 */
    double activation_queue_length;  /* >= 0 */
    int64_t scale_down_window_ms;    /* >= 0; 0 = scale down at once */
    int64_t cold_start_ms;           /* >= 0: scale-up to a ready replica */
    double target_utilisation;       /* (0, 1]: share of C to plan for */
    int64_t trend_window_ms;         /* >= 0; 0 = no forecast */
    int64_t rate_window_ms;          /* >= 0: the token-rate query's range, e.g. [1m] */
    int64_t queue_window_ms;         /* > 0: a queue must last this long to count;
                                      * <= 0: half a cold start (5 s .. 60 s) */
    double keep_warm_cost;           /* >= 0: a cold start costs this x cold_start_ms */
    int64_t keep_warm_max_ms;        /* >= 0: upper bound of the keep-warm time */
    int64_t surge_hold_ms;           /* >= 0: how long backlog and wake surges are held */
    double tokens_per_request;       /* > 0: prior of the tokens one request costs */
    double drain_time_factor;        /* > 0: clear a backlog within this x cold start */
    int64_t late_after_ms;           /* >= 0; 0 = FIFO: the activators' lateAfterSeconds (a
                                      * request waiting longer goes behind newer ones) */
    int64_t late_clear_ms;           /* > 0: with late_after_ms > 0, a backlog is cleared
                                      * within this long (before the activators' hold
                                      * timeout), or drain_time_factor cold starts if longer */
    double wake_backlog_share;       /* >= 0: share of a wake's backlog cleared per cold start */
    int64_t panic_window_ms;         /* >= 0; 0 = off: a backlog above Q for this long counts
                                      * before queue_window_ms when past overloads that lasted
                                      * as long mostly outlasted one more cold start */
    double panic_lookahead;          /* >= 0: while panicking, the backlog to clear is the
                                      * queue plus its growth until the replicas asked for
                                      * at the panic's start arrive, and at least over
                                      * this x cold start */
    double replica_slots;            /* >= 0; 0 = unknown: sequences one replica runs at once
                                      * (vLLM --max-num-seqs); known, steady demand gets
                                      * square-root headroom instead of target_utilisation */
    double staffing_beta;            /* >= 0: the square-root headroom's factor */
    double wake_request_cost;        /* >= 0: GPU-seconds one request held by a wake costs,
                                      * added to a cold start's cost in the keep-warm choice */
    double burst_cv;                 /* >= 0; 0 = off: the demand's coefficient of variation
                                      * over POLICY_BURST_WINDOW_MS above which it is bursty */
    double bursty_utilisation;       /* (0, 1]: the utilisation target while bursty; out of
                                      * range: target_utilisation stays */
    int64_t bursty_scale_down_window_ms; /* >= 0: the scale-down window while the demand is
                                          * bursty or was in the last POLICY_BURST_WINDOW_MS,
                                          * if longer than scale_down_window_ms */
    bool idle_by_activators;         /* every request passes through activators that report
                                      * their in-flight count: busy = that count, the queue or
                                      * the held count above zero, and the token rate (a
                                      * window behind) is not waited for */
};

/* Fills every field with its default (the benchmark's choice, see
 * docs/scaling-policy.md). */
void policy_params_defaults(struct policy_params *p);
/* Fills the fields so that the policy behaves exactly as policy v1: every
 * v2 knob 0 (a params struct with only the v1 fields set behaves the same). */
void policy_params_v1(struct policy_params *p);

struct policy_inputs {
    double token_rate;   /* tokens/s, last good value */
    double queue;        /* queued requests, last good value */
    double held;         /* requests held by activators, last good value */
    bool token_rate_stale;
    bool queue_stale;
    bool held_stale;
    /* Requests the activators have accepted and not finished (held, queued
     * and in a backend), summed over them; known when they report it.
     * Used only with idle_by_activators. */
    double inflight;
    bool inflight_known;
};

enum policy_direction { POLICY_HOLD = 0, POLICY_UP, POLICY_DOWN };

/* Why the decision is what it is; stable strings for metrics and logs. */
enum policy_reason {
    POLICY_REASON_IDLE = 0,         /* nothing to do: zero */
    POLICY_REASON_TOKEN_RATE,       /* the token rate term is the largest */
    POLICY_REASON_QUEUE,            /* the queue adds replicas */
    POLICY_REASON_HELD,             /* held requests wake the model */
    POLICY_REASON_STABILIZING,      /* held up by the scale-down window */
    POLICY_REASON_STALE_HOLD,       /* a source is failing: no scale-down */
    POLICY_REASON_FORECAST,         /* the trend forecast is above the rate */
    POLICY_REASON_KEEP_WARM,        /* idle, one replica kept for the break-even time */
    POLICY_REASON_RESTORED,         /* the floor read back after a restart (policy_state_restore) */
    POLICY_REASON_COUNT
};

struct policy_decision {
    long desired;     /* what GetMetrics reports */
    long raw;         /* before stabilization and fail-safe */
    bool active;      /* what IsActive reports */
    enum policy_direction direction; /* vs the previous decision */
    enum policy_reason reason;
};

#define POLICY_KAPPAS 8      /* tokens-per-request estimates remembered */
#define POLICY_WAKES 8       /* wakes' held counts remembered, for keep-warm */

/* A sliding maximum over a time window, in buckets. */
struct policy_window {
    int64_t start_ms[POLICY_WINDOW_BUCKETS];
    int32_t max[POLICY_WINDOW_BUCKETS];
};

/* Per target; storage owned by the caller, zeroed by policy_state_init. */
struct policy_state {
    struct policy_window level; /* rate-based replicas, the scale-down window */
    struct policy_window surge; /* backlog and wake replicas, surge_hold_ms */
    bool has_decision;
    struct policy_decision last;
    /* History in time slots (slot number = ms / slot width; -1 = empty),
     * values as float: bounded memory per target whatever the call rate.
     * Demand (tokens/s) per 5 s slot, the last value seen in the slot. */
    int32_t rate_slot[POLICY_RATE_SLOTS];
    float rate_val[POLICY_RATE_SLOTS];
    /* Backlog (queued + held) minimum and maximum per 2 s slot. */
    int32_t queue_slot[POLICY_QUEUE_SLOTS];
    float queue_min[POLICY_QUEUE_SLOTS];
    float queue_max[POLICY_QUEUE_SLOTS];
    /* Activity: busy / idle periods and the idle gaps seen. */
    bool busy;
    int64_t idle_since_ms;       /* valid while !busy and seen_busy */
    bool seen_busy;
    int32_t gaps_ms[POLICY_GAPS];
    int ngaps, gap_next;
    int64_t keep_warm_ms;        /* current keep-warm time */
    /* Wakes: held requests (nothing ready), their arrival rate, and the
     * episode from a wake to the next idle, which teaches tokens/request. */
    bool waking;
    int64_t wake_start_ms;
    double wake_peak_held;
    float held_hist[POLICY_HELD_SLOTS]; /* held count per 2 s slot while waking */
    int32_t held_slot[POLICY_HELD_SLOTS];
    int64_t wake_release_ms;     /* last time held went back to 0 */
    bool episode;                /* a wake started it and it is not idle yet */
    double ep_tokens;            /* integral of the token rate over the episode */
    double ep_requests;          /* requests held during its wakes */
    int64_t ep_empty_ms;         /* backlog first empty after the last release, or NO_TIME */
    double wake_lambda;          /* held requests' arrival rate, per second, while waking */
    double ep_lambda;            /* the same at the episode's last release */
    int64_t last_call_ms;
    int64_t first_call_ms;
    double kappa_tokens[POLICY_KAPPAS];   /* one wake episode's tokens ... */
    double kappa_requests[POLICY_KAPPAS]; /* ... and requests, per episode */
    int nkappa, kappa_next;
    /* Overloads: periods with the backlog above Q (outside wakes). */
    int64_t over_since_ms;
    int32_t over_ms[POLICY_OVERLOADS];
    int nover, over_next;
    bool over_panic;             /* this overload's backlog counts early */
    int64_t panic_since_ms;      /* while over_panic: when this overload's panic began */
    int64_t backlog_seen_ms;     /* last queue or held request seen, or NO_TIME */
    int64_t carried_seen_ms;     /* last call the activators carried a request, or NO_TIME */
    /* Requests held by the last wakes (their peak), for keep-warm. */
    double wake_held[POLICY_WAKES];
    int nwake, wake_next;
    long idle_replicas;          /* replicas when the model last went idle */
    bool bursty;                 /* the last decision used bursty_utilisation */
    int64_t bursty_seen_ms;      /* last decision that found the demand bursty */
    int64_t level_floor_ms;      /* level history before this was let go by the steady
                                  * window: the bursty one does not reach back past it */
    int64_t down_window_ms;      /* the scale-down window the last decision used */
    double utilisation;          /* the utilisation target of the last decision */
    /* A floor read back after a restart (policy_state_restore). */
    long restore_floor;
    int64_t restore_until_ms;    /* NO_TIME: none */
};

void policy_state_init(struct policy_state *st);

/* After a restart the state is new, but the replicas asked for before it are
 * still up and the windows that held them are forgotten. This keeps desired
 * at least `floor`, and the target active (not with counts only, v1, whose
 * windows hold an answer while inactive), until until_ms, the way the lost
 * scale-down window would have, unless the model is seen busy and then goes
 * idle first (going to zero clears every window; with counts only it does
 * not, and the floor stays). A floor <= 0 or an
 * until_ms not after the last decision does nothing. The decision's reason
 * is POLICY_REASON_RESTORED while the floor is what it reports. */
void policy_state_restore(struct policy_state *st, long floor, int64_t until_ms);

/* Decides at now_ms (monotonic, non-decreasing across calls; times below 0
 * or above POLICY_MAX_TIME_MS act as the nearest bound) and updates st. */
void policy_decide(const struct policy_params *p, struct policy_state *st,
                   const struct policy_inputs *in, int64_t now_ms, struct policy_decision *out);

/* The tokens one request costs where the decision counts requests in tokens
 * (queue growth, backlog, wakes): learned from the wake episodes when there
 * are any (kappa), else the tokens_per_request prior; 0 when
 * tokens_per_request is 0 (no request-size model: counts only). An episode is
 * judged against the prior in force when it ends: one more than 10 000x off
 * is not kept (so a prior set far too low keeps real sizes from being learned). */
double policy_tokens_per_request(const struct policy_params *p, const struct policy_state *st);
const char *policy_reason_to_str(enum policy_reason r);
const char *policy_direction_to_str(enum policy_direction d);

#endif
