"""Benchmark: compiled whole-content LRU (Algorithm 1) vs the OrderedDict reference, and the all-capacity
curve (one threshold pass) vs one single-capacity simulation.

Run:  NUMBA_CACHE_DIR=/tmp/numba_cache python benchmarks/bench_content.py [n_events] [seed]

Floors (2-core machine): ≥ 10 M events/s compiled, ≥ 50× the reference, 1,000-capacity curve ≤ 3× one
single-capacity simulation.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from kvhit.sim.content.lru import simulate_content
from kvhit.sim.content.reference import simulate_content_reference
from kvhit.sim.content.stackdist import FIRST_TURN, content_curve, content_hit_thresholds


def synthetic_stream(
    n_events: int = 1_000_000,
    seed: int = 0,
    *,
    lam0: float = 1.0,
    p_continue: float = 0.8,
    mean_gap: float = 60.0,
    mean_z1: float = 20.0,
    mean_z: float = 8.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Multi-turn event stream ``(conv, R, time)`` of exactly ``n_events`` turns, sorted by time.

    Poisson conversation arrivals (rate ``lam0``), geometric turn counts ``M`` (continuation probability
    ``p_continue``), geometric increments ``Z_1`` / ``Z_j`` (means ``mean_z1`` / ``mean_z``), exponential
    prompt interarrival times ``W`` (mean ``mean_gap``); ``R_j = Σ_{ℓ≤j} Z_ℓ`` (eq. (1)). The stream is the
    earliest ``n_events`` turns of ``ceil(1.2·n_events·(1-p))`` conversations, which keeps it valid.
    """
    rng = np.random.default_rng(seed)
    q = 1.0 - p_continue
    C = int(np.ceil(1.2 * n_events * q)) + 16
    M = rng.geometric(q, size=C)
    n_all = int(M.sum())
    while n_all < n_events:  # pragma: no cover - only for tiny inputs
        M = np.concatenate([M, rng.geometric(q, size=C)])
        n_all = int(M.sum())
    C = M.shape[0]
    start = np.cumsum(rng.exponential(1.0 / lam0, size=C))
    conv = np.repeat(np.arange(C, dtype=np.int64), M)
    first = np.zeros(n_all, dtype=bool)
    offs = np.concatenate([[0], np.cumsum(M)[:-1]])
    first[offs] = True
    # per-turn increments and gaps; segmented cumulative sums per conversation
    Z = rng.geometric(1.0 / mean_z, size=n_all).astype(np.int64)
    Z[first] = rng.geometric(1.0 / mean_z1, size=C)
    gap = rng.exponential(mean_gap, size=n_all)
    gap[first] = start
    cz = np.cumsum(Z)
    R = cz - np.repeat(cz[offs] - Z[offs], M)
    cg = np.cumsum(gap)
    t = cg - np.repeat(cg[offs] - gap[offs], M)
    order = np.argsort(t, kind="stable")[:n_events]
    return conv[order], R[order], t[order]


def _best_of(fn, repeats: int) -> tuple[float, object]:
    best = float("inf")
    out = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run(n_events: int = 1_000_000, seed: int = 0, *, n_capacities: int = 1000, repeats: int = 3) -> dict:
    """Time the compiled simulator, the OrderedDict reference and the all-capacity curve on one trace."""
    t0 = time.perf_counter()
    conv, R, _t = synthetic_stream(n_events, seed)
    gen_s = time.perf_counter() - t0
    n = conv.shape[0]

    # capacity with a mid-range hit ratio: median of the finite hit thresholds
    thr = content_hit_thresholds(conv, R)
    finite = thr[thr != FIRST_TURN]
    N_single = int(np.median(finite))
    Ns = np.unique(np.linspace(0, int(np.quantile(finite, 0.99)), n_capacities).astype(np.int64))
    Ns = np.union1d(Ns, [N_single])
    if Ns.shape[0] > n_capacities:
        Ns = np.delete(Ns, 1 if Ns[1] != N_single else 2)

    # warm-up (compiles or loads the numba cache)
    small = slice(0, min(n, 1000))
    simulate_content(conv[small], R[small], N_single)
    content_curve(conv[small], R[small], None, Ns)

    sim_s, res = _best_of(lambda: simulate_content(conv, R, N_single), repeats)
    ref_s, ref = _best_of(lambda: simulate_content_reference(conv, R, N_single), 1)
    curve_s, curve = _best_of(lambda: content_curve(conv, R, None, Ns), repeats)
    thr_s, _ = _best_of(lambda: content_hit_thresholds(conv, R), repeats)

    agree_ref = bool(np.array_equal(res.hit, ref.hit) and res.evictions == ref.evictions)

    # secondary: compiled vs reference at the quartile capacities (eviction-heavier / lighter regimes)
    by_capacity = {}
    for q in (0.25, 0.75):
        Nq = int(np.quantile(finite, q))
        sq, rq = _best_of(lambda Nq=Nq: simulate_content(conv, R, Nq), repeats)
        fq, _ = _best_of(lambda Nq=Nq: simulate_content_reference(conv, R, Nq), 1)
        by_capacity[f"q{int(q * 100)}"] = {
            "N": Nq,
            "hit_ratio": rq.hit_ratio,
            "compiled_events_per_s": n / sq,
            "speedup_vs_reference": fq / sq,
        }
    agree_curve = int(curve[np.searchsorted(Ns, N_single)]) == res.reused_blocks

    out = {
        "n_events": n,
        "n_conversations": int(np.unique(conv).shape[0]),
        "generate_s": gen_s,
        "N_single": N_single,
        "hit_ratio_at_N_single": res.hit_ratio,
        "n_capacities": int(Ns.shape[0]),
        "compiled_s": sim_s,
        "compiled_events_per_s": n / sim_s,
        "reference_s": ref_s,
        "reference_events_per_s": n / ref_s,
        "speedup_vs_reference": ref_s / sim_s,
        "curve_s": curve_s,
        "thresholds_s": thr_s,
        "curve_over_single_ratio": curve_s / sim_s,
        "compiled_equals_reference": agree_ref,
        "other_capacities": by_capacity,
        "curve_equals_simulation_at_N_single": agree_curve,
    }
    out["floors_met"] = {
        "compiled>=10M_events_per_s": out["compiled_events_per_s"] >= 1e7,
        "speedup>=50x": out["speedup_vs_reference"] >= 50,
        "curve<=3x_single": out["curve_over_single_ratio"] <= 3,
    }
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    n_events = int(argv[0]) if argv else 1_000_000
    seed = int(argv[1]) if len(argv) > 1 else 0
    r = run(n_events, seed)
    for k, v in r.items():
        if isinstance(v, float):
            print(f"{k:40s} {v:,.6g}")
        else:
            print(f"{k:40s} {v}")


if __name__ == "__main__":
    main()
