"""Block-level prefix-cache simulator faithful to vLLM v1 automatic prefix caching (APC).

This replays a request stream against a pool of ``N`` physical KV blocks of ``block_size`` tokens
exactly as vLLM v1's ``KVCacheManager`` / ``BlockPool`` manage them (full-attention model, one KV-cache
group, no chunked prefill, no preemption). It is the block-exact counterpart of the paper's idealised
whole-content LRU (Algorithm 1) and reproduces the practical effects listed in App. E: ref-counted
blocks of in-flight requests are protected from eviction, a conversation's suffix is evicted before
its prefix ("prefix-preserving, suffix-first"), the unhashable tail block (the ``R_j - 1`` of
eq. (28)/(31)) and the forced recompute of the last prompt token.

Semantics mirrored (vLLM ``vllm/v1/core``):

* **Lookup** – ``KVCacheManager.get_computed_blocks`` caps the hit at ``max_cache_hit_length =
  num_tokens - 1`` and ``FullAttentionManager.find_longest_cache_hit`` walks the chained block hashes
  ``block_hashes[0 : max_length // block_size]`` and stops at the first miss. So
  ``hit_blocks <= (T - 1) // b`` for a prompt of ``T`` tokens. ``BlockHashToBlockMap.get_one_block``
  returns, among several blocks cached under one hash, the first one inserted that is still cached.
* **Admission** – ``SingleTypeKVCacheManager.get_num_blocks_to_allocate``: the request needs
  ``ceil(L / b) - hit`` new blocks plus the hit blocks whose ``ref_cnt == 0`` (they leave the free
  queue when touched); ``allocate_slots`` refuses when this exceeds ``get_num_free_blocks()``.
  Here ``L = T`` (PD-disaggregated prefiller, paper Fig. 1) or ``L = T + m − 1`` for ``m`` generated
  tokens (colocated, Remark B.1: the last sampled token never gets KV, ``kvhit.workload.requests.kv_tokens``,
  checked against a live vLLM 0.32.0 server by ``make live``).
* **Touch** – ``BlockPool.touch``: a hit block with ``ref_cnt == 0`` is removed from the free queue;
  ``ref_cnt += 1``.
* **Allocate** – ``BlockPool.get_new_blocks`` pops blocks from the free-queue head
  (``FreeKVCacheBlockQueue.popleft_n``); ``_maybe_evict_cached_block`` drops the hash of a popped
  block (lazy eviction, counted in ``evictions``).
* **Cache** – ``BlockPool.cache_full_blocks`` (called from ``allocate_slots``, i.e. when the request
  is scheduled) gives every newly allocated *full* block its hash. Duplicates are not de-duplicated:
  ``BlockHashToBlockMap.insert`` keeps every block under the hash (a dict keyed by block id, in
  insertion order). Duplicates arise from the hit cap (``T`` a multiple of ``b``: the last full block
  is recomputed into a new block) and from cached blocks beyond the first miss.
* **Free** – ``SingleTypeKVCacheManager.free`` frees ``reversed(req_blocks)`` (tail first);
  ``BlockPool.free_blocks`` decrements ``ref_cnt`` and, for blocks reaching 0:

  - ``engine="vllm"`` (vLLM >= 0.24, PR #42656 "Apply LRU policy only to proper cache entries"):
    blocks without a hash are put at the free-queue *head* with ``prepend_n`` (order kept: the first
    freed ends up first), hashed blocks are appended at the tail with ``append_n``;
  - ``engine="vllm-0.23"`` (vLLM <= 0.23): every freed block is appended at the tail.

* **Initial state** – all ``N`` blocks free, unhashed, in index order. ``N`` is the number of *usable*
  blocks: vLLM additionally reserves one ``null_block`` (``num_gpu_blocks = N + 1``).

Timing. Without ``hold`` every request is instantaneous (allocate, compute, free in one event), so
nothing is ever held in flight. With ``hold[r]`` (prefill + KV-transfer time; for the colocated mode
the whole request) it is a discrete-event simulation: request ``r`` arrives at ``times[r]``; if it
cannot be admitted, or earlier requests are still waiting (FIFO, head-of-line blocking as vLLM's FCFS
waiting queue), it waits; lookup and admission are re-evaluated each time blocks are freed; it holds
its blocks from its start until ``start + hold[r]``. At equal times, finishes are processed before
arrivals, and finishes in (time, request index) order. ``wait[r] = start - times[r]``. A request with
``ceil(L / b) > N`` can never run: it is *rejected* (flag ``rejected[r]``, no state change), like vLLM
rejecting a prompt longer than the KV cache.

Not modelled: chunked prefill (hashes appear block by block), preemption/recompute, speculative
decoding (eagle drops the last hit block), sliding-window / hybrid models, KV connectors / CPU
offload, the ``prepend=`` abort path of vLLM 0.23.

Block operations (``block_ops``, the unit of the throughput figure): one per hash-table probe of the
lookup (hits plus the terminating miss, each retry counted again), one per touched hit block, one per
allocated block and one per freed block: ``probes + 2 * hit + 2 * new`` for an admitted request.

All per-request arrays are kept so that any measurement window and weighting can be computed after the
fact; see :func:`token_hit_ratio` (vLLM's ``prefix_cache_hits / prefix_cache_queries``),
:func:`block_hit_ratio` (the paper's block-weighted ``h``, eq. (6)/(31)), :func:`request_hit_rate`
and :func:`partial_hit_histogram`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from kvhit.workload.hashing import fmix64
from kvhit.workload.requests import kv_tokens

__all__ = [
    "ENGINES",
    "BlockSimError",
    "BlockResult",
    "simulate_block",
    "token_hit_ratio",
    "block_hit_ratio",
    "request_hit_rate",
    "hit_fraction",
    "partial_hit_histogram",
]

#: engine name -> ``unhashed_to_head`` flag of ``BlockPool.free_blocks``
ENGINES: dict[str, bool] = {"vllm": True, "vllm-0.23": False}


class BlockSimError(ValueError):
    """Invalid input to the block-level simulator (the message names the field)."""


@dataclass(frozen=True)
class BlockResult:
    """Outcome of :func:`simulate_block` (arrays are per request, in input order).

    ``hit_blocks[r]`` – prefix blocks reused from the cache (``R^H_j`` of eq. (6)); hit tokens are
    ``hit_blocks * block_size``. ``new_blocks[r]`` – blocks allocated (``ceil(L/b) - hit``).
    ``wait[r]`` – queueing delay before the request could start (0 without holds, NaN if rejected).
    ``rejected[r]`` – the request needs more than ``N`` blocks and never ran.
    """

    hit_blocks: np.ndarray
    new_blocks: np.ndarray
    wait: np.ndarray
    rejected: np.ndarray
    prompt_tokens: np.ndarray
    block_size: int
    N: int
    engine: str
    colocated: bool
    evictions: int  #: hashed blocks whose hash was dropped when the block was reused
    peak_blocks_in_use: int  #: max number of blocks with ref_cnt > 0 (always <= N)
    n_rejected: int
    block_ops: int  #: probes + touches + allocations + frees (see module docstring)
    extra: dict = field(default_factory=dict)

    @property
    def hit_tokens(self) -> np.ndarray:
        """Hit tokens per request (``hit_blocks * block_size``), as counted by vLLM."""
        return self.hit_blocks * self.block_size

    @property
    def prompt_blocks(self) -> np.ndarray:
        """``ceil(T / b)``: blocks of the prompt (the paper's ``R_j``)."""
        return -(-self.prompt_tokens // self.block_size)

    @property
    def max_hit_blocks(self) -> np.ndarray:
        """``(T - 1) // b``: the most blocks a lookup may hit (hit cap of ``get_computed_blocks``)."""
        return (self.prompt_tokens - 1) // self.block_size


# --------------------------------------------------------------------------------------------------
# numba core
#
# Per-block state is one 16-byte row of ``blk`` (int32[N + 2, 4]): free-list links (``_NX``, ``_PV``;
# rows N and N + 1 are the head / tail sentinels of the intrusive doubly linked free queue), ref count
# and has-hash flag; ``dl`` (int32[N, 2]) links the block in the insertion-ordered circular chain of
# blocks cached under its hash (duplicates). The hash table ``tab`` (int64[cap, 2] = key, first block
# of the chain; -1 = empty) uses linear probing with backward-shift deletion; it holds at most N keys
# and ``cap >= 2N``.
# --------------------------------------------------------------------------------------------------

_NX, _PV, _RF, _HH = 0, 1, 2, 3
_DN, _DP = 0, 1


@njit(cache=True, inline="always")
def _home(key, mask):
    return np.int64(fmix64(np.uint64(key)) & mask)


@njit(cache=True, inline="always")
def _ht_find(key, tab, mask):
    """Slot holding ``key`` or ``-(empty_slot + 1)``."""
    m = np.int64(mask)
    i = _home(key, mask)
    while tab[i, 1] != -1:
        if tab[i, 0] == key:
            return i
        i = (i + 1) & m
    return -(i + 1)


@njit(cache=True)
def _ht_delete_slot(i, tab, mask):
    """Backward-shift deletion of slot ``i``."""
    m = np.int64(mask)
    j = i
    while True:
        j = (j + 1) & m
        if tab[j, 1] == -1:
            break
        k = _home(tab[j, 0], mask)
        if i <= j:
            stay = i < k and k <= j
        else:
            stay = i < k or k <= j
        if stay:
            continue
        tab[i, 0] = tab[j, 0]
        tab[i, 1] = tab[j, 1]
        i = j
    tab[i, 1] = -1


@njit(cache=True, inline="always")
def _ht_insert(x, key, tab, dl, mask):
    """``BlockHashToBlockMap.insert``: append block ``x`` to the (insertion-ordered) chain of ``key``."""
    i = _ht_find(key, tab, mask)
    if i >= 0:
        h = tab[i, 1]
        t = dl[h, _DP]
        dl[t, _DN] = x
        dl[x, _DP] = t
        dl[x, _DN] = h
        dl[h, _DP] = x
    else:
        i = -i - 1
        tab[i, 0] = key
        tab[i, 1] = x
        dl[x, _DN] = x
        dl[x, _DP] = x


@njit(cache=True, inline="always")
def _ht_remove(x, key, tab, dl, mask):
    """``BlockHashToBlockMap.pop(key, block_id)``."""
    i = _ht_find(key, tab, mask)
    q = dl[x, _DN]
    if q == x:
        _ht_delete_slot(i, tab, mask)
    else:
        p = dl[x, _DP]
        dl[p, _DN] = q
        dl[q, _DP] = p
        if tab[i, 1] == x:
            tab[i, 1] = q


@njit(cache=True)
def _lookup(hashes, off, maxhit, tab, mask, rb, base, blk):
    """``find_longest_cache_hit``: write hit blocks to ``rb[base:]``; return (hits, probes, evictable)."""
    h = 0
    probes = 0
    ev = 0
    while h < maxhit:
        probes += 1
        i = _ht_find(hashes[off + h], tab, mask)
        if i < 0:
            break
        x = tab[i, 1]
        rb[base + h] = x
        if blk[x, _RF] == 0:
            ev += 1
        h += 1
    return h, probes, ev


@njit(cache=True)
def _start(h, nb, nfull, off, base, hashes, rb, blk, dl, head, bhash, tab, mask, st):
    """Touch the ``h`` hit blocks, pop ``nb - h`` new blocks from the head, cache the full ones."""
    free_count = st[0]
    for p in range(h):
        x = rb[base + p]
        if blk[x, _RF] == 0:  # BlockPool.touch: leave the free queue
            a = blk[x, _PV]
            c = blk[x, _NX]
            blk[a, _NX] = c
            blk[c, _PV] = a
            free_count -= 1
        blk[x, _RF] += 1
    ev = 0
    for p in range(h, nb):
        x = blk[head, _NX]  # popleft
        c = blk[x, _NX]
        blk[head, _NX] = c
        blk[c, _PV] = head
        free_count -= 1
        if blk[x, _HH]:  # _maybe_evict_cached_block
            _ht_remove(x, bhash[x], tab, dl, mask)
            blk[x, _HH] = 0
            ev += 1
        blk[x, _RF] = 1
        rb[base + p] = x
        if p < nfull:  # cache_full_blocks
            key = hashes[off + p]
            bhash[x] = key
            blk[x, _HH] = 1
            _ht_insert(x, key, tab, dl, mask)
    st[0] = free_count
    st[1] += ev
    in_use = (blk.shape[0] - 2) - free_count
    if in_use > st[2]:
        st[2] = in_use
    st[4] += 2 * nb  # h touches + (nb - h) allocations + nb frees (frees counted here)


@njit(cache=True)
def _free(nb, base, rb, blk, head, tail, unhashed_to_head, st):
    """``BlockPool.free_blocks(reversed(req_blocks))``."""
    cursor = head
    freed = 0
    for p in range(nb - 1, -1, -1):
        x = rb[base + p]
        blk[x, _RF] -= 1
        if blk[x, _RF] == 0:
            freed += 1
            if unhashed_to_head and blk[x, _HH] == 0:  # prepend_n (order kept)
                c = blk[cursor, _NX]
                blk[cursor, _NX] = x
                blk[x, _PV] = cursor
                blk[x, _NX] = c
                blk[c, _PV] = x
                cursor = x
            else:  # append_n
                a = blk[tail, _PV]
                blk[a, _NX] = x
                blk[x, _PV] = a
                blk[x, _NX] = tail
                blk[tail, _PV] = x
    st[0] += freed


@njit(cache=True)
def _heap_push(ht, hr, size, t, r):
    i = size
    ht[i] = t
    hr[i] = r
    while i > 0:
        p = (i - 1) >> 1
        if ht[p] < ht[i] or (ht[p] == ht[i] and hr[p] < hr[i]):
            break
        ht[p], ht[i] = ht[i], ht[p]
        hr[p], hr[i] = hr[i], hr[p]
        i = p
    return size + 1


@njit(cache=True)
def _heap_pop(ht, hr, size):
    size -= 1
    ht[0] = ht[size]
    hr[0] = hr[size]
    i = 0
    while True:
        lft = 2 * i + 1
        if lft >= size:
            break
        m = lft
        rgt = lft + 1
        if rgt < size and (ht[rgt] < ht[lft] or (ht[rgt] == ht[lft] and hr[rgt] < hr[lft])):
            m = rgt
        if ht[i] < ht[m] or (ht[i] == ht[m] and hr[i] < hr[m]):
            break
        ht[m], ht[i] = ht[i], ht[m]
        hr[m], hr[i] = hr[i], hr[m]
        i = m
    return size


@njit(cache=True)
def _simulate_kernel(
    prompt_tokens, alloc_tokens, hash_offsets, hashes, times, hold, use_events, N, b, unhashed_to_head
):
    n = prompt_tokens.shape[0]
    hit_out = np.zeros(n, np.int64)
    new_out = np.zeros(n, np.int64)
    wait_out = np.zeros(n, np.float64)
    rej_out = np.zeros(n, np.bool_)
    # st: 0 free_count, 1 evictions, 2 peak in use, 3 rejected, 4 block ops
    st = np.zeros(5, np.int64)
    st[0] = N

    nb_arr = (alloc_tokens + b - 1) // b
    # per-request block tables: CSR when requests overlap in time, one scratch row otherwise
    boff = np.zeros(n + 1, np.int64)
    if use_events:
        for r in range(n):
            boff[r + 1] = boff[r] + (nb_arr[r] if nb_arr[r] <= N else 0)
        rb = np.empty(max(boff[n], 1), np.int32)
    else:
        mx = 1
        for r in range(n):
            if nb_arr[r] <= N and nb_arr[r] > mx:
                mx = nb_arr[r]
        rb = np.empty(mx, np.int32)

    head = N
    tail = N + 1
    blk = np.zeros((N + 2, 4), np.int32)
    dl = np.zeros((N, 2), np.int32)
    for i in range(N):
        blk[i, _NX] = i + 1
        blk[i, _PV] = i - 1
    blk[0, _PV] = head
    blk[N - 1, _NX] = tail
    blk[head, _NX] = 0
    blk[tail, _PV] = N - 1
    bhash = np.zeros(N, np.int64)
    cap = 16
    while cap < 2 * N:
        cap *= 2
    mask = np.uint64(cap - 1)
    tab = np.zeros((cap, 2), np.int64)
    tab[:, 1] = -1

    if not use_events:
        for r in range(n):
            nb = nb_arr[r]
            if nb > N:
                rej_out[r] = True
                wait_out[r] = np.nan
                st[3] += 1
                continue
            off = hash_offsets[r]
            maxhit = (prompt_tokens[r] - 1) // b
            h, probes, ev = _lookup(hashes, off, maxhit, tab, mask, rb, 0, blk)
            st[4] += probes
            _start(h, nb, alloc_tokens[r] // b, off, 0, hashes, rb, blk, dl, head, bhash, tab, mask, st)
            hit_out[r] = h
            new_out[r] = nb - h
            _free(nb, 0, rb, blk, head, tail, unhashed_to_head, st)
        return hit_out, new_out, wait_out, rej_out, st

    # discrete-event mode
    ht = np.empty(n, np.float64)
    hr = np.empty(n, np.int64)
    hsize = 0
    q = np.empty(n, np.int64)
    qh = 0
    qt = 0
    r = 0
    while r < n or hsize > 0:
        # next event: a finish not later than the next arrival, else the arrival
        if hsize > 0 and (r >= n or ht[0] <= times[r]):
            now = ht[0]
            f = hr[0]
            hsize = _heap_pop(ht, hr, hsize)
            _free(nb_arr[f], boff[f], rb, blk, head, tail, unhashed_to_head, st)
        else:
            now = times[r]
            if nb_arr[r] > N:
                rej_out[r] = True
                wait_out[r] = np.nan
                st[3] += 1
            else:
                q[qt] = r
                qt += 1
            r += 1
        # start waiting requests (FIFO, head-of-line blocking)
        while qh < qt:
            w = q[qh]
            nb = nb_arr[w]
            maxhit = (prompt_tokens[w] - 1) // b
            if st[0] < nb - maxhit:  # cannot fit even with a full hit: skip the lookup
                break
            off = hash_offsets[w]
            base = boff[w]
            h, probes, ev = _lookup(hashes, off, maxhit, tab, mask, rb, base, blk)
            st[4] += probes
            if nb - h + ev > st[0]:  # allocate_slots returns None
                break
            qh += 1
            _start(h, nb, alloc_tokens[w] // b, off, base, hashes, rb, blk, dl, head, bhash, tab, mask, st)
            hit_out[w] = h
            new_out[w] = nb - h
            wait_out[w] = now - times[w]
            hsize = _heap_push(ht, hr, hsize, now + hold[w], w)
    return hit_out, new_out, wait_out, rej_out, st


# --------------------------------------------------------------------------------------------------
# Python wrapper
# --------------------------------------------------------------------------------------------------


def _int_array(name: str, a, ndim: int = 1, error: type[BlockSimError] = BlockSimError) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != ndim:
        raise error(f"{name}: expected a {ndim}-d array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise error(f"{name}: expected integers, got dtype {arr.dtype}")
    return arr


def request_stream(
    prompt_tokens,
    hash_offsets,
    hashes,
    *,
    block_size,
    engine: str,
    colocated: bool,
    response_tokens=None,
    error: type[BlockSimError] = BlockSimError,
):
    """Validate a request stream (shared by :func:`simulate_block` and :mod:`kvhit.sim.vllm.curve`).

    Returns ``(T, L, resp, off, hs, b)``: prompt tokens, allocated tokens (``T`` or ``T + resp − 1``
    when colocated, :func:`~kvhit.workload.requests.kv_tokens`), response tokens (or None), CSR offsets and
    int64 ids, block size. Every request must carry exactly ``L // b`` ids (its full blocks). Errors are
    ``error`` instances naming the field (and request).
    """
    if engine not in ENGINES:
        raise error(f"engine: expected one of {sorted(ENGINES)}, got {engine!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int | np.integer) or block_size < 1:
        raise error(f"block_size: expected a positive integer, got {block_size!r}")
    b = int(block_size)
    T = _int_array("prompt_tokens", prompt_tokens, error=error).astype(np.int64)
    n = T.shape[0]
    if n and T.min() < 1:
        raise error("prompt_tokens: every request needs at least 1 prompt token")
    if colocated:
        if response_tokens is None:
            raise error("response_tokens: required when colocated=True")
        resp = _int_array("response_tokens", response_tokens, error=error).astype(np.int64)
        if resp.shape != (n,):
            raise error(f"response_tokens: expected shape ({n},), got {resp.shape}")
        if n and resp.min() < 0:
            raise error("response_tokens: must be >= 0")
        L = kv_tokens(T, resp)
    else:
        if response_tokens is not None:
            raise error("response_tokens: only used with colocated=True (PD mode keeps no response KV)")
        resp = None
        L = T
    off = _int_array("hash_offsets", hash_offsets, error=error).astype(np.int64)
    if off.shape != (n + 1,):
        raise error(f"hash_offsets: expected shape ({n + 1},), got {off.shape}")
    hs = np.asarray(hashes)
    if hs.ndim != 1:
        raise error(f"hashes: expected a 1-d array, got shape {hs.shape}")
    if hs.dtype == np.uint64:
        hs = np.ascontiguousarray(hs).view(np.int64)
    elif hs.size == 0 or np.issubdtype(hs.dtype, np.integer):
        hs = np.ascontiguousarray(hs.astype(np.int64, copy=False))
    else:
        raise error(f"hashes: expected int64/uint64 ids, got dtype {hs.dtype}")
    if off[0] != 0 or off[-1] != hs.shape[0]:
        raise error(f"hash_offsets: must start at 0 and end at len(hashes)={hs.shape[0]}")
    counts = np.diff(off)
    expected = L // b
    bad = np.flatnonzero(counts != expected)
    if bad.size:
        r = int(bad[0])
        what = "(prompt + response)" if colocated else "prompt"
        raise error(
            f"hashes: request {r} has {int(counts[r])} block hashes but {what} tokens // block_size = "
            f"{int(expected[r])} ({bad.size} request(s) mismatch)"
        )
    return T, L, resp, off, hs, b


def simulate_block(
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
) -> BlockResult:
    """Replay requests (in arrival order) through a vLLM v1 block pool of ``N`` blocks.

    Parameters
    ----------
    prompt_tokens : int[n]
        ``T``: total prompt tokens of each request (whole history + new prompt), ``>= 1``.
    hash_offsets, hashes : int[n+1], int64/uint64[...]
        CSR stream of chained block hashes (see :mod:`kvhit.sim.vllm.blockids`): request ``r`` owns
        ``hashes[hash_offsets[r]:hash_offsets[r+1]]``, exactly ``L // block_size`` of them, where
        ``L = T`` (disaggregated) or ``L = T + max(response_tokens − 1, 0)`` (``colocated=True``).
    N : int
        Usable KV blocks in the pool (vLLM ``num_gpu_blocks - 1``).
    block_size : int
        Tokens per block ``b``.
    engine : {"vllm", "vllm-0.23"}
        Free-queue order on free (see module docstring).
    colocated : bool
        Keep the response KV (paper Remark B.1): allocate and hash blocks of the prompt and the first
        ``m − 1`` generated tokens (the last sampled token never gets KV).
    response_tokens : int[n], optional
        Generated tokens ``m`` per request; required iff ``colocated``.
    times, hold : float[n], optional
        Arrival times (non-decreasing) and per-request hold durations (``>= 0``). Without ``hold``,
        requests are instantaneous and ``times`` is not used.
    """
    if isinstance(N, bool) or not isinstance(N, int | np.integer) or N < 1:
        raise BlockSimError(f"N: expected a positive integer, got {N!r}")
    if N >= 2**31 - 2:
        raise BlockSimError(f"N: at most 2**31 - 3 blocks supported, got {N}")
    N = int(N)
    T, L, _, off, hs, b = request_stream(
        prompt_tokens,
        hash_offsets,
        hashes,
        block_size=block_size,
        engine=engine,
        colocated=colocated,
        response_tokens=response_tokens,
    )
    n = T.shape[0]

    if hold is None:
        use_events = False
        tm = np.zeros(n, np.float64)
        hd = np.zeros(n, np.float64)
        if times is not None:
            tm = np.asarray(times, dtype=np.float64)
            if tm.shape != (n,):
                raise BlockSimError(f"times: expected shape ({n},), got {tm.shape}")
    else:
        use_events = True
        if times is None:
            raise BlockSimError("times: required when hold is given")
        tm = np.ascontiguousarray(times, dtype=np.float64)
        hd = np.ascontiguousarray(hold, dtype=np.float64)
        if tm.shape != (n,):
            raise BlockSimError(f"times: expected shape ({n},), got {tm.shape}")
        if hd.shape != (n,):
            raise BlockSimError(f"hold: expected shape ({n},), got {hd.shape}")
        if not np.all(np.isfinite(tm)):
            raise BlockSimError("times: must be finite")
        if n > 1 and np.any(np.diff(tm) < 0):
            raise BlockSimError("times: requests must be given in non-decreasing arrival-time order")
        if not np.all(np.isfinite(hd)) or (n and hd.min() < 0):
            raise BlockSimError("hold: must be finite and >= 0")

    hit, new, wait, rej, st = _simulate_kernel(
        T, L.astype(np.int64), off, hs, tm, hd, use_events, N, b, ENGINES[engine]
    )
    return BlockResult(
        hit_blocks=hit,
        new_blocks=new,
        wait=wait,
        rejected=rej,
        prompt_tokens=T,
        block_size=b,
        N=N,
        engine=engine,
        colocated=bool(colocated),
        evictions=int(st[1]),
        peak_blocks_in_use=int(st[2]),
        n_rejected=int(st[3]),
        block_ops=int(st[4]),
    )


# --------------------------------------------------------------------------------------------------
# metrics over a measurement mask
# --------------------------------------------------------------------------------------------------


def _measured(res: BlockResult, mask) -> np.ndarray:
    n = res.hit_blocks.shape[0]
    if mask is None:
        m = np.ones(n, bool)
    else:
        m = np.asarray(mask)
        if m.dtype != np.bool_ or m.shape != (n,):
            raise BlockSimError(f"mask: expected a boolean array of shape ({n},), got {m.dtype} {m.shape}")
    return m & ~res.rejected


def token_hit_ratio(res: BlockResult, mask=None) -> float:
    """vLLM's metric ``Σ hit tokens / Σ prompt tokens`` over measured, admitted requests.

    Same as ``rate(vllm:prefix_cache_hits) / rate(vllm:prefix_cache_queries)`` (``PrefixCacheStats``
    records ``num_tokens = T`` and ``num_hits = hit_blocks * b`` in ``get_computed_blocks``).
    """
    m = _measured(res, mask)
    den = int(res.prompt_tokens[m].sum())
    return float(res.hit_tokens[m].sum() / den) if den else float("nan")


def block_hit_ratio(res: BlockResult, mask=None) -> float:
    """Paper's block-weighted hit ratio ``h = Σ R^H_j / Σ R_j`` (eq. (6); practical form eq. (31)).

    ``R_j = ceil(T_j / b)`` prompt blocks of the request, ``R^H_j`` = ``hit_blocks`` (at most
    ``R_j - 1`` hashable blocks can hit, as in eq. (28)).
    """
    m = _measured(res, mask)
    den = int(res.prompt_blocks[m].sum())
    return float(res.hit_blocks[m].sum() / den) if den else float("nan")


def request_hit_rate(res: BlockResult, mask=None, full: bool = False) -> float:
    """Fraction of measured requests with at least one hit block (``full=True``: with every hashable
    prompt block hit, ``hit_blocks == (T - 1) // b``), among those with ``(T - 1) // b >= 1``."""
    m = _measured(res, mask) & (res.max_hit_blocks >= 1)
    k = int(m.sum())
    if not k:
        return float("nan")
    ok = res.hit_blocks[m] == res.max_hit_blocks[m] if full else res.hit_blocks[m] >= 1
    return float(ok.sum() / k)


def hit_fraction(res: BlockResult) -> np.ndarray:
    """Per-request ``hit_blocks / ((T - 1) // b)`` (NaN where no block can hit or rejected)."""
    mh = res.max_hit_blocks
    out = np.full(mh.shape, np.nan)
    ok = (mh >= 1) & ~res.rejected
    out[ok] = res.hit_blocks[ok] / mh[ok]
    return out


def partial_hit_histogram(res: BlockResult, mask=None, bins: int = 10) -> dict:
    """Histogram of :func:`hit_fraction` over measured requests that can hit at least one block.

    Returns ``{"edges", "counts"}`` (``np.histogram`` on [0, 1], the last bin closed) plus the exact
    counts ``n_miss`` (fraction 0), ``n_full`` (fraction 1) and ``n_partial`` (strictly between).
    """
    m = _measured(res, mask) & (res.max_hit_blocks >= 1)
    f = hit_fraction(res)[m]
    counts, edges = np.histogram(f, bins=bins, range=(0.0, 1.0))
    return {
        "edges": edges,
        "counts": counts,
        "n_miss": int((f == 0).sum()),
        "n_full": int((f == 1).sum()),
        "n_partial": int(((f > 0) & (f < 1)).sum()),
    }
