"""``kvhit curve --sample-rate R``: the sampled (SHARDS) curves of :mod:`kvhit.sim.sampled` on a kvhit Parquet trace
read chunk by chunk (memory O(chunk + sample)) or on a production block-id trace.

The measurement window of a Parquet trace is :meth:`kvhit.workload.trace.Window.warmup_conversations`'s (events at
times in ``[arrival of the (n_warm+1)-th conversation, last conversation arrival]``), found by a first pass over
two columns (one arrival per conversation kept). Capacities: a log grid from ``n_min`` to the default range rule
of :func:`kvhit.experiments.curve.default_capacity_range` applied to the *sampled* thresholds.

Invariant: the same file, rate, salt and chunk-independent inputs give the same curves bit for bit (the sample is
a function of the ids and the salt; tested against the in-memory pass). NOT modelled: the estimators' curves
(they need the whole trace in memory), SGLang, request hit rates (see :mod:`kvhit.sim.sampled`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvhit.experiments.curve import POLICIES, SATURATION_MARGIN, SATURATION_QUANTILE
from kvhit.sim.sampled import SampledBlockCurve, SampledContentCurve, sampled_block_curve, sampled_stream_curve

__all__ = ["parquet_window", "sampled_curve_from_parquet", "sampled_production_curve", "sampled_label"]


def sampled_label(policy: str, rate: float) -> str:
    """Series label of a sampled curve: the exact curve's label plus the rate."""
    return f"{POLICIES[policy]}, sampled {100 * rate:g}%"


def parquet_window(path: str | Path, n_warm: int, chunk: int = 1 << 20) -> tuple[float, float]:
    """``(start, end)`` of ``Window.warmup_conversations(trace, n_warm)`` from a Parquet trace, reading only the
    ``turn`` and ``conv_arrival`` columns in chunks (one arrival per conversation kept)."""
    import pyarrow.parquet as pq

    from kvhit.workload.trace import TraceError

    pf = pq.ParquetFile(path)
    arr = []
    for batch in pf.iter_batches(batch_size=chunk, columns=["turn", "conv_arrival"]):
        t = batch.column("turn").to_numpy(zero_copy_only=False)
        a = batch.column("conv_arrival").to_numpy(zero_copy_only=False)
        arr.append(np.asarray(a[t == 1], np.float64))
    a = np.concatenate(arr) if arr else np.zeros(0)
    if n_warm < 0 or n_warm >= a.size:
        raise TraceError(f"warm-up of {n_warm} conversations leaves none of {a.size} to measure")
    start = float(np.partition(a, n_warm)[n_warm])
    return start, float(a.max())


def _quantile_capacity(thr: np.ndarray, w: np.ndarray | None, q: float) -> int | None:
    fin = thr[(thr >= 0) & (thr < np.iinfo(np.int64).max)]
    ww = None if w is None else w[(thr >= 0) & (thr < np.iinfo(np.int64).max)]
    if fin.size == 0:
        return None
    o = np.argsort(fin, kind="stable")
    c = np.cumsum(np.ones(fin.size) if ww is None else ww[o].astype(float))
    if c[-1] <= 0:
        return None
    k = int(np.searchsorted(c, q * c[-1] * (1 - 1e-12)))
    return int(fin[o][min(k, fin.size - 1)])


def default_n_max(blocks: dict[str, SampledBlockCurve], content: SampledContentCurve | None, n_min: int) -> int:
    """:func:`kvhit.experiments.curve.default_capacity_range`'s rule on the sampled thresholds."""
    sat = [_quantile_capacity(b.thresholds, None, SATURATION_QUANTILE) for b in blocks.values()]
    if content is not None:
        sat.append(_quantile_capacity(content.thresholds, content.weights, SATURATION_QUANTILE))
    n_req = max((b.N_min for b in blocks.values()), default=0)
    top = max(max((s for s in sat if s is not None), default=0), n_req, 1)
    return max(int(math.ceil(SATURATION_MARGIN * top)), 2 * int(n_min))


SE_BAND = 2.0  #: half-width of a sampled curve's band in standard errors (sample-size part; calibration §2)


def curves_from_sampled(
    Ns: np.ndarray,
    blocks: dict[str, SampledBlockCurve],
    content: SampledContentCurve | None,
    rate: float,
    estimator: str = "deblurred",
) -> dict:
    """Series over ``Ns`` (block-weighted h and vLLM's token ratio per engine, read with ``estimator`` of
    :mod:`kvhit.sim.sampled_estimate`, with ``band low: …``/``band high: …`` at ± :data:`SE_BAND` standard errors
    of the sample size; Algorithm 1's practical h)."""
    out: dict = {"N": Ns}
    if content is not None:
        exact = content.rate >= 1.0  # Algorithm 1's per-turn pass run whole (sampled_curve_from_parquet's default)
        out[POLICIES["content"] if exact else sampled_label("content", content.rate)] = content.curve(Ns)
    feasible = np.ones(Ns.shape, bool)
    n_min = 0
    for e, bc in blocks.items():
        c = bc.curve(Ns, estimator)
        out[sampled_label(e, rate)] = c["block_hit_ratio"]
        half = SE_BAND * bc.standard_error(Ns, estimator)  # stratified: jackknife; else the sample-size part
        out["band low: " + sampled_label(e, rate)] = c["block_hit_ratio"] - half
        out["band high: " + sampled_label(e, rate)] = c["block_hit_ratio"] + half
        out[sampled_label(e, rate) + " token ratio"] = c["token_hit_ratio"]
        feasible &= c["feasible"]
        n_min = max(n_min, bc.N_min)
    out["feasible"] = feasible if blocks else None
    out["N_min"] = n_min
    if blocks:
        b0 = next(iter(blocks.values()))
        fin = int((b0.thresholds < np.iinfo(np.int64).max).sum())
        out["h_max"] = (
            fin * b0.lookup_blocks / b0.sampled_lookups / b0.prompt_blocks
            if b0.sampled_lookups and b0.prompt_blocks
            else float("nan")
        )
    else:
        out["h_max"] = float("nan")
    return out


def sampled_curve_from_parquet(
    path: str | Path,
    *,
    rate: float,
    salt: int = 0,
    policies=("content", "vllm", "vllm-0.23"),
    block_size: int = 128,
    n_warm: int = 0,
    Ns: np.ndarray | None = None,
    n_min: int = 64,
    n_max: int | None = None,
    points: int = 1000,
    chunk: int = 1 << 20,
    progress: Callable[[int], None] | None = None,
    estimator: str = "deblurred",
    content_rate: float | None = 1.0,
) -> dict:
    """Sampled curves of a kvhit Parquet trace streamed by row groups; keys as :func:`curves_from_sampled` plus
    ``events``, ``sample`` (kept accesses / lookups per engine, kept events of Algorithm 1). Algorithm 1 runs its
    exact per-turn pass by default (``content_rate = 1``: 17 bytes a turn, no block; its conversation sample misses
    by 0.09 at 1 %, docs/sampling.md §3); ``content_rate=None`` samples it at ``rate``."""
    from kvhit.workload.chunks import parquet_chunks

    window = parquet_window(path, n_warm) if n_warm else None
    engines = tuple(p for p in policies if p != "content")
    res = sampled_stream_curve(
        parquet_chunks(path, chunk),
        rate=rate,
        salt=salt,
        block_size=block_size,
        engines=engines,
        content="content" in policies,
        content_rate=content_rate,
        window=window,
        progress=progress,
    )
    if Ns is None:
        hi = n_max or default_n_max(res["blocks"], res["content"], n_min)
        Ns = np.unique(np.geomspace(n_min, hi, points).astype(np.int64))
    out = curves_from_sampled(np.asarray(Ns, np.int64), res["blocks"], res["content"], rate, estimator)
    out["events"] = res["events"]
    out["sample"] = {
        **{
            e: {"kept_accesses": b.sampled_accesses, "kept_lookups": b.sampled_lookups, "lookups": b.lookup_blocks}
            for e, b in res["blocks"].items()
        },
        **(
            {"content": {"kept_events": res["content"].sampled_events, "events": res["events"]}}
            if res["content"] is not None
            else {}
        ),
    }
    return out


def sampled_production_curve(
    pt, *, rate: float, salt: int = 0, engines=("vllm", "vllm-0.23"), mask=None, gaps: bool = False, jackknife: int = 20
) -> dict:
    """Per engine the :class:`~kvhit.sim.sampled.SampledBlockCurve` of a production block-id trace (in memory);
    ``gaps``: with the exact reuse gaps of the ``stratified`` reading (:mod:`kvhit.sim.sampled_strata`)."""
    rq = pt.to_block_requests()
    return {
        e: sampled_block_curve(
            rq.prompt_tokens,
            rq.hash_offsets,
            rq.hashes,
            block_size=rq.block_size,
            rate=rate,
            salt=salt,
            engine=e,
            mask=mask,
            gaps=gaps,
            jackknife=jackknife,
        )
        for e in engines
    }
