#include "fuzz.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "alloc.h"
#include "log.h"

void fuzz_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FUZZ FAILURE %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    abort();
}

void fuzz_check_failed(const char *file, int line, const char *cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FUZZ FAILURE %s:%d: check failed: %s: ", file, line, cond);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    abort();
}

static void discard_line(void *ud, const char *line, size_t len)
{
    (void)ud;
    (void)line;
    (void)len;
}

void fuzz_quiet_logs(void)
{
    log_set_level(LOG_LEVEL_DEBUG);
    /* THAW_FUZZ_LOGS=1 keeps them, to see what an input does. */
    const char *keep = getenv("THAW_FUZZ_LOGS");
    if (!keep || strcmp(keep, "1") != 0)
        log_set_sink(discard_line, NULL);
}

void fuzz_rng_seed(struct fuzz_rng *r, const uint8_t *data, size_t len)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= data[i];
        h *= 1099511628211ull;
    }
    r->s = h ? h : 1;
}

uint32_t fuzz_rng_next(struct fuzz_rng *r)
{
    /* xorshift64* */
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (uint32_t)((r->s * 2685821657736338717ull) >> 32);
}

size_t fuzz_rng_chunk(struct fuzz_rng *r, size_t max)
{
    if (max <= 1)
        return 1;
    uint32_t v = fuzz_rng_next(r);
    size_t n;
    switch (v & 3) {
    case 0: n = 1; break;
    case 1: n = 1 + (v >> 2) % 8; break;
    case 2: n = 1 + (v >> 2) % 64; break;
    default: n = 1 + (v >> 2) % max; break;
    }
    return n < max ? n : max;
}

long fuzz_oom_point(const uint8_t *data, size_t len)
{
    struct fuzz_rng r;
    fuzz_rng_seed(&r, data, len);
    /* Bigger inputs allocate more; keep most failure points early, where
     * the setup allocations are. */
    size_t span = 8 + len / 4;
    if (span > 4096)
        span = 4096;
    return (long)(fuzz_rng_next(&r) % span);
}

void fuzz_run_with_oom(void (*run)(const uint8_t *, size_t, bool), const uint8_t *data,
                       size_t len)
{
    run(data, len, true);
    alloc_fail_after(fuzz_oom_point(data, len));
    run(data, len, false);
    alloc_fail_after(-1);
}

void fuzz_jansson_no_oom(void) { json_set_alloc_funcs(malloc, free); }

char *fuzz_strndup(const uint8_t *data, size_t len)
{
    char *s = malloc(len + 1);
    if (!s)
        return NULL;
    if (len)
        memcpy(s, data, len);
    s[len] = '\0';
    return s;
}
