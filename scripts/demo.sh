#!/usr/bin/env bash
# Thaw's main job on one machine: a local serverless-inference stack that
# replays a real LLM request trace. Installs what it needs (idempotent),
# builds, then runs scripts/demo.mjs with every argument passed through:
# redis-server, prometheus, thaw-scaler and thaw-activator on free loopback
# ports; a local KEDA + HPA + Deployment stand-in driving thaw-scaler over
# real gRPC and running fake vLLM replicas with real cold starts; a load
# generator replaying the trace through the activator; a live view; and a
# report (report.json, timeline.svg) in --out. Everything it starts is
# stopped on exit, also on Ctrl-C. `scripts/demo.sh --help` lists the options.
#
# Environment:
#   THAW_BUILD_DIR   build directory to use (default: build)
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"

bash scripts/install-deps.sh
BUILD_DIR=${THAW_BUILD_DIR:-build}
if [ -f "$BUILD_DIR/build.ninja" ]; then meson setup --reconfigure "$BUILD_DIR" >/dev/null; else meson setup "$BUILD_DIR" >/dev/null; fi
if ! log=$(meson compile -C "$BUILD_DIR" 2>&1); then printf '%s\n' "$log" >&2; exit 1; fi
export THAW_BUILD_DIR="$BUILD_DIR"
exec node scripts/demo.mjs "$@"
