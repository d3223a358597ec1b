"""The engine registry: an engine's name → its models in kvhit, so callers dispatch once, by name.

Each :class:`EngineModel` says what an engine is to kvhit's simulators:

* ``unit`` — the allocation unit its capacity is counted in (``"block"``: vLLM's KV blocks of ``b`` tokens;
  ``"token"``: SGLang's KV pool in tokens, a multiple of its page size);
* ``step`` — the step-wise :class:`~kvhit.sim.engine.Engine` (conformance, fleets, tiers wrap it);
* ``bulk`` — the compiled trace simulator (``simulate_block`` for vLLM, ``radix_rows`` for SGLang);
* ``curve`` — the one-pass all-capacity curve, or ``None`` where none exists (SGLang's whole-leaf eviction has
  no inclusion property: :mod:`kvhit.sim.sglang.run`);
* ``capacity_at_memory(N_blocks, block_size, page_size)`` — the engine's capacity at the memory of ``N_blocks``
  vLLM blocks (both pools store the same bytes per token): ``N`` for vLLM, ``N·b`` tokens rounded down to whole
  pages for SGLang.

The estimators and the service-level rules (flags that apply to one engine only) are layered on top in
:mod:`kvhit.service.engines` — this module is in ``sim`` and imports nothing above it.

Invariant: :func:`make_engine` and :data:`ENGINES` agree on the names; an unknown name is a one-line
``ValueError`` listing the known ones. Not modelled here: anything the engine models themselves do not model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvhit.sim.engine import Engine

__all__ = ["ENGINES", "EngineModel", "engine_model", "make_engine"]


def _ref(path: str) -> Callable[..., Any]:
    """A callable resolved on first call (``module:attr``), so the registry imports no compiled kernel itself."""
    mod, attr = path.split(":")

    def call(*a, **kw):
        return getattr(importlib.import_module(mod), attr)(*a, **kw)

    call.__name__ = attr
    call.__qualname__ = f"{mod}.{attr}"
    return call


@dataclass(frozen=True)
class EngineModel:
    """What the registry knows of one engine name: its label and capacity unit, the step-wise model (``step``),
    the whole-trace simulator (``bulk``), the one-pass curve (``None`` where there is none) and the capacity at a
    KV memory (``capacity_at_memory``) — what the services dispatch to."""

    name: str
    label: str
    unit: str
    step: Callable[..., Engine]
    bulk: Callable[..., Any]
    curve: Callable[..., Any] | None
    capacity_at_memory: Callable[[int, int, int], int]


def _blocks(N: int, block_size: int, page_size: int = 1) -> int:
    return int(N)


def _tokens(N: int, block_size: int, page_size: int = 1) -> int:
    return int(N) * int(block_size) // int(page_size) * int(page_size)


def _vllm(engine: str):
    def step(capacity: int, **kw) -> Engine:
        from kvhit.sim.vllm.engine import VllmEngine

        return VllmEngine(capacity, engine=engine, **kw)

    return step


def _sglang(capacity: int, **kw) -> Engine:
    from kvhit.sim.sglang.engine import SglangEngine

    return SglangEngine(capacity, **kw)


ENGINES: dict[str, EngineModel] = {
    "vllm": EngineModel(
        "vllm",
        "vLLM ≥ 0.24 (block pool, tail-first free queue)",
        "block",
        _vllm("vllm"),
        _ref("kvhit.sim.vllm.block:simulate_block"),
        _ref("kvhit.sim.vllm.curve:block_curve"),
        _blocks,
    ),
    "vllm-0.23": EngineModel(
        "vllm-0.23",
        "vLLM ≤ 0.23 (block pool, 0.23 free-queue order)",
        "block",
        _vllm("vllm-0.23"),
        _ref("kvhit.sim.vllm.block:simulate_block"),
        _ref("kvhit.sim.vllm.curve:block_curve"),
        _blocks,
    ),
    "sglang": EngineModel(
        "sglang",
        "SGLang 0.5.23 (radix cache, token pool)",
        "token",
        _sglang,
        _ref("kvhit.sim.sglang.run:radix_rows"),
        None,
        _tokens,
    ),
}


def engine_model(engine: str) -> EngineModel:
    """The registry entry of ``engine``, or a one-line ``ValueError`` naming the known engines."""
    try:
        return ENGINES[engine]
    except KeyError:
        raise ValueError(f"engine: expected one of {sorted(ENGINES)}, got {engine!r}") from None


def make_engine(engine: str, capacity: int, **kw) -> Engine:
    """A step-wise engine model by name: ``"vllm"``, ``"vllm-0.23"`` (``capacity`` = usable blocks;
    ``block_size``, ``colocated``) or ``"sglang"`` (``capacity`` = KV pool tokens; ``page_size``,
    ``evict_policy``)."""
    return engine_model(engine).step(capacity, **kw)
