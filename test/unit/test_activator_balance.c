/* Unit tests for activator/balance: least-outstanding choice, caps, ties,
 * endpoint file parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "balance.h"

static void test_pick(void **state)
{
    (void)state;
    struct balance_ep e[3] = {{5, true, false}, {2, true, false}, {2, true, false}};
    struct balance_ep *eps[3] = {&e[0], &e[1], &e[2]};
    size_t rr = 0;
    /* Ties between 1 and 2 alternate. */
    int a = balance_pick(eps, 3, 0, &rr);
    int b = balance_pick(eps, 3, 0, &rr);
    assert_true((a == 1 && b == 2) || (a == 2 && b == 1));
    e[1].outstanding = 1;
    assert_int_equal(balance_pick(eps, 3, 0, &rr), 1);
    assert_int_equal(balance_pick(eps, 3, 0, &rr), 1);
    e[1].healthy = false;
    assert_int_equal(balance_pick(eps, 3, 0, &rr), 2);
    e[2].removed = true;
    assert_int_equal(balance_pick(eps, 3, 0, &rr), 0);
    /* Caps: endpoint 0 is at 5. */
    assert_int_equal(balance_pick(eps, 3, 5, &rr), -1);
    assert_int_equal(balance_capacity(eps, 3, 5), 0);
    assert_int_equal(balance_capacity(eps, 3, 8), 3);
    assert_int_equal(balance_capacity(eps, 3, 0), SIZE_MAX);
    assert_int_equal(balance_pick(eps, 3, 6, &rr), 0);
    assert_int_equal(balance_pick(eps, 0, 0, &rr), -1);
    e[0].healthy = false;
    assert_int_equal(balance_capacity(eps, 3, 0), 0);
}

/* Spread: with equal load, N picks over N endpoints hit each once. */
static void test_spread(void **state)
{
    (void)state;
    struct balance_ep e[4] = {{0, true, false}, {0, true, false}, {0, true, false},
                              {0, true, false}};
    struct balance_ep *eps[4] = {&e[0], &e[1], &e[2], &e[3]};
    size_t rr = 0;
    for (int i = 0; i < 8; i++) {
        int k = balance_pick(eps, 4, 2, &rr);
        assert_true(k >= 0);
        e[k].outstanding++;
    }
    for (int i = 0; i < 4; i++)
        assert_int_equal(e[i].outstanding, 2);
    assert_int_equal(balance_pick(eps, 4, 2, &rr), -1);
}

/* A cap shared by peers (in thousandths): each takes the ceiling of its
 * part, never 0. */
static void test_share(void **state)
{
    (void)state;
    const unsigned u = BALANCE_PEER_UNIT;
    assert_int_equal(balance_share(64, 1 * u), 64);
    assert_int_equal(balance_share(64, 0), 64);
    assert_int_equal(balance_share(64, 999), 64); /* under one peer: still the whole cap */
    assert_int_equal(balance_share(64, 2 * u), 32);
    assert_int_equal(balance_share(64, 3 * u), 22);
    assert_int_equal(balance_share(5, 2 * u), 3);
    assert_int_equal(balance_share(4, 4 * u), 1);
    assert_int_equal(balance_share(2, 7 * u), 1);
    assert_int_equal(balance_share(0, 3 * u), 0); /* no cap stays no cap */
    assert_int_equal(balance_share(4000000000u, 3 * u), 1333333334u);
    /* A draining peer using half its share: 4 / 1.5, and 64 / 2.1. */
    assert_int_equal(balance_share(4, 1500), 3);
    assert_int_equal(balance_share(64, 2100), 31);
    assert_int_equal(balance_share(64, 2001), 32);
    /* The shares and what a draining peer still uses stay within the cap:
     * L live at ceil(cap / (L + w)) and one at w of its old ceil(cap / (L + 1)),
     * give or take the L slots the ceilings round up. */
    for (unsigned cap = 1; cap <= 128; cap++) {
        for (unsigned live = 1; live <= 6; live++) {
            unsigned old = balance_share(cap, (live + 1) * u);
            for (unsigned used = 0; used <= old; used++) {
                unsigned w = (used * u + old - 1) / old;
                unsigned total = live * balance_share(cap, live * u + w) + used;
                assert_true(total <= cap + live);
            }
        }
    }
}

/* IP literals (v4, v6 without brackets) become socket addresses; names do not. */
static void test_sockaddr(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    socklen_t len;
    assert_int_equal(balance_sockaddr("10.0.3.7", 8000, &ss, &len), 0);
    assert_int_equal(ss.ss_family, AF_INET);
    assert_int_equal(ntohs(((struct sockaddr_in *)(void *)&ss)->sin_port), 8000);
    assert_int_equal(len, sizeof(struct sockaddr_in));
    assert_int_equal(balance_sockaddr("::1", 9091, &ss, &len), 0);
    assert_int_equal(ss.ss_family, AF_INET6);
    assert_int_equal(len, sizeof(struct sockaddr_in6));
    assert_int_equal(balance_sockaddr("scaler.thaw.test", 9091, &ss, &len), -1);
    assert_int_equal(balance_sockaddr("[::1]", 9091, &ss, &len), -1);
}

static void test_parse_file(void **state)
{
    (void)state;
    const char *text = "# pods\n127.0.0.1:8001\n  10.0.0.2:9000  # second\n\r\n"
                       "[::1]:8002\r\nlocalhost:8003\n127.0.0.1:8001\n";
    struct balance_addr *a = NULL;
    char err[128];
    long n = balance_parse_endpoints(text, strlen(text), &a, err, sizeof(err));
    assert_int_equal(n, 4);
    assert_string_equal(a[0].host, "127.0.0.1");
    assert_int_equal(a[0].port, 8001);
    assert_string_equal(a[1].host, "10.0.0.2");
    assert_string_equal(a[2].host, "::1");
    assert_int_equal(a[2].port, 8002);
    assert_string_equal(a[3].host, "127.0.0.1");
    assert_int_equal(a[3].port, 8003);
    thaw_free(a);
    n = balance_parse_endpoints("", 0, &a, err, sizeof(err));
    assert_int_equal(n, 0);
    thaw_free(a);
    const char *bad[] = {"127.0.0.1\n", "127.0.0.1:0\n", "127.0.0.1:65536\n", "host.x:80\n",
                         "[::1:80\n", "1.2.3.4:8x\n", ":80\n", "ok:1\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        a = NULL;
        n = balance_parse_endpoints(bad[i], strlen(bad[i]), &a, err, sizeof(err));
        if (n != -1)
            fail_msg("bad %zu parsed", i);
        assert_non_null(strstr(err, "line 1"));
        assert_null(a);
    }
    /* Growth past the initial capacity and allocation failure. */
    char big[2000] = "";
    for (int i = 0; i < 40; i++) {
        char line[32];
        snprintf(line, sizeof(line), "127.0.0.1:%d\n", 1000 + i);
        strcat(big, line);
    }
    n = balance_parse_endpoints(big, strlen(big), &a, err, sizeof(err));
    assert_int_equal(n, 40);
    assert_int_equal(a[39].port, 1039);
    thaw_free(a);
    alloc_fail_after(1);
    a = NULL;
    n = balance_parse_endpoints(big, strlen(big), &a, err, sizeof(err));
    alloc_fail_after(-1);
    assert_int_equal(n, -1);
    assert_string_equal(err, "out of memory");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick),
        cmocka_unit_test(test_spread),
        cmocka_unit_test(test_share),
        cmocka_unit_test(test_sockaddr),
        cmocka_unit_test(test_parse_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
