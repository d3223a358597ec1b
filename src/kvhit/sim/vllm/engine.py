"""vLLM v1 prefix cache as a step-wise :class:`~kvhit.sim.engine.Engine`.

The semantics are those of :mod:`kvhit.sim.vllm.block` (read its docstring: lookup with the ``T - 1`` hit cap,
admission, touch, allocation from the free-queue head with lazy eviction, caching of full blocks, tail-first
free; ``engine="vllm"`` puts unhashed freed blocks at the head (vLLM >= 0.24), ``"vllm-0.23"`` appends
everything at the tail). The state machine is :class:`kvhit.sim.vllm.reference.ReferenceBlockPool` — the
plain-Python mirror of vLLM's ``BlockPool`` — so there is one Python implementation; this class only adds
per-request bookkeeping (which blocks a running request holds, what each step evicted) and inspection.
It is tested equal, request by request, to the compiled :func:`kvhit.sim.vllm.block.simulate_block`
(``tests/test_engines.py``) and, through :func:`kvhit.sim.engine.replay`, to vLLM's own ``KVCacheManager``
(``conformance/``).

Block ids are ``0 .. N - 1`` (vLLM's ids minus one: vLLM's block 0 is the reserved ``null_block``).
Not modelled: as :mod:`kvhit.sim.vllm.block` (chunked prefill, preemption, speculative decoding, hybrid models,
connectors); decode in the colocated mode is allocated at admission (identical pops when nothing runs
in between).
"""

from __future__ import annotations

import math

from kvhit.sim.engine import FinishOutcome, Request, RequestOutcome
from kvhit.sim.vllm.block import ENGINES
from kvhit.sim.vllm.reference import ReferenceBlockPool
from kvhit.workload.requests import kv_tokens

__all__ = ["VllmEngine"]


class _Pool(ReferenceBlockPool):
    """The reference pool, recording the hash of every evicted block (in eviction order)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.evicted_log: list[int] = []

    def _maybe_evict_cached_block(self, blk: int) -> None:
        h = self.block_hash[blk]
        super()._maybe_evict_cached_block(blk)
        if h is not None:
            self.evicted_log.append(h)


class VllmEngine:
    """vLLM ``KVCacheManager`` + ``BlockPool`` over ``N`` usable blocks of ``block_size`` tokens.

    ``colocated=True`` keeps the response KV (allocates and hashes ``T + output − 1`` tokens, Remark B.1: the
    last sampled token never gets KV, :func:`~kvhit.workload.requests.kv_tokens`);
    otherwise the pool is a PD-disaggregated prefiller (``L = T``).
    """

    unit = "block"

    def __init__(self, N: int, *, block_size: int, engine: str = "vllm", colocated: bool = False) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine: expected one of {sorted(ENGINES)}, got {engine!r}")
        if isinstance(N, bool) or not isinstance(N, int) or N < 1:
            raise ValueError(f"N: expected a positive integer, got {N!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size: expected a positive integer, got {block_size!r}")
        self.name = engine
        self.capacity = N
        self.block_size = block_size
        self.colocated = colocated
        self.pool = _Pool(N, block_size, ENGINES[engine])
        self.running: dict[int, list[int]] = {}

    # ---- helpers --------------------------------------------------------------------------------
    def _tokens(self, req: Request) -> int:
        return kv_tokens(req.prompt_tokens, req.output_tokens) if self.colocated else req.prompt_tokens

    def _check(self, req: Request) -> None:
        L = self._tokens(req)
        if len(req.block_hashes) != L // self.block_size:
            raise ValueError(
                f"request {req.rid}: block_hashes has {len(req.block_hashes)} ids, expected "
                f"{L // self.block_size} (allocated tokens // block_size)"
            )
        if req.rid in self.running:
            raise ValueError(f"request {req.rid}: already running")

    # ---- Engine protocol ------------------------------------------------------------------------
    def fits(self, req: Request) -> bool:
        return math.ceil(self._tokens(req) / self.block_size) <= self.capacity

    def lookup(self, req: Request) -> int:
        """Hit blocks a submission would get now (no state change)."""
        return len(self.pool.get_computed_blocks(list(req.block_hashes), req.prompt_tokens))

    def submit(self, req: Request) -> RequestOutcome | None:
        self._check(req)
        hashes = list(req.block_hashes)
        L = self._tokens(req)
        hit = self.pool.get_computed_blocks(hashes, req.prompt_tokens)
        if not self.pool.can_allocate(hit, L):
            return None
        mark = len(self.pool.evicted_log)
        blocks = self.pool.allocate(hit, hashes, L)
        self.running[req.rid] = blocks
        ev = tuple(self.pool.evicted_log[mark:])
        return RequestOutcome(
            rid=req.rid,
            hit_tokens=len(hit) * self.block_size,
            hit_units=len(hit),
            new_blocks=tuple(blocks[len(hit) :]),
            evicted=ev,
            evicted_units=len(ev),
        )

    def finish(self, rid: int) -> FinishOutcome:
        blocks = self.running.pop(rid)
        before = len(self.pool.free_queue)
        self.pool.free(blocks)
        return FinishOutcome(rid=rid, freed_units=len(self.pool.free_queue) - before)

    def free_queue_order(self) -> list[int]:
        """Block ids of the free queue, head (next to be reused) first."""
        return list(self.pool.free_queue)

    def eviction_order(self) -> list[int]:
        """Hashes of the cached free blocks in the order they would be evicted (head first)."""
        bh = self.pool.block_hash
        return [bh[x] for x in self.pool.free_queue if bh[x] is not None]

    def in_use(self) -> int:
        return self.capacity - len(self.pool.free_queue)

    @property
    def evictions(self) -> int:
        return self.pool.evictions

    def cached_hashes(self) -> set[int]:
        """Every hash with at least one cached block (free or in use)."""
        return set(self.pool.cached)
