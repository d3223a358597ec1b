"""Accuracy of the agentic estimator (kvhit.estimate.agentic) against the exact block simulator (issue 11).

The "actual" is :func:`kvhit.sim.vllm.curve.block_curve` (exact, both vLLM free-queue orders; vLLM's token metric
``prefix_cache_hits / prefix_cache_queries``), as ``kvhit curve --blocks-trace`` computes it. Errors are
|estimate − simulator| over the capacities of a 300-point log grid whose simulated hit ratio lies between 10% and
90% of the infinite-cache ceiling AND that are feasible (N ≥ N_min = the largest request: below it vLLM rejects
requests and the simulator's ratio leaves them out, which is no hit ratio of the workload; the estimator flags those
capacities infeasible). ``band`` = number of such capacities (0: the whole 10–90% band is infeasible).

Held out (never looked at while designing the estimator): WEKA trace_0030 … trace_0037 (7 files) and the second
half hour of Mooncake's conversation trace (timestamps ≥ 1,800 s). Design set: WEKA trace_0001 … trace_0029
(27 files), Mooncake's first half hour.

Workloads:
* ``pool-uniform``: the WEKA conversations pooled like ``kvhit curve --blocks-trace DIR --arrival uniform
  --span 3600 --seed 0``; ``pool-poisson``: ``--arrival poisson --rate C/3600`` (same mean rate), seed 0.
  Estimator: the time-varying Poisson form from the trace's own start times.
* ``resample λ0``: whole conversations drawn with replacement (seed 0) from the pool, their relative timings and
  ids kept (ids re-namespaced per draw), Poisson starts at λ0 (from one conversation at a time to dozens
  active). Estimator: the time-varying Poisson form on the resampled stream (its own start histogram; the
  realized overlap of the conversations is not used). The stationary form (``lam0=``, from the pool alone) is
  checked by ``resample-stat`` instead.
* ``resample-stat λ0``: the stationary form (``lam0=λ0``, from the pool alone: no stream) against
  :func:`kvhit.sim.resample.resample_simulate` (stationary streams: starts on [−D − w, H], so the active set is
  stationary; cache warmed over w = min(H, D); H = ``--horizon`` s; mean of ``--reps`` replications, seed 0).
  The simulated mean carries its own sampling error (printed: ``ci``, the 95% half-width at the band's worst
  point).
* ``whatif`` (``--only whatif``, issue 23 §3): the stationary form (``lam0=``, footprint ``exact`` and ``own``)
  on the held-out pool against resample-and-simulate run until the stationary 95 % half-width (ratio of
  expectations with per-conversation token controls, :meth:`ResampleResult.stationary_ci`) is ≤ ``--ci``
  (default 0.005) over the 10–90 % band, at λ0 = 1/600, 1/120, 1/30 (horizons 36,000 / 36,000 / 3,600 s);
  ``--whatif-cache DIR`` keeps the replications (minutes each) for reruns.
* ``mooncake``: the conversation trace (sessions derived from the prefix tree), time-varying form.
* ``chat`` (``--only chat``, not run by default): ShareGPT as in ``benchmarks/estimator_accuracy.py``
  (1,000 warm-up + 5,000 measured conversations, b = 128, exponential W, seeds 0 1), measured window =
  App. E's, at N = 1,138 / 2,275 / 4,550; printed as estimate − simulated per point.
Form ``replay`` (the working-set identity on the trace's own load, not a model) is printed with ``--replay``.

    NUMBA_CACHE_DIR=.numba_cache .venv/bin/python benchmarks/agentic_accuracy.py [--quick] [--replay] [--json out]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from kvhit.estimate.agentic import estimate_trace
from kvhit.sim.vllm.curve import block_curve
from kvhit.workload.production import read_mooncake, read_weka
from kvhit.workload.production_trace import ProductionTrace
from kvhit.workload.reuse import request_reuse

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "data" / "traces"
WEKA = TRACES / "weka_kv_cache_tester" / "traces"
MOON = TRACES / "mooncake_fast25" / "conversation_trace.jsonl"
ENGINES = ("vllm", "vllm-0.23")


def weka_files(held_out: bool) -> list[str]:
    fs = sorted(str(p) for p in WEKA.glob("trace_*.json"))
    return [f for f in fs if (int(Path(f).stem.split("_")[1]) >= 30) == held_out]


def resample(pool: ProductionTrace, lam0: float, n_conv: int, seed: int) -> ProductionTrace:
    """Whole conversations of ``pool`` drawn with replacement, Poisson starts at ``lam0`` (first at 0), relative
    timings kept, block ids re-namespaced per draw (``(draw << 32) | local id``: a chained stream)."""
    rng = np.random.default_rng(seed)
    C = int(pool.session.max()) + 1
    draws = rng.integers(0, C, n_conv)
    starts = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / lam0, n_conv - 1))])
    return compose(pool, draws, starts, {"resample": {"lam0": lam0, "n_conv": n_conv, "seed": seed}})


def compose(pool: ProductionTrace, draws: np.ndarray, starts: np.ndarray, meta: dict) -> ProductionTrace:
    """Conversations ``draws`` of ``pool`` (repeats allowed) started at ``starts``, relative timings kept, block
    ids re-namespaced per draw (``(draw << 32) | local id``: each copy is a distinct conversation)."""
    sess = pool.session
    C = int(sess.max()) + 1
    n_conv = draws.shape[0]
    first = np.full(C, np.inf)
    np.minimum.at(first, sess, pool.time)
    by = [np.flatnonzero(sess == k) for k in range(C)]
    rows = np.concatenate([by[k] for k in draws])
    d_of = np.repeat(np.arange(n_conv), [by[k].size for k in draws])
    t = starts[d_of] + pool.time[rows] - first[sess[rows]]
    counts = pool.full_blocks[rows]
    pos = np.repeat(pool.hash_offsets[rows], counts) + (
        np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    )
    ids = (np.repeat(d_of, counts).astype(np.int64) << 32) | (pool.hashes[pos] & 0xFFFFFFFF)
    order = np.argsort(t, kind="stable")
    off0 = np.concatenate([[0], np.cumsum(counts)])
    c2 = counts[order]
    pos2 = np.repeat(off0[:-1][order], c2) + (np.arange(int(c2.sum())) - np.repeat(np.cumsum(c2) - c2, c2))
    off = np.concatenate([[0], np.cumsum(c2)]).astype(np.int64)
    r = rows[order]
    return replace(
        pool,
        time=t[order],
        prompt_tokens=pool.prompt_tokens[r],
        output_tokens=pool.output_tokens[r],
        hash_offsets=off,
        hashes=ids[pos2],
        session=d_of[order].astype(np.int64),
        agent=pool.agent[r],
        model=None if pool.model is None else pool.model[r],
        file_index=pool.file_index[r],
        record=pool.record[r],
        sub_record=pool.sub_record[r],
        meta=meta,
    )


def grid(pt: ProductionTrace, points: int) -> np.ndarray:
    d = pt.describe()
    return np.unique(np.geomspace(d["min_N"], 4 * d["distinct_blocks"], points).astype(np.int64))


def errors(est: np.ndarray, sim: np.ndarray, hmax: float, Ns: np.ndarray, N_min: int) -> tuple[int, float, float]:
    band = (Ns >= N_min) & (sim >= 0.1 * hmax) & (sim <= 0.9 * hmax) & np.isfinite(sim)
    if not band.any():
        return 0, float("nan"), float("nan")
    e = np.abs(est - sim)[band]
    return int(band.sum()), float(e.max()), float(e.mean())


def row(out, workload, held, lam0, engine, form, n, mx, mean, t_est):
    out.append(
        {
            "workload": workload,
            "held_out": held,
            "lam0": lam0,
            "engine": engine,
            "form": form,
            "band": n,
            "max_err": mx,
            "mean_err": mean,
            "estimate_s": t_est,
        }
    )
    lam = "" if lam0 is None else f"{lam0:.3g}"
    print(
        f"{workload:16s} {'held-out' if held else 'design':8s} {lam:>9s} {engine:9s} {form:7s} {n:5d} "
        f"{mx:8.4f} {mean:8.4f} {t_est:7.2f}",
        flush=True,
    )


def trace_rows(out, pt, workload, held, lam0, forms, points, mask=None, est_source=None, est_lam0=None, tag=None):
    rq = pt.to_block_requests()
    Ns = grid(pt, points)
    u = request_reuse(pt)  # same request order as pt (both sorted by time, stable)
    d = pt.describe()
    N_min = int(d["min_N"])
    for eng in ENGINES:
        c = block_curve(
            rq.prompt_tokens,
            rq.hash_offsets,
            rq.hashes,
            block_size=rq.block_size,
            Ns=Ns,
            engine=eng,
            mask=mask,
            fallback="nan",  # infeasible capacities (N < N_min) are not compared
        )
        sim = c["token_hit_ratio"]
        m = np.ones(pt.n_requests, bool) if mask is None else mask
        hmax = float(u.reusable[m].sum() * u.block_size / u.prompt_tokens[m].sum())  # infinite-cache ceiling
        for form in forms:
            src = u if est_source is None else est_source
            t0 = time.perf_counter()
            e = estimate_trace(src, Ns, engine=eng, form=form, lam0=est_lam0 if form == "poisson" else None)
            dt = time.perf_counter() - t0
            n, mx, mean = errors(e.h, sim, hmax, Ns, N_min)
            row(out, workload, held, lam0, eng, tag or form, n, mx, mean, dt)


def chat(out: list) -> None:
    from kvhit.sim.runner import block_requests, simulate_trace_block
    from kvhit.workload.dists import Exponential
    from kvhit.workload.sharegpt_trace import build_sharegpt_trace
    from kvhit.workload.trace import Window

    for lam0, mu in ((1.5, 90.0), (1.5, 135.0), (1.5, 240.0), (0.5, 135.0), (2.0, 135.0)):
        for seed in (0, 1):
            tr, _ = build_sharegpt_trace(
                n_warm=1000, n_meas=5000, seed=seed, lam0=lam0, interarrival=Exponential(mu), block_size=128
            )
            win = Window.warmup_conversations(tr, 1000)
            rq = block_requests(tr, source="counts")
            u = request_reuse(tr)
            m = win.mask(tr)
            Ns = np.array([1138, 2275, 4550])
            for eng in ENGINES:
                sim = np.array(
                    [
                        float(
                            simulate_trace_block(tr, int(N), engine=eng, window=win, requests=rq)[1]["token_hit_ratio"]
                        )
                        for N in Ns
                    ]
                )
                t0 = time.perf_counter()
                e = estimate_trace(u, Ns, engine=eng, mask=m)
                dt = time.perf_counter() - t0
                d = e.h - sim
                out.append(
                    {
                        "workload": "chat",
                        "lam0": lam0,
                        "mu": mu,
                        "seed": seed,
                        "engine": eng,
                        "N": Ns.tolist(),
                        "sim": sim.tolist(),
                        "err": d.tolist(),
                        "estimate_s": dt,
                    }
                )
                print(
                    f"chat λ0={lam0} μ={mu:.0f} seed={seed} {eng:9s} sim {np.round(sim, 4)} "
                    f"est−sim {np.round(d, 4)}  {dt:.1f}s",
                    flush=True,
                )


# --------------------------------------------------------------------------------------------------
# issue 23: the realisation band and the expected value over seeds
# --------------------------------------------------------------------------------------------------


def band_pools(quick: bool) -> list[tuple[str, bool, ProductionTrace, np.ndarray]]:
    """(name, held_out, base trace read sequentially, draws). ``design-27``: trace_0001 … trace_0029 (the point
    estimator's design set; the band was developed on it); ``held-35a/b/c``: 35 conversations drawn with
    replacement (seeds 100 / 101 / 102 / 103 / 104 / 105; ``held-35c`` added after the start-bin rule was fixed,
    ``held-35d`` after the replays' order option was coded, issue 23 §2, ``held-35e`` after the ``keep-span`` law was
    coded and the rule choosing the default fixed, ``held-35f`` after that rule failed on held-35e and a second rule
    was fixed, docs/estimators.md §4.1; ``held-35h`` / ``held-35i`` (seeds 106 / 107) after the exchangeable
    expected value ``expected_replays`` was coded and the rule judging it fixed — not the fleet benchmark's
    ``held-35g``, another draw) from
    the 7 held-out files trace_0030 … trace_0037, ids re-namespaced per draw (each copy is a distinct
    conversation: only 7 held-out files exist, so a held-out pool of 30–40 must repeat shapes); ``all-34``: every
    stored file (27 design + 7 held-out; not held out for the point estimator)."""
    out = []
    d = read_weka(weka_files(False))
    out.append(("design-27", False, d, np.arange(int(d.session.max()) + 1)))
    h = read_weka(weka_files(True))
    Ch = int(h.session.max()) + 1
    tags = (("a", 100), ("b", 101), ("c", 102), ("d", 103), ("e", 104), ("f", 105), ("h", 106), ("i", 107))
    for tag, s in tags[: 1 if quick else len(tags)]:
        out.append((f"held-35{tag}", True, h, np.random.default_rng(s).integers(0, Ch, 35)))
    if not quick:
        a = read_weka(sorted(str(p) for p in WEKA.glob("trace_*.json")))
        out.append(("all-34", False, a, np.arange(int(a.session.max()) + 1)))
    return out


def realisation_starts(arrival: str, C: int, seed: int) -> np.ndarray:
    """Start times of one realisation: ``uniform`` on [0, 3600] s, or ``poisson`` at C/3600 per s (first at 0),
    the k-th arrival going to conversation k in every seed (as ``--arrival poisson`` pools files in order: the
    order of the conversations is the same in every realisation), or ``poisson-shuffled``: the same arrival times
    dealt to the conversations in a random order per seed (a Poisson stream of the pool's conversations in random
    order — the exchangeable law the estimator and the band's replays model)."""
    rng = np.random.default_rng(seed)
    if arrival == "uniform":
        return rng.uniform(0.0, 3600.0, C)
    t = np.concatenate([[0.0], np.cumsum(rng.exponential(3600.0 / C, C - 1))])
    return rng.permutation(t) if arrival == "poisson-shuffled" else t


def band_rows(
    out: list,
    quick: bool,
    seeds_mean: int,
    seeds_band: int,
    replays: int,
    level: float,
    points: int,
    pools=None,
    engines=None,
    sim_seeds: int | None = None,
    arrivals=("uniform", "poisson", "poisson-shuffled"),
    orders=None,
    expected_se: float | None = None,
):
    """``seeds_mean`` realisations with an estimate; the simulated mean of target (b) is over ``sim_seeds``
    (≥ ``seeds_mean``, default equal) realisations: more simulated seeds shrink the reference's own error.
    ``orders``: the replays' start laws (``keep`` / ``random`` / ``keep-span``), one row each on the same seeds and
    references. ``expected_se``: also the exchangeable law's expected value
    :func:`~kvhit.estimate.band.expected_replays` at that standard error for each band seed (``h_exp``; its
    errors in the row's ``exp_*`` fields)."""
    from kvhit.estimate.band import DEFAULT_ORDER, estimate_trace_band, expected_replays

    orders = list(orders or [DEFAULT_ORDER])

    sim_seeds = max(sim_seeds or seeds_mean, seeds_mean)

    engines = engines or (ENGINES[:1] if quick else ENGINES)
    print(
        f"\n{'pool':10s} {'set':8s} {'arrival':16s} {'engine':9s} {'order':6s} {'pts':>5s} {'cover':>6s} {'width':>6s} "
        f"{'|E-sim|':>7s} {'se_sim':>6s} {'seed|E-sim|':>11s} {'|mc-sim|':>8s} {'|Emc-sim|':>9s} {'validated':>9s} "
        f"{'s':>6s}"
    )
    for name, held, base, draws in band_pools(quick):
        if pools and name not in pools:
            continue
        C = draws.shape[0]
        for arrival in arrivals:
            traces = [compose(base, draws, realisation_starts(arrival, C, s), {"seed": s}) for s in range(sim_seeds)]
            Ns = grid(traces[0], points)
            for eng in engines:
                t0 = time.perf_counter()
                sims, ests = [], []
                mcs, cover, widths, val, gaps, own = ({o: [] for o in orders} for _ in range(6))
                exps, exp_se, exp_k = [], [], []
                h_max = N_min = None
                for s, pt in enumerate(traces):
                    rq = pt.to_block_requests()
                    c = block_curve(
                        rq.prompt_tokens,
                        rq.hash_offsets,
                        rq.hashes,
                        block_size=rq.block_size,
                        Ns=Ns,
                        engine=eng,
                        fallback="nan",
                    )
                    sim = c["token_hit_ratio"]
                    if s >= seeds_mean:  # a reference-only realisation: no estimate
                        sims.append(sim)
                        continue
                    if s < seeds_band and expected_se:
                        ev = expected_replays(pt, Ns, engine=eng, se=expected_se, seed=1000 + s)
                        exps.append(ev.h)
                        exp_se.append(float(np.nanmax(ev.se)))
                        exp_k.append(ev.replays)
                    if s < seeds_band:
                        for o in orders:  # same seed per order: the draws' multiset is the same, only the order differs
                            e, _ = estimate_trace_band(
                                pt, Ns, engine=eng, level=level, replays=replays, seed=1000 + s, order=o
                            )
                            mcs[o].append(e.h_mc)
                            h_max, N_min = e.h_max, e.N_min
                            m = (Ns >= N_min) & (sim >= 0.1 * h_max) & (sim <= 0.9 * h_max) & np.isfinite(sim)
                            cover[o].append(((sim >= e.h_lo) & (sim <= e.h_hi))[m])
                            gaps[o].append(np.maximum(np.maximum(e.h_lo - sim, sim - e.h_hi), 0.0)[m])
                            widths[o].append((e.h_hi - e.h_lo)[m])
                            own[o].append(np.abs(e.h_mc - sim)[m])  # h_mc against its own realisation
                            val[o].append(bool(e.regime.get("validated")))
                    else:
                        e = estimate_trace(pt, Ns, engine=eng)
                        h_max, N_min = e.h_max, e.N_min
                    sims.append(sim)
                    ests.append(e.h)
                S, E = np.array(sims), np.array(ests)
                ms = S.mean(axis=0)
                se = S.std(axis=0, ddof=1) / math.sqrt(S.shape[0])
                mb = (Ns >= N_min) & (ms >= 0.1 * h_max) & (ms <= 0.9 * h_max) & np.isfinite(ms)
                exp_row = {}
                if exps and mb.any():
                    X = np.array(exps)
                    d_seed = np.abs(X - ms)[:, mb].max(axis=1)
                    exp_row = {
                        "exp_se_target": expected_se,
                        "exp_mean_err_max": float(np.abs(X.mean(axis=0) - ms)[mb].max()),
                        "exp_mean_signed_at_worst": float(
                            (X.mean(axis=0) - ms)[mb][np.argmax(np.abs(X.mean(axis=0) - ms)[mb])]
                        ),
                        "exp_seed_err_max": [float(x) for x in d_seed],
                        "exp_seeds_within_0.01": int((d_seed <= 0.01).sum()),
                        "exp_se_max": exp_se,
                        "exp_replays": exp_k,
                    }
                    worst, signed = exp_row["exp_mean_err_max"], exp_row["exp_mean_signed_at_worst"]
                    within = exp_row["exp_seeds_within_0.01"]
                    print(
                        f"  h_exp (exchangeable law, se {expected_se}): mean over {len(exps)} seeds max|E-sim| "
                        f"{worst:.4f} (signed {signed:+.4f}); per seed {' '.join(f'{x:.4f}' for x in d_seed)} "
                        f"({within}/{len(exps)} within 0.01); replays {exp_k}; reference se {float(se[mb].max()):.4f}",
                        flush=True,
                    )
                for o in orders:
                    cover_o, widths_o, gaps_o, mcs_o, val_o = cover[o], widths[o], gaps[o], mcs[o], val[o]
                    cov = np.concatenate(cover_o) if cover_o else np.zeros(0, bool)
                    wid = np.concatenate(widths_o) if widths_o else np.zeros(0)
                    nan = float("nan")
                    err_mean = float(np.abs(E.mean(axis=0) - ms)[mb].max()) if mb.any() else nan
                    err_seed = float(np.abs(E - ms)[:, mb].max()) if mb.any() else nan
                    err_mc = float(np.abs(np.array(mcs_o) - ms)[:, mb].max()) if mb.any() and mcs_o else nan
                    # the replays' mean as the expected value: mean over the band seeds of h_mc vs the simulated mean
                    err_mc_mean = float(np.abs(np.mean(mcs_o, axis=0) - ms)[mb].max()) if mb.any() and mcs_o else nan
                    # per band seed: its flag, its estimate's max |E_s − 16-seed simulated mean|, its coverage
                    per_seed = [
                        {
                            "seed": s,
                            "validated": val_o[s],
                            "expected_err_max": float(np.abs(E[s] - ms)[mb].max()) if mb.any() else nan,
                            "coverage": float(cover_o[s].mean()) if cover_o[s].size else nan,
                        }
                        for s in range(len(val_o))
                    ]
                    ev = [q["expected_err_max"] for q in per_seed if q["validated"]]
                    se_w = float(se[mb].max()) if mb.any() else nan
                    r = {
                        "workload": "band",
                        "pool": name,
                        "held_out": held,
                        "arrival": arrival,
                        "engine": eng,
                        "order": o,
                        "points": int(cov.size),
                        "coverage": float(cov.mean()) if cov.size else nan,
                        "mean_width": float(wid.mean()) if wid.size else nan,
                        "expected_err_max": err_mean,
                        "sim_mean_se_max": se_w,
                        "per_seed_expected_err_max": err_seed,
                        "replay_mean_err_max": err_mc,
                        "replay_mean_expected_err_max": err_mc_mean,
                        "validated_share": float(np.mean(val_o)) if val_o else nan,
                        "expected_err_max_validated_seeds": max(ev) if ev else nan,
                        "own_err_mean": float(np.concatenate(own[o]).mean()) if own[o] else nan,
                        "own_err_max": float(np.concatenate(own[o]).max()) if own[o] else nan,
                        "miss_gap_max": float(g.max())
                        if (g := np.concatenate(gaps_o) if gaps_o else np.zeros(0)).size
                        else nan,
                        "per_seed": per_seed,
                        "seeds_mean": seeds_mean,
                        "sim_seeds": sim_seeds,
                        "seeds_band": seeds_band,
                        "replays": replays,
                        "level": level,
                        "elapsed_s": time.perf_counter() - t0,
                    } | exp_row
                    out.append(r)
                    print(
                        f"{name:10s} {'held-out' if held else 'design':8s} {arrival:16s} {eng:9s} {o:6s} "
                        f"{r['points']:5d} "
                        f"{r['coverage']:6.3f} {r['mean_width']:6.3f} {err_mean:7.4f} {se_w:6.4f} {err_seed:11.4f} "
                        f"{err_mc:8.4f} {err_mc_mean:9.4f} {r['validated_share']:9.2f} {r['elapsed_s']:6.0f}  "
                        f"(validated seeds: max |E_s-sim| {r['expected_err_max_validated_seeds']:.4f}; "
                        f"largest miss outside the band {r['miss_gap_max']:.4f}; |h_mc - own sim| mean "
                        f"{r['own_err_mean']:.4f} max {r['own_err_max']:.4f})",
                        flush=True,
                    )


# --------------------------------------------------------------------------------------------------
# issue 23 §3: the stationary what-if against resample-and-simulate run to a CI half-width
# --------------------------------------------------------------------------------------------------

#: λ0 (per s) → measured horizon H (s) of one replication (the warm-up is resample()'s default min(H, D))
WHATIF_RATES = {600: 36000.0, 120: 36000.0, 30: 3600.0}


def whatif_reference(
    cp, Ns, inv: int, horizon: float, ci: float, budget_s: float, hmax: float, cache: Path | None, seed0: int = 0
):
    """Replications (seeds seed0, seed0 + 1, …: 10, then batches of 4) until the stationary 95 % half-width
    (:meth:`ResampleResult.stationary_ci`, per-conversation token controls) is ≤ ``ci`` at every capacity of the
    10–90 % band, or ``budget_s`` is spent in this call. Saved to ``cache/whatif_<inv>.npz`` after every batch; a
    cached run is reused, and resumed (next seeds) when it had not reached ``ci``. ``elapsed`` sums all calls."""
    from kvhit.sim.feasibility import feasibility
    from kvhit.sim.resample import resample_simulate

    feas = feasibility(cp.prompt_tokens, cp.block_size, Ns)
    f = None if cache is None else cache / (f"whatif_{inv}.npz" if seed0 == 0 else f"whatif_{inv}_s{seed0}.npz")
    z = None
    if f is not None and f.exists():
        z = dict(np.load(f))
        if not (np.array_equal(z["N"], Ns) and float(z["horizon"]) == horizon):
            z = None
    t0 = time.perf_counter()
    el0 = 0.0 if z is None else float(z["elapsed"])
    while True:
        if z is not None:
            m, hw = _stationary(z, feas)[0]
            band = (Ns >= cp.N_min) & (m >= 0.1 * hmax) & (m <= 0.9 * hmax)
            n = int(z["seeds"].shape[0])
            if (n >= 8 and np.nanmax(hw[band]) <= ci) or time.perf_counter() - t0 > budget_s:
                return z
        done = 0 if z is None else int(z["seeds"].shape[0])
        step = 10 if done == 0 else 4
        r = resample_simulate(cp, Ns, lam0=1.0 / inv, horizon=horizon, replications=step, seed=seed0 + done)
        new = {
            "tok": r.token_hit_ratio,
            "q": r.token_queries,
            "ctl": r.control_tokens,
            "seeds": np.array(r.seeds),
        }
        if z is None:
            z = new | {"N": Ns, "mu": r.control_mean, "horizon": horizon, "warmup": r.warmup}
        else:
            z = z | {k: np.concatenate([z[k], v]) for k, v in new.items()}
        z["elapsed"] = el0 + time.perf_counter() - t0
        if f is not None:
            f.parent.mkdir(parents=True, exist_ok=True)
            tmp = f.with_suffix(".tmp.npz")
            np.savez(tmp, **z)
            tmp.replace(f)


def _stationary(z: dict, feas, rows=None):
    """Stationary ratio and half-width (with and without the controls) of the replications ``rows`` (None: all)."""
    from kvhit.sim.resample import ResampleResult

    sl = slice(None) if rows is None else rows
    r = ResampleResult(
        N=z["N"],
        engine="vllm",
        metric="tokens",
        lam0=float("nan"),
        horizon=float(z["horizon"]),
        warmup=float(z["warmup"]),
        seeds=[int(x) for x in np.asarray(z["seeds"])[sl]],
        token_hit_ratio=z["tok"][sl],
        block_hit_ratio=z["tok"][sl],
        feasibility=feas,
        n_measured=[],
        n_started=[],
        token_queries=z["q"][sl],
        block_queries=z["q"][sl],
        control_tokens=z["ctl"][sl],
        control_mean=z["mu"],
    )
    return r.stationary_ci(), r.stationary_ci(controls=False)


def whatif_rows(
    out: list, ci: float, budget_s: float, cache: Path | None, rates=None, splits: int = 4, seed0: int = 0
) -> None:
    """The stationary what-if (``lam0=``) on the held-out WEKA pool (trace_0030 … trace_0037, 7 conversations:
    never used to design the estimator nor the footprint) against :func:`whatif_reference`. Per λ0: replications,
    reference seconds, achieved half-width; max and mean (signed) error over the feasible 10–90 % band for the
    ``exact`` (default) and ``own`` footprints; and the max error against each of ``splits`` disjoint seed blocks
    of the reference (independent references with wider intervals: worst and spread)."""
    from kvhit.sim.feasibility import feasibility
    from kvhit.sim.resample import conversation_pool

    pool = read_weka(weka_files(True), arrival="uniform", span=3600, seed=0)
    up = request_reuse(pool)
    cp = conversation_pool(pool)
    hmax = up.ceiling()
    Ns = np.unique(np.geomspace(cp.N_min, 4 * up.distinct_blocks, 100).astype(np.int64))
    print(
        f"\n{'λ0':>7s} {'H_s':>6s} {'reps':>5s} {'ref_s':>6s} {'hw95':>6s} {'pts':>4s} {'footprint':9s} "
        f"{'max|err|':>8s} {'mean err':>8s} {'est_s':>6s}  per seed block: max|err| (its hw95)"
    )
    for inv in rates or WHATIF_RATES:
        H = WHATIF_RATES[inv]
        z = whatif_reference(cp, Ns, inv, H, ci, budget_s, hmax, cache, seed0)
        feas = feasibility(cp.prompt_tokens, cp.block_size, Ns)
        (m, hw), (mp, hwp) = _stationary(z, feas)
        band = (Ns >= cp.N_min) & (m >= 0.1 * hmax) & (m <= 0.9 * hmax) & np.isfinite(m)
        n = int(np.asarray(z["seeds"]).shape[0])
        blocks = np.array_split(np.arange(n), splits)
        sub = [_stationary(z, feas, b)[0] for b in blocks]
        for fp in ("exact", "own"):
            t0 = time.perf_counter()
            e = estimate_trace(up, Ns, engine="vllm", lam0=1.0 / inv, footprint=fp)
            dt = time.perf_counter() - t0
            d = (e.h - m)[band]
            per = [float(np.abs(e.h - sm)[band].max()) for sm, _ in sub]
            per_hw = [float(np.nanmax(sh[band])) for _, sh in sub]
            rec = {
                "workload": "whatif",
                "pool": "held-out trace_0030-0037",
                "lam0": 1.0 / inv,
                "horizon_s": H,
                "replications": n,
                "first_seed": seed0,
                "reference_s": float(z["elapsed"]),
                "ci95_max": float(np.nanmax(hw[band])),
                "ci95_plain_ratio_max": float(np.nanmax(hwp[band])),
                "points": int(band.sum()),
                "footprint": fp,
                "max_err": float(np.abs(d).max()),
                "mean_err": float(d.mean()),
                "max_err_plain_ratio_ref": float(np.abs(e.h - mp)[band].max()),
                "seed_blocks_max_err": per,
                "seed_blocks_ci95_max": per_hw,
                "validated": bool(e.regime.get("validated")),
                "estimate_s": dt,
            }
            out.append(rec)
            print(
                f"1/{inv:<5d} {H:6.0f} {n:5d} {rec['reference_s']:6.0f} {rec['ci95_max']:6.4f} {rec['points']:4d} "
                f"{fp:9s} {rec['max_err']:8.4f} {rec['mean_err']:+8.4f} {dt:6.2f}  "
                + " ".join(f"{a:.4f}({b:.4f})" for a, b in zip(per, per_hw, strict=True)),
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer capacities and resample rates")
    ap.add_argument("--replay", action="store_true", help="also print the replay (working-set) form")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--n-conv", type=int, default=120, help="conversations per resampled stream")
    ap.add_argument("--horizon", type=float, default=36000.0, help="resample-stat: measured horizon (s)")
    ap.add_argument("--reps", type=int, default=4, help="resample-stat: replications")
    ap.add_argument(
        "--only", nargs="*", default=None, help="pool resample stationary mooncake chat (default: all but chat)"
    )
    ap.add_argument("--ci", type=float, default=None, help="resample-stat: replications until this 95%% half-width")
    ap.add_argument("--ci-seconds", type=float, default=600.0, help="resample-stat --ci: time cap per λ0 (s)")
    ap.add_argument("--seeds", type=int, default=16, help="band: realisations for the expected-value target (b)")
    ap.add_argument(
        "--arrivals",
        nargs="*",
        default=["uniform", "poisson", "poisson-shuffled"],
        help="band: start laws (uniform, poisson = fixed conversation order, poisson-shuffled)",
    )
    ap.add_argument(
        "--sim-seeds", type=int, default=None, help="band: simulated realisations behind the reference mean of (b)"
    )
    ap.add_argument("--band-seeds", type=int, default=8, help="band: realisations with a band (target (a))")
    ap.add_argument("--band-replays", type=int, default=16, help="band: replays K behind each band")
    ap.add_argument(
        "--band-orders",
        nargs="*",
        default=None,
        help="band: the replays' start laws, one row each on the same seeds (keep random keep-span; "
        "default the band's)",
    )
    ap.add_argument("--level", type=float, default=0.9, help="band: level")
    ap.add_argument(
        "--expected-se",
        type=float,
        default=None,
        help="band: also the exchangeable law's expected value by replays to this standard error (h_exp)",
    )
    ap.add_argument("--engines", nargs="*", default=None, help="band: vllm vllm-0.23 (default both; --quick vllm)")
    ap.add_argument(
        "--pools", nargs="*", default=None, help="band: design-27 held-35a held-35b held-35c all-34 (default all)"
    )
    ap.add_argument("--whatif-budget", type=float, default=1800.0, help="whatif: reference seconds per λ0")
    ap.add_argument("--whatif-cache", type=Path, default=None, help="whatif: save/reuse the reference replications")
    ap.add_argument("--whatif-rates", nargs="*", type=int, default=None, help="whatif: 1/λ0 values (600 120 30)")
    ap.add_argument("--whatif-seed0", type=int, default=0, help="whatif: first seed (another, independent reference)")
    a = ap.parse_args()
    if a.only is not None and "whatif" in a.only:
        out_w: list[dict] = []
        whatif_rows(out_w, a.ci or 0.005, a.whatif_budget, a.whatif_cache, a.whatif_rates, seed0=a.whatif_seed0)
        if a.json:
            a.json.write_text(json.dumps(out_w, indent=1))
        if a.only == ["whatif"]:
            return
    if a.only is not None and "band" in a.only:
        out_b: list[dict] = []
        band_rows(
            out_b,
            a.quick,
            a.seeds,
            a.band_seeds,
            a.band_replays,
            a.level,
            40 if a.quick else 80,
            a.pools,
            a.engines,
            a.sim_seeds,
            a.arrivals,
            a.band_orders,
            a.expected_se,
        )
        if a.json:
            a.json.write_text(json.dumps(out_b, indent=1))
        if a.only == ["band"]:
            return
    points = 120 if a.quick else 300
    forms = ("poisson", "replay") if a.replay else ("poisson",)
    out: list[dict] = []
    print(
        f"{'workload':16s} {'set':8s} {'lam0':>9s} {'engine':9s} {'form':7s} {'band':>5s} {'max|err|':>8s} "
        f"{'mean':>8s} {'est_s':>7s}"
    )
    lams = [1e-5, 1 / 3600, 1 / 600, 1 / 120] if not a.quick else [1e-5, 1 / 600]
    for held in (False, True):
        files = weka_files(held)
        C = len(files)
        if a.only is None or "pool" in a.only:
            pu = read_weka(files, arrival="uniform", span=3600, seed=0)
            trace_rows(out, pu, "pool-uniform", held, None, forms, points)
            pp = read_weka(files, arrival="poisson", rate=C / 3600, seed=0)
            trace_rows(out, pp, "pool-poisson", held, None, forms, points)
        if a.only is None or "resample" in a.only:
            pool = read_weka(files, arrival="uniform", span=3600, seed=0)
            for lam0 in lams:
                rs = resample(pool, lam0, a.n_conv, seed=0)
                trace_rows(out, rs, "resample", held, lam0, forms, points, tag=None)
        if a.only is None or "stationary" in a.only:
            from kvhit.sim.resample import conversation_pool, resample_simulate

            pool = read_weka(files, arrival="uniform", span=3600, seed=0)
            up = request_reuse(pool)
            cp = conversation_pool(pool)
            hmax = up.ceiling()
            Ns = np.unique(np.geomspace(cp.N_min, 4 * up.distinct_blocks, points // 3).astype(np.int64))
            for lam0 in lams[1:]:
                if a.ci is None:
                    rr = resample_simulate(cp, Ns, lam0=lam0, horizon=a.horizon, replications=a.reps, seed=0)
                else:  # issue 23 §3: replications until the 95 % half-width <= --ci (or --ci-seconds)
                    from kvhit.sim.resample_adaptive import resample_to_ci

                    rr = resample_to_ci(
                        cp,
                        Ns,
                        ci=a.ci,
                        lam0=lam0,
                        horizon=a.horizon,
                        seed=0,
                        max_seconds=a.ci_seconds,
                        max_replications=400,
                    )
                    print(
                        f"{'':16s} λ0={lam0:.3g}: {len(rr.seeds)} replications, half-width "
                        f"{rr.extra['achieved_ci']:.4f} (target {a.ci}, reached {rr.extra['reached']}), "
                        f"{rr.extra['elapsed_s']:.0f} s",
                        flush=True,
                    )
                mc = rr.mean_ci()
                for eng in ENGINES[:1]:
                    t0 = time.perf_counter()
                    e = estimate_trace(up, Ns, engine=eng, lam0=lam0)
                    dt = time.perf_counter() - t0
                    n, mx, mean = errors(e.h, mc[0], hmax, Ns, cp.N_min)
                    row(out, "resample-stat", held, lam0, eng, "stat", n, mx, mean, dt)
                    if n:
                        band = (Ns >= cp.N_min) & (mc[0] >= 0.1 * hmax) & (mc[0] <= 0.9 * hmax)
                        worst = np.flatnonzero(band)[np.argmax(np.abs(e.h - mc[0])[band])]
                        print(f"{'':16s} ci half-width at the worst point: {float(np.asarray(mc[1])[worst]):.4f}")
        if a.only is None or "mooncake" in a.only:
            mc = read_mooncake(MOON)
            half = mc.select(mc.time >= 1800.0) if held else mc.select(mc.time < 1800.0)
            trace_rows(out, half, "mooncake-half", held, None, forms, points)
    if a.only is not None and "chat" in a.only:
        chat(out)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
