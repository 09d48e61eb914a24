/* http_conn_cap: a cap on the connections an evhttp server holds open.
 *
 * evhttp in libevent 2.1 accepts every connection and keeps each until its
 * timeout, so a client that opens idle connections faster than they time
 * out can use up the process's file descriptors, and with them the proxy's
 * or the gRPC port's accepts. With a cap attached, a connection accepted
 * while `max` are open gets a 503 ("too many connections") and is closed at
 * once, before evhttp reads from it.
 *
 * How (2.1 has no connection hook): the cap supplies each new connection's
 * bufferevent (evhttp_set_bevcb) and, later in the same loop pass, finds
 * the connection through that bufferevent's callback argument and sets a
 * close callback on it. The connection's close callback slot is the cap's:
 * the owner must not set its own.
 *
 * Promises: the open count is exact while the server runs; every accepted
 * connection over the cap is closed, counted and logged
 * (event=http_connections_full, at most every 10 s), and answered 503 as
 * far as the client lets it be (one still sending may see a reset). */
#ifndef THAW_HTTP_CONN_CAP_H
#define THAW_HTTP_CONN_CAP_H

#include <stdint.h>

struct event_base;
struct evhttp;
struct evbuffer;
struct http_conn_cap;

/* Attaches a cap of max_connections (>= 1) to http. name labels the log
 * lines (e.g. "admin"). Returns NULL when out of memory. */
struct http_conn_cap *http_conn_cap_new(struct event_base *base, struct evhttp *http,
                                        int max_connections, const char *name);
/* Call after evhttp_free() of the server it was attached to (that frees the
 * connections, which report their close here). Accepts NULL. */
void http_conn_cap_free(struct http_conn_cap *cap);

int http_conn_cap_open(const struct http_conn_cap *cap);
uint64_t http_conn_cap_refused(const struct http_conn_cap *cap);

/* Writes <prefix>_connections (gauge) and <prefix>_connections_refused_total. */
void http_conn_cap_write_metrics(const struct http_conn_cap *cap, struct evbuffer *out,
                                 const char *prefix, const char *what);

#endif
