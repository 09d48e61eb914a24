/* thaw-replay: replays LLM request traces through a simulated cluster under
 * thaw's policy, KEDA + HPA, Knative's KPA and an oracle, and prints the
 * comparison (markdown table on stdout, JSON to a file).
 *
 * `--smoke` runs a short matrix and checks the simulator's invariants
 * (every request served, capacity never exceeded, the oracle at or below
 * every autoscaler in GPU-seconds); exit status 1 when one fails. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "alloc.h"
#include "log.h"
#include "options.h"
#include "sim.h"
#include "trace.h"

struct settings {
    char *trace_dir;
    char *traces;
    char *cold_starts;
    char *policies;
    char *json;
    char *timeline;
    long seed;
    double max_seconds;
    long smoke;
    long warm_start;
    double prompt_weight;
    double oracle_bin;
    char *thaw;
    char *requests;
    double baselines_late_after;
    double jitter;
};

#define S(f) offsetof(struct settings, f)
static const struct opt_def option_defs[] = {
    {"trace-dir", OPT_STRING, S(trace_dir), "../shared/traces", 0, 0,
     "directory holding AzureLLMInferenceTrace_{code,conv}.csv and "
     "servegen_aggregate_rate_10min.csv", NULL},
    {"traces", OPT_STRING, S(traces), "azure-code,azure-conv,step,ramp,diurnal,onoff,idle", 0, 0,
     "comma-separated: azure-code, azure-conv, a CSV path, servegen:<model>:<start hour> "
     "(4 h of a ServeGen rate envelope from the trace dir), or a synthetic shape "
     "(step, ramp, diurnal, onoff, idle)", NULL},
    {"cold-starts", OPT_STRING, S(cold_starts), "30,120", 0, 0,
     "comma-separated replica cold-start times in seconds", NULL},
    {"policies", OPT_STRING, S(policies), "thaw,keda-hpa,knative-kpa,oracle", 0, 0,
     "comma-separated autoscalers", NULL},
    {"json", OPT_STRING, S(json), NULL, 0, 0, "write the results as JSON to this file", NULL},
    {"timeline", OPT_STRING, S(timeline), NULL, 0, 0,
     "write every run's cluster state every 10 s as CSV to this file", NULL},
    {"seed", OPT_INT, S(seed), "1", 0, 2147483647, "seed of the synthetic shapes", NULL},
    {"max-seconds", OPT_DOUBLE, S(max_seconds), "0", 0, 1e9,
     "cut Azure traces after this many seconds (0: whole trace)", NULL},
    {"warm-start", OPT_INT, S(warm_start), "1", 0, 1,
     "1: every autoscaler starts with the replicas the oracle has at t = 0, ready; "
     "0: all start at zero", NULL},
    {"prompt-weight", OPT_DOUBLE, S(prompt_weight), "-1", -1, 1000,
     "token-rate query = generated + this x prompt tokens (-1: decode/prefill cost ratio, "
     "0: generated only, the scaler's default query)", NULL},
    {"oracle-bin", OPT_DOUBLE, S(oracle_bin), "5", 1, 3600,
     "seconds over which the oracle averages the work it provisions for", NULL},
    {"thaw", OPT_STRING, S(thaw), NULL, 0, 0,
     "override thaw policy knobs, e.g. target_utilisation=0.9,scale_down_window_s=120 "
     "(also keda_polling_s, keda_cooldown_s, hpa_sync_s, hpa_up_percent, hpa_up_pods for "
     "thaw's ScaledObject and HPA)", NULL},
    {"baselines-late-after", OPT_DOUBLE, S(baselines_late_after), "0", 0, 3600,
     "> 0: KEDA's and Knative's requests also wait in activators that send a request "
     "waiting longer than this many seconds behind newer ones (thaw's lateAfterSeconds; "
     "0: FIFO, as those systems do)", NULL},
    {"requests", OPT_STRING, S(requests), NULL, 0, 0,
     "write every request's arrival, TTFT, cold flag and SLO result as CSV to this file",
     NULL},
    {"jitter", OPT_DOUBLE, S(jitter), "0", 0, 60,
     "> 0: move every arrival of a CSV trace (the Azure ones) by a uniform random amount "
     "within this many seconds either way, seeded by --seed: how much a verdict rests on "
     "the exact timing", NULL},
    {"smoke", OPT_INT, S(smoke), "0", 0, 1,
     "1: short run checking the simulator's invariants (exit 1 on failure)", NULL},
};
#undef S
#define NOPTIONS (sizeof(option_defs) / sizeof(option_defs[0]))

#define MAX_ITEMS 32

struct run {
    char trace[64];
    double cold;
    enum sim_kind kind;
    struct sim_result r;
};

static size_t split(char *s, char **out, size_t max)
{
    size_t n = 0;
    for (char *tok = strtok(s, ","); tok && n < max; tok = strtok(NULL, ","))
        if (*tok)
            out[n++] = tok;
    return n;
}

/* servegen:<model>:<start hour>: 4 hours of that model's envelope at 4 req/s
 * on average (the synthetic shapes' range), client CVs capped at 4 (the
 * file's 90th percentile is 3-6, m-mid's 31). */
static int load_servegen(const struct settings *cfg, const char *name, double max_seconds,
                         struct trace *tr, char *err, size_t errlen)
{
    const char *model = name + 9, *colon = strrchr(model, ':');
    char *end;
    errno = 0;
    double hour = colon ? strtod(colon + 1, &end) : -1;
    if (!colon || colon == model || errno || *end || !(hour >= 0)) {
        snprintf(err, errlen, "'%s': expected servegen:<model>:<start hour>", name);
        return -1;
    }
    char mname[256], path[1024];
    snprintf(mname, sizeof(mname), "%.*s", (int)(colon - model), model);
    snprintf(path, sizeof(path), "%s/servegen_aggregate_rate_10min.csv", cfg->trace_dir);
    return trace_servegen(path, mname, hour * 3600, max_seconds > 0 ? max_seconds : 4 * 3600, 4,
                          4, (uint64_t)cfg->seed, tr, err, errlen);
}

static int load_trace(const struct settings *cfg, const char *name, double max_seconds,
                      struct trace *tr, char *err, size_t errlen)
{
    if (strncmp(name, "servegen:", 9) == 0)
        return load_servegen(cfg, name, max_seconds, tr, err, errlen);
    char path[1024];
    const char *csv = NULL;
    bool named = strcmp(name, "azure-code") == 0 || strcmp(name, "azure-conv") == 0;
    if (named) {
        snprintf(path, sizeof(path), "%s/AzureLLMInferenceTrace_%s.csv", cfg->trace_dir,
                 name + 6);
        csv = path;
    } else if (strchr(name, '/') || strstr(name, ".csv")) {
        csv = name;
    }
    if (!csv)
        return trace_synth(name, (uint64_t)cfg->seed, cfg->smoke ? 1200 : 0, 1, tr, err, errlen);
    if (trace_load_azure(csv, max_seconds, tr, err, errlen) != 0)
        return -1;
    if (named)
        snprintf(tr->name, sizeof(tr->name), "%s", name);
    return trace_jitter(tr, cfg->jitter, (uint64_t)cfg->seed);
}

/* Applies "name=value,..." to thaw's parameters. Returns 0 or -1 (err set). */
static int apply_thaw_overrides(const char *spec, struct sim_config *sc, char *err,
                                size_t errlen)
{
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", spec);
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        char *end;
        if (!eq) {
            snprintf(err, errlen, "--thaw: expected name=value, got '%s'", kv);
            return -1;
        }
        *eq = '\0';
        double v = strtod(eq + 1, &end);
        if (*end || end == eq + 1) {
            snprintf(err, errlen, "--thaw: bad number for %s", kv);
            return -1;
        }
        struct policy_params *p = &sc->thaw;
        if (strcmp(kv, "target_utilisation") == 0)
            p->target_utilisation = v;
        else if (strcmp(kv, "target_tokens_per_second") == 0)
            p->target_tokens_per_second = v;
        else if (strcmp(kv, "target_queue_length") == 0)
            p->target_queue_length = v;
        else if (strcmp(kv, "scale_down_window_s") == 0)
            p->scale_down_window_ms = (int64_t)(v * 1000);
        else if (strcmp(kv, "trend_window_s") == 0)
            p->trend_window_ms = (int64_t)(v * 1000);
        else if (strcmp(kv, "rate_window_s") == 0)
            p->rate_window_ms = (int64_t)(v * 1000);
        else if (strcmp(kv, "queue_window_s") == 0)
            p->queue_window_ms = (int64_t)(v * 1000);
        else if (strcmp(kv, "keep_warm_cost") == 0)
            p->keep_warm_cost = v;
        else if (strcmp(kv, "keep_warm_max_s") == 0)
            p->keep_warm_max_ms = (int64_t)(v * 1000);
        else if (strcmp(kv, "tokens_per_request") == 0)
            p->tokens_per_request = v;
        else if (strcmp(kv, "wake_backlog_share") == 0)
            p->wake_backlog_share = v;
        else if (strcmp(kv, "drain_time_factor") == 0)
            p->drain_time_factor = v;
        else if (strcmp(kv, "surge_hold_s") == 0)
            p->surge_hold_ms = (int64_t)(v * 1000);
        else if (strcmp(kv, "panic_window_s") == 0)
            p->panic_window_ms = (int64_t)(v * 1000);
        else if (strcmp(kv, "panic_lookahead") == 0)
            p->panic_lookahead = v;
        else if (strcmp(kv, "replica_slots") == 0)
            p->replica_slots = v;
        else if (strcmp(kv, "staffing_beta") == 0)
            p->staffing_beta = v;
        else if (strcmp(kv, "wake_request_cost") == 0)
            p->wake_request_cost = v;
        else if (strcmp(kv, "idle_by_activators") == 0)
            p->idle_by_activators = v != 0;
        else if (strcmp(kv, "burst_cv") == 0)
            p->burst_cv = v;
        else if (strcmp(kv, "bursty_scale_down_window_s") == 0)
            p->bursty_scale_down_window_ms = (int64_t)(v * 1000);
        else if (strcmp(kv, "bursty_utilisation") == 0)
            p->bursty_utilisation = v;
        else if (strcmp(kv, "cold_start_s") == 0)
            p->cold_start_ms = (int64_t)(v * 1000);
        else if (strcmp(kv, "keda_polling_s") == 0)
            sc->keda.polling_s = v;
        else if (strcmp(kv, "keda_cooldown_s") == 0)
            sc->keda.cooldown_s = v;
        else if (strcmp(kv, "hpa_sync_s") == 0)
            sc->keda.hpa_sync_s = v;
        else if (strcmp(kv, "hpa_up_percent") == 0)
            sc->keda.hpa_up_percent = v;
        else if (strcmp(kv, "hpa_up_pods") == 0)
            sc->keda.hpa_up_pods = v;
        else if (strcmp(kv, "late_after_s") == 0) {
            /* The activators' lateAfterSeconds, as they publish it to the policy. */
            if (sc->kind == SIM_THAW || sc->kind == SIM_THAW_V1)
                sc->late_after_s = v;
            p->late_after_ms = (int64_t)(v * 1000);
        } else if (strcmp(kv, "late_clear_s") == 0)
            p->late_clear_ms = (int64_t)(v * 1000);
        else if (strcmp(kv, "keda_target_tps") == 0)
            sc->keda_target_tps = v;
        else {
            snprintf(err, errlen, "--thaw: unknown knob '%s'", kv);
            return -1;
        }
    }
    return 0;
}

static const struct run *find(const struct run *runs, size_t n, const char *trace, double cold,
                              enum sim_kind k)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(runs[i].trace, trace) == 0 && runs[i].cold == cold && runs[i].kind == k)
            return &runs[i];
    return NULL;
}

/* Whether thaw's run t dominates baseline b (at least its SLO attainment with
 * fewer GPU-seconds), and by how much: the difference in requests served
 * within their objective and in GPU-seconds, so that a cell decided by one
 * request reads as such. */
static const char *verdict(const struct run *t, const struct run *b, char *buf, size_t len)
{
    if (!t || !b)
        return "-";
    bool slo = t->r.slo >= b->r.slo - 1e-12;
    bool cheaper = t->r.gpu_s < b->r.gpu_s;
    const char *v = slo && cheaper ? "yes"
                    : slo          ? "no (GPU-s)"
                    : cheaper      ? "no (SLO)"
                                   : "no (both)";
    long long met_t = llround(t->r.slo * (double)t->r.requests);
    long long met_b = llround(b->r.slo * (double)b->r.requests);
    if (!(b->r.gpu_s > 0)) {
        snprintf(buf, len, "%s", v);
        return buf;
    }
    snprintf(buf, len, "%s: %+lld req, %+.1f %% GPU-s", v, met_t - met_b,
             100 * (t->r.gpu_s / b->r.gpu_s - 1));
    return buf;
}

static void print_table(const struct run *runs, size_t n, FILE *out)
{
    fprintf(out, "| trace | cold start | autoscaler | GPU-s / M tok | SLO %% | warm SLO %% | "
                 "p99 TTFT s | wakes | replica starts | util %% | GPU-s | x oracle |\n");
    fprintf(out, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < n; i++) {
        const struct run *r = &runs[i];
        const struct run *o = find(runs, n, r->trace, r->cold, SIM_ORACLE);
        char ratio[32] = "-";
        if (o && o->r.gpu_s > 0)
            snprintf(ratio, sizeof(ratio), "%.2f", r->r.gpu_s / o->r.gpu_s);
        fprintf(out,
                "| %s | %.0f s | %s | %.1f | %.2f | %.2f | %.2f | %ld | %ld | %.1f | %.0f | %s |\n",
                r->trace, r->cold, sim_kind_to_str(r->kind), r->r.gpu_s_per_mtok,
                100 * r->r.slo, 100 * r->r.slo_warm, r->r.ttft_p99, r->r.wakes,
                r->r.replica_starts, 100 * r->r.utilisation, r->r.gpu_s, ratio);
    }
    fprintf(out, "\n| trace | cold start | thaw beats keda-hpa (requests in time, GPU-s) | "
                 "thaw beats knative-kpa (requests in time, GPU-s) | thaw / oracle GPU-s "
                 "|\n|---|---:|---|---|---:|\n");
    char vk[96], vn[96];
    for (size_t i = 0; i < n; i++) {
        const struct run *t = &runs[i];
        if (t->kind != SIM_THAW)
            continue;
        const struct run *o = find(runs, n, t->trace, t->cold, SIM_ORACLE);
        char ratio[32] = "-";
        if (o && o->r.gpu_s > 0)
            snprintf(ratio, sizeof(ratio), "%.2f", t->r.gpu_s / o->r.gpu_s);
        fprintf(out, "| %s | %.0f s | %s | %s | %s |\n", t->trace, t->cold,
                verdict(t, find(runs, n, t->trace, t->cold, SIM_KEDA), vk, sizeof(vk)),
                verdict(t, find(runs, n, t->trace, t->cold, SIM_KPA), vn, sizeof(vn)), ratio);
    }
}

static int write_json(const struct run *runs, size_t n, const struct sim_config *base,
                      const char *path)
{
    json_t *arr = json_array();
    if (!arr)
        return -1;
    for (size_t i = 0; i < n; i++) {
        const struct sim_result *r = &runs[i].r;
        json_t *o = json_pack(
            "{s:s, s:f, s:s, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, "
            "s:I, s:I, s:I, s:f, s:f}",
            "trace", runs[i].trace, "cold_start_s", runs[i].cold, "autoscaler",
            sim_kind_to_str(runs[i].kind), "requests", (json_int_t)r->requests, "served",
            (json_int_t)r->served, "tokens", r->tokens, "gpu_s", r->gpu_s, "gpu_s_per_mtok",
            r->gpu_s_per_mtok, "slo_attainment", r->slo, "slo_attainment_warm", r->slo_warm,
            "ttft_p50_s", r->ttft_p50, "ttft_p99_s", r->ttft_p99, "ttft_max_s", r->ttft_max,
            "utilisation", r->utilisation, "ready_s", r->ready_s, "wakes", (json_int_t)r->wakes,
            "replica_starts", (json_int_t)r->replica_starts, "peak_replicas",
            (json_int_t)r->peak_replicas, "work_s", r->work_s, "end_s", r->end_s);
        if (!o || json_array_append_new(arr, o) != 0) {
            json_decref(arr);
            return -1;
        }
    }
    const struct sim_cluster *c = &base->cluster;
    json_t *doc = json_pack("{s:{s:i, s:f, s:f, s:i, s:f}, s:f, s:o}", "cluster", "slots",
                            c->slots, "decode_tps", c->decode_tps, "prefill_tps",
                            c->prefill_tps, "max_replicas", c->max_replicas, "slo_warm_s",
                            base->slo_warm_s, "oracle_bin_s", base->oracle_bin_s, "runs", arr);
    if (!doc)
        return -1;
    int rc = json_dump_file(doc, path, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
    json_decref(doc);
    return rc;
}

/* The smoke test's cross-run invariant: the oracle's GPU-seconds are a
 * floor for serving the trace as well as it does. An autoscaler may spend
 * less only by missing more requests (KEDA does on the bursty trace), so
 * the check covers those with at least the oracle's SLO attainment, and
 * every autoscaler's GPU time must cover the work it served. */
static int check_oracle_floor(const struct run *runs, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const struct sim_result *r = &runs[i].r;
        if (r->work_s > r->gpu_s + 1e-6) {
            fprintf(stderr, "FAIL %s cold %.0f %s: %.1f s of work in %.1f GPU-s\n",
                    runs[i].trace, runs[i].cold, sim_kind_to_str(runs[i].kind), r->work_s,
                    r->gpu_s);
            bad = 1;
        }
        const struct run *o = find(runs, n, runs[i].trace, runs[i].cold, SIM_ORACLE);
        if (!o || runs[i].kind == SIM_ORACLE)
            continue;
        if (r->slo >= o->r.slo && o->r.gpu_s > r->gpu_s + 1e-6) {
            fprintf(stderr,
                    "FAIL %s cold %.0f: oracle %.1f GPU-s above %s %.1f at no better SLO\n",
                    runs[i].trace, runs[i].cold, o->r.gpu_s, sim_kind_to_str(runs[i].kind),
                    r->gpu_s);
            bad = 1;
        }
    }
    return bad;
}

int main(int argc, char **argv)
{
    struct settings cfg = {0};
    char err[512];
    enum options_result orc = options_parse(
        option_defs, NOPTIONS, &cfg, argc, argv, "thaw-replay",
        "Replays LLM traces through thaw's scaling policy and its baselines.", NULL, NULL, stdout,
        err, sizeof(err));
    if (orc == OPTIONS_EXIT_OK)
        return 0;
    if (orc != OPTIONS_OK) {
        fprintf(stderr, "thaw-replay: %s\n", err);
        return 2;
    }
    log_set_level(LOG_LEVEL_WARN);

    char *traces[MAX_ITEMS], *colds[MAX_ITEMS], *pols[MAX_ITEMS];
    char *traces_s = thaw_strdup(cfg.traces), *colds_s = thaw_strdup(cfg.cold_starts);
    char *pols_s = thaw_strdup(cfg.policies);
    struct run *runs = NULL;
    FILE *tl = NULL, *rq = NULL;
    int status = 1;
    if (!traces_s || !colds_s || !pols_s) {
        fprintf(stderr, "thaw-replay: out of memory\n");
        goto out;
    }
    if (cfg.smoke) {
        /* Short shapes plus the starts of the bursty Azure trace and of a
         * ServeGen slice when the files are present. */
        thaw_free(traces_s);
        thaw_free(colds_s);
        traces_s = thaw_strdup("azure-code,step,onoff,idle,servegen:multimodal/mm-image:16");
        colds_s = thaw_strdup("30,120");
        if (!traces_s || !colds_s)
            goto out;
        if (cfg.max_seconds <= 0)
            cfg.max_seconds = 1200;
    }
    size_t ntr = split(traces_s, traces, MAX_ITEMS);
    size_t ncold = split(colds_s, colds, MAX_ITEMS);
    size_t npol = split(pols_s, pols, MAX_ITEMS);
    enum sim_kind kinds[MAX_ITEMS];
    double cold_v[MAX_ITEMS];
    for (size_t i = 0; i < npol; i++) {
        int k = sim_kind_parse(pols[i]);
        if (k < 0) {
            fprintf(stderr, "thaw-replay: unknown autoscaler '%s'\n", pols[i]);
            goto out;
        }
        kinds[i] = (enum sim_kind)k;
    }
    for (size_t i = 0; i < ncold; i++) {
        char *end;
        errno = 0;
        cold_v[i] = strtod(colds[i], &end);
        if (errno || *end || !(cold_v[i] >= 0)) {
            fprintf(stderr, "thaw-replay: bad cold start '%s'\n", colds[i]);
            goto out;
        }
    }
    if (cfg.timeline) {
        tl = fopen(cfg.timeline, "w");
        if (!tl) {
            fprintf(stderr, "thaw-replay: %s: %s\n", cfg.timeline, strerror(errno));
            goto out;
        }
        fprintf(tl, "autoscaler,t,replicas,ready,waiting,inflight,token_rate,thaw_desired,"
                    "thaw_active,thaw_raw,thaw_reason\n");
    }
    if (cfg.requests) {
        rq = fopen(cfg.requests, "w");
        if (!rq) {
            fprintf(stderr, "thaw-replay: %s: %s\n", cfg.requests, strerror(errno));
            goto out;
        }
        fprintf(rq, "autoscaler,arrival,ttft,cold,met\n");
    }
    runs = thaw_calloc(ntr * ncold * npol + 1, sizeof(*runs));
    if (!runs)
        goto out;
    size_t nruns = 0;
    long violations = 0;
    struct sim_config base;
    sim_config_defaults(&base, SIM_THAW);
    for (size_t t = 0; t < ntr; t++) {
        struct trace tr;
        if (load_trace(&cfg, traces[t], cfg.max_seconds, &tr, err, sizeof(err)) != 0) {
            if (cfg.smoke && (strncmp(traces[t], "azure-", 6) == 0 ||
                              strncmp(traces[t], "servegen:", 9) == 0)) {
                fprintf(stderr, "thaw-replay: skipping %s: %s\n", traces[t], err);
                continue;
            }
            fprintf(stderr, "thaw-replay: %s\n", err);
            goto out;
        }
        for (size_t c = 0; c < ncold; c++) {
            for (size_t p = 0; p < npol; p++) {
                struct sim_config sc;
                sim_config_defaults(&sc, kinds[p]);
                sc.cluster.cold_start_s = cold_v[c];
                sc.thaw.cold_start_ms = (int64_t)(cold_v[c] * 1000);
                sc.timeline = tl;
                sc.requests_out = rq;
                sc.warm_start = cfg.warm_start != 0;
                sc.check_order = cfg.smoke != 0;
                if (cfg.thaw && apply_thaw_overrides(cfg.thaw, &sc, err, sizeof(err)) != 0) {
                    fprintf(stderr, "thaw-replay: %s\n", err);
                    trace_finish(&tr);
                    goto out;
                }
                sc.oracle_bin_s = cfg.oracle_bin;
                if (kinds[p] == SIM_KEDA || kinds[p] == SIM_KPA)
                    sc.late_after_s = cfg.baselines_late_after;
                if (cfg.prompt_weight >= 0)
                    sc.sig.prompt_weight = cfg.prompt_weight;
                if (tl)
                    fprintf(tl, "# %s cold=%.0f\n", tr.name, cold_v[c]);
                struct run *r = &runs[nruns];
                snprintf(r->trace, sizeof(r->trace), "%s", tr.name);
                r->cold = cold_v[c];
                r->kind = kinds[p];
                if (sim_run(&tr, &sc, &r->r, err, sizeof(err)) != 0) {
                    fprintf(stderr, "thaw-replay: %s\n", err);
                    trace_finish(&tr);
                    goto out;
                }
                if (r->r.violations) {
                    fprintf(stderr, "FAIL %s cold %.0f %s: %ld invariant violations, first: %s\n",
                            r->trace, r->cold, sim_kind_to_str(r->kind), r->r.violations,
                            r->r.violation);
                    violations += r->r.violations;
                }
                nruns++;
            }
        }
        trace_finish(&tr);
    }
    print_table(runs, nruns, stdout);
    if (cfg.json && write_json(runs, nruns, &base, cfg.json) != 0) {
        fprintf(stderr, "thaw-replay: cannot write %s\n", cfg.json);
        goto out;
    }
    status = 0;
    if (violations)
        status = 1;
    if (cfg.smoke) {
        if (check_oracle_floor(runs, nruns))
            status = 1;
        if (nruns == 0)
            status = 1;
        fprintf(stderr, "smoke: %zu runs, %ld invariant violations: %s\n", nruns, violations,
                status ? "FAIL" : "ok");
    }
out:
    if (tl)
        fclose(tl);
    if (rq)
        fclose(rq);
    thaw_free(runs);
    thaw_free(traces_s);
    thaw_free(colds_s);
    thaw_free(pols_s);
    options_free(option_defs, NOPTIONS, &cfg);
    return status;
}
