"""Estimators of the hit ratio: the paper's theory and one estimator family per module.

* :mod:`~kvhit.estimate.theory` — the closed forms of §3–4 (h → (A_H/A_R)·F(T_C), eq. (20)–(33)).
* :mod:`~kvhit.estimate.displacement` — the displacement law behind T_C (eq. (35)–(38)).
* :mod:`~kvhit.estimate.engine` — the practical estimator (eq. (35)–(39)) and its vLLM engine-aware forms.
* :mod:`~kvhit.estimate.agentic` — block-id (agentic) traces; :mod:`~kvhit.estimate.sglang`,
  :mod:`~kvhit.estimate.sglang_agentic` — SGLang's radix accounting; :mod:`~kvhit.estimate.tiers` — host tiers.

Layer: imports ``workload`` and ``sim`` only. The names of the old ``kvhit.estimate`` module
(``estimate``, ``estimate_engine``, ``trace_moments``, …) stay importable from here (lazily).
"""

from kvhit._compat import lazy_exports

_NAMES = (
    "BLOCK_RULES EstimateError TraceMoments Estimate trace_moments empirical_F posterior_F estimate estimate_spec "
    "ENGINE_MODELS METRICS ACCOUNTINGS EngineAccounting EngineEstimate engine_accounting displacement_moments "
    "estimate_engine estimate_finite estimate_window"
).split()
__all__ = list(_NAMES)
__getattr__ = lazy_exports(__name__, dict.fromkeys(_NAMES, "kvhit.estimate.engine"))
