"""The CLI's ``--decode-kv`` against the Dynamo peer check's ``isolated:output`` library call (docs/peers.md).

For each seed and ``N`` in 4,096 / 16,384, runs ``kvhit fleet simulate --blocks-trace <Mooncake conversation trace>
--replicas 2,4 --router dynamo`` with the probe's timing as flags (prefill 10.87 ms + T/53,056 tok/s, hit tokens
saving 18.848 µs each, decode 173.5 tok/s, ``--prefill-hold``, ``--decode-kv``) and
``conformance/check_dynamo_mocker.run_cell(…, "isolated", "output", …)`` at the same seed, and prints both per run and
their means, ranges and largest difference per cell.

Run::

    NUMBA_CACHE_DIR=.numba_cache PYTHONPATH=src python benchmarks/peers_cli_decode_kv.py --seeds 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "conformance"))
import check_dynamo_mocker as c  # noqa: E402

from kvhit.workload.production import read_mooncake  # noqa: E402

TRACE = ROOT.parent / "shared" / "data" / "traces" / "mooncake_fast25" / "conversation_trace.jsonl"
PROBE = {"prefill_fit_ms": {"a": 10.87, "s_per_token": 0.018848}, "itl_ms": 5.764}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--trace", default=str(TRACE))
    a = ap.parse_args(argv)
    tr = read_mooncake(a.trace, block_size=512)
    ob = c.with_output_blocks(tr, 512)
    P, D = 1000 / 0.018848, 1000 / 5.764
    res: dict = {}
    for N in (4096, 16384):
        for sd in range(a.seeds):
            cmd = [sys.executable, "-m", "kvhit.cli", "fleet", "simulate", "--blocks-trace", a.trace, "--replicas",
                   "2,4", "--N", str(N), "--router", "dynamo", "--prefill-tokens-per-s", repr(P),
                   "--prefill-overhead-s", "0.01087", "--hit-token-seconds", "0.000018848", "--decode-tokens-per-s",
                   repr(D), "--prefill-hold", "--decode-kv", "--no-estimates", "--seed", str(sd), "--json"]  # fmt: skip
            out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
            for row in out["rows"]:
                R = row["replicas"]
                lib = c.run_cell(tr, {"R": R, "N": N, "runs": []}, "isolated", "output", PROBE, [sd], 512, ob)[0]
                res.setdefault((R, N), []).append((row["token_hit_ratio"], lib))
                print(f"R={R} N={N} seed {sd}: CLI {row['token_hit_ratio']:.6f} library {lib:.6f}", flush=True)
    for (R, N), v in sorted(res.items()):
        x = np.array(v)
        print(f"R={R} N={N}: CLI mean {x[:, 0].mean():.4f} range {np.ptp(x[:, 0]):.4f}; library mean "
              f"{x[:, 1].mean():.4f}; max |CLI − library| {np.abs(x[:, 0] - x[:, 1]).max():.2e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
