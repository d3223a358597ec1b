"""The window-exact SGLang form's per-revisit node sums (:func:`kvhit.estimate.sglang.estimate_sglang_window`):
Σ_nodes len·P(D ≤ c − e) for each counted revisit, D ~ Normal(mean, sd²) of that revisit (½-page continuity
correction), at one pool c per call.

Three kernels give the same sums: :func:`_window_hits` term by term (the reference), :func:`_window_hits_sat`
(a revisit's node ends rise, so the terms fall along its nodes: the leading ones that are exactly ``len`` read
from running sums, the trailing ones below 1.2e-19·len left out) and :func:`_window_hits_series` (a revisit whose
ends lie within 2 sd of their centre summed by the Hermite series of :mod:`kvhit.estimate.occupancy_shifted`).

Invariant: every kernel's sum is within 1e-13·Σ len of the reference's (tests); each lies in [0, Σ len].
NOT modelled here: anything of the estimator's own (see :mod:`kvhit.estimate.sglang`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from kvhit.estimate.occupancy_shifted import series_terms


@njit(cache=True)
def _window_hits(node_ptr, node_end, node_len, mean, sd, c, out):  # pragma: no cover - numba
    """Σ_nodes len·P(D ≤ c − e) per revisit, D ~ Normal(mean, sd²) with a ½-page continuity correction (the
    reference of :func:`_window_hits_sat`)."""
    for k in range(node_ptr.size - 1):
        tot = 0.0
        for q in range(node_ptr[k], node_ptr[k + 1]):
            x = c - node_end[q]
            if x < 0:
                continue
            if sd[k] > 0:
                tot += node_len[q] * 0.5 * math.erfc(-(x + 0.5 - mean[k]) / (sd[k] * math.sqrt(2.0)))
            elif mean[k] <= x:
                tot += node_len[q]
        out[k] = tot


@njit(cache=True)
def _node_cumsums(node_ptr, node_len):  # pragma: no cover - numba
    """Per revisit, the running sum of its node lengths from 0.0 in node order (``cum[q]``: nodes up to q)."""
    cum = np.empty(node_len.shape[0])
    for k in range(node_ptr.size - 1):
        tot = 0.0
        for q in range(node_ptr[k], node_ptr[k + 1]):
            tot += node_len[q]
            cum[q] = tot
    return cum


@njit(cache=True)
def _revisit_sat(a, b, node_end, node_len, cum, m, s, c):  # pragma: no cover - numba
    """One revisit's Σ len·P(D ≤ c − e) over its nodes ``a:b`` (see :func:`_window_hits_sat`)."""
    j = a
    if s > 0:
        lo = a
        hi = b
        while lo < hi:
            mid = (lo + hi) // 2
            x = c - node_end[mid]
            if x >= 0 and (x + 0.5 - m) / s >= 8.5:
                lo = mid + 1
            else:
                hi = mid
        j = lo
        # the trailing run where the term is < 1.2e-19·len (z ≤ −9) or 0 (x < 0): left out
        hi = b
        while lo < hi:
            mid = (lo + hi) // 2
            x = c - node_end[mid]
            if x < 0 or (x + 0.5 - m) / s <= -9.0:
                hi = mid
            else:
                lo = mid + 1
        b = lo
    tot = cum[j - 1] if j > a else 0.0
    for q in range(j, b):
        x = c - node_end[q]
        if x < 0:
            continue
        if s > 0:
            tot += node_len[q] * 0.5 * math.erfc(-(x + 0.5 - m) / (s * math.sqrt(2.0)))
        elif m <= x:
            tot += node_len[q]
    return tot


@njit(cache=True)
def _window_hits_sat(node_ptr, node_end, node_len, cum, mean, sd, c, out):  # pragma: no cover - numba
    """:func:`_window_hits` with its leading saturated terms read from ``cum`` (:func:`_node_cumsums`): a
    revisit's node ends rise, so z = (c − e + ½ − mean)/sd falls along its nodes, and where z ≥ 8.5
    ``0.5·erfc(−z/√2)`` is exactly 1.0 (erfc(−6.01) rounds to 2): those terms add ``len`` each, in the same order
    from 0.0 — the running sum, bit for bit. Where z ≤ −9 the term is below Φ(−9)·len < 1.2e-19·len and is left
    out (so the sum is within 1.2e-19·Σ len of :func:`_window_hits`'s; c < e: 0). Both runs are found by
    bisection on the same expression. :func:`_window_hits` stays as the reference (tests)."""
    for k in range(node_ptr.size - 1):
        out[k] = _revisit_sat(node_ptr[k], node_ptr[k + 1], node_end, node_len, cum, mean[k], sd[k], c)


@njit(cache=True)
def _revisit_moments(node_ptr, node_end, node_len, sd, kmax):  # pragma: no cover - numba
    """Per revisit: the centre e₀ and half range R of its node ends, the moments Σ len·((e − e₀)/R)^j
    (j ≤ ``kmax``) and the number of Hermite terms its u = R/sd needs (0: sum its nodes directly) — as
    :mod:`kvhit.estimate.occupancy_shifted`, one Gaussian per revisit."""
    n = node_ptr.size - 1
    e0 = np.zeros(n)
    R = np.zeros(n)
    M = np.zeros((n, kmax + 1))
    nterm = np.zeros(n, np.int64)
    for k in range(n):
        a = node_ptr[k]
        b = node_ptr[k + 1]
        if b == a or sd[k] <= 0:
            continue
        lo = node_end[a]
        hi = node_end[b - 1]
        e0[k] = 0.5 * (lo + hi)
        R[k] = 0.5 * (hi - lo)
        u = R[k] / sd[k]
        if u > 2.0:
            continue
        for q in range(a, b):
            v = (node_end[q] - e0[k]) / R[k] if R[k] > 0 else 0.0
            pw = node_len[q]
            for j in range(kmax + 1):
                M[k, j] += pw
                pw *= v
        nterm[k] = series_terms(u, kmax)
    return e0, R, M, nterm


@njit(cache=True)
def _window_hits_series(
    node_ptr, node_end, node_len, cum, e0, R, M, nterm, mean, sd, c, out
):  # pragma: no cover - numba
    """:func:`_window_hits_sat` with each revisit whose node ends lie within 2 sd of their centre (``nterm``
    > 0) summed by the Hermite series of :mod:`kvhit.estimate.occupancy_shifted` (W Φ(z) − φ(z) Σ_j u^j/j! M_j
    He_{j−1}(z)), when every node end is ≤ c; whole revisits saturated above (z − u ≥ 8.5: every term is exactly
    len) read their running sum, below (z + u ≤ −9) add nothing. The others as :func:`_revisit_sat`."""
    inv_sqrt2pi = 1.0 / math.sqrt(2.0 * math.pi)
    for k in range(node_ptr.size - 1):
        a = node_ptr[k]
        b = node_ptr[k + 1]
        if b == a:
            out[k] = 0.0
            continue
        s = sd[k]
        if nterm[k] == 0 or c - node_end[b - 1] < 0:
            out[k] = _revisit_sat(a, b, node_end, node_len, cum, mean[k], s, c)
            continue
        z = (c - e0[k] + 0.5 - mean[k]) / s
        u = R[k] / s
        if z - u >= 8.5:
            out[k] = cum[b - 1]
            continue
        if z + u <= -9.0:
            out[k] = 0.0
            continue
        he0 = 1.0
        he1 = z
        coef = 1.0
        ser = 0.0
        for j in range(1, nterm[k] + 1):
            coef *= u / j
            ser += coef * M[k, j] * he0
            he0, he1 = he1, z * he1 - j * he0
        out[k] = M[k, 0] * 0.5 * math.erfc(-z / math.sqrt(2.0)) - math.exp(-0.5 * z * z) * inv_sqrt2pi * ser
