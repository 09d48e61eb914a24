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
        grpc_reader_init(&r, 1024);
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
    grpc_reader_init(&r, 1024);
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
    grpc_reader_init(&r, 100);
    grpc_frame_header(hdr, 101);
    assert_int_equal(grpc_reader_feed(&r, hdr, sizeof(hdr), &used), GRPC_READ_TOO_LARGE);
    grpc_reader_finish(&r);

    grpc_reader_init(&r, GRPC_DEFAULT_MAX_MESSAGE);
    grpc_frame_header(hdr, 0xffffffffu); /* 4 GiB declared: refused before allocating */
    assert_int_equal(grpc_reader_feed(&r, hdr, sizeof(hdr), &used), GRPC_READ_TOO_LARGE);
    grpc_reader_finish(&r);

    grpc_reader_init(&r, 100);
    grpc_frame_header(hdr, 3);
    hdr[0] = 1;
    assert_int_equal(grpc_reader_feed(&r, hdr, sizeof(hdr), &used), GRPC_READ_COMPRESSED);
    grpc_reader_finish(&r);

    grpc_reader_init(&r, 100);
    hdr[0] = 7;
    assert_int_equal(grpc_reader_feed(&r, hdr, sizeof(hdr), &used), GRPC_READ_BAD_FLAG);
    grpc_reader_finish(&r);

    grpc_reader_init(&r, 100);
    grpc_frame_header(hdr, 10);
    assert_int_equal(grpc_reader_feed(&r, hdr, 3, &used), GRPC_READ_INCOMPLETE);
    assert_true(grpc_reader_partial(&r));
    grpc_reader_finish(&r);

    grpc_reader_init(&r, 100);
    grpc_frame_header(hdr, 10);
    alloc_fail_after(0);
    assert_int_equal(grpc_reader_feed(&r, hdr, sizeof(hdr), &used), GRPC_READ_NOMEM);
    alloc_fail_after(-1);
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
    assert_string_equal(grpc_read_result_to_str(GRPC_READ_TOO_LARGE),
                        "message larger than the limit");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_and_split),
        cmocka_unit_test(test_two_messages_and_empty),
        cmocka_unit_test(test_limits_and_flags),
        cmocka_unit_test(test_status_and_percent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
