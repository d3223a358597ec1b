"""The agentic law table's Lévy masses by one sweep per age (``agentic_displacement._levy_by_age``, issue 23 §6).

Reference: the per-row sweep ``_levy_kernel`` (kept; ``LEVY_BY_AGE = False`` selects it). The by-age path regroups
the same sum (``λ_i·Δu`` per cut segment instead of ``Λ(t − u_prev) − Λ(t − u)`` per row), so the two agree to
rounding: the masses to 1e-12 relative, the estimates (``h``, per-request hits, the two-tier surface) to 1e-12
absolute. Checked on traces whose rows take the by-age path (more than 64 conversation classes or
``exclude=False``: no excluded template), on the stationary form (``lam0``), with the exact footprint table, and
on random templates (hypothesis).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvhit.estimate.agentic_displacement as AD
from kvhit.estimate.agentic import estimate_trace
from kvhit.estimate.tiers import estimate_tiers
from kvhit.workload.production import read_mooncake, read_weka
from kvhit.workload.reuse import request_reuse

DATA = Path(__file__).parent / "data" / "production"
MOON = DATA / "mooncake_small.jsonl"
W22, W26, W14 = DATA / "weka_0022.json", DATA / "weka_0026.json", DATA / "weka_0014_cut.json"


def _both(monkeypatch, fn):
    monkeypatch.setattr(AD, "LEVY_BY_AGE", False)
    ref = fn()
    monkeypatch.setattr(AD, "LEVY_BY_AGE", True)
    return ref, fn()


def _generated(n_conv=300, seed=3, p_cont=0.25):
    from kvhit.workload.dists import Constant, Exponential, Geometric
    from kvhit.workload.generate import generate
    from kvhit.workload.spec import IIDIncrements, WorkloadSpec

    spec = WorkloadSpec(0.05, Geometric(p_cont), IIDIncrements(Constant(40)), Exponential(30.0))
    tr = generate(spec, seed, n_conversations=n_conv)
    tr.meta["block_size"] = 16
    return tr


@pytest.mark.parametrize("engine", ["vllm", "vllm-0.23"])
@pytest.mark.parametrize("kw", [{}, {"lam0": 0.05}, {"footprint": "exact"}, {"bins": 7}])
def test_generated_trace_estimate_equals_per_row_sweep(monkeypatch, engine, kw):
    u = request_reuse(_generated())  # 300 conversations (> 64 classes): no excluded template, every row by age
    Ns = np.unique(np.geomspace(u.prompt_blocks.max(), 4 * u.distinct_blocks, 40).astype(np.int64))
    ref, new = _both(monkeypatch, lambda: estimate_trace(u, Ns, engine=engine, per_request=True, **kw))
    assert np.abs(new.h - ref.h).max() <= 1e-12
    assert np.abs(new.per_request - ref.per_request).max() <= 1e-12 * max(1.0, np.abs(ref.per_request).max())
    assert ref.h[-1] > 0.5 * ref.h_max  # the comparison is over a curve that rises, not over zeros


@pytest.mark.parametrize("exclude", [False, True])
def test_mooncake_and_weka_estimates_equal_per_row_sweep(monkeypatch, exclude):
    for pt in (read_mooncake(MOON), read_weka([W22, W26, W14], arrival="uniform", span=900, seed=2)):
        u = request_reuse(pt)
        Ns = np.unique(np.geomspace(u.prompt_blocks.max(), 4 * u.distinct_blocks, 30).astype(np.int64))
        ref, new = _both(monkeypatch, lambda u=u, Ns=Ns: estimate_trace(u, Ns, exclude=exclude))
        assert np.abs(new.h - ref.h).max() <= 1e-12


def test_tiers_surface_equals_per_row_sweep(monkeypatch):
    tr = _generated(150, seed=5, p_cont=0.8)  # 5 turns on average: many multi-request templates
    u = request_reuse(tr)
    n_min = int(u.prompt_blocks.max())
    hbm = np.unique(np.geomspace(n_min, 4 * n_min, 5).astype(np.int64))
    host = np.unique(np.geomspace(1, 8 * n_min, 8).astype(np.int64))
    calls = []
    by_age = AD._levy_by_age
    monkeypatch.setattr(AD, "_levy_by_age", lambda *a: calls.append(1) or by_age(*a))
    for tier, kw in (("native", {}), ("lmcache", {"chunk_tokens": 32})):
        ref, new = _both(monkeypatch, lambda tier=tier, kw=kw: estimate_tiers(tr, hbm, host, tier=tier, **kw))
        assert np.abs(new.hit - ref.hit).max() <= 1e-12
        assert np.abs(new.host_hit - ref.host_hit).max() <= 1e-12
        assert np.ptp(new.hit) > 0.05  # the surface varies over the grid
    assert calls  # the by-age path ran


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n_knots=st.integers(2, 9),
    G=st.sampled_from([8, 64, 300]),
    exact=st.booleans(),
)
def test_masses_equal_per_row_kernel_on_random_templates(seed, n_knots, G, exact):
    rng = np.random.default_rng(seed)
    K = int(rng.integers(1, 12))
    m = rng.integers(1, 7, K)
    ts = np.concatenate([[0], np.cumsum(m)[:-1]]).astype(np.int64)
    te = (ts + m).astype(np.int64)
    tau = np.concatenate([np.concatenate([[0.0], np.sort(rng.uniform(0, 50, k - 1))]) for k in m])
    fx_first = rng.integers(1, 40, tau.shape[0]).astype(np.float64)
    cumnew = np.concatenate([[0.0], np.cumsum(rng.integers(0, 30, tau.shape[0]).astype(np.float64))])
    foot, fbase = np.zeros(0), np.zeros(0, np.int64)
    if exact:
        sizes = (m + 1) ** 2
        fbase = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        foot = rng.integers(0, 200, int(sizes.sum())).astype(np.float64)
    # equal-width start bins, as _poisson_table's histogram (a bin far narrower than the times conditions both
    # paths: Λ's slope multiplies the rounding of t − u, ~1e-14 here)
    s_grid = np.linspace(rng.uniform(-20, 20), rng.uniform(60, 100), n_knots)
    Lc = np.concatenate([[0.0], np.cumsum(rng.integers(0, 5, n_knots - 1).astype(np.float64))])
    ages = rng.choice([0.0, 3.0, 17.5, 60.0], 3)
    P = 12
    a = rng.choice(ages, P)
    t = rng.choice(rng.uniform(0, 150, 4), P)
    x = np.where(rng.random(P) < 0.2, rng.integers(0, K, P), -1).astype(np.int64)
    delta = float(rng.choice([1.0, 2.5]))
    ref = np.zeros((P, G + 1))
    AD._levy_kernel(ts, te, tau, fx_first, cumnew, a, t, x, s_grid, Lc, delta, G, 0.3, ref, np.zeros((P, 3)), foot,
                    fbase)  # fmt: skip
    new = np.zeros((P, G + 1))
    AD._levy_rows(ts, te, tau, fx_first, cumnew, a, t, x, s_grid, Lc, delta, G, 0.3, new, foot, fbase)
    scale = max(1.0, np.abs(ref).max())
    assert np.abs(new - ref).max() <= 1e-12 * scale
    assert np.abs(new.sum(axis=1) - ref.sum(axis=1)).max() <= 1e-12 * scale


def test_compound_poisson_rows_bit_for_bit_in_any_batch():
    """compound_poisson_cdf works in blocks of rows: a row's CDF is the same bits alone as in any batch."""
    rng = np.random.default_rng(4)
    G = 700
    nu = np.zeros((150, G + 1))
    nu[:, 1:300] = rng.random((150, 299)) * rng.uniform(0.001, 0.05, (150, 1))
    nu[:, G] = rng.random(150) * 0.01
    whole = AD.compound_poisson_cdf(nu, G)
    assert all(np.array_equal(AD.compound_poisson_cdf(nu[i], G)[0], whole[i]) for i in (0, 63, 64, 149))
    assert np.array_equal(np.concatenate([AD.compound_poisson_cdf(nu[i : i + 7], G) for i in range(0, 150, 7)]), whole)
    assert np.all(np.diff(whole, axis=1) >= 0) and whole.max() <= 1.0


def test_window_same_equals_window_d():
    """``_window_same`` (the own-session displacement over the session's requests) is ``_window_D``'s ``out_same``."""
    nonzero = []
    for pt in (read_mooncake(MOON), read_weka([W22, W26, W14], arrival="uniform", span=900, seed=4), _generated()):
        u = request_reuse(pt)
        sr = np.repeat(np.arange(u.n), np.diff(u.seg_off))
        keep = u.seg_src >= 0
        sr, src = sr[keep], u.seg_src[keep]
        for bunit, Fx in ((1, u.full_blocks), (16, u.prompt_tokens)):
            same, other = np.zeros(sr.shape[0], np.int64), np.zeros(sr.shape[0], np.int64)
            adm = np.ones(u.n, bool)
            AD._window_D(sr, src, u.seg_src, u.seg_off, u.seg_end, Fx, u.session, adm, same, other, bunit)
            s_req = np.argsort(u.session, kind="stable")
            s_off = np.concatenate([[0], np.cumsum(np.bincount(u.session))]).astype(np.int64)
            got = np.zeros(sr.shape[0], np.int64)
            AD._window_same(sr, src, u.seg_src, u.seg_off, u.seg_end, Fx, u.session, s_off, s_req, got, bunit)
            assert np.array_equal(got, same)
            nonzero.append(bool((same != 0).any()))
    assert any(nonzero)  # some windows hold own-session requests (WEKA sub-agent bursts)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 100_000), n=st.integers(0, 60), cols=st.integers(1, 3))
def test_unique_rows_equals_numpy_unique(seed, n, cols):
    """``_unique_rows`` (the law table's cell keys) returns numpy's ``unique(axis=0, return_inverse=True)``."""
    rng = np.random.default_rng(seed)
    k = rng.choice(np.array([-3.5, -1.0, 0.0, 0.25, 2.0, 1e9]), (n, cols))  # many ties
    if n:
        k[:, 0] += rng.integers(0, 2, n) * rng.uniform(0, 1)
    u, inv = AD._unique_rows(k)
    u0, inv0 = np.unique(k, axis=0, return_inverse=True)
    assert np.array_equal(u, u0) and np.array_equal(inv, inv0.reshape(-1))
