#include "grpc_frame.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "utf8.h"

static const char *const status_names[GRPC_STATUS_COUNT] = {
    "OK",        "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED", "NOT_FOUND",   "ALREADY_EXISTS",    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",  "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL",        "UNAVAILABLE",       "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *grpc_status_to_str(int status)
{
    if (status < 0 || status >= GRPC_STATUS_COUNT)
        return "UNKNOWN_CODE";
    return status_names[status];
}

const char *grpc_read_result_to_str(enum grpc_read_result res)
{
    switch (res) {
    case GRPC_READ_INCOMPLETE: return "incomplete";
    case GRPC_READ_MESSAGE: return "message";
    case GRPC_READ_TOO_LARGE: return "message larger than the limit";
    case GRPC_READ_COMPRESSED: return "compressed message but no compression was negotiated";
    case GRPC_READ_BAD_FLAG: return "invalid compressed-flag byte";
    case GRPC_READ_NOMEM: return "out of memory";
    case GRPC_READ_OVER_BUDGET: return "over the budget for requests in progress";
    }
    return "unknown";
}

void grpc_reader_init(struct grpc_reader *r, size_t max_len, grpc_reader_reserve_fn reserve,
                      void *reserve_ud)
{
    memset(r, 0, sizeof(*r));
    r->max_len = max_len;
    r->reserve = reserve;
    r->reserve_ud = reserve_ud;
}

void grpc_reader_finish(struct grpc_reader *r)
{
    if (!r)
        return;
    thaw_free(r->msg);
    r->msg = NULL;
    r->msg_cap = 0;
}

static void reset_for_next(struct grpc_reader *r)
{
    thaw_free(r->msg);
    r->msg = NULL;
    r->msg_cap = r->msg_len = r->msg_have = r->header_have = 0;
    r->ready = 0;
}

/* First allocation for a message; it doubles from there. Most requests
 * (a ScaledObjectRef and its metadata) fit in it at once. */
#define GRPC_READER_FIRST_CAP 16384

/* Makes room for `need` bytes of the message (need <= msg_len), plus the
 * NUL kept after a whole message. */
static enum grpc_read_result reader_grow(struct grpc_reader *r, size_t need)
{
    size_t full = r->msg_len + 1;
    if (need + 1 <= r->msg_cap)
        return GRPC_READ_INCOMPLETE;
    size_t cap = r->msg_cap ? r->msg_cap * 2 : GRPC_READER_FIRST_CAP;
    if (cap < need + 1)
        cap = need + 1;
    if (cap > full)
        cap = full;
    /* Allocated before the budget is asked, so that what the budget granted
     * is always held. */
    uint8_t *m = thaw_malloc(cap);
    if (!m)
        return GRPC_READ_NOMEM;
    if (r->reserve && r->reserve(r->reserve_ud, cap - r->msg_cap) != 0) {
        thaw_free(m);
        return GRPC_READ_OVER_BUDGET;
    }
    if (r->msg_have)
        memcpy(m, r->msg, r->msg_have);
    thaw_free(r->msg);
    r->msg = m;
    r->msg_cap = cap;
    return GRPC_READ_INCOMPLETE;
}

enum grpc_read_result grpc_reader_feed(struct grpc_reader *r, const uint8_t *data, size_t len,
                                       size_t *consumed)
{
    size_t used = 0;
    if (r->ready)
        reset_for_next(r);
    while (used < len || (r->header_have == GRPC_FRAME_HEADER_LEN && r->msg_have == r->msg_len)) {
        if (r->header_have < GRPC_FRAME_HEADER_LEN) {
            size_t take = GRPC_FRAME_HEADER_LEN - r->header_have;
            if (take > len - used)
                take = len - used;
            memcpy(r->header + r->header_have, data + used, take);
            r->header_have += take;
            used += take;
            if (r->header_have < GRPC_FRAME_HEADER_LEN)
                break;
            if (r->header[0] == 1) {
                *consumed = used;
                return GRPC_READ_COMPRESSED;
            }
            if (r->header[0] != 0) {
                *consumed = used;
                return GRPC_READ_BAD_FLAG;
            }
            r->msg_len = ((size_t)r->header[1] << 24) | ((size_t)r->header[2] << 16) |
                         ((size_t)r->header[3] << 8) | (size_t)r->header[4];
            if (r->msg_len > r->max_len) {
                *consumed = used;
                return GRPC_READ_TOO_LARGE;
            }
            r->msg_have = 0;
        }
        size_t take = r->msg_len - r->msg_have;
        if (take > len - used)
            take = len - used;
        if (take == 0 && r->msg_len > 0)
            break; /* nothing of the message yet: nothing to hold */
        /* An empty message still gets a buffer to point at. */
        enum grpc_read_result g = reader_grow(r, r->msg_have + take);
        if (g != GRPC_READ_INCOMPLETE) {
            *consumed = used;
            return g;
        }
        memcpy(r->msg + r->msg_have, data + used, take);
        r->msg_have += take;
        used += take;
        if (r->msg_have == r->msg_len) {
            r->msg[r->msg_len] = 0;
            r->ready = 1;
            *consumed = used;
            return GRPC_READ_MESSAGE;
        }
    }
    *consumed = used;
    return GRPC_READ_INCOMPLETE;
}

const uint8_t *grpc_reader_message(struct grpc_reader *r, size_t *len)
{
    if (!r->ready)
        return NULL;
    *len = r->msg_len;
    return r->msg;
}

uint8_t *grpc_reader_take_message(struct grpc_reader *r, size_t *len)
{
    if (!r->ready)
        return NULL;
    uint8_t *m = r->msg;
    *len = r->msg_len;
    r->msg = NULL;
    reset_for_next(r);
    return m;
}

int grpc_reader_partial(const struct grpc_reader *r)
{
    return !r->ready && r->header_have > 0;
}

void grpc_frame_header(uint8_t out[GRPC_FRAME_HEADER_LEN], uint32_t len)
{
    out[0] = 0;
    out[1] = (uint8_t)(len >> 24);
    out[2] = (uint8_t)(len >> 16);
    out[3] = (uint8_t)(len >> 8);
    out[4] = (uint8_t)len;
}

char *grpc_percent_encode(char *out, size_t outlen, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    /* U+FFFD for a byte that starts no UTF-8 sequence: the trailer must
     * decode to UTF-8 (grpc-go keeps invalid bytes in the status message,
     * grpc-js fails to decode it), and messages quote values cut at a byte
     * count. */
    static const unsigned char replacement[] = {0xef, 0xbf, 0xbd};
    size_t o = 0;
    if (outlen == 0)
        return out;
    const unsigned char *p = (const unsigned char *)s;
    size_t left = strlen(s);
    while (left > 0) {
        if (*p >= 0x20 && *p <= 0x7e && *p != '%') {
            if (o + 1 >= outlen)
                break;
            out[o++] = (char)*p;
            p++;
            left--;
            continue;
        }
        size_t n = *p < 0x80 ? 1 : utf8_seq_len(p, left);
        const unsigned char *seq = n ? p : replacement;
        size_t emit = n ? n : sizeof(replacement);
        /* A character whole or not at all: truncation must not cut one. */
        if (o + 3 * emit >= outlen)
            break;
        for (size_t i = 0; i < emit; i++) {
            out[o++] = '%';
            out[o++] = hex[seq[i] >> 4];
            out[o++] = hex[seq[i] & 15];
        }
        p += n ? n : 1;
        left -= n ? n : 1;
    }
    out[o] = '\0';
    return out;
}
