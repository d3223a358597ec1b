"""Capacity planning for one replica: hardware (KV bytes per token from model configs), compute (prefill
FLOPs), and the capacity questions per engine and tier.

* :mod:`~kvhit.plan.hardware` — KV bytes/token and blocks per GiB from a model's ``config.json``.
* :mod:`~kvhit.plan.compute` — prefill FLOPs/token and GPU-time saved.
* :mod:`~kvhit.plan.planner` — the smallest N reaching a target h (vLLM), :mod:`~kvhit.plan.sglang`,
  :mod:`~kvhit.plan.tiers` — the same for SGLang and host tiers.

Layer: imports ``workload``, ``sim`` and ``estimate``; never ``fleet`` (a sibling). The names of the old
``kvhit.plan`` module (``plan``, ``capacity``, ``make_workload``, …) stay importable from here (lazily).
"""

from kvhit._compat import lazy_exports

_NAMES = ["PlanError", "Workload", "Capacity", "Plan", "make_workload", "capacity", "plan"]
__all__ = list(_NAMES)
__getattr__ = lazy_exports(__name__, dict.fromkeys(_NAMES, "kvhit.plan.planner"))
