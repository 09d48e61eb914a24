/* http_conn_cap: see http_conn_cap.h. */
#include "http_conn_cap.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

#include "alloc.h"
#include "clock.h"
#include "expo.h"
#include "log.h"

struct http_conn_cap {
    int max;
    int open;
    uint64_t refused;
    int64_t full_logged_ms;
    char name[32];
    /* Bufferevents handed to evhttp in this loop pass, each with a reference
     * of ours so that it outlives a connection evhttp frees at once. */
    struct bufferevent **pending;
    size_t npending, pending_cap;
    struct event *settle;
};

static void connection_closed(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    struct http_conn_cap *c = arg;
    if (c->open > 0)
        c->open--;
}

static void refuse(struct http_conn_cap *c, struct evhttp_connection *evcon, int fd)
{
    static const char answer[] = "HTTP/1.1 503 Service Unavailable\r\n"
                                 "Content-Type: text/plain\r\n"
                                 "Content-Length: 21\r\n"
                                 "Connection: close\r\n"
                                 "\r\n"
                                 "too many connections\n";
    /* A fresh socket's send buffer is empty: this small answer goes out
     * whole or not at all. What the client has sent already is read and
     * dropped first: closing a socket with unread input sends a reset,
     * which would discard the answer (a client still sending after this
     * can get the reset anyway). */
    char scratch[4096];
    size_t drained = 0;
    ssize_t n;
    while (drained < 16384 && (n = recv(fd, scratch, sizeof(scratch), MSG_DONTWAIT)) > 0)
        drained += (size_t)n;
    (void)send(fd, answer, sizeof(answer) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    c->refused++;
    if (log_throttle(&c->full_logged_ms, clock_mono_ms())) {
        LOG_WARN("http_connections_full", "server=%s open=%d limit=%d refused_total=%llu",
                 c->name, c->open, c->max, (unsigned long long)c->refused);
    }
    evhttp_connection_free(evcon);
}

/* Runs after the accept pass that created the pending bufferevents: by then
 * evhttp has made each one's connection its callback argument, or freed it
 * (bufferevent_free clears the callbacks). */
static void settle_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct http_conn_cap *c = arg;
    for (size_t i = 0; i < c->npending; i++) {
        struct bufferevent *bev = c->pending[i];
        bufferevent_data_cb rd = NULL, wr = NULL;
        bufferevent_event_cb ev = NULL;
        void *cbarg = NULL;
        bufferevent_getcb(bev, &rd, &wr, &ev, &cbarg);
        struct evhttp_connection *evcon = cbarg;
        int sock = bufferevent_getfd(bev);
        if (evcon && sock >= 0 && evhttp_connection_get_bufferevent(evcon) == bev) {
            if (c->open >= c->max) {
                refuse(c, evcon, sock);
            } else {
                c->open++;
                evhttp_connection_set_closecb(evcon, connection_closed, c);
            }
        }
        bufferevent_decref(bev);
    }
    c->npending = 0;
}

static struct bufferevent *new_connection_bev(struct event_base *base, void *arg)
{
    struct http_conn_cap *c = arg;
    /* No BEV_OPT_CLOSE_ON_FREE, as evhttp's own: evhttp then closes the
     * socket itself when it frees the connection, while the reference held
     * here keeps the bufferevent alive. With it, a connection evhttp drops
     * at once (it closes the fd itself then) would have its descriptor
     * number closed again when that reference goes, by then maybe another
     * connection's. */
    struct bufferevent *bev = bufferevent_socket_new(base, -1, 0);
    if (!bev)
        return NULL; /* evhttp tries its own and drops the connection if that fails too */
    if (c->npending == c->pending_cap) {
        size_t n = c->pending_cap ? c->pending_cap * 2 : 16;
        struct bufferevent **p = thaw_realloc(c->pending, n * sizeof(*p));
        if (!p) {
            /* Out of memory: this connection goes uncounted rather than refused. */
            return bev;
        }
        c->pending = p;
        c->pending_cap = n;
    }
    bufferevent_incref(bev);
    c->pending[c->npending++] = bev;
    event_active(c->settle, EV_TIMEOUT, 0);
    return bev;
}

struct http_conn_cap *http_conn_cap_new(struct event_base *base, struct evhttp *http,
                                        int max_connections, const char *name)
{
    struct http_conn_cap *c = thaw_calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->max = max_connections > 0 ? max_connections : 1;
    snprintf(c->name, sizeof(c->name), "%s", name ? name : "http");
    c->settle = event_new(base, -1, 0, settle_cb, c);
    if (!c->settle) {
        thaw_free(c);
        return NULL;
    }
    evhttp_set_bevcb(http, new_connection_bev, c);
    return c;
}

void http_conn_cap_free(struct http_conn_cap *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->npending; i++)
        bufferevent_decref(c->pending[i]);
    thaw_free(c->pending);
    event_free(c->settle);
    thaw_free(c);
}

int http_conn_cap_open(const struct http_conn_cap *c) { return c->open; }

uint64_t http_conn_cap_refused(const struct http_conn_cap *c) { return c->refused; }

void http_conn_cap_write_metrics(const struct http_conn_cap *c, struct evbuffer *out,
                                 const char *prefix, const char *what)
{
    char name[128], help[256];
    snprintf(name, sizeof(name), "%s_connections", prefix);
    snprintf(help, sizeof(help), "Open connections to the %s port.", what);
    expo_family(out, name, "gauge", help);
    expo_sample(out, name, NULL, (double)c->open);
    snprintf(name, sizeof(name), "%s_connections_refused_total", prefix);
    snprintf(help, sizeof(help),
             "Connections to the %s port answered 503 and closed because the connection "
             "limit was reached.",
             what);
    expo_family(out, name, "counter", help);
    expo_sample(out, name, NULL, (double)c->refused);
}
