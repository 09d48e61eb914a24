/* Target grpc_frame: the gRPC length-prefixed message reader
 * (common/grpc_frame.c, grpc_reader_feed) and grpc_percent_encode.
 *
 * Input: byte 0 picks the message size limit, the rest is a request stream as
 * DATA frames would carry it. The stream is read twice, once in one piece and
 * once cut into chunks at points derived from the input; both must yield the
 * same messages (the same bytes as the stream holds) and the same end. */
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "fuzz.h"
#include "grpc_frame.h"
#include "utf8.h"

#define MAX_MESSAGES 256

struct outcome {
    size_t nmsg;
    size_t msg_end[MAX_MESSAGES]; /* stream offset just past each message */
    size_t msg_len[MAX_MESSAGES];
    enum grpc_read_result last;
    size_t consumed;
    int partial;
};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_quiet_logs();
    return 0;
}

/* orig as the encoder must render it: each byte that starts no UTF-8
 * sequence as U+FFFD. ends[] marks where each rendered character ends. */
static size_t expected_text(const char *orig, unsigned char *exp, unsigned char *ends)
{
    static const unsigned char replacement[] = {0xef, 0xbf, 0xbd};
    const unsigned char *p = (const unsigned char *)orig;
    size_t left = strlen(orig), e = 0;
    while (left > 0) {
        size_t n = *p < 0x80 ? 1 : utf8_seq_len(p, left);
        const unsigned char *src = n ? p : replacement;
        size_t emit = n ? n : sizeof(replacement);
        for (size_t k = 0; k < emit; k++) {
            ends[e] = k + 1 == emit;
            exp[e++] = src[k];
        }
        p += n ? n : 1;
        left -= n ? n : 1;
    }
    return e;
}

/* Percent-decodes the output and checks it is a prefix of orig as rendered
 * (expected_text), cut at a character's end (truncation is allowed,
 * garbling or a split character is not), and that only printable ASCII
 * other than '%' stays bare. */
static void check_percent(const char *orig, size_t outlen)
{
    size_t olen0 = strlen(orig);
    unsigned char *exp = malloc(3 * olen0 + 1), *ends = malloc(3 * olen0 + 1);
    if (!exp || !ends) {
        free(exp);
        free(ends);
        return;
    }
    size_t elen = expected_text(orig, exp, ends);
    char *out = malloc(outlen ? outlen : 1);
    if (!out) {
        free(exp);
        free(ends);
        return;
    }
    memset(out, 'X', outlen ? outlen : 1);
    grpc_percent_encode(out, outlen, orig);
    if (outlen == 0) {
        FUZZ_CHECK(out[0] == 'X', "wrote into a zero-length buffer");
        free(out);
        free(exp);
        free(ends);
        return;
    }
    size_t olen = strnlen(out, outlen);
    FUZZ_CHECK(olen < outlen, "output not NUL-terminated within %zu bytes", outlen);
    size_t o = 0, i = 0;
    while (o < olen) {
        unsigned char c = (unsigned char)out[o];
        unsigned char want;
        if (c == '%') {
            FUZZ_CHECK(o + 2 < olen, "cut escape at %zu", o);
            unsigned v = 0;
            for (int k = 1; k <= 2; k++) {
                char h = out[o + (size_t)k];
                FUZZ_CHECK((h >= '0' && h <= '9') || (h >= 'A' && h <= 'F'), "bad hex digit");
                v = v * 16 + (unsigned)(h <= '9' ? h - '0' : h - 'A' + 10);
            }
            want = (unsigned char)v;
            FUZZ_CHECK(want < 0x20 || want > 0x7e || want == '%', "escaped a plain byte 0x%02x",
                       want);
            o += 3;
        } else {
            FUZZ_CHECK(c >= 0x20 && c <= 0x7e, "raw byte 0x%02x in output", c);
            want = c;
            o++;
        }
        FUZZ_CHECK(i < elen && exp[i] == want, "output differs from the rendered input at %zu",
                   i);
        i++;
    }
    FUZZ_CHECK(i == 0 || ends[i - 1], "output ends inside a character at %zu", i);
    free(out);
    free(exp);
    free(ends);
}

static int count_reserved(void *ud, size_t bytes)
{
    *(size_t *)ud += bytes;
    return 0;
}

static void read_stream(const uint8_t *s, size_t n, size_t max_len, const uint8_t *seed,
                        size_t seed_len, struct outcome *oc)
{
    struct fuzz_rng rng;
    fuzz_rng_seed(&rng, seed, seed_len);
    struct grpc_reader r;
    size_t reserved = 0; /* since the current message began */
    grpc_reader_init(&r, max_len, count_reserved, &reserved);
    memset(oc, 0, sizeof(*oc));
    size_t off = 0;
    enum grpc_read_result res = GRPC_READ_INCOMPLETE;
    for (;;) {
        /* seed NULL: the whole rest at once; else a chunk. */
        size_t chunk = seed ? fuzz_rng_chunk(&rng, n - off) : n - off;
        if (off == n)
            chunk = 0;
        size_t used = (size_t)-1;
        res = grpc_reader_feed(&r, s + off, chunk, &used);
        FUZZ_CHECK(used <= chunk, "consumed %zu of %zu", used, chunk);
        /* It holds what arrived (a declared length reserves nothing), and the
         * budget was asked for all of it. */
        FUZZ_CHECK(r.msg_cap == reserved, "holds %zu, reserved %zu", r.msg_cap, reserved);
        FUZZ_CHECK(r.msg_cap <= 16384 || r.msg_cap <= 2 * (r.msg_have + 1),
                   "holds %zu for %zu bytes read", r.msg_cap, r.msg_have);
        off += used;
        if (res == GRPC_READ_MESSAGE) {
            size_t mlen = 0;
            const uint8_t *m = grpc_reader_message(&r, &mlen);
            FUZZ_CHECK(m != NULL, "no message after GRPC_READ_MESSAGE");
            FUZZ_CHECK(mlen <= max_len && mlen <= off, "message length %zu", mlen);
            FUZZ_CHECK(memcmp(m, s + off - mlen, mlen) == 0, "message bytes differ");
            FUZZ_CHECK(!grpc_reader_partial(&r), "partial while a message is ready");
            if (oc->nmsg < MAX_MESSAGES) {
                oc->msg_end[oc->nmsg] = off;
                oc->msg_len[oc->nmsg] = mlen;
            }
            oc->nmsg++;
            reserved = 0; /* the next feed frees this message first */
            if (mlen < 4096) {
                char *text = fuzz_strndup(m, mlen);
                if (text) {
                    check_percent(text, (size_t)(s[0] % 64));
                    check_percent(text, 256);
                    free(text);
                }
            }
            continue;
        }
        FUZZ_CHECK(grpc_read_result_to_str(res) != NULL, "no text for %d", (int)res);
        if (res != GRPC_READ_INCOMPLETE)
            break; /* errors are final */
        FUZZ_CHECK(grpc_reader_message(&r, &(size_t){0}) == NULL, "message while incomplete");
        if (off == n)
            break;
        FUZZ_CHECK(used == chunk, "incomplete but left %zu bytes", chunk - used);
    }
    oc->last = res;
    oc->consumed = off;
    oc->partial = grpc_reader_partial(&r);
    grpc_reader_finish(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const size_t limits[] = {0, 1, 5, 100, 4096, GRPC_DEFAULT_MAX_MESSAGE};
    size_t max_len = limits[data[0] % (sizeof(limits) / sizeof(limits[0]))];
    const uint8_t *s = data + 1;
    size_t n = size - 1;

    struct outcome *whole = malloc(sizeof(*whole));
    struct outcome *split = malloc(sizeof(*split));
    if (whole && split) {
        read_stream(s, n, max_len, NULL, 0, whole);
        read_stream(s, n, max_len, data, size, split);
        FUZZ_CHECK(whole->nmsg == split->nmsg, "%zu vs %zu messages", whole->nmsg, split->nmsg);
        size_t k = whole->nmsg < MAX_MESSAGES ? whole->nmsg : MAX_MESSAGES;
        for (size_t i = 0; i < k; i++)
            FUZZ_CHECK(whole->msg_end[i] == split->msg_end[i] &&
                           whole->msg_len[i] == split->msg_len[i],
                       "message %zu differs", i);
        FUZZ_CHECK(whole->last == split->last, "end %d vs %d", (int)whole->last,
                   (int)split->last);
        FUZZ_CHECK(whole->consumed == split->consumed, "consumed %zu vs %zu", whole->consumed,
                   split->consumed);
        FUZZ_CHECK(whole->partial == split->partial, "partial differs");

        /* Out of memory in the middle: a clean GRPC_READ_NOMEM, nothing leaked. */
        alloc_fail_after(fuzz_oom_point(data, size) % 4);
        struct outcome oom;
        read_stream(s, n, max_len, data, size, &oom);
        alloc_fail_after(-1);
        FUZZ_CHECK(oom.nmsg <= whole->nmsg, "more messages under allocation failure");
    }
    free(whole);
    free(split);
    return 0;
}
