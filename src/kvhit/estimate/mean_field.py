"""The theoretically-motivated hit-ratio estimator of App. C.2.2 (eq. (38)–(39)), from a trace's moments.

From the statistics Â_R, Â_H^hash, Â_H, Ê[B] of :func:`kvhit.estimate.trace_stats.trace_moments` (eq. (35)–(37)),
:func:`estimate` solves λ0 Ê[B] T + λ0 Â ∫₀ᵀ F̂̄ = N (eq. (38), unscaled λ0, threshold N) and returns
ĥ = (Â/Â_R) F̂(T̂_C) (eq. (39)), with Â = Â_H^hash (practical model, default) or Â_H (eq. (21), base model).
The interarrival CDF F̂ is the empirical one of the observed gaps (``F="empirical"``, eq. (38)), an exponential
with the observed mean (``F="posterior"``, App. E), or any given :class:`~kvhit.workload.dists.Interarrival`
(the prior). The solver is shared with :mod:`kvhit.estimate.theory` (:func:`kvhit.estimate.theory.mean_field`).

Invariant: 0 ≤ ĥ ≤ Â/Â_R (``Estimate.h_max_hat``), since F̂(T̂_C) is a probability.

NOT modelled here: any engine's block accounting, a history's own size against N (finite capacity), the
fluctuations of the displacement and rejected requests: those are :mod:`kvhit.estimate.engine`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvhit.estimate import theory
from kvhit.estimate.trace_stats import EstimateError, TraceMoments, trace_moments
from kvhit.workload.dists import EmpiricalW, Exponential, Interarrival
from kvhit.workload.spec import WorkloadSpec
from kvhit.workload.trace import Trace

__all__ = ["Estimate", "empirical_F", "posterior_F", "estimate", "estimate_spec"]


@dataclass(frozen=True, eq=False)
class Estimate:
    """Result of :func:`estimate` (arrays of the broadcast shape of ``N`` and ``lam0``; floats for scalars).

    Attributes:
        h: ĥ = (Â/Â_R) F̂(T̂_C) (eq. (39), or eq. (25) with estimated inputs when not practical).
        T_C: T̂_C^prac (eq. (38)) or T̂_C (eq. (21), threshold form).
        F_T_C: F̂(T̂_C), the mean-field hit probability of a reusable history.
        h_max_hat: Â_H^hash/Â_R (practical) or Â_H/Â_R; h ≤ h_max_hat always.
        N, lam0: the inputs, broadcast.
        practical: whether the practical model (unhashable tail blocks) was used.
    """

    h: Any
    T_C: Any
    F_T_C: Any
    h_max_hat: float
    N: Any
    lam0: Any
    practical: bool


def _gaps(source: Trace | TraceMoments) -> np.ndarray:
    if isinstance(source, Trace):
        W = source.interarrivals()
    elif isinstance(source, TraceMoments):
        W = source.W
    else:
        raise EstimateError(f"source: an empirical F̂ needs a Trace or TraceMoments, got {type(source).__name__}")
    if W.size == 0:
        raise EstimateError("trace: no interarrival gap observed (every conversation has a single turn)")
    return W


def empirical_F(source: Trace | TraceMoments) -> EmpiricalW:
    """F̂: the empirical CDF of the observed prompt interarrival gaps (eq. (38))."""
    return EmpiricalW(_gaps(source))


def posterior_F(source: Trace | TraceMoments) -> Exponential:
    """The posterior F of App. E: exponential with the observed mean gap μ̂_F."""
    mu = float(np.mean(_gaps(source)))
    if not mu > 0:
        raise EstimateError("trace: the observed mean interarrival gap is 0; cannot build an exponential F")
    return Exponential(mu)


def _result(mom: Any, F: Interarrival, lam0: Any, N: Any, practical: bool) -> Estimate:
    A = mom.A_H_hash if practical else mom.A_H
    lam0_b, N_b = np.broadcast_arrays(np.asarray(lam0, dtype=float), np.asarray(N, dtype=float))
    h, tc, Ft = theory.mean_field(mom.A_R, A, mom.E_B, F, lam0_b, N_b)
    scalar = h.ndim == 0

    def out(x):
        return float(x) if scalar else x

    return Estimate(
        h=out(h),
        T_C=out(tc),
        F_T_C=out(Ft),
        h_max_hat=float(A / mom.A_R),
        N=out(N_b.copy()),
        lam0=out(lam0_b.copy()),
        practical=bool(practical),
    )


def estimate(
    source: Trace | TraceMoments | theory.Moments,
    N: Any,
    lam0: Any = None,
    F: Interarrival | str = "empirical",
    *,
    practical: bool = True,
) -> Estimate:
    """The mean-field hit-ratio estimator ĥ = (Â_H^hash/Â_R) F̂(T̂_C^prac) (eq. (39)), with T̂_C^prac the root of
    λ0 Ê[B] T + λ0 Â_H^hash ∫₀ᵀ F̂̄ = N (eq. (38), unscaled λ0, threshold N). With ``practical=False`` the base
    model is used: Â_H in place of Â_H^hash (eq. (21) in threshold form, then eq. (25)).

    Args:
        source: a :class:`Trace` (all its conversations, ``block="paper"``), a :class:`TraceMoments` from
            :func:`trace_moments`, or prior :class:`kvhit.estimate.theory.Moments`.
        N: HBM capacity in blocks (scalar or array).
        lam0: unscaled conversation arrival rate λ0 (scalar or array, broadcast with ``N``); default: the
            trace's λ̂0 (``TraceMoments.lam0_hat``).
        F: ``"empirical"`` (F̂ of the observed gaps), ``"posterior"`` (exponential, observed mean) or an
            :class:`Interarrival` (prior).
        practical: use A_H_hash (default, eq. (38)–(39)) or A_H.
    """
    mom = trace_moments(source) if isinstance(source, Trace) else source
    if not isinstance(mom, TraceMoments | theory.Moments):
        raise EstimateError(f"source: expected a Trace, TraceMoments or Moments, got {type(source).__name__}")
    if isinstance(F, str):
        if F not in ("empirical", "posterior"):
            raise EstimateError(f"F: expected 'empirical', 'posterior' or an Interarrival, got {F!r}")
        if not isinstance(mom, TraceMoments):
            raise EstimateError(f"F={F!r} needs observed gaps: pass a Trace or TraceMoments, or give F explicitly")
        F = empirical_F(mom) if F == "empirical" else posterior_F(mom)
    elif not isinstance(F, Interarrival):
        raise EstimateError(f"F: expected 'empirical', 'posterior' or an Interarrival, got {type(F).__name__}")
    if lam0 is None:
        lam0 = getattr(mom, "lam0_hat", math.nan)
        if not (isinstance(lam0, float) and math.isfinite(lam0) and lam0 > 0):
            raise EstimateError(
                "lam0: not given and not estimable from the source (need ≥ 2 conversation arrivals spread in time)"
            )
    return _result(mom, F, lam0, N, practical)


def estimate_spec(
    spec: WorkloadSpec, N: Any, *, lam0: Any = None, F: Interarrival | None = None, practical: bool = True
) -> Estimate:
    """The estimator with prior inputs from a spec's own moments (:func:`kvhit.estimate.theory.moments`), F (default
    ``spec.interarrival``) and λ0 (default ``spec.lam0``): ``estimate_spec(spec, N).h`` equals
    ``kvhit.estimate.theory.h_mean_field(spec, N, practical=True)`` (same solver)."""
    if not isinstance(spec, WorkloadSpec):
        raise EstimateError(f"spec: expected a WorkloadSpec, got {type(spec).__name__}")
    mom = theory.moments(spec)
    return _result(mom, spec.interarrival if F is None else F, spec.lam0 if lam0 is None else lam0, N, practical)
