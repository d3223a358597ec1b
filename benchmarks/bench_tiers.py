"""Speed of the host-tier models (:mod:`kvhit.sim.tiers`) beside the single-tier simulator, same trace, same run.

Trace: prefixes of the synthetic multi-turn trace of ``bench_block`` (block size 16, GPU at ~50 blocks per request of
the prefix, DRAM at 4× the GPU; LMCache in 256-token chunks, so ``C / 16`` chunks). Two parts:

* **step-wise** (``n`` = 4,000 requests): :class:`~kvhit.sim.vllm.engine.VllmEngine` and the tiered engines through
  :func:`~kvhit.sim.engine.replay` (plain Python), and the compiled pass of each tier
  (:func:`kvhit.sim.tiers.surface.compiled_tier_pass`), **asserted equal request by request** (GPU and CPU hit
  tokens, rejections) to the step-wise replay on this trace;
* **compiled growth** (4,000 / 32,000 / 256,000 requests; ``KVHIT_BENCH_LARGE=1`` adds 1,024,000): per size, the
  compiled GPU-only pass (:func:`~kvhit.sim.vllm.block.simulate_block`) and each tier's compiled pass, best of 3,
  timed alternately.
  ``<tier>_ratio`` = the tier pass's time over the GPU-only pass's on the same requests and GPU size — the cost per
  block op relative to the compiled single replica (same block accesses ``Σ ⌈T/b⌉`` on both sides). For native and
  LMCache the tier pass *contains* the GPU-only pass (their GPU hits do not depend on the host tier), so their ratio
  is 1 + the host pass's share, which is also given alone (``host_<tier>_ratio``: LMCache's host pass works per
  256-token chunk, hence far below 1). simple and simple-lazy run their own two block pools.

Throughput in block accesses per second (``Σ ceil(T/b)``). Run: ``python benchmarks/bench_tiers.py`` (or
``python benchmarks/run.py tiers``).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from bench_block import make_trace
from kvhit.sim.engine import replay, requests_from_stream
from kvhit.sim.tiers import make_tiered
from kvhit.sim.tiers.lmcache_fast import lmcache_lookup_pass_compiled
from kvhit.sim.tiers.native_fast import native_lru_host_pass
from kvhit.sim.tiers.surface import compiled_tier_pass
from kvhit.sim.vllm.block import simulate_block
from kvhit.sim.vllm.engine import VllmEngine

TIERS = ("native", "lmcache", "simple", "simple-lazy")


def _sizes(T, b):
    """GPU blocks (~50 per request, at least the largest request) and host units (4× the GPU)."""
    acc = int((-(-T // b)).sum())
    N = max(acc // len(T) * 50, int(-(-T.max() // b)))
    return N, 4 * N


def _host(tier, C):
    return C // 16 if tier == "lmcache" else C


def _best(f, k=3):
    f()  # warm: compile or load the numba cache
    best = float("inf")
    for _ in range(k):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def _ratio(fbase, f, k=3):
    """Best-of-``k`` times of ``f`` and of the baseline, timed alternately (the machine's load drifts)."""
    fbase()
    f()
    tb = tf = float("inf")
    for _ in range(k):
        t0 = time.perf_counter()
        fbase()
        t1 = time.perf_counter()
        f()
        t2 = time.perf_counter()
        tb, tf = min(tb, t1 - t0), min(tf, t2 - t1)
    return tf / tb, tb, tf


def _prefix(tr, n):
    T = tr["T"][:n]
    off = tr["off"][: n + 1]
    return T, off, tr["hashes"][: off[-1]]


def run(n: int = 4000, sizes=(4_000, 32_000, 256_000)) -> dict:
    if os.environ.get("KVHIT_BENCH_LARGE"):
        sizes = (*sizes, 1_024_000)
    b = 16
    tr = make_trace(seed=0, min_accesses=int(max(sizes) * 80))
    T, off, h = _prefix(tr, n)
    acc = int((-(-T // b)).sum())
    N, C = _sizes(T, b)
    reqs = requests_from_stream(T, off, h)
    out: dict = {"requests": n, "block_accesses": acc, "gpu_blocks": N, "host_units": C}

    base = _best(lambda: simulate_block(T, off, h, N=N, block_size=b))
    out["compiled_gpu_only_acc_per_s"] = acc / base
    t0 = time.perf_counter()
    replay(VllmEngine(N, block_size=b), reqs)
    dt = time.perf_counter() - t0
    out["stepwise_gpu_only_acc_per_s"] = acc / dt
    out["stepwise_gpu_only_slowdown_vs_compiled"] = dt / base
    for tier in TIERS:
        e = make_tiered(tier, gpu_blocks=N, host_capacity=_host(tier, C), block_size=b)
        t0 = time.perf_counter()
        r = replay(e, reqs)
        dt = time.perf_counter() - t0
        out[f"stepwise_{tier}_acc_per_s"] = acc / dt
        out[f"stepwise_{tier}_slowdown_vs_compiled"] = dt / base
        out[f"{tier}_token_hit"] = float(r.hit_tokens.sum() / T.sum())
        g, c, rej = compiled_tier_pass(T, off, h, tier=tier, N=N, C=_host(tier, C), block_size=b)
        want = [None if o is None else (o.gpu_hit_tokens, o.cpu_hit_tokens) for o in r.outcomes]
        got = [None if rej[i] else (int(g[i]), int(c[i])) for i in range(n)]
        assert got == want, f"compiled {tier} pass differs from the step-wise model"
        out[f"{tier}_compiled_equals_stepwise"] = True
    out["gpu_only_token_hit"] = float(simulate_block(T, off, h, N=N, block_size=b).hit_tokens.sum() / T.sum())

    rows = []
    for m in sizes:
        T, off, h = _prefix(tr, m)
        acc = int((-(-T // b)).sum())
        N, C = _sizes(T, b)
        row = {"requests": m, "block_accesses": acc, "gpu_blocks": N, "host_units": C}
        res = simulate_block(T, off, h, N=N, block_size=b)
        g = res.hit_blocks.astype(np.int64) * b
        adm = ~res.rejected

        def gpu_only(T=T, off=off, h=h, N=N):
            return simulate_block(T, off, h, N=N, block_size=b)

        bases = []
        for tier in TIERS:
            ratio, tb, tf = _ratio(
                gpu_only,
                lambda T=T, off=off, h=h, N=N, C=C, tier=tier: compiled_tier_pass(
                    T, off, h, tier=tier, N=N, C=_host(tier, C), block_size=b
                ),
            )
            row[f"{tier}_s"] = tf
            row[f"{tier}_ratio"] = ratio
            bases.append(tb)
        row["host_native_ratio"] = _ratio(
            gpu_only,
            lambda: native_lru_host_pass(T, off, h, g, adm, C=C, block_size=b),  # noqa: B023
        )[0]
        row["host_lmcache_ratio"] = _ratio(
            gpu_only,
            lambda: lmcache_lookup_pass_compiled(T, off, h, adm, C=C // 16, block_size=b),  # noqa: B023
        )[0]
        row["gpu_only_s"] = min(bases)
        row["gpu_only_acc_per_s"] = acc / min(bases)
        rows.append(row)
    out["growth"] = rows
    out["load_average_1min"] = os.getloadavg()[0]
    return out


def render(res: dict) -> str:
    lines = [
        f"  {k:<44} {v:,.4g}" if isinstance(v, float) else f"  {k:<44} {v}" for k, v in res.items() if k != "growth"
    ]
    lines.append("  compiled passes, time / compiled GPU-only time on the same requests (best of 3):")
    lines.append(
        "  requests   block acc.  GPU-only acc/s  native  lmcache  simple  simple-lazy  | host only: native  lmcache"
    )
    for r in res["growth"]:
        lines.append(
            f"  {r['requests']:>9,} {r['block_accesses']:>11,} {r['gpu_only_acc_per_s']:>14,.0f}"
            f"  {r['native_ratio']:>6.2f}  {r['lmcache_ratio']:>7.2f}  {r['simple_ratio']:>6.2f}"
            f"  {r['simple-lazy_ratio']:>11.2f}  | {r['host_native_ratio']:>17.2f}  {r['host_lmcache_ratio']:>7.3f}"
        )
    return "\n".join(lines)


def main() -> None:
    res = run()
    print(render(res))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
