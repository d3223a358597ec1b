"""Whole-content LRU (paper App. B.4, Algorithm 1): the exact simulator (:mod:`~kvhit.sim.content.lru`),
its slow reference (:mod:`~kvhit.sim.content.reference`) and the all-capacity curve from stack distances
(:mod:`~kvhit.sim.content.stackdist`). The names of the old ``kvhit.sim.content`` module stay importable
from here (lazily)."""

from kvhit._compat import lazy_exports

_NAMES = [
    "ContentInputError",
    "ContentResult",
    "ContentSweep",
    "previous_content_sizes",
    "simulate_content",
    "simulate_content_many",
]
__all__ = list(_NAMES)
__getattr__ = lazy_exports(__name__, dict.fromkeys(_NAMES, "kvhit.sim.content.lru"))
