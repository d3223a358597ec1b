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
(the prior). The solver is shared with :mod:`kvhit.estimate.theory` (:func:`kvhit.estimate.theory.mean_field`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numba import njit

from kvhit.estimate import theory
from kvhit.estimate.displacement import phi_moments
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
    "ENGINE_MODELS",
    "METRICS",
    "ACCOUNTINGS",
    "EngineAccounting",
    "EngineEstimate",
    "engine_accounting",
    "displacement_moments",
    "estimate_engine",
    "estimate_finite",
    "estimate_window",
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
    ids = trace.conv_index()[0]
    if mask is not None and rows is not None:
        raise EstimateError("give at most one of mask (conversations) and rows (row mask)")
    if rows is not None:
        r = np.asarray(rows)
        if r.dtype != bool or r.shape != (trace.n_turns,):
            raise EstimateError(
                f"rows: expected a boolean row mask of shape ({trace.n_turns},), got {r.dtype} {r.shape}"
            )
        return ids[np.unique(trace.conv_index()[1][r])]
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


def _conv_major_rows(trace: Trace, sel: np.ndarray) -> np.ndarray:
    """Rows of the conversations ``sel`` (sorted ids of the trace) in conversation-major order (id, then turn)."""
    ids, dense, order = trace.conv_index()
    if sel.size == ids.size:
        return order
    pick = np.zeros(ids.size, bool)
    pick[np.searchsorted(ids, sel)] = True
    return order[pick[dense[order]]]


class _ConvLayout(NamedTuple):
    """Rows of selected conversations in conversation-major order, with each conversation's extent."""

    order: np.ndarray  # trace rows, conversation-major
    conv: np.ndarray  # conversation id per row (in ``order``)
    starts: np.ndarray  # first row of each conversation
    counts: np.ndarray  # rows (turns) per conversation
    conv_ptr: np.ndarray  # int64 CSR pointer: conversation k is rows conv_ptr[k]:conv_ptr[k + 1]
    first: np.ndarray  # row is a conversation's first turn
    last: np.ndarray  # row is a conversation's last turn
    offsets: np.ndarray  # arrival time minus the conversation's first arrival


def _conv_layout(trace: Trace, sel: np.ndarray) -> _ConvLayout:
    """:func:`_conv_major_rows` of ``sel`` with the per-conversation extents and time offsets the estimators use."""
    order = _conv_major_rows(trace, sel)
    conv = trace["conv"][order]
    starts = np.flatnonzero(np.concatenate([[True], conv[1:] != conv[:-1]]))
    counts = np.diff(np.append(starts, conv.size))
    conv_ptr = np.append(starts, conv.size).astype(np.int64)
    first = np.zeros(conv.size, bool)
    first[starts] = True
    last = np.zeros(conv.size, bool)
    last[starts + counts - 1] = True
    t = np.asarray(trace["time"], dtype=float)[order]
    offsets = t - np.repeat(t[starts], counts)
    return _ConvLayout(order, conv, starts, counts, conv_ptr, first, last, offsets)


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
    order = _conv_major_rows(trace, sel)
    conv = conv_all[order]
    if block == "paper":
        R = np.asarray(trace["R"], dtype=np.int64)[order]
        H = R - 1
    elif block == "phys":
        R = _column(trace, "R_phys", block)[order]
        H = R - 1
    else:
        R = (_column(trace, "R_phys", block) if "R_phys" in trace.cols else np.asarray(trace["R"], np.int64))[order]
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


# ----------------------------------------------------------------------------------------------------------
# Engine-aware accounting, finite capacity, tail-first partial hits and displacement fluctuations
# ----------------------------------------------------------------------------------------------------------

#: engine models of :func:`engine_accounting` / :func:`estimate_engine`
ENGINE_MODELS = {
    "vllm": "vLLM ≥ 0.24 (PR #42656): freed unhashed blocks to the free-queue head; hashed capacity N − 1",
    "vllm-0.23": "vLLM ≤ 0.23: every freed block (orphaned partial blocks too) takes an LRU slot; capacity N",
    "content": "Algorithm 1 (whole-content LRU) on the paper's sizes R_j, practical metric eq. (31)",
}
METRICS = ("tokens", "blocks")
ACCOUNTINGS = ("engine", "paper")


@dataclass(frozen=True, eq=False)
class EngineAccounting:
    """The quantities the mean-field argument (App. B.4, Lemma D.1–D.4) needs, read from a trace for one engine.

    Per conversation i and turn j (conversation-major order) with prompt T_{i,j} tokens and block size b:

    * ``new[j]``: blocks the access j newly places at the MRU end of the LRU order (new-block displacement):
      ⌊T_j/b⌋ − ⌊T_{j−1}/b⌋ under vLLM ≥ 0.24 (the partial block goes to the free-queue head and never
      displaces), plus 1{T_j mod b ≠ 0} under vLLM ≤ 0.23 (the orphaned partial block takes an LRU slot),
      Z_j for Algorithm 1 and for the paper's rule. E_B = (1/L) Σ_i Σ_j new[i,j] replaces Ê[B] in eq. (38):
      ⌊T_M/b⌋ (≥ 0.24), R_M = ⌊T_M/b⌋ + #{partial prompts} (≤ 0.23), R_M (Algorithm 1, paper).
    * ``hist[j]``: the cached history that moves ahead of a tagged block when the conversation comes back
      after turn j (history displacement, Lemma D.2): ⌊T_j/b⌋ (both vLLM orders: only full blocks are
      cached; the paper's R_j counts every earlier partial block again), R_j (Algorithm 1), R_j − 1 (paper,
      eq. (36)). A = (1/L) Σ_i Σ_{j<M_i} hist[i,j] replaces Â_H^hash in eq. (38).
    * ``reuse[j]`` (j < M): hit blocks at turn j+1 if the whole history survived (⌊T_j/b⌋ for vLLM; R_j − 1
      for Algorithm 1 and the paper); ``size[j]``: the tagged content's own size in its threshold (whole-content
      hit iff D + size ≤ C).
    * ``unit``: metric weight of one hit block (b for vLLM's token hit ratio, 1 for block-weighted h);
      ``demand[j]``: the metric's denominator per turn (T_j, ⌈T_j/b⌉, or R_j for eq. (31)).
    * ``cap_offset``: C = N − cap_offset is the capacity in the hit condition (1 under vLLM ≥ 0.24: one freed
      partial block sits unhashed at the free-queue head, see tests/test_sim_agreement.py).
    * ``mode``: ``"prefix"`` (vLLM frees tail first, so block i of a history survives iff D + i + 1 ≤ C: a
      late revisit gets a partial prefix hit) or ``"whole"`` (Algorithm 1: all or nothing).

    ``conv_ptr``/``offsets``/``cum_new``/``hist_all`` describe every conversation's access times (offsets
    from its first turn) and cumulative new/history mass, for the variance of the displacement (Lemma D.1).
    """

    engine: str
    metric: str
    accounting: str
    block_size: int
    L: int
    E_B: float
    A: float
    A_R: float
    A_hit: float
    unit: float
    cap_offset: int
    mode: str
    reuse: np.ndarray
    size: np.ndarray
    W: np.ndarray
    lam0_hat: float
    conv_ptr: np.ndarray = field(repr=False)
    offsets: np.ndarray = field(repr=False)
    cum_new: np.ndarray = field(repr=False)
    hist_all: np.ndarray = field(repr=False)
    need: np.ndarray | None = field(repr=False, default=None)
    new_all: np.ndarray | None = field(repr=False, default=None)
    demand_all: np.ndarray | None = field(repr=False, default=None)

    @property
    def h_max(self) -> float:
        """The ceiling A_hit/A_R of the metric (all histories hit in full)."""
        return self.A_hit / self.A_R

    @property
    def max_need(self) -> int:
        """max_j ⌈T_j/b⌉: from this capacity on no request is rejected (0 for whole-content models)."""
        return int(self.need.max()) if self.need is not None and self.need.size else 0

    def admitted(self, N: float) -> EngineAccounting:
        """The accounting of what an engine with N usable blocks actually runs (vLLM rejects a request with
        ⌈T_j/b⌉ > N: no state change, no displacement, excluded from the metric, see
        :func:`kvhit.sim.vllm.block.token_hit_ratio`). The prompt is cumulative (T_{j+1} ≥ T_j), so once turn j
        of a conversation is rejected all its later turns are too: each conversation keeps its admitted prefix
        of J_i(N) = #{j : ⌈T_j/b⌉ ≤ N} turns and is accounted as a conversation of J_i(N) turns — its history
        after turn J_i never comes back (no history displacement, no hit), and no rejected turn adds demand.
        L (the arrival normalisation of λ0) is unchanged: conversations rejected from their first turn still
        arrive, they just contribute nothing. Returns ``self`` when nothing is rejected or for whole-content
        models (Algorithm 1 inserts an oversize content and evicts it: no rejection)."""
        if self.need is None or N >= self.max_need:
            return self
        keep = self.need <= N
        nconv = self.conv_ptr.size - 1
        cid = np.repeat(np.arange(nconv), np.diff(self.conv_ptr))
        cnt = np.bincount(cid[keep], minlength=nconv)
        nz = cnt > 0
        ptr = np.concatenate([[0], np.cumsum(cnt[nz])]).astype(np.int64)
        new = self.new_all[keep]
        hist = self.hist_all[keep]
        dem = self.demand_all[keep]
        last = np.zeros(new.size, bool)
        last[ptr[1:] - 1] = True
        starts = ptr[:-1]
        cs = np.cumsum(new)
        cum_new = cs - np.repeat(cs[starts] - new[starts], cnt[nz]) if new.size else cs
        nl = ~last
        L = self.L
        return EngineAccounting(
            engine=self.engine,
            metric=self.metric,
            accounting=self.accounting,
            block_size=self.block_size,
            L=L,
            E_B=float(new.sum() / L),
            A=float(hist[nl].sum() / L),
            A_R=float(dem.sum() / L),
            A_hit=float(self.unit * hist[nl].sum() / L),
            unit=self.unit,
            cap_offset=self.cap_offset,
            mode=self.mode,
            reuse=hist[nl],
            size=hist[nl],
            W=self.W,
            lam0_hat=self.lam0_hat,
            conv_ptr=ptr,
            offsets=self.offsets[keep],
            cum_new=cum_new,
            hist_all=hist,
            need=None,
            new_all=new,
            demand_all=dem,
        )


@dataclass(frozen=True, eq=False)
class EngineEstimate:
    """Result of :func:`estimate_engine` (arrays of the broadcast shape of ``N`` and ``lam0``; floats for
    scalars).

    Attributes:
        h: the predicted hit ratio in the chosen metric.
        T_C: τ(C), the root of λ0 E_B τ + λ0 A ∫₀^τ F̄ = C (eq. (38) with the engine's E_B, A and C).
        h_max: the metric's ceiling A_hit/A_R.
        N, lam0: the inputs, broadcast.
        engine, metric, accounting, finite, partial, fluctuations: the model used.
    """

    h: Any
    T_C: Any
    h_max: float
    N: Any
    lam0: Any
    engine: str
    metric: str
    accounting: str
    finite: bool
    partial: bool
    fluctuations: bool


def engine_accounting(
    trace: Trace,
    *,
    engine: str = "vllm",
    metric: str = "tokens",
    accounting: str = "engine",
    block_size: int | None = None,
    mask: Any = None,
    rows: Any = None,
    incomplete: str = "error",
) -> EngineAccounting:
    """Engine-aware block accounting (see :class:`EngineAccounting`) of the selected conversations.

    Token counts come from the trace's ``cum_tokens`` column (T_j); a trace without it is read as the paper's
    practical model, T_j = R_j·b − 1 (R_j − 1 full blocks and one partial block, eq. (28)). ``accounting=
    "paper"`` ignores ``engine`` and ``metric`` and gives the paper's rule (columns R, Z: eq. (35)–(39)), so
    that :func:`estimate_engine` with ``finite=False, fluctuations=False`` reproduces :func:`estimate`.
    ``mask``/``rows``/``incomplete`` select conversations as in :func:`trace_moments`.
    """
    if not isinstance(trace, Trace):
        raise EstimateError(f"trace: expected a Trace, got {type(trace).__name__}")
    if engine not in ENGINE_MODELS:
        raise EstimateError(f"engine: unknown engine {engine!r} (one of {sorted(ENGINE_MODELS)})")
    if metric not in METRICS:
        raise EstimateError(f"metric: expected one of {METRICS}, got {metric!r}")
    if accounting not in ACCOUNTINGS:
        raise EstimateError(f"accounting: expected one of {ACCOUNTINGS}, got {accounting!r}")
    mom = trace_moments(trace, mask, rows=rows, incomplete=incomplete)
    sel = mom.per_conversation["conv"]
    order, conv, starts, counts, conv_ptr, first, last, offsets = _conv_layout(trace, sel)
    W, lam0_hat = mom.W, mom.lam0_hat
    del mom, sel, conv
    R = np.asarray(trace["R"], dtype=np.int64)[order]
    b = int(block_size or trace.block_size or 0)
    # memory: at 10⁷ turns each per-row array is 80 MB; temporaries are dropped as soon as they are used (a curve's
    # peak is here) and vLLM's reuse and size, equal arrays, are one
    if accounting == "paper" or engine == "content":
        new = np.where(first, R, R - np.concatenate([[0], R[:-1]])).astype(float)  # Z_j
        hist = (R - 1 if accounting == "paper" else R).astype(float)
        reuse = (R - 1).astype(float)
        size = R.astype(float)
        demand = R.astype(float)
        unit, cap_offset, mode = 1.0, 0, "whole"
        need = None  # Algorithm 1 inserts an oversize content and evicts it at once: nothing is rejected
        if accounting == "paper":
            engine_, metric_ = "paper", "blocks"
        else:
            engine_, metric_ = "content", "blocks"
    else:
        if b < 1:
            raise EstimateError("block_size: unknown (the trace has no block_size); pass block_size=")
        if "cum_tokens" in trace.cols:
            T = np.asarray(trace["cum_tokens"], dtype=np.int64)[order]
        else:
            T = R * b - 1
        if (T < 1).any():
            raise EstimateError("cum_tokens: every prompt needs at least one token")
        if (np.diff(T)[~first[1:]] < 0).any():
            raise EstimateError("cum_tokens: the prompt T_j must not shrink within a conversation (cumulative)")
        del R
        need = -(-T // b)  # ⌈T_j/b⌉ blocks: vLLM rejects the request when this exceeds N
        Hf = T // b
        new = (Hf - np.where(first, 0, np.concatenate([[0], Hf[:-1]]))).astype(float)
        if engine == "vllm-0.23":
            new += T % b != 0
        hist = Hf.astype(float)
        del Hf
        reuse = size = hist  # both ⌊T_j/b⌋ (sliced below: size is reuse's array)
        unit = float(b) if metric == "tokens" else 1.0
        demand = T.astype(float) if metric == "tokens" else need.astype(float)
        del T
        cap_offset = 1 if engine == "vllm" else 0
        mode = "prefix"
        engine_, metric_ = engine, metric
    L = int(starts.size)
    nl = ~last
    reuse_nl = reuse[nl]
    size_nl = reuse_nl if size is reuse else size[nl]
    del reuse, size
    cs = np.cumsum(new)
    cs -= np.repeat(cs[starts] - new[starts], counts)
    return EngineAccounting(
        engine=engine_,
        metric=metric_,
        accounting=accounting,
        block_size=b,
        L=L,
        E_B=float(new.sum() / L),
        A=float(hist[nl].sum() / L),
        A_R=float(demand.sum() / L),
        A_hit=float(unit * reuse_nl.sum() / L),
        unit=unit,
        cap_offset=cap_offset,
        mode=mode,
        reuse=reuse_nl,
        size=size_nl,
        W=W,
        lam0_hat=lam0_hat,
        conv_ptr=conv_ptr,
        offsets=offsets,
        cum_new=cs,
        hist_all=hist,
        need=need,
        new_all=new,
        demand_all=demand,
    )


def displacement_moments(acc: EngineAccounting, t: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per unit λ0, the mean m₁(t) and variance V₁(t) of the displacement D(t) over a tagged gap of length t:
    D(t) = ∫ Φ_t dN (eq. (40)) with N a Poisson random measure of intensity ν = λ0 da × (empirical mark law of
    the trace's conversations), so E D(t) = λ0 m₁(t) and Var D(t) = λ0 V₁(t) = λ0 ∫ Φ_t² dν/λ0 (Campbell).
    m₁(t) = E_B t + (1/L) Σ_i Σ_{j<M_i} hist_{i,j} min(W_{i,j}, t) (Lemma D.4 with each conversation's own gaps).
    Computed in closed form, near-linear in the trace (:func:`kvhit.estimate.displacement.phi_moments`).
    """
    tt = np.asarray(t, dtype=float)
    if not np.isfinite(tt).all() or (tt < 0).any():
        raise EstimateError("t: must be finite and ≥ 0")
    m, v = phi_moments(acc.conv_ptr, acc.offsets, acc.cum_new, acc.hist_all, tt.ravel())
    return (m / acc.L).reshape(tt.shape), (v / acc.L).reshape(tt.shape)


def _resolve_F(F: Any, W: np.ndarray) -> Interarrival:
    if isinstance(F, str):
        if F not in ("empirical", "posterior"):
            raise EstimateError(f"F: expected 'empirical', 'posterior' or an Interarrival, got {F!r}")
        if W.size == 0:
            raise EstimateError("trace: no interarrival gap observed (every conversation has a single turn)")
        if F == "empirical":
            return EmpiricalW(W)
        return Exponential(float(np.mean(W)))
    if not isinstance(F, Interarrival):
        raise EstimateError(f"F: expected 'empirical', 'posterior' or an Interarrival, got {type(F).__name__}")
    return F


def _representatives(F: Interarrival, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Points w_q and weights p_q with Σ p_q g(w_q) ≈ E g(W): the samples themselves (an empirical F̂ with at
    most ``k`` distinct values), else the midpoints of ``k`` equal-probability bins."""
    if isinstance(F, EmpiricalW):
        w = F.samples
        u, c = np.unique(w, return_counts=True)
        if u.size <= k:
            return u, c / w.size
        q = (np.arange(k) + 0.5) / k
        return np.quantile(w, q, method="inverted_cdf"), np.full(k, 1.0 / k)
    mu = float(F.mean)
    grid = np.concatenate([[0.0], np.geomspace(mu * 1e-6, mu * 1e3, 8192)])
    cdf = np.maximum.accumulate(np.asarray(F.cdf(grid), dtype=float))
    q = (np.arange(k) + 0.5) / k
    return np.interp(q, cdf, grid), np.full(k, 1.0 / k)


def _fluct_grid(F: Interarrival, k: int = 1024) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Representatives (w_q, p_q) of F and the t grid on which V₁(t) is tabulated and interpolated."""
    w, p = _representatives(F, k)
    wmax = float(w.max())
    tg = np.unique(np.concatenate([np.linspace(0.0, wmax, 129), np.quantile(w, np.linspace(0, 1, 129))]))
    return w, p, tg


@njit(cache=True)
def _phi2_prefix_kernel(conv_ptr, offsets, cum_new, hist, tgrid, out_v):  # pragma: no cover - numba
    """out_v[p0 + J − 1, it] = ∫ Φ_t^{(i,J)}(a)² da for every conversation i (rows p0..p1−1) and every admitted
    prefix J = 1..M_i of its turns (the conversation truncated to its first J turns, as
    :meth:`EngineAccounting.admitted` makes it): the same segments as
    :func:`kvhit.estimate.displacement.phi_moments_reference`; on a segment with first/last in-window access
    k_f ≤ k_l the truncated Φ is 0 for J < k_f, hist[k_f − 1] − cum_new[k_f − 1] + cum_new[J]
    for k_f ≤ J < k_l and the full Φ for J ≥ k_l (a difference array)."""
    nconv = conv_ptr.size - 1
    for c in range(nconv):
        p0 = conv_ptr[c]
        p1 = conv_ptr[c + 1]
        M = p1 - p0
        s = offsets[p0:p1]
        bp = np.empty(2 * M)
        tail = np.zeros(M + 1)
        for it in range(tgrid.size):
            t = tgrid[it]
            for k in range(M):
                bp[2 * k] = -s[k]
                bp[2 * k + 1] = t - s[k]
            bp.sort()
            lo_lim = -s[M - 1]
            tail[:] = 0.0
            for q in range(2 * M - 1):
                lo = max(bp[q], lo_lim)
                hi = min(bp[q + 1], t)
                if hi <= lo:
                    continue
                am = 0.5 * (lo + hi)
                kl = np.searchsorted(s, t - am, side="right")
                kf = np.searchsorted(s, -am, side="right") + 1
                if kf > kl:
                    continue
                h0 = 0.0
                if kf >= 2:
                    h0 = hist[p0 + kf - 2] - cum_new[p0 + kf - 2]
                ln = hi - lo
                for J in range(kf, kl):
                    phi = h0 + cum_new[p0 + J - 1]
                    out_v[p0 + J - 1, it] += phi * phi * ln
                phi = h0 + cum_new[p0 + kl - 1]
                tail[kl] += phi * phi * ln
            run = 0.0
            for J in range(1, M + 1):
                run += tail[J]
                out_v[p0 + J - 1, it] += run


class _PrefixVariance:
    """V₁(t) (Lemma D.1, per unit λ0) of every admitted set of :meth:`EngineAccounting.admitted` from one
    table of the per-conversation, per-prefix ∫Φ² (:func:`_phi2_prefix_kernel`): V₁ at capacity N is the sum
    over conversations of their row for J_i(N) turns, divided by L."""

    def __init__(self, acc: EngineAccounting, tg: np.ndarray):
        self.acc = acc
        self.tab = np.zeros((acc.hist_all.size, tg.size))
        _phi2_prefix_kernel(acc.conv_ptr, acc.offsets, acc.cum_new, acc.hist_all, tg, self.tab)
        cid = np.repeat(np.arange(acc.conv_ptr.size - 1), np.diff(acc.conv_ptr))
        self.cid = cid

    def v1(self, N: float) -> np.ndarray:
        acc = self.acc
        keep = acc.need <= N
        last = np.zeros(keep.size, bool)
        nxt = np.append(keep[1:], False) & (np.append(self.cid[1:], -1) == self.cid)
        last[keep & ~nxt] = True  # the last admitted turn of each conversation
        return self.tab[last].sum(axis=0) / acc.L


class _Occupancy:
    """G(x) = P(D(W) ≤ x): the probability that the displacement over a tagged gap W stays within x blocks.

    Deterministic (mean-field): D(W) ≈ d(W) = λ0 E_B W + λ0 A ∫₀^W F̄, so G(x) = F(τ(x)) with τ = d⁻¹ (eq. (38)
    with x in place of N). With fluctuations, D(W) given W is approximated by a Gaussian of mean d(W) and
    variance λ0 V₁(W) (:func:`displacement_moments`, Lemma D.1), with a continuity correction of ½ block:
    G(x) = E_W Φ((x + ½ − d(W)) / √(λ0 V₁(W)))."""

    def __init__(
        self,
        acc: EngineAccounting,
        F: Interarrival,
        lam0: float,
        fluctuations: bool,
        k: int = 1024,
        v1: np.ndarray | None = None,
    ):
        self.acc, self.F, self.lam0, self.fluct = acc, F, float(lam0), bool(fluctuations)
        if self.fluct:
            w, p, tg = _fluct_grid(F, k)
            if v1 is None:
                _, v1 = displacement_moments(acc, tg)
            self.w, self.p = w, p
            self.mean = self.lam0 * (acc.E_B * w + acc.A * np.asarray(F.int_sf(w), dtype=float))
            self.sd = np.sqrt(self.lam0 * np.interp(w, tg, v1))

    def tau(self, x: np.ndarray) -> np.ndarray:
        out = np.zeros(x.shape)
        pos = x > 0
        if pos.any():
            out[pos] = theory.solve_T_C(self.acc.E_B, self.acc.A, self.F, self.lam0, x[pos])
        return out

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        G = np.zeros(x.shape)
        ok = x >= 0
        if not ok.any():
            return G
        if not self.fluct:
            G[ok] = np.asarray(self.F.cdf(self.tau(x[ok])), dtype=float)
            return G
        from scipy.special import ndtr

        xs = x[ok]
        out = np.empty(xs.size)
        sd = self.sd
        zero = sd <= 0
        sdz = np.where(zero, 1.0, sd)
        for a in range(0, xs.size, 2048):
            z = (xs[a : a + 2048, None] + 0.5 - self.mean[None, :]) / sdz[None, :]
            g = np.where(zero[None, :], (xs[a : a + 2048, None] >= self.mean[None, :]).astype(float), ndtr(z))
            out[a : a + 2048] = g @ self.p
        G[ok] = out
        return G


def _capacities(N: Any, integer: bool) -> np.ndarray:
    a = np.asarray(N, dtype=float)
    if a.size == 0:
        raise EstimateError("N: empty")
    if not np.isfinite(a).all() or (a <= 0).any():
        raise EstimateError("N: capacities must be finite and > 0")
    if integer and (a != np.round(a)).any():
        raise EstimateError("N: the finite-capacity / engine estimators need integer capacities (blocks)")
    return a


def _grid_eval(G: _Occupancy, xs: np.ndarray, max_points: int = 16384) -> np.ndarray:
    """G at the sorted unique integers ``xs`` (exactly, or by linear interpolation from ``max_points`` points
    when the range is wider and fluctuations make G smooth)."""
    if not G.fluct or xs.size <= max_points:
        return G(xs)
    g = np.linspace(xs[0], xs[-1], max_points)
    return np.interp(xs, g, G(g))


def _hits_per_lambda(
    acc: EngineAccounting,
    F: Interarrival,
    lam0: float,
    N: np.ndarray,
    finite: bool,
    partial: bool,
    fluctuations: bool,
    v1: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(h, τ(C)) for the capacities N (1-d) at one λ0 (``v1``: V₁ on :func:`_fluct_grid`'s t grid, if known)."""
    total = acc.A_R * acc.L
    if total <= 0 or acc.E_B <= 0:  # every request rejected (or no full block): nothing can hit
        return np.zeros(N.shape), np.zeros(N.shape)
    G = _Occupancy(acc, F, lam0, fluctuations, v1=v1)
    C = N - acc.cap_offset
    tau = G.tau(np.maximum(C, 0.0))
    if acc.reuse.size == 0:  # no admitted revisit
        return np.zeros(N.shape), tau
    if not finite:
        h = acc.A_hit * acc.L * G(C) / total
        return h, tau
    if acc.mode == "prefix" and partial:
        # Σ_rows Σ_{i<H} G(C − 1 − i) = Σ_h n_h (cumG(C − 1) − cumG(C − 1 − h)), cumG(x) = Σ_{0≤y≤x} G(y)
        hv, nh = np.unique(acc.reuse.astype(np.int64), return_counts=True)
        hi = int(C.max()) - 1
        if hi < 0:
            return np.zeros(N.shape), tau
        lo = max(0, int(C.min()) - 1 - int(hv.max()))
        xs = np.arange(lo, hi + 1, dtype=float)
        cum = np.concatenate([[0.0], np.cumsum(_grid_eval(G, xs))])  # cum[k] = Σ_{y<lo+k} G(y) − Σ_{y<lo} G
        base = G(np.arange(0, lo, dtype=float)).sum() if lo > 0 else 0.0

        def cumG(x):  # Σ_{0 ≤ y ≤ x} G(y), x integer ≥ lo − 1 or < 0
            k = np.clip(x - lo + 1, 0, cum.size - 1).astype(np.int64)
            return np.where(x < 0, 0.0, base + cum[k])

        Ci = C.astype(np.int64)
        top = cumG(Ci - 1)
        hits = (nh[None, :] * (top[:, None] - cumG(Ci[:, None] - 1 - hv[None, :]))).sum(axis=1)
        return acc.unit * hits / total, tau
    # whole content: hit iff D + size ≤ C, weight reuse
    sv, inv = np.unique(acc.size, return_inverse=True)
    ws = np.bincount(inv, weights=acc.reuse, minlength=sv.size)
    x = C[:, None] - sv[None, :]
    xs = np.unique(x[x >= 0])
    Gx = np.zeros(x.shape)
    if xs.size:
        gv = _grid_eval(G, xs) if (xs == np.round(xs)).all() else G(xs)
        pos = x >= 0
        Gx[pos] = gv[np.searchsorted(xs, x[pos])]
    return acc.unit * (Gx @ ws) / total, tau


def estimate_engine(
    source: Trace | EngineAccounting,
    N: Any,
    lam0: Any = None,
    F: Interarrival | str = "empirical",
    *,
    engine: str = "vllm",
    metric: str = "tokens",
    accounting: str = "engine",
    finite: bool = True,
    partial: bool = True,
    fluctuations: bool = True,
    block_size: int | None = None,
    rows: Any = None,
    rejection: bool = True,
) -> EngineEstimate:
    """Hit ratio of the engine the user runs, from a trace (docs/estimators.md derives every term).

    Let C = N − cap_offset and τ(x) the root of λ0 E_B τ + λ0 A ∫₀^τ F̄ = x (eq. (38) with the engine's
    new-block displacement E_B and history displacement A, :class:`EngineAccounting`), and
    G(x) = P(D(W) ≤ x) the probability that a tagged history is displaced by at most x blocks over its gap W:
    F(τ(x)) (mean field) or the Gaussian correction of :class:`_Occupancy` (``fluctuations=True``, Lemma D.1).
    Then ĥ = Σ_{turns j<M} unit · hits_j / Σ_{turns} demand_j with

    * ``finite=False``: hits_j = reuse_j · G(C) (eq. (39): own size negligible against N);
    * ``finite=True`` and whole-content hits (Algorithm 1, ``accounting="paper"``, or ``partial=False``):
      hits_j = reuse_j · G(C − size_j) — no hit when size_j > C;
    * ``finite=True, partial=True`` on a vLLM engine: hits_j = Σ_{i<H_j} G(C − 1 − i) (tail-first freeing:
      block i of the history survives iff D + i + 1 ≤ C).

    ``accounting="paper", finite=False, fluctuations=False`` is :func:`estimate` (eq. (35)–(39)) exactly.

    ``rejection=True`` (vLLM engines): at each capacity N the accounting is that of the admitted requests
    (:meth:`EngineAccounting.admitted`: a request with ⌈T_j/b⌉ > N is rejected — no displacement, no demand,
    no hit — and so are the later turns of its conversation); capacities are grouped by the admitted set,
    which only changes at the distinct values of ⌈T_j/b⌉. When no request is admitted, h = 0. Without
    rejections (N ≥ max ⌈T_j/b⌉, and always for Algorithm 1 / the paper's rule) nothing changes.

    Args:
        source: a :class:`Trace` (read with :func:`engine_accounting`; ``rows`` selects conversations as in
            :func:`trace_moments`) or a precomputed :class:`EngineAccounting` (then ``engine``, ``metric``,
            ``accounting``, ``block_size``, ``rows`` are taken from it).
        N: capacities in blocks (integers unless ``finite=False`` and whole-content), array or scalar.
        lam0: unscaled conversation arrival rate(s), broadcast with N; default: the trace's λ̂0.
        F: ``"empirical"`` (F̂ of the trace's gaps), ``"posterior"`` (exponential, observed mean) or an
            :class:`Interarrival`.
        engine: ``"vllm"`` (≥ 0.24), ``"vllm-0.23"`` or ``"content"`` (Algorithm 1).
        metric: ``"tokens"`` (vLLM's prefix_cache_hits / queries) or ``"blocks"`` (Σ hit blocks / Σ ⌈T/b⌉).
        accounting: ``"engine"`` or ``"paper"``.
        finite, partial, fluctuations: the ingredients above.
    """
    if isinstance(source, Trace):
        acc = engine_accounting(
            source, engine=engine, metric=metric, accounting=accounting, block_size=block_size, rows=rows
        )
    elif isinstance(source, EngineAccounting):
        acc = source
    else:
        raise EstimateError(f"source: expected a Trace or EngineAccounting, got {type(source).__name__}")
    Fr = _resolve_F(F, acc.W)
    if lam0 is None:
        lam0 = acc.lam0_hat
        if not (isinstance(lam0, float) and math.isfinite(lam0) and lam0 > 0):
            raise EstimateError("lam0: not given and not estimable from the source")
    lam = np.asarray(lam0, dtype=float)
    if not np.isfinite(lam).all() or (lam <= 0).any():
        raise EstimateError("lam0: must be finite and > 0")
    Nb, lb = np.broadcast_arrays(_capacities(N, finite and acc.mode == "prefix" and partial), lam)
    if acc.cap_offset and (Nb <= acc.cap_offset).any():
        raise EstimateError(f"N: must exceed {acc.cap_offset} block(s) for engine {acc.engine!r}")
    h = np.empty(Nb.shape)
    tc = np.empty(Nb.shape)
    pv = None
    for lv in np.unique(lb):
        sel = lb == lv
        for acc_g, sub, n_adm in _admission_groups(acc, Nb, sel, rejection):
            v1 = None
            if fluctuations and acc_g is not acc and acc_g.A_R > 0 and acc_g.E_B > 0:
                if pv is None:
                    pv = _PrefixVariance(acc, _fluct_grid(Fr)[2])
                v1 = pv.v1(n_adm)
            hh, tt = _hits_per_lambda(acc_g, Fr, float(lv), Nb[sub].astype(float), finite, partial, fluctuations, v1=v1)
            h[sub], tc[sub] = hh, tt
    scalar = h.ndim == 0

    def out(x):
        return float(x) if scalar else x

    return EngineEstimate(
        h=out(h),
        T_C=out(tc),
        h_max=acc.h_max,
        N=out(Nb.copy()),
        lam0=out(lb.copy()),
        engine=acc.engine,
        metric=acc.metric,
        accounting=acc.accounting,
        finite=bool(finite),
        partial=bool(partial and acc.mode == "prefix"),
        fluctuations=bool(fluctuations),
    )


def _admission_groups(acc: EngineAccounting, Nb: np.ndarray, sel: np.ndarray, rejection: bool):
    """(accounting of the admitted requests, boolean mask of the capacities) for each distinct admitted set
    among the capacities ``Nb[sel]`` (:meth:`EngineAccounting.admitted`)."""
    if not rejection or acc.need is None:
        yield acc, sel, math.inf
        return
    thr = np.unique(acc.need)
    key = np.searchsorted(thr, Nb, side="right")  # number of distinct thresholds ⌈T/b⌉ ≤ N
    for k in np.unique(key[sel]):
        sub = sel & (key == k)
        n_adm = float(thr[k - 1]) if k else 0.0  # the admitted set is {⌈T/b⌉ ≤ n_adm}
        yield (acc if k == thr.size else acc.admitted(n_adm)), sub, n_adm


def estimate_finite(
    source: Trace | EngineAccounting,
    N: Any,
    lam0: Any = None,
    F: Interarrival | str = "empirical",
    *,
    rows: Any = None,
) -> EngineEstimate:
    """The finite-capacity estimator of the paper's model (each turn its own threshold):
    ĥ = Σ_i Σ_{j<M_i} (R_{i,j} − 1) F̂(τ(N − R_{i,j})) / Σ_i Σ_j R_{i,j}, τ(x) solving
    λ0 Ê[B] τ + λ0 Â_H^hash ∫₀^τ F̂̄ = x (eq. (38) with x for N), and no hit when R_{i,j} ≥ N (τ(0) = 0).
    It tends to eq. (39) when R_{i,j}/N → 0. Same as ``estimate_engine(..., accounting="paper",
    finite=True, fluctuations=False)``; vectorized over N and λ0."""
    if isinstance(source, Trace):
        source = engine_accounting(source, accounting="paper", rows=rows)
    return estimate_engine(source, N, lam0, F, accounting="paper", finite=True, fluctuations=False)


# ----------------------------------------------------------------------------------------------------------
# Window-exact (transient) form: the measured rows, their own gaps, and no conversation before the origin
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _phi_table_kernel(conv_ptr, offsets, cum_new, hist, tgrid, sgrid, out_m, out_v):  # pragma: no cover
    """out[it, is] += Σ_i ∫_{a > −s} Φ_t^{(i)}(a) (and Φ²) da: the background mass of conversations that
    arrived after the system origin, for a tagged access s seconds after the origin (see
    :func:`kvhit.estimate.displacement.phi_moments_reference`)."""
    nconv = conv_ptr.size - 1
    ns = sgrid.size
    for c in range(nconv):
        p0 = conv_ptr[c]
        p1 = conv_ptr[c + 1]
        M = p1 - p0
        s = offsets[p0:p1]
        bp = np.empty(2 * M)
        seg_lo = np.empty(2 * M)
        seg_hi = np.empty(2 * M)
        seg_m = np.empty(2 * M)
        seg_v = np.empty(2 * M)
        for it in range(tgrid.size):
            t = tgrid[it]
            for k in range(M):
                bp[2 * k] = -s[k]
                bp[2 * k + 1] = t - s[k]
            bp.sort()
            lo_lim = -s[M - 1]
            nseg = 0
            for q in range(2 * M - 1):
                lo = max(bp[q], lo_lim)
                hi = min(bp[q + 1], t)
                if hi <= lo:
                    continue
                am = 0.5 * (lo + hi)
                kl = np.searchsorted(s, t - am, side="right")
                kf = np.searchsorted(s, -am, side="right") + 1
                if kf > kl:
                    continue
                phi = cum_new[p0 + kl - 1]
                if kf >= 2:
                    phi += hist[p0 + kf - 2] - cum_new[p0 + kf - 2]
                seg_lo[nseg] = lo
                seg_hi[nseg] = hi
                seg_m[nseg] = phi
                seg_v[nseg] = phi * phi
                nseg += 1
            for js in range(ns):
                cut = -sgrid[js]
                am_ = 0.0
                av_ = 0.0
                for q in range(nseg):
                    lo = max(seg_lo[q], cut)
                    if seg_hi[q] > lo:
                        am_ += seg_m[q] * (seg_hi[q] - lo)
                        av_ += seg_v[q] * (seg_hi[q] - lo)
                out_m[it, js] += am_
                out_v[it, js] += av_


@njit(cache=True)
def _row_hits_kernel(H, size, mean, sd, C, prefix, out):  # pragma: no cover - numba
    """Expected hit blocks per row: Σ_{i<H} P(D ≤ C − 1 − i) (prefix) or H·P(D ≤ C − size) (whole), with
    D ~ Normal(mean, sd²) and a ½-block continuity correction (sd = 0: D = mean)."""
    for r in range(H.size):
        h = H[r]
        tot = 0.0
        if prefix:
            for i in range(int(h)):
                x = C - 1 - i
                if x < 0:
                    break
                if sd[r] > 0:
                    tot += 0.5 * math.erfc(-(x + 0.5 - mean[r]) / (sd[r] * math.sqrt(2.0)))
                elif mean[r] <= x:
                    tot += 1.0
        else:
            x = C - size[r]
            if x >= 0:
                if sd[r] > 0:
                    tot = h * 0.5 * math.erfc(-(x + 0.5 - mean[r]) / (sd[r] * math.sqrt(2.0)))
                elif mean[r] <= x:
                    tot = h
        out[r] = tot


def _bilinear(tab: np.ndarray, tg: np.ndarray, sg: np.ndarray, t: np.ndarray, s: np.ndarray) -> np.ndarray:
    t = np.clip(t, tg[0], tg[-1])
    s = np.clip(s, sg[0], sg[-1])
    i = np.clip(np.searchsorted(tg, t, side="right") - 1, 0, tg.size - 2)
    j = np.clip(np.searchsorted(sg, s, side="right") - 1, 0, sg.size - 2)
    u = (t - tg[i]) / (tg[i + 1] - tg[i])
    v = (s - sg[j]) / (sg[j + 1] - sg[j])
    return (
        tab[i, j] * (1 - u) * (1 - v)
        + tab[i + 1, j] * u * (1 - v)
        + tab[i, j + 1] * (1 - u) * v
        + tab[i + 1, j + 1] * u * v
    )


def estimate_window(
    trace: Trace,
    N: Any,
    lam0: float,
    *,
    window: Any = None,
    engine: str = "vllm",
    metric: str = "tokens",
    accounting: str = "engine",
    partial: bool = True,
    fluctuations: bool = True,
    origin: float | None = 0.0,
    block_size: int | None = None,
    n_t: int = 96,
    n_s: int = 48,
    rejection: bool = True,
) -> EngineEstimate:
    """The engine estimator evaluated on the rows a measurement actually counts (window-exact form).

    The predicted hit ratio is Σ_{r ∈ window} unit·E[hits_r] / Σ_{r ∈ window} demand_r over the window's rows
    (the metric's own ratio of sums), where row r (turn j+1 ≥ 2 of its conversation, gap W_r since turn j,
    which happened s_r seconds after ``origin``) has E[hits_r] = Σ_{i<H_j} P(D_r ≤ C − 1 − i) (vLLM,
    tail-first freeing; ``partial=False`` or whole content: H_j·P(D_r ≤ C − size_j)). D_r, the displacement
    over (s_r, s_r + W_r], is the Poisson random measure of Lemma D.1 restricted to conversations that arrived
    after the origin (no conversation exists before the system starts: the warm-up transient of App. E), with
    mean λ0 m₁(W_r; s_r) and variance λ0 V₁(W_r; s_r) tabulated on an ``n_t`` × ``n_s`` grid and
    interpolated; the marks are the trace's own conversations (all of them). ``origin=None`` drops the
    restriction (stationary). ``fluctuations=False`` uses D_r = its mean.

    Each row's own realized gap W_r is used (the tagged gap, independent of the background in the model);
    the background is never replayed.

    ``rejection=True`` (vLLM engines): at capacity N, rows with ⌈T_j/b⌉ > N are rejected (left out of the
    numerator and the denominator, as the simulator's metrics do) and the background is the admitted
    accounting :meth:`EngineAccounting.admitted` (one moment table per distinct admitted set).
    """
    if not isinstance(trace, Trace):
        raise EstimateError(f"trace: expected a Trace, got {type(trace).__name__}")
    acc = engine_accounting(trace, engine=engine, metric=metric, accounting=accounting, block_size=block_size)
    lam0 = float(lam0)
    if not (math.isfinite(lam0) and lam0 > 0):
        raise EstimateError(f"lam0: must be finite and > 0, got {lam0!r}")
    Ns = _capacities(N, True)
    if window is None:
        wmask = np.ones(trace.n_turns, bool)
    elif hasattr(window, "mask"):
        wmask = np.asarray(window.mask(trace), bool)
    else:
        wmask = np.asarray(window, bool)
        if wmask.shape != (trace.n_turns,):
            raise EstimateError(f"window: a row mask must have shape ({trace.n_turns},), got {wmask.shape}")
    # rows in conversation-major order, as in engine_accounting (all conversations)
    order = trace.conv_index()[2]
    conv = trace["conv"][order]
    first = np.concatenate([[True], conv[1:] != conv[:-1]])
    t_abs = np.asarray(trace["time"], dtype=float)[order]
    wm = wmask[order]
    # metric demand per row and the previous turn's reuse/size
    ptr = acc.conv_ptr
    last = np.zeros(conv.size, bool)
    last[ptr[1:] - 1] = True
    reuse_all = np.empty(conv.size)
    size_all = np.empty(conv.size)
    reuse_all[~last] = acc.reuse
    size_all[~last] = acc.size
    reuse_all[last] = 0.0
    size_all[last] = 0.0
    demand = _row_demand(trace, acc, order)
    rev = wm & ~first  # measured revisits
    H = np.concatenate([[0.0], reuse_all[:-1]])[rev]
    S = np.concatenate([[0.0], size_all[:-1]])[rev]
    W = (t_abs - np.concatenate([[0.0], t_abs[:-1]]))[rev]
    t0 = float(trace["conv_arrival"].min()) if origin is None else float(origin)
    s_start = t_abs[rev] - W - t0  # time of the previous access since the origin
    if origin is None:
        s_start = np.full(W.size, np.inf)
    wmax = float(W.max()) if W.size else 1.0
    tg = np.unique(np.concatenate([np.linspace(0.0, wmax, n_t), np.quantile(W, np.linspace(0, 1, n_t))]))
    life = float(acc.offsets.max())
    if origin is None:
        sg = np.array([0.0, 1.0]) * (life + 1.0) + 1e12  # beyond every lifetime: stationary
        s_eval = np.full(W.size, sg[0])
    else:
        sg = np.unique(np.concatenate([np.linspace(0.0, life + wmax, n_s), [life + wmax + 1.0]]))
        s_eval = np.maximum(s_start, 0.0)
    h = np.empty(Ns.shape)
    flat = Ns.ravel()
    hf = h.ravel()
    # rows of ``order`` are the accounting's rows (conversation-major, all conversations)
    need_rows = acc.need if (rejection and acc.need is not None) else None
    groups = (
        [(acc, np.ones(flat.size, bool), math.inf)]
        if need_rows is None
        else list(_admission_groups(acc, flat, np.ones(flat.size, bool), True))
    )
    for acc_g, sub, n_adm in groups:
        adm = np.ones(conv.size, bool) if need_rows is None else need_rows <= n_adm
        den = float(demand[wm & adm].sum())
        if den <= 0:
            hf[sub] = 0.0
            continue
        keep = adm[rev]  # the measured revisits that are admitted (their previous turn then is too)
        m_tab = np.zeros((tg.size, sg.size))
        v_tab = np.zeros((tg.size, sg.size))
        _phi_table_kernel(acc_g.conv_ptr, acc_g.offsets, acc_g.cum_new, acc_g.hist_all, tg, sg, m_tab, v_tab)
        Wk, sk = W[keep], s_eval[keep]
        mean = lam0 * _bilinear(m_tab, tg, sg, Wk, sk) / acc.L
        sd = np.sqrt(lam0 * _bilinear(v_tab, tg, sg, Wk, sk) / acc.L) if fluctuations else np.zeros(Wk.size)
        out = np.empty(Wk.size)
        for k in np.flatnonzero(sub):
            n = flat[k]
            _row_hits_kernel(
                H[keep], S[keep], mean, sd, float(n - acc.cap_offset), acc.mode == "prefix" and partial, out
            )
            hf[k] = acc.unit * out.sum() / den
    h = hf.reshape(Ns.shape)
    scalar = h.ndim == 0
    return EngineEstimate(
        h=float(h) if scalar else h,
        T_C=math.nan,
        h_max=acc.h_max,
        N=float(Ns) if scalar else Ns,
        lam0=lam0,
        engine=acc.engine,
        metric=acc.metric,
        accounting=acc.accounting,
        finite=True,
        partial=bool(partial and acc.mode == "prefix"),
        fluctuations=bool(fluctuations),
    )


def _row_demand(trace: Trace, acc: EngineAccounting, order: np.ndarray) -> np.ndarray:
    if acc.engine in ("paper", "content"):
        return np.asarray(trace["R"], dtype=float)[order]
    b = acc.block_size
    T = (
        np.asarray(trace["cum_tokens"], dtype=np.int64)[order]
        if "cum_tokens" in trace.cols
        else np.asarray(trace["R"], dtype=np.int64)[order] * b - 1
    )
    return T.astype(float) if acc.metric == "tokens" else (-(-T // b)).astype(float)
