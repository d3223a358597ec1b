"""Resample-and-simulate run to a requested confidence-interval half-width (issue 23 §3).

:func:`kvhit.sim.resample.resample_simulate` runs a fixed number of replications (default 4–5); at a low λ0 its
95 % half-width was ±0.14 — too wide to judge anything. :func:`resample_to_ci` adds replications in batches (seeds
``seed, seed + 1, …`` exactly as one :func:`resample_simulate` call with the final count would use, so the result is
bit-identical to that call) until the Student-t 95 % half-width is ≤ ``ci`` at every feasible capacity, or
``max_replications`` / ``max_seconds`` is reached (``extra["reached"]`` says which).

Which interval: ``estimator="ratio"`` (:meth:`~kvhit.sim.resample.ResampleResult.stationary_ci`: the stationary
hit ratio, a ratio of expectations, with the queries as control variate — the quantity the stationary estimator
predicts), ``"mean"`` (:meth:`~kvhit.sim.resample.ResampleResult.mean_ci`: the mean of per-replication ratios,
which is not the stationary hit ratio: it weights a replication with few queries like one with many), or
``"auto"`` (``"ratio"``; the default).

Invariant: the replications are the seeded ones of :func:`resample_simulate`; the stopping rule only decides how
many. NOT modelled: anything :mod:`kvhit.sim.resample` does not model. The stopping rule is sequential, so the
nominal 95 % is approximate (the half-width is checked after each batch, not fixed in advance).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from kvhit.sim.resample import ConversationPool, ResampleError, ResampleResult, resample_simulate

__all__ = ["resample_to_ci"]


def resample_to_ci(
    pool: ConversationPool,
    Ns,
    *,
    ci: float = 0.005,
    min_replications: int = 4,
    max_replications: int = 200,
    batch: int = 4,
    max_seconds: float | None = None,
    seed: int = 0,
    estimator: str = "auto",
    **kwargs,
) -> ResampleResult:
    """Replications of :func:`~kvhit.sim.resample.resample_simulate` (``kwargs``: engine, metric, lam0, scale,
    horizon, n_conversations, warmup) until the 95 % half-width ≤ ``ci`` at every feasible capacity.

    ``extra`` gains ``target_ci``, ``achieved_ci`` (the largest half-width), ``reached`` (bool), ``elapsed_s``
    and ``estimator`` (``"ratio"`` or ``"mean"``: which interval the stopping rule used).
    """
    if estimator not in ("auto", "ratio", "mean"):
        raise ResampleError(f"estimator: expected auto, ratio or mean, got {estimator!r}")
    est = "mean" if estimator == "mean" else "ratio"
    if not (isinstance(ci, float | int) and math.isfinite(ci) and ci > 0):
        raise ResampleError(f"ci: expected a half-width > 0, got {ci!r}")
    for name, v in (("min_replications", min_replications), ("max_replications", max_replications), ("batch", batch)):
        if not isinstance(v, int) or isinstance(v, bool) or v < (2 if name == "min_replications" else 1):
            raise ResampleError(f"{name}: expected an integer >= {2 if name == 'min_replications' else 1}, got {v!r}")
    if max_replications < min_replications:
        raise ResampleError("max_replications: must be >= min_replications")
    t0 = time.perf_counter()
    parts: list[ResampleResult] = []
    done = 0
    step = min_replications
    while True:
        parts.append(resample_simulate(pool, Ns, replications=step, seed=int(seed) + done, **kwargs))
        done += step
        res = _merge(parts)
        hw = (res.stationary_ci() if est == "ratio" else res.mean_ci())[1]
        ok = res.feasibility.feasible
        worst = float(np.nanmax(hw[ok])) if ok.any() else 0.0
        reached = worst <= ci
        if reached or done >= max_replications or (max_seconds is not None and time.perf_counter() - t0 > max_seconds):
            break
        step = min(batch, max_replications - done)
    extra = dict(res.extra) | {
        "target_ci": float(ci),
        "achieved_ci": worst,
        "reached": bool(reached),
        "elapsed_s": time.perf_counter() - t0,
        "estimator": est,
    }
    return replace(res, extra=extra)


def _merge(parts: list[ResampleResult]) -> ResampleResult:
    first = parts[0]
    if len(parts) == 1:
        return first
    hz = [h for p in parts for h in p.extra.get("horizons_s", [])]
    return replace(
        first,
        horizon=float(np.mean(hz)) if hz else first.horizon,
        seeds=[s for p in parts for s in p.seeds],
        token_hit_ratio=np.concatenate([p.token_hit_ratio for p in parts]),
        block_hit_ratio=np.concatenate([p.block_hit_ratio for p in parts]),
        token_queries=_cat([p.token_queries for p in parts]),
        block_queries=_cat([p.block_queries for p in parts]),
        control_tokens=_cat([p.control_tokens for p in parts]),
        n_measured=[x for p in parts for x in p.n_measured],
        n_started=[x for p in parts for x in p.n_started],
        extra=dict(first.extra) | {"horizons_s": hz},
    )


def _cat(xs: list) -> np.ndarray | None:
    return None if any(x is None for x in xs) else np.concatenate(xs)
