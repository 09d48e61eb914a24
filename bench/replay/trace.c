#include "trace.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

const char *const trace_shapes[] = {"step", "ramp", "diurnal", "onoff", "idle", NULL};

void trace_finish(struct trace *t)
{
    if (!t)
        return;
    thaw_free(t->reqs);
    t->reqs = NULL;
    t->n = 0;
}

double trace_tokens(const struct trace *t)
{
    double s = 0;
    for (size_t i = 0; i < t->n; i++)
        s += (double)t->reqs[i].ctx + (double)t->reqs[i].gen;
    return s;
}

static int push(struct trace *t, size_t *cap, double at, int ctx, int gen)
{
    if (t->n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 4096;
        struct trace_req *r = thaw_realloc(t->reqs, ncap * sizeof(*r));
        if (!r)
            return -1;
        t->reqs = r;
        *cap = ncap;
    }
    t->reqs[t->n].t = at;
    t->reqs[t->n].ctx = ctx < 1 ? 1 : ctx;
    t->reqs[t->n].gen = gen < 1 ? 1 : gen;
    t->n++;
    return 0;
}

/* Starts a sorted, non-empty trace at its first request, like the Azure
 * files, and sets its span. */
static void start_at_first_request(struct trace *t)
{
    double t0 = t->reqs[0].t;
    for (size_t i = 0; i < t->n; i++)
        t->reqs[i].t -= t0;
    t->span = t->reqs[t->n - 1].t;
}

/* ---- Azure CSV ------------------------------------------------------------ */

/* Days since 1970-01-01 of a proleptic Gregorian date (no libc time zone). */
static long days_from_civil(long y, long m, long d)
{
    y -= m <= 2;
    long era = (y >= 0 ? y : y - 399) / 400;
    long yoe = y - era * 400;
    long doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* "YYYY-MM-DD HH:MM:SS[.f...]" -> seconds since the epoch; -1 when malformed. */
static int parse_timestamp(const char *s, double *out)
{
    int y, mo, d, h, mi, sec, used = 0;
    if (sscanf(s, "%4d-%2d-%2d %2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &used) != 6)
        return -1;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
        return -1;
    double frac = 0, scale = 0.1;
    const char *p = s + used;
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, scale /= 10)
            frac += (*p - '0') * scale;
    }
    *out = (double)days_from_civil(y, mo, d) * 86400.0 + h * 3600.0 + mi * 60.0 + sec + frac;
    return 0;
}

int trace_load_azure(const char *path, double max_seconds, struct trace *out, char *err,
                     size_t errlen)
{
    memset(out, 0, sizeof(*out));
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(out->name, sizeof(out->name), "%s", base);
    char *dot = strrchr(out->name, '.');
    if (dot)
        *dot = '\0';

    char line[512];
    size_t cap = 0, lineno = 0;
    double first = 0, prev = -1;
    int rc = 0;
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        if (lineno == 1 && strncmp(line, "TIMESTAMP", 9) == 0)
            continue;
        if (line[0] == '\n' || line[0] == '\r' || line[0] == '\0')
            continue;
        char *c1 = strchr(line, ',');
        char *c2 = c1 ? strchr(c1 + 1, ',') : NULL;
        double ts;
        if (!c2 || (*c1 = '\0', parse_timestamp(line, &ts) != 0)) {
            snprintf(err, errlen, "%s:%zu: expected TIMESTAMP,ContextTokens,GeneratedTokens",
                     path, lineno);
            rc = -1;
            break;
        }
        char *end1, *end2;
        long ctx = strtol(c1 + 1, &end1, 10);
        long gen = strtol(c2 + 1, &end2, 10);
        if (end1 == c1 + 1 || end2 == c2 + 1 || ctx < 0 || gen < 0 || ctx > 10000000 ||
            gen > 10000000) {
            snprintf(err, errlen, "%s:%zu: bad token counts", path, lineno);
            rc = -1;
            break;
        }
        if (out->n == 0)
            first = ts;
        double at = ts - first;
        if (at < prev) {
            snprintf(err, errlen, "%s:%zu: timestamps not sorted", path, lineno);
            rc = -1;
            break;
        }
        if (max_seconds > 0 && at > max_seconds)
            break;
        prev = at;
        if (push(out, &cap, at, (int)ctx, (int)gen) != 0) {
            snprintf(err, errlen, "out of memory");
            rc = -1;
            break;
        }
    }
    fclose(f);
    if (rc == 0 && out->n == 0) {
        snprintf(err, errlen, "%s: no requests", path);
        rc = -1;
    }
    if (rc != 0) {
        trace_finish(out);
        return -1;
    }
    out->span = out->reqs[out->n - 1].t;
    return 0;
}

/* ---- synthetic shapes ------------------------------------------------------ */

/* splitmix64: tiny, seedable, good enough for arrival sampling. */
struct rng {
    uint64_t s;
};

static uint64_t rng_next(struct rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1). */
static double rng_unif(struct rng *r)
{
    return ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_range(struct rng *r, double lo, double hi)
{
    return lo + (hi - lo) * rng_unif(r);
}

static double rng_normal(struct rng *r)
{
    double u1 = rng_unif(r), u2 = rng_unif(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* A piecewise-linear rate: segment i runs from its t0 to the next one's. */
struct seg {
    double t0, t1, r0, r1;
};

struct segs {
    struct seg *v;
    size_t n, cap;
};

static int seg_add(struct segs *s, double t0, double t1, double r0, double r1)
{
    if (t1 <= t0)
        return 0;
    if (s->n == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 64;
        struct seg *v = thaw_realloc(s->v, ncap * sizeof(*v));
        if (!v)
            return -1;
        s->v = v;
        s->cap = ncap;
    }
    s->v[s->n++] = (struct seg){t0, t1, r0 < 0 ? 0 : r0, r1 < 0 ? 0 : r1};
    return 0;
}

/* Lengths log-normal around the Azure conversation trace (prompt median
 * 1020, mean ~1180; output median 129, mean ~210), clamped to its ranges. */
static void sample_lengths(struct rng *r, int *ctx, int *gen)
{
    double c = exp(log(1020.0) + 0.55 * rng_normal(r));
    double g = exp(log(129.0) + 0.99 * rng_normal(r));
    *ctx = (int)fmin(fmax(c, 2), 14000);
    *gen = (int)fmin(fmax(g, 7), 1000);
}

/* Builds the rate segments of a shape; *len is its natural length. */
static int shape_segments(const char *shape, struct rng *r, double dur, double k, struct segs *s)
{
    int rc = 0;
    if (strcmp(shape, "step") == 0) {
        /* Sharp steps both ways: 0.5 -> 6 -> 1 -> 8 rps. */
        double f = dur / 3600.0;
        rc |= seg_add(s, 0, 600 * f, 0.5 * k, 0.5 * k);
        rc |= seg_add(s, 600 * f, 1800 * f, 6 * k, 6 * k);
        rc |= seg_add(s, 1800 * f, 2700 * f, 1 * k, 1 * k);
        rc |= seg_add(s, 2700 * f, dur, 8 * k, 8 * k);
    } else if (strcmp(shape, "ramp") == 0) {
        /* 0.2 -> 8 rps over 25 min, 10 min flat, back down over 25 min. */
        double f = dur / 3600.0;
        rc |= seg_add(s, 0, 1500 * f, 0.2 * k, 8 * k);
        rc |= seg_add(s, 1500 * f, 2100 * f, 8 * k, 8 * k);
        rc |= seg_add(s, 2100 * f, dur, 8 * k, 0.2 * k);
    } else if (strcmp(shape, "diurnal") == 0) {
        /* A day compressed into 2 h: night 0.2 rps, peak 8 rps, with a
         * slow multiplicative wobble (AR(1) per 5 min, ~15 %). */
        const double period = 7200.0;
        double wob = 0, prev_rate = -1;
        for (double t = 0; t < dur && rc == 0; t += 60) {
            if (fmod(t, 300) < 1e-9)
                wob = 0.7 * wob + 0.15 * rng_normal(r);
            double ph = (1 - cos(6.283185307179586 * t / period)) / 2;
            double rate = (0.2 + 7.8 * pow(ph, 1.5)) * exp(wob) * k;
            if (prev_rate < 0)
                prev_rate = rate;
            rc |= seg_add(s, t, fmin(t + 60, dur), prev_rate, rate);
            prev_rate = rate;
        }
    } else if (strcmp(shape, "onoff") == 0) {
        /* Bursts of 1-4 min at 5 rps from nothing, 1-10 min apart. */
        double t = 0;
        while (t < dur && rc == 0) {
            double on = rng_range(r, 60, 240), off = rng_range(r, 60, 600);
            rc |= seg_add(s, t, fmin(t + on, dur), 5 * k, 5 * k);
            t += on + off;
        }
    } else if (strcmp(shape, "idle") == 0) {
        /* Short sessions (10 s - 2 min at 2 rps) between idle gaps drawn
         * log-normal around 4 min (20 s - 30 min): some shorter than a cold
         * start, some much longer, so keep-warm has something to learn. */
        double t = 0;
        while (t < dur && rc == 0) {
            double on = rng_range(r, 10, 120);
            double gap = fmin(fmax(exp(log(240.0) + 1.0 * rng_normal(r)), 20), 1800);
            rc |= seg_add(s, t, fmin(t + on, dur), 2 * k, 2 * k);
            t += on + gap;
        }
    } else {
        return 1;
    }
    return rc ? -1 : 0;
}

static double shape_length(const char *shape)
{
    if (strcmp(shape, "diurnal") == 0)
        return 14400;
    if (strcmp(shape, "idle") == 0)
        return 10800;
    return 3600;
}

int trace_synth(const char *shape, uint64_t seed, double duration_s, double rate_scale,
                struct trace *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    bool known = false;
    for (int i = 0; trace_shapes[i]; i++)
        known |= strcmp(shape, trace_shapes[i]) == 0;
    if (!known) {
        snprintf(err, errlen, "unknown shape '%s'", shape);
        return -1;
    }
    double dur = duration_s > 0 ? duration_s : shape_length(shape);
    struct rng r = {seed ^ 0x5DEECE66Dull};
    /* Mix the shape into the seed so shapes with one seed are independent. */
    for (const char *p = shape; *p; p++)
        r.s = r.s * 31 + (unsigned char)*p;
    struct segs s = {0};
    int rc = shape_segments(shape, &r, dur, rate_scale > 0 ? rate_scale : 1, &s);
    if (rc != 0) {
        thaw_free(s.v);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t cap = 0;
    for (size_t i = 0; i < s.n && rc == 0; i++) {
        const struct seg *g = &s.v[i];
        double rmax = fmax(g->r0, g->r1);
        if (!(rmax > 0))
            continue;
        /* Thinning: candidates at rmax, kept with probability rate(t)/rmax. */
        double t = g->t0;
        for (;;) {
            t += -log(rng_unif(&r)) / rmax;
            if (t >= g->t1)
                break;
            double rate = g->r0 + (g->r1 - g->r0) * (t - g->t0) / (g->t1 - g->t0);
            if (rng_unif(&r) * rmax > rate)
                continue;
            int ctx, gen;
            sample_lengths(&r, &ctx, &gen);
            if (push(out, &cap, t, ctx, gen) != 0) {
                rc = -1;
                break;
            }
        }
    }
    thaw_free(s.v);
    if (rc != 0 || out->n == 0) {
        snprintf(err, errlen, rc ? "out of memory" : "shape '%s' produced no requests", shape);
        trace_finish(out);
        return -1;
    }
    start_at_first_request(out);
    snprintf(out->name, sizeof(out->name), "%s", shape);
    return 0;
}

/* ---- ServeGen rate envelope ------------------------------------------------ */

/* Gamma(k, 1) by Marsaglia and Tsang; k < 1 through Gamma(k + 1) x U^(1/k). */
static double rng_gamma(struct rng *r, double k)
{
    if (k < 1)
        return rng_gamma(r, k + 1) * pow(rng_unif(r), 1 / k);
    double d = k - 1.0 / 3, c = 1 / sqrt(9 * d);
    for (;;) {
        double x = rng_normal(r), v = 1 + c * x;
        if (v <= 0)
            continue;
        v = v * v * v;
        if (log(rng_unif(r)) < 0.5 * x * x + d - d * v + d * log(v))
            return d * v;
    }
}

struct sg_window {
    double start, rate, cv;
    long clients;
};

/* One row "model,window_start_s,sum_rate_rps,active_clients,rate_weighted_cv"
 * of the wanted model inside [start_s, end_s) -> *w; 1 stored, 0 skipped,
 * -1 malformed. */
static int sg_parse_row(char *line, const char *model, double start_s, double end_s,
                        struct sg_window *w)
{
    char *comma = strchr(line, ',');
    if (!comma)
        return -1;
    *comma = '\0';
    if (strcmp(line, model) != 0)
        return 0;
    char *end;
    errno = 0;
    double ws = strtod(comma + 1, &end);
    if (errno || *end != ',')
        return -1;
    double rate = strtod(end + 1, &end);
    if (errno || *end != ',')
        return -1;
    long clients = strtol(end + 1, &end, 10);
    if (errno || *end != ',')
        return -1;
    double cv = strtod(end + 1, &end);
    if (errno || (*end != '\0' && *end != '\n' && *end != '\r'))
        return -1;
    if (!(rate >= 0) || !isfinite(rate) || clients < 0 || !(cv >= 0) || !isfinite(cv))
        return -1;
    if (ws < start_s || ws >= end_s)
        return 0;
    *w = (struct sg_window){ws - start_s, rate, cv, clients};
    return 1;
}

static int by_arrival(const void *a, const void *b)
{
    double x = ((const struct trace_req *)a)->t, y = ((const struct trace_req *)b)->t;
    return x < y ? -1 : x > y;
}

int trace_servegen(const char *path, const char *model, double start_s, double duration_s,
                   double mean_rps, double cv_cap, uint64_t seed, struct trace *out,
                   char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (!(duration_s > 0) || !(mean_rps > 0) || !(cv_cap > 0) || !(start_s >= 0)) {
        snprintf(err, errlen, "servegen: the start must be >= 0 and the duration, mean rate "
                              "and CV cap > 0");
        return -1;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    /* 10-minute windows: a day is 144, the file's longest span 2016. */
    enum { MAX_WINDOWS = 4096 };
    struct sg_window *win = thaw_calloc(MAX_WINDOWS, sizeof(*win));
    size_t nwin = 0, lineno = 0;
    char line[512];
    int rc = win ? 0 : -1;
    if (!win)
        snprintf(err, errlen, "out of memory");
    while (rc == 0 && fgets(line, sizeof(line), f)) {
        lineno++;
        if (lineno == 1 && strncmp(line, "model,", 6) == 0)
            continue;
        struct sg_window w;
        int got = sg_parse_row(line, model, start_s, start_s + duration_s, &w);
        if (got < 0) {
            snprintf(err, errlen,
                     "%s:%zu: expected model,window_start_s,sum_rate_rps,active_clients,"
                     "rate_weighted_cv",
                     path, lineno);
            rc = -1;
        } else if (got > 0) {
            if (nwin == MAX_WINDOWS) {
                snprintf(err, errlen, "%s: more than %d windows in the slice", path,
                         MAX_WINDOWS);
                rc = -1;
            } else {
                win[nwin++] = w;
            }
        }
    }
    fclose(f);
    double total = 0;
    for (size_t i = 0; i < nwin; i++)
        total += win[i].rate;
    if (rc == 0 && !(total > 0)) {
        snprintf(err, errlen, "%s: no traffic for '%s' in [%.0f s, %.0f s)", path, model,
                 start_s, start_s + duration_s);
        rc = -1;
    }
    struct rng r = {seed ^ 0x5DEECE66Dull};
    for (const char *p = model; *p; p++)
        r.s = r.s * 31 + (unsigned char)*p;
    r.s ^= (uint64_t)start_s;
    /* The slice's mean rate becomes mean_rps: the file's absolute levels
     * are not known to be unscaled, and the cluster model is one model's. */
    double scale = rc == 0 ? mean_rps / (total / (double)nwin) : 0;
    size_t cap = 0;
    for (size_t i = 0; i < nwin && rc == 0; i++) {
        const struct sg_window *w = &win[i];
        double end = w->start + 600;
        if (end > duration_s)
            end = duration_s;
        long clients = w->clients > 0 ? w->clients : 1;
        double per = w->rate * scale / (double)clients;
        if (!(per > 0))
            continue;
        /* Each client a renewal process with gamma gaps of the window's
         * CV: shape 1/cv^2, mean 1/per. cv 0 (unknown) is Poisson. */
        double cv = w->cv > cv_cap ? cv_cap : w->cv;
        double k = cv > 0 ? 1 / (cv * cv) : 1;
        for (long c = 0; c < clients && rc == 0; c++) {
            double t = w->start + rng_unif(&r) / per;
            while (t < end) {
                int ctx, gen;
                sample_lengths(&r, &ctx, &gen);
                if (push(out, &cap, t, ctx, gen) != 0) {
                    snprintf(err, errlen, "out of memory");
                    rc = -1;
                    break;
                }
                t += rng_gamma(&r, k) / (k * per);
            }
        }
    }
    thaw_free(win);
    if (rc == 0 && out->n == 0) {
        snprintf(err, errlen, "servegen '%s': no requests", model);
        rc = -1;
    }
    if (rc != 0) {
        trace_finish(out);
        return -1;
    }
    qsort(out->reqs, out->n, sizeof(*out->reqs), by_arrival);
    start_at_first_request(out);
    const char *tail = strrchr(model, '/');
    snprintf(out->name, sizeof(out->name), "sg-%s-h%g", tail ? tail + 1 : model,
             start_s / 3600);
    return 0;
}

/* ---- perturbation ------------------------------------------------------------ */

int trace_jitter(struct trace *t, double spread_s, uint64_t seed)
{
    if (!(spread_s > 0) || t->n == 0)
        return 0;
    struct rng r = {seed ^ 0xA5A5A5A5DEADBEEFull};
    for (size_t i = 0; i < t->n; i++)
        t->reqs[i].t += rng_range(&r, -spread_s, spread_s);
    qsort(t->reqs, t->n, sizeof(*t->reqs), by_arrival);
    start_at_first_request(t);
    return 0;
}
