"""The paper's LLM-serving experiments (§4, App. E), end to end, on the bundled ShareGPT data: the grids of
points, the parallel runner and the summary against the paper's bounds.

The pieces: the settings (workload, capacity, timing of eq. (80), grids) in :mod:`kvhit.experiments.paper_setting`;
the estimator registry and the ingredient columns in :mod:`kvhit.experiments.paper_estimators`; one run (a seed's
sample re-timed for a point, the simulated actuals, every estimate) in :mod:`kvhit.experiments.paper_runs`.
Experiment 1 varies μ_F at fixed λ0, Experiment 2 λ0 at fixed μ_F (:func:`points`); :func:`run_experiments`
runs every (seed, point) once, :func:`summarize` reduces the runs.

Statistics
----------
Each seed draws a new ShareGPT sample and new timing draws. Within a seed every point uses the same sample and
the same unit-exponential draws (arrivals E_i/λ0, gaps max(W^E2E, μ_F·E'_ij): common random numbers), so the
curves of one seed are smooth in μ_F and λ0. Points report the mean over seeds and a Student-t 95% interval.

Invariant: a (seed, λ0, μ_F) shared by both experiments is run once, and the runs are sorted by (seed, λ0, μ_F)
whatever the number of worker processes, so the summary does not depend on ``jobs``.

NOT modelled here: what a run computes (:mod:`kvhit.experiments.paper_runs`) and the figures and report
(:mod:`kvhit.experiments.report`).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from kvhit.experiments.paper_estimators import (
    ENGINE_TARGET,
    ESTIMATOR_TARGETS,
    ESTIMATORS,
    INGREDIENT_COLUMNS,
    INGREDIENT_LABELS,
    PAPER_ESTIMATORS,
    Estimator,
    _metric_key,
)
from kvhit.experiments.paper_runs import Sample, actuals, load_sample, run_point
from kvhit.experiments.paper_setting import ExperimentError, Setting, get_setting
from kvhit.sim.metrics import mean_ci

__all__ = ["Point", "points", "run_experiments", "summarize", "PAPER_BOUNDS"]

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Point:
    """One point of App. E's grids: the experiment (1 or 2), λ0 (1/s) and the target mean gap μ_F (s)."""

    experiment: int  # 1 or 2
    lam0: float
    mu_F: float

    @property
    def x(self) -> float:
        return self.mu_F if self.experiment == 1 else self.lam0


def points(setting: Setting) -> list[Point]:
    """Experiment 1's then Experiment 2's points."""
    p = [Point(1, float(setting.exp1_lam0), float(m)) for m in setting.exp1_mu_F]
    p += [Point(2, float(lam), float(setting.exp2_mu_F)) for lam in setting.exp2_lam0]
    return p


_SAMPLES: dict[tuple, Sample] = {}  # per-process cache (each worker keeps the last samples it used)
_WORKER: dict[str, Any] = {}


def _get_sample(setting: Setting, seed: int, cache_dir) -> Sample:
    key = (setting.n_warm, setting.n_meas, setting.block_size, int(seed), str(cache_dir))
    s = _SAMPLES.get(key)
    if s is None:
        if len(_SAMPLES) >= 2:
            _SAMPLES.pop(next(iter(_SAMPLES)))
        s = _SAMPLES[key] = load_sample(setting, seed, cache_dir=cache_dir)
    return s


def _task(args: tuple[int, float, float]) -> dict[str, Any]:
    seed, lam0, mu_F = args
    st, cache_dir, est = _WORKER["setting"], _WORKER["cache_dir"], _WORKER["estimators"]
    return run_point(_get_sample(st, seed, cache_dir), st, lam0, mu_F, est)


def _init_worker(setting: Setting, cache_dir, estimators) -> None:
    _WORKER.update(setting=setting, cache_dir=cache_dir, estimators=estimators)


def run_experiments(
    setting: str | Setting = "paper",
    *,
    seeds: Iterable[int] | None = None,
    jobs: int | None = None,
    cache_dir=None,
    estimators: dict[str, Estimator] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run every (seed, point) of a setting, in parallel over ``jobs`` processes (default ``os.cpu_count()``).

    The ShareGPT token cache is built (or found) once in this process before any worker starts. A (seed, λ0,
    μ_F) shared by both experiments is run once. ``progress(done, total)`` counts runs. Returns
    ``{"setting", "runs", "seconds", "jobs"}``; see :func:`summarize` for the statistics.
    """
    st = get_setting(setting)
    if seeds is not None:
        st = replace(st, seeds=tuple(int(s) for s in seeds))
    est = dict(ESTIMATORS if estimators is None else estimators)
    for name, fn in est.items():
        if not callable(fn) or "/" in name:
            raise ExperimentError(f"estimators[{name!r}]: expected a callable with a name without '/'")
    acts = actuals(st)
    # targeted estimators whose actual this setting does not produce (an engine it does not simulate) are skipped
    est = {k: v for k, v in est.items() if ESTIMATOR_TARGETS.get(k, next(iter(acts))) in acts}
    targets = {k: ESTIMATOR_TARGETS[k] for k in est if k in ESTIMATOR_TARGETS}
    jobs = (os.cpu_count() or 1) if jobs is None else int(jobs)
    if jobs < 1:
        raise ExperimentError(f"jobs: expected ≥ 1, got {jobs}")
    t0 = time.perf_counter()
    from kvhit.workload.cache import load_tokenized

    load_tokenized(keep_ids=True, cache_dir=cache_dir)  # build the token cache once, before forking
    tasks = sorted({(s, p.lam0, p.mu_F) for s in st.seeds for p in points(st)})  # seed-major: reuse samples
    total = len(tasks)
    results: list[dict[str, Any]] = []
    if progress is not None:
        progress(0, total)
    if jobs == 1 or total == 1:
        _init_worker(st, cache_dir, est)
        try:
            for k, t in enumerate(tasks):
                results.append(_task(t))
                if progress is not None:
                    progress(k + 1, total)
        finally:
            _WORKER.clear()
            _SAMPLES.clear()
    else:
        methods = mp.get_all_start_methods()
        ctx = mp.get_context("fork" if "fork" in methods else None)
        with ctx.Pool(min(jobs, total), initializer=_init_worker, initargs=(st, cache_dir, est)) as pool:
            for k, r in enumerate(pool.imap_unordered(_task, tasks, chunksize=1)):
                results.append(r)
                if progress is not None:
                    progress(k + 1, total)
    results.sort(key=lambda r: (r["seed"], r["lam0"], r["mu_F"]))
    return {
        "setting": st,
        "runs": results,
        "seconds": time.perf_counter() - t0,
        "jobs": jobs,
        "estimators": list(est),
        "targets": targets,
    }


#: The paper's reported bounds (App. E): (experiment, metric, estimators, x-range or None, bound, text).
PAPER_BOUNDS: list[dict[str, Any]] = [
    {"experiment": 1, "metric": "ae", "range": None, "bound": 0.02, "text": "Exp. 1: AE < 0.02"},
    {"experiment": 1, "metric": "re", "range": None, "bound": 0.16, "text": "Exp. 1: RE < 16%"},
    {
        "experiment": 1,
        "metric": "re",
        "range": (120.0, 165.0),
        "bound": 0.10,
        "text": "Exp. 1: RE < 10% for 120 ≤ μ_F ≤ 165 s",
    },
    {"experiment": 2, "metric": "ae", "range": None, "bound": 0.015, "text": "Exp. 2: AE < 0.015"},
    {"experiment": 2, "metric": "re", "range": None, "bound": 0.07, "text": "Exp. 2: RE < 7%"},
]


def _stat(values: list[float]) -> dict[str, Any]:
    v = [float(x) for x in values]
    m, hw = mean_ci(v)
    return {"mean": m, "ci95": hw, "values": v}


def _ingredient_summary(st: Setting, exps: dict[str, Any]) -> dict[str, Any] | None:
    """``summary["ingredients"]``: per experiment and vLLM actual, each point's mean signed error of every
    ingredient column, and the max over the grid of |mean signed error|, of the mean AE and of the per-run
    |error|, with whether :data:`ENGINE_TARGET` is met."""
    keys = [_metric_key(e, m) for m in ("blocks", "tokens") for e in st.engines]
    out: dict[str, Any] = {
        "target": ENGINE_TARGET,
        "columns": list(INGREDIENT_COLUMNS),
        "labels": dict(INGREDIENT_LABELS),
        "actuals": [],
        "experiments": {},
    }
    for e, ex in exps.items():
        pts = ex["points"]
        have = [
            a for a in keys if pts and all(f"ingr_err/{a}/{c}" in p["stats"] for p in pts for c in INGREDIENT_COLUMNS)
        ]
        if not have:
            continue
        out["actuals"] = sorted(set(out["actuals"]) | set(have), key=keys.index)
        g: dict[str, Any] = {"x_name": ex["x_name"], "points": [], "max_abs_error": {}, "max_ae": {}}
        g["max_abs_error_run"], g["target_met"], g["target_met_every_run"] = {}, {}, {}
        for p in pts:
            s = p["stats"]
            g["points"].append(
                {
                    "x": p["x"],
                    "lam0": p["lam0"],
                    "mu_F": p["mu_F"],
                    "actual": {a: s[f"actual/{a}"]["mean"] for a in have},
                    "error": {a: {c: s[f"ingr_err/{a}/{c}"]["mean"] for c in INGREDIENT_COLUMNS} for a in have},
                    "ci95": {a: {c: s[f"ingr_err/{a}/{c}"]["ci95"] for c in INGREDIENT_COLUMNS} for a in have},
                    "ae": {a: {c: s[f"ingr_ae/{a}/{c}"]["mean"] for c in INGREDIENT_COLUMNS} for a in have},
                }
            )
        for a in have:
            g["max_abs_error"][a], g["max_ae"][a], g["max_abs_error_run"][a] = {}, {}, {}
            g["target_met"][a], g["target_met_every_run"][a] = {}, {}
            for c in INGREDIENT_COLUMNS:
                st_ = [p["stats"][f"ingr_err/{a}/{c}"] for p in pts]
                ae = [p["stats"][f"ingr_ae/{a}/{c}"]["mean"] for p in pts]
                g["max_abs_error"][a][c] = max(abs(x["mean"]) for x in st_)
                g["max_ae"][a][c] = max(ae)
                g["max_abs_error_run"][a][c] = max(abs(v) for x in st_ for v in x["values"])
                g["target_met"][a][c] = bool(g["max_ae"][a][c] <= ENGINE_TARGET)
                g["target_met_every_run"][a][c] = bool(g["max_abs_error_run"][a][c] <= ENGINE_TARGET)
        out["experiments"][e] = g
    return out if out["experiments"] else None


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """Per point: mean and 95% t-interval over seeds of every actual, estimate, AE = |est − actual| and
    RE = AE/actual (per seed: an untargeted estimator against every actual, a targeted one —
    :data:`ESTIMATOR_TARGETS` — against its own), realized-gap statistics and the ingredient columns' signed
    errors ``ingr_err/<actual>/<column>`` (and ``ingr_ae``); then the paper's bounds checked against the worst
    point (mean over seeds) for each untargeted estimator and actual, and :data:`ENGINE_TARGET` for each
    targeted estimator against its actual (``paper_estimator`` False). ``summary["ingredients"]``: see
    :func:`_ingredient_summary`."""
    st: Setting = raw["setting"]
    actual_keys = actuals(st)
    est_names = raw["estimators"]
    targets = dict(raw.get("targets") or {k: ESTIMATOR_TARGETS[k] for k in est_names if k in ESTIMATOR_TARGETS})
    pairs = {en: ([targets[en]] if en in targets else list(actual_keys)) for en in est_names}
    pairs = {en: [a for a in acts if a in actual_keys] for en, acts in pairs.items()}
    by_key = {(r["seed"], r["lam0"], r["mu_F"]): r for r in raw["runs"]}
    exps: dict[str, Any] = {}
    for e in (1, 2):
        pts = []
        for p in points(st):
            if p.experiment != e:
                continue
            runs = [by_key[(s, p.lam0, p.mu_F)] for s in st.seeds if (s, p.lam0, p.mu_F) in by_key]
            if not runs:
                continue
            stats: dict[str, Any] = {}
            keys = [k for k in runs[0] if isinstance(runs[0][k], float) and "/" in k]
            for k in keys:
                stats[k] = _stat([r[k] for r in runs])
            for en in est_names:
                for a in pairs[en]:
                    ae = [abs(r[f"est/{en}"] - r[f"actual/{a}"]) for r in runs]
                    re = [
                        x / r[f"actual/{a}"] if r[f"actual/{a}"] > 0 else math.inf
                        for x, r in zip(ae, runs, strict=True)
                    ]
                    stats[f"ae/{en}/{a}"] = _stat(ae)
                    stats[f"re/{en}/{a}"] = _stat(re)
            for k in keys:
                if not k.startswith("ingr/"):
                    continue
                _, a, col = k.split("/")
                if f"actual/{a}" not in runs[0]:
                    continue
                err = [r[k] - r[f"actual/{a}"] for r in runs]
                stats[f"ingr_err/{a}/{col}"] = _stat(err)
                stats[f"ingr_ae/{a}/{col}"] = _stat([abs(x) for x in err])
            pts.append({"x": p.x, "lam0": p.lam0, "mu_F": p.mu_F, "seeds": [r["seed"] for r in runs], "stats": stats})
        exps[str(e)] = {"x_name": "mu_F" if e == 1 else "lam0", "points": pts}
    checks = []
    for b in PAPER_BOUNDS:
        pts = exps[str(b["experiment"])]["points"]
        if b["range"] is not None:
            lo, hi = b["range"]
            pts = [p for p in pts if lo <= p["x"] <= hi]
        for en in est_names:
            if en in targets:
                continue
            for a in pairs[en]:
                vals = [(p["stats"][f"{b['metric']}/{en}/{a}"]["mean"], p["x"]) for p in pts]
                if not vals:
                    continue
                worst, at = max(vals)
                checks.append(
                    {
                        "bound": b["text"],
                        "experiment": b["experiment"],
                        "metric": b["metric"],
                        "limit": b["bound"],
                        "estimator": en,
                        "actual": a,
                        "worst": worst,
                        "at_x": at,
                        "n_points": len(vals),
                        "pass": bool(worst < b["bound"]),
                        "paper_estimator": en in PAPER_ESTIMATORS,
                    }
                )
    for e in ("1", "2"):
        pts = exps[e]["points"]
        for en in est_names:
            if en not in targets or not pairs[en]:
                continue
            a = pairs[en][0]
            vals = [(p["stats"][f"ae/{en}/{a}"]["mean"], p["x"]) for p in pts]
            if not vals:
                continue
            worst, at = max(vals)
            checks.append(
                {
                    "bound": f"Exp. {e}: AE ≤ {ENGINE_TARGET:g} (engine target)",
                    "experiment": int(e),
                    "metric": "ae",
                    "limit": ENGINE_TARGET,
                    "estimator": en,
                    "actual": a,
                    "worst": worst,
                    "at_x": at,
                    "n_points": len(vals),
                    "pass": bool(worst <= ENGINE_TARGET),
                    "paper_estimator": False,
                }
            )
    out = {
        "experiments": exps,
        "checks": checks,
        "actuals": actual_keys,
        "estimators": est_names,
        "targets": {en: pairs[en][0] for en in targets if pairs[en]},
    }
    ing = _ingredient_summary(st, exps)
    if ing is not None:
        out["ingredients"] = ing
    return out


def _targets(summary: dict[str, Any]) -> dict[str, str]:
    """estimator → the actual it targets, in a :func:`summarize` result."""
    return dict(summary.get("targets") or {})


def _untargeted(summary: dict[str, Any]) -> list[str]:
    """The estimators of a :func:`summarize` result without a target (the paper's, compared with every actual)."""
    t = _targets(summary)
    return [en for en in summary["estimators"] if en not in t]
