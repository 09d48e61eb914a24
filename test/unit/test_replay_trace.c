/* replay trace: the ServeGen envelope generator (rates scaled to the asked
 * mean and split by window, client burstiness, determinism, errors) and the
 * arrival jitter. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "trace.h"

static char fixture[64];

/* Writes the envelope under test: model a/x has six windows, the fourth at
 * three times the others' rate; b/y is one client with CV 3 for an hour. */
static int write_fixture(void **state)
{
    (void)state;
    snprintf(fixture, sizeof(fixture), "/tmp/thaw-sg-XXXXXX");
    int fd = mkstemp(fixture);
    if (fd < 0)
        return -1;
    FILE *f = fdopen(fd, "w");
    if (!f)
        return -1;
    fprintf(f, "model,window_start_s,sum_rate_rps,active_clients,rate_weighted_cv\n");
    for (int i = 0; i < 6; i++)
        fprintf(f, "a/x,%d,%s,40,1.0000\n", i * 600, i == 3 ? "300.0" : "100.0");
    for (int i = 0; i < 6; i++)
        fprintf(f, "b/y,%d,50.0,1,3.0000\n", i * 600);
    return fclose(f) == 0 ? 0 : -1;
}

static int remove_fixture(void **state)
{
    (void)state;
    unlink(fixture);
    return 0;
}

static double gap_cv(const struct trace *t)
{
    double s = 0, ss = 0;
    size_t n = t->n - 1;
    for (size_t i = 0; i < n; i++) {
        double g = t->reqs[i + 1].t - t->reqs[i].t;
        s += g;
        ss += g * g;
    }
    double m = s / (double)n;
    return sqrt(ss / (double)n - m * m) / m;
}

static void test_rates_follow_the_envelope_scaled_to_the_mean(void **state)
{
    (void)state;
    struct trace t;
    char err[256];
    assert_int_equal(trace_servegen(fixture, "a/x", 0, 3600, 4, 4, 1, &t, err, sizeof(err)), 0);
    /* 4 req/s over an hour; Poisson (CV 1), so within 3 % of 14 400. */
    assert_in_range(t.n, 13968, 14832);
    size_t per_window[6] = {0};
    for (size_t i = 0; i < t.n; i++) {
        if (i > 0)
            assert_true(t.reqs[i].t >= t.reqs[i - 1].t);
        assert_true(t.reqs[i].ctx >= 1 && t.reqs[i].gen >= 1);
        /* Times start at the first request, a fraction of a second in. */
        size_t w = (size_t)((t.reqs[i].t + t.reqs[0].t) / 600);
        per_window[w < 6 ? w : 5]++;
    }
    assert_true(t.reqs[0].t == 0);
    /* The window at 3x the rate holds about 3x the requests. */
    double others = (double)(t.n - per_window[3]) / 5;
    assert_in_range((long)(100 * per_window[3] / others), 270, 330);
    assert_string_equal(t.name, "sg-x-h0");
    trace_finish(&t);
}

static void test_slice_starts_at_the_given_offset(void **state)
{
    (void)state;
    struct trace t;
    char err[256];
    /* The last hour-long slice from 1800 s holds windows 3-5: the busy
     * one first, so the slice averages (300 + 100 + 100) / 3 -> 4 req/s. */
    assert_int_equal(trace_servegen(fixture, "a/x", 1800, 1800, 4, 4, 1, &t, err, sizeof(err)), 0);
    assert_in_range(t.n, 7000, 7400);
    size_t first = 0;
    for (size_t i = 0; i < t.n; i++)
        first += t.reqs[i].t < 600;
    /* 600 s at 7.2 req/s of the 1800 s. */
    assert_in_range(first, 4100, 4550);
    trace_finish(&t);
}

static void test_client_cv_makes_bursts_and_the_cap_limits_them(void **state)
{
    (void)state;
    struct trace t;
    char err[256];
    assert_int_equal(trace_servegen(fixture, "b/y", 0, 3600, 2, 4, 7, &t, err, sizeof(err)), 0);
    double bursty = gap_cv(&t);
    trace_finish(&t);
    assert_int_equal(trace_servegen(fixture, "b/y", 0, 3600, 2, 1, 7, &t, err, sizeof(err)), 0);
    double capped = gap_cv(&t);
    trace_finish(&t);
    assert_true(bursty > 2.2 && bursty < 3.8);
    assert_true(capped > 0.9 && capped < 1.1);
}

static void test_same_seed_same_trace(void **state)
{
    (void)state;
    struct trace a, b, c;
    char err[256];
    assert_int_equal(trace_servegen(fixture, "a/x", 0, 3600, 4, 4, 3, &a, err, sizeof(err)), 0);
    assert_int_equal(trace_servegen(fixture, "a/x", 0, 3600, 4, 4, 3, &b, err, sizeof(err)), 0);
    assert_int_equal(trace_servegen(fixture, "a/x", 0, 3600, 4, 4, 4, &c, err, sizeof(err)), 0);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.reqs, b.reqs, a.n * sizeof(*a.reqs));
    assert_true(a.n != c.n || memcmp(a.reqs, c.reqs, a.n * sizeof(*a.reqs)) != 0);
    trace_finish(&a);
    trace_finish(&b);
    trace_finish(&c);
}

static void test_errors_are_reported_not_fatal(void **state)
{
    (void)state;
    struct trace t;
    char err[256];
    assert_int_equal(
        trace_servegen(fixture, "no/such", 0, 3600, 4, 4, 1, &t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "no traffic for 'no/such'"));
    assert_null(t.reqs);
    assert_int_equal(trace_servegen(fixture, "a/x", 7200, 3600, 4, 4, 1, &t, err, sizeof(err)), -1);
    assert_int_equal(trace_servegen("/nonexistent/sg.csv", "a/x", 0, 3600, 4, 4, 1, &t, err,
                                    sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "/nonexistent/sg.csv"));
    assert_int_equal(trace_servegen(fixture, "a/x", 0, 0, 4, 4, 1, &t, err, sizeof(err)), -1);
    assert_int_equal(trace_servegen(fixture, "a/x", 0, 3600, -1, 4, 1, &t, err, sizeof(err)), -1);

    char bad[64];
    snprintf(bad, sizeof(bad), "/tmp/thaw-sg-bad-XXXXXX");
    int fd = mkstemp(bad);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fprintf(f, "model,window_start_s,sum_rate_rps,active_clients,rate_weighted_cv\n"
               "a/x,0,100.0,40,1.0\n"
               "a/x,600,lots,40,1.0\n");
    assert_int_equal(fclose(f), 0);
    assert_int_equal(trace_servegen(bad, "a/x", 0, 3600, 4, 4, 1, &t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, ":3: expected model,"));
    unlink(bad);
}

static void test_jitter_moves_arrivals_within_the_spread(void **state)
{
    (void)state;
    struct trace a, b, c;
    char err[256];
    assert_int_equal(trace_servegen(fixture, "a/x", 0, 3600, 4, 4, 5, &a, err, sizeof(err)), 0);
    assert_int_equal(trace_servegen(fixture, "a/x", 0, 3600, 4, 4, 5, &b, err, sizeof(err)), 0);
    assert_int_equal(trace_servegen(fixture, "a/x", 0, 3600, 4, 4, 5, &c, err, sizeof(err)), 0);
    double tokens = trace_tokens(&a);
    assert_int_equal(trace_jitter(&a, 0, 9), 0);
    assert_memory_equal(a.reqs, b.reqs, a.n * sizeof(*a.reqs));
    assert_int_equal(trace_jitter(&a, 0.5, 9), 0);
    assert_int_equal(trace_jitter(&c, 0.5, 9), 0);
    assert_int_equal(a.n, b.n);
    assert_true(trace_tokens(&a) == tokens);
    assert_memory_equal(a.reqs, c.reqs, a.n * sizeof(*a.reqs));
    /* The k-th arrival moves by at most the spread, and the restart at the
     * new first request by at most the spread again. */
    size_t moved = 0;
    assert_true(a.reqs[0].t == 0);
    for (size_t i = 0; i < a.n; i++) {
        if (i > 0)
            assert_true(a.reqs[i].t >= a.reqs[i - 1].t);
        assert_true(fabs(a.reqs[i].t - b.reqs[i].t) <= 1.0 + 1e-9);
        moved += a.reqs[i].t != b.reqs[i].t;
    }
    assert_true(moved > a.n / 2);
    trace_finish(&a);
    trace_finish(&b);
    trace_finish(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rates_follow_the_envelope_scaled_to_the_mean),
        cmocka_unit_test(test_slice_starts_at_the_given_offset),
        cmocka_unit_test(test_client_cv_makes_bursts_and_the_cap_limits_them),
        cmocka_unit_test(test_same_seed_same_trace),
        cmocka_unit_test(test_errors_are_reported_not_fatal),
        cmocka_unit_test(test_jitter_moves_arrivals_within_the_spread),
    };
    return cmocka_run_group_tests(tests, write_fixture, remove_fixture);
}
