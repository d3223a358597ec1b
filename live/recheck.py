"""Re-run the concurrent check of `kvhit replay` logs offline, with the scheduler model and with holds:
    live/recheck.py LOG.parquet [LOG.parquet …] [--server-log SERVER.log] [--step-time-from LOG.parquet]
                    [--hold-to-deadline] [--kv-events EVENTS.jsonl [--mark-pacing forced|spread]] [--json OUT.json]

Per log: requests, measured ratio, and for each model the requests whose simulated hit differs from the server's
cached_tokens and simulated − measured (aggregate token hit ratio over all requests): the scheduler model on the
client's clock (send/finish times, the server's timings with the HTTP overhead split evenly), the scheduler model
on the server's clock (each request's "Added request" time from --server-log, or the `server_added_unix` column
the replay recorded with `kvhit replay --server-log`; absent for logs without either), and holds on the client's
clock (send to finish) and on the server's clock (`holds_server`: from the first schedule, "Added request" + the
server's queue time, to the last token, + first-token + generation times; absent without anchors or timings). With
--step-time-from, the client-clock scheduler uses a step-time line fitted to another log's latencies instead; with
--hold-to-deadline, both scheduler runs keep a request's blocks until its measured last token when the simulated
steps finish it earlier (docs/live.md: what it fixes and what it costs). With --kv-events (the server's KV-cache
events, `live/kv_events.py decode`), the scheduler model on the server's clock is also run on the step clock
(`stepclock`: steps that store a block only their request can compute end at the engine's published batch). With
--iteration-clock SERVER.log (a server started with --enable-logging-iteration-details), also on the iteration clock
(`iterclock`: every model step ends at the first engine step end logged after its start).
"""

import argparse
import json
import sys

import numpy as np
import pyarrow.parquet as pq

from kvhit.replay.check import compare, server_clock_holds, simulate_recorded, simulate_recorded_scheduler
from kvhit.replay.kvevents import KvEventsError, read_kv_events
from kvhit.replay.serverlog import ServerLogError, anchor_times, iteration_times
from kvhit.sim.vllm.scheduler import StepTime


def load(path):
    t = pq.read_table(path)
    meta = json.loads(t.schema.metadata[b"kvhit_replay"])
    t0u = meta.get("t0_unix")
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
        "t0_unix": None if t0u is None else float(t0u),
        "prompts": [np.asarray(d["prompt_ids"][r], np.int64) for r in idx],
        "outputs": [np.asarray(d["output_ids"][r], np.int64) for r in idx],
        "t_send": np.asarray(d["t_send"], np.float64)[idx],
        "t_done": np.asarray(d["t_done"], np.float64)[idx],
        "cached": np.asarray(d["cached_tokens"], np.int64)[idx],
        "prev": np.where(pv >= 0, pos[np.maximum(pv, 0)], -1),
        "response_id": d.get("response_id") and [d["response_id"][r] for r in idx],
        "added": np.asarray(d["server_added_unix"], np.float64)[idx] if "server_added_unix" in d else None,
        "server_ms": tuple(
            np.asarray(d.get(k, [np.nan] * ok.size), np.float64)[idx]
            for k in ("server_queue_ms", "server_ttft_ms", "server_generation_ms")
        ),
    }


def check(L, step_time=None, server_log=None, kv_events=None, mark_pacing="forced", iteration_log=None, **kw):  # noqa: D103
    T = np.array([p.shape[0] for p in L["prompts"]], np.int64)
    common = dict(block_size=L["b"], num_gpu_blocks=L["G"], t_send=L["t_send"], t_done=L["t_done"])
    kw.setdefault("server_ms", L["server_ms"])
    sched, info = simulate_recorded_scheduler(
        L["prompts"], L["outputs"], prev=L["prev"], step_time=step_time, **common, **kw
    )
    holds = simulate_recorded(L["prompts"], L["outputs"], **common)
    added = L["added"]
    if server_log is not None:
        if not L["response_id"]:
            sys.exit(f"recheck: {L['path']} records no response ids (a replay older than --server-log)")
        added = anchor_times(server_log, L["response_id"])
    models = [("scheduler", sched), ("holds", holds)]
    ainfo = None
    if added is not None and np.all(np.isfinite(added)):
        anch, ainfo = simulate_recorded_scheduler(
            L["prompts"], L["outputs"], prev=L["prev"], server_added=added, **common, **kw
        )
        models.append(("anchored", anch))
        if kv_events is not None:
            sc, sinfo = simulate_recorded_scheduler(
                L["prompts"],
                L["outputs"],
                prev=L["prev"],
                server_added=added,
                kv_events=read_kv_events(kv_events, L["b"]),
                mark_pacing=mark_pacing,
                **common,
                **kw,
            )
            models.append(("stepclock", sc))
        if iteration_log is not None:
            ic, iinfo = simulate_recorded_scheduler(
                L["prompts"],
                L["outputs"],
                prev=L["prev"],
                server_added=added,
                iterations=iteration_times(iteration_log),
                **common,
                **kw,
            )
            models.append(("iterclock", ic))
    span = server_clock_holds(added, kw["server_ms"])
    if span is not None:  # holds on the server's clock: first schedule to last token
        hs = simulate_recorded(
            L["prompts"], L["outputs"], block_size=L["b"], num_gpu_blocks=L["G"], t_send=span[0], t_done=span[1]
        )
        models.append(("holds_server", hs))
    out = {"log": L["path"], "mode": L["mode"], "requests": int(T.size), "block_size": L["b"], "num_gpu_blocks": L["G"]}
    for name, h in models:
        c = compare(L["cached"], h, T)
        out["measured"] = c.measured_ratio
        out[name] = {"mismatches": c.mismatches, "sim_minus_meas": c.simulated_ratio - c.measured_ratio}
    if "iterclock" in out:
        out["iterclock"]["preemptions"] = iinfo["preemptions"]
        out["iterclock"]["steps"] = iinfo["steps"]
    if "stepclock" in out:
        out["stepclock"].update(preemptions=sinfo["preemptions"], **sinfo["step_clock"])
    if ainfo is not None:
        out["anchored"]["preemptions"] = ainfo["preemptions"]
        # the way in: from the client's send to the server's "Added request" line (needs the replay's t0_unix)
        if L["t0_unix"] is not None:
            way_in = added - (L["t0_unix"] + L["t_send"])
            out["anchored"]["way_in_ms"] = {
                q: float(np.percentile(way_in, p) * 1e3) for q, p in (("p50", 50), ("p90", 90), ("max", 100))
            }
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
    ap.add_argument("--server-log", help="the server's log (--enable-log-requests, live/vllm_logging.json)")
    ap.add_argument(
        "--hold-to-deadline",
        action="store_true",
        help="the scheduler model keeps a request's blocks until its measured last token when it finishes earlier "
        "(hold_to_deadline of simulate_recorded_scheduler; a diagnostic, not the default)",
    )
    ap.add_argument("--kv-events", help="the server's KV-cache events as JSON lines (live/kv_events.py decode)")
    ap.add_argument("--mark-pacing", choices=("forced", "spread", "targets"), default="forced")
    ap.add_argument(
        "--iteration-clock",
        metavar="SERVER.log",
        help="the server's log with --enable-logging-iteration-details: every engine step's end (the iteration clock)",
    )
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    st = None
    if a.step_time_from:
        src = load(a.step_time_from)
        st = StepTime(**check(src)["scheduler"]["step_time"])
    rows = []
    for p in a.logs:
        try:
            r = check(
                load(p),
                step_time=st,
                server_log=a.server_log,
                kv_events=a.kv_events,
                mark_pacing=a.mark_pacing,
                iteration_log=a.iteration_clock,
                hold_to_deadline=a.hold_to_deadline,
            )
        except (ServerLogError, KvEventsError) as e:
            sys.exit(f"recheck: {e}")
        rows.append(r)
        s, h = r["scheduler"], r["holds"]
        an = r.get("anchored")
        anc = "no server log" if an is None else f"{an['mismatches']} differ, {an['sim_minus_meas']:+.4f}"
        if an is not None and "way_in_ms" in an:
            w = an["way_in_ms"]
            anc += f" (way in p50 {w['p50']:.0f} / p90 {w['p90']:.0f} / max {w['max']:.0f} ms)"
        hs = r.get("holds_server")
        hsc = "no server log or timings" if hs is None else f"{hs['mismatches']} differ, {hs['sim_minus_meas']:+.4f}"
        print(
            f"{p}: {r['mode']}, {r['requests']} requests, measured {r['measured']:.4f}; scheduler, client clock "
            f"{s['mismatches']} differ, {s['sim_minus_meas']:+.4f} ({s['preemptions']} preemptions, "
            f"latency error {s['latency_mae_ms']:.1f} of {s['latency_mean_ms']:.1f} ms); scheduler, server clock "
            f"{anc}; holds, client clock {h['mismatches']} differ, {h['sim_minus_meas']:+.4f}; holds, server clock "
            f"{hsc}"
            + (
                ""
                if "iterclock" not in r
                else f"; iteration clock {r['iterclock']['mismatches']} differ, "
                f"{r['iterclock']['sim_minus_meas']:+.4f} ({r['iterclock']['steps']} steps, "
                f"{r['iterclock']['preemptions']} preemptions)"
            )
            + (
                ""
                if "stepclock" not in r
                else f"; step clock {r['stepclock']['mismatches']} differ, {r['stepclock']['sim_minus_meas']:+.4f} "
                f"({r['stepclock']['marks']} marks, {r['stepclock']['marked_steps']} marked steps, "
                f"{r['stepclock']['mark_conflicts']} conflicts, {r['stepclock']['marks_before_step_start']} late, "
                f"|shift| p50 {r['stepclock']['mark_shift_ms']['p50']:.1f} / p90 "
                f"{r['stepclock']['mark_shift_ms']['p90']:.1f} ms, {r['stepclock']['preemptions']} preemptions)"
            )
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
