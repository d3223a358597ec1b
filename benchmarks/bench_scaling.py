"""How each command's time and memory grow with the trace: 10⁵ → 10⁶ (→ 10⁷) turns of the SCM example.

Every command runs as the user runs it (``kvhit ...`` in a subprocess, after one warm-up that fills the numba
cache), timed by wall clock and by CPU seconds (user + sys of the child: on this shared machine wall time
depends on what else runs, CPU time much less); the peak RSS is the child's ``ru_maxrss`` (from ``os.wait4``).
The growth exponent between two sizes is log(t₂/t₁)/log(n₂/n₁) on CPU seconds (1 = linear).

The 10⁷-turn row takes several minutes (``curve``: 91 CPU s and 10.3 GB peak before the conversation-structured
threshold pass of :mod:`kvhit.sim.vllm.curve_conv`; after it, measured once on a shared machine: 66 CPU s and 3.8 GB
with the estimators, 40 CPU s and 2.5 GB with ``--no-estimate``); it runs only with
``KVHIT_BENCH_LARGE=1``
(``make bench-large``). Run alone: ``python benchmarks/bench_scaling.py`` (add ``--large`` for 10⁷).
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from pathlib import Path

from child import run_child

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "scm.toml"
KVHIT = str(Path(sys.executable).with_name("kvhit"))
#: conversations per size (E[M] = 4 turns on the SCM example): ≈ 10⁵, 10⁶, 10⁷ turns
SIZES = {"1e5": 25_000, "1e6": 250_000, "1e7": 2_500_000}
TIMEOUT_S = 1800


def _commands(trace: Path, n_conv: int, out: Path) -> list[tuple[str, list[str]]]:
    t = str(trace)
    return [
        ("trace generate", ["trace", "generate", "--spec", str(SPEC), "-n", str(n_conv), "-o", t]),
        ("simulate content", ["simulate", "--trace", t, "--N", "2275", "--policy", "content"]),
        ("simulate block", ["simulate", "--trace", t, "--N", "2275", "--policy", "block"]),
        ("trace stats", ["trace", "stats", t]),
        ("curve (1,000 capacities)", ["curve", "--trace", t, "--points", "1000", "--json"]),
        ("curve, Algorithm 1 only", ["curve", "--trace", t, "--points", "1000", "--policies", "content", "--json"]),
        ("curve --no-estimate", ["curve", "--trace", t, "--points", "1000", "--no-estimate", "--json"]),
        (
            "curve --sample-rate 0.01 (SHARDS)",
            ["curve", "--trace", t, "--points", "1000", "--sample-rate", "0.01", "--json"],
        ),
    ]


def _run(args: list[str]) -> dict:
    """Run ``kvhit ARGS``; wall seconds, CPU seconds and peak RSS of that child alone (:mod:`child`)."""
    r = run_child([KVHIT, *args], TIMEOUT_S)
    return {"wall_s": r.wall_s, "cpu_s": r.cpu_s, "max_rss_gb": r.max_rss_bytes / 1e9, "load": r.load, "rc": r.rc}


def run(large: bool | None = None) -> dict:
    if large is None:
        large = os.environ.get("KVHIT_BENCH_LARGE") == "1"
    sizes = ["1e5", "1e6"] + (["1e7"] if large else [])
    res: dict = {}
    with tempfile.TemporaryDirectory(prefix="kvhit-bench-") as d:
        warm = Path(d) / "warm.parquet"
        for _, args in _commands(warm, 200, Path(d)):  # fill the numba cache outside the timings
            _run(args)
        for s in sizes:
            tr = Path(d) / f"t{s}.parquet"
            for name, args in _commands(tr, SIZES[s], Path(d)):
                res[f"{name} @ {s}"] = _run(args)
            tr.unlink(missing_ok=True)
    table = {}
    for name, _ in _commands(Path("x"), 1, Path("x")):
        row = {s: res[f"{name} @ {s}"] for s in sizes}
        exps = {}
        for a, b in zip(sizes, sizes[1:], strict=False):
            ca, cb = row[a]["cpu_s"], row[b]["cpu_s"]
            exps[f"{a}→{b}"] = math.log(cb / ca) / math.log(SIZES[b] / SIZES[a]) if ca > 0 and cb > 0 else math.nan
        table[name] = {"runs": row, "growth_exponent_cpu": exps}
    return {"table": table, "sizes": sizes}


def render(out: dict) -> str:
    sizes = out["sizes"]
    head = "| command | " + " | ".join(f"{s} turns: wall / CPU s, peak GB" for s in sizes) + " | growth (CPU) |"
    lines = [head, "|" + "---|" * (len(sizes) + 2)]
    for name, row in out["table"].items():
        cells = []
        for s in sizes:
            r = row["runs"][s]
            flag = "" if r["rc"] == 0 else f" (exit {r['rc']})"
            cells.append(f"{r['wall_s']:.1f} / {r['cpu_s']:.1f}, {r['max_rss_gb']:.2f}{flag}")
        g = ", ".join(f"{k}: {v:.2f}" for k, v in row["growth_exponent_cpu"].items())
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {g} |")
    loads = [r["load"] for row in out["table"].values() for r in row["runs"].values()]
    lines.append(f"\n1-minute load average during the runs: {min(loads):.1f}–{max(loads):.1f} (2 cores)")
    return "\n".join(lines)


def main() -> None:
    out = run(large="--large" in sys.argv or None)
    print(render(out))


if __name__ == "__main__":
    main()
