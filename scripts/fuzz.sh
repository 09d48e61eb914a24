#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) and runs each one for a
# bounded time. Exits non-zero if any target crashed, printing the reproducer.
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
#   SECONDS  time per target (default 60)
#   TARGET   names as in test/fuzz/corpus/ (default: all)
#
# Environment:
#   THAW_FUZZ_BUILD_DIR   build directory (default build-fuzz)
#   THAW_FUZZ_RSS_MB      -rss_limit_mb (default 2048)
#   THAW_FUZZ_TIMEOUT     -timeout per input in seconds (default 10)
#   THAW_FUZZ_WORK_DIR    where found inputs and crashes go (default $BUILD/fuzz-work;
#                         scripts/test.sh passes a temporary directory)
#
# Inputs the fuzzer finds go to $WORK/<target>/corpus; the committed seeds
# (test/fuzz/corpus, regressions) are only read: libFuzzer writes new and
# reduced inputs to its first corpus directory alone. Crashes go to
# $WORK/<target>/artifacts/. Only the fuzz_* executables asked for are built.
# To keep a crash as a regression test: minimise it (the command is printed),
# fix the code, then copy it to test/fuzz/regressions/<target>/.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"
log() { printf '[fuzz] %s\n' "$*" >&2; }
die() { printf '[fuzz] ERROR: %s\n' "$*" >&2; exit 2; }

SECONDS_PER_TARGET=${1:-60}
[[ "$SECONDS_PER_TARGET" =~ ^[0-9]+$ ]] && [ "$SECONDS_PER_TARGET" -gt 0 ] || \
  die "SECONDS must be a positive whole number, got '$SECONDS_PER_TARGET'"
shift || true
BUILD=${THAW_FUZZ_BUILD_DIR:-build-fuzz}
RSS_MB=${THAW_FUZZ_RSS_MB:-2048}
TIMEOUT=${THAW_FUZZ_TIMEOUT:-10}
WORK=${THAW_FUZZ_WORK_DIR:-$BUILD/fuzz-work}

command -v clang >/dev/null 2>&1 || die "clang not found (scripts/install-deps.sh installs it)"
rt=$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null || true)
if [ ! -f "$rt" ] && ! ls "$(clang -print-resource-dir)"/lib/linux/libclang_rt.fuzzer-*.a \
     >/dev/null 2>&1; then
  die "libFuzzer runtime not found (package libclang-rt-14-dev; scripts/install-deps.sh)"
fi

if [ -f "$BUILD/build.ninja" ]; then
  meson setup --reconfigure "$BUILD" -Dfuzz=true -Db_sanitize=address,undefined \
    -Db_lundef=false >/dev/null
else
  CC=clang meson setup "$BUILD" -Dfuzz=true -Db_sanitize=address,undefined \
    -Db_lundef=false >/dev/null
fi

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  targets=()
  for d in test/fuzz/corpus/*/; do
    targets+=("$(basename "$d")")
  done
fi
build_targets=()
for t in "${targets[@]}"; do
  [[ "$t" =~ ^[a-z0-9_]+$ ]] || die "bad target name '$t'"
  build_targets+=("test/fuzz/fuzz_$t:executable")
done
log "building $BUILD (${#targets[@]} fuzz targets)"
mkdir -p "$WORK"
if ! meson compile -C "$BUILD" "${build_targets[@]}" >"$WORK/build.log" 2>&1; then
  tail -n 40 "$WORK/build.log" >&2
  die "build failed (unknown target? full log: $WORK/build.log)"
fi

# Findings must stop the target: UBSan reports are fatal, leaks are checked.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# options_config writes its input to a file per run: tmpfs makes that 8x faster.
fuzz_tmp=${TMPDIR:-/tmp}
[ -d /dev/shm ] && [ -w /dev/shm ] && fuzz_tmp=/dev/shm

failed=()
summary=()
for t in "${targets[@]}"; do
  exe="$BUILD/test/fuzz/fuzz_$t"
  [ -x "$exe" ] || die "no fuzzer $exe (unknown target '$t'?)"
  work="$WORK/$t"
  mkdir -p "$work/corpus" "$work/artifacts"
  args=(-max_total_time="$SECONDS_PER_TARGET" -timeout="$TIMEOUT" -rss_limit_mb="$RSS_MB"
        -print_final_stats=1 -artifact_prefix="$work/artifacts/")
  [ -f "test/fuzz/dict/$t.dict" ] && args+=(-dict="test/fuzz/dict/$t.dict")
  dirs=("$work/corpus" "test/fuzz/corpus/$t")
  [ -d "test/fuzz/regressions/$t" ] && dirs+=("test/fuzz/regressions/$t")
  log "$t: ${SECONDS_PER_TARGET}s"
  logf="$work/last.log"
  rc=0
  # Bounded even if libFuzzer itself hangs: twice the budget plus a minute.
  TMPDIR=$fuzz_tmp timeout $((SECONDS_PER_TARGET * 2 + 60)) "$exe" "${args[@]}" "${dirs[@]}" \
    >"$logf" 2>&1 || rc=$?
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$logf" | tail -1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logf" | tail -1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$logf" | tail -1)
  [ -n "$done_line" ] || done_line=$(grep -E '^#[0-9]+' "$logf" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<<"$done_line")
  if [ "$rc" -ne 0 ]; then
    repro=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$logf" | tail -1)
    pat='ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|FUZZ FAILURE|Assertion'
    what=$(grep -m1 -E "$pat" "$logf" || true)
    [ "$rc" -eq 124 ] && what="libFuzzer did not stop within twice its time budget"
    log "$t: CRASH (exit $rc): ${what:-see $logf}"
    if [ -n "$repro" ]; then
      log "  reproducer: $repro"
      log "  rerun:      $exe $repro"
      log "  minimise:   $exe -minimize_crash=1 -max_total_time=60 $repro"
    fi
    log "  full log:   $logf"
    # CI shows only the output: the stack and the input itself go there too.
    tail -n 60 "$logf" | sed 's/^/    | /' >&2
    if [ -n "$repro" ] && [ -f "$repro" ] && [ "$(stat -c %s "$repro")" -le 4096 ]; then
      log "  reproducer (base64): $(base64 -w0 <"$repro")"
    fi
    failed+=("$t")
    summary+=("$(printf '%-18s CRASH  execs=%-9s exec/s=%-7s cov=%-6s ft=%-6s %s' "$t" \
      "${execs:-?}" "${eps:-?}" "${cov:-?}" "${ft:-?}" "${repro:-$logf}")")
  else
    summary+=("$(printf '%-18s ok     execs=%-9s exec/s=%-7s cov=%-6s ft=%-6s corpus=%s' "$t" \
      "${execs:-?}" "${eps:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}")")
  fi
done

printf '\n%s %s\n' "Fuzzing summary (${SECONDS_PER_TARGET}s per target;" \
  "cov = coverage points, ft = features):"
printf '  %s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  log "crashes in: ${failed[*]}"
  exit 1
fi
log "no crashes"
