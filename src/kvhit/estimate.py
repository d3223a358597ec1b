"""The theoretically-motivated hit-ratio estimator of App. C.2.2 (eq. (35)–(39)), from a trace.

From the L conversations of a :class:`~kvhit.workload.trace.Trace` (M_i turns, physical history sizes R_{i,j},
B_i = R_{i,M_i}) :func:`trace_moments` computes

* Â_R = (1/L) Σ_i Σ_{j≤M_i} R_{i,j} (eq. (35)),
* Â_H^hash = (1/L) Σ_i Σ_{j<M_i} (R_{i,j} − 1) (eq. (36)), base-model Â_H = (1/L) Σ_i Σ_{j<M_i} R_{i,j},
* Ê[B] = (1/L) Σ_i B_i and Ê[M] = (1/L) Σ_i M_i (eq. (37)),

and :func:`estimate` solves λ0 Ê[B] T + λ0 Â ∫₀ᵀ F̂̄ = N (eq. (38), unscaled λ0, threshold N) and returns
ĥ = (Â/Â_R) F̂(T̂_C) (eq. (39)), with Â = Â_H^hash (practical model, default) or Â_H (eq. (21), base model).
The interarrival CDF F̂ is the empirical one of the observed gaps (``F="empirical"``, eq. (38)), an exponential
with the observed mean (``F="posterior"``, App. E), or any given :class:`~kvhit.workload.dists.Interarrival`
(the prior). The solver is shared with :mod:`kvhit.theory` (:func:`kvhit.theory.mean_field`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvhit import theory
from kvhit.workload.dists import EmpiricalW, Exponential, Interarrival
from kvhit.workload.spec import WorkloadSpec
from kvhit.workload.trace import Trace

__all__ = [
    "BLOCK_RULES",
    "EstimateError",
    "TraceMoments",
    "Estimate",
    "trace_moments",
    "empirical_F",
    "posterior_F",
    "estimate",
    "estimate_spec",
]

#: How R_{i,j} and its hashable part are read from a trace (argument ``block`` of :func:`trace_moments`).
BLOCK_RULES = {
    "paper": "R_{i,j} = column R; hashable history R_{i,j} − 1 (eq. (36))",
    "phys": "R_{i,j} = column R_phys = ⌈T_j/b⌉; hashable history R_{i,j} − 1 (eq. (36))",
    "full": "R_{i,j} = column R_phys (R if absent); hashable history = column R_full = ⌊T_j/b⌋ (exact count)",
}


class EstimateError(ValueError):
    """Invalid input to the estimator (the message names the offending field or column)."""


@dataclass(frozen=True, eq=False)
class TraceMoments:
    """Empirical workload statistics of eq. (35)–(37) over L conversations.

    Attributes:
        L: number of conversations.
        n_turns: Σ_i M_i.
        A_R: Â_R (eq. (35)).
        A_H: Â_H = (1/L) Σ_i Σ_{j<M_i} R_{i,j} (base model, eq. (10)'s estimate).
        A_H_hash: Â_H^hash (eq. (36); with ``block="full"`` the exact full-block count replaces R − 1).
        E_B: Ê[B] (eq. (37)).
        E_M: Ê[M] (eq. (37)).
        Var_M: population variance (ddof = 0) of the M_i.
        max_M: largest M_i.
        se_A_R, se_A_H, se_A_H_hash, se_E_B, se_E_M: standard errors (sample standard deviation of the
            per-conversation terms / √L; NaN when L = 1).
        W: observed prompt interarrival gaps within the selected conversations (for F̂).
        lam0_hat: (L − 1)/(last − first conversation arrival), the Poisson-rate estimate (NaN if undefined).
        block: the rule used to read R (see :data:`BLOCK_RULES`).
        per_conversation: per-conversation arrays ``conv``, ``M``, ``B``, ``sum_R`` (Σ_{j≤M} R_j),
            ``sum_R_reuse`` (Σ_{j<M} R_j), ``sum_R_hash`` (hashable part of Σ_{j<M} R_j).
    """

    L: int
    n_turns: int
    A_R: float
    A_H: float
    A_H_hash: float
    E_B: float
    E_M: float
    Var_M: float
    max_M: int
    se_A_R: float
    se_A_H: float
    se_A_H_hash: float
    se_E_B: float
    se_E_M: float
    W: np.ndarray
    lam0_hat: float
    block: str
    per_conversation: dict[str, np.ndarray] = field(repr=False, default_factory=dict)

    @property
    def h_max(self) -> float:
        """Â_H/Â_R (eq. (11))."""
        return self.A_H / self.A_R

    @property
    def h_max_hash(self) -> float:
        """Â_H^hash/Â_R, the ceiling of the practical estimate (eq. (39))."""
        return self.A_H_hash / self.A_R

    def A(self, practical: bool = True) -> float:
        return self.A_H_hash if practical else self.A_H


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


# ----------------------------------------------------------------------------------------------------------
# eq. (35)–(37) from a trace
# ----------------------------------------------------------------------------------------------------------


def _select_conversations(trace: Trace, mask: Any, rows: Any) -> np.ndarray:
    """Sorted ids of the selected conversations."""
    ids = np.unique(trace["conv"])
    if mask is not None and rows is not None:
        raise EstimateError("give at most one of mask (conversations) and rows (row mask)")
    if rows is not None:
        r = np.asarray(rows)
        if r.dtype != bool or r.shape != (trace.n_turns,):
            raise EstimateError(
                f"rows: expected a boolean row mask of shape ({trace.n_turns},), got {r.dtype} {r.shape}"
            )
        return np.unique(trace["conv"][r])
    if mask is None:
        return ids
    m = np.asarray(mask)
    if m.dtype == bool:
        if m.shape != ids.shape:
            raise EstimateError(
                f"mask: a boolean conversation mask must have one entry per conversation "
                f"({ids.size}, in id order), got shape {m.shape}"
            )
        return ids[m]
    if m.dtype.kind in "iu":
        sel = np.unique(m)
        missing = sel[~np.isin(sel, ids)]
        if missing.size:
            raise EstimateError(f"mask: conversation id {int(missing[0])} is not in the trace")
        return sel
    raise EstimateError(f"mask: expected a boolean mask or conversation ids, got dtype {m.dtype}")


def _column(trace: Trace, name: str, block: str) -> np.ndarray:
    if name not in trace.cols:
        raise EstimateError(f"block={block!r} needs trace column {name!r}, which this trace lacks")
    return np.asarray(trace[name], dtype=np.int64)


def _se(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size > 1 else math.nan


def trace_moments(
    trace: Trace,
    mask: Any = None,
    *,
    rows: Any = None,
    block: str = "paper",
    incomplete: str = "error",
) -> TraceMoments:
    """Empirical workload statistics Â_R (eq. (35)), Â_H^hash (eq. (36)), Â_H, Ê[B], Ê[M] (eq. (37)), Var M,
    max M, Σ M_i and L from a trace.

    Args:
        trace: the trace; M_i is read from its ``M`` column (the conversation's turn count), and every turn
            1..M_i of a selected conversation must be present.
        mask: which conversations: a boolean mask with one entry per conversation in id order (as
            ``trace.conversations()``), or an array of conversation ids. Default: all.
        rows: alternatively a boolean row mask (e.g. ``Window.mask(trace)``): the conversations with at least
            one selected row are used, with all their turns.
        block: how R_{i,j} and the hashable history are read (:data:`BLOCK_RULES`): ``"paper"`` (column R, the
            paper's convention with R − 1 hashable), ``"phys"`` (R_phys), ``"full"`` (hashable = R_full).
        incomplete: ``"error"`` (default) raises when a selected conversation has fewer rows than its M;
            ``"drop"`` leaves such conversations out.
    """
    if not isinstance(trace, Trace):
        raise EstimateError(f"trace: expected a Trace, got {type(trace).__name__}")
    if block not in BLOCK_RULES:
        raise EstimateError(f"block: unknown rule {block!r} (one of {sorted(BLOCK_RULES)})")
    if incomplete not in ("error", "drop"):
        raise EstimateError(f"incomplete: expected 'error' or 'drop', got {incomplete!r}")
    if trace.n_turns == 0:
        raise EstimateError("trace: no rows")
    sel = _select_conversations(trace, mask, rows)
    conv_all = trace["conv"]
    keep = np.isin(conv_all, sel)
    order = np.flatnonzero(keep)
    order = order[np.lexsort((trace["turn"][order], conv_all[order]))]
    conv = conv_all[order]
    if block == "paper":
        R = np.asarray(trace["R"], dtype=np.int64)[order]
        H = R - 1
    elif block == "phys":
        R = _column(trace, "R_phys", block)[order]
        H = R - 1
    else:
        R = (_column(trace, "R_phys", block) if "R_phys" in trace.cols else np.asarray(trace["R"], np.int64))[
            order
        ]
        H = _column(trace, "R_full", block)[order]
    starts = np.flatnonzero(np.concatenate([[True], conv[1:] != conv[:-1]]))
    counts = np.diff(np.append(starts, conv.size))
    ids = conv[starts]
    M = np.asarray(trace["M"], dtype=np.int64)[order][starts]
    complete = counts == M
    if not complete.all():
        if incomplete == "error":
            i = int(np.argmax(~complete))
            raise EstimateError(
                f"trace: conversation {int(ids[i])} has M = {int(M[i])} turns but {int(counts[i])} rows; "
                f"eq. (35)-(37) need every turn (pass incomplete='drop' to leave such conversations out)"
            )
        row_keep = np.repeat(complete, counts)
        conv, R, H, order = conv[row_keep], R[row_keep], H[row_keep], order[row_keep]
        ids, M, counts = ids[complete], M[complete], counts[complete]
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if ids.size else np.zeros(0, np.int64)
    L = int(ids.size)
    if L == 0:
        raise EstimateError("trace: no (complete) conversation selected")
    last = starts + counts - 1
    sum_R = np.add.reduceat(R, starts).astype(float)
    B = R[last].astype(float)
    sum_R_reuse = sum_R - B
    sum_R_hash = np.add.reduceat(H, starts).astype(float) - H[last]
    Mf = M.astype(float)
    # interarrival gaps within the selected conversations, and the arrival-rate estimate
    t = np.asarray(trace["time"], dtype=float)[order]
    same = conv[1:] == conv[:-1]
    W = (t[1:] - t[:-1])[same]
    arr = np.asarray(trace["conv_arrival"], dtype=float)[order][starts]
    span = float(arr.max() - arr.min()) if L > 1 else 0.0
    lam0_hat = (L - 1) / span if span > 0 else math.nan
    return TraceMoments(
        L=L,
        n_turns=int(M.sum()),
        A_R=float(sum_R.mean()),
        A_H=float(sum_R_reuse.mean()),
        A_H_hash=float(sum_R_hash.mean()),
        E_B=float(B.mean()),
        E_M=float(Mf.mean()),
        Var_M=float(Mf.var()),
        max_M=int(M.max()),
        se_A_R=_se(sum_R),
        se_A_H=_se(sum_R_reuse),
        se_A_H_hash=_se(sum_R_hash),
        se_E_B=_se(B),
        se_E_M=_se(Mf),
        W=W,
        lam0_hat=lam0_hat,
        block=block,
        per_conversation={
            "conv": ids,
            "M": M,
            "B": B,
            "sum_R": sum_R,
            "sum_R_reuse": sum_R_reuse,
            "sum_R_hash": sum_R_hash,
        },
    )


# ----------------------------------------------------------------------------------------------------------
# F̂ and the estimator (eq. (38)–(39))
# ----------------------------------------------------------------------------------------------------------


def _gaps(source: Trace | TraceMoments) -> np.ndarray:
    if isinstance(source, Trace):
        W = source.interarrivals()
    elif isinstance(source, TraceMoments):
        W = source.W
    else:
        raise EstimateError(
            f"source: an empirical F̂ needs a Trace or TraceMoments, got {type(source).__name__}"
        )
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
            :func:`trace_moments`, or prior :class:`kvhit.theory.Moments`.
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
            raise EstimateError(
                f"F={F!r} needs observed gaps: pass a Trace or TraceMoments, or give F explicitly"
            )
        F = empirical_F(mom) if F == "empirical" else posterior_F(mom)
    elif not isinstance(F, Interarrival):
        raise EstimateError(
            f"F: expected 'empirical', 'posterior' or an Interarrival, got {type(F).__name__}"
        )
    if lam0 is None:
        lam0 = getattr(mom, "lam0_hat", math.nan)
        if not (isinstance(lam0, float) and math.isfinite(lam0) and lam0 > 0):
            raise EstimateError(
                "lam0: not given and not estimable from the source (need ≥ 2 conversation "
                "arrivals spread in time)"
            )
    return _result(mom, F, lam0, N, practical)


def estimate_spec(
    spec: WorkloadSpec, N: Any, *, lam0: Any = None, F: Interarrival | None = None, practical: bool = True
) -> Estimate:
    """The estimator with prior inputs from a spec's own moments (:func:`kvhit.theory.moments`), F (default
    ``spec.interarrival``) and λ0 (default ``spec.lam0``): ``estimate_spec(spec, N).h`` equals
    ``kvhit.theory.h_mean_field(spec, N, practical=True)`` (same solver)."""
    if not isinstance(spec, WorkloadSpec):
        raise EstimateError(f"spec: expected a WorkloadSpec, got {type(spec).__name__}")
    mom = theory.moments(spec)
    return _result(
        mom, spec.interarrival if F is None else F, spec.lam0 if lam0 is None else lam0, N, practical
    )
