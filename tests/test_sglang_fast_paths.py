"""The fast paths of the SGLang estimators (issue 23 §6) against their references and against values of the code
they replaced.

* :func:`kvhit.estimate.sglang_agentic._curve_thresholds` (every pool by thresholds) and
  :func:`kvhit.estimate.sglang_agentic._joint_other_sweep` (the joint background in one sweep): the literals
  below were computed by the code at the branch point of this work (main at e442ffa: the per-pool pass
  ``_replay_curve`` and the per-conversation ``_joint_other``), not by the code under test; hypothesis pins the
  sweep equal to the per-conversation loop on random backgrounds.
* :func:`kvhit.estimate.occupancy_shifted.shifted_G_sums` (the Hermite series) against ``w @ G(c − e)``, and
  :func:`kvhit.estimate.sglang.estimate_sglang` with ``series=True`` against ``series=False``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import ndtr

from kvhit.estimate.occupancy_shifted import shifted_G_sums, shifted_G_values
from kvhit.estimate.sglang import estimate_sglang, sglang_accounting
from kvhit.estimate.sglang_agentic import _joint_other, _joint_other_sweep, estimate_trace_sglang
from kvhit.estimate.sglang_window_sums import (
    _node_cumsums,
    _revisit_moments,
    _window_hits,
    _window_hits_sat,
    _window_hits_series,
)
from kvhit.workload.production import read_mooncake, read_weka
from test_estimate_engine import token_trace

PROD = Path(__file__).parent / "data" / "production"
WEKA3 = [PROD / "weka_0022.json", PROD / "weka_0026.json", PROD / "weka_0014_cut.json"]


@pytest.mark.parametrize(
    ("kw", "want"),
    [
        (
            {"samples": 4, "background": "marginal"},
            [0.5464093869099421, 0.7073126002394076, 0.71478158229051, 0.7434304634436676] + [0.7497790981871046] * 3,
        ),
        (
            {"samples": 4, "lam0": 0.05},
            [0.03537096499914973, 0.05052232858852911, 0.10691314307435305, 0.1206507350612023]
            + [0.1546879532655123, 0.265548986852591, 0.37731696826016065],
        ),
    ],
)
def test_block_trace_estimate_equals_the_replaced_code_on_weka(kw, want):
    """Values of main at e442ffa (per-pool curve kernel), bit for bit: the threshold pass changes no sum."""
    pt = read_weka(WEKA3, arrival="uniform", span=60, seed=3)
    Cs = [76458, 91821, 110271, 132430, 159040, 190997, 229377]
    assert estimate_trace_sglang(pt, Cs, **kw).h.tolist() == want


def test_joint_background_equals_the_replaced_code():
    """The default (joint background) on WEKA and Mooncake, values of main at e442ffa, bit for bit."""
    pt = read_weka(WEKA3, arrival="uniform", span=60, seed=3)
    Cs = [76459, 79007, 81556, 84104, 86653, 89202, 91750]
    want = [0.7223928306663955, 0.72310416229031, 0.72310416229031, 0.7319958075892415] + [0.7497790981871046] * 3
    assert estimate_trace_sglang(pt, Cs, samples=6).h.tolist() == want
    pm = read_mooncake(PROD / "mooncake_small.jsonl")
    Cs = [4275, 7071, 11697, 19348, 32004, 52940, 87570]
    want = [0.07481382201485393, 0.17155583324095816, 0.2257313595275765, 0.2308909334596354]
    want += [0.23476061390867958, 0.23476061390867958, 0.2360505073916943]
    assert estimate_trace_sglang(pm, Cs, samples=8).h.tolist() == want


@settings(max_examples=60, deadline=None)
@given(
    n_tmpl=st.integers(1, 7),
    n_win=st.integers(1, 25),
    seed=st.integers(0, 2**31 - 1),
    grid=st.booleans(),
)
def test_joint_sweep_equals_the_per_conversation_loop(n_tmpl, n_win, seed, grid):
    """Random templates (relative times, footprints, new parts), starts and windows — on a coarse time grid too,
    where requests, starts and window edges tie — the sweep's Φ equals the per-conversation loop's exactly."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, n_tmpl)
    te = np.cumsum(sizes).astype(np.int64)
    ts = te - sizes
    P = int(te[-1])
    tau = np.zeros(P)
    for k in range(n_tmpl):
        gaps = rng.integers(0, 4, sizes[k] - 1) if grid else rng.exponential(3.0, sizes[k] - 1)
        tau[ts[k] + 1 : te[k]] = np.cumsum(gaps)
    fx = rng.integers(1, 500, P)
    new = np.minimum(fx, rng.integers(0, 500, P))
    new[ts] = fx[ts]
    cumnew = np.concatenate([[0.0], np.cumsum(new).astype(float)])
    stt = rng.integers(0, 20, n_tmpl).astype(float) if grid else rng.uniform(0, 20, n_tmpl)
    # windows: (seg_s, seg_r) into a time array; the tagged request's template or −1
    n_req = 2 * n_win
    time = np.sort(rng.integers(0, 30, n_req).astype(float) if grid else rng.uniform(0, 30, n_req))
    seg_s = rng.integers(0, n_req, n_win)
    seg_r = np.maximum(seg_s, rng.integers(0, n_req, n_win))
    tmpl_of_req = rng.integers(-1, n_tmpl, n_req).astype(np.int64)
    o = np.argsort(stt, kind="stable")
    dur = float(tau[te - 1].max())
    ref = np.zeros(n_win)
    _joint_other(seg_r, seg_s, time, tmpl_of_req, stt[o], o.astype(np.int64), dur, ts, te, tau, fx.astype(float),
                 cumnew, ref)  # fmt: skip
    w_t1, w_t2 = time[seg_s], time[seg_r]
    got = np.zeros(n_win)
    w_ord = np.argsort(-w_t1, kind="stable").astype(np.int64)
    cn = cumnew.astype(np.int64)
    _joint_other_sweep(w_t1, w_t2, tmpl_of_req[seg_r], w_ord, stt, ts, te, tau, fx.astype(np.int64), np.diff(cn),
                       cn, got)  # fmt: skip
    np.testing.assert_array_equal(got, ref)


def _direct(G, e, w, c):
    """Σ_e w_e G(c − e) term by term, scipy's ndtr (as :class:`kvhit.estimate.occupancy._Occupancy`)."""
    x = c[:, None, None] - e[None, :, None]
    sd = np.where(G.sd > 0, G.sd, 1.0)
    g = np.where(G.sd > 0, ndtr((x + 0.5 - G.mean) / sd), (x >= G.mean).astype(float))
    return ((g @ G.p) * w).sum(axis=1)


@settings(max_examples=60, deadline=None)
@given(
    nq=st.integers(1, 40),
    ne=st.integers(1, 60),
    spread=st.sampled_from([0.0, 3.0, 100.0, 3000.0]),
    sd_scale=st.sampled_from([1.0, 50.0, 800.0, 1e5]),
    zero_sd=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_shifted_sums_equal_the_term_by_term_sum(nq, ne, spread, sd_scale, zero_sd, seed):
    """Series components (node ends within 2 sd), direct ones (wider), steps (sd 0) and saturated ones: within
    1e-13 of Σ w (the sums are at most Σ w)."""
    rng = np.random.default_rng(seed)
    e = np.unique(np.round(rng.uniform(0, spread, ne)))
    w = rng.integers(1, 100, e.size).astype(float)
    mean = rng.uniform(0, 20_000, nq)
    sd = sd_scale * rng.uniform(0.2, 2.0, nq)
    if zero_sd:
        sd[rng.random(nq) < 0.3] = 0.0
    p = rng.dirichlet(np.ones(nq))
    G = SimpleNamespace(mean=mean, sd=sd, p=p)
    c = np.round(e.max() + rng.uniform(0, 25_000, 30))
    np.testing.assert_allclose(shifted_G_sums(G, e, w, c), _direct(G, e, w, c), rtol=0, atol=1e-13 * w.sum())


@pytest.mark.parametrize("kw", [{}, {"page_size": 16}, {"rejection": False}, {"F": "posterior"}])
def test_stationary_series_equals_the_reference(kw):
    """estimate_sglang with the series equals G at every (pool, node end) within 1e-13, over pools that reject
    (several admitted sets), pools below the largest node end (evaluated directly) and pools far above."""
    tr = token_trace(4, n_conv=400, mu=200.0)
    sa = sglang_accounting(tr, page_size=kw.get("page_size", 1))
    Cs = np.unique(np.geomspace(64, 400_000, 40).astype(np.int64) // 16 * 16)
    Cs = Cs[Cs >= 16]
    new = estimate_sglang(tr, Cs, 1.0, **kw).h
    ref = estimate_sglang(tr, Cs, 1.0, series=False, **kw).h
    np.testing.assert_allclose(new, ref, rtol=0, atol=1e-13)
    assert len(np.unique(np.round(new, 6))) > 10
    assert int(sa.need.max()) > Cs[3]  # some pools reject


@settings(max_examples=40, deadline=None)
@given(
    nq=st.integers(1, 40),
    ne=st.integers(1, 60),
    spread=st.sampled_from([0.0, 3.0, 100.0, 3000.0]),
    sd_scale=st.sampled_from([1.0, 50.0, 800.0, 1e5]),
    zero_sd=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_shifted_values_equal_G(nq, ne, spread, sd_scale, zero_sd, seed):
    """G(c − e) at every (pool, end) by the folded series equals G term by term within 1e-13."""
    rng = np.random.default_rng(seed)
    e = np.unique(np.round(rng.uniform(0, spread, ne)))
    mean = rng.uniform(0, 20_000, nq)
    sd = sd_scale * rng.uniform(0.2, 2.0, nq)
    if zero_sd:
        sd[rng.random(nq) < 0.3] = 0.0
    G = SimpleNamespace(mean=mean, sd=sd, p=rng.dirichlet(np.ones(nq)))
    c = np.round(e.max() + rng.uniform(0, 25_000, 20))
    want = np.stack([_direct(G, e[i : i + 1], np.ones(1), c) for i in range(e.size)], axis=1)
    np.testing.assert_allclose(shifted_G_values(G, e, c), want, rtol=0, atol=1e-13)


def test_stationary_series_with_shared_prefixes_equals_the_reference():
    """Token ids with shared first-turn prefixes (100 templates of 40–400 tokens, groups of 3: the own chain's G
    is often above the group's q): the shared segments' G by the series, the node sum too, within 1e-13 of the
    reference."""
    tr = token_trace(8, n_conv=300, mu=200.0)
    rng = np.random.default_rng(8)
    heads = [rng.integers(0, 50_000, n) for n in rng.integers(40, 400, 100)]
    conv = np.asarray(tr["conv"])
    first = np.concatenate([[True], conv[1:] != conv[:-1]])
    toks = []
    for r in range(len(tr)):
        own = rng.integers(50_000, 100_000, int(tr["prompt_tokens"][r]))
        toks.append(np.concatenate([heads[int(conv[r]) % 100], own]) if first[r] else own)
    tr.lists["new_tokens"] = toks
    sa = sglang_accounting(tr)
    assert sa.shared and np.unique(sa.seg_end).size >= 5
    Cs = np.unique(np.geomspace(2_000, 400_000, 30).astype(np.int64))
    new = estimate_sglang(sa, Cs, 1.0).h
    ref = estimate_sglang(sa, Cs, 1.0, series=False).h
    np.testing.assert_allclose(new, ref, rtol=0, atol=1e-13)
    assert len(np.unique(np.round(new, 6))) > 10


@settings(max_examples=60, deadline=None)
@given(
    n_rev=st.integers(1, 30),
    sd_scale=st.sampled_from([0.0, 1.0, 30.0, 1000.0, 1e5]),
    c=st.floats(0, 50_000) | st.floats(40_001, 90_000),
    seed=st.integers(0, 2**31 - 1),
)
def test_window_hits_with_saturated_runs_equal_the_reference(n_rev, sd_scale, c, seed):
    """The window form's per-revisit node sums with the saturated runs read from running sums equal the
    term-by-term kernel within 1.2e-19·Σ len (the left-out terms' bound; measured: equal); by the per-revisit
    Hermite series within 1e-13·Σ len."""
    rng = np.random.default_rng(seed)
    cnt = rng.integers(0, 9, n_rev)
    ptr = np.concatenate([[0], np.cumsum(cnt)]).astype(np.int64)
    ends = np.concatenate([np.sort(rng.choice(40_000, k, replace=False)) + 1 for k in cnt]).astype(float)
    lens = rng.integers(1, 500, ends.size).astype(float)
    mean = rng.uniform(0, 40_000, n_rev)
    sd = sd_scale * rng.uniform(0.1, 2.0, n_rev)
    sd[rng.random(n_rev) < 0.2] = 0.0
    ref, got, ser = np.empty(n_rev), np.empty(n_rev), np.empty(n_rev)
    cum = _node_cumsums(ptr, lens)
    _window_hits(ptr, ends, lens, mean, sd, float(c), ref)
    _window_hits_sat(ptr, ends, lens, cum, mean, sd, float(c), got)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1.2e-19 * lens.sum())
    # the Hermite series per revisit (revisits within 2 sd; pools below a revisit's last end go term by term)
    e0, R, M, nterm = _revisit_moments(ptr, ends, lens, sd, 96)
    _window_hits_series(ptr, ends, lens, cum, e0, R, M, nterm, mean, sd, float(c), ser)
    np.testing.assert_allclose(ser, ref, rtol=0, atol=1e-13 * max(lens.sum(), 1.0))
