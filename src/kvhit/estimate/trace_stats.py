"""Empirical workload statistics of a trace (App. C.2.2, eq. (35)–(37)), the input of every trace estimator.

From the L conversations of a :class:`~kvhit.workload.trace.Trace` (M_i turns, physical history sizes R_{i,j},
B_i = R_{i,M_i}) :func:`trace_moments` computes

* Â_R = (1/L) Σ_i Σ_{j≤M_i} R_{i,j} (eq. (35)),
* Â_H^hash = (1/L) Σ_i Σ_{j<M_i} (R_{i,j} − 1) (eq. (36)), base-model Â_H = (1/L) Σ_i Σ_{j<M_i} R_{i,j},
* Ê[B] = (1/L) Σ_i B_i and Ê[M] = (1/L) Σ_i M_i (eq. (37)),

with their standard errors, the observed interarrival gaps W (for F̂) and the arrival-rate estimate λ̂0.
:func:`_conv_layout` is the conversation-major row layout (id, then turn) that the engine-aware accountings
(:mod:`kvhit.estimate.accounting`, :mod:`kvhit.estimate.sglang`) share; :class:`EstimateError` is the
estimators' one refusal (a ``ValueError`` whose message names the offending field or column).

Invariant: every selected conversation is complete (turns 1..M_i all present; ``incomplete="drop"`` leaves an
incomplete one out, the default refuses), and every moment is a sum over the selected conversations divided by
the same L.

NOT modelled here: the cache. These are statistics of the workload alone; the estimators built on them are
:mod:`kvhit.estimate.mean_field` (eq. (38)–(39)) and :mod:`kvhit.estimate.engine` (engine-aware).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from kvhit.workload.trace import Trace

__all__ = ["BLOCK_RULES", "EstimateError", "TraceMoments", "trace_moments"]


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
