"""``curve``: the hit ratio at every capacity of a log grid — exact simulated curves in one pass each
(``kvhit.sim.content.stackdist``, ``kvhit.sim.vllm.curve``) beside the estimators' curves — on a trace, a spec or a
production block-id trace, with an optional plot.

Invariant: the grid is validated (1 ≤ n_min < n_max ≤ 2^40, 2 ≤ points ≤ 100,000) and the plot prefix checked
before computing. NOT modelled here: the default range rule and the plot's layout (``kvhit.plots.curves``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from kvhit.service.base import Response, check_capacity_memory
from kvhit.service.common import MAX_N, Capacity, Seed
from kvhit.service.errors import InputError, translating
from kvhit.service.inputs import read_blocks_trace, read_trace, window_for
from kvhit.service.io import check_output_file
from kvhit.service.simulate import BlocksTraceFields
from kvhit.service.spec import load_spec
from kvhit.service.steady import check_trace_memory, size_spec, steady_note, steady_report
from kvhit.service.traces import bundled_sharegpt, check_sharegpt_alone

__all__ = ["CurveRequest", "CurveResponse", "curve"]

POLICIES = ("content", "vllm", "vllm-0.23", "sglang")
SGLANG_LABEL = "SGLang 0.5.23 radix cache (N·b tokens)"
COLOCATED_LABEL = "vLLM colocated (v0.24+ order, responses cached) token hit ratio"


class CurveRequest(BlocksTraceFields):
    """The inputs of ``kvhit curve``, validated: each field's description states its unit, range and default."""

    conversations: int | None = Field(
        None,
        ge=1,
        le=10**8,
        description="Spec mode: conversations generated (warm-up included); 1–10^8; default: sized from the "
        "spec, 3 + 5 lifetimes × λ0·E[M]·E[W] alive, at least 20,000 measured.",
    )
    seed: Seed = 0
    n_min: int = Field(64, ge=1, le=MAX_N, description="Smallest capacity, blocks; ≥ 1.")
    n_max: int | None = Field(
        None,
        ge=2,
        le=MAX_N,
        description="Largest capacity, blocks; > --n-min; default: 1.25 × the capacity where every simulated curve "
        "reaches 99% of its infinite-capacity value, at least 1.25 × the largest request (kvhit.experiments.curve).",
    )
    points: int = Field(1000, ge=2, le=100_000, description="Capacities on a log grid; 2–100,000.")
    capacities: Annotated[list[Capacity], Field(min_length=1, max_length=100_000)] | None = Field(
        None,
        description="Exact capacities in blocks instead of the log grid (used by `kvhit sweep`); integers in "
        "[1, 2^40]; default: none.",
    )
    policies: list[str] = Field(
        ["content", "vllm", "vllm-0.23"],
        min_length=1,
        description="Simulated policies: content, vllm, vllm-0.23, sglang (SGLang's token pool at N·b tokens: the "
        "same memory as N blocks; simulated per capacity at --sglang-points of the grid, no one-pass curve exists).",
    )
    page_size: int | None = Field(None, ge=1, le=2**16, description="sglang: tokens per page, 1–65,536; default 1.")
    evict_policy: str | None = Field(
        None, description="sglang: lru (default) | fifo | mru | filo | lfu | slru | priority | tlru."
    )
    sglang_cache: str | None = Field(
        None, description="sglang: SGLang's cache class, unified (UnifiedRadixCache, default) | radix (RadixCache)."
    )
    tlru_threshold: int | None = Field(
        None,
        ge=0,
        le=2**40,
        description="--evict-policy tlru: T-LRU threshold − next-prompt estimate (tokens); default 0.",
    )
    sglang_points: int | None = Field(
        None, ge=2, le=100_000, description="sglang: capacities of the grid simulated (log-spaced subset); default 24."
    )
    model: str = Field("qwen3-8b", description="Model behind the GiB axis (preset or config.json).")
    block_size: int | None = Field(
        None, ge=1, le=2**16, description="Tokens per block, 1–65,536; default: the trace's, else 128."
    )
    plot: Path | None = Field(None, description="Write PREFIX.png and PREFIX.svg.")
    warmup: int | None = Field(
        None,
        ge=0,
        description="Warm-up conversations; ≥ 0; default: the trace's n_warm (spec: sized with "
        "--conversations, else 20% of it).",
    )
    estimates: bool = Field(True, description="Also compute the estimators' curves.")
    kv_gb: float | None = Field(
        None, gt=0, le=2**20, description="KV budget in GiB of --model, marked on the plot; (0, 2^20]."
    )
    sharegpt: bool = Field(
        False, description="Workload: the bundled ShareGPT trace of `kvhit trace sharegpt` (defaults), built once."
    )
    sample_rate: float | None = Field(
        None,
        gt=0,
        le=1,
        description="SHARDS sampling rate in (0, 1]: curves from the blocks (vLLM) / conversations (Algorithm 1) whose "
        "salted hash falls below the rate, capacities scaled by it (kvhit.sim.sampled, docs/sampling.md); --trace is "
        "then streamed from Parquet in bounded memory; no estimators; default: exact curves.",
    )
    sample_salt: int = Field(
        0,
        ge=0,
        le=2**62,
        description="Hash salt of --sample-rate (another salt: another sample); integer ≥ 0; default: 0.",
    )
    sample_estimator: Literal["deblurred", "step", "stratified"] | None = Field(
        None,
        description="How --sample-rate's vLLM curves are read from the sample (kvhit.sim.sampled_estimate, "
        "docs/sampling.md): deblurred (each sampled threshold a ramp over its 1/R lattice step, then one "
        "deconvolution step for the binomial blur; the default for a streamed --trace), step (SHARDS as "
        "published: a staircase of pitch 1/R) or stratified (--blocks-trace only, and its default: post-stratified "
        "by the exact reuse gap of every lookup, ratio thresholds, jackknife band; kvhit.sim.sampled_strata, "
        "docs/sampling.md §5).",
    )


class CurveResponse(Response):
    """The answer of ``kvhit curve`` (``--json`` prints it; strict JSON, ``null`` where a number is undefined)."""

    N: list[int] = Field(description="Capacities (blocks).")
    feasible: list[bool] | None = Field(None, description="N ≥ the largest request (vLLM can serve it).")
    N_min: int | None = Field(None, description="Largest request in blocks (vLLM refuses it below).")
    budget_N: int | None = Field(None, description="The --kv-gb budget in blocks of --model.")
    grid: str = Field("log", description="log: capacities log-spaced; list: the request's own capacities.")
    model: str = Field(description="Model behind the GiB axis.")
    refused_request_share: list[float] | None = Field(None, description="Share of requests vLLM refuses at N.")
    refused_token_share: list[float] | None = Field(None, description="Share of prompt tokens refused at N.")
    describe: dict[str, Any] | None = Field(None, description="Production trace summary (--blocks-trace).")
    curves: dict[str, list[float | None]] = Field(description="Hit ratio per capacity, by source.")
    h_max: float | None
    lam0: float | None = Field(description="λ0 (1/s); null for a production trace.")
    bytes_per_block: int
    block_size: int | None = Field(None, description="Tokens per block of the curve's N (the workload's).")
    figures: list[str] = Field(default_factory=list)
    sample_rate: float | None = Field(None, description="SHARDS sampling rate (null: exact curves).")
    sample_salt: int | None = Field(None, description="Hash salt of the sample.")
    sample_estimator: str | None = Field(None, description="How the sampled vLLM curves were read (null: exact).")
    sample: dict[str, Any] | None = Field(None, description="Sample sizes: kept accesses and lookups per engine.")
    stationarity: dict[str, Any] | None = Field(
        None,
        description="Whether the measured window reached steady state (active conversations over time, "
        "kvhit.workload.stationarity); null where not judged (a production block-id trace).",
    )
    notes: list[str] = Field(default_factory=list, description="Warnings: a window that did not reach steady state.")

    def to_jsonable(self) -> Any:
        """Flat, as before the service layer: {"N": [...], "<curve label>": [...], "h_max": …}."""
        d = super().to_jsonable()
        curves = d.pop("curves")
        return {"N": d.pop("N"), **curves, **d}


def _grid(n_min: int, hi: int, points: int, flag: str) -> np.ndarray:
    if hi <= n_min:
        raise InputError(f"{flag}: {hi:,} must be larger than --n-min {n_min:,}")
    return np.unique(np.geomspace(n_min, hi, points).astype(np.int64))


def _explicit(req: CurveRequest) -> np.ndarray:
    """The request's own capacities (sorted, distinct); the log-grid fields must then be left at their defaults."""
    if req.n_max is not None or "n_min" in req.model_fields_set or "points" in req.model_fields_set:
        raise InputError("capacities: give exact capacities or a log grid (--n-min/--n-max/--points), not both")
    return np.unique(np.asarray(req.capacities, dtype=np.int64))


def _curve_keys(data: dict) -> list[str]:
    """The hit-ratio lines of a curve result (float arrays over N, not the refused shares or token duplicates)."""
    return [
        k
        for k, v in data.items()
        if isinstance(v, np.ndarray)
        and v.dtype.kind == "f"
        and k != "N"
        and not k.startswith("refused")
        and not k.endswith("token ratio")
        and not k.startswith("band ")
    ]


def _bands(data: dict, Ns: np.ndarray) -> dict:
    """The shaded bands of a plot: ``{label: (N, low, high)}`` from the ``band low: label`` / ``band high: label``
    series of a curve result."""
    lo = "band low: "
    return {k[len(lo) :]: (Ns, v, data["band high: " + k[len(lo) :]]) for k, v in data.items() if k.startswith(lo)}


def _sglang_line(ts, Ns: np.ndarray, b: int, page: int, evict: str, mask, req) -> np.ndarray:
    """SGLang's token hit ratio at ``N·b`` tokens (rounded down to pages) for a log-spaced subset of the grid
    (``--sglang-points``), NaN elsewhere and where a request would not fit the pool: one simulation per capacity
    (no inclusion property, :mod:`kvhit.sim.sglang.run`), in parallel threads."""
    from kvhit.service.engines import sglang_model, sglang_tokens
    from kvhit.sim.sglang.run import radix_curve

    k = min(req.sglang_points or 24, Ns.size)
    idx = np.unique(np.round(np.linspace(0, Ns.size - 1, k)).astype(np.int64))  # Ns is log-spaced already
    Cs = np.array([max(sglang_tokens(int(n), b, page), page) for n in Ns[idx]], np.int64)
    out = np.full(Ns.shape, np.nan)
    model = sglang_model(req, evict)
    out[idx] = radix_curve(ts, Cs, page_size=page, evict_policy=evict, mask=mask, **model)["token_hit_ratio"]
    return out


def _colocated_line(rq, Ns: np.ndarray, mask) -> np.ndarray:
    """vLLM (≥ 0.24) keeping the response KV (Remark B.1), as SGLang does: its exact token hit ratio at every
    capacity (one threshold pass, :func:`kvhit.sim.vllm.curve.block_curve`), NaN where a request cannot fit."""
    from kvhit.sim.vllm.curve import block_curve

    c = block_curve(
        rq.prompt_tokens,
        rq.hash_offsets,
        rq.hashes,
        block_size=rq.block_size,
        Ns=Ns,
        engine="vllm",
        colocated=True,
        response_tokens=rq.response_tokens,
        mask=mask,
        fallback="infeasible",
    )
    return np.asarray(c["token_hit_ratio"], float)


def _lines(data: dict, Ns: np.ndarray) -> dict:
    """Plot lines; with the SGLang line, vLLM's token-ratio lines replace its block-weighted ones (one metric on
    one plot) and the SGLang line is drawn through its simulated capacities only."""
    keys = _curve_keys(data)
    if SGLANG_LABEL not in data:
        return {k: (Ns, data[k]) for k in keys}
    lines = {}
    for k in keys:
        if k == SGLANG_LABEL:
            ok = np.isfinite(data[k]) | np.isnan(data[k])
            sim = np.flatnonzero(ok & ~np.isnan(data[k]))
            lines[k] = (Ns[sim], data[k][sim])
        elif k.startswith("estimate"):
            continue  # block-weighted estimators: not on a token-ratio plot
        elif k + " token ratio" in data:
            lines[k.replace("(block cache)", "prefill-only (responses not cached) token hit ratio")] = (
                Ns,
                data[k + " token ratio"],
            )
        elif "Algorithm 1" in k:
            continue
        else:
            lines[k] = (Ns, data[k])
    return lines


def _split_curves(data: dict, model: str, grid: str = "log") -> CurveResponse:
    sample = data.pop("sample", None)
    Ns = data.pop("N")
    feasible = data.pop("feasible", None)
    refused_r = data.pop("refused_request_share", None)
    refused_t = data.pop("refused_token_share", None)
    curves = {k: v for k, v in data.items() if isinstance(v, np.ndarray)}
    return CurveResponse(
        grid=grid,
        model=model,
        describe=data.get("describe"),
        refused_request_share=None if refused_r is None else [float(x) for x in refused_r],
        refused_token_share=None if refused_t is None else [float(x) for x in refused_t],
        N=[int(x) for x in Ns],
        feasible=None if feasible is None else [bool(x) for x in feasible],
        N_min=None if not data.get("N_min") else int(data["N_min"]),
        budget_N=data.get("budget_N"),
        curves={k: [float(x) for x in v] for k, v in curves.items()},
        h_max=float(data["h_max"]),
        lam0=None if data.get("lam0") is None or not np.isfinite(data["lam0"]) else float(data["lam0"]),
        bytes_per_block=int(data["bytes_per_block"]),
        block_size=None if data.get("block_size") is None else int(data["block_size"]),
        figures=[str(f) for f in data.get("figures", [])],
        sample_rate=data.get("sample_rate"),
        sample_salt=data.get("sample_salt"),
        sample_estimator=data.get("sample_estimator"),
        sample=sample,
        stationarity=data.get("stationarity"),
        notes=steady_note(data.get("stationarity")),
    )


def curve(req: CurveRequest, progress=None) -> CurveResponse:
    """``kvhit curve``: cross-field checks and output paths first, then the library; refused input raises
    :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    from kvhit.plan import hardware, model_config

    if req.sharegpt:
        check_sharegpt_alone(req)
        source = "sharegpt"
    else:
        source = req.check_sources()
    check_output_file(req.plot, "--plot", (".png", ".svg"))
    bad = sorted(set(req.policies) - set(POLICIES))
    if bad:
        raise InputError(f"--policies: unknown {bad} (content, vllm, vllm-0.23, sglang)")
    sglang = "sglang" in req.policies
    if not sglang and req.sglang_points is not None:
        raise InputError("--sglang-points: applies to --policies ... sglang")
    from kvhit.service.engines import check_sglang_flags

    page, evict = check_sglang_flags(req, sglang, where="--policies ... sglang")
    if sglang:
        from kvhit.service.engines import sglang_model

        sglang_model(req, evict)  # refuse bad combinations before any work
    block_policies = tuple(x for x in req.policies if x != "sglang")
    if source != "spec" and req.conversations is not None:
        raise InputError("--conversations: applies to a spec (a trace file is used as it is)")
    with translating("--model"):
        model = model_config.resolve_model(req.model)
    if req.sample_rate is not None:
        if req.sample_estimator is None:  # the held-out winner where it applies (docs/sampling.md §5)
            req = req.model_copy(update={"sample_estimator": "stratified" if source == "blocks" else "deblurred"})
        return _sampled(req, source, model, block_policies)
    for f, flag in (("sample_salt", "--sample-salt"), ("sample_estimator", "--sample-estimator")):
        if f in req.model_fields_set:
            raise InputError(f"{flag}: applies with --sample-rate")
    if source == "blocks":
        if req.warmup is not None:
            raise InputError("--warmup: a production trace has no conversation warm-up")
        pt = read_blocks_trace(req.blocks_trace, req.arrival, req.rate, req.span, req.seed)
        d = pt.describe()
        hi = req.n_max or int(4 * d.get("distinct_blocks", d["min_N"] * 10))
        Ns = _explicit(req) if req.capacities else _grid(req.n_min, hi, req.points, "--n-max")
        check_capacity_memory(int(Ns.max()), "--n-max")
        from kvhit.sim.tracerun import ENGINE_LABELS, production_curve

        engines = tuple(e for e in ENGINE_LABELS if e in req.policies or not sglang)
        with translating(f"--blocks-trace {req.blocks_trace}"):
            c = production_curve(pt, Ns, engines)
        feas = c["feasibility"]
        data: dict[str, Any] = {"N": Ns}
        for e in engines:
            data[f"{ENGINE_LABELS[e]} token hit ratio"] = c["engines"][e]["token_hit_ratio"]
        if sglang:
            from kvhit.sim.sglang.streams import streams_from_production
            from kvhit.sim.tracerun import measured_mask

            with translating(f"--blocks-trace {req.blocks_trace}"):
                m = measured_mask(pt, None)
                data[COLOCATED_LABEL] = _colocated_line(pt.to_block_requests(colocated=True), Ns, m)
                data[SGLANG_LABEL] = _sglang_line(streams_from_production(pt), Ns, pt.block_size, page, evict, m, req)
        if req.estimates:  # the agentic estimator's curves beside the simulated ones (NaN where infeasible)
            from kvhit.service.trace_estimate import agentic_lines

            with translating(f"--blocks-trace {req.blocks_trace}"):
                data.update(agentic_lines(pt, Ns, feas.feasible))
        data["h_max"] = c["h_max"]
        data["lam0"] = None
        data["N_min"] = feas.N_min
        data["feasible"] = feas.feasible
        data["refused_request_share"] = feas.refused_requests
        data["refused_token_share"] = feas.refused_tokens
        data["describe"] = d
        data["bytes_per_block"] = model.bytes_per_block(pt.block_size)
        data["block_size"] = int(pt.block_size)
        if req.kv_gb is not None:
            data["budget_N"] = int(hardware.blocks_from_bytes(hardware.gb_to_bytes(req.kv_gb), data["bytes_per_block"]))
        if req.plot is not None:
            from kvhit.plots.curves import plot_curves

            req.plot.parent.mkdir(parents=True, exist_ok=True)
            lines = _lines(data, Ns)
            bands = _bands(data, Ns)
            data["figures"] = plot_curves(
                lines,
                str(req.plot),
                h_max=data["h_max"],
                bytes_per_block=data["bytes_per_block"],
                model=model.name,
                log_x=True,
                N_min=feas.N_min,
                budget_N=data.get("budget_N"),
                title=f"{Path(req.blocks_trace).name} ({pt.format}): {'vLLM/SGLang' if sglang else 'vLLM'} token hit "
                "ratio vs capacity "
                f"(b = {pt.block_size}, {model.name} KV)",
                bands=bands,
            )
        return _split_curves(data, model.name, "list" if req.capacities else "log")

    sp = None
    if source == "trace":
        tr = read_trace(req.trace)
        if req.block_size or tr.block_size is None:
            tr.meta["block_size"] = req.block_size or 128
        window = window_for(tr, req.warmup, None, str(req.trace))
    elif source == "sharegpt":
        with translating("ShareGPT"):
            tr = bundled_sharegpt(req.block_size)
        window = window_for(tr, req.warmup, None, "ShareGPT")
    else:
        from kvhit.workload import Window, generate

        sp = load_spec(req)
        if req.conversations is None:  # sized from the spec: warm-up and window in conversation lifetimes
            measured, n_warm = size_spec(sp, None, req.warmup)
            conversations = measured + n_warm
        else:
            conversations = req.conversations
            n_warm = req.warmup if req.warmup is not None else conversations // 5
            check_trace_memory(conversations, float(sp.M.mean), "--conversations")
        if n_warm >= conversations:
            raise InputError(f"--warmup: {n_warm:,} warm-up conversations leave none of {conversations:,} to measure")
        with translating(str(req.spec) if req.spec else "spec"):
            tr = generate(sp, req.seed, n_conversations=conversations)
        tr.meta.update(n_warm=n_warm, block_size=req.block_size or 128)
        window = Window.warmup_conversations(tr, n_warm) if n_warm > 0 else Window.all()
    from kvhit.experiments.curve import curve_data, curve_inputs, default_capacity_range

    cb = progress or (lambda done, total, what=None: None)
    b = tr.block_size or 128
    bpb = model.bytes_per_block(b)
    with translating("ShareGPT" if req.sharegpt else str(req.trace or req.spec or "spec")):
        inp = curve_inputs(tr, window, block_policies, progress=cb)
        if req.capacities:
            Ns = _explicit(req)
        else:
            if req.n_max:
                hi = req.n_max
            else:  # the saturation rule needs a block curve: with sglang alone, vLLM's thresholds set the range
                rng = inp if block_policies else curve_inputs(tr, window, ("vllm",))
                hi = default_capacity_range(rng, req.n_min)[1]
            Ns = _grid(req.n_min, hi, req.points, "--n-max" if req.n_max else "--n-min")
        if req.estimates or any(p != "content" for p in req.policies):
            check_capacity_memory(int(Ns.max()), "--n-max")
        data = curve_data(tr, Ns, window, policies=block_policies, estimates=req.estimates, inputs=inp, progress=cb)
        if sglang:
            from kvhit.sim.sglang.streams import streams_from_trace

            if "response_tokens" in tr.cols:
                from kvhit.sim.runner import block_requests

                data[COLOCATED_LABEL] = _colocated_line(block_requests(tr, colocated=True), Ns, inp.mask)
            cb(0, 1, "SGLang radix cache: one simulation per capacity")
            data[SGLANG_LABEL] = _sglang_line(streams_from_trace(tr, block_size=b), Ns, b, page, evict, inp.mask, req)
    data["bytes_per_block"] = bpb
    data["block_size"] = int(b)
    st = steady_report(tr, inp.mask, sp if source == "spec" else None)
    data["stationarity"] = st
    if req.plot is not None and not st["stationary"]:
        data["warning"] = "NOT STATIONARY: the measured window did not reach steady state"
    if inp.requests is not None:  # refused shares where vLLM cannot serve the workload (sim/feasibility)
        from kvhit.sim.feasibility import feasibility

        f = feasibility(inp.requests.prompt_tokens, inp.requests.block_size, Ns, mask=inp.mask)
        data["refused_request_share"] = f.refused_requests
        data["refused_token_share"] = f.refused_tokens
    budget = None
    if req.kv_gb is not None:
        budget = int(hardware.blocks_from_bytes(hardware.gb_to_bytes(req.kv_gb), bpb))
        data["budget_N"] = budget
    if req.plot is not None:
        from kvhit.plots.curves import plot_curves

        req.plot.parent.mkdir(parents=True, exist_ok=True)
        lines = _lines(data, Ns)
        data["figures"] = plot_curves(
            lines,
            str(req.plot),
            h_max=None if sglang else data["h_max"],  # the paper's ceiling is for prefill-only block caches
            bytes_per_block=bpb,
            model=model.name,
            budget_N=budget,
            N_min=data.get("N_min") or None,
            warning=data.get("warning"),
            title=f"{'token ' if sglang else ''}hit ratio vs capacity (λ0 = {data['lam0']:.3g}/s, b = {b}, "
            f"{model.name} KV)",
        )
    return _split_curves(data, model.name, "list" if req.capacities else "log")


def _sampled(req: CurveRequest, source: str, model, block_policies: tuple[str, ...]) -> CurveResponse:
    """``--sample-rate``: SHARDS curves (:mod:`kvhit.experiments.sampled_curve`), a Parquet trace streamed."""
    from kvhit.experiments.sampled_curve import (
        SE_BAND,
        curves_from_sampled,
        sampled_curve_from_parquet,
        sampled_production_curve,
    )
    from kvhit.plan import hardware

    if source not in ("trace", "blocks"):
        raise InputError(
            "--sample-rate: samples a --trace (Parquet, streamed) or a --blocks-trace; write a spec's or ShareGPT's "
            "trace first (kvhit trace generate / sharegpt -o FILE)"
        )
    if "sglang" in req.policies:
        raise InputError("--sample-rate: no sampled SGLang curve (drop sglang from --policies)")
    if req.capacities and (req.n_max is not None or "points" in req.model_fields_set):
        raise InputError("capacities: give exact capacities or a log grid (--n-min/--n-max/--points), not both")
    rate, salt = float(req.sample_rate), int(req.sample_salt)
    if source == "trace":
        from kvhit.workload.chunks import trace_block_size

        path = req.trace
        if path.is_dir() or path.suffix in (".json", ".jsonl"):
            raise InputError(f"--trace {path}: reads kvhit Parquet traces; use --blocks-trace for this file")
        if req.sample_estimator == "stratified":
            raise InputError(
                f"--sample-estimator {req.sample_estimator}: needs --blocks-trace (a streamed trace has no gaps)"
            )
        b = int(req.block_size or trace_block_size(path) or 128)
        with translating(f"--trace {path}"):
            n_warm = req.warmup if req.warmup is not None else _parquet_n_warm(path)
            data = sampled_curve_from_parquet(
                path,
                rate=rate,
                salt=salt,
                policies=tuple(req.policies),
                block_size=b,
                n_warm=n_warm,
                Ns=np.unique(np.asarray(req.capacities, np.int64)) if req.capacities else None,
                n_min=req.n_min,
                n_max=req.n_max,
                points=req.points,
                estimator=req.sample_estimator,
            )
        data["lam0"] = _parquet_meta(path).get("lam0")
    else:
        if not [p for p in req.policies if p != "content"]:
            raise InputError("--policies content: a production trace has no conversation sizes; use vllm, vllm-0.23")
        if req.warmup is not None:
            raise InputError("--warmup: a production trace has no conversation warm-up")
        pt = read_blocks_trace(req.blocks_trace, req.arrival, req.rate, req.span, req.seed)
        b = pt.block_size
        from kvhit.experiments.sampled_curve import default_n_max
        from kvhit.sim.tracerun import measured_mask

        engines = tuple(p for p in block_policies if p != "content")
        with translating(f"--blocks-trace {req.blocks_trace}"):
            blocks = sampled_production_curve(
                pt, rate=rate, salt=salt, engines=engines, mask=measured_mask(pt, None),
                gaps=req.sample_estimator == "stratified",
            )  # fmt: skip
        if req.capacities:
            Ns = np.unique(np.asarray(req.capacities, np.int64))
        else:
            Ns = _grid(req.n_min, req.n_max or default_n_max(blocks, None, req.n_min), req.points, "--n-max")
        data = curves_from_sampled(Ns, blocks, None, rate, req.sample_estimator)
        data["sample"] = {
            e: {"kept_accesses": x.sampled_accesses, "kept_lookups": x.sampled_lookups, "lookups": x.lookup_blocks}
            for e, x in blocks.items()
        }
        data["lam0"] = None
        data["describe"] = pt.describe()
    data["bytes_per_block"] = model.bytes_per_block(b)
    data["block_size"] = int(b)
    data["sample_rate"] = rate
    data["sample_salt"] = salt
    data["sample_estimator"] = req.sample_estimator
    data.pop("events", None)
    if data.get("feasible") is None:
        data.pop("feasible", None)
    Ns = data["N"]
    if req.kv_gb is not None:
        data["budget_N"] = int(hardware.blocks_from_bytes(hardware.gb_to_bytes(req.kv_gb), data["bytes_per_block"]))
    if req.plot is not None:
        from kvhit.plots.curves import plot_curves

        req.plot.parent.mkdir(parents=True, exist_ok=True)
        data["figures"] = plot_curves(
            {k: (Ns, data[k]) for k in _curve_keys(data)},
            str(req.plot),
            bands=_bands(data, Ns),
            band_label=f"± {SE_BAND:g} standard errors of the sample",
            h_max=None,
            bytes_per_block=data["bytes_per_block"],
            model=model.name,
            budget_N=data.get("budget_N"),
            N_min=data.get("N_min") or None,
            title=f"sampled hit ratio vs capacity (SHARDS, rate {rate:g}, salt {salt}; b = {b}, {model.name} KV)",
        )
    return _split_curves(data, model.name, "list" if req.capacities else "log")


def _parquet_meta(path: Path) -> dict:
    import json

    import pyarrow.parquet as pq

    raw = (pq.ParquetFile(path).schema_arrow.metadata or {}).get(b"kvhit")
    return json.loads(raw) if raw else {}


def _parquet_n_warm(path: Path) -> int:
    """The trace's ``n_warm`` (its warm-up conversations), 0 when it records none."""
    return int(_parquet_meta(path).get("n_warm") or 0)
