"""vLLM's own ``KVCacheManager`` / ``BlockPool`` behind kvhit's step-wise :class:`~kvhit.sim.engine.Engine`.

Runs only inside a throwaway environment that has a vLLM wheel (``conformance/make_env.sh``); never imported
by kvhit. The scheduler loop around the cache is transcribed from ``vllm/v1/core/sched/scheduler.py``
(no chunked prefill, no connector, no speculative decoding), for a PD prefiller (``L = T``):

* admission = ``get_computed_blocks(request)`` then ``allocate_slots(request, T - hit, hit, blocks)``;
  ``None`` = not schedulable now (the waiting request stays at the queue head: FCFS);
* finish = ``free(request)``.

Nothing of the cache is stubbed: the real ``KVCacheConfig`` (one full-attention group, ``N + 1`` blocks:
vLLM's ``null_block`` is block 0), the real ``Request`` with the real block hasher (sha256), the real
block pool. The only additions are observers: evicted hashes are recorded by wrapping the pool's own
``_maybe_evict_cached_block`` (the wrapped call is unchanged) and the free queue is read with
``get_all_free_blocks``. vLLM block ids are reported minus one so they match kvhit's ``0 .. N - 1``.

A request needing more than ``N`` blocks is rejected by the driver (``fits``): real vLLM never sees one
(``max_model_len`` must fit in the KV cache at start-up).
"""

from __future__ import annotations

import inspect
import math

import torch
import vllm
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request as VRequest

from kvhit.sim.engine import FinishOutcome, Request, RequestOutcome

VERSION = vllm.__version__


def _kw(fn, **kw):
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kw.items() if k in params}


class RealVllmEngine:
    """vLLM's ``KVCacheManager`` with ``N`` usable blocks of ``block_size`` tokens (PD prefiller)."""

    unit = "block"

    def __init__(self, N: int, *, block_size: int) -> None:
        self.name = f"vllm=={VERSION}"
        self.capacity = N
        self.b = block_size
        init_none_hash(sha256)
        spec = FullAttentionSpec(
            **_kw(FullAttentionSpec, block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
        )
        cfg = KVCacheConfig(
            num_blocks=N + 1,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
        )
        max_len = (N + 1) * block_size
        self.mgr = KVCacheManager(
            **_kw(
                KVCacheManager.__init__,
                kv_cache_config=cfg,
                max_model_len=max_len,
                scheduler_block_size=block_size,
                hash_block_size=block_size,
                enable_caching=True,
            )
        )
        self.pool = self.mgr.block_pool
        self.hasher = get_request_block_hasher(block_size, sha256)
        self.id_of: dict = {}  # vLLM block hash -> kvhit id
        self.reqs: dict[int, VRequest] = {}
        self._evicted: list[int] = []
        orig = self.pool._maybe_evict_cached_block

        def observed(block):
            h = block.block_hash
            evicted = orig(block)
            if evicted:
                self._evicted.append(self.id_of[h])
            return evicted

        self.pool._maybe_evict_cached_block = observed
        assert kv_cache_utils.NONE_HASH is not None

    def fits(self, req: Request) -> bool:
        return math.ceil(req.prompt_tokens / self.b) <= self.capacity

    def submit(self, req: Request) -> RequestOutcome | None:
        toks = list(req.token_ids[: req.prompt_tokens])
        vr = VRequest(
            **_kw(
                VRequest.__init__,
                request_id=str(req.rid),
                prompt_token_ids=toks,
                sampling_params=SamplingParams(max_tokens=1),
                pooling_params=None,
                block_hasher=self.hasher,
            )
        )
        blocks, hit = self.mgr.get_computed_blocks(vr)[:2]
        mark = len(self._evicted)
        new = self.mgr.allocate_slots(vr, req.prompt_tokens - hit, hit, blocks)
        if new is None:
            assert len(self._evicted) == mark
            return None
        vr.num_computed_tokens = req.prompt_tokens
        self.reqs[req.rid] = vr
        held = self.mgr.get_blocks(vr.request_id).blocks[0]
        for i, blk in enumerate(held):
            if blk.block_hash is not None and i < len(req.block_hashes):
                self.id_of[blk.block_hash] = req.block_hashes[i]
        ev = tuple(self._evicted[mark:])
        hitn = hit // self.b
        return RequestOutcome(
            rid=req.rid,
            hit_tokens=hit,
            hit_units=hitn,
            new_blocks=tuple(b.block_id - 1 for b in held[hitn:]),
            evicted=ev,
            evicted_units=len(ev),
        )

    def finish(self, rid: int) -> FinishOutcome:
        vr = self.reqs.pop(rid)
        before = self.pool.get_num_free_blocks()
        self.mgr.free(vr)
        return FinishOutcome(rid=rid, freed_units=self.pool.get_num_free_blocks() - before)

    def free_queue_order(self) -> list[int]:
        return [b.block_id - 1 for b in self.pool.free_block_queue.get_all_free_blocks()]

    def eviction_order(self) -> list[int]:
        return [
            self.id_of[b.block_hash]
            for b in self.pool.free_block_queue.get_all_free_blocks()
            if b.block_hash is not None
        ]

    def in_use(self) -> int:
        return self.capacity - self.pool.get_num_free_blocks()
