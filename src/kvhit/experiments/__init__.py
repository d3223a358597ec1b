"""Reproductions of the paper's experiments: App. E's LLM-serving Experiments 1 and 2 (Figs. 2–6).

Entry point: :func:`reproduce` (``kvhit reproduce`` on the command line). Settings, the latency model of
eq. (80) and the estimator registry live in :mod:`kvhit.experiments.paper`; figures and the report in
:mod:`kvhit.experiments.report`.
"""

from kvhit.experiments.paper import (
    ESTIMATORS,
    PAPER_BOUNDS,
    PAPER_ESTIMATORS,
    PRIMARY_ACTUAL,
    SETTINGS,
    ExperimentError,
    LatencyModel,
    Setting,
    get_setting,
    register_estimator,
    run_experiments,
    summarize,
)
from kvhit.experiments.report import ReproduceResult, reproduce

__all__ = [
    "ESTIMATORS",
    "PAPER_BOUNDS",
    "PAPER_ESTIMATORS",
    "PRIMARY_ACTUAL",
    "SETTINGS",
    "ExperimentError",
    "LatencyModel",
    "ReproduceResult",
    "Setting",
    "get_setting",
    "register_estimator",
    "reproduce",
    "run_experiments",
    "summarize",
]
