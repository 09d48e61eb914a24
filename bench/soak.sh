#!/usr/bin/env bash
# Soak benchmark: bounded minutes of mixed traffic through thaw-activator
# with cold starts forced periodically, every Thaw process built with
# ASan+UBSan, RSS of the activator and the scaler sampled every 10 s.
#
#   bench/soak.sh [--minutes N] [other bench/soak.mjs options]
#
# Default 10 minutes of traffic (plus about a minute of setup and checks).
# Builds thaw-activator, thaw-scaler and thaw-fake-vllm with
# -Db_sanitize=address,undefined in build-soak (or THAW_BUILD_DIR, which must
# be such a build), then runs bench/soak.mjs: redis-server, prometheus, the
# scaler, the activator and the demo's KEDA/HPA/Deployment stand-in with fake
# vLLM replicas; three models (steady, on/off, bursty), streaming and not;
# replicas killed (SIGKILL) and scaled to zero on purpose along the way.
# Fails (exit 1) on any unexpected client error, when the activator's
# accepted != answered, on any sanitizer report (ASan, UBSan, LSan at exit),
# or when the RSS slope of the activator or the scaler over the last half
# (from 120 s on at the earliest: --warmup-seconds) exceeds
# --max-slope-kib-per-min (default 256). `--help` lists the options.
#
# Sanitizer settings: ASan and LSan reports go to files in a temp directory
# (checked at the end, copied to the report directory); UBSan writes to the
# process's stderr whatever its log_path says when combined with ASan, so
# every process's output is searched too; a report ends the process with
# exit code 23 (ASan/LSan) or 24 (UBSan), which the run also checks; leaks
# are checked at exit (LSAN_OPTIONS stays unset: its log_path would override
# ASan's); and ASan's quarantine of freed memory is capped at 4 MiB so RSS
# measures the program rather than the quarantine filling up (with the
# default 256 MiB, thaw-scaler's RSS would grow ~8 MiB a minute for about
# half an hour: freed memory held back, not a leak; with 16 MiB it still grew
# for the first ~2.5 minutes).

set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${THAW_BUILD_DIR:-$repo/build-soak}

die() { echo "soak: FAILED: $*" >&2; exit 1; }

for a in "$@"; do
    case $a in
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exec node "$here/soak.mjs" --help ;;
    esac
done

for tool in node meson ninja redis-server prometheus; do
    command -v "$tool" >/dev/null || die "$tool not found"
done

if [ ! -f "$build/build.ninja" ]; then
    [ -z "${THAW_BUILD_DIR:-}" ] || die "THAW_BUILD_DIR=$build is not a meson build directory"
    meson setup "$build" -Db_sanitize=address,undefined -Db_lundef=false --buildtype=debug >/dev/null
fi
meson compile -C "$build" activator/thaw-activator scaler/thaw-scaler test/fakevllm/thaw-fake-vllm >/dev/null \
    || die "build failed: meson compile -C $build"
for bin in activator/thaw-activator scaler/thaw-scaler test/fakevllm/thaw-fake-vllm; do
    libs=$(ldd "$build/$bin")   # not piped into grep -q: pipefail and SIGPIPE
    [[ $libs == *libasan* && $libs == *libubsan* ]] ||
        die "$build/$bin is not an ASan+UBSan build (meson setup $build -Db_sanitize=address,undefined -Db_lundef=false)"
done

san=$(mktemp -d "${TMPDIR:-/tmp}/thaw-soak-san.XXXXXX")
trap 'rm -rf "$san"' EXIT
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:exitcode=23:quarantine_size_mb=4:log_path=$san/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=24:log_path=$san/ubsan"
export THAW_SOAK_SANITIZER_DIR=$san
export THAW_BUILD_DIR=$build
cd "$repo"
node "$here/soak.mjs" "$@"
