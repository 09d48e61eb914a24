/* redis_guard: bounds what one Redis reply can make hiredis allocate.
 *
 * hiredis 0.14 allocates an array reply's element pointers as soon as it reads
 * the header "*<n>", before any element arrives, so "*111111111\r\n" (12 bytes)
 * from a hostile or broken Redis costs ~900 MB, and nested headers multiply it.
 * The guard gives a reader hiredis's own reply functions except that an array
 * header is refused once the elements declared by all the arrays of one reply
 * (nested ones included) would exceed REDIS_GUARD_MAX_ELEMENTS. A refused
 * header makes hiredis fail the reader (REDIS_ERR_OOM, "Out of memory"; the
 * guard logs redis_reply_refused with the real cause), which an async context
 * turns into a disconnect, so the owner's reconnect path takes over. The
 * running count is kept in the len field of the reply's root array (unused
 * by hiredis for arrays): there it reads as the elements declared in the
 * whole reply.
 *
 * With a redis_guard_conn attached (redis_guard_attach), the guard also
 * refuses the out-of-protocol replies on which hiredis 0.14's async code
 * assert()s, i.e. aborts the process (async.c redisProcessCallbacks and
 * __redisGetSubscribeCallback):
 *  - a reply no command is waiting for, on a connection not in pub/sub mode
 *    (an error reply excepted: hiredis disconnects on it by itself). The
 *    owner says each command it sends (redis_guard_conn_sent); a reply past
 *    them is refused. In pub/sub mode the same holds for non-array replies
 *    (hiredis would hand one to the callback of the reply before it);
 *  - in pub/sub mode (redis_guard_conn_pubsub, from sending SUBSCRIBE on), an
 *    array that is not a pub/sub message: fewer than 2 elements, a first or
 *    second element that is not a bulk string, or an (p)unsubscribe message
 *    without an integer third element. An unsubscribe with a count of 0 ends
 *    pub/sub mode for the guard (hiredis may leave it then), so what follows
 *    needs a command again.
 * Refusals are logged (redis_reply_refused, with the reason) and counted.
 *
 * Bulk strings are built by hiredis only once all their bytes have arrived,
 * so "$4000000000\r\n" and a stream of bytes grows the reader's buffer
 * without any reply function being called. redis_guard_libevent_attach
 * bounds that: a context attached with it fails (the owner's disconnect
 * callback, errstr "reply over ... bytes refused") instead of reading on
 * once REDIS_GUARD_MAX_PENDING_BYTES of replies not yet complete are
 * buffered. */
#ifndef THAW_REDIS_GUARD_H
#define THAW_REDIS_GUARD_H

#include <stdbool.h>

#include <hiredis/async.h>
#include <hiredis/read.h>

struct event_base;

/* Elements one reply may declare in all its arrays together. Thaw's biggest
 * reply is one EVALSHA chunk of the scaler (RS_CHUNK_KEYS, 1000 integers); a
 * reply at the bound holds 8 MiB of element pointers. */
#define REDIS_GUARD_MAX_ELEMENTS (1 << 20)

/* Bytes of replies not yet complete a guarded context buffers at most
 * (checked before each read of at most 16 KiB). Thaw's biggest reply, an
 * EVALSHA chunk of held counts, is under 100 KB; a pub/sub message names one
 * model. */
#define REDIS_GUARD_MAX_PENDING_BYTES (16u << 20)

/* hiredis's libevent adapter, with the pending-bytes bound above checked
 * before every read and allocation failures reported: attaches ac to base.
 * Returns 0, or -1 (ac unchanged) if something is attached already or out
 * of memory. */
int redis_guard_libevent_attach(redisAsyncContext *ac, struct event_base *base);

/* Installs the guard on reader, which must still use hiredis's default reply
 * functions (a reader from redisReaderCreate() or a context's c.reader) or
 * already be guarded; call it before the reader is fed. The function table is
 * static and shared, not owned by the reader. Returns 0, or -1 (reader
 * unchanged) if reader is NULL, uses other functions, or hiredis could not
 * allocate the probe reader the defaults are read from (first call only). */
int redis_guard_install(redisReader *reader);

/* One connection's reply rules. It lives inside the owner's connection
 * struct (no allocation to fail) and must outlive the reader it is attached
 * to; the fields are the guard's. */
struct redis_guard_conn {
    unsigned long awaited; /* commands sent whose reply has not begun */
    bool pubsub;           /* SUBSCRIBE sent: pub/sub messages need no command */
    bool unsubscribe;      /* the array being read is an (p)unsubscribe message */
    unsigned long refused; /* replies refused, all reasons */
};

/* Zeroes g: no command sent, not in pub/sub mode. */
void redis_guard_conn_init(struct redis_guard_conn *g);
/* Installs the guard on reader (as redis_guard_install) with g's rules.
 * Returns 0, or -1 (reader unchanged) where redis_guard_install fails or the
 * reader's privdata, which carries g to the guard, is already in use. */
int redis_guard_attach(redisReader *reader, struct redis_guard_conn *g);
/* The owner sent n commands (call after hiredis accepted them). */
void redis_guard_conn_sent(struct redis_guard_conn *g, unsigned n);
/* The owner sent SUBSCRIBE: from now on pub/sub messages arrive unasked. */
void redis_guard_conn_pubsub(struct redis_guard_conn *g);
/* Replies refused by any guarded reader of this process, for every reason
 * (each one failed its connection). */
unsigned long redis_guard_refused_total(void);

#endif
