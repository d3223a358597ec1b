"""``kvhit sweep --backend ray``: on a local Ray instance with 2 CPUs started by the sweep, the same grid gives the
same rows as the local process pool (spec and trace workloads, simulate and curve), and a resumed Ray sweep skips
the finished points. Needs Ray (``pip install 'kvhit[ray]'``, in requirements-dev.lock); ~1 min on 2 busy cores."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvhit import service as svc
from kvhit.sweep import load_grid
from kvhit.sweep.backends import run_sweep
from kvhit.sweep.store import RESULT_COLUMNS, latest, read_results

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]
SCM = ROOT / "examples" / "scm.toml"


def _rows(out: Path) -> list[dict]:
    rows = latest(read_results(out)).select(RESULT_COLUMNS).to_pylist()
    return sorted(rows, key=lambda r: (r["point_id"], r["replication"]))


@pytest.mark.slow
def test_ray_backend_gives_the_local_rows(tmp_path):
    tr = tmp_path / "t.parquet"
    svc.generate_trace(svc.build(svc.GenerateRequest, spec=SCM, out=tr, conversations=300, seed=5))
    grid = tmp_path / "grid.toml"
    grid.write_text(
        f"""
[sweep]
compute = "simulate"
replications = 2
conversations = 300
[workloads.scm]
spec = "{SCM}"
[workloads.t]
trace = "{tr}"
[axes]
engine = ["content", "vllm"]
N = [600, 3000, 1099511627776]
""",
        encoding="utf-8",
    )
    g = load_grid(grid)
    local = run_sweep(g, tmp_path / "local", jobs=2)
    assert (local.ok, local.refused) == (16, 8)  # 2^40 blocks do not fit in memory: refused by the service
    try:
        s = run_sweep(g, tmp_path / "ray", jobs=2, backend="ray")
        assert (s.ok, s.refused, s.failed, s.backend) == (16, 8, 0, "ray")
        assert _rows(tmp_path / "ray") == _rows(tmp_path / "local")
        workers = set(read_results(tmp_path / "ray").column("worker").to_pylist())
        assert 1 <= len(workers) <= 2  # Ray worker processes (each installed the shipped workloads once)
        s = run_sweep(g, tmp_path / "ray", jobs=2, backend="ray", resume=True)
        assert (s.skipped, s.ok) == (24, 0)
    finally:
        if ray.is_initialized():
            ray.shutdown()
