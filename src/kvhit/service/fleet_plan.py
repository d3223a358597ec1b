"""``fleet plan`` and ``fleet curve``: replicas (or HBM per replica) for a target hit ratio per router, with the
prefill compute saved in tokens and GPU-seconds; hit ratio against load imbalance as a KV router's load weight
varies (:mod:`kvhit.fleet.plan`, every number an exact fleet simulation).

Invariant: the question answered is the one asked — a target in (0, 1); one capacity source per replica (``--N``,
``--gpu`` or ``--kv-gb``) for ``--vary replicas``, ``--replicas`` for ``--vary hbm``; a flag that the question
would ignore is refused; ``fleet curve`` needs holds (``--prefill-tokens-per-s``: without them nothing is in
flight and a load weight changes nothing) and refuses a swept parameter also given as a fixed one. GPU-seconds are
``FLOPs / (peak × mfu)`` with ``mfu`` a stated assumption (:mod:`kvhit.plan.compute`). NOT modelled: see
:mod:`kvhit.fleet.plan` and :mod:`kvhit.fleet.simulate`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from kvhit.service.base import Response, check_capacity_memory
from kvhit.service.common import Capacity
from kvhit.service.errors import InputError, translating
from kvhit.service.fleet import (
    ROUTER_PARAMS,
    FleetWorkloadFields,
    RouterName,
    fleet_timing,
    load_fleet_workload,
    router_params,
    timing_echo,
)
from kvhit.service.steady import STEADY_WARNING, steady_note, steady_report

__all__ = [
    "FleetPlanRequest",
    "FleetPlanResponse",
    "fleet_plan",
    "FleetCurveRequest",
    "FleetCurveResponse",
    "fleet_curve",
    "CURVE_DEFAULTS",
]

#: router -> (default swept parameter (request field), its default values)
CURVE_DEFAULTS: dict[str, tuple[str, list[float]]] = {
    "dynamo": ("overlap_score_credit", [0, 0.25, 0.5, 1, 2, 4, 8, 16]),
    "llm-d": ("queue_weight", [0, 0.5, 1, 2, 4, 8, 16, 32]),
    "sglang": ("balance_abs_threshold", [0, 1, 2, 4, 8, 16, 32, 64]),
}
SWEEPABLE = {
    r: [f for f, (_, readers) in ROUTER_PARAMS.items() if r in readers and f not in ("kv_mode", "load_metric")]
    for r in CURVE_DEFAULTS
}


class _ComputeFields(FleetWorkloadFields):
    model: str = Field("qwen3-8b", description="Model preset (`kvhit kv --list`) or config.json: KV bytes and FLOPs.")
    accelerator: str | None = Field(
        None, description="Accelerator preset (H100, H200, B200, MI300X, Ascend-910B2): HBM and BF16 peak."
    )
    kv_dtype: str = Field("bf16", description="KV cache dtype: bf16 | fp16 | fp8 | fp32 | auto.")
    tp: int = Field(
        1, ge=1, le=4096, description="Tensor-parallel degree of a replica, 1–4096 (GPUs per replica); default 1."
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="With --gpu: fraction of HBM vLLM may use; in (0, 1]; default 0.9."
    )
    mfu: float = Field(
        0.5, gt=0, le=1, description="Fraction of the BF16 peak prefill achieves (an assumption); (0, 1]; 0.5."
    )
    peak_tflops: float | None = Field(
        None, gt=0, le=1e6, description="Accelerator dense BF16 peak, TFLOP/s, > 0; default: the --gpu preset's."
    )
    active_params: int | None = Field(
        None, ge=1, le=10**14, description="Per-token non-embedding parameters (for models not counted from config)."
    )

    FLAGS = {"blocks_trace": "--blocks-trace", "accelerator": "--gpu", "N": "--N"}


class FleetPlanRequest(_ComputeFields):
    """The inputs of ``kvhit fleet plan``, validated: each field's description states its unit, range and default
    ."""

    target: float = Field(gt=0, lt=1, description="Target fleet token hit ratio; in (0, 1); required.")
    router: Annotated[list[RouterName], Field(min_length=1, max_length=16)] = Field(
        ["round-robin", "session", "dynamo"],
        description="Routers (one or more) to plan for; repeat or comma-separate; default: round-robin, session, "
        "dynamo.",
    )
    vary: Literal["replicas", "hbm"] = Field(
        "replicas", description="replicas: smallest R at a given N | hbm: smallest N per replica at --replicas R."
    )
    N: Capacity | None = Field(
        None, description="--vary replicas: blocks per replica, ≥ 1; default: the KV budget of --gpu (or give --kv-gb)."
    )
    kv_gb: float | None = Field(None, gt=0, le=2**20, description="--vary replicas: KV GiB per replica (or --N).")
    replicas: int | None = Field(
        None, ge=1, le=4096, description="--vary hbm: the number of replicas R, 1–4096; required there."
    )
    max_replicas: int = Field(64, ge=1, le=4096, description="--vary replicas: largest R tried, 1–4096; default 64.")
    rtol: float = Field(0.02, ge=0, lt=1, description="--vary hbm: relative resolution of N; [0, 1); default 0.02.")
    lam0: float | None = Field(
        None, gt=0, le=1e9, description="Plan at this conversation rate (/s) by resampling whole conversations."
    )
    replications: int | None = Field(None, ge=1, le=100, description="--lam0: resampled streams; 1–100; default 3.")
    conversations: int | None = Field(
        None, ge=1, le=10**6, description="--lam0: measured conversations per stream, 1–10^6; default 1000."
    )

    FLAGS = {**_ComputeFields.FLAGS, "router": "--router", "lam0": "--lam0"}


class FleetPlanResponse(Response):
    """The answer of ``kvhit fleet plan`` (``--json`` prints it; strict JSON, ``null`` where a number is undefined)."""

    workload: str
    block_size: int
    engine: str
    target: float
    vary: str
    lam0: float | None
    capacity: dict[str, Any] = Field(description="Blocks per replica and where they came from (--vary replicas).")
    compute: dict[str, Any] = Field(description="FLOPs model, peak, mfu: how GPU-seconds are computed.")
    answers: list[dict[str, Any]] = Field(description="Per router: the smallest R (or N) reaching the target.")
    rows: list[dict[str, Any]] = Field(description="Every (router, R, N) simulated, with hit ratio and compute.")
    notes: list[str] = Field(default_factory=list)
    timing: dict[str, Any] = Field(
        default_factory=dict, description="The timing options of the holds (speeds, prefill_hold, hit_token_seconds)."
    )


def _compute(req: _ComputeFields, block_size: int) -> dict:
    from kvhit.plan import compute, model_config

    with translating("--model"):
        m = model_config.resolve_model(req.model)
    with translating("--active-params"):
        fl = compute.prefill_flops(m, req.active_params)
    try:
        bpb = m.bytes_per_block(block_size, req.kv_dtype, req.tp)
    except ValueError as e:
        raise InputError(f"{'--tp' if str(e).startswith('tp') else '--kv-dtype'}: {e}") from None
    peak = None
    if req.peak_tflops is not None or req.accelerator is not None:
        with translating("--gpu" if req.peak_tflops is None else "--peak-tflops"):
            peak = compute.peak_flops(req.accelerator, req.peak_tflops) * req.tp
    return {
        "model": m.name,
        "flops": fl,
        "bytes_per_block": int(bpb),
        "peak_flops_per_replica": peak,
        "gpu_flops": None if peak is None else peak * req.mfu / req.tp,
        "info": {
            "model": m.name,
            "linear_params_per_token": fl.linear_params,
            "flops_per_token_linear": 2.0 * fl.linear_params,
            "attention": f"2·{fl.heads}·({fl.d_qk}+{fl.d_v}) FLOPs per key per layer, causal context "
            f"({fl.full_layers} full layers"
            + (f", {fl.sliding_layers} sliding W={fl.window}" if fl.sliding_layers else "")
            + ")",
            "params_source": fl.source,
            "peak_tflops_per_gpu": None if peak is None else peak / req.tp / 1e12,
            "mfu": req.mfu,
            "mfu_note": "assumed fraction of peak, not measured",
            "tp": req.tp,
        },
    }


def _streams(req, wl, block_size: int):
    from kvhit.fleet.plan import stream_from_resample

    if req.lam0 is None:
        for name in ("replications", "conversations"):
            if getattr(req, name) is not None:
                raise InputError(f"{req.flag(name)}: applies to resampling at --lam0 (it would be ignored)")
        return [wl.stream], None
    from kvhit.sim.resample import conversation_pool, resample

    with translating("--lam0"):
        pool = conversation_pool(wl.source, block_size=block_size)
        out = [
            stream_from_resample(
                resample(pool, lam0=req.lam0, n_conversations=req.conversations or 1000, seed=req.seed + r)
            )
            for r in range(req.replications or 3)
        ]
    return out, float(req.lam0)


def _row(p, bpb: int | None = None) -> dict:
    d = p.to_dict()
    if bpb is not None:
        d["gib_per_replica"] = p.N * bpb / 2**30
    return d


def fleet_plan(req: FleetPlanRequest, progress=None) -> FleetPlanResponse:
    """``kvhit fleet plan``: cross-field checks and output paths first, then the library; refused input raises
    :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    from kvhit.fleet.plan import FleetPlanError, plan_capacity, plan_replicas
    from kvhit.plan import hardware

    if req.gpu_memory_utilization is not None and req.accelerator is None:
        raise InputError("--gpu-memory-utilization: applies to --gpu")
    if req.vary == "replicas":
        if req.replicas is not None:
            raise InputError("--replicas: applies to --vary hbm (--vary replicas searches R)")
        if req.N is not None and req.kv_gb is not None:
            raise InputError("--N and --kv-gb: give one capacity per replica, not both")
        if req.N is None and req.kv_gb is None and req.accelerator is None:
            raise InputError("--N, --kv-gb or --gpu: --vary replicas needs the capacity per replica")
    else:
        if req.replicas is None:
            raise InputError("--replicas: required with --vary hbm (the number of replicas)")
        for f in ("N", "kv_gb"):
            if getattr(req, f) is not None:
                raise InputError(f"{req.flag(f)}: --vary hbm finds the capacity per replica (it would be ignored)")
    params = router_params(req, list(req.router))
    fleet_timing(req, list(req.router))  # refused before the workload is read
    wl = load_fleet_workload(req)
    b = wl.stream.block_size
    comp = _compute(req, b)
    streams, lam0 = _streams(req, wl, b)
    for st in streams:
        tmg = fleet_timing(req, list(req.router), st)
    cap: dict[str, Any] = {}
    notes = list(wl.notes)
    if req.vary == "replicas":
        if req.N is not None:
            N, cap = int(req.N), {"N": int(req.N), "source": "--N"}
        else:
            with translating("--gpu" if req.accelerator else "--kv-gb"):
                if req.kv_gb is not None:
                    kv_bytes = hardware.gb_to_bytes(req.kv_gb)
                else:
                    kv_bytes = hardware.kv_budget_bytes(
                        req.accelerator, req.model, tp=req.tp,
                        gpu_memory_utilization=req.gpu_memory_utilization or hardware.DEFAULT_GPU_MEMORY_UTILIZATION,
                    )  # fmt: skip
            N = int(kv_bytes // comp["bytes_per_block"])
            if N < 1:
                raise InputError(f"{'--gpu' if req.accelerator else '--kv-gb'}: no KV block fits (N = 0)")
            cap = {"N": N, "kv_gib": kv_bytes / 2**30, "source": "--gpu" if req.accelerator else "--kv-gb"}
        n_min = max(s.N_min for s in streams)
        if N < n_min:
            raise InputError(
                f"{cap['source']}: N = {N:,} blocks per replica is below the largest request ({n_min:,} blocks); "
                "vLLM cannot serve this workload there"
            )
        check_capacity_memory(N * req.max_replicas, cap["source"])
    kw = dict(
        engine=req.engine, timing=tmg, seed=req.seed, lag=req.lag, flops=comp["flops"], gpu_flops=comp["gpu_flops"],
    )  # fmt: skip
    answers, rows = [], []
    for i, name in enumerate(req.router):
        if progress:
            progress(i, len(req.router), name)
        with translating("router"):
            try:
                if req.vary == "replicas":
                    res = plan_replicas(
                        streams, N=N, target=req.target, router=name, max_replicas=req.max_replicas,
                        params=params[name], **kw,
                    )  # fmt: skip
                else:
                    res = plan_capacity(
                        streams, replicas=req.replicas, target=req.target, router=name, rtol=req.rtol,
                        params=params[name], **kw,
                    )  # fmt: skip
            except FleetPlanError as e:
                raise InputError(str(e)) from None
        bpb = comp["bytes_per_block"]
        rows += [_row(p, bpb) for p in res.rows]
        at = res.point(res.answer) if res.answer is not None else None
        a: dict[str, Any] = {"router": name, "answer": res.answer, "found": res.answer is not None}
        if req.vary == "replicas":
            a["replicas"] = res.answer
            a["N"] = N
        else:
            a["replicas"] = req.replicas
            a["N"] = res.answer
            a["gib_per_replica"] = None if res.answer is None else res.answer * bpb / 2**30
        if at is not None:
            a |= {
                "token_hit_ratio": at.token_hit_ratio,
                "ci95": at.ci95,
                "saved_tokens_per_s": at.saved_tokens_per_s,
                "saved_gpus": at.saved_gpus,
                "prefill_gpus": at.prefill_gpus,
                "imbalance_requests": at.imbalance_requests,
            }
        answers.append(a)
        notes += res.notes
    if req.vary == "replicas":
        base = next((a for a in answers if a["router"] == "round-robin" and a["found"]), None)
        if base is not None:
            for a in answers:
                if a["found"]:
                    a["replicas_saved_vs_round_robin"] = base["replicas"] - a["replicas"]
    if req.vary == "hbm" and req.accelerator is not None:
        try:
            budget = hardware.kv_budget_bytes(
                req.accelerator, req.model, tp=req.tp,
                gpu_memory_utilization=req.gpu_memory_utilization or hardware.DEFAULT_GPU_MEMORY_UTILIZATION,
            )  # fmt: skip
            for a in answers:
                if a["found"]:
                    a["fits_on_gpu"] = a["N"] * comp["bytes_per_block"] <= budget
            cap = {"kv_gib_available": budget / 2**30, "source": "--gpu"}
        except ValueError as e:
            notes.append(f"--gpu: {e}")
    if req.prefill_tokens_per_s is None and any(r not in ("round-robin", "random", "session") for r in req.router):
        notes.append("no --prefill-tokens-per-s: requests are instantaneous, so load-based routers see no load")
    notes.append(
        "answers assume the hit ratio stays at or above the target beyond the answer inside the search bracket; "
        "every point simulated is in rows"
    )
    return FleetPlanResponse(
        workload=wl.label,
        block_size=b,
        engine=req.engine,
        target=req.target,
        vary=req.vary,
        lam0=lam0,
        capacity=cap,
        compute=comp["info"],
        answers=answers,
        rows=rows,
        notes=notes,
        timing=timing_echo(tmg),
    )


class FleetCurveRequest(_ComputeFields):
    """The inputs of ``kvhit fleet curve``, validated: each field's description states its unit, range and default
    ."""

    router: Literal["dynamo", "llm-d", "sglang"] = Field(
        "dynamo", description="KV-aware router: dynamo | llm-d | sglang."
    )
    param: str | None = Field(
        None,
        description="Parameter swept (a request field of that router, e.g. overlap_score_credit, request_weight, "
        "queue_weight); default: dynamo overlap_score_credit (0 = pure load balancing), llm-d queue_weight, sglang "
        "balance_abs_threshold.",
    )
    values: Annotated[list[Annotated[float, Field(ge=0, le=1e9)]], Field(min_length=1, max_length=64)] | None = Field(
        None, description="Values of the swept parameter, each ≥ 0; default: a geometric grid from 0."
    )
    replicas: int = Field(ge=1, le=4096, description="Replicas R, 1–4096; required.")
    N: Capacity = Field(description="Blocks per replica, ≥ 1; required.")
    baselines: bool = Field(True, description="Also round-robin, least-loaded and session at the same R and N.")
    plot: Path | None = Field(None, description="Write hit ratio vs load imbalance to PLOT.png/.svg; default: none.")

    FLAGS = {**_ComputeFields.FLAGS, "router": "--router", "values": "--values", "param": "--param"}


class FleetCurveResponse(Response):
    """The answer of ``kvhit fleet curve`` (``--json`` prints it; strict JSON, ``null`` where a number is
    undefined)."""

    workload: str
    block_size: int
    engine: str
    router: str
    param: str
    replicas: int
    N: int
    rows: list[dict[str, Any]] = Field(description="One per value of the swept parameter.")
    baselines: list[dict[str, Any]] = Field(default_factory=list)
    compute: dict[str, Any]
    notes: list[str] = Field(default_factory=list)
    timing: dict[str, Any] = Field(
        default_factory=dict, description="The timing options of the holds (speeds, prefill_hold, hit_token_seconds)."
    )
    figure: list[str] | None = None
    stationarity: dict[str, Any] | None = Field(
        None,
        description="Whether the measured window reached steady state (active conversations over time, "
        "kvhit.workload.stationarity); null where not judged (a production block-id trace).",
    )


def fleet_curve(req: FleetCurveRequest, progress=None) -> FleetCurveResponse:
    """``kvhit fleet curve``: cross-field checks and output paths first, then the library; refused input raises
    :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    from kvhit.fleet.plan import FleetPlanError, curve, evaluate

    if req.prefill_tokens_per_s is None:
        raise InputError(
            "--prefill-tokens-per-s: required by fleet curve (without holds no request is in flight, so no load "
            "weight changes anything)"
        )
    param = req.param or CURVE_DEFAULTS[req.router][0]
    if param not in SWEEPABLE[req.router]:
        raise InputError(f"--param: {req.router} sweeps one of {', '.join(SWEEPABLE[req.router])}; got {param!r}")
    if getattr(req, param) is not None:
        raise InputError(f"{req.flag(param)}: it is the swept parameter (--param {param}); give its values in --values")
    if param == "balance_rel_threshold" and req.values is not None and min(req.values) < 1:
        raise InputError("--values: balance_rel_threshold values must be ≥ 1")
    if param == "cache_threshold" and req.values is not None and max(req.values) > 1:
        raise InputError("--values: cache_threshold values must be in [0, 1]")
    values = list(req.values) if req.values is not None else list(CURVE_DEFAULTS[req.router][1])
    if req.param is not None and req.values is None and param != CURVE_DEFAULTS[req.router][0]:
        raise InputError(f"--values: required when --param is not the default ({CURVE_DEFAULTS[req.router][0]})")
    params = router_params(req, [req.router])[req.router]
    fleet_timing(req, [req.router])  # refused before the workload is read
    check_capacity_memory(req.N * req.replicas, "--N")
    if req.plot is not None:
        from kvhit.service.io import check_output_file

        check_output_file(str(req.plot) + ".png", "--plot")
    wl = load_fleet_workload(req)
    tmg = fleet_timing(req, [req.router], wl.stream)
    steady = None if wl.tr is None else steady_report(wl.tr, wl.stream.measured)
    b = wl.stream.block_size
    if req.N < wl.stream.N_min:
        raise InputError(f"--N: {req.N:,} blocks is below the largest request ({wl.stream.N_min:,} blocks)")
    comp = _compute(req, b)
    kw = dict(
        engine=req.engine, timing=tmg, seed=req.seed, lag=req.lag, flops=comp["flops"], gpu_flops=comp["gpu_flops"],
    )  # fmt: skip
    name = ROUTER_PARAMS[param][0]
    with translating("router"):
        try:
            pts = curve([wl.stream], replicas=req.replicas, N=req.N, router=req.router, param=name, values=values,
                        params=params, **kw)  # fmt: skip
        except FleetPlanError as e:
            raise InputError(str(e)) from None
    rows = [{"value": v, **_row(p)} for v, p in zip(values, pts, strict=True)]
    base = []
    if req.baselines:
        for r in ("round-robin", "least-loaded", "session"):
            base.append(_row(evaluate([wl.stream], replicas=req.replicas, N=req.N, router=r, **kw)))
    figure = None
    if req.plot is not None:
        from kvhit.plots.fleet import plot_fleet_curve

        figure = [
            str(p)
            for p in plot_fleet_curve(
                rows, base, req.plot, label=f"{req.router} {param}",
                title=f"{wl.label}, R = {req.replicas}, N = {req.N:,}, {req.prefill_tokens_per_s:g} prefill tok/s",
                warning=None if steady is None or steady["stationary"] else STEADY_WARNING,
            )
        ]  # fmt: skip
    return FleetCurveResponse(
        workload=wl.label,
        block_size=b,
        engine=req.engine,
        router=req.router,
        param=param,
        replicas=req.replicas,
        N=req.N,
        rows=rows,
        baselines=base,
        compute=comp["info"],
        notes=steady_note(steady) + list(wl.notes),
        figure=figure,
        timing=timing_echo(tmg),
        stationarity=steady,
    )
