"""Mean-field theory of the multi-turn conversation model under whole-content LRU (§3, App. B.3, C.1, C.2).

From a :class:`~kvhit.workload.spec.WorkloadSpec` this module computes

* the workload moments of App. B.3 (:func:`moments`): S_j = P(M ≥ j) (eq. (7)), p_j = S_{j+1}/S_j (eq. (8)),
  R̄_j = E[R_j], A_R = Σ_j S_j R̄_j (eq. (9)), A_H = Σ_j S_{j+1} R̄_j (eq. (10)), h_max = A_H/A_R (eq. (11)),
  A_H_hash = A_H − E[M − 1] (eq. (28)) and E[B] = E[R_M] (eq. (1));
* the mean displacement curve d(t) = λ0 E[B] t + λ0 A ∫₀ᵗ F̄ (eq. (15), with A = A_H; eq. (29), with
  A = A_H_hash, for the practical model) and the characteristic time T_C = d⁻¹(1) (eq. (21), (30));
* the mean-field hit ratios h(∞) = (A_H/A_R) F(T_C) (eq. (25)) and h_prac(∞) = (A_H_hash/A_R) F(T_C^prac)
  (eq. (32)).

Two readings of λ0. In the mean-field regime (App. B.5) the system with capacity N receives conversations at
rate N λ0, and T_C solves d(t) = 1 with the *per-capacity* rate λ0 (eq. (21)). A physical system with capacity
N and (unscaled) arrival rate λ0 instead solves the threshold form of eq. (38),
λ0 E[B] t + λ0 A ∫₀ᵗ F̄ = N, which is the same equation with λ0 replaced by λ0/N. Every solver here takes the
threshold form with ``N`` (``N = 1`` gives eq. (21)); the equation only depends on y = N/λ0, and the left side
g(t) = E[B] t + A ∫₀ᵗ F̄ is increasing and concave with g'(t) ≥ E[B] > 0, so the root is unique and is found
by a vectorized monotone Newton iteration with a rigorous error bound (:func:`solve_T_C`).

The same solver serves the trace estimator of :mod:`kvhit.estimate.mean_field` (eq. (38)–(39)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvhit.workload.dists import EmpiricalW, Geometric, IntDist, Interarrival
from kvhit.workload.spec import EmpiricalConversations, WorkloadSpec

__all__ = [
    "TheoryError",
    "TruncationBound",
    "Moments",
    "moments",
    "d",
    "T_C",
    "solve_T_C",
    "mean_field",
    "h_infinity",
    "h_prac_infinity",
    "h_mean_field",
]

_EPS = np.finfo(float).eps


class TheoryError(ValueError):
    """Invalid input to the mean-field formulas (the message names the offending field)."""


# ----------------------------------------------------------------------------------------------------------
# Workload moments (App. B.3)
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TruncationBound:
    """Rigorous upper bounds on the omitted tails of the series for A_R (eq. (9)), A_H (eq. (10)) and
    E[B]; all zero when the sums are exact. A_H_hash = A_H − E[M−1] inherits A_H's bound (E[M] is exact)."""

    A_R: float = 0.0
    A_H: float = 0.0
    E_B: float = 0.0


@dataclass(frozen=True, eq=False)
class Moments:
    """Workload moments of App. B.3 and C.2.

    Attributes:
        S: S_j = P(M ≥ j) for j = 1..J (eq. (7)); ``S[0]`` is S_1 = 1.
        p: continuation probabilities p_j = S_{j+1}/S_j for j = 1..J (eq. (8)); NaN where S_j = 0.
        R_bar: R̄_j = E[R_j] for j = 1..J (for joint empirical conversations: E[R_j | M ≥ j]).
        A_R: E[Σ_{j≤M} R_j] (eq. (9)).
        A_H: E[Σ_{j<M} R_j] (eq. (10)).
        A_H_hash: A_H − E[M − 1] (eq. (28)).
        E_B: E[B] = E[R_M] (eq. (1)).
        E_M, Var_M: mean and variance of the turn count M.
        h_max: A_H/A_R, the intrinsic reuse potential (eq. (11)).
        truncation_J: J, the last index summed term by term (the arrays above have length J); for geometric M
            this is ``stationary_from`` and the rest of each series is summed in closed form.
        truncation_error_bound: bounds of the omitted tails (zero when exact).
        method: ``"finite"`` (finite support of M, exact), ``"geometric"`` (geometric M with E[Z_j] constant
            from ``stationary_from`` on: arithmetico-geometric tails summed exactly), ``"truncated"`` (series
            truncated at J with a bound) or ``"empirical"`` (joint (M, Z) sequences, exact averages).
    """

    S: np.ndarray
    p: np.ndarray
    R_bar: np.ndarray
    A_R: float
    A_H: float
    A_H_hash: float
    E_B: float
    E_M: float
    Var_M: float
    h_max: float
    truncation_J: int
    truncation_error_bound: TruncationBound
    method: str

    @property
    def h_max_hash(self) -> float:
        """A_H_hash/A_R: the reuse ceiling of the practical model (the factor in eq. (32))."""
        return self.A_H_hash / self.A_R

    def A(self, practical: bool = False) -> float:
        """The reuse workload entering d(t): A_H (eq. (15)) or A_H_hash (eq. (29)) when ``practical``."""
        return self.A_H_hash if practical else self.A_H


def _finalize(S, S_next, R_bar, A_R, A_H, E_B, E_M, Var_M, J, bound, method) -> Moments:
    S = np.asarray(S, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(S > 0, np.concatenate([S[1:], [S_next]]) / S, np.nan)
    A_H_hash = A_H - (E_M - 1.0)
    return Moments(
        S=S,
        p=p,
        R_bar=np.asarray(R_bar, dtype=float),
        A_R=float(A_R),
        A_H=float(A_H),
        A_H_hash=float(A_H_hash),
        E_B=float(E_B),
        E_M=float(E_M),
        Var_M=float(Var_M),
        h_max=float(A_H / A_R),
        truncation_J=int(J),
        truncation_error_bound=bound,
        method=method,
    )


def _empirical_moments(inc: EmpiricalConversations) -> Moments:
    """Exact moments of the resampled-sequence model: averages over the sequences (Assumption B.2 is not
    assumed, so A_H is computed directly rather than from eq. (10))."""
    seqs = inc.sequences
    lengths = np.array([s.size for s in seqs], dtype=np.int64)
    J = int(lengths.max())
    n = lengths.size
    sum_R = np.empty(n)
    B = np.empty(n)
    Rsum_by_j = np.zeros(J)
    for i, s in enumerate(seqs):
        R = np.cumsum(s, dtype=np.float64)
        sum_R[i] = R.sum()
        B[i] = R[-1]
        Rsum_by_j[: R.size] += R
    reach = np.bincount(lengths, minlength=J + 2)[::-1].cumsum()[::-1]  # reach[j] = #{M_i ≥ j}
    S = reach[1 : J + 1] / n
    with np.errstate(divide="ignore", invalid="ignore"):
        R_bar = Rsum_by_j / reach[1 : J + 1]
    A_R = float(np.mean(sum_R))
    A_H = float(np.mean(sum_R - B))
    E_M = float(np.mean(lengths))
    return _finalize(
        S,
        0.0,
        R_bar,
        A_R,
        A_H,
        float(np.mean(B)),
        E_M,
        float(np.var(lengths)),
        J,
        TruncationBound(),
        "empirical",
    )


def _mean_Z(spec: WorkloadSpec, J: int) -> np.ndarray:
    j = np.arange(1, J + 1)
    mz = np.asarray(spec.increments.mean_Z(j), dtype=float)
    if mz.shape != (J,):
        raise TheoryError(f"increments.mean_Z returned shape {mz.shape}, expected ({J},)")
    if not np.isfinite(mz).all() or (mz < 1).any():
        k = int(np.argmax(~np.isfinite(mz) | (mz < 1)))
        raise TheoryError(f"increments: E[Z_{k + 1}] = {mz[k]!r}, must be finite and ≥ 1 (Assumption B.2)")
    return mz


def _tail_mean(spec: WorkloadSpec) -> float:
    c = float(spec.increments.mean_Z_tail)
    if not math.isfinite(c) or c < 1:
        raise TheoryError(f"increments.mean_Z_tail = {c!r}: need a finite stationary mean E[Z_j] ≥ 1")
    return c


def moments(spec: WorkloadSpec, tol: float = 1e-12, *, max_terms: int = 1 << 22) -> Moments:
    """Workload moments S_j, p_j, R̄_j, A_R (eq. (9)), A_H (eq. (10)), A_H_hash (eq. (28)), E[B], E[M], Var M,
    h_max (eq. (11)) of a :class:`WorkloadSpec`.

    Under Assumption B.2 (Z independent of M) R̄_j = Σ_{ℓ≤j} E[Z_ℓ] and E[B] = E[R̄_M] = Σ_j S_j E[Z_j].

    * M with finite support (``max_value ≤ max_terms``): exact finite sums.
    * M :class:`~kvhit.workload.dists.Geometric` (S_j = p^{j−1}) and E[Z_j] = c for j ≥ J0
      (``increments.stationary_from``): R̄_j is affine past J0, the tails are arithmetico-geometric series,
      summed in closed form (error 0).
    * Otherwise A_R = E[C(M)] with C(m) = Σ_{j≤m} R̄_j, A_H = E[C(M−1)] and E[B] = E[R̄_M] are summed over
      M = m ≤ J, J doubling from max(J0, 32) until a rigorous bound of the omitted part, from R̄_j ≤ z̄ j
      (z̄ = sup_j E[Z_j]): E[C(M); M>J] ≤ z̄ E[M(M+1)/2; M>J], evaluated as the exact moment minus its partial
      pmf sum plus a floating-point guard, is ≤ ``tol`` × the partial sum for each of A_R, A_H and E[B]; the
      bounds are reported in ``truncation_error_bound``. Raises :class:`TheoryError` if ``max_terms`` terms do
      not reach ``tol`` (heavy-tailed M); needs E[M²] < ∞.
    * :class:`~kvhit.workload.spec.EmpiricalConversations` (M drawn jointly with the Z's): exact averages over
      the sequences; R̄_j is then E[R_j | M ≥ j] and eq. (10) is not used.
    """
    if not isinstance(spec, WorkloadSpec):
        raise TheoryError(f"spec: expected a WorkloadSpec, got {type(spec).__name__}")
    tol = float(tol)
    if not (tol > 0 and math.isfinite(tol)):
        raise TheoryError(f"tol must be a finite number > 0, got {tol!r}")
    if isinstance(spec.increments, EmpiricalConversations):
        return _empirical_moments(spec.increments)
    M: IntDist = spec.M
    J0 = max(int(spec.increments.stationary_from), 1)

    if math.isfinite(M.max_value) and M.max_value <= max_terms:
        J = int(M.max_value)
        S = np.asarray(M.sf_ge(np.arange(1, J + 1)), dtype=float)
        mz = _mean_Z(spec, J)
        R_bar = np.cumsum(mz)
        S_next = np.append(S[1:], 0.0)
        return _finalize(
            S, 0.0, R_bar, S @ R_bar, S_next @ R_bar, S @ mz, M.mean, M.var, J, TruncationBound(), "finite"
        )

    if isinstance(M, Geometric):
        p = float(M.p)
        c = _tail_mean(spec)
        # explicit head j ≤ J = J0 (where E[Z_j] may still vary), everything beyond in closed form
        J = J0
        j = np.arange(1, J + 1)
        S = p ** (j - 1.0)
        mz = _mean_Z(spec, J)
        R_bar = np.cumsum(mz)
        q = 1.0 - p
        pJ = p**J
        # Σ_{j>J} p^{j−1}(R̄_J + c(j−J)) = p^J [R̄_J/q + c/q²];  Σ_{j>J} S_{j+1} R̄_j = p × that
        tail_R = pJ * (R_bar[-1] / q + c / q**2)
        A_R = S @ R_bar + tail_R
        A_H = (p * S) @ R_bar + p * tail_R
        E_B = S @ mz + c * pJ / q
        return _finalize(S, pJ, R_bar, A_R, A_H, E_B, 1.0 / q, p / q**2, J, TruncationBound(), "geometric")

    return _truncated_moments(spec, M, J0, tol, max_terms)


def _truncated_moments(spec: WorkloadSpec, M: IntDist, J0: int, tol: float, max_terms: int) -> Moments:
    """Series truncated in the turn count: with C(m) = Σ_{j≤m} R̄_j, A_R = E[C(M)], A_H = E[C(M−1)] and
    E[B] = E[R̄_M] are summed over m ≤ J from the pmf alone (tail probabilities from scipy may carry
    absolute errors of ~1e-16, which the J² weights of eq. (9) would amplify); the omitted parts are bounded
    with R̄_j ≤ z̄ j: E[C(M); M>J] ≤ z̄ E[M(M+1)/2; M>J], E[C(M−1); M>J] ≤ z̄ E[M(M−1)/2; M>J],
    E[R̄_M; M>J] ≤ z̄ E[M; M>J], each evaluated as an exact moment of M minus its partial pmf sum, plus a
    floating-point guard of 16 ulps of the moment."""
    E_M = float(M.mean)
    E_M2 = float(M.second_moment)
    if not (math.isfinite(E_M2) and math.isfinite(E_M)):
        raise TheoryError("turns: A_R = E[Σ_{j≤M} R_j] needs E[M²] < ∞; the turn distribution has E[M²] = ∞")
    c = _tail_mean(spec)
    head = np.asarray(spec.increments.mean_Z(np.arange(1, J0 + 1)), dtype=float)
    z_sup = float(max(np.max(head), c))
    E_up = 0.5 * (E_M2 + E_M)  # E[M(M+1)/2]
    E_dn = 0.5 * (E_M2 - E_M)  # E[M(M−1)/2]
    J = max(J0, 32)
    while True:
        m = np.arange(1, J + 1, dtype=float)
        pmf = np.asarray(M.pmf(m), dtype=float)
        mz = _mean_Z(spec, J)
        R_bar = np.cumsum(mz)
        C = np.cumsum(R_bar)
        A_R = math.fsum(pmf * C)
        A_H = math.fsum(pmf[1:] * C[:-1])
        E_B = math.fsum(pmf * R_bar)
        g = 16 * _EPS
        b_R = z_sup * (max(E_up - math.fsum(pmf * m * (m + 1) / 2), 0.0) + g * E_up)
        b_H = z_sup * (max(E_dn - math.fsum(pmf * m * (m - 1) / 2), 0.0) + g * E_up)
        b_B = z_sup * (max(E_M - math.fsum(pmf * m), 0.0) + g * E_M)
        if b_R <= tol * A_R and b_H <= tol * A_H and b_B <= tol * E_B:
            break
        if J >= max_terms:
            raise TheoryError(
                f"turns: the series for A_R/A_H/E[B] did not reach tol={tol:g} within max_terms={max_terms} "
                f"terms (tail bound {b_R:.3g} for A_R ≈ {A_R:.6g}); raise tol or max_terms"
            )
        J = min(2 * J, max_terms)
    S_next = float(np.asarray(M.sf_ge(np.array([J + 1.0]))).ravel()[0])
    S = S_next + np.cumsum(pmf[::-1])[::-1]  # S_j = P(M > J) + Σ_{j≤m≤J} P(M = m) (reported, not summed)
    return _finalize(
        S,
        S_next,
        R_bar,
        A_R,
        A_H,
        E_B,
        E_M,
        M.var,
        J,
        TruncationBound(float(b_R), float(b_H), float(b_B)),
        "truncated",
    )


# ----------------------------------------------------------------------------------------------------------
# Displacement curve and characteristic time (App. C.1, C.2)
# ----------------------------------------------------------------------------------------------------------


def _positive(name: str, x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.size == 0:
        raise TheoryError(f"{name}: empty")
    if not np.isfinite(a).all() or (a <= 0).any():
        bad = a.ravel()[np.argmax(~np.isfinite(a.ravel()) | (a.ravel() <= 0))]
        raise TheoryError(f"{name} must be finite and > 0, got {bad!r}")
    return a


def _check_reuse(E_B: float, A: float) -> tuple[float, float]:
    E_B, A = float(E_B), float(A)
    if not (math.isfinite(E_B) and E_B > 0):
        raise TheoryError(f"E_B must be finite and > 0 (every conversation has B ≥ 1), got {E_B!r}")
    if not (math.isfinite(A) and A >= 0):
        raise TheoryError(f"A (A_H or A_H_hash) must be finite and ≥ 0, got {A!r}")
    return E_B, A


def _check_F(F: Any) -> Interarrival:
    if not isinstance(F, Interarrival):
        raise TheoryError(f"F: expected an Interarrival distribution, got {type(F).__name__}")
    return F


def _solve_empirical(E_B: float, A: float, F: EmpiricalW, y: np.ndarray) -> np.ndarray:
    """Exact root of E_B t + A ∫₀ᵗ F̂̄ = y for the empirical F̂: ∫₀ᵗ F̂̄ = (1/n) Σ min(w_i, t) is piecewise linear
    with knots at the sorted samples, so the root is found by a search over the knot values and one linear
    solve on the right segment."""
    w = F.samples
    n = w.size
    cs = np.concatenate([[0.0], np.cumsum(w)])
    k = np.arange(1, n + 1)
    g_knots = E_B * w + A * (cs[1:] + w * (n - k)) / n  # g(w_(k)), nondecreasing
    # kk = number of knots with g ≤ y: on [w_(kk), w_(kk+1)] G has slope (n − kk)/n
    kk = np.searchsorted(g_knots, y, side="right")
    return (y - A * cs[kk] / n) / (E_B + A * (n - kk) / n)


def solve_T_C(
    E_B: float,
    A: float,
    F: Interarrival,
    lam0: Any,
    N: Any = 1.0,
    *,
    rtol: float = 1e-13,
    max_iter: int = 200,
) -> np.ndarray:
    """The unique root t ≥ 0 of λ0 E[B] t + λ0 A ∫₀ᵗ F̄(u) du = N (eq. (21)/(30) with ``N = 1``; eq. (38) with
    the unscaled λ0 and capacity N), vectorized over broadcast arrays ``lam0`` and ``N``.

    The root depends only on y = N/λ0 through g(t) = E[B] t + A ∫₀ᵗ F̄ = y. g is increasing and concave with
    g'(t) = E[B] + A F̄(t) ≥ E[B], so y/(E[B]+A) ∨ (y − A μ_F)/E[B] ≤ t ≤ y/E[B] brackets the root, Newton
    steps from the left stay on the left and increase monotonically, and |t − T_C| ≤ (y − g(t))/E[B];
    iteration stops when that bound is ≤ ``rtol``·t. Any point that fails to converge is finished by
    ``scipy.optimize.brentq``. For an :class:`~kvhit.workload.dists.EmpiricalW` F̂ the root is exact.
    Returns an array of the broadcast shape (0-d for scalar inputs).
    """
    E_B, A = _check_reuse(E_B, A)
    F = _check_F(F)
    lam0 = _positive("lam0", lam0)
    N = _positive("N", N)
    y = np.asarray(N / lam0, dtype=float)
    shape = y.shape
    y = y.ravel()
    if A == 0.0:
        return (y / E_B).reshape(shape)
    if isinstance(F, EmpiricalW):
        return _solve_empirical(E_B, A, F, y).reshape(shape)
    mu = float(F.mean)
    lo = np.maximum(y / (E_B + A), (y - A * mu) / E_B)
    hi = y / E_B
    t = lo.copy()
    active = np.arange(y.size)
    for _ in range(max_iter):
        if active.size == 0:
            break
        ta = t[active]
        ya = y[active]
        r = ya - (E_B * ta + A * np.asarray(F.int_sf(ta), dtype=float).reshape(ta.shape))
        done = np.abs(r) <= E_B * rtol * np.maximum(ta, _EPS) + 4 * _EPS * ya
        slope = E_B + A * np.asarray(F.sf(ta), dtype=float).reshape(ta.shape)
        tn = np.clip(ta + r / slope, lo[active], hi[active])
        stalled = tn == ta
        t[active] = np.where(done, ta, tn)
        active = active[~(done | stalled)]
    if active.size:  # not converged (should not happen): finish with brentq on the rigorous bracket
        for i in active:
            yi = float(y[i])

            def f(s, yi=yi):
                return E_B * s + A * float(np.asarray(F.int_sf(s))) - yi

            a_, b_ = float(lo[i]), float(hi[i])
            if f(a_) >= 0:
                t[i] = a_
            elif f(b_) <= 0:
                t[i] = b_
            else:
                from scipy.optimize import brentq  # lazy: scipy.optimize costs ~0.7 s of import

                t[i] = brentq(f, a_, b_, xtol=1e-300, rtol=4 * _EPS, maxiter=500)
    return t.reshape(shape)


def _moments_like(source: Any) -> Any:
    for attr in ("A_R", "A_H", "A_H_hash", "E_B"):
        if not hasattr(source, attr):
            raise TheoryError(
                f"source: expected a WorkloadSpec or a moments object with A_R, A_H, A_H_hash, E_B; "
                f"{type(source).__name__} has no {attr!r}"
            )
    return source


def _resolve(source: Any, F: Interarrival | None, lam0: Any) -> tuple[Any, Interarrival, Any]:
    """(moments, F, λ0) from a spec (its own F and λ0 by default) or a moments object (F and λ0 required)."""
    if isinstance(source, WorkloadSpec):
        return (
            moments(source),
            (source.interarrival if F is None else F),
            (source.lam0 if lam0 is None else lam0),
        )
    mom = _moments_like(source)
    if F is None:
        raise TheoryError("F: the interarrival distribution is required when the source is not a WorkloadSpec")
    if lam0 is None:
        raise TheoryError("lam0: the arrival rate λ0 is required when the source is not a WorkloadSpec")
    return mom, F, lam0


def _out(x: np.ndarray) -> Any:
    return float(x) if np.ndim(x) == 0 else x


def d(t: Any, source: Any, F: Interarrival | None = None, *, lam0: Any = None, practical: bool = False) -> Any:
    """Mean displacement curve d(t) = λ0 E[B] t + λ0 A ∫₀ᵗ F̄(u) du with A = A_H (eq. (15)) or A = A_H_hash
    (d_prac, eq. (29)) when ``practical``; vectorized in ``t`` (``lam0`` broadcasts against it).

    ``source`` is a :class:`WorkloadSpec` (λ0 and F default to the spec's) or a moments object
    (:class:`Moments`, :class:`kvhit.estimate.trace_stats.TraceMoments`), in which case ``F`` and ``lam0`` are required.
    """
    mom, F, lam0 = _resolve(source, F, lam0)
    F = _check_F(F)
    lam0 = _positive("lam0", lam0)
    t = np.asarray(t, dtype=float)
    if not np.isfinite(t).all() or (t < 0).any():
        raise TheoryError("t must be finite and ≥ 0")
    A = mom.A_H_hash if practical else mom.A_H
    E_B, A = _check_reuse(mom.E_B, A)
    return _out(lam0 * (E_B * t + A * np.asarray(F.int_sf(t), dtype=float)))


def T_C(source: Any, F: Interarrival | None = None, *, N: Any = 1.0, lam0: Any = None, practical: bool = False) -> Any:
    """Characteristic time: the root of d(t) = N, i.e. T_C = d⁻¹(1) (eq. (21)) or T_C^prac (eq. (30)) for
    ``N = 1`` with the per-capacity rate λ0 of the mean-field scaling, or the threshold form of eq. (38)
    (λ0 E[B] t + λ0 A ∫₀ᵗ F̄ = N, unscaled λ0) for a capacity ``N``. ``N`` and ``lam0`` may be arrays
    (broadcast). See :func:`solve_T_C`."""
    mom, F, lam0 = _resolve(source, F, lam0)
    A = mom.A_H_hash if practical else mom.A_H
    return _out(solve_T_C(mom.E_B, A, F, lam0, N))


def mean_field(
    A_R: float, A: float, E_B: float, F: Interarrival, lam0: Any, N: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shared core of eq. (25), (32) and (38)–(39): returns (h, T_C, F(T_C)) with h = (A/A_R) F(T_C), T_C
    solves λ0 E[B] t + λ0 A ∫₀ᵗ F̄ = N (broadcast over ``lam0`` and ``N``)."""
    A_R = float(A_R)
    if not (math.isfinite(A_R) and A_R > 0):
        raise TheoryError(f"A_R must be finite and > 0, got {A_R!r}")
    tc = solve_T_C(E_B, A, F, lam0, N)
    Ft = np.asarray(F.cdf(tc), dtype=float).reshape(tc.shape)
    return (float(A) / A_R) * Ft, tc, Ft


def h_mean_field(
    spec: WorkloadSpec, N: Any, *, lam0: Any = None, F: Interarrival | None = None, practical: bool = False
) -> Any:
    """Mean-field hit ratio of a physical system with capacity ``N`` and unscaled arrival rate λ0 (default
    ``spec.lam0``): (A/A_R)·F(T_C(N)) with T_C(N) the root of λ0 E[B] t + λ0 A ∫₀ᵗ F̄ = N;
    A = A_H (eq. (25)) or A_H_hash (eq. (32)/(39)) when ``practical``. Vectorized over ``N`` and ``lam0``."""
    if not isinstance(spec, WorkloadSpec):
        raise TheoryError(f"spec: expected a WorkloadSpec, got {type(spec).__name__}")
    mom, F, lam0 = _resolve(spec, F, lam0)
    h, _, _ = mean_field(mom.A_R, mom.A(practical), mom.E_B, _check_F(F), lam0, N)
    return _out(h)


def h_infinity(spec: WorkloadSpec) -> float:
    """h(∞) = (A_H/A_R) F(T_C) with d(T_C) = 1 (eq. (25)), with ``spec.lam0`` read as the per-capacity λ0 of
    the mean-field scaling λ0^(N) = N λ0 (App. B.5). For a physical rate Λ and capacity N this equals
    ``h_mean_field(spec.with_lam0(Λ), N)``, i.e. λ0 = Λ/N."""
    return float(h_mean_field(spec, 1.0))


def h_prac_infinity(spec: WorkloadSpec) -> float:
    """h_prac(∞) = (A_H_hash/A_R) F(T_C^prac) with d_prac(T_C^prac) = 1 (eq. (32)); λ0 read as in
    :func:`h_infinity`."""
    return float(h_mean_field(spec, 1.0, practical=True))
