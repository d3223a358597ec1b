"""Summarize `make live`: live/summarize.py OUT_DIR WALL_SECONDS -> OUT_DIR/results.md, OUT_DIR/results.json.

Exit 1 when a requirement fails: a fact of live/facts.py, a per-request mismatch or an unequal counter total in a
sequential replay, a negative control that does not mismatch, a concurrent replay whose counters differ from the
sums of its responses. The concurrent targets (aggregate within 0.01 at trace timing; ≤ 1 % of requests differing
and aggregate within 0.003 at 4–8 in flight, for kvhit's scheduler model) and the estimator's (±0.02) are
reported as met or missed with the measured gap, for the scheduler model and for holds (on the server's clock when
the replay had the server's log: first schedule to last token; the client's clock beside it); they do not fail the
run.
"""

import json
import sys
from pathlib import Path

RUNS = [
    ("seq-b128", "sequential, shared system prompt"),
    ("seq-b32", "sequential, heavy eviction, shared system prompt"),
    ("seq-b64-steady", "sequential, steady state, no shared prompt (estimator)"),
    ("timed-b128", "trace timing (concurrent)"),
    ("conc4-b128", "closed loop, 4 in flight, shared system prompt"),
    ("conc8-b32", "closed loop, 8 in flight, heavy eviction, shared system prompt"),
    ("control-no-null-block", "negative control: kvhit with block 0 usable (G + 1 simulated)"),
    ("control-all-m-cached", "negative control: all m generated tokens cached"),
]


def f4(x):
    return "–" if x is None else f"{x:.4f}"


def main(out: Path, wall: int) -> int:
    rows, problems, res = [], [], {"runs": {}, "facts": {}, "wall_s": wall}
    for fp in sorted(out.glob("facts-*.json")):
        d = json.loads(fp.read_text())
        res["facts"][fp.stem[6:]] = d
        for k, v in d["checks"].items():
            if not v:
                problems.append(f"fact does not hold on {fp.stem[6:]}: {k}")
    seq_req = seq_mm = 0
    conc = []
    settings = set()
    for label, what in RUNS:
        fp = out / f"{label}.json"
        if not fp.exists() or not fp.read_text().strip():
            problems.append(f"{label}: no result ({out / (label + '.err')})")
            continue
        d = json.loads(fp.read_text())
        res["runs"][label] = d
        ck = d.get("check") or {}
        c = d["counters"]
        control = label.startswith("control")
        if d.get("error"):
            problems.append(f"{label}: {d['error']}")
        if ck.get("per_request"):
            if control:
                if not ck["mismatching_requests"]:
                    problems.append(f"{label}: the negative control did not mismatch")
            else:
                seq_req += ck["requests_compared"]
                seq_mm += ck["mismatching_requests"]
                settings.add((ck["block_size"], ck["num_gpu_blocks"]))
                if ck["mismatching_requests"]:
                    problems.append(f"{label}: {ck['mismatching_requests']} per-request mismatches")
                if not c["equal_to_per_request_sums"]:
                    problems.append(f"{label}: counter deltas differ from the sums of the responses")
                if ck["simulated_hit_tokens_all"] != c["hits"]:
                    problems.append(
                        f"{label}: simulated hit tokens {ck['simulated_hit_tokens_all']} != counter {c['hits']}"
                    )
        mm = ck.get("mismatching_requests")
        cc = ck.get("concurrent")
        if cc:
            if not c["equal_to_per_request_sums"]:
                problems.append(f"{label}: counter deltas differ from the sums of the responses")
            conc.append((label, cc, ck, c.get("preemptions")))
        rows.append(
            [
                label,
                what,
                f"{ck.get('block_size')} / {ck.get('num_gpu_blocks')}",
                f"{d['completed']:,}",
                f"{int(c['queries']):,} / {int(c['hits']):,}" if c["queries"] is not None else "–",
                f4(ck.get("measured_token_hit_ratio")),
                f4(ck.get("simulated_token_hit_ratio")),
                f4(ck.get("estimated_token_hit_ratio")),
                (
                    f"{mm:,} of {ck['requests_compared']:,}"
                    + ("" if ck.get("per_request") else f" ({(cc or {}).get('model', 'holds')}; not gating)")
                    if mm is not None
                    else "–"
                ),
                "yes" if c["equal_to_per_request_sums"] else "no",
            ]
        )
    t = res["runs"].get("timed-b128", {}).get("check") or {}
    e = res["runs"].get("seq-b64-steady", {}).get("check") or {}
    est_st = (res["runs"].get("seq-b64-steady", {}).get("measured") or {}).get("stationarity") or {}
    targets = {
        "sequential requests compared (≥ 2,000)": seq_req,
        "sequential settings (≥ 3)": len(settings),
        "sequential per-request mismatches (0)": seq_mm,
        "concurrent |simulated − measured| (≤ 0.01)": t.get("simulated_minus_measured"),
        "estimator |estimated − measured| (≤ 0.02)": e.get("estimated_minus_measured"),
    }
    res["targets"] = targets
    if seq_req < 2000:
        problems.append(f"only {seq_req} sequential requests compared")
    if len(settings) < 3:
        problems.append(f"only {len(settings)} (block size, block count) settings")
    res["problems"] = problems
    cols = [
        "run",
        "what",
        "block size / num_gpu_blocks",
        "requests",
        "counter Δ queries / hits (tokens)",
        "measured",
        "kvhit simulated",
        "kvhit estimator",
        "per-request mismatches",
        "counters = Σ responses",
    ]
    md = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    md.append("")

    def gap(x, tol):
        if x is None:
            return "not measured"
        return f"{x:+.4f} ({'met' if abs(x) <= tol else 'MISSED'}: target ±{tol})"

    md.append(
        f"Sequential: {seq_req:,} requests over {len(settings)} settings, {seq_mm} per-request mismatches. "
        f"Concurrent (trace timing), simulated − measured: {gap(t.get('simulated_minus_measured'), 0.01)}. "
        "Estimator − measured (steady state: measured after a 3-lifetime warm-up, drain excluded; window "
        f"{'stationary' if est_st.get('stationary') else 'NOT stationary'}): "
        f"{gap(e.get('estimated_minus_measured'), 0.02)}. "
        f"Token hit ratios: measured = Σ cached_tokens / Σ prompt tokens (after the run's --warmup conversations). "
        f"`make live` wall time: {wall} s."
    )
    if conc:
        md += [
            "",
            "Concurrent replays, kvhit's scheduler model against holds (per request: requests whose simulated hit "
            "differs from the server's cached_tokens; aggregate: simulated − measured token hit ratio):",
            "",
            "| run | measured | scheduler: differ | scheduler: sim − meas | scheduler, client's clock: differ "
            "| scheduler, client's clock: sim − meas | holds: differ | holds: sim − meas "
            "| holds, client's clock: differ | holds, client's clock: sim − meas "
            "| preemptions server / scheduler model | scheduler clock | holds clock |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]

        def pair(x, n):
            return (
                "| – | – "
                if x is None
                else f"| {x['mismatching_requests']} of {n} | {x['simulated_minus_measured']:+.4f} "
            )

        for label, cc, ck, pre in conc:
            sc, ho = cc["scheduler"], cc["holds"]
            cl = cc.get("scheduler_client_clock")  # with --server-log: the same model on the client's clock
            hc = cc.get("holds_client_clock")  # with --server-log and the server's timings: holds on the client's
            n = sc["requests_compared"]
            md.append(
                f"| {label} | {f4(ck['measured_token_hit_ratio'])} "
                + pair(sc, n)
                + pair(cl, n)
                + pair(ho, n)
                + pair(hc, n)
                + f"| {'–' if pre is None else pre} / {sc['preemptions']} | {sc['clock']} "
                f"| {ho.get('clock', 'client (send to finish)')} |"
            )
            tol = 0.01 if label.startswith("timed") else 0.003
            for name, x in (("scheduler model", sc), ("holds", ho)):
                ok_agg = abs(x["simulated_minus_measured"]) <= tol
                ok_req = label.startswith("timed") or x["mismatching_requests"] <= 0.01 * n
                targets[
                    f"{label}: {name} (aggregate ±{tol}" + ("" if label.startswith("timed") else ", ≤ 1 %") + ")"
                ] = "met" if ok_agg and ok_req else "MISSED"
        md.append("")
        md.append(
            "Targets (reported, not gating): "
            + "; ".join(
                f"{k}: {v}" for k, v in targets.items() if k.endswith(")") and (": scheduler" in k or ": holds" in k)
            )
        )
    if problems:
        md.append("")
        md.append("FAILED: " + "; ".join(problems))
    (out / "results.md").write_text("\n".join(md) + "\n")
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    print("\n".join(md))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
