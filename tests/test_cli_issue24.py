"""CLI findings of issue 24: outputs checked by creating a file before computing (``os.access`` is true for root
under /proc), invalid inputs that were accepted (strings as times, absurd Mooncake timestamps, tp above the
attention heads, a Parquet trace under a .txt name, an unknown sweep model, an empty router), and help texts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clihelp import assert_refused, kvhit

SCM = ["--lam0", "0.5", "--p", "0.75", "--x-mean", "4", "--y-mean", "3", "--w-mean", "60"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("i24") / "t.parquet"
    assert kvhit("trace", "generate", *SCM, "-n", "200", "--seed", "1", "-o", out).code == 0
    return out


@pytest.mark.parametrize(
    "args, flag",
    [
        (["curve", *SCM, "--conversations", "300", "--plot", "/proc/curve"], "--plot"),
        (["reproduce", "--quick", "-o", "/proc/x"], "--out"),
        (["trace", "generate", *SCM, "-n", "10", "-o", "/proc/t.parquet"], "--out"),
        (["sweep", "examples/sweep_sharegpt.toml", "--out", "/proc/s"], "--out"),
    ],
)
def test_outputs_under_proc_are_refused_before_computing(args, flag):
    t0 = time.time()
    r = kvhit(*args, cwd=str(Path(__file__).resolve().parents[1]))
    assert_refused(r, flag, "/proc", "cannot create a file")
    assert time.time() - t0 < 30  # refused, not computed first (reproduce ran > 3 minutes)


def test_trace_stats_fig_under_proc_names_the_flag_not_a_temp_file(trace):
    r = kvhit("trace", "stats", trace, "--fig", "/proc/x")
    assert_refused(r, "--fig", "/proc/x.png")
    assert ".tmp" not in r.err


def test_fleet_and_tiers_plot_under_proc(trace):
    r = kvhit("fleet", "simulate", "--trace", trace, "--N", "500", "--replicas", "2", "--plot", "/proc/f")
    assert_refused(r, "--plot", "/proc")
    r = kvhit("tiers", "--trace", trace, "--hbm-blocks", "100", "--dram-gb", "1", "--plot", "/proc/t")
    assert_refused(r, "--plot", "/proc")


def test_parquet_time_as_strings_is_refused(trace, tmp_path):
    t = pq.read_table(trace)
    i = t.column_names.index("time")
    bad = t.set_column(i, "time", pa.array([str(x) for x in t.column("time").to_pylist()]))
    out = tmp_path / "strtime.parquet"
    pq.write_table(bad, out)
    assert_refused(kvhit("trace", "stats", out), "column 'time' must be numeric")


def test_absurd_mooncake_timestamp_is_refused(tmp_path):
    rows = [{"timestamp": 1e30 if i == 3 else 1000 * i, "input_length": 1536, "output_length": 5,
             "hash_ids": [0, 1, 2 + i]} for i in range(20)]  # fmt: skip
    p = tmp_path / "mc.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    assert_refused(kvhit("curve", "--blocks-trace", p, "--n-max", "1000"), "line 4", "timestamp", "10^13")
    rows[3]["timestamp"] = 1e13  # the largest accepted: the year 2286 as an epoch in ms
    p.write_text("\n".join(json.dumps(x) for x in rows) + "\n")
    from kvhit.workload.production import read_mooncake

    assert float(np.max(read_mooncake(p).time)) == pytest.approx(1e10)


def test_kv_tp_above_attention_heads_is_refused():
    assert_refused(kvhit("kv", "--model", "llama-3.1-8b", "--tp", "1024"), "--tp", "32 attention heads")
    r = kvhit("kv", "--model", "llama-3.1-8b", "--tp", "8")
    assert r.code == 0
    assert "--tp: tp:" not in kvhit("kv", "--model", "llama-3.1-8b", "--tp", "3").err


def test_trace_generate_txt_suffix_is_refused(tmp_path):
    out = tmp_path / "out.txt"
    assert_refused(kvhit("trace", "generate", *SCM, "-n", "10", "-o", out), "--out", ".parquet")
    assert not out.exists()


def test_sweep_grid_with_unknown_model_is_refused(tmp_path):
    g = tmp_path / "g.toml"
    spec = Path(__file__).resolve().parents[1] / "examples" / "scm.toml"
    g.write_text(f'[sweep]\nmodel = "no-such-model"\n[workloads.scm]\nspec = "{spec}"\n[axes]\nN = [100, 200]\n')
    r = kvhit("sweep", g, "--out", tmp_path / "o")
    assert_refused(r, "sweep.model", "no-such-model")
    assert not (tmp_path / "o").exists()


def test_empty_router_is_refused(trace):
    r = kvhit("fleet", "simulate", "--trace", trace, "--N", "500", "--replicas", "2", "--router", "")
    assert_refused(r, "--router", "empty")


def test_fleet_simulate_help_says_N_is_per_replica():
    out = kvhit("fleet", "simulate", "--help").out
    assert "EACH" in out and "replica" in out
    assert "repeat or" not in out.split("--N", 1)[1].split("--", 1)[0]


def test_trace_errors_name_the_path_once(tmp_path):
    p = tmp_path / "mc.jsonl"
    p.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}) + "\n")
    r = kvhit("curve", "--blocks-trace", p, "--n-max", "1000")
    assert_refused(r, f"--blocks-trace {p}: line 1")
    assert r.err.count(str(p)) == 1


def test_positional_trace_errors_name_the_path_once(tmp_path):
    p = tmp_path / "missing.parquet"
    r = kvhit("trace", "stats", p)
    assert_refused(r, f"PATH {p}: no such file")  # was "PATH …/missing.parquet: …/missing.parquet: no such file"
    assert r.err.count(str(p)) == 1


def test_version_fast_path_imports_nothing_heavy():
    import subprocess
    import sys

    heavy = ("pydantic", "typer", "numpy", "numba", "scipy", "matplotlib", "pyarrow")
    code = (
        "import sys; from kvhit.cli import main; main(['--version']); "
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.splitlines() == ["kvhit 0.1.0", "[]"]


def test_fleet_router_collapse_and_lookahead_sessions_are_reported():
    from kvhit import service as svc

    mc = Path(__file__).resolve().parent / "data" / "production" / "mooncake_small.jsonl"
    res = svc.fleet_simulate(
        svc.build(svc.FleetRequest, blocks_trace=mc, N=[200], replicas=[4], router=["dynamo", "round-robin"])
    )
    rows = {r["router"]: r for r in res.rows}
    # no prefill speed: no load is seen, so dynamo sends every request where its prefix is (counted here directly)
    per = [p for p in res.per_replica if p["router"] == "dynamo"]
    share = max(p["requests"] for p in per) / sum(p["requests"] for p in per)
    assert rows["dynamo"]["busiest_replica_share"] == share
    assert share == 1.0 and rows["dynamo"]["collapsed"] is True
    assert rows["round-robin"]["collapsed"] is False
    assert any(n.startswith("collapsed onto one replica") and "dynamo at R = 4 sent 100.0%" in n for n in res.notes)
    assert any("look-ahead no online router has" in n and "upper bound" in n for n in res.notes)
    r = kvhit("fleet", "simulate", "--blocks-trace", mc, "--N", "200", "--replicas", "4", "--router", "dynamo")
    assert r.code == 0
    assert "(collapsed: one replica)" in r.out


def test_missing_list_option_says_required(trace):
    assert_refused(kvhit("tiers", "--trace", trace, "--dram-gb", "1"), "--hbm-blocks: required")
    r = kvhit("simulate", "--N", "100", *SCM, "--warmup", "-1")
    assert_refused(r, "--warmup", "greater than or equal to 0")


def test_estimate_imports_no_scipy_numba_matplotlib_pyarrow():
    import subprocess
    import sys

    code = (
        "import sys; from kvhit.cli import main; "
        "main(['estimate', '--N', '1000', '--lam0', '1', '--mean-turns', '5', '--x-mean', '4', '--y-mean', '3', "
        "'--w-mean', '135', '--json']); "
        "print(sorted(m for m in ('scipy', 'numba', 'matplotlib', 'pyarrow') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.splitlines()[-1] == "[]"
