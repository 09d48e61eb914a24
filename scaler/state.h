/* state: every ScaledObject target the scaler knows, the signals per model
 * and per queue, and the policy decision of each target. No I/O, no clock:
 * callers pass time in (monotonic ms), so tests drive it directly.
 *
 * A target is one ScaledObject trigger: (namespace, name, model). Signals are
 * shared: the token rate and held count per model, the queue length per
 * (redisKey, group). Source results update signals; every update re-decides
 * the targets it touches and reports changed decisions through on_change. */
#ifndef THAW_STATE_H
#define THAW_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metadata.h"
#include "policy.h"

struct evbuffer;
struct scaler_state;
struct target;
struct prom_sample;
struct redis_queue_query;

enum source_id { SOURCE_PROMETHEUS = 0, SOURCE_REDIS_QUEUE, SOURCE_REDIS_HELD, SOURCE_COUNT };
const char *source_to_str(enum source_id s);

struct scaler_state_config {
    int64_t staleness_limit_ms;   /* GetMetrics fails past this; default 60 s */
    int64_t scale_down_window_ms; /* policy stabilization, steady demand */
    int64_t bursty_scale_down_window_ms; /* ... and bursty demand, if longer */
    int64_t wake_hold_ms;         /* a wake message counts as one held request this long */
    int64_t target_expiry_ms;     /* targets not asked about this long are dropped */
    size_t max_targets;           /* new targets past this many are refused; 0: no limit */
    /* What wakes may claim is held for one model, all activators together
     * (an activator's own count is capped by the caller); 0: no limit. */
    double max_wake_held;
    /* A target new to this scaler gets the answer last reported for it
     * within this long, read back from Prometheus (restore.h), as a floor
     * held at most this long and no longer than its own scale-down window;
     * 0: nothing is read back. */
    int64_t restore_window_ms;
};

/* Reports a changed decision (desired, active or reason), old NULL for a new target. */
typedef void (*state_change_fn)(void *ud, struct target *t, const struct policy_decision *old,
                                const struct policy_decision *now);

/* A target-level event (see scaler_state_set_target_hooks). */
typedef void (*state_target_fn)(void *ud, struct target *t);

struct scaler_state *scaler_state_new(const struct scaler_state_config *cfg, int64_t now_ms,
                                      state_change_fn on_change, void *ud);
void scaler_state_free(struct scaler_state *st);

/* Finds or creates the target for ns/name/spec->model and refreshes its spec
 * (copied) and last-seen time. New targets are decided at once. Returns NULL
 * on allocation failure, or for a new target when max_targets are known
 * (scaler_state_full tells which; the refusal is counted). */
struct target *scaler_state_upsert(struct scaler_state *st, const char *ns, const char *name,
                                   const struct scaler_spec *spec, int64_t now_ms);
/* on_new_target: a target appeared whose inputs have not all been read since
 * (the caller reads the sources at once rather than at the next interval).
 * on_fresh: a target has just been decided for the first time on inputs all
 * read since it appeared. Either may be NULL. */
void scaler_state_set_target_hooks(struct scaler_state *st, state_target_fn on_new_target,
                                   void *new_target_ud, state_target_fn on_fresh, void *fresh_ud);
/* True until the target has been decided on a Prometheus answer, a read of
 * its queue and a read of the held counts that all came after it appeared
 * (a restart, a new ScaledObject). Until then its idle answer would be a
 * guess from zeros: a busy model would read as idle. */
bool target_awaiting_data(const struct target *t);
/* Awaiting data, and some source has not answered for the target at all
 * yet: a reading is on its way. False when every source answered but the
 * answer is no reading (e.g. a NaN series): waiting would not help. */
bool target_first_read_due(const struct target *t);
/* The read-back (restore.h). With restore_window_ms > 0 a target new to
 * this scaler (after a restart, or when KEDA fails over from another
 * replica) whose scale-down window could hold a floor is not fresh, and its
 * first reading stays due (target_first_read_due), until a read-back
 * answers: its first answers wait, as for a first reading, so KEDA never
 * sees the forgetful one; its /metrics series are left out meanwhile (a
 * scrape of them could replace the very answer being read back).
 * restore_wanted says some target waits for it. restore_done takes the
 * query's answer (samples with label RESTORE_LABEL, keyed like target ids;
 * samples NULL and err set when the query failed: no floors) for every
 * target waiting: it holds the target's floor (policy_state_restore) until
 * the shorter of restore_window_ms and its scale-down window (the longer of
 * its steady and bursty ones) after it appeared, and decides it. */
bool scaler_state_restore_wanted(const struct scaler_state *st);
void scaler_state_restore_done(struct scaler_state *st, const struct prom_sample *samples,
                               size_t n, const char *err, int64_t now_ms);
/* Targets given a floor so far. */
uint64_t scaler_state_restored_floors(const struct scaler_state *st);

/* True while any source's last read failed. */
bool scaler_state_source_failing(const struct scaler_state *st);
size_t scaler_state_target_count(const struct scaler_state *st);
/* True when max_targets are known: a new target would be refused. */
bool scaler_state_full(const struct scaler_state *st);

/* A target with references (open streams) is never expired. */
void target_ref(struct target *t);
void target_unref(struct target *t);
const struct policy_decision *target_decision(const struct target *t);
const struct scaler_spec *target_spec(const struct target *t);
const char *target_namespace(const struct target *t);
const char *target_name(const struct target *t);
/* True when a source this target depends on has had no success for longer
 * than the staleness limit (GetMetrics then answers UNAVAILABLE). */
bool target_beyond_staleness(const struct scaler_state *st, const struct target *t,
                             int64_t now_ms);

/* Source results. A successful Prometheus result sets every known model's
 * token rate (models absent from it get 0). */
void scaler_state_prom_ok(struct scaler_state *st, const struct prom_sample *samples, size_t n,
                          int64_t now_ms);
void scaler_state_source_failed(struct scaler_state *st, enum source_id src, const char *err,
                                int64_t now_ms);

/* Builds the queue batch: one entry per distinct (key, group). The arrays
 * stay valid until the next call of this function or scaler_state_gc. */
size_t scaler_state_queue_batch(struct scaler_state *st, const struct redis_queue_query **out);
/* lengths in the order of the last batch; -1 entries (wrong type) count as 0,
 * -2 - n (a stream without the consumer group) as n; both are logged once. */
void scaler_state_queue_ok(struct scaler_state *st, const long long *lengths, size_t n,
                           int64_t now_ms);
/* Model names for the held batch, same validity rules. */
size_t scaler_state_held_batch(struct scaler_state *st, const char *const **out);
/* held[i]: requests held while nothing is ready; queued[i] (may be NULL):
 * requests waiting at activators' concurrency caps, added to the queue input
 * of every target of the model; late_ms[i] (may be NULL): the activators'
 * lateAfterSeconds in ms for that queue (-1: none reported), which the
 * model's v2 targets use instead of their metadata's while it is >= 0;
 * inflight[i] (may be NULL: none): requests the activators have in a backend,
 * the idle signal of targets with idleSignal activators; silent[i] (may be
 * NULL: none): activators that stopped reporting while they carried requests,
 * which makes that signal unknown (the token rate decides meanwhile). */
void scaler_state_held_ok(struct scaler_state *st, const long long *held, const long long *queued,
                          const long long *late_ms, const long long *inflight,
                          const long long *silent, size_t n, int64_t now_ms);

/* Activators that posted wakes with who they are, remembered per model
 * (more at once: the claims ending first are dropped). */
#define WAKE_CLAIMS 16

/* A wake: the model counts as holding `held` requests (at least 1) for
 * wake_hold_ms, from `instance` (an activator's id; NULL: unnamed, e.g. a
 * Redis wake message). Claims of different instances add up; an instance's
 * newer claim replaces its older one; unnamed claims count as the largest of
 * them, not added (an activator's Redis message and its post are one wake).
 * The held input is the larger of that and Redis's count. Returns the number of targets of that model (0 when
 * unknown). */
size_t scaler_state_wake(struct scaler_state *st, const char *model, const char *instance,
                         double held, int64_t now_ms);

/* Re-decides every target (time passes: stabilization windows, staleness). */
void scaler_state_tick(struct scaler_state *st, int64_t now_ms);

/* Drops expired targets and signals nobody uses. Only call when no source
 * batch is in flight (their arrays are rebuilt afterwards). */
void scaler_state_gc(struct scaler_state *st, int64_t now_ms);

/* Calls fn for each target of a model (for pushing on streams). */
void scaler_state_foreach_model_target(struct scaler_state *st, const char *model,
                                       void (*fn)(void *ud, struct target *t), void *ud);

/* Exposition of inputs, decisions and source health (thaw_scaler_*). */
void scaler_state_write_metrics(const struct scaler_state *st, struct evbuffer *out,
                                int64_t now_ms);
/* JSON array for /models, appended to out. */
void scaler_state_write_models_json(const struct scaler_state *st, struct evbuffer *out,
                                    int64_t now_ms);

/* The same pages built in steps, so that one page of 10 000 models does not
 * hold the event loop for its whole length. A page holds no pointer into
 * the state: the state may change, and lose targets, between two steps.
 * - metrics: every value is copied when the page begins (one pass over the
 *   targets and models); steps only format the copy, so the page reads as
 *   of that moment.
 * - models: the targets' ids are copied when the page begins; each step
 *   renders the next of them as they are then (a target removed since is
 *   left out, one added since waits for the next page).
 * Returns NULL on allocation failure. */
struct scaler_page;
struct scaler_page *scaler_state_metrics_page(const struct scaler_state *st, int64_t now_ms);
struct scaler_page *scaler_state_models_page(const struct scaler_state *st, int64_t now_ms);
/* Appends about `budget` more samples (metrics) or targets (models) to out.
 * Returns 1 when the page is complete, 0 when more remains, -1 on allocation
 * failure (the page is then incomplete: drop it). */
int scaler_page_step(struct scaler_page *pg, const struct scaler_state *st, struct evbuffer *out,
                     int64_t now_ms, size_t budget);
/* Accepts NULL. */
void scaler_page_free(struct scaler_page *pg);
/* True when every source has succeeded at least once. */
bool scaler_state_sources_ready(const struct scaler_state *st);

#endif
