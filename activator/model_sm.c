#include "model_sm.h"

#include <stddef.h>

#include "log.h"

const char *model_state_to_str(enum model_state s)
{
    switch (s) {
    case MODEL_COLD:
        return "cold";
    case MODEL_WAKING:
        return "waking";
    case MODEL_READY:
        return "ready";
    case MODEL_DRAINING:
        return "draining";
    }
    return "unknown";
}

const char *model_event_to_str(enum model_event e)
{
    switch (e) {
    case MEV_REQUEST:
        return "request";
    case MEV_RETRY:
        return "retry";
    case MEV_WAKE:
        return "wake";
    case MEV_PROBE_OK:
        return "probe_ok";
    case MEV_BACKEND_DOWN:
        return "backend_down";
    case MEV_ENDPOINTS_GONE:
        return "endpoints_gone";
    case MEV_TICK:
        return "tick";
    case MEV_DRAIN:
        return "drain";
    case MEV_ENDPOINTS_REPLACED:
        return "endpoints_replaced";
    }
    return "unknown";
}

void model_sm_init(struct model_sm *sm, const char *name, int64_t wake_timeout_ms, int64_t now_ms)
{
    *sm = (struct model_sm){0};
    sm->name = name;
    sm->state = MODEL_COLD;
    sm->since_ms = now_ms;
    sm->forwardable_since_ms = now_ms;
    sm->unforwardable_since_ms = now_ms;
    sm->wake_timeout_ms = wake_timeout_ms;
}

static void transition(struct model_sm *sm, enum model_state to, enum model_event ev,
                       int64_t now_ms)
{
    enum model_state from = sm->state;
    sm->transitions[from][to]++;
    if (from == MODEL_WAKING && to == MODEL_READY && !sm->replacing)
        sm->cold_starts++;
    sm->replacing = to == MODEL_WAKING && ev == MEV_ENDPOINTS_REPLACED;
    LOG_INFO("model_state", "model=%s from=%s to=%s event=%s after_ms=%lld", sm->name,
             model_state_to_str(from), model_state_to_str(to), model_event_to_str(ev),
             (long long)(now_ms - sm->since_ms));
    sm->state = to;
    sm->since_ms = now_ms;
    if (to == MODEL_READY)
        sm->forwardable_since_ms = now_ms;
}

static unsigned on_cold(struct model_sm *sm, enum model_event ev, int64_t now_ms, size_t held)
{
    switch (ev) {
    case MEV_REQUEST:
    case MEV_RETRY:
        transition(sm, MODEL_WAKING, ev, now_ms);
        return MACT_HOLD | MACT_WAKE_SIGNAL | MACT_PROBE_START;
    case MEV_WAKE:
        transition(sm, MODEL_WAKING, ev, now_ms);
        return MACT_WAKE_SIGNAL | MACT_PROBE_START;
    case MEV_PROBE_OK:
        /* A probe that was in flight when the model went cold: believe it. */
        transition(sm, MODEL_READY, ev, now_ms);
        return MACT_RELEASE;
    case MEV_DRAIN:
        sm->backend_up = false;
        transition(sm, MODEL_DRAINING, ev, now_ms);
        return held ? MACT_PROBE_START : 0;
    case MEV_BACKEND_DOWN:
    case MEV_ENDPOINTS_GONE:
    case MEV_ENDPOINTS_REPLACED:
    case MEV_TICK:
        return 0;
    }
    return 0;
}

static unsigned on_waking(struct model_sm *sm, enum model_event ev, int64_t now_ms, size_t held)
{
    switch (ev) {
    case MEV_REQUEST:
    case MEV_RETRY:
        return MACT_HOLD;
    case MEV_PROBE_OK:
        transition(sm, MODEL_READY, ev, now_ms);
        return MACT_RELEASE;
    case MEV_TICK:
        /* Woken for nothing (or everything held expired): stop probing a
         * backend that may never come. */
        if (held == 0 && now_ms - sm->since_ms >= sm->wake_timeout_ms) {
            transition(sm, MODEL_COLD, ev, now_ms);
            return MACT_PROBE_STOP;
        }
        return 0;
    case MEV_DRAIN:
        sm->backend_up = false;
        transition(sm, MODEL_DRAINING, ev, now_ms);
        return 0; /* probes go on for what is held */
    case MEV_WAKE:
    case MEV_BACKEND_DOWN:
    case MEV_ENDPOINTS_GONE:
    case MEV_ENDPOINTS_REPLACED:
        return 0;
    }
    return 0;
}

static unsigned on_ready(struct model_sm *sm, enum model_event ev, int64_t now_ms, size_t held)
{
    switch (ev) {
    case MEV_REQUEST:
    case MEV_RETRY:
        return MACT_FORWARD;
    case MEV_PROBE_OK:
        return MACT_RELEASE; /* one more endpoint: more capacity */
    case MEV_BACKEND_DOWN:
        /* Scaled down under us: hold, wake it again, probe until it is back. */
        transition(sm, MODEL_WAKING, ev, now_ms);
        return MACT_WAKE_SIGNAL | MACT_PROBE_START;
    case MEV_ENDPOINTS_REPLACED:
        /* Replicas replaced (a rolling update): not scaled down, so no wake
         * and no cold start; hold until a new one answers. With requests
         * already waiting for capacity, as for endpoints_gone: wake. */
        if (held == 0) {
            transition(sm, MODEL_WAKING, ev, now_ms);
            return MACT_PROBE_START;
        }
        ev = MEV_ENDPOINTS_GONE;
        /* fall through */
    case MEV_ENDPOINTS_GONE:
        /* Scaled to zero on purpose: waking it again would undo that. The
         * next request (or one already waiting for capacity) wakes it. */
        if (held > 0) {
            transition(sm, MODEL_WAKING, ev, now_ms);
            return MACT_WAKE_SIGNAL | MACT_PROBE_START;
        }
        transition(sm, MODEL_COLD, ev, now_ms);
        return MACT_PROBE_STOP;
    case MEV_DRAIN:
        sm->backend_up = true;
        transition(sm, MODEL_DRAINING, ev, now_ms);
        return 0;
    case MEV_WAKE:
    case MEV_TICK:
        (void)held;
        return 0;
    }
    return 0;
}

static unsigned on_draining(struct model_sm *sm, enum model_event ev, int64_t now_ms, size_t held)
{
    switch (ev) {
    case MEV_REQUEST:
        return MACT_REJECT;
    case MEV_RETRY:
        return sm->backend_up ? MACT_FORWARD : MACT_HOLD;
    case MEV_PROBE_OK:
        if (!sm->backend_up)
            sm->forwardable_since_ms = now_ms;
        sm->backend_up = true;
        return MACT_RELEASE;
    case MEV_BACKEND_DOWN:
    case MEV_ENDPOINTS_REPLACED:
        sm->backend_up = false;
        return MACT_PROBE_START;
    case MEV_ENDPOINTS_GONE:
        sm->backend_up = false;
        return 0;
    case MEV_WAKE:
    case MEV_TICK:
    case MEV_DRAIN:
        (void)held;
        return 0;
    }
    return 0;
}

bool model_sm_forwardable(const struct model_sm *sm)
{
    return sm->state == MODEL_READY || (sm->state == MODEL_DRAINING && sm->backend_up);
}

unsigned model_sm_handle(struct model_sm *sm, enum model_event ev, int64_t now_ms, size_t held)
{
    bool was = model_sm_forwardable(sm);
    unsigned act = 0;
    switch (sm->state) {
    case MODEL_COLD:
        act = on_cold(sm, ev, now_ms, held);
        break;
    case MODEL_WAKING:
        act = on_waking(sm, ev, now_ms, held);
        break;
    case MODEL_READY:
        act = on_ready(sm, ev, now_ms, held);
        break;
    case MODEL_DRAINING:
        act = on_draining(sm, ev, now_ms, held);
        break;
    }
    if (was && !model_sm_forwardable(sm))
        sm->unforwardable_since_ms = now_ms;
    return act;
}
