"""The realisation band of the agentic estimator (issue 23, kvhit.estimate.band) and its surfaces.

Pinned against independent computations: the replays against the slow exact simulator (simulate_block) on the
re-timed trace, the band against (B1) evaluated by hand from the replays with scipy's t quantile; hypothesis for
the re-timing invariants; CLI outputs of the three issue-23 defects."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import t as student_t
from typer.testing import CliRunner

from kvhit.cli import app
from kvhit.estimate.agentic import AgenticError
from kvhit.estimate.band import (
    WIDEN,
    draw_starts,
    estimate_trace_band,
    in_validated_region,
    realisation_replays,
    restart_sessions,
)
from kvhit.sim.vllm.block import simulate_block, token_hit_ratio
from kvhit.workload.production import read_weka

D = "tests/data/production"
FILES = [f"{D}/weka_0014_cut.json", f"{D}/weka_0022.json", f"{D}/weka_0026.json"]
runner = CliRunner()


@pytest.fixture(scope="module")
def pt():
    return read_weka(FILES, arrival="uniform", span=600.0, seed=0, strict=False)


def _first(pt):
    C = int(pt.session.max()) + 1
    f = np.full(C, np.inf)
    np.minimum.at(f, pt.session, pt.time)
    return f


def test_restart_at_own_starts_is_identity(pt):
    r = restart_sessions(pt, _first(pt))
    for name in ("time", "prompt_tokens", "hash_offsets", "hashes", "session", "record"):
        assert np.array_equal(getattr(r, name), getattr(pt, name)), name


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.0, 5000.0, allow_nan=False), min_size=3, max_size=3))
def test_restart_keeps_each_session_and_sorts(starts):
    p = read_weka(FILES, arrival="uniform", span=600.0, seed=0, strict=False)
    r = restart_sessions(p, np.array(starts))
    assert np.all(np.diff(r.time) >= 0)
    f = _first(r)
    assert np.allclose(f, starts)
    for k in range(3):
        a, b = np.flatnonzero(p.session == k), np.flatnonzero(r.session == k)
        assert np.allclose(r.time[b] - starts[k], p.time[a] - p.time[a].min())  # offsets kept, order kept
        ids_p = np.concatenate([p.hashes[p.hash_offsets[i] : p.hash_offsets[i + 1]] for i in a])
        ids_r = np.concatenate([r.hashes[r.hash_offsets[i] : r.hash_offsets[i + 1]] for i in b])
        assert np.array_equal(ids_p, ids_r)


def test_draw_starts_seeded_and_inside_the_histogram():
    first = np.array([0.0, 10.0, 20.0, 500.0, 510.0, 1000.0])
    a = draw_starts(first, np.random.default_rng(3))
    b = draw_starts(first, np.random.default_rng(3))
    assert np.array_equal(a, b) and a.shape == first.shape
    assert a.min() >= 0.0 and a.max() <= 1000.0
    # 2 bins (round √6): [0, 500) holds 3 starts, [500, 1000] holds 3 — many draws split ≈ evenly
    rng = np.random.default_rng(11)
    many = np.concatenate([draw_starts(first, rng, bin_rule="sqrt") for _ in range(1000)])
    assert abs(np.mean(many < 500.0) - 0.5) < 0.03  # 6,000 draws: sd 0.0065


def test_draw_starts_bin_rules_differ_where_they_should():
    # 4 of 6 starts before 500. "sqrt": 2 bins [0, 500) / [500, 1000] → P(< 500) = 4/6. Birgé–Rozenholc (by hand:
    # D=2 (4, 2): 4 ln(8/6) + 2 ln(4/6) − 1.400 = −1.06; D=3 (4, 1, 1): 4 ln 2 + 2 ln(1/2) − 3.265 = −1.88; D=1: 0)
    # takes one bin → uniform on [0, 1000], P(< 500) = 1/2
    first = np.array([0.0, 10.0, 20.0, 30.0, 500.0, 1000.0])
    rng = np.random.default_rng(5)
    sq = np.concatenate([draw_starts(first, rng, bin_rule="sqrt") for _ in range(1000)])
    br = np.concatenate([draw_starts(first, rng) for _ in range(1000)])
    assert abs(np.mean(sq < 500.0) - 4 / 6) < 0.03 and abs(np.mean(br < 500.0) - 0.5) < 0.03


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 1.0, 7.5, 30.0, 100.0]) | st.floats(0.0, 1e4), min_size=1, max_size=40),
    st.integers(0, 2**32 - 1),
    st.sampled_from(["br", "sqrt"]),
)
def test_draw_starts_keep_order_is_the_random_draws_sorted_by_rank(first, seed, rule):
    first = np.array(first)
    r_keep, r_rand = np.random.default_rng(seed), np.random.default_rng(seed)
    keep = draw_starts(first, r_keep, bin_rule=rule, order="keep")
    rand = draw_starts(first, r_rand, bin_rule=rule, order="random")
    # the same rng calls: the same multiset of draws, and the generators end in the same state
    assert np.array_equal(np.sort(keep), np.sort(rand))
    assert r_keep.random() == r_rand.random()
    # the observed order is kept exactly: sessions ranked by their start (ties by session id) get rising draws
    rank = sorted(range(first.shape[0]), key=lambda k: (first[k], k))
    assert all(keep[rank[i]] <= keep[rank[i + 1]] for i in range(len(rank) - 1))
    # and the default is the former i.i.d. draw, bit for bit
    assert np.array_equal(draw_starts(first, np.random.default_rng(seed), bin_rule=rule), rand)


def test_keep_order_replays_restart_sessions_in_their_observed_order(pt):
    first = _first(pt)
    rng = np.random.default_rng(4)
    for _ in range(20):
        r = restart_sessions(pt, draw_starts(first, rng, order="keep"))
        assert np.array_equal(np.argsort(_first(r), kind="stable"), np.argsort(first, kind="stable"))
    with pytest.raises(AgenticError, match="order"):
        draw_starts(first, rng, order="sorted")


@pytest.mark.parametrize("order", ["random", "keep"])
def test_replays_equal_the_exact_simulator(pt, order):
    N_min = int(pt.prompt_blocks.max())
    Ns = np.array([N_min - 1, N_min, 2 * N_min])
    H = realisation_replays(pt, Ns, replays=3, seed=7, order=order)
    assert np.isnan(H[:, 0]).all()
    rng = np.random.default_rng(7)
    first = _first(pt)
    for k in range(3):
        rq = restart_sessions(pt, draw_starts(first, rng, order=order)).to_block_requests()
        for j in (1, 2):
            res = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=int(Ns[j]), block_size=rq.block_size)
            assert H[k, j] == pytest.approx(token_hit_ratio(res), abs=1e-12)


def test_keep_span_replays_by_hand(pt):
    """order="keep-span": each replay's starts are C uniform draws on [min − d, max + d], d = (max − min)/(C − 1),
    sorted and handed out in the observed order (ties by session id) — computed here by hand, replayed by the slow
    exact simulator; the widened span is used (not [min, max]) and the order is the observed one."""
    N_min = int(pt.prompt_blocks.max())
    Ns = np.array([N_min, 2 * N_min])
    H = realisation_replays(pt, Ns, replays=3, seed=5, order="keep-span")
    first = _first(pt)
    C = first.shape[0]
    lo, hi = first.min(), first.max()
    d = (hi - lo) / (C - 1)
    rng = np.random.default_rng(5)
    for k in range(3):
        x = np.sort(rng.uniform(lo - d, hi + d, C))
        starts = np.empty(C)
        for rank, i in enumerate(sorted(range(C), key=lambda i: (first[i], i))):
            starts[i] = x[rank]
        rq = restart_sessions(pt, starts).to_block_requests()
        for j in (0, 1):
            res = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=int(Ns[j]), block_size=rq.block_size)
            assert H[k, j] == pytest.approx(token_hit_ratio(res), abs=1e-12)
    assert not np.array_equal(H, realisation_replays(pt, Ns, replays=3, seed=5, order="keep"))
    est, _ = estimate_trace_band(pt, Ns, replays=3, seed=5, order="keep-span")
    assert est.band["order"] == "keep-span" and est.h_mc == pytest.approx(H.mean(axis=0), abs=1e-12)


def test_band_is_B1_by_hand_and_reproducible(pt):
    N_min = int(pt.prompt_blocks.max())
    Ns = np.array([N_min // 2, N_min, 2 * N_min, 8 * N_min])
    e, info = estimate_trace_band(pt, Ns, replays=5, seed=3)
    e2, _ = estimate_trace_band(pt, Ns, replays=5, seed=3)
    assert np.array_equal(e.h_lo, e2.h_lo, equal_nan=True) and np.array_equal(e.h_hi, e2.h_hi, equal_nan=True)
    assert not in_validated_region(pt) and e.regime["validated"] is False  # 3 conversations: widened
    assert any("widened" in n for n in e.regime["notes"])
    m = info.h[:, 1:].mean(axis=0)
    s = info.h[:, 1:].std(axis=0, ddof=1)
    q = student_t.ppf(0.95, 4) * math.sqrt(1.2)
    lo = np.clip(np.clip(m - q * s, 0, e.h_max) - WIDEN, 0, e.h_max)
    hi = np.clip(np.clip(m + q * s, 0, e.h_max) + WIDEN, 0, e.h_max)
    widened = np.array(e.band["widened"][1:])
    lo = np.where(widened, np.minimum(lo, e.h[1:] - WIDEN), lo)
    hi = np.where(widened, np.maximum(hi, e.h[1:] + WIDEN), hi)
    assert np.allclose(e.h_lo[1:], np.clip(lo, 0, e.h_max), atol=1e-12)
    assert np.allclose(e.h_hi[1:], np.clip(hi, 0, e.h_max), atol=1e-12)
    assert np.isnan(e.h_lo[0]) and np.isnan(e.h_hi[0])  # infeasible: no band
    assert np.all(e.h_lo[1:] <= e.h_mc[1:]) and np.all(e.h_mc[1:] <= e.h_hi[1:])
    assert np.allclose(e.h_mc_se[1:], s / math.sqrt(5), atol=1e-15) and np.isnan(e.h_mc_se[0])
    assert e.band["bin_rule"] == "br" and e.band["start_bins"] >= 1
    d = e.to_dict()
    assert d["level"] == 0.9 and d["h_lo"][0] is None and len(d["h_hi"]) == 4 and d["h_mc_se"][0] is None


def test_band_order_is_recorded_reproducible_and_leaves_the_estimate_alone(pt):
    N_min = int(pt.prompt_blocks.max())
    Ns = np.array([N_min, 2 * N_min, 8 * N_min])
    k1, i1 = estimate_trace_band(pt, Ns, replays=4, seed=9, order="keep")
    k2, i2 = estimate_trace_band(pt, Ns, replays=4, seed=9, order="keep")
    r1, j1 = estimate_trace_band(pt, Ns, replays=4, seed=9, order="random")
    assert np.array_equal(i1.h, i2.h) and np.array_equal(k1.h_lo, k2.h_lo) and np.array_equal(k1.h_hi, k2.h_hi)
    assert k1.band["order"] == "keep" and r1.band["order"] == "random"
    assert np.array_equal(k1.h, r1.h)  # the estimator does not depend on the replays' order
    assert np.array_equal(i1.h, realisation_replays(pt, Ns, replays=4, seed=9, order="keep"))
    assert np.array_equal(j1.h, realisation_replays(pt, Ns, replays=4, seed=9, order="random"))


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"level": 1.2}, "level"),
        ({"replays": 2}, "replays"),
        ({"lam0": 0.01}, "lam0"),
        ({"replays": 3.0}, "replays"),
        ({"bin_rule": "scott"}, "bin_rule"),
        ({"order": "sorted"}, "order"),
    ],
)
def test_band_refuses_bad_arguments(pt, kw, needle):
    with pytest.raises(AgenticError, match=needle):
        estimate_trace_band(pt, [5000], **kw)


def _run(*args):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("weka")
    for f in FILES:
        (d / f.split("/")[-1]).write_bytes(open(f, "rb").read())
    return d


def test_cli_simulate_blocks_trace_prints_its_estimates(pool_dir, pt):
    """Issue 23 defect: ``"estimate": []`` although estimates are on by default."""
    N_min = int(pt.prompt_blocks.max())
    args = ["simulate", "--blocks-trace", str(pool_dir), "--arrival", "uniform", "--span", "600"]
    args += ["--N", f"{N_min - 1},{2 * N_min}"]
    r = _run(*args, "--json")
    assert r.exit_code == 0, r.output
    est = json.loads(r.stdout)["estimate"]
    assert len(est) == 4 and {e["engine"] for e in est} == {"vllm", "vllm-0.23"}
    for e in est:
        if e["N"] < N_min:
            assert e["h"] is None and e["h_lo"] is None
        else:
            assert e["h_lo"] <= e["h_hi"] and e["level"] == 0.9 and e["validated"] is False
    txt = _run(*args)
    assert txt.exit_code == 0, txt.output
    assert "90% band" in txt.output and "outside the estimator's validated region" in txt.output
    off = _run(*args, "--no-estimate", "--json")
    assert json.loads(off.stdout)["estimate"] == []


def test_cli_plan_one_weka_file_has_no_nan_rate():
    """Issue 23 defect: ``plan --blocks-trace`` on one WEKA file printed "λ0 = nan/s"."""
    r = _run("plan", "--blocks-trace", FILES[1], "--kv-gb", "10", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["lam0"] is None and any(n.startswith("λ0: undefined") for n in out["notes"])
    t = _run("plan", "--blocks-trace", FILES[1], "--kv-gb", "10")
    flat = " ".join(t.output.split())
    assert t.exit_code == 0 and "nan/s" not in flat and "λ0 undefined (one conversation)" in flat


def test_cli_plan_lam0_answers_by_the_flagged_estimator(pool_dir):
    """Issue 23 defect: ``plan --blocks-trace --lam0`` resampled for minutes; now the stationary form answers,
    flagged not validated (the exact answer under --verify: test_plan_production)."""
    r = _run("plan", "--blocks-trace", str(pool_dir), "--kv-gb", "10", "--lam0", "0.01", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["answered_by"] == "estimator" and out["h_band"] is None
    assert any("NOT validated" in n for n in out["notes"])


def test_cli_plan_confident_capacity(pool_dir):
    args = ["plan", "--blocks-trace", str(pool_dir), "--arrival", "uniform", "--span", "600", "--kv-gb", "40"]
    r = _run(*args, "--target", "0.5", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["band_level"] == 0.9 and 0 <= out["h_band"][0] <= out["h_band"][1] <= out["h_max"]
    if out["N_for_target_confident"] is not None:
        assert out["N_for_target_confident"] >= out["N_for_target"]
    t = _run(*args, "--target", "0.5")
    flat = " ".join(t.output.replace("│", " ").split())
    assert "(b) KV memory for h ≥ 0.5 with 90%" in flat and "(90% band" in flat


def test_cli_estimate_and_curve_blocks_trace_carry_the_band(pool_dir, pt):
    N_min = int(pt.prompt_blocks.max())
    base = ["--blocks-trace", str(pool_dir), "--arrival", "uniform", "--span", "600"]
    r = _run("estimate", *base, "--N", f"{N_min - 1},{3 * N_min}", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["level"] == 0.9
    lo, hi = out["rows"][1]["h_lo"], out["rows"][1]["h_hi"]
    assert set(lo) == {"vllm", "vllm-0.23"} and all(lo[e] <= hi[e] for e in lo)
    assert out["rows"][0]["h_lo"] == {"vllm": None, "vllm-0.23": None}
    # the same seed gives the same band as the library call
    e, _ = estimate_trace_band(pt, [N_min - 1, 3 * N_min], seed=0)
    assert lo["vllm"] == pytest.approx(float(e.h_lo[1]), abs=1e-15)
    # the replays' mean and its standard error travel with the band (new fields; None where infeasible)
    assert out["rows"][1]["h_mc"]["vllm"] == pytest.approx(float(e.h_mc[1]), abs=1e-15)
    assert out["rows"][1]["h_mc_se"]["vllm"] == pytest.approx(float(e.h_mc_se[1]), abs=1e-15)
    assert out["rows"][0]["h_mc"] == {"vllm": None, "vllm-0.23": None}
    c = _run("curve", *base, "--n-min", str(N_min), "--n-max", str(4 * N_min), "--points", "3", "--json")
    assert c.exit_code == 0, c.output
    curves = json.loads(c.stdout)  # the curves are top-level keys of the JSON
    name = "estimate: vLLM ≥ 0.24 (agentic)"
    assert all(a <= b for a, b in zip(curves[f"band low: {name}"], curves[f"band high: {name}"], strict=True))


def test_resample_to_ci_is_the_single_call_with_the_final_count(pt):
    """Issue 23 §3: replications added in batches until the 95 % half-width ≤ ci; the result is bit-identical to
    one resample_simulate call with the final count (same seeds)."""
    from kvhit.sim.resample import conversation_pool, resample_simulate
    from kvhit.sim.resample_adaptive import resample_to_ci

    pool = conversation_pool(pt)
    Ns = [pool.N_min, 3 * pool.N_min]
    kw = dict(lam0=0.01, n_conversations=8)
    r = resample_to_ci(pool, Ns, ci=0.02, min_replications=3, batch=2, max_replications=9, seed=4, **kw)
    n = len(r.seeds)
    assert r.seeds == list(range(4, 4 + n)) and 3 <= n <= 9
    ref = resample_simulate(pool, Ns, replications=n, seed=4, **kw)
    assert np.array_equal(r.token_hit_ratio, ref.token_hit_ratio, equal_nan=True)
    hw = ref.stationary_ci()[1]
    assert r.extra["achieved_ci"] == pytest.approx(float(np.nanmax(hw)), abs=1e-15)
    assert r.extra["reached"] == (r.extra["achieved_ci"] <= 0.02)
    if n < 9:  # stopped early: the target was met, and not one batch before
        assert r.extra["reached"]
        before = resample_simulate(pool, Ns, replications=n - 2, seed=4, **kw).stationary_ci()[1]
        assert n == 3 or float(np.nanmax(before)) > 0.02


def test_estimator_bin_rule_is_checked_and_sqrt_is_the_former_rule(pt):
    from kvhit.estimate.agentic import estimate_trace

    N_min = int(pt.prompt_blocks.max())
    with pytest.raises(AgenticError, match="bin_rule"):
        estimate_trace(pt, [2 * N_min], bin_rule="scott")
    # "sqrt" is the former default clip(round(√C), 1, 24): the same as passing that bin count explicitly
    C = int(pt.session.max()) + 1
    nb = int(np.clip(round(math.sqrt(C)), 1, 24))
    a = estimate_trace(pt, [N_min, 2 * N_min], bin_rule="sqrt").h
    b = estimate_trace(pt, [N_min, 2 * N_min], bins=nb).h
    assert np.array_equal(a, b)


def test_prediction_factor_is_the_t_table_value():
    from kvhit.estimate.band import prediction_factor

    # t_{15, 0.95} = 1.753050 and t_{11, 0.975} = 2.200985 (Student-t tables), times √(1 + 1/K)
    assert abs(prediction_factor(0.9, 16) - 1.753050 * math.sqrt(17 / 16)) < 2e-6
    assert abs(prediction_factor(0.95, 12) - 2.200985 * math.sqrt(13 / 12)) < 2e-6
    assert prediction_factor(0.9, 1) == 0.0
