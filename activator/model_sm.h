/* model_sm: the per-model lifecycle, an explicit state machine. Pure: no I/O,
 * time and the held count passed in; it returns what to do as action bits
 * and the I/O layer does it.
 *
 *   cold     nothing known to serve the model (scaled to zero, or never seen)
 *   waking   wake signal sent, readiness probed; requests are held
 *   ready    a backend answered its health check; requests are forwarded
 *   draining the activator is shutting down (or the model left the config):
 *            new requests are refused, held and in-flight ones finish
 *
 *   cold    --request/retry/wake-->  waking   (hold, wake signal, start probes)
 *   cold    --probe_ok-->            ready
 *   waking  --probe_ok-->            ready    (release held requests)
 *   waking  --tick, nothing held for wake_timeout-->  cold (stop probes)
 *   ready   --backend_down-->        waking   (the scale-down race: hold, re-wake)
 *   ready   --endpoints_gone-->      cold     (scaled to zero: no wake signal)
 *   ready   --endpoints_replaced-->  waking   (a rolling update seen at once: probe
 *                                              the new ones, no wake signal)
 *   any     --drain-->               draining
 *
 * Each transition logs one line (event model_state) and bumps a counter. */
#ifndef THAW_MODEL_SM_H
#define THAW_MODEL_SM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum model_state { MODEL_COLD, MODEL_WAKING, MODEL_READY, MODEL_DRAINING };
#define MODEL_STATE_COUNT 4

enum model_event {
    MEV_REQUEST,      /* a new request arrived */
    MEV_RETRY,        /* an accepted request needs a backend again (race, release) */
    MEV_WAKE,         /* wake ahead of traffic (admin, wakeWith) */
    MEV_PROBE_OK,     /* an endpoint answered its health check */
    MEV_BACKEND_DOWN, /* no healthy endpoint left (refused/reset before sending) */
    MEV_ENDPOINTS_GONE, /* the endpoint list lost its last healthy endpoint (scaled down) */
    MEV_TICK,         /* periodic housekeeping */
    MEV_DRAIN,        /* shutdown or removal from the config */
    /* the healthy endpoints all left the list, others (not probed yet) came */
    MEV_ENDPOINTS_REPLACED,
};
#define MODEL_EVENT_COUNT 9

enum model_action {
    MACT_FORWARD = 1 << 0,     /* send the request to a backend now */
    MACT_HOLD = 1 << 1,        /* queue the request */
    MACT_REJECT = 1 << 2,      /* answer the request 503 */
    MACT_WAKE_SIGNAL = 1 << 3, /* publish the wake signal (and wake wakeWith models) */
    MACT_PROBE_START = 1 << 4, /* (re)start readiness probes at the initial interval */
    MACT_PROBE_STOP = 1 << 5,
    MACT_RELEASE = 1 << 6,     /* dispatch held requests up to capacity */
};

struct model_sm {
    const char *name; /* for log lines; not owned */
    enum model_state state;
    int64_t since_ms;       /* when the current state was entered */
    int64_t forwardable_since_ms; /* since when requests can be forwarded: entering
                                   * ready, or a backend coming up while draining
                                   * (kept from ready into draining); the hold
                                   * queue's lateness clock for held requests */
    int64_t unforwardable_since_ms; /* when requests last stopped being forwardable
                                     * (model_sm_forwardable turned false; init:
                                     * cold): the start of the last wake or outage */
    int64_t wake_timeout_ms;
    bool backend_up;        /* draining: whether requests can be forwarded */
    uint64_t transitions[MODEL_STATE_COUNT][MODEL_STATE_COUNT];
    uint64_t cold_starts;   /* waking -> ready */
    bool replacing; /* waking since endpoints_replaced: its end is no cold start */
};

void model_sm_init(struct model_sm *sm, const char *name, int64_t wake_timeout_ms, int64_t now_ms);

/* Whether requests can be forwarded now: ready, or draining with a backend up. */
bool model_sm_forwardable(const struct model_sm *sm);

/* Applies ev at now_ms; held is the number of requests currently held.
 * Returns a set of enum model_action bits. */
unsigned model_sm_handle(struct model_sm *sm, enum model_event ev, int64_t now_ms, size_t held);

const char *model_state_to_str(enum model_state s);
const char *model_event_to_str(enum model_event e);

#endif
