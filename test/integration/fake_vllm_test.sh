#!/usr/bin/env bash
# Integration test of thaw-fake-vllm, the vLLM stand-in: loading and /health,
# the OpenAI endpoints (plain and streamed, with timing), /metrics checked by
# promtool and against the tokens actually generated, queueing, client
# disconnects, limits, shutdown, and the exporter-only mode.
#
# usage: fake_vllm_test.sh PATH-TO-thaw-fake-vllm
# FAKE_VLLM_WRAPPER="valgrind --leak-check=full --error-exitcode=25" runs the
# server under a wrapper; upper time bounds are then relaxed, and the wrapper's
# exit code shows in the shutdown checks.
# Every wait is bounded (curl --max-time, polling loops with a cap); meson's
# test timeout bounds the whole run.
set -euo pipefail

EXE=${1:?usage: fake_vllm_test.sh PATH-TO-thaw-fake-vllm}
WRAPPER=${FAKE_VLLM_WRAPPER:-}
SLACK=1
if [ -n "$WRAPPER" ]; then SLACK=4; fi

for tool in curl promtool jq awk; do
    command -v "$tool" >/dev/null || { echo "missing tool: $tool"; exit 1; }
done
if [ -z "${EPOCHREALTIME:-}" ]; then echo "bash >= 5 needed (EPOCHREALTIME)"; exit 1; fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/fake_vllm_test.XXXXXX")
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

PASS=0
FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok   - $1"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL - $1"; }
# check DESCRIPTION COMMAND...: passes when the command succeeds.
check() { local d=$1; shift; if "$@"; then ok "$d"; else bad "$d"; fi; }
# between VALUE LOW HIGH (floats)
between() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v + 0 == v && v >= lo && v <= hi) }'; }
eq() { [ "$1" = "$2" ] || { echo "    got '$1', want '$2'"; return 1; }; }
now_us() { echo "${EPOCHREALTIME/./}"; }

# start_server NAME ARGS...: launches the server on a free port; sets SRV_PID, SRV_PORT, SRV_LOG.
start_server() {
    local name=$1
    shift
    SRV_LOG="$TMP/$name.log"
    rm -f "$TMP/$name.port"
    # $WRAPPER is deliberately split into words (a command with options).
    # shellcheck disable=SC2086
    $WRAPPER "$EXE" --listen 127.0.0.1:0 --port-file "$TMP/$name.port" "$@" 2>"$SRV_LOG" &
    SRV_PID=$!
    PIDS+=("$SRV_PID")
    SRV_PORT=""
    for _ in $(seq 1 $((300 * SLACK))); do
        if [ -s "$TMP/$name.port" ]; then SRV_PORT=$(cat "$TMP/$name.port"); break; fi
        kill -0 "$SRV_PID" 2>/dev/null || break
        sleep 0.01
    done
    [ -n "$SRV_PORT" ]
}

# stop_server SIGNAL: sends it and waits (bounded); sets SRV_RC (124: did not exit).
stop_server() {
    kill -"$1" "$SRV_PID" 2>/dev/null || true
    SRV_RC=124
    for _ in $(seq 1 $((200 * SLACK))); do
        if ! kill -0 "$SRV_PID" 2>/dev/null; then
            SRV_RC=0
            wait "$SRV_PID" || SRV_RC=$?
            return 0
        fi
        sleep 0.01
    done
    kill -KILL "$SRV_PID" 2>/dev/null || true
}

url() { echo "http://127.0.0.1:$SRV_PORT$1"; }
code() { curl -s -o /dev/null -w '%{http_code}' --max-time $((5 * SLACK)) "$@" || true; }
post() { curl -s --max-time $((10 * SLACK)) -H 'Content-Type: application/json' "$@" || true; }
scrape() { curl -s --max-time $((5 * SLACK)) "$(url /metrics)" >"$1" || true; }
# metric FILE SERIES: the value of one series, or NaN when absent.
metric() { awk -v s="$2" '$1 == s { print $2; f = 1 } END { if (!f) print "NaN" }' "$1"; }
delta() { awk -v a="$1" -v b="$2" 'BEGIN { print b - a }'; }

# promtool 2.x lints vLLM's own metric names ("should not contain ':'", exit
# code 3); that complaint is the only one allowed. Parse errors exit 1.
promtool_ok() {
    local out rc=0
    out=$(promtool check metrics <"$1" 2>&1) || rc=$?
    [ "$rc" -eq 0 ] && return 0
    [ "$rc" -eq 3 ] && ! grep -qv "metric names should not contain ':'" <<<"$out"
}
# With the colon renamed away, promtool must find nothing at all to complain about.
promtool_strict() {
    local out rc=0
    out=$(sed -E 's/^(# (HELP|TYPE) )?vllm:/\1vllm_/' "$1" | promtool check metrics 2>&1) || rc=$?
    [ "$rc" -eq 0 ] && [ -z "$out" ] || { echo "    $out"; return 1; }
}

# stream_times URL BODY OUT: one line per SSE line, "<unix µs> <line>", stamped on arrival.
stream_times() {
    curl -sN --max-time $((10 * SLACK)) -H 'Content-Type: application/json' "$1" -d "$2" |
        while IFS= read -r line; do
            line=${line%$'\r'}
            [ -n "$line" ] && printf '%s %s\n' "$(now_us)" "$line"
        done >"$3" || true
}

M=fake-model
GEN="vllm:generation_tokens_total{model_name=\"$M\"}"
PROMPT="vllm:prompt_tokens_total{model_name=\"$M\"}"
SUCCESS="vllm:request_success_total{model_name=\"$M\",finished_reason=\"length\"}"
RUNNING="vllm:num_requests_running{model_name=\"$M\"}"
WAITING="vllm:num_requests_waiting{model_name=\"$M\"}"
KV="vllm:kv_cache_usage_perc{model_name=\"$M\"}"
TTFT_COUNT="vllm:time_to_first_token_seconds_count{model_name=\"$M\"}"

echo "# --help"
HELP=$("$EXE" --help) && ok "--help exits 0" || bad "--help exits 0"
check "--help lists options with defaults" grep -q -- '--max-batch N .*(default: 8)' <<<"$HELP"
RC=0; "$EXE" --no-such-flag 2>/dev/null || RC=$?
check "unknown flag is refused" [ "$RC" -ne 0 ]

echo "# loading: 20 MiB of weights at 40 MB/s (~524 ms) + 300 ms fixed delay"
head -c $((20 * 1024 * 1024)) /dev/urandom >"$TMP/weights.bin"
T0=$(now_us)
check "server starts and writes its port" start_server serve \
    --model "$M" --weights-file "$TMP/weights.bin" --weights-read-mbps 40 --load-delay-ms 300 \
    --tokens-per-second 50 --ttft-ms 20 --max-batch 8
check "log says listening port=N" grep -q "event=listening port=$SRV_PORT " "$SRV_LOG"
# Like vLLM, whose server listens once the engine is up: the port is bound
# (the port file is written) but connections are refused while loading.
RC=0; curl -s --max-time 5 -o /dev/null "$(url /health)" || RC=$?
check "connections are refused while loading (curl exit 7, is $RC)" [ "$RC" -eq 7 ]
READY_US=""
for _ in $(seq 1 $((500 * SLACK))); do
    if [ "$(code "$(url /health)")" = 200 ]; then READY_US=$(now_us); break; fi
    sleep 0.01
done
check "/health turns 200" [ -n "$READY_US" ]
READY_MS=$(( (${READY_US:-$T0} - T0) / 1000 ))
check "ready after about 824 ms (took $READY_MS ms)" between "$READY_MS" 750 $((1800 * SLACK))
LOAD_MS=$(sed -n 's/.*event=ready .*load_ms=\([0-9]*\).*/\1/p' "$SRV_LOG")
check "log event=ready load_ms close to 824 (is ${LOAD_MS:-none})" between "${LOAD_MS:-0}" 780 $((1200 * SLACK))
WLOAD_MS=$(sed -n 's/.*event=weights_loaded .*ms=\([0-9]*\).*/\1/p' "$SRV_LOG")
check "weights read at 40 MB/s: ~524 ms (is ${WLOAD_MS:-none})" between "${WLOAD_MS:-0}" 480 $((900 * SLACK))

echo "# --while-loading 503: answers 503 to everything until loaded"
MAIN_PID=$SRV_PID; MAIN_PORT=$SRV_PORT; MAIN_LOG=$SRV_LOG
check "a second server starts (--while-loading 503)" start_server loading503 \
    --model "$M" --load-delay-ms 3000 --while-loading 503
# One curl for both, so a slow machine still asks while loading.
check "/health and /v1/models are 503 while loading" \
    eq "$(curl -s --max-time 5 -o /dev/null -o /dev/null -w '%{http_code} ' "$(url /health)" "$(url /v1/models)" || true)" "503 503 "
stop_server TERM
SRV_PID=$MAIN_PID; SRV_PORT=$MAIN_PORT; SRV_LOG=$MAIN_LOG

echo "# OpenAI endpoints"
MODELS=$(curl -s --max-time 5 "$(url /v1/models)" || true)
check "/v1/models lists the model" eq "$(jq -r '.object + " " + .data[0].id + " " + .data[0].object' <<<"$MODELS")" "list $M model"

scrape "$TMP/m0"
# Non-stream completion: 25 tokens = 20 ms prefill + 24 × 20 ms ≈ 0.5 s.
OUT=$(post -w '\n%{time_total}' "$(url /v1/completions)" -d "{\"model\":\"$M\",\"prompt\":\"Say hello\",\"max_tokens\":25}")
BODY=$(head -n 1 <<<"$OUT")
SECS=$(tail -n 1 <<<"$OUT")
check "completion: usage.completion_tokens == max_tokens" eq "$(jq -r .usage.completion_tokens <<<"$BODY")" 25
check "completion: OpenAI shape" eq "$(jq -r '[.object, .model, (.id | startswith("cmpl-")), (.created > 0), .choices[0].finish_reason, (.choices[0].text | length > 0), .usage.total_tokens == .usage.prompt_tokens + 25] | map(tostring) | join(" ")' <<<"$BODY")" "text_completion $M true true length true true"
check "completion took about 25/50 s (took ${SECS}s)" between "$SECS" 0.45 $((2 * SLACK))

BODY=$(post "$(url /v1/completions)" -d "{\"model\":\"$M\",\"prompt\":\"x\",\"max_tokens\":5,\"thaw_prompt_tokens\":123}")
check "thaw_prompt_tokens sets usage.prompt_tokens" eq "$(jq -r .usage.prompt_tokens <<<"$BODY")" 123
BODY=$(post "$(url /v1/completions)" -d "{\"model\":\"$M\",\"prompt\":\"$(printf 'a%.0s' $(seq 1 40))\",\"max_tokens\":5}")
check "prompt tokens estimated at 4 chars/token" eq "$(jq -r .usage.prompt_tokens <<<"$BODY")" 10

BODY=$(post "$(url /v1/chat/completions)" -d "{\"model\":\"$M\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":7}")
check "chat: OpenAI shape and 7 tokens" eq "$(jq -r '[.object, .choices[0].message.role, .usage.completion_tokens, (.id | startswith("chatcmpl-"))] | map(tostring) | join(" ")' <<<"$BODY")" "chat.completion assistant 7 true"

# Streamed completion: 20 data chunks, one per token, ~20 ms apart, then [DONE].
stream_times "$(url /v1/completions)" "{\"model\":\"$M\",\"prompt\":\"hi\",\"max_tokens\":20,\"stream\":true}" "$TMP/s1"
DATA=$(grep -c ' data: {' "$TMP/s1" || true)
check "stream: 20 data chunks" eq "$DATA" 20
check "stream: ends with data: [DONE]" eq "$(tail -n 1 "$TMP/s1" | cut -d' ' -f2-)" "data: [DONE]"
check "stream: chunks are JSON text_completion with text" \
    eq "$(grep ' data: {' "$TMP/s1" | cut -d' ' -f3- | jq -rs 'map(.object == "text_completion" and (.choices[0].text | length > 0)) | all')" true
check "stream: only the last chunk has finish_reason" \
    eq "$(grep ' data: {' "$TMP/s1" | cut -d' ' -f3- | jq -rs 'map(.choices[0].finish_reason) | tostring')" \
    "[$(printf 'null,%.0s' $(seq 1 19))\"length\"]"
FIRST=$(grep ' data: {' "$TMP/s1" | head -n 1 | cut -d' ' -f1 || true)
LAST=$(grep ' data: {' "$TMP/s1" | tail -n 1 | cut -d' ' -f1 || true)
SPREAD_MS=$(( (${LAST:-0} - ${FIRST:-0}) / 1000 ))
check "stream: first to last chunk spread over ~380 ms (is $SPREAD_MS ms)" between "$SPREAD_MS" 270 $((2000 * SLACK))
GAPS=$( (grep ' data: {' "$TMP/s1" || true) | awk 'NR > 1 && $1 - p >= 5000 { n++ } { p = $1 } END { print n + 0 }')
check "stream: chunks arrive one by one ($GAPS of 19 gaps >= 5 ms)" between "$GAPS" 12 19

stream_times "$(url /v1/chat/completions)" "{\"model\":\"$M\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":10,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" "$TMP/s2"
check "chat stream: role chunk, 10 content chunks, usage chunk, [DONE]" \
    eq "$(grep ' data: ' "$TMP/s2" | cut -d' ' -f3- | sed 's/^\[DONE\]$/"DONE"/' | jq -rs '[.[0].choices[0].delta.role, ([.[1:11][] | select(.object == "chat.completion.chunk" and (.choices[0].delta.content | length > 0))] | length), .[11].usage.completion_tokens, .[12], length] | map(tostring) | join(" ")')" \
    "assistant 10 10 DONE 13"

scrape "$TMP/m1"
check "metrics: promtool check metrics (vLLM's ':' names aside)" promtool_ok "$TMP/m1"
check "metrics: promtool finds nothing else once ':' is renamed" promtool_strict "$TMP/m1"
check "metrics: generation_tokens_total grew by the 72 tokens generated" \
    eq "$(delta "$(metric "$TMP/m0" "$GEN")" "$(metric "$TMP/m1" "$GEN")")" 72
check "metrics: request_success_total grew by 6" \
    eq "$(delta "$(metric "$TMP/m0" "$SUCCESS")" "$(metric "$TMP/m1" "$SUCCESS")")" 6
check "metrics: prompt_tokens_total grew by 3+123+10+4+1+4" \
    eq "$(delta "$(metric "$TMP/m0" "$PROMPT")" "$(metric "$TMP/m1" "$PROMPT")")" 145
check "metrics: time_to_first_token histogram counted 6" \
    eq "$(delta "$(metric "$TMP/m0" "$TTFT_COUNT")" "$(metric "$TMP/m1" "$TTFT_COUNT")")" 6
QUEUE_COUNT="vllm:request_queue_time_seconds_count{model_name=\"$M\"}"
ITL_COUNT="vllm:inter_token_latency_seconds_count{model_name=\"$M\"}"
check "metrics: request_queue_time histogram counted 6" \
    eq "$(delta "$(metric "$TMP/m0" "$QUEUE_COUNT")" "$(metric "$TMP/m1" "$QUEUE_COUNT")")" 6
check "metrics: inter_token_latency histogram counted the 72 tokens less one per request" \
    eq "$(delta "$(metric "$TMP/m0" "$ITL_COUNT")" "$(metric "$TMP/m1" "$ITL_COUNT")")" 66

echo "# tokens count while they are generated"
post -o /dev/null "$(url /v1/completions)" -d '{"prompt":"x","max_tokens":50}' &
BG=$!
sleep 0.5
scrape "$TMP/m2"
wait "$BG" || true
scrape "$TMP/m3"
MID=$(delta "$(metric "$TMP/m1" "$GEN")" "$(metric "$TMP/m2" "$GEN")")
check "mid-request the counter shows part of the 50 tokens ($MID)" between "$MID" 8 42
check "after it, all 50" eq "$(delta "$(metric "$TMP/m1" "$GEN")" "$(metric "$TMP/m3" "$GEN")")" 50

echo "# errors"
BODY=$(post -w ' %{http_code}' "$(url /v1/completions)" -d '{"model":"other-model","prompt":"x"}')
check "wrong model: 404 with an OpenAI error" eq "$(jq -r '.error.type + " " + (.error.code | tostring)' <<<"${BODY% *}") ${BODY##* }" "NotFoundError 404 404"
check "bad JSON: 400" eq "$(code "$(url /v1/completions)" -d '{"prompt": ')" 400
check "max_tokens 0: 400" eq "$(code "$(url /v1/completions)" -d '{"prompt":"x","max_tokens":0}')" 400
check "unknown path: 404" eq "$(code "$(url /v2/nothing)")" 404
check "GET on a POST endpoint: 405" eq "$(code "$(url /v1/completions)")" 405
head -c $((2 * 1024 * 1024)) /dev/zero | tr '\0' 'a' >"$TMP/big"
check "2 MiB body: 413" eq "$(code "$(url /v1/completions)" --data-binary @"$TMP/big")" 413
check "still serving after that" eq "$(code "$(url /health)")" 200

echo "# batch of 8, the rest queued"
# One curl opens all 10 connections at once; 60 tokens keep them busy ~1.2 s.
URLS=()
for _ in $(seq 1 10); do URLS+=("$(url /v1/completions)"); done
curl -s --parallel --parallel-immediate --parallel-max 10 --max-time $((10 * SLACK)) \
    -o /dev/null -w '%{http_code}\n' -d '{"prompt":"x","max_tokens":60}' "${URLS[@]}" \
    >"$TMP/codes" 2>/dev/null &
BG=$!
for _ in $(seq 1 $((100 * SLACK))); do
    scrape "$TMP/m4"
    [ "$(metric "$TMP/m4" "$WAITING")" = 2.0 ] && break
    sleep 0.01
done
check "8 running" eq "$(metric "$TMP/m4" "$RUNNING")" 8.0
check "2 waiting" eq "$(metric "$TMP/m4" "$WAITING")" 2.0
check "kv_cache_usage_perc 1" between "$(metric "$TMP/m4" "$KV")" 0.999 1.001
wait "$BG" || true
check "all 10 answered 200" eq "$(grep -c '^200$' "$TMP/codes" || true)" 10
scrape "$TMP/m5"
check "then nothing running or waiting" eq "$(metric "$TMP/m5" "$RUNNING") $(metric "$TMP/m5" "$WAITING")" "0.0 0.0"

echo "# client disconnect mid-stream stops generation"
curl -sN --max-time 0.3 "$(url /v1/completions)" -d '{"prompt":"x","max_tokens":200,"stream":true}' >/dev/null 2>&1 || true
sleep 0.2
scrape "$TMP/m6"
sleep 0.4
scrape "$TMP/m7"
check "nothing running after the client left" eq "$(metric "$TMP/m6" "$RUNNING")" 0.0
check "generation stopped (counter still)" eq "$(metric "$TMP/m6" "$GEN")" "$(metric "$TMP/m7" "$GEN")"
check "it stopped early" between "$(delta "$(metric "$TMP/m5" "$GEN")" "$(metric "$TMP/m7" "$GEN")")" 1 40
check "log names the aborted request" grep -Eq 'event=(client_gone|request_aborted)' "$SRV_LOG"

echo "# SIGTERM"
stop_server TERM
check "exits 0 promptly on SIGTERM (rc $SRV_RC)" eq "$SRV_RC" 0

echo "# exporter-only mode"
check "exporter starts" start_server exporter --exporter-only --generation-rate 100 --models a,b=2500
check "/health 200 at once" eq "$(code "$(url /health)")" 200
check "no OpenAI API" eq "$(code "$(url /v1/completions)" -d '{"prompt":"x"}')" 404
A="vllm:generation_tokens_total{model_name=\"a\"}"
B="vllm:generation_tokens_total{model_name=\"b\"}"
S0=$(now_us); scrape "$TMP/e0"; S1=$(now_us)
sleep 2
S2=$(now_us); scrape "$TMP/e1"; S3=$(now_us)
SECS=$(awk -v a="$S0" -v b="$S1" -v c="$S2" -v d="$S3" 'BEGIN { print ((c + d) - (a + b)) / 2e6 }')
RATE_A=$(awk -v d="$(delta "$(metric "$TMP/e0" "$A")" "$(metric "$TMP/e1" "$A")")" -v s="$SECS" 'BEGIN { print d / s }')
RATE_B=$(awk -v d="$(delta "$(metric "$TMP/e0" "$B")" "$(metric "$TMP/e1" "$B")")" -v s="$SECS" 'BEGIN { print d / s }')
check "model a grows at ~100 tokens/s ($RATE_A)" between "$RATE_A" 85 115
check "model b grows at ~2500 tokens/s ($RATE_B)" between "$RATE_B" 2300 2700
check "exporter metrics pass promtool" promtool_ok "$TMP/e1"
check "exporter metrics strict" promtool_strict "$TMP/e1"
check "POST /admin/rate sets a rate" eq "$(code "$(url /admin/rate)" -d '{"model":"a","rate":1000}')" 200
check "POST /admin/rate unknown model: 404" eq "$(code "$(url /admin/rate)" -d '{"model":"zzz","rate":1}')" 404
check "POST /admin/rate negative rate: 400" eq "$(code "$(url /admin/rate)" -d '{"model":"a","rate":-5}')" 400
S0=$(now_us); scrape "$TMP/e2"; S1=$(now_us)
sleep 1
S2=$(now_us); scrape "$TMP/e3"; S3=$(now_us)
SECS=$(awk -v a="$S0" -v b="$S1" -v c="$S2" -v d="$S3" 'BEGIN { print ((c + d) - (a + b)) / 2e6 }')
RATE_A=$(awk -v d="$(delta "$(metric "$TMP/e2" "$A")" "$(metric "$TMP/e3" "$A")")" -v s="$SECS" 'BEGIN { print d / s }')
check "model a now at ~1000 tokens/s ($RATE_A)" between "$RATE_A" 880 1120
stop_server INT
check "exits 0 on SIGINT (rc $SRV_RC)" eq "$SRV_RC" 0

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
