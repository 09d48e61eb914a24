#include "policy.h"

#include <math.h>
#include <string.h>

#define RATE_SLOT_MS 5000
#define QUEUE_SLOT_MS 2000
#define HELD_SLOT_MS 2000
#define HELD_RECENT_MS 20000
/* How far back a panic measures the queue's growth, at most. */
#define PANIC_GROWTH_MAX_MS 20000
#define NO_TIME INT64_MIN
#define NO_SLOT INT32_MIN
#define TREND_Z 3.0
/* Episodes this many times off the weighted median are outliers (kappa_estimate). */
#define KAPPA_OUTLIER 3.0
/* An episode more than this factor off the tokens_per_request prior is a
 * token-rate source unrelated to the held requests (a query summing other
 * models, a broken exporter), not a workload: requests of a 1M-token context
 * at the default prior of 256 are ~4 000x, so it is set well above that. */
#define KAPPA_IMPLAUSIBLE 10000.0
/* After a wake's release the backlog can only outgrow what was held plus the
 * arrivals at the rate they came in at the release if more requests arrived
 * than the episode counts; the margin is for Poisson noise (z standard
 * deviations plus a few requests). */
#define EPISODE_BACKLOG_Z 3.0
#define EPISODE_BACKLOG_SLACK 5.0

static const char *const reason_names[POLICY_REASON_COUNT] = {
    "idle",     "token_rate",        "queue",    "held_requests",
    "stabilizing", "stale_source_hold", "forecast", "keep_warm",
    "restored",
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

/* The defaults come from the replay benchmark (bench/replay.sh; one set for
 * every trace and shape; docs/scaling-policy.md gives the reasoning). */
void policy_params_defaults(struct policy_params *p)
{
    memset(p, 0, sizeof(*p));
    p->target_tokens_per_second = 1000;
    p->target_queue_length = 10;
    p->scale_down_window_ms = 90000;
    p->cold_start_ms = 60000;
    p->target_utilisation = 0.88;
    p->trend_window_ms = 240000;
    p->rate_window_ms = 60000;
    p->queue_window_ms = 45000;
    p->keep_warm_cost = 1;
    p->keep_warm_max_ms = 1800000;
    p->surge_hold_ms = 20000;
    p->tokens_per_request = 256;
    p->drain_time_factor = 0.33;
    p->late_after_ms = 0;
    p->late_clear_ms = 300000;
    p->wake_backlog_share = 0.75;
    p->panic_window_ms = 3000;
    p->panic_lookahead = 0;
    p->replica_slots = 0;
    p->staffing_beta = 1.25;
    p->wake_request_cost = 0.75;
    p->burst_cv = 1.0;
    p->bursty_utilisation = 0.92;
    p->bursty_scale_down_window_ms = 180000;
}

void policy_params_v1(struct policy_params *p)
{
    /* Every knob v1 did not have is 0: no utilisation target (u = 1), no
     * forecast, no keep-warm, no surge hold, counts only. */
    memset(p, 0, sizeof(*p));
    p->target_tokens_per_second = 1000;
    p->target_queue_length = 10;
    p->scale_down_window_ms = 300000;
}

void policy_state_init(struct policy_state *st)
{
    memset(st, 0, sizeof(*st));
    for (int i = 0; i < POLICY_WINDOW_BUCKETS; i++)
        st->level.start_ms[i] = st->surge.start_ms[i] = NO_TIME;
    for (int i = 0; i < POLICY_RATE_SLOTS; i++)
        st->rate_slot[i] = NO_SLOT;
    for (int i = 0; i < POLICY_QUEUE_SLOTS; i++)
        st->queue_slot[i] = NO_SLOT;
    st->idle_since_ms = NO_TIME;
    st->bursty_seen_ms = NO_TIME;
    st->level_floor_ms = NO_TIME;
    st->wake_release_ms = NO_TIME;
    st->backlog_seen_ms = NO_TIME;
    st->carried_seen_ms = NO_TIME;
    st->last_call_ms = NO_TIME;
    st->first_call_ms = NO_TIME;
    st->keep_warm_ms = -1; /* not computed yet */
    st->over_since_ms = NO_TIME;
    st->panic_since_ms = NO_TIME;
    st->ep_empty_ms = NO_TIME;
    st->restore_until_ms = NO_TIME;
}

void policy_state_restore(struct policy_state *st, long floor, int64_t until_ms)
{
    if (floor <= 0 || (st->last_call_ms != NO_TIME && until_ms <= st->last_call_ms))
        return;
    st->restore_floor = floor < POLICY_MAX_REPLICAS ? floor : POLICY_MAX_REPLICAS;
    st->restore_until_ms = until_ms < POLICY_MAX_TIME_MS ? until_ms : POLICY_MAX_TIME_MS;
}

/* Finite and non-negative, else 0: garbage from a source never scales. */
static double clean(double v)
{
    return (v > 0 && isfinite(v)) ? v : 0;
}

/* ceil(x), clamped to [0, POLICY_MAX_REPLICAS], for finite non-negative x. */
static long ceil_replicas(double x)
{
    if (!(x > 0))
        return 0;
    double r = ceil(x - 1e-9);
    if (!(r < POLICY_MAX_REPLICAS))
        return POLICY_MAX_REPLICAS;
    return (long)r;
}

/* Records raw and returns the maximum over the last window_ms. The record is
 * cut into equal buckets holding the max raw value seen in them: bounded
 * memory and O(buckets) per decision whatever the call rate. They are sized
 * by span_ms, the longest window the caller ever asks of w, so a shorter
 * window reads the same record. A bucket is counted while any part of it is
 * inside the window, so the stabilization errs on the side of keeping
 * replicas up to one bucket (span_ms / 32) longer. */
static long window_max(struct policy_window *w, int64_t span_ms, int64_t window_ms,
                       int64_t now_ms, long raw)
{
    if (span_ms < window_ms)
        span_ms = window_ms;
    if (span_ms <= 0)
        return raw;
    int64_t width = span_ms / POLICY_WINDOW_BUCKETS;
    if (width < 1)
        width = 1;
    int64_t slot_start = now_ms - (now_ms % width);
    int idx = (int)((now_ms / width) % POLICY_WINDOW_BUCKETS);
    int32_t v = raw > INT32_MAX ? INT32_MAX : (int32_t)raw;
    if (w->start_ms[idx] != slot_start) {
        w->start_ms[idx] = slot_start;
        w->max[idx] = v;
    } else if (v > w->max[idx]) {
        w->max[idx] = v;
    }
    long best = raw;
    if (window_ms <= 0)
        return best;
    for (int i = 0; i < POLICY_WINDOW_BUCKETS; i++) {
        if (w->start_ms[i] == NO_TIME)
            continue;
        if (w->start_ms[i] + width > now_ms - window_ms && w->max[i] > best)
            best = w->max[i];
    }
    return best;
}

/* Forgets everything held: after scaling to zero nothing from before counts. */
static void window_clear(struct policy_window *w)
{
    for (int i = 0; i < POLICY_WINDOW_BUCKETS; i++)
        w->start_ms[i] = NO_TIME;
}

/* Slot number of a time (ms >= 0 in practice; clamped into int32). */
static int32_t slot_of(int64_t now_ms, int64_t width_ms)
{
    int64_t s = now_ms / width_ms;
    if (s < 0)
        return 0;
    return s > INT32_MAX ? INT32_MAX : (int32_t)s;
}

static int slot_index(int64_t slot, int n)
{
    return (int)(((slot % n) + n) % n);
}

/* ---- token rate history and forecast ------------------------------------- */

static void rate_record(struct policy_state *st, int64_t now_ms, double r)
{
    int32_t slot = slot_of(now_ms, RATE_SLOT_MS);
    int idx = slot_index(slot, POLICY_RATE_SLOTS);
    st->rate_slot[idx] = slot;
    st->rate_val[idx] = (float)r; /* the newest value of the slot */
}

/* r + slope x horizon, slope from least squares over the trend window.
 * Only a trend that stands out of the noise counts: the slope used is its
 * lower confidence bound, slope - TREND_Z x standard error, so bursty
 * traffic (a rate swinging around a level) forecasts nothing. Only upward
 * trends count (a falling rate is already in r), and the projection is
 * capped at 2r + cap_extra. */
static double rate_forecast(const struct policy_params *p, const struct policy_state *st,
                            int64_t now_ms, double r, double cap_extra)
{
    if (p->trend_window_ms <= 0 || !(r > 0))
        return r;
    int64_t now_slot = slot_of(now_ms, RATE_SLOT_MS);
    int64_t span = p->trend_window_ms / RATE_SLOT_MS;
    if (span >= POLICY_RATE_SLOTS)
        span = POLICY_RATE_SLOTS - 1;
    double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0, syy = 0;
    int64_t oldest = now_slot;
    for (int i = 0; i < POLICY_RATE_SLOTS; i++) {
        int64_t s = st->rate_slot[i];
        if (s == NO_SLOT || s > now_slot || s < now_slot - span)
            continue;
        double x = (double)(s - now_slot) * (RATE_SLOT_MS / 1000.0);
        double y = st->rate_val[i];
        n++;
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
        syy += y * y;
        if (s < oldest)
            oldest = s;
    }
    /* Half the window covered at least, or the slope is noise. */
    if (n < 3 || (now_slot - oldest) * 2 < span)
        return r;
    double den = n * sxx - sx * sx;
    if (!(den > 0))
        return r;
    double slope = (n * sxy - sx * sy) / den; /* tokens/s per second */
    double icept = (sy - slope * sx) / n;
    /* Residual variance -> standard error of the slope. */
    double sse = syy - icept * sy - slope * sxy;
    double se = n > 2 && sse > 0 ? sqrt(sse / (n - 2) / (sxx - sx * sx / n)) : 0;
    slope -= TREND_Z * se;
    if (!(slope > 0))
        return r;
    /* The rate is a window average: it lags by half the window. */
    double horizon_s = (double)(p->cold_start_ms + p->rate_window_ms / 2) / 1000.0;
    double f = r + slope * horizon_s;
    double cap = 2 * r + cap_extra;
    return f < cap ? f : cap;
}

/* The coefficient of variation (sd / mean) of the demand over the last
 * POLICY_BURST_WINDOW_MS, from the slots already recorded; 0 with less than
 * a minute of history or no demand. */
static double demand_cv(const struct policy_state *st, int64_t now_ms)
{
    int64_t now_slot = slot_of(now_ms, RATE_SLOT_MS);
    int64_t span = POLICY_BURST_WINDOW_MS / RATE_SLOT_MS;
    if (span >= POLICY_RATE_SLOTS)
        span = POLICY_RATE_SLOTS - 1;
    double n = 0, sum = 0, sumsq = 0;
    for (int i = 0; i < POLICY_RATE_SLOTS; i++) {
        int64_t s = st->rate_slot[i];
        if (s == NO_SLOT || s > now_slot || s < now_slot - span)
            continue;
        double v = st->rate_val[i];
        n++;
        sum += v;
        sumsq += v * v;
    }
    if (n * RATE_SLOT_MS < 60000 || !(sum > 0))
        return 0;
    double mean = sum / n, var = sumsq / n - mean * mean;
    return var > 0 ? sqrt(var) / mean : 0;
}

/* ---- queue history ------------------------------------------------------- */

static void queue_record(struct policy_state *st, int64_t now_ms, double q)
{
    int32_t slot = slot_of(now_ms, QUEUE_SLOT_MS);
    int idx = slot_index(slot, POLICY_QUEUE_SLOTS);
    float v = (float)q;
    if (st->queue_slot[idx] != slot) {
        st->queue_slot[idx] = slot;
        st->queue_min[idx] = v;
        st->queue_max[idx] = v;
        return;
    }
    if (v < st->queue_min[idx])
        st->queue_min[idx] = v;
    if (v > st->queue_max[idx])
        st->queue_max[idx] = v;
}

/* The queue window: set, or half a cold start within [5 s, 60 s] (a
 * backlog that outlasts that is worth a replica arriving a cold start
 * later; a shorter one is a burst that drains by itself). */
static int64_t queue_window(const struct policy_params *p)
{
    if (p->queue_window_ms > 0)
        return p->queue_window_ms;
    int64_t w = p->cold_start_ms / 2;
    return w < 5000 ? 5000 : w > 60000 ? 60000 : w;
}

/* The smallest queue seen over the window: a burst that drains within it
 * does not count. Seconds without a reading are skipped; with no reading
 * older than half the window the current value stands. */
static double queue_sustained(int64_t window_ms, const struct policy_state *st, int64_t now_ms,
                              double q)
{
    int64_t now_slot = slot_of(now_ms, QUEUE_SLOT_MS);
    int64_t span = window_ms / QUEUE_SLOT_MS;
    if (span >= POLICY_QUEUE_SLOTS)
        span = POLICY_QUEUE_SLOTS - 1;
    double m = q;
    bool old_enough = false;
    for (int i = 0; i < POLICY_QUEUE_SLOTS; i++) {
        int64_t s = st->queue_slot[i];
        if (s == NO_SLOT || s > now_slot || s < now_slot - span)
            continue;
        if (st->queue_min[i] < m)
            m = st->queue_min[i];
        if ((now_slot - s) * 2 >= span)
            old_enough = true;
    }
    return old_enough ? m : 0;
}

/* The largest queue seen in the second ago_ms before now (or within two
 * seconds of it when the policy was not called then), or -1. */
static double queue_at(const struct policy_state *st, int64_t now_ms, int64_t ago_ms)
{
    int64_t want = slot_of(now_ms - ago_ms, QUEUE_SLOT_MS);
    int64_t now_slot = slot_of(now_ms, QUEUE_SLOT_MS);
    for (int64_t off = 0; off <= 1; off++) {
        for (int sign = -1; sign <= 1; sign += 2) {
            int64_t slot = want + sign * off;
            if (slot > now_slot)
                continue;
            int idx = slot_index(slot, POLICY_QUEUE_SLOTS);
            if (st->queue_slot[idx] == slot)
                return st->queue_max[idx];
        }
    }
    return -1;
}

/* True when the queue shrinks fast enough to be gone before a replica
 * started now could be ready: more replicas would only arrive to nothing. */
static bool queue_drains_alone(const struct policy_params *p, const struct policy_state *st,
                               int64_t now_ms, double q)
{
    int64_t w = queue_window(p);
    double before = queue_at(st, now_ms, w);
    if (before < 0 || !(q < before))
        return false;
    double drain_per_s = (before - q) / ((double)w / 1000.0);
    return q / drain_per_s <= (double)p->cold_start_ms / 1000.0;
}

/* Queue change per second over the last w_ms (0 when unknown). */
static double queue_growth(const struct policy_state *st, int64_t now_ms, int64_t w_ms, double q)
{
    if (w_ms < 1000)
        w_ms = 1000;
    double before = queue_at(st, now_ms, w_ms);
    if (before < 0)
        return 0;
    return (q - before) / ((double)w_ms / 1000.0);
}

/* Held requests' growth per second over the last HELD_RECENT_MS of the
 * wake (or since it began); 0 when unknown. */
static double held_growth(const struct policy_state *st, int64_t now_ms, double h)
{
    int64_t now_slot = slot_of(now_ms, HELD_SLOT_MS);
    int64_t back = HELD_RECENT_MS / HELD_SLOT_MS;
    int64_t oldest = now_slot;
    double then = -1;
    for (int i = 0; i < POLICY_HELD_SLOTS; i++) {
        int64_t s = st->held_slot[i];
        if (s == NO_SLOT || s >= now_slot || s < now_slot - back)
            continue;
        if (s < oldest) {
            oldest = s;
            then = st->held_hist[i];
        }
    }
    if (then < 0)
        return 0;
    double g = (h - then) / ((double)((now_slot - oldest) * HELD_SLOT_MS) / 1000.0);
    return g > 0 ? g : 0;
}

/* ---- tokens per request ------------------------------------------------------ */

/* Tokens per request over the recent episodes: their tokens over their
 * requests in total, so a large episode counts for more than a small one
 * (a ratio of totals; the median of per-episode ratios let the first two or
 * three small, noisy episodes set the wake sizes). An episode more than
 * KAPPA_OUTLIER x off the request-weighted median episode is left out: a
 * second burst whose tokens the rate showed but whose requests were never
 * counted. Weighted, the centre is where most requests are; an unweighted
 * median of two episodes is their mean, which an outlier always stays
 * within. Before any episode, or with totals that overflowed, 0. */
static double kappa_estimate(const struct policy_state *st)
{
    int n = st->nkappa;
    if (n == 0)
        return 0;
    /* Episode indices by ratio (at most POLICY_KAPPAS: insertion sort). */
    int order[POLICY_KAPPAS];
    double ratio[POLICY_KAPPAS], all = 0;
    for (int i = 0; i < n; i++) {
        ratio[i] = st->kappa_tokens[i] / st->kappa_requests[i];
        all += st->kappa_requests[i];
        int j = i;
        for (; j > 0 && ratio[order[j - 1]] > ratio[i]; j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    double centre = ratio[order[n - 1]], seen = 0;
    for (int k = 0; k < n; k++) {
        seen += st->kappa_requests[order[k]];
        if (seen * 2 >= all) {
            centre = ratio[order[k]];
            break;
        }
    }
    double tokens = 0, requests = 0;
    for (int i = 0; i < n; i++) {
        if (ratio[i] > KAPPA_OUTLIER * centre || ratio[i] * KAPPA_OUTLIER < centre)
            continue;
        tokens += st->kappa_tokens[i];
        requests += st->kappa_requests[i];
    }
    double k = tokens / requests; /* the centre itself is always in */
    return isfinite(k) && k > 0 ? k : 0;
}

static void kappa_record(const struct policy_params *p, struct policy_state *st, double tokens,
                         double requests)
{
    if (!(tokens > 0) || !isfinite(tokens) || !(requests > 0) || !isfinite(requests) ||
        !isfinite(tokens / requests))
        return;
    double prior = p->tokens_per_request;
    if (prior > 0 && (tokens / requests > prior * KAPPA_IMPLAUSIBLE ||
                      tokens / requests * KAPPA_IMPLAUSIBLE < prior))
        return;
    st->kappa_tokens[st->kappa_next] = tokens;
    st->kappa_requests[st->kappa_next] = requests;
    st->kappa_next = (st->kappa_next + 1) % POLICY_KAPPAS;
    if (st->nkappa < POLICY_KAPPAS)
        st->nkappa++;
}

double policy_tokens_per_request(const struct policy_params *p, const struct policy_state *st)
{
    if (!(p->tokens_per_request > 0))
        return 0;
    double kappa = kappa_estimate(st);
    return kappa > 0 && isfinite(kappa) ? kappa : p->tokens_per_request;
}

/* Whether a wake episode's backlog, before it is first gone, has grown past
 * what the episode counts (the held requests plus arrivals at lambda since the
 * release): the demand changed after the release (a step right after a wake),
 * and its tokens would be charged to too few requests (12x the real size on
 * one replay seed, which then sized every queue term 12x). Such an episode
 * teaches nothing. */
static bool episode_outgrown(const struct policy_state *st, int64_t now_ms, double backlog)
{
    double since_s = (double)(now_ms - st->wake_release_ms) / 1000.0;
    double counted = st->wake_peak_held + st->ep_lambda * (since_s > 0 ? since_s : 0);
    return backlog > counted + EPISODE_BACKLOG_Z * sqrt(counted) + EPISODE_BACKLOG_SLACK;
}

/* ---- keep-warm ------------------------------------------------------------- */

/* Ski rental with the gaps seen: the keep-warm time T minimising
 * sum_i (g_i <= T ? g_i : T + K), K = keep_warm_cost x cold start; T = K
 * before any gap (2-competitive without information). Candidates are 0,
 * every gap and the cap. Among equal costs the shortest T wins (it risks
 * least on a new, longer gap), except that keeping warm beats going cold
 * on a tie (fewer cold starts). */
static void keep_warm_update(const struct policy_params *p, struct policy_state *st)
{
    double k = p->keep_warm_cost * (double)p->cold_start_ms;
    /* A wake also costs the requests it holds; per replica kept warm. */
    if (p->wake_request_cost > 0 && st->nwake > 0) {
        double held = 0;
        for (int i = 0; i < st->nwake; i++)
            held += st->wake_held[i];
        held /= st->nwake;
        double kept = st->idle_replicas > 1 ? (double)st->idle_replicas : 1;
        k += p->wake_request_cost * 1000.0 * held / kept;
    }
    double cap = (double)p->keep_warm_max_ms;
    if (cap < 0)
        cap = 0;
    if (st->ngaps == 0) {
        st->keep_warm_ms = (int64_t)(k < cap ? k : cap);
        return;
    }
    double best_t = 0, best_cost = INFINITY;
    for (int c = -1; c <= st->ngaps; c++) {
        double t = c < 0 ? 0 : c == st->ngaps ? cap : (double)st->gaps_ms[c];
        if (t > cap)
            t = cap;
        double cost = 0;
        for (int i = 0; i < st->ngaps; i++) {
            double g = (double)st->gaps_ms[i];
            cost += g <= t ? g : t + k;
        }
        bool tie = fabs(cost - best_cost) <= 1e-6;
        if (cost < best_cost - 1e-6 || (tie && (best_t == 0 ? t > 0 : t < best_t))) {
            best_cost = cost;
            best_t = t;
        }
    }
    st->keep_warm_ms = (int64_t)best_t;
}

static void gap_record(const struct policy_params *p, struct policy_state *st, int64_t gap_ms)
{
    st->gaps_ms[st->gap_next] = gap_ms > INT32_MAX ? INT32_MAX : (int32_t)gap_ms;
    st->gap_next = (st->gap_next + 1) % POLICY_GAPS;
    if (st->ngaps < POLICY_GAPS)
        st->ngaps++;
    keep_warm_update(p, st);
}

/* ---- overloads ----------------------------------------------------------------- */

static void overload_record(struct policy_state *st, int64_t dur_ms)
{
    st->over_ms[st->over_next] = dur_ms > INT32_MAX ? INT32_MAX : (int32_t)dur_ms;
    st->over_next = (st->over_next + 1) % POLICY_OVERLOADS;
    if (st->nover < POLICY_OVERLOADS)
        st->nover++;
}

/* An overload that has lasted elapsed_ms is worth replicas a cold start
 * away when most past overloads that lasted as long went on for another
 * cold start (they would have arrived in time), or when none lasted as
 * long (something new: a step, not a burst). */
static bool overload_outlasts(const struct policy_params *p, const struct policy_state *st,
                              int64_t elapsed_ms)
{
    int as_long = 0, longer = 0;
    for (int i = 0; i < st->nover; i++) {
        if (st->over_ms[i] > elapsed_ms) {
            as_long++;
            if (st->over_ms[i] > elapsed_ms + p->cold_start_ms)
                longer++;
        }
    }
    return as_long == 0 || 2 * longer >= as_long;
}

/* Replicas for x replicas of work. With the batch size S known and steady
 * demand: requests wait when all S x n batch slots are busy, and with
 * Poisson-like arrivals the slots needed for a given chance of waiting grow
 * as load + beta x sqrt(load) (Halfin-Whitt). So one replica (16 slots)
 * needs 25 % headroom and ten need 8 %: a single utilisation target either
 * starves the small deployments or overpays the large ones. */
static double staffed(const struct policy_params *p, bool sqrt_staffed, double x)
{
    if (sqrt_staffed && x > 0)
        return x + p->staffing_beta * sqrt(x / p->replica_slots);
    return x;
}

/* ---- the decision ------------------------------------------------------------ */

void policy_decide(const struct policy_params *p, struct policy_state *st,
                   const struct policy_inputs *in, int64_t now_ms, struct policy_decision *out)
{
    double r = clean(in->token_rate), q = clean(in->queue), h = clean(in->held);
    /* Out of contract but kept defined: a time before 0 would index the
     * windows with a negative remainder, one near INT64_MAX overflow when a
     * window is added to it. Such times act as the nearest valid one. */
    if (now_ms < 0)
        now_ms = 0;
    else if (now_ms > POLICY_MAX_TIME_MS)
        now_ms = POLICY_MAX_TIME_MS;
    double u = p->target_utilisation > 0 && p->target_utilisation <= 1 ? p->target_utilisation : 1;
    /* Bursty demand: headroom does not absorb bursts of several times the
     * level (the queue and wake terms do), so less of it is kept. */
    bool demand_bursty = p->burst_cv > 0 && demand_cv(st, now_ms) > p->burst_cv;
    if (demand_bursty)
        st->bursty_seen_ms = now_ms;
    st->bursty = demand_bursty && p->bursty_utilisation > 0 && p->bursty_utilisation <= 1;
    if (st->bursty)
        u = p->bursty_utilisation;
    /* Steady demand on replicas whose batch size is known: the headroom is
     * square-root staffing in batch slots (below), not a share of C. */
    bool sqrt_staffed = !st->bursty && p->replica_slots > 0;
    if (sqrt_staffed)
        u = 1;
    st->utilisation = u;
    double cap = p->target_tokens_per_second * u;
    double qlen = p->target_queue_length;
    double cold_s = (double)p->cold_start_ms / 1000.0;
    if (st->keep_warm_ms < 0)
        keep_warm_update(p, st);
    double dt = st->last_call_ms == NO_TIME || now_ms < st->last_call_ms
                    ? 0
                    : (double)(now_ms - st->last_call_ms) / 1000.0;
    st->last_call_ms = now_ms;
    if (st->first_call_ms == NO_TIME)
        st->first_call_ms = now_ms;

    /* Held and queued requests are one backlog: a wake's release moves
     * requests from one to the other without any arriving. */
    queue_record(st, now_ms, q + h);

    /* Activity and the idle gaps between busy periods. */
    bool busy = r > p->activation_token_rate || q > p->activation_queue_length || h > 0;
    /* The token rate lags its window: requests released from a hold or a
     * queue are being served while r still shows nothing. A backlog seen
     * within the last rate window keeps the model busy, or the replicas
     * serving it would be scaled to zero (and a false idle gap learned). */
    if (q > p->activation_queue_length || h > 0)
        st->backlog_seen_ms = now_ms;
    if (!busy && st->backlog_seen_ms != NO_TIME &&
        now_ms - st->backlog_seen_ms < p->rate_window_ms)
        busy = true;
    /* When every request passes through the activators, they know the
     * moment the last one ends; the rate shows it a window (and a scrape)
     * later, with the replicas idle meanwhile. A count that is stale (Redis
     * failing: the fail-safe keeps the last decision) or unknown (an
     * activator went silent with requests) is not used: the rate decides. */
    bool by_activators = p->idle_by_activators && in->inflight_known && !in->held_stale;
    if (by_activators) {
        double carried = clean(in->inflight);
        if (carried > 0)
            st->carried_seen_ms = now_ms;
        /* Tokens the activators have not carried for longer than the rate
         * can lag: traffic they do not see. Scaling it to zero would cut
         * off clients the activators cannot hold. */
        int64_t carried_ms =
            st->carried_seen_ms != NO_TIME ? st->carried_seen_ms : st->first_call_ms;
        bool unseen = !in->token_rate_stale && r > p->activation_token_rate &&
                      now_ms - carried_ms > p->rate_window_ms + POLICY_ACTIVATORS_DISAGREE_MS;
        if (!unseen)
            busy = carried > 0 || q > p->activation_queue_length || h > 0 ||
                   (st->carried_seen_ms != NO_TIME &&
                    now_ms - st->carried_seen_ms < POLICY_ACTIVATORS_IDLE_MS);
    }
    if (busy && !st->busy) {
        if (st->seen_busy && st->idle_since_ms != NO_TIME)
            gap_record(p, st, now_ms - st->idle_since_ms);
        st->seen_busy = true;
    } else if (!busy && (st->busy || st->idle_since_ms == NO_TIME)) {
        st->idle_since_ms = now_ms;
        if (p->wake_request_cost > 0) {
            st->idle_replicas = st->has_decision ? st->last.desired : 1;
            keep_warm_update(p, st);
        }
        /* An episode ends at idle; one that never saw its backlog gone for
         * a rate window teaches nothing. Idle by the activators comes before
         * the rate has shown the episode's last tokens: an episode whose
         * backlog is gone runs on to its rate window (or the next wake). */
        if (!(by_activators && st->ep_empty_ms != NO_TIME))
            st->episode = false;
    }
    st->busy = busy;

    /* Wakes: held requests mean nothing is ready to serve them. */
    if (h > 0) {
        if (!st->waking) {
            st->waking = true;
            st->wake_start_ms = now_ms;
            st->wake_peak_held = 0;
            for (int i = 0; i < POLICY_HELD_SLOTS; i++)
                st->held_slot[i] = NO_SLOT;
            /* One still waiting for its rate window (it outlived an idle
             * moment seen by the activators) would take this wake's tokens
             * as its own. */
            if (by_activators && st->episode && st->ep_empty_ms != NO_TIME)
                st->episode = false;
            st->ep_empty_ms = NO_TIME;
            if (!st->episode) {
                st->episode = true;
                st->ep_tokens = 0;
                st->ep_requests = 0;
            }
        }
        if (h > st->wake_peak_held)
            st->wake_peak_held = h;
        st->wake_lambda = held_growth(st, now_ms, h);
        int32_t hs = slot_of(now_ms, HELD_SLOT_MS);
        st->held_slot[slot_index(hs, POLICY_HELD_SLOTS)] = hs;
        st->held_hist[slot_index(hs, POLICY_HELD_SLOTS)] = (float)h;
    } else if (st->waking) {
        st->waking = false;
        st->wake_release_ms = now_ms;
        st->ep_requests += st->wake_peak_held;
        st->ep_lambda = st->wake_lambda;
        st->ep_empty_ms = NO_TIME;
        st->wake_held[st->wake_next] = st->wake_peak_held;
        st->wake_next = (st->wake_next + 1) % POLICY_WAKES;
        if (st->nwake < POLICY_WAKES)
            st->nwake++;
    }
    if (st->episode)
        st->ep_tokens += r * dt;
    /* The episode's requests are the held ones plus those arriving after
     * the release at the rate they were arriving at it, until the backlog
     * is first gone; its tokens are what the rate shows until then, plus
     * one rate window for the rate to catch up. Later tokens belong to
     * requests not counted. */
    if (st->episode && !st->waking && st->wake_release_ms != NO_TIME) {
        if (st->ep_empty_ms == NO_TIME && episode_outgrown(st, now_ms, q + h))
            st->episode = false;
        else if (q + h <= 0 && st->ep_empty_ms == NO_TIME)
            st->ep_empty_ms = now_ms;
        if (st->episode && st->ep_empty_ms != NO_TIME &&
            now_ms - st->ep_empty_ms >= p->rate_window_ms) {
            double after_s = (double)(st->ep_empty_ms - st->wake_release_ms) / 1000.0;
            double n = st->ep_requests + st->ep_lambda * (after_s > 0 ? after_s : 0);
            kappa_record(p, st, st->ep_tokens, n);
            st->episode = false;
        }
    }

    struct policy_decision d = {0};
    /* Without a request-size model (tokens_per_request 0) the queue and the
     * held requests are only counted, as in policy v1. */
    bool counts_only = !(p->tokens_per_request > 0);
    double kappa = policy_tokens_per_request(p, st);

    /* Demand by conservation over the rate window W: what arrived is what
     * was served (the rate r) plus what queued up meanwhile, so
     *   D = r + kappa x (q(now) - q(now - W)) / W   tokens/s.
     * While a queue builds r is capped by capacity and D adds the growth;
     * while it drains r is inflated by the backlog and D takes it out. */
    double dq = queue_growth(st, now_ms, p->rate_window_ms, q + h);
    double demand = r + kappa * dq;
    if (demand < 0)
        demand = 0;
    /* The trend is the demand's; the first rate window after start is left
     * out, when the rate is still filling its window and looks like growth. */
    if (now_ms - st->first_call_ms >= p->rate_window_ms)
        rate_record(st, now_ms, demand);
    double d_fc = cap > 0 ? rate_forecast(p, st, now_ms, demand, cap) / cap : 0;
    long by_rate = cap > 0 ? ceil_replicas(staffed(p, sqrt_staffed, r / cap)) : 0;
    double base = staffed(p, sqrt_staffed, d_fc);
    if (base > d_fc)
        st->utilisation = d_fc / base;
    long level = ceil_replicas(base);

    /* The backlog itself: a queue that persisted over the queue window is
     * cleared within drain_time_factor cold starts, unless a wake just
     * released it (the wake term was sized for it) or it drains by itself
     * before a new replica could be ready. */
    double q_sust = queue_sustained(queue_window(p), st, now_ms, q + h);
    bool grace = st->waking || (st->wake_release_ms != NO_TIME &&
                                now_ms - st->wake_release_ms < p->cold_start_ms);
    /* Overloads (backlog above Q outside wakes) and their durations. */
    bool over = !grace && qlen > 0 && q + h > qlen;
    if (over && st->over_since_ms == NO_TIME)
        st->over_since_ms = now_ms;
    else if (!over && st->over_since_ms != NO_TIME) {
        overload_record(st, now_ms - st->over_since_ms);
        st->over_since_ms = NO_TIME;
    }
    /* Panic: a backlog that lasted the panic window counts before the
     * queue window when this overload is likely to outlast a cold start.
     * Once decided it holds until the overload ends: an overload that
     * scaling cut short is recorded short, so the history would otherwise
     * call off the panic of the next step halfway through. No panic starts
     * while the demand is bursty: its overloads are the bursts the history
     * cannot sort out (on the code trace panic cost 8 SLO points through a
     * keep-warm change it set off). */
    if (!over || p->panic_window_ms <= 0)
        st->over_panic = false;
    int64_t qwin = queue_window(p);
    bool panicking = false;
    if (p->panic_window_ms > 0 && p->panic_window_ms < qwin && over &&
        now_ms - st->over_since_ms >= p->panic_window_ms) {
        if (!st->over_panic && !st->bursty) {
            st->over_panic = overload_outlasts(p, st, now_ms - st->over_since_ms);
            st->panic_since_ms = now_ms;
        }
        if (st->over_panic) {
            double qp = queue_sustained(p->panic_window_ms, st, now_ms, q + h);
            if (qp > q_sust) {
                q_sust = qp;
                qwin = p->panic_window_ms;
                panicking = true;
            }
        }
    }
    if (grace || queue_drains_alone(p, st, now_ms, q + h))
        q_sust = 0;
    double extra = 0;
    if (q_sust > 0 && cap > 0) {
        /* A queue that keeps growing over the window means demand exceeds
         * capacity now, well before the rate window shows it. In a panic,
         * with late requests sent last, the growth is the overload's so far
         * (at most PANIC_GROWTH_MAX_MS): over the short panic window it is
         * mostly arrival noise and the 2 s history slots, which the
         * look-ahead below multiplies by up to a cold start, so the ask
         * jumped by several replicas a second. Under FIFO every request
         * waits behind the backlog, and the surge hold's highest sample of
         * that noise clears it sooner: measured smoothed there, steps lost
         * SLO (docs/scaling-policy.md, "What changed"). */
        int64_t growth_ms = qwin;
        if (panicking && p->late_after_ms > 0) {
            growth_ms = now_ms - st->over_since_ms;
            if (growth_ms > PANIC_GROWTH_MAX_MS)
                growth_ms = PANIC_GROWTH_MAX_MS;
            /* (a panic has lasted at least qwin, its window, by now) */
            if (queue_at(st, now_ms, growth_ms) < 0)
                growth_ms = qwin; /* no reading that old */
        }
        double g = queue_growth(st, now_ms, growth_ms, q + h);
        double fast = (r + kappa * (g > 0 ? g : 0)) / cap;
        if (fast > d_fc)
            extra = fast - d_fc;
        /* In a panic the replicas asked for arrive a cold start later, to
         * a backlog that grew meanwhile: clear that growth too (the wake
         * term does the same with held requests). The horizon is when the
         * replicas asked for at the panic's start arrive, not a cold start
         * from each call: the later asks would arrive after the first ones
         * had cleared the backlog, started for nothing. */
        if (panicking && g > 0) {
            double ahead_s = cold_s - (double)(now_ms - st->panic_since_ms) / 1000.0;
            if (ahead_s > cold_s) /* a clock that went back */
                ahead_s = cold_s;
            if (ahead_s < p->panic_lookahead * cold_s)
                ahead_s = p->panic_lookahead * cold_s;
            q_sust += g * ahead_s;
        }
        /* Up to Q queued requests are tolerated: they drain by themselves;
         * the rest is cleared within drain_time_factor cold starts. When
         * the activators send late requests last, a backlog no longer
         * delays the requests behind it, only itself: its requests have
         * missed their objective already and the spare capacity of the
         * level serves them; clearing it fast would pay GPUs for nothing,
         * so it only has to be gone well before the hold timeout. */
        if (q_sust > qlen) {
            double drain_s = p->drain_time_factor * cold_s;
            if (p->late_after_ms > 0 && drain_s < (double)p->late_clear_ms / 1000.0)
                drain_s = (double)p->late_clear_ms / 1000.0;
            if (drain_s < 1)
                drain_s = 1;
            extra += (q_sust - qlen) * kappa / (cap * drain_s);
        }
    }
    long surge = ceil_replicas(base + extra);
    if (counts_only) {
        long by_queue = qlen > 0 ? ceil_replicas(q / qlen) : 0;
        surge = by_queue > level ? by_queue : level;
    }

    /* The wake term: held requests arrive at lambda; that is
     * lambda x kappa / (C u) replicas. */
    long wake = 0;
    if (st->waking) {
        /* Held requests' objective is their arrival plus a cold start, so
         * the backlog at release (what is held plus the recent growth for
         * the rest of the cold start) may be served over one cold start; on
         * top, arrivals continuing at the recent growth rate. A burst that
         * ended stops growing and needs little. */
        double t_s = (double)(now_ms - st->wake_start_ms) / 1000.0;
        double growth = held_growth(st, now_ms, h);
        double left_s = cold_s - t_s > 0 ? cold_s - t_s : 0;
        double at_release = h + growth * left_s;
        double due_s = cold_s > 1 ? cold_s : 1;
        wake = cap > 0 ? ceil_replicas((growth + p->wake_backlog_share * at_release / due_s) *
                                       kappa / cap)
                       : 1;
        if (wake < 1 || counts_only)
            wake = 1;
    } else if (!counts_only && cap > 0 && st->wake_release_ms != NO_TIME &&
               now_ms - st->wake_release_ms < p->rate_window_ms) {
        /* For a rate window after the release the rate cannot show the
         * released requests' demand (the level falls back to what it saw
         * before the wake, often nothing): the held requests' arrival rate
         * at the release stands in for it, held like a surge. */
        wake = ceil_replicas(staffed(p, sqrt_staffed, st->ep_lambda * kappa / cap));
    }

    d.raw = level > surge ? level : surge;
    if (wake > d.raw)
        d.raw = wake;
    d.reason = d.raw == 0                       ? POLICY_REASON_IDLE
               : wake >= d.raw && wake > surge ? POLICY_REASON_HELD
               : surge > level                 ? POLICY_REASON_QUEUE
               : level > by_rate               ? POLICY_REASON_FORECAST
                                               : POLICY_REASON_TOKEN_RATE;

    /* Idle but inside the keep-warm time: active, at least one replica (more
     * while the scale-down window still holds them). */
    bool warm = !busy && st->seen_busy && st->idle_since_ms != NO_TIME &&
                now_ms - st->idle_since_ms < st->keep_warm_ms;
    d.active = busy || warm;

    /* A lull in bursty demand is followed by the next burst: scaling down
     * into it costs a cold start. Steady demand that falls has fallen:
     * holding its old level only burns GPU-seconds. The bursty verdict is
     * held for one burst window so the window does not flap with it. What
     * the steady window has let go stays gone when the longer one returns:
     * a fall of 10x itself reads as bursty a few minutes later, and must
     * not bring back the level from before it. */
    int64_t down_span = p->scale_down_window_ms;
    if (p->bursty_scale_down_window_ms > down_span)
        down_span = p->bursty_scale_down_window_ms;
    bool recently_bursty = st->bursty_seen_ms != NO_TIME &&
                           now_ms - st->bursty_seen_ms <= POLICY_BURST_WINDOW_MS;
    if (!recently_bursty && (st->level_floor_ms == NO_TIME ||
                             now_ms - p->scale_down_window_ms > st->level_floor_ms))
        st->level_floor_ms = now_ms - p->scale_down_window_ms;
    st->down_window_ms = p->scale_down_window_ms;
    if (recently_bursty) {
        st->down_window_ms = down_span;
        if (st->level_floor_ms != NO_TIME && now_ms - st->level_floor_ms < down_span)
            st->down_window_ms = now_ms - st->level_floor_ms;
    }
    long held_level = window_max(&st->level, down_span, st->down_window_ms, now_ms, level);
    long held_surge = window_max(&st->surge, p->surge_hold_ms, p->surge_hold_ms, now_ms,
                                 surge > wake ? surge : wake);
    d.desired = held_level > held_surge ? held_level : held_surge;
    if (d.desired < d.raw)
        d.desired = d.raw;
    if (d.desired > d.raw)
        d.reason = POLICY_REASON_STABILIZING;
    if (!d.active && !counts_only) {
        /* Going to zero: what the windows held no longer counts, and the
         * reason is being idle, not the window that held the last answer. */
        d.desired = 0;
        d.reason = POLICY_REASON_IDLE;
        window_clear(&st->level);
        window_clear(&st->surge);
    } else if (d.active && d.desired < 1) {
        d.desired = 1;
        d.reason = POLICY_REASON_KEEP_WARM;
    }

    /* A floor from before a restart stands in for the windows it forgot,
     * until they would have let it go; a model seen busy and then idle since
     * went to zero as it would have anyway (not with counts only: going
     * inactive there clears no window). */
    if (st->restore_until_ms != NO_TIME &&
        (now_ms >= st->restore_until_ms || (!counts_only && st->seen_busy && !d.active)))
        st->restore_until_ms = NO_TIME;
    if (st->restore_until_ms != NO_TIME) {
        /* With counts only (v1) an idle model keeps its window's answer
         * while inactive: that answer says nothing of being active. */
        if (!counts_only)
            d.active = true;
        if (d.desired < st->restore_floor) {
            d.desired = st->restore_floor;
            d.reason = POLICY_REASON_RESTORED;
        }
    }

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
