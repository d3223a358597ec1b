"""Hit ratio at every capacity of a trace: exact simulated curves beside the estimators' curves.

:func:`curve_data` computes, over the measured rows of a trace, the exact all-capacity curves of Algorithm 1
(whole-content LRU, practical weight eq. (31), from stack distances: :mod:`kvhit.sim.content.stackdist`) and of the
vLLM block pool (both free-queue orders, block-weighted h of eq. (6), :mod:`kvhit.sim.vllm.curve`), and the
estimators' curves (the paper's eq. (39) with F̂, and the engine-aware estimator of each policy).

Invariants: a simulated value is exact at every capacity it is given for; a capacity below the largest
request (``N < N_min = max_j ⌈T_j/b⌉``) cannot serve the workload under vLLM (the request is refused), so the
vLLM series — simulated and estimated — are NaN there and ``feasible`` is false (Algorithm 1 inserts an
oversize content and evicts it: its series is defined everywhere). :func:`default_capacity_range` states the
rule that ends the default range where the curves saturate.

NOT modelled: in-flight holds (the curves are for instantaneous requests, as the stack-distance passes are).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvhit.estimate.accounting import engine_accounting
from kvhit.estimate.engine import estimate_engine
from kvhit.estimate.mean_field import empirical_F, estimate
from kvhit.estimate.trace_stats import trace_moments
from kvhit.sim.content.stackdist import FIRST_TURN, content_hit_thresholds
from kvhit.sim.runner import block_requests
from kvhit.sim.vllm.block import simulate_block
from kvhit.sim.vllm.curve import block_hit_thresholds
from kvhit.sim.vllm.curve_conv import conv_threshold_histogram
from kvhit.workload.trace import Trace, Window

__all__ = [
    "POLICIES",
    "SATURATION_QUANTILE",
    "SATURATION_MARGIN",
    "CurveInputs",
    "curve_inputs",
    "default_capacity_range",
    "saturation_capacity",
    "curve_data",
]

#: simulated policies and their labels
POLICIES = {
    "content": "Algorithm 1 (content LRU)",
    "vllm": "vLLM ≥ 0.24 (block cache)",
    "vllm-0.23": "vLLM ≤ 0.23 (block cache)",
}
_EST_LABEL = {"content": "Algorithm 1", "vllm": "vLLM ≥ 0.24", "vllm-0.23": "vLLM ≤ 0.23"}
#: the default range ends at SATURATION_MARGIN × the capacity where every simulated curve reaches this share
#: of its infinite-capacity value
SATURATION_QUANTILE = 0.99
SATURATION_MARGIN = 1.25

Progress = Callable[[int, int, str], None]


def _no_progress(done: int, total: int, what: str) -> None:
    return None


class _Cumulative:
    """Σ_i w_i·1{thr_i ≤ N} for any N, from the finite thresholds ``thr`` and weights ``w``, kept as the sorted
    distinct thresholds and their cumulative weight (O(distinct thresholds) memory instead of one entry per
    event: what keeps a 10⁷-turn curve within a few GB)."""

    def __init__(self, thr: np.ndarray, w: np.ndarray | None):
        if thr.size == 0:
            self.values, self.cum = np.zeros(0, np.int64), np.zeros(0)
            return
        if w is not None and np.ndim(w) == 0:  # one weight for every threshold
            w = np.full(thr.shape, float(w))
        top = int(thr.max())
        if top < 4 * thr.size + 1024:  # a histogram over threshold values: O(n), no sort
            h = np.bincount(thr, weights=w, minlength=top + 1)
            self.values = np.flatnonzero(h)
            self.cum = np.cumsum(h[self.values], dtype=float)
        else:
            self.values, inv = np.unique(thr, return_inverse=True)
            self.cum = np.cumsum(np.bincount(inv.ravel(), weights=w, minlength=self.values.size), dtype=float)

    @classmethod
    def from_histogram(cls, hist: np.ndarray, scale: float = 1.0) -> _Cumulative:
        """From ``hist[v]`` = weight of the thresholds equal to ``v`` (times ``scale``)."""
        self = cls.__new__(cls)
        self.values = np.flatnonzero(hist)
        self.cum = np.cumsum(hist[self.values], dtype=float) * scale
        return self

    @property
    def total(self) -> float:
        return float(self.cum[-1]) if self.cum.size else 0.0

    def __call__(self, Ns: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self.values, Ns, side="right")
        return np.where(k > 0, self.cum[np.maximum(k - 1, 0)] if self.cum.size else 0.0, 0.0)

    def quantile(self, q: float) -> int | None:
        """Smallest N with weight(≤ N) ≥ q·total (None when the total is 0)."""
        if self.total <= 0:
            return None
        k = int(np.searchsorted(self.cum, q * self.total * (1 - 1e-12), side="left"))
        return int(self.values[min(k, self.values.size - 1)])


@dataclass
class _BlockInputs:
    hit: _Cumulative  # hit blocks of measured requests
    prompt_tokens: int
    prompt_blocks: int
    min_exact_N: int
    ambiguous: np.ndarray


class _LazyRequests:
    """The block simulator's requests of a trace whose ids are conversation-structured (``source`` counts or
    blocks): prompt lengths at once, the id stream (:func:`kvhit.sim.runner.block_requests`) only if a caller
    needs it (an ambiguity interval to simulate) — it is 8 bytes per block access."""

    def __init__(self, tr: Trace, prompt_tokens: np.ndarray, block_size: int):
        self._tr = tr
        self.prompt_tokens = prompt_tokens
        self.block_size = block_size
        self.response_tokens = None
        self._rq = None

    def _full(self):
        if self._rq is None:
            self._rq = block_requests(self._tr, block_size=self.block_size)
        return self._rq

    @property
    def hash_offsets(self) -> np.ndarray:
        return self._full().hash_offsets

    @property
    def hashes(self) -> np.ndarray:
        return self._full().hashes


def _structured_tokens(tr: Trace) -> np.ndarray | None:
    """Prompt lengths ``T`` as :func:`kvhit.sim.runner.block_requests` sets them when its ids are
    ``(conversation, block index)`` (``source`` counts: ``cum_tokens``; blocks: ``R·b − 1``); None for token-id
    traces (chained hashes of real tokens: the general pass)."""
    if "new_tokens" in tr.lists:
        return None
    if "cum_tokens" in tr.cols:
        return tr["cum_tokens"].astype(np.int64)
    return tr["R"].astype(np.int64) * int(tr.block_size) - 1


@dataclass
class CurveInputs:
    """The one-pass hit thresholds of every simulated policy over a trace's measured rows, reduced to their
    cumulative distributions (the expensive part of a curve; capacities are then cheap)."""

    trace: Trace
    window: Window
    mask: np.ndarray
    content: _Cumulative | None  # practical hit weight (eq. (31)) of the measured rows
    content_demand: float  # Σ R over the measured rows
    blocks: dict[str, _BlockInputs]
    requests: Any
    N_min: int  # largest request ⌈T_j/b⌉ (vLLM refuses any request above N); 0 without a vLLM policy


def curve_inputs(
    tr: Trace, window: Window, policies=("content", "vllm", "vllm-0.23"), progress: Progress | None = None
) -> CurveInputs:
    """Hit thresholds of every policy in ``policies`` (one pass each), reduced to cumulative distributions."""
    cb = progress or _no_progress
    bad = set(policies) - set(POLICIES)
    if bad:
        raise ValueError(f"policies: unknown {sorted(bad)} ({', '.join(POLICIES)})")
    mask = window.mask(tr)
    total = len(policies)
    content = None
    blocks: dict[str, _BlockInputs] = {}
    rq = None
    for i, p in enumerate(policies):
        cb(i, total, f"hit thresholds: {POLICIES[p]}")
        if p == "content":
            thr = content_hit_thresholds(tr.dense_conv(), tr["R"])
            keep = mask & (thr < FIRST_TURN)
            w = np.maximum(tr.R_prev() - 1, 0)[keep].astype(float)
            content = _Cumulative(thr[keep], w)
            del thr
        else:
            T = _structured_tokens(tr) if tr.block_size else None
            if T is not None:  # ids (conversation, i): the compact pass (sim/vllm/curve_conv)
                ch = conv_threshold_histogram(tr.dense_conv(), T, block_size=int(tr.block_size), engine=p, mask=mask)
                if rq is None:
                    rq = _LazyRequests(tr, T, int(tr.block_size))
                blocks[p] = _BlockInputs(
                    _Cumulative.from_histogram(ch.hist),
                    int(T[mask].sum()),
                    int((-(-T[mask] // int(tr.block_size))).sum()),
                    int(ch.min_exact_N),
                    ch.ambiguous,
                )
                del ch
                continue
            if rq is None:
                rq = block_requests(tr)
            bt = block_hit_thresholds(rq.prompt_tokens, rq.hash_offsets, rq.hashes, block_size=rq.block_size, engine=p)
            sel = np.repeat(mask, np.diff(bt.offsets))
            sel &= bt.thresholds < FIRST_TURN
            hit = _Cumulative(bt.thresholds[sel], None)
            del sel
            blocks[p] = _BlockInputs(
                hit,
                int(bt.prompt_tokens[mask].sum()),
                int(bt.prompt_blocks[mask].sum()),
                int(bt.min_exact_N),
                bt.ambiguous,
            )
            del bt
    cb(total, total, "hit thresholds")
    n_min = max((bi.min_exact_N for bi in blocks.values()), default=0)
    return CurveInputs(tr, window, mask, content, float(tr["R"][mask].sum()), blocks, rq, n_min)


def saturation_capacity(inp: CurveInputs, q: float = SATURATION_QUANTILE) -> dict[str, int]:
    """Per simulated policy, the smallest capacity at which its exact curve reaches ``q`` of its
    infinite-capacity value (the ``q``-quantile of the hit thresholds weighted by the hit weight)."""
    out: dict[str, int] = {}
    if inp.content is not None:
        n = inp.content.quantile(q)
        if n is not None:
            out["content"] = n
    for p, bi in inp.blocks.items():
        n = bi.hit.quantile(q)
        if n is not None:
            out[p] = n
    return out


def default_capacity_range(inp: CurveInputs, n_min: int = 64) -> tuple[int, int]:
    """The default capacity range of ``kvhit curve``: from ``n_min`` to

        n_max = ⌈SATURATION_MARGIN · max(N_sat, N_min)⌉,

    N_sat the largest over the simulated policies of the capacity where the exact curve reaches
    ``SATURATION_QUANTILE`` (99%) of its infinite-capacity value (:func:`saturation_capacity`), N_min the
    largest request (vLLM curves only exist above it). The margin shows the plateau. If nothing ever hits,
    n_max = ⌈SATURATION_MARGIN · N_min⌉ (N_min = 0 without a vLLM policy). n_max is at least 2·n_min."""
    sat = saturation_capacity(inp)
    top = max(max(sat.values(), default=0), inp.N_min, 1)
    return int(n_min), max(int(math.ceil(SATURATION_MARGIN * top)), 2 * int(n_min))


def _ambiguous(bi: _BlockInputs, Ns: np.ndarray) -> np.ndarray:
    """Indices of feasible capacities inside an ambiguity interval of :mod:`kvhit.sim.vllm.curve` (rare)."""
    amb = bi.ambiguous
    if amb.shape[0] == 0:
        return np.zeros(0, np.int64)
    k = np.searchsorted(amb[:, 0], Ns, side="right") - 1
    inside = (k >= 0) & (Ns < amb[np.maximum(k, 0), 1]) & (Ns >= bi.min_exact_N)
    return np.flatnonzero(inside)


def curve_data(
    tr: Trace,
    Ns: np.ndarray,
    window: Window,
    *,
    policies=("content", "vllm", "vllm-0.23"),
    estimates: bool = True,
    inputs: CurveInputs | None = None,
    progress: Progress | None = None,
) -> dict:
    """Hit ratio at every capacity in ``Ns`` (sorted int64): exact simulated curves (one threshold pass each,
    reused from ``inputs`` when given) and — unless ``estimates=False`` — the estimators' curves, over the
    measured rows of ``window``. Keys: ``N``, one array per series (labels of :data:`POLICIES`, their
    ``... token ratio``, ``estimate: ...``), ``feasible`` (``N ≥ N_min``), ``N_min``, ``h_max`` and ``lam0``.
    ``progress(done, total, what)`` is called between steps."""
    cb = progress or _no_progress
    Ns = np.asarray(Ns, dtype=np.int64)
    inp = inputs or curve_inputs(tr, window, policies, progress=None)
    steps = len(policies) + (1 + len(policies) if estimates else 0)
    step = 0
    out: dict[str, Any] = {"N": Ns}
    feasible = Ns >= inp.N_min
    for p in policies:
        cb(step, steps, f"curve: {POLICIES[p]}")
        if p == "content":
            out[POLICIES[p]] = inp.content(Ns) / inp.content_demand
        else:
            bi = inp.blocks[p]
            hb = bi.hit(Ns)
            tok = np.full(Ns.shape, float(bi.prompt_tokens))
            blk = np.full(Ns.shape, float(bi.prompt_blocks))
            for k in _ambiguous(bi, Ns):  # capacities where the stack model is not certified: simulate
                res = simulate_block(
                    inp.requests.prompt_tokens,
                    inp.requests.hash_offsets,
                    inp.requests.hashes,
                    N=int(Ns[k]),
                    block_size=inp.requests.block_size,
                    engine=p,
                )
                mm = inp.mask & ~res.rejected
                hb[k] = float(res.hit_blocks[mm].sum())
                tok[k] = float(inp.requests.prompt_tokens[mm].sum())
                blk[k] = float((-(-inp.requests.prompt_tokens[mm] // inp.requests.block_size)).sum())
            with np.errstate(invalid="ignore", divide="ignore"):
                h_blk = np.where(feasible, hb / blk, np.nan)
                h_tok = np.where(feasible, hb * inp.requests.block_size / tok, np.nan)
            out[POLICIES[p]] = h_blk
            out[POLICIES[p] + " token ratio"] = h_tok
        step += 1
    conv = tr.conversations()
    measured = (conv["arrival"] >= window.start) & (conv["arrival"] <= window.end)
    mom = trace_moments(tr, conv["conv"][measured])
    del conv
    lam0 = float(tr.meta["lam0"]) if "lam0" in tr.meta else mom.lam0_hat
    h_max = mom.h_max_hash
    if estimates:
        F = empirical_F(mom)
        cb(step, steps, "estimate: paper eq. (39)")
        out["estimate: paper eq. (39), F̂"] = np.asarray(estimate(mom, Ns.astype(float), lam0, F).h)
        step += 1
    del mom  # the engine accountings below read the trace again: at 10⁷ turns this is ~0.2 GB of the peak
    if estimates:
        for p in policies:
            cb(step, steps, f"estimate: {_EST_LABEL[p]}")
            acc = engine_accounting(tr, engine=p, metric="blocks", mask=measured)
            h = np.full(Ns.shape, np.nan)
            ok = np.ones(Ns.shape, bool) if p == "content" else feasible
            if ok.any():
                h[ok] = np.asarray(estimate_engine(acc, Ns[ok], lam0, F).h)
            out[f"estimate: {_EST_LABEL[p]} (engine-aware)"] = h
            del acc  # one accounting (~10 per-row arrays) alive at a time: the next is built after this one is freed
            step += 1
    cb(steps, steps, "done")
    out["feasible"] = feasible
    out["N_min"] = inp.N_min
    out["h_max"] = h_max
    out["lam0"] = lam0
    return out
