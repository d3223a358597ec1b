"""The two-tier estimator's GPU and GPU-tail law tables built together (issue 23 §6, ``tiers.SHARE_TAIL_TABLE``).

``kvhit.estimate.agentic.law_tables`` fills the GPU term's and the tail term's tables (the same conversations and
value grid, other segments) with one Lévy sweep per age for both (``agentic_displacement._poisson_finish`` over two
prepared states) and computes a cell the two share once. A bin's sum is then cut at the knots of both tables' rows:
equal to rounding, not bit for bit. Pinned here: (1) the estimates equal literals computed by the code before the
change (commit 787eb77, ``SHARE_TAIL_TABLE`` did not exist; printed by ``estimate_tiers`` on these inputs) to 1e-12;
(2) shared against apart (``SHARE_TAIL_TABLE = False``, today's reference path) to 1e-12, with lam0, a measured mask
and admitted sets below N_min; (3) the tables themselves: same cells, rows and grid, ``Hb`` to 1e-12; (4) the shared
path is taken (one fill of two states), and a single table through ``_poisson_finish`` is ``_poisson_table``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvhit.estimate.agentic_displacement as AD
import kvhit.estimate.tiers as TI
from kvhit.estimate.agentic import law_tables
from kvhit.estimate.tiers import estimate_tiers
from kvhit.workload.production import read_mooncake, read_weka
from kvhit.workload.reuse import request_reuse

DATA = Path(__file__).parent / "data" / "production"
WEKA = [DATA / "weka_0022.json", DATA / "weka_0014_cut.json", DATA / "weka_0026.json"]
NS = np.array([1192, 2500, 6000])
CS = np.array([0, 40, 200, 600])

# estimate_tiers(...).hit at commit 787eb77 (before the shared tables), WEKA conversations above, uniform starts over
# 1 h, seed 0; printed with repr (17 significant digits)
LIT = {
    ("lmcache", None): [
        [0.723213603452891, 0.723213603452891, 0.723213603452891, 0.7487343739244746],
        [0.7490268952828179, 0.7490268952828179, 0.7490268952828179, 0.7490268952828179],
        [0.7497790610348375, 0.7497790610348375, 0.7497790610348375, 0.7497790610348375],
    ],
    ("lmcache", 1 / 120): [
        [0.4796857790510466, 0.4796857790510466, 0.4796857790510466, 0.6436841285101749],
        [0.6606482370459582, 0.6606482370459582, 0.6606482370459582, 0.6606482370459582],
        [0.727970355413098, 0.727970355413098, 0.727970355413098, 0.727970355413098],
    ],
    ("native4", None): [
        [0.723213603452891, 0.7251440181319656, 0.7495813205711782, 0.749682315609926],
        [0.7490268952828179, 0.7490268952828179, 0.749675823940897, 0.7497768189796449],
        [0.7497790610348375, 0.7497790610348375, 0.7497790610348375, 0.7497790981756909],
    ],
    ("lmcache_small", None): [
        [0.577298334315386, 0.577298334315386, 0.5842456614249436, 0.6353699138282917],
        [0.7490269010673939, 0.7490269010673939, 0.7490269010673939, 0.7490269010673939],
    ],
}


@pytest.fixture(scope="module")
def weka():
    return read_weka([str(p) for p in WEKA], arrival="uniform", span=3600, seed=0)


def _run(weka, case, lam0):
    if case == "lmcache":
        return estimate_tiers(weka, NS, CS, tier="lmcache", chunk_tokens=256, lam0=lam0)
    if case == "native4":
        return estimate_tiers(weka, NS, CS * 4, tier="native", blocks_per_chunk=4, lam0=lam0)
    return estimate_tiers(weka, np.array([600, 2500]), CS, tier="lmcache", chunk_tokens=256, lam0=lam0)


@pytest.mark.parametrize("case,lam0", list(LIT))
def test_equal_to_the_estimates_before_the_change(weka, case, lam0):
    h = _run(weka, case, lam0).hit
    assert np.abs(h - np.array(LIT[(case, lam0)])).max() <= 1e-12


@pytest.mark.parametrize("lam0", [None, 1 / 120])
@pytest.mark.parametrize("measured", [False, True])
def test_shared_equals_apart(weka, monkeypatch, lam0, measured):
    meas = (np.arange(weka.n_requests) % 3 != 0) if measured else None
    Ns = np.array([300, 900, 1192, 4000])  # two admitted sets below N_min = 1,192
    Cs = np.array([0, 30, 300, 3000])
    got = {}
    for share in (True, False):
        monkeypatch.setattr(TI, "SHARE_TAIL_TABLE", share)
        e = estimate_tiers(weka, Ns, Cs, tier="lmcache", chunk_tokens=256, lam0=lam0, measured=meas)
        got[share] = e
    for k in ("hit", "gpu_hit", "host_hit"):
        a, b = getattr(got[True], k), getattr(got[False], k)
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert np.nanmax(np.abs(a - b)) <= 1e-12


def test_mooncake_sample_shared_equals_apart(monkeypatch):
    mc = read_mooncake(DATA / "mooncake_small.jsonl")
    d = mc.describe()
    Ns = np.unique(np.geomspace(d["min_N"], d["distinct_blocks"], 4).astype(np.int64))
    Cs = np.array([0, 10, 100, 1000])
    out = []
    for share in (True, False):
        monkeypatch.setattr(TI, "SHARE_TAIL_TABLE", share)
        out.append(estimate_tiers(mc, Ns, Cs, tier="lmcache", chunk_tokens=2 * mc.block_size).hit)
    assert np.abs(out[0] - out[1]).max() <= 1e-12


def test_tables_shared_equal_apart_and_the_shared_path_is_taken(weka, monkeypatch):
    from dataclasses import replace

    u = request_reuse(weka)
    uc = request_reuse(weka, chunk_blocks=16)
    seg_req = np.repeat(np.arange(u.n, dtype=np.int64), np.diff(u.seg_off))
    u_tail = replace(u, seg_start=np.maximum(u.seg_start, 16 * uc.L_any[seg_req]))
    kw = {"per_request": True}
    fills = []
    fin = AD._poisson_finish
    monkeypatch.setattr(AD, "_poisson_finish", lambda st: fills.append(len(st)) or fin(st))
    shared = law_tables([(u, NS, kw), (u_tail, NS, kw)])
    assert fills == [2]
    for (tab, _), src in zip(shared, (u, u_tail), strict=True):
        seg = np.repeat(np.arange(src.n, dtype=np.int64), np.diff(src.seg_off))
        keep = np.minimum(src.seg_end, src.hit_cap[seg]) > src.seg_start
        apart = AD._poisson_table(src, seg[keep], src.seg_src[keep], src.full_blocks, NS, None, None, 2048, 16, 64,
                                  "auto", [], 6e7, footprint="own", bin_rule="br")  # fmt: skip
        assert tab[1] == apart[1] and np.array_equal(tab[2], apart[2]) and np.array_equal(tab[3], apart[3])
        assert tab[0].shape == apart[0].shape
        assert np.abs(tab[0] - apart[0]).max() <= 1e-12 * max(1.0, np.abs(apart[0]).max())


def test_one_state_is_the_table():
    rng = np.random.default_rng(3)
    u = request_reuse(read_weka([str(WEKA[0])], arrival="uniform", span=600, seed=1))
    seg = np.repeat(np.arange(u.n, dtype=np.int64), np.diff(u.seg_off))
    keep = np.minimum(u.seg_end, u.hit_cap[seg]) > u.seg_start
    args = (u, seg[keep], u.seg_src[keep], u.full_blocks, np.array([int(rng.integers(500, 5000))]), None, None, 512,
            16, 64, "auto", [], 6e7)  # fmt: skip
    a = AD._poisson_table(*args, footprint="own", bin_rule="br")
    b = AD._poisson_tables([(args, {"footprint": "own", "bin_rule": "br"})])[0]
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y


@pytest.mark.parametrize("G,J", [(2048, 2049), (700, 701), (5, 6), (100, 40)])
def test_cdf_running_sums_bit_for_bit(G, J):
    """The fused pass (_cdf_running_sums: the CDF's clamps and the table's running sum in one compiled loop) is
    numpy's ``cumsum(compound_poisson_cdf(ν)·δ)`` bit for bit, zero rows and heavy rows (CDF clamped at 1)
    included."""
    rng = np.random.default_rng(G)
    P = 70
    nu = rng.random((P, J)) * (rng.random((P, J)) < 0.05) * 2
    nu[::7] = 0
    nu[::11] *= 50
    for delta in (1.0, 8.229, 59.390625):
        ref = np.zeros((P, G + 1))
        ref[:, 1:] = np.cumsum(AD.compound_poisson_cdf(nu, G) * delta, axis=1)
        got = np.zeros((P, G + 1))
        AD._cdf_running_sums(nu, G, delta, got, np.arange(P))
        assert np.array_equal(ref, got)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), W=st.integers(1, 6))
def test_levy_by_age_cell_bound_too_small_is_swept_again(seed, W):
    """A cell bound W below the footprints' cells makes _levy_by_age return G without writing; _levy_rows then
    sweeps with W = G. Either way the masses are those of the full-width sweep (W = G), bit for bit."""
    rng = np.random.default_rng(seed)
    K = int(rng.integers(2, 6))
    m = rng.integers(2, 5, K)
    ts = np.concatenate([[0], np.cumsum(m)[:-1]]).astype(np.int64)
    te = (ts + m).astype(np.int64)
    tau = np.concatenate([np.sort(rng.uniform(0, 40, k)) - 0.0 for k in m])
    for k in range(K):
        tau[ts[k] : te[k]] -= tau[ts[k]]
    fx_first = rng.integers(1, 60, int(m.sum())).astype(np.float64)
    cumnew = np.concatenate([[0.0], np.cumsum(rng.integers(0, 30, int(m.sum())).astype(np.float64))])
    s_grid = np.linspace(-50.0, 120.0, 5)
    Lc = np.concatenate([[0.0], np.cumsum(rng.integers(1, 4, 4).astype(np.float64))])
    G, delta = 64, float(rng.choice([1.0, 2.5, 7.0]))
    t_rows = np.sort(rng.uniform(0, 100, 4))
    foot, fbase = np.zeros(0), np.zeros(0, np.int64)
    full = np.zeros((4, G + 1))
    AD._levy_by_age(ts, te, tau, fx_first, cumnew, 9.0, -1, t_rows, s_grid, Lc, delta, G, 0.5, full, np.arange(4),
                    foot, fbase, G)  # fmt: skip
    small = np.zeros((4, G + 1))
    r = AD._levy_by_age(ts, te, tau, fx_first, cumnew, 9.0, -1, t_rows, s_grid, Lc, delta, G, 0.5, small,
                        np.arange(4), foot, fbase, W)  # fmt: skip
    if r:
        assert r == G and not small.any()
        AD._levy_by_age(ts, te, tau, fx_first, cumnew, 9.0, -1, t_rows, s_grid, Lc, delta, G, 0.5, small,
                        np.arange(4), foot, fbase, G)  # fmt: skip
    assert np.array_equal(full, small)
    # the bound _levy_rows uses holds every cell: no second sweep needed
    Wb = AD._cell_bound(ts, te, fx_first, cumnew, foot, delta, G)
    again = np.zeros((4, G + 1))
    assert AD._levy_by_age(ts, te, tau, fx_first, cumnew, 9.0, -1, t_rows, s_grid, Lc, delta, G, 0.5, again,
                           np.arange(4), foot, fbase, Wb) == 0  # fmt: skip
    assert np.array_equal(full, again)


def _classes_reference(ts, te, tau, fx_first, cumnew):
    """The loop over every template that _template_classes replaced (787eb77's _poisson_table, verbatim)."""
    C = ts.shape[0]
    rep = np.arange(C, dtype=np.int64)
    seen: dict = {}
    cn = np.diff(cumnew)
    for k in range(C):
        a_, b_ = int(ts[k]), int(te[k])
        sig = (b_ - a_, tau[a_:b_].tobytes(), fx_first[a_:b_].tobytes(), cn[a_ + 1 : b_].tobytes())
        rep[k] = seen.setdefault(sig, k)
    return rep, len(seen)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), C=st.integers(0, 40), kinds=st.integers(1, 6))
def test_template_classes_equal_the_loop(seed, C, kinds):
    """Templates drawn from a few kinds (many exact copies, and near-copies that differ in one inner value only):
    the same representatives and class count as the loop over every template."""
    rng = np.random.default_rng(seed)
    protos = []
    for _ in range(kinds):
        m = int(rng.integers(1, 4))
        protos.append((np.sort(rng.integers(0, 3, m)).astype(np.float64), rng.integers(1, 4, m).astype(np.float64),
                       rng.integers(0, 3, m).astype(np.float64)))  # fmt: skip
    tau_l, fx_l, new_l, m_l = [], [], [], []
    for _ in range(C):
        t, f, n = (x.copy() for x in protos[int(rng.integers(0, kinds))])
        if t.size > 2 and rng.random() < 0.3:
            f[1] += 1.0  # differs inside only: the cheap key cannot tell it apart
        tau_l.append(t - t[0])
        fx_l.append(f)
        new_l.append(n)
        m_l.append(t.size)
    m = np.array(m_l, np.int64)
    ts = np.concatenate([[0], np.cumsum(m)[:-1]]).astype(np.int64) if C else np.zeros(0, np.int64)
    te = ts + m
    cat = (lambda xs: np.concatenate(xs)) if C else (lambda xs: np.zeros(0))
    tau, fx_first, new = cat(tau_l), cat(fx_l), cat(new_l)
    cumnew = np.concatenate([[0.0], np.cumsum(new)])
    rep, n = AD._template_classes(ts, te, tau, fx_first, cumnew)
    rref, nref = _classes_reference(ts, te, tau, fx_first, cumnew)
    assert n == nref and np.array_equal(rep, rref)
