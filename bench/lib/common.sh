# Shell pieces the bench/*.sh scripts share. Source it after defining die().
#
#   bench_tmpdir NAME   makes $tmp (removed at exit unless BENCH_KEEP_TMP=1) and
#                       the $pids array, whose processes are stopped at exit
#                       (TERM, then KILL after 5 s)
#   free_port           prints a loopback port that was free a moment ago
#   wait_for SECONDS DESCRIPTION COMMAND...
#                       polls COMMAND every 0.1 s, die()s after SECONDS

bench_tmpdir() {
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/thaw-bench-$1.XXXXXX")
    pids=()
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
}

bench_cleanup() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
    if [ "${BENCH_KEEP_TMP:-0}" = 1 ]; then echo "kept $tmp" >&2; else rm -rf "$tmp"; fi
}

free_port() {
    node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})"
}

wait_for() {
    local t=$1 what=$2; shift 2
    local deadline=$((SECONDS + t))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || die "timed out after ${t}s waiting for $what"
        sleep 0.1
    done
}
