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

static void format_number(char *out, size_t outlen, double v)
{
    if (isnan(v))
        snprintf(out, outlen, "NaN");
    else if (isinf(v))
        snprintf(out, outlen, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 1e15)
        snprintf(out, outlen, "%.0f", v);
    else {
        /* Shortest spelling that reads back exactly, so buckets print as 0.00005. */
        snprintf(out, outlen, "%.15g", v);
        if (strtod(out, NULL) != v)
            snprintf(out, outlen, "%.17g", v);
    }
}

void expo_family(struct evbuffer *out, const char *name, const char *type, const char *help)
{
    /* HELP text escaping: backslash and newline only. */
    evbuffer_add_printf(out, "# HELP %s ", name);
    for (const char *p = help; *p; p++) {
        if (*p == '\\')
            evbuffer_add(out, "\\\\", 2);
        else if (*p == '\n')
            evbuffer_add(out, "\\n", 2);
        else
            evbuffer_add(out, p, 1);
    }
    evbuffer_add_printf(out, "\n# TYPE %s %s\n", name, type);
}

void expo_sample(struct evbuffer *out, const char *name, const char *labels, double value)
{
    char num[64];
    format_number(num, sizeof(num), value);
    if (labels && *labels)
        evbuffer_add_printf(out, "%s{%s} %s\n", name, labels, num);
    else
        evbuffer_add_printf(out, "%s %s\n", name, num);
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
    char le[64];
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
    char num[64];
    format_number(num, sizeof(num), h->sum);
    if (*lab) {
        evbuffer_add_printf(out, "%s_sum{%s} %s\n%s_count{%s} %llu\n", name, lab, num, name, lab,
                            (unsigned long long)h->count);
    } else {
        evbuffer_add_printf(out, "%s_sum %s\n%s_count %llu\n", name, num, name,
                            (unsigned long long)h->count);
    }
}
