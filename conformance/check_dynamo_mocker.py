"""kvhit's Dynamo-router fleet against NVIDIA Dynamo's mocker (a peer check, not part of ``make conformance``).

Reads the JSON of conformance/dynamo_mocker_replay.py (the mocker's token hit ratio per cell, its runs, and the
isolated-request timing probe), replays the same Mooncake trace through
:func:`kvhit.fleet.simulate.simulate_fleet` (router ``dynamo`` with its defaults, R replicas of N blocks, vLLM
engine, prompt-only KV) over ``--seeds`` seeds, and prints per cell the mocker's mean (and run spread), kvhit's
mean (and seed spread) and the gap, for each timing mapping:

* ``instant`` — no holds (every request instantaneous; the router sees no load).
* ``prefill`` — hold = the prefill time only, the prefill tokens and blocks counted until then (the mapping
  before the per-request timing options).
* ``isolated`` — the mocker's own isolated-request timing (``probe``): prefill ``a + s·(T − hit tokens)`` ms
  (``hit_token_seconds = s``), then ``O − 1`` decode steps of the probe's ITL; prefill tokens leave the router's
  load at the end of the prefill (``prefill_hold``), blocks and active blocks at the finish.
* ``loaded`` — as ``isolated`` but the decode ITL is the mocker's mean ITL on that cell (its own output, so this
  mapping uses the mocker's run on the same trace).
* ``engine`` (row ``engine:steps``, the default ``--target``) — no holds: every replica is the step-wise vLLM
  scheduler timed as the mocker times its engine (:mod:`kvhit.fleet.engine_fleet`: passes of chunked prefill and
  decode, the mocker's polynomials, decode blocks grown token by token, LIFO preemption; the router's prefill
  tokens leave at the first token, its active blocks — distinct prompt block ids — at the finish). Its hit ratio
  is first admissions only, so it is compared with the mocker's ``first_admission_prefix_cache_reused_ratio``
  (equal to ``prefix_cache_reused_ratio`` when nothing is preempted; both are printed).

and each with the KV a request holds and caches: ``prompt`` (the prompt's blocks only) or ``output`` (also the
``O − 1`` generated tokens' blocks, as the mocker's vLLM engine grows a running request's blocks during decode;
kvhit allocates them at admission, each a fresh block id no prompt shares; the router's active blocks then count
them too, where Dynamo's default ``router_track_output_blocks = False`` does not). A row is ``mapping:kv``.

``--drop prefill_hold`` or ``--drop hit_token_seconds`` leaves that option out of the ``isolated`` and ``loaded``
mappings; ``--drop dedupe_active`` makes the ``engine`` router sum active blocks per request instead of counting
distinct ids (the ablations in docs/peers.md).

Exit status: 0 when every cell of ``--target`` is within ``--tol`` of the mocker's mean, 1 otherwise, 2 on bad
input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from kvhit.fleet.engine_fleet import simulate_engine_fleet
from kvhit.fleet.simulate import simulate_fleet
from kvhit.workload.production import read_mooncake
from kvhit.workload.production_trace import ProductionTraceError
from kvhit.workload.requests import kv_tokens

MAPPINGS = ("instant", "prefill", "isolated", "loaded", "engine")
KVS = ("prompt", "output", "steps")
ROWS = ("instant:prompt", "prefill:prompt", "isolated:prompt", "isolated:output", "loaded:output", "engine:steps")


def with_output_blocks(tr, b):
    """CSR block ids of ``kv_tokens(T, O) // b`` blocks per request: the prompt's ids, then fresh negative ids (the
    generated tokens' blocks; Mooncake ids are ≥ 0, so none is ever a hit)."""
    T = tr.prompt_tokens.astype(np.int64)
    nb = kv_tokens(T, tr.output_tokens.astype(np.int64)) // b
    off = np.zeros(T.size + 1, np.int64)
    off[1:] = np.cumsum(nb)
    hs = np.empty(int(off[-1]), np.int64)
    nxt = -1
    for r in range(T.size):
        p = tr.hashes[tr.hash_offsets[r] : tr.hash_offsets[r + 1]]
        hs[off[r] : off[r] + p.size] = p
        k = int(nb[r] - p.size)
        hs[off[r] + p.size : off[r + 1]] = np.arange(nxt, nxt - k, -1)
        nxt -= k
    return off, hs


def timing(tr, mapping, probe, cell):
    """``(hold, prefill_hold, hit_token_seconds)`` in seconds for one mapping (``None`` for ``instant``)."""
    if mapping == "instant":
        return None, None, 0.0
    a, s = probe["prefill_fit_ms"]["a"], probe["prefill_fit_ms"]["s_per_token"]
    T = tr.prompt_tokens.astype(np.float64)
    pre = (a + s * T) / 1000.0
    if mapping == "prefill":
        return pre, None, 0.0
    itl = probe["itl_ms"] if mapping == "isolated" else float(np.mean([r["mean_itl_ms"] for r in cell["runs"]]))
    dec = np.maximum(tr.output_tokens.astype(np.float64) - 1.0, 0.0) * itl / 1000.0
    return pre + dec, pre, s / 1000.0


def run_cell(tr, cell, mapping, kv, probe, seeds, b, out_blocks, drop=()):
    if mapping == "engine":
        return [
            simulate_engine_fleet(tr.prompt_tokens, tr.output_tokens, tr.hash_offsets, tr.hashes, tr.time,
                                  Ns=[cell["N"]] * cell["R"], block_size=b, seed=sd,
                                  dedupe_active="dedupe_active" not in drop).token_hit_ratio()
            for sd in seeds
        ]  # fmt: skip
    hold, ph, hts = timing(tr, mapping, probe, cell)
    if "prefill_hold" in drop:
        ph = None
    if "hit_token_seconds" in drop:
        hts = 0.0
    off, hs = out_blocks if kv == "output" else (tr.hash_offsets, tr.hashes)
    extra = dict(colocated=True, response_tokens=tr.output_tokens) if kv == "output" else {}
    hits = []
    for sd in seeds:
        res = simulate_fleet(
            tr.prompt_tokens, off, hs, tr.session, Ns=[cell["N"]] * cell["R"], block_size=b, router="dynamo",
            times=tr.time, hold=hold, prefill_hold=ph, hit_token_seconds=hts, seed=sd, **extra,
        )  # fmt: skip
        hits.append(res.token_hit_ratio())
    return hits


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mocker-json", required=True)
    ap.add_argument("--trace", help="default: the trace the mocker ran")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rows", nargs="+", default=list(ROWS), help="mapping:kv, e.g. isolated:output")
    ap.add_argument("--target", default="engine:steps")
    ap.add_argument("--tol", type=float, default=0.005)
    ap.add_argument("--drop", nargs="+", default=[], choices=["prefill_hold", "hit_token_seconds", "dedupe_active"])
    ap.add_argument("--json", help="write the table as JSON here")
    a = ap.parse_args(argv)
    bad = [x for x in a.rows + [a.target] if x.count(":") != 1 or x.split(":")[0] not in MAPPINGS
           or x.split(":")[1] not in KVS or (x.split(":")[0] == "engine") != (x.split(":")[1] == "steps")]  # fmt: skip
    if bad:
        print(f"check_dynamo_mocker: --rows/--target: expected mapping:kv with mapping one of {', '.join(MAPPINGS)} "
              f"and kv one of {', '.join(KVS)} (engine:steps together), got {bad[0]!r}", file=sys.stderr)  # fmt: skip
        return 2
    if a.target not in a.rows:
        a.rows.append(a.target)
    if a.seeds < 1:
        print("check_dynamo_mocker: --seeds: expected an integer >= 1", file=sys.stderr)
        return 2
    try:
        m = json.loads(Path(a.mocker_json).read_text())
    except (OSError, ValueError) as e:
        print(f"check_dynamo_mocker: --mocker-json: cannot read {a.mocker_json}: {e}", file=sys.stderr)
        return 2
    if "probe" not in m and any(not x.startswith(("instant:", "engine:")) for x in a.rows):
        print(
            "check_dynamo_mocker: --mocker-json: no 'probe' (run dynamo_mocker_replay.py with --probe)", file=sys.stderr
        )
        return 2
    b = int(m["block_size"])
    try:
        tr = read_mooncake(a.trace or m["trace"], block_size=b)
    except ProductionTraceError as e:
        print(f"check_dynamo_mocker: --trace: {e}", file=sys.stderr)
        return 2
    seeds = list(range(a.seeds))
    out_blocks = with_output_blocks(tr, b) if any(x.endswith(":output") for x in a.rows) else None
    rows, ok = [], True
    print(f"trace {Path(a.trace or m['trace']).name}: {tr.n_requests} requests, b = {b}; ai-dynamo {m['ai_dynamo']}; "
          f"kvhit seeds {seeds}" + (f"; dropped: {', '.join(a.drop)}" if a.drop else ""))  # fmt: skip
    print(f"{'row':16} {'R':>2} {'N':>6} {'mocker':>7} {'m.spread':>8} {'kvhit':>7} {'k.spread':>8} {'gap':>8}")
    for row in a.rows:
        mapping, kv = row.split(":")
        for cell in m["cells"]:
            hits = run_cell(tr, cell, mapping, kv, m.get("probe"), seeds, b, out_blocks, a.drop)
            mruns = [r["hit"] for r in cell["runs"]]
            if mapping == "engine" and all("hit_first_admission" in r for r in cell["runs"]):
                mruns = [r["hit_first_admission"] for r in cell["runs"]]
            mk, kh = float(np.mean(mruns)), float(np.mean(hits))
            gap = kh - mk
            rows.append({"row": row, "R": cell["R"], "N": cell["N"], "mocker": mk, "mocker_runs": mruns,
                         "mocker_all_admissions": cell["mean_hit"], "kvhit": kh, "kvhit_seeds": hits,
                         "gap": gap})  # fmt: skip
            if row == a.target and abs(gap) > a.tol:
                ok = False
            both = f"   (mocker, all admissions: {cell['mean_hit']:.4f})" if abs(mk - cell["mean_hit"]) > 1e-12 else ""
            print(f"{row:16} {cell['R']:>2} {cell['N']:>6} {mk:7.4f} {max(mruns) - min(mruns):8.4f} {kh:7.4f} "
                  f"{max(hits) - min(hits):8.4f} {gap:+8.4f}{both}")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps({"mocker": m, "rows": rows}, indent=1))
    worst = max((abs(r["gap"]) for r in rows if r["row"] == a.target), default=float("nan"))
    print(f"{a.target}: worst |gap| {worst:.4f} (tolerance {a.tol}): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
