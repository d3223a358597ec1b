"""SGLang and host-tier replay bands on block-id traces (kvhit.estimate.replay_band, issue 23 §5).

Pinned against independent loops: the K realisations redrawn here with band.draw_starts / band.restart_sessions at
the same seed, each run through the simulator directly (SGLang: simulate_radix per pool; tiers: the step-wise
make_tiered models replayed request by request, not the compiled passes the module uses); (B1) evaluated by hand
with scipy's t quantile; the realisations are the vLLM band's (realisation_replays) at the same seed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import t as student_t

from kvhit.estimate.agentic import AgenticError
from kvhit.estimate.band import draw_starts, realisation_replays, restart_sessions
from kvhit.estimate.replay_band import replay_band, sglang_replays, start_draws, tier_replays
from kvhit.estimate.sglang_agentic import estimate_trace_sglang
from kvhit.sim.engine import replay, requests_from_stream
from kvhit.sim.sglang.radix import simulate_radix
from kvhit.sim.sglang.streams import streams_from_production
from kvhit.sim.tiers import make_tiered
from kvhit.sim.vllm.block import simulate_block, token_hit_ratio
from kvhit.workload.production import read_weka

D = "tests/data/production"
FILES = [f"{D}/weka_0014_cut.json", f"{D}/weka_0022.json", f"{D}/weka_0026.json"]


@pytest.fixture(scope="module")
def pt():
    return read_weka(FILES, arrival="uniform", span=600.0, seed=0, strict=False)


def _loop(pt, K, seed, order="keep-span"):
    """The K re-timed traces, drawn here (not through start_draws): ``keep-span`` (the default law) by hand — C
    uniform draws on the starts' range widened by one mean spacing each side, sorted and handed out in the observed
    order (this 3-session fixture: fewer than the KS test can reject); ``random``: draw_starts' i.i.d. histogram."""
    C = int(pt.session.max()) + 1
    first = np.full(C, np.inf)
    np.minimum.at(first, pt.session, pt.time)
    rng = np.random.default_rng(seed)
    if order == "random":
        return [restart_sessions(pt, draw_starts(first, rng)) for _ in range(K)]
    lo, hi = first.min(), first.max()
    d = (hi - lo) / (C - 1)
    out = []
    for _ in range(K):
        x = np.sort(rng.uniform(lo - d, hi + d, C))
        starts = np.empty(C)
        for rank, i in enumerate(sorted(range(C), key=lambda i: (first[i], i))):
            starts[i] = x[rank]
        out.append(restart_sessions(pt, starts))
    return out


@pytest.mark.parametrize("order", ["keep-span", "random"])
def test_sglang_replays_equal_a_direct_loop(pt, order):
    need = int((pt.prompt_tokens + np.maximum(pt.output_tokens, 1) - 1).max())
    Cs = np.array([need - 1, need, 2 * need, 4 * need], np.int64)
    H = sglang_replays(pt, Cs, replays=4, seed=5, workers=1, **({} if order == "keep-span" else {"order": order}))
    ref = np.full((4, Cs.size), np.nan)
    for k, q in enumerate(_loop(pt, 4, 5, order)):
        ts = streams_from_production(q)
        for j, c in enumerate(Cs):
            if c >= need:  # a request needing more than the pool is infeasible: NaN
                ref[k, j] = simulate_radix(ts, int(c)).token_hit_ratio()
    assert np.array_equal(np.isnan(H), np.isnan(ref))
    assert np.allclose(H[:, 1:], ref[:, 1:], rtol=0, atol=1e-12)
    # the realisations differ (the band has a spread) and the mean is the plain mean of the loop
    assert np.ptp(ref[:, 1]) > 0
    b = replay_band(H[:, 1:], 0.9)
    assert np.allclose(b.mean, ref[:, 1:].mean(axis=0), atol=1e-12)
    assert np.allclose(b.se, ref[:, 1:].std(axis=0, ddof=1) / 2.0, atol=1e-12)


@pytest.mark.parametrize("tier,kw,host", [("native", {}, [0, 300, 1200]), ("lmcache", {"chunk_tokens": 256}, [0, 75]),
                                          ("simple", {}, [1, 300, 1200])])  # fmt: skip
def test_tier_replays_equal_the_step_wise_models(pt, tier, kw, host):
    b = pt.block_size
    N_min = int((-(-pt.prompt_tokens // b)).max())
    Ns = [N_min - 1, N_min, N_min + 400]
    H = tier_replays(pt, Ns, host, tier=tier, replays=3, seed=2, **kw)
    assert np.isnan(H[:, 0]).all()  # a request larger than the GPU: NaN
    for k, q in enumerate(_loop(pt, 3, 2)):
        rq = q.to_block_requests()
        reqs = requests_from_stream(rq.prompt_tokens, rq.hash_offsets, rq.hashes)
        T = np.asarray(rq.prompt_tokens, np.int64)
        for i, N in enumerate(Ns[1:], start=1):
            for j, C in enumerate(host):
                e = make_tiered(tier, gpu_blocks=int(N), host_capacity=int(C), block_size=b, **kw)
                res = replay(e, reqs)
                assert not res.rejected.any()
                assert H[k, i, j] == pytest.approx(res.hit_tokens.sum() / T.sum(), abs=1e-12), (tier, k, N, C)


def test_same_realisations_as_the_vllm_band(pt):
    # realisation_replays (vLLM) at seed s and start_draws at seed s see the same start times
    N = int((-(-pt.prompt_tokens // pt.block_size)).max()) + 50
    H = realisation_replays(pt, [N], replays=3, seed=9)
    for k, q in enumerate(start_draws(pt, 3, 9)):
        rq = q.to_block_requests()
        r = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=N, block_size=rq.block_size)
        assert H[k, 0] == pytest.approx(token_hit_ratio(r), abs=1e-12)


def test_seeded_bit_for_bit(pt):
    need = int((pt.prompt_tokens + np.maximum(pt.output_tokens, 1) - 1).max())
    # (seed 5: one of its three draws interleaves the sessions enough to move the ratio at C = need; seed 1's not)
    a = sglang_replays(pt, [need, 3 * need], replays=3, seed=5, workers=1)
    b = sglang_replays(pt, [need, 3 * need], replays=3, seed=5, workers=2)
    c = sglang_replays(pt, [need, 3 * need], replays=3, seed=1, workers=1)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 40),
    st.integers(1, 5),
    st.floats(0.5, 0.99),
    st.integers(0, 2**31 - 1),
)
def test_b1_by_hand(K, n, level, seed):
    H = np.random.default_rng(seed).uniform(0.0, 0.8, (K, n))
    r = replay_band(H, level, h_max=0.9)
    m, s = H.mean(axis=0), H.std(axis=0, ddof=1)
    q = student_t.ppf(0.5 + level / 2.0, K - 1) * math.sqrt(1.0 + 1.0 / K)
    assert np.allclose(r.lo, np.clip(m - q * s, 0.0, 0.9)) and np.allclose(r.hi, np.clip(m + q * s, 0.0, 0.9))
    assert np.all(r.lo <= r.mean + 1e-15) and np.all(r.mean <= r.hi + 1e-15)
    assert np.allclose(r.se, s / math.sqrt(K))


def test_bad_arguments_refused(pt):
    with pytest.raises(AgenticError, match="replays"):
        sglang_replays(pt, [10**6], replays=1)
    with pytest.raises(AgenticError, match="Cs"):
        sglang_replays(pt, [0], replays=2)
    with pytest.raises(AgenticError, match="level"):
        replay_band(np.zeros((3, 2)), 1.5)


@pytest.fixture()
def weka_dir(tmp_path):
    import shutil

    for f in FILES:
        shutil.copy(f, tmp_path)
    return tmp_path


def test_cli_estimate_sglang_replays(weka_dir):
    import json

    from typer.testing import CliRunner

    from kvhit.cli import app
    from kvhit.service.inputs import load_production_file

    pt = load_production_file(weka_dir, arrival="uniform", span=600.0, seed=4)
    need = int((pt.prompt_tokens + np.maximum(pt.output_tokens, 1) - 1).max())
    Ns = [need - 1, need, 2 * need]
    args = ["estimate", "--blocks-trace", str(weka_dir), "--arrival", "uniform", "--span", "600", "--seed", "4"]
    args += ["--engine", "sglang", "--N", ",".join(map(str, Ns)), "--replays", "3", "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    ref = sglang_replays(pt, Ns, replays=3, seed=4).mean(axis=0)  # --seed seeds the redraws too
    est = estimate_trace_sglang(pt, Ns)
    rows = d["rows"]
    assert rows[0]["h"]["sglang"] is None and rows[0]["h_lo"]["sglang"] is None  # infeasible
    for k in (1, 2):
        assert rows[k]["h_mc"]["sglang"] == pytest.approx(ref[k], abs=1e-12)
        assert rows[k]["h"]["sglang"] == pytest.approx(est.h[k], abs=1e-12)  # h stays the analytic estimate
        lo, hi = rows[k]["h_lo"]["sglang"], rows[k]["h_hi"]["sglang"]
        assert lo <= rows[k]["h_mc"]["sglang"] <= hi
        if abs(est.h[k] - ref[k]) > 0.01 + 2 * rows[k]["h_mc_se"]["sglang"]:  # widened to contain h
            assert lo <= est.h[k] <= hi
    assert d["level"] == 0.9 and d["band"]["replays"] == 3 and not d["regime"]["sglang"]["validated"]
    for bad, msg in (
        (["--replays", "3", "--lam0", "0.01"], "--lam0"),
        (["--replays", "1"], "--replays"),
    ):
        r = CliRunner().invoke(app, [*args[:-3], *bad])
        assert r.exit_code == 2 and "--replays" in r.output and "Traceback" not in r.output, (bad, msg)
    r = CliRunner().invoke(app, ["estimate", "--blocks-trace", str(weka_dir), "--N", "2000", "--replays", "3"])
    assert r.exit_code == 2 and "--engine sglang" in r.output


def test_cli_tiers_replays(weka_dir):
    import json

    from typer.testing import CliRunner

    from kvhit.cli import app
    from kvhit.service.inputs import load_production_file

    pt = load_production_file(weka_dir)
    N_min = int((-(-pt.prompt_tokens // pt.block_size)).max())
    args = ["tiers", "--blocks-trace", str(weka_dir), "--tier", "simple", "--hbm-blocks", f"{N_min},{N_min + 300}"]
    args += ["--host-units", "1,600", "--replays", "3", "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    ref = tier_replays(pt, [N_min, N_min + 300], [1, 600], tier="simple", replays=3, seed=0).mean(axis=0)
    assert np.allclose(np.array(d["h_mc"], float), ref, atol=1e-12)
    assert d["validated"] is False and d["level"] == 0.9 and d["band"]["replays"] == 3
    lo, hi, m = (np.array(d[k], float) for k in ("h_lo", "h_hi", "h_mc"))
    assert np.all(lo <= m + 1e-15) and np.all(m <= hi + 1e-15)
    r = CliRunner().invoke(app, ["tiers", "--trace", "nope.parquet", "--hbm-blocks", "10", "--host-units", "1",
                                 "--replays", "3"])  # fmt: skip
    assert r.exit_code == 2 and "--replays: applies to --blocks-trace" in r.output and "Traceback" not in r.output


def test_sglang_band_widens_to_contain_a_distant_estimate(pt):
    from dataclasses import replace

    from kvhit.estimate.replay_band import sglang_band

    need = int((pt.prompt_tokens + np.maximum(pt.output_tokens, 1) - 1).max())
    Ns = np.array([need, 2 * need])
    est = estimate_trace_sglang(pt, Ns)
    far = replace(est, h=np.array([0.05, 0.05]))  # an estimate far below every replay
    e = sglang_band(pt, Ns, replays=3, seed=1, estimate=far)
    H = sglang_replays(pt, Ns, replays=3, seed=1)
    assert np.allclose(e.h_mc, H.mean(axis=0), atol=1e-12) and np.array_equal(e.h, far.h)
    assert np.all(e.h_lo <= 0.05) and np.all(e.h_hi >= e.h_mc) and e.band["widened"] == [True, True]
    assert e.regime["validated"] is False and any("widened to contain" in n for n in e.regime["notes"])
    near = sglang_band(pt, Ns, replays=3, seed=1, estimate=replace(est, h=H.mean(axis=0)))
    b = replay_band(H, 0.9, est.h_max)
    assert near.band["widened"] == [False, False] and np.allclose(near.h_lo, b.lo) and np.allclose(near.h_hi, b.hi)
