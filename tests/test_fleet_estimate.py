"""Fleet estimators (kvhit.fleet.estimate, docs/estimators.md §6): closed-form limits and agreement with the exact
fleet simulator on a small synthetic workload (the ShareGPT accuracy is benchmarks/fleet_accuracy.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvhit.cli import app
from kvhit.estimate.engine import estimate_window
from kvhit.fleet.estimate import estimate_fleet, estimate_fleet_curve, fragment_trace, routes
from kvhit.fleet.simulate import simulate_fleet
from kvhit.sim.runner import block_requests
from kvhit.workload import Trace
from kvhit.workload.trace import Window

runner = CliRunner()
B = 16
# SCM workload: λ0 = 0.5/s, geometric turns with continuation p = 0.75 (mean 4), geometric prompt / response blocks
# (means 4 / 3), W ~ Exp(60 s)
SCM = ["--lam0", "0.5", "--p", "0.75", "--x-mean", "4", "--y-mean", "3", "--w-mean", "60"]


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    out = tmp_path_factory.mktemp("fleet_est") / "t.parquet"
    r = runner.invoke(app, ["trace", "generate", *SCM, "-n", "1500", "--seed", "5", "-o", str(out)])
    assert r.exit_code == 0, r.output
    tr = Trace.read(out)
    mask = Window.warmup_conversations(tr, 300).mask(tr)
    return out, tr, mask, block_requests(tr, block_size=B)


def _simulate(rq, tr, Ns, router):
    return simulate_fleet(
        rq.prompt_tokens, rq.hash_offsets, rq.hashes, tr.dense_conv(), Ns=Ns, block_size=B, router=router,
        times=np.asarray(tr["time"], float),
    )  # fmt: skip


def test_one_replica_is_the_single_replica_window_estimate(setting):
    _, tr, mask, _ = setting
    lam0 = float(tr.meta["lam0"])
    for router in ("round-robin", "random", "session"):
        h = estimate_fleet(tr, routes(tr, router, 1), [600], window=mask, block_size=B)
        assert h == pytest.approx(float(estimate_window(tr, 600, lam0, window=mask, block_size=B).h), rel=1e-12)


@pytest.mark.parametrize("R", [2, 5])
def test_affinity_is_R_independent_caches_at_lam0_over_R(setting, R):
    """Every conversation on one replica and equal N: the single-replica estimate at λ0/R, exactly."""
    _, tr, mask, _ = setting
    lam0 = float(tr.meta["lam0"])
    rep = tr.dense_conv().astype(np.int64) % R
    h = estimate_fleet(tr, rep, [300] * R, window=mask, block_size=B)
    assert h == pytest.approx(float(estimate_window(tr, 300, lam0 / R, window=mask, block_size=B).h), rel=1e-9)
    # and it is not the one-replica number (the load is split): the test can tell λ0 from λ0/R
    assert h > float(estimate_window(tr, 300, lam0, window=mask, block_size=B).h) + 0.01


@pytest.mark.parametrize("router", ["round-robin", "random", "session"])
@pytest.mark.parametrize("R", [2, 3])
def test_no_eviction_limit_equals_the_simulator_exactly(setting, router, R):
    """With N beyond the whole trace nothing is evicted: a turn hits the full blocks of the last earlier turn of
    its conversation on the same replica — the fragment construction, checked against the exact simulator."""
    _, tr, mask, rq = setting
    big = int(rq.hash_offsets[-1]) + 10
    res = _simulate(rq, tr, [big] * R, router)
    h = estimate_fleet(tr, res.replica, [big] * R, window=mask, block_size=B)
    assert h == pytest.approx(res.token_hit_ratio(mask), abs=1e-12)
    # unequal capacities take the per-replica path: the same limit
    h2 = estimate_fleet(tr, res.replica, [big + k for k in range(R)], window=mask, block_size=B)
    assert h2 == pytest.approx(res.token_hit_ratio(mask), abs=1e-12)


@pytest.mark.parametrize("router,R", [("round-robin", 2), ("random", 4), ("session", 3), ("round-robin", 1)])
def test_close_to_the_simulator_under_eviction(setting, router, R):
    """N = 600 blocks evicts (the simulated ratio is far below the no-eviction ceiling). The tolerance is the
    single-replica window estimator's own error on this small workload (+0.006 at R = 1) plus margin; on
    ShareGPT the fleet errors are within 0.003 (benchmarks/fleet_accuracy.py)."""
    _, tr, mask, rq = setting
    N = 600
    res = _simulate(rq, tr, [N] * R, router)
    sim = res.token_hit_ratio(mask)
    assert 0.1 < sim < 0.7 * estimate_fleet(tr, res.replica, [10**6] * R, window=mask, block_size=B)  # evicting
    h = estimate_fleet(tr, res.replica, [N] * R, window=mask, block_size=B)
    assert abs(h - sim) < 0.02, (h, sim)


def test_monotone_in_capacity_and_per_replica_path_consistent(setting):
    _, tr, mask, _ = setting
    rep = routes(tr, "random", 3, seed=1)
    hs = [estimate_fleet(tr, rep, [N] * 3, window=mask, block_size=B) for N in (150, 300, 600, 1200)]
    assert all(a <= b + 1e-12 for a, b in zip(hs, hs[1:], strict=False)) and hs[-1] > hs[0] + 0.05
    # one replica larger: the fleet cannot lose; the per-replica path at (N, N, N+1) is the pooled one at N
    assert estimate_fleet(tr, rep, [300, 300, 1200], window=mask, block_size=B) >= hs[1] + 0.01
    assert estimate_fleet(tr, rep, [300, 300, 301], window=mask, block_size=B) == pytest.approx(hs[1], abs=0.005)


def test_scattering_costs_hits(setting):
    """Round-robin loses hits as R grows (fewer earlier turns on the same replica); affinity does not."""
    _, tr, mask, _ = setting
    rr = [estimate_fleet(tr, routes(tr, "round-robin", R), [600] * R, window=mask, block_size=B) for R in (1, 2, 4)]
    aff = [estimate_fleet(tr, tr.dense_conv() % R, [600] * R, window=mask, block_size=B) for R in (1, 2, 4)]
    assert rr[0] > rr[1] > rr[2]
    assert aff[0] < aff[1] <= aff[2] + 1e-12
    assert all(a > r for a, r in zip(aff[1:], rr[1:], strict=True))


def test_fragment_trace_turns_and_gaps(setting):
    _, tr, _, _ = setting
    rep = routes(tr, "random", 2, seed=3)
    fr = fragment_trace(tr, rep, 2)
    # every fragment is numbered 1..M in time order, and its rows are exactly one conversation on one replica
    conv = tr.dense_conv()
    fid = fr["conv"]
    assert np.array_equal(fid // 2, conv) and np.array_equal(fid % 2, rep)
    for f in np.unique(fid)[:50]:
        rows = np.flatnonzero(fid == f)
        assert fr["turn"][rows].tolist() == list(range(1, rows.size + 1))
        assert (fr["M"][rows] == rows.size).all()


def test_bad_replica_vector(setting):
    _, tr, mask, _ = setting
    with pytest.raises(ValueError, match="replica"):
        estimate_fleet(tr, np.zeros(3, np.int64), [60], window=mask, block_size=B)
    with pytest.raises(ValueError, match="replica"):
        estimate_fleet(tr, np.full(tr.n_turns, 2), [60, 60], window=mask, block_size=B)


def test_cli_estimate_column_is_the_window_form(setting):
    out, tr, _, rq = setting
    r = runner.invoke(
        app, ["fleet", "simulate", "--trace", str(out), "--replicas", "2", "--N", "600", "--router", "random",
              "--block-size", str(B), "--warmup", "300", "--json"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["rows"][0]
    mask = Window.warmup_conversations(tr, 300).mask(tr)
    res = _simulate(rq, tr, [600, 600], "random")
    assert row["token_hit_ratio"] == pytest.approx(res.token_hit_ratio(mask), rel=1e-12)
    assert row["estimate"] == pytest.approx(estimate_fleet(tr, res.replica, [600, 600], window=mask, block_size=B))


@pytest.mark.parametrize("router", ["random", "round-robin", "session"])
def test_curve_is_the_per_capacity_estimate(setting, router):
    """estimate_fleet_curve answers every capacity in one call: the per-capacity estimate_fleet to 1e-12 (pools
    unsorted, repeated, below the largest request)."""
    _, tr, mask, _ = setting
    rep = routes(tr, router, 3, seed=1)
    Ns = [1200, 5, 150, 600, 150, 40, 300]
    h = estimate_fleet_curve(tr, rep, 3, Ns, window=mask, block_size=B)
    ref = [estimate_fleet(tr, rep, [N] * 3, window=mask, block_size=B) for N in Ns]
    np.testing.assert_allclose(h, ref, rtol=0, atol=1e-12)
    assert h[-1] < h[0] - 0.05
    with pytest.raises(ValueError, match="replica"):
        estimate_fleet_curve(tr, rep, 2, Ns)
