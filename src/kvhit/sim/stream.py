"""Streaming simulation: a trace pushed chunk by chunk through simulator state that persists between chunks.

Two states, each exact — the same decisions as the whole-trace simulators, event for event:

* :class:`ContentStream` — Algorithm 1 (paper App. B.4, whole-content LRU; :mod:`kvhit.sim.content.lru`) at capacity
  ``N``. The resident list is the same array-based doubly linked list, but over *slots* instead of conversation
  indices: a hash map (:mod:`kvhit.workload.intmap`) gives each conversation id a slot at its first event, and the slot
  is released when the conversation has had its last turn (``turn == M``) *and* is not resident (evicted, or
  never fitting). So the state holds at most (live conversations + resident conversations ≤ live + N) slots.
* :class:`BlockStream` — the vLLM v1 block pool of :mod:`kvhit.sim.vllm.block` (instantaneous requests, the
  PD-disaggregated prefiller, ``engine`` = vllm | vllm-0.23) with ``N`` blocks: its state (block table, free queue,
  hash table of ≤ N cached ids) is O(N) and does not depend on the trace at all.

Each ``push`` returns the chunk's per-event outcome (hit indicators / hit blocks, chunk-sized) and adds the
measured sums of events at stream index ≥ ``warmup`` to the running totals, from which :class:`StreamResult`
gives eq. (12) (base) and eq. (31) (practical) for Algorithm 1, and the block-weighted ``h`` (eq. (6)) and vLLM's
token hit ratio for the block cache. :func:`simulate_stream` drives several capacities from one chunk source
(:func:`kvhit.workload.chunks.spec_chunks` or :func:`~kvhit.workload.chunks.parquet_chunks`).

Invariant: for every chunking of a stream (chunk sizes 1 … n, splitting conversations anywhere) the hit outcomes
and every total equal :func:`~kvhit.sim.content.lru.simulate_content` / :func:`~kvhit.sim.vllm.block.simulate_block` on
the whole stream (tested bit for bit). Memory: O(N + live conversations + chunk), never O(stream length).

NOT modelled: the block cache's discrete-event mode (``hold``: requests in flight, FIFO waiting) and the colocated
mode; block identities come from block counts (``R_j − 1`` full blocks, or ``cum_tokens // b`` when the trace has
token counts) via :func:`~kvhit.sim.vllm.blockids.hashes_from_block_counts`, not from token ids. No per-turn
breakdown and no confidence interval (one long run; batch means would need the per-event outcomes, which a
caller can collect from ``push``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import numpy as np
from numba import njit

from kvhit.sim.content.lru import ContentInputError, _as_int_array, _validate_capacity
from kvhit.sim.vllm.block import ENGINES, BlockSimError, _free, _lookup, _start, request_stream
from kvhit.workload.intmap import map_capacity, map_delete, map_empty, map_find, map_put, map_rebuild

__all__ = ["BlockStream", "ContentStream", "StreamResult", "simulate_stream"]

# -- Algorithm 1 with slot recycling ------------------------------------------------------------------------------
# st: 0 resident total, 1 free slots, 2 evictions, 3 evicted blocks, 4 max resident, 5 Σ R_{j-1}H (eq. 12),
# 6 Σ max(R_{j-1}-1, 0)H (eq. 31), 7 Σ R (measured), 8 hits, 9 revisits (j ≥ 2), 10 measured events,
# 11 slots in use, 12 peak slots in use, 13 events, 14 measured hits among revisits
_C_ST = 15


@njit(cache=True)
def _content_chunk(conv, R, last, begin, N, measure_from, hit, tab, nxt, prv, size, fin, key_of, free, st):  # noqa: E501  # pragma: no cover
    """Algorithm 1 (lines 1–9, see :func:`kvhit.sim.content.lru._lru_kernel`) over events ``begin…`` of one chunk;
    slot 0 is the sentinel of the circular resident list (``nxt`` towards the LRU end); a non-resident slot is a
    self-loop. Returns ``(status, i)``: 0 done; 1 event ``i`` has an invalid ``R``; 2 event ``i`` needs a slot and
    none is free (the caller grows the state and resumes at ``i``)."""
    S = 0
    total = st[0]
    nfree = st[1]
    for i in range(begin, conv.shape[0]):
        c = conv[i]
        r = R[i]
        j = map_find(c, tab)
        if j < 0:  # first event of this conversation (or first after its slot was released)
            if nfree == 0:
                st[0] = total
                st[1] = nfree
                return 2, i
            nfree -= 1
            s = free[nfree]
            map_put(-j - 1, c, s, tab)
            key_of[s] = c
            size[s] = 0
            nxt[s] = s
            prv[s] = s
            st[11] += 1
            if st[11] > st[12]:
                st[12] = st[11]
        else:
            s = tab[j, 1]
        sz = size[s]
        if r < 1 or r < abs(sz):
            st[0] = total
            st[1] = nfree
            return 1, i
        h = sz > 0
        sp = sz if h else 0
        hit[i] = h
        if i >= measure_from:
            st[10] += 1
            st[7] += r
            if sz != 0:
                st[9] += 1
            if h:
                st[5] += sp
                st[6] += sp - 1
                st[8] += 1
                st[14] += 1
        p = prv[s]
        q = nxt[s]
        nxt[p] = q
        prv[q] = p
        size[s] = r
        fin[s] = last[i]
        total += r - sp
        f = nxt[S]
        prv[s] = S
        nxt[s] = f
        prv[f] = s
        nxt[S] = s
        while total > N:
            v = prv[S]
            sv = size[v]
            total -= sv
            st[3] += sv
            st[2] += 1
            p = prv[v]
            prv[S] = p
            nxt[p] = S
            prv[v] = v
            nxt[v] = v
            if fin[v]:  # the conversation is over and leaves the cache: release its slot
                map_delete(map_find(key_of[v], tab), tab)
                size[v] = 0
                free[nfree] = v
                nfree += 1
                st[11] -= 1
            else:
                size[v] = -sv
        if total > st[4]:
            st[4] = total
        st[13] += 1
    st[0] = total
    st[1] = nfree
    return 0, conv.shape[0]


class ContentStream:
    """Algorithm 1 at capacity ``N`` blocks, fed chunk by chunk (see the module docstring).

    ``push(conv, R, last)``: ``conv`` int64 conversation ids (any ≥ 0), ``R`` the content size ``R_j`` after the
    turn-``j`` prompt (blocks), ``last`` true at a conversation's final turn (its slot may then be released; a
    later event with the same id starts a new conversation). Events must be in time order across pushes.
    Returns the chunk's ``H_{θ,j}`` (uint8). A push that raises leaves the state unusable.
    """

    def __init__(self, N) -> None:
        self.N = _validate_capacity(N)
        self.st = np.zeros(_C_ST, np.int64)
        self._broken = False
        self._grow(256)

    def _grow(self, slots: int) -> None:
        """Room for ``slots`` slots (plus the sentinel 0); existing slots, links and the map are kept."""
        old = getattr(self, "nxt", None)
        n0 = 0 if old is None else old.shape[0] - 1
        cap = slots + 1
        nxt = np.arange(cap, dtype=np.int64)
        prv = np.arange(cap, dtype=np.int64)
        size = np.zeros(cap, np.int64)
        fin = np.zeros(cap, np.bool_)
        key_of = np.zeros(cap, np.int64)
        free = np.zeros(cap, np.int64)
        new_slots = np.arange(cap - 1, n0, -1, dtype=np.int64)  # popped from the end: lowest first
        if old is None:
            free[: new_slots.size] = new_slots
            nfree = new_slots.size
            self.tab = map_empty(map_capacity(slots))
        else:
            for a, b in ((nxt, self.nxt), (prv, self.prv), (size, self.size), (fin, self.fin), (key_of, self.key_of)):
                a[: b.shape[0]] = b
            k = int(self.st[1])
            free[: new_slots.size] = new_slots
            free[new_slots.size : new_slots.size + k] = self.free[:k]
            nfree = new_slots.size + k
            if map_capacity(slots) > self.tab.shape[0]:
                tab = map_empty(map_capacity(slots))
                map_rebuild(self.tab, tab)
                self.tab = tab
        self.nxt, self.prv, self.size, self.fin, self.key_of, self.free = nxt, prv, size, fin, key_of, free
        self.st[1] = nfree

    def push(self, conv, R, last, *, measure_from: int = 0) -> np.ndarray:
        """Run the chunk; events at chunk index ≥ ``measure_from`` are measured (see :class:`StreamResult`)."""
        if self._broken:
            raise ContentInputError("this stream state failed on an earlier chunk; start a new one")
        conv = _as_int_array(conv, "conv")
        R = _as_int_array(R, "R")
        lst = np.asarray(last)
        if conv.shape != R.shape or lst.shape != conv.shape:
            raise ContentInputError(
                f"conv, R and last must have equal lengths, got {conv.shape[0]}, {R.shape[0]} and {lst.size}"
            )
        if lst.dtype != np.bool_:
            raise ContentInputError(f"last must be a boolean array, got dtype {lst.dtype}")
        n = conv.shape[0]
        hit = np.zeros(n, np.uint8)
        if n == 0:
            return hit
        if int(conv.min()) < 0:
            raise ContentInputError(f"conv must be >= 0, found {int(conv.min())} at event {int(np.argmin(conv))}")
        lst = np.ascontiguousarray(lst)
        i = 0
        while True:
            status, i = _content_chunk(
                conv, R, lst, np.int64(i), np.int64(self.N), np.int64(max(0, measure_from)), hit,
                self.tab, self.nxt, self.prv, self.size, self.fin, self.key_of, self.free, self.st,
            )  # fmt: skip
            if status != 2:
                break
            self._grow(2 * self.slots)  # out of slots: double (slots in use ≤ live + resident conversations)
        if status == 1:
            self._broken = True
            bad = int(i)
            r = int(R[bad])
            if r < 1:
                raise ContentInputError(f"R must be >= 1 (content size in blocks), found R={r} at event {bad}")
            raise ContentInputError(
                f"R must be nondecreasing within a conversation: event {bad} has R={r}, below the previous R "
                f"of the same conversation (conv {int(conv[bad])})"
            )
        return hit

    @property
    def slots(self) -> int:
        """Slots allocated (the state's size in conversations)."""
        return int(self.nxt.shape[0] - 1)

    def result(self, warmup: int = 0) -> StreamResult:
        st = self.st
        dem = int(st[7])
        return StreamResult(
            policy="content",
            N=self.N,
            engine="content",
            n_events=int(st[13]),
            warmup=int(warmup),
            n_measured=int(st[10]),
            h=float(st[5] / dem) if dem else float("nan"),
            h_practical=float(st[6] / dem) if dem else float("nan"),
            request_hit_rate=float(st[14] / st[9]) if st[9] else float("nan"),
            hit_numerator=int(st[5]),
            hit_numerator_practical=int(st[6]),
            demand_blocks=dem,
            n_hits=int(st[8]),
            evictions=int(st[2]),
            evicted_blocks=int(st[3]),
            max_resident=int(st[4]),
            peak_state=int(st[12]),
            state_slots=self.slots,
        )


# -- the vLLM block pool, instantaneous requests -------------------------------------------------------------------
# acc: 0 measured hit blocks, 1 measured prompt blocks ceil(T/b), 2 measured prompt tokens, 3 measured admitted,
# 4 measured requests with ≥ 1 hit among those with (T-1)//b ≥ 1, 5 such eligible requests, 6 block accesses
# (hit + new over admitted requests), 7 measured rejected, 8 requests
_B_ACC = 9


@njit(cache=True)
def _block_chunk(
    T, off, hashes, b, N, unhashed_to_head, measure_from, hit_out, blk, dl, bhash, tab, mask, st, rb, acc
):  # pragma: no cover
    """The instantaneous branch of :func:`kvhit.sim.vllm.block._simulate_kernel` over one chunk, on persistent state."""
    head = N
    tail = N + 1
    for r in range(T.shape[0]):
        t = T[r]
        nb = (t + b - 1) // b
        acc[8] += 1
        if nb > N:
            hit_out[r] = -1
            st[3] += 1
            if r >= measure_from:
                acc[7] += 1
            continue
        o = off[r]
        maxhit = (t - 1) // b
        h, probes, ev = _lookup(hashes, o, maxhit, tab, mask, rb, 0, blk)
        st[4] += probes
        _start(h, nb, t // b, o, 0, hashes, rb, blk, dl, head, bhash, tab, mask, st)
        _free(nb, 0, rb, blk, head, tail, unhashed_to_head, st)
        hit_out[r] = h
        acc[6] += nb
        if r >= measure_from:
            acc[0] += h
            acc[1] += nb
            acc[2] += t
            acc[3] += 1
            if maxhit >= 1:
                acc[5] += 1
                if h >= 1:
                    acc[4] += 1


class BlockStream:
    """vLLM v1's block pool with ``N`` usable blocks of ``block_size`` tokens, fed chunk by chunk.

    ``push(prompt_tokens, hash_offsets, hashes)`` takes a chunk of requests exactly as
    :func:`kvhit.sim.vllm.block.simulate_block` does (PD mode, no ``hold``) and returns hit blocks per request
    (``-1`` for a rejected request, one needing more than ``N`` blocks).
    """

    def __init__(self, N, block_size, engine: str = "vllm") -> None:
        if isinstance(N, bool) or not isinstance(N, int | np.integer) or N < 1:
            raise BlockSimError(f"N: expected a positive integer, got {N!r}")
        if N >= 2**31 - 2:
            raise BlockSimError(f"N: at most 2**31 - 3 blocks supported, got {N}")
        if engine not in ENGINES:
            raise BlockSimError(f"engine: expected one of {sorted(ENGINES)}, got {engine!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int | np.integer) or block_size < 1:
            raise BlockSimError(f"block_size: expected a positive integer, got {block_size!r}")
        N = int(N)
        self.N, self.block_size, self.engine = N, int(block_size), engine
        blk = np.zeros((N + 2, 4), np.int32)  # the initial state of _simulate_kernel: all free, in index order
        blk[:N, 0] = np.arange(1, N + 1)
        blk[:N, 1] = np.arange(-1, N - 1)
        blk[0, 1] = N
        blk[N - 1, 0] = N + 1
        blk[N, 0] = 0
        blk[N + 1, 1] = N - 1
        self.blk = blk
        self.dl = np.zeros((N, 2), np.int32)
        self.bhash = np.zeros(N, np.int64)
        cap = 16
        while cap < 2 * N:
            cap *= 2
        self.mask = np.uint64(cap - 1)
        self.tab = np.zeros((cap, 2), np.int64)
        self.tab[:, 1] = -1
        self.st = np.zeros(5, np.int64)  # free count, evictions, peak in use, rejected, block ops
        self.st[0] = N
        self.acc = np.zeros(_B_ACC, np.int64)
        self.rb = np.empty(1, np.int32)

    def push(self, prompt_tokens, hash_offsets, hashes, *, measure_from: int = 0) -> np.ndarray:
        T, _, _, off, hs, _ = request_stream(
            prompt_tokens, hash_offsets, hashes, block_size=self.block_size, engine=self.engine, colocated=False
        )
        n = T.shape[0]
        out = np.zeros(n, np.int64)
        if n == 0:
            return out
        nb = -(-T // self.block_size)
        mx = int(nb[nb <= self.N].max(initial=1))
        if mx > self.rb.shape[0]:
            self.rb = np.empty(mx, np.int32)
        _block_chunk(
            T, off, hs, np.int64(self.block_size), np.int64(self.N), ENGINES[self.engine],
            np.int64(max(0, measure_from)), out, self.blk, self.dl, self.bhash, self.tab, self.mask, self.st,
            self.rb, self.acc,
        )  # fmt: skip
        return out

    def result(self, warmup: int = 0) -> StreamResult:
        a, st = self.acc, self.st
        return StreamResult(
            policy="block",
            N=self.N,
            engine=self.engine,
            n_events=int(a[8]),
            warmup=int(warmup),
            n_measured=int(a[3] + a[7]),
            h=float(a[0] / a[1]) if a[1] else float("nan"),
            h_practical=None,
            request_hit_rate=float(a[4] / a[5]) if a[5] else float("nan"),
            hit_numerator=int(a[0]),
            hit_numerator_practical=None,
            demand_blocks=int(a[1]),
            n_hits=int(a[4]),
            evictions=int(st[1]),
            evicted_blocks=int(st[1]),
            max_resident=int(st[2]),
            peak_state=self.N,
            state_slots=self.N,
            token_hit_ratio=float(a[0] * self.block_size / a[2]) if a[2] else float("nan"),
            block_accesses=int(a[6]),
            block_ops=int(st[4]),
            rejected=int(st[3]),
        )


@dataclass(frozen=True)
class StreamResult:
    """Totals of one streamed run at capacity ``N``.

    ``h``: eq. (12) Σ R_{j−1}H_j / Σ R_j (content) or eq. (6) Σ hit blocks / Σ ⌈T/b⌉ (block), over events at
    stream index ≥ ``warmup``; ``h_practical``: eq. (31) (content only); ``request_hit_rate``: measured hits among
    measured turns j ≥ 2 (content) or among requests with a hashable block (block). ``max_resident``: the
    largest resident total (content) / blocks in use (block), always ≤ N. ``peak_state``: the most conversation
    slots in use at once (content; the state's memory in conversations) or N (block); ``state_slots``: slots
    allocated. ``evictions``: whole contents (content) or cached blocks whose hash was dropped (block).
    """

    policy: str
    N: int
    engine: str
    n_events: int
    warmup: int
    n_measured: int
    h: float
    h_practical: float | None
    request_hit_rate: float
    hit_numerator: int
    hit_numerator_practical: int | None
    demand_blocks: int
    n_hits: int
    evictions: int
    evicted_blocks: int
    max_resident: int
    peak_state: int
    state_slots: int
    token_hit_ratio: float | None = None
    block_accesses: int | None = None
    block_ops: int | None = None
    rejected: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def block_request_chunk(ch, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A chunk's requests for :class:`BlockStream`: ``T = cum_tokens`` when the source has token counts, else
    ``T = R·b − 1`` (R − 1 full blocks and one partial block, eq. (28)); ids ``id(conv, i)`` of
    :func:`~kvhit.sim.vllm.blockids.hashes_from_block_counts` — as :func:`kvhit.sim.runner.block_requests` builds them
    (``source`` counts / blocks)."""
    from kvhit.sim.vllm.blockids import hashes_from_block_counts

    b = int(block_size)
    T = ch.cum_tokens.astype(np.int64) if ch.cum_tokens is not None else ch.R * b - 1
    off, hs = hashes_from_block_counts(ch.conv, T // b)
    return T, off, hs


def simulate_stream(
    chunks: Iterable,
    Ns,
    *,
    policy: str = "content",
    engine: str = "vllm",
    block_size: int = 128,
    warmup: int = 0,
    progress: Callable[[int], None] | None = None,
) -> list[StreamResult]:
    """Push every chunk (:class:`kvhit.workload.chunks.EventChunk`, in order) through one state per capacity in
    ``Ns``; events at stream index ≥ ``warmup`` are measured. ``progress(events_done)`` after each chunk."""
    if policy not in ("content", "block"):
        raise ValueError(f"policy: expected content or block, got {policy!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int | np.integer) or warmup < 0:
        raise ValueError(f"warmup: expected an integer ≥ 0 (events), got {warmup!r}")
    Ns = [int(n) for n in Ns]
    if not Ns:
        raise ValueError("Ns: at least one capacity")
    if policy == "content":
        states = [ContentStream(n) for n in Ns]
    else:
        states = [BlockStream(n, block_size, engine) for n in Ns]
    done = 0
    for ch in chunks:
        mf = max(0, int(warmup) - ch.start)
        if policy == "content":
            last = ch.last
            for s in states:
                s.push(ch.conv, ch.R, last, measure_from=mf)
        else:
            T, off, hs = block_request_chunk(ch, block_size)
            for s in states:
                s.push(T, off, hs, measure_from=mf)
        done = ch.start + len(ch)
        if progress is not None:
            progress(done)
    if warmup and done <= warmup:
        raise ValueError(f"warmup: {warmup:,} events leave none of the {done:,} to measure")
    return [s.result(warmup) for s in states]
