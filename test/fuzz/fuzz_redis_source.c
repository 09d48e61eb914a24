/* Target redis_source: the scaler's handling of what Redis answers
 * (scaler/redis_source.c: handshake replies, EVALSHA batch replies, NOSCRIPT
 * reload, pub/sub wake messages, disconnects) and what main.c does with the
 * results (scaler_state_queue_ok / held_ok / wake). That code lives in static
 * hiredis callbacks, so the input is served by a fake Redis on loopback TCP
 * to a real redis_source on a libevent loop.
 *
 * Input: byte 0 options (bit 0: db 3 in the URL, so the handshake SELECTs;
 * bit 1: a target with a stream consumer group; bit 2: a second round of
 * batches); then records [conn byte][length: 2 bytes BE][bytes]. Records with
 * an even conn byte answer the command connection, one record per command in
 * the order the commands arrive; odd ones are pushed on the subscriber
 * connection once it has sent SUBSCRIBE. When the command connection's
 * records run out the fake server closes it, as a Redis that died; when the
 * run goes quiet it closes everything.
 *
 * Records are sent as they are: hiredis 0.14 assert()s on some replies no
 * Redis sends (a reply no command asked for; a pub/sub reply that is not an
 * array of >= 2 strings; an unsubscribe without its count), and the source's
 * reply guard (common/redis_guard.c) must refuse those first, as it refuses
 * huge array headers (regressions/redis_source/unsolicited_replies and
 * pubsub_*). THAW_FUZZ_REDIS_FILTER=1 keeps them out instead (first reply of
 * a record only, malformed pub/sub replies dropped), to fuzz what lies past
 * the guard.
 * Checks: results have the promised shape, decisions stay in range. Then
 * again with an allocation failing. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>

#include "alloc.h"
#include "clock.h"
#include "fuzz.h"
#include "metadata.h"
#include "policy.h"
#include "redis_guard.h"
#include "redis_source.h"
#include "state.h"

#define MAX_RECORDS 64
#define MAX_CONNS 16

struct record {
    const uint8_t *p;
    size_t len;
};

enum role { ROLE_UNKNOWN, ROLE_CMD, ROLE_SUB, ROLE_EXTRA };

struct fake;

struct fconn {
    struct fake *f;
    int fd;
    struct event *ev;
    enum role role;
    uint8_t *in;
    size_t in_len, in_cap, in_pos;
    size_t commands;
    size_t next; /* next record of its role */
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    bool close_after_send;
    bool closed;
};

struct fake {
    struct event_base *base;
    int lfd;
    struct event *lev;
    struct record cmd[MAX_RECORDS], sub[MAX_RECORDS];
    size_t ncmd, nsub;
    struct fconn conns[MAX_CONNS];
    size_t nconns;
    bool have_cmd, have_sub;
    bool raw;
    uint64_t progress;
};

struct harness {
    struct fake *f;
    struct redis_source *src;
    struct scaler_state *st;
    int rounds_left_queue, rounds_left_held;
    bool queue_in_flight, held_in_flight;
    size_t queue_n, held_n;
};

static bool raw_mode;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    const char *filter = getenv("THAW_FUZZ_REDIS_FILTER");
    raw_mode = !(filter && strcmp(filter, "1") == 0);
    return 0;
}

/* ---- the fake Redis ----------------------------------------------------- */

static void out_append(struct fconn *c, const uint8_t *p, size_t n)
{
    if (n == 0)
        return;
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 256;
        while (cap < c->out_len + n)
            cap *= 2;
        uint8_t *np = realloc(c->out, cap);
        if (!np)
            fuzz_fail(__FILE__, __LINE__, "out of memory in the harness");
        c->out = np;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
}

/* Length of the first whole reply in p[0..n), 0 if it is incomplete, -1 if
 * hiredis cannot read it. keep (when not NULL) decides whether a reply may be
 * sent. */
static long first_reply(const uint8_t *p, size_t n, bool (*keep)(const redisReply *), bool *kept)
{
    redisReader *rd = redisReaderCreate();
    if (!rd || redis_guard_install(rd) != 0)
        fuzz_fail(__FILE__, __LINE__, "out of memory in the harness");
    long res = -1;
    if (redisReaderFeed(rd, (const char *)p, n) == REDIS_OK) {
        void *reply = NULL;
        size_t before = rd->len - rd->pos;
        if (redisReaderGetReply(rd, &reply) == REDIS_OK) {
            if (!reply) {
                res = 0;
            } else {
                res = (long)(before - (rd->len - rd->pos));
                if (kept)
                    *kept = !keep || keep(reply);
                freeReplyObject(reply);
            }
        }
    }
    redisReaderFree(rd);
    return res;
}

/* What hiredis 0.14's pub/sub dispatch survives (async.c
 * __redisGetSubscribeCallback asserts the rest). */
static bool sub_reply_ok(const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 || !r->element[0] || !r->element[1] ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING)
        return false;
    const char *t = r->element[0]->str;
    return strcasecmp(t, "unsubscribe") != 0 && strcasecmp(t, "punsubscribe") != 0;
}

/* Queues the answer to command number c->commands - 1. */
static void answer_cmd(struct fconn *c)
{
    struct fake *f = c->f;
    if (c->close_after_send)
        return;
    if (c->next >= f->ncmd) {
        c->close_after_send = true; /* records used up: Redis "dies" */
        return;
    }
    const struct record *r = &f->cmd[c->next++];
    if (f->raw) {
        out_append(c, r->p, r->len);
        return;
    }
    long n = first_reply(r->p, r->len, NULL, NULL);
    if (n > 0) {
        out_append(c, r->p, (size_t)n);
    } else {
        /* A broken or cut reply can only end the connection: anything sent
         * after it would be read as part of it. */
        out_append(c, r->p, r->len);
        c->close_after_send = true;
    }
}

static void answer_subscribe(struct fconn *c)
{
    struct fake *f = c->f;
    for (size_t i = 0; i < f->nsub; i++) {
        const struct record *r = &f->sub[i];
        if (f->raw) {
            out_append(c, r->p, r->len);
            continue;
        }
        size_t off = 0;
        while (off < r->len) {
            bool kept = false;
            long n = first_reply(r->p + off, r->len - off, sub_reply_ok, &kept);
            if (n <= 0) {
                /* The tail, as a last thing on an otherwise idle connection. */
                out_append(c, r->p + off, r->len - off);
                return;
            }
            if (kept)
                out_append(c, r->p + off, (size_t)n);
            off += (size_t)n;
        }
    }
}

/* Parses whole commands (arrays of bulk strings, as hiredis writes them). */
static void parse_commands(struct fconn *c)
{
    for (;;) {
        const char *p = (const char *)c->in + c->in_pos;
        size_t n = c->in_len - c->in_pos, i = 0;
        long argc = 0;
        const char *first = NULL;
        size_t first_len = 0;
        if (n == 0)
            return;
        if (p[0] != '*')
            fuzz_fail(__FILE__, __LINE__, "fake redis: not a command");
        const char *nl = memchr(p, '\n', n);
        if (!nl)
            return;
        argc = strtol(p + 1, NULL, 10);
        i = (size_t)(nl - p) + 1;
        for (long a = 0; a < argc; a++) {
            if (i >= n)
                return;
            nl = memchr(p + i, '\n', n - i);
            if (!nl)
                return;
            long len = strtol(p + i + 1, NULL, 10);
            size_t start = (size_t)(nl - p) + 1;
            if (start + (size_t)len + 2 > n)
                return;
            if (a == 0) {
                first = p + start;
                first_len = (size_t)len;
            }
            i = start + (size_t)len + 2;
        }
        c->in_pos += i;
        c->commands++;
        if (c->role == ROLE_UNKNOWN) {
            bool sub = first_len == 9 && strncasecmp(first, "SUBSCRIBE", 9) == 0;
            if (sub && !c->f->have_sub) {
                c->role = ROLE_SUB;
                c->f->have_sub = true;
            } else if (!sub && !c->f->have_cmd) {
                c->role = ROLE_CMD;
                c->f->have_cmd = true;
            } else {
                c->role = ROLE_EXTRA; /* a reconnect: nothing more to say */
                c->close_after_send = true;
            }
        }
        if (c->role == ROLE_CMD)
            answer_cmd(c);
        else if (c->role == ROLE_SUB && c->commands == 1)
            answer_subscribe(c);
    }
}

static void fconn_close(struct fconn *c)
{
    if (c->closed)
        return;
    c->closed = true;
    event_free(c->ev);
    c->ev = NULL;
    /* A reset, not a FIN: the side that closes first keeps a TIME_WAIT
     * socket for a minute, and at a few hundred runs a second those used up
     * the ephemeral ports within a minute ("listen: Address already in
     * use"). What was written is already in the client's receive queue
     * (loopback), and hiredis reads it before it sees the reset. */
    struct linger lg = {1, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(c->fd);
    c->f->progress++;
}

static void fconn_flush(struct fconn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        if (w > 0) {
            c->out_off += (size_t)w;
            c->f->progress++;
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        fconn_close(c);
        return;
    }
    if (c->close_after_send)
        fconn_close(c);
}

static void fconn_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct fconn *c = arg;
    for (;;) {
        if (c->in_len == c->in_cap) {
            size_t cap = c->in_cap ? c->in_cap * 2 : 4096;
            uint8_t *np = realloc(c->in, cap);
            if (!np)
                fuzz_fail(__FILE__, __LINE__, "out of memory in the harness");
            c->in = np;
            c->in_cap = cap;
        }
        ssize_t r = read(fd, c->in + c->in_len, c->in_cap - c->in_len);
        if (r > 0) {
            c->in_len += (size_t)r;
            c->f->progress++;
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            break;
        fconn_close(c); /* the client went away */
        return;
    }
    parse_commands(c);
    fconn_flush(c);
}

static void accept_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct fake *f = arg;
    for (;;) {
        int cfd = accept(fd, NULL, NULL);
        if (cfd < 0)
            return;
        if (fcntl(cfd, F_SETFL, fcntl(cfd, F_GETFL) | O_NONBLOCK) != 0)
            fuzz_fail(__FILE__, __LINE__, "fcntl: %s", strerror(errno));
        f->progress++;
        if (f->nconns >= MAX_CONNS) {
            close(cfd);
            continue;
        }
        struct fconn *c = &f->conns[f->nconns++];
        memset(c, 0, sizeof(*c));
        c->f = f;
        c->fd = cfd;
        c->ev = event_new(f->base, cfd, EV_READ | EV_PERSIST, fconn_cb, c);
        if (!c->ev || event_add(c->ev, NULL) != 0)
            fuzz_fail(__FILE__, __LINE__, "fake redis: event");
    }
}

static int fake_listen(struct fake *f)
{
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (f->lfd < 0)
        fuzz_fail(__FILE__, __LINE__, "socket: %s (descriptor leak?)", strerror(errno));
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof(sa);
    if (bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(f->lfd, 16) != 0 ||
        getsockname(f->lfd, (struct sockaddr *)&sa, &sl) != 0)
        fuzz_fail(__FILE__, __LINE__, "listen: %s", strerror(errno));
    f->lev = event_new(f->base, f->lfd, EV_READ | EV_PERSIST, accept_cb, f);
    if (!f->lev || event_add(f->lev, NULL) != 0)
        fuzz_fail(__FILE__, __LINE__, "fake redis: event");
    return ntohs(sa.sin_port);
}

static void fake_stop(struct fake *f)
{
    if (f->lev) {
        event_free(f->lev);
        f->lev = NULL;
        close(f->lfd);
    }
    for (size_t i = 0; i < f->nconns; i++) {
        /* Reset, not FIN: no TIME_WAIT left behind by the thousands. */
        if (!f->conns[i].closed) {
            struct linger lg = {1, 0};
            setsockopt(f->conns[i].fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
            fconn_close(&f->conns[i]);
        }
    }
}

static void fake_free(struct fake *f)
{
    fake_stop(f);
    for (size_t i = 0; i < f->nconns; i++) {
        free(f->conns[i].in);
        free(f->conns[i].out);
    }
}

/* ---- the scaler side (as scaler/main.c wires it) ------------------------ */

static void retick(struct harness *h);

static void queue_done(void *ud, int status, const long long *lengths, size_t n, const char *err)
{
    struct harness *h = ud;
    h->f->progress++;
    h->queue_in_flight = false;
    int64_t now = clock_mono_ms();
    if (status == 0) {
        FUZZ_CHECK(n == h->queue_n && (n == 0 || lengths != NULL), "queue result shape");
        scaler_state_queue_ok(h->st, lengths, n, now);
    } else {
        FUZZ_CHECK(status < 0 && lengths == NULL && n == 0 && err != NULL, "queue failure shape");
        scaler_state_source_failed(h->st, SOURCE_REDIS_QUEUE, err, now);
    }
    retick(h);
}

static void held_done(void *ud, int status, const long long *held, const long long *queued,
                      const long long *late_ms, const long long *inflight,
                      const long long *silent, size_t n, const char *err)
{
    struct harness *h = ud;
    h->f->progress++;
    h->held_in_flight = false;
    int64_t now = clock_mono_ms();
    if (status == 0) {
        FUZZ_CHECK(n == h->held_n &&
                       (n == 0 || (held != NULL && queued != NULL && late_ms != NULL &&
                                   inflight != NULL && silent != NULL)),
                   "held result shape");
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(late_ms[i] >= -1 && late_ms[i] <= 999999999, "late setting range");
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(inflight[i] >= 0 && silent[i] >= 0, "inflight range");
        scaler_state_held_ok(h->st, held, queued, late_ms, inflight, silent, n, now);
    } else {
        FUZZ_CHECK(status < 0 && held == NULL && queued == NULL && late_ms == NULL &&
                       inflight == NULL && silent == NULL && n == 0 &&
                       err != NULL,
                   "held failure shape");
        scaler_state_source_failed(h->st, SOURCE_REDIS_HELD, err, now);
    }
    retick(h);
}

/* One round of both batches, as redis_timer_cb does. */
static void start_batches(struct harness *h)
{
    if (!redis_source_connected(h->src))
        return;
    if (!h->queue_in_flight && h->rounds_left_queue > 0) {
        const struct redis_queue_query *q = NULL;
        h->queue_n = scaler_state_queue_batch(h->st, &q);
        if (redis_source_queue_lengths(h->src, q, h->queue_n, queue_done, h) == 0) {
            h->queue_in_flight = true;
            h->rounds_left_queue--;
        }
    }
    if (!h->held_in_flight && h->rounds_left_held > 0) {
        const char *const *models = NULL;
        h->held_n = scaler_state_held_batch(h->st, &models);
        if (redis_source_held_counts(h->src, models, h->held_n, clock_unix_ms(), 5000, held_done,
                                     h) == 0) {
            h->held_in_flight = true;
            h->rounds_left_held--;
        }
    }
}

static void on_state(void *ud, bool up)
{
    struct harness *h = ud;
    h->f->progress++;
    if (up)
        start_batches(h);
}

static void on_wake(void *ud, const char *model)
{
    struct harness *h = ud;
    h->f->progress++;
    FUZZ_CHECK(model != NULL && *model, "empty wake");
    scaler_state_wake(h->st, model, NULL, 1, clock_mono_ms());
    retick(h);
}

static void on_change(void *ud, struct target *t, const struct policy_decision *old,
                      const struct policy_decision *now)
{
    (void)ud;
    (void)t;
    (void)old;
    FUZZ_CHECK(now->desired >= 0 && now->desired <= POLICY_MAX_REPLICAS, "desired %ld",
               (long)now->desired);
}

/* Decisions are re-made with the new inputs; on_change checks their range. */
static void retick(struct harness *h)
{
    scaler_state_tick(h->st, clock_mono_ms());
}

static void add_target(struct scaler_state *st, const char *name, const char *const *kv, size_t n)
{
    const char *keys[4], *values[4];
    for (size_t i = 0; i < n; i++) {
        keys[i] = kv[2 * i];
        values[i] = kv[2 * i + 1];
    }
    struct scaler_spec spec;
    char err[128];
    if (metadata_parse(keys, values, n, &spec, NULL, NULL, err, sizeof(err)) != 0)
        return;
    scaler_state_upsert(st, "ns", name, &spec, clock_mono_ms());
    metadata_spec_finish(&spec);
}

static void run(const uint8_t *data, size_t size, bool checks)
{
    uint8_t opts = size ? data[0] : 0;
    struct fake f;
    memset(&f, 0, sizeof(f));
    f.raw = raw_mode;
    f.lfd = -1;
    for (size_t off = size ? 1 : 0; off < size;) {
        bool sub = data[off++] & 1;
        size_t n = 0;
        if (off + 2 <= size) {
            n = ((size_t)data[off] << 8) | data[off + 1];
            off += 2;
        } else {
            off = size;
        }
        if (n > size - off)
            n = size - off;
        struct record *r = sub ? (f.nsub < MAX_RECORDS ? &f.sub[f.nsub++] : NULL)
                               : (f.ncmd < MAX_RECORDS ? &f.cmd[f.ncmd++] : NULL);
        if (r) {
            r->p = data + off;
            r->len = n;
        }
        off += n;
    }

    struct harness h;
    memset(&h, 0, sizeof(h));
    h.f = &f;
    h.rounds_left_queue = h.rounds_left_held = (opts & 4) ? 2 : 1;
    f.base = event_base_new();
    if (!f.base)
        fuzz_fail(__FILE__, __LINE__, "event_base_new failed");
    struct scaler_state_config sc = {.staleness_limit_ms = 60000,
                                     .scale_down_window_ms = 300000,
                                     .bursty_scale_down_window_ms = 300000,
                                     .wake_hold_ms = 5000,
                                     .target_expiry_ms = 3600000};
    h.st = scaler_state_new(&sc, clock_mono_ms(), on_change, &h);
    if (!h.st)
        goto out;
    static const char *const kv_a[] = {"model", "llama-8b"};
    static const char *const kv_b[] = {"model", "qwen", "redisKey", "q:qwen", "redisStreamGroup",
                                       "workers"};
    add_target(h.st, "a", kv_a, 1);
    if (opts & 2)
        add_target(h.st, "b", kv_b, 3);
    int port = fake_listen(&f);
    char url[128];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d%s", port, (opts & 1) ? "/3" : "");
    struct redis_source_callbacks cbs = {on_wake, on_state};
    char err[256];
    /* Long timeouts: runs end by the fake server closing, never by a timer. */
    h.src = redis_source_new(f.base, url, 60000, &cbs, &h, err, sizeof(err));
    if (!h.src) {
        FUZZ_CHECK(!checks, "redis_source_new: %s", err);
        goto out;
    }
    int quiet = 0;
    bool stopped = false;
    for (int turn = 0; turn < 20000; turn++) {
        uint64_t before = f.progress;
        for (size_t i = 0; i < f.nconns; i++)
            if (!f.conns[i].closed)
                fconn_flush(&f.conns[i]);
        event_base_loop(f.base, EVLOOP_NONBLOCK);
        if (f.progress != before) {
            quiet = 0;
            continue;
        }
        if (++quiet < 3)
            continue;
        if (stopped)
            break;
        /* Nothing moves: Redis goes away; let the source see it. */
        fake_stop(&f);
        stopped = true;
        quiet = 0;
    }
    if (checks) {
        FUZZ_CHECK(stopped, "the run never went quiet");
        FUZZ_CHECK(!redis_source_connected(h.src), "connected after the server closed");
    }

out:
    redis_source_free(h.src);
    fake_free(&f);
    scaler_state_free(h.st);
    event_base_free(f.base);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    fuzz_run_with_oom(run, data, size);
    return 0;
}
