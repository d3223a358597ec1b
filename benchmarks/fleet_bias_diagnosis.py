"""Where the block-id fleet replay mean's miss on ``held-35new`` came from (issue 23 §5, docs/estimators.md §6).

``fleet simulate --blocks-trace`` answers with the mean of K = 16 exact fleet replays at redrawn session starts
(:func:`kvhit.fleet.blocks.fleet_replays_blocks`, generator seed ``--seed`` = 0). ``fleet_blocks_accuracy.py --only
replay`` measured, on ``held-35new`` with Poisson starts, the mean over start seeds 0–7 of that answer 0.018–0.031
below the simulated mean. Two controlled comparisons, per (pool, arrival, R, router), at N = N_min · {1, 1.5, 2}:

* ``law``: the replays' start law (``cur``: C draws uniform on the observed range widened by one mean spacing,
  sorted, observed order kept) against the exact conditional law of both benchmark arms given the order and the
  first and last start (``pinned``: first and last kept, the C − 2 others uniform between them — for i.i.d. uniform
  starts (min, max) is sufficient and for the benchmark's Poisson arm the inner arrivals given the last are uniform,
  so the mean of ``pinned`` replays is unbiased for E[h] by the tower rule). Common random numbers: ``pinned`` is
  ``cur``'s draw with its inner points rescaled onto [first, last], so ``cur − pinned`` is the law's effect alone.
* ``seed``: the replays' generator seed shared by every realisation (0, 1, 2, … as the benchmark and ``fleet
  simulate`` do) against a seed per realisation (``indep``: 1000 + start seed). Under the Poisson arm every
  realisation has the same order, so with a shared seed every realisation replays the *same* 16 start patterns
  (rescaled to its span): the mean over realisations keeps one 16-replay Monte Carlo error, ≈ s/√16, that the
  benchmark's paired standard error (from per-seed differences) does not see.

Printed per row: the simulated mean over ``--sim-seeds`` realisations ± its standard error; for each mode the gap
(mean over ``--seeds`` realisations of the replays' mean − simulated mean); ``s/√K`` (the Monte Carlo error of one
answer, mean over realisations); ``cur − pinned`` ± its standard error.

    NUMBA_CACHE_DIR=.numba_cache PYTHONPATH=src nice -n 10 python benchmarks/fleet_bias_diagnosis.py \\
        --pools held-35new --arrivals poisson --configs 2:session 2:round-robin --seed-modes 0 1 2 3 indep --law
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agentic_accuracy import band_pools, compose, realisation_starts  # noqa: E402
from fleet_blocks_accuracy import FRESH_POOL_SEED, NEW_POOL_SEED  # noqa: E402
from kvhit.estimate.band import keep_order, restart_sessions, session_starts  # noqa: E402
from kvhit.fleet.blocks import _fleet_ratios, fleet_replays_blocks  # noqa: E402


def pools() -> tuple:
    _, _, base, draws_a = [p for p in band_pools(True) if p[0] == "held-35a"][0]
    Ch = int(base.session.max()) + 1
    return base, {
        "held-35a": draws_a,
        "held-35new": np.random.default_rng(NEW_POOL_SEED).integers(0, Ch, 35),
        "held-35fresh": np.random.default_rng(FRESH_POOL_SEED).integers(0, Ch, 35),
    }


def law_compare(pt, fr, K: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Means of K replays under ``cur`` and under ``pinned`` (common random numbers, module docstring)."""
    f = session_starts(pt)
    C = f.shape[0]
    lo, hi = float(f.min()), float(f.max())
    d = (hi - lo) / (C - 1)
    rng = np.random.default_rng(seed)
    hc, hp = [], []
    for _ in range(K):
        x = np.sort(rng.uniform(lo - d, hi + d, C))
        xp = lo + (x - x[0]) / (x[-1] - x[0]) * (hi - lo)
        hc.append(fr(restart_sessions(pt, keep_order(f, x))))
        hp.append(fr(restart_sessions(pt, keep_order(f, xp))))
    return np.mean(hc, 0), np.mean(hp, 0)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pools", nargs="+", default=["held-35new"], choices=["held-35a", "held-35new", "held-35fresh"])
    ap.add_argument("--arrivals", nargs="+", default=["poisson"], choices=["uniform", "poisson"])
    ap.add_argument("--configs", nargs="+", default=["2:session"], help="R:router (oblivious routers, no holds)")
    ap.add_argument("--sim-seeds", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=16, help="realisations the replays start from (0 … seeds − 1)")
    ap.add_argument("--replays", type=int, default=16)
    ap.add_argument("--seed-modes", nargs="*", default=["0", "indep"], help="shared replay seeds, or indep")
    ap.add_argument("--law", action="store_true", help="also compare cur and pinned (common random numbers)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    t0 = time.time()
    base, draws = pools()
    rows = []
    for pool in a.pools:
        d = draws[pool]
        C = d.size
        for arrival in a.arrivals:
            pts = {s: compose(base, d, realisation_starts(arrival, C, s), {}) for s in range(max(a.sim_seeds, a.seeds))}
            m = int(max(p.prompt_blocks.max() for p in pts.values()))
            Ns = [m, int(1.5 * m), 2 * m]
            for cfg in a.configs:
                R, router = int(cfg.split(":")[0]), cfg.split(":")[1]
                caps = np.array([[N] * R for N in Ns])

                def fr(p, router=router, caps=caps):
                    return _fleet_ratios(p, router, caps, engine="vllm", router_params=None, speed=None, lag=0.0,
                                         seed=0)  # fmt: skip

                sim = np.array([fr(pts[s]) for s in range(a.sim_seeds)])
                ss, sse = sim.mean(0), sim.std(0, ddof=1) / np.sqrt(a.sim_seeds)
                r = {"pool": pool, "arrival": arrival, "R": R, "router": router, "N": Ns, "sim_mean": ss.tolist(),
                     "sim_se": sse.tolist(), "modes": {}}  # fmt: skip
                print(f"{pool} {arrival} R={R} {router}: sim {np.round(ss, 4)} ± {np.round(sse, 4)}", flush=True)
                for mode in a.seed_modes:
                    H = np.array(
                        [fleet_replays_blocks(pts[s], router, caps, replays=a.replays,
                                              seed=1000 + s if mode == "indep" else int(mode)) for s in range(a.seeds)]
                    )  # fmt: skip
                    gap = H.mean(1).mean(0) - ss
                    mc = (H.std(1, ddof=1) / np.sqrt(a.replays)).mean(0)
                    r["modes"][mode] = {"gap": gap.tolist(), "mc_se": mc.tolist()}
                    print(f"  replay seed {mode:>5s}: gap {np.round(gap, 4)}  s/√K {np.round(mc, 4)} "
                          f"({time.time() - t0:.0f} s)", flush=True)  # fmt: skip
                if a.law:
                    cp = np.array([np.subtract(*law_compare(pts[s], fr, a.replays, 1000 + s)) for s in range(a.seeds)])
                    r["cur_minus_pinned"] = cp.mean(0).tolist()
                    se = cp.std(0, ddof=1) / np.sqrt(a.seeds)
                    r["cur_minus_pinned_se"] = se.tolist()
                    dt = time.time() - t0
                    print(f"  law cur − pinned: {np.round(cp.mean(0), 4)} ± {np.round(se, 4)} ({dt:.0f} s)",
                          flush=True)  # fmt: skip
                rows.append(r)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
