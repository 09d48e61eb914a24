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

/* An open connection, kept in order of its last activity (the least recent
 * first): the first one idle long enough is closed to make room when the
 * cap is reached, as nginx reuses idle keep-alive connections. */
struct tracked_conn {
    struct http_conn_cap *cap;
    struct bufferevent *bev; /* a reference of ours: valid until the entry goes */
    struct evbuffer_cb_entry *in_cb, *out_cb;
    int64_t active_ms;
    /* evhttp took request bytes and the answer has not all left: buffers
     * empty between parsed header lines, or while a handler builds its
     * answer later (thaw-scaler's pages), do not make it idle. */
    bool in_request;
    bool evicting; /* shut down, out of the list, waiting for evhttp to free it */
    struct tracked_conn *prev, *next;
};

struct http_conn_cap {
    int max;
    int open;     /* connections evhttp holds, evicting ones included */
    int evicting; /* of those, shut down and not freed yet: their places are taken */
    int64_t evict_idle_ms;
    uint64_t refused;
    uint64_t evicted;
    int64_t refuse_logged_ms, evict_logged_ms; /* one line of each per 10 s at most */
    char name[32];
    struct tracked_conn *oldest, *newest;
    /* Bufferevents handed to evhttp in this loop pass, each with a reference
     * of ours so that it outlives a connection evhttp frees at once. */
    struct bufferevent **pending;
    size_t npending, pending_cap;
    struct event *settle;
};

/* The bufferevent's callback argument (evhttp's connection while it is
 * live); NULL once evhttp has freed the connection (bufferevent_free
 * clears the callbacks; the reference we hold keeps the struct). */
static void *live_cbarg(struct bufferevent *bev)
{
    bufferevent_data_cb rd = NULL, wr = NULL;
    bufferevent_event_cb ev = NULL;
    void *cbarg = NULL;
    bufferevent_getcb(bev, &rd, &wr, &ev, &cbarg);
    return ev ? cbarg : NULL;
}

static void list_unlink(struct http_conn_cap *c, struct tracked_conn *t)
{
    if (t->prev)
        t->prev->next = t->next;
    else
        c->oldest = t->next;
    if (t->next)
        t->next->prev = t->prev;
    else
        c->newest = t->prev;
    t->prev = t->next = NULL;
}

static void list_append(struct http_conn_cap *c, struct tracked_conn *t)
{
    t->prev = c->newest;
    t->next = NULL;
    if (c->newest)
        c->newest->next = t;
    else
        c->oldest = t;
    c->newest = t;
}

/* Bytes read or written: the connection is in use. */
static void activity_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    struct tracked_conn *t = arg;
    if (t->evicting || (info->n_added == 0 && info->n_deleted == 0))
        return;
    if (buf == bufferevent_get_input(t->bev)) {
        if (info->n_deleted > 0)
            t->in_request = true; /* evhttp parsed some of a request */
    } else if (info->n_deleted > 0 && info->orig_size + info->n_added == info->n_deleted) {
        t->in_request = false; /* an answer has left whole */
    }
    t->active_ms = clock_mono_ms();
    if (t != t->cap->newest) {
        list_unlink(t->cap, t);
        list_append(t->cap, t);
    }
}

/* Runs from the connection's close callback, before evhttp frees the
 * bufferevent: dropping our reference first leaves evhttp's the last. */
static void tracked_release(struct tracked_conn *t)
{
    struct http_conn_cap *c = t->cap;
    if (t->in_cb)
        evbuffer_remove_cb_entry(bufferevent_get_input(t->bev), t->in_cb);
    if (t->out_cb)
        evbuffer_remove_cb_entry(bufferevent_get_output(t->bev), t->out_cb);
    if (t->evicting) {
        if (c->evicting > 0)
            c->evicting--;
    } else {
        list_unlink(c, t);
    }
    if (c->open > 0)
        c->open--;
    bufferevent_decref(t->bev);
    thaw_free(t);
}

static void connection_closed(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    tracked_release(arg);
}

size_t http_conn_cap_unsent_bytes(const struct http_conn_cap *cap)
{
    size_t sum = 0;
    for (const struct tracked_conn *t = cap->oldest; t; t = t->next)
        if (live_cbarg(t->bev))
            sum += evbuffer_get_length(bufferevent_get_output(t->bev));
    return sum;
}

/* The least recently active connection with nothing in its buffers, no
 * request begun and not answered, and no bytes for evict_idle_ms: between
 * requests, or opened and never used. */
static struct tracked_conn *idle_victim(struct http_conn_cap *c, int64_t now_ms)
{
    struct tracked_conn *next;
    for (struct tracked_conn *t = c->oldest; t; t = next) {
        next = t->next;
        /* Defensive: a connection evhttp freed without reporting it must
         * not have its old descriptor number shut down. */
        if (!live_cbarg(t->bev)) {
            tracked_release(t);
            continue;
        }
        if (now_ms - t->active_ms < c->evict_idle_ms)
            return NULL; /* the rest are newer */
        if (!t->in_request && evbuffer_get_length(bufferevent_get_input(t->bev)) == 0 &&
            evbuffer_get_length(bufferevent_get_output(t->bev)) == 0)
            return t;
    }
    return NULL;
}

/* Ends the connection as a client closing it would: evhttp reads the end of
 * input, frees the connection through its usual path and reports the close.
 * Its place counts as taken until then. */
static void evict(struct http_conn_cap *c, struct tracked_conn *t)
{
    int fd = bufferevent_getfd(t->bev);
    if (fd >= 0)
        (void)shutdown(fd, SHUT_RDWR);
    list_unlink(c, t);
    t->evicting = true;
    c->evicting++;
    c->evicted++;
}

static void log_full(struct http_conn_cap *c, int64_t *last_ms, const char *action)
{
    if (log_throttle(last_ms, clock_mono_ms())) {
        LOG_WARN("http_connections_full",
                 "server=%s open=%d limit=%d action=%s refused_total=%llu evicted_total=%llu",
                 c->name, c->open, c->max, action, (unsigned long long)c->refused,
                 (unsigned long long)c->evicted);
    }
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
    log_full(c, &c->refuse_logged_ms, "refuse");
    evhttp_connection_free(evcon);
}

/* Counts a connection in t (allocated by the caller, so that running out
 * of memory is known before an idle connection is evicted for it) and
 * starts following its activity; false when that fails (the caller frees t
 * and refuses the connection). Takes over the pending reference. */
static bool track(struct http_conn_cap *c, struct tracked_conn *t, struct evhttp_connection *evcon,
                  struct bufferevent *bev)
{
    t->cap = c;
    t->bev = bev;
    t->active_ms = clock_mono_ms();
    t->in_cb = evbuffer_add_cb(bufferevent_get_input(bev), activity_cb, t);
    t->out_cb = evbuffer_add_cb(bufferevent_get_output(bev), activity_cb, t);
    if (!t->in_cb || !t->out_cb) {
        if (t->in_cb)
            evbuffer_remove_cb_entry(bufferevent_get_input(bev), t->in_cb);
        if (t->out_cb)
            evbuffer_remove_cb_entry(bufferevent_get_output(bev), t->out_cb);
        return false;
    }
    list_append(c, t);
    c->open++;
    evhttp_connection_set_closecb(evcon, connection_closed, t);
    return true;
}

/* Runs after the accept pass that created the pending bufferevents: by then
 * evhttp has made each one's connection its callback argument, or freed it
 * (bufferevent_free clears the callbacks). */
static void settle_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct http_conn_cap *c = arg;
    int64_t now_ms = clock_mono_ms();
    for (size_t i = 0; i < c->npending; i++) {
        struct bufferevent *bev = c->pending[i];
        struct evhttp_connection *evcon = live_cbarg(bev);
        int sock = bufferevent_getfd(bev);
        bool kept = false;
        if (evcon && sock >= 0 && evhttp_connection_get_bufferevent(evcon) == bev) {
            struct tracked_conn *t = thaw_calloc(1, sizeof(*t));
            struct tracked_conn *victim = NULL;
            if (t && c->open - c->evicting >= c->max && (victim = idle_victim(c, now_ms)) != NULL) {
                evict(c, victim);
                log_full(c, &c->evict_logged_ms, "evict");
            }
            if (t && c->open - c->evicting < c->max)
                kept = track(c, t, evcon, bev);
            if (!kept) {
                thaw_free(t);
                refuse(c, evcon, sock);
            }
        }
        if (!kept)
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
                                        int max_connections, int64_t evict_idle_ms,
                                        const char *name)
{
    struct http_conn_cap *c = thaw_calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->max = max_connections > 0 ? max_connections : 1;
    c->evict_idle_ms = evict_idle_ms > 0 ? evict_idle_ms : 0;
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
    /* evhttp_free reported every connection it freed; none is left unless
     * the owner freed the cap first, against the contract: then each live
     * connection forgets its close callback before its entry goes. */
    while (c->oldest) {
        struct evhttp_connection *evcon = live_cbarg(c->oldest->bev);
        if (evcon)
            evhttp_connection_set_closecb(evcon, NULL, NULL);
        tracked_release(c->oldest);
    }
    thaw_free(c->pending);
    event_free(c->settle);
    thaw_free(c);
}

int http_conn_cap_open(const struct http_conn_cap *c) { return c->open; }

uint64_t http_conn_cap_refused(const struct http_conn_cap *c) { return c->refused; }

uint64_t http_conn_cap_evicted(const struct http_conn_cap *c) { return c->evicted; }

/* One sample family; its help is lead + what + tail. */
static void write_family(struct evbuffer *out, const char *prefix, const char *suffix,
                         const char *type, const char *lead, const char *what, const char *tail,
                         double value)
{
    char name[128], help[256];
    snprintf(name, sizeof(name), "%s_%s", prefix, suffix);
    snprintf(help, sizeof(help), "%s%s%s", lead, what, tail);
    expo_family(out, name, type, help);
    expo_sample(out, name, NULL, value);
}

void http_conn_cap_write_metrics(const struct http_conn_cap *c, struct evbuffer *out,
                                 const char *prefix, const char *what)
{
    write_family(out, prefix, "connections", "gauge", "Open connections to the ", what, " port.",
                 (double)c->open);
    write_family(out, prefix, "connections_refused_total", "counter", "Connections to the ", what,
                 " port answered 503 and closed because the connection limit was reached.",
                 (double)c->refused);
    write_family(out, prefix, "connections_evicted_total", "counter",
                 "Idle connections to the ", what,
                 " port closed to make room for a new one because the connection limit was "
                 "reached.",
                 (double)c->evicted);
}
