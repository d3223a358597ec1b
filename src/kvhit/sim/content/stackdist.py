"""All-capacity whole-content LRU curve from one pass (stack-distance analysis of Algorithm 1).

For every event we compute the hit threshold ``N*``: the event is a hit of Algorithm 1 (paper App. B.4)
at capacity ``N`` iff ``N ≥ N*``. The eq. (12) numerator ``Σ_{j≥2} R_{j-1} H_j`` for any set of capacities
then follows from one bucketing pass, instead of one simulation per capacity.

Claim (exact, for Algorithm 1 with ``R`` nondecreasing within each conversation)
-------------------------------------------------------------------------------
Tag conversation θ at its turn-``(j-1)`` event, at stream position ``s``, after which its stored content
is ``R_{j-1}``; let ``t > s`` be the position of its turn ``j`` (no θ-event in between). For ``s < u < t``
let ``A(u)`` be the set of distinct conversations accessed at positions ``s+1..u`` and let

    S(u) := Σ_{i ∈ A(u)} (size of i after its latest access at a position ≤ u),

i.e. the *current* content sizes of the conversations accessed since θ's last access (the displacement,
§B.6, in blocks). ``S`` is nondecreasing in ``u`` (``A(u)`` grows and sizes only grow), with ``S(s) = 0``.
Put ``D := S(t-1)``. Then

    H_{θ,j} = 1   ⇔   D + R_{j-1} ≤ N,        so        N* = D + R_{j-1}.

Proof. (i) While θ is resident, every conversation accessed after ``s`` is resident and lies ahead of
θ (closer to MRU): each such access inserts its conversation at the MRU end (line 5), and line 7 only
ever removes the *last* element, so nothing ahead of θ can be evicted in a loop that has not already
evicted θ. Hence, if θ is resident after the event at ``u``, the resident set contains θ (size
``R_{j-1}``) and all of ``A(u)`` at their current sizes, and the loop of lines 6-9 has left a total
≤ N: ``S(u) + R_{j-1} ≤ N``. In particular a hit (θ resident after ``t-1``) implies ``D + R_{j-1} ≤ N``.
(ii) Conversely assume ``D + R_{j-1} ≤ N``; then ``S(u) + R_{j-1} ≤ N`` for all ``s ≤ u < t`` by
monotonicity. At ``u = s`` θ is at the MRU end and everything else is evicted first, so θ survives as
``R_{j-1} ≤ N``. Inductively, if θ is resident before the event at ``u``, then after lines 1-5 the part of
the list from the MRU end down to θ is exactly ``A(u) ∪ {θ}`` with current sizes (by (i)), of total
``S(u) + R_{j-1} ≤ N``; the eviction loop removes the elements behind θ first and stops, at the latest,
once only that part remains, so θ is still resident. Hence θ is resident when turn ``j`` arrives. ∎

Precisions on the informal statement "displacement + R_{j-1} ≤ N":

* a content larger than ``N`` accessed in between (``R_i > N``, inserted and evicted at once) makes
  ``S ≥ R_i > N``, so θ misses — consistent with Algorithm 1 evicting everything in that loop;
* a conversation accessed in between that was itself evicted and re-inserted can only have been
  evicted after θ (by (i)), so θ already misses; it is counted once, at its latest (largest) size;
* the sizes in ``D`` are those at each conversation's latest access before ``t`` (not at its first access
  after ``s``), and the condition is the same for all ``N``, which gives LRU inclusion: a hit at ``N``
  is a hit at every ``N' ≥ N``.

Computation. Positions are event indices. A Fenwick (binary indexed) tree holds, at the position of each
conversation's latest access, its current size, and 0 elsewhere. At event ``t`` for conversation θ with
previous position ``s``: ``D = W - prefix(s)`` where ``W`` is the total weight (positions > ``t`` are empty)
and ``prefix(s)`` is inclusive (it contains θ's own ``R_{j-1}``); then the weight moves from ``s`` to
``t`` with the new size ``R_j``. O(log n) per event.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvhit.sim.content.lru import (
    ContentInputError,
    _prepare_events,
    _previous_sizes_kernel,
    _raise_bad_R,
    _validate_capacities,
)

__all__ = [
    "FIRST_TURN",
    "content_curve",
    "content_curve_from_thresholds",
    "content_hit_thresholds",
]

#: Threshold sentinel for first turns (never a hit at any capacity).
FIRST_TURN: int = int(np.iinfo(np.int64).max)


@njit(cache=True)
def _thresholds_kernel(conv, R, C, out):  # pragma: no cover - compiled
    """Write ``N*`` per event into ``out``; return the first event with an invalid ``R`` (or -1).

    Fenwick tree over 1-based indices ``k = position + 1`` holding each conversation's current size at its
    latest access. Appending position ``t`` sets ``tree[t+1]`` from the already-built lower nodes (so
    nodes beyond the frontier are never touched), removal walks up only to the frontier, and the prefix
    query runs a fixed ``L = bit length`` iterations (``tree[0] = 0`` absorbs the tail), which keeps the
    loop branch-predictable. Indices are unsigned to avoid negative-index fix-ups.
    """
    n = conv.shape[0]
    L = 1
    while (1 << L) <= n + 1:
        L += 1
    one = np.uint64(1)
    tree = np.zeros(n + 1, dtype=np.int64)
    last = np.full(C, -1, dtype=np.int64)
    sentinel = np.iinfo(np.int64).max
    W = 0  # total current weight = Σ current sizes of all conversations seen so far
    for tt in range(n):
        t = np.uint64(tt)
        c = np.uint64(conv[t])
        r = R[t]
        ls = last[c]
        if ls >= 0:
            s = np.uint64(ls)
            r_prev = R[s]
            if r < r_prev:
                return tt
            # inclusive prefix over positions 0..s  ->  D = W - prefix
            acc = 0
            j = s + one
            for _ in range(L):
                acc += tree[j]
                j &= j - one
            out[t] = W - acc + r_prev  # N* = D + R_{j-1}
            # remove R_{j-1} at position s (nodes up to the frontier t only)
            k = s + one
            while k <= t:
                tree[k] -= r_prev
                k += k & (~k + one)
            W -= r_prev
        else:
            if r < 1:
                return tt
            out[t] = sentinel
        # append R_j at position t: tree[t+1] = R_j + sum of positions (t+1-lowbit(t+1), t-1]
        k = t + one
        i = t
        j = k & (k - one)
        acc = r
        while i > j:
            acc += tree[i]
            i &= i - one
        tree[k] = acc
        W += r
        last[c] = tt
    return -1


@njit(cache=True)
def _grid_cell(x, fnmin, scale, G):  # pragma: no cover - compiled
    """``f(x) = clamp(floor((float(x) - Nmin)·scale), 0, G-1)``, monotone nondecreasing in ``x``."""
    y = (np.float64(x) - fnmin) * scale
    if y < 0.0:
        y = 0.0
    if y > G - 1:
        y = G - 1
    return np.int64(y)


@njit(cache=True)
def _bucket_kernel(thr, w, Ns_sorted, acc, G):  # pragma: no cover - compiled
    """``acc[k] += w[i]`` for the first ``k`` with ``Ns_sorted[k] ≥ thr[i]``; ``k = K`` (a dump slot) if none.

    Grid lookup: with ``cell_lo[g]`` the first ``k`` with ``f(Ns_sorted[k]) ≥ g`` (``f`` monotone, see
    :func:`_grid_cell`), the answer for ``x`` with ``f(x) = g`` lies in ``[cell_lo[g], cell_lo[g+1]]``:
    every earlier capacity has a smaller cell hence is ``< x``, every later one a larger cell hence is
    ``> x``. For evenly spread capacities and ``G ≥ K`` a cell holds at most one capacity, so one
    comparison suffices; crowded cells fall back to a binary search.
    """
    K = Ns_sorted.shape[0]
    fnmin = np.float64(Ns_sorted[0])
    span = np.float64(Ns_sorted[K - 1]) - fnmin
    scale = G / span if span > 0 else 0.0
    cell_lo = np.empty(G + 1, dtype=np.int64)
    k = 0
    for g in range(G + 1):
        while k < K and _grid_cell(Ns_sorted[k], fnmin, scale, G) < g:
            k += 1
        cell_lo[g] = k
    pad = np.empty(K + 1, dtype=np.int64)  # pad[K] = +inf sentinel for the one-step case
    pad[:K] = Ns_sorted
    pad[K] = np.iinfo(np.int64).max
    for i in range(thr.shape[0]):
        x = thr[i]
        g = _grid_cell(x, fnmin, scale, G)
        lo = cell_lo[g]
        hi = cell_lo[g + 1]
        if hi - lo > 1:
            while lo < hi:
                mid = (lo + hi) >> 1
                if pad[mid] < x:
                    lo = mid + 1
                else:
                    hi = mid
        else:
            lo += np.int64(pad[lo] < x) & np.int64(lo < hi)
        acc[lo] += w[i]


def _thresholds(conv, R) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    conv, R, C = _prepare_events(conv, R)
    n = conv.shape[0]
    out = np.empty(n, dtype=np.int64)
    if n:
        bad = int(_thresholds_kernel(conv, R, C, out))
        if bad >= 0:
            _raise_bad_R(conv, R, bad)
    return out, conv, R, C


def content_hit_thresholds(conv, R) -> np.ndarray:
    """Per-event hit threshold ``N*`` of Algorithm 1 (see the module docstring for the proof).

    Event ``i`` is a hit at capacity ``N`` iff ``N ≥ N*[i]``; ``N*[i] = D_i + R_{j-1}`` with ``D_i`` the
    current content mass of the distinct conversations accessed since that conversation's previous
    turn. First turns get :data:`FIRST_TURN` (int64 max). Returns int64[n]. Raises
    :class:`~kvhit.sim.content.lru.ContentInputError` on malformed input.
    """
    return _thresholds(conv, R)[0]


def _validate_weights(weights, n: int) -> np.ndarray:
    w = np.asarray(weights)
    if w.ndim != 1 or w.shape[0] != n:
        raise ContentInputError(f"weights must be a 1-D array of length {n} (one per event), got shape {w.shape}")
    if w.dtype.kind == "b":
        return w.astype(np.int64)
    if w.dtype.kind in "iu":
        if w.dtype == np.uint64 and w.size and int(w.max()) > np.iinfo(np.int64).max:
            raise ContentInputError("weights have values beyond int64")
        return np.ascontiguousarray(w, dtype=np.int64)
    if w.dtype.kind == "f":
        if not np.all(np.isfinite(w)):
            raise ContentInputError("weights must be finite")
        return np.ascontiguousarray(w, dtype=np.float64)
    raise ContentInputError(f"weights must be numeric, got dtype {w.dtype}")


def content_curve_from_thresholds(thresholds, weights, Ns) -> np.ndarray:
    """``Σ_i w_i·1{N ≥ N*_i}`` for every capacity ``N`` in ``Ns`` (any order, duplicates allowed).

    Equivalent to sorting the thresholds and taking a cumulative sum of the weights, done in one pass:
    each event's weight goes to the bucket of the smallest sorted capacity ``≥ N*`` (grid lookup plus a
    short binary search), then the buckets are cumulated. Events with threshold :data:`FIRST_TURN` never
    count. Integer weights give an exact int64 result, float weights a float64 one.
    """
    thr = np.asarray(thresholds)
    if thr.ndim != 1 or thr.dtype.kind not in "iu":
        raise ContentInputError("thresholds must be a 1-D integer array (from content_hit_thresholds)")
    thr = np.ascontiguousarray(thr, dtype=np.int64)
    w = _validate_weights(weights, thr.shape[0])
    Ns = _validate_capacities(Ns)
    if Ns.size and int(Ns.max()) >= FIRST_TURN:
        raise ContentInputError(f"Ns must be < 2**63-1 (the first-turn sentinel), got {int(Ns.max())}")
    K = Ns.shape[0]
    order = np.argsort(Ns, kind="stable")
    Ns_sorted = np.ascontiguousarray(Ns[order])
    acc = np.zeros(K + 1, dtype=w.dtype)  # acc[K]: thresholds above every capacity (incl. FIRST_TURN)
    if thr.shape[0] and K:
        _bucket_kernel(thr, w, Ns_sorted, acc, 4 * K)
    out = np.empty(K, dtype=w.dtype)
    out[order] = np.cumsum(acc[:K])
    return out


def content_curve(conv, R, weights, Ns) -> np.ndarray:
    """All-capacity whole-content LRU numerators ``Σ_i w_i·H_i(N)`` for every ``N`` in ``Ns``.

    ``weights`` (length n) is the per-event weight: ``None`` means the base weight ``R_{j-1}`` (0 for
    first turns), giving the numerator of eq. (12); pass ``max(R_{j-1}-1, 0)`` for the practical weight
    or 0 for unmeasured events. Divide by ``Σ_j R_j`` for the eq. (12) hit ratio. Exactly equal to
    running :func:`kvhit.sim.content.lru.simulate_content` at each ``N`` (see the module docstring), in
    O(n log n + |Ns| log |Ns|) instead of O(n·|Ns|).
    """
    thr, conv, R, C = _thresholds(conv, R)
    if weights is None:
        weights = _previous_sizes_kernel(conv, R, C) if conv.shape[0] else np.zeros(0, dtype=np.int64)
    return content_curve_from_thresholds(thr, weights, Ns)
