"""``trace chat`` and ``explain``: chat logs → a kvhit trace with the model's own tokenizer, and where a trace's
hit ratio goes at a configuration.

Invariant: every flag given changes the answer or is refused (``--router`` without replicas, a host tier behind
a fleet, ``--model-dir`` for decoding without token ids, …); outputs are checked before computing and written
atomically. NOT modelled here: the readers, the renderer and the simulators themselves
(:mod:`kvhit.workload.chat`, :mod:`kvhit.explain`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from kvhit.service.base import Request, Response
from kvhit.service.errors import InputError, translating
from kvhit.service.inputs import read_trace
from kvhit.service.io import check_output_file

__all__ = ["ChatTraceRequest", "ChatTraceResponse", "ExplainRequest", "ExplainResponse", "chat_trace", "explain"]


class ChatTraceRequest(Request):
    """The inputs of ``kvhit trace chat``, validated: each field's description states its unit, range and default
    ."""

    log: Path = Field(
        description="Chat log: OpenAI/Anthropic request JSONL, ShareGPT/LMSYS/vLLM conversation JSON; required."
    )
    model_dir: Path = Field(description="Local model directory with tokenizer.json and a chat template.")
    out: Path = Field(description="Output: a kvhit Parquet trace, or Mooncake-style JSONL with --hash-only.")
    hash_only: bool = Field(False, description="Write only chained block hashes (no token ids leave the machine).")
    model: str | None = Field(None, description="Keep only the requests for this model (a log with several).")
    block_size: int = Field(16, ge=1, le=2**16, description="Tokens per KV block b, 1–65,536; default 16 (vLLM).")
    spacing: float = Field(
        1.0, ge=0, description="Request logs without timestamps: seconds between requests; ≥ 0; default 1."
    )
    lam0: float = Field(1.0, gt=0, description="Conversation files: conversation arrivals per second; > 0.")
    gap: float = Field(60.0, ge=0, description="Conversation files: mean seconds between turns; ≥ 0.")
    seed: int = Field(0, ge=0, description="Seed of the conversation files' arrival times; ≥ 0.")

    FLAGS = {"model_dir": "--model-dir", "out": "--out"}


class ChatTraceResponse(Response):
    """The answer of ``kvhit trace chat`` (``--json`` prints it; strict JSON, ``null`` where a number is undefined)."""

    out: str
    hash_only: bool
    report: dict[str, Any]
    seconds: float


def chat_trace(req: ChatTraceRequest) -> ChatTraceResponse:
    """Read, render, tokenize, thread and write (see :mod:`kvhit.workload.chat`)."""
    from kvhit.sim.vllm.mooncake import write_mooncake
    from kvhit.workload.chat import build_chat_trace
    from kvhit.workload.chat_log import ChatError

    t0 = time.perf_counter()
    suffix = (".jsonl",) if req.hash_only else (".parquet",)
    if req.out.suffix not in suffix:
        raise InputError(f"--out {req.out}: expected a {suffix[0]} file{' with --hash-only' if req.hash_only else ''}")
    check_output_file(req.out, "--out")
    with translating(str(req.log)):
        try:
            tr, rep, ids, times = build_chat_trace(
                req.log,
                req.model_dir,
                block_size=req.block_size,
                model=req.model,
                spacing=req.spacing,
                lam0=req.lam0,
                gap=req.gap,
                seed=req.seed,
            )
        except ChatError as e:  # already names the file (and line)
            raise InputError(str(e)) from None
    if req.hash_only:
        write_mooncake(req.out, ids, times, req.block_size)
    else:
        tr.write(req.out)
    return ChatTraceResponse(
        out=str(req.out), hash_only=req.hash_only, report=rep.to_dict(), seconds=time.perf_counter() - t0
    )


class ExplainRequest(Request):
    """The inputs of ``kvhit explain``, validated: each field's description states its unit, range and default."""

    trace: Path = Field(description="kvhit Parquet trace (kvhit trace chat makes one from chat logs).")
    N: int | None = Field(
        None, ge=1, le=2**31 - 3, description="KV blocks of the GPU prefix cache (per replica); ≥ 1; or --kv-gb."
    )
    kv_gb: float | None = Field(
        None, gt=0, le=2**20, description="KV budget per replica in GiB instead of --N (with --model); (0, 2^20]."
    )
    dram_gb: float | None = Field(
        None, gt=0, le=2**20, description="Host tier in GiB instead of --host-blocks (with --model); (0, 2^20]."
    )
    model: str = Field("qwen3-8b", description="Model preset (`kvhit kv --list`) or config.json for --kv-gb/--dram-gb.")
    dtype: str = Field("bf16", description="KV cache dtype for --kv-gb/--dram-gb: bf16 | fp16 | fp8 | fp32.")
    engine: Literal["vllm", "vllm-0.23"] = Field("vllm", description="vllm (≥ 0.24) | vllm-0.23.")
    block_size: int | None = Field(
        None, ge=1, le=2**16, description="Tokens per block, 1–65,536; default: the trace's."
    )
    prefill_tokens_per_s: float | None = Field(
        None, gt=0, le=1e12, description="Concurrency stage: each request holds its blocks T/speed seconds; > 0."
    )
    replicas: int = Field(1, ge=1, le=4096, description="Routing stage: replicas of N blocks each; 1–4,096.")
    router: str | None = Field(None, description="Routing stage: the router (kvhit fleet's names); needs replicas.")
    host_blocks: int | None = Field(
        None, ge=1, le=2**31 - 3, description="Host-tier stage: vLLM native CPU offloading, blocks; ≥ 1."
    )
    model_dir: Path | None = Field(None, description="Model directory: decode the prefix breakers' tokens.")
    breakers: int = Field(5, ge=0, le=100, description="Prefix breakers to report (and what-if the first); 0–100.")
    figure: Path | None = Field(None, description="Write the waterfall figure to PREFIX.png and PREFIX.svg.")
    seed: int = Field(0, ge=0, description="Router seed; ≥ 0.")

    FLAGS = {"N": "--N", "model_dir": "--model-dir", "kv_gb": "--kv-gb", "dram_gb": "--dram-gb", "dtype": "--kv-dtype"}


class ExplainResponse(Response):
    """The answer of ``kvhit explain`` (``--json`` prints it; strict JSON, ``null`` where a number is undefined)."""

    trace: str
    config: dict[str, Any]
    waterfall: list[dict[str, Any]] = Field(description="One row per stage: value and step in each weighting.")
    final: dict[str, float]
    causes: list[dict[str, Any]]
    breakers: list[dict[str, Any]]
    what_if: dict[str, Any] | None
    figure: list[str] = Field(default_factory=list)
    seconds: float


def explain(req: ExplainRequest) -> ExplainResponse:
    """The waterfall, the per-miss causes and the prefix breakers of a trace at a configuration."""
    from kvhit.explain import ExplainError, explain_trace, find_breakers, full_prompts, what_if

    t0 = time.perf_counter()
    if (req.N is None) == (req.kv_gb is None):
        raise InputError("--N and --kv-gb: give exactly one GPU KV capacity")
    if req.host_blocks is not None and req.dram_gb is not None:
        raise InputError("--host-blocks and --dram-gb: give one host-tier size, not both")
    if req.figure is not None:
        check_output_file(req.figure, "--figure", (".png", ".svg"))
    tr = read_trace(req.trace)
    b = req.block_size or tr.block_size
    if b is None:
        raise InputError("--block-size: the trace records no block size; give one")
    N, host_blocks, sizing = req.N, req.host_blocks, None
    if req.kv_gb is not None or req.dram_gb is not None:
        from kvhit.plan import hardware
        from kvhit.plan.planner import capacity
        from kvhit.sim.tiers.sizing import host_units

        with translating("--model"):
            m = hardware.resolve_model(req.model)
        with translating("--kv-dtype"):
            bpb = m.bytes_per_block(int(b), req.dtype, 1)
        sizing = {"model": m.name, "dtype": req.dtype, "bytes_per_block": int(bpb)}
        if req.kv_gb is not None:
            with translating("--kv-gb"):
                N = capacity(m, kv_gb=req.kv_gb, block_size=int(b), dtype=req.dtype).N
            if N < 1:
                raise InputError(f"--kv-gb: {req.kv_gb:g} GiB holds no block of {m.name} at {b} tokens")
            sizing["kv_gib"] = req.kv_gb
        if req.dram_gb is not None:
            host_blocks = host_units(
                "native", int(req.dram_gb * 2**30), bytes_per_block_rank=int(bpb), block_size=int(b)
            )
            if host_blocks < 1:
                raise InputError(f"--dram-gb: {req.dram_gb:g} GiB holds no block of {m.name} at {b} tokens")
            sizing["dram_gib"] = req.dram_gb
        sizing["N"], sizing["host_blocks"] = N, host_blocks
    prompts = full_prompts(tr)
    if req.model_dir is not None and prompts is None:
        raise InputError("--model-dir: the trace has no token ids to decode (build it with kvhit trace chat)")
    decode = None
    if req.model_dir is not None:
        from kvhit.workload.chat_log import ChatError
        from kvhit.workload.chat_model import load_chat_model

        try:
            tok = load_chat_model(req.model_dir).tokenizer
        except ChatError as e:
            raise InputError(str(e)) from None
        decode = lambda ids: tok.decode([int(x) for x in ids], skip_special_tokens=False)  # noqa: E731
    with translating(f"--trace {req.trace}"):
        try:
            wf = explain_trace(
                tr,
                N=int(N),
                engine=req.engine,
                block_size=int(b),
                prefill_tokens_per_s=req.prefill_tokens_per_s,
                replicas=req.replicas,
                router=req.router,
                host_blocks=host_blocks,
                seed=req.seed,
                prompts=prompts,
            )
        except ExplainError as e:  # names the flag
            raise InputError(str(e)) from None
    brk: list = []
    wi = None
    div = None
    if prompts is not None and req.breakers > 0:
        brk, div = find_breakers(
            prompts, wf.hits["reusable"], wf.partner, min_run=wf.block_size, decode=decode, top=req.breakers
        )
        if brk:
            vals = what_if(tr, prompts, brk[0], N=wf.extra["N_total"], engine=req.engine, block_size=wf.block_size)
            wi = {"position": brk[0].position, "requests": brk[0].requests, **{k: list(v) for k, v in vals.items()}}
    figs: list[str] = []
    if req.figure is not None:
        from kvhit.explain.figure import plot_waterfall

        figs = [str(p) for p in plot_waterfall(wf, req.figure)]
    cfg = {
        "N": int(N),
        "N_total": wf.extra["N_total"],
        "engine": req.engine,
        "block_size": wf.block_size,
        "prefill_tokens_per_s": req.prefill_tokens_per_s,
        "replicas": req.replicas,
        "router": wf.router,
        "host_blocks": host_blocks,
        "sizing": sizing,
        "requests": tr.n_turns,
        "conversations": tr.n_conversations,
        "token_ids": prompts is not None,
    }
    return ExplainResponse(
        trace=str(req.trace),
        config=cfg,
        waterfall=wf.table(),
        final={w: wf.final(w) for w in ("block", "token", "request")},
        causes=wf.causes(div),
        breakers=[b.to_dict() for b in brk],
        what_if=wi,
        figure=figs,
        seconds=time.perf_counter() - t0,
    )
