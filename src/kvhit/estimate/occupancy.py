"""The occupancy law G(x) = P(D(W) ≤ x) and the stationary hit sums of the engine-aware estimators.

:class:`_Occupancy` is G, the probability that the displacement over a tagged gap W stays within x blocks:
F(τ(x)) in mean field (τ the root of eq. (38) with x in place of N), or, with fluctuations, a Gaussian of mean
d(W) and variance λ0 V₁(W) (Lemma D.1) with a ½-block continuity correction, averaged over representatives of F
(:func:`_fluct_grid`). :class:`_PrefixVariance` gives V₁ of every admitted set of
:meth:`kvhit.estimate.accounting.EngineAccounting.admitted` from one table of per-prefix ∫Φ².
:func:`_hits_per_lambda` turns G into the hit ratio at one λ0 for a vector of capacities: reuse_j·G(C) (eq. (39)),
whole-content reuse_j·G(C − size_j), or vLLM's tail-first partial hits Σ_{i<H_j} G(C − 1 − i). This is the
machinery :func:`kvhit.estimate.engine.estimate_engine` and :mod:`kvhit.estimate.sglang` share.

Invariant: G is a distribution function in x (0 for x < 0, non-decreasing, at most 1), so every hit sum lies
between 0 and the metric's ceiling A_hit/A_R of the accounting it is given.

NOT modelled here: rejections (the caller passes the admitted accounting), the warm-up transient (the
window-exact form, :func:`kvhit.estimate.engine.estimate_window`), and any dependence between a tagged gap and
the background displacement.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvhit.estimate import theory
from kvhit.estimate.accounting import EngineAccounting, displacement_moments
from kvhit.estimate.displacement import _phi2_prefix_kernel
from kvhit.estimate.trace_stats import EstimateError
from kvhit.workload.dists import EmpiricalW, Exponential, Interarrival


def _resolve_F(F: Any, W: np.ndarray) -> Interarrival:
    if isinstance(F, str):
        if F not in ("empirical", "posterior"):
            raise EstimateError(f"F: expected 'empirical', 'posterior' or an Interarrival, got {F!r}")
        if W.size == 0:
            raise EstimateError("trace: no interarrival gap observed (every conversation has a single turn)")
        if F == "empirical":
            return EmpiricalW(W)
        return Exponential(float(np.mean(W)))
    if not isinstance(F, Interarrival):
        raise EstimateError(f"F: expected 'empirical', 'posterior' or an Interarrival, got {type(F).__name__}")
    return F


def _representatives(F: Interarrival, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Points w_q and weights p_q with Σ p_q g(w_q) ≈ E g(W): the samples themselves (an empirical F̂ with at
    most ``k`` distinct values), else the midpoints of ``k`` equal-probability bins."""
    if isinstance(F, EmpiricalW):
        w = F.samples
        u, c = np.unique(w, return_counts=True)
        if u.size <= k:
            return u, c / w.size
        q = (np.arange(k) + 0.5) / k
        return np.quantile(w, q, method="inverted_cdf"), np.full(k, 1.0 / k)
    mu = float(F.mean)
    grid = np.concatenate([[0.0], np.geomspace(mu * 1e-6, mu * 1e3, 8192)])
    cdf = np.maximum.accumulate(np.asarray(F.cdf(grid), dtype=float))
    q = (np.arange(k) + 0.5) / k
    return np.interp(q, cdf, grid), np.full(k, 1.0 / k)


def _fluct_grid(F: Interarrival, k: int = 1024) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Representatives (w_q, p_q) of F and the t grid on which V₁(t) is tabulated and interpolated."""
    w, p = _representatives(F, k)
    wmax = float(w.max())
    tg = np.unique(np.concatenate([np.linspace(0.0, wmax, 129), np.quantile(w, np.linspace(0, 1, 129))]))
    return w, p, tg


class _PrefixVariance:
    """V₁(t) (Lemma D.1, per unit λ0) of every admitted set of :meth:`EngineAccounting.admitted` from one
    table of the per-conversation, per-prefix ∫Φ² (:func:`_phi2_prefix_kernel`): V₁ at capacity N is the sum
    over conversations of their row for J_i(N) turns, divided by L."""

    def __init__(self, acc: EngineAccounting, tg: np.ndarray):
        self.acc = acc
        self.tab = np.zeros((acc.hist_all.size, tg.size))
        _phi2_prefix_kernel(acc.conv_ptr, acc.offsets, acc.cum_new, acc.hist_all, tg, self.tab)
        cid = np.repeat(np.arange(acc.conv_ptr.size - 1), np.diff(acc.conv_ptr))
        self.cid = cid

    def v1(self, N: float) -> np.ndarray:
        acc = self.acc
        keep = acc.need <= N
        last = np.zeros(keep.size, bool)
        nxt = np.append(keep[1:], False) & (np.append(self.cid[1:], -1) == self.cid)
        last[keep & ~nxt] = True  # the last admitted turn of each conversation
        return self.tab[last].sum(axis=0) / acc.L


class _Occupancy:
    """G(x) = P(D(W) ≤ x): the probability that the displacement over a tagged gap W stays within x blocks.

    Deterministic (mean-field): D(W) ≈ d(W) = λ0 E_B W + λ0 A ∫₀^W F̄, so G(x) = F(τ(x)) with τ = d⁻¹ (eq. (38)
    with x in place of N). With fluctuations, D(W) given W is approximated by a Gaussian of mean d(W) and
    variance λ0 V₁(W) (:func:`displacement_moments`, Lemma D.1), with a continuity correction of ½ block:
    G(x) = E_W Φ((x + ½ − d(W)) / √(λ0 V₁(W)))."""

    def __init__(
        self,
        acc: EngineAccounting,
        F: Interarrival,
        lam0: float,
        fluctuations: bool,
        k: int = 1024,
        v1: np.ndarray | None = None,
    ):
        self.acc, self.F, self.lam0, self.fluct = acc, F, float(lam0), bool(fluctuations)
        if self.fluct:
            w, p, tg = _fluct_grid(F, k)
            if v1 is None:
                _, v1 = displacement_moments(acc, tg)
            self.w, self.p = w, p
            self.mean = self.lam0 * (acc.E_B * w + acc.A * np.asarray(F.int_sf(w), dtype=float))
            self.sd = np.sqrt(self.lam0 * np.interp(w, tg, v1))

    def tau(self, x: np.ndarray) -> np.ndarray:
        out = np.zeros(x.shape)
        pos = x > 0
        if pos.any():
            out[pos] = theory.solve_T_C(self.acc.E_B, self.acc.A, self.F, self.lam0, x[pos])
        return out

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        G = np.zeros(x.shape)
        ok = x >= 0
        if not ok.any():
            return G
        if not self.fluct:
            G[ok] = np.asarray(self.F.cdf(self.tau(x[ok])), dtype=float)
            return G
        from scipy.special import ndtr

        xs = x[ok]
        out = np.empty(xs.size)
        sd = self.sd
        zero = sd <= 0
        sdz = np.where(zero, 1.0, sd)
        for a in range(0, xs.size, 2048):
            z = (xs[a : a + 2048, None] + 0.5 - self.mean[None, :]) / sdz[None, :]
            g = np.where(zero[None, :], (xs[a : a + 2048, None] >= self.mean[None, :]).astype(float), ndtr(z))
            out[a : a + 2048] = g @ self.p
        G[ok] = out
        return G


def _grid_eval(G: _Occupancy, xs: np.ndarray, max_points: int = 16384) -> np.ndarray:
    """G at the sorted unique integers ``xs`` (exactly, or by linear interpolation from ``max_points`` points
    when the range is wider and fluctuations make G smooth)."""
    if not G.fluct or xs.size <= max_points:
        return G(xs)
    g = np.linspace(xs[0], xs[-1], max_points)
    return np.interp(xs, g, G(g))


def _hits_per_lambda(
    acc: EngineAccounting,
    F: Interarrival,
    lam0: float,
    N: np.ndarray,
    finite: bool,
    partial: bool,
    fluctuations: bool,
    v1: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(h, τ(C)) for the capacities N (1-d) at one λ0 (``v1``: V₁ on :func:`_fluct_grid`'s t grid, if known)."""
    total = acc.A_R * acc.L
    if total <= 0 or acc.E_B <= 0:  # every request rejected (or no full block): nothing can hit
        return np.zeros(N.shape), np.zeros(N.shape)
    G = _Occupancy(acc, F, lam0, fluctuations, v1=v1)
    C = N - acc.cap_offset
    tau = G.tau(np.maximum(C, 0.0))
    if acc.reuse.size == 0:  # no admitted revisit
        return np.zeros(N.shape), tau
    if not finite:
        h = acc.A_hit * acc.L * G(C) / total
        return h, tau
    if acc.mode == "prefix" and partial:
        # Σ_rows Σ_{i<H} G(C − 1 − i) = Σ_h n_h (cumG(C − 1) − cumG(C − 1 − h)), cumG(x) = Σ_{0≤y≤x} G(y)
        hv, nh = np.unique(acc.reuse.astype(np.int64), return_counts=True)
        hi = int(C.max()) - 1
        if hi < 0:
            return np.zeros(N.shape), tau
        lo = max(0, int(C.min()) - 1 - int(hv.max()))
        xs = np.arange(lo, hi + 1, dtype=float)
        cum = np.concatenate([[0.0], np.cumsum(_grid_eval(G, xs))])  # cum[k] = Σ_{y<lo+k} G(y) − Σ_{y<lo} G
        base = G(np.arange(0, lo, dtype=float)).sum() if lo > 0 else 0.0

        def cumG(x):  # Σ_{0 ≤ y ≤ x} G(y), x integer ≥ lo − 1 or < 0
            k = np.clip(x - lo + 1, 0, cum.size - 1).astype(np.int64)
            return np.where(x < 0, 0.0, base + cum[k])

        Ci = C.astype(np.int64)
        top = cumG(Ci - 1)
        hits = (nh[None, :] * (top[:, None] - cumG(Ci[:, None] - 1 - hv[None, :]))).sum(axis=1)
        return acc.unit * hits / total, tau
    # whole content: hit iff D + size ≤ C, weight reuse
    sv, inv = np.unique(acc.size, return_inverse=True)
    ws = np.bincount(inv, weights=acc.reuse, minlength=sv.size)
    x = C[:, None] - sv[None, :]
    xs = np.unique(x[x >= 0])
    Gx = np.zeros(x.shape)
    if xs.size:
        gv = _grid_eval(G, xs) if (xs == np.round(xs)).all() else G(xs)
        pos = x >= 0
        Gx[pos] = gv[np.searchsorted(xs, x[pos])]
    return acc.unit * (Gx @ ws) / total, tau
