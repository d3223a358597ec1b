"""Sampled (SHARDS) curves of long traces streamed from Parquet: time and memory against the trace's block accesses.

The workload is ``examples/long_context.toml`` (≈ 250 block accesses per turn), written once per size with
``kvhit trace generate`` (not timed); each row runs ``kvhit curve --trace FILE --sample-rate R --policies vllm
--json`` as a user does (a subprocess, after a warm-up that fills the numba cache), CPU seconds and peak RSS from
``os.wait4`` (:func:`bench_scaling._run`). Growth exponent on CPU seconds between sizes (1 = linear). Sizes:
≈ 10⁷ and 10⁸ block accesses; ``KVHIT_BENCH_LARGE=1`` adds ≈ 10⁹ (the trace takes a few minutes to write, ~1.5 GB
of disk). Accuracy is not measured here: ``benchmarks/sampling_accuracy.py``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_scaling import KVHIT, _run

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "long_context.toml"
#: conversations per size (≈ 2,500 full blocks per conversation on long_context.toml)
SIZES = {"1e7": 4_000, "1e8": 40_000, "1e9": 400_000}
RATES = (0.01,)


def _accesses(trace: Path) -> int:
    import pyarrow.parquet as pq

    t = pq.read_table(trace, columns=["R"]).column("R").to_numpy()
    return int((t - 1).sum())  # T = R·b − 1: R − 1 full blocks per request


def run(large: bool | None = None) -> dict:
    if large is None:
        large = os.environ.get("KVHIT_BENCH_LARGE") == "1"
    sizes = ["1e7", "1e8"] + (["1e9"] if large else [])
    rows = {}
    with tempfile.TemporaryDirectory(prefix="kvhit-bench-") as d:
        warm = Path(d) / "warm.parquet"
        subprocess.run([KVHIT, "trace", "generate", "--spec", str(SPEC), "-n", "50", "-o", str(warm)], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        _run(["curve", "--trace", str(warm), "--sample-rate", "0.5", "--policies", "vllm", "--json"])
        for s in sizes:
            tr = Path(d) / f"t{s}.parquet"
            subprocess.run([KVHIT, "trace", "generate", "--spec", str(SPEC), "-n", str(SIZES[s]), "-o", str(tr)],
                           check=True, stdout=subprocess.DEVNULL)  # fmt: skip
            acc = _accesses(tr)
            for rate in RATES:
                r = _run(["curve", "--trace", str(tr), "--sample-rate", str(rate), "--policies", "vllm", "--json"])
                r["block_accesses"] = acc
                rows[f"{s}@{rate}"] = r
            tr.unlink()
    out = {"sizes": sizes, "rows": rows}
    for rate in RATES:
        for a, b in zip(sizes, sizes[1:], strict=False):
            ra, rb = rows[f"{a}@{rate}"], rows[f"{b}@{rate}"]
            out[f"growth {a}→{b} @ {rate}"] = (
                math.log(rb["cpu_s"] / ra["cpu_s"]) / math.log(rb["block_accesses"] / ra["block_accesses"])
                if ra["cpu_s"] > 0 and rb["cpu_s"] > 0
                else math.nan
            )
    return out


def render(out: dict) -> str:
    lines = [
        "| size | rate | block accesses | wall s | CPU s | peak GB | accesses / CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, r in out["rows"].items():
        s, rate = k.split("@")
        flag = "" if r["rc"] == 0 else f" (exit {r['rc']})"
        lines.append(
            f"| {s} | {rate} | {r['block_accesses']:,} | {r['wall_s']:.1f} | {r['cpu_s']:.1f}{flag} | "
            f"{r['max_rss_gb']:.2f} | {r['block_accesses'] / max(r['cpu_s'], 1e-9):,.0f} |"
        )
    for k, v in out.items():
        if k.startswith("growth"):
            lines.append(f"\n{k} (CPU): {v:.2f}")
    return "\n".join(lines)


def main() -> None:
    print(render(run(large="--large" in sys.argv or None)))


if __name__ == "__main__":
    main()
