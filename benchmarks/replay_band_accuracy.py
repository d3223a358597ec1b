"""SGLang and host-tier expected value and realisation band on held-out WEKA pools: today's analytic estimators
(kvhit.estimate.sglang_agentic, kvhit.estimate.tiers) against the exact-replay band (kvhit.estimate.replay_band),
both against kvhit's exact simulators (issue 23 §2, §5).

Pools and realisations as ``benchmarks/agentic_accuracy.py --only band``: ``held-35a`` = 35 conversations drawn
with replacement (seed 100) from the 7 held-out WEKA files trace_0030 … trace_0037, ids re-namespaced per draw;
realisation ``s`` (s = 0 … seeds_mean − 1) starts them uniform on [0, 3600] s or Poisson at 35/3600 per s (seed s).
For each engine the *truth* is the simulator on each realisation and its mean over ``seeds_mean`` (16) seeds; on
the first ``seeds_band`` (8) realisations the estimator (today) and the replay band (``K`` exact replays at starts
redrawn from that realisation's fitted law, seed 1000 + s) are computed. Reported over the points whose simulated
mean lies in 10–90 % of the ceiling (and feasible) for SGLang
(tiers: every feasible (HBM, host) pair, as ``benchmarks/tiers_accuracy.py``):

* ``est |E-sim|``: max |mean over seeds of the estimate − simulated mean| (the target: ≤ 0.01), and per seed;
* ``rep |m-sim|``: max over the band seeds of |replay mean − simulated mean| (the replay mean is the expected
  value here); ``se``: the largest standard error of that difference (√(se_replay² + se_sim²));
* ``cover``: share of (seed, point) where the realisation's own simulated ratio lies in its 90 % band (target ≥ 0.85),
  ``width``: the band's mean width; seconds per replay and per capacity (pair).

Engines: ``sglang`` (UnifiedRadixCache, LRU, page 1; pools of 8 sizes from the largest request C_min to the vLLM
curve's 0.9·h_max point × b, log-spaced), ``native`` / ``lmcache`` (256-token chunks) / ``simple`` (eager): HBM
{N_min, U/8} × host {0 (1 for simple), U/8, U/4, U/2, U} (U = distinct block ids).

    NUMBA_CACHE_DIR=.numba_cache nice -n 10 python benchmarks/replay_band_accuracy.py \\
        [--engines sglang native lmcache simple] [--arrivals uniform poisson] [--replays 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agentic_accuracy import compose, realisation_starts, weka_files  # noqa: E402
from kvhit.estimate.band import DEFAULT_ORDER  # noqa: E402
from kvhit.estimate.replay_band import replay_band, sglang_replays, tier_replays  # noqa: E402
from kvhit.workload.production import read_weka  # noqa: E402

#: the replays' start law (``--order``; default the band's, kvhit.estimate.band.DEFAULT_ORDER)
ORDER = DEFAULT_ORDER


def pools(names):
    h = read_weka(weka_files(True))
    Ch = int(h.session.max()) + 1
    for tag, s in (("a", 100), ("b", 101), ("f", 105)):
        if f"held-35{tag}" in names:
            yield f"held-35{tag}", h, np.random.default_rng(s).integers(0, Ch, 35)


def sglang_grid(pt) -> np.ndarray:
    from kvhit.sim.vllm.curve import block_curve

    need = pt.prompt_tokens + np.maximum(pt.output_tokens, 1) - 1
    c_min = int(need.max())
    rq = pt.to_block_requests()
    Ns = np.unique(np.geomspace(max(1, c_min // pt.block_size), np.unique(pt.hashes).size, 200).astype(np.int64))
    c = block_curve(rq.prompt_tokens, rq.hash_offsets, rq.hashes, block_size=rq.block_size, Ns=Ns, fallback="nan")
    h = c["token_hit_ratio"]
    top = np.nanmax(h)
    k = int(np.flatnonzero(np.isfinite(h) & (h >= 0.9 * top))[0])
    return np.unique(np.geomspace(c_min, max(int(Ns[k]) * pt.block_size, 2 * c_min), 8).astype(np.int64))


def tier_grid(pt):
    R = -(-pt.prompt_tokens // pt.block_size)
    U = int(np.unique(pt.hashes).size)
    N_min = int(R.max())
    return sorted({max(N_min, x) for x in (N_min, U // 8)}), [0, U // 8, U // 4, U // 2, U]


def tier_kw(tier):
    return ({"chunk_tokens": 256}, 4) if tier == "lmcache" else ({}, 1)


def one(engine, pt, grid, est_only=False, replays=16, seed=0):
    """(simulated, estimate) on one realisation, or the K replays when ``replays``."""
    if engine == "sglang":
        from kvhit.estimate.sglang_agentic import estimate_trace_sglang
        from kvhit.sim.sglang.run import radix_curve
        from kvhit.sim.sglang.streams import streams_from_production

        if est_only:
            e = estimate_trace_sglang(pt, grid)
            return e.h, e.h_max
        return radix_curve(streams_from_production(pt), grid, workers=1)["token_hit_ratio"]
    from kvhit.estimate.tiers import estimate_tiers
    from kvhit.sim.tiers.surface import hit_surface

    hbm, host = grid
    kw, _ = tier_kw(engine)
    if est_only:
        return estimate_tiers(pt, hbm, host, tier=engine, **kw).hit, None
    rq = pt.to_block_requests()
    return hit_surface(
        rq.prompt_tokens, rq.hash_offsets, rq.hashes, tier=engine, gpu_blocks=hbm, host=host,
        block_size=rq.block_size, **kw,
    ).hit  # fmt: skip


def run(out, name, base, draws, arrival, engine, seeds_mean, seeds_band, K, level):
    C = draws.shape[0]
    traces = [compose(base, draws, realisation_starts(arrival, C, s), {"seed": s}) for s in range(seeds_mean)]
    if engine == "sglang":
        grid = sglang_grid(traces[0])
    else:
        hbm, host = tier_grid(traces[0])
        if engine == "simple":
            host = [max(x, 1) for x in host]
        kw, bpc = tier_kw(engine)
        host = [max(x // bpc, 1 if engine == "simple" else 0) for x in host]
        grid = (hbm, host)
    t0 = time.perf_counter()
    sims = np.array([one(engine, pt, grid) for pt in traces])
    t_sim = (time.perf_counter() - t0) / seeds_mean
    ests, hmax = [], 1.0
    t0 = time.perf_counter()
    for pt in traces[:seeds_band]:
        e, hm = one(engine, pt, grid, est_only=True)
        ests.append(e)
        hmax = hm if hm is not None else hmax
    t_est = (time.perf_counter() - t0) / seeds_band
    reps, t0 = [], time.perf_counter()
    for s, pt in enumerate(traces[:seeds_band]):
        if engine == "sglang":
            H = sglang_replays(pt, grid, replays=K, seed=1000 + s, workers=1, order=ORDER)
        else:
            kw, _ = tier_kw(engine)
            H = tier_replays(pt, grid[0], grid[1], tier=engine, replays=K, seed=1000 + s, order=ORDER, **kw)
        reps.append(replay_band(H, level))
    t_rep = (time.perf_counter() - t0) / seeds_band / K
    S = sims.reshape(seeds_mean, -1)
    ms = S.mean(axis=0)
    se_sim = S.std(axis=0, ddof=1) / math.sqrt(seeds_mean)
    # the ceiling: the simulated ratio at the largest point is taken as h_max for the 10–90 % band (SGLang: the
    # estimator's h_max, the infinite-pool ratio; tiers: every pool is feasible and the grid's top reaches it)
    top = hmax if engine == "sglang" else float(np.nanmax(ms))
    band = np.isfinite(ms) & (ms >= 0.1 * top) & (ms <= 0.9 * top)
    if engine != "sglang":  # tiers: every feasible pair of the grid (as benchmarks/tiers_accuracy.py)
        band = np.isfinite(ms)
    E = np.array(ests).reshape(seeds_band, -1)
    M = np.array([r.mean.ravel() for r in reps])
    SE = np.array([r.se.ravel() for r in reps])
    LO = np.array([r.lo.ravel() for r in reps])
    HI = np.array([r.hi.ravel() for r in reps])
    own = S[:seeds_band]
    cov = ((own >= LO) & (own <= HI))[:, band]
    nan = float("nan")
    r = {
        "pool": name,
        "arrival": arrival,
        "engine": engine,
        "grid": [int(x) for x in grid] if engine == "sglang" else [list(map(int, grid[0])), list(map(int, grid[1]))],
        "points": int(band.sum()),
        "est_err_mean_max": float(np.abs(E.mean(0) - ms)[band].max()) if band.any() else nan,
        "est_err_signed_mean": float((E.mean(0) - ms)[band].mean()) if band.any() else nan,
        "est_err_per_seed_max": float(np.abs(E - ms)[:, band].max()) if band.any() else nan,
        "est_err_per_seed_mean": float(np.abs(E - ms)[:, band].mean()) if band.any() else nan,
        "rep_err_max": float(np.abs(M - ms)[:, band].max()) if band.any() else nan,
        "rep_err_mean": float(np.abs(M - ms)[:, band].mean()) if band.any() else nan,
        "rep_err_se_max": float(np.sqrt(SE**2 + se_sim**2)[:, band].max()) if band.any() else nan,
        "rep_share_within_001": float((np.abs(M - ms)[:, band] <= 0.01).mean()) if band.any() else nan,
        "coverage": float(cov.mean()) if cov.size else nan,
        "coverage_widened_001": float(((own >= LO - 0.01) & (own <= HI + 0.01))[:, band].mean()) if band.any() else nan,
        "mean_width": float((HI - LO)[:, band].mean()) if band.any() else nan,
        "sim_sd_max": float(S.std(axis=0, ddof=1)[band].max()) if band.any() else nan,
        "sim_s_per_realisation": t_sim,
        "est_s": t_est,
        "replay_s": t_rep,
        "replay_s_per_point": t_rep / S.shape[1],
        "seeds_mean": seeds_mean,
        "seeds_band": seeds_band,
        "replays": K,
        "sim_mean": ms.round(5).tolist(),
    }
    out.append(r)
    print(
        f"{name:9s} {arrival:8s} {engine:8s} pts {r['points']:3d}  est|E-sim| {r['est_err_mean_max']:.4f} "
        f"(signed {r['est_err_signed_mean']:+.4f}, per seed {r['est_err_per_seed_max']:.4f} "
        f"mean {r['est_err_per_seed_mean']:.4f})  "
        f"rep|m-sim| {r['rep_err_max']:.4f} (mean {r['rep_err_mean']:.4f}, se {r['rep_err_se_max']:.4f}, "
        f"≤0.01 at {r['rep_share_within_001']:.2f})  cover {r['coverage']:.3f} width {r['mean_width']:.3f}  "
        f"sim {t_sim:.1f}s est {t_est:.1f}s replay {t_rep:.1f}s ({r['replay_s_per_point']:.2f}s/pt)",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pools", nargs="*", default=["held-35a"])
    ap.add_argument("--engines", nargs="*", default=["sglang", "native", "lmcache", "simple"])
    ap.add_argument("--arrivals", nargs="*", default=["uniform", "poisson"])
    ap.add_argument("--seeds-mean", type=int, default=16)
    ap.add_argument("--seeds-band", type=int, default=8)
    ap.add_argument("--replays", type=int, default=16)
    ap.add_argument("--level", type=float, default=0.9)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--order", default=None, help="the replays' start law (keep-span random keep; default the band's)")
    a = ap.parse_args()
    global ORDER
    ORDER = a.order or DEFAULT_ORDER
    print(f"replays' start law: {ORDER}", flush=True)
    out: list[dict] = []
    for name, base, draws in pools(a.pools):
        for arrival in a.arrivals:
            for eng in a.engines:
                run(out, name, base, draws, arrival, eng, a.seeds_mean, a.seeds_band, a.replays, a.level)
                if a.json:
                    a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
