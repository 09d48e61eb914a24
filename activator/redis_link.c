#include "redis_link.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "alloc.h"
#include "clock.h"
#include "log.h"
#include "model_name.h"
#include "redis_guard.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
/* A command unanswered this long: Redis is not answering (redis_link_answering). */
#define ANSWER_LATE_MS 1000
#define WATCH_MS 100
/* The scaler ignores a thaw:held field this old (its rs_held_script). */
#define HELD_FIELD_MAX_AGE_MS 600000

struct redis_link {
    struct event_base *base;
    char host[256];
    int port;
    char pass[256];
    int db;
    char *instance_id;
    long timeout_ms;
    redis_link_state_cb cb;
    void *ud;
    redis_link_peers_cb peers_cb;
    void *peers_ud;

    redisAsyncContext *ac;
    struct redis_guard_conn guard; /* ac's reply rules: commands sent, replies due */
    bool connected;
    bool answered; /* the last reply on this connection was not an error */
    bool freeing;        /* inside our own redisAsyncFree: ignore callbacks */
    int64_t connect_started_ms;
    size_t pending;      /* commands without a reply yet */
    int64_t oldest_pending_ms;
    long backoff_ms;
    struct event *retry_timer;
    struct event *watch_timer;
    struct redis_link_stats stats;
};

int redis_link_parse_url(const char *url, char *host, size_t hostlen, int *port, char *pass,
                         size_t passlen, int *db)
{
    if (strncmp(url, "redis://", 8) != 0)
        return -1;
    const char *p = url + 8;
    const char *at = strrchr(p, '@');
    pass[0] = '\0';
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        const char *pw = colon ? colon + 1 : p; /* redis://:pw@ or redis://user:pw@ */
        size_t pl = (size_t)(at - pw);
        if (pl >= passlen)
            return -1;
        memcpy(pass, pw, pl);
        pass[pl] = '\0';
        p = at + 1;
    }
    const char *hs = p, *he;
    if (*p == '[') {
        hs = ++p;
        while (*p && *p != ']')
            p++;
        if (*p != ']')
            return -1;
        he = p++;
    } else {
        while (*p && *p != ':' && *p != '/')
            p++;
        he = p;
    }
    size_t hl = (size_t)(he - hs);
    if (hl == 0 || hl >= hostlen)
        return -1;
    memcpy(host, hs, hl);
    host[hl] = '\0';
    *port = 6379;
    *db = 0;
    if (*p == ':') {
        char *end;
        errno = 0;
        long v = strtol(p + 1, &end, 10);
        if (errno || end == p + 1 || v < 1 || v > 65535)
            return -1;
        *port = (int)v;
        p = end;
    }
    if (*p == '/') {
        p++;
        if (*p) {
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (errno || end == p || *end || v < 0 || v > 100000)
                return -1;
            *db = (int)v;
            p = end;
        }
    }
    return *p == '\0' ? 0 : -1;
}

static void schedule_retry(struct redis_link *l)
{
    struct timeval tv = {l->backoff_ms / 1000, (l->backoff_ms % 1000) * 1000};
    event_add(l->retry_timer, &tv);
    l->backoff_ms = l->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : l->backoff_ms * 2;
}

static void set_down(struct redis_link *l, const char *why)
{
    bool was_up = l->connected;
    l->connected = false;
    l->ac = NULL;
    l->pending = 0;
    if (was_up) {
        LOG_WARN("redis_down", "host=%s port=%d reason=%s", l->host, l->port, why);
        if (l->cb)
            l->cb(l->ud, false);
    }
    schedule_retry(l);
}

/* Drops the connection from outside hiredis callbacks (timeouts). */
static void drop(struct redis_link *l, const char *why)
{
    if (!l->ac)
        return;
    redisAsyncContext *ac = l->ac;
    l->freeing = true;
    redisAsyncFree(ac);
    l->freeing = false;
    set_down(l, why);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    struct redis_link *l = ac->data;
    if (!l || l->freeing)
        return;
    if (status != REDIS_OK) {
        LOG_DEBUG("redis_connect_failed", "host=%s port=%d err=\"%s\"", l->host, l->port,
                  ac->errstr);
        /* hiredis frees the context after this callback. */
        l->ac = NULL;
        l->connected = false;
        schedule_retry(l);
        return;
    }
    l->connected = true;
    l->answered = false;
    /* The backoff resets on the first good reply, not here: a Redis that
     * accepts connections and never answers (stopped, or a proxy in front
     * of a dead one) would otherwise be reconnected to every timeout. */
    l->stats.connects++;
    LOG_INFO("redis_up", "host=%s port=%d", l->host, l->port);
    if (l->cb)
        l->cb(l->ud, true);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    struct redis_link *l = ac->data;
    if (!l || l->freeing)
        return;
    set_down(l, status == REDIS_OK ? "closed" : "error");
}

/* Every reply's bookkeeping; false when it is a failure. */
static bool account_reply(struct redis_link *l, const redisReply *reply)
{
    if (l->pending > 0)
        l->pending--;
    /* Replies arrive in order, so the next pending command was sent no
     * earlier than now minus the watch period; restart its clock. */
    l->oldest_pending_ms = clock_mono_ms();
    /* An error reply (NOAUTH, READONLY after a failover) means what we
     * write does not land: not answering, for the direct wake. */
    l->answered = reply && reply->type != REDIS_REPLY_ERROR;
    if (l->answered)
        l->backoff_ms = BACKOFF_MIN_MS;
    if (!reply || reply->type == REDIS_REPLY_ERROR) {
        l->stats.failures++;
        if (reply)
            LOG_WARN("redis_reply_error", "err=\"%.*s\"", (int)reply->len, reply->str);
        return false;
    }
    return true;
}

static void on_reply(redisAsyncContext *ac, void *r, void *priv)
{
    (void)ac;
    if (priv)
        account_reply(priv, r);
}

static void on_peers_reply(redisAsyncContext *ac, void *r, void *priv)
{
    (void)ac;
    struct redis_link *l = priv;
    redisReply *reply = r;
    if (!l || !account_reply(l, reply) || !l->peers_cb)
        return;
    if (reply->type != REDIS_REPLY_INTEGER || reply->integer < 0) {
        l->stats.failures++;
        LOG_WARN("redis_reply_unexpected", "command=peers type=%d", reply->type);
        return;
    }
    l->peers_cb(l->peers_ud, reply->integer);
}

static int send_cmd_to(struct redis_link *l, redisCallbackFn *fn, int argc, const char **argv)
{
    if (!l->ac || !l->connected)
        return -1;
    if (redisAsyncCommandArgv(l->ac, fn, l, argc, argv, NULL) != REDIS_OK) {
        l->stats.failures++;
        return -1;
    }
    redis_guard_conn_sent(&l->guard, 1);
    if (l->pending == 0)
        l->oldest_pending_ms = clock_mono_ms();
    l->pending++;
    l->stats.commands++;
    return 0;
}

static int send_cmd(struct redis_link *l, int argc, const char **argv)
{
    return send_cmd_to(l, on_reply, argc, argv);
}

static void do_connect(struct redis_link *l)
{
    redisAsyncContext *ac = redisAsyncConnect(l->host, l->port);
    if (!ac) {
        schedule_retry(l);
        return;
    }
    if (ac->err) {
        LOG_DEBUG("redis_connect_failed", "host=%s port=%d err=\"%s\"", l->host, l->port,
                  ac->errstr);
        redisAsyncFree(ac);
        schedule_retry(l);
        return;
    }
    /* A huge array header or a reply no command asked for (hiredis would
     * abort) must not cost GBs or the process (common/redis_guard.h). */
    redis_guard_conn_init(&l->guard);
    if (redis_guard_attach(ac->c.reader, &l->guard) != 0) {
        redisAsyncFree(ac);
        schedule_retry(l);
        return;
    }
    ac->data = l;
    if (redis_guard_libevent_attach(ac, l->base) != 0) {
        redisAsyncFree(ac);
        schedule_retry(l);
        return;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    l->ac = ac;
    l->connect_started_ms = clock_mono_ms();
    l->pending = 0;
    /* AUTH and SELECT go first; hiredis queues them until connected. They
     * are sent without counting as "connected" commands. */
    if (l->pass[0]) {
        const char *argv[] = {"AUTH", l->pass};
        if (redisAsyncCommandArgv(ac, on_reply, l, 2, argv, NULL) == REDIS_OK) {
            redis_guard_conn_sent(&l->guard, 1);
            l->pending++;
            l->oldest_pending_ms = clock_mono_ms();
        }
    }
    if (l->db) {
        char db[16];
        snprintf(db, sizeof(db), "%d", l->db);
        const char *argv[] = {"SELECT", db};
        if (redisAsyncCommandArgv(ac, on_reply, l, 2, argv, NULL) == REDIS_OK) {
            redis_guard_conn_sent(&l->guard, 1);
            if (l->pending++ == 0)
                l->oldest_pending_ms = clock_mono_ms();
        }
    }
}

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct redis_link *l = arg;
    if (!l->ac)
        do_connect(l);
}

static void watch_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct redis_link *l = arg;
    if (!l->ac)
        return;
    int64_t now = clock_mono_ms();
    if (!l->connected && now - l->connect_started_ms > l->timeout_ms) {
        l->stats.timeouts++;
        LOG_DEBUG("redis_connect_timeout", "host=%s port=%d", l->host, l->port);
        drop(l, "connect_timeout");
    } else if (l->connected && l->pending > 0 && now - l->oldest_pending_ms > l->timeout_ms) {
        l->stats.timeouts++;
        drop(l, "command_timeout");
    }
}

struct redis_link *redis_link_new(struct event_base *base, const char *url,
                                  const char *instance_id, long timeout_ms,
                                  redis_link_state_cb cb, void *ud, char *err, size_t errlen)
{
    struct redis_link *l = thaw_calloc(1, sizeof(*l));
    if (!l) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (redis_link_parse_url(url, l->host, sizeof(l->host), &l->port, l->pass, sizeof(l->pass),
                             &l->db) < 0) {
        snprintf(err, errlen, "bad redis URL (want redis://[:password@]host[:port][/db])");
        thaw_free(l);
        return NULL;
    }
    l->base = base;
    l->timeout_ms = timeout_ms;
    l->cb = cb;
    l->ud = ud;
    l->backoff_ms = BACKOFF_MIN_MS;
    l->instance_id = thaw_strdup(instance_id);
    l->retry_timer = evtimer_new(base, retry_cb, l);
    l->watch_timer = event_new(base, -1, EV_PERSIST, watch_cb, l);
    if (!l->instance_id || !l->retry_timer || !l->watch_timer) {
        snprintf(err, errlen, "out of memory");
        redis_link_free(l);
        return NULL;
    }
    struct timeval tv = {0, WATCH_MS * 1000};
    event_add(l->watch_timer, &tv);
    do_connect(l);
    return l;
}

void redis_link_free(struct redis_link *l)
{
    if (!l)
        return;
    if (l->ac) {
        l->freeing = true;
        l->ac->data = NULL;
        redisAsyncFree(l->ac);
        l->ac = NULL;
    }
    if (l->retry_timer)
        event_free(l->retry_timer);
    if (l->watch_timer)
        event_free(l->watch_timer);
    thaw_free(l->instance_id);
    thaw_free(l);
}

bool redis_link_up(const struct redis_link *l) { return l && l->connected; }

bool redis_link_answering(const struct redis_link *l)
{
    return l && l->connected && l->answered &&
           !(l->pending > 0 && clock_mono_ms() - l->oldest_pending_ms > ANSWER_LATE_MS);
}

int redis_link_wake(struct redis_link *l, const char *model)
{
    const char *argv[] = {"PUBLISH", "thaw:wake", model};
    return send_cmd(l, 3, argv);
}

#define HELD_KEY_BYTES (sizeof("thaw:held:") + MODEL_NAME_MAX)

/* thaw:held:<model> into key (HELD_KEY_BYTES); -1 for a name too long. */
static int held_key(char *key, const char *model)
{
    int n = snprintf(key, HELD_KEY_BYTES, "thaw:held:%s", model);
    return n < 0 || (size_t)n >= HELD_KEY_BYTES ? -1 : 0;
}

int redis_link_held(struct redis_link *l, const char *model, size_t held, size_t queued,
                    size_t inflight, int64_t late_after_ms, int64_t unix_ms)
{
    char key[HELD_KEY_BYTES];
    if (held_key(key, model) < 0)
        return -1;
    if (held == 0 && queued == 0 && inflight == 0) {
        const char *argv[] = {"HDEL", key, l->instance_id};
        return send_cmd(l, 3, argv);
    }
    /* Two parts when nothing is queued, so scalers that know only
     * <count>:<unix-ms> still read cold holds. With a queue, the fourth part
     * says the order it is sent in (0: FIFO), so the scaler can tell this
     * activator's FIFO from an older activator that does not say. The
     * in-flight count comes fifth: scalers that know four parts skip it. */
    char val[128];
    long long late = late_after_ms > 0 ? late_after_ms : 0;
    if (inflight > 0)
        snprintf(val, sizeof(val), "%zu:%lld:%zu:%lld:%zu", held, (long long)unix_ms, queued,
                 late, inflight);
    else if (queued > 0)
        snprintf(val, sizeof(val), "%zu:%lld:%zu:%lld", held, (long long)unix_ms, queued, late);
    else
        snprintf(val, sizeof(val), "%zu:%lld", held, (long long)unix_ms);
    const char *argv[] = {"HSET", key, l->instance_id, val};
    return send_cmd(l, 4, argv);
}

/* The stamp is the value's second part, as the scaler parses it; values
 * it cannot read are left alone (another version's). Both clocks must call a
 * field old: a Redis whose clock is 10 minutes off would otherwise delete
 * every live field at each sweep, and a busy model's counts with them. */
static const char held_sweep_script[] =
    "if redis.replicate_commands then redis.replicate_commands() end "
    "if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then return 0 end "
    "local t = redis.call('TIME') "
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
    "local age = tonumber(ARGV[1]) "
    "local mine = tonumber(ARGV[2]) "
    "if mine < now then now = mine end "
    "local kv = redis.call('HGETALL', KEYS[1]) "
    "local gone = 0 "
    "for j = 1, #kv, 2 do "
    "  local ts = #kv[j + 1] <= 256 and string.match(kv[j + 1], '^%d+:(%d+)') "
    "  if ts and #ts <= 15 and tonumber(ts) < now - age then "
    "    redis.call('HDEL', KEYS[1], kv[j]) "
    "    gone = gone + 1 "
    "  end "
    "end "
    "redis.call('PEXPIRE', KEYS[1], age) "
    "return gone";

int redis_link_held_sweep(struct redis_link *l, const char *model, int64_t unix_ms)
{
    char key[HELD_KEY_BYTES], age[24], mine[24];
    if (held_key(key, model) < 0)
        return -1;
    snprintf(age, sizeof(age), "%d", HELD_FIELD_MAX_AGE_MS);
    snprintf(mine, sizeof(mine), "%lld", (long long)unix_ms);
    const char *argv[] = {"EVAL", held_sweep_script, "1", key, age, mine};
    return send_cmd(l, 6, argv);
}

void redis_link_set_peers_cb(struct redis_link *l, redis_link_peers_cb cb, void *ud)
{
    l->peers_cb = cb;
    l->peers_ud = ud;
}

/* Redis's clock, not ours: activators on different nodes agree on who is
 * live however their clocks drift. The keys expire with their last member.
 * A member without a weight (an activator from before weights, which runs
 * its own script and answers ZCARD) counts whole, as it counts itself. */
static const char peers_script[] =
    /* Before Redis 5 a script that read TIME could not write after it
     * unless it asked for effects replication; from 5 on this is a no-op. */
    "if redis.replicate_commands then redis.replicate_commands() end "
    "local t = redis.call('TIME') "
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
    "local ttl = tonumber(ARGV[2]) "
    "redis.call('ZADD', KEYS[1], now, ARGV[1]) "
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl) "
    "redis.call('HSET', KEYS[2], ARGV[1], ARGV[3]) "
    "local live, sum = {}, 0 "
    "for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do "
    "  live[m] = true "
    "  local w = tonumber(redis.call('HGET', KEYS[2], m) or '') "
    "  if w == nil or w ~= w or w > 1000 then w = 1000 elseif w < 0 then w = 0 end "
    "  sum = sum + math.floor(w) "
    "end "
    "for _, m in ipairs(redis.call('HKEYS', KEYS[2])) do "
    "  if not live[m] then redis.call('HDEL', KEYS[2], m) end "
    "end "
    "redis.call('PEXPIRE', KEYS[1], ttl * 2) "
    "redis.call('PEXPIRE', KEYS[2], ttl * 2) "
    "return sum";

/* key:w, the weights' hash; false if it does not fit. */
static bool weights_key(char *out, size_t len, const char *key)
{
    int n = snprintf(out, len, "%s:w", key);
    return n > 0 && (size_t)n < len;
}

int redis_link_heartbeat(struct redis_link *l, const char *key, long ttl_ms,
                         unsigned weight_milli)
{
    char ttl[24], weight[16], wkey[512];
    if (!weights_key(wkey, sizeof(wkey), key))
        return -1;
    snprintf(ttl, sizeof(ttl), "%ld", ttl_ms);
    snprintf(weight, sizeof(weight), "%u", weight_milli > 1000 ? 1000u : weight_milli);
    const char *argv[] = {"EVAL", peers_script, "2", key, wkey, l->instance_id, ttl, weight};
    return send_cmd_to(l, on_peers_reply, 8, argv);
}

int redis_link_leave(struct redis_link *l, const char *key)
{
    char wkey[512];
    if (!weights_key(wkey, sizeof(wkey), key))
        return -1;
    const char *argv[] = {"ZREM", key, l->instance_id};
    const char *hargv[] = {"HDEL", wkey, l->instance_id};
    if (send_cmd(l, 3, argv) < 0)
        return -1;
    return send_cmd(l, 3, hargv);
}

void redis_link_get_stats(const struct redis_link *l, struct redis_link_stats *out)
{
    if (!l) {
        memset(out, 0, sizeof(*out));
        return;
    }
    *out = l->stats;
}
