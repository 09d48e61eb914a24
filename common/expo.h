/* expo: Prometheus text exposition (format 0.0.4) written into an evbuffer.
 *
 * Owners keep their counters in their own structs and render them at scrape
 * time: no global registry, no locks, no per-update hashing. This module only
 * guarantees well-formed output: names as given, label values escaped,
 * numbers in Prometheus's spelling (+Inf, -Inf, NaN). */
#ifndef THAW_EXPO_H
#define THAW_EXPO_H

#include <stddef.h>
#include <stdint.h>

struct evbuffer;

/* Content type to serve the exposition with. */
#define EXPO_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Writes the # HELP and # TYPE lines. type: "counter", "gauge", "histogram".
 * Returns 0, or -1 when out could not grow (callers that must not send a
 * page with a line missing check it). */
int expo_family(struct evbuffer *out, const char *name, const char *type, const char *help);

/* Writes `name{labels} value`. labels is a preformatted label list without
 * braces (from expo_labels) or NULL/"" for none. */
void expo_sample(struct evbuffer *out, const char *name, const char *labels, double value);
/* The same with a second preformatted label list appended to the first
 * (either may be NULL/""), so a fixed part can be formatted once and reused.
 * Returns 0, or -1 when the line could not be written (out of memory): then
 * none of it was. */
int expo_sample_more(struct evbuffer *out, const char *name, const char *labels,
                     const char *more, double value);

/* Formats k1="v1",k2="v2" from NULL-terminated key/value pairs, escaping values.
 * Returns the length written, or -1 if it did not fit (out is then ""). */
int expo_labels(char *out, size_t outlen, ...);

/* A histogram with fixed upper bounds (ascending, +Inf implied). */
struct expo_histogram {
    const double *bounds;
    size_t nbounds;
    uint64_t *counts; /* nbounds + 1 non-cumulative buckets, the last for +Inf */
    double sum;
    uint64_t count;
};

/* Does not take ownership of bounds (usually a static array). Returns 0 or -1 on OOM. */
int expo_histogram_init(struct expo_histogram *h, const double *bounds, size_t nbounds);
void expo_histogram_finish(struct expo_histogram *h);
void expo_histogram_observe(struct expo_histogram *h, double value);
/* Writes name_bucket{labels,le=...}, name_sum, name_count (no HELP/TYPE). */
void expo_histogram_write(struct evbuffer *out, const char *name, const char *labels,
                          const struct expo_histogram *h);

/* Common bucket sets, in seconds. */
extern const double expo_buckets_fast[];  /* 50 us .. 1 s, for RPC latency */
extern const size_t expo_buckets_fast_len;
extern const double expo_buckets_slow[];  /* 5 ms .. 600 s, for hold and cold-start times */
extern const size_t expo_buckets_slow_len;

#endif
