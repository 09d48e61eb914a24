/* fv_metrics: per-model counters, gauges and histograms with vLLM's metric
 * names, and their Prometheus text exposition.
 *
 * No I/O: the server layer updates the numbers and asks for the text. Time
 * is passed in (exporter mode computes a counter from a rate and a clock). */
#ifndef THAW_FV_METRICS_H
#define THAW_FV_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct evbuffer;

#define FV_HIST_MAX_BUCKETS 32

struct fv_hist {
    const double *bounds; /* upper bounds, ascending; +Inf is implicit */
    size_t nbounds;
    uint64_t counts[FV_HIST_MAX_BUCKETS]; /* per bucket, not cumulative */
    uint64_t count;
    double sum;
};

struct fv_model_metrics {
    char *name;              /* owned */
    double generation_tokens; /* counter; double so a rate can accrue fractions */
    uint64_t prompt_tokens;  /* counter */
    uint64_t request_success; /* counter, finished_reason="length" */
    long running;            /* gauge */
    long waiting;            /* gauge */
    long max_batch;          /* for kv_cache_usage_perc = running / max_batch */
    struct fv_hist ttft;     /* seconds */
    struct fv_hist e2e;      /* seconds */
    struct fv_hist itl;      /* seconds between a request's tokens */
    struct fv_hist queue;    /* seconds from arrival to a batch slot */
    /* Exporter mode: generation_tokens grows by rate per second since rate_since_ms. */
    double rate;
    int64_t rate_since_ms;
};

/* Initialises *m for a model (name is copied). Returns 0, or -1 when out of memory. */
int fv_metrics_init(struct fv_model_metrics *m, const char *name, long max_batch);
/* Frees what fv_metrics_init allocated; NULL-safe. */
void fv_metrics_finish(struct fv_model_metrics *m);

void fv_metrics_observe(struct fv_hist *h, double value);

/* Folds what the old rate produced up to now_ms into the counter, then
 * switches to the new rate. */
void fv_metrics_set_rate(struct fv_model_metrics *m, double rate, int64_t now_ms);
/* Brings generation_tokens up to date with the rate at now_ms. */
void fv_metrics_accrue(struct fv_model_metrics *m, int64_t now_ms);

/* Appends the exposition of all models to out (families grouped, one series
 * per model, label model_name). Returns 0, or -1 if the buffer refused data. */
int fv_metrics_render(struct evbuffer *out, const struct fv_model_metrics *models, size_t n);

#endif
