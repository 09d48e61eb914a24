/* tls: server-side TLS (OpenSSL) for the gRPC port, with certificate reload.
 *
 * A tls_server holds the current OpenSSL context built from three PEM files:
 * the certificate chain, its private key and, optionally, a CA bundle that
 * client certificates must chain to (then a client certificate is required:
 * mutual TLS as KEDA's caCert / tlsClientCert / tlsClientKey set it up).
 * TLS 1.2 or later; ALPN must select "h2" (gRPC is HTTP/2 only): a client
 * offering no ALPN, or no "h2", fails the handshake with the
 * no_application_protocol alert.
 *
 * Reload: tls_server_check_reload() stats the files and, when any changed
 * (size, mtime, ctime, inode: a Kubernetes Secret volume swaps a symlink),
 * builds a new context. Success swaps it in for new connections; open
 * connections keep the context they started with (OpenSSL counts references).
 * Failure (unreadable file, key not matching the certificate, a half-written
 * file) is logged and the old context kept; the next change retries.
 *
 * Handshake outcomes are counted by reason for /metrics and logged with the
 * peer: refusals at info, peers that close or time out before a ClientHello
 * (TCP probes, port scanners) at debug.
 *
 * Single-threaded, like the event loop it serves. Errors: functions that can
 * fail return -1 or NULL and fill `err` (a message naming the file). */
#ifndef THAW_TLS_H
#define THAW_TLS_H

#include <stddef.h>
#include <stdint.h>

#include <event2/util.h>

struct bufferevent;
struct event_base;
struct evbuffer;
struct tls_server;

struct tls_server_config {
    const char *cert_file;      /* PEM: leaf certificate first, then intermediates */
    const char *key_file;       /* PEM private key of the leaf */
    const char *client_ca_file; /* PEM CA bundle; NULL or "" asks for no client certificate */
};

/* Why a handshake failed; the label of thaw_*_tls_handshake_failures_total. */
enum tls_failure {
    TLS_FAIL_NOT_TLS,               /* cleartext HTTP/2 or HTTP/1 on the TLS port */
    TLS_FAIL_PROTOCOL_VERSION,      /* below TLS 1.2, or no common version */
    TLS_FAIL_NO_SHARED_CIPHER,
    TLS_FAIL_NO_ALPN_H2,            /* no ALPN, or ALPN without "h2" */
    TLS_FAIL_CLIENT_CERT_MISSING,   /* mutual TLS on, the client sent none */
    TLS_FAIL_CLIENT_CERT_REJECTED,  /* did not verify against the client CA (or expired) */
    TLS_FAIL_PEER_ALERT,            /* the client refused us, e.g. it does not trust our CA */
    TLS_FAIL_CLOSED,                /* connection closed before the handshake ended */
    TLS_FAIL_TIMEOUT,
    TLS_FAIL_OTHER,
    TLS_FAIL_COUNT
};

const char *tls_failure_to_str(enum tls_failure f);

/* Pure: the reason of a failed handshake from what the server saw. errs are
 * OpenSSL error codes (ERR_get_error values; libevent's small SSL_ERROR_*
 * placeholders are ignored), verify_result is SSL_get_verify_result(),
 * alpn_missing is set when the ClientHello carried no ALPN, events are the
 * BEV_EVENT_* flags that ended the connection. */
enum tls_failure tls_failure_classify(const unsigned long *errs, size_t nerrs, long verify_result,
                                      int alpn_missing, short events);

/* Loads the files (paths are copied). Returns NULL with err filled when a file
 * cannot be read or parsed, the key does not match the certificate, or on
 * allocation failure. */
struct tls_server *tls_server_new(const struct tls_server_config *cfg, char *err,
                                  size_t errlen);
/* Accepts NULL. Connections still open keep their context alive. */
void tls_server_free(struct tls_server *t);

/* Rebuilds the context when a file changed since the last attempt. Returns 1
 * when a new certificate is in use, 0 when nothing changed, -1 when a change
 * failed to load (err filled, logged; the previous context stays). */
int tls_server_check_reload(struct tls_server *t, char *err, size_t errlen);

/* Wraps an accepted socket in a server-side TLS bufferevent on the current
 * context (BEV_OPT_CLOSE_ON_FREE: freeing it closes fd). Returns NULL on
 * failure; fd is then closed. The handshake runs on the event loop from now
 * on; the bufferevent reports BEV_EVENT_CONNECTED when it succeeds. */
struct bufferevent *tls_server_accept(struct tls_server *t, struct event_base *base,
                                      evutil_socket_t fd);

/* Call on BEV_EVENT_CONNECTED. Returns 0 when the connection negotiated h2
 * (counted, logged at debug with version, cipher and client subject), -1 when
 * it must be closed (counted and logged as a failure). */
int tls_server_handshake_done(struct tls_server *t, struct bufferevent *bev, const char *peer);

/* Call when a connection ends (events from the event callback) before
 * BEV_EVENT_CONNECTED: classifies, counts and logs the failure. Consumes the
 * bufferevent's recorded OpenSSL errors. */
void tls_server_handshake_failed(struct tls_server *t, struct bufferevent *bev, short events,
                                 const char *peer);

/* Sends close_notify on an established TLS bufferevent about to be freed, so
 * the peer sees a clean end rather than a truncation. Best effort. */
void tls_conn_close_notify(struct bufferevent *bev);

struct tls_server_stats {
    uint64_t handshakes;                 /* completed, h2 negotiated */
    uint64_t failures[TLS_FAIL_COUNT];   /* by reason */
    uint64_t reloads_ok, reloads_failed;
    double not_after;                    /* serving certificate's expiry, unix seconds */
};

void tls_server_get_stats(const struct tls_server *t, struct tls_server_stats *out);

/* Writes <prefix>_tls_handshakes_total, <prefix>_tls_handshake_failures_total{reason},
 * <prefix>_tls_certificate_reloads_total{result}, and
 * <prefix>_tls_certificate_not_after_timestamp_seconds (serving certificate). */
void tls_server_write_metrics(const struct tls_server *t, struct evbuffer *out,
                              const char *prefix);

#endif
