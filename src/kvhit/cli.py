"""kvhit command line: a thin typer + rich front end over the service layer (:mod:`kvhit.service`).

Each command parses its flags into the service's request object (validated there, once), calls the service
function and renders the response: a rich table, or strict JSON with ``--json`` (``null`` for undefined numbers).
Refused input — a usage error or an :class:`~kvhit.service.InputError` — is one stderr line naming the
file/flag/field, exit status 2, no traceback; outputs are checked before computing and written atomically.
Tables never truncate a number: when the columns do not fit the terminal (80 columns in a pipe), each row is
printed as a block of ``name: value`` lines instead. No domain logic lives here.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from . import __version__
from . import service as svc
from .service.errors import one_line

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Predict, simulate and plan KV-cache hit ratios for multi-turn LLM serving.",
)
trace_app = typer.Typer(no_args_is_help=True, help="Build and inspect traces (Parquet).")
app.add_typer(trace_app, name="trace")

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def _flags_read_as_flags() -> None:
    """Typer's help shows ``<bool>`` beside a flag as if it took a value; a flag takes none, so show nothing."""
    from typer.core import TyperOption

    if getattr(TyperOption, "_kvhit_flags", False):
        return
    plain = TyperOption.display_type_rich

    def display_type_rich(self, ctx):
        return None if getattr(self, "is_flag", False) else plain(self, ctx)

    TyperOption.display_type_rich = display_type_rich
    TyperOption._kvhit_flags = True


_flags_read_as_flags()


def _version(value: bool) -> None:
    if value:
        console.print(f"kvhit {__version__}", markup=False, highlight=False)
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Predict, simulate and plan KV-cache hit ratios for multi-turn LLM serving."""


def _fail(msg: str) -> None:
    err_console.print(Text.assemble(("error: ", "bold red"), one_line(msg)), highlight=False)
    raise typer.Exit(2)


def _call(fn: Callable[..., Any], model: type, /, *, _progress_label: str | None = None, **values: Any) -> Any:
    """Build the request (validated), run the service function; an :class:`InputError` is one line, exit 2."""
    try:
        req = svc.build(model, **values)
        if _progress_label is None:
            return fn(req)
        with _progress() as prog:
            task = prog.add_task(_progress_label, total=None)
            return fn(
                req,
                progress=lambda d, t, what=None: prog.update(
                    task, completed=d, total=t, **({"description": what} if what else {})
                ),
            )
    except svc.InputError as e:
        _fail(str(e))


def _help(model: type, field: str) -> str:
    """An option's help text: the request field's description (unit, range, default) — one source of truth."""
    f = model.model_fields[field]
    text = (f.description or "").rstrip(".")
    if "default" not in text.lower() and "required" not in text.lower():
        if f.is_required():
            text += "; required"
        elif f.default is None:
            text += "; default: none"
    return text + "."


def _print_json(obj: Any) -> None:
    """Strict JSON on stdout: ``null`` for undefined numbers, never NaN/Infinity."""
    if hasattr(obj, "to_jsonable"):
        obj = obj.to_jsonable()
    sys.stdout.write(svc.strict_json(obj) + "\n")


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, float | np.floating):
        if math.isnan(x):
            return "–"
        if math.isinf(x):
            return "∞"
        if x != 0 and (abs(x) >= 1e6 or abs(x) < 1e-4):
            return f"{x:.{digits}e}"
        return f"{x:,.{digits}f}"
    if isinstance(x, int | np.integer):
        return f"{int(x):,}"
    return str(x)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    )


_NUMERIC = re.compile(r"^[-+]?[\d,]*\.?\d*(e[-+]?\d+)?%?$|^[–∞]$")


def _table(title: str, columns: list[str], rows: list[list[str]], right: set[str] | None = None) -> None:
    """Print a table whose numbers are never truncated or broken: cells wrap only at spaces (a column is at least
    as wide as its longest word, and a number is one word); when even that does not fit the console (80 columns
    in a pipe), every row is printed as a block of ``column: value`` lines instead."""
    if right is None:
        right = {c for i, c in enumerate(columns) if rows and all(_NUMERIC.match(r[i]) for r in rows)}
    need = [
        max(len(w) for cell in [col, *(r[i] for r in rows)] for w in (str(cell).split() or [""]))
        for i, col in enumerate(columns)
    ]
    width = console.width
    if sum(need) + 3 * len(columns) + 1 <= width:
        t = Table(title=title)
        for i, col in enumerate(columns):
            t.add_column(col, justify="right" if col in right else "left", min_width=need[i], overflow="fold")
        for r in rows:
            t.add_row(*r)
        console.print(t)
        return
    console.print(Text(title, style="italic"))
    key_w = max(len(c) for c in columns)
    for r in rows:
        console.print(Text("─" * min(width, 40)))
        for col, val in zip(columns, r, strict=True):
            console.print(Text(f"{col:<{key_w}}  {val}"), soft_wrap=True)


def _refused(r: dict) -> str:
    return (
        f"infeasible: refuses {100 * r['refused_request_share']:.2f}% of requests, "
        f"{100 * r['refused_token_share']:.2f}% of prompt tokens"
    )


def _split(values: list[str] | None) -> list[str]:
    """``--N 1000,2275 --N 4000`` → ``["1000", "2275", "4000"]`` (syntax only; the request validates)."""
    return [part.strip() for v in values or [] for part in str(v).split(",") if part.strip()]


def _opt(model: type, field: str, *names: str, **kw: Any) -> Any:
    return typer.Option(*names, help=_help(model, field), **kw)


JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print strict JSON (null for undefined numbers) instead of tables.")
]
SF = svc.SpecFields
SpecOpt = Annotated[Path | None, _opt(SF, "spec", "--spec")]
Lam0Opt = Annotated[float | None, _opt(SF, "lam0", "--lam0")]
POpt = Annotated[float | None, _opt(SF, "p", "--p")]
TurnsOpt = Annotated[float | None, _opt(SF, "mean_turns", "--mean-turns")]
XOpt = Annotated[float | None, _opt(SF, "x_mean", "--x-mean")]
YOpt = Annotated[float | None, _opt(SF, "y_mean", "--y-mean")]
WMeanOpt = Annotated[float | None, _opt(SF, "w_mean", "--w-mean")]
WDistOpt = Annotated[str | None, _opt(SF, "w_dist", "--w-dist")]
WCvOpt = Annotated[float | None, _opt(SF, "w_cv", "--w-cv")]
NOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--N", "-N", help="Capacities N in blocks (required); integers in [1, 2^40]; repeat or comma-separate."
    ),
]
TraceOpt = Annotated[Path | None, _opt(svc.TraceOrSpecFields, "trace", "--trace")]
BT = svc.SimulateRequest
BlocksTraceOpt = Annotated[Path | None, _opt(BT, "blocks_trace", "--blocks-trace")]
ArrivalOpt = Annotated[str, _opt(BT, "arrival", "--arrival")]
RateOpt = Annotated[float | None, _opt(BT, "rate", "--rate")]
SpanOpt = Annotated[float | None, _opt(BT, "span", "--span")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed; integer ≥ 0.")]
HW = svc.KvRequest
ModelOpt = Annotated[str, _opt(HW, "model", "--model")]
AccelOpt = Annotated[str | None, _opt(HW, "accelerator", "--gpu", "--accelerator")]
KvGbOpt = Annotated[float | None, _opt(HW, "kv_gb", "--kv-gb")]
DtypeOpt = Annotated[str, _opt(HW, "dtype", "--kv-dtype")]
TpOpt = Annotated[int, _opt(HW, "tp", "--tp")]
UtilOpt = Annotated[float | None, _opt(HW, "gpu_memory_utilization", "--gpu-memory-utilization")]


def _spec_values(**kw: Any) -> dict[str, Any]:
    return kw


# ---------------------------------------------------------------------------------------------------------------
# kvhit estimate
# ---------------------------------------------------------------------------------------------------------------

ER = svc.EstimateRequest


def _print_trace_estimate(res) -> None:
    lam = "the trace's own load" if res.lam0 is None else f"a stationary stream at λ0 = {res.lam0:.4g}/s"
    console.print(
        f"{res.source} ({res.format}): {res.estimator}; {lam}; ceiling {_fmt(res.h_max)}; largest request "
        f"{res.N_min:,} blocks"
    )
    engines = list(res.rows[0].h) if res.rows else []
    t = Table(title=f"predicted hit ratio ({'vLLM token hit ratio' if res.metric == 'tokens' else 'block-weighted h'})")
    t.add_column("N (blocks)", justify="right")
    for e in engines:
        t.add_column(e, justify="right")
    t.add_column("refused (requests / tokens)", justify="right")
    for r in res.rows:
        if r.feasible:
            t.add_row(_fmt(r.N), *[_fmt(r.h[e]) for e in engines], "–")
        else:
            t.add_row(
                _fmt(r.N),
                *["–" for _ in engines],
                f"[yellow]infeasible: {100 * r.refused_request_share:.2f}% / {100 * r.refused_token_share:.2f}%[/]",
            )
    console.print(t)
    for e, reg in res.regime.items():
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
    as_json: JsonOpt = False,
) -> None:
    """Mean-field estimate from a workload spec: moments, T_C, h_max and h (base eq. (25), practical eq. (32)).

    λ0 is the physical (unscaled) arrival rate and N the capacity in blocks (threshold form, eq. (38)). With
    --engine, the engine-aware estimate (the engine's block accounting, finite capacity, tail-first partial hits,
    fluctuations; docs/estimators.md) of a sample of the spec is shown too, in both of vLLM's metrics.

    From a trace: --trace (kvhit Parquet: the engine-aware estimator) or --blocks-trace (Mooncake/WEKA block ids:
    the agentic estimator, at the trace's own load or a stationary --lam0), both vLLM orders unless --engine;
    capacities below the largest request are infeasible (refused shares, no ratio).
    """
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
    policy: Annotated[str, _opt(SR, "policy", "--policy")] = "content",
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
    as_json: JsonOpt = False,
) -> None:
    """Simulate the hit ratio: Algorithm 1 (content) or the vLLM block cache, on a trace, a spec, or a production
    block-id trace (--blocks-trace: Mooncake FAST'25 .jsonl or WEKA Claude-Code .json; both engine orders).

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
        policy=policy,
        engine=engine,
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
    if res.blocks_trace is not None:
        d = res.describe
        console.print(
            f"{res.blocks_trace}: {d['requests']:,} requests over {d['time_span_s']:,.0f} s, "
            f"{d['block_size']}-token blocks; infinite-cache ceiling: token hit ratio "
            f"{d['ideal_token_hit_ratio']:.4f}; largest request {d['min_N']:,} blocks",
            markup=False,
        )
        cols = ["N", "engine", "token hit ratio", "block-weighted h", "request hit rate"]
        rows = [
            [_fmt(r["N"]), r["engine"], _refused(r), "–", "–"]
            if not r["feasible"]
            else [
                _fmt(r["N"]),
                r["engine"],
                _fmt(r["token_hit_ratio"]),
                _fmt(r["h_blocks"]),
                _fmt(r["request_hit_rate"]),
            ]
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
    from .workload.sharegpt import PAPER_WORKLOAD

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
        _progress_label="tokenizing ShareGPT",
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


# ---------------------------------------------------------------------------------------------------------------
# kvhit demo
# ---------------------------------------------------------------------------------------------------------------

DR = svc.DemoRequest


@app.command()
def demo(
    N: Annotated[int, _opt(DR, "N", "--N")] = svc.PAPER_N,
    lam0: Annotated[float, _opt(DR, "lam0", "--lam0")] = 1.0,
    w_mean: Annotated[float, _opt(DR, "w_mean", "--w-mean")] = 135.0,
    seed: Annotated[int, typer.Option("--seed", help="Sampling and timing seed; integer ≥ 0.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """The real job: ShareGPT → Qwen3 block trace (cached), its statistics, the paper's estimate at N = 2,275
    (the paper's App. E capacity) beside the whole-content simulation and the vLLM block cache (both orders)."""
    res = _call(svc.demo, DR, _progress_label="tokenizing ShareGPT", N=N, lam0=lam0, w_mean=w_mean, seed=seed)
    if as_json:
        _print_json(res)
        return
    _print_build_report(res.report)
    _print_stats(res.stats, paper=True)
    what = " (the paper's App. E capacity: 40 GiB of Qwen3-8B KV)" if res.N_is_paper_default else ""
    e, sim = res.estimates, res.simulated
    rows = [
        ["estimate: prior", _fmt(e["prior"]), "eq. (38)–(39), F = Exp(mean w), paper block rule"],
        ["estimate: posterior", _fmt(e["posterior"]), "same, F = Exp(realized mean)"],
        ["estimate: empirical F̂", _fmt(e["empirical"]), "same, F = empirical CDF of the gaps"],
        ["estimate: engine-aware, Algorithm 1", _fmt(e["engine:content"]), "finite N + fluctuations"],
        [
            "estimate: engine-aware, vLLM ≥ 0.24",
            _fmt(e["engine:vllm"]),
            "engine block accounting, tail-first partial hits, finite N, fluctuations (docs/estimators.md)",
        ],
        ["estimate: engine-aware, vLLM ≤ 0.23", _fmt(e["engine:vllm-0.23"]), "same, older free-queue order"],
        ["simulated: Algorithm 1", _fmt(sim["content"]), "whole-content LRU, practical weight (eq. 31)"],
        [
            "simulated: vLLM ≥ 0.24",
            _fmt(sim["vllm"]),
            f"block-level prefix cache, block-weighted h (token hit ratio {_fmt(sim['vllm_token_hit_ratio'])})",
        ],
        [
            "simulated: vLLM ≤ 0.23",
            _fmt(sim["vllm-0.23"]),
            f"older free-queue order (token hit ratio {_fmt(sim['vllm-0.23_token_hit_ratio'])})",
        ],
    ]
    _table(
        f"hit ratio at N = {res.N:,} blocks{what}, λ0 = {res.lam0:g}/s, exponential W with mean {res.w_mean:g} s "
        f"(measurement window of App. E)",
        ["source", "h", "what it is"],
        rows,
        right={"h"},
    )


# ---------------------------------------------------------------------------------------------------------------
# kvhit plan / kvhit kv
# ---------------------------------------------------------------------------------------------------------------

PR = svc.PlanRequest


@app.command()
def plan(
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
    model: ModelOpt = "qwen3-8b",
    accelerator: AccelOpt = None,
    kv_gb: KvGbOpt = None,
    block_size: Annotated[int, _opt(PR, "block_size", "--block-size")] = 128,
    dtype: DtypeOpt = "bf16",
    tp: TpOpt = 1,
    util: UtilOpt = None,
    target: Annotated[float | None, _opt(PR, "target", "--target")] = None,
    engine: Annotated[str, _opt(PR, "engine", "--engine")] = "vllm",
    metric: Annotated[str | None, _opt(PR, "metric", "--metric")] = None,
    compare: Annotated[str | None, _opt(PR, "compare", "--compare")] = None,
    verify: Annotated[bool, _opt(PR, "verify", "--verify")] = False,
    blocks_trace: BlocksTraceOpt = None,
    arrival: ArrivalOpt = "sequential",
    rate: RateOpt = None,
    span: SpanOpt = None,
    seed: Annotated[
        int, typer.Option("--seed", help="WEKA arrivals and resampling: seed (replication r: seed + r).")
    ] = 0,
    scale: Annotated[float | None, _opt(PR, "scale", "--scale")] = None,
    replications: Annotated[int | None, _opt(PR, "replications", "--replications", "-r")] = None,
    conversations: Annotated[int | None, _opt(PR, "conversations", "--conversations", "-n")] = None,
    as_json: JsonOpt = False,
) -> None:
    """How much HBM, what hit ratio, how much traffic: (a) h at the KV memory available, (b) the KV memory for
    a target h, (c) the largest λ0 keeping the target, (d) prefill tokens saved per second.

    --blocks-trace plans from a Mooncake/WEKA block-id trace: at the trace's own load (exact by replay) or, with
    --lam0/--scale, at a stationary load of its conversations (exact by resample-and-simulate: Poisson starts,
    --replications runs of --conversations conversations each, 95% interval); --verify checks the estimator
    against that simulation. Capacities below the largest request are infeasible (refused shares, no ratio)."""
    res = _call(
        svc.plan,
        PR,
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
        model=model,
        accelerator=accelerator,
        kv_gb=kv_gb,
        block_size=block_size,
        dtype=dtype,
        tp=tp,
        gpu_memory_utilization=util,
        target=target,
        engine=engine,
        metric=metric,
        compare=compare,
        verify=verify,
        blocks_trace=blocks_trace,
        arrival=arrival,
        rate=rate,
        span=span,
        seed=seed,
        scale=scale,
        replications=replications,
        conversations=conversations,
    )
    if as_json:
        _print_json(res)
        return
    rows = []
    if res.capacity:
        c = res.capacity
        rows.append(
            [
                "KV capacity",
                f"{c['N']:,} blocks = {c['kv_gib']:.2f} GiB ({c['model']} on {c['accelerator']}, "
                f"{c['bytes_per_block'] / 2**20:.2f} MiB/block)",
            ]
        )
        if res.feasible is False:
            rows.append(
                [
                    "(a) hit ratio at this capacity",
                    f"infeasible: below the largest request ({res.N_min:,} blocks); refuses "
                    f"{100 * res.refused_request_share:.2f}% of requests, {100 * res.refused_token_share:.2f}% of "
                    "prompt tokens",
                ]
            )
        else:
            rows.append(["(a) hit ratio at this capacity", _fmt(res.h_at_capacity)])
    rows.append(["workload ceiling h_max", _fmt(res.h_max)])
    if res.N_min is not None:
        rows.append(["smallest feasible capacity (largest request)", f"{res.N_min:,} blocks"])
    if res.target is not None:
        need = f"{res.N_for_target:,} blocks" + (f" = {res.gib_for_target:.2f} GiB" if res.gib_for_target else "")
        rows.append([f"(b) KV memory for h = {res.target:g}", need])
        c_unanswered = any(n.startswith("(c)") for n in res.notes)  # block-id traces: see the note
        if res.capacity and res.feasible is not False and res.answered_by == "estimator" and not c_unanswered:
            lm = res.lam0_max_for_target
            rows.append([f"(c) largest λ0 keeping h ≥ {res.target:g}", "unreachable" if lm is None else f"{lm:.4g}/s"])
    if res.saved_prefill_tokens_per_s is not None:
        rows.append(
            [
                "(d) prefill tokens saved",
                f"{res.saved_prefill_tokens_per_s:,.0f} tokens/s ({100 * res.saved_fraction:.1f}% of prompt tokens)",
            ]
        )
    if res.compare and res.compare.get("h_at_capacity") is not None:
        c = res.compare
        rows.append(
            [f"vs {c['engine']} at this capacity", f"{c['h_at_capacity']:.4f} → {res.estimator} gains {c['gain']:+.4f}"]
        )
    if res.verify:
        v = res.verify
        rows.append(
            [
                f"verify: simulated {v['simulator']}",
                f"{v['h_simulated']:.4f}"
                + (f" ± {v['h_simulated_ci95']:.4f} (95%, {v['replications']} runs)" if "h_simulated_ci95" in v else "")
                + (
                    f" (estimate {v['h_predicted']:.4f}; estimate − simulation = {v['difference']:+.4f})"
                    if v.get("difference") is not None and res.answered_by == "resample"
                    else f" (prediction − simulation = {v['difference']:+.4f})"
                    if v.get("difference") is not None
                    else ""
                ),
            ]
        )
    by = {"estimator": f"predictor: {res.estimator}", "replay": "exact: trace replayed", "resample": "exact: resampled"}
    _table(
        f"kvhit plan — {res.workload}, λ0 = {res.lam0:.4g}/s, {by.get(res.answered_by, res.answered_by)} "
        f"({'vLLM token hit ratio' if res.metric == 'tokens' else 'block-weighted h'})",
        ["question", "answer"],
        rows,
    )
    for n in res.notes:
        console.print(f"note: {n}", markup=False, style="dim")


@app.command()
def kv(
    model: ModelOpt = "qwen3-8b",
    accelerator: AccelOpt = None,
    kv_gb: KvGbOpt = None,
    block_size: Annotated[int, _opt(HW, "block_size", "--block-size")] = 128,
    dtype: DtypeOpt = "bf16",
    tp: TpOpt = 1,
    util: UtilOpt = None,
    dram_gb: Annotated[float | None, _opt(HW, "dram_gb", "--dram-gb")] = None,
    blocks_per_chunk: Annotated[int, _opt(HW, "blocks_per_chunk", "--blocks-per-chunk")] = 1,
    chunk_tokens: Annotated[int, _opt(HW, "chunk_tokens", "--chunk-tokens")] = 256,
    list_presets: Annotated[bool, typer.Option("--list", help="List model and accelerator presets.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """KV bytes per token and block for a model, the block capacity N on an accelerator or a KV budget, and the
    capacity of a host (DRAM) KV tier per engine."""
    if list_presets:
        info = svc.list_presets()
        if as_json:
            _print_json(info)
        else:
            console.print("models: " + ", ".join(info["models"]), markup=False)
            console.print("accelerators: " + ", ".join(info["accelerators"]), markup=False)
        return
    res = _call(
        svc.kv,
        HW,
        model=model,
        accelerator=accelerator,
        kv_gb=kv_gb,
        block_size=block_size,
        dtype=dtype,
        tp=tp,
        gpu_memory_utilization=util,
        dram_gb=dram_gb,
        blocks_per_chunk=blocks_per_chunk,
        chunk_tokens=chunk_tokens,
    )
    if as_json:
        _print_json(res)
        return
    line = (
        f"{res.model}: {res.bytes_per_token:,} bytes/token ({res.dtype}, TP {res.tp}), "
        f"{res.bytes_per_block:,} bytes per {res.block_size}-token block"
    )
    if res.N is not None:
        line += f"; {res.accelerator}: {res.kv_gib:.2f} GiB of KV → N = {res.N:,} blocks"
    console.print(line, markup=False, highlight=False)
    if res.host_tier is not None:
        t = res.host_tier
        console.print(
            f"{t['dram_gib']:g} GiB of DRAM: vLLM native {t['native_chunks']:,} chunks of {t['native_chunk_tokens']} "
            f"tokens; SimpleCPUOffload {t['simple_cpu_blocks']:,} CPU blocks per rank; LMCache "
            f"{t['lmcache_chunks_per_rank']:,} chunks of {t['lmcache_chunk_tokens']} tokens per rank "
            f"(max_local_cpu_size {t['lmcache_max_local_cpu_size_gib']:g} GiB)",
            markup=False,
            highlight=False,
        )


# ---------------------------------------------------------------------------------------------------------------
# kvhit reproduce
# ---------------------------------------------------------------------------------------------------------------

RR = svc.ReproduceRequest


@app.command()
def reproduce(
    out: Annotated[Path, _opt(RR, "out", "--out", "-o")] = Path("out/reproduce"),
    quick: Annotated[bool, _opt(RR, "quick", "--quick")] = False,
    seeds: Annotated[int | None, _opt(RR, "seeds", "--seeds")] = None,
    jobs: Annotated[int | None, _opt(RR, "jobs", "--jobs", "-j")] = None,
    tpot: Annotated[float | None, _opt(RR, "tpot", "--tpot")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Reproduce the paper's Experiments 1–2 (App. E): Figs. 2–6, results.json and report.md in --out."""
    res = _call(
        svc.reproduce, RR, _progress_label="reproducing", out=out, quick=quick, seeds=seeds, jobs=jobs, tpot=tpot
    )
    if as_json:
        _print_json(res)
        return
    rows = []
    for c in res.checks:  # the two engine orders' block-weighted h; report.md has every actual
        if not c["paper_estimator"] or c["actual"] not in ("vllm-0.23", "vllm"):
            continue
        worst = f"{100 * c['worst']:.1f}%" if c["metric"] == "re" else f"{c['worst']:.4f}"
        rows.append(
            [
                c["bound"].replace(" for 120 ≤ μ_F ≤ 165 s", " (120–165 s)"),
                c["estimator"],
                c["actual"],
                worst,
                _fmt(c["at_x"], 2),
                "pass" if c["pass"] else "fail",
            ]
        )
    _table(
        "the paper's bounds, checked (worst point over the grid, mean over seeds)",
        ["bound", "estimator", "actual", "worst", "at", "verdict"],
        rows,
        right={"worst", "at"},
    )
    rows = []
    for c in res.checks:
        if c["paper_estimator"] or "engine target" not in c["bound"]:
            continue
        rows.append(
            [
                c["bound"].replace(" (engine target)", ""),
                c["estimator"],
                c["actual"],
                f"{c['worst']:.4f}",
                _fmt(c["at_x"], 2),
                "pass" if c["pass"] else "fail",
            ]
        )
    _table(
        "kvhit's engine-aware estimators vs the engine they predict (target: AE ≤ 0.005)",
        ["check", "estimator", "actual", "worst AE", "at", "verdict"],
        rows,
        right={"worst AE", "at"},
    )
    console.print(
        f"wrote {len(res.files)} files to {res.out} in {res.seconds['total']:.1f} s "
        f"(report: {Path(res.out) / 'report.md'})",
        markup=False,
    )


# ---------------------------------------------------------------------------------------------------------------
# kvhit curve
# ---------------------------------------------------------------------------------------------------------------

CR = svc.CurveRequest


@app.command()
def curve(
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
    conversations: Annotated[int | None, _opt(CR, "conversations", "--conversations", "-n")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Spec mode: seed; integer ≥ 0.")] = 0,
    n_min: Annotated[int, _opt(CR, "n_min", "--n-min")] = 64,
    n_max: Annotated[int | None, _opt(CR, "n_max", "--n-max")] = None,
    points: Annotated[int, _opt(CR, "points", "--points")] = 1000,
    policies: Annotated[
        str, typer.Option("--policies", help="Comma list of simulated policies: content, vllm, vllm-0.23.")
    ] = "content,vllm,vllm-0.23",
    model: Annotated[str, _opt(CR, "model", "--model")] = "qwen3-8b",
    block_size: Annotated[int | None, _opt(CR, "block_size", "--block-size")] = None,
    plot: Annotated[Path | None, _opt(CR, "plot", "--plot")] = None,
    warmup: Annotated[int | None, _opt(CR, "warmup", "--warmup")] = None,
    blocks_trace: BlocksTraceOpt = None,
    arrival: ArrivalOpt = "sequential",
    rate: RateOpt = None,
    span: SpanOpt = None,
    estimates: Annotated[bool, _opt(CR, "estimates", "--estimate/--no-estimate")] = True,
    kv_gb: Annotated[float | None, _opt(CR, "kv_gb", "--kv-gb")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Hit ratio at every capacity: exact simulated curves (one pass each) beside the estimators' curves.

    Simulated and estimated curves are block-weighted (Σ hit blocks / Σ prompt blocks); vLLM's token hit ratio
    of each simulated engine is in the --json output.
    """
    res = _call(
        svc.curve,
        CR,
        _progress_label="curve",
        estimates=estimates,
        kv_gb=kv_gb,
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
        conversations=conversations,
        seed=seed,
        n_min=n_min,
        n_max=n_max,
        points=points,
        policies=_split([policies]),
        model=model,
        block_size=block_size,
        plot=plot,
        warmup=warmup,
        blocks_trace=blocks_trace,
        arrival=arrival,
        rate=rate,
        span=span,
    )
    if as_json:
        _print_json(res)
        return
    Ns = res.N
    keys = [k for k in res.curves if not k.endswith("token ratio")]
    feas = res.feasible
    cols = ["N (blocks)", "GiB", *keys] + (["refused (requests / tokens)"] if feas is not None else [])
    rows = []
    for i in np.unique(np.linspace(0, len(Ns) - 1, 12).astype(int)):
        row = [_fmt(int(Ns[i])), f"{Ns[i] * res.bytes_per_block / 2**30:.2f}", *[_fmt(res.curves[k][i]) for k in keys]]
        if feas is not None:
            row.append(
                "–"
                if feas[i]
                else f"infeasible: {100 * res.refused_request_share[i]:.2f}% / {100 * res.refused_token_share[i]:.2f}%"
            )
        rows.append(row)
    _table(
        f"hit ratio vs KV capacity ({len(Ns):,} capacities computed; 12 shown; h_max = {_fmt(res.h_max)}; "
        f"GiB of {res.model} KV)",
        cols,
        rows,
    )
    if feas is not None and not all(feas):
        console.print(
            f"note: below N = {res.N_min:,} blocks (the largest request) vLLM cannot serve this workload: "
            "no vLLM hit ratio is reported there (shaded in the plot)",
            markup=False,
        )
    for f in res.figures:
        console.print(f"wrote {f}", markup=False)


# ---------------------------------------------------------------------------------------------------------------
# kvhit tiers
# ---------------------------------------------------------------------------------------------------------------


def _list_of(values: list[str] | None, flag: str, kind: type) -> list | None:
    """Comma-separated values of a repeated option, parsed exactly (no silent rounding)."""
    if values is None:
        return None
    out = []
    for v in values:
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                out.append(kind(part))
            except ValueError:
                _fail(f"{flag}: not {'an integer' if kind is int else 'a number'}: {part!r}")
    return out


@app.command()
def tiers(
    trace: Annotated[Path | None, typer.Option("--trace", help=_help(svc.TiersRequest, "trace"))] = None,
    blocks_trace: Annotated[
        Path | None, typer.Option("--blocks-trace", help=_help(svc.TiersRequest, "blocks_trace"))
    ] = None,
    tier: Annotated[str, typer.Option("--tier", help=_help(svc.TiersRequest, "tier"))] = "native",
    hbm_blocks: Annotated[
        list[str] | None, typer.Option("--hbm-blocks", help=_help(svc.TiersRequest, "hbm_blocks"))
    ] = None,
    dram_gb: Annotated[list[str] | None, typer.Option("--dram-gb", help=_help(svc.TiersRequest, "dram_gb"))] = None,
    host_units: Annotated[
        list[str] | None, typer.Option("--host-units", help=_help(svc.TiersRequest, "host_units"))
    ] = None,
    model: Annotated[str, typer.Option("--model", help=_help(svc.TiersRequest, "model"))] = "qwen3-8b",
    dtype: Annotated[str, typer.Option("--kv-dtype", help=_help(svc.TiersRequest, "dtype"))] = "bf16",
    tp: Annotated[int, typer.Option("--tp", help=_help(svc.TiersRequest, "tp"))] = 1,
    block_size: Annotated[int | None, typer.Option("--block-size", help=_help(svc.TiersRequest, "block_size"))] = None,
    policy: Annotated[str, typer.Option("--policy", help=_help(svc.TiersRequest, "policy"))] = "lru",
    blocks_per_chunk: Annotated[
        int, typer.Option("--blocks-per-chunk", help=_help(svc.TiersRequest, "blocks_per_chunk"))
    ] = 1,
    store_threshold: Annotated[
        int, typer.Option("--store-threshold", help=_help(svc.TiersRequest, "store_threshold"))
    ] = 0,
    chunk_tokens: Annotated[int, typer.Option("--chunk-tokens", help=_help(svc.TiersRequest, "chunk_tokens"))] = 256,
    prefill: Annotated[
        float | None, typer.Option("--prefill-tokens-per-s", help=_help(svc.TiersRequest, "prefill_tokens_per_s"))
    ] = None,
    pcie: Annotated[float, typer.Option("--pcie-gb-per-s", help=_help(svc.TiersRequest, "pcie_gb_per_s"))] = 25.0,
    target: Annotated[float | None, typer.Option("--target", help=_help(svc.TiersRequest, "target"))] = None,
    price_hbm: Annotated[
        float | None, typer.Option("--price-hbm-per-gib", help=_help(svc.TiersRequest, "price_hbm_per_gib"))
    ] = None,
    price_dram: Annotated[
        float | None, typer.Option("--price-dram-per-gib", help=_help(svc.TiersRequest, "price_dram_per_gib"))
    ] = None,
    workers: Annotated[int, typer.Option("--workers", help=_help(svc.TiersRequest, "workers"))] = 1,
    plot: Annotated[Path | None, typer.Option("--plot", help=_help(svc.TiersRequest, "plot"))] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print strict JSON instead of a table.")] = False,
) -> None:
    """Total hit ratio h(HBM, DRAM) of a trace behind a host-memory KV tier (vLLM native, simple, LMCache)."""
    res = _call(
        svc.tiers,
        svc.TiersRequest,
        trace=trace,
        blocks_trace=blocks_trace,
        tier=tier,
        hbm_blocks=_list_of(hbm_blocks, "--hbm-blocks", int),
        dram_gb=_list_of(dram_gb, "--dram-gb", float),
        host_units=_list_of(host_units, "--host-units", int),
        model=model,
        dtype=dtype,
        tp=tp,
        block_size=block_size,
        policy=policy,
        blocks_per_chunk=blocks_per_chunk,
        store_threshold=store_threshold,
        chunk_tokens=chunk_tokens,
        prefill_tokens_per_s=prefill,
        pcie_gb_per_s=pcie,
        target=target,
        price_hbm_per_gib=price_hbm,
        price_dram_per_gib=price_dram,
        workers=workers,
        plot=plot,
    )
    if as_json:
        _print_json(res)
        return
    cols = res.dram_gib if res.dram_gib is not None else res.host_units
    unit = "GiB" if res.dram_gib is not None else "units"
    console.print(f"{res.tier}: {res.requests:,} requests, block size {res.block_size}; h (GPU + host)")
    console.print("HBM blocks | GPU only | " + " | ".join(f"{c:g} {unit}" for c in cols))
    for N, hg, row in zip(res.hbm_blocks, res.h_gpu, res.h, strict=True):
        console.print(f"{N:,} | {_fmt(hg)} | " + " | ".join(_fmt(v) for v in row))
    if res.ttft_saved_s is not None:
        console.print("mean TTFT saved per request vs recompute (s)")
        for N, row in zip(res.hbm_blocks, res.ttft_saved_s, strict=True):
            console.print(f"{N:,} | " + " | ".join(_fmt(v) for v in row))
    if res.dram_for_target is not None:
        console.print(
            "DRAM reaching the target (grid): "
            + ", ".join(
                f"{N:,} blocks → {'none' if d is None else f'{d:g}'}"
                for N, d in zip(res.hbm_blocks, res.dram_for_target, strict=True)
            )
        )
    if res.cheapest is not None:
        c = res.cheapest
        console.print(
            f"cheapest split reaching the target: {c['hbm_blocks']:,} blocks ({c['hbm_gib']:.1f} GiB HBM) + "
            f"{c['dram_gib']:g} GiB DRAM, cost {c['cost']:.4g}, h = {c['h']:.4f}"
        )
    if res.figure:
        console.print("wrote " + ", ".join(res.figure))


@app.command()
def serve(
    host: Annotated[
        str, typer.Option("--host", help="Interface to bind; default 127.0.0.1 (this machine only).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port, 1–65,535 (0: any free port).")] = 8765,
    workers: Annotated[int, typer.Option("--workers", help="Job worker processes, 1–64.")] = 2,
) -> None:
    """The planner page and the JSON API (OpenAPI at /docs) over the service layer; opens nothing by itself."""
    if not 0 <= port <= 65535:
        _fail(f"--port: expected 0–65,535 (got {port})")
    if not 1 <= workers <= 64:
        _fail(f"--workers: expected 1–64 (got {workers})")
    if host in ("0.0.0.0", "::"):
        err_console.print(
            Text.assemble(
                ("warning: ", "bold yellow"),
                f"--host {host}: the planner (no authentication) is reachable from every network this machine is on",
            ),
            highlight=False,
        )
    import uvicorn

    from .web import create_app

    uvicorn.run(create_app(workers=workers, warm=True), host=host, port=port, log_level="warning")


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: every usage error and every refused input is one stderr line, exit 2."""
    from typer._click import exceptions as cx

    from .service.io import install_signal_handlers

    install_signal_handlers()
    cmd = typer.main.get_command(app)
    try:
        rv = cmd.main(args=argv, prog_name="kvhit", standalone_mode=False)
    except cx.NoArgsIsHelpError as e:
        console.print(e.format_message(), markup=False, highlight=False)
        return 0
    except cx.ClickException as e:
        err_console.print(Text.assemble(("error: ", "bold red"), one_line(e.format_message())), highlight=False)
        return e.exit_code
    except typer.Abort:
        return 1
    except typer.Exit as e:
        return e.exit_code
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
