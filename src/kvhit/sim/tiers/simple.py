"""vLLM ``SimpleCPUOffloadConnector`` (eager mode) as a :class:`~kvhit.sim.tiers.HostTier`.

Read from **vLLM 0.33.0**: ``v1/simple_kv_offload/manager.py`` (``SimpleCPUOffloadScheduler``),
``distributed/kv_transfer/kv_connector/v1/simple_cpu_offload_connector.py``, ``v1/core/block_pool.py``.

The CPU tier is a second vLLM ``BlockPool`` of ``capacity`` CPU blocks (vLLM's ``num_cpu_blocks``; the pool's
``null_block`` takes one, so ``capacity - 1`` are usable; same block size, same free-queue LRU, same hash map),
mirrored by :class:`~kvhit.sim.vllm.reference.ReferenceBlockPool`:

* **Lookup** (``get_num_new_matched_tokens``) – from the GPU hit ``g`` (block-aligned), the CPU prefix hit over
  the prompt's remaining block hashes capped at ``max_hit_len = T - 1 - g`` (the CPU side keeps vLLM's
  ``T - 1`` cap, unlike the native connector). The hit CPU blocks are pinned (``touch``) and, when the load
  completes, freed in prefix order: they move to the CPU free-queue tail, tail block most recent.
* **Eager store** (``_prepare_eager_store_specs`` → ``_select_eager_blocks_to_store``) – at every step that
  schedules the request, from a per-request cursor, the full blocks *confirmed before the step*
  (``num_computed_tokens``: ``g + c`` at the prefill step, so the GPU-hit and loaded blocks; ``T + s - 1``
  at decode step ``s``) whose hash is not already on the CPU (no recency change for those) get a new CPU
  block (``get_new_blocks``: free-queue head, evicting its hash), at most as many as the CPU pool has free
  (a partial store, not all-or-nothing); the cursor moves past every block looked at. The blocks computed in
  the request's last step are stored by the finish-time flush (``_queue_finished_eager_store``, called in
  ``request_finished`` before the GPU free, emitted in the step that reports the finished request). On
  completion the CPU blocks are hashed and freed in prefix order (so, unlike the GPU's tail-first free, a
  request's *head* block is the CPU's next victim).
* **GPU side effect** – the GPU source blocks are pinned (``touch``) while the copy is in flight and freed in
  prefix order when it completes. For stores that complete while the request runs this changes nothing. The
  stores of the request's finishing step (a PD request finishes in its prefill step) and of the flush
  complete *after* the request's own tail-first free: those blocks are appended to the GPU free-queue tail in
  prefix order, the finishing step's first. This is modelled (the wrapped GPU engine's pool is touched and
  freed), so the GPU hit of this tier can differ from the single-tier simulator.

Checked against vLLM's real ``Scheduler`` with the connector (``conformance/check_tiers_scheduler.py --tier
simple``, PD requests); an earlier version that stored all of a PD request's blocks in the flush mismatched there
(the prefill step's store of the GPU-hit blocks evicts CPU blocks before the flush looks).

Lazy mode (``lazy_offload=True``) is :mod:`.simple_lazy`. Not modelled: copies in flight (``IN_FLIGHT``
admission, pinned blocks racing with allocation), the disk backend, boundary-state hand-offs (hybrid
models).
"""

from __future__ import annotations

from kvhit.sim.engine import Request
from kvhit.sim.vllm.reference import ReferenceBlockPool

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

    def _select(self, hashes, start: int, end: int) -> tuple[list[int], int]:
        """``_select_eager_blocks_to_store``: from the cursor ``start``, the blocks of ``[start, end)`` whose hash is
        not on the CPU, at most as many as the CPU pool has free; returns (indices, the advanced cursor)."""
        cpu = self.cpu
        num_free = len(cpu.free_queue)
        idx: list[int] = []
        i = start
        while i < end:
            if cpu.get_cached_block(hashes[i]) is None:
                if len(idx) >= num_free:
                    break
                idx.append(i)
            i += 1
        return idx, i

    def _issue(self, req: Request, idx: list[int]):
        """A store job: CPU blocks from the CPU free-queue head (evicting their hashes), GPU sources pinned."""
        if not idx:
            return None
        new = self.cpu.get_new_blocks(len(idx))
        src = [self.gpu.running[req.rid][i] for i in idx]
        self.gpu.pool.touch(src)
        return new, [req.block_hashes[i] for i in idx], src

    def _complete(self, job) -> None:
        """``_process_store_completion``: hash the CPU blocks, free them, then the GPU sources, in prefix order."""
        if job is None:
            return
        new, hashes, src = job
        cpu = self.cpu
        for blk, h in zip(new, hashes, strict=True):
            cpu.block_hash[blk] = h
            cpu.cached.setdefault(h, {})[blk] = None
        cpu.free_blocks(new)
        self.gpu.pool.free_blocks(src)

    # ---- HostTier -------------------------------------------------------------------------------
    def lookup(self, req: Request, g: int) -> int:
        return len(self._cpu_hit(req, g)) * self.block_size

    def admit(self, req: Request, g: int, c: int) -> None:
        b, T = self.block_size, req.prompt_tokens
        if c:
            hit = self._cpu_hit(req, g)
            assert len(hit) * b == c
            self.cpu.touch(hit)
            self.cpu.free_blocks(hit)  # the load step: the load completes before the compute step
        hashes = req.block_hashes
        n = len(hashes)
        steps = max(1, req.output_tokens) if self.gpu.colocated else 1  # PD: finishes in its prefill step
        cursor = 0
        last = None
        s = 0
        while s < steps:
            # step s stores the blocks confirmed before it: g + c at the prefill step, T + s - 1 after
            confirmed = g + c if s == 0 else T + s - 1
            end = min(confirmed // b, n)
            if cursor >= end and s > 0:
                s = max(s + 1, (cursor + 1) * b - T + 1)  # the next step that confirms a new block
                continue
            idx, cursor = self._select(hashes, cursor, end)
            job = self._issue(req, idx)
            if s < steps - 1:
                self._complete(job)  # completes within the step while the request runs: no GPU effect
            else:
                last = job  # the finishing step: completes after the request's blocks are freed
            s += 1
        self._pending[req.rid] = [cursor, last]

    def finish(self, req: Request) -> None:
        """``_queue_finished_eager_store`` (in ``request_finished``, before the GPU free)."""
        b = self.block_size
        cursor, last = self._pending.pop(req.rid)
        confirmed = req.prompt_tokens + max(0, req.output_tokens - 1) if self.gpu.colocated else req.prompt_tokens
        idx, _ = self._select(req.block_hashes, cursor, min(confirmed // b, len(req.block_hashes)))
        self._pending[req.rid] = [last, self._issue(req, idx)]

    def after_finish(self, req: Request) -> None:
        last, flush = self._pending.pop(req.rid)
        self._complete(last)  # the finishing step's stores
        self._complete(flush)  # the flush, in the step that reports the finished request

    def eviction_order(self) -> list[int]:
        bh = self.cpu.block_hash
        return [bh[x] for x in self.cpu.free_queue if bh[x] is not None]

    def resident(self) -> int:
        return len(self.cpu.cached)
