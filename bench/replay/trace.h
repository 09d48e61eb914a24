/* trace: request arrivals for the replay, read from an Azure LLM inference
 * CSV or generated from a named synthetic shape with a seed.
 *
 * A trace is a sorted array of (arrival seconds from the first request,
 * prompt tokens, generated tokens). No I/O beyond reading the CSV file. */
#ifndef THAW_REPLAY_TRACE_H
#define THAW_REPLAY_TRACE_H

#include <stddef.h>
#include <stdint.h>

struct trace_req {
    double t;      /* arrival, seconds from the start of the trace */
    int ctx;       /* prompt tokens, >= 1 */
    int gen;       /* generated tokens, >= 1 */
};

struct trace {
    char name[64];
    struct trace_req *reqs; /* owned; sorted by t */
    size_t n;
    double span;            /* last arrival - first arrival */
};

/* Reads `TIMESTAMP,ContextTokens,GeneratedTokens` (Azure format, header line
 * first, timestamps `YYYY-MM-DD HH:MM:SS.fffffff`). At most max_seconds of
 * the trace are kept (<= 0: all). Returns 0, or -1 with err set; on failure
 * out holds nothing to free. */
int trace_load_azure(const char *path, double max_seconds, struct trace *out, char *err,
                     size_t errlen);

/* Names of the synthetic shapes, NULL-terminated: step, ramp, diurnal,
 * onoff, idle. */
extern const char *const trace_shapes[];

/* Generates a synthetic shape (Poisson arrivals at a time-varying rate,
 * prompt/output lengths log-normal around the Azure conversation trace's).
 * duration_s <= 0 uses the shape's own length. rate_scale multiplies every
 * rate (1 = the documented levels). Same seed, same trace. Returns 0, or -1
 * with err set (unknown shape, out of memory). */
int trace_synth(const char *shape, uint64_t seed, double duration_s, double rate_scale,
                struct trace *out, char *err, size_t errlen);

/* Generates arrivals under a ServeGen rate envelope (the derived
 * servegen_aggregate_rate_10min.csv: model, window_start_s, sum_rate_rps,
 * active_clients, rate_weighted_cv; one row per model and 10-minute window).
 * Takes the model's windows in [start_s, start_s + duration_s), scales their
 * rates so the slice averages mean_rps, and splits each window's rate evenly
 * over its active clients, each a renewal process with gamma gaps of the
 * window's CV (at most cv_cap). Lengths as trace_synth's. Same seed, same
 * trace. Returns 0, or -1 with err set (unreadable or malformed file, no
 * traffic for the model in the slice, out of memory). */
int trace_servegen(const char *path, const char *model, double start_s, double duration_s,
                   double mean_rps, double cv_cap, uint64_t seed, struct trace *out,
                   char *err, size_t errlen);

/* Moves every arrival by a uniform random amount in [-spread_s, spread_s]
 * (seeded), re-sorts and restarts the trace at its first request: the same
 * traffic with slightly different timing, to see how much a verdict rests
 * on the exact arrival times. spread_s <= 0 leaves the trace as it is.
 * Returns 0. */
int trace_jitter(struct trace *t, double spread_s, uint64_t seed);

/* Releases reqs; accepts NULL and zeroed traces. */
void trace_finish(struct trace *t);

/* Sum of prompt + generated tokens. */
double trace_tokens(const struct trace *t);

#endif
