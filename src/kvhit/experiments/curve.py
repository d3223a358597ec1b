"""Hit ratio at every capacity of a trace: exact simulated curves beside the estimators' curves.

:func:`curve_data` computes, over the measured rows of a trace, the exact all-capacity curves of Algorithm 1
(whole-content LRU, practical weight eq. (31), from stack distances: :mod:`kvhit.sim.stackdist`) and of the
vLLM block pool (both free-queue orders, block-weighted h of eq. (6), :mod:`kvhit.sim.blockcurve`), and the
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

from ..estimate import empirical_F, engine_accounting, estimate, estimate_engine, trace_moments
from ..sim.blockcurve import BlockThresholds, block_curve, block_hit_thresholds
from ..sim.runner import block_requests
from ..sim.stackdist import FIRST_TURN, content_curve_from_thresholds, content_hit_thresholds
from ..workload.trace import Trace, Window

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


@dataclass
class CurveInputs:
    """The one-pass hit thresholds of every simulated policy over a trace's measured rows (the expensive part
    of a curve; capacities are then cheap)."""

    trace: Trace
    window: Window
    mask: np.ndarray
    content: tuple[np.ndarray, np.ndarray] | None  # (thresholds, practical weights on measured rows)
    blocks: dict[str, BlockThresholds]
    requests: Any
    N_min: int  # largest request ⌈T_j/b⌉ (vLLM refuses any request above N); 0 without a vLLM policy


def curve_inputs(
    tr: Trace, window: Window, policies=("content", "vllm", "vllm-0.23"), progress: Progress | None = None
) -> CurveInputs:
    """Hit thresholds of every policy in ``policies`` (one pass each)."""
    cb = progress or _no_progress
    bad = set(policies) - set(POLICIES)
    if bad:
        raise ValueError(f"policies: unknown {sorted(bad)} ({', '.join(POLICIES)})")
    mask = window.mask(tr)
    total = len(policies)
    content = None
    blocks: dict[str, BlockThresholds] = {}
    rq = None
    for i, p in enumerate(policies):
        cb(i, total, f"hit thresholds: {POLICIES[p]}")
        if p == "content":
            thr = content_hit_thresholds(tr.dense_conv(), tr["R"])
            content = (thr, np.where(mask, np.maximum(tr.R_prev() - 1, 0), 0))
        else:
            if rq is None:
                rq = block_requests(tr)
            blocks[p] = block_hit_thresholds(
                rq.prompt_tokens, rq.hash_offsets, rq.hashes, block_size=rq.block_size, engine=p
            )
    cb(total, total, "hit thresholds")
    n_min = max((bt.min_exact_N for bt in blocks.values()), default=0)
    return CurveInputs(tr, window, mask, content, blocks, rq, n_min)


def _weighted_quantile_capacity(thr: np.ndarray, w: np.ndarray, q: float, never: int) -> int | None:
    """Smallest N with Σ w·1{thr ≤ N} ≥ q·Σ_{thr finite} w (None when nothing ever hits)."""
    fin = (thr < never) & (w > 0)
    if not fin.any():
        return None
    t, ww = thr[fin], w[fin].astype(float)
    order = np.argsort(t, kind="stable")
    cw = np.cumsum(ww[order])
    k = int(np.searchsorted(cw, q * cw[-1] * (1 - 1e-12), side="left"))
    return int(t[order][min(k, t.size - 1)])


def saturation_capacity(inp: CurveInputs, q: float = SATURATION_QUANTILE) -> dict[str, int]:
    """Per simulated policy, the smallest capacity at which its exact curve reaches ``q`` of its
    infinite-capacity value (the ``q``-quantile of the hit thresholds weighted by the hit weight)."""
    out: dict[str, int] = {}
    if inp.content is not None:
        thr, w = inp.content
        n = _weighted_quantile_capacity(thr, w, q, FIRST_TURN)
        if n is not None:
            out["content"] = n
    for p, bt in inp.blocks.items():
        mh = np.diff(bt.offsets)
        w = np.repeat(inp.mask.astype(np.int64), mh)
        n = _weighted_quantile_capacity(bt.thresholds, w, q, np.iinfo(np.int64).max)
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
            thr, w = inp.content
            out[POLICIES[p]] = content_curve_from_thresholds(thr, w, Ns) / tr["R"][inp.mask].sum()
        else:
            rq = inp.requests
            c = block_curve(
                rq.prompt_tokens,
                rq.hash_offsets,
                rq.hashes,
                block_size=rq.block_size,
                Ns=Ns,
                engine=p,
                mask=inp.mask,
                fallback="infeasible",
                thresholds=inp.blocks[p],
            )
            out[POLICIES[p]] = c["block_hit_ratio"]
            out[POLICIES[p] + " token ratio"] = c["token_hit_ratio"]
        step += 1
    conv = tr.conversations()
    measured = (conv["arrival"] >= window.start) & (conv["arrival"] <= window.end)
    mom = trace_moments(tr, conv["conv"][measured])
    lam0 = float(tr.meta["lam0"]) if "lam0" in tr.meta else mom.lam0_hat
    if estimates:
        F = empirical_F(mom)
        cb(step, steps, "estimate: paper eq. (39)")
        out["estimate: paper eq. (39), F̂"] = np.asarray(estimate(mom, Ns.astype(float), lam0, F).h)
        step += 1
        for p in policies:
            cb(step, steps, f"estimate: {_EST_LABEL[p]}")
            acc = engine_accounting(tr, engine=p, metric="blocks", mask=measured)
            h = np.full(Ns.shape, np.nan)
            ok = np.ones(Ns.shape, bool) if p == "content" else feasible
            if ok.any():
                h[ok] = np.asarray(estimate_engine(acc, Ns[ok], lam0, F).h)
            out[f"estimate: {_EST_LABEL[p]} (engine-aware)"] = h
            step += 1
    cb(steps, steps, "done")
    out["feasible"] = feasible
    out["N_min"] = inp.N_min
    out["h_max"] = mom.h_max_hash
    out["lam0"] = lam0
    return out
