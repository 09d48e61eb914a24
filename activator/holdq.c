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
    n->prev = NULL;
    n->next = q->head[t];
    if (q->head[t])
        q->head[t]->prev = n;
    else
        q->tail[t] = n;
    q->head[t] = n;
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
