"""Workload inputs shared by several commands: a spec (TOML file, optionally overridden by flags, or entirely
from flags — the paper's SCM, App. B.2) or a trace file, never both.

Invariant: exactly one workload source is used, and every flag given is used: ``--trace`` with ``--spec`` or
with spec flags is refused (the spec would be ignored); a flag that cannot apply (``--x-mean`` on a spec without
prompt/response increments, ``--w-cv`` with an exponential W) is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from kvhit.service.base import Request
from kvhit.service.errors import InputError, translating

__all__ = ["SpecFields", "TraceOrSpecFields", "load_spec", "spec_flags_given"]

WDist = Literal["exponential", "deterministic", "gamma", "lognormal"]


class SpecFields(Request):
    """A workload spec: a TOML file (``spec``) whose values any given flag overrides, or the SCM from flags."""

    spec: Path | None = Field(None, description="Workload spec TOML file (see examples/); default: none (use flags).")
    lam0: float | None = Field(
        None, gt=0, description="Conversation arrival rate λ0, conversations/s; > 0; default: from --spec."
    )
    p: float | None = Field(
        None, ge=0, lt=1, description="Continuation probability p of geometric turns (SCM); in [0, 1); default: none."
    )
    mean_turns: float | None = Field(
        None, ge=1, description="Mean turns E[M] of geometric turns, instead of --p; ≥ 1; default: none."
    )
    x_mean: float | None = Field(
        None, ge=1, description="Mean prompt blocks per turn E[X] (geometric on {1, 2, …}); ≥ 1; default: none."
    )
    y_mean: float | None = Field(
        None, ge=1, description="Mean response blocks per turn E[Y] (geometric on {1, 2, …}); ≥ 1; default: none."
    )
    w_mean: float | None = Field(
        None, gt=0, description="Mean prompt interarrival E[W], seconds; > 0; default: from --spec."
    )
    w_dist: WDist | None = Field(
        None,
        description="Interarrival distribution F: exponential | deterministic | gamma | lognormal; "
        "default: exponential (or the spec's).",
    )
    w_cv: float | None = Field(
        None,
        ge=1e-3,
        le=1e3,
        description="Coefficient of variation of W for gamma/lognormal; in [0.001, 1000]; default: 1 "
        "(cv 0 is --w-dist deterministic).",
    )

    FLAGS = {"spec": "--spec", "lam0": "--lam0", "p": "--p", "mean_turns": "--mean-turns"}


_SPEC_FLAGS = ("lam0", "p", "mean_turns", "x_mean", "y_mean", "w_mean", "w_dist", "w_cv")


def spec_flags_given(req: SpecFields, exclude: tuple[str, ...] = ()) -> list[str]:
    """The spec flags set in a request (to refuse them where they would be ignored)."""
    return [req.flag(k) for k in _SPEC_FLAGS if k not in exclude and getattr(req, k) is not None]


class TraceOrSpecFields(SpecFields):
    """A workload from a trace file (``trace``) or a spec — never both."""

    trace: Path | None = Field(None, description="Workload trace (Parquet, `kvhit trace generate/sharegpt`).")

    FLAGS = {**SpecFields.FLAGS, "trace": "--trace"}

    def check_source(self, *, allow_with_trace: tuple[str, ...] = ()) -> None:
        if self.trace is None:
            return
        if self.spec is not None:
            raise InputError("--trace and --spec: give one workload source, not both (the spec would be ignored)")
        extra = spec_flags_given(self, exclude=allow_with_trace)
        if extra:
            raise InputError(f"{extra[0]}: applies to a spec, not to --trace (it would be ignored)")


def load_spec(req: SpecFields):
    """A :class:`~kvhit.workload.WorkloadSpec` from the request: TOML overridden by flags, or the SCM from flags."""
    from kvhit.workload import (
        Deterministic,
        Exponential,
        GammaW,
        Geometric,
        LogNormalW,
        PromptResponse,
        WorkloadSpec,
    )

    w_dist = req.w_dist
    if req.w_cv is not None and (w_dist or "exponential") in ("exponential", "deterministic"):
        raise InputError(f"--w-cv: applies to --w-dist gamma or lognormal, not {w_dist or 'exponential'}")

    def interarrival(mean: float):
        kind = w_dist or "exponential"
        cv = 1.0 if req.w_cv is None else req.w_cv
        if kind == "exponential":
            return Exponential(mean)
        if kind == "deterministic":
            return Deterministic(mean)
        if kind == "gamma":
            return GammaW(1.0 / (cv * cv), mean)
        return LogNormalW.from_mean_cv(mean, cv)

    if req.p is not None and req.mean_turns is not None:
        raise InputError("--p and --mean-turns: give one, not both")
    with translating(str(req.spec) if req.spec is not None else ""):
        turns = (
            Geometric(req.p)
            if req.p is not None
            else Geometric.from_mean(req.mean_turns)
            if req.mean_turns is not None
            else None
        )
        if req.spec is not None:
            s = WorkloadSpec.from_toml(req.spec)
            if req.lam0 is not None:
                s = s.with_lam0(req.lam0)
            if req.w_mean is not None or w_dist is not None:
                s = s.with_interarrival(interarrival(req.w_mean if req.w_mean is not None else s.interarrival.mean))
            if turns is not None:
                if s.increments.joint:
                    raise InputError("--p/--mean-turns: the spec's empirical conversations fix the turn count")
                s = WorkloadSpec(s.lam0, turns, s.increments, s.interarrival, s.name)
            if req.x_mean is not None or req.y_mean is not None:
                if not isinstance(s.increments, PromptResponse):
                    raise InputError("--x-mean/--y-mean: need a prompt_response increments model in the spec")
                inc = PromptResponse(
                    Geometric.from_mean(req.x_mean) if req.x_mean is not None else s.increments.x,
                    Geometric.from_mean(req.y_mean) if req.y_mean is not None else s.increments.y,
                )
                s = WorkloadSpec(s.lam0, s.turns, inc, s.interarrival, s.name)
            return s
        missing = [
            n
            for n, v in [
                ("--lam0", req.lam0),
                ("--p or --mean-turns", turns),
                ("--x-mean", req.x_mean),
                ("--y-mean", req.y_mean),
                ("--w-mean", req.w_mean),
            ]
            if v is None
        ]
        if missing:
            raise InputError(f"no --spec file given; missing flag(s): {', '.join(missing)}")
        return WorkloadSpec(
            req.lam0,
            turns,
            PromptResponse(Geometric.from_mean(req.x_mean), Geometric.from_mean(req.y_mean)),
            interarrival(req.w_mean),
            name="flags",
        )
