/* Unit tests for activator/conn: noticing that the peer left while reading
 * is stopped at the high watermark (a held request with a large body), over
 * a socketpair (FIN) and a loopback TCP pair (RST); the send timeout, over a
 * socketpair whose peer reads slowly, then not at all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "conn.h"

struct seen {
    int events;
    int reads;
};

static void on_read(struct conn *c, void *ud)
{
    (void)c;
    ((struct seen *)ud)->reads++;
}

static void on_event(struct conn *c, int what, int err, void *ud)
{
    (void)c;
    (void)err;
    ((struct seen *)ud)->events |= what;
}

static void nap_ms(long ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Turns the loop until the input holds want bytes (bounded). */
static void fill(struct event_base *base, struct conn *c, size_t want)
{
    for (int i = 0; i < 500 && evbuffer_get_length(conn_input(c)) < want; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        nap_ms(1);
    }
}

struct rig {
    struct event_base *base;
    struct conn_flusher *fl;
    struct conn *c;
    struct seen seen;
};

static void rig_start(struct rig *g, int fd, size_t hi)
{
    memset(g, 0, sizeof(*g));
    g->base = event_base_new();
    assert_non_null(g->base);
    g->fl = conn_flusher_new(g->base);
    assert_non_null(g->fl);
    g->c = conn_new_fd(g->base, g->fl, fd);
    assert_non_null(g->c);
    conn_setcb(g->c, on_read, NULL, on_event, &g->seen);
    conn_set_read_high(g->c, hi);
    conn_enable_read(g->c);
}

static void rig_stop(struct rig *g)
{
    conn_free(g->c);
    event_base_loop(g->base, EVLOOP_NONBLOCK);
    conn_flusher_free(g->fl);
    event_base_free(g->base);
}

/* The peer's FIN sits behind bytes that reading stopped short of: no event
 * reports it, conn_peer_closed does. */
static void test_fin_behind_unread_bytes(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    struct rig g;
    rig_start(&g, sv[0], 8);
    char buf[64];
    memset(buf, 'b', sizeof(buf));
    assert_int_equal(write(sv[1], buf, sizeof(buf)), (ssize_t)sizeof(buf));
    fill(g.base, g.c, 8);
    assert_int_equal(evbuffer_get_length(conn_input(g.c)), 8);
    assert_true(conn_read_full(g.c));
    assert_false(conn_peer_closed(g.c)); /* alive, with unread bytes */

    close(sv[1]);
    for (int i = 0; i < 5; i++)
        event_base_loop(g.base, EVLOOP_NONBLOCK);
    assert_int_equal(g.seen.events, 0); /* the gap this function closes */
    assert_true(conn_peer_closed(g.c));

    /* Once the input is consumed, reading resumes and the EOF arrives too. */
    for (int i = 0; i < 20 && !(g.seen.events & CONN_EOF); i++) {
        evbuffer_drain(conn_input(g.c), evbuffer_get_length(conn_input(g.c)));
        event_base_loop(g.base, EVLOOP_NONBLOCK);
    }
    assert_true(g.seen.events & CONN_EOF);
    rig_stop(&g);
}

/* A reset (SO_LINGER 0) is reported as well, and reading below the bound
 * is not "full". */
static void test_reset_tcp(void **state)
{
    (void)state;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(lfd >= 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(lfd, 1), 0);
    socklen_t len = sizeof(sa);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &len), 0);
    int cfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(cfd >= 0);
    assert_int_equal(connect(cfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    int afd = accept(lfd, NULL, NULL);
    assert_true(afd >= 0);
    close(lfd);

    struct rig g;
    rig_start(&g, afd, 16);
    assert_false(conn_read_full(g.c));
    char buf[100];
    memset(buf, 'r', sizeof(buf));
    assert_int_equal(write(cfd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
    fill(g.base, g.c, 16);
    assert_true(conn_read_full(g.c));
    assert_false(conn_peer_closed(g.c));

    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    assert_int_equal(setsockopt(cfd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    close(cfd);
    bool gone = false;
    for (int i = 0; i < 200 && !gone; i++) {
        gone = conn_peer_closed(g.c);
        if (!gone)
            nap_ms(1);
    }
    assert_true(gone);
    rig_stop(&g);
}

static long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* Reads what the peer end holds (non-blocking); returns the byte count. */
static size_t drain_peer(int fd, size_t max)
{
    char buf[4096];
    size_t got = 0;
    while (got < max) {
        size_t want = max - got < sizeof(buf) ? max - got : sizeof(buf);
        ssize_t n = read(fd, buf, want);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    return got;
}

/* Turns the loop for ms, reading up to per_turn bytes at the peer every
 * 20 ms (0: not at all); stops early at a send timeout. Returns when the
 * output last shrank (the conn wrote), or -1 if it never did. */
static long run_for(struct rig *g, int peer, long ms, size_t per_turn)
{
    long end = mono_ms() + ms;
    long next_read = 0, progress = -1;
    size_t out = evbuffer_get_length(conn_output(g->c));
    while (mono_ms() < end && !(g->seen.events & CONN_SEND_TIMEOUT)) {
        event_base_loop(g->base, EVLOOP_NONBLOCK);
        size_t now_out = evbuffer_get_length(conn_output(g->c));
        if (now_out < out)
            progress = mono_ms();
        out = now_out;
        if (per_turn && mono_ms() >= next_read) {
            drain_peer(peer, per_turn);
            next_read = mono_ms() + 20;
        }
        nap_ms(2);
    }
    return progress;
}

#define SEND_MS 200

/* Output the peer does not take: CONN_SEND_TIMEOUT once it has waited
 * SEND_MS without progress; a peer that keeps reading, however slowly,
 * never sees it; a peer that took everything has no timer left. */
static void test_send_timeout(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(fcntl(sv[1], F_SETFL, O_NONBLOCK), 0);
    struct rig g;
    rig_start(&g, sv[0], 0);
    conn_set_send_timeout(g.c, SEND_MS);

    /* Small output, written at once: nothing waits, nothing fires. */
    assert_int_equal(evbuffer_add(conn_output(g.c), "hello", 5), 0);
    run_for(&g, sv[1], 2 * SEND_MS, 0);
    assert_int_equal(g.seen.events, 0);
    assert_int_equal(drain_peer(sv[1], 100), 5);

    /* Far more than the socket holds; the peer reads 48 KiB every 20 ms, for
     * several timeout periods: progress each time, no timeout. (A socket is
     * writable again only once a good part of its buffer is free, so a
     * reader taking a few bytes at a time does not count as progress.) */
    static char big[8 << 20];
    memset(big, 'x', sizeof(big));
    assert_int_equal(evbuffer_add(conn_output(g.c), big, sizeof(big)), 0);
    long last = run_for(&g, sv[1], 4 * SEND_MS, 48 * 1024);
    assert_int_equal(g.seen.events, 0);
    assert_true(evbuffer_get_length(conn_output(g.c)) > 0);

    /* The peer stops reading: the timeout follows, counted from the last
     * progress, not from when output was added. */
    assert_true(last > 0);
    long more = run_for(&g, sv[1], 10 * SEND_MS, 0);
    if (more > 0)
        last = more; /* a write still came of the peer's last read */
    long dt = mono_ms() - last;
    assert_true(g.seen.events & CONN_SEND_TIMEOUT);
    /* Valgrind slows every step by an order of magnitude, so only the event
     * itself is checked there; the timing bounds run in the other builds. */
    if (!getenv("THAW_UNDER_VALGRIND")) {
        assert_true(dt >= SEND_MS - 10); /* less a coarse-clock tick or so */
        assert_true(dt < SEND_MS + 150);
    }

    /* 0 turns it off: output waits without an event. */
    g.seen.events = 0;
    conn_set_send_timeout(g.c, 0);
    run_for(&g, sv[1], 2 * SEND_MS, 0);
    assert_int_equal(g.seen.events, 0);
    rig_stop(&g);
    close(sv[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fin_behind_unread_bytes),
        cmocka_unit_test(test_reset_tcp),
        cmocka_unit_test(test_send_timeout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
