#include "holdq.h"

#include <string.h>

void holdq_init(struct holdq *q, size_t max_count, size_t max_bytes)
{
    memset(q, 0, sizeof(*q));
    q->max_count = max_count;
    q->max_bytes = max_bytes;
}

void holdq_set_limits(struct holdq *q, size_t max_count, size_t max_bytes)
{
    q->max_count = max_count;
    q->max_bytes = max_bytes;
}

void holdq_set_hold_timeout(struct holdq *q, int64_t timeout_ms)
{
    q->hold_timeout_ms = timeout_ms;
    /* The earlier of two sequences that grow with arrival grows with
     * arrival too: each tier stays in deadline order. */
    for (int t = 0; t < TIER_COUNT; t++) {
        for (struct holdq_node *n = q->head[t]; n; n = n->next) {
            if (timeout_ms > 0 && n->deadline_ms > n->enqueued_ms + timeout_ms)
                n->deadline_ms = n->enqueued_ms + timeout_ms;
        }
    }
}

bool holdq_fits(const struct holdq *q, size_t bytes)
{
    return q->count < q->max_count && bytes <= q->max_bytes && q->bytes <= q->max_bytes - bytes;
}

struct holdq_node *holdq_victim(const struct holdq *q, enum tier tier, size_t bytes)
{
    if (holdq_fits(q, bytes) || bytes > q->max_bytes)
        return NULL;
    for (int t = TIER_COUNT - 1; t > (int)tier; t--) {
        if (q->tail[t])
            return q->tail[t];
    }
    return NULL;
}

static void link_tail(struct holdq *q, struct holdq_node *n)
{
    int t = n->tier;
    n->next = NULL;
    n->prev = q->tail[t];
    if (q->tail[t])
        q->tail[t]->next = n;
    else
        q->head[t] = n;
    q->tail[t] = n;
}

static void account(struct holdq *q, struct holdq_node *n)
{
    n->queued = true;
    q->count++;
    q->count_by_tier[n->tier]++;
    q->bytes += n->bytes;
}

void holdq_push(struct holdq *q, struct holdq_node *n, enum tier tier, size_t bytes,
                int64_t now_ms, int64_t deadline_ms)
{
    n->tier = tier;
    n->bytes = bytes;
    n->enqueued_ms = now_ms;
    n->deadline_ms = deadline_ms;
    link_tail(q, n);
    account(q, n);
}

void holdq_push_front(struct holdq *q, struct holdq_node *n)
{
    int t = n->tier;
    /* Back to its place by arrival: it was popped from the head, or, with
     * late requests last, from behind late ones, which it must not pass
     * again (and each tier stays in deadline order). Rare, so a scan. The
     * cursors stay valid: clocks grow with arrival within each part, so
     * landing before a late entry of its part means it is late too (and
     * pop does not use the newer part's cursor when it is on a held one). */
    struct holdq_node *after = NULL, *before = q->head[t];
    while (before && before->enqueued_ms < n->enqueued_ms) {
        after = before;
        before = before->next;
    }
    /* While it was out, a reload may have shortened the timeout (and the
     * deadlines of those queued). An older entry does not outlive a newer
     * one: the tier stays in deadline order for pop_expired. */
    if (q->hold_timeout_ms > 0 && n->deadline_ms > n->enqueued_ms + q->hold_timeout_ms)
        n->deadline_ms = n->enqueued_ms + q->hold_timeout_ms;
    if (before && n->deadline_ms > before->deadline_ms)
        n->deadline_ms = before->deadline_ms;
    for (struct holdq_node *p = after; p && p->deadline_ms > n->deadline_ms; p = p->prev)
        p->deadline_ms = n->deadline_ms;
    n->prev = after;
    n->next = before;
    if (after)
        after->next = n;
    else
        q->head[t] = n;
    if (before)
        before->prev = n;
    else
        q->tail[t] = n;
    account(q, n);
}

void holdq_remove(struct holdq *q, struct holdq_node *n)
{
    if (!n->queued)
        return;
    int t = n->tier;
    if (n->prev)
        n->prev->next = n->next;
    else
        q->head[t] = n->next;
    if (n->next)
        n->next->prev = n->prev;
    else
        q->tail[t] = n->prev;
    /* Each cursor moves back one: what is before it is still late (held). */
    if (q->last_late[t] == n)
        q->last_late[t] = n->prev;
    if (q->last_late_held[t] == n)
        q->last_late_held[t] = n->prev;
    if (q->last_held[t] == n)
        q->last_held[t] = n->prev;
    n->prev = n->next = NULL;
    n->queued = false;
    q->count--;
    q->count_by_tier[t]--;
    q->bytes -= n->bytes;
}

struct holdq_node *holdq_pop(struct holdq *q)
{
    for (int t = 0; t < TIER_COUNT; t++) {
        struct holdq_node *n = q->head[t];
        if (n) {
            holdq_remove(q, n);
            return n;
        }
    }
    return NULL;
}

static bool held_through_wake(const struct holdq *q, const struct holdq_node *n)
{
    return n->enqueued_ms < q->ready_since_ms;
}

/* When n's clock started (see holdq.h). Times are monotonic milliseconds,
 * far from the int64 bounds. */
static int64_t clock_start(const struct holdq *q, const struct holdq_node *n)
{
    if (held_through_wake(q, n))
        return n->enqueued_ms + q->held_allowance_ms;
    return n->enqueued_ms;
}

bool holdq_is_late(const struct holdq *q, const struct holdq_node *n, int64_t now_ms)
{
    return clock_start(q, n) < now_ms - q->late_after_ms;
}

/* Advances *cursor over the late entries of one part of a tier, from `from`
 * up to (not including) `end`; returns the first entry on time, or NULL. */
static struct holdq_node *first_on_time(const struct holdq *q, struct holdq_node **cursor,
                                        struct holdq_node *from, struct holdq_node *end,
                                        int64_t now_ms)
{
    struct holdq_node *n = from;
    while (n && n != end && holdq_is_late(q, n, now_ms)) {
        *cursor = n;
        n = n->next;
    }
    return n == end ? NULL : n;
}

struct holdq_node *holdq_pop_fresh_first(struct holdq *q, int64_t now_ms, int64_t late_after_ms,
                                         int64_t ready_since_ms, int64_t wake_start_ms)
{
    if (late_after_ms <= 0)
        return holdq_pop(q);
    if (ready_since_ms != q->ready_since_ms) {
        /* The wake just ended: its length is the wait of the oldest entry
         * held through it, counted from the wake's start at most (an entry
         * that waited for a slot before, or was put back from an earlier
         * wake, did not wait for this one that long). */
        int64_t from = holdq_oldest_enqueued(q);
        if (from < wake_start_ms)
            from = wake_start_ms;
        q->held_allowance_ms = from < ready_since_ms ? ready_since_ms - from : 0;
    }
    if (ready_since_ms != q->ready_since_ms || late_after_ms != q->late_after_ms) {
        /* Held requests' clocks start again, and a reload may lengthen
         * late_after: what was late before may not be now. */
        memset(q->last_held, 0, sizeof(q->last_held));
        memset(q->last_late_held, 0, sizeof(q->last_late_held));
        memset(q->last_late, 0, sizeof(q->last_late));
        q->ready_since_ms = ready_since_ms;
        q->late_after_ms = late_after_ms;
    }
    for (int t = 0; t < TIER_COUNT; t++) {
        if (!q->head[t])
            continue;
        /* The entries held through the wake are a prefix of the tier. */
        struct holdq_node *rest = q->last_held[t] ? q->last_held[t]->next : q->head[t];
        while (rest && held_through_wake(q, rest)) {
            q->last_held[t] = rest;
            rest = rest->next;
        }
        struct holdq_node *held =
            first_on_time(q, &q->last_late_held[t],
                          q->last_late_held[t] ? q->last_late_held[t]->next : q->head[t], rest,
                          now_ms);
        /* A removal can leave this cursor on a held entry, and a held entry
         * put back can land after it: the newer part then starts over. */
        struct holdq_node *from = q->last_late[t] && !held_through_wake(q, q->last_late[t])
                                      ? q->last_late[t]->next
                                      : rest;
        struct holdq_node *newer = first_on_time(q, &q->last_late[t], from, NULL, now_ms);
        struct holdq_node *n = held;
        if (!n || (newer && clock_start(q, newer) < clock_start(q, held)))
            n = newer;
        if (!n)
            n = q->head[t]; /* every entry of the tier is late: the oldest */
        holdq_remove(q, n);
        return n;
    }
    return NULL;
}

struct holdq_node *holdq_pop_expired(struct holdq *q, int64_t now_ms)
{
    for (int t = 0; t < TIER_COUNT; t++) {
        struct holdq_node *n = q->head[t];
        if (n && n->deadline_ms <= now_ms) {
            holdq_remove(q, n);
            return n;
        }
    }
    return NULL;
}

int64_t holdq_next_deadline(const struct holdq *q)
{
    int64_t d = INT64_MAX;
    for (int t = 0; t < TIER_COUNT; t++) {
        if (q->head[t] && q->head[t]->deadline_ms < d)
            d = q->head[t]->deadline_ms;
    }
    return d;
}

struct holdq_node *holdq_pop_enqueued_by(struct holdq *q, int64_t t_ms)
{
    for (int t = 0; t < TIER_COUNT; t++) {
        struct holdq_node *n = q->head[t];
        if (n && n->enqueued_ms <= t_ms) {
            holdq_remove(q, n);
            return n;
        }
    }
    return NULL;
}

int64_t holdq_oldest_enqueued(const struct holdq *q)
{
    int64_t e = INT64_MAX;
    for (int t = 0; t < TIER_COUNT; t++) {
        if (q->head[t] && q->head[t]->enqueued_ms < e)
            e = q->head[t]->enqueued_ms;
    }
    return e;
}
