#include "restore.h"

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "policy.h"
#include "prom_source.h"
#include "strmap.h"

struct restore_book {
    /* "ns/name/model" -> floor, stored in the pointer: floors are 1 ..
     * POLICY_MAX_REPLICAS, so NULL (absent) is never a floor. NULL while
     * empty. */
    struct strmap *floors;
};

/* A metric name, then nothing or one {...} matcher list that ends the text:
 * what may take a range. Anything else (a function, an offset, a second
 * selector) would fail every read-back at run time instead of at start. */
static int valid_series(const char *s)
{
    if (!s || !(isalpha((unsigned char)*s) || *s == '_' || *s == ':'))
        return 0;
    while (isalnum((unsigned char)*s) || *s == '_' || *s == ':')
        s++;
    if (!*s)
        return 1;
    if (*s != '{')
        return 0;
    /* The matchers' own braces and quotes are Prometheus's to judge; only
     * the list has to be last. */
    size_t len = strlen(s);
    return len >= 2 && s[len - 1] == '}' && !strchr(s + 1, '{') &&
           strchr(s, '}') == s + len - 1;
}

int restore_query(char *out, size_t outlen, const char *series, int64_t window_ms)
{
    if (!valid_series(series) || window_ms < 1000)
        return -1;
    int n = snprintf(out, outlen,
                     "max by (" RESTORE_LABEL ") (label_join(last_over_time(%s[%llds]), \""
                     RESTORE_LABEL "\", \"/\", \"namespace\", \"scaledobject\", \"model\"))",
                     series, (long long)(window_ms / 1000));
    return n < 0 || (size_t)n >= outlen ? -1 : 0;
}

struct restore_book *restore_book_new(void) { return thaw_calloc(1, sizeof(struct restore_book)); }

void restore_book_free(struct restore_book *b)
{
    if (!b)
        return;
    strmap_free(b->floors);
    thaw_free(b);
}

void restore_book_clear(struct restore_book *b)
{
    strmap_free(b->floors);
    b->floors = NULL;
}

/* "ns/name/model", ns and name non-empty and without '/' (Kubernetes
 * names), the model non-empty (it may hold '/': "org/model"). */
static int valid_key(const char *s)
{
    const char *a = strchr(s, '/');
    const char *b = a ? strchr(a + 1, '/') : NULL;
    return a && a != s && b && b != a + 1 && b[1];
}

long restore_book_fill(struct restore_book *b, const struct prom_sample *samples, size_t n,
                       size_t max_entries, size_t *skipped)
{
    restore_book_clear(b);
    size_t bad = 0;
    if (n > 0 && !(b->floors = strmap_new())) {
        if (skipped)
            *skipped = 0;
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const struct prom_sample *s = &samples[i];
        if (s->invalid || !s->label_value || !valid_key(s->label_value)) {
            bad++;
            continue;
        }
        if (!(s->value >= 1)) /* at zero: nothing to hold */
            continue;
        if (s->value > POLICY_MAX_REPLICAS) { /* no scaler reports that: bad data */
            bad++;
            continue;
        }
        if (max_entries && strmap_count(b->floors) >= max_entries) {
            bad += n - i;
            break;
        }
        double v = ceil(s->value - 1e-9);
        long floor = (long)v;
        /* The query's `max by` gives one sample per key; should an answer
         * repeat one, the higher floor is kept. */
        long had = (long)(intptr_t)strmap_get(b->floors, s->label_value);
        if (had >= floor)
            continue;
        if (strmap_put(b->floors, s->label_value, (void *)(intptr_t)floor) != 0) {
            restore_book_clear(b);
            if (skipped)
                *skipped = bad;
            return -1;
        }
    }
    if (skipped)
        *skipped = bad;
    return (long)restore_book_count(b);
}

long restore_book_floor(const struct restore_book *b, const char *target_id)
{
    return b->floors ? (long)(intptr_t)strmap_get(b->floors, target_id) : 0;
}

size_t restore_book_count(const struct restore_book *b)
{
    return b->floors ? strmap_count(b->floors) : 0;
}
