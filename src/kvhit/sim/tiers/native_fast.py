"""Compiled (numba) host pass of the vLLM 0.33.0 native tier: LRU, prompt only, any store threshold, sequential.

Invariant: :func:`native_lru_host_pass` returns, request by request, the tokens
:func:`kvhit.sim.tiers.surface.host_pass` returns for ``tier="native"`` with ``policy="lru"`` and
``prompt_only=True``, with or without a ``store_threshold`` (and its ``max_tracker_size``) (tested equal in
``tests/test_tiers_fast.py``, and with the GPU pass, to the step-wise ``TieredEngine`` replay). It is the same state
machine as :class:`~kvhit.sim.tiers.native.NativeCpuTier` over :class:`~kvhit.sim.tiers.native.CpuOffloadManager` /
:class:`~kvhit.sim.tiers.native.LruPolicy` (read that module's docstring for what is mirrored from vLLM's
``OffloadingConnectorScheduler`` and ``CPUOffloadingManager``), specialised to one request at a time, where each
request's life reduces to:

1. lookup of consecutive resident chunks from chunk ``⌊g/tpc⌋`` (no ``T - 1`` cap; a hit under one chunk is 0);
2. on a load, the loaded chunks are recorded as accesses (they take the request's provisional rank);
3. the offers (``prepare_store``) of the chunks from the stored index to ``⌊T/tpc⌋`` (all from 0 without a load):
   with a threshold, the offer tracker counts them first and a new chunk offered fewer than ``store_threshold`` times
   is neither recorded nor stored; resident ones are recorded, new ones inserted with the provisional rank after
   evicting the smallest ranks that are not offered — all or nothing; a refused offer is repeated once in the step
   after the finish;
4. the commit: every recorded resident chunk gets a fresh committed rank, tail to head (head most recent).

No heap is needed in a sequential replay: vLLM's LRU ranks are pairs, a committed ``(n, 0)`` drawn from a global
counter at a request's finish and a provisional ``(rr, -position)`` while the request runs, ``rr`` drawn at its first
access — after every earlier commit. So during request ``r`` every committed rank is below every provisional one,
committed ranks are in commit order (an intrusive doubly linked list over dense key ids: a commit appends at the
MRU end, a recorded chunk leaves the list), and the provisional chunks are the request's recorded resident chunks,
ordered by descending position (a scan of its own chunk list). Eviction takes the list from its head, then the
provisional chunks from the tail of the prompt, skipping the offered (protected) ones. The offer tracker
(``OrderedDict`` bounded by ``max_tracker_size``, oldest dropped) is a second linked list. Not covered (use the
Python tier): ARC, decode chunks, concurrency (``hold``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvhit.workload.hashing import fmix64

__all__ = ["chunk_key_ids", "native_lru_host_pass"]


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
def _track(k0, start, nk, kid, cnt, tnx, tpv, tsize, maxsz, pmark, pstamp, H, TL):
    """``CPUOffloadingManager._record_offers``: count the offers in the LRU-bounded tracker; returns its size."""
    nprot = 0
    for k in range(start, nk):
        key = kid[k0 + k]
        if cnt[key] > 0:  # move_to_end, count + 1, protected
            a = tpv[key]
            c = tnx[key]
            tnx[a] = c
            tpv[c] = a
            a = tpv[TL]
            tnx[a] = key
            tpv[key] = a
            tnx[key] = TL
            tpv[TL] = key
            cnt[key] += 1
            if pmark[key] != pstamp:
                pmark[key] = pstamp
                nprot += 1
    unprot = tsize - nprot
    for k in range(start, nk):
        key = kid[k0 + k]
        if cnt[key] > 0:
            continue
        if tsize >= maxsz:
            if unprot == 0:
                continue
            v = tnx[H]  # popitem(last=False)
            c = tnx[v]
            tnx[H] = c
            tpv[c] = H
            cnt[v] = 0
            tsize -= 1
            unprot -= 1
        a = tpv[TL]
        tnx[a] = key
        tpv[key] = a
        tnx[key] = TL
        tpv[TL] = key
        cnt[key] = 1
        tsize += 1
    return tsize


@njit(cache=True, inline="always")
def _unlink(nx, pv, x):
    a = pv[x]
    c = nx[x]
    nx[a] = c
    pv[c] = a


@njit(cache=True, inline="always")
def _append(nx, pv, x, TL):
    a = pv[TL]
    nx[a] = x
    pv[x] = a
    nx[x] = TL
    pv[TL] = x


@njit(cache=True)
def _pass(T, koff, kid, g, adm, C, tpc, nkeys, thr, maxsz):
    n = T.shape[0]
    out = np.zeros(n, np.int64)
    state = np.zeros(nkeys, np.int8)  # 0: not resident, 1: committed (in the LRU list), 2: provisional
    H = nkeys
    TL = nkeys + 1
    nx = np.empty(nkeys + 2, np.int64)
    pv = np.empty(nkeys + 2, np.int64)
    nx[H] = TL
    pv[TL] = H
    nres = 0
    seen = np.full(nkeys, -1, np.int64)  # request that recorded the key
    prot = np.full(nkeys, -1, np.int64)  # offer call that protects the key
    calls = 0
    mk = 1
    for r in range(n):
        if koff[r + 1] - koff[r] > mk:
            mk = koff[r + 1] - koff[r]
    cand = np.empty(mk, np.int64)
    use_thr = thr >= 2  # the offer tracker exists only for a store threshold of 2 or more
    cnt = np.zeros(nkeys if use_thr else 0, np.int64)  # offers counted per key (0: not tracked)
    tnx = np.empty(nkeys + 2 if use_thr else 0, np.int64)
    tpv = np.empty(nkeys + 2 if use_thr else 0, np.int64)
    pmark = np.full(nkeys if use_thr else 0, -1, np.int64)
    if use_thr:
        tnx[H] = TL
        tpv[TL] = H
    tsize = 0
    for r in range(n):
        if not adm[r]:
            continue
        k0 = koff[r]
        nk = koff[r + 1] - k0
        gr = g[r]
        max_hit = nk * tpc
        c = 0
        if max_hit - gr >= tpc:
            s = gr // tpc
            hits = 0
            for k in range(s, nk):
                if state[kid[k0 + k]] == 0:
                    break
                hits += 1
            c = min(max_hit, tpc * (s + hits)) - gr
            if c < tpc:
                c = 0
        out[r] = c
        nstored = 0
        rec0 = 0
        if c > 0:  # prepare_load: the loaded chunks are recorded (provisional)
            start = gr // tpc
            end = -(-(gr + c) // tpc)
            for k in range(start, end):
                key = kid[k0 + k]
                seen[key] = r
                if state[key] == 1:
                    _unlink(nx, pv, key)
                    state[key] = 2
            nstored = end
            rec0 = start
        for _attempt in range(2):  # the offer at the prefill step, repeated in the finish step if refused
            if nstored >= nk:
                break
            calls += 1
            if use_thr:
                tsize = _track(k0, nstored, nk, kid, cnt, tnx, tpv, tsize, maxsz, pmark, calls, H, TL)
            nnew = 0
            for k in range(nstored, nk):
                key = kid[k0 + k]
                prot[key] = calls
                if use_thr and state[key] == 0 and cnt[key] < thr:
                    continue  # below the threshold: neither recorded nor stored (still protected)
                if seen[key] != r:
                    seen[key] = r
                    if state[key] == 1:
                        _unlink(nx, pv, key)
                        state[key] = 2
                if state[key] == 0:
                    nnew += 1
            if nnew == 0:
                nstored = nk
                continue
            need = nnew - (C - nres)
            if need > 0:
                if need > nres:
                    continue  # refused: nothing stored, the stored index stays
                # the `need` smallest ranks not offered: committed (LRU head first), then provisional (tail first)
                ns = 0
                x = nx[H]
                while x != TL and ns < need:
                    if prot[x] != calls:
                        cand[ns] = x
                        ns += 1
                    x = nx[x]
                k = nk - 1
                while ns < need and k >= 0:
                    key = kid[k0 + k]
                    if state[key] == 2 and prot[key] != calls:
                        cand[ns] = key
                        ns += 1
                    k -= 1
                if ns < need:
                    continue  # refused
                for i in range(ns):
                    key = cand[i]
                    if state[key] == 1:
                        _unlink(nx, pv, key)
                    state[key] = 0
                nres -= ns
            for k in range(nstored, nk):
                key = kid[k0 + k]
                if state[key] == 0 and (not use_thr or cnt[key] >= thr):
                    state[key] = 2
                    nres += 1
            nstored = nk
        # commit: recorded resident chunks, tail to head, appended at the MRU end
        for k in range(nk - 1, rec0 - 1, -1):
            key = kid[k0 + k]
            if seen[key] == r and state[key] != 0:
                if state[key] == 1:
                    _unlink(nx, pv, key)
                _append(nx, pv, key, TL)
                state[key] = 1
    return out


def native_lru_host_pass(
    prompt_tokens,
    hash_offsets,
    hashes,
    g,
    admitted,
    *,
    C: int,
    block_size: int,
    bpc: int = 1,
    store_threshold: int = 0,
    max_tracker_size: int = 64_000,
):
    """Tokens loaded from the native tier (LRU) per request, driven by the GPU hits ``g`` (tokens) of a sequential
    replay; ``C`` chunks of ``bpc`` blocks of ``block_size`` tokens; ``store_threshold`` / ``max_tracker_size`` as
    :class:`~kvhit.sim.tiers.native.CpuOffloadManager` (see the module docstring)."""
    b, bpc = int(block_size), int(bpc)
    tpc = b * bpc
    T = np.asarray(prompt_tokens, np.int64)
    koff, kid, nkeys = chunk_key_ids(T, hash_offsets, hashes, b, tpc)
    return _pass(
        T,
        koff,
        kid,
        np.asarray(g, np.int64),
        np.asarray(admitted, np.bool_),
        int(C),
        np.int64(tpc),
        nkeys,
        int(store_threshold),
        int(max_tracker_size),
    )
