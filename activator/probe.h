/* probe: one readiness check, `GET <path>` on a fresh connection, answered
 * by the status line alone (the body is not read).
 *
 * The result is a status code (200..599) or a negative errno-style code
 * (-ECONNREFUSED, -ETIMEDOUT, -EPROTO for an unparsable answer, ...). The
 * callback is called exactly once, never from inside probe_start, and the
 * probe frees itself right after it returns: the owner drops its pointer in
 * the callback. probe_cancel frees it without calling back. */
#ifndef THAW_PROBE_H
#define THAW_PROBE_H

#include <sys/socket.h>

struct event_base;
struct probe;

typedef void (*probe_cb)(void *ud, int result);

/* host is the Host header value. Returns NULL on allocation/socket failure. */
struct probe *probe_start(struct event_base *base, const struct sockaddr *sa, socklen_t salen,
                          const char *host, const char *path, long timeout_ms, probe_cb cb,
                          void *ud);
/* Accepts NULL. */
void probe_cancel(struct probe *p);

#endif
