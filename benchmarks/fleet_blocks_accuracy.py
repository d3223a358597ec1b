"""Accuracy of the block-id fleet estimator (:mod:`kvhit.fleet.blocks`) against kvhit's exact fleet simulation.

Workloads (issue 23 part 5; docs/estimators.md §6, block-id traces):

* ``weka``: the held-out WEKA pool ``held-35a`` of ``benchmarks/agentic_accuracy.py`` (35 conversations drawn with
  replacement, seed 100, from the held-out files trace_0030, trace_0032 … trace_0037 — never used to design the
  agentic estimator), started uniformly on [0, 3600] s or as a Poisson process at 35/3600 per s, start seeds
  ``--seeds`` (default 0–7); capacities per replica N_min·{1, 1.5, 2} (N_min = the pool's largest prompt, in
  blocks); oblivious routers round-robin, random (router seed 0) and session at R = 2, 4, 8, 16, no holds.
* ``mooncake``: the Mooncake FAST'25 conversation trace at its own timestamps (sessions derived from prefix
  sharing), capacities 1,000 / 4,000 / 16,000 / 64,000 blocks per replica, same routers and R.
* ``kv``: the stay-model estimate (Dynamo, temperature 0, precise) against the step-wise fleet simulation with holds
  ``T/speed`` on held-35a (uniform, start seeds 0–1) and Mooncake, R = 2, 4.

The simulated ratio of an oblivious fleet is computed per replica by :func:`kvhit.sim.vllm.curve.block_curve` on
the routed sub-trace (the fleet is exactly R independent replicas; checked once per run against
:func:`kvhit.fleet.simulate.simulate_fleet`). For each (workload, arrival, R, router, N) the table gives the mean
over the start seeds of the simulated realisations and of the estimates, the worst |estimate − realisation| and
|mean estimate − mean simulated| (issue 23 target (b): ≤ 0.01). Capacities whose estimate is infeasible (a
replica's largest prompt > N) are skipped.

``--only replay``: the replays' mean as the expected value (:func:`replay_rows`; ``--replay-seed fixed`` = seed 0
at every realisation, what ``fleet simulate`` prints; ``per-realisation`` separates the start law's bias from one
answer's Monte Carlo error, benchmarks/fleet_bias_diagnosis.py; pools ``held-35a``, ``held-35new``,
``held-35fresh``).

Run (nice; ≈ 10 min for ``weka`` with 8 seeds on one free core)::

    NUMBA_CACHE_DIR=.numba_cache python benchmarks/fleet_blocks_accuracy.py --only weka mooncake kv [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agentic_accuracy import MOON, band_pools, compose, realisation_starts  # noqa: E402
from kvhit.fleet.blocks import (  # noqa: E402
    _fleet_ratios,
    band_from_replays,
    estimate_fleet_blocks,
    estimate_fleet_blocks_curve,
    fleet_replays_blocks,
    kv_routes_blocks,
    route_oblivious,
    stay_probabilities_blocks,
)
from kvhit.fleet.simulate import simulate_fleet  # noqa: E402
from kvhit.sim.vllm.curve import block_curve  # noqa: E402
from kvhit.workload.production import read_mooncake  # noqa: E402

ROUTERS = ("round-robin", "random", "session")


def simulate_curve(pt, rep, R, Ns) -> np.ndarray:
    """Exact fleet token hit ratio at each N (every replica N): block_curve per replica, demand-weighted."""
    hits = np.zeros(len(Ns))
    den = 0.0
    for k in range(R):
        on = rep == k
        if not on.any():
            continue
        rq = pt.select(on).to_block_requests()
        c = block_curve(rq.prompt_tokens, rq.hash_offsets, rq.hashes, block_size=rq.block_size, Ns=np.asarray(Ns))
        d = float(rq.prompt_tokens.sum())
        hits += np.asarray(c["token_hit_ratio"]) * d
        den += d
    return hits / den


def check_once(pt, router, R, N) -> None:
    rep = route_oblivious(pt.session, router, R, seed=0)
    res = simulate_fleet(pt.prompt_tokens, pt.hash_offsets, pt.hashes, pt.session, Ns=[N] * R,
                         block_size=pt.block_size, router=router, times=pt.time, seed=0)  # fmt: skip
    assert np.array_equal(res.replica, rep)
    a, b = res.token_hit_ratio(), float(simulate_curve(pt, rep, R, [N])[0])
    assert abs(a - b) < 1e-12, (a, b)


def oblivious_rows(out, name, pt_of_seed, seeds, Ns_of, replicas, arrival, routers=ROUTERS):
    for R in replicas:
        for router in routers:
            sims, ests = [], []
            for s in seeds:
                pt = pt_of_seed(s)
                Ns = Ns_of(pt)
                rep = route_oblivious(pt.session, router, R, seed=0)
                h, _, inf, _ = estimate_fleet_blocks_curve(pt, rep, R, Ns)
                sim = simulate_curve(pt, rep, R, Ns)
                h = np.where(inf, np.nan, h)
                sims.append(sim)
                ests.append(h)
            S, E = np.array(sims), np.array(ests)
            for j, N in enumerate(Ns):
                if np.isnan(E[:, j]).any():
                    continue
                r = {
                    "workload": name, "arrival": arrival, "R": R, "router": router, "N": int(N), "seeds": len(seeds),
                    "sim_mean": float(S[:, j].mean()), "est_mean": float(E[:, j].mean()),
                    "worst_point": float(np.abs(E[:, j] - S[:, j]).max()),
                    "mean_gap": float(E[:, j].mean() - S[:, j].mean()),
                    "errors": [float(x) for x in E[:, j] - S[:, j]],
                }  # fmt: skip
                out.append(r)
                print(
                    f"{name:9s} {arrival:8s} R={R:2d} {router:11s} N={int(N):6d}: sim {r['sim_mean']:.4f} est "
                    f"{r['est_mean']:.4f} mean gap {r['mean_gap']:+.4f} worst point {r['worst_point']:.4f}",
                    flush=True,
                )


def kv_rows(out, name, pt, N, replicas, speed, seed):
    hold = pt.prompt_tokens / speed
    rate = pt.n_requests / float(pt.time.max() - pt.time.min())
    for R in replicas:
        t0 = time.time()
        res = simulate_fleet(pt.prompt_tokens, pt.hash_offsets, pt.hashes, pt.session, Ns=[N] * R,
                             block_size=pt.block_size, router="dynamo", times=pt.time, hold=hold,
                             seed=seed)  # fmt: skip
        sim = res.token_hit_ratio()
        q, prev = stay_probabilities_blocks(pt, "dynamo", R, hold=hold, Ns=[N] * R, rate=rate, seed=seed)
        rep = kv_routes_blocks(prev, q, R, seed=seed + 1)
        est = estimate_fleet_blocks(pt, rep, [N] * R).h
        has = prev >= 0
        stay_sim = float((res.replica[has] == res.replica[prev[has]]).mean())
        r = {"workload": name, "R": R, "N": int(N), "speed": speed, "seed": seed, "simulated": sim, "estimate": est,
             "error": est - sim, "stay_simulated": stay_sim, "stay_model": float(np.nanmean(q[has]))}  # fmt: skip
        out.append(r)
        print(
            f"kv {name:10s} R={R} N={N} seed {seed}: sim {sim:.4f} est {est:.4f} ({est - sim:+.4f}); stay sim "
            f"{stay_sim:.3f} model {r['stay_model']:.3f} ({time.time() - t0:.0f} s)",
            flush=True,
        )


#: the second held-out WEKA pool of the replay check: 35 conversations drawn (with replacement) from the held-out files
#: with this seed, fixed on 2026-12-03 after the replay method and its band rule were fixed on held-35a
NEW_POOL_SEED = 20261203
#: the third held-out WEKA pool (``held-35fresh``), drawn on 2026-12-03 after the held-35new miss was diagnosed
#: (benchmarks/fleet_bias_diagnosis.py: the replays' Monte Carlo error shared by every realisation, not the start law)
#: and the rule below fixed: the replays' seed per realisation (``--replay-seed per-realisation``) separates the
#: start law's bias from one answer's Monte Carlo error, ``--se-target`` bounds the latter
FRESH_POOL_SEED = 20261204
#: the fourth held-out WEKA pool (``held-35g``), drawn on 2026-12-03 (evening) to measure what ``fleet simulate
#: --replay-se 0.003`` prints (replays' seed 0 as the command, adaptive count until s/√K ≤ 0.003 at every capacity);
#: rule fixed before it was run: the gap (Poisson arm) / paired gap (uniform arm) within 0.01 at every point
G_POOL_SEED = 20261206
#: the fifth held-out WEKA pool (``held-35k``), drawn on 2026-12-03 (night) after ``--exchangeable`` (the replays
#: redraw the sessions' order: their mean estimates E[h]) was coded; rule fixed before it was run (docs/estimators.md
#: §6): under uniform and Poisson-shuffled starts the gap of the exchangeable replays' mean within 0.01 at every point
K_POOL_SEED = 20261207


#: timing presets of ``--only replay --timing`` (kvhit.fleet.timing.FleetTiming per router class): ``speed`` holds
#: T/speed for the KV-aware routers and none for the oblivious ones (the default, as before); ``isolated`` Dynamo's
#: mocker isolated-request timing of docs/peers.md (prefill 10.87 ms + T/53,056 tok/s, decode 173.5 tok/s, the
#: prefill-done event, hit tokens saving their prefill) with the decode KV; ``slow`` a loaded engine (prefill 50 ms +
#: T/5,000 tok/s, decode 20 tok/s, prefill-done, hit-token savings, decode KV). Oblivious routers get the same
#: prefill, decode and decode KV but no hit-token savings (the preset was fixed when they ran step-wise, 20–40×
#: slower; they now run compiled) and no prefill-done event (they read no load).
TIMINGS = {
    "isolated": dict(
        prefill_tokens_per_s=1000 / 0.018848, prefill_overhead_s=0.01087, decode_tokens_per_s=1000 / 5.764
    ),
    "slow": dict(prefill_tokens_per_s=5000.0, prefill_overhead_s=0.05, decode_tokens_per_s=20.0),
}


def preset_timing(preset: str, router: str, speed: float):
    """The FleetTiming of a ``--timing`` preset for ``router`` (see :data:`TIMINGS`)."""
    from kvhit.fleet.timing import FleetTiming

    kv = router not in ROUTERS
    if preset == "speed":
        return FleetTiming(speed if kv else None)
    t = TIMINGS[preset]
    if not kv:
        return FleetTiming(**t, decode_kv=True)
    return FleetTiming(**t, prefill_hold=True, hit_token_seconds=1.0 / t["prefill_tokens_per_s"], decode_kv=True)


def replay_rows(out, name, pt_of_seed, sim_seeds, seeds, replicas, arrival, routers, speed, replays, Ns_fixed=None,
                timing="speed", replay_seed="fixed", se_target=None, keep=True):  # fmt: skip
    """The replay mean as the expected value (docs/estimators.md §6, block-id traces): for each (R, router, N) the
    mean over ``sim_seeds`` start-time realisations of the exact fleet ratio, the mean over ``seeds`` of the replays'
    mean at that realisation (:func:`fleet_replays_blocks`, seed 0 as ``fleet simulate``), the coverage of the
    realisations by the band of their own replays (raw eq. (B1), and widened by WIDEN) and the mean widths.
    ``replay_seed="fixed"``: generator seed 0 at every realisation (what ``fleet simulate`` answers); under a start
    law with one order (the Poisson arm) every realisation then replays the same patterns, so the mean over
    realisations keeps one answer's Monte Carlo error (``mc_se``); ``"per-realisation"``: seed 1000 + start seed, so
    the gap measures the start law's bias. ``se_target``: :func:`fleet_replays_blocks`' adaptive count. ``keep=False``:
    the replays redraw the sessions' order (the exchangeable law: their mean estimates E[h], not E[h | order])."""
    pts = {s: pt_of_seed(s) for s in sorted(set(sim_seeds) | set(seeds))}
    for R in replicas:
        for router in routers:
            t0 = time.time()
            kv = router not in ROUTERS
            tm = preset_timing(timing, router, speed)
            sp = tm.prefill_tokens_per_s
            m = int(max(p.prompt_blocks.max() for p in pts.values()))
            Ns = Ns_fixed or ([int(1.5 * m)] if kv else [m, int(1.5 * m), 2 * m])
            caps = [[N] * R for N in Ns]
            sim = {s: _fleet_ratios(pts[s], router, np.asarray(caps), engine="vllm", router_params=None, lag=0.0,
                                    seed=0, timing=tm) for s in pts}  # fmt: skip
            rep = {s: fleet_replays_blocks(pts[s], router, caps, replays=replays,
                                           seed=0 if replay_seed == "fixed" else 1000 + s, timing=tm,
                                           se_target=se_target, keep=keep) for s in seeds}  # fmt: skip
            dt = time.time() - t0
            for j, N in enumerate(Ns):
                S = np.array([sim[s][j] for s in sim_seeds])
                E = np.array([rep[s][:, j].mean() for s in seeds])
                cov_raw, cov_w, w_raw, w_w = [], [], [], []
                for s in seeds:
                    lo, hi, *_ = band_from_replays(rep[s][:, j], widen=False)
                    cov_raw.append(lo <= sim[s][j] <= hi)
                    w_raw.append(hi - lo)
                    lo, hi, *_ = band_from_replays(rep[s][:, j], widen=True)
                    cov_w.append(lo <= sim[s][j] <= hi)
                    w_w.append(hi - lo)
                d = np.array([rep[s][:, j].mean() - sim[s][j] for s in seeds] * (1 if len(seeds) > 1 else 2))
                r = {
                    "workload": name, "arrival": arrival, "R": R, "router": router, "N": int(N), "speed": sp,
                    "timing": timing, "law": "keep-span" if keep else "random-span",
                    "sim_seeds": len(sim_seeds), "seeds": len(seeds), "replays": replays,
                    "sim_mean": float(S.mean()),
                    "sim_se": float(S.std(ddof=1) / np.sqrt(S.size)) if S.size > 1 else 0.0,
                    "exp_mean": float(E.mean()), "gap": float(E.mean() - S.mean()),
                    "paired_gap": float(d.mean()), "paired_gap_se": float(d.std(ddof=1) / np.sqrt(d.size)),
                    "sim_at_seeds": [float(sim[s][j]) for s in seeds], "exp_at_seeds": [float(x) for x in E],
                    "mc_se": float(np.mean([rep[s][:, j].std(ddof=1) / np.sqrt(rep[s].shape[0]) for s in seeds])),
                    "replays_drawn": float(np.mean([rep[s].shape[0] for s in seeds])), "replay_seed": replay_seed,
                    "cover_raw": float(np.mean(cov_raw)), "cover_widened": float(np.mean(cov_w)),
                    "width_raw": float(np.mean(w_raw)), "width_widened": float(np.mean(w_w)),
                    "seconds": dt, "block_accesses": int(pts[seeds[0]].full_blocks.sum()),
                }  # fmt: skip
                out.append(r)
                print(
                    f"{name:9s} {arrival:8s} {timing:8s} {r['law']:11s} R={R} {router:11s} N={N:6d}: "
                    f"sim {r['sim_mean']:.4f}±{r['sim_se']:.4f} "
                    f"exp {r['exp_mean']:.4f} gap {r['gap']:+.4f} "
                    f"paired {r['paired_gap']:+.4f}±{r['paired_gap_se']:.4f} "
                    f"cover {r['cover_raw']:.2f}/{r['cover_widened']:.2f}"
                    f" width {r['width_raw']:.3f}/{r['width_widened']:.3f} mc_se {r['mc_se']:.4f} ({dt:.0f} s)",
                    flush=True,
                )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", default=["weka", "mooncake", "kv"],
                    choices=["weka", "mooncake", "kv", "replay"])  # fmt: skip
    ap.add_argument("--pools", nargs="*", default=["held-35a"],
                    choices=["held-35a", "held-35new", "held-35fresh", "held-35g", "held-35k"])  # fmt: skip
    ap.add_argument("--replay-seed", default="fixed", choices=["fixed", "per-realisation"])
    ap.add_argument(
        "--exchangeable",
        action="store_true",
        help="replay: the replays redraw the sessions' order (their mean estimates E[h], not E[h | order])",
    )
    ap.add_argument(
        "--se-target", type=float, default=None, help="replay: adaptive replay count (fleet_replays_blocks)"
    )
    ap.add_argument("--sim-seeds", type=int, default=16, help="replay: realisations behind the simulated mean")
    ap.add_argument("--kv-routers", nargs="*", default=["dynamo"])
    ap.add_argument("--replays", type=int, default=16)
    ap.add_argument(
        "--timing",
        default="speed",
        choices=["speed", *TIMINGS],
        help="replay: the timing preset (TIMINGS; default speed: holds T/speed, KV-aware routers only)",
    )
    ap.add_argument("--kv-speed", type=float, default=50_000.0, help="replay --timing speed: KV routers' T/speed")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    ap.add_argument("--arrivals", nargs="+", default=["uniform", "poisson"])
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--routers", nargs="+", default=list(ROUTERS), choices=list(ROUTERS))
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    t0 = time.time()
    rows: list = []
    _, _, base, draws = [p for p in band_pools(True) if p[0] == "held-35a"][0]

    def weka(arrival):
        return lambda s: compose(base, draws, realisation_starts(arrival, draws.size, s), {})

    def grid(pt):
        m = int(pt.prompt_blocks.max())
        return [m, int(1.5 * m), 2 * m]

    if "weka" in a.only:
        check_once(weka("uniform")(0), "random", 4, grid(weka("uniform")(0))[0])
        for arrival in a.arrivals:
            oblivious_rows(rows, "held-35a", weka(arrival), a.seeds, grid, a.replicas, arrival, a.routers)
    if "replay" in a.only:
        h = [p for p in band_pools(True) if p[0] == "held-35a"][0][2]
        Ch = int(h.session.max()) + 1
        pools = {
            "held-35a": draws,
            "held-35new": np.random.default_rng(NEW_POOL_SEED).integers(0, Ch, 35),
            "held-35fresh": np.random.default_rng(FRESH_POOL_SEED).integers(0, Ch, 35),
            "held-35g": np.random.default_rng(G_POOL_SEED).integers(0, Ch, 35),
            "held-35k": np.random.default_rng(K_POOL_SEED).integers(0, Ch, 35),
        }
        for pool in a.pools:
            for arrival in a.arrivals:

                def of_seed(s, arrival=arrival, d=pools[pool]):
                    return compose(base, d, realisation_starts(arrival, d.size, s), {})

                replay_rows(rows, pool, of_seed, list(range(a.sim_seeds)), a.seeds, a.replicas, arrival,
                            list(a.routers) + list(a.kv_routers), a.kv_speed, a.replays,
                            timing=a.timing, replay_seed=a.replay_seed, se_target=a.se_target,
                            keep=not a.exchangeable)  # fmt: skip
        if "mooncake" in a.only:
            mc = read_mooncake(MOON)
            replay_rows(rows, "mooncake", lambda s: mc, [0], [0], a.replicas, "own",
                        list(a.routers) + list(a.kv_routers), 10_000.0, a.replays,
                        [1000, 4000, 16000, 64000], timing=a.timing)  # fmt: skip
    if "mooncake" in a.only and "replay" not in a.only:
        mc = read_mooncake(MOON)
        check_once(mc, "round-robin", 2, 4000)
        oblivious_rows(
            rows, "mooncake", lambda s: mc, [0], lambda pt: [1000, 4000, 16000, 64000], a.replicas, "own", a.routers
        )
    if "kv" in a.only:
        for s in (0, 1):
            pt = weka("uniform")(s)
            kv_rows(rows, "held-35a", pt, int(1.5 * pt.prompt_blocks.max()), [2, 4], 50_000.0, s)
        kv_rows(rows, "mooncake", read_mooncake(MOON), 4000, [2, 4], 10_000.0, 0)
    rp = [r for r in rows if "exp_mean" in r]
    if rp:
        print(
            "\n| pool | arrival | routers | points | |gap| ≤ 0.01 | worst |gap| | worst gap / paired se | mean |gap| | "
            "coverage raw (mean, worst point) | coverage ±WIDEN (mean, worst point) | mean width raw / ±WIDEN | "
            "mean MC se |"
        )
        print("|---|---|---|---:|---:|---:|---:|---:|---|---|---|---:|")
        for w in sorted({(r["workload"], r["arrival"], r["router"] not in ROUTERS) for r in rp}):
            sel = [r for r in rp if (r["workload"], r["arrival"], r["router"] not in ROUTERS) == w]
            g = np.abs([r["gap"] for r in sel])
            k = int(np.argmax(g))
            cr, cw = [r["cover_raw"] for r in sel], [r["cover_widened"] for r in sel]
            print(f"| {w[0]} | {w[1]} | {'KV-aware' if w[2] else 'oblivious'} | {len(sel)} | {(g <= 0.01).sum()} | "
                  f"{g.max():.4f} | "
                  f"{g[k] / max(sel[k]['paired_gap_se'], 1e-12):.1f} | {g.mean():.4f} | {np.mean(cr):.3f}, "
                  f"{min(cr):.3f} | {np.mean(cw):.3f}, {min(cw):.3f} | "
                  f"{np.mean([r['width_raw'] for r in sel]):.3f} / {np.mean([r['width_widened'] for r in sel]):.3f} | "
                  f"{np.mean([r['mc_se'] for r in sel]):.4f} |")  # fmt: skip
    ob = [r for r in rows if "mean_gap" in r]
    if ob:
        print("\n| workload | arrival | points | worst |mean est − mean sim| | mean |gap| | worst single point |")
        print("|---|---|---:|---:|---:|---:|")
        for w in sorted({(r["workload"], r["arrival"]) for r in ob}):
            sel = [r for r in ob if (r["workload"], r["arrival"]) == w]
            g = np.abs([r["mean_gap"] for r in sel])
            print(f"| {w[0]} | {w[1]} | {len(sel)} | {g.max():.4f} | {g.mean():.4f} | "
                  f"{max(r['worst_point'] for r in sel):.4f} |")  # fmt: skip
    kv = [r for r in rows if "error" in r]
    if kv:
        e = np.abs([r["error"] for r in kv])
        print(f"\nkv: {len(kv)} points, worst |error| {e.max():.4f}, mean {e.mean():.4f}")
    print(f"\n({time.time() - t0:.0f} s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
