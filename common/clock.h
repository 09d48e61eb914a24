/* clock: time sources. Pure modules take time as an argument; only the I/O
 * layer calls these. */
#ifndef THAW_CLOCK_H
#define THAW_CLOCK_H

#include <stdint.h>

/* Monotonic milliseconds (for intervals, deadlines, latency). */
int64_t clock_mono_ms(void);
/* Monotonic microseconds (for latency histograms). */
int64_t clock_mono_us(void);
/* Wall-clock unix milliseconds (for timestamps shared between processes, e.g. in Redis). */
int64_t clock_unix_ms(void);

#endif
