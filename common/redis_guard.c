#include "redis_guard.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>

#include "alloc.h"
#include "log.h"

/* hiredis's default table is static inside the library; it is read once from
 * a probe reader. Thaw runs one thread per process, so a lazy init is safe. */
static const redisReplyObjectFunctions *guard_base;
static redisReplyObjectFunctions guard_fns;
static unsigned long refused_total; /* every refusal in this process */

static bool refuse(struct redis_guard_conn *g, const char *reason, int type, int idx)
{
    g->refused++;
    refused_total++;
    LOG_WARN("redis_reply_refused", "reason=%s type=%d index=%d awaited=%lu pubsub=%s", reason,
             type, idx, g->awaited, g->pubsub ? "true" : "false");
    return false; /* hiredis fails the reader: "Out of memory", then a disconnect */
}

/* As hiredis reads a pub/sub kind: a C string (up to the first NUL byte),
 * an optional leading 'p' for the pattern variant, then compared without
 * case. */
static bool is_unsubscribe(const char *str, size_t len)
{
    size_t n = strnlen(str, len);
    if (n > 0 && (str[0] == 'p' || str[0] == 'P')) {
        str++;
        n--;
    }
    return n == 11 && strncasecmp(str, "unsubscribe", 11) == 0;
}

/* The connection rules (redis_guard.h) for an object about to be made: type
 * is the reply type, str/len a string's bytes, elements an array's size. The
 * connection is the root task's privdata (hiredis copies the reader's there);
 * none attached: every object is admitted. */
static bool admit(const redisReadTask *task, int type, const char *str, size_t len, int elements,
                  long long integer)
{
    const redisReadTask *root = task;
    while (root->parent)
        root = root->parent;
    struct redis_guard_conn *g = root->privdata;
    if (!g)
        return true;
    if (task == root) {
        g->unsubscribe = false;
        /* In pub/sub mode hiredis takes every array for a pub/sub message. */
        if (g->pubsub && type == REDIS_REPLY_ARRAY)
            return elements >= 2 || refuse(g, "pubsub_message_short", type, -1);
        if (g->awaited > 0) {
            g->awaited--;
            return true;
        }
        return type == REDIS_REPLY_ERROR || refuse(g, "unsolicited_reply", type, -1);
    }
    if (!g->pubsub || task->parent != root || root->type != REDIS_REPLY_ARRAY)
        return true;
    if (task->idx == 0 || task->idx == 1) {
        if (type != REDIS_REPLY_STRING)
            return refuse(g, "pubsub_field_not_string", type, task->idx);
        if (task->idx == 0 && is_unsubscribe(str, len)) {
            g->unsubscribe = true;
            if (root->elements < 3)
                return refuse(g, "unsubscribe_without_count", type, task->idx);
        }
    } else if (task->idx == 2 && g->unsubscribe) {
        if (type != REDIS_REPLY_INTEGER)
            return refuse(g, "unsubscribe_without_count", type, task->idx);
        /* On a count of 0 hiredis may leave pub/sub mode (when the channel
         * was its own): from then on every reply needs a command again, which
         * is the safe side whichever it did. */
        if (integer == 0)
            g->pubsub = false;
    }
    return true;
}

static void *guard_create_string(const redisReadTask *task, char *str, size_t len)
{
    if (!admit(task, task->type, str, len, 0, 0))
        return NULL;
    return guard_base->createString(task, str, len);
}

static void *guard_create_integer(const redisReadTask *task, long long value)
{
    if (!admit(task, REDIS_REPLY_INTEGER, NULL, 0, 0, value))
        return NULL;
    return guard_base->createInteger(task, value);
}

static void *guard_create_nil(const redisReadTask *task)
{
    if (!admit(task, REDIS_REPLY_NIL, NULL, 0, 0, 0))
        return NULL;
    return guard_base->createNil(task);
}

static void *guard_create_array(const redisReadTask *task, int elements)
{
    if (!admit(task, REDIS_REPLY_ARRAY, NULL, 0, elements, 0))
        return NULL;
    if (elements == 0)
        return guard_base->createArray(task, elements);
    const redisReadTask *root = task;
    int depth = 0;
    while (root->parent) {
        root = root->parent;
        depth++;
    }
    /* One reply's running count lives in its root array's len, a field
     * hiredis leaves unused for arrays: the reader keeps no per-reply state
     * that a reply function could reach. The parents are arrays this function
     * made (hiredis sets a task's obj before it reads the children). */
    redisReply *top = root != task ? root->obj : NULL;
    size_t declared = top ? top->len : 0;
    /* hiredis checks the range of "*<n>" and sends -1 to createNil, but a
     * negative count would turn into a huge size_t in the reply: refused too. */
    if (elements < 0 || declared > REDIS_GUARD_MAX_ELEMENTS ||
        (size_t)elements > REDIS_GUARD_MAX_ELEMENTS - declared) {
        refused_total++;
        struct redis_guard_conn *g = root->privdata;
        if (g)
            g->refused++;
        LOG_WARN("redis_reply_refused", "reason=too_many_elements elements=%d declared=%zu depth=%d limit=%d",
                 elements, declared, depth, REDIS_GUARD_MAX_ELEMENTS);
        return NULL; /* hiredis fails the reader: "Out of memory" */
    }
    redisReply *r = guard_base->createArray(task, elements);
    if (!r)
        return NULL;
    if (top)
        top->len = declared + (size_t)elements;
    else
        r->len = (size_t)elements;
    return r;
}

int redis_guard_install(redisReader *reader)
{
    if (!reader)
        return -1;
    if (reader->fn == &guard_fns)
        return 0;
    if (!guard_base) {
        redisReader *probe = redisReaderCreate();
        if (!probe)
            return -1;
        const redisReplyObjectFunctions *base = probe->fn;
        redisReaderFree(probe);
        if (!base || !base->createArray)
            return -1;
        if (!base->createString || !base->createInteger || !base->createNil)
            return -1;
        guard_fns = *base;
        guard_fns.createArray = guard_create_array;
        guard_fns.createString = guard_create_string;
        guard_fns.createInteger = guard_create_integer;
        guard_fns.createNil = guard_create_nil;
        guard_base = base;
    }
    /* Another table may build objects that are not redisReply. */
    if (reader->fn != guard_base)
        return -1;
    reader->fn = &guard_fns;
    return 0;
}

void redis_guard_conn_init(struct redis_guard_conn *g)
{
    g->awaited = 0;
    g->pubsub = false;
    g->unsubscribe = false;
    g->refused = 0;
}

int redis_guard_attach(redisReader *reader, struct redis_guard_conn *g)
{
    if (!reader || !g || (reader->privdata && reader->privdata != g))
        return -1;
    if (redis_guard_install(reader) != 0)
        return -1;
    reader->privdata = g;
    return 0;
}

void redis_guard_conn_sent(struct redis_guard_conn *g, unsigned n)
{
    g->awaited += n;
}

void redis_guard_conn_pubsub(struct redis_guard_conn *g)
{
    g->pubsub = true;
}

unsigned long redis_guard_refused_total(void)
{
    return refused_total;
}

/* ---- the event-loop adapter ------------------------------------------- */

struct guard_events {
    redisAsyncContext *ac;
    struct event *rev, *wev;
};

static void guard_read_event(evutil_socket_t fd, short what, void *arg)
{
    struct guard_events *e = arg;
    redisContext *c = &e->ac->c;
    size_t pending = c->reader && c->reader->len > c->reader->pos ? c->reader->len - c->reader->pos
                                                                   : 0;
    if (pending > REDIS_GUARD_MAX_PENDING_BYTES && !c->err) {
        struct redis_guard_conn *g = c->reader->privdata;
        refused_total++;
        if (g)
            g->refused++;
        LOG_WARN("redis_reply_refused", "reason=reply_too_big pending_bytes=%zu limit=%u",
                 pending, REDIS_GUARD_MAX_PENDING_BYTES);
        /* hiredis reads nothing on a context in error: it disconnects, and
         * the owner's disconnect callback sees this reason. */
        c->err = REDIS_ERR_OOM;
        snprintf(c->errstr, sizeof(c->errstr), "reply over %u bytes refused",
                 REDIS_GUARD_MAX_PENDING_BYTES);
    }
    redisAsyncHandleRead(e->ac);
}

static void guard_write_event(evutil_socket_t fd, short what, void *arg)
{
    struct guard_events *e = arg;
    redisAsyncHandleWrite(e->ac);
}

static void guard_add_read(void *p)
{
    struct guard_events *e = p;
    if (event_add(e->rev, NULL) != 0)
        LOG_ERROR("redis_event_failed", "op=add_read");
}

static void guard_del_read(void *p)
{
    struct guard_events *e = p;
    event_del(e->rev);
}

static void guard_add_write(void *p)
{
    struct guard_events *e = p;
    if (event_add(e->wev, NULL) != 0)
        LOG_ERROR("redis_event_failed", "op=add_write");
}

static void guard_del_write(void *p)
{
    struct guard_events *e = p;
    event_del(e->wev);
}

static void guard_cleanup(void *p)
{
    struct guard_events *e = p;
    event_free(e->rev);
    event_free(e->wev);
    thaw_free(e);
}

int redis_guard_libevent_attach(redisAsyncContext *ac, struct event_base *base)
{
    if (!ac || !base || ac->ev.data)
        return -1;
    struct guard_events *e = thaw_calloc(1, sizeof(*e));
    if (!e)
        return -1;
    e->ac = ac;
    e->rev = event_new(base, ac->c.fd, EV_READ, guard_read_event, e);
    e->wev = event_new(base, ac->c.fd, EV_WRITE, guard_write_event, e);
    if (!e->rev || !e->wev) {
        if (e->rev)
            event_free(e->rev);
        if (e->wev)
            event_free(e->wev);
        thaw_free(e);
        return -1;
    }
    ac->ev.addRead = guard_add_read;
    ac->ev.delRead = guard_del_read;
    ac->ev.addWrite = guard_add_write;
    ac->ev.delWrite = guard_del_write;
    ac->ev.cleanup = guard_cleanup;
    ac->ev.data = e;
    /* As hiredis's adapter: the connect completes on the first write or read event. */
    guard_add_read(e);
    guard_add_write(e);
    return 0;
}
