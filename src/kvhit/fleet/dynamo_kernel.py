"""The compiled walk of :func:`kvhit.fleet.estimate.dynamo_routes` (Dynamo's rule on every replica's overlap, in
time order), one row at a time with the same floating-point operations in the same order as the NumPy loop it
replaces (tests/test_fleet_estimate_kv.py keeps that loop as the reference and compares bit for bit).

Invariant: the routing depends only on the arrays passed (the random draws — load snapshot rows, tie-break
uniforms — are drawn by the caller). NOT modelled here: see :func:`kvhit.fleet.estimate.dynamo_routes`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["dynamo_walk"]


@njit(cache=True)
def dynamo_walk(  # pragma: no cover - numba
    order, conv, t, T, Tb, Fb, nb, Nv, P, A, I, srow, tie_u, w, wr, c, approx, ttl, b, n_conv
):
    """The replica of every row: rows in ``order`` (time order); per row the overlap on every replica (the
    conversation's last turn there, cut by the block-tail rule ``N − 1 − D``, or the approx indexer's TTL), the
    cost ``w·max(P_k/b + T/b − c·x_k, 0) + A_k + w_r·I_k`` on load snapshot ``srow``, the cheapest replica (ties
    within 1e-9 broken by ``tie_u``), and the replica's allocation count advanced by the blocks it misses."""
    R = Nv.size
    n = order.size
    last_x = np.zeros((n_conv, R))
    last_t = np.full((n_conv, R), -np.inf)
    last_a = np.zeros((n_conv, R))
    alloc = np.zeros(R)
    rep = np.empty(n, np.int64)
    x = np.empty(R)
    cost = np.empty(R)
    cand = np.empty(R, np.int64)
    for j in range(n):
        r = order[j]
        cv = conv[r]
        for k in range(R):
            if approx:
                x[k] = last_x[cv, k] if t[r] - last_t[cv, k] < ttl else 0.0
            else:
                x[k] = max(min(last_x[cv, k], Nv[k] - 1.0 - (alloc[k] - last_a[cv, k])), 0.0)
        s = srow[r]
        mn = np.inf
        for k in range(R):
            cost[k] = w * max(P[s, k] / b + Tb[r] - c * x[k], 0.0) + A[s, k] + wr * I[s, k]
            mn = min(mn, cost[k])
        nc = 0
        for k in range(R):
            if abs(cost[k] - mn) <= 1e-9:
                cand[nc] = k
                nc += 1
        k = cand[int(tie_u[r] * nc)] if nc > 1 else cand[0]
        rep[r] = k
        if not approx:
            hit = min(x[k], float(max((T[r] - 1) // b, 0)))
        else:
            hit = max(min(last_x[cv, k], Nv[k] - 1.0 - (alloc[k] - last_a[cv, k])), 0.0)
        alloc[k] += nb[r] - hit
        last_x[cv, k] = Fb[r]
        last_t[cv, k] = t[r]
        last_a[cv, k] = alloc[k]
    return rep
