#include "prom_source.h"

#include <curl/curl.h>
#include <errno.h>
#include <event2/event.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "log.h"

/* ------------------------------------------------------------------------ */
/* Parser: pure, no I/O.                                                    */
/* ------------------------------------------------------------------------ */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int rc = vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    if (rc < 0) {
        err[0] = '\0';
        return;
    }
    /* Reasons end up in logfmt lines; Prometheus error texts can hold newlines. */
    for (char *p = err; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = ' ';
    }
}

void prom_samples_free(struct prom_sample *samples, size_t n)
{
    if (!samples)
        return;
    for (size_t i = 0; i < n; i++)
        thaw_free(samples[i].label_value);
    thaw_free(samples);
}

/* Fills "errorType: error" from a Prometheus error envelope. */
static void describe_error_envelope(const json_t *root, char *out, size_t outlen)
{
    const char *type = json_string_value(json_object_get(root, "errorType"));
    const char *text = json_string_value(json_object_get(root, "error"));
    set_err(out, outlen, "%s: %s", type ? type : "unknown", text ? text : "(no error text)");
}

/* A sample is [<unix time number>, "<float as string>"]. Returns 0 or -1
 * with *why pointing at a static reason. */
static int parse_sample_pair(const json_t *pair, double *out, bool *invalid, const char **why)
{
    if (!json_is_array(pair) || json_array_size(pair) != 2) {
        *why = "not a [time, \"value\"] pair";
        return -1;
    }
    if (!json_is_number(json_array_get(pair, 0))) {
        *why = "sample time is not a number";
        return -1;
    }
    const json_t *sv = json_array_get(pair, 1);
    if (!json_is_string(sv)) {
        *why = "sample value is not a string";
        return -1;
    }
    const char *s = json_string_value(sv);
    size_t slen = json_string_length(sv);
    /* strtod would skip leading spaces and accept an empty prefix; Prometheus
     * never sends either, so they mean the body is not what we think. */
    if (slen == 0 || s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r')) {
        *why = "sample value is not a number";
        return -1;
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end != s + slen) {
        *why = "sample value is not a number";
        return -1;
    }
    /* NaN, +Inf, -Inf and overflow (ERANGE gives HUGE_VAL), and a negative
     * rate, carry no usable load figure: flagged, and 0 as the header says. */
    *invalid = !isfinite(v) || v < 0;
    *out = *invalid ? 0.0 : v;
    return 0;
}

static int parse_vector(const json_t *result, const char *label, struct prom_sample **out,
                        size_t *n, char *err, size_t errlen)
{
    if (!json_is_array(result)) {
        set_err(err, errlen, "data.result is not an array");
        return -1;
    }
    size_t total = json_array_size(result);
    if (total == 0)
        return 0;
    /* One allocation sized for the worst case: series without the label only
     * leave slots unused. */
    struct prom_sample *samples = thaw_calloc(total, sizeof(*samples));
    if (!samples) {
        set_err(err, errlen, "out of memory");
        return -1;
    }
    size_t k = 0, unlabelled = 0;
    for (size_t i = 0; i < total; i++) {
        const json_t *item = json_array_get(result, i);
        if (!json_is_object(item)) {
            set_err(err, errlen, "data.result[%zu] is not an object", i);
            goto fail;
        }
        const json_t *metric = json_object_get(item, "metric");
        if (!json_is_object(metric)) {
            set_err(err, errlen, "data.result[%zu].metric is not an object", i);
            goto fail;
        }
        double v = 0;
        bool invalid = false;
        const char *why = NULL;
        /* Checked even for series we skip: a malformed value anywhere means
         * the answer is not the format we understand. */
        if (parse_sample_pair(json_object_get(item, "value"), &v, &invalid, &why) < 0) {
            set_err(err, errlen, "data.result[%zu].value: %s", i, why);
            goto fail;
        }
        const json_t *lv = json_object_get(metric, label);
        if (!lv) {
            /* {} at 0 is `or vector(0)`'s filler for "no series"; {} with
             * tokens is a query that summed the label away. */
            if (json_object_size(metric) > 0 || invalid || v != 0)
                unlabelled++;
            continue;
        }
        if (!json_is_string(lv)) {
            set_err(err, errlen, "data.result[%zu].metric.%s is not a string", i, label);
            goto fail;
        }
        samples[k].label_value = thaw_strdup(json_string_value(lv));
        if (!samples[k].label_value) {
            set_err(err, errlen, "out of memory");
            goto fail;
        }
        samples[k].value = v;
        samples[k].invalid = invalid;
        k++;
    }
    if (k == 0) {
        thaw_free(samples);
        if (unlabelled == 0)
            return 0;
        /* Series, none of them a model's: a relabelling or a recording rule
         * renamed the label, or the query drops it. Read as "no model has a
         * series", every busy model would go to zero once the staleness
         * limit passed, with the source reported healthy. */
        set_err(err, errlen, "%zu series, none with the label %s: the query must return one "
                "series per model, labelled %s", unlabelled, label, label);
        return -1;
    }
    *out = samples;
    *n = k;
    return 0;
fail:
    prom_samples_free(samples, k);
    return -1;
}

static int parse_root(const json_t *root, const char *label, struct prom_sample **out, size_t *n,
                      char *err, size_t errlen)
{
    if (!json_is_object(root)) {
        set_err(err, errlen, "response is not a JSON object");
        return -1;
    }
    const char *status = json_string_value(json_object_get(root, "status"));
    if (!status) {
        set_err(err, errlen, "missing status");
        return -1;
    }
    if (strcmp(status, "success") != 0) {
        if (strcmp(status, "error") == 0) {
            char why[512];
            describe_error_envelope(root, why, sizeof(why));
            set_err(err, errlen, "status error: %s", why);
        } else {
            set_err(err, errlen, "status %s", status);
        }
        return -1;
    }
    const json_t *data = json_object_get(root, "data");
    if (!json_is_object(data)) {
        set_err(err, errlen, "missing data");
        return -1;
    }
    const char *rtype = json_string_value(json_object_get(data, "resultType"));
    if (!rtype) {
        set_err(err, errlen, "missing data.resultType");
        return -1;
    }
    const json_t *result = json_object_get(data, "result");
    if (!result) {
        set_err(err, errlen, "missing data.result");
        return -1;
    }
    if (strcmp(rtype, "vector") == 0)
        return parse_vector(result, label, out, n, err, errlen);
    if (strcmp(rtype, "scalar") == 0) {
        set_err(err, errlen, "resultType scalar has no %s label: the query must return one "
                "series per model", label);
        return -1;
    }
    set_err(err, errlen, "resultType %s not supported", rtype);
    return -1;
}

/* JSON objects and arrays, and commas, in body (outside strings): jansson's
 * tree costs about 1 KB and 6 us per series, 40 bytes per bare number, and
 * 60 MB of `[{},...]` would take 4.7 GB and 23 s of the event loop (of
 * `[1,1,...]` 1.2 GB and 3.5 s), so the counts are checked before any of it
 * is built. Every value but the first of a container follows a comma. Stops
 * counting past either limit. */
struct json_shape {
    size_t containers, commas;
};

static struct json_shape count_shape(const char *body, size_t len, size_t max_containers,
                                     size_t max_commas)
{
    struct json_shape c = {0, 0};
    bool in_string = false;
    for (size_t i = 0; i < len && c.containers <= max_containers && c.commas <= max_commas;
         i++) {
        char ch = body[i];
        if (in_string) {
            if (ch == '\\')
                i++; /* the escaped byte cannot end the string */
            else if (ch == '"')
                in_string = false;
        } else if (ch == '"') {
            in_string = true;
        } else if (ch == '{' || ch == '[') {
            c.containers++;
        } else if (ch == ',') {
            c.commas++;
        }
    }
    return c;
}

int prom_parse_vector(const char *body, size_t len, const char *label, struct prom_sample **out,
                      size_t *n, char *err, size_t errlen)
{
    if (!out || !n || !label || (!body && len > 0)) {
        set_err(err, errlen, "invalid arguments");
        return -1;
    }
    *out = NULL;
    *n = 0;
    /* A series is an object, its labels one more, its value an array; the
     * envelope adds the root, data, result and a warnings list. A series
     * with k labels holds k + 2 commas: PROM_MAX_LABELS labels each. */
    size_t max_containers = 3 * (size_t)PROM_MAX_SERIES + 4;
    size_t max_commas = ((size_t)PROM_MAX_LABELS + 2) * (size_t)PROM_MAX_SERIES + 8;
    struct json_shape shape = body ? count_shape(body, len, max_containers, max_commas)
                                   : (struct json_shape){0, 0};
    if (shape.containers > max_containers || shape.commas > max_commas) {
        set_err(err, errlen, "answer holds more than %d series (or JSON values to match); "
                "aggregate the query (sum by the model label)", PROM_MAX_SERIES);
        return -1;
    }
    json_error_t jerr;
    json_t *root = json_loadb(body ? body : "", len, 0, &jerr);
    if (!root) {
        set_err(err, errlen, "invalid JSON at line %d column %d: %s", jerr.line, jerr.column,
                jerr.text);
        return -1;
    }
    int rc = parse_root(root, label, out, n, err, errlen);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* I/O: libcurl multi driven by libevent.                                   */
/* ------------------------------------------------------------------------ */

/* One per socket curl asks us to watch. Sockets curl is done with move to
 * the dead list and are freed once no libevent callback of ours is on the
 * stack, so an event is never freed while its own callback runs. */
struct prom_sock {
    struct prom_source *src;
    curl_socket_t fd;
    struct event *rd;
    struct event *wr;
    struct prom_sock *next;
};

struct prom_source {
    struct event_base *base;
    CURLM *multi;
    CURL *easy; /* reused for every query so the connection cache keeps the TCP
                   connection to Prometheus alive between intervals */
    struct event *timer;
    char *base_url; /* without trailing slashes */
    long timeout_ms;
    size_t max_body;

    struct prom_sock *socks; /* watched */
    struct prom_sock *dead;  /* waiting to be freed */

    /* The query in flight, if any. */
    int in_flight;
    char *label;
    prom_result_cb cb;
    void *ud;
    char *body;
    size_t body_len;
    size_t body_cap;
    size_t body_limit; /* max_body captured at start */
    int body_too_big;
    int body_oom;
    int watch_failed; /* a socket/timer callback could not set up its event */
    int64_t start_us;
    char curl_err[CURL_ERROR_SIZE];

    int depth;        /* our libevent callbacks on the stack */
    int free_pending; /* prom_source_free() called from inside the result callback */

    struct prom_source_stats stats;
};

static int curl_ready;

static void destroy(struct prom_source *src);

static struct prom_sock *sock_new(struct prom_source *src, curl_socket_t fd);
static void on_socket_event(evutil_socket_t fd, short what, void *arg);

static void sock_free(struct prom_sock *s)
{
    if (!s)
        return;
    if (s->rd)
        event_free(s->rd);
    if (s->wr)
        event_free(s->wr);
    thaw_free(s);
}

static void reap_dead(struct prom_source *src)
{
    while (src->dead) {
        struct prom_sock *s = src->dead;
        src->dead = s->next;
        sock_free(s);
    }
}

static void sock_retire(struct prom_source *src, struct prom_sock *s)
{
    for (struct prom_sock **pp = &src->socks; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    }
    event_del(s->rd);
    event_del(s->wr);
    s->next = src->dead;
    src->dead = s;
}

static struct prom_sock *sock_new(struct prom_source *src, curl_socket_t fd)
{
    struct prom_sock *s = thaw_calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->src = src;
    s->fd = fd;
    s->rd = event_new(src->base, fd, EV_READ | EV_PERSIST, on_socket_event, s);
    s->wr = event_new(src->base, fd, EV_WRITE | EV_PERSIST, on_socket_event, s);
    if (!s->rd || !s->wr) {
        sock_free(s);
        return NULL;
    }
    s->next = src->socks;
    src->socks = s;
    return s;
}

/* CURLMOPT_SOCKETFUNCTION: curl says which direction it waits for on fd.
 * Errors are recorded, not returned: a -1 here makes curl 7.88 mark the whole
 * multi handle dead, while the flag lets dispatch() fail just this query. */
static int curl_socket_cb(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
    struct prom_source *src = userp;
    struct prom_sock *s = socketp;
    if (what == CURL_POLL_REMOVE) {
        if (s) {
            sock_retire(src, s);
            curl_multi_assign(src->multi, fd, NULL);
        }
        return 0;
    }
    if (!s) {
        s = sock_new(src, fd);
        if (!s) {
            src->watch_failed = 1;
            return 0;
        }
        curl_multi_assign(src->multi, fd, s);
    }
    int ok = 0;
    if (what == CURL_POLL_IN || what == CURL_POLL_INOUT)
        ok |= event_add(s->rd, NULL);
    else
        ok |= event_del(s->rd);
    if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT)
        ok |= event_add(s->wr, NULL);
    else
        ok |= event_del(s->wr);
    if (ok != 0)
        src->watch_failed = 1;
    return 0;
}

/* CURLMOPT_TIMERFUNCTION: one timer for the whole multi handle. Even a 0 ms
 * timeout goes through the loop, which is what keeps the result callback out
 * of prom_source_query(). */
static int curl_timer_cb(CURLM *multi, long timeout_ms, void *userp)
{
    struct prom_source *src = userp;
    if (timeout_ms < 0) {
        evtimer_del(src->timer);
        return 0;
    }
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    if (evtimer_add(src->timer, &tv) != 0)
        src->watch_failed = 1;
    return 0;
}

static size_t curl_write_cb(char *data, size_t size, size_t nmemb, void *userp)
{
    struct prom_source *src = userp;
    size_t n = size * nmemb;
    if (n > src->body_limit - src->body_len) {
        src->body_too_big = 1;
        return 0; /* short count: curl aborts with CURLE_WRITE_ERROR */
    }
    /* +1 keeps room for a NUL so the body can be logged as text if needed. */
    if (src->body_len + n + 1 > src->body_cap) {
        size_t cap = src->body_cap ? src->body_cap : 16384;
        while (cap < src->body_len + n + 1)
            cap *= 2;
        char *nb = thaw_realloc(src->body, cap);
        if (!nb) {
            src->body_oom = 1;
            return 0;
        }
        src->body = nb;
        src->body_cap = cap;
    }
    memcpy(src->body + src->body_len, data, n);
    src->body_len += n;
    src->body[src->body_len] = '\0';
    return n;
}

/* For a non-200 answer: Prometheus sends its JSON error envelope with 400
 * (bad_data), 422 (execution) and 503 (timeout/unavailable). */
static void describe_http_error(long http, const char *body, size_t len, char *err, size_t errlen)
{
    /* An error envelope is a few hundred bytes: a big body is not one, and
     * is not worth building a tree for. */
    json_t *root = body && len <= 65536 ? json_loadb(body, len, 0, NULL) : NULL;
    if (json_is_object(root) && json_is_string(json_object_get(root, "error"))) {
        char why[512];
        describe_error_envelope(root, why, sizeof(why));
        set_err(err, errlen, "HTTP %ld: %s", http, why);
    } else {
        set_err(err, errlen, "HTTP %ld", http);
    }
    json_decref(root);
}

static void clear_request(struct prom_source *src)
{
    thaw_free(src->body);
    src->body = NULL;
    src->body_len = 0;
    src->body_cap = 0;
    thaw_free(src->label);
    src->label = NULL;
    src->cb = NULL;
    src->ud = NULL;
    src->in_flight = 0;
}

/* Ends the query in flight and runs its callback. forced_err, when set,
 * overrides whatever curl reported. Must be called with depth > 0 so a
 * prom_source_free() from the callback is deferred. */
static void complete(struct prom_source *src, CURLcode rc, const char *forced_err)
{
    long http = 0;
    long connects = 0;
    curl_easy_getinfo(src->easy, CURLINFO_RESPONSE_CODE, &http);
    if (curl_easy_getinfo(src->easy, CURLINFO_NUM_CONNECTS, &connects) == CURLE_OK && connects > 0)
        src->stats.connects += (uint64_t)connects;
    curl_multi_remove_handle(src->multi, src->easy);
    src->stats.last_duration_us = (uint64_t)(clock_mono_us() - src->start_us);

    char err[512];
    struct prom_sample *samples = NULL;
    size_t n = 0;
    int status = -1;
    if (forced_err) {
        set_err(err, sizeof(err), "%s", forced_err);
    } else if (src->body_oom) {
        set_err(err, sizeof(err), "out of memory reading response");
    } else if (src->body_too_big || rc == CURLE_FILESIZE_EXCEEDED) {
        set_err(err, sizeof(err), "response body exceeds %zu bytes", src->body_limit);
    } else if (rc == CURLE_OPERATION_TIMEDOUT) {
        set_err(err, sizeof(err), "timeout after %ld ms", src->timeout_ms);
    } else if (rc == CURLE_COULDNT_CONNECT) {
        set_err(err, sizeof(err), "connect: %s",
                src->curl_err[0] ? src->curl_err : curl_easy_strerror(rc));
    } else if (rc != CURLE_OK) {
        set_err(err, sizeof(err), "curl: %s",
                src->curl_err[0] ? src->curl_err : curl_easy_strerror(rc));
    } else if (http != 200) {
        describe_http_error(http, src->body, src->body_len, err, sizeof(err));
    } else if (prom_parse_vector(src->body, src->body_len, src->label, &samples, &n, err,
                                 sizeof(err)) == 0) {
        status = 0;
    }

    prom_result_cb cb = src->cb;
    void *ud = src->ud;
    /* Cleared before the callback so it may start the next query. */
    clear_request(src);
    if (status < 0) {
        src->stats.failures++;
        char q[600];
        LOG_DEBUG("prom_query_failed", "duration_us=%llu err=%s",
                  (unsigned long long)src->stats.last_duration_us, log_quote(q, sizeof(q), err));
        cb(ud, -1, NULL, 0, err);
    } else {
        LOG_DEBUG("prom_query_done", "duration_us=%llu samples=%zu",
                  (unsigned long long)src->stats.last_duration_us, n);
        cb(ud, 0, samples, n, NULL);
    }
    prom_samples_free(samples, n);
}

static void check_done(struct prom_source *src)
{
    CURLMsg *msg;
    int left;
    while (!src->free_pending && (msg = curl_multi_info_read(src->multi, &left))) {
        if (msg->msg == CURLMSG_DONE && msg->easy_handle == src->easy && src->in_flight)
            complete(src, msg->data.result, NULL);
    }
    /* A socket or timer we could not watch would leave the query hanging
     * until nobody knows when; fail it now instead. */
    if (src->watch_failed && src->in_flight && !src->free_pending) {
        src->watch_failed = 0;
        complete(src, CURLE_OK, "out of memory watching socket");
    }
    src->watch_failed = 0;
}

/* Every libevent callback of ours funnels through here. */
static void dispatch(struct prom_source *src, curl_socket_t fd, int ev_bitmask)
{
    src->depth++;
    int running = 0;
    CURLMcode mc = curl_multi_socket_action(src->multi, fd, ev_bitmask, &running);
    if (mc != CURLM_OK)
        LOG_WARN("prom_curl_multi_error", "err=\"%s\"", curl_multi_strerror(mc));
    check_done(src);
    src->depth--;
    if (src->depth == 0) {
        /* Our caller is a callback of an event we may be about to free; like
         * hiredis' libevent adapter we free only after the user callback has
         * returned, and libevent does not touch the event after this. */
        if (src->free_pending)
            destroy(src);
        else
            reap_dead(src);
    }
}

static void on_socket_event(evutil_socket_t fd, short what, void *arg)
{
    struct prom_sock *s = arg;
    int mask = 0;
    if (what & EV_READ)
        mask |= CURL_CSELECT_IN;
    if (what & EV_WRITE)
        mask |= CURL_CSELECT_OUT;
    dispatch(s->src, fd, mask);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    dispatch(arg, CURL_SOCKET_TIMEOUT, 0);
}

static int setup_easy(struct prom_source *src)
{
    CURL *e = src->easy;
    int bad = 0;
    bad |= curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L) != CURLE_OK;
    bad |= curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, src->timeout_ms) != CURLE_OK;
    bad |= curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, src->timeout_ms) != CURLE_OK;
    bad |= curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK;
    bad |= curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L) != CURLE_OK;
    bad |= curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L) != CURLE_OK;
    bad |= curl_easy_setopt(e, CURLOPT_USERAGENT, "thaw-scaler") != CURLE_OK;
    bad |= curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, curl_write_cb) != CURLE_OK;
    bad |= curl_easy_setopt(e, CURLOPT_WRITEDATA, src) != CURLE_OK;
    bad |= curl_easy_setopt(e, CURLOPT_ERRORBUFFER, src->curl_err) != CURLE_OK;
    bad |= curl_easy_setopt(e, CURLOPT_PRIVATE, src) != CURLE_OK;
    return bad ? -1 : 0;
}

/* Accepts http:// and https:// URLs with a host; anything else is a
 * configuration mistake better caught at startup. */
static int check_url(const char *url, char *err, size_t errlen)
{
    CURLU *u = curl_url();
    if (!u) {
        set_err(err, errlen, "out of memory");
        return -1;
    }
    int rc = -1;
    char *scheme = NULL;
    char *host = NULL;
    CURLUcode uc = curl_url_set(u, CURLUPART_URL, url, 0);
    if (uc != CURLUE_OK) {
        set_err(err, errlen, "bad Prometheus URL: %s", curl_url_strerror(uc));
        goto out;
    }
    if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0)) {
        set_err(err, errlen, "bad Prometheus URL: scheme must be http or https");
        goto out;
    }
    if (curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK || !host[0]) {
        set_err(err, errlen, "bad Prometheus URL: no host");
        goto out;
    }
    rc = 0;
out:
    curl_free(scheme);
    curl_free(host);
    curl_url_cleanup(u);
    return rc;
}

struct prom_source *prom_source_new(struct event_base *base, const char *base_url,
                                    long timeout_ms, char *err, size_t errlen)
{
    if (!base || !base_url) {
        set_err(err, errlen, "invalid arguments");
        return NULL;
    }
    if (timeout_ms <= 0) {
        set_err(err, errlen, "timeout must be positive, got %ld ms", timeout_ms);
        return NULL;
    }
    /* Single-threaded process: a plain flag is enough to init once. */
    if (!curl_ready) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
            set_err(err, errlen, "curl_global_init failed");
            return NULL;
        }
        curl_ready = 1;
    }
    if (check_url(base_url, err, errlen) < 0)
        return NULL;

    struct prom_source *src = thaw_calloc(1, sizeof(*src));
    if (!src) {
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    src->base = base;
    src->timeout_ms = timeout_ms;
    src->max_body = PROM_SOURCE_MAX_BODY;
    size_t len = strlen(base_url);
    while (len > 0 && base_url[len - 1] == '/')
        len--;
    src->base_url = thaw_strndup(base_url, len);
    if (!src->base_url) {
        set_err(err, errlen, "out of memory");
        goto fail;
    }
    src->timer = evtimer_new(base, on_timer, src);
    src->multi = curl_multi_init();
    src->easy = curl_easy_init();
    if (!src->timer || !src->multi || !src->easy) {
        set_err(err, errlen, "out of memory");
        goto fail;
    }
    if (curl_multi_setopt(src->multi, CURLMOPT_SOCKETFUNCTION, curl_socket_cb) != CURLM_OK ||
        curl_multi_setopt(src->multi, CURLMOPT_SOCKETDATA, src) != CURLM_OK ||
        curl_multi_setopt(src->multi, CURLMOPT_TIMERFUNCTION, curl_timer_cb) != CURLM_OK ||
        curl_multi_setopt(src->multi, CURLMOPT_TIMERDATA, src) != CURLM_OK ||
        setup_easy(src) < 0) {
        set_err(err, errlen, "curl setup failed");
        goto fail;
    }
    return src;
fail:
    destroy(src);
    return NULL;
}

static void destroy(struct prom_source *src)
{
    if (src->multi && src->easy)
        curl_multi_remove_handle(src->multi, src->easy);
    /* Cleanup closes cached connections and may still call our socket and
     * timer callbacks, so the events outlive it. */
    if (src->multi)
        curl_multi_cleanup(src->multi);
    if (src->easy)
        curl_easy_cleanup(src->easy);
    while (src->socks) {
        struct prom_sock *s = src->socks;
        src->socks = s->next;
        sock_free(s);
    }
    reap_dead(src);
    if (src->timer)
        event_free(src->timer);
    thaw_free(src->body);
    thaw_free(src->label);
    thaw_free(src->base_url);
    thaw_free(src);
}

void prom_source_free(struct prom_source *src)
{
    if (!src)
        return;
    if (src->depth > 0) {
        /* Called from the result callback: drop any query that callback
         * started, without its callback, and free once dispatch() unwinds. */
        if (src->in_flight) {
            curl_multi_remove_handle(src->multi, src->easy);
            clear_request(src);
        }
        src->free_pending = 1;
        return;
    }
    destroy(src);
}

int prom_source_query(struct prom_source *src, const char *promql, const char *label,
                      prom_result_cb cb, void *ud)
{
    if (!src || !promql || !label || !cb || src->free_pending)
        return -1;
    if (src->in_flight)
        return -1;

    char *escaped = curl_easy_escape(src->easy, promql, 0);
    if (!escaped)
        return -1;
    static const char path[] = "/api/v1/query?query=";
    size_t ulen = strlen(src->base_url) + sizeof(path) + strlen(escaped);
    char *url = thaw_malloc(ulen);
    if (!url) {
        curl_free(escaped);
        return -1;
    }
    snprintf(url, ulen, "%s%s%s", src->base_url, path, escaped);
    curl_free(escaped);
    CURLcode cc = curl_easy_setopt(src->easy, CURLOPT_URL, url); /* curl copies it */
    thaw_free(url);
    if (cc != CURLE_OK)
        return -1;
    cc = curl_easy_setopt(src->easy, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)src->max_body);
    if (cc != CURLE_OK)
        return -1;

    src->label = thaw_strdup(label);
    if (!src->label)
        return -1;
    src->cb = cb;
    src->ud = ud;
    src->body_limit = src->max_body;
    src->body_too_big = 0;
    src->body_oom = 0;
    src->watch_failed = 0;
    src->curl_err[0] = '\0';
    src->in_flight = 1;
    src->start_us = clock_mono_us();
    CURLMcode mc = curl_multi_add_handle(src->multi, src->easy);
    if (mc != CURLM_OK || src->watch_failed) {
        if (mc == CURLM_OK)
            curl_multi_remove_handle(src->multi, src->easy);
        LOG_WARN("prom_query_start_failed", "err=\"%s\"",
                 mc != CURLM_OK ? curl_multi_strerror(mc) : "cannot watch timer");
        clear_request(src);
        return -1;
    }
    src->stats.queries++;
    return 0;
}

void prom_source_get_stats(const struct prom_source *src, struct prom_source_stats *out)
{
    if (!out)
        return;
    if (!src) {
        memset(out, 0, sizeof(*out));
        return;
    }
    *out = src->stats;
}

void prom_source_set_max_body(struct prom_source *src, size_t max_bytes)
{
    if (src)
        src->max_body = max_bytes ? max_bytes : PROM_SOURCE_MAX_BODY;
}
