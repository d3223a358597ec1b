"""Throughput of the compiled SGLang radix-cache model (:mod:`kvhit.sim.sglang.radix`), beside the vLLM block simulator.

The multi-turn trace of ``bench_block`` (same generator and seed): conversations as synthetic token streams
(one run each), outputs ~ Geom(mean 250) tokens (at most the next turn's growth), page size 1, LRU, a pool of
``N · b`` tokens — the memory of the vLLM pool of ``N`` blocks. Timed in the same process:

* the compiled model on the whole trace (after a warm-up call that compiles / loads the cache), without and with
  holds (2 s per request);
* vLLM's block simulator (:func:`kvhit.sim.vllm.block.simulate_block`) on the same requests at ``N`` blocks — the
  same-run baseline (it does less: no radix tree, no decode-time allocation);
* the step-wise Python model (:class:`kvhit.sim.sglang.engine.SglangEngine` through ``replay``) on a prefix,
  checked identical request by request;
* a curve of 8 capacities on the first 20,000 requests: :func:`kvhit.sim.sglang.run.radix_curve` (threads)
  against the same 8 runs one by one.

Unit: requests/s and prompt tokens/s (a request's prompt, whatever hits).
Run: ``NUMBA_CACHE_DIR=.numba_cache python benchmarks/bench_radix.py``.
"""

from __future__ import annotations

import json
import time

import numpy as np

from bench_block import make_trace
from kvhit.sim.engine import replay
from kvhit.sim.sglang.engine import SglangEngine
from kvhit.sim.sglang.radix import TokenStreams, simulate_radix
from kvhit.sim.sglang.run import radix_curve
from kvhit.sim.vllm.block import simulate_block


def streams(tr: dict, seed: int = 1) -> TokenStreams:
    conv, T = tr["conv"].astype(np.int64), tr["T"].astype(np.int64)
    rng = np.random.default_rng(seed)
    n = rng.geometric(1 / 250, T.size).astype(np.int64)
    # at most the next turn's growth, so outputs are the beginning of the next turn (stream model)
    order = np.lexsort((T, conv))
    nxt = np.full(T.size, np.iinfo(np.int64).max)
    same = conv[order[1:]] == conv[order[:-1]]
    nxt[order[:-1][same]] = T[order[1:][same]] - T[order[:-1][same]]
    n = np.minimum(n, nxt)
    _, dense = np.unique(conv, return_inverse=True)
    C = int(dense.max()) + 1
    need = np.zeros(C, np.int64)
    np.maximum.at(need, dense, T + np.maximum(n, 1) - 1)
    return TokenStreams(np.arange(C), np.zeros(C, np.int64), need, np.arange(C + 1), dense, T, n, "counts")


def _prefix(ts: TokenStreams, k: int) -> TokenStreams:
    return TokenStreams(
        ts.run_sym,
        ts.run_idx,
        ts.run_len,
        ts.stream_off,
        ts.stream[:k],
        ts.prompt_tokens[:k],
        ts.output_tokens[:k],
        ts.source,
    )


def run(seed: int = 0, min_accesses: int = 10_000_000, N: int = 30_000, ref_requests: int = 1_500) -> dict:
    tr = make_trace(seed, min_accesses)
    b = tr["block_size"]
    ts = streams(tr)
    C = N * b
    n = ts.n_requests
    tokens = int(ts.prompt_tokens.sum())
    out: dict = {"n_requests": n, "prompt_tokens": tokens, "pool_tokens": C, "vllm_blocks": N, "block_size": b}

    small = _prefix(ts, 2000)
    simulate_radix(small, C)  # warm-up: compile or load the numba cache
    simulate_radix(small, C, times=tr["times"][:2000], hold=np.full(2000, 2.0))
    simulate_block(tr["T"][:2000], tr["off"][:2001], tr["hashes"][: tr["off"][2000]], N=N, block_size=b)

    t0 = time.perf_counter()
    res = simulate_radix(ts, C)
    dt = time.perf_counter() - t0
    out["radix"] = {
        "seconds": dt,
        "requests_per_s": n / dt,
        "prompt_tokens_per_s": tokens / dt,
        "token_hit_ratio": res.token_hit_ratio(),
        "evicted_tokens": res.evictions,
    }
    t0 = time.perf_counter()
    res_ev = simulate_radix(ts, C, times=tr["times"], hold=np.full(n, 2.0))
    dt_ev = time.perf_counter() - t0
    out["radix_holds"] = {
        "seconds": dt_ev,
        "requests_per_s": n / dt_ev,
        "mean_wait": float(np.nanmean(res_ev.wait)),
        "peak_in_use": res_ev.peak_in_use,
    }

    t0 = time.perf_counter()
    blk = simulate_block(tr["T"], tr["off"], tr["hashes"], N=N, block_size=b)
    dt_b = time.perf_counter() - t0
    out["vllm_block_sim"] = {"seconds": dt_b, "requests_per_s": n / dt_b, "block_ops": blk.block_ops}
    out["radix_over_vllm_block_sim_requests_per_s"] = (
        out["radix"]["requests_per_s"] / out["vllm_block_sim"]["requests_per_s"]
    )

    # the step-wise Python model on a prefix (its token lists are materialized: it is the slow reference)
    p = _prefix(ts, ref_requests)
    reqs = p.to_requests()
    t0 = time.perf_counter()
    ref = replay(SglangEngine(C), reqs)
    dt_ref = time.perf_counter() - t0
    t0 = time.perf_counter()
    fast = simulate_radix(p, C)
    dt_fast = time.perf_counter() - t0
    out["stepwise_python"] = {
        "n_requests": ref_requests,
        "seconds": dt_ref,
        "requests_per_s": ref_requests / dt_ref,
        "identical_to_compiled": bool(np.array_equal(ref.hit_tokens, fast.hit_tokens)),
    }
    out["speedup_vs_stepwise_same_prefix"] = dt_ref / dt_fast

    # 8 capacities on the first 20,000 requests: threads vs one by one
    q = _prefix(ts, min(n, 20_000))
    Cs = np.unique(np.geomspace(C // 16, C * 4, 8).astype(np.int64))
    t0 = time.perf_counter()
    for c in Cs:
        simulate_radix(q, int(c))
    dt_seq = time.perf_counter() - t0
    t0 = time.perf_counter()
    radix_curve(q, Cs)
    dt_par = time.perf_counter() - t0
    out["curve_8_capacities_20k_requests"] = {"sequential_s": dt_seq, "threads_s": dt_par, "speedup": dt_seq / dt_par}
    return out


def main() -> None:
    print(json.dumps(run(), indent=2))


if __name__ == "__main__":
    main()
