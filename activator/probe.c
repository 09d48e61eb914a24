#include "probe.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "alloc.h"
#include "http1.h"

struct probe {
    struct bufferevent *bev;
    struct http1_scan scan;
    probe_cb cb;
    void *ud;
};

static void finish(struct probe *p, int result)
{
    probe_cb cb = p->cb;
    void *ud = p->ud;
    probe_cancel(p);
    cb(ud, result);
}

static void read_cb(struct bufferevent *bev, void *arg)
{
    struct probe *p = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t len = evbuffer_get_length(in);
    if (len > 16384) {
        finish(p, -EPROTO);
        return;
    }
    const char *buf = (const char *)evbuffer_pullup(in, -1);
    struct http1_response *r = thaw_malloc(sizeof(*r));
    if (!r) {
        finish(p, -ENOMEM);
        return;
    }
    static const struct http1_limits lim = {16384, HTTP1_MAX_HEADERS};
    ssize_t n = http1_parse_response(&p->scan, buf, len, &lim, false, r);
    int status = r->status;
    thaw_free(r);
    if (n == HTTP1_INCOMPLETE)
        return;
    finish(p, n < 0 ? -EPROTO : status);
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    struct probe *p = arg;
    if (what & BEV_EVENT_CONNECTED)
        return;
    if (what & BEV_EVENT_TIMEOUT) {
        finish(p, -ETIMEDOUT);
        return;
    }
    int err = EVUTIL_SOCKET_ERROR();
    if (what & BEV_EVENT_EOF)
        err = ECONNRESET;
    finish(p, -(err ? err : ECONNREFUSED));
}

struct probe *probe_start(struct event_base *base, const struct sockaddr *sa, socklen_t salen,
                          const char *host, const char *path, long timeout_ms, probe_cb cb,
                          void *ud)
{
    struct probe *p = thaw_calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->cb = cb;
    p->ud = ud;
    http1_scan_init(&p->scan);
    p->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!p->bev) {
        thaw_free(p);
        return NULL;
    }
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    bufferevent_set_timeouts(p->bev, &tv, &tv);
    /* Callbacks are set only after connecting: a local failure inside
     * bufferevent_socket_connect runs the event callback at once, which
     * would free the probe under us. Refusals arrive later, from the loop. */
    if (evbuffer_add_printf(bufferevent_get_output(p->bev),
                            "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: thaw-activator\r\n"
                            "Connection: close\r\n\r\n",
                            path, host) < 0 ||
        bufferevent_socket_connect(p->bev, (struct sockaddr *)(void *)sa, (int)salen) < 0) {
        bufferevent_free(p->bev);
        thaw_free(p);
        return NULL;
    }
    bufferevent_setcb(p->bev, read_cb, NULL, event_cb, p);
    if (bufferevent_enable(p->bev, EV_READ | EV_WRITE) < 0) {
        bufferevent_free(p->bev);
        thaw_free(p);
        return NULL;
    }
    return p;
}

void probe_cancel(struct probe *p)
{
    if (!p)
        return;
    bufferevent_free(p->bev);
    thaw_free(p);
}
