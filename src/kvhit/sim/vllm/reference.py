"""Plain-Python reference of the vLLM v1 prefix-cache block pool (slow; for tests and benchmarks).

Independent re-implementation of the semantics documented in :mod:`kvhit.sim.vllm.block`, written the way
vLLM itself is written: an ``OrderedDict`` plays ``FreeKVCacheBlockQueue`` (first key = head = next
block to reuse), a ``dict`` of insertion-ordered ``dict``s plays ``BlockHashToBlockMap``, a list holds
the ref counts, ``heapq`` orders finish events and a ``deque`` is the FIFO waiting queue. Functions
mirror ``KVCacheManager.get_computed_blocks`` / ``allocate_slots`` / ``free`` and ``BlockPool.touch`` /
``get_new_blocks`` / ``cache_full_blocks`` / ``free_blocks``.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque

import numpy as np

from kvhit.workload.requests import kv_tokens


class ReferenceBlockPool:
    """vLLM ``BlockPool`` + full-attention ``KVCacheManager`` for one KV-cache group, in pure Python."""

    def __init__(self, N: int, block_size: int, unhashed_to_head: bool = True) -> None:
        self.N = N
        self.b = block_size
        self.unhashed_to_head = unhashed_to_head
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(N))
        self.ref_cnt = [0] * N
        self.block_hash: list[int | None] = [None] * N
        self.cached: dict[int, dict[int, None]] = {}  # hash -> {block_id: None} in insertion order
        self.evictions = 0
        self.peak_in_use = 0
        self.ops = 0

    # ---- BlockPool ---------------------------------------------------------------------------------
    def get_cached_block(self, h: int) -> int | None:
        blocks = self.cached.get(h)
        if not blocks:
            return None
        return next(iter(blocks))

    def touch(self, blocks: list[int]) -> None:
        for blk in blocks:
            if self.ref_cnt[blk] == 0:
                del self.free_queue[blk]
            self.ref_cnt[blk] += 1

    def _maybe_evict_cached_block(self, blk: int) -> None:
        h = self.block_hash[blk]
        if h is None:
            return
        d = self.cached[h]
        del d[blk]
        if not d:
            del self.cached[h]
        self.block_hash[blk] = None
        self.evictions += 1

    def get_new_blocks(self, k: int) -> list[int]:
        assert k <= len(self.free_queue)
        out = []
        for _ in range(k):
            blk, _ = self.free_queue.popitem(last=False)
            out.append(blk)
        for blk in out:
            self._maybe_evict_cached_block(blk)
            assert self.ref_cnt[blk] == 0
            self.ref_cnt[blk] = 1
        return out

    def cache_full_blocks(self, blocks: list[int], hashes: list[int], num_cached: int, num_full: int) -> None:
        for i in range(num_cached, num_full):
            blk = blocks[i]
            assert self.block_hash[blk] is None
            self.block_hash[blk] = hashes[i]
            self.cached.setdefault(hashes[i], {})[blk] = None

    def free_blocks(self, ordered: list[int]) -> None:
        for blk in ordered:
            self.ref_cnt[blk] -= 1
        freeable = [blk for blk in ordered if self.ref_cnt[blk] == 0]
        if self.unhashed_to_head:
            fresh = [blk for blk in freeable if self.block_hash[blk] is None]
            kept = [blk for blk in freeable if self.block_hash[blk] is not None]
            for blk in reversed(fresh):  # prepend_n keeps the list order at the head
                self.free_queue[blk] = None
                self.free_queue.move_to_end(blk, last=False)
        else:
            kept = freeable
        for blk in kept:
            self.free_queue[blk] = None

    # ---- KVCacheManager ----------------------------------------------------------------------------
    def get_computed_blocks(self, hashes: list[int], num_tokens: int) -> list[int]:
        max_blocks = (num_tokens - 1) // self.b
        hit = []
        for i in range(max_blocks):
            self.ops += 1
            blk = self.get_cached_block(hashes[i])
            if blk is None:
                break
            hit.append(blk)
        return hit

    def can_allocate(self, hit: list[int], total_tokens: int) -> bool:
        need = math.ceil(total_tokens / self.b) - len(hit)
        need += sum(1 for blk in hit if self.ref_cnt[blk] == 0)
        return need <= len(self.free_queue)

    def allocate(self, hit: list[int], hashes: list[int], total_tokens: int) -> list[int]:
        self.touch(hit)
        new = self.get_new_blocks(math.ceil(total_tokens / self.b) - len(hit))
        blocks = hit + new
        self.cache_full_blocks(blocks, hashes, len(hit), total_tokens // self.b)
        self.peak_in_use = max(self.peak_in_use, self.N - len(self.free_queue))
        self.ops += 2 * len(blocks)
        return blocks

    def free(self, blocks: list[int]) -> None:
        self.free_blocks(list(reversed(blocks)))


def simulate_block_reference(
    prompt_tokens,
    hash_offsets,
    hashes,
    *,
    N: int,
    block_size: int,
    engine: str = "vllm",
    colocated: bool = False,
    response_tokens=None,
    times=None,
    hold=None,
) -> dict:
    """Reference of :func:`kvhit.sim.vllm.block.simulate_block` (same arguments, no input validation).

    Returns a dict with ``hit_blocks``, ``new_blocks``, ``wait``, ``rejected`` (numpy arrays) and
    ``evictions``, ``peak_blocks_in_use``, ``n_rejected``, ``block_ops``.
    """
    unhashed_to_head = {"vllm": True, "vllm-0.23": False}[engine]
    pool = ReferenceBlockPool(int(N), int(block_size), unhashed_to_head)
    b = int(block_size)
    T = [int(x) for x in np.asarray(prompt_tokens)]
    n = len(T)
    L = [kv_tokens(T[r], response_tokens[r]) for r in range(n)] if colocated else T
    off = [int(x) for x in np.asarray(hash_offsets)]
    hs = [int(x) for x in np.asarray(hashes).astype(np.int64)]
    req_hashes = [hs[off[r] : off[r + 1]] for r in range(n)]
    hit_blocks = [0] * n
    new_blocks = [0] * n
    wait = [0.0] * n
    rejected = [False] * n

    def fits(r: int) -> bool:
        return math.ceil(L[r] / b) <= pool.N

    def try_run(r: int) -> list[int] | None:
        hit = pool.get_computed_blocks(req_hashes[r], T[r])
        if not pool.can_allocate(hit, L[r]):
            return None
        blocks = pool.allocate(hit, req_hashes[r], L[r])
        hit_blocks[r] = len(hit)
        new_blocks[r] = len(blocks) - len(hit)
        return blocks

    if hold is None:
        for r in range(n):
            if not fits(r):
                rejected[r] = True
                wait[r] = float("nan")
                continue
            blocks = try_run(r)
            assert blocks is not None
            pool.free(blocks)
    else:
        tm = [float(x) for x in np.asarray(times)]
        hd = [float(x) for x in np.asarray(hold)]
        running: list[tuple[float, int]] = []
        held: dict[int, list[int]] = {}
        waiting: deque[int] = deque()
        r = 0
        while r < n or running:
            if running and (r >= n or running[0][0] <= tm[r]):
                now, f = heapq.heappop(running)
                pool.free(held.pop(f))
            else:
                now = tm[r]
                if fits(r):
                    waiting.append(r)
                else:
                    rejected[r] = True
                    wait[r] = float("nan")
                r += 1
            while waiting:
                w = waiting[0]
                blocks = try_run(w)
                if blocks is None:
                    break
                waiting.popleft()
                held[w] = blocks
                wait[w] = now - tm[w]
                heapq.heappush(running, (now + hd[w], w))

    return {
        "hit_blocks": np.array(hit_blocks, np.int64),
        "new_blocks": np.array(new_blocks, np.int64),
        "wait": np.array(wait, np.float64),
        "rejected": np.array(rejected, bool),
        "evictions": pool.evictions,
        "peak_blocks_in_use": pool.peak_in_use,
        "n_rejected": sum(rejected),
        "block_ops": pool.ops,
    }
