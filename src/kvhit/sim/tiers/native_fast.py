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
committed ranks are in commit order (an intrusive doubly linked list: a commit appends at the MRU end, a recorded
chunk leaves the list), and the provisional chunks are the request's recorded resident chunks, ordered by descending
position (a scan of its own chunks). Eviction takes the list from its head, then the provisional chunks from the
tail of the prompt, skipping the offered (protected) ones. Resident chunks live in ``C`` slots found by a hash table
of their keys (the chunks' last block hashes), so memory and cache footprint follow the tier's size, not the
trace's; the offer tracker (an ``OrderedDict`` bounded by ``max_tracker_size``, oldest dropped) is a second such
pool. Not covered (use the Python tier): ARC, decode chunks, concurrency (``hold``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvhit.sim.vllm.block import _ht_delete_slot, _ht_find

__all__ = ["native_lru_host_pass"]


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


@njit(cache=True, inline="always")
def _find(key, tab, mask):
    """The value stored under ``key`` in ``tab`` (linear probing, ``tab[i, 1] = -1`` empty), or -1."""
    i = _ht_find(key, tab, mask)
    return tab[i, 1] if i >= 0 else -1


@njit(cache=True, inline="always")
def _put(key, v, tab, mask):
    i = -_ht_find(key, tab, mask) - 1
    tab[i, 0] = key
    tab[i, 1] = v


@njit(cache=True, inline="always")
def _drop(key, tab, mask):
    _ht_delete_slot(_ht_find(key, tab, mask), tab, mask)


def _table(n):
    cap = 16
    while cap < 2 * n:
        cap *= 2
    tab = np.zeros((cap, 2), np.int64)
    tab[:, 1] = -1
    return tab, np.uint64(cap - 1)


@njit(cache=True)
def _track(keys, start, nk, ttab, tmask, tkey, tcnt, tnx, tpv, tfree, st, calls, tpm, tcount):
    """``CPUOffloadingManager._record_offers`` over ``keys[start:nk]`` (an ``OrderedDict`` of at most ``maxsz`` counts,
    oldest dropped): entries are slots of a pool with a hash table and an LRU list; writes each key's count after the
    call to ``tcount``. ``st`` = [size, free-stack top, maxsz]."""
    H = tnx.shape[0] - 2
    TL = H + 1
    nprot = 0
    for k in range(start, nk):
        e = _find(keys[k], ttab, tmask)
        if e >= 0:  # move_to_end, count + 1, protected
            _unlink(tnx, tpv, e)
            _append(tnx, tpv, e, TL)
            tcnt[e] += 1
            if tpm[e] != calls:
                tpm[e] = calls
                nprot += 1
    unprot = st[0] - nprot
    for k in range(start, nk):
        key = keys[k]
        if _find(key, ttab, tmask) >= 0:
            continue
        if st[0] >= st[2]:
            if unprot == 0:
                continue
            e = tnx[H]  # popitem(last=False)
            _unlink(tnx, tpv, e)
            _drop(tkey[e], ttab, tmask)
            tfree[st[1]] = e
            st[1] += 1
            st[0] -= 1
            unprot -= 1
        st[1] -= 1
        e = tfree[st[1]]
        tkey[e] = key
        tcnt[e] = 1
        tpm[e] = -1
        _put(key, e, ttab, tmask)
        _append(tnx, tpv, e, TL)
        st[0] += 1
    for k in range(start, nk):
        e = _find(keys[k], ttab, tmask)
        tcount[k] = tcnt[e] if e >= 0 else 0


@njit(cache=True)
def _pass(T, off, h, bpc, g, adm, C, tpc, thr, tab, mask, ttab, tmask, maxsz):
    n = T.shape[0]
    out = np.zeros(n, np.int64)
    # resident chunks: slots 0..C-1 (key, state 1 committed / 2 provisional, protecting call), LRU list of the
    # committed ones (head = next victim), hash table key -> slot, free-slot stack
    H = C
    TL = C + 1
    nx = np.empty(C + 2, np.int64)
    pv = np.empty(C + 2, np.int64)
    nx[H] = TL
    pv[TL] = H
    skey = np.zeros(max(C, 1), np.int64)
    sstate = np.zeros(max(C, 1), np.int8)
    sprot = np.full(max(C, 1), -1, np.int64)
    free = np.arange(C)[::-1].copy()
    nfree = C
    nres = 0
    mk = 1
    for r in range(n):
        if T[r] // tpc > mk:
            mk = T[r] // tpc
    keys = np.empty(mk, np.int64)  # the request's chunk keys, their slots (-1: not resident), recorded flags
    pslot = np.empty(mk, np.int64)
    prec = np.zeros(mk, np.bool_)
    cand = np.empty(mk, np.int64)
    candk = np.empty(mk, np.int64)
    tcount = np.zeros(mk, np.int64)
    use_thr = thr >= 2  # the offer tracker exists only for a store threshold of 2 or more
    tsz = maxsz if use_thr else 0
    tkey = np.zeros(max(tsz, 1), np.int64)
    tcnt = np.zeros(max(tsz, 1), np.int64)
    tpm = np.full(max(tsz, 1), -1, np.int64)
    tnx = np.empty(tsz + 2, np.int64)
    tpv = np.empty(tsz + 2, np.int64)
    tnx[tsz] = tsz + 1
    tpv[tsz + 1] = tsz
    tfree = np.arange(max(tsz, 1))[::-1].copy()
    tst = np.array([0, tsz, tsz], np.int64)
    calls = 0
    for r in range(n):
        if not adm[r]:
            continue
        nk = T[r] // tpc
        o = off[r]
        for k in range(nk):
            key = h[o + (k + 1) * bpc - 1]
            keys[k] = key
            pslot[k] = _find(key, tab, mask)
            prec[k] = False
        gr = g[r]
        max_hit = nk * tpc
        c = 0
        if max_hit - gr >= tpc:
            s = gr // tpc
            hits = 0
            for k in range(s, nk):
                if pslot[k] < 0:
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
                prec[k] = True
                x = pslot[k]
                if sstate[x] == 1:
                    _unlink(nx, pv, x)
                    sstate[x] = 2
            nstored = end
            rec0 = start
        for _attempt in range(2):  # the offer at the prefill step, repeated in the finish step if refused
            if nstored >= nk:
                break
            calls += 1
            if use_thr:
                _track(keys, nstored, nk, ttab, tmask, tkey, tcnt, tnx, tpv, tfree, tst, calls, tpm, tcount)
            nnew = 0
            for k in range(nstored, nk):
                x = pslot[k]
                if x >= 0:
                    sprot[x] = calls
                elif use_thr and tcount[k] < thr:
                    continue  # below the threshold: neither recorded nor stored
                if not prec[k]:
                    prec[k] = True
                    if x >= 0 and sstate[x] == 1:
                        _unlink(nx, pv, x)
                        sstate[x] = 2
                if x < 0:
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
                    if sprot[x] != calls:
                        cand[ns] = x
                        candk[ns] = -1
                        ns += 1
                    x = nx[x]
                k = nk - 1
                while ns < need and k >= 0:
                    x = pslot[k]
                    if x >= 0 and sstate[x] == 2 and sprot[x] != calls:
                        cand[ns] = x
                        candk[ns] = k
                        ns += 1
                    k -= 1
                if ns < need:
                    continue  # refused
                for i in range(ns):
                    x = cand[i]
                    if sstate[x] == 1:
                        _unlink(nx, pv, x)
                    sstate[x] = 0
                    _drop(skey[x], tab, mask)
                    free[nfree] = x
                    nfree += 1
                    if candk[i] >= 0:
                        pslot[candk[i]] = -1
                nres -= ns
            for k in range(nstored, nk):
                if pslot[k] < 0 and (not use_thr or tcount[k] >= thr):
                    nfree -= 1
                    x = free[nfree]
                    skey[x] = keys[k]
                    sstate[x] = 2
                    sprot[x] = calls
                    _put(keys[k], x, tab, mask)
                    pslot[k] = x
                    nres += 1
            nstored = nk
        # commit: recorded resident chunks, tail to head, appended at the MRU end
        for k in range(nk - 1, rec0 - 1, -1):
            x = pslot[k]
            if prec[k] and x >= 0:
                if sstate[x] == 1:
                    _unlink(nx, pv, x)
                _append(nx, pv, x, TL)
                sstate[x] = 1
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
    T = np.ascontiguousarray(prompt_tokens, np.int64)
    off = np.ascontiguousarray(hash_offsets, np.int64)
    h = np.asarray(hashes)
    h = np.ascontiguousarray(h.view(np.int64) if h.dtype == np.uint64 else h.astype(np.int64, copy=False))
    if off.shape != (T.shape[0] + 1,) or np.any((off[1:] - off[:-1]) < (T // tpc) * bpc):
        raise ValueError("hashes: each request needs its prompt's T // block_size block hashes")
    C, thr, maxsz = int(C), int(store_threshold), int(max_tracker_size)
    # the tracker never holds more keys than there are chunk offers: capping its size there changes nothing
    maxsz = max(0, min(maxsz, int((T // tpc).sum()) if thr >= 2 else 0))
    tab, mask = _table(C)
    ttab, tmask = _table(maxsz if thr >= 2 else 0)
    g = np.ascontiguousarray(g, np.int64)
    adm = np.ascontiguousarray(admitted, np.bool_)
    return _pass(T, off, h, np.int64(bpc), g, adm, C, np.int64(tpc), thr, tab, mask, ttab, tmask, maxsz)
