"""Fleet honesty (issue 24 part 5): look-ahead sessions on Mooncake named in rows, table and help; the measured
window's stationarity reported for a kvhit trace; one workload source."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvhit import service as svc
from kvhit.cli import app

MC = Path(__file__).resolve().parent / "data" / "production" / "mooncake_small.jsonl"
SCM = {"lam0": 1.0, "mean_turns": 5.0, "x_mean": 4.0, "y_mean": 3.0, "w_mean": 135.0}


def test_mooncake_session_rows_are_labelled_lookahead():
    res = svc.fleet_simulate(
        svc.build(svc.FleetRequest, blocks_trace=MC, N=[200], replicas=[2], router=["session", "round-robin"])
    )
    rows = {r["router"]: r for r in res.rows}
    assert rows["session"]["session_lookahead"] is True
    assert rows["round-robin"]["session_lookahead"] is False
    assert res.stationarity is None  # a block-id trace: measured from an empty cache, not judged
    out = CliRunner().invoke(
        app, ["fleet", "simulate", "--blocks-trace", str(MC), "--N", "200", "--replicas", "2", "--router", "session"],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "session (look-ahead sessions: upper bound)" in out.output
    helptext = CliRunner().invoke(app, ["fleet", "simulate", "--help"], env={"COLUMNS": "200"}).output
    assert "look-ahead" in helptext and "online alternatives" in helptext


def test_kvhit_trace_rows_carry_the_window_stationarity(tmp_path):
    from kvhit.service.inputs import window_for
    from kvhit.workload import Trace
    from kvhit.workload.stationarity import check_window

    p = tmp_path / "t.parquet"
    svc.generate_trace(svc.build(svc.GenerateRequest, out=p, conversations=300, seed=2, **SCM))
    res = svc.fleet_simulate(
        svc.build(svc.FleetRequest, trace=p, N=[400], replicas=[2], router=["session"], block_size=16)
    )
    tr = Trace.read(p)
    mask = np.asarray(window_for(tr, None, None).mask(tr), bool)
    want = check_window(tr["time"], tr["conv"], mask).to_dict()
    assert res.stationarity == want
    assert res.rows[0]["session_lookahead"] is False  # the trace's own conversation ids: an online router has them
    if not want["stationary"]:
        assert want["message"] in res.notes


def test_one_workload_source():
    with pytest.raises(svc.InputError, match="give one workload source"):
        svc.build(svc.FleetRequest, sharegpt=True, blocks_trace=MC, N=[10], replicas=[1])
    with pytest.raises(svc.InputError, match=r"required \(or give --blocks-trace or --sharegpt\)"):
        svc.build(svc.FleetRequest, N=[10], replicas=[1])


def test_fleet_plan_says_its_mooncake_sessions_look_ahead():
    res = svc.fleet_plan(
        svc.build(svc.FleetPlanRequest, blocks_trace=MC, N=200, target=0.2, router=["session"], max_replicas=4)
    )
    assert any("look-ahead no online router has" in n and "upper bound" in n for n in res.notes)
