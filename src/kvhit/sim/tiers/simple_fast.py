"""Compiled (numba) sequential replays of vLLM 0.33.0's ``SimpleCPUOffloadConnector``, eager and lazy, PD prefill.

Invariant: :func:`simple_eager_pass` returns, request by request, the GPU and CPU hit tokens of
:func:`kvhit.sim.engine.replay` (no ``hold``) over ``make_tiered("simple", ...)`` (:class:`~kvhit.sim.tiers.
TieredEngine` with :class:`~kvhit.sim.tiers.simple.SimpleCpuTier`, ``colocated=False``), and
:func:`simple_lazy_pass` those of :class:`~kvhit.sim.tiers.simple_lazy.SimpleLazyEngine`; rejected requests (more
blocks than the GPU has) get 0 and their flag. Tested equal under hypothesis in ``tests/test_tiers_fast.py`` and
asserted equal in ``benchmarks/bench_tiers.py``. The semantics are those modules' (read their docstrings: what is
mirrored from vLLM and what is not modelled); this module only changes the data structures.

Both tiers change the GPU free-queue order (store pins, write-back), so unlike native and LMCache the GPU side cannot
come from :func:`kvhit.sim.vllm.block.simulate_block`: each pass runs two vLLM ``BlockPool`` s — the GPU's ``N``
blocks and the CPU's ``num_cpu_blocks - 1`` — in the layout of :mod:`kvhit.sim.vllm.block` (an intrusive doubly
linked free queue per pool with head/tail sentinels, ref counts, a has-hash flag, and a linear-probing hash table
whose entries head an insertion-ordered chain of the blocks cached under one hash, so duplicates and
``get_one_block``'s first-inserted rule are kept). ``BlockPool.free_blocks`` is mirrored with the
``unhashed_to_head`` rule of vLLM ≥ 0.24 (``engine="vllm"``) or append-only (``"vllm-0.23"``, eager only; the CPU pool
is always ≥ 0.24).

Not covered (use the step-wise models): ``hold`` (concurrency), colocated decode, ``max_num_batched_tokens`` other
than through ``target_free`` (lazy only).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvhit.sim.vllm.block import _HH, _NX, _PV, _RF, _ht_find, _ht_insert, _ht_remove

__all__ = ["simple_eager_pass", "simple_lazy_pass"]


# ---- one vLLM BlockPool as arrays ------------------------------------------------------------------------------
@njit(cache=True)
def _pool(N):
    """Links/ref/has-hash rows (``N`` = head, ``N + 1`` = tail), dup chains, hashes, hash table and its mask."""
    blk = np.zeros((N + 2, 4), np.int32)
    prev = N
    for i in range(N):
        blk[prev, _NX] = i
        blk[i, _PV] = prev
        prev = i
    blk[prev, _NX] = N + 1
    blk[N + 1, _PV] = prev
    dl = np.zeros((max(N, 1), 2), np.int32)
    bhash = np.zeros(max(N, 1), np.int64)
    cap = 16
    while cap < 2 * N:
        cap *= 2
    tab = np.zeros((cap, 2), np.int64)
    tab[:, 1] = -1
    return blk, dl, bhash, tab, np.uint64(cap - 1)


@njit(cache=True, inline="always")
def _cached(key, tab, mask):
    """``get_cached_block``: the first block inserted under ``key``, or -1."""
    i = _ht_find(key, tab, mask)
    if i < 0:
        return -1
    return tab[i, 1]


@njit(cache=True)
def _touch_n(blk, ids, lo, hi):
    """``BlockPool.touch(ids[lo:hi])``; returns how many left the free queue. (Loops over a request's blocks live in
    these helpers: numba calls, inlined or not, per block cost as much as the block operation itself.)"""
    left = 0
    for p in range(lo, hi):
        x = ids[p]
        if blk[x, _RF] == 0:
            a = blk[x, _PV]
            c = blk[x, _NX]
            blk[a, _NX] = c
            blk[c, _PV] = a
            left += 1
        blk[x, _RF] += 1
    return left


@njit(cache=True)
def _pop_n(blk, dl, bhash, tab, mask, head, out, lo, hi):
    """``get_new_blocks`` into ``out[lo:hi]``: pop the free-queue head, drop its hash, ref 1."""
    for p in range(lo, hi):
        x = blk[head, _NX]
        c = blk[x, _NX]
        blk[head, _NX] = c
        blk[c, _PV] = head
        if blk[x, _HH]:
            _ht_remove(x, bhash[x], tab, dl, mask)
            blk[x, _HH] = 0
        blk[x, _RF] = 1
        out[p] = x


@njit(cache=True)
def _hash_n(blk, dl, bhash, tab, mask, ids, lo, hi, hs, o):
    """``cache_full_blocks``: ``ids[p]`` cached under ``hs[o + p]`` for ``p`` in ``[lo, hi)``."""
    for p in range(lo, hi):
        x = ids[p]
        key = hs[o + p]
        bhash[x] = key
        blk[x, _HH] = 1
        _ht_insert(x, key, tab, dl, mask)


@njit(cache=True, inline="always")
def _set_hash(blk, dl, bhash, tab, mask, x, key):
    """``cache_full_blocks`` / a store completion: block ``x`` cached under ``key`` (appended to its chain)."""
    bhash[x] = key
    blk[x, _HH] = 1
    _ht_insert(x, key, tab, dl, mask)


@njit(cache=True)
def _free_list(blk, ids, n, head, tail, unhashed_to_head):
    """``BlockPool.free_blocks(ids[:n])``; returns how many reached ref 0 (joined the free queue)."""
    cursor = head
    freed = 0
    for p in range(n):
        x = ids[p]
        blk[x, _RF] -= 1
        if blk[x, _RF] == 0:
            freed += 1
            if unhashed_to_head and blk[x, _HH] == 0:  # prepend_n, order kept
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
    return freed


# ---- shared by both kernels ------------------------------------------------------------------------------------
@njit(cache=True)
def _max_blocks(T, N, b):
    """The most blocks an admitted request (``⌈T/b⌉ ≤ N``) needs; at least 1 (scratch sizes)."""
    mx = 1
    for r in range(T.shape[0]):
        nb = (T[r] + b - 1) // b
        if nb <= N and nb > mx:
            mx = nb
    return mx


@njit(cache=True)
def _lookup(hs, o, Tr, b, gtab, gmask, ctab, cmask, rb, cb):
    """The scheduler's two-tier lookup: GPU hits ``rb[:h]`` (chained, capped at ``(T − 1) // b`` blocks), then CPU
    hits ``cb[:nc]`` beyond them (full blocks, capped at ``T − 1 − h·b`` tokens). Returns ``(h, nc)``."""
    nf = Tr // b
    maxhit = (Tr - 1) // b
    h = 0
    while h < maxhit:
        x = _cached(hs[o + h], gtab, gmask)
        if x < 0:
            break
        rb[h] = x
        h += 1
    g = h * b
    nc = 0
    if Tr - 1 - g > 0:
        lim = min(nf, h + (Tr - 1 - g) // b)
        i = h
        while i < lim:
            y = _cached(hs[o + i], ctab, cmask)
            if y < 0:
                break
            cb[nc] = y
            nc += 1
            i += 1
    return h, nc


# ---- eager ------------------------------------------------------------------------------------------------------
@njit(cache=True)
def _select(hs, o, start, end, ctab, cmask, cfree, pos):
    """``_select_eager_blocks_to_store``: positions in ``[start, end)`` not on the CPU, at most ``cfree``;
    returns (count, advanced cursor)."""
    k = 0
    i = start
    while i < end:
        if _cached(hs[o + i], ctab, cmask) < 0:
            if k >= cfree:
                break
            pos[k] = i
            k += 1
        i += 1
    return k, i


@njit(cache=True)
def _eager_kernel(T, off, hs, N, NC, b, u2h):
    n = T.shape[0]
    gout = np.zeros(n, np.int64)
    cout = np.zeros(n, np.int64)
    rej = np.zeros(n, np.bool_)
    gblk, gdl, gbh, gtab, gmask = _pool(N)
    cblk, cdl, cbh, ctab, cmask = _pool(NC)
    gh, gt, ch, ct = N, N + 1, NC, NC + 1
    cfree = NC
    mx = _max_blocks(T, N, b)
    rb = np.empty(mx, np.int32)  # the request's GPU blocks (hit + new)
    rev = np.empty(mx, np.int32)
    cb = np.empty(mx, np.int32)  # CPU hit blocks
    p1 = np.empty(mx, np.int64)  # prefill-step store: positions, CPU blocks, GPU sources
    c1 = np.empty(mx, np.int32)
    s1 = np.empty(mx, np.int32)
    p2 = np.empty(mx, np.int64)  # finish-time flush
    c2 = np.empty(mx, np.int32)
    s2 = np.empty(mx, np.int32)
    for r in range(n):
        Tr = T[r]
        nb = (Tr + b - 1) // b
        if nb > N:
            rej[r] = True
            continue
        o = off[r]
        nf = Tr // b
        h, nc = _lookup(hs, o, Tr, b, gtab, gmask, ctab, cmask, rb, cb)
        g = h * b
        c = nc * b
        gout[r] = g
        cout[r] = c
        # GPU allocation: touch the hits, pop the rest, hash the full blocks
        _touch_n(gblk, rb, 0, h)
        _pop_n(gblk, gdl, gbh, gtab, gmask, gh, rb, h, nb)
        _hash_n(gblk, gdl, gbh, gtab, gmask, rb, h, nf, hs, o)
        # the load: CPU hit blocks pinned, then freed in prefix order
        if nc > 0:
            cfree -= _touch_n(cblk, cb, 0, nc)
            cfree += _free_list(cblk, cb, nc, ch, ct, True)
        # the prefill step's store: blocks confirmed before it (g + c); completes after the request's free
        n1, cursor = _select(hs, o, 0, min((g + c) // b, nf), ctab, cmask, cfree, p1)
        _pop_n(cblk, cdl, cbh, ctab, cmask, ch, c1, 0, n1)
        cfree -= n1
        for k in range(n1):
            s1[k] = rb[p1[k]]
        _touch_n(gblk, s1, 0, n1)
        # finish: the flush of the rest (request_finished, before the GPU free)
        n2, _unused = _select(hs, o, cursor, nf, ctab, cmask, cfree, p2)
        _pop_n(cblk, cdl, cbh, ctab, cmask, ch, c2, 0, n2)
        cfree -= n2
        for k in range(n2):
            s2[k] = rb[p2[k]]
        _touch_n(gblk, s2, 0, n2)
        # the request's own free, tail first
        for p in range(nb):
            rev[p] = rb[nb - 1 - p]
        _free_list(gblk, rev, nb, gh, gt, u2h)
        # completions: the finishing step's store, then the flush (CPU hashed and freed, GPU sources freed)
        for k in range(n1):
            _set_hash(cblk, cdl, cbh, ctab, cmask, c1[k], hs[o + p1[k]])
        cfree += _free_list(cblk, c1, n1, ch, ct, True)
        _free_list(gblk, s1, n1, gh, gt, u2h)
        for k in range(n2):
            _set_hash(cblk, cdl, cbh, ctab, cmask, c2[k], hs[o + p2[k]])
        cfree += _free_list(cblk, c2, n2, ch, ct, True)
        _free_list(gblk, s2, n2, gh, gt, u2h)
    return gout, cout, rej


# ---- lazy -------------------------------------------------------------------------------------------------------
@njit(cache=True)
def _walk(gblk, gbh, ctab, cmask, cblk, cdl, cbh, ch, gh, gt, cursor, target, cfree, sel, new):
    """``_prepare_lazy_store_specs``: select from the GPU free queue after the cursor; pin the selected GPU blocks and
    take CPU blocks for them. Returns (selected, new cursor, CPU blocks taken)."""
    if cursor >= 0 and gblk[cursor, _RF] > 0:
        cursor = -1
    x = gblk[gh if cursor < 0 else cursor, _NX]
    last = cursor
    covered = 0
    ns = 0
    while x != gt:
        if covered >= target or ns >= cfree:
            break
        last = x
        if gblk[x, _HH] and _cached(gbh[x], ctab, cmask) < 0:
            sel[ns] = x
            ns += 1
        covered += 1
        x = gblk[x, _NX]
    _pop_n(cblk, cdl, cbh, ctab, cmask, ch, new, 0, ns)
    _touch_n(gblk, sel, 0, ns)
    return ns, last, ns


@njit(cache=True)
def _complete(gblk, gbh, cblk, cdl, cbh, ctab, cmask, ch, ct, gh, gt, sel, new, ns):
    """``_process_store_completion``: CPU blocks take the GPU blocks' hashes; CPU then GPU blocks freed in walk order.
    Returns the CPU blocks that rejoined the free queue."""
    for k in range(ns):
        _set_hash(cblk, cdl, cbh, ctab, cmask, new[k], gbh[sel[k]])
    freed = _free_list(cblk, new, ns, ch, ct, True)
    _free_list(gblk, sel, ns, gh, gt, True)
    return freed


@njit(cache=True)
def _lazy_kernel(T, off, hs, N, NC, b, target):
    n = T.shape[0]
    gout = np.zeros(n, np.int64)
    cout = np.zeros(n, np.int64)
    rej = np.zeros(n, np.bool_)
    gblk, gdl, gbh, gtab, gmask = _pool(N)
    cblk, cdl, cbh, ctab, cmask = _pool(NC)
    gh, gt, ch, ct = N, N + 1, NC, NC + 1
    cfree = NC
    mx = _max_blocks(T, N, b)
    rb = np.empty(mx, np.int32)
    rev = np.empty(mx, np.int32)
    cb = np.empty(mx, np.int32)
    sel = np.empty(max(target, 1), np.int32)
    new = np.empty(max(target, 1), np.int32)
    ns = 0  # the pending store (at most one at a time in a sequential replay)
    cursor = -1
    for r in range(n):
        Tr = T[r]
        nb = (Tr + b - 1) // b
        if nb > N:
            rej[r] = True
            continue
        o = off[r]
        nf = Tr // b
        h, nc = _lookup(hs, o, Tr, b, gtab, gmask, ctab, cmask, rb, cb)
        g = h * b
        c = nc * b
        gout[r] = g
        cout[r] = c
        _touch_n(gblk, rb, 0, h)
        m = h
        if nc > 0:  # the load step: only the loaded blocks are allocated, then a walk
            cfree -= _touch_n(cblk, cb, 0, nc)
            _pop_n(gblk, gdl, gbh, gtab, gmask, gh, rb, h, h + nc)
            m = h + nc
            ns, cursor, took = _walk(
                gblk, gbh, ctab, cmask, cblk, cdl, cbh, ch, gh, gt, cursor, target, cfree, sel, new
            )
            cfree -= took
            cfree += _free_list(cblk, cb, nc, ch, ct, True)  # load completion
            cfree += _complete(gblk, gbh, cblk, cdl, cbh, ctab, cmask, ch, ct, gh, gt, sel, new, ns)
            ns = 0
        _pop_n(gblk, gdl, gbh, gtab, gmask, gh, rb, m, nb)
        _hash_n(gblk, gdl, gbh, gtab, gmask, rb, h, nf, hs, o)
        ns, cursor, took = _walk(gblk, gbh, ctab, cmask, cblk, cdl, cbh, ch, gh, gt, cursor, target, cfree, sel, new)
        cfree -= took
        # finish (in the step that computed the request): free tail first, complete, one more walk, complete
        for p in range(nb):
            rev[p] = rb[nb - 1 - p]
        _free_list(gblk, rev, nb, gh, gt, True)
        cfree += _complete(gblk, gbh, cblk, cdl, cbh, ctab, cmask, ch, ct, gh, gt, sel, new, ns)
        ns, cursor, took = _walk(gblk, gbh, ctab, cmask, cblk, cdl, cbh, ch, gh, gt, cursor, target, cfree, sel, new)
        cfree -= took
        cfree += _complete(gblk, gbh, cblk, cdl, cbh, ctab, cmask, ch, ct, gh, gt, sel, new, ns)
        ns = 0
    return gout, cout, rej


def _stream(prompt_tokens, hash_offsets, hashes, block_size):
    T = np.ascontiguousarray(prompt_tokens, np.int64)
    off = np.ascontiguousarray(hash_offsets, np.int64)
    h = np.asarray(hashes)
    h = np.ascontiguousarray(h.view(np.int64) if h.dtype == np.uint64 else h.astype(np.int64, copy=False))
    b = int(block_size)
    if off.shape != (T.shape[0] + 1,) or np.any(np.diff(off) != T // b):
        raise ValueError("hashes: each request needs its prompt's T // block_size block hashes (PD prefill)")
    return T, off, h, b


def simple_eager_pass(
    prompt_tokens, hash_offsets, hashes, *, N: int, num_cpu_blocks: int, block_size: int, engine: str = "vllm"
):
    """``(gpu_hit_tokens, cpu_hit_tokens, rejected)`` per request of a sequential PD replay of the eager
    SimpleCPUOffload tier (``num_cpu_blocks`` as vLLM sizes the CPU pool: one is its null block)."""
    from kvhit.sim.vllm.block import ENGINES

    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {sorted(ENGINES)}, got {engine!r}")
    if int(num_cpu_blocks) < 1 or int(N) < 1:
        raise ValueError("N and num_cpu_blocks: expected positive integers")
    T, off, h, b = _stream(prompt_tokens, hash_offsets, hashes, block_size)
    return _eager_kernel(T, off, h, int(N), int(num_cpu_blocks) - 1, np.int64(b), ENGINES[engine])


def simple_lazy_pass(
    prompt_tokens,
    hash_offsets,
    hashes,
    *,
    N: int,
    num_cpu_blocks: int,
    block_size: int,
    max_num_batched_tokens: int = 8192,
):
    """``(gpu_hit_tokens, cpu_hit_tokens, rejected)`` per request of a sequential PD replay of the lazy
    (write-back) SimpleCPUOffload tier (:class:`~kvhit.sim.tiers.simple_lazy.SimpleLazyEngine`)."""
    from kvhit.sim.tiers.simple_lazy import lazy_target_blocks

    if int(num_cpu_blocks) < 1 or int(N) < 1 or int(max_num_batched_tokens) < 1:
        raise ValueError("N, num_cpu_blocks and max_num_batched_tokens: expected positive integers")
    T, off, h, b = _stream(prompt_tokens, hash_offsets, hashes, block_size)
    target = lazy_target_blocks(int(max_num_batched_tokens), b)
    return _lazy_kernel(T, off, h, int(N), int(num_cpu_blocks) - 1, np.int64(b), int(target))
