"""vLLM ``SimpleCPUOffloadConnector`` (eager mode) as a :class:`~kvhit.sim.tiers.HostTier`.

Read from **vLLM 0.33.0**: ``v1/simple_kv_offload/manager.py`` (``SimpleCPUOffloadScheduler``),
``distributed/kv_transfer/kv_connector/v1/simple_cpu_offload_connector.py``, ``v1/core/block_pool.py``.

The CPU tier is a second vLLM ``BlockPool`` of ``capacity`` CPU blocks (vLLM's ``num_cpu_blocks``; the pool's
``null_block`` takes one, so ``capacity - 1`` are usable; same block size, same free-queue LRU, same hash map),
mirrored by :class:`~kvhit.sim.block_reference.ReferenceBlockPool`:

* **Lookup** (``get_num_new_matched_tokens``) – from the GPU hit ``g`` (block-aligned), the CPU prefix hit over
  the prompt's remaining block hashes capped at ``max_hit_len = T - 1 - g`` (the CPU side keeps vLLM's
  ``T - 1`` cap, unlike the native connector). The hit CPU blocks are pinned (``touch``) and, when the load
  completes, freed in prefix order: they move to the CPU free-queue tail, tail block most recent.
* **Eager store** (``_select_eager_blocks_to_store``) – every confirmed-computed full block of the request from
  block 0 (GPU-hit blocks included) whose hash is not already on the CPU (no recency change for those) gets a
  new CPU block (``get_new_blocks``: free-queue head, evicting its hash), at most as many as the CPU pool has
  free blocks (a partial store, not all-or-nothing). On completion the CPU blocks are hashed and freed in
  prefix order (so, unlike the GPU's tail-first free, a request's *head* block is the CPU's next victim).
* **GPU side effect** – the GPU source blocks are pinned (``touch``) while the copy is in flight and freed
  in prefix order when it completes. For blocks stored while the request runs this changes nothing. For the
  blocks stored by the finish-time flush (``_queue_finished_eager_store``: a PD prefill request, or the last
  decode blocks of a colocated one) the GPU frees them *after* the request's own tail-first free: they are
  appended to the GPU free-queue tail in prefix order. This is modelled (the wrapped GPU engine's pool is
  touched and freed), so the GPU hit of this tier can differ from the single-tier simulator.

Stores of the prompt blocks of a colocated request happen while it runs (the step after its prefill); a
PD request (``colocated=False``) finishes at its prefill, so all its stores are finish-time flushes.

Lazy mode (``lazy_offload=True``) is :mod:`.simple_lazy`. Not modelled: copies in flight (``IN_FLIGHT``
admission, pinned blocks racing with allocation), the disk backend, boundary-state hand-offs (hybrid
models).
"""

from __future__ import annotations

from kvhit.sim.block_reference import ReferenceBlockPool
from kvhit.sim.engines import Request

__all__ = ["SimpleCpuTier"]


class SimpleCpuTier:
    """SimpleCPUOffloadConnector (eager) with ``capacity`` CPU blocks (one the null block) of ``block_size`` tokens."""

    def __init__(self, capacity: int, *, block_size: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity: expected a positive integer, got {capacity!r}")
        self.name = "simple-eager"
        self.capacity = capacity
        self.block_size = int(block_size)
        self.chunk_tokens = self.block_size
        self.cpu = ReferenceBlockPool(capacity - 1, self.block_size, unhashed_to_head=True)
        self.gpu = None
        self._pending: dict[int, list[int]] = {}  # rid -> GPU blocks of the finish-time flush
        self.evictions_before = 0

    def bind(self, gpu) -> None:
        self.gpu = gpu

    # ---- CPU BlockPool helpers --------------------------------------------------------------------
    def _cpu_hit(self, req: Request, g: int) -> list[int]:
        b = self.block_size
        max_hit_len = req.prompt_tokens - 1 - g
        if max_hit_len <= 0:
            return []
        hashes = req.block_hashes[g // b : req.prompt_tokens // b]
        hit = []
        for h in hashes[: max_hit_len // b]:
            blk = self.cpu.get_cached_block(h)
            if blk is None:
                break
            hit.append(blk)
        return hit

    def _store(self, hashes: list[int]) -> list[int]:
        """Eager store of the blocks with these hashes (prefix order); returns the indices stored."""
        cpu = self.cpu
        num_free = len(cpu.free_queue)
        idx = []
        for i, h in enumerate(hashes):
            if cpu.get_cached_block(h) is not None:
                continue
            if len(idx) >= num_free:
                break
            idx.append(i)
        if not idx:
            return []
        new = cpu.get_new_blocks(len(idx))
        for blk, i in zip(new, idx, strict=True):
            cpu.block_hash[blk] = hashes[i]
            cpu.cached.setdefault(hashes[i], {})[blk] = None
        cpu.free_blocks(new)
        return idx

    # ---- HostTier -------------------------------------------------------------------------------
    def lookup(self, req: Request, g: int) -> int:
        return len(self._cpu_hit(req, g)) * self.block_size

    def admit(self, req: Request, g: int, c: int) -> None:
        b = self.block_size
        if c:
            hit = self._cpu_hit(req, g)
            assert len(hit) * b == c
            self.cpu.touch(hit)
            self.cpu.free_blocks(hit)
        if self.gpu.colocated and req.output_tokens > 1:
            # prompt blocks are stored the step after the prefill, while the request runs: no GPU effect
            self._store(list(req.block_hashes[: req.prompt_tokens // b]))
            start = req.prompt_tokens // b
        else:
            start = 0
        self._pending[req.rid] = [start]

    def finish(self, req: Request) -> None:
        b = self.block_size
        start = self._pending.pop(req.rid)[0]
        confirmed = req.prompt_tokens + max(0, req.output_tokens - 1) if self.gpu.colocated else req.prompt_tokens
        end = confirmed // b
        hashes = list(req.block_hashes[start:end])
        idx = self._store(hashes)
        blocks = self.gpu.running[req.rid]
        pinned = [blocks[start + i] for i in idx]
        self.gpu.pool.touch(pinned)
        self._pending[req.rid] = pinned

    def after_finish(self, req: Request) -> None:
        pinned = self._pending.pop(req.rid)
        self.gpu.pool.free_blocks(pinned)

    def eviction_order(self) -> list[int]:
        bh = self.cpu.block_hash
        return [bh[x] for x in self.cpu.free_queue if bh[x] is not None]

    def resident(self) -> int:
        return len(self.cpu.cached)
