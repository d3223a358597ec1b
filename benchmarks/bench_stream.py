"""Streaming simulation (``kvhit stream``): time, throughput and peak RSS at 10⁴ → 10⁶ → 10⁷ (→ 10⁸) events.

Each size runs ``kvhit stream --spec examples/scm.toml --events X --N 2275 [--policy block]`` in a fresh
subprocess (after one warm-up run that fills the numba cache), so the peak RSS (``ru_maxrss`` of that child alone,
from ``os.wait4``) is the memory of that size only. The content rows count turn events (Algorithm 1); the block
rows are sized in block accesses (blocks touched by admitted requests; the SCM example averages 25 blocks per
request, so X accesses ≈ X / 25 requests) and report the accesses actually made. Memory should be flat in the
trace length: the 10⁴-event row is the floor (Python, numba, the imports).

The 10⁸ rows take minutes; they run only with ``KVHIT_BENCH_LARGE=1`` (``make bench-large``). Run alone:
``python benchmarks/bench_stream.py`` (add ``--large`` for 10⁸).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from child import run_child

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "scm.toml"
KVHIT = str(Path(sys.executable).with_name("kvhit"))
N = 2275
#: mean blocks per request of the SCM example (A_R / E[M] = 100 / 4): requests for a target of block accesses
BLOCKS_PER_REQUEST = 25
TIMEOUT_S = 3600


def _run(args: list[str]) -> dict:
    """``kvhit ARGS --json`` in a child: wall and CPU seconds, peak RSS of that child (:mod:`child`), its answer."""
    r = run_child([KVHIT, *args, "--json"], TIMEOUT_S, capture=True)
    return {
        "wall_s": r.wall_s,
        "cpu_s": r.cpu_s,
        "max_rss_mb": r.max_rss_bytes / 2**20,
        "load": r.load,
        "rc": r.rc,
        "answer": json.loads(r.stdout) if r.rc == 0 else {},
    }


def _args(policy: str, events: int) -> list[str]:
    return ["stream", "--spec", str(SPEC), "--events", str(events), "--N", str(N), "--policy", policy]


def run(large: bool | None = None) -> dict:
    if large is None:
        large = os.environ.get("KVHIT_BENCH_LARGE") == "1" or "--large" in sys.argv
    sizes = [10**4, 10**6, 10**7] + ([10**8] if large else [])
    _run(_args("content", 1000))  # fill the numba cache outside the timings
    _run(_args("block", 1000))
    rows = []
    for policy in ("content", "block"):
        for size in sizes:
            events = size if policy == "content" else math.ceil(size / BLOCKS_PER_REQUEST)
            r = _run(_args(policy, events))
            a = r.pop("answer")
            row = a.get("rows", [{}])[0]
            rows.append(
                {
                    "policy": policy,
                    "size": size,
                    "events": events,
                    "block_accesses": a.get("block_accesses"),
                    "h": row.get("h"),
                    "elapsed_s": a.get("elapsed_s"),
                    "events_per_s": a.get("events_per_s"),
                    "block_accesses_per_s": a.get("block_accesses_per_s"),
                    **r,
                }
            )
    out: dict = {"N": N, "spec": str(SPEC.relative_to(ROOT)), "rows": rows}
    for policy in ("content", "block"):
        rs = [x for x in rows if x["policy"] == policy and x["rc"] == 0]
        if len(rs) >= 2:
            out[f"{policy}_rss_largest_over_smallest"] = rs[-1]["max_rss_mb"] / rs[0]["max_rss_mb"]
    return out


def render(res: dict) -> str:
    lines = [
        f"  kvhit stream --spec {res['spec']} --N {res['N']} (fresh process per row; RSS = that child's ru_maxrss)",
        f"  {'policy':<8} {'size':>6} {'events':>12} {'block accesses':>15} {'wall s':>8} {'cpu s':>8} "
        f"{'M events/s':>10} {'M acc/s':>8} {'peak RSS MB':>11} {'h':>7} {'load':>5}",
    ]
    for r in res["rows"]:
        acc = r["block_accesses"]
        label = f"1e{round(math.log10(r['size']))}"
        lines.append(
            f"  {r['policy']:<8} {label:>6} "
            f"{r['events']:>12,} {(f'{acc:,}' if acc else '–'):>15} {r['wall_s']:>8.1f} {r['cpu_s']:>8.1f} "
            f"{(r['events_per_s'] or float('nan')) / 1e6:>10.2f} "
            f"{((r['block_accesses_per_s'] or float('nan')) / 1e6):>8.2f} {r['max_rss_mb']:>11.0f} "
            f"{(r['h'] if r['h'] is not None else float('nan')):>7.4f} {r['load']:>5.1f}"
            + ("" if r["rc"] == 0 else f"  FAILED rc={r['rc']}")
        )
    for k in ("content", "block"):
        v = res.get(f"{k}_rss_largest_over_smallest")
        if v is not None:
            lines.append(f"  {k}: peak RSS at the largest size / at 1e4 = {v:.2f}")
    return "\n".join(lines)


def main() -> None:
    res = run()
    print(render(res))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
