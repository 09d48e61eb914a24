#include "fv_metrics.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>

#include "alloc.h"

/* vLLM's bucket bounds (vllm/v1/metrics/loggers.py), so dashboards and
 * histogram_quantile() behave as they would against the real server. */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                     20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
/* vLLM's buckets for both (vllm/v1/metrics/loggers.py). */
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                                    0.5,  0.75,  1.0,  2.5,   5.0, 7.5,  10.0, 20.0, 40.0, 80.0};
static const double e2e_bounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,
                                    10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                                    240.0, 480.0, 960.0, 1920.0, 7680.0};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

int fv_metrics_init(struct fv_model_metrics *m, const char *name, long max_batch)
{
    memset(m, 0, sizeof(*m));
    m->name = thaw_strdup(name);
    if (!m->name)
        return -1;
    m->max_batch = max_batch > 0 ? max_batch : 1;
    m->ttft.bounds = ttft_bounds;
    m->ttft.nbounds = N_OF(ttft_bounds);
    m->e2e.bounds = e2e_bounds;
    m->e2e.nbounds = N_OF(e2e_bounds);
    m->itl.bounds = itl_bounds;
    m->itl.nbounds = N_OF(itl_bounds);
    m->queue.bounds = e2e_bounds;
    m->queue.nbounds = N_OF(e2e_bounds);
    return 0;
}

void fv_metrics_finish(struct fv_model_metrics *m)
{
    if (!m)
        return;
    thaw_free(m->name);
    m->name = NULL;
}

void fv_metrics_observe(struct fv_hist *h, double value)
{
    if (!(value >= 0)) /* also drops NaN */
        value = 0;
    size_t i = 0;
    while (i < h->nbounds && value > h->bounds[i])
        i++;
    h->counts[i]++; /* i == nbounds is the +Inf bucket */
    h->count++;
    h->sum += value;
}

void fv_metrics_accrue(struct fv_model_metrics *m, int64_t now_ms)
{
    if (now_ms <= m->rate_since_ms)
        return;
    m->generation_tokens += m->rate * (double)(now_ms - m->rate_since_ms) / 1000.0;
    m->rate_since_ms = now_ms;
}

void fv_metrics_set_rate(struct fv_model_metrics *m, double rate, int64_t now_ms)
{
    fv_metrics_accrue(m, now_ms);
    m->rate = rate;
    m->rate_since_ms = now_ms;
}

/* Label values escape backslash, double quote and newline (exposition format). */
static int add_label_value(struct evbuffer *out, const char *s)
{
    for (const char *p = s; *p; p++) {
        int rc;
        if (*p == '\\')
            rc = evbuffer_add(out, "\\\\", 2);
        else if (*p == '"')
            rc = evbuffer_add(out, "\\\"", 2);
        else if (*p == '\n')
            rc = evbuffer_add(out, "\\n", 2);
        else
            rc = evbuffer_add(out, p, 1);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int add_header(struct evbuffer *out, const char *name, const char *type,
                      const char *help)
{
    return evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type) < 0
               ? -1
               : 0;
}

/* One sample line: name{model_name="m"[,extra]} value */
static int add_sample(struct evbuffer *out, const char *name, const char *model,
                      const char *extra_labels, const char *value)
{
    if (evbuffer_add_printf(out, "%s{model_name=\"", name) < 0)
        return -1;
    if (add_label_value(out, model) < 0)
        return -1;
    if (evbuffer_add_printf(out, "\"%s%s} %s\n", extra_labels ? "," : "",
                            extra_labels ? extra_labels : "", value) < 0)
        return -1;
    return 0;
}

enum fv_field {
    FV_F_GEN,
    FV_F_PROMPT,
    FV_F_SUCCESS,
    FV_F_RUNNING,
    FV_F_WAITING,
    FV_F_KV,
};

static double field_value(const struct fv_model_metrics *m, enum fv_field f)
{
    switch (f) {
    case FV_F_GEN:
        /* Whole tokens only: a counter showing 0.37 tokens would look odd. */
        return floor(m->generation_tokens);
    case FV_F_PROMPT:
        return (double)m->prompt_tokens;
    case FV_F_SUCCESS:
        return (double)m->request_success;
    case FV_F_RUNNING:
        return (double)m->running;
    case FV_F_WAITING:
        return (double)m->waiting;
    case FV_F_KV:
        return (double)m->running / (double)m->max_batch;
    }
    return 0;
}

struct fv_scalar_family {
    const char *name;
    const char *type;
    const char *help;
    const char *extra_labels;
    enum fv_field field;
};

/* Help texts as vLLM words them. */
static const struct fv_scalar_family scalar_families[] = {
    {"vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
     NULL, FV_F_RUNNING},
    {"vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", NULL,
     FV_F_WAITING},
    {"vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", NULL,
     FV_F_KV},
    {"vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", NULL,
     FV_F_PROMPT},
    {"vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", NULL,
     FV_F_GEN},
    {"vllm:request_success_total", "counter", "Count of successfully processed requests.",
     "finished_reason=\"length\"", FV_F_SUCCESS},
};

static int render_hist(struct evbuffer *out, const char *name, const char *help,
                       const struct fv_model_metrics *models, size_t n, size_t hist_offset)
{
    char series[160];
    char le[64];
    char value[64];
    if (add_header(out, name, "histogram", help) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        const struct fv_hist *h =
            (const struct fv_hist *)(const void *)((const char *)&models[i] + hist_offset);
        uint64_t cumulative = 0;
        snprintf(series, sizeof(series), "%s_bucket", name);
        for (size_t b = 0; b <= h->nbounds; b++) {
            cumulative += h->counts[b];
            if (b < h->nbounds)
                snprintf(le, sizeof(le), "le=\"%g\"", h->bounds[b]);
            else
                snprintf(le, sizeof(le), "le=\"+Inf\"");
            snprintf(value, sizeof(value), "%" PRIu64 ".0", cumulative);
            if (add_sample(out, series, models[i].name, le, value) < 0)
                return -1;
        }
        snprintf(series, sizeof(series), "%s_sum", name);
        snprintf(value, sizeof(value), "%.6f", h->sum);
        if (add_sample(out, series, models[i].name, NULL, value) < 0)
            return -1;
        snprintf(series, sizeof(series), "%s_count", name);
        snprintf(value, sizeof(value), "%" PRIu64 ".0", h->count);
        if (add_sample(out, series, models[i].name, NULL, value) < 0)
            return -1;
    }
    return 0;
}

int fv_metrics_render(struct evbuffer *out, const struct fv_model_metrics *models, size_t n)
{
    char value[64];
    for (size_t f = 0; f < N_OF(scalar_families); f++) {
        const struct fv_scalar_family *fam = &scalar_families[f];
        if (add_header(out, fam->name, fam->type, fam->help) < 0)
            return -1;
        for (size_t i = 0; i < n; i++) {
            double v = field_value(&models[i], fam->field);
            if (fam->field == FV_F_KV)
                snprintf(value, sizeof(value), "%.6f", v);
            else
                snprintf(value, sizeof(value), "%.1f", v);
            if (add_sample(out, fam->name, models[i].name, fam->extra_labels, value) < 0)
                return -1;
        }
    }
    if (render_hist(out, "vllm:time_to_first_token_seconds",
                    "Histogram of time to first token in seconds.", models, n,
                    offsetof(struct fv_model_metrics, ttft)) < 0)
        return -1;
    if (render_hist(out, "vllm:e2e_request_latency_seconds",
                    "Histogram of e2e request latency in seconds.", models, n,
                    offsetof(struct fv_model_metrics, e2e)) < 0)
        return -1;
    if (render_hist(out, "vllm:inter_token_latency_seconds",
                    "Histogram of inter-token latency in seconds.", models, n,
                    offsetof(struct fv_model_metrics, itl)) < 0)
        return -1;
    if (render_hist(out, "vllm:request_queue_time_seconds",
                    "Histogram of time spent in WAITING phase for request.", models, n,
                    offsetof(struct fv_model_metrics, queue)) < 0)
        return -1;
    return 0;
}
