"""Throughput of the block-level vLLM prefix-cache simulator (:mod:`kvhit.sim.vllm.block`).

Builds a synthetic multi-turn trace (numpy) with at least ``min_accesses`` block accesses
(``Σ_r ceil(T_r / b)``), then times, in the same process:

* the numba simulator (after a warm-up call that compiles / loads the cache),
* the plain-Python reference (:mod:`kvhit.sim.vllm.reference`) on a prefix of the trace,
* optionally libCacheSim's LRU (PyPI ``libcachesim``, GPL, benchmark-only, never imported by the
  library) replaying the same sequence of block ids (each request's full-block ids, tail first),
  read from an oracleGeneral binary trace file.

Throughput unit: ``block_ops`` as defined in :mod:`kvhit.sim.vllm.block` (hash probes + touches +
allocations + frees) and, for a like-for-like comparison with libCacheSim, block accesses
(``hit + new`` blocks per request; one libCacheSim request each).

Run: ``NUMBA_CACHE_DIR=/tmp/numba_cache python benchmarks/bench_block.py``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import numpy as np

from kvhit.sim.vllm.block import block_hit_ratio, simulate_block, token_hit_ratio
from kvhit.sim.vllm.blockids import hashes_from_block_counts
from kvhit.sim.vllm.reference import simulate_block_reference


def make_trace(seed: int = 0, min_accesses: int = 10_000_000, block_size: int = 16) -> dict:
    """Multi-turn conversations: M ~ Geom(mean 4.5) turns, prompt ~ Geom(mean 150) tokens, response ~
    Geom(mean 250) tokens, Poisson conversation arrivals (rate 1), Exp(mean 60) think times."""
    rng = np.random.default_rng(seed)
    b = block_size
    convs, Ts, ts = [], [], []
    total = 0
    c0 = 0
    while total < min_accesses:
        k = 20_000
        M = rng.geometric(1 / 4.5, k)
        conv = np.repeat(np.arange(c0, c0 + k), M)
        n = conv.size
        first = np.r_[0, np.cumsum(M)[:-1]]
        X = rng.geometric(1 / 150, n)
        Y = rng.geometric(1 / 250, n)
        inc = X.astype(np.int64).copy()
        inc[1:] += Y[:-1]
        inc[first] = X[first]  # no response before a conversation's first turn
        cs = np.cumsum(inc)
        T = cs - np.repeat(cs[first] - inc[first], M)
        start = c0 + np.cumsum(rng.exponential(1.0, k))
        gaps = rng.exponential(60.0, n)
        gaps[first] = 0.0
        gs = np.cumsum(gaps)
        t = np.repeat(start, M) + gs - np.repeat(gs[first], M)
        convs.append(conv)
        Ts.append(T)
        ts.append(t)
        total += int((-(-T // b)).sum())
        c0 += k
    conv = np.concatenate(convs)
    T = np.concatenate(Ts)
    t = np.concatenate(ts)
    order = np.argsort(t, kind="stable")
    conv, T, t = conv[order], T[order], t[order]
    off, hashes = hashes_from_block_counts(conv, T // b)
    return {"conv": conv, "T": T, "times": t, "off": off, "hashes": hashes, "block_size": b}


def _prefix(tr: dict, n: int) -> dict:
    off = tr["off"][: n + 1]
    return {
        **tr,
        "conv": tr["conv"][:n],
        "T": tr["T"][:n],
        "times": tr["times"][:n],
        "off": off,
        "hashes": tr["hashes"][: off[-1]],
    }


def _libcachesim_lru(tr: dict, N: int) -> dict | None:
    try:
        import libcachesim as lcs
    except ImportError:
        return None
    off, hs = tr["off"], tr["hashes"]
    # each request's full-block ids, tail first (vLLM frees tail first, so the head ends most recent)
    idx = np.concatenate([np.arange(off[r + 1] - 1, off[r] - 1, -1) for r in range(len(off) - 1)])
    ids = hs[idx].view(np.uint64)
    dt = np.dtype([("t", "<u4"), ("id", "<u8"), ("sz", "<u4"), ("nv", "<i8")])
    rec = np.zeros(ids.size, dt)
    rec["t"] = np.arange(ids.size, dtype=np.uint64) // 1000
    rec["id"] = ids
    rec["sz"] = 1
    rec["nv"] = -1
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.oracleGeneral")
        rec.tofile(path)
        reader = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
        cache = lcs.LRU(N)
        t0 = time.perf_counter()
        miss, _ = cache.process_trace(reader)
        dt_s = time.perf_counter() - t0
    return {
        "accesses": int(ids.size),
        "seconds": dt_s,
        "accesses_per_s": ids.size / dt_s,
        "miss_ratio": float(miss),
    }


def run(seed: int = 0, min_accesses: int = 10_000_000, N: int = 30_000, ref_accesses: int = 1_000_000) -> dict:
    tr = make_trace(seed, min_accesses)
    b = tr["block_size"]
    T, off, hs = tr["T"], tr["off"], tr["hashes"]
    out: dict = {"n_requests": int(T.size), "block_size": b, "N": N}

    small = _prefix(tr, 2000)
    for eng in ("vllm", "vllm-0.23"):  # warm-up: compile or load the numba cache
        simulate_block(small["T"], small["off"], small["hashes"], N=N, block_size=b, engine=eng)

    t0 = time.perf_counter()
    res = simulate_block(T, off, hs, N=N, block_size=b)
    dt_nb = time.perf_counter() - t0
    accesses = int((res.hit_blocks + res.new_blocks).sum())
    out["numba"] = {
        "block_ops": res.block_ops,
        "accesses": accesses,
        "seconds": dt_nb,
        "ops_per_s": res.block_ops / dt_nb,
        "accesses_per_s": accesses / dt_nb,
        "token_hit_ratio": token_hit_ratio(res),
        "block_hit_ratio": block_hit_ratio(res),
        "evictions": res.evictions,
    }

    # reference on a prefix with about ref_accesses block accesses
    cum = np.cumsum(-(-T // b))
    k = int(min(T.size, np.searchsorted(cum, ref_accesses) + 1))
    p = _prefix(tr, k)
    t0 = time.perf_counter()
    ref = simulate_block_reference(p["T"], p["off"], p["hashes"], N=N, block_size=b)
    dt_ref = time.perf_counter() - t0
    t0 = time.perf_counter()
    res_p = simulate_block(p["T"], p["off"], p["hashes"], N=N, block_size=b)
    dt_p = time.perf_counter() - t0
    ref_acc = int((ref["hit_blocks"] + ref["new_blocks"]).sum())
    out["reference"] = {
        "n_requests": k,
        "block_ops": ref["block_ops"],
        "accesses": ref_acc,
        "seconds": dt_ref,
        "ops_per_s": ref["block_ops"] / dt_ref,
        "accesses_per_s": ref_acc / dt_ref,
        "identical_to_numba": bool(np.array_equal(ref["hit_blocks"], res_p.hit_blocks)),
    }
    out["numba_on_reference_prefix_ops_per_s"] = res_p.block_ops / dt_p
    out["speedup_vs_reference"] = out["numba"]["ops_per_s"] / out["reference"]["ops_per_s"]
    out["speedup_vs_reference_same_prefix"] = (res_p.block_ops / dt_p) / out["reference"]["ops_per_s"]

    # timed event mode (hold = 2 s per request) on the full trace
    hold = np.full(T.size, 2.0)
    simulate_block(small["T"], small["off"], small["hashes"], N=N, block_size=b, times=small["times"], hold=hold[:2000])
    t0 = time.perf_counter()
    res_ev = simulate_block(T, off, hs, N=N, block_size=b, times=tr["times"], hold=hold)
    dt_ev = time.perf_counter() - t0
    out["numba_events"] = {
        "block_ops": res_ev.block_ops,
        "seconds": dt_ev,
        "ops_per_s": res_ev.block_ops / dt_ev,
        "peak_blocks_in_use": res_ev.peak_blocks_in_use,
        "mean_wait": float(np.nanmean(res_ev.wait)),
    }

    lcs_res = _libcachesim_lru(tr, N)
    if lcs_res is not None:
        out["libcachesim_lru"] = lcs_res
        out["numba_accesses_per_s_over_libcachesim"] = out["numba"]["accesses_per_s"] / lcs_res["accesses_per_s"]
    return out


def main() -> None:
    print(json.dumps(run(), indent=2))


if __name__ == "__main__":
    main()
