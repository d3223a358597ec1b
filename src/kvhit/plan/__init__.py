"""Capacity planning for one replica: hardware (KV bytes per token from model configs), compute (prefill
FLOPs), and the capacity questions per engine and tier.

* :mod:`~kvhit.plan.model_kv` — KV bytes/token and per block of a model; :mod:`~kvhit.plan.model_config` — a
  model's shape from its ``config.json`` or a shipped preset; :mod:`~kvhit.plan.hardware` — accelerators, blocks
  per GiB and the KV budget.
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
