"""``kvhit explain`` and ``kvhit trace chat``: where a trace's hit ratio goes; chat logs → a trace."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvhit.cli._common import JsonOpt, _call, _fmt, _opt, _print_json, _table, app, console, trace_app
from kvhit.service.explain import ChatTraceRequest as CR
from kvhit.service.explain import ExplainRequest as ER
from kvhit.service.explain import chat_trace, explain


@trace_app.command("chat")
def trace_chat(
    log: Annotated[Path, typer.Argument(help=CR.model_fields["log"].description)],
    model_dir: Annotated[Path, _opt(CR, "model_dir", "--model-dir")],
    out: Annotated[Path, _opt(CR, "out", "--out", "-o")],
    hash_only: Annotated[bool, _opt(CR, "hash_only", "--hash-only")] = False,
    model: Annotated[str | None, _opt(CR, "model", "--model")] = None,
    block_size: Annotated[int, _opt(CR, "block_size", "--block-size")] = 16,
    spacing: Annotated[float, _opt(CR, "spacing", "--spacing")] = 1.0,
    lam0: Annotated[float, _opt(CR, "lam0", "--lam0")] = 1.0,
    gap: Annotated[float, _opt(CR, "gap", "--gap")] = 60.0,
    seed: Annotated[int, _opt(CR, "seed", "--seed")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Chat logs → a kvhit trace, rendered with the model directory's own chat template and tokenizer."""
    res = _call(
        chat_trace,
        CR,
        log=log,
        model_dir=model_dir,
        out=out,
        hash_only=hash_only,
        model=model,
        block_size=block_size,
        spacing=spacing,
        lam0=lam0,
        gap=gap,
        seed=seed,
    )
    if as_json:
        _print_json(res)
        return
    r = res.report
    th = ", ".join(f"{k} {v:,}" for k, v in sorted(r["threading"].items()))
    fmts = ", ".join(f"{k} {v:,}" for k, v in sorted(r["formats"].items()))
    console.print(
        f"{r['source']}: {r['n_requests']:,} requests ({fmts}) → {r['n_conversations']:,} conversations, "
        f"{r['prompt_tokens']:,} prompt tokens; threading: {th}; arrivals: {r['timestamps']}; "
        f"tokenizer {r['model_dir']} ({r['tokenizer_fingerprint']}); wrote {res.out} in {res.seconds:.1f} s",
        markup=False,
        highlight=False,
    )
    if r["n_other_models"]:
        other = ", ".join(f"{k} {v:,}" for k, v in r["n_other_models"].items())
        console.print(f"left out (other models): {other}", markup=False, highlight=False)


@app.command("explain")
def explain_cmd(
    trace: Annotated[Path, _opt(ER, "trace", "--trace")],
    N: Annotated[int | None, _opt(ER, "N", "--N")] = None,
    kv_gb: Annotated[float | None, _opt(ER, "kv_gb", "--kv-gb")] = None,
    dram_gb: Annotated[float | None, _opt(ER, "dram_gb", "--dram-gb")] = None,
    model: Annotated[str, _opt(ER, "model", "--model")] = "qwen3-8b",
    dtype: Annotated[str, _opt(ER, "dtype", "--kv-dtype")] = "bf16",
    engine: Annotated[str, _opt(ER, "engine", "--engine")] = "vllm",
    block_size: Annotated[int | None, _opt(ER, "block_size", "--block-size")] = None,
    prefill_tokens_per_s: Annotated[float | None, _opt(ER, "prefill_tokens_per_s", "--prefill-tokens-per-s")] = None,
    replicas: Annotated[int, _opt(ER, "replicas", "--replicas")] = 1,
    router: Annotated[str | None, _opt(ER, "router", "--router")] = None,
    host_blocks: Annotated[int | None, _opt(ER, "host_blocks", "--host-blocks")] = None,
    model_dir: Annotated[Path | None, _opt(ER, "model_dir", "--model-dir")] = None,
    breakers: Annotated[int, _opt(ER, "breakers", "--breakers")] = 5,
    figure: Annotated[Path | None, _opt(ER, "figure", "--figure")] = None,
    seed: Annotated[int, _opt(ER, "seed", "--seed")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Where the hit ratio goes: reusable share → capacity → engine → concurrency → routing → host tier."""
    res = _call(
        explain,
        ER,
        trace=trace,
        N=N,
        kv_gb=kv_gb,
        dram_gb=dram_gb,
        model=model,
        dtype=dtype,
        engine=engine,
        block_size=block_size,
        prefill_tokens_per_s=prefill_tokens_per_s,
        replicas=replicas,
        router=router,
        host_blocks=host_blocks,
        model_dir=model_dir,
        breakers=breakers,
        figure=figure,
        seed=seed,
    )
    if as_json:
        _print_json(res)
        return
    c = res.config
    rows = []
    for r in res.waterfall:
        name = r["step"] + ("" if r["configured"] else " (not configured)")
        rows.append(
            [name]
            + [f"{r[w]:.4f}" if r["stage"] == "reusable" else f"{r[f'{w}_step']:+.4f}" for w in ("block", "token")]
            + [f"{r['request']:.4f}" if r["stage"] == "reusable" else f"{r['request_step']:+.4f}"]
        )
    rows.append(["= final"] + [f"{res.final[w]:.4f}" for w in ("block", "token", "request")])
    title = (
        f"{res.trace}: {c['requests']:,} requests, {c['conversations']:,} conversations; {c['engine']}, "
        f"N = {c['N']:,} blocks of {c['block_size']}"
        + (f" ({c['sizing']['kv_gib']:g} GiB of {c['sizing']['model']})" if (c["sizing"] or {}).get("kv_gib") else "")
        + (f", {c['replicas']} replicas ({c['router']})" if c["replicas"] > 1 else "")
    )
    _table(title, ["step", "block-weighted", "token-weighted", "request-weighted"], rows)
    _table(
        "missed tokens by cause",
        ["cause", "tokens", "share of missed", "requests (largest cause)"],
        [[x["cause"], f"{x['tokens']:,}", _fmt(x["share"]), f"{x['requests']:,}"] for x in res.causes],
    )
    if res.breakers:
        brow = []
        for b in res.breakers:
            ex = b["examples"][0] if b["examples"] else {}
            what = (
                f"{ex.get('text')!r} vs {ex.get('earlier_text')!r} after {ex.get('context')!r}"
                if "text" in ex
                else f"{ex.get('ids')} vs {ex.get('earlier_ids')}"
            )
            brow.append([f"{b['position']:,}", f"{b['requests']:,}", f"{b['tokens_lost']:,}", what])
        _table("prefix breakers", ["token position", "requests", "tokens lost", "differing tokens"], brow)
    if res.what_if:
        w = res.what_if
        console.print(
            f"what-if: with the span at token {w['position']:,} moved after the shared prefix in "
            f"{w['requests']:,} requests' conversations, the engine-stage token hit ratio goes from "
            f"{w['token'][0]:.4f} to {w['token'][1]:.4f} (block-weighted {w['block'][0]:.4f} → {w['block'][1]:.4f})",
            markup=False,
            highlight=False,
        )
    for p in res.figure:
        console.print(f"wrote {p}", markup=False, highlight=False)
