"""Compiled (numba) pass of the LMCache 0.5.6 local CPU backend: its own prefix hit ``l_r`` per request.

Invariant: :func:`lmcache_lookup_pass_compiled` returns, request by request, what
:func:`kvhit.sim.tiers.surface.lmcache_lookup_pass` returns (the state machine of
:class:`~kvhit.sim.tiers.lmcache.LMCacheTier`: read that module's docstring for what is mirrored and what is not
modelled), and :func:`lmcache_tier_pass` the GPU and CPU hit tokens of a sequential replay of
``make_tiered("lmcache", ...)``; both tested equal in ``tests/test_tiers_fast.py``.

Per request: the prompt's full chunks (key of chunk ``k`` = the block hash at token ``chunk_tokens·(k+1)``) are
looked up from chunk 0 until the first miss (``l`` = found chunks · chunk tokens); the found chunks move to the MRU
end in reverse order (head most recent); then the chunks from the first miss on are stored, a resident one skipped
without a recency change, a new one appended at the MRU end after evicting the LRU head when full (nothing stored at
capacity 0). The LRU is an intrusive doubly linked list over dense key ids (one per distinct chunk key of the trace,
from an O(n) hash-table pass: LMCache chunks are 256 tokens, so the arrays stay small beside the block stream).

The tier pass uses separation (:mod:`kvhit.sim.tiers.surface`, item 2): the GPU hit ``g`` is the compiled
single-tier simulator's, and the load is ``max(0, l − g − [l = T])``. Sequential replay only (no ``hold``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvhit.workload.hashing import fmix64

__all__ = ["lmcache_lookup_pass_compiled", "lmcache_tier_pass"]


@njit(cache=True)
def _chunk_keys_kernel(T, off, h, bpc, tpc):
    n = T.shape[0]
    koff = np.zeros(n + 1, np.int64)
    for r in range(n):
        koff[r + 1] = koff[r] + T[r] // tpc
    K = koff[n]
    cap = 16
    while cap < 2 * K:
        cap *= 2
    mask = np.uint64(cap - 1)
    tk = np.empty(cap, np.int64)
    tv = np.full(cap, -1, np.int64)
    kid = np.empty(K, np.int64)
    m = 0
    for r in range(n):
        for k in range(koff[r + 1] - koff[r]):
            key = h[off[r] + (k + 1) * bpc - 1]
            j = np.int64(fmix64(np.uint64(key)) & mask)
            while tv[j] >= 0 and tk[j] != key:
                j = (j + 1) & np.int64(mask)
            if tv[j] < 0:
                tk[j] = key
                tv[j] = m
                m += 1
            kid[koff[r] + k] = tv[j]
    return koff, kid, m


def chunk_key_ids(prompt_tokens, hash_offsets, hashes, block_size: int, chunk_tokens: int):
    """``(koff, kid, count)``: the prompt's full chunks per request (CSR ``koff``), each keyed by its last block hash
    and given a dense id (``0 .. count - 1``, first appearance first) from a hash table, in O(total chunks)."""
    T = np.ascontiguousarray(prompt_tokens, np.int64)
    off = np.ascontiguousarray(hash_offsets, np.int64)
    h = np.asarray(hashes)
    h = np.ascontiguousarray(h.view(np.int64) if h.dtype == np.uint64 else h.astype(np.int64, copy=False))
    b, tpc = int(block_size), int(chunk_tokens)
    bpc = tpc // b
    if off.shape != (T.shape[0] + 1,) or np.any((off[1:] - off[:-1]) < (T // tpc) * bpc):
        raise ValueError("hashes: each request needs its prompt's T // block_size block hashes")
    return _chunk_keys_kernel(T, off, h, np.int64(bpc), np.int64(tpc))


@njit(cache=True)
def _lookup_kernel(koff, kid, adm, C, ct, nkeys):
    n = adm.shape[0]
    out = np.zeros(n, np.int64)
    H = nkeys
    TL = nkeys + 1
    nx = np.empty(nkeys + 2, np.int64)
    pv = np.empty(nkeys + 2, np.int64)
    nx[H] = TL
    pv[TL] = H
    res = np.zeros(nkeys, np.bool_)
    size = 0
    for r in range(n):
        if not adm[r]:
            continue
        k0 = koff[r]
        nk = koff[r + 1] - k0
        f = 0
        while f < nk and res[kid[k0 + f]]:
            f += 1
        for i in range(f - 1, -1, -1):  # touch_cache in reverse: the head chunk ends most recent
            key = kid[k0 + i]
            a = pv[key]
            c = nx[key]
            nx[a] = c
            pv[c] = a
            a = pv[TL]
            nx[a] = key
            pv[key] = a
            nx[key] = TL
            pv[TL] = key
        out[r] = f * ct
        if C == 0:
            continue
        for i in range(f, nk):
            key = kid[k0 + i]
            if res[key]:
                continue
            if size >= C:  # evict the LRU head
                v = nx[H]
                c = nx[v]
                nx[H] = c
                pv[c] = H
                res[v] = False
                size -= 1
            a = pv[TL]
            nx[a] = key
            pv[key] = a
            nx[key] = TL
            pv[TL] = key
            res[key] = True
            size += 1
    return out


def lmcache_lookup_pass_compiled(
    prompt_tokens, hash_offsets, hashes, admitted, *, C: int, block_size: int, chunk_tokens: int = 256
):
    """LMCache's own prefix hit ``l_r`` (tokens) per admitted request; ``C`` chunks of ``chunk_tokens``."""
    b, ct = int(block_size), int(chunk_tokens)
    if ct < 1 or ct % b:
        raise ValueError(f"chunk_tokens: expected a positive multiple of block_size={b}, got {chunk_tokens!r}")
    if int(C) < 0:
        raise ValueError(f"C: expected a non-negative integer, got {C!r}")
    koff, kid, nkeys = chunk_key_ids(prompt_tokens, hash_offsets, hashes, b, ct)
    return _lookup_kernel(koff, kid, np.asarray(admitted, np.bool_), int(C), np.int64(ct), nkeys)


def lmcache_tier_pass(
    prompt_tokens,
    hash_offsets,
    hashes,
    *,
    N: int,
    C: int,
    block_size: int,
    chunk_tokens: int = 256,
    engine: str = "vllm",
):
    """``(gpu_hit_tokens, cpu_hit_tokens, rejected)`` per request of a sequential PD replay of GPU + LMCache."""
    from kvhit.sim.vllm.block import simulate_block

    T = np.asarray(prompt_tokens, np.int64)
    res = simulate_block(T, hash_offsets, hashes, N=int(N), block_size=int(block_size), engine=engine)
    g = res.hit_blocks.astype(np.int64) * int(block_size)
    lt = lmcache_lookup_pass_compiled(
        T, hash_offsets, hashes, ~res.rejected, C=C, block_size=block_size, chunk_tokens=chunk_tokens
    )
    c = np.maximum(lt - g - (lt == T), 0)
    c[res.rejected] = 0
    return g, c, res.rejected.copy()
