/* thaw-fake-vllm: a stand-in for a vLLM server, for tests and the local demo.
 *
 * It behaves like vLLM where Thaw can see it: a slow start (weights read from
 * a file at a set rate) during which connections are refused (the port is
 * bound, not listening; --while-loading 503 answers 503 instead), the OpenAI endpoints with
 * a fixed prefill time and a per-request decode speed, a bounded batch with a
 * FIFO queue behind it, and /metrics with vLLM's names. --exporter-only
 * drops the model and only exports metrics whose generation counters grow at
 * rates the test sets, for the scaler's tests.
 *
 * Layers: fv_options (flags), fv_openai (JSON bodies, no I/O), fv_metrics
 * (numbers and exposition, no I/O); this file holds the event loop, HTTP
 * glue, the loader and the request scheduler. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/util.h>
#include <jansson.h>

#include "alloc.h"
#include "clock.h"
#include "fv_metrics.h"
#include "fv_openai.h"
#include "fv_options.h"
#include "log.h"

/* Weight loading reads in slices from a timer so the loop keeps answering
 * /health (503) while it loads, like vLLM's API server does not block. */
#define LOAD_TICK_MS 10
#define LOAD_CHUNK_BYTES (1024 * 1024)
#define LOAD_MAX_BYTES_PER_TICK (8 * LOAD_CHUNK_BYTES)
/* A streaming client that stops reading is dropped past this much unsent data. */
#define STREAM_MAX_PENDING_BYTES (4 * 1024 * 1024)
#define MAX_HEADERS_BYTES (64 * 1024)
#define MAX_MODELS 256
#define ERRLEN 512

enum fv_server_state { FV_LOADING, FV_READY };

/* A generation request's lifecycle. GONE: the client disconnected; the
 * request waits for its own timer callback to be freed (never freed inside
 * libevent's connection-close callback). */
enum fv_req_state { FV_REQ_QUEUED, FV_REQ_PREFILL, FV_REQ_DECODING, FV_REQ_GONE };

struct fv_req;
TAILQ_HEAD(fv_req_list, fv_req);

struct fv_loader {
    int fd;
    uint64_t done;
    int64_t start_us;
    struct event *timer;
    char *buf;
};

struct fv_app {
    struct fv_options opt;
    struct event_base *base;
    struct evhttp *http;
    struct event *sig_term;
    struct event *sig_int;
    struct fv_model_metrics *models;
    size_t nmodels;
    enum fv_server_state state;
    int unlistened_fd; /* --while-loading refuse: bound, listen() at readiness; -1: none */
    struct fv_loader load;
    int64_t start_us;
    long long created;
    struct fv_req_list queue;  /* QUEUED, FIFO */
    struct fv_req_list active; /* PREFILL, DECODING, GONE */
    uint64_t rng;
    struct evbuffer *scratch;
    int exit_code;
};

struct fv_req {
    struct fv_app *app;
    struct evhttp_request *req;       /* NULL once libevent owns/freed it */
    struct evhttp_connection *evcon;  /* NULL once the connection is gone */
    int owns_req;                     /* libevent detached req from a dead connection */
    struct event *timer;              /* prefill, per-token ticks, deferred free */
    struct event *watch;              /* read readiness: client hung up? */
    struct fv_req_list *list;
    TAILQ_ENTRY(fv_req) link;
    enum fv_req_state state;
    int in_batch; /* holds one of the max_batch slots */
    struct fv_gen_request gen;
    long produced;
    int headers_sent;
    int64_t arrival_us;
    int64_t first_us;
    int64_t last_token_us; /* for vllm:inter_token_latency_seconds */
    long long created;
    char id[48];
};

static const char *req_state_to_str(enum fv_req_state s)
{
    switch (s) {
    case FV_REQ_QUEUED:
        return "queued";
    case FV_REQ_PREFILL:
        return "prefill";
    case FV_REQ_DECODING:
        return "decoding";
    case FV_REQ_GONE:
        return "gone";
    }
    return "unknown";
}

static void req_set_state(struct fv_req *r, enum fv_req_state s)
{
    LOG_DEBUG("request_state", "id=%s from=%s to=%s produced=%ld", r->id,
              req_state_to_str(r->state), req_state_to_str(s), r->produced);
    r->state = s;
}

/* splitmix64: ids only need to be unique-looking, not secret. */
static uint64_t next_random(struct fv_app *app)
{
    uint64_t z = (app->rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static struct fv_model_metrics *served(struct fv_app *app) { return &app->models[0]; }

/* ---- HTTP replies ---- */

static const char *reason_phrase(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 413:
        return "Payload Too Large";
    case 500:
        return "Internal Server Error";
    case 503:
        return "Service Unavailable";
    default:
        return "Error";
    }
}

static int dump_to_evbuffer(const char *buf, size_t size, void *data)
{
    return evbuffer_add(data, buf, size);
}

/* Sends doc as the JSON body; takes ownership of doc (NULL: out of memory). */
static void send_json(struct fv_app *app, struct evhttp_request *req, int status, json_t *doc)
{
    struct evbuffer *b = app->scratch;
    if (!doc || json_dump_callback(doc, dump_to_evbuffer, b, JSON_COMPACT) < 0 ||
        evbuffer_add(b, "\n", 1) < 0) {
        json_decref(doc);
        evbuffer_drain(b, evbuffer_get_length(b));
        LOG_ERROR("reply_failed", "status=%d reason=out_of_memory", status);
        evhttp_send_error(req, 500, NULL);
        return;
    }
    json_decref(doc);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "application/json");
    evhttp_send_reply(req, status, reason_phrase(status), b);
    evbuffer_drain(b, evbuffer_get_length(b));
}

static void send_error_json(struct fv_app *app, struct evhttp_request *req, int status,
                            const char *message)
{
    send_json(app, req, status, fv_openai_error(status, message));
}

/* FastAPI's shape for routing errors ({"detail": ...}), as vLLM answers them. */
static void send_detail(struct fv_app *app, struct evhttp_request *req, int status)
{
    send_json(app, req, status, json_pack("{s:s}", "detail", reason_phrase(status)));
}

/* ---- request scheduler ---- */

static void list_remove(struct fv_req *r)
{
    if (!r->list)
        return;
    TAILQ_REMOVE(r->list, r, link);
    if (r->list == &r->app->queue)
        served(r->app)->waiting--;
    r->list = NULL;
}

static void list_append(struct fv_req_list *list, struct fv_req *r)
{
    list_remove(r);
    TAILQ_INSERT_TAIL(list, r, link);
    r->list = list;
    if (list == &r->app->queue)
        served(r->app)->waiting++;
}

/* Stops watching the client and unhooks from its connection, so libevent
 * callbacks never reach r again. */
static void req_detach(struct fv_req *r)
{
    if (r->watch)
        event_del(r->watch);
    if (r->evcon)
        evhttp_connection_set_closecb(r->evcon, NULL, NULL);
    r->evcon = NULL;
}


/* Frees r and what it owns and gives back its batch slot. The evhttp request
 * must be answered already, or left to libevent (r->req NULL), or detached
 * and ours to free (owns_req). */
static void req_free(struct fv_req *r)
{
    if (!r)
        return;
    req_detach(r);
    list_remove(r);
    if (r->in_batch)
        served(r->app)->running--;
    if (r->owns_req && r->req)
        evhttp_request_free(r->req);
    /* libevent allows freeing an event from inside its own callback. */
    if (r->timer)
        event_free(r->timer);
    if (r->watch)
        event_free(r->watch);
    thaw_free(r);
}

/* evtimer_add only fails when libevent cannot grow its timer heap; running
 * the callback at once then is better than a request that never finishes. */
static void arm_timer_us(struct fv_req *r, int64_t delay_us)
{
    if (delay_us < 0)
        delay_us = 0;
    struct timeval tv = {.tv_sec = (time_t)(delay_us / 1000000),
                         .tv_usec = (suseconds_t)(delay_us % 1000000)};
    if (evtimer_add(r->timer, &tv) < 0) {
        LOG_WARN("timer_add_failed", "id=%s", r->id);
        event_active(r->timer, EV_TIMEOUT, 1);
    }
}

/* Moves queued requests into free batch slots; each starts its prefill. */
static void sched_pump(struct fv_app *app)
{
    struct fv_model_metrics *m = served(app);
    struct fv_req *r;
    while (m->running < app->opt.max_batch && (r = TAILQ_FIRST(&app->queue)) != NULL) {
        list_append(&app->active, r);
        r->in_batch = 1;
        m->running++;
        fv_metrics_observe(&m->queue, (double)(clock_mono_us() - r->arrival_us) / 1e6);
        req_set_state(r, FV_REQ_PREFILL);
        arm_timer_us(r, (int64_t)app->opt.ttft_ms * 1000);
    }
}

/* Ends a request the server gives up on by closing its connection (vLLM
 * aborts the same way), then frees it. Only from our own event callbacks:
 * never from inside an evhttp callback. */
static void req_abort(struct fv_req *r, const char *why)
{
    struct fv_app *app = r->app;
    struct evhttp_connection *evcon = r->evcon;
    LOG_INFO("request_aborted", "id=%s reason=%s state=%s produced=%ld", r->id, why,
             req_state_to_str(r->state), r->produced);
    req_detach(r);
    if (evcon) {
        /* Frees the connection and the request attached to it. */
        evhttp_connection_free(evcon);
        r->req = NULL;
    }
    req_free(r);
    sched_pump(app);
}

static size_t pending_output(const struct fv_req *r)
{
    if (!r->evcon)
        return 0;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(r->evcon);
    return bev ? evbuffer_get_length(bufferevent_get_output(bev)) : 0;
}

/* Sends one server-sent event "data: <doc>\n\n" as its own HTTP chunk, so
 * it leaves at once. Takes ownership of doc. Returns 0, or -1 when out of memory. */
static int stream_event(struct fv_req *r, json_t *doc)
{
    struct evbuffer *b = r->app->scratch;
    int rc = -1;
    if (doc && evbuffer_add(b, "data: ", 6) == 0 &&
        json_dump_callback(doc, dump_to_evbuffer, b, JSON_COMPACT) == 0 &&
        evbuffer_add(b, "\n\n", 2) == 0) {
        evhttp_send_reply_chunk(r->req, b);
        rc = 0;
    }
    json_decref(doc);
    evbuffer_drain(b, evbuffer_get_length(b));
    return rc;
}

static int stream_done_marker(struct fv_req *r)
{
    struct evbuffer *b = r->app->scratch;
    int rc = evbuffer_add(b, "data: [DONE]\n\n", 14);
    if (rc == 0)
        evhttp_send_reply_chunk(r->req, b);
    evbuffer_drain(b, evbuffer_get_length(b));
    return rc;
}

/* vLLM sends the response headers with the first token, not before. */
static int stream_start(struct fv_req *r)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(r->req);
    if (evhttp_add_header(h, "Content-Type", "text/event-stream; charset=utf-8") < 0 ||
        evhttp_add_header(h, "Cache-Control", "no-cache") < 0)
        return -1;
    evhttp_send_reply_start(r->req, 200, "OK");
    r->headers_sent = 1;
    if (r->gen.api == FV_API_CHAT)
        return stream_event(r, fv_openai_role_chunk(r->id, r->created, r->app->opt.model));
    return 0;
}

/* Produces the next token: counted at once, so rate() over the counter
 * follows live decoding; streamed if asked for. Returns 0, or -1 when r was
 * aborted (and freed). */
static int emit_token(struct fv_req *r)
{
    struct fv_app *app = r->app;
    long k = r->produced++;
    served(app)->generation_tokens += 1;
    int64_t now_us = clock_mono_us();
    if (k > 0)
        fv_metrics_observe(&served(app)->itl, (double)(now_us - r->last_token_us) / 1e6);
    r->last_token_us = now_us;
    if (!r->gen.stream)
        return 0;
    if (!r->headers_sent && stream_start(r) < 0) {
        req_abort(r, "out_of_memory");
        return -1;
    }
    int last = r->produced >= r->gen.max_tokens;
    if (stream_event(r, fv_openai_chunk(&r->gen, r->id, r->created, app->opt.model, k, last)) <
        0) {
        req_abort(r, "out_of_memory");
        return -1;
    }
    if (pending_output(r) > STREAM_MAX_PENDING_BYTES) {
        req_abort(r, "client_not_reading");
        return -1;
    }
    return 0;
}

static void req_finish(struct fv_req *r)
{
    struct fv_app *app = r->app;
    struct fv_model_metrics *m = served(app);
    struct evhttp_request *req = r->req;
    m->request_success++;
    fv_metrics_observe(&m->e2e, (double)(clock_mono_us() - r->arrival_us) / 1e6);
    /* Unhook first: a reply to a "Connection: close" request frees the
     * connection at once, and its close callback must not reach r. */
    req_detach(r);
    if (r->gen.stream) {
        if (r->gen.include_usage &&
            stream_event(r, fv_openai_usage_chunk(&r->gen, r->id, r->created, app->opt.model,
                                                  r->produced)) < 0)
            LOG_WARN("usage_chunk_failed", "id=%s reason=out_of_memory", r->id);
        if (stream_done_marker(r) < 0)
            LOG_WARN("done_marker_failed", "id=%s reason=out_of_memory", r->id);
        evhttp_send_reply_end(req);
    } else {
        send_json(app, req, 200,
                  fv_openai_response(&r->gen, r->id, r->created, app->opt.model, r->produced));
    }
    r->req = NULL;
    LOG_DEBUG("request_done", "id=%s tokens=%ld ms=%lld", r->id, r->produced,
              (long long)((clock_mono_us() - r->arrival_us) / 1000));
    req_free(r);
    sched_pump(app);
}

static void on_req_timer(evutil_socket_t fd, short what, void *arg)
{
    struct fv_req *r = arg;
    struct fv_app *app = r->app;
    (void)fd;
    (void)what;
    if (r->state == FV_REQ_GONE) {
        LOG_INFO("client_gone", "id=%s produced=%ld max_tokens=%ld", r->id, r->produced,
                 r->gen.max_tokens);
        req_free(r);
        sched_pump(app);
        return;
    }
    if (r->state == FV_REQ_QUEUED)
        return; /* not armed while queued; nothing to do */
    int64_t now = clock_mono_us();
    if (r->state == FV_REQ_PREFILL) {
        struct fv_model_metrics *m = served(app);
        r->first_us = now;
        m->prompt_tokens += (uint64_t)r->gen.prompt_tokens;
        /* Like vLLM, time to first token counts from arrival, queueing included. */
        fv_metrics_observe(&m->ttft, (double)(now - r->arrival_us) / 1e6);
        req_set_state(r, FV_REQ_DECODING);
    }
    if (emit_token(r) < 0)
        return;
    if (r->produced >= r->gen.max_tokens) {
        req_finish(r);
        return;
    }
    /* Token k is due at first + k/tps: scheduling from the first token keeps
     * the rate exact however late single callbacks run. */
    double interval_us = 1e6 / app->opt.tokens_per_second;
    int64_t due = r->first_us + (int64_t)((double)r->produced * interval_us);
    arm_timer_us(r, due - now);
}

/* The request's connection was readable while we owe it a reply: a hang-up
 * (EOF or error) aborts the request; data means the client pipelined its
 * next request, so it is alive and we stop watching. */
static void on_req_watch(evutil_socket_t fd, short what, void *arg)
{
    struct fv_req *r = arg;
    char c;
    (void)what;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0)
        return;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        if (event_add(r->watch, NULL) < 0)
            LOG_WARN("watch_add_failed", "id=%s", r->id);
        return;
    }
    req_abort(r, n == 0 ? "client_closed" : "client_error");
}

/* libevent is tearing the connection down (a write failed, or a timeout).
 * Called from inside libevent: only mark r and let its timer free it. */
static void on_conn_close(struct evhttp_connection *evcon, void *arg)
{
    struct fv_req *r = arg;
    struct fv_app *app = r->app;
    (void)evcon;
    /* A request still being answered is detached from a dying connection and
     * left for us to free; one still attached dies with the connection. */
    if (r->req && evhttp_request_get_connection(r->req) == NULL)
        r->owns_req = 1;
    else
        r->req = NULL;
    if (r->watch)
        event_del(r->watch);
    r->evcon = NULL;
    if (r->list == &app->queue)
        list_append(&app->active, r); /* out of the queue, so no slot goes to it */
    req_set_state(r, FV_REQ_GONE);
    event_del(r->timer);
    event_active(r->timer, EV_TIMEOUT, 1);
}

/* ---- HTTP handlers ---- */

/* Returns the request body as a string view; len 0 gives "". NULL when out of memory. */
static const char *request_body(struct evhttp_request *req, size_t *len)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    *len = evbuffer_get_length(in);
    if (*len == 0)
        return "";
    return (const char *)evbuffer_pullup(in, -1);
}

static void handle_generate(struct fv_app *app, struct evhttp_request *req, enum fv_api api)
{
    char err[ERRLEN];
    size_t len;
    const char *body = request_body(req, &len);
    if (!body) {
        send_error_json(app, req, 500, "out of memory");
        return;
    }
    struct fv_parse_limits lim = {app->opt.model, app->opt.max_tokens_default,
                                  app->opt.max_model_len};
    struct fv_gen_request gen;
    int rc = fv_openai_parse(api, body, len, &lim, &gen, err, sizeof(err));
    if (rc != FV_OPENAI_OK) {
        send_error_json(app, req, rc == FV_OPENAI_ENOMODEL ? 404 : 400, err);
        return;
    }
    struct fv_model_metrics *m = served(app);
    if (m->running >= app->opt.max_batch && m->waiting >= app->opt.max_queue) {
        LOG_WARN("queue_full", "waiting=%ld max_queue=%ld", m->waiting, app->opt.max_queue);
        send_error_json(app, req, 503, "The server is overloaded: the request queue is full.");
        return;
    }
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    struct fv_req *r = thaw_calloc(1, sizeof(*r));
    if (r) {
        r->app = app;
        r->timer = evtimer_new(app->base, on_req_timer, r);
        if (fd >= 0)
            r->watch = event_new(app->base, fd, EV_READ, on_req_watch, r);
    }
    if (!r || !evcon || !r->timer || (fd >= 0 && !r->watch)) {
        req_free(r);
        send_error_json(app, req, 500, "out of memory");
        return;
    }
    r->req = req;
    r->evcon = evcon;
    r->gen = gen;
    r->state = FV_REQ_QUEUED;
    r->arrival_us = clock_mono_us();
    r->first_us = -1;
    r->created = (long long)(clock_unix_ms() / 1000);
    snprintf(r->id, sizeof(r->id), "%s-%016" PRIx64 "%016" PRIx64,
             api == FV_API_CHAT ? "chatcmpl" : "cmpl", next_random(app), next_random(app));
    evhttp_connection_set_closecb(evcon, on_conn_close, r);
    if (r->watch && event_add(r->watch, NULL) < 0) {
        /* Without the watch a hang-up still shows when a write fails. */
        LOG_WARN("watch_add_failed", "id=%s", r->id);
        event_free(r->watch);
        r->watch = NULL;
    }
    LOG_DEBUG("request_accepted", "id=%s stream=%d max_tokens=%ld prompt_tokens=%ld", r->id,
              gen.stream, gen.max_tokens, gen.prompt_tokens);
    list_append(&app->queue, r);
    sched_pump(app);
}

static void handle_completions(struct fv_app *app, struct evhttp_request *req)
{
    handle_generate(app, req, FV_API_COMPLETIONS);
}

static void handle_chat(struct fv_app *app, struct evhttp_request *req)
{
    handle_generate(app, req, FV_API_CHAT);
}

static void handle_health(struct fv_app *app, struct evhttp_request *req)
{
    (void)app;
    evhttp_send_reply(req, 200, "OK", NULL);
}

static void handle_models(struct fv_app *app, struct evhttp_request *req)
{
    send_json(app, req, 200, fv_openai_models(app->opt.model, app->created, app->opt.max_model_len));
}

static void handle_metrics(struct fv_app *app, struct evhttp_request *req)
{
    int64_t now = clock_mono_ms();
    for (size_t i = 0; i < app->nmodels; i++)
        fv_metrics_accrue(&app->models[i], now);
    struct evbuffer *b = app->scratch;
    if (fv_metrics_render(b, app->models, app->nmodels) < 0 ||
        evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                          "text/plain; version=0.0.4; charset=utf-8") < 0) {
        evbuffer_drain(b, evbuffer_get_length(b));
        evhttp_send_error(req, 500, NULL);
        return;
    }
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_drain(b, evbuffer_get_length(b));
}

/* Reads an optional count field into *out: 0 absent, 1 set, -1 invalid. */
static int admin_count(json_t *root, const char *key, long *out)
{
    json_t *v = json_object_get(root, key);
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 100000000)
        return -1;
    *out = (long)json_integer_value(v);
    return 1;
}

/* POST /admin/rate {"model": "a", "rate": 123} (exporter mode). "running"
 * and "waiting" may set those gauges too, for tests of queue-based signals. */
static void handle_admin_rate(struct fv_app *app, struct evhttp_request *req)
{
    size_t len;
    const char *body = request_body(req, &len);
    if (!body) {
        send_error_json(app, req, 500, "out of memory");
        return;
    }
    json_t *root = json_loadb(body, len, 0, NULL);
    json_t *name = json_object_get(root, "model");
    json_t *rate = json_object_get(root, "rate");
    long running = 0, waiting = 0;
    int has_running = admin_count(root, "running", &running);
    int has_waiting = admin_count(root, "waiting", &waiting);
    if (!json_is_object(root) || !json_is_string(name) || (rate && !json_is_number(rate)) ||
        (rate && !(json_number_value(rate) >= 0 && json_number_value(rate) <= 1e9)) ||
        has_running < 0 || has_waiting < 0 || (!rate && !has_running && !has_waiting)) {
        json_decref(root);
        send_error_json(app, req, 400,
                        "want {\"model\": NAME, \"rate\": tokens/s >= 0} (optional "
                        "\"running\", \"waiting\": counts)");
        return;
    }
    struct fv_model_metrics *m = NULL;
    for (size_t i = 0; i < app->nmodels && !m; i++) {
        if (strcmp(app->models[i].name, json_string_value(name)) == 0)
            m = &app->models[i];
    }
    if (!m) {
        json_decref(root);
        send_error_json(app, req, 404, "no such model");
        return;
    }
    if (rate)
        fv_metrics_set_rate(m, json_number_value(rate), clock_mono_ms());
    if (has_running)
        m->running = running;
    if (has_waiting)
        m->waiting = waiting;
    json_decref(root);
    char qname[160];
    LOG_INFO("rate_set", "model=%s rate=%g running=%ld waiting=%ld",
             log_quote(qname, sizeof(qname), m->name), m->rate, m->running, m->waiting);
    send_json(app, req, 200,
              json_pack("{s:s, s:f, s:i, s:i}", "model", m->name, "rate", m->rate, "running",
                        (int)m->running, "waiting", (int)m->waiting));
}

enum fv_method { FV_GET, FV_POST };
enum { FV_MODE_SERVE = 1, FV_MODE_EXPORTER = 2 };

struct fv_route {
    const char *path;
    enum fv_method method;
    int modes;
    void (*handler)(struct fv_app *app, struct evhttp_request *req);
};

static const struct fv_route routes[] = {
    {"/health", FV_GET, FV_MODE_SERVE | FV_MODE_EXPORTER, handle_health},
    {"/metrics", FV_GET, FV_MODE_SERVE | FV_MODE_EXPORTER, handle_metrics},
    {"/v1/models", FV_GET, FV_MODE_SERVE, handle_models},
    {"/v1/completions", FV_POST, FV_MODE_SERVE, handle_completions},
    {"/v1/chat/completions", FV_POST, FV_MODE_SERVE, handle_chat},
    {"/admin/rate", FV_POST, FV_MODE_EXPORTER, handle_admin_rate},
};

static void on_http_request(struct evhttp_request *req, void *arg)
{
    struct fv_app *app = arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    int mode = app->opt.exporter_only ? FV_MODE_EXPORTER : FV_MODE_SERVE;
    if (!path || !*path)
        path = "/";
    const struct fv_route *route = NULL;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]) && !route; i++) {
        if ((routes[i].modes & mode) && strcmp(routes[i].path, path) == 0)
            route = &routes[i];
    }
    if (!route) {
        send_detail(app, req, 404);
        return;
    }
    int method_ok = route->method == FV_GET ? (cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD)
                                            : cmd == EVHTTP_REQ_POST;
    if (!method_ok) {
        send_detail(app, req, 405);
        return;
    }
    if (app->state == FV_LOADING) {
        /* --while-loading 503 (real vLLM is not listening yet: the default,
         * refuse, does that). */
        send_error_json(app, req, 503, "the model is loading");
        return;
    }
    route->handler(app, req);
}

/* ---- weight loading ---- */

static void become_ready(struct fv_app *app)
{
    app->state = FV_READY;
    if (app->unlistened_fd >= 0) {
        /* vLLM's server starts listening once its engine is up. */
        int fd = app->unlistened_fd;
        app->unlistened_fd = -1;
        if (listen(fd, 1024) < 0 || evutil_make_socket_nonblocking(fd) < 0 ||
            !evhttp_accept_socket_with_handle(app->http, fd)) {
            LOG_ERROR("listen_failed", "errno=%d", errno);
            close(fd);
            app->exit_code = 1;
            event_base_loopexit(app->base, NULL);
            return;
        }
    }
    char qmodel[160];
    LOG_INFO("ready", "model=%s load_ms=%lld weights_bytes=%" PRIu64,
             log_quote(qmodel, sizeof(qmodel), app->opt.model),
             (long long)((clock_mono_us() - app->start_us) / 1000), app->load.done);
}

static void arm_load_timer(struct fv_app *app, long ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000};
    if (evtimer_add(app->load.timer, &tv) < 0) {
        LOG_WARN("timer_add_failed", "what=load");
        event_active(app->load.timer, EV_TIMEOUT, 1);
    }
}

static void weights_read_done(struct fv_app *app)
{
    struct fv_loader *l = &app->load;
    close(l->fd);
    l->fd = -1;
    thaw_free(l->buf);
    l->buf = NULL;
    LOG_INFO("weights_loaded", "bytes=%" PRIu64 " ms=%lld", l->done,
             (long long)((clock_mono_us() - l->start_us) / 1000));
    if (app->opt.load_delay_ms > 0)
        arm_load_timer(app, app->opt.load_delay_ms);
    else
        become_ready(app);
}

/* One loading slice: reads what the rate allows by now (bounded per tick),
 * then yields to the loop. With the file read, the timer serves the fixed
 * extra delay. */
static void on_load_tick(evutil_socket_t fd_unused, short what, void *arg)
{
    struct fv_app *app = arg;
    struct fv_loader *l = &app->load;
    (void)fd_unused;
    (void)what;
    if (l->fd < 0) {
        become_ready(app);
        return;
    }
    uint64_t budget = LOAD_MAX_BYTES_PER_TICK;
    double rate = app->opt.weights_read_mbps * 1e6; /* bytes/s */
    if (rate > 0) {
        double allowed = rate * (double)(clock_mono_us() - l->start_us) / 1e6;
        double left = allowed - (double)l->done;
        budget = left <= 0 ? 0 : left < (double)budget ? (uint64_t)left : budget;
    }
    while (budget > 0) {
        size_t want = budget < LOAD_CHUNK_BYTES ? (size_t)budget : LOAD_CHUNK_BYTES;
        ssize_t n = read(l->fd, l->buf, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            LOG_ERROR("weights_read_failed", "errno=%d error=\"%s\"", errno, strerror(errno));
            app->exit_code = 1;
            event_base_loopexit(app->base, NULL);
            return;
        }
        if (n == 0) {
            weights_read_done(app);
            return;
        }
        l->done += (uint64_t)n;
        budget -= (uint64_t)n;
    }
    arm_load_timer(app, rate > 0 ? LOAD_TICK_MS : 0);
}

/* Opens the weights file (failing fast if it cannot) and starts loading. */
static int loader_start(struct fv_app *app)
{
    struct fv_loader *l = &app->load;
    l->start_us = clock_mono_us();
    l->timer = evtimer_new(app->base, on_load_tick, app);
    if (!l->timer)
        return -1;
    if (app->opt.weights_file) {
        char qpath[512];
        log_quote(qpath, sizeof(qpath), app->opt.weights_file);
        l->fd = open(app->opt.weights_file, O_RDONLY | O_CLOEXEC);
        if (l->fd < 0) {
            LOG_ERROR("weights_open_failed", "path=%s errno=%d", qpath, errno);
            return -1;
        }
        struct stat st;
        long long size = fstat(l->fd, &st) == 0 ? (long long)st.st_size : -1;
        l->buf = thaw_malloc(LOAD_CHUNK_BYTES);
        if (!l->buf) {
            LOG_ERROR("out_of_memory", "what=weights_buffer");
            return -1;
        }
        LOG_INFO("loading", "weights_file=%s bytes=%lld read_mbps=%g delay_ms=%ld", qpath, size,
                 app->opt.weights_read_mbps, app->opt.load_delay_ms);
        arm_load_timer(app, 0);
    } else if (app->opt.load_delay_ms > 0) {
        LOG_INFO("loading", "delay_ms=%ld", app->opt.load_delay_ms);
        arm_load_timer(app, app->opt.load_delay_ms);
    } else {
        become_ready(app);
    }
    return 0;
}

/* ---- setup and teardown ---- */

/* "a,b" or "a=100,b=2500": exporter-mode models with their rates. */
static int setup_models(struct fv_app *app, char *err, size_t errlen)
{
    const char *spec = app->opt.models ? app->opt.models : app->opt.model;
    size_t n = 1;
    for (const char *p = spec; *p; p++)
        n += *p == ',';
    if (n > MAX_MODELS) {
        snprintf(err, errlen, "--models: at most %d models", MAX_MODELS);
        return -1;
    }
    if (!app->opt.exporter_only && app->opt.models) {
        snprintf(err, errlen, "--models needs --exporter-only; use --model to name the served model");
        return -1;
    }
    if (!app->opt.exporter_only && app->opt.generation_rate > 0)
        LOG_WARN("option_ignored", "option=generation-rate reason=needs_exporter_only");
    app->models = thaw_calloc(n, sizeof(*app->models));
    char *copy = thaw_strdup(spec);
    if (!app->models || !copy) {
        thaw_free(copy);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int64_t now = clock_mono_ms();
    char *save = NULL;
    int rc = 0;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        double rate = app->opt.generation_rate;
        if (eq) {
            char *end;
            *eq = '\0';
            errno = 0;
            rate = strtod(eq + 1, &end);
            if (errno || end == eq + 1 || *end || !(rate >= 0 && rate <= 1e9)) {
                snprintf(err, errlen, "--models: bad rate \"%s\" for \"%s\"", eq + 1, item);
                rc = -1;
                break;
            }
        }
        int dup = 0;
        for (size_t i = 0; i < app->nmodels; i++)
            dup |= strcmp(app->models[i].name, item) == 0;
        if (!*item || dup) {
            snprintf(err, errlen, "--models: empty or repeated model name \"%s\"", item);
            rc = -1;
            break;
        }
        if (fv_metrics_init(&app->models[app->nmodels], item, app->opt.max_batch) < 0) {
            snprintf(err, errlen, "out of memory");
            rc = -1;
            break;
        }
        if (app->opt.exporter_only)
            fv_metrics_set_rate(&app->models[app->nmodels], rate, now);
        app->nmodels++;
    }
    thaw_free(copy);
    if (rc == 0 && app->nmodels == 0) {
        snprintf(err, errlen, "no model name given");
        rc = -1;
    }
    return rc;
}

/* "HOST:PORT", "[v6]:PORT". */
static int parse_listen(const char *s, char *host, size_t hostlen, int *port)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s)
        return -1;
    const char *h = s;
    size_t hl = (size_t)(colon - s);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl == 0 || hl >= hostlen)
        return -1;
    memcpy(host, h, hl);
    host[hl] = '\0';
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end || p < 0 || p > 65535)
        return -1;
    *port = (int)p;
    return 0;
}

/* Written to a temporary name and renamed, so a reader never sees half a number. */
static int write_port_file(const char *path, int port)
{
    size_t n = strlen(path) + 5;
    char *tmp = thaw_malloc(n);
    if (!tmp)
        return -1;
    snprintf(tmp, n, "%s.tmp", path);
    int rc = -1;
    FILE *f = fopen(tmp, "w");
    if (f) {
        int wrote = fprintf(f, "%d\n", port) > 0;
        if (fclose(f) == 0 && wrote && rename(tmp, path) == 0)
            rc = 0;
        else
            unlink(tmp);
    }
    thaw_free(tmp);
    return rc;
}

static int bound_port(struct evhttp_bound_socket *bound)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&ss, &sl) < 0)
        return -1;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)(void *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)(void *)&ss)->sin6_port);
    return -1;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct fv_app *app = arg;
    (void)what;
    LOG_INFO("shutdown", "signal=%d", (int)sig);
    event_base_loopexit(app->base, NULL);
}

static int start_http(struct fv_app *app)
{
    char host[256];
    int port;
    char qlisten[300];
    log_quote(qlisten, sizeof(qlisten), app->opt.listen);
    if (parse_listen(app->opt.listen, host, sizeof(host), &port) < 0) {
        LOG_ERROR("bad_option", "option=listen value=%s want=HOST:PORT", qlisten);
        return -1;
    }
    app->http = evhttp_new(app->base);
    if (!app->http)
        return -1;
    evhttp_set_gencb(app->http, on_http_request, app);
    evhttp_set_max_body_size(app->http, app->opt.max_body_bytes);
    evhttp_set_max_headers_size(app->http, MAX_HEADERS_BYTES);
    evhttp_set_allowed_methods(app->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD);
    /* Read an oversized body to its end before answering 413, so the client
     * sees the status instead of a reset. */
    if (evhttp_set_flags(app->http, EVHTTP_SERVER_LINGERING_CLOSE) < 0)
        return -1;
    int actual = -1;
    bool refuse = !app->opt.exporter_only && strcmp(app->opt.while_loading, "refuse") == 0;
    if (refuse) {
        /* Bound, so the port is ours, but not listening: connections are
         * refused until the model is loaded, as with vLLM. */
        struct sockaddr_storage ss;
        int sslen = 0;
        memset(&ss, 0, sizeof(ss));
        struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
        if (evutil_inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
            in4->sin_family = AF_INET;
            in4->sin_port = htons((uint16_t)port);
            sslen = (int)sizeof(*in4);
        } else if (evutil_inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
            in6->sin6_family = AF_INET6;
            in6->sin6_port = htons((uint16_t)port);
            sslen = (int)sizeof(*in6);
        }
        if (sslen == 0) {
            LOG_ERROR("bad_option", "option=listen value=%s want=IP:PORT (--while-loading refuse)",
                      qlisten);
            return -1;
        }
        int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
            bind(fd, (struct sockaddr *)&ss, (socklen_t)sslen) < 0) {
            LOG_ERROR("bind_failed", "listen=%s errno=%d", qlisten, errno);
            if (fd >= 0)
                close(fd);
            return -1;
        }
        app->unlistened_fd = fd;
        struct sockaddr_storage got;
        socklen_t gotlen = sizeof(got);
        if (getsockname(fd, (struct sockaddr *)&got, &gotlen) == 0)
            actual = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                                     : ((struct sockaddr_in *)&got)->sin_port);
    } else {
        struct evhttp_bound_socket *bound =
            evhttp_bind_socket_with_handle(app->http, host, (ev_uint16_t)port);
        if (!bound) {
            LOG_ERROR("bind_failed", "listen=%s errno=%d", qlisten, errno);
            return -1;
        }
        actual = bound_port(bound);
    }
    if (actual < 0) {
        LOG_ERROR("getsockname_failed", "errno=%d", errno);
        return -1;
    }
    char qmodel[160];
    LOG_INFO("listening", "port=%d host=%s mode=%s model=%s while_loading=%s", actual, host,
             app->opt.exporter_only ? "exporter" : "serve",
             log_quote(qmodel, sizeof(qmodel), app->opt.model),
             app->opt.exporter_only ? "-" : refuse ? "refuse" : "503");
    if (app->opt.port_file && write_port_file(app->opt.port_file, actual) < 0) {
        char qpath[512];
        LOG_ERROR("port_file_failed", "path=%s errno=%d",
                  log_quote(qpath, sizeof(qpath), app->opt.port_file), errno);
        return -1;
    }
    return 0;
}

static int app_run(struct fv_app *app)
{
    char err[ERRLEN];
    char qerr[ERRLEN + 16];
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_IGN;
    /* A client gone mid-reply must give EPIPE, not kill the server. */
    if (sigaction(SIGPIPE, &sa, NULL) < 0)
        return 1;
    if (setup_models(app, err, sizeof(err)) < 0) {
        LOG_ERROR("bad_option", "error=%s", log_quote(qerr, sizeof(qerr), err));
        return 2;
    }
    app->base = event_base_new();
    app->scratch = evbuffer_new();
    if (!app->base || !app->scratch) {
        LOG_ERROR("out_of_memory", "what=event_base");
        return 1;
    }
    app->sig_term = evsignal_new(app->base, SIGTERM, on_signal, app);
    app->sig_int = evsignal_new(app->base, SIGINT, on_signal, app);
    if (!app->sig_term || !app->sig_int || event_add(app->sig_term, NULL) < 0 ||
        event_add(app->sig_int, NULL) < 0) {
        LOG_ERROR("signal_setup_failed", NULL);
        return 1;
    }
    if (strcmp(app->opt.while_loading, "refuse") != 0 && strcmp(app->opt.while_loading, "503") != 0) {
        LOG_ERROR("bad_option", "option=while-loading want=refuse|503");
        return 1;
    }
    app->start_us = clock_mono_us();
    app->created = (long long)(clock_unix_ms() / 1000);
    app->rng = (uint64_t)clock_unix_ms() ^ ((uint64_t)getpid() << 32);
    if (start_http(app) < 0)
        return 1;
    if (app->opt.exporter_only) {
        app->state = FV_READY;
        LOG_INFO("ready", "mode=exporter models=%zu load_ms=0", app->nmodels);
    } else if (loader_start(app) < 0) {
        return 1;
    }
    if (event_base_dispatch(app->base) < 0) {
        LOG_ERROR("event_loop_failed", NULL);
        return 1;
    }
    return app->exit_code;
}

/* Gives up on every request at shutdown. Requests still attached to a live
 * connection die with it in evhttp_free; detached ones are ours. */
static void discard_requests(struct fv_app *app)
{
    struct fv_req *r;
    while ((r = TAILQ_FIRST(&app->queue)) != NULL || (r = TAILQ_FIRST(&app->active)) != NULL) {
        req_detach(r);
        if (!r->owns_req)
            r->req = NULL;
        req_free(r);
    }
}

static void app_cleanup(struct fv_app *app)
{
    if (app->unlistened_fd >= 0)
        close(app->unlistened_fd);
    discard_requests(app);
    if (app->http)
        evhttp_free(app->http);
    if (app->load.timer)
        event_free(app->load.timer);
    if (app->load.fd >= 0)
        close(app->load.fd);
    thaw_free(app->load.buf);
    if (app->sig_term)
        event_free(app->sig_term);
    if (app->sig_int)
        event_free(app->sig_int);
    if (app->scratch)
        evbuffer_free(app->scratch);
    for (size_t i = 0; i < app->nmodels; i++)
        fv_metrics_finish(&app->models[i]);
    thaw_free(app->models);
    if (app->base)
        event_base_free(app->base);
    fv_options_finish(&app->opt);
}

int main(int argc, char **argv)
{
    /* Route the libraries' allocations through alloc.h too (before any use). */
    json_set_alloc_funcs(thaw_malloc, thaw_free);
    event_set_mem_functions(thaw_malloc, thaw_realloc, thaw_free);

    struct fv_app app;
    memset(&app, 0, sizeof(app));
    app.load.fd = -1;
    app.unlistened_fd = -1;
    TAILQ_INIT(&app.queue);
    TAILQ_INIT(&app.active);

    char err[ERRLEN];
    char qerr[ERRLEN + 16];
    int rc = fv_options_parse(&app.opt, argc, argv, err, sizeof(err));
    if (rc == 1) {
        /* Usage text is the program's output here, not a log line. */
        fv_options_usage(stdout, argv[0]);
        fv_options_finish(&app.opt);
        return 0;
    }
    if (rc < 0) {
        LOG_ERROR("bad_option", "error=%s", log_quote(qerr, sizeof(qerr), err));
        fv_options_finish(&app.opt);
        return 2;
    }
    enum log_level level;
    if (log_level_parse(app.opt.log_level, &level) < 0) {
        LOG_ERROR("bad_option", "option=log-level value=%s",
                  log_quote(qerr, sizeof(qerr), app.opt.log_level));
        fv_options_finish(&app.opt);
        return 2;
    }
    log_set_level(level);

    int exit_code = app_run(&app);
    app_cleanup(&app);
    libevent_global_shutdown();
    LOG_INFO("exit", "code=%d", exit_code);
    return exit_code;
}
