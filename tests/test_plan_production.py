"""Planning and curves on production block-id traces: infeasible capacities, exact answers by replay and by
resample-and-simulate, and the CLI surfaces (strict JSON, refused shares, --trace given a block trace)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from kvhit.cli import app
from kvhit.plan.planner import Capacity, plan_production
from kvhit.sim.resample import conversation_pool, resample_simulate
from kvhit.sim.tracerun import production_curve, production_rows
from kvhit.sim.vllm.block import simulate_block, token_hit_ratio
from kvhit.workload.production import read_weka

D = "tests/data/production"
FILES = [f"{D}/weka_0014_cut.json", f"{D}/weka_0022.json", f"{D}/weka_0026.json"]
runner = CliRunner()


@pytest.fixture(scope="module")
def pt():
    return read_weka(FILES, arrival="uniform", span=600.0, seed=0, strict=False)


def _cap(N, b=64):
    return Capacity(
        N=N, bytes_per_block=b * 147456, kv_bytes=N * b * 147456, model="Qwen3-8B", accelerator="x", block_size=b
    )


def _hand_refused(pt, N):
    need = -(-pt.prompt_tokens // pt.block_size)
    return (need > N).mean(), pt.prompt_tokens[need > N].sum() / pt.prompt_tokens.sum()


def test_rows_and_curve_infeasible_below_largest_request(pt):
    n_min = int((-(-pt.prompt_tokens // pt.block_size)).max())
    Ns = [n_min // 3, n_min - 1, n_min, 4 * n_min]
    rows, feas = production_rows(pt, Ns, ("vllm",))
    assert feas.N_min == n_min
    for row in rows:
        rq, rt = _hand_refused(pt, row["N"])
        assert row["refused_request_share"] == pytest.approx(rq, abs=1e-15)
        assert row["refused_token_share"] == pytest.approx(rt, abs=1e-15)
        assert row["feasible"] == (row["N"] >= n_min)
        assert (row["token_hit_ratio"] is None) == (not row["feasible"])
    c = production_curve(pt, np.asarray(Ns), ("vllm",))
    tok = c["engines"]["vllm"]["token_hit_ratio"]
    assert np.isnan(tok[:2]).all()
    rq = pt.to_block_requests()
    for k in (2, 3):
        res = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=Ns[k], block_size=rq.block_size)
        assert not res.rejected.any()
        assert tok[k] == pytest.approx(token_hit_ratio(res), abs=1e-14) == rows[k]["token_hit_ratio"]
    assert c["h_max"] == pytest.approx(pt.describe()["ideal_token_hit_ratio"], abs=1e-15)


def test_plan_replay_infeasible_and_exact(pt):
    pool = conversation_pool(pt)
    small = plan_production(pt, _cap(pool.N_min - 1), use_estimator=False)
    assert small.feasible is False and small.h_at_capacity is None and small.answered_by == "replay"
    rq, rt = _hand_refused(pt, pool.N_min - 1)
    assert small.refused_request_share == pytest.approx(rq) and small.refused_token_share == pytest.approx(rt)
    big = plan_production(pt, _cap(2 * pool.N_min), target=0.5, verify=True, use_estimator=False)
    assert big.feasible is True
    assert big.verify["h_simulated"] == big.h_at_capacity  # replay answers exactly, verify replays again
    # (b) is the first grid capacity whose replayed ratio reaches the target, and never below N_min
    assert big.N_for_target >= pool.N_min
    row = production_rows(pt, [big.N_for_target], ("vllm",))[0][0]
    assert row["token_hit_ratio"] >= 0.5


def test_plan_resampled_is_resample_simulate(pt):
    pool = conversation_pool(pt)
    N = 2 * pool.N_min
    p = plan_production(
        pt, _cap(N), lam0=0.01, verify=True, replications=3, n_conversations=15, seed=5, use_estimator=False
    )
    r = resample_simulate(pool, [N], lam0=0.01, n_conversations=15, replications=3, seed=5)
    m, hw = r.stationary_ci()
    assert p.answered_by == "resample" and p.h_at_capacity == m[0]
    assert p.verify["h_simulated"] == m[0] and p.verify["h_simulated_ci95"] == hw[0]
    assert p.verify["seeds"] == [5, 6, 7]


def _run(*args):
    return runner.invoke(app, list(args))


def test_cli_plan_blocks_trace_json_is_strict(pt, tmp_path):
    d = tmp_path / "weka"
    d.mkdir()
    for f in FILES:
        (d / f.split("/")[-1]).write_bytes(open(f, "rb").read())
    r = _run("plan", "--blocks-trace", str(d), "--arrival", "uniform", "--span", "600", "--kv-gb", "1", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"bare {c} in --json"))
    N = out["capacity"]["N"]
    assert N == math.floor(2**30 / (64 * 147456))  # 1 GiB of Qwen3-8B KV at 64-token blocks
    assert out["feasible"] is (N >= out["N_min"])
    if not out["feasible"]:
        assert out["h_at_capacity"] is None and out["refused_request_share"] > 0


def test_cli_curve_blocks_trace_marks_infeasible_and_plots(tmp_path):
    r = _run(
        "curve", "--blocks-trace", FILES[1], "--n-min", "100", "--n-max", "5000", "--points", "30",
        "--model", "llama-3.1-8b", "--plot", str(tmp_path / "c"), "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"bare {c} in --json"))
    assert out["grid"] == "log" and out["model"] == "Llama-3.1-8B"
    n_min = out["N_min"]
    for k, N in enumerate(out["N"]):
        assert out["feasible"][k] is (N >= n_min)
        assert (out["vLLM ≥ 0.24 token hit ratio"][k] is None) is (N < n_min)
    assert (tmp_path / "c.png").stat().st_size > 0


def test_cli_trace_flag_given_a_block_trace_says_which_flag():
    r = _run("plan", "--trace", FILES[1], "--kv-gb", "40")
    assert r.exit_code == 2 and "--blocks-trace" in r.output and "Traceback" not in r.output


def test_cli_simulate_blocks_trace_infeasible_rows():
    r = _run("simulate", "--blocks-trace", FILES[1], "--N", "100,700", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"bare {c} in --json"))
    by = {(x["N"], x["engine"]): x for x in out["rows"]}
    assert out["N_min"] == 683  # the fixture's largest request: ceil(T/64) blocks
    assert by[(100, "vllm")]["feasible"] is False and by[(100, "vllm")]["token_hit_ratio"] is None
    assert by[(700, "vllm-0.23")]["feasible"] is True and 0 < by[(700, "vllm-0.23")]["token_hit_ratio"] < 1


def test_cli_estimate_blocks_trace_matches_library_and_marks_infeasible(pt):
    from kvhit.estimate.agentic import estimate_trace

    r = _run("estimate", "--blocks-trace", FILES[1], "--N", "100,700,5000", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"bare {c} in --json"))
    assert out["N_min"] == 683
    rows = {x["N"]: x for x in out["rows"]}
    assert rows[100]["feasible"] is False and rows[100]["h"] == {"vllm": None, "vllm-0.23": None}
    rq, rt = _hand_refused(read_weka(FILES[1]), 100)
    assert rows[100]["refused_request_share"] == pytest.approx(rq) and rows[100][
        "refused_token_share"
    ] == pytest.approx(rt)
    est = estimate_trace(read_weka(FILES[1]), [700, 5000], engine="vllm-0.23")
    assert rows[700]["h"]["vllm-0.23"] == pytest.approx(est.h[0], abs=1e-12)
    assert rows[5000]["h"]["vllm-0.23"] == pytest.approx(est.h[1], abs=1e-12)


def test_cli_estimate_trace_refuses_spec_flags_and_wrong_engine():
    r = _run("estimate", "--blocks-trace", FILES[1], "--N", "700", "--p", "0.5")
    assert r.exit_code == 2 and "--blocks-trace" in r.output
    r = _run("estimate", "--blocks-trace", FILES[1], "--N", "700", "--engine", "content")
    assert r.exit_code == 2 and "--engine" in r.output and "Traceback" not in r.output


def test_cli_trace_stats_on_block_trace(tmp_path):
    r = _run("trace", "stats", FILES[1], "--fig", str(tmp_path / "s"), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"bare {c} in --json"))
    assert out["summary"]["requests"] == 7 and out["summary"]["min_N"] == 683
    assert out["summary"]["ceiling_token_hit_ratio"] == pytest.approx(
        read_weka(FILES[1]).describe()["ideal_token_hit_ratio"]
    )
    assert (tmp_path / "s.png").stat().st_size > 0
    r = _run("trace", "stats", FILES[1])
    assert r.exit_code == 0 and "largest request" in r.output


def test_cli_curve_blocks_trace_has_estimator_lines(tmp_path):
    r = _run("curve", "--blocks-trace", FILES[1], "--n-min", "100", "--n-max", "3000", "--points", "12", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    for label in ("estimate: vLLM ≥ 0.24 (agentic)", "estimate: vLLM ≤ 0.23 (agentic)"):
        h = out[label]
        for k, N in enumerate(out["N"]):
            assert (h[k] is None) is (N < out["N_min"])


def test_plan_stationary_answers_by_the_flagged_estimator_and_verifies_exactly(pt):
    """Issue 23: the stationary form answers (seconds, flagged NOT validated); --verify resamples (minutes)."""
    from kvhit.estimate.agentic import estimate_trace

    pool = conversation_pool(pt)
    N = 2 * pool.N_min
    p = plan_production(pt, _cap(N), lam0=0.01, verify=True, replications=2, n_conversations=10, seed=1)
    r = resample_simulate(pool, [N], lam0=0.01, n_conversations=10, replications=2, seed=1)
    est = estimate_trace(pt, [N], engine="vllm", metric="tokens", lam0=0.01)
    assert p.answered_by == "estimator" and p.h_at_capacity == pytest.approx(est.h[0], abs=1e-12)
    assert any("NOT validated" in n for n in p.notes)
    assert p.verify["h_simulated"] == r.stationary_ci()[0][0]
    assert p.verify["predictor"] == "estimator" and p.verify["h_predicted"] == pytest.approx(est.h[0], abs=1e-12)
    assert p.verify["difference"] == pytest.approx(est.h[0] - p.verify["h_simulated"], abs=1e-12)
