/* redis_source: the Redis signals, through hiredis's async API on libevent.
 *
 * - Queue lengths: a list (LLEN), sorted set (ZCARD) or stream (XLEN; with a
 *   consumer group: that group's pending + lag) per key, the type detected by
 *   Redis itself. All keys of one interval cost one round trip, whatever their
 *   number.
 * - Held and queued requests: activators keep `HSET thaw:held:<model> <instance>
 *   <held>:<unix-ms>[:<queued>[:<late-ms>[:<inflight>]]]` fresh; the sums of fresh fields
 *   per model and the order their queues are sent in, also one round trip per
 *   interval.
 * - Wake messages: a second connection stays SUBSCRIBEd to `thaw:wake`; each
 *   message body is a model name, delivered to on_wake as it arrives.
 * Both connections reconnect by themselves with a capped backoff.
 * hiredis 0.14 has no async timeouts: a command not answered within the
 * timeout fails its callback and the connection is dropped and reopened.
 *
 * Callbacks may call any function here, redis_source_free included. */
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
    uint64_t commands;    /* commands sent in all batches (one per 1000 keys,
                             plus an EVAL retry after NOSCRIPT) */
    uint64_t failures;    /* batches that failed */
    uint64_t reconnects;  /* connection attempts after the first, both connections */
    uint64_t wake_messages;
    /* The wake subscription is confirmed (SUBSCRIBE answered): false while
     * its connection is down or refused, e.g. by an ACL without pub/sub. */
    bool wake_subscribed;
};

/* url: redis://[:password@]host[:port][/db] (password and db optional; also
 * redis://user:password@... for a Redis 6 ACL user, %-escapes decoded, and
 * [IPv6] hosts). timeout_ms (> 0) bounds each batch and each connect +
 * handshake. Does not block on the network: connects in the background
 * (hiredis 0.14 does resolve a host name with a blocking getaddrinfo; give an
 * address or a name the local resolver answers at once). Returns NULL with
 * err filled on a bad URL, bad arguments or allocation failure. Does not take
 * ownership of base, which must outlive the source. */
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

/* lengths[i] is the length for query i: 0 for a missing key, -1 for a key of
 * an unsupported type, -2 - XLEN for a stream whose consumer group does not
 * exist (none of it has been read by the group: the whole stream waits, which
 * errs on the side of keeping the model up). A list gives LLEN, a sorted set ZCARD, a stream XLEN or, with a
 * group, that group's pending + lag. Redis 7.0 reports lag as nil after
 * deletions and for a group created at $ until it first catches up; then the
 * entries after the group's last-delivered-id are counted (exact up to 1000
 * per key and 10000 per script call; beyond that min(XLEN, entries-added -
 * entries-read), an over-estimate). status < 0 (and
 * lengths NULL) when the batch failed as a whole (any script error, timeout,
 * connection lost); err says why ("timeout" for a timeout). Arrays are valid
 * only during the call. */
typedef void (*redis_queue_cb)(void *ud, int status, const long long *lengths, size_t n,
                               const char *err);
/* Copies what it needs from q. Returns 0 if sent, -1 if not connected, a
 * batch of the same kind is still in flight, n > REDIS_SOURCE_MAX_KEYS, an
 * argument is NULL or allocation failed. cb is never called from inside this
 * function; after 0 it is called exactly once unless the source is freed
 * first. n == 0 is allowed (cb gets n == 0 on the next loop turn). */
#define REDIS_SOURCE_MAX_KEYS 100000
int redis_source_queue_lengths(struct redis_source *src, const struct redis_queue_query *q,
                               size_t n, redis_queue_cb cb, void *ud);

/* Per model, from the fields of thaw:held:<models[i]> whose timestamp is
 * within fresh_ms of now_unix_ms (either side: clock skew): held[i] sums the
 * requests activators hold because nothing is ready, queued[i] those waiting
 * at an activator's concurrency cap while replicas are ready, late_ms[i] is
 * the smallest lateAfterSeconds (ms; 0: FIFO) said by the fields with such a
 * queue, -1 when none says one (no queue, or only activators older than the
 * setting, whose values have three parts) (field values "<held>:<unix-ms>",
 * "<held>:<unix-ms>:<queued>", "<held>:<unix-ms>:<queued>:<late-ms>" or
 * that plus ":<inflight>", any ":<part>" after the fifth skipped; inflight[i]
 * sums the requests the activators have in a backend (a malformed or
 * 10-digit fifth part counts 0, the field's other parts still count); fields
 * that fail to parse, longer
 * than 256 bytes or with a number over 9 digits are ignored; a missing key or
 * one that is not a hash counts 0). Same status, copying and calling rules as
 * above; silent[i] counts the readable fields of thaw:held:<models[i]> that
 * are stale by up to 10 minutes or stamped more than fresh_ms ahead:
 * activators that stopped reporting while they carried requests (their
 * in-flight count is unknown). On failure the five arrays are NULL. */
typedef void (*redis_held_cb)(void *ud, int status, const long long *held,
                              const long long *queued, const long long *late_ms,
                              const long long *inflight, const long long *silent, size_t n,
                              const char *err);
int redis_source_held_counts(struct redis_source *src, const char *const *models, size_t n,
                             int64_t now_unix_ms, int64_t fresh_ms, redis_held_cb cb, void *ud);

void redis_source_get_stats(const struct redis_source *src, struct redis_source_stats *out);

#endif
