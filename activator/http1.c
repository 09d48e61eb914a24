#include "http1.h"

#include <stddef.h>
#include <string.h>

static const char *const err_text[] = {
    [0] = "ok",
    [1] = "incomplete",
    [2] = "malformed start line or header field",
    [3] = "message head too large",
    [4] = "too many header fields",
    [5] = "unsupported HTTP version",
    [6] = "invalid Content-Length",
    [7] = "unsupported transfer coding",
    [8] = "ambiguous message framing",
    [9] = "missing or repeated Host",
    [10] = "unsupported expectation",
    [11] = "malformed chunked body",
    [12] = "malformed status line",
    [13] = "obsolete line folding",
};

const char *http1_strerror(int err)
{
    int i = -err;
    if (i < 0 || (size_t)i >= sizeof(err_text) / sizeof(err_text[0]))
        return "unknown error";
    return err_text[i];
}

int http1_err_status(int err)
{
    switch (err) {
    case HTTP1_ERR_HEAD_TOO_LARGE:
    case HTTP1_ERR_TOO_MANY_HEADERS:
        return 431;
    case HTTP1_ERR_VERSION:
        return 505;
    case HTTP1_ERR_TRANSFER_CODING:
        return 501;
    case HTTP1_ERR_EXPECT:
        return 417;
    default:
        return 400;
    }
}

void http1_scan_init(struct http1_scan *s) { memset(s, 0, sizeof(*s)); }

/* RFC 9110 tchar. */
static bool is_tchar(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return true;
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
        return true;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool is_ows(char c) { return c == ' ' || c == '\t'; }

/* Field values and reason phrases: HTAB, SP, VCHAR and obs-text, so no
 * control character (a bare CR ends the line for some readers). */
static bool is_text(const char *p, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)p[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return false;
    }
    return true;
}

static char lower(char c) { return (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c; }

bool http1_eq_nocase(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    if (alen != blen)
        return false;
    for (size_t i = 0; i < alen; i++) {
        if (lower(a[i]) != lower(b[i]))
            return false;
    }
    return true;
}

const struct http1_header *http1_find(const struct http1_header *h, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        if (http1_eq_nocase(h[i].name, h[i].name_len, name))
            return &h[i];
    }
    return NULL;
}

/* Calls fn for each non-empty element of a comma-separated list, trimmed.
 * Stops early and returns false when fn does. */
typedef bool (*list_fn)(void *ud, const char *p, size_t len);

static bool list_each(const char *v, size_t len, list_fn fn, void *ud)
{
    size_t i = 0;
    while (i < len) {
        size_t start = i;
        while (i < len && v[i] != ',')
            i++;
        size_t a = start, b = i;
        while (a < b && is_ows(v[a]))
            a++;
        while (b > a && is_ows(v[b - 1]))
            b--;
        if (b > a && !fn(ud, v + a, b - a))
            return false;
        i++; /* skip the comma */
    }
    return true;
}

struct has_ctx {
    const char *token;
    bool found;
};

static bool has_cb(void *ud, const char *p, size_t len)
{
    struct has_ctx *h = ud;
    if (http1_eq_nocase(p, len, h->token)) {
        h->found = true;
        return false;
    }
    return true;
}

bool http1_list_has(const char *value, size_t len, const char *token)
{
    struct has_ctx h = {token, false};
    list_each(value, len, has_cb, &h);
    return h.found;
}

static const char *const hop_fields[] = {
    "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
};

bool http1_is_hop_by_hop(const char *name, size_t len, const struct http1_token *conn_tokens,
                         size_t num_conn_tokens)
{
    for (size_t i = 0; i < sizeof(hop_fields) / sizeof(hop_fields[0]); i++) {
        if (http1_eq_nocase(name, len, hop_fields[i]))
            return true;
    }
    for (size_t i = 0; i < num_conn_tokens; i++) {
        if (conn_tokens[i].len == len) {
            size_t j = 0;
            while (j < len && lower(conn_tokens[i].p[j]) == lower(name[j]))
                j++;
            if (j == len)
                return true;
        }
    }
    return false;
}

/* Finds the end of the head (the blank line) in buf[start..len), resuming
 * from s->scanned. A bare LF still ends a line here so that a client using
 * bare LFs gets a 400 from the line parser instead of waiting for a timeout.
 * Returns the head length counted from start, or HTTP1_INCOMPLETE. */
static ssize_t find_head_end(struct http1_scan *s, const char *buf, size_t start, size_t len)
{
    const char *base = buf + start;
    size_t n = len - start;
    size_t i = s->scanned;
    while (i < n) {
        const char *nl = memchr(base + i, '\n', n - i);
        if (!nl) {
            s->scanned = n;
            return HTTP1_INCOMPLETE;
        }
        size_t at = (size_t)(nl - base);
        if (at + 1 >= n) {
            s->scanned = at;
            return HTTP1_INCOMPLETE;
        }
        if (base[at + 1] == '\n')
            return (ssize_t)(at + 2);
        if (base[at + 1] == '\r') {
            if (at + 2 >= n) {
                s->scanned = at;
                return HTTP1_INCOMPLETE;
            }
            if (base[at + 2] == '\n')
                return (ssize_t)(at + 3);
        }
        i = at + 1;
    }
    s->scanned = n;
    return HTTP1_INCOMPLETE;
}

/* Locates the head: skips leading empty lines (requests), finds the end,
 * applies the size limit. Returns the head length (from *head_start) or an
 * HTTP1 code. */
static ssize_t locate_head(struct http1_scan *s, const char *buf, size_t len, size_t max_head,
                           bool skip_empty, size_t *head_start)
{
    if (skip_empty) {
        while (s->skipped < len) {
            char c = buf[s->skipped];
            if (c != '\r')
                break;
            if (s->skipped + 1 >= len)
                return HTTP1_INCOMPLETE;
            if (buf[s->skipped + 1] != '\n')
                return HTTP1_ERR_SYNTAX;
            s->skipped += 2;
            if (s->skipped > max_head)
                return HTTP1_ERR_HEAD_TOO_LARGE;
        }
        if (s->skipped >= len)
            return HTTP1_INCOMPLETE;
    }
    *head_start = s->skipped;
    ssize_t end = find_head_end(s, buf, s->skipped, len);
    if (end == HTTP1_INCOMPLETE) {
        if (len - s->skipped >= max_head)
            return HTTP1_ERR_HEAD_TOO_LARGE;
        return HTTP1_INCOMPLETE;
    }
    if ((size_t)end > max_head)
        return HTTP1_ERR_HEAD_TOO_LARGE;
    return end;
}

/* Reads one CRLF-terminated line starting at *pos within head[0..len).
 * Sets *line and *line_len (without CRLF) and advances *pos. Bare LF is an error. */
static int next_line(const char *head, size_t len, size_t *pos, const char **line,
                     size_t *line_len)
{
    const char *p = head + *pos;
    const char *nl = memchr(p, '\n', len - *pos);
    if (!nl)
        return HTTP1_ERR_SYNTAX;
    size_t l = (size_t)(nl - p);
    if (l == 0 || p[l - 1] != '\r')
        return HTTP1_ERR_SYNTAX;
    *line = p;
    *line_len = l - 1;
    *pos += l + 1;
    return 0;
}

static int parse_version(const char *p, size_t len, int *minor)
{
    if (len != 8 || memcmp(p, "HTTP/", 5) != 0 || p[6] != '.' || p[5] < '0' || p[5] > '9' ||
        p[7] < '0' || p[7] > '9')
        return HTTP1_ERR_SYNTAX;
    if (p[5] != '1' || (p[7] != '0' && p[7] != '1'))
        return HTTP1_ERR_VERSION;
    *minor = p[7] - '0';
    return 0;
}

/* Parses field lines until the blank line. */
static int parse_fields(const char *head, size_t len, size_t pos, size_t max_headers,
                        struct http1_header *out, size_t *num)
{
    size_t n = 0;
    if (max_headers > HTTP1_MAX_HEADERS)
        max_headers = HTTP1_MAX_HEADERS;
    for (;;) {
        const char *line;
        size_t ll;
        int rc = next_line(head, len, &pos, &line, &ll);
        if (rc < 0)
            return rc;
        if (ll == 0)
            break;
        if (is_ows(line[0]))
            return HTTP1_ERR_OBS_FOLD;
        size_t i = 0;
        while (i < ll && is_tchar((unsigned char)line[i]))
            i++;
        if (i == 0 || i >= ll || line[i] != ':')
            return HTTP1_ERR_SYNTAX;
        size_t name_len = i++;
        while (i < ll && is_ows(line[i]))
            i++;
        size_t vstart = i, vend = ll;
        while (vend > vstart && is_ows(line[vend - 1]))
            vend--;
        if (!is_text(line + vstart, vend - vstart))
            return HTTP1_ERR_SYNTAX;
        if (n >= max_headers)
            return HTTP1_ERR_TOO_MANY_HEADERS;
        out[n].name = line;
        out[n].name_len = name_len;
        out[n].value = line + vstart;
        out[n].value_len = vend - vstart;
        n++;
    }
    *num = n;
    return 0;
}

struct cl_ctx {
    bool seen;
    bool bad;
    uint64_t value;
    size_t elements; /* list elements seen, to catch a value of only commas */
};

static bool cl_cb(void *ud, const char *p, size_t len)
{
    struct cl_ctx *c = ud;
    uint64_t v = 0;
    c->elements++;
    if (len > 18) { /* keeps the value far below overflow */
        c->bad = true;
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') {
            c->bad = true;
            return false;
        }
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    if (c->seen && v != c->value) {
        c->bad = true;
        return false;
    }
    c->seen = true;
    c->value = v;
    return true;
}

struct te_ctx {
    size_t codings;
    bool last_chunked;
    bool chunked_before_last;
    bool other;
};

static bool te_cb(void *ud, const char *p, size_t len)
{
    struct te_ctx *t = ud;
    if (t->last_chunked)
        t->chunked_before_last = true;
    t->codings++;
    t->last_chunked = http1_eq_nocase(p, len, "chunked");
    if (!t->last_chunked)
        t->other = true;
    return true;
}

struct conn_ctx {
    struct http1_token *tokens;
    size_t n;
    bool overflow;
};

static bool conn_cb(void *ud, const char *p, size_t len)
{
    struct conn_ctx *c = ud;
    if (c->n >= HTTP1_MAX_CONN_TOKENS) {
        c->overflow = true;
        return false;
    }
    c->tokens[c->n].p = p;
    c->tokens[c->n].len = len;
    c->n++;
    return true;
}

/* What the fields say about framing and the connection, shared by both
 * message kinds. */
struct framing {
    struct cl_ctx cl;
    struct te_ctx te;
    bool te_present;
    size_t hosts;
    const struct http1_header *host;
    const struct http1_header *expect;
    bool conn_close;
    bool conn_keep_alive;
};

static int scan_fields(const struct http1_header *h, size_t n, struct http1_token *tokens,
                       size_t *num_tokens, struct framing *f)
{
    memset(f, 0, sizeof(*f));
    struct conn_ctx cc = {tokens, 0, false};
    for (size_t i = 0; i < n; i++) {
        const char *name = h[i].name;
        size_t nl = h[i].name_len;
        if (http1_eq_nocase(name, nl, "content-length")) {
            /* An empty value is no valid length either, nor one of only
             * commas (list_each finds no element in it: found by fuzzing). */
            size_t before = f->cl.elements;
            if (h[i].value_len == 0)
                f->cl.bad = true;
            else
                list_each(h[i].value, h[i].value_len, cl_cb, &f->cl);
            if (f->cl.elements == before)
                f->cl.bad = true;
        } else if (http1_eq_nocase(name, nl, "transfer-encoding")) {
            f->te_present = true;
            list_each(h[i].value, h[i].value_len, te_cb, &f->te);
        } else if (http1_eq_nocase(name, nl, "host")) {
            f->hosts++;
            f->host = &h[i];
        } else if (http1_eq_nocase(name, nl, "expect")) {
            f->expect = &h[i];
        } else if (http1_eq_nocase(name, nl, "connection")) {
            list_each(h[i].value, h[i].value_len, conn_cb, &cc);
            if (cc.overflow)
                return HTTP1_ERR_SYNTAX;
        }
    }
    for (size_t i = 0; i < cc.n; i++) {
        if (http1_eq_nocase(tokens[i].p, tokens[i].len, "close"))
            f->conn_close = true;
        else if (http1_eq_nocase(tokens[i].p, tokens[i].len, "keep-alive"))
            f->conn_keep_alive = true;
    }
    *num_tokens = cc.n;
    return 0;
}

static bool keep_alive_for(int minor, const struct framing *f)
{
    if (f->conn_close)
        return false;
    return minor >= 1 || f->conn_keep_alive;
}

ssize_t http1_parse_request(struct http1_scan *s, const char *buf, size_t len,
                            const struct http1_limits *lim, struct http1_request *out)
{
    size_t start = 0;
    ssize_t hl = locate_head(s, buf, len, lim->max_head_bytes, true, &start);
    if (hl < 0)
        return hl;
    const char *head = buf + start;
    size_t head_len = (size_t)hl;
    memset(out, 0, offsetof(struct http1_request, conn_tokens));

    size_t pos = 0;
    const char *line;
    size_t ll;
    int rc = next_line(head, head_len, &pos, &line, &ll);
    if (rc < 0)
        return rc;
    /* method SP request-target SP HTTP-version */
    size_t i = 0;
    while (i < ll && is_tchar((unsigned char)line[i]))
        i++;
    if (i == 0 || i >= ll || line[i] != ' ')
        return HTTP1_ERR_SYNTAX;
    out->method = line;
    out->method_len = i++;
    size_t tstart = i;
    while (i < ll && line[i] != ' ') {
        unsigned char c = (unsigned char)line[i];
        if (c <= 0x20 || c >= 0x7f)
            return HTTP1_ERR_SYNTAX;
        i++;
    }
    if (i == tstart || i >= ll)
        return HTTP1_ERR_SYNTAX;
    out->target = line + tstart;
    out->target_len = i - tstart;
    i++;
    rc = parse_version(line + i, ll - i, &out->version_minor);
    if (rc < 0)
        return rc;

    rc = parse_fields(head, head_len, pos, lim->max_headers, out->headers, &out->num_headers);
    if (rc < 0)
        return rc;
    struct framing f;
    rc = scan_fields(out->headers, out->num_headers, out->conn_tokens, &out->num_conn_tokens, &f);
    if (rc < 0)
        return rc;

    if (f.te_present) {
        /* Smuggling defence: refuse rather than pick one of two framings. */
        if (f.cl.seen || f.cl.bad || out->version_minor == 0)
            return HTTP1_ERR_FRAMING;
        if (f.te.other || f.te.chunked_before_last || f.te.codings == 0)
            return f.te.codings == 0 ? HTTP1_ERR_FRAMING : HTTP1_ERR_TRANSFER_CODING;
        out->body = HTTP1_BODY_CHUNKED;
    } else if (f.cl.bad) {
        return HTTP1_ERR_CONTENT_LENGTH;
    } else if (f.cl.seen && f.cl.value > 0) {
        out->body = HTTP1_BODY_LENGTH;
        out->content_length = f.cl.value;
    } else {
        out->body = HTTP1_BODY_NONE;
    }
    if (out->version_minor >= 1 ? f.hosts != 1 : f.hosts > 1)
        return HTTP1_ERR_HOST;
    out->host = f.host;
    if (f.expect && out->version_minor >= 1) {
        if (!http1_eq_nocase(f.expect->value, f.expect->value_len, "100-continue"))
            return HTTP1_ERR_EXPECT;
        out->expect_continue = true;
    }
    out->keep_alive = keep_alive_for(out->version_minor, &f);
    out->head = head;
    out->head_len = head_len;
    return (ssize_t)(start + head_len);
}

ssize_t http1_parse_response(struct http1_scan *s, const char *buf, size_t len,
                             const struct http1_limits *lim, bool request_was_head,
                             struct http1_response *out)
{
    size_t start = 0;
    ssize_t hl = locate_head(s, buf, len, lim->max_head_bytes, false, &start);
    if (hl < 0)
        return hl;
    size_t head_len = (size_t)hl;
    memset(out, 0, offsetof(struct http1_response, conn_tokens));

    size_t pos = 0;
    const char *line;
    size_t ll;
    int rc = next_line(buf, head_len, &pos, &line, &ll);
    if (rc < 0)
        return HTTP1_ERR_STATUS;
    if (ll < 12 || line[8] != ' ')
        return HTTP1_ERR_STATUS;
    rc = parse_version(line, 8, &out->version_minor);
    if (rc < 0)
        return rc == HTTP1_ERR_VERSION ? rc : HTTP1_ERR_STATUS;
    int status = 0;
    for (size_t i = 9; i < 12; i++) {
        if (line[i] < '0' || line[i] > '9')
            return HTTP1_ERR_STATUS;
        status = status * 10 + (line[i] - '0');
    }
    /* RFC 9110 15: a status outside 100..599 is invalid. Forwarded, a 600
     * or 999 reaches clients whose handling of it nobody can predict. */
    if (status < 100 || status > 599)
        return HTTP1_ERR_STATUS;
    if (ll > 12 && line[12] != ' ')
        return HTTP1_ERR_STATUS;
    out->status = status;
    out->reason = ll > 13 ? line + 13 : line + ll;
    out->reason_len = ll > 13 ? ll - 13 : 0;
    /* A bare CR passed on would end the line for some clients, and what
     * follows it would be a header the server never sent. */
    if (!is_text(out->reason, out->reason_len))
        return HTTP1_ERR_STATUS;

    rc = parse_fields(buf, head_len, pos, lim->max_headers, out->headers, &out->num_headers);
    if (rc < 0)
        return rc;
    struct framing f;
    rc = scan_fields(out->headers, out->num_headers, out->conn_tokens, &out->num_conn_tokens, &f);
    if (rc < 0)
        return rc;
    out->keep_alive = keep_alive_for(out->version_minor, &f);
    if (request_was_head || status < 200 || status == 204 || status == 304) {
        out->body = HTTP1_BODY_NONE;
    } else if (f.te_present) {
        /* RFC 9112 6.3: Transfer-Encoding overrides Content-Length. Only
         * chunked alone is taken: the proxy removes the field (hop-by-hop) and
         * frames the body itself, so another coding (gzip, ...) would reach
         * the client undecoded and unlabelled, and chunked twice would hand
         * it the inner chunk lines as data. */
        if (f.te.other || f.te.chunked_before_last || f.te.codings == 0)
            return f.te.codings == 0 ? HTTP1_ERR_FRAMING : HTTP1_ERR_TRANSFER_CODING;
        out->body = HTTP1_BODY_CHUNKED;
        if (f.cl.seen || f.cl.bad)
            out->keep_alive = false;
    } else if (f.cl.bad) {
        return HTTP1_ERR_CONTENT_LENGTH;
    } else if (f.cl.seen) {
        out->body = f.cl.value ? HTTP1_BODY_LENGTH : HTTP1_BODY_NONE;
        out->content_length = f.cl.value;
    } else {
        out->body = HTTP1_BODY_UNTIL_CLOSE;
        out->keep_alive = false;
    }
    out->head_len = head_len;
    return (ssize_t)head_len;
}

/* ---- chunked transfer coding ---- */

enum {
    CH_SIZE_START, /* expecting the first hex digit */
    CH_SIZE,       /* more hex digits, or extension / CR */
    CH_EXT,        /* chunk extension up to CR */
    CH_SIZE_LF,
    CH_DATA,
    CH_DATA_CR,
    CH_DATA_LF,
    CH_TRAILER_START, /* start of a trailer line or the final CRLF */
    CH_TRAILER,       /* inside a trailer line */
    CH_TRAILER_LF,    /* CR seen inside a trailer line */
    CH_END_LF,        /* CR of the final empty line seen */
    CH_DONE,
};

#define CHUNK_LINE_MAX 4096
#define CHUNK_TRAILER_MAX 8192

void http1_chunked_init(struct http1_chunked *c) { memset(c, 0, sizeof(*c)); }

bool http1_chunked_done(const struct http1_chunked *c) { return c->state == CH_DONE; }

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch = lower(ch);
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

ssize_t http1_chunked_decode(struct http1_chunked *c, const char *in, size_t len,
                             size_t *data_off, size_t *data_len)
{
    size_t i = 0;
    *data_off = 0;
    *data_len = 0;
    while (i < len && c->state != CH_DONE) {
        char ch = in[i];
        switch (c->state) {
        case CH_SIZE_START:
        case CH_SIZE: {
            int h = hexval(ch);
            if (h >= 0) {
                if (++c->digits > 15)
                    return HTTP1_ERR_CHUNK;
                c->remaining = c->remaining * 16 + (uint64_t)h;
                c->state = CH_SIZE;
            } else if (c->state == CH_SIZE_START) {
                return HTTP1_ERR_CHUNK;
            } else if (ch == '\r') {
                c->state = CH_SIZE_LF;
            } else if (ch == ';' || is_ows(ch)) {
                c->state = CH_EXT;
                c->line_len = 0;
            } else {
                return HTTP1_ERR_CHUNK;
            }
            i++;
            break;
        }
        case CH_EXT:
            if (ch == '\r') {
                c->state = CH_SIZE_LF;
            } else if (((unsigned char)ch < 0x20 && ch != '\t') || ch == 0x7f ||
                       ++c->line_len > CHUNK_LINE_MAX) {
                return HTTP1_ERR_CHUNK;
            }
            i++;
            break;
        case CH_SIZE_LF:
            if (ch != '\n')
                return HTTP1_ERR_CHUNK;
            i++;
            c->digits = 0;
            c->state = c->remaining ? CH_DATA : CH_TRAILER_START;
            break;
        case CH_DATA: {
            size_t n = len - i;
            if ((uint64_t)n > c->remaining)
                n = (size_t)c->remaining;
            *data_off = i;
            *data_len = n;
            c->remaining -= n;
            i += n;
            if (c->remaining == 0)
                c->state = CH_DATA_CR;
            return (ssize_t)i; /* one data run per call */
        }
        case CH_DATA_CR:
            if (ch != '\r')
                return HTTP1_ERR_CHUNK;
            c->state = CH_DATA_LF;
            i++;
            break;
        case CH_DATA_LF:
            if (ch != '\n')
                return HTTP1_ERR_CHUNK;
            c->state = CH_SIZE_START;
            i++;
            break;
        case CH_TRAILER_START:
            if (ch == '\r') {
                c->state = CH_END_LF;
            } else if (ch == '\n' || is_ows(ch)) {
                return HTTP1_ERR_CHUNK;
            } else {
                c->state = CH_TRAILER;
                if (++c->trailer_bytes > CHUNK_TRAILER_MAX)
                    return HTTP1_ERR_CHUNK;
            }
            i++;
            break;
        case CH_TRAILER:
            if (ch == '\r')
                c->state = CH_TRAILER_LF;
            else if (ch == '\n' || ch == '\0')
                return HTTP1_ERR_CHUNK;
            if (++c->trailer_bytes > CHUNK_TRAILER_MAX)
                return HTTP1_ERR_CHUNK;
            i++;
            break;
        case CH_TRAILER_LF:
            if (ch != '\n')
                return HTTP1_ERR_CHUNK;
            c->state = CH_TRAILER_START;
            i++;
            break;
        case CH_END_LF:
            if (ch != '\n')
                return HTTP1_ERR_CHUNK;
            c->state = CH_DONE;
            i++;
            break;
        default:
            return HTTP1_ERR_CHUNK;
        }
    }
    return (ssize_t)i;
}
