#include "tls.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "alloc.h"
#include "expo.h"
#include "log.h"

/* RFC 7540 9.2.2: HTTP/2 over TLS 1.2 wants ephemeral key exchange and AEAD;
 * grpc-go and grpc-js offer these. TLS 1.3 suites are all acceptable. */
#define H2_TLS12_CIPHERS                                                                       \
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"                               \
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"                               \
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"

enum { FILE_CERT, FILE_KEY, FILE_CA, NFILES };

/* What identifies one version of a file without reading it. */
struct file_stamp {
    int ok; /* stat succeeded */
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
};

struct tls_server {
    char *files[NFILES]; /* files[FILE_CA] NULL without mutual TLS */
    SSL_CTX *ctx;
    struct file_stamp stamps[NFILES]; /* of the last load attempt */
    double not_after;                 /* unix seconds, serving certificate */
    uint64_t handshakes;
    uint64_t failures[TLS_FAIL_COUNT];
    uint64_t reloads_ok, reloads_failed;
};

/* SSL app data marking a ClientHello without ALPN, so the failure that
 * follows is classified for what it is. */
static char alpn_missing_marker;

static const char *const failure_names[TLS_FAIL_COUNT] = {
    [TLS_FAIL_NOT_TLS] = "not_tls",
    [TLS_FAIL_PROTOCOL_VERSION] = "protocol_version",
    [TLS_FAIL_NO_SHARED_CIPHER] = "no_shared_cipher",
    [TLS_FAIL_NO_ALPN_H2] = "no_alpn_h2",
    [TLS_FAIL_CLIENT_CERT_MISSING] = "client_cert_missing",
    [TLS_FAIL_CLIENT_CERT_REJECTED] = "client_cert_rejected",
    [TLS_FAIL_PEER_ALERT] = "peer_alert",
    [TLS_FAIL_CLOSED] = "closed",
    [TLS_FAIL_TIMEOUT] = "timeout",
    [TLS_FAIL_OTHER] = "other",
};

const char *tls_failure_to_str(enum tls_failure f)
{
    if ((int)f < 0 || f >= TLS_FAIL_COUNT)
        return "unknown";
    return failure_names[f];
}

enum tls_failure tls_failure_classify(const unsigned long *errs, size_t nerrs, long verify_result,
                                      int alpn_missing, short events)
{
    if (alpn_missing)
        return TLS_FAIL_NO_ALPN_H2;
    int any_ssl_error = 0;
    for (size_t i = 0; i < nerrs; i++) {
        /* libevent records SSL_get_error()'s small code next to the real
         * ones; those have no library part. */
        if (ERR_GET_LIB(errs[i]) != ERR_LIB_SSL)
            continue;
        any_ssl_error = 1;
        int reason = ERR_GET_REASON(errs[i]);
        switch (reason) {
        case SSL_R_WRONG_VERSION_NUMBER:
        case SSL_R_HTTP_REQUEST:
        case SSL_R_HTTPS_PROXY_REQUEST:
        case SSL_R_PACKET_LENGTH_TOO_LONG:
        case SSL_R_UNKNOWN_PROTOCOL:
        case SSL_R_RECORD_LENGTH_MISMATCH:
        case SSL_R_BAD_PACKET_LENGTH:
            return TLS_FAIL_NOT_TLS;
        case SSL_R_UNSUPPORTED_PROTOCOL:
        case SSL_R_UNSUPPORTED_SSL_VERSION:
        case SSL_R_VERSION_TOO_LOW:
        case SSL_R_NO_PROTOCOLS_AVAILABLE:
        case SSL_R_TLSV1_ALERT_PROTOCOL_VERSION:
            return TLS_FAIL_PROTOCOL_VERSION;
        case SSL_R_NO_SHARED_CIPHER:
            return TLS_FAIL_NO_SHARED_CIPHER;
        case SSL_R_NO_APPLICATION_PROTOCOL:
        case SSL_R_TLSV1_ALERT_NO_APPLICATION_PROTOCOL:
            return TLS_FAIL_NO_ALPN_H2;
        case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
            return TLS_FAIL_CLIENT_CERT_MISSING;
        case SSL_R_CERTIFICATE_VERIFY_FAILED:
            return TLS_FAIL_CLIENT_CERT_REJECTED;
        case SSL_R_UNEXPECTED_EOF_WHILE_READING:
            return TLS_FAIL_CLOSED;
        default:
            /* Alerts the peer sent us map to SSL_AD_REASON_OFFSET + alert. */
            if (reason >= SSL_AD_REASON_OFFSET && reason < SSL_AD_REASON_OFFSET + 256)
                return TLS_FAIL_PEER_ALERT;
            break;
        }
    }
    if (verify_result != X509_V_OK)
        return TLS_FAIL_CLIENT_CERT_REJECTED;
    if (any_ssl_error)
        return TLS_FAIL_OTHER;
    if (events & BEV_EVENT_TIMEOUT)
        return TLS_FAIL_TIMEOUT;
    return TLS_FAIL_CLOSED;
}

/* ---- contexts ---------------------------------------------------------- */

static void stamp_take(const char *path, struct file_stamp *s)
{
    struct stat st;
    memset(s, 0, sizeof(*s));
    if (!path || stat(path, &st) != 0)
        return;
    s->ok = 1;
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    s->size = st.st_size;
    s->mtime = st.st_mtim;
    s->ctime = st.st_ctim;
}

static int stamp_equal(const struct file_stamp *a, const struct file_stamp *b)
{
    return a->ok == b->ok && a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec &&
           a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec;
}

/* "what file: reason" from the OpenSSL error queue (its earliest entry is
 * the cause), which is then cleared. */
static void openssl_err(char *err, size_t errlen, const char *what, const char *file)
{
    unsigned long e = ERR_get_error();
    char buf[256];
    if (e == 0) {
        snprintf(buf, sizeof(buf), "unknown error");
    } else {
        const char *r = ERR_reason_error_string(e);
        if (r)
            snprintf(buf, sizeof(buf), "%s", r);
        else
            ERR_error_string_n(e, buf, sizeof(buf));
    }
    ERR_clear_error();
    snprintf(err, errlen, "%s %s: %s", what, file, buf);
}

static int alpn_select_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                          const unsigned char *in, unsigned int inlen, void *arg)
{
    /* in: the client's protocol list, each name prefixed by its length. */
    for (unsigned int i = 0; i < inlen;) {
        unsigned int n = in[i];
        if (n == 0 || i + 1 + n > inlen)
            break;
        if (n == 2 && memcmp(in + i + 1, "h2", 2) == 0) {
            *out = in + i + 1;
            *outlen = 2;
            return SSL_TLSEXT_ERR_OK;
        }
        i += 1 + n;
    }
    return SSL_TLSEXT_ERR_ALERT_FATAL; /* no_application_protocol */
}

/* OpenSSL skips the ALPN callback when the client offers no ALPN at all and
 * would then complete a handshake for a peer that may speak anything: refuse
 * it here instead, with the same alert. */
static int client_hello_cb(SSL *ssl, int *al, void *arg)
{
    const unsigned char *ext = NULL;
    size_t len = 0;
    if (SSL_client_hello_get0_ext(ssl, TLSEXT_TYPE_application_layer_protocol_negotiation, &ext,
                                  &len) == 1)
        return SSL_CLIENT_HELLO_SUCCESS;
    SSL_set_app_data(ssl, &alpn_missing_marker);
    *al = SSL_AD_NO_APPLICATION_PROTOCOL;
    return SSL_CLIENT_HELLO_ERROR;
}

static double asn1_time_unix(const ASN1_TIME *t)
{
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    if (!t || ASN1_TIME_to_tm(t, &tm) != 1)
        return 0;
    return (double)timegm(&tm);
}

/* Logs what was loaded: operators check rotations by serial and expiry. */
static void log_loaded(const struct tls_server *t, SSL_CTX *ctx, int reload)
{
    X509 *leaf = SSL_CTX_get0_certificate(ctx);
    char subject[256] = "?", serial[80] = "?", q1[300], q2[300];
    if (leaf) {
        X509_NAME_oneline(X509_get_subject_name(leaf), subject, sizeof(subject));
        BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(leaf), NULL);
        char *hex = bn ? BN_bn2hex(bn) : NULL;
        if (hex)
            snprintf(serial, sizeof(serial), "%s", hex);
        OPENSSL_free(hex);
        BN_free(bn);
    }
    time_t na = (time_t)t->not_after;
    struct tm tm;
    char when[32] = "?";
    if (gmtime_r(&na, &tm))
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    STACK_OF(X509_NAME) *cas = SSL_CTX_get_client_CA_list(ctx);
    LOG_INFO(reload ? "tls_certificate_reloaded" : "tls_certificate_loaded",
             "subject=%s serial=%s not_after=%s client_cas=%d cert=%s",
             log_quote(q1, sizeof(q1), subject), serial, when,
             cas ? sk_X509_NAME_num(cas) : 0, log_quote(q2, sizeof(q2), t->files[FILE_CERT]));
    if (leaf && X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0)
        LOG_WARN("tls_certificate_expired", "not_after=%s cert=%s", when, q2);
    else if (leaf && X509_cmp_current_time(X509_get0_notBefore(leaf)) > 0)
        LOG_WARN("tls_certificate_not_yet_valid", "cert=%s", q2);
}

static int no_passphrase(char *buf, int size, int rwflag, void *ud)
{
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)ud;
    return 0;
}

/* A PEM key that needs a passphrase says so in its armour. */
static bool key_is_encrypted(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char line[256];
    bool encrypted = false;
    for (int i = 0; i < 8 && !encrypted && fgets(line, sizeof(line), f); i++)
        encrypted = strstr(line, "ENCRYPTED") != NULL;
    fclose(f);
    return encrypted;
}

/* Builds a context from the files. NULL with err on failure. */
static SSL_CTX *ctx_build(const struct tls_server *t, double *not_after, char *err, size_t errlen)
{
    for (int i = 0; i < NFILES; i++) {
        /* OpenSSL's messages for a missing file are cryptic; ours are not. */
        if (t->files[i] && access(t->files[i], R_OK) != 0) {
            snprintf(err, errlen, "cannot read %s: %s", t->files[i], strerror(errno));
            return NULL;
        }
    }
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        openssl_err(err, errlen, "creating a TLS context for", t->files[FILE_CERT]);
        return NULL;
    }
    static const unsigned char sid_ctx[] = "thaw-grpc";
    if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1 ||
        SSL_CTX_set_cipher_list(ctx, H2_TLS12_CIPHERS) != 1 ||
        SSL_CTX_set_session_id_context(ctx, sid_ctx, sizeof(sid_ctx) - 1) != 1) {
        openssl_err(err, errlen, "configuring TLS for", t->files[FILE_CERT]);
        SSL_CTX_free(ctx);
        return NULL;
    }
    /* Renegotiation only serves attacks here; HTTP/2 frames its own ends so
     * a missing close_notify truncates nothing (and OpenSSL 3 would turn it
     * into an error libevent does not expect). */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                 SSL_OP_NO_COMPRESSION | SSL_OP_IGNORE_UNEXPECTED_EOF);
    /* KEDA keeps one idle connection per scaler address: idle ones should not
     * hold 2 x 16 KiB of record buffers each. */
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    /* No passphrase is ever asked for: OpenSSL's default would prompt on the
     * terminal or read stdin, blocking the event loop (at a reload too). An
     * encrypted key fails to load like any bad file. */
    SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
    if (SSL_CTX_use_certificate_chain_file(ctx, t->files[FILE_CERT]) != 1) {
        openssl_err(err, errlen, "loading certificate", t->files[FILE_CERT]);
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, t->files[FILE_KEY], SSL_FILETYPE_PEM) != 1) {
        /* Usual mid-rotation state (one file written, not the other yet):
         * say so plainly. */
        unsigned long e = ERR_peek_error();
        if (ERR_GET_LIB(e) == ERR_LIB_X509 && ERR_GET_REASON(e) == X509_R_KEY_VALUES_MISMATCH) {
            ERR_clear_error();
            snprintf(err, errlen, "private key %s does not match certificate %s",
                     t->files[FILE_KEY], t->files[FILE_CERT]);
        } else {
            openssl_err(err, errlen, "loading private key", t->files[FILE_KEY]);
            if (key_is_encrypted(t->files[FILE_KEY]))
                snprintf(err, errlen, "private key %s is encrypted: give the key without a "
                                      "passphrase (openssl pkey -in KEY -out KEY.plain)",
                         t->files[FILE_KEY]);
        }
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        ERR_clear_error();
        snprintf(err, errlen, "private key %s does not match certificate %s",
                 t->files[FILE_KEY], t->files[FILE_CERT]);
        SSL_CTX_free(ctx);
        return NULL;
    }
    SSL_CTX_set_alpn_select_cb(ctx, alpn_select_cb, NULL);
    SSL_CTX_set_client_hello_cb(ctx, client_hello_cb, NULL);
    if (t->files[FILE_CA]) {
        if (SSL_CTX_load_verify_locations(ctx, t->files[FILE_CA], NULL) != 1) {
            openssl_err(err, errlen, "loading client CA bundle", t->files[FILE_CA]);
            SSL_CTX_free(ctx);
            return NULL;
        }
        /* The names sent in CertificateRequest help clients holding several
         * certificates pick the right one. */
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(t->files[FILE_CA]);
        if (!names) {
            openssl_err(err, errlen, "reading CA names from", t->files[FILE_CA]);
            SSL_CTX_free(ctx);
            return NULL;
        }
        SSL_CTX_set_client_CA_list(ctx, names); /* takes ownership */
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    ERR_clear_error();
    *not_after = asn1_time_unix(X509_get0_notAfter(SSL_CTX_get0_certificate(ctx)));
    return ctx;
}

struct tls_server *tls_server_new(const struct tls_server_config *cfg, char *err, size_t errlen)
{
    if (!cfg->cert_file || !cfg->cert_file[0] || !cfg->key_file || !cfg->key_file[0]) {
        snprintf(err, errlen, "TLS needs both a certificate file and a key file");
        return NULL;
    }
    struct tls_server *t = thaw_calloc(1, sizeof(*t));
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    t->files[FILE_CERT] = thaw_strdup(cfg->cert_file);
    t->files[FILE_KEY] = thaw_strdup(cfg->key_file);
    int want_ca = cfg->client_ca_file && cfg->client_ca_file[0];
    if (want_ca)
        t->files[FILE_CA] = thaw_strdup(cfg->client_ca_file);
    if (!t->files[FILE_CERT] || !t->files[FILE_KEY] || (want_ca && !t->files[FILE_CA])) {
        snprintf(err, errlen, "out of memory");
        tls_server_free(t);
        return NULL;
    }
    for (int i = 0; i < NFILES; i++)
        stamp_take(t->files[i], &t->stamps[i]);
    t->ctx = ctx_build(t, &t->not_after, err, errlen);
    if (!t->ctx) {
        tls_server_free(t);
        return NULL;
    }
    log_loaded(t, t->ctx, 0);
    return t;
}

void tls_server_free(struct tls_server *t)
{
    if (!t)
        return;
    SSL_CTX_free(t->ctx);
    for (int i = 0; i < NFILES; i++)
        thaw_free(t->files[i]);
    thaw_free(t);
}

int tls_server_check_reload(struct tls_server *t, char *err, size_t errlen)
{
    struct file_stamp now[NFILES];
    int changed = 0;
    for (int i = 0; i < NFILES; i++) {
        stamp_take(t->files[i], &now[i]);
        if (!stamp_equal(&now[i], &t->stamps[i]))
            changed = 1;
    }
    if (!changed)
        return 0;
    /* Remember this version even if it fails: a bad file is reported once,
     * and the next write (the fixed file, or the key after the certificate)
     * is a new change that is tried again. */
    memcpy(t->stamps, now, sizeof(now));
    double not_after = 0;
    SSL_CTX *ctx = ctx_build(t, &not_after, err, errlen);
    if (!ctx) {
        char q[600];
        t->reloads_failed++;
        LOG_WARN("tls_reload_failed", "error=%s keeping=previous_certificate",
                 log_quote(q, sizeof(q), err));
        return -1;
    }
    /* Connections already open hold their own reference to the old one. */
    SSL_CTX_free(t->ctx);
    t->ctx = ctx;
    t->not_after = not_after;
    t->reloads_ok++;
    log_loaded(t, ctx, 1);
    return 1;
}

/* ---- connections ------------------------------------------------------- */

static SSL *new_ssl(struct tls_server *t)
{
    SSL *ssl = SSL_new(t->ctx);
    if (!ssl)
        ERR_clear_error();
    return ssl;
}

struct bufferevent *tls_server_accept(struct tls_server *t, struct event_base *base,
                                      evutil_socket_t fd)
{
    SSL *ssl = new_ssl(t);
    if (!ssl) {
        evutil_closesocket(fd);
        return NULL;
    }
    struct bufferevent *bev = bufferevent_openssl_socket_new(base, fd, ssl,
                                                             BUFFEREVENT_SSL_ACCEPTING,
                                                             BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        /* libevent frees the SSL and closes fd itself when it fails after
         * allocating the bufferevent, not when the allocation fails: an fd
         * still open tells which. */
        if (fcntl(fd, F_GETFD) != -1) {
            SSL_free(ssl);
            evutil_closesocket(fd);
        }
        ERR_clear_error();
        return NULL;
    }
    /* A peer closing TCP without close_notify is an ordinary end (EOF). */
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

int tls_server_handshake_done(struct tls_server *t, struct bufferevent *bev, const char *peer)
{
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    const unsigned char *proto = NULL;
    unsigned int plen = 0;
    if (ssl)
        SSL_get0_alpn_selected(ssl, &proto, &plen);
    if (!ssl || plen != 2 || memcmp(proto, "h2", 2) != 0) {
        /* The callbacks refuse this during the handshake; this is the guard
         * that nothing but HTTP/2 is ever spoken if that changes. */
        t->failures[TLS_FAIL_NO_ALPN_H2]++;
        LOG_INFO("tls_handshake_failed", "peer=%s reason=%s detail=\"h2 not negotiated\"", peer,
                 tls_failure_to_str(TLS_FAIL_NO_ALPN_H2));
        return -1;
    }
    t->handshakes++;
    if (log_get_level() <= LOG_LEVEL_DEBUG) {
        char subject[256] = "-", q[300];
        X509 *pc = SSL_get0_peer_certificate(ssl);
        if (pc)
            X509_NAME_oneline(X509_get_subject_name(pc), subject, sizeof(subject));
        LOG_DEBUG("tls_handshake", "peer=%s version=%s cipher=%s resumed=%d client=%s", peer,
                  SSL_get_version(ssl), SSL_get_cipher_name(ssl), SSL_session_reused(ssl),
                  log_quote(q, sizeof(q), subject));
    }
    return 0;
}

void tls_server_handshake_failed(struct tls_server *t, struct bufferevent *bev, short events,
                                 const char *peer)
{
    unsigned long errs[8];
    size_t n = 0;
    unsigned long e;
    while (n < sizeof(errs) / sizeof(errs[0]) && (e = bufferevent_get_openssl_error(bev)) != 0)
        errs[n++] = e;
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    long verify = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
    int alpn_missing = ssl && SSL_get_app_data(ssl) == &alpn_missing_marker;
    enum tls_failure f = tls_failure_classify(errs, n, verify, alpn_missing, events);
    t->failures[f]++;

    char detail[512] = "";
    if (alpn_missing) {
        snprintf(detail, sizeof(detail), "client offered no ALPN (h2 required)");
    } else {
        for (size_t i = 0; i < n; i++) {
            if (ERR_GET_LIB(errs[i]) == 0)
                continue; /* libevent's SSL_get_error() placeholder */
            const char *r = ERR_reason_error_string(errs[i]);
            if (r) {
                snprintf(detail, sizeof(detail), "%s", r);
                break;
            }
        }
    }
    if (verify != X509_V_OK) {
        size_t len = strlen(detail);
        snprintf(detail + len, sizeof(detail) - len, "%s%s", len ? ": " : "",
                 X509_verify_cert_error_string(verify));
    }
    if (!detail[0])
        snprintf(detail, sizeof(detail), "%s", (events & BEV_EVENT_TIMEOUT) ? "timed out"
                                                : (events & BEV_EVENT_EOF) ? "peer closed"
                                                                           : "connection error");
    ERR_clear_error();
    char q[600];
    /* TCP probes and scanners connect and leave; that is not news. */
    if (f == TLS_FAIL_CLOSED || f == TLS_FAIL_TIMEOUT)
        LOG_DEBUG("tls_handshake_failed", "peer=%s reason=%s detail=%s", peer,
                  tls_failure_to_str(f), log_quote(q, sizeof(q), detail));
    else
        LOG_INFO("tls_handshake_failed", "peer=%s reason=%s detail=%s", peer,
                 tls_failure_to_str(f), log_quote(q, sizeof(q), detail));
}

void tls_conn_close_notify(struct bufferevent *bev)
{
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    if (!ssl || !SSL_is_init_finished(ssl))
        return;
    /* One non-blocking attempt: the alert is tiny; if the socket cannot take
     * it the peer still sees the TCP close. */
    if (SSL_shutdown(ssl) < 0)
        ERR_clear_error();
}

void tls_server_get_stats(const struct tls_server *t, struct tls_server_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->handshakes = t->handshakes;
    memcpy(out->failures, t->failures, sizeof(out->failures));
    out->reloads_ok = t->reloads_ok;
    out->reloads_failed = t->reloads_failed;
    out->not_after = t->not_after;
}

void tls_server_write_metrics(const struct tls_server *t, struct evbuffer *out,
                              const char *prefix)
{
    char name[128];
    char labels[128];
    snprintf(name, sizeof(name), "%s_tls_handshakes_total", prefix);
    expo_family(out, name, "counter", "TLS handshakes completed with ALPN h2.");
    expo_sample(out, name, NULL, (double)t->handshakes);
    snprintf(name, sizeof(name), "%s_tls_handshake_failures_total", prefix);
    expo_family(out, name, "counter", "TLS connections refused or lost before the handshake "
                                      "completed, by reason.");
    for (int f = 0; f < TLS_FAIL_COUNT; f++) {
        expo_labels(labels, sizeof(labels), "reason", tls_failure_to_str((enum tls_failure)f),
                    (char *)NULL);
        expo_sample(out, name, labels, (double)t->failures[f]);
    }
    snprintf(name, sizeof(name), "%s_tls_certificate_reloads_total", prefix);
    expo_family(out, name, "counter",
                "Certificate reloads after a file changed: ok, or error (previous one kept).");
    expo_sample(out, name, "result=\"ok\"", (double)t->reloads_ok);
    expo_sample(out, name, "result=\"error\"", (double)t->reloads_failed);
    snprintf(name, sizeof(name), "%s_tls_certificate_not_after_timestamp_seconds", prefix);
    expo_family(out, name, "gauge", "Expiry (notAfter) of the serving certificate, unix time.");
    expo_sample(out, name, NULL, t->not_after);
}
