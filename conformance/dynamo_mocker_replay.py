"""Run NVIDIA Dynamo's mocker (ai-dynamo 1.6.1, ``dynamo.replay.run_trace_replay``) on a Mooncake trace: the peer
side of conformance/check_dynamo_mocker.py. Runs in the throwaway env of ``conformance/make_env.sh dynamo 1.6.1``
(no kvhit import).

Per cell (R replicas, N blocks of ``--block-size`` tokens each) it runs the offline replay ``--runs`` times with
the KV router (``router_mode="kv_router"``, every KvRouterConfig default) and the mocker's default engine timing
(vLLM backend, ``timing_model: polynomial``, ``max_num_batched_tokens`` 8192, ``max_num_seqs`` 256, chunked
prefill, prefix caching, ``speedup_ratio`` 1), and records the replay's own ``prefix_cache_reused_ratio``
(Σ reused input tokens / Σ input tokens; a preempted request counts its last admission's reused tokens) and its
``first_admission_prefix_cache_reused_ratio`` (first admissions only: what kvhit measures; the two are equal
when nothing is preempted), its mean ITL/TTFT and the wall time. The replay has no seed for the
router: equal-cost workers are picked at random (run_synthetic_trace_replay's docstring in dynamo/replay/api.py),
so the runs differ; all are kept. ``--probe`` also times isolated requests on one worker (prefill time against
new tokens, decode inter-token latency) for the timing mapping on kvhit's side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from importlib.metadata import version


def _replay(path, R, N, b, capture=False):
    from dynamo.replay import run_trace_replay

    return run_trace_replay(
        [path],
        extra_engine_args={"engine": {"num_gpu_blocks": int(N), "block_size": int(b)}},
        num_workers=int(R),
        router_mode="kv_router",
        trace_block_size=int(b),
        capture_per_request=capture,
    )


def _one(reqs, b):
    fd, p = tempfile.mkstemp(suffix=".jsonl")
    try:
        with os.fdopen(fd, "w") as f:
            for r in reqs:
                f.write(json.dumps(r) + "\n")
        return sorted(_replay(p, 1, 16384, b, capture=True).per_request, key=lambda r: r["arrival_time_ms"])
    finally:
        os.unlink(p)


def probe(b):
    """Isolated requests on one worker: TTFT of a 1-token request with x new tokens (one prefill step, x ≤ 8192 =
    max_num_batched_tokens), and the ITL of a 257-token response; least-squares line ms = a + s·x."""
    xs = [b * k for k in range(1, 8192 // b + 1)]
    ys = []
    for x in xs:
        r = _one([{"timestamp": 0, "input_length": x, "output_length": 1, "hash_ids": list(range(x // b))}], b)[0]
        ys.append(float(r["ttft_ms"]))
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    s = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    a = my - s * mx
    itl = []
    for x in (b, 4 * b, 16 * b):
        r = _one([{"timestamp": 0, "input_length": x, "output_length": 257, "hash_ids": list(range(x // b))}], b)[0]
        itl.append(float(r["itl_ms"]))
    return {
        "prefill_new_tokens": xs,
        "prefill_ms": ys,
        "prefill_fit_ms": {
            "a": a,
            "s_per_token": s,
            "max_abs_residual_ms": max(abs(a + s * x - y) for x, y in zip(xs, ys, strict=True)),
        },
        "itl_ms_at_prompt": dict(zip([b, 4 * b, 16 * b], itl, strict=True)),
        "itl_ms": sum(itl) / len(itl),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--blocks", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--block-size", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)
    if a.runs < 1:
        print("dynamo_mocker_replay: --runs: expected an integer >= 1", file=sys.stderr)
        return 2
    out = {"ai_dynamo": version("ai-dynamo"), "ai_dynamo_runtime": version("ai-dynamo-runtime"),
           "trace": os.path.abspath(a.trace), "block_size": a.block_size, "cells": []}  # fmt: skip
    if a.probe:
        out["probe"] = probe(a.block_size)
    for R in a.replicas:
        for N in a.blocks:
            runs = []
            for _ in range(a.runs):
                t0 = time.perf_counter()
                s = dict(_replay(a.trace, R, N, a.block_size).summary)
                runs.append({"hit": float(s["prefix_cache_reused_ratio"]),
                             "hit_first_admission": float(s["first_admission_prefix_cache_reused_ratio"]),
                             "mean_itl_ms": float(s["mean_itl_ms"]),
                             "mean_ttft_ms": float(s["mean_ttft_ms"]), "mean_e2e_ms": float(s["mean_e2e_latency_ms"]),
                             "requests": int(s["completed_requests"]), "wall_s": time.perf_counter() - t0})  # fmt: skip
            hits = [r["hit"] for r in runs]
            out["cells"].append({"R": R, "N": N, "runs": runs, "mean_hit": sum(hits) / len(hits),
                                 "spread": max(hits) - min(hits)})  # fmt: skip
            print(f"mocker R={R} N={N}: hit {sum(hits) / len(hits):.4f} (runs {', '.join(f'{h:.4f}' for h in hits)})",
                  file=sys.stderr)  # fmt: skip
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
