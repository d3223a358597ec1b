"""Workloads: the multi-turn conversation model, trace schema and Parquet I/O, generators and readers."""

from .dists import (
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
from .generate import generate
from .spec import (
    EmpiricalConversations,
    IIDIncrements,
    Increments,
    PromptResponse,
    TurnDependent,
    WorkloadSpec,
)
from .trace import SCHEMA_VERSION, Trace, TraceError, Window

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
