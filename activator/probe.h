/* probe: one readiness check, `GET <path>` on a fresh connection, answered
 * by the status line alone (the body is not read). Interim 1xx responses
 * (100, 103, ...) are skipped; the final one decides.
 *
 * The whole probe (connect, interim responses, final head) has timeout_ms,
 * however slowly the bytes arrive: past it the result is -ETIMEDOUT.
 *
 * The result is a status code (101, or 200..599) or a negative errno-style
 * code (-ECONNREFUSED, -ETIMEDOUT, -EPROTO for an unparsable answer, a status
 * outside 100..599, or heads over PROBE_HEAD_MAX bytes, ...). The
 * callback is called exactly once, never from inside probe_start, and the
 * probe is already freed when it runs: the owner drops its pointer in the
 * callback. probe_cancel frees it without calling back. */
#ifndef THAW_PROBE_H
#define THAW_PROBE_H

#include <sys/socket.h>

struct event_base;
struct probe;

/* Bytes of response heads read at most, interim 1xx heads included. */
#define PROBE_HEAD_MAX 16384

typedef void (*probe_cb)(void *ud, int result);

/* host is the Host header value. Returns NULL on allocation/socket failure. */
struct probe *probe_start(struct event_base *base, const struct sockaddr *sa, socklen_t salen,
                          const char *host, const char *path, long timeout_ms, probe_cb cb,
                          void *ud);
/* Accepts NULL. */
void probe_cancel(struct probe *p);
/* Static description of a result, for logs; never NULL. */
const char *probe_strerror(int result);

#endif
