#include "redis_source.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "alloc.h"
#include "log.h"
#include "redis_guard.h"

/* Redis runs a script to the end before serving anyone else: a bound on the
 * keys per call bounds that stall. Several calls still share one round trip. */
#define RS_CHUNK_KEYS 1000
_Static_assert(RS_CHUNK_KEYS <= REDIS_GUARD_MAX_ELEMENTS, "a batch reply must pass the guard");
#define RS_BACKOFF_MIN_MS 100
#define RS_BACKOFF_MAX_MS 5000
#define RS_WAKE_CHANNEL "thaw:wake"
#define RS_HELD_PREFIX "thaw:held:"

/* One script per batch kind, so the key type is found by Redis in the same
 * round trip as the length. KEYS[i] is a queue key, ARGV[i] its consumer
 * group ("" for none). Redis 7.0 reports a group's `lag` as nil after
 * deletions and, more commonly, for a group created at $ until it has caught
 * up once; then we count the entries after last-delivered-id with XRANGE,
 * at most 1000 per key and 10000 per call (so the script stays short), and
 * past that bound take the smaller of XLEN and entries-added - entries-read:
 * an over-estimate, which keeps a model up rather than dropping work. */
static const char rs_queue_script[] =
    "local budget = 10000\n"
    "local out = {}\n"
    "for i, key in ipairs(KEYS) do\n"
    "  local t = redis.call('TYPE', key)['ok']\n"
    "  local group = ARGV[i]\n"
    "  local n = -1\n"
    "  if t == 'none' then n = 0\n"
    "  elseif t == 'list' then n = redis.call('LLEN', key)\n"
    "  elseif t == 'zset' then n = redis.call('ZCARD', key)\n"
    "  elseif t == 'stream' then\n"
    "    if group == nil or group == '' then n = redis.call('XLEN', key)\n"
    "    else\n"
    "      for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do\n"
    "        local f = {}\n"
    "        for j = 1, #g, 2 do f[g[j]] = g[j + 1] end\n"
    "        if f['name'] == group then\n"
    "          local lag = f['lag']\n"
    "          if type(lag) ~= 'number' then\n"
    "            local cap = math.min(1000, budget)\n"
    "            local after = 0\n"
    "            if cap > 0 then\n"
    "              after = #redis.call('XRANGE', key, '(' .. f['last-delivered-id'], '+',\n"
    "                                  'COUNT', cap)\n"
    "              budget = budget - after\n"
    "            end\n"
    "            if after < cap then\n"
    "              lag = after\n"
    "            else\n"
    "              lag = redis.call('XLEN', key)\n"
    "              local read = f['entries-read']\n"
    "              if type(read) == 'number' then\n"
    "                local s = redis.call('XINFO', 'STREAM', key)\n"
    "                for j = 1, #s, 2 do\n"
    "                  if s[j] == 'entries-added' and s[j + 1] - read < lag then\n"
    "                    lag = s[j + 1] - read\n"
    "                  end\n"
    "                end\n"
    "              end\n"
    "              if lag < after then lag = after end\n"
    "            end\n"
    "          end\n"
    "          n = f['pending'] + lag\n"
    "          break\n"
    "        end\n"
    "      end\n"
    "      if n == -1 then n = -2 - redis.call('XLEN', key) end\n"
    "    end\n"
    "  end\n"
    "  out[i] = n\n"
    "end\n"
    "return out\n";

/* KEYS[i] = thaw:held:<model>, ARGV = now_ms, fresh_ms. Field values are
 * "<held>:<unix-ms>", "<held>:<unix-ms>:<queued>",
 * "<held>:<unix-ms>:<queued>:<late-ms>" or
 * "<held>:<unix-ms>:<queued>:<late-ms>:<inflight>" (held: nothing ready;
 * queued: waiting at the activator's concurrency cap; late-ms: its
 * lateAfterSeconds in ms, 0: FIFO; inflight: requests in a backend), and
 * any parts after the fifth ignored: activators may
 * append parts without waiting for every scaler to know them (the order of
 * upgrades then does not matter). The digit limits keep the sums exact in
 * Lua's doubles; the pattern cannot fail after its first two numbers (the
 * rest is taken as it comes and judged after), so it costs linear time, and
 * the length limit bounds even that for garbage. Five numbers per key: the held
 * sum, the queued sum, the smallest late-ms of the fields with a queue
 * that say one (-1: none says; a three-part field is an activator older
 * than the setting), and the in-flight sum (a fifth part that is not a
 * number of at most 9 digits followed by ':' or the end counts 0, and the
 * rest of its field still counts, as scalers before the part read it), and
 * the silent fields: readable but stale for up to 10 minutes, or stamped more
 * than fresh_ms ahead. An activator deletes its field when it carries nothing,
 * so a stale one is an activator that stopped reporting while it carried
 * requests (crashed, cut off from Redis, its clock off): its in-flight count
 * is unknown, and the idle signal built on the sum cannot be trusted. Fresh is
 * two-sided: a stamp from more than fresh_ms in the future (an activator
 * whose clock runs ahead, or garbage) must not hold a model up forever. */
static const char rs_held_script[] =
    "local now = tonumber(ARGV[1])\n"
    "local fresh = tonumber(ARGV[2])\n"
    "local out = {}\n"
    "for i, key in ipairs(KEYS) do\n"
    "  local held, queued, late, inflight, silent = 0, 0, -1, 0, 0\n"
    "  if redis.call('TYPE', key)['ok'] == 'hash' then\n"
    "    local kv = redis.call('HGETALL', key)\n"
    "    for j = 2, #kv, 2 do\n"
    "      local c, ts, q, l, rest\n"
    "      if #kv[j] <= 256 then\n"
    "        c, ts, q, l, rest = string.match(kv[j], '^(%d+):(%d+):?(%d*):?(%d*)(.*)$')\n"
    "      end\n"
    "      local ok = c and (#rest == 0 or (#l > 0 and string.byte(rest) == 58))\n"
    "         and #c <= 9 and #ts <= 15 and #q <= 9 and #l <= 9\n"
    "      local t = ok and tonumber(ts)\n"
    "      if t and (t > now + fresh or (t < now - fresh and t >= now - 600000)) then\n"
    "        silent = silent + 1\n"
    "      elseif t and t >= now - fresh then\n"
    "        held = held + tonumber(c)\n"
    "        local f, tail\n"
    "        if #l > 0 then f, tail = string.match(rest, '^:(%d+)(.*)$') end\n"
    "        if f and #f <= 9 and (#tail == 0 or string.byte(tail) == 58) then\n"
    "          inflight = inflight + tonumber(f)\n"
    "        end\n"
    "        if #q > 0 and tonumber(q) > 0 then\n"
    "          queued = queued + tonumber(q)\n"
    "          if #l > 0 and (late < 0 or tonumber(l) < late) then late = tonumber(l) end\n"
    "        end\n"
    "      end\n"
    "    end\n"
    "  end\n"
    "  out[5 * i - 4] = held\n"
    "  out[5 * i - 3] = queued\n"
    "  out[5 * i - 2] = late\n"
    "  out[5 * i - 1] = inflight\n"
    "  out[5 * i] = silent\n"
    "end\n"
    "return out\n";

enum rs_batch_kind { RS_BATCH_QUEUE = 0, RS_BATCH_HELD = 1, RS_BATCH_KINDS };
enum rs_conn_kind { RS_CONN_CMD, RS_CONN_SUB };
enum rs_conn_state { RS_DOWN, RS_CONNECTING, RS_HANDSHAKE, RS_READY };
enum rs_hs_step { RS_HS_AUTH, RS_HS_SELECT, RS_HS_LOAD_QUEUE, RS_HS_LOAD_HELD };

static const char *const rs_scripts[RS_BATCH_KINDS] = {rs_queue_script, rs_held_script};

struct redis_source;

struct rs_conn {
    struct redis_source *src;
    enum rs_conn_kind kind;
    enum rs_conn_state state;
    redisAsyncContext *ac;      /* live context (ac->data == this), or NULL */
    struct redis_guard_conn guard; /* ac's reply rules: commands sent, pub/sub mode */
    redisAsyncContext *reap_ac; /* detached context, freed by reap_ev */
    struct event *retry_ev;     /* backoff before the next connect */
    struct event *deadline_ev;  /* connect + handshake must finish in time */
    struct event *reap_ev;      /* zero-timeout: frees reap_ac outside hiredis */
    long backoff_ms;
    unsigned hs_pending; /* handshake replies still expected (cmd) */
    bool tried;          /* a first attempt was made: later ones are reconnects */
};

struct rs_batch {
    struct redis_source *src;
    enum rs_batch_kind kind;
    bool active;
    bool timed_out;
    size_t n;
    char **keys; /* n owned key names */
    char **args; /* queue: n owned group names ("" for none); held: NULL */
    char now_s[24];
    char fresh_s[24];
    long long *vals; /* results, filled as chunk replies arrive: n for a queue
                      * batch, 5n (all held, all queued, all late, all in flight,
                      * all silent) for a held batch */
    size_t chunks;
    size_t chunks_done;
    bool failed;
    char err[200];
    redis_queue_cb cb;      /* queue batches; NULL once abandoned */
    redis_held_cb held_cb;  /* held batches; NULL once abandoned */
    void *ud;
    struct event *timer;
};

struct redis_source {
    struct event_base *base;
    char *host;
    int port;
    char *user;     /* NULL: AUTH with the password only */
    char *password; /* NULL: no AUTH */
    long db;
    long timeout_ms;
    struct redis_source_callbacks cbs;
    void *ud;
    struct rs_conn cmd;
    struct rs_conn sub;
    struct rs_batch batch[RS_BATCH_KINDS];
    char sha[RS_BATCH_KINDS][41];
    struct redis_source_stats stats;
    /* User callbacks on the stack; a free() meanwhile only sets dying and the
     * outermost frame destroys once every callback has returned. */
    int depth;
    bool dying;
};

static void rs_conn_start(struct rs_conn *c);
static void rs_destroy(struct redis_source *src);

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int rc = vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    if (rc < 0)
        err[0] = '\0';
}

static const char *rs_conn_kind_to_str(enum rs_conn_kind k)
{
    return k == RS_CONN_CMD ? "cmd" : "sub";
}

static const char *rs_conn_state_to_str(enum rs_conn_state s)
{
    switch (s) {
    case RS_DOWN: return "down";
    case RS_CONNECTING: return "connecting";
    case RS_HANDSHAKE: return "handshake";
    case RS_READY: return "ready";
    }
    return "?";
}

static const char *rs_batch_kind_to_str(enum rs_batch_kind k)
{
    return k == RS_BATCH_QUEUE ? "queue" : "held";
}

static void rs_conn_set_state(struct rs_conn *c, enum rs_conn_state to)
{
    if (c->state == to)
        return;
    LOG_DEBUG("redis_conn_state", "conn=%s from=%s to=%s", rs_conn_kind_to_str(c->kind),
              rs_conn_state_to_str(c->state), rs_conn_state_to_str(to));
    c->state = to;
}

static void rs_enter(struct redis_source *src) { src->depth++; }

/* May destroy src: every caller returns right after, touching nothing. */
static void rs_leave(struct redis_source *src)
{
    if (--src->depth == 0 && src->dying)
        rs_destroy(src);
}

static struct timeval rs_tv(long ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    return tv;
}

static void *rs_priv_pack(enum rs_batch_kind kind, size_t chunk, bool eval)
{
    return (void *)(((uintptr_t)chunk << 2) | ((uintptr_t)eval << 1) | (uintptr_t)kind);
}

static void rs_priv_unpack(void *priv, enum rs_batch_kind *kind, size_t *chunk, bool *eval)
{
    uintptr_t v = (uintptr_t)priv;
    *kind = (v & 1u) ? RS_BATCH_HELD : RS_BATCH_QUEUE;
    *eval = (v & 2u) != 0;
    *chunk = (size_t)(v >> 2);
}

/* ------------------------------------------------------------------------ */
/* URL                                                                      */
/* ------------------------------------------------------------------------ */

static int rs_hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch = tolower(ch);
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

/* Percent-decodes [s, s+len) into a new string. NULL on a bad escape, an
 * encoded NUL or allocation failure (*oom tells which). */
static char *rs_pct_decode(const char *s, size_t len, bool *oom)
{
    char *out = thaw_malloc(len + 1);
    if (!out) {
        *oom = true;
        return NULL;
    }
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] != '%') {
            out[o++] = s[i];
            continue;
        }
        if (i + 2 < len) {
            int hi = rs_hexval((unsigned char)s[i + 1]);
            int lo = rs_hexval((unsigned char)s[i + 2]);
            if (hi >= 0 && lo >= 0 && (hi | lo) != 0) {
                out[o++] = (char)(hi * 16 + lo);
                i += 2;
                continue;
            }
        }
        thaw_free(out);
        return NULL;
    }
    out[o] = '\0';
    return out;
}

static bool rs_parse_digits(const char *s, size_t len, long max, long *out)
{
    if (len == 0 || len > 9)
        return false;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v > max)
        return false;
    *out = v;
    return true;
}

/* redis://[[user]:password@]host[:port][/db]. Fills src->host/port/user/
 * password/db. Returns 0, or -1 with err filled. */
static int rs_parse_url(struct redis_source *src, const char *url, char *err, size_t errlen)
{
    static const char scheme[] = "redis://";
    if (!url) {
        set_err(err, errlen, "bad redis URL: missing");
        return -1;
    }
    if (strncasecmp(url, "rediss://", 9) == 0) {
        set_err(err, errlen, "bad redis URL: TLS (rediss://) is not supported");
        return -1;
    }
    if (strncasecmp(url, scheme, sizeof scheme - 1) != 0) {
        set_err(err, errlen, "bad redis URL: must start with redis://");
        return -1;
    }
    const char *p = url + sizeof scheme - 1;
    if (strpbrk(p, "?#")) {
        set_err(err, errlen, "bad redis URL: query and fragment are not supported");
        return -1;
    }
    bool oom = false;
    /* Host names cannot hold '@', passwords can: the last '@' ends userinfo. */
    const char *at = strrchr(p, '@');
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (!colon) {
            set_err(err, errlen, "bad redis URL: userinfo needs ':' (redis://:password@host)");
            return -1;
        }
        if (colon > p) {
            src->user = rs_pct_decode(p, (size_t)(colon - p), &oom);
            if (!src->user)
                goto bad_escape;
        }
        src->password = rs_pct_decode(colon + 1, (size_t)(at - colon - 1), &oom);
        if (!src->password)
            goto bad_escape;
        p = at + 1;
    }
    const char *slash = strchr(p, '/');
    const char *hend = slash ? slash : p + strlen(p);
    const char *hstart = p;
    const char *hstop;
    const char *portp = NULL;
    if (*p == '[') {
        const char *rb = memchr(p, ']', (size_t)(hend - p));
        if (!rb) {
            set_err(err, errlen, "bad redis URL: unterminated [IPv6] host");
            return -1;
        }
        hstart = p + 1;
        hstop = rb;
        if (rb + 1 < hend) {
            if (rb[1] != ':') {
                set_err(err, errlen, "bad redis URL: junk after [IPv6] host");
                return -1;
            }
            portp = rb + 2;
        }
    } else {
        const char *colon = memchr(p, ':', (size_t)(hend - p));
        hstop = colon ? colon : hend;
        if (colon)
            portp = colon + 1;
    }
    if (hstop == hstart) {
        set_err(err, errlen, "bad redis URL: empty host");
        return -1;
    }
    long port = 6379;
    if (portp && (!rs_parse_digits(portp, (size_t)(hend - portp), 65535, &port) || port == 0)) {
        set_err(err, errlen, "bad redis URL: port must be 1-65535");
        return -1;
    }
    long db = 0;
    if (slash && slash[1] != '\0' && !rs_parse_digits(slash + 1, strlen(slash + 1), 1000000, &db)) {
        set_err(err, errlen, "bad redis URL: database must be a number");
        return -1;
    }
    src->host = thaw_strndup(hstart, (size_t)(hstop - hstart));
    if (!src->host) {
        set_err(err, errlen, "out of memory");
        return -1;
    }
    src->port = (int)port;
    src->db = db;
    return 0;

bad_escape:
    set_err(err, errlen, oom ? "out of memory" : "bad redis URL: bad %%-escape in userinfo");
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Batches                                                                  */
/* ------------------------------------------------------------------------ */

/* Frees what the batch owns and makes the slot free. No callback. */
static void rs_batch_reset(struct rs_batch *b)
{
    if (b->timer)
        evtimer_del(b->timer);
    for (size_t i = 0; i < b->n; i++) {
        if (b->keys)
            thaw_free(b->keys[i]);
        if (b->args)
            thaw_free(b->args[i]);
    }
    thaw_free(b->keys);
    thaw_free(b->args);
    thaw_free(b->vals);
    b->keys = NULL;
    b->args = NULL;
    b->vals = NULL;
    b->n = 0;
    b->chunks = 0;
    b->chunks_done = 0;
    b->active = false;
    b->timed_out = false;
    b->failed = false;
    b->err[0] = '\0';
    b->cb = NULL;
    b->held_cb = NULL;
    b->ud = NULL;
}

/* Ends the batch and tells its owner: with the results, or failed with
 * reason (or the first error recorded). The slot is free before the callback
 * runs, so the callback may start the next batch. Caller holds rs_enter. */
static void rs_batch_settle(struct rs_batch *b, const char *reason)
{
    struct redis_source *src = b->src;
    redis_queue_cb cb = b->cb;
    redis_held_cb held_cb = b->held_cb;
    void *ud = b->ud;
    long long *vals = b->vals;
    size_t n = b->n;
    bool owned = cb || held_cb;
    bool failed = b->failed || reason != NULL;
    char err[sizeof b->err];
    snprintf(err, sizeof err, "%s", reason ? reason : b->err);
    b->vals = NULL; /* ours until the callback returns */
    rs_batch_reset(b);
    if (failed && owned) { /* an abandoned batch was counted when abandoned */
        src->stats.failures++;
        char q[256];
        LOG_WARN("redis_batch_failed", "kind=%s n=%zu err=%s", rs_batch_kind_to_str(b->kind), n,
                 log_quote(q, sizeof q, err));
    }
    if (cb && !src->dying) {
        if (failed)
            cb(ud, -1, NULL, 0, err);
        else
            cb(ud, 0, vals, n, NULL);
    } else if (held_cb && !src->dying) {
        if (failed)
            held_cb(ud, -1, NULL, NULL, NULL, NULL, NULL, 0, err);
        else
            held_cb(ud, 0, vals, vals ? vals + n : NULL, vals ? vals + 2 * n : NULL,
                    vals ? vals + 3 * n : NULL, vals ? vals + 4 * n : NULL, n, NULL);
    }
    thaw_free(vals);
}

static void rs_batch_record_error(struct rs_batch *b, const char *what)
{
    if (!b->failed)
        set_err(b->err, sizeof b->err, "%s", what);
    b->failed = true;
}

static size_t rs_chunk_len(const struct rs_batch *b, size_t chunk)
{
    size_t lo = chunk * RS_CHUNK_KEYS;
    size_t left = b->n - lo;
    return left < RS_CHUNK_KEYS ? left : RS_CHUNK_KEYS;
}

static void rs_on_batch_reply(redisAsyncContext *ac, void *r, void *priv);

/* Appends one EVALSHA (or EVAL) for one chunk to the command connection.
 * Returns 0, or -1 (nothing appended). */
static int rs_send_chunk(struct rs_batch *b, size_t chunk, bool eval)
{
    struct redis_source *src = b->src;
    size_t lo = chunk * RS_CHUNK_KEYS;
    size_t nk = rs_chunk_len(b, chunk);
    size_t argc = 3 + nk + (b->kind == RS_BATCH_QUEUE ? nk : 2);
    const char **argv = thaw_calloc(argc, sizeof *argv);
    size_t *lens = thaw_calloc(argc, sizeof *lens);
    if (!argv || !lens) {
        thaw_free(argv);
        thaw_free(lens);
        return -1;
    }
    char nkbuf[24];
    snprintf(nkbuf, sizeof nkbuf, "%zu", nk);
    argv[0] = eval ? "EVAL" : "EVALSHA";
    argv[1] = eval ? rs_scripts[b->kind] : src->sha[b->kind];
    argv[2] = nkbuf;
    for (size_t i = 0; i < nk; i++) {
        argv[3 + i] = b->keys[lo + i];
        if (b->kind == RS_BATCH_QUEUE)
            argv[3 + nk + i] = b->args[lo + i];
    }
    if (b->kind == RS_BATCH_HELD) {
        argv[3 + nk] = b->now_s;
        argv[4 + nk] = b->fresh_s;
    }
    for (size_t i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    int rc = redisAsyncCommandArgv(src->cmd.ac, rs_on_batch_reply,
                                   rs_priv_pack(b->kind, chunk, eval), (int)argc, argv, lens);
    thaw_free(argv);
    thaw_free(lens);
    if (rc != REDIS_OK)
        return -1;
    redis_guard_conn_sent(&src->cmd.guard, 1);
    src->stats.commands++;
    return 0;
}

static void rs_on_batch_reply(redisAsyncContext *ac, void *r, void *priv)
{
    struct rs_conn *c = ac->data;
    redisReply *reply = r;
    /* Detached (dropped or freed) connections and NULL replies: whatever was
     * pending was already settled when the connection was let go. */
    if (!c || !reply)
        return;
    struct redis_source *src = c->src;
    enum rs_batch_kind kind;
    size_t chunk;
    bool eval;
    rs_priv_unpack(priv, &kind, &chunk, &eval);
    struct rs_batch *b = &src->batch[kind];
    if (!b->active || chunk >= b->chunks)
        return;
    size_t lo = chunk * RS_CHUNK_KEYS;
    size_t nk = rs_chunk_len(b, chunk);
    if (reply->type == REDIS_REPLY_ERROR) {
        if (!eval && reply->str && strncmp(reply->str, "NOSCRIPT", 8) == 0) {
            /* Flushed script cache: run the text once, which caches it again.
             * The reply still lands in this batch, one round trip later. */
            LOG_INFO("redis_script_reload", "kind=%s chunk=%zu", rs_batch_kind_to_str(kind), chunk);
            if (rs_send_chunk(b, chunk, true) == 0)
                return;
            rs_batch_record_error(b, "NOSCRIPT and the EVAL fallback could not be sent");
        } else {
            rs_batch_record_error(b, reply->str ? reply->str : "error reply");
        }
    } else if (kind == RS_BATCH_QUEUE && reply->type == REDIS_REPLY_ARRAY &&
               reply->elements == nk) {
        for (size_t j = 0; j < nk; j++) {
            const redisReply *e = reply->element[j];
            if (e->type != REDIS_REPLY_INTEGER) {
                /* Not a reading: the batch fails (stale), rather than 0. */
                rs_batch_record_error(b, "unexpected reply to the script");
                break;
            }
            b->vals[lo + j] = e->integer;
        }
    } else if (kind == RS_BATCH_HELD && reply->type == REDIS_REPLY_ARRAY &&
               reply->elements == 5 * nk) {
        /* held[i], queued[i], late[i], inflight[i], silent[i] per key; vals
         * holds all held counts, then all queued counts, all late settings,
         * all in-flight counts, all silent counts. */
        for (size_t j = 0; j < nk; j++) {
            const redisReply *h = reply->element[5 * j], *q = reply->element[5 * j + 1],
                             *l = reply->element[5 * j + 2], *f = reply->element[5 * j + 3],
                             *z = reply->element[5 * j + 4];
            b->vals[lo + j] = h->type == REDIS_REPLY_INTEGER && h->integer > 0 ? h->integer : 0;
            b->vals[b->n + lo + j] =
                q->type == REDIS_REPLY_INTEGER && q->integer > 0 ? q->integer : 0;
            /* Nine digits at most, as the script parses them. */
            b->vals[2 * b->n + lo + j] =
                l->type == REDIS_REPLY_INTEGER && l->integer >= 0 && l->integer <= 999999999
                    ? l->integer
                    : -1;
            b->vals[3 * b->n + lo + j] =
                f->type == REDIS_REPLY_INTEGER && f->integer > 0 ? f->integer : 0;
            /* Not an integer: say silent, so the in-flight sum is not trusted. */
            b->vals[4 * b->n + lo + j] =
                z->type == REDIS_REPLY_INTEGER ? (z->integer > 0 ? z->integer : 0) : 1;
        }
    } else {
        rs_batch_record_error(b, "unexpected reply to the script");
    }
    if (++b->chunks_done < b->chunks)
        return;
    rs_enter(src);
    rs_batch_settle(b, NULL);
    rs_leave(src);
}

/* Called with the conn already detached: every in-flight batch is settled,
 * the owner learns the connection is down, a reconnect is scheduled. Caller
 * holds rs_enter. */
static void rs_conn_lost(struct rs_conn *c, const char *reason)
{
    struct redis_source *src = c->src;
    bool was_ready = c->state == RS_READY;
    char q[256];
    rs_conn_set_state(c, RS_DOWN);
    evtimer_del(c->deadline_ev);
    long delay = c->backoff_ms;
    c->backoff_ms = c->backoff_ms * 2 > RS_BACKOFF_MAX_MS ? RS_BACKOFF_MAX_MS : c->backoff_ms * 2;
    struct timeval tv = rs_tv(delay);
    if (evtimer_add(c->retry_ev, &tv) != 0)
        LOG_ERROR("redis_retry_schedule_failed", "conn=%s", rs_conn_kind_to_str(c->kind));
    if (was_ready)
        LOG_WARN("redis_disconnected", "conn=%s reason=%s retry_ms=%ld",
                 rs_conn_kind_to_str(c->kind), log_quote(q, sizeof q, reason), delay);
    else
        LOG_WARN("redis_connect_failed", "conn=%s host=%s port=%d reason=%s retry_ms=%ld",
                 rs_conn_kind_to_str(c->kind), src->host, src->port,
                 log_quote(q, sizeof q, reason), delay);
    if (c->kind != RS_CONN_CMD)
        return;
    char why[160];
    set_err(why, sizeof why, "connection lost: %s", reason);
    for (int k = 0; k < RS_BATCH_KINDS; k++) {
        struct rs_batch *b = &src->batch[k];
        if (b->active)
            rs_batch_settle(b, b->timed_out ? "timeout" : why);
    }
    if (was_ready && src->cbs.on_state && !src->dying)
        src->cbs.on_state(src->ud, false);
}

/* Lets go of the live context: now when we are outside hiredis, else on a
 * zero-timeout event, since hiredis still uses the context after a callback
 * returns. Then as rs_conn_lost. Caller holds rs_enter. */
static void rs_conn_drop(struct rs_conn *c, const char *reason, bool in_hiredis)
{
    redisAsyncContext *ac = c->ac;
    c->ac = NULL;
    if (ac) {
        ac->data = NULL; /* from here on its callbacks do nothing */
        if (in_hiredis && (ac->c.flags & REDIS_IN_CALLBACK)) {
            /* Inside a reply callback hiredis frees it as the callback
             * returns and reads nothing more. Deferring the free instead
             * let hiredis go on parsing the buffer and free the context
             * itself on the next bad reply: a double free (fuzz step). */
            redisAsyncFree(ac);
        } else if (in_hiredis) {
            if (c->reap_ac) /* an older one, long out of its callbacks */
                redisAsyncFree(c->reap_ac);
            /* Stop its socket events: if the peer closed meanwhile, hiredis
             * would see the EOF first and free the context itself, and the
             * reap below would free it again (found by fuzzing). */
            if (ac->ev.delRead)
                ac->ev.delRead(ac->ev.data);
            if (ac->ev.delWrite)
                ac->ev.delWrite(ac->ev.data);
            c->reap_ac = ac;
            struct timeval zero = {0, 0};
            if (evtimer_add(c->reap_ev, &zero) != 0)
                LOG_ERROR("redis_reap_schedule_failed", "conn=%s", rs_conn_kind_to_str(c->kind));
        } else {
            redisAsyncFree(ac);
        }
    }
    rs_conn_lost(c, reason);
}

static void rs_batch_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rs_batch *b = arg;
    struct redis_source *src = b->src;
    if (!b->active)
        return;
    rs_enter(src);
    if (b->chunks_done >= b->chunks) {
        rs_batch_settle(b, NULL); /* an empty batch: its answer was due now */
    } else {
        /* Late replies must never reach a settled batch: drop the connection
         * with everything in it and start over. */
        LOG_WARN("redis_batch_timeout", "kind=%s n=%zu timeout_ms=%ld",
                 rs_batch_kind_to_str(b->kind), b->n, src->timeout_ms);
        b->timed_out = true;
        rs_conn_drop(&src->cmd, "batch timeout", false);
    }
    rs_leave(src);
}

/* Starts the batch whose keys/args are filled: arms its timer and appends all
 * its commands before any reply can arrive. Returns 0, or -1 when nothing
 * useful was sent (the slot is free again unless replies are still owed). */
static int rs_batch_launch(struct rs_batch *b, redis_queue_cb cb, redis_held_cb held_cb, void *ud)
{
    struct redis_source *src = b->src;
    /* A held batch has five results per model: held, queued, late, inflight, silent. */
    size_t per_key = b->kind == RS_BATCH_HELD ? 5 : 1;
    b->vals = b->n ? thaw_calloc(b->n * per_key, sizeof *b->vals) : NULL;
    if (b->n && !b->vals) {
        rs_batch_reset(b);
        return -1;
    }
    b->chunks = (b->n + RS_CHUNK_KEYS - 1) / RS_CHUNK_KEYS;
    b->chunks_done = 0;
    b->cb = cb;
    b->held_cb = held_cb;
    b->ud = ud;
    struct timeval tv = rs_tv(b->n ? src->timeout_ms : 0);
    if (evtimer_add(b->timer, &tv) != 0) {
        rs_batch_reset(b);
        return -1;
    }
    for (size_t ch = 0; ch < b->chunks; ch++) {
        if (rs_send_chunk(b, ch, false) == 0)
            continue;
        if (ch == 0) {
            rs_batch_reset(b);
            src->stats.failures++;
            return -1;
        }
        /* Part of it is on the wire: keep the slot until those replies are
         * in (or the timer fires), but nobody is waiting for them. */
        LOG_ERROR("redis_batch_send_failed", "kind=%s sent_chunks=%zu of=%zu",
                  rs_batch_kind_to_str(b->kind), ch, b->chunks);
        b->chunks = ch;
        b->cb = NULL;
        b->held_cb = NULL;
        b->active = true;
        src->stats.round_trips++;
        src->stats.failures++;
        return -1;
    }
    b->active = true;
    if (b->n)
        src->stats.round_trips++;
    return 0;
}

static bool rs_batch_can_start(const struct redis_source *src, enum rs_batch_kind kind, size_t n,
                               const void *items, bool has_cb)
{
    if (!src || src->dying || !has_cb || (n > 0 && !items))
        return false;
    if (n > REDIS_SOURCE_MAX_KEYS) {
        LOG_WARN("redis_batch_too_large", "kind=%s n=%zu max=%d", rs_batch_kind_to_str(kind), n,
                 REDIS_SOURCE_MAX_KEYS);
        return false;
    }
    return src->cmd.state == RS_READY && !src->batch[kind].active;
}

int redis_source_queue_lengths(struct redis_source *src, const struct redis_queue_query *q,
                               size_t n, redis_queue_cb cb, void *ud)
{
    if (!rs_batch_can_start(src, RS_BATCH_QUEUE, n, q, cb != NULL))
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (!q[i].key)
            return -1;
    }
    struct rs_batch *b = &src->batch[RS_BATCH_QUEUE];
    b->keys = n ? thaw_calloc(n, sizeof *b->keys) : NULL;
    b->args = n ? thaw_calloc(n, sizeof *b->args) : NULL;
    b->n = n;
    if (n && (!b->keys || !b->args)) {
        rs_batch_reset(b);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        b->keys[i] = thaw_strdup(q[i].key);
        b->args[i] = thaw_strdup(q[i].group ? q[i].group : "");
        if (!b->keys[i] || !b->args[i]) {
            rs_batch_reset(b);
            return -1;
        }
    }
    return rs_batch_launch(b, cb, NULL, ud);
}

int redis_source_held_counts(struct redis_source *src, const char *const *models, size_t n,
                             int64_t now_unix_ms, int64_t fresh_ms, redis_held_cb cb, void *ud)
{
    if (!rs_batch_can_start(src, RS_BATCH_HELD, n, models, cb != NULL))
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (!models[i])
            return -1;
    }
    struct rs_batch *b = &src->batch[RS_BATCH_HELD];
    b->keys = n ? thaw_calloc(n, sizeof *b->keys) : NULL;
    b->n = n;
    if (n && !b->keys) {
        rs_batch_reset(b);
        return -1;
    }
    size_t plen = sizeof RS_HELD_PREFIX - 1;
    for (size_t i = 0; i < n; i++) {
        size_t mlen = strlen(models[i]);
        b->keys[i] = thaw_malloc(plen + mlen + 1);
        if (!b->keys[i]) {
            rs_batch_reset(b);
            return -1;
        }
        memcpy(b->keys[i], RS_HELD_PREFIX, plen);
        memcpy(b->keys[i] + plen, models[i], mlen + 1);
    }
    snprintf(b->now_s, sizeof b->now_s, "%" PRId64, now_unix_ms);
    snprintf(b->fresh_s, sizeof b->fresh_s, "%" PRId64, fresh_ms);
    return rs_batch_launch(b, NULL, cb, ud);
}

/* ------------------------------------------------------------------------ */
/* Connections                                                              */
/* ------------------------------------------------------------------------ */

/* Caller holds rs_enter. */
static void rs_conn_ready(struct rs_conn *c)
{
    struct redis_source *src = c->src;
    evtimer_del(c->deadline_ev);
    c->backoff_ms = RS_BACKOFF_MIN_MS;
    rs_conn_set_state(c, RS_READY);
    LOG_INFO("redis_connected", "conn=%s host=%s port=%d db=%ld", rs_conn_kind_to_str(c->kind),
             src->host, src->port, src->db);
    if (c->kind == RS_CONN_CMD && src->cbs.on_state && !src->dying)
        src->cbs.on_state(src->ud, true);
}

static void rs_on_sub_msg(redisAsyncContext *ac, void *r, void *priv)
{
    struct rs_conn *c = ac->data;
    redisReply *reply = r;
    if (!c || !reply || reply->type != REDIS_REPLY_ARRAY || reply->elements < 3)
        return;
    struct redis_source *src = c->src;
    const redisReply *type = reply->element[0];
    const redisReply *body = reply->element[2];
    if (type->type != REDIS_REPLY_STRING)
        return;
    rs_enter(src);
    if (strcmp(type->str, "subscribe") == 0) {
        if (c->state == RS_HANDSHAKE)
            rs_conn_ready(c);
    } else if (strcmp(type->str, "message") == 0) {
        if (body->type != REDIS_REPLY_STRING || body->len == 0 ||
            strlen(body->str) != body->len) {
            LOG_WARN("redis_wake_ignored", "reason=%s", "empty or binary model name");
        } else {
            src->stats.wake_messages++;
            char q[128];
            LOG_DEBUG("redis_wake", "model=%s", log_quote(q, sizeof q, body->str));
            if (src->cbs.on_wake && !src->dying)
                src->cbs.on_wake(src->ud, body->str);
        }
    }
    rs_leave(src);
}

/* rc of a command handed to hiredis: if accepted, its reply is due. */
static int rs_sent(struct rs_conn *c, int rc)
{
    if (rc == REDIS_OK)
        redis_guard_conn_sent(&c->guard, 1);
    return rc;
}

static int rs_send_auth(struct rs_conn *c, redisCallbackFn *fn)
{
    struct redis_source *src = c->src;
    const char *argv[3] = {"AUTH", NULL, NULL};
    int argc = 1;
    if (src->user)
        argv[argc++] = src->user;
    argv[argc++] = src->password;
    return rs_sent(c, redisAsyncCommandArgv(c->ac, fn, (void *)(uintptr_t)RS_HS_AUTH, argc,
                                            argv, NULL));
}

static int rs_send_subscribe(struct rs_conn *c)
{
    int rc = redisAsyncCommand(c->ac, rs_on_sub_msg, NULL, "SUBSCRIBE %s", RS_WAKE_CHANNEL);
    /* hiredis is in pub/sub mode from the send on; so is the guard. */
    if (rc == REDIS_OK)
        redis_guard_conn_pubsub(&c->guard);
    return rc;
}

static void rs_on_hs_reply(redisAsyncContext *ac, void *r, void *priv)
{
    struct rs_conn *c = ac->data;
    redisReply *reply = r;
    if (!c || !reply || c->state != RS_HANDSHAKE)
        return;
    struct redis_source *src = c->src;
    enum rs_hs_step step = (enum rs_hs_step)(uintptr_t)priv;
    char why[200];
    why[0] = '\0';
    if (reply->type == REDIS_REPLY_ERROR) {
        set_err(why, sizeof why, "%s", reply->str ? reply->str : "error reply");
    } else if (step == RS_HS_LOAD_QUEUE || step == RS_HS_LOAD_HELD) {
        enum rs_batch_kind k = step == RS_HS_LOAD_QUEUE ? RS_BATCH_QUEUE : RS_BATCH_HELD;
        if (reply->type == REDIS_REPLY_STRING && reply->len == 40)
            memcpy(src->sha[k], reply->str, 41);
        else
            set_err(why, sizeof why, "unexpected SCRIPT LOAD reply");
    } else if (step == RS_HS_AUTH && c->kind == RS_CONN_SUB) {
        if (rs_send_subscribe(c) != REDIS_OK)
            set_err(why, sizeof why, "SUBSCRIBE could not be sent");
    }
    rs_enter(src);
    if (why[0]) {
        rs_conn_drop(c, why, true);
    } else if (c->kind == RS_CONN_CMD && --c->hs_pending == 0) {
        rs_conn_ready(c);
    }
    rs_leave(src);
}

/* Queues the whole handshake at once; replies come in order. */
static int rs_send_handshake(struct rs_conn *c)
{
    struct redis_source *src = c->src;
    if (c->kind == RS_CONN_SUB) {
        /* Pub/sub is not per database: no SELECT. SUBSCRIBE waits for AUTH so
         * an AUTH error is not followed by one hiredis cannot route. */
        if (src->password)
            return rs_send_auth(c, rs_on_hs_reply);
        return rs_send_subscribe(c);
    }
    c->hs_pending = 0;
    if (src->password) {
        if (rs_send_auth(c, rs_on_hs_reply) != REDIS_OK)
            return REDIS_ERR;
        c->hs_pending++;
    }
    if (src->db != 0) {
        if (rs_sent(c, redisAsyncCommand(c->ac, rs_on_hs_reply, (void *)(uintptr_t)RS_HS_SELECT,
                                         "SELECT %ld", src->db)) != REDIS_OK)
            return REDIS_ERR;
        c->hs_pending++;
    }
    const enum rs_hs_step steps[RS_BATCH_KINDS] = {RS_HS_LOAD_QUEUE, RS_HS_LOAD_HELD};
    for (int k = 0; k < RS_BATCH_KINDS; k++) {
        if (rs_sent(c, redisAsyncCommand(c->ac, rs_on_hs_reply, (void *)(uintptr_t)steps[k],
                                         "SCRIPT LOAD %s", rs_scripts[k])) != REDIS_OK)
            return REDIS_ERR;
        c->hs_pending++;
    }
    return REDIS_OK;
}

static void rs_on_connect(const redisAsyncContext *cac, int status)
{
    struct rs_conn *c = cac->data;
    if (!c)
        return;
    struct redis_source *src = c->src;
    rs_enter(src);
    if (status != REDIS_OK) {
        char why[200];
        set_err(why, sizeof why, "%s", cac->errstr ? cac->errstr : "connect failed");
        c->ac = NULL; /* hiredis frees it when we return */
        rs_conn_lost(c, why);
    } else {
        rs_conn_set_state(c, RS_HANDSHAKE);
        /* A dead peer on an idle pub/sub connection is otherwise never noticed. */
        if (redisEnableKeepAlive(&c->ac->c) != REDIS_OK)
            LOG_WARN("redis_keepalive_failed", "conn=%s", rs_conn_kind_to_str(c->kind));
        if (rs_send_handshake(c) != REDIS_OK)
            rs_conn_drop(c, "handshake could not be sent", true);
    }
    rs_leave(src);
}

static void rs_on_disconnect(const redisAsyncContext *cac, int status)
{
    struct rs_conn *c = cac->data;
    if (!c)
        return; /* we let it go ourselves and already said so */
    struct redis_source *src = c->src;
    char why[200];
    set_err(why, sizeof why, "%s",
            status == REDIS_OK ? "closed" : (cac->errstr ? cac->errstr : "error"));
    c->ac = NULL; /* hiredis frees it when we return */
    rs_enter(src);
    rs_conn_lost(c, why);
    rs_leave(src);
}

/* Not called from hiredis: a failed attempt is reported from here directly. */
static void rs_conn_start(struct rs_conn *c)
{
    struct redis_source *src = c->src;
    if (c->tried)
        src->stats.reconnects++;
    c->tried = true;
    rs_conn_set_state(c, RS_CONNECTING);
    char why[200];
    /* hiredis 0.14 resolves host names with a blocking getaddrinfo here. */
    redisAsyncContext *ac = redisAsyncConnect(src->host, src->port);
    if (!ac || ac->err) {
        set_err(why, sizeof why, "%s", ac && ac->errstr ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        goto fail;
    }
    /* A huge array header or a reply hiredis would abort on must not cost GBs
     * or the process (common/redis_guard.h). */
    redis_guard_conn_init(&c->guard);
    if (redis_guard_attach(ac->c.reader, &c->guard) != 0) {
        redisAsyncFree(ac);
        set_err(why, sizeof why, "reply guard could not be installed");
        goto fail;
    }
    if (redis_guard_libevent_attach(ac, src->base) != 0) {
        redisAsyncFree(ac);
        set_err(why, sizeof why, "libevent attach failed");
        goto fail;
    }
    ac->data = c;
    redisAsyncSetConnectCallback(ac, rs_on_connect);
    redisAsyncSetDisconnectCallback(ac, rs_on_disconnect);
    c->ac = ac;
    struct timeval tv = rs_tv(src->timeout_ms);
    if (evtimer_add(c->deadline_ev, &tv) != 0) {
        rs_enter(src);
        rs_conn_drop(c, "deadline timer failed", false);
        rs_leave(src);
    }
    return;

fail:
    rs_enter(src);
    rs_conn_lost(c, why);
    rs_leave(src);
}

static void rs_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rs_conn *c = arg;
    if (c->state == RS_DOWN)
        rs_conn_start(c);
}

static void rs_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rs_conn *c = arg;
    if (c->state != RS_CONNECTING && c->state != RS_HANDSHAKE)
        return;
    struct redis_source *src = c->src;
    rs_enter(src);
    rs_conn_drop(c, c->state == RS_CONNECTING ? "connect timeout" : "handshake timeout", false);
    rs_leave(src);
}

static void rs_reap_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rs_conn *c = arg;
    redisAsyncContext *ac = c->reap_ac;
    c->reap_ac = NULL;
    if (ac)
        redisAsyncFree(ac); /* detached: its pending callbacks do nothing */
}

static int rs_conn_init(struct redis_source *src, struct rs_conn *c, enum rs_conn_kind kind)
{
    c->src = src;
    c->kind = kind;
    c->state = RS_DOWN;
    c->backoff_ms = RS_BACKOFF_MIN_MS;
    c->retry_ev = evtimer_new(src->base, rs_retry_cb, c);
    c->deadline_ev = evtimer_new(src->base, rs_deadline_cb, c);
    c->reap_ev = evtimer_new(src->base, rs_reap_cb, c);
    return c->retry_ev && c->deadline_ev && c->reap_ev ? 0 : -1;
}

static void rs_conn_finish(struct rs_conn *c)
{
    redisAsyncContext *acs[2] = {c->ac, c->reap_ac};
    c->ac = NULL;
    c->reap_ac = NULL;
    for (int i = 0; i < 2; i++) {
        if (!acs[i])
            continue;
        acs[i]->data = NULL;
        /* Inside this context's own callback (a user callback freed us),
         * hiredis defers the free until that callback returns. */
        redisAsyncFree(acs[i]);
    }
    if (c->retry_ev)
        event_free(c->retry_ev);
    if (c->deadline_ev)
        event_free(c->deadline_ev);
    if (c->reap_ev)
        event_free(c->reap_ev);
    c->retry_ev = c->deadline_ev = c->reap_ev = NULL;
}

/* ------------------------------------------------------------------------ */
/* Lifetime                                                                 */
/* ------------------------------------------------------------------------ */

struct redis_source *redis_source_new(struct event_base *base, const char *url, long timeout_ms,
                                      const struct redis_source_callbacks *cbs, void *ud,
                                      char *err, size_t errlen)
{
    if (!base) {
        set_err(err, errlen, "no event base");
        return NULL;
    }
    if (timeout_ms <= 0) {
        set_err(err, errlen, "timeout_ms must be > 0");
        return NULL;
    }
    struct redis_source *src = thaw_calloc(1, sizeof *src);
    if (!src) {
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    src->base = base;
    src->timeout_ms = timeout_ms;
    if (cbs)
        src->cbs = *cbs;
    src->ud = ud;
    for (int k = 0; k < RS_BATCH_KINDS; k++) {
        src->batch[k].src = src;
        src->batch[k].kind = (enum rs_batch_kind)k;
    }
    if (rs_parse_url(src, url, err, errlen) != 0) {
        rs_destroy(src);
        return NULL;
    }
    bool ok = rs_conn_init(src, &src->cmd, RS_CONN_CMD) == 0 &&
              rs_conn_init(src, &src->sub, RS_CONN_SUB) == 0;
    for (int k = 0; k < RS_BATCH_KINDS && ok; k++) {
        src->batch[k].timer = evtimer_new(base, rs_batch_timer_cb, &src->batch[k]);
        ok = src->batch[k].timer != NULL;
    }
    if (!ok) {
        set_err(err, errlen, "out of memory");
        rs_destroy(src);
        return NULL;
    }
    LOG_INFO("redis_source_start", "host=%s port=%d db=%ld auth=%s timeout_ms=%ld", src->host,
             src->port, src->db, src->password ? "yes" : "no", timeout_ms);
    rs_conn_start(&src->cmd);
    rs_conn_start(&src->sub);
    return src;
}

static void rs_destroy(struct redis_source *src)
{
    rs_conn_finish(&src->cmd);
    rs_conn_finish(&src->sub);
    for (int k = 0; k < RS_BATCH_KINDS; k++) {
        rs_batch_reset(&src->batch[k]);
        if (src->batch[k].timer)
            event_free(src->batch[k].timer);
    }
    thaw_free(src->host);
    thaw_free(src->user);
    thaw_free(src->password);
    thaw_free(src);
}

void redis_source_free(struct redis_source *src)
{
    if (!src || src->dying)
        return;
    src->dying = true;
    if (src->depth == 0)
        rs_destroy(src);
}

bool redis_source_connected(const struct redis_source *src)
{
    return src && !src->dying && src->cmd.state == RS_READY;
}

void redis_source_get_stats(const struct redis_source *src, struct redis_source_stats *out)
{
    if (!out)
        return;
    if (!src) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = src->stats;
    out->wake_subscribed = src->sub.state == RS_READY;
}
