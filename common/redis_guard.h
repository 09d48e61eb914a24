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
 * Not covered: hiredis's assert()s on out-of-protocol replies, and bulk
 * strings, which hiredis only builds once all their bytes have arrived. */
#ifndef THAW_REDIS_GUARD_H
#define THAW_REDIS_GUARD_H

#include <hiredis/read.h>

/* Elements one reply may declare in all its arrays together. Thaw's biggest
 * reply is one EVALSHA chunk of the scaler (RS_CHUNK_KEYS, 1000 integers); a
 * reply at the bound holds 8 MiB of element pointers. */
#define REDIS_GUARD_MAX_ELEMENTS (1 << 20)

/* Installs the guard on reader, which must still use hiredis's default reply
 * functions (a reader from redisReaderCreate() or a context's c.reader) or
 * already be guarded; call it before the reader is fed. The function table is
 * static and shared, not owned by the reader. Returns 0, or -1 (reader
 * unchanged) if reader is NULL, uses other functions, or hiredis could not
 * allocate the probe reader the defaults are read from (first call only). */
int redis_guard_install(redisReader *reader);

#endif
