/* sim: a discrete-event replay of one trace through a model of an LLM
 * serving cluster under one autoscaler.
 *
 * Cluster: replicas take cold_start_s from creation to ready (a GPU is held
 * from creation). A ready replica runs iterations like vLLM with chunked
 * prefill: each step decodes one token for every sequence past its prompt
 * and prefills up to prefill_chunk prompt tokens (FIFO), and lasts
 * slots / decode_tps + prefill tokens / prefill_tps seconds; at most `slots`
 * sequences are admitted. So a full batch decodes decode_tps tokens/s,
 * prefill slows decoding, and "decode-equivalent tokens" (generated +
 * prompt x decode_tps / prefill_tps) measure a replica's capacity exactly.
 * Requests wait in one queue, the activators', and are admitted to the ready
 * replica with a free slot and the least prompt work pending: in arrival
 * order, except that with late_after_s > 0 a request that has waited longer
 * than that since it could first be sent goes behind the ones that have not,
 * and those on time go by when their clock started, for a request held
 * through a wake its arrival plus the wake's length (thaw's activator,
 * lateAfterSeconds; activator/holdq.h). TTFT is arrival to the end
 * of the step finishing its prompt. A replica removed while busy drains
 * (GPU still held) before it is gone.
 *
 * Autoscalers, each fed only what it would see in a cluster:
 * Token rate: the operator's query is assumed to weigh prompt tokens by
 * their cost relative to generated ones (prompt_weight), e.g.
 *   rate(vllm:generation_tokens_total[1m])
 *     + 0.05 * rate(vllm:prompt_tokens_total[1m])
 * so one targetTokensPerSecond fits prompt- and decode-heavy models; 0 gives
 * the scaler's default, generation tokens only.
 *
 *   SIM_THAW   thaw's policy_decide() (the same object code as thaw-scaler)
 *              with token rate from a simulated Prometheus rate() at scrape
 *              granularity, held and queued counts as the activators publish
 *              them (requests not yet sent to a replica: held while nothing is
 *              ready, else queued at maxConcurrencyPerEndpoint = slots), read
 *              every redis interval;
 *              through KEDA (external-push: wake at once; IsActive polled;
 *              cooldownPeriod) and the HPA (sync period, 10 % tolerance,
 *              scale-up rate limits, scale-down stabilization window).
 *   SIM_THAW_V1 the same with policy_params_v1() (metadata policy: v1).
 *   SIM_KEDA   KEDA Prometheus trigger on the same token rate, default HPA
 *              behaviour, woken at zero by the same activator push.
 *   SIM_KPA    Knative's KPA on concurrency (in flight incl. held): stable
 *              and panic windows, panic threshold, rate limits, grace period.
 *   SIM_ORACLE knows the future: per bin the replicas the arriving work needs
 *              at 100 % utilisation; each replica started exactly one cold
 *              start before it is needed and stopped when no longer needed
 *              (kept over gaps shorter than a cold start, which would cost
 *              more to restart). */
#ifndef THAW_REPLAY_SIM_H
#define THAW_REPLAY_SIM_H

#include <stdbool.h>
#include <stdio.h>

#include "policy.h"
#include "trace.h"

enum sim_kind { SIM_THAW = 0, SIM_KEDA, SIM_KPA, SIM_ORACLE, SIM_THAW_V1, SIM_KIND_COUNT };

const char *sim_kind_to_str(enum sim_kind k);
/* Returns the kind named s, or -1. */
int sim_kind_parse(const char *s);

struct sim_cluster {
    double cold_start_s; /* created -> ready */
    int slots;           /* batch capacity per replica */
    double decode_tps;   /* generated tokens/s per replica with every slot busy */
    double prefill_tps;  /* prompt tokens/s per replica (marginal step cost) */
    int prefill_chunk;   /* prompt tokens one step may prefill */
    int max_replicas;    /* maxReplicaCount */
};

struct sim_signals {
    double scrape_s;      /* Prometheus scrape interval */
    double rate_window_s; /* rate(...[window]) */
    double prom_query_s;  /* thaw-scaler's query interval */
    double redis_s;       /* thaw-scaler's queue/held read interval */
    double wake_hold_s;   /* a wake counts as one held request this long */
    double prompt_weight; /* the token-rate query counts generated + this x prompt tokens */
};

struct sim_keda {
    double polling_s;         /* pollingInterval */
    double cooldown_s;        /* cooldownPeriod */
    double hpa_sync_s;        /* HPA sync period */
    double hpa_tolerance;     /* 0.1 */
    double hpa_down_window_s; /* behavior.scaleDown.stabilizationWindowSeconds */
    double hpa_up_percent;    /* behavior.scaleUp: +this % per sync ... */
    double hpa_up_pods;       /* ... or +this many pods, whichever is more */
};

struct sim_kpa {
    double target;          /* concurrency per pod (target x utilisation) */
    double stable_s;        /* stable window */
    double panic_s;         /* panic window */
    double panic_threshold; /* desired panic pods / ready pods >= this: panic */
    double max_up_rate;     /* per tick */
    double max_down_rate;   /* per tick */
    double tick_s;          /* decision interval */
    double grace_s;         /* scale-to-zero grace period */
};

struct sim_config {
    enum sim_kind kind;
    struct sim_cluster cluster;
    struct sim_signals sig;
    struct sim_keda keda;        /* SIM_THAW and SIM_KEDA */
    struct policy_params thaw;   /* SIM_THAW */
    double keda_target_tps;      /* SIM_KEDA: tokens/s per replica (AverageValue) */
    struct sim_kpa kpa;          /* SIM_KPA */
    double slo_warm_s;           /* TTFT objective with a ready replica */
    double oracle_bin_s;         /* SIM_ORACLE demand granularity */
    bool warm_start;             /* start with the oracle's t = 0 replicas ready */
    double late_after_s;         /* > 0: requests waiting longer go behind those on time
                                  * (thaw: 1 s, the example activator config) */
    bool check_order;            /* check every admission against a scan of the
                                  * waiting requests (slow; the smoke test) */
    FILE *timeline;              /* NULL, or every 10 s a CSV line of the cluster state */
    FILE *requests_out;          /* NULL, or one CSV line per request (arrival, TTFT, met) */
};

/* Fills c with the documented defaults for kind (see docs/scaling-policy.md). */
void sim_config_defaults(struct sim_config *c, enum sim_kind kind);

struct sim_result {
    size_t requests;
    size_t served;
    double tokens;         /* prompt + generated, all requests */
    double gpu_s;          /* replica-seconds from creation to removal */
    double ready_s;        /* replica-seconds while ready (incl. draining) */
    double work_s;         /* replica-seconds of work at full batch (tokens / capacity) */
    double gpu_s_per_mtok; /* gpu_s per million tokens */
    double slo;            /* share of requests with TTFT within objective */
    double slo_warm;       /* same, only requests that arrived with a ready replica */
    double ttft_p50, ttft_p99, ttft_max;
    long wakes;            /* scale-ups from zero replicas */
    long replica_starts;   /* replicas created (each a cold start) */
    long peak_replicas;
    double utilisation;    /* work_s / gpu_s: busy share of the GPU time paid for */
    double end_s;          /* last completion; accounting stops here */
    long violations;       /* simulator invariant failures (0 expected) */
    char violation[240];   /* the first one */
};

/* Replays tr under cfg. Returns 0, or -1 with err set (out of memory, bad
 * configuration). Invariant failures are counted in res, not errors. */
int sim_run(const struct trace *tr, const struct sim_config *cfg, struct sim_result *res,
            char *err, size_t errlen);

#endif
