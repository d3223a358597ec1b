"""Where the hit ratio went: the waterfall of a trace at a configuration, per-miss causes and prefix breakers.

See :mod:`kvhit.explain.waterfall` (the stages, each measured by kvhit's exact simulators) and
:mod:`kvhit.explain.breakers` (early divergences between prompts that share a long prefix, and the what-if).
"""

from kvhit.explain.breakers import Breaker, find_breakers, what_if
from kvhit.explain.waterfall import STAGES, ExplainError, Waterfall, explain_trace, full_prompts, reusable_prefix

__all__ = [
    "STAGES",
    "Breaker",
    "ExplainError",
    "Waterfall",
    "explain_trace",
    "find_breakers",
    "full_prompts",
    "reusable_prefix",
    "what_if",
]
