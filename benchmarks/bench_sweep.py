"""Sweep throughput (``kvhit sweep``): a 10,000-point estimator grid, a ShareGPT simulation grid on 1 vs 2 local
workers, and the same simulation grid on Ray (a local Ray instance with 2 CPUs started by the command) vs local.

Every configuration runs ``kvhit sweep GRID --json`` in a fresh subprocess into a fresh directory; ``seconds`` is
the command's own sweep time (building the shipped workloads — the ShareGPT trace, ~2 s — and running every point;
for Ray also starting the local Ray instance), ``wall_s`` the whole child including Python and imports, ``cpu_s``
the CPU time of the child and its pool workers (local backend only). Ratios are within this run (the machine is
shared: 2 cores, other jobs running — a speed-up below 2 is partly that; equal ``cpu_s`` for 1 and 2 workers
means the parallel run did no extra work).

Grids (written to a temporary directory):

* estimator: the SCM example (``examples/scm.toml``), ``compute = "estimate"`` (mean-field eq. (32)), 100
  capacities × 100 λ0 = 10,000 points, grouped by the sweep into 100 service calls.
* simulation: ShareGPT (bundled), ``compute = "simulate"`` (one exact simulation per point, no one-pass curve),
  engines content/vllm/vllm-0.23 × ``SIM_CAPACITIES`` capacities — 3 × 70 = 210 points by default; 1,002 points
  (334 capacities) with ``KVHIT_BENCH_LARGE=1``.

Run alone: ``python benchmarks/bench_sweep.py`` (``--large`` for the 1,002-point grid).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from child import run_child

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "scm.toml"
KVHIT = str(Path(sys.executable).with_name("kvhit"))
TIMEOUT_S = 3600


def _capacities(n: int, lo: int, hi: int) -> list[int]:
    import numpy as np

    return [int(x) for x in np.unique(np.geomspace(lo, hi, n).astype(int))]


def estimator_grid() -> str:
    import numpy as np

    lam = [round(float(x), 6) for x in np.geomspace(0.1, 10.0, 100)]
    return f"""[sweep]
compute = "estimate"
[workloads.scm]
spec = "{SPEC}"
[axes]
N = {_capacities(100, 100, 100_000)}
lam0 = {lam}
"""


def simulation_grid(n_caps: int) -> str:
    return f"""[sweep]
compute = "simulate"
[axes]
engine = ["content", "vllm", "vllm-0.23"]
N = {_capacities(n_caps, 200, 20_000)}
"""


def _run(grid: Path, out: Path, *args: str) -> dict:
    """``kvhit sweep GRID --json`` in a child: its answer, wall seconds, and the CPU seconds of the child and the
    workers it reaped (``os.wait4``, :mod:`child`: the local pool's workers count; Ray's do not — they are the
    raylet's)."""
    r = run_child([KVHIT, "sweep", str(grid), "--out", str(out), "--json", *args], TIMEOUT_S, capture=True)
    wall, ru_cpu, out_text = r.wall_s, r.cpu_s, r.stdout
    if r.rc != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1], "wall_s": wall}
    d = json.loads(out_text)
    return {
        "rows": d["rows"],
        "ok": d["ok"],
        "failed": d["failed"],
        "seconds": d["seconds"],
        "rows_per_s": d["rows"] / d["seconds"],
        "wall_s": wall,
        "cpu_s": ru_cpu,
    }


def run(large: bool | None = None) -> dict:
    large = bool(os.environ.get("KVHIT_BENCH_LARGE")) if large is None else large
    n_caps = 334 if large else 70
    res: dict = {"load_avg_1min_at_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="kvhit-bench-sweep-") as tmp:
        t = Path(tmp)
        (t / "est.toml").write_text(estimator_grid())
        (t / "sim.toml").write_text(simulation_grid(n_caps))
        # warm-up: fills the numba cache and the ShareGPT tokenization cache
        (t / "warm.toml").write_text(simulation_grid(2))
        _run(t / "warm.toml", t / "warm")
        res["estimator_10k_j1"] = _run(t / "est.toml", t / "e1", "-j", "1")
        res["estimator_10k_j2"] = _run(t / "est.toml", t / "e2", "-j", "2")
        res["simulation_j1"] = _run(t / "sim.toml", t / "s1", "-j", "1")
        res["simulation_j2"] = _run(t / "sim.toml", t / "s2", "-j", "2")
        try:
            import ray  # noqa: F401

            res["simulation_ray_2cpus"] = _run(t / "sim.toml", t / "r2", "-j", "2", "--backend", "ray")
        except ImportError:
            res["simulation_ray_2cpus"] = {"error": "ray not installed (pip install 'kvhit[ray]')"}
    s1, s2, r2 = res["simulation_j1"], res["simulation_j2"], res["simulation_ray_2cpus"]
    if "seconds" in s1 and "seconds" in s2:
        res["speedup_local_2_vs_1_workers"] = s1["seconds"] / s2["seconds"]
    if "seconds" in r2 and "seconds" in s2:
        res["ray_2cpus_vs_local_j2_time_ratio"] = r2["seconds"] / s2["seconds"]
    res["simulation_points"] = 3 * len(_capacities(n_caps, 200, 20_000))
    res["load_avg_1min_at_end"] = os.getloadavg()[0]
    return res


def render(res: dict) -> str:
    lines = []
    for k in ("estimator_10k_j1", "estimator_10k_j2", "simulation_j1", "simulation_j2", "simulation_ray_2cpus"):
        r = res[k]
        if "error" in r:
            lines.append(f"  {k:<26} error: {r['error']}")
            continue
        cpu = "" if "ray" in k else f", CPU {r['cpu_s']:.1f} s"
        lines.append(
            f"  {k:<26} {r['rows']:>6,} points  {r['seconds']:8.2f} s  {r['rows_per_s']:9.1f} points/s  "
            f"(child wall {r['wall_s']:.1f} s{cpu}, failed {r['failed']})"
        )
    for k in ("speedup_local_2_vs_1_workers", "ray_2cpus_vs_local_j2_time_ratio"):
        if k in res:
            lines.append(f"  {k:<34} {res[k]:.2f}")
    lines.append(
        f"  simulation grid: {res['simulation_points']:,} points; load average "
        f"{res['load_avg_1min_at_start']:.1f} → {res['load_avg_1min_at_end']:.1f} (2 shared cores)"
    )
    return "\n".join(lines)


def main() -> None:
    print(render(run(large="--large" in sys.argv[1:])))


if __name__ == "__main__":
    main()
