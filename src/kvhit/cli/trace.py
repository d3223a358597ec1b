"""``kvhit trace generate|stats|sharegpt``: build and inspect Parquet traces."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from kvhit.cli._common import (
    ArrivalOpt,
    JsonOpt,
    Lam0Opt,
    POpt,
    RateOpt,
    SeedOpt,
    SpanOpt,
    SpecOpt,
    TurnsOpt,
    WCvOpt,
    WDistOpt,
    WMeanOpt,
    XOpt,
    YOpt,
    _call,
    _fail,
    _fmt,
    _opt,
    _print_json,
    _table,
    console,
    svc,
    trace_app,
)

# ---------------------------------------------------------------------------------------------------------------
# kvhit trace generate / stats / sharegpt
# ---------------------------------------------------------------------------------------------------------------

GR = svc.GenerateRequest


@trace_app.command("generate")
def trace_generate(
    out: Annotated[Path, _opt(GR, "out", "--out", "-o")],
    spec: SpecOpt = None,
    lam0: Lam0Opt = None,
    p: POpt = None,
    mean_turns: TurnsOpt = None,
    x_mean: XOpt = None,
    y_mean: YOpt = None,
    w_mean: WMeanOpt = None,
    w_dist: WDistOpt = None,
    w_cv: WCvOpt = None,
    conversations: Annotated[int | None, _opt(GR, "conversations", "--conversations", "-n")] = None,
    horizon: Annotated[float | None, _opt(GR, "horizon", "--horizon")] = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Generate a synthetic multi-turn trace from a workload spec."""
    res = _call(
        svc.generate_trace,
        GR,
        _progress_label="generating",
        out=out,
        spec=spec,
        lam0=lam0,
        p=p,
        mean_turns=mean_turns,
        x_mean=x_mean,
        y_mean=y_mean,
        w_mean=w_mean,
        w_dist=w_dist,
        w_cv=w_cv,
        conversations=conversations,
        horizon=horizon,
        seed=seed,
    )
    if as_json:
        _print_json(res)
    else:
        console.print(
            f"wrote {res.out}: {res.conversations:,} conversations, {res.turns:,} turns (seed {res.seed})",
            markup=False,
        )


def _print_stats(st: Any, paper: bool) -> None:
    from kvhit.workload.sharegpt import PAPER_WORKLOAD

    st = st if isinstance(st, dict) else st.model_dump()
    cols = ["quantity", "kvhit", "± s.e."] + (["paper (App. E)"] if paper else [])
    rows = []
    for key, label in [
        ("A_R", "Â_R (eq. 35)"),
        ("A_H_hash", "Â_H^hash (eq. 36)"),
        ("E_B", "Ê[B] (eq. 37)"),
        ("E_M", "Ê[M] (eq. 37)"),
        ("Var_M", "Var M"),
        ("max_M", "max M"),
        ("n_turns", "turns"),
        ("h_max_hash", "Â_H^hash/Â_R"),
        ("mean_W", "mean interarrival (s)"),
        ("lam0_hat", "λ̂0 (1/s)"),
    ]:
        row = [label, _fmt(st[key]), _fmt(st["se"].get(key))]
        if paper:
            row.append(_fmt(PAPER_WORKLOAD[key]) if key in PAPER_WORKLOAD else "")
        rows.append(row)
    _table(f"trace statistics over {st['L']:,} conversations (block rule: {st['block']})", cols, rows)


STR = svc.StatsRequest


def _print_block_stats(st: dict) -> None:
    def dist(d: dict, digits: int = 1) -> str:
        if not d.get("count"):
            return "–"
        q = d["quantiles"]
        return (
            f"mean {_fmt(d['mean'], digits)}, median {_fmt(q['p50'], digits)}, p90 {_fmt(q['p90'], digits)}, "
            f"max {_fmt(d['max'], digits)}"
        )

    def pct(x) -> str:
        return "–" if x is None else f"{100 * x:.1f}%"

    sm, ru, sh, gp, cv, cc = (st[k] for k in ("summary", "reuse", "shared", "gaps", "conversations", "concurrency"))
    t = Table(title=f"workload statistics of {sm['source']} ({sm['block_size']}-token blocks)")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    rows = [
        ("requests / sessions", f"{sm['requests']:,} / {sm['sessions']:,}"),
        ("time span", f"{sm['time_span_s']:,.0f} s"),
        ("prompt tokens per request", dist(sm["prompt_tokens"], 0)),
        ("largest request (smallest feasible N)", f"{sm['min_N']:,} blocks"),
        (
            "infinite-cache ceiling (tokens / blocks)",
            f"{_fmt(sm['ceiling_token_hit_ratio'])} / {_fmt(sm['ceiling_block_hit_ratio'])}",
        ),
        (
            "prompt grows / shrinks / diverges vs previous",
            f"{pct(ru['grow_rate'])} / {pct(ru['shrink_rate'])} / {pct(ru['diverge_rate'])}",
        ),
        ("reused share of the previous request", dist(ru["reused_fraction_of_previous"], 3)),
        ("new blocks per request", dist(ru["new_blocks"])),
        ("requests with a cross-session shared prefix", pct(sh["request_fraction"])),
        ("shared prefix tokens / all prompt tokens", pct(sh["token_fraction"])),
        ("shared prefix length (blocks)", dist(sh["shared_prefix_blocks"])),
        ("gap W between requests of a session (s)", dist(gp)),
        ("requests per session", dist(cv["requests_per_session"])),
        ("session lifetime (s)", dist(cv["lifetime_s"], 0)),
        ("active sessions over time", dist(cc["active_sessions"])),
        ("live context of active sessions (blocks)", dist(cc["live_context_blocks"], 0)),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)


@trace_app.command("stats")
def trace_stats(
    path: Annotated[
        Path,
        typer.Argument(help="Trace: kvhit Parquet, or a Mooncake .jsonl / WEKA .json file or directory; required."),
    ],
    warmup: Annotated[int | None, _opt(STR, "warmup", "--warmup")] = None,
    block: Annotated[str, _opt(STR, "block", "--block")] = "paper",
    fig: Annotated[Path | None, _opt(STR, "fig", "--fig")] = None,
    arrival: ArrivalOpt = "sequential",
    rate: RateOpt = None,
    span: SpanOpt = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Workload statistics of a trace (eq. (35)–(37)) and the two panels of the paper's Fig. 2.

    On a production block-id trace (Mooncake, WEKA): what an estimator needs (kvhit.workload.stats) — per-request
    reusable prefix (growth, shrink, divergence), shared prefixes, gaps, conversation sizes and lifetimes,
    concurrency, the largest request and the infinite-cache ceiling — and a four-panel figure with --fig."""
    if svc.is_block_trace(path):
        if warmup is not None or block != "paper":
            _fail("--warmup/--block: apply to kvhit Parquet traces, not to a block-id trace")
        bs = _call(
            svc.block_stats, svc.BlockStatsRequest, path=path, arrival=arrival, rate=rate, span=span, seed=seed, fig=fig
        )
        if as_json:
            _print_json(bs)
            return
        _print_block_stats(bs.to_jsonable())
        for f in bs.figures:
            console.print(f"wrote {f}", markup=False)
        return
    st = _call(svc.trace_stats, STR, _progress_label="reading", path=path, warmup=warmup, block=block, fig=fig)
    if as_json:
        _print_json(st)
        return
    _print_stats(st, paper=st.source.startswith("sharegpt"))
    for f in st.figures:
        console.print(f"wrote {f}", markup=False)


def _print_build_report(rep: dict) -> None:
    r = rep["read"]
    console.print(
        f"read {r['source']}: {r['n_records']:,} complete records"
        + (
            f" (file truncated at offset {r['truncated_at']:,}; the partial last record was dropped)"
            if r["truncated"]
            else ""
        )
        + f", kept {r['n_kept']:,}, skipped {r['n_skipped']:,}",
        markup=False,
    )
    for reason, k in sorted(r["skipped"].items(), key=lambda kv: -kv[1]):
        if k:
            console.print(f"  skipped {k:>7,}  {reason}", markup=False)
    cache = "cache hit" if rep["cache"].get("hit") else "tokenized and cached"
    console.print(
        f"eligible (≥ 2 turns): {rep['n_eligible']:,}; sampled {rep['n_warm']:,} warm-up + {rep['n_meas']:,} "
        f"measured; {cache} ({rep['cache'].get('path', '')}); {rep['seconds']:.2f} s",
        markup=False,
    )


SGR = svc.ShareGPTRequest


@trace_app.command("sharegpt")
def trace_sharegpt(
    out: Annotated[Path, _opt(SGR, "out", "--out", "-o")],
    source: Annotated[Path | None, _opt(SGR, "source", "--source")] = None,
    n_warm: Annotated[int, _opt(SGR, "n_warm", "--warmup")] = 1000,
    n_meas: Annotated[int, _opt(SGR, "n_meas", "--measured")] = 5000,
    seed: Annotated[int, typer.Option("--seed", help="Sampling and timing seed; integer ≥ 0.")] = 0,
    lam0: Annotated[float, _opt(SGR, "lam0", "--lam0")] = 1.0,
    w_mean: Annotated[float, _opt(SGR, "w_mean", "--w-mean")] = 135.0,
    block_size: Annotated[int, _opt(SGR, "block_size", "--block-size")] = 128,
    token_ids: Annotated[bool, _opt(SGR, "token_ids", "--token-ids")] = False,
    strict: Annotated[bool, _opt(SGR, "strict", "--strict")] = False,
    cache_dir: Annotated[Path | None, _opt(SGR, "cache_dir", "--cache-dir")] = None,
    as_json: JsonOpt = False,
) -> None:
    """ShareGPT → Qwen3-tokenized multi-turn block trace (paper App. E), cached."""
    res = _call(
        svc.sharegpt_trace,
        SGR,
        _progress_label="tokenizing ShareGPT (conversations; cached afterwards)",
        _status_lines=True,
        out=out,
        source=source,
        n_warm=n_warm,
        n_meas=n_meas,
        seed=seed,
        lam0=lam0,
        w_mean=w_mean,
        block_size=block_size,
        token_ids=token_ids,
        strict=strict,
        cache_dir=cache_dir,
    )
    if as_json:
        _print_json(res)
        return
    _print_build_report(res.report)
    console.print(f"wrote {res.out}: {res.conversations:,} conversations, {res.turns:,} turns", markup=False)
