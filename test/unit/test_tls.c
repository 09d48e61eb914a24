/* tls: failure classification (pure), loading and reloading certificate
 * files, and whole handshakes between a tls_server bufferevent and an
 * OpenSSL client bufferevent over a socketpair (no network). Certificates are
 * made here with the OpenSSL API in a temp dir. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "log.h"
#include "tls.h"

/* ---- certificates ------------------------------------------------------ */

struct cred {
    EVP_PKEY *key;
    X509 *cert;
};

static void add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    assert_non_null(ext);
    assert_int_equal(X509_add_ext(cert, ext, -1), 1);
    X509_EXTENSION_free(ext);
}

/* A CA when issuer is NULL (self-signed), else a leaf signed by it. */
static struct cred make_cred(const char *cn, long serial, const struct cred *issuer,
                             long not_after_s)
{
    struct cred c;
    c.key = EVP_EC_gen("P-256");
    assert_non_null(c.key);
    c.cert = X509_new();
    assert_non_null(c.cert);
    X509_set_version(c.cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(c.cert), serial);
    X509_gmtime_adj(X509_getm_notBefore(c.cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(c.cert), not_after_s);
    X509_set_pubkey(c.cert, c.key);
    X509_NAME *name = X509_get_subject_name(c.cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509 *icert = issuer ? issuer->cert : c.cert;
    X509_set_issuer_name(c.cert, X509_get_subject_name(icert));
    if (!issuer) {
        add_ext(c.cert, icert, NID_basic_constraints, "critical,CA:TRUE");
        add_ext(c.cert, icert, NID_key_usage, "critical,keyCertSign,cRLSign");
    } else {
        add_ext(c.cert, icert, NID_basic_constraints, "CA:FALSE");
        add_ext(c.cert, icert, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
    }
    assert_true(X509_sign(c.cert, issuer ? issuer->key : c.key, EVP_sha256()) > 0);
    return c;
}

static void cred_free(struct cred *c)
{
    X509_free(c->cert);
    EVP_PKEY_free(c->key);
}

static char tmpdir[64];

static const char *path_of(const char *name)
{
    static char buf[4][128];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof(buf[i]), "%s/%s", tmpdir, name);
    return buf[i];
}

/* Writes through a temp file and rename: a new inode, as a Secret update. */
static void write_file(const char *name, const struct cred *c, int write_key, const char *text)
{
    char tmp[160];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path_of(name));
    FILE *f = fopen(tmp, "w");
    assert_non_null(f);
    if (text)
        fputs(text, f);
    else if (write_key)
        assert_int_equal(PEM_write_PrivateKey(f, c->key, NULL, NULL, 0, NULL, NULL), 1);
    else
        assert_int_equal(PEM_write_X509(f, c->cert), 1);
    fclose(f);
    assert_int_equal(rename(tmp, path_of(name)), 0);
}

static struct cred ca, other_ca, server1, server2, client_ok, client_stranger;

static int setup(void **state)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/thaw-tls-unit-XXXXXX");
    if (!mkdtemp(tmpdir))
        return -1;
    ca = make_cred("unit-ca", 1, NULL, 86400);
    other_ca = make_cred("other-ca", 2, NULL, 86400);
    server1 = make_cred("server-one", 0x101, &ca, 86400);
    server2 = make_cred("server-two", 0x102, &ca, 2 * 86400);
    client_ok = make_cred("client-ok", 0x201, &ca, 86400);
    client_stranger = make_cred("client-stranger", 0x301, &other_ca, 86400);
    write_file("server.crt", &server1, 0, NULL);
    write_file("server.key", &server1, 1, NULL);
    write_file("ca.crt", &ca, 0, NULL);
    log_set_level(LOG_LEVEL_ERROR);
    return 0;
}

static int teardown(void **state)
{
    const char *names[] = {"server.crt", "server.key", "ca.crt", "mtls.crt", "mtls.key",
                           "mtls-ca.crt", "reload.crt", "reload.key", "bad.crt"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        unlink(path_of(names[i]));
    rmdir(tmpdir);
    struct cred *all[] = {&ca, &other_ca, &server1, &server2, &client_ok, &client_stranger};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        cred_free(all[i]);
    return 0;
}

/* ---- handshakes over a socketpair -------------------------------------- */

struct hs_result {
    struct tls_server *t;
    struct event_base *base;
    int server_done;   /* 1 connected (h2), -1 refused or failed */
    int client_connected;
    long served_serial;
    char alpn[16];
};

static void server_event_cb(struct bufferevent *bev, short events, void *arg)
{
    struct hs_result *r = arg;
    if (r->server_done)
        return;
    if (events & BEV_EVENT_CONNECTED)
        r->server_done = tls_server_handshake_done(r->t, bev, "unit") == 0 ? 1 : -1;
    else {
        tls_server_handshake_failed(r->t, bev, events, "unit");
        r->server_done = -1;
    }
    event_base_loopexit(r->base, NULL);
}

static void client_event_cb(struct bufferevent *bev, short events, void *arg)
{
    struct hs_result *r = arg;
    if (!(events & BEV_EVENT_CONNECTED))
        return;
    r->client_connected = 1;
    SSL *ssl = bufferevent_openssl_get_ssl(bev);
    X509 *peer = SSL_get0_peer_certificate(ssl);
    if (peer)
        r->served_serial = ASN1_INTEGER_get(X509_get0_serialNumber(peer));
    const unsigned char *p = NULL;
    unsigned int n = 0;
    SSL_get0_alpn_selected(ssl, &p, &n);
    if (n < sizeof(r->alpn)) {
        memcpy(r->alpn, p, n);
        r->alpn[n] = '\0';
    }
}

/* One handshake: the client trusts `trust`, presents `client` (may be NULL)
 * and offers ALPN `alpn` in wire format (NULL: no ALPN extension at all). */
static struct hs_result handshake(struct tls_server *t, const struct cred *trust,
                                  const struct cred *client, const char *alpn, size_t alpn_len,
                                  int max_version)
{
    struct hs_result r;
    memset(&r, 0, sizeof(r));
    r.t = t;
    r.base = event_base_new();
    assert_non_null(r.base);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    evutil_make_socket_nonblocking(sv[0]);
    evutil_make_socket_nonblocking(sv[1]);

    struct bufferevent *sbev = tls_server_accept(t, r.base, sv[0]);
    assert_non_null(sbev);
    bufferevent_setcb(sbev, NULL, NULL, server_event_cb, &r);
    bufferevent_enable(sbev, EV_READ | EV_WRITE);

    SSL_CTX *cctx = SSL_CTX_new(TLS_client_method());
    assert_non_null(cctx);
    if (max_version) {
        SSL_CTX_set_security_level(cctx, 0);
        SSL_CTX_set_min_proto_version(cctx, max_version);
        SSL_CTX_set_max_proto_version(cctx, max_version);
    }
    X509_STORE_add_cert(SSL_CTX_get_cert_store(cctx), trust->cert);
    SSL_CTX_set_verify(cctx, SSL_VERIFY_PEER, NULL);
    if (client) {
        assert_int_equal(SSL_CTX_use_certificate(cctx, client->cert), 1);
        assert_int_equal(SSL_CTX_use_PrivateKey(cctx, client->key), 1);
    }
    if (alpn)
        assert_int_equal(SSL_CTX_set_alpn_protos(cctx, (const unsigned char *)alpn,
                                                 (unsigned int)alpn_len), 0);
    SSL *cssl = SSL_new(cctx);
    assert_non_null(cssl);
    struct bufferevent *cbev = bufferevent_openssl_socket_new(
        r.base, sv[1], cssl, BUFFEREVENT_SSL_CONNECTING, BEV_OPT_CLOSE_ON_FREE);
    assert_non_null(cbev);
    bufferevent_setcb(cbev, NULL, NULL, client_event_cb, &r);
    bufferevent_enable(cbev, EV_READ | EV_WRITE);

    struct timeval limit = {5, 0};
    event_base_loopexit(r.base, &limit);
    event_base_dispatch(r.base);
    assert_true(r.server_done != 0); /* not the 5 s limit */

    bufferevent_free(cbev);
    bufferevent_free(sbev);
    SSL_CTX_free(cctx);
    event_base_free(r.base);
    ERR_clear_error();
    return r;
}

#define H2 "\x02h2"
#define H1 "\x08http/1.1"

static uint64_t failures(struct tls_server *t, enum tls_failure f)
{
    struct tls_server_stats st;
    tls_server_get_stats(t, &st);
    return st.failures[f];
}

/* ---- tests --------------------------------------------------------------- */

static void test_classify(void **unused)
{
    /* libevent's placeholders (SSL_ERROR_SSL = 1, SSL_ERROR_SYSCALL = 5) are not reasons. */
    unsigned long placeholder[] = {1, 5};
    assert_int_equal(tls_failure_classify(placeholder, 2, X509_V_OK, 0, BEV_EVENT_ERROR),
                     TLS_FAIL_CLOSED);
    assert_int_equal(tls_failure_classify(NULL, 0, X509_V_OK, 0, BEV_EVENT_EOF), TLS_FAIL_CLOSED);
    assert_int_equal(tls_failure_classify(NULL, 0, X509_V_OK, 0,
                                          BEV_EVENT_TIMEOUT | BEV_EVENT_READING),
                     TLS_FAIL_TIMEOUT);
    assert_int_equal(tls_failure_classify(NULL, 0, X509_V_OK, 1, BEV_EVENT_ERROR),
                     TLS_FAIL_NO_ALPN_H2);
    struct {
        int reason;
        enum tls_failure want;
    } cases[] = {
        {SSL_R_WRONG_VERSION_NUMBER, TLS_FAIL_NOT_TLS},
        {SSL_R_HTTP_REQUEST, TLS_FAIL_NOT_TLS},
        {SSL_R_UNSUPPORTED_PROTOCOL, TLS_FAIL_PROTOCOL_VERSION},
        {SSL_R_NO_SHARED_CIPHER, TLS_FAIL_NO_SHARED_CIPHER},
        {SSL_R_NO_APPLICATION_PROTOCOL, TLS_FAIL_NO_ALPN_H2},
        {SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE, TLS_FAIL_CLIENT_CERT_MISSING},
        {SSL_R_CERTIFICATE_VERIFY_FAILED, TLS_FAIL_CLIENT_CERT_REJECTED},
        {SSL_R_TLSV1_ALERT_UNKNOWN_CA, TLS_FAIL_PEER_ALERT},
        {SSL_R_SSLV3_ALERT_BAD_CERTIFICATE, TLS_FAIL_PEER_ALERT},
        {SSL_R_UNEXPECTED_EOF_WHILE_READING, TLS_FAIL_CLOSED},
        {SSL_R_BAD_SIGNATURE, TLS_FAIL_OTHER},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        unsigned long errs[] = {1, ERR_PACK(ERR_LIB_SSL, 0, cases[i].reason)};
        assert_int_equal(tls_failure_classify(errs, 2, X509_V_OK, 0, BEV_EVENT_ERROR),
                         cases[i].want);
    }
    /* A failed chain check shows in the verify result even without the code. */
    assert_int_equal(tls_failure_classify(NULL, 0, X509_V_ERR_CERT_HAS_EXPIRED, 0,
                                          BEV_EVENT_ERROR),
                     TLS_FAIL_CLIENT_CERT_REJECTED);
    for (int f = 0; f < TLS_FAIL_COUNT; f++)
        assert_string_not_equal(tls_failure_to_str((enum tls_failure)f), "unknown");
    assert_string_equal(tls_failure_to_str(TLS_FAIL_COUNT), "unknown");
}

static void test_load_errors(void **unused)
{
    char err[512];
    struct tls_server_config cfg = {.cert_file = path_of("server.crt"), .key_file = NULL};
    assert_null(tls_server_new(&cfg, err, sizeof(err)));
    assert_non_null(strstr(err, "key file"));

    cfg.key_file = path_of("missing.key");
    assert_null(tls_server_new(&cfg, err, sizeof(err)));
    assert_non_null(strstr(err, "missing.key"));
    assert_non_null(strstr(err, "No such file"));

    write_file("bad.crt", NULL, 0, "not a certificate\n");
    cfg.cert_file = path_of("bad.crt");
    cfg.key_file = path_of("server.key");
    assert_null(tls_server_new(&cfg, err, sizeof(err)));
    assert_non_null(strstr(err, "loading certificate"));
    assert_non_null(strstr(err, "bad.crt"));

    /* server2's key with server1's certificate */
    write_file("reload.key", &server2, 1, NULL);
    cfg.cert_file = path_of("server.crt");
    cfg.key_file = path_of("reload.key");
    assert_null(tls_server_new(&cfg, err, sizeof(err)));
    assert_non_null(strstr(err, "does not match certificate"));

    cfg.key_file = path_of("server.key");
    cfg.client_ca_file = path_of("bad.crt");
    assert_null(tls_server_new(&cfg, err, sizeof(err)));
    assert_non_null(strstr(err, "client CA bundle"));
}

static void test_handshake_alpn(void **unused)
{
    char err[512];
    struct tls_server_config cfg = {.cert_file = path_of("server.crt"),
                                    .key_file = path_of("server.key")};
    struct tls_server *t = tls_server_new(&cfg, err, sizeof(err));
    assert_non_null(t);

    struct hs_result r = handshake(t, &ca, NULL, H2, 3, 0);
    assert_int_equal(r.server_done, 1);
    assert_true(r.client_connected);
    assert_string_equal(r.alpn, "h2");
    assert_int_equal(r.served_serial, 0x101);

    r = handshake(t, &ca, NULL, H1 H2, 12, 0);
    assert_int_equal(r.server_done, 1);
    assert_string_equal(r.alpn, "h2");

    r = handshake(t, &ca, NULL, H1, 9, 0);
    assert_int_equal(r.server_done, -1);
    assert_false(r.client_connected);
    r = handshake(t, &ca, NULL, NULL, 0, 0);
    assert_int_equal(r.server_done, -1);
    assert_false(r.client_connected);
    assert_int_equal(failures(t, TLS_FAIL_NO_ALPN_H2), 2);

    r = handshake(t, &ca, NULL, H2, 3, TLS1_1_VERSION);
    assert_int_equal(r.server_done, -1);
    assert_int_equal(failures(t, TLS_FAIL_PROTOCOL_VERSION), 1);

    /* TLS 1.2 works too (with an h2-grade cipher). */
    r = handshake(t, &ca, NULL, H2, 3, TLS1_2_VERSION);
    assert_int_equal(r.server_done, 1);

    /* A client that does not trust our CA aborts with an alert. */
    r = handshake(t, &other_ca, NULL, H2, 3, 0);
    assert_int_equal(r.server_done, -1);
    assert_int_equal(failures(t, TLS_FAIL_PEER_ALERT), 1);

    struct tls_server_stats st;
    tls_server_get_stats(t, &st);
    assert_int_equal(st.handshakes, 3);

    struct evbuffer *out = evbuffer_new();
    tls_server_write_metrics(t, out, "x");
    evbuffer_add(out, "", 1);
    const char *text = (const char *)evbuffer_pullup(out, -1);
    assert_non_null(strstr(text, "\nx_tls_handshakes_total 3\n"));
    assert_non_null(strstr(text, "\nx_tls_handshake_failures_total{reason=\"no_alpn_h2\"} 2\n"));
    assert_non_null(strstr(text, "\nx_tls_handshake_failures_total{reason=\"other\"} 0\n"));
    evbuffer_free(out);
    tls_server_free(t);
}

static void test_mutual(void **unused)
{
    char err[512];
    struct tls_server_config cfg = {.cert_file = path_of("server.crt"),
                                    .key_file = path_of("server.key"),
                                    .client_ca_file = path_of("ca.crt")};
    struct tls_server *t = tls_server_new(&cfg, err, sizeof(err));
    assert_non_null(t);

    struct hs_result r = handshake(t, &ca, &client_ok, H2, 3, 0);
    assert_int_equal(r.server_done, 1);
    r = handshake(t, &ca, NULL, H2, 3, 0);
    assert_int_equal(r.server_done, -1);
    assert_int_equal(failures(t, TLS_FAIL_CLIENT_CERT_MISSING), 1);
    r = handshake(t, &ca, &client_stranger, H2, 3, 0);
    assert_int_equal(r.server_done, -1);
    assert_int_equal(failures(t, TLS_FAIL_CLIENT_CERT_REJECTED), 1);
    /* Same over TLS 1.2, where the refusal happens before the client finishes. */
    r = handshake(t, &ca, &client_stranger, H2, 3, TLS1_2_VERSION);
    assert_int_equal(r.server_done, -1);
    assert_false(r.client_connected);
    assert_int_equal(failures(t, TLS_FAIL_CLIENT_CERT_REJECTED), 2);
    tls_server_free(t);
}

static void test_reload(void **unused)
{
    char err[512];
    write_file("reload.crt", &server1, 0, NULL);
    write_file("reload.key", &server1, 1, NULL);
    write_file("mtls-ca.crt", &ca, 0, NULL);
    struct tls_server_config cfg = {.cert_file = path_of("reload.crt"),
                                    .key_file = path_of("reload.key"),
                                    .client_ca_file = path_of("mtls-ca.crt")};
    struct tls_server *t = tls_server_new(&cfg, err, sizeof(err));
    assert_non_null(t);
    struct tls_server_stats st;
    tls_server_get_stats(t, &st);
    double first_expiry = st.not_after;
    assert_true(first_expiry > 0);

    assert_int_equal(tls_server_check_reload(t, err, sizeof(err)), 0);

    /* Half a rotation: the new certificate without its key is refused. */
    write_file("reload.crt", &server2, 0, NULL);
    assert_int_equal(tls_server_check_reload(t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "does not match"));
    assert_int_equal(tls_server_check_reload(t, err, sizeof(err)), 0); /* reported once */
    struct hs_result r = handshake(t, &ca, &client_ok, H2, 3, 0);
    assert_int_equal(r.server_done, 1);
    assert_int_equal(r.served_serial, 0x101);

    /* The key arrives: the new certificate serves new connections. */
    write_file("reload.key", &server2, 1, NULL);
    assert_int_equal(tls_server_check_reload(t, err, sizeof(err)), 1);
    r = handshake(t, &ca, &client_ok, H2, 3, 0);
    assert_int_equal(r.server_done, 1);
    assert_int_equal(r.served_serial, 0x102);
    tls_server_get_stats(t, &st);
    assert_true(st.not_after > first_expiry);
    assert_int_equal(st.reloads_ok, 1);
    assert_int_equal(st.reloads_failed, 1);

    /* Garbage keeps the current one; deleting a file too. */
    write_file("reload.crt", NULL, 0, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
    assert_int_equal(tls_server_check_reload(t, err, sizeof(err)), -1);
    unlink(path_of("reload.crt"));
    assert_int_equal(tls_server_check_reload(t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "cannot read"));
    r = handshake(t, &ca, &client_ok, H2, 3, 0);
    assert_int_equal(r.served_serial, 0x102);
    write_file("reload.crt", &server2, 0, NULL);
    assert_int_equal(tls_server_check_reload(t, err, sizeof(err)), 1);

    /* A new client CA: the old CA's clients are refused, the new one's accepted. */
    write_file("mtls-ca.crt", &other_ca, 0, NULL);
    assert_int_equal(tls_server_check_reload(t, err, sizeof(err)), 1);
    r = handshake(t, &ca, &client_ok, H2, 3, 0);
    assert_int_equal(r.server_done, -1);
    r = handshake(t, &ca, &client_stranger, H2, 3, 0);
    assert_int_equal(r.server_done, 1);
    tls_server_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classify),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_handshake_alpn),
        cmocka_unit_test(test_mutual),
        cmocka_unit_test(test_reload),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
