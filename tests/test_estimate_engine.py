"""Engine-aware, finite-capacity and fluctuation estimators (kvhit.estimate.engine.estimate_engine & co.)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.estimate.accounting import displacement_moments, engine_accounting
from kvhit.estimate.engine import estimate_engine, estimate_finite, estimate_window
from kvhit.estimate.mean_field import estimate
from kvhit.estimate.trace_stats import EstimateError, trace_moments
from kvhit.sim.metrics import mean_ci
from kvhit.sim.runner import block_requests, simulate_trace_block
from kvhit.workload.blocks import block_accounting
from kvhit.workload.dists import Exponential
from kvhit.workload.generate import trace_from_conversations
from kvhit.workload.trace import Window


def token_trace(seed, n_conv=400, b=16, lam0=1.0, mu=20.0, p_mean=60.0, r_mean=30.0, m_mean=4.0):
    rng = np.random.default_rng(seed)
    M = 1 + rng.geometric(1 / m_mean, size=n_conv)
    n = int(M.sum())
    p = 1 + rng.poisson(p_mean, size=n)
    r = 1 + rng.poisson(r_mean, size=n)
    cols = block_accounting(M, p, r, b)
    extra = {k: cols[k] for k in ("prompt_tokens", "response_tokens", "cum_tokens", "R_full", "R_phys")}
    return trace_from_conversations(
        M, cols["Z"], lam0=lam0, interarrival=Exponential(mu), seed=seed, extra=extra, meta={"block_size": b}
    )


def hand_trace():
    # one conversation, b = 4: T = 5, 9, 16 (p1 = 5; r1 = 2, p2 = 2; r2 = 3, p3 = 4), plus a 1-turn one (T = 8)
    M = np.array([3, 1])
    p = np.array([5, 2, 4, 8])
    r = np.array([2, 3, 1, 1])
    cols = block_accounting(M, p, r, 4)
    extra = {k: cols[k] for k in ("prompt_tokens", "response_tokens", "cum_tokens", "R_full", "R_phys")}
    return trace_from_conversations(
        M, cols["Z"], lam0=1.0, interarrival=Exponential(1.0), seed=0, extra=extra, meta={"block_size": 4}
    )


def test_hand_worked_accounting_both_engines():
    tr = hand_trace()
    assert sorted(tr["cum_tokens"].tolist()) == [5, 8, 9, 16]
    assert sorted(tr["R"].tolist()) == [2, 2, 4, 6]  # paper: ⌈T/b⌉ + earlier partial prompts
    new = engine_accounting(tr, engine="vllm", metric="tokens")
    old = engine_accounting(tr, engine="vllm-0.23", metric="blocks")
    # full blocks ⌊T/b⌋: conv 0: 1, 2, 4; conv 1: 2.  ≥ 0.24: E_B = (4 + 2)/2; ≤ 0.23 adds partial prompts 5, 9
    assert new.E_B == pytest.approx(3.0)
    assert old.E_B == pytest.approx(4.0)
    assert new.A == old.A == pytest.approx((1 + 2) / 2)  # cached full history moving on revisits
    assert new.cap_offset == 1 and old.cap_offset == 0
    assert sorted(new.reuse.tolist()) == [1.0, 2.0]
    assert new.h_max == pytest.approx(4 * 3 / (5 + 9 + 16 + 8))  # hit tokens / prompt tokens
    assert old.h_max == pytest.approx(3 / (2 + 3 + 4 + 2))  # hit blocks / ⌈T/b⌉
    paper = engine_accounting(tr, accounting="paper")
    assert paper.E_B == pytest.approx((6 + 2) / 2) and paper.A == pytest.approx((2 - 1 + 4 - 1) / 2)
    content = engine_accounting(tr, engine="content")
    assert content.A == pytest.approx((2 + 4) / 2)


def test_paper_accounting_reproduces_estimate_exactly():
    tr = token_trace(1)
    N = np.array([[50.0], [200.0], [800.0]])
    lam = np.array([0.5, 1.0, 2.0])
    ref = estimate(tr, N, lam)
    got = estimate_engine(tr, N, lam, accounting="paper", finite=False, fluctuations=False)
    np.testing.assert_allclose(got.h, ref.h, rtol=1e-12, atol=0)
    np.testing.assert_allclose(got.T_C, ref.T_C, rtol=1e-12, atol=0)


def test_finite_reduces_to_mean_field_when_sizes_negligible():
    tr = token_trace(2, n_conv=200)
    mom = trace_moments(tr)
    N = 1e7
    R_max = float(tr["R"].max())
    for lam in (N / 2000.0, N / 400.0):
        mf = estimate(mom, N, lam).h
        fin = estimate_finite(tr, N, lam).h
        assert fin <= mf + 1e-15  # F(τ(N − R)) ≤ F(τ(N))
        # |F̂(τ(N)) − F̂(τ(N − R))| ≤ P(τ(N − R_max) < W ≤ τ(N)); τ moves by ≤ R_max/(λ0 E_B)
        w = np.sort(tr.interarrivals())
        tn = float(estimate(mom, N, lam).T_C)
        band = np.mean((w > tn - R_max / (lam * mom.E_B)) & (w <= tn))
        assert mf - fin <= band * mom.h_max_hash + 1e-12


def test_finite_no_hit_when_size_exceeds_capacity():
    tr = token_trace(3, n_conv=100)
    acc = engine_accounting(tr, accounting="paper")
    N = float(acc.size.min()) - 1  # every turn larger than the cache
    assert estimate_finite(acc, N, 1.0).h == 0.0


@settings(max_examples=10, deadline=None)
@given(
    engine=st.sampled_from(["vllm", "vllm-0.23", "content"]),
    metric=st.sampled_from(["tokens", "blocks"]),
    finite=st.booleans(),
    partial=st.booleans(),
    fluct=st.booleans(),
)
def test_vectorized_equals_scalar_loop(engine, metric, finite, partial, fluct):
    acc = engine_accounting(_TR, engine=engine, metric=metric)
    N = np.array([40, 90, 300, 1000])
    lam = np.array([[0.7], [1.6]])
    vec = estimate_engine(acc, N, lam, finite=finite, partial=partial, fluctuations=fluct).h
    for i in range(2):
        for k in range(4):
            s = estimate_engine(acc, int(N[k]), float(lam[i, 0]), finite=finite, partial=partial, fluctuations=fluct).h
            assert vec[i, k] == pytest.approx(s, rel=1e-9, abs=1e-12)


_TR = token_trace(4, n_conv=300)


def test_displacement_moments_against_direct_integration():
    tr = token_trace(5, n_conv=12, m_mean=3.0)
    acc = engine_accounting(tr, engine="vllm-0.23")
    ts = np.array([0.0, 3.0, 17.0, 60.0])
    m1, v1 = displacement_moments(acc, ts)
    # closed form of the mean (Lemma D.4 with each conversation's own gaps)
    L = acc.L
    ptr = acc.conv_ptr
    W = np.diff(acc.offsets)[np.diff(np.repeat(np.arange(L), np.diff(ptr))) == 0]
    hist_nl = acc.hist_all[np.setdiff1d(np.arange(acc.hist_all.size), ptr[1:] - 1)]
    closed = acc.E_B * ts + np.array([(hist_nl * np.minimum(W, t)).sum() / L for t in ts])
    np.testing.assert_allclose(m1, closed, rtol=1e-10, atol=1e-9)
    # brute-force Riemann sum over arrival times a of Φ_t(a) and Φ_t(a)² (independent slow reference)
    new = np.diff(np.concatenate([[0.0], acc.cum_new]))
    for t, mv, vv in zip(ts, m1, v1, strict=True):
        sm = sv = 0.0
        for c in range(L):
            s = acc.offsets[ptr[c] : ptr[c + 1]]
            hist = acc.hist_all[ptr[c] : ptr[c + 1]]
            nw = new[ptr[c] : ptr[c + 1]]
            nw[0] = acc.cum_new[ptr[c]]
            a = np.linspace(-s[-1], t, 20001)[:-1] + (t + s[-1]) / 40000
            da = (t + s[-1]) / 20000
            for ai in a:
                inw = (ai + s > 0) & (ai + s <= t)
                if not inw.any():
                    continue
                kf = int(np.argmax(inw))
                phi = nw[inw].sum() + (hist[kf - 1] if kf > 0 else 0.0)
                sm += phi * da
                sv += phi * phi * da
        assert mv == pytest.approx(sm / L, rel=2e-3, abs=1e-6)
        assert vv == pytest.approx(sv / L, rel=2e-3, abs=1e-6)


def test_bad_input_names_field():
    with pytest.raises(EstimateError, match="engine"):
        engine_accounting(_TR, engine="sglang")
    with pytest.raises(EstimateError, match="metric"):
        engine_accounting(_TR, metric="requests")
    with pytest.raises(EstimateError, match="N"):
        estimate_engine(_TR, 100.5, 1.0)
    with pytest.raises(EstimateError, match="lam0"):
        estimate_engine(_TR, 100, -1.0)


def _accuracy(n_seeds, n_conv, N, lam0, engine):
    errs, acts = [], []
    for seed in range(n_seeds):
        tr = token_trace(100 + seed, n_conv=n_conv, lam0=lam0)
        win = Window.warmup_conversations(tr, n_conv // 5)
        _, m = simulate_trace_block(tr, N, engine=engine, window=win, requests=block_requests(tr, source="counts"))
        est = estimate_window(tr, N, lam0, window=win, engine=engine).h
        errs.append(est - m["token_hit_ratio"])
        acts.append(m["token_hit_ratio"])
    return errs, acts


@pytest.mark.parametrize("engine", ["vllm", "vllm-0.23"])
def test_window_estimator_within_simulation_ci(engine):
    # the errors est − sim over independent replications: their mean must be within the Student-t 95% CI
    # half-width of the simulated hit ratio's replication mean (plus the CI of the errors themselves)
    errs, acts = _accuracy(4, 1500, 400, 1.0, engine)
    e_mean, e_hw = mean_ci(errs)
    _, a_hw = mean_ci(acts)
    assert 0.05 < np.mean(acts) < 0.6
    assert abs(e_mean) <= e_hw + a_hw


@pytest.mark.slow
def test_window_estimator_within_simulation_ci_large():
    errs, acts = _accuracy(6, 6000, 1200, 2.0, "vllm")
    e_mean, e_hw = mean_ci(errs)
    _, a_hw = mean_ci(acts)
    assert abs(e_mean) <= e_hw + a_hw


# ----------------------------------------------------------------------------------------------------------
# rejection-aware accounting (vLLM rejects a request with ⌈T_j/b⌉ > N)
# ----------------------------------------------------------------------------------------------------------


def test_simulator_rejects_exactly_the_oversize_turns_and_their_successors():
    # the premise of EngineAccounting.admitted: rejected iff ⌈T_j/b⌉ > N, and T is cumulative, so a rejected
    # turn's later turns are rejected too (hand trace: conv 0 needs 2, 3, 4 blocks; conv 1 needs 2)
    tr = hand_trace()
    need = -(-tr["cum_tokens"] // 4)
    for N in (1, 2, 3, 4):
        for eng in ("vllm", "vllm-0.23"):
            res, _ = simulate_trace_block(tr, N, engine=eng, requests=block_requests(tr, source="counts"))
            np.testing.assert_array_equal(res.rejected, need > N)


def test_hand_worked_admitted_accounting():
    tr = hand_trace()
    acc = engine_accounting(tr, engine="vllm", metric="tokens")
    assert acc.max_need == 4 and acc.admitted(4) is acc
    # N = 3: conv 0 keeps turns 1, 2 (T = 5, 9; full blocks 1, 2), turn 3 (T = 16, 4 blocks) is rejected;
    # conv 1 (T = 8) is admitted. New blocks 1 + 1 (conv 0) + 2 (conv 1); the history moving on a revisit is
    # turn 1's single block (turn 2's history never comes back: its next turn is rejected)
    a3 = acc.admitted(3)
    assert a3.L == 2
    assert a3.E_B == pytest.approx(4 / 2)
    assert a3.A == pytest.approx(1 / 2)
    assert a3.A_R == pytest.approx((5 + 9 + 8) / 2)  # rejected prompts leave the demand
    assert a3.A_hit == pytest.approx(4 * 1 / 2)
    assert a3.reuse.tolist() == [1.0]
    # N = 2: conv 0 keeps turn 1 only, no revisit is admitted: nothing can hit
    a2 = acc.admitted(2)
    assert a2.E_B == pytest.approx((1 + 2) / 2) and a2.A == 0.0 and a2.A_R == pytest.approx((5 + 8) / 2)
    assert a2.reuse.size == 0
    # ≤ 0.23 adds the partial prompts (T = 5, 9) to the new-block displacement; blocks metric: ⌈T/b⌉ demand
    old3 = engine_accounting(tr, engine="vllm-0.23", metric="blocks").admitted(3)
    assert old3.E_B == pytest.approx((4 + 2) / 2) and old3.A_R == pytest.approx((2 + 3 + 2) / 2)
    # Algorithm 1 never rejects
    content = engine_accounting(tr, engine="content")
    assert content.admitted(1) is content


def test_rejection_aware_estimate_hand_worked():
    from kvhit.estimate.theory import solve_T_C

    tr = hand_trace()
    acc = engine_accounting(tr, engine="vllm", metric="tokens")
    F = Exponential(1.0)
    lam = 0.7
    # mean field at N = 3 on the admitted accounting (C = N − 1): h = A_hit F(τ(C)) / A_R with
    # λ0 E_B τ + λ0 A ∫₀^τ F̄ = C, E_B = 2, A = 1/2, A_hit = 2, A_R = 11 (see the hand-worked accounting)
    tau = float(solve_T_C(2.0, 0.5, F, lam, 2.0))
    want = 2.0 * float(F.cdf(tau)) / 11.0
    got = estimate_engine(acc, 3, lam, F, finite=False, fluctuations=False)
    assert got.h == pytest.approx(want, rel=1e-12)
    assert got.T_C == pytest.approx(tau, rel=1e-12)
    # without rejection the rejected turn 3 counts (demand 16 tokens, 2 reusable blocks): a different number
    assert abs(estimate_engine(acc, 3, lam, F, finite=False, fluctuations=False, rejection=False).h - want) > 0.01
    # no revisit admitted (N = 2) and no request admitted (N = 1, ≤ 0.23; ≥ 0.24 needs N > 1): nothing hits
    old = engine_accounting(tr, engine="vllm-0.23", metric="tokens")
    for fl in (False, True):
        assert estimate_engine(old, [1, 2], lam, F, fluctuations=fl).h.tolist() == [0.0, 0.0]
        assert estimate_engine(acc, 2, lam, F, fluctuations=fl).h == 0.0
    # nothing rejected from max ⌈T/b⌉ on: identical to rejection=False
    for N in (4, 9):
        assert estimate_engine(acc, N, lam, F).h == estimate_engine(acc, N, lam, F, rejection=False).h


def test_prefix_variance_table_equals_direct_moments_of_admitted_set():
    # the per-prefix ∫Φ² table summed at J_i(N) must equal displacement_moments of the admitted accounting
    # (an independent kernel), for every admitted set
    from kvhit.estimate.occupancy import _PrefixVariance

    acc = engine_accounting(_TR, engine="vllm-0.23", metric="tokens")
    tg = np.array([0.0, 1.5, 7.0, 20.0, 55.0, 200.0])
    pv = _PrefixVariance(acc, tg)
    for N in np.unique(np.quantile(acc.need, [0.0, 0.2, 0.5, 0.8, 0.97])).astype(int):
        _, v = displacement_moments(acc.admitted(int(N)), tg)
        np.testing.assert_allclose(pv.v1(int(N)), v, rtol=1e-10, atol=1e-9)


def test_rejection_vectorized_over_capacities_equals_per_capacity():
    acc = engine_accounting(_TR, engine="vllm", metric="blocks")
    Ns = np.unique(np.quantile(acc.need, np.linspace(0, 1, 9)).astype(int) + np.array([0, 1] * 4 + [0]))
    Ns = np.append(Ns, acc.max_need + 5)
    vec = estimate_engine(acc, Ns, 1.2).h
    for k, N in enumerate(Ns):
        one = estimate_engine(acc.admitted(int(N)), int(N), 1.2, rejection=False).h
        assert vec[k] == pytest.approx(one, rel=1e-9, abs=1e-12)


def _accuracy_rejection(n_seeds, rejection):
    # prompts large against N: ≈ 10-20 % of the requests need more than N blocks
    errs, acts = [], []
    for seed in range(n_seeds):
        tr = token_trace(200 + seed, n_conv=1500, b=16, lam0=0.2, mu=20.0, p_mean=250.0, r_mean=60.0)
        win = Window.warmup_conversations(tr, 300)
        N = 100
        res, m = simulate_trace_block(tr, N, engine="vllm", window=win, requests=block_requests(tr, source="counts"))
        est = estimate_window(tr, N, 0.2, window=win, engine="vllm", rejection=rejection).h
        errs.append(est - m["token_hit_ratio"])
        acts.append(m["token_hit_ratio"])
    return errs, acts, res.rejected.mean()


def test_window_estimator_with_rejections_within_simulation_ci():
    errs, acts, frac = _accuracy_rejection(4, True)
    assert 0.05 < frac < 0.5
    e_mean, e_hw = mean_ci(errs)
    _, a_hw = mean_ci(acts)
    assert abs(e_mean) <= e_hw + a_hw
    # and counting the rejected requests (the former estimator) is detectably wrong on the same workload
    errs0, _, _ = _accuracy_rejection(4, False)
    assert abs(np.mean(errs0)) > e_hw + a_hw + abs(e_mean)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 60),  # H: history blocks
            st.one_of(st.just(0.0), st.floats(0.0, 3000.0)),  # mean of D
            st.one_of(st.just(0.0), st.floats(1e-9, 1e-3), st.floats(0.01, 600.0)),  # sd of D
        ),
        min_size=1,
        max_size=30,
    ),
    st.lists(st.integers(0, 5000), min_size=1, max_size=12),
    st.booleans(),
)
def test_row_hits_kernel_is_its_reference_bit_for_bit(rows, Cs, prefix):
    """_row_hits_kernel (saturated leading terms counted, the sum stopped once a term no longer changes it) sums
    exactly what the term-by-term _row_hits_reference sums, at every capacity, with and without the terms
    remembered across capacities (in any order, repeated, neighbouring)."""
    from kvhit.estimate.engine import _row_hits_kernel, _row_hits_reference, _saturation_point

    H = np.array([r[0] for r in rows], float)
    mean = np.array([r[1] for r in rows])
    sd = np.array([r[2] for r in rows])
    size = H + 1.0
    xsat = np.empty(H.size)
    _saturation_point(mean, sd, xsat)
    P = 4  # few slots: remembered terms are overwritten and re-evaluated as well as read back
    mval, mkey = np.empty(H.size * P), np.full(H.size * P, np.nan)
    none = np.empty(0)
    for C in Cs + sorted(Cs) + [c + 1 for c in Cs]:
        a, b, c = np.empty(H.size), np.empty(H.size), np.empty(H.size)
        _row_hits_kernel(H, size, mean, sd, float(C), prefix, a, xsat, none, none)
        _row_hits_kernel(H, size, mean, sd, float(C), prefix, c, xsat, mval, mkey)
        _row_hits_reference(H, size, mean, sd, float(C), prefix, b)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(c, b)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(-50.0, 5e4), st.one_of(st.floats(1e-3, 1e3), st.floats(1e3, 2e5))), min_size=1, max_size=20
    )
)
def test_saturation_point_is_the_first_whole_x_reading_one(rows):
    """For any mean and sd (the bracket narrowed around the erfc threshold or not) the point is the smallest whole
    x ≥ 0 whose term reads exactly 1.0, or +inf where none does up to mean + 10·sd + 2."""
    from kvhit.estimate.engine import _prefix_term, _saturation_point

    mean = np.array([r[0] for r in rows])
    sd = np.array([r[1] for r in rows])
    x = np.empty(mean.size)
    _saturation_point(mean, sd, x)
    for r in range(mean.size):
        if np.isinf(x[r]):
            hi = np.ceil(max(mean[r], 0.0) + 10.0 * sd[r]) + 2.0
            assert _prefix_term(hi + 1.0, 0, mean[r], sd[r]) != 1.0
            continue
        assert x[r] >= 0 and x[r] == np.floor(x[r])
        assert _prefix_term(x[r] + 1.0, 0, mean[r], sd[r]) == 1.0
        assert x[r] == 0 or _prefix_term(x[r], 0, mean[r], sd[r]) < 1.0


def test_saturation_point_is_where_the_term_first_reads_one():
    """The bisection finds the first whole x with P(D ≤ x) == 1.0 in double precision: one below it reads less."""
    from kvhit.estimate.engine import _prefix_term, _saturation_point

    mean, sd = np.array([0.0, 37.5, 900.0, 5.0]), np.array([1.0, 4.0, 80.0, 0.0])
    x = np.empty(4)
    _saturation_point(mean, sd, x)
    assert x[3] == np.inf
    for r in range(3):
        assert _prefix_term(x[r] + 1.0, 0, mean[r], sd[r]) == 1.0
        assert x[r] == 0 or _prefix_term(x[r], 0, mean[r], sd[r]) < 1.0
        assert mean[r] + 5 * sd[r] < x[r] < mean[r] + 9 * sd[r] + 1
