#!/usr/bin/env bash
# Warm path of thaw-activator under wrk: the same backend reached directly,
# through nginx (proxy_pass with a keep-alive upstream pool, 1 worker) and
# through thaw-activator (one thread), side by side in the same run.
#
#   bench/activator_warm.sh [--strict]
#
# The backend is a second nginx answering every request with a fixed 67-byte
# JSON body (`return 200 '...'`), about the cheapest HTTP server there is. Two request
# shapes: GET routed by the Host header, and a small JSON POST routed by its
# "model" field (the activator scans the body for it). For each connection
# count (wrk -t1 -c C) and shape, every target runs BENCH_ROUNDS times for
# BENCH_DURATION seconds, the order of targets rotating from round to round;
# the table shows medians over the rounds (req/s, p50, p99 from wrk's own
# latency histogram, CPU time of the server per request) and the RSS of each
# server after its runs (/proc). Goal (issue 3): thaw-activator's req/s >=
# nginx's and its p99 <= 1.1x nginx's. On a shared machine, rounds disturbed
# by other processes are run again (BENCH_MAX_FOREIGN, BENCH_RETRIES).
#
# Answers are checked: every wrk run must have 0 non-2xx/3xx responses and 0
# socket errors; the activator's /metrics must account for every request wrk
# made (accepted between wrk's completed count and completed + C, the
# requests still in flight when wrk stopped; outcomes only `ok`, plus
# `client_closed` for those in flight; nothing held); both nginx instances'
# stub_status request counters must show that every request reached the
# proxy and the backend; curl checks each target's body before and after.
# Exit 1 when the benchmark cannot run or an answer was wrong; with
# --strict, exit 3 when a goal is missed.
#
# Pinning (2+ cores): the server under test gets CPU 0 (thaw-activator, the
# proxy nginx's worker, or, for the direct runs, the backend's worker, moved
# there with taskset -p for those runs only); wrk and, during proxied runs,
# the backend share CPU 1. So every target has one core of its own and the
# proxies pay the same for the backend. With 2 cores the wrk + backend side
# can saturate first (load_cpu near 100%); CPU per request then compares the
# proxies better than req/s. BENCH_PIN=0 turns pinning off.
#
# Environment:
#   THAW_BUILD_DIR  build directory (default <repo>/build-bench, a
#                   --buildtype=release build)
#   BENCH_CONNS     connection counts (default "1 10 50")
#   BENCH_SHAPES    "get post" (default both)
#   BENCH_ROUNDS    rounds per target (default 5)
#   BENCH_DURATION  seconds per wrk run (default 2)
#   BENCH_MAX_FOREIGN  a round whose runs saw other processes take more than
#                   this % of the machine is run again (default 25)
#   BENCH_RETRIES   at most this many times per round (default 1)
#   BENCH_PIN=0     do not pin processes to cores
#   BENCH_VERBOSE=1 also print every round's figures
#   BENCH_KEEP_TMP=1  keep the temporary directory (configs, logs, wrk output)
#   BENCH_ACT_ARGS  extra thaw-activator flags, e.g. "--access-log 1" (its log
#                   goes to a file in the temporary directory)

set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=$(cd "${THAW_BUILD_DIR:-$repo/build-bench}" 2>/dev/null && pwd) || { echo "activator_warm: FAILED: build directory ${THAW_BUILD_DIR:-$repo/build-bench} not found" >&2; exit 1; }
act_bin=$build/activator/thaw-activator
conns=${BENCH_CONNS:-"1 10 50"}
shapes=${BENCH_SHAPES:-"get post"}
rounds=${BENCH_ROUNDS:-5}
duration=${BENCH_DURATION:-2}
max_foreign=${BENCH_MAX_FOREIGN:-25}
retries=${BENCH_RETRIES:-1}
strict=0

for a in "$@"; do
    case $a in
        --strict) strict=1 ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) echo "activator_warm: unknown argument $a" >&2; exit 2 ;;
    esac
done

die() { echo "activator_warm: FAILED: $*" >&2; exit 1; }

for tool in wrk nginx node curl awk taskset; do
    command -v "$tool" >/dev/null || die "$tool not found"
done
[ -x "$act_bin" ] || die "$act_bin not built: meson setup build-bench --buildtype=release && meson compile -C build-bench activator/thaw-activator"
[[ $rounds =~ ^[1-9][0-9]*$ && $duration =~ ^[1-9][0-9]*$ ]] || die "BENCH_ROUNDS and BENCH_DURATION must be positive integers"
[[ $max_foreign =~ ^[0-9]+$ && $retries =~ ^[0-9]+$ ]] || die "BENCH_MAX_FOREIGN and BENCH_RETRIES must be integers"
for c in $conns; do [[ $c =~ ^[1-9][0-9]*$ && $c -le 1000 ]] || die "bad BENCH_CONNS entry $c"; done
for s in $shapes; do [[ $s == get || $s == post ]] || die "bad BENCH_SHAPES entry $s"; done

pin=0
if [ "${BENCH_PIN:-1}" = 1 ] && [ "$(nproc)" -ge 2 ]; then pin=1; fi
pin_srv=(); pin_load=()
[ $pin = 1 ] && pin_srv=(taskset -c 0) && pin_load=(taskset -c 1)

# shellcheck source=lib/common.sh
. "$here/lib/common.sh"
bench_tmpdir actwarm
chmod 755 "$tmp"   # nginx workers run as nobody when started as root

# --- peers -----------------------------------------------------------------------
be_port=$(free_port); be_status=$(free_port)
px_port=$(free_port); px_status=$(free_port)
act_port=$(free_port); act_admin=$(free_port)
body='{"id":"bench","object":"text_completion","choices":[{"text":"ok"}]}'
post_body='{"model":"bench-m1","prompt":"hello","max_tokens":1}'

# Both nginx instances: one worker, no access log, keep-alive connections
# never closed by a request count (nginx's default closes one every 1000
# requests; the activator has no such limit).
cat >"$tmp/backend.conf" <<EOF
worker_processes 1;
pid $tmp/backend.pid;
error_log $tmp/backend-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 100000000;
    keepalive_timeout 120s;
    server {
        listen 127.0.0.1:$be_port;
        default_type application/json;
        location / { return 200 '$body'; }
    }
    server {
        listen 127.0.0.1:$be_status;
        location / { stub_status; }
    }
}
EOF
cat >"$tmp/proxy.conf" <<EOF
worker_processes 1;
pid $tmp/proxy.pid;
error_log $tmp/proxy-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 100000000;
    keepalive_timeout 120s;
    upstream backend {
        server 127.0.0.1:$be_port;
        keepalive 64;
        keepalive_requests 100000000;
        keepalive_timeout 120s;
    }
    server {
        listen 127.0.0.1:$px_port;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
        }
    }
    server {
        listen 127.0.0.1:$px_status;
        location / { stub_status; }
    }
}
EOF
cat >"$tmp/activator.json" <<EOF
{"models":[{"name":"bench-m1","backend":"http://127.0.0.1:$be_port","healthPath":"/health",
  "hosts":["bench.local"]}]}
EOF

mkdir -p "$tmp/logs"   # nginx opens <prefix>/logs/error.log before reading -e
start_nginx() { # start_nginx NAME CPU-PIN...: prints the master pid
    local name=$1; shift
    "$@" nginx -p "$tmp" -e "$tmp/$name-error.log" -c "$tmp/$name.conf" -g 'daemon off;' \
        >"$tmp/$name.out" 2>&1 &
    echo $!
}
be_pid=$(start_nginx backend "${pin_load[@]}")
pids+=("$be_pid")
px_pid=$(start_nginx proxy "${pin_srv[@]}")
pids+=("$px_pid")
"${pin_srv[@]}" "$act_bin" --config "$tmp/activator.json" --listen "127.0.0.1:$act_port" \
    --admin-listen "127.0.0.1:$act_admin" --instance-id bench ${BENCH_ACT_ARGS:-} \
    >"$tmp/activator.log" 2>&1 &
act_pid=$!
pids+=("$act_pid")

# wait_up NAME PID LOG CHECK...: like wait_for, but shows the log if PID
# exits or the wait times out (a port taken in between, a bad config).
wait_up() {
    local name=$1 pid=$2 log=$3; shift 3
    local deadline=$((SECONDS + 10))
    until "$@" >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
            die "$name did not come up: $(cat "$log" 2>/dev/null | tail -5)"
        fi
        sleep 0.1
    done
}
wait_up "backend nginx" "$be_pid" "$tmp/backend-error.log" curl -sf "http://127.0.0.1:$be_status/"
wait_up "proxy nginx" "$px_pid" "$tmp/proxy-error.log" curl -sf "http://127.0.0.1:$px_status/"
wait_up thaw-activator "$act_pid" "$tmp/activator.log" grep -q 'event=listening' "$tmp/activator.log"
worker_of() { # the single nginx worker of master pid $1
    local w
    for _ in $(seq 50); do
        w=$(pgrep -P "$1" | head -1 || true)
        [ -n "$w" ] && { echo "$w"; return; }
        sleep 0.1
    done
    die "no nginx worker under pid $1"
}
be_worker=$(worker_of "$be_pid")
px_worker=$(worker_of "$px_pid")

# The model starts cold: the first request wakes it (probe of /health) and is
# held; afterwards requests are forwarded directly.
first=$(curl -s -o /dev/null -D - -H 'Host: bench.local' "http://127.0.0.1:$act_port/" | tr -d '\r')
grep -q '^HTTP/1.1 200' <<<"$first" || die "first request through the activator: $first"
curl -sf "http://127.0.0.1:$act_admin/models" | grep -q '"state":"ready"' \
    || die "model not ready after the first request: $(curl -s "http://127.0.0.1:$act_admin/models")"

# check_bodies: each target answers both shapes with the backend's body.
check_bodies() {
    local port got
    for port in "$be_port" "$px_port" "$act_port"; do
        got=$(curl -sf -H 'Host: bench.local' "http://127.0.0.1:$port/v1/models") || die "GET on port $port failed"
        [ "$got" = "$body" ] || die "GET on port $port: body $got"
        got=$(curl -sf -H 'Content-Type: application/json' -d "$post_body" "http://127.0.0.1:$port/v1/completions") \
            || die "POST on port $port failed"
        [ "$got" = "$body" ] || die "POST on port $port: body $got"
    done
}
check_bodies

# --- wrk scripts -------------------------------------------------------------------
# done() prints exact figures (latency in microseconds from wrk's histogram)
# instead of the rounded text report. The request stays static (no request()
# function), which keeps wrk on its fast path.
wrk_done='
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRKSTATS requests=%d duration_us=%d bytes=%d connect=%d read=%d write=%d status=%d timeout=%d p50=%d p99=%d max=%d mean=%.1f\n",
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50.0), latency:percentile(99.0), latency.max, latency.mean))
end'
cat >"$tmp/get.lua" <<EOF
wrk.method = "GET"
wrk.path = "/v1/models"
wrk.headers["Host"] = "bench.local"
$wrk_done
EOF
cat >"$tmp/post.lua" <<EOF
wrk.method = "POST"
wrk.path = "/v1/completions"
wrk.headers["Host"] = "bench.local"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '$post_body'
$wrk_done
EOF

# --- measurement helpers -------------------------------------------------------------
stub_requests() { # total requests an nginx has seen (its stub_status read included)
    curl -sf "http://127.0.0.1:$1/" | awk 'NR == 3 { print $3 }'
}
act_metrics() { curl -sf "http://127.0.0.1:$act_admin/metrics" >"$1" || die "activator /metrics unreadable"; }
msum() { # msum FILE REGEX: sum of matching samples
    awk -v re="$2" '$0 !~ /^#/ && $0 ~ re { s += $NF } END { printf "%.0f\n", s }' "$1"
}
# act_settled: accepted == sum of outcomes, nothing held or in flight.
act_settled() {
    act_metrics "$tmp/m.settle"
    local acc ended held infl
    acc=$(msum "$tmp/m.settle" '^thaw_activator_requests_accepted_total')
    ended=$(msum "$tmp/m.settle" '^thaw_activator_requests_total\{')
    held=$(msum "$tmp/m.settle" '^thaw_activator_held_requests\{')
    infl=$(msum "$tmp/m.settle" '^thaw_activator_inflight_requests\{')
    [ "$acc" = "$ended" ] && [ "$held" = 0 ] && [ "$infl" = 0 ]
}
clk_tck=$(getconf CLK_TCK)
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
threads_of() { awk '/^Threads:/ { print $2 }' "/proc/$1/status"; }
# cpu_snap PID...: sets snap to "busy total procs children" in jiffies: both
# CPUs' busy and total time (steal counts as busy), the utime+stime of the
# PIDs, and this shell's waited-for children (wrk) from `times`, which must
# run in this shell, not in a subshell.
cpu_snap() {
    local m p=0 q ch
    m=$(awk '$1 == "cpu" { print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9 }' /proc/stat)
    for q in "$@"; do p=$((p + $(awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$q/stat"))); done
    times >"$tmp/times"
    ch=$(awk 'NR == 2 { s = 0
        for (i = 1; i <= NF; i++) { split($i, x, "m"); sub(/s$/, "", x[2]); s += x[1] * 60 + x[2] }
        printf "%d", s * 100 }' "$tmp/times")
    snap="$m $p $ch"
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

port_of() { case $1 in direct) echo "$be_port" ;; nginx) echo "$px_port" ;; thaw) echo "$act_port" ;; esac; }
pid_of() { case $1 in direct) echo "$be_worker" ;; nginx) echo "$px_worker" ;; thaw) echo "$act_pid" ;; esac; }

# run_wrk TARGET SHAPE C OUT: one measured wrk run with every check; appends
# "rps p50 p99 srv_cpu cpu0_other cpu1_busy" to OUT.figs.
run_wrk() {
    local target=$1 shape=$2 c=$3 out=$4 port pid
    port=$(port_of "$target"); pid=$(pid_of "$target")
    if [ "$target" = direct ] && [ $pin = 1 ]; then taskset -pc 0 "$be_worker" >/dev/null; fi
    local be0 px0
    act_metrics "$tmp/m.before"
    be0=$(stub_requests "$be_status"); px0=$(stub_requests "$px_status")
    local srv_pids=("$pid") load_pids=() other_pids=()
    case $target in
        direct) other_pids=("$act_pid" "$px_worker" "$px_pid" "$be_pid") ;;
        nginx) load_pids=("$be_worker"); other_pids=("$act_pid" "$px_pid" "$be_pid") ;;
        thaw) load_pids=("$be_worker"); other_pids=("$px_worker" "$px_pid" "$be_pid") ;;
    esac
    local s0 l0 o0 s1 l1 o1 wb0 wt0 wb1 wt1 ch0 ch1
    cpu_snap "${srv_pids[@]}"; read -r wb0 wt0 s0 ch0 <<<"$snap"
    cpu_snap "${load_pids[@]}"; read -r _ _ l0 _ <<<"$snap"
    cpu_snap "${other_pids[@]}"; read -r _ _ o0 _ <<<"$snap"
    timeout $((duration + 30)) "${pin_load[@]}" wrk -t1 -c "$c" -d "${duration}s" --timeout 10s \
        -s "$tmp/$shape.lua" "http://127.0.0.1:$port/" >"$out" 2>&1 \
        || die "wrk on $target ($shape, c=$c) failed: $(tail -5 "$out")"
    cpu_snap "${srv_pids[@]}"; read -r wb1 wt1 s1 ch1 <<<"$snap"
    cpu_snap "${load_pids[@]}"; read -r _ _ l1 _ <<<"$snap"
    cpu_snap "${other_pids[@]}"; read -r _ _ o1 _ <<<"$snap"
    if [ "$target" = direct ] && [ $pin = 1 ]; then taskset -pc 1 "$be_worker" >/dev/null; fi
    wait_for 10 "the activator to settle after a $target run" act_settled
    act_metrics "$tmp/m.after"
    local be1 px1
    be1=$(stub_requests "$be_status"); px1=$(stub_requests "$px_status")

    local line requests dur cerr rerr werr serr terr p50 p99
    line=$(grep '^WRKSTATS ' "$out") || die "no WRKSTATS line from wrk: $(cat "$out")"
    wstat() { # wstat KEY: KEY's value on the WRKSTATS line, which must be an integer
        local v
        v=$(awk -v k="$1" '{ for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) print kv[2] } }' <<<"$line")
        [[ $v =~ ^[0-9]+$ ]] || die "wrk output without an integer $1: $line"
        echo "$v"
    }
    requests=$(wstat requests); dur=$(wstat duration_us); p50=$(wstat p50); p99=$(wstat p99)
    cerr=$(wstat connect); rerr=$(wstat read); werr=$(wstat write); serr=$(wstat status); terr=$(wstat timeout)
    [ "$requests" -gt 0 ] || die "$target $shape c=$c: wrk completed no request"
    [ "$serr" = 0 ] || die "$target $shape c=$c: $serr non-2xx/3xx responses"
    [ $((cerr + rerr + werr + terr)) = 0 ] \
        || die "$target $shape c=$c: socket errors connect=$cerr read=$rerr write=$werr timeout=$terr"

    # stub_status counts the status request itself, so each read adds one.
    local be_d=$((be1 - be0 - 1)) px_d=$((px1 - px0 - 1))
    local acc ok cc all other
    acc=$(( $(msum "$tmp/m.after" '^thaw_activator_requests_accepted_total') - $(msum "$tmp/m.before" '^thaw_activator_requests_accepted_total') ))
    ok=$(( $(msum "$tmp/m.after" '^thaw_activator_requests_total\{.*outcome="ok"') - $(msum "$tmp/m.before" '^thaw_activator_requests_total\{.*outcome="ok"') ))
    cc=$(( $(msum "$tmp/m.after" '^thaw_activator_requests_total\{.*outcome="client_closed"') - $(msum "$tmp/m.before" '^thaw_activator_requests_total\{.*outcome="client_closed"') ))
    all=$(( $(msum "$tmp/m.after" '^thaw_activator_requests_total\{') - $(msum "$tmp/m.before" '^thaw_activator_requests_total\{') ))
    other=$((all - ok - cc))
    case $target in
        thaw)
            [ "$other" = 0 ] || die "thaw $shape c=$c: $other requests ended with outcomes other than ok/client_closed: $(grep '^thaw_activator_requests_total' "$tmp/m.after")"
            [ "$acc" -ge "$requests" ] && [ "$acc" -le $((requests + c)) ] && [ $((ok + cc)) = "$acc" ] && [ "$ok" -ge "$requests" ] \
                || die "thaw $shape c=$c: wrk completed $requests, activator accepted $acc, ok $ok, client_closed $cc"
            [ "$be_d" -ge "$ok" ] && [ "$be_d" -le "$acc" ] \
                || die "thaw $shape c=$c: backend saw $be_d requests, activator ok $ok of $acc accepted"
            [ "$px_d" = 0 ] || die "thaw $shape c=$c: the nginx proxy saw $px_d requests"
            ;;
        nginx|direct)
            [ "$acc" = 0 ] || die "$target $shape c=$c: the activator accepted $acc requests"
            [ "$be_d" -ge "$requests" ] && [ "$be_d" -le $((requests + c)) ] \
                || die "$target $shape c=$c: backend saw $be_d requests, wrk completed $requests"
            if [ "$target" = nginx ]; then
                [ "$px_d" -ge "$requests" ] && [ "$px_d" -le $((requests + c)) ] \
                    || die "nginx $shape c=$c: proxy saw $px_d requests, wrk completed $requests"
            else
                [ "$px_d" = 0 ] || die "direct $shape c=$c: the nginx proxy saw $px_d requests"
            fi
            ;;
    esac
    total_checked=$((total_checked + requests))
    [ "$target" = thaw ] && total_thaw=$((total_thaw + acc))

    # srv: the server under test, % of one core; load: wrk and (proxied) the
    # backend, % of one core; foreign: share of both cores used by anything
    # else (other sessions' processes, loopback softirq, steal).
    awk -v n="$requests" -v d="$dur" -v p50="$p50" -v p99="$p99" \
        -v wb="$((wb1 - wb0))" -v wt="$((wt1 - wt0))" -v sv="$((s1 - s0))" \
        -v ld="$((l1 - l0 + ch1 - ch0))" -v ot="$((o1 - o0))" -v ncpu="$(nproc)" -v hz="$clk_tck" 'BEGIN {
            per = wt / ncpu
            srv = per > 0 ? 100 * sv / per : 0
            load = per > 0 ? 100 * ld / per : 0
            fo = wt > 0 ? 100 * (wb - sv - ld - ot) / wt : 0; if (fo < 0) fo = 0
            us = n > 0 ? sv * 1e6 / hz / n : 0
            printf "%.0f %d %d %.0f %.0f %.0f %.2f\n", n / (d / 1e6), p50, p99, srv, load, fo, us }' >"$out.figs"
}

# --- warm-up -----------------------------------------------------------------------
# Fills both proxies' upstream pools and the page cache of every binary.
for t in direct nginx thaw; do
    for s in $shapes; do
        "${pin_load[@]}" wrk -t1 -c 50 -d 1s -s "$tmp/$s.lua" "http://127.0.0.1:$(port_of $t)/" >"$tmp/warmup-$t-$s.out" 2>&1 \
            || die "warm-up wrk on $t failed: $(tail -3 "$tmp/warmup-$t-$s.out")"
        grep -q 'status=0 ' "$tmp/warmup-$t-$s.out" || die "warm-up on $t ($s): $(grep WRKSTATS "$tmp/warmup-$t-$s.out")"
    done
done
wait_for 10 "the activator to settle after the warm-up" act_settled

rss_idle_thaw=$(rss_kib "$act_pid"); rss_idle_nginx=$(rss_kib "$px_worker")
total_checked=0
total_thaw=0
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
t_start=$SECONDS

# --- measurement ---------------------------------------------------------------------
orders=("direct nginx thaw" "thaw direct nginx" "nginx thaw direct")
rounds_retried=0
rounds_disturbed=0
results=()
verbose_rows=()
for c in $conns; do
    for s in $shapes; do
        for r in $(seq "$rounds"); do
            # Each target takes each position once every three rounds, so a
            # burst of load from elsewhere lands on all of them alike. A
            # round in which other processes took more than max_foreign% of
            # the machine during any of its runs is run again (all three
            # targets, to keep them paired), up to `retries` times.
            attempt=0
            while :; do
                worst=0
                for t in ${orders[$(((r - 1) % 3))]}; do
                    run_wrk "$t" "$s" "$c" "$tmp/wrk-$t-$s-c$c-r$r.out"
                    fo=$(cut -d' ' -f6 "$tmp/wrk-$t-$s-c$c-r$r.out.figs")
                    [ "$fo" -gt "$worst" ] && worst=$fo
                done
                [ "$worst" -le "$max_foreign" ] || [ "$attempt" -ge "$retries" ] && break
                attempt=$((attempt + 1))
                rounds_retried=$((rounds_retried + 1))
            done
            [ "$worst" -le "$max_foreign" ] || rounds_disturbed=$((rounds_disturbed + 1))
            for t in ${orders[$(((r - 1) % 3))]}; do
                verbose_rows+=("$c $s $r $t $(cat "$tmp/wrk-$t-$s-c$c-r$r.out.figs") attempt=$((attempt + 1))")
            done
        done
        for t in direct nginx thaw; do
            for r in $(seq "$rounds"); do cat "$tmp/wrk-$t-$s-c$c-r$r.out.figs"; done >"$tmp/figs-$t-$s-c$c"
            f=$tmp/figs-$t-$s-c$c
            rps=$(cut -d' ' -f1 "$f" | tr '\n' ' ' | median)
            rmin=$(cut -d' ' -f1 "$f" | sort -n | head -1)
            rmax=$(cut -d' ' -f1 "$f" | sort -n | tail -1)
            p50=$(cut -d' ' -f2 "$f" | tr '\n' ' ' | median)
            p99=$(cut -d' ' -f3 "$f" | tr '\n' ' ' | median)
            scpu=$(cut -d' ' -f4 "$f" | tr '\n' ' ' | median)
            lcpu=$(cut -d' ' -f5 "$f" | tr '\n' ' ' | median)
            fo=$(cut -d' ' -f6 "$f" | sort -n | tail -1)
            cus=$(cut -d' ' -f7 "$f" | tr '\n' ' ' | median)
            rss=$(rss_kib "$(pid_of "$t")")
            results+=("$c $s $t $rps $rmin $rmax $p50 $p99 $scpu $lcpu $fo $rss $cus")
        done
    done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
elapsed=$((SECONDS - t_start))

check_bodies
act_threads=$(threads_of "$act_pid")
rss_px_master=$(rss_kib "$px_pid")
rss_be=$(rss_kib "$be_worker")
grep -E 'level=(warn|error)' "$tmp/activator.log" | grep -v 'event=no_redis' >"$tmp/act-warnings" || true

# --- report -----------------------------------------------------------------------------
buildtype=$(node -e "const o=require(process.argv[1]);console.log((o.find(x=>x.name==='buildtype')||{}).value||'?')" \
    "$build/meson-info/intro-buildoptions.json" 2>/dev/null || echo '?')
echo "thaw-activator warm path (wrk -t1, keep-alive, loopback; same backend for all targets)"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r)"
echo "thaw-activator: $act_bin (buildtype=$buildtype, threads=$act_threads); $(nginx -v 2>&1 | sed 's/^nginx version: //') (1 worker, proxy_pass + upstream keepalive 64); $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)"
if [ $pin = 1 ]; then
    echo "pinning: server under test on CPU 0 (activator / proxy nginx worker / backend worker for direct); wrk and the backend on CPU 1"
else
    echo "pinning: none"
fi
echo "backend: nginx return 200 with a ${#body}-byte JSON body; GET = GET /v1/models routed by Host; POST = ${#post_body}-byte JSON body routed by \"model\""
echo "each cell: median of $rounds rounds x ${duration}s, target order rotating; measured for ${elapsed}s; load average before/after: $load_before / $load_after"
echo "rounds run again because other processes took > ${max_foreign}% of the machine: $rounds_retried; rounds kept although disturbed: $rounds_disturbed of $(( $(wc -w <<<"$conns") * $(wc -w <<<"$shapes") * rounds ))"
echo "correctness: $total_checked responses checked (0 non-2xx, 0 socket errors); activator accounted $total_thaw requests (ok + in flight at wrk's stop); nginx stub_status counts matched; bodies checked before and after"
echo "idle RSS after warm-up: thaw-activator $rss_idle_thaw KiB, nginx proxy worker $rss_idle_nginx KiB; nginx proxy master $rss_px_master KiB; backend worker $rss_be KiB"
if [ -s "$tmp/act-warnings" ]; then
    echo "activator warnings during the run: $(wc -l <"$tmp/act-warnings") (first: $(head -1 "$tmp/act-warnings"))"
fi
echo
printf '%-5s %-5s %-7s %9s %17s %8s %8s %8s %11s %8s %11s %8s\n' conns shape target req/s 'req/s min-max' p50_us p99_us srv_cpu cpu_us/req load_cpu foreign_max RSS_KiB
declare -A by
for row in "${results[@]}"; do
    read -r c s t rps rmin rmax p50 p99 scpu lcpu fo rss cus <<<"$row"
    printf '%-5s %-5s %-7s %9.0f %17s %8.0f %8.0f %7.0f%% %11.1f %7.0f%% %10s%% %8s\n' "$c" "$s" "$t" "$rps" "$rmin-$rmax" "$p50" "$p99" "$scpu" "$cus" "$lcpu" "$fo" "$rss"
    by[$c:$s:$t]="$rps $p99 $fo $lcpu $cus"
done
echo "srv_cpu: the server under test (proxy, or backend for direct), % of one core; cpu_us/req: its CPU time"
echo "(user + system, from /proc) per completed request, the figure least affected by other load; load_cpu: wrk plus, when"
echo "proxied, the backend, % of one core (both on CPU 1 when pinned); foreign_max: the largest share of the"
echo "machine's CPU used by anything else during one of the rounds (other sessions, loopback softirq, steal)."
echo "RSS_KiB: VmRSS of the serving process after that row's runs (nginx: the worker; its master is extra)."
if [ "${BENCH_VERBOSE:-0}" = 1 ]; then
    echo
    echo "every round (the attempt kept): conns shape round target req/s p50_us p99_us srv_cpu load_cpu foreign cpu_us/req"
    printf '  %s\n' "${verbose_rows[@]}"
fi
echo
printf '%-12s %11s %13s %-21s %-24s %-14s %s\n' 'conns shape' thaw/nginx thaw/nginx_p99 'goal req/s >= nginx' 'goal p99 <= 1.1x nginx' 'cpu_us/req t/n' 'paired ratios req/s, p99'
missed=0
for c in $conns; do
    for s in $shapes; do
        # Per-round ratios: thaw and nginx ran minutes apart at most, in the
        # same round, so this view is less sensitive to load drifting
        # between rounds.
        paired=$(paste -d' ' "$tmp/figs-thaw-$s-c$c" "$tmp/figs-nginx-$s-c$c" | awk '{ h = NF / 2; printf "%.4f %.4f\n", $1 / $(h + 1), ($(h + 3) > 0) ? $3 / $(h + 3) : 0 }')
        prr=$(cut -d' ' -f1 <<<"$paired" | tr '\n' ' ' | median)
        ppr=$(cut -d' ' -f2 <<<"$paired" | tr '\n' ' ' | median)
        read -r trps tp99 toth tl tcus <<<"${by[$c:$s:thaw]}"
        read -r nrps np99 noth nl ncus <<<"${by[$c:$s:nginx]}"
        cr=$(awk -v a="$tcus" -v b="$ncus" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }')
        rr=$(awk -v a="$trps" -v b="$nrps" 'BEGIN { printf "%.2f", a / b }')
        pr=$(awk -v a="$tp99" -v b="$np99" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }')
        g1=$(awk -v a="$trps" -v b="$nrps" 'BEGIN { print (a >= b) ? "met" : "MISSED" }')
        g2=$(awk -v a="$tp99" -v b="$np99" 'BEGIN { print (a <= 1.1 * b) ? "met" : "MISSED" }')
        [ "$g1" = met ] && [ "$g2" = met ] || missed=1
        note=""
        if awk -v a="$toth" -v b="$noth" 'BEGIN { exit !((a > 20) || (b > 20)) }'; then
            note="  (disturbed: foreign_max ${toth}%/${noth}%)"
        fi
        if awk -v a="$tl" -v b="$nl" 'BEGIN { exit !((a >= 90) && (b >= 90)) }'; then
            note="$note  (load side saturated: load_cpu ${tl}%/${nl}%)"
        fi
        printf '%-12s %10sx %12sx %-21s %-24s %13sx %.2fx, %.2fx%s\n' "c=$c $s" "$rr" "$pr" "$g1" "$g2" "$cr" "$prr" "$ppr" "$note"
    done
done
echo "cpu_us/req t/n: the activator's CPU time per request over nginx's (below 1: the activator does the same work"
echo "with less CPU). When the load side is saturated, req/s of both proxies is bounded by wrk and the backend."
if [ "$missed" = 1 ]; then
    echo "RESULT: goals MISSED (see above)"
    [ "$strict" = 1 ] && exit 3
else
    echo "RESULT: goals met"
fi
exit 0
