"""Tests of kvhit.experiments: the eq. (80) timing, the block-request gather, the estimator registry, the
statistics and the end-to-end tiny reproduction (App. E)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.estimate.engine import estimate_engine, estimate_finite, estimate_window
from kvhit.estimate.mean_field import estimate
from kvhit.estimate.trace_stats import trace_moments
from kvhit.experiments import (
    ESTIMATORS,
    SETTINGS,
    ExperimentError,
    LatencyModel,
    Setting,
    register_estimator,
    reproduce,
    summarize,
)
from kvhit.experiments.paper import points, run_experiments
from kvhit.experiments.paper_estimators import (
    ENGINE_TARGET,
    ESTIMATOR_TARGETS,
    INGREDIENT_COLUMNS,
    PAPER_ESTIMATORS,
    ingredient_estimates,
    measured_window,
    observed_gaps,
)
from kvhit.experiments.paper_runs import _block_requests, load_sample, retime, run_point
from kvhit.sim.runner import block_requests
from kvhit.workload.dists import Exponential
from kvhit.workload.sharegpt_trace import build_sharegpt_trace
from kvhit.workload.trace import Trace, Window

TINY = SETTINGS["tiny"]


@pytest.fixture(scope="module")
def sample():
    return load_sample(TINY, 3)


@pytest.fixture(scope="module")
def tiny_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("repro") / "out"
    calls = []
    res = reproduce(out, setting="tiny", jobs=2, progress=lambda d, t: calls.append((d, t)))
    return res, out, calls


# ------------------------------------------------------------------------------------------------------------
# settings and latency model
# ------------------------------------------------------------------------------------------------------------


def test_paper_setting_matches_app_e():
    s = SETTINGS["paper"]
    assert s.capacity == 2275
    assert (s.n_warm, s.n_meas, s.block_size) == (1000, 5000, 128)
    assert s.exp1_lam0 == 1.5 and s.exp2_mu_F == 135.0
    assert s.exp1_mu_F == tuple(float(x) for x in range(90, 241, 15))
    assert s.exp2_lam0 == (0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0)
    assert len(s.seeds) == 5
    assert len(points(s)) == 11 + 7


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"n_meas": 1}, "n_meas"),
        ({"exp1_mu_F": ()}, "exp1_mu_F"),
        ({"exp2_lam0": (1.0, -1.0)}, "exp2_lam0"),
        ({"seeds": (1, 1)}, "seeds"),
        ({"engines": ("sglang",)}, "engines"),
        ({"exp1_lam0": 0.0}, "exp1_lam0"),
        ({"N": 0}, "N"),
    ],
)
def test_setting_validation(kw, field):
    with pytest.raises(ExperimentError, match=field):
        Setting(**kw)


def test_latency_model():
    lm = LatencyModel(ttft_base_s=0.1, prefill_tokens_per_s=1000.0, tpot_s=0.02)
    np.testing.assert_allclose(lm.e2e([2000, 500], [100, 50], [10, 0]), [0.1 + 2.0 + 0.2, 0.1 + 0.5])
    lm_new = replace(lm, prefill="new")
    np.testing.assert_allclose(lm_new.ttft([2000], [100]), [0.1 + 0.1])
    for kw, field in (
        ({"tpot_s": -1.0}, "tpot_s"),
        ({"prefill_tokens_per_s": 0.0}, "prefill_tokens_per_s"),
        ({"prefill": "some"}, "prefill"),
        ({"ttft_base_s": math.nan}, "ttft_base_s"),
    ):
        with pytest.raises(ExperimentError, match=field):
            LatencyModel(**kw)


# ------------------------------------------------------------------------------------------------------------
# sample and eq. (80) timing
# ------------------------------------------------------------------------------------------------------------


def test_sample_is_build_sharegpt_trace_sample(sample):
    base, _ = build_sharegpt_trace(n_warm=TINY.n_warm, n_meas=TINY.n_meas, seed=3, block_size=128)
    o = np.lexsort((base["turn"], base["conv"]))
    for k in ("conv", "turn", "M", "Z", "R", "cum_tokens", "response_tokens"):
        np.testing.assert_array_equal(sample.cols[k], base[k][o])


def test_retime_eq80(sample):
    lam0, mu = 0.7, 40.0
    lat = LatencyModel(tpot_s=0.3)
    run = retime(sample, lam0, mu, lat)
    tr = run.trace
    assert isinstance(tr, Trace)
    c = sample.cols
    # rows map back to sample rows
    np.testing.assert_array_equal(tr["conv"], c["conv"][run.order])
    np.testing.assert_array_equal(tr["turn"], c["turn"][run.order])
    # arrivals: cumulative unit exponentials / λ0, in sample order (warm-up conversations first)
    conv = tr.conversations()
    np.testing.assert_allclose(conv["arrival"], np.cumsum(sample.u_arrival) / lam0)
    # slow reference of eq. (80), conversation by conversation
    e2e = lat.e2e(c["cum_tokens"], sample.new_tokens, c["response_tokens"])
    t_ref = np.empty(c["conv"].size)
    binds = np.zeros(c["conv"].size, bool)
    for r in range(c["conv"].size):
        if c["turn"][r] == 1:
            t_ref[r] = np.sum(sample.u_arrival[: c["conv"][r] + 1]) / lam0
        else:
            w = max(e2e[r - 1], mu * sample.u_gap[r])
            binds[r] = e2e[r - 1] > mu * sample.u_gap[r]
            t_ref[r] = t_ref[r - 1] + w
    np.testing.assert_allclose(tr["time"], t_ref[run.order], rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(run.e2e_binds, binds[run.order])
    assert binds.any() and not binds.all()
    # every gap is at least the previous turn's end-to-end time
    W = tr.interarrivals()
    assert W.min() >= 0.05


def test_retime_common_random_numbers(sample):
    lat = TINY.latency
    a, b = retime(sample, 1.5, 90.0, lat), retime(sample, 1.5, 180.0, lat)
    ga, gb = a.trace.interarrivals(), b.trace.interarrivals()
    assert ga.size == gb.size and np.all(gb >= ga - 1e-9) and gb.mean() > ga.mean()
    with pytest.raises(ExperimentError, match="lam0"):
        retime(sample, 0.0, 90.0, lat)
    with pytest.raises(ExperimentError, match="mu_F"):
        retime(sample, 1.0, -1.0, lat)


def test_block_requests_gather_matches_runner(sample):
    """The per-seed hash gather equals kvhit.sim.runner.block_requests on a trace carrying the token ids."""
    base, _ = build_sharegpt_trace(n_warm=TINY.n_warm, n_meas=TINY.n_meas, seed=3, block_size=128, keep_token_ids=True)
    o = np.lexsort((base["turn"], base["conv"]))
    new_cm = [base.lists["new_tokens"][i] for i in o]
    run = retime(sample, 1.5, 60.0, TINY.latency)
    tr = run.trace
    with_ids = Trace.from_columns(
        dict(tr.cols), dict(tr.meta), {"new_tokens": [new_cm[i] for i in run.order]}, sort=False
    )
    ref = block_requests(with_ids, source="tokens")
    got = _block_requests(sample, run, 128)
    np.testing.assert_array_equal(got.prompt_tokens, ref.prompt_tokens)
    np.testing.assert_array_equal(got.hash_offsets, ref.hash_offsets)
    np.testing.assert_array_equal(got.hashes, ref.hashes)


# ------------------------------------------------------------------------------------------------------------
# gaps and estimators
# ------------------------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 5), st.floats(0.1, 10.0)), min_size=2, max_size=12),
    st.floats(0.0, 60.0),
    st.integers(0, 3),
)
def test_observed_gaps_reference(convs, end, min_conv):
    """Gaps of consecutive turns both inside the mask, against a slow loop."""
    cols = {k: [] for k in ("conv", "conv_arrival", "turn", "time", "M", "Z", "R")}
    for i, (m, w) in enumerate(convs):
        for j in range(1, m + 1):
            cols["conv"].append(i)
            cols["conv_arrival"].append(float(i))
            cols["turn"].append(j)
            cols["time"].append(i + (j - 1) * w)
            cols["M"].append(m)
            cols["Z"].append(1)
            cols["R"].append(j)
    tr = Trace.from_columns(cols)
    mask = (tr["time"] <= end) & (tr["conv"] >= min_conv)
    got = np.sort(observed_gaps(tr, mask))
    ref = []
    for i, (m, w) in enumerate(convs):
        if i < min_conv:
            continue
        ref += [w for j in range(2, m + 1) if i + (j - 1) * w <= end]
    np.testing.assert_allclose(got, np.sort(ref), rtol=1e-9, atol=1e-9)
    with pytest.raises(ExperimentError, match="measured_mask"):
        observed_gaps(tr, mask[:-1])


def test_estimators_are_eq38_with_the_named_F(sample):
    run = retime(sample, 1.5, 90.0, TINY.latency)
    tr = run.trace
    w = Window.warmup_conversations(tr, TINY.n_warm)
    m = w.mask(tr) & (tr["conv"] >= TINY.n_warm)
    mom = trace_moments(tr, rows=m, block="paper")
    assert mom.L == TINY.n_meas
    N = 500
    gaps = observed_gaps(tr, m)
    assert ESTIMATORS["prior"](tr, m, N, 1.5, 90.0) == pytest.approx(estimate(mom, N, 1.5, Exponential(90.0)).h)
    assert ESTIMATORS["posterior"](tr, m, N, 1.5, 90.0) == pytest.approx(
        estimate(mom, N, 1.5, Exponential(gaps.mean())).h
    )
    h_emp = ESTIMATORS["empirical"](tr, m, N, 1.5, 90.0)
    assert 0 < h_emp <= mom.h_max_hash
    # the prior decreases in μ_F and λ0 (eq. (38): larger T_C demand)
    assert ESTIMATORS["prior"](tr, m, N, 1.5, 200.0) < ESTIMATORS["prior"](tr, m, N, 1.5, 90.0)
    assert ESTIMATORS["prior"](tr, m, N, 2.0, 90.0) < ESTIMATORS["prior"](tr, m, N, 1.0, 90.0)


def test_register_estimator():
    with pytest.raises(ExperimentError, match="already registered"):
        register_estimator("prior", ESTIMATORS["prior"])
    with pytest.raises(ExperimentError, match="not callable"):
        register_estimator("x_not_callable", 3)
    with pytest.raises(ExperimentError, match="name"):
        register_estimator("a/b", ESTIMATORS["prior"])
    with pytest.raises(ExperimentError, match="target"):
        register_estimator("x_bad_target", ESTIMATORS["prior"], target="a/b")
    register_estimator("half_prior", lambda tr, m, N, lam0, mu: 0.5 * ESTIMATORS["prior"](tr, m, N, lam0, mu))
    try:
        assert "half_prior" in ESTIMATORS and "half_prior" not in ESTIMATOR_TARGETS
        register_estimator("half_prior", ESTIMATORS["prior"], target="alg1", replace_existing=True)
        assert ESTIMATOR_TARGETS["half_prior"] == "alg1"
    finally:
        ESTIMATORS.pop("half_prior")
        ESTIMATOR_TARGETS.pop("half_prior", None)


def test_engine_estimators_registered_with_their_actuals():
    for e in ("vllm", "vllm-0.23"):
        for fam in ("engine", "window"):
            assert ESTIMATOR_TARGETS[f"{fam}:{e}"] == e
            assert ESTIMATOR_TARGETS[f"{fam}:{e}:token"] == f"{e}:token"
    assert ESTIMATOR_TARGETS["engine:content"] == ESTIMATOR_TARGETS["finite"] == "alg1"
    assert not set(PAPER_ESTIMATORS) & set(ESTIMATOR_TARGETS)


def test_engine_estimators_are_kvhit_estimate(sample):
    """The registered estimators and the ingredient columns are the kvhit.estimate.engine functions with the empirical
    F̂ of the measured conversations, the given λ0 and App. E's window (independent calls, no memo)."""
    lam0, mu, N = 1.5, 90.0, 300
    tr = retime(sample, lam0, mu, TINY.latency).trace
    win = Window.warmup_conversations(tr, TINY.n_warm)
    m = win.mask(tr) & (tr["conv"] >= TINY.n_warm)
    w2 = measured_window(tr, m)
    assert (w2.start, w2.end) == (win.start, win.end)
    np.testing.assert_array_equal(w2.mask(tr), win.mask(tr))
    ing = ingredient_estimates(tr, m, N, lam0, "vllm-0.23", "tokens")
    assert list(ing) == list(INGREDIENT_COLUMNS)
    assert ing["paper"] == pytest.approx(estimate(trace_moments(tr, rows=m), N, lam0).h, rel=1e-12)
    ref = {
        "a": estimate_engine(tr, N, lam0, engine="vllm-0.23", finite=False, fluctuations=False, rows=m).h,
        "a+c": estimate_engine(tr, N, lam0, engine="vllm-0.23", partial=False, fluctuations=False, rows=m).h,
        "a+b+c": estimate_engine(tr, N, lam0, engine="vllm-0.23", fluctuations=False, rows=m).h,
        "a+b+c+d": estimate_engine(tr, N, lam0, engine="vllm-0.23", rows=m).h,
        "window": estimate_window(tr, N, lam0, window=win, engine="vllm-0.23").h,
    }
    for c, v in ref.items():
        assert ing[c] == pytest.approx(v, rel=1e-12), c
    assert ESTIMATORS["engine:vllm-0.23:token"](tr, m, N, lam0, mu) == pytest.approx(ref["a+b+c+d"], rel=1e-12)
    assert ESTIMATORS["window:vllm-0.23:token"](tr, m, N, lam0, mu) == pytest.approx(ref["window"], rel=1e-12)
    blk = estimate_window(tr, N, lam0, window=win, engine="vllm", metric="blocks").h
    assert ESTIMATORS["window:vllm"](tr, m, N, lam0, mu) == pytest.approx(blk, rel=1e-12)
    fin = estimate_finite(tr, N, lam0, rows=m).h
    assert ESTIMATORS["finite"](tr, m, N, lam0, mu) == pytest.approx(fin, rel=1e-12)
    with pytest.raises(ExperimentError, match="metric"):
        ingredient_estimates(tr, m, N, lam0, "vllm", "bytes")
    with pytest.raises(ExperimentError, match="measured_mask"):
        measured_window(tr, np.zeros(tr.n_turns, bool))


def test_run_point_with_custom_estimator(sample):
    est = {"zero": lambda tr, m, N, lam0, mu: 0.0, "prior": ESTIMATORS["prior"]}
    r = run_point(sample, TINY, 1.5, 90.0, est)
    assert r["est/zero"] == 0.0 and 0 < r["est/prior"] < 1
    for k in ("actual/vllm", "actual/vllm-0.23", "actual/alg1", "actual/vllm:token"):
        assert 0 <= r[k] <= 1


# ------------------------------------------------------------------------------------------------------------
# statistics
# ------------------------------------------------------------------------------------------------------------


def test_summarize_ae_re_and_checks():
    st_ = replace(TINY, seeds=(0, 1), exp1_mu_F=(130.0, 200.0), exp2_lam0=(1.0,), engines=("vllm-0.23",))
    runs = []
    for s in (0, 1):
        for lam0, mu in ((1.5, 130.0), (1.5, 200.0), (1.0, 135.0)):
            act = 0.20 + 0.01 * s
            runs.append(
                {
                    "seed": s,
                    "lam0": lam0,
                    "mu_F": mu,
                    "actual/vllm-0.23": act,
                    "actual/vllm-0.23:token": act,
                    "actual/alg1": 0.1,
                    "actual/alg1-phys": 0.15,
                    "est/prior": act + (0.03 if mu == 200.0 else 0.01),
                    "W/x": 1.0,
                }
            )
    summ = summarize({"setting": st_, "runs": runs, "estimators": ["prior"], "seconds": 0.0, "jobs": 1})
    p1 = summ["experiments"]["1"]["points"]
    assert [p["x"] for p in p1] == [130.0, 200.0]
    ae = p1[1]["stats"]["ae/prior/vllm-0.23"]
    assert ae["mean"] == pytest.approx(0.03) and ae["values"] == pytest.approx([0.03, 0.03])
    re = p1[0]["stats"]["re/prior/vllm-0.23"]
    assert re["values"] == pytest.approx([0.01 / 0.20, 0.01 / 0.21])
    act = p1[0]["stats"]["actual/vllm-0.23"]
    assert act["mean"] == pytest.approx(0.205) and act["ci95"] > 0
    ck = {(c["bound"], c["actual"]): c for c in summ["checks"] if c["estimator"] == "prior"}
    c = ck[("Exp. 1: AE < 0.02", "vllm-0.23")]
    assert not c["pass"] and c["worst"] == pytest.approx(0.03) and c["at_x"] == 200.0
    c = ck[("Exp. 1: RE < 10% for 120 ≤ μ_F ≤ 165 s", "vllm-0.23")]
    assert c["pass"] and c["n_points"] == 1
    assert ck[("Exp. 2: AE < 0.015", "vllm-0.23")]["pass"]
    assert not ck[("Exp. 2: AE < 0.015", "alg1")]["pass"]
    assert "ingredients" not in summ  # no ingr/ keys in these runs


def test_summarize_targeted_estimators_and_ingredients():
    """A targeted estimator is compared with its own actual only and checked against ENGINE_TARGET; the
    ingredient summary holds every point's mean signed error and the max |error| per grid (hand numbers)."""
    st_ = replace(TINY, seeds=(0, 1), exp1_mu_F=(130.0, 200.0), exp2_lam0=(1.0,), engines=("vllm",))
    errs = {(1.5, 130.0): (0.002, 0.004), (1.5, 200.0): (-0.003, -0.009), (1.0, 135.0): (0.001, 0.001)}
    runs = []
    for s in (0, 1):
        for (lam0, mu), e in errs.items():
            r = {"seed": s, "lam0": lam0, "mu_F": mu, "actual/alg1": 0.1, "actual/alg1-phys": 0.1}
            r["actual/vllm"] = r["actual/vllm:token"] = 0.2
            r["est/prior"] = 0.25
            r["est/engine:vllm"] = 0.2 + e[s]
            for c in INGREDIENT_COLUMNS:
                r[f"ingr/vllm/{c}"] = 0.2 + e[s] * (2.0 if c == "paper" else 1.0)
                r[f"ingr/vllm:token/{c}"] = 0.2
            runs.append(r)
    raw = {
        "setting": st_,
        "runs": runs,
        "estimators": ["prior", "engine:vllm"],
        "targets": {"engine:vllm": "vllm"},
        "seconds": 0.0,
        "jobs": 1,
    }
    summ = summarize(raw)
    p1 = summ["experiments"]["1"]["points"]
    assert "ae/engine:vllm/vllm" in p1[0]["stats"] and "ae/engine:vllm/alg1" not in p1[0]["stats"]
    assert "ae/prior/alg1" in p1[0]["stats"]
    assert summ["targets"] == {"engine:vllm": "vllm"}
    eng = {c["experiment"]: c for c in summ["checks"] if c["estimator"] == "engine:vllm"}
    assert set(eng) == {1, 2} and all(not c["paper_estimator"] and c["limit"] == ENGINE_TARGET for c in eng.values())
    assert eng[1]["worst"] == pytest.approx(0.006) and eng[1]["at_x"] == 200.0 and not eng[1]["pass"]
    assert eng[2]["worst"] == pytest.approx(0.001) and eng[2]["pass"]
    assert not [c for c in summ["checks"] if c["estimator"] == "engine:vllm" and c["bound"].startswith("Exp. 1: AE <")]
    ing = summ["ingredients"]
    assert ing["columns"] == list(INGREDIENT_COLUMNS) and ing["actuals"] == ["vllm", "vllm:token"]
    g1 = ing["experiments"]["1"]
    assert [p["x"] for p in g1["points"]] == [130.0, 200.0]
    assert g1["points"][1]["error"]["vllm"]["window"] == pytest.approx(-0.006)
    assert g1["points"][1]["error"]["vllm"]["paper"] == pytest.approx(-0.012)
    assert g1["max_abs_error"]["vllm"]["window"] == pytest.approx(0.006)
    assert g1["max_ae"]["vllm"]["a"] == pytest.approx(0.006)
    assert g1["max_abs_error_run"]["vllm"]["a"] == pytest.approx(0.009)
    assert not g1["target_met"]["vllm"]["window"] and g1["target_met"]["vllm:token"]["window"]
    assert ing["experiments"]["2"]["target_met"]["vllm"]["a+b+c+d"]
    assert ing["experiments"]["2"]["target_met_every_run"]["vllm"]["paper"]  # |2 × 0.001| ≤ 0.005 on each run


def test_run_experiments_skips_estimators_of_engines_not_simulated():
    st_ = replace(TINY, engines=("vllm",), exp1_mu_F=(90.0,), exp2_lam0=(1.5,), exp2_mu_F=90.0, ingredients=False)
    est = {k: ESTIMATORS[k] for k in ("prior", "engine:vllm", "engine:vllm-0.23", "finite")}
    raw = run_experiments(st_, jobs=1, estimators=est)
    assert raw["estimators"] == ["prior", "engine:vllm", "finite"]
    assert raw["targets"] == {"engine:vllm": "vllm", "finite": "alg1"}
    (r,) = raw["runs"]
    assert not [k for k in r if k.startswith("ingr/")]
    assert abs(r["est/engine:vllm"] - r["actual/vllm"]) < 0.2


# ------------------------------------------------------------------------------------------------------------
# end to end (tiny setting)
# ------------------------------------------------------------------------------------------------------------


def test_reproduce_tiny_files_and_progress(tiny_result):
    res, out, calls = tiny_result
    names = {p.name for p in res.files}
    for f in ("fig2", "fig3", "fig4", "fig5", "fig6"):
        assert {f + ".png", f + ".svg"} <= names
        assert (out / (f + ".png")).stat().st_size > 1000
    assert {"results.json", "report.md"} <= names
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".out.tmp-")]  # temp dir removed
    total = calls[-1][1]
    assert calls[0] == (0, total) and calls[-1] == (total, total) and total == 4
    assert res.seconds["total"] > 0


def test_reproduce_tiny_results_sane(tiny_result):
    res, out, _ = tiny_result
    data = json.loads((out / "results.json").read_text())
    assert data["setting"]["N"] == 2275 and data["setting"]["name"] == "tiny"
    assert len(data["runs"]) == 4
    for r in data["runs"]:
        hmax = r["moments"]["h_max"]
        for k, v in r.items():
            if k.startswith("actual/"):
                assert 0 <= v <= 1, k
            if k.startswith("est/") and k[4:] not in ESTIMATOR_TARGETS:
                assert 0 < v <= r["moments"]["h_max_hash"] + 1e-12 <= hmax + 1e-12, k
            elif k.startswith(("est/", "ingr/")):
                assert 0 <= v <= 1, k
        assert r["actual/alg1"] <= hmax
        assert r["W/realized_mean"] > 0
    for e in ("1", "2"):
        pts = data["summary"]["experiments"][e]["points"]
        assert len(pts) == 2
        for p in pts:
            for k, s in p["stats"].items():
                if k.startswith("ae/"):
                    assert s["mean"] is not None and math.isfinite(s["mean"])
        for en in ("prior", "posterior", "empirical"):
            a, b = (p["stats"][f"est/{en}"]["mean"] for p in pts)
            assert b < a, (e, en)  # decreasing in μ_F (Exp. 1) and in λ0 (Exp. 2)
        for act in ("vllm-0.23", "vllm", "alg1"):
            a, b = (p["stats"][f"actual/{act}"]["mean"] for p in pts)
            assert b < a, (e, act)
    assert {c["bound"] for c in data["summary"]["checks"] if c["paper_estimator"]} == {
        "Exp. 1: AE < 0.02",
        "Exp. 1: RE < 16%",
        "Exp. 1: RE < 10% for 120 ≤ μ_F ≤ 165 s",
        "Exp. 2: AE < 0.015",
        "Exp. 2: RE < 7%",
    } - {"Exp. 1: RE < 10% for 120 ≤ μ_F ≤ 165 s"}
    assert isinstance(res.passed, bool)
    eng = [c for c in data["summary"]["checks"] if not c["paper_estimator"] and c["estimator"] in ESTIMATOR_TARGETS]
    assert {(c["estimator"], c["experiment"]) for c in eng} == {(k, e) for k in ESTIMATOR_TARGETS for e in (1, 2)}
    assert all(c["actual"] == ESTIMATOR_TARGETS[c["estimator"]] and c["limit"] == ENGINE_TARGET for c in eng)


def test_reproduce_tiny_ingredient_table(tiny_result):
    """results.json["ingredients"]: every point of both grids, every vLLM actual and every column has a finite
    signed error equal to the mean over seeds of ingr − actual in the runs; report.md has the tables."""
    res, out, _ = tiny_result
    data = json.loads((out / "results.json").read_text())
    ing = data["ingredients"]
    assert ing == data["summary"]["ingredients"]
    acts = ["vllm-0.23", "vllm", "vllm-0.23:token", "vllm:token"]
    assert ing["columns"] == list(INGREDIENT_COLUMNS) and sorted(ing["actuals"]) == sorted(acts)
    assert ing["target"] == ENGINE_TARGET
    runs = {(r["lam0"], r["mu_F"]): r for r in data["runs"]}  # one seed
    for e, n in (("1", len(TINY.exp1_mu_F)), ("2", len(TINY.exp2_lam0))):
        g = ing["experiments"][e]
        assert len(g["points"]) == n
        for p in g["points"]:
            r = runs[(p["lam0"], p["mu_F"])]
            for a in acts:
                for c in INGREDIENT_COLUMNS:
                    v = p["error"][a][c]
                    assert v is not None and math.isfinite(v), (e, p["x"], a, c)
                    assert v == pytest.approx(r[f"ingr/{a}/{c}"] - r[f"actual/{a}"], abs=1e-12)
        for a in acts:
            for c in INGREDIENT_COLUMNS:
                assert g["max_abs_error"][a][c] == pytest.approx(max(abs(p["error"][a][c]) for p in g["points"]))
                assert g["target_met"][a][c] == (g["max_ae"][a][c] <= ENGINE_TARGET)
    md = (out / "report.md").read_text()
    assert "## Each ingredient's contribution to the error" in md
    assert "### Max |error| per grid, engine and ingredient" in md
    for e in ("1", "2"):
        for a in acts:
            assert f"### Experiment {e}, `{a}`: signed error per ingredient" in md
    assert res.summary["ingredients"]["experiments"].keys() == {"1", "2"}


def test_reproduce_tiny_report(tiny_result):
    _, out, _ = tiny_result
    md = (out / "report.md").read_text()
    for head in (
        "## Settings",
        "## Experiment 1",
        "## Experiment 2",
        "## The paper's bounds beside ours",
        "## Discussion",
        "## Files",
    ):
        assert head in md
    assert "N = 2,275" in md and ("PASS" in md or "FAIL" in md)
    assert "nan" not in md.lower().replace("nanosec", "")


@pytest.mark.slow
def test_cli_reproduce_quick(tmp_path):
    """The issue's test: `kvhit reproduce --quick` end to end, report structure and sanity."""
    from typer.testing import CliRunner

    from kvhit.cli import app

    out = tmp_path / "quick"
    r = CliRunner().invoke(app, ["reproduce", "--quick", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    names = {Path(f).name for f in summary["files"]}
    for k in range(2, 7):
        assert {f"fig{k}.png", f"fig{k}.svg"} <= names
    assert {"results.json", "report.md"} <= names
    report = (out / "report.md").read_text()
    for section in (
        "## Experiment 1",
        "## Experiment 2",
        "## The paper's bounds beside ours",
        "## Each ingredient's contribution to the error",
        "## Discussion",
    ):
        assert section in report
    data = json.loads((out / "results.json").read_text())
    for r in data["runs"]:
        h_max = r["moments"]["h_max"]
        assert all(0 <= r[f"actual/{a}"] <= h_max for a in ("vllm-0.23", "vllm", "alg1"))
    for e in ("1", "2"):
        pts = data["summary"]["experiments"][e]["points"]
        for p in pts:
            assert all(math.isfinite(s["mean"]) for k, s in p["stats"].items() if k.startswith("ae/"))
        for en in ("prior", "posterior"):
            ests = [p["stats"][f"est/{en}"]["mean"] for p in pts]
            assert all(b < a for a, b in zip(ests[:-1], ests[1:], strict=True)), (e, en)  # decreasing in μ_F, in λ0
