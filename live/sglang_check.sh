#!/usr/bin/env bash
# kvhit replay --check against SGLang 0.5.23's own prefix-cache code (live/sglang_standin.py), request by request.
#
#   live/sglang_check.sh            (results in out/sglang/results.md and results.json)
#
# Builds or reuses the SGLang environment (conformance/make_env.sh sglang 0.5.23, cached in
# ~/.cache/kvhit-conformance), writes two multi-turn chat traces (live/workload.py, as make live), and for each
# setting starts a stand-in on 127.0.0.1 (a free port), replays the first $KVHIT_SGLANG_LIMIT (default 250)
# requests sequentially with a 200-token system prompt shared by every conversation, and requires 0 per-request
# mismatches between kvhit's SGLang model and the stand-in's cached_tokens (exit 0). Negative controls — kvhit
# simulating a pool twice the server's, or another eviction policy — must mismatch (exit 1). Each stand-in is
# stopped by its PID (its process group; trap on EXIT); nothing is left running.
#
# What this proves and what it does not: the stand-in is SGLang's radix tree, eviction policies and allocators,
# driven through one request's life as SGLang's scheduler drives it (transcribed; see its docstring) behind SGLang's
# HTTP shape. It is not SGLang's scheduler or server: no batching, chunked prefill, overlap scheduling or
# retraction, no model. A real SGLang server is validated with the same `kvhit replay --check` (docs/live.md).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${KVHIT_PY:-$root/.venv/bin/python}
read -r -a KVHIT <<<"${KVHIT_CMD:-$root/.venv/bin/kvhit}"
N=${KVHIT_SGLANG_LIMIT:-250}
out=$root/out/sglang
rm -rf "$out"
mkdir -p "$out"
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$root/.numba_cache}
t0=$(date +%s)
say() { printf '[sglang %4ss] %s\n' "$(($(date +%s) - t0))" "$*"; }

sg_py=$(conformance/make_env.sh sglang 0.5.23)
say "SGLang environment: $sg_py"

pid=""
stop() {
  [ -n "$pid" ] || return 0
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  pid=""
}
trap stop EXIT

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

"$PY" live/workload.py "$out/chat-a.parquet:1:80:60:8" "$out/chat-b.parquet:2:80:60:8" >"$out/workload.txt"
"$PY" live/shared_docs_trace.py "$out/docs.jsonl" 5 300 >>"$out/workload.txt"
cat "$out/workload.txt"

port=""
start() {  # name [stand-in flags...]
  local name=$1
  shift
  port=$(free_port)
  setsid "$sg_py" live/sglang_standin.py --port "$port" "$@" >"$out/standin-$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
      say "stand-in $name: $* (pid $pid)"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  echo "sglang_check: the stand-in $name did not start (see $out/standin-$name.log)" >&2
  return 1
}

fail=0
replay() {  # label expected_exit trace [kvhit replay flags...]
  local label=$1 want=$2 trace=$3 rc=0
  shift 3
  local src=(--trace "$out/$trace.parquet" --limit "$N" --system-prompt-tokens 200)
  # the shared-documents block-id trace: 300 requests, 16 tokens per block
  [ "$trace" = docs ] && src=(--blocks-trace "$out/docs.jsonl" --tokens-per-block 16)
  "${KVHIT[@]}" replay --endpoint "http://127.0.0.1:$port" --check --json "${src[@]}" \
    --log "$out/$label.parquet" "$@" >"$out/$label.json" 2>"$out/$label.err" || rc=$?
  echo "$rc" >"$out/$label.rc"
  if [ "$rc" != "$want" ]; then
    echo "sglang_check: kvhit replay $label exited $rc, expected $want (see $out/$label.err)" >&2
    tail -n 2 "$out/$label.err" >&2 || true
    fail=1
  fi
  say "replay $label: exit $rc (expected $want)"
}

# each setting: a stand-in, then the replays on it (the first is the check, the others negative controls).
# Pools of 4,096 tokens (moderate eviction: the first 250 requests need up to ~970 tokens) and of 1,024 (heavy: the
# largest request fills ~95 % of the pool).
for pool in 4096 1024; do
  start "p1-lru-$pool" --page-size 1 --max-total-tokens "$pool" --radix-eviction-policy lru
  replay "p1-lru-$pool" 0 chat-a
  replay "control-p1-lru-$pool-pool-x2" 1 chat-a --pool-tokens $((2 * pool))
  replay "control-p1-lru-$pool-as-mru" 1 chat-a --evict-policy mru
  stop
  for pol in fifo mru filo lfu slru priority; do
    start "p1-$pol-$pool" --page-size 1 --max-total-tokens "$pool" --radix-eviction-policy "$pol"
    replay "p1-$pol-$pool" 0 chat-a
    stop
  done
  start "p1-tlru-$pool" --page-size 1 --max-total-tokens "$pool" --radix-eviction-policy tlru \
    --radix-eviction-policy-config '{"threshold": 1024, "next_prompt_estimate": 256}'
  replay "p1-tlru-$pool" 0 chat-a
  stop
  for page in 4 16; do
    start "p$page-lru-$pool" --page-size "$page" --max-total-tokens "$pool"
    replay "p$page-lru-$pool" 0 chat-b
    [ "$page" = 16 ] && replay "control-p$page-lru-$pool-pool-x2" 1 chat-b --pool-tokens $((2 * pool))
    stop
  done
done
start p1-lru-4096-python-core --page-size 1 --max-total-tokens 4096 --tree-core python
replay p1-lru-4096-python-core 0 chat-b
stop
# shared documents (block ids) through a 1,024-token pool, where FIFO and T-LRU (budget 96) differ from LRU
for pol in lru fifo tlru lfu; do
  cfg=()
  [ "$pol" = tlru ] && cfg=(--radix-eviction-policy-config '{"threshold": 96, "next_prompt_estimate": 0}')
  start "docs-p1-$pol-1024" --page-size 1 --max-total-tokens 1024 --radix-eviction-policy "$pol" "${cfg[@]}"
  replay "docs-p1-$pol-1024" 0 docs
  [ "$pol" != lru ] && replay "control-docs-p1-$pol-1024-as-lru" 1 docs --evict-policy lru
  stop
done
start docs-p16-lru-1024 --page-size 16 --max-total-tokens 1024
replay docs-p16-lru-1024 0 docs
stop

"$PY" - "$out" "$(($(date +%s) - t0))" <<'EOF'
import json, sys
from pathlib import Path

out, wall = Path(sys.argv[1]), int(sys.argv[2])
rows = []
for f in sorted(out.glob("*.json")):
    if f.name == "results.json":
        continue
    d = json.loads(f.read_text())
    ck, s = d.get("check") or {}, d["server"]
    rows.append({
        "replay": f.stem, "exit": int((out / f"{f.stem}.rc").read_text()), "requests": d["completed"],
        "page": s["block_size"], "pool": s["pool_tokens"], "server_policy": s["radix_eviction_policy"],
        "simulated_policy": ck.get("evict_policy"), "simulated_pool": ck.get("pool_tokens"),
        "mismatches": ck.get("mismatching_requests"), "measured": ck.get("measured_token_hit_ratio"),
        "simulated": ck.get("simulated_token_hit_ratio"), "estimated": ck.get("estimated_token_hit_ratio"),
        "estimator_applies": ck.get("estimator_applies"),
        "counters_equal": d["counters"]["equal_to_per_request_sums"],
    })
# does the policy matter on this replay? kvhit's simulation of the same log under another policy (LRU for the
# other policies, MRU for LRU): requests that would differ (0: the check cannot tell the policy from that one)
import pyarrow.parquet as pq
from kvhit.replay.check import simulate_recorded_sglang

for r in rows:
    if r["replay"].startswith("control"):
        r["other_policy"], r["other_policy_differs"] = None, None
        continue
    t = pq.read_table(out / f"{r['replay']}.parquet").to_pydict()
    other = "mru" if r["server_policy"] == "lru" else "lru"
    sim = simulate_recorded_sglang(
        t["prompt_ids"], t["output_ids"], page_size=r["page"], pool_tokens=r["pool"], evict_policy=other
    )
    r["other_policy"] = other
    r["other_policy_differs"] = int(sum(int(a) != int(b) for a, b in zip(sim, t["cached_tokens"])))
    r["largest_request_tokens"] = max(a + b - 1 for a, b in zip(t["prompt_tokens"], t["completion_tokens"]))
(out / "results.json").write_text(json.dumps({"rows": rows, "wall_s": wall}, indent=1))
checks = [r for r in rows if not r["replay"].startswith("control")]
ctl = [r for r in rows if r["replay"].startswith("control")]
fmt = lambda x: "–" if x is None else f"{x:.4f}"
lines = [
    f"{len(checks)} checks, {sum(r['requests'] for r in checks):,} requests, "
    f"{sum(r['mismatches'] or 0 for r in checks)} per-request mismatches; {len(ctl)} controls "
    f"({sum(r['requests'] for r in ctl):,} requests), each mismatching: {all((r['mismatches'] or 0) > 0 for r in ctl)}; "
    f"{wall} s",
    "",
    "| replay | page | pool (tokens) | policy (server / kvhit) | requests | mismatches | measured | kvhit | estimator "
    "(applies) | counters = sums | under another policy |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]
for r in rows:
    pool = f"{r['pool']:,}" + ("" if r["simulated_pool"] == r["pool"] else f" (kvhit {r['simulated_pool']:,})")
    lines.append(
        f"| {r['replay']} | {r['page']} | {pool} | {r['server_policy']} / {r['simulated_policy']} | {r['requests']} | "
        f"{r['mismatches']} | {fmt(r['measured'])} | {fmt(r['simulated'])} | "
        + ("–" if r["estimated"] is None else f"{fmt(r['estimated'])} ({'yes' if r['estimator_applies'] else 'no'})")
        + f" | {r['counters_equal']} | "
        + ("–" if r["other_policy"] is None else f"{r['other_policy']}: {r['other_policy_differs']} differ")
        + " |"
    )
(out / "results.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
exit "$fail"
