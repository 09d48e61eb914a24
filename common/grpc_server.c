#include "grpc_server.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <arpa/inet.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <nghttp2/nghttp2.h>

#include "alloc.h"
#include "clock.h"
#include "expo.h"
#include "grpc_frame.h"
#include "log.h"
#include "tcp_opts.h"
#include "tls.h"

#define UNKNOWN_METHOD ((size_t)-1)
/* Time a new connection has to send the HTTP/2 preface and its SETTINGS. */
#define GRPC_GREETING_TIMEOUT_SECONDS 10

struct conn;

struct grpc_call {
    struct conn *conn;
    int32_t stream_id;
    size_t method; /* index, or UNKNOWN_METHOD */
    int is_post;
    int content_type_ok;
    struct grpc_reader reader;
    uint8_t *request;
    size_t request_len;
    size_t request_bytes; /* charged to the server's budget: the reader's buffer and request */
    struct event *upload_timer; /* until the request has ended: reset the stream at expiry */
    int messages;
    int responded;  /* a response (or error) has been submitted */
    int handed;     /* the handler owns the call until finish or cancel */
    int finished;   /* status decided; trailers follow the queued messages */
    int status;
    char status_msg[256];
    struct evbuffer *out; /* queued response bytes (framed messages) */
    grpc_cancel_fn cancel;
    void *cancel_ud;
    int64_t start_us;
    struct grpc_call *prev, *next; /* in conn->calls */
};

struct conn {
    struct grpc_server *srv;
    struct bufferevent *bev;
    nghttp2_session *session;
    struct grpc_call *calls;
    size_t ncalls;
    int in_nghttp2; /* inside mem_recv/mem_send: flushing is done by the caller */
    int greeted;    /* the client preface and a first frame arrived */
    struct event *flush_ev; /* flushes sends made outside nghttp2 callbacks, batched */
    struct event *greet_ev; /* the greeting's deadline, from accept */
    int is_tls;
    int tls_ready; /* handshake done with ALPN h2 */
    int closing;   /* refused after the handshake: freed on the next loop turn */
    int broken;    /* the peer went away or errored: no close_notify */
    size_t queued; /* response bytes in the calls' out buffers, not yet given to nghttp2 */
    char peer[64];
    struct conn *prev, *next;
};

struct method_stats {
    uint64_t handled[GRPC_STATUS_COUNT];
    struct expo_histogram latency;
};

struct grpc_server {
    struct event_base *base;
    const struct grpc_method *methods;
    size_t nmethods;
    struct grpc_server_limits limits;
    struct evconnlistener *listener;
    struct tls_server *tls; /* NULL: cleartext */
    struct conn *conns;
    size_t nconns;
    size_t streams_open;
    size_t request_bytes; /* held by requests in progress, at most limits.max_request_bytes */
    uint64_t requests_over_budget;
    uint64_t request_timeouts;
    uint64_t streams_refused; /* past limits.max_streams_total */
    nghttp2_option *h2_option; /* every connection's session options */
    int64_t over_budget_logged_ms; /* one log line per 10 s at most */
    int64_t streams_full_logged_ms;
    int shutting_down;
    uint64_t connections_rejected;
    uint64_t accept_pauses;       /* out of descriptors or memory: accepting paused */
    struct event *accept_resume;  /* re-enables the listener after a pause */
    struct method_stats *stats; /* nmethods + 1, the last for unknown paths */
};

static void conn_free(struct conn *c);
static void conn_flush(struct conn *c);

/* Sends from outside nghttp2's callbacks are flushed on the next loop turn,
 * never synchronously: the caller may be walking a list of calls that a
 * connection failure (and its cancel callbacks) would change under it. */
static void conn_schedule_flush(struct conn *c)
{
    if (!c->in_nghttp2 && !event_pending(c->flush_ev, EV_TIMEOUT, NULL))
        event_active(c->flush_ev, EV_TIMEOUT, 0);
}

/* ---- response side ---------------------------------------------------- */

#define MAKE_NV(n, v, vlen)                                                                   \
    {                                                                                         \
        (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (vlen), NGHTTP2_NV_FLAG_NO_COPY_NAME   \
    }

static int submit_trailers(struct grpc_call *call)
{
    char status[16];
    char msg[768];
    snprintf(status, sizeof(status), "%d", call->status);
    grpc_percent_encode(msg, sizeof(msg), call->status_msg);
    nghttp2_nv nva[] = {
        MAKE_NV("grpc-status", status, strlen(status)),
        MAKE_NV("grpc-message", msg, strlen(msg)),
    };
    size_t n = msg[0] ? 2 : 1;
    return nghttp2_submit_trailer(call->conn->session, call->stream_id, nva, n);
}

static ssize_t data_read_cb(nghttp2_session *session, int32_t stream_id, uint8_t *buf,
                            size_t length, uint32_t *data_flags, nghttp2_data_source *source,
                            void *user_data)
{
    struct grpc_call *call = source->ptr;
    size_t have = evbuffer_get_length(call->out);
    size_t n = have < length ? have : length;
    if (n > 0) {
        evbuffer_remove(call->out, buf, n);
        call->conn->queued -= n;
    }
    if (n == have) {
        if (call->finished) {
            *data_flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
            if (submit_trailers(call) != 0)
                return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        } else if (n == 0) {
            return NGHTTP2_ERR_DEFERRED;
        }
    }
    return (ssize_t)n;
}

static void record_done(struct grpc_call *call)
{
    struct grpc_server *srv = call->conn->srv;
    size_t idx = call->method == UNKNOWN_METHOD ? srv->nmethods : call->method;
    int st = (call->status >= 0 && call->status < GRPC_STATUS_COUNT) ? call->status
                                                                     : GRPC_STATUS_UNKNOWN;
    srv->stats[idx].handled[st]++;
    expo_histogram_observe(&srv->stats[idx].latency,
                           (double)(clock_mono_us() - call->start_us) / 1e6);
}

/* Submits the response headers, with the data provider when messages follow.
 * Every response says the request encodings the server takes (identity only):
 * a client that compressed gets UNIMPLEMENTED with the list, as the gRPC
 * compression spec asks, and may retry uncompressed. */
static int submit_headers(struct grpc_call *call, int trailers_only)
{
    char status[16];
    char msg[768];
    call->responded = 1;
    if (trailers_only) {
        snprintf(status, sizeof(status), "%d", call->status);
        grpc_percent_encode(msg, sizeof(msg), call->status_msg);
        nghttp2_nv nva[] = {
            MAKE_NV(":status", "200", 3),
            MAKE_NV("content-type", "application/grpc", 16),
            MAKE_NV("grpc-accept-encoding", "identity", 8),
            MAKE_NV("grpc-status", status, strlen(status)),
            MAKE_NV("grpc-message", msg, strlen(msg)),
        };
        return nghttp2_submit_response(call->conn->session, call->stream_id, nva,
                                       msg[0] ? 5 : 4, NULL);
    }
    nghttp2_nv nva[] = {
        MAKE_NV(":status", "200", 3),
        MAKE_NV("content-type", "application/grpc", 16),
        MAKE_NV("grpc-accept-encoding", "identity", 8),
    };
    nghttp2_data_provider prd;
    prd.source.ptr = call;
    prd.read_callback = data_read_cb;
    return nghttp2_submit_response(call->conn->session, call->stream_id, nva, 3, &prd);
}

static void call_fail(struct grpc_call *call, int status, const char *message)
{
    if (call->responded)
        return;
    call->finished = 1;
    call->status = status;
    snprintf(call->status_msg, sizeof(call->status_msg), "%s", message ? message : "");
    record_done(call);
    if (submit_headers(call, 1) != 0)
        nghttp2_submit_rst_stream(call->conn->session, NGHTTP2_FLAG_NONE, call->stream_id,
                                  NGHTTP2_INTERNAL_ERROR);
}

int grpc_call_send(struct grpc_call *call, const uint8_t *msg, size_t len)
{
    if (call->finished || len > UINT32_MAX)
        return -1;
    /* A peer that stops reading (or keeps its flow-control window shut) must
     * not make us buffer without bound: what waits is counted per connection,
     * over all its streams (1 000 streams of 1 MiB each would be 1 GiB). */
    if (call->conn->queued + GRPC_FRAME_HEADER_LEN + len > call->conn->srv->limits.max_output_buffer)
        return -1;
    uint8_t hdr[GRPC_FRAME_HEADER_LEN];
    grpc_frame_header(hdr, (uint32_t)len);
    /* Room first, so that a failure adds nothing: half a frame would garble
     * the stream. */
    if (evbuffer_expand(call->out, sizeof(hdr) + len) != 0 ||
        evbuffer_add(call->out, hdr, sizeof(hdr)) != 0 ||
        (len && evbuffer_add(call->out, msg, len) != 0))
        return -1;
    call->conn->queued += sizeof(hdr) + len;
    if (!call->responded) {
        if (submit_headers(call, 0) != 0)
            return -1;
    } else {
        nghttp2_session_resume_data(call->conn->session, call->stream_id);
    }
    conn_schedule_flush(call->conn);
    return 0;
}

void grpc_call_finish(struct grpc_call *call, int status, const char *message)
{
    if (call->finished)
        return;
    call->handed = 0;
    call->cancel = NULL;
    if (!call->responded) {
        call_fail(call, status, message);
    } else {
        call->finished = 1;
        call->status = status;
        snprintf(call->status_msg, sizeof(call->status_msg), "%s", message ? message : "");
        record_done(call);
        nghttp2_session_resume_data(call->conn->session, call->stream_id);
    }
    conn_schedule_flush(call->conn);
}

void grpc_call_set_cancel(struct grpc_call *call, grpc_cancel_fn fn, void *ud)
{
    call->cancel = fn;
    call->cancel_ud = ud;
}

size_t grpc_call_method_index(const struct grpc_call *call) { return call->method; }
const char *grpc_call_peer(const struct grpc_call *call) { return call->conn->peer; }

/* ---- request side ----------------------------------------------------- */

static void call_release(struct grpc_call *call, int run_cancel)
{
    struct conn *c = call->conn;
    if (run_cancel && call->handed && !call->finished && call->cancel) {
        grpc_cancel_fn fn = call->cancel;
        call->cancel = NULL;
        call->finished = 1;
        call->status = GRPC_STATUS_CANCELLED;
        record_done(call);
        fn(call->cancel_ud, call);
    }
    if (call->prev)
        call->prev->next = call->next;
    else
        c->calls = call->next;
    if (call->next)
        call->next->prev = call->prev;
    c->ncalls--;
    c->srv->streams_open--;
    if (call->upload_timer)
        event_free(call->upload_timer);
    grpc_reader_finish(&call->reader);
    thaw_free(call->request);
    c->srv->request_bytes -= call->request_bytes;
    c->queued -= evbuffer_get_length(call->out);
    evbuffer_free(call->out);
    thaw_free(call);
}

/* The reader's budget: bytes held by requests in progress, server-wide. */
static int call_reserve(void *ud, size_t bytes)
{
    struct grpc_call *call = ud;
    struct grpc_server *srv = call->conn->srv;
    if (bytes > srv->limits.max_request_bytes - srv->request_bytes)
        return -1;
    srv->request_bytes += bytes;
    call->request_bytes += bytes;
    return 0;
}

static void call_uncharge(struct grpc_call *call, size_t bytes)
{
    if (bytes > call->request_bytes)
        bytes = call->request_bytes;
    call->request_bytes -= bytes;
    call->conn->srv->request_bytes -= bytes;
}

/* After an error response the rest of the upload is discarded: the part
 * already read goes now, not when the peer ends the stream. */
static void call_drop_upload(struct grpc_call *call)
{
    call_uncharge(call, call->reader.msg_cap);
    grpc_reader_finish(&call->reader);
}

/* A request that has not ended within the timeout (a peer that announces a
 * message and stalls, or keeps uploading after an error reply) would hold
 * its stream and its part of the budget for as long as it likes. */
static void upload_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct grpc_call *call = arg;
    struct conn *c = call->conn;
    if (!call->responded) {
        c->srv->request_timeouts++;
        call->responded = 1;
        call->finished = 1;
        call->status = GRPC_STATUS_DEADLINE_EXCEEDED;
        record_done(call);
    }
    LOG_INFO("grpc_request_timeout", "peer=%s stream=%d timeout_ms=%lld", c->peer,
             call->stream_id, (long long)c->srv->limits.request_timeout_ms);
    call_drop_upload(call);
    nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, call->stream_id, NGHTTP2_CANCEL);
    conn_schedule_flush(c);
}

static int on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    struct conn *c = user_data;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    struct grpc_server *srv = c->srv;
    /* Each open stream costs about 1 KiB, whatever its request holds: the
     * per-connection SETTINGS bound times the connections is no bound. A
     * refused stream is one gRPC clients may retry. */
    if (srv->limits.max_streams_total && srv->streams_open >= srv->limits.max_streams_total) {
        srv->streams_refused++;
        if (log_throttle(&srv->streams_full_logged_ms, clock_mono_ms()))
            LOG_WARN("grpc_streams_full", "peer=%s streams_open=%zu limit=%zu refused_total=%llu",
                     c->peer, srv->streams_open, srv->limits.max_streams_total,
                     (unsigned long long)srv->streams_refused);
        if (nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id,
                                      NGHTTP2_REFUSED_STREAM) != 0)
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    struct grpc_call *call = thaw_calloc(1, sizeof(*call));
    if (!call)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* resets just this stream */
    call->out = evbuffer_new();
    call->upload_timer = evtimer_new(c->srv->base, upload_timeout_cb, call);
    struct timeval upload = {(time_t)(c->srv->limits.request_timeout_ms / 1000),
                             (suseconds_t)(c->srv->limits.request_timeout_ms % 1000 * 1000)};
    if (!call->out || !call->upload_timer || evtimer_add(call->upload_timer, &upload) != 0) {
        if (call->out)
            evbuffer_free(call->out);
        if (call->upload_timer)
            event_free(call->upload_timer);
        thaw_free(call);
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    call->conn = c;
    call->stream_id = frame->hd.stream_id;
    call->method = UNKNOWN_METHOD;
    call->start_us = clock_mono_us();
    grpc_reader_init(&call->reader, c->srv->limits.max_message, call_reserve, call);
    call->next = c->calls;
    if (c->calls)
        c->calls->prev = call;
    c->calls = call;
    c->ncalls++;
    c->srv->streams_open++;
    nghttp2_session_set_stream_user_data(session, frame->hd.stream_id, call);
    return 0;
}

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user_data)
{
    struct conn *c = user_data;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    struct grpc_call *call = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (!call)
        return 0;
    if (namelen == 5 && memcmp(name, ":path", 5) == 0) {
        for (size_t i = 0; i < c->srv->nmethods; i++) {
            const char *p = c->srv->methods[i].path;
            if (strlen(p) == valuelen && memcmp(p, value, valuelen) == 0) {
                call->method = i;
                break;
            }
        }
    } else if (namelen == 7 && memcmp(name, ":method", 7) == 0) {
        call->is_post = (valuelen == 4 && memcmp(value, "POST", 4) == 0);
    } else if (namelen == 12 && memcmp(name, "content-type", 12) == 0) {
        /* application/grpc, optionally +proto, then optionally ;params.
         * Another subtype (+json) names an encoding this server does not
         * speak: decoding it as protobuf would answer garbage. */
        size_t sub = 16;
        if (valuelen >= 22 && memcmp(value + 16, "+proto", 6) == 0)
            sub = 22;
        call->content_type_ok = valuelen >= 16 && memcmp(value, "application/grpc", 16) == 0 &&
                                (valuelen == sub || value[sub] == ';');
    }
    return 0;
}

static void reject_http(struct grpc_call *call, const char *status_code)
{
    nghttp2_nv nva[] = {
        MAKE_NV(":status", status_code, strlen(status_code)),
        MAKE_NV("content-type", "text/plain", 10),
    };
    call->responded = 1;
    call->finished = 1;
    call->status = GRPC_STATUS_INTERNAL;
    record_done(call);
    nghttp2_submit_response(call->conn->session, call->stream_id, nva, 2, NULL);
}

static void dispatch(struct grpc_call *call)
{
    struct grpc_server *srv = call->conn->srv;
    if (call->responded)
        return;
    if (call->messages != 1 || grpc_reader_partial(&call->reader)) {
        call_fail(call, GRPC_STATUS_INTERNAL,
                  grpc_reader_partial(&call->reader) ? "request ended in the middle of a message"
                  : call->messages == 0             ? "expected one request message, got none"
                                                    : "expected one request message, got several");
        return;
    }
    const struct grpc_method *m = &srv->methods[call->method];
    call->handed = 1;
    /* dispatch runs inside nghttp2_session_mem_recv, where no stream is
     * closed: the call outlives the handler even if it finished it. */
    m->handler(m->ud, call, call->request, call->request_len);
    thaw_free(call->request);
    call->request = NULL;
    call_uncharge(call, call->request_len + 1);
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    struct conn *c = user_data;
    if (frame->hd.type == NGHTTP2_SETTINGS && !(frame->hd.flags & NGHTTP2_FLAG_ACK) &&
        !c->greeted) {
        /* A peer that has spoken HTTP/2 may idle as long as it likes (KEDA
         * keeps connections between polls); one that never does loses its
         * slot after the greeting timeout set at accept. */
        c->greeted = 1;
        event_del(c->greet_ev);
    }
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA)
        return 0;
    struct grpc_call *call = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (!call)
        return 0;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
        if (!call->is_post)
            reject_http(call, "405");
        else if (!call->content_type_ok)
            reject_http(call, "415");
        else if (call->method == UNKNOWN_METHOD)
            call_fail(call, GRPC_STATUS_UNIMPLEMENTED, "unknown method");
    }
    if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) {
        event_del(call->upload_timer); /* the request has ended */
        dispatch(call);
    }
    return 0;
}

static int on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id,
                         const uint8_t *data, size_t len, void *user_data)
{
    struct grpc_call *call = nghttp2_session_get_stream_user_data(session, stream_id);
    if (!call || call->responded)
        return 0; /* after an error response the rest of the upload is discarded */
    while (len > 0) {
        size_t used = 0;
        enum grpc_read_result r = grpc_reader_feed(&call->reader, data, len, &used);
        data += used;
        len -= used;
        if (r == GRPC_READ_MESSAGE) {
            size_t mlen = 0;
            uint8_t *m = grpc_reader_take_message(&call->reader, &mlen);
            if (++call->messages == 1) {
                call->request = m;
                call->request_len = mlen;
            } else {
                /* A unary request has one message; dispatch refuses the call. */
                thaw_free(m);
                call_uncharge(call, mlen + 1);
            }
            continue;
        }
        struct grpc_server *srv = call->conn->srv;
        if (r == GRPC_READ_TOO_LARGE) {
            char msg[128];
            snprintf(msg, sizeof(msg), "request message larger than the limit of %zu bytes",
                     srv->limits.max_message);
            call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
        } else if (r == GRPC_READ_OVER_BUDGET) {
            srv->requests_over_budget++;
            if (log_throttle(&srv->over_budget_logged_ms, clock_mono_ms())) {
                LOG_WARN("grpc_request_budget_full",
                         "peer=%s held_bytes=%zu limit_bytes=%zu refused_total=%llu", call->conn->peer,
                         srv->request_bytes, srv->limits.max_request_bytes,
                         (unsigned long long)srv->requests_over_budget);
            }
            char msg[160];
            snprintf(msg, sizeof(msg),
                     "requests in progress hold %zu bytes, the limit is %zu: retry later",
                     srv->request_bytes, srv->limits.max_request_bytes);
            call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
        } else if (r == GRPC_READ_NOMEM) {
            call_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        } else if (r == GRPC_READ_COMPRESSED) {
            call_fail(call, GRPC_STATUS_UNIMPLEMENTED,
                      "compressed request but no grpc-encoding is supported");
        } else if (r < 0) {
            call_fail(call, GRPC_STATUS_INTERNAL, grpc_read_result_to_str(r));
        }
        if (r < 0) {
            call_drop_upload(call);
            return 0;
        }
    }
    return 0;
}

static int on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code,
                           void *user_data)
{
    struct grpc_call *call = nghttp2_session_get_stream_user_data(session, stream_id);
    if (!call)
        return 0;
    nghttp2_session_set_stream_user_data(session, stream_id, NULL);
    call_release(call, 1);
    return 0;
}

/* ---- connections ------------------------------------------------------ */

static void conn_maybe_close(struct conn *c)
{
    if (!nghttp2_session_want_read(c->session) && !nghttp2_session_want_write(c->session) &&
        evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        conn_free(c);
}

/* Serializes pending frames into the socket buffer, up to the output bound.
 * The write callback continues when the socket drains. */
static void conn_flush(struct conn *c)
{
    if (c->closing) {
        conn_free(c);
        return;
    }
    if (c->in_nghttp2)
        return;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    c->in_nghttp2 = 1;
    while (evbuffer_get_length(out) < c->srv->limits.max_output_buffer) {
        const uint8_t *data = NULL;
        ssize_t n = nghttp2_session_mem_send(c->session, &data);
        if (n < 0) {
            c->in_nghttp2 = 0;
            LOG_WARN("grpc_conn_error", "peer=%s error=\"%s\"", c->peer, nghttp2_strerror((int)n));
            conn_free(c);
            return;
        }
        if (n == 0)
            break;
        if (evbuffer_add(out, data, (size_t)n) != 0) {
            c->in_nghttp2 = 0;
            conn_free(c);
            return;
        }
    }
    c->in_nghttp2 = 0;
    /* The bytes leave when epoll reports the socket writable, one loop turn
     * later. Writing them here (write_now) was measured on 2026-12-05: the
     * same at one call at a time, 146 000 and 113 000 GetMetrics/s against
     * 155 000 and 138 000 at -c 10 -m 10 (bench/grpc_getmetrics.sh, two
     * alternating runs), where a turn's replies otherwise leave in one
     * writev. */
    conn_maybe_close(c);
}

static void conn_read_cb(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    struct evbuffer_iovec vec[8];
    c->in_nghttp2 = 1;
    /* Feed the chunks in place; no pullup copy. */
    while (evbuffer_get_length(in) > 0) {
        int nvec = evbuffer_peek(in, -1, NULL, vec, 8);
        if (nvec > 8)
            nvec = 8;
        size_t total = 0;
        for (int i = 0; i < nvec; i++) {
            ssize_t r = nghttp2_session_mem_recv(c->session, vec[i].iov_base, vec[i].iov_len);
            if (r < 0) {
                c->in_nghttp2 = 0;
                LOG_INFO("grpc_conn_protocol_error", "peer=%s error=\"%s\"", c->peer,
                         nghttp2_strerror((int)r));
                /* Tell the peer why and close. nghttp2 queues a GOAWAY by
                 * itself for some errors only (not for a bad preface or a
                 * CONTINUATION flood); a second one after its own is
                 * harmless. */
                if (nghttp2_session_terminate_session(
                        c->session, r == NGHTTP2_ERR_FLOODED ? NGHTTP2_ENHANCE_YOUR_CALM
                                                             : NGHTTP2_PROTOCOL_ERROR) != 0 ||
                    bufferevent_disable(c->bev, EV_READ) != 0) {
                    conn_free(c);
                    return;
                }
                /* Nothing more is read. The GOAWAY leaves like any frame
                 * (through OpenSSL too), and conn_maybe_close frees the
                 * connection once nghttp2 has sent it and the output has
                 * drained, as after nghttp2's own GOAWAYs; a peer that does
                 * not read it keeps its connection as an idle peer would. */
                conn_flush(c);
                return;
            }
            total += vec[i].iov_len;
        }
        evbuffer_drain(in, total);
    }
    c->in_nghttp2 = 0;
    conn_flush(c);
}

static void conn_write_cb(struct bufferevent *bev, void *arg) { conn_flush(arg); }

static void conn_flush_ev_cb(evutil_socket_t fd, short what, void *arg) { conn_flush(arg); }

/* A deadline, not an idle timer: a peer sending one byte every few seconds
 * must not keep its slot for ever. */
static void conn_greeting_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    if (c->is_tls && !c->tls_ready && !c->closing)
        tls_server_handshake_failed(c->srv->tls, c->bev, BEV_EVENT_READING | BEV_EVENT_TIMEOUT,
                                    c->peer);
    LOG_DEBUG("grpc_greeting_timeout", "peer=%s timeout_s=%d", c->peer,
              GRPC_GREETING_TIMEOUT_SECONDS);
    c->broken = 1;
    conn_free(c);
}

static void conn_event_cb(struct bufferevent *bev, short events, void *arg)
{
    struct conn *c = arg;
    if (events & BEV_EVENT_CONNECTED) {
        /* Only TLS bufferevents report this: the handshake is done. */
        if (c->is_tls && tls_server_handshake_done(c->srv->tls, bev, c->peer) == 0) {
            c->tls_ready = 1;
            return;
        }
        /* libevent is still inside its handshake step: close on the next turn. */
        c->closing = 1;
        bufferevent_disable(bev, EV_READ | EV_WRITE);
        event_active(c->flush_ev, EV_TIMEOUT, 0);
        return;
    }
    if (events & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)) {
        if (c->is_tls && !c->tls_ready && !c->closing)
            tls_server_handshake_failed(c->srv->tls, bev, events, c->peer);
        c->broken = 1;
        conn_free(c);
    }
}

static void conn_free(struct conn *c)
{
    if (!c)
        return;
    struct grpc_server *srv = c->srv;
    /* nghttp2_session_del does not report stream closes: cancel calls ourselves. */
    while (c->calls)
        call_release(c->calls, 1);
    nghttp2_session_del(c->session);
    if (c->tls_ready && !c->broken)
        tls_conn_close_notify(c->bev);
    bufferevent_free(c->bev);
    if (c->flush_ev)
        event_free(c->flush_ev);
    if (c->greet_ev)
        event_free(c->greet_ev);
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv->nconns--;
    thaw_free(c);
}

static nghttp2_session_callbacks *make_callbacks(void)
{
    nghttp2_session_callbacks *cbs = NULL;
    if (nghttp2_session_callbacks_new(&cbs) != 0)
        return NULL;
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    return cbs;
}

static void accept_cb(struct evconnlistener *listener, evutil_socket_t fd, struct sockaddr *sa,
                      int socklen, void *arg)
{
    struct grpc_server *srv = arg;
    if (srv->shutting_down || srv->nconns >= srv->limits.max_connections) {
        srv->connections_rejected++;
        evutil_closesocket(fd);
        return;
    }
    struct conn *c = thaw_calloc(1, sizeof(*c));
    if (!c) {
        evutil_closesocket(fd);
        return;
    }
    (void)tcp_opts_apply(fd);
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)(void *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)(void *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        port = ntohs(in6->sin6_port);
    }
    snprintf(c->peer, sizeof(c->peer), "%s:%d", host, port);
    c->srv = srv;
    c->is_tls = srv->tls != NULL;
    /* The TLS bufferevent closes fd itself when it cannot be made. */
    c->bev = c->is_tls ? tls_server_accept(srv->tls, srv->base, fd)
                       : bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->flush_ev = event_new(srv->base, -1, 0, conn_flush_ev_cb, c);
    c->greet_ev = evtimer_new(srv->base, conn_greeting_timeout_cb, c);
    nghttp2_session_callbacks *cbs = make_callbacks();
    struct timeval greeting = {GRPC_GREETING_TIMEOUT_SECONDS, 0};
    if (!c->bev || !c->flush_ev || !c->greet_ev || evtimer_add(c->greet_ev, &greeting) != 0 ||
        !cbs || nghttp2_session_server_new2(&c->session, cbs, c, srv->h2_option) != 0) {
        nghttp2_session_callbacks_del(cbs);
        if (c->flush_ev)
            event_free(c->flush_ev);
        if (c->greet_ev)
            event_free(c->greet_ev);
        if (c->bev)
            bufferevent_free(c->bev);
        else if (!c->is_tls)
            evutil_closesocket(fd);
        thaw_free(c);
        return;
    }
    nghttp2_session_callbacks_del(cbs);
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    srv->nconns++;
    nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, srv->limits.max_streams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20},
    };
    nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, settings, 2);
    bufferevent_setcb(c->bev, conn_read_cb, conn_write_cb, conn_event_cb, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    conn_flush(c);
}

/* ---- server ----------------------------------------------------------- */

#define ACCEPT_PAUSE_MS 500

static void accept_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    struct grpc_server *srv = arg;
    if (srv->listener && !srv->shutting_down)
        evconnlistener_enable(srv->listener);
}

/* accept() failing with EMFILE leaves the connection pending, so the listener
 * would fire again at once: a busy loop. Pause accepting instead (as nginx
 * does) and log once per pause; the pending connections wait in the backlog. */
static void accept_error_cb(struct evconnlistener *listener, void *arg)
{
    int err = EVUTIL_SOCKET_ERROR();
    struct grpc_server *s = arg;
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        s->accept_pauses++;
        LOG_WARN("accept_paused", "error=\"%s\" pause_ms=%d connections=%zu",
                 evutil_socket_error_to_string(err), ACCEPT_PAUSE_MS, s->nconns);
        evconnlistener_disable(listener);
        struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};
        evtimer_add(s->accept_resume, &tv);
    } else {
        LOG_DEBUG("accept_failed", "error=\"%s\"", evutil_socket_error_to_string(err));
    }
}

struct grpc_server *grpc_server_new(struct event_base *base, const struct grpc_method *methods,
                                    size_t nmethods, const struct grpc_server_limits *limits)
{
    struct grpc_server *srv = thaw_calloc(1, sizeof(*srv));
    if (!srv)
        return NULL;
    srv->base = base;
    srv->methods = methods;
    srv->nmethods = nmethods;
    if (limits)
        srv->limits = *limits;
    if (!srv->limits.max_message)
        srv->limits.max_message = GRPC_DEFAULT_MAX_MESSAGE;
    if (!srv->limits.max_streams)
        srv->limits.max_streams = 1000;
    if (!srv->limits.max_connections)
        srv->limits.max_connections = 10000;
    if (!srv->limits.max_output_buffer)
        srv->limits.max_output_buffer = 1u << 20;
    if (!srv->limits.max_request_bytes)
        srv->limits.max_request_bytes = (size_t)64 << 20;
    if (srv->limits.request_timeout_ms <= 0)
        srv->limits.request_timeout_ms = 10000;
    srv->stats = thaw_calloc(nmethods + 1, sizeof(*srv->stats));
    if (!srv->stats) {
        thaw_free(srv);
        return NULL;
    }
    /* nghttp2 keeps up to SETTINGS_MAX_CONCURRENT_STREAMS closed streams per
     * connection for priorities, which gRPC does not use: at 21 000 streams
     * a connection, 5.4 MiB each after its calls had ended. */
    if (nghttp2_option_new(&srv->h2_option) != 0) {
        grpc_server_free(srv);
        return NULL;
    }
    nghttp2_option_set_no_closed_streams(srv->h2_option, 1);
    for (size_t i = 0; i <= nmethods; i++) {
        if (expo_histogram_init(&srv->stats[i].latency, expo_buckets_fast,
                                expo_buckets_fast_len) != 0) {
            grpc_server_free(srv);
            return NULL;
        }
    }
    return srv;
}

void grpc_server_free(struct grpc_server *srv)
{
    if (!srv)
        return;
    while (srv->conns)
        conn_free(srv->conns);
    if (srv->listener)
        evconnlistener_free(srv->listener);
    if (srv->accept_resume)
        event_free(srv->accept_resume);
    for (size_t i = 0; srv->stats && i <= srv->nmethods; i++)
        expo_histogram_finish(&srv->stats[i].latency);
    thaw_free(srv->stats);
    if (srv->h2_option)
        nghttp2_option_del(srv->h2_option);
    thaw_free(srv);
}

int grpc_server_listen(struct grpc_server *srv, const char *host, int port, int *bound_port,
                       char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    int sslen;
    char spec[300];
    memset(&ss, 0, sizeof(ss));
    snprintf(spec, sizeof(spec), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    /* evutil_parse_sockaddr_port refuses port 0, which tests need. */
    struct sockaddr_in *in4 = (struct sockaddr_in *)(void *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)(void *)&ss;
    if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
        sslen = sizeof(*in4);
    } else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        sslen = sizeof(*in6);
    } else {
        snprintf(err, errlen, "listen address '%s' is not an IP address and port", spec);
        return -1;
    }
    srv->listener = evconnlistener_new_bind(
        srv->base, accept_cb, srv, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
        1024, (struct sockaddr *)&ss, sslen);
    if (srv->listener) {
        srv->accept_resume = evtimer_new(srv->base, accept_resume_cb, srv);
        evconnlistener_set_error_cb(srv->listener, accept_error_cb);
    }
    if (!srv->listener || !srv->accept_resume) {
        snprintf(err, errlen, "bind %s: %s", spec, strerror(errno));
        return -1;
    }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof(bound);
    if (getsockname(evconnlistener_get_fd(srv->listener), (struct sockaddr *)&bound, &blen) == 0) {
        if (bound.ss_family == AF_INET)
            *bound_port = ntohs(((struct sockaddr_in *)(void *)&bound)->sin_port);
        else
            *bound_port = ntohs(((struct sockaddr_in6 *)(void *)&bound)->sin6_port);
    }
    return 0;
}

void grpc_server_shutdown(struct grpc_server *srv)
{
    srv->shutting_down = 1;
    if (srv->listener) {
        evconnlistener_free(srv->listener);
        srv->listener = NULL;
    }
    struct conn *c = srv->conns;
    while (c) {
        struct conn *next = c->next;
        nghttp2_submit_goaway(c->session, NGHTTP2_FLAG_NONE,
                              nghttp2_session_get_last_proc_stream_id(c->session),
                              NGHTTP2_NO_ERROR, NULL, 0);
        /* Streaming calls never end on their own: end them cleanly, telling
         * their owners first so nobody sends on them afterwards. */
        c->in_nghttp2 = 1;
        for (struct grpc_call *call = c->calls; call; call = call->next) {
            if (call->handed && !call->finished) {
                grpc_cancel_fn fn = call->cancel;
                call->cancel = NULL;
                if (fn)
                    fn(call->cancel_ud, call);
                grpc_call_finish(call, GRPC_STATUS_OK, NULL);
            }
        }
        c->in_nghttp2 = 0;
        conn_flush(c);
        c = next;
    }
}

size_t grpc_server_connection_count(const struct grpc_server *srv) { return srv->nconns; }

size_t grpc_server_request_bytes(const struct grpc_server *srv) { return srv->request_bytes; }

void grpc_server_set_tls(struct grpc_server *srv, struct tls_server *tls) { srv->tls = tls; }

void grpc_server_write_metrics(const struct grpc_server *srv, struct evbuffer *out,
                               const char *prefix)
{
    char name[128];
    char labels[256];
    snprintf(name, sizeof(name), "%s_grpc_server_handled_total", prefix);
    expo_family(out, name, "counter", "gRPC calls completed, by method and status code.");
    for (size_t i = 0; i <= srv->nmethods; i++) {
        const char *m = i < srv->nmethods ? srv->methods[i].path : "unknown";
        for (int s = 0; s < GRPC_STATUS_COUNT; s++) {
            if (!srv->stats[i].handled[s] && s != GRPC_STATUS_OK)
                continue;
            expo_labels(labels, sizeof(labels), "method", m, "code", grpc_status_to_str(s),
                        (char *)NULL);
            expo_sample(out, name, labels, (double)srv->stats[i].handled[s]);
        }
    }
    snprintf(name, sizeof(name), "%s_grpc_server_handling_seconds", prefix);
    expo_family(out, name, "histogram",
                "Time from request headers to final status, by method (streams: their lifetime).");
    for (size_t i = 0; i <= srv->nmethods; i++) {
        const char *m = i < srv->nmethods ? srv->methods[i].path : "unknown";
        expo_labels(labels, sizeof(labels), "method", m, (char *)NULL);
        expo_histogram_write(out, name, labels, &srv->stats[i].latency);
    }
    snprintf(name, sizeof(name), "%s_grpc_server_connections", prefix);
    expo_family(out, name, "gauge", "Open gRPC (HTTP/2) connections.");
    expo_sample(out, name, NULL, (double)srv->nconns);
    snprintf(name, sizeof(name), "%s_grpc_server_streams_open", prefix);
    expo_family(out, name, "gauge", "Open gRPC streams, streaming calls included.");
    expo_sample(out, name, NULL, (double)srv->streams_open);
    snprintf(name, sizeof(name), "%s_grpc_server_request_bytes", prefix);
    expo_family(out, name, "gauge",
                "Bytes held by request messages in progress (read, not yet handled).");
    expo_sample(out, name, NULL, (double)srv->request_bytes);
    snprintf(name, sizeof(name), "%s_grpc_server_requests_refused_total", prefix);
    expo_family(out, name, "counter",
                "Calls refused before their request was handled: the budget for requests in "
                "progress was full (over_budget), the request did not end in time (timeout), "
                "or the server held its limit of open streams (streams_full).");
    expo_labels(labels, sizeof(labels), "reason", "over_budget", (char *)NULL);
    expo_sample(out, name, labels, (double)srv->requests_over_budget);
    expo_labels(labels, sizeof(labels), "reason", "streams_full", (char *)NULL);
    expo_sample(out, name, labels, (double)srv->streams_refused);
    expo_labels(labels, sizeof(labels), "reason", "timeout", (char *)NULL);
    expo_sample(out, name, labels, (double)srv->request_timeouts);
    snprintf(name, sizeof(name), "%s_grpc_server_connections_rejected_total", prefix);
    expo_family(out, name, "counter", "Connections closed at accept (limit or shutdown).");
    expo_sample(out, name, NULL, (double)srv->connections_rejected);
    snprintf(name, sizeof(name), "%s_grpc_server_accept_pauses_total", prefix);
    expo_family(out, name, "counter",
                "Times accepting paused because the process ran out of descriptors or memory.");
    expo_sample(out, name, NULL, (double)srv->accept_pauses);
}
