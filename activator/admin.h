/* admin: the activator's admin HTTP port (libevent evhttp).
 *
 *   GET  /metrics              Prometheus text exposition
 *   GET  /healthz              200 while the process runs
 *   GET  /readyz               200 while accepting traffic, 503 when draining
 *   GET  /models               JSON state of every model
 *   POST /models/<name>/wake   wake a model ahead of traffic (202, 404)
 */
#ifndef THAW_ADMIN_H
#define THAW_ADMIN_H

#include <stddef.h>

struct event_base;
struct proxy;
struct admin;

/* host must be an IP literal; port 0 picks one. At most max_connections
 * are held open; one more closes the connection idle longest, or with none
 * idle is answered 503 and closed (common/http_conn_cap).
 * Returns NULL with err. */
struct admin *admin_new(struct event_base *base, struct proxy *px, const char *host, int port,
                        int max_connections, char *err, size_t errlen);
/* Accepts NULL. */
void admin_free(struct admin *a);
int admin_port(const struct admin *a);

#endif
