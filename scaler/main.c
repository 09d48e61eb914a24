/* thaw-scaler: KEDA external scaler for LLM models.
 *
 * Wiring only: options, the event loop, the gRPC server, the admin HTTP
 * server, the Prometheus and Redis sources on timers, and signals. The logic
 * lives in state, policy, service and the sources. */
#include <ctype.h>
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "alloc.h"
#include "clock.h"
#include "expo.h"
#include "fd_limit.h"
#include "grpc_server.h"
#include "http_conn_cap.h"
#include "log.h"
#include "model_name.h"
#include "options.h"
#include "prom_source.h"
#include "redis_guard.h"
#include "redis_source.h"
#include "restore.h"
#include "service.h"
#include "state.h"
#include "tls.h"

struct settings {
    char *listen;
    char *http_listen;
    char *prometheus_url;
    char *redis_url;
    char *config;
    enum log_level log_level;
    char *token_rate_query;
    char *token_rate_label;
    long prometheus_interval_ms;
    long redis_interval_ms;
    long source_timeout_ms;
    double staleness_limit_seconds;
    double scale_down_stabilization_seconds;
    double bursty_scale_down_stabilization_seconds;
    double held_fresh_seconds;
    double target_expiry_seconds;
    long max_connections;
    long max_streams;
    long http_max_connections;
    long max_targets;
    long wake_repeat_ms;
    long max_wake_held;
    long max_request_bytes;
    double request_timeout_seconds;
    double shutdown_timeout_seconds;
    char *tls_cert_file;
    char *tls_key_file;
    char *tls_client_ca_file;
    double tls_reload_interval_seconds;
    char *redis_key_prefix;
    char *allowed_namespaces;
    double restore_window_seconds;
    char *restore_series;
};

#define S(f) offsetof(struct settings, f)
static const struct opt_def option_defs[] = {
    {"listen", OPT_STRING, S(listen), "0.0.0.0:9090", 0, 0,
     "gRPC (KEDA externalscaler) address, HOST:PORT (port 0 picks a free one)", "listen"},
    {"http-listen", OPT_STRING, S(http_listen), "0.0.0.0:9091", 0, 0,
     "HTTP address for /metrics, /healthz, /readyz, /models", "httpListen"},
    {"prometheus-url", OPT_STRING, S(prometheus_url), "http://127.0.0.1:9090", 0, 0,
     "Prometheus base URL", "prometheusUrl"},
    {"redis-url", OPT_STRING, S(redis_url), "redis://127.0.0.1:6379", 0, 0,
     "Redis URL, redis://[:password@]host[:port][/db]", "redisUrl"},
    {"config", OPT_STRING, S(config), NULL, 0, 0, "JSON config file (keys as listed here)", NULL},
    {"log-level", OPT_LOG_LEVEL, S(log_level), "info", 0, 0, "debug, info, warn or error",
     "logLevel"},
    {"token-rate-query", OPT_STRING, S(token_rate_query),
     "sum by (model_name) (rate(vllm:generation_tokens_total[1m]))", 0, 0,
     "PromQL giving generation tokens/s per model; one query per interval for all models",
     "tokenRateQuery"},
    {"token-rate-label", OPT_STRING, S(token_rate_label), "model_name", 0, 0,
     "label of the query's result that names the model", "tokenRateLabel"},
    {"prometheus-interval-ms", OPT_INT, S(prometheus_interval_ms), "5000", 100, 3600000,
     "how often the token-rate query runs", "prometheusIntervalMs"},
    {"redis-interval-ms", OPT_INT, S(redis_interval_ms), "1000", 100, 3600000,
     "how often queue lengths and held counts are read", "redisIntervalMs"},
    {"source-timeout-ms", OPT_INT, S(source_timeout_ms), "2000", 50, 600000,
     "timeout of one Prometheus query or Redis batch", "sourceTimeoutMs"},
    {"staleness-limit-seconds", OPT_DOUBLE, S(staleness_limit_seconds), "60", 1, 86400,
     "after a source fails this long, GetMetrics answers UNAVAILABLE (KEDA fallback)",
     "stalenessLimitSeconds"},
    {"scale-down-stabilization-seconds", OPT_DOUBLE, S(scale_down_stabilization_seconds), "90",
     0, 86400,
     "desired replicas are the max over this window while the demand is steady (set HPA's "
     "own window to 0; bursty demand: burstyScaleDownWindowSeconds); a ScaledObject's "
     "scaleDownWindowSeconds overrides it",
     "scaleDownStabilizationSeconds"},
    {"bursty-scale-down-stabilization-seconds", OPT_DOUBLE,
     S(bursty_scale_down_stabilization_seconds), "180", 0, 86400,
     "the same while the demand is bursty or was within 5 minutes, if longer (a lull in "
     "bursty demand is followed by the next burst); a ScaledObject's "
     "burstyScaleDownWindowSeconds overrides it",
     "burstyScaleDownStabilizationSeconds"},
    {"restore-window-seconds", OPT_DOUBLE, S(restore_window_seconds), "180", 0, 86400,
     "after a restart, a ScaledObject keeps the replicas last reported for it (read back "
     "from Prometheus if reported within this long, --restore-series) for as long as its "
     "scale-down window would have, at most this long (0: off)",
     "restoreWindowSeconds"},
    {"restore-series", OPT_STRING, S(restore_series), "thaw_scaler_desired_replicas", 0, 0,
     "the series the restart read-back queries: thaw_scaler_desired_replicas as Prometheus "
     "scrapes it, with matchers if other installs share the Prometheus",
     "restoreSeries"},
    {"held-fresh-seconds", OPT_DOUBLE, S(held_fresh_seconds), "5", 1, 3600,
     "activator held-count fields older than this are ignored; a wake counts this long",
     "heldFreshSeconds"},
    {"target-expiry-seconds", OPT_DOUBLE, S(target_expiry_seconds), "3600", 60, 864000,
     "ScaledObjects KEDA has not asked about for this long are forgotten",
     "targetExpirySeconds"},
    {"max-targets", OPT_INT, S(max_targets), "20000", 0, 10000000,
     "ScaledObject triggers kept at most (each costs about 8 KB and a policy step a second "
     "until it expires); a call for a new one past it gets RESOURCE_EXHAUSTED; 0: no limit",
     "maxTargets"},
    {"wake-repeat-ms", OPT_INT, S(wake_repeat_ms), "1000", 0, 60000,
     "a wake re-sends true on a StreamIsActive stream that already said it at most this "
     "often (KEDA runs RequestScale for every message; each activator renews its wakes); "
     "a change of activation is always sent at once; 0: every wake",
     "wakeRepeatMs"},
    {"max-wake-held", OPT_INT, S(max_wake_held), "10000", 1, 9999999,
     "a POST /wake counts at most this many held requests, and so do all wakes for one "
     "model together (an activator holds maxHeldRequests, 1000 by default): bad or hostile "
     "posts cannot ask for thousands of replicas", "maxWakeHeld"},
    {"max-connections", OPT_INT, S(max_connections), "10000", 1, 1000000,
     "gRPC connections accepted at once", "maxConnections"},
    {"max-streams-per-connection", OPT_INT, S(max_streams), "0", 0, 2147483647,
     "concurrent gRPC calls on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); "
     "KEDA keeps one connection per scaler address and holds a StreamIsActive open on it "
     "for every external-push trigger, so past this its other calls wait; 0: --max-targets "
     "plus 1000 (2^31 - 1 with no target limit). Also the bound on streams open over all "
     "connections (each costs about 1 KiB): past it a new one is refused (REFUSED_STREAM)",
     "maxStreamsPerConnection"},
    {"http-max-connections", OPT_INT, S(http_max_connections), "4096", 1, 1000000,
     "connections the HTTP port holds open at once; one more closes the connection idle "
     "longest (2 s at least) or, with none idle, is answered 503 and closed (scrapes, "
     "probes and activators' wake posts each take one for a moment; an activator has up to "
     "256 posts in flight in a mass wake)",
     "httpMaxConnections"},
    {"max-request-bytes", OPT_INT, S(max_request_bytes), "67108864", 65536, 1073741824,
     "bytes that gRPC request messages still being read may hold, all connections together; "
     "a call that would go over gets RESOURCE_EXHAUSTED (KEDA's requests are a few KB)",
     "maxRequestBytes"},
    {"request-timeout-seconds", OPT_DOUBLE, S(request_timeout_seconds), "10", 0.1, 600,
     "a gRPC request whose message has not all arrived this long after its headers is reset",
     "requestTimeoutSeconds"},
    {"shutdown-timeout-seconds", OPT_DOUBLE, S(shutdown_timeout_seconds), "5", 0, 600,
     "on SIGTERM, how long to wait for connections to close", "shutdownTimeoutSeconds"},
    {"tls-cert-file", OPT_STRING, S(tls_cert_file), NULL, 0, 0,
     "PEM certificate chain for the gRPC port; with --tls-key-file turns TLS on (ALPN h2)",
     "tlsCertFile"},
    {"tls-key-file", OPT_STRING, S(tls_key_file), NULL, 0, 0,
     "PEM private key of --tls-cert-file", "tlsKeyFile"},
    {"tls-client-ca-file", OPT_STRING, S(tls_client_ca_file), NULL, 0, 0,
     "PEM CA bundle: clients must present a certificate it signed (mutual TLS)",
     "tlsClientCaFile"},
    {"tls-reload-interval-seconds", OPT_DOUBLE, S(tls_reload_interval_seconds), "5", 0, 3600,
     "how often the TLS files are checked for changes and reloaded (0: never)",
     "tlsReloadIntervalSeconds"},
    {"redis-key-prefix", OPT_STRING, S(redis_key_prefix), "thaw:queue:", 0, 0,
     "ScaledObjects' redisKey must start with this (\"\" allows any key)", "redisKeyPrefix"},
    {"allowed-namespaces", OPT_STRING, S(allowed_namespaces), "", 0, 0,
     "comma-separated namespaces whose ScaledObjects are served (\"\" = all)",
     "allowedNamespaces"},
};
#undef S
#define NOPTIONS (sizeof(option_defs) / sizeof(option_defs[0]))

struct app {
    struct settings cfg;
    struct event_base *base;
    struct scaler_service *svc;
    struct scaler_state *st;
    struct grpc_server *grpc;
    struct tls_server *tls; /* NULL: cleartext gRPC */
    struct evhttp *http;
    struct http_conn_cap *http_cap;
    struct prom_source *prom;
    struct prom_source *restore_prom; /* the read-back for new targets (restore.h) */
    char restore_promql[2048];
    bool restore_in_flight;
    struct redis_source *redis;
    struct event *prom_timer, *redis_timer, *tick_timer, *sigterm, *sigint, *sighup, *shutdown_timer;
    struct event *tls_timer;
    struct event *read_now; /* one-shot: read the sources for a new target */
    bool queue_in_flight, held_in_flight, stopping;
    bool redis_again; /* a new target came while a Redis batch was in flight */
    int64_t last_read_now_ms; /* when read_now last ran (monotonic) */
    int64_t last_gc_ms;
    uint64_t http_wakes, http_wakes_refused, http_wakes_capped;
    struct page_job *jobs; /* /metrics and /models pages being built */
    size_t njobs;
};

/* ---- sources ----------------------------------------------------------- */

static void prom_done(void *ud, int status, const struct prom_sample *samples, size_t n,
                      const char *err)
{
    struct app *app = ud;
    if (status == 0)
        scaler_state_prom_ok(app->st, samples, n, clock_mono_ms());
    else
        scaler_state_source_failed(app->st, SOURCE_PROMETHEUS, err, clock_mono_ms());
}

static void prom_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct app *app = arg;
    /* -1 means the previous query is still running; its own timeout reports it. */
    prom_source_query(app->prom, app->cfg.token_rate_query, app->cfg.token_rate_label, prom_done,
                      app);
}

static void redis_read(struct app *app, int64_t now);

static void restore_done(void *ud, int status, const struct prom_sample *samples, size_t n,
                         const char *err)
{
    struct app *app = ud;
    app->restore_in_flight = false;
    scaler_state_restore_done(app->st, status == 0 ? samples : NULL, status == 0 ? n : 0,
                              status == 0 ? NULL : err, clock_mono_ms());
}

/* Reads back what scalers reported for the targets new here (restore.h).
 * One query serves every target that appeared before its answer. A failure
 * only means they start afresh, as they did before this existed. */
static void restore_read(struct app *app)
{
    if (!app->restore_prom || app->restore_in_flight || !scaler_state_restore_wanted(app->st))
        return;
    app->restore_in_flight = true;
    if (prom_source_query(app->restore_prom, app->restore_promql, RESTORE_LABEL, restore_done,
                          app) != 0) {
        app->restore_in_flight = false;
        scaler_state_restore_done(app->st, NULL, 0, "the query could not start", clock_mono_ms());
    }
}

static int restore_setup(struct app *app, char *err, size_t errlen)
{
    int64_t window_ms = (int64_t)(app->cfg.restore_window_seconds * 1000);
    if (app->cfg.restore_window_seconds <= 0)
        return 0; /* off; check_options refused (0, 1) at start */
    if (restore_query(app->restore_promql, sizeof(app->restore_promql), app->cfg.restore_series,
                      window_ms) != 0) {
        snprintf(err, errlen,
                 "--restore-series must be a metric name, optionally with one {...} list of "
                 "matchers, and --restore-window-seconds 0 or at least 1");
        return -1;
    }
    app->restore_prom = prom_source_new(app->base, app->cfg.prometheus_url,
                                        app->cfg.source_timeout_ms, err, errlen);
    return app->restore_prom ? 0 : -1;
}

/* A batch in flight when a new target came does not cover it: read again
 * once both batches are back. */
static void redis_read_again(struct app *app)
{
    if (app->redis_again && !app->queue_in_flight && !app->held_in_flight) {
        app->redis_again = false;
        if (redis_source_connected(app->redis))
            redis_read(app, clock_mono_ms());
    }
}

static void queue_done(void *ud, int status, const long long *lengths, size_t n,
                       const char *err)
{
    struct app *app = ud;
    app->queue_in_flight = false;
    if (status == 0)
        scaler_state_queue_ok(app->st, lengths, n, clock_mono_ms());
    else
        scaler_state_source_failed(app->st, SOURCE_REDIS_QUEUE, err, clock_mono_ms());
    redis_read_again(app);
}

static void held_done(void *ud, int status, const long long *held, const long long *queued,
                      const long long *late_ms, const long long *inflight,
                      const long long *silent, size_t n, const char *err)
{
    struct app *app = ud;
    app->held_in_flight = false;
    if (status == 0)
        scaler_state_held_ok(app->st, held, queued, late_ms, inflight, silent, n,
                             clock_mono_ms());
    else
        scaler_state_source_failed(app->st, SOURCE_REDIS_HELD, err, clock_mono_ms());
    redis_read_again(app);
}

/* Forgets expired targets once a minute, only while no Redis batch points
 * into the state; also while Redis is down, or deleted ScaledObjects would
 * fill --max-targets during the outage. */
static void gc_maybe(struct app *app, int64_t now)
{
    if (!app->queue_in_flight && !app->held_in_flight && now - app->last_gc_ms > 60000) {
        scaler_state_gc(app->st, now);
        app->last_gc_ms = now;
    }
}

static void redis_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct app *app = arg;
    int64_t now = clock_mono_ms();
    if (!redis_source_connected(app->redis)) {
        scaler_state_source_failed(app->st, SOURCE_REDIS_QUEUE, "not connected", now);
        scaler_state_source_failed(app->st, SOURCE_REDIS_HELD, "not connected", now);
        gc_maybe(app, now);
        return;
    }
    redis_read(app, now);
}

static void redis_read(struct app *app, int64_t now)
{
    gc_maybe(app, now);
    if (!app->queue_in_flight) {
        const struct redis_queue_query *q = NULL;
        size_t n = scaler_state_queue_batch(app->st, &q);
        if (redis_source_queue_lengths(app->redis, q, n, queue_done, app) == 0)
            app->queue_in_flight = true;
    }
    if (!app->held_in_flight) {
        const char *const *models = NULL;
        size_t n = scaler_state_held_batch(app->st, &models);
        if (redis_source_held_counts(app->redis, models, n, clock_unix_ms(),
                                     (int64_t)(app->cfg.held_fresh_seconds * 1000), held_done,
                                     app) == 0)
            app->held_in_flight = true;
    }
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    struct app *app = arg;
    /* Time alone changes decisions: stabilization windows and wake holds expire. */
    scaler_state_tick(app->st, clock_mono_ms());
    scaler_service_tick(app->svc, clock_mono_ms());
    restore_read(app); /* should scheduling the read for a new target have failed */
}

/* A new target's calls wait for its first reading (service.c): take it now
 * rather than up to an interval later. One read serves every target that
 * appeared meanwhile, and reads are at least this far apart. */
#define READ_NOW_SPACING_MS 200
static void read_now_cb(evutil_socket_t fd, short what, void *arg)
{
    struct app *app = arg;
    app->last_read_now_ms = clock_mono_ms();
    prom_timer_cb(-1, 0, app); /* an answer already on its way covers the target too */
    restore_read(app);
    if (app->queue_in_flight || app->held_in_flight)
        app->redis_again = true;
    else if (redis_source_connected(app->redis))
        redis_read(app, clock_mono_ms());
    /* Not connected: the connection's own timer and retries report that. */
}

static void on_new_target(void *ud, struct target *t)
{
    (void)t;
    struct app *app = ud;
    if (evtimer_pending(app->read_now, NULL))
        return; /* that read covers this target too */
    /* Spaced: hundreds of ScaledObjects applied at once must not mean a
     * Prometheus query and a Redis batch each. */
    int64_t wait = app->last_read_now_ms + READ_NOW_SPACING_MS - clock_mono_ms();
    if (wait < 0)
        wait = 0;
    struct timeval tv = {(time_t)(wait / 1000), (suseconds_t)(wait % 1000 * 1000)};
    if (evtimer_add(app->read_now, &tv) != 0)
        LOG_WARN("read_now_failed", "error=\"could not schedule a read for a new target\"");
}

static void tls_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct app *app = arg;
    char err[512];
    /* Logs and counts by itself; a failure keeps the certificate in use. */
    tls_server_check_reload(app->tls, err, sizeof(err));
}

static void on_wake(void *ud, const char *model)
{
    struct app *app = ud;
    scaler_service_wake(app->svc, model, NULL, 1);
}

static void on_redis_state(void *ud, bool up)
{
    LOG_INFO("redis_connection", "up=%s", up ? "true" : "false");
}

/* ---- admin HTTP --------------------------------------------------------- */

static long resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
        rss = 0;
    fclose(f);
    return rss * sysconf(_SC_PAGESIZE);
}

static const char *reason_phrase(int code)
{
    switch (code) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 405:
        return "Method Not Allowed";
    default:
        return "Service Unavailable";
    }
}

static void reply(struct evhttp_request *req, int code, const char *type, struct evbuffer *body)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", type);
    evhttp_send_reply(req, code, reason_phrase(code), body);
}

/* A short text answer (evhttp_send_error drops our headers, e.g. Allow). */
static void reply_text(struct evhttp_request *req, int code, const char *allow, const char *text)
{
    struct evbuffer *out = evbuffer_new();
    if (out)
        evbuffer_add_printf(out, "%s\n", text);
    if (allow)
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", allow);
    reply(req, code, "text/plain", out);
    evbuffer_free(out);
}

/* The read-only paths answer GET and HEAD; POST is allowed for /wake only. */
static bool refuse_unless_get(struct evhttp_request *req)
{
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    if (cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD)
        return false;
    reply_text(req, 405, "GET, HEAD", "method not allowed: GET or HEAD");
    return true;
}

/* ---- pages built in steps ------------------------------------------------- */

/* /metrics and /models at 10 000 models are 15 and 8 MB, 150 and 260 ms of
 * CPU in one go, during which the loop would serve no gRPC call, KEDA push
 * or source reply. So a page is built a step at a time (a few ms each: 2 000
 * samples, or 100 targets of /models at about 25 us each), the loop running
 * in between, and sent once complete; at most MAX_PAGE_JOBS at once (each
 * holds its page in memory). */
enum { METRICS_STEP = 2000, MODELS_STEP = 100, MAX_PAGE_JOBS = 4 };

struct page_job {
    struct app *app;
    struct evhttp_request *req; /* evhttp keeps it until we reply, even if the peer left */
    struct scaler_page *page;
    struct evbuffer *out;
    bool json; /* /models: JSON, MODELS_STEP targets a step, a final newline */
    struct event *next_step;
    struct page_job *prev, *next;
};

static void page_job_free(struct page_job *j)
{
    struct app *app = j->app;
    if (j->prev)
        j->prev->next = j->next;
    else
        app->jobs = j->next;
    if (j->next)
        j->next->prev = j->prev;
    app->njobs--;
    if (j->next_step)
        event_free(j->next_step);
    scaler_page_free(j->page);
    if (j->out)
        evbuffer_free(j->out);
    thaw_free(j);
}

static void page_job_step(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct page_job *j = arg;
    int rc = scaler_page_step(j->page, j->app->st, j->out, clock_mono_ms(),
                              j->json ? MODELS_STEP : METRICS_STEP);
    if (rc == 0) {
        /* A zero timeout runs after the I/O the loop has ready. */
        static const struct timeval now = {0, 0};
        if (event_add(j->next_step, &now) == 0)
            return;
        rc = -1;
    }
    if (rc > 0 && j->json)
        rc = evbuffer_add(j->out, "\n", 1) == 0 ? 1 : -1;
    if (rc < 0)
        evhttp_send_error(j->req, 500, "out of memory");
    else
        reply(j->req, 200, j->json ? "application/json" : EXPO_CONTENT_TYPE, j->out);
    page_job_free(j);
}

/* A request for a page while MAX_PAGE_JOBS are being built: answered 503
 * before its page is begun (the /metrics copy alone is 11 ms at 10 000
 * models). Returns true when it did. */
static bool refuse_when_busy(struct app *app, struct evhttp_request *req)
{
    /* Pages already answered wait in memory for their clients: those that
     * do not read (120 of them held 1.4 GB at 10 000 models) must not make
     * each new page one more. */
    bool unsent = app->http_cap &&
                  http_conn_cap_unsent_bytes(app->http_cap) > HTTP_CONN_CAP_MAX_UNSENT_BYTES;
    if (app->njobs < MAX_PAGE_JOBS && !unsent)
        return false;
    evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
    reply_text(req, 503, NULL,
               unsent ? "busy: the pages answered before wait for clients that do not read them"
                      : "busy: too many /metrics and /models pages being built");
    return true;
}

/* Starts building page (taken; NULL: out of memory) for req, after prefix
 * (may be NULL). A JSON page ends with a newline. */
static void page_job_start(struct app *app, struct evhttp_request *req, struct scaler_page *page,
                           struct evbuffer *prefix, bool json)
{
    struct page_job *j = page ? thaw_calloc(1, sizeof(*j)) : NULL;
    if (!j) {
        scaler_page_free(page);
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    j->app = app;
    j->req = req;
    j->page = page;
    j->json = json;
    j->out = evbuffer_new();
    j->next_step = evtimer_new(app->base, page_job_step, j);
    j->next = app->jobs;
    if (app->jobs)
        app->jobs->prev = j;
    app->jobs = j;
    app->njobs++;
    if (!j->out || !j->next_step || (prefix && evbuffer_add_buffer(j->out, prefix) < 0)) {
        evhttp_send_error(req, 500, "out of memory");
        page_job_free(j);
        return;
    }
    page_job_step(-1, 0, j);
}

static void http_metrics(struct evhttp_request *req, void *arg)
{
    struct app *app = arg;
    if (refuse_unless_get(req) || refuse_when_busy(app, req))
        return;
    struct evbuffer *out = evbuffer_new();
    if (!out) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    int64_t now = clock_mono_ms();
    /* The process-wide series first, as of now like the page's snapshot. */
    scaler_service_write_metrics(app->svc, out);
    grpc_server_write_metrics(app->grpc, out, "thaw_scaler");
    http_conn_cap_write_metrics(app->http_cap, out, "thaw_scaler_http",
                                "HTTP (/metrics, /models, /wake)");
    if (app->tls)
        tls_server_write_metrics(app->tls, out, "thaw_scaler");
    struct prom_source_stats ps;
    struct redis_source_stats rs;
    prom_source_get_stats(app->prom, &ps);
    redis_source_get_stats(app->redis, &rs);
    expo_family(out, "thaw_scaler_redis_wake_subscribed", "gauge",
                "1 while the thaw:wake subscription is confirmed; 0: wakes through Redis are "
                "not heard (POST /wake still is).");
    expo_sample(out, "thaw_scaler_redis_wake_subscribed", NULL, rs.wake_subscribed ? 1 : 0);
    expo_family(out, "thaw_scaler_source_round_trips_total", "counter",
                "Round trips to each backing service (constant per interval in the model count).");
    expo_sample(out, "thaw_scaler_source_round_trips_total", "service=\"prometheus\"",
                (double)ps.queries);
    expo_sample(out, "thaw_scaler_source_round_trips_total", "service=\"redis\"",
                (double)rs.round_trips);
    expo_family(out, "thaw_scaler_http_wakes_total", "counter",
                "POST /wake requests from activators (the wake path that does not need Redis), "
                "by result.");
    expo_sample(out, "thaw_scaler_http_wakes_total", "result=\"ok\"", (double)app->http_wakes);
    expo_sample(out, "thaw_scaler_http_wakes_total", "result=\"refused\"",
                (double)app->http_wakes_refused);
    expo_family(out, "thaw_scaler_http_wakes_held_capped_total", "counter",
                "POST /wake requests whose held count was cut to --max-wake-held.");
    expo_sample(out, "thaw_scaler_http_wakes_held_capped_total", NULL,
                (double)app->http_wakes_capped);
    expo_family(out, "thaw_scaler_redis_commands_total", "counter",
                "Redis commands sent in all batches.");
    expo_sample(out, "thaw_scaler_redis_commands_total", NULL, (double)rs.commands);
    expo_family(out, "thaw_scaler_redis_reconnects_total", "counter", "Redis reconnections.");
    expo_sample(out, "thaw_scaler_redis_reconnects_total", NULL, (double)rs.reconnects);
    expo_family(out, "thaw_scaler_redis_replies_refused_total", "counter",
                "Redis replies refused by the reply guard (no command asked for them, a malformed "
                "pub/sub message, or over 1M array elements); each dropped its connection.");
    expo_sample(out, "thaw_scaler_redis_replies_refused_total", NULL,
                (double)redis_guard_refused_total());
    expo_family(out, "thaw_scaler_prometheus_query_duration_seconds", "gauge",
                "Duration of the last token-rate query.");
    expo_sample(out, "thaw_scaler_prometheus_query_duration_seconds", NULL,
                (double)ps.last_duration_us / 1e6);
    expo_family(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    expo_sample(out, "process_resident_memory_bytes", NULL, (double)resident_bytes());
    page_job_start(app, req, scaler_state_metrics_page(app->st, now), out, false);
    evbuffer_free(out);
}

static void http_healthz(struct evhttp_request *req, void *arg)
{
    if (refuse_unless_get(req))
        return;
    struct evbuffer *out = evbuffer_new();
    if (out)
        evbuffer_add_printf(out, "ok\n");
    reply(req, 200, "text/plain", out);
    evbuffer_free(out);
}

static void http_readyz(struct evhttp_request *req, void *arg)
{
    if (refuse_unless_get(req))
        return;
    struct app *app = arg;
    struct evbuffer *out = evbuffer_new();
    if (out)
        evbuffer_add_printf(out, app->stopping ? "shutting down\n" : "ready\n");
    reply(req, app->stopping ? 503 : 200, "text/plain", out);
    evbuffer_free(out);
}

static void http_models(struct evhttp_request *req, void *arg)
{
    struct app *app = arg;
    if (refuse_unless_get(req) || refuse_when_busy(app, req))
        return;
    page_job_start(app, req, scaler_state_models_page(app->st, clock_mono_ms()), NULL, true);
}

/* The raw value of key in a query string (*len set), or NULL. */
static const char *query_value(const char *query, const char *key, size_t *len)
{
    size_t kl = strlen(key);
    for (const char *p = query; p && *p;) {
        const char *amp = strchr(p, '&');
        size_t n = amp ? (size_t)(amp - p) : strlen(p);
        if (n > kl && p[kl] == '=' && strncmp(p, key, kl) == 0) {
            *len = n - kl - 1;
            return p + kl + 1;
        }
        p = amp ? amp + 1 : NULL;
    }
    return NULL;
}

/* What a POST /wake says: the model, and optionally the activator (instance)
 * and how many requests it holds (held). Names are decoded here, not by
 * evhttp, so that "%00" cannot cut one short (common/model_name.h). Returns 0,
 * or -1 with *why set. */
struct wake_request {
    char model[MODEL_NAME_MAX + 1];
    char instance[MODEL_NAME_MAX + 1];
    bool has_instance;
    double held;
};

static int parse_wake(const char *query, struct wake_request *w, const char **why)
{
    size_t len;
    const char *v = query_value(query, "model", &len);
    if (!v || model_name_from_query(v, len, w->model, sizeof(w->model)) < 0) {
        *why = "want POST /wake?model=NAME (percent-encoded UTF-8, 1-512 bytes, no control "
               "characters)";
        return -1;
    }
    w->has_instance = false;
    if ((v = query_value(query, "instance", &len))) {
        if (model_name_from_query(v, len, w->instance, sizeof(w->instance)) < 0) {
            *why = "instance: 1-512 bytes of percent-encoded UTF-8, no control characters";
            return -1;
        }
        w->has_instance = true;
    }
    w->held = 1;
    if ((v = query_value(query, "held", &len))) {
        long n = 0;
        if (len == 0 || len > 7 || strspn(v, "0123456789") < len) {
            *why = "held: a whole number 0..9999999";
            return -1;
        }
        for (size_t i = 0; i < len; i++)
            n = n * 10 + (v[i] - '0');
        w->held = n > 0 ? (double)n : 1; /* a wake is at least one request */
    }
    return 0;
}

/* POST /wake?model=NAME: the activators' wake signal without Redis (the same
 * as a thaw:wake message), so a model at zero can still be woken while Redis
 * is down. */
static void http_wake(struct evhttp_request *req, void *arg)
{
    struct app *app = arg;
    if (evhttp_request_get_command(req) != EVHTTP_REQ_POST) {
        app->http_wakes_refused++;
        reply_text(req, 405, "POST", "use POST /wake?model=NAME");
        return;
    }
    struct wake_request w;
    const char *why = NULL;
    if (parse_wake(evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req)), &w, &why) < 0) {
        app->http_wakes_refused++;
        reply_text(req, 400, NULL, why);
        return;
    }
    app->http_wakes++;
    if (w.held > (double)app->cfg.max_wake_held) {
        w.held = (double)app->cfg.max_wake_held;
        app->http_wakes_capped++;
    }
    size_t targets = scaler_service_wake(app->svc, w.model, w.has_instance ? w.instance : NULL,
                                         w.held);
    struct evbuffer *out = evbuffer_new();
    json_t *o = json_pack("{s:s,s:I,s:f}", "model", w.model, "targets", (json_int_t)targets,
                          "held", w.held);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (out && text)
        evbuffer_add_printf(out, "%s\n", text);
    free(text); /* jansson's allocator */
    json_decref(o);
    reply(req, 200, "application/json", out);
    evbuffer_free(out);
}

static void http_not_found(struct evhttp_request *req, void *arg)
{
    evhttp_send_error(req, 404, "not found; try /metrics, /healthz, /readyz or /models");
}

/* ---- lifecycle ---------------------------------------------------------- */

static void shutdown_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct app *app = arg;
    LOG_WARN("shutdown_timeout", "connections=%zu", grpc_server_connection_count(app->grpc));
    event_base_loopbreak(app->base);
}

static void shutdown_check_cb(evutil_socket_t fd, short what, void *arg);

/* Strings the option table cannot check: each of these passed start-up and
 * then failed every query, or refused every ScaledObject, with no error at
 * start. */
static int check_options(const struct settings *cfg, char *err, size_t errlen)
{
    const char *q = cfg->token_rate_query;
    while (*q && isspace((unsigned char)*q))
        q++;
    if (!*q) {
        snprintf(err, errlen, "--token-rate-query: empty");
        return -1;
    }
    const char *l = cfg->token_rate_label;
    bool label_ok = (isalpha((unsigned char)*l) || *l == '_');
    for (const char *c = l; label_ok && *c; c++)
        label_ok = isalnum((unsigned char)*c) || *c == '_';
    if (!label_ok) {
        snprintf(err, errlen,
                 "--token-rate-label: expected a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*), "
                 "got '%.64s'",
                 l);
        return -1;
    }
    if (cfg->tls_reload_interval_seconds > 0 && cfg->tls_reload_interval_seconds < 0.001) {
        snprintf(err, errlen,
                 "--tls-reload-interval-seconds: expected 0 (off) or at least 0.001, got %g",
                 cfg->tls_reload_interval_seconds);
        return -1;
    }
    if (cfg->restore_window_seconds > 0 && cfg->restore_window_seconds < 1) {
        snprintf(err, errlen, "--restore-window-seconds: expected 0 (off) or at least 1, got %g",
                 cfg->restore_window_seconds);
        return -1;
    }
    const char *ns = cfg->allowed_namespaces;
    if (*ns && strspn(ns, ", ") == strlen(ns)) {
        snprintf(err, errlen,
                 "--allowed-namespaces: no namespace in '%.64s' (empty allows every namespace)",
                 ns);
        return -1;
    }
    return 0;
}

/* The scaler re-reads nothing on SIGHUP (TLS files are polled); its default
 * action would end the process without the graceful stop. */
static void sighup_cb(evutil_socket_t sig, short what, void *arg)
{
    (void)sig;
    (void)what;
    (void)arg;
    LOG_WARN("signal_ignored", "signal=SIGHUP note=\"the scaler reloads nothing on SIGHUP; "
                               "restart it to apply a changed config\"");
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    struct app *app = arg;
    if (app->stopping) {
        event_base_loopbreak(app->base);
        return;
    }
    app->stopping = true;
    LOG_INFO("shutdown", "signal=%d streams=%zu", (int)sig, scaler_service_stream_count(app->svc));
    scaler_service_set_serving(app->svc, false);
    /* KEDA keeps the replicas on an error; a call ended without one reads
     * as a bad response. */
    scaler_service_fail_pending(app->svc, "the scaler is shutting down");
    grpc_server_shutdown(app->grpc);
    event_del(app->prom_timer);
    event_del(app->redis_timer);
    event_del(app->tick_timer);
    if (app->tls_timer)
        event_del(app->tls_timer);
    struct timeval tv = {(time_t)app->cfg.shutdown_timeout_seconds,
                         (suseconds_t)((app->cfg.shutdown_timeout_seconds -
                                        (double)(time_t)app->cfg.shutdown_timeout_seconds) *
                                       1e6)};
    event_add(app->shutdown_timer, &tv);
    shutdown_check_cb(-1, 0, app);
}

static void shutdown_check_cb(evutil_socket_t fd, short what, void *arg)
{
    struct app *app = arg;
    if (grpc_server_connection_count(app->grpc) == 0) {
        event_base_loopbreak(app->base);
        return;
    }
    struct timeval tv = {0, 20000};
    event_base_once(app->base, -1, EV_TIMEOUT, shutdown_check_cb, app, &tv);
}

static int listen_http(struct app *app, int *port, char *err, size_t errlen)
{
    char host[256];
    if (options_split_hostport(app->cfg.http_listen, host, sizeof(host), port) != 0) {
        snprintf(err, errlen, "--http-listen: expected HOST:PORT, got '%s'", app->cfg.http_listen);
        return -1;
    }
    app->http = evhttp_new(app->base);
    if (!app->http) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    app->http_cap = http_conn_cap_new(app->base, app->http, (int)app->cfg.http_max_connections,
                                      HTTP_CONN_CAP_EVICT_IDLE_MS, "http");
    if (!app->http_cap) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    evhttp_set_max_headers_size(app->http, 16384);
    /* No endpoint reads a body (POST /wake takes its query string): 1 KiB
     * keeps what a stalled client holds small (64 KiB let 500 stalled posts
     * hold 32 MB until the timeout). */
    evhttp_set_max_body_size(app->http, 1024);
    evhttp_set_timeout(app->http, 30);
    evhttp_set_allowed_methods(app->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST);
    evhttp_set_cb(app->http, "/metrics", http_metrics, app);
    evhttp_set_cb(app->http, "/healthz", http_healthz, app);
    evhttp_set_cb(app->http, "/readyz", http_readyz, app);
    evhttp_set_cb(app->http, "/models", http_models, app);
    evhttp_set_cb(app->http, "/wake", http_wake, app);
    evhttp_set_gencb(app->http, http_not_found, app);
    struct evhttp_bound_socket *sock = evhttp_bind_socket_with_handle(app->http, host,
                                                                      (ev_uint16_t)*port);
    if (!sock) {
        snprintf(err, errlen, "bind %s: %s", app->cfg.http_listen, strerror(errno));
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss, &sl) == 0)
        *port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)(void *)&ss)->sin_port
                                              : ((struct sockaddr_in6 *)(void *)&ss)->sin6_port);
    return 0;
}

static void app_free(struct app *app)
{
    /* Pages still being built are dropped; evhttp_free below frees their
     * requests with their connections. */
    while (app->jobs)
        page_job_free(app->jobs);
    grpc_server_free(app->grpc); /* cancels streams: the service forgets them */
    tls_server_free(app->tls);   /* after the connections that use it */
    scaler_service_free(app->svc);
    scaler_state_free(app->st);
    prom_source_free(app->prom);
    prom_source_free(app->restore_prom);
    redis_source_free(app->redis);
    if (app->http)
        evhttp_free(app->http);
    http_conn_cap_free(app->http_cap); /* after evhttp_free: its connections report here */
    struct event *evs[] = {app->prom_timer, app->redis_timer,    app->tick_timer,
                           app->sigterm,    app->sigint,         app->shutdown_timer,
                           app->tls_timer,  app->read_now,       app->sighup};
    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++)
        if (evs[i])
            event_free(evs[i]);
    if (app->base)
        event_base_free(app->base);
    options_free(option_defs, NOPTIONS, &app->cfg);
}

/* TLS on the gRPC port when a certificate is given; cleartext otherwise. */
static int setup_tls(struct app *app, char *err, size_t errlen)
{
    const char *cert = app->cfg.tls_cert_file, *key = app->cfg.tls_key_file;
    const char *ca = app->cfg.tls_client_ca_file;
    int have_cert = cert && cert[0], have_key = key && key[0], have_ca = ca && ca[0];
    if (!have_cert && !have_key) {
        if (have_ca) {
            snprintf(err, errlen, "--tls-client-ca-file needs --tls-cert-file and --tls-key-file");
            return -1;
        }
        return 0;
    }
    if (!have_cert || !have_key) {
        snprintf(err, errlen, "--tls-cert-file and --tls-key-file go together");
        return -1;
    }
    struct tls_server_config tc = {.cert_file = cert, .key_file = key, .client_ca_file = ca};
    app->tls = tls_server_new(&tc, err, errlen);
    if (!app->tls)
        return -1;
    grpc_server_set_tls(app->grpc, app->tls);
    double iv = app->cfg.tls_reload_interval_seconds;
    if (iv > 0) {
        app->tls_timer = event_new(app->base, -1, EV_PERSIST, tls_timer_cb, app);
        struct timeval tv = {(time_t)iv, (suseconds_t)((iv - (double)(time_t)iv) * 1e6)};
        if (!app->tls_timer || event_add(app->tls_timer, &tv) != 0) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    return 0;
}

static struct timeval ms_to_tv(long ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

int main(int argc, char **argv)
{
    struct app app;
    char err[512];
    char q1[600];
    memset(&app, 0, sizeof(app));
    signal(SIGPIPE, SIG_IGN);
    /* Every interval parses the token-rate answer (megabytes at thousands of
     * models) and frees it; a scrape builds and frees a page. With glibc's
     * default 128 KB trim threshold the freed top of the heap went back to
     * the kernel each time and was faulted in again by the next interval:
     * 70 ms of CPU per interval at 10 000 models instead of 45 (BENCHMARKS.md).
     * What the scaler used once it uses again a second later: keep it.
     * Setting the trim threshold ends glibc's dynamic mmap threshold, so
     * blocks up to 32 MB (the page's row arrays, the Prometheus body) are
     * set to come from that heap too, not mmap'ed and unmapped each time. */
#if defined(M_TRIM_THRESHOLD) && defined(M_MMAP_THRESHOLD)
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
#endif
    long fd_limit = fd_limit_raise();

    enum options_result r = options_parse(
        option_defs, NOPTIONS, &app.cfg, argc, argv, "thaw-scaler",
        "KEDA external scaler for LLM inference: replicas from token rate, queue length and "
        "requests held by activators.",
        "config", NULL, stdout, err, sizeof(err));
    if (r == OPTIONS_EXIT_OK) {
        options_free(option_defs, NOPTIONS, &app.cfg);
        return 0;
    }
    if (r == OPTIONS_ERROR) {
        fprintf(stderr, "thaw-scaler: %s\n", err);
        options_free(option_defs, NOPTIONS, &app.cfg);
        return 2;
    }
    log_set_level(app.cfg.log_level);
    if (check_options(&app.cfg, err, sizeof(err)) != 0) {
        fprintf(stderr, "thaw-scaler: %s\n", err);
        options_free(option_defs, NOPTIONS, &app.cfg);
        return 2;
    }

    char grpc_host[256];
    int grpc_port = 0, http_port = 0;
    if (options_split_hostport(app.cfg.listen, grpc_host, sizeof(grpc_host), &grpc_port) != 0) {
        fprintf(stderr, "thaw-scaler: --listen: expected HOST:PORT, got '%s'\n", app.cfg.listen);
        options_free(option_defs, NOPTIONS, &app.cfg);
        return 2;
    }

    log_route_libevent();
    app.base = event_base_new();
    app.svc = scaler_service_new();
    struct scaler_state_config sc = {
        .staleness_limit_ms = (int64_t)(app.cfg.staleness_limit_seconds * 1000),
        .scale_down_window_ms = (int64_t)(app.cfg.scale_down_stabilization_seconds * 1000),
        .bursty_scale_down_window_ms =
            (int64_t)(app.cfg.bursty_scale_down_stabilization_seconds * 1000),
        .restore_window_ms = (int64_t)(app.cfg.restore_window_seconds * 1000),
        .wake_hold_ms = (int64_t)(app.cfg.held_fresh_seconds * 1000),
        .target_expiry_ms = (int64_t)(app.cfg.target_expiry_seconds * 1000),
        .max_targets = (size_t)app.cfg.max_targets,
        .max_wake_held = (double)app.cfg.max_wake_held,
    };
    app.st = app.svc ? scaler_state_new(&sc, clock_mono_ms(), scaler_service_on_change, app.svc)
                     : NULL;
    if (!app.base || !app.svc || !app.st) {
        LOG_ERROR("startup_failed", "error=\"out of memory\"");
        app_free(&app);
        return 1;
    }
    scaler_service_attach(app.svc, app.st);
    scaler_state_set_target_hooks(app.st, on_new_target, &app, scaler_service_on_fresh, app.svc);
    scaler_service_set_wake_repeat(app.svc, app.cfg.wake_repeat_ms);
    if (scaler_service_set_tenancy(app.svc, app.cfg.redis_key_prefix,
                                   app.cfg.allowed_namespaces) != 0) {
        LOG_ERROR("startup_failed", "error=\"out of memory\"");
        app_free(&app);
        return 1;
    }
    size_t nmethods = 0;
    const struct grpc_method *methods = scaler_service_methods(app.svc, &nmethods);
    /* Every push trigger holds a stream on KEDA's one connection: a limit
     * below the targets leaves KEDA's later calls queued for ever. */
    long max_streams = app.cfg.max_streams;
    if (max_streams == 0)
        max_streams = app.cfg.max_targets == 0 || app.cfg.max_targets > INT32_MAX - 1000
                          ? INT32_MAX
                          : app.cfg.max_targets + 1000;
    struct grpc_server_limits limits = {
        .max_streams = (uint32_t)max_streams,
        /* KEDA's one connection may use them all; more connections may not
         * multiply them. */
        .max_streams_total = (size_t)max_streams,
        .max_connections = (size_t)app.cfg.max_connections,
        .max_request_bytes = (size_t)app.cfg.max_request_bytes,
        .request_timeout_ms = (int64_t)(app.cfg.request_timeout_seconds * 1000),
    };
    app.grpc = grpc_server_new(app.base, methods, nmethods, &limits);
    if (app.grpc && setup_tls(&app, err, sizeof(err)) != 0) {
        LOG_ERROR("startup_failed", "error=%s", log_quote(q1, sizeof(q1), err));
        app_free(&app);
        return 1;
    }
    if (!app.grpc ||
        grpc_server_listen(app.grpc, grpc_host, grpc_port, &grpc_port, err, sizeof(err)) != 0 ||
        listen_http(&app, &http_port, err, sizeof(err)) != 0) {
        LOG_ERROR("startup_failed", "error=\"%s\"", app.grpc ? err : "out of memory");
        app_free(&app);
        return 1;
    }
    app.prom = prom_source_new(app.base, app.cfg.prometheus_url, app.cfg.source_timeout_ms, err,
                               sizeof(err));
    if (!app.prom) {
        LOG_ERROR("startup_failed", "error=\"prometheus: %s\"", err);
        app_free(&app);
        return 1;
    }
    if (restore_setup(&app, err, sizeof(err)) != 0) {
        LOG_ERROR("startup_failed", "error=%s", log_quote(q1, sizeof(q1), err));
        app_free(&app);
        return 1;
    }
    struct redis_source_callbacks rcb = {.on_wake = on_wake, .on_state = on_redis_state};
    app.redis = redis_source_new(app.base, app.cfg.redis_url, app.cfg.source_timeout_ms, &rcb,
                                 &app, err, sizeof(err));
    if (!app.redis) {
        LOG_ERROR("startup_failed", "error=\"redis: %s\"", err);
        app_free(&app);
        return 1;
    }

    app.prom_timer = event_new(app.base, -1, EV_PERSIST, prom_timer_cb, &app);
    app.redis_timer = event_new(app.base, -1, EV_PERSIST, redis_timer_cb, &app);
    app.tick_timer = event_new(app.base, -1, EV_PERSIST, tick_cb, &app);
    app.sigterm = evsignal_new(app.base, SIGTERM, signal_cb, &app);
    app.sigint = evsignal_new(app.base, SIGINT, signal_cb, &app);
    app.sighup = evsignal_new(app.base, SIGHUP, sighup_cb, &app);
    app.shutdown_timer = evtimer_new(app.base, shutdown_timeout_cb, &app);
    app.read_now = evtimer_new(app.base, read_now_cb, &app);
    app.last_read_now_ms = clock_mono_ms() - READ_NOW_SPACING_MS;
    if (!app.prom_timer || !app.redis_timer || !app.tick_timer || !app.sigterm || !app.sigint ||
        !app.sighup || !app.shutdown_timer || !app.read_now) {
        LOG_ERROR("startup_failed", "error=\"out of memory\"");
        app_free(&app);
        return 1;
    }
    struct timeval ptv = ms_to_tv(app.cfg.prometheus_interval_ms);
    struct timeval rtv = ms_to_tv(app.cfg.redis_interval_ms);
    struct timeval ttv = {1, 0};
    event_add(app.prom_timer, &ptv);
    event_add(app.redis_timer, &rtv);
    event_add(app.tick_timer, &ttv);
    event_add(app.sigterm, NULL);
    event_add(app.sigint, NULL);
    event_add(app.sighup, NULL);
    /* First readings right away rather than one interval after start. */
    event_active(app.prom_timer, EV_TIMEOUT, 0);
    app.last_gc_ms = clock_mono_ms();

    char q2[300], q3[300];
    /* tls= sits before query=: parsers read the query up to the end of the line. */
    LOG_INFO("listening",
             "grpc_port=%d http_port=%d tls=%s prometheus=%s redis=%s fd_limit=%ld query=%s",
             grpc_port, http_port,
             !app.tls ? "off" : app.cfg.tls_client_ca_file && app.cfg.tls_client_ca_file[0]
                                    ? "mutual"
                                    : "on",
             log_quote_url(q2, sizeof(q2), app.cfg.prometheus_url),
             log_quote_url(q3, sizeof(q3), app.cfg.redis_url), fd_limit,
             log_quote(q1, sizeof(q1), app.cfg.token_rate_query));
    event_base_dispatch(app.base);
    LOG_INFO("stopped", "streams_left=%zu", scaler_service_stream_count(app.svc));
    app_free(&app);
    return 0;
}
