"""Workloads: the multi-turn conversation model, trace schema and Parquet I/O, generators and readers."""

from kvhit.workload.dists import (
    Constant,
    Deterministic,
    EmpiricalW,
    Exponential,
    FinitePMF,
    GammaW,
    Geometric,
    IntDist,
    Interarrival,
    LogNormalW,
    ScipyInt,
    ScipyW,
    SpecError,
)
from kvhit.workload.generate import generate
from kvhit.workload.spec import (
    EmpiricalConversations,
    IIDIncrements,
    Increments,
    PromptResponse,
    TurnDependent,
    WorkloadSpec,
)
from kvhit.workload.trace import SCHEMA_VERSION, Trace, TraceError, Window

__all__ = [
    "Constant",
    "Deterministic",
    "EmpiricalW",
    "Exponential",
    "FinitePMF",
    "GammaW",
    "Geometric",
    "IntDist",
    "Interarrival",
    "LogNormalW",
    "ScipyInt",
    "ScipyW",
    "SpecError",
    "generate",
    "EmpiricalConversations",
    "IIDIncrements",
    "Increments",
    "PromptResponse",
    "TurnDependent",
    "WorkloadSpec",
    "SCHEMA_VERSION",
    "Trace",
    "TraceError",
    "Window",
]
