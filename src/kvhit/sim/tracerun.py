"""The vLLM block pool on a production block-id trace as read: hit ratios at given capacities and exact curves,
with the infeasible capacities marked.

A :class:`~kvhit.workload.production_trace.ProductionTrace` replayed through :func:`kvhit.sim.vllm.block.simulate_block`
(few capacities) or :func:`kvhit.sim.vllm.curve.block_curve` (all capacities in one pass), both free-queue orders.
Metrics are vLLM's token hit ratio (``prefix_cache_hits / prefix_cache_queries``) and the paper's block-weighted
``h`` (eq. (6)/(31)) over the measured requests (arrival ≥ first arrival + ``warmup_time``).

Invariant: a capacity ``N < N_min = max_j ⌈T_j/b⌉`` is *infeasible* (:mod:`kvhit.sim.feasibility`): it is not
simulated and gets no hit ratio (``None`` in rows, NaN in curve arrays) but the shares of measured requests and
prompt tokens it would refuse. So no ratio over the admitted requests only is ever reported.

NOT modelled: in-flight holds (requests are instantaneous), colocated response KV (the traces' responses carry
no block ids), and a trace's own arrival process beyond what was read (see :mod:`kvhit.sim.resample` for a new load).
"""

from __future__ import annotations

import numpy as np

from kvhit.sim.feasibility import Feasibility, feasibility
from kvhit.workload.production_trace import ProductionTrace

__all__ = ["ENGINE_LABELS", "measured_mask", "production_curve", "production_rows"]

ENGINE_LABELS = {"vllm": "vLLM ≥ 0.24", "vllm-0.23": "vLLM ≤ 0.23"}


def measured_mask(pt: ProductionTrace, warmup_time: float | None) -> np.ndarray:
    """Requests arriving at or after ``first arrival + warmup_time`` (all requests without a warm-up)."""
    n = pt.n_requests
    if warmup_time is None or n == 0:
        return np.ones(n, bool)
    return pt.time >= pt.time[0] + float(warmup_time)


def production_rows(
    pt: ProductionTrace, Ns, engines=("vllm", "vllm-0.23"), *, warmup_time: float | None = None
) -> tuple[list[dict], Feasibility]:
    """One row per (engine, N): ``feasible``, refused shares and, where feasible, ``token_hit_ratio``,
    ``h_blocks``, ``request_hit_rate``, ``evictions`` (``None`` where infeasible)."""
    from kvhit.sim.vllm import block as blk

    rq = pt.to_block_requests()
    mask = measured_mask(pt, warmup_time)
    Ns = [int(n) for n in Ns]
    feas = feasibility(rq.prompt_tokens, rq.block_size, Ns, mask=mask)
    rows = []
    for e in engines:
        for k, N in enumerate(Ns):
            row = {"N": N, "engine": e, **feas.row(k)}
            if feas.feasible[k]:
                res = blk.simulate_block(
                    rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=N, block_size=rq.block_size, engine=e
                )
                row.update(
                    token_hit_ratio=blk.token_hit_ratio(res, mask),
                    h_blocks=blk.block_hit_ratio(res, mask),
                    request_hit_rate=blk.request_hit_rate(res, mask),
                    evictions=int(res.evictions),
                )
            else:
                row.update(token_hit_ratio=None, h_blocks=None, request_hit_rate=None, evictions=None)
            rows.append(row)
    return rows, feas


def production_curve(
    pt: ProductionTrace, Ns, engines=("vllm", "vllm-0.23"), *, warmup_time: float | None = None
) -> dict:
    """Exact curves at every capacity in ``Ns`` (1-d int array): per engine ``token_hit_ratio`` and
    ``block_hit_ratio`` arrays (NaN where infeasible), the :class:`Feasibility` (``feasibility``), ``N_min`` and
    the infinite-cache ceilings ``h_max`` (token) / ``h_max_blocks``. Only feasible capacities are simulated
    (one :func:`~kvhit.sim.vllm.curve.block_curve` pass per engine)."""
    from kvhit.sim.vllm.curve import block_curve

    rq = pt.to_block_requests()
    mask = measured_mask(pt, warmup_time)
    Ns = np.asarray(Ns, dtype=np.int64)
    feas = feasibility(rq.prompt_tokens, rq.block_size, Ns, mask=mask)
    ok = feas.feasible
    out: dict = {"N": Ns, "engines": {}, "feasibility": feas, "N_min": feas.N_min}
    for e in engines:
        tok = np.full(Ns.shape, np.nan)
        bl = np.full(Ns.shape, np.nan)
        if ok.any():
            c = block_curve(
                rq.prompt_tokens,
                rq.hash_offsets,
                rq.hashes,
                block_size=rq.block_size,
                Ns=Ns[ok],
                engine=e,
                mask=mask,
            )
            tok[ok] = c["token_hit_ratio"]
            bl[ok] = c["block_hit_ratio"]
        out["engines"][e] = {"token_hit_ratio": tok, "block_hit_ratio": bl}
    T, b = rq.prompt_tokens, rq.block_size
    hit = np.minimum(pt.leading_reused(), np.maximum((T - 1) // b, 0))[mask]  # infinite cache (describe())
    out["h_max"] = float(hit.sum() * b / T[mask].sum()) if mask.any() else float("nan")
    out["h_max_blocks"] = float(hit.sum() / (-(-T[mask] // b)).sum()) if mask.any() else float("nan")
    return out
