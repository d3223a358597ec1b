"""The request-level kernel of the compiled SGLang radix model (:mod:`kvhit.sim.sglang.radix`): submit,
checkpoint, finish, and the FIFO waiting queue with holds.

:func:`_radix_kernel` replays the requests of a :class:`~kvhit.sim.sglang.radix.TokenStreams` in order against
the array radix tree of :mod:`kvhit.sim.sglang.radix_tree`, transcribing ``SglangEngine.submit``/``_checkpoint``/
``finish``; with ``use_events`` a request arrives at ``times[r]``, waits FIFO, and finishes ``hold[r]`` seconds
after it starts (finish times in a min-heap keyed by (time, request)).

Invariant: ``available + tokens in the tree + tokens held by running requests outside the tree = capacity``
after every event; the outcome of every request equals the step-wise engine's.

NOT modelled here: input checks and the result type (:func:`kvhit.sim.sglang.radix.simulate_radix`), and what
:mod:`kvhit.sim.sglang.engine` does not model.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvhit.sim.sglang.radix_tree import (
    _AVAIL,
    _ERR,
    _EVICTABLE,
    _EVN,
    _EVT,
    _EVT_ALL,
    _FREE,
    _HPOS,
    _LOCK,
    _NCOL,
    _NEXT,
    _PAR,
    _PEAK,
    _alloc,
    _insert,
    _lock,
    _walk,
)


@njit(cache=True, nogil=True)
def _checkpoint(W, nd, tab, mask, heap, st, run, r, s, up_to, prompt_len, p, pol):
    """``SglangEngine._checkpoint``; ``run[r]`` = (node, protected, alloc_end, owned, inserted)."""
    key_len = up_to // p * p
    prefix, _ = _insert(W, nd, tab, mask, heap, st, s, key_len, p, pol, run[r, 4], 0)
    run[r, 4] = max(run[r, 4], key_len)
    if prompt_len >= 0:
        pk = prompt_len // p * p
        if 0 < pk and pk < key_len:
            _insert(W, nd, tab, mask, heap, st, s, pk, p, pol, pk, 1)
    st[_AVAIL] += max(0, prefix - run[r, 1])
    _, node = _walk(W, nd, tab, mask, heap, st, s, key_len, p, pol, True)
    run[r, 1] = max(run[r, 1], key_len)
    _lock(nd, heap, st, run[r, 0], -1, pol)
    _lock(nd, heap, st, node, 1, pol)
    run[r, 0] = node


@njit(cache=True, nogil=True)
def _pages(n, p):
    return (n + p - 1) // p * p


@njit(cache=True, nogil=True)
def _submit(W, nd, tab, mask, heap, st, run, r, s, T, n, p, pol):
    """``SglangEngine.submit``: the hit tokens, or -1 when the request does not fit now."""
    extra = p if p > 1 else 0
    cap = (T - 1) // p * p
    hit, node = _walk(W, nd, tab, mask, heap, st, s, cap, p, pol, True)
    _lock(nd, heap, st, node, 1, pol)
    extend = T - hit
    whole = _pages(T + n - 1, p) - hit + extra
    if whole > st[_AVAIL] + st[_EVICTABLE]:
        _lock(nd, heap, st, node, -1, pol)
        return -1
    _alloc(nd, tab, mask, heap, st, extend + extra, _pages(extend, p), pol)
    run[r, 0] = node
    run[r, 1] = hit
    run[r, 2] = hit + _pages(extend, p)
    run[r, 3] = T
    run[r, 4] = 0
    if n > 1:
        _checkpoint(W, nd, tab, mask, heap, st, run, r, s, T, -1, p, pol)
    steps = n - 1
    dem = p if p > 1 else 1
    while steps > 0 and st[_ERR] == 0:
        if st[_AVAIL] >= dem:  # no shortfall: fast-forward
            if p == 1:
                k = min(steps, st[_AVAIL])
                st[_AVAIL] -= k
                run[r, 2] += k
                run[r, 3] += k
                steps -= k
            elif run[r, 3] < run[r, 2]:
                k = min(steps, run[r, 2] - run[r, 3])
                run[r, 3] += k
                steps -= k
            else:
                st[_AVAIL] -= p
                run[r, 2] += p
                run[r, 3] += 1
                steps -= 1
            continue
        need = run[r, 3] >= run[r, 2]
        _alloc(nd, tab, mask, heap, st, dem, (p if need else 0), pol)
        if need:
            run[r, 2] += p
        run[r, 3] += 1
        steps -= 1
    return hit


@njit(cache=True, nogil=True)
def _finish(W, nd, tab, mask, heap, st, run, r, s, T, p, pol):
    _checkpoint(W, nd, tab, mask, heap, st, run, r, s, run[r, 3], T, p, pol)
    st[_AVAIL] += run[r, 2] - run[r, 1]
    _lock(nd, heap, st, run[r, 0], -1, pol)


@njit(cache=True, nogil=True)
def _try_start(W, nd, tab, mask, heap, st, run, w, stream, T, nout, p, pol, C, hit_out, evt_out, evn_out):
    st[_EVT] = 0
    st[_EVN] = 0
    h = _submit(W, nd, tab, mask, heap, st, run, w, stream[w], T[w], max(nout[w], 1), p, pol)
    if h < 0:
        return False
    hit_out[w] = h
    evt_out[w] = st[_EVT]
    evn_out[w] = st[_EVN]
    st[_EVT_ALL] += st[_EVT]
    used = C - st[_AVAIL] - st[_EVICTABLE]
    if used > st[_PEAK]:
        st[_PEAK] = used
    return True


@njit(cache=True, nogil=True)
def _radix_kernel(run_sym, run_idx, run_len, run_pos, soff, stream, T, nout, C, p, pol, times, hold, use_events):
    # live nodes <= C/p + 1 (each holds >= p tokens of the pool); nodes ever created <= 10 n + 1 (per admitted
    # request at most 8 walks/leaves create one each, and at most 2n refused admissions split once each)
    W = (run_sym, run_idx, run_len, run_pos, soff)
    n = T.shape[0]
    hit_out = np.zeros(n, np.int64)
    evt_out = np.zeros(n, np.int64)
    evn_out = np.zeros(n, np.int64)
    wait_out = np.zeros(n, np.float64)
    rej_out = np.zeros(n, np.bool_)
    st = np.zeros(11, np.int64)
    st[_AVAIL] = C
    st[_FREE] = -1
    st[_NEXT] = 1
    M = min(C // p + 2, 10 * n + 8)
    nd = np.zeros((M, _NCOL), np.int64)
    nd[0, _LOCK] = 1
    nd[0, _HPOS] = -1
    nd[0, _PAR] = -1
    cap = 16
    while cap < 2 * M:
        cap *= 2
    mask = cap - 1
    tab = np.zeros((cap, 3), np.int64)
    tab[:, 2] = -1
    heap = np.zeros(M, np.int64)
    run = np.zeros((n, 5), np.int64)
    extra = p if p > 1 else 0
    fits = np.zeros(n, np.bool_)
    for r in range(n):
        fits[r] = _pages(T[r] + max(nout[r], 1) - 1, p) + extra <= C

    if not use_events:
        for r in range(n):
            if not fits[r]:
                rej_out[r] = True
                wait_out[r] = np.nan
                continue
            ok = _try_start(W, nd, tab, mask, heap, st, run, r, stream, T, nout, p, pol, C, hit_out, evt_out, evn_out)
            if not ok:
                st[_ERR] = 3  # refused on an idle pool: cannot happen
                break
            _finish(W, nd, tab, mask, heap, st, run, r, stream[r], T[r], p, pol)
            if st[_ERR] != 0:
                break
        return hit_out, evt_out, evn_out, wait_out, rej_out, st

    ht = np.empty(n, np.float64)
    hr = np.empty(n, np.int64)
    hsize = 0
    q = np.empty(n, np.int64)
    qh = 0
    qt = 0
    r = 0
    while (r < n or hsize > 0) and st[_ERR] == 0:
        if hsize > 0 and (r >= n or ht[0] <= times[r]):
            now = ht[0]
            f = hr[0]
            hsize = _fheap_pop(ht, hr, hsize)
            _finish(W, nd, tab, mask, heap, st, run, f, stream[f], T[f], p, pol)
        else:
            now = times[r]
            if fits[r]:
                q[qt] = r
                qt += 1
            else:
                rej_out[r] = True
                wait_out[r] = np.nan
            r += 1
        while qh < qt:
            w = q[qh]
            ok = _try_start(W, nd, tab, mask, heap, st, run, w, stream, T, nout, p, pol, C, hit_out, evt_out, evn_out)
            if not ok:
                break
            qh += 1
            wait_out[w] = now - times[w]
            hsize = _fheap_push(ht, hr, hsize, now + hold[w], w)
    return hit_out, evt_out, evn_out, wait_out, rej_out, st


@njit(cache=True, nogil=True)
def _fheap_push(ht, hr, size, t, r):
    i = size
    ht[i] = t
    hr[i] = r
    while i > 0:
        q = (i - 1) >> 1
        if ht[q] < ht[i] or (ht[q] == ht[i] and hr[q] < hr[i]):
            break
        ht[q], ht[i] = ht[i], ht[q]
        hr[q], hr[i] = hr[i], hr[q]
        i = q
    return size + 1


@njit(cache=True, nogil=True)
def _fheap_pop(ht, hr, size):
    size -= 1
    ht[0] = ht[size]
    hr[0] = hr[size]
    i = 0
    while True:
        a = 2 * i + 1
        if a >= size:
            break
        m = a
        if a + 1 < size and (ht[a + 1] < ht[a] or (ht[a + 1] == ht[a] and hr[a + 1] < hr[a])):
            m = a + 1
        if ht[i] < ht[m] or (ht[i] == ht[m] and hr[i] < hr[m]):
            break
        ht[m], ht[i] = ht[i], ht[m]
        hr[m], hr[i] = hr[i], hr[m]
        i = m
    return size
