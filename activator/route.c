#include "route.h"

#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "config.h"
#include "strmap.h"

enum { SC_OK = 0, SC_MORE = -1, SC_BAD = -2 };

struct scanner {
    const char *p;
    size_t len;
    size_t i;
};

static void skip_ws(struct scanner *s)
{
    while (s->i < s->len) {
        char c = s->p[s->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        s->i++;
    }
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* Appends code point cp as UTF-8 if it fits; *overflow otherwise. */
static void put_utf8(char *out, size_t cap, size_t *o, unsigned cp, bool *overflow)
{
    char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xC0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xE0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        b[0] = (char)(0xF0 | (cp >> 18));
        b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    if (!out || *overflow)
        return;
    if (*o + n >= cap) {
        *overflow = true;
        return;
    }
    memcpy(out + *o, b, n);
    *o += n;
}

/* At a '"': reads the string, unescaping into out (NUL-terminated) when out
 * is not NULL. *overflow when it did not fit. */
static int scan_string(struct scanner *s, char *out, size_t cap, bool *overflow)
{
    size_t o = 0;
    *overflow = false;
    s->i++; /* opening quote */
    while (s->i < s->len) {
        unsigned char c = (unsigned char)s->p[s->i];
        if (c == '"') {
            s->i++;
            if (out)
                out[o] = '\0';
            return SC_OK;
        }
        if (c < 0x20)
            return SC_BAD;
        if (c != '\\') {
            if (out && !*overflow) {
                if (o + 1 >= cap)
                    *overflow = true;
                else
                    out[o++] = (char)c;
            }
            s->i++;
            continue;
        }
        if (s->i + 1 >= s->len)
            return SC_MORE;
        char e = s->p[s->i + 1];
        unsigned cp = 0;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u': {
            if (s->i + 6 > s->len)
                return SC_MORE;
            if (hex4(s->p + s->i + 2, &cp) < 0)
                return SC_BAD;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                /* A high surrogate must be followed by an escaped low one. */
                if (s->i + 12 > s->len)
                    return SC_MORE;
                unsigned lo;
                if (s->p[s->i + 6] != '\\' || s->p[s->i + 7] != 'u' ||
                    hex4(s->p + s->i + 8, &lo) < 0 || lo < 0xDC00 || lo > 0xDFFF)
                    return SC_BAD;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                s->i += 6;
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return SC_BAD;
            }
            s->i += 4;
            break;
        }
        default:
            return SC_BAD;
        }
        s->i += 2;
        put_utf8(out, cap, &o, cp, overflow);
    }
    return SC_MORE;
}

static int scan_literal(struct scanner *s, const char *lit)
{
    size_t n = strlen(lit);
    size_t avail = s->len - s->i;
    size_t cmp = avail < n ? avail : n;
    if (memcmp(s->p + s->i, lit, cmp) != 0)
        return SC_BAD;
    if (avail < n)
        return SC_MORE;
    s->i += n;
    return SC_OK;
}

static int scan_number(struct scanner *s)
{
    size_t start = s->i;
    while (s->i < s->len) {
        char c = s->p[s->i];
        if (!((c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'))
            break;
        s->i++;
    }
    if (s->i == s->len)
        return SC_MORE; /* the number may go on */
    return s->i > start ? SC_OK : SC_BAD;
}

/* Skips any value. Containers are skipped by depth, tracking strings so
 * brackets inside them do not count; their contents are not validated. */
static int skip_value(struct scanner *s)
{
    if (s->i >= s->len)
        return SC_MORE;
    char c = s->p[s->i];
    bool of;
    if (c == '"')
        return scan_string(s, NULL, 0, &of);
    if (c == 't')
        return scan_literal(s, "true");
    if (c == 'f')
        return scan_literal(s, "false");
    if (c == 'n')
        return scan_literal(s, "null");
    if (c == '-' || (c >= '0' && c <= '9'))
        return scan_number(s);
    if (c != '{' && c != '[')
        return SC_BAD;
    size_t depth = 0;
    while (s->i < s->len) {
        c = s->p[s->i];
        if (c == '"') {
            int rc = scan_string(s, NULL, 0, &of);
            if (rc != SC_OK)
                return rc;
            continue;
        }
        if (c == '{' || c == '[') {
            if (++depth > 512)
                return SC_BAD;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) {
                s->i++;
                return SC_OK;
            }
        }
        s->i++;
    }
    return SC_MORE;
}

enum route_json_result route_json_scan(const char *body, size_t len, struct route_json_info *out)
{
    struct scanner s = {body, len, 0};
    bool found = false;
    out->model[0] = '\0';
    out->stream = false;
    out->stream_seen = false;
    int rc = SC_OK;
    skip_ws(&s);
    if (s.i >= s.len)
        return ROUTE_JSON_MORE;
    if (s.p[s.i] != '{')
        return ROUTE_JSON_INVALID;
    s.i++;
    skip_ws(&s);
    if (s.i < s.len && s.p[s.i] == '}')
        return ROUTE_JSON_ABSENT;
    for (;;) {
        skip_ws(&s);
        if (s.i >= s.len) {
            rc = SC_MORE;
            break;
        }
        if (s.p[s.i] != '"')
            return ROUTE_JSON_INVALID;
        char key[16];
        bool key_long;
        rc = scan_string(&s, key, sizeof(key), &key_long);
        if (rc != SC_OK)
            break;
        skip_ws(&s);
        if (s.i >= s.len) {
            rc = SC_MORE;
            break;
        }
        if (s.p[s.i] != ':')
            return ROUTE_JSON_INVALID;
        s.i++;
        skip_ws(&s);
        if (s.i >= s.len) {
            rc = SC_MORE;
            break;
        }
        if (!key_long && strcmp(key, "model") == 0) {
            if (s.p[s.i] != '"')
                return ROUTE_JSON_INVALID;
            char value[sizeof(out->model)];
            bool too_long;
            rc = scan_string(&s, value, sizeof(value), &too_long);
            if (rc != SC_OK)
                break;
            if (too_long)
                return ROUTE_JSON_INVALID;
            /* Duplicate keys: the backend's JSON parser may pick the other
             * one, so a second, different "model" is refused. */
            if (found && strcmp(value, out->model) != 0)
                return ROUTE_JSON_INVALID;
            memcpy(out->model, value, sizeof(value));
            found = true;
        } else if (!key_long && strcmp(key, "stream") == 0 &&
                   (s.p[s.i] == 't' || s.p[s.i] == 'f')) {
            bool t = s.p[s.i] == 't';
            rc = scan_literal(&s, t ? "true" : "false");
            if (rc != SC_OK)
                break;
            out->stream = t;
            out->stream_seen = true;
        } else {
            rc = skip_value(&s);
            if (rc != SC_OK)
                break;
        }
        skip_ws(&s);
        if (s.i >= s.len) {
            rc = SC_MORE;
            break;
        }
        if (s.p[s.i] == ',') {
            s.i++;
            continue;
        }
        if (s.p[s.i] == '}')
            break;
        return ROUTE_JSON_INVALID;
    }
    if (rc == SC_BAD)
        return ROUTE_JSON_INVALID;
    if (found)
        return ROUTE_JSON_FOUND;
    return rc == SC_MORE ? ROUTE_JSON_MORE : ROUTE_JSON_ABSENT;
}

static char fold(char c, bool nocase)
{
    return (nocase && c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
}

bool route_glob(const char *pattern, const char *s, size_t slen, bool nocase)
{
    /* Iterative matcher: on a mismatch, retry from the last '*' with one
     * more character swallowed. Linear-ish, no recursion. */
    const char *p = pattern;
    size_t i = 0;
    const char *star = NULL;
    size_t star_i = 0;
    while (i < slen) {
        if (*p == '*') {
            star = p++;
            star_i = i;
        } else if (*p && fold(*p, nocase) == fold(s[i], nocase)) {
            p++;
            i++;
        } else if (star) {
            p = star + 1;
            i = ++star_i;
        } else {
            return false;
        }
    }
    while (*p == '*')
        p++;
    return *p == '\0';
}

static bool name_eq(const char *a, const char *b, size_t blen)
{
    return strlen(a) == blen && memcmp(a, b, blen) == 0;
}

int route_by_name(const struct config *cfg, const char *name, size_t len)
{
    for (size_t i = 0; i < cfg->nmodels; i++) {
        if (name_eq(cfg->models[i].name, name, len))
            return (int)i;
    }
    /* Exact aliases before globs, so a specific alias beats a broad pattern. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < cfg->nmodels; i++) {
            const struct model_config *m = &cfg->models[i];
            for (size_t k = 0; k < m->naliases; k++) {
                bool glob = strchr(m->aliases[k], '*') != NULL;
                if (glob != (pass == 1))
                    continue;
                if (glob ? route_glob(m->aliases[k], name, len, false)
                         : name_eq(m->aliases[k], name, len))
                    return (int)i;
            }
        }
    }
    return -1;
}

int route_by_host(const struct config *cfg, const char *host, size_t len)
{
    size_t hl = len;
    if (len > 0 && host[0] == '[') {
        const char *rb = memchr(host, ']', len);
        if (rb)
            hl = (size_t)(rb - host) + 1;
    } else {
        for (size_t i = len; i > 0; i--) {
            if (host[i - 1] == ':') {
                hl = i - 1;
                break;
            }
            if (host[i - 1] < '0' || host[i - 1] > '9')
                break;
        }
    }
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const struct model_config *m = &cfg->models[i];
        for (size_t k = 0; k < m->nhosts; k++) {
            if (route_glob(m->hosts[k], host, hl, true))
                return (int)i;
        }
    }
    return -1;
}

struct route_table {
    const struct config *cfg;
    struct strmap *exact; /* name or exact alias -> index + 1 */
    bool has_globs;
};

struct route_table *route_table_new(const struct config *cfg)
{
    struct route_table *t = thaw_calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->cfg = cfg;
    t->exact = strmap_new();
    if (!t->exact) {
        thaw_free(t);
        return NULL;
    }
    /* Names first, then exact aliases in config order, each only if the key
     * is not taken: the same precedence as route_by_name. */
    for (size_t i = 0; i < cfg->nmodels; i++) {
        if (strmap_put(t->exact, cfg->models[i].name, (void *)(uintptr_t)(i + 1)) < 0)
            goto fail;
    }
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const struct model_config *m = &cfg->models[i];
        for (size_t k = 0; k < m->naliases; k++) {
            if (strchr(m->aliases[k], '*')) {
                t->has_globs = true;
                continue;
            }
            if (!strmap_get(t->exact, m->aliases[k]) &&
                strmap_put(t->exact, m->aliases[k], (void *)(uintptr_t)(i + 1)) < 0)
                goto fail;
        }
    }
    return t;
fail:
    route_table_free(t);
    return NULL;
}

void route_table_free(struct route_table *t)
{
    if (!t)
        return;
    strmap_free(t->exact);
    thaw_free(t);
}

int route_table_lookup(const struct route_table *t, const char *name)
{
    void *v = strmap_get(t->exact, name);
    if (v)
        return (int)((uintptr_t)v - 1);
    if (!t->has_globs)
        return -1;
    size_t len = strlen(name);
    for (size_t i = 0; i < t->cfg->nmodels; i++) {
        const struct model_config *m = &t->cfg->models[i];
        for (size_t k = 0; k < m->naliases; k++) {
            if (strchr(m->aliases[k], '*') && route_glob(m->aliases[k], name, len, false))
                return (int)i;
        }
    }
    return -1;
}
