"""``kvhit tiers``: host-memory tiers (DRAM behind HBM)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvhit.cli._common import (
    _call,
    _fmt,
    _help,
    _list_of,
    _print_json,
    _print_notes,
    _table,
    app,
    console,
    svc,
)

# ---------------------------------------------------------------------------------------------------------------
# kvhit tiers
# ---------------------------------------------------------------------------------------------------------------


@app.command()
def tiers(
    trace: Annotated[Path | None, typer.Option("--trace", help=_help(svc.TiersRequest, "trace"))] = None,
    blocks_trace: Annotated[
        Path | None, typer.Option("--blocks-trace", help=_help(svc.TiersRequest, "blocks_trace"))
    ] = None,
    tier: Annotated[str, typer.Option("--tier", help=_help(svc.TiersRequest, "tier"))] = "native",
    hbm_blocks: Annotated[
        list[str] | None, typer.Option("--hbm-blocks", help=_help(svc.TiersRequest, "hbm_blocks"))
    ] = None,
    dram_gb: Annotated[list[str] | None, typer.Option("--dram-gb", help=_help(svc.TiersRequest, "dram_gb"))] = None,
    host_units: Annotated[
        list[str] | None, typer.Option("--host-units", help=_help(svc.TiersRequest, "host_units"))
    ] = None,
    hicache_ratio: Annotated[
        list[str] | None, typer.Option("--hicache-ratio", help=_help(svc.TiersRequest, "hicache_ratio"))
    ] = None,
    write_policy: Annotated[
        str, typer.Option("--hicache-write-policy", help=_help(svc.TiersRequest, "write_policy"))
    ] = "write_through",
    page_size: Annotated[int, typer.Option("--page-size", help=_help(svc.TiersRequest, "page_size"))] = 1,
    model: Annotated[str, typer.Option("--model", help=_help(svc.TiersRequest, "model"))] = "qwen3-8b",
    dtype: Annotated[str, typer.Option("--kv-dtype", help=_help(svc.TiersRequest, "dtype"))] = "bf16",
    tp: Annotated[int, typer.Option("--tp", help=_help(svc.TiersRequest, "tp"))] = 1,
    block_size: Annotated[int | None, typer.Option("--block-size", help=_help(svc.TiersRequest, "block_size"))] = None,
    policy: Annotated[str, typer.Option("--policy", help=_help(svc.TiersRequest, "policy"))] = "lru",
    blocks_per_chunk: Annotated[
        int, typer.Option("--blocks-per-chunk", help=_help(svc.TiersRequest, "blocks_per_chunk"))
    ] = 1,
    store_threshold: Annotated[
        int, typer.Option("--store-threshold", help=_help(svc.TiersRequest, "store_threshold"))
    ] = 0,
    chunk_tokens: Annotated[int, typer.Option("--chunk-tokens", help=_help(svc.TiersRequest, "chunk_tokens"))] = 256,
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option("--max-num-batched-tokens", help=_help(svc.TiersRequest, "max_num_batched_tokens")),
    ] = None,
    prefill: Annotated[
        float | None, typer.Option("--prefill-tokens-per-s", help=_help(svc.TiersRequest, "prefill_tokens_per_s"))
    ] = None,
    pcie: Annotated[float, typer.Option("--pcie-gb-per-s", help=_help(svc.TiersRequest, "pcie_gb_per_s"))] = 25.0,
    target: Annotated[float | None, typer.Option("--target", help=_help(svc.TiersRequest, "target"))] = None,
    price_hbm: Annotated[
        float | None, typer.Option("--price-hbm-per-gib", help=_help(svc.TiersRequest, "price_hbm_per_gib"))
    ] = None,
    price_dram: Annotated[
        float | None, typer.Option("--price-dram-per-gib", help=_help(svc.TiersRequest, "price_dram_per_gib"))
    ] = None,
    workers: Annotated[int, typer.Option("--workers", help=_help(svc.TiersRequest, "workers"))] = 1,
    estimate: Annotated[str, typer.Option("--estimate", help=_help(svc.TiersRequest, "estimate"))] = "none",
    replays: Annotated[int | None, typer.Option("--replays", help=_help(svc.TiersRequest, "replays"))] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help=_help(svc.TiersRequest, "plot"))] = None,
    measure: Annotated[str, typer.Option("--measure", help=_help(svc.TiersRequest, "measure"))] = "all",
    warmup: Annotated[int | None, typer.Option("--warmup", help=_help(svc.TiersRequest, "warmup"))] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print strict JSON instead of a table.")] = False,
) -> None:
    """Total hit ratio h(HBM, DRAM) of a trace behind a host-memory KV tier (vLLM native, simple eager/lazy, LMCache,
    SGLang HiCache)."""
    res = _call(
        svc.tiers,
        svc.TiersRequest,
        trace=trace,
        blocks_trace=blocks_trace,
        tier=tier,
        hbm_blocks=_list_of(hbm_blocks, "--hbm-blocks", int),
        dram_gb=_list_of(dram_gb, "--dram-gb", float),
        host_units=_list_of(host_units, "--host-units", int),
        hicache_ratio=_list_of(hicache_ratio, "--hicache-ratio", float),
        write_policy=write_policy,
        page_size=page_size,
        model=model,
        dtype=dtype,
        tp=tp,
        block_size=block_size,
        policy=policy,
        blocks_per_chunk=blocks_per_chunk,
        store_threshold=store_threshold,
        chunk_tokens=chunk_tokens,
        max_num_batched_tokens=max_num_batched_tokens,
        prefill_tokens_per_s=prefill,
        pcie_gb_per_s=pcie,
        target=target,
        price_hbm_per_gib=price_hbm,
        price_dram_per_gib=price_dram,
        workers=workers,
        estimate=estimate,
        replays=replays,
        plot=plot,
        measure=measure,
        warmup=warmup,
    )
    if as_json:
        _print_json(res)
        return
    if res.hicache_ratio is not None:
        cols, unit = res.hicache_ratio, "× (ratio)"
    elif res.dram_gib is not None:
        cols, unit = res.dram_gib, "GiB"
    else:
        cols, unit = res.host_units, "tokens" if res.host_tokens is not None else "units"
    src = " (estimated)" if res.h_source == "estimate" else ""
    gpu = "without HiCache" if res.host_tokens is not None else "GPU only"
    head = ["HBM blocks", gpu, *(f"{c:g} {unit}" for c in cols)]
    _table(
        f"{res.tier}: {res.requests:,} requests, block size {res.block_size}; h (GPU + host){src}",
        head,
        [
            [f"{N:,}", _fmt(hg), *(_fmt(v) for v in row)]
            for N, hg, row in zip(res.hbm_blocks, res.h_gpu, res.h, strict=True)
        ],
    )
    if res.h_estimate is not None and res.h_source != "estimate":
        _table(
            "estimated h (two-tier estimator)",
            head,
            [
                [f"{N:,}", _fmt(hg), *(_fmt(v) for v in row)]
                for N, hg, row in zip(res.hbm_blocks, res.h_gpu_estimate, res.h_estimate, strict=True)
            ],
        )
    if res.h_mc is not None:

        def cell(m, lo, hi) -> str:
            return "–" if m is None else f"{m:.4f} ({lo:.4f}–{hi:.4f})"

        _table(
            f"mean of {res.band['replays']} exact replays at redrawn start times ({res.level:.0%} band of one "
            "realisation)",
            ["HBM blocks", *(f"{c:g} {unit}" for c in cols)],
            [
                [f"{N:,}", *(cell(*v) for v in zip(m, lo, hi, strict=True))]
                for N, m, lo, hi in zip(res.hbm_blocks, res.h_mc, res.h_lo, res.h_hi, strict=True)
            ],
        )
    if res.ttft_saved_s is not None:
        _table(
            "mean TTFT saved per request vs recompute (s)",
            ["HBM blocks", *(f"{c:g} {unit}" for c in cols)],
            [[f"{N:,}", *(_fmt(v) for v in row)] for N, row in zip(res.hbm_blocks, res.ttft_saved_s, strict=True)],
        )
    if res.dram_for_target is not None:
        console.print(
            "DRAM reaching the target (grid): "
            + ", ".join(
                f"{N:,} blocks → {'none' if d is None else f'{d:g}'}"
                for N, d in zip(res.hbm_blocks, res.dram_for_target, strict=True)
            )
        )
    if res.ratio_for_target is not None:
        console.print(
            "--hicache-ratio reaching the target (grid): "
            + ", ".join(
                f"{N:,} blocks → {'none' if d is None else f'{d:g}'}"
                for N, d in zip(res.hbm_blocks, res.ratio_for_target, strict=True)
            )
        )
    if res.cheapest is not None:
        c = res.cheapest
        console.print(
            f"cheapest split reaching the target: {c['hbm_blocks']:,} blocks ({c['hbm_gib']:.1f} GiB HBM) + "
            f"{c['dram_gib']:g} GiB DRAM, cost {c['cost']:.4g}, h = {c['h']:.4f}"
        )
    _print_notes(res.notes)
    if res.figure:
        console.print("wrote " + ", ".join(res.figure))
