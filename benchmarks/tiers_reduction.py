"""Accuracy of the two-tier reduction h(N, C) ≈ h₁(max(N, C·bpc)) against the tier simulator (issue 16 §3, first step).

Derivation (docs/estimators.md, "Two tiers"): the GPU (N blocks) and the host tier (C chunks of bpc blocks) see the
same request stream (native and LMCache write every prompt chunk through; a load allocates like a recompute); under
the characteristic-time approximation each holds a prefix block iff its age is below its own T_C, and a block is
served if either holds it, so the union behaves like the cache with the larger T_C, i.e. the larger capacity:
h(N, C) ≈ h₁(max(N, C·bpc)), with h₁ the single-tier hit ratio (here simulated with the compiled vLLM model; the
engine-aware estimator of docs/estimators.md can stand in for it). No parameter is fitted, so no part of the
trace is used for design. Known biases: the host tier has no T − 1 cap (native) and evicts by its own recency
rules; the GPU-hit chunks are not refreshed on the host after a load.

Run: ``python benchmarks/tiers_reduction.py [trace] [native|lmcache] [first n requests]`` (default: the Mooncake
conversation trace, native); prints the simulated surface, the reduction and the max / mean |error| over a grid
relative to the trace's distinct blocks U (HBM U/64 … U blocks, host 0 … 2U blocks).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from kvhit.sim.tiers.surface import hit_surface
from kvhit.sim.vllm.block import simulate_block, token_hit_ratio
from kvhit.workload.production import read_production

MOONCAKE = "/work/shared/data/traces/mooncake_fast25/conversation_trace.jsonl"
WEKA = "/work/shared/data/traces/weka_kv_cache_tester/traces"


def run(
    path: str = MOONCAKE,
    tier: str = "native",
    hbm_frac=(1 / 64, 1 / 16, 1 / 4, 1),
    host_frac=(0, 1 / 32, 1 / 8, 1 / 2, 2),
    n: int | None = None,
) -> dict:
    """Grid relative to the trace's distinct blocks U: HBM = U·hbm_frac blocks, host = U·host_frac/bpc units."""
    rq = read_production(path).to_block_requests()
    if n is not None:  # the first n requests (arrival order): the step-wise tier models are Python
        from kvhit.sim.runner import BlockRequests

        off = rq.hash_offsets[: n + 1]
        rq = BlockRequests(rq.prompt_tokens[:n], off, rq.hashes[: off[-1]], None, rq.block_size, rq.source)
    b = rq.block_size
    kw = {"chunk_tokens": 256} if tier == "lmcache" else {}
    bpc = 256 // b if tier == "lmcache" else 1
    if tier == "lmcache" and (256 % b):
        raise SystemExit(f"lmcache: 256-token chunks need a block size dividing 256, the trace has {b}")
    U = int(np.unique(rq.hashes).size)
    big = int(-(-rq.prompt_tokens.max() // b))
    hbm = sorted({max(big, int(U * f)) for f in hbm_frac})
    Cs = sorted({int(U * f / bpc) for f in host_frac})
    s = hit_surface(
        rq.prompt_tokens, rq.hash_offsets, rq.hashes, tier=tier, gpu_blocks=hbm, host=Cs, block_size=b, **kw
    )
    cache: dict[int, float] = {}

    def h1(n: int) -> float:
        if n not in cache:
            r = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=int(n), block_size=b)
            cache[n] = token_hit_ratio(r)
        return cache[n]

    est = np.array([[h1(max(N, C * bpc, 1)) for C in Cs] for N in hbm])
    err = est - s.hit
    return {
        "trace": path,
        "tier": tier,
        "requests": int(len(rq.prompt_tokens)),
        "block_size": b,
        "distinct_blocks": U,
        "hbm_blocks": hbm,
        "host_units": Cs,
        "sim": s.hit.round(4).tolist(),
        "reduction": est.round(4).tolist(),
        "max_abs_err": float(np.abs(err).max()),
        "mean_abs_err": float(np.abs(err).mean()),
    }


if __name__ == "__main__":
    a = sys.argv[1:]
    n = int(a[2]) if len(a) > 2 else None
    print(json.dumps(run(a[0] if a else MOONCAKE, a[1] if len(a) > 1 else "native", n=n), indent=1))
