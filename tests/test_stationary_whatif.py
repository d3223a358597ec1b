"""Issue 23 §3: the stationary what-if's reference and the exact footprint.

Pinned independently: the ratio-of-expectations estimator on cases whose answer is known in closed form (equal
denominators; hits linear in the control variates, where the regression estimator is exact); the controls' known
mean against a Monte Carlo average of plain-Python counts over many seeded streams; the exact footprint table
against a brute-force count of distinct block ids (Python sets) on WEKA-format conversations with sub-agents.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.estimate.agentic import AgenticError, estimate_trace
from kvhit.estimate.agentic_footprint import _footprint_table
from kvhit.sim.feasibility import feasibility
from kvhit.sim.resample import ResampleError, ResampleResult, conversation_pool, resample, resample_simulate
from kvhit.sim.resample_adaptive import resample_to_ci
from kvhit.workload.production import read_weka
from kvhit.workload.reuse import request_reuse

B = 4


def _result(h, q, ctl=None, mu=None) -> ResampleResult:
    h = np.asarray(h, float)
    R, K = h.shape
    N = np.arange(1, K + 1) * 1000
    return ResampleResult(
        N=N,
        engine="vllm",
        metric="tokens",
        lam0=1.0,
        horizon=1.0,
        warmup=0.0,
        seeds=list(range(R)),
        token_hit_ratio=h,
        block_hit_ratio=h,
        feasibility=feasibility(np.array([1]), 1, N),
        n_measured=[1] * R,
        n_started=[1] * R,
        token_queries=np.asarray(q, float),
        block_queries=np.asarray(q, float),
        control_tokens=None if ctl is None else np.asarray(ctl, float),
        control_mean=None if mu is None else np.asarray(mu, float),
    )


def test_ratio_of_expectations_is_not_the_mean_of_ratios():
    # replication 0: 1 query, 1 hit; replication 1: 3 queries, 0 hits → stationary ratio 1/4, mean of ratios 1/2
    r = _result([[1.0], [0.0]], [[1.0], [3.0]])
    m, hw = r.stationary_ci(controls=False)
    assert m[0] == pytest.approx(0.25)
    assert r.mean_ci()[0][0] == pytest.approx(0.5)
    # delta method by hand: d = x − R q = [0.75, −0.75], s_d = 0.75·√2, q̄ = 2, t_{1,0.975} = 12.7062
    assert hw[0] == pytest.approx(12.7062047 * 0.75 * math.sqrt(2) / (math.sqrt(2) * 2.0), rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=2, max_size=12),
    st.lists(st.floats(0.5, 50.0), min_size=12, max_size=12),
)
def test_ratio_estimator_invariants(h, q):
    h = np.array(h)
    q = np.array(q[: h.size])
    m, hw = _result(h[:, None], q[:, None]).stationary_ci(controls=False)
    assert h.min() - 1e-12 <= m[0] <= h.max() + 1e-12  # a weighted mean of the ratios
    assert hw[0] >= 0
    # equal denominators: the mean of ratios, and the same half-width as mean_ci
    r = _result(h[:, None], np.full((h.size, 1), 7.0))
    assert r.stationary_ci(controls=False)[0][0] == pytest.approx(h.mean(), abs=1e-12)
    assert r.stationary_ci(controls=False)[1][0] == pytest.approx(r.mean_ci()[1][0], rel=1e-9, abs=1e-12)


def test_control_variates_recover_the_known_answer_exactly():
    # hits linear in the per-conversation tokens c_ik (conversation k hits a share r_k of its tokens): the true
    # stationary ratio is Σ r_k μ_k / Σ μ_k whatever the drawn c; the regression estimator returns it exactly
    # (zero residuals), the plain ratio only approximately
    rng = np.random.default_rng(3)
    n, C = 20, 3
    r_k = np.array([0.9, 0.2, 0.5])
    mu = np.array([100.0, 300.0, 50.0])
    c = rng.poisson(mu, size=(n, C)).astype(float)
    q = c.sum(axis=1)
    x = c @ r_k
    res = _result((x / q)[:, None], q[:, None], ctl=c, mu=mu)
    m, hw = res.stationary_ci()
    truth = float(r_k @ mu / mu.sum())
    assert m[0] == pytest.approx(truth, abs=1e-12)
    assert hw[0] == pytest.approx(0.0, abs=1e-9)
    plain = res.stationary_ci(controls=False)[0][0]
    assert abs(plain - truth) > 1e-4  # the draw's luck, which the controls remove
    # too few replications for C controls (n < C + 3): the plain ratio is used
    few = _result((x / q)[:4, None], q[:4, None], ctl=c[:4, :], mu=mu)
    assert few.stationary_ci()[0][0] == pytest.approx(float(x[:4].sum() / q[:4].sum()))


def _weka_dir(tmp_path, C=4, seed=0, turns=6, sub=True):
    """WEKA-format conversations: a main agent with growing prompts and, with ``sub``, a sub-agent marker in the
    middle whose requests share the main agent's first block (the system prompt) and then diverge; the main agent
    resumes with its whole history after it."""
    rng = np.random.default_rng(seed)
    files = []
    for c in range(C):
        t, T, reqs = 0.0, 0, []
        for j in range(int(rng.integers(2, turns + 1))):
            T += int(rng.integers(B, 5 * B))
            reqs.append({"t": t, "type": "n", "in": T, "out": 3, "hash_ids": list(range(100, 100 + T // B))})
            t += float(rng.exponential(5.0))
            T += 3
            if sub and j == 1:
                s_reqs, st_, sT = [], 0.0, B
                for _ in range(int(rng.integers(1, 4))):
                    sT += int(rng.integers(1, 3 * B))
                    ids = [100] + list(range(500, 500 + sT // B - 1))
                    s_reqs.append({"t": st_, "type": "n", "in": sT, "out": 2, "hash_ids": ids})
                    st_ += float(rng.exponential(1.0))
                reqs.append({"t": t, "type": "subagent", "requests": s_reqs})
                t += st_ + 1.0
        f = tmp_path / f"trace_{c:04d}.json"
        f.write_text(json.dumps({"block_size": B, "hash_id_scope": "local", "requests": reqs}))
        files.append(f)
    return files


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_exact_footprint_equals_a_brute_force_count(tmp_path, seed):
    pt = read_weka(_weka_dir(tmp_path, C=4, seed=seed), arrival="uniform", span=20, seed=seed)
    u = request_reuse(pt)
    assert len(np.unique(u.stream)) > len(np.unique(u.session))  # sub-agents present
    foot, fbase = _footprint_table(u, np.ones(u.n, bool), u.full_blocks.astype(np.int64))
    k = 0
    differs = 0
    for s in np.unique(u.session):
        rows = np.flatnonzero(u.session == s)  # the template's requests, in arrival order
        m = rows.size
        for lo in range(m):
            seen: set = set()
            for hi in range(lo + 1, m + 1):
                r = rows[hi - 1]
                seen |= set(pt.hashes[pt.hash_offsets[r] : pt.hash_offsets[r + 1]].tolist())
                got = foot[fbase[k] + lo * (m + 1) + hi]
                assert got == len(seen), (s, lo, hi)
                own = u.full_blocks[rows[lo]] + sum(
                    u.full_blocks[q] - min(u.L_own[q], u.full_blocks[q]) for q in rows[lo + 1 : hi]
                )
                differs += int(own != len(seen))
        k += 1
    assert differs > 0  # the old "own" footprint is wrong on these (else the test would not test anything)


def test_footprint_option_and_refusal(tmp_path):
    pt = read_weka(_weka_dir(tmp_path, C=5, seed=4), arrival="uniform", span=30, seed=0)
    u = request_reuse(pt)
    Ns = np.arange(10, 200, 10)
    with pytest.raises(AgenticError, match="footprint"):
        estimate_trace(u, Ns, lam0=0.1, footprint="nope")
    auto = estimate_trace(u, Ns, lam0=0.1)
    exact = estimate_trace(u, Ns, lam0=0.1, footprint="exact")
    own = estimate_trace(u, Ns, lam0=0.1, footprint="own")
    assert np.array_equal(auto.h, exact.h)  # "auto" is "exact" for the stationary form
    assert not np.array_equal(exact.h, own.h)
    # the time-varying form keeps "own" under "auto"
    assert np.array_equal(estimate_trace(u, Ns).h, estimate_trace(u, Ns, footprint="own").h)
    # more background footprint never raises a hit ratio: exact ≥ own here (own misses re-touched history)
    assert np.all(np.diff(exact.h) >= -1e-12) and np.all(exact.h <= exact.h_max + 1e-12)


def test_controls_have_their_stated_mean(tmp_path):
    """E[c_k] = λ0·H·T_k/C, against the average over 400 seeded streams counted in plain Python."""
    pt = read_weka(_weka_dir(tmp_path, C=3, seed=5, sub=False), arrival="uniform", span=10, seed=0)
    cp = conversation_pool(pt)
    lam0, H = 0.2, 60.0
    res = resample_simulate(cp, [200], lam0=lam0, horizon=H, replications=2, seed=0)
    mu = res.control_mean
    Tk = [int(pt.prompt_tokens[pt.session == k].sum()) for k in range(3)]
    assert np.allclose(mu, [lam0 * H * t / 3 for t in Tk])
    tot = np.zeros(3)
    sq = np.zeros(3)
    reps = 400
    for s in range(reps):
        stv = resample(cp, lam0=lam0, horizon=H, seed=s)
        c = np.zeros(3)
        for i in range(stv.time.shape[0]):
            if stv.measured[i]:
                c[int(stv.origin[i])] += int(stv.prompt_tokens[i])
        tot += c
        sq += c * c
    mean = tot / reps
    se = np.sqrt((sq / reps - mean**2) / (reps - 1))
    assert np.all(np.abs(mean - mu) < 4 * se)
    # and resample_simulate records exactly these counts
    stv = resample(cp, lam0=lam0, horizon=H, seed=1)
    c1 = np.bincount(stv.origin[stv.measured], weights=stv.prompt_tokens[stv.measured], minlength=3)
    assert np.array_equal(res.control_tokens[1], c1)


def test_resample_to_ci_estimator_choice(tmp_path):
    pt = read_weka(_weka_dir(tmp_path, C=3, seed=6, sub=False), arrival="uniform", span=10, seed=0)
    cp = conversation_pool(pt)
    kw = dict(lam0=0.2, horizon=60.0, seed=0, min_replications=4, max_replications=8, batch=4)
    r = resample_to_ci(cp, [30, 60], ci=1e-9, **kw)
    assert r.extra["estimator"] == "ratio" and len(r.seeds) == 8 and not r.extra["reached"]
    # bit-identical to one resample_simulate call with the final count
    one = resample_simulate(cp, [30, 60], lam0=0.2, horizon=60.0, replications=8, seed=0)
    assert np.array_equal(r.token_hit_ratio, one.token_hit_ratio, equal_nan=True)
    assert np.array_equal(r.control_tokens, one.control_tokens)
    assert np.allclose(r.stationary_ci()[0], one.stationary_ci()[0], equal_nan=True)
    assert resample_to_ci(cp, [30], ci=1e-9, estimator="mean", **kw).extra["estimator"] == "mean"
    with pytest.raises(ResampleError, match="estimator"):
        resample_to_ci(cp, [30], estimator="median", **kw)


def test_stationary_region_drives_validated_and_the_band(tmp_path):
    from kvhit.estimate.agentic import STATIONARY_VALIDATED

    pt = read_weka(_weka_dir(tmp_path, C=8, seed=7), arrival="uniform", span=30, seed=0)
    u = request_reuse(pt)
    Ns = np.arange(20, 400, 20)
    tol, widen = STATIONARY_VALIDATED["tol"], STATIONARY_VALIDATED["widen"]
    inside = estimate_trace(u, Ns, lam0=1 / 120)
    assert inside.regime["validated"] and inside.band["in_region"]
    assert np.allclose(inside.h_hi, np.clip(inside.h + tol, 0, inside.h_max))
    assert np.allclose(inside.h_lo, np.clip(inside.h - tol, 0, inside.h_max))
    for kw, word in (
        ({"lam0": 1 / 3600}, "λ0"),
        ({"lam0": 1 / 120, "engine": "vllm-0.23"}, "engine"),
        ({"lam0": 1 / 120, "metric": "blocks"}, "metric"),
        ({"lam0": 1 / 120, "footprint": "own"}, "footprint"),
    ):
        out = estimate_trace(u, Ns, **kw)
        assert not out.regime["validated"] and not out.band["in_region"]
        note = [n for n in out.regime["notes"] if "outside the validated region" in n]
        assert note and word in note[0]
        assert np.allclose(out.h_hi, np.clip(out.h + tol + widen, 0, out.h_max))
    few = read_weka(_weka_dir(tmp_path, C=3, seed=8), arrival="uniform", span=30, seed=0)
    out = estimate_trace(few, Ns, lam0=1 / 120)
    assert not out.regime["validated"] and "3 conversations" in out.regime["notes"][-1]
    # the time-varying form has no stationary error band
    assert estimate_trace(u, Ns).h_lo is None


def test_cli_estimate_blocks_trace_lam0_shows_the_error_band(tmp_path):
    """No traceback with a band that has no level; the JSON carries h_lo/h_hi and the validated flag."""
    from typer.testing import CliRunner

    from kvhit.cli import app

    files = _weka_dir(tmp_path, C=8, seed=9)
    pt = read_weka(files)
    N_min = int(pt.prompt_blocks.max())
    args = ["estimate", "--blocks-trace", str(tmp_path), "--lam0", "0.01", "--N", f"{N_min},{3 * N_min}"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "error band" in flat and "±0.01" in flat
    j = CliRunner().invoke(app, [*args, "--json"])
    assert j.exit_code == 0, j.output
    out = json.loads(j.stdout)
    for row in out["rows"]:
        h = row["h"]["vllm"]
        assert row["h_hi"]["vllm"] == pytest.approx(min(h + 0.01, out["h_max"]), abs=1e-9)
        assert row["h_lo"]["vllm"] == pytest.approx(max(h - 0.01, 0.0), abs=1e-9)
    assert out["regime"]["vllm"]["validated"] is True and out["regime"]["vllm-0.23"]["validated"] is False
