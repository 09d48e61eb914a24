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
     * again (and each tier stays in deadline order). Rare, so a scan. */
    struct holdq_node *after = NULL, *before = q->head[t];
    while (before && before->enqueued_ms < n->enqueued_ms) {
        after = before;
        before = before->next;
    }
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
    if (q->last_late[t] == n)
        q->last_late[t] = n->prev; /* still late, and so is all before it */
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

bool holdq_is_late(const struct holdq_node *n, int64_t now_ms, int64_t late_after_ms,
                   int64_t ready_since_ms)
{
    /* Times are monotonic milliseconds, far from the int64 bounds. */
    int64_t from = n->enqueued_ms > ready_since_ms ? n->enqueued_ms : ready_since_ms;
    return from < now_ms - late_after_ms;
}

struct holdq_node *holdq_pop_fresh_first(struct holdq *q, int64_t now_ms, int64_t late_after_ms,
                                         int64_t ready_since_ms)
{
    if (late_after_ms <= 0)
        return holdq_pop(q);
    if (ready_since_ms != q->ready_since_ms || late_after_ms != q->late_after_ms) {
        /* Held requests' clocks start at the release, and a reload may
         * lengthen late_after: what was late before may not be now. */
        memset(q->last_late, 0, sizeof(q->last_late));
        q->ready_since_ms = ready_since_ms;
        q->late_after_ms = late_after_ms;
    }
    for (int t = 0; t < TIER_COUNT; t++) {
        if (!q->head[t])
            continue;
        struct holdq_node *n = q->last_late[t] ? q->last_late[t]->next : q->head[t];
        while (n && holdq_is_late(n, now_ms, late_after_ms, ready_since_ms)) {
            q->last_late[t] = n;
            n = n->next;
        }
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
