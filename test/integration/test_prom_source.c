/* Integration test: prom_source against a real prometheus started here on a
 * free loopback port in a temp dir, plus two fake peers (a listener that
 * accepts and never answers, and a closed port). Everything runs on one
 * libevent loop with deadlines; prometheus is killed and the temp dir removed
 * on every exit path we control (and PR_SET_PDEATHSIG covers the rest). */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc.h"
#include "clock.h"
#include "peer_proc.h"
#include "prom_source.h"

/* ---------------------------------------------------------------- prometheus */

static const char *prom_bin = "/usr/bin/prometheus";
static char tmpdir[256];
static volatile pid_t prom_pid = -1;
static int prom_port;

static void stop_prometheus(void)
{
    peer_stop(&prom_pid, SIGTERM, 10000);
}

static void remove_tmpdir(void)
{
    peer_remove_dir(tmpdir);
}

static void cleanup(void)
{
    stop_prometheus();
    remove_tmpdir();
}

static void on_fatal_signal(int sig)
{
    /* Only async-signal-safe calls here; the temp dir may be left behind. */
    pid_t pid = prom_pid;
    if (pid > 0)
        kill(pid, SIGKILL);
    static const char msg[] = "test_prom_source: fatal signal or global deadline, prometheus killed\n";
    ssize_t w = write(2, msg, sizeof(msg) - 1);
    (void)w;
    _exit(1);
}

static void dump_prom_log(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/prometheus.log", tmpdir);
    peer_dump_log(path);
}

/* Blocking probe is fine here: it runs before/after the loop work. */
static int prom_ready(int port)
{
    CURL *c = curl_easy_init();
    if (!c)
        return 0;
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/-/ready", port);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 1000L);
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    long code = 0;
    int ok = curl_easy_perform(c) == CURLE_OK &&
             curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code == 200;
    curl_easy_cleanup(c);
    return ok;
}

/* Starts prometheus on `port` and waits for /-/ready. Returns 0, or -1 if it
 * exited (e.g. the port was taken) or did not get ready within 40 s. */
static int start_prometheus(int port)
{
    char cfg[300], data[300], listen[64], logpath[300];
    snprintf(cfg, sizeof(cfg), "%s/prometheus.yml", tmpdir);
    snprintf(data, sizeof(data), "%s/data", tmpdir);
    snprintf(logpath, sizeof(logpath), "%s/prometheus.log", tmpdir);
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    FILE *f = fopen(cfg, "w");
    if (!f)
        return -1;
    /* No scrape jobs: every query below is built from vector() alone. */
    fputs("global:\n  scrape_interval: 1h\n  evaluation_interval: 1h\n", f);
    fclose(f);

    char a_cfg[320], a_data[320], a_listen[96];
    snprintf(a_cfg, sizeof(a_cfg), "--config.file=%s", cfg);
    snprintf(a_data, sizeof(a_data), "--storage.tsdb.path=%s", data);
    snprintf(a_listen, sizeof(a_listen), "--web.listen-address=%s", listen);

    char *const argv[] = {"prometheus", a_cfg, a_data, a_listen, "--log.level=warn", NULL};
    pid_t pid = peer_spawn(logpath, prom_bin, argv);
    if (pid < 0)
        return -1;
    prom_pid = pid;
    int64_t deadline = clock_mono_ms() + 40000;
    while (clock_mono_ms() < deadline) {
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            prom_pid = -1;
            dump_prom_log();
            return -1;
        }
        if (prom_ready(port))
            return 0;
        usleep(100000);
    }
    stop_prometheus();
    dump_prom_log();
    return -1;
}

/* ---------------------------------------------------------------- loop helpers */

struct result {
    int calls;
    int status;
    size_t n;
    struct {
        char label[64];
        double value;
    } s[16];
    char err[512];
    int64_t at_ms;
    /* Optional actions from inside the callback. */
    struct prom_source *free_me;
    struct prom_source *chain_src;
    const char *chain_query;
    struct result *chain_result;
    int chain_rc;
};

static void on_result(void *ud, int status, const struct prom_sample *samples, size_t n,
                      const char *err)
{
    struct result *r = ud;
    r->calls++;
    r->status = status;
    r->n = n;
    r->at_ms = clock_mono_ms();
    for (size_t i = 0; i < n && i < 16; i++) {
        snprintf(r->s[i].label, sizeof(r->s[i].label), "%s", samples[i].label_value);
        r->s[i].value = samples[i].value;
    }
    snprintf(r->err, sizeof(r->err), "%s", err ? err : "");
    if ((status == 0) != (err == NULL) || (status != 0 && (samples || n)))
        snprintf(r->err, sizeof(r->err), "callback contract broken");
    if (r->chain_src)
        r->chain_rc = prom_source_query(r->chain_src, r->chain_query, "model_name", on_result,
                                        r->chain_result);
    if (r->free_me)
        prom_source_free(r->free_me);
}

static void on_tick(evutil_socket_t fd, short what, void *arg) {}

/* Runs the loop until *flag becomes nonzero or max_ms pass. Returns *flag. */
static int run_until(struct event_base *base, const int *flag, int64_t max_ms)
{
    struct event *tick = event_new(base, -1, EV_PERSIST, on_tick, NULL);
    struct timeval tv = {0, 10000};
    event_add(tick, &tv);
    int64_t deadline = clock_mono_ms() + max_ms;
    while (!*flag && clock_mono_ms() < deadline)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(tick);
    return *flag;
}

static double sample_of(const struct result *r, const char *label, int *found)
{
    for (size_t i = 0; i < r->n && i < 16; i++) {
        if (strcmp(r->s[i].label, label) == 0) {
            *found = 1;
            return r->s[i].value;
        }
    }
    *found = 0;
    return 0;
}

/* Runs one query to completion; returns the callback count (1 expected). */
static int query_sync(struct event_base *base, struct prom_source *src, const char *q,
                      struct result *r, int64_t max_ms)
{
    memset(r, 0, sizeof(*r));
    if (prom_source_query(src, q, "model_name", on_result, r) != 0) {
        snprintf(r->err, sizeof(r->err), "prom_source_query refused");
        r->status = -2;
        return 0;
    }
    run_until(base, &r->calls, max_ms);
    return r->calls;
}

/* ---------------------------------------------------------------- fake peers */

/* Accepts connections and holds them open without ever answering. */
struct silent_server {
    int lfd;
    int port;
    struct event *ev;
    int conns[16];
    int nconns;
};

static void silent_accept(evutil_socket_t fd, short what, void *arg)
{
    struct silent_server *s = arg;
    int c = accept(fd, NULL, NULL);
    if (c < 0)
        return;
    if (s->nconns < 16)
        s->conns[s->nconns++] = c;
    else
        close(c);
}

static int silent_start(struct event_base *base, struct silent_server *s)
{
    memset(s, 0, sizeof(*s));
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(s->lfd, 16) != 0 || getsockname(s->lfd, (struct sockaddr *)&sa, &len) != 0)
        return -1;
    s->port = ntohs(sa.sin_port);
    s->ev = event_new(base, s->lfd, EV_READ | EV_PERSIST, silent_accept, s);
    return s->ev && event_add(s->ev, NULL) == 0 ? 0 : -1;
}

static void silent_stop(struct silent_server *s)
{
    if (s->ev)
        event_free(s->ev);
    for (int i = 0; i < s->nconns; i++)
        close(s->conns[i]);
    if (s->lfd >= 0)
        close(s->lfd);
}

/* Answers every connection with one fixed HTTP response once the request
 * headers are in, then closes: for answers Prometheus would not give. */
struct canned_conn {
    int fd;
    struct event *ev;
    char buf[4096];
    size_t len;
    struct canned_server *srv;
};

struct canned_server {
    int lfd;
    int port;
    struct event *ev;
    const char *response;
    struct canned_conn conns[8];
    int nconns;
    struct event_base *base;
};

static void canned_read(evutil_socket_t fd, short what, void *arg)
{
    struct canned_conn *c = arg;
    ssize_t r = read(fd, c->buf + c->len, sizeof(c->buf) - 1 - c->len);
    if (r > 0) {
        c->len += (size_t)r;
        c->buf[c->len] = '\0';
    }
    if (r > 0 && !strstr(c->buf, "\r\n\r\n") && c->len < sizeof(c->buf) - 1) {
        event_add(c->ev, NULL);
        return;
    }
    if (r > 0) {
        const char *resp = c->srv->response;
        size_t left = strlen(resp);
        while (left > 0) {
            ssize_t w = write(fd, resp, left);
            if (w <= 0)
                break;
            resp += w;
            left -= (size_t)w;
        }
    }
    close(fd);
    c->fd = -1;
}

static void canned_accept(evutil_socket_t fd, short what, void *arg)
{
    struct canned_server *s = arg;
    int c = accept(fd, NULL, NULL);
    if (c < 0)
        return;
    if (s->nconns >= 8) {
        close(c);
        return;
    }
    struct canned_conn *cc = &s->conns[s->nconns++];
    cc->fd = c;
    cc->srv = s;
    cc->ev = event_new(s->base, c, EV_READ, canned_read, cc);
    if (cc->ev)
        event_add(cc->ev, NULL);
}

static int canned_start(struct event_base *base, struct canned_server *s, const char *response)
{
    memset(s, 0, sizeof(*s));
    s->base = base;
    s->response = response;
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(s->lfd, 16) != 0 || getsockname(s->lfd, (struct sockaddr *)&sa, &len) != 0)
        return -1;
    s->port = ntohs(sa.sin_port);
    s->ev = event_new(base, s->lfd, EV_READ | EV_PERSIST, canned_accept, s);
    return s->ev && event_add(s->ev, NULL) == 0 ? 0 : -1;
}

static void canned_stop(struct canned_server *s)
{
    if (s->ev)
        event_free(s->ev);
    for (int i = 0; i < s->nconns; i++) {
        if (s->conns[i].ev)
            event_free(s->conns[i].ev);
        if (s->conns[i].fd >= 0)
            close(s->conns[i].fd);
    }
    if (s->lfd >= 0)
        close(s->lfd);
}

/* ---------------------------------------------------------------- tests */

static const char *Q_M1 = "label_replace(vector(3), \"model_name\", \"m1\", \"\", \"\")";
/* a appears in two series that the sum folds together; b once. */
static const char *Q_SUM =
    "sum by (model_name) ("
    "label_replace(label_replace(vector(2), \"model_name\", \"a\", \"\", \"\"), \"x\", \"1\", \"\", \"\")"
    " or label_replace(label_replace(vector(3), \"model_name\", \"a\", \"\", \"\"), \"x\", \"2\", \"\", \"\")"
    " or label_replace(vector(7), \"model_name\", \"b\", \"\", \"\"))";

static void test_new_rejects_bad_args(struct event_base *base)
{
    char err[256] = "";
    struct prom_source *s = prom_source_new(base, "ftp://127.0.0.1:1", 1000, err, sizeof(err));
    CHECK(s == NULL && strstr(err, "scheme"), "ftp url: err=%s", err);
    prom_source_free(s);
    err[0] = '\0';
    s = prom_source_new(base, "http://", 1000, err, sizeof(err));
    CHECK(s == NULL && strstr(err, "bad Prometheus URL"), "empty host: err=%s", err);
    prom_source_free(s);
    err[0] = '\0';
    s = prom_source_new(base, "http://127.0.0.1:1", 0, err, sizeof(err));
    CHECK(s == NULL && strstr(err, "timeout"), "zero timeout: err=%s", err);
    prom_source_free(s);
    prom_source_free(NULL);
}

static void test_against_prometheus(struct event_base *base, struct prom_source *src)
{
    struct result r;

    /* Basic vector; the callback must not run inside prom_source_query and a
     * second query while one is in flight is refused. */
    memset(&r, 0, sizeof(r));
    int rc = prom_source_query(src, Q_M1, "model_name", on_result, &r);
    CHECK(rc == 0, "query start rc=%d", rc);
    CHECK(r.calls == 0, "callback ran inside prom_source_query");
    struct result r2;
    memset(&r2, 0, sizeof(r2));
    CHECK(prom_source_query(src, Q_M1, "model_name", on_result, &r2) == -1,
          "second query while in flight accepted");
    run_until(base, &r.calls, 10000);
    int found = 0;
    double v = sample_of(&r, "m1", &found);
    CHECK(r.calls == 1 && r.status == 0 && r.n == 1 && found && v == 3.0,
          "m1: calls=%d status=%d n=%zu v=%g err=%s", r.calls, r.status, r.n, v, r.err);
    CHECK(r2.calls == 0, "refused query's callback ran");

    /* sum by over label_replace'd vectors */
    query_sync(base, src, Q_SUM, &r, 10000);
    int fa = 0, fb = 0;
    double va = sample_of(&r, "a", &fa), vb = sample_of(&r, "b", &fb);
    CHECK(r.calls == 1 && r.status == 0 && r.n == 2 && fa && fb && va == 5.0 && vb == 7.0,
          "sum: status=%d n=%zu a=%g b=%g err=%s", r.status, r.n, va, vb, r.err);

    /* A scalar names no model: the query fails. */
    query_sync(base, src, "1 + 1", &r, 10000);
    CHECK(r.status != 0 && strstr(r.err, "resultType scalar"),
          "scalar: status=%d n=%zu err=%s", r.status, r.n, r.err);

    /* Series, none with the label (a query that renamed it): the query
     * fails, it does not read as every model idle. */
    query_sync(base, src, "label_replace(vector(1), \"model\", \"m1\", \"\", \"\")", &r, 10000);
    CHECK(r.calls == 1 && r.status != 0 && strstr(r.err, "none with the label"),
          "no label: status=%d n=%zu err=%s", r.status, r.n, r.err);
    /* A label-less series at 0 ({}: `or vector(0)`) is no series; with a
     * value, it is a query that summed the label away. */
    query_sync(base, src, "vector(0)", &r, 10000);
    CHECK(r.calls == 1 && r.status == 0 && r.n == 0, "vector(0): status=%d n=%zu err=%s",
          r.status, r.n, r.err);
    query_sync(base, src, "vector(1)", &r, 10000);
    CHECK(r.calls == 1 && r.status != 0 && strstr(r.err, "none with the label"),
          "vector(1): status=%d n=%zu err=%s", r.status, r.n, r.err);

    /* Bad PromQL: HTTP 400 with Prometheus' own reason. */
    query_sync(base, src, "sum(", &r, 10000);
    CHECK(r.calls == 1 && r.status < 0 && strncmp(r.err, "HTTP 400: bad_data: ", 20) == 0,
          "bad query: status=%d err=%s", r.status, r.err);

    /* Keep-alive: all of the above went over one TCP connection. */
    struct prom_source_stats st;
    prom_source_get_stats(src, &st);
    CHECK(st.queries == 7 && st.failures == 4 && st.connects == 1 && st.last_duration_us > 0,
          "stats: queries=%llu failures=%llu connects=%llu", (unsigned long long)st.queries,
          (unsigned long long)st.failures, (unsigned long long)st.connects);

    /* Body bound: a tiny cap fails the query, the default works again. */
    prom_source_set_max_body(src, 40);
    query_sync(base, src, Q_M1, &r, 10000);
    CHECK(r.status < 0 && strstr(r.err, "response body exceeds 40 bytes"),
          "body cap: status=%d err=%s", r.status, r.err);
    prom_source_set_max_body(src, 0);
    query_sync(base, src, Q_M1, &r, 10000);
    CHECK(r.status == 0 && r.n == 1, "after cap reset: status=%d err=%s", r.status, r.err);

    /* The callback may start the next query. */
    struct result first, second;
    memset(&first, 0, sizeof(first));
    memset(&second, 0, sizeof(second));
    first.chain_src = src;
    first.chain_query = Q_SUM;
    first.chain_result = &second;
    first.chain_rc = -99;
    CHECK(prom_source_query(src, Q_M1, "model_name", on_result, &first) == 0, "chain start");
    run_until(base, &second.calls, 10000);
    CHECK(first.calls == 1 && first.status == 0 && first.chain_rc == 0 && second.calls == 1 &&
              second.status == 0 && second.n == 2,
          "chain: first=%d/%d rc=%d second=%d/%d n=%zu err=%s", first.calls, first.status,
          first.chain_rc, second.calls, second.status, second.n, second.err);
}

/* Freeing the source from inside its own callback is deferred, not a crash. */
static void test_free_in_callback(struct event_base *base, int port)
{
    char url[128], err[256];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    struct prom_source *s = prom_source_new(base, url, 5000, err, sizeof(err));
    CHECK(s != NULL, "new: %s", err);
    if (!s)
        return;
    struct result r, chained;
    memset(&r, 0, sizeof(r));
    memset(&chained, 0, sizeof(chained));
    r.free_me = s;
    /* Also start a query in the callback before freeing: it must be dropped
     * without its callback. */
    r.chain_src = s;
    r.chain_query = Q_M1;
    r.chain_result = &chained;
    CHECK(prom_source_query(s, Q_M1, "model_name", on_result, &r) == 0, "start");
    run_until(base, &r.calls, 10000);
    CHECK(r.calls == 1 && r.status == 0 && r.chain_rc == 0, "free-in-cb: calls=%d status=%d err=%s",
          r.calls, r.status, r.err);
    int never = 0;
    run_until(base, &never, 300);
    CHECK(chained.calls == 0, "query started before free-in-callback reported back");
}

static void test_timeout(struct event_base *base, int64_t margin_ms)
{
    struct silent_server ss;
    CHECK(silent_start(base, &ss) == 0, "silent server start");
    char url[128], err[256];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/", ss.port);
    struct prom_source *s = prom_source_new(base, url, 500, err, sizeof(err));
    CHECK(s != NULL, "new: %s", err);
    if (s) {
        struct result r;
        int64_t t0 = clock_mono_ms();
        query_sync(base, s, Q_M1, &r, 500 + margin_ms + 2000);
        int64_t took = r.calls ? r.at_ms - t0 : -1;
        CHECK(r.calls == 1 && r.status < 0 && strstr(r.err, "timeout after 500 ms") &&
                  took >= 450 && took <= 500 + margin_ms,
              "timeout: calls=%d took=%lld ms err=%s", r.calls, (long long)took, r.err);
        CHECK(ss.nconns >= 1, "silent server never saw a connection");

        /* Free with a query in flight: no callback, ever. */
        memset(&r, 0, sizeof(r));
        CHECK(prom_source_query(s, Q_M1, "model_name", on_result, &r) == 0, "start");
        int never = 0;
        run_until(base, &never, 150);
        prom_source_free(s);
        run_until(base, &never, 800);
        CHECK(r.calls == 0, "callback ran after free (calls=%d)", r.calls);
    }
    silent_stop(&ss);
}

static void test_canned_answers(struct event_base *base)
{
    static const struct {
        const char *response;
        const char *want; /* prefix of err, or NULL for success */
    } cases[] = {
        {"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 14\r\nConnection: close\r\n\r\n<html>502</html"
         ">",
         "HTTP 502"},
        {"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\n"
         "{\"status\":\"error\",\"errorType\":\"timeout\",\"error\":\"query timed out\"}",
         "HTTP 503: timeout: query timed out"},
        {"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{\"status\":\"succ", "invalid JSON"},
        {"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
         "{\"status\":\"success\",\"data\":{\"resultType\":\"matrix\",\"result\":[]}}",
         "resultType matrix not supported"},
        /* Chunked, no Content-Length: the cap is enforced while reading. */
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
         "40\r\n{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":[]}}\r\n0\r\n\r\n",
         NULL},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
         "40\r\n{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":[]}}\r\n0\r\n\r\n",
         "response body exceeds 20 bytes"},
        {"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{\"stat", "curl: "},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct canned_server cs;
        CHECK(canned_start(base, &cs, cases[i].response) == 0, "canned server %zu", i);
        char url[128], err[256];
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", cs.port);
        struct prom_source *s = prom_source_new(base, url, 3000, err, sizeof(err));
        CHECK(s != NULL, "new: %s", err);
        if (s) {
            if (cases[i].want && strstr(cases[i].want, "exceeds 20"))
                prom_source_set_max_body(s, 20);
            struct result r;
            query_sync(base, s, "up", &r, 5000);
            if (cases[i].want)
                CHECK(r.calls == 1 && r.status < 0 &&
                          strncmp(r.err, cases[i].want, strlen(cases[i].want)) == 0,
                      "canned %zu: calls=%d status=%d err=%s (want %s)", i, r.calls, r.status,
                      r.err, cases[i].want);
            else
                CHECK(r.calls == 1 && r.status == 0 && r.n == 0,
                      "canned %zu: calls=%d status=%d err=%s", i, r.calls, r.status, r.err);
            prom_source_free(s);
        }
        canned_stop(&cs);
    }
}

/* Makes each thaw_* allocation of the I/O path fail in turn (object, URL,
 * label, socket watcher, body buffer, parsed samples): every failure is
 * either a clean NULL/-1 or an error callback, never a hang, crash or leak;
 * with enough allocations the query succeeds. */
static void test_alloc_failure_io(struct event_base *base, int port)
{
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    int succeeded = 0, new_failed = 0, start_failed = 0, cb_failed = 0, bad = 0;
    for (long k = 0; k < 40 && !succeeded; k++) {
        char err[256] = "";
        alloc_fail_after(k);
        struct prom_source *s = prom_source_new(base, url, 3000, err, sizeof(err));
        if (!s) {
            alloc_fail_after(-1);
            if (!strstr(err, "out of memory"))
                bad++;
            new_failed++;
            continue;
        }
        struct result r;
        memset(&r, 0, sizeof(r));
        if (prom_source_query(s, Q_SUM, "model_name", on_result, &r) != 0) {
            alloc_fail_after(-1);
            start_failed++;
            prom_source_free(s);
            continue;
        }
        run_until(base, &r.calls, 10000);
        alloc_fail_after(-1);
        if (r.calls != 1) {
            bad++;
            fprintf(stderr, "alloc k=%ld: no callback\n", k);
        } else if (r.status == 0) {
            succeeded = r.n == 2;
            if (!succeeded)
                bad++;
        } else if (strstr(r.err, "out of memory")) {
            cb_failed++;
        } else {
            bad++;
            fprintf(stderr, "alloc k=%ld: err=%s\n", k, r.err);
        }
        prom_source_free(s);
    }
    alloc_fail_after(-1);
    CHECK(succeeded && bad == 0 && new_failed >= 2 && start_failed >= 2 && cb_failed >= 2,
          "alloc io: succeeded=%d bad=%d new_failed=%d start_failed=%d cb_failed=%d", succeeded,
          bad, new_failed, start_failed, cb_failed);
}

static void test_closed_port(struct event_base *base)
{
    int port = peer_free_port();
    char url[128], err[256];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
    struct prom_source *s = prom_source_new(base, url, 2000, err, sizeof(err));
    CHECK(s != NULL, "new: %s", err);
    if (!s)
        return;
    struct result r;
    int64_t t0 = clock_mono_ms();
    query_sync(base, s, Q_M1, &r, 5000);
    CHECK(r.calls == 1 && r.status < 0 && strncmp(r.err, "connect: ", 9) == 0 &&
              r.at_ms - t0 < 1500,
          "closed port: calls=%d err=%s", r.calls, r.err);
    struct prom_source_stats st;
    prom_source_get_stats(s, &st);
    CHECK(st.queries == 1 && st.failures == 1, "closed port stats");
    prom_source_free(s);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *env_bin = getenv("PROMETHEUS");
    if (env_bin && *env_bin)
        prom_bin = env_bin;
    if (access(prom_bin, X_OK) != 0) {
        printf("SKIP: %s not found\n", prom_bin);
        return 77;
    }
    int64_t margin = getenv("THAW_UNDER_VALGRIND") ? 4000 : 1000;

    signal(SIGALRM, on_fatal_signal);
    signal(SIGINT, on_fatal_signal);
    signal(SIGTERM, on_fatal_signal);
    signal(SIGPIPE, SIG_IGN);
    alarm(getenv("THAW_UNDER_VALGRIND") ? 1000 : 110);

    snprintf(tmpdir, sizeof(tmpdir), "/tmp/thaw-prom-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    atexit(cleanup);
    curl_global_init(CURL_GLOBAL_DEFAULT);

    struct event_base *base = event_base_new();
    if (!base)
        return 1;

    test_new_rejects_bad_args(base);
    test_closed_port(base);
    test_canned_answers(base);
    test_timeout(base, margin);

    int started = -1;
    for (int attempt = 0; attempt < 3 && started != 0; attempt++) {
        prom_port = peer_free_port();
        started = start_prometheus(prom_port);
    }
    CHECK(started == 0, "prometheus did not start");
    if (started == 0) {
        char url[128], err[256];
        /* Trailing slash on purpose: it must not double up in the path. */
        snprintf(url, sizeof(url), "http://127.0.0.1:%d/", prom_port);
        struct prom_source *src = prom_source_new(base, url, 3000, err, sizeof(err));
        CHECK(src != NULL, "new: %s", err);
        if (src) {
            test_against_prometheus(base, src);
            test_free_in_callback(base, prom_port);
            test_alloc_failure_io(base, prom_port);

            /* Prometheus goes away: queries fail (the kept-alive connection
             * is dead too), and the same object recovers after a restart. */
            stop_prometheus();
            struct result r;
            query_sync(base, src, Q_M1, &r, 10000);
            CHECK(r.calls == 1 && r.status < 0 && r.err[0], "down: status=%d err=%s", r.status,
                  r.err);
            query_sync(base, src, Q_M1, &r, 10000);
            CHECK(r.calls == 1 && r.status < 0 && strncmp(r.err, "connect: ", 9) == 0,
                  "down again: status=%d err=%s", r.status, r.err);
            struct prom_source_stats before;
            prom_source_get_stats(src, &before);

            int restarted = start_prometheus(prom_port);
            CHECK(restarted == 0, "prometheus restart on port %d", prom_port);
            if (restarted == 0) {
                query_sync(base, src, Q_M1, &r, 10000);
                int found = 0;
                double v = sample_of(&r, "m1", &found);
                CHECK(r.calls == 1 && r.status == 0 && found && v == 3.0,
                      "after restart: status=%d err=%s", r.status, r.err);
                query_sync(base, src, Q_SUM, &r, 10000);
                CHECK(r.status == 0 && r.n == 2, "after restart sum: status=%d err=%s", r.status,
                      r.err);
                struct prom_source_stats after;
                prom_source_get_stats(src, &after);
                CHECK(after.queries == before.queries + 2 && after.failures == before.failures &&
                          after.connects == before.connects + 1,
                      "restart stats: queries %llu->%llu connects %llu->%llu",
                      (unsigned long long)before.queries, (unsigned long long)after.queries,
                      (unsigned long long)before.connects, (unsigned long long)after.connects);
            }
            prom_source_free(src);
        }
    }

    event_base_free(base);
    curl_global_cleanup();
    if (peer_checks_failed)
        dump_prom_log();
    cleanup();
    printf("%d passed, %d failed\n", peer_checks_passed, peer_checks_failed);
    return peer_checks_failed ? 1 : 0;
}
