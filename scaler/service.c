#include "service.h"

#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>
#include <protobuf-c/protobuf-c.h>

#include "alloc.h"
#include "clock.h"
#include "expo.h"
#include "externalscaler.pb-c.h"
#include "grpc_frame.h"
#include "grpc_server.h"
#include "health.pb-c.h"
#include "log.h"
#include "metadata.h"
#include "state.h"
#include "strmap.h"
#include "utf8.h"

#define MAX_UNKNOWN_KEYS_REMEMBERED 1000

enum method_index {
    M_IS_ACTIVE = 0,
    M_STREAM_IS_ACTIVE,
    M_GET_METRIC_SPEC,
    M_GET_METRICS,
    M_HEALTH_CHECK,
    M_COUNT
};

/* One open StreamIsActive call, listed under its model. */
struct stream_sub {
    struct scaler_service *svc;
    struct grpc_call *call;
    struct target *target;
    struct stream_sub *prev, *next;
    bool last_sent_active; /* what the last message on this stream said */
    int64_t last_sent_ms;  /* and when (monotonic ms) */
};

/* Default of scaler_service_set_wake_repeat. A wake repeats `true` on a
 * stream that already said it at most this often: every activator renews its
 * wakes, and KEDA calls RequestScale for each message under the
 * ScaledObject's lock, so N activators must not mean N calls a second.
 * KEDA's HTTP add-on re-sends every 200 ms; once a second is enough, since a
 * `true` already sent is acted on at once. */
#define WAKE_REPEAT_DEFAULT_MS 1000

struct sub_list {
    struct stream_sub *head;
};

/* An IsActive or GetMetrics call for a target still awaiting its first
 * reading (target_awaiting_data), answered when that comes or at its
 * deadline. */
struct pending_call {
    struct scaler_service *svc;
    struct grpc_call *call;
    struct target *target;
    bool get_metrics; /* else IsActive */
    char metric_name[256];
    int64_t deadline_ms;
    struct pending_call *prev, *next;
};

/* How long a call waits for a new target's first reading. The sources are
 * read at once for a new target, so this is reached only when one is slow
 * or down; KEDA then sees UNAVAILABLE and keeps the replicas. */
#define PENDING_WAIT_MS 2000
/* Calls waiting at once, beyond which the rest get UNAVAILABLE at once. */
#define PENDING_MAX 10000

struct scaler_service {
    struct scaler_state *st;
    struct grpc_method methods[M_COUNT];
    struct strmap *subs_by_model; /* model -> sub_list */
    struct strmap *unknown_keys;  /* logged once each */
    char *redis_key_prefix;       /* "" = any key */
    struct strmap *namespaces;    /* allow-list; NULL = all */
    size_t nstreams;
    bool serving;
    bool in_wake; /* pushes during a wake are done once, by the wake itself */
    uint64_t pushes_change;
    uint64_t pushes_wake;
    uint64_t pushes_coalesced;
    int64_t wake_repeat_ms;
    uint64_t push_failures;
    struct pending_call *pending; /* doubly linked */
    size_t npending;
    uint64_t calls_wait_answered, calls_wait_expired;
};

/* protobuf-c allocates through our wrapper too, so OOM paths are testable. */
static void *pb_alloc(void *ud, size_t size) { return thaw_malloc(size); }
static void pb_free(void *ud, void *p) { thaw_free(p); }
static ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, NULL};

/* ---- helpers ---------------------------------------------------------- */

/* Returns 0, or -1 when the message could not be queued (out of memory or a
 * peer that stopped reading); the caller decides how to end the call. */
static int send_packed(struct grpc_call *call, const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t stackbuf[512];
    uint8_t *buf = len <= sizeof(stackbuf) ? stackbuf : thaw_malloc(len);
    if (!buf)
        return -1;
    protobuf_c_message_pack(msg, buf);
    int rc = grpc_call_send(call, buf, len);
    if (buf != stackbuf)
        thaw_free(buf);
    return rc;
}

/* Unary calls: one message, then OK. */
static void reply_unary(struct grpc_call *call, const ProtobufCMessage *msg)
{
    if (send_packed(call, msg) != 0)
        grpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "could not queue the response");
    else
        grpc_call_finish(call, GRPC_STATUS_OK, NULL);
}

static void log_unknown_key(void *ud, const char *key)
{
    struct scaler_service *svc = ud;
    if (strmap_get(svc->unknown_keys, key) ||
        strmap_count(svc->unknown_keys) >= MAX_UNKNOWN_KEYS_REMEMBERED)
        return;
    if (strmap_put(svc->unknown_keys, key, svc) == 0) {
        char q[200];
        LOG_WARN("metadata_unknown_key", "key=%s note=\"ignored; logged once\"",
                 log_quote(q, sizeof(q), key));
    }
}

/* Parses the ref's metadata and finds its target; finishes the call with the
 * right status on failure and returns NULL. */
static struct target *resolve(struct scaler_service *svc, struct grpc_call *call,
                              const Externalscaler__ScaledObjectRef *ref)
{
    if (!ref) {
        grpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT, "scaledObjectRef is required");
        return NULL;
    }
    if (!utf8_valid(ref->namespace_, strlen(ref->namespace_)) ||
        !utf8_valid(ref->name, strlen(ref->name))) {
        grpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                         "scaledObjectRef name or namespace is not valid UTF-8");
        return NULL;
    }
    if (svc->namespaces && !strmap_get(svc->namespaces, ref->namespace_)) {
        char msg[300];
        snprintf(msg, sizeof(msg), "namespace '%.200s' is not allowed to use this scaler",
                 ref->namespace_);
        grpc_call_finish(call, GRPC_STATUS_PERMISSION_DENIED, msg);
        return NULL;
    }
    size_t n = ref->n_scalermetadata;
    /* KEDA sends a handful of keys: no allocation on the hot path for them. */
    const char *small_keys[32] = {0}, *small_values[32] = {0};
    const char **keys = n <= 32 ? small_keys : thaw_calloc(n, sizeof(*keys));
    const char **values = n <= 32 ? small_values : thaw_calloc(n, sizeof(*values));
    if (!keys || !values) {
        if (keys != small_keys)
            thaw_free(keys);
        if (values != small_values)
            thaw_free(values);
        grpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        keys[i] = ref->scalermetadata[i]->key;
        values[i] = ref->scalermetadata[i]->value;
    }
    struct scaler_spec spec;
    char err[256];
    int rc = metadata_parse(keys, values, n, &spec, log_unknown_key, svc, err, sizeof(err));
    if (keys != small_keys)
        thaw_free(keys);
    if (values != small_values)
        thaw_free(values);
    if (rc == 0 && metadata_check_key_prefix(&spec, svc->redis_key_prefix, err, sizeof(err)) != 0) {
        metadata_spec_finish(&spec);
        rc = -1;
    }
    if (rc != 0) {
        grpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT, err);
        return NULL;
    }
    if (strlen(ref->namespace_) > METADATA_MAX_VALUE || strlen(ref->name) > METADATA_MAX_VALUE) {
        metadata_spec_finish(&spec);
        grpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT, "name or namespace too long");
        return NULL;
    }
    /* A target is namespace/name/model: a '/' in the first two would let two
     * ScaledObjects share one (a/b + m and a + b/m), and Kubernetes names
     * never hold one, nor are empty. */
    if (!*ref->namespace_ || !*ref->name || strchr(ref->namespace_, '/') ||
        strchr(ref->name, '/')) {
        metadata_spec_finish(&spec);
        grpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                         "scaledObjectRef name and namespace must be non-empty and hold no '/'");
        return NULL;
    }
    struct target *t = scaler_state_upsert(svc->st, ref->namespace_, ref->name, &spec,
                                           clock_mono_ms());
    metadata_spec_finish(&spec);
    if (!t && scaler_state_full(svc->st)) {
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "the scaler keeps %zu ScaledObjects already, its --max-targets; raise it",
                 scaler_state_target_count(svc->st));
        grpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
        return NULL;
    }
    if (!t)
        grpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return t;
}

/* A varint at *p (before end); false if cut off or over 10 bytes. */
static bool pb_varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false;
}

/* True unless a string field of desc (or of a message in it, maps
 * included) holds a NUL byte. protobuf-c hands strings over as C strings,
 * so "5\0junk" would read as 5 and the models "a\0one" and "a\0two" as one
 * model "a". Malformed input passes here: the unpack refuses it. */
static bool pb_strings_without_nul(const uint8_t *msg, size_t len,
                                   const ProtobufCMessageDescriptor *desc, int depth)
{
    const uint8_t *p = msg, *end = msg + len;
    if (depth > 8)
        return true;
    while (p < end) {
        uint64_t tag, n;
        if (!pb_varint(&p, end, &tag))
            return true;
        switch (tag & 7) {
        case 0:
            if (!pb_varint(&p, end, &n))
                return true;
            break;
        case 1:
            if (end - p < 8)
                return true;
            p += 8;
            break;
        case 5:
            if (end - p < 4)
                return true;
            p += 4;
            break;
        case 2: {
            if (!pb_varint(&p, end, &n) || n > (uint64_t)(end - p))
                return true;
            const ProtobufCFieldDescriptor *f =
                tag >> 3 <= UINT32_MAX
                    ? protobuf_c_message_descriptor_get_field(desc, (unsigned)(tag >> 3))
                    : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)n))
                return false;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
                !pb_strings_without_nul(p, (size_t)n, f->descriptor, depth + 1))
                return false;
            p += n;
            break;
        }
        default:
            return true;
        }
    }
    return true;
}

/* Finishes the call with INVALID_ARGUMENT and returns true if a string in
 * msg (a desc) holds a NUL byte. */
static bool refuse_nul_strings(struct grpc_call *call, const uint8_t *msg, size_t len,
                               const ProtobufCMessageDescriptor *desc)
{
    if (pb_strings_without_nul(msg, len, desc, 0))
        return false;
    grpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT, "a string in the request holds a NUL byte");
    return true;
}

static Externalscaler__ScaledObjectRef *unpack_ref(struct grpc_call *call, const uint8_t *msg,
                                                   size_t len)
{
    if (refuse_nul_strings(call, msg, len, &externalscaler__scaled_object_ref__descriptor))
        return NULL;
    Externalscaler__ScaledObjectRef *ref =
        externalscaler__scaled_object_ref__unpack(&pb_allocator, len, msg);
    if (!ref)
        grpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                         "request is not a valid externalscaler.ScaledObjectRef");
    return ref;
}

/* The three RPCs that take a bare ScaledObjectRef: decode it and find its
 * target, or finish the call with the right status and return NULL. */
static struct target *resolve_ref_message(struct scaler_service *svc, struct grpc_call *call,
                                          const uint8_t *msg, size_t len)
{
    Externalscaler__ScaledObjectRef *ref = unpack_ref(call, msg, len);
    if (!ref)
        return NULL;
    struct target *t = resolve(svc, call, ref);
    externalscaler__scaled_object_ref__free_unpacked(ref, &pb_allocator);
    return t;
}

static int send_active(struct grpc_call *call, bool active)
{
    Externalscaler__IsActiveResponse resp = EXTERNALSCALER__IS_ACTIVE_RESPONSE__INIT;
    resp.result = active;
    return send_packed(call, &resp.base);
}

/* send_active on a stream, remembering what it said last. */
static int stream_send(struct stream_sub *s, bool active, int64_t now_ms)
{
    if (send_active(s->call, active) != 0)
        return -1;
    s->last_sent_active = active;
    s->last_sent_ms = now_ms;
    return 0;
}

/* ---- handlers --------------------------------------------------------- */

#define AWAITING_MESSAGE                                                                  \
    "no reading of the signal sources yet since this ScaledObject (or the scaler) started; " \
    "refusing to guess"

static void answer_is_active(struct scaler_service *svc, struct grpc_call *call,
                             struct target *t)
{
    const struct policy_decision *d = target_decision(t);
    /* An inactive answer built on data older than the limit could scale a
     * busy model to zero; an error makes KEDA keep the replicas instead. */
    if (!d->active && target_beyond_staleness(svc->st, t, clock_mono_ms())) {
        grpc_call_finish(call, GRPC_STATUS_UNAVAILABLE,
                         "signal sources are stale beyond the limit; refusing to report "
                         "inactive");
        return;
    }
    if (!d->active && target_awaiting_data(t)) {
        grpc_call_finish(call, GRPC_STATUS_UNAVAILABLE, AWAITING_MESSAGE);
        return;
    }
    Externalscaler__IsActiveResponse resp = EXTERNALSCALER__IS_ACTIVE_RESPONSE__INIT;
    resp.result = d->active;
    reply_unary(call, &resp.base);
}

static void answer_get_metrics(struct scaler_service *svc, struct grpc_call *call,
                               struct target *t, const char *name)
{
    if (target_beyond_staleness(svc->st, t, clock_mono_ms())) {
        /* KEDA's `fallback` replicas apply on errors. */
        grpc_call_finish(call, GRPC_STATUS_UNAVAILABLE,
                         "signal sources are stale beyond the staleness limit");
        return;
    }
    /* Even an active target: a count from the held requests alone, with the
     * token rate unknown, could be far below the replicas a busy model has. */
    if (target_awaiting_data(t)) {
        grpc_call_finish(call, GRPC_STATUS_UNAVAILABLE, AWAITING_MESSAGE);
        return;
    }
    long desired = target_decision(t)->desired;
    /* As in GetMetricSpec: the INIT macro fills the deprecated metricValue field. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    Externalscaler__MetricValue value = EXTERNALSCALER__METRIC_VALUE__INIT;
#pragma GCC diagnostic pop
    Externalscaler__MetricValue *values[1] = {&value};
    Externalscaler__GetMetricsResponse resp = EXTERNALSCALER__GET_METRICS_RESPONSE__INIT;
    value.metricname = (char *)name;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    value.metricvalue = desired;
#pragma GCC diagnostic pop
    value.metricvaluefloat = (double)desired;
    resp.n_metricvalues = 1;
    resp.metricvalues = values;
    reply_unary(call, &resp.base);
}

static void pending_unlink(struct pending_call *p)
{
    struct scaler_service *svc = p->svc;
    if (p->prev)
        p->prev->next = p->next;
    else
        svc->pending = p->next;
    if (p->next)
        p->next->prev = p->prev;
    svc->npending--;
    target_unref(p->target);
    thaw_free(p);
}

static void pending_cancelled(void *ud, struct grpc_call *call)
{
    (void)call;
    pending_unlink(ud);
}

static void pending_answer(struct pending_call *p)
{
    struct scaler_service *svc = p->svc;
    struct grpc_call *call = p->call;
    struct target *t = p->target;
    char name[sizeof(p->metric_name)];
    bool get_metrics = p->get_metrics;
    memcpy(name, p->metric_name, sizeof(name));
    grpc_call_set_cancel(call, NULL, NULL);
    pending_unlink(p);
    if (get_metrics)
        answer_get_metrics(svc, call, t, name);
    else
        answer_is_active(svc, call, t);
}

/* Answers now if the target has had its first reading; else the call waits
 * for it (scaler_service_on_fresh) or for PENDING_WAIT_MS. A restarted scaler
 * or a new ScaledObject would otherwise report a busy model as idle. */
static void answer_or_wait(struct scaler_service *svc, struct grpc_call *call, struct target *t,
                           const char *metric_name)
{
    bool get_metrics = metric_name != NULL;
    /* Not while a source is failing: the reading would not come in time;
     * nor once every source answered without a reading (a NaN series); nor
     * while shutting down (the waits were answered, and nothing would end a
     * new one). */
    bool must_wait = svc->serving && target_first_read_due(t) &&
                     (get_metrics || !target_decision(t)->active) &&
                     !scaler_state_source_failing(svc->st);
    struct pending_call *p = NULL;
    if (must_wait && svc->npending < PENDING_MAX)
        p = thaw_calloc(1, sizeof(*p));
    if (!p) {
        if (get_metrics)
            answer_get_metrics(svc, call, t, metric_name);
        else
            answer_is_active(svc, call, t);
        return;
    }
    p->svc = svc;
    p->call = call;
    p->target = t;
    p->get_metrics = get_metrics;
    if (get_metrics)
        snprintf(p->metric_name, sizeof(p->metric_name), "%s", metric_name);
    p->deadline_ms = clock_mono_ms() + PENDING_WAIT_MS;
    p->next = svc->pending;
    if (p->next)
        p->next->prev = p;
    svc->pending = p;
    svc->npending++;
    target_ref(t);
    grpc_call_set_cancel(call, pending_cancelled, p);
}

/* Answers the calls waiting on target t (only its IsActive calls if
 * is_active_only). */
static void pending_answer_target(struct scaler_service *svc, struct target *t,
                                  bool is_active_only)
{
    struct pending_call *p = svc->pending;
    while (p) {
        struct pending_call *next = p->next;
        if (p->target == t && !(is_active_only && p->get_metrics)) {
            svc->calls_wait_answered++;
            pending_answer(p);
        }
        p = next;
    }
}

void scaler_service_on_fresh(void *ud, struct target *t)
{
    struct scaler_service *svc = ud;
    if (svc->npending)
        pending_answer_target(svc, t, false);
}

void scaler_service_fail_pending(struct scaler_service *svc, const char *why)
{
    while (svc->pending) {
        struct pending_call *p = svc->pending;
        struct grpc_call *call = p->call;
        grpc_call_set_cancel(call, NULL, NULL);
        pending_unlink(p);
        svc->calls_wait_expired++;
        grpc_call_finish(call, GRPC_STATUS_UNAVAILABLE, why);
    }
}

void scaler_service_tick(struct scaler_service *svc, int64_t now_ms)
{
    struct pending_call *p = svc->pending;
    while (p) {
        struct pending_call *next = p->next;
        if (now_ms >= p->deadline_ms) {
            svc->calls_wait_expired++;
            pending_answer(p);
        }
        p = next;
    }
}

static void handle_is_active(void *ud, struct grpc_call *call, const uint8_t *msg, size_t len)
{
    struct scaler_service *svc = ud;
    struct target *t = resolve_ref_message(svc, call, msg, len);
    if (!t)
        return;
    answer_or_wait(svc, call, t, NULL);
}

static void sub_unlink(struct stream_sub *sub)
{
    struct scaler_service *svc = sub->svc;
    const char *model = target_spec(sub->target)->model;
    struct sub_list *list = strmap_get(svc->subs_by_model, model);
    if (sub->prev)
        sub->prev->next = sub->next;
    else if (list)
        list->head = sub->next;
    if (sub->next)
        sub->next->prev = sub->prev;
    if (list && !list->head) {
        strmap_remove(svc->subs_by_model, model);
        thaw_free(list);
    }
    target_unref(sub->target);
    svc->nstreams--;
    thaw_free(sub);
}

/* Ends a stream we can no longer feed; KEDA reopens it with backoff. */
static void end_stream(struct stream_sub *sub, const char *why)
{
    struct grpc_call *call = sub->call;
    sub->svc->push_failures++;
    sub_unlink(sub);
    grpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, why);
}

static void stream_cancelled(void *ud, struct grpc_call *call)
{
    struct stream_sub *sub = ud;
    LOG_DEBUG("stream_closed", "peer=%s model=%s", grpc_call_peer(call),
              target_spec(sub->target)->model);
    sub_unlink(sub);
}

static void handle_stream_is_active(void *ud, struct grpc_call *call, const uint8_t *msg,
                                    size_t len)
{
    struct scaler_service *svc = ud;
    /* A stream whose message ends after SIGTERM (the GOAWAY admits streams
     * already begun) ends as the open ones did: registered, nothing would
     * end it and the exit would wait out --shutdown-timeout-seconds. */
    if (!svc->serving) {
        grpc_call_finish(call, GRPC_STATUS_OK, NULL);
        return;
    }
    struct target *t = resolve_ref_message(svc, call, msg, len);
    if (!t)
        return;
    const char *model = target_spec(t)->model;
    struct sub_list *list = strmap_get(svc->subs_by_model, model);
    struct stream_sub *sub = thaw_calloc(1, sizeof(*sub));
    if (!list) {
        list = thaw_calloc(1, sizeof(*list));
        if (list && strmap_put(svc->subs_by_model, model, list) != 0) {
            thaw_free(list);
            list = NULL;
        }
    }
    if (!sub || !list) {
        thaw_free(sub);
        grpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    sub->svc = svc;
    sub->call = call;
    sub->target = t;
    sub->next = list->head;
    if (list->head)
        list->head->prev = sub;
    list->head = sub;
    target_ref(t);
    svc->nstreams++;
    grpc_call_set_cancel(call, stream_cancelled, sub);
    LOG_DEBUG("stream_opened", "peer=%s model=%s", grpc_call_peer(call), model);
    /* The current state at once, so a stream opened during a burst acts now. */
    if (target_decision(t)->active && stream_send(sub, true, clock_mono_ms()) != 0)
        end_stream(sub, "could not queue the stream message");
}

static void handle_get_metric_spec(void *ud, struct grpc_call *call, const uint8_t *msg,
                                   size_t len)
{
    struct scaler_service *svc = ud;
    struct target *t = resolve_ref_message(svc, call, msg, len);
    if (!t)
        return;
    char name[256];
    metadata_metric_name(target_spec(t)->model, name, sizeof(name));
    /* The INIT macro fills the deprecated targetSize field too, which clang
     * (not gcc) reports; and we set it on purpose below. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    Externalscaler__MetricSpec spec = EXTERNALSCALER__METRIC_SPEC__INIT;
#pragma GCC diagnostic pop
    Externalscaler__MetricSpec *specs[1] = {&spec};
    Externalscaler__GetMetricSpecResponse resp = EXTERNALSCALER__GET_METRIC_SPEC_RESPONSE__INIT;
    spec.metricname = name;
    /* Target 1 per replica: KEDA's AverageValue arithmetic then turns our
     * metric value into exactly that many replicas. Older KEDA reads the
     * deprecated integer field, so both are set. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    spec.targetsize = 1;
#pragma GCC diagnostic pop
    spec.targetsizefloat = 1.0;
    resp.n_metricspecs = 1;
    resp.metricspecs = specs;
    reply_unary(call, &resp.base);
}

static void handle_get_metrics(void *ud, struct grpc_call *call, const uint8_t *msg, size_t len)
{
    struct scaler_service *svc = ud;
    if (refuse_nul_strings(call, msg, len, &externalscaler__get_metrics_request__descriptor))
        return;
    Externalscaler__GetMetricsRequest *req =
        externalscaler__get_metrics_request__unpack(&pb_allocator, len, msg);
    if (!req) {
        grpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                         "request is not a valid externalscaler.GetMetricsRequest");
        return;
    }
    /* Echoed in the reply, which KEDA's Go decoder would refuse. */
    if (req->metricname && !utf8_valid(req->metricname, strlen(req->metricname))) {
        externalscaler__get_metrics_request__free_unpacked(req, &pb_allocator);
        grpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT, "metricName is not valid UTF-8");
        return;
    }
    struct target *t = resolve(svc, call, req->scaledobjectref);
    if (!t) {
        externalscaler__get_metrics_request__free_unpacked(req, &pb_allocator);
        return;
    }
    char name[256];
    if (req->metricname && *req->metricname)
        snprintf(name, sizeof(name), "%s", req->metricname);
    else
        metadata_metric_name(target_spec(t)->model, name, sizeof(name));
    externalscaler__get_metrics_request__free_unpacked(req, &pb_allocator);
    answer_or_wait(svc, call, t, name);
}

static void handle_health_check(void *ud, struct grpc_call *call, const uint8_t *msg, size_t len)
{
    struct scaler_service *svc = ud;
    Grpc__Health__V1__HealthCheckRequest *req =
        grpc__health__v1__health_check_request__unpack(&pb_allocator, len, msg);
    if (!req) {
        grpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                         "request is not a valid grpc.health.v1.HealthCheckRequest");
        return;
    }
    bool known = req->service[0] == '\0' || strcmp(req->service, "externalscaler.ExternalScaler") == 0;
    grpc__health__v1__health_check_request__free_unpacked(req, &pb_allocator);
    if (!known) {
        grpc_call_finish(call, GRPC_STATUS_NOT_FOUND, "unknown service");
        return;
    }
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = svc->serving ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                               : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    reply_unary(call, &resp.base);
}

/* ---- pushes ------------------------------------------------------------ */

/* A wake (only == NULL) skips streams that said `true` less than
 * wake_repeat_ms ago; a change of the decision is always sent. */
static void push_model(struct scaler_service *svc, const char *model, struct target *only,
                       bool active, uint64_t *counter)
{
    struct sub_list *list = strmap_get(svc->subs_by_model, model);
    struct stream_sub *s = list ? list->head : NULL;
    int64_t now = clock_mono_ms();
    while (s) {
        /* grpc_call_send never flushes synchronously, so only end_stream
         * changes the list here, and it frees nothing but s. */
        struct stream_sub *next = s->next;
        bool last = next == NULL;
        bool repeat = !only && s->last_sent_active && now - s->last_sent_ms < svc->wake_repeat_ms;
        if (repeat) {
            svc->pushes_coalesced++;
        } else if (!only || s->target == only) {
            if (stream_send(s, active, now) == 0) {
                (*counter)++;
            } else {
                end_stream(s, "stream consumer is not reading");
                if (last) /* the list itself may be gone with its last entry */
                    break;
            }
        }
        s = next;
    }
}

void scaler_service_on_change(void *ud, struct target *t, const struct policy_decision *old,
                              const struct policy_decision *now)
{
    struct scaler_service *svc = ud;
    /* A wake (or a held count) turns the target active: an IsActive call
     * waiting for its first reading has its answer, `true`, now. GetMetrics
     * calls still wait: the count needs the token rate too. */
    if (now->active && svc->npending)
        pending_answer_target(svc, t, true);
    if (svc->in_wake || (old && old->active == now->active) || (!old && !now->active))
        return;
    push_model(svc, target_spec(t)->model, t, now->active, &svc->pushes_change);
}

size_t scaler_service_wake(struct scaler_service *svc, const char *model, const char *instance,
                           double held)
{
    svc->in_wake = true;
    size_t n = scaler_state_wake(svc->st, model, instance, held, clock_mono_ms());
    svc->in_wake = false;
    push_model(svc, model, NULL, true, &svc->pushes_wake);
    char q[300];
    LOG_INFO("wake", "model=%s targets=%zu", log_quote(q, sizeof(q), model), n);
    return n;
}

/* ---- lifecycle --------------------------------------------------------- */

struct scaler_service *scaler_service_new(void)
{
    struct scaler_service *svc = thaw_calloc(1, sizeof(*svc));
    if (!svc)
        return NULL;
    svc->wake_repeat_ms = WAKE_REPEAT_DEFAULT_MS;
    svc->subs_by_model = strmap_new();
    svc->unknown_keys = strmap_new();
    if (!svc->subs_by_model || !svc->unknown_keys) {
        scaler_service_free(svc);
        return NULL;
    }
    svc->serving = true;
    struct grpc_method m[M_COUNT] = {
        {"/externalscaler.ExternalScaler/IsActive", handle_is_active, svc},
        {"/externalscaler.ExternalScaler/StreamIsActive", handle_stream_is_active, svc},
        {"/externalscaler.ExternalScaler/GetMetricSpec", handle_get_metric_spec, svc},
        {"/externalscaler.ExternalScaler/GetMetrics", handle_get_metrics, svc},
        {"/grpc.health.v1.Health/Check", handle_health_check, svc},
    };
    memcpy(svc->methods, m, sizeof(m));
    return svc;
}

void scaler_service_free(struct scaler_service *svc)
{
    if (!svc)
        return;
    size_t cur = 0;
    const char *key;
    void *value;
    while (svc->subs_by_model && strmap_next(svc->subs_by_model, &cur, &key, &value)) {
        struct sub_list *list = value;
        struct stream_sub *s = list->head;
        while (s) {
            struct stream_sub *next = s->next;
            grpc_call_set_cancel(s->call, NULL, NULL);
            thaw_free(s);
            s = next;
        }
        thaw_free(list);
    }
    /* The state (and its targets) may be gone already: no unref here. */
    while (svc->pending) {
        struct pending_call *next = svc->pending->next;
        grpc_call_set_cancel(svc->pending->call, NULL, NULL);
        thaw_free(svc->pending);
        svc->pending = next;
    }
    strmap_free(svc->subs_by_model);
    strmap_free(svc->unknown_keys);
    strmap_free(svc->namespaces);
    thaw_free(svc->redis_key_prefix);
    thaw_free(svc);
}

void scaler_service_attach(struct scaler_service *svc, struct scaler_state *st) { svc->st = st; }

const struct grpc_method *scaler_service_methods(struct scaler_service *svc, size_t *n)
{
    *n = M_COUNT;
    return svc->methods;
}

int scaler_service_set_tenancy(struct scaler_service *svc, const char *redis_key_prefix,
                               const char *namespaces)
{
    char *prefix = thaw_strdup(redis_key_prefix ? redis_key_prefix : "");
    struct strmap *allow = NULL;
    if (!prefix)
        return -1;
    if (namespaces && *namespaces) {
        allow = strmap_new();
        char *list = thaw_strdup(namespaces);
        if (!allow || !list) {
            strmap_free(allow);
            thaw_free(list);
            thaw_free(prefix);
            return -1;
        }
        char *save = NULL;
        for (char *tok = strtok_r(list, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
            if (strmap_put(allow, tok, svc) != 0) {
                strmap_free(allow);
                thaw_free(list);
                thaw_free(prefix);
                return -1;
            }
        }
        thaw_free(list);
    }
    thaw_free(svc->redis_key_prefix);
    strmap_free(svc->namespaces);
    svc->redis_key_prefix = prefix;
    svc->namespaces = allow;
    return 0;
}

void scaler_service_set_wake_repeat(struct scaler_service *svc, int64_t repeat_ms)
{
    svc->wake_repeat_ms = repeat_ms;
}

void scaler_service_set_serving(struct scaler_service *svc, bool serving)
{
    svc->serving = serving;
}

size_t scaler_service_stream_count(const struct scaler_service *svc) { return svc->nstreams; }

void scaler_service_write_metrics(const struct scaler_service *svc, struct evbuffer *out)
{
    char labels[64];
    expo_family(out, "thaw_scaler_pushes_total", "counter",
                "Messages pushed on StreamIsActive streams, by cause.");
    expo_labels(labels, sizeof(labels), "cause", "wake", (char *)NULL);
    expo_sample(out, "thaw_scaler_pushes_total", labels, (double)svc->pushes_wake);
    expo_labels(labels, sizeof(labels), "cause", "decision_change", (char *)NULL);
    expo_sample(out, "thaw_scaler_pushes_total", labels, (double)svc->pushes_change);
    expo_family(out, "thaw_scaler_wake_pushes_coalesced_total", "counter",
                "Wake pushes not sent: the stream had said true within --wake-repeat-ms.");
    expo_sample(out, "thaw_scaler_wake_pushes_coalesced_total", NULL,
                (double)svc->pushes_coalesced);
    expo_family(out, "thaw_scaler_push_failures_total", "counter",
                "Streams ended because a push could not be queued (peer not reading).");
    expo_sample(out, "thaw_scaler_push_failures_total", NULL, (double)svc->push_failures);
    expo_family(out, "thaw_scaler_active_streams", "gauge", "Open StreamIsActive streams.");
    expo_sample(out, "thaw_scaler_active_streams", NULL, (double)svc->nstreams);
    expo_family(out, "thaw_scaler_calls_awaiting_data_total", "counter",
                "IsActive/GetMetrics calls that waited for a new target's first reading, by "
                "outcome (answered, or UNAVAILABLE at the deadline).");
    expo_labels(labels, sizeof(labels), "outcome", "answered", (char *)NULL);
    expo_sample(out, "thaw_scaler_calls_awaiting_data_total", labels,
                (double)svc->calls_wait_answered);
    expo_labels(labels, sizeof(labels), "outcome", "deadline", (char *)NULL);
    expo_sample(out, "thaw_scaler_calls_awaiting_data_total", labels,
                (double)svc->calls_wait_expired);
}
