"""Re-run the concurrent check of `kvhit replay` logs offline, with the scheduler model and with holds:
    live/recheck.py LOG.parquet [LOG.parquet …] [--step-time-from LOG.parquet] [--json OUT.json]

Per log: requests, measured ratio, and for each model (scheduler, holds) the requests whose simulated hit differs
from the server's cached_tokens and simulated − measured (aggregate token hit ratio over all requests). The
scheduler model's step time is fitted to that log's own latencies, or — with --step-time-from — to another
log's (fitted there, applied here: a check of the timing model on data it was not fitted to).
"""

import argparse
import json
import sys

import numpy as np
import pyarrow.parquet as pq

from kvhit.replay.check import compare, simulate_recorded, simulate_recorded_scheduler
from kvhit.sim.vllm.scheduler import StepTime


def load(path):
    t = pq.read_table(path)
    meta = json.loads(t.schema.metadata[b"kvhit_replay"])
    d = t.to_pydict()
    ok = np.array([s == "ok" for s in d["status"]])
    idx = np.flatnonzero(ok)
    pos = np.full(ok.size, -1, np.int64)
    pos[idx] = np.arange(idx.size)
    pv = np.asarray(d["prev_request"], np.int64)[idx]
    return {
        "path": str(path),
        "b": int(meta["server"]["block_size"]),
        "G": int(meta["server"]["num_gpu_blocks"]),
        "mode": meta["mode"],
        "prompts": [np.asarray(d["prompt_ids"][r], np.int64) for r in idx],
        "outputs": [np.asarray(d["output_ids"][r], np.int64) for r in idx],
        "t_send": np.asarray(d["t_send"], np.float64)[idx],
        "t_done": np.asarray(d["t_done"], np.float64)[idx],
        "cached": np.asarray(d["cached_tokens"], np.int64)[idx],
        "prev": np.where(pv >= 0, pos[np.maximum(pv, 0)], -1),
        "server_ms": tuple(
            np.asarray(d.get(k, [np.nan] * ok.size), np.float64)[idx]
            for k in ("server_queue_ms", "server_ttft_ms", "server_generation_ms")
        ),
    }


def check(L, step_time=None, **kw):  # noqa: D103
    T = np.array([p.shape[0] for p in L["prompts"]], np.int64)
    common = dict(block_size=L["b"], num_gpu_blocks=L["G"], t_send=L["t_send"], t_done=L["t_done"])
    kw.setdefault("server_ms", L["server_ms"])
    sched, info = simulate_recorded_scheduler(
        L["prompts"], L["outputs"], prev=L["prev"], step_time=step_time, **common, **kw
    )
    holds = simulate_recorded(L["prompts"], L["outputs"], **common)
    out = {"log": L["path"], "mode": L["mode"], "requests": int(T.size), "block_size": L["b"], "num_gpu_blocks": L["G"]}
    for name, h in (("scheduler", sched), ("holds", holds)):
        c = compare(L["cached"], h, T)
        out["measured"] = c.measured_ratio
        out[name] = {"mismatches": c.mismatches, "sim_minus_meas": c.simulated_ratio - c.measured_ratio}
    lat = L["t_done"] - L["t_send"]
    out["scheduler"].update(
        step_time=info["step_time"],
        fitted=info["step_time_fitted"],
        preemptions=info["preemptions"],
        latency_mae_ms=float(np.nanmean(np.abs(info["simulated_latency"] - lat)) * 1e3),
        latency_mean_ms=float(lat.mean() * 1e3),
    )
    return out


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--step-time-from")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    st = None
    if a.step_time_from:
        src = load(a.step_time_from)
        st = StepTime(**check(src)["scheduler"]["step_time"])
    rows = []
    for p in a.logs:
        r = check(load(p), step_time=st)
        rows.append(r)
        s, h = r["scheduler"], r["holds"]
        print(
            f"{p}: {r['mode']}, {r['requests']} requests, measured {r['measured']:.4f}; scheduler "
            f"{s['mismatches']} differ, {s['sim_minus_meas']:+.4f} ({s['preemptions']} preemptions, "
            f"latency error {s['latency_mae_ms']:.1f} of {s['latency_mean_ms']:.1f} ms); holds {h['mismatches']} "
            f"differ, {h['sim_minus_meas']:+.4f}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
