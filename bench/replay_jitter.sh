#!/usr/bin/env bash
# How much do the Azure cells' verdicts rest on the exact arrival times?
# Replays the two Azure traces with every arrival moved by a uniform random
# amount within +-JITTER seconds (thaw-replay --jitter, one draw per seed)
# and counts, per cell, the draws where thaw dominates both baselines.
#
#   bench/replay_jitter.sh [OUT_DIR]
#
# Environment: THAW_BUILD_DIR (default build), THAW_TRACE_DIR (default
# ../shared/traces next to the checkout), THAW_JITTER (seconds, default
# 0.5), THAW_JITTER_SEEDS (draws, default 20), THAW_THAW (knob overrides,
# as thaw-replay --thaw). Writes OUT_DIR/jitter.md (default OUT_DIR:
# $THAW_BUILD_DIR/replay). About 3 s per draw on 2 cores; each thaw-replay
# run has a 5-minute timeout.
set -euo pipefail

# shellcheck source=bench/replay_env.sh
. "$(dirname "$0")/replay_env.sh" "${1:-}"
jitter=${THAW_JITTER:-0.5}
draws=${THAW_JITTER_SEEDS:-20}

if [ ! -f "$traces/AzureLLMInferenceTrace_code.csv" ]; then
    echo "replay_jitter: no Azure traces in $traces (set THAW_TRACE_DIR)" >&2
    exit 1
fi
replay_build

rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for seed in $(seq 1 "$draws"); do
    timeout 300 "$bin" --trace-dir "$traces" --traces azure-code,azure-conv --jitter "$jitter" \
        --seed "$seed" ${THAW_THAW:+--thaw "$THAW_THAW"} |
        awk -F'|' 'NF == 7 && $4 ~ /^ (yes|no)/' >>"$rows"
done

{
    echo "# Azure cells under arrival jitter"
    echo
    echo "Command: \`THAW_JITTER=$jitter THAW_JITTER_SEEDS=$draws bench/replay_jitter.sh\` ($(date -u +%Y-%m-%d), $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown))"
    echo
    echo "| trace | cold start | draws | thaw dominates both | beats keda-hpa | beats knative-kpa | requests in time against keda-hpa (min / median / max) | GPU-s against keda-hpa (min / median / max) |"
    echo "|---|---:|---:|---:|---:|---:|---|---|"
    awk -F'|' '
        function num(s, re,   m) { return match(s, re) ? substr(s, RSTART, RLENGTH) + 0 : "" }
        function sorted(a, n,   i, j, t) {
            for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j] < a[j - 1]; j--) {
                t = a[j]; a[j] = a[j - 1]; a[j - 1] = t } }
        {
            key = $2 "|" $3
            if (!(key in n)) order[++nk] = key
            n[key]++
            bk = ($4 ~ /^ yes/); bp = ($5 ~ /^ yes/)
            k[key] += bk; p[key] += bp; both[key] += bk && bp
            # The margins against KEDA, as "yes: +0 req, -10.8 % GPU-s".
            req[key, n[key]] = num($4, "[-+][0-9]+ req")
            gpu[key, n[key]] = num($4, "[-+][0-9.]+ % GPU-s")
        }
        END {
            for (i = 1; i <= nk; i++) {
                key = order[i]; m = n[key]
                for (j = 1; j <= m; j++) { a[j] = req[key, j]; b[j] = gpu[key, j] }
                sorted(a, m); sorted(b, m)
                split(key, kk, "|")
                printf "|%s|%s| %d | %d | %d | %d | %+d / %+d / %+d | %+.1f / %+.1f / %+.1f %% |\n",
                    kk[1], kk[2], m, both[key], k[key], p[key],
                    a[1], a[int((m + 1) / 2)], a[m], b[1], b[int((m + 1) / 2)], b[m]
            }
        }' "$rows"
} | tee "$out/jitter.md"
