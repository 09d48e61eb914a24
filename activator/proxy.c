#include "proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

#include "alloc.h"
#include "backend.h"
#include "balance.h"
#include "clock.h"
#include "conn.h"
#include "expo.h"
#include "holdq.h"
#include "http1.h"
#include "log.h"
#include "model_sm.h"
#include "redis_guard.h"
#include "redis_link.h"
#include "scaler_wake.h"
#include "route.h"
#include "strmap.h"

#define TICK_MS 100
#define REDIS_REFRESH_MS 1000
/* A metric's labels: a model name, each byte possibly escaped, and another
 * short label. */
#define LABELS_BYTES (2 * MODEL_NAME_MAX + 128)
/* How often a writer of a thaw:held key sweeps crashed activators' fields from it. */
#define HELD_SWEEP_EVERY_MS 60000
/* A peer that has not renewed for this long is no longer counted; ours is
 * renewed every REDIS_REFRESH_MS, so a few lost heartbeats do not count a
 * live activator out. Also how long our last count is trusted without a new
 * answer (Redis down): after that the cap is no longer split. */
#define PEERS_TTL_MS 5000
#define UPSTREAM_HEAD_MAX 65536
#define MAX_SENT_RETRIES 2

enum req_state {
    RS_ROUTING,    /* reading the body start to find the model */
    RS_DISPATCH,   /* between steps (no I/O pending) */
    RS_HELD,       /* in its model's hold queue */
    RS_CONNECTING, /* fresh upstream connection under way; nothing sent */
    RS_UPSTREAM,   /* request sent (or being sent); response awaited or streaming */
};

struct model_rt;
struct client;

struct req {
    struct client *cl;
    struct model_rt *m;
    enum req_state state;
    /* request head */
    bool head_method;
    bool body_method; /* POST/PUT/PATCH: send Content-Length: 0 when bodiless */
    int version_minor;
    bool keep_alive;
    bool need_host;
    char *host;            /* Host value (for routing), or NULL */
    struct evbuffer *head; /* upstream head, without framing fields and blank line */
    /* request body */
    enum http1_body body_kind;
    uint64_t body_len;  /* Content-Length */
    uint64_t body_left; /* Content-Length bytes still to read */
    struct http1_chunked chunk;
    bool body_done;
    uint64_t body_read;    /* decoded bytes read */
    struct evbuffer *body; /* decoded body read but not yet sent (kept for replay) */
    bool up_chunked;
    bool replayable; /* the whole request is in head + body */
    /* hold */
    struct holdq_node hq;
    enum tier tier;
    bool was_held;
    bool released_late; /* counted in late_released (once, however often released) */
    int64_t starved_since_ms; /* first failure to get a local socket, 0 if none */
    int64_t cold_ms; /* time held, -1 if never */
    bool via_fallback; /* sent (or being sent) to the model's fallbackBackend */
    bool fallback_counted; /* counted in fallback_requests (once, however often sent) */
    bool stream;
    struct event *heartbeat;
    bool early_head; /* an SSE head was sent while held */
    /* upstream */
    struct endpoint *ep;
    struct conn *up;
    bool up_reused;
    int sent_retries;
    bool fresh_only; /* a pooled connection failed: the next try opens a new one */
    bool resp_started;
    bool resp_head_done;
    int resp_status;
    struct http1_scan rscan;
    enum http1_body resp_body;
    uint64_t resp_left;
    struct http1_chunked rchunk;
    bool resp_keep_alive;
    bool client_chunked;
    bool close_after;
    bool resp_paused;
    bool body_paused;
    bool head_timer_on; /* responseHeaderTimeout armed for the current send */
    int64_t t_start_us;
    int64_t t_dispatch_us;
    int64_t t_head_us;  /* response head sent to the client, 0 if not */
    int status_sent;    /* the status the client got (ours or the backend's), 0: none */
    char ep_label[48];  /* the last endpoint tried (access log), "" if none */
};

struct client {
    struct proxy *px;
    struct client *prev, *next;
    struct conn *c;
    struct event *timer;
    struct event *kick;
    char ip[INET6_ADDRSTRLEN];
    struct http1_scan scan;
    bool in_head;
    bool closing;
    bool dead;
    bool reset;     /* ends with a reset (SO_LINGER 0): never lingers */
    bool linger;    /* closing lingeringly: input is read and discarded */
    bool lingering; /* ... and the response is out, our side shut down */
    bool linger_last; /* the timer waits for the rest of lingeringTime */
    size_t idle_crlf; /* empty-line bytes dropped since the last request */
    int64_t linger_until_ms;
    uint64_t linger_bytes;
    struct req *req;
};

/* How a lingering close ended (or was refused: full). */
enum linger_result {
    LINGER_EOF,     /* the client closed: the clean end */
    LINGER_TIMEOUT, /* nothing for lingeringTimeoutSeconds */
    LINGER_TIME,    /* lingeringTimeSeconds in all */
    LINGER_BYTES,   /* lingeringMaxBytes discarded */
    LINGER_ERROR,   /* reset by the client, send timeout or drain deadline */
    LINGER_FULL,    /* not lingered: maxLingeringConnections already were */
};
#define LINGER_RESULT_COUNT 6

static const char *const linger_names[LINGER_RESULT_COUNT] = {
    "eof", "timeout", "time", "bytes", "error", "full",
};

struct model_rt {
    struct proxy *px;
    char *name;
    const struct model_config *mc;
    struct model_sm sm;
    struct holdq hq;
    struct backend *be;
    struct event *hold_timer;
    /* fallbackBackend: its endpoints (NULL without one), the timer that sends
     * requests held fallbackAfterSeconds there, and the requests it serves
     * now (still demand for this model: published as held). */
    struct backend *fallback_be;
    struct event *fallback_timer;
    unsigned fallback_inflight;
    uint64_t fallback_requests;
    unsigned inflight;
    /* The most requests in the model's own backends at once since the last
     * refresh of its thaw:held field, and in the refresh interval before: a
     * request shorter than the refresh still shows for two refreshes, so the
     * scaler (reading every second) cannot miss it and call the model idle
     * while it serves. */
    unsigned inflight_peak;
    unsigned inflight_peak_prev;
    uint64_t outcomes[PROXY_OUTCOME_COUNT];
    bool routed; /* a request was routed here: its failure outcomes are exposed from 0 */
    uint64_t wake_signals; /* PUBLISHes sent */
    uint64_t late_released; /* requests released late (lateAfterSeconds), each once */
    uint64_t wakes;        /* wake actions, sent or not */
    bool wake_pending;
    bool held_published; /* our thaw:held field is set (held, queued or in flight), no HDEL since */
    int64_t held_swept_ms; /* last redis_link_held_sweep of its key (monotonic), 0: never */
    bool removed;
    struct expo_histogram hold_hist;
    struct expo_histogram ttfb_hist;
    struct expo_histogram head_hist;
    struct model_rt *next_removed;
};

struct retired_outcomes {
    uint64_t outcomes[PROXY_OUTCOME_COUNT];
    bool routed;
};

/* Names kept in proxy->retired at most; past it a removed model's counts
 * are dropped (logged once). */
#define RETIRED_MAX 10000

struct old_config {
    struct config *cfg;
    struct old_config *next;
};

struct proxy {
    struct event_base *base;
    struct config *cfg;
    bool access_log; /* one event=access line per request */
    struct old_config *old_cfgs;
    struct model_rt **models;
    size_t nmodels;
    struct model_rt *removed;
    /* Outcome counts of models removed and freed, by name, until a model of
     * that name comes back (it goes on from them): accepted keeps equal to
     * the sum of outcomes across reloads. */
    struct strmap *retired;
    bool retired_full_logged;
    /* Names whose thaw:held field outlived their model (freed while Redis
     * was down): deleted once it is back (value unused). */
    struct strmap *hdel_pending;
    struct evdns_base *dns;
    char *dns_server; /* nameserver instead of resolv.conf's, or NULL */
    struct redis_link *redis;
    struct scaler_wake *scaler_wake; /* wakes straight to thaw-scaler, or NULL */
    struct evconnlistener *listener;
    struct event *accept_resume; /* re-enables accepting after an EMFILE pause */
    /* No local socket for an upstream connection (EMFILE, ENOBUFS, no
     * ephemeral port): requests wait in their hold queue until this timer
     * tries again, instead of failing for what is not the backend's doing. */
    struct event *socket_retry;
    bool socket_starved;
    uint64_t socket_failures;
    size_t clients_peak; /* most connections open since the last trim */
    int port;
    struct client *clients;
    size_t nclients;
    struct event *tick;
    int64_t last_redis_ms;
    /* Live activators sharing maxConcurrencyPerEndpoint (this one
     * included), counted in Redis; 1 without a recent answer. */
    unsigned peers; /* in BALANCE_PEER_UNITs: a draining peer counts for the share it uses */
    int64_t peers_seen_ms;
    /* Draining: the weight the last heartbeat carried, and the peers counted
     * by the last reply with this activator as a whole one again (0: no
     * count since the drain began, or the one before it was stale). */
    unsigned weight_sent;
    unsigned peers_as_live;
    char peers_key[300];
    struct event *drain_timer;
    bool draining;
    bool drain_deadline_passed;
    void (*drain_done)(void *ud);
    void *drain_ud;
    bool drain_done_called;
    uint64_t accepted;
    uint64_t unrouted[PROXY_OUTCOME_COUNT];
    uint64_t connections;
    size_t nlingering;
    uint64_t linger_results[LINGER_RESULT_COUNT];
    bool freeing;
    struct conn_flusher *flusher;
    /* Parse results live only during one call on this one thread. */
    struct http1_request *scratch_req;
    struct http1_response *scratch_resp;
    struct route_table *routes; /* index over cfg */
};

static const char *const outcome_names[PROXY_OUTCOME_COUNT] = {
    "ok",           "bad_request",   "body_too_large", "headers_too_large", "header_timeout",
    "body_timeout", "model_not_found", "hold_full",    "shed",              "draining",
    "hold_timeout", "upstream_timeout", "bad_gateway", "aborted",           "client_closed",
    "internal_error", "send_timeout",   "no_socket",
};

/* Failures of the activator or the model server. A labelled counter series
 * that first appears at 1 is missed by rate(), so these are exposed at 0 from
 * a model's first request on, before one of them can end it (a hold timeout
 * or an upstream timeout takes seconds at least), not for every configured
 * model: 10 series per model that has had traffic. */
static const bool outcome_exposed_from_zero[PROXY_OUTCOME_COUNT] = {
    [OUT_HOLD_FULL] = true,        [OUT_SHED] = true,         [OUT_HOLD_TIMEOUT] = true,
    [OUT_UPSTREAM_TIMEOUT] = true, [OUT_BAD_GATEWAY] = true,  [OUT_ABORTED] = true,
    [OUT_INTERNAL] = true,         [OUT_BODY_TIMEOUT] = true, [OUT_SEND_TIMEOUT] = true,
    [OUT_NO_SOCKET] = true,
};

const char *proxy_outcome_to_str(enum proxy_outcome o)
{
    if ((int)o < 0 || o >= PROXY_OUTCOME_COUNT)
        return "unknown";
    return outcome_names[o];
}

static void client_close(struct client *cl, bool linger);
static void client_reset(struct client *cl);
static void client_next(struct client *cl);
static void client_process(struct client *cl);
static void req_forward(struct req *r);
static void req_hold(struct req *r);
static void client_read_ahead(struct client *cl);
static void model_dispatch(struct req *r, enum model_event ev);
static void model_apply(struct model_rt *m, unsigned act);
static void release_held(struct model_rt *m);
static void arm_hold_timer(struct model_rt *m);
static void arm_fallback_timer(struct model_rt *m);
static void release_to_fallback(struct model_rt *m);
static void publish_held(struct model_rt *m);
static void check_drained(struct proxy *px);
static void pump_to_upstream(struct req *r);
static void send_heartbeat_head(struct req *r);
static void commit_sent(struct req *r);
static void disarm_timer(struct client *cl);
static void arm_timer(struct client *cl, long ms);

static int64_t now_ms(void) { return clock_mono_ms(); }

static void tv_ms(struct timeval *tv, long ms)
{
    tv->tv_sec = ms / 1000;
    tv->tv_usec = (ms % 1000) * 1000;
}

/* ---- error responses ---- */

static const char *reason_for(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    }
    return "Error";
}

/* Appends s as the inside of a JSON string. */
static void json_escape_into(struct evbuffer *out, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            evbuffer_add_printf(out, "\\%c", *p);
        else if (*p < 0x20)
            evbuffer_add_printf(out, "\\u%04x", *p);
        else
            evbuffer_add(out, p, 1);
    }
}

static bool is_server_error(int status) { return status >= 500; }

/* Writes an OpenAI-shaped error response; to a HEAD request, its head only
 * (a body there would be read as the start of the next response). */
static void write_error(struct client *cl, int status, const char *code, const char *msg,
                        bool close, bool chunked_sse, bool head)
{
    struct evbuffer *out = conn_output(cl->c);
    struct evbuffer *body = evbuffer_new();
    if (!body) {
        client_close(cl, false);
        return;
    }
    evbuffer_add_printf(body, "{\"error\":{\"message\":\"");
    json_escape_into(body, msg);
    evbuffer_add_printf(body, "\",\"type\":\"%s\",\"param\":null,\"code\":\"%s\"}}",
                        is_server_error(status) ? "server_error" : "invalid_request_error", code);
    if (chunked_sse) {
        /* The SSE head already went out while the request was held: the error
         * travels as an event, then the stream ends. */
        size_t n = evbuffer_get_length(body);
        evbuffer_add_printf(out, "%zx\r\ndata: ", n + 8);
        evbuffer_add_buffer(out, body);
        evbuffer_add(out, "\n\n\r\n0\r\n\r\n", 9);
        evbuffer_free(body);
        return;
    }
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                             "Content-Length: %zu\r\n",
                        status, reason_for(status), evbuffer_get_length(body));
    if (status == 503)
        evbuffer_add_printf(out, "Retry-After: %ld\r\n", cl->px->cfg->limits.retry_after_seconds);
    evbuffer_add_printf(out, "Connection: %s\r\n\r\n", close ? "close" : "keep-alive");
    if (!head)
        evbuffer_add_buffer(out, body);
    evbuffer_free(body);
}

/* ---- request lifetime ---- */

static struct req *req_of_node(struct holdq_node *n)
{
    return (struct req *)(void *)((char *)n - offsetof(struct req, hq));
}

static void count_outcome(struct proxy *px, struct model_rt *m, enum proxy_outcome o)
{
    if (m)
        m->outcomes[o]++;
    else
        px->unrouted[o]++;
}

/* Takes r off its endpoint's books (the caller releases the endpoint). */
static struct endpoint *req_detach_endpoint(struct req *r)
{
    struct endpoint *ep = r->ep;
    r->ep = NULL;
    r->m->inflight--;
    if (r->via_fallback)
        r->m->fallback_inflight--;
    return ep;
}

/* Detaches the upstream side: pools the connection if reuse, else closes it. */
static void up_release(struct req *r, bool reuse)
{
    if (r->up) {
        if (reuse && r->ep) {
            endpoint_pool_give(r->ep, r->up);
        } else {
            conn_free(r->up);
        }
        r->up = NULL;
    }
    if (r->ep)
        endpoint_release(req_detach_endpoint(r));
}

static void req_free(struct req *r)
{
    if (!r)
        return;
    if (r->hq.queued && r->m) {
        holdq_remove(&r->m->hq, &r->hq);
        arm_hold_timer(r->m);
    }
    up_release(r, false);
    if (r->heartbeat)
        event_free(r->heartbeat);
    if (r->head)
        evbuffer_free(r->head);
    if (r->body)
        evbuffer_free(r->body);
    thaw_free(r->host);
    thaw_free(r);
}

/* The request line's method and target, from the upstream head (empty when
 * the request ended before its head was read). */
static void request_line(const struct req *r, char *method, size_t mlen, char *target,
                         size_t tlen)
{
    method[0] = target[0] = '\0';
    if (!r->head)
        return;
    char line[600];
    ev_ssize_t n = evbuffer_copyout(r->head, line, sizeof(line) - 1);
    line[n > 0 ? (size_t)n : 0] = '\0';
    char *eol = strpbrk(line, "\r\n");
    if (eol)
        *eol = '\0';
    char *sp1 = strchr(line, ' ');
    if (!sp1)
        return;
    *sp1 = '\0';
    char *sp2 = strrchr(sp1 + 1, ' ');
    if (sp2)
        *sp2 = '\0';
    snprintf(method, mlen, "%s", line);
    snprintf(target, tlen, "%s", sp1 + 1); /* long targets are cut: a log line, not a record */
}

/* The value of header name (with its colon, lower case) in the head as
 * forwarded, "" if absent; cut to outlen. */
static void head_value(const struct req *r, const char *name, char *out, size_t outlen)
{
    out[0] = '\0';
    if (!r->head)
        return;
    size_t nl = strlen(name);
    struct evbuffer_ptr p = evbuffer_search(r->head, "\r\n", 2, NULL);
    while (p.pos >= 0) {
        char have[32];
        if (nl > sizeof(have) || evbuffer_ptr_set(r->head, &p, 2, EVBUFFER_PTR_ADD) < 0 ||
            evbuffer_copyout_from(r->head, &p, have, nl) < (ev_ssize_t)nl)
            return;
        if (strncasecmp(have, name, nl) == 0) {
            char val[130];
            struct evbuffer_ptr v = p;
            evbuffer_ptr_set(r->head, &v, nl, EVBUFFER_PTR_ADD);
            ev_ssize_t n = evbuffer_copyout_from(r->head, &v, val, sizeof(val) - 1);
            if (n <= 0)
                return;
            val[n] = '\0';
            char *end = strpbrk(val, "\r\n");
            if (end)
                *end = '\0';
            char *start = val;
            while (*start == ' ' || *start == '\t')
                start++;
            snprintf(out, outlen, "%s", start);
            return;
        }
        p = evbuffer_search(r->head, "\r\n", 2, &p);
    }
}

/* One line per finished request, like a web server's access log. Times are
 * from the first byte of the request: head_ms is what the client waited for
 * the response to start, holding included. */
static void log_access(const struct req *r, enum proxy_outcome o)
{
    if (log_get_level() > LOG_LEVEL_INFO)
        return; /* the line would be dropped: skip the header scans */
    const struct client *cl = r->cl;
    char method[24], target[300], id[130], qtarget[320], qid[150], qmodel[300], qmethod[40];
    char traceparent[64], trace[40] = "";
    request_line(r, method, sizeof(method), target, sizeof(target));
    head_value(r, "x-request-id:", id, sizeof(id));
    /* W3C traceparent "00-<32 hex trace id>-<16 hex span>-<flags>": the trace
     * id ties this line to the client's trace (the header is forwarded). */
    head_value(r, "traceparent:", traceparent, sizeof(traceparent));
    if (strlen(traceparent) >= 35 && traceparent[2] == '-' &&
        strspn(traceparent + 3, "0123456789abcdef") == 32)
        snprintf(trace, sizeof(trace), "%.32s", traceparent + 3);
    int64_t now = clock_mono_us();
    long long total_ms = r->t_start_us ? (long long)((now - r->t_start_us) / 1000) : 0;
    long long head_ms = r->t_head_us ? (long long)((r->t_head_us - r->t_start_us) / 1000) : -1;
    /* Held and ended there (timeout, shed, drain): held until now. */
    long long held_ms = r->cold_ms >= 0 ? (long long)r->cold_ms
                        : r->was_held ? (long long)(now_ms() - r->hq.enqueued_ms)
                                      : -1;
    LOG_INFO("access",
             "model=%s method=%s target=%s status=%d outcome=%s client=%s endpoint=%s tier=%s "
             "held_ms=%lld late=%s stream=%s retries=%d body_bytes=%llu head_ms=%lld "
             "total_ms=%lld request_id=%s trace_id=%s",
             r->m ? log_quote(qmodel, sizeof(qmodel), r->m->name) : "-",
             method[0] ? log_quote(qmethod, sizeof(qmethod), method) : "-",
             target[0] ? log_quote(qtarget, sizeof(qtarget), target) : "-", r->status_sent,
             proxy_outcome_to_str(o), cl->ip[0] ? cl->ip : "-", r->ep_label[0] ? r->ep_label : "-",
             tier_to_str(r->tier), held_ms, r->released_late ? "true" : "false",
             r->stream ? "true" : "false", r->sent_retries, (unsigned long long)r->body_read,
             head_ms, total_ms, id[0] ? log_quote(qid, sizeof(qid), id) : "-",
             trace[0] ? trace : "-");
}

/* The access line of a request that ended before its head was read: what is
 * known is the client, the status sent (0: none) and the outcome. */
static void log_access_head(struct client *cl, int status, enum proxy_outcome o)
{
    struct req none;
    memset(&none, 0, sizeof(none));
    none.cl = cl;
    none.cold_ms = -1;
    none.tier = TIER_NORMAL;
    none.status_sent = status;
    log_access(&none, o);
}

/* Ends r with outcome o. The response (if any) is already in the output. */
static void req_end(struct req *r, enum proxy_outcome o, bool close)
{
    struct client *cl = r->cl;
    struct model_rt *m = r->m;
    count_outcome(cl->px, m, o);
    if (cl->px->access_log)
        log_access(r, o);
    bool unread = !r->body_done;
    if (unread)
        close = true; /* unread body bytes would be taken for the next request */
    cl->req = NULL;
    req_free(r);
    if (close || cl->px->draining)
        client_close(cl, unread);
    else
        client_next(cl);
    /* A finished request may free capacity for one that waits. */
    if (m && m->hq.count > 0 && !cl->px->freeing)
        release_held(m);
}

static enum proxy_outcome outcome_for_status(int status)
{
    switch (status) {
    case 413:
        return OUT_BODY_TOO_LARGE;
    case 431:
        return OUT_HEADERS_TOO_LARGE;
    case 408:
        return OUT_HEADER_TIMEOUT;
    case 404:
        return OUT_MODEL_NOT_FOUND;
    case 500:
        return OUT_INTERNAL;
    default:
        return OUT_BAD_REQUEST;
    }
}

/* Answers r with an error of ours and ends it. */
static void req_fail(struct req *r, int status, enum proxy_outcome o, const char *code,
                     const char *msg)
{
    /* !keep_alive: the client asked for a close (Connection: close, or
     * HTTP/1.0 without keep-alive), as for the backend's own answers. */
    bool close = !r->keep_alive || !r->body_done || status == 400 || status == 413 ||
                 status == 431 || o == OUT_NO_SOCKET || r->cl->px->draining;
    up_release(r, false);
    if (r->resp_head_done && !r->early_head) {
        /* Too late for a status: all we can do is cut the connection. */
        req_end(r, OUT_ABORTED, true);
        return;
    }
    write_error(r->cl, status, code, msg, close, r->early_head, r->head_method);
    if (!r->early_head) { /* else the client has our 200 SSE head */
        r->status_sent = status;
        r->t_head_us = clock_mono_us();
    }
    req_end(r, o, close);
}

/* Ends a response under way that cannot be finished. A chunked client gets
 * no last chunk and a Content-Length one a short body; an HTTP/1.0 client
 * whose body ends at the close gets a reset instead, so that no client can
 * take the truncated response for a complete one. */
static void req_cut(struct req *r, enum proxy_outcome o)
{
    up_release(r, false);
    if (!r->client_chunked && r->resp_body != HTTP1_BODY_LENGTH)
        client_reset(r->cl);
    req_end(r, o, true);
}

/* Ends r after a timeout: an error status while the client has seen no
 * response head, else the response is cut. */
static void req_timeout(struct req *r, int status, enum proxy_outcome o, const char *code,
                        const char *msg)
{
    if (r->resp_head_done)
        req_cut(r, o);
    else
        req_fail(r, status, o, code, msg);
}

/* ---- response path (upstream -> client) ---- */

static void add_chunk(struct evbuffer *out, const void *data, size_t len)
{
    if (len == 0)
        return;
    evbuffer_add_printf(out, "%zx\r\n", len);
    evbuffer_add(out, data, len);
    evbuffer_add(out, "\r\n", 2);
}

static void add_chunk_buffer(struct evbuffer *out, struct evbuffer *src, size_t len)
{
    if (len == 0)
        return;
    evbuffer_add_printf(out, "%zx\r\n", len);
    evbuffer_remove_buffer(src, out, len);
    evbuffer_add(out, "\r\n", 2);
}

static void write_client_head(struct req *r, const struct http1_response *h)
{
    struct evbuffer *out = conn_output(r->cl->c);
    bool body = h->body == HTTP1_BODY_LENGTH || h->body == HTTP1_BODY_CHUNKED ||
                h->body == HTTP1_BODY_UNTIL_CLOSE;
    r->client_chunked = (h->body == HTTP1_BODY_CHUNKED || h->body == HTTP1_BODY_UNTIL_CLOSE) &&
                        r->version_minor >= 1;
    if ((h->body == HTTP1_BODY_CHUNKED || h->body == HTTP1_BODY_UNTIL_CLOSE) && !r->client_chunked)
        r->close_after = true; /* HTTP/1.0 client: the end of body is the close */
    if (!r->keep_alive || !r->body_done || r->cl->px->draining)
        r->close_after = true;
    if (r->early_head) {
        /* Our SSE head (chunked) went out already; only the body follows. A
         * backend answer that is not a 200 becomes an SSE error event. */
        r->client_chunked = true;
        return;
    }
    evbuffer_add_printf(out, "HTTP/1.1 %d %.*s\r\n", h->status, (int)h->reason_len, h->reason);
    for (size_t i = 0; i < h->num_headers; i++) {
        const struct http1_header *f = &h->headers[i];
        if (http1_is_hop_by_hop(f->name, f->name_len, h->conn_tokens, h->num_conn_tokens))
            continue;
        /* RFC 9110 8.6: no Content-Length in a 204, whatever the backend sent. */
        if ((body || h->status == 204) &&
            http1_eq_nocase(f->name, f->name_len, "content-length"))
            continue;
        evbuffer_add(out, f->name, f->name_len);
        evbuffer_add(out, ": ", 2);
        evbuffer_add(out, f->value, f->value_len);
        evbuffer_add(out, "\r\n", 2);
    }
    if (h->body == HTTP1_BODY_LENGTH)
        evbuffer_add_printf(out, "Content-Length: %llu\r\n", (unsigned long long)h->content_length);
    else if (r->client_chunked)
        evbuffer_add_printf(out, "Transfer-Encoding: chunked\r\n");
    if (r->cold_ms >= 0)
        evbuffer_add_printf(out, "X-Thaw-Cold-Start-Ms: %lld\r\n", (long long)r->cold_ms);
    if (r->via_fallback)
        evbuffer_add_printf(out, "X-Thaw-Fallback: true\r\n");
    if (r->close_after)
        evbuffer_add_printf(out, "Connection: close\r\n");
    else if (r->version_minor == 0)
        evbuffer_add_printf(out, "Connection: keep-alive\r\n");
    evbuffer_add(out, "\r\n", 2);
}

/* Parses the upstream response head. Returns 1 when done, 0 for more, -1 on
 * a bad answer (r has been failed). */
static int parse_resp_head(struct req *r)
{
    struct evbuffer *in = conn_input(r->up);
    static const struct http1_limits lim = {UPSTREAM_HEAD_MAX, HTTP1_MAX_HEADERS};
    for (;;) {
        size_t len = evbuffer_get_length(in);
        if (len == 0)
            return 0;
        size_t n = len < UPSTREAM_HEAD_MAX + 16 ? len : UPSTREAM_HEAD_MAX + 16;
        const char *buf = (const char *)evbuffer_pullup(in, (ssize_t)n);
        struct http1_response *h = r->cl->px->scratch_resp;
        if (!buf) {
            req_fail(r, 500, OUT_INTERNAL, "internal_error", "out of memory");
            return -1;
        }
        ssize_t rc = http1_parse_response(&r->rscan, buf, n, &lim, r->head_method, h);
        if (rc == HTTP1_INCOMPLETE)
            return 0;
        if (rc < 0 || h->status == 101) {
            LOG_WARN("upstream_bad_response", "model=%s endpoint=%s err=\"%s\"", r->m->name,
                     r->ep ? endpoint_label(r->ep) : "-",
                     rc < 0 ? http1_strerror((int)rc) : "unexpected 101");
            req_fail(r, 502, OUT_BAD_GATEWAY, "bad_gateway", "the model server sent an invalid response");
            return -1;
        }
        if (h->status < 200) {
            /* Interim (100 Continue, 103): we answered Expect ourselves. */
            evbuffer_drain(in, (size_t)rc);
            http1_scan_init(&r->rscan);
            continue;
        }
        r->resp_status = h->status;
        r->resp_body = h->body;
        r->resp_left = h->content_length;
        r->resp_keep_alive = h->keep_alive;
        http1_chunked_init(&r->rchunk);
        write_client_head(r, h);
        bool early = r->early_head;
        bool sse_ok = h->status == 200;
        evbuffer_drain(in, (size_t)rc);
        r->resp_head_done = true;
        int64_t now = clock_mono_us();
        if (!early) { /* else the client has had our 200 SSE head since then */
            r->t_head_us = now;
            r->status_sent = r->resp_status;
        }
        expo_histogram_observe(&r->m->ttfb_hist, (double)(now - r->t_dispatch_us) / 1e6);
        expo_histogram_observe(&r->m->head_hist, (double)(now - r->t_start_us) / 1e6);
        if (early && !sse_ok) {
            char msg[96];
            snprintf(msg, sizeof(msg), "the model server answered %d", r->resp_status);
            r->resp_head_done = false; /* lets req_fail write the SSE error */
            req_fail(r, 502, OUT_BAD_GATEWAY, "bad_gateway", msg);
            return -1;
        }
        return 1;
    }
}

/* Moves response body bytes to the client. Returns 1 when the body is
 * complete, 0 for more, -1 on a framing error. */
static int pump_response(struct req *r)
{
    struct evbuffer *in = conn_input(r->up);
    struct evbuffer *out = conn_output(r->cl->c);
    switch (r->resp_body) {
    case HTTP1_BODY_NONE:
        return 1;
    case HTTP1_BODY_LENGTH: {
        size_t len = evbuffer_get_length(in);
        size_t n = (uint64_t)len < r->resp_left ? len : (size_t)r->resp_left;
        if (r->client_chunked) /* only after an early SSE head */
            add_chunk_buffer(out, in, n);
        else
            evbuffer_remove_buffer(in, out, n);
        r->resp_left -= n;
        return r->resp_left == 0 ? 1 : 0;
    }
    case HTTP1_BODY_UNTIL_CLOSE: {
        size_t len = evbuffer_get_length(in);
        if (r->client_chunked)
            add_chunk_buffer(out, in, len);
        else
            evbuffer_remove_buffer(in, out, len);
        return 0;
    }
    case HTTP1_BODY_CHUNKED:
        for (;;) {
            size_t len = evbuffer_get_length(in);
            if (len == 0)
                return 0;
            size_t n = len < 65536 ? len : 65536;
            const char *p = (const char *)evbuffer_pullup(in, (ssize_t)n);
            size_t off, dlen;
            ssize_t used = http1_chunked_decode(&r->rchunk, p, n, &off, &dlen);
            if (used < 0)
                return -1;
            if (dlen > 0) {
                if (r->client_chunked)
                    add_chunk(out, p + off, dlen);
                else
                    evbuffer_add(out, p + off, dlen);
            }
            evbuffer_drain(in, (size_t)used);
            if (http1_chunked_done(&r->rchunk)) {
                if (r->client_chunked)
                    evbuffer_add(out, "0\r\n\r\n", 5);
                return 1;
            }
            if (used == 0)
                return 0;
        }
    }
    return -1;
}

static void req_complete(struct req *r)
{
    if (r->early_head && (r->resp_body == HTTP1_BODY_LENGTH || r->resp_body == HTTP1_BODY_NONE))
        evbuffer_add(conn_output(r->cl->c), "0\r\n\r\n", 5);
    struct evbuffer *upout = conn_output(r->up);
    /* Not after an answer that has no body by rule (HEAD, 204, 304): one
     * whose server sent a body anyway would have it read as the next
     * request's answer on this connection, and it may arrive after this
     * check. Such answers are rare here; a new connection is cheap. */
    bool bodiless = r->head_method || r->resp_status == 204 || r->resp_status == 304;
    bool reuse = r->resp_keep_alive && r->body_done && !bodiless &&
                 evbuffer_get_length(upout) == 0 && evbuffer_get_length(conn_input(r->up)) == 0;
    up_release(r, reuse);
    req_end(r, OUT_OK, r->close_after);
}

static void check_resp_backpressure(struct req *r)
{
    struct proxy *px = r->cl->px;
    size_t lim = (size_t)px->cfg->limits.buffer_bytes;
    if (!r->resp_paused && evbuffer_get_length(conn_output(r->cl->c)) >= lim) {
        r->resp_paused = true;
        conn_disable_read(r->up);
    }
}

static void up_read_cb(struct conn *c, void *arg)
{
    (void)c;
    struct req *r = arg;
    if (r->state != RS_UPSTREAM)
        return;
    r->resp_started = true;
    if (!r->resp_head_done) {
        int rc = parse_resp_head(r);
        if (rc <= 0)
            return;
    }
    int st = pump_response(r);
    if (st < 0) {
        LOG_WARN("upstream_bad_chunk", "model=%s", r->m->name);
        req_cut(r, OUT_ABORTED);
        return;
    }
    if (st == 1) {
        req_complete(r);
        return;
    }
    check_resp_backpressure(r);
    /* The idle period restarts with every read; it is off while the client
     * is the slow side (a paused upstream cannot be heard from). */
    conn_set_timeout(r->up, r->resp_paused ? 0 : r->m->mc->response_idle_timeout_ms);
}

/* The upstream output drained: send more of the request body. */
static void up_write_cb(struct conn *c, void *arg)
{
    (void)c;
    struct req *r = arg;
    if (r->state == RS_UPSTREAM && !r->body_done)
        pump_to_upstream(r);
}

/* The connection failed before any response byte. */
static void retry_upstream(struct req *r, bool mark_down)
{
    conn_free(r->up);
    r->up = NULL;
    struct endpoint *ep = req_detach_endpoint(r);
    /* A fallback that failed before any byte: back to the model's own path
     * (held again, or sent to the model if it came up meanwhile). */
    r->via_fallback = false;
    r->state = RS_DISPATCH;
    if (mark_down)
        endpoint_mark_down(ep); /* may move the model to waking */
    endpoint_release(ep);
    model_dispatch(r, MEV_RETRY);
}

static void up_event_cb(struct conn *c, int what, int err, void *arg)
{
    struct req *r = arg;
    if (what & CONN_CONNECTED) {
        conn_set_timeout(c, 0);
        r->state = RS_UPSTREAM;
        client_read_ahead(r->cl); /* the body streams on */
        commit_sent(r);
        pump_to_upstream(r);
        return;
    }
    if ((what & CONN_TIMEOUT) && r->state == RS_UPSTREAM) {
        /* The backend went quiet: never resent (it may still be working). */
        bool head = !r->resp_head_done;
        long ms = head ? r->m->mc->response_header_timeout_ms : r->m->mc->response_idle_timeout_ms;
        char msg[160];
        snprintf(msg, sizeof(msg), "the model server sent %s for %ld ms (%s)",
                 head ? "no response head" : "nothing more", ms,
                 head ? "responseHeaderTimeoutSeconds" : "responseIdleTimeoutSeconds");
        LOG_WARN("upstream_timeout", "model=%s endpoint=%s phase=%s timeout_ms=%ld", r->m->name,
                 endpoint_label(r->ep), head ? "head" : "body", ms);
        req_timeout(r, 504, OUT_UPSTREAM_TIMEOUT, "upstream_timeout", msg);
        return;
    }
    if (r->resp_head_done) {
        if (r->resp_body == HTTP1_BODY_UNTIL_CLOSE && (what & CONN_EOF)) {
            pump_response(r);
            if (r->client_chunked)
                evbuffer_add(conn_output(r->cl->c), "0\r\n\r\n", 5);
            r->resp_keep_alive = false;
            req_complete(r);
            return;
        }
        LOG_WARN("upstream_truncated", "model=%s endpoint=%s", r->m->name, endpoint_label(r->ep));
        req_cut(r, OUT_ABORTED);
        return;
    }
    bool connecting = r->state == RS_CONNECTING;
    long unacked = conn_unacked(r->up);
    LOG_DEBUG("upstream_failed",
              "model=%s endpoint=%s connecting=%d reused=%d what=0x%x err=%d unacked=%ld",
              r->m->name, endpoint_label(r->ep), connecting, r->up_reused, what, err, unacked);
    if (connecting) {
        /* Refused, reset or timed out before a byte was sent: the scale-down
         * race. The endpoint is down; the request waits for it again. */
        retry_upstream(r, true);
        return;
    }
    /* Once a request has left, it is resent only when the backend provably
     * did not read it: a pooled connection it closed as the request arrived
     * (its keep-alive timeout), or a fresh one it accepted as it closed its
     * listener. That shows as request bytes its TCP never
     * acknowledged (closed before they came), or as a reset (closed with
     * them unread: the kernel resets, where a close after reading all is a
     * FIN). Every byte acknowledged and then a FIN means it read the request
     * and may have acted on it (a worker that died on it, or drops it): like
     * nginx for a POST, 502 and never resent. Nor is the endpoint marked
     * down: it accepted the connection, and a refusal is what tells a
     * scale-down (above); probes judge its health. */
    bool reset = (what & CONN_ERROR) && (err == ECONNRESET || err == EPIPE);
    if (!r->resp_started && r->replayable && r->sent_retries < MAX_SENT_RETRIES &&
        (unacked != 0 || reset)) {
        r->sent_retries++;
        /* Its pool siblings are likely dead too (a crashed replica): the
         * resend opens a new connection, which a dead backend refuses, and
         * a refusal is the scale-down race, held and retried, never a 502.
         * A fresh connection left unread is that race one step later: the
         * replica accepted it into its backlog and closed its listener
         * (terminating), so the endpoint is down, as on a refusal. */
        r->fresh_only = true;
        retry_upstream(r, !r->up_reused);
        return;
    }
    /* A plain close (EOF) carries no errno: strerror(0) would say "Success". */
    LOG_WARN("upstream_error", "model=%s endpoint=%s err=\"%s\"", r->m->name,
             endpoint_label(r->ep),
             err ? evutil_socket_error_to_string(err) : "closed by the model server");
    req_fail(r, 502, OUT_BAD_GATEWAY, "bad_gateway", "the model server closed the connection");
}

/* ---- request path (client -> upstream) ---- */

/* Moves request body bytes from the client's input into dst: decoded, or
 * framed as chunks when chunked. Stops once dst holds limit bytes. Returns 0
 * or the HTTP status to fail with. */
static int pump_body(struct req *r, struct evbuffer *dst, bool chunked, size_t limit)
{
    struct client *cl = r->cl;
    struct evbuffer *in = conn_input(cl->c);
    uint64_t max_body = (uint64_t)cl->px->cfg->limits.max_body_bytes;
    while (!r->body_done && evbuffer_get_length(dst) < limit) {
        size_t avail = evbuffer_get_length(in);
        if (avail == 0)
            break;
        if (r->body_kind == HTTP1_BODY_LENGTH) {
            size_t room = limit - evbuffer_get_length(dst);
            size_t n = avail < room ? avail : room;
            if ((uint64_t)n > r->body_left)
                n = (size_t)r->body_left;
            evbuffer_remove_buffer(in, dst, n);
            r->body_left -= n;
            r->body_read += n;
            if (r->body_left == 0)
                r->body_done = true;
            continue;
        }
        size_t n = avail < 65536 ? avail : 65536;
        const char *p = (const char *)evbuffer_pullup(in, (ssize_t)n);
        size_t off, dlen;
        ssize_t used = http1_chunked_decode(&r->chunk, p, n, &off, &dlen);
        if (used < 0)
            return 400;
        if (dlen > 0) {
            if (r->body_read + dlen > max_body)
                return 413;
            r->body_read += dlen;
            if (chunked)
                add_chunk(dst, p + off, dlen);
            else
                evbuffer_add(dst, p + off, dlen);
        }
        evbuffer_drain(in, (size_t)used);
        if (http1_chunked_done(&r->chunk)) {
            r->body_done = true;
            if (chunked)
                evbuffer_add(dst, "0\r\n\r\n", 5);
        }
        if (used == 0)
            break;
    }
    return 0;
}

/* Moves what the client sent of the body upstream. Until the body is
 * complete the client's timer measures bodyIdleTimeout: this runs on every
 * byte event of either side (client input, upstream output drained), so it
 * restarts the period. Then the upstream's timer measures
 * responseHeaderTimeout, once per send (from the request fully written). */
static void pump_to_upstream(struct req *r)
{
    if (r->state != RS_UPSTREAM || !r->up)
        return;
    struct client *cl = r->cl;
    struct proxy *px = cl->px;
    if (!r->body_done) {
        int st = pump_body(r, conn_output(r->up), r->up_chunked,
                           (size_t)px->cfg->limits.buffer_bytes);
        if (st != 0) {
            req_fail(r, st, st == 413 ? OUT_BODY_TOO_LARGE : OUT_BAD_REQUEST,
                     st == 413 ? "request_too_large" : "bad_request",
                     st == 413 ? "request body too large" : "malformed chunked body");
            return;
        }
        if (!r->body_done) {
            arm_timer(cl, px->cfg->limits.body_idle_timeout_ms);
            return;
        }
        disarm_timer(cl);
    }
    if (!r->resp_head_done && !r->head_timer_on) {
        r->head_timer_on = true;
        conn_set_timeout(r->up, r->m->mc->response_header_timeout_ms);
    }
}

/* bodyIdleTimeout passed without progress on the body. Bytes still waiting
 * in the client's input mean the backend stopped taking them; none means
 * the client stopped sending. The upstream connection is closed either way
 * (it holds part of a request). */
static void body_stalled(struct req *r)
{
    struct client *cl = r->cl;
    bool backend = evbuffer_get_length(conn_input(cl->c)) > 0;
    LOG_INFO("body_timeout", "model=%s client=%s body_read=%llu waiting_on=%s", r->m->name,
             cl->ip, (unsigned long long)r->body_read, backend ? "backend" : "client");
    if (backend)
        req_timeout(r, 504, OUT_UPSTREAM_TIMEOUT, "upstream_timeout",
                    "the model server stopped reading the request body");
    else
        req_timeout(r, 408, OUT_BODY_TIMEOUT, "request_timeout",
                    "the request body stopped arriving (bodyIdleTimeoutSeconds)");
}

/* Writes the request to the upstream connection. Head and body stay in r
 * when the request is replayable (the whole of it is buffered). */
static void send_request(struct req *r)
{
    struct evbuffer *out = conn_output(r->up);
    size_t hl = evbuffer_get_length(r->head);
    evbuffer_add(out, evbuffer_pullup(r->head, -1), hl);
    if (r->need_host)
        evbuffer_add_printf(out, "Host: %s\r\n", endpoint_host_header(r->ep));
    r->replayable = r->body_done;
    r->up_chunked = false;
    if (r->body_kind == HTTP1_BODY_NONE) {
        if (r->body_method)
            evbuffer_add_printf(out, "Content-Length: 0\r\n");
    } else if (r->body_done) {
        evbuffer_add_printf(out, "Content-Length: %zu\r\n", evbuffer_get_length(r->body));
    } else if (r->body_kind == HTTP1_BODY_LENGTH) {
        evbuffer_add_printf(out, "Content-Length: %llu\r\n", (unsigned long long)r->body_len);
    } else {
        evbuffer_add_printf(out, "Transfer-Encoding: chunked\r\n");
        r->up_chunked = true;
    }
    evbuffer_add(out, "\r\n", 2);
    /* The body start is copied, not moved: if a fresh connection is refused,
     * the request goes out again from r (see commit_sent). */
    size_t bl = evbuffer_get_length(r->body);
    if (r->up_chunked)
        add_chunk(out, evbuffer_pullup(r->body, -1), bl);
    else
        evbuffer_add(out, evbuffer_pullup(r->body, -1), bl);
    r->resp_started = false;
    r->resp_head_done = false;
    r->head_timer_on = false;
    http1_scan_init(&r->rscan);
}

/* The connection is up and the request is leaving: a request that cannot be
 * replayed no longer needs its copy of the body start. */
static void commit_sent(struct req *r)
{
    if (!r->replayable)
        evbuffer_drain(r->body, evbuffer_get_length(r->body));
}

static void up_setup(struct req *r)
{
    struct proxy *px = r->cl->px;
    size_t lim = (size_t)px->cfg->limits.buffer_bytes;
    /* The whole response head must fit in the input, whatever bufferBytes is. */
    size_t rd = lim > UPSTREAM_HEAD_MAX + 1024 ? lim : UPSTREAM_HEAD_MAX + 1024;
    conn_setcb(r->up, up_read_cb, up_write_cb, up_event_cb, r);
    conn_set_read_high(r->up, rd);
    conn_set_write_low(r->up, lim / 2);
    conn_enable_read(r->up);
}

#define SOCKET_RETRY_MS 50
/* A local failure to open an upstream connection: nothing was sent and the
 * backend is not at fault, so the request goes back to the head of its hold
 * queue (its hold deadline still bounds the wait) and every queue is retried
 * after SOCKET_RETRY_MS; logged once per episode, not per request. */
static void socket_starved(struct req *r, int err)
{
    struct model_rt *m = r->m;
    struct proxy *px = m->px;
    px->socket_failures++;
    if (!px->socket_starved)
        LOG_WARN("upstream_socket_starved", "model=%s endpoint=%s err=\"%s\" retry_ms=%d",
                 m->name, endpoint_label(r->ep), strerror(err), SOCKET_RETRY_MS);
    px->socket_starved = true;
    if (!evtimer_pending(px->socket_retry, NULL)) {
        struct timeval tv;
        tv_ms(&tv, SOCKET_RETRY_MS);
        evtimer_add(px->socket_retry, &tv);
    }
    endpoint_release(req_detach_endpoint(r));
    r->via_fallback = false; /* held again: the model's path decides anew */
    r->state = RS_DISPATCH;
    int64_t now = now_ms();
    if (r->starved_since_ms == 0)
        r->starved_since_ms = now;
    /* When every descriptor is a client waiting for a model server, nothing
     * frees one: bounded by connectTimeout, then an explicit 503 whose closed
     * connection frees a descriptor for the next request. */
    if (now - r->starved_since_ms >= px->cfg->limits.connect_timeout_ms) {
        req_fail(r, 503, OUT_NO_SOCKET, "overloaded",
                 "the activator has no free socket to reach the model server");
        return;
    }
    req_hold(r);
}

static void socket_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct proxy *px = arg;
    px->socket_starved = false;
    for (size_t i = 0; i < px->nmodels && !px->socket_starved; i++) {
        release_held(px->models[i]);
        release_to_fallback(px->models[i]);
    }
    for (struct model_rt *m = px->removed; m && !px->socket_starved; m = m->next_removed) {
        release_held(m);
        release_to_fallback(m);
    }
    if (!px->socket_starved)
        LOG_INFO("upstream_socket_recovered", "failures=%llu",
                 (unsigned long long)px->socket_failures);
}

static void req_forward(struct req *r)
{
    struct model_rt *m = r->m;
    struct proxy *px = m->px;
    struct endpoint *ep = backend_pick(r->via_fallback ? m->fallback_be : m->be);
    if (!ep) {
        /* Every endpoint is at its concurrency cap (or the fallback went
         * down): wait in line. */
        r->via_fallback = false;
        req_hold(r);
        return;
    }
    endpoint_acquire(ep);
    r->ep = ep;
    m->inflight++;
    if (r->via_fallback)
        m->fallback_inflight++;
    else if (m->inflight - m->fallback_inflight > m->inflight_peak)
        m->inflight_peak = m->inflight - m->fallback_inflight;
    r->t_dispatch_us = clock_mono_us();
    if (m->px->access_log)
        snprintf(r->ep_label, sizeof(r->ep_label), "%s", endpoint_label(ep));
    struct conn *c = r->fresh_only ? NULL : endpoint_pool_take(ep);
    r->fresh_only = false;
    if (c) {
        r->up = c;
        r->up_reused = true;
        r->state = RS_UPSTREAM;
        client_read_ahead(r->cl); /* the body streams on */
        send_request(r);
        commit_sent(r);
        up_setup(r);
        pump_to_upstream(r);
        return;
    }
    r->up_reused = false;
    socklen_t alen;
    const struct sockaddr *sa = endpoint_addr(ep, &alen);
    c = conn_connect(px->base, px->flusher, sa, alen);
    if (!c) {
        socket_starved(r, errno);
        return;
    }
    r->up = c;
    r->state = RS_CONNECTING;
    /* Bytes queued before the connection completes leave only once it does,
     * so a refusal means nothing was sent. */
    send_request(r);
    up_setup(r);
    conn_set_timeout(c, px->cfg->limits.connect_timeout_ms);
}

/* ---- hold ---- */

static void heartbeat_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct req *r = arg;
    if (r->state != RS_HELD)
        return;
    struct evbuffer *out = conn_output(r->cl->c);
    if (!r->early_head)
        send_heartbeat_head(r);
    static const char beat[] = ": thaw: model is starting\n\n";
    add_chunk(out, beat, sizeof(beat) - 1);
    struct timeval tv;
    tv_ms(&tv, r->m->mc->sse_heartbeat_ms);
    evtimer_add(r->heartbeat, &tv);
}

static void send_heartbeat_head(struct req *r)
{
    struct evbuffer *out = conn_output(r->cl->c);
    evbuffer_add_printf(out, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                             "X-Thaw-Heartbeat: 1\r\n%s\r\n",
                        r->keep_alive && r->body_done ? "" : "Connection: close\r\n");
    r->early_head = true;
    r->close_after = !r->keep_alive || !r->body_done;
    r->status_sent = 200;
    r->t_head_us = clock_mono_us();
}

/* What a held request costs besides its head and body bytes: the request,
 * the client connection with its buffers and events, allocator overhead. Set
 * from bench/activator_held.mjs (RSS per held request, minus the bytes), so
 * that maxHeldBytes bounds real memory. */
#define HELD_FIXED_BYTES 4096

static void free_block(const void *data, size_t len, void *arg)
{
    (void)len;
    (void)arg;
    thaw_free((void *)data);
}

/* Moves the bytes of *b into one exactly sized block. A held request may
 * wait for minutes, and its bytes often sit in a chain sized for a socket
 * read (16 KiB for a 200-byte body); thousands of them add up. On allocation
 * failure *b is left as it was. */
static void compact_buffer(struct evbuffer **b)
{
    size_t len = evbuffer_get_length(*b);
    if (len == 0 || len > 1024 * 1024)
        return;
    struct evbuffer *nb = evbuffer_new();
    void *data = thaw_malloc(len);
    if (!nb || !data || evbuffer_copyout(*b, data, len) != (ev_ssize_t)len ||
        evbuffer_add_reference(nb, data, len, free_block, NULL) < 0) {
        if (nb)
            evbuffer_free(nb);
        thaw_free(data);
        return;
    }
    evbuffer_free(*b);
    *b = nb;
}

/* How far a client connection reads ahead: bufferBytes, and at least a
 * whole request head. */
static size_t client_read_high(const struct proxy *px)
{
    const struct limits_config *lim = &px->cfg->limits;
    size_t hi = (size_t)lim->buffer_bytes;
    if (hi < (size_t)lim->max_header_bytes + 2048)
        hi = (size_t)lim->max_header_bytes + 2048;
    return hi;
}

/* While its request is held a client is not read further: what it sends
 * beyond the routed body (the rest of a long prompt, pipelined requests)
 * would sit in the connection's input, up to bufferBytes each, uncharged
 * by maxHeldBytes. What is already there is charged. One byte stays
 * readable when none is, so a close is still seen at once; otherwise the
 * reaper asks the socket (reap_held_clients). */
static size_t hold_client_input(struct client *cl)
{
    size_t in = evbuffer_get_length(conn_input(cl->c));
    conn_set_read_high(cl->c, in > 0 ? in : 1);
    return in;
}

/* Reads ahead as far as client_read_high again: at accept, for the next
 * request, for a lingering close, and for a held request once it is on its
 * way upstream. Not before that: a request that goes back to the hold queue
 * (a connect that fails or times out, a full endpoint) would come back with
 * what was read meanwhile uncharged. */
static void client_read_ahead(struct client *cl)
{
    conn_set_read_high(cl->c, client_read_high(cl->px));
}

/* What a held request is charged (HELD_FIXED_BYTES, its head and body, and
 * its client's input, which stops growing: hold_client_input). */
static size_t held_charge(struct req *r)
{
    return HELD_FIXED_BYTES + evbuffer_get_length(r->head) + evbuffer_get_length(r->body) +
           hold_client_input(r->cl);
}

static void req_hold(struct req *r)
{
    struct model_rt *m = r->m;
    int64_t now = now_ms();
    size_t was = m->hq.count;
    if (r->was_held) {
        /* Charged anew: a request that got upstream may come back with more
         * of its client's input read (a pipelined request). Put back, it is
         * not refused for that (bounds are for new arrivals). */
        r->hq.bytes = held_charge(r);
        holdq_push_front(&m->hq, &r->hq);
        if (r->heartbeat) {
            struct timeval tv;
            tv_ms(&tv, m->mc->sse_heartbeat_ms);
            evtimer_add(r->heartbeat, &tv);
        }
    } else {
        compact_buffer(&r->head);
        compact_buffer(&r->body);
        size_t bytes = held_charge(r);
        while (!holdq_fits(&m->hq, bytes)) {
            struct holdq_node *v = holdq_victim(&m->hq, r->tier, bytes);
            if (!v)
                break;
            struct req *victim = req_of_node(v);
            holdq_remove(&m->hq, v);
            LOG_INFO("request_shed", "model=%s tier=%s for=%s", m->name, tier_to_str(victim->tier),
                     tier_to_str(r->tier));
            req_fail(victim, 503, OUT_SHED, "shed",
                     "the model is starting and capacity went to higher-priority requests");
        }
        if (!holdq_fits(&m->hq, bytes)) {
            req_fail(r, 503, OUT_HOLD_FULL, "hold_queue_full",
                     "the model is starting and too many requests are waiting for it");
            return;
        }
        holdq_push(&m->hq, &r->hq, r->tier, bytes, now, now + m->mc->hold_timeout_ms);
        r->was_held = true;
        /* Not to a HEAD: its answer has no body to carry the comments. */
        if (r->stream && !r->head_method && m->mc->sse_heartbeat_ms > 0 &&
            r->version_minor >= 1) {
            r->heartbeat = evtimer_new(m->px->base, heartbeat_cb, r);
            if (r->heartbeat) {
                struct timeval tv;
                tv_ms(&tv, m->mc->sse_heartbeat_ms);
                evtimer_add(r->heartbeat, &tv);
            }
        }
    }
    r->state = RS_HELD;
    arm_hold_timer(m);
    arm_fallback_timer(m);
    if (was == 0)
        publish_held(m); /* the first held request is news for the scaler now */
}

static void hold_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct model_rt *m = arg;
    int64_t now = now_ms();
    struct holdq_node *n;
    while ((n = holdq_pop_expired(&m->hq, now))) {
        struct req *r = req_of_node(n);
        expo_histogram_observe(&m->hold_hist, (double)(now - n->enqueued_ms) / 1000.0);
        LOG_INFO("hold_timeout", "model=%s held_ms=%lld", m->name,
                 (long long)(now - n->enqueued_ms));
        req_fail(r, 504, OUT_HOLD_TIMEOUT, "hold_timeout",
                 "the model did not become ready within the hold timeout");
    }
    if (m->hq.count == 0)
        publish_held(m); /* the last held request timed out: the HDEL need not wait */
    arm_hold_timer(m);
}

static void arm_hold_timer(struct model_rt *m)
{
    int64_t d = holdq_next_deadline(&m->hq);
    if (d == INT64_MAX) {
        evtimer_del(m->hold_timer);
        return;
    }
    int64_t wait = d - now_ms();
    struct timeval tv;
    tv_ms(&tv, wait > 0 ? (long)wait : 0);
    evtimer_add(m->hold_timer, &tv);
}

static bool can_forward(const struct model_rt *m)
{
    return model_sm_forwardable(&m->sm);
}

/* Sends a request just taken from the hold queue on its way. */
static void send_held(struct req *r, int64_t held_ms)
{
    r->cold_ms = held_ms;
    if (r->heartbeat)
        evtimer_del(r->heartbeat);
    expo_histogram_observe(&r->m->hold_hist, (double)held_ms / 1000.0);
    r->state = RS_DISPATCH;
    req_forward(r);
}

/* The fallback takes requests now: configured, the model cannot take them,
 * and a fallback endpoint is healthy. */
static bool fallback_open(const struct model_rt *m)
{
    return m->fallback_be && m->mc->fallback_backend && !can_forward(m) &&
           backend_capacity(m->fallback_be) > 0;
}

/* Wakes at the moment the oldest held request has waited fallbackAfter; off
 * while the fallback cannot take requests (its health check turning
 * healthy, or the next hold, arms it again). */
static void arm_fallback_timer(struct model_rt *m)
{
    if (!m->fallback_timer)
        return;
    /* Starved of sockets: the socket retry timer sends them, not a loop here. */
    if (m->hq.count == 0 || !fallback_open(m) || m->px->socket_starved) {
        evtimer_del(m->fallback_timer);
        return;
    }
    int64_t wait = holdq_oldest_enqueued(&m->hq) + m->mc->fallback_after_ms - now_ms();
    struct timeval tv;
    tv_ms(&tv, wait > 0 ? (long)wait : 0);
    evtimer_add(m->fallback_timer, &tv);
}

/* Sends the requests held fallbackAfterSeconds or longer to the fallback,
 * highest tier first, while it takes them. */
static void release_to_fallback(struct model_rt *m)
{
    int64_t now = now_ms();
    size_t sent = 0;
    while (m->hq.count > 0 && fallback_open(m) && !m->px->socket_starved) {
        struct holdq_node *n = holdq_pop_enqueued_by(&m->hq, now - m->mc->fallback_after_ms);
        if (!n)
            break;
        struct req *r = req_of_node(n);
        r->via_fallback = true;
        if (!r->fallback_counted) {
            r->fallback_counted = true;
            m->fallback_requests++;
        }
        sent++;
        send_held(r, now - n->enqueued_ms);
    }
    if (sent)
        LOG_INFO("sent_to_fallback", "model=%s count=%zu left=%zu", m->name, sent, m->hq.count);
    arm_hold_timer(m);
    arm_fallback_timer(m);
}

static void fallback_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    release_to_fallback(arg);
}

static void on_fallback_healthy(void *ud) { release_to_fallback(ud); }

static void on_fallback_down(void *ud, enum backend_down_reason why)
{
    (void)why;
    struct model_rt *m = ud;
    LOG_WARN("fallback_down", "model=%s backend=%s", m->name,
             m->mc->fallback_backend ? m->mc->fallback_backend : "-");
}

/* The model's config with the fallback as its backend: no cap (the
 * fallback is not this model's replicas), probes backing off to 1 s at least
 * (it is meant to be up; a down one is not hammered). */
static void fallback_model_config(const struct model_config *mc, struct model_config *out)
{
    *out = *mc;
    out->backend = mc->fallback_backend;
    out->backend_host = mc->fallback_host;
    out->backend_port = mc->fallback_port;
    out->endpoints_file = NULL;
    out->max_concurrency_per_endpoint = 0;
    out->split_concurrency = 0;
    if (out->probe_max_ms < 1000)
        out->probe_max_ms = 1000;
}

/* Creates, reconfigures or switches off the model's fallback to match mc.
 * A fallback once made is kept until the model is freed (requests may be
 * using its endpoints); without fallbackBackend it takes nothing. */
static int fallback_apply(struct model_rt *m, const struct model_config *mc)
{
    struct proxy *px = m->px;
    if (!mc->fallback_backend) {
        /* Kept (requests on it finish), but no more lookups or probes. */
        if (m->fallback_be)
            backend_stop(m->fallback_be);
        if (m->fallback_timer)
            evtimer_del(m->fallback_timer);
        return 0;
    }
    struct model_config fmc;
    fallback_model_config(mc, &fmc);
    if (!m->fallback_timer && !(m->fallback_timer = evtimer_new(px->base, fallback_timer_cb, m)))
        return -1;
    if (m->fallback_be) {
        if (backend_reconfigure(m->fallback_be, px->dns, &fmc, &px->cfg->limits) < 0)
            return -1;
    } else {
        static const struct backend_callbacks fcbs = {on_fallback_healthy, on_fallback_down};
        m->fallback_be = backend_new(px->base, px->dns, &fmc, &px->cfg->limits, &fcbs, m);
        if (!m->fallback_be)
            return -1;
    }
    backend_probe_start(m->fallback_be);
    return 0;
}

static void release_held(struct model_rt *m)
{
    if (!can_forward(m))
        return;
    int64_t now = now_ms();
    size_t released = 0;
    while (m->hq.count > 0 && can_forward(m)) {
        /* Sockets ran out: the retry timer releases again. */
        if (backend_capacity(m->be) == 0 || m->px->socket_starved)
            break;
        /* Held requests could not be sent before the model was ready:
         * their lateness counts from then, each with the wake's length
         * as its allowance (holdq.h). */
        struct holdq_node *n =
            holdq_pop_fresh_first(&m->hq, now, m->mc->late_after_ms, m->sm.forwardable_since_ms,
                                  m->sm.unforwardable_since_ms);
        struct req *r = req_of_node(n);
        if (m->mc->late_after_ms > 0 && !r->released_late && holdq_is_late(&m->hq, n, now)) {
            r->released_late = true;
            m->late_released++;
        }
        released++;
        send_held(r, now - n->enqueued_ms);
    }
    if (released)
        LOG_INFO("released", "model=%s count=%zu left=%zu", m->name, released, m->hq.count);
    arm_hold_timer(m);
    arm_fallback_timer(m);
}

/* ---- models ---- */

/* Requests that want the model: held, and those its fallback serves in the
 * meantime (the model keeps waking for them). */
static size_t model_waiting(const struct model_rt *m)
{
    return m->hq.count + m->fallback_inflight;
}

static void send_wake(struct model_rt *m)
{
    struct proxy *px = m->px;
    m->wakes++;
    /* Straight to the scaler too, so Redis is not the one path a wake has. */
    if (px->scaler_wake)
        scaler_wake_send(px->scaler_wake, m->name, model_waiting(m));
    if (px->redis && redis_link_wake(px->redis, m->name) == 0) {
        m->wake_signals++;
        m->wake_pending = false;
        LOG_INFO("wake_signal", "model=%s", m->name);
    } else {
        m->wake_pending = true; /* sent when Redis is back, if still wanted */
        LOG_INFO("wake_signal_deferred", "model=%s", m->name);
    }
}

/* The model of that name in px->models, through px->routes (O(1): names
 * come first in its index), which is switched together with px->models on
 * reload, where px->cfg is switched earlier. An alias of another model is
 * not a match. */
static struct model_rt *model_by_name(struct proxy *px, const char *name)
{
    int idx = px->routes ? route_table_lookup(px->routes, name) : -1;
    if (idx < 0 || (size_t)idx >= px->nmodels || strcmp(px->models[idx]->name, name) != 0)
        return NULL;
    return px->models[idx];
}

/* A removed model that speaks for its name in per-name sums: no configured
 * model has the name and no removed one before it in the list. */
static bool removed_leads_name(struct proxy *px, const struct model_rt *r)
{
    if (model_by_name(px, r->name))
        return false;
    for (const struct model_rt *o = px->removed; o != r; o = o->next_removed)
        if (strcmp(o->name, r->name) == 0)
            return false;
    return true;
}

/* value summed over the model configured under name and the removed models
 * of that name still carrying requests: per name, as thaw:held is. */
static double name_sum(struct proxy *px, const char *name,
                       double (*value)(const struct model_rt *))
{
    const struct model_rt *m = model_by_name(px, name);
    double v = m ? value(m) : 0;
    for (const struct model_rt *o = px->removed; o; o = o->next_removed)
        if (strcmp(o->name, name) == 0)
            v += value(o);
    return v;
}

static void model_wake_with(struct model_rt *m)
{
    struct proxy *px = m->px;
    for (size_t i = 0; i < m->mc->nwake_with; i++) {
        struct model_rt *o = model_by_name(px, m->mc->wake_with[i]);
        if (!o || o == m)
            continue;
        /* Only a cold model reacts, so wakeWith cycles end. */
        unsigned act = model_sm_handle(&o->sm, MEV_WAKE, now_ms(), model_waiting(o));
        model_apply(o, act);
    }
}

static void model_apply(struct model_rt *m, unsigned act)
{
    if (act & MACT_PROBE_START)
        backend_probe_start(m->be);
    if (act & MACT_PROBE_STOP)
        backend_probe_stop(m->be);
    if (act & MACT_WAKE_SIGNAL) {
        send_wake(m);
        model_wake_with(m);
    }
    if (act & MACT_RELEASE)
        release_held(m);
    /* Any state change may open or close the way to the fallback (a ready
     * model whose endpoints all went, with requests queued at its cap). */
    arm_fallback_timer(m);
}

static void model_dispatch(struct req *r, enum model_event ev)
{
    struct model_rt *m = r->m;
    unsigned act = model_sm_handle(&m->sm, ev, now_ms(), model_waiting(m));
    /* The request first, so the held count already includes it when the
     * wake signal and held count go out. */
    if (act & MACT_FORWARD)
        req_forward(r);
    else if (act & MACT_HOLD)
        req_hold(r);
    else if (act & MACT_REJECT)
        req_fail(r, 503, OUT_DRAINING, "draining", "the activator is shutting down");
    model_apply(m, act);
}

static void on_backend_healthy(void *ud)
{
    struct model_rt *m = ud;
    unsigned act = model_sm_handle(&m->sm, MEV_PROBE_OK, now_ms(), model_waiting(m));
    model_apply(m, act);
}

static void on_backend_down(void *ud, enum backend_down_reason why)
{
    struct model_rt *m = ud;
    enum model_event ev = why == BACKEND_DOWN_REQUEST    ? MEV_BACKEND_DOWN
                          : why == BACKEND_DOWN_REPLACED ? MEV_ENDPOINTS_REPLACED
                                                         : MEV_ENDPOINTS_GONE;
    unsigned act = model_sm_handle(&m->sm, ev, now_ms(), model_waiting(m));
    model_apply(m, act);
}

/* What one instance of a model carries, added to the sums: held (waiting
 * for the model to wake), queued (ready, waiting for a slot) and in a
 * backend (the most at once over this refresh interval and the one before);
 * rotate starts a new interval. */
static void carried_add(struct model_rt *m, bool rotate, size_t *held, size_t *queued,
                        size_t *inflight)
{
    /* Ready: the queue waits for a free slot at the concurrency cap (or a
     * socket), a serving backlog; otherwise it waits for the model to wake,
     * and so do the requests its fallback serves meanwhile (counted there,
     * not again as in flight). */
    bool ready = m->sm.state == MODEL_READY;
    size_t n = ready ? m->hq.count : model_waiting(m);
    unsigned now_in = m->inflight - m->fallback_inflight;
    size_t f = now_in;
    if (m->inflight_peak > f)
        f = m->inflight_peak;
    if (m->inflight_peak_prev > f)
        f = m->inflight_peak_prev;
    if (rotate) {
        m->inflight_peak_prev = m->inflight_peak;
        m->inflight_peak = now_in;
    }
    *(ready ? queued : held) += n;
    *inflight += f;
}

/* Writes thaw:held:<model> (this instance's field): all of it as held (a
 * wake is wanted) unless the model is ready, then all of it as queued; and
 * the requests in the model's backends (the scaler's idle signal with
 * idleSignal activators: the last one's end is seen within two refreshes,
 * where the token rate shows it a window later). The field is one per
 * name: the configured model and the removed ones of that name still
 * carrying requests share it, so it holds their sum, written by the lead
 * (the configured one, else the first removed). refresh: called by the 1 s
 * tick for every instance, which starts a new interval. */
static void publish_held_at(struct model_rt *m, bool refresh)
{
    struct proxy *px = m->px;
    if (!px->redis || !redis_link_up(px->redis))
        return;
    size_t held = 0, queued = 0, inflight = 0;
    bool published = false, m_counted = false;
    struct model_rt *lead = model_by_name(px, m->name);
    if (lead) {
        carried_add(lead, refresh && lead == m, &held, &queued, &inflight);
        published |= lead->held_published;
        m_counted |= lead == m;
    }
    for (struct model_rt *o = px->removed; o; o = o->next_removed) {
        if (strcmp(o->name, m->name) != 0)
            continue;
        if (!lead)
            lead = o;
        carried_add(o, refresh && o == m, &held, &queued, &inflight);
        published |= o->held_published;
        m_counted |= o == m;
    }
    if (!m_counted) { /* a removed model being freed */
        carried_add(m, false, &held, &queued, &inflight);
        published |= m->held_published;
        if (!lead)
            lead = m;
    }
    if (refresh && lead != m)
        return; /* the lead's own refresh writes the sum */
    if (held == 0 && queued == 0 && inflight == 0 && !published)
        return;
    if (redis_link_held(px->redis, m->name, held, queued, inflight, lead->mc->late_after_ms,
                        clock_unix_ms()) != 0)
        return;
    bool set = held > 0 || queued > 0 || inflight > 0;
    /* Crashed activators' fields go while live ones write the key. */
    int64_t mono = clock_mono_ms();
    if (set && (lead->held_swept_ms == 0 || mono - lead->held_swept_ms >= HELD_SWEEP_EVERY_MS) &&
        redis_link_held_sweep(px->redis, m->name, clock_unix_ms()) == 0)
        lead->held_swept_ms = mono;
    for (struct model_rt *o = px->removed; o; o = o->next_removed)
        if (strcmp(o->name, m->name) == 0)
            o->held_published = false;
    m->held_published = false;
    lead->held_published = set;
}

static void publish_held(struct model_rt *m) { publish_held_at(m, false); }

/* The drain is over and nothing is carried: the field goes now (HDEL), not
 * at a refresh that will not come, and not left with a peak: a field left
 * behind goes stale, and the scaler takes it for an activator that went
 * silent with requests in flight. */
static void publish_drained(struct model_rt *m)
{
    m->inflight_peak = m->inflight_peak_prev = 0;
    publish_held(m);
}

/* The drain is over: no more lookups, polls, probes or fallback timers. */
static void model_stop(struct model_rt *m)
{
    backend_stop(m->be);
    if (m->fallback_be)
        backend_stop(m->fallback_be);
    if (m->fallback_timer)
        evtimer_del(m->fallback_timer);
}

static void model_free(struct model_rt *m)
{
    if (!m)
        return;
    backend_free(m->be);
    backend_free(m->fallback_be);
    if (m->hold_timer)
        event_free(m->hold_timer);
    if (m->fallback_timer)
        event_free(m->fallback_timer);
    expo_histogram_finish(&m->hold_hist);
    expo_histogram_finish(&m->ttfb_hist);
    expo_histogram_finish(&m->head_hist);
    thaw_free(m->name);
    thaw_free(m);
}

static struct model_rt *model_new(struct proxy *px, const struct model_config *mc)
{
    struct model_rt *m = thaw_calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->px = px;
    m->mc = mc;
    m->name = thaw_strdup(mc->name);
    m->hold_timer = evtimer_new(px->base, hold_timer_cb, m);
    holdq_init(&m->hq, (size_t)mc->max_held_requests, (size_t)mc->max_held_bytes);
    holdq_set_hold_timeout(&m->hq, mc->hold_timeout_ms);
    if (!m->name || !m->hold_timer ||
        expo_histogram_init(&m->hold_hist, expo_buckets_slow, expo_buckets_slow_len) < 0 ||
        expo_histogram_init(&m->ttfb_hist, expo_buckets_fast, expo_buckets_fast_len) < 0 ||
        expo_histogram_init(&m->head_hist, expo_buckets_slow, expo_buckets_slow_len) < 0) {
        model_free(m);
        return NULL;
    }
    model_sm_init(&m->sm, m->name, mc->hold_timeout_ms, now_ms());
    static const struct backend_callbacks cbs = {on_backend_healthy, on_backend_down};
    m->be = backend_new(px->base, px->dns, mc, &px->cfg->limits, &cbs, m);
    if (!m->be) {
        model_free(m);
        return NULL;
    }
    backend_set_peers(m->be, px->peers);
    if (fallback_apply(m, mc) < 0) {
        model_free(m);
        return NULL;
    }
    return m;
}

/* ---- routing ---- */

static void route_and_admit(struct req *r)
{
    struct proxy *px = r->cl->px;
    int idx = -1;
    bool invalid = false, named = false;
    struct route_json_info info;
    size_t bl = evbuffer_get_length(r->body);
    if (bl > 0) {
        const char *p = (const char *)evbuffer_pullup(r->body, -1);
        enum route_json_result res = route_json_scan(p, bl, &info);
        if (res == ROUTE_JSON_FOUND) {
            named = true;
            r->stream = info.stream;
            idx = route_table_lookup(px->routes, info.model);
        } else if (res == ROUTE_JSON_INVALID) {
            invalid = true;
        }
    }
    if (idx < 0 && !named && r->host)
        idx = route_by_host(px->cfg, r->host, strlen(r->host));
    if (idx < 0) {
        char msg[MODEL_NAME_MAX + 128]; /* the longest name whole: cut, it could split a character */
        if (named) {
            snprintf(msg, sizeof(msg), "The model `%s` does not exist.", info.model);
        } else if (invalid) {
            req_fail(r, 400, OUT_BAD_REQUEST, "invalid_json",
                     "could not read a string \"model\" from the JSON request body");
            return;
        } else {
            snprintf(msg, sizeof(msg), "no model named in the request body and no model "
                                       "serves this host");
        }
        req_fail(r, 404, OUT_MODEL_NOT_FOUND, "model_not_found", msg);
        return;
    }
    r->m = px->models[idx];
    r->m->routed = true;
    r->state = RS_DISPATCH;
    model_dispatch(r, MEV_REQUEST);
}

static void disarm_timer(struct client *cl) { evtimer_del(cl->timer); }

static void arm_timer(struct client *cl, long ms)
{
    struct timeval tv;
    tv_ms(&tv, ms);
    evtimer_add(cl->timer, &tv);
}

/* Reads the body start (bounded) so the model can be read from it. */
static void route_phase(struct req *r)
{
    struct proxy *px = r->cl->px;
    size_t lim = (size_t)px->cfg->limits.route_body_bytes;
    int st = pump_body(r, r->body, false, lim);
    if (st != 0) {
        disarm_timer(r->cl);
        req_fail(r, st, st == 413 ? OUT_BODY_TOO_LARGE : OUT_BAD_REQUEST,
                 st == 413 ? "request_too_large" : "bad_request",
                 st == 413 ? "request body too large" : "malformed chunked body");
        return;
    }
    if (!r->body_done && evbuffer_get_length(r->body) < lim)
        return;
    disarm_timer(r->cl);
    route_and_admit(r);
}

/* ---- request heads ---- */

static bool method_is(const struct http1_request *h, const char *m)
{
    return h->method_len == strlen(m) && memcmp(h->method, m, h->method_len) == 0;
}

static enum tier tier_for(struct proxy *px, const struct http1_request *h)
{
    const struct http1_header *auth = http1_find(h->headers, h->num_headers, "authorization");
    if (auth && px->cfg->napi_keys > 0 && auth->value_len > 7 &&
        http1_eq_nocase(auth->value, 7, "bearer ")) {
        const char *key = auth->value + 7;
        size_t kl = auth->value_len - 7;
        for (size_t i = 0; i < px->cfg->napi_keys; i++) {
            if (strlen(px->cfg->api_keys[i].key) == kl &&
                memcmp(px->cfg->api_keys[i].key, key, kl) == 0)
                return px->cfg->api_keys[i].tier;
        }
    }
    const struct http1_header *prio = http1_find(h->headers, h->num_headers, "x-thaw-priority");
    if (prio) {
        int t = tier_parse(prio->value, prio->value_len);
        if (t >= 0)
            return (enum tier)t;
    }
    return TIER_NORMAL;
}

static int build_req(struct client *cl, const struct http1_request *h, struct req *r)
{
    struct proxy *px = cl->px;
    r->cl = cl;
    r->cold_ms = -1;
    r->head_method = method_is(h, "HEAD");
    r->body_method = method_is(h, "POST") || method_is(h, "PUT") || method_is(h, "PATCH");
    r->version_minor = h->version_minor;
    r->keep_alive = h->keep_alive;
    r->body_kind = h->body;
    r->body_len = h->content_length;
    r->body_left = h->content_length;
    r->body_done = h->body == HTTP1_BODY_NONE;
    http1_chunked_init(&r->chunk);
    r->tier = tier_for(px, h);
    r->t_start_us = clock_mono_us();
    r->head = evbuffer_new();
    r->body = evbuffer_new();
    if (!r->head || !r->body)
        return -1;
    if (h->host && !(r->host = thaw_strndup(h->host->value, h->host->value_len)))
        return -1;
    r->need_host = h->host == NULL;
    struct evbuffer *o = r->head;
    evbuffer_add(o, h->method, h->method_len);
    evbuffer_add(o, " ", 1);
    evbuffer_add(o, h->target, h->target_len);
    evbuffer_add(o, " HTTP/1.1\r\n", 11);
    const struct http1_header *xff = NULL;
    for (size_t i = 0; i < h->num_headers; i++) {
        const struct http1_header *f = &h->headers[i];
        /* Host stays whatever Connection names: dropping it would send an
         * HTTP/1.1 request without one (need_host was set by its presence). */
        bool host = http1_eq_nocase(f->name, f->name_len, "host");
        if ((!host &&
             http1_is_hop_by_hop(f->name, f->name_len, h->conn_tokens, h->num_conn_tokens)) ||
            http1_eq_nocase(f->name, f->name_len, "content-length") ||
            http1_eq_nocase(f->name, f->name_len, "expect") ||
            http1_eq_nocase(f->name, f->name_len, "x-thaw-priority"))
            continue;
        if (http1_eq_nocase(f->name, f->name_len, "x-forwarded-for")) {
            xff = f;
            continue;
        }
        evbuffer_add(o, f->name, f->name_len);
        evbuffer_add(o, ": ", 2);
        evbuffer_add(o, f->value, f->value_len);
        evbuffer_add(o, "\r\n", 2);
    }
    evbuffer_add(o, "X-Forwarded-For: ", 17);
    if (xff) {
        /* Several X-Forwarded-For fields form one list, in order. */
        for (size_t i = 0; i < h->num_headers; i++) {
            const struct http1_header *f = &h->headers[i];
            if (http1_eq_nocase(f->name, f->name_len, "x-forwarded-for") && f->value_len > 0) {
                evbuffer_add(o, f->value, f->value_len);
                evbuffer_add(o, ", ", 2);
            }
        }
    }
    evbuffer_add_printf(o, "%s\r\n", cl->ip);
    return 0;
}

/* Answers a request that failed before it had a req (parse errors). */
static void fail_head(struct client *cl, int status, const char *code, const char *msg)
{
    cl->in_head = false;
    disarm_timer(cl);
    count_outcome(cl->px, NULL, outcome_for_status(status));
    if (cl->px->access_log)
        log_access_head(cl, status, outcome_for_status(status));
    write_error(cl, status, code, msg, true, false, false);
    client_close(cl, true); /* the rest of the head, or a body, may be on its way */
}

/* Empty lines discarded per idle period at most; past it they are part of a
 * request (the header timeout and limits apply). */
#define IDLE_EMPTY_LINE_BYTES 64

/* RFC 9112 2.2: a server SHOULD ignore at least one empty line before a
 * request line; clients send one after a POST body. While the connection is
 * idle, leading CR and LF bytes are dropped, so they neither start the
 * header timer nor count as a request (an unsolicited 408 when it fired).
 * Returns 0, or -1 on a buffer failure (the connection was closed). */
static int discard_empty_lines(struct client *cl, struct evbuffer *in)
{
    size_t len = evbuffer_get_length(in), n = 0;
    if (len == 0 || cl->idle_crlf >= IDLE_EMPTY_LINE_BYTES)
        return 0;
    size_t max = IDLE_EMPTY_LINE_BYTES - cl->idle_crlf;
    if (max > len)
        max = len;
    const unsigned char *p = evbuffer_pullup(in, (ev_ssize_t)max);
    if (!p) {
        client_close(cl, false);
        return -1;
    }
    while (n < max && (p[n] == '\r' || p[n] == '\n'))
        n++;
    cl->idle_crlf += n;
    if (n > 0 && evbuffer_drain(in, n) < 0) {
        client_close(cl, false);
        return -1;
    }
    return 0;
}

/* Tries to read a request head. Returns 1 when a request was created, 0
 * when more bytes are needed, -1 when the connection is done. */
static int try_head(struct client *cl)
{
    struct proxy *px = cl->px;
    const struct limits_config *lim = &px->cfg->limits;
    struct evbuffer *in = conn_input(cl->c);
    if (!cl->in_head && discard_empty_lines(cl, in) < 0)
        return -1;
    size_t len = evbuffer_get_length(in);
    if (len == 0)
        return 0;
    if (!cl->in_head) {
        cl->in_head = true;
        px->accepted++;
        http1_scan_init(&cl->scan);
        arm_timer(cl, lim->header_timeout_ms);
    }
    size_t max = (size_t)lim->max_header_bytes;
    size_t n = len < max + 1024 ? len : max + 1024;
    const char *buf = (const char *)evbuffer_pullup(in, (ssize_t)n);
    struct http1_request *h = px->scratch_req;
    if (!buf) {
        fail_head(cl, 500, "internal_error", "out of memory");
        return -1;
    }
    struct http1_limits hl = {max, (size_t)lim->max_headers};
    ssize_t rc = http1_parse_request(&cl->scan, buf, n, &hl, h);
    if (rc == HTTP1_INCOMPLETE)
        return 0;
    if (rc < 0) {
        int status = http1_err_status((int)rc);
        LOG_DEBUG("bad_request", "client=%s err=\"%s\"", cl->ip, http1_strerror((int)rc));
        fail_head(cl, status, status == 431 ? "headers_too_large" : "bad_request",
                  http1_strerror((int)rc));
        return -1;
    }
    struct req *r = thaw_calloc(1, sizeof(*r));
    if (!r || build_req(cl, h, r) < 0) {
        if (r) {
            r->cl = cl;
            req_free(r);
        }
        fail_head(cl, 500, "internal_error", "out of memory");
        return -1;
    }
    bool expect = h->expect_continue;
    evbuffer_drain(in, (size_t)rc);
    cl->in_head = false;
    cl->req = r;
    r->state = RS_ROUTING;
    if (r->body_kind == HTTP1_BODY_LENGTH && r->body_len > (uint64_t)lim->max_body_bytes) {
        disarm_timer(cl);
        req_fail(r, 413, OUT_BODY_TOO_LARGE, "request_too_large", "request body too large");
        return -1;
    }
    if (expect && !r->body_done)
        evbuffer_add_printf(conn_output(cl->c), "HTTP/1.1 100 Continue\r\n\r\n");
    return 1;
}

/* ---- clients ---- */

/* The client left (or is being cut): its request, if any, ends now with
 * outcome o. */
static void client_drop_req(struct client *cl, enum proxy_outcome o)
{
    struct proxy *px = cl->px;
    if (cl->req) {
        struct req *r = cl->req;
        cl->req = NULL;
        count_outcome(px, r->m, o);
        if (px->access_log && !px->freeing)
            log_access(r, o);
        struct model_rt *m = r->m;
        bool held = r->state == RS_HELD;
        req_free(r);
        if (m && m->hq.count > 0 && !px->freeing)
            release_held(m);
        else if (m && held && !px->freeing)
            publish_held(m); /* the last held request left: the HDEL need not wait */
    } else if (cl->in_head) {
        cl->in_head = false;
        count_outcome(px, NULL, o);
        if (px->access_log && !px->freeing)
            log_access_head(cl, 0, o);
    }
}

/* The lingering close of cl is over (result why); the caller closes. */
static void linger_done(struct client *cl, enum linger_result why)
{
    if (!cl->linger)
        return;
    struct proxy *px = cl->px;
    cl->linger = false;
    px->nlingering--;
    px->linger_results[why]++;
    LOG_DEBUG("lingering_close", "client=%s result=%s discarded=%llu", cl->ip, linger_names[why],
              (unsigned long long)cl->linger_bytes);
}

static void client_destroy(struct client *cl)
{
    struct proxy *px = cl->px;
    client_drop_req(cl, OUT_CLIENT_CLOSED);
    linger_done(cl, LINGER_ERROR);
    if (cl->prev)
        cl->prev->next = cl->next;
    else
        px->clients = cl->next;
    if (cl->next)
        cl->next->prev = cl->prev;
    px->nclients--;
    conn_free(cl->c);
    if (cl->timer)
        event_free(cl->timer);
    if (cl->kick)
        event_free(cl->kick);
    thaw_free(cl);
}

/* Marks the client dead; it is freed from its kick event, outside of any
 * callback that may still use it. */
static void client_kill(struct client *cl)
{
    if (cl->dead)
        return;
    cl->dead = true;
    client_drop_req(cl, OUT_CLIENT_CLOSED);
    linger_done(cl, LINGER_ERROR);
    disarm_timer(cl);
    conn_disable_read(cl->c);
    event_active(cl->kick, EV_TIMEOUT, 1);
}

static void linger_end(struct client *cl, enum linger_result why)
{
    linger_done(cl, why);
    client_kill(cl);
}

/* Lingering: the next wait is lingeringTimeout, or what is left of
 * lingeringTime if less. */
static void linger_rearm(struct client *cl)
{
    long timeout = cl->px->cfg->limits.lingering_timeout_ms;
    int64_t left = cl->linger_until_ms - now_ms();
    if (left <= 0) {
        linger_end(cl, LINGER_TIME);
        return;
    }
    /* Remembered rather than read off the clock when the timer fires:
     * libevent dates timers from its loop's cached time, so they may fire
     * a few ms before the deadline as now_ms() sees it. */
    cl->linger_last = left <= timeout;
    arm_timer(cl, cl->linger_last ? (long)left : timeout);
}

/* Throws away what the client sent since. */
static void linger_discard(struct client *cl)
{
    struct evbuffer *in = conn_input(cl->c);
    size_t n = evbuffer_get_length(in);
    if (n == 0)
        return;
    evbuffer_drain(in, n);
    cl->linger_bytes += n;
    if (cl->linger_bytes > (uint64_t)cl->px->cfg->limits.lingering_max_bytes)
        linger_end(cl, LINGER_BYTES);
    else if (cl->lingering)
        linger_rearm(cl);
}

/* The response is out: our FIN follows it, and the close waits for the
 * client's, so that no unread input is left when we close. */
static void linger_start(struct client *cl)
{
    if (cl->lingering)
        return;
    cl->lingering = true;
    if (shutdown(conn_fd(cl->c), SHUT_WR) < 0) {
        linger_end(cl, LINGER_ERROR); /* ENOTCONN: the client is gone already */
        return;
    }
    linger_rearm(cl);
}

/* Flushes what was written, then closes. With linger (request bytes may still
 * be on their way, as after an early 413/408/400), the close is lingering,
 * like nginx's lingering_close: input is read and discarded meanwhile, then
 * our side is shut down and the close waits for the client's. Closing with
 * unread input would make the kernel send a reset, which may destroy the
 * response before the client reads it. */
static void client_close(struct client *cl, bool linger)
{
    if (cl->closing || cl->dead)
        return;
    struct proxy *px = cl->px;
    const struct limits_config *lim = &px->cfg->limits;
    cl->closing = true;
    disarm_timer(cl);
    conn_set_write_low(cl->c, 0);
    linger = (linger || evbuffer_get_length(conn_input(cl->c)) > 0) && !cl->reset &&
             lim->lingering_timeout_ms > 0 && !px->drain_deadline_passed;
    if (linger && px->nlingering >= (size_t)lim->max_lingering) {
        px->linger_results[LINGER_FULL]++;
        linger = false;
    }
    if (!linger) {
        conn_disable_read(cl->c);
        if (evbuffer_get_length(conn_output(cl->c)) == 0)
            client_kill(cl);
        return;
    }
    cl->linger = true;
    px->nlingering++;
    cl->linger_until_ms = now_ms() + lim->lingering_time_ms;
    cl->linger_last = true;
    arm_timer(cl, lim->lingering_time_ms);
    client_read_ahead(cl); /* a hold may have lowered it */
    conn_enable_read(cl->c);
    linger_discard(cl);
    if (cl->linger && evbuffer_get_length(conn_output(cl->c)) == 0)
        linger_start(cl);
}

/* Sets the connection to end with a reset rather than a FIN. */
static void client_reset(struct client *cl)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    cl->reset = true;
    if (setsockopt(conn_fd(cl->c), SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) < 0)
        LOG_DEBUG("linger_failed", "client=%s err=\"%s\"", cl->ip, strerror(errno));
}

/* The client took no response byte for sendTimeoutSeconds. Its request ends
 * (the upstream connection is closed with it) and the connection is reset:
 * the client is not reading, and the kernel frees what it still buffers for
 * it at once instead of retrying into a zero window. */
static void client_send_timeout(struct client *cl)
{
    struct req *r = cl->req;
    LOG_INFO("send_timeout", "client=%s model=%s unsent=%zu timeout_ms=%ld", cl->ip,
             r && r->m ? r->m->name : "-", evbuffer_get_length(conn_output(cl->c)),
             cl->px->cfg->limits.send_timeout_ms);
    client_reset(cl);
    client_drop_req(cl, OUT_SEND_TIMEOUT);
    client_kill(cl);
}

/* Ready for the next request on a kept-alive connection. */
static void client_next(struct client *cl)
{
    struct proxy *px = cl->px;
    client_read_ahead(cl); /* a hold may have lowered it */
    http1_scan_init(&cl->scan);
    cl->idle_crlf = 0;
    arm_timer(cl, px->cfg->limits.idle_timeout_ms);
    if (evbuffer_get_length(conn_input(cl->c)) > 0)
        event_active(cl->kick, EV_TIMEOUT, 1); /* pipelined: parse it next turn */
}

static void client_process(struct client *cl)
{
    for (;;) {
        if (cl->dead || cl->closing)
            return;
        struct req *r = cl->req;
        if (!r) {
            if (try_head(cl) <= 0)
                return;
            continue;
        }
        switch (r->state) {
        case RS_ROUTING:
            route_phase(r);
            return;
        case RS_UPSTREAM:
            pump_to_upstream(r);
            return;
        case RS_DISPATCH:
        case RS_HELD:
        case RS_CONNECTING:
            return;
        }
        return;
    }
}

static void client_kick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct client *cl = arg;
    struct proxy *px = cl->px;
    if (cl->dead) {
        client_destroy(cl);
        check_drained(px);
        return;
    }
    client_process(cl);
}

static void client_read_cb(struct conn *c, void *arg)
{
    (void)c;
    struct client *cl = arg;
    if (cl->linger)
        linger_discard(cl);
    else
        client_process(cl);
}

static void client_write_cb(struct conn *c, void *arg)
{
    struct client *cl = arg;
    if (cl->closing) {
        if (evbuffer_get_length(conn_output(c)) > 0)
            return;
        if (cl->linger)
            linger_start(cl);
        else
            client_kill(cl);
        return;
    }
    struct req *r = cl->req;
    if (r && r->resp_paused && r->up) {
        r->resp_paused = false;
        conn_enable_read(r->up);
        /* Bytes may be waiting in the input with no read event to come. */
        up_read_cb(r->up, r);
    }
}

static void client_event_cb(struct conn *c, int what, int err, void *arg)
{
    (void)err;
    struct client *cl = arg;
    if (cl->dead)
        return; /* killed earlier in this loop turn; freed from its kick */
    if (what & CONN_SEND_TIMEOUT) {
        client_send_timeout(cl);
        return;
    }
    if (cl->linger) {
        if ((what & CONN_EOF) && evbuffer_get_length(conn_output(c)) > 0) {
            /* The client is done sending but the response is still going
             * out: nothing is left to discard, so an ordinary close follows
             * the flush. */
            linger_done(cl, LINGER_EOF);
            disarm_timer(cl);
            return;
        }
        linger_end(cl, (what & CONN_EOF) ? LINGER_EOF : LINGER_ERROR);
        return;
    }
    if (cl->req)
        LOG_DEBUG("client_gone", "client=%s what=0x%x", cl->ip, what);
    client_kill(cl);
}

static void client_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct client *cl = arg;
    if (cl->dead)
        return;
    if (cl->closing) {
        /* Armed only while lingering: before the response is out it
         * measures lingeringTime, after it the next wait. */
        if (cl->linger)
            linger_end(cl, cl->linger_last ? LINGER_TIME : LINGER_TIMEOUT);
        return;
    }
    if (cl->in_head) {
        fail_head(cl, 408, "request_timeout", "the request head did not arrive in time");
        return;
    }
    if (cl->req && cl->req->state == RS_ROUTING) {
        req_fail(cl->req, 408, OUT_HEADER_TIMEOUT, "request_timeout",
                 "the request body did not arrive in time");
        return;
    }
    if (cl->req && cl->req->state == RS_UPSTREAM && !cl->req->body_done) {
        body_stalled(cl->req);
        return;
    }
    if (!cl->req)
        client_kill(cl); /* idle keep-alive connection */
}

#define ACCEPT_PAUSE_MS 500

static void accept_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct proxy *px = arg;
    if (px->listener && !px->draining)
        evconnlistener_enable(px->listener);
}

/* accept() failing with EMFILE leaves the connection pending, so the
 * listener would fire again at once: a busy loop. Pause accepting instead
 * (as nginx does) and log once per pause; pending connections wait in the
 * backlog. */
static void accept_error_cb(struct evconnlistener *lst, void *arg)
{
    struct proxy *px = arg;
    int err = EVUTIL_SOCKET_ERROR();
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        LOG_WARN("accept_paused", "error=\"%s\" pause_ms=%d clients=%zu",
                 evutil_socket_error_to_string(err), ACCEPT_PAUSE_MS, px->nclients);
        evconnlistener_disable(lst);
        struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};
        evtimer_add(px->accept_resume, &tv);
    } else {
        LOG_DEBUG("accept_failed", "error=\"%s\"", evutil_socket_error_to_string(err));
    }
}

static void accept_cb(struct evconnlistener *lst, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
    (void)lst;
    (void)salen;
    struct proxy *px = arg;
    struct client *cl = thaw_calloc(1, sizeof(*cl));
    if (!cl) {
        evutil_closesocket(fd);
        return;
    }
    cl->px = px;
    cl->c = conn_new_fd(px->base, px->flusher, fd);
    cl->timer = evtimer_new(px->base, client_timer_cb, cl);
    cl->kick = event_new(px->base, -1, 0, client_kick_cb, cl);
    if (!cl->c || !cl->timer || !cl->kick) {
        if (cl->c)
            conn_free(cl->c);
        else
            evutil_closesocket(fd);
        if (cl->timer)
            event_free(cl->timer);
        if (cl->kick)
            event_free(cl->kick);
        thaw_free(cl);
        return;
    }
    if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)(void *)sa)->sin6_addr, cl->ip, sizeof(cl->ip));
    else
        inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)sa)->sin_addr, cl->ip, sizeof(cl->ip));
    cl->next = px->clients;
    if (px->clients)
        px->clients->prev = cl;
    px->clients = cl;
    px->nclients++;
    px->connections++;
    const struct limits_config *lim = &px->cfg->limits;
    conn_setcb(cl->c, client_read_cb, client_write_cb, client_event_cb, cl);
    client_read_ahead(cl);
    conn_set_write_low(cl->c, (size_t)lim->buffer_bytes / 2);
    conn_set_send_timeout(cl->c, lim->send_timeout_ms);
    conn_enable_read(cl->c);
    arm_timer(cl, lim->idle_timeout_ms);
}

/* ---- housekeeping ---- */

/* An instance of model `name` other than `except`: the configured one,
 * else a removed one still carrying requests; NULL if none. */
static struct model_rt *namesake(struct proxy *px, const char *name,
                                 const struct model_rt *except)
{
    struct model_rt *o = model_by_name(px, name);
    if (o && o != except)
        return o;
    for (o = px->removed; o; o = o->next_removed)
        if (o != except && strcmp(o->name, name) == 0)
            return o;
    return NULL;
}

/* A removed model's outcome counts, as it is freed: to the model of that
 * name now configured, else to another removed one still carrying requests,
 * else kept by name (the metrics go on showing them). */
static void retire_outcomes(struct proxy *px, struct model_rt *m)
{
    struct model_rt *heir = namesake(px, m->name, m);
    if (heir) {
        for (int o = 0; o < PROXY_OUTCOME_COUNT; o++)
            heir->outcomes[o] += m->outcomes[o];
        heir->routed |= m->routed;
        return;
    }
    bool any = m->routed;
    for (int o = 0; o < PROXY_OUTCOME_COUNT && !any; o++)
        any = m->outcomes[o] != 0;
    if (!any)
        return; /* nothing to keep: no series for a model that never served */
    struct retired_outcomes *r = px->retired ? strmap_get(px->retired, m->name) : NULL;
    if (!r) {
        if (!px->retired && !(px->retired = strmap_new()))
            return;
        if (strmap_count(px->retired) >= RETIRED_MAX || !(r = thaw_calloc(1, sizeof(*r)))) {
            if (!px->retired_full_logged)
                LOG_WARN("outcomes_dropped", "model=%s reason=\"too many removed models "
                         "remembered\"", m->name);
            px->retired_full_logged = true;
            return;
        }
        if (strmap_put(px->retired, m->name, r) < 0) {
            thaw_free(r);
            return;
        }
    }
    for (int o = 0; o < PROXY_OUTCOME_COUNT; o++)
        r->outcomes[o] += m->outcomes[o];
    r->routed |= m->routed;
}

/* A model (re)added: it goes on from the counts of its removed namesake. */
static void inherit_outcomes(struct proxy *px, struct model_rt *m)
{
    struct retired_outcomes *r = px->retired ? strmap_remove(px->retired, m->name) : NULL;
    if (!r)
        return;
    for (int o = 0; o < PROXY_OUTCOME_COUNT; o++)
        m->outcomes[o] += r->outcomes[o];
    m->routed |= r->routed;
    thaw_free(r);
}

/* m, being freed, still has its field in Redis (the link was down): a
 * namesake takes it over, else its name waits in hdel_pending. */
static void hdel_later(struct proxy *px, struct model_rt *m)
{
    struct model_rt *heir = namesake(px, m->name, m);
    if (heir) {
        heir->held_published = true;
        return;
    }
    if (!px->hdel_pending && !(px->hdel_pending = strmap_new()))
        return;
    if (strmap_get(px->hdel_pending, m->name))
        return;
    if (strmap_count(px->hdel_pending) >= RETIRED_MAX ||
        strmap_put(px->hdel_pending, m->name, px) < 0)
        LOG_WARN("held_field_left", "model=%s reason=\"too many fields to delete once Redis "
                 "is back\"", m->name);
}

/* Redis is there: the fields of models freed while it was not go now, unless
 * a model of that name came back (it owns the field again). */
static void hdel_pending_flush(struct proxy *px)
{
    if (!px->hdel_pending || !strmap_count(px->hdel_pending) || !redis_link_up(px->redis))
        return;
    const char *done[64];
    size_t ndone = 0;
    size_t cur = 0;
    const char *name;
    void *value;
    while (ndone < 64 && strmap_next(px->hdel_pending, &cur, &name, &value)) {
        struct model_rt *o = namesake(px, name, NULL);
        if (o)
            o->held_published = true;
        else if (redis_link_held(px->redis, name, 0, 0, 0, 0, clock_unix_ms()) != 0)
            break;
        done[ndone++] = name;
    }
    /* Removed after the walk. Each key is the map's own copy, looked up
     * before it is freed, and removing one does not free the others. */
    for (size_t i = 0; i < ndone; i++)
        strmap_remove(px->hdel_pending, done[i]);
}

static bool config_owns(const struct config *cfg, const struct model_config *mc)
{
    return mc >= cfg->models && mc < cfg->models + cfg->nmodels;
}

static void free_removed(struct proxy *px)
{
    for (struct model_rt **pp = &px->removed; *pp;) {
        struct model_rt *m = *pp;
        if (m->hq.count == 0 && m->inflight == 0) {
            *pp = m->next_removed;
            LOG_INFO("model_removed", "model=%s", m->name);
            /* Its thaw:held field goes with it, not left to go stale (the
             * scaler would take it for a silent activator): now, or by a
             * namesake, or once Redis is back. */
            publish_drained(m);
            if (m->held_published)
                hdel_later(px, m);
            retire_outcomes(px, m);
            model_free(m);
        } else {
            pp = &m->next_removed;
        }
    }
    /* A removed model reads its settings from the config it was last in
     * (m->mc); every other old config can go, so reloads while one request
     * of a removed model is held do not pile configs up. */
    for (struct old_config **op = &px->old_cfgs; *op;) {
        struct old_config *o = *op;
        bool used = false;
        for (const struct model_rt *m = px->removed; m && !used; m = m->next_removed)
            used = config_owns(o->cfg, m->mc);
        if (used) {
            op = &o->next;
            continue;
        }
        *op = o->next;
        config_free(o->cfg);
        thaw_free(o);
    }
}

/* A held request's client is read only up to its buffer bound; past it no
 * read event can report a close, so the socket is asked instead. Without
 * this, a gone client would keep its place (and the held counts) until it
 * was answered. */
static void reap_held_clients(struct proxy *px)
{
    /* client_kill only marks; clients leave the list later, from their kick. */
    for (struct client *cl = px->clients; cl; cl = cl->next) {
        struct req *r = cl->req;
        if (!r || r->state != RS_HELD || cl->dead || !conn_read_full(cl->c) ||
            !conn_peer_closed(cl->c))
            continue;
        LOG_INFO("held_client_gone", "model=%s client=%s", r->m->name, cl->ip);
        client_kill(cl);
    }
}

/* A burst of connections (thousands held through a cold start) leaves
 * megabytes of freed heap that glibc keeps (the trim threshold is raised in
 * main.c for the warm path's sake): hand it back once the burst is over. */
#define TRIM_AFTER_CLIENTS 1024

static void trim_after_burst(struct proxy *px)
{
    if (px->nclients > px->clients_peak)
        px->clients_peak = px->nclients;
    if (px->clients_peak < TRIM_AFTER_CLIENTS || px->nclients > px->clients_peak / 8)
        return;
    int64_t t0 = clock_mono_us();
    malloc_trim(0);
    LOG_INFO("memory_trimmed", "clients_peak=%zu clients=%zu took_us=%lld", px->clients_peak,
             px->nclients, (long long)(clock_mono_us() - t0));
    px->clients_peak = px->nclients;
}

/* A smaller share for each when peers come, a larger one when they go (held
 * requests may now fit). */
static void set_peers(struct proxy *px, unsigned peers, const char *why)
{
    if (peers == px->peers)
        return;
    LOG_INFO("peers_changed", "peers=%g was=%g reason=%s", (double)peers / BALANCE_PEER_UNIT,
             (double)px->peers / BALANCE_PEER_UNIT, why);
    bool wider = peers < px->peers;
    px->peers = peers;
    for (size_t i = 0; i < px->nmodels; i++) {
        backend_set_peers(px->models[i]->be, peers);
        if (wider)
            release_held(px->models[i]);
    }
    /* Models a reload removed still finish their requests. */
    for (struct model_rt *m = px->removed; m; m = m->next_removed) {
        backend_set_peers(m->be, peers);
        if (wider)
            release_held(m);
    }
}

static unsigned clamp_peers(long long peers_milli)
{
    /* Never below this activator itself (a peer's weight may lag a beat). */
    long long floor = BALANCE_PEER_UNIT, cap = 100000LL * BALANCE_PEER_UNIT;
    return (unsigned)(peers_milli < floor ? floor : peers_milli > cap ? cap : peers_milli);
}

static void on_peers(void *ud, long long peers_milli)
{
    struct proxy *px = ud;
    px->peers_seen_ms = now_ms();
    if (!px->draining) {
        set_peers(px, clamp_peers(peers_milli), "counted");
        return;
    }
    /* Draining: the count weighs this activator by what it uses. Counted
     * whole instead, it is what its share would be as a live peer: the
     * weight is measured against that, and its own share may narrow to it
     * (peers came, or it began draining with a stale whole cap) but never
     * widens (which could put its queued requests past what the others
     * were told it uses). */
    unsigned as_live = clamp_peers(peers_milli - (long long)px->weight_sent + BALANCE_PEER_UNIT);
    px->peers_as_live = as_live;
    if (as_live > px->peers)
        set_peers(px, as_live, "counted");
}

/* What a draining activator still uses of a live peer's share, in
 * thousandths of a peer: the most any endpoint of a split model carries from
 * it (held, queued and fallback requests counted as if already there: they
 * may come back to the model) over the share it would have as a live peer
 * now. Live activators count it for that much, so their shares widen as its
 * requests end instead of only once it is gone. Whole until a count says
 * what a live peer's share is. */
static unsigned model_share_used(const struct proxy *px, const struct model_rt *m)
{
    if (!m->mc->split_concurrency || m->mc->max_concurrency_per_endpoint <= 0)
        return 0; /* nobody's share */
    if (!px->peers_as_live)
        return BALANCE_PEER_UNIT;
    uint64_t used =
        (uint64_t)backend_max_outstanding(m->be) + m->hq.count + m->fallback_inflight;
    uint64_t share = balance_share((unsigned)m->mc->max_concurrency_per_endpoint, px->peers_as_live);
    uint64_t w = share ? (used * BALANCE_PEER_UNIT + share - 1) / share : BALANCE_PEER_UNIT;
    return w > BALANCE_PEER_UNIT ? BALANCE_PEER_UNIT : (unsigned)w;
}

static unsigned peer_weight(const struct proxy *px)
{
    if (!px->draining)
        return BALANCE_PEER_UNIT;
    unsigned most = 0;
    for (size_t i = 0; i < px->nmodels; i++) {
        unsigned w = model_share_used(px, px->models[i]);
        most = w > most ? w : most;
    }
    for (const struct model_rt *m = px->removed; m; m = m->next_removed) {
        unsigned w = model_share_used(px, m);
        most = w > most ? w : most;
    }
    return most;
}

/* Requests of this instance waiting for a replica of its model to come up
 * (waking, or draining with none up). */
static double waiting_for_wake(const struct model_rt *m)
{
    if (m->sm.state == MODEL_COLD || model_sm_forwardable(&m->sm))
        return 0;
    return (double)model_waiting(m);
}

static void renew_direct_wake(struct proxy *px, const char *name)
{
    double n = name_sum(px, name, waiting_for_wake);
    if (n > 0)
        scaler_wake_send(px->scaler_wake, name, (size_t)n);
}

/* Without Redis (down, or connected but not answering) the scaler does not
 * see the held count that keeps a waking model wanted: the direct wake
 * stands in for it, renewed as often, per name (the configured model and
 * its removed namesakes whose held requests still wait, summed, as in the
 * thaw:held field), also while draining. */
static void renew_direct_wakes(struct proxy *px)
{
    if (!px->scaler_wake || redis_link_answering(px->redis))
        return;
    for (size_t i = 0; i < px->nmodels; i++)
        renew_direct_wake(px, px->models[i]->name);
    for (const struct model_rt *r = px->removed; r; r = r->next_removed)
        if (removed_leads_name(px, r))
            renew_direct_wake(px, r->name);
}

/* The model's part of the Redis refresh: a wake that could not be sent, its
 * thaw:held field. */
static void refresh_model(struct proxy *px, struct model_rt *m)
{
    /* A wake that could not be sent still matters while the model has not
     * come up. */
    if (m->wake_pending && px->redis && redis_link_up(px->redis)) {
        if (m->sm.state == MODEL_WAKING)
            send_wake(m);
        else
            m->wake_pending = false;
    }
    publish_held_at(m, true);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct proxy *px = arg;
    int64_t now = now_ms();
    for (size_t i = 0; i < px->nmodels; i++) {
        struct model_rt *m = px->models[i];
        model_apply(m, model_sm_handle(&m->sm, MEV_TICK, now, model_waiting(m)));
    }
    free_removed(px);
    reap_held_clients(px);
    trim_after_burst(px);
    /* Redis gone or silent: each activator takes the whole cap again. A
     * backend then may see up to peers x its cap (it queues the excess
     * itself), which is better than endpoints idle behind a stale split. */
    if (px->peers > BALANCE_PEER_UNIT && !px->draining && now - px->peers_seen_ms > PEERS_TTL_MS)
        set_peers(px, BALANCE_PEER_UNIT, "no_recent_count");
    if (now - px->last_redis_ms >= REDIS_REFRESH_MS) {
        px->last_redis_ms = now;
        /* Also while draining, weighted by the part of its share its
         * requests still use (it leaves the set when drained, and stays out). */
        if (px->redis && redis_link_up(px->redis) && !px->drain_done_called) {
            px->weight_sent = peer_weight(px);
            redis_link_heartbeat(px->redis, px->peers_key, PEERS_TTL_MS, px->weight_sent);
        }
        for (size_t i = 0; i < px->nmodels; i++)
            refresh_model(px, px->models[i]);
        /* A removed model's held requests still wait for its backend: the
         * scaler must go on seeing them, then see them end. */
        for (struct model_rt *m = px->removed; m; m = m->next_removed)
            publish_held_at(m, true);
        renew_direct_wakes(px);
        hdel_pending_flush(px);
    }
}

void proxy_redis_state(void *arg, bool up)
{
    struct proxy *px = arg;
    if (up)
        px->last_redis_ms = 0; /* refresh at the next tick */
}

/* ---- lifecycle ---- */

static int build_models(struct proxy *px, struct config *cfg, struct model_rt ***out)
{
    struct model_rt **v = thaw_calloc(cfg->nmodels, sizeof(*v));
    if (!v)
        return -1;
    *out = v;
    return 0;
}

static bool needs_dns(const struct config *cfg)
{
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const struct model_config *mc = &cfg->models[i];
        struct sockaddr_storage ss;
        socklen_t len;
        if (mc->backend && balance_sockaddr(mc->backend_host, 0, &ss, &len) < 0)
            return true;
        if (mc->fallback_backend && balance_sockaddr(mc->fallback_host, 0, &ss, &len) < 0)
            return true;
    }
    return false;
}

/* libevent, like glibc, sends a query again only after 5 s without an
 * answer, and a waking model's next replica is found by these lookups: one
 * lost UDP packet (in Kubernetes, the conntrack race of parallel A and AAAA
 * queries) would add 3-5 s to the cold start. 1 s, 3 sends: a lookup that
 * gets no answer still fails within about 3 s. Without --dns-server,
 * resolv.conf's own `options timeout:` and `attempts:` still win (parsed
 * after). */
#define DNS_RETRY_TIMEOUT "1"

static struct evdns_base *new_resolver(struct event_base *base)
{
    struct evdns_base *dns = evdns_base_new(base, EVDNS_BASE_DISABLE_WHEN_INACTIVE);
    if (dns && evdns_base_set_option(dns, "timeout:", DNS_RETRY_TIMEOUT) != 0) {
        evdns_base_free(dns, 0);
        return NULL;
    }
    return dns;
}

/* A resolver on the nameserver given (--dns-server) or resolv.conf's. */
static int create_dns(struct proxy *px)
{
    if (px->dns_server) {
        px->dns = new_resolver(px->base);
        if (!px->dns)
            return -1;
        /* NULL would load only localhost; a missing file leaves that. */
        (void)evdns_base_load_hosts(px->dns, "/etc/hosts");
        if (evdns_base_nameserver_ip_add(px->dns, px->dns_server) != 0) {
            LOG_ERROR("dns_server_invalid", "server=%s", px->dns_server);
            evdns_base_free(px->dns, 0);
            px->dns = NULL;
            return -1;
        }
        return 0;
    }
    px->dns = new_resolver(px->base);
    if (!px->dns)
        return -1;
    /* What EVDNS_BASE_INITIALIZE_NAMESERVERS parses, after the timeout
     * above. That flag refuses the base on any parse error; here a
     * resolv.conf that cannot be opened or names no nameserver means
     * 127.0.0.1 (glibc's default; libevent adds it then, with /etc/hosts
     * and a search list), and one that cannot be read gets 127.0.0.1 too:
     * with no nameserver every lookup would wait for ever. */
    int r = evdns_base_resolv_conf_parse(px->dns, DNS_OPTIONS_ALL, "/etc/resolv.conf");
    if (evdns_base_count_nameservers(px->dns) == 0 &&
        evdns_base_nameserver_ip_add(px->dns, "127.0.0.1") != 0) {
        evdns_base_free(px->dns, 0);
        px->dns = NULL;
        return -1;
    }
    if (r != 0)
        LOG_WARN("dns_resolv_conf_unusable", "path=/etc/resolv.conf result=%d nameservers=%d", r,
                 evdns_base_count_nameservers(px->dns));
    return 0;
}

static int ensure_dns(struct proxy *px, const struct config *cfg)
{
    if (px->dns || !needs_dns(cfg))
        return 0;
    return create_dns(px);
}

int proxy_set_scaler_wake(struct proxy *px, const char *url, const char *instance,
                          long timeout_ms, char *err, size_t errlen)
{
    if (scaler_wake_url_needs_dns(url) && !px->dns && create_dns(px) < 0) {
        snprintf(err, errlen, "could not set up DNS resolution");
        return -1;
    }
    struct scaler_wake *sw =
        scaler_wake_new(px->base, px->dns, url, instance, timeout_ms, err, errlen);
    if (!sw)
        return -1;
    scaler_wake_free(px->scaler_wake);
    px->scaler_wake = sw;
    return 0;
}

struct proxy *proxy_new(struct event_base *base, struct config *cfg, const char *dns_server,
                        char *err, size_t errlen)
{
    struct proxy *px = thaw_calloc(1, sizeof(*px));
    if (!px) {
        config_free(cfg);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    px->base = base;
    px->cfg = cfg;
    px->port = -1;
    px->peers = BALANCE_PEER_UNIT;
    if (dns_server && !(px->dns_server = thaw_strdup(dns_server))) {
        snprintf(err, errlen, "out of memory");
        proxy_free(px);
        return NULL;
    }
    px->tick = event_new(base, -1, EV_PERSIST, tick_cb, px);
    px->socket_retry = evtimer_new(base, socket_retry_cb, px);
    px->flusher = conn_flusher_new(base);
    px->scratch_req = thaw_malloc(sizeof(*px->scratch_req));
    px->scratch_resp = thaw_malloc(sizeof(*px->scratch_resp));
    px->routes = route_table_new(cfg);
    if (!px->tick || !px->socket_retry || !px->flusher || !px->scratch_req ||
        !px->scratch_resp || !px->routes || build_models(px, cfg, &px->models) < 0) {
        snprintf(err, errlen, "out of memory");
        proxy_free(px);
        return NULL;
    }
    if (ensure_dns(px, cfg) < 0) {
        snprintf(err, errlen, "could not set up DNS resolution");
        proxy_free(px);
        return NULL;
    }
    for (size_t i = 0; i < cfg->nmodels; i++) {
        px->models[i] = model_new(px, &cfg->models[i]);
        if (!px->models[i]) {
            snprintf(err, errlen, "model %s: could not set up its backend", cfg->models[i].name);
            proxy_free(px);
            return NULL;
        }
        px->nmodels = i + 1;
    }
    struct timeval tv;
    tv_ms(&tv, TICK_MS);
    event_add(px->tick, &tv);
    return px;
}

void proxy_free(struct proxy *px)
{
    if (!px)
        return;
    px->freeing = true;
    while (px->clients)
        client_destroy(px->clients);
    if (px->listener)
        evconnlistener_free(px->listener);
    if (px->accept_resume)
        event_free(px->accept_resume);
    if (px->socket_retry)
        event_free(px->socket_retry);
    for (size_t i = 0; i < px->nmodels; i++)
        model_free(px->models[i]);
    thaw_free(px->models);
    while (px->removed) {
        struct model_rt *m = px->removed;
        px->removed = m->next_removed;
        model_free(m);
    }
    if (px->retired) {
        size_t cur = 0;
        const char *key;
        void *value;
        while (strmap_next(px->retired, &cur, &key, &value))
            thaw_free(value);
        strmap_free(px->retired);
    }
    strmap_free(px->hdel_pending);
    while (px->old_cfgs) {
        struct old_config *o = px->old_cfgs;
        px->old_cfgs = o->next;
        config_free(o->cfg);
        thaw_free(o);
    }
    if (px->tick)
        event_free(px->tick);
    if (px->drain_timer)
        event_free(px->drain_timer);
    scaler_wake_free(px->scaler_wake); /* cancels its lookups: before the resolver */
    if (px->dns)
        evdns_base_free(px->dns, 0);
    thaw_free(px->dns_server);
    conn_flusher_free(px->flusher); /* after every connection is gone */
    thaw_free(px->scratch_req);
    thaw_free(px->scratch_resp);
    route_table_free(px->routes);
    config_free(px->cfg);
    thaw_free(px);
}

int proxy_listen(struct proxy *px, const char *host, int port, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (balance_sockaddr(host, port, &ss, &len) < 0) {
        snprintf(err, errlen, "listen address must be an IP literal, got '%s'", host);
        return -1;
    }
    px->listener = evconnlistener_new_bind(px->base, accept_cb, px,
                                           LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 1024,
                                           (struct sockaddr *)&ss, (int)len);
    if (px->listener) {
        if (!px->accept_resume)
            px->accept_resume = evtimer_new(px->base, accept_resume_cb, px);
        evconnlistener_set_error_cb(px->listener, accept_error_cb);
    }
    if (!px->listener || !px->accept_resume) {
        snprintf(err, errlen, "bind %s:%d: %s", host, port, strerror(errno));
        return -1;
    }
    struct sockaddr_storage bound;
    socklen_t bl = sizeof(bound);
    if (getsockname(evconnlistener_get_fd(px->listener), (struct sockaddr *)&bound, &bl) == 0) {
        px->port = bound.ss_family == AF_INET6
                       ? ntohs(((struct sockaddr_in6 *)(void *)&bound)->sin6_port)
                       : ntohs(((struct sockaddr_in *)(void *)&bound)->sin_port);
    }
    return 0;
}

int proxy_port(const struct proxy *px) { return px->port; }

void proxy_set_access_log(struct proxy *px, bool on) { px->access_log = on; }

void proxy_set_redis(struct proxy *px, struct redis_link *redis, const char *peer_group)
{
    px->redis = redis;
    snprintf(px->peers_key, sizeof(px->peers_key), "thaw:activators:%s",
             peer_group ? peer_group : "default");
    if (redis)
        redis_link_set_peers_cb(redis, on_peers, px);
}

size_t proxy_model_count(const struct proxy *px) { return px->nmodels; }

long proxy_drain_timeout_ms(const struct proxy *px) { return px->cfg->limits.drain_timeout_ms; }

int proxy_reload(struct proxy *px, struct config *cfg)
{
    if (px->draining) {
        /* A model it added would hold and wake for an instance on its way
         * out; every new request gets 503 draining instead. */
        LOG_WARN("reload_ignored", "reason=\"draining\"");
        config_free(cfg);
        return -1;
    }
    struct model_rt **models = NULL;
    struct old_config *old = thaw_calloc(1, sizeof(*old));
    struct route_table *routes = route_table_new(cfg);
    if (!old || !routes || build_models(px, cfg, &models) < 0 || ensure_dns(px, cfg) < 0) {
        route_table_free(routes);
        thaw_free(old);
        thaw_free(models);
        LOG_ERROR("reload_failed", "reason=\"out of memory or no DNS\"");
        config_free(cfg);
        return -1;
    }
    /* Build every new model first so a failure leaves the old set intact. */
    bool *kept = thaw_calloc(px->nmodels + 1, sizeof(bool));
    if (!kept) {
        route_table_free(routes);
        thaw_free(old);
        thaw_free(models);
        config_free(cfg);
        return -1;
    }
    for (size_t i = 0; i < cfg->nmodels; i++) {
        for (size_t k = 0; k < px->nmodels; k++) {
            if (!kept[k] && strcmp(px->models[k]->name, cfg->models[i].name) == 0) {
                kept[k] = true;
                models[i] = px->models[k];
                break;
            }
        }
    }
    struct config *prev = px->cfg;
    px->cfg = cfg; /* new models read limits from here */
    for (size_t i = 0; i < cfg->nmodels; i++) {
        if (models[i])
            continue;
        models[i] = model_new(px, &cfg->models[i]);
        if (!models[i]) {
            for (size_t k = 0; k < i; k++) {
                bool existing = false;
                for (size_t j = 0; j < px->nmodels; j++)
                    existing |= px->models[j] == models[k];
                if (!existing)
                    model_free(models[k]);
            }
            LOG_ERROR("reload_failed", "model=%s", cfg->models[i].name);
            route_table_free(routes);
            px->cfg = prev;
            thaw_free(kept);
            thaw_free(old);
            thaw_free(models);
            config_free(cfg);
            return -1;
        }
    }
    /* The new set is in place before any backend is reconfigured: a backend
     * going down wakes its model's wakeWith, which may be new too. */
    struct model_rt **old_models = px->models;
    size_t old_n = px->nmodels;
    px->models = models;
    px->nmodels = cfg->nmodels;
    route_table_free(px->routes);
    px->routes = routes;
    for (size_t k = 0; k < old_n; k++) {
        if (kept[k])
            continue;
        struct model_rt *m = old_models[k];
        m->removed = true;
        model_apply(m, model_sm_handle(&m->sm, MEV_DRAIN, now_ms(), model_waiting(m)));
        m->next_removed = px->removed;
        px->removed = m;
    }
    thaw_free(kept);
    thaw_free(old_models);
    for (size_t i = 0; i < cfg->nmodels; i++) {
        struct model_rt *m = models[i];
        const struct model_config *mc = &cfg->models[i];
        m->mc = mc;
        holdq_set_limits(&m->hq, (size_t)mc->max_held_requests, (size_t)mc->max_held_bytes);
        /* A shorter hold timeout applies to the requests held already (and
         * those held later are not stuck behind their longer deadlines). */
        holdq_set_hold_timeout(&m->hq, mc->hold_timeout_ms);
        arm_hold_timer(m);
        m->sm.wake_timeout_ms = mc->hold_timeout_ms;
        if (backend_reconfigure(m->be, px->dns, mc, &cfg->limits) < 0)
            LOG_ERROR("backend_reconfigure_failed", "model=%s", m->name);
        if (fallback_apply(m, mc) < 0)
            LOG_ERROR("fallback_reconfigure_failed", "model=%s", m->name);
        arm_fallback_timer(m);
    }
    old->cfg = prev;
    old->next = px->old_cfgs;
    px->old_cfgs = old;
    for (size_t i = 0; i < px->nmodels; i++)
        inherit_outcomes(px, px->models[i]);
    free_removed(px);
    LOG_INFO("config_reloaded", "models=%zu", cfg->nmodels);
    /* A higher cap (or the split turned off) may let queued requests go; once
     * the new config is in place, as they may end and the next be routed. */
    for (size_t i = 0; i < px->nmodels; i++)
        release_held(px->models[i]);
    return 0;
}

static void check_drained(struct proxy *px)
{
    if (px->draining && px->nclients == 0 && !px->drain_done_called) {
        px->drain_done_called = true;
        LOG_INFO("drained", "accepted=%llu", (unsigned long long)px->accepted);
        /* Nothing of ours is in flight: the others widen their share at their
         * next count, not a TTL later. */
        if (px->redis && redis_link_up(px->redis))
            redis_link_leave(px->redis, px->peers_key);
        for (size_t i = 0; i < px->nmodels; i++)
            publish_drained(px->models[i]);
        for (struct model_rt *m = px->removed; m; m = m->next_removed)
            publish_drained(m);
        /* While the loop still turns (the exit flush), so cancelled lookups
         * are finished and freed. */
        scaler_wake_cancel(px->scaler_wake);
        for (size_t i = 0; i < px->nmodels; i++)
            model_stop(px->models[i]);
        for (struct model_rt *m = px->removed; m; m = m->next_removed)
            model_stop(m);
        if (px->drain_done)
            px->drain_done(px->drain_ud);
    }
}

static void drain_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct proxy *px = arg;
    px->drain_deadline_passed = true;
    LOG_WARN("drain_deadline", "clients=%zu", px->nclients);
    for (size_t i = 0; i < px->nmodels; i++) {
        struct model_rt *m = px->models[i];
        struct holdq_node *n;
        while ((n = holdq_pop(&m->hq)))
            req_fail(req_of_node(n), 503, OUT_DRAINING, "draining",
                     "the activator is shutting down");
        arm_hold_timer(m);
        /* Nothing is held any more: say so now (HDEL), not at the next
         * refresh, which will not come before the process exits. */
        publish_held(m);
    }
    for (struct model_rt *m = px->removed; m; m = m->next_removed) {
        struct holdq_node *n;
        while ((n = holdq_pop(&m->hq)))
            req_fail(req_of_node(n), 503, OUT_DRAINING, "draining",
                     "the activator is shutting down");
    }
    for (struct client *cl = px->clients; cl; cl = cl->next) {
        struct req *r = cl->req;
        if (r && !r->resp_head_done)
            req_fail(r, 503, OUT_DRAINING, "draining", "the activator is shutting down");
        else if (r)
            req_cut(r, OUT_ABORTED); /* mid-response: nothing clean left to send */
        else if (cl->linger)
            linger_end(cl, LINGER_ERROR);
        else
            client_close(cl, false);
    }
    check_drained(px);
}

void proxy_drain(struct proxy *px, void (*done)(void *ud), void *ud)
{
    if (px->draining)
        return;
    px->draining = true;
    /* The live count it had, if fresh, says what a live peer's share is. */
    px->peers_as_live = now_ms() - px->peers_seen_ms <= PEERS_TTL_MS ? px->peers : 0;
    px->drain_done = done;
    px->drain_ud = ud;
    /* Closed before the log line, so whoever reads "draining" can rely on
     * new connections being refused. */
    if (px->listener) {
        evconnlistener_free(px->listener);
        px->listener = NULL;
    }
    LOG_INFO("draining", "clients=%zu timeout_ms=%ld", px->nclients,
             px->cfg->limits.drain_timeout_ms);
    for (size_t i = 0; i < px->nmodels; i++) {
        struct model_rt *m = px->models[i];
        model_apply(m, model_sm_handle(&m->sm, MEV_DRAIN, now_ms(), model_waiting(m)));
    }
    for (struct client *cl = px->clients; cl; cl = cl->next) {
        if (!cl->req && !cl->in_head)
            client_close(cl, false);
    }
    px->drain_timer = evtimer_new(px->base, drain_deadline_cb, px);
    if (px->drain_timer) {
        struct timeval tv;
        tv_ms(&tv, px->cfg->limits.drain_timeout_ms);
        evtimer_add(px->drain_timer, &tv);
    }
    check_drained(px);
}

bool proxy_is_draining(const struct proxy *px) { return px->draining; }

int proxy_wake(struct proxy *px, const char *model)
{
    struct model_rt *m = model_by_name(px, model);
    if (!m)
        return -1;
    model_apply(m, model_sm_handle(&m->sm, MEV_WAKE, now_ms(), model_waiting(m)));
    return 0;
}

void proxy_get_totals(const struct proxy *px, struct proxy_totals *out)
{
    memset(out, 0, sizeof(*out));
    out->accepted = px->accepted;
    out->connections = px->connections;
    out->open_connections = px->nclients;
    out->lingering_connections = px->nlingering;
    for (int o = 0; o < PROXY_OUTCOME_COUNT; o++)
        out->outcomes[o] = px->unrouted[o];
    for (size_t i = 0; i < px->nmodels; i++) {
        const struct model_rt *m = px->models[i];
        for (int o = 0; o < PROXY_OUTCOME_COUNT; o++)
            out->outcomes[o] += m->outcomes[o];
        out->held += m->hq.count;
        out->inflight += m->inflight;
    }
    for (const struct model_rt *m = px->removed; m; m = m->next_removed) {
        for (int o = 0; o < PROXY_OUTCOME_COUNT; o++)
            out->outcomes[o] += m->outcomes[o];
        out->held += m->hq.count;
        out->inflight += m->inflight;
    }
    size_t cur = 0;
    const char *key;
    void *value;
    while (px->retired && strmap_next(px->retired, &cur, &key, &value)) {
        const struct retired_outcomes *r = value;
        for (int o = 0; o < PROXY_OUTCOME_COUNT; o++)
            out->outcomes[o] += r->outcomes[o];
    }
}

/* ---- exposition ---- */

struct ep_ctx {
    struct evbuffer *out;
    const char *model;
    int pass;
};

static void ep_metric(void *ud, const char *label, unsigned outstanding, bool healthy,
                      uint64_t requests)
{
    struct ep_ctx *c = ud;
    char labels[LABELS_BYTES];
    if (expo_labels(labels, sizeof(labels), "model", c->model, "endpoint", label, NULL) < 0)
        return;
    if (c->pass == 0)
        expo_sample(c->out, "thaw_activator_endpoint_outstanding_requests", labels, outstanding);
    else if (c->pass == 1)
        expo_sample(c->out, "thaw_activator_endpoint_healthy", labels, healthy ? 1 : 0);
    else
        expo_sample(c->out, "thaw_activator_endpoint_requests_total", labels, (double)requests);
}

/* thaw_activator_requests_total for model `name`: the configured model's
 * counts, its removed instances' and its retired ones (at most one of the
 * first and last exists). */
static void write_outcomes(struct evbuffer *out, struct proxy *px, const char *name)
{
    uint64_t n[PROXY_OUTCOME_COUNT] = {0};
    bool routed = false;
    const struct model_rt *cur = model_by_name(px, name);
    if (cur) {
        for (int o = 0; o < PROXY_OUTCOME_COUNT; o++)
            n[o] += cur->outcomes[o];
        routed |= cur->routed;
    }
    for (const struct model_rt *m = px->removed; m; m = m->next_removed) {
        if (strcmp(m->name, name) != 0)
            continue;
        for (int o = 0; o < PROXY_OUTCOME_COUNT; o++)
            n[o] += m->outcomes[o];
        routed |= m->routed;
    }
    const struct retired_outcomes *r = px->retired ? strmap_get(px->retired, name) : NULL;
    if (r) {
        for (int o = 0; o < PROXY_OUTCOME_COUNT; o++)
            n[o] += r->outcomes[o];
        routed |= r->routed;
    }
    char labels[LABELS_BYTES];
    for (int o = 0; o < PROXY_OUTCOME_COUNT; o++) {
        if (n[o] == 0 && o != OUT_OK && !(routed && outcome_exposed_from_zero[o]))
            continue;
        if (expo_labels(labels, sizeof(labels), "model", name, "outcome", outcome_names[o],
                        NULL) >= 0)
            expo_sample(out, "thaw_activator_requests_total", labels, (double)n[o]);
    }
}

static double held_of(const struct model_rt *m) { return (double)m->hq.count; }
static double held_bytes_of(const struct model_rt *m) { return (double)m->hq.bytes; }
static double inflight_of(const struct model_rt *m) { return (double)m->inflight; }

static void write_name_sample(struct evbuffer *out, struct proxy *px, const char *family,
                              const char *name, double (*value)(const struct model_rt *))
{
    char labels[LABELS_BYTES];
    if (expo_labels(labels, sizeof(labels), "model", name, NULL) >= 0)
        expo_sample(out, family, labels, name_sum(px, name, value));
}

/* One sample per model name: the configured model plus its removed
 * namesakes still carrying requests, summed, and a name only removed ones
 * have until they are freed (their requests are still the model's demand,
 * and Redis still reports them). */
static void write_name_gauge(struct evbuffer *out, struct proxy *px, const char *family,
                             double (*value)(const struct model_rt *))
{
    for (size_t i = 0; i < px->nmodels; i++)
        write_name_sample(out, px, family, px->models[i]->name, value);
    for (const struct model_rt *r = px->removed; r; r = r->next_removed)
        if (removed_leads_name(px, r))
            write_name_sample(out, px, family, r->name, value);
}

void proxy_write_metrics(struct proxy *px, struct evbuffer *out)
{
    char labels[LABELS_BYTES];
    struct proxy_totals t;
    proxy_get_totals(px, &t);

    expo_family(out, "thaw_activator_requests_accepted_total", "counter",
                "Requests the proxy started reading.");
    expo_sample(out, "thaw_activator_requests_accepted_total", NULL, (double)t.accepted);

    expo_family(out, "thaw_activator_requests_total", "counter",
                "Requests ended, by model and outcome (model=\"none\" before routing).");
    for (int o = 0; o < PROXY_OUTCOME_COUNT; o++) {
        if (px->unrouted[o] == 0)
            continue;
        if (expo_labels(labels, sizeof(labels), "model", "none", "outcome", outcome_names[o],
                        NULL) >= 0)
            expo_sample(out, "thaw_activator_requests_total", labels, (double)px->unrouted[o]);
    }
    /* One series per name: a model's count, with the removed instances of
     * it still carrying requests, and the counts of models removed since. */
    for (size_t i = 0; i < px->nmodels; i++)
        write_outcomes(out, px, px->models[i]->name);
    for (const struct model_rt *m = px->removed; m; m = m->next_removed) {
        if (removed_leads_name(px, m))
            write_outcomes(out, px, m->name);
    }
    size_t cur = 0;
    const char *rkey;
    void *rvalue;
    while (px->retired && strmap_next(px->retired, &cur, &rkey, &rvalue))
        write_outcomes(out, px, rkey);

    expo_family(out, "thaw_activator_held_requests", "gauge", "Requests held, by model.");
    write_name_gauge(out, px, "thaw_activator_held_requests", held_of);
    expo_family(out, "thaw_activator_held_bytes", "gauge", "Memory charged to held requests.");
    write_name_gauge(out, px, "thaw_activator_held_bytes", held_bytes_of);
    expo_family(out, "thaw_activator_inflight_requests", "gauge",
                "Requests sent to a backend and not finished, by model.");
    write_name_gauge(out, px, "thaw_activator_inflight_requests", inflight_of);
    expo_family(out, "thaw_activator_model_state", "gauge",
                "1 for the state each model is in.");
    for (size_t i = 0; i < px->nmodels; i++) {
        const struct model_rt *m = px->models[i];
        for (int s = 0; s < MODEL_STATE_COUNT; s++) {
            if (expo_labels(labels, sizeof(labels), "model", m->name, "state",
                            model_state_to_str((enum model_state)s), NULL) >= 0)
                expo_sample(out, "thaw_activator_model_state", labels, (int)m->sm.state == s);
        }
    }
    expo_family(out, "thaw_activator_model_transitions_total", "counter",
                "State machine transitions, by model, from and to.");
    for (size_t i = 0; i < px->nmodels; i++) {
        const struct model_rt *m = px->models[i];
        for (int a = 0; a < MODEL_STATE_COUNT; a++) {
            for (int b = 0; b < MODEL_STATE_COUNT; b++) {
                if (!m->sm.transitions[a][b])
                    continue;
                if (expo_labels(labels, sizeof(labels), "model", m->name, "from",
                                model_state_to_str((enum model_state)a), "to",
                                model_state_to_str((enum model_state)b), NULL) >= 0)
                    expo_sample(out, "thaw_activator_model_transitions_total", labels,
                                (double)m->sm.transitions[a][b]);
            }
        }
    }
    expo_family(out, "thaw_activator_cold_starts_total", "counter",
                "Times a model went from waking to ready.");
    for (size_t i = 0; i < px->nmodels; i++) {
        const struct model_rt *m = px->models[i];
        if (expo_labels(labels, sizeof(labels), "model", m->name, NULL) >= 0)
            expo_sample(out, "thaw_activator_cold_starts_total", labels, (double)m->sm.cold_starts);
    }
    expo_family(out, "thaw_activator_wake_signals_total", "counter",
                "Wake signals published to Redis, by model.");
    for (size_t i = 0; i < px->nmodels; i++) {
        const struct model_rt *m = px->models[i];
        if (expo_labels(labels, sizeof(labels), "model", m->name, NULL) >= 0)
            expo_sample(out, "thaw_activator_wake_signals_total", labels, (double)m->wake_signals);
    }
    expo_family(out, "thaw_activator_late_released_total", "counter",
                "Requests released from the hold queue after waiting longer than "
                "lateAfterSeconds, which lets newer ones go first (each counted once; 0 "
                "while it is off), by model.");
    for (size_t i = 0; i < px->nmodels; i++) {
        const struct model_rt *m = px->models[i];
        if (expo_labels(labels, sizeof(labels), "model", m->name, NULL) >= 0)
            expo_sample(out, "thaw_activator_late_released_total", labels,
                        (double)m->late_released);
    }
    expo_family(out, "thaw_activator_fallback_requests_total", "counter",
                "Requests sent to the model's fallbackBackend after waiting fallbackAfterSeconds "
                "for it to wake, by model.");
    for (size_t i = 0; i < px->nmodels; i++) {
        const struct model_rt *m = px->models[i];
        if (expo_labels(labels, sizeof(labels), "model", m->name, NULL) >= 0)
            expo_sample(out, "thaw_activator_fallback_requests_total", labels,
                        (double)m->fallback_requests);
    }
    expo_family(out, "thaw_activator_wakes_total", "counter",
                "Wake actions (requests, admin, wakeWith), sent to Redis or not.");
    for (size_t i = 0; i < px->nmodels; i++) {
        const struct model_rt *m = px->models[i];
        if (expo_labels(labels, sizeof(labels), "model", m->name, NULL) >= 0)
            expo_sample(out, "thaw_activator_wakes_total", labels, (double)m->wakes);
    }
    expo_family(out, "thaw_activator_hold_duration_seconds", "histogram",
                "Time requests spent held before release or timeout.");
    for (size_t i = 0; i < px->nmodels; i++) {
        const struct model_rt *m = px->models[i];
        if (expo_labels(labels, sizeof(labels), "model", m->name, NULL) >= 0)
            expo_histogram_write(out, "thaw_activator_hold_duration_seconds", labels, &m->hold_hist);
    }
    expo_family(out, "thaw_activator_upstream_ttfb_seconds", "histogram",
                "From sending a request to a backend to its response head.");
    for (size_t i = 0; i < px->nmodels; i++) {
        const struct model_rt *m = px->models[i];
        if (expo_labels(labels, sizeof(labels), "model", m->name, NULL) >= 0)
            expo_histogram_write(out, "thaw_activator_upstream_ttfb_seconds", labels, &m->ttfb_hist);
    }
    expo_family(out, "thaw_activator_response_head_seconds", "histogram",
                "From a request's head to the response head forwarded (holding included).");
    for (size_t i = 0; i < px->nmodels; i++) {
        const struct model_rt *m = px->models[i];
        if (expo_labels(labels, sizeof(labels), "model", m->name, NULL) >= 0)
            expo_histogram_write(out, "thaw_activator_response_head_seconds", labels, &m->head_hist);
    }
    expo_family(out, "thaw_activator_endpoints", "gauge", "Endpoints by model and health.");
    for (size_t i = 0; i < px->nmodels; i++) {
        struct backend_stats bs;
        backend_get_stats(px->models[i]->be, &bs);
        if (expo_labels(labels, sizeof(labels), "model", px->models[i]->name, "health", "healthy",
                        NULL) >= 0)
            expo_sample(out, "thaw_activator_endpoints", labels, (double)bs.healthy);
        if (expo_labels(labels, sizeof(labels), "model", px->models[i]->name, "health",
                        "unhealthy", NULL) >= 0)
            expo_sample(out, "thaw_activator_endpoints", labels,
                        (double)(bs.endpoints - bs.healthy));
    }
    static const char *const ep_names[3] = {"thaw_activator_endpoint_outstanding_requests",
                                            "thaw_activator_endpoint_healthy",
                                            "thaw_activator_endpoint_requests_total"};
    static const char *const ep_types[3] = {"gauge", "gauge", "counter"};
    static const char *const ep_help[3] = {"Requests in flight per endpoint.",
                                           "1 if the endpoint passed its health check.",
                                           "Requests sent per endpoint."};
    for (int pass = 0; pass < 3; pass++) {
        expo_family(out, ep_names[pass], ep_types[pass], ep_help[pass]);
        for (size_t i = 0; i < px->nmodels; i++) {
            struct ep_ctx c = {out, px->models[i]->name, pass};
            backend_each_endpoint(px->models[i]->be, ep_metric, &c);
        }
    }
    expo_family(out, "thaw_activator_probes_total", "counter", "Readiness probes, by result.");
    for (size_t i = 0; i < px->nmodels; i++) {
        struct backend_stats bs;
        backend_get_stats(px->models[i]->be, &bs);
        if (expo_labels(labels, sizeof(labels), "model", px->models[i]->name, "result", "ok",
                        NULL) >= 0)
            expo_sample(out, "thaw_activator_probes_total", labels,
                        (double)(bs.probes - bs.probe_failures));
        if (expo_labels(labels, sizeof(labels), "model", px->models[i]->name, "result", "fail",
                        NULL) >= 0)
            expo_sample(out, "thaw_activator_probes_total", labels, (double)bs.probe_failures);
    }
    expo_family(out, "thaw_activator_connections_total", "counter", "Client connections accepted.");
    expo_sample(out, "thaw_activator_connections_total", NULL, (double)t.connections);
    expo_family(out, "thaw_activator_open_connections", "gauge", "Client connections open.");
    expo_sample(out, "thaw_activator_open_connections", NULL, (double)t.open_connections);
    expo_family(out, "thaw_activator_lingering_connections", "gauge",
                "Client connections in a lingering close (counted in open connections too).");
    expo_sample(out, "thaw_activator_lingering_connections", NULL,
                (double)t.lingering_connections);
    expo_family(out, "thaw_activator_lingering_closes_total", "counter",
                "Lingering closes by result (full: refused, maxLingeringConnections reached).");
    for (int i = 0; i < LINGER_RESULT_COUNT; i++) {
        if (expo_labels(labels, sizeof(labels), "result", linger_names[i], NULL) >= 0)
            expo_sample(out, "thaw_activator_lingering_closes_total", labels,
                        (double)px->linger_results[i]);
    }
    expo_family(out, "thaw_activator_draining", "gauge", "1 while shutting down.");
    expo_sample(out, "thaw_activator_draining", NULL, px->draining ? 1 : 0);
    struct redis_link_stats rs;
    redis_link_get_stats(px->redis, &rs);
    expo_family(out, "thaw_activator_redis_up", "gauge", "1 while the Redis link is connected.");
    expo_sample(out, "thaw_activator_redis_up", NULL, redis_link_up(px->redis) ? 1 : 0);
    struct scaler_wake_stats ws;
    scaler_wake_get_stats(px->scaler_wake, &ws);
    expo_family(out, "thaw_activator_scaler_wakes_total", "counter",
                "Wake posts straight to thaw-scaler (--scaler-wake-url), one per scaler address, "
                "by result (dropped: over the in-flight bound; unresolved: the host did not "
                "resolve).");
    static const char *const wake_results[] = {"sent", "failed", "dropped", "unresolved"};
    const uint64_t wake_counts[] = {ws.sent, ws.failed, ws.dropped, ws.unresolved};
    for (size_t i = 0; i < 4; i++) {
        char lb[40];
        snprintf(lb, sizeof(lb), "result=\"%s\"", wake_results[i]);
        expo_sample(out, "thaw_activator_scaler_wakes_total", lb, (double)wake_counts[i]);
    }
    expo_family(out, "thaw_activator_peers", "gauge",
                "Live activators (this one included) sharing each endpoint's "
                "maxConcurrencyPerEndpoint, counted in Redis (a draining one for the part of its "
                "share it still uses); 1 without a count in the last 5 s (a draining one keeps "
                "its share).");
    expo_sample(out, "thaw_activator_peers", NULL, (double)px->peers / BALANCE_PEER_UNIT);
    expo_family(out, "thaw_activator_redis_commands_total", "counter", "Redis commands sent.");
    expo_sample(out, "thaw_activator_redis_commands_total", NULL, (double)rs.commands);
    expo_family(out, "thaw_activator_redis_failures_total", "counter",
                "Redis commands that failed or were never answered.");
    expo_sample(out, "thaw_activator_redis_failures_total", NULL, (double)rs.failures);
    expo_family(out, "thaw_activator_redis_replies_refused_total", "counter",
                "Redis replies refused by the reply guard (no command asked for them, or over 1M "
                "array elements); each dropped the connection.");
    expo_sample(out, "thaw_activator_redis_replies_refused_total", NULL,
                (double)redis_guard_refused_total());
}

json_t *proxy_models_json(struct proxy *px)
{
    json_t *arr = json_array();
    if (!arr)
        return NULL;
    int64_t now = now_ms();
    for (size_t i = 0; i < px->nmodels; i++) {
        const struct model_rt *m = px->models[i];
        json_t *eps = backend_to_json(m->be);
        json_t *o = json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o*}", "name", m->name,
                              "state", model_state_to_str(m->sm.state), "stateForMs",
                              (json_int_t)(now - m->sm.since_ms), "held", (json_int_t)m->hq.count,
                              "inflight", (json_int_t)m->inflight, "coldStarts",
                              (json_int_t)m->sm.cold_starts, "wakeSignals",
                              (json_int_t)m->wake_signals, "lateReleased",
                              (json_int_t)m->late_released, "ok",
                              (json_int_t)m->outcomes[OUT_OK], "fallbackRequests",
                              (json_int_t)m->fallback_requests, "capPerEndpoint",
                              (json_int_t)backend_cap(m->be), "endpoints", eps);
        if (!o || json_array_append_new(arr, o) < 0) {
            json_decref(arr);
            return NULL;
        }
    }
    /* Models a reload removed that still carry requests, until freed. */
    json_t *removed = json_array();
    for (const struct model_rt *m = px->removed; removed && m; m = m->next_removed) {
        json_t *o = json_pack("{s:s,s:s,s:I,s:I}", "name", m->name, "state",
                              model_state_to_str(m->sm.state), "held", (json_int_t)m->hq.count,
                              "inflight", (json_int_t)m->inflight);
        if (!o || json_array_append_new(removed, o) < 0) {
            json_decref(removed);
            removed = NULL;
        }
    }
    if (!removed) {
        json_decref(arr);
        return NULL;
    }
    json_t *root = json_pack("{s:o,s:o,s:b,s:b,s:f}", "models", arr, "removedModels", removed,
                             "draining", px->draining, "redis", redis_link_up(px->redis), "peers",
                             (double)px->peers / BALANCE_PEER_UNIT);
    return root;
}
