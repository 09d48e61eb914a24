#include "expo.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "alloc.h"

const double expo_buckets_fast[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                    0.005,   0.01,   0.025,   0.05,   0.1,   0.25,
                                    0.5,     1.0};
const size_t expo_buckets_fast_len = sizeof(expo_buckets_fast) / sizeof(expo_buckets_fast[0]);
const double expo_buckets_slow[] = {0.005, 0.01, 0.025, 0.05, 0.1,  0.25,  0.5,   1,
                                    2.5,   5,    10,    30,   60,   120,   300,   600};
const size_t expo_buckets_slow_len = sizeof(expo_buckets_slow) / sizeof(expo_buckets_slow[0]);

/* Whole numbers are most samples (counts, replicas, flags): written by hand,
 * not by printf, which was most of a 15 MB scrape's time at 10 000 models. */
static size_t format_whole(char *out, long long v)
{
    char rev[24];
    size_t n = 0, o = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        rev[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        out[o++] = '-';
    while (n)
        out[o++] = rev[--n];
    out[o] = '\0';
    return o;
}

/* outlen >= 32 (the longest spelling, %.17g, is 24 characters). */
static size_t format_number(char *out, size_t outlen, double v)
{
    int n;
    if (isnan(v))
        n = snprintf(out, outlen, "NaN");
    else if (isinf(v))
        n = snprintf(out, outlen, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 1e15)
        return format_whole(out, (long long)v);
    else {
        /* Shortest spelling that reads back exactly, so buckets print as 0.00005. */
        n = snprintf(out, outlen, "%.15g", v);
        if (strtod(out, NULL) != v)
            n = snprintf(out, outlen, "%.17g", v);
    }
    return n > 0 ? (size_t)n : 0;
}

int expo_family(struct evbuffer *out, const char *name, const char *type, const char *help)
{
    /* HELP text escaping: backslash and newline only. */
    int failed = evbuffer_add_printf(out, "# HELP %s ", name) < 0;
    for (const char *p = help; *p; p++) {
        if (*p == '\\')
            failed |= evbuffer_add(out, "\\\\", 2) < 0;
        else if (*p == '\n')
            failed |= evbuffer_add(out, "\\n", 2) < 0;
        else
            failed |= evbuffer_add(out, p, 1) < 0;
    }
    failed |= evbuffer_add_printf(out, "\n# TYPE %s %s\n", name, type) < 0;
    return failed ? -1 : 0;
}

void expo_sample(struct evbuffer *out, const char *name, const char *labels, double value)
{
    (void)expo_sample_more(out, name, labels, NULL, value);
}

int expo_sample_more(struct evbuffer *out, const char *name, const char *labels,
                     const char *more, double value)
{
    /* One line, one evbuffer_add: a scrape is mostly samples. */
    char line[1024];
    size_t nl = strlen(name), ll = labels ? strlen(labels) : 0, ml = more ? strlen(more) : 0;
    char num[32];
    size_t numl = format_number(num, sizeof(num), value);
    size_t need = nl + ll + ml + numl + 5; /* braces, comma, space, newline */
    char *buf = need <= sizeof(line) ? line : thaw_malloc(need);
    if (!buf)
        return -1; /* a line left out, not a torn one */
    size_t o = 0;
    memcpy(buf, name, nl);
    o += nl;
    if (ll || ml) {
        buf[o++] = '{';
        memcpy(buf + o, labels ? labels : "", ll);
        o += ll;
        if (ll && ml)
            buf[o++] = ',';
        memcpy(buf + o, more ? more : "", ml);
        o += ml;
        buf[o++] = '}';
    }
    buf[o++] = ' ';
    memcpy(buf + o, num, numl);
    o += numl;
    buf[o++] = '\n';
    int rc = evbuffer_add(out, buf, o) < 0 ? -1 : 0;
    if (buf != line)
        thaw_free(buf);
    return rc;
}

int expo_labels(char *out, size_t outlen, ...)
{
    va_list ap;
    size_t o = 0;
    int first = 1;
    if (outlen == 0)
        return -1;
    va_start(ap, outlen);
    for (;;) {
        const char *k = va_arg(ap, const char *);
        if (!k)
            break;
        const char *v = va_arg(ap, const char *);
        if (!v)
            v = "";
        size_t need = strlen(k) + 4 + (first ? 0 : 1);
        if (o + need >= outlen)
            goto overflow;
        o += (size_t)snprintf(out + o, outlen - o, "%s%s=\"", first ? "" : ",", k);
        for (const char *p = v; *p; p++) {
            const char *esc = NULL;
            if (*p == '\\')
                esc = "\\\\";
            else if (*p == '"')
                esc = "\\\"";
            else if (*p == '\n')
                esc = "\\n";
            size_t l = esc ? 2 : 1;
            if (o + l + 2 >= outlen)
                goto overflow;
            if (esc) {
                memcpy(out + o, esc, 2);
            } else {
                out[o] = *p;
            }
            o += l;
        }
        out[o++] = '"';
        out[o] = '\0';
        first = 0;
    }
    va_end(ap);
    out[o] = '\0';
    return (int)o;
overflow:
    va_end(ap);
    out[0] = '\0';
    return -1;
}

int expo_histogram_init(struct expo_histogram *h, const double *bounds, size_t nbounds)
{
    memset(h, 0, sizeof(*h));
    h->counts = thaw_calloc(nbounds + 1, sizeof(*h->counts));
    if (!h->counts)
        return -1;
    h->bounds = bounds;
    h->nbounds = nbounds;
    return 0;
}

void expo_histogram_finish(struct expo_histogram *h)
{
    if (!h)
        return;
    thaw_free(h->counts);
    h->counts = NULL;
}

void expo_histogram_observe(struct expo_histogram *h, double value)
{
    if (!h->counts)
        return;
    size_t i = 0;
    /* Few buckets: a linear scan beats a binary search here. */
    while (i < h->nbounds && value > h->bounds[i])
        i++;
    h->counts[i]++;
    h->sum += value;
    h->count++;
}

void expo_histogram_write(struct evbuffer *out, const char *name, const char *labels,
                          const struct expo_histogram *h)
{
    char le[32];
    const char *sep = (labels && *labels) ? "," : "";
    const char *lab = labels ? labels : "";
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= h->nbounds; i++) {
        cumulative += h->counts ? h->counts[i] : 0;
        if (i < h->nbounds)
            format_number(le, sizeof(le), h->bounds[i]);
        else
            snprintf(le, sizeof(le), "+Inf");
        evbuffer_add_printf(out, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, lab, sep, le,
                            (unsigned long long)cumulative);
    }
    char num[32];
    format_number(num, sizeof(num), h->sum);
    if (*lab) {
        evbuffer_add_printf(out, "%s_sum{%s} %s\n%s_count{%s} %llu\n", name, lab, num, name, lab,
                            (unsigned long long)h->count);
    } else {
        evbuffer_add_printf(out, "%s_sum %s\n%s_count %llu\n", name, num, name,
                            (unsigned long long)h->count);
    }
}
