"""Small request sets replayed on ONE mocker worker (ai-dynamo 1.6.1, ``dynamo.replay.run_trace_replay``, default
engine timing), per request: first token, finish, reused input tokens, re-admissions. Runs in the throwaway env
of ``conformance/make_env.sh dynamo 1.6.1`` (no kvhit import) and writes the fixture of
``tests/test_engine_fleet.py`` (``tests/data/dynamo_mocker_cases.json``), which pins
:mod:`kvhit.fleet.engine_fleet` to the mocker's own engine: isolated requests (the timing polynomials), two
overlapping requests, random request sets with shared prefixes without and with preemption (seeded here; with
one worker the router's unseeded ties play no part).

Usage: ``~/.cache/kvhit-conformance/venv-dynamo-1.6.1/bin/python conformance/dynamo_mocker_cases.py OUT.json``
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile

FIELDS = ("first_token_ms", "terminal_time_ms", "reused_input_tokens", "readmission_count")


def replay(reqs, N, b=512):
    from dynamo.replay import run_trace_replay

    fd, p = tempfile.mkstemp(suffix=".jsonl")
    try:
        with os.fdopen(fd, "w") as f:
            for r in reqs:
                f.write(json.dumps(r) + "\n")
        res = run_trace_replay(
            [p],
            extra_engine_args={"engine": {"num_gpu_blocks": N, "block_size": b}},
            num_workers=1,
            router_mode="kv_router",
            trace_block_size=b,
            capture_per_request=True,
        )
    finally:
        os.unlink(p)
    # per_request is not in file order at equal arrival times: match on (arrival, input, output) — unique here
    key = {(round(r["arrival_time_ms"]), r["input_length"], r["output_length"]): r for r in res.per_request}
    t0 = reqs[0]["timestamp"]
    per = [key[(q["timestamp"] - t0, q["input_length"], q["output_length"])] for q in reqs]
    s = dict(res.summary)
    return {
        "N": N,
        "block_size": b,
        "requests": reqs,
        "per_request": [{k: r[k] for k in FIELDS} for r in per],
        "prefix_cache_reused_ratio": s["prefix_cache_reused_ratio"],
        "first_admission_prefix_cache_reused_ratio": s["first_admission_prefix_cache_reused_ratio"],
    }


def random_set(seed, n, b, gap_ms, max_out, n_roots, root_len, extra):
    rng = random.Random(seed)
    reqs, t, nxt, seen = [], 0.0, 10000, set()
    roots = [list(range(i * 100, i * 100 + rng.randint(1, root_len))) for i in range(n_roots)]
    while len(reqs) < n:
        t += rng.expovariate(1 / gap_ms)
        root = rng.choice(roots)
        ids = root[: rng.randint(0, len(root))]
        k = rng.randint(0 if ids else 1, extra)
        ids += list(range(nxt, nxt + k))
        nxt += k
        q = {
            "timestamp": int(t),
            "input_length": len(ids) * b - rng.randint(0, b - 1),
            "output_length": rng.randint(1, max_out),
            "hash_ids": ids,
        }
        if (q["timestamp"], q["input_length"], q["output_length"]) in seen:
            continue
        seen.add((q["timestamp"], q["input_length"], q["output_length"]))
        reqs.append(q)
    return reqs


def main(argv):
    cases = {
        "isolated_512_out3": replay(
            [{"timestamp": 0, "input_length": 512, "output_length": 3, "hash_ids": [0]}], 16384
        ),
        "overlap_4096_2048": replay(
            [
                {"timestamp": 0, "input_length": 4096, "output_length": 50, "hash_ids": list(range(8))},
                {"timestamp": 30, "input_length": 2048, "output_length": 5, "hash_ids": list(range(100, 104))},
            ],
            16384,
        ),
        "long_prompt_2000_blocks": replay(
            [{"timestamp": 0, "input_length": 512 * 2000, "output_length": 5, "hash_ids": list(range(2000))}], 4096
        ),
        "finished_then_alone_N64": replay(
            [
                {"timestamp": 0, "input_length": 16384, "output_length": 2, "hash_ids": list(range(32))},
                {"timestamp": 2000, "input_length": 512, "output_length": 21, "hash_ids": [999]},
            ],
            64,
        ),
        "two_decoding_N64": replay(
            [
                {"timestamp": 0, "input_length": 1000, "output_length": 21, "hash_ids": [1, 2]},
                {"timestamp": 0, "input_length": 1001, "output_length": 21, "hash_ids": [3, 4]},
            ],
            64,
        ),
        "two_prefills_one_pass": replay(
            [
                {"timestamp": 0, "input_length": 3000, "output_length": 2, "hash_ids": [1, 2, 3, 4, 5, 6]},
                {"timestamp": 0, "input_length": 3001, "output_length": 2, "hash_ids": [7, 8, 9, 10, 11, 12]},
            ],
            64,
        ),
    }
    for seed, N in ((1, 24), (2, 40), (3, 200)):
        cases[f"shared_prefixes_s{seed}_N{N}"] = replay(random_set(seed, 40, 512, 40.0, 60, 5, 12, 6), N)
    for seed, N in ((11, 16), (12, 24), (13, 40)):
        cases[f"preemption_s{seed}_N{N}"] = replay(random_set(seed, 40, 512, 30.0, 1500, 4, 6, 3), N)
    from importlib.metadata import version

    with open(argv[0], "w") as f:
        json.dump({"ai_dynamo": version("ai-dynamo"), "cases": cases}, f, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
