"""Engine-aware block accounting of a trace (App. B.4, Lemma D.1–D.4): per turn, what it displaces, what it can
hit and what the metric counts.

:func:`engine_accounting` reads, per conversation and turn (conversation-major order), the new-block displacement,
the history displacement, the reusable blocks and the metric's demand for one engine model (:data:`ENGINE_MODELS`:
vLLM ≥ 0.24, vLLM ≤ 0.23, Algorithm 1) or for the paper's rule (``accounting="paper"``, eq. (35)–(39));
:class:`EngineAccounting` documents each term, and :meth:`EngineAccounting.admitted` gives the accounting of what
an engine with N blocks admits. :func:`displacement_moments` is the mean and variance per unit λ0 of the
displacement over a tagged gap (Lemma D.1; closed form in :mod:`kvhit.estimate.displacement`).

Invariant: E_B, A, A_R and A_hit are sums over the selected conversations divided by the same L (the arrival
normalisation of λ0, unchanged by :meth:`EngineAccounting.admitted`), and ``h_max = A_hit/A_R``.

NOT modelled here: the cache (capacity, LRU order, the hit condition): that is :mod:`kvhit.estimate.occupancy`
and :mod:`kvhit.estimate.engine`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvhit.estimate.displacement import phi_moments
from kvhit.estimate.trace_stats import EstimateError, _conv_layout, trace_moments
from kvhit.workload.trace import Trace

__all__ = [
    "ENGINE_MODELS",
    "METRICS",
    "ACCOUNTINGS",
    "EngineAccounting",
    "engine_accounting",
    "displacement_moments",
]


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
