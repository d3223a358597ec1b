"""SimpleCPUOffload eager: the two-tier estimator (kvhit.estimate.tiers, tier="simple") against the compiled eager
simulator (kvhit.sim.tiers.surface.hit_surface) on ShareGPT samples not used in design (issue 23 §5).

Design used ShareGPT seed 0 and checked seed 1 (benchmarks/tiers_accuracy.py); this script runs seeds never used
(default 2 3 4), same build as tiers_accuracy.py (1,000 warm-up + 5,000 measured conversations, λ0 = 1/s,
exponential W with mean 135 s, b = 128, every request counted), HBM 1,138 / 2,275 / 4,550 blocks × CPU
1 / 2,275 / 4,550 / 9,100 / 18,200 blocks. Prints per seed the max |estimate − simulator| over the grid, the
no-host (single-tier) error and the signed error per pair; ``--json`` keeps them. ``--compare`` also runs the
one-displacement union (``simple_model="onedim"``, the estimator before the store-time recency term) on the same
trace, for its error and time.

    NUMBA_CACHE_DIR=.numba_cache nice -n 10 python benchmarks/simple_eager_sharegpt.py [--seeds 2 3 4] [--compare] \
        [--json out]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from kvhit.estimate.tiers import estimate_tiers
from kvhit.sim.runner import block_requests
from kvhit.sim.tiers.surface import hit_surface
from kvhit.workload.dists import Exponential
from kvhit.workload.sharegpt_trace import build_sharegpt_trace

HBM = [1138, 2275, 4550]
HOST = [1, 2275, 4550, 9100, 18200]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="*", default=[2, 3, 4])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--compare", action="store_true", help="also the one-displacement union (simple_model='onedim')")
    a = ap.parse_args()
    out = []
    for seed in a.seeds:
        tr, _ = build_sharegpt_trace(
            n_warm=1000, n_meas=5000, seed=seed, lam0=1.0, interarrival=Exponential(135.0), block_size=128
        )
        rq = block_requests(tr, source="counts")
        t0 = time.perf_counter()
        s = hit_surface(rq.prompt_tokens, rq.hash_offsets, rq.hashes, tier="simple", gpu_blocks=HBM, host=HOST,
                        block_size=128)  # fmt: skip
        t_sim = time.perf_counter() - t0
        t0 = time.perf_counter()
        e = estimate_tiers(tr, HBM, HOST, tier="simple")
        t_est = time.perf_counter() - t0
        err = e.hit - s.hit
        old = None
        if a.compare:
            t0 = time.perf_counter()
            eo = estimate_tiers(tr, HBM, HOST, tier="simple", simple_model="onedim")
            old = {"est": eo.hit.round(5).tolist(), "max_abs_err": float(np.abs(eo.hit - s.hit).max()),
                   "est_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
        g_err = e.gpu_hit - s.gpu_hit
        rec = {
            "seed": seed,
            "requests": int(len(rq.prompt_tokens)),
            "hbm_blocks": HBM,
            "host_blocks": HOST,
            "sim": s.hit.round(5).tolist(),
            "est": e.hit.round(5).tolist(),
            "sim_gpu": s.gpu_hit.round(5).tolist(),
            "est_gpu": e.gpu_hit.round(5).tolist(),
            "max_abs_err": float(np.abs(err).max()),
            "gpu_only_max_abs_err": float(np.abs(g_err).max()),
            "sim_s": round(t_sim, 1),
            "est_s": round(t_est, 1),
            "mean_abs_err": float(np.abs(err).mean()),
            "onedim": old,
        }
        out.append(rec)
        print(
            f"seed {seed}: {rec['requests']} requests  max |est-sim| {rec['max_abs_err']:.4f}  "
            f"(GPU alone {rec['gpu_only_max_abs_err']:.4f})  sim {t_sim:.0f}s est {t_est:.0f}s",
            flush=True,
        )
        print("  sim", np.round(s.hit, 4).tolist(), "\n  err", np.round(err, 4).tolist(), flush=True)
        if old:
            print(f"  onedim: max |est-sim| {old['max_abs_err']:.4f}  est {old['est_s']:.0f}s", flush=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
