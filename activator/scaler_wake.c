#include "scaler_wake.h"

#include <arpa/inet.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/bufferevent.h>
#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/util.h>

#include "alloc.h"
#include "balance.h"
#include "config.h"
#include "log.h"
#include "model_name.h"

/* A model name (at most MODEL_NAME_MAX bytes, common/model_name.h) once
 * percent-encoded. */
#define MAX_ENCODED (3 * MODEL_NAME_MAX + 1)

struct post {
    struct scaler_wake *sw;
    struct bufferevent *bev;
    struct event *deadline; /* timeout_ms from the start, whatever trickles in */
    struct post *prev, *next;
    char addr[64];
};

struct resolve {
    struct scaler_wake *sw; /* NULL once the owner is gone */
    struct evdns_getaddrinfo_request *req;
    struct resolve *prev, *next;
    char *request; /* the whole HTTP request, sent to every address */
};

struct scaler_wake {
    struct event_base *base;
    struct evdns_base *dns;
    char host[256];
    int port;
    bool host_is_ip;
    struct sockaddr_storage ip; /* host_is_ip: the one address, parsed once */
    socklen_t ip_len;
    char instance[3 * MODEL_NAME_MAX + 1]; /* percent-encoded */
    long timeout_ms;
    struct post *posts;
    struct resolve *resolves;
    size_t nposts, nresolves;
    struct scaler_wake_stats stats;
};

int scaler_wake_url_needs_dns(const char *url)
{
    char host[256];
    int port;
    struct sockaddr_storage ss;
    socklen_t len;
    if (config_parse_backend_url(url, host, sizeof(host), &port) < 0)
        return 0;
    return balance_sockaddr(host, port, &ss, &len) < 0;
}

static int encode(const char *s, char *out, size_t outlen);

struct scaler_wake *scaler_wake_new(struct event_base *base, struct evdns_base *dns,
                                    const char *url, const char *instance, long timeout_ms,
                                    char *err, size_t errlen)
{
    struct scaler_wake *sw = thaw_calloc(1, sizeof(*sw));
    if (!sw) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (config_parse_backend_url(url, sw->host, sizeof(sw->host), &sw->port) < 0) {
        snprintf(err, errlen, "expected http://HOST[:PORT] without a path, got '%s'", url);
        thaw_free(sw);
        return NULL;
    }
    if (!model_name_valid(instance, strlen(instance)) ||
        encode(instance, sw->instance, sizeof(sw->instance)) < 0) {
        snprintf(err, errlen, "instance id: 1-%d bytes without control characters",
                 MODEL_NAME_MAX);
        thaw_free(sw);
        return NULL;
    }
    sw->host_is_ip = balance_sockaddr(sw->host, sw->port, &sw->ip, &sw->ip_len) == 0;
    if (!sw->host_is_ip && !dns) {
        snprintf(err, errlen, "no DNS resolver for host '%s'", sw->host);
        thaw_free(sw);
        return NULL;
    }
    sw->base = base;
    sw->dns = dns;
    sw->timeout_ms = timeout_ms;
    return sw;
}

static void post_free(struct post *p)
{
    struct scaler_wake *sw = p->sw;
    if (p->prev)
        p->prev->next = p->next;
    else
        sw->posts = p->next;
    if (p->next)
        p->next->prev = p->prev;
    sw->nposts--;
    if (p->deadline)
        event_free(p->deadline);
    bufferevent_free(p->bev);
    thaw_free(p);
}

static void post_done(struct post *p, bool ok, const char *why)
{
    if (ok) {
        p->sw->stats.sent++;
    } else {
        p->sw->stats.failed++;
        LOG_WARN("scaler_wake_failed", "addr=%s reason=%s", p->addr, why);
    }
    post_free(p);
}

static void post_read_cb(struct bufferevent *bev, void *arg)
{
    struct post *p = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    struct evbuffer_ptr eol = evbuffer_search_eol(in, NULL, NULL, EVBUFFER_EOL_CRLF);
    if (eol.pos < 0) {
        if (evbuffer_get_length(in) > 1024)
            post_done(p, false, "status_line_too_long");
        return;
    }
    /* "HTTP/1.1 204 No Content": only the first 12 bytes matter. */
    char line[16] = "";
    size_t n = (size_t)eol.pos < sizeof(line) - 1 ? (size_t)eol.pos : sizeof(line) - 1;
    if (evbuffer_copyout(in, line, n) < 0)
        n = 0;
    line[n] = '\0';
    bool ok = n >= 12 && strncmp(line, "HTTP/1.", 7) == 0 && line[9] == '2';
    char why[32];
    snprintf(why, sizeof(why), "status_%.3s", n >= 12 ? line + 9 : "bad");
    post_done(p, ok, why);
}

static void post_event_cb(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    struct post *p = arg;
    if (what & BEV_EVENT_CONNECTED)
        return;
    post_done(p, false, (what & BEV_EVENT_TIMEOUT) ? "timeout" : "connect_or_io_error");
}

/* The bufferevent's timeouts restart with every byte: a peer sending one
 * byte at a time would keep a post (and its slot of the 256) for minutes. */
static void post_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    post_done(arg, false, "timeout");
}

static void format_addr(const struct sockaddr *sa, char *out, size_t outlen)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        evutil_inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
        port = ntohs(in->sin_port);
        snprintf(out, outlen, "%s:%d", ip, port);
    } else {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        evutil_inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
        port = ntohs(in6->sin6_port);
        snprintf(out, outlen, "[%s]:%d", ip, port);
    }
}

static void post_start(struct scaler_wake *sw, const struct sockaddr *sa, int salen,
                       const char *request)
{
    if (sw->nposts >= SCALER_WAKE_MAX_INFLIGHT) {
        sw->stats.dropped++;
        return;
    }
    struct post *p = thaw_calloc(1, sizeof(*p));
    if (!p) {
        sw->stats.dropped++;
        return;
    }
    p->sw = sw;
    format_addr(sa, p->addr, sizeof(p->addr));
    p->bev = bufferevent_socket_new(sw->base, -1, BEV_OPT_CLOSE_ON_FREE);
    p->deadline = evtimer_new(sw->base, post_deadline_cb, p);
    if (!p->bev || !p->deadline) {
        if (p->bev)
            bufferevent_free(p->bev);
        if (p->deadline)
            event_free(p->deadline);
        thaw_free(p);
        sw->stats.dropped++;
        return;
    }
    p->next = sw->posts;
    if (sw->posts)
        sw->posts->prev = p;
    sw->posts = p;
    sw->nposts++;
    struct timeval tv = {sw->timeout_ms / 1000, (sw->timeout_ms % 1000) * 1000};
    bufferevent_setcb(p->bev, post_read_cb, NULL, post_event_cb, p);
    if (evtimer_add(p->deadline, &tv) != 0 ||
        bufferevent_write(p->bev, request, strlen(request)) != 0 ||
        bufferevent_enable(p->bev, EV_READ | EV_WRITE) != 0) {
        post_done(p, false, "setup");
        return;
    }
    /* -1: socket() or connect() failed at once (no callback is made, libevent
     * 2.1.9 on); a refusal reported later comes through post_event_cb, and a
     * connect that never completes meets the deadline. */
    if (bufferevent_socket_connect(p->bev, sa, salen) < 0)
        post_done(p, false, "connect_failed");
}

static void resolve_free(struct resolve *r)
{
    struct scaler_wake *sw = r->sw;
    if (sw) {
        if (r->prev)
            r->prev->next = r->next;
        else
            sw->resolves = r->next;
        if (r->next)
            r->next->prev = r->prev;
        sw->nresolves--;
    }
    thaw_free(r->request);
    thaw_free(r);
}

static void resolved_cb(int result, struct evutil_addrinfo *res, void *arg)
{
    struct resolve *r = arg;
    struct scaler_wake *sw = r->sw;
    if (sw && result != 0) {
        sw->stats.unresolved++;
        LOG_WARN("scaler_wake_unresolved", "host=%s err=\"%s\"", sw->host,
                 evutil_gai_strerror(result));
    }
    if (sw && result == 0) {
        for (struct evutil_addrinfo *ai = res; ai; ai = ai->ai_next) {
            if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
                continue;
            /* One post per scaler: an answer may list an address twice. */
            bool seen = false;
            for (struct evutil_addrinfo *e = res; e != ai && !seen; e = e->ai_next)
                seen = e->ai_addrlen == ai->ai_addrlen &&
                       memcmp(e->ai_addr, ai->ai_addr, ai->ai_addrlen) == 0;
            if (!seen)
                post_start(sw, ai->ai_addr, (int)ai->ai_addrlen, r->request);
        }
    }
    if (res)
        evutil_freeaddrinfo(res);
    resolve_free(r);
}

/* Percent-encodes everything but unreserved characters (RFC 3986). */
static int encode(const char *s, char *out, size_t outlen)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        bool plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                     (*p >= '0' && *p <= '9') || *p == '-' || *p == '.' || *p == '_' || *p == '~';
        if (o + (plain ? 1 : 3) >= outlen)
            return -1;
        if (plain) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    out[o] = '\0';
    return 0;
}

int scaler_wake_send(struct scaler_wake *sw, const char *model, size_t held)
{
    char enc[MAX_ENCODED];
    if (encode(model, enc, sizeof(enc)) < 0) {
        sw->stats.dropped++;
        return -1;
    }
    char request[2 * MAX_ENCODED + 400];
    snprintf(request, sizeof(request),
             "POST /wake?model=%s&instance=%s&held=%zu HTTP/1.1\r\nHost: %s:%d\r\n"
             "Content-Length: 0\r\nConnection: close\r\nUser-Agent: thaw-activator\r\n\r\n",
             enc, sw->instance, held > 9999999 ? (size_t)9999999 : held, sw->host, sw->port);
    if (sw->host_is_ip) {
        size_t before = sw->stats.dropped;
        post_start(sw, (struct sockaddr *)&sw->ip, (int)sw->ip_len, request);
        return sw->stats.dropped == before ? 0 : -1;
    }
    if (sw->nresolves >= SCALER_WAKE_MAX_INFLIGHT) {
        sw->stats.dropped++;
        return -1;
    }
    struct resolve *r = thaw_calloc(1, sizeof(*r));
    if (!r || !(r->request = thaw_strdup(request))) {
        thaw_free(r);
        sw->stats.dropped++;
        return -1;
    }
    r->sw = sw;
    r->next = sw->resolves;
    if (sw->resolves)
        sw->resolves->prev = r;
    sw->resolves = r;
    sw->nresolves++;
    struct evutil_addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    char port[8];
    snprintf(port, sizeof(port), "%d", sw->port);
    struct evdns_getaddrinfo_request *req =
        evdns_getaddrinfo(sw->dns, sw->host, port, &hints, resolved_cb, r);
    /* NULL: answered (and r freed) already, or failed at once (r freed by
     * the callback too). Either way r must not be touched. */
    if (req)
        r->req = req;
    return 0;
}

void scaler_wake_cancel(struct scaler_wake *sw)
{
    if (!sw)
        return;
    while (sw->resolves) {
        struct resolve *r = sw->resolves;
        sw->resolves = r->next;
        sw->nresolves--;
        r->sw = NULL;
        r->prev = r->next = NULL;
        /* The callback runs on a later loop turn (libevent defers it) with
         * EVUTIL_EAI_CANCEL and frees r; r->sw is NULL so it touches nothing
         * else. */
        evdns_getaddrinfo_cancel(r->req);
    }
    while (sw->posts)
        post_free(sw->posts);
}

void scaler_wake_free(struct scaler_wake *sw)
{
    if (!sw)
        return;
    scaler_wake_cancel(sw);
    thaw_free(sw);
}

void scaler_wake_get_stats(const struct scaler_wake *sw, struct scaler_wake_stats *out)
{
    if (!sw) {
        memset(out, 0, sizeof(*out));
        return;
    }
    *out = sw->stats;
}
