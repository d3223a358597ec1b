"""Throughput of kvhit's model of vLLM's scheduler (:mod:`kvhit.sim.vllm.scheduler`), beside the holds model.

A replay-sized workload: ``n`` chat-like requests (random prompts of 50–900 tokens sharing a 200-token prefix, 1–8
outputs, arrivals 20 ms apart on average), 39 usable blocks of 128 tokens — the setting of the live check. Timed in
the same process:

* the scheduler model with the measured clock (deadlines = arrival + 1 s) and with a step-time line;
* the step-wise engine with holds (:func:`kvhit.sim.engine.replay` over :class:`kvhit.sim.vllm.engine.VllmEngine`,
  what the holds check runs) — the same-run baseline;
* :func:`kvhit.sim.vllm.scheduler.fit_step_time` (8 simulations).

Unit: requests/s. Run: ``NUMBA_CACHE_DIR=.numba_cache python benchmarks/bench_scheduler.py``.
"""

from __future__ import annotations

import json
import time

import numpy as np

from kvhit.sim.engine import Request, replay
from kvhit.sim.vllm.blockids import hashes_from_token_ids
from kvhit.sim.vllm.engine import VllmEngine
from kvhit.sim.vllm.scheduler import SchedRequest, StepTime, fit_step_time, simulate_schedule


def make(n: int, seed: int = 0, b: int = 128):
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 50_000, 200)
    seqs, T, m = [], [], []
    for _ in range(n):
        t = int(rng.integers(50, 900))
        k = int(rng.integers(1, 9))
        seqs.append(np.concatenate([shared, rng.integers(0, 50_000, t + k - 1)]))
        T.append(200 + t)
        m.append(k)
    off, hs = hashes_from_token_ids(seqs, b)
    arr = np.cumsum(rng.exponential(0.02, n))
    reqs = [
        SchedRequest(i, T[i], m[i], tuple(int(x) for x in hs[off[i] : off[i + 1]]), float(arr[i])) for i in range(n)
    ]
    return reqs, arr


def run(n: int = 2_000) -> dict:
    reqs, arr = make(n)
    kw = dict(N=39, block_size=128)
    t0 = time.perf_counter()
    simulate_schedule(reqs, deadlines=arr + 1.0, **kw)
    t_meas = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = simulate_schedule(reqs, step_time=StepTime(a=0.01, b=2e-5), **kw)
    t_line = time.perf_counter() - t0
    eng = VllmEngine(39, block_size=128, colocated=True)
    ereqs = [Request(q.rid, q.prompt_tokens, q.block_hashes, q.output_tokens) for q in reqs]
    t0 = time.perf_counter()
    replay(eng, ereqs, times=arr, hold=np.full(n, 0.05))
    t_holds = time.perf_counter() - t0
    lat = res.finished - res.arrival
    t0 = time.perf_counter()
    fit_step_time(reqs[:300], lat[:300], **kw)
    t_fit = time.perf_counter() - t0
    return {
        "requests": n,
        "scheduler, measured clock (requests/s)": n / t_meas,
        "scheduler, step-time line (requests/s)": n / t_line,
        "holds, step-wise engine (requests/s)": n / t_holds,
        "scheduler / holds (same run)": t_holds / t_meas,
        "fit_step_time on 300 requests (s)": t_fit,
        "steps": int(res.steps.shape[0]),
    }


def main() -> None:
    print(json.dumps(run(), indent=1))


if __name__ == "__main__":
    main()
