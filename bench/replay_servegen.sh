#!/usr/bin/env bash
# Held-out replay: thaw and its baselines on arrivals shaped by the ServeGen
# production rate envelope (../shared/traces/servegen_aggregate_rate_10min.csv,
# Alibaba Bailian, 10-minute windows), traffic no knob was tuned on.
#
#   bench/replay_servegen.sh [OUT_DIR]
#
# Slices: every model, the first day in 4-hour slices (start hours 0, 4, ...,
# 20; THAW_SG_DAY picks another day), leaving out slices with an empty window
# (the file's README calls those collection gaps); seeds 1 and 2 (the client processes' draws); cold starts
# 30 s and 120 s. Each slice runs at 4 req/s on average with each window's
# rate split over its active clients, gamma gaps of the window's CV (capped
# at 4): `thaw-replay --traces servegen:<model>:<hour>` (docs/scaling-policy.md,
# "Held out: the ServeGen production envelope"). Prints every cell's verdict table row
# and the count of cells where thaw dominates both baselines; writes
# OUT_DIR/servegen.md (default OUT_DIR: $THAW_BUILD_DIR/replay). About a
# minute on 2 cores; each thaw-replay run has a 5-minute timeout.
#
# Environment: THAW_BUILD_DIR (default build), THAW_TRACE_DIR (default
# ../shared/traces next to the checkout), THAW_THAW (knob overrides, as
# thaw-replay --thaw), THAW_SG_SEEDS (default "1 2"), THAW_SG_DAY (default 1;
# day 2-14 exist for the three language models only).
set -euo pipefail

# shellcheck source=bench/replay_env.sh
. "$(dirname "$0")/replay_env.sh" "${1:-}"
seeds=${THAW_SG_SEEDS:-1 2}
day=${THAW_SG_DAY:-1}
envelope=$traces/servegen_aggregate_rate_10min.csv

if [ ! -f "$envelope" ]; then
    echo "replay_servegen: $envelope not found (set THAW_TRACE_DIR)" >&2
    exit 1
fi
replay_build

# "model start-hour" for every 4-hour slice of the day with no empty window.
slices=$(awk -F, -v day="$day" 'NR > 1 && $2 >= (day - 1) * 86400 && $2 < day * 86400 {
        slice = int($2 / 14400); key = $1 " " slice * 4
        n[key]++; if ($3 + 0 <= 0) empty[key] = 1
    }
    END { for (k in n) if (n[k] == 24 && !(k in empty)) print k }' "$envelope" | sort -k1,1 -k2,2n)

rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for model in $(echo "$slices" | awk '{print $1}' | sort -u); do
    list=$(echo "$slices" | awk -v m="$model" '$1 == m {printf "%sservegen:%s:%s", sep, m, $2; sep = ","}')
    for seed in $seeds; do
        timeout 300 "$bin" --trace-dir "$traces" --traces "$list" --seed "$seed" \
            ${THAW_THAW:+--thaw "$THAW_THAW"} |
            awk -v seed="$seed" -F'|' 'NF == 7 && $4 ~ /^ (yes|no)/ {
                sub(/^ /, "", $2); sub(/ $/, "", $2)
                printf "|%s s%s|%s|%s|%s|%s|\n", " " $2, seed, $3, $4, $5, $6 }' >>"$rows"
    done
done

{
    echo "# Held-out replay: the ServeGen rate envelope"
    echo
    echo "Command: \`bench/replay_servegen.sh\` ($(date -u +%Y-%m-%d), $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown))"
    echo
    echo "| slice, seed | cold start | thaw beats keda-hpa (requests in time, GPU-s) | thaw beats knative-kpa (requests in time, GPU-s) | thaw / oracle GPU-s |"
    echo "|---|---:|---|---|---:|"
    cat "$rows"
    echo
    awk -F'|' '{
            m = $2; sub(/^ sg-/, "", m); sub(/-h[0-9]+ s[0-9]+ *$/, "", m)
            won = ($4 ~ /^ yes/ && $5 ~ /^ yes/); tot[m]++; w[m] += won; all++; wall += won
            if ($4 !~ /^ yes/) lk[m]++
            if ($5 !~ /^ yes/) lp[m]++
        }
        END {
            print "| model | cells | thaw dominates both | lost to keda-hpa | lost to knative-kpa |"
            print "|---|---:|---:|---:|---:|"
            n = 0
            for (m in tot) names[++n] = m
            for (i = 2; i <= n; i++) for (j = i; j > 1 && names[j] < names[j - 1]; j--) {
                t = names[j]; names[j] = names[j - 1]; names[j - 1] = t }
            for (i = 1; i <= n; i++) { m = names[i]
                printf "| %s | %d | %d | %d | %d |\n", m, tot[m], w[m], lk[m] + 0, lp[m] + 0 }
            printf "| all | %d | %d | | |\n", all, wall
        }' "$rows"
} | tee "$out/servegen.md"
