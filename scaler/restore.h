/* restore: what a restarted scaler reads back about the replicas it asked for
 * before, so that a restart does not undo the scale-down windows it forgot.
 *
 * Every scaler exposes thaw_scaler_desired_replicas per ScaledObject, and
 * Prometheus keeps it across the restart. Its last value is what the lost
 * windows were holding (the maximum of the level over the scale-down window,
 * or a surge); a model gone to zero has 0 there and is not woken. One instant
 * query at start asks for each ScaledObject's last answer within the window;
 * the state holds it as a floor (policy_state_restore) for as long as the
 * target's own scale-down window would have. This module builds the query and keeps
 * the answer; it does no I/O and reads no clock. */
#ifndef THAW_RESTORE_H
#define THAW_RESTORE_H

#include <stddef.h>
#include <stdint.h>

struct prom_sample;
struct restore_book;

/* The label the query joins namespace, scaledobject and model into,
 * "ns/name/model": a target's id in the state (neither a namespace nor a
 * ScaledObject name can hold a '/'; a model name may). */
#define RESTORE_LABEL "thaw_restore_target"

/* Writes the PromQL for `series` (a metric name with optional matchers, e.g.
 * thaw_scaler_desired_replicas{job="thaw-scaler"}) over window_ms into out:
 * the last value within the window per namespace, scaledobject and model,
 * the highest across scalers that exposed it (several replicas, or old and
 * new pods of a rolling update). Returns 0, or -1 when out is too small,
 * the series is not a metric name with at most one {...} matcher list at
 * its end, or window_ms < 1000. */
int restore_query(char *out, size_t outlen, const char *series, int64_t window_ms);

struct restore_book *restore_book_new(void);
/* Accepts NULL. */
void restore_book_free(struct restore_book *b);

/* Replaces the book's floors with the query's answer. Values below 1 hold
 * nothing; samples that are invalid or whose label is not "ns/name/model"
 * are skipped (counted in *skipped), as are values over POLICY_MAX_REPLICAS,
 * which no scaler reports; values are rounded up; at most max_entries are
 * kept (0: no limit). Returns
 * the number of floors kept, or -1 on allocation failure (the book is then
 * empty). */
long restore_book_fill(struct restore_book *b, const struct prom_sample *samples, size_t n,
                       size_t max_entries, size_t *skipped);
/* The floor read back for a target ("ns/name/model"), 0 if none. */
long restore_book_floor(const struct restore_book *b, const char *target_id);
size_t restore_book_count(const struct restore_book *b);
/* Forgets every floor. */
void restore_book_clear(struct restore_book *b);

#endif
