"""The command line: JSON outputs agree with the library, errors are one clear line with exit status 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvhit.cli import app
from kvhit.estimate import theory
from kvhit.workload import Trace, WorkloadSpec

runner = CliRunner()
SCM = ["--lam0", "0.5", "--p", "0.75", "--x-mean", "4", "--y-mean", "3", "--w-mean", "60"]


def run(*args):
    return runner.invoke(app, list(args))


def test_estimate_json_matches_theory():
    r = run("estimate", *SCM, "--N", "500,2275", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["moments"]["h_max"] == pytest.approx(0.75)  # SCM closed form h_max = p
    spec = WorkloadSpec.from_dict(out["spec"])
    for e in out["estimates"]:
        assert e["h_base"] == pytest.approx(float(theory.h_mean_field(spec, e["N"])))
        assert e["h_prac"] == pytest.approx(float(theory.h_mean_field(spec, e["N"], practical=True)))
    assert out["estimates"][0]["h_prac"] < out["estimates"][1]["h_prac"]


def test_estimate_table_and_toml(tmp_path):
    p = tmp_path / "w.toml"
    p.write_text(
        'lam0 = 1.0\n[turns]\nkind = "geometric"\np = 0.5\n[increments]\nkind = "iid"\nz = 3\n'
        '[interarrival]\nkind = "deterministic"\nvalue = 30\n'
    )
    r = run("estimate", "--spec", str(p), "--N", "100")
    assert r.exit_code == 0, r.output
    assert "A_H_hash" in r.stdout and "h practical" in r.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ["estimate", "--lam0", "-1", "--p", "0.5", "--x-mean", "2", "--y-mean", "2", "--w-mean", "3"],
            "lam0",
        ),
        (["estimate", "--lam0", "1", "--N", "100"], "missing flag"),
        (["estimate", "--lam0", "1"], "--N: required"),
        (["estimate", "--spec", "/nonexistent.toml", "--N", "10"], "nonexistent.toml"),
        (["simulate", *SCM, "--N", "abc"], "--N"),
        (["simulate", *SCM, "--N", "10", "--policy", "fifo", "-n", "100"], "policy"),
        (["trace", "stats", "/nonexistent.parquet"], "no such file"),
    ],
)
def test_errors_are_one_line_exit_2(args, needle):
    r = run(*args)
    assert r.exit_code == 2
    assert needle in r.output
    assert "Traceback" not in r.output


def test_generate_stats_simulate_roundtrip(tmp_path):
    out = tmp_path / "t.parquet"
    r = run("trace", "generate", *SCM, "-n", "3000", "--seed", "3", "-o", str(out), "--json")
    assert r.exit_code == 0, r.output
    tr = Trace.read(out)
    assert json.loads(r.stdout)["turns"] == tr.n_turns
    r = run("trace", "stats", str(out), "--warmup", "500", "--json")
    st = json.loads(r.stdout)
    assert st["L"] == 2500 and st["h_max_hash"] < st["h_max"] <= 1
    for policy in ("content", "block"):
        r = run(
            "simulate",
            "--trace",
            str(out),
            "--N",
            "50,400",
            "--warmup",
            "500",
            "--policy",
            policy,
            "--block-size",
            "16",
            "--json",
        )
        assert r.exit_code == 0, r.output
        res = json.loads(r.stdout)
        h = [row["h"] for row in res["rows"]]
        assert len(res["estimate"]) == 2
        if policy == "content":  # Algorithm 1 serves every request: no infeasible capacity
            assert 0 <= h[0] <= h[1] <= 1  # inclusion in N
            continue
        # the block cache cannot serve a 50-block pool: prompts of R_j > 50 blocks (T_j = R_j·b − 1) are refused
        from kvhit.workload import Window

        R = tr["R"][Window.warmup_conversations(tr, 500).mask(tr)]  # the measured turns (App. E window)
        assert R.max() > 50
        row = res["rows"][0]
        assert row["feasible"] is False and h[0] is None and res["estimate"][0]["h"] is None
        assert row["refused_request_share"] == pytest.approx((R > 50).mean(), abs=1e-15)
        Tt = R * 16 - 1
        assert row["refused_token_share"] == pytest.approx(Tt[R > 50].sum() / Tt.sum(), abs=1e-15)
        assert res["rows"][1]["feasible"] is True and 0 <= h[1] <= 1


def test_simulate_spec_replications_ci():
    r = run("simulate", *SCM, "--N", "300", "-n", "2000", "--warmup", "500", "-r", "3", "--json")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["rows"][0]
    assert len(row["h_reps"]) == 3 and row["h_ci95"] > 0
    assert min(row["h_reps"]) <= row["h"] <= max(row["h_reps"])


def test_generate_error_leaves_no_file(tmp_path):
    out = tmp_path / "t.parquet"
    r = run("trace", "generate", *SCM[:2], "-n", "10", "-o", str(out))
    assert r.exit_code == 2 and not out.exists()


def test_sharegpt_from_user_jsonl(tmp_path):
    src = "tests/data/sharegpt_small.jsonl"
    out = tmp_path / "sg.parquet"
    r = run(
        "trace",
        "sharegpt",
        "--source",
        src,
        "--warmup",
        "1",
        "--measured",
        "1",
        "--cache-dir",
        str(tmp_path / "cache"),
        "-o",
        str(out),
        "--json",
    )
    assert r.exit_code == 0, r.output
    tr = Trace.read(out)
    assert tr.n_conversations == 2 and tr.has("cum_tokens", "R_full", "R_phys")


@pytest.mark.parametrize("fixture", ["mooncake_small.jsonl", "weka_0022.json"])
def test_blocks_trace_simulate_and_curve_agree(fixture):
    path = f"tests/data/production/{fixture}"
    r = run("simulate", "--blocks-trace", path, "--N", "300,3000", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert {row["engine"] for row in rows} == {"vllm", "vllm-0.23"}
    r = run("curve", "--blocks-trace", path, "--n-min", "300", "--n-max", "3000", "--points", "2", "--json")
    assert r.exit_code == 0, r.output
    curve = json.loads(r.stdout)
    for row in rows:  # the one-pass curve equals the simulator at the same capacities
        k = curve["N"].index(row["N"])
        label = "vLLM ≥ 0.24" if row["engine"] == "vllm" else "vLLM ≤ 0.23"
        assert curve["feasible"][k] is row["feasible"]
        if not row["feasible"]:  # no ratio where the pool cannot serve the workload
            assert curve[f"{label} token hit ratio"][k] is None and row["token_hit_ratio"] is None
            assert curve["refused_request_share"][k] == row["refused_request_share"] > 0
            continue
        assert curve[f"{label} token hit ratio"][k] == pytest.approx(row["token_hit_ratio"], abs=1e-12)


def test_blocks_trace_malformed_is_one_line_error():
    r = run("simulate", "--blocks-trace", "tests/data/production/mooncake_malformed.jsonl", "--N", "100")
    assert r.exit_code == 2 and "mooncake_malformed.jsonl" in r.output and "Traceback" not in r.output
