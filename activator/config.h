/* config: the activator's JSON configuration file, loaded into plain structs.
 *
 *   {"limits": {...}, "defaults": {<model fields>}, "apiKeyTiers": {"KEY": "high"},
 *    "models": [{"name": "m1", "backend": "http://127.0.0.1:8001", ...}]}
 *
 * Model fields and limits are table-driven (one row per field with its JSON
 * name, type, bounds and target), so every field is validated the same way
 * and errors name the field: "models[1].holdTimeoutSeconds: expected a number
 * in 0.001..86400". Unknown fields are errors too (typos must not pass). */
#ifndef THAW_ACT_CONFIG_H
#define THAW_ACT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

enum tier { TIER_HIGH = 0, TIER_NORMAL = 1, TIER_LOW = 2 };
#define TIER_COUNT 3

/* "high", "normal", "low"; -1 if unknown. */
int tier_parse(const char *s, size_t len);
const char *tier_to_str(enum tier t);

struct model_config {
    char *name;
    char *backend;        /* "http://host:port" or NULL */
    char *backend_host;   /* parsed from backend */
    int backend_port;
    char *endpoints_file; /* or NULL; exactly one of backend / endpoints_file */
    char *health_path;
    char **aliases; /* may hold '*' globs */
    size_t naliases;
    char **hosts;   /* Host header values (port ignored), may hold '*' globs */
    size_t nhosts;
    char **wake_with; /* model names woken together with this one */
    size_t nwake_with;
    long max_held_requests;
    long max_held_bytes;
    long hold_timeout_ms;
    long max_concurrency_per_endpoint; /* 0: no cap */
    long split_concurrency; /* 1: the cap is shared by the live activators (peers) */
    long late_after_ms; /* waiting longer than this: behind newer requests (0: FIFO) */
    /* While the model is not ready, a request held fallback_after_ms goes to
     * this backend instead ("http://host:port"), or NULL: no fallback. */
    char *fallback_backend;
    char *fallback_host; /* parsed from fallback_backend */
    int fallback_port;
    long fallback_after_ms;
    long sse_heartbeat_ms;             /* 0: off */
    long probe_initial_ms;
    long probe_max_ms;
    long probe_timeout_ms;
    long dns_refresh_ms;
    long dns_refresh_waking_ms; /* while nothing is healthy and the model waits */
    long response_header_timeout_ms; /* request sent -> response head */
    long response_idle_timeout_ms;   /* between response body reads */
};

struct limits_config {
    long max_header_bytes;
    long max_headers;
    long max_body_bytes;
    long route_body_bytes; /* body prefix buffered to find "model" */
    long header_timeout_ms;
    long body_idle_timeout_ms; /* forwarded request body: no progress this long */
    long idle_timeout_ms;
    long drain_timeout_ms;
    long connect_timeout_ms;
    long upstream_idle_ms;      /* pooled connection kept this long */
    long max_idle_per_endpoint; /* pooled connections kept per endpoint */
    long retry_after_seconds;
    long buffer_bytes; /* per-direction buffering before backpressure */
    long send_timeout_ms; /* a client that takes no response byte this long is closed */
    /* Lingering close (nginx's lingering_*): after an early error response,
     * input is read and discarded until the client closes, no data for
     * lingering_timeout_ms (0: no lingering), lingering_time_ms in all, or
     * lingering_max_bytes, by at most max_lingering connections at once. */
    long lingering_timeout_ms;
    long lingering_time_ms;
    long lingering_max_bytes;
    long max_lingering;
};

struct api_key_tier {
    char *key;
    enum tier tier;
};

struct config {
    struct model_config *models;
    size_t nmodels;
    struct limits_config limits;
    struct api_key_tier *api_keys;
    size_t napi_keys;
};

/* Parses a config from text. Returns NULL with err filled ("field: why"). */
struct config *config_parse(const char *text, size_t len, char *err, size_t errlen);
/* Reads and parses a file; err names the file on I/O errors. */
struct config *config_load(const char *path, char *err, size_t errlen);
/* Accepts NULL. */
void config_free(struct config *cfg);

/* Index of the model named name, or -1. */
int config_model_index(const struct config *cfg, const char *name);

/* Splits "http://host:port" (port defaults to 80; IPv6 as [addr]); no path
 * other than "/" allowed. Returns 0 or -1. host is copied into hostbuf. */
int config_parse_backend_url(const char *url, char *hostbuf, size_t hostlen, int *port);

#endif
