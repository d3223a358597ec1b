"""kvhit.estimate.trace_stats and kvhit.estimate.mean_field: eq. (35)–(39) on hand-computed traces, on large
generated SCM traces against the theory (within sampling error from the sample (co)variance), F̂ exactness,
vectorization, monotonicity."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize

from kvhit.estimate import mean_field as est
from kvhit.estimate import theory
from kvhit.estimate.trace_stats import trace_moments
from kvhit.workload import (
    EmpiricalW,
    Exponential,
    GammaW,
    Geometric,
    Trace,
    Window,
    WorkloadSpec,
    generate,
)


def _trace(convs, *, times=None, extra=None):
    """A trace from per-conversation increment lists (conversation i arrives at time i, turns 10 s apart)."""
    rows = {"conv": [], "conv_arrival": [], "turn": [], "time": [], "M": [], "Z": [], "R": []}
    for i, Z in enumerate(convs):
        R = np.cumsum(Z)
        for j, (z, r) in enumerate(zip(Z, R, strict=True)):
            rows["conv"].append(i)
            rows["conv_arrival"].append(float(i))
            rows["turn"].append(j + 1)
            rows["time"].append(float(i) + (10.0 * j if times is None else times[i][j]))
            rows["M"].append(len(Z))
            rows["Z"].append(int(z))
            rows["R"].append(int(r))
    cols = {k: np.asarray(v) for k, v in rows.items()}
    cols.update(extra or {})
    return Trace.from_columns(cols)


def test_three_turn_example():
    """App. B.3: one conversation with R = (2, 8, 16): Â_R = 26, Â_H = 10, Â_H^hash = 10 − 2, Ê[B] = 16."""
    tm = trace_moments(_trace([[2, 6, 8]]))
    assert (tm.A_R, tm.A_H, tm.A_H_hash, tm.E_B, tm.E_M) == (26, 10, 8, 16, 3)
    assert tm.L == 1 and tm.n_turns == 3 and tm.max_M == 3 and tm.Var_M == 0
    assert tm.h_max == pytest.approx(10 / 26) and tm.h_max_hash == pytest.approx(8 / 26)
    np.testing.assert_array_equal(tm.W, [10.0, 10.0])


def test_small_trace_by_hand():
    convs = [[2, 6, 8], [5], [1, 1], [3, 4, 1, 2]]
    tm = trace_moments(_trace(convs))
    # R: (2, 8, 16), (5), (1, 2), (3, 7, 8, 10)
    assert tm.A_R == pytest.approx((26 + 5 + 3 + 28) / 4)
    assert tm.A_H == pytest.approx((10 + 0 + 1 + 18) / 4)
    assert tm.A_H_hash == pytest.approx((8 + 0 + 0 + 15) / 4)
    assert tm.E_B == pytest.approx((16 + 5 + 2 + 10) / 4)
    assert tm.E_M == pytest.approx(10 / 4) and tm.Var_M == pytest.approx(np.var([3, 1, 2, 4]))
    assert tm.n_turns == 10 and tm.max_M == 4 and tm.L == 4
    assert tm.se_A_R == pytest.approx(np.std([26, 5, 3, 28], ddof=1) / 2)
    assert tm.lam0_hat == pytest.approx(3 / 3)
    # conversation selection: boolean mask (id order), ids, row mask
    sub = trace_moments(_trace(convs), np.array([True, False, False, True]))
    assert sub.A_R == pytest.approx((26 + 28) / 2) and sub.L == 2
    assert trace_moments(_trace(convs), np.array([3, 0])).A_R == sub.A_R
    tr = _trace(convs)
    rows = tr["conv"] % 3 == 0
    assert trace_moments(tr, rows=rows).A_R == sub.A_R


def test_M_column_not_row_count():
    """Eq. (35)–(37) need all M_i turns: a window-censored trace is refused, or its censored conversations
    dropped, never silently shortened."""
    tr = _trace([[2, 6, 8], [5], [1, 1]])
    cut = tr.select(Window(end=15.0).mask(tr))  # conversation 0 loses its turn 3 (at t = 20)
    with pytest.raises(ValueError, match="conversation 0 has M = 3 turns but 2 rows"):
        trace_moments(cut)
    tm = trace_moments(cut, incomplete="drop")
    assert tm.L == 2 and tm.A_R == pytest.approx((5 + 3) / 2)


def test_block_rules():
    """block='phys' reads R_phys; block='full' takes the exact full-block count R_full as hashable history."""
    b = 4
    cum = np.array([7, 16, 30])  # tokens: R_phys = ⌈T/4⌉ = (2, 4, 8), R_full = ⌊T/4⌋ = (1, 4, 7)
    extra = {"cum_tokens": cum, "R_phys": -(-cum // b), "R_full": cum // b}
    tr = _trace([[2, 2, 4]], extra=extra)
    phys = trace_moments(tr, block="phys")
    assert (phys.A_R, phys.A_H_hash, phys.E_B) == (14, 4, 8)
    full = trace_moments(tr, block="full")
    assert (full.A_R, full.A_H, full.A_H_hash, full.E_B) == (14, 6, 5, 8)
    with pytest.raises(ValueError, match="R_full"):
        trace_moments(_trace([[2, 2]]), block="full")
    with pytest.raises(ValueError, match="block"):
        trace_moments(tr, block="nope")


def test_empirical_F_exact_vs_quadrature():
    """∫₀ᵗ F̂̄ of the observed gaps is exact (vs piecewise quadrature), and T̂_C from it equals brentq."""
    rng = np.random.default_rng(3)
    w = np.round(rng.exponential(30.0, size=60), 1)  # ties included
    F = EmpiricalW(w)
    for t in (0.0, 0.05, 7.3, 30.0, 95.0, 1e4):
        pts = np.unique(np.concatenate([[0.0, t], w[w < t]]))
        ref = sum(
            integrate.quad(lambda u: 1 - float(F.cdf(u)), a, c)[0] for a, c in zip(pts[:-1], pts[1:], strict=True)
        )
        assert float(F.int_sf(t)) == pytest.approx(ref, rel=1e-12, abs=1e-12)
    E_B, A = 13.0, 22.5
    N = np.array([1.0, 50.0, 900.0, 2275.0, 1e5])
    got = theory.solve_T_C(E_B, A, F, 1.5, N)
    for n, t in zip(N, got, strict=True):
        ref = optimize.brentq(
            lambda s, n=n: 1.5 * (E_B * s + A * float(F.int_sf(s))) - n,
            0,
            n / (1.5 * E_B),
            xtol=1e-14,
            rtol=1e-15,
        )
        assert t == pytest.approx(ref, rel=1e-12)


# ----------------------------------------------------------------------------------------------------------
# large generated SCM traces vs theory
# ----------------------------------------------------------------------------------------------------------

SPEC = WorkloadSpec.scm(1.5, 0.75, x=Geometric.from_mean(3.0), y=Geometric.from_mean(2.0), mean_w=120.0)


@pytest.fixture(scope="module")
def big():
    tr = generate(SPEC, seed=11, n_conversations=40_000)
    return tr, trace_moments(tr)


# a 5-sigma band: the seeded draw is fixed, the band is the sampling error, not a tuned tolerance
Z_SIGMA = 5.0


def test_moments_converge_to_theory(big):
    tr, tm = big
    mom = theory.moments(SPEC)
    for name in ("A_R", "A_H", "A_H_hash", "E_B", "E_M"):
        se = getattr(tm, "se_" + name)
        assert abs(getattr(tm, name) - getattr(mom, name)) <= Z_SIGMA * se, name
    assert tm.L == 40_000 and tm.n_turns == tr.n_turns
    # λ̂0 and the mean gap are Poisson/exponential: se = λ/√L and μ/√n
    assert abs(tm.lam0_hat - 1.5) <= Z_SIGMA * 1.5 / np.sqrt(tm.L)
    assert abs(tm.W.mean() - 120.0) <= Z_SIGMA * 120.0 / np.sqrt(tm.W.size)
    np.testing.assert_array_equal(np.sort(tm.W), np.sort(tr.interarrivals()))


@pytest.mark.parametrize("practical", [True, False])
def test_estimate_matches_theory_within_delta_method(big, practical):
    """ĥ with the prior F is a smooth function of (Â_R, Â, Ê[B]); its sampling error follows from the sample
    covariance of the per-conversation terms (delta method). It must agree with h_mean_field within 5σ."""
    _, tm = big
    N, lam0 = np.array([300.0, 2275.0, 20_000.0]), 1.5
    F = SPEC.interarrival
    got = est.estimate(tm, N, lam0, F, practical=practical)
    want = theory.h_mean_field(SPEC, N, lam0=lam0, practical=practical)
    pc = tm.per_conversation
    a_key = "sum_R_hash" if practical else "sum_R_reuse"
    X = np.stack([pc["sum_R"], pc[a_key], pc["B"]])
    cov = np.cov(X) / tm.L
    x0 = X.mean(axis=1)

    def h_of(x):
        return theory.mean_field(x[0], x[1], x[2], F, lam0, N)[0]

    grad = np.empty((3, N.size))
    for k in range(3):
        dx = np.zeros(3)
        dx[k] = 1e-6 * x0[k]
        grad[k] = (h_of(x0 + dx) - h_of(x0 - dx)) / (2 * dx[k])
    se = np.sqrt(np.einsum("in,ij,jn->n", grad, cov, grad))
    assert np.all(np.abs(got.h - want) <= Z_SIGMA * se)
    np.testing.assert_allclose(got.h, h_of(x0), rtol=1e-13)


def test_estimate_spec_is_h_mean_field():
    N = np.geomspace(10, 1e5, 30)
    for practical in (True, False):
        e = est.estimate_spec(SPEC, N, practical=practical)
        np.testing.assert_allclose(e.h, theory.h_mean_field(SPEC, N, practical=practical), rtol=1e-15)
        np.testing.assert_allclose(e.T_C, theory.T_C(SPEC, N=N, practical=practical), rtol=1e-15)
        mom = theory.moments(SPEC)
        assert e.h_max_hat == pytest.approx(mom.h_max_hash if practical else mom.h_max)
    # prior Moments as a source
    e2 = est.estimate(theory.moments(SPEC), N, SPEC.lam0, SPEC.interarrival)
    np.testing.assert_allclose(e2.h, est.estimate_spec(SPEC, N).h, rtol=1e-15)


@pytest.mark.parametrize("F", ["empirical", "posterior", GammaW(2.0, 100.0)], ids=str)
def test_vectorized_equals_scalar_loop(big, F):
    _, tm = big
    N = np.array([50.0, 500.0, 2275.0, 9000.0])[:, None]
    lam0 = np.array([0.5, 1.5, 2.0])[None, :]
    e = est.estimate(tm, N, lam0, F)
    assert e.h.shape == e.T_C.shape == e.N.shape == e.lam0.shape == (4, 3)
    for i in range(4):
        for k in range(3):
            s = est.estimate(tm, float(N[i, 0]), float(lam0[0, k]), F)
            assert isinstance(s.h, float)
            assert e.h[i, k] == pytest.approx(s.h, rel=1e-14, abs=1e-16)
            assert e.T_C[i, k] == pytest.approx(s.T_C, rel=1e-14)
    # T̂_C solves eq. (38) with Â_H^hash
    Fo = est.empirical_F(tm) if F == "empirical" else est.posterior_F(tm) if F == "posterior" else F
    lhs = lam0 * tm.E_B * e.T_C + lam0 * tm.A_H_hash * Fo.int_sf(e.T_C)
    np.testing.assert_allclose(lhs, np.broadcast_to(N, lhs.shape), rtol=1e-11)


def test_posterior_and_empirical_F(big):
    tr, tm = big
    post = est.posterior_F(tr)
    assert isinstance(post, Exponential) and post.mean == pytest.approx(tr.interarrivals().mean(), rel=1e-14)
    emp = est.empirical_F(tm)
    np.testing.assert_array_equal(emp.samples, np.sort(tm.W))
    # a Trace source and its TraceMoments give the same estimate; λ0 defaults to λ̂0
    a = est.estimate(tr, 2275.0)
    b = est.estimate(tm, 2275.0, tm.lam0_hat)
    assert a.h == pytest.approx(b.h, rel=1e-15) and a.lam0 == tm.lam0_hat


@settings(max_examples=30, deadline=None)
@given(
    N=st.lists(st.floats(1.0, 1e6), min_size=2, max_size=8),
    lam0=st.floats(0.01, 50.0),
    practical=st.booleans(),
    which=st.sampled_from(["empirical", "posterior"]),
)
def test_monotone_and_capped(big, N, lam0, practical, which):
    """ĥ ≤ ĥ_max, nondecreasing in N, nonincreasing in λ0 (F̂ is a CDF, T̂_C increases in N/λ0)."""
    _, tm = big
    # capacities one ulp apart (1.0 and 1.0000000000000002) give equal T̂_C in floating point: the strict
    # increase is a property of distinct capacities, checked at a resolution of 1e-9
    Ns = np.unique(np.round(np.asarray(N), 9))
    e = est.estimate(tm, Ns, lam0, which, practical=practical)
    assert np.all(e.h <= e.h_max_hat) and np.all(e.h >= 0)
    assert np.all(np.diff(e.h) >= 0) and np.all(np.diff(e.T_C) > 0)
    e2 = est.estimate(tm, Ns, lam0 * 1.7, which, practical=practical)
    assert np.all(e2.h <= e.h) and np.all(e2.T_C < e.T_C)


def test_bad_inputs(big):
    tr, tm = big
    with pytest.raises(ValueError, match="N"):
        est.estimate(tm, -1.0, 1.0)
    with pytest.raises(ValueError, match="lam0"):
        est.estimate(tm, 10.0, np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="F"):
        est.estimate(tm, 10.0, 1.0, "prior")
    with pytest.raises(ValueError, match="observed gaps"):
        est.estimate(theory.moments(SPEC), 10.0, 1.0, "empirical")
    with pytest.raises(ValueError, match="lam0"):
        est.estimate(dataclasses.replace(tm, lam0_hat=float("nan")), 10.0)
    with pytest.raises(ValueError, match="mask"):
        trace_moments(tr, np.ones(3, dtype=bool))
    with pytest.raises(ValueError, match="not in the trace"):
        trace_moments(tr, np.array([10**9]))
    with pytest.raises(ValueError, match="single turn"):
        est.empirical_F(_trace([[1], [2]]))
    single = trace_moments(_trace([[3]]))
    assert np.isnan(single.lam0_hat) and np.isnan(single.se_A_R)
    with pytest.raises(ValueError, match="Trace"):
        trace_moments(tm)  # type: ignore[arg-type]


def test_single_turn_conversations_give_zero():
    """No conversation continues: Â_H^hash = 0, ĥ = 0 for every N (h_max = 0)."""
    tr = _trace([[3], [5], [2]])
    e = est.estimate(tr, np.array([1.0, 100.0]), 1.0, Exponential(5.0))
    np.testing.assert_array_equal(e.h, [0.0, 0.0])
    np.testing.assert_allclose(e.T_C, np.array([1.0, 100.0]) / (10 / 3))
