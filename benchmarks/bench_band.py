"""The realisation band of the agentic estimator (:mod:`kvhit.estimate.band`, issue 23) on the stored WEKA pool
(34 conversations, uniform starts over 1 h, seed 0) at 1,000 capacities: the estimator alone, one exact replay
(:func:`kvhit.sim.vllm.curve.block_curve`, the unit the band pays K times) and the whole band (estimator + K = 16
replays), same run. Skipped (empty result) where the traces are not stored.

Run alone: ``python benchmarks/bench_band.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

WEKA = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "weka_kv_cache_tester" / "traces"


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(points: int = 1000, replays: int = 16) -> dict:
    from kvhit.estimate.agentic import estimate_trace
    from kvhit.estimate.band import estimate_trace_band
    from kvhit.sim.vllm.curve import block_curve
    from kvhit.workload.production import read_weka
    from kvhit.workload.reuse import request_reuse

    files = sorted(str(p) for p in WEKA.glob("trace_*.json"))
    if not files:
        return {"skipped": f"no WEKA traces under {WEKA}"}
    pt = read_weka(files, arrival="uniform", span=3600, seed=0)
    d = pt.describe()
    Ns = np.unique(np.geomspace(d["min_N"], 4 * d["distinct_blocks"], points).astype(np.int64))
    u = request_reuse(pt)
    rq = pt.to_block_requests()

    def replay():
        block_curve(rq.prompt_tokens, rq.hash_offsets, rq.hashes, block_size=rq.block_size, Ns=Ns, fallback="nan")

    estimate_trace(u, Ns[:2])  # compile outside the timings
    replay()
    t_est = _time(lambda: estimate_trace(u, Ns))
    t_rep = _time(replay)
    t_band = _time(lambda: estimate_trace_band(pt, Ns, replays=replays, reuse=u))
    return {
        "conversations": int(pt.session.max()) + 1,
        "requests": pt.n_requests,
        "capacities": int(Ns.shape[0]),
        "estimator_s": t_est,
        "one_exact_replay_s": t_rep,
        "replay_over_estimator": t_rep / t_est,
        f"band_K{replays}_s": t_band,
    }


def main() -> None:
    for k, v in run().items():
        print(f"{k:<24} {v}")


if __name__ == "__main__":
    main()
