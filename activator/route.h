/* route: which model a request is for. Pure functions, no I/O.
 *
 * 1. The "model" member of a JSON request body (OpenAI-compatible APIs). The
 *    body may be only a prefix (the proxy buffers a bounded start of it), so
 *    the scanner works on truncated input and says when it needs more.
 * 2. Otherwise the Host header against each model's "hosts".
 * Names match a model's name exactly, then its aliases, which may hold '*'
 * globs (e.g. "m1-lora-*"); the first model in config order wins. */
#ifndef THAW_ROUTE_H
#define THAW_ROUTE_H

#include <stdbool.h>
#include <stddef.h>

#include "model_name.h"

struct config;

enum route_json_result {
    ROUTE_JSON_FOUND = 1,     /* model copied out */
    ROUTE_JSON_ABSENT = 0,    /* a complete object without a string "model" */
    ROUTE_JSON_MORE = -1,     /* the input ends before "model" was seen */
    ROUTE_JSON_INVALID = -2,  /* not a JSON object, or "model" not a short string */
};

struct route_json_info {
    char model[MODEL_NAME_MAX + 1];
    bool stream;      /* "stream": true seen (before the scan stopped) */
    bool stream_seen; /* the "stream" member was seen */
};

/* Scans body[0..len) as the start of a JSON object for its top-level "model"
 * (a string, unescaped, at most 255 bytes) and "stream" (a boolean). Stops as
 * soon as both are known or the object ends. */
enum route_json_result route_json_scan(const char *body, size_t len, struct route_json_info *out);

/* '*' matches any run of characters (also empty); everything else literally.
 * nocase: ASCII case-insensitive (host names). */
bool route_glob(const char *pattern, const char *s, size_t slen, bool nocase);

/* Model index for a model name or alias, or -1. */
int route_by_name(const struct config *cfg, const char *name, size_t len);

/* The same lookup in O(1) for names and exact aliases: a hash index built
 * from cfg (which must outlive it); glob aliases are still tried in order. */
struct route_table;
struct route_table *route_table_new(const struct config *cfg);
/* Accepts NULL. */
void route_table_free(struct route_table *t);
/* Same answer as route_by_name. name is NUL-terminated. */
int route_table_lookup(const struct route_table *t, const char *name);

/* Model index for a Host header value (a ":port" suffix is ignored), or -1. */
int route_by_host(const struct config *cfg, const char *host, size_t len);

#endif
