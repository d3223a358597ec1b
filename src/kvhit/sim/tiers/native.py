"""vLLM native CPU offloading (``--kv-offloading-backend native``) as a :class:`~kvhit.sim.tiers.HostTier`.

Read from **vLLM 0.33.0**: ``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``
(``OffloadingConnectorScheduler``), ``v1/kv_offload/cpu/manager.py`` (``CPUOffloadingManager``),
``v1/kv_offload/cpu/policies/{lru,arc,base}.py``, ``v1/kv_offload/cpu/spec.py``, ``v1/kv_offload/base.py``.
One full-attention KV-cache group, no sliding window, no eagle, no ``max_load_tokens``/``max_offload_tokens``.

Scheduler side (mirrored per request):

* **Keys** – a chunk is ``blocks_per_chunk`` (``bpc``) GPU blocks, ``tpc = bpc · block_size`` tokens, keyed by
  the hash of its last block (``update_offload_keys``); only full chunks have keys.
* **Lookup** (``_lookup_complete_chunks``) – with ``g`` the GPU hit (block-aligned, capped at ``T - 1`` by the
  GPU): ``max_hit = min(T, ⌊T/tpc⌋·tpc)``, consecutive hits over ``keys[⌊g/tpc⌋ : ⌈max_hit/tpc⌉]`` until the
  first miss, ``c = min(max_hit, tpc·(⌊g/tpc⌋ + hits)) - g``, and ``c = 0`` when ``c < tpc``. There is **no**
  ``T - 1`` cap on the CPU side: a fully resident prompt loads its last chunk and vLLM recomputes one token.
  Lookups change no recency.
* **Load** (``update_state_after_alloc``) – ``prepare_load(keys[⌊g/B⌋/bpc : ⌈(g+c)/tpc⌉])``: the loaded
  chunks ARE recorded as request accesses (``_record_request_cache_access(..., reused_keys=keys)``), so their
  recency is refreshed when the request finishes. **Deviation from issue 16**, which says loaded chunks are not
  refreshed: in 0.33.0 only the *GPU-hit* chunks below the loaded region are neither re-offered nor refreshed.
  After a load ``next_stored_chunk_idx = ⌈(g+c)/tpc⌉`` (``OffloadPolicy.CHUNK_LEVEL``, the CPU manager's
  default); without a load it stays 0, so every chunk including the GPU-hit ones is offered.
* **Store** (``_build_store_jobs``) – at the prefill step ``keys[next_stored : ⌊T/tpc⌋]`` are offered to
  ``prepare_store``; a ``None`` answer (cannot free room for *all* new chunks) stores nothing and does not
  advance ``next_stored`` (re-offered in the following steps; here: once more at finish). In the step after
  the request finished the offer is repeated up to ``⌊max(T, T + out - 1)/tpc⌋`` chunks, clamped to ``T``
  when ``prompt_only`` (``offload_prompt_only``, default True). Decode chunks are offered in that one finish
  call rather than one per decode step (identical unless a store fails in between).
* **Finish** – after the finish-step stores, ``on_request_finished`` commits the request's recency.

Manager side (``CPUOffloadingManager``, mirrored exactly): ``prepare_store`` counts offers for
``store_threshold >= 2`` (``0`` from the spec's default = off; the manager's own default 1 = off too; the
tracker holds ``max_tracker_size`` keys), splits the offer into new keys (threshold-filtered) and ready
resident keys, records both as request accesses, evicts ``len(new) - free`` chunks with the offered keys
protected, returns ``None`` when it cannot (all-or-nothing), else inserts the new keys.

Policies: ``"lru"`` (``LRUCachePolicy``): ranks are pairs; a chunk inserted or accessed by a running request
gets the provisional rank ``(request_rank, -position)`` (``position`` = chunk end token), ``request_rank``
drawn from the global counter at the request's first access; ``on_request_finished`` assigns fresh committed
ranks ``(n, 0)`` to the request's recorded keys in tail-to-head order (head most recent). Eviction takes the
smallest ranks. ``"arc"`` (``ARCCachePolicy``): T1/T2/B1/B2 with ghost adaptation on store misses,
insert into T1, promotion to T2 of *reused* chunks at finish, insertion-only chunks moved to the MRU end.

Capacity (``CPUOffloadingSpec``): ``num_chunks = cpu_bytes_to_use // round_up(kv_bytes_per_block · copies ·
bpc, alignment)`` with ``copies = world_size`` (1 for the replicated shared-region layout): see
:func:`cpu_chunks`.

Corrections to issue 16's statements, for 0.33.0: (1) loaded chunks are refreshed at finish (above); (2) a running
request's provisional rank is newer than everything committed *before its first access* only — a request that
finishes later commits newer ranks; (3) the capacity divides by one chunk copy per rank except with the replicated
shared-region layout (one copy); (4) every offered key is protected from eviction in its ``prepare_store`` call,
new ones included. Confirmed as stated: chunk keys, full chunks only, prompt-only default, all-or-nothing stores,
``store_threshold`` default 0 = off, tail-before-head LRU, no ``T - 1`` cap on the CPU side.

Not modelled: transfers in flight (chunks being stored are unreadable/unevictable, loads pin and delay
other requests: all complete at once here), the per-step re-offer of a failed store between prefill and
finish, sliding-window/eagle/mamba groups, partial-tail boundary stores, ``reset_cache``.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

from kvhit.sim.engine import Request

__all__ = ["ArcPolicy", "CpuOffloadManager", "LruPolicy", "NativeCpuTier", "cpu_chunks"]


def cpu_chunks(
    cpu_bytes: int,
    kv_bytes_per_block_per_rank: int,
    *,
    world_size: int = 1,
    blocks_per_chunk: int = 1,
    alignment: int = 1,
    replicated: bool = False,
) -> int:
    """CPU chunks vLLM 0.33.0 allocates for ``cpu_bytes_to_use`` (``CPUOffloadingSpec.__init__``); ``alignment``
    is ``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT`` for the shared-region layout, else 1."""
    copies = 1 if replicated else world_size
    per_chunk = kv_bytes_per_block_per_rank * copies * blocks_per_chunk
    aligned = -(-per_chunk // alignment) * alignment
    return int(cpu_bytes) // aligned if aligned > 0 else 0


class _ReqState:
    __slots__ = (
        "keys",
        "pos",
        "rank",
        "order",
        "seen",
        "inserted",
        "reused",
        "store_miss",
        "next_stored",
        "finished",
        "ctx",
    )

    def __init__(self) -> None:
        self.keys: list[int] = []
        self.pos: dict[int, int] = {}
        self.rank: int | None = None  # LRU request rank
        self.order: list[int] = []  # recorded keys, first-seen order
        self.seen: set[int] = set()
        self.inserted: set[int] = set()
        self.reused: set[int] = set()
        self.store_miss: set[int] = set()
        self.next_stored = 0
        self.finished = False
        self.ctx = None  # the conformance adapter's vLLM ReqContext


class LruPolicy:
    """``LRUCachePolicy`` of vLLM 0.33.0 (every chunk evictable: transfers complete at once)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rank: dict[int, tuple[int, int]] = {}
        self._heap: list[tuple[tuple[int, int], int]] = []
        self._next = 0

    def __contains__(self, key: int) -> bool:
        return key in self.rank

    def __len__(self) -> int:
        return len(self.rank)

    def _req_rank(self, st: _ReqState) -> int:
        if st.rank is None:
            self._next += 1
            st.rank = self._next
        return st.rank

    def _set(self, key: int, rank: tuple[int, int]) -> None:
        self.rank[key] = rank
        heapq.heappush(self._heap, (rank, key))
        if len(self._heap) > max(64, 4 * len(self.rank)):
            self._heap = [(r, k) for k, r in self.rank.items()]
            heapq.heapify(self._heap)

    def insert(self, key: int, st: _ReqState) -> None:
        p = st.pos.get(key)
        if p is None:
            self._next += 1
            self._set(key, (self._next, 0))
        else:
            self._set(key, (self._req_rank(st), -p))

    def on_store_miss(self, keys, st: _ReqState) -> None:  # touch() of absent keys: no-op
        return

    def on_request_access(self, keys, st: _ReqState) -> None:
        r = self._req_rank(st)
        for key in keys:
            p = st.pos.get(key)
            if p is None or key not in self.rank:
                continue
            new = (r, -p)
            if self.rank[key] >= new:
                continue
            self._set(key, new)

    def on_request_finished(self, ordered_keys: list[int], insertion_only: set, reused: set, st: _ReqState) -> None:
        for key in reversed(ordered_keys):
            if key in self.rank:
                self._next += 1
                self._set(key, (self._next, 0))

    def evict(self, n: int, protected: set[int]) -> list[int] | None:
        if n == 0:
            return []
        sel: list[tuple[tuple[int, int], int]] = []
        chosen: set[int] = set()
        deferred = []
        while self._heap and len(sel) < n:
            entry = heapq.heappop(self._heap)
            r, key = entry
            if self.rank.get(key) != r or key in chosen:
                continue
            if key in protected:
                deferred.append(entry)
                continue
            sel.append(entry)
            chosen.add(key)
        for e in deferred:
            heapq.heappush(self._heap, e)
        if len(sel) < n:
            for e in sel:
                heapq.heappush(self._heap, e)
            return None
        for _, key in sel:
            del self.rank[key]
        return [k for _, k in sel]

    def order(self) -> list[int]:
        """Resident keys, next victim first."""
        return [k for k, _ in sorted(self.rank.items(), key=lambda kv: kv[1])]


class ArcPolicy:
    """``ARCCachePolicy`` of vLLM 0.33.0 (every chunk ready and evictable: transfers complete at once)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.target_t1 = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self.t1 or key in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def insert(self, key: int, st: _ReqState) -> None:
        self.t1[key] = None
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def _ghost(self, key: int) -> None:
        if key in self.b1:
            self.target_t1 = min(self.target_t1 + max(1, len(self.b2) / len(self.b1)), self.capacity)
            self.b1.move_to_end(key)
        elif key in self.b2:
            self.target_t1 = max(self.target_t1 - max(1, len(self.b1) / len(self.b2)), 0)
            self.b2.move_to_end(key)

    def on_store_miss(self, keys, st: _ReqState) -> None:
        for key in reversed(list(keys)):
            self._ghost(key)

    def on_request_access(self, keys, st: _ReqState) -> None:
        return

    def on_request_finished(self, ordered_keys: list[int], insertion_only: set, reused: set, st: _ReqState) -> None:
        for key in reversed(ordered_keys):
            if key in insertion_only:
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
                continue
            if key in reused and key in self.t1:
                del self.t1[key]
                self.t2[key] = None
            elif key in reused and key in self.t2:
                self.t2.move_to_end(key)

    def evict(self, n: int, protected: set[int]) -> list[int] | None:
        if n == 0:
            return []
        cands: list[tuple[int, bool]] = []
        vt1 = len(self.t1)
        it1 = iter(self.t1)
        it2 = iter(self.t2)

        def nxt(it):
            for k in it:
                if k not in protected:
                    return k
            return None

        for _ in range(n):
            cand = None
            if vt1 >= int(self.target_t1):
                k = nxt(it1)
                if k is not None:
                    cand = (k, True)
                    vt1 -= 1
            if cand is None:
                k = nxt(it2)
                if k is not None:
                    cand = (k, False)
            if cand is None:
                k = nxt(it1)
                if k is None:
                    return None
                cand = (k, True)
                vt1 -= 1
            cands.append(cand)
        for k, from_t1 in cands:
            if from_t1:
                del self.t1[k]
                self.b1[k] = None
            else:
                del self.t2[k]
                self.b2[k] = None
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.capacity):
                ghost.popitem(last=False)
        return [k for k, _ in cands]

    def order(self) -> list[int]:
        return list(self.t1) + list(self.t2)


class CpuOffloadManager:
    """``CPUOffloadingManager`` of vLLM 0.33.0 over ``capacity`` chunks (see module docstring)."""

    def __init__(self, capacity: int, *, policy: str = "lru", store_threshold: int = 0, max_tracker_size: int = 64_000):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity: expected a non-negative integer, got {capacity!r}")
        if policy == "lru":
            self.policy: LruPolicy | ArcPolicy = LruPolicy(capacity)
        elif policy == "arc":
            self.policy = ArcPolicy(capacity)
        else:
            raise ValueError(f"policy: expected 'lru' or 'arc', got {policy!r}")
        self.capacity = capacity
        self.store_threshold = int(store_threshold)
        self.max_tracker_size = int(max_tracker_size)
        self.counts: OrderedDict[int, int] | None = OrderedDict() if self.store_threshold >= 2 else None
        self.evictions = 0
        self.store_failures = 0

    def lookup(self, key: int) -> bool:
        return key in self.policy

    def _record(self, keys, st: _ReqState, reused=()) -> None:
        new = []
        for k in keys:
            if k in st.seen:
                continue
            st.seen.add(k)
            st.order.append(k)
            new.append(k)
        if new:
            self.policy.on_request_access(new, st)
        st.reused.update(k for k in reused if k not in st.inserted)

    def _record_offers(self, keys: list[int]) -> None:
        counts = self.counts
        assert counts is not None
        protected = set()
        for k in keys:
            if k in counts:
                counts.move_to_end(k)
                counts[k] += 1
                protected.add(k)
        unprot = len(counts) - len(protected)
        for k in keys:
            if k in counts:
                continue
            if len(counts) >= self.max_tracker_size:
                if unprot == 0:
                    continue
                counts.popitem(last=False)
                unprot -= 1
            counts[k] = 1

    def prepare_load(self, keys: list[int], st: _ReqState) -> None:
        for k in keys:
            assert k in self.policy
        self._record(keys, st, reused=keys)

    def prepare_store(self, keys: list[int], st: _ReqState) -> list[int] | None:
        """Returns the keys stored (``[]`` when none is new), ``None`` when room cannot be made."""
        if self.counts is not None:
            self._record_offers(keys)
        to_store = [k for k in keys if k not in self.policy]
        existing = [k for k in keys if k in self.policy]
        if self.counts is not None:
            to_store = [k for k in to_store if self.counts.get(k, 0) >= self.store_threshold]
        miss = [k for k in to_store if k not in st.store_miss]
        if miss:
            self.policy.on_store_miss(miss, st)
            st.store_miss.update(miss)
        rec = set(to_store) | set(existing)
        self._record([k for k in keys if k in rec], st, reused=existing)
        if not to_store:
            return []
        need = len(to_store) - (self.capacity - len(self.policy))
        if need > 0:
            if need > len(self.policy):
                self.store_failures += 1
                return None
            ev = self.policy.evict(need, set(keys))
            if ev is None:
                self.store_failures += 1
                return None
            self.evictions += len(ev)
        for k in to_store:
            self.policy.insert(k, st)
        st.inserted.update(to_store)
        return to_store

    def order(self) -> list[int]:
        """Resident chunk keys, next victim first."""
        return self.policy.order()

    def resident(self) -> int:
        return len(self.policy)

    def on_request_finished(self, st: _ReqState) -> None:
        if st.finished:
            return
        st.finished = True
        ordered = sorted(st.order, key=st.pos.__getitem__) if all(k in st.pos for k in st.order) else st.order
        self.policy.on_request_finished(ordered, st.inserted - st.reused, st.reused, st)


class NativeCpuTier:
    """vLLM 0.33.0 native CPU offloading over ``capacity`` CPU chunks (see module docstring)."""

    def __init__(
        self,
        capacity: int,
        *,
        block_size: int,
        blocks_per_chunk: int = 1,
        policy: str = "lru",
        store_threshold: int = 0,
        prompt_only: bool = True,
        max_tracker_size: int = 64_000,
        manager=None,
    ) -> None:
        if isinstance(blocks_per_chunk, bool) or not isinstance(blocks_per_chunk, int) or blocks_per_chunk < 1:
            raise ValueError(f"blocks_per_chunk: expected a positive integer, got {blocks_per_chunk!r}")
        # ``manager``: a drop-in for :class:`CpuOffloadManager` (the conformance suite passes vLLM's own)
        self.mgr = manager or CpuOffloadManager(
            capacity, policy=policy, store_threshold=store_threshold, max_tracker_size=max_tracker_size
        )
        self.name = f"native-{policy}" + ("" if prompt_only else "-decode")
        self.capacity = capacity
        self.block_size = int(block_size)
        self.bpc = blocks_per_chunk
        self.chunk_tokens = self.bpc * self.block_size
        self.prompt_only = prompt_only
        self.colocated = False
        self._st: dict[int, _ReqState] = {}

    def bind(self, gpu) -> None:
        self.colocated = bool(getattr(gpu, "colocated", False))
        if not self.prompt_only and not self.colocated:
            raise ValueError("prompt_only=False needs a colocated GPU engine (decode KV exists only there)")

    def _keys(self, req: Request) -> list[int]:
        h = req.block_hashes
        return [h[(k + 1) * self.bpc - 1] for k in range(len(h) // self.bpc)]

    def lookup(self, req: Request, g: int) -> int:
        tpc = self.chunk_tokens
        T = req.prompt_tokens
        keys = self._keys(req)[: T // tpc]  # keys at admission: the prompt's full chunks
        max_hit = min(T, len(keys) * tpc)
        if max_hit - g < tpc:
            return 0
        s = g // tpc
        hits = 0
        for k in keys[s : -(-max_hit // tpc)]:
            if not self.mgr.lookup(k):
                break
            hits += 1
        c = min(max_hit, tpc * (s + hits)) - g
        return c if c >= tpc else 0

    def _offer(self, st: _ReqState, end: int) -> None:
        if end <= st.next_stored:
            return
        out = self.mgr.prepare_store(st.keys[st.next_stored : end], st)
        if out is not None:
            st.next_stored = max(st.next_stored, end)

    def admit(self, req: Request, g: int, c: int) -> None:
        tpc = self.chunk_tokens
        st = _ReqState()
        st.keys = self._keys(req)
        st.pos = {k: (i + 1) * tpc for i, k in enumerate(st.keys)}
        self._st[req.rid] = st
        if c:
            start = (g // self.block_size) // self.bpc
            end = -(-(g + c) // tpc)
            self.mgr.prepare_load(st.keys[start:end], st)
            st.next_stored = end
        self._offer(st, min(req.prompt_tokens // tpc, len(st.keys)))

    def finish(self, req: Request) -> None:
        st = self._st.pop(req.rid)
        T = req.prompt_tokens
        n_after = max(T, T + req.output_tokens - 1) if self.colocated else T
        if self.prompt_only:
            n_after = min(n_after, T)
        self._offer(st, min(n_after // self.chunk_tokens, len(st.keys)))
        self.mgr.on_request_finished(st)

    def after_finish(self, req: Request) -> None:
        return

    def eviction_order(self) -> list[int]:
        return self.mgr.order()

    def resident(self) -> int:
        return self.mgr.resident()
