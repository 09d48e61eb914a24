/* scaler_wake: wake signals sent straight to thaw-scaler over HTTP, so a
 * model at zero can be woken while Redis is down.
 *
 *   POST /wake?model=<model>&instance=<id>&held=<n> HTTP/1.1
 *       to every address the URL's host resolves to (a headless Service: every
 *       scaler replica, since KEDA's stream may be on any of them). held is
 *       how many requests this activator has waiting for the model; the
 *       scaler adds the counts of different instances while Redis, which
 *       normally carries them, is down.
 *
 * Each send resolves the host again (wakes are rare), connects to each
 * address, writes the request, reads the status line and closes. Nothing is
 * retried here: the caller sends again while the model still waits. At most
 * SCALER_WAKE_MAX_INFLIGHT posts and as many resolutions are under way; a
 * send beyond that is dropped and counted. Everything is on the caller's
 * event loop; freeing cancels what is under way. */
#ifndef THAW_SCALER_WAKE_H
#define THAW_SCALER_WAKE_H

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct evdns_base;
struct scaler_wake;

#define SCALER_WAKE_MAX_INFLIGHT 256

struct scaler_wake_stats {
    uint64_t sent;     /* posts answered 2xx */
    uint64_t failed;   /* posts refused, timed out or answered otherwise */
    uint64_t dropped;  /* sends over the in-flight bound */
    uint64_t unresolved; /* sends whose host did not resolve */
};

/* url: http://HOST:PORT (no path). dns is used when HOST is a name (it must
 * then be non-NULL). timeout_ms bounds each post (connect to status line).
 * Returns NULL with err filled on a bad URL or allocation failure. */
struct scaler_wake *scaler_wake_new(struct event_base *base, struct evdns_base *dns,
                                    const char *url, const char *instance, long timeout_ms,
                                    char *err, size_t errlen);
/* Drops the posts under way and cancels the lookups. A cancelled lookup is
 * finished (and its memory freed) by libevent on a later loop turn, so call
 * this while the loop still runs (the activator does when its drain ends).
 * Accepts NULL. */
void scaler_wake_cancel(struct scaler_wake *sw);
/* scaler_wake_cancel, then frees sw. Accepts NULL. */
void scaler_wake_free(struct scaler_wake *sw);

/* True when the URL's host is a name (the caller must supply a DNS base). */
int scaler_wake_url_needs_dns(const char *url);

/* Posts a wake for model, with held requests waiting here, to every scaler
 * address. Returns 0 if under way, -1 if dropped (bound reached or out of
 * memory). */
int scaler_wake_send(struct scaler_wake *sw, const char *model, size_t held);

void scaler_wake_get_stats(const struct scaler_wake *sw, struct scaler_wake_stats *out);

#endif
