#include "state.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <jansson.h>

#include "alloc.h"
#include "expo.h"
#include "log.h"
#include "prom_source.h"
#include "redis_source.h"
#include "restore.h"
#include "strmap.h"

struct model_sig {
    char *name;
    double token_rate;
    /* Missing from the last Prometheus answer since then (0 = present). A
     * series vanishing while a model is busy is a gap in the data
     * (Prometheus restarted, its scrapes of the model servers fail), not a
     * model gone idle: an idle model's series stay, at 0, until its pods
     * are gone. So the last rate is kept, marked stale; past the staleness
     * limit it is kept still while a target of the model is active (the
     * target is then beyond the limit: KEDA's fallback applies), and read
     * as 0 only for a model no target keeps active. */
    int64_t absent_since_ms;
    bool absent_logged; /* the warning for a busy model's absence was logged */
    bool seen_in_answer;
    /* A Prometheus answer has come since the model appeared: until then its
     * rate of 0 is not a reading. */
    bool rate_measured;
    /* Its series said NaN, ±Inf or a negative rate since then (0 = valid):
     * no reading, the last good rate is kept, marked stale. */
    int64_t invalid_since_ms;
    bool invalid_in_answer;
    double held;
    /* A held-count batch that included this model has come back: until then
     * its held count of 0 is not a reading. */
    bool held_measured;
    double queued; /* waiting at activators' concurrency caps (replicas ready) */
    double inflight; /* in a backend through the activators */
    long long silent; /* activators that stopped reporting while they carried requests */
    /* The activators' lateAfterSeconds (ms) for that queue, as they publish
     * it: the smallest said among those with a queue (0: one sends FIFO);
     * -1 while none says one, no queue or only activators older than the
     * setting (the ScaledObject's setting applies). */
    int64_t late_after_ms;
    uint64_t changed_in; /* the source update that last changed an input */
    double prev_rate;    /* before the Prometheus answer being applied */
    bool prev_absent;
    /* Wakes, each counting its held requests for wake_hold_ms: one claim per
     * activator that said who it is (POST /wake with instance and held), and
     * one for the rest (Redis wake messages: 1 request). */
    struct wake_claim {
        uint64_t instance; /* FNV-1a of the instance id, 0: unnamed */
        double held;
        int64_t until_ms;
    } claims[WAKE_CLAIMS];
    uint64_t wakes;
    uint64_t decisions[3][POLICY_REASON_COUNT];
    struct target *targets; /* via target->model_next */
    size_t ntargets;
};

struct queue_sig {
    char *key;
    char *group;
    double length;
    bool measured;
    uint64_t changed_in; /* the source update that last changed the length */
    bool wrong_type_logged;
    bool group_missing_logged;
    size_t users; /* targets pointing here */
};

struct target {
    char *id; /* ns/name/model */
    char *ns;
    char *name;
    struct scaler_spec spec;
    struct model_sig *model;
    struct queue_sig *queue;
    struct policy_state pstate;
    struct policy_decision decision;
    bool decided;
    /* Decided once on inputs all read since it appeared (see
     * target_awaiting_data). */
    bool fresh;
    /* New here and not yet given what scalers reported for it before: its
     * answers wait for the read-back. */
    bool restore_pending;
    int64_t appeared_ms;
    enum policy_direction change_direction; /* of the last change, for "why" views */
    int64_t last_seen_ms;
    int64_t last_change_ms;
    int refs;
    struct target *model_prev, *model_next;
};

struct source_health {
    bool ever_ok;
    bool failing;
    int64_t last_ok_ms;
    uint64_t updates;
    uint64_t errors;
    char last_error[200];
};

struct scaler_state {
    struct scaler_state_config cfg;
    int64_t start_ms;
    state_change_fn on_change;
    void *ud;
    state_target_fn on_new_target, on_fresh;
    void *new_target_ud, *fresh_ud;
    struct strmap *targets; /* id -> target */
    struct strmap *models;  /* name -> model_sig */
    struct strmap *queues;  /* key "\x1f" group -> queue_sig */
    struct source_health src[SOURCE_COUNT];
    /* The batches in flight, index-aligned with the replies. */
    struct redis_queue_query *qbatch;
    struct queue_sig **qbatch_sigs;
    size_t nqbatch;
    const char **hbatch;
    struct model_sig **hbatch_models;
    size_t nhbatch;
    uint64_t decision_changes;
    uint64_t updates; /* source updates applied, numbering them for changed_in */
    uint64_t targets_refused;
    int64_t full_logged_ms; /* one log line per 10 s at most */
    /* Targets awaiting the read-back (restore.h), and what the read-backs did. */
    size_t restore_pending;
    uint64_t restored_floors, restore_reads_ok, restore_reads_failed;
};

static const char *const source_names[SOURCE_COUNT] = {"prometheus", "redis_queue", "redis_held"};

const char *source_to_str(enum source_id s)
{
    return (s >= 0 && s < SOURCE_COUNT) ? source_names[s] : "unknown";
}

struct scaler_state *scaler_state_new(const struct scaler_state_config *cfg, int64_t now_ms,
                                      state_change_fn on_change, void *ud)
{
    struct scaler_state *st = thaw_calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    st->cfg = *cfg;
    st->start_ms = now_ms;
    st->on_change = on_change;
    st->ud = ud;
    st->targets = strmap_new();
    st->models = strmap_new();
    st->queues = strmap_new();
    if (!st->targets || !st->models || !st->queues) {
        scaler_state_free(st);
        return NULL;
    }
    return st;
}

static void target_free(struct target *t)
{
    if (!t)
        return;
    metadata_spec_finish(&t->spec);
    thaw_free(t->id);
    thaw_free(t->ns);
    thaw_free(t->name);
    thaw_free(t);
}

static void model_free(struct model_sig *m)
{
    if (!m)
        return;
    thaw_free(m->name);
    thaw_free(m);
}

static void queue_free(struct queue_sig *q)
{
    if (!q)
        return;
    thaw_free(q->key);
    thaw_free(q->group);
    thaw_free(q);
}

static void free_batches(struct scaler_state *st)
{
    thaw_free(st->qbatch);
    thaw_free(st->qbatch_sigs);
    thaw_free(st->hbatch);
    thaw_free(st->hbatch_models);
    st->qbatch = NULL;
    st->qbatch_sigs = NULL;
    st->hbatch = NULL;
    st->hbatch_models = NULL;
    st->nqbatch = st->nhbatch = 0;
}

void scaler_state_free(struct scaler_state *st)
{
    if (!st)
        return;
    size_t cur = 0;
    const char *key;
    void *value;
    while (st->targets && strmap_next(st->targets, &cur, &key, &value))
        target_free(value);
    cur = 0;
    while (st->models && strmap_next(st->models, &cur, &key, &value))
        model_free(value);
    cur = 0;
    while (st->queues && strmap_next(st->queues, &cur, &key, &value))
        queue_free(value);
    strmap_free(st->targets);
    strmap_free(st->models);
    strmap_free(st->queues);
    free_batches(st);
    thaw_free(st);
}

/* ---- deciding --------------------------------------------------------- */

/* What the wakes still in force say is held: the named activators' counts
 * summed (each its latest), or 1 for an unnamed wake if more. Not both added:
 * an activator's Redis message and its post are one wake. */
static double wake_held(const struct scaler_state *st, const struct model_sig *m,
                        int64_t now_ms)
{
    double named = 0, unnamed = 0;
    for (size_t i = 0; i < WAKE_CLAIMS; i++) {
        if (now_ms >= m->claims[i].until_ms)
            continue;
        if (m->claims[i].instance)
            named += m->claims[i].held;
        else if (m->claims[i].held > unnamed)
            unnamed = m->claims[i].held;
    }
    double held = named > unnamed ? named : unnamed;
    /* Many instance ids, each within its own cap, must not add up to any
     * number of replicas. */
    return st->cfg.max_wake_held > 0 && held > st->cfg.max_wake_held ? st->cfg.max_wake_held
                                                                     : held;
}

/* The held input: Redis's count, or what wakes said if more (a wake before
 * the next read of thaw:held, or Redis down and the activators posting). */
static double effective_held(const struct scaler_state *st, const struct model_sig *m,
                             int64_t now_ms)
{
    double wake = wake_held(st, m, now_ms);
    return m->held > wake ? m->held : wake;
}

static bool decision_differs(const struct policy_decision *a, const struct policy_decision *b)
{
    return a->desired != b->desired || a->active != b->active || a->reason != b->reason;
}

/* The policy parameters of a target: its spec's, with the scaler's windows
 * and, while the activators report a queue, the order they send it in (what
 * they do is the fact; the ScaledObject's lateAfterSeconds is the fallback,
 * e.g. for activators too old to publish it). */
static void target_policy_params(const struct scaler_state *st, const struct target *t,
                                 struct policy_params *p)
{
    metadata_policy_params(&t->spec, st->cfg.scale_down_window_ms,
                           st->cfg.bursty_scale_down_window_ms, p);
    if (t->model->late_after_ms >= 0 && !t->spec.policy_v1)
        p->late_after_ms = t->model->late_after_ms;
}

/* Which inputs are not a current reading: their source is failing, or has
 * not been read since the target (or its queue key) appeared. */
static bool rate_stale(const struct scaler_state *st, const struct target *t)
{
    return st->src[SOURCE_PROMETHEUS].failing || t->model->absent_since_ms != 0 ||
           !t->model->rate_measured || t->model->invalid_since_ms != 0;
}

static bool queue_stale(const struct scaler_state *st, const struct target *t)
{
    return st->src[SOURCE_REDIS_QUEUE].failing || !t->queue->measured;
}

static bool held_stale(const struct scaler_state *st, const struct target *t)
{
    return st->src[SOURCE_REDIS_HELD].failing || !t->model->held_measured;
}

/* A target of the model has decided active: it is busy or kept warm. */
static bool model_active(const struct model_sig *m)
{
    for (const struct target *t = m->targets; t; t = t->model_next)
        if (t->decided && t->decision.active)
            return true;
    return false;
}

static void decide(struct scaler_state *st, struct target *t, int64_t now_ms)
{
    struct policy_params p;
    target_policy_params(st, t, &p);
    struct policy_inputs in = {
        .token_rate = t->model->token_rate,
        /* The backlog: the job queue plus the requests activators keep
         * waiting at their concurrency caps (interactive traffic's queue). */
        .queue = t->queue->length + t->model->queued,
        .held = effective_held(st, t->model, now_ms),
        .token_rate_stale = rate_stale(st, t),
        /* A key not read yet (new target, or redisKey just changed) is not
         * evidence of an empty queue. */
        .queue_stale = queue_stale(st, t),
        .held_stale = held_stale(st, t),
        /* Everything the activators carry: held, queued and in a backend;
         * unknown while one stopped reporting with requests (its field
         * went stale): then the token rate decides. */
        .inflight = t->model->held + t->model->queued + t->model->inflight,
        .inflight_known = t->model->silent == 0,
    };
    struct policy_decision prev = t->decision;
    bool had = t->decided;
    policy_decide(&p, &t->pstate, &in, now_ms, &t->decision);
    t->decided = true;
    bool became_fresh = !t->fresh && !t->restore_pending && !in.token_rate_stale &&
                        !in.queue_stale && !in.held_stale;
    if (became_fresh)
        t->fresh = true;
    if (had && !decision_differs(&prev, &t->decision)) {
        if (became_fresh && st->on_fresh)
            st->on_fresh(st->fresh_ud, t);
        return;
    }
    t->last_change_ms = now_ms;
    t->change_direction = t->decision.direction;
    st->decision_changes++;
    t->model->decisions[t->decision.direction][t->decision.reason]++;
    /* Tenant-written names may hold spaces or quotes: quote them so every
     * line stays one parseable logfmt record. */
    char qns[300], qname[300], qmodel[300];
    LOG_INFO("decision",
             "namespace=%s scaledobject=%s model=%s desired=%ld previous=%ld raw=%ld "
             "active=%s direction=%s reason=%s token_rate=%.3f queue=%.0f held=%.0f "
             "inflight=%.0f stale=%s",
             log_quote(qns, sizeof(qns), t->ns), log_quote(qname, sizeof(qname), t->name),
             log_quote(qmodel, sizeof(qmodel), t->spec.model), t->decision.desired,
             had ? prev.desired : 0L,
             t->decision.raw, t->decision.active ? "true" : "false",
             policy_direction_to_str(t->decision.direction),
             policy_reason_to_str(t->decision.reason), in.token_rate, in.queue, in.held,
             t->model->inflight,
             (in.token_rate_stale || in.queue_stale || in.held_stale) ? "true" : "false");
    if (st->on_change)
        st->on_change(st->ud, t, had ? &prev : NULL, &t->decision);
    if (became_fresh && st->on_fresh)
        st->on_fresh(st->fresh_ud, t);
}

static void decide_model(struct scaler_state *st, struct model_sig *m, int64_t now_ms)
{
    /* on_change may not add or remove targets, so the list is stable here. */
    for (struct target *t = m->targets; t; t = t->model_next)
        decide(st, t, now_ms);
}

void scaler_state_tick(struct scaler_state *st, int64_t now_ms)
{
    size_t cur = 0;
    const char *key;
    void *value;
    while (strmap_next(st->targets, &cur, &key, &value))
        decide(st, value, now_ms);
}

/* After a source update: the targets whose inputs changed decide now; the
 * rest wait for the next tick (every second), which is when time alone could
 * change their decision anyway. A source that was failing decides everyone
 * (staleness ends for all). Deciding every target on every update cost four
 * decisions a second per target at 10 000 targets (BENCHMARKS.md). */
static void decide_changed(struct scaler_state *st, uint64_t update, bool all, int64_t now_ms)
{
    size_t cur = 0;
    const char *key;
    void *value;
    while (strmap_next(st->targets, &cur, &key, &value)) {
        struct target *t = value;
        if (all || t->model->changed_in == update || t->queue->changed_in == update ||
            !t->decided)
            decide(st, t, now_ms);
    }
}

/* ---- targets ---------------------------------------------------------- */

static struct model_sig *model_get(struct scaler_state *st, const char *name)
{
    struct model_sig *m = strmap_get(st->models, name);
    if (m)
        return m;
    m = thaw_calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->late_after_ms = -1; /* no activator queue seen */
    m->name = thaw_strdup(name);
    if (!m->name || strmap_put(st->models, name, m) != 0) {
        model_free(m);
        return NULL;
    }
    return m;
}

static int queue_map_key(char *out, size_t outlen, const char *key, const char *group)
{
    int n = snprintf(out, outlen, "%s\x1f%s", key, group ? group : "");
    return (n < 0 || (size_t)n >= outlen) ? -1 : 0;
}

static struct queue_sig *queue_get(struct scaler_state *st, const char *key, const char *group)
{
    char mk[2 * METADATA_MAX_VALUE + 8];
    if (queue_map_key(mk, sizeof(mk), key, group) != 0)
        return NULL;
    struct queue_sig *q = strmap_get(st->queues, mk);
    if (q)
        return q;
    q = thaw_calloc(1, sizeof(*q));
    if (!q)
        return NULL;
    q->key = thaw_strdup(key);
    q->group = group ? thaw_strdup(group) : NULL;
    if (!q->key || (group && !q->group) || strmap_put(st->queues, mk, q) != 0) {
        queue_free(q);
        return NULL;
    }
    return q;
}

static void model_link(struct model_sig *m, struct target *t)
{
    t->model = m;
    t->model_prev = NULL;
    t->model_next = m->targets;
    if (m->targets)
        m->targets->model_prev = t;
    m->targets = t;
    m->ntargets++;
}

static void model_unlink(struct target *t)
{
    struct model_sig *m = t->model;
    if (t->model_prev)
        t->model_prev->model_next = t->model_next;
    else
        m->targets = t->model_next;
    if (t->model_next)
        t->model_next->model_prev = t->model_prev;
    m->ntargets--;
    t->model = NULL;
}

/* ---- restore after a restart or a failover ---------------------------- */

/* The time a target's floor is held until: as long from its appearance as
 * its own scale-down window would have held it (at most restore_window_ms). */
static int64_t restore_until(const struct scaler_state *st, const struct target *t)
{
    struct policy_params p;
    target_policy_params(st, t, &p);
    int64_t hold = p.scale_down_window_ms > p.bursty_scale_down_window_ms
                       ? p.scale_down_window_ms
                       : p.bursty_scale_down_window_ms;
    if (hold > st->cfg.restore_window_ms)
        hold = st->cfg.restore_window_ms;
    return t->appeared_ms + hold;
}

static void restore_clear(struct scaler_state *st, struct target *t)
{
    if (t->restore_pending)
        st->restore_pending--;
    t->restore_pending = false;
}

bool scaler_state_restore_wanted(const struct scaler_state *st) { return st->restore_pending > 0; }

uint64_t scaler_state_restored_floors(const struct scaler_state *st) { return st->restored_floors; }

void scaler_state_restore_done(struct scaler_state *st, const struct prom_sample *samples,
                               size_t n, const char *err, int64_t now_ms)
{
    if (!scaler_state_restore_wanted(st))
        return;
    struct restore_book *book = NULL;
    size_t skipped = 0;
    if (!err) {
        book = restore_book_new();
        if (!book || restore_book_fill(book, samples, n, 0, &skipped) < 0)
            err = "out of memory";
    }
    if (err)
        st->restore_reads_failed++;
    else
        st->restore_reads_ok++;
    uint64_t floors_before = st->restored_floors;
    size_t resolved = 0;
    size_t cur = 0;
    const char *key;
    void *value;
    while (strmap_next(st->targets, &cur, &key, &value)) {
        struct target *t = value;
        if (!t->restore_pending)
            continue;
        restore_clear(st, t);
        resolved++;
        /* After a failure it is answered without a floor, and no later
         * read-back gives it one: by then KEDA may have acted on that answer,
         * and a floor coming back would scale up what was let go. */
        long floor = err ? 0 : restore_book_floor(book, t->id);
        int64_t until = restore_until(st, t);
        if (floor > 0 && now_ms < until) {
            policy_state_restore(&t->pstate, floor, until);
            st->restored_floors++;
        }
        decide(st, t, now_ms);
    }
    if (err) {
        char q[300];
        LOG_WARN("restore_failed", "targets=%zu reason=%s effect=\"their policy starts afresh\"",
                 resolved, log_quote(q, sizeof(q), err));
    } else {
        LOG_INFO("restore_done", "targets=%zu floors=%llu reported=%zu skipped=%zu", resolved,
                 (unsigned long long)(st->restored_floors - floors_before),
                 restore_book_count(book), skipped);
    }
    restore_book_free(book);
}

struct target *scaler_state_upsert(struct scaler_state *st, const char *ns, const char *name,
                                   const struct scaler_spec *spec, int64_t now_ms)
{
    char id[3 * METADATA_MAX_VALUE + 8];
    int n = snprintf(id, sizeof(id), "%s/%s/%s", ns, name, spec->model);
    if (n < 0 || (size_t)n >= sizeof(id))
        return NULL;
    struct target *t = strmap_get(st->targets, id);
    if (t) {
        t->last_seen_ms = now_ms;
        if (metadata_spec_equal(&t->spec, spec))
            return t;
        /* The ScaledObject changed: swap the spec and the queue it reads. */
        struct queue_sig *q = queue_get(st, spec->redis_key, spec->redis_stream_group);
        struct scaler_spec copy;
        if (!q || metadata_spec_copy(&copy, spec) != 0)
            return NULL;
        metadata_spec_finish(&t->spec);
        t->spec = copy;
        t->queue->users--;
        t->queue = q;
        q->users++;
        /* The keep-warm time is computed from the knobs at an idle moment:
         * the new ones (policy v1, keepWarmCost 0) apply now, not after the
         * next burst. */
        t->pstate.keep_warm_ms = -1;
        decide(st, t, now_ms);
        return t;
    }
    if (scaler_state_full(st)) {
        /* Each target costs memory and a policy step every second until it
         * expires: a client inventing names must not grow that forever. */
        st->targets_refused++;
        if (log_throttle(&st->full_logged_ms, now_ms)) {
            char qns[300], qname[300];
            LOG_WARN("target_limit", "namespace=%s scaledobject=%s targets=%zu max_targets=%zu "
                     "refused_total=%llu",
                     log_quote(qns, sizeof(qns), ns), log_quote(qname, sizeof(qname), name),
                     strmap_count(st->targets), st->cfg.max_targets,
                     (unsigned long long)st->targets_refused);
        }
        return NULL;
    }
    t = thaw_calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    struct model_sig *m = model_get(st, spec->model);
    struct queue_sig *q = queue_get(st, spec->redis_key, spec->redis_stream_group);
    t->id = thaw_strdup(id);
    t->ns = thaw_strdup(ns);
    t->name = thaw_strdup(name);
    if (!m || !q || !t->id || !t->ns || !t->name || metadata_spec_copy(&t->spec, spec) != 0) {
        target_free(t);
        return NULL;
    }
    if (strmap_put(st->targets, id, t) != 0) {
        target_free(t);
        return NULL;
    }
    policy_state_init(&t->pstate);
    t->last_seen_ms = now_ms;
    t->queue = q;
    q->users++;
    model_link(m, t);
    t->appeared_ms = now_ms;
    /* Only where a floor could hold: with no scale-down window (or the
     * read-back off) there is nothing to wait for. */
    if (st->cfg.restore_window_ms > 0 && restore_until(st, t) > now_ms) {
        t->restore_pending = true;
        st->restore_pending++;
    }
    char qns[300], qname[300], qmodel[300], qkey[300];
    LOG_INFO("target_added", "namespace=%s scaledobject=%s model=%s redis_key=%s targets=%zu",
             log_quote(qns, sizeof(qns), ns), log_quote(qname, sizeof(qname), name),
             log_quote(qmodel, sizeof(qmodel), spec->model),
             log_quote(qkey, sizeof(qkey), spec->redis_key), strmap_count(st->targets));
    decide(st, t, now_ms);
    if (!t->fresh && st->on_new_target)
        st->on_new_target(st->new_target_ud, t);
    return t;
}

void scaler_state_set_target_hooks(struct scaler_state *st, state_target_fn on_new_target,
                                   void *new_target_ud, state_target_fn on_fresh, void *fresh_ud)
{
    st->on_new_target = on_new_target;
    st->new_target_ud = new_target_ud;
    st->on_fresh = on_fresh;
    st->fresh_ud = fresh_ud;
}

bool target_awaiting_data(const struct target *t) { return !t->fresh; }
bool target_first_read_due(const struct target *t)
{
    return !t->fresh && (t->restore_pending || !t->model->rate_measured ||
                         !t->queue->measured || !t->model->held_measured);
}

bool scaler_state_source_failing(const struct scaler_state *st)
{
    for (int s = 0; s < SOURCE_COUNT; s++)
        if (st->src[s].failing)
            return true;
    return false;
}

size_t scaler_state_target_count(const struct scaler_state *st) { return strmap_count(st->targets); }

bool scaler_state_full(const struct scaler_state *st)
{
    return st->cfg.max_targets && strmap_count(st->targets) >= st->cfg.max_targets;
}

void target_ref(struct target *t) { t->refs++; }
void target_unref(struct target *t) { t->refs--; }
const struct policy_decision *target_decision(const struct target *t) { return &t->decision; }
const struct scaler_spec *target_spec(const struct target *t) { return &t->spec; }
const char *target_namespace(const struct target *t) { return t->ns; }
const char *target_name(const struct target *t) { return t->name; }

static bool source_beyond(const struct scaler_state *st, enum source_id s, int64_t now_ms)
{
    const struct source_health *h = &st->src[s];
    if (!h->failing)
        return false;
    int64_t since = h->ever_ok ? h->last_ok_ms : st->start_ms;
    return now_ms - since > st->cfg.staleness_limit_ms;
}

bool target_beyond_staleness(const struct scaler_state *st, const struct target *t,
                             int64_t now_ms)
{
    if (t->model->invalid_since_ms != 0 &&
        now_ms - t->model->invalid_since_ms > st->cfg.staleness_limit_ms)
        return true;
    /* (For an inactive model absence past the limit reads as 0 at the
     * next answer: not stale, and not a reason to refuse "inactive".) */
    if (t->model->absent_since_ms != 0 &&
        now_ms - t->model->absent_since_ms > st->cfg.staleness_limit_ms &&
        model_active(t->model))
        return true;
    /* Every target reads all three sources. */
    for (int s = 0; s < SOURCE_COUNT; s++)
        if (source_beyond(st, (enum source_id)s, now_ms))
            return true;
    return false;
}

/* ---- source results --------------------------------------------------- */

static void source_ok(struct scaler_state *st, enum source_id s, int64_t now_ms)
{
    struct source_health *h = &st->src[s];
    if (h->failing)
        LOG_INFO("source_recovered", "source=%s", source_to_str(s));
    h->ever_ok = true;
    h->failing = false;
    h->last_ok_ms = now_ms;
    h->updates++;
}

/* A source answered: its health, then the decisions its update changed (a
 * source that was failing or had never answered ends staleness for all). */
static void source_updated(struct scaler_state *st, enum source_id s, uint64_t update,
                           int64_t now_ms)
{
    bool all = st->src[s].failing || !st->src[s].ever_ok;
    source_ok(st, s, now_ms);
    decide_changed(st, update, all, now_ms);
}

void scaler_state_source_failed(struct scaler_state *st, enum source_id src, const char *err,
                                int64_t now_ms)
{
    struct source_health *h = &st->src[src];
    char q[256];
    h->errors++;
    if (!h->failing || strcmp(h->last_error, err ? err : "") != 0)
        LOG_WARN("source_failed", "source=%s error=%s kept_last_good=%s", source_to_str(src),
                 log_quote(q, sizeof(q), err), h->ever_ok ? "true" : "false");
    snprintf(h->last_error, sizeof(h->last_error), "%s", err ? err : "");
    h->failing = true;
    /* Decisions now carry the stale flag: the fail-safe keeps them from falling. */
    scaler_state_tick(st, now_ms);
}

void scaler_state_prom_ok(struct scaler_state *st, const struct prom_sample *samples, size_t n,
                          int64_t now_ms)
{
    size_t cur = 0;
    const char *key;
    void *value;
    uint64_t update = ++st->updates;
    /* Mark every model absent, then clear the mark for those in the answer. */
    while (strmap_next(st->models, &cur, &key, &value)) {
        struct model_sig *m = value;
        m->prev_rate = m->token_rate;
        m->prev_absent = m->absent_since_ms != 0;
        if (m->absent_since_ms == 0)
            m->absent_since_ms = now_ms;
        m->seen_in_answer = false;
        m->invalid_in_answer = false;
        if (!m->rate_measured) {
            m->rate_measured = true;
            m->changed_in = update;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct model_sig *m = strmap_get(st->models, samples[i].label_value);
        if (!m)
            continue;
        if (!m->seen_in_answer) {
            m->seen_in_answer = true;
            m->absent_since_ms = 0;
            m->token_rate = 0;
        }
        if (samples[i].invalid)
            m->invalid_in_answer = true;
        else
            m->token_rate += samples[i].value; /* duplicate label values: sum */
    }
    cur = 0;
    while (strmap_next(st->models, &cur, &key, &value)) {
        struct model_sig *m = value;
        /* Finite series can still sum past what a double holds. */
        if (m->seen_in_answer && (m->invalid_in_answer || !isfinite(m->token_rate))) {
            m->token_rate = m->prev_rate;
            if (m->invalid_since_ms == 0) {
                char q[300];
                m->invalid_since_ms = now_ms;
                LOG_WARN("token_rate_invalid", "model=%s reason=\"a series is NaN, infinite or "
                         "negative\" kept_last_good=true token_rate=%.3f",
                         log_quote(q, sizeof(q), m->name), m->token_rate);
                m->changed_in = update;
            }
        } else if (m->invalid_since_ms != 0) {
            m->invalid_since_ms = 0;
            m->changed_in = update;
        }
        /* Absent with nothing to keep, or absent for too long from a model
         * no target keeps active: no series means no pods, so no tokens. */
        if (m->absent_since_ms != 0) {
            bool past_limit = now_ms - m->absent_since_ms > st->cfg.staleness_limit_ms;
            if (m->token_rate == 0 || (past_limit && !model_active(m))) {
                m->token_rate = 0;
                m->absent_since_ms = 0;
            } else if (past_limit && !m->absent_logged) {
                char q[300];
                LOG_WARN("token_rate_absent",
                         "model=%s absent_ms=%lld token_rate=%.3f reason=\"no series while busy: "
                         "the last rate is kept and GetMetrics fails until the series return\"",
                         log_quote(q, sizeof(q), m->name),
                         (long long)(now_ms - m->absent_since_ms), m->token_rate);
                m->absent_logged = true;
            }
        }
        if (m->absent_since_ms == 0 && m->absent_logged) {
            char q[300];
            LOG_INFO("token_rate_present", "model=%s", log_quote(q, sizeof(q), m->name));
            m->absent_logged = false;
        }
        if (m->token_rate != m->prev_rate || (m->absent_since_ms != 0) != m->prev_absent)
            m->changed_in = update;
    }
    source_updated(st, SOURCE_PROMETHEUS, update, now_ms);
}

size_t scaler_state_queue_batch(struct scaler_state *st, const struct redis_queue_query **out)
{
    size_t n = strmap_count(st->queues);
    thaw_free(st->qbatch);
    thaw_free(st->qbatch_sigs);
    st->qbatch = thaw_calloc(n, sizeof(*st->qbatch));
    st->qbatch_sigs = thaw_calloc(n, sizeof(*st->qbatch_sigs));
    st->nqbatch = 0;
    if (!st->qbatch || !st->qbatch_sigs) {
        *out = NULL;
        return 0;
    }
    size_t cur = 0;
    const char *key;
    void *value;
    while (strmap_next(st->queues, &cur, &key, &value)) {
        struct queue_sig *q = value;
        st->qbatch[st->nqbatch].key = q->key;
        st->qbatch[st->nqbatch].group = q->group;
        st->qbatch_sigs[st->nqbatch++] = q;
    }
    *out = st->qbatch;
    return st->nqbatch;
}

void scaler_state_queue_ok(struct scaler_state *st, const long long *lengths, size_t n,
                           int64_t now_ms)
{
    uint64_t update = ++st->updates;
    for (size_t i = 0; i < n && i < st->nqbatch; i++) {
        struct queue_sig *q = st->qbatch_sigs[i];
        if (lengths[i] <= -2) {
            /* The stream exists but its group does not: nothing of it has
             * been read by the group, so all of it is backlog. */
            double whole = (double)(-2 - lengths[i]);
            if (!q->group_missing_logged) {
                char k[300], g[300];
                LOG_WARN("queue_group_missing", "key=%s group=%s counted=%.0f reason=\"the "
                         "stream has no such consumer group: its whole length counts\"",
                         log_quote(k, sizeof(k), q->key), log_quote(g, sizeof(g), q->group),
                         whole);
                q->group_missing_logged = true;
            }
            if (q->length != whole || !q->measured)
                q->changed_in = update;
            q->length = whole;
            q->wrong_type_logged = false;
        } else if (lengths[i] < 0) {
            if (!q->wrong_type_logged) {
                char k[300];
                LOG_WARN("queue_key_unsupported", "key=%s reason=\"not a list, sorted set or "
                         "stream\"", log_quote(k, sizeof(k), q->key));
                q->wrong_type_logged = true;
            }
            if (q->length != 0 || !q->measured)
                q->changed_in = update;
            q->length = 0;
        } else {
            if (q->length != (double)lengths[i] || !q->measured)
                q->changed_in = update;
            q->length = (double)lengths[i];
            q->wrong_type_logged = false;
            q->group_missing_logged = false;
        }
        q->measured = true;
    }
    source_updated(st, SOURCE_REDIS_QUEUE, update, now_ms);
}

size_t scaler_state_held_batch(struct scaler_state *st, const char *const **out)
{
    size_t n = strmap_count(st->models);
    thaw_free(st->hbatch);
    thaw_free(st->hbatch_models);
    st->hbatch = thaw_calloc(n, sizeof(*st->hbatch));
    st->hbatch_models = thaw_calloc(n, sizeof(*st->hbatch_models));
    st->nhbatch = 0;
    if (!st->hbatch || !st->hbatch_models) {
        *out = NULL;
        return 0;
    }
    size_t cur = 0;
    const char *key;
    void *value;
    while (strmap_next(st->models, &cur, &key, &value)) {
        struct model_sig *m = value;
        st->hbatch[st->nhbatch] = m->name;
        st->hbatch_models[st->nhbatch++] = m;
    }
    *out = st->hbatch;
    return st->nhbatch;
}

void scaler_state_held_ok(struct scaler_state *st, const long long *held, const long long *queued,
                          const long long *late_ms, const long long *inflight,
                          const long long *silent, size_t n, int64_t now_ms)
{
    uint64_t update = ++st->updates;
    for (size_t i = 0; i < n && i < st->nhbatch; i++) {
        struct model_sig *m = st->hbatch_models[i];
        double h = held[i] > 0 ? (double)held[i] : 0;
        double q = queued && queued[i] > 0 ? (double)queued[i] : 0;
        /* Bounded like the metadata key (0..3600 s). */
        int64_t late = late_ms && late_ms[i] >= 0
                           ? (late_ms[i] > 3600000 ? 3600000 : (int64_t)late_ms[i])
                           : -1;
        double f = inflight && inflight[i] > 0 ? (double)inflight[i] : 0;
        long long z = silent && silent[i] > 0 ? silent[i] : 0;
        /* Only a change between none and some can change a decision. */
        if (h != m->held || q != m->queued || late != m->late_after_ms ||
            (f > 0) != (m->inflight > 0) || (z > 0) != (m->silent > 0) || !m->held_measured)
            m->changed_in = update;
        m->held_measured = true;
        if (z > 0 && m->silent == 0)
            LOG_WARN("activators_silent", "model=%s fields=%lld", m->name, z);
        m->inflight = f;
        m->silent = z;
        m->held = h;
        m->queued = q;
        m->late_after_ms = late;
    }
    source_updated(st, SOURCE_REDIS_HELD, update, now_ms);
}

static uint64_t instance_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return h ? h : 1; /* 0 is the unnamed claim */
}

size_t scaler_state_wake(struct scaler_state *st, const char *model, const char *instance,
                         double held, int64_t now_ms)
{
    struct model_sig *m = strmap_get(st->models, model);
    if (!m)
        return 0;
    m->wakes++;
    uint64_t id = instance ? instance_hash(instance) : 0;
    /* Its own slot, else a free (expired) one, else the one ending first. */
    size_t slot = WAKE_CLAIMS;
    for (size_t i = 0; i < WAKE_CLAIMS && slot == WAKE_CLAIMS; i++) {
        if (m->claims[i].instance == id && now_ms < m->claims[i].until_ms)
            slot = i;
    }
    for (size_t i = 0; i < WAKE_CLAIMS && slot == WAKE_CLAIMS; i++) {
        if (now_ms >= m->claims[i].until_ms)
            slot = i;
    }
    if (slot == WAKE_CLAIMS) {
        slot = 0;
        for (size_t i = 1; i < WAKE_CLAIMS; i++) {
            if (m->claims[i].until_ms < m->claims[slot].until_ms)
                slot = i;
        }
    }
    m->claims[slot].instance = id;
    m->claims[slot].held = held >= 1 ? held : 1;
    m->claims[slot].until_ms = now_ms + st->cfg.wake_hold_ms;
    decide_model(st, m, now_ms);
    return m->ntargets;
}

void scaler_state_foreach_model_target(struct scaler_state *st, const char *model,
                                       void (*fn)(void *ud, struct target *t), void *ud)
{
    struct model_sig *m = strmap_get(st->models, model);
    if (!m)
        return;
    for (struct target *t = m->targets; t; t = t->model_next)
        fn(ud, t);
}

void scaler_state_gc(struct scaler_state *st, int64_t now_ms)
{
    /* Collect first: the maps must not change while iterated. */
    size_t n = strmap_count(st->targets), ndrop = 0;
    struct target **drop = n ? thaw_calloc(n, sizeof(*drop)) : NULL;
    size_t cur = 0;
    const char *key;
    void *value;
    while (drop && strmap_next(st->targets, &cur, &key, &value)) {
        struct target *t = value;
        if (t->refs == 0 && now_ms - t->last_seen_ms > st->cfg.target_expiry_ms)
            drop[ndrop++] = t;
    }
    for (size_t i = 0; i < ndrop; i++) {
        struct target *t = drop[i];
        char qns[300], qname[300], qmodel[300];
        LOG_INFO("target_expired", "namespace=%s scaledobject=%s model=%s",
                 log_quote(qns, sizeof(qns), t->ns), log_quote(qname, sizeof(qname), t->name),
                 log_quote(qmodel, sizeof(qmodel), t->spec.model));
        strmap_remove(st->targets, t->id);
        restore_clear(st, t);
        t->queue->users--;
        model_unlink(t);
        target_free(t);
    }
    thaw_free(drop);
    free_batches(st); /* they may point at what goes next */
    n = strmap_count(st->queues) + strmap_count(st->models);
    void **gone = n ? thaw_calloc(n, sizeof(*gone)) : NULL;
    size_t ngone = 0;
    cur = 0;
    while (gone && strmap_next(st->queues, &cur, &key, &value))
        if (((struct queue_sig *)value)->users == 0)
            gone[ngone++] = value;
    for (size_t i = 0; i < ngone; i++) {
        struct queue_sig *q = gone[i];
        char mk[2 * METADATA_MAX_VALUE + 8];
        if (queue_map_key(mk, sizeof(mk), q->key, q->group) == 0)
            strmap_remove(st->queues, mk);
        queue_free(q);
    }
    ngone = 0;
    cur = 0;
    while (gone && strmap_next(st->models, &cur, &key, &value))
        if (((struct model_sig *)value)->ntargets == 0)
            gone[ngone++] = value;
    for (size_t i = 0; i < ngone; i++) {
        struct model_sig *m = gone[i];
        strmap_remove(st->models, m->name);
        model_free(m);
    }
    thaw_free(gone);
}

bool scaler_state_sources_ready(const struct scaler_state *st)
{
    for (int s = 0; s < SOURCE_COUNT; s++)
        if (!st->src[s].ever_ok)
            return false;
    return true;
}

/* ---- exposition ------------------------------------------------------- */

/* ---- /metrics and /models, in steps ----------------------------------------
 *
 * One page of 10 000 models is 15 MB of exposition (150 ms of CPU) or 8 MB
 * of JSON (260 ms), and the event loop that renders it also serves gRPC,
 * KEDA's pushes and the sources. So a page is built in steps with the loop
 * running in between (scaler/main.c), and holds no pointer into the state,
 * which may change, and lose targets, between two steps. */

enum { PER_TARGET_FAMILIES = 11, PER_MODEL_FAMILIES = 5 };

static const char *const per_target_family[PER_TARGET_FAMILIES][3] = {
    {"thaw_scaler_desired_replicas", "gauge",
     "Replicas reported to KEDA by GetMetrics (after stabilization and fail-safe)."},
    {"thaw_scaler_raw_replicas", "gauge", "Replicas the inputs call for right now."},
    {"thaw_scaler_active", "gauge", "1 when IsActive answers true."},
    {"thaw_scaler_input_queue_length", "gauge", "Queue length read for the target's key."},
    {"thaw_scaler_decision_info", "gauge",
     "Always 1; labels give the reason and direction of the last decision."},
    {"thaw_scaler_last_decision_change_seconds", "gauge",
     "Seconds since the target's decision last changed."},
    {"thaw_scaler_utilisation_target", "gauge",
     "Share of targetTokensPerSecond the last decision planned for (the bursty target "
     "while the demand is bursty; with replicaConcurrency, the square-root staffing's "
     "share at the current demand)."},
    {"thaw_scaler_tokens_per_request", "gauge",
     "Tokens one request costs where the policy counts requests in tokens (queue growth, "
     "backlog, wakes): learned from the model's wakes, else tokensPerRequest (0: policy "
     "v1, counts only)."},
    {"thaw_scaler_keep_warm_seconds", "gauge",
     "How long an idle model stays active (one replica or more) before going to zero: "
     "the keep-warm break-even over its idle gaps; policy v2, after its first decision."},
    {"thaw_scaler_panicking", "gauge",
     "1 while the panic rule holds for the current overload (a backlog of queued and held "
     "requests above targetQueueLength likely to outlast a cold start)."},
    {"thaw_scaler_scale_down_window_seconds", "gauge",
     "The scale-down window the last decision held its level over: scaleDownWindowSeconds, "
     "or burstyScaleDownWindowSeconds if longer while the demand is or lately was bursty."},
};
enum { FAMILY_DECISION_INFO = 4 };

static const char *const per_model_family[PER_MODEL_FAMILIES][3] = {
    {"thaw_scaler_input_token_rate", "gauge",
     "Generation tokens per second per model, from the Prometheus query."},
    {"thaw_scaler_input_held_requests", "gauge",
     "Requests held by activators per model (a wake counts as one for a while)."},
    {"thaw_scaler_input_queued_requests", "gauge",
     "Requests waiting at activators' concurrency caps per model (replicas ready)."},
    {"thaw_scaler_input_inflight_requests", "gauge",
     "Requests in a backend through activators per model (the idle signal of idleSignal "
     "activators)."},
    {"thaw_scaler_wake_messages_total", "counter", "Wake messages received per model."},
};

/* A target's or model's samples as they were when the page began. */
struct target_row {
    size_t labels; /* offset of namespace=,scaledobject=,model= in the arena */
    double v[PER_TARGET_FAMILIES];
    uint16_t present; /* bit f: family f has a sample for this target */
    uint8_t reason, direction;
};

struct model_row {
    size_t labels; /* model= */
    double v[PER_MODEL_FAMILIES];
    uint64_t decisions[3][POLICY_REASON_COUNT];
};

enum page_kind { PAGE_METRICS, PAGE_MODELS };

struct scaler_page {
    enum page_kind kind;
    /* NUL-terminated strings back to back: label lists (metrics) or target
     * ids (models). */
    char *arena;
    size_t arena_len, arena_cap;
    struct target_row *targets;
    struct model_row *models;
    size_t *ids; /* models page: offsets of the target ids */
    size_t ntargets, nmodels, nids;
    size_t written; /* models page: entries written so far */
    struct evbuffer *head, *tail; /* the few samples that are not per target or model */
    /* Where the next step starts: the section, and the row within it. */
    int section;
    size_t row;
};

/* Sections of a metrics page, in the order of the exposition. */
enum {
    SECTION_HEAD = 0,
    SECTION_TARGETS = 1,                                         /* one per family */
    SECTION_MODELS = SECTION_TARGETS + PER_TARGET_FAMILIES,      /* one per family */
    SECTION_DECISIONS = SECTION_MODELS + PER_MODEL_FAMILIES,
    SECTION_TAIL,
    SECTION_DONE
};

/* Copies s (with its NUL) into the arena; returns its offset or SIZE_MAX. */
static size_t arena_add(struct scaler_page *pg, const char *s)
{
    size_t n = strlen(s) + 1;
    if (pg->arena_len + n > pg->arena_cap) {
        size_t cap = pg->arena_cap ? pg->arena_cap : 4096;
        while (cap < pg->arena_len + n)
            cap *= 2;
        char *a = thaw_realloc(pg->arena, cap);
        if (!a)
            return SIZE_MAX;
        pg->arena = a;
        pg->arena_cap = cap;
    }
    memcpy(pg->arena + pg->arena_len, s, n);
    pg->arena_len += n;
    return pg->arena_len - n;
}

void scaler_page_free(struct scaler_page *pg)
{
    if (!pg)
        return;
    thaw_free(pg->arena);
    thaw_free(pg->targets);
    thaw_free(pg->models);
    thaw_free(pg->ids);
    if (pg->head)
        evbuffer_free(pg->head);
    if (pg->tail)
        evbuffer_free(pg->tail);
    thaw_free(pg);
}

static struct scaler_page *page_new(enum page_kind kind)
{
    struct scaler_page *pg = thaw_calloc(1, sizeof(*pg));
    if (!pg)
        return NULL;
    pg->kind = kind;
    pg->head = evbuffer_new();
    pg->tail = evbuffer_new();
    if (!pg->head || !pg->tail) {
        scaler_page_free(pg);
        return NULL;
    }
    return pg;
}

static void target_row_fill(const struct scaler_state *st, const struct target *t, int64_t now_ms,
                            struct target_row *row)
{
    /* Not read back yet: what it would say now is not what it reports (its
     * answers wait), and a scrape of it could replace, in Prometheus, the
     * very answer the read-back is after. */
    if (t->restore_pending) {
        row->present = 0;
        return;
    }
    row->present = (uint16_t)((1u << PER_TARGET_FAMILIES) - 1);
    row->reason = (uint8_t)t->decision.reason;
    row->direction = (uint8_t)t->change_direction;
    row->v[0] = (double)t->decision.desired;
    row->v[1] = (double)t->decision.raw;
    row->v[2] = t->decision.active ? 1 : 0;
    row->v[3] = t->queue->length;
    row->v[FAMILY_DECISION_INFO] = 1;
    row->v[5] = (double)(now_ms - t->last_change_ms) / 1000.0;
    row->v[6] = t->decided ? t->pstate.utilisation : 0;
    struct policy_params p;
    target_policy_params(st, t, &p);
    row->v[7] = policy_tokens_per_request(&p, &t->pstate);
    if (t->spec.policy_v1 || !t->decided || t->pstate.keep_warm_ms < 0)
        row->present &= (uint16_t)~(1u << 8); /* no keep-warm, or not known yet */
    else
        row->v[8] = (double)t->pstate.keep_warm_ms / 1000.0;
    row->v[9] = t->decided && t->pstate.over_panic ? 1 : 0;
    if (!t->decided)
        row->present &= (uint16_t)~(1u << 10); /* no decision, no window used yet */
    else
        row->v[10] = (double)t->pstate.down_window_ms / 1000.0;
}

struct scaler_page *scaler_state_metrics_page(const struct scaler_state *st, int64_t now_ms)
{
    struct scaler_page *pg = page_new(PAGE_METRICS);
    if (!pg)
        return NULL;
    size_t nt = strmap_count(st->targets), nm = strmap_count(st->models);
    pg->targets = thaw_calloc(nt ? nt : 1, sizeof(*pg->targets));
    pg->models = thaw_calloc(nm ? nm : 1, sizeof(*pg->models));
    if (!pg->targets || !pg->models)
        goto fail;
    /* Fits three escaped values of METADATA_MAX_VALUE bytes each. */
    char labels[8 * METADATA_MAX_VALUE];
    size_t cur = 0;
    const char *key;
    void *value;
    while (strmap_next(st->targets, &cur, &key, &value)) {
        const struct target *t = value;
        if (expo_labels(labels, sizeof(labels), "namespace", t->ns, "scaledobject", t->name,
                        "model", t->spec.model, (char *)NULL) < 0)
            continue;
        struct target_row *row = &pg->targets[pg->ntargets];
        if ((row->labels = arena_add(pg, labels)) == SIZE_MAX)
            goto fail;
        target_row_fill(st, t, now_ms, row);
        pg->ntargets++;
    }
    cur = 0;
    while (strmap_next(st->models, &cur, &key, &value)) {
        const struct model_sig *m = value;
        if (expo_labels(labels, sizeof(labels), "model", m->name, (char *)NULL) < 0)
            continue;
        struct model_row *row = &pg->models[pg->nmodels];
        if ((row->labels = arena_add(pg, labels)) == SIZE_MAX)
            goto fail;
        row->v[0] = m->token_rate;
        row->v[1] = effective_held(st, m, now_ms);
        row->v[2] = m->queued;
        row->v[3] = m->inflight;
        row->v[4] = (double)m->wakes;
        memcpy(row->decisions, m->decisions, sizeof(row->decisions));
        pg->nmodels++;
    }

    if (expo_family(pg->head, "thaw_scaler_targets", "gauge",
                    "ScaledObject triggers known to the scaler.") < 0 ||
        expo_sample_more(pg->head, "thaw_scaler_targets", NULL, NULL, (double)nt) < 0 ||
        expo_family(pg->head, "thaw_scaler_targets_max", "gauge",
                    "The most ScaledObject triggers the scaler keeps (--max-targets); 0: no "
                    "limit.") < 0 ||
        expo_sample_more(pg->head, "thaw_scaler_targets_max", NULL, NULL,
                         (double)st->cfg.max_targets) < 0 ||
        expo_family(pg->head, "thaw_scaler_targets_refused_total", "counter",
                    "Calls for a new ScaledObject refused (RESOURCE_EXHAUSTED) because "
                    "--max-targets were known.") < 0 ||
        expo_sample_more(pg->head, "thaw_scaler_targets_refused_total", NULL, NULL,
                         (double)st->targets_refused) < 0 ||
        expo_family(pg->head, "thaw_scaler_restored_floors_total", "counter",
                    "Targets new to this scaler (a restart, a failover from another replica) "
                    "that were given the replicas last reported for them, read back from "
                    "Prometheus (--restore-window-seconds).") < 0 ||
        expo_sample_more(pg->head, "thaw_scaler_restored_floors_total", NULL, NULL,
                         (double)st->restored_floors) < 0 ||
        expo_family(pg->head, "thaw_scaler_restore_reads_total", "counter",
                    "Read-back queries answered (result ok) or failed (result failed: the "
                    "targets waiting for it are answered without a floor).") < 0 ||
        expo_sample_more(pg->head, "thaw_scaler_restore_reads_total", "result=\"ok\"", NULL,
                         (double)st->restore_reads_ok) < 0 ||
        expo_sample_more(pg->head, "thaw_scaler_restore_reads_total", "result=\"failed\"", NULL,
                         (double)st->restore_reads_failed) < 0)
        goto fail;

    int failed = expo_family(pg->tail, "thaw_scaler_source_up", "gauge",
                             "1 when the source's last round trip succeeded.");
    for (int s = 0; s < SOURCE_COUNT; s++) {
        expo_labels(labels, sizeof(labels), "source", source_names[s], (char *)NULL);
        failed |= expo_sample_more(pg->tail, "thaw_scaler_source_up", labels, NULL,
                                   (st->src[s].ever_ok && !st->src[s].failing) ? 1 : 0);
    }
    failed |= expo_family(pg->tail, "thaw_scaler_source_errors_total", "counter",
                          "Failed source round trips.");
    for (int s = 0; s < SOURCE_COUNT; s++) {
        expo_labels(labels, sizeof(labels), "source", source_names[s], (char *)NULL);
        failed |= expo_sample_more(pg->tail, "thaw_scaler_source_errors_total", labels, NULL,
                                   (double)st->src[s].errors);
    }
    failed |= expo_family(pg->tail, "thaw_scaler_source_updates_total", "counter",
                          "Successful source round trips.");
    for (int s = 0; s < SOURCE_COUNT; s++) {
        expo_labels(labels, sizeof(labels), "source", source_names[s], (char *)NULL);
        failed |= expo_sample_more(pg->tail, "thaw_scaler_source_updates_total", labels, NULL,
                                   (double)st->src[s].updates);
    }
    failed |= expo_family(pg->tail, "thaw_scaler_source_staleness_seconds", "gauge",
                          "Seconds since the source last succeeded (since start if never).");
    for (int s = 0; s < SOURCE_COUNT; s++) {
        int64_t since = st->src[s].ever_ok ? st->src[s].last_ok_ms : st->start_ms;
        expo_labels(labels, sizeof(labels), "source", source_names[s], (char *)NULL);
        failed |= expo_sample_more(pg->tail, "thaw_scaler_source_staleness_seconds", labels, NULL,
                                   (double)(now_ms - since) / 1000.0);
    }
    if (failed)
        goto fail;
    return pg;
fail:
    scaler_page_free(pg);
    return NULL;
}

/* A wake and the fall to zero are a model's rarest and most telling
 * decisions. rate() misses a series that appears at 1, so these two are
 * exposed at 0 from the model's first target on; the other pairs appear
 * with their first decision (3 x POLICY_REASON_COUNT zero series per model would be most of
 * /metrics at 10 000 models). Adds the samples written to *n; -1 when one
 * could not be written. */
static int write_model_decisions(struct evbuffer *out, const char *model_labels,
                                 const struct model_row *row, size_t *n)
{
    char more[96];
    for (int d = 0; d < 3; d++) {
        for (int r = 0; r < POLICY_REASON_COUNT; r++) {
            bool wake_or_zero = (d == POLICY_UP && r == POLICY_REASON_HELD) ||
                                (d == POLICY_DOWN && r == POLICY_REASON_IDLE);
            if (!row->decisions[d][r] && !wake_or_zero)
                continue;
            /* Fixed identifiers: nothing to escape. */
            snprintf(more, sizeof(more), "direction=\"%s\",reason=\"%s\"",
                     policy_direction_to_str((enum policy_direction)d),
                     policy_reason_to_str((enum policy_reason)r));
            if (expo_sample_more(out, "thaw_scaler_decisions_total", model_labels, more,
                                 (double)row->decisions[d][r]) < 0)
                return -1;
            (*n)++;
        }
    }
    return 0;
}

/* Room for the next ROOM_SAMPLES samples in one chain. evbuffer_add alone
 * grows a buffer 4 KB at a time, a malloc every 40 samples; a whole step's
 * room at once (hundreds of KB) is mmap'ed fresh by malloc and page-faults
 * on every page. 30 KB comes from the heap and is reused page after page. */
enum { ROOM_SAMPLES = 256 };

static int make_room(struct evbuffer *out, size_t done, size_t *room_at)
{
    *room_at = done + ROOM_SAMPLES;
    return evbuffer_expand(out, ROOM_SAMPLES * 120);
}

static int metrics_page_step(struct scaler_page *pg, struct evbuffer *out, size_t budget)
{
    size_t done = 0, room_at = 0;
    char more[96];
    while (pg->section != SECTION_DONE && done < budget) {
        int sec = pg->section;
        if (sec == SECTION_HEAD || sec == SECTION_TAIL) {
            if (evbuffer_add_buffer(out, sec == SECTION_HEAD ? pg->head : pg->tail) < 0)
                return -1;
            pg->section++;
            continue;
        }
        if (sec < SECTION_MODELS) {
            int f = sec - SECTION_TARGETS;
            if (pg->row == 0 && expo_family(out, per_target_family[f][0], per_target_family[f][1],
                                            per_target_family[f][2]) < 0)
                return -1;
            for (; pg->row < pg->ntargets && done < budget; pg->row++) {
                const struct target_row *row = &pg->targets[pg->row];
                if (!(row->present & (1u << f)))
                    continue;
                if (done >= room_at && make_room(out, done, &room_at) < 0)
                    return -1;
                const char *more_labels = NULL;
                if (f == FAMILY_DECISION_INFO) {
                    snprintf(more, sizeof(more), "reason=\"%s\",direction=\"%s\"",
                             policy_reason_to_str((enum policy_reason)row->reason),
                             policy_direction_to_str((enum policy_direction)row->direction));
                    more_labels = more;
                }
                if (expo_sample_more(out, per_target_family[f][0], pg->arena + row->labels,
                                     more_labels, row->v[f]) < 0)
                    return -1;
                done++;
            }
        } else if (sec < SECTION_DECISIONS) {
            int f = sec - SECTION_MODELS;
            if (pg->row == 0 && expo_family(out, per_model_family[f][0], per_model_family[f][1],
                                            per_model_family[f][2]) < 0)
                return -1;
            for (; pg->row < pg->nmodels && done < budget; pg->row++, done++) {
                if (done >= room_at && make_room(out, done, &room_at) < 0)
                    return -1;
                if (expo_sample_more(out, per_model_family[f][0],
                                     pg->arena + pg->models[pg->row].labels, NULL,
                                     pg->models[pg->row].v[f]) < 0)
                    return -1;
            }
        } else {
            if (pg->row == 0 && expo_family(out, "thaw_scaler_decisions_total", "counter",
                                            "Decision changes per model, by direction and "
                                            "reason.") < 0)
                return -1;
            for (; pg->row < pg->nmodels && done < budget; pg->row++) {
                if (done >= room_at && make_room(out, done, &room_at) < 0)
                    return -1;
                if (write_model_decisions(out, pg->arena + pg->models[pg->row].labels,
                                          &pg->models[pg->row], &done) < 0)
                    return -1;
            }
        }
        size_t rows = sec < SECTION_MODELS ? pg->ntargets : pg->nmodels;
        if (pg->row >= rows) {
            pg->section++;
            pg->row = 0;
        }
    }
    return pg->section == SECTION_DONE ? 1 : 0;
}

struct scaler_page *scaler_state_models_page(const struct scaler_state *st, int64_t now_ms)
{
    (void)now_ms; /* each step renders the targets as they are then */
    struct scaler_page *pg = page_new(PAGE_MODELS);
    if (!pg)
        return NULL;
    size_t nt = strmap_count(st->targets);
    pg->ids = thaw_calloc(nt ? nt : 1, sizeof(*pg->ids));
    if (!pg->ids) {
        scaler_page_free(pg);
        return NULL;
    }
    size_t cur = 0;
    const char *key;
    void *value;
    while (strmap_next(st->targets, &cur, &key, &value)) {
        if ((pg->ids[pg->nids] = arena_add(pg, key)) == SIZE_MAX) {
            scaler_page_free(pg);
            return NULL;
        }
        pg->nids++;
    }
    return pg;
}

/* One /models entry: inputs, decision, targets and the policy in force. */
static json_t *target_json(const struct scaler_state *st, const struct target *t, int64_t now_ms)
{
    const struct policy_decision *d = &t->decision;
    json_t *o = json_pack(
        "{s:s, s:s, s:s, s:{s:f, s:f, s:f, s:f, s:s, s:b, s:b, s:b}, s:I, s:I, s:b, s:s, s:s, "
        "s:f, s:b, s:{s:f, s:f, s:f, s:f}}",
        "namespace", t->ns, "scaledObject", t->name, "model", t->spec.model, "inputs",
        "tokenRate", t->model->token_rate, "queueLength", t->queue->length, "heldRequests",
        effective_held(st, t->model, now_ms), "queuedRequests", t->model->queued, "redisKey",
        t->spec.redis_key, "tokenRateStale", (int)rate_stale(st, t), "queueStale",
        (int)queue_stale(st, t), "heldStale", (int)held_stale(st, t), "desired", (json_int_t)d->desired, "raw",
        (json_int_t)d->raw, "active", (int)d->active, "reason",
        policy_reason_to_str(d->reason), "direction", policy_direction_to_str(t->change_direction),
        "secondsSinceChange", (double)(now_ms - t->last_change_ms) / 1000.0,
        "beyondStalenessLimit", (int)target_beyond_staleness(st, t, now_ms), "targets",
        "tokensPerSecond", t->spec.target_tokens_per_second, "queueLength",
        t->spec.target_queue_length, "activationTokenRate", t->spec.activation_token_rate,
        "activationQueueLength", t->spec.activation_queue_length);
    if (!o)
        return NULL;
    /* True while GetMetrics and an idle IsActive wait for a first reading. */
    json_object_set_new(o, "awaitingData", json_boolean(!t->fresh));
    json_t *ins = json_object_get(o, "inputs");
    if (ins) {
        json_object_set_new(ins, "inflightRequests", json_real(t->model->inflight));
        json_object_set_new(ins, "silentActivators", json_integer(t->model->silent));
    }
    /* The policy in force and what it has learned, so "why this many
     * replicas" can be answered without reading the metadata. */
    struct policy_params p;
    target_policy_params(st, t, &p);
    /* The utilisation target of the last decision (the bursty one while the
     * demand is bursty); before any, the configured one (0 means none: all
     * of the capacity). */
    double u = t->decided ? t->pstate.utilisation
                          : (p.target_utilisation > 0 ? p.target_utilisation : 1.0);
    json_t *pol = json_pack(
        "{s:s, s:f, s:f, s:b, s:b, s:f}", "name", t->spec.policy_v1 ? "v1" : "v2",
        "coldStartSeconds", (double)p.cold_start_ms / 1000.0, "targetUtilisation", u, "bursty",
        (int)(t->decided && t->pstate.bursty), "panicking", (int)(t->decided && t->pstate.over_panic),
        "scaleDownWindowSeconds",
        (double)(t->decided ? t->pstate.down_window_ms : p.scale_down_window_ms) / 1000.0);
    if (pol) {
        /* null before the policy's first decision computes it */
        int64_t kw = t->spec.policy_v1 ? 0 : t->pstate.keep_warm_ms;
        json_object_set_new(pol, "keepWarmSeconds",
                            kw >= 0 ? json_real((double)kw / 1000.0) : json_null());
        /* Learned from the wake episodes remembered (outliers among them
         * left out); none: the prior. */
        json_object_set_new(pol, "tokensPerRequest",
                            json_real(policy_tokens_per_request(&p, &t->pstate)));
        json_object_set_new(pol, "tokensPerRequestEpisodes",
                            json_integer(t->spec.policy_v1 ? 0 : t->pstate.nkappa));
        /* The order the backlog is sent in, and who said so. */
        json_object_set_new(pol, "lateAfterSeconds", json_real((double)p.late_after_ms / 1000.0));
        json_object_set_new(pol, "lateAfterFrom",
                            json_string(t->model->late_after_ms >= 0 && !t->spec.policy_v1
                                            ? "activators"
                                            : "scaledObject"));
        json_object_set_new(pol, "idleSignal",
                            json_string(p.idle_by_activators ? "activators" : "tokenRate"));
        json_object_set_new(o, "policy", pol);
    }
    return o;
}

static int add_json_text(const char *buf, size_t size, void *out)
{
    return evbuffer_add(out, buf, size);
}

static int models_page_step(struct scaler_page *pg, const struct scaler_state *st,
                            struct evbuffer *out, int64_t now_ms, size_t budget)
{
    if (pg->section == SECTION_DONE)
        return 1;
    if (pg->section == SECTION_HEAD) {
        if (evbuffer_add(out, "[", 1) < 0)
            return -1;
        pg->section = SECTION_TARGETS;
    }
    for (size_t done = 0; pg->row < pg->nids && done < budget; pg->row++) {
        /* Removed since the page began: left out. */
        const struct target *t = strmap_get(st->targets, pg->arena + pg->ids[pg->row]);
        if (!t)
            continue;
        json_t *o = target_json(st, t, now_ms);
        if (!o)
            return -1;
        int rc = (pg->written++ ? evbuffer_add(out, ",", 1) : 0);
        if (rc == 0)
            rc = json_dump_callback(o, add_json_text, out, JSON_COMPACT | JSON_REAL_PRECISION(6));
        json_decref(o);
        if (rc != 0)
            return -1;
        done++;
    }
    if (pg->row < pg->nids)
        return 0;
    if (evbuffer_add(out, "]", 1) < 0)
        return -1;
    pg->section = SECTION_DONE;
    return 1;
}

int scaler_page_step(struct scaler_page *pg, const struct scaler_state *st, struct evbuffer *out,
                     int64_t now_ms, size_t budget)
{
    if (budget == 0)
        budget = 1;
    return pg->kind == PAGE_METRICS ? metrics_page_step(pg, out, budget)
                                    : models_page_step(pg, st, out, now_ms, budget);
}

/* A whole page at once (tests, small states). */
static void write_page(struct scaler_page *pg, const struct scaler_state *st,
                       struct evbuffer *out, int64_t now_ms)
{
    while (pg && scaler_page_step(pg, st, out, now_ms, SIZE_MAX) == 0)
        ;
    scaler_page_free(pg);
}

void scaler_state_write_metrics(const struct scaler_state *st, struct evbuffer *out,
                                int64_t now_ms)
{
    write_page(scaler_state_metrics_page(st, now_ms), st, out, now_ms);
}

void scaler_state_write_models_json(const struct scaler_state *st, struct evbuffer *out,
                                    int64_t now_ms)
{
    write_page(scaler_state_models_page(st, now_ms), st, out, now_ms);
}
