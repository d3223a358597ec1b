"""kvhit.estimate.theory: workload moments (App. B.3, eq. (7)–(11), (28)) against closed forms and independent sums;
d(t), T_C (eq. (15), (21), (29), (30), (38)) against closed-form roots and brentq; h(∞) (eq. (25), (32))."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy import optimize, special, stats

from kvhit.estimate import theory
from kvhit.workload import (
    Constant,
    Deterministic,
    EmpiricalConversations,
    EmpiricalW,
    Exponential,
    FinitePMF,
    GammaW,
    Geometric,
    IIDIncrements,
    LogNormalW,
    PromptResponse,
    ScipyInt,
    ScipyW,
    TurnDependent,
    WorkloadSpec,
)

# ----------------------------------------------------------------------------------------------------------
# moments
# ----------------------------------------------------------------------------------------------------------


def _int(kind: str, mean: float):
    return Constant(int(mean)) if kind == "const" else Geometric.from_mean(mean)


@settings(max_examples=60, deadline=None)
@given(
    p=st.floats(0.0, 0.98),
    k=st.integers(1, 20),
    m=st.integers(1, 20),
    xk=st.sampled_from(["const", "geom"]),
    yk=st.sampled_from(["const", "geom"]),
)
def test_scm_closed_forms(p, k, m, xk, yk):
    """App. B.3: A_R = (k + pm)/q², A_H = p(k + pm)/q², h_max = p; E[B] = k+(k+m)p/q; A_H_hash = A_H − p/q."""
    spec = WorkloadSpec.scm(1.0, p, x=_int(xk, k), y=_int(yk, m), mean_w=3.0)
    mom = theory.moments(spec)
    q = 1 - p
    assert mom.method == "geometric"
    assert mom.A_R == pytest.approx((k + p * m) / q**2, rel=1e-12)
    assert mom.A_H == pytest.approx(p * (k + p * m) / q**2, rel=1e-12, abs=1e-12)
    assert mom.h_max == pytest.approx(p, rel=1e-12, abs=1e-13)
    assert mom.E_B == pytest.approx(k + (k + m) * p / q, rel=1e-12)
    assert mom.E_M == pytest.approx(1 / q, rel=1e-14)
    assert mom.Var_M == pytest.approx(p / q**2, rel=1e-12, abs=1e-14)
    assert mom.A_H_hash == pytest.approx(mom.A_H - p / q, rel=1e-12, abs=1e-12)
    assert mom.truncation_error_bound == theory.TruncationBound(0.0, 0.0, 0.0)
    np.testing.assert_allclose(mom.S, p ** np.arange(mom.S.size), rtol=1e-12)
    np.testing.assert_allclose(mom.R_bar, np.arange(1, mom.S.size + 1) * (k + m) - m, rtol=1e-14)
    ok = mom.S > 1e-200  # p_j = S_{j+1}/S_j wherever no underflow
    np.testing.assert_allclose(mom.p[:-1][ok[1:]], p, rtol=1e-12)


def test_three_turn_example():
    """App. B.3: X = (2, 4, 3), Y = (2, 5) → R = (2, 8, 16), A_R = 26, A_H = 10, h_max = 10/26."""
    spec = WorkloadSpec(
        1.0, Constant(3), TurnDependent((Constant(2), Constant(4 + 2), Constant(3 + 5))), Exponential(1.0)
    )
    mom = theory.moments(spec)
    assert mom.method == "finite"
    assert mom.A_R == 26 and mom.A_H == 10 and mom.A_H_hash == 8 and mom.E_B == 16
    assert mom.h_max == pytest.approx(10 / 26, rel=1e-15)
    np.testing.assert_array_equal(mom.R_bar, [2, 8, 16])
    np.testing.assert_array_equal(mom.S, [1, 1, 1])
    np.testing.assert_array_equal(mom.p, [1, 1, 0])
    assert mom.E_M == 3 and mom.Var_M == 0


TURNS = [
    Geometric(0.6),
    FinitePMF((1, 2, 5, 9), (0.4, 0.3, 0.2, 0.1)),
    Constant(4),
    ScipyInt(stats.poisson(2.5), shift=1),
    ScipyInt(stats.nbinom(3, 0.4), shift=1),
]


@pytest.mark.parametrize("M", TURNS, ids=lambda d: type(d).__name__)
def test_E_B_iid(M):
    """E[B] = E[M] E[Z] for i.i.d. increments (Wald); A_R = E[Z] E[M(M+1)/2]; A_H = E[Z] E[(M−1)M/2]."""
    z = Geometric.from_mean(3.5)
    mom = theory.moments(WorkloadSpec(1.0, M, IIDIncrements(z), Exponential(1.0)), tol=1e-13)
    EM, EM2 = M.mean, M.second_moment
    assert mom.E_B == pytest.approx(EM * z.mean, rel=1e-11)
    assert mom.A_R == pytest.approx(z.mean * (EM2 + EM) / 2, rel=1e-11)
    assert mom.A_H == pytest.approx(z.mean * (EM2 - EM) / 2, rel=1e-11)
    assert mom.E_M == pytest.approx(EM, rel=1e-14) and mom.Var_M == pytest.approx(M.var, rel=1e-12)


def test_finite_pmf_equals_geometric():
    """A geometric pmf truncated where p^K < 1e-20 (FinitePMF, exact finite sums) matches the closed form."""
    p = 0.7
    K = int(math.ceil(math.log(1e-20) / math.log(p))) + 1
    k = np.arange(1, K + 1)
    fin = FinitePMF(tuple(int(x) for x in k), tuple(float(x) for x in p ** (k - 1) * (1 - p)))
    inc = PromptResponse(Geometric.from_mean(2.0), Constant(5))
    a = theory.moments(WorkloadSpec(1.0, Geometric(p), inc, Exponential(1.0)))
    b = theory.moments(WorkloadSpec(1.0, fin, inc, Exponential(1.0)))
    assert b.method == "finite" and a.method == "geometric"
    for name in ("A_R", "A_H", "A_H_hash", "E_B", "E_M", "Var_M", "h_max"):
        assert getattr(b, name) == pytest.approx(getattr(a, name), rel=1e-12), name


def _long_sums(M_sf, mean_Z, J):
    """Independent reference: term-by-term sums of eq. (9), (10) and E[B] = Σ S_j E[Z_j] to index J."""
    j = np.arange(1, J + 2, dtype=float)
    S = M_sf(j)
    mz = mean_Z(j)
    R = np.cumsum(mz)
    return (math.fsum(S[:-1] * R[:-1]), math.fsum(S[1:] * R[:-1]), math.fsum(S[:-1] * mz[:-1]))


# E[Z_j] = (7, 2, 3, 3, …): R̄_j = 3j + 3 + 1{j = 1}, so with T = E[M(M+1)/2] (Σ_j j S_j) the series are
# A_R = 3T + 3E[M] + 1, A_H = Σ_j S_{j+1}(3j + 3) + S_2 = 3(T − 1) + S_2, E[B] = 7 + 2S_2 + 3(E[M] − 1 − S_2).
INC = TurnDependent((Constant(7), Geometric.from_mean(2.0), Constant(3)))


def _closed(M):
    EM, T, S2 = M.mean, (M.second_moment + M.mean) / 2, float(M.sf_ge(np.array([2]))[0])
    return 3 * T + 3 * EM + 1, 3 * (T - 1) + S2, 7 + 2 * S2 + 3 * (EM - 1 - S2)


@pytest.mark.parametrize(
    "M, J_ref",
    [
        (ScipyInt(stats.poisson(6.0), shift=1), 400),
        (ScipyInt(stats.nbinom(2, 0.15), shift=1), 3000),
        (ScipyInt(stats.geom(0.2)), 3000),
        (ScipyInt(stats.zipf(5.0)), None),  # polynomial tail: only the closed form
    ],
    ids=["poisson", "nbinom", "geom", "zipf"],
)
@pytest.mark.parametrize("tol", [1e-3, 1e-7, 1e-12])
def test_truncation_bound_covers_error(M, J_ref, tol):
    """The reported bound is ≥ the actual truncation error (vs the exact value from the moments of M, and a
    very long term-by-term sum) and ≤ tol × the sum."""
    spec = WorkloadSpec(1.0, M, INC, Exponential(1.0))
    if J_ref is None and tol == 1e-12:
        with pytest.raises(theory.TheoryError, match="tol"):
            theory.moments(spec, tol=tol, max_terms=1 << 15)
        return
    mom = theory.moments(spec, tol=tol)
    assert mom.method == "truncated"
    b = mom.truncation_error_bound
    slack = 1e-13  # floating-point noise of the references
    refs = [_closed(M)] + ([_long_sums(M.sf_ge, INC.mean_Z, J_ref)] if J_ref else [])
    for ref_R, ref_H, ref_B in refs:
        assert ref_R - b.A_R - slack * ref_R <= mom.A_R <= ref_R * (1 + slack)
        assert ref_H - b.A_H - slack * ref_R <= mom.A_H <= ref_H * (1 + slack)
        assert ref_B - b.E_B - slack * ref_B <= mom.E_B <= ref_B * (1 + slack)
    assert b.A_R <= tol * mom.A_R and b.A_H <= tol * mom.A_H and b.E_B <= tol * mom.E_B
    assert mom.truncation_J == mom.S.size == mom.R_bar.size
    assert mom.E_M == pytest.approx(M.mean, rel=1e-14)
    np.testing.assert_allclose(mom.S, M.sf_ge(np.arange(1, mom.S.size + 1)), rtol=1e-10, atol=1e-15)


def test_geometric_scipy_vs_closed_form():
    """ScipyInt(geom) (truncated with a bound) agrees with Geometric (closed-form tails) within the bound."""
    inc = PromptResponse(Constant(3), Geometric.from_mean(4.0))
    a = theory.moments(WorkloadSpec(1.0, Geometric(0.8), inc, Exponential(1.0)))
    b = theory.moments(WorkloadSpec(1.0, ScipyInt(stats.geom(0.2)), inc, Exponential(1.0)), tol=1e-12)
    eps = 1e-13 * a.A_R  # rounding of the two computations
    assert -eps <= a.A_R - b.A_R <= b.truncation_error_bound.A_R + eps
    assert -eps <= a.A_H - b.A_H <= b.truncation_error_bound.A_H + eps
    assert abs(a.E_B - b.E_B) <= b.truncation_error_bound.E_B + 1e-13 * a.E_B


def test_infinite_second_moment_rejected():
    spec = WorkloadSpec(1.0, ScipyInt(stats.zipf(2.5)), IIDIncrements(Constant(1)), Exponential(1.0))
    with pytest.raises(theory.TheoryError, match="E\\[M²\\]"):
        theory.moments(spec)


def test_empirical_conversations_exact():
    """Joint (M, Z) sequences: A_R, A_H, E[B] are plain averages (computed here by hand loops)."""
    seqs = [[3], [1, 2, 4], [5, 1], [2, 2, 2, 2], [1, 9]]
    spec = WorkloadSpec(1.0, None, EmpiricalConversations(seqs), Exponential(1.0))
    mom = theory.moments(spec)
    AR = AH = EB = 0.0
    for s in seqs:
        R = np.cumsum(s)
        AR += R.sum()
        AH += R[:-1].sum()
        EB += R[-1]
    n = len(seqs)
    assert mom.method == "empirical"
    assert mom.A_R == pytest.approx(AR / n, rel=1e-15)
    assert mom.A_H == pytest.approx(AH / n, rel=1e-15)
    assert mom.E_B == pytest.approx(EB / n, rel=1e-15)
    assert mom.E_M == pytest.approx(12 / 5)
    assert mom.A_H_hash == pytest.approx(AH / n - (12 / 5 - 1))
    np.testing.assert_allclose(mom.S, [1, 0.8, 0.4, 0.2])
    # R̄_j = E[R_j | M ≥ j]: eq. (9) still holds with it
    assert float(mom.S @ mom.R_bar) == pytest.approx(mom.A_R, rel=1e-14)


def test_moments_rejects_bad_input():
    with pytest.raises(ValueError, match="spec"):
        theory.moments("not a spec")  # type: ignore[arg-type]
    spec = WorkloadSpec.scm(1.0, 0.5)
    with pytest.raises(ValueError, match="tol"):
        theory.moments(spec, tol=0)


# ----------------------------------------------------------------------------------------------------------
# d(t) and T_C
# ----------------------------------------------------------------------------------------------------------


def _tc_exponential(E_B, A, mu, y):
    """Root of E_B t + A μ (1 − e^{−t/μ}) = y: with u = t/μ, c = (y − Aμ)/(E_B μ), a = A/E_B,
    u = c + a e^{−u} ⇒ u = c + W₀(a e^{−c}) (Lambert W)."""
    c = (y - A * mu) / (E_B * mu)
    a = A / E_B
    return mu * (c + np.real(special.lambertw(a * np.exp(-c))))


def _tc_deterministic(E_B, A, w, y):
    """W ≡ w: g(t) = (E_B + A) t on [0, w], E_B t + A w beyond (piecewise linear)."""
    return np.where(y <= (E_B + A) * w, y / (E_B + A), (y - A * w) / E_B)


SPEC = WorkloadSpec.scm(1.5, 0.75, x=Geometric.from_mean(3.0), y=Constant(2), mean_w=120.0)


@pytest.mark.parametrize("practical", [False, True])
def test_T_C_exponential_closed_form(practical):
    mom = theory.moments(SPEC)
    A = mom.A(practical)
    N = np.array([1.0, 10.0, 200.0, 2275.0, 1e5])[:, None]
    lam0 = np.array([0.1, 1.5, 7.0])[None, :]
    got = theory.T_C(SPEC, N=N, lam0=lam0, practical=practical)
    assert got.shape == (5, 3)
    ref = _tc_exponential(mom.E_B, A, 120.0, N / lam0)
    # the Lambert-W form cancels (c < 0 plus W₀ > 0) for small y: allow for its own rounding error
    c = np.abs((N / lam0 - A * 120.0) / (mom.E_B * 120.0))
    assert np.all(np.abs(got - ref) <= 1e-12 * (ref + 120.0 * 2 * c))
    # d(T_C) = N (threshold form), d(T_C) = 1 at N = 1
    np.testing.assert_allclose(
        theory.d(got, SPEC, lam0=lam0, practical=practical), np.broadcast_to(N, got.shape), rtol=1e-12
    )


def test_T_C_deterministic_closed_form():
    spec = SPEC.with_interarrival(Deterministic(60.0))
    mom = theory.moments(spec)
    N = np.geomspace(0.5, 1e5, 200)
    got = theory.T_C(spec, N=N, lam0=1.5)
    np.testing.assert_allclose(got, _tc_deterministic(mom.E_B, mom.A_H, 60.0, N / 1.5), rtol=1e-12)


@pytest.mark.parametrize(
    "F",
    [
        GammaW(0.5, 40.0),
        GammaW(4.0, 40.0),
        LogNormalW.from_mean_cv(50.0, 2.0),
        ScipyW(stats.weibull_min(0.7, scale=30.0)),
        EmpiricalW([0.0, 3.0, 3.0, 10.0, 100.0, 250.0]),
        Deterministic(0.0),
    ],
    ids=lambda f: f.name + (str(getattr(f, "shape", "")) if hasattr(f, "shape") else ""),
)
def test_T_C_vs_brentq(F):
    """The vectorized solver equals scalar brentq roots, a scalar loop of itself, and d(T_C) = N."""
    mom = theory.moments(SPEC)
    N = np.array([0.2, 3.0, 50.0, 700.0, 2275.0, 40_000.0])
    got = theory.T_C(mom, F, N=N, lam0=1.5)
    loop = np.array([theory.T_C(mom, F, N=n, lam0=1.5) for n in N])
    np.testing.assert_allclose(got, loop, rtol=1e-13)
    for n, t in zip(N, got, strict=True):

        def f(s, n=n):
            return 1.5 * (mom.E_B * s + mom.A_H * float(F.int_sf(s))) - n

        ref = optimize.brentq(f, 0.0, n / (1.5 * mom.E_B) * (1 + 1e-9) + 1e-12, xtol=1e-14, rtol=1e-14)
        assert t == pytest.approx(ref, rel=1e-10, abs=1e-12)
    np.testing.assert_allclose(theory.d(got, mom, F, lam0=1.5), N, rtol=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    t=st.lists(st.floats(0.0, 5e3), min_size=2, max_size=20),
    which=st.sampled_from(["exp", "gamma", "det", "emp"]),
)
@example(t=[3310.0, 3310.2795286299074], which="exp")  # found by hypothesis: the bound attained, at rounding
def test_d_strictly_increasing(t, which):
    """d'(t) ≥ λ0 E[B] > 0: d(t2) − d(t1) ≥ λ0 E[B] (t2 − t1) for t1 < t2 (App. C.1)."""
    F = {
        "exp": Exponential(50.0),
        "gamma": GammaW(0.3, 50.0),
        "det": Deterministic(20.0),
        "emp": EmpiricalW([1.0, 5.0, 5.0, 80.0]),
    }[which]
    mom = theory.moments(SPEC)
    ts = np.unique(np.asarray(t))
    for practical in (False, True):
        dv = theory.d(ts, mom, F, lam0=1.5, practical=practical)
        # the bound is attained once the non-linear part of d has saturated (large t), so the difference of two
        # values of d ~1e5 is compared at the rounding of those values: a few ulps of |d|, not of the difference
        ulps = 8 * np.finfo(float).eps * np.maximum(np.abs(dv[1:]), np.abs(dv[:-1]))
        assert np.all(np.diff(dv) >= 1.5 * mom.E_B * np.diff(ts) * (1 - 1e-12) - ulps)
        assert theory.d(0.0, mom, F, lam0=1.5) == 0.0


def test_h_infinity_scaling():
    """Eq. (25)/(32) with per-capacity λ0 = Λ/N equal the threshold form with unscaled Λ and capacity N."""
    N = 2275.0
    mom = theory.moments(SPEC)
    scaled = SPEC.with_lam0(SPEC.lam0 / N)
    tc = theory.T_C(scaled)  # d(T_C) = 1
    assert theory.d(tc, scaled) == pytest.approx(1.0, rel=1e-13)
    h = theory.h_infinity(scaled)
    assert h == pytest.approx(mom.h_max * (1 - math.exp(-tc / 120.0)), rel=1e-13)
    assert h == pytest.approx(theory.h_mean_field(SPEC, N), rel=1e-12)
    hp = theory.h_prac_infinity(scaled)
    assert hp == pytest.approx(theory.h_mean_field(SPEC, N, practical=True), rel=1e-12)
    tcp = theory.T_C(scaled, practical=True)
    assert hp == pytest.approx(mom.A_H_hash / mom.A_R * (1 - math.exp(-tcp / 120.0)), rel=1e-13)
    # the practical model moves fewer blocks back to MRU: longer characteristic time, lower ceiling
    assert tcp > tc and hp < h


@settings(max_examples=40, deadline=None)
@given(
    N=st.lists(st.floats(1.0, 1e6), min_size=2, max_size=10),
    lam0=st.floats(0.01, 100.0),
    practical=st.booleans(),
)
def test_h_mean_field_monotone(N, lam0, practical):
    Ns = np.unique(np.asarray(N))
    h = theory.h_mean_field(SPEC, Ns, lam0=lam0, practical=practical)
    mom = theory.moments(SPEC)
    cap = mom.h_max_hash if practical else mom.h_max
    assert np.all(np.diff(h) >= 0) and np.all(h <= cap) and np.all(h >= 0)
    h2 = theory.h_mean_field(SPEC, Ns, lam0=lam0 * 1.5, practical=practical)
    assert np.all(h2 <= h)


def test_single_turn_workload():
    """M ≡ 1: A_H = 0, nothing is reusable, T_C = N/(λ0 E[B])."""
    spec = WorkloadSpec(2.0, Constant(1), IIDIncrements(Constant(5)), Exponential(10.0))
    mom = theory.moments(spec)
    assert mom.A_H == 0 and mom.h_max == 0 and mom.A_H_hash == 0
    assert theory.T_C(spec, N=100.0) == pytest.approx(100.0 / (2.0 * 5))
    assert theory.h_mean_field(spec, 100.0) == 0.0


def test_T_C_rejects_bad_input():
    mom = theory.moments(SPEC)
    with pytest.raises(ValueError, match="N"):
        theory.T_C(SPEC, N=0.0)
    with pytest.raises(ValueError, match="lam0"):
        theory.T_C(SPEC, N=1.0, lam0=np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="F"):
        theory.T_C(mom, N=1.0, lam0=1.0)
    with pytest.raises(ValueError, match="lam0"):
        theory.T_C(mom, Exponential(1.0), N=1.0)
    with pytest.raises(ValueError, match="source"):
        theory.T_C(object(), Exponential(1.0), N=1.0, lam0=1.0)
    with pytest.raises(ValueError, match="t must"):
        theory.d(-1.0, SPEC)
