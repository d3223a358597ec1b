"""SGLang's radix-tree prefix cache as a step-wise :class:`~kvhit.sim.engine.Engine` (``engine="sglang"``).

Read from the sglang 0.5.23 wheel (``python/sglang/srt/mem_cache/radix_cache.py``, ``unified_radix_cache.py``,
``unified_cache/unified_tree_core.py``, ``common.py``, ``allocation.py``, ``allocator/base.py``,
``evict_policy.py``, ``managers/schedule_batch.py``), for a full-attention model without HiCache, speculative
decoding or sliding windows:

* **Cache class** – ``cache="unified"`` (default): ``UnifiedRadixCache``, what the 0.5.23 scheduler builds for
  a full-attention model (``mem_cache/registry.py`` ``default_radix_cache_factory`` → ``create_unified_radix_cache``
  unless LMCache/FlexKV or pure-SWA); ``cache="radix"``: ``RadixCache``. Both make the same decisions except one
  time stamp: a split's new upper node keeps the split node's ``creation_time`` in the unified tree core
  (``_split_node``) and gets a fresh one in ``RadixCache._split_node``, so they differ only under ``fifo``/``filo``.
  The unified core's other stamps (two ticks of one counter per new node, a fresh access time for a split's lower
  half, per-node touches on the insert walk, no match after a checkpoint) order the evictable leaves as
  ``RadixCache``'s one-time-per-walk stamps do (tested against both in ``make conformance``).

* **Tree** – a radix tree over token ids; children are keyed by their first ``page_size`` tokens (``p``,
  default 1); match lengths and inserted keys are rounded down to whole pages (``RadixKey.page_aligned``,
  ``RadixKey.match``). A match or insert that ends inside a node splits it there; splits persist
  (``_split_node``). Every match/insert stamps the whole path with one access time
  (``_match_prefix_helper`` / ``_insert_helper``); a node created by a split or an insert gets a newer
  time at construction (``TreeNode.__init__``), and the lower half of a split node keeps the stamp. Here a
  logical clock replaces ``time.monotonic()`` (same order).
* **Admission** – the prompt of ``T`` tokens is matched with the key capped at ``T - 1`` tokens
  (``Req._compute_max_prefix_len``), so at most ``⌊(T − 1)/p⌋·p`` hit tokens; the matched node is locked
  (up to the root, ``inc_lock_ref``) while the request runs.
* **Eviction** – only at allocation time, for the shortfall ``demand − available``
  (``allocator.evict_to_free_tokens``): at prefill the demand is ``T − hit`` (plus one page when ``p > 1``,
  ``alloc_paged_token_slots_extend``'s conservative estimate); at each of the ``n − 1`` decode steps 1 token
  (a whole page when ``p > 1``, even when the current page has room, ``alloc_paged_token_slots_decode``).
  ``RadixCache.evict`` pops the unlocked leaf of lowest priority (LRU: oldest access time), frees the
  whole node (usually more than asked), pushes a parent that became an unlocked leaf, and stops once the
  shortfall is covered or nothing is evictable. Policies (``evict_policy.py``; ties to the older access):
  ``lru`` (default; last access), ``fifo`` (creation time), ``mru``, ``filo``, ``lfu`` (``(hit_count, access)``),
  ``slru`` (``(hit_count ≥ 2, access)``), ``priority`` (``(priority, access)``), ``tlru`` (a leaf whose
  ancestors hold ``≥ max(high-water depth − budget, 0)`` tokens first, then LRU). ``hit_count``: +1 on every
  node an insert walks or creates that ends beyond the request's ``cache_inserted_len``; a split's upper node
  copies it. ``priority``: requests carry SGLang's default 0 (``req.priority or 0``); the prompt re-insert at
  release runs at 1, and an insert raises every walked node to its priority (max), so a finished request's prompt
  nodes outlive output leaves. ``tlru``: depth (``_tlru_cached_prefix_len``) set at creation, the high-water
  depth raised up the path by each new leaf and never lowered; budget ``threshold − next_prompt_estimate``.
* **Checkpoint** – after prefill a request that continues to decode inserts its page-aligned prompt
  (``checkpoint_kv_cache`` → ``RadixCache.checkpoint``): the part already in the tree is a duplicate and is
  freed at once, the rest moves into the tree, and the lock moves to the new node.
* **Finish** – ``release_kv_cache(checkpoint=True)`` inserts prompt + output minus the last token
  (``owned_kv_len``; page-aligned down), so responses are cached, the prompt is inserted again
  (``split_prompt``: the outputs become their own leaf under the prompt node, so a conversation's outputs
  can be evicted before its prompt); the request's slots not in the tree are freed and the lock released.
* **Capacity** is in tokens (the KV pool size ``C``, a multiple of ``p``), not blocks.

The driver (:func:`kvhit.sim.engine.replay`) admits FIFO; here a request is admitted when its prefill and
all its decode tokens fit in ``available + evictable`` after locking its match (the scheduler's
``PrefillAdder`` budget with ``new_token_ratio = 1``, so a running request is never retracted). All ``n − 1``
decode steps run at admission (nothing else runs in between without holds; with holds, concurrent requests'
decode steps are not interleaved). A request is rejected (never runs) when ``T + n − 1`` tokens rounded up to
pages, plus one page when ``p > 1``, exceed ``C``. On a refused admission the match has already stamped and
split the tree (as in SGLang).

HiCache (host tier): ``host=`` a :class:`kvhit.sim.tiers.hicache.HiCacheTier`, which the tree calls at its
events (split, insert walk, device eviction, match → load-back); nodes then carry ``dev``/``host`` flags and
a hit count, and an evicted node may stay in the tree host-only (see that module). Without it every node is
on the device and nothing here changes.

Not modelled: decode-time retraction (preemption) when the pool runs out, the ``new_token_ratio`` decode
reservation of ``PrefillAdder``, chunked prefill, per-request priorities (all 0), SWA and Mamba trees,
speculative decoding (EAGLE bigram keys), ``extra_key`` / LoRA namespaces, session-aware caching.
"""

from __future__ import annotations

import heapq
from itertools import chain

from kvhit.sim.engine import FinishOutcome, Request, RequestOutcome

__all__ = ["CACHES", "EVICT_POLICIES", "SglangEngine"]

#: policy -> priority of a node (lower = evicted first); heap ties fall to the last access (``TreeNode.__lt__``)
EVICT_POLICIES = {
    "lru": lambda n: n.t,
    "fifo": lambda n: n.ct,
    "mru": lambda n: -n.t,
    "filo": lambda n: -n.ct,
    "lfu": lambda n: (n.hits, n.t),
    "slru": lambda n: (1 if n.hits >= 2 else 0, n.t),
    "priority": lambda n: (n.pri, n.t),
    "tlru": None,  # needs the tail budget: SglangEngine._tlru
}

#: SGLang's cache classes: ``unified`` (``UnifiedRadixCache``, what the 0.5.23 scheduler builds for a
#: full-attention model) and ``radix`` (``RadixCache``); they differ on a split's creation time (fifo/filo)
CACHES = ("unified", "radix")


class _Node:
    __slots__ = ("key", "children", "parent", "lock", "t", "ct", "dev", "host", "hits", "pri", "depth", "hist")

    def __init__(self, key: tuple, parent, now: int, pri: int = 0) -> None:
        self.key = key
        self.children: dict = {}
        self.parent = parent
        self.lock = 0
        self.t = now  # last access
        self.ct = now  # creation
        self.dev = True  # KV on the device (False only for a HiCache node evicted to host)
        self.host = False  # a host (HiCache) copy exists
        self.hits = 0  # hit_count: inserts that walked or created the node (lfu, slru, HiCache write-through)
        self.pri = pri  # priority: max over the inserts that walked it (the prompt re-insert at release adds 1)
        self.depth = 0  # tlru: tokens root -> self (``_tlru_cached_prefix_len``)
        self.hist = 0  # tlru: the branch's high-water depth (``_tlru_history_len``)

    def __lt__(self, other: _Node) -> bool:  # heap tie-break, as TreeNode.__lt__
        return self.t < other.t


class _Running:
    __slots__ = ("req", "node", "protected", "alloc_end", "owned", "inserted")

    def __init__(self, req, node, protected, alloc_end, owned) -> None:
        self.req = req
        self.node = node
        self.protected = protected  # tokens [0, protected) are the tree's
        self.alloc_end = alloc_end  # the request owns slots [protected, alloc_end)
        self.owned = owned  # tokens with KV
        self.inserted = 0  # cache_inserted_len: tokens this request already inserted


class SglangEngine:
    """SGLang's radix cache over a KV pool of ``capacity`` tokens (see module docstring).

    ``cache``: ``"unified"`` (default; ``UnifiedRadixCache``, what SGLang 0.5.23 builds for a full-attention
    model) or ``"radix"`` (``RadixCache``). They differ only in the creation time of the upper node a split
    makes (kept from the split node in ``unified``, fresh in ``radix``), so only ``fifo``/``filo`` can tell
    them apart. ``tlru_tail_budget``: T-LRU's ``threshold − next_prompt_estimate`` (tokens, clamped at 0;
    ``--radix-eviction-policy-config``), used by ``evict_policy="tlru"`` only (0, SGLang's default, makes
    T-LRU order as LRU); T-LRU needs ``cache="unified"`` (SGLang refuses it on ``RadixCache``).
    """

    unit = "token"

    def __init__(
        self,
        capacity: int,
        *,
        page_size: int = 1,
        evict_policy: str = "lru",
        host=None,
        cache: str = "unified",
        tlru_tail_budget: int = 0,
    ) -> None:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size: expected a positive integer, got {page_size!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < page_size:
            raise ValueError(f"capacity: expected an integer >= page_size ({page_size}) tokens, got {capacity!r}")
        if capacity % page_size:
            raise ValueError(f"capacity: {capacity} tokens is not a whole number of {page_size}-token pages")
        if evict_policy not in EVICT_POLICIES:
            raise ValueError(f"evict_policy: expected one of {sorted(EVICT_POLICIES)}, got {evict_policy!r}")
        if cache not in CACHES:
            raise ValueError(f"cache: expected one of {list(CACHES)}, got {cache!r}")
        if evict_policy == "tlru" and cache != "unified":
            raise ValueError("evict_policy='tlru' needs cache='unified' (SGLang refuses T-LRU on RadixCache)")
        if evict_policy == "tlru" and host is not None:
            raise ValueError("evict_policy='tlru' with a HiCache host tier is not modelled")
        if isinstance(tlru_tail_budget, bool) or not isinstance(tlru_tail_budget, int) or tlru_tail_budget < 0:
            raise ValueError(f"tlru_tail_budget: expected an integer >= 0, got {tlru_tail_budget!r}")
        self.cache = cache
        self.tlru_budget = tlru_tail_budget
        self.name = "sglang"
        self.capacity = capacity
        self.p = page_size
        self.evict_policy = evict_policy
        self._prio = EVICT_POLICIES[evict_policy] or self._tlru
        self._tlru_on = evict_policy == "tlru"
        self._clock = 0
        self.root = _Node((), None, 0)
        self.root.lock = 1
        self.available = capacity
        self.running: dict[int, _Running] = {}
        self._evicted: list[tuple] = []  # token keys (root to node) of evicted nodes, in order
        self._evicted_units: list[int] = []  # their own tokens
        #: a host tier sharing this tree (:class:`kvhit.sim.tiers.hicache.HiCacheTier`), or None
        self.host = host
        if host is not None:
            host.bind(self)

    def _tlru(self, n: _Node) -> tuple:
        """``TLRUStrategy.get_priority``: a leaf whose ancestors alone cover the branch's high-water depth less
        the tail budget is "TEL-safe" (-1: evicted first), others 0; then LRU."""
        safe = n.depth - len(n.key) >= max(n.hist - self.tlru_budget, 0)
        return (-1 if safe else 0, n.t)

    # ---- tree -----------------------------------------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _ck(self, key, i: int = 0):
        return key[i] if self.p == 1 else tuple(key[i : i + self.p])

    def _common(self, a: tuple, b, off: int) -> int:
        n = min(len(a), len(b) - off)
        k = 0
        while k < n:  # 64-token slices compared at C speed, then token by token inside the first unequal one
            m = min(64, n - k)
            if tuple(a[k : k + m]) != tuple(b[off + k : off + k + m]):
                while a[k] == b[off + k]:
                    k += 1
                break
            k += m
        return k // self.p * self.p

    def _split(self, child: _Node, at: int) -> _Node:
        new = _Node(child.key[:at], child.parent, self._tick(), child.pri)
        new.lock = child.lock
        new.dev, new.host, new.hits = child.dev, child.host, child.hits
        if self.cache == "unified":  # unified_tree_core._split_node: the upper part keeps the creation time
            new.ct = child.ct
        if self._tlru_on:
            new.depth = child.parent.depth + at
            new.hist = child.hist
        new.children = {self._ck(child.key, at): child}
        new.parent.children[self._ck(child.key)] = new
        child.parent = new
        child.key = child.key[at:]
        if self.host is not None:
            self.host.on_split(new)
        return new

    def _match(self, key) -> tuple[int, _Node]:
        """``_match_prefix_helper`` on a page-aligned key: (matched tokens, last node)."""
        now = self._tick()
        node = self.root
        node.t = now
        off = 0
        while off < len(key):
            child = node.children.get(self._ck(key, off))
            if child is None:
                break
            child.t = now
            k = self._common(child.key, key, off)
            if k < len(child.key):
                node = self._split(child, k)
                off += k
                break
            node = child
            off += k
        return off, node

    def _insert(self, key, inserted: int = 0, pri: int = 0) -> tuple[int, _Node, int]:
        """``_insert_helper``: (tokens already in the tree, node of the whole key, tokens of host-only nodes
        re-filled from the key's KV). ``inserted`` – the request's ``cache_inserted_len``: a hit is counted
        on each walked or created node that ends beyond it. ``pri`` – the insert's priority, raised into every
        walked node (max) and given to a new leaf."""
        now = self._tick()
        node = self.root
        node.t = now
        node.pri = max(node.pri, pri)
        off = 0
        adopted = 0
        host = self.host
        while off < len(key):
            child = node.children.get(self._ck(key, off))
            if child is None:
                break
            child.t = now
            k = self._common(child.key, key, off)
            node = self._split(child, k) if k < len(child.key) else child
            node.pri = max(node.pri, pri)
            off += k
            if not node.dev:  # HiCache: an evicted node takes the request's fresh KV (``_unevict_node_on_insert``)
                node.dev = True
                adopted += len(node.key)
                host.on_unevict(node)
            if off > inserted:
                self._hit(node)
        if off < len(key):
            leaf = _Node(tuple(key[off:]), node, self._tick(), pri)
            if self._tlru_on:  # _set_tlru_lens_and_raise_history
                leaf.depth = node.depth + len(leaf.key)
                leaf.hist = leaf.depth
                a = node
                while a is not None and a.hist < leaf.depth:
                    a.hist = leaf.depth
                    a = a.parent
            node.children[self._ck(leaf.key)] = leaf
            node = leaf
            if len(key) > inserted:
                self._hit(leaf)
        prefix = off
        return prefix, node, adopted

    def _hit(self, node: _Node) -> None:
        """``_inc_hit_count`` (HiCache: ``_inc_hit_count_and_check``, which may start a write-through)."""
        if self.host is not None:
            self.host.on_insert_hit(node)
        else:
            node.hits += 1

    def _lock(self, node: _Node, d: int) -> None:
        while node is not self.root:
            node.lock += d
            node = node.parent

    def evictable_size(self) -> int:
        """Tokens in unlocked tree nodes on the device."""
        tot = 0
        stack = list(self.root.children.values())
        while stack:
            x = stack.pop()
            if x.lock == 0 and x.dev:
                tot += len(x.key)
            stack.extend(x.children.values())
        return tot

    def _is_leaf(self, x: _Node) -> bool:
        """A device leaf (D-leaf): on the device, unlocked, no child on the device (HiCache keeps evicted
        children in the tree; without it a D-leaf is a leaf)."""
        return x.dev and x.lock == 0 and x is not self.root and not any(c.dev for c in x.children.values())

    def _leaves(self) -> list[_Node]:
        out = []
        stack = list(self.root.children.values())
        while stack:
            x = stack.pop()
            if self._is_leaf(x):
                out.append(x)
            stack.extend(x.children.values())
        return out

    def _evict(self, num_tokens: int) -> int:
        heap = [(self._prio(x), x) for x in self._leaves()]
        heapq.heapify(heap)
        done = 0
        host = self.host
        while done < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if host is not None and not self._is_leaf(x):
                continue
            n = len(x.key)
            pk = self.path_key(x)
            parent = x.parent
            if host is None:
                del parent.children[self._ck(x.key)]
            elif not host.on_device_evict(x):  # HiCache: demoted to host, deleted, or (write_back) kept
                continue
            done += n
            self.available += n
            self._evicted.append(pk)
            self._evicted_units.append(n)
            if parent is not self.root and self._is_leaf(parent):
                heapq.heappush(heap, (self._prio(parent), parent))
        return done

    def _alloc(self, demand: int, tokens: int) -> None:
        """Evict the shortfall of ``demand`` and take ``tokens`` (whole pages) from the pool."""
        short = demand - self.available
        if short > 0:
            self._evict(short)
        if tokens > self.available:
            raise RuntimeError(f"sglang model: out of KV slots ({tokens} > {self.available})")
        self.available -= tokens

    def _checkpoint(self, run: _Running, up_to: int, prompt_len: int | None = None) -> None:
        toks = run.req.token_ids
        key_len = up_to // self.p * self.p
        key = toks[:key_len]
        prefix, _, adopted = self._insert(key, run.inserted)
        run.inserted = max(run.inserted, key_len)
        if prompt_len is not None:
            pk = prompt_len // self.p * self.p
            if 0 < pk < key_len:  # split_prompt: the prompt again, at priority + 1
                self._insert(toks[:pk], pk, pri=1)
        # duplicates of tree content the request computed again are freed at once (host-only nodes it
        # re-filled keep the request's slots instead)
        self.available += max(0, prefix - run.protected - adopted)
        _, node = self._match(key)
        run.protected = max(run.protected, key_len)
        self._lock(run.node, -1)
        self._lock(node, +1)
        run.node = node

    # ---- Engine protocol ------------------------------------------------------------------------
    def _pages(self, n: int) -> int:
        return -(-n // self.p) * self.p

    def fits(self, req: Request) -> bool:
        n = max(req.output_tokens, 1)
        return self._pages(req.prompt_tokens + n - 1) + (self.p if self.p > 1 else 0) <= self.capacity

    def submit(self, req: Request) -> RequestOutcome | None:
        if req.token_ids is None or len(req.token_ids) < req.prompt_tokens + max(req.output_tokens, 1) - 1:
            raise ValueError(f"request {req.rid}: token_ids must hold prompt + output - 1 tokens")
        if req.rid in self.running:
            raise ValueError(f"request {req.rid}: already running")
        T = req.prompt_tokens
        n = max(req.output_tokens, 1)
        cap = (T - 1) // self.p * self.p
        hit, node = self._match(req.token_ids[:cap])
        g, dnode = hit, node
        if self.host is not None:  # HiCache: the match runs on through host-only nodes
            g, dnode = self.host.device_part(node, hit)
        self._lock(dnode, +1)
        whole = self._pages(T + n - 1) - g + (self.p if self.p > 1 else 0)  # prefill and every decode step
        if whole > self.available and whole > self.available + self.evictable_size():
            self._lock(dnode, -1)
            return None
        mark = len(self._evicted)
        c = 0
        if hit > g:  # HiCache load-back of the host segment, all or nothing
            c = self.host.load_back(node, hit - g)
            if c:
                self._lock(dnode, -1)
                self._lock(node, +1)
                dnode = node
        hit = g + c
        extend = T - hit
        demand = extend + (self.p if self.p > 1 else 0)
        self._alloc(demand, self._pages(extend))
        run = _Running(req, dnode, hit, hit + self._pages(extend), T)
        self.running[req.rid] = run
        if n > 1:
            self._checkpoint(run, T)
        for _ in range(n - 1):  # decode steps: position run.owned gets its KV
            need_page = run.owned >= run.alloc_end
            self._alloc(self.p if self.p > 1 else 1, self.p if need_page else 0)
            if need_page:
                run.alloc_end += self.p
            run.owned += 1
        ev = tuple(self._evicted[mark:])
        out = RequestOutcome(
            rid=req.rid,
            hit_tokens=hit,
            hit_units=hit // self.p,
            new_blocks=(),
            evicted=ev,
            evicted_units=sum(self._evicted_units[mark:]),
        )
        return out if self.host is None else self.host.outcome(out, req, g, c)

    def finish(self, rid: int) -> FinishOutcome:
        run = self.running.pop(rid)
        before = self.available
        mark = len(self._evicted)
        self._checkpoint(run, run.owned, prompt_len=run.req.prompt_tokens)
        self.available += run.alloc_end - run.protected
        self._lock(run.node, -1)
        ev = tuple(self._evicted[mark:])
        return FinishOutcome(
            rid=rid, freed_units=self.available - before, evicted=ev, evicted_units=sum(self._evicted_units[mark:])
        )

    def eviction_order(self) -> list[tuple]:
        """Token keys (root to node) of the evictable leaves, next victim first. Only leaves are listed: a
        parent becomes a candidate when its last child goes."""
        leaves = sorted(self._leaves(), key=lambda x: (self._prio(x), x.ct))
        return [self.path_key(x) for x in leaves]

    def in_use(self) -> int:
        """Slots held by running requests or locked tree nodes (not evictable, not free)."""
        return self.capacity - self.available - self.evictable_size()

    def cached_tokens(self) -> int:
        """Tokens in the tree on the device (locked or not)."""
        tot = 0
        stack = list(self.root.children.values())
        while stack:
            x = stack.pop()
            if x.dev:
                tot += len(x.key)
            stack.extend(x.children.values())
        return tot

    def path_key(self, node: _Node) -> tuple:
        parts = []
        while node is not self.root:
            parts.append(node.key)
            node = node.parent
        return tuple(chain.from_iterable(reversed(parts)))
