"""Reproductions of the paper's experiments: App. E's LLM-serving Experiments 1 and 2 (Figs. 2–6).

Entry point: :func:`reproduce` (``kvhit reproduce`` on the command line). Settings and the latency model of
eq. (80) live in :mod:`kvhit.experiments.paper_setting`, the estimator registry in
:mod:`kvhit.experiments.paper_estimators`, one run in :mod:`kvhit.experiments.paper_runs`, the grids and the
summary in :mod:`kvhit.experiments.paper`; the outputs in :mod:`kvhit.experiments.report` (figures:
:mod:`kvhit.experiments.report_figures`, ``report.md``: :mod:`kvhit.experiments.report_markdown`).
"""

from kvhit.experiments.paper import PAPER_BOUNDS, run_experiments, summarize
from kvhit.experiments.paper_estimators import ESTIMATORS, PAPER_ESTIMATORS, register_estimator
from kvhit.experiments.paper_runs import PRIMARY_ACTUAL
from kvhit.experiments.paper_setting import SETTINGS, ExperimentError, LatencyModel, Setting, get_setting
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
