/* Integration test: redis_source against a real redis-server started here on a
 * free loopback port in a temp dir (with a password, so AUTH and SELECT are
 * exercised). Everything runs on one libevent loop with deadlines. Redis is
 * killed and restarted on purpose in the middle; at the end (and on every
 * exit path we control) it is stopped and the temp dir removed, and
 * PR_SET_PDEATHSIG covers a crash of this process. */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc.h"
#include "clock.h"
#include "peer_proc.h"
#include "redis_guard.h"
#include "redis_source.h"

/* '@' and '/' in the password exercise the URL parser (last '@', %2F). */
#define PASSWORD "s3cr@t/pw"
#define URL_USERINFO ":s3cr@t%2Fpw"
#define DB 2

static const char *redis_bin = "/usr/bin/redis-server";
static char tmpdir[256];
static volatile pid_t redis_pid = -1;
static int redis_port;
static long slow = 1; /* deadline multiplier under valgrind */
static struct event_base *base;
static bool in_call; /* set around API calls: callbacks must not run then */
static int reentrant_calls;

/* ------------------------------------------------------------ redis process */

static void redis_stop(int sig)
{
    peer_stop(&redis_pid, sig, 10000);
}

static void remove_tmpdir(void)
{
    peer_remove_dir(tmpdir);
}

static void on_fatal_signal(int sig)
{
    /* Only async-signal-safe calls here; the temp dir may be left behind. */
    pid_t pid = redis_pid;
    if (pid > 0)
        kill(pid, SIGKILL);
    static const char msg[] = "test_redis_source: fatal signal or global deadline, redis killed\n";
    ssize_t w = write(2, msg, sizeof(msg) - 1);
    (void)w;
    _exit(1);
}

static void dump_redis_log(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/redis.log", tmpdir);
    peer_dump_log(path);
}

static bool reply_ok(redisReply *r)
{
    return r && r->type != REDIS_REPLY_ERROR;
}

/* A blocking connection for setting up data, AUTHed, on DB. NULL on failure. */
static redisContext *sync_connect(void)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", redis_port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    redisReply *r = redisCommand(c, "AUTH %s", PASSWORD);
    bool ok = reply_ok(r);
    freeReplyObject(r);
    if (ok) {
        r = redisCommand(c, "SELECT %d", DB);
        ok = reply_ok(r);
        freeReplyObject(r);
    }
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    return c;
}

static bool redis_start(void)
{
    char portbuf[16];
    snprintf(portbuf, sizeof(portbuf), "%d", redis_port);
    char path[512];
    snprintf(path, sizeof(path), "%s/redis.log", tmpdir);
    char *const argv[] = {"redis-server", "--port", portbuf, "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", tmpdir, "--requirepass", PASSWORD,
                          "--enable-debug-command", "local", NULL};
    pid_t pid = peer_spawn(path, redis_bin, argv);
    if (pid < 0)
        return false;
    redis_pid = pid;
    int64_t deadline = clock_mono_ms() + 10000;
    while (clock_mono_ms() < deadline) {
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            redis_pid = -1;
            return false;
        }
        redisContext *c = sync_connect();
        if (c) {
            redisFree(c);
            return true;
        }
        usleep(20000);
    }
    return false;
}

/* Runs one command; true unless it failed or Redis answered an error. */
static bool cmd(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    bool ok = reply_ok(r);
    if (!ok)
        fprintf(stderr, "redis command failed: %s: %s\n", fmt, r && r->str ? r->str : c->errstr);
    freeReplyObject(r);
    return ok;
}

/* The integer reply of one command, or LLONG_MIN. */
static long long cmd_int(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : LLONG_MIN;
    freeReplyObject(r);
    return v;
}

/* Sends a command without waiting for its answer (for DEBUG SLEEP). */
static bool cmd_send_only(redisContext *c, const char *text)
{
    if (redisAppendCommand(c, text) != REDIS_OK)
        return false;
    int done = 0;
    while (!done) {
        if (redisBufferWrite(c, &done) != REDIS_OK)
            return false;
    }
    return true;
}

static long long numsub_wake(redisContext *c)
{
    redisReply *r = redisCommand(c, "PUBSUB NUMSUB thaw:wake");
    long long v = -1;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_INTEGER)
        v = r->element[1]->integer;
    freeReplyObject(r);
    return v;
}

/* calls= of one command in INFO commandstats, or -1. */
static long long server_calls(redisContext *c, const char *name)
{
    redisReply *r = redisCommand(c, "INFO commandstats");
    long long v = -1;
    if (r && r->type == REDIS_REPLY_STRING) {
        char needle[64];
        snprintf(needle, sizeof(needle), "cmdstat_%s:calls=", name);
        const char *p = strstr(r->str, needle);
        v = p ? strtoll(p + strlen(needle), NULL, 10) : 0;
    }
    freeReplyObject(r);
    return v;
}

/* ------------------------------------------------------------------- loop */

static int64_t deadline_in(long ms) { return clock_mono_ms() + ms * slow; }

/* Runs the loop for up to ~10 ms (less if a callback breaks it). False once
 * the deadline has passed. */
static bool spin(int64_t deadline)
{
    if (clock_mono_ms() >= deadline)
        return false;
    struct timeval tv = {0, 10000};
    event_base_loopexit(base, &tv);
    event_base_dispatch(base);
    return true;
}

static void spin_for(long ms)
{
    int64_t dl = clock_mono_ms() + ms;
    while (spin(dl)) {
    }
}

/* ------------------------------------------------------------- callbacks */

struct src_state {
    const char *name;
    int ups;
    int downs;
    bool up;
    int wakes;
    char wake[256];
    int64_t wake_us;
    /* Free-from-callback tests: free *self in that callback. */
    struct redis_source **self;
    bool free_on_wake;
    bool free_on_up;
};

static void on_wake(void *ud, const char *model)
{
    struct src_state *s = ud;
    if (in_call)
        reentrant_calls++;
    s->wake_us = clock_mono_us();
    s->wakes++;
    snprintf(s->wake, sizeof(s->wake), "%s", model);
    if (s->free_on_wake && s->self && *s->self) {
        redis_source_free(*s->self);
        *s->self = NULL;
    }
    event_base_loopbreak(base);
}

static void on_state(void *ud, bool up)
{
    struct src_state *s = ud;
    if (in_call)
        reentrant_calls++;
    s->up = up;
    if (up)
        s->ups++;
    else
        s->downs++;
    if (up && s->free_on_up && s->self && *s->self) {
        redis_source_free(*s->self);
        *s->self = NULL;
    }
    event_base_loopbreak(base);
}

static const struct redis_source_callbacks callbacks = {.on_wake = on_wake, .on_state = on_state};

struct result {
    int calls;
    int status;
    size_t n;
    long long *vals;
    long long *queued; /* held batches: the queued counts */
    long long *late;   /* held batches: the late settings */
    long long *inflight; /* held batches: the in-flight counts */
    long long *silent;   /* held batches: the silent counts */
    char err[256];
    /* Chaining test: start another queue batch from inside the callback. */
    struct redis_source *chain_src;
    const struct redis_queue_query *chain_q;
    size_t chain_n;
    int chain_left;
    int chain_rc;
    /* Free-from-callback test. */
    struct redis_source **free_self;
};

static void result_reset(struct result *r)
{
    thaw_free(r->vals);
    thaw_free(r->queued);
    thaw_free(r->late);
    thaw_free(r->inflight);
    thaw_free(r->silent);
    memset(r, 0, sizeof(*r));
}

static void on_result(void *ud, int status, const long long *vals, size_t n, const char *err)
{
    struct result *r = ud;
    if (in_call)
        reentrant_calls++;
    r->calls++;
    r->status = status;
    r->n = n;
    thaw_free(r->vals);
    r->vals = NULL;
    if (status == 0 && n > 0) {
        r->vals = thaw_calloc(n, sizeof(*r->vals));
        if (r->vals)
            memcpy(r->vals, vals, n * sizeof(*vals));
    }
    if (status == 0 && (n > 0) != (vals != NULL))
        r->status = -99; /* contract: lengths NULL only when failed or empty */
    if (status != 0 && vals != NULL)
        r->status = -98;
    snprintf(r->err, sizeof(r->err), "%s", err ? err : "");
    if (r->chain_left > 0) {
        r->chain_left--;
        r->chain_rc = redis_source_queue_lengths(r->chain_src, r->chain_q, r->chain_n, on_result, r);
    }
    if (r->free_self && *r->free_self) {
        redis_source_free(*r->free_self);
        *r->free_self = NULL;
    }
    event_base_loopbreak(base);
}

static int queue(struct redis_source *src, const struct redis_queue_query *q, size_t n,
                 struct result *r)
{
    in_call = true;
    int rc = redis_source_queue_lengths(src, q, n, on_result, r);
    in_call = false;
    return rc;
}

/* The held results as a queue result, plus copies of the queued counts and
 * the late settings. */
static void on_held_result(void *ud, int status, const long long *held, const long long *queued,
                           const long long *late_ms, const long long *inflight,
                           const long long *silent, size_t n, const char *err)
{
    struct result *r = ud;
    thaw_free(r->queued);
    thaw_free(r->late);
    thaw_free(r->inflight);
    thaw_free(r->silent);
    r->queued = NULL;
    r->late = NULL;
    r->inflight = NULL;
    r->silent = NULL;
    if (status == 0 && n > 0 && queued && late_ms && inflight && silent) {
        r->queued = thaw_calloc(n, sizeof(*r->queued));
        r->late = thaw_calloc(n, sizeof(*r->late));
        r->inflight = thaw_calloc(n, sizeof(*r->inflight));
        r->silent = thaw_calloc(n, sizeof(*r->silent));
        if (r->silent)
            memcpy(r->silent, silent, n * sizeof(*silent));
        if (r->queued)
            memcpy(r->queued, queued, n * sizeof(*queued));
        if (r->late)
            memcpy(r->late, late_ms, n * sizeof(*late_ms));
        if (r->inflight)
            memcpy(r->inflight, inflight, n * sizeof(*inflight));
    }
    if ((status == 0 && ((n > 0) != (queued != NULL) || (n > 0) != (late_ms != NULL) ||
                         (n > 0) != (inflight != NULL) || (n > 0) != (silent != NULL))) ||
        (status != 0 &&
         (queued != NULL || late_ms != NULL || inflight != NULL || silent != NULL))) {
        on_result(ud, status, held, n, err);
        r->status = -97; /* contract: queued present exactly when held is */
        return;
    }
    on_result(ud, status, held, n, err);
}

static int held(struct redis_source *src, const char *const *models, size_t n, int64_t now,
                int64_t fresh, struct result *r)
{
    in_call = true;
    int rc = redis_source_held_counts(src, models, n, now, fresh, on_held_result, r);
    in_call = false;
    return rc;
}

static bool wait_result(struct result *r, int calls, long ms)
{
    int64_t dl = deadline_in(ms);
    while (r->calls < calls && spin(dl)) {
    }
    return r->calls >= calls;
}

static bool wait_up(struct src_state *s, bool up, long ms)
{
    int64_t dl = deadline_in(ms);
    while (s->up != up && spin(dl)) {
    }
    return s->up == up;
}

static struct redis_source *new_source(long timeout_ms, struct src_state *st)
{
    char url[256], err[256] = "";
    snprintf(url, sizeof(url), "redis://%s@127.0.0.1:%d/%d", URL_USERINFO, redis_port, DB);
    in_call = true;
    struct redis_source *src = redis_source_new(base, url, timeout_ms, &callbacks, st, err,
                                                sizeof(err));
    in_call = false;
    if (!src)
        fprintf(stderr, "redis_source_new: %s\n", err);
    return src;
}

/* ------------------------------------------------------------------ tests */

static struct redis_source *msrc;
static struct src_state mstate = {.name = "main"};
static redisContext *sc; /* setup connection */

static void test_url_errors(void)
{
    static const char *const bad[] = {
        "http://127.0.0.1:6379", "redis://", "redis://:pw@", "redis://h:0", "redis://h:65536",
        "redis://h:12ab", "redis://h/x", "redis://h/1?x=1", "rediss://h", "redis://pw@h",
        "redis://[::1", "redis://:%zz@h", "redis://:%00@h", "redis://h:",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "";
        struct redis_source *s = redis_source_new(base, bad[i], 1000, &callbacks, NULL, err,
                                                  sizeof(err));
        CHECK(s == NULL && err[0] != '\0', "url %s accepted (err '%s')", bad[i], err);
        redis_source_free(s);
    }
    char err[256] = "";
    struct redis_source *s = redis_source_new(base, NULL, 1000, &callbacks, NULL, err, sizeof(err));
    CHECK(s == NULL && err[0], "NULL url accepted");
    s = redis_source_new(base, "redis://127.0.0.1:1", 0, &callbacks, NULL, err, sizeof(err));
    CHECK(s == NULL && err[0], "timeout 0 accepted");

    /* Good URLs: created (connecting in the background), freed before the
     * loop ever runs, so no callback may happen. */
    static const char *const good[] = {
        "redis://127.0.0.1", "redis://127.0.0.1:1/", "redis://:pw@127.0.0.1:1/15",
        "redis://user:p%40ss@127.0.0.1:1", "redis://[::1]:1/0", "REDIS://localhost:1",
    };
    struct src_state st = {.name = "url"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        err[0] = '\0';
        s = redis_source_new(base, good[i], 1000, &callbacks, &st, err, sizeof(err));
        CHECK(s != NULL, "url %s refused: %s", good[i], err);
        CHECK(!redis_source_connected(s), "connected at once");
        redis_source_free(s);
    }
    spin_for(50);
    CHECK(st.ups == 0 && st.downs == 0 && st.wakes == 0, "callback after free");
    redis_source_free(NULL);
}

static void test_connect(void)
{
    msrc = new_source(2000, &mstate);
    CHECK(msrc != NULL, "new failed");
    if (!msrc)
        return;
    CHECK(!redis_source_connected(msrc), "connected before the loop ran");
    CHECK(mstate.ups == 0, "on_state called from inside new");
    CHECK(wait_up(&mstate, true, 5000), "not connected within 5 s");
    CHECK(redis_source_connected(msrc), "connected() false after on_state(true)");
    CHECK(mstate.ups == 1 && mstate.downs == 0, "ups=%d downs=%d", mstate.ups, mstate.downs);
}

static void test_bad_password(void)
{
    char url[256], err[256] = "";
    snprintf(url, sizeof(url), "redis://:wrong@127.0.0.1:%d/%d", redis_port, DB);
    struct src_state st = {.name = "badpw"};
    struct redis_source *s = redis_source_new(base, url, 1000, &callbacks, &st, err, sizeof(err));
    CHECK(s != NULL, "new: %s", err);
    if (!s)
        return;
    spin_for(800);
    struct redis_source_stats stats;
    redis_source_get_stats(s, &stats);
    CHECK(!redis_source_connected(s) && st.ups == 0, "connected with a wrong password");
    CHECK(stats.reconnects >= 1, "no retry after an AUTH failure (reconnects=%" PRIu64 ")",
          stats.reconnects);
    struct result r = {0};
    struct redis_queue_query q = {.key = "x"};
    CHECK(queue(s, &q, 1, &r) == -1, "batch accepted while not connected");
    redis_source_free(s);
}

static void test_queue_types(void)
{
    bool ok = cmd(sc, "FLUSHDB") && cmd(sc, "RPUSH q:list a b c") &&
              cmd(sc, "ZADD q:zset 1 a 2 b") && cmd(sc, "SET q:str v") &&
              cmd(sc, "HSET q:hash f v") && cmd(sc, "SADD q:set a");
    for (int i = 0; i < 4; i++)
        ok = ok && cmd(sc, "XADD q:stream * f %d", i);
    /* q:gs: 7 entries, group g at 0 and g2 at $, then 2 more (XLEN 9).
     * g reads 3 and acks 1: pending 2, lag 9-3 = 6 -> 8.
     * g2 reads 1 of its 2: pending 1, lag 1 -> 2. */
    for (int i = 0; i < 7; i++)
        ok = ok && cmd(sc, "XADD q:gs * f %d", i);
    ok = ok && cmd(sc, "XGROUP CREATE q:gs g 0") && cmd(sc, "XGROUP CREATE q:gs g2 $");
    for (int i = 0; i < 2; i++)
        ok = ok && cmd(sc, "XADD q:gs * f %d", 7 + i);
    ok = ok && cmd(sc, "XREADGROUP GROUP g c1 COUNT 3 STREAMS q:gs >") &&
         cmd(sc, "XREADGROUP GROUP g2 c1 COUNT 1 STREAMS q:gs >");
    redisReply *first = redisCommand(sc, "XRANGE q:gs - + COUNT 1");
    ok = ok && first && first->type == REDIS_REPLY_ARRAY && first->elements == 1;
    if (ok)
        ok = cmd_int(sc, "XACK q:gs g %s", first->element[0]->element[0]->str) == 1;
    freeReplyObject(first);
    /* q:nil: deleting an undelivered entry makes Redis 7.0 report lag nil;
     * the entries after the group's position are counted: 2 + 2 = 4. */
    for (int i = 1; i <= 5; i++)
        ok = ok && cmd(sc, "XADD q:nil %d-1 f %d", i, i);
    ok = ok && cmd(sc, "XGROUP CREATE q:nil g 0") &&
         cmd(sc, "XREADGROUP GROUP g c1 COUNT 2 STREAMS q:nil >") &&
         cmd_int(sc, "XDEL q:nil 4-1") == 1;
    /* q:big: group created at $ after 10 entries, then 1500 more, 1 read:
     * lag nil, more than 1000 to count, so the bound applies:
     * pending 1 + XLEN 1510 (entries-read is nil too) = 1511; the truth is 1500. */
    for (int i = 0; i < 10; i++)
        ok = ok && cmd(sc, "XADD q:big * f %d", i);
    ok = ok && cmd(sc, "XGROUP CREATE q:big g $");
    for (int i = 0; i < 1500; i++)
        redisAppendCommand(sc, "XADD q:big * f %d", i);
    for (int i = 0; i < 1500; i++) {
        redisReply *rep = NULL;
        if (redisGetReply(sc, (void **)&rep) != REDIS_OK || !reply_ok(rep))
            ok = false;
        freeReplyObject(rep);
    }
    ok = ok && cmd(sc, "XREADGROUP GROUP g c1 COUNT 1 STREAMS q:big >");
    CHECK(ok, "setup failed");
    /* Make sure the fallback is what gets exercised. */
    static const char *const nil_lag[][2] = {{"q:nil", "g"}, {"q:gs", "g2"}, {"q:big", "g"}};
    for (size_t k = 0; k < 3; k++) {
        redisReply *gi = redisCommand(sc, "XINFO GROUPS %s", nil_lag[k][0]);
        bool lag_nil = false;
        for (size_t i = 0; gi && gi->type == REDIS_REPLY_ARRAY && i < gi->elements; i++) {
            redisReply *g = gi->element[i];
            bool ours = false;
            for (size_t j = 0; j + 1 < g->elements; j += 2) {
                if (strcmp(g->element[j]->str, "name") == 0)
                    ours = strcmp(g->element[j + 1]->str, nil_lag[k][1]) == 0;
                if (ours && strcmp(g->element[j]->str, "lag") == 0)
                    lag_nil = g->element[j + 1]->type == REDIS_REPLY_NIL;
            }
        }
        freeReplyObject(gi);
        CHECK(lag_nil, "Redis reports a lag for %s/%s: the fallback is not exercised",
              nil_lag[k][0], nil_lag[k][1]);
    }

    const struct redis_queue_query q[] = {
        {"q:list", NULL},   {"q:zset", NULL},  {"q:stream", NULL}, {"q:gs", "g"},
        {"q:gs", "g2"},     {"q:gs", NULL},    {"q:gs", "nog"},    {"q:nil", "g"},
        {"q:missing", NULL}, {"q:str", NULL},  {"q:hash", NULL},   {"q:set", NULL},
        {"q:list", "g"},    {"q:missing", "g"}, {"q:big", "g"},  {"q:big", NULL},
    };
    /* q:gs/nog: no such group, so the whole stream (9) as -2 - 9. */
    const long long want[] = {3, 2, 4, 8, 2, 9, -11, 4, 0, -1, -1, -1, 3, 0, 1511, 1510};
    size_t n = sizeof(q) / sizeof(q[0]);
    struct result r = {0};
    CHECK(queue(msrc, q, n, &r) == 0, "queue_lengths not sent");
    CHECK(r.calls == 0, "callback ran inside the call");
    CHECK(wait_result(&r, 1, 3000), "no answer");
    CHECK(r.status == 0 && r.n == n && r.vals, "status %d n %zu err %s", r.status, r.n, r.err);
    for (size_t i = 0; r.vals && i < n && r.n == n; i++)
        CHECK(r.vals[i] == want[i], "%s group %s: got %lld want %lld", q[i].key,
              q[i].group ? q[i].group : "-", r.vals[i], want[i]);
    result_reset(&r);
}

static void test_many_keys(void)
{
    enum { N = 2000 };
    for (int i = 0; i < N; i++)
        redisAppendCommand(sc, "RPUSH k:%d %s", i, "x");
    for (int i = 0; i < N; i++)
        redisAppendCommand(sc, i % 5 ? "RPUSH k:%d a b c d e f g h i j" : "DEL k:%d", i);
    bool ok = true;
    for (int i = 0; i < 2 * N; i++) {
        redisReply *rep = NULL;
        if (redisGetReply(sc, (void **)&rep) != REDIS_OK || !reply_ok(rep))
            ok = false;
        freeReplyObject(rep);
    }
    CHECK(ok, "setup of %d lists failed", N);

    static char names[N][16];
    static struct redis_queue_query q[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "k:%d", i);
        q[i].key = names[i];
        q[i].group = NULL;
    }
    struct redis_source_stats before, after;
    redis_source_get_stats(msrc, &before);
    long long ev_before = server_calls(sc, "evalsha");
    struct result r = {0};
    int64_t t0 = clock_mono_us();
    CHECK(queue(msrc, q, N, &r) == 0, "not sent");
    CHECK(wait_result(&r, 1, 5000), "no answer");
    int64_t took = clock_mono_us() - t0;
    redis_source_get_stats(msrc, &after);
    long long ev_after = server_calls(sc, "evalsha");
    CHECK(r.status == 0 && r.n == N, "status %d n %zu err %s", r.status, r.n, r.err);
    int wrong = 0;
    for (int i = 0; r.vals && i < N && r.n == N; i++) {
        long long want = i % 5 ? 11 : 0;
        if (r.vals[i] != want)
            wrong++;
    }
    CHECK(r.vals && wrong == 0, "%d of %d lengths wrong", wrong, N);
    CHECK(after.round_trips - before.round_trips == 1, "round trips %" PRIu64,
          after.round_trips - before.round_trips);
    CHECK(after.commands - before.commands == 2, "commands %" PRIu64,
          after.commands - before.commands);
    CHECK(ev_after - ev_before == 2, "redis saw %lld EVALSHA calls", ev_after - ev_before);
    printf("2000 keys: 1 batch = %" PRIu64 " round trip, %" PRIu64 " commands (redis counted %lld"
           " EVALSHA), %.2f ms\n",
           after.round_trips - before.round_trips, after.commands - before.commands,
           ev_after - ev_before, (double)took / 1000.0);
    result_reset(&r);
}

static void test_noscript(void)
{
    CHECK(cmd(sc, "SCRIPT FLUSH"), "SCRIPT FLUSH");
    const struct redis_queue_query q[] = {{"q:list", NULL}, {"q:zset", NULL}};
    const char *const models[] = {"none"};
    struct redis_source_stats before, after;
    for (int round = 0; round < 2; round++) {
        redis_source_get_stats(msrc, &before);
        struct result r = {0}, h = {0};
        CHECK(queue(msrc, q, 2, &r) == 0, "not sent");
        CHECK(held(msrc, models, 1, clock_unix_ms(), 1000, &h) == 0, "not sent");
        CHECK(wait_result(&r, 1, 3000) && wait_result(&h, 1, 3000), "no answer");
        redis_source_get_stats(msrc, &after);
        CHECK(r.status == 0 && r.vals && r.vals[0] == 3 && r.vals[1] == 2,
              "round %d: status %d err %s", round, r.status, r.err);
        CHECK(h.status == 0 && h.vals && h.vals[0] == 0, "round %d: held status %d err %s", round,
              h.status, h.err);
        CHECK(after.round_trips - before.round_trips == 2, "round trips");
        /* After a flush EVALSHA fails once per script and EVAL runs (and
         * caches the script again). */
        uint64_t want = round == 0 ? 4 : 2;
        CHECK(after.commands - before.commands == want, "round %d: commands %" PRIu64, round,
              after.commands - before.commands);
        result_reset(&r);
        result_reset(&h);
    }
}

static void test_held(void)
{
    int64_t now = clock_unix_ms();
    int64_t fresh = 30000;
    bool ok = cmd(sc, "HSET thaw:held:m1 a 3:%" PRId64 " b 4:%" PRId64 " c 5:%" PRId64
                      " d garbage e 7: f :5 g -2:%" PRId64 " h 1234567890:%" PRId64
                      " i 2:%" PRId64 " j 1:2:3",
                  now, now - 1000, now - 60000, now, now, now + 5000);
    /* Queued at a concurrency cap: a third number. */
    ok = ok && cmd(sc, "HSET thaw:held:m5 a 0:%" PRId64 ":4 b 2:%" PRId64 ":3 c 1:%" PRId64
                       ":9 d 1:%" PRId64 ":12345678901 e 0:%" PRId64 ":x",
                   now, now, now - 60000, now, now);
    /* The activators' lateAfterSeconds with their queue: a fourth number. */
    ok = ok && cmd(sc, "HSET thaw:held:m6 a 0:%" PRId64 ":4:1000 b 0:%" PRId64 ":3:500 c 1:%" PRId64
                       " d 0:%" PRId64 ":2:1234567890 e 0:%" PRId64 ":0:100",
                   now, now, now, now, now);
    ok = ok && cmd(sc, "HSET thaw:held:m7 a 0:%" PRId64 ":4:1000 b 0:%" PRId64 ":2", now, now);
    ok = ok && cmd(sc, "HSET thaw:held:m8 a 0:%" PRId64 ":3:0 b 0:%" PRId64 ":1:2000", now, now);
    /* Parts after the fourth (a later activator's) are skipped, not the
     * field; trailing garbage still makes a field unreadable, and so does a
     * value over 256 bytes (f: about 330). */
    static char longer[160];
    memset(longer, '7', sizeof(longer) - 1);
    ok = ok && cmd(sc, "HSET thaw:held:m9 a 0:%" PRId64 ":5:300:77 b 0:%" PRId64
                       ":2:400:1:beta c 0:%" PRId64 ":8:100x d 0:%" PRId64 ":16:xyz"
                       " e 0:%" PRId64 ":1:200:%s f 0:%" PRId64 ":32:50:%s%s",
                   now, now, now, now, now, longer, now, longer, longer);
    /* Requests in a backend: a fifth number (stale, 10-digit and empty ones
     * not counted; the field's other parts still are). */
    ok = ok && cmd(sc, "HSET thaw:held:m10 a 0:%" PRId64 ":0:0:5 b 2:%" PRId64 ":0:0:3 c 0:%" PRId64
                       ":0:0:9 d 0:%" PRId64 ":0:0:1234567890 e 1:%" PRId64 ":0:0: f 0:%" PRId64
                       ":0:0:7x",
                   now, now, now - 60000, now, now, now);
    ok = ok && cmd(sc, "HSET thaw:held:m3 x 9:%" PRId64 " y 2:%" PRId64, now - 31000, now - 660000) &&
         cmd(sc, "SET thaw:held:m4 5:%" PRId64, now);
    enum { BULK = 1200 };
    for (int i = 0; i < BULK; i++)
        redisAppendCommand(sc, "HSET thaw:held:b%d x %d:%" PRId64 " y 1:%" PRId64, i, i % 4, now,
                           now - 40000);
    for (int i = 0; i < BULK; i++) {
        redisReply *rep = NULL;
        if (redisGetReply(sc, (void **)&rep) != REDIS_OK || !reply_ok(rep))
            ok = false;
        freeReplyObject(rep);
    }
    CHECK(ok, "held setup failed");

    static char names[BULK][16];
    static const char *models[10 + BULK];
    models[0] = "m1"; /* 3 + 4 + 2: stale, malformed, negative, 10-digit ignored */
    models[1] = "m2"; /* missing */
    models[2] = "m3"; /* only stale */
    models[3] = "m4"; /* not a hash */
    for (int i = 0; i < BULK; i++) {
        snprintf(names[i], sizeof(names[i]), "b%d", i);
        models[4 + i] = names[i];
    }
    models[4 + BULK] = "m5"; /* held 0 + 2, queued 4 + 3: stale, 10-digit, malformed ignored */
    models[5 + BULK] = "m6"; /* queued 4 + 3, late min(1000, 500): no queue, 10-digit ignored */
    models[6 + BULK] = "m7"; /* queued 4 + 2, late 1000: a three-part field does not say */
    models[7 + BULK] = "m8"; /* queued 3 + 1, late 0: one activator says FIFO */
    models[8 + BULK] = "m9"; /* queued 5 + 2 + 1, late 200: later parts skipped, garbage not */
    models[9 + BULK] = "m10"; /* held 2 + 1, in flight 5 + 3 (not 9: stale, 10 digits, 7x) */
    struct redis_source_stats before, after;
    redis_source_get_stats(msrc, &before);
    struct result r = {0};
    CHECK(held(msrc, models, 10 + BULK, now, fresh, &r) == 0, "not sent");
    CHECK(r.calls == 0, "callback inside the call");
    CHECK(wait_result(&r, 1, 5000), "no answer");
    redis_source_get_stats(msrc, &after);
    CHECK(r.status == 0 && r.n == 10 + BULK && r.vals && r.queued && r.late && r.inflight &&
              r.silent,
          "status %d err %s", r.status, r.err);
    if (r.vals && r.queued && r.late && r.inflight && r.silent && r.n == 10 + BULK) {
        CHECK(r.vals[0] == 9 && r.queued[0] == 0 && r.late[0] == -1, "m1 %lld %lld %lld",
              r.vals[0], r.queued[0], r.late[0]);
        CHECK(r.vals[4 + BULK] == 2 && r.queued[4 + BULK] == 7 && r.late[4 + BULK] == -1,
              "m5 held %lld queued %lld late %lld", r.vals[4 + BULK], r.queued[4 + BULK],
              r.late[4 + BULK]);
        CHECK(r.vals[5 + BULK] == 1 && r.queued[5 + BULK] == 7 && r.late[5 + BULK] == 500,
              "m6 held %lld queued %lld late %lld", r.vals[5 + BULK], r.queued[5 + BULK],
              r.late[5 + BULK]);
        CHECK(r.queued[6 + BULK] == 6 && r.late[6 + BULK] == 1000, "m7 queued %lld late %lld",
              r.queued[6 + BULK], r.late[6 + BULK]);
        CHECK(r.queued[7 + BULK] == 4 && r.late[7 + BULK] == 0, "m8 queued %lld late %lld",
              r.queued[7 + BULK], r.late[7 + BULK]);
        CHECK(r.queued[8 + BULK] == 8 && r.late[8 + BULK] == 200, "m9 queued %lld late %lld",
              r.queued[8 + BULK], r.late[8 + BULK]);
        /* m9: 77 (a), 1 (b, parts after the fifth skipped); e's is 159 digits. */
        CHECK(r.inflight[8 + BULK] == 78, "m9 inflight %lld", r.inflight[8 + BULK]);
        CHECK(r.vals[9 + BULK] == 3 && r.inflight[9 + BULK] == 8, "m10 held %lld inflight %lld",
              r.vals[9 + BULK], r.inflight[9 + BULK]);
        CHECK(r.inflight[0] == 0 && r.inflight[1] == 0 && r.inflight[4 + BULK] == 0,
              "inflight without a fifth part: %lld %lld %lld", r.inflight[0], r.inflight[1],
              r.inflight[4 + BULK]);
        /* Silent: readable fields stale by up to 10 minutes or stamped more
         * than fresh ahead (m1: c, 60 s old, and i, 5 s ahead within 30 s
         * fresh, so only c; m3: x, 31 s old, not y, 11 minutes old; m5: c;
         * m10: c). Bulk fields 40 s old count too. */
        CHECK(r.silent[0] == 1 && r.silent[2] == 1 && r.silent[4 + BULK] == 1 &&
                  r.silent[9 + BULK] == 1 && r.silent[1] == 0 && r.silent[3] == 0,
              "silent m1 %lld m3 %lld m5 %lld m10 %lld m2 %lld m4 %lld", r.silent[0],
              r.silent[2], r.silent[4 + BULK], r.silent[9 + BULK], r.silent[1], r.silent[3]);
        CHECK(r.silent[4] == 1 && r.silent[5] == 1, "bulk silent %lld %lld", r.silent[4],
              r.silent[5]);
        CHECK(r.late[1] == -1, "m2 late %lld", r.late[1]);
        CHECK(r.vals[1] == 0, "m2 %lld", r.vals[1]);
        CHECK(r.vals[2] == 0, "m3 %lld", r.vals[2]);
        CHECK(r.vals[3] == 0, "m4 %lld", r.vals[3]);
        int wrong = 0;
        for (int i = 0; i < BULK; i++)
            wrong += r.vals[4 + i] != i % 4;
        CHECK(wrong == 0, "%d bulk counts wrong", wrong);
    }
    CHECK(after.round_trips - before.round_trips == 1 && after.commands - before.commands == 2,
          "round trips %" PRIu64 " commands %" PRIu64, after.round_trips - before.round_trips,
          after.commands - before.commands);
    result_reset(&r);

    /* A narrower window makes b's 1-second-old field stale too, and i's stamp
     * 5 s in the future is now beyond the skew allowance (fresh is two-sided). */
    CHECK(held(msrc, models, 1, now, 500, &r) == 0, "not sent");
    CHECK(wait_result(&r, 1, 3000) && r.status == 0 && r.vals && r.vals[0] == 3,
          "fresh_ms=500: %lld", r.vals ? r.vals[0] : -1);
    result_reset(&r);
}

static void test_batch_rules(void)
{
    const struct redis_queue_query q[] = {{"q:list", NULL}};
    const char *const models[] = {"m1"};
    struct result a = {0}, b = {0}, c = {0}, h = {0};
    CHECK(queue(msrc, q, 1, &a) == 0, "first not sent");
    CHECK(queue(msrc, q, 1, &b) == -1, "second queue batch accepted while one is in flight");
    CHECK(held(msrc, models, 1, clock_unix_ms(), 30000, &h) == 0, "held refused beside queue");
    CHECK(held(msrc, models, 1, clock_unix_ms(), 30000, &c) == -1, "second held batch accepted");
    CHECK(wait_result(&a, 1, 3000) && wait_result(&h, 1, 3000), "no answers");
    spin_for(50);
    CHECK(a.calls == 1 && h.calls == 1 && b.calls == 0 && c.calls == 0,
          "calls a=%d h=%d b=%d c=%d", a.calls, h.calls, b.calls, c.calls);
    CHECK(a.status == 0 && a.vals && a.vals[0] == 3, "queue result");
    CHECK(h.status == 0 && h.vals && h.vals[0] == 9, "held result");
    result_reset(&a);
    result_reset(&h);

    /* Empty batch: accepted, answered later with n == 0. */
    CHECK(queue(msrc, q, 0, &a) == 0, "empty batch refused");
    CHECK(a.calls == 0, "empty batch answered inside the call");
    CHECK(wait_result(&a, 1, 1000) && a.status == 0 && a.n == 0, "empty batch: %d", a.status);
    result_reset(&a);

    /* Bad arguments. */
    CHECK(redis_source_queue_lengths(msrc, q, 1, NULL, NULL) == -1, "NULL cb accepted");
    CHECK(redis_source_queue_lengths(msrc, NULL, 1, on_result, &a) == -1, "NULL q accepted");
    CHECK(redis_source_queue_lengths(msrc, q, REDIS_SOURCE_MAX_KEYS + 1, on_result, &a) == -1,
          "over the key cap accepted");
    const struct redis_queue_query nullkey[] = {{NULL, NULL}};
    CHECK(queue(msrc, nullkey, 1, &a) == -1, "NULL key accepted");
    CHECK(redis_source_queue_lengths(NULL, q, 1, on_result, &a) == -1, "NULL src accepted");

    /* A callback may start the next batch: the slot is free by then. */
    a.chain_src = msrc;
    a.chain_q = q;
    a.chain_n = 1;
    a.chain_left = 3;
    CHECK(queue(msrc, q, 1, &a) == 0, "chain not sent");
    CHECK(wait_result(&a, 4, 3000), "chain: %d calls", a.calls);
    CHECK(a.chain_rc == 0 && a.status == 0 && a.vals && a.vals[0] == 3, "chain rc %d",
          a.chain_rc);
    spin_for(50);
    CHECK(a.calls == 4, "chain: %d calls", a.calls);
    result_reset(&a);
}

static void test_wake(void)
{
    int64_t dl = deadline_in(5000);
    while (numsub_wake(sc) != 1 && spin(dl)) {
    }
    CHECK(numsub_wake(sc) == 1, "subscriber count %lld", numsub_wake(sc));
    enum { ROUNDS = 50 };
    int64_t lat[ROUNDS];
    int got = 0;
    for (int i = 0; i < ROUNDS; i++) {
        char model[32];
        snprintf(model, sizeof(model), "m%d", i + 1);
        int before = mstate.wakes;
        int64_t t0 = clock_mono_us();
        long long receivers = cmd_int(sc, "PUBLISH thaw:wake %s", model);
        int64_t wdl = deadline_in(2000);
        while (mstate.wakes == before && spin(wdl)) {
        }
        if (receivers == 1 && mstate.wakes == before + 1 && strcmp(mstate.wake, model) == 0)
            lat[got++] = mstate.wake_us - t0;
        else
            CHECK(false, "wake %s: receivers %lld wakes %d->%d got '%s'", model, receivers, before,
                  mstate.wakes, mstate.wake);
    }
    CHECK(got == ROUNDS, "%d of %d wakes", got, ROUNDS);
    if (got > 0) {
        for (int i = 1; i < got; i++) { /* insertion sort: tiny */
            int64_t v = lat[i];
            int j = i - 1;
            while (j >= 0 && lat[j] > v) {
                lat[j + 1] = lat[j];
                j--;
            }
            lat[j + 1] = v;
        }
        printf("wake latency (PUBLISH sent -> on_wake, %d messages): min %" PRId64
               " us, median %" PRId64 " us, p90 %" PRId64 " us, max %" PRId64 " us\n",
               got, lat[0], lat[got / 2], lat[got * 9 / 10], lat[got - 1]);
    }
    /* An empty body is dropped; the next message still arrives. */
    int before = mstate.wakes;
    CHECK(cmd_int(sc, "PUBLISH thaw:wake %b", "", (size_t)0) == 1, "publish empty");
    CHECK(cmd_int(sc, "PUBLISH thaw:wake %s", "model with spaces/and:colons") == 1, "publish");
    dl = deadline_in(2000);
    while (mstate.wakes == before && spin(dl)) {
    }
    spin_for(50);
    CHECK(mstate.wakes == before + 1 && strcmp(mstate.wake, "model with spaces/and:colons") == 0,
          "wakes %d->%d '%s'", before, mstate.wakes, mstate.wake);
    struct redis_source_stats st;
    redis_source_get_stats(msrc, &st);
    CHECK(st.wake_messages == (uint64_t)mstate.wakes, "stats %" PRIu64 " vs %d", st.wake_messages,
          mstate.wakes);
}

static void test_timeout(void)
{
    struct src_state tstate = {.name = "timeout"};
    struct redis_source *t = new_source(300, &tstate);
    CHECK(t != NULL, "new");
    if (!t)
        return;
    CHECK(wait_up(&tstate, true, 5000), "timeout source not up");
    redisContext *sleeper = sync_connect();
    CHECK(sleeper && cmd_send_only(sleeper, "DEBUG SLEEP 2"), "DEBUG SLEEP not sent");
    usleep(100000); /* let Redis start sleeping */
    const struct redis_queue_query q[] = {{"q:list", NULL}};
    struct result r = {0};
    int64_t t0 = clock_mono_ms();
    CHECK(queue(t, q, 1, &r) == 0, "not sent");
    CHECK(wait_result(&r, 1, 3000), "no answer at all");
    int64_t took = clock_mono_ms() - t0;
    CHECK(r.status < 0 && strcmp(r.err, "timeout") == 0, "status %d err '%s'", r.status, r.err);
    CHECK(took >= 250 && took <= 1500 * slow, "timed out after %" PRId64 " ms", took);
    CHECK(tstate.downs == 1 && !redis_source_connected(t), "downs %d", tstate.downs);
    printf("timeout: batch failed with \"%s\" after %" PRId64 " ms (timeout 300 ms)\n", r.err,
           took);
    result_reset(&r);
    /* Redis wakes up after 2 s; the source comes back by itself. */
    CHECK(wait_up(&tstate, true, 10000), "no recovery after the timeout");
    CHECK(queue(t, q, 1, &r) == 0, "not sent after recovery");
    CHECK(wait_result(&r, 1, 3000) && r.status == 0 && r.vals && r.vals[0] == 3,
          "after recovery: status %d err %s", r.status, r.err);
    result_reset(&r);
    struct redis_source_stats st;
    redis_source_get_stats(t, &st);
    CHECK(st.failures >= 1 && st.reconnects >= 1, "failures %" PRIu64 " reconnects %" PRIu64,
          st.failures, st.reconnects);
    if (sleeper) {
        redisReply *rep = NULL;
        if (redisGetReply(sleeper, (void **)&rep) == REDIS_OK)
            freeReplyObject(rep);
        redisFree(sleeper);
    }
    redis_source_free(t);
    /* The main source saw none of this. */
    CHECK(mstate.downs == 0 && redis_source_connected(msrc), "main source disturbed");
}

static void test_kill_restart(void)
{
    /* A batch in flight when Redis dies: it fails, the state goes down. */
    CHECK(cmd_send_only(sc, "DEBUG SLEEP 1"), "DEBUG SLEEP");
    usleep(100000);
    const struct redis_queue_query q[] = {{"q:list", NULL}, {"r:list", NULL}};
    struct result r = {0};
    int downs = mstate.downs;
    CHECK(queue(msrc, q, 2, &r) == 0, "not sent");
    redis_stop(SIGKILL);
    redisFree(sc);
    sc = NULL;
    CHECK(wait_result(&r, 1, 3000), "in-flight batch not failed");
    CHECK(r.status < 0 && strncmp(r.err, "connection lost", 15) == 0, "status %d err '%s'",
          r.status, r.err);
    CHECK(wait_up(&mstate, false, 3000) && mstate.downs == downs + 1,
          "on_state(false) missing (downs %d -> %d)", downs, mstate.downs);
    CHECK(!redis_source_connected(msrc), "still connected");
    result_reset(&r);
    CHECK(queue(msrc, q, 2, &r) == -1, "batch accepted while down");
    struct redis_source_stats s0, s1;
    redis_source_get_stats(msrc, &s0);
    spin_for(1000);
    redis_source_get_stats(msrc, &s1);
    CHECK(r.calls == 0, "callback for a refused batch");
    CHECK(s1.reconnects > s0.reconnects, "no reconnect attempts while down");

    /* Same port, empty data set: it reconnects by itself. */
    CHECK(redis_start(), "redis restart failed");
    sc = sync_connect();
    CHECK(sc != NULL, "sync connect after restart");
    if (!sc)
        return;
    CHECK(wait_up(&mstate, true, 10000), "no reconnect after restart");
    CHECK(cmd(sc, "RPUSH r:list a b"), "RPUSH");
    CHECK(queue(msrc, q, 2, &r) == 0, "not sent after restart");
    CHECK(wait_result(&r, 1, 3000) && r.status == 0 && r.vals && r.vals[0] == 0 && r.vals[1] == 2,
          "after restart: status %d err %s", r.status, r.err);
    result_reset(&r);
    /* The SUBSCRIBE connection came back too. */
    int64_t dl = deadline_in(10000);
    while (numsub_wake(sc) != 1 && spin(dl)) {
    }
    int before = mstate.wakes;
    CHECK(cmd_int(sc, "PUBLISH thaw:wake %s", "after-restart") == 1, "no subscriber after restart");
    dl = deadline_in(2000);
    while (mstate.wakes == before && spin(dl)) {
    }
    CHECK(mstate.wakes == before + 1 && strcmp(mstate.wake, "after-restart") == 0,
          "wake after restart: '%s'", mstate.wake);
    redis_source_get_stats(msrc, &s1);
    printf("kill/restart: reconnects=%" PRIu64 " failures=%" PRIu64 " ups=%d downs=%d\n",
           s1.reconnects, s1.failures, mstate.ups, mstate.downs);
}

static void test_free_paths(void)
{
    /* Free with both batches in flight: no callback, nothing leaks. */
    struct src_state fs = {.name = "free1"};
    struct redis_source *f = new_source(2000, &fs);
    CHECK(f && wait_up(&fs, true, 5000), "free1 not up");
    const struct redis_queue_query q[] = {{"r:list", NULL}};
    const char *const models[] = {"m1"};
    struct result a = {0}, h = {0};
    if (f) {
        CHECK(queue(f, q, 1, &a) == 0 && held(f, models, 1, clock_unix_ms(), 1000, &h) == 0,
              "not sent");
        redis_source_free(f);
    }
    spin_for(200);
    CHECK(a.calls == 0 && h.calls == 0 && fs.downs == 0, "callback after free");

    /* Free from inside on_state(true) (a hiredis reply callback). */
    struct src_state us = {.name = "free-on-up"};
    struct redis_source *u = new_source(2000, &us);
    us.self = &u;
    us.free_on_up = true;
    int64_t dl = deadline_in(5000);
    while (u && spin(dl)) {
    }
    CHECK(u == NULL && us.ups == 1, "free in on_state: ups %d", us.ups);
    spin_for(100);

    /* Free from inside a batch callback. */
    struct src_state bs = {.name = "free-in-batch"};
    struct redis_source *b = new_source(2000, &bs);
    CHECK(b && wait_up(&bs, true, 5000), "free-in-batch not up");
    if (b) {
        a.free_self = &b;
        CHECK(queue(b, q, 1, &a) == 0, "not sent");
        CHECK(wait_result(&a, 1, 3000) && b == NULL, "free in batch callback");
    }
    spin_for(100);
    CHECK(a.calls == 1, "calls %d", a.calls);
    result_reset(&a);

    /* Free from inside on_wake (the pub/sub connection's callback). */
    struct src_state ws = {.name = "free-on-wake"};
    struct redis_source *w = new_source(2000, &ws);
    ws.self = &w;
    ws.free_on_wake = true;
    dl = deadline_in(5000);
    while (numsub_wake(sc) != 2 && spin(dl)) {
    }
    CHECK(numsub_wake(sc) == 2, "free-on-wake not subscribed");
    int before = mstate.wakes;
    CHECK(cmd_int(sc, "PUBLISH thaw:wake %s", "both") == 2, "publish");
    dl = deadline_in(3000);
    while ((w != NULL || mstate.wakes == before) && spin(dl)) {
    }
    CHECK(w == NULL && ws.wakes == 1 && mstate.wakes == before + 1, "free in on_wake");
    spin_for(100);
    redis_source_free(w);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (getenv("THAW_UNDER_VALGRIND"))
        slow = 5;
    const char *bin = getenv("REDIS_SERVER");
    if (bin && bin[0])
        redis_bin = bin;
    if (access(redis_bin, X_OK) != 0) {
        printf("SKIP: %s not found\n", redis_bin);
        return 77;
    }
    signal(SIGALRM, on_fatal_signal);
    signal(SIGINT, on_fatal_signal);
    signal(SIGTERM, on_fatal_signal);
    signal(SIGPIPE, SIG_IGN);
    alarm((unsigned)(110 * slow));

    snprintf(tmpdir, sizeof(tmpdir), "/tmp/thaw-redis-test-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    base = event_base_new();
    if (!base) {
        remove_tmpdir();
        return 1;
    }

    test_url_errors();
    redis_port = peer_free_port();
    bool up = redis_port > 0 && redis_start();
    CHECK(up, "redis-server did not start on port %d", redis_port);
    sc = up ? sync_connect() : NULL;
    CHECK(!up || sc != NULL, "setup connection failed");
    if (up && sc) {
        test_connect();
        if (msrc && redis_source_connected(msrc)) {
            test_bad_password();
            test_queue_types();
            test_many_keys();
            test_noscript();
            test_held();
            test_batch_rules();
            test_wake();
            test_timeout();
            test_kill_restart();
            if (sc)
                test_free_paths();
        }
    }
    CHECK(reentrant_calls == 0, "%d callbacks ran inside an API call", reentrant_calls);
    /* Everything above came from a real Redis: handshakes with AUTH and
     * SELECT, NOSCRIPT retries, wakes, timeouts, kills and restarts. The
     * reply guard must not have refused any of it (a false refusal would only
     * show as a reconnect). */
    CHECK(redis_guard_refused_total() == 0, "%lu replies of a real Redis refused",
          redis_guard_refused_total());

    redis_source_free(msrc);
    spin_for(20);
    if (sc)
        redisFree(sc);
    if (peer_checks_failed)
        dump_redis_log();
    redis_stop(SIGTERM);
    remove_tmpdir();
    event_base_free(base);
    printf("%d passed, %d failed\n", peer_checks_passed, peer_checks_failed);
    return peer_checks_failed ? 1 : 0;
}
