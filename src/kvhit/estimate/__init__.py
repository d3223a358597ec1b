"""Estimators of the hit ratio: the paper's theory and one estimator family per module.

* :mod:`~kvhit.estimate.theory` — the closed forms of §3–4 (h → (A_H/A_R)·F(T_C), eq. (20)–(33)).
* :mod:`~kvhit.estimate.displacement` — the displacement law behind T_C (eq. (35)–(38)).
* :mod:`~kvhit.estimate.trace_stats` — a trace's workload statistics (eq. (35)–(37));
  :mod:`~kvhit.estimate.mean_field` — the practical estimator (eq. (38)–(39)).
* :mod:`~kvhit.estimate.engine` — the vLLM engine-aware estimators, built on the block accounting of
  :mod:`~kvhit.estimate.accounting` and the occupancy law of :mod:`~kvhit.estimate.occupancy`.
* :mod:`~kvhit.estimate.agentic` — block-id (agentic) traces; :mod:`~kvhit.estimate.sglang`,
  :mod:`~kvhit.estimate.sglang_agentic` — SGLang's radix accounting; :mod:`~kvhit.estimate.tiers` — host tiers.

Layer: imports ``workload`` and ``sim`` only. The names of the old ``kvhit.estimate`` module
(``estimate``, ``estimate_engine``, ``trace_moments``, …) stay importable from here (lazily).
"""

from kvhit._compat import lazy_exports

_HOMES = {
    "kvhit.estimate.trace_stats": "BLOCK_RULES EstimateError TraceMoments trace_moments",
    "kvhit.estimate.mean_field": "Estimate empirical_F posterior_F estimate estimate_spec",
    "kvhit.estimate.accounting": (
        "ENGINE_MODELS METRICS ACCOUNTINGS EngineAccounting engine_accounting displacement_moments"
    ),
    "kvhit.estimate.engine": "EngineEstimate estimate_engine estimate_finite estimate_window",
}
_WHERE = {name: mod for mod, names in _HOMES.items() for name in names.split()}
__all__ = list(_WHERE)
__getattr__ = lazy_exports(__name__, _WHERE)
