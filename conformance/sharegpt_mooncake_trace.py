"""Write a ShareGPT-derived trace in the Mooncake FAST'25 JSONL format (the held-out trace of the Dynamo-mocker peer
check, docs/peers.md): :func:`kvhit.workload.sharegpt_trace.build_sharegpt_trace` (the bundled ShareGPT V3
corpus, Qwen3 tokens, Poisson conversation arrivals, Exponential(135 s) gaps between turns), one JSON line per
turn in time order: ``timestamp`` (ms, rounded), ``input_length`` (the turn's whole prompt: ``cum_tokens``),
``output_length`` (its response tokens), ``hash_ids`` (one per ``--block-size`` block of the prompt).

Block ids: block ``j`` of conversation ``c`` has the id ``c · 100000 + j`` whenever it is full (a later turn's
prompt extends the earlier one, so a full block's tokens are the same in every turn that has it); a prompt's
partial last block gets a fresh id (its tokens differ from the full block a later turn has there). Different
conversations share no block. The ids chain as Mooncake's do: equal ids imply equal prefixes.

Usage: ``python conformance/sharegpt_mooncake_trace.py --seed 20261203 --out out/peers/sharegpt-s20261203.jsonl``
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from kvhit.workload.sharegpt_trace import build_sharegpt_trace


def rows(seed: int, n: int, lam0: float, b: int) -> list[dict]:
    tr, _ = build_sharegpt_trace(n_warm=0, n_meas=n, seed=seed, lam0=lam0, block_size=b)
    c = tr.cols
    order = np.argsort(c["time"], kind="stable")
    fresh = 10**10
    out = []
    for i in order:
        T = int(c["cum_tokens"][i])
        conv = int(c["conv"][i])
        full = T // b
        ids = [conv * 100000 + j for j in range(full)]
        if T % b:
            ids.append(fresh)
            fresh += 1
        out.append({"timestamp": int(round(float(c["time"][i]) * 1000.0)), "input_length": T,
                    "output_length": int(c["response_tokens"][i]), "hash_ids": ids})  # fmt: skip
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--conversations", type=int, default=3000)
    ap.add_argument("--lam0", type=float, default=4.0, help="conversation arrivals per second")
    ap.add_argument("--block-size", type=int, default=512)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.conversations < 1 or a.lam0 <= 0 or a.block_size < 1:
        print(
            "sharegpt_mooncake_trace: --conversations, --lam0, --block-size: expected positive values", file=sys.stderr
        )
        return 2
    rs = rows(a.seed, a.conversations, a.lam0, a.block_size)
    with open(a.out, "w") as f:
        for r in rs:
            f.write(json.dumps(r) + "\n")
    print(f"{a.out}: {len(rs)} requests, seed {a.seed}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
