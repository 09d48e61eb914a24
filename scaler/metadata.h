/* metadata: a ScaledObject trigger's `metadata` map (KEDA's scalerMetadata)
 * turned into a validated scaling spec. Pure: no I/O, no globals.
 *
 * Keys (documented in README):
 *   model (required), targetTokensPerSecond (1000), targetQueueLength (10),
 *   redisKey (thaw:queue:<model>), redisStreamGroup (none),
 *   activationTokenRate (0), activationQueueLength (0),
 *   policy ("v2" or "v1"), idleSignal ("tokenRate" or "activators": idle
 *   when the activators carry no request; only when every request passes
 *   through them), scaleDownWindowSeconds and
 *   burstyScaleDownWindowSeconds (the scaler's flags; v2 only), and the
 *   policy v2 knobs (coldStartSeconds, targetUtilisation, ...: the table in
 *   metadata.c; their defaults are policy_params_defaults()).
 * KEDA's own keys (scalerAddress, enableTLS, unsafeSsl, caCert, tlsClientCert,
 * tlsClientKey, tlsCertFile) are accepted and ignored. */
#ifndef THAW_METADATA_H
#define THAW_METADATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policy.h"

#define METADATA_MAX_VALUE 1024 /* bytes per value; longer is INVALID_ARGUMENT */
#define METADATA_MAX_KEY 256    /* bytes per key; longer is INVALID_ARGUMENT */

struct scaler_spec {
    char *model;
    double target_tokens_per_second;
    double target_queue_length;
    char *redis_key;
    char *redis_stream_group; /* NULL when unset */
    double activation_token_rate;
    double activation_queue_length;
    bool policy_v1;               /* policy: v1 (the v2 knobs below unused) */
    int64_t scale_down_window_ms; /* -1: the scaler's --scale-down-stabilization */
    int64_t bursty_scale_down_window_ms; /* -1: the scaler's
                                          * --bursty-scale-down-stabilization */
    /* v2 knobs: policy_params_defaults() overridden by the keys given; the
     * four fields above are the authority for their own values. */
    struct policy_params policy;
};

/* The policy parameters spec asks for, given the scaler's default scale-down
 * windows (steady and bursty demand). */
void metadata_policy_params(const struct scaler_spec *spec, int64_t default_scale_down_ms,
                            int64_t default_bursty_scale_down_ms, struct policy_params *out);

/* Called for each key neither Thaw's nor KEDA's (so the caller can log it once). */
typedef void (*metadata_unknown_fn)(void *ud, const char *key);

/* Fills spec (caller storage) from n key/value pairs. Returns 0, or -1 with
 * err naming the key, e.g. "metadata key 'model' is required",
 * "metadata key 'targetTokensPerSecond': expected a number > 0, got 'abc'".
 * On failure spec holds nothing to free. */
int metadata_parse(const char *const *keys, const char *const *values, size_t n,
                   struct scaler_spec *spec, metadata_unknown_fn unknown, void *ud, char *err,
                   size_t errlen);
void metadata_spec_finish(struct scaler_spec *spec);
/* Deep copy into dst (caller storage). Returns 0, or -1 on OOM with dst empty. */
int metadata_spec_copy(struct scaler_spec *dst, const struct scaler_spec *src);

/* Tenant limits set by the operator: a ScaledObject's redisKey must start
 * with key_prefix ("" allows any key). Returns 0, or -1 with err naming the
 * key. The default key thaw:queue:<model> passes the default prefix. */
int metadata_check_key_prefix(const struct scaler_spec *spec, const char *key_prefix, char *err,
                              size_t errlen);

/* True when both specs decide the same way (every field equal). */
int metadata_spec_equal(const struct scaler_spec *a, const struct scaler_spec *b);

/* The metric name reported to KEDA: "thaw-" + model with characters outside
 * [a-z0-9-] turned into '-', lower-cased, at most 200 bytes. */
void metadata_metric_name(const char *model, char *out, size_t outlen);

#endif
