/* holdq: the per-model queue of held requests, pure (no I/O, time passed in).
 *
 * Three FIFOs, one per tier; pop takes the highest tier first, then arrival
 * order. Bounded by count and bytes: when an entry does not fit, lower-tier
 * entries can be shed to make room (holdq_victim), newest of the lowest tier
 * first, so high-priority traffic is shed last. Nodes are intrusive: the
 * caller embeds a struct holdq_node in its request and owns its memory.
 *
 * Late requests last (holdq_pop_fresh_first): a request that has waited longer
 * than late_after since it could first be sent (its arrival; for one held
 * through a wake, see below) is likely to miss a time-to-first-token
 * objective of that order anyway; sending it before a
 * newer one makes that one late as well. So within a tier the request on time
 * whose clock started first goes first, and late ones, oldest first, only when
 * no request of the tier is on time. A late request is not dropped: it waits
 * for a free slot or its hold timeout like any other.
 *
 * Requests held through a wake (enqueued before the model became ready) were
 * promised a cold start, not a warm answer: the one that waited longest has
 * used its allowance up, one that came in at the end of the wake has not. So
 * each keeps the wake as an allowance: its clock starts at its enqueue time
 * plus the wake's length (from when the model stopped taking requests, or the
 * oldest enqueue time then held if later, to ready_since), not all at once at
 * ready_since. Without it, every held request turned late together late_after
 * after the release and newer requests passed the whole backlog, so the ones
 * held at the end of a wake missed a deadline they could have met (earliest
 * deadline first among those on time).
 *
 * Lateness only grows with time and both parts of a tier (held through the
 * wake, then the rest) are in clock order, so each part keeps a cursor to its
 * last known late entry and a pop costs O(1) amortized. A removal moves a
 * cursor back one entry, which can leave the second part's cursor on the
 * first part; it is then not used (the second part starts over).
 *
 * Deadlines: pop_expired and next_deadline look at the head of each tier,
 * so each tier is kept in deadline order as it is in arrival order: entries
 * of one model share a hold timeout, and when a reload changes it
 * (holdq_set_hold_timeout) every deadline becomes the earlier of its own and
 * enqueued + the new timeout; an entry put back (holdq_push_front) gets the
 * same, and never outlives an entry behind it. Otherwise a lowered timeout
 * would not apply to new entries until the older, longer ones expired. */
#ifndef THAW_HOLDQ_H
#define THAW_HOLDQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

struct holdq_node {
    struct holdq_node *prev, *next;
    enum tier tier;
    size_t bytes;
    int64_t enqueued_ms;
    int64_t deadline_ms;
    bool queued;
};

struct holdq {
    struct holdq_node *head[TIER_COUNT], *tail[TIER_COUNT];
    /* Per tier, valid for ready_since_ms and late_after_ms and reset when
     * either changes: the last entry known to be held through the wake
     * (enqueued before ready_since_ms; they come first), the last of those
     * known to be late, and the last known late entry after them (each: all
     * before it in its part are too), or NULL. */
    struct holdq_node *last_held[TIER_COUNT];
    struct holdq_node *last_late_held[TIER_COUNT];
    struct holdq_node *last_late[TIER_COUNT];
    int64_t ready_since_ms;
    int64_t late_after_ms;
    int64_t held_allowance_ms; /* the wake's length, added to held entries' clocks */
    size_t count;
    size_t count_by_tier[TIER_COUNT];
    size_t bytes;
    size_t max_count;
    size_t max_bytes;
    int64_t hold_timeout_ms; /* 0: not set (deadlines as given) */
};

void holdq_init(struct holdq *q, size_t max_count, size_t max_bytes);
void holdq_set_limits(struct holdq *q, size_t max_count, size_t max_bytes);
/* Records the hold timeout (ms, > 0) and brings every queued deadline down
 * to enqueued + timeout_ms at most (a reload that shortened it applies to
 * the requests held already, and keeps each tier in deadline order). The
 * caller re-arms its deadline timer: deadlines may now be in the past. */
void holdq_set_hold_timeout(struct holdq *q, int64_t timeout_ms);

/* True if an entry of `bytes` fits within both bounds now. */
bool holdq_fits(const struct holdq *q, size_t bytes);

/* The entry to shed so that an entry of `tier` and `bytes` may fit: the
 * newest entry of the lowest tier strictly below `tier`. NULL when it fits
 * already or nothing lower-tier is queued. Does not remove it. */
struct holdq_node *holdq_victim(const struct holdq *q, enum tier tier, size_t bytes);

/* Appends n (not checking bounds: callers check holdq_fits first). */
void holdq_push(struct holdq *q, struct holdq_node *n, enum tier tier, size_t bytes,
                int64_t now_ms, int64_t deadline_ms);
/* Puts n back in its tier at its place by enqueue time, keeping its times (a
 * released request that has to wait again keeps its place), its deadline
 * brought down to enqueued + the hold timeout and to the deadline of the
 * entry behind it, those before it to its own (at most), so that the tier
 * stays in deadline order. Bounds are not checked. */
void holdq_push_front(struct holdq *q, struct holdq_node *n);

/* Removes and returns the next entry to release, or NULL: the highest tier
 * first, then arrival order. */
struct holdq_node *holdq_pop(struct holdq *q);
/* Like holdq_pop, but within a tier entries that have waited more than
 * late_after_ms since they could first be sent go after those that have not,
 * and those on time go by that time (earliest deadline first). An entry's
 * clock starts at enqueued, or, for an entry enqueued before ready_since_ms,
 * at enqueued plus the wake's length: ready_since_ms less the later of
 * wake_start_ms and the oldest entry's enqueue time, measured at the first
 * call with a new ready_since_ms. late_after_ms <= 0: holdq_pop.
 * ready_since_ms: when the model last became ready (held requests could not
 * be sent before); wake_start_ms: when it last stopped taking requests (time
 * spent waiting for a slot before that is not part of the wake). */
struct holdq_node *holdq_pop_fresh_first(struct holdq *q, int64_t now_ms, int64_t late_after_ms,
                                         int64_t ready_since_ms, int64_t wake_start_ms);
/* Whether n was late when holdq_pop_fresh_first last ran (with late_after_ms
 * > 0) at now_ms: what it sends last. */
bool holdq_is_late(const struct holdq *q, const struct holdq_node *n, int64_t now_ms);
/* Removes and returns an entry whose deadline is <= now, or NULL. */
struct holdq_node *holdq_pop_expired(struct holdq *q, int64_t now_ms);
/* Unlinks n if queued (no-op otherwise). */
void holdq_remove(struct holdq *q, struct holdq_node *n);

/* Earliest deadline among the tier heads, INT64_MAX when empty. */
int64_t holdq_next_deadline(const struct holdq *q);

/* Removes and returns an entry enqueued at or before t_ms (the highest tier
 * first), or NULL: what has been held long enough for a fallback. Each tier
 * is in enqueue order, so only the heads are looked at. */
struct holdq_node *holdq_pop_enqueued_by(struct holdq *q, int64_t t_ms);
/* Enqueue time of the oldest entry, INT64_MAX when empty. */
int64_t holdq_oldest_enqueued(const struct holdq *q);

#endif
