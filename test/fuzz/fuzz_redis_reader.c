/* Target redis_reader: hiredis's RESP reader (redisReaderFeed +
 * redisReaderGetReply) with Thaw's reply guard (common/redis_guard.c), the
 * parser every byte from Redis goes through before scaler/redis_source.c and
 * activator/redis_link.c see a redisReply. Their
 * reply handling lives in static hiredis callbacks (no pure function to call);
 * the redis_source target drives that code itself through a fake server.
 *
 * Input: a reply stream. It is read in one piece and in chunks; the replies
 * (a digest of type, integer, string bytes and elements, recursively) and the
 * error state must match. Each reply is also checked the way the callbacks
 * read it: element pointers non-NULL, strings NUL-terminated at len, and no
 * more array elements in one reply than the guard allows. Huge array headers
 * need no skipping: the guard refuses them before hiredis allocates. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "fuzz.h"
#include "redis_guard.h"

#define MAX_REPLIES 1024

struct digest {
    uint64_t h;
    size_t replies;
    size_t declared; /* array elements in the current reply */
    bool error;
};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    return 0;
}

static void mix(struct digest *d, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        d->h ^= b[i];
        d->h *= 1099511628211ull;
    }
}

static void walk(struct digest *d, const redisReply *r, int depth)
{
    FUZZ_CHECK(r != NULL, "NULL reply element");
    FUZZ_CHECK(depth < 16, "nesting %d", depth);
    mix(d, &r->type, sizeof(r->type));
    switch (r->type) {
    case REDIS_REPLY_INTEGER:
        mix(d, &r->integer, sizeof(r->integer));
        break;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
        FUZZ_CHECK(r->str != NULL && r->str[r->len] == '\0', "string not terminated at len");
        mix(d, &r->len, sizeof(r->len));
        mix(d, r->str, r->len);
        /* What redis_source does with a stream's message body. */
        (void)(strlen(r->str) != r->len);
        break;
    case REDIS_REPLY_ARRAY:
        mix(d, &r->elements, sizeof(r->elements));
        FUZZ_CHECK(r->elements == 0 || r->element != NULL, "array without elements");
        d->declared += r->elements;
        FUZZ_CHECK(d->declared <= REDIS_GUARD_MAX_ELEMENTS, "%zu array elements in one reply",
                   d->declared);
        for (size_t i = 0; i < r->elements; i++)
            walk(d, r->element[i], depth + 1);
        break;
    case REDIS_REPLY_NIL:
        break;
    default:
        fuzz_fail(__FILE__, __LINE__, "reply type %d", r->type);
    }
}

static void read_all(const uint8_t *s, size_t n, struct fuzz_rng *rng, struct digest *d)
{
    memset(d, 0, sizeof(*d));
    d->h = 1469598103934665603ull;
    redisReader *rd = redisReaderCreate();
    if (!rd)
        return;
    if (redis_guard_install(rd) != 0)
        fuzz_fail(__FILE__, __LINE__, "redis_guard_install failed");
    size_t off = 0;
    while (off < n && !d->error && d->replies < MAX_REPLIES) {
        size_t chunk = rng ? fuzz_rng_chunk(rng, n - off) : n - off;
        if (redisReaderFeed(rd, (const char *)s + off, chunk) != REDIS_OK) {
            d->error = true;
            break;
        }
        off += chunk;
        for (;;) {
            void *reply = NULL;
            if (redisReaderGetReply(rd, &reply) != REDIS_OK) {
                d->error = true;
                break;
            }
            if (!reply)
                break;
            d->declared = 0;
            walk(d, reply, 0);
            freeReplyObject(reply);
            if (++d->replies >= MAX_REPLIES)
                break;
        }
    }
    redisReaderFree(rd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *s = malloc(size ? size : 1);
    if (!s)
        return 0;
    if (size)
        memcpy(s, data, size);
    struct digest whole, split;
    struct fuzz_rng rng;
    fuzz_rng_seed(&rng, data, size);
    read_all(s, size, NULL, &whole);
    read_all(s, size, &rng, &split);
    if (whole.replies < MAX_REPLIES && split.replies < MAX_REPLIES)
        FUZZ_CHECK(whole.replies == split.replies && whole.h == split.h &&
                       whole.error == split.error,
                   "replies differ by split: %zu/%zu, error %d/%d", whole.replies, split.replies,
                   whole.error, split.error);
    free(s);
    return 0;
}
