"""The curve read from a block sample: the step estimator of SHARDS and the deblurred one (the default).

A sampled pass (:mod:`kvhit.sim.sampled`) gives each kept lookup block ``i`` a threshold ``t_i = s_i + H_i +
⌈K_i / R⌉`` — ``s_i = 1 + e_i`` exact, ``H_i`` the hot entries above it (kept with probability 1, counted
exactly) and ``K_i ~ Binomial(m_i, R)`` the kept ones of the ``m_i`` other entries above it. The block is a hit at
capacity ``N`` iff ``N ≥ N*_i = s_i + H_i + m_i``; what is wanted is the weighted share ``F(N) = Σ w_i 1{N*_i ≤ N}
/ Σ w_i``.

**Step** (SHARDS as published): ``F̂(N) = Σ w_i 1{t_i ≤ N} / Σ w_i``. At rate 1 it is exact; below, its thresholds lie
on a lattice of pitch ``1/R`` (100 blocks at 1 %), so the estimate is a staircase that holds each value over a whole
step while ``F`` keeps rising: measured, this staircase was most of the 1 % error (docs/sampling.md §3).

**Deblurred** (default). Two corrections, both derived, none fitted:

1. *Where each step value belongs.* ``P(Binomial(m, R) ≤ k) = P(T_{k+1} > m)`` with ``T_{k+1}`` the trial of the
   ``(k+1)``-th success (negative binomial, mean ``(k+1)/R``), so the share of lookups with ``K ≤ k`` estimates
   ``E F(T_{k+1} − 1 + s + H)``: to first order ``F`` at ``s + H + (k+1)/R − 1``, the *right* end of the step
   (``k/R`` … ``(k+1)/R``), not its left end. The estimate joins those knots linearly, which is the same as giving
   each lookup a ramp from ``a_i = t_i − 1`` (0) to ``a_i + 1/R`` (1) instead of a step at ``t_i``:

       F̃(N) = Σ w_i · clip((N − a_i) · R, 0, 1) / Σ w_i.

   At rate 1 the ramp is one block long and ``F̃ = F̂`` at every integer ``N`` (exact).
2. *The blur that remains.* ``T_{k+1}`` spreads around its mean with variance ``σ²(N) ≈ (N − 1)(1 − R)/R`` (the
   binomial noise of ``K/R`` at ``m ≈ N``), so ``E F̃ ≈ F + ½ σ² F''``: where the curve bends it is pulled toward
   its chord (concave: too low). One step of deconvolution by central differences at ``± σ(N)`` removes that term:

       F̌(N) = F̃(N) − ½ [F̃(N + σ) + F̃(N − σ) − 2 F̃(N)].

Measured on data not used to design it (``benchmarks/sampling_accuracy.py --heldout --large``, docs/sampling.md §3),
worst salt at 1 %: 0.0036 against the step reading's 0.0230 (ShareGPT-derived, 1.2·10⁶ turns, another seed and
λ0), 0.0016 against 0.0121 (1.2·10⁷ turns). On Mooncake and WEKA the sample-size part dominates: no better there,
on Mooncake 0.001–0.004 worse at 5–25 % (the deconvolution step amplifies sampling noise).

Invariants: rate 1 (or a sample with no non-hot entry: nothing was sampled) gives the step estimator, which is
exact; the estimate is a deterministic function of the thresholds; ``F̃`` is nondecreasing in ``N``.

NOT modelled: ``σ`` counts every entry above as sampled at ``R`` (with hot entries above a block it is an upper
bound, so the correction is then slightly too strong); ``F̌`` is not forced to be monotone (on the measured traces
its dips are below 10⁻³); higher terms of the blur (``σ⁴ F''''``); the noise of *which* lookups are measured.
"""

from __future__ import annotations

import numpy as np

from kvhit.sim.content.stackdist import content_curve_from_thresholds

__all__ = ["ESTIMATORS", "id_ranks", "sampled_hits", "sampling_se"]

ESTIMATORS: tuple[str, ...] = ("deblurred", "step")
_NEVER = np.iinfo(np.int64).max


class _Ramps:
    """``Σ w_i clip((N − a_i)/ℓ, 0, 1)`` for many ``N``: the ``a_i`` grouped by value (integers), prefix sums."""

    def __init__(self, thr: np.ndarray, w: np.ndarray, ell: float):
        fin = thr < _NEVER
        a, inv = np.unique(thr[fin] - 1, return_inverse=True)
        ww = np.bincount(inv, weights=w[fin], minlength=a.size)
        self.a = a.astype(np.float64)
        base = self.a[0] if a.size else 0.0
        self.cw = np.concatenate([[0.0], np.cumsum(ww)])
        self.cwa = np.concatenate([[0.0], np.cumsum(ww * (self.a - base))])  # centred: smaller sums
        self.base = base
        self.ell = float(ell)

    def __call__(self, N: np.ndarray) -> np.ndarray:
        N = np.asarray(N, np.float64)
        j1 = np.searchsorted(self.a, N, side="right")  # a_i ≤ N: the ramp has started
        j2 = np.searchsorted(self.a, N - self.ell, side="right")  # a_i + ℓ ≤ N: the ramp is complete
        inside = (N - self.base) * (self.cw[j1] - self.cw[j2]) - (self.cwa[j1] - self.cwa[j2])
        return self.cw[j2] + inside / self.ell


_SHARE_BINS = 64


def _sampled_share(thr: np.ndarray, w: np.ndarray, K: np.ndarray, rate: float, N: np.ndarray) -> np.ndarray:
    """The share of the entries above a lookup that were sampled at ``rate`` (not hot), as a function of its
    threshold: ``Σ w_i K_i/R / Σ w_i (t_i − 1)`` over the lookups in each of :data:`_SHARE_BINS` log-spaced bins of
    ``t``, interpolated in ``log N`` (1 where no lookup lies). ``σ²(N) = share · (N − 1)(1 − R)/R``."""
    fin = (thr < _NEVER) & (thr > 1)
    if not fin.any():
        return np.ones(N.shape)
    a = (thr[fin] - 1).astype(np.float64)
    ww = w[fin]
    edges = np.geomspace(a.min(), a.max() * (1 + 1e-12) + 1, _SHARE_BINS + 1)
    b = np.clip(np.searchsorted(edges, a, side="right") - 1, 0, _SHARE_BINS - 1)
    num = np.bincount(b, weights=ww * K[fin] / rate, minlength=_SHARE_BINS)
    den = np.bincount(b, weights=ww * a, minlength=_SHARE_BINS)
    ok = den > 0
    share = np.clip(num[ok] / den[ok], 0.0, 1.0)
    mid = np.sqrt(edges[:-1] * edges[1:])[ok]
    return np.interp(np.log(np.maximum(N, 1.0)), np.log(mid), share)


def sampled_hits(
    thresholds: np.ndarray,
    weights: np.ndarray | None,
    rate: float,
    Ns,
    *,
    estimator: str = "deblurred",
    exact: bool = False,
    kept_above: np.ndarray | None = None,
) -> np.ndarray:
    """``Σ w_i · (estimated 1{N*_i ≤ N})`` at each capacity (the module docstring's ``F`` times ``Σ w_i``).

    ``thresholds``: ``t_i`` of the kept lookups (``NEVER`` = int64 max: not cached before, never a hit);
    ``weights``: ``w_i`` (``None``: all 1); ``exact``: the thresholds carry no sampling noise (rate 1, or no
    non-hot entry kept) — the step estimator is then used whatever ``estimator`` says; ``kept_above``: ``K_i`` per
    lookup where hot ids exist (``σ`` then counts the sampled entries only, :func:`_sampled_share`)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator: expected one of {ESTIMATORS}, got {estimator!r}")
    thr = np.asarray(thresholds, np.int64)
    Ns = np.asarray(Ns, np.int64)
    if thr.size == 0:
        return np.zeros(Ns.shape)
    if estimator == "step" or exact or rate >= 1.0:  # Σ w_i 1{t_i ≤ N}
        return content_curve_from_thresholds(thr, np.ones(thr.shape[0], np.int64) if weights is None else weights, Ns)
    w = np.ones(thr.shape[0]) if weights is None else np.asarray(weights, np.float64)
    ramps = _Ramps(thr, w, 1.0 / rate)
    N = Ns.astype(np.float64)
    above = np.maximum(N - 1.0, 0.0)
    if kept_above is not None:
        above = above * _sampled_share(thr, w, np.asarray(kept_above), rate, N)
    sig = np.sqrt(above * (1.0 - rate) / rate)
    f0 = ramps(N)
    return f0 - 0.5 * (ramps(N + sig) + ramps(N - sig) - 2.0 * f0)


# --------------------------------------------------------------------------------------------------
# the sample-size part of the error
# --------------------------------------------------------------------------------------------------


def id_ranks(ids: np.ndarray, thresholds: np.ndarray, hot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per kept lookup: its rank (1-based) among the lookups of its id ordered by threshold, and how many lookups
    that id has (both 0 for a hot id, which is in every sample). Inputs of :func:`sampling_se`."""
    n = ids.shape[0]
    rank = np.zeros(n, np.int32)
    group = np.zeros(n, np.int32)
    cold = np.flatnonzero(~np.asarray(hot, bool))
    if cold.size == 0:
        return rank, group
    o = cold[np.lexsort((thresholds[cold], ids[cold]))]
    x = ids[o]
    start = np.flatnonzero(np.concatenate([[True], x[1:] != x[:-1]]))
    size = np.diff(np.concatenate([start, [x.size]]))
    first = np.repeat(start, size)
    rank[o] = (np.arange(x.size) - first + 1).astype(np.int32)
    group[o] = np.repeat(size, size).astype(np.int32)
    return rank, group


def sampling_se(thresholds, id_rank, id_lookups, weights, rate: float, Ns) -> np.ndarray:
    """Standard error of the step reading ``F̂(N) = Σ w_a 1{t_a ≤ N} / Σ w_a`` from which ids were kept, each
    independently with probability ``rate`` (hot ids always): the linearised Horvitz–Thompson variance of a ratio,

        Var F̂(N) ≈ (1 − R)/R² · Σ_{kept ids j} (c_j(N) − F̂(N) n_j)² / (Σ_a w_a)²,

    ``c_j(N)`` = the id's lookups with ``t ≤ N``, ``n_j`` its lookups. ``Σ_j c_j²`` is ``Σ_a (2 r_a − 1) 1{t_a ≤
    N}`` with ``r_a`` the lookup's rank within its id (pairs of lookups counted once each way), ``Σ_j c_j n_j`` is
    ``Σ_a n_{j(a)} 1{t_a ≤ N}``. It is the error of the sample *size* only, for either reading: it leaves out the
    noise of the thresholds themselves (which ids above a block were kept), so it is a lower bound of the spread
    over salts (measured in docs/sampling.md §2)."""
    thr = np.asarray(thresholds, np.int64)
    Ns = np.asarray(Ns, np.int64)
    r = np.asarray(id_rank, np.float64)
    g = np.asarray(id_lookups, np.float64)
    w = np.ones(thr.shape[0]) / rate if weights is None else np.asarray(weights, np.float64)
    cold = g > 0
    # three sums over the lookups with t ≤ N, each one bucket pass (no sort of the thresholds)
    A = content_curve_from_thresholds(thr, w, Ns)
    B = float(w.sum())
    F = A / B
    S2 = content_curve_from_thresholds(thr, np.where(cold, 2 * r - 1, 0.0), Ns)
    S1 = content_curve_from_thresholds(thr, np.where(cold, g, 0.0), Ns)
    # Σ_j n_j² over the kept cold ids: each lookup of id j adds n_j, so Σ_a n_{j(a)} = Σ_j n_j²
    S0 = float(g[cold].sum())
    var = (1.0 - rate) / rate**2 * np.maximum(S2 - 2 * F * S1 + F * F * S0, 0.0) / B**2
    return np.sqrt(var)
