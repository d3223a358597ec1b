"""SGLang's own ``RadixCache`` (or ``UnifiedRadixCache``) and token allocator behind kvhit's Engine protocol (page 1).

Runs only in the throwaway SGLang environment (``conformance/make_env.sh sglang 0.5.23``). The tree
(``RadixCache``: match, insert, split, lock, evict) and the allocator (``TokenToKVPoolAllocator``: free slot
list, ``evict_to_free_tokens``, ``alloc``, ``free_segment``) are SGLang's, unmodified. The scheduler steps
around them are transcribed from sglang 0.5.23 (``Req``/``ScheduleBatch`` objects are not built):

* admission: ``match_prefix`` of the prompt capped at ``T - 1`` tokens (``match_kv_cache`` with
  ``Req._compute_max_prefix_len``), ``inc_lock_ref`` of the matched node, then ``evict_to_free_tokens`` and
  ``alloc`` for the extend tokens (``alloc_token_slots``);
* checkpoint after prefill / at release: ``RadixCache._insert_cache`` + ``RadixCache.checkpoint``
  (insert, ``split_prompt`` insert at release, free the duplicates, match again, move the lock);
* each decode step: ``evict_to_free_tokens`` + ``alloc`` of one token (``alloc_for_decode_default``);
* release: ``release_kv_cache`` (free the row past the tree's part, ``dec_lock_ref``).

``RealUnifiedEngine`` runs the same steps around ``UnifiedRadixCache`` (see its docstring).

Stubbed import (not cache logic): ``sglang.srt.configs`` (model-architecture config classes that pull
``torchvision``/``gguf``; ``memory_pool`` imports one Mamba helper from it, unused by ``RadixCache``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from array import array
from unittest import mock


class _StubConfigs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "sglang.srt.configs" or name.startswith("sglang.srt.configs."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = mock.MagicMock(name=spec.name)
        m.__path__ = []
        m.__spec__ = spec
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StubConfigs())

import torch  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

from kvhit.sim.engine import FinishOutcome, Request, RequestOutcome  # noqa: E402

try:
    from importlib.metadata import version

    VERSION = version("sglang")
except Exception:  # pragma: no cover
    VERSION = "?"


def _key(toks) -> RadixKey:
    return RadixKey(array("q", toks))


class _Run:
    def __init__(self, req, node, idx, protected):
        self.req, self.node, self.idx, self.protected, self.inserted = req, node, idx, protected, 0


class RealSglangEngine:
    unit = "token"

    def __init__(self, capacity: int, evict_policy: str = "lru", policy_config: dict | None = None) -> None:
        self.name = f"sglang=={VERSION}"
        self.capacity = capacity
        self.alloc = TokenToKVPoolAllocator(capacity, torch.float16, "cpu", None, False)
        self.cache = RadixCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=self.alloc,
                page_size=1,
                eviction_policy=evict_policy,
                eviction_policy_config=policy_config,
            )
        )
        self.running: dict[int, _Run] = {}
        self._evicted: list[tuple] = []
        self._units: list[int] = []
        orig = self.cache._delete_leaf

        def observed(node):
            self._evicted.append(self._path(node))
            self._units.append(len(node.key))
            return orig(node)

        self.cache._delete_leaf = observed

    def _path(self, node) -> tuple:
        parts = []
        while node is not self.cache.root_node:
            parts.append(tuple(node.key.token_ids[: len(node.key)]))
            node = node.parent
        return tuple(t for k in reversed(parts) for t in k)

    def fits(self, req: Request) -> bool:
        return req.prompt_tokens + max(req.output_tokens, 1) - 1 <= self.capacity

    def _checkpoint(self, run: _Run, up_to: int, prompt_len: int | None = None) -> None:
        toks = list(run.req.token_ids[:up_to])
        res = self.cache.insert(
            InsertParams(key=_key(toks), value=run.idx[:up_to].clone(), inserted_len=run.inserted, priority=0)
        )
        run.inserted = max(run.inserted, up_to)
        if prompt_len is not None and 0 < prompt_len < up_to:
            self.cache.insert(
                InsertParams(
                    key=_key(toks[:prompt_len]), value=run.idx[:prompt_len].clone(), inserted_len=prompt_len, priority=1
                )
            )
        self.alloc.free_segment(run.idx[run.protected : res.prefix_len], start_pos=run.protected)
        m = self.cache.match_prefix(MatchPrefixParams(key=_key(toks)))
        new = self.cache.path_device_indices(m.last_device_node)
        assert len(new) == up_to
        run.idx[run.protected : len(new)] = new[run.protected :]
        run.protected = len(new)
        self.cache.dec_lock_ref(run.node)
        self.cache.inc_lock_ref(m.last_device_node)
        run.node = m.last_device_node

    def submit(self, req: Request) -> RequestOutcome | None:
        T = req.prompt_tokens
        n = max(req.output_tokens, 1)
        m = self.cache.match_prefix(MatchPrefixParams(key=_key(list(req.token_ids[: T - 1]))))
        hit, node = m.device_prefix_len, m.last_device_node
        self.cache.inc_lock_ref(node)
        extend = T - hit
        if extend + n - 1 > self.alloc.available_size() + self.cache.evictable_size():  # kvhit's admission rule
            self.cache.dec_lock_ref(node)
            return None
        mark = len(self._evicted)
        self.alloc.evict_to_free_tokens(self.cache, extend)
        new = self.alloc.alloc(extend)
        assert new is not None
        run = _Run(req, node, torch.cat([self.cache.path_device_indices(node), new]), hit)
        self.running[req.rid] = run
        if n > 1:
            self._checkpoint(run, T)
        for _ in range(n - 1):
            self.alloc.evict_to_free_tokens(self.cache, 1)
            one = self.alloc.alloc(1)
            assert one is not None
            run.idx = torch.cat([run.idx, one])
        ev = tuple(self._evicted[mark:])
        return RequestOutcome(
            rid=req.rid, hit_tokens=hit, hit_units=hit, new_blocks=(), evicted=ev, evicted_units=sum(self._units[mark:])
        )

    def finish(self, rid: int) -> FinishOutcome:
        run = self.running.pop(rid)
        before = self.alloc.available_size()
        owned = run.req.prompt_tokens + max(run.req.output_tokens, 1) - 1
        self._checkpoint(run, owned, prompt_len=run.req.prompt_tokens)
        self.alloc.free_segment(run.idx[run.protected : owned], start_pos=run.protected)
        self.cache.dec_lock_ref(run.node)
        return FinishOutcome(rid=rid, freed_units=self.alloc.available_size() - before)

    def eviction_order(self) -> list[tuple]:
        prio = self.cache.eviction_strategy.get_priority  # the heap key of evict(); ties as TreeNode.__lt__
        leaves = sorted(self.cache.evictable_leaves, key=lambda x: (prio(x), x.last_access_time))
        return [self._path(x) for x in leaves]

    def in_use(self) -> int:
        return self.capacity - self.alloc.available_size() - self.cache.evictable_size()

    def state(self) -> tuple:
        return (self.alloc.available_size(), self.cache.evictable_size(), self.cache.total_size())


class RealUnifiedEngine(RealSglangEngine):
    """The same scheduler steps around SGLang's ``UnifiedRadixCache`` (full attention: ``tree_components=(FULL,)``),
    the cache the 0.5.23 scheduler builds for full-attention models, with the Rust tree core (default) or the Python
    one (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``), no HiCache. Checkpoints follow
    ``UnifiedRadixCache.checkpoint_into_tree``: ``insert`` with ``prev_prefix_len`` = protected length (the tree
    frees the duplicate slots itself), the ``split_prompt`` insert when the prompt is shorter than the key, then
    ``unlock``/``lock`` onto ``InsertResult.last_device_node``. Evicted node paths and the eviction order are not
    observable from outside the tree core; the evicted token count is ``EvictResult.num_tokens_evicted``.
    """

    def __init__(
        self, capacity: int, core: str = "rust", evict_policy: str = "lru", policy_config: dict | None = None
    ) -> None:
        import os

        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = core
        self.name = f"sglang=={VERSION} UnifiedRadixCache[{core}]"
        self.capacity = capacity
        self.alloc = TokenToKVPoolAllocator(capacity, torch.float16, "cpu", None, False)
        self.cache = UnifiedRadixCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=self.alloc,
                page_size=1,
                eviction_policy=evict_policy,
                eviction_policy_config=policy_config,
                tree_components=(ComponentType.FULL,),
            )
        )
        assert self.cache._tree_core_backend == core
        self.running = {}
        self._evicted = []
        self._units = []
        for name in ("evict", "evict_for_alloc"):
            orig = getattr(self.cache, name)

            def observed(*a, _orig=orig, **k):
                res = _orig(*a, **k)
                self._evicted.append(())
                self._units.append(res.num_tokens_evicted)
                return res

            setattr(self.cache, name, observed)

    def _checkpoint(self, run: _Run, up_to: int, prompt_len: int | None = None) -> None:
        toks = list(run.req.token_ids[:up_to])
        values = run.idx[:up_to].to(torch.int64).clone()
        p = InsertParams(key=_key(toks), value=values, prev_prefix_len=run.protected, inserted_len=run.inserted)
        res = self.cache.insert(p)
        run.inserted = max(run.inserted, up_to)
        if prompt_len is not None and 0 < prompt_len < up_to:
            self.cache.insert(
                InsertParams(
                    key=_key(toks[:prompt_len]),
                    value=values[:prompt_len],
                    prev_prefix_len=prompt_len,
                    inserted_len=prompt_len,
                    priority=1,
                )
            )
        new = self.cache.path_device_indices(res.last_device_node)
        assert len(new) == up_to
        run.idx[run.protected : len(new)] = new[run.protected :]
        run.protected = len(new)
        self.cache.unlock(run.node)
        run.node = self.cache.lock(res.last_device_node)

    def submit(self, req: Request) -> RequestOutcome | None:
        T = req.prompt_tokens
        n = max(req.output_tokens, 1)
        m = self.cache.match_prefix(MatchPrefixParams(key=_key(list(req.token_ids[: T - 1]))))
        hit, node = m.device_prefix_len, m.last_device_node
        lock = self.cache.lock(node)
        extend = T - hit
        if extend + n - 1 > self.alloc.available_size() + self.cache.evictable_size():  # kvhit's admission rule
            self.cache.unlock(lock)
            return None
        mark = len(self._evicted)
        self.alloc.evict_to_free_tokens(self.cache, extend)
        new = self.alloc.alloc(extend)
        assert new is not None
        prefix = self.cache.path_device_indices(node).to(torch.int64)
        run = _Run(req, lock, torch.cat([prefix, new.to(torch.int64)]), hit)
        self.running[req.rid] = run
        if n > 1:
            self._checkpoint(run, T)
        for _ in range(n - 1):
            self.alloc.evict_to_free_tokens(self.cache, 1)
            one = self.alloc.alloc(1)
            assert one is not None
            run.idx = torch.cat([run.idx, one.to(torch.int64)])
        return RequestOutcome(
            rid=req.rid, hit_tokens=hit, hit_units=hit, new_blocks=(), evicted=(), evicted_units=sum(self._units[mark:])
        )

    def finish(self, rid: int) -> FinishOutcome:
        run = self.running.pop(rid)
        before = self.alloc.available_size()
        owned = run.req.prompt_tokens + max(run.req.output_tokens, 1) - 1
        self._checkpoint(run, owned, prompt_len=run.req.prompt_tokens)
        self.alloc.free_segment(run.idx[run.protected : owned], start_pos=run.protected)
        self.cache.unlock(run.node)
        return FinishOutcome(rid=rid, freed_units=self.alloc.available_size() - before)

    def eviction_order(self) -> list[tuple]:
        return []

    def state(self) -> tuple:
        return (self.alloc.available_size(), self.cache.evictable_size(), self.cache.total_size()[0])
