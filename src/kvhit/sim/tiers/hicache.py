"""SGLang HiCache: a host-memory tier inside SGLang's radix tree, composed onto the SGLang engine model.

Unlike the vLLM tiers (a second cache behind the GPU pool, :class:`~kvhit.sim.tiers.TieredEngine`), HiCache keeps
host copies *in the same tree*: a node holds device KV, a host copy, or both. So the tier is not a wrapper around
the engine but a :class:`HiCacheTier` the one SGLang engine model calls at its tree events (``SglangEngine(C,
host=HiCacheTier(...))``, or :func:`make_hicache`); without it the engine is unchanged. The result is still an
:class:`~kvhit.sim.engine.Engine` (``replay`` drives it, with or without ``hold``) whose outcomes are
:class:`~kvhit.sim.tiers.TierOutcome`: ``gpu_hit_tokens`` ``g`` (device prefix), ``cpu_hit_tokens`` ``c`` (host
segment loaded), ``computed_tokens`` ``T − g − c``, ``load_bytes`` ``c · bytes_per_token``.

Read from the **sglang 0.5.23** wheel. In this version there is no ``hiradix_cache.py``: HiCache is
``UnifiedRadixCache.init_hicache`` (``mem_cache/unified_radix_cache.py``) over the tree core
``mem_cache/unified_cache/unified_tree_core.py`` (Python core; a Rust core is the default and is meant to be
equivalent) with the Full component ``unified_cache/components/full.py``, the controller
``mem_cache/hybrid_cache/hybrid_cache_controller.py`` (``HybridCacheController``; the older
``managers/cache_controller.py`` ``HiCacheController`` is not what the registry builds for a full-attention
model), the host pool ``mem_cache/pool_host/base.py``, the flags ``srt/arg_groups/fields/memory.py`` +
``arg_groups/hicache_hook.py`` + ``mem_cache/hicache_auto_size.py``, and the admission in
``managers/schedule_policy.py`` (``PrefillAdder.add_one_req``). What is modelled, with the code it follows:

* **Host pool size** (``HostKVCache.__init__``): ``(⌊C · ratio⌋ // p + 1) · p`` tokens for a device pool of
  ``C`` tokens (one padding page more than the ratio gives, all allocatable), or ``--hicache-size`` GB:
  ``(⌊size·10⁹ / bytes_per_token⌋ // p + 1) · p`` (:func:`host_tokens`). ``--hicache-ratio`` defaults to 2.0
  (``handle_hicache_ratio_default``), but only when neither ratio nor size is given does
  ``--hicache-host-memory-fraction`` (0.8) apply, lowering the ratio until the pools fit in 80 % of the host
  memory left after a 10 GiB reserve, divided among the ranks on the host, minus 5 % slack
  (``auto_size_hicache``). That machine-dependent reduction is not computed here: give the ratio SGLang logs.
* **Write policies** (``init_hicache``: ``write_through_threshold = 1 if write_through else 2``;
  ``_inc_hit_count_and_check``): a node's hit count is incremented by every *insert* walk (checkpoint after
  prefill, release at finish) that passes or creates it beyond what the same request inserted before
  (``cache_inserted_len``) — not by a match. ``write_through`` backs a node up at count 1 (every new node at
  its first insert), ``write_through_selective`` at 2 (the second request that inserts it), together with its
  un-backed ancestors, ancestors first (``_build_backup_kv_action``; the chain stops at the first backup that
  cannot get host space). ``write_back`` counts nothing and backs a node up (alone) when it is evicted from the
  device (``evict_device_leaf``).
* **Device eviction** (``_evict_components`` → ``evict_device_leaf``): LRU over D-leaves (on device, unlocked,
  no child on device). A backed-up node is demoted (device KV freed, node and host copy stay); an un-backed
  one under write-through is deleted; under write_back it is first backed up, and if host space cannot be
  made its subtree is dropped (``drop_subtree_no_host``; declined, node kept, when any of it is locked).
* **Host eviction** (``_execute_kv_backup`` → ``evict_host`` → ``drive_host_eviction``): for a backup of ``n``
  tokens with ``free < n``, LRU over H-leaves (evicted, backed up, no children, unlocked) until ``n − free``
  tokens are freed, a parent that becomes an H-leaf joining the heap; if not enough, the backup fails. Under
  write_back, host copies of nodes also on the device are reclaimed first (``_reclaim_full_host_duplicates``,
  in the order they became duplicates, sparing D-leaves in a first pass). So host ⊇ device holds for
  backed-up nodes: under write-through every backed-up node's ancestors are backed up, and only evicted
  leaves leave the host.
* **Hit** (``_match_prefix_helper`` + ``finalize_match_result_in_tree_core``): the match (prompt capped at
  ``T − 1``, pages) walks through device and host-only nodes; ``g`` = the device prefix, the host segment is
  what follows it down to the deepest matched node. **Load-back** (``init_load_back`` → ``load_back``): the
  whole segment or nothing: skipped when it is under ``load_back_threshold = 10`` tokens; the scheduler passes
  no ``mem_quota`` (``InitLoadBackParams.mem_quota = None``), so there is no quota skip in 0.5.23 (the
  issue's "over the memory quota" is from older versions); the path is locked, the device shortfall evicted,
  and the load fails (recompute) if the device still cannot hold it. Loaded nodes keep their host copies.
  A request that recomputes a host-only node re-fills it at its insert (``_unevict_node_on_insert``).
* **Admission**: the engine's own rule with the device hit ``g`` (``PrefillAdder`` budgets
  ``len − prefix_len`` device tokens; a load then takes ``c`` of them).

Invariants (tests/test_hicache.py): host tokens ≤ host capacity; device accounting as without HiCache
(available + device-cached = C when idle); every backed-up node's ancestors are backed up (write-through
policies); every evicted node in the tree is backed up; ``g + c ≤ ⌊(T−1)/p⌋·p``.

Checked against SGLang's own HiCache stack (``UnifiedRadixCache`` + ``HybridCacheController`` on CPU, both tree
cores, all three policies) by ``conformance/check_hicache.py``: per-request device and host hit tokens of
sequential one-token generations.

Not modelled: transfer timing (writes and loads complete at once; SGLang holds a device lock on a node while
its write-through is in flight and pins loaded nodes until the load's ack, which can change eviction order
when the copies are slow), the auto-sizing reduction above, ``buffer_only`` host mode, L3 storage backends
and prefetch, the layer-wise overlap of loads with compute, SWA/Mamba components, the Rust tree core (taken
equal to the Python core).
"""

from __future__ import annotations

import heapq

from kvhit.sim.engine import Request, RequestOutcome
from kvhit.sim.tiers import TierOutcome

__all__ = ["LOAD_BACK_THRESHOLD", "VERSION", "WRITE_POLICIES", "HiCacheTier", "host_tokens", "make_hicache"]

VERSION = "0.5.23"
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
#: ``UnifiedRadixCache.load_back_threshold`` (tokens): a shorter host segment is recomputed
LOAD_BACK_THRESHOLD = 10


def host_tokens(
    device_tokens: int,
    *,
    ratio: float | None = 2.0,
    size_gb: float = 0.0,
    bytes_per_token: int = 0,
    page_size: int = 1,
) -> int:
    """Host pool tokens of ``HostKVCache`` for a device pool of ``device_tokens``: ``--hicache-size`` (GB,
    10⁹ B; overrides the ratio when > 0, needs ``bytes_per_token``, the KV bytes of one token on one rank) or
    ``--hicache-ratio``; rounded down to pages plus the padding page."""
    p = int(page_size)
    if size_gb and size_gb > 0:
        if bytes_per_token < 1:
            raise ValueError("size_gb: needs bytes_per_token >= 1")
        size = int(size_gb * 1e9 // bytes_per_token)
    else:
        if ratio is None or not ratio > 0:
            raise ValueError(f"ratio: expected > 0, got {ratio!r}")
        size = int(device_tokens * ratio)
    return (size // p + 1) * p


class HiCacheTier:
    """SGLang 0.5.23 HiCache over a host pool of ``capacity`` tokens (see module docstring).

    ``bytes_per_token`` – KV bytes of one token (for ``load_bytes``); ``pcie_bytes_per_s`` – host-to-device
    bandwidth for ``load_seconds`` (None: 0 s).
    """

    def __init__(
        self,
        capacity: int,
        *,
        write_policy: str = "write_through",
        load_back_threshold: int = LOAD_BACK_THRESHOLD,
        bytes_per_token: int = 0,
        pcie_bytes_per_s: float | None = None,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity: expected a non-negative integer (tokens), got {capacity!r}")
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy: expected one of {list(WRITE_POLICIES)}, got {write_policy!r}")
        if bytes_per_token < 0:
            raise ValueError(f"bytes_per_token: expected >= 0, got {bytes_per_token!r}")
        if pcie_bytes_per_s is not None and not pcie_bytes_per_s > 0:
            raise ValueError(f"pcie_bytes_per_s: expected > 0, got {pcie_bytes_per_s!r}")
        self.name = f"hicache-{write_policy}"
        self.capacity = capacity
        self.write_policy = write_policy
        self.write_back = write_policy == "write_back"
        self.threshold = 1 if write_policy == "write_through" else 2
        self.load_back_threshold = int(load_back_threshold)
        self.bytes_per_token = int(bytes_per_token)
        self.pcie_bytes_per_s = pcie_bytes_per_s
        self.used = 0  # host tokens held
        self.e = None
        self._dups: dict = {}  # write_back: nodes with device KV and a host copy, in the order they became so
        self.host_evicted: list[tuple] = []  # token paths of nodes evicted from the host, in order
        self.backups = 0  # nodes backed up
        self.backup_failures = 0
        self.loads = 0
        self.loads_skipped = 0  # host segments under the threshold (recomputed)
        self.loads_failed = 0  # the device could not hold the segment (recomputed)
        self.dropped = 0  # write_back: nodes dropped without a host copy

    def bind(self, engine) -> None:
        if self.capacity % engine.p:
            raise ValueError(f"capacity: {self.capacity} host tokens is not a whole number of {engine.p}-token pages")
        self.e = engine

    # ---- tree events (called by SglangEngine) -----------------------------------------------------
    def on_split(self, new) -> None:
        self._track(new)

    def on_unevict(self, node) -> None:
        self._track(node)

    def _track(self, node) -> None:
        """``_update_duplicate_tracking`` (setdefault keeps a node's first position)."""
        if not self.write_back:
            return
        if node.dev and node.host:
            self._dups.setdefault(node, None)
        else:
            self._dups.pop(node, None)

    def on_insert_hit(self, node) -> None:
        """``_inc_hit_count_and_check`` on an insert walk; a write-through backup when it fires."""
        if not node.dev or self.write_back:
            return
        node.hits += 1
        if not node.host and node.hits >= self.threshold:
            chain = [node]
            a = node.parent
            while a is not None and a is not self.e.root and not a.host:
                chain.append(a)
                a = a.parent
            for x in reversed(chain):  # ancestors first; stop at the first failure
                if not x.host and not self._backup(x):
                    break

    def _backup(self, node) -> bool:
        n = len(node.key)
        if not self._alloc(n):
            self.backup_failures += 1
            return False
        node.host = True
        self.used += n
        self.backups += 1
        self._track(node)  # the write's ack
        return True

    def _alloc(self, n: int) -> bool:
        free = self.capacity - self.used
        if free < n:
            self.evict_host(n - free)
        return self.capacity - self.used >= n

    def _is_host_leaf(self, x) -> bool:
        return not x.dev and x.host and not x.children and x.lock == 0 and x is not self.e.root

    def _remove(self, x) -> None:
        """Take a node (no children) out of the tree, freeing its host copy."""
        e = self.e
        del x.parent.children[e._ck(x.key)]
        self._dups.pop(x, None)
        if x.host:
            self.used -= len(x.key)
            x.host = False

    def evict_host(self, num_tokens: int) -> int:
        """``evict_host``: free at least ``num_tokens`` host tokens if possible; returns those freed."""
        e = self.e
        done = 0
        if self.write_back:
            done = self._reclaim_duplicates(num_tokens)
        heap = [(e._prio(x), x) for x in self._host_leaves()]
        heapq.heapify(heap)
        while done < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if not self._is_host_leaf(x):
                continue
            pk = e.path_key(x)
            parent = x.parent
            done += len(x.key)
            self._remove(x)
            self.host_evicted.append(pk)
            if self._is_host_leaf(parent):
                heapq.heappush(heap, (e._prio(parent), parent))
        return done

    def _reclaim_duplicates(self, num_tokens: int) -> int:
        e = self.e
        done = 0
        swept = []
        for spare in (True, False):
            if done >= num_tokens:
                break
            for x in self._dups:
                if done >= num_tokens:
                    break
                if not (x.dev and x.host):
                    swept.append(x)  # stale entry
                    continue
                if spare and e._is_leaf(x):
                    continue
                x.host = False
                self.used -= len(x.key)
                done += len(x.key)
                swept.append(x)
        for x in swept:
            self._dups.pop(x, None)
        return done

    def on_device_evict(self, x) -> bool:
        """A D-leaf chosen by device eviction: True when its device KV was freed (demoted or deleted)."""
        if not x.host and self.write_back:
            self._backup(x)
        if x.host:  # demote: the node stays, host-only
            x.dev = False
            return True
        if not self.write_back:  # write-through, not backed up: delete
            self._remove(x)
            return True
        return self._drop_subtree(x)

    def _drop_subtree(self, x) -> bool:
        """``drop_subtree_no_host``: the un-backed leaf and its (host-only) descendants, unless any is locked."""
        order = []  # post-order: children before their parent
        stack = [(x, False)]
        while stack:
            y, done = stack.pop()
            if done:
                order.append(y)
                continue
            if y.lock:
                return False
            stack.append((y, True))
            stack.extend((c, False) for c in y.children.values())
        for y in order:
            self._remove(y)
        self.dropped += len(order)
        return True

    # ---- admission --------------------------------------------------------------------------------
    def device_part(self, node, hit: int):
        """(device prefix tokens, last device node) of a match ending at ``node`` after ``hit`` tokens."""
        while not node.dev:
            hit -= len(node.key)
            node = node.parent
        return hit, node

    def load_back(self, node, c: int) -> int:
        """``load_back`` of the ``c`` host-only tokens above ``node``: tokens loaded (``c`` or 0)."""
        e = self.e
        if c < max(1, self.load_back_threshold):
            self.loads_skipped += 1
            return 0
        e._lock(node, +1)
        short = c - e.available
        if short > 0:
            e._evict(short)
        if e.available < c:
            e._lock(node, -1)
            self.loads_failed += 1
            return 0
        e.available -= c
        seg = []
        y = node
        while not y.dev:
            seg.append(y)
            y = y.parent
        for y in seg:
            y.dev = True
        for y in seg:  # ``finish_load_back`` walks from the anchor up: duplicates now
            self._track(y)
        e._lock(node, -1)
        self.loads += 1
        return c

    def outcome(self, out: RequestOutcome, req: Request, g: int, c: int) -> TierOutcome:
        nbytes = c * self.bytes_per_token
        return TierOutcome(
            rid=out.rid,
            hit_tokens=out.hit_tokens,
            hit_units=out.hit_units,
            new_blocks=out.new_blocks,
            evicted=out.evicted,
            evicted_units=out.evicted_units,
            gpu_hit_tokens=g,
            cpu_hit_tokens=c,
            computed_tokens=req.prompt_tokens - g - c,
            load_bytes=nbytes,
            load_seconds=(nbytes / self.pcie_bytes_per_s) if self.pcie_bytes_per_s else 0.0,
        )

    # ---- inspection -------------------------------------------------------------------------------
    def _nodes(self):
        stack = list(self.e.root.children.values())
        while stack:
            x = stack.pop()
            yield x
            stack.extend(x.children.values())

    def _host_leaves(self) -> list:
        return [x for x in self._nodes() if self._is_host_leaf(x)]

    def eviction_order(self) -> list[tuple]:
        """Token paths of the H-leaves, next host victim first (write_back reclaims duplicates before these)."""
        e = self.e
        return [e.path_key(x) for x in sorted(self._host_leaves(), key=lambda x: (e._prio(x), x.ct))]

    def resident(self) -> int:
        """Host tokens held (backed-up nodes, on the device or not)."""
        return self.used

    def host_only_tokens(self) -> int:
        """Tokens of nodes evicted from the device and kept on the host."""
        return sum(len(x.key) for x in self._nodes() if not x.dev)


def make_hicache(
    capacity: int,
    *,
    ratio: float | None = 2.0,
    size_gb: float = 0.0,
    write_policy: str = "write_through",
    page_size: int = 1,
    evict_policy: str = "lru",
    bytes_per_token: int = 0,
    pcie_bytes_per_s: float | None = None,
    host_capacity: int | None = None,
):
    """``SglangEngine(capacity)`` with HiCache (``host_capacity`` tokens, or sized from ``ratio``/``size_gb``
    as SGLang does: :func:`host_tokens`)."""
    from kvhit.sim.sglang.engine import SglangEngine

    if host_capacity is None:
        host_capacity = host_tokens(
            capacity, ratio=ratio, size_gb=size_gb, bytes_per_token=bytes_per_token, page_size=page_size
        )
    tier = HiCacheTier(
        int(host_capacity),
        write_policy=write_policy,
        bytes_per_token=bytes_per_token,
        pcie_bytes_per_s=pcie_bytes_per_s,
    )
    return SglangEngine(capacity, page_size=page_size, evict_policy=evict_policy, host=tier)
