#include "sim.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

static const char *const kind_names[SIM_KIND_COUNT] = {"thaw", "keda-hpa", "knative-kpa",
                                                        "oracle", "thaw-v1"};

const char *sim_kind_to_str(enum sim_kind k)
{
    return (k >= 0 && k < SIM_KIND_COUNT) ? kind_names[k] : "unknown";
}

int sim_kind_parse(const char *s)
{
    for (int i = 0; i < SIM_KIND_COUNT; i++)
        if (strcmp(s, kind_names[i]) == 0)
            return i;
    return -1;
}

void sim_config_defaults(struct sim_config *c, enum sim_kind kind)
{
    memset(c, 0, sizeof(*c));
    c->kind = kind;
    c->cluster = (struct sim_cluster){
        .cold_start_s = 120, .slots = 16, .decode_tps = 400, .prefill_tps = 8000,
        .prefill_chunk = 2048, .max_replicas = 100,
    };
    c->sig = (struct sim_signals){
        .scrape_s = 15, .rate_window_s = 60, .prom_query_s = 5, .redis_s = 1,
        .wake_hold_s = 5,
        /* A prompt token costs decode_tps / prefill_tps of a generated one. */
        .prompt_weight = c->cluster.decode_tps / c->cluster.prefill_tps,
    };
    /* KEDA and HPA defaults (REFERENCE.md). */
    c->keda = (struct sim_keda){
        .polling_s = 30, .cooldown_s = 300, .hpa_sync_s = 15, .hpa_tolerance = 0.1,
        .hpa_down_window_s = 300, .hpa_up_percent = 100, .hpa_up_pods = 4,
    };
    policy_params_defaults(&c->thaw);
    /* thaw's targetTokensPerSecond is what one replica sustains (its
     * capacity in decode-equivalent tokens/s) and targetQueueLength its
     * batch; the policy plans for target_utilisation of that. An HPA
     * threshold is a target with headroom: 75 % of capacity, near KPA's
     * 70 % default utilisation. */
    c->thaw.target_tokens_per_second = c->cluster.decode_tps;
    c->thaw.target_queue_length = c->cluster.slots;
    c->thaw.replica_slots = c->cluster.slots; /* replicaConcurrency = --max-num-seqs */
    c->thaw.cold_start_ms = (int64_t)(c->cluster.cold_start_s * 1000);
    c->keda_target_tps = 0.75 * c->cluster.decode_tps;
    if (kind == SIM_THAW_V1) {
        int64_t cold = c->thaw.cold_start_ms;
        policy_params_v1(&c->thaw);
        c->thaw.target_tokens_per_second = c->cluster.decode_tps;
        c->thaw.target_queue_length = c->cluster.slots;
        c->thaw.cold_start_ms = cold;
    }
    if (kind == SIM_THAW || kind == SIM_THAW_V1) {
        /* The ScaledObject thaw documents: its own stabilization and
         * keep-warm decide, so HPA's window and KEDA's cooldown are 0. */
        c->keda.hpa_down_window_s = 0;
        /* ... and its scale-up policies allow 10x or +8 pods per sync. */
        c->keda.hpa_up_percent = 900;
        c->keda.hpa_up_pods = 8;
        c->keda.cooldown_s = 0;
        c->keda.polling_s = 10;
        /* thaw's activators send late requests last (the example config's
         * lateAfterSeconds 1.5 s: the 2 s objective less about what most
         * first tokens take when sent at once, 0.55 s at p95 of the
         * conversation trace's prompts; chosen from the benchmark,
         * docs/scaling-policy.md), and publish it to the scaler with their
         * queue. */
        c->late_after_s = 1.5;
        if (kind == SIM_THAW) {
            c->thaw.late_after_ms = 1500;
            /* Every request passes through the activators (idleSignal:
             * activators in the example ScaledObject). */
            c->thaw.idle_by_activators = true;
        }
    }
    /* Knative KPA defaults; the per-pod target is the batch size at the
     * default 70 % target utilisation. */
    c->kpa = (struct sim_kpa){
        .target = 0.7 * c->cluster.slots, .stable_s = 60, .panic_s = 6, .panic_threshold = 2.0,
        .max_up_rate = 1000, .max_down_rate = 2, .tick_s = 2, .grace_s = 30,
    };
    c->slo_warm_s = 2;
    c->warm_start = true;
    c->oracle_bin_s = 5;
}

/* ---- state ---------------------------------------------------------------- */

enum rstate { R_STARTING = 0, R_READY, R_DRAINING, R_GONE };

#define PROM_RING 16

/* One admitted sequence. */
struct seq {
    int req;
    int prefill_left; /* prompt tokens not yet prefilled */
    int decoded;      /* tokens generated so far (the first comes with prefill) */
    int step_pf;      /* prompt tokens in the running step */
    bool step_dec;    /* decodes one token in the running step */
};

struct replica {
    enum rstate state;
    double created, ready_at, gone_at;
    struct seq *seqs; /* admission order, at most `slots` */
    int nseq;
    bool stepping;
    double tokens_done; /* counter contribution of completed requests */
    double work;        /* decode-equivalent tokens processed */
    double st[PROM_RING], sv[PROM_RING];
    int sn, shead;
};

enum ev_type {
    EV_STEP = 0, EV_READY, EV_SCRAPE, EV_PROMQ, EV_REDIS, EV_HPA, EV_KEDA_POLL, EV_KPA_BUCKET,
    EV_KPA_TICK, EV_ORACLE, EV_TIMELINE,
};

struct ev {
    double t;
    uint64_t seq;
    int type;
    int a;
};

struct oevent {
    double t;
    int count;
};

#define HPA_RECS 128
#define KPA_BUCKETS 600

struct sim {
    const struct trace *tr;
    const struct sim_config *cfg;
    struct sim_result *res;
    double now, per_seq;

    struct ev *heap;
    size_t nheap, capheap;
    uint64_t seq;

    struct replica *reps;
    size_t nreps, capreps;
    int alive; /* starting + ready: the Deployment's replicas */
    int ready; /* ready, not draining */

    size_t next_arr, qhead, done;
    /* late_after_s > 0: requests before held_end arrived before ready_since
     * (held through the wake); the first of them and the first after them
     * not yet late. */
    size_t held_end, held_ontime, ontime;
    size_t nwaiting; /* arrived, not admitted */
    unsigned char *taken;
    double ready_since;  /* when the first of the ready replicas became ready */
    double allowance;    /* the wake's length, added to held requests' clocks */
    double unready_since; /* when the last ready replica went (0: from the start) */
    double *admit_since; /* ready_since when each request was admitted (checks) */
    double *admit_allowance; /* allowance then (checks) */
    double *start, *first, *fin;
    int *rep;
    unsigned char *cold;
    double *ttft;
    double slo_warm_s;

    /* Signals as the scalers see them. */
    double rate_obs, queue_obs, held_obs, inflight_obs, wake_until;
    /* Concurrency (in flight, held included) integrated over time for KPA. */
    double conc_area, conc_t, conc_bucket_start;
    double kpa_buckets[KPA_BUCKETS];
    size_t kpa_nb;
    double kpa_panic_time; /* < 0: not panicking */
    int kpa_max_panic;
    double kpa_zero_since; /* < 0: desired not 0 */

    /* thaw */
    struct policy_state ps;
    struct policy_decision dec;
    bool has_dec;
    /* KEDA + HPA */
    double keda_last_active;
    double hpa_t[HPA_RECS];
    long hpa_v[HPA_RECS];
    size_t hpa_n, hpa_head;

    struct oevent *oplan;
    size_t noplan;
};

static void violation(struct sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void violation(struct sim *s, const char *fmt, ...)
{
    if (s->res->violations++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->res->violation, sizeof(s->res->violation), fmt, ap);
        va_end(ap);
    }
}

/* ---- event heap ------------------------------------------------------------ */

static bool ev_before(const struct ev *a, const struct ev *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static int ev_push(struct sim *s, double t, int type, int a)
{
    if (s->nheap == s->capheap) {
        size_t ncap = s->capheap ? s->capheap * 2 : 1024;
        struct ev *h = thaw_realloc(s->heap, ncap * sizeof(*h));
        if (!h)
            return -1;
        s->heap = h;
        s->capheap = ncap;
    }
    size_t i = s->nheap++;
    struct ev e = {t, s->seq++, type, a};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ev_before(&e, &s->heap[p]))
            break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = e;
    return 0;
}

static struct ev ev_pop(struct sim *s)
{
    struct ev top = s->heap[0];
    struct ev last = s->heap[--s->nheap];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const struct ev *best = &last;
        if (l < s->nheap && ev_before(&s->heap[l], best)) {
            m = l;
            best = &s->heap[l];
        }
        if (r < s->nheap && ev_before(&s->heap[r], best))
            m = r;
        if (m == i)
            break;
        s->heap[i] = s->heap[m];
        i = m;
    }
    if (s->nheap > 0)
        s->heap[i] = last;
    return top;
}

/* ---- cluster --------------------------------------------------------------- */

static size_t inflight(const struct sim *s)
{
    return s->next_arr - s->done;
}

/* Concurrency integral, advanced before every change of the in-flight count. */
static void conc_advance(struct sim *s)
{
    s->conc_area += (double)inflight(s) * (s->now - s->conc_t);
    s->conc_t = s->now;
}

/* Requests not yet scheduled: the FIFO plus admitted ones whose prefill has
 * not begun (vLLM's num_requests_waiting). */
static size_t waiting(const struct sim *s)
{
    size_t w = s->nwaiting;
    for (size_t r = 0; r < s->nreps; r++) {
        const struct replica *rp = &s->reps[r];
        if (rp->state != R_READY && rp->state != R_DRAINING)
            continue;
        for (int k = 0; k < rp->nseq; k++)
            if (rp->seqs[k].prefill_left == s->tr->reqs[rp->seqs[k].req].ctx &&
                rp->seqs[k].step_pf == 0)
                w++;
    }
    return w;
}

/* The token counter the scaler's query reads: generated tokens plus
 * prompt_weight x prefilled prompt tokens, as of the last finished step. */
static double counter_at(const struct sim *s, const struct replica *rp)
{
    double v = rp->tokens_done, pw = s->cfg->sig.prompt_weight;
    for (int k = 0; k < rp->nseq; k++) {
        const struct seq *q = &rp->seqs[k];
        v += q->decoded + pw * (s->tr->reqs[q->req].ctx - q->prefill_left);
    }
    return v;
}

/* Plans and schedules the replica's next iteration: one token for every
 * decoding sequence plus up to prefill_chunk prompt tokens, FIFO. Its
 * length is slots / decode_tps (a full batch decodes at decode_tps) plus
 * the chunk at prefill_tps. Idle replicas do not step. */
static int step_start(struct sim *s, size_t r)
{
    struct replica *rp = &s->reps[r];
    const struct sim_cluster *c = &s->cfg->cluster;
    int budget = c->prefill_chunk, ndec = 0, pf = 0;
    for (int k = 0; k < rp->nseq; k++) {
        struct seq *q = &rp->seqs[k];
        q->step_dec = q->prefill_left == 0;
        ndec += q->step_dec;
        q->step_pf = 0;
        if (q->prefill_left > 0 && budget > 0) {
            q->step_pf = q->prefill_left < budget ? q->prefill_left : budget;
            budget -= q->step_pf;
            pf += q->step_pf;
        }
    }
    if (ndec == 0 && pf == 0) {
        rp->stepping = false;
        return 0;
    }
    double tau = c->slots / c->decode_tps + pf / c->prefill_tps;
    rp->stepping = true;
    rp->work += ndec + pf * (c->decode_tps / c->prefill_tps);
    return ev_push(s, s->now + tau, EV_STEP, (int)r);
}

static int admit(struct sim *s, size_t i, size_t r)
{
    struct replica *rp = &s->reps[r];
    const struct trace_req *q = &s->tr->reqs[i];
    if (rp->state != R_READY || rp->nseq >= s->cfg->cluster.slots || q->t > s->now + 1e-9)
        violation(s, "request %zu admitted to replica %zu in state %d with %d sequences", i, r,
                  rp->state, rp->nseq);
    s->start[i] = s->now;
    s->rep[i] = (int)r;
    s->taken[i] = 1;
    s->admit_since[i] = s->ready_since;
    s->admit_allowance[i] = s->allowance;
    s->nwaiting--;
    rp->seqs[rp->nseq++] = (struct seq){.req = (int)i, .prefill_left = q->ctx};
    return rp->stepping ? 0 : step_start(s, r);
}

static int pending_prefill(const struct sim *s, const struct replica *rp)
{
    int n = 0;
    for (int k = 0; k < rp->nseq; k++)
        n += rp->seqs[k].prefill_left;
    (void)s;
    return n;
}

/* When request i's lateness clock started, ready since rs with allowance a:
 * its arrival, plus the wake's length a if it arrived before rs (held through
 * the wake; the activator's holdq.h). */
static double clock_start(const struct sim *s, size_t i, double rs, double a)
{
    double t = s->tr->reqs[i].t;
    return t < rs ? t + a : t;
}

/* Moves qhead past admitted requests to the oldest one still waiting. */
static void skip_taken(struct sim *s)
{
    while (s->qhead < s->next_arr && s->taken[s->qhead])
        s->qhead++;
}

/* The next request to admit, or SIZE_MAX. FIFO; with late_after_s > 0 (the
 * activator's lateAfterSeconds), requests whose clock started longer ago
 * than that (see clock_start) go behind those still on time, and those on
 * time go by their clocks: a late request has missed its objective already,
 * and serving it first makes the next one late too. The activator's
 * holdq_pop_fresh_first, without tiers. Clocks grow with arrival among the
 * held requests and among the rest, so a cursor per part finds its first
 * request on time. */
static size_t next_waiting(struct sim *s)
{
    skip_taken(s);
    if (s->qhead >= s->next_arr)
        return SIZE_MAX;
    double late = s->cfg->late_after_s;
    if (late <= 0)
        return s->qhead;
    double rs = s->ready_since, a = s->allowance;
    if (s->held_ontime < s->qhead)
        s->held_ontime = s->qhead;
    while (s->held_ontime < s->held_end &&
           (s->taken[s->held_ontime] || clock_start(s, s->held_ontime, rs, a) < s->now - late))
        s->held_ontime++;
    size_t rest = s->held_end > s->qhead ? s->held_end : s->qhead;
    if (s->ontime < rest)
        s->ontime = rest;
    while (s->ontime < s->next_arr &&
           (s->taken[s->ontime] || clock_start(s, s->ontime, rs, a) < s->now - late))
        s->ontime++;
    bool held = s->held_ontime < s->held_end, newer = s->ontime < s->next_arr;
    if (held && newer)
        return clock_start(s, s->ontime, rs, a) < clock_start(s, s->held_ontime, rs, a)
                   ? s->ontime
                   : s->held_ontime;
    return held ? s->held_ontime : newer ? s->ontime : s->qhead;
}

/* next_waiting's answer by its definition: a scan of every waiting request. */
static size_t next_waiting_by_scan(const struct sim *s)
{
    size_t best = SIZE_MAX, oldest = SIZE_MAX;
    double best_clock = 0, late = s->cfg->late_after_s;
    for (size_t i = 0; i < s->next_arr; i++) {
        if (s->taken[i])
            continue;
        if (oldest == SIZE_MAX)
            oldest = i;
        if (late <= 0)
            return i;
        double c = clock_start(s, i, s->ready_since, s->allowance);
        if (!(c < s->now - late) && (best == SIZE_MAX || c < best_clock)) {
            best = i;
            best_clock = c;
        }
    }
    return best != SIZE_MAX ? best : oldest;
}

/* Admits waiting requests while a ready replica has a free slot, to the one
 * with the least prompt work pending (then the fewest sequences). */
static int dispatch(struct sim *s)
{
    for (;;) {
        size_t i = next_waiting(s);
        if (s->cfg->check_order) {
            size_t want = next_waiting_by_scan(s);
            if (i != want)
                violation(s, "request %zu picked at %.3f, not %zu", i, s->now, want);
        }
        if (i == SIZE_MAX)
            break;
        size_t best = SIZE_MAX;
        int best_pf = 0;
        for (size_t r = 0; r < s->nreps; r++) {
            const struct replica *rp = &s->reps[r];
            if (rp->state != R_READY || rp->nseq >= s->cfg->cluster.slots)
                continue;
            int pf = pending_prefill(s, rp);
            if (best == SIZE_MAX || pf < best_pf ||
                (pf == best_pf && rp->nseq < s->reps[best].nseq)) {
                best = r;
                best_pf = pf;
            }
        }
        if (best == SIZE_MAX)
            break;
        if (admit(s, i, best) != 0)
            return -1;
    }
    return 0;
}

static void replica_gone(struct sim *s, struct replica *rp)
{
    rp->state = R_GONE;
    rp->gone_at = s->now;
}

static int add_replica(struct sim *s, double delay)
{
    const struct sim_cluster *c = &s->cfg->cluster;
    if (s->nreps == s->capreps) {
        size_t ncap = s->capreps ? s->capreps * 2 : 64;
        struct replica *v = thaw_realloc(s->reps, ncap * sizeof(*v));
        if (!v)
            return -1;
        s->reps = v;
        s->capreps = ncap;
    }
    struct replica *rp = &s->reps[s->nreps];
    memset(rp, 0, sizeof(*rp));
    rp->seqs = thaw_calloc((size_t)c->slots, sizeof(*rp->seqs));
    if (!rp->seqs)
        return -1;
    rp->state = R_STARTING;
    rp->created = s->now;
    rp->ready_at = s->now + delay;
    rp->gone_at = INFINITY;
    if (ev_push(s, rp->ready_at, EV_READY, (int)s->nreps) != 0) {
        thaw_free(rp->seqs);
        return -1;
    }
    s->nreps++;
    if (s->alive == 0)
        s->res->wakes++;
    s->alive++;
    s->res->replica_starts++;
    if (s->alive > s->res->peak_replicas)
        s->res->peak_replicas = s->alive;
    return 0;
}

/* Sets the Deployment's replica count, as the HPA, KEDA or KPA would. */
static int scale_to(struct sim *s, long n)
{
    const struct sim_cluster *c = &s->cfg->cluster;
    if (n > c->max_replicas)
        n = c->max_replicas;
    if (n < 0)
        n = 0;
    while (s->alive < n)
        if (add_replica(s, c->cold_start_s) != 0)
            return -1;
    while (s->alive > n) {
        /* Like a ReplicaSet: not-ready pods go first (newest first), then
         * the ready one with the least work. */
        size_t victim = SIZE_MAX;
        for (size_t r = s->nreps; r-- > 0;) {
            if (s->reps[r].state == R_STARTING) {
                victim = r;
                break;
            }
        }
        if (victim == SIZE_MAX) {
            for (size_t r = 0; r < s->nreps; r++) {
                if (s->reps[r].state != R_READY)
                    continue;
                if (victim == SIZE_MAX || s->reps[r].nseq <= s->reps[victim].nseq)
                    victim = r;
            }
        }
        if (victim == SIZE_MAX)
            break;
        struct replica *rp = &s->reps[victim];
        if (rp->state == R_READY && --s->ready == 0)
            s->unready_since = s->now;
        if (rp->state == R_STARTING || rp->nseq == 0)
            replica_gone(s, rp);
        else
            rp->state = R_DRAINING;
        s->alive--;
    }
    return 0;
}

/* ---- signals ---------------------------------------------------------------- */

static void scrape(struct sim *s)
{
    for (size_t r = 0; r < s->nreps; r++) {
        struct replica *rp = &s->reps[r];
        if (rp->state != R_READY && rp->state != R_DRAINING)
            continue;
        int idx = (rp->shead + rp->sn) % PROM_RING;
        if (rp->sn == PROM_RING) {
            rp->shead = (rp->shead + 1) % PROM_RING;
            idx = (rp->shead + PROM_RING - 1) % PROM_RING;
        } else {
            rp->sn++;
        }
        rp->st[idx] = s->now;
        rp->sv[idx] = counter_at(s, rp);
    }
}

/* Prometheus rate(counter[window]) at now, summed over replicas: the
 * extrapolation of promql's extrapolatedRate (counters never reset here). */
static double prom_rate(const struct sim *s)
{
    double w = s->cfg->sig.rate_window_s, lo = s->now - w, sum = 0;
    for (size_t r = 0; r < s->nreps; r++) {
        const struct replica *rp = &s->reps[r];
        int n = 0;
        double ft = 0, fv = 0, lt = 0, lv = 0;
        for (int k = 0; k < rp->sn; k++) {
            int idx = (rp->shead + k) % PROM_RING;
            if (rp->st[idx] <= lo || rp->st[idx] > s->now)
                continue;
            if (n == 0) {
                ft = rp->st[idx];
                fv = rp->sv[idx];
            }
            lt = rp->st[idx];
            lv = rp->sv[idx];
            n++;
        }
        if (n < 2)
            continue;
        double delta = lv - fv, sampled = lt - ft;
        double avg = sampled / (n - 1), thr = avg * 1.1;
        double to_start = ft - lo, to_end = s->now - lt;
        if (delta > 0 && fv >= 0) {
            double to_zero = sampled * (fv / delta);
            if (to_zero < to_start)
                to_start = to_zero;
        }
        double interval = sampled;
        interval += to_start < thr ? to_start : avg / 2;
        interval += to_end < thr ? to_end : avg / 2;
        sum += delta * (interval / sampled) / w;
    }
    return sum;
}

static void observe_queue(struct sim *s)
{
    /* What the activators publish: requests not yet sent to a replica,
     * held while nothing is ready, else queued at the concurrency cap
     * (maxConcurrencyPerEndpoint = the batch slots). Requests a replica
     * admitted but has not started are the replica's business. */
    double w = (double)s->nwaiting;
    s->held_obs = s->ready == 0 ? w : 0;
    s->queue_obs = s->ready == 0 ? 0 : w;
    /* ... and, with idleSignal activators, every request they carry. */
    s->inflight_obs = (double)inflight(s);
}

/* ---- HPA ------------------------------------------------------------------- */

static void hpa_reset(struct sim *s)
{
    s->hpa_n = s->hpa_head = 0;
}

/* One HPA sync for an AverageValue metric: proposal with tolerance, then the
 * default behaviour (scale-up limits, scale-down stabilization window). */
static long hpa_step(struct sim *s, double metric, double target)
{
    const struct sim_keda *k = &s->cfg->keda;
    long cur = s->alive;
    long proposal;
    double ratio = metric / (target * (double)cur);
    if (fabs(1.0 - ratio) <= k->hpa_tolerance)
        proposal = cur;
    else
        proposal = (long)ceil(metric / target - 1e-9);
    if (proposal < 0)
        proposal = 0;
    /* Record, drop entries out of the window. */
    size_t idx = (s->hpa_head + s->hpa_n) % HPA_RECS;
    if (s->hpa_n == HPA_RECS) {
        s->hpa_head = (s->hpa_head + 1) % HPA_RECS;
        idx = (s->hpa_head + HPA_RECS - 1) % HPA_RECS;
    } else {
        s->hpa_n++;
    }
    s->hpa_t[idx] = s->now;
    s->hpa_v[idx] = proposal;
    long down = proposal;
    for (size_t i = 0; i < s->hpa_n; i++) {
        size_t j = (s->hpa_head + i) % HPA_RECS;
        if (s->hpa_t[j] > s->now - k->hpa_down_window_s - 1e-9 && s->hpa_v[j] > down)
            down = s->hpa_v[j];
    }
    long up = proposal, rec = cur;
    if (rec < up)
        rec = up;
    if (rec > down)
        rec = down;
    /* The scale-up policies (selectPolicy Max), per sync. */
    double by_pct = ceil((double)cur * (1.0 + k->hpa_up_percent / 100.0) - 1e-9);
    double by_pods = (double)cur + k->hpa_up_pods;
    double lim = by_pct > by_pods ? by_pct : by_pods;
    long up_limit = lim < 1e9 ? (long)lim : 1000000000L;
    if (rec > up_limit)
        rec = up_limit;
    if (rec < 1)
        rec = 1; /* KEDA's HPA has minReplicas >= 1; zero is KEDA's call */
    return rec;
}

/* ---- controllers ------------------------------------------------------------ */

static int64_t now_ms(const struct sim *s)
{
    /* A non-zero base, like a monotonic clock. */
    return (int64_t)llround(s->now * 1000.0) + 1000000;
}

static void thaw_decide(struct sim *s)
{
    struct policy_inputs in = {
        .token_rate = s->rate_obs,
        .queue = s->queue_obs,
        .held = fmax(s->held_obs, s->now < s->wake_until ? 1 : 0),
        .inflight = s->inflight_obs,
        .inflight_known = true,
    };
    policy_decide(&s->cfg->thaw, &s->ps, &in, now_ms(s), &s->dec);
    s->has_dec = true;
}

static double kpa_avg(const struct sim *s, double window_s)
{
    size_t want = (size_t)llround(window_s);
    if (want > s->kpa_nb)
        want = s->kpa_nb;
    if (want == 0)
        return 0;
    double sum = 0;
    for (size_t i = 0; i < want; i++)
        sum += s->kpa_buckets[(s->kpa_nb - 1 - i) % KPA_BUCKETS];
    return sum / (double)want;
}

static int kpa_tick(struct sim *s)
{
    const struct sim_kpa *k = &s->cfg->kpa;
    double ready_pods = s->ready > 1 ? s->ready : 1;
    double max_up = ceil(k->max_up_rate * ready_pods);
    double max_down = floor(ready_pods / k->max_down_rate);
    double dspc = ceil(kpa_avg(s, k->stable_s) / k->target - 1e-12);
    double dppc = ceil(kpa_avg(s, k->panic_s) / k->target - 1e-12);
    long ds = (long)fmin(fmax(dspc, max_down), max_up);
    long dp = (long)fmin(fmax(dppc, max_down), max_up);
    bool over = dppc / ready_pods >= k->panic_threshold;
    if (over)
        s->kpa_panic_time = s->now;
    else if (s->kpa_panic_time >= 0 && s->kpa_panic_time + k->stable_s < s->now) {
        s->kpa_panic_time = -1;
        s->kpa_max_panic = 0;
    }
    long desired = ds;
    if (s->kpa_panic_time >= 0) {
        if (desired < dp)
            desired = dp;
        if (desired > s->kpa_max_panic)
            s->kpa_max_panic = (int)desired;
        desired = s->kpa_max_panic;
    }
    if (desired == 0) {
        /* Zero only after the grace period with nothing to do. */
        if (s->kpa_zero_since < 0)
            s->kpa_zero_since = s->now;
        if (s->now - s->kpa_zero_since >= k->grace_s)
            return scale_to(s, 0);
        return scale_to(s, s->alive > 1 ? 1 : s->alive);
    }
    s->kpa_zero_since = -1;
    return scale_to(s, desired);
}

/* A request arrived while the Deployment is at zero: the activator wakes
 * the model (thaw, KEDA: StreamIsActive push; KPA: the activator's stat). */
static int wake(struct sim *s)
{
    switch (s->cfg->kind) {
    case SIM_THAW:
    case SIM_THAW_V1:
        s->wake_until = s->now + s->cfg->sig.wake_hold_s;
        observe_queue(s);
        thaw_decide(s);
        s->keda_last_active = s->now;
        hpa_reset(s);
        return scale_to(s, 1);
    case SIM_KEDA:
        s->keda_last_active = s->now;
        hpa_reset(s);
        return scale_to(s, 1);
    case SIM_KPA:
        s->kpa_zero_since = -1;
        return scale_to(s, 1);
    case SIM_ORACLE:
    case SIM_KIND_COUNT:
        break;
    }
    return 0;
}

static int keda_poll(struct sim *s, bool active)
{
    const struct sim_keda *k = &s->cfg->keda;
    if (active) {
        s->keda_last_active = s->now;
        if (s->alive == 0) {
            hpa_reset(s);
            return scale_to(s, 1);
        }
        return 0;
    }
    if (s->alive > 0 && s->now - s->keda_last_active >= k->cooldown_s) {
        hpa_reset(s);
        return scale_to(s, 0);
    }
    return 0;
}

/* ---- oracle ----------------------------------------------------------------- */

static int cmp_oevent(const void *a, const void *b)
{
    const struct oevent *x = a, *y = b;
    return (x->t > y->t) - (x->t < y->t);
}

/* Per bin, the replicas the work arriving needs at full speed; per level k
 * the bins needing >= k, joined over gaps up to one cold start, each run
 * started one cold start early. Result: (time, replica count) steps. */
static int oracle_plan(struct sim *s)
{
    const struct sim_cluster *c = &s->cfg->cluster;
    const struct trace *tr = s->tr;
    double b = s->cfg->oracle_bin_s > 0 ? s->cfg->oracle_bin_s : 10;
    double horizon = tr->span;
    for (size_t i = 0; i < tr->n; i++) {
        double end = tr->reqs[i].t + tr->reqs[i].ctx / c->prefill_tps +
                     tr->reqs[i].gen / s->per_seq;
        if (end > horizon)
            horizon = end;
    }
    size_t nb = (size_t)ceil(horizon / b) + 2;
    double *slot_s = thaw_calloc(nb, sizeof(double));
    double *work_s = thaw_calloc(nb, sizeof(double));
    unsigned char *any = thaw_calloc(nb, 1);
    int *need = thaw_calloc(nb, sizeof(int));
    struct oevent *ev = NULL;
    int rc = -1;
    if (!slot_s || !work_s || !any || !need)
        goto out;
    /* Each request served at once would hold a slot for its nominal
     * duration and needs (gen + ctx x decode/prefill) / decode_tps
     * replica-seconds of work, spread over that duration. */
    for (size_t i = 0; i < tr->n; i++) {
        double a = tr->reqs[i].t;
        double dur = tr->reqs[i].ctx / c->prefill_tps + tr->reqs[i].gen / s->per_seq;
        double work = (tr->reqs[i].gen + tr->reqs[i].ctx * c->decode_tps / c->prefill_tps) /
                      c->decode_tps;
        double e = a + dur;
        for (size_t k = (size_t)(a / b); k < nb && k * b < e; k++) {
            double lo = fmax(a, k * b), hi = fmin(e, (k + 1) * b);
            if (hi > lo) {
                slot_s[k] += hi - lo;
                work_s[k] += work * (hi - lo) / dur;
            }
            any[k] = 1;
        }
    }
    int maxneed = 0;
    for (size_t k = 0; k < nb; k++) {
        double frac = fmax(slot_s[k] / (c->slots * b), work_s[k] / b);
        need[k] = any[k] ? (int)fmax(1, ceil(frac - 1e-9)) : 0;
        if (need[k] > c->max_replicas)
            need[k] = c->max_replicas;
        if (need[k] > maxneed)
            maxneed = need[k];
    }
    size_t nev = 0, cap = 0;
    for (int lvl = 1; lvl <= maxneed; lvl++) {
        double run_s = -1, run_e = -1;
        for (size_t k = 0; k <= nb; k++) {
            bool on = k < nb && need[k] >= lvl;
            if (on) {
                double bs = k * b, be = (k + 1) * b;
                if (run_s < 0) {
                    run_s = bs;
                    run_e = be;
                } else if (bs - run_e <= c->cold_start_s) {
                    run_e = be; /* restarting would cost more than idling */
                } else {
                    if (nev + 2 > cap) {
                        cap = cap ? cap * 2 : 256;
                        struct oevent *v = thaw_realloc(ev, cap * sizeof(*v));
                        if (!v)
                            goto out;
                        ev = v;
                    }
                    ev[nev++] = (struct oevent){run_s - c->cold_start_s, +1};
                    ev[nev++] = (struct oevent){run_e, -1};
                    run_s = bs;
                    run_e = be;
                }
            }
        }
        if (run_s >= 0) {
            if (nev + 2 > cap) {
                cap = cap ? cap * 2 : 256;
                struct oevent *v = thaw_realloc(ev, cap * sizeof(*v));
                if (!v)
                    goto out;
                ev = v;
            }
            ev[nev++] = (struct oevent){run_s - c->cold_start_s, +1};
            ev[nev++] = (struct oevent){run_e, -1};
        }
    }
    qsort(ev, nev, sizeof(*ev), cmp_oevent);
    /* Deltas -> absolute counts, one step per distinct time. */
    size_t out_n = 0;
    int count = 0;
    for (size_t i = 0; i < nev; i++) {
        count += ev[i].count;
        if (out_n > 0 && ev[out_n - 1].t == ev[i].t)
            ev[out_n - 1].count = count;
        else
            ev[out_n++] = (struct oevent){ev[i].t, count};
    }
    s->oplan = ev;
    s->noplan = out_n;
    ev = NULL;
    rc = 0;
out:
    thaw_free(slot_s);
    thaw_free(work_s);
    thaw_free(any);
    thaw_free(need);
    thaw_free(ev);
    return rc;
}

/* ---- main loop -------------------------------------------------------------- */

static int on_arrival(struct sim *s)
{
    size_t i = s->next_arr;
    conc_advance(s);
    s->next_arr++;
    s->nwaiting++;
    s->cold[i] = s->ready == 0;
    if (s->alive == 0 && wake(s) != 0)
        return -1;
    return dispatch(s);
}

/* A step ended: apply its tokens, retire finished sequences, refill the
 * batch and start the next step. */
static int on_step(struct sim *s, int r)
{
    struct replica *rp = &s->reps[r];
    double pw = s->cfg->sig.prompt_weight;
    int keep = 0;
    conc_advance(s);
    for (int k = 0; k < rp->nseq; k++) {
        struct seq *q = &rp->seqs[k];
        const struct trace_req *tq = &s->tr->reqs[q->req];
        if (q->step_dec)
            q->decoded++;
        if (q->step_pf > 0) {
            q->prefill_left -= q->step_pf;
            if (q->prefill_left == 0) {
                q->decoded = 1; /* the first token ends the prefill */
                s->first[q->req] = s->now;
            }
        }
        q->step_pf = 0;
        q->step_dec = false;
        if (q->prefill_left == 0 && q->decoded >= tq->gen) {
            s->fin[q->req] = s->now;
            rp->tokens_done += tq->gen + pw * tq->ctx;
            s->done++;
            continue;
        }
        rp->seqs[keep++] = *q;
    }
    rp->nseq = keep;
    rp->stepping = false;
    if (rp->state == R_DRAINING && rp->nseq == 0) {
        replica_gone(s, rp);
        return 0;
    }
    if (dispatch(s) != 0)
        return -1;
    return rp->stepping ? 0 : step_start(s, (size_t)r);
}

static void timeline(struct sim *s)
{
    fprintf(s->cfg->timeline, "%s,%.1f,%d,%d,%zu,%zu,%.1f,%ld,%d,%ld,%s\n",
            sim_kind_to_str(s->cfg->kind), s->now, s->alive, s->ready, waiting(s), inflight(s),
            s->rate_obs, s->has_dec ? s->dec.desired : -1L, s->has_dec ? s->dec.active : -1,
            s->has_dec ? s->dec.raw : -1L, s->has_dec ? policy_reason_to_str(s->dec.reason) : "");
}

static int on_timer(struct sim *s, const struct ev *e)
{
    const struct sim_config *cfg = s->cfg;
    int rc = 0;
    double period = 0;
    switch (e->type) {
    case EV_SCRAPE:
        scrape(s);
        period = cfg->sig.scrape_s;
        break;
    case EV_PROMQ:
        s->rate_obs = prom_rate(s);
        thaw_decide(s);
        period = cfg->sig.prom_query_s;
        break;
    case EV_REDIS:
        observe_queue(s);
        thaw_decide(s);
        period = cfg->sig.redis_s;
        break;
    case EV_HPA:
        if (s->alive > 0) {
            long n;
            if (cfg->kind == SIM_THAW || cfg->kind == SIM_THAW_V1) {
                n = hpa_step(s, (double)s->dec.desired, 1.0);
            } else {
                s->rate_obs = prom_rate(s);
                n = hpa_step(s, s->rate_obs, cfg->keda_target_tps);
            }
            rc = scale_to(s, n);
        }
        period = cfg->keda.hpa_sync_s;
        break;
    case EV_KEDA_POLL: {
        bool active;
        if (cfg->kind == SIM_THAW || cfg->kind == SIM_THAW_V1) {
            active = s->dec.active;
        } else {
            observe_queue(s);
            active = prom_rate(s) > 0 || s->held_obs > 0;
        }
        rc = keda_poll(s, active);
        period = cfg->keda.polling_s;
        break;
    }
    case EV_KPA_BUCKET:
        conc_advance(s);
        s->kpa_buckets[s->kpa_nb % KPA_BUCKETS] =
            s->conc_area / fmax(s->now - s->conc_bucket_start, 1e-9);
        s->kpa_nb++;
        s->conc_area = 0;
        s->conc_bucket_start = s->now;
        period = 1;
        break;
    case EV_KPA_TICK:
        rc = kpa_tick(s);
        period = cfg->kpa.tick_s;
        break;
    case EV_ORACLE:
        rc = scale_to(s, s->oplan[e->a].count);
        break;
    case EV_TIMELINE:
        timeline(s);
        period = 10;
        break;
    default:
        break;
    }
    if (rc == 0 && period > 0)
        rc = ev_push(s, s->now + period, e->type, 0);
    return rc;
}

static int on_ready(struct sim *s, int r)
{
    struct replica *rp = &s->reps[r];
    if (rp->state != R_STARTING)
        return 0; /* removed before it was ready */
    rp->state = R_READY;
    if (s->ready++ == 0) {
        /* Requests held meanwhile could not be sent before: their clocks
         * start over, with the wake's length (the oldest one's wait, from
         * the wake's start at most) as the allowance of those held through
         * it. */
        s->ready_since = s->now;
        skip_taken(s);
        double from = s->qhead < s->next_arr ? s->tr->reqs[s->qhead].t : s->now;
        s->allowance = s->now - fmax(from, s->unready_since);
        s->held_end = s->next_arr;
        while (s->held_end > s->qhead && s->tr->reqs[s->held_end - 1].t >= s->now)
            s->held_end--;
        s->held_ontime = s->ontime = s->qhead;
    }
    return dispatch(s);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t idx = (size_t)ceil(p * (double)n) - 1;
    if (idx >= n)
        idx = n - 1;
    return sorted[idx];
}

static void finish(struct sim *s)
{
    struct sim_result *res = s->res;
    const struct trace *tr = s->tr;
    const struct sim_cluster *c = &s->cfg->cluster;
    res->requests = tr->n;
    res->served = s->done;
    res->tokens = trace_tokens(tr);
    double end = s->now;
    res->end_s = end;
    for (size_t r = 0; r < s->nreps; r++) {
        struct replica *rp = &s->reps[r];
        double gone = fmin(rp->gone_at, end);
        double life = gone - rp->created;
        double ready = rp->ready_at >= gone ? 0 : gone - rp->ready_at;
        if (life < -1e-9)
            violation(s, "replica %zu gone before it was created", r);
        res->gpu_s += fmax(life, 0);
        res->ready_s += fmax(ready, 0);
        /* A step of length tau does at most decode_tps x tau of work. */
        if (rp->work > c->decode_tps * ready + 1e-6)
            violation(s, "replica %zu did %.1f token-work in %.3f s ready", r, rp->work, ready);
        res->work_s += rp->work / c->decode_tps;
    }
    if (res->ready_s > res->gpu_s + 1e-6)
        violation(s, "ready time %.3f exceeds GPU time %.3f", res->ready_s, res->gpu_s);
    size_t ok = 0, warm = 0, warm_ok = 0, n = 0;
    for (size_t i = 0; i < tr->n; i++) {
        const struct trace_req *q = &tr->reqs[i];
        double t = s->first[i] - q->t;
        /* In order, except that with late requests last a request passes an
         * older one if and only if that one was late by then, or its clock
         * started later (next_waiting). Judged with the readiness and
         * allowance in force when the first of the two was admitted. */
        bool bad_order = false;
        if (i > 0) {
            double late = s->cfg->late_after_s;
            if (late <= 0) {
                bad_order = s->start[i] < s->start[i - 1];
            } else if (s->start[i] < s->start[i - 1]) {
                double rs = s->admit_since[i], a = s->admit_allowance[i];
                double older = clock_start(s, i - 1, rs, a), newer = clock_start(s, i, rs, a);
                bad_order = !(older < s->start[i] - late + 1e-9) && !(newer < older + 1e-9);
            } else if (s->start[i] > s->start[i - 1] + 1e-9 && q->t <= s->start[i - 1]) {
                double at = s->start[i - 1], rs = s->admit_since[i - 1],
                       a = s->admit_allowance[i - 1];
                double older = clock_start(s, i - 1, rs, a), newer = clock_start(s, i, rs, a);
                bool older_late = older < at - late - 1e-9, newer_late = newer < at - late + 1e-9;
                bad_order = !newer_late && (older_late || newer < older - 1e-9);
            }
        }
        if (!(s->fin[i] >= s->first[i]) || !(s->start[i] >= q->t - 1e-9) || bad_order) {
            violation(s, "request %zu not served in order (arrival %.3f start %.3f)", i, q->t,
                      s->start[i]);
            continue;
        }
        if (t < q->ctx / c->prefill_tps - 1e-9)
            violation(s, "request %zu: TTFT %.6f below its prefill time", i, t);
        double objective = s->slo_warm_s + (s->cold[i] ? c->cold_start_s : 0);
        bool met = t <= objective + 1e-9;
        ok += met;
        if (!s->cold[i]) {
            warm++;
            warm_ok += met;
        }
        s->ttft[n++] = t;
        if (s->cfg->requests_out)
            fprintf(s->cfg->requests_out, "%s,%.3f,%.3f,%d,%d\n", sim_kind_to_str(s->cfg->kind),
                    q->t, t, s->cold[i], met);
    }
    if (s->done != tr->n)
        violation(s, "%zu of %zu requests served", s->done, tr->n);
    res->slo = tr->n ? (double)ok / (double)tr->n : 1;
    res->slo_warm = warm ? (double)warm_ok / (double)warm : 1;
    qsort(s->ttft, n, sizeof(double), cmp_double);
    res->ttft_p50 = pct(s->ttft, n, 0.50);
    res->ttft_p99 = pct(s->ttft, n, 0.99);
    res->ttft_max = n ? s->ttft[n - 1] : 0;
    res->utilisation = res->gpu_s > 0 ? res->work_s / res->gpu_s : 0;
    res->gpu_s_per_mtok = res->tokens > 0 ? res->gpu_s / (res->tokens / 1e6) : 0;
}

static void sim_free(struct sim *s)
{
    for (size_t r = 0; r < s->nreps; r++)
        thaw_free(s->reps[r].seqs);
    thaw_free(s->reps);
    thaw_free(s->heap);
    thaw_free(s->start);
    thaw_free(s->taken);
    thaw_free(s->admit_since);
    thaw_free(s->admit_allowance);
    thaw_free(s->first);
    thaw_free(s->fin);
    thaw_free(s->ttft);
    thaw_free(s->rep);
    thaw_free(s->cold);
    thaw_free(s->oplan);
    thaw_free(s);
}

static int check_config(const struct sim_config *cfg, char *err, size_t errlen)
{
    const struct sim_cluster *c = &cfg->cluster;
    if (!(c->cold_start_s >= 0) || c->slots < 1 || !(c->decode_tps > 0) ||
        !(c->prefill_tps > 0) || c->prefill_chunk < 1 || c->max_replicas < 1) {
        snprintf(err, errlen, "bad cluster parameters");
        return -1;
    }
    if (!(cfg->sig.scrape_s > 0) || !(cfg->sig.rate_window_s > 0) ||
        !(cfg->sig.prom_query_s > 0) || !(cfg->sig.redis_s > 0) || !(cfg->keda.polling_s > 0) ||
        !(cfg->keda.hpa_sync_s > 0) || !(cfg->kpa.tick_s > 0) || !(cfg->kpa.target > 0) ||
        !(cfg->keda_target_tps > 0) || cfg->kpa.stable_s > KPA_BUCKETS ||
        !(cfg->keda.hpa_up_percent >= 0) || !(cfg->keda.hpa_up_pods >= 0)) {
        snprintf(err, errlen, "bad signal or autoscaler parameters");
        return -1;
    }
    return 0;
}

/* Under a warm start no autoscaler acts before its signals describe the
 * traffic (the trace starts with an empty system: one rate window to fill
 * the window, one more for the window to hold steady traffic), as if it had
 * been running all along. */
static double control_delay(const struct sim_config *cfg)
{
    return cfg->warm_start ? 2 * cfg->sig.rate_window_s : 0;
}

static int schedule_timers(struct sim *s)
{
    const struct sim_config *cfg = s->cfg;
    int rc = 0;
    double d = control_delay(cfg);
    /* Phases keep unrelated loops from firing in lockstep. */
    switch (cfg->kind) {
    case SIM_THAW:
    case SIM_THAW_V1:
        rc |= ev_push(s, 0.0, EV_SCRAPE, 0);
        rc |= ev_push(s, 0.25, EV_PROMQ, 0);
        rc |= ev_push(s, 0.5, EV_REDIS, 0);
        rc |= ev_push(s, d + 7.5, EV_HPA, 0);
        rc |= ev_push(s, d + 2.0, EV_KEDA_POLL, 0);
        break;
    case SIM_KEDA:
        rc |= ev_push(s, 0.0, EV_SCRAPE, 0);
        rc |= ev_push(s, d + 7.5, EV_HPA, 0);
        rc |= ev_push(s, d + 2.0, EV_KEDA_POLL, 0);
        break;
    case SIM_KPA:
        rc |= ev_push(s, 1.0, EV_KPA_BUCKET, 0);
        rc |= ev_push(s, d + 1.5, EV_KPA_TICK, 0);
        break;
    case SIM_ORACLE:
        for (size_t i = 0; i < s->noplan && rc == 0; i++)
            if (!cfg->warm_start || s->oplan[i].t > 0)
                rc |= ev_push(s, s->oplan[i].t, EV_ORACLE, (int)i);
        break;
    case SIM_KIND_COUNT:
        break;
    }
    if (cfg->timeline)
        rc |= ev_push(s, 0.0, EV_TIMELINE, 0);
    return rc ? -1 : 0;
}

int sim_run(const struct trace *tr, const struct sim_config *cfg, struct sim_result *res,
            char *err, size_t errlen)
{
    memset(res, 0, sizeof(*res));
    if (check_config(cfg, err, errlen) != 0)
        return -1;
    struct sim *s = thaw_calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    s->tr = tr;
    s->cfg = cfg;
    s->res = res;
    s->slo_warm_s = cfg->slo_warm_s;
    s->per_seq = cfg->cluster.decode_tps / cfg->cluster.slots;
    s->kpa_panic_time = -1;
    s->kpa_zero_since = -1;
    s->keda_last_active = -INFINITY;
    policy_state_init(&s->ps);
    size_t n = tr->n ? tr->n : 1;
    s->start = thaw_calloc(n, sizeof(double));
    s->first = thaw_calloc(n, sizeof(double));
    s->fin = thaw_calloc(n, sizeof(double));
    s->ttft = thaw_calloc(n, sizeof(double));
    s->rep = thaw_calloc(n, sizeof(int));
    s->cold = thaw_calloc(n, 1);
    s->taken = thaw_calloc(n, 1);
    s->admit_since = thaw_calloc(n, sizeof(double));
    s->admit_allowance = thaw_calloc(n, sizeof(double));
    int rc = (!s->start || !s->first || !s->fin || !s->ttft || !s->rep || !s->cold ||
              !s->taken || !s->admit_since || !s->admit_allowance)
                 ? -1
                 : 0;
    if (rc == 0 && (cfg->kind == SIM_ORACLE || cfg->warm_start))
        rc = oracle_plan(s);
    /* Warm start: as many ready replicas as the oracle has at most until a
     * first decision of the autoscalers can take effect (control delay plus a
     * cold start), for every autoscaler alike; not counted as wakes or
     * starts. The oracle starts with them too and follows its plan after. */
    s->now = 0;
    int n0 = 0;
    double until = control_delay(cfg) + cfg->cluster.cold_start_s;
    for (size_t i = 0; i < s->noplan && s->oplan[i].t <= until; i++)
        if (s->oplan[i].count > n0)
            n0 = s->oplan[i].count;
    if (cfg->kind == SIM_ORACLE && !cfg->warm_start) {
        s->now = s->noplan > 0 && s->oplan[0].t < 0 ? s->oplan[0].t : 0;
        n0 = 0;
    }
    for (int i = 0; rc == 0 && cfg->warm_start && i < n0; i++)
        rc = add_replica(s, 0);
    if (cfg->warm_start) {
        res->wakes = res->replica_starts = 0;
        s->keda_last_active = 2 * cfg->sig.rate_window_s;
    }
    if (rc == 0)
        rc = schedule_timers(s);
    s->conc_t = s->conc_bucket_start = s->now;
    while (rc == 0 && s->done < tr->n) {
        bool arrival = s->next_arr < tr->n &&
                       (s->nheap == 0 || tr->reqs[s->next_arr].t < s->heap[0].t);
        if (arrival) {
            s->now = tr->reqs[s->next_arr].t;
            rc = on_arrival(s);
            continue;
        }
        if (s->nheap == 0) {
            violation(s, "stalled with %zu requests unserved and nothing scheduled",
                      tr->n - s->done);
            break;
        }
        if (s->heap[0].t > tr->span + 86400) {
            violation(s, "stalled: %zu requests unserved a day after the trace ended",
                      tr->n - s->done);
            break;
        }
        struct ev e = ev_pop(s);
        s->now = e.t;
        if (e.type == EV_STEP)
            rc = on_step(s, e.a);
        else if (e.type == EV_READY)
            rc = on_ready(s, e.a);
        else
            rc = on_timer(s, &e);
    }
    if (rc != 0) {
        snprintf(err, errlen, "out of memory");
        sim_free(s);
        return -1;
    }
    finish(s);
    sim_free(s);
    return 0;
}
