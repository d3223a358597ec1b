"""Field types shared by several requests (capacities, seeds, engines)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

__all__ = ["Capacities", "Capacity", "Seed", "Engine", "BlockEngine", "MAX_N"]

#: The largest capacity a request may name (blocks): 2^40 ≈ 10^12. Simulated capacities are further bounded by
#: the memory of this machine (:func:`kvhit.service.base.check_capacity_memory`).
MAX_N = 2**40

Capacity = Annotated[int, Field(ge=1, le=MAX_N)]
Capacities = Annotated[
    list[Capacity],
    Field(min_length=1, max_length=100_000, description="Capacities N in blocks; integers in [1, 2^40]; required."),
]
Seed = Annotated[int, Field(ge=0, le=2**63 - 1, description="Random seed; integer ≥ 0; default: 0.")]
Engine = Literal["vllm", "vllm-0.23", "content"]
BlockEngine = Literal["vllm", "vllm-0.23"]
