"""All-capacity block curve (:mod:`kvhit.sim.vllm.curve`) vs one :func:`~kvhit.sim.vllm.block.simulate_block` run.

Builds the multi-turn trace of :mod:`bench_block` (``make_trace``: geometric turns / prompt / response
lengths, Poisson conversation arrivals; PD mode, block size 16) with at least ``min_accesses`` block
accesses, then times in the same process, after a warm-up call of each (numba compile / cache load):

* ``block_curve(..., fallback="stack")`` at ``n_capacities`` capacities evenly spread over
  ``[N_min, N_max]`` (``N_min = max_r ceil(T_r / b)``, below which requests are rejected; ``N_max`` = the
  largest finite threshold, from which on the curve is flat): one threshold pass + bucketing;
* ONE ``simulate_block`` run at the median capacity of that grid (instantaneous requests).

Reports both times and their ratio (issue floor: curve ≤ 3× one simulation), and checks the curve against
``simulate_block`` at a few capacities.

Run: ``NUMBA_CACHE_DIR=/tmp/numba_cache python benchmarks/bench_curve_block.py``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_block import _prefix, make_trace  # noqa: E402
from kvhit.sim.vllm.block import block_hit_ratio, simulate_block  # noqa: E402
from kvhit.sim.vllm.curve import block_curve, block_hit_thresholds  # noqa: E402


def run(seed: int = 0, min_accesses: int = 2_000_000, n_capacities: int = 1000, repeats: int = 3) -> dict:
    tr = make_trace(seed, min_accesses)
    b = tr["block_size"]
    T, off, hs = tr["T"], tr["off"], tr["hashes"]
    n_min = int((-(-T // b)).max())
    thr0 = block_hit_thresholds(T, off, hs, block_size=b)  # untimed: locate the saturation capacity
    finite = thr0.thresholds[thr0.thresholds < np.iinfo(np.int64).max]
    n_max = int(finite.max()) if finite.size else n_min + n_capacities
    Ns = np.unique(np.linspace(n_min, n_max, n_capacities).astype(np.int64))
    N_mid = int(Ns[len(Ns) // 2])

    small = _prefix(tr, 2000)
    block_curve(small["T"], small["off"], small["hashes"], block_size=b, Ns=Ns[:10], fallback="stack")
    simulate_block(small["T"], small["off"], small["hashes"], N=N_mid, block_size=b)

    t_curve, t_thr, t_sim = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        cur = block_curve(T, off, hs, block_size=b, Ns=Ns, fallback="stack")
        t_curve.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        thr = block_hit_thresholds(T, off, hs, block_size=b)
        t_thr.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        res = simulate_block(T, off, hs, N=N_mid, block_size=b)
        t_sim.append(time.perf_counter() - t0)

    checks = {}
    for N in (int(Ns[0]), int(Ns[len(Ns) // 10]), N_mid, int(Ns[-1])):
        r = res if N == N_mid else simulate_block(T, off, hs, N=N, block_size=b)
        k = int(np.flatnonzero(Ns == N)[0])
        checks[N] = {
            "h_sim": block_hit_ratio(r),
            "h_curve": float(cur["block_hit_ratio"][k]),
            "equal": bool(np.array_equal(r.hit_blocks, thr.hit_blocks(N))),
        }
    accesses = int((-(-T // b)).sum())
    curve_s, sim_s = min(t_curve), min(t_sim)
    return {
        "n_requests": int(T.size),
        "block_accesses": accesses,
        "full_block_hashes": int(hs.size),
        "block_size": b,
        "n_capacities": int(Ns.size),
        "N_range": [int(Ns[0]), int(Ns[-1])],
        "all_certified_exact": bool(cur["exact"].all()),
        "ambiguous_events": thr.n_ambiguous_events,
        "curve_seconds": curve_s,
        "thresholds_seconds": min(t_thr),
        "one_simulation_seconds": sim_s,
        "simulation_N": N_mid,
        "curve_over_one_simulation": curve_s / sim_s,
        "simulations_equivalent_speedup": Ns.size * sim_s / curve_s,
        "checks": checks,
    }


def main() -> None:
    print(json.dumps(run(), indent=2))


if __name__ == "__main__":
    main()
