"""Throughput of the fleet simulator (:mod:`kvhit.fleet.simulate`) against the single-replica simulator, same run.

On :func:`bench_block.make_trace` (synthetic multi-turn, ~2·10^6 block accesses), times:

* the single-replica compiled simulator :func:`kvhit.sim.vllm.block.simulate_block` at ``N = R·n`` (baseline);
* the fleet's fast path (route, then the compiled simulator per replica) for round-robin and session affinity at
  R = 8 replicas of ``n`` blocks;
* the step-wise path (Python engines; the path every load- or cache-aware router takes) on a 5,000-request prefix,
  against the single-replica Python engine (:func:`kvhit.sim.engine.replay` on one pool of ``R·n`` blocks) on the
  same prefix, and against the compiled single-replica simulator.

Unit: ``block_ops`` (:mod:`kvhit.sim.vllm.block`; the Python pools count the same probes, touches, allocations and
frees — for KV-aware routers the router's own cache probes are counted too); the ratios reported are (fleet s per
block op) / (single-replica s per block op) — the issue's target is ≤ 2.

Run: ``NUMBA_CACHE_DIR=.numba_cache python benchmarks/bench_fleet.py``.
"""

from __future__ import annotations

import json
import time

import numpy as np

from bench_block import _prefix, make_trace
from kvhit.fleet.simulate import simulate_fleet
from kvhit.sim.engine import Request, replay
from kvhit.sim.registry import make_engine
from kvhit.sim.vllm.block import simulate_block


def _time(f, reps=3):
    best, out = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run(min_accesses: int = 2_000_000, R: int = 8, n_per: int = 2_000, step_n: int = 5_000) -> dict:
    tr = make_trace(min_accesses=min_accesses)
    b = tr["block_size"]
    args = (tr["T"], tr["off"], tr["hashes"])
    simulate_block(*args, N=R * n_per, block_size=b)  # compile / load the cache
    t1, r1 = _time(lambda: simulate_block(*args, N=R * n_per, block_size=b))
    out = {
        "requests": int(tr["T"].size),
        "replicas": R,
        "N_per_replica": n_per,
        "single_block_ops_per_s": r1.block_ops / t1,
    }
    for router in ("round-robin", "session"):
        tf, rf = _time(
            lambda router=router: simulate_fleet(*args, tr["conv"], Ns=[n_per] * R, block_size=b, router=router)
        )
        out[f"fleet_{router}_block_ops_per_s"] = rf.block_ops / tf
        out[f"fleet_{router}_slowdown_per_block_op"] = (tf / rf.block_ops) / (t1 / r1.block_ops)
        out[f"fleet_{router}_token_hit_ratio"] = rf.token_hit_ratio()
    p = _prefix(tr, step_n)
    eng = make_engine("vllm", R * n_per, block_size=b)
    hs = [tuple(int(x) for x in p["hashes"][p["off"][r] : p["off"][r + 1]]) for r in range(step_n)]
    reqs = [Request(rid=r, prompt_tokens=int(p["T"][r]), block_hashes=hs[r]) for r in range(step_n)]
    t0 = time.perf_counter()
    replay(eng, reqs)
    t_eng = time.perf_counter() - t0
    s_per_op_eng = t_eng / eng.pool.ops
    out["single_python_engine_block_ops_per_s"] = 1.0 / s_per_op_eng
    for router in ("round-robin", "dynamo", "llm-d"):
        ts, rs = _time(
            lambda router=router: simulate_fleet(
                p["T"], p["off"], p["hashes"], p["conv"], Ns=[n_per] * R, block_size=b, router=router, fast=False
            ),
            reps=1,
        )
        out[f"stepwise_{router}_requests_per_s"] = step_n / ts
        out[f"stepwise_{router}_slowdown_vs_python_engine"] = (ts / rs.block_ops) / s_per_op_eng
        out[f"stepwise_{router}_slowdown_vs_compiled"] = (ts / rs.block_ops) / (t1 / r1.block_ops)
    return out


def main() -> None:
    print(json.dumps(run(), indent=2))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
