/* Target scaler_request: protobuf decoding of each request message the scaler
 * accepts (ScaledObjectRef for IsActive/StreamIsActive/GetMetricSpec,
 * GetMetricsRequest, grpc.health.v1.HealthCheckRequest; protobuf-c code
 * generated from the .proto files in proto/) and what the handlers do with a
 * decoded request without the network: the steps of service.c resolve()
 * (static there, so repeated here with the same public calls: metadata_parse
 * on the decoded map, the redisKey prefix, the name/namespace bound,
 * scaler_state_upsert) and the reply each handler packs. The namespace
 * allow-list and the real resolve() run in the grpc_server target.
 *
 * Input: a sequence of requests, each [kind byte][length: 2 bytes BE][bytes]
 * (kind % 4: IsActive, GetMetricSpec, GetMetrics, Health; kind bit 2: the
 * default --redis-key-prefix is enforced), run against one scaler_state, so
 * successive requests for the same target (a changed ScaledObject) are
 * covered. A short last record takes what is left. Checks: an accepted spec
 * is sane; the target found is the one asked for; replies pack and decode.
 * Then the whole input again with an allocation failing. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>

#include "alloc.h"
#include "externalscaler.pb-c.h"
#include "fuzz.h"
#include "health.pb-c.h"
#include "metadata.h"
#include "policy.h"
#include "state.h"

/* The same allocator shape as service.c: protobuf-c through thaw_malloc. */
static void *pb_alloc(void *ud, size_t size)
{
    (void)ud;
    return thaw_malloc(size);
}
static void pb_free(void *ud, void *p)
{
    (void)ud;
    thaw_free(p);
}
static ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, NULL};

static bool checks; /* off during the allocation-failure pass */
static int64_t now_ms;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    return 0;
}

static void on_change(void *ud, struct target *t, const struct policy_decision *old,
                      const struct policy_decision *now)
{
    (void)ud;
    (void)t;
    (void)old;
    (void)now;
}

static void count_unknown(void *ud, const char *key)
{
    size_t *n = ud;
    (*n)++;
    FUZZ_CHECK(key != NULL, "unknown key NULL");
}

static bool plain_text(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return false;
    return true;
}

/* Packs msg, decodes it, packs again: both packings must match. Used on the
 * replies only: requests may hold what protobuf-c decodes but will not decode
 * once re-encoded (an overlong tag for field number 0), which matters to
 * nobody since requests are never re-encoded. */
static void check_roundtrip(const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *a = malloc(len ? len : 1);
    if (!a)
        return;
    size_t wrote = protobuf_c_message_pack(msg, a);
    FUZZ_CHECK(wrote == len, "packed %zu, predicted %zu", wrote, len);
    ProtobufCMessage *again = protobuf_c_message_unpack(msg->descriptor, &pb_allocator, len, a);
    if (!again) {
        FUZZ_CHECK(!checks, "a packed %s does not decode", msg->descriptor->name);
        free(a);
        return;
    }
    size_t len2 = protobuf_c_message_get_packed_size(again);
    uint8_t *b = malloc(len2 ? len2 : 1);
    if (b) {
        protobuf_c_message_pack(again, b);
        FUZZ_CHECK(len2 == len && memcmp(a, b, len) == 0, "%s: re-packing differs",
                   msg->descriptor->name);
    }
    free(b);
    free(a);
    protobuf_c_message_free_unpacked(again, &pb_allocator);
}

/* service.c resolve() without the call: NULL where it would finish the call
 * with INVALID_ARGUMENT or RESOURCE_EXHAUSTED. */
static struct target *resolve_like(struct scaler_state *st,
                                   const Externalscaler__ScaledObjectRef *ref, bool prefix)
{
    if (!ref)
        return NULL;
    size_t n = ref->n_scalermetadata;
    const char **keys = thaw_calloc(n ? n : 1, sizeof(*keys));
    const char **values = thaw_calloc(n ? n : 1, sizeof(*values));
    if (!keys || !values) {
        thaw_free(keys);
        thaw_free(values);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(ref->scalermetadata[i] && ref->scalermetadata[i]->key &&
                       ref->scalermetadata[i]->value,
                   "map entry %zu has NULL parts", i);
        keys[i] = ref->scalermetadata[i]->key;
        values[i] = ref->scalermetadata[i]->value;
    }
    struct scaler_spec spec;
    char err[256];
    memset(err, 0, sizeof(err));
    size_t unknown = 0;
    int rc = metadata_parse(keys, values, n, &spec, count_unknown, &unknown, err, sizeof(err));
    thaw_free(keys);
    thaw_free(values);
    if (rc != 0) {
        FUZZ_CHECK(err[0] != '\0' && strnlen(err, sizeof(err)) < sizeof(err),
                   "rejected without a reason");
        FUZZ_CHECK(spec.model == NULL && spec.redis_key == NULL && spec.redis_stream_group == NULL,
                   "a failed parse left something to free");
        return NULL;
    }
    FUZZ_CHECK(unknown <= n, "%zu unknown of %zu keys", unknown, n);
    /* thaw-scaler's default --redis-key-prefix. */
    static const char key_prefix[] = "thaw:queue:";
    if (prefix) {
        if (metadata_check_key_prefix(&spec, key_prefix, err, sizeof(err)) != 0) {
            FUZZ_CHECK(err[0] != '\0', "prefix refused without a reason");
            metadata_spec_finish(&spec);
            return NULL;
        }
        FUZZ_CHECK(strncmp(spec.redis_key, key_prefix, strlen(key_prefix)) == 0,
                   "redisKey '%s' passed the prefix check", spec.redis_key);
    }
    if (checks) {
        FUZZ_CHECK(spec.model && *spec.model && plain_text(spec.model), "bad model accepted");
        FUZZ_CHECK(strlen(spec.model) <= METADATA_MAX_VALUE, "model longer than the bound");
        FUZZ_CHECK(spec.redis_key && *spec.redis_key && plain_text(spec.redis_key),
                   "bad redisKey accepted");
        FUZZ_CHECK(!spec.redis_stream_group || plain_text(spec.redis_stream_group),
                   "bad group accepted");
        FUZZ_CHECK(spec.target_tokens_per_second > 0 && spec.target_queue_length > 0 &&
                       spec.activation_token_rate >= 0 && spec.activation_queue_length >= 0,
                   "out-of-range number accepted");
    }
    if (strlen(ref->namespace_) > METADATA_MAX_VALUE || strlen(ref->name) > METADATA_MAX_VALUE) {
        metadata_spec_finish(&spec);
        return NULL;
    }
    struct target *t = scaler_state_upsert(st, ref->namespace_, ref->name, &spec, now_ms);
    if (t && checks) {
        FUZZ_CHECK(metadata_spec_equal(target_spec(t), &spec), "target keeps another spec");
        /* Targets are keyed "ns/name/model"; Kubernetes names hold no '/',
         * and for those the key is unambiguous. */
        if (!strchr(ref->namespace_, '/') && !strchr(ref->name, '/'))
            FUZZ_CHECK(strcmp(target_namespace(t), ref->namespace_) == 0 &&
                           strcmp(target_name(t), ref->name) == 0,
                       "asked for %s/%s, got target %s/%s", ref->namespace_, ref->name,
                       target_namespace(t), target_name(t));
    }
    metadata_spec_finish(&spec);
    return t;
}

static void check_metric_name(const char *name)
{
    size_t len = strlen(name);
    FUZZ_CHECK(len <= 200 && strncmp(name, "thaw-", 5) == 0, "metric name '%s'", name);
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        FUZZ_CHECK((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-',
                   "metric name has '%c'", c);
    }
}

/* Packs a reply as the handlers do and decodes it back. */
static void check_reply(const ProtobufCMessage *resp) { check_roundtrip(resp); }

static void run_ref_request(struct scaler_state *st, int kind, bool prefix, const uint8_t *p,
                            size_t n)
{
    Externalscaler__ScaledObjectRef *ref =
        externalscaler__scaled_object_ref__unpack(&pb_allocator, n, p);
    if (!ref)
        return;
    struct target *t = resolve_like(st, ref, prefix);
    externalscaler__scaled_object_ref__free_unpacked(ref, &pb_allocator);
    if (!t)
        return;
    if (kind == 0) { /* IsActive / StreamIsActive's first message */
        const struct policy_decision *d = target_decision(t);
        (void)target_beyond_staleness(st, t, now_ms);
        Externalscaler__IsActiveResponse resp = EXTERNALSCALER__IS_ACTIVE_RESPONSE__INIT;
        resp.result = d->active;
        check_reply(&resp.base);
    } else { /* GetMetricSpec */
        char name[256];
        metadata_metric_name(target_spec(t)->model, name, sizeof(name));
        if (checks)
            check_metric_name(name);
/* clang also flags the deprecated fields inside protoc-c's INIT macros. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        Externalscaler__MetricSpec spec = EXTERNALSCALER__METRIC_SPEC__INIT;
#pragma GCC diagnostic pop
        Externalscaler__MetricSpec *specs[1] = {&spec};
        Externalscaler__GetMetricSpecResponse resp = EXTERNALSCALER__GET_METRIC_SPEC_RESPONSE__INIT;
        spec.metricname = name;
        spec.targetsizefloat = 1.0;
        resp.n_metricspecs = 1;
        resp.metricspecs = specs;
        check_reply(&resp.base);
    }
}

static void run_get_metrics(struct scaler_state *st, bool prefix, const uint8_t *p, size_t n)
{
    Externalscaler__GetMetricsRequest *req =
        externalscaler__get_metrics_request__unpack(&pb_allocator, n, p);
    if (!req)
        return;
    struct target *t = resolve_like(st, req->scaledobjectref, prefix);
    if (!t) {
        externalscaler__get_metrics_request__free_unpacked(req, &pb_allocator);
        return;
    }
    (void)target_beyond_staleness(st, t, now_ms);
    /* As handle_get_metrics: the requested name, bounded, or ours. */
    char name[256];
    if (req->metricname && *req->metricname) {
        snprintf(name, sizeof(name), "%s", req->metricname);
    } else {
        metadata_metric_name(target_spec(t)->model, name, sizeof(name));
        if (checks)
            check_metric_name(name);
    }
    externalscaler__get_metrics_request__free_unpacked(req, &pb_allocator);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    Externalscaler__MetricValue value = EXTERNALSCALER__METRIC_VALUE__INIT;
#pragma GCC diagnostic pop
    Externalscaler__MetricValue *values[1] = {&value};
    Externalscaler__GetMetricsResponse resp = EXTERNALSCALER__GET_METRICS_RESPONSE__INIT;
    long desired = target_decision(t)->desired;
    if (checks)
        FUZZ_CHECK(desired >= 0 && desired <= POLICY_MAX_REPLICAS, "desired %ld", desired);
    value.metricname = name;
    value.metricvaluefloat = (double)desired;
    resp.n_metricvalues = 1;
    resp.metricvalues = values;
    check_reply(&resp.base);
}

static void run_health(const uint8_t *p, size_t n)
{
    Grpc__Health__V1__HealthCheckRequest *req =
        grpc__health__v1__health_check_request__unpack(&pb_allocator, n, p);
    if (!req)
        return;
    FUZZ_CHECK(req->service != NULL, "service NULL");
    bool known = req->service[0] == '\0' ||
                 strcmp(req->service, "externalscaler.ExternalScaler") == 0;
    (void)known;
    grpc__health__v1__health_check_request__free_unpacked(req, &pb_allocator);
}

static void run(const uint8_t *data, size_t size, bool with_checks)
{
    checks = with_checks;
    struct scaler_state_config cfg = {.staleness_limit_ms = 60000,
                                      .scale_down_window_ms = 300000,
                                      .bursty_scale_down_window_ms = 300000,
                                      .wake_hold_ms = 5000,
                                      .target_expiry_ms = 3600000};
    now_ms = 1000000;
    struct scaler_state *st = scaler_state_new(&cfg, now_ms, on_change, NULL);
    if (!st) {
        FUZZ_CHECK(!checks, "scaler_state_new failed");
        return;
    }
    size_t off = 0;
    for (int i = 0; i < 32 && off < size; i++) {
        int kind = data[off] % 4;
        bool prefix = (data[off++] >> 2) & 1; /* --redis-key-prefix enforced */
        size_t n = 0;
        if (off + 2 <= size) {
            n = ((size_t)data[off] << 8) | data[off + 1];
            off += 2;
        } else {
            off = size;
        }
        if (n > size - off)
            n = size - off;
        /* A private copy of exactly n bytes: reads past it are caught. */
        uint8_t *msg = malloc(n ? n : 1);
        if (!msg)
            break;
        if (n)
            memcpy(msg, data + off, n);
        off += n;
        switch (kind) {
        case 0:
        case 1: run_ref_request(st, kind, prefix, msg, n); break;
        case 2: run_get_metrics(st, prefix, msg, n); break;
        default: run_health(msg, n); break;
        }
        free(msg);
        now_ms += 1000;
        scaler_state_tick(st, now_ms);
    }
    scaler_state_gc(st, now_ms);
    scaler_state_free(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_run_with_oom(run, data, size);
    return 0;
}
