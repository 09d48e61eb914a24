/* proxy: the activator's data path on libevent, one thread.
 *
 * Clients speak HTTP/1.1 (keep-alive, pipelining handled one request at a
 * time); each request is parsed (http1), routed to a model (route), and
 * either forwarded to one of the model's endpoints over a pooled keep-alive
 * connection or held until the model is ready (model_sm + holdq). Bodies
 * stream both ways through bounded buffers: a full destination stops reading
 * from the source until it drains below half (backpressure). Response bodies
 * are forwarded as they arrive, chunk by chunk, never buffered whole.
 *
 * Every request the proxy starts reading ends with exactly one outcome
 * (proxy_outcome), counted per model, so accepted = sum of outcomes once idle. */
#ifndef THAW_PROXY_H
#define THAW_PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "config.h"

struct event_base;
struct evbuffer;
struct redis_link;
struct proxy;

enum proxy_outcome {
    OUT_OK,                /* the backend's response, forwarded completely */
    OUT_BAD_REQUEST,       /* 400 (and 417/501/505 parse refusals) */
    OUT_BODY_TOO_LARGE,    /* 413 */
    OUT_HEADERS_TOO_LARGE, /* 431 */
    OUT_HEADER_TIMEOUT,    /* 408: the head did not arrive in time */
    OUT_BODY_TIMEOUT,      /* 408 (or cut): the forwarded body stalled past bodyIdleTimeout */
    OUT_MODEL_NOT_FOUND,   /* 404 */
    OUT_HOLD_FULL,         /* 503: hold queue full */
    OUT_SHED,              /* 503: pushed out by a higher-priority request */
    OUT_DRAINING,          /* 503: shutting down */
    OUT_HOLD_TIMEOUT,      /* 504: held past the model's hold timeout */
    OUT_UPSTREAM_TIMEOUT,  /* 504 before the response head, else the response cut: the
                              backend went quiet (responseHeader/IdleTimeout) */
    OUT_BAD_GATEWAY,       /* 502: the backend failed after the request was sent */
    OUT_ABORTED,           /* response cut short (backend or drain deadline) */
    OUT_CLIENT_CLOSED,     /* the client left before its answer */
    OUT_INTERNAL,          /* 500: out of memory or similar */
    OUT_SEND_TIMEOUT,      /* cut: the client took no response byte for sendTimeoutSeconds */
    OUT_NO_SOCKET,         /* 503: no local socket for the model server within connectTimeout */
};
#define PROXY_OUTCOME_COUNT 18

const char *proxy_outcome_to_str(enum proxy_outcome o);

/* Takes ownership of cfg (also on failure). Without Redis (proxy_set_redis)
 * holding and probing work the same, only the signals are not sent and the
 * concurrency cap is not split among peers. dns_server ("IP" or "IP:PORT", or NULL) is the nameserver backend names are
 * resolved with instead of /etc/resolv.conf's (/etc/hosts still answers
 * first). */
struct proxy *proxy_new(struct event_base *base, struct config *cfg, const char *dns_server,
                        char *err, size_t errlen);
/* Closes every connection and frees everything. Accepts NULL. */
void proxy_free(struct proxy *px);

/* The Redis link to use from now on (not owned; NULL: none), and the peer
 * group whose live members share each endpoint's maxConcurrencyPerEndpoint
 * (sorted set thaw:activators:<group>; NULL: "default"). */
void proxy_set_redis(struct proxy *px, struct redis_link *redis, const char *peer_group);
/* One event=access log line per finished request (model, request line,
 * status, outcome, client, endpoint, held time, time to the response head,
 * total time, X-Request-Id). Off by default. */
void proxy_set_access_log(struct proxy *px, bool on);

/* Sends every wake straight to thaw-scaler too (POST /wake to each address
 * of url, activator/scaler_wake.h), and while Redis is down renews it every
 * second for each waking model with held requests. Returns 0, or -1 with err
 * (bad URL, no resolver). */
int proxy_set_scaler_wake(struct proxy *px, const char *url, const char *instance,
                          long timeout_ms, char *err, size_t errlen);
size_t proxy_model_count(const struct proxy *px);
long proxy_drain_timeout_ms(const struct proxy *px);

/* Binds and listens on host:port (port 0 picks one). */
int proxy_listen(struct proxy *px, const char *host, int port, char *err, size_t errlen);
/* The bound port, or -1. */
int proxy_port(const struct proxy *px);

/* Replaces the configuration (takes ownership). Models keep their state and
 * held requests by name; new models start cold; removed models drain. Open
 * connections are kept. Returns 0. */
int proxy_reload(struct proxy *px, struct config *cfg);

/* SIGTERM: stop accepting, let in-flight and held requests finish until the
 * drain timeout, then answer the rest 503 and close. done is called once,
 * when no connection is left. */
void proxy_drain(struct proxy *px, void (*done)(void *ud), void *ud);
bool proxy_is_draining(const struct proxy *px);

/* Wakes a model ahead of traffic (and its wakeWith models). Returns 0, or -1
 * for an unknown model. */
int proxy_wake(struct proxy *px, const char *model);

/* Redis came up or went down (wired to redis_link's state callback). */
void proxy_redis_state(void *px, bool up);

/* Prometheus text exposition of the proxy's metrics. */
void proxy_write_metrics(struct proxy *px, struct evbuffer *out);
/* {"models":[{name,state,held,inflight,...,endpoints:[...]}]}; new reference. */
json_t *proxy_models_json(struct proxy *px);

/* Totals for tests and logs. */
struct proxy_totals {
    uint64_t accepted;
    uint64_t outcomes[PROXY_OUTCOME_COUNT];
    uint64_t connections;
    size_t open_connections;
    size_t lingering_connections; /* closing, waiting for the client's FIN */
    size_t held;
    size_t inflight;
};
void proxy_get_totals(const struct proxy *px, struct proxy_totals *out);

#endif
