"""Exact simulators: one folder per engine and the step-wise Engine protocol.

* :mod:`~kvhit.sim.content` — whole-content LRU (paper App. B.4, Algorithm 1) and its all-capacity curve.
* :mod:`~kvhit.sim.vllm` — vLLM's block pool (compiled, curve, step-wise engine, reference).
* :mod:`~kvhit.sim.sglang` — SGLang's radix cache (compiled, step-wise engine).
* :mod:`~kvhit.sim.tiers` — host-memory tiers wrapping a step-wise engine (vLLM native/simple/LMCache, HiCache).
* :mod:`~kvhit.sim.engine` — the step-wise :class:`~kvhit.sim.engine.Engine` protocol and the ``replay`` driver;
  :mod:`~kvhit.sim.registry` — engine name → its models (one dispatch for the services).
* :mod:`~kvhit.sim.runner`, :mod:`~kvhit.sim.tracerun`, :mod:`~kvhit.sim.stream`, :mod:`~kvhit.sim.resample` —
  traces and streams through the simulators.

Layer: imports ``workload`` only. The Algorithm 1 names formerly exported here stay importable (lazily).
"""

from kvhit._compat import lazy_exports

_NAMES = {
    **dict.fromkeys(
        [
            "ContentInputError",
            "ContentResult",
            "ContentSweep",
            "previous_content_sizes",
            "simulate_content",
            "simulate_content_many",
        ],
        "kvhit.sim.content.lru",
    ),
    "simulate_content_reference": "kvhit.sim.content.reference",
    **dict.fromkeys(
        ["FIRST_TURN", "content_curve", "content_curve_from_thresholds", "content_hit_thresholds"],
        "kvhit.sim.content.stackdist",
    ),
}
__all__ = sorted(_NAMES)
__getattr__ = lazy_exports(__name__, _NAMES)
