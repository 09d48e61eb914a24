/* Unit tests for activator/redis_link's pure part: URL parsing. The link's
 * I/O is covered by the integration tests (real redis-server). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "redis_link.h"

static void test_urls(void **state)
{
    (void)state;
    char host[64], pass[64];
    int port, db;
    assert_int_equal(redis_link_parse_url("redis://127.0.0.1", host, sizeof(host), &port, pass,
                                          sizeof(pass), &db), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 6379);
    assert_int_equal(db, 0);
    assert_string_equal(pass, "");
    assert_int_equal(redis_link_parse_url("redis://:s3cr:et@redis.ns:6380/2", host, sizeof(host),
                                          &port, pass, sizeof(pass), &db), 0);
    assert_string_equal(host, "redis.ns");
    assert_string_equal(pass, "s3cr:et");
    assert_int_equal(port, 6380);
    assert_int_equal(db, 2);
    assert_int_equal(redis_link_parse_url("redis://user:pw@[::1]:7000/", host, sizeof(host), &port,
                                          pass, sizeof(pass), &db), 0);
    assert_string_equal(host, "::1");
    assert_string_equal(pass, "pw");
    assert_int_equal(port, 7000);
    const char *bad[] = {"http://h", "redis://", "redis://h:0", "redis://h:70000", "redis://h/x",
                         "redis://h:12x", "redis://[::1", "redis://h/1/2"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (redis_link_parse_url(bad[i], host, sizeof(host), &port, pass, sizeof(pass), &db) != -1)
            fail_msg("accepted %s", bad[i]);
    }
    char small[4];
    assert_int_equal(redis_link_parse_url("redis://longhost", small, sizeof(small), &port, pass,
                                          sizeof(pass), &db), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_urls)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
