/* http1: incremental HTTP/1.1 message parsing (RFC 9112), no I/O.
 *
 * The head parsers take the bytes received so far and say how much they
 * consumed: a head length (> 0) once the whole head is there, HTTP1_INCOMPLETE
 * while it is not, or a negative HTTP1_ERR_* with a static description
 * (http1_strerror) and the status a server answers (http1_err_status).
 * Parsed fields point into the caller's buffer; nothing is copied, so they are
 * valid as long as that buffer is.
 *
 * Feeding is incremental: a struct http1_scan remembers how far the search for
 * the end of the head got, so calling again with a longer buffer (same start)
 * does not rescan, and input split at any byte gives the same result.
 *
 * Bodies: http1_chunked decodes the chunked transfer coding a byte range at a
 * time, pointing at the data runs inside the input. */
#ifndef THAW_HTTP1_H
#define THAW_HTTP1_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Room for headers in a parsed message; http1_limits.max_headers may lower it. */
#define HTTP1_MAX_HEADERS 128
/* Connection tokens remembered per message (names of extra hop-by-hop fields). */
#define HTTP1_MAX_CONN_TOKENS 16

enum http1_err {
    HTTP1_INCOMPLETE = -1,
    HTTP1_ERR_SYNTAX = -2,           /* malformed start line or header line: 400 */
    HTTP1_ERR_HEAD_TOO_LARGE = -3,   /* head longer than max_head_bytes: 431 */
    HTTP1_ERR_TOO_MANY_HEADERS = -4, /* more than max_headers fields: 431 */
    HTTP1_ERR_VERSION = -5,          /* not HTTP/1.0 or HTTP/1.1: 505 */
    HTTP1_ERR_CONTENT_LENGTH = -6,   /* invalid or conflicting Content-Length: 400 */
    HTTP1_ERR_TRANSFER_CODING = -7,  /* a transfer coding other than chunked: 501 */
    HTTP1_ERR_FRAMING = -8,          /* Transfer-Encoding with Content-Length, or in 1.0: 400 */
    HTTP1_ERR_HOST = -9,             /* missing or repeated Host in 1.1: 400 */
    HTTP1_ERR_EXPECT = -10,          /* an expectation other than 100-continue: 417 */
    HTTP1_ERR_CHUNK = -11,           /* malformed chunked body: 400 */
    HTTP1_ERR_STATUS = -12,          /* malformed response status line, or status not 100..599 */
    HTTP1_ERR_OBS_FOLD = -13,        /* obsolete line folding: 400 */
};

/* Static description of an HTTP1_* code; never NULL. */
const char *http1_strerror(int err);
/* The status code a server answers a request error with (400, 417, 431, 501, 505). */
int http1_err_status(int err);

struct http1_limits {
    size_t max_head_bytes; /* start line + fields + blank line */
    size_t max_headers;    /* at most HTTP1_MAX_HEADERS */
};

struct http1_header {
    const char *name;
    size_t name_len;
    const char *value; /* without surrounding whitespace */
    size_t value_len;
};

enum http1_body {
    HTTP1_BODY_NONE,
    HTTP1_BODY_LENGTH,     /* content_length bytes */
    HTTP1_BODY_CHUNKED,
    HTTP1_BODY_UNTIL_CLOSE, /* responses only: read until the peer closes */
};

struct http1_token {
    const char *p;
    size_t len;
};

/* Resumable search state for one message head. Zero it (http1_scan_init)
 * before the first call and between messages. */
struct http1_scan {
    size_t skipped; /* leading empty lines skipped (requests) */
    size_t scanned; /* bytes after `skipped` known not to hold the head's end */
};

void http1_scan_init(struct http1_scan *s);

struct http1_request {
    const char *method;
    size_t method_len;
    const char *target;
    size_t target_len;
    int version_minor; /* 0 or 1 */
    size_t num_headers;
    const char *head; /* start of the request line (after skipped empty lines) */
    size_t head_len;  /* from `head` through the blank line */
    enum http1_body body;
    uint64_t content_length;
    bool keep_alive;      /* by version and Connection */
    bool expect_continue; /* Expect: 100-continue */
    const struct http1_header *host; /* NULL when absent (1.0) */
    size_t num_conn_tokens;
    /* Arrays last: the parser zeroes only the fields above. */
    struct http1_token conn_tokens[HTTP1_MAX_CONN_TOKENS];
    struct http1_header headers[HTTP1_MAX_HEADERS];
};

/* Parses a request head from buf[0..len). Returns the bytes consumed (leading
 * empty lines included) when complete, HTTP1_INCOMPLETE, or an HTTP1_ERR_*.
 * buf must start where the previous call's buf started. */
ssize_t http1_parse_request(struct http1_scan *s, const char *buf, size_t len,
                            const struct http1_limits *lim, struct http1_request *out);

struct http1_response {
    int version_minor;
    int status;
    const char *reason;
    size_t reason_len;
    size_t num_headers;
    size_t head_len;
    enum http1_body body;
    uint64_t content_length;
    bool keep_alive; /* the connection may carry another request after this response */
    size_t num_conn_tokens;
    /* Arrays last: the parser zeroes only the fields above. */
    struct http1_token conn_tokens[HTTP1_MAX_CONN_TOKENS];
    struct http1_header headers[HTTP1_MAX_HEADERS];
};

/* Parses a response head. request_was_head: the request was HEAD (no body
 * follows whatever the fields say). 1xx responses parse like any other; the
 * caller skips them. Same return convention as http1_parse_request. */
ssize_t http1_parse_response(struct http1_scan *s, const char *buf, size_t len,
                             const struct http1_limits *lim, bool request_was_head,
                             struct http1_response *out);

/* Case-insensitive field lookup; returns the first match or NULL. */
const struct http1_header *http1_find(const struct http1_header *h, size_t n, const char *name);

/* True if name is a hop-by-hop field: the fixed set (Connection, Keep-Alive,
 * Proxy-Connection, TE, Trailer, Transfer-Encoding, Upgrade) or one of the
 * given Connection tokens. Such fields are not forwarded. */
bool http1_is_hop_by_hop(const char *name, size_t len, const struct http1_token *conn_tokens,
                         size_t num_conn_tokens);

/* True if the comma-separated list in value[0..len) holds token (case-insensitive). */
bool http1_list_has(const char *value, size_t len, const char *token);

/* True if [a, a+alen) equals NUL-terminated b ignoring ASCII case. */
bool http1_eq_nocase(const char *a, size_t alen, const char *b);

/* Chunked transfer coding decoder. */
struct http1_chunked {
    int state;
    uint64_t remaining; /* data bytes left in the current chunk */
    size_t line_len;    /* bytes of the current size/trailer line (bounded) */
    size_t trailer_bytes;
    unsigned digits;
};

void http1_chunked_init(struct http1_chunked *c);

/* Decodes from in[0..len). Returns the bytes consumed (>= 0) or HTTP1_ERR_CHUNK.
 * Sets *data_off and *data_len to a run of body data inside the consumed bytes
 * (*data_len 0 when there is none); a call yields at most one run, so callers
 * loop while bytes remain. Stops consuming at the end of the body (the input
 * may hold the next message). Trailer fields are skipped (bounded to 8 KiB). */
ssize_t http1_chunked_decode(struct http1_chunked *c, const char *in, size_t len,
                             size_t *data_off, size_t *data_len);

/* True once the last chunk and the trailer section were consumed. */
bool http1_chunked_done(const struct http1_chunked *c);

#endif
