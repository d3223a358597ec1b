"""Compiled (numba) host pass of the vLLM 0.33.0 native tier: LRU, no store threshold, prompt only, sequential.

Invariant: :func:`native_lru_host_pass` returns, request by request, the tokens
:func:`kvhit.sim.tiers.surface.host_pass` returns for ``tier="native"`` with ``policy="lru"``,
``store_threshold`` 0 or 1 and ``prompt_only=True`` (tested equal in ``tests/test_tiers_fast.py``). It is the same
state machine as :class:`~kvhit.sim.tiers.native.NativeCpuTier` over
:class:`~kvhit.sim.tiers.native.CpuOffloadManager` / :class:`~kvhit.sim.tiers.native.LruPolicy` (read that module's
docstring for what is mirrored from vLLM's ``OffloadingConnectorScheduler`` and ``CPUOffloadingManager``),
specialised to one request at a time, where each request's life reduces to:

1. lookup of consecutive resident chunks from chunk ``⌊g/tpc⌋`` (no ``T - 1`` cap; a hit under one chunk is 0);
2. on a load, the loaded chunks are recorded as accesses (provisional rank ``(r, -position)``, raised only);
3. the offer of the chunks from the stored index to ``⌊T/tpc⌋`` (all from 0 without a load): resident ones are
   recorded (rank raised), new ones inserted with the provisional rank after evicting the smallest ranks that are
   not offered — all or nothing; a refused offer is repeated once in the step after the finish;
4. the commit: every recorded resident chunk gets a fresh committed rank, tail to head (head most recent).

Ranks ``(a, b)`` are packed in one int64 as ``a·2³³ + 2³² + b`` (``b = -position`` or 0), which keeps their order;
keys are the chunks' last block hashes mapped to dense ids. Not covered (use the Python tier): ARC, a store
threshold of 2 or more, decode chunks, concurrency (``hold``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["native_lru_host_pass"]

_A = np.int64(1) << np.int64(33)
_B0 = np.int64(1) << np.int64(32)


@njit(cache=True, inline="always")
def _push(hr, hk, hn, r, k):
    i = hn
    hr[i] = r
    hk[i] = k
    while i > 0:
        p = (i - 1) >> 1
        if hr[p] <= hr[i]:
            break
        hr[p], hr[i] = hr[i], hr[p]
        hk[p], hk[i] = hk[i], hk[p]
        i = p
    return hn + 1


@njit(cache=True, inline="always")
def _pop(hr, hk, hn):
    r = hr[0]
    k = hk[0]
    hn -= 1
    hr[0] = hr[hn]
    hk[0] = hk[hn]
    i = 0
    while True:
        lft = 2 * i + 1
        if lft >= hn:
            break
        m = lft
        if lft + 1 < hn and hr[lft + 1] < hr[lft]:
            m = lft + 1
        if hr[i] <= hr[m]:
            break
        hr[m], hr[i] = hr[i], hr[m]
        hk[m], hk[i] = hk[i], hk[m]
        i = m
    return r, k, hn


@njit(cache=True)
def _compact(hr, hk, hn, rank, mark, stamp):
    """Drop stale entries (and duplicates of a key) and re-heapify; returns the new size."""
    m = 0
    for i in range(hn):
        k = hk[i]
        if rank[k] == hr[i] and mark[k] != stamp:
            mark[k] = stamp
            hr[m] = hr[i]
            hk[m] = k
            m += 1
    n = 0
    for i in range(m):
        n = _push(hr, hk, n, hr[i], hk[i])
    return n


@njit(cache=True)
def _add(hr, hk, hn, v, key, rank, mark, stamp):
    """Push (v, key); a full heap is first compacted, and doubled if still over half full."""
    if hn == hr.shape[0]:
        hn = _compact(hr, hk, hn, rank, mark, stamp)
        if hn > hr.shape[0] // 2:
            hr2 = np.empty(2 * hr.shape[0], np.int64)
            hk2 = np.empty(2 * hr.shape[0], np.int64)
            hr2[:hn] = hr[:hn]
            hk2[:hn] = hk[:hn]
            hr, hk = hr2, hk2
    hn = _push(hr, hk, hn, v, key)
    return hr, hk, hn


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


@njit(cache=True)
def _pass(T, koff, kid, g, adm, C, tpc, nkeys, thr, maxsz):
    n = T.shape[0]
    out = np.zeros(n, np.int64)
    rank = np.full(nkeys, -1, np.int64)  # -1: not resident
    nres = 0
    hr = np.empty(64, np.int64)
    hk = np.empty(64, np.int64)
    hn = 0
    nxt = 0
    seen = np.full(nkeys, -1, np.int64)  # request that recorded the key
    prot = np.full(nkeys, -1, np.int64)  # offer call that protects the key
    mark = np.full(nkeys, -1, np.int64)  # scratch stamps (chosen in an eviction, kept in a compaction)
    stamp = 0
    calls = 0
    popped_r = np.empty(16, np.int64)
    popped_k = np.empty(16, np.int64)
    use_thr = thr >= 2  # the offer tracker exists only for a store threshold of 2 or more
    cnt = np.zeros(nkeys if use_thr else 0, np.int64)  # offers counted per key (0: not tracked)
    TH = nkeys
    TT = nkeys + 1
    tnx = np.empty(nkeys + 2 if use_thr else 0, np.int64)
    tpv = np.empty(nkeys + 2 if use_thr else 0, np.int64)
    pmark = np.full(nkeys if use_thr else 0, -1, np.int64)
    if use_thr:
        tnx[TH] = TT
        tpv[TT] = TH
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
                if rank[kid[k0 + k]] < 0:
                    break
                hits += 1
            c = min(max_hit, tpc * (s + hits)) - gr
            if c < tpc:
                c = 0
        out[r] = c
        rr = np.int64(-1)  # the request's rank (drawn at its first recorded access)
        nstored = 0
        rec0 = 0
        if c > 0:
            start = gr // tpc
            end = -(-(gr + c) // tpc)
            nxt += 1
            rr = nxt
            for k in range(start, end):
                key = kid[k0 + k]
                seen[key] = r
                v = rr * _A + _B0 - (k + 1) * tpc
                if rank[key] >= 0 and rank[key] < v:
                    rank[key] = v
                    stamp += 1
                    hr, hk, hn = _add(hr, hk, hn, v, key, rank, mark, stamp)
            nstored = end
            rec0 = start
        for _attempt in range(2):  # the offer at the prefill step, repeated in the finish step if refused
            if nstored >= nk:
                break
            calls += 1
            if use_thr:
                tsize = _track(k0, nstored, nk, kid, cnt, tnx, tpv, tsize, maxsz, pmark, calls, TH, TT)
            first = False
            nnew = 0
            for k in range(nstored, nk):
                key = kid[k0 + k]
                prot[key] = calls
                if use_thr and rank[key] < 0 and cnt[key] < thr:
                    continue  # below the threshold: neither recorded nor stored (still protected)
                if seen[key] != r:
                    seen[key] = r
                    first = True
                    if rank[key] >= 0:
                        if rr < 0:
                            nxt += 1
                            rr = nxt
                        v = rr * _A + _B0 - (k + 1) * tpc
                        if rank[key] < v:
                            rank[key] = v
                            stamp += 1
                            hr, hk, hn = _add(hr, hk, hn, v, key, rank, mark, stamp)
                if rank[key] < 0:
                    nnew += 1
            if first and rr < 0:
                nxt += 1
                rr = nxt
            if nnew == 0:
                nstored = nk
                continue
            need = nnew - (C - nres)
            if need > 0:
                if need > nres:
                    continue  # refused: nothing stored, the stored index stays
                # evict the `need` smallest ranks that are not offered (all or nothing)
                if popped_r.shape[0] < hn:
                    popped_r = np.empty(2 * hn, np.int64)
                    popped_k = np.empty(2 * hn, np.int64)
                npop = 0
                nsel = 0
                stamp += 1
                while hn > 0 and nsel < need:
                    v, key, hn = _pop(hr, hk, hn)
                    if rank[key] != v or mark[key] == stamp:
                        continue  # stale or already chosen
                    popped_r[npop] = v
                    popped_k[npop] = key
                    npop += 1
                    if prot[key] == calls:
                        continue
                    mark[key] = stamp
                    nsel += 1
                if nsel < need:
                    for i in range(npop):
                        hn = _push(hr, hk, hn, popped_r[i], popped_k[i])
                    continue  # refused
                for i in range(npop):
                    key = popped_k[i]
                    if prot[key] == calls:
                        hn = _push(hr, hk, hn, popped_r[i], key)
                    else:
                        rank[key] = -1
                        nres -= 1
            for k in range(nstored, nk):
                key = kid[k0 + k]
                if rank[key] < 0 and (not use_thr or cnt[key] >= thr):
                    v = rr * _A + _B0 - (k + 1) * tpc
                    rank[key] = v
                    nres += 1
                    stamp += 1
                    hr, hk, hn = _add(hr, hk, hn, v, key, rank, mark, stamp)
            nstored = nk
        # commit: recorded resident chunks, tail to head, fresh committed ranks
        for k in range(nk - 1, rec0 - 1, -1):
            key = kid[k0 + k]
            if seen[key] == r and rank[key] >= 0:
                nxt += 1
                v = nxt * _A + _B0
                rank[key] = v
                stamp += 1
                hr, hk, hn = _add(hr, hk, hn, v, key, rank, mark, stamp)
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
    T = np.asarray(prompt_tokens, np.int64)
    off = np.asarray(hash_offsets, np.int64)
    h = np.asarray(hashes)
    h = h.view(np.int64) if h.dtype == np.uint64 else h.astype(np.int64)
    b, bpc = int(block_size), int(bpc)
    tpc = b * bpc
    nk = T // tpc  # prompt-only chunk keys (PD: a request has T // b block hashes)
    if np.any((off[1:] - off[:-1]) < nk * bpc):
        raise ValueError("hashes: each request needs its prompt's T // block_size block hashes")
    koff = np.zeros(len(T) + 1, np.int64)
    koff[1:] = np.cumsum(nk)
    idx = np.repeat(off[:-1], nk) + (np.arange(koff[-1]) - np.repeat(koff[:-1], nk) + 1) * bpc - 1
    keys = h[idx]
    uniq, kid = np.unique(keys, return_inverse=True)
    return _pass(
        T,
        koff,
        kid.astype(np.int64),
        np.asarray(g, np.int64),
        np.asarray(admitted, np.bool_),
        int(C),
        np.int64(tpc),
        len(uniq),
        int(store_threshold),
        int(max_tracker_size),
    )
