/* service: the KEDA externalscaler.ExternalScaler and grpc.health.v1.Health
 * handlers, on top of grpc_server and state.
 *
 * Every RPC is answered from memory: metadata parsed, the target found or
 * created, its last decision returned. StreamIsActive calls stay open and get
 * a message whenever the target's active state changes, and `true` at once
 * on a wake message for their model. */
#ifndef THAW_SERVICE_H
#define THAW_SERVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "policy.h"

struct evbuffer;
struct grpc_method;
struct scaler_service;
struct scaler_state;
struct target;

struct scaler_service *scaler_service_new(void);
/* Ends nothing by itself: shut the grpc_server down first. Accepts NULL. */
void scaler_service_free(struct scaler_service *svc);

/* The state is created after the service (it needs scaler_service_on_change). */
void scaler_service_attach(struct scaler_service *svc, struct scaler_state *st);

/* Method table for grpc_server_new; valid while the service lives. */
const struct grpc_method *scaler_service_methods(struct scaler_service *svc, size_t *n);

/* state_change_fn for scaler_state_new (ud = the service): pushes a changed
 * activity to the target's streams, and answers `true` at once to IsActive
 * calls waiting for a first reading when the target turns active. */
void scaler_service_on_change(void *ud, struct target *t, const struct policy_decision *old,
                              const struct policy_decision *now);

/* state_target_fn for scaler_state_set_target_hooks' on_fresh (ud = the
 * service): answers the IsActive and GetMetrics calls that waited for the
 * target's first reading. */
void scaler_service_on_fresh(void *ud, struct target *t);
/* Answers every call still waiting for a first reading UNAVAILABLE with
 * `why` (on shutdown: never end a call without an answer). */
void scaler_service_fail_pending(struct scaler_service *svc, const char *why);
/* Answers UNAVAILABLE to calls that waited too long for a first reading
 * (call about once a second). */
void scaler_service_tick(struct scaler_service *svc, int64_t now_ms);

/* A wake for model (a Redis message: instance NULL, held 1; or POST /wake,
 * which may say the activator and its held count; scaler_state_wake):
 * pushes true on its open streams. Returns how many ScaledObjects name the
 * model. */
size_t scaler_service_wake(struct scaler_service *svc, const char *model, const char *instance,
                           double held);

/* Operator limits on what tenants' ScaledObjects may ask for: redisKey must
 * start with redis_key_prefix ("" = any); namespaces is a comma-separated
 * allow-list ("" = all namespaces). Both are copied. Returns 0 or -1 (OOM). */
int scaler_service_set_tenancy(struct scaler_service *svc, const char *redis_key_prefix,
                               const char *namespaces);

/* A wake re-sends `true` on a stream that already said it at most once per
 * repeat_ms (0: every wake); changes of activation are always sent.
 * Default 1000. */
void scaler_service_set_wake_repeat(struct scaler_service *svc, int64_t repeat_ms);

/* Health answers NOT_SERVING once this is false (during shutdown). */
void scaler_service_set_serving(struct scaler_service *svc, bool serving);
size_t scaler_service_stream_count(const struct scaler_service *svc);

void scaler_service_write_metrics(const struct scaler_service *svc, struct evbuffer *out);

#endif
