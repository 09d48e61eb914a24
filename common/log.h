/* log: one structured line (logfmt) per event, to stderr.
 *
 * Every line is `ts=<RFC3339 ms> level=<lvl> event=<name> k=v ...`. Modules
 * never printf; they call LOG_*(event, "k=%s n=%d", ...). Values that may hold
 * spaces or quotes go through log_quote() first. The sink is replaceable so
 * tests can capture lines. */
#ifndef THAW_LOG_H
#define THAW_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum log_level { LOG_LEVEL_DEBUG = 0, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR };

typedef void (*log_sink_fn)(void *ud, const char *line, size_t len);

/* Parses "debug", "info", "warn"/"warning", "error". Returns 0, or -1 if unknown. */
int log_level_parse(const char *s, enum log_level *out);
const char *log_level_to_str(enum log_level level);
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* NULL restores the stderr sink. */
void log_set_sink(log_sink_fn fn, void *ud);

/* fmt is the key=value tail (may be NULL). The line is truncated at 4 KiB. */
void log_emit(enum log_level level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Writes s as a logfmt value into out: bare when safe, else "quoted" with
 * escapes; truncated to fit. Returns out. */
const char *log_quote(char *out, size_t outlen, const char *s);
/* log_quote of a URL with the password in its userinfo (scheme://user:PASSWORD@host)
 * replaced by "REDACTED": URLs carry credentials, logs are widely readable. */
const char *log_quote_url(char *out, size_t outlen, const char *url);

/* For a warning repeated by a flood (a cap refusing clients): true, and
 * *last_ms = now_ms, when nothing was logged yet (*last_ms 0) or the last
 * line is LOG_THROTTLE_MS old; the caller logs only then, with a count of
 * all so far. */
#define LOG_THROTTLE_MS 10000
bool log_throttle(int64_t *last_ms, int64_t now_ms);

/* Routes libevent's own messages (evdns: "All nameservers have failed")
 * through log_emit as event=libevent, instead of its bare "[msg] ..." lines
 * on stderr. Process-wide; call once at start. */
void log_route_libevent(void);

#define LOG_DEBUG(ev, ...) do { if (log_get_level() <= LOG_LEVEL_DEBUG) log_emit(LOG_LEVEL_DEBUG, ev, __VA_ARGS__); } while (0)
#define LOG_INFO(ev, ...) log_emit(LOG_LEVEL_INFO, ev, __VA_ARGS__)
#define LOG_WARN(ev, ...) log_emit(LOG_LEVEL_WARN, ev, __VA_ARGS__)
#define LOG_ERROR(ev, ...) log_emit(LOG_LEVEL_ERROR, ev, __VA_ARGS__)

#endif
