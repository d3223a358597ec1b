"""The compiled form of llm-d's stay probability (:func:`kvhit.fleet.estimate._stay_prob` with ``better="max"`` on
the home scores ``base_h + w_p·f``): per load snapshot s the best other replica's score and its tie count, then for
every prefix fraction f whether the home replica wins (by more than 1e-9) or ties (within 1e-9, the tie broken
uniformly among the tied replicas) — the same floating-point operations as the NumPy form (each snapshot's terms
added in snapshot order, then divided by the snapshot count), which tests/test_fleet_stay_kernel.py compares: bit
for bit with two or more fractions (NumPy then adds row by row too), within 1e-15 with one (NumPy sums a single
contiguous column pairwise). Also the compiled walk of the routing the stay model draws (:func:`kv_walk`,
:func:`kvhit.fleet.estimate._kv_walk`'s loop: integers only, identical to the Python loop).

Invariant: the result depends only on the arrays passed; it is the mean over the S snapshots, so it lies in [0, 1].
NOT modelled here: see :func:`kvhit.fleet.estimate.stay_probabilities`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["kv_walk", "stay_max"]


@njit(cache=True)
def stay_max(base_home, base_other, fs, wp):  # pragma: no cover - numba
    """P(home wins) per fraction ``fs[k]``: ``base_home`` (S,), ``base_other`` (S, R−1), home score
    ``base_home[s] + wp·fs[k]``; the maximum wins, ties (|h − o| ≤ 1e-9) are shared with the tied others."""
    S = base_home.size
    K = fs.size
    win = np.zeros(K)
    tie = np.zeros(K)
    add = wp * fs
    for s in range(S):
        best = base_other[s, 0]
        for j in range(1, base_other.shape[1]):
            if base_other[s, j] > best:
                best = base_other[s, j]
        n_tie = 0
        for j in range(base_other.shape[1]):
            if base_other[s, j] == best:
                n_tie += 1
        share = 1.0 / (n_tie + 1.0)
        h0 = base_home[s]
        for k in range(K):
            h = h0 + add[k]
            if abs(h - best) <= 1e-9:
                tie[k] += share
            elif h > best:
                win[k] += 1.0
    return win / S + tie / S


@njit(cache=True)
def kv_walk(first, stay, d, jump, R):  # pragma: no cover - numba
    """The replica of every row (conversation-major order): a first turn goes to ``d``, a later one stays on the
    previous turn's replica if ``stay``, else moves ``jump`` replicas on (mod ``R``)."""
    out = np.empty(first.size, np.int64)
    cur = 0
    for i in range(first.size):
        if first[i]:
            cur = d[i]
        elif not stay[i]:
            cur = (cur + jump[i]) % R
        out[i] = cur
    return out
