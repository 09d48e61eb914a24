#!/usr/bin/env bash
# Thaw's main job on one machine (interim, until the full local stack of the
# demo issue lands): starts a real redis-server and prometheus on free
# loopback ports, a fake vLLM exporter producing tokens for two models,
# thaw-scaler, and then plays KEDA's side of the external-push protocol over
# real gRPC: GetMetricSpec, GetMetrics and IsActive polls, a StreamIsActive
# stream woken by an activator-style PUBLISH, queue-driven scaling. Prints
# what KEDA would see, stops everything on exit (also on Ctrl-C).
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"

bash scripts/install-deps.sh
if [ -f build/build.ninja ]; then meson setup --reconfigure build >/dev/null; else meson setup build >/dev/null; fi
meson compile -C build >/dev/null
exec node scripts/demo.mjs "$@"
