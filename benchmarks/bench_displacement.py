"""Displacement moments (Lemma D.1) of the engine-aware estimator: the closed form
(:func:`kvhit.estimate.displacement.phi_moments`) against the segment-by-segment integration it replaced
(:func:`kvhit.estimate.displacement.phi_moments_reference`), same inputs, same run, on the estimator's own t grid.

Run alone: ``python benchmarks/bench_displacement.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from kvhit.estimate.accounting import engine_accounting
from kvhit.estimate.displacement import phi_moments, phi_moments_reference
from kvhit.estimate.occupancy import _fluct_grid, _resolve_F
from kvhit.workload import WorkloadSpec, generate

SPEC = Path(__file__).resolve().parents[1] / "examples" / "scm.toml"


def _best(fn, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run(n_conversations: int = 50_000) -> dict:
    tr = generate(WorkloadSpec.from_toml(SPEC), 0, n_conversations=n_conversations)
    tr.meta["block_size"] = 128
    acc = engine_accounting(tr, engine="vllm", metric="blocks")
    tg = _fluct_grid(_resolve_F("empirical", acc.W))[2]
    args = (acc.conv_ptr, acc.offsets, acc.cum_new, acc.hist_all)
    phi_moments_reference(*args, tg[:2], np.zeros(2), np.zeros(2))  # compile outside the timings
    phi_moments(*args, tg[:2])
    t_ref = _best(lambda: phi_moments_reference(*args, tg, np.zeros(tg.size), np.zeros(tg.size)), reps=1)
    t_new = _best(lambda: phi_moments(*args, tg))
    m, v = phi_moments(*args, tg)
    m0, v0 = np.zeros(tg.size), np.zeros(tg.size)
    phi_moments_reference(*args, tg, m0, v0)
    return {
        "turns": tr.n_turns,
        "t_grid_points": int(tg.size),
        "reference_s": t_ref,
        "closed_form_s": t_new,
        "speedup": t_ref / t_new,
        "max_rel_diff": float(
            max(np.max(np.abs(m - m0) / np.maximum(1, m0)), np.max(np.abs(v - v0) / np.maximum(1, v0)))
        ),
    }


def main() -> None:
    for k, v in run().items():
        print(f"{k:<16} {v}")


if __name__ == "__main__":
    main()
