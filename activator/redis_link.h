/* redis_link: the activator's side of the Redis contract, on hiredis async +
 * libevent.
 *
 *   PUBLISH thaw:wake <model>                          on the first held request
 *   HSET thaw:held:<model> <instance-id> <held>:<unix-ms>[:<queued>:<late-ms>]
 *                                                      every second while the hold queue is
 *                                                      not empty
 *   HDEL thaw:held:<model> <instance-id>               when the hold queue is empty
 *   EVAL <script> 1 thaw:held:<model> <max-age-ms> <unix-ms>
 *                                                      about once a minute while writing
 *                                                      that key: HDEL fields older than
 *                                                      max-age (crashed activators'),
 *                                                      PEXPIRE the key max-age
 *   EVAL <script> 2 thaw:activators:<group> thaw:activators:<group>:w
 *        <instance-id> <ttl-ms> <weight>               every second: ZADD this instance
 *                                                      at Redis's TIME, drop members
 *                                                      older than ttl-ms, HSET its weight
 *                                                      (thousandths of a peer: 1000 live,
 *                                                      the share still used while
 *                                                      draining), drop the weights of
 *                                                      members gone, PEXPIRE both keys
 *                                                      2 ttl, reply the live members'
 *                                                      weights summed (1000 for a member
 *                                                      without one: an older activator)
 *   ZREM thaw:activators:<group> <instance-id>,
 *   HDEL thaw:activators:<group>:w <instance-id>       once drained
 *
 * held counts requests waiting because the model has no ready replica (the
 * scaler wakes the model); queued counts requests waiting while the model is
 * ready, because every endpoint is at its concurrency cap (a serving
 * backlog). The :<queued> part is there only when queued > 0, so the value of
 * a cold hold keeps the two-part form older scalers parse. :<late-ms> is the
 * model's lateAfterSeconds in ms (0: FIFO), there whenever :<queued> is: the
 * scaler clears a late-last backlog over lateClearSeconds without the
 * ScaledObject repeating the setting. (Scalers older than this part ignore
 * such values: upgrade thaw-scaler first.)
 *
 * The link connects in the background and reconnects by itself with a capped
 * backoff. hiredis 0.14 has no async timeouts, so the link keeps its own: a
 * connect or a command not answered within timeout_ms drops the connection
 * (pending callbacks fail) and a new one is made. Redis being down never
 * blocks callers: commands are refused (-1) and the caller retries later. */
#ifndef THAW_REDIS_LINK_H
#define THAW_REDIS_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct redis_link;

struct redis_link_stats {
    uint64_t commands;
    uint64_t failures;
    uint64_t connects;   /* successful connections */
    uint64_t timeouts;
};

/* Called when the link comes up (true) or goes down (false); may be NULL. */
typedef void (*redis_link_state_cb)(void *ud, bool up);

/* url: redis://[:password@]host[:port][/db]. Returns NULL with err filled on
 * a bad URL or allocation failure; never blocks. */
struct redis_link *redis_link_new(struct event_base *base, const char *url,
                                  const char *instance_id, long timeout_ms,
                                  redis_link_state_cb cb, void *ud, char *err, size_t errlen);
/* Accepts NULL. */
void redis_link_free(struct redis_link *l);

bool redis_link_up(const struct redis_link *l);
/* Up, the last reply on this connection was not an error, and no command
 * has waited for one over a second: what a wake or a held count sent now
 * would reach the scaler. False for a Redis that accepts connections but
 * does not answer, or answers only errors (NOAUTH, READONLY). */
bool redis_link_answering(const struct redis_link *l);

/* PUBLISH thaw:wake model. Returns 0 if sent, -1 if the link is down. */
int redis_link_wake(struct redis_link *l, const char *model);

/* HSET (held, queued or inflight > 0) or HDEL (all 0) of this instance's
 * field in thaw:held:<model>; the value is <held>:<unix_ms>, plus
 * :<queued>:<late_after_ms> (0 when <= 0: FIFO) when queued or inflight > 0,
 * plus :<inflight> (requests in a backend) when inflight > 0. Returns 0 if
 * sent, -1 if the link is down. */
int redis_link_held(struct redis_link *l, const char *model, size_t held, size_t queued,
                    size_t inflight, int64_t late_after_ms, int64_t unix_ms);

/* Garbage collection of thaw:held:<model>, asked for about once a minute per
 * model while this instance writes its field there: a crashed activator never
 * deletes its field (the scaler ignores it once it is 10 minutes old). Deletes
 * the fields stamped more than 10 minutes before both Redis's clock and
 * unix_ms (only a field whose writer disagrees with both: one wrong clock does
 * not delete live fields), and sets the key to expire 10 minutes on, so a
 * hash that no live activator writes any more goes too (each writer's sweep
 * pushes that back). Returns 0 if sent, -1 if the link is down. */
int redis_link_held_sweep(struct redis_link *l, const char *model, int64_t unix_ms);

/* Called with the live activators counted by a heartbeat, in thousandths
 * of a peer (each weighted; >= 0). */
typedef void (*redis_link_peers_cb)(void *ud, long long peers_milli);
void redis_link_set_peers_cb(struct redis_link *l, redis_link_peers_cb cb, void *ud);

/* Counts this instance live in the sorted set key for ttl_ms with weight
 * weight_milli (0-1000; its weights live in key:w) and asks for the live
 * members' weights summed; the answer goes to the peers callback. Returns 0
 * if sent, -1 if the link is down. */
int redis_link_heartbeat(struct redis_link *l, const char *key, long ttl_ms,
                         unsigned weight_milli);
/* Removes this instance and its weight from key (drained: peers widen their
 * share now, not a TTL later). Returns 0 if sent, -1 if the link is down. */
int redis_link_leave(struct redis_link *l, const char *key);

void redis_link_get_stats(const struct redis_link *l, struct redis_link_stats *out);

/* Parses a redis URL. host is copied into host (hostlen); password into pass
 * (empty when none); db is 0 when absent. Returns 0 or -1. */
int redis_link_parse_url(const char *url, char *host, size_t hostlen, int *port, char *pass,
                         size_t passlen, int *db);

#endif
