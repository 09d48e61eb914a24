/* gen_seeds: writes the binary seed inputs of the grpc_frame, scaler_request
 * and grpc_server targets (the text targets' seeds are written by hand).
 * Protobuf messages are packed by protobuf-c and HTTP/2 frames (HPACK
 * included) by an nghttp2 client session, so the seeds are what a real
 * client sends. Usage: gen_seeds CORPUS_DIR (writes CORPUS_DIR/<target>/...).
 * Run by hand after a protocol change; the output is committed. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <nghttp2/nghttp2.h>
#include <protobuf-c/protobuf-c.h>

#include "externalscaler.pb-c.h"
#include "grpc_frame.h"
#include "health.pb-c.h"

struct buf {
    uint8_t *p;
    size_t len, cap;
};

static void put(struct buf *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *np = realloc(b->p, cap);
        if (!np) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void put_u8(struct buf *b, uint8_t v) { put(b, &v, 1); }

static void write_file(const char *dir, const char *target, const char *name, const struct buf *b)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", dir, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b->p, 1, b->len, f) != b->len || fclose(f) != 0) {
        fprintf(stderr, "%s: write failed\n", path);
        exit(1);
    }
}

static void pack(struct buf *b, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *tmp = malloc(n ? n : 1);
    if (!tmp)
        exit(1);
    protobuf_c_message_pack(m, tmp);
    put(b, tmp, n);
    free(tmp);
}

/* A ScaledObjectRef with the given metadata (NULL-terminated key, value pairs). */
static void pack_ref(struct buf *b, const char *ns, const char *name, const char *const *kv)
{
    Externalscaler__ScaledObjectRef ref = EXTERNALSCALER__SCALED_OBJECT_REF__INIT;
    Externalscaler__ScaledObjectRef__ScalerMetadataEntry e[16];
    Externalscaler__ScaledObjectRef__ScalerMetadataEntry *ep[16];
    size_t n = 0;
    for (; kv[2 * n] && n < 16; n++) {
        Externalscaler__ScaledObjectRef__ScalerMetadataEntry init =
            EXTERNALSCALER__SCALED_OBJECT_REF__SCALER_METADATA_ENTRY__INIT;
        e[n] = init;
        e[n].key = (char *)kv[2 * n];
        e[n].value = (char *)kv[2 * n + 1];
        ep[n] = &e[n];
    }
    ref.namespace_ = (char *)ns;
    ref.name = (char *)name;
    ref.n_scalermetadata = n;
    ref.scalermetadata = ep;
    pack(b, &ref.base);
}

static void pack_get_metrics(struct buf *b, const char *metric, const char *const *kv)
{
    struct buf inner = {0};
    pack_ref(&inner, "default", "so-1", kv);
    Externalscaler__GetMetricsRequest req = EXTERNALSCALER__GET_METRICS_REQUEST__INIT;
    req.scaledobjectref =
        externalscaler__scaled_object_ref__unpack(NULL, inner.len, inner.p);
    req.metricname = (char *)metric;
    pack(b, &req.base);
    externalscaler__scaled_object_ref__free_unpacked(req.scaledobjectref, NULL);
    free(inner.p);
}

static void pack_health(struct buf *b, const char *service)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    pack(b, &req.base);
}

static const char *const kv_basic[] = {"model", "llama-8b", NULL};
static const char *const kv_full[] = {
    "model", "Llama-3.1-8B/Instruct", "targetTokensPerSecond", "250.5", "targetQueueLength", "4",
    "redisKey", "thaw:queue:llama", "redisStreamGroup", "workers", "activationTokenRate", "0",
    "activationQueueLength", "1", "scalerAddress", "thaw:9090", "somethingElse", "x", NULL};
static const char *const kv_bad_number[] = {"model", "m", "targetTokensPerSecond", "abc", NULL};
static const char *const kv_no_model[] = {"targetQueueLength", "3", NULL};
static const char *const kv_control[] = {"model", "m\nx", NULL};
static const char *const kv_other_key[] = {"model", "m", "redisKey", "other:key", NULL};

/* ---- scaler_request: [kind][len BE16][message] records ---- */

static void record(struct buf *out, uint8_t kind, const struct buf *msg)
{
    put_u8(out, kind);
    put_u8(out, (uint8_t)(msg->len >> 8));
    put_u8(out, (uint8_t)msg->len);
    put(out, msg->p, msg->len);
}

static void gen_scaler_request(const char *dir)
{
    struct {
        const char *name;
        uint8_t kind;
        const char *const *kv;
    } one[] = {
        {"is_active", 0, kv_basic},       {"metric_spec_full", 1, kv_full},
        {"bad_number", 0, kv_bad_number}, {"no_model", 1, kv_no_model},
        {"control_char", 0, kv_control},
        {"prefix_refused", 4 | 1, kv_other_key}, /* bit 2: --redis-key-prefix enforced */
        {"prefix_default_key", 4 | 0, kv_basic},
    };
    for (size_t i = 0; i < sizeof(one) / sizeof(one[0]); i++) {
        struct buf m = {0}, out = {0};
        pack_ref(&m, "default", "so-1", one[i].kv);
        record(&out, one[i].kind, &m);
        write_file(dir, "scaler_request", one[i].name, &out);
        free(m.p);
        free(out.p);
    }
    /* A sequence: the same target, then a changed spec, metrics, health. */
    struct buf out = {0}, m = {0};
    pack_ref(&m, "team-a", "chat", kv_basic);
    record(&out, 0, &m);
    m.len = 0;
    pack_ref(&m, "team-a", "chat", kv_full);
    record(&out, 1, &m);
    m.len = 0;
    pack_get_metrics(&m, "", kv_basic);
    record(&out, 2, &m);
    m.len = 0;
    pack_get_metrics(&m, "s0-thaw-llama-8b", kv_other_key);
    record(&out, 2, &m);
    m.len = 0;
    pack_health(&m, "");
    record(&out, 3, &m);
    m.len = 0;
    pack_health(&m, "externalscaler.ExternalScaler");
    record(&out, 3, &m);
    write_file(dir, "scaler_request", "sequence", &out);
    free(m.p);
    free(out.p);
}

/* ---- grpc_frame: [limit selector] + framed messages ---- */

static void frame(struct buf *out, const struct buf *msg)
{
    uint8_t h[GRPC_FRAME_HEADER_LEN];
    grpc_frame_header(h, (uint32_t)msg->len);
    put(out, h, sizeof(h));
    put(out, msg->p, msg->len);
}

static void gen_grpc_frame(const char *dir)
{
    struct buf m = {0}, out = {0};
    pack_ref(&m, "default", "so-1", kv_full);
    put_u8(&out, 5); /* 4 MiB limit */
    frame(&out, &m);
    struct buf empty = {0};
    frame(&out, &empty);
    frame(&out, &m);
    write_file(dir, "grpc_frame", "three_messages", &out);
    out.len = 0;
    put_u8(&out, 3); /* 100-byte limit: the second message is too large */
    struct buf small = {0};
    put(&small, "\x0a\x03" "abc", 5);
    frame(&out, &small);
    frame(&out, &m);
    write_file(dir, "grpc_frame", "over_limit", &out);
    out.len = 0;
    put_u8(&out, 5);
    put(&out, "\x01\x00\x00\x00\x02hi", 7); /* compressed flag */
    write_file(dir, "grpc_frame", "compressed", &out);
    out.len = 0;
    put_u8(&out, 5);
    put(&out, "\x00\x00\x00\x00\x10short", 10); /* ends mid-message */
    write_file(dir, "grpc_frame", "partial", &out);
    free(m.p);
    free(out.p);
    free(small.p);
}

/* ---- grpc_server: [options] + client HTTP/2 frames after the preface ---- */

struct h2req {
    const char *path;
    const char *content_type;
    struct buf body; /* gRPC-framed */
    size_t sent;
};

static ssize_t send_cb(nghttp2_session *s, const uint8_t *data, size_t len, int flags, void *ud)
{
    (void)s;
    (void)flags;
    put(ud, data, len);
    return (ssize_t)len;
}

static ssize_t read_cb(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
                       uint32_t *flags, nghttp2_data_source *src, void *ud)
{
    (void)s;
    (void)id;
    (void)ud;
    struct h2req *r = src->ptr;
    size_t n = r->body.len - r->sent;
    if (n > len)
        n = len;
    memcpy(buf, r->body.p + r->sent, n);
    r->sent += n;
    if (r->sent == r->body.len)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

#define NV(n, v)                                                                               \
    {                                                                                          \
        (uint8_t *)(n), (uint8_t *)(v), strlen(n), strlen(v), NGHTTP2_NV_FLAG_NONE             \
    }

/* One connection's client bytes for reqs (the preface stripped: the harness
 * sends it). rst: reset the first stream after sending. */
static void h2_conn(const char *dir, const char *name, uint8_t opts, struct h2req *reqs,
                    size_t n, bool rst)
{
    struct buf out = {0};
    nghttp2_session_callbacks *cbs;
    nghttp2_session *s;
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_callbacks_set_send_callback(cbs, send_cb);
    nghttp2_session_client_new(&s, cbs, &out);
    nghttp2_session_callbacks_del(cbs);
    nghttp2_submit_settings(s, NGHTTP2_FLAG_NONE, NULL, 0);
    int32_t first = -1;
    for (size_t i = 0; i < n; i++) {
        nghttp2_nv nv[] = {
            NV(":method", "POST"), NV(":scheme", "http"), NV(":path", reqs[i].path),
            NV(":authority", "127.0.0.1:9090"), NV("content-type", reqs[i].content_type),
            NV("te", "trailers"), NV("grpc-timeout", "5S"),
        };
        nghttp2_data_provider dp;
        dp.source.ptr = &reqs[i];
        dp.read_callback = read_cb;
        int32_t id = nghttp2_submit_request(s, NULL, nv, sizeof(nv) / sizeof(nv[0]), &dp, NULL);
        if (first < 0)
            first = id;
    }
    nghttp2_session_send(s);
    if (rst && first > 0) {
        nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, first, NGHTTP2_CANCEL);
        nghttp2_submit_ping(s, NGHTTP2_FLAG_NONE, NULL);
        nghttp2_session_send(s);
    }
    nghttp2_session_del(s);
    static const size_t magic = sizeof(NGHTTP2_CLIENT_MAGIC) - 1;
    struct buf file = {0};
    put_u8(&file, opts);
    put(&file, out.p + magic, out.len - magic);
    write_file(dir, "grpc_server", name, &file);
    free(out.p);
    free(file.p);
}

static void framed_ref(struct buf *body, const char *ns, const char *const *kv)
{
    struct buf m = {0};
    pack_ref(&m, ns, "so-1", kv);
    frame(body, &m);
    free(m.p);
}

static void gen_grpc_server(const char *dir)
{
    const char *grpc = "application/grpc";
    struct h2req r[4];
    memset(r, 0, sizeof(r));

    r[0].path = "/externalscaler.ExternalScaler/IsActive";
    r[0].content_type = grpc;
    framed_ref(&r[0].body, "default", kv_basic);
    r[1].path = "/externalscaler.ExternalScaler/GetMetricSpec";
    r[1].content_type = "application/grpc+proto";
    framed_ref(&r[1].body, "team-a", kv_full);
    r[2].path = "/externalscaler.ExternalScaler/GetMetrics";
    r[2].content_type = grpc;
    struct buf m = {0};
    pack_get_metrics(&m, "", kv_basic);
    frame(&r[2].body, &m);
    m.len = 0;
    r[3].path = "/grpc.health.v1.Health/Check";
    r[3].content_type = grpc;
    pack_health(&m, "");
    frame(&r[3].body, &m);
    h2_conn(dir, "four_unary", 0, r, 4, false);
    for (int i = 0; i < 4; i++)
        r[i].sent = 0;
    h2_conn(dir, "four_unary_tenancy", 1 | 2 | 4 | 8, r, 4, false);

    struct h2req s[2];
    memset(s, 0, sizeof(s));
    s[0].path = "/externalscaler.ExternalScaler/StreamIsActive";
    s[0].content_type = grpc;
    framed_ref(&s[0].body, "default", kv_basic);
    s[1].path = "/externalscaler.ExternalScaler/StreamIsActive";
    s[1].content_type = grpc;
    framed_ref(&s[1].body, "default", kv_full);
    h2_conn(dir, "streams_then_reset", 0, s, 2, true);

    struct h2req bad[3];
    memset(bad, 0, sizeof(bad));
    bad[0].path = "/externalscaler.ExternalScaler/Nope";
    bad[0].content_type = grpc;
    framed_ref(&bad[0].body, "default", kv_basic);
    bad[1].path = "/externalscaler.ExternalScaler/IsActive";
    bad[1].content_type = "text/plain";
    framed_ref(&bad[1].body, "default", kv_basic);
    bad[2].path = "/externalscaler.ExternalScaler/IsActive";
    bad[2].content_type = grpc;
    framed_ref(&bad[2].body, "default", kv_bad_number);
    framed_ref(&bad[2].body, "default", kv_basic); /* two messages: INTERNAL */
    h2_conn(dir, "errors", 0, bad, 3, false);

    for (int i = 0; i < 4; i++)
        free(r[i].body.p);
    for (int i = 0; i < 2; i++)
        free(s[i].body.p);
    for (int i = 0; i < 3; i++)
        free(bad[i].body.p);
    free(m.p);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    gen_scaler_request(argv[1]);
    gen_grpc_frame(argv[1]);
    gen_grpc_server(argv[1]);
    return 0;
}
