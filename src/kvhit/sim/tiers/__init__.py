"""Host-memory (DRAM) tiers behind a GPU prefix cache: vLLM native CPU offloading, SimpleCPUOffload, LMCache.

A host tier is not a second simulator: :class:`TieredEngine` wraps the ONE step-wise GPU engine of
:mod:`kvhit.sim.engine` (:class:`~kvhit.sim.vllm.engine.VllmEngine`) and is itself an
:class:`~kvhit.sim.engine.Engine`, so the shared :func:`~kvhit.sim.engine.replay` driver (with or without
``hold``) runs it unchanged. Per request it reports (:class:`TierOutcome`)

* ``gpu_hit_tokens`` ``g`` – the GPU prefix hit (vLLM's ``get_computed_blocks``, capped at ``T - 1``);
* ``cpu_hit_tokens`` ``c`` – tokens loaded from the host tier (beyond ``g``);
* ``computed_tokens`` – ``max(1, T - g - c)`` (a fully covered prompt still recomputes one token);
* ``load_bytes`` = ``c · bytes_per_token`` and ``load_seconds`` = ``load_bytes / pcie_bytes_per_s``;
* ``hit_tokens`` = ``g + c`` (so :class:`~kvhit.sim.engine.ReplayResult.hit_tokens` is the total reuse).

Engine versions read (wheels from ``pip download --no-deps``): **vLLM 0.33.0** and **LMCache 0.5.6**. The
tier models live one per file: :mod:`.native` (``OffloadingConnector`` + ``CPUOffloadingManager``, LRU and
ARC), :mod:`.simple` (``SimpleCPUOffloadConnector``, eager), :mod:`.simple_lazy` (the same connector with
``lazy_offload``: write-back from the GPU free queue; its own engine class, since its stores and its async load
step reorder the GPU pool between allocations), :mod:`.lmcache` (LMCache in-process, local CPU backend). Each
module docstring lists what it mirrors, where the code differs from issue 16's statements, and what is not
modelled.

Invariant shared by every tier (checked in ``tests/test_tiers.py``): the GPU engine's state is driven by
the request stream only. A KV load from the host allocates exactly the blocks a recompute would allocate
and the loaded blocks become ordinary GPU prefix-cache blocks (vLLM ``update_state_after_alloc`` then
``cache_blocks`` after the load), so ``g`` per request is the single-tier simulator's hit — *except* for
:mod:`.simple` and :mod:`.simple_lazy`, whose store paths pin GPU blocks and free them when the copy completes
(modelled there; it changes the GPU free-queue order).

Compiled twins for the sequential PD replay (no ``hold``), tested equal request by request and used by the surface
(:func:`kvhit.sim.tiers.surface.compiled_covers` says where): :mod:`.native_fast` (LRU), :mod:`.lmcache_fast`,
:mod:`.simple_fast` (eager and lazy).

Timing model: transfers complete at once (the conformance harness's worker completes every job in the
step it is issued); a load completes before the request computes, a store before the next event of the
replay. Chunked prefill, preemption and the backpressure of in-flight transfers are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kvhit.sim.engine import FinishOutcome, Request, RequestOutcome

__all__ = ["HostTier", "TierOutcome", "TieredEngine", "make_tiered"]


@dataclass(frozen=True)
class TierOutcome(RequestOutcome):
    """:class:`~kvhit.sim.engine.RequestOutcome` of a tiered engine (``hit_tokens`` = GPU + CPU)."""

    gpu_hit_tokens: int = 0
    cpu_hit_tokens: int = 0
    computed_tokens: int = 0
    load_bytes: int = 0
    load_seconds: float = 0.0


class HostTier(Protocol):
    """What :class:`TieredEngine` needs from a host tier model (all token counts are tokens).

    ``lookup(req, g)`` – tokens the tier would load beyond the GPU hit ``g`` now; may change tier state
    where the engine's lookup does (LMCache touches the keys it finds). ``admit(req, g, c)`` – the request
    was admitted with ``c`` tokens loaded: loads, then the stores of its prefill step. ``finish(req)`` /
    ``after_finish(req)`` – around the GPU engine's free: the stores offered in the step after the
    request finished and the commit of the request's recency. ``eviction_order()`` – tier keys, next
    victim first. ``capacity`` is in the tier's unit (chunks or blocks), ``chunk_tokens`` its size.
    """

    name: str
    capacity: int
    chunk_tokens: int

    def bind(self, gpu) -> None: ...

    def lookup(self, req: Request, g: int) -> int: ...

    def admit(self, req: Request, g: int, c: int) -> None: ...

    def finish(self, req: Request) -> None: ...

    def after_finish(self, req: Request) -> None: ...

    def eviction_order(self) -> list: ...

    def resident(self) -> int: ...


class TieredEngine:
    """A GPU :class:`~kvhit.sim.vllm.engine.VllmEngine` with a host tier behind it (see module docstring).

    ``bytes_per_token`` – KV bytes of one token over all layers (per TP rank or in total: the same unit as
    the bandwidth); ``pcie_bytes_per_s`` – host-to-device bandwidth used for ``load_seconds`` (``None``:
    0 s reported).
    """

    unit = "block"

    def __init__(self, gpu, host: HostTier, *, bytes_per_token: int = 0, pcie_bytes_per_s: float | None = None):
        if bytes_per_token < 0:
            raise ValueError(f"bytes_per_token: expected >= 0, got {bytes_per_token!r}")
        if pcie_bytes_per_s is not None and not pcie_bytes_per_s > 0:
            raise ValueError(f"pcie_bytes_per_s: expected > 0, got {pcie_bytes_per_s!r}")
        self.gpu = gpu
        self.host = host
        self.name = f"{gpu.name}+{host.name}"
        self.capacity = gpu.capacity
        self.bytes_per_token = int(bytes_per_token)
        self.pcie_bytes_per_s = pcie_bytes_per_s
        self._reqs: dict[int, Request] = {}
        host.bind(gpu)

    def fits(self, req: Request) -> bool:
        return self.gpu.fits(req)

    def submit(self, req: Request) -> TierOutcome | None:
        g = self.gpu.lookup(req) * self.gpu.block_size
        c = self.host.lookup(req, g)
        out = self.gpu.submit(req)
        if out is None:
            return None
        assert out.hit_tokens == g
        self.host.admit(req, g, c)
        self._reqs[req.rid] = req
        nbytes = c * self.bytes_per_token
        return TierOutcome(
            rid=out.rid,
            hit_tokens=g + c,
            hit_units=out.hit_units,
            new_blocks=out.new_blocks,
            evicted=out.evicted,
            evicted_units=out.evicted_units,
            gpu_hit_tokens=g,
            cpu_hit_tokens=c,
            computed_tokens=max(1, req.prompt_tokens - g - c),
            load_bytes=nbytes,
            load_seconds=(nbytes / self.pcie_bytes_per_s) if self.pcie_bytes_per_s else 0.0,
        )

    def finish(self, rid: int) -> FinishOutcome:
        req = self._reqs.pop(rid)
        self.host.finish(req)
        fo = self.gpu.finish(rid)
        self.host.after_finish(req)
        return fo

    def eviction_order(self) -> list:
        return self.gpu.eviction_order()

    def host_eviction_order(self) -> list:
        return self.host.eviction_order()

    def in_use(self) -> int:
        return self.gpu.in_use()


def make_tiered(
    tier: str,
    *,
    gpu_blocks: int,
    host_capacity: int,
    block_size: int,
    colocated: bool = False,
    engine: str = "vllm",
    bytes_per_token: int = 0,
    pcie_bytes_per_s: float | None = None,
    **kw,
) -> TieredEngine:
    """A tiered engine by name: ``"native"`` (vLLM OffloadingConnector, ``host_capacity`` in chunks;
    ``policy="lru"|"arc"``, ``blocks_per_chunk``, ``store_threshold``, ``prompt_only``), ``"simple"``
    (SimpleCPUOffloadConnector eager, ``host_capacity`` in CPU blocks), ``"simple-lazy"`` (lazy mode: a
    :class:`~kvhit.sim.tiers.simple_lazy.SimpleLazyEngine`, not a ``TieredEngine``; ``host_capacity`` = vLLM's
    ``num_cpu_blocks``; ``max_num_batched_tokens``), ``"lmcache"`` (``host_capacity``
    in 256-token chunks; ``chunk_tokens``)."""
    from kvhit.sim.vllm.engine import VllmEngine

    if tier == "simple-lazy":
        from kvhit.sim.tiers.simple_lazy import SimpleLazyEngine

        if engine != "vllm":
            raise ValueError(f"engine: the simple-lazy tier models vLLM 0.33.0 ('vllm'), got {engine!r}")
        return SimpleLazyEngine(  # type: ignore[return-value]
            gpu_blocks,
            block_size=block_size,
            num_cpu_blocks=host_capacity,
            colocated=colocated,
            bytes_per_token=bytes_per_token,
            pcie_bytes_per_s=pcie_bytes_per_s,
            **kw,
        )
    gpu = VllmEngine(gpu_blocks, block_size=block_size, engine=engine, colocated=colocated)
    if tier == "native":
        from kvhit.sim.tiers.native import NativeCpuTier

        host: HostTier = NativeCpuTier(host_capacity, block_size=block_size, **kw)
    elif tier == "simple":
        from kvhit.sim.tiers.simple import SimpleCpuTier

        host = SimpleCpuTier(host_capacity, block_size=block_size, **kw)
    elif tier == "lmcache":
        from kvhit.sim.tiers.lmcache import LMCacheTier

        host = LMCacheTier(host_capacity, block_size=block_size, **kw)
    else:
        raise ValueError(f"tier: expected one of ['lmcache', 'native', 'simple', 'simple-lazy'], got {tier!r}")
    return TieredEngine(gpu, host, bytes_per_token=bytes_per_token, pcie_bytes_per_s=pcie_bytes_per_s)
