/* Unit tests for activator/model_sm: every state's handling of every event,
 * with time and the held count controlled by the test; log lines captured. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "log.h"
#include "model_sm.h"

static char last_line[512];
static int lines;

static void sink(void *ud, const char *line, size_t len)
{
    (void)ud;
    size_t n = len < sizeof(last_line) - 1 ? len : sizeof(last_line) - 1;
    memcpy(last_line, line, n);
    last_line[n] = '\0';
    lines++;
}

static int setup(void **state)
{
    (void)state;
    log_set_sink(sink, NULL);
    lines = 0;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    log_set_sink(NULL, NULL);
    return 0;
}

static void test_cold_start_cycle(void **state)
{
    (void)state;
    struct model_sm sm;
    model_sm_init(&sm, "m1", 1000, 0);
    assert_int_equal(sm.state, MODEL_COLD);
    assert_int_equal(model_sm_handle(&sm, MEV_TICK, 5, 0), 0);
    assert_int_equal(model_sm_handle(&sm, MEV_BACKEND_DOWN, 5, 0), 0);
    assert_int_equal(lines, 0);
    unsigned a = model_sm_handle(&sm, MEV_REQUEST, 10, 0);
    assert_int_equal(a, MACT_HOLD | MACT_WAKE_SIGNAL | MACT_PROBE_START);
    assert_int_equal(sm.state, MODEL_WAKING);
    assert_int_equal(lines, 1);
    assert_non_null(strstr(last_line, "event=model_state model=m1 from=cold to=waking "
                                      "event=request after_ms=10"));
    assert_int_equal(model_sm_handle(&sm, MEV_REQUEST, 20, 1), MACT_HOLD);
    assert_int_equal(model_sm_handle(&sm, MEV_WAKE, 20, 2), 0);
    assert_int_equal(model_sm_handle(&sm, MEV_BACKEND_DOWN, 20, 2), 0);
    /* Held requests keep it waking however long it takes. */
    assert_int_equal(model_sm_handle(&sm, MEV_TICK, 100000, 2), 0);
    assert_int_equal(sm.state, MODEL_WAKING);
    assert_int_equal(model_sm_handle(&sm, MEV_PROBE_OK, 100010, 2), MACT_RELEASE);
    assert_int_equal(sm.state, MODEL_READY);
    assert_int_equal(sm.cold_starts, 1);
    assert_int_equal(model_sm_handle(&sm, MEV_REQUEST, 100020, 0), MACT_FORWARD);
    assert_int_equal(model_sm_handle(&sm, MEV_RETRY, 100020, 0), MACT_FORWARD);
    assert_int_equal(model_sm_handle(&sm, MEV_PROBE_OK, 100020, 0), MACT_RELEASE);
    assert_int_equal(model_sm_handle(&sm, MEV_WAKE, 100020, 0), 0);
    assert_int_equal(model_sm_handle(&sm, MEV_TICK, 900000, 0), 0);
    /* The scale-down race. */
    a = model_sm_handle(&sm, MEV_BACKEND_DOWN, 900001, 0);
    assert_int_equal(a, MACT_WAKE_SIGNAL | MACT_PROBE_START);
    assert_int_equal(sm.state, MODEL_WAKING);
    assert_int_equal(model_sm_handle(&sm, MEV_RETRY, 900001, 0), MACT_HOLD);
    assert_int_equal(model_sm_handle(&sm, MEV_PROBE_OK, 900050, 1), MACT_RELEASE);
    assert_int_equal(sm.cold_starts, 2);
    assert_int_equal(sm.transitions[MODEL_COLD][MODEL_WAKING], 1);
    assert_int_equal(sm.transitions[MODEL_WAKING][MODEL_READY], 2);
    assert_int_equal(sm.transitions[MODEL_READY][MODEL_WAKING], 1);
    assert_int_equal(lines, 4);
}

static void test_wake_timeout(void **state)
{
    (void)state;
    struct model_sm sm;
    model_sm_init(&sm, "m2", 1000, 0);
    assert_int_equal(model_sm_handle(&sm, MEV_WAKE, 100, 0), MACT_WAKE_SIGNAL | MACT_PROBE_START);
    assert_int_equal(model_sm_handle(&sm, MEV_TICK, 1099, 0), 0);
    assert_int_equal(sm.state, MODEL_WAKING);
    assert_int_equal(model_sm_handle(&sm, MEV_TICK, 1100, 0), MACT_PROBE_STOP);
    assert_int_equal(sm.state, MODEL_COLD);
    /* A late probe answer still counts. */
    assert_int_equal(model_sm_handle(&sm, MEV_PROBE_OK, 1200, 0), MACT_RELEASE);
    assert_int_equal(sm.state, MODEL_READY);
    assert_int_equal(sm.cold_starts, 0);
    assert_int_equal(model_sm_handle(&sm, MEV_RETRY, 1200, 0), MACT_FORWARD);
}

/* The endpoint list emptied (scaled to zero on purpose): cold, no wake, unless
 * requests are waiting for capacity. */
static void test_endpoints_gone(void **state)
{
    (void)state;
    struct model_sm sm;
    model_sm_init(&sm, "m7", 1000, 0);
    assert_int_equal(model_sm_handle(&sm, MEV_ENDPOINTS_GONE, 1, 0), 0);
    assert_int_equal(sm.state, MODEL_COLD);
    model_sm_handle(&sm, MEV_PROBE_OK, 2, 0);
    assert_int_equal(model_sm_handle(&sm, MEV_ENDPOINTS_GONE, 3, 0), MACT_PROBE_STOP);
    assert_int_equal(sm.state, MODEL_COLD);
    assert_int_equal(sm.transitions[MODEL_READY][MODEL_COLD], 1);
    model_sm_handle(&sm, MEV_PROBE_OK, 4, 0);
    assert_int_equal(model_sm_handle(&sm, MEV_ENDPOINTS_GONE, 5, 3),
                     MACT_WAKE_SIGNAL | MACT_PROBE_START);
    assert_int_equal(sm.state, MODEL_WAKING);
    assert_int_equal(model_sm_handle(&sm, MEV_ENDPOINTS_GONE, 6, 3), 0);
    model_sm_handle(&sm, MEV_DRAIN, 7, 3);
    model_sm_handle(&sm, MEV_PROBE_OK, 8, 3);
    assert_true(sm.backend_up);
    assert_int_equal(model_sm_handle(&sm, MEV_ENDPOINTS_GONE, 9, 3), 0);
    assert_false(sm.backend_up);
    assert_int_equal(model_sm_handle(&sm, MEV_RETRY, 9, 3), MACT_HOLD);
}

static void test_draining(void **state)
{
    (void)state;
    struct model_sm sm;
    /* From ready: forwards what it has, refuses new work. */
    model_sm_init(&sm, "m3", 1000, 0);
    model_sm_handle(&sm, MEV_PROBE_OK, 1, 0);
    assert_int_equal(model_sm_handle(&sm, MEV_DRAIN, 2, 0), 0);
    assert_int_equal(sm.state, MODEL_DRAINING);
    assert_int_equal(model_sm_handle(&sm, MEV_REQUEST, 3, 0), MACT_REJECT);
    assert_int_equal(model_sm_handle(&sm, MEV_RETRY, 3, 0), MACT_FORWARD);
    assert_int_equal(model_sm_handle(&sm, MEV_BACKEND_DOWN, 3, 0), MACT_PROBE_START);
    assert_int_equal(model_sm_handle(&sm, MEV_RETRY, 3, 0), MACT_HOLD);
    assert_int_equal(model_sm_handle(&sm, MEV_PROBE_OK, 4, 1), MACT_RELEASE);
    assert_int_equal(model_sm_handle(&sm, MEV_RETRY, 4, 0), MACT_FORWARD);
    assert_int_equal(model_sm_handle(&sm, MEV_DRAIN, 5, 0), 0);
    assert_int_equal(model_sm_handle(&sm, MEV_WAKE, 5, 0), 0);
    assert_int_equal(model_sm_handle(&sm, MEV_TICK, 50000, 0), 0);
    assert_int_equal(sm.state, MODEL_DRAINING);
    /* From waking: held requests keep waiting for the backend. */
    model_sm_init(&sm, "m4", 1000, 0);
    model_sm_handle(&sm, MEV_REQUEST, 1, 0);
    assert_int_equal(model_sm_handle(&sm, MEV_DRAIN, 2, 1), 0);
    assert_int_equal(model_sm_handle(&sm, MEV_RETRY, 3, 1), MACT_HOLD);
    assert_int_equal(model_sm_handle(&sm, MEV_PROBE_OK, 4, 1), MACT_RELEASE);
    /* Since when requests can be forwarded (the hold queue's lateness clock
     * for held requests): entering ready, kept into draining; from a drain
     * that began while waking, when the backend comes up. */
    model_sm_init(&sm, "m7", 1000, 0);
    model_sm_handle(&sm, MEV_REQUEST, 10, 0);
    model_sm_handle(&sm, MEV_PROBE_OK, 20, 1);
    assert_int_equal(sm.forwardable_since_ms, 20);
    model_sm_handle(&sm, MEV_PROBE_OK, 25, 0); /* one more endpoint */
    assert_int_equal(sm.forwardable_since_ms, 20);
    model_sm_handle(&sm, MEV_DRAIN, 30, 1);
    assert_int_equal(sm.forwardable_since_ms, 20);
    model_sm_handle(&sm, MEV_BACKEND_DOWN, 40, 1);
    model_sm_handle(&sm, MEV_PROBE_OK, 50, 1);
    assert_int_equal(sm.forwardable_since_ms, 50);
    model_sm_handle(&sm, MEV_PROBE_OK, 60, 1);
    assert_int_equal(sm.forwardable_since_ms, 50);
    model_sm_init(&sm, "m8", 1000, 0);
    model_sm_handle(&sm, MEV_REQUEST, 10, 0);
    model_sm_handle(&sm, MEV_DRAIN, 20, 1);
    model_sm_handle(&sm, MEV_PROBE_OK, 35, 1);
    assert_int_equal(sm.forwardable_since_ms, 35);
    /* From cold with held requests (none normally): probes start. */
    model_sm_init(&sm, "m5", 1000, 0);
    assert_int_equal(model_sm_handle(&sm, MEV_DRAIN, 2, 1), MACT_PROBE_START);
    model_sm_init(&sm, "m6", 1000, 0);
    assert_int_equal(model_sm_handle(&sm, MEV_DRAIN, 2, 0), 0);
    assert_int_equal(model_sm_handle(&sm, MEV_REQUEST, 2, 0), MACT_REJECT);
}

/* When requests last stopped being forwardable: the start of the wake or
 * outage the hold queue measures a held request's allowance from. */
static void test_unforwardable_since(void **state)
{
    (void)state;
    struct model_sm sm;
    model_sm_init(&sm, "m", 1000, 7);
    assert_false(model_sm_forwardable(&sm));
    assert_int_equal(sm.unforwardable_since_ms, 7); /* cold from the start */
    model_sm_handle(&sm, MEV_REQUEST, 10, 0);        /* cold -> waking: still down */
    assert_int_equal(sm.unforwardable_since_ms, 7);
    model_sm_handle(&sm, MEV_PROBE_OK, 20, 1);       /* ready */
    assert_true(model_sm_forwardable(&sm));
    assert_int_equal(sm.unforwardable_since_ms, 7);
    model_sm_handle(&sm, MEV_BACKEND_DOWN, 30, 0);   /* scaled down under us */
    assert_false(model_sm_forwardable(&sm));
    assert_int_equal(sm.unforwardable_since_ms, 30);
    model_sm_handle(&sm, MEV_PROBE_OK, 40, 1);
    model_sm_handle(&sm, MEV_DRAIN, 50, 0);          /* draining, backend still up */
    assert_true(model_sm_forwardable(&sm));
    assert_int_equal(sm.unforwardable_since_ms, 30);
    model_sm_handle(&sm, MEV_BACKEND_DOWN, 60, 1);   /* draining, backend gone */
    assert_false(model_sm_forwardable(&sm));
    assert_int_equal(sm.unforwardable_since_ms, 60);
    model_sm_handle(&sm, MEV_BACKEND_DOWN, 70, 1);   /* still down: unchanged */
    assert_int_equal(sm.unforwardable_since_ms, 60);
}

/* Every healthy endpoint replaced by new ones (a rolling update seen in one
 * refresh): waking to probe them, no wake signal, and no cold start when one
 * answers; a real cold start afterwards still counts. */
static void test_endpoints_replaced(void **state)
{
    (void)state;
    struct model_sm sm;
    model_sm_init(&sm, "m9", 1000, 0);
    assert_int_equal(model_sm_handle(&sm, MEV_ENDPOINTS_REPLACED, 1, 0), 0);
    assert_int_equal(sm.state, MODEL_COLD);
    model_sm_handle(&sm, MEV_REQUEST, 2, 1);
    model_sm_handle(&sm, MEV_PROBE_OK, 3, 1);
    assert_int_equal(sm.cold_starts, 1);
    assert_int_equal(model_sm_handle(&sm, MEV_ENDPOINTS_REPLACED, 4, 0), MACT_PROBE_START);
    assert_int_equal(sm.state, MODEL_WAKING);
    assert_int_equal(model_sm_handle(&sm, MEV_REQUEST, 5, 0), MACT_HOLD);
    assert_int_equal(model_sm_handle(&sm, MEV_PROBE_OK, 6, 1), MACT_RELEASE);
    assert_int_equal(sm.state, MODEL_READY);
    assert_int_equal(sm.cold_starts, 1);
    model_sm_handle(&sm, MEV_BACKEND_DOWN, 7, 0);
    model_sm_handle(&sm, MEV_PROBE_OK, 8, 0);
    assert_int_equal(sm.cold_starts, 2);
    /* With requests waiting for capacity: a wake, as for endpoints_gone. */
    assert_int_equal(model_sm_handle(&sm, MEV_ENDPOINTS_REPLACED, 9, 2),
                     MACT_WAKE_SIGNAL | MACT_PROBE_START);
    model_sm_handle(&sm, MEV_PROBE_OK, 9, 2);
    assert_int_equal(sm.cold_starts, 3);
    model_sm_handle(&sm, MEV_DRAIN, 9, 1);
    assert_int_equal(model_sm_handle(&sm, MEV_ENDPOINTS_REPLACED, 10, 1), MACT_PROBE_START);
    assert_false(sm.backend_up);
}

static void test_names(void **state)
{
    (void)state;
    const char *states[] = {"cold", "waking", "ready", "draining"};
    for (int i = 0; i < MODEL_STATE_COUNT; i++)
        assert_string_equal(model_state_to_str((enum model_state)i), states[i]);
    assert_string_equal(model_state_to_str((enum model_state)99), "unknown");
    for (int i = 0; i < MODEL_EVENT_COUNT; i++)
        assert_string_not_equal(model_event_to_str((enum model_event)i), "unknown");
    assert_string_equal(model_event_to_str((enum model_event)99), "unknown");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cold_start_cycle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wake_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endpoints_gone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endpoints_replaced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_draining, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unforwardable_since, setup, teardown),
        cmocka_unit_test_setup_teardown(test_names, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
