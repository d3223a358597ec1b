"""``demo`` and ``reproduce``: the paper's App. E job end to end.

``demo`` answers at N = 2,275 blocks by default — **the paper's App. E capacity** (Qwen3-8B, 40 GiB of KV,
⌊40·2³⁰ / 18 MiB⌋), stated in its output — and ``reproduce`` runs Experiments 1–2 into an output directory that
is checked before the minutes of computing begin. NOT modelled here: the experiments (``kvhit.experiments``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from kvhit.service.base import Request, Response
from kvhit.service.common import MAX_N, Seed
from kvhit.service.errors import InputError, translating
from kvhit.service.io import check_output_dir
from kvhit.service.steady import steady_note, steady_report
from kvhit.service.traces import ShareGPTRequest, build_sharegpt, stats_dict

__all__ = ["DemoRequest", "DemoResponse", "demo", "ReproduceRequest", "ReproduceResponse", "reproduce"]

PAPER_N = 2275  #: the paper's App. E capacity: 40 GiB of Qwen3-8B KV at 128-token blocks


class DemoRequest(Request):
    """The inputs of ``kvhit demo``, validated: each field's description states its unit, range and default."""

    N: int = Field(PAPER_N, ge=2, le=MAX_N, description="Capacity in blocks; default 2,275 (the paper's App. E).")
    lam0: float = Field(1.0, gt=0, description="Conversation arrival rate λ0, conversations/s; > 0.")
    w_mean: float = Field(135.0, gt=0, description="Mean exponential interarrival W, seconds; > 0.")
    seed: Seed = 0

    FLAGS = {"N": "--N"}


class DemoResponse(Response):
    """The answer of ``kvhit demo`` (``--json`` prints it; strict JSON, ``null`` where a number is undefined)."""

    report: dict[str, Any]
    stats: dict[str, Any]
    N: int
    N_is_paper_default: bool = Field(description="True when N is the paper's App. E capacity (2,275 blocks).")
    lam0: float
    w_mean: float
    estimates: dict[str, float | None]
    simulated: dict[str, float | None]
    stationarity: dict[str, Any] | None = Field(
        None,
        description="Whether the simulated window (after 1,000 warm-up conversations) reached steady state "
        "(kvhit.workload.stationarity, against the window's own median active count).",
    )
    notes: list[str] = Field(default_factory=list, description="Warnings: a window that did not reach steady state.")


def demo(req: DemoRequest, progress=None) -> DemoResponse:
    """``kvhit demo``: cross-field checks and output paths first, then the library; refused input raises
    :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    from kvhit.estimate.mean_field import estimate as est_fn
    from kvhit.estimate.trace_stats import trace_moments
    from kvhit.plan.planner import make_workload
    from kvhit.service.base import check_capacity_memory
    from kvhit.sim.runner import block_requests, simulate_trace_block, simulate_trace_content
    from kvhit.sim.vllm.block import simulate_block  # noqa: F401  (compiled once, before the runs)
    from kvhit.workload import Exponential, Window

    check_capacity_memory(req.N, "--N")
    sg = ShareGPTRequest(out=None, seed=req.seed, lam0=req.lam0, w_mean=req.w_mean)
    tr, rep = build_sharegpt(sg, progress)
    N, lam0 = req.N, req.lam0
    with translating("demo"):
        st = stats_dict(tr)
        window = Window.warmup_conversations(tr, 1000)
        mom = trace_moments(tr, rows=window.mask(tr), incomplete="drop")
        estimates: dict[str, float | None] = {
            "prior": float(est_fn(mom, N, lam0, Exponential(req.w_mean)).h),
            "posterior": float(est_fn(mom, N, lam0, "posterior").h),
            "empirical": float(est_fn(mom, N, lam0, "empirical").h),
        }
        steady = steady_report(tr, window.mask(tr))
        content = simulate_trace_content(tr, N, window=window, practical=True)
        rq = block_requests(tr)
        blocks = {
            e: simulate_trace_block(tr, N, engine=e, window=window, requests=rq)[1] for e in ("vllm", "vllm-0.23")
        }
        tr.meta["n_warm"] = 1000
        for e in ("content", "vllm", "vllm-0.23"):
            wl = make_workload(tr, engine=e, metric="blocks", lam0=lam0)
            estimates[f"engine:{e}"] = float(wl.predict(np.array([float(N)]), np.array([lam0]))[0])
    return DemoResponse(
        report=rep.to_dict(),
        stats=st,
        N=N,
        N_is_paper_default=N == PAPER_N,
        lam0=lam0,
        w_mean=req.w_mean,
        estimates=estimates,
        simulated={
            "content": content.h,
            "vllm": blocks["vllm"]["h_blocks"],
            "vllm-0.23": blocks["vllm-0.23"]["h_blocks"],
            "vllm_token_hit_ratio": blocks["vllm"]["token_hit_ratio"],
            "vllm-0.23_token_hit_ratio": blocks["vllm-0.23"]["token_hit_ratio"],
        },
        stationarity=steady,
        notes=steady_note(steady),
    )


class ReproduceRequest(Request):
    """The inputs of ``kvhit reproduce``, validated: each field's description states its unit, range and default
    ."""

    out: Path = Field(Path("out/reproduce"), description="Output directory (created; must not be a file).")
    quick: bool = Field(False, description="Fewer seeds and points (≤ 2 minutes).")
    seeds: int | None = Field(None, ge=1, le=1000, description="Seeds per point; ≥ 1; default: the setting's.")
    jobs: int | None = Field(None, ge=1, le=1024, description="Worker processes; ≥ 1; default: all cores.")
    tpot: float | None = Field(
        None, gt=0, le=60, description="Decode time per output token (s) of the eq. (80) latency model; default 0.15."
    )


class ReproduceResponse(Response):
    """The answer of ``kvhit reproduce`` (``--json`` prints it; strict JSON, ``null`` where a number is undefined)."""

    out: str
    files: list[str]
    seconds: dict[str, float]
    checks: list[dict[str, Any]]
    passed: bool
    stationarity: dict[str, Any] | None = Field(
        None,
        description="Runs whose measured window reached steady state (kvhit.workload.stationarity, against each "
        "window's own median active count): runs, not_stationary and the (λ0, μ_F, seed) of those that did not.",
    )
    notes: list[str] = Field(default_factory=list, description="Warnings: runs that did not reach steady state.")


def reproduce(req: ReproduceRequest, progress=None) -> ReproduceResponse:
    """``kvhit reproduce``: cross-field checks and output paths first, then the library; refused input raises
    :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    from dataclasses import replace

    from kvhit.experiments import get_setting
    from kvhit.experiments import reproduce as reproduce_fn

    check_output_dir(req.out, "--out")
    st = get_setting("quick" if req.quick else "paper")
    if req.tpot is not None:
        st = replace(st, latency=replace(st.latency, tpot_s=req.tpot))
    with translating("reproduce"):
        res = reproduce_fn(
            req.out, setting=st, seeds=range(req.seeds) if req.seeds else None, jobs=req.jobs, progress=progress
        )
    if not res.files:
        raise InputError("reproduce: no output written")
    bad = [
        {"lam0": r["lam0"], "mu_F": r["mu_F"], "seed": r["seed"], "in_band_share": r["steady/in_band_share"]}
        for r in res.runs
        if r.get("steady/stationary") == 0.0
    ]
    steady = {"runs": len(res.runs), "not_stationary": len(bad), "not_stationary_runs": bad}
    notes = []
    if bad:
        notes.append(
            f"NOT STATIONARY — {len(bad):,} of {len(res.runs):,} runs measured a window that did not reach steady "
            "state (results.json: runs[].steady/*)"
        )
    return ReproduceResponse(
        out=str(res.out_dir),
        files=[str(f) for f in res.files],
        seconds=res.seconds,
        checks=res.checks,
        passed=res.passed,
        stationarity=steady,
        notes=notes,
    )
