"""``plan``: (a) h at the KV memory available, (b) the KV memory for a target h, (c) the largest λ0 keeping the
target, (d) prefill tokens saved per second; ``compare`` another engine at the same capacity, ``verify`` by
exact simulation.

Invariant: the question answered is the one asked — the metric is the engine's (vLLM: tokens by default;
Algorithm 1 and the paper's estimator are block-weighted, and asking them for tokens is refused), a target is in
(0, 1), a verified capacity fits in memory. NOT modelled here: the predictors and the bisections
(``kvhit.plan.planner``).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field

from kvhit.service.base import Response, check_capacity_memory
from kvhit.service.common import Seed
from kvhit.service.engines import check_sglang_flags, sglang_model
from kvhit.service.errors import InputError, translating
from kvhit.service.inputs import read_blocks_trace, read_trace
from kvhit.service.kv import HardwareFields
from kvhit.service.simulate import BlocksTraceFields
from kvhit.service.spec import load_spec, spec_flags_given
from kvhit.service.traces import bundled_sharegpt, check_sharegpt_alone

__all__ = ["PlanRequest", "PlanResponse", "plan"]

PlanEngine = Literal["vllm", "vllm-0.23", "content", "paper"]


class PlanRequest(BlocksTraceFields, HardwareFields):
    """The inputs of ``kvhit plan``, validated: each field's description states its unit, range and default."""

    target: float | None = Field(None, gt=0, lt=1, description="Target hit ratio; in (0, 1); default: none.")
    engine: PlanEngine = Field(
        "vllm", description="Predictor: vllm (≥ 0.24) | vllm-0.23 | content (Algorithm 1) | paper (eq. 39)."
    )
    metric: Literal["tokens", "blocks"] | None = Field(
        None, description="tokens (vLLM's prefix_cache_hits/queries) | blocks; default: tokens for vLLM, else blocks."
    )
    compare: PlanEngine | Literal["sglang"] | None = Field(
        None,
        description="Another engine to compare at the same capacity; sglang: both vLLM and SGLang simulated at the "
        "same KV bytes, with the difference and its CI.",
    )
    page_size: int | None = Field(
        None, ge=1, le=2**16, description="--compare sglang: tokens per page, 1–65,536; default 1."
    )
    evict_policy: str | None = Field(
        None, description="--compare sglang: lru (default) | fifo | mru | filo | lfu | slru | priority | tlru."
    )
    sglang_cache: str | None = Field(
        None,
        description="--compare sglang: SGLang's cache, unified (UnifiedRadixCache, default) | radix (RadixCache).",
    )
    tlru_threshold: int | None = Field(
        None,
        ge=0,
        le=2**40,
        description="--evict-policy tlru: T-LRU threshold − next-prompt estimate (tokens); default 0.",
    )
    verify: bool = Field(False, description="Check (a) by exact simulation of the engine.")
    seed: Seed = 0
    scale: float | None = Field(
        None,
        gt=0,
        le=1e6,
        description="--blocks-trace: plan a stationary stream at this multiple of the trace's rate; (0, 10^6].",
    )
    replications: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="--blocks-trace with --lam0/--scale: resampled replications; 1–10,000; default 5.",
    )
    conversations: int | None = Field(
        None,
        ge=1,
        le=10**7,
        description="--blocks-trace resampling: conversations per replication; 1–10^7; default 200.",
    )
    sharegpt: bool = Field(
        False, description="Workload: the bundled ShareGPT trace of `kvhit trace sharegpt` (defaults), built once."
    )

    FLAGS = {**BlocksTraceFields.FLAGS, **HardwareFields.FLAGS}


class PlanResponse(Response):
    """The answer of ``kvhit plan`` (``--json`` prints it; strict JSON, ``null`` where a number is undefined)."""

    workload: str
    estimator: str
    metric: str
    lam0: float | None = Field(description="Conversation rate λ0 (1/s); null where undefined (one conversation).")
    h_max: float | None
    capacity: dict[str, Any] | None = None
    h_at_capacity: float | None = None
    target: float | None = None
    N_for_target: int | None = None
    gib_for_target: float | None = None
    lam0_max_for_target: float | None = None
    saved_prefill_tokens_per_s: float | None = None
    saved_fraction: float | None = None
    verify: dict[str, Any] = Field(default_factory=dict)
    compare: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    N_min: int | None = Field(None, description="Largest request (blocks): smaller capacities cannot serve it.")
    feasible: bool | None = Field(None, description="The capacity is ≥ N_min (null: no capacity asked).")
    refused_request_share: float | None = None
    refused_token_share: float | None = None
    answered_by: str = Field("estimator", description="estimator | replay (exact) | resample (exact, at λ0).")
    h_band: list[float] | None = Field(
        None, description="Block-id trace: [h_lo, h_hi] at the capacity, band for one realisation of the start times."
    )
    band_level: float | None = Field(None, description="Level of h_band and of N_for_target_confident.")
    N_for_target_confident: int | None = Field(None, description="Smallest N whose band's lower end reaches target.")
    gib_for_target_confident: float | None = None


def _metric(engine: str, metric: str | None) -> str:
    if engine in ("paper", "content"):
        if metric == "tokens":
            raise InputError(f"--metric tokens: the {engine} predictor is block-weighted; use --metric blocks")
        return "blocks"
    return metric or "tokens"


def _capacity(req: PlanRequest, block_size: int):
    from kvhit.plan.planner import capacity

    with translating("--gpu" if req.accelerator else "--kv-gb"):
        cap = capacity(
            req.model,
            accelerator=req.accelerator,
            kv_gb=req.kv_gb,
            block_size=block_size,
            dtype=req.dtype,
            tp=req.tp,
            gpu_memory_utilization=req.util,
        )
    if cap.N < 1:
        raise InputError(f"{req.flag('accelerator' if req.accelerator else 'kv_gb')}: no KV block fits (N = 0)")
    check_capacity_memory(cap.N, "--gpu" if req.accelerator else "--kv-gb")
    return cap


def _plan_blocks_trace(req: PlanRequest) -> PlanResponse:
    """Plan from a production block-id trace: replay at its own load, or resample-and-simulate at --lam0/--scale
    (``kvhit.plan.planner.plan_production``)."""
    from kvhit.plan.planner import plan_production

    if req.trace is not None or req.spec is not None or req.compare is not None:
        raise InputError("--blocks-trace: not with --trace, --spec or --compare")
    extra = spec_flags_given(req, exclude=("lam0",))
    if extra:
        raise InputError(f"{extra[0]}: applies to a spec, not to --blocks-trace (it would be ignored)")
    if req.lam0 is not None and req.scale is not None:
        raise InputError("--lam0 and --scale: give at most one")
    if req.lam0 is None and req.scale is None:
        for name in ("replications", "conversations"):
            if getattr(req, name) is not None:
                raise InputError(f"{req.flag(name)}: applies to resampling (--lam0 or --scale), not to a replay")
    has_cap = req.accelerator is not None or req.kv_gb is not None
    if not has_cap and req.target is None:
        raise InputError("nothing to plan: give --gpu or --kv-gb, and/or --target")
    if req.engine not in ("vllm", "vllm-0.23"):
        raise InputError(f"--engine {req.engine}: a block-id trace is planned for vllm or vllm-0.23")
    pt = read_blocks_trace(req.blocks_trace, req.arrival, req.rate, req.span, req.seed)
    cap = _capacity(req, pt.block_size) if has_cap else None
    with translating(f"--blocks-trace {req.blocks_trace}"):
        res = plan_production(
            pt,
            cap,
            target=req.target,
            engine=req.engine,
            metric=req.metric or "tokens",
            lam0=req.lam0,
            scale=req.scale,
            verify=req.verify,
            replications=req.replications or 5,
            n_conversations=req.conversations or 200,
            seed=req.seed,
        )
    return PlanResponse(**res.to_dict())


def plan(req: PlanRequest) -> PlanResponse:
    """``kvhit plan``: cross-field checks and output paths first, then the library; refused input raises
    :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    req.check_one_budget()
    if req.compare == "sglang":
        return _plan_compare_sglang(req, _plan_blocks_trace, _plan)
    check_sglang_flags(req, False, where="--compare sglang")
    return _plan(req)


def _plan(req: PlanRequest) -> PlanResponse:
    from kvhit.plan.planner import make_workload
    from kvhit.plan.planner import plan as plan_fn

    if req.sharegpt:
        check_sharegpt_alone(req, allow=("lam0",))
    if req.blocks_trace is not None:
        return _plan_blocks_trace(req)
    for name in ("scale", "replications", "conversations"):
        if getattr(req, name) is not None:
            raise InputError(f"{req.flag(name)}: applies to --blocks-trace")
    if req.arrival != "sequential" or req.rate is not None or req.span is not None:
        raise InputError("--arrival/--rate/--span: apply to --blocks-trace (WEKA)")
    req.check_source(allow_with_trace=("lam0",))
    has_cap = req.accelerator is not None or req.kv_gb is not None
    if not has_cap and req.target is None:
        raise InputError("nothing to plan: give --gpu or --kv-gb, and/or --target")
    if req.compare is not None and not has_cap:
        raise InputError("--compare: needs a capacity (--gpu or --kv-gb)")
    if req.verify and not has_cap:
        raise InputError("--verify: needs a capacity (--gpu or --kv-gb)")
    metric = _metric(req.engine, req.metric)
    if req.verify and req.trace is None and not req.sharegpt and req.engine == "paper":
        raise InputError("--verify: the paper's estimator on a spec has no trace to simulate; give --trace or --engine")
    req.resolve()
    if req.compare is not None and req.compare in ("paper", "content") and metric == "tokens":
        raise InputError(
            f"--compare {req.compare}: it is block-weighted and cannot be compared in vLLM's token metric; "
            "add --metric blocks"
        )
    if req.sharegpt:
        with translating("ShareGPT"):
            source = bundled_sharegpt(req.block_size)
        where = "ShareGPT"
    elif req.trace is not None:
        source, where = read_trace(req.trace), f"--trace {req.trace}"
    else:
        source, where = load_spec(req), str(req.spec or "spec")
    cap = _capacity(req, req.block_size) if has_cap else None
    lam0 = req.lam0 if req.trace is not None or req.sharegpt else None
    from kvhit.workload.trace import Trace

    sizing = {}
    if req.verify and not isinstance(source, Trace):
        # the verifying simulation runs on the spec's sampled trace: sized from the spec to reach steady state
        # (never smaller than the estimator's own 20,000 + 5,000 conversations)
        from kvhit.service.steady import size_spec

        with translating(where):
            m, w = size_spec(source, None, None, "--verify")
        sizing = {"sample_conversations": max(m, 20_000), "n_warm": max(w, 5_000)}
    with translating(where):
        wl = make_workload(source, lam0=lam0, engine=req.engine, metric=metric, block_size=req.block_size, **sizing)
        res = plan_fn(wl, cap, target=req.target, verify=req.verify)
        if req.compare is not None:
            other = make_workload(
                source, lam0=lam0, engine=req.compare, metric=metric, block_size=req.block_size, **sizing
            )
            if res.h_at_capacity is None:  # infeasible capacity: no ratio to compare
                res.compare = {"engine": req.compare, "h_at_capacity": None, "gain": None}
            else:
                h_other = float(other.predict(np.array([float(cap.N)]), np.array([wl.lam0]))[0])
                res.compare = {"engine": req.compare, "h_at_capacity": h_other, "gain": res.h_at_capacity - h_other}
    if res.verify and wl.trace is not None:
        _verify_steady(res, wl.trace, None if isinstance(source, Trace) else source)
    return PlanResponse(**res.to_dict())


def _verify_steady(res, tr, spec) -> None:
    """Judge the window ``--verify`` simulated (the trace's conversations after its ``n_warm``, as
    :func:`kvhit.plan.planner._verify` measures): ``verify.stationarity``, and a NOT STATIONARY note when it was
    not at steady state (against λ0·(E[M]−1)·E[W] for a spec, the window's own median for a trace)."""
    from kvhit.service.steady import steady_note, steady_report
    from kvhit.workload.trace import Window

    nw = int(tr.meta.get("n_warm", 0))
    window = Window.warmup_conversations(tr, nw) if nw > 0 else Window.all()
    st = steady_report(tr, window.mask(tr), spec)
    res.verify["stationarity"] = st
    res.notes.extend(steady_note(st))


def _plan_compare_sglang(req, plan_blocks_trace, plan_rest):
    """``plan --compare sglang``: the engine's plan as usual (``plan_blocks_trace``/``plan_rest`` answer it
    without the comparison), plus both engines simulated at the same KV budget
    (:func:`kvhit.plan.sglang.compare_vllm_sglang`) in ``compare``."""
    from kvhit.plan.sglang import compare_vllm_sglang

    p, pol = check_sglang_flags(req, True)
    model = sglang_model(req, pol)
    if req.accelerator is None and req.kv_gb is None:
        raise InputError("--compare sglang: needs a KV budget (--gpu or --kv-gb)")
    if req.engine not in ("vllm", "vllm-0.23"):
        raise InputError(f"--compare sglang: compares simulated vLLM with SGLang; --engine {req.engine} is not vLLM")
    if req.blocks_trace is not None and (req.lam0 is not None or req.scale is not None):
        raise InputError("--compare sglang: compares on the trace as read (no --lam0/--scale resampling)")
    base = req.model_copy(
        update={"compare": None, "page_size": None, "evict_policy": None, "sglang_cache": None, "tlru_threshold": None}
    )
    if req.blocks_trace is not None:
        from kvhit.service.inputs import production_mask, read_blocks_trace

        res = plan_blocks_trace(base)
        source = read_blocks_trace(req.blocks_trace, req.arrival, req.rate, req.span, req.seed)
        mask = production_mask(source, None)
        b, where = source.block_size, f"--blocks-trace {req.blocks_trace}"
    else:
        from kvhit.service.inputs import read_trace, window_for
        from kvhit.service.traces import bundled_sharegpt

        res = plan_rest(base)
        if req.sharegpt:
            with translating("ShareGPT"):
                source = bundled_sharegpt(req.block_size)
            where = "ShareGPT"
        elif req.trace is not None:
            source, where = read_trace(req.trace), f"--trace {req.trace}"
        else:
            from kvhit.service.spec import load_spec
            from kvhit.workload import generate

            with translating(str(req.spec or "spec")):
                source = generate(load_spec(req), req.seed, n_conversations=6_000)
            source.meta.update(n_warm=1_000)
            where = str(req.spec or "spec")
            res.notes.append(
                "--compare sglang on a spec: one generated trace of 1,000 warm-up + 5,000 measured "
                f"conversations (seed {req.seed})"
            )
        b = int(req.block_size or source.block_size or 128)
        source.meta["block_size"] = b
        mask = window_for(source, None, None, where).mask(source)
    c = _capacity(req, b)
    bpt = c.bytes_per_block // b
    C = c.kv_bytes // bpt // p * p
    if C < p:
        raise InputError(f"{req.flag('kv_gb' if req.kv_gb is not None else 'accelerator')}: no SGLang page fits")
    with translating(where):
        res.compare = compare_vllm_sglang(
            source, c.N, C, mask=mask, engine=req.engine, page_size=p, evict_policy=pol, block_size=b, **model
        )
    res.compare["kv_gib"] = c.kv_bytes / 2**30
    res.notes.append(
        "--compare sglang: both engines simulated on the same requests at the same KV bytes (vLLM blocks vs SGLang "
        "tokens); token hit ratios with 95% batch-means CIs, the difference paired per batch"
    )
    return res
