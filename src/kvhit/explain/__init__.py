"""Where the hit ratio went: the waterfall of a trace at a configuration, per-miss causes and prefix breakers.

Invariant: every number is measured by kvhit's exact simulators on the trace's own requests, and the waterfall's
steps add up to its final value exactly (:mod:`kvhit.explain.waterfall`); a prefix breaker's what-if is a
re-simulation of rewritten prompts, not an estimate (:mod:`kvhit.explain.breakers`). Not modelled: what the
simulators do not model (see their docstrings), SGLang, and a host tier behind a fleet.
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
