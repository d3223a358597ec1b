"""``kvhit plan`` and ``kvhit kv``: planning answers and KV sizes."""

from __future__ import annotations

from typing import Annotated

import typer

from kvhit.cli._common import (
    HW,
    AccelOpt,
    ArrivalOpt,
    BlocksTraceOpt,
    DtypeOpt,
    JsonOpt,
    KvGbOpt,
    Lam0Opt,
    ModelOpt,
    POpt,
    RateOpt,
    SpanOpt,
    SpecOpt,
    TpOpt,
    TraceOpt,
    TurnsOpt,
    UtilOpt,
    WCvOpt,
    WDistOpt,
    WMeanOpt,
    XOpt,
    YOpt,
    _call,
    _fmt,
    _opt,
    _print_json,
    _print_notes,
    _table,
    app,
    console,
    svc,
)

# ---------------------------------------------------------------------------------------------------------------
# kvhit plan / kvhit kv
# ---------------------------------------------------------------------------------------------------------------

PR = svc.PlanRequest


@app.command()
def plan(
    trace: TraceOpt = None,
    spec: SpecOpt = None,
    lam0: Lam0Opt = None,
    p: POpt = None,
    mean_turns: TurnsOpt = None,
    x_mean: XOpt = None,
    y_mean: YOpt = None,
    w_mean: WMeanOpt = None,
    w_dist: WDistOpt = None,
    w_cv: WCvOpt = None,
    model: ModelOpt = "qwen3-8b",
    accelerator: AccelOpt = None,
    kv_gb: KvGbOpt = None,
    block_size: Annotated[int, _opt(PR, "block_size", "--block-size")] = 128,
    dtype: DtypeOpt = "bf16",
    tp: TpOpt = 1,
    util: UtilOpt = None,
    target: Annotated[float | None, _opt(PR, "target", "--target")] = None,
    engine: Annotated[str, _opt(PR, "engine", "--engine")] = "vllm",
    metric: Annotated[str | None, _opt(PR, "metric", "--metric")] = None,
    compare: Annotated[str | None, _opt(PR, "compare", "--compare")] = None,
    page_size: Annotated[int | None, _opt(PR, "page_size", "--page-size")] = None,
    evict_policy: Annotated[str | None, _opt(PR, "evict_policy", "--evict-policy")] = None,
    sglang_cache: Annotated[str | None, _opt(PR, "sglang_cache", "--sglang-cache")] = None,
    tlru_threshold: Annotated[int | None, _opt(PR, "tlru_threshold", "--tlru-threshold")] = None,
    verify: Annotated[bool, _opt(PR, "verify", "--verify")] = False,
    blocks_trace: BlocksTraceOpt = None,
    arrival: ArrivalOpt = "sequential",
    rate: RateOpt = None,
    span: SpanOpt = None,
    seed: Annotated[
        int, typer.Option("--seed", help="WEKA arrivals and resampling: seed (replication r: seed + r).")
    ] = 0,
    scale: Annotated[float | None, _opt(PR, "scale", "--scale")] = None,
    replications: Annotated[int | None, _opt(PR, "replications", "--replications", "-r")] = None,
    conversations: Annotated[int | None, _opt(PR, "conversations", "--conversations", "-n")] = None,
    as_json: JsonOpt = False,
) -> None:
    """How much HBM, what hit ratio, how much traffic: (a) h at the KV memory available, (b) the KV memory for
    a target h, (c) the largest λ0 keeping the target, (d) prefill tokens saved per second.

    --blocks-trace plans from a Mooncake/WEKA block-id trace: at the trace's own load (exact by replay) or, with
    --lam0/--scale, at a stationary load of its conversations (the estimator's stationary form, not validated;
    --verify adds the exact resample-and-simulate answer: Poisson starts,
    --replications runs of --conversations conversations each, 95% interval); --verify checks the estimator
    against that simulation. Capacities below the largest request are infeasible (refused shares, no ratio)."""
    res = _call(
        svc.plan,
        PR,
        trace=trace,
        spec=spec,
        lam0=lam0,
        p=p,
        mean_turns=mean_turns,
        x_mean=x_mean,
        y_mean=y_mean,
        w_mean=w_mean,
        w_dist=w_dist,
        w_cv=w_cv,
        model=model,
        accelerator=accelerator,
        kv_gb=kv_gb,
        block_size=block_size,
        dtype=dtype,
        tp=tp,
        gpu_memory_utilization=util,
        target=target,
        engine=engine,
        metric=metric,
        compare=compare,
        page_size=page_size,
        evict_policy=evict_policy,
        sglang_cache=sglang_cache,
        tlru_threshold=tlru_threshold,
        verify=verify,
        blocks_trace=blocks_trace,
        arrival=arrival,
        rate=rate,
        span=span,
        seed=seed,
        scale=scale,
        replications=replications,
        conversations=conversations,
    )
    if as_json:
        _print_json(res)
        return
    rows = []
    if res.capacity:
        c = res.capacity
        rows.append(
            [
                "KV capacity",
                f"{c['N']:,} blocks = {c['kv_gib']:.2f} GiB ({c['model']} on {c['accelerator']}, "
                f"{c['bytes_per_block'] / 2**20:.2f} MiB/block)",
            ]
        )
        if res.feasible is False:
            rows.append(
                [
                    "(a) hit ratio at this capacity",
                    f"infeasible: below the largest request ({res.N_min:,} blocks); refuses "
                    f"{100 * res.refused_request_share:.2f}% of requests, {100 * res.refused_token_share:.2f}% of "
                    "prompt tokens",
                ]
            )
        else:
            band = ""
            if res.h_band is not None:
                band = f" ({res.band_level:.0%} band {res.h_band[0]:.4f}–{res.h_band[1]:.4f})"
            rows.append(["(a) hit ratio at this capacity", _fmt(res.h_at_capacity) + band])
    rows.append(["workload ceiling h_max", _fmt(res.h_max)])
    if res.N_min is not None:
        rows.append(["smallest feasible capacity (largest request)", f"{res.N_min:,} blocks"])
    if res.target is not None:
        need = f"{res.N_for_target:,} blocks" + (f" = {res.gib_for_target:.2f} GiB" if res.gib_for_target else "")
        rows.append([f"(b) KV memory for h = {res.target:g}", need])
        if res.band_level is not None:
            conf = (
                "not reached"
                if res.N_for_target_confident is None
                else f"{res.N_for_target_confident:,} blocks"
                + (f" = {res.gib_for_target_confident:.2f} GiB" if res.gib_for_target_confident else "")
            )
            rows.append([f"(b) KV memory for h ≥ {res.target:g} with {res.band_level:.0%} confidence", conf])
        c_unanswered = any(n.startswith("(c)") for n in res.notes)  # block-id traces: see the note
        if res.capacity and res.feasible is not False and res.answered_by == "estimator" and not c_unanswered:
            lm = res.lam0_max_for_target
            rows.append([f"(c) largest λ0 keeping h ≥ {res.target:g}", "unreachable" if lm is None else f"{lm:.4g}/s"])
    if res.saved_prefill_tokens_per_s is not None:
        rows.append(
            [
                "(d) prefill tokens saved",
                f"{res.saved_prefill_tokens_per_s:,.0f} tokens/s ({100 * res.saved_fraction:.1f}% of prompt tokens)",
            ]
        )
    if res.compare and res.compare.get("engine") == "sglang":
        rows.extend(_sglang_rows(res.compare))
    elif res.compare and res.compare.get("h_at_capacity") is not None:
        c = res.compare
        rows.append(
            [f"vs {c['engine']} at this capacity", f"{c['h_at_capacity']:.4f} → {res.estimator} gains {c['gain']:+.4f}"]
        )
    if res.verify:
        v = res.verify
        rows.append(
            [
                f"verify: simulated {v['simulator']}",
                f"{v['h_simulated']:.4f}"
                + (f" ± {v['h_simulated_ci95']:.4f} (95%, {v['replications']} runs)" if "h_simulated_ci95" in v else "")
                + (
                    f" (estimate {v['h_predicted']:.4f}; estimate − simulation = {v['difference']:+.4f})"
                    if v.get("difference") is not None and res.answered_by == "resample"
                    else f" (prediction − simulation = {v['difference']:+.4f})"
                    if v.get("difference") is not None
                    else ""
                ),
            ]
        )
    by = {"estimator": f"predictor: {res.estimator}", "replay": "exact: trace replayed", "resample": "exact: resampled"}
    _table(
        f"kvhit plan — {res.workload}, "
        + ("λ0 undefined (one conversation)" if res.lam0 is None else f"λ0 = {res.lam0:.4g}/s")
        + f", {by.get(res.answered_by, res.answered_by)} "
        f"({'vLLM token hit ratio' if res.metric == 'tokens' else 'block-weighted h'})",
        ["question", "answer"],
        rows,
    )
    _print_notes(res.notes, style="dim")


def _sglang_rows(c: dict) -> list[list[str]]:
    """``--compare sglang``: both engines simulated at the same KV bytes."""

    def h(key: str) -> str:
        v = c.get(f"h_{key}")
        if v is None:
            return f"infeasible ({100 * (c.get(f'{key}_refused_request_share') or 0):.2f}% of requests refused)"
        return f"{v:.4f} ± {c.get(f'h_{key}_ci95', float('nan')):.4f}"

    rows = [
        [f"vLLM ({c['vllm_engine']}, {c['vllm_mode']}) at {c['vllm_blocks']:,} blocks", h("vllm")],
    ]
    if "h_vllm_prefill_only" in c:
        rows.append([f"vLLM prefill-only (PD) at {c['vllm_blocks']:,} blocks", h("vllm_prefill_only")])
    rows.append([f"SGLang (page {c['page_size']}, {c['evict_policy']}) at {c['sglang_tokens']:,} tokens", h("sglang")])
    if c.get("difference") is not None:
        rows.append(
            [
                f"SGLang − vLLM at {c['kv_gib']:.2f} GiB (paired, 95%)",
                f"{c['difference']:+.4f} ± {c['difference_ci95']:.4f} → {c['better']}",
            ]
        )
    return rows


@app.command()
def kv(
    model: ModelOpt = "qwen3-8b",
    accelerator: AccelOpt = None,
    kv_gb: KvGbOpt = None,
    block_size: Annotated[int, _opt(HW, "block_size", "--block-size")] = 128,
    dtype: DtypeOpt = "bf16",
    tp: TpOpt = 1,
    util: UtilOpt = None,
    dram_gb: Annotated[float | None, _opt(HW, "dram_gb", "--dram-gb")] = None,
    blocks_per_chunk: Annotated[int | None, _opt(HW, "blocks_per_chunk", "--blocks-per-chunk")] = None,
    chunk_tokens: Annotated[int | None, _opt(HW, "chunk_tokens", "--chunk-tokens")] = None,
    list_presets: Annotated[bool, typer.Option("--list", help="List model and accelerator presets.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """KV bytes per token and block for a model, the block capacity N on an accelerator or a KV budget, and the
    capacity of a host (DRAM) KV tier per engine."""
    if list_presets:
        info = svc.list_presets()
        if as_json:
            _print_json(info)
        else:
            console.print("models: " + ", ".join(info["models"]), markup=False)
            console.print("accelerators: " + ", ".join(info["accelerators"]), markup=False)
        return
    res = _call(
        svc.kv,
        HW,
        model=model,
        accelerator=accelerator,
        kv_gb=kv_gb,
        block_size=block_size,
        dtype=dtype,
        tp=tp,
        gpu_memory_utilization=util,
        dram_gb=dram_gb,
        blocks_per_chunk=blocks_per_chunk,
        chunk_tokens=chunk_tokens,
    )
    if as_json:
        _print_json(res)
        return
    line = (
        f"{res.model}: {res.bytes_per_token:,} bytes/token ({res.dtype}, TP {res.tp}), "
        f"{res.bytes_per_block:,} bytes per {res.block_size}-token block"
    )
    if res.N is not None:
        line += f"; {res.accelerator}: {res.kv_gib:.2f} GiB of KV → N = {res.N:,} blocks"
    console.print(line, markup=False, highlight=False)
    if res.host_tier is not None:
        t = res.host_tier
        console.print(
            f"{t['dram_gib']:g} GiB of DRAM: vLLM native {t['native_chunks']:,} chunks of {t['native_chunk_tokens']} "
            f"tokens; SimpleCPUOffload {t['simple_cpu_blocks']:,} CPU blocks per rank; LMCache "
            f"{t['lmcache_chunks_per_rank']:,} chunks of {t['lmcache_chunk_tokens']} tokens per rank "
            f"(max_local_cpu_size {t['lmcache_max_local_cpu_size_gib']:g} GiB)",
            markup=False,
            highlight=False,
        )
