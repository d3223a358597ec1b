"""``tiers``: the total hit ratio h(HBM, DRAM) of a trace behind a host-memory tier (issue 16), over a grid.

Invariant: numbers are :func:`kvhit.sim.tiers.surface.hit_surface`'s (sequential replay of the trace through the
vLLM GPU model and the chosen tier model: vLLM 0.33.0 native offloading, SimpleCPUOffloadConnector eager, or
LMCache 0.5.6); DRAM sizes are converted to tier units as each engine does (:mod:`kvhit.sim.tiers.sizing`).
NOT modelled: what the tier models do not model (their docstrings), timing (``hold``), the estimator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from .base import Request, Response
from .errors import InputError, translating
from .io import check_output_file

__all__ = ["TiersRequest", "TiersResponse", "tiers"]

Tier = Literal["native", "lmcache", "simple"]


class TiersRequest(Request):
    trace: Path | None = Field(None, description="kvhit trace (Parquet) to replay; or --blocks-trace; default: none.")
    blocks_trace: Path | None = Field(
        None, description="Production block-id trace (Mooncake JSONL, WEKA dir/.json); or --trace; default: none."
    )
    tier: Tier = Field("native", description="Host tier: native (vLLM OffloadingConnector) | simple | lmcache.")
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
        description="Host capacities in tier units (chunks; CPU blocks for simple), integers in [0, 2^31]; "
        "or --dram-gb; default: none.",
    )
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
    plot: Path | None = Field(
        None, description="Write a heatmap with iso-hit contours to PLOT.png/.svg; default: none."
    )

    FLAGS = {"blocks_trace": "--blocks-trace", "hbm_blocks": "--hbm-blocks", "dram_gb": "--dram-gb"}


class TiersResponse(Response):
    tier: str = Field(description="Tier model (with its engine version).")
    requests: int = Field(description="Requests replayed.")
    block_size: int = Field(description="Tokens per block.")
    hbm_blocks: list[int] = Field(description="GPU capacities (blocks), rows of h.")
    host_units: list[int] = Field(description="Host capacities (tier units), columns of h.")
    dram_gib: list[float] | None = Field(None, description="DRAM sizes (GiB) the columns come from.")
    h: list[list[float | None]] = Field(description="Total token hit ratio (GPU + host) per (HBM, DRAM).")
    h_gpu: list[float | None] = Field(description="Token hit ratio of the GPU alone per HBM.")
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


def _load(req: TiersRequest):
    from ..sim.runner import block_requests
    from ..workload.production import read_production
    from ..workload.trace import Trace

    if (req.trace is None) == (req.blocks_trace is None):
        raise InputError("--trace and --blocks-trace: give exactly one")
    if req.trace is not None:
        with translating("--trace"):
            tr = Trace.read(req.trace)
            return block_requests(tr, block_size=req.block_size)
    with translating("--blocks-trace"):
        pt = read_production(req.blocks_trace)
    if req.block_size is not None and req.block_size != pt.block_size:
        raise InputError(f"--block-size: the blocks trace has block size {pt.block_size}, got {req.block_size}")
    return pt.to_block_requests()


def tiers(req: TiersRequest) -> TiersResponse:
    from ..sim.tiers.sizing import host_units
    from ..sim.tiers.surface import hit_surface

    if (req.dram_gb is None) == (req.host_units is None):
        raise InputError("--dram-gb and --host-units: give exactly one")
    priced = (req.price_hbm_per_gib is not None, req.price_dram_per_gib is not None)
    if any(priced) and not all(priced):
        raise InputError("--price-hbm-per-gib and --price-dram-per-gib: give both or neither")
    if all(priced) and (req.target is None or req.dram_gb is None):
        raise InputError("--price-hbm-per-gib: the cheapest split needs --target and --dram-gb")
    if req.plot is not None:
        check_output_file(str(req.plot) + ".png", "--plot")
    br = _load(req)
    b = int(br.block_size)
    kw: dict = {}
    if req.tier == "native":
        kw = {"policy": req.policy, "blocks_per_chunk": req.blocks_per_chunk, "store_threshold": req.store_threshold}
    elif req.tier == "lmcache":
        if req.chunk_tokens % b:
            raise InputError(f"--chunk-tokens: expected a multiple of the block size {b}, got {req.chunk_tokens}")
        kw = {"chunk_tokens": req.chunk_tokens}
    bpb = bpt = None
    if req.dram_gb is not None or req.prefill_tokens_per_s is not None or all(priced):
        from .. import hardware

        with translating("--model"):
            m = hardware.resolve_model(req.model)
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
    else:
        units = list(req.host_units)
    if req.tier == "simple" and min(units) < 1:
        raise InputError("--dram-gb/--host-units: the simple tier needs at least one CPU block")
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
            **kw,
        )
    figure = None
    if req.plot is not None:
        from ..tiers_plot import plot_surface

        x = np.asarray(req.dram_gb, float) if req.dram_gb is not None else s.host.astype(float)
        xlabel = "DRAM for the KV tier (GiB, all ranks)" if req.dram_gb is not None else "host capacity (tier units)"
        figure = [str(p) for p in plot_surface(s, req.plot, x=x, xlabel=xlabel)]
    ttft = None
    if req.prefill_tokens_per_s is not None:
        # a load of c tokens replaces c/prefill seconds of compute by c·bytes_per_token/bandwidth of copying
        per_token = 1.0 / req.prefill_tokens_per_s - bpt / (req.pcie_gb_per_s * 1e9)
        ttft = [
            [float(x) * per_token / max(1, int(n)) for x in row]
            for row, n in zip(s.load_tokens, s.admitted, strict=True)
        ]
    from ..plan_tiers import cheapest_split, dram_for_target

    xs = np.asarray(req.dram_gb if req.dram_gb is not None else s.host, float)
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
    name = {"native": "vLLM 0.33.0 native", "simple": "vLLM 0.33.0 SimpleCPUOffload", "lmcache": "LMCache 0.5.6"}
    return TiersResponse(
        tier=f"{req.tier} ({name[req.tier]})",
        requests=int(len(br.prompt_tokens)),
        block_size=b,
        hbm_blocks=[int(x) for x in s.gpu_blocks],
        host_units=[int(x) for x in s.host],
        dram_gib=list(req.dram_gb) if req.dram_gb is not None else None,
        h=[[None if np.isnan(v) else float(v) for v in row] for row in s.hit],
        h_gpu=[None if np.isnan(v) else float(v) for v in s.gpu_hit],
        ttft_saved_s=ttft,
        dram_for_target=need,
        hbm_gib=hbm_gib,
        cheapest=cheapest,
        figure=figure,
    )
