/* Unit tests for activator/http1: request/response heads, chunked decoding,
 * hop-by-hop fields. Inputs are split at every byte to prove the parsers are
 * incremental. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http1.h"

static const struct http1_limits lim = {8192, 64};

static ssize_t parse_req(const char *s, struct http1_request *r)
{
    struct http1_scan sc;
    http1_scan_init(&sc);
    return http1_parse_request(&sc, s, strlen(s), &lim, r);
}

static bool val_is(const struct http1_header *h, const char *v)
{
    return h && h->value_len == strlen(v) && memcmp(h->value, v, h->value_len) == 0;
}

static void test_simple_get(void **state)
{
    (void)state;
    struct http1_request *r = malloc(sizeof(*r));
    assert_non_null(r);
    const char *in = "GET /v1/models?x=1 HTTP/1.1\r\nHost: example.com:8080\r\n"
                     "User-Agent:  curl/8  \r\nAccept: */*\r\n\r\nNEXT";
    ssize_t n = parse_req(in, r);
    assert_int_equal(n, (ssize_t)(strlen(in) - 4));
    assert_int_equal(r->method_len, 3);
    assert_memory_equal(r->method, "GET", 3);
    assert_int_equal(r->target_len, strlen("/v1/models?x=1"));
    assert_memory_equal(r->target, "/v1/models?x=1", r->target_len);
    assert_int_equal(r->version_minor, 1);
    assert_int_equal(r->num_headers, 3);
    assert_true(val_is(r->host, "example.com:8080"));
    assert_true(val_is(http1_find(r->headers, r->num_headers, "user-agent"), "curl/8"));
    assert_int_equal(r->body, HTTP1_BODY_NONE);
    assert_true(r->keep_alive);
    assert_false(r->expect_continue);
    assert_int_equal(r->head_len, (size_t)n);
    free(r);
}

/* Every prefix but the whole head is incomplete, whether fed with a fresh
 * scan each time or with one scan resumed, and the result is the same. */
static void test_split_every_byte(void **state)
{
    (void)state;
    struct http1_request *r = malloc(sizeof(*r));
    assert_non_null(r);
    const char *in = "\r\nPOST /v1/chat/completions HTTP/1.1\r\nHost: h\r\n"
                     "Content-Length: 17\r\nConnection: keep-alive, X-Secret\r\n"
                     "X-Secret: 1\r\n\r\n";
    size_t len = strlen(in);
    struct http1_scan sc;
    http1_scan_init(&sc);
    for (size_t i = 0; i < len; i++) {
        ssize_t n = http1_parse_request(&sc, in, i, &lim, r);
        assert_int_equal(n, HTTP1_INCOMPLETE);
        struct http1_scan fresh;
        http1_scan_init(&fresh);
        assert_int_equal(http1_parse_request(&fresh, in, i, &lim, r), HTTP1_INCOMPLETE);
    }
    ssize_t n = http1_parse_request(&sc, in, len, &lim, r);
    assert_int_equal(n, (ssize_t)len);
    assert_int_equal(r->head_len, len - 2); /* the leading empty line is skipped */
    assert_int_equal(r->body, HTTP1_BODY_LENGTH);
    assert_int_equal(r->content_length, 17);
    assert_int_equal(r->num_conn_tokens, 2);
    assert_true(http1_is_hop_by_hop("x-secret", 8, r->conn_tokens, r->num_conn_tokens));
    assert_true(http1_is_hop_by_hop("Keep-Alive", 10, r->conn_tokens, r->num_conn_tokens));
    assert_true(http1_is_hop_by_hop("Transfer-Encoding", 17, NULL, 0));
    assert_false(http1_is_hop_by_hop("Content-Length", 14, r->conn_tokens, r->num_conn_tokens));
    assert_false(http1_is_hop_by_hop("X-Secre", 7, r->conn_tokens, r->num_conn_tokens));
    free(r);
}

static void test_keep_alive_rules(void **state)
{
    (void)state;
    struct http1_request *r = malloc(sizeof(*r));
    assert_non_null(r);
    assert_true(parse_req("GET / HTTP/1.0\r\n\r\n", r) > 0);
    assert_false(r->keep_alive);
    assert_null(r->host);
    assert_true(parse_req("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", r) > 0);
    assert_true(r->keep_alive);
    assert_true(parse_req("GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, close\r\n\r\n", r) > 0);
    assert_false(r->keep_alive);
    assert_true(parse_req("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", r) > 0);
    assert_int_equal(r->body, HTTP1_BODY_NONE);
    assert_true(parse_req("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n"
                          "Content-Length: 5\r\n\r\n", r) > 0);
    assert_int_equal(r->content_length, 5);
    assert_true(parse_req("PUT / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n"
                          "Expect: 100-Continue\r\n\r\n", r) > 0);
    assert_int_equal(r->body, HTTP1_BODY_CHUNKED);
    assert_true(r->expect_continue);
    /* HTTP/1.0 ignores Expect. */
    assert_true(parse_req("PUT / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n", r) > 0);
    assert_false(r->expect_continue);
    free(r);
}

struct bad_case {
    const char *in;
    int err;
};

static void test_bad_requests(void **state)
{
    (void)state;
    static const struct bad_case cases[] = {
        {"GET / HTTP/1.1\nHost: a\n\n", HTTP1_ERR_SYNTAX},                 /* bare LF */
        {"GET / HTTP/1.1\r\nHost : a\r\n\r\n", HTTP1_ERR_SYNTAX},          /* space before colon */
        {"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", HTTP1_ERR_OBS_FOLD},
        {"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", HTTP1_ERR_SYNTAX},
        {"GET  HTTP/1.1\r\nHost: a\r\n\r\n", HTTP1_ERR_SYNTAX},
        {"GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n", HTTP1_ERR_SYNTAX},
        {"GET / HTTP/2.0\r\nHost: a\r\n\r\n", HTTP1_ERR_VERSION},
        {"GET / HTTP/1.12\r\nHost: a\r\n\r\n", HTTP1_ERR_SYNTAX},
        {"GET / http/1.1\r\nHost: a\r\n\r\n", HTTP1_ERR_SYNTAX},
        {"GET /\r\nHost: a\r\n\r\n", HTTP1_ERR_SYNTAX},
        {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1x\r\n\r\n", HTTP1_ERR_CONTENT_LENGTH},
        {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", HTTP1_ERR_CONTENT_LENGTH},
        /* found by fuzzing: a list of only commas holds no length at all */
        {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: ,\r\n\r\n", HTTP1_ERR_CONTENT_LENGTH},
        {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: , ,\r\nTransfer-Encoding: chunked\r\n\r\n", HTTP1_ERR_FRAMING},
        {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", HTTP1_ERR_CONTENT_LENGTH},
        {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n",
         HTTP1_ERR_CONTENT_LENGTH},
        {"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
         HTTP1_ERR_CONTENT_LENGTH},
        {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
         HTTP1_ERR_FRAMING},
        {"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", HTTP1_ERR_FRAMING},
        {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
         HTTP1_ERR_TRANSFER_CODING},
        {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
         HTTP1_ERR_TRANSFER_CODING},
        {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
         "Transfer-Encoding: chunked\r\n\r\n",
         HTTP1_ERR_TRANSFER_CODING},
        {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \r\n\r\n", HTTP1_ERR_FRAMING},
        {"GET / HTTP/1.1\r\n\r\n", HTTP1_ERR_HOST},
        {"GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", HTTP1_ERR_HOST},
        {"GET / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n", HTTP1_ERR_EXPECT},
        {"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01z\r\n\r\n", HTTP1_ERR_SYNTAX},
        {"GET / HTTP/1.1\r\nHost: a\r\n: empty\r\n\r\n", HTTP1_ERR_SYNTAX},
        {"GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", HTTP1_ERR_SYNTAX},
        {"\r\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", HTTP1_ERR_SYNTAX},
        {"GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n", HTTP1_ERR_SYNTAX},
    };
    struct http1_request *r = malloc(sizeof(*r));
    assert_non_null(r);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ssize_t n = parse_req(cases[i].in, r);
        if (n != cases[i].err)
            fail_msg("case %zu: got %zd want %d (%s)", i, n, cases[i].err, cases[i].in);
        assert_non_null(http1_strerror((int)n));
        int st = http1_err_status((int)n);
        assert_true(st >= 400 && st < 600);
    }
    assert_int_equal(http1_err_status(HTTP1_ERR_HEAD_TOO_LARGE), 431);
    assert_int_equal(http1_err_status(HTTP1_ERR_TRANSFER_CODING), 501);
    assert_int_equal(http1_err_status(HTTP1_ERR_EXPECT), 417);
    assert_int_equal(http1_err_status(HTTP1_ERR_VERSION), 505);
    assert_string_equal(http1_strerror(-999), "unknown error");
    free(r);
}

static void test_limits(void **state)
{
    (void)state;
    struct http1_request *r = malloc(sizeof(*r));
    assert_non_null(r);
    struct http1_limits small = {64, 3};
    struct http1_scan sc;
    /* Incomplete but already at the limit: no point waiting for more. */
    char big[80];
    memset(big, 'a', sizeof(big));
    memcpy(big, "GET /", 5);
    http1_scan_init(&sc);
    assert_int_equal(http1_parse_request(&sc, big, 63, &small, r), HTTP1_INCOMPLETE);
    http1_scan_init(&sc);
    assert_int_equal(http1_parse_request(&sc, big, 64, &small, r), HTTP1_ERR_HEAD_TOO_LARGE);
    /* Complete but longer than the limit. */
    const char *long_head = "GET / HTTP/1.1\r\nHost: a\r\nX-Long: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                            "aaaaaaaa\r\n\r\n";
    http1_scan_init(&sc);
    assert_int_equal(http1_parse_request(&sc, long_head, strlen(long_head), &small, r),
                     HTTP1_ERR_HEAD_TOO_LARGE);
    const char *four = "GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n";
    http1_scan_init(&sc);
    assert_int_equal(http1_parse_request(&sc, four, strlen(four), &small, r),
                     HTTP1_ERR_TOO_MANY_HEADERS);
    const char *three = "GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\n\r\n";
    http1_scan_init(&sc);
    assert_int_equal(http1_parse_request(&sc, three, strlen(three), &small, r),
                     (ssize_t)strlen(three));
    free(r);
}

static void test_responses(void **state)
{
    (void)state;
    struct http1_response *r = malloc(sizeof(*r));
    assert_non_null(r);
    struct http1_scan sc;
    const char *in = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n5\r\n";
    size_t hl = strlen(in) - 3;
    http1_scan_init(&sc);
    for (size_t i = 0; i < hl; i++)
        assert_int_equal(http1_parse_response(&sc, in, i, &lim, false, r), HTTP1_INCOMPLETE);
    assert_int_equal(http1_parse_response(&sc, in, strlen(in), &lim, false, r), (ssize_t)hl);
    assert_int_equal(r->status, 200);
    assert_int_equal(r->reason_len, 2);
    assert_int_equal(r->body, HTTP1_BODY_CHUNKED);
    assert_true(r->keep_alive);

    struct {
        const char *in;
        bool head;
        int status;
        enum http1_body body;
        uint64_t cl;
        bool ka;
    } ok[] = {
        {"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", false, 200, HTTP1_BODY_LENGTH, 12, true},
        {"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", true, 200, HTTP1_BODY_NONE, 0, true},
        {"HTTP/1.1 204 No Content\r\nContent-Length: 12\r\n\r\n", false, 204, HTTP1_BODY_NONE, 0,
         true},
        {"HTTP/1.1 304 Not Modified\r\n\r\n", false, 304, HTTP1_BODY_NONE, 0, true},
        {"HTTP/1.1 100 Continue\r\n\r\n", false, 100, HTTP1_BODY_NONE, 0, true},
        {"HTTP/1.1 200 OK\r\n\r\n", false, 200, HTTP1_BODY_UNTIL_CLOSE, 0, false},
        {"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\n", false, 200, HTTP1_BODY_LENGTH, 3, false},
        {"HTTP/1.0 200 OK\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\n", false, 200,
         HTTP1_BODY_LENGTH, 3, true},
        {"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false, 200, HTTP1_BODY_NONE, 0, true},
        {"HTTP/1.1 503\r\nContent-Length: 1\r\n\r\n", false, 503, HTTP1_BODY_LENGTH, 1, true},
        {"HTTP/1.1 599 Last\r\nContent-Length: 1\r\n\r\n", false, 599, HTTP1_BODY_LENGTH, 1,
         true},
        {"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n", false, 103, HTTP1_BODY_NONE, 0,
         true},
        {"HTTP/1.1 200 Tout va\tbien \xc3\xa9\r\nContent-Length: 1\r\n\r\n", false, 200,
         HTTP1_BODY_LENGTH, 1, true},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n", false, 200,
         HTTP1_BODY_CHUNKED, 0, false},
        {"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 4\r\n\r\n", false, 200,
         HTTP1_BODY_LENGTH, 4, false},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        http1_scan_init(&sc);
        ssize_t n = http1_parse_response(&sc, ok[i].in, strlen(ok[i].in), &lim, ok[i].head, r);
        if (n != (ssize_t)strlen(ok[i].in))
            fail_msg("ok case %zu: %zd", i, n);
        assert_int_equal(r->status, ok[i].status);
        assert_int_equal(r->body, ok[i].body);
        assert_int_equal(r->content_length, ok[i].cl);
        if (r->keep_alive != ok[i].ka)
            fail_msg("ok case %zu: keep_alive %d", i, r->keep_alive);
    }
    static const struct bad_case bad[] = {
        {"HTTP/1.1 20 OK\r\n\r\n", HTTP1_ERR_STATUS},
        {"HTTP/1.1 2000 OK\r\n\r\n", HTTP1_ERR_STATUS},
        {"HTTP/1.1 099 x\r\n\r\n", HTTP1_ERR_STATUS},
        /* RFC 9110 15: three digits but not 100..599, invalid: a 502. */
        {"HTTP/1.1 600 x\r\nContent-Length: 1\r\n\r\n", HTTP1_ERR_STATUS},
        {"HTTP/1.1 999 x\r\n\r\n", HTTP1_ERR_STATUS},
        {"HTTX/1.1 200 OK\r\n\r\n", HTTP1_ERR_STATUS},
        {"HTTP/2.0 200 OK\r\n\r\n", HTTP1_ERR_VERSION},
        {"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", HTTP1_ERR_CONTENT_LENGTH},
        {"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", HTTP1_ERR_SYNTAX},
        {"HTTP/1.1 200 OK\nContent-Length: 1\n\n", HTTP1_ERR_STATUS},
        {"HTTP/1.1 200 OK\rX-Injected: yes\r\nContent-Length: 1\r\n\r\n", HTTP1_ERR_STATUS},
        {"HTTP/1.1 200 O\x01K\r\nContent-Length: 1\r\n\r\n", HTTP1_ERR_STATUS},
        {"HTTP/1.1 200 O\x7fK\r\n\r\n", HTTP1_ERR_STATUS},
        /* The proxy re-frames bodies: codings it would drop are refused. */
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", HTTP1_ERR_TRANSFER_CODING},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
         HTTP1_ERR_TRANSFER_CODING},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
         HTTP1_ERR_TRANSFER_CODING},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
         HTTP1_ERR_TRANSFER_CODING},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: ,\r\n\r\n", HTTP1_ERR_FRAMING},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        http1_scan_init(&sc);
        ssize_t n = http1_parse_response(&sc, bad[i].in, strlen(bad[i].in), &lim, false, r);
        if (n != bad[i].err)
            fail_msg("bad case %zu: got %zd want %d", i, n, bad[i].err);
    }
    free(r);
}

/* Decodes in[] fed in pieces of `step` bytes; appends data to out. Returns
 * the total consumed, or the error. */
static ssize_t decode_steps(const char *in, size_t len, size_t step, char *out, size_t *outlen)
{
    struct http1_chunked c;
    http1_chunked_init(&c);
    size_t fed = 0, consumed = 0;
    *outlen = 0;
    while (!http1_chunked_done(&c)) {
        if (consumed == fed) {
            if (fed == len)
                break;
            fed = fed + step > len ? len : fed + step;
        }
        size_t off, dlen;
        ssize_t n = http1_chunked_decode(&c, in + consumed, fed - consumed, &off, &dlen);
        if (n < 0)
            return n;
        memcpy(out + *outlen, in + consumed + off, dlen);
        *outlen += dlen;
        consumed += (size_t)n;
    }
    return http1_chunked_done(&c) ? (ssize_t)consumed : HTTP1_INCOMPLETE;
}

static void test_chunked(void **state)
{
    (void)state;
    const char *body = "4\r\nWiki\r\n5;name=val ue\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n"
                       "0\r\nExpires: never\r\nX-T: 1\r\n\r\n";
    char in[256];
    snprintf(in, sizeof(in), "%sGET /next", body);
    size_t blen = strlen(body);
    for (size_t step = 1; step <= strlen(in); step++) {
        char out[128];
        size_t outlen;
        ssize_t n = decode_steps(in, strlen(in), step, out, &outlen);
        if (n != (ssize_t)blen)
            fail_msg("step %zu: consumed %zd want %zu", step, n, blen);
        assert_int_equal(outlen, 23);
        assert_memory_equal(out, "Wikipedia in\r\n\r\nchunks.", 23);
    }
    /* Truncated anywhere: incomplete, never an error. */
    for (size_t cut = 0; cut < blen; cut++) {
        char out[128];
        size_t outlen;
        assert_int_equal(decode_steps(body, cut, 1, out, &outlen), HTTP1_INCOMPLETE);
    }
    static const char *const bad[] = {
        "x\r\n",
        "4\r\nWikiX\r\n",
        "4\rX",
        "4\r\nWiki\rX",
        "1234567890123456\r\n",
        ";\r\n",
        "4;\x01\r\n",
        "0\r\n\n",
        "0\r\n bad\r\n\r\n",
        "0\r\nA: b\rX",
        "\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char out[64];
        size_t outlen;
        ssize_t n = decode_steps(bad[i], strlen(bad[i]), 1, out, &outlen);
        if (n != HTTP1_ERR_CHUNK)
            fail_msg("bad chunk %zu: got %zd", i, n);
    }
    /* Trailer section bounded. */
    char *huge = malloc(10000);
    assert_non_null(huge);
    memcpy(huge, "0\r\nX: ", 6);
    memset(huge + 6, 'a', 10000 - 6);
    char out[8];
    size_t outlen;
    assert_int_equal(decode_steps(huge, 10000, 1000, out, &outlen), HTTP1_ERR_CHUNK);
    free(huge);
    /* Big chunk sizes are fine as long as they fit. */
    struct http1_chunked c;
    http1_chunked_init(&c);
    size_t off, dlen;
    assert_int_equal(http1_chunked_decode(&c, "FFFFFFFF\r\nab", 12, &off, &dlen), 12);
    assert_int_equal(off, 10);
    assert_int_equal(dlen, 2);
    assert_int_equal(c.remaining, 0xFFFFFFFFull - 2);
}

static void test_list_helpers(void **state)
{
    (void)state;
    const char *v = " gzip ,, Chunked,x";
    assert_true(http1_list_has(v, strlen(v), "chunked"));
    assert_true(http1_list_has(v, strlen(v), "X"));
    assert_false(http1_list_has(v, strlen(v), "gzi"));
    assert_false(http1_list_has("", 0, "a"));
    assert_true(http1_eq_nocase("HoSt", 4, "host"));
    assert_false(http1_eq_nocase("Hos", 3, "host"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simple_get),     cmocka_unit_test(test_split_every_byte),
        cmocka_unit_test(test_keep_alive_rules), cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_limits),         cmocka_unit_test(test_responses),
        cmocka_unit_test(test_chunked),        cmocka_unit_test(test_list_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
