"""``kvhit estimate``: the estimators (eq. 35–39 and the engine-aware successors) over N and λ0."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from rich.table import Table

from kvhit.cli._common import (
    ArrivalOpt,
    BlocksTraceOpt,
    JsonOpt,
    Lam0Opt,
    NOpt,
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
    _split,
    _table,
    app,
    console,
    svc,
)

# ---------------------------------------------------------------------------------------------------------------
# kvhit estimate
# ---------------------------------------------------------------------------------------------------------------

ER = svc.EstimateRequest


def _print_trace_estimate(res) -> None:
    lam = "the trace's own load" if res.lam0 is None else f"a stationary stream at λ0 = {res.lam0:.4g}/s"
    console.print(
        f"{res.source} ({res.format}): {res.estimator}; {lam}; ceiling {_fmt(res.h_max)}; largest request "
        f"{res.N_min:,} {res.unit}"
    )
    engines = list(res.rows[0].h) if res.rows else []
    what = "vLLM token hit ratio" if res.metric == "tokens" else "block-weighted h"
    if res.unit == "tokens":
        what = "SGLang token hit ratio"
    t = Table(title=f"predicted hit ratio ({what})")
    t.add_column(f"N ({res.unit})", justify="right")
    banded = [e for e in engines if any(r.h_lo.get(e) is not None for r in res.rows)]
    expected = [e for e in engines if any(r.h_exp.get(e) is not None for r in res.rows)]
    for e in engines:
        t.add_column(e, justify="right")
        if e in banded:
            label = "error band (stationary)" if res.level is None else f"{res.level:.0%} band"
            t.add_column(f"{e} {label}", justify="right", overflow="fold")
        if e in expected:
            t.add_column(f"{e} expected (replays ± se)", justify="right", overflow="fold")

    def cells(r) -> list[str]:
        out = []
        for e in engines:
            out.append(_fmt(r.h[e]))
            if e in banded:
                lo, hi = r.h_lo.get(e), r.h_hi.get(e)
                out.append("–" if lo is None else f"{lo:.4f}–{hi:.4f}")
            if e in expected:
                x, xs = r.h_exp.get(e), r.h_exp_se.get(e)
                out.append("–" if x is None else f"{x:.4f} ± {xs:.4f}")
        return out

    t.add_column("refused (requests / tokens)", justify="right")
    for r in res.rows:
        if r.feasible:
            t.add_row(_fmt(r.N), *cells(r), "–")
        else:
            t.add_row(
                _fmt(r.N),
                *["–" for _ in range(len(engines) + len(banded) + len(expected))],
                f"[yellow]infeasible: {100 * r.refused_request_share:.2f}% / {100 * r.refused_token_share:.2f}%[/]",
            )
    console.print(t)
    for e, reg in res.regime.items():
        if res.lam0 is not None and reg.get("validated", False):
            console.print(f"note: {e}: {'; '.join(n for n in reg['notes'] if not n.startswith('info:'))}")
        if not reg.get("validated", True):
            console.print(f"[yellow]note: {e}: outside the estimator's validated regime: {'; '.join(reg['notes'])}[/]")


@app.command()
def estimate(
    N: NOpt = None,
    spec: SpecOpt = None,
    lam0: Lam0Opt = None,
    p: POpt = None,
    mean_turns: TurnsOpt = None,
    x_mean: XOpt = None,
    y_mean: YOpt = None,
    w_mean: WMeanOpt = None,
    w_dist: WDistOpt = None,
    w_cv: WCvOpt = None,
    engine: Annotated[str | None, _opt(ER, "engine", "--engine")] = None,
    sample: Annotated[int, _opt(ER, "sample", "--sample")] = 20_000,
    seed: SeedOpt = 0,
    trace: Annotated[Path | None, _opt(svc.TraceEstimateRequest, "trace", "--trace")] = None,
    blocks_trace: BlocksTraceOpt = None,
    arrival: ArrivalOpt = "sequential",
    rate: RateOpt = None,
    span: SpanOpt = None,
    metric: Annotated[str, _opt(svc.TraceEstimateRequest, "metric", "--metric")] = "tokens",
    page_size: Annotated[int | None, _opt(svc.TraceEstimateRequest, "page_size", "--page-size")] = None,
    replays: Annotated[int | None, _opt(svc.TraceEstimateRequest, "replays", "--replays")] = None,
    expected_se: Annotated[float | None, _opt(svc.TraceEstimateRequest, "expected_se", "--expected-se")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Mean-field estimate from a workload spec: moments, T_C, h_max and h (base eq. (25), practical eq. (32)).

    λ0 is the physical (unscaled) arrival rate and N the capacity in blocks (threshold form, eq. (38)). With
    --engine, the engine-aware estimate (the engine's block accounting, finite capacity, tail-first partial hits,
    fluctuations; docs/estimators.md) of a sample of the spec is shown too, in both of vLLM's metrics; --engine sglang
    gives SGLang's radix cache at the same KV memory (N·128 tokens; its token hit ratio).

    From a trace: --trace (kvhit Parquet: the engine-aware estimator) or --blocks-trace (Mooncake/WEKA block ids:
    the agentic estimator, at the trace's own load or a stationary --lam0), both vLLM orders unless --engine;
    --engine sglang: SGLang's estimators (both sources), --N in tokens (docs/estimators.md §7); with
    --blocks-trace, --replays K adds the band of K exact SGLang replays at redrawn start times (and their mean);
    capacities below the largest request are infeasible (refused shares, no ratio).
    """
    if trace is None and blocks_trace is None and page_size is not None:
        _fail("--page-size: applies to --trace/--blocks-trace with --engine sglang")
    if blocks_trace is None and replays is not None:
        _fail("--replays: applies to --blocks-trace with --engine sglang")
    if blocks_trace is None and expected_se is not None:
        _fail("--expected-se: applies to --blocks-trace")
    if trace is not None or blocks_trace is not None:
        if spec is not None or any(v is not None for v in (p, mean_turns, x_mean, y_mean, w_mean, w_dist, w_cv)):
            _fail("--trace/--blocks-trace: not with --spec or spec flags (the trace is the workload)")
        res = _call(
            svc.trace_estimate,
            svc.TraceEstimateRequest,
            N=_split(N),
            trace=trace,
            blocks_trace=blocks_trace,
            arrival=arrival,
            rate=rate,
            span=span,
            seed=seed,
            engine=engine,
            metric=metric,
            lam0=lam0,
            page_size=page_size,
            replays=replays,
            expected_se=expected_se,
        )
        if as_json:
            _print_json(res)
            return
        _print_trace_estimate(res)
        return
    res = _call(
        svc.estimate,
        ER,
        N=_split(N),
        spec=spec,
        lam0=lam0,
        p=p,
        mean_turns=mean_turns,
        x_mean=x_mean,
        y_mean=y_mean,
        w_mean=w_mean,
        w_dist=w_dist,
        w_cv=w_cv,
        engine=engine,
        sample=sample,
        seed=seed,
    )
    if as_json:
        _print_json(res)
        return
    m = res.moments
    rows = [
        [key, _fmt(m[key]), meaning]
        for key, meaning in [
            ("A_R", "E[Σ_{j≤M} R_j], eq. (9)"),
            ("A_H", "E[Σ_{j<M} R_j], eq. (10)"),
            ("A_H_hash", "A_H − E[M−1], eq. (28)"),
            ("E_B", "E[B] = E[R_M], eq. (1)"),
            ("E_M", "E[M]"),
            ("Var_M", "Var M"),
            ("h_max", "A_H/A_R, eq. (11)"),
            ("h_max_hash", "A_H_hash/A_R (practical ceiling)"),
        ]
    ]
    _table("workload moments (paper App. B.3, C.2)", ["quantity", "value", "meaning"], rows, right={"value"})
    cols = ["N (blocks)", "T_C (s)", "h base (eq. 25)", "T_C prac (s)", "h practical (eq. 32/39)"]
    if res.engine:
        cols += [f"h {res.engine} (blocks)", f"h {res.engine} (tokens)"]
    rows = []
    for e in res.estimates:
        row = [_fmt(e.N), _fmt(e.T_C, 2), _fmt(e.h_base), _fmt(e.T_C_prac, 2), _fmt(e.h_prac)]
        if res.engine:
            row += [_fmt(e.h_engine_blocks), _fmt(e.h_engine_tokens)]
        rows.append(row)
    _table(f"mean-field estimate, λ0 = {res.spec['lam0']:g}/s", cols, rows)
