/* alloc: the one allocation wrapper, so out-of-memory is a tested path.
 *
 * All Thaw code allocates through these. Tests call alloc_fail_after(n) to
 * make the (n+1)-th allocation from now fail; -1 turns failure injection off.
 * Every function returns NULL on failure and never aborts. */
#ifndef THAW_ALLOC_H
#define THAW_ALLOC_H

#include <stddef.h>

void *thaw_malloc(size_t n);
void *thaw_calloc(size_t count, size_t size);
void *thaw_realloc(void *p, size_t n);
char *thaw_strdup(const char *s);
char *thaw_strndup(const char *s, size_t n);
void thaw_free(void *p);

/* Test hook: after n more successful allocations, fail them all until reset (-1). */
void alloc_fail_after(long n);

#endif
