#include "redis_guard.h"

#include <stddef.h>

#include <hiredis/hiredis.h>

#include "log.h"

/* hiredis's default table is static inside the library; it is read once from
 * a probe reader. Thaw runs one thread per process, so a lazy init is safe. */
static const redisReplyObjectFunctions *guard_base;
static redisReplyObjectFunctions guard_fns;

static void *guard_create_array(const redisReadTask *task, int elements)
{
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
        LOG_WARN("redis_reply_refused", "elements=%d declared=%zu depth=%d limit=%d", elements,
                 declared, depth, REDIS_GUARD_MAX_ELEMENTS);
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
        guard_fns = *base;
        guard_fns.createArray = guard_create_array;
        guard_base = base;
    }
    /* Another table may build objects that are not redisReply. */
    if (reader->fn != guard_base)
        return -1;
    reader->fn = &guard_fns;
    return 0;
}
