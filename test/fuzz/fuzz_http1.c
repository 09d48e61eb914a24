/* Targets http1_request and http1_response: the activator's HTTP/1.1 parser
 * (activator/http1.c) for client requests and upstream responses, with the
 * chunked body decoder. Built twice; FUZZ_HTTP1_RESPONSE selects responses.
 *
 * Input: byte 0 picks the limits (and, for responses, whether the request was
 * HEAD); the rest is the byte stream of a connection: up to 4 pipelined
 * messages. Each head is parsed in one call and again fed in growing prefixes
 * (the header promises the same result for any split); the result and every
 * parsed field must match, and fields must point inside the head; an
 * accepted message's Content-Length must be valid where it frames the body
 * (checked here independently of http1.c). Chunked bodies are decoded in one
 * piece and in chunks: same data, same end. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "http1.h"

#ifdef FUZZ_HTTP1_RESPONSE
#define MSG struct http1_response
#else
#define MSG struct http1_request
#endif

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    return 0;
}

static ssize_t parse(struct http1_scan *s, const char *buf, size_t len,
                     const struct http1_limits *lim, bool head, MSG *out)
{
#ifdef FUZZ_HTTP1_RESPONSE
    return http1_parse_response(s, buf, len, lim, head, out);
#else
    (void)head;
    return http1_parse_request(s, buf, len, lim, out);
#endif
}

static bool is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* RFC 9110 8.6 / 9112 6.3, independently of http1.c: every Content-Length
 * field line is a comma-separated list of at least one decimal number, and
 * all of them (across lines too) have the same value. */
struct cl_ref {
    const char *digits; /* the value's digits without leading zeros */
    size_t n;
    bool seen;
};

static bool cl_line_valid(const char *v, size_t len, struct cl_ref *ref)
{
    size_t i = 0;
    bool any = false;
    while (i <= len) {
        size_t a = i;
        while (i < len && v[i] != ',')
            i++;
        size_t b = i++;
        while (a < b && (v[a] == ' ' || v[a] == '\t'))
            a++;
        while (b > a && (v[b - 1] == ' ' || v[b - 1] == '\t'))
            b--;
        if (a == b)
            continue;
        for (size_t k = a; k < b; k++)
            if (v[k] < '0' || v[k] > '9')
                return false;
        while (b - a > 1 && v[a] == '0')
            a++;
        if (ref->seen && (b - a != ref->n || memcmp(v + a, ref->digits, ref->n) != 0))
            return false;
        ref->digits = v + a;
        ref->n = b - a;
        ref->seen = true;
        any = true;
    }
    return any;
}

static void check_content_length(const struct http1_header *h, size_t n)
{
    struct cl_ref ref = {NULL, 0, false};
    for (size_t i = 0; i < n; i++)
        if (http1_eq_nocase(h[i].name, h[i].name_len, "content-length"))
            FUZZ_CHECK(cl_line_valid(h[i].value, h[i].value_len, &ref),
                       "accepted an invalid Content-Length '%.*s'", (int)h[i].value_len,
                       h[i].value);
}

static bool inside(const char *p, size_t len, const char *lo, const char *hi)
{
    return p >= lo && p + len <= hi;
}

static void check_headers(const struct http1_header *h, size_t n, const struct http1_token *tok,
                          size_t ntok, const char *lo, const char *hi)
{
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(inside(h[i].name, h[i].name_len, lo, hi) &&
                       inside(h[i].value, h[i].value_len, lo, hi),
                   "header %zu outside the head", i);
        FUZZ_CHECK(h[i].name_len > 0, "empty header name");
        for (size_t k = 0; k < h[i].name_len; k++)
            FUZZ_CHECK(is_tchar((unsigned char)h[i].name[k]), "header name byte 0x%02x",
                       (unsigned char)h[i].name[k]);
        for (size_t k = 0; k < h[i].value_len; k++) {
            unsigned char c = (unsigned char)h[i].value[k];
            FUZZ_CHECK((c >= 0x20 || c == '\t') && c != 0x7f, "value byte 0x%02x", c);
        }
        if (h[i].value_len)
            FUZZ_CHECK(h[i].value[0] != ' ' && h[i].value[0] != '\t' &&
                           h[i].value[h[i].value_len - 1] != ' ' &&
                           h[i].value[h[i].value_len - 1] != '\t',
                       "value not trimmed");
        /* What the proxy asks of every field it forwards. */
        (void)http1_is_hop_by_hop(h[i].name, h[i].name_len, tok, ntok);
        (void)http1_list_has(h[i].value, h[i].value_len, "close");
        const struct http1_header *f = http1_find(h, n, "content-type");
        FUZZ_CHECK(!f || (f >= h && f < h + n), "http1_find outside the array");
    }
    FUZZ_CHECK(ntok <= HTTP1_MAX_CONN_TOKENS, "%zu connection tokens", ntok);
    for (size_t i = 0; i < ntok; i++)
        FUZZ_CHECK(tok[i].len > 0 && inside(tok[i].p, tok[i].len, lo, hi),
                   "connection token %zu outside the head", i);
}

#ifdef FUZZ_HTTP1_RESPONSE
static void check_msg(const MSG *m, const char *buf, ssize_t rc, const struct http1_limits *lim,
                      bool head)
{
    FUZZ_CHECK((size_t)rc == m->head_len, "returned %zd, head_len %zu", rc, m->head_len);
    FUZZ_CHECK(m->head_len <= lim->max_head_bytes, "head %zu over the limit", m->head_len);
    FUZZ_CHECK(m->num_headers <= lim->max_headers, "%zu headers", m->num_headers);
    FUZZ_CHECK(m->status >= 100 && m->status <= 599, "status %d", m->status);
    FUZZ_CHECK(m->version_minor == 0 || m->version_minor == 1, "version 1.%d", m->version_minor);
    FUZZ_CHECK(inside(m->reason, m->reason_len, buf, buf + m->head_len), "reason outside");
    check_headers(m->headers, m->num_headers, m->conn_tokens, m->num_conn_tokens, buf,
                  buf + m->head_len);
    if (head || m->status < 200 || m->status == 204 || m->status == 304)
        FUZZ_CHECK(m->body == HTTP1_BODY_NONE, "a body where none may be");
    if (m->body == HTTP1_BODY_UNTIL_CLOSE)
        FUZZ_CHECK(!m->keep_alive, "read-until-close but keep-alive");
    if (m->body == HTTP1_BODY_LENGTH)
        FUZZ_CHECK(m->content_length > 0, "length body of 0");
    /* Where Content-Length frames the body, it must be valid. */
    if (!head && m->status >= 200 && m->status != 204 && m->status != 304 &&
        !http1_find(m->headers, m->num_headers, "transfer-encoding"))
        check_content_length(m->headers, m->num_headers);
}
#else
static void check_msg(const MSG *m, const char *buf, ssize_t rc, const struct http1_limits *lim,
                      bool head)
{
    (void)head;
    FUZZ_CHECK(m->head >= buf && (size_t)(m->head - buf) + m->head_len == (size_t)rc,
               "head placement");
    FUZZ_CHECK(m->head_len <= lim->max_head_bytes, "head %zu over the limit", m->head_len);
    FUZZ_CHECK(m->num_headers <= lim->max_headers, "%zu headers", m->num_headers);
    const char *lo = m->head, *hi = m->head + m->head_len;
    FUZZ_CHECK(m->method_len > 0 && inside(m->method, m->method_len, lo, hi), "method");
    FUZZ_CHECK(m->target_len > 0 && inside(m->target, m->target_len, lo, hi), "target");
    for (size_t i = 0; i < m->target_len; i++)
        FUZZ_CHECK((unsigned char)m->target[i] > 0x20 && (unsigned char)m->target[i] < 0x7f,
                   "target byte 0x%02x", (unsigned char)m->target[i]);
    FUZZ_CHECK(m->version_minor == 0 || m->version_minor == 1, "version 1.%d", m->version_minor);
    check_headers(m->headers, m->num_headers, m->conn_tokens, m->num_conn_tokens, lo, hi);
    if (m->version_minor == 1)
        FUZZ_CHECK(m->host != NULL, "HTTP/1.1 without Host accepted");
    if (m->host)
        FUZZ_CHECK(m->host >= m->headers && m->host < m->headers + m->num_headers,
                   "host is not one of the headers");
    /* Smuggling: chunked only in 1.1, never together with Content-Length. */
    if (m->body == HTTP1_BODY_CHUNKED) {
        FUZZ_CHECK(m->version_minor == 1, "chunked in HTTP/1.0");
        FUZZ_CHECK(!http1_find(m->headers, m->num_headers, "content-length"),
                   "chunked with Content-Length");
    }
    if (m->body == HTTP1_BODY_LENGTH) {
        FUZZ_CHECK(m->content_length > 0, "length body of 0");
        FUZZ_CHECK(!http1_find(m->headers, m->num_headers, "transfer-encoding"),
                   "Content-Length with Transfer-Encoding");
    }
    FUZZ_CHECK(m->body != HTTP1_BODY_UNTIL_CLOSE, "request body until close");
    check_content_length(m->headers, m->num_headers);
}
#endif

static void compare_msgs(const MSG *a, const MSG *b)
{
#ifdef FUZZ_HTTP1_RESPONSE
    FUZZ_CHECK(a->status == b->status && a->reason == b->reason && a->reason_len == b->reason_len,
               "status line differs");
#else
    FUZZ_CHECK(a->method == b->method && a->method_len == b->method_len &&
                   a->target == b->target && a->target_len == b->target_len &&
                   a->head == b->head && a->expect_continue == b->expect_continue,
               "request line differs");
    FUZZ_CHECK((a->host == NULL) == (b->host == NULL) &&
                   (!a->host || a->host - a->headers == b->host - b->headers),
               "host differs");
#endif
    FUZZ_CHECK(a->version_minor == b->version_minor && a->head_len == b->head_len &&
                   a->body == b->body && a->content_length == b->content_length &&
                   a->keep_alive == b->keep_alive && a->num_headers == b->num_headers &&
                   a->num_conn_tokens == b->num_conn_tokens,
               "parsed fields differ");
    for (size_t i = 0; i < a->num_headers; i++)
        FUZZ_CHECK(a->headers[i].name == b->headers[i].name &&
                       a->headers[i].name_len == b->headers[i].name_len &&
                       a->headers[i].value == b->headers[i].value &&
                       a->headers[i].value_len == b->headers[i].value_len,
                   "header %zu differs", i);
}

struct body_result {
    uint64_t hash;
    size_t data;
    size_t consumed;
    bool error;
    bool done;
};

static void decode_body(const char *in, size_t len, struct fuzz_rng *rng, struct body_result *r)
{
    struct http1_chunked c;
    http1_chunked_init(&c);
    memset(r, 0, sizeof(*r));
    r->hash = 1469598103934665603ull;
    size_t off = 0;
    while (off < len && !http1_chunked_done(&c)) {
        size_t piece = rng ? fuzz_rng_chunk(rng, len - off) : len - off;
        size_t used_piece = 0;
        while (used_piece < piece && !http1_chunked_done(&c)) {
            size_t doff = (size_t)-1, dlen = (size_t)-1;
            ssize_t used = http1_chunked_decode(&c, in + off + used_piece, piece - used_piece,
                                                &doff, &dlen);
            if (used < 0) {
                FUZZ_CHECK(used == HTTP1_ERR_CHUNK, "decoder returned %zd", used);
                r->error = true;
                r->consumed = off + used_piece;
                return;
            }
            FUZZ_CHECK((size_t)used <= piece - used_piece, "consumed %zd of %zu", used,
                       piece - used_piece);
            FUZZ_CHECK(used > 0 || http1_chunked_done(&c), "no progress on %zu bytes",
                       piece - used_piece);
            FUZZ_CHECK(dlen == 0 || doff + dlen <= (size_t)used, "data run outside the input");
            for (size_t k = 0; k < dlen; k++) {
                r->hash ^= (unsigned char)in[off + used_piece + doff + k];
                r->hash *= 1099511628211ull;
            }
            r->data += dlen;
            used_piece += (size_t)used;
        }
        off += used_piece;
    }
    r->consumed = off;
    r->done = http1_chunked_done(&c);
}

/* Returns the bytes the body took (chunked: decoded; length: skipped), or
 * -1 when the connection cannot go on (error, or body until close). */
static ssize_t body_len(const MSG *m, const char *in, size_t len, const uint8_t *seed,
                        size_t seed_len)
{
    if (m->body == HTTP1_BODY_NONE)
        return 0;
    if (m->body == HTTP1_BODY_LENGTH)
        return m->content_length <= len ? (ssize_t)m->content_length : -1;
    if (m->body != HTTP1_BODY_CHUNKED)
        return -1;
    struct body_result whole, split;
    struct fuzz_rng rng;
    fuzz_rng_seed(&rng, seed, seed_len);
    decode_body(in, len, NULL, &whole);
    decode_body(in, len, &rng, &split);
    FUZZ_CHECK(whole.error == split.error && whole.done == split.done &&
                   whole.data == split.data && whole.hash == split.hash,
               "chunked decoding depends on the split");
    if (!whole.error)
        FUZZ_CHECK(whole.consumed == split.consumed, "consumed %zu vs %zu", whole.consumed,
                   split.consumed);
    if (whole.error || !whole.done)
        return -1;
    return (ssize_t)whole.consumed;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const size_t heads[] = {64, 256, 1024, 32768};
    static const size_t nhdrs[] = {1, 4, 100, HTTP1_MAX_HEADERS};
    struct http1_limits lim = {heads[data[0] & 3], nhdrs[(data[0] >> 2) & 3]};
    bool head = (data[0] >> 4) & 1;
    size_t n = size - 1;
    /* An exact copy so reading one past the end is caught. */
    char *buf = malloc(n ? n : 1);
    MSG *a = malloc(sizeof(*a));
    MSG *b = malloc(sizeof(*b));
    if (!buf || !a || !b)
        goto out;
    if (n)
        memcpy(buf, data + 1, n);
    struct fuzz_rng rng;
    fuzz_rng_seed(&rng, data, size);
    size_t off = 0;
    for (int msg = 0; msg < 4 && off < n; msg++) {
        const char *p = buf + off;
        size_t len = n - off;
        struct http1_scan s1, s2;
        http1_scan_init(&s1);
        ssize_t whole = parse(&s1, p, len, &lim, head, a);
        /* The same bytes arriving in pieces. */
        http1_scan_init(&s2);
        ssize_t split = HTTP1_INCOMPLETE;
        size_t have = 0;
        while (have < len) {
            have += fuzz_rng_chunk(&rng, len - have);
            split = parse(&s2, p, have, &lim, head, b);
            if (split != HTTP1_INCOMPLETE)
                break;
        }
        FUZZ_CHECK(whole == split, "message %d: %zd in one piece, %zd in pieces (%s / %s)", msg,
                   whole, split, http1_strerror((int)whole), http1_strerror((int)split));
        FUZZ_CHECK(http1_strerror((int)whole) != NULL, "no error text");
        if (whole < 0) {
            int st = http1_err_status((int)whole);
            FUZZ_CHECK(st >= 400 && st <= 505, "error status %d", st);
            break;
        }
        FUZZ_CHECK(whole > 0 && (size_t)whole <= len, "consumed %zd of %zu", whole, len);
        check_msg(a, p, whole, &lim, head);
        compare_msgs(a, b);
        ssize_t body = body_len(a, p + whole, len - (size_t)whole, data, size);
        if (body < 0)
            break;
        off += (size_t)whole + (size_t)body;
    }
out:
    free(buf);
    free(a);
    free(b);
    return 0;
}
