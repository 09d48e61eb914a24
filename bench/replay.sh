#!/usr/bin/env bash
# Trace-replay benchmark of thaw's scaling policy against KEDA + HPA,
# Knative's KPA and an oracle (docs/scaling-policy.md explains the model).
#
#   bench/replay.sh [OUT_DIR]
#
# Environment: THAW_BUILD_DIR (default build), THAW_TRACE_DIR (default
# ../shared/traces next to the checkout). Writes OUT_DIR/replay.md and
# OUT_DIR/replay.json (default OUT_DIR: $THAW_BUILD_DIR/replay) and prints
# the tables. Bounded: the whole run takes seconds; a 5-minute timeout guards it.
set -euo pipefail

# shellcheck source=bench/replay_env.sh
. "$(dirname "$0")/replay_env.sh" "${1:-}"
replay_build

run() {
    timeout 300 "$bin" --trace-dir "$traces" "$@"
}

{
    echo "# Scaling policy replay"
    echo
    echo "Command: \`bench/replay.sh\` ($(date -u +%Y-%m-%d), $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown))"
    echo
    echo "## Main table: every trace and shape, cold starts 30 s and 120 s"
    echo
    run --json "$out/replay.json"
    echo
    echo "## Policy v1 (metadata policy: v1) vs v2, the default"
    echo
    run --policies thaw-v1,thaw,oracle
    echo
    echo "## Sensitivity: thaw's activators serve FIFO (lateAfterSeconds 0 in the activator config and the ScaledObject)"
    echo
    run --thaw late_after_s=0 --policies thaw
    echo
    echo "## Policy alone: KEDA's and Knative's requests wait in activators that send late requests last too (lateAfterSeconds 1.5 for every autoscaler)"
    echo
    run --baselines-late-after 1.5 --policies thaw,keda-hpa,knative-kpa
    echo
    echo "## Sensitivity: replicaConcurrency not set (the level plans for targetUtilisation 0.88 of capacity)"
    echo
    run --thaw replica_slots=0
    echo
    echo "## Sensitivity: the token-rate query counts generated tokens only (the scaler's default query)"
    echo
    run --prompt-weight 0 --traces azure-code,azure-conv
    echo
    echo "## Sensitivity: every autoscaler starts at zero replicas"
    echo
    run --warm-start 0 --traces azure-code,azure-conv,step
} | tee "$out/replay.md"
echo "wrote $out/replay.md and $out/replay.json" >&2
