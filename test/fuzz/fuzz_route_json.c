/* Target route_json: how the activator finds the model of a request
 * (activator/route.c): route_json_scan on a request body (or the bounded
 * prefix the proxy buffers), the lookup of the name found (route_table_lookup
 * and route_by_name must agree, as the header promises), route_by_host on a
 * Host value, and route_glob against a slow reference matcher.
 *
 * Input: the body. Checks, beyond "no crash": a prefix of the body never
 * contradicts the whole body (a prefix that finds a model finds the same
 * one or the whole body is invalid; a prefix that is invalid or complete
 * without a model stays so), and the two lookups return the same model. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "alloc.h"
#include "config.h"
#include "fuzz.h"
#include "route.h"

static const char config_text[] =
    "{\"models\": ["
    " {\"name\": \"m1\", \"backend\": \"http://127.0.0.1:1\","
    "  \"aliases\": [\"m1-alias\", \"m1-lora-*\"], \"hosts\": [\"m1.example.com\", \"*.m1.test\"]},"
    " {\"name\": \"llama-3-8b\", \"backend\": \"http://127.0.0.1:2\","
    "  \"aliases\": [\"llama*\", \"*-instruct\", \"a*b*c\"], \"hosts\": [\"api.*.internal\"]},"
    " {\"name\": \"m3\", \"endpointsFile\": \"/nonexistent\", \"aliases\": [\"m1-alias\", \"m3\"],"
    "  \"hosts\": [\"[::1]\", \"M3.Example.COM\"]}"
    "]}";

static struct config *cfg;
static struct route_table *table;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    fuzz_jansson_no_oom();
    char err[256];
    cfg = config_parse(config_text, strlen(config_text), err, sizeof(err));
    if (!cfg)
        fuzz_fail(__FILE__, __LINE__, "fixed config does not parse: %s", err);
    table = route_table_new(cfg);
    if (!table)
        fuzz_fail(__FILE__, __LINE__, "route_table_new failed");
    return 0;
}

static char fold(char c, bool nocase)
{
    return (nocase && c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
}

/* Reference glob: dynamic programming over (pattern, string) prefixes. */
static bool ref_glob(const char *pat, const char *s, size_t slen, bool nocase)
{
    size_t plen = strlen(pat);
    bool *prev = calloc(slen + 1, sizeof(bool)), *cur = calloc(slen + 1, sizeof(bool));
    if (!prev || !cur) {
        free(prev);
        free(cur);
        return route_glob(pat, s, slen, nocase); /* no reference: agree */
    }
    prev[0] = true; /* empty pattern matches empty string */
    for (size_t i = 1; i <= plen; i++) {
        char p = pat[i - 1];
        cur[0] = prev[0] && p == '*';
        for (size_t j = 1; j <= slen; j++) {
            if (p == '*')
                cur[j] = prev[j] || cur[j - 1];
            else
                cur[j] = prev[j - 1] && fold(p, nocase) == fold(s[j - 1], nocase);
        }
        bool *t = prev;
        prev = cur;
        cur = t;
    }
    bool r = prev[slen];
    free(prev);
    free(cur);
    return r;
}

static void check_lookup(const char *name)
{
    int a = route_table_lookup(table, name);
    int b = route_by_name(cfg, name, strlen(name));
    FUZZ_CHECK(a == b, "route_table_lookup %d, route_by_name %d for '%s'", a, b, name);
    FUZZ_CHECK(a >= -1 && a < (int)cfg->nmodels, "index %d", a);
}

static void check_prefix(const char *body, size_t len, size_t plen, enum route_json_result full,
                         const struct route_json_info *fi)
{
    struct route_json_info pi;
    enum route_json_result pr = route_json_scan(body, plen, &pi);
    if (full == ROUTE_JSON_FOUND)
        FUZZ_CHECK(pr == ROUTE_JSON_MORE ||
                       (pr == ROUTE_JSON_FOUND && strcmp(pi.model, fi->model) == 0),
                   "prefix %zu/%zu gives %d, whole body found '%s'", plen, len, (int)pr,
                   fi->model);
    if (pr == ROUTE_JSON_FOUND)
        FUZZ_CHECK(full == ROUTE_JSON_INVALID ||
                       (full == ROUTE_JSON_FOUND && strcmp(pi.model, fi->model) == 0),
                   "prefix %zu/%zu found '%s', whole body gives %d", plen, len, pi.model,
                   (int)full);
    if (pr == ROUTE_JSON_INVALID || pr == ROUTE_JSON_ABSENT)
        FUZZ_CHECK(full == pr, "prefix %zu/%zu gives %d, whole body %d", plen, len, (int)pr,
                   (int)full);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *body = malloc(size ? size : 1);
    if (!body)
        return 0;
    if (size)
        memcpy(body, data, size);
    struct route_json_info info;
    memset(&info, 0xAA, sizeof(info));
    enum route_json_result r = route_json_scan(body, size, &info);
    FUZZ_CHECK(r == ROUTE_JSON_FOUND || r == ROUTE_JSON_ABSENT || r == ROUTE_JSON_MORE ||
                   r == ROUTE_JSON_INVALID,
               "result %d", (int)r);
    FUZZ_CHECK(memchr(info.model, '\0', sizeof(info.model)) != NULL, "model not terminated");
    if (r == ROUTE_JSON_FOUND)
        check_lookup(info.model);
    if (info.stream)
        FUZZ_CHECK(info.stream_seen, "stream true but not seen");

    /* Prefixes: all of them for short bodies, a sample for long ones. */
    struct fuzz_rng rng;
    fuzz_rng_seed(&rng, data, size);
    if (size <= 96) {
        for (size_t p = 0; p < size; p++)
            check_prefix(body, size, p, r, &info);
    } else {
        for (int k = 0; k < 32; k++)
            check_prefix(body, size, fuzz_rng_next(&rng) % size, r, &info);
    }

    /* The body as a Host header value and as a name. */
    int h = route_by_host(cfg, body, size);
    FUZZ_CHECK(h >= -1 && h < (int)cfg->nmodels, "host index %d", h);
    char *name = fuzz_strndup(data, size < 300 ? size : 300);
    if (name) {
        check_lookup(name);
        /* Glob: pattern up to the first '\n', subject after it. */
        char *nl = strchr(name, '\n');
        if (nl && strlen(name) <= 64) {
            *nl = '\0';
            const char *subject = nl + 1;
            size_t slen = strlen(subject);
            for (int nocase = 0; nocase < 2; nocase++)
                FUZZ_CHECK(route_glob(name, subject, slen, nocase) ==
                               ref_glob(name, subject, slen, nocase),
                           "route_glob('%s', '%s', nocase=%d) disagrees with the reference",
                           name, subject, nocase);
        }
        free(name);
    }
    free(body);
    return 0;
}
