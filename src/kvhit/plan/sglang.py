"""vLLM or SGLang for this workload at this KV budget? Both engines simulated on the same requests at the same
memory, with the difference and its confidence interval.

The budget of ``kv_bytes`` holds ``N = ⌊kv_bytes / (b · bytes per token)⌋`` vLLM blocks
(:func:`kvhit.plan.planner.capacity`) or ``C = ⌊kv_bytes / bytes per token⌋`` SGLang tokens rounded down to whole
pages — the same bytes per token (:mod:`kvhit.plan.hardware`; both engines store every layer's K and V per token).
Both are exact simulations of the same request stream: vLLM's block pool (:func:`kvhit.sim.vllm.block.simulate_block`)
in two modes — *colocated* (the response KV is kept, Remark B.1: what a vLLM server that also decodes does, and what
SGLang always does) and *prefill-only* (a PD-disaggregated prefiller, the paper's Fig. 1) — and SGLang's radix cache
(:func:`kvhit.sim.sglang.radix.simulate_radix`). The metric is the token hit ratio (cached prompt tokens / prompt
tokens) of the measured requests. The difference SGLang − vLLM (colocated) is paired: formed per batch of consecutive
requests (10 batch means), so the workload's own noise cancels; the 95% half-widths are Student-t over the batches.

Invariant: no ratio where a request cannot fit a pool (``None`` and the refused shares instead). NOT modelled:
in-flight holds (requests are instantaneous), what the two engine models do not model (their docstrings).
"""

from __future__ import annotations

import numpy as np

__all__ = ["compare_vllm_sglang"]


def _verdict(diff: float, half: float) -> str:
    if not np.isfinite(half):
        return "SGLang" if diff > 0 else "vLLM" if diff < 0 else "no difference"
    if diff - half > 0:
        return "SGLang"
    if diff + half < 0:
        return "vLLM"
    return "no significant difference (the 95% CI of the difference contains 0)"


def compare_vllm_sglang(
    source,
    N: int,
    C: int,
    *,
    mask=None,
    engine: str = "vllm",
    page_size: int = 1,
    evict_policy: str = "lru",
    block_size: int | None = None,
    cache: str = "unified",
    tlru_tail_budget: int = 0,
) -> dict:
    """Compare on a kvhit :class:`~kvhit.workload.Trace` or a
    :class:`~kvhit.workload.production_trace.ProductionTrace` (``source``) at ``N`` vLLM blocks vs ``C`` SGLang
    tokens; ``mask`` selects the measured requests (row order = arrival order). ``cache``, ``tlru_tail_budget``:
    SGLang's cache class and T-LRU budget (:func:`~kvhit.sim.sglang.radix.simulate_radix`)."""
    from kvhit.sim.sglang.radix import simulate_radix
    from kvhit.sim.sglang.run import batch_ci, paired_batch_ci, radix_feasibility
    from kvhit.sim.sglang.streams import streams_from_production, streams_from_trace
    from kvhit.sim.vllm.block import simulate_block
    from kvhit.workload.production_trace import ProductionTrace

    if isinstance(source, ProductionTrace):
        rq_pd = source.to_block_requests()
        rq_co = source.to_block_requests(colocated=True)
        ts = streams_from_production(source)
    else:
        from kvhit.sim.runner import block_requests

        rq_pd = block_requests(source, block_size=block_size)
        try:
            rq_co = block_requests(source, block_size=block_size, colocated=True)
        except ValueError:  # no response lengths: vLLM can only be compared as a prefiller
            rq_co = None
        ts = streams_from_trace(source, block_size=rq_pd.block_size)
    b = rq_pd.block_size
    n = ts.n_requests
    m = np.ones(n, bool) if mask is None else np.asarray(mask, bool)
    T = ts.prompt_tokens.astype(float)
    out: dict = {
        "engine": "sglang",
        "vllm_engine": engine,
        "vllm_blocks": int(N),
        "block_size": int(b),
        "sglang_tokens": int(C),
        "page_size": int(page_size),
        "evict_policy": evict_policy,
        "sglang_cache": cache,
        "metric": "tokens",
        "n_measured": int(m.sum()),
        "vllm_mode": "colocated (response KV kept, as SGLang)"
        if rq_co is not None
        else "prefill-only (the workload has no response lengths)",
    }
    hits: dict[str, np.ndarray] = {}
    modes = (
        [("vllm", rq_co, True), ("vllm_prefill_only", rq_pd, False)] if rq_co is not None else [("vllm", rq_pd, False)]
    )
    for key, rq, colo in modes:
        res = simulate_block(
            rq.prompt_tokens,
            rq.hash_offsets,
            rq.hashes,
            N=int(N),
            block_size=b,
            engine=engine,
            colocated=colo,
            response_tokens=rq.response_tokens,
        )
        if res.rejected[m].any():
            out[f"h_{key}"] = None
            out[f"{key}_refused_request_share"] = float(res.rejected[m].mean())
        else:
            hits[key] = res.hit_blocks.astype(float) * b
    feas = radix_feasibility(ts, [C], page_size, m)
    out.update(sglang_refused_request_share=float(feas.refused_requests[0]))
    if feas.feasible[0]:
        res = simulate_radix(
            ts, int(C), page_size=page_size, evict_policy=evict_policy, cache=cache, tlru_tail_budget=tlru_tail_budget
        )
        hits["sglang"] = res.hit_tokens.astype(float)
    else:
        out["h_sglang"] = None
    for key, hit in hits.items():
        h, half = batch_ci(hit, T, m)
        out[f"h_{key}"] = h
        out[f"h_{key}_ci95"] = half
    if "sglang" in hits and "vllm" in hits:
        d, half = paired_batch_ci(hits["sglang"], hits["vllm"], T, m)
        out.update(difference=d, difference_ci95=half, better=_verdict(d, half))
    else:
        out.update(difference=None, difference_ci95=None, better=None)
    if "sglang" in hits and "vllm_prefill_only" in hits:
        d, half = paired_batch_ci(hits["sglang"], hits["vllm_prefill_only"], T, m)
        out.update(difference_vs_prefill_only=d, difference_vs_prefill_only_ci95=half)
    return out
