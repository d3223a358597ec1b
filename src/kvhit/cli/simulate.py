"""``kvhit simulate``: exact simulation at given capacities (content LRU, block engines, traces)."""

from __future__ import annotations

from typing import Annotated

import typer

from kvhit.cli._common import (
    ArrivalOpt,
    BlocksTraceOpt,
    JsonOpt,
    Lam0Opt,
    NOpt,
    POpt,
    RateOpt,
    SpanOpt,
    SpecOpt,
    TraceOpt,
    TurnsOpt,
    WCvOpt,
    WDistOpt,
    WMeanOpt,
    XOpt,
    YOpt,
    _call,
    _fmt,
    _opt,
    _print_json,
    _refused,
    _split,
    _table,
    app,
    console,
    svc,
)

# ---------------------------------------------------------------------------------------------------------------
# kvhit simulate
# ---------------------------------------------------------------------------------------------------------------

SR = svc.SimulateRequest


@app.command()
def simulate(
    N: NOpt = None,
    trace: TraceOpt = None,
    spec: SpecOpt = None,
    lam0: Lam0Opt = None,
    p: POpt = None,
    mean_turns: TurnsOpt = None,
    x_mean: XOpt = None,
    y_mean: YOpt = None,
    w_mean: WMeanOpt = None,
    w_dist: WDistOpt = None,
    w_cv: WCvOpt = None,
    policy: Annotated[str | None, _opt(SR, "policy", "--policy")] = None,
    engine: Annotated[str, _opt(SR, "engine", "--engine")] = "vllm",
    weighting: Annotated[str | None, _opt(SR, "weighting", "--weighting")] = None,
    colocated: Annotated[bool, _opt(SR, "colocated", "--colocated")] = False,
    block_size: Annotated[int | None, _opt(SR, "block_size", "--block-size")] = None,
    conversations: Annotated[int | None, _opt(SR, "conversations", "--conversations", "-n")] = None,
    warmup: Annotated[int | None, _opt(SR, "warmup", "--warmup")] = None,
    warmup_time: Annotated[float | None, _opt(SR, "warmup_time", "--warmup-time")] = None,
    replications: Annotated[int | None, _opt(SR, "replications", "--replications", "-r")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Base seed (replication r uses seed + r); integer ≥ 0.")] = 0,
    blocks_trace: BlocksTraceOpt = None,
    arrival: ArrivalOpt = "sequential",
    rate: RateOpt = None,
    span: SpanOpt = None,
    estimates: Annotated[bool, _opt(SR, "estimates", "--estimate/--no-estimate")] = True,
    page_size: Annotated[int | None, _opt(SR, "page_size", "--page-size")] = None,
    evict_policy: Annotated[str | None, _opt(SR, "evict_policy", "--evict-policy")] = None,
    sglang_cache: Annotated[str | None, _opt(SR, "sglang_cache", "--sglang-cache")] = None,
    tlru_threshold: Annotated[int | None, _opt(SR, "tlru_threshold", "--tlru-threshold")] = None,
    prefill_tokens_per_s: Annotated[float | None, _opt(SR, "prefill_tokens_per_s", "--prefill-tokens-per-s")] = None,
    decode_tokens_per_s: Annotated[float | None, _opt(SR, "decode_tokens_per_s", "--decode-tokens-per-s")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Simulate the hit ratio: Algorithm 1 (content) or the vLLM block cache, on a trace, a spec, or a production
    block-id trace (--blocks-trace: Mooncake FAST'25 .jsonl or WEKA Claude-Code .json; both engine orders).
    --engine sglang: SGLang 0.5.23's radix cache, --N in tokens (its KV pool), token hit ratio, optional
    in-flight holds (--prefill-tokens-per-s, --decode-tokens-per-s).

    On a spec, each replication generates a fresh trace (seed + r) and the 95% interval is over replications;
    on a trace file the interval is from batch means. The mean-field estimate is shown beside it.
    """
    res = _call(
        svc.simulate,
        SR,
        _progress_label="simulating",
        estimates=estimates,
        N=_split(N),
        trace=trace,
        spec=spec,
        lam0=lam0,
        p=p,
        mean_turns=mean_turns,
        x_mean=x_mean,
        y_mean=y_mean,
        w_mean=w_mean,
        w_dist=w_dist,
        w_cv=w_cv,
        **({"policy": policy} if policy is not None else {}),
        engine=engine,
        page_size=page_size,
        evict_policy=evict_policy,
        sglang_cache=sglang_cache,
        tlru_threshold=tlru_threshold,
        prefill_tokens_per_s=prefill_tokens_per_s,
        decode_tokens_per_s=decode_tokens_per_s,
        weighting=weighting,
        colocated=colocated,
        block_size=block_size,
        conversations=conversations,
        warmup=warmup,
        warmup_time=warmup_time,
        replications=replications,
        seed=seed,
        blocks_trace=blocks_trace,
        arrival=arrival,
        rate=rate,
        span=span,
    )
    if as_json:
        _print_json(res)
        return
    if res.policy == "sglang":
        _print_sglang(res)
        return
    if res.blocks_trace is not None:
        d = res.describe
        console.print(
            f"{res.blocks_trace}: {d['requests']:,} requests over {d['time_span_s']:,.0f} s, "
            f"{d['block_size']}-token blocks; infinite-cache ceiling: token hit ratio "
            f"{d['ideal_token_hit_ratio']:.4f}; largest request {d['min_N']:,} blocks",
            markup=False,
        )
        est = {(e["engine"], e["N"]): e for e in res.estimate}
        lvl = next((e["level"] for e in res.estimate if e.get("level")), None)
        cols = ["N", "engine", "token hit ratio", "block-weighted h", "request hit rate"] + (
            ["estimate", f"{lvl:.0%} band" if lvl else "band"] if est else []
        )

        def _band(e: dict | None) -> list[str]:
            if not est:
                return []
            if not e or e.get("h") is None:
                return ["–", "–"]
            b = f"{e['h_lo']:.3f}–{e['h_hi']:.3f}" if e.get("h_lo") is not None else "–"
            return [f"{e['h']:.4f}" + ("" if e.get("validated") else " *"), b]

        rows = [
            [_fmt(r["N"]), r["engine"], _refused(r), "–", "–"] + _band(None)
            if not r["feasible"]
            else [
                _fmt(r["N"]),
                r["engine"],
                _fmt(r["token_hit_ratio"]),
                _fmt(r["h_blocks"]),
                _fmt(r["request_hit_rate"]),
            ]
            + _band(est.get((r["engine"], r["N"])))
            for r in res.rows
        ]
        _table(
            "vLLM prefix cache on a production trace (token hit ratio = vLLM's prefix_cache_hits/queries)", cols, rows
        )
        if any(not r["feasible"] for r in res.rows):
            console.print(
                f"note: below N = {d['min_N']:,} blocks (the largest request) vLLM cannot serve this workload "
                "(it refuses to start when max_model_len exceeds the KV cache); no hit ratio is reported there",
                markup=False,
            )
        if any(not e.get("validated") for e in res.estimate):
            console.print("* outside the estimator's validated region (see the notes)", markup=False)
        for n in res.notes:
            console.print(f"note: {n}", markup=False)
        return
    title = f"simulated hit ratio — policy {res.policy}" + (f", engine {engine}" if res.policy == "block" else "")
    cols = ["N", "h (sim)", "± 95%", "request hit rate", "paper estimate (eq. 39)", "engine-aware estimate"]
    est = {e["N"]: e for e in res.estimate}
    rows = []
    for row in res.rows:
        e = est.get(row["N"], {})
        if not row.get("feasible", True):
            rows.append([_fmt(row["N"]), _refused(row), "–", "–", "–", "–"])
            continue
        rows.append(
            [
                _fmt(row["N"]),
                _fmt(row["h"]),
                _fmt(row["h_ci95"]),
                _fmt(row["request_hit_rate"]),
                _fmt(e.get("h")),
                _fmt(e.get("h_engine")),
            ]
        )
    _table(title, cols, rows)
    for n in res.notes:
        console.print(f"warning: {n}" if n.startswith("NOT STATIONARY") else f"note: {n}", markup=False)


def _print_sglang(res) -> None:
    """The rows of ``--engine sglang`` (N in tokens, token hit ratio)."""
    if res.blocks_trace is not None:
        d = res.describe
        console.print(
            f"{res.blocks_trace}: {d['requests']:,} requests over {d['time_span_s']:,.0f} s, "
            f"{d['block_size']}-token blocks; infinite-cache ceiling (vLLM blocks): token hit ratio "
            f"{d['ideal_token_hit_ratio']:.4f}",
            markup=False,
        )
    holds = any(r.get("mean_wait") is not None for r in res.rows)
    cols = ["N (tokens)", "token hit ratio", "± 95%", "request hit rate", "evicted tokens"] + (
        ["mean wait (s)"] if holds else []
    )
    rows = []
    for r in res.rows:
        if not r["feasible"]:
            rows.append([_fmt(r["N"]), _refused(r), "–", "–", "–"] + (["–"] if holds else []))
            continue
        rows.append(
            [
                _fmt(r["N"]),
                _fmt(r["h"]),
                _fmt(r["h_ci95"]),
                _fmt(r["request_hit_rate"]),
                _fmt(r.get("evicted_tokens")),
            ]
            + ([_fmt(r.get("mean_wait"))] if holds else [])
        )
    r0 = res.rows[0]
    _table(f"SGLang radix cache (page size {r0['page_size']}, {r0['evict_policy']})", cols, rows)
    if any(not r["feasible"] for r in res.rows):
        console.print(
            f"note: below N = {res.N_min:,} tokens (the largest request, pages rounded up) SGLang rejects a request; "
            "no hit ratio is reported there",
            markup=False,
        )
    for n in res.notes:
        console.print(f"note: {n}", markup=False)
