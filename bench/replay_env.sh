# shellcheck shell=bash disable=SC2034  # the variables are for the sourcing script
# Sourced by bench/replay.sh, replay_servegen.sh and replay_jitter.sh with
# their first argument. Sets root (the checkout), build (THAW_BUILD_DIR,
# default build), traces (THAW_TRACE_DIR, default ../shared/traces next to
# the checkout) and out (the argument, default $build/replay); replay_build
# configures the build if needed, builds thaw-replay, sets bin to it and
# creates out.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${THAW_BUILD_DIR:-$root/build}
traces=${THAW_TRACE_DIR:-$(cd "$root/.." && pwd)/shared/traces}
out=${1:-$build/replay}

replay_build() {
    if [ ! -f "$build/build.ninja" ]; then
        meson setup "$build" "$root" >/dev/null
    fi
    meson compile -C "$build" thaw-replay >/dev/null
    bin=$build/bench/replay/thaw-replay
    mkdir -p "$out"
}
