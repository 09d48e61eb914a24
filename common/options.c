#include "options.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "alloc.h"
#include "log.h"

static void env_name(const char *name, char *out, size_t outlen)
{
    size_t o = (size_t)snprintf(out, outlen, "THAW_");
    for (const char *p = name; *p && o + 1 < outlen; p++)
        out[o++] = (*p == '-') ? '_' : (char)toupper((unsigned char)*p);
    out[o] = '\0';
}

static int set_value(const struct opt_def *d, void *target, const char *value, const char *source,
                     char *err, size_t errlen)
{
    char *field = (char *)target + d->offset;
    switch (d->type) {
    case OPT_STRING: {
        char *copy = thaw_strdup(value);
        if (!copy) {
            snprintf(err, errlen, "%s: out of memory", source);
            return -1;
        }
        char **slot = (char **)(void *)field;
        thaw_free(*slot);
        *slot = copy;
        return 0;
    }
    case OPT_INT:
    case OPT_DOUBLE: {
        char *end = NULL;
        errno = 0;
        double v = strtod(value, &end);
        if (errno || end == value || *end != '\0' || !isfinite(v)) {
            snprintf(err, errlen, "%s: expected a number, got '%s'", source, value);
            return -1;
        }
        if (d->type == OPT_INT && v != floor(v)) {
            snprintf(err, errlen, "%s: expected a whole number, got '%s'", source, value);
            return -1;
        }
        if (v < d->min || v > d->max) {
            snprintf(err, errlen, "%s: %s is outside [%g, %g]", source, value, d->min, d->max);
            return -1;
        }
        if (d->type == OPT_INT)
            *(long *)(void *)field = (long)v;
        else
            *(double *)(void *)field = v;
        return 0;
    }
    case OPT_LOG_LEVEL: {
        enum log_level lvl;
        if (log_level_parse(value, &lvl) != 0) {
            snprintf(err, errlen, "%s: unknown level '%s' (debug, info, warn, error)", source,
                     value);
            return -1;
        }
        *(enum log_level *)(void *)field = lvl;
        return 0;
    }
    }
    snprintf(err, errlen, "%s: unsupported option type", source);
    return -1;
}

static void print_help(const struct opt_def *defs, size_t ndefs, const char *prog,
                       const char *summary, FILE *out)
{
    fprintf(out, "Usage: %s [OPTIONS]\n%s\n\nOptions (each also as an environment variable):\n",
            prog, summary);
    for (size_t i = 0; i < ndefs; i++) {
        char env[128];
        env_name(defs[i].name, env, sizeof(env));
        fprintf(out, "  --%-28s %s\n  %-30s   env %s%s%s, default: %s\n", defs[i].name,
                defs[i].help, "", env, defs[i].json_key ? ", config key " : "",
                defs[i].json_key ? defs[i].json_key : "", defs[i].def ? defs[i].def : "(none)");
    }
    fprintf(out, "  --%-28s %s\n", "help", "show this help and exit");
}

/* The config path from argv or the environment, before anything else is parsed. */
static const char *find_config_path(const char *name, int argc, char **argv)
{
    size_t len = strlen(name);
    const char *found = NULL;
    char env[128];
    env_name(name, env, sizeof(env));
    const char *e = getenv(env);
    if (e && *e)
        found = e;
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (strncmp(arg, "--", 2) != 0 || strncmp(arg + 2, name, len) != 0)
            continue;
        if (arg[2 + len] == '=')
            found = arg + 3 + len;
        else if (arg[2 + len] == '\0' && a + 1 < argc)
            found = argv[a + 1];
    }
    return found;
}

static int load_config(const struct opt_def *defs, size_t ndefs, void *target, const char *path,
                       const char *const *extra_keys, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        snprintf(err, errlen, "config %s: %s (line %d, column %d)", path, jerr.text, jerr.line,
                 jerr.column);
        return -1;
    }
    if (!json_is_object(root)) {
        snprintf(err, errlen, "config %s: the top level must be a JSON object", path);
        json_decref(root);
        return -1;
    }
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        const struct opt_def *d = NULL;
        for (size_t i = 0; i < ndefs && !d; i++)
            if (defs[i].json_key && strcmp(defs[i].json_key, key) == 0)
                d = &defs[i];
        if (!d) {
            int extra = 0;
            for (size_t i = 0; extra_keys && extra_keys[i] && !extra; i++)
                extra = strcmp(extra_keys[i], key) == 0;
            if (extra)
                continue;
            snprintf(err, errlen, "config %s: unknown key '%s'", path, key);
            json_decref(root);
            return -1;
        }
        char text[64];
        const char *v = NULL;
        if (json_is_string(value))
            v = json_string_value(value);
        else if (json_is_integer(value))
            snprintf(text, sizeof(text), "%lld", (long long)json_integer_value(value)), v = text;
        else if (json_is_real(value))
            snprintf(text, sizeof(text), "%.17g", json_real_value(value)), v = text;
        if (!v) {
            snprintf(err, errlen, "config %s: key '%s' must be a string or a number", path, key);
            json_decref(root);
            return -1;
        }
        char source[200];
        snprintf(source, sizeof(source), "config %s: key '%s'", path, key);
        if (set_value(d, target, v, source, err, errlen) != 0) {
            json_decref(root);
            return -1;
        }
    }
    json_decref(root);
    return 0;
}

enum options_result options_parse(const struct opt_def *defs, size_t ndefs, void *target,
                                  int argc, char **argv, const char *prog, const char *summary,
                                  const char *config_option, const char *const *extra_json_keys,
                                  FILE *help_out, char *err, size_t errlen)
{
    char source[160];
    for (size_t i = 0; i < ndefs; i++) {
        if (!defs[i].def)
            continue;
        snprintf(source, sizeof(source), "default of --%s", defs[i].name);
        if (set_value(&defs[i], target, defs[i].def, source, err, errlen) != 0)
            return OPTIONS_ERROR;
    }
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--help") == 0 || strcmp(argv[a], "-h") == 0) {
            print_help(defs, ndefs, prog, summary, help_out);
            return OPTIONS_EXIT_OK;
        }
    }
    const char *config_path = config_option ? find_config_path(config_option, argc, argv) : NULL;
    if (config_path &&
        load_config(defs, ndefs, target, config_path, extra_json_keys, err, errlen) != 0)
        return OPTIONS_ERROR;
    for (size_t i = 0; i < ndefs; i++) {
        char env[128];
        env_name(defs[i].name, env, sizeof(env));
        const char *v = getenv(env);
        if (v && *v && set_value(&defs[i], target, v, env, err, errlen) != 0)
            return OPTIONS_ERROR;
    }
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            print_help(defs, ndefs, prog, summary, help_out);
            return OPTIONS_EXIT_OK;
        }
        if (strncmp(arg, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument '%s' (see --help)", arg);
            return OPTIONS_ERROR;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t namelen = eq ? (size_t)(eq - name) : strlen(name);
        const struct opt_def *d = NULL;
        for (size_t i = 0; i < ndefs; i++) {
            if (strlen(defs[i].name) == namelen && strncmp(defs[i].name, name, namelen) == 0) {
                d = &defs[i];
                break;
            }
        }
        if (!d) {
            snprintf(err, errlen, "unknown option '--%.*s' (see --help)", (int)namelen, name);
            return OPTIONS_ERROR;
        }
        const char *value = eq ? eq + 1 : NULL;
        if (!value) {
            if (a + 1 >= argc) {
                snprintf(err, errlen, "--%s: missing value", d->name);
                return OPTIONS_ERROR;
            }
            value = argv[++a];
        }
        snprintf(source, sizeof(source), "--%s", d->name);
        if (set_value(d, target, value, source, err, errlen) != 0)
            return OPTIONS_ERROR;
    }
    return OPTIONS_OK;
}

void options_free(const struct opt_def *defs, size_t ndefs, void *target)
{
    if (!target)
        return;
    for (size_t i = 0; i < ndefs; i++) {
        if (defs[i].type != OPT_STRING)
            continue;
        char **slot = (char **)(void *)((char *)target + defs[i].offset);
        thaw_free(*slot);
        *slot = NULL;
    }
}

int options_split_hostport(const char *s, char *host, size_t hostlen, int *port)
{
    const char *colon;
    const char *hstart = s;
    size_t hlen;
    if (*s == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':')
            return -1;
        hstart = s + 1;
        hlen = (size_t)(close - hstart);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon)
            return -1;
        hlen = (size_t)(colon - s);
    }
    if (hlen == 0 || hlen >= hostlen)
        return -1;
    char *end = NULL;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end != '\0' || p < 0 || p > 65535)
        return -1;
    memcpy(host, hstart, hlen);
    host[hlen] = '\0';
    *port = (int)p;
    return 0;
}
