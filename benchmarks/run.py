"""`make bench`: run every benchmark in this folder and print throughputs and same-run ratios.

Each ``bench_*.py`` module exposes ``run() -> dict`` (measured numbers; ratios are against a baseline measured in
the same run, because this machine is shared and absolute times drift) and ``main()``.
"""

from __future__ import annotations

import importlib
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _fmt(v):
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def main(argv: list[str]) -> int:
    only = set(argv)
    names = sorted(p.stem for p in HERE.glob("bench_*.py"))
    results = {}
    print(
        f"kvhit benchmarks — {platform.python_implementation()} {platform.python_version()}, "
        f"{platform.machine()}, {time.strftime('%Y-%m-%d %H:%M:%S')}"
    )
    for name in names:
        if only and name not in only and name.removeprefix("bench_") not in only:
            continue
        mod = importlib.import_module(name)
        t0 = time.perf_counter()
        res = mod.run()
        res["wall_s"] = time.perf_counter() - t0
        results[name] = res
        print(f"\n== {name} ==")
        if hasattr(mod, "render"):
            print(mod.render(res))
            continue
        for k, v in res.items():
            if isinstance(v, dict | list):
                v = json.dumps(v, default=str)
            print(f"  {k:<44} {_fmt(v)}")
    out = HERE.parent / "out" / "bench.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print(f"\nwrote {out.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
