#!/usr/bin/env bash
# Runs the whole test suite from a clean clone: installs what it needs, builds,
# then runs every test three ways and fuzzes briefly:
#   1. the normal build (unit + integration suites, real redis/prometheus/gRPC peers);
#   2. an ASan+UBSan build (same suites, `asan` test setup);
#   3. the unit suite under valgrind (`valgrind` test setup);
#   4. a fuzz smoke: every libFuzzer target (clang, build-fuzz) for a few
#      seconds, seeded from the committed corpus (scripts/fuzz.sh).
# Steps 1 and 2 run side by side: the integration tests spend most of their
# time waiting on timers (refreshes, scrapes, cold starts), not on the CPU, and
# every peer they start takes a port reserved across processes (freePort() in
# test/integration/lib/harness.mjs). Their lines are prefixed [normal] / [asan].
# Exits non-zero if anything fails. Bounded: meson's per-test timeouts apply.
#
# Environment:
#   THAW_TEST_QUICK=1     only step 1 (for a fast local loop)
#   THAW_TEST_SERIAL=1    steps 1 and 2 one after the other (to rule out load)
#   THAW_FUZZ_SECONDS=N   seconds per fuzz target in step 4 (default 8)
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"
log() { printf '[test] %s\n' "$*" >&2; }

bash scripts/install-deps.sh

setup() { # dir [meson options...]
  local dir=$1; shift
  if [ -f "$dir/build.ninja" ]; then
    meson setup --reconfigure "$dir" "$@" >/dev/null
  else
    meson setup "$dir" "$@" >/dev/null
  fi
  meson compile -C "$dir"
}

start=$(date +%s)
suite() { # dir [meson test options...]
  local dir=$1; shift
  meson test -C "$dir" --print-errorlogs --num-processes 2 "$@"
}

if [ "${THAW_TEST_QUICK:-0}" = 1 ]; then
  log "normal build: unit and integration suites"
  setup build
  suite build
else
  log "building: normal and ASan+UBSan"
  setup build
  setup build-asan -Db_sanitize=address,undefined -Db_lundef=false --buildtype=debug
  if [ "${THAW_TEST_SERIAL:-0}" = 1 ]; then
    log "normal build: unit and integration suites"
    suite build
    log "ASan+UBSan build: unit and integration suites"
    suite build-asan --setup asan
  else
    log "normal and ASan+UBSan builds side by side: unit and integration suites"
    # sed -u keeps each line whole and in time; pipefail gives meson's status.
    # Each in its own process group (set -m), which Ctrl-C does not reach: the
    # trap stops both (meson ends its running tests on SIGTERM), where a
    # background job of a script would otherwise ignore SIGINT and run on.
    set -m
    ( suite build 2>&1 | sed -u 's/^/[normal] /' ) & normal_pid=$!
    ( suite build-asan --setup asan 2>&1 | sed -u 's/^/[asan] /' ) & asan_pid=$!
    set +m
    trap 'kill -TERM -- -"$normal_pid" -"$asan_pid" 2>/dev/null; log "interrupted"; exit 130' INT TERM
    normal_rc=0; asan_rc=0
    wait "$normal_pid" || normal_rc=$?
    wait "$asan_pid" || asan_rc=$?
    trap - INT TERM
    if [ "$normal_rc" != 0 ] || [ "$asan_rc" != 0 ]; then
      log "failed: normal build exit $normal_rc, ASan+UBSan build exit $asan_rc" \
          "(logs: build/meson-logs/testlog.txt, build-asan/meson-logs/testlog-asan.txt)"
      exit 1
    fi
  fi

  log "valgrind: unit suite"
  meson test -C build --setup valgrind --suite unit --print-errorlogs --num-processes 2

  # Found inputs go to a temporary directory, never into the committed seeds;
  # it is kept when something was found, for the reproducers.
  log "fuzz smoke: every libFuzzer target for ${THAW_FUZZ_SECONDS:-8} s"
  fuzz_work=$(mktemp -d "${TMPDIR:-/tmp}/thaw-fuzz.XXXXXX")
  seeds() { find test/fuzz/corpus test/fuzz/regressions -type f -exec sha1sum {} + | sort; }
  seeds_before=$(seeds)
  if ! THAW_FUZZ_WORK_DIR="$fuzz_work" bash scripts/fuzz.sh "${THAW_FUZZ_SECONDS:-8}"; then
    log "fuzz smoke failed: logs and reproducers kept in $fuzz_work"
    exit 1
  fi
  if [ "$(seeds)" != "$seeds_before" ]; then
    log "the fuzz smoke changed test/fuzz/corpus or test/fuzz/regressions"
    exit 1
  fi
  rm -rf "$fuzz_work"
fi
log "all tests passed in $(( $(date +%s) - start )) s"
