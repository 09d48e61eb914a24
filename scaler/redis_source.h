/* redis_source: the Redis signals, through hiredis's async API on libevent.
 *
 * - Queue lengths: a list (LLEN), sorted set (ZCARD) or stream (XLEN; with a
 *   consumer group: that group's pending + lag) per key, the type detected by
 *   Redis itself. All keys of one interval cost one round trip, whatever their
 *   number.
 * - Held requests: activators keep `HSET thaw:held:<model> <instance> <count>:<unix-ms>`
 *   fresh; the sum of fresh fields per model, also one round trip per interval.
 * - Wake messages: a second connection stays SUBSCRIBEd to `thaw:wake`; each
 *   message body is a model name, delivered to on_wake as it arrives.
 * Both connections reconnect by themselves with a capped backoff.
 * hiredis 0.14 has no async timeouts: a command not answered within the
 * timeout fails its callback and the connection is dropped and reopened. */
#ifndef THAW_REDIS_SOURCE_H
#define THAW_REDIS_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct redis_source;

struct redis_source_callbacks {
    /* A wake message for model (NUL-terminated, valid during the call). */
    void (*on_wake)(void *ud, const char *model);
    /* The command connection went up (true) or down (false). May be NULL. */
    void (*on_state)(void *ud, bool up);
};

struct redis_source_stats {
    uint64_t round_trips; /* batches sent (one per queue/held call) */
    uint64_t commands;    /* commands sent in all batches */
    uint64_t failures;
    uint64_t reconnects;
    uint64_t wake_messages;
};

/* url: redis://[:password@]host[:port][/db] (password and db optional).
 * Does not block: connects in the background. Returns NULL with err filled on
 * a bad URL or allocation failure. */
struct redis_source *redis_source_new(struct event_base *base, const char *url, long timeout_ms,
                                      const struct redis_source_callbacks *cbs, void *ud,
                                      char *err, size_t errlen);
/* Pending callbacks are not called after free. Accepts NULL. */
void redis_source_free(struct redis_source *src);

bool redis_source_connected(const struct redis_source *src);

struct redis_queue_query {
    const char *key;
    const char *group; /* stream consumer group, or NULL */
};

/* lengths[i] is the length for query i, or -1 when that key is missing (0 is
 * reported for a missing key, -1 only for a key of an unsupported type or a
 * per-key error). status < 0 (and lengths NULL) when the batch failed as a
 * whole; err says why. Arrays are valid only during the call. */
typedef void (*redis_queue_cb)(void *ud, int status, const long long *lengths, size_t n,
                               const char *err);
/* Copies what it needs from q. Returns 0 if sent, -1 if not connected or a
 * batch of the same kind is still in flight. cb is never called from inside
 * this function. */
int redis_source_queue_lengths(struct redis_source *src, const struct redis_queue_query *q,
                               size_t n, redis_queue_cb cb, void *ud);

/* held[i] is the sum of the counts of thaw:held:<models[i]> fields whose
 * timestamp is within fresh_ms of now_unix_ms (fields that fail to parse are
 * ignored). Same status, copying and calling rules as above. */
typedef void (*redis_held_cb)(void *ud, int status, const long long *held, size_t n,
                              const char *err);
int redis_source_held_counts(struct redis_source *src, const char *const *models, size_t n,
                             int64_t now_unix_ms, int64_t fresh_ms, redis_held_cb cb, void *ud);

void redis_source_get_stats(const struct redis_source *src, struct redis_source_stats *out);

#endif
