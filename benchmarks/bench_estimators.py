"""Every estimator family × the three workloads where it applies, 1,000 capacities each (issue 23 §6: ≤ 1 s).

Workloads: the stored WEKA pool (all conversations, uniform starts over 1 h, seed 0, as ``bench_band``), the
Mooncake FAST'25 conversation trace at its own timestamps, and a ShareGPT trace
(``build_sharegpt_trace(n_warm=1000, n_meas=5000, seed=0, lam0=1, Exponential(135 s), block 128)``).

Capacities: 1,000 log-spaced block counts from the largest prompt (N_min) to 4 × the distinct blocks (WEKA,
Mooncake; deduplicated by ``np.unique``, so a little under 1,000) and from 200 to 40,000 blocks (ShareGPT);
SGLang takes the same capacities in tokens (× block size). Tiers: 1,000 pairs = 20 GPU sizes (log-spaced, N_min …
U/2 blocks, U = distinct blocks) × 50 host sizes (0 … 2U blocks, linear, in tier units). Fleets: R = 4 replicas,
random routing (oblivious) and Dynamo's KV-aware router (ShareGPT, no holds), every replica at the same capacity
(ShareGPT: ``estimate_fleet_curve`` and ``estimate_fleet_kv_curve``, every capacity in one call).

Each row: the first call (numba compilation / cache loading, per-trace tables) and then a second, steady-state call
on the same inputs, wall and CPU (``time.process_time``: every thread of this process). Rows whose estimator takes
one capacity per call (``fleet-kv-per-call``: the ShareGPT KV-aware fleet estimator before its curve form, not
in the default families) time ``PER_CALL`` capacities and scale to 1,000 (marked ``×``). Skipped where the
traces are not stored.

Run alone: ``nice -n 10 python benchmarks/bench_estimators.py [--only weka mooncake sharegpt] [--families …]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("KVHIT_TRACES", ROOT.parent / "shared" / "data" / "traces"))
WEKA = TRACES / "weka_kv_cache_tester" / "traces"
MOON = TRACES / "mooncake_fast25" / "conversation_trace.jsonl"
POINTS = 1000
PER_CALL = 20
FAMILIES = (
    "agentic-vllm",
    "agentic-vllm-0.23",
    "engine-vllm",
    "sglang",
    "tiers-native",
    "tiers-lmcache",
    "tiers-simple",
    "fleet-oblivious",
    "fleet-kv",
)
#: selectable with ``--families``, not run by default: the "before" of the KV-aware fleet curve, and the KV-aware
#: curve under load (holds T / 10,000 s: the router reads in-flight load; llm-d's KV usage A/N makes its routing
#: depend on N)
#: ``tiers-simple-onedim``: simple eager by the one-displacement model, what ``kvhit tiers --blocks-trace`` runs on
#: WEKA / Mooncake (the store-time recency model of ``tiers-simple`` is for chat traces; docs/estimators.md §5.2)
EXTRA_FAMILIES = ("fleet-kv-per-call", "fleet-kv-load-dynamo", "fleet-kv-load-llm-d", "tiers-simple-onedim")


def _timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def _workloads(only):
    from kvhit.workload.dists import Exponential
    from kvhit.workload.production import read_mooncake, read_weka
    from kvhit.workload.sharegpt_trace import build_sharegpt_trace

    if "weka" in only:
        files = sorted(str(p) for p in WEKA.glob("trace_*.json"))
        if files:
            yield "weka", read_weka(files, arrival="uniform", span=3600, seed=0)
    if "mooncake" in only and MOON.exists():
        yield "mooncake", read_mooncake(MOON)
    if "sharegpt" in only:
        tr, _ = build_sharegpt_trace(
            n_warm=1000, n_meas=5000, seed=0, lam0=1.0, interarrival=Exponential(135.0), block_size=128
        )
        yield "sharegpt", tr


def _grids(name, src):
    if name == "sharegpt":
        from kvhit.sim.runner import block_requests

        rq = block_requests(src, source="counts")
        b = int(rq.block_size)
        Ns = np.unique(np.geomspace(200, 40_000, POINTS).astype(np.int64))
        U = int(np.unique(rq.hashes).size)
        n_min = int((-(-rq.prompt_tokens // b)).max())
    else:
        d = src.describe()
        b = int(src.block_size)
        Ns = np.unique(np.geomspace(d["min_N"], 4 * d["distinct_blocks"], POINTS).astype(np.int64))
        U = int(d["distinct_blocks"])
        n_min = int(d["min_N"])
    hbm = np.unique(np.geomspace(n_min, max(n_min + 1, U // 2), 20).astype(np.int64))
    host = np.unique(np.linspace(0, 2 * U, 50).astype(np.int64))
    return b, Ns, hbm, host


def _calls(name, src, fam, b, Ns, hbm, host):
    """(callable over all capacities, capacities answered, scale) or None where the family does not apply."""
    if fam.startswith("agentic-"):
        from kvhit.estimate.agentic import estimate_trace

        eng = fam.removeprefix("agentic-")
        return (lambda: estimate_trace(src, Ns, engine=eng).h), len(Ns), 1.0
    if fam == "engine-vllm":
        if name != "sharegpt":
            return None
        from kvhit.estimate.engine import estimate_engine

        return (lambda: estimate_engine(src, Ns, 1.0).h), len(Ns), 1.0
    if fam == "sglang":
        if name == "sharegpt":
            from kvhit.estimate.sglang import estimate_sglang

            return (lambda: estimate_sglang(src, Ns * b, 1.0).h), len(Ns), 1.0
        from kvhit.estimate.sglang_agentic import estimate_trace_sglang

        return (lambda: estimate_trace_sglang(src, Ns * b).h), len(Ns), 1.0
    if fam.startswith("tiers-"):
        from kvhit.estimate.tiers import estimate_tiers

        tier = fam.removeprefix("tiers-")
        kw, per = {}, 1
        if tier == "simple-onedim":
            if name == "sharegpt":
                return None
            tier, kw = "simple", {"simple_model": "onedim"}
        if tier == "lmcache":
            ct = 256 if 256 % b == 0 else b
            kw, per = {"chunk_tokens": ct}, ct // b
        units = np.maximum(host // per, 0)
        if tier == "simple":
            units = np.maximum(units, 1)
        units = np.unique(units)
        return (lambda: estimate_tiers(src, hbm, units, tier=tier, **kw).hit), len(hbm) * len(units), 1.0
    if fam.startswith("fleet-"):
        R = 4
        if name != "sharegpt":
            if fam.startswith("fleet-kv"):
                return None
            from kvhit.fleet.blocks import estimate_fleet_blocks_curve, route_oblivious

            rep = route_oblivious(src.session, "random", R, seed=0)
            return (lambda: estimate_fleet_blocks_curve(src, rep, R, Ns)[0]), len(Ns), 1.0
        from kvhit.fleet.blocks import route_oblivious
        from kvhit.fleet.estimate import estimate_fleet_kv, estimate_fleet_kv_curve

        sub = Ns[:: max(1, len(Ns) // PER_CALL)][:PER_CALL]
        scale = len(Ns) / len(sub)
        if fam == "fleet-oblivious":
            from kvhit.fleet.estimate import estimate_fleet_curve

            rep = route_oblivious(src.cols["conv"], "random", R, seed=0)
            return (lambda: estimate_fleet_curve(src, rep, R, Ns)), len(Ns), 1.0
        if fam == "fleet-kv":
            return (lambda: estimate_fleet_kv_curve(src, "dynamo", R, Ns)), len(Ns), 1.0
        if fam.startswith("fleet-kv-load-"):
            from kvhit.sim.runner import block_requests

            hold = block_requests(src, source="counts").prompt_tokens / 10_000.0
            router = fam.removeprefix("fleet-kv-load-")
            return (lambda: estimate_fleet_kv_curve(src, router, R, Ns, hold=hold)), len(Ns), 1.0
        return (lambda: [estimate_fleet_kv(src, "dynamo", [int(N)] * R) for N in sub]), len(Ns), scale
    raise ValueError(fam)


#: rows left out of ``make bench`` (``run``); empty since the simple-eager tier estimator on the whole WEKA pool went
#: from > 300 s to ≈ 30 s CPU a call (docs/benchmarks.md, branch w9-eager)
SLOW: set = set()


def run(only=("weka", "mooncake", "sharegpt"), families=FAMILIES) -> dict:
    return {"rows": measure(only, families, skip=SLOW), "skipped": sorted("/".join(x) for x in SLOW)}


def measure(
    only=("weka", "mooncake", "sharegpt"),
    families=FAMILIES,
    outputs: dict | None = None,
    verbose: bool = False,
    skip=(),
) -> list[dict]:
    rows = []
    for name, src in _workloads(only):
        b, Ns, hbm, host = _grids(name, src)
        for fam in families:
            if (name, fam) in skip:
                continue
            got = _calls(name, src, fam, b, Ns, hbm, host)
            if got is None:
                continue
            fn, n, scale = got
            load0 = os.getloadavg()[0]
            w1, c1, _ = _timed(fn)
            w2, c2, h = _timed(fn)
            if outputs is not None:
                outputs[f"{name}/{fam}"] = (
                    np.asarray(h, dtype=float)
                    if not isinstance(h, list)
                    else np.asarray([np.asarray(x, dtype=float).ravel() for x in h])
                )
            rows.append(
                {
                    "workload": name,
                    "family": fam,
                    "capacities": n,
                    "scaled": scale != 1.0,
                    "first_wall_s": w1 * scale,
                    "first_cpu_s": c1 * scale,
                    "wall_s": w2 * scale,
                    "cpu_s": c2 * scale,
                    "load": (load0, os.getloadavg()[0]),
                }
            )
            if verbose:
                print(render({"rows": rows[-1:]}).splitlines()[-1], flush=True)
    return rows


def render(res: dict) -> str:
    lines = ["| workload | estimator | capacities | first call wall / CPU s | steady wall / CPU s | ≤ 1 s | load |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in res["rows"]:
        x = " (×)" if r["scaled"] else ""
        ok = "✓" if r["cpu_s"] <= 1.0 else "✗"
        lines.append(
            f"| {r['workload']} | {r['family']} | {r['capacities']}{x} | {r['first_wall_s']:.2f} / "
            f"{r['first_cpu_s']:.2f} | {r['wall_s']:.2f} / {r['cpu_s']:.2f} | {ok} | "
            f"{r['load'][0]:.1f} → {r['load'][1]:.1f} |"
        )
    if res.get("skipped"):
        lines.append(f"skipped (slow, see docs/benchmarks.md): {', '.join(res['skipped'])}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="+", default=["weka", "mooncake", "sharegpt"])
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES + EXTRA_FAMILIES)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--save", type=Path, default=None, help="write the steady-state outputs (.npz) for before/after")
    a = ap.parse_args()
    outs: dict = {}
    res = {"rows": measure(a.only, a.families, outs, verbose=True)}
    print(render(res), flush=True)
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))
    if a.save:
        np.savez(a.save, **{k.replace("/", "__"): v for k, v in outs.items()})


if __name__ == "__main__":
    main()
