#include "backend.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/util.h>

#include "alloc.h"
#include "balance.h"
#include "clock.h"
#include "conn.h"
#include "log.h"
#include "probe.h"

#define FILE_POLL_MS 250

enum source_kind { SRC_STATIC, SRC_DNS, SRC_FILE };

struct pooled {
    struct pooled *prev, *next;
    struct conn *c;
    struct endpoint *ep;
};

struct endpoint {
    struct balance_ep bal;
    struct backend *b;
    struct endpoint *next; /* in b->retired when retired */
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char label[64];
    struct pooled *idle; /* most recently used first */
    size_t nidle;
    struct probe *probe;
    struct event *probe_timer;
    long probe_interval_ms;
    int probe_last_failure; /* result of the last failed probe, 0 after a success */
    uint64_t requests;
    bool keep; /* merge marker */
    /* merge: 1 created by this merge, 2 taken back from b->retired, 0 neither */
    unsigned char merge_origin;
};

struct dns_job;

/* One of the plain lookups that confirm a failure (confirm_failure). */
struct dns_confirm {
    struct dns_job *job;
    struct evdns_request *req; /* NULL once its callback ran */
    int result;
};

struct dns_job {
    struct backend *b; /* NULL once the backend gave up on it */
    struct evdns_getaddrinfo_request *req;
    /* A lookup that failed is asked again as A and AAAA (confirm_failure): the
     * only way to tell "no such address" from a failure in libevent 2.1. */
    struct dns_confirm confirm[2];
    int confirm_pending;
    int64_t started_ms;
};

struct backend {
    struct event_base *base;
    struct evdns_base *dns;
    struct backend_callbacks cbs;
    void *ud;

    enum source_kind kind;
    char *source;    /* URL or file path, to detect changes */
    char *host;      /* URL host */
    int port;
    char host_header[300];
    char *health_path;
    long probe_initial_ms, probe_max_ms, probe_timeout_ms;
    long dns_refresh_ms;
    long dns_refresh_waking_ms;
    unsigned cap;      /* maxConcurrencyPerEndpoint (0: none) */
    bool split;        /* the cap is shared by `peers` activators */
    bool stopped;      /* backend_stop: no lookups or polls until reconfigured */
    unsigned peers;    /* live activators, this one included, in BALANCE_PEER_UNITs */
    long upstream_idle_ms;
    size_t max_idle;

    struct endpoint **eps;
    struct balance_ep **balv; /* parallel to eps, for balance_pick */
    size_t neps;
    struct endpoint *retired;
    size_t rr;
    bool probing;

    struct event *refresh_timer; /* DNS refresh or file poll */
    struct dns_job *dns_job;
    int dns_last_result; /* of the last lookup, logged when it changes (0: addresses) */
    struct stat file_st;
    bool file_seen;

    struct backend_stats stats;
};

/* ---- endpoints ---- */

static void format_label(const struct sockaddr *sa, char *out, size_t outlen)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)(const void *)sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof(ip));
        snprintf(out, outlen, "[%s]:%d", ip, ntohs(s6->sin6_port));
    } else {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)(const void *)sa;
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof(ip));
        snprintf(out, outlen, "%s:%d", ip, ntohs(s4->sin_port));
    }
}

static bool same_addr(const struct sockaddr_storage *a, const struct sockaddr *b)
{
    if (a->ss_family != b->sa_family)
        return false;
    if (b->sa_family == AF_INET) {
        const struct sockaddr_in *x = (const struct sockaddr_in *)(const void *)a;
        const struct sockaddr_in *y = (const struct sockaddr_in *)(const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    const struct sockaddr_in6 *x = (const struct sockaddr_in6 *)(const void *)a;
    const struct sockaddr_in6 *y = (const struct sockaddr_in6 *)(const void *)b;
    return x->sin6_port == y->sin6_port &&
           memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) == 0;
}

static void pool_remove(struct pooled *p)
{
    struct endpoint *ep = p->ep;
    if (p->prev)
        p->prev->next = p->next;
    else
        ep->idle = p->next;
    if (p->next)
        p->next->prev = p->prev;
    ep->nidle--;
    ep->b->stats.idle_conns--;
}

static void pool_close(struct pooled *p)
{
    pool_remove(p);
    conn_free(p->c);
    thaw_free(p);
}

static void pool_clear(struct endpoint *ep)
{
    while (ep->idle)
        pool_close(ep->idle);
}

/* An idle connection spoke or closed: either way it is no longer usable. */
static void pool_read_cb(struct conn *c, void *arg)
{
    (void)c;
    pool_close(arg);
}

static void pool_event_cb(struct conn *c, int what, int err, void *arg)
{
    (void)c;
    (void)what;
    (void)err;
    pool_close(arg);
}

static void probe_fire(struct endpoint *ep);

static void probe_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    probe_fire(arg);
}

static void probe_done(void *ud, int result)
{
    struct endpoint *ep = ud;
    struct backend *b = ep->b;
    ep->probe = NULL;
    b->stats.probes++;
    if (result >= 200 && result < 300) {
        ep->probe_last_failure = 0;
        LOG_DEBUG("probe_ok", "endpoint=%s status=%d", ep->label, result);
        if (!ep->bal.healthy) {
            ep->bal.healthy = true;
            b->stats.healthy++;
            LOG_INFO("endpoint_healthy", "endpoint=%s", ep->label);
            if (b->cbs.on_healthy)
                b->cbs.on_healthy(b->ud);
        }
        return;
    }
    b->stats.probe_failures++;
    /* Refused connects are the normal state of a loading replica: debug. A
     * /health too slow for probeTimeoutMs, or answering something unusable,
     * is a misbehaving server: said once, until the reason changes. */
    bool odd = result == -ETIMEDOUT || result == -EPROTO || result == 101;
    if (odd && result != ep->probe_last_failure)
        LOG_WARN("probe_failed", "endpoint=%s result=%d reason=\"%s\" timeout_ms=%ld", ep->label,
                 result, probe_strerror(result), b->probe_timeout_ms);
    else
        LOG_DEBUG("probe_failed", "endpoint=%s result=%d reason=\"%s\" next_ms=%ld", ep->label,
                  result, probe_strerror(result), ep->probe_interval_ms);
    ep->probe_last_failure = result;
    if (!b->probing || ep->bal.removed)
        return;
    struct timeval tv = {ep->probe_interval_ms / 1000, (ep->probe_interval_ms % 1000) * 1000};
    event_add(ep->probe_timer, &tv);
    ep->probe_interval_ms *= 2;
    if (ep->probe_interval_ms > b->probe_max_ms)
        ep->probe_interval_ms = b->probe_max_ms;
}

static void probe_fire(struct endpoint *ep)
{
    struct backend *b = ep->b;
    if (ep->probe || ep->bal.healthy || ep->bal.removed || !b->probing)
        return;
    ep->probe = probe_start(b->base, (const struct sockaddr *)&ep->addr, ep->addrlen,
                            endpoint_host_header(ep), b->health_path, b->probe_timeout_ms,
                            probe_done, ep);
    if (!ep->probe) {
        /* Out of sockets or memory: try again later rather than never. */
        struct timeval tv = {b->probe_max_ms / 1000, (b->probe_max_ms % 1000) * 1000};
        event_add(ep->probe_timer, &tv);
    }
}

static void probe_restart(struct endpoint *ep)
{
    ep->probe_interval_ms = ep->b->probe_initial_ms;
    if (ep->probe)
        return;
    evtimer_del(ep->probe_timer);
    probe_fire(ep);
}

static void endpoint_free(struct endpoint *ep)
{
    pool_clear(ep);
    probe_cancel(ep->probe);
    if (ep->probe_timer)
        event_free(ep->probe_timer);
    thaw_free(ep);
}

static struct endpoint *endpoint_new(struct backend *b, const struct sockaddr *sa, socklen_t len)
{
    struct endpoint *ep = thaw_calloc(1, sizeof(*ep));
    if (!ep)
        return NULL;
    ep->b = b;
    memcpy(&ep->addr, sa, len);
    ep->addrlen = len;
    format_label(sa, ep->label, sizeof(ep->label));
    ep->probe_interval_ms = b->probe_initial_ms;
    ep->probe_timer = evtimer_new(b->base, probe_timer_cb, ep);
    if (!ep->probe_timer) {
        thaw_free(ep);
        return NULL;
    }
    return ep;
}

static size_t count_healthy(const struct backend *b)
{
    size_t n = 0;
    for (size_t i = 0; i < b->neps; i++)
        n += b->eps[i]->bal.healthy;
    return n;
}

/* Takes ep out of service; it is freed now or when its last request ends. */
static void retire(struct backend *b, struct endpoint *ep)
{
    LOG_INFO("endpoint_removed", "endpoint=%s outstanding=%u", ep->label, ep->bal.outstanding);
    ep->bal.removed = true;
    pool_clear(ep);
    probe_cancel(ep->probe);
    ep->probe = NULL;
    evtimer_del(ep->probe_timer);
    if (ep->bal.outstanding == 0) {
        endpoint_free(ep);
        return;
    }
    ep->next = b->retired;
    b->retired = ep;
}

/* Replaces the endpoint list with addrs, keeping endpoints that stay. */
static int merge(struct backend *b, const struct sockaddr_storage *addrs, const socklen_t *lens,
                 size_t n)
{
    struct endpoint **eps = thaw_calloc(n ? n : 1, sizeof(*eps));
    struct balance_ep **balv = thaw_calloc(n ? n : 1, sizeof(*balv));
    if (!eps || !balv) {
        thaw_free(eps);
        thaw_free(balv);
        return -1;
    }
    size_t healthy_before = count_healthy(b);
    for (size_t i = 0; i < b->neps; i++)
        b->eps[i]->keep = false;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        struct endpoint *found = NULL;
        for (size_t k = 0; k < b->neps && !found; k++) {
            if (!b->eps[k]->keep && same_addr(&b->eps[k]->addr, (const struct sockaddr *)&addrs[i]))
                found = b->eps[k];
        }
        for (size_t k = 0; k < m && !found; k++) {
            if (same_addr(&eps[k]->addr, (const struct sockaddr *)&addrs[i]))
                found = eps[k]; /* duplicate in the new list */
        }
        if (found) {
            if (!found->keep) {
                found->keep = true;
                found->merge_origin = 0;
                eps[m++] = found;
            }
            continue;
        }
        /* Listed again while its requests from before still run: the same
         * endpoint, so they count against maxConcurrencyPerEndpoint. */
        struct endpoint *ep = NULL;
        for (struct endpoint **pp = &b->retired; *pp; pp = &(*pp)->next) {
            if (same_addr(&(*pp)->addr, (const struct sockaddr *)&addrs[i])) {
                ep = *pp;
                *pp = ep->next;
                ep->next = NULL;
                ep->bal.removed = false;
                ep->bal.healthy = false; /* probed again below */
                ep->merge_origin = 2;
                break;
            }
        }
        if (!ep && (ep = endpoint_new(b, (const struct sockaddr *)&addrs[i], lens[i])))
            ep->merge_origin = 1;
        if (!ep) {
            /* Out of memory: the list stays as it was. */
            for (size_t k = 0; k < m; k++) {
                if (eps[k]->merge_origin == 1) {
                    endpoint_free(eps[k]);
                } else if (eps[k]->merge_origin == 2) {
                    eps[k]->bal.removed = true;
                    eps[k]->next = b->retired;
                    b->retired = eps[k];
                }
            }
            thaw_free(eps);
            thaw_free(balv);
            return -1;
        }
        ep->keep = true;
        LOG_INFO("endpoint_added", "endpoint=%s", ep->label);
        eps[m++] = ep;
    }
    for (size_t i = 0; i < b->neps; i++) {
        if (!b->eps[i]->keep)
            retire(b, b->eps[i]);
    }
    thaw_free(b->eps);
    thaw_free(b->balv);
    b->eps = eps;
    b->balv = balv;
    b->neps = m;
    for (size_t i = 0; i < m; i++)
        balv[i] = &eps[i]->bal;
    b->stats.endpoints = m;
    b->stats.healthy = count_healthy(b);
    b->stats.list_updates++;
    for (size_t i = 0; i < m; i++) {
        if (!eps[i]->bal.healthy)
            probe_fire(eps[i]);
    }
    if (healthy_before > 0 && b->stats.healthy == 0 && b->cbs.on_down)
        b->cbs.on_down(b->ud, m > 0 ? BACKEND_DOWN_REPLACED : BACKEND_DOWN_LIST);
    return 0;
}

/* ---- sources ---- */

static void read_file(struct backend *b, bool force)
{
    struct stat st;
    if (stat(b->source, &st) < 0) {
        if (b->file_seen || force) {
            LOG_WARN("endpoints_file_missing", "path=%s err=\"%s\"", b->source, strerror(errno));
            b->file_seen = false;
            merge(b, NULL, NULL, 0);
        }
        return;
    }
    if (!force && b->file_seen && st.st_mtim.tv_sec == b->file_st.st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == b->file_st.st_mtim.tv_nsec && st.st_size == b->file_st.st_size &&
        st.st_ino == b->file_st.st_ino)
        return;
    if (!S_ISREG(st.st_mode)) {
        /* A directory reads as empty: the list would go with no word. */
        bool warned = b->file_seen && !S_ISREG(b->file_st.st_mode) &&
                      st.st_ino == b->file_st.st_ino;
        if (!warned)
            LOG_WARN("endpoints_file_invalid", "path=%s err=\"not a regular file\"", b->source);
        b->file_st = st;
        b->file_seen = true;
        return;
    }
    FILE *f = fopen(b->source, "rb");
    if (!f)
        return;
    char buf[65536];
    size_t len = fread(buf, 1, sizeof(buf), f);
    bool too_big = len == sizeof(buf);
    bool failed = ferror(f) != 0;
    fclose(f);
    b->file_st = st;
    b->file_seen = true;
    if (failed) {
        LOG_WARN("endpoints_file_invalid", "path=%s err=\"read failed\"", b->source);
        return;
    }
    if (too_big) {
        LOG_WARN("endpoints_file_invalid", "path=%s err=\"larger than 64 KiB\"", b->source);
        return;
    }
    struct balance_addr *addrs = NULL;
    char err[128];
    long n = balance_parse_endpoints(buf, len, &addrs, err, sizeof(err));
    if (n < 0) {
        /* Keep serving the old list rather than dropping every endpoint. */
        LOG_WARN("endpoints_file_invalid", "path=%s err=\"%s\"", b->source, err);
        return;
    }
    struct sockaddr_storage *ss = thaw_calloc((size_t)n + 1, sizeof(*ss));
    socklen_t *lens = thaw_calloc((size_t)n + 1, sizeof(*lens));
    size_t m = 0;
    if (ss && lens) {
        for (long i = 0; i < n; i++) {
            if (balance_sockaddr(addrs[i].host, addrs[i].port, &ss[m], &lens[m]) == 0)
                m++;
        }
        if (merge(b, ss, lens, m) == 0)
            LOG_INFO("endpoints_file_loaded", "path=%s endpoints=%zu", b->source, m);
    }
    thaw_free(ss);
    thaw_free(lens);
    thaw_free(addrs);
}

static void schedule_refresh(struct backend *b, long ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(b->refresh_timer, &tv);
}

/* A waking model with nothing healthy waits for a new replica, which a
 * headless Service lists only once it is ready: every refresh period is then
 * added to the cold start, so the name is re-resolved faster until something
 * is healthy. */
static long dns_refresh_period(const struct backend *b)
{
    if (b->probing && count_healthy(b) == 0 && b->dns_refresh_waking_ms < b->dns_refresh_ms)
        return b->dns_refresh_waking_ms;
    return b->dns_refresh_ms;
}

static void dns_done(struct backend *b, int result, struct evutil_addrinfo *res);

/* A failed lookup is confirmed (confirm_failure) only if it failed within
 * this long: one that got no answer fails after about 3 s (three sends, 1 s
 * apart: proxy.c's DNS_RETRY_TIMEOUT). */
#define DNS_CONFIRM_WITHIN_MS 2000

static void confirm_cb(int result, char type, int count, int ttl, void *addrs, void *arg)
{
    (void)type;
    (void)count;
    (void)ttl;
    (void)addrs;
    struct dns_confirm *c = arg;
    struct dns_job *job = c->job;
    c->req = NULL; /* libevent frees it after this callback */
    c->result = result;
    if (--job->confirm_pending > 0)
        return;
    struct backend *b = job->b;
    bool none = true;
    for (int i = 0; i < 2; i++)
        none = none && (job->confirm[i].result == DNS_ERR_NODATA ||
                        job->confirm[i].result == DNS_ERR_NOTEXIST);
    thaw_free(job);
    if (!b)
        return;
    b->dns_job = NULL;
    /* Both types answered, neither with an address (NOERROR without one,
     * or NXDOMAIN): the name lists nothing, as a headless Service with no
     * ready pod under a server that does not say NXDOMAIN. Anything else,
     * a timeout or SERVFAIL among them, stays a failure. */
    dns_done(b, none ? EVUTIL_EAI_NODATA : EVUTIL_EAI_FAIL, NULL);
}

/* libevent 2.1's getaddrinfo reports a NOERROR answer without addresses
 * (DNS_ERR_NODATA) as EVUTIL_EAI_FAIL, like a SERVFAIL or a timeout; the
 * plain A and AAAA lookups (same search list) say which it was. Returns
 * false when neither could be sent (one not sent keeps DNS_ERR_UNKNOWN: the
 * other finishes into a failure). Their callbacks never run before this
 * returns (libevent defers them). */
static bool confirm_failure(struct backend *b, struct dns_job *job)
{
    struct evdns_request *(*const resolve_type[2])(struct evdns_base *, const char *, int,
                                                   evdns_callback_type, void *) = {
        evdns_base_resolve_ipv4, evdns_base_resolve_ipv6};
    job->confirm_pending = 0;
    for (int i = 0; i < 2; i++) {
        struct dns_confirm *c = &job->confirm[i];
        c->job = job;
        c->result = DNS_ERR_UNKNOWN;
        c->req = resolve_type[i](b->dns, b->host, 0, confirm_cb, c);
        if (c->req)
            job->confirm_pending++;
    }
    return job->confirm_pending > 0;
}

static void dns_cb(int result, struct evutil_addrinfo *res, void *arg)
{
    struct dns_job *job = arg;
    struct backend *b = job->b;
    job->req = NULL;
    /* A lookup that failed slowly timed out: asking again would only wait
     * as long again before the next refresh. An answer without addresses
     * comes as fast as any answer. */
    if (b && result == EVUTIL_EAI_FAIL && !res &&
        clock_mono_ms() - job->started_ms < DNS_CONFIRM_WITHIN_MS && confirm_failure(b, job))
        return; /* b->dns_job stays this job until confirm_cb */
    thaw_free(job);
    if (!b) {
        if (res)
            evutil_freeaddrinfo(res);
        return;
    }
    b->dns_job = NULL;
    dns_done(b, result, res);
}

static void dns_done(struct backend *b, int result, struct evutil_addrinfo *res)
{
    bool changed = result != b->dns_last_result;
    b->dns_last_result = result;
    if (result == EVUTIL_EAI_NONAME || result == EVUTIL_EAI_NODATA) {
        /* The name is not there (NXDOMAIN), or lists no address (NOERROR
         * without one, confirmed by confirm_failure): the model has no
         * replica, as with an empty endpoints file; its old addresses may
         * be another pod's by now. */
        if (changed)
            LOG_INFO("dns_no_addresses", "host=%s err=\"%s\"", b->host,
                     evutil_gai_strerror(result));
        merge(b, NULL, NULL, 0);
    } else if (result != 0) {
        /* Keep the last good list: a resolver hiccup (SERVFAIL, a timeout,
         * a truncated answer) must not empty it. Logged once a reason. */
        if (changed)
            LOG_WARN("dns_failed", "host=%s err=\"%s\" kept_last_good=true", b->host,
                     evutil_gai_strerror(result));
    } else {
        size_t n = 0;
        for (struct evutil_addrinfo *a = res; a; a = a->ai_next)
            n++;
        struct sockaddr_storage *ss = thaw_calloc(n + 1, sizeof(*ss));
        socklen_t *lens = thaw_calloc(n + 1, sizeof(*lens));
        size_t m = 0;
        if (ss && lens) {
            for (struct evutil_addrinfo *a = res; a; a = a->ai_next) {
                if ((a->ai_family != AF_INET && a->ai_family != AF_INET6) ||
                    a->ai_addrlen > sizeof(ss[m]))
                    continue;
                memcpy(&ss[m], a->ai_addr, a->ai_addrlen);
                lens[m++] = (socklen_t)a->ai_addrlen;
            }
            merge(b, ss, lens, m);
        }
        thaw_free(ss);
        thaw_free(lens);
    }
    if (res)
        evutil_freeaddrinfo(res);
    schedule_refresh(b, dns_refresh_period(b));
}

static void resolve(struct backend *b)
{
    if (b->dns_job || !b->dns)
        return;
    struct dns_job *job = thaw_calloc(1, sizeof(*job));
    if (!job) {
        schedule_refresh(b, dns_refresh_period(b));
        return;
    }
    job->b = b;
    job->started_ms = clock_mono_ms();
    b->dns_job = job;
    struct evutil_addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char port[8];
    snprintf(port, sizeof(port), "%d", b->port);
    struct evdns_getaddrinfo_request *req =
        evdns_getaddrinfo(b->dns, b->host, port, &hints, dns_cb, job);
    /* The callback may already have run (answers from /etc/hosts), freeing
     * job; only keep the handle if it is still ours. */
    if (req && b->dns_job == job)
        job->req = req;
}

static void refresh_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct backend *b = arg;
    if (b->kind == SRC_FILE) {
        read_file(b, false);
        schedule_refresh(b, FILE_POLL_MS);
    } else if (b->kind == SRC_DNS) {
        resolve(b);
    }
}

static void stop_source(struct backend *b)
{
    if (b->refresh_timer)
        evtimer_del(b->refresh_timer);
    if (b->dns_job) {
        struct dns_job *job = b->dns_job;
        b->dns_job = NULL;
        job->b = NULL;
        if (job->req)
            evdns_getaddrinfo_cancel(job->req); /* dns_cb runs on a later loop turn, frees job */
        for (int i = 0; i < 2; i++)
            if (job->confirm[i].req) /* confirm_cb runs for each, the last frees job */
                evdns_cancel_request(b->dns, job->confirm[i].req);
    }
}

void backend_stop(struct backend *b)
{
    stop_source(b);
    backend_probe_stop(b);
    b->stopped = true;
}

static int apply_settings(struct backend *b, const struct model_config *mc,
                          const struct limits_config *lim)
{
    char *hp = thaw_strdup(mc->health_path);
    if (!hp)
        return -1;
    thaw_free(b->health_path);
    b->health_path = hp;
    b->probe_initial_ms = mc->probe_initial_ms;
    b->probe_max_ms = mc->probe_max_ms;
    b->probe_timeout_ms = mc->probe_timeout_ms;
    b->dns_refresh_ms = mc->dns_refresh_ms;
    b->dns_refresh_waking_ms = mc->dns_refresh_waking_ms;
    b->cap = (unsigned)mc->max_concurrency_per_endpoint;
    b->split = mc->split_concurrency != 0;
    b->upstream_idle_ms = lim->upstream_idle_ms;
    b->max_idle = (size_t)lim->max_idle_per_endpoint;
    return 0;
}

static int start_source(struct backend *b, const struct model_config *mc)
{
    const char *src = mc->backend ? mc->backend : mc->endpoints_file;
    char *copy = thaw_strdup(src);
    char *host = mc->backend ? thaw_strdup(mc->backend_host) : NULL;
    if (!copy || (mc->backend && !host)) {
        thaw_free(copy);
        thaw_free(host);
        return -1;
    }
    thaw_free(b->source);
    thaw_free(b->host);
    b->source = copy;
    b->host = host;
    b->file_seen = false;
    if (!mc->backend) {
        b->kind = SRC_FILE;
        b->host_header[0] = '\0';
        read_file(b, true);
        schedule_refresh(b, FILE_POLL_MS);
        return 0;
    }
    b->port = mc->backend_port;
    bool v6 = strchr(host, ':') != NULL;
    snprintf(b->host_header, sizeof(b->host_header), v6 ? "[%s]:%d" : "%s:%d", host, b->port);
    struct sockaddr_storage ss;
    socklen_t len;
    if (balance_sockaddr(host, b->port, &ss, &len) == 0) {
        b->kind = SRC_STATIC;
        return merge(b, &ss, &len, 1);
    }
    /* The list in use stays until the name's first answer replaces it: a
     * ready model whose backend moves to a name (its Service, often the
     * same replicas) must not go cold and wake for the lookup's sake. */
    b->kind = SRC_DNS;
    if (!b->dns) {
        LOG_ERROR("dns_unavailable", "host=%s", host);
        return -1;
    }
    resolve(b);
    return 0;
}

struct backend *backend_new(struct event_base *base, struct evdns_base *dns,
                            const struct model_config *mc, const struct limits_config *lim,
                            const struct backend_callbacks *cbs, void *ud)
{
    struct backend *b = thaw_calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->base = base;
    b->dns = dns;
    b->cbs = *cbs;
    b->ud = ud;
    b->peers = BALANCE_PEER_UNIT;
    b->refresh_timer = evtimer_new(base, refresh_cb, b);
    if (!b->refresh_timer || apply_settings(b, mc, lim) < 0 || start_source(b, mc) < 0) {
        backend_free(b);
        return NULL;
    }
    return b;
}

void backend_free(struct backend *b)
{
    if (!b)
        return;
    stop_source(b);
    if (b->refresh_timer)
        event_free(b->refresh_timer);
    for (size_t i = 0; i < b->neps; i++)
        endpoint_free(b->eps[i]);
    while (b->retired) {
        struct endpoint *ep = b->retired;
        b->retired = ep->next;
        endpoint_free(ep);
    }
    thaw_free(b->eps);
    thaw_free(b->balv);
    thaw_free(b->source);
    thaw_free(b->host);
    thaw_free(b->health_path);
    thaw_free(b);
}

int backend_reconfigure(struct backend *b, struct evdns_base *dns, const struct model_config *mc,
                        const struct limits_config *lim)
{
    if (apply_settings(b, mc, lim) < 0)
        return -1;
    /* A reload may be the first to need names: the resolver is the proxy's
     * current one, not what it was when this backend was made. */
    b->dns = dns;
    const char *src = mc->backend ? mc->backend : mc->endpoints_file;
    if (!b->stopped && strcmp(src, b->source) == 0)
        return 0;
    if (!b->stopped)
        LOG_INFO("backend_changed", "from=%s to=%s", b->source, src);
    b->stopped = false;
    stop_source(b);
    if (start_source(b, mc) < 0) {
        /* Not started: the next reconfigure tries again, even with the
         * same source (it would otherwise count as unchanged). */
        b->stopped = true;
        return -1;
    }
    return 0;
}

unsigned backend_cap(const struct backend *b)
{
    return b->split ? balance_share(b->cap, b->peers) : b->cap;
}

void backend_set_peers(struct backend *b, unsigned peers_milli)
{
    b->peers = peers_milli ? peers_milli : BALANCE_PEER_UNIT;
}

unsigned backend_max_outstanding(const struct backend *b)
{
    unsigned most = 0;
    for (size_t i = 0; i < b->neps; i++) {
        if (b->eps[i]->bal.outstanding > most)
            most = b->eps[i]->bal.outstanding;
    }
    return most;
}

struct endpoint *backend_pick(struct backend *b)
{
    int i = balance_pick(b->balv, b->neps, backend_cap(b), &b->rr);
    return i < 0 ? NULL : b->eps[i];
}

size_t backend_capacity(const struct backend *b)
{
    return balance_capacity(b->balv, b->neps, backend_cap(b));
}

bool backend_any_healthy(const struct backend *b) { return count_healthy(b) > 0; }

void backend_probe_start(struct backend *b)
{
    b->probing = true;
    for (size_t i = 0; i < b->neps; i++) {
        if (!b->eps[i]->bal.healthy)
            probe_restart(b->eps[i]);
    }
    /* Waking with nothing healthy: the next resolution comes at the waking
     * period, not at whatever is left of the slow one. */
    if (b->kind == SRC_DNS && !b->dns_job && dns_refresh_period(b) < b->dns_refresh_ms)
        schedule_refresh(b, dns_refresh_period(b));
}

void backend_probe_stop(struct backend *b)
{
    b->probing = false;
    for (size_t i = 0; i < b->neps; i++) {
        struct endpoint *ep = b->eps[i];
        probe_cancel(ep->probe);
        ep->probe = NULL;
        evtimer_del(ep->probe_timer);
    }
}

void backend_get_stats(const struct backend *b, struct backend_stats *out) { *out = b->stats; }

json_t *backend_to_json(const struct backend *b)
{
    json_t *arr = json_array();
    if (!arr)
        return NULL;
    for (size_t i = 0; i < b->neps; i++) {
        const struct endpoint *ep = b->eps[i];
        json_t *o = json_pack("{s:s,s:b,s:i,s:I,s:i}", "address", ep->label, "healthy",
                              ep->bal.healthy, "outstanding", (int)ep->bal.outstanding,
                              "requests", (json_int_t)ep->requests, "idleConnections",
                              (int)ep->nidle);
        if (!o || json_array_append_new(arr, o) < 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

void backend_each_endpoint(const struct backend *b,
                           void (*fn)(void *ud, const char *label, unsigned outstanding,
                                      bool healthy, uint64_t requests),
                           void *ud)
{
    for (size_t i = 0; i < b->neps; i++) {
        const struct endpoint *ep = b->eps[i];
        fn(ud, ep->label, ep->bal.outstanding, ep->bal.healthy, ep->requests);
    }
}

void endpoint_acquire(struct endpoint *ep)
{
    ep->bal.outstanding++;
    ep->requests++;
}

void endpoint_release(struct endpoint *ep)
{
    if (ep->bal.outstanding > 0)
        ep->bal.outstanding--;
    if (ep->bal.removed && ep->bal.outstanding == 0) {
        struct backend *b = ep->b;
        for (struct endpoint **pp = &b->retired; *pp; pp = &(*pp)->next) {
            if (*pp == ep) {
                *pp = ep->next;
                break;
            }
        }
        endpoint_free(ep);
    }
}

void endpoint_mark_down(struct endpoint *ep)
{
    struct backend *b = ep->b;
    if (ep->bal.removed)
        return;
    pool_clear(ep); /* its other connections are as dead */
    if (!ep->bal.healthy) {
        if (b->probing && !ep->probe && !evtimer_pending(ep->probe_timer, NULL))
            probe_restart(ep);
        return;
    }
    ep->bal.healthy = false;
    b->stats.healthy--;
    LOG_WARN("endpoint_down", "endpoint=%s", ep->label);
    if (b->probing)
        probe_restart(ep);
    if (b->stats.healthy == 0 && b->cbs.on_down)
        b->cbs.on_down(b->ud, BACKEND_DOWN_REQUEST);
}

struct conn *endpoint_pool_take(struct endpoint *ep)
{
    struct pooled *p = ep->idle;
    if (!p)
        return NULL;
    pool_remove(p);
    struct conn *c = p->c;
    thaw_free(p);
    conn_setcb(c, NULL, NULL, NULL, NULL);
    conn_set_timeout(c, 0);
    return c;
}

void endpoint_pool_give(struct endpoint *ep, struct conn *c)
{
    struct backend *b = ep->b;
    struct pooled *p = NULL;
    if (ep->bal.removed || !ep->bal.healthy || ep->nidle >= b->max_idle ||
        evbuffer_get_length(conn_input(c)) > 0 || evbuffer_get_length(conn_output(c)) > 0 ||
        !(p = thaw_calloc(1, sizeof(*p)))) {
        conn_free(c);
        return;
    }
    p->c = c;
    p->ep = ep;
    p->next = ep->idle;
    if (ep->idle)
        ep->idle->prev = p;
    ep->idle = p;
    ep->nidle++;
    b->stats.idle_conns++;
    /* Still reading: a close or stray bytes from the backend retire it. */
    conn_setcb(c, pool_read_cb, NULL, pool_event_cb, p);
    conn_set_timeout(c, b->upstream_idle_ms);
    conn_enable_read(c);
}

const struct sockaddr *endpoint_addr(const struct endpoint *ep, socklen_t *len)
{
    *len = ep->addrlen;
    return (const struct sockaddr *)&ep->addr;
}

const char *endpoint_label(const struct endpoint *ep) { return ep->label; }

const char *endpoint_host_header(const struct endpoint *ep)
{
    return ep->b->host_header[0] ? ep->b->host_header : ep->label;
}
