"""Σ_e w_e·G(c − e) at many pools c: the Gaussian occupancy law of :class:`kvhit.estimate.occupancy._Occupancy`
summed over a set of node ends e with weights w, without evaluating G at every (c, e).

With fluctuations G(x) = Σ_q p_q Φ((x + ½ − m_q)/s_q) for x ≥ 0, so at a pool c every component q needs
H_q(c) = Σ_e w_e Φ(z − u_e), z = (c − e₀ + ½ − m_q)/s_q, u_e = (e − e₀)/s_q, e₀ the centre of the ends (R their
half range, |u_e| ≤ u = R/s_q). Φ is entire and Φ^(k) = (−1)^(k−1) He_{k−1} φ, so

    H_q(c) = W Φ(z) − φ(z) Σ_{k≥1} (u^k / k!) M_k He_{k−1}(z),   M_k = Σ_e w_e ((e − e₀)/R)^k,   W = Σ_e w_e,

a series whose k-th term is at most W u^k / √(k!) in size (Cramér's bound on He_n φ): it is summed until that
bound is below 1e-18·W, for components with u ≤ 2 (the largest term then ≤ 3.3 W: the rounding stays near
1e-16 W). Components with a wider u, or s_q = 0 (a step at m_q), are summed over the ends directly. A component
whose every z − u_e is ≥ 8.3 (Φ rounds to 1) adds p_q·W, one whose every z − u_e is ≤ −9 nothing (< 1.2e-19 W).

The same series gives G(c − e) at many ends e (:func:`shifted_G_values`): per pool the components fold into one
polynomial in (e − e₀)/R, then each end costs its degree instead of a pass over the components.

Invariant: the same sum as ``w @ G(c − e)`` (and the same values as ``G(c − e)``) up to rounding (tests: within
1e-13). It needs every
c − e ≥ 0 (G is 0 below 0, which the series does not know): the caller evaluates the other pools directly.
NOT modelled here: anything of G's own (see :mod:`kvhit.estimate.occupancy`); the mean-field G
(``fluctuations=False``) is not a Gaussian mixture and is evaluated directly.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["shifted_G_sums", "shifted_G_values"]

#: series only for components whose ends span at most this many standard deviations either side of the centre
U_MAX = 2.0
#: Φ(z) rounds to 1.0 in a double from here on; below −Z_LO it is < 1.2e-19
Z_HI = 8.3
Z_LO = 9.0


@njit(cache=True)
def _phi(z):  # pragma: no cover - numba
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


@njit(cache=True)
def series_terms(u, kmax):  # pragma: no cover - numba
    """Hermite terms of the shifted series for half range / sd = ``u`` (≥ 1): add terms while k ≤ u² or while
    Cramér's bound u^k/√(k!) is ≥ 1e-18, at most ``kmax``; u = 0 (one node end) needs one."""
    bnd = 1.0
    k = 0
    while k < kmax and u > 0.0:
        k += 1
        bnd *= u / math.sqrt(k)
        if k > u * u and bnd < 1e-18:
            break
    return max(k, 1)


@njit(cache=True)
def _component_terms(R, sd, kmax):  # pragma: no cover - numba
    """Per Gaussian component (sd ``sd[q]``) of ends spread ±``R``: the number of series terms
    (:func:`series_terms`), 0 where it is summed directly (sd = 0, or R/sd > ``U_MAX``)."""
    nterm = np.zeros(sd.shape[0], np.int64)
    for q in range(sd.shape[0]):
        s = sd[q]
        if s <= 0.0:
            continue
        u = R / s
        if u > U_MAX:
            continue
        nterm[q] = series_terms(u, kmax)
    return nterm


@njit(cache=True)
def _shifted_kernel(c, e, w, e0, R, Mk, W, mean, sd, p, out):  # pragma: no cover - numba
    """``out[j]`` = Σ_q p_q Σ_e w_e Φ((c_j − e + ½ − m_q)/s_q) (a step ``c_j − e ≥ m_q`` where s_q = 0)."""
    nq = mean.shape[0]
    K = Mk.shape[0] - 1
    inv_sqrt2pi = 1.0 / math.sqrt(2.0 * math.pi)
    nterm = _component_terms(R, sd, K)
    for j in range(c.shape[0]):
        cj = c[j]
        tot = 0.0
        for q in range(nq):
            s = sd[q]
            m = mean[q]
            if s <= 0.0:
                h = 0.0
                for i in range(e.shape[0]):
                    if cj - e[i] >= m:
                        h += w[i]
                tot += p[q] * h
                continue
            z = (cj - e0 + 0.5 - m) / s
            u = R / s
            if z - u >= Z_HI:
                tot += p[q] * W
                continue
            if z + u <= -Z_LO:
                continue
            if nterm[q] == 0:
                h = 0.0
                for i in range(e.shape[0]):
                    h += w[i] * _phi((cj - e[i] + 0.5 - m) / s)
                tot += p[q] * h
                continue
            # Σ_{k≥1} (u^k/k!) M_k He_{k−1}(z), He by its three-term recurrence
            he0 = 1.0  # He_{k−1}
            he1 = z  # He_k
            coef = 1.0
            ser = 0.0
            for k in range(1, nterm[q] + 1):
                coef *= u / k
                ser += coef * Mk[k] * he0
                he0, he1 = he1, z * he1 - k * he0
            tot += p[q] * (W * _phi(z) - math.exp(-0.5 * z * z) * inv_sqrt2pi * ser)
        out[j] = tot


@njit(cache=True)
def _values_kernel(c, e, e0, R, mean, sd, p, out):  # pragma: no cover - numba
    """``out[j, i]`` = Σ_q p_q Φ((c_j − e_i + ½ − m_q)/s_q) (a step where s_q = 0): per pool, the series
    components fold into a polynomial in v = (e − e₀)/R, G = A − Σ_k B_k v^k with
    B_k = Σ_q p_q φ(z_q) (R/s_q)^k / k! He_{k−1}(z_q); the others are added term by term."""
    nq = mean.shape[0]
    ne = e.shape[0]
    Kmax = 96
    inv_sqrt2pi = 1.0 / math.sqrt(2.0 * math.pi)
    nterm = _component_terms(R, sd, Kmax)
    v = np.empty(ne)
    for i in range(ne):
        v[i] = (e[i] - e0) / R if R > 0 else 0.0
    B = np.zeros(Kmax + 1)
    for j in range(c.shape[0]):
        cj = c[j]
        A = 0.0
        kk = 0
        B[:] = 0.0
        for i in range(ne):
            out[j, i] = 0.0
        for q in range(nq):
            s = sd[q]
            m = mean[q]
            if s <= 0.0:
                for i in range(ne):
                    if cj - e[i] >= m:
                        out[j, i] += p[q]
                continue
            z = (cj - e0 + 0.5 - m) / s
            u = R / s
            if z - u >= Z_HI:
                A += p[q]
                continue
            if z + u <= -Z_LO:
                continue
            if nterm[q] == 0:
                for i in range(ne):
                    out[j, i] += p[q] * _phi((cj - e[i] + 0.5 - m) / s)
                continue
            A += p[q] * _phi(z)
            f = p[q] * math.exp(-0.5 * z * z) * inv_sqrt2pi
            he0 = 1.0
            he1 = z
            coef = 1.0
            for k in range(1, nterm[q] + 1):
                coef *= u / k
                B[k] += f * coef * he0
                he0, he1 = he1, z * he1 - k * he0
            if nterm[q] > kk:
                kk = nterm[q]
        for i in range(ne):
            acc = 0.0
            for k in range(kk, 0, -1):  # Horner: Σ_k B_k v^k
                acc = (acc + B[k]) * v[i]
            out[j, i] += A - acc


def shifted_G_values(G, e: np.ndarray, c: np.ndarray) -> np.ndarray:
    """G(c_j − e_i) for every pool c_j and end e_i (``len(c) × len(e)``; module docstring; every c_j − e_i ≥ 0)
    of a fluctuating :class:`kvhit.estimate.occupancy._Occupancy` ``G``."""
    e = np.asarray(e, dtype=float)
    c = np.asarray(c, dtype=float)
    out = np.zeros((c.shape[0], e.shape[0]))
    if e.size == 0 or c.size == 0:
        return out
    lo, hi = float(e.min()), float(e.max())
    _values_kernel(c, e, 0.5 * (lo + hi), 0.5 * (hi - lo), G.mean, G.sd, G.p, out)
    return out


def shifted_G_sums(G, e: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Σ_e w_e·G(c_j − e) for every pool c_j (module docstring) of a fluctuating
    :class:`kvhit.estimate.occupancy._Occupancy` ``G``; every c_j − e must be ≥ 0."""
    e = np.asarray(e, dtype=float)
    w = np.asarray(w, dtype=float)
    c = np.asarray(c, dtype=float)
    out = np.zeros(c.shape[0])
    if e.size == 0 or c.size == 0:
        return out
    lo, hi = float(e.min()), float(e.max())
    e0, R = 0.5 * (lo + hi), 0.5 * (hi - lo)
    K = 96
    v = (e - e0) / R if R > 0 else np.zeros(e.size)
    Mk = np.array([float(w @ v**k) for k in range(K + 1)])
    _shifted_kernel(c, e, w, e0, R, Mk, float(w.sum()), G.mean, G.sd, G.p, out)
    return out
