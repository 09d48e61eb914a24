/* http_conn_cap: a cap on the connections an evhttp server holds open.
 *
 * evhttp in libevent 2.1 accepts every connection and keeps each until its
 * timeout, so a client that opens idle connections faster than they time
 * out can use up the process's file descriptors, and with them the proxy's
 * or the gRPC port's accepts. With a cap attached, a connection accepted
 * while `max` are open gets a 503 ("too many connections") and is closed at
 * once, before evhttp reads from it, unless an open connection has been idle
 * (nothing read or written, nothing buffered) for evict_idle_ms: then the
 * least recently active such one is closed instead, as a client closing it
 * would, and the new one is kept, as nginx reuses idle keep-alive
 * connections when it runs out. So a client holding idle connections cannot
 * lock out probes and scrapes; only connections in use make it refuse.
 *
 * How (2.1 has no connection hook): the cap supplies each new connection's
 * bufferevent (evhttp_set_bevcb) and, later in the same loop pass, finds
 * the connection through that bufferevent's callback argument and sets a
 * close callback on it. The connection's close callback slot is the cap's:
 * the owner must not set its own. "Idle" is judged from the connection's
 * buffers: a request evhttp has begun to parse is in progress until an
 * answer has left whole (a deferred answer too); a chunked answer that
 * pauses with nothing buffered for evict_idle_ms could be taken for idle
 * (no handler here sends one).
 *
 * Promises: the open count is exact while the server runs (an evicted
 * connection counts until evhttp has freed it, one loop turn later); every
 * accepted connection over the cap is either let in by an eviction or
 * closed, counted and answered 503 as far as the client lets it be (one
 * still sending may see a reset); both are counted and logged
 * (event=http_connections_full, at most every 10 s). */
#ifndef THAW_HTTP_CONN_CAP_H
#define THAW_HTTP_CONN_CAP_H

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct evhttp;
struct evbuffer;
struct http_conn_cap;

/* What the binaries pass as evict_idle_ms: a request's bytes arrive well
 * within it, so a connection silent that long is between requests or never
 * used. */
#define HTTP_CONN_CAP_EVICT_IDLE_MS 2000

/* Attaches a cap of max_connections (>= 1) to http; idle connections are
 * evicted after evict_idle_ms without bytes (0: at once, even one whose
 * first request is still on its way). name labels the log lines
 * (e.g. "admin"). Returns NULL when out of memory. */
struct http_conn_cap *http_conn_cap_new(struct event_base *base, struct evhttp *http,
                                        int max_connections, int64_t evict_idle_ms,
                                        const char *name);
/* Call after evhttp_free() of the server it was attached to (that frees the
 * connections, which report their close here). Accepts NULL. */
void http_conn_cap_free(struct http_conn_cap *cap);

int http_conn_cap_open(const struct http_conn_cap *cap);
/* Bytes answered and not yet taken by the clients, over the open
 * connections: what clients that do not read hold of the process's memory
 * (a page handed to evhttp stays until sent or its write timeout). O(open). */
size_t http_conn_cap_unsent_bytes(const struct http_conn_cap *cap);
/* What both binaries' admin ports allow of it before a new /metrics or
 * /models page gets 503: four of the largest (15 MB at 10 000 models). */
#define HTTP_CONN_CAP_MAX_UNSENT_BYTES ((size_t)64 << 20)
uint64_t http_conn_cap_refused(const struct http_conn_cap *cap);
uint64_t http_conn_cap_evicted(const struct http_conn_cap *cap);

/* Writes <prefix>_connections (gauge), <prefix>_connections_refused_total
 * and <prefix>_connections_evicted_total. */
void http_conn_cap_write_metrics(const struct http_conn_cap *cap, struct evbuffer *out,
                                 const char *prefix, const char *what);

#endif
