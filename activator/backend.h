/* backend: the endpoints that serve one model, and how to reach them.
 *
 * Sources: a URL whose host is an IP literal (one endpoint), a URL whose host
 * is a DNS name (re-resolved every dnsRefreshSeconds with evdns, every address
 * an endpoint: a headless Service), or an endpoints file (one IP:PORT a line,
 * re-read when its mtime, size or inode changes). Endpoint lists are merged:
 * an endpoint that stays keeps its pool and counters; one that goes is
 * retired and freed when its last request ends.
 *
 * Health: endpoints start unhealthy. While probing is on (the model is
 * waking, ready or draining), every unhealthy endpoint is probed with a
 * backoff doubling from probeInitialMs to probeMaxMs; a 2xx makes it healthy.
 * A request that cannot connect marks its endpoint down (probed again).
 *
 * Each endpoint keeps a LIFO pool of idle upstream connections, closed after
 * upstreamIdleTimeoutSeconds or when the peer closes them. */
#ifndef THAW_BACKEND_H
#define THAW_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <jansson.h>

#include "config.h"

struct event_base;
struct evdns_base;
struct conn;
struct backend;
struct endpoint;

enum backend_down_reason {
    BACKEND_DOWN_REQUEST, /* a request found the last healthy endpoint dead */
    BACKEND_DOWN_LIST,    /* the endpoint list lost its last healthy endpoint */
    BACKEND_DOWN_REPLACED, /* ... to new ones, not probed yet (a rolling update) */
};

struct backend_callbacks {
    /* An endpoint passed its health check. */
    void (*on_healthy)(void *ud);
    /* No healthy endpoint is left. */
    void (*on_down)(void *ud, enum backend_down_reason why);
};

struct backend_stats {
    size_t endpoints; /* current (not retired) */
    size_t healthy;
    size_t idle_conns;
    uint64_t probes;
    uint64_t probe_failures;
    uint64_t list_updates;
};

/* mc and lim are read now and on backend_reconfigure; not kept. dns may be
 * NULL when no model needs name resolution. Returns NULL on failure. */
struct backend *backend_new(struct event_base *base, struct evdns_base *dns,
                            const struct model_config *mc, const struct limits_config *lim,
                            const struct backend_callbacks *cbs, void *ud);
/* Frees pools, probes and endpoints. Callers must have ended every request
 * (endpoint_release) first. Accepts NULL. */
void backend_free(struct backend *b);

/* Applies new settings; a changed endpoint source replaces the list (a name's
 * at its first answer: the old list serves until then). dns is the resolver
 * to use from now on (NULL: none). A source that could not start (a name
 * without a resolver) leaves the old list and is tried again at the next
 * call. */
int backend_reconfigure(struct backend *b, struct evdns_base *dns, const struct model_config *mc,
                        const struct limits_config *lim);

/* The activators sharing each endpoint's cap, in BALANCE_PEER_UNITs (this
 * one included; a draining peer counts for the part of its share it still
 * uses; 0 counts as one). Starts at one; kept across backend_reconfigure. */
void backend_set_peers(struct backend *b, unsigned peers_milli);
/* The most requests this activator has outstanding on any one endpoint. */
unsigned backend_max_outstanding(const struct backend *b);
/* This activator's cap per endpoint now: maxConcurrencyPerEndpoint, split
 * by the peers when splitConcurrencyAcrossActivators (0: no cap). */
unsigned backend_cap(const struct backend *b);

/* The endpoint to send the next request to (least outstanding, below the
 * cap), or NULL. Does not count the request: call endpoint_acquire. */
struct endpoint *backend_pick(struct backend *b);
/* Requests the healthy endpoints can take now (SIZE_MAX when uncapped). */
size_t backend_capacity(const struct backend *b);
bool backend_any_healthy(const struct backend *b);

/* No more DNS lookups, file polls or probes (the drain is over, or a
 * fallback was removed). A lookup under way is cancelled and finished by
 * libevent on a later loop turn, so call this while the loop still runs. The
 * endpoints stay as they are; backend_reconfigure starts it again. */
void backend_stop(struct backend *b);

void backend_probe_start(struct backend *b);
void backend_probe_stop(struct backend *b);

void backend_get_stats(const struct backend *b, struct backend_stats *out);
/* A JSON array describing the endpoints (new reference, NULL on OOM). */
json_t *backend_to_json(const struct backend *b);
/* Calls fn for each current endpoint (metrics). */
void backend_each_endpoint(const struct backend *b,
                           void (*fn)(void *ud, const char *label, unsigned outstanding,
                                      bool healthy, uint64_t requests),
                           void *ud);

void endpoint_acquire(struct endpoint *ep);
/* Ends a request; may free a retired endpoint, so do not use ep after. */
void endpoint_release(struct endpoint *ep);
/* The endpoint refused or reset a connection before any byte was sent. */
void endpoint_mark_down(struct endpoint *ep);

/* An idle pooled connection (callbacks and timeout cleared), or NULL. */
struct conn *endpoint_pool_take(struct endpoint *ep);
/* Returns a connection after a complete exchange; it may be closed instead
 * (pool full, endpoint retired or down). Takes ownership. */
void endpoint_pool_give(struct endpoint *ep, struct conn *c);

const struct sockaddr *endpoint_addr(const struct endpoint *ep, socklen_t *len);
const char *endpoint_label(const struct endpoint *ep);
/* Host header for requests that came without one (HTTP/1.0). */
const char *endpoint_host_header(const struct endpoint *ep);

#endif
