"""``kvhit sweep``: grid validation, rows equal to the service's answers, order/worker independence, one-pass curve
equal to per-capacity simulation, atomic batches and --resume, failures recorded and retried, report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from clihelp import kvhit
from kvhit import service as svc
from kvhit.sweep import GridError, load_grid
from kvhit.sweep import compute as sweep_compute
from kvhit.sweep.backends import run_sweep
from kvhit.sweep.grid import derive_seed
from kvhit.sweep.store import RESULT_COLUMNS, latest, read_results

ROOT = Path(__file__).resolve().parents[1]
SCM = ROOT / "examples" / "scm.toml"


def _grid(tmp_path: Path, body: str, name: str = "grid.toml") -> Path:
    p = tmp_path / name
    p.write_text(body, encoding="utf-8")
    return p


SPEC_GRID = f"""
[sweep]
compute = "simulate"
replications = 2
conversations = 300
seed = 7
[workloads.scm]
spec = "{SCM}"
[axes]
engine = ["content", "vllm"]
N = [400, 2000]
lam0 = [0.5, 1.5]
"""


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    from kvhit.workload import Trace

    out = tmp_path_factory.mktemp("sweep") / "t.parquet"
    svc.generate_trace(svc.build(svc.GenerateRequest, spec=SCM, out=out, conversations=400, seed=3))
    tr = Trace.read(out)
    tr.meta["block_size"] = 128  # as a ShareGPT trace records it (the tiers estimator needs it)
    tr.write(out)
    return out


@pytest.fixture(scope="module")
def sharegpt_small(tmp_path_factory) -> Path:
    """300 ShareGPT conversations (token counts: what the host-tier estimator reads)."""
    out = tmp_path_factory.mktemp("sweep") / "sg.parquet"
    svc.sharegpt_trace(svc.build(svc.ShareGPTRequest, out=out, n_warm=50, n_meas=250, seed=2))
    return out


def _results(out: Path) -> list[dict]:
    t = latest(read_results(out))
    rows = t.select(RESULT_COLUMNS).to_pylist()
    return sorted(rows, key=lambda r: (r["point_id"], r["replication"]))


# -- the grid file ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, field",
    [
        ("[sweep]\ncompute = 'fast'\n[axes]\nN = [10]", "sweep.compute"),
        ("[sweep]\nreplications = 0\n[axes]\nN = [10]", "sweep.replications"),
        ("[sweep]\nseed = 1.5\n[axes]\nN = [10]", "sweep.seed"),
        ("[sweep]\ncolour = 1\n[axes]\nN = [10]", "sweep.colour"),
        ("[axes]\nengine = ['vllm']", "axes"),
        ("[axes]\nN = [10]\nhbm_gb = [1]", "axes"),
        ("[axes]\nN = [0]", "axes.N"),
        ("[axes]\nN = []", "axes.N"),
        ("[axes]\nN = [10, 10]", "axes.N"),
        ("[axes]\nN = [10]\nengine = ['tgi']", "axes.engine"),
        ("[axes]\nN = [10]\nlam0 = [-1]", "axes.lam0"),
        ("[axes]\nN = [10]\nrouter = ['magic']", "axes.router"),
        ("[axes]\nN = [10]\nbatch = [1]", "axes.batch"),
        ("[workloads.a]\nspec = 'missing.toml'\n[axes]\nN = [10]", "workloads.a.spec"),
        ("[workloads.a]\nsharegpt = true\ntrace = 'x.parquet'\n[axes]\nN = [10]", "workloads.a"),
        ("[workloads.a]\nsharegpt = true\ncolour = 1\n[axes]\nN = [10]", "workloads.a.colour"),
        (f"[workloads.a]\nspec = '{SCM}'\nlam0 = 0\n[axes]\nN = [10]", "workloads.a"),
        (f"[workloads.a]\nspec = '{SCM}'\n[axes]\nN = [10]\nreplicas = [2]", "axes.replicas"),
        ("[sweep]\ncompute = 'estimate'\n[axes]\nN = [10]\nengine = ['sglang']", "axes.engine"),
        ("[sweep]\ncompute = 'curve'\n[axes]\nN = [10]\nrouter = ['random']", "axes.replicas/router"),
        ("[sweep]\nmodel = 'no-such-model'\n[axes]\nhbm_gb = [10]", "sweep.model"),
        ("[axes\nN = [10]", "invalid TOML"),
        ("[sweep]\ntier = 'native'\n[axes]\nN = [10]", "sweep.tier"),
        ("[sweep]\ntier = 'nvme'\n[axes]\nN = [10]\ndram_gb = [1]", "sweep.tier"),
        ("[axes]\nN = [10]\ndram_gb = [1]\nengine = ['vllm']", "axes.engine"),
        ("[axes]\nN = [10]\ndram_gb = [-1]", "axes.dram_gb"),
        ("[sweep]\ncompute = 'curve'\n[axes]\nN = [10]\ndram_gb = [1]", "axes.dram_gb"),
    ],
)
def test_bad_grids_are_refused_in_one_line_naming_the_file_and_field(tmp_path, body, field):
    p = _grid(tmp_path, body)
    with pytest.raises(GridError) as e:
        load_grid(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and field in msg, msg
    r = kvhit("sweep", p, "--out", tmp_path / "out")
    assert r.code == 2 and len(r.err_lines) == 1 and field in r.err and not r.exc, (r.err, r.exc)
    assert not (tmp_path / "out").exists()


def test_the_readme_grid_is_valid():
    g = load_grid(ROOT / "examples" / "sweep_sharegpt.toml")
    assert (len(g.points()), len(g.tasks()), g.compute) == (45, 9, "curve")
    assert {p["N"] for p in g.points()} == {284, 568, 1137, 2275, 4551}  # 5…80 GiB of Qwen3-8B KV, b = 128


def test_seeds_depend_on_coordinates_not_on_order():
    assert derive_seed(0, "scm", 1.0, 0) == derive_seed(0, "scm", 1.0, 0)
    assert (
        derive_seed(0, "scm", 1.0, 0) == 811733740183875460
    )  # pinned (blake2b-64 of [0, "scm", 1.0, 0]): results stay reproducible across versions
    assert len({derive_seed(s, "scm", lam, r) for s in (0, 1) for lam in (0.5, 1.0) for r in (0, 1)}) == 8


def test_axis_order_in_the_file_changes_no_seed_or_point(tmp_path):
    a = load_grid(_grid(tmp_path, SPEC_GRID, "a.toml"))
    body = SPEC_GRID.replace(
        'engine = ["content", "vllm"]\nN = [400, 2000]', 'N = [2000, 400]\nengine = ["vllm", "content"]'
    )
    b = load_grid(_grid(tmp_path, body, "b.toml"))
    key = lambda t: (t.points[0]["point_id"], t.replication)  # noqa: E731
    assert {key(t): t.seed for t in a.tasks()} == {key(t): t.seed for t in b.tasks()}
    assert a.fingerprint() == b.fingerprint()


# -- running ----------------------------------------------------------------------------------------------------


def test_rows_are_the_service_answers_and_do_not_depend_on_workers(tmp_path):
    g = load_grid(_grid(tmp_path, SPEC_GRID))
    s1 = run_sweep(g, tmp_path / "j1", jobs=1)
    assert (s1.ok, s1.failed, s1.points) == (16, 0, 16)
    rows = _results(tmp_path / "j1")
    assert len(rows) == 16 and all(r["status"] == "ok" and r["h"] is not None for r in rows)
    # a point recomputed by hand through the service: same number
    r = next(x for x in rows if x["engine"] == "vllm" and x["N"] == 2000 and x["lam0"] == 1.5 and x["replication"] == 1)
    req = svc.build(
        svc.SimulateRequest,
        spec=SCM,
        lam0=1.5,
        N=[2000],
        policy="block",
        engine="vllm",
        seed=r["seed"],
        replications=1,
        conversations=300,
        block_size=128,
        estimates=False,
    )
    assert svc.simulate(req).rows[0]["h"] == r["h"]
    # engines and capacities of one (workload, λ0, replication) share the seed (common random numbers)
    assert len({x["seed"] for x in rows}) == 4
    s2 = run_sweep(g, tmp_path / "j2", jobs=2)
    assert s2.ok == 16
    assert _results(tmp_path / "j2") == rows


def test_workloads_are_shipped_once_per_worker_not_per_point(tmp_path, monkeypatch):
    from kvhit.sweep import backends

    calls = tmp_path / "installs"
    calls.mkdir()
    real = sweep_compute.install

    def counting_install(pid, payload):
        if sweep_compute._STATE["id"] != pid:
            (calls / f"{os.getpid()}-{len(list(calls.iterdir()))}").write_text("")
        real(pid, payload)

    monkeypatch.setattr(sweep_compute, "install", counting_install)
    monkeypatch.setattr(backends, "install", counting_install)
    g = load_grid(_grid(tmp_path, SPEC_GRID))
    assert run_sweep(g, tmp_path / "o", jobs=2).ok == 16
    installs = [p.name.split("-")[0] for p in calls.iterdir()]
    assert 1 <= len(installs) <= 2 and len(set(installs)) == len(installs), installs  # once per worker process


def test_one_pass_curve_equals_per_capacity_simulation(tmp_path, small_trace):
    body = f"""
[sweep]
compute = "{{mode}}"
[workloads.t]
trace = "{small_trace}"
[axes]
engine = ["content", "vllm", "vllm-0.23"]
N = [300, 600, 1200, 4000]
"""
    sim = load_grid(_grid(tmp_path, body.format(mode="simulate"), "sim.toml"))
    cur = load_grid(_grid(tmp_path, body.format(mode="curve"), "cur.toml"))
    assert len(sim.tasks()) == 12 and len(cur.tasks()) == 1
    run_sweep(sim, tmp_path / "sim")
    run_sweep(cur, tmp_path / "cur")
    a = {(r["engine"], r["N"]): r["h"] for r in _results(tmp_path / "sim")}
    b = {(r["engine"], r["N"]): r["h"] for r in _results(tmp_path / "cur")}
    assert a.keys() == b.keys() and sum(v is not None for v in a.values()) >= 9
    for k in a:  # None: a capacity below the largest request (vLLM refuses it), in both
        assert (a[k] is None and b[k] is None) or b[k] == pytest.approx(a[k], abs=1e-12), (k, a[k], b[k])


def test_fleet_points_are_the_fleet_service_answers(tmp_path, small_trace):
    body = f"""
[sweep]
estimates = true
[workloads.t]
trace = "{small_trace}"
[axes]
N = [800]
replicas = [1, 4]
router = ["round-robin", "session"]
"""
    g = load_grid(_grid(tmp_path, body))
    s = run_sweep(g, tmp_path / "o")
    assert s.ok == 4
    rows = {(r["replicas"], r["router"]): r for r in _results(tmp_path / "o")}
    want = svc.fleet_simulate(
        svc.build(
            svc.FleetRequest,
            trace=small_trace,
            replicas=[1, 4],
            router=["round-robin", "session"],
            N=[800],
            seed=rows[(4, "session")]["seed"],
        )
    )
    for w in want.rows:
        r = rows[(w["replicas"], w["router"])]
        assert r["h"] == w["token_hit_ratio"] and r["metric"] == "tokens" and r["h_estimate"] == w["estimate"]
    assert rows[(4, "round-robin")]["h"] < rows[(4, "session")]["h"]  # scattering turns loses their prefixes


def test_fleet_estimate_points_are_fleet_simulate_estimates(tmp_path, sharegpt_small):
    """sweep.compute = "estimate" with replicas/router axes: one service call per (router, R) for every capacity
    (service.fleet_estimate_curve), each point the estimate fleet simulate prints at that capacity."""
    body = f"""
[sweep]
compute = "estimate"
[workloads.t]
trace = "{sharegpt_small}"
[axes]
N = [30, 400, 2000]
replicas = [1, 3]
router = ["dynamo", "random", "least-loaded"]
"""
    g = load_grid(_grid(tmp_path, body))
    assert len(g.tasks()) == 6
    assert run_sweep(g, tmp_path / "o").ok == 18
    rows = _results(tmp_path / "o")
    for r in rows:
        w = svc.fleet_simulate(
            svc.build(
                svc.FleetRequest,
                trace=sharegpt_small,
                replicas=[r["replicas"]],
                router=[r["router"]],
                N=[r["N"]],
                seed=r["seed"],
            )  # fmt: skip
        ).rows[0]
        assert r["h"] == w["estimate"] and r["h_estimate"] == w["estimate"] and r["metric"] == "tokens", r
        assert r["feasible"] == (w["rejected"] == 0)
    assert all(r["h"] is None for r in rows if r["router"] == "least-loaded")
    assert sum(r["h"] is not None for r in rows) == 12


@pytest.mark.parametrize("compute", ["simulate", "estimate"])
def test_dram_points_are_the_tiers_service_answers(tmp_path, sharegpt_small, compute):
    body = f"""
[sweep]
compute = "{compute}"
[workloads.t]
trace = "{sharegpt_small}"
[axes]
N = [100, 400]
dram_gb = [0, 4]
"""
    g = load_grid(_grid(tmp_path, body))
    assert run_sweep(g, tmp_path / "o").ok == 4
    rows = {(r["N"], r["dram_gb"]): r for r in _results(tmp_path / "o")}
    want = svc.tiers(
        svc.build(
            svc.TiersRequest,
            trace=sharegpt_small,
            hbm_blocks=[100, 400],
            dram_gb=[0, 4],
            estimate="only" if compute == "estimate" else "none",
        )
    )
    for i, n in enumerate(want.hbm_blocks):
        for j, d in enumerate(want.dram_gib):
            # simulated: exactly; the estimator solves per call, to ~1e-10, so one pair alone may differ there
            tol = 0 if compute == "simulate" else 1e-8
            assert (
                rows[(n, d)]["h"] == pytest.approx(want.h[i][j], rel=tol, abs=tol) and rows[(n, d)]["engine"] == "vllm"
            )
    assert rows[(100, 4.0)]["h"] > rows[(100, 0.0)]["h"]  # the host tier adds hits


def test_production_traces_sweep_like_the_commands(tmp_path):
    prod = ROOT / "tests" / "data" / "production"
    body = f"""
[sweep]
compute = "{{mode}}"
[workloads.mc]
blocks_trace = "{prod / "mooncake_small.jsonl"}"
[workloads.weka]
blocks_trace = "{prod / "weka_0022.json"}"
[axes]
engine = ["vllm", "vllm-0.23"]
N = [20, 60, 200, 1000]
"""
    got = {}
    for mode in ("simulate", "curve"):
        g = load_grid(_grid(tmp_path, body.format(mode=mode), f"{mode}.toml"))
        assert run_sweep(g, tmp_path / mode).ok == 16
        got[mode] = {(r["workload"], r["engine"], r["N"]): r["h"] for r in _results(tmp_path / mode)}
    assert got["simulate"] == got["curve"] and sum(v is not None for v in got["simulate"].values()) >= 6
    want = svc.simulate(svc.build(svc.SimulateRequest, blocks_trace=prod / "mooncake_small.jsonl", N=[200, 1000]))
    for w in want.rows:
        assert got["simulate"][("mc", w["engine"], w["N"])] == w["token_hit_ratio"]
    # fixed arrival times: no λ0 axis; conversations are needed for Algorithm 1
    for extra, field in [("lam0 = [1.0]", "axes.lam0"), ('engine = ["content"]', "axes.engine")]:
        bad = body.format(mode="simulate").replace('engine = ["vllm", "vllm-0.23"]', extra)
        with pytest.raises(GridError, match=field):
            load_grid(_grid(tmp_path, bad, "bad.toml"))


def test_estimate_grid_groups_capacities_into_one_service_call(tmp_path):
    body = f"""
[sweep]
compute = "estimate"
[workloads.scm]
spec = "{SCM}"
[axes]
N = [100, 1000, 2275]
lam0 = [0.5, 1.0]
"""
    g = load_grid(_grid(tmp_path, body))
    assert len(g.tasks()) == 2
    run_sweep(g, tmp_path / "o")
    rows = _results(tmp_path / "o")
    want = svc.estimate(svc.build(svc.EstimateRequest, spec=SCM, lam0=1.0, N=[100, 1000, 2275]))
    got = {r["N"]: r["h"] for r in rows if r["lam0"] == 1.0}
    assert got == {e.N: e.h for e in want.estimates}


def test_batches_are_atomic_and_resume_reruns_only_missing_points(tmp_path):
    g = load_grid(_grid(tmp_path, SPEC_GRID))
    out = tmp_path / "o"
    run_sweep(g, out, flush_rows=1)  # one part file per batch of tasks
    parts = sorted((out / "results").glob("part-*.parquet"))
    assert len(parts) >= 4 and not list((out / "results").glob(".*tmp"))
    full = _results(out)
    lost = sum(pq.read_metadata(p).num_rows for p in parts[:3])
    for p in parts[:3]:  # as if the sweep had been killed before these batches
        p.unlink()
    s = run_sweep(g, out, resume=True)
    assert (s.skipped, s.ok) == (16 - lost, lost)
    assert _results(out) == full
    s = run_sweep(g, out, resume=True)
    assert (s.skipped, s.ok) == (16, 0)
    # more axis values: only the new points run
    g2 = load_grid(_grid(tmp_path, SPEC_GRID.replace("N = [400, 2000]", "N = [400, 2000, 4000]"), "grid.toml"))
    s = run_sweep(g2, out, resume=True)
    assert (s.skipped, s.ok) == (16, 8)
    # refused: an existing sweep without --resume, or another grid's settings
    r = kvhit("sweep", tmp_path / "grid.toml", "--out", out)
    assert r.code == 2 and "--resume" in r.err
    other = _grid(tmp_path, SPEC_GRID.replace("seed = 7", "seed = 8"), "other.toml")
    r = kvhit("sweep", other, "--out", out, "--resume")
    assert r.code == 2 and "another grid" in r.err


_REAL_RUN_TASK = sweep_compute.run_task


def _flaky(marker_dir: Path, always_fail: tuple, crash: tuple = ()):
    real = _REAL_RUN_TASK

    def run_task(task):
        p = task.points[0]
        key = (p["engine"], p["N"], p.get("lam0"), task.replication)
        if key in always_fail:
            raise RuntimeError(f"injected failure at {key}")
        m = marker_dir / f"{task.task_id}.tried"
        if not m.exists():  # the first attempt of every task fails (or kills its worker)
            m.write_text("1")
            if key in crash:
                os._exit(3)
            raise OSError("transient: injected")
        return real(task)

    return run_task


@pytest.mark.parametrize("jobs", [1, 2])
def test_failed_points_are_recorded_and_retried_never_killing_the_sweep(tmp_path, monkeypatch, jobs):
    g = load_grid(_grid(tmp_path, SPEC_GRID.replace("replications = 2", "replications = 1\nretries = 2")))
    bad = ("vllm", 400, 0.5, 0)
    monkeypatch.setattr(sweep_compute, "run_task", _flaky(tmp_path, (bad,)))
    s = run_sweep(g, tmp_path / "o", jobs=jobs)
    assert (s.ok, s.failed, s.points) == (7, 1, 8)
    rows = latest(read_results(tmp_path / "o")).to_pylist()
    failed = [r for r in rows if r["status"] != "ok"]
    assert len(failed) == 1 and failed[0]["status"] == "error" and failed[0]["h"] is None
    assert failed[0]["error"] == f"RuntimeError: injected failure at {bad}" and failed[0]["attempts"] == 3
    assert all(r["attempts"] == 2 for r in rows if r["status"] == "ok")  # each failed once, then succeeded
    # the report lists the failure; --resume retries it (here it now succeeds)
    monkeypatch.setattr(sweep_compute, "run_task", _flaky(tmp_path, ()))
    s = run_sweep(g, tmp_path / "o", jobs=jobs, resume=True)
    assert (s.skipped, s.ok) == (7, 1)
    assert all(r["status"] == "ok" for r in latest(read_results(tmp_path / "o")).to_pylist())


def test_a_dead_worker_fails_only_an_attempt(tmp_path, monkeypatch):
    g = load_grid(_grid(tmp_path, SPEC_GRID.replace("replications = 2", "replications = 1\nretries = 3")))
    crash = ("content", 2000, 1.5, 0)
    monkeypatch.setattr(sweep_compute, "run_task", _flaky(tmp_path, (), (crash,)))
    s = run_sweep(g, tmp_path / "o", jobs=2)
    assert (s.ok, s.failed) == (8, 0)
    rows = latest(read_results(tmp_path / "o")).to_pylist()
    # only the killed worker's task counts the crash as an attempt (issue 24: it was every task in flight or queued);
    # a task stopped on the other worker by the broken pool is resubmitted without counting one
    by_key = {(r["engine"], r["N"], r["lam0"]): r["attempts"] for r in rows}
    assert by_key[crash[:3]] == 2
    assert all(1 <= a <= 2 for a in by_key.values())


def test_a_refused_point_is_recorded_once_not_retried(tmp_path):
    body = f"""
[sweep]
compute = "simulate"
conversations = 200
[workloads.scm]
spec = "{SCM}"
[axes]
engine = ["content"]
N = [50, 1099511627776]
"""
    # the service refuses a capacity whose simulator would not fit in memory: per point, with its reason
    g = load_grid(_grid(tmp_path, body))
    s = run_sweep(g, tmp_path / "o")
    assert (s.ok, s.refused, s.retries) == (1, 1, 0)
    row = next(r for r in read_results(tmp_path / "o").to_pylist() if r["status"] != "ok")
    assert row["status"] == "refused" and row["error"].startswith("--N: a capacity of") and row["attempts"] == 1


# -- the command line and the report ----------------------------------------------------------------------------


def test_cli_runs_a_grid_and_reports_it(tmp_path):
    p = _grid(tmp_path, SPEC_GRID)
    out = tmp_path / "o"
    r = kvhit("sweep", p, "--out", out, "--json")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert (d["rows"], d["ok"], d["failed"]) == (16, 16, 0)
    t = pq.read_table(d["parts"][0])
    assert {"point_id", "h", "h_ci95", "seed", "wall_s", "kvhit_version", "status", "error"} <= set(t.column_names)
    r = kvhit("sweep", "report", out, "--json")
    assert r.code == 0, r.err
    rep = json.loads(r.out)
    assert rep["counts"]["ok"] == 16 and rep["counts"]["points"] == 8
    assert set(rep["by_axis"]) == {"engine", "N", "lam0"}
    assert all(p["ci95"] is not None and p["replications"] == 2 for p in rep["points"])
    assert {Path(f).name for f in rep["figures"]} == {f"h_vs_{a}.{e}" for a in ("N", "lam0") for e in ("png", "svg")}
    r = kvhit("sweep", "report", out)
    assert r.code == 0 and "h by engine" in r.out
    for args, what in [
        (("sweep", "report", tmp_path), "not a sweep result directory"),
        (("sweep", "report"), "missing DIR"),
        (("sweep", "report", out, "--resume"), "--resume"),
        (("sweep", p, "--backend", "spark"), "--backend"),
        (("sweep", p, "--address", "auto"), "--address"),
        (("sweep", tmp_path / "nope.toml"), "no such file"),
    ]:
        r = kvhit(*args)
        assert r.code == 2 and len(r.err_lines) == 1 and what in r.err and not r.exc, (args, r.err)


def test_pool_workers_die_with_a_killed_driver(tmp_path):
    """SIGKILL of the driver leaves no pool worker running (PR_SET_PDEATHSIG)."""
    import signal
    import subprocess
    import sys
    import time

    grid = _grid(tmp_path, SPEC_GRID.replace("replications = 2", "replications = 1"))
    script = f"""
import time
from pathlib import Path
import kvhit.sweep.compute as c
from kvhit.sweep import load_grid
from kvhit.sweep.backends import run_sweep
c.run_task = lambda task: time.sleep(600)
run_sweep(load_grid(Path({str(grid)!r})), Path({str(tmp_path / "o")!r}), jobs=2)
"""
    drv = subprocess.Popen([sys.executable, "-c", script])
    try:
        kids: list[int] = []
        t0 = time.time()
        while len(kids) < 2 and time.time() - t0 < 120:
            time.sleep(0.5)
            f = Path(f"/proc/{drv.pid}/task/{drv.pid}/children")
            kids = [int(x) for x in f.read_text().split()] if f.exists() else []
        assert len(kids) >= 2, "the pool did not start"
        time.sleep(1.0)
        drv.send_signal(signal.SIGKILL)
        drv.wait(10)
        t1 = time.time()
        alive = kids
        while alive and time.time() - t1 < 10:
            time.sleep(0.2)
            alive = [k for k in kids if Path(f"/proc/{k}").exists() and "Z" not in _state(k)]
        assert alive == [], f"workers still running after the driver was killed: {alive}"
    finally:
        if drv.poll() is None:
            drv.kill()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"
