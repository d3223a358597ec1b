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

from kvhit.sim.content import (
    ContentInputError,
    _previous_sizes_kernel,
    _validate_capacities,
    validate_events,
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
def _thresholds_kernel(conv, R, C):  # pragma: no cover - compiled
    n = conv.shape[0]
    tree = np.zeros(n + 1, dtype=np.int64)  # 1-based Fenwick tree over positions 0..n-1
    last = np.full(C, -1, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    sentinel = np.iinfo(np.int64).max
    W = 0
    for t in range(n):
        c = conv[t]
        r = R[t]
        s = last[c]
        if s >= 0:
            r_prev = R[s]
            # inclusive prefix sum over positions 0..s
            acc = 0
            k = s + 1
            while k > 0:
                acc += tree[k]
                k -= k & (-k)
            out[t] = (W - acc) + r_prev  # N* = D + R_{j-1}
            # remove the old weight at s
            k = s + 1
            while k <= n:
                tree[k] -= r_prev
                k += k & (-k)
            W -= r_prev
        else:
            out[t] = sentinel
        k = t + 1
        while k <= n:
            tree[k] += r
            k += k & (-k)
        W += r
        last[c] = t
    return out


@njit(cache=True)
def _bucket_kernel(thr, w, Ns_sorted, acc):  # pragma: no cover - compiled
    """acc[k] += w[i] for the first k with Ns_sorted[k] >= thr[i] (skips k == K)."""
    K = Ns_sorted.shape[0]
    for i in range(thr.shape[0]):
        wi = w[i]
        if wi == 0:
            continue
        x = thr[i]
        lo = 0
        hi = K
        while lo < hi:
            mid = (lo + hi) >> 1
            if Ns_sorted[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        if lo < K:
            acc[lo] += wi


def content_hit_thresholds(conv, R) -> np.ndarray:
    """Per-event hit threshold ``N*`` of Algorithm 1 (see module docstring for the proof).

    Event ``i`` is a hit at capacity ``N`` iff ``N ≥ N*[i]``; ``N*[i] = D_i + R_{j-1}`` with ``D_i`` the
    current content mass of the distinct conversations accessed since that conversation's previous
    turn. First turns get :data:`FIRST_TURN` (int64 max). Returns int64[n].
    """
    conv, R, C = validate_events(conv, R)
    if conv.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return _thresholds_kernel(conv, R, C)


def _validate_weights(weights, n: int, thresholds: np.ndarray | None = None) -> np.ndarray:
    w = np.asarray(weights)
    if w.ndim != 1 or w.shape[0] != n:
        raise ContentInputError(f"weights must be a 1-D array of length {n} (one per event), got shape {w.shape}")
    if w.dtype.kind == "b":
        w = w.astype(np.int64)
    if w.dtype.kind in "iu":
        return np.ascontiguousarray(w, dtype=np.int64)
    if w.dtype.kind == "f":
        if not np.all(np.isfinite(w)):
            raise ContentInputError("weights must be finite")
        return np.ascontiguousarray(w, dtype=np.float64)
    raise ContentInputError(f"weights must be numeric, got dtype {w.dtype}")


def content_curve_from_thresholds(thresholds, weights, Ns) -> np.ndarray:
    """``Σ_i w_i·1{N ≥ N*_i}`` for every capacity ``N`` in ``Ns`` (any order, duplicates allowed).

    Each event's weight is added to the bucket of the smallest sorted capacity ``≥ N*`` and the buckets
    are cumulated — equivalent to sorting the thresholds and taking a cumulative sum, in O(n log |Ns|).
    Integer weights give an exact int64 result, float weights a float64 one.
    """
    thr = np.asarray(thresholds)
    if thr.ndim != 1 or thr.dtype.kind not in "iu":
        raise ContentInputError("thresholds must be a 1-D integer array (from content_hit_thresholds)")
    thr = np.ascontiguousarray(thr, dtype=np.int64)
    w = _validate_weights(weights, thr.shape[0])
    Ns = _validate_capacities(Ns)
    order = np.argsort(Ns, kind="stable")
    Ns_sorted = np.ascontiguousarray(Ns[order])
    acc = np.zeros(Ns.shape[0], dtype=w.dtype)
    if thr.shape[0] and Ns.shape[0]:
        _bucket_kernel(thr, w, Ns_sorted, acc)
    out = np.empty_like(acc)
    out[order] = np.cumsum(acc)
    return out


def content_curve(conv, R, weights, Ns) -> np.ndarray:
    """All-capacity whole-content LRU numerators ``Σ_i w_i·H_i(N)`` for every ``N`` in ``Ns``.

    ``weights`` (length n) is the per-event weight: ``None`` means the base weight ``R_{j-1}`` (0 for
    first turns), giving the numerator of eq. (12); pass ``max(R_{j-1}-1, 0)`` for the practical weight
    or 0 for unmeasured events. Divide by ``Σ_j R_j`` for the eq. (12) hit ratio. Exactly equal to
    running :func:`kvhit.sim.content.simulate_content` at each ``N`` (see the module docstring).
    """
    conv, R, C = validate_events(conv, R)
    n = conv.shape[0]
    thr = _thresholds_kernel(conv, R, C) if n else np.zeros(0, dtype=np.int64)
    if weights is None:
        weights = _previous_sizes_kernel(conv, R, C) if n else np.zeros(0, dtype=np.int64)
    return content_curve_from_thresholds(thr, weights, Ns)
