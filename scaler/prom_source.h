/* prom_source: the Prometheus signal. One instant query per interval for all
 * models, through libcurl's multi interface driven by the libevent loop, the
 * JSON answer parsed with jansson.
 *
 * The parser (prom_parse_vector) is pure and does no I/O, so it is unit-tested
 * and fuzzable on its own. The I/O part never blocks the loop. */
#ifndef THAW_PROM_SOURCE_H
#define THAW_PROM_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct prom_source;

/* One element of an instant-vector result: the value of `label` and the sample. */
struct prom_sample {
    char *label_value; /* owned by the array (freed by prom_samples_free) */
    double value;      /* finite and >= 0; 0 when invalid */
    /* The value was NaN, +Inf, -Inf, out of range or negative: not a reading
     * of the load (the state keeps the last good rate). */
    bool invalid;
};

void prom_samples_free(struct prom_sample *samples, size_t n);

/* Answers holding more series than this (counted as JSON objects, arrays
 * and commas, before parsing) fail: the parse runs on the event loop, and
 * its memory and time grow with the values. Thaw's query sums by model, so
 * this is 50 000 models; a series may have PROM_MAX_LABELS labels (more
 * labels mean fewer series). */
#define PROM_MAX_SERIES 50000
#define PROM_MAX_LABELS 16

/* Parses a /api/v1/query response body (resultType "vector"; any other type
 * fails). Series without `label` are skipped, but an answer of series none of
 * which has it fails: that is a query or relabelling that lost the model
 * label, not every model idle. An empty result, or one of label-less series
 * only (`or vector(0)`), succeeds with n == 0. On
 * success returns 0 and sets *out (caller frees with prom_samples_free; may be
 * NULL when n == 0). On failure returns -1 and writes a one-line reason into
 * err (e.g. "status error: bad_data: parse error at char 5",
 * "invalid JSON at line 1 column 3", "resultType matrix not supported"). */
int prom_parse_vector(const char *body, size_t len, const char *label, struct prom_sample **out,
                      size_t *n, char *err, size_t errlen);

/* Called once per query. On success status == 0, err == NULL, and the samples
 * are valid only during the call. On failure status < 0, samples NULL, n 0 and
 * err a short reason ("timeout after 2000 ms", "HTTP 503", "connect: ...",
 * or a parse error from above). */
typedef void (*prom_result_cb)(void *ud, int status, const struct prom_sample *samples,
                               size_t n, const char *err);

struct prom_source_stats {
    uint64_t queries;       /* round trips started */
    uint64_t failures;      /* any failure */
    uint64_t last_duration_us;
    uint64_t connects;      /* new TCP connections opened; stays at 1 while
                               keep-alive to Prometheus holds */
};

/* base_url like "http://127.0.0.1:9090" (a trailing slash is fine).
 * timeout_ms bounds each whole query. Returns NULL on allocation failure or a
 * bad URL (err filled). Does not take ownership of base. */
struct prom_source *prom_source_new(struct event_base *base, const char *base_url,
                                    long timeout_ms, char *err, size_t errlen);
/* Cancels an in-flight query without calling its callback. Accepts NULL. */
void prom_source_free(struct prom_source *src);

/* Starts GET <base>/api/v1/query?query=<promql, url-encoded>. The result's
 * `label` values identify models. Returns 0 if started, -1 if a query is
 * already in flight (the caller skips this interval) or on failure to start.
 * promql and label are copied. cb runs later from the event loop, never from
 * inside this call. */
int prom_source_query(struct prom_source *src, const char *promql, const char *label,
                      prom_result_cb cb, void *ud);

void prom_source_get_stats(const struct prom_source *src, struct prom_source_stats *out);

/* Bound on one response body; a larger answer fails the query with
 * "response body exceeds N bytes". Default PROM_SOURCE_MAX_BODY; 0 restores
 * the default. Takes effect from the next query. */
#define PROM_SOURCE_MAX_BODY (64u * 1024u * 1024u)
void prom_source_set_max_body(struct prom_source *src, size_t max_bytes);

#endif
