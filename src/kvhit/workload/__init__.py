"""Workloads: the multi-turn conversation model, trace schema and Parquet I/O, generators and readers.

The bottom layer: imports nothing else of kvhit. Its public names are exported lazily (PEP 562), so importing
one light module (``kvhit.workload.hashing``, ``kvhit.workload.requests``) does not pull in scipy or pyarrow —
the conformance environments, which hold only the engines' own dependencies, import the engine models this way.
"""

from kvhit._compat import lazy_exports

_NAMES = {
    **dict.fromkeys(
        [
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
        ],
        "kvhit.workload.dists",
    ),
    "generate": "kvhit.workload.generate",
    **dict.fromkeys(
        [
            "EmpiricalConversations",
            "IIDIncrements",
            "Increments",
            "PromptResponse",
            "TurnDependent",
            "WorkloadSpec",
        ],
        "kvhit.workload.spec",
    ),
    **dict.fromkeys(["SCHEMA_VERSION", "Trace", "TraceError", "Window"], "kvhit.workload.trace"),
}
__all__ = list(_NAMES)
__getattr__ = lazy_exports(__name__, _NAMES)
