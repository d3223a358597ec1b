"""kvhit command line: a thin typer + rich front end over the library.

Every command prints a rich table by default and machine-readable JSON with ``--json``. Errors print one line
naming the file/field and exit with status 2; nothing is half-written (outputs are written atomically).
"""

from __future__ import annotations

import json
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

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Predict, simulate and plan KV-cache hit ratios for multi-turn LLM serving.")
trace_app = typer.Typer(no_args_is_help=True, help="Build and inspect traces (Parquet).")
app.add_typer(trace_app, name="trace")

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

# Exceptions that mean "bad input": one clear line, exit 2.
_USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, KeyError)


def _fail(msg: str) -> None:
    err_console.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(2)


def _run(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except typer.Exit:
        raise
    except _USER_ERRORS as e:
        _fail(str(e) if not isinstance(e, KeyError) else f"missing {e}")


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    raise TypeError(type(o).__name__)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default, allow_nan=True) + "\n")


def _fmt(x: Any, digits: int = 4) -> str:
    if isinstance(x, float | np.floating):
        if math.isnan(x):
            return "–"
        if math.isinf(x):
            return "∞"
        if x != 0 and (abs(x) >= 1e6 or abs(x) < 1e-3):
            return f"{x:.{digits}e}"
        return f"{x:,.{digits}f}"
    if isinstance(x, int | np.integer):
        return f"{int(x):,}"
    return str(x)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err_console, transient=True, disable=not err_console.is_terminal)


# ---------------------------------------------------------------------------------------------------------------
# Workload spec from flags or TOML
# ---------------------------------------------------------------------------------------------------------------

SpecOpt = Annotated[Path | None, typer.Option("--spec", help="Workload spec TOML file (see examples/).")]
Lam0Opt = Annotated[float | None, typer.Option("--lam0", help="Conversation arrival rate λ0 (conversations/s).")]
POpt = Annotated[float | None, typer.Option("--p", help="Continuation probability p (geometric turns, SCM).")]
TurnsOpt = Annotated[float | None, typer.Option("--mean-turns", help="Mean turns E[M] (geometric).")]
XOpt = Annotated[float | None, typer.Option("--x-mean", help="Mean prompt blocks per turn E[X] (geometric ≥ 1).")]
YOpt = Annotated[float | None, typer.Option("--y-mean", help="Mean response blocks per turn E[Y] (geometric ≥ 1).")]
WMeanOpt = Annotated[float | None, typer.Option("--w-mean", help="Mean prompt interarrival E[W] (s).")]
WDistOpt = Annotated[str, typer.Option("--w-dist", help="exponential | deterministic | gamma | lognormal.")]
WCvOpt = Annotated[float, typer.Option("--w-cv", help="Coefficient of variation of W (gamma, lognormal).")]


def build_spec(spec: Path | None, lam0: float | None, p: float | None, mean_turns: float | None,
               x_mean: float | None, y_mean: float | None, w_mean: float | None, w_dist: str,
               w_cv: float):
    """A WorkloadSpec from a TOML file, overridden by any flag given; or entirely from flags (the SCM)."""
    from .workload import (
        Deterministic,
        Exponential,
        GammaW,
        Geometric,
        LogNormalW,
        PromptResponse,
        SpecError,
        WorkloadSpec,
    )

    def interarrival(mean: float):
        kind = w_dist.lower()
        if kind == "exponential":
            return Exponential(mean)
        if kind == "deterministic":
            return Deterministic(mean)
        if kind == "gamma":
            return GammaW(1.0 / (w_cv * w_cv), mean)
        if kind == "lognormal":
            return LogNormalW.from_mean_cv(mean, w_cv)
        raise SpecError(f"--w-dist: unknown distribution {w_dist!r} (exponential, deterministic, gamma, lognormal)")

    if p is not None and mean_turns is not None:
        raise SpecError("give --p or --mean-turns, not both")
    turns = Geometric(p) if p is not None else Geometric.from_mean(mean_turns) if mean_turns is not None else None
    if spec is not None:
        s = WorkloadSpec.from_toml(spec)
        if lam0 is not None:
            s = s.with_lam0(lam0)
        if w_mean is not None or w_dist != "exponential":
            s = s.with_interarrival(interarrival(w_mean if w_mean is not None else s.interarrival.mean))
        if turns is not None:
            s = WorkloadSpec(s.lam0, turns, s.increments, s.interarrival, s.name)
        if x_mean is not None or y_mean is not None:
            if not isinstance(s.increments, PromptResponse):
                raise SpecError("--x-mean/--y-mean need a prompt_response increments model in the spec")
            inc = PromptResponse(Geometric.from_mean(x_mean) if x_mean else s.increments.x,
                                 Geometric.from_mean(y_mean) if y_mean else s.increments.y)
            s = WorkloadSpec(s.lam0, s.turns, inc, s.interarrival, s.name)
        return s
    missing = [n for n, v in [("--lam0", lam0), ("--p or --mean-turns", turns), ("--x-mean", x_mean),
                              ("--y-mean", y_mean), ("--w-mean", w_mean)] if v is None]
    if missing:
        raise SpecError(f"no --spec file given; missing flag(s): {', '.join(missing)}")
    return WorkloadSpec(lam0, turns, PromptResponse(Geometric.from_mean(x_mean), Geometric.from_mean(y_mean)),
                        interarrival(w_mean), name="flags")


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
    spec: SpecOpt = None, lam0: Lam0Opt = None, p: POpt = None, mean_turns: TurnsOpt = None,
    x_mean: XOpt = None, y_mean: YOpt = None, w_mean: WMeanOpt = None, w_dist: WDistOpt = "exponential",
    w_cv: WCvOpt = 1.0,
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
        tr = generate(sp, seed, n_conversations=conversations, horizon=horizon)
        tr.write(out)
        return tr

    tr = _run(go)
    info = {"out": str(out), "conversations": tr.n_conversations, "turns": tr.n_turns, "seed": seed}
    if as_json:
        _print_json(info)
    else:
        console.print(f"wrote [bold]{out}[/]: {tr.n_conversations:,} conversations, {tr.n_turns:,} turns "
                      f"(seed {seed})")


def main() -> None:  # console-script entry point
    app()


if __name__ == "__main__":
    main()
