"""``estimate``: the paper's mean-field estimate from a workload spec (moments, T_C, h base eq. (25) and practical
eq. (32)/(39)), optionally beside the engine-aware estimate of a sample of the spec (``--engine sglang``:
SGLang's radix cache at the same KV memory, N·128 tokens, :mod:`kvhit.estimate.sglang`; token hit ratio only).

Invariant: numbers are the library's (``kvhit.estimate.theory``, ``kvhit.plan.planner.make_workload``); nothing
is recomputed here. NOT modelled: anything not in the spec (use ``simulate`` or a trace for engine effects beyond the
estimator).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field

from kvhit.service.base import Response, check_capacity_memory
from kvhit.service.common import Capacities, Engine, Seed
from kvhit.service.errors import translating
from kvhit.service.spec import SpecFields, load_spec

__all__ = ["EstimateRequest", "EstimateResponse", "estimate", "spec_estimates"]


class EstimateRequest(SpecFields):
    """The inputs of ``kvhit estimate``, validated: each field's description states its unit, range and default."""

    N: Capacities
    engine: Engine | Literal["sglang"] | None = Field(
        None,
        description="Also predict this engine: vllm (≥ 0.24) | vllm-0.23 | content | sglang (SGLang 0.5.23 at the "
        "same KV memory: N·128 tokens); default: none.",
    )
    sample: int = Field(
        20_000, ge=100, le=10_000_000, description="With --engine: conversations sampled from the spec; 100–10^7."
    )
    seed: Seed = 0

    FLAGS = {**SpecFields.FLAGS, "N": "--N"}


class EstimateRow(Response):
    """One capacity of ``kvhit estimate``: T_C and h of the paper's forms, and the engine-aware estimate when asked."""

    N: int = Field(description="Capacity in blocks.")
    h: float | None = Field(description="Practical mean-field h (eq. 32/39).")
    h_base: float | None = Field(description="Base mean-field h (eq. 25).")
    h_prac: float | None = Field(description="Practical mean-field h (eq. 32).")
    T_C: float | None = Field(description="Characteristic time T_C (s), base (eq. 21).")
    T_C_prac: float | None = Field(description="T_C (s), practical (eq. 30).")
    h_engine_blocks: float | None = Field(None, description="Engine-aware h, block-weighted (with --engine).")
    h_engine_tokens: float | None = Field(
        None, description="Engine-aware h, the engine's token hit ratio (with --engine; sglang: at N·128 tokens)."
    )


class EstimateResponse(Response):
    """The answer of ``kvhit estimate`` (``--json`` prints it; strict JSON, ``null`` where a number is undefined)."""

    engine: str | None
    spec: dict[str, Any] = Field(description="The workload spec used (kvhit spec dict).")
    moments: dict[str, Any] = Field(description="A_R, A_H, A_H_hash, E_B, E_M, Var_M, h_max (eq. 9–11, 28).")
    estimates: list[EstimateRow]


def spec_estimates(sp, Ns: list[int], practical: bool) -> list[dict]:
    """Base and practical mean-field h and T_C of a spec at each capacity (eq. (21)/(25), (30)/(32))."""
    from kvhit.estimate import theory

    mom = theory.moments(sp)
    Nf = np.asarray(Ns, float)
    h_base, T_base, _ = theory.mean_field(mom.A_R, mom.A_H, mom.E_B, sp.interarrival, sp.lam0, Nf)
    h_prac, T_prac, _ = theory.mean_field(mom.A_R, mom.A_H_hash, mom.E_B, sp.interarrival, sp.lam0, Nf)
    return [
        {
            "N": n,
            "h": float((h_prac if practical else h_base)[i]),
            "h_base": float(h_base[i]),
            "h_prac": float(h_prac[i]),
            "T_C": float(T_base[i]),
            "T_C_prac": float(T_prac[i]),
        }
        for i, n in enumerate(Ns)
    ]


def estimate(req: EstimateRequest) -> EstimateResponse:
    """``kvhit estimate``: cross-field checks and output paths first, then the library; refused input raises
    :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    from kvhit.estimate import theory

    sp = load_spec(req)
    with translating(str(req.spec) if req.spec else ""):
        mom = theory.moments(sp)
        est = spec_estimates(sp, req.N, True)
    if req.engine is not None:
        from kvhit.plan.planner import make_workload

        for n in req.N:  # the engine-aware estimator tabulates over capacities up to N
            check_capacity_memory(n, "--N")

        with translating("--engine"):
            for metric in ("tokens",) if req.engine == "sglang" else ("blocks", "tokens"):
                wl = make_workload(sp, engine=req.engine, metric=metric, sample_conversations=req.sample, seed=req.seed)
                h = wl.predict(np.asarray(req.N, float), np.full(len(req.N), sp.lam0))
                for e, v in zip(est, h, strict=True):
                    e[f"h_engine_{metric}"] = float(v)
    return EstimateResponse(
        engine=req.engine,
        spec=sp.to_dict(),
        moments={
            "A_R": mom.A_R,
            "A_H": mom.A_H,
            "A_H_hash": mom.A_H_hash,
            "E_B": mom.E_B,
            "E_M": mom.E_M,
            "Var_M": mom.Var_M,
            "h_max": mom.h_max,
            "h_max_hash": mom.h_max_hash,
            "method": mom.method,
            "truncation_J": mom.truncation_J,
            "truncation_error_bound": vars(mom.truncation_error_bound),
        },
        estimates=est,  # validated into EstimateRows by this one model call (pydantic-core), not one call per row
    )
