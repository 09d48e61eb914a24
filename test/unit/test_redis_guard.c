/* redis_guard: a guarded hiredis reader refuses array headers past the
 * per-reply element budget at once, and still parses every normal reply;
 * with a connection attached it refuses the replies hiredis 0.14's async
 * code would abort on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "log.h"
#include "redis_guard.h"

struct capture {
    char text[4096];
    size_t len;
};

static void capture_sink(void *ud, const char *line, size_t len)
{
    struct capture *c = ud;
    if (len > sizeof c->text - 1 - c->len)
        len = sizeof c->text - 1 - c->len;
    memcpy(c->text + c->len, line, len);
    c->len += len;
    c->text[c->len] = '\0';
}

static redisReader *guarded_reader(void)
{
    redisReader *rd = redisReaderCreate();
    assert_non_null(rd);
    assert_int_equal(redis_guard_install(rd), 0);
    return rd;
}

static void feed(redisReader *rd, const char *s)
{
    assert_int_equal(redisReaderFeed(rd, s, strlen(s)), REDIS_OK);
}

/* The reader must fail on the header alone: hiredis only stops there when the
 * array function returned NULL, and the guard does so before allocating. */
static void expect_refused(const char *stream, const char *elements)
{
    struct capture cap = {{0}, 0};
    log_set_sink(capture_sink, &cap);
    redisReader *rd = guarded_reader();
    feed(rd, stream);
    void *reply = NULL;
    assert_int_equal(redisReaderGetReply(rd, &reply), REDIS_ERR);
    assert_null(reply);
    assert_int_equal(rd->err, REDIS_ERR_OOM);
    /* A failed reader stays failed: no reply is built from what follows. */
    assert_int_equal(redisReaderGetReply(rd, &reply), REDIS_ERR);
    assert_null(reply);
    redisReaderFree(rd);
    log_set_sink(NULL, NULL);
    assert_non_null(strstr(cap.text, "event=redis_reply_refused"));
    char want[64];
    snprintf(want, sizeof want, "elements=%s ", elements);
    assert_non_null(strstr(cap.text, want));
}

/* The header is accepted: the reply is incomplete, no error. */
static void expect_pending(redisReader *rd, const char *stream)
{
    feed(rd, stream);
    void *reply = NULL;
    assert_int_equal(redisReaderGetReply(rd, &reply), REDIS_OK);
    assert_null(reply);
    assert_int_equal(rd->err, 0);
}

static void test_huge_array_refused(void **unused)
{
    (void)unused;
    expect_refused("*111111111\r\n", "111111111");
    /* Past the range of the int hiredis hands to createArray: refused, by
     * hiredis (protocol error) or by the guard, never built. */
    const char *const beyond[] = {"*2147483648\r\n", "*4294967297\r\n", "*9999999999\r\n"};
    for (size_t i = 0; i < sizeof beyond / sizeof beyond[0]; i++) {
        redisReader *rd = guarded_reader();
        feed(rd, beyond[i]);
        void *reply = NULL;
        assert_int_equal(redisReaderGetReply(rd, &reply), REDIS_ERR);
        assert_null(reply);
        assert_true(rd->err == REDIS_ERR_PROTOCOL || rd->err == REDIS_ERR_OOM);
        redisReaderFree(rd);
    }
}

static void test_bound_single_array(void **unused)
{
    (void)unused;
    char s[64];
    snprintf(s, sizeof s, "*%d\r\n", REDIS_GUARD_MAX_ELEMENTS + 1);
    char n[32];
    snprintf(n, sizeof n, "%d", REDIS_GUARD_MAX_ELEMENTS + 1);
    expect_refused(s, n);

    redisReader *rd = guarded_reader();
    snprintf(s, sizeof s, "*%d\r\n", REDIS_GUARD_MAX_ELEMENTS);
    expect_pending(rd, s);
    redisReaderFree(rd); /* frees the half-read reply */
}

/* Nested headers share one budget, or a few bytes each would still cost the
 * bound again and again. */
static void test_bound_counts_nested_arrays(void **unused)
{
    (void)unused;
    char s[64];
    char n[32];
    snprintf(s, sizeof s, "*2\r\n*%d\r\n", REDIS_GUARD_MAX_ELEMENTS - 1);
    snprintf(n, sizeof n, "%d", REDIS_GUARD_MAX_ELEMENTS - 1);
    expect_refused(s, n);

    /* Deeper: 3 + 2 declared, then one more than what is left. */
    snprintf(s, sizeof s, "*3\r\n:1\r\n*2\r\n:2\r\n*%d\r\n", REDIS_GUARD_MAX_ELEMENTS - 4);
    snprintf(n, sizeof n, "%d", REDIS_GUARD_MAX_ELEMENTS - 4);
    expect_refused(s, n);

    redisReader *rd = guarded_reader();
    snprintf(s, sizeof s, "*3\r\n:1\r\n*2\r\n:2\r\n*%d\r\n", REDIS_GUARD_MAX_ELEMENTS - 5);
    expect_pending(rd, s);
    redisReaderFree(rd);
}

static void test_normal_replies_parse(void **unused)
{
    (void)unused;
    redisReader *rd = guarded_reader();
    void *v = NULL;

    /* A mixed nested reply, fed in two pieces. */
    feed(rd, "*4\r\n$3\r\nfoo\r\n:42\r\n*2\r\n+OK\r\n$-");
    assert_int_equal(redisReaderGetReply(rd, &v), REDIS_OK);
    assert_null(v);
    feed(rd, "1\r\n*0\r\n");
    assert_int_equal(redisReaderGetReply(rd, &v), REDIS_OK);
    redisReply *r = v;
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 4);
    assert_int_equal(r->element[0]->type, REDIS_REPLY_STRING);
    assert_string_equal(r->element[0]->str, "foo");
    assert_int_equal(r->element[1]->type, REDIS_REPLY_INTEGER);
    assert_int_equal(r->element[1]->integer, 42);
    assert_int_equal(r->element[2]->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->element[2]->elements, 2);
    assert_int_equal(r->element[2]->element[0]->type, REDIS_REPLY_STATUS);
    assert_string_equal(r->element[2]->element[0]->str, "OK");
    assert_int_equal(r->element[2]->element[1]->type, REDIS_REPLY_NIL);
    assert_int_equal(r->element[3]->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->element[3]->elements, 0);
    assert_int_equal(r->len, 4 + 2); /* the guard's count of declared elements */
    freeReplyObject(r);

    /* A nil array, then the shape of a scaler batch reply: 1000 integers. */
    feed(rd, "*-1\r\n");
    assert_int_equal(redisReaderGetReply(rd, &v), REDIS_OK);
    assert_non_null(v);
    assert_int_equal(((redisReply *)v)->type, REDIS_REPLY_NIL);
    freeReplyObject(v);
    feed(rd, "*1000\r\n");
    for (int i = 0; i < 1000; i++) {
        char e[32];
        snprintf(e, sizeof e, ":%d\r\n", i * 7);
        feed(rd, e);
    }
    assert_int_equal(redisReaderGetReply(rd, &v), REDIS_OK);
    r = v;
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 1000);
    assert_int_equal(r->len, 1000); /* counted from 0 again: one reply, one budget */
    for (size_t i = 0; i < r->elements; i++) {
        assert_int_equal(r->element[i]->type, REDIS_REPLY_INTEGER);
        assert_int_equal(r->element[i]->integer, (long long)i * 7);
    }
    freeReplyObject(r);

    /* The budget is per reply: after replies that declared 1000 and more,
     * a reply declaring the whole budget is still accepted. */
    char s[64];
    snprintf(s, sizeof s, "*1\r\n*%d\r\n", REDIS_GUARD_MAX_ELEMENTS - 1);
    expect_pending(rd, s);
    redisReaderFree(rd);
}

static void test_install_rules(void **unused)
{
    (void)unused;
    assert_int_equal(redis_guard_install(NULL), -1);

    redisReader *rd = redisReaderCreate();
    assert_non_null(rd);
    redisReplyObjectFunctions *plain = rd->fn;
    assert_int_equal(redis_guard_install(rd), 0);
    redisReplyObjectFunctions *guarded = rd->fn;
    assert_ptr_not_equal(guarded, plain);
    assert_int_equal(redis_guard_install(rd), 0); /* twice: unchanged */
    assert_ptr_equal(rd->fn, guarded);
    redisReaderFree(rd);

    /* A reader without reply functions, or with someone else's, is left alone. */
    rd = redisReaderCreateWithFunctions(NULL);
    assert_non_null(rd);
    assert_int_equal(redis_guard_install(rd), -1);
    assert_null(rd->fn);
    redisReaderFree(rd);
    redisReplyObjectFunctions other = *plain;
    rd = redisReaderCreateWithFunctions(&other);
    assert_non_null(rd);
    assert_int_equal(redis_guard_install(rd), -1);
    assert_ptr_equal(rd->fn, &other);
    redisReaderFree(rd);

    /* A context's reader (what thaw-scaler and thaw-activator guard). */
    redisContext *c = redisConnectUnix("/nonexistent/thaw-redis-guard.sock");
    assert_non_null(c);
    assert_non_null(c->reader);
    assert_ptr_equal(c->reader->fn, plain);
    assert_int_equal(redis_guard_install(c->reader), 0);
    assert_ptr_equal(c->reader->fn, guarded);
    redisFree(c);
}

/* Feeds s to a reader carrying g and returns how many whole replies came
 * out before the stream ended (*failed: the reader failed, as a refusal
 * makes it, "Out of memory"). */
static int replies_until_refused(redisReader *rd, const char *s, bool *failed)
{
    feed(rd, s);
    int n = 0;
    *failed = false;
    for (;;) {
        void *reply = NULL;
        if (redisReaderGetReply(rd, &reply) != REDIS_OK) {
            *failed = true;
            assert_int_equal(rd->err, REDIS_ERR_OOM);
            return n;
        }
        if (!reply)
            return n;
        freeReplyObject(reply);
        n++;
    }
}

static redisReader *conn_reader(struct redis_guard_conn *g)
{
    redis_guard_conn_init(g);
    redisReader *rd = redisReaderCreate();
    assert_non_null(rd);
    assert_int_equal(redis_guard_attach(rd, g), 0);
    return rd;
}

/* A reply past the commands sent is refused (hiredis 0.14 would abort on
 * it); an error reply is not (hiredis disconnects on it by itself). */
static void test_conn_unsolicited(void **unused)
{
    (void)unused;
    struct capture cap = {{0}, 0};
    log_set_sink(capture_sink, &cap);
    struct redis_guard_conn g;
    redisReader *rd = conn_reader(&g);
    bool failed;
    unsigned long total_before = redis_guard_refused_total();
    redis_guard_conn_sent(&g, 2);
    assert_int_equal(replies_until_refused(rd, "+OK\r\n*2\r\n:1\r\n$-1\r\n", &failed), 2);
    assert_false(failed);
    assert_int_equal(replies_until_refused(rd, "-ERR max clients\r\n", &failed), 1);
    assert_false(failed);
    assert_int_equal(replies_until_refused(rd, ":7\r\n", &failed), 0);
    assert_true(failed);
    assert_int_equal(g.refused, 1);
    assert_int_equal(redis_guard_refused_total(), total_before + 1);
    assert_non_null(strstr(cap.text, "reason=unsolicited_reply"));
    redisReaderFree(rd);

    /* Each kind of reply counts, nil and arrays included. */
    const char *const kinds[] = {"+OK\r\n", "$3\r\nabc\r\n", ":1\r\n", "$-1\r\n",
                                 "*-1\r\n", "*0\r\n", "*1\r\n:1\r\n"};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        rd = conn_reader(&g);
        redis_guard_conn_sent(&g, 1);
        char twice[64];
        snprintf(twice, sizeof twice, "%s%s", kinds[i], kinds[i]);
        assert_int_equal(replies_until_refused(rd, twice, &failed), 1);
        assert_true(failed);
        redisReaderFree(rd);
    }
    log_set_sink(NULL, NULL);
}

/* In pub/sub mode arrays are messages, needing no command, and must have
 * the shape hiredis 0.14 asserts; anything else still needs a command. */
static void test_conn_pubsub(void **unused)
{
    (void)unused;
    struct capture cap = {{0}, 0};
    log_set_sink(capture_sink, &cap);
    struct redis_guard_conn g;
    bool failed;
    redisReader *rd = conn_reader(&g);
    redis_guard_conn_sent(&g, 1); /* AUTH */
    redis_guard_conn_pubsub(&g);  /* SUBSCRIBE */
    assert_int_equal(replies_until_refused(rd,
                                           "+OK\r\n*3\r\n$9\r\nsubscribe\r\n$9\r\nthaw:wake\r\n:1\r\n"
                                           "*3\r\n$7\r\nmessage\r\n$9\r\nthaw:wake\r\n$1\r\nm\r\n"
                                           "*4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$1\r\nc\r\n$1\r\nm\r\n"
                                           "*2\r\n$4\r\npong\r\n$0\r\n\r\n"
                                           "*3\r\n$11\r\nUNSUBSCRIBE\r\n$1\r\nc\r\n:0\r\n",
                                           &failed),
                     6);
    assert_false(failed);
    assert_int_equal(g.refused, 0);
    redisReaderFree(rd);

    static const struct {
        const char *stream, *reason;
        size_t len; /* 0: strlen */
    } bad[] = {
        {"*1\r\n$7\r\nmessage\r\n", "pubsub_message_short", 0},
        {"*0\r\n", "pubsub_message_short", 0},
        {"*3\r\n:1\r\n$1\r\nc\r\n$1\r\nm\r\n", "pubsub_field_not_string", 0},
        {"*3\r\n$7\r\nmessage\r\n$-1\r\n$1\r\nm\r\n", "pubsub_field_not_string", 0},
        {"*3\r\n+message\r\n$1\r\nc\r\n$1\r\nm\r\n", "pubsub_field_not_string", 0},
        {"*3\r\n$7\r\nmessage\r\n*1\r\n:1\r\n$1\r\nm\r\n", "pubsub_field_not_string", 0},
        {"*2\r\n$11\r\nunsubscribe\r\n$1\r\nc\r\n", "unsubscribe_without_count", 0},
        {"*3\r\n$12\r\npunsubscribe\r\n$1\r\nc\r\n$1\r\n0\r\n", "unsubscribe_without_count", 0},
        /* hiredis reads the kind as a C string: a NUL after it still says unsubscribe */
        {"*2\r\n$12\r\nunsubscribe\0\r\n$1\r\nc\r\n", "unsubscribe_without_count", 30},
        {"*3\r\n$14\r\nPunsubscribe\0x\r\n$1\r\nc\r\n+0\r\n", "unsubscribe_without_count", 36},
        {"+OK\r\n", "unsolicited_reply", 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cap.len = 0;
        cap.text[0] = '\0';
        rd = conn_reader(&g);
        redis_guard_conn_pubsub(&g);
        if (bad[i].len) {
            assert_int_equal(redisReaderFeed(rd, bad[i].stream, bad[i].len), REDIS_OK);
            assert_int_equal(replies_until_refused(rd, "", &failed), 0);
        } else {
            assert_int_equal(replies_until_refused(rd, bad[i].stream, &failed), 0);
        }
        assert_true(failed);
        assert_int_equal(g.refused, 1);
        assert_non_null(strstr(cap.text, bad[i].reason));
        redisReaderFree(rd);
    }
    log_set_sink(NULL, NULL);
}

/* An unsubscribe with a count of 0 may end hiredis's pub/sub mode: from then
 * on a message needs a command like any reply (hiredis would assert on it). */
static void test_conn_unsubscribe_ends_pubsub(void **unused)
{
    (void)unused;
    struct capture cap = {{0}, 0};
    log_set_sink(capture_sink, &cap);
    struct redis_guard_conn g;
    bool failed;
    redisReader *rd = conn_reader(&g);
    redis_guard_conn_pubsub(&g);
    assert_int_equal(replies_until_refused(rd,
                                           "*3\r\n$11\r\nunsubscribe\r\n$1\r\nc\r\n:1\r\n"
                                           "*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n",
                                           &failed),
                     2);
    assert_false(failed);
    assert_true(g.pubsub);
    assert_int_equal(replies_until_refused(rd,
                                           "*3\r\n$12\r\nPUNSUBSCRIBE\r\n$1\r\n*\r\n:0\r\n"
                                           "*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n",
                                           &failed),
                     1);
    assert_true(failed);
    assert_false(g.pubsub);
    assert_non_null(strstr(cap.text, "reason=unsolicited_reply"));
    redisReaderFree(rd);
    log_set_sink(NULL, NULL);
}

/* Without a connection attached only the element bound applies; a reader
 * whose privdata is someone else's is not attached. */
static void test_conn_attach_rules(void **unused)
{
    (void)unused;
    redisReader *rd = guarded_reader();
    bool failed;
    assert_int_equal(replies_until_refused(rd, "+OK\r\n+OK\r\n", &failed), 2);
    assert_false(failed);
    redisReaderFree(rd);

    struct redis_guard_conn g, other;
    redis_guard_conn_init(&g);
    redis_guard_conn_init(&other);
    assert_int_equal(redis_guard_attach(NULL, &g), -1);
    rd = redisReaderCreate();
    assert_non_null(rd);
    assert_int_equal(redis_guard_attach(rd, NULL), -1);
    rd->privdata = &other;
    assert_int_equal(redis_guard_attach(rd, &g), -1);
    assert_ptr_equal(rd->privdata, &other);
    rd->privdata = NULL;
    assert_int_equal(redis_guard_attach(rd, &g), 0);
    assert_int_equal(redis_guard_attach(rd, &g), 0); /* twice: unchanged */
    assert_ptr_equal(rd->privdata, &g);
    redisReaderFree(rd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_huge_array_refused),
        cmocka_unit_test(test_bound_single_array),
        cmocka_unit_test(test_bound_counts_nested_arrays),
        cmocka_unit_test(test_normal_replies_parse),
        cmocka_unit_test(test_install_rules),
        cmocka_unit_test(test_conn_unsolicited),
        cmocka_unit_test(test_conn_pubsub),
        cmocka_unit_test(test_conn_unsubscribe_ends_pubsub),
        cmocka_unit_test(test_conn_attach_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
