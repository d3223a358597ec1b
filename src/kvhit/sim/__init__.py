"""Exact simulators of whole-content LRU (paper App. B.4, Algorithm 1) and their all-capacity curves."""

from kvhit.sim.content import (
    ContentInputError,
    ContentResult,
    ContentSweep,
    previous_content_sizes,
    simulate_content,
    simulate_content_many,
)
from kvhit.sim.reference import simulate_content_reference
from kvhit.sim.stackdist import (
    FIRST_TURN,
    content_curve,
    content_curve_from_thresholds,
    content_hit_thresholds,
)

__all__ = [
    "FIRST_TURN",
    "ContentInputError",
    "ContentResult",
    "ContentSweep",
    "content_curve",
    "content_curve_from_thresholds",
    "content_hit_thresholds",
    "previous_content_sizes",
    "simulate_content",
    "simulate_content_many",
    "simulate_content_reference",
]
