/* grpc_frame: message framing in any split, limits, bad flags, encoding. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "alloc.h"
#include "grpc_frame.h"

static size_t frame(uint8_t *out, const char *payload, size_t len)
{
    grpc_frame_header(out, (uint32_t)len);
    memcpy(out + GRPC_FRAME_HEADER_LEN, payload, len);
    return GRPC_FRAME_HEADER_LEN + len;
}

static void test_whole_and_split(void **unused)
{
    uint8_t buf[64];
    size_t n = frame(buf, "hello", 5);
    /* Every split point, including byte-by-byte, yields the same message. */
    for (size_t step = 1; step <= n; step++) {
        struct grpc_reader r;
        grpc_reader_init(&r, 1024, NULL, NULL);
        size_t off = 0;
        int got = 0;
        while (off < n) {
            size_t len = (n - off) < step ? (n - off) : step;
            size_t used = 0;
            enum grpc_read_result res = grpc_reader_feed(&r, buf + off, len, &used);
            off += used;
            if (res == GRPC_READ_MESSAGE) {
                size_t mlen;
                const uint8_t *m = grpc_reader_message(&r, &mlen);
                assert_int_equal(mlen, 5);
                assert_memory_equal(m, "hello", 5);
                got++;
            } else {
                assert_int_equal(res, GRPC_READ_INCOMPLETE);
                assert_int_equal(used, len);
            }
        }
        assert_int_equal(got, 1);
        assert_false(grpc_reader_partial(&r));
        grpc_reader_finish(&r);
    }
}

static void test_two_messages_and_empty(void **unused)
{
    uint8_t buf[64];
    size_t n = frame(buf, "ab", 2);
    n += frame(buf + n, "", 0);
    struct grpc_reader r;
    grpc_reader_init(&r, 1024, NULL, NULL);
    size_t used = 0, off = 0;
    assert_int_equal(grpc_reader_feed(&r, buf, n, &used), GRPC_READ_MESSAGE);
    assert_int_equal(used, 7);
    off += used;
    size_t mlen = 99;
    assert_non_null(grpc_reader_message(&r, &mlen));
    assert_int_equal(mlen, 2);
    assert_int_equal(grpc_reader_feed(&r, buf + off, n - off, &used), GRPC_READ_MESSAGE);
    assert_non_null(grpc_reader_message(&r, &mlen));
    assert_int_equal(mlen, 0);
    grpc_reader_finish(&r);
}

static void test_limits_and_flags(void **unused)
{
    uint8_t hdr[GRPC_FRAME_HEADER_LEN];
    struct grpc_reader r;
    size_t used;
    grpc_reader_init(&r, 100, NULL, NULL);
    grpc_frame_header(hdr, 101);
    assert_int_equal(grpc_reader_feed(&r, hdr, sizeof(hdr), &used), GRPC_READ_TOO_LARGE);
    grpc_reader_finish(&r);

    grpc_reader_init(&r, GRPC_DEFAULT_MAX_MESSAGE, NULL, NULL);
    grpc_frame_header(hdr, 0xffffffffu); /* 4 GiB declared: refused before allocating */
    assert_int_equal(grpc_reader_feed(&r, hdr, sizeof(hdr), &used), GRPC_READ_TOO_LARGE);
    grpc_reader_finish(&r);

    grpc_reader_init(&r, 100, NULL, NULL);
    grpc_frame_header(hdr, 3);
    hdr[0] = 1;
    assert_int_equal(grpc_reader_feed(&r, hdr, sizeof(hdr), &used), GRPC_READ_COMPRESSED);
    grpc_reader_finish(&r);

    grpc_reader_init(&r, 100, NULL, NULL);
    hdr[0] = 7;
    assert_int_equal(grpc_reader_feed(&r, hdr, sizeof(hdr), &used), GRPC_READ_BAD_FLAG);
    grpc_reader_finish(&r);

    grpc_reader_init(&r, 100, NULL, NULL);
    grpc_frame_header(hdr, 10);
    assert_int_equal(grpc_reader_feed(&r, hdr, 3, &used), GRPC_READ_INCOMPLETE);
    assert_true(grpc_reader_partial(&r));
    grpc_reader_finish(&r);

    /* The buffer is allocated when the first byte of the message arrives. */
    grpc_reader_init(&r, 100, NULL, NULL);
    grpc_frame_header(hdr, 10);
    alloc_fail_after(0);
    assert_int_equal(grpc_reader_feed(&r, hdr, sizeof(hdr), &used), GRPC_READ_INCOMPLETE);
    assert_int_equal(grpc_reader_feed(&r, (const uint8_t *)"x", 1, &used), GRPC_READ_NOMEM);
    alloc_fail_after(-1);
    grpc_reader_finish(&r);
}

struct budget {
    size_t held, limit, calls;
};

static int take_from_budget(void *ud, size_t bytes)
{
    struct budget *b = ud;
    b->calls++;
    if (bytes > b->limit - b->held)
        return -1;
    b->held += bytes;
    return 0;
}

/* A declared length reserves nothing; the buffer grows with what arrives,
 * each growth asked of the budget, and a whole message costs its length + 1. */
static void test_budget(void **unused)
{
    static uint8_t data[GRPC_DEFAULT_MAX_MESSAGE];
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 7);
    uint8_t hdr[GRPC_FRAME_HEADER_LEN];
    struct grpc_reader r;
    struct budget b = {0, SIZE_MAX, 0};
    size_t used;
    grpc_reader_init(&r, GRPC_DEFAULT_MAX_MESSAGE, take_from_budget, &b);
    grpc_frame_header(hdr, GRPC_DEFAULT_MAX_MESSAGE);
    assert_int_equal(grpc_reader_feed(&r, hdr, sizeof(hdr), &used), GRPC_READ_INCOMPLETE);
    assert_int_equal(b.held, 0);
    assert_int_equal(grpc_reader_feed(&r, data, 10, &used), GRPC_READ_INCOMPLETE);
    assert_int_equal(b.held, 16384);
    assert_int_equal(grpc_reader_feed(&r, data + 10, 20000, &used), GRPC_READ_INCOMPLETE);
    assert_int_equal(b.held, 32768);
    assert_int_equal(r.msg_cap, b.held);
    size_t off = 20010;
    while (off < sizeof(data)) {
        size_t n = sizeof(data) - off < 65536 ? sizeof(data) - off : 65536;
        enum grpc_read_result res = grpc_reader_feed(&r, data + off, n, &used);
        assert_int_equal(used, n);
        off += n;
        assert_int_equal(res, off == sizeof(data) ? GRPC_READ_MESSAGE : GRPC_READ_INCOMPLETE);
        assert_true(b.held >= off + 1 || off == sizeof(data));
    }
    assert_int_equal(b.held, (size_t)GRPC_DEFAULT_MAX_MESSAGE + 1);
    assert_true(b.calls <= 12); /* doubling, not a growth per chunk */
    size_t mlen = 0;
    uint8_t *m = grpc_reader_take_message(&r, &mlen);
    assert_non_null(m);
    assert_int_equal(mlen, sizeof(data));
    assert_memory_equal(m, data, sizeof(data));
    assert_int_equal(m[mlen], 0);
    thaw_free(m);
    assert_null(grpc_reader_take_message(&r, &mlen));
    assert_false(grpc_reader_partial(&r));

    /* An empty message costs one byte; the next one starts over. */
    b.held = 0;
    grpc_frame_header(hdr, 0);
    assert_int_equal(grpc_reader_feed(&r, hdr, sizeof(hdr), &used), GRPC_READ_MESSAGE);
    assert_int_equal(b.held, 1);
    m = grpc_reader_take_message(&r, &mlen);
    assert_non_null(m);
    assert_int_equal(mlen, 0);
    thaw_free(m);
    grpc_reader_finish(&r);

    /* Refused: the reader stops where the bytes would not fit and holds only
     * what the budget gave. */
    b = (struct budget){0, 20000, 0};
    grpc_reader_init(&r, GRPC_DEFAULT_MAX_MESSAGE, take_from_budget, &b);
    grpc_frame_header(hdr, 100000);
    assert_int_equal(grpc_reader_feed(&r, hdr, sizeof(hdr), &used), GRPC_READ_INCOMPLETE);
    assert_int_equal(grpc_reader_feed(&r, data, 16383, &used), GRPC_READ_INCOMPLETE);
    assert_int_equal(grpc_reader_feed(&r, data, 100, &used), GRPC_READ_OVER_BUDGET);
    assert_int_equal(used, 0);
    assert_int_equal(b.held, 16384);
    assert_int_equal(r.msg_cap, 16384);
    assert_string_equal(grpc_read_result_to_str(GRPC_READ_OVER_BUDGET),
                        "over the budget for requests in progress");
    grpc_reader_finish(&r);
}

static void test_status_and_percent(void **unused)
{
    char out[64];
    assert_string_equal(grpc_status_to_str(GRPC_STATUS_UNIMPLEMENTED), "UNIMPLEMENTED");
    assert_string_equal(grpc_status_to_str(99), "UNKNOWN_CODE");
    assert_string_equal(grpc_percent_encode(out, sizeof(out), "key 'model': 100%\n"),
                        "key 'model': 100%25%0A");
    assert_string_equal(grpc_percent_encode(out, sizeof(out), "caf\xc3\xa9"), "caf%C3%A9");
    /* Truncation never splits an escape. */
    assert_string_equal(grpc_percent_encode(out, 6, "ab\ncd"), "ab%0A");
    /* A character cut at a byte count (a value quoted with %.64s), or any
     * byte that starts no UTF-8 sequence, becomes U+FFFD: the trailer must
     * decode to UTF-8. */
    assert_string_equal(grpc_percent_encode(out, sizeof(out), "got 'x\xc3'"),
                        "got 'x%EF%BF%BD'");
    assert_string_equal(grpc_percent_encode(out, sizeof(out), "\xff\xc3\xa9"),
                        "%EF%BF%BD%C3%A9");
    /* Truncation never splits a character either. */
    assert_string_equal(grpc_percent_encode(out, 9, "ab\xc3\xa9"), "ab%C3%A9");
    assert_string_equal(grpc_percent_encode(out, 8, "ab\xc3\xa9"), "ab");
    assert_string_equal(grpc_read_result_to_str(GRPC_READ_TOO_LARGE),
                        "message larger than the limit");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_and_split),
        cmocka_unit_test(test_two_messages_and_empty),
        cmocka_unit_test(test_limits_and_flags),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_status_and_percent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
