/* grpc_frame: gRPC's length-prefixed message framing, with no I/O.
 *
 * Each message on a gRPC stream is 1 byte compressed-flag, 4 bytes big-endian
 * length, then the bytes. The reader takes DATA chunks as they arrive, in any
 * split, and says when a whole message is ready. It holds only the bytes that
 * have arrived (a declared length reserves nothing), and it asks a budget
 * before it grows, so a peer that announces big messages on many streams
 * costs what it sends and no more than the budget allows. Status codes and
 * the percent-encoding of grpc-message live here too. */
#ifndef THAW_GRPC_FRAME_H
#define THAW_GRPC_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define GRPC_FRAME_HEADER_LEN 5
#define GRPC_DEFAULT_MAX_MESSAGE (4u * 1024u * 1024u)

enum grpc_status {
    GRPC_STATUS_OK = 0,
    GRPC_STATUS_CANCELLED = 1,
    GRPC_STATUS_UNKNOWN = 2,
    GRPC_STATUS_INVALID_ARGUMENT = 3,
    GRPC_STATUS_DEADLINE_EXCEEDED = 4,
    GRPC_STATUS_NOT_FOUND = 5,
    GRPC_STATUS_ALREADY_EXISTS = 6,
    GRPC_STATUS_PERMISSION_DENIED = 7,
    GRPC_STATUS_RESOURCE_EXHAUSTED = 8,
    GRPC_STATUS_FAILED_PRECONDITION = 9,
    GRPC_STATUS_ABORTED = 10,
    GRPC_STATUS_OUT_OF_RANGE = 11,
    GRPC_STATUS_UNIMPLEMENTED = 12,
    GRPC_STATUS_INTERNAL = 13,
    GRPC_STATUS_UNAVAILABLE = 14,
    GRPC_STATUS_DATA_LOSS = 15,
    GRPC_STATUS_UNAUTHENTICATED = 16,
};
#define GRPC_STATUS_COUNT 17

/* "OK", "INVALID_ARGUMENT", ...; "UNKNOWN_CODE" outside the range. */
const char *grpc_status_to_str(int status);

enum grpc_read_result {
    GRPC_READ_INCOMPLETE = 0,   /* all input consumed, no whole message yet */
    GRPC_READ_MESSAGE = 1,      /* a message is ready: grpc_reader_message() */
    GRPC_READ_TOO_LARGE = -1,   /* declared length over the limit */
    GRPC_READ_COMPRESSED = -2,  /* compressed flag set: we negotiate no compression */
    GRPC_READ_BAD_FLAG = -3,    /* flag byte other than 0 or 1 */
    GRPC_READ_NOMEM = -4,
    GRPC_READ_OVER_BUDGET = -5, /* the budget refused the bytes this message needs */
};

/* Asked before the reader holds `bytes` more; returns 0 to allow, -1 to
 * refuse. The reader never gives bytes back: the owner keeps the total and
 * releases it when it is done with the reader. */
typedef int (*grpc_reader_reserve_fn)(void *ud, size_t bytes);

struct grpc_reader {
    uint8_t header[GRPC_FRAME_HEADER_LEN];
    size_t header_have;
    uint8_t *msg;
    size_t msg_cap; /* bytes allocated for msg: grows with msg_have, up to msg_len + 1 */
    size_t msg_len;
    size_t msg_have;
    size_t max_len;
    int ready;
    grpc_reader_reserve_fn reserve;
    void *reserve_ud;
};

/* Storage owned by the caller; max_len bounds one message. reserve may be
 * NULL (no budget). */
void grpc_reader_init(struct grpc_reader *r, size_t max_len, grpc_reader_reserve_fn reserve,
                      void *reserve_ud);
void grpc_reader_finish(struct grpc_reader *r);

/* Consumes bytes of data until a message completes or data runs out; sets
 * *consumed. After GRPC_READ_MESSAGE, take the message with
 * grpc_reader_message() before feeding more. Errors are final. */
enum grpc_read_result grpc_reader_feed(struct grpc_reader *r, const uint8_t *data, size_t len,
                                       size_t *consumed);
/* The ready message (valid until the next feed or finish); NULL when none. */
const uint8_t *grpc_reader_message(struct grpc_reader *r, size_t *len);
/* The ready message, handed over: the caller frees it with thaw_free (it has
 * a NUL byte after len bytes). NULL when none. */
uint8_t *grpc_reader_take_message(struct grpc_reader *r, size_t *len);
/* True while a message is partly read (for "stream ended mid-message"). */
int grpc_reader_partial(const struct grpc_reader *r);
const char *grpc_read_result_to_str(enum grpc_read_result res);

/* Writes the 5-byte prefix of an uncompressed message of len bytes. */
void grpc_frame_header(uint8_t out[GRPC_FRAME_HEADER_LEN], uint32_t len);

/* Percent-encodes s for the grpc-message trailer (bytes outside 0x20..0x7e
 * and '%'). Truncates to fit; returns out. */
char *grpc_percent_encode(char *out, size_t outlen, const char *s);

#endif
