"""Speed of the host-tier models (:mod:`kvhit.sim.tiers`) beside the single-tier simulator, same trace, same run.

The tier models are step-wise plain Python; the GPU side of a surface is the compiled
:func:`kvhit.sim.vllm.block.simulate_block`, and the native tier's host pass has a compiled twin. Timed on a prefix of
the synthetic multi-turn trace of ``bench_block`` (``n`` requests, block size 16, GPU at a quarter of the working
set, DRAM at 4x):

* ``compiled_gpu_only`` – :func:`simulate_block` (numba, warm);
* ``stepwise_gpu_only`` – :class:`~kvhit.sim.vllm.engine.VllmEngine` through :func:`~kvhit.sim.engine.replay`;
* ``tiered_<tier>`` – :class:`~kvhit.sim.tiers.TieredEngine` replays (GPU + host, Python);
* ``host_pass_native`` – the host tier alone driven by the compiled GPU hits (Python);
* ``host_pass_native_compiled`` – the same pass compiled (:mod:`kvhit.sim.tiers.native_fast`; what the surface
  runs per pair for LRU without a store threshold), asserted equal to the Python pass.

Throughput in block accesses per second (``Σ ceil(T/b)``), ratios against ``compiled_gpu_only``.
Run: ``python benchmarks/bench_tiers.py``.
"""

from __future__ import annotations

import json
import time

import numpy as np

from bench_block import make_trace
from kvhit.sim.engine import replay, requests_from_stream
from kvhit.sim.tiers import make_tiered
from kvhit.sim.tiers.native_fast import native_lru_host_pass
from kvhit.sim.tiers.surface import host_pass
from kvhit.sim.vllm.block import simulate_block
from kvhit.sim.vllm.engine import VllmEngine


def run(n: int = 4000) -> dict:
    tr = make_trace(seed=0, min_accesses=200_000)
    b = tr["block_size"]
    T = tr["T"][:n]
    off = tr["off"][: n + 1]
    h = tr["hashes"][: off[-1]]
    acc = int((-(-T // b)).sum())
    N = max(int(-(-T.max() // b)), acc // n * 50)
    C = 4 * N
    reqs = requests_from_stream(T, off, h)
    out: dict = {"requests": n, "block_accesses": acc, "gpu_blocks": N, "host_units": C}

    simulate_block(T, off, h, N=N, block_size=b)  # warm
    t0 = time.perf_counter()
    res = simulate_block(T, off, h, N=N, block_size=b)
    base = time.perf_counter() - t0
    out["compiled_gpu_only_acc_per_s"] = acc / base

    t0 = time.perf_counter()
    replay(VllmEngine(N, block_size=b), reqs)
    dt = time.perf_counter() - t0
    out["stepwise_gpu_only_acc_per_s"] = acc / dt
    out["stepwise_gpu_only_slowdown_vs_compiled"] = dt / base

    for tier in ("native", "lmcache", "simple", "simple-lazy"):
        e = make_tiered(tier, gpu_blocks=N, host_capacity=C if tier != "lmcache" else C // 16, block_size=b)
        t0 = time.perf_counter()
        r = replay(e, reqs)
        dt = time.perf_counter() - t0
        out[f"tiered_{tier}_acc_per_s"] = acc / dt
        out[f"tiered_{tier}_slowdown_vs_compiled"] = dt / base
        out[f"tiered_{tier}_token_hit"] = float(r.hit_tokens.sum() / T.sum())
    g = res.hit_blocks.astype(np.int64) * b
    t0 = time.perf_counter()
    host_pass(reqs, g, ~res.rejected, tier="native", C=C, b=b)
    dt = time.perf_counter() - t0
    out["host_pass_native_acc_per_s"] = acc / dt
    out["host_pass_native_slowdown_vs_compiled"] = dt / base
    c_py = host_pass(reqs, g, ~res.rejected, tier="native", C=C, b=b)
    native_lru_host_pass(T, off, h, g, ~res.rejected, C=C, block_size=b)  # warm (compile or load the cache)
    t0 = time.perf_counter()
    c_fast = native_lru_host_pass(T, off, h, g, ~res.rejected, C=C, block_size=b)
    dt = time.perf_counter() - t0
    assert np.array_equal(c_fast, c_py), "compiled native host pass differs from the Python tier"
    out["host_pass_native_compiled_acc_per_s"] = acc / dt
    out["host_pass_native_compiled_slowdown_vs_compiled"] = dt / base
    out["gpu_only_token_hit"] = float(res.hit_tokens.sum() / T.sum())
    return out


def main() -> None:
    print(json.dumps(run(), indent=2))


if __name__ == "__main__":
    main()
