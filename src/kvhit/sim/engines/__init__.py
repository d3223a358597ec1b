"""Deprecated: the step-wise Engine protocol moved to :mod:`kvhit.sim.engine`, the vLLM engine to
:mod:`kvhit.sim.vllm.engine`, the SGLang engine to :mod:`kvhit.sim.sglang.engine` (issue 21 layout).
Kept importable for one release; ``kvhit.sim.engines.vllm`` / ``.sglang`` are aliases (:mod:`kvhit._compat`)."""

import warnings

from kvhit.sim.engine import *  # noqa: F403
from kvhit.sim.engine import __all__ as _all
from kvhit.sim.registry import make_engine  # noqa: F401

__all__ = [*_all, "make_engine"]

warnings.warn(
    "kvhit.sim.engines moved to kvhit.sim.engine (issue 21 layout); the old path is removed in the next release",
    DeprecationWarning,
    stacklevel=2,
)
