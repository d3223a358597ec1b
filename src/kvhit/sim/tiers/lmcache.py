"""LMCache in-process (``LMCacheConnectorV1``, local CPU backend) as a :class:`~kvhit.sim.tiers.HostTier`.

Read from **LMCache 0.5.6**: ``integration/vllm/vllm_v1_adapter.py`` (``get_num_new_matched_tokens``,
``RequestTracker``, ``ReqMeta.from_request_tracker``, ``wait_for_save``), ``v1/cache_engine.py``
(``store``, ``lookup``), ``v1/token_database.py`` (``ChunkedTokenDatabase``), ``v1/storage_backend/
local_cpu_backend.py`` (``contains``, ``touch_cache``, ``submit_put_task``, ``allocate``),
``v1/storage_backend/cache_policy/lru.py``, ``v1/config.py`` (defaults).

* **Chunks** – ``chunk_size = 256`` tokens; ``save_unfull_chunk = False`` (default) so only full chunks are
  keyed, looked up and stored; keys are chained (prefix hash). Here the key of chunk ``k`` is the chained
  block hash at token ``256(k+1)``, which names the same prefix (``chunk_tokens`` must be a multiple of
  ``block_size``).
* **Lookup** – prefix from token 0 over the prompt's full chunks until the first miss, every request,
  whatever the GPU holds: ``l`` tokens. The found keys are pinned and ``touch_cache`` re-touches them in
  *reverse* order (``update_on_hit`` = ``move_to_end``), so the head chunk ends most recent.
* **Load** – ``need = l - g``, minus 1 when ``l = T`` (a ``T - 1`` cap on the CPU side, unlike vLLM native);
  nothing is loaded when ``need <= 0``.
* **Store (write-through)** – ``num_saved_tokens`` starts at ``l``; at the prefill the chunks
  ``[⌊l/256⌋, ⌊T/256⌋)`` are stored (GPU-hit chunks beyond ``l`` included); a key already resident is
  skipped (``contains`` → ``continue``; no recency change); a new key takes one slot, evicting LRU heads
  one at a time (``get_evict_candidates(num_candidates=1)``), and is appended at the MRU end
  (``update_on_put`` does not move; the ``OrderedDict`` insertion does). Stores are per chunk, not
  all-or-nothing. Decode KV is not saved (``save_decode_cache = False``).
* **Capacity** – ``max_local_cpu_size`` GB *per TP rank*; every chunk has the same size, so the tier holds
  ``⌊max_local_cpu_size / chunk_bytes_per_rank⌋`` chunks (allocator alignment/fragmentation ignored).

Correction to issue 16: the statement "the loaded amount is the CPU hit minus what the GPU already had" holds
except for a fully resident prompt, where one token less is loaded (``need_to_allocate -= 1``).

Separation (see :mod:`kvhit.sim.tiers.surface`): lookup, touch and store depend only on the request stream and
the tier's own state, never on ``g``; so the LMCache state, and ``l`` per request, do not depend on the HBM
size, and ``g`` does not depend on the DRAM size. The loaded amount is a function of the two.

A lookup is repeated (and touches again) at every admission attempt of a waiting request, as in vLLM's
scheduler loop. Not modelled: pins held while a retrieve is in flight (a pinned chunk cannot be evicted),
``min_retrieve_tokens``, ``max_tokens_per_load``,
``skip_last_n_tokens``, remote/disk backends, blending, layerwise mode.
"""

from __future__ import annotations

from collections import OrderedDict

from kvhit.sim.engine import Request

__all__ = ["LMCacheTier"]


class LMCacheTier:
    """LMCache 0.5.6 local CPU backend with ``capacity`` chunks of ``chunk_tokens`` (see module docstring)."""

    def __init__(self, capacity: int, *, block_size: int, chunk_tokens: int = 256) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity: expected a non-negative integer, got {capacity!r}")
        if chunk_tokens < 1 or chunk_tokens % block_size:
            raise ValueError(
                f"chunk_tokens: expected a positive multiple of block_size={block_size}, got {chunk_tokens!r}"
            )
        self.name = "lmcache"
        self.capacity = capacity
        self.block_size = int(block_size)
        self.chunk_tokens = int(chunk_tokens)
        self.bpc = self.chunk_tokens // self.block_size
        self.lru: OrderedDict[int, None] = OrderedDict()  # first = least recently used
        self.evictions = 0
        self._found: dict[int, int] = {}

    def bind(self, gpu) -> None:
        return

    def _keys(self, req: Request) -> list[int]:
        h = req.block_hashes
        n = req.prompt_tokens // self.chunk_tokens
        return [h[(k + 1) * self.bpc - 1] for k in range(n)]

    def lookup(self, req: Request, g: int) -> int:
        found = []
        for k in self._keys(req):
            if k not in self.lru:
                break
            found.append(k)
        for k in reversed(found):
            self.lru.move_to_end(k)
        lt = len(found) * self.chunk_tokens
        self._found[req.rid] = lt
        need = lt - g - (1 if lt == req.prompt_tokens else 0)
        return need if need > 0 else 0

    def admit(self, req: Request, g: int, c: int) -> None:
        lt = self._found.pop(req.rid)
        keys = self._keys(req)
        for k in keys[lt // self.chunk_tokens :]:
            if k in self.lru:
                continue
            if self.capacity == 0:
                break
            if len(self.lru) >= self.capacity:
                self.lru.popitem(last=False)
                self.evictions += 1
            self.lru[k] = None

    def finish(self, req: Request) -> None:
        return

    def after_finish(self, req: Request) -> None:
        return

    def eviction_order(self) -> list[int]:
        return list(self.lru)

    def resident(self) -> int:
        return len(self.lru)
