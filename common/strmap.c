#include "strmap.h"

#include <stdint.h>
#include <string.h>

#include "alloc.h"

struct slot {
    char *key; /* NULL = empty */
    void *value;
    uint64_t hash;
};

struct strmap {
    struct slot *slots;
    size_t cap; /* power of two */
    size_t count;
};

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

struct strmap *strmap_new(void)
{
    struct strmap *m = thaw_calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->cap = 16;
    m->slots = thaw_calloc(m->cap, sizeof(*m->slots));
    if (!m->slots) {
        thaw_free(m);
        return NULL;
    }
    return m;
}

void strmap_free(struct strmap *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->cap; i++)
        thaw_free(m->slots[i].key);
    thaw_free(m->slots);
    thaw_free(m);
}

static size_t find(const struct strmap *m, const char *key, uint64_t h)
{
    size_t i = (size_t)h & (m->cap - 1);
    while (m->slots[i].key && (m->slots[i].hash != h || strcmp(m->slots[i].key, key) != 0))
        i = (i + 1) & (m->cap - 1);
    return i;
}

static int grow(struct strmap *m)
{
    size_t ncap = m->cap * 2;
    struct slot *ns = thaw_calloc(ncap, sizeof(*ns));
    if (!ns)
        return -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].key)
            continue;
        size_t j = (size_t)m->slots[i].hash & (ncap - 1);
        while (ns[j].key)
            j = (j + 1) & (ncap - 1);
        ns[j] = m->slots[i];
    }
    thaw_free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return 0;
}

void *strmap_get(const struct strmap *m, const char *key)
{
    size_t i = find(m, key, hash_str(key));
    return m->slots[i].key ? m->slots[i].value : NULL;
}

int strmap_put(struct strmap *m, const char *key, void *value)
{
    uint64_t h = hash_str(key);
    size_t i = find(m, key, h);
    if (m->slots[i].key) {
        m->slots[i].value = value;
        return 0;
    }
    if ((m->count + 1) * 4 > m->cap * 3) { /* keep load under 75 % */
        if (grow(m) != 0)
            return -1;
        i = find(m, key, h);
    }
    char *copy = thaw_strdup(key);
    if (!copy)
        return -1;
    m->slots[i].key = copy;
    m->slots[i].value = value;
    m->slots[i].hash = h;
    m->count++;
    return 0;
}

void *strmap_remove(struct strmap *m, const char *key)
{
    size_t i = find(m, key, hash_str(key));
    if (!m->slots[i].key)
        return NULL;
    void *value = m->slots[i].value;
    thaw_free(m->slots[i].key);
    m->slots[i].key = NULL;
    m->count--;
    /* Re-seat the rest of the probe run so lookups never stop early. */
    size_t j = (i + 1) & (m->cap - 1);
    while (m->slots[j].key) {
        struct slot s = m->slots[j];
        m->slots[j].key = NULL;
        size_t k = (size_t)s.hash & (m->cap - 1);
        while (m->slots[k].key)
            k = (k + 1) & (m->cap - 1);
        m->slots[k] = s;
        j = (j + 1) & (m->cap - 1);
    }
    return value;
}

size_t strmap_count(const struct strmap *m) { return m->count; }

int strmap_next(const struct strmap *m, size_t *cursor, const char **key, void **value)
{
    while (*cursor < m->cap) {
        struct slot *s = &m->slots[(*cursor)++];
        if (s->key) {
            *key = s->key;
            *value = s->value;
            return 1;
        }
    }
    return 0;
}
