#include "alloc.h"

#include <stdlib.h>
#include <string.h>

static long allocations_left = -1;

static int should_fail(void)
{
    if (allocations_left < 0)
        return 0;
    if (allocations_left == 0)
        return 1;
    allocations_left--;
    return 0;
}

void alloc_fail_after(long n) { allocations_left = n; }

void *thaw_malloc(size_t n) { return should_fail() ? NULL : malloc(n ? n : 1); }

void *thaw_calloc(size_t count, size_t size)
{
    return should_fail() ? NULL : calloc(count ? count : 1, size ? size : 1);
}

void *thaw_realloc(void *p, size_t n) { return should_fail() ? NULL : realloc(p, n ? n : 1); }

char *thaw_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = thaw_malloc(len + 1);
    if (!d)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *thaw_strdup(const char *s) { return thaw_strndup(s, strlen(s)); }

void thaw_free(void *p) { free(p); }
