"""Compiled fast path of the SGLang radix-cache model (:class:`kvhit.sim.sglang.engine.SglangEngine`).

Same model, same decisions, request by request — hit tokens, evicted tokens and nodes, waits, rejections —
as the step-wise :class:`~kvhit.sim.sglang.engine.SglangEngine` driven by :func:`kvhit.sim.engine.replay`
(read their docstrings for what SGLang 0.5.23 does and what is not modelled); tested equal on random
workloads (``tests/test_radix.py``) and timed in ``benchmarks/bench_radix.py``.

Workload representation (:class:`TokenStreams`). A multi-turn workload's token sequences are prefixes of a
few long *streams*: request ``j`` of a conversation is the first ``T_j`` tokens of the conversation's stream
(history + new turn), and its ``n_j`` output tokens are the stream's next tokens (the next turn's prompt
starts with them). A stream is a list of *runs*; run ``(sym, idx, len)`` stands for the tokens ``(sym, idx),
(sym, idx + 1), …, (sym, idx + len − 1)`` — a token is equal to another exactly when both components are.
Real token ids are runs of length 1; a synthetic conversation is one run; a production block-id trace gives
one ``b``-token run per block id. Two sequences are compared run by run, so matching costs
``O(runs)``, not ``O(tokens)``.

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

Invariant: ``available + tokens in the tree + tokens held by running requests outside the tree =
capacity`` after every event; the outcome of every request equals the step-wise engine's.
NOT modelled: what :mod:`kvhit.sim.sglang.engine` does not model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from kvhit.workload.hashing import fmix64

__all__ = ["CACHES", "POLICIES", "RadixResult", "TokenStreams", "simulate_radix"]

#: eviction policies modelled (code passed to the kernel, with the cache class and T-LRU's tail budget)
POLICIES = {"lru": 0, "fifo": 1, "mru": 2, "filo": 3, "lfu": 4, "slru": 5, "priority": 6, "tlru": 7}
#: cache classes: UnifiedRadixCache (default; a split's upper node keeps the creation time) and RadixCache
CACHES = ("unified", "radix")

# node columns
_PAR, _KS, _KP, _KL, _LOCK, _T, _CT, _NCH, _HPOS, _NH, _HIT, _PRI, _DEP, _HIST = range(14)
_NCOL = 14
# state scalars
_CLOCK, _AVAIL, _EVICTABLE, _HSIZE, _FREE, _NEXT, _ERR, _EVT, _EVN, _EVT_ALL, _PEAK = range(11)


@dataclass(frozen=True)
class TokenStreams:
    """Requests as prefixes of token streams (see the module docstring).

    Runs: ``run_sym``, ``run_idx``, ``run_len`` (int64); stream ``s`` owns runs ``stream_off[s] ..
    stream_off[s+1]``. Request ``r`` reads stream ``stream[r]``: its prompt is the first ``prompt_tokens[r]``
    tokens, its output the next ``output_tokens[r]`` (the model needs ``T + max(n, 1) − 1`` of them).
    ``source`` says where the token identities came from.
    """

    run_sym: np.ndarray
    run_idx: np.ndarray
    run_len: np.ndarray
    stream_off: np.ndarray
    stream: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str = "runs"

    def __post_init__(self) -> None:
        for name in ("run_sym", "run_idx", "run_len", "stream_off", "stream", "prompt_tokens", "output_tokens"):
            a = np.ascontiguousarray(getattr(self, name), dtype=np.int64)
            if a.ndim != 1:
                raise ValueError(f"{name}: expected a 1-d array")
            object.__setattr__(self, name, a)
        R = self.run_sym.shape[0]
        if self.run_idx.shape[0] != R or self.run_len.shape[0] != R:
            raise ValueError("run_sym, run_idx, run_len: expected equal lengths")
        if R and self.run_len.min() < 1:
            raise ValueError("run_len: every run needs at least one token")
        so = self.stream_off
        if so.shape[0] < 1 or so[0] != 0 or so[-1] != R or (np.diff(so) < 0).any():
            raise ValueError("stream_off: expected a CSR offset array from 0 to the number of runs")
        n = self.stream.shape[0]
        if self.prompt_tokens.shape[0] != n or self.output_tokens.shape[0] != n:
            raise ValueError("stream, prompt_tokens, output_tokens: expected equal lengths")
        if n:
            if self.stream.min() < 0 or self.stream.max() >= so.shape[0] - 1:
                raise ValueError("stream: index out of range")
            if self.prompt_tokens.min() < 1:
                raise ValueError("prompt_tokens: every request needs at least one prompt token")
            if self.output_tokens.min() < 0:
                raise ValueError("output_tokens: expected ≥ 0")
            need = self.prompt_tokens + np.maximum(self.output_tokens, 1) - 1
            have = self.stream_lengths()[self.stream]
            bad = np.flatnonzero(need > have)
            if bad.size:
                r = int(bad[0])
                raise ValueError(
                    f"request {r}: needs {int(need[r])} tokens of stream {int(self.stream[r])}, "
                    f"which has {int(have[r])}"
                )

    @property
    def n_requests(self) -> int:
        return int(self.stream.shape[0])

    def stream_lengths(self) -> np.ndarray:
        cs = np.concatenate([[0], np.cumsum(self.run_len)])
        return cs[self.stream_off[1:]] - cs[self.stream_off[:-1]]

    def tokens(self, r: int) -> tuple:
        """Request ``r``'s ``T + max(n, 1) − 1`` tokens as ``(sym, idx)`` pairs (for the step-wise engine)."""
        need = int(self.prompt_tokens[r] + max(int(self.output_tokens[r]), 1) - 1)
        s = int(self.stream[r])
        out: list = []
        for i in range(int(self.stream_off[s]), int(self.stream_off[s + 1])):
            sym, idx, ln = int(self.run_sym[i]), int(self.run_idx[i]), int(self.run_len[i])
            out.extend((sym, idx + k) for k in range(min(ln, need - len(out))))
            if len(out) >= need:
                break
        return tuple(out)

    def to_requests(self) -> list:
        """The workload as :class:`kvhit.sim.engine.Request` objects (``token_ids`` = :meth:`tokens`)."""
        from kvhit.sim.engine import Request

        return [
            Request(
                rid=r,
                prompt_tokens=int(self.prompt_tokens[r]),
                output_tokens=int(self.output_tokens[r]),
                token_ids=self.tokens(r),
            )
            for r in range(self.n_requests)
        ]


@dataclass(frozen=True)
class RadixResult:
    """Per request (input order): ``hit_tokens``, ``evicted_tokens`` / ``evicted_nodes`` (by its admission,
    counting its decode steps), ``wait`` (NaN if rejected), ``rejected``; and totals."""

    hit_tokens: np.ndarray
    evicted_tokens: np.ndarray
    evicted_nodes: np.ndarray
    wait: np.ndarray
    rejected: np.ndarray
    prompt_tokens: np.ndarray
    capacity: int
    page_size: int
    evict_policy: str
    peak_in_use: int  #: max slots held by running requests or locked nodes, after an admission
    evictions: int  #: tokens evicted in all
    cache: str = "unified"  #: SGLang cache class modelled (``unified`` or ``radix``)

    @property
    def n_rejected(self) -> int:
        return int(self.rejected.sum())

    def token_hit_ratio(self, mask=None) -> float:
        """SGLang's ``cached_tokens / prompt_tokens`` summed over the (measured) requests; rejected requests
        count as misses of their whole prompt."""
        m = np.ones(self.hit_tokens.shape[0], bool) if mask is None else np.asarray(mask, bool)
        T = self.prompt_tokens[m].sum()
        return float(self.hit_tokens[m].sum() / T) if T else float("nan")

    def request_hit_rate(self, mask=None) -> float:
        m = np.ones(self.hit_tokens.shape[0], bool) if mask is None else np.asarray(mask, bool)
        return float((self.hit_tokens[m] > 0).mean()) if m.any() else float("nan")


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


# --------------------------------------------------------------------------------------------------
# Python wrapper
# --------------------------------------------------------------------------------------------------


def simulate_radix(
    ts: TokenStreams,
    capacity: int,
    *,
    page_size: int = 1,
    evict_policy: str = "lru",
    times=None,
    hold=None,
    cache: str = "unified",
    tlru_tail_budget: int = 0,
) -> RadixResult:
    """Run the SGLang radix-cache model over ``ts`` with a KV pool of ``capacity`` tokens.

    ``cache``, ``tlru_tail_budget``: as :class:`~kvhit.sim.sglang.engine.SglangEngine` (``unified`` by default;
    ``radix`` differs only for ``fifo``/``filo``).

    Timing as :func:`kvhit.sim.engine.replay` (and :func:`kvhit.sim.vllm.block.simulate_block`): without ``hold``
    each request runs alone (admitted, decoded and finished at once); with ``hold`` request ``r`` arrives at
    ``times[r]``, waits FIFO, and finishes ``hold[r]`` seconds after it starts.
    """
    p = page_size
    if isinstance(p, bool) or not isinstance(p, int | np.integer) or p < 1:
        raise ValueError(f"page_size: expected a positive integer, got {page_size!r}")
    if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer) or capacity < p or capacity % p:
        raise ValueError(f"capacity: expected a positive multiple of page_size ({p}) tokens, got {capacity!r}")
    if evict_policy not in POLICIES:
        raise ValueError(f"evict_policy: expected one of {sorted(POLICIES)}, got {evict_policy!r}")
    if cache not in CACHES:
        raise ValueError(f"cache: expected one of {list(CACHES)}, got {cache!r}")
    if evict_policy == "tlru" and cache != "unified":
        raise ValueError("evict_policy='tlru' needs cache='unified' (SGLang refuses T-LRU on RadixCache)")
    B = tlru_tail_budget
    if isinstance(B, bool) or not isinstance(B, int | np.integer) or B < 0 or B >= 1 << 40:
        raise ValueError(f"tlru_tail_budget: expected an integer in [0, 2**40), got {tlru_tail_budget!r}")
    pol = POLICIES[evict_policy] | (8 if cache == "unified" else 0) | (int(B) << 4)
    n = ts.n_requests
    use_events = hold is not None
    if use_events:
        tm = np.ascontiguousarray(times, np.float64)
        hd = np.ascontiguousarray(hold, np.float64)
        if tm.shape != (n,) or hd.shape != (n,):
            raise ValueError(f"times/hold: expected {n} values each")
        if not (np.isfinite(tm).all() and np.isfinite(hd).all()) or (hd < 0).any() or (np.diff(tm) < 0).any():
            raise ValueError("times/hold: expected finite values, hold ≥ 0, times non-decreasing")
    else:
        tm = np.zeros(0, np.float64)
        hd = np.zeros(0, np.float64)
    run_pos = np.zeros(ts.run_len.shape[0], np.int64)
    if ts.run_len.shape[0]:
        cs = np.concatenate([[0], np.cumsum(ts.run_len)])
        # position of each run inside its own stream
        sid = np.repeat(np.arange(ts.stream_off.shape[0] - 1), np.diff(ts.stream_off))
        run_pos = cs[:-1] - cs[ts.stream_off[sid]]
    hit, evt, evn, wait, rej, st = _radix_kernel(
        ts.run_sym,
        ts.run_idx,
        ts.run_len,
        run_pos,
        ts.stream_off,
        ts.stream,
        ts.prompt_tokens,
        ts.output_tokens,
        int(capacity),
        int(p),
        pol,
        tm,
        hd,
        use_events,
    )
    if st[_ERR]:
        raise RuntimeError(f"radix kernel: internal error {int(st[_ERR])}")  # pragma: no cover
    return RadixResult(
        hit_tokens=hit,
        evicted_tokens=evt,
        evicted_nodes=evn,
        wait=wait,
        rejected=rej,
        prompt_tokens=ts.prompt_tokens,
        capacity=int(capacity),
        page_size=int(p),
        evict_policy=evict_policy,
        peak_in_use=int(st[_PEAK]),
        evictions=int(st[_EVT_ALL]),
        cache=cache,
    )
