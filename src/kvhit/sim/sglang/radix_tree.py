"""The SGLang radix tree in arrays, for the compiled radix model (:mod:`kvhit.sim.sglang.radix`).

The radix tree lives in arrays: a node's key is a slice ``(stream, position, length)`` of the stream that
inserted it (streams never change, so splits are slice arithmetic); children are found through one hash
table keyed by ``(parent, hash of the child's first page)``, every candidate verified token by token (a hash
collision cannot change a decision); the unlocked leaves sit in an indexed min-heap on the eviction
priority, a pair (``lru``: last access; ``fifo``: creation; ``mru``/``filo``: their negatives; ``lfu``: hit
count; ``slru``: hit count ≥ 2; ``priority``: node priority; ``tlru``: −1 when TEL-safe, else 0 — each then the
last access, which is distinct among leaves since one logical clock stamps every match/insert/split/new node
exactly as the step-wise model does), so the heap order is the order SGLang's per-call heap pops; a node whose
key changes (access, hit count, priority, a split shortening it) is re-sifted. The cache class (``unified``:
a split keeps the creation time) and T-LRU's budget travel packed with the policy code.
Per multi-turn conversation the tree is a chain
(prompt node, output leaf, next prompt's new part, …) hanging off the root or off a shared prefix (system
prompt, chat template, duplicated content), split where a later request diverges.

Here: the node and state layout (``_PAR``…, ``_CLOCK``…), token-run comparison and first-page hashes, the child
hash table, the indexed eviction heap, and the tree operations transcribed from
:class:`~kvhit.sim.sglang.engine.SglangEngine` (match/insert walks, splits, locks, eviction, allocation).

Invariant: the heap holds the unlocked leaves, ordered as SGLang's per-call heap pops them; a child is found only
after a token-by-token check (a hash collision cannot change a decision).

NOT modelled here: requests (admission, holds, the waiting queue: :mod:`kvhit.sim.sglang.radix_kernel`) and
anything :mod:`kvhit.sim.sglang.engine` does not model.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvhit.workload.hashing import fmix64

# node columns
_PAR, _KS, _KP, _KL, _LOCK, _T, _CT, _NCH, _HPOS, _NH, _HIT, _PRI, _DEP, _HIST = range(14)
_NCOL = 14
# state scalars
_CLOCK, _AVAIL, _EVICTABLE, _HSIZE, _FREE, _NEXT, _ERR, _EVT, _EVN, _EVT_ALL, _PEAK = range(11)


# --------------------------------------------------------------------------------------------------
# token runs
# --------------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _locate(W, s, pos):
    """Index of the run of stream ``s`` that holds position ``pos``."""
    run_pos, soff = W[3], W[4]
    lo = soff[s]
    hi = soff[s + 1] - 1
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if run_pos[mid] <= pos:
            lo = mid
        else:
            hi = mid - 1
    return lo


@njit(cache=True, nogil=True)
def _ncommon(W, s1, a1, s2, a2, L):
    """Equal leading tokens of ``stream s1 [a1, a1+L)`` and ``stream s2 [a2, a2+L)`` (both must exist)."""
    if L <= 0:
        return 0
    if s1 == s2 and a1 == a2:
        return L
    sym, idx, ln, run_pos = W[0], W[1], W[2], W[3]
    i = _locate(W, s1, a1)
    j = _locate(W, s2, a2)
    o1 = a1 - run_pos[i]
    o2 = a2 - run_pos[j]
    k = 0
    while k < L:
        if sym[i] != sym[j] or idx[i] + o1 != idx[j] + o2:
            break
        step = min(ln[i] - o1, ln[j] - o2, L - k)
        k += step
        o1 += step
        o2 += step
        if o1 == ln[i]:
            i += 1
            o1 = 0
        if o2 == ln[j]:
            j += 1
            o2 = 0
    return k


@njit(cache=True, nogil=True)
def _phash(W, s, pos, p):
    """Hash of the ``p`` tokens of stream ``s`` from ``pos`` (a child key; verified on every use)."""
    sym, idx, ln, run_pos = W[0], W[1], W[2], W[3]
    i = _locate(W, s, pos)
    o = pos - run_pos[i]
    h = np.uint64(0x9E3779B97F4A7C15)
    c = 0
    while c < p:
        step = min(ln[i] - o, p - c)
        for q in range(step):
            tok = fmix64(np.uint64(sym[i]) ^ np.uint64(0x51ED27A3)) + np.uint64(idx[i] + o + q)
            h = fmix64(h ^ tok)
        c += step
        i += 1
        o = 0
    return np.int64(h & np.uint64(0x7FFFFFFFFFFFFFFF))


# --------------------------------------------------------------------------------------------------
# child table: open addressing on (parent, page hash), linear probing, backward-shift deletion
# --------------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _home(par, h, mask):
    return np.int64(fmix64(np.uint64(h) ^ fmix64(np.uint64(par + 1))) & np.uint64(mask))


@njit(cache=True, nogil=True)
def _find_child(W, nd, tab, mask, node, h, s, pos, p):
    i = _home(node, h, mask)
    while tab[i, 2] != -1:
        if tab[i, 0] == node and tab[i, 1] == h:
            c = tab[i, 2]
            if _ncommon(W, nd[c, _KS], nd[c, _KP], s, pos, p) == p:
                return c
        i = (i + 1) & mask
    return -1


@njit(cache=True, nogil=True)
def _tab_slot(tab, mask, par, h, child):
    i = _home(par, h, mask)
    while tab[i, 2] != child:
        i = (i + 1) & mask
    return i


@njit(cache=True, nogil=True)
def _tab_insert(tab, mask, par, h, child):
    i = _home(par, h, mask)
    while tab[i, 2] != -1:
        i = (i + 1) & mask
    tab[i, 0] = par
    tab[i, 1] = h
    tab[i, 2] = child


@njit(cache=True, nogil=True)
def _tab_delete(tab, mask, i):
    j = i
    while True:
        j = (j + 1) & mask
        if tab[j, 2] == -1:
            break
        k = _home(tab[j, 0], tab[j, 1], mask)
        if i <= j:
            stay = i < k and k <= j
        else:
            stay = i < k or k <= j
        if stay:
            continue
        tab[i, 0] = tab[j, 0]
        tab[i, 1] = tab[j, 1]
        tab[i, 2] = tab[j, 2]
        i = j
    tab[i, 2] = -1


# --------------------------------------------------------------------------------------------------
# eviction heap (indexed min-heap of unlocked leaves on the policy's priority)
# --------------------------------------------------------------------------------------------------


# ``pol`` packs the policy (bits 0-2), the cache class (bit 3: 1 = unified) and T-LRU's tail budget (bits 4+)


@njit(cache=True, nogil=True, inline="always")
def _prio(nd, x, pol):
    """(primary key, secondary key) of ``evict_policy.py``'s ``get_priority``; ties fall to the last access."""
    k = pol & 7
    t = nd[x, _T]
    if k == 0:
        return (t, t)
    if k == 1:
        return (nd[x, _CT], t)
    if k == 2:
        return (-t, t)
    if k == 3:
        return (-nd[x, _CT], t)
    if k == 4:
        return (nd[x, _HIT], t)
    if k == 5:
        return (np.int64(1) if nd[x, _HIT] >= 2 else np.int64(0), t)
    if k == 6:
        return (nd[x, _PRI], t)
    safe = nd[x, _DEP] - nd[x, _KL] >= max(nd[x, _HIST] - (pol >> 4), 0)
    return (np.int64(-1) if safe else np.int64(0), t)


@njit(cache=True, nogil=True, inline="always")
def _le(a, b):
    return a[0] < b[0] or (a[0] == b[0] and a[1] <= b[1])


@njit(cache=True, nogil=True, inline="always")
def _lt(a, b):
    return a[0] < b[0] or (a[0] == b[0] and a[1] < b[1])


@njit(cache=True, nogil=True)
def _sift_up(nd, heap, i, pol):
    x = heap[i]
    px = _prio(nd, x, pol)
    while i > 0:
        q = (i - 1) >> 1
        y = heap[q]
        if _le(_prio(nd, y, pol), px):
            break
        heap[i] = y
        nd[y, _HPOS] = i
        i = q
    heap[i] = x
    nd[x, _HPOS] = i


@njit(cache=True, nogil=True)
def _sift_down(nd, heap, i, size, pol):
    x = heap[i]
    px = _prio(nd, x, pol)
    while True:
        a = 2 * i + 1
        if a >= size:
            break
        m = a
        pm = _prio(nd, heap[a], pol)
        if a + 1 < size:
            pb = _prio(nd, heap[a + 1], pol)
            if _lt(pb, pm):
                m = a + 1
                pm = pb
        if _le(px, pm):
            break
        heap[i] = heap[m]
        nd[heap[i], _HPOS] = i
        i = m
    heap[i] = x
    nd[x, _HPOS] = i


@njit(cache=True, nogil=True)
def _heap_add(nd, heap, st, x, pol):
    if nd[x, _HPOS] >= 0:
        return
    i = st[_HSIZE]
    st[_HSIZE] = i + 1
    heap[i] = x
    nd[x, _HPOS] = i
    _sift_up(nd, heap, i, pol)


@njit(cache=True, nogil=True)
def _heap_remove(nd, heap, st, x, pol):
    i = nd[x, _HPOS]
    if i < 0:
        return
    nd[x, _HPOS] = -1
    size = st[_HSIZE] - 1
    st[_HSIZE] = size
    if i == size:
        return
    y = heap[size]
    heap[i] = y
    nd[y, _HPOS] = i
    _sift_up(nd, heap, i, pol)
    _sift_down(nd, heap, nd[y, _HPOS], size, pol)


@njit(cache=True, nogil=True)
def _fix(nd, heap, st, x, pol):
    """Restore the heap after a key of ``x`` changed."""
    if nd[x, _HPOS] >= 0:
        _sift_up(nd, heap, nd[x, _HPOS], pol)
        _sift_down(nd, heap, nd[x, _HPOS], st[_HSIZE], pol)


@njit(cache=True, nogil=True)
def _stamp(nd, heap, st, x, now, pol):
    nd[x, _T] = now
    _fix(nd, heap, st, x, pol)


# --------------------------------------------------------------------------------------------------
# tree operations (transcribed from SglangEngine: same ticks, same splits, same locks)
# --------------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _new_node(nd, st, par, ks, kp, kl, lock):
    x = st[_FREE]
    if x >= 0:
        st[_FREE] = nd[x, _PAR]
    else:
        x = st[_NEXT]
        if x >= nd.shape[0]:
            st[_ERR] = 2
            return 0
        st[_NEXT] = x + 1
    st[_CLOCK] += 1
    nd[x, _PAR] = par
    nd[x, _KS] = ks
    nd[x, _KP] = kp
    nd[x, _KL] = kl
    nd[x, _LOCK] = lock
    nd[x, _T] = st[_CLOCK]
    nd[x, _CT] = st[_CLOCK]
    nd[x, _NCH] = 0
    nd[x, _HPOS] = -1
    nd[x, _NH] = 0
    nd[x, _HIT] = 0
    nd[x, _PRI] = 0
    nd[x, _DEP] = 0
    nd[x, _HIST] = 0
    return x


@njit(cache=True, nogil=True)
def _split(W, nd, tab, mask, heap, st, child, at, p, pol):
    par = nd[child, _PAR]
    new = _new_node(nd, st, par, nd[child, _KS], nd[child, _KP], at, nd[child, _LOCK])
    nd[new, _HIT] = nd[child, _HIT]
    nd[new, _PRI] = nd[child, _PRI]
    if (pol >> 3) & 1:  # UnifiedRadixCache: the upper part keeps the creation time
        nd[new, _CT] = nd[child, _CT]
    if pol & 7 == 7:
        nd[new, _DEP] = nd[par, _DEP] + at
        nd[new, _HIST] = nd[child, _HIST]
    h_old = nd[child, _NH]
    tab[_tab_slot(tab, mask, par, h_old, child), 2] = new
    nd[new, _NH] = h_old
    nd[child, _KP] += at
    nd[child, _KL] -= at
    nd[child, _PAR] = new
    h_new = _phash(W, nd[child, _KS], nd[child, _KP], p)
    nd[child, _NH] = h_new
    _tab_insert(tab, mask, new, h_new, child)
    nd[new, _NCH] = 1
    _fix(nd, heap, st, child, pol)  # its key got shorter (T-LRU reads the length)
    return new


@njit(cache=True, nogil=True)
def _walk(W, nd, tab, mask, heap, st, s, keylen, p, pol, is_match, inserted=0, pri=0):
    """``_match_prefix_helper`` (stop at the first split) or ``_insert_helper``'s walk: (tokens, node); an
    insert raises each walked node's priority to ``pri`` and counts a hit on it if it ends past ``inserted``."""
    st[_CLOCK] += 1
    now = st[_CLOCK]
    node = 0
    nd[0, _T] = now
    if not is_match and nd[0, _PRI] < pri:
        nd[0, _PRI] = pri
    off = 0
    while off < keylen:
        h = _phash(W, s, off, p)
        child = _find_child(W, nd, tab, mask, node, h, s, off, p)
        if child < 0:
            break
        _stamp(nd, heap, st, child, now, pol)
        kl = nd[child, _KL]
        k = _ncommon(W, nd[child, _KS], nd[child, _KP], s, off, min(kl, keylen - off)) // p * p
        if k < kl:
            node = _split(W, nd, tab, mask, heap, st, child, k, p, pol)
            off += k
            if is_match:
                break
        else:
            node = child
            off += k
        if not is_match:
            k7 = pol & 7
            if nd[node, _PRI] < pri:
                nd[node, _PRI] = pri
                if k7 == 6:
                    _fix(nd, heap, st, node, pol)
            if off > inserted:
                nd[node, _HIT] += 1
                if k7 == 4 or k7 == 5:
                    _fix(nd, heap, st, node, pol)
    return off, node


@njit(cache=True, nogil=True)
def _insert(W, nd, tab, mask, heap, st, s, keylen, p, pol, inserted, pri):
    off, node = _walk(W, nd, tab, mask, heap, st, s, keylen, p, pol, False, inserted, pri)
    prefix = off
    if off < keylen:
        leaf = _new_node(nd, st, node, s, off, keylen - off, 0)
        nd[leaf, _PRI] = pri
        if keylen > inserted:
            nd[leaf, _HIT] = 1
        _heap_remove(nd, heap, st, node, pol)  # before its keys change
        if pol & 7 == 7:  # _set_tlru_lens_and_raise_history
            d = nd[node, _DEP] + keylen - off
            nd[leaf, _DEP] = d
            nd[leaf, _HIST] = d
            a = node
            while a >= 0 and nd[a, _HIST] < d:
                nd[a, _HIST] = d
                a = nd[a, _PAR]
        h = _phash(W, s, off, p)
        nd[leaf, _NH] = h
        _tab_insert(tab, mask, node, h, leaf)
        nd[node, _NCH] += 1
        _heap_remove(nd, heap, st, node, pol)
        st[_EVICTABLE] += keylen - off
        _heap_add(nd, heap, st, leaf, pol)
        node = leaf
    return prefix, node


@njit(cache=True, nogil=True)
def _lock(nd, heap, st, node, d, pol):
    while node != 0:
        if d > 0:
            if nd[node, _LOCK] == 0:
                st[_EVICTABLE] -= nd[node, _KL]
                _heap_remove(nd, heap, st, node, pol)
            nd[node, _LOCK] += 1
        else:
            nd[node, _LOCK] -= 1
            if nd[node, _LOCK] == 0:
                st[_EVICTABLE] += nd[node, _KL]
                if nd[node, _NCH] == 0:
                    _heap_add(nd, heap, st, node, pol)
        node = nd[node, _PAR]


@njit(cache=True, nogil=True)
def _evict(nd, tab, mask, heap, st, num, pol):
    done = 0
    while done < num and st[_HSIZE] > 0:
        x = heap[0]
        _heap_remove(nd, heap, st, x, pol)
        kl = nd[x, _KL]
        done += kl
        st[_AVAIL] += kl
        st[_EVICTABLE] -= kl
        st[_EVT] += kl
        st[_EVN] += 1
        par = nd[x, _PAR]
        _tab_delete(tab, mask, _tab_slot(tab, mask, par, nd[x, _NH], x))
        nd[par, _NCH] -= 1
        nd[x, _PAR] = st[_FREE]  # free list
        st[_FREE] = x
        if par != 0 and nd[par, _NCH] == 0 and nd[par, _LOCK] == 0:
            _heap_add(nd, heap, st, par, pol)


@njit(cache=True, nogil=True)
def _alloc(nd, tab, mask, heap, st, demand, tokens, pol):
    short = demand - st[_AVAIL]
    if short > 0:
        _evict(nd, tab, mask, heap, st, short, pol)
    if tokens > st[_AVAIL]:
        st[_ERR] = 1
        return
    st[_AVAIL] -= tokens
