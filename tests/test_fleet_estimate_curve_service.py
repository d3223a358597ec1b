"""service.fleet_estimate.fleet_estimate_curve (what ``kvhit sweep`` runs for fleets with sweep.compute =
"estimate"): at every capacity, the number ``fleet simulate`` prints in its estimate column; refusals one line."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from kvhit import service as svc
from kvhit.cli import app
from kvhit.service.errors import InputError
from kvhit.service.fleet_estimate import fleet_estimate_curve

SCM = ["--lam0", "0.5", "--p", "0.75", "--x-mean", "4", "--y-mean", "3", "--w-mean", "60"]
NS = [900, 60, 240]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("fleet_curve_svc") / "t.parquet"
    r = CliRunner().invoke(app, ["trace", "generate", *SCM, "-n", "600", "--seed", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize("speed", [None, 1500.0])
def test_every_capacity_is_the_simulate_estimate(trace, speed):
    kw = dict(trace=str(trace), block_size=16, seed=4, prefill_tokens_per_s=speed)
    routers = ["round-robin", "dynamo", "llm-d", "sticky", "sglang", "least-loaded"]
    res = fleet_estimate_curve(svc.build(svc.FleetRequest, router=routers, replicas=[2, 3], N=[1], **kw), NS)
    got = res.curves
    assert 60 < res.n_min < 900  # the largest measured prompt, in 16-token blocks
    assert set(got) == {(r, R) for r in routers for R in (2, 3)}
    for (name, R), (h, why) in got.items():
        rows = [
            svc.fleet_simulate(svc.build(svc.FleetRequest, router=[name], replicas=[R], N=[N], **kw)).rows[0]
            for N in NS
        ]
        # a capacity below the largest measured request rejects requests (the simulator's count)
        assert [N >= res.n_min for N in NS] == [r["rejected"] == 0 for r in rows]
        if h is None:
            assert why and all(r["estimate"] is None for r in rows), (name, R, why)
            continue
        assert why is None
        np.testing.assert_array_equal(h, [r["estimate"] for r in rows], err_msg=f"{name} R = {R}")
    assert got["least-loaded", 2][0] is None
    assert (got["round-robin", 2][0] is None) == (speed is not None)


def test_refusals(trace):
    req = svc.build(svc.FleetRequest, trace=str(trace), replicas=[2], router=["dynamo"], N=[10], block_size=16)
    with pytest.raises(InputError, match="N"):
        fleet_estimate_curve(req, [0, 10])
