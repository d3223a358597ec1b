"""``tiers``: the total hit ratio h(HBM, DRAM) of a trace behind a host-memory tier (issue 16), over a grid.

Invariant: numbers are :func:`kvhit.sim.tiers.surface.hit_surface`'s (sequential replay of the trace through the
vLLM GPU model and the chosen tier model: vLLM 0.33.0 native offloading, SimpleCPUOffloadConnector eager or lazy,
or LMCache 0.5.6); DRAM sizes are converted to tier units as each engine does (:mod:`kvhit.sim.tiers.sizing`).
With ``--estimate also`` the two-tier estimator (:func:`kvhit.estimate.tiers.estimate_tiers`: the engine-aware
single-tier estimator per tier, combined block by block) is reported beside the simulated h (``h_estimate``);
with ``--estimate only`` nothing is simulated and ``h`` is the estimate (``h_source: "estimate"``): a fast surface.
With ``--measure window`` (``--trace``) h counts the requests after the trace's warm-up only (every request still
fills both tiers), and a kvhit trace's answer carries its ``stationarity`` report (service/steady.py); with the
default ``--measure all`` every request counts from an empty cache, which is not a steady-state window.
With ``--replays K`` (``--blocks-trace``) the surface is also replayed exactly at K redrawn sets of the
conversations' start times (:func:`kvhit.estimate.replay_band.tiers_band`, seed 0): ``h_mc`` (their mean, the
expected value), ``h_mc_se`` and the band ``h_lo`` / ``h_hi`` for one realisation; ``validated`` false.
NOT modelled: what the tier models do not model (their docstrings), timing (``hold``); the estimator's own
omissions are in :mod:`kvhit.estimate.tiers`; a warm-up window for ``--tier hicache``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from kvhit.service.base import Request, Response
from kvhit.service.errors import InputError, translating
from kvhit.service.io import check_output_file

__all__ = ["TiersRequest", "TiersResponse", "tiers"]

Tier = Literal["native", "lmcache", "simple", "simple-lazy", "hicache"]


class TiersRequest(Request):
    """The inputs of ``kvhit tiers``, validated: each field's description states its unit, range and default."""

    trace: Path | None = Field(None, description="kvhit trace (Parquet) to replay; or --blocks-trace; default: none.")
    sharegpt: bool = Field(
        False, description="Workload: the bundled ShareGPT trace of `kvhit trace sharegpt` (defaults), built once."
    )
    blocks_trace: Path | None = Field(
        None, description="Production block-id trace (Mooncake JSONL, WEKA dir/.json); or --trace; default: none."
    )
    tier: Tier = Field(
        "native",
        description="Host tier: native (vLLM OffloadingConnector) | simple (SimpleCPUOffload eager) | simple-lazy "
        "(lazy_offload: write-back) | lmcache | hicache (SGLang HiCache, device pool = HBM blocks × block size "
        "tokens).",
    )
    hbm_blocks: Annotated[list[Annotated[int, Field(ge=1, le=2**31)]], Field(min_length=1, max_length=64)] = Field(
        description="GPU capacities N in blocks; 1–64 values in [1, 2^31]; required."
    )
    dram_gb: list[Annotated[float, Field(ge=0, le=2**20)]] | None = Field(
        None,
        max_length=64,
        description="DRAM sizes in GiB over all TP ranks, each in [0, 2^20] (needs --model); or --host-units; "
        "default: none.",
    )
    host_units: list[Annotated[int, Field(ge=0, le=2**31)]] | None = Field(
        None,
        max_length=64,
        description="Host capacities in tier units (chunks; CPU blocks for simple; vLLM's num_cpu_blocks, one of them "
        "the null block, for simple-lazy), integers in [0, 2^31]; or --dram-gb; default: none.",
    )
    hicache_ratio: list[Annotated[float, Field(gt=0, le=1000)]] | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="hicache: host pool = ratio × device pool (SGLang --hicache-ratio), each in (0, 1000]; "
        "or --dram-gb / --host-units; default: none.",
    )
    write_policy: Literal["write_through", "write_through_selective", "write_back"] = Field(
        "write_through",
        description="hicache: --hicache-write-policy write_through | write_through_selective | write_back.",
    )
    page_size: int = Field(1, ge=1, le=4096, description="hicache: SGLang --page-size (tokens), 1–4096.")
    model: str = Field("qwen3-8b", description="Model preset or config.json (KV bytes, for --dram-gb).")
    dtype: str = Field("bf16", description="KV cache dtype: bf16 | fp16 | fp8 | fp32.")
    tp: int = Field(1, ge=1, le=4096, description="Tensor-parallel degree; 1–4096.")
    block_size: int | None = Field(
        None, ge=1, le=2**16, description="Tokens per block; 1–65,536; default: the trace's."
    )
    policy: Literal["lru", "arc"] = Field("lru", description="native: CPU eviction policy lru | arc.")
    blocks_per_chunk: int = Field(1, ge=1, le=4096, description="native: GPU blocks per CPU chunk; 1–4096.")
    store_threshold: int = Field(
        0, ge=0, le=1000, description="native: offers before a chunk is stored, 0–1000 (0/1: off)."
    )
    chunk_tokens: int = Field(
        256, ge=1, le=2**20, description="lmcache: tokens per chunk, 1–2^20, a multiple of the block size."
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        le=2**24,
        description="simple-lazy: vLLM --max-num-batched-tokens (the lazy walk covers 2·⌈it / block size⌉ free "
        "blocks per step), 1–2^24; default 8192.",
    )
    prefill_tokens_per_s: float | None = Field(
        None, gt=0, le=1e12, description="Prefill speed (tokens/s, > 0) for the TTFT saved vs recompute; default: none."
    )
    pcie_gb_per_s: float = Field(
        25.0, gt=0, le=1e6, description="Host-to-GPU bandwidth per GPU, GB/s (10^9 B/s), > 0; default 25 (PCIe 4 x16)."
    )
    target: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Target total hit ratio: DRAM needed per HBM size (grid); in (0, 1]; default: none.",
    )
    price_hbm_per_gib: float | None = Field(
        None,
        ge=0,
        le=1e9,
        description="Price of 1 GiB of HBM (any currency), ≥ 0, for the cheapest split; default: none.",
    )
    price_dram_per_gib: float | None = Field(
        None,
        ge=0,
        le=1e9,
        description="Price of 1 GiB of DRAM (same currency), ≥ 0, for the cheapest split; default: none.",
    )
    workers: int = Field(1, ge=1, le=64, description="Processes for the per-pair simulations; 1–64.")
    estimate: Literal["none", "also", "only"] = Field(
        "none",
        description="Two-tier estimator (native LRU without --store-threshold, simple, lmcache): none | also "
        "(h_estimate beside the simulated h) | only (no simulation: h is the estimate, fast); default none.",
    )
    replays: int | None = Field(
        None,
        ge=2,
        le=1000,
        description="--blocks-trace: K exact replays of the surface at start times redrawn from the trace's start "
        "histogram: h_mc (their mean, the expected value), h_mc_se and h_lo/h_hi (the 90 % band of one "
        "realisation); K surfaces: slow; 2–1,000; default none.",
    )
    plot: Path | None = Field(
        None, description="Write a heatmap with iso-hit contours to PLOT.png/.svg; default: none."
    )
    measure: Literal["all", "window"] = Field(
        "all",
        description="Requests counted in h: all (every request from an empty cache) | window (--trace: after the "
        "trace's warm-up conversations, its n_warm; every request still fills the caches); default all.",
    )
    warmup: int | None = Field(
        None,
        ge=0,
        description="Warm-up conversations (--trace) left out of h: implies --measure window with this warm-up "
        "instead of the trace's n_warm; ≥ 0; default: none.",
    )

    FLAGS = {
        "blocks_trace": "--blocks-trace",
        "hbm_blocks": "--hbm-blocks",
        "dram_gb": "--dram-gb",
        "hicache_ratio": "--hicache-ratio",
        "write_policy": "--hicache-write-policy",
        "max_num_batched_tokens": "--max-num-batched-tokens",
        "replays": "--replays",
    }


class TiersResponse(Response):
    """The answer of ``kvhit tiers`` (``--json`` prints it; strict JSON, ``null`` where a number is undefined)."""

    tier: str = Field(description="Tier model (with its engine version).")
    requests: int = Field(description="Requests replayed.")
    block_size: int = Field(description="Tokens per block.")
    hbm_blocks: list[int] = Field(description="GPU capacities (blocks), rows of h.")
    host_units: list[int] = Field(
        description="Host capacities (tier units; hicache: tokens), columns of h (empty for --hicache-ratio columns: "
        "see host_tokens)."
    )
    hicache_ratio: list[float] | None = Field(None, description="hicache: the --hicache-ratio of each column.")
    host_tokens: list[list[int]] | None = Field(
        None, description="hicache: host pool tokens per (HBM, column), as SGLang sizes it (a padding page more)."
    )
    h_device: list[list[float | None]] | None = Field(
        None, description="hicache: the device part of h (Σ device-prefix hits / Σ prompt tokens) per pair."
    )
    ratio_for_target: list[float | None] | None = Field(
        None, description="hicache: per HBM size, the smallest grid --hicache-ratio with h ≥ target (null: none)."
    )
    dram_gib: list[float] | None = Field(None, description="DRAM sizes (GiB) the columns come from.")
    h: list[list[float | None]] = Field(description="Total token hit ratio (GPU + host) per (HBM, DRAM).")
    h_source: str = Field("simulated", description="Where h comes from: simulated | estimate (--estimate only).")
    h_estimate: list[list[float | None]] | None = Field(
        None, description="The two-tier estimator's h per (HBM, DRAM) (with --estimate also/only)."
    )
    h_gpu_estimate: list[float | None] | None = Field(
        None, description="The single-tier estimator's GPU-only h per HBM (with --estimate also/only)."
    )
    h_gpu: list[float | None] = Field(
        description="Token hit ratio of the GPU alone per HBM (hicache: SGLang without HiCache)."
    )
    h_mc: list[list[float | None]] | None = Field(
        None, description="--replays: mean of the K exact replays at redrawn start times (the expected value)."
    )
    h_mc_se: list[list[float | None]] | None = Field(None, description="--replays: Monte Carlo standard error of h_mc.")
    h_lo: list[list[float | None]] | None = Field(
        None, description="--replays: lower end of the band for one realisation of the start times."
    )
    h_hi: list[list[float | None]] | None = Field(None, description="--replays: upper end of that band.")
    level: float | None = Field(None, description="--replays: level of the h_lo–h_hi band.")
    band: dict | None = Field(None, description="--replays: how the band was made (replays, seed, method).")
    validated: bool | None = Field(None, description="--replays: whether a benchmark showed the band's targets.")
    ttft_saved_s: list[list[float | None]] | None = Field(
        None,
        description="Mean TTFT saved per request vs recomputing the host hits (s): Σ c_r·(1/prefill − "
        "bytes_per_token_rank/bandwidth) / admitted requests (with --prefill-tokens-per-s).",
    )
    dram_for_target: list[float | None] | None = Field(
        None, description="Per HBM size: the smallest grid DRAM (GiB, or units) with h ≥ target (null: none)."
    )
    hbm_gib: list[float] | None = Field(None, description="HBM of each row, GiB over all ranks (with --model).")
    cheapest: dict | None = Field(
        None, description="Cheapest grid pair reaching the target: hbm_blocks, hbm_gib, dram_gib, cost, h (or null)."
    )
    figure: list[str] | None = Field(None, description="Figure files written.")
    measure: str = Field("all", description="Requests counted in h: all | window (after the trace's warm-up).")
    stationarity: dict | None = Field(
        None,
        description="--trace: whether the measured requests are a steady-state window (service/steady.py); an h "
        "whose window is not stationary is not an answer for that load. Null for a block-id trace.",
    )
    notes: list[str] = Field(default_factory=list, description="Caveats of this answer.")


def _window(req: TiersRequest, src, n: int):
    """The measured-request mask (None: all), its stationarity report and the notes (``--measure``)."""
    from kvhit.service.inputs import window_for
    from kvhit.service.steady import steady_note, steady_report

    if req.blocks_trace is not None:
        if req.measure == "window":
            raise InputError("--measure window: a block-id trace has no warm-up (it is measured from an empty cache)")
        return None, None, []
    if req.measure == "window":
        where = "ShareGPT" if req.sharegpt else str(req.trace)
        mask = np.asarray(window_for(src, req.warmup, None, where).mask(src), bool)
    else:
        mask = np.ones(n, bool)
    rep = steady_report(src, mask)
    notes = steady_note(rep)
    if req.measure == "all":
        notes.append("--measure all: every request is counted from an empty cache (the warm-up included)")
    return (None if req.measure == "all" else mask), rep, notes


def _load(req: TiersRequest):
    from kvhit.service.inputs import load_production_file
    from kvhit.sim.runner import block_requests

    if (req.trace is not None) + (req.blocks_trace is not None) + req.sharegpt != 1:
        raise InputError(f"--trace{', --sharegpt' if req.sharegpt else ''} and --blocks-trace: give exactly one")
    if req.trace is not None or req.sharegpt:
        from kvhit.service.inputs import load_trace_file
        from kvhit.service.traces import bundled_sharegpt

        with translating("ShareGPT" if req.sharegpt else "--trace"):
            tr = bundled_sharegpt(req.block_size) if req.sharegpt else load_trace_file(req.trace)
            if tr.block_size is None and req.block_size is not None:  # a trace without one: the flag names it
                import dataclasses

                tr = dataclasses.replace(tr, meta={**tr.meta, "block_size": int(req.block_size)})
            if req.estimate != "none":
                # the estimator sees the trace as its block counts (no token-level sharing): so does the simulator
                if req.block_size is not None and req.block_size != tr.block_size:
                    raise InputError(
                        f"--block-size: --estimate uses the trace's block size {tr.block_size}, got {req.block_size}"
                    )
                return block_requests(tr, source="counts"), tr
            return block_requests(tr, block_size=req.block_size), tr
    with translating("--blocks-trace"):
        pt = load_production_file(req.blocks_trace)
    if req.block_size is not None and req.block_size != pt.block_size:
        raise InputError(f"--block-size: the blocks trace has block size {pt.block_size}, got {req.block_size}")
    return pt.to_block_requests(), pt


def tiers(req: TiersRequest) -> TiersResponse:
    """``kvhit tiers``: cross-field checks and output paths first, then the library; refused input raises
    :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    from kvhit.sim.tiers.sizing import host_units

    if req.tier == "hicache" and req.replays is not None:
        raise InputError("--replays: covers native, lmcache, simple and simple-lazy, not hicache")
    if req.replays is not None and req.blocks_trace is None:
        raise InputError("--replays: applies to --blocks-trace (it redraws the conversations' start times)")
    if req.tier == "hicache":
        return _hicache(req)
    if req.hicache_ratio is not None:
        raise InputError("--hicache-ratio: applies to --tier hicache only")
    if req.estimate != "none" and req.tier == "native" and (req.policy != "lru" or req.store_threshold >= 2):
        flag = "--policy" if req.policy != "lru" else "--store-threshold"
        raise InputError(f"{flag}: --estimate models the native tier with LRU and no store threshold")
    if req.write_policy != "write_through" or req.page_size != 1:
        flag = "--hicache-write-policy" if req.write_policy != "write_through" else "--page-size"
        raise InputError(f"{flag}: applies to --tier hicache only")
    if (req.dram_gb is None) == (req.host_units is None):
        raise InputError("--dram-gb and --host-units: give exactly one")
    if req.max_num_batched_tokens is not None and req.tier != "simple-lazy":
        raise InputError("--max-num-batched-tokens: applies to --tier simple-lazy only")
    priced = (req.price_hbm_per_gib is not None, req.price_dram_per_gib is not None)
    if any(priced) and not all(priced):
        raise InputError("--price-hbm-per-gib and --price-dram-per-gib: give both or neither")
    if all(priced) and (req.target is None or req.dram_gb is None):
        raise InputError("--price-hbm-per-gib: the cheapest split needs --target and --dram-gb")
    if req.plot is not None:
        check_output_file(str(req.plot) + ".png", "--plot")
    if req.warmup is not None and req.blocks_trace is not None:
        raise InputError("--warmup: a block-id trace has no warm-up window (it is measured from an empty cache)")
    if req.warmup is not None and req.measure == "all":
        req = req.model_copy(update={"measure": "window"})  # a warm-up is a measured window
    br, src = _load(req)
    measured, steady, notes = _window(req, src, len(br.prompt_tokens))
    b = int(br.block_size)
    kw: dict = {}
    if req.tier == "native":
        kw = {"policy": req.policy, "blocks_per_chunk": req.blocks_per_chunk, "store_threshold": req.store_threshold}
    elif req.tier == "lmcache":
        if req.chunk_tokens % b:
            raise InputError(f"--chunk-tokens: expected a multiple of the block size {b}, got {req.chunk_tokens}")
        kw = {"chunk_tokens": req.chunk_tokens}
    elif req.tier == "simple-lazy":
        kw = {"max_num_batched_tokens": req.max_num_batched_tokens or 8192}
    bpb = bpt = None
    if req.dram_gb is not None or req.prefill_tokens_per_s is not None or all(priced):
        from kvhit.plan import model_config

        with translating("--model"):
            m = model_config.resolve_model(req.model)
        with translating("--tp"):
            bpb = m.bytes_per_block(b, req.dtype, req.tp)
            bpt = m.bytes_per_token(req.dtype, req.tp)
    if req.dram_gb is not None:
        units = [
            host_units(
                req.tier,
                int(g * 2**30),
                bytes_per_block_rank=bpb,
                block_size=b,
                tp=req.tp,
                blocks_per_chunk=req.blocks_per_chunk,
                chunk_tokens=req.chunk_tokens,
            )
            for g in req.dram_gb
        ]
        if req.tier == "simple-lazy":
            units = [max(1, u) for u in units]  # _derive_cpu_config: max(1, local capacity)
    else:
        units = list(req.host_units)
    if req.tier in ("simple", "simple-lazy") and min(units) < 1:
        raise InputError(f"--dram-gb/--host-units: the {req.tier} tier needs at least one CPU block")
    est = None
    if req.estimate != "none" and req.tier == "simple-lazy":
        raise InputError("--estimate: no estimator models --tier simple-lazy (write-back); simulate it")
    if req.estimate != "none":
        from kvhit.estimate.tiers import estimate_tiers

        # simple eager: the store-time recency model (docs/estimators.md §5.2) was designed and measured on chat
        # traces; on block-id (agentic) traces it was slower (> 300 s for 1,000 pairs on the WEKA pool) and further
        # off at the one held-out WEKA point measured (0.077 against 0.047), so those keep the one-D estimator
        simple_model = "onedim" if req.blocks_trace is not None else "recency"
        with translating("--estimate"):
            est = estimate_tiers(
                src,
                req.hbm_blocks,
                units,
                tier=req.tier,
                blocks_per_chunk=req.blocks_per_chunk,
                chunk_tokens=req.chunk_tokens,
                measured=measured,
                simple_model=simple_model,
            )
        if req.tier == "simple":
            notes = notes + [
                "estimate (simple eager): "
                + (
                    "the one-displacement estimator on a block-id trace (the store-time recency model is for chat "
                    "traces: slower here and not more accurate on the held-out WEKA pool, docs/estimators.md §5.2)"
                    if simple_model == "onedim"
                    else "the store-time recency model (docs/estimators.md §5.2; ≤ 0.0085 on held-out ShareGPT)"
                )
            ]
    rb = None
    if req.replays is not None:
        from kvhit.estimate.replay_band import tiers_band

        with translating("--replays"):
            rb = tiers_band(
                src, req.hbm_blocks, units, tier=req.tier, replays=req.replays, seed=0, workers=req.workers, **kw
            )
        notes = notes + rb["notes"]
    if req.estimate == "only":
        s = _estimated_surface(est, br, measured)
    else:
        s = _simulate(req, br, b, units, kw, measured)
    figure = None
    if req.plot is not None:
        from kvhit.plots.tiers import plot_surface

        x = np.asarray(req.dram_gb, float) if req.dram_gb is not None else s.host.astype(float)
        xlabel = "DRAM for the KV tier (GiB, all ranks)" if req.dram_gb is not None else "host capacity (tier units)"
        figure = [str(p) for p in plot_surface(s, req.plot, x=x, xlabel=xlabel)]
    xs = np.asarray(req.dram_gb if req.dram_gb is not None else s.host, float)
    ttft, need, hbm_gib, cheapest = _plan_answers(req, s, xs, bpt, bpb, priced)
    name = {
        "native": "vLLM 0.33.0 native",
        "simple": "vLLM 0.33.0 SimpleCPUOffload",
        "simple-lazy": "vLLM 0.33.0 SimpleCPUOffload lazy_offload",
        "lmcache": "LMCache 0.5.6",
    }
    return TiersResponse(
        tier=f"{req.tier} ({name[req.tier]})",
        requests=int(len(br.prompt_tokens)),
        block_size=b,
        hbm_blocks=[int(x) for x in s.gpu_blocks],
        host_units=[int(x) for x in s.host],
        dram_gib=list(req.dram_gb) if req.dram_gb is not None else None,
        h=[[None if np.isnan(v) else float(v) for v in row] for row in s.hit],
        h_gpu=[None if np.isnan(v) else float(v) for v in s.gpu_hit],
        h_source="estimate" if req.estimate == "only" else "simulated",
        h_estimate=None if est is None else [[None if np.isnan(v) else float(v) for v in row] for row in est.hit],
        h_gpu_estimate=None if est is None else [None if np.isnan(v) else float(v) for v in est.gpu_hit],
        h_mc=None if rb is None else _grid2(rb["h"]),
        h_mc_se=None if rb is None else _grid2(rb["mc_se"]),
        h_lo=None if rb is None else _grid2(rb["h_lo"]),
        h_hi=None if rb is None else _grid2(rb["h_hi"]),
        level=None if rb is None else rb["level"],
        band=None if rb is None else rb["band"],
        validated=None if rb is None else rb["validated"],
        ttft_saved_s=ttft,
        dram_for_target=need,
        hbm_gib=hbm_gib,
        cheapest=cheapest,
        figure=figure,
        measure=req.measure,
        stationarity=steady,
        notes=notes,
    )


def _plan_answers(req, s, xs, bpt, bpb, priced):
    """The answers both tier families give on a surface ``s`` over host sizes ``xs``: per-cell TTFT saving (a load
    of c tokens replaces c/prefill seconds of compute by c·bytes_per_token/bandwidth of copying), the DRAM for
    ``req.target`` per HBM size, HBM GiB per size and the cheapest (HBM, DRAM) split when both are priced."""
    from kvhit.plan.tiers import cheapest_split, dram_for_target

    ttft = None
    if req.prefill_tokens_per_s is not None:
        per_token = 1.0 / req.prefill_tokens_per_s - bpt / (req.pcie_gb_per_s * 1e9)
        ttft = [
            [float(x) * per_token / max(1, int(n)) for x in row]
            for row, n in zip(s.load_tokens, s.admitted, strict=True)
        ]
    need = dram_for_target(s.hit, xs, req.target) if req.target is not None else None
    hbm_gib = [float(N) * bpb * req.tp / 2**30 for N in s.gpu_blocks] if bpb is not None else None
    cheapest = None
    if all(priced):
        sp = cheapest_split(s.hit, hbm_gib, xs, req.target, req.price_hbm_per_gib, req.price_dram_per_gib)
        if sp is not None:
            cheapest = {
                "hbm_blocks": int(s.gpu_blocks[sp.hbm_index]),
                "hbm_gib": sp.hbm_gib,
                "dram_gib": sp.dram_gib,
                "cost": sp.cost,
                "h": sp.h,
            }
    return ttft, need, hbm_gib, cheapest


def _grid2(a) -> list[list[float | None]]:
    return [[None if not np.isfinite(v) else float(v) for v in row] for row in np.asarray(a, float)]


def _simulate(req: TiersRequest, br, b: int, units: list[int], kw: dict, measured=None):
    from kvhit.sim.tiers.surface import hit_surface

    with translating("--hbm-blocks"):
        s = hit_surface(
            br.prompt_tokens,
            br.hash_offsets,
            br.hashes,
            tier=req.tier,
            gpu_blocks=req.hbm_blocks,
            host=units,
            block_size=b,
            workers=req.workers,
            measured=measured,
            **kw,
        )
    return s


def _estimated_surface(est, br, measured=None):
    """A :class:`~kvhit.sim.tiers.surface.Surface` of the estimate (``--estimate only``): h and h_GPU estimated;
    loaded tokens = (h − h_GPU) · admitted (and measured) prompt tokens."""
    from kvhit.sim.tiers.surface import Surface

    T = np.asarray(br.prompt_tokens, np.int64)
    R = -(-T // int(br.block_size))
    m = np.ones(T.shape[0], bool) if measured is None else measured
    adm = np.array([int(((R <= N) & m).sum()) for N in est.hbm_blocks])
    den = np.array([float(T[(R <= N) & m].sum()) for N in est.hbm_blocks])
    load = np.rint((est.hit - est.gpu_hit[:, None]) * den[:, None]).astype(np.int64)
    return Surface(est.tier, est.hbm_blocks, est.host_units, est.hit, est.gpu_hit, load, int(T.sum()), adm)


def _hicache_requests(req: TiersRequest, br):
    """Token-level requests: the trace's own token ids when it keeps them, else expanded from block hashes."""
    from kvhit.sim.tiers.hicache_curve import token_requests, trace_token_requests

    if req.trace is not None:
        from kvhit.service.inputs import load_trace_file

        with translating("--trace"):
            reqs = trace_token_requests(load_trace_file(req.trace))
        if reqs is not None:
            return reqs, "token ids"
    return token_requests(br.prompt_tokens, br.hash_offsets, br.hashes, int(br.block_size)), "block hashes"


def _hicache(req: TiersRequest) -> TiersResponse:
    """``--tier hicache``: SGLang 0.5.23 HiCache over HBM sizes × (ratios | DRAM | host tokens)."""
    from kvhit.sim.tiers.hicache import VERSION, host_tokens
    from kvhit.sim.tiers.hicache_curve import hicache_surface

    if req.estimate != "none":
        raise InputError("--estimate: the two-tier estimator covers native, simple and lmcache, not hicache")
    if req.measure != "all" or req.warmup is not None:
        flag = "--warmup" if req.warmup is not None else "--measure window"
        raise InputError(f"{flag}: not modelled for --tier hicache (it counts every request)")
    given = [x is not None for x in (req.hicache_ratio, req.dram_gb, req.host_units)]
    if sum(given) != 1:
        raise InputError("--hicache-ratio, --dram-gb and --host-units: give exactly one")
    priced = (req.price_hbm_per_gib is not None, req.price_dram_per_gib is not None)
    if any(priced) and not all(priced):
        raise InputError("--price-hbm-per-gib and --price-dram-per-gib: give both or neither")
    if all(priced) and (req.target is None or req.dram_gb is None):
        raise InputError("--price-hbm-per-gib: the cheapest split needs --target and --dram-gb")
    for name in ("policy", "blocks_per_chunk", "store_threshold", "chunk_tokens", "max_num_batched_tokens"):
        if getattr(req, name) != TiersRequest.model_fields[name].default:
            raise InputError(f"{req.flag(name)}: applies to the vLLM/LMCache tiers, not to --tier hicache")
    if req.plot is not None:
        check_output_file(str(req.plot) + ".png", "--plot")
    br, _ = _load(req)
    b = int(br.block_size)
    p = req.page_size
    if b % p:
        raise InputError(f"--page-size: {p} does not divide the block size {b} (the device pool must be whole pages)")
    bpb = bpt = None
    if req.dram_gb is not None or req.prefill_tokens_per_s is not None or all(priced):
        from kvhit.plan import model_config

        with translating("--model"):
            m = model_config.resolve_model(req.model)
        with translating("--tp"):
            bpb = m.bytes_per_block(b, req.dtype, req.tp)
            bpt = m.bytes_per_token(req.dtype, req.tp)
    Cs = [int(N) * b for N in req.hbm_blocks]
    if req.hicache_ratio is not None:
        cols = list(req.hicache_ratio)
        grid = [[host_tokens(C, ratio=r, page_size=p) for r in cols] for C in Cs]
    elif req.dram_gb is not None:
        # --hicache-size is GB (10^9 B) per rank; --dram-gb is GiB over all ranks
        cols = list(req.dram_gb)
        grid = [
            [
                host_tokens(C, ratio=None, size_gb=g * 2**30 / req.tp / 1e9, bytes_per_token=bpt, page_size=p)
                if g > 0
                else 0  # no host pool: SGLang without HiCache
                for g in cols
            ]
            for C in Cs
        ]
    else:
        bad = [u for u in req.host_units if u % p]
        if bad:
            raise InputError(f"--host-units: {bad[0]} host tokens is not a whole number of {p}-token pages")
        cols = list(req.host_units)
        grid = [list(cols) for _ in Cs]
    reqs, _ = _hicache_requests(req, br)
    s = hicache_surface(
        reqs,
        hbm_blocks=req.hbm_blocks,
        block_size=b,
        host_tokens=grid,
        columns=cols,
        write_policy=req.write_policy,
        page_size=p,
        workers=req.workers,
    )
    figure = None
    if req.plot is not None:
        from kvhit.plots.tiers import plot_ratio_curve

        xlabel = (
            "--hicache-ratio (host pool / device pool)"
            if req.hicache_ratio is not None
            else "DRAM for the KV tier (GiB, all ranks)"
            if req.dram_gb is not None
            else "host pool (tokens)"
        )
        figure = [str(f) for f in plot_ratio_curve(s, req.plot, x=np.asarray(cols, float), xlabel=xlabel)]
    ttft, need, hbm_gib, cheapest = _plan_answers(req, s, np.asarray(cols, float), bpt, bpb, priced)

    def clean(M):
        return [[None if np.isnan(v) else float(v) for v in row] for row in M]

    return TiersResponse(
        tier=f"hicache (SGLang {VERSION} HiCache, {req.write_policy})",
        requests=len(reqs),
        block_size=b,
        hbm_blocks=[int(x) for x in s.gpu_blocks],
        host_units=[] if req.hicache_ratio is not None else [int(x) for x in grid[0]],
        dram_gib=list(req.dram_gb) if req.dram_gb is not None else None,
        hicache_ratio=list(req.hicache_ratio) if req.hicache_ratio is not None else None,
        host_tokens=[[int(x) for x in row] for row in s.host_tokens],
        h=clean(s.hit),
        h_gpu=[None if np.isnan(v) else float(v) for v in s.gpu_hit],
        h_device=clean(s.device_hit),
        ttft_saved_s=ttft,
        dram_for_target=need if req.hicache_ratio is None else None,
        ratio_for_target=need if req.hicache_ratio is not None else None,
        hbm_gib=hbm_gib,
        cheapest=cheapest,
        figure=figure,
    )
