"""vLLM ``SimpleCPUOffloadConnector`` in **lazy** mode (write-back) as a step-wise engine with a CPU tier.

Read from **vLLM 0.33.0** (``pip download --no-deps vllm==0.33.0``): ``v1/simple_kv_offload/manager.py``
(``SimpleCPUOffloadScheduler``: ``_prepare_lazy_store_specs``, ``_estimate_lazy_target_blocks``,
``get_num_new_matched_tokens``, ``update_state_after_alloc``, ``update_connector_output``,
``_process_store_completion``), ``distributed/kv_transfer/kv_connector/v1/simple_cpu_offload_connector.py``
(``kv_connector_extra_config``: ``lazy_offload``, ``cpu_bytes_to_use``, ``num_cpu_blocks``), ``v1/core/block_pool.py``
(``touch``, ``free_blocks``: unhashed blocks to the head, hashed to the tail), ``v1/core/kv_cache_utils.py``
(``FreeKVCacheBlockQueue.iter_blocks_after``), ``v1/core/sched/scheduler.py`` (async loads, order of
``update_from_output``).

What lazy mode does (one full-attention group, ``hash_block_size == block_size``):

* **CPU pool** – a second vLLM ``BlockPool`` of ``num_cpu_blocks`` blocks, of which one is the pool's
  ``null_block``: ``num_cpu_blocks - 1`` usable blocks (:attr:`SimpleLazyEngine.cpu_usable`).
* **Lookup** – as eager (:mod:`.simple`): the CPU prefix hit beyond the GPU hit ``g``, capped at
  ``T - 1 - g`` tokens; the hit CPU blocks are pinned (``touch``) until the load completes, then freed in
  prefix order (CPU free-queue tail). The load is **async**: the request spends one scheduler step
  allocating only the loaded blocks (``num_new_tokens = 0``), then a second step allocating the rest.
* **Store** – no per-request stores. At every scheduler step ``build_connector_meta`` walks the *GPU free
  queue* from a cursor (``_prepare_lazy_store_specs``): the cursor is dropped when its block has
  ``ref_cnt > 0`` (then the walk starts at the head), the walk visits at most ``target_free`` free blocks
  after the cursor and stops once it selected as many blocks as the CPU pool has free, it selects every
  visited block that has a hash not cached on the CPU, and the cursor moves to the last visited block.
  ``target_free = 2 · ⌈max_num_batched_tokens / block_size⌉`` (``_estimate_lazy_target_blocks``,
  ``WATERMARK_RATIO = 1``). Selected GPU blocks are pinned (``touch``: out of the GPU free queue) and get
  CPU blocks from the CPU free-queue head (evicting their hashes). When the store completes, the CPU
  blocks get the GPU blocks' hashes and both are freed in walk order: **the GPU blocks go back to the
  GPU free-queue tail** — a lazy store moves blocks from near eviction to most recent on the GPU too.
* **Timing** (as the other tiers: transfers complete at once) – every transfer completes in the
  ``update_from_output`` of the step that issued it, after the step's finished requests were freed
  (scheduler order: free finished requests, then ``update_connector_output``: loads, then stores).
  Consequence, read off the code: when the last visited block was stored, the cursor sits on the GPU
  free-queue tail after the step, so blocks freed in that step lie *before* the cursor and are not walked
  until the cursor is dropped (its block reused or evicted). With transfers that complete a step later
  the cursor would be dropped instead (its block still pinned) — the walk is timing-dependent; that
  timing is not modelled.

Steps of a replay (:func:`kvhit.sim.engine.replay`): a submission is one scheduler step (two with a
CPU load: the load step, then the compute step), each with its walk after the step's allocation; the
stores of the last step complete when the next event comes, and a finish that directly follows its own
submission belongs to that step (a PD prefill finishes in the step that computes it), so it frees the
request's blocks first. After a finish the engine takes one more step (``EngineCore.step`` runs while
``scheduler.has_requests()``, which counts finished requests not yet reported): one more walk, its
stores completing in it. Exact for the sequential PD replay (no ``hold``); with ``hold`` it is this
stated order, not a step-accurate schedule.

Checked request by request against vLLM 0.33.0's real ``Scheduler`` with this connector
(``conformance/check_tiers_scheduler.py --tier simple-lazy``: GPU and CPU hits, CPU and GPU eviction orders),
which is how the step that reports a finished request was found to walk too.

Not modelled: colocated decode (decode steps interleave block allocations with walks: refused), eager
mode (:mod:`.simple`), copies in flight (pinned blocks, cursor invalidation by in-flight stores),
preemption, chunked prefill, the disk backend, hybrid models, vLLM < 0.24's free order.
"""

from __future__ import annotations

import math

from kvhit.sim.engine import FinishOutcome, Request
from kvhit.sim.tiers import TierOutcome
from kvhit.sim.vllm.reference import ReferenceBlockPool

__all__ = ["LinkedFreeQueue", "SimpleLazyEngine", "lazy_target_blocks"]


def lazy_target_blocks(max_num_batched_tokens: int, block_size: int) -> int:
    """``_estimate_lazy_target_blocks`` of vLLM 0.33.0 for one full-attention group."""
    return int(-(-int(max_num_batched_tokens) // int(block_size)) * 2)


class LinkedFreeQueue:
    """vLLM's ``FreeKVCacheBlockQueue`` (a doubly linked list) with the ``OrderedDict`` calls
    :class:`~kvhit.sim.vllm.reference.ReferenceBlockPool` makes, plus :meth:`iter_after`."""

    _H = -1  # sentinel ids: head and tail
    _T = -2

    def __init__(self, keys) -> None:
        self.nxt: dict[int, int] = {}
        self.prv: dict[int, int] = {}
        self.nxt[self._H] = self._T
        self.prv[self._T] = self._H
        self._n = 0
        for k in keys:
            self[k] = None

    def __len__(self) -> int:
        return self._n

    def __contains__(self, k) -> bool:
        return k in self.prv and k != self._T

    def __iter__(self):
        k = self.nxt[self._H]
        while k != self._T:
            yield k
            k = self.nxt[k]

    def iter_after(self, k: int | None):
        """Blocks after ``k`` (from the head when ``None``), head to tail (``iter_blocks_after``)."""
        k = self.nxt[self._H] if k is None else self.nxt[k]
        while k != self._T:
            yield k
            k = self.nxt[k]

    def _link(self, k: int, after: int) -> None:
        b = self.nxt[after]
        self.nxt[after] = k
        self.prv[k] = after
        self.nxt[k] = b
        self.prv[b] = k
        self._n += 1

    def __delitem__(self, k: int) -> None:
        a, b = self.prv.pop(k), self.nxt.pop(k)
        self.nxt[a] = b
        self.prv[b] = a
        self._n -= 1

    def __setitem__(self, k: int, _v) -> None:
        if k not in self:
            self._link(k, self.prv[self._T])

    def popitem(self, last: bool = True):
        k = self.prv[self._T] if last else self.nxt[self._H]
        if k in (self._H, self._T):
            raise KeyError("popitem(): free queue is empty")
        del self[k]
        return k, None

    def move_to_end(self, k: int, last: bool = True) -> None:
        del self[k]
        self._link(k, self.prv[self._T] if last else self._H)


class _GpuPool(ReferenceBlockPool):
    """The vLLM (>= 0.24) reference pool over a linked free queue, recording evicted hashes."""

    def __init__(self, N: int, block_size: int) -> None:
        super().__init__(N, block_size, True)
        self.free_queue = LinkedFreeQueue(range(N))  # type: ignore[assignment]
        self.evicted_log: list[int] = []

    def _maybe_evict_cached_block(self, blk: int) -> None:
        h = self.block_hash[blk]
        super()._maybe_evict_cached_block(blk)
        if h is not None:
            self.evicted_log.append(h)


class _CpuView:
    """The CPU tier of a :class:`SimpleLazyEngine`, with a host tier's inspection calls."""

    name = "simple-lazy"

    def __init__(self, e: SimpleLazyEngine) -> None:
        self._e = e
        self.capacity = e.num_cpu_blocks
        self.chunk_tokens = e.block_size

    def eviction_order(self) -> list[int]:
        """Hashes of the cached free CPU blocks, next victim first."""
        bh = self._e.cpu.block_hash
        return [bh[x] for x in self._e.cpu.free_queue if bh[x] is not None]

    def resident(self) -> int:
        """CPU blocks holding a hash."""
        return sum(len(v) for v in self._e.cpu.cached.values())


class SimpleLazyEngine:
    """GPU prefix cache (vLLM 0.33.0, PD prefiller) + SimpleCPUOffloadConnector ``lazy_offload=True``.

    ``N`` usable GPU blocks; ``num_cpu_blocks`` as vLLM sizes the CPU pool (one of them is its null block);
    ``max_num_batched_tokens`` sets the walk length (vLLM's default on H100/H200 for the API server: 8192).
    Per request it returns a :class:`~kvhit.sim.tiers.TierOutcome` (see the module docstring).
    """

    unit = "block"

    def __init__(
        self,
        N: int,
        *,
        block_size: int,
        num_cpu_blocks: int,
        max_num_batched_tokens: int = 8192,
        colocated: bool = False,
        bytes_per_token: int = 0,
        pcie_bytes_per_s: float | None = None,
    ) -> None:
        for name, v, lo in (
            ("N", N, 1),
            ("block_size", block_size, 1),
            ("num_cpu_blocks", num_cpu_blocks, 1),
            ("max_num_batched_tokens", max_num_batched_tokens, 1),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
        if colocated:
            raise ValueError("colocated: the lazy SimpleCPUOffload model covers PD prefill only (no decode steps)")
        if bytes_per_token < 0:
            raise ValueError(f"bytes_per_token: expected >= 0, got {bytes_per_token!r}")
        if pcie_bytes_per_s is not None and not pcie_bytes_per_s > 0:
            raise ValueError(f"pcie_bytes_per_s: expected > 0, got {pcie_bytes_per_s!r}")
        self.name = "vllm+simple-lazy"
        self.capacity = N
        self.block_size = block_size
        self.colocated = False
        self.num_cpu_blocks = num_cpu_blocks
        self.cpu_usable = num_cpu_blocks - 1
        self.target_free = lazy_target_blocks(max_num_batched_tokens, block_size)
        self.bytes_per_token = int(bytes_per_token)
        self.pcie_bytes_per_s = pcie_bytes_per_s
        self.gpu = _GpuPool(N, block_size)
        self.cpu = ReferenceBlockPool(self.cpu_usable, block_size, True)
        self.cursor: int | None = None
        self.running: dict[int, list[int]] = {}
        self._pending: list[tuple[list[int], list[int]]] = []  # stores of the last step (GPU, CPU blocks)
        self._last: int | None = None  # rid admitted by the last step (its finish belongs to that step)
        self._walk_after_finish = True  # False only in the conformance suite's negative control
        self.stored_blocks = 0
        self.host = _CpuView(self)  # as a TieredEngine: e.host.resident(), e.host.eviction_order()

    # ---- connector ------------------------------------------------------------------------------
    def _cpu_hit(self, req: Request, g: int) -> list[int]:
        b = self.block_size
        cap = (req.prompt_tokens - 1 - g) // b
        hit = []
        for h in req.block_hashes[g // b : req.prompt_tokens // b][: max(cap, 0)]:
            blk = self.cpu.get_cached_block(h)
            if blk is None:
                break
            hit.append(blk)
        return hit

    def _walk(self) -> None:
        """``_prepare_lazy_store_specs``: one step's store selection (stores stay pinned until completion)."""
        gpu, cpu = self.gpu, self.cpu
        if self.cursor is not None and gpu.ref_cnt[self.cursor] > 0:
            self.cursor = None
        num_cpu_free = len(cpu.free_queue)
        sel: list[int] = []
        last = self.cursor
        for covered, blk in enumerate(gpu.free_queue.iter_after(self.cursor)):
            if covered >= self.target_free or len(sel) >= num_cpu_free:
                break
            last = blk
            h = gpu.block_hash[blk]
            if h is not None and cpu.get_cached_block(h) is None:
                sel.append(blk)
        self.cursor = last
        if sel:
            new = cpu.get_new_blocks(len(sel))
            gpu.touch(sel)
            self._pending.append((sel, new))

    def _complete_stores(self) -> None:
        """``_process_store_completion``: hash the CPU blocks, free CPU then GPU blocks in walk order."""
        gpu, cpu = self.gpu, self.cpu
        for sel, new in self._pending:
            for g_blk, c_blk in zip(sel, new, strict=True):
                h = gpu.block_hash[g_blk]
                assert h is not None
                cpu.block_hash[c_blk] = h
                cpu.cached.setdefault(h, {})[c_blk] = None
            cpu.free_blocks(new)
            gpu.free_blocks(sel)
            self.stored_blocks += len(sel)
        self._pending = []
        self._last = None

    # ---- Engine protocol ------------------------------------------------------------------------
    def fits(self, req: Request) -> bool:
        return math.ceil(req.prompt_tokens / self.block_size) <= self.capacity

    def submit(self, req: Request) -> TierOutcome | None:
        b, T = self.block_size, req.prompt_tokens
        if len(req.block_hashes) != T // b:
            raise ValueError(f"request {req.rid}: block_hashes has {len(req.block_hashes)} ids, expected {T // b}")
        if req.rid in self.running:
            raise ValueError(f"request {req.rid}: already running")
        self._complete_stores()  # the previous step ended without a finish in it
        gpu = self.gpu
        hashes = list(req.block_hashes)
        hit = gpu.get_computed_blocks(hashes, T)
        if not gpu.can_allocate(hit, T):
            return None
        g = len(hit) * b
        cpu_hit = self._cpu_hit(req, g)
        c = len(cpu_hit) * b
        mark = len(gpu.evicted_log)
        gpu.touch(hit)
        blocks = list(hit)
        if c:
            # load step: only the loaded blocks are allocated; the hit CPU blocks stay pinned during the walk
            self.cpu.touch(cpu_hit)
            blocks += gpu.get_new_blocks(len(cpu_hit))
            self._walk()
            self.cpu.free_blocks(cpu_hit)  # load completion (before the store completion)
            self._complete_stores()
        blocks += gpu.get_new_blocks(math.ceil(T / b) - len(blocks))
        gpu.cache_full_blocks(blocks, hashes, len(hit), T // b)
        self.running[req.rid] = blocks
        self._walk()
        self._last = req.rid
        ev = tuple(gpu.evicted_log[mark:])
        nbytes = c * self.bytes_per_token
        return TierOutcome(
            rid=req.rid,
            hit_tokens=g + c,
            hit_units=len(hit),
            new_blocks=tuple(blocks[len(hit) :]),
            evicted=ev,
            evicted_units=len(ev),
            gpu_hit_tokens=g,
            cpu_hit_tokens=c,
            computed_tokens=max(1, T - g - c),
            load_bytes=nbytes,
            load_seconds=(nbytes / self.pcie_bytes_per_s) if self.pcie_bytes_per_s else 0.0,
        )

    def finish(self, rid: int) -> FinishOutcome:
        if self._last != rid:
            self._complete_stores()
        blocks = self.running.pop(rid)
        before = len(self.gpu.free_queue)
        self.gpu.free(blocks)
        freed = len(self.gpu.free_queue) - before
        self._complete_stores()
        # the engine takes one more step to report the finished request (``has_finished_requests``): a walk
        if self._walk_after_finish:
            self._walk()
            self._complete_stores()
        return FinishOutcome(rid=rid, freed_units=freed)

    def eviction_order(self) -> list[int]:
        """GPU: hashes of the cached free blocks, next victim first."""
        bh = self.gpu.block_hash
        return [bh[x] for x in self.gpu.free_queue if bh[x] is not None]

    def host_eviction_order(self) -> list[int]:
        return self.host.eviction_order()

    def in_use(self) -> int:
        return self.capacity - len(self.gpu.free_queue)
