#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "alloc.h"
#include "model_name.h"

enum field_type {
    F_STRING,  /* char * */
    F_STRINGS, /* char ** + size_t count right after it */
    F_INT,     /* long, whole number */
    F_SECONDS, /* long milliseconds, given in (fractional) seconds */
    F_BOOL,    /* long 0 or 1, given as true / false */
};

struct field_def {
    const char *json;
    enum field_type type;
    size_t offset;
    size_t count_offset; /* F_STRINGS: where the count goes */
    double min, max;
    const char *def; /* default as text (numbers, strings); NULL: none */
    bool model_only; /* not allowed in "defaults" */
};

#define MF(f) offsetof(struct model_config, f)
#define LF(f) offsetof(struct limits_config, f)

static const struct field_def model_fields[] = {
    {"name", F_STRING, MF(name), 0, 0, 0, NULL, true},
    {"backend", F_STRING, MF(backend), 0, 0, 0, NULL, true},
    {"endpointsFile", F_STRING, MF(endpoints_file), 0, 0, 0, NULL, true},
    {"healthPath", F_STRING, MF(health_path), 0, 0, 0, "/health", false},
    {"aliases", F_STRINGS, MF(aliases), MF(naliases), 0, 0, NULL, true},
    {"hosts", F_STRINGS, MF(hosts), MF(nhosts), 0, 0, NULL, true},
    {"wakeWith", F_STRINGS, MF(wake_with), MF(nwake_with), 0, 0, NULL, true},
    {"maxHeldRequests", F_INT, MF(max_held_requests), 0, 1, 10000000, "1000", false},
    {"maxHeldBytes", F_INT, MF(max_held_bytes), 0, 1, 1099511627776.0, "67108864", false},
    {"holdTimeoutSeconds", F_SECONDS, MF(hold_timeout_ms), 0, 0.001, 86400, "600", false},
    {"maxConcurrencyPerEndpoint", F_INT, MF(max_concurrency_per_endpoint), 0, 0, 1000000, "0",
     false},
    {"splitConcurrencyAcrossActivators", F_BOOL, MF(split_concurrency), 0, 0, 1, "1", false},
    {"fallbackBackend", F_STRING, MF(fallback_backend), 0, 0, 0, NULL, false},
    {"fallbackAfterSeconds", F_SECONDS, MF(fallback_after_ms), 0, 0, 86400, "30", false},
    {"lateAfterSeconds", F_SECONDS, MF(late_after_ms), 0, 0, 3600, "0", false},
    {"sseHeartbeatSeconds", F_SECONDS, MF(sse_heartbeat_ms), 0, 0, 3600, "0", false},
    {"probeInitialMs", F_INT, MF(probe_initial_ms), 0, 1, 60000, "10", false},
    {"probeMaxMs", F_INT, MF(probe_max_ms), 0, 1, 600000, "25", false},
    {"probeTimeoutMs", F_INT, MF(probe_timeout_ms), 0, 1, 600000, "1000", false},
    {"dnsRefreshSeconds", F_SECONDS, MF(dns_refresh_ms), 0, 0.1, 3600, "5", false},
    {"dnsRefreshWakingSeconds", F_SECONDS, MF(dns_refresh_waking_ms), 0, 0.05, 3600, "0.5",
     false},
    {"responseHeaderTimeoutSeconds", F_SECONDS, MF(response_header_timeout_ms), 0, 0.01, 86400,
     "300", false},
    {"responseIdleTimeoutSeconds", F_SECONDS, MF(response_idle_timeout_ms), 0, 0.01, 86400, "600",
     false},
};

static const struct field_def limit_fields[] = {
    {"maxHeaderBytes", F_INT, LF(max_header_bytes), 0, 256, 1048576, "32768", false},
    {"maxHeaders", F_INT, LF(max_headers), 0, 1, 128, "100", false},
    {"maxBodyBytes", F_INT, LF(max_body_bytes), 0, 0, 1099511627776.0, "16777216", false},
    {"routeBodyBytes", F_INT, LF(route_body_bytes), 0, 256, 16777216, "65536", false},
    {"headerTimeoutSeconds", F_SECONDS, LF(header_timeout_ms), 0, 0.01, 3600, "10", false},
    {"bodyIdleTimeoutSeconds", F_SECONDS, LF(body_idle_timeout_ms), 0, 0.01, 3600, "30", false},
    {"idleTimeoutSeconds", F_SECONDS, LF(idle_timeout_ms), 0, 0.01, 86400, "60", false},
    {"drainTimeoutSeconds", F_SECONDS, LF(drain_timeout_ms), 0, 0, 86400, "30", false},
    {"connectTimeoutMs", F_INT, LF(connect_timeout_ms), 0, 1, 600000, "2000", false},
    {"upstreamIdleTimeoutSeconds", F_SECONDS, LF(upstream_idle_ms), 0, 0.01, 86400, "30", false},
    {"maxIdlePerEndpoint", F_INT, LF(max_idle_per_endpoint), 0, 0, 100000, "64", false},
    {"retryAfterSeconds", F_INT, LF(retry_after_seconds), 0, 0, 86400, "5", false},
    {"bufferBytes", F_INT, LF(buffer_bytes), 0, 4096, 67108864, "262144", false},
    {"sendTimeoutSeconds", F_SECONDS, LF(send_timeout_ms), 0, 0.01, 86400, "60", false},
    {"lingeringTimeoutSeconds", F_SECONDS, LF(lingering_timeout_ms), 0, 0, 3600, "5", false},
    {"lingeringTimeSeconds", F_SECONDS, LF(lingering_time_ms), 0, 0.01, 3600, "30", false},
    {"lingeringMaxBytes", F_INT, LF(lingering_max_bytes), 0, 0, 1099511627776.0, "67108864",
     false},
    {"maxLingeringConnections", F_INT, LF(max_lingering), 0, 0, 1000000, "512", false},
};

#define NFIELDS(t) (sizeof(t) / sizeof((t)[0]))

int tier_parse(const char *s, size_t len)
{
    static const char *const names[] = {"high", "normal", "low"};
    for (int i = 0; i < TIER_COUNT; i++) {
        if (strlen(names[i]) == len && strncmp(s, names[i], len) == 0)
            return i;
    }
    return -1;
}

const char *tier_to_str(enum tier t)
{
    switch (t) {
    case TIER_HIGH:
        return "high";
    case TIER_NORMAL:
        return "normal";
    case TIER_LOW:
        return "low";
    }
    return "unknown";
}

static void free_strings(char **v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        thaw_free(v[i]);
    thaw_free(v);
}

static void free_fields(const struct field_def *defs, size_t n, void *target)
{
    char *base = target;
    for (size_t i = 0; i < n; i++) {
        if (defs[i].type == F_STRING) {
            char **slot = (char **)(void *)(base + defs[i].offset);
            thaw_free(*slot);
            *slot = NULL;
        } else if (defs[i].type == F_STRINGS) {
            char ***slot = (char ***)(void *)(base + defs[i].offset);
            size_t *cnt = (size_t *)(void *)(base + defs[i].count_offset);
            free_strings(*slot, *cnt);
            *slot = NULL;
            *cnt = 0;
        }
    }
}

static void model_config_finish(struct model_config *m)
{
    free_fields(model_fields, NFIELDS(model_fields), m);
    thaw_free(m->backend_host);
    m->backend_host = NULL;
    thaw_free(m->fallback_host);
    m->fallback_host = NULL;
}

/* Deep-copies the fields of src into dst (used to start a model from the defaults). */
static int copy_fields(const struct field_def *defs, size_t n, void *dst, const void *src)
{
    char *d = dst;
    const char *s = src;
    for (size_t i = 0; i < n; i++) {
        if (defs[i].type == F_STRING) {
            const char *v = *(char *const *)(const void *)(s + defs[i].offset);
            char **slot = (char **)(void *)(d + defs[i].offset);
            *slot = NULL;
            if (v && !(*slot = thaw_strdup(v)))
                return -1;
        } else if (defs[i].type == F_STRINGS) {
            /* Lists are model-only and never inherited. */
            *(char ***)(void *)(d + defs[i].offset) = NULL;
            *(size_t *)(void *)(d + defs[i].count_offset) = 0;
        } else {
            *(long *)(void *)(d + defs[i].offset) = *(const long *)(const void *)(s + defs[i].offset);
        }
    }
    return 0;
}

static int set_number(const struct field_def *d, void *target, double v, const char *path,
                      char *err, size_t errlen)
{
    if (!isfinite(v) || v < d->min || v > d->max) {
        snprintf(err, errlen, "%s: expected a number in %g..%g", path, d->min, d->max);
        return -1;
    }
    long *slot = (long *)(void *)((char *)target + d->offset);
    if (d->type == F_INT || d->type == F_BOOL) {
        if (v != floor(v)) {
            snprintf(err, errlen, "%s: expected a whole number", path);
            return -1;
        }
        *slot = (long)v;
    } else {
        *slot = (long)llround(v * 1000.0);
    }
    return 0;
}

static int apply_defaults(const struct field_def *defs, size_t n, void *target)
{
    for (size_t i = 0; i < n; i++) {
        if (!defs[i].def)
            continue;
        if (defs[i].type == F_STRING) {
            char **slot = (char **)(void *)((char *)target + defs[i].offset);
            if (!(*slot = thaw_strdup(defs[i].def)))
                return -1;
        } else if (defs[i].type != F_STRINGS) {
            char e[8];
            if (set_number(&defs[i], target, strtod(defs[i].def, NULL), "", e, sizeof(e)) < 0)
                return -1;
        }
    }
    return 0;
}

static int set_field(const struct field_def *d, void *target, json_t *v, const char *path,
                     char *err, size_t errlen)
{
    char *base = target;
    switch (d->type) {
    case F_STRING: {
        if (!json_is_string(v) || json_string_length(v) == 0 ||
            strlen(json_string_value(v)) != json_string_length(v)) {
            snprintf(err, errlen, "%s: expected a non-empty string", path);
            return -1;
        }
        char *copy = thaw_strdup(json_string_value(v));
        if (!copy) {
            snprintf(err, errlen, "%s: out of memory", path);
            return -1;
        }
        char **slot = (char **)(void *)(base + d->offset);
        thaw_free(*slot);
        *slot = copy;
        return 0;
    }
    case F_STRINGS: {
        if (!json_is_array(v)) {
            snprintf(err, errlen, "%s: expected an array of strings", path);
            return -1;
        }
        size_t n = json_array_size(v);
        char **arr = thaw_calloc(n ? n : 1, sizeof(char *));
        if (!arr) {
            snprintf(err, errlen, "%s: out of memory", path);
            return -1;
        }
        for (size_t i = 0; i < n; i++) {
            json_t *s = json_array_get(v, i);
            if (!json_is_string(s) || json_string_length(s) == 0 ||
                strlen(json_string_value(s)) != json_string_length(s)) {
                snprintf(err, errlen, "%s[%zu]: expected a non-empty string", path, i);
                free_strings(arr, i);
                return -1;
            }
            if (!(arr[i] = thaw_strdup(json_string_value(s)))) {
                snprintf(err, errlen, "%s: out of memory", path);
                free_strings(arr, i);
                return -1;
            }
        }
        char ***slot = (char ***)(void *)(base + d->offset);
        size_t *cnt = (size_t *)(void *)(base + d->count_offset);
        free_strings(*slot, *cnt);
        *slot = arr;
        *cnt = n;
        return 0;
    }
    case F_INT:
    case F_SECONDS:
        if (!json_is_number(v)) {
            snprintf(err, errlen, "%s: expected a number", path);
            return -1;
        }
        return set_number(d, target, json_number_value(v), path, err, errlen);
    case F_BOOL:
        if (!json_is_boolean(v)) {
            snprintf(err, errlen, "%s: expected true or false", path);
            return -1;
        }
        *(long *)(void *)(base + d->offset) = json_is_true(v) ? 1 : 0;
        return 0;
    }
    return -1;
}

/* Fills target from the JSON object; unknown keys are errors. */
static int parse_object(const struct field_def *defs, size_t n, bool is_defaults, json_t *obj,
                        void *target, const char *prefix, char *err, size_t errlen)
{
    if (!json_is_object(obj)) {
        snprintf(err, errlen, "%s: expected an object", prefix);
        return -1;
    }
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        char path[256];
        snprintf(path, sizeof(path), "%s.%s", prefix, key);
        const struct field_def *d = NULL;
        for (size_t i = 0; i < n; i++) {
            if (strcmp(defs[i].json, key) == 0) {
                d = &defs[i];
                break;
            }
        }
        if (!d || (is_defaults && d->model_only)) {
            snprintf(err, errlen, "%s: unknown field", path);
            return -1;
        }
        if (set_field(d, target, v, path, err, errlen) < 0)
            return -1;
    }
    return 0;
}

int config_parse_backend_url(const char *url, char *hostbuf, size_t hostlen, int *port)
{
    const char *p = url;
    if (strncmp(p, "http://", 7) != 0)
        return -1;
    p += 7;
    const char *host_start = p, *host_end;
    if (*p == '[') {
        host_start = ++p;
        while (*p && *p != ']')
            p++;
        if (*p != ']')
            return -1;
        host_end = p++;
    } else {
        while (*p && *p != ':' && *p != '/')
            p++;
        host_end = p;
    }
    size_t hl = (size_t)(host_end - host_start);
    if (hl == 0 || hl >= hostlen)
        return -1;
    for (const char *q = host_start; q < host_end; q++) {
        if (*q == '@' || *q <= ' ')
            return -1;
    }
    memcpy(hostbuf, host_start, hl);
    hostbuf[hl] = '\0';
    *port = 80;
    if (*p == ':') {
        p++;
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 1 || v > 65535)
            return -1;
        *port = (int)v;
        p = end;
    }
    if (*p == '/')
        p++;
    return *p == '\0' ? 0 : -1;
}

static int finish_model(struct config *cfg, size_t idx, char *err, size_t errlen)
{
    struct model_config *m = &cfg->models[idx];
    char path[64];
    snprintf(path, sizeof(path), "models[%zu]", idx);
    if (!m->name) {
        snprintf(err, errlen, "%s.name: required", path);
        return -1;
    }
    /* The rule thaw-scaler's POST /wake applies, so every model can be woken
     * without Redis too. */
    if (!model_name_valid(m->name, strlen(m->name))) {
        snprintf(err, errlen, "%s.name: expected 1-%d bytes without control characters", path,
                 MODEL_NAME_MAX);
        return -1;
    }
    if (!!m->backend == !!m->endpoints_file) {
        snprintf(err, errlen, "%s (%s): exactly one of backend and endpointsFile is required", path,
                 m->name);
        return -1;
    }
    if (m->backend) {
        char host[256];
        if (config_parse_backend_url(m->backend, host, sizeof(host), &m->backend_port) < 0) {
            snprintf(err, errlen, "%s.backend: expected http://HOST[:PORT], got '%s'", path,
                     m->backend);
            return -1;
        }
        if (!(m->backend_host = thaw_strdup(host))) {
            snprintf(err, errlen, "%s: out of memory", path);
            return -1;
        }
    }
    if (m->fallback_backend) {
        char host[256];
        if (config_parse_backend_url(m->fallback_backend, host, sizeof(host),
                                     &m->fallback_port) < 0) {
            snprintf(err, errlen, "%s.fallbackBackend: expected http://HOST[:PORT], got '%s'",
                     path, m->fallback_backend);
            return -1;
        }
        if (!(m->fallback_host = thaw_strdup(host))) {
            snprintf(err, errlen, "%s: out of memory", path);
            return -1;
        }
    }
    if (m->health_path[0] != '/') {
        snprintf(err, errlen, "%s.healthPath: must start with '/'", path);
        return -1;
    }
    for (const char *c = m->health_path; *c; c++) {
        if (*c <= ' ' || *c == 0x7f || *c == '#') {
            snprintf(err, errlen,
                     "%s.healthPath: must not hold spaces, control characters or '#' (a "
                     "fragment is not sent)",
                     path);
            return -1;
        }
    }
    for (size_t k = 0; k < m->naliases; k++) {
        if (!model_name_valid(m->aliases[k], strlen(m->aliases[k]))) {
            snprintf(err, errlen, "%s.aliases[%zu]: expected 1-%d bytes without control characters",
                     path, k, MODEL_NAME_MAX);
            return -1;
        }
    }
    if (m->probe_max_ms < m->probe_initial_ms) {
        snprintf(err, errlen, "%s.probeMaxMs: must be >= probeInitialMs", path);
        return -1;
    }
    return 0;
}

static int check_names(const struct config *cfg, char *err, size_t errlen)
{
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const struct model_config *m = &cfg->models[i];
        for (size_t j = 0; j < i; j++) {
            if (strcmp(cfg->models[j].name, m->name) == 0) {
                snprintf(err, errlen, "models[%zu].name: duplicate model '%s'", i, m->name);
                return -1;
            }
        }
        for (size_t k = 0; k < m->nwake_with; k++) {
            if (config_model_index(cfg, m->wake_with[k]) < 0) {
                snprintf(err, errlen, "models[%zu].wakeWith[%zu]: unknown model '%s'", i, k,
                         m->wake_with[k]);
                return -1;
            }
        }
    }
    return 0;
}

struct config *config_parse(const char *text, size_t len, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        snprintf(err, errlen, "line %d column %d: %s", jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    struct config *cfg = thaw_calloc(1, sizeof(*cfg));
    struct model_config *defaults = thaw_calloc(1, sizeof(*defaults));
    if (!cfg || !defaults) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (apply_defaults(limit_fields, NFIELDS(limit_fields), &cfg->limits) < 0 ||
        apply_defaults(model_fields, NFIELDS(model_fields), defaults) < 0) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (!json_is_object(root)) {
        snprintf(err, errlen, "top level: expected an object");
        goto fail;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "models") != 0 && strcmp(key, "limits") != 0 &&
            strcmp(key, "defaults") != 0 && strcmp(key, "apiKeyTiers") != 0) {
            snprintf(err, errlen, "%s: unknown field", key);
            goto fail;
        }
    }
    json_t *limits = json_object_get(root, "limits");
    if (limits && parse_object(limit_fields, NFIELDS(limit_fields), false, limits, &cfg->limits,
                               "limits", err, errlen) < 0)
        goto fail;
    json_t *defs = json_object_get(root, "defaults");
    if (defs && parse_object(model_fields, NFIELDS(model_fields), true, defs, defaults, "defaults",
                             err, errlen) < 0)
        goto fail;

    json_t *keys = json_object_get(root, "apiKeyTiers");
    if (keys) {
        if (!json_is_object(keys)) {
            snprintf(err, errlen, "apiKeyTiers: expected an object of KEY: tier");
            goto fail;
        }
        size_t n = json_object_size(keys);
        cfg->api_keys = thaw_calloc(n ? n : 1, sizeof(*cfg->api_keys));
        if (!cfg->api_keys) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        json_object_foreach(keys, key, v) {
            int t = json_is_string(v) ? tier_parse(json_string_value(v), json_string_length(v))
                                      : -1;
            if (t < 0) {
                snprintf(err, errlen, "apiKeyTiers.%s: expected \"high\", \"normal\" or \"low\"",
                         key);
                goto fail;
            }
            struct api_key_tier *k = &cfg->api_keys[cfg->napi_keys];
            if (!(k->key = thaw_strdup(key))) {
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
            k->tier = (enum tier)t;
            cfg->napi_keys++;
        }
    }

    json_t *models = json_object_get(root, "models");
    if (!json_is_array(models) || json_array_size(models) == 0) {
        snprintf(err, errlen, "models: expected a non-empty array");
        goto fail;
    }
    size_t n = json_array_size(models);
    cfg->models = thaw_calloc(n, sizeof(*cfg->models));
    if (!cfg->models) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        char path[64];
        snprintf(path, sizeof(path), "models[%zu]", i);
        struct model_config *m = &cfg->models[i];
        cfg->nmodels = i + 1; /* so a failure frees what was filled */
        if (copy_fields(model_fields, NFIELDS(model_fields), m, defaults) < 0) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        if (parse_object(model_fields, NFIELDS(model_fields), false, json_array_get(models, i), m,
                         path, err, errlen) < 0 ||
            finish_model(cfg, i, err, errlen) < 0)
            goto fail;
    }
    if (check_names(cfg, err, errlen) < 0)
        goto fail;
    model_config_finish(defaults);
    thaw_free(defaults);
    json_decref(root);
    return cfg;

fail:
    if (defaults)
        model_config_finish(defaults);
    thaw_free(defaults);
    config_free(cfg);
    json_decref(root);
    return NULL;
}

struct config *config_load(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = thaw_malloc(cap);
    if (!buf) {
        fclose(f);
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    for (;;) {
        if (len == cap) {
            if (cap >= 64u << 20) {
                snprintf(err, errlen, "%s: larger than 64 MiB", path);
                goto fail;
            }
            char *nb = thaw_realloc(buf, cap * 2);
            if (!nb) {
                snprintf(err, errlen, "%s: out of memory", path);
                goto fail;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (r == 0) {
            if (ferror(f)) {
                snprintf(err, errlen, "%s: read error", path);
                goto fail;
            }
            break;
        }
    }
    fclose(f);
    char inner[512];
    struct config *cfg = config_parse(buf, len, inner, sizeof(inner));
    thaw_free(buf);
    if (!cfg)
        snprintf(err, errlen, "%s: %s", path, inner);
    return cfg;
fail:
    fclose(f);
    thaw_free(buf);
    return NULL;
}

void config_free(struct config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < cfg->nmodels; i++)
        model_config_finish(&cfg->models[i]);
    thaw_free(cfg->models);
    for (size_t i = 0; i < cfg->napi_keys; i++)
        thaw_free(cfg->api_keys[i].key);
    thaw_free(cfg->api_keys);
    thaw_free(cfg);
}

int config_model_index(const struct config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->nmodels; i++) {
        if (strcmp(cfg->models[i].name, name) == 0)
            return (int)i;
    }
    return -1;
}
