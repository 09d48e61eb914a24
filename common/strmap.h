/* strmap: a string-keyed hash map (open addressing, linear probing).
 *
 * Keys are copied; values are borrowed pointers the map never frees. Lookups
 * and inserts are O(1) on average so per-model work stays flat at 10 000
 * models. Iteration order is unspecified; the map must not change while an
 * iteration with strmap_next is under way. */
#ifndef THAW_STRMAP_H
#define THAW_STRMAP_H

#include <stddef.h>

struct strmap;

struct strmap *strmap_new(void);
/* Frees the map and its key copies, not the values. Accepts NULL. */
void strmap_free(struct strmap *m);

void *strmap_get(const struct strmap *m, const char *key);
/* Inserts or replaces. Returns 0, or -1 on allocation failure (map unchanged). */
int strmap_put(struct strmap *m, const char *key, void *value);
/* Returns the removed value, or NULL when absent. */
void *strmap_remove(struct strmap *m, const char *key);
size_t strmap_count(const struct strmap *m);

/* Iterates: start with cursor at 0; returns 1 with key and value set, 0 at the end. */
int strmap_next(const struct strmap *m, size_t *cursor, const char **key, void **value);

#endif
