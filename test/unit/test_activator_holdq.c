/* Unit tests for activator/holdq: tier order, bounds, shedding, deadlines,
 * late requests last. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "holdq.h"

static void test_order(void **state)
{
    (void)state;
    struct holdq q;
    holdq_init(&q, 10, 1000);
    struct holdq_node n[6];
    memset(n, 0, sizeof(n));
    enum tier tiers[6] = {TIER_NORMAL, TIER_LOW, TIER_HIGH, TIER_NORMAL, TIER_HIGH, TIER_LOW};
    for (int i = 0; i < 6; i++) {
        assert_true(holdq_fits(&q, 10));
        holdq_push(&q, &n[i], tiers[i], 10, i, 1000 + i);
    }
    assert_int_equal(q.count, 6);
    assert_int_equal(q.bytes, 60);
    assert_int_equal(q.count_by_tier[TIER_HIGH], 2);
    int want[6] = {2, 4, 0, 3, 1, 5};
    for (int i = 0; i < 6; i++) {
        struct holdq_node *p = holdq_pop(&q);
        assert_ptr_equal(p, &n[want[i]]);
        assert_false(p->queued);
        if (i == 2) {
            /* A released entry that must wait again goes back to its place. */
            holdq_push_front(&q, p);
            assert_ptr_equal(holdq_pop(&q), p);
        }
    }
    assert_null(holdq_pop(&q));
    assert_int_equal(q.count, 0);
    assert_int_equal(q.bytes, 0);
}

static void test_bounds_and_shed(void **state)
{
    (void)state;
    struct holdq q;
    holdq_init(&q, 3, 100);
    struct holdq_node a = {0}, b = {0}, c = {0}, d = {0};
    holdq_push(&q, &a, TIER_LOW, 10, 0, 100);
    holdq_push(&q, &b, TIER_NORMAL, 10, 0, 100);
    holdq_push(&q, &c, TIER_LOW, 10, 0, 100);
    assert_false(holdq_fits(&q, 1)); /* count bound */
    /* A low request cannot shed anything; a normal one sheds the newest low. */
    assert_null(holdq_victim(&q, TIER_LOW, 1));
    assert_ptr_equal(holdq_victim(&q, TIER_NORMAL, 1), &c);
    assert_ptr_equal(holdq_victim(&q, TIER_HIGH, 1), &c);
    holdq_remove(&q, &c);
    holdq_remove(&q, &c); /* second remove is a no-op */
    assert_int_equal(q.count, 2);
    assert_true(holdq_fits(&q, 80));
    assert_false(holdq_fits(&q, 81)); /* byte bound */
    assert_null(holdq_victim(&q, TIER_HIGH, 101)); /* can never fit */
    holdq_push(&q, &d, TIER_HIGH, 80, 0, 100);
    assert_ptr_equal(holdq_victim(&q, TIER_HIGH, 5), &a);
    holdq_remove(&q, &a);
    assert_ptr_equal(holdq_victim(&q, TIER_HIGH, 15), &b);
    assert_null(holdq_victim(&q, TIER_NORMAL, 15)); /* b is not lower than normal */
    holdq_set_limits(&q, 10, 1000);
    assert_true(holdq_fits(&q, 15));
}

static void test_deadlines(void **state)
{
    (void)state;
    struct holdq q;
    holdq_init(&q, 10, 1000);
    assert_int_equal(holdq_next_deadline(&q), INT64_MAX);
    struct holdq_node a = {0}, b = {0}, c = {0};
    holdq_push(&q, &a, TIER_NORMAL, 1, 0, 500);
    holdq_push(&q, &b, TIER_NORMAL, 1, 100, 600);
    holdq_push(&q, &c, TIER_HIGH, 1, 200, 700);
    assert_int_equal(holdq_next_deadline(&q), 500);
    assert_null(holdq_pop_expired(&q, 499));
    assert_ptr_equal(holdq_pop_expired(&q, 500), &a);
    assert_null(holdq_pop_expired(&q, 500));
    assert_int_equal(holdq_next_deadline(&q), 600);
    assert_ptr_equal(holdq_pop_expired(&q, 10000), &c);
    assert_ptr_equal(holdq_pop_expired(&q, 10000), &b);
    assert_null(holdq_pop_expired(&q, 10000));
    assert_int_equal(q.count, 0);
}

/* A reload that shortens the hold timeout: the deadlines of entries held
 * already come down to enqueued + the new timeout, so an entry held after it
 * is not stuck behind an older, longer deadline (only heads are looked at). */
static void test_deadlines_after_reload(void **state)
{
    (void)state;
    struct holdq q;
    holdq_init(&q, 10, 1000);
    holdq_set_hold_timeout(&q, 20000);
    struct holdq_node a = {0}, b = {0}, c = {0}, d = {0};
    holdq_push(&q, &a, TIER_NORMAL, 1, 0, 20000);
    holdq_push(&q, &c, TIER_NORMAL, 1, 100, 20100);
    holdq_set_hold_timeout(&q, 1000);
    assert_int_equal(a.deadline_ms, 1000);
    assert_int_equal(c.deadline_ms, 1100);
    holdq_push(&q, &b, TIER_NORMAL, 1, 500, 1500);
    assert_int_equal(holdq_next_deadline(&q), 1000);
    assert_ptr_equal(holdq_pop_expired(&q, 1000), &a);
    assert_int_equal(holdq_next_deadline(&q), 1100);
    assert_ptr_equal(holdq_pop_expired(&q, 1500), &c);
    assert_ptr_equal(holdq_pop_expired(&q, 1500), &b);
    assert_null(holdq_pop_expired(&q, 1500));
    /* Lengthened: deadlines set before stay (the earlier of the two). */
    holdq_push(&q, &a, TIER_NORMAL, 1, 2000, 3000);
    holdq_set_hold_timeout(&q, 5000);
    assert_int_equal(a.deadline_ms, 3000);
    holdq_push(&q, &b, TIER_NORMAL, 1, 2100, 7100);
    assert_int_equal(holdq_next_deadline(&q), 3000);
    /* An entry put back after the timeout was shortened while it was out
     * gets the new bound; one whose deadline passes a newer entry's is
     * brought down to it, and those before it to its own. */
    holdq_push(&q, &c, TIER_NORMAL, 1, 2050, 7050);
    holdq_remove(&q, &c);
    holdq_set_hold_timeout(&q, 1000); /* a: 3000, b: 3100 */
    assert_int_equal(b.deadline_ms, 3100);
    holdq_push_front(&q, &c);
    assert_int_equal(c.deadline_ms, 3050);
    holdq_remove(&q, &c);
    c.deadline_ms = 9000;
    q.hold_timeout_ms = 0; /* as if unset: only the order bounds it */
    holdq_push_front(&q, &c);
    assert_int_equal(c.deadline_ms, 3100);
    holdq_remove(&q, &c);
    holdq_push(&q, &d, TIER_NORMAL, 1, 2200, 2500); /* out of order on purpose */
    holdq_remove(&q, &b);
    holdq_push_front(&q, &b); /* between a and d: 3100 -> 2500 */
    assert_int_equal(b.deadline_ms, 2500);
    assert_int_equal(a.deadline_ms, 2500);
    assert_ptr_equal(holdq_pop_expired(&q, 2500), &a);
    assert_ptr_equal(holdq_pop_expired(&q, 2500), &b);
    assert_ptr_equal(holdq_pop_expired(&q, 2500), &d);
    assert_int_equal(q.count, 0);
}

static void test_fresh_first(void **state)
{
    (void)state;
    struct holdq q;
    holdq_init(&q, 10, 1000);
    struct holdq_node a = {0}, b = {0}, c = {0}, d = {0};
    holdq_push(&q, &a, TIER_NORMAL, 1, 0, 100000);
    holdq_push(&q, &b, TIER_NORMAL, 1, 500, 100000);
    holdq_push(&q, &c, TIER_NORMAL, 1, 1500, 100000);
    /* At 2000 with 1000 ms: a and b are late, c is not; c first, then the
     * late ones oldest first. */
    assert_ptr_equal(holdq_pop_fresh_first(&q, 2000, 1000, 0, 0), &c);
    /* c could not be sent after all: back in its place, first again. */
    holdq_push_front(&q, &c);
    assert_ptr_equal(q.head[TIER_NORMAL], &a);
    assert_ptr_equal(q.tail[TIER_NORMAL], &c);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 2000, 1000, 0, 0), &c);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 2000, 1000, 0, 0), &a);
    holdq_push(&q, &d, TIER_NORMAL, 1, 2100, 100000);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 2200, 1000, 0, 0), &d);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 2200, 1000, 0, 0), &b);
    assert_null(holdq_pop_fresh_first(&q, 2200, 1000, 0, 0));
    assert_int_equal(q.count, 0);

    /* Exactly late_after waited is not late yet. */
    holdq_push(&q, &a, TIER_NORMAL, 1, 0, 100000);
    holdq_push(&q, &b, TIER_NORMAL, 1, 10, 100000);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 1000, 1000, 0, 0), &a);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 1000, 1000, 0, 0), &b);

    /* 0: plain FIFO, however long they waited. */
    holdq_push(&q, &a, TIER_NORMAL, 1, 0, 100000);
    holdq_push(&q, &b, TIER_NORMAL, 1, 5000, 100000);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 9000, 0, 0, 0), &a);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 9000, 0, 0, 0), &b);
}

static void test_fresh_first_ready_since(void **state)
{
    (void)state;
    struct holdq q;
    holdq_init(&q, 10, 1000);
    struct holdq_node a = {0}, b = {0}, c = {0}, d = {0};
    /* Held while the model loaded (ready at 60000): their clocks start then. */
    holdq_push(&q, &a, TIER_NORMAL, 1, 0, 1000000);
    holdq_push(&q, &b, TIER_NORMAL, 1, 100, 1000000);
    holdq_push(&q, &c, TIER_NORMAL, 1, 200, 1000000);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 60500, 1000, 60000, 0), &a);
    /* 1.5 s after the release they are late: a newer request goes first. */
    holdq_push(&q, &d, TIER_NORMAL, 1, 61000, 1000000);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 61500, 1000, 60000, 0), &d);
    /* The model went away and came back at 70000: lateness starts over, with
     * the wake's length (70000 - 100, b's wait) as the held ones' allowance:
     * b's clock starts at 70000, c's at 70100, d's (held since 65000) at
     * 134900. At 71500 c is late and d, held through most of the wake, is
     * not. */
    holdq_push(&q, &d, TIER_NORMAL, 1, 65000, 1000000);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 70500, 1000, 70000, 0), &b);
    assert_true(holdq_is_late(&q, &c, 71500));
    assert_false(holdq_is_late(&q, &d, 71500));
    assert_ptr_equal(holdq_pop_fresh_first(&q, 71500, 1000, 70000, 0), &d);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 71500, 1000, 70000, 0), &c);

    /* A reload that lengthens late_after: what was late is on time again. */
    holdq_push(&q, &a, TIER_NORMAL, 1, 80000, 1000000);
    holdq_push(&q, &b, TIER_NORMAL, 1, 81500, 1000000);
    holdq_push(&q, &c, TIER_NORMAL, 1, 81600, 1000000);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 82000, 1000, 70000, 0), &b); /* a is late */
    assert_ptr_equal(holdq_pop_fresh_first(&q, 82000, 5000, 70000, 0), &a);
}

/* A wake of 60 s: requests held through it keep the wake as an allowance, so
 * one held at its end is not passed by newer ones while it can still make a
 * deadline of a cold start; one held from its start can't, and is. */
static void test_fresh_first_wake_allowance(void **state)
{
    (void)state;
    struct holdq q;
    holdq_init(&q, 10, 1000);
    struct holdq_node first = {0}, mid = {0}, last = {0}, newer = {0}, newest = {0};
    holdq_push(&q, &first, TIER_NORMAL, 1, 0, 1000000);
    holdq_push(&q, &mid, TIER_NORMAL, 1, 30000, 1000000);
    holdq_push(&q, &last, TIER_NORMAL, 1, 59000, 1000000);
    /* Ready at 60000: allowance 60000; clocks start at 60000, 90000, 119000. */
    assert_ptr_equal(holdq_pop_fresh_first(&q, 60000, 1000, 60000, 0), &first);
    assert_int_equal(q.held_allowance_ms, 60000);
    /* At 62000 none of the held ones left is late: a newer request (clock
     * 61500) goes before mid (90000), which goes before last. */
    holdq_push(&q, &newer, TIER_NORMAL, 1, 61500, 1000000);
    assert_false(holdq_is_late(&q, &mid, 62000));
    assert_ptr_equal(holdq_pop_fresh_first(&q, 62000, 1000, 60000, 0), &newer);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 62000, 1000, 60000, 0), &mid);
    /* At 121000 last is late (clock 119000): a newer request goes first, the
     * late one only when nothing is on time. */
    holdq_push(&q, &newest, TIER_NORMAL, 1, 120500, 1000000);
    assert_true(holdq_is_late(&q, &last, 121000));
    assert_ptr_equal(holdq_pop_fresh_first(&q, 121000, 1000, 60000, 0), &newest);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 121000, 1000, 60000, 0), &last);
    assert_null(holdq_pop_fresh_first(&q, 121000, 1000, 60000, 0));
    /* A reload (new late_after) keeps the wake's length. */
    holdq_push(&q, &first, TIER_NORMAL, 1, 50000, 1000000);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 121000, 2000, 60000, 0), &first);
    assert_int_equal(q.held_allowance_ms, 60000);
}

/* A removal moves the newer part's cursor back onto the last held entry, and
 * a held entry put back then lands right after it: the newer part must still
 * be looked at from its start (found by review: L was sent before R2, whose
 * clock started earlier). */
static void test_fresh_first_cursor_on_held(void **state)
{
    (void)state;
    struct holdq q;
    holdq_init(&q, 10, 1000);
    struct holdq_node o = {0}, l0 = {0}, l = {0}, x = {0}, r1 = {0}, r2 = {0};
    holdq_push(&q, &o, TIER_NORMAL, 1, 0, 1000000);
    holdq_push(&q, &l0, TIER_NORMAL, 1, 400, 1000000);
    holdq_push(&q, &l, TIER_NORMAL, 1, 500, 1000000);
    holdq_push(&q, &x, TIER_NORMAL, 1, 800, 1000000);
    /* Ready at 1000, the wake began at 0: allowance 1000, clocks 1000, 1400,
     * 1500, 1800. */
    assert_ptr_equal(holdq_pop_fresh_first(&q, 1000, 1000, 1000, 0), &o);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 1000, 1000, 1000, 0), &l0);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 1000, 1000, 1000, 0), &l);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 1000, 1000, 1000, 0), &x);
    holdq_push(&q, &r1, TIER_NORMAL, 1, 1000, 1000000);
    holdq_push(&q, &r2, TIER_NORMAL, 1, 1450, 1000000);
    holdq_push_front(&q, &l0);
    holdq_push_front(&q, &l);
    /* At 2100 r1 (clock 1000) and l0 (1400) are late: l0 goes first. */
    assert_ptr_equal(holdq_pop_fresh_first(&q, 2100, 1000, 1000, 0), &l0);
    assert_ptr_equal(q.last_late[TIER_NORMAL], &r1);
    holdq_remove(&q, &r1); /* its client went away */
    holdq_push_front(&q, &x);
    /* l (1500), x (1800) and r2 (1450) are on time: r2's clock is earliest. */
    assert_ptr_equal(holdq_pop_fresh_first(&q, 2100, 1000, 1000, 0), &r2);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 2100, 1000, 1000, 0), &l);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 2100, 1000, 1000, 0), &x);
}

/* Time spent waiting for a slot before the model stopped taking requests is
 * not part of the wake: a 1 s outage after a 590 s wait at the cap gives an
 * allowance of 1 s, not 591 s. */
static void test_fresh_first_wake_start(void **state)
{
    (void)state;
    struct holdq q;
    holdq_init(&q, 10, 1000);
    struct holdq_node capped = {0}, held = {0}, newer = {0};
    holdq_push(&q, &capped, TIER_NORMAL, 1, 0, 1000000);   /* at the cap since 0 */
    holdq_push(&q, &held, TIER_NORMAL, 1, 590500, 1000000); /* during the outage */
    holdq_push(&q, &newer, TIER_NORMAL, 1, 592000, 1000000);
    /* Outage from 590000, ready again at 591000: clocks 1000, 591500, 592000. */
    assert_ptr_equal(holdq_pop_fresh_first(&q, 593000, 1000, 591000, 590000), &newer);
    assert_int_equal(q.held_allowance_ms, 1000);
    assert_true(holdq_is_late(&q, &held, 593000));
    assert_ptr_equal(holdq_pop_fresh_first(&q, 593000, 1000, 591000, 590000), &capped);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 593000, 1000, 591000, 590000), &held);
}

static void test_fresh_first_tiers(void **state)
{
    (void)state;
    struct holdq q;
    holdq_init(&q, 10, 1000);
    struct holdq_node hi = {0}, lo = {0}, n1 = {0}, n2 = {0};
    holdq_push(&q, &hi, TIER_HIGH, 1, 0, 100000);
    holdq_push(&q, &n1, TIER_NORMAL, 1, 0, 100000);
    holdq_push(&q, &lo, TIER_LOW, 1, 4900, 100000);
    holdq_push(&q, &n2, TIER_NORMAL, 1, 4900, 100000);
    /* Tiers keep their precedence: a late high request beats on-time ones. */
    assert_ptr_equal(holdq_pop_fresh_first(&q, 5000, 1000, 0, 0), &hi);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 5000, 1000, 0, 0), &n2);
    /* Removing the tier's last known late entry (a timeout, a client gone)
     * leaves the cursor valid. */
    holdq_remove(&q, &n1);
    assert_ptr_equal(holdq_pop_fresh_first(&q, 5000, 1000, 0, 0), &lo);
    assert_null(holdq_pop_fresh_first(&q, 5000, 1000, 0, 0));
}

/* The reference: in each tier, the entry on time whose clock started first
 * (the earliest in the list on a tie), else the tier's head. A clock starts
 * at max(enqueued, since), or enqueued + allowance for one enqueued before
 * since. */
static struct holdq_node *ref_pick(struct holdq *q, int64_t now, int64_t late, int64_t since,
                                   int64_t allowance)
{
    for (int t = 0; t < TIER_COUNT; t++) {
        struct holdq_node *best = NULL;
        int64_t best_from = 0;
        for (struct holdq_node *n = q->head[t]; n; n = n->next) {
            int64_t from = n->enqueued_ms < since ? n->enqueued_ms + allowance : n->enqueued_ms;
            if (!(from < now - late) && (!best || from < best_from)) {
                best = n;
                best_from = from;
            }
        }
        if (best)
            return best;
        if (q->head[t])
            return q->head[t];
    }
    return NULL;
}

/* What has been held since a given time: heads only, highest tier first. */
static void test_enqueued_by(void **state)
{
    (void)state;
    struct holdq q;
    holdq_init(&q, 10, 1000);
    struct holdq_node n[4];
    memset(n, 0, sizeof(n));
    assert_int_equal(holdq_oldest_enqueued(&q), INT64_MAX);
    assert_null(holdq_pop_enqueued_by(&q, 1000));
    holdq_push(&q, &n[0], TIER_LOW, 1, 100, 9000);
    holdq_push(&q, &n[1], TIER_NORMAL, 1, 200, 9000);
    holdq_push(&q, &n[2], TIER_HIGH, 1, 300, 9000);
    holdq_push(&q, &n[3], TIER_NORMAL, 1, 400, 9000);
    assert_int_equal(holdq_oldest_enqueued(&q), 100);
    assert_null(holdq_pop_enqueued_by(&q, 99));
    /* By 250: normal (200) before low (100): tiers first, like a release. */
    assert_ptr_equal(holdq_pop_enqueued_by(&q, 250), &n[1]);
    assert_ptr_equal(holdq_pop_enqueued_by(&q, 250), &n[0]);
    assert_null(holdq_pop_enqueued_by(&q, 250));
    assert_int_equal(holdq_oldest_enqueued(&q), 300);
    assert_ptr_equal(holdq_pop_enqueued_by(&q, 400), &n[2]);
    assert_ptr_equal(holdq_pop_enqueued_by(&q, 400), &n[3]);
    assert_int_equal(q.count, 0);
}

/* One random run against ref_pick: pushes, pops, put-backs of any released
 * entry, removals, expiries, fallbacks (pop_enqueued_by), readiness changes
 * with outages of up to 3 s, and reloads (late_after, sometimes 0: FIFO).
 * used: entries in play (few make the cursors' corner cases likely), dt: the
 * largest step of the clock, tiers: how many tiers pushes use, ready_rarity:
 * 1 in this many chances to become ready again is taken. */
static void random_run(unsigned seed, int used, int steps, int dt, int tiers, int ready_rarity)
{
    enum { N = 64 };
    struct holdq q;
    holdq_init(&q, N, 1u << 20);
    struct holdq_node nodes[N];
    memset(nodes, 0, sizeof(nodes));
    struct holdq_node *popped[N];
    size_t npopped = 0;
    int64_t now = 1000, since = 0, late = 1000, ref_since = 0, allowance = 0, wake_start = 0;
    srand(seed);
    for (int step = 0; step < steps; step++) {
        int op = rand() % 12;
        now += rand() % dt;
        if (op < 4) {
            for (int i = 0; i < used; i++) {
                if (!nodes[i].queued) {
                    holdq_push(&q, &nodes[i], (enum tier)(rand() % tiers), 1, now,
                               now + 100000);
                    break;
                }
            }
        } else if (op < 7) {
            struct holdq_node *want = NULL;
            if (late <= 0) {
                for (int t = 0; t < TIER_COUNT && !want; t++)
                    want = q.head[t];
            } else {
                if (since != ref_since) {
                    /* The wake's length: the oldest entry's wait when it
                     * ended, from the wake's start at most. */
                    int64_t from = holdq_oldest_enqueued(&q);
                    if (from < wake_start)
                        from = wake_start;
                    allowance = from < since ? since - from : 0;
                    ref_since = since;
                }
                want = ref_pick(&q, now, late, since, allowance);
            }
            struct holdq_node *got = holdq_pop_fresh_first(&q, now, late, since, wake_start);
            assert_ptr_equal(got, want);
            if (got && late > 0) {
                int64_t from = got->enqueued_ms < since ? got->enqueued_ms + allowance
                                                        : got->enqueued_ms;
                assert_int_equal(holdq_is_late(&q, got, now), from < now - late);
            }
            if (got && npopped < N)
                popped[npopped++] = got;
        } else if (op == 7 && npopped > 0) {
            /* A released request that must wait again (any of those
             * released, not only the last). */
            size_t k = (size_t)rand() % npopped;
            struct holdq_node *n = popped[k];
            popped[k] = popped[--npopped];
            if (!n->queued)
                holdq_push_front(&q, n);
        } else if (op == 8) {
            holdq_remove(&q, &nodes[rand() % used]);
        } else if (op == 9) {
            /* A hold timeout, or a request gone to the fallback. */
            struct holdq_node *n = rand() % 2
                                       ? holdq_pop_expired(&q, now - 100000 + rand() % 50000)
                                       : holdq_pop_enqueued_by(&q, now - rand() % 5000);
            if (n && npopped < N)
                popped[npopped++] = n;
        } else if (op == 10) {
            /* An outage that began up to 3 s ago ended: ready again (rare
             * ones let the cursors run long between resets). */
            if (rand() % ready_rarity == 0) {
                wake_start = now - rand() % 3000;
                if (wake_start < since)
                    wake_start = since;
                since = now;
            }
        } else if (rand() % 10 == 0) {
            late = rand() % 8 == 0 ? 0 : 200 + rand() % 3000; /* a reload */
        }
        if (npopped == N)
            npopped = 0;
        /* Each tier stays in enqueue order. */
        for (int t = 0; t < TIER_COUNT; t++)
            for (struct holdq_node *n = q.head[t]; n && n->next; n = n->next)
                assert_true(n->enqueued_ms <= n->next->enqueued_ms);
    }
}

static void test_fresh_first_random(void **state)
{
    (void)state;
    static const int dts[] = {30, 100, 300, 1000};
    enum { SEEDS = 200, STEPS = 4000 };
    for (unsigned seed = 1; seed <= SEEDS; seed++)
        random_run(seed, 2 + (int)(seed % 31), STEPS, dts[seed % 4], 1 + (int)(seed % TIER_COUNT),
                   1 + (int)(seed % 9));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_bounds_and_shed),
        cmocka_unit_test(test_deadlines),
        cmocka_unit_test(test_deadlines_after_reload),
        cmocka_unit_test(test_fresh_first),
        cmocka_unit_test(test_fresh_first_ready_since),
        cmocka_unit_test(test_fresh_first_wake_allowance),
        cmocka_unit_test(test_fresh_first_cursor_on_held),
        cmocka_unit_test(test_fresh_first_wake_start),
        cmocka_unit_test(test_fresh_first_tiers),
        cmocka_unit_test(test_fresh_first_random),
        cmocka_unit_test(test_enqueued_by),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
