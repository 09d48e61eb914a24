/* grpc_server: a gRPC server over HTTP/2, cleartext (prior knowledge) or TLS
 * with ALPN h2 (common/tls.h), on nghttp2 and libevent, for unary and
 * server-streaming methods.
 *
 * The server owns connections and streams. A handler gets one decoded
 * request message (the bytes; protobuf decoding is the handler's) and a call
 * handle. Unary handlers send one message and finish, usually at once; a
 * streaming handler keeps the call, sends messages whenever it likes and
 * learns of the peer going away through the cancel callback.
 *
 * Promises: malformed HTTP/2 closes only that connection, after a GOAWAY
 * (over TLS too; once it has left); unknown
 * methods get UNIMPLEMENTED; a wrong content-type gets HTTP 415; a request
 * message over max_message gets RESOURCE_EXHAUSTED; zero or several request
 * messages, or one cut short, get INTERNAL; requests in progress hold at most
 * max_request_bytes among them, server-wide (a peer that announces big
 * messages on many streams cannot take the memory: the call that would go
 * over gets RESOURCE_EXHAUSTED); a request not complete within
 * request_timeout_ms of its headers has its stream reset; responses waiting
 * for the peer are bounded per connection, over all its streams (a send past
 * it fails); a connection that has not sent the HTTP/2 preface and SETTINGS
 * within 10 s of its accept (TLS handshake included; a deadline, not an idle
 * time) is closed, one that has may idle; calls and latency are counted per
 * method and status.
 * Single-threaded: everything runs on the given event loop. */
#ifndef THAW_GRPC_SERVER_H
#define THAW_GRPC_SERVER_H

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct evbuffer;
struct grpc_server;
struct grpc_call;
struct tls_server;

/* msg is valid during the call only (it is freed when the handler returns). */
typedef void (*grpc_handler_fn)(void *ud, struct grpc_call *call, const uint8_t *msg,
                                size_t len);
/* Called once when a call ends without the handler finishing it (peer reset,
 * connection lost, server shutdown). The call must not be used after it. */
typedef void (*grpc_cancel_fn)(void *ud, struct grpc_call *call);

struct grpc_method {
    const char *path; /* "/package.Service/Method" */
    grpc_handler_fn handler;
    void *ud;
};

struct grpc_server_limits {
    size_t max_message;          /* request message bound; default 4 MiB */
    uint32_t max_streams;        /* per connection (SETTINGS); default 1000 */
    size_t max_streams_total;    /* open at once, all connections; 0: no bound; past it a
                                    new stream is reset with REFUSED_STREAM */
    size_t max_connections;      /* default 10000; extra ones are closed at accept */
    size_t max_output_buffer;    /* per connection, before backpressure; default 1 MiB */
    size_t max_request_bytes;    /* held by requests in progress, server-wide; default 64 MiB */
    int64_t request_timeout_ms;  /* headers to the request's end; default 10 s */
};

/* methods (and the strings in them) must outlive the server. limits may be
 * NULL for defaults. Returns NULL on allocation failure. */
struct grpc_server *grpc_server_new(struct event_base *base, const struct grpc_method *methods,
                                    size_t nmethods, const struct grpc_server_limits *limits);
/* Closes every connection at once (cancel callbacks run). Accepts NULL. */
void grpc_server_free(struct grpc_server *srv);

/* Serves TLS on connections accepted from now on (NULL: cleartext again).
 * Does not take ownership: tls must outlive the server. Reloading its
 * certificate affects new connections only. */
void grpc_server_set_tls(struct grpc_server *srv, struct tls_server *tls);

/* Binds host:port (port 0 picks one) and starts accepting. *bound_port gets
 * the port. Returns 0, or -1 with err filled. */
int grpc_server_listen(struct grpc_server *srv, const char *host, int port, int *bound_port,
                       char *err, size_t errlen);

/* Graceful stop: stops accepting, sends GOAWAY, ends open streaming calls
 * with OK (cancel callbacks run so owners forget them), and lets in-flight
 * unary calls finish. Connections close when their streams are done. */
void grpc_server_shutdown(struct grpc_server *srv);
size_t grpc_server_connection_count(const struct grpc_server *srv);
/* Bytes held by requests in progress (the budget in use). */
size_t grpc_server_request_bytes(const struct grpc_server *srv);

/* Queues one response message (copied). Returns 0, or -1 if the call is
 * finished, out of memory, or already has max_output_buffer bytes waiting
 * for a peer that does not read. */
int grpc_call_send(struct grpc_call *call, const uint8_t *msg, size_t len);
/* Ends the call with a status and message (may be NULL); the call handle is
 * invalid afterwards. */
void grpc_call_finish(struct grpc_call *call, int status, const char *message);
void grpc_call_set_cancel(struct grpc_call *call, grpc_cancel_fn fn, void *ud);
/* Index of the method in the table given to grpc_server_new. */
size_t grpc_call_method_index(const struct grpc_call *call);
/* "127.0.0.1:53312" of the peer. */
const char *grpc_call_peer(const struct grpc_call *call);

/* Writes thaw-prefixed gRPC metrics: <prefix>_grpc_server_handled_total{method,code},
 * <prefix>_grpc_server_handling_seconds{method} (histogram),
 * <prefix>_grpc_server_connections, <prefix>_grpc_server_streams_open. */
void grpc_server_write_metrics(const struct grpc_server *srv, struct evbuffer *out,
                               const char *prefix);

#endif
