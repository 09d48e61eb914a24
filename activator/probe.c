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
    /* One-shot, armed at the start: the whole probe (connect, interim
     * responses, final head) must fit in timeout_ms. A bufferevent timeout
     * alone restarts on every byte, so a /health trickling its answer would
     * keep one probe (and the endpoint's only probe slot) open for hours. */
    struct event *deadline;
    struct http1_scan scan;
    size_t interim_bytes; /* heads of 1xx responses skipped so far */
    probe_cb cb;
    void *ud;
};

const char *probe_strerror(int result)
{
    if (result >= 200 && result < 300)
        return "healthy";
    if (result == 101)
        return "unexpected 101 Switching Protocols";
    if (result > 0)
        return "not a 2xx status";
    switch (-result) {
    case ETIMEDOUT:
        return "probe deadline exceeded (probeTimeoutMs)";
    case EPROTO:
        return "invalid response";
    case ENOMEM:
        return "out of memory";
    case ECONNREFUSED:
        return "connection refused";
    case ECONNRESET:
        return "connection closed before a response";
    default:
        return "connection failed";
    }
}

static void finish(struct probe *p, int result)
{
    probe_cb cb = p->cb;
    void *ud = p->ud;
    probe_cancel(p);
    cb(ud, result);
}

/* Returns the result once the final response head is in, or 0 for more. */
static int read_head(struct probe *p, struct evbuffer *in, struct http1_response *r)
{
    for (;;) {
        size_t len = evbuffer_get_length(in);
        if (len == 0)
            return 0;
        /* One budget for every head of the answer, interim ones included:
         * a /health sending 1xx after 1xx is refused once they add up to
         * PROBE_HEAD_MAX, like one oversized head. */
        size_t room = PROBE_HEAD_MAX - p->interim_bytes;
        size_t n = len < room + 16 ? len : room + 16;
        const char *buf = (const char *)evbuffer_pullup(in, (ssize_t)n);
        if (!buf)
            return -ENOMEM;
        const struct http1_limits lim = {room, HTTP1_MAX_HEADERS};
        ssize_t rc = http1_parse_response(&p->scan, buf, n, &lim, false, r);
        if (rc == HTTP1_INCOMPLETE)
            return 0;
        if (rc < 0)
            return -EPROTO;
        /* RFC 9110 15.2: a client must accept interim responses before the
         * final one (100 Continue, 103 Early Hints, ...). 101 is not one: it
         * would switch protocols on a GET we never asked to upgrade. */
        if (r->status >= 200 || r->status == 101)
            return r->status;
        if (evbuffer_drain(in, (size_t)rc) < 0)
            return -EIO;
        p->interim_bytes += (size_t)rc;
        http1_scan_init(&p->scan);
    }
}

static void read_cb(struct bufferevent *bev, void *arg)
{
    struct probe *p = arg;
    struct http1_response *r = thaw_malloc(sizeof(*r));
    if (!r) {
        finish(p, -ENOMEM);
        return;
    }
    int result = read_head(p, bufferevent_get_input(bev), r);
    thaw_free(r);
    if (result != 0)
        finish(p, result);
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    struct probe *p = arg;
    if (what & BEV_EVENT_CONNECTED)
        return;
    int err = EVUTIL_SOCKET_ERROR();
    if (what & BEV_EVENT_EOF)
        err = ECONNRESET;
    finish(p, -(err ? err : ECONNREFUSED));
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    finish(arg, -ETIMEDOUT);
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
    p->deadline = evtimer_new(base, deadline_cb, p);
    p->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!p->deadline || !p->bev)
        goto fail;
    /* Callbacks are set only after connecting: a local failure inside
     * bufferevent_socket_connect runs the event callback at once, which
     * would free the probe under us. Refusals arrive later, from the loop.
     * No bufferevent timeouts: the deadline bounds connect and answer both,
     * and an idle timeout of the same length could never fire first. */
    if (evbuffer_add_printf(bufferevent_get_output(p->bev),
                            "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: thaw-activator\r\n"
                            "Connection: close\r\n\r\n",
                            path, host) < 0 ||
        bufferevent_socket_connect(p->bev, (struct sockaddr *)(void *)sa, (int)salen) < 0)
        goto fail;
    bufferevent_setcb(p->bev, read_cb, NULL, event_cb, p);
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    if (bufferevent_enable(p->bev, EV_READ | EV_WRITE) < 0 || evtimer_add(p->deadline, &tv) < 0)
        goto fail;
    return p;
fail:
    probe_cancel(p);
    return NULL;
}

void probe_cancel(struct probe *p)
{
    if (!p)
        return;
    if (p->bev)
        bufferevent_free(p->bev);
    if (p->deadline)
        event_free(p->deadline);
    thaw_free(p);
}
