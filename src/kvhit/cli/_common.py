"""Shared pieces of the command line: the typer app, consoles, option types, refusal and table rendering.

Every command module imports from here; nothing here knows a command.
"""

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

from kvhit import service as svc
from kvhit.cli._root import HELP, root_callback
from kvhit.service.errors import one_line

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help=HELP,
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


app.callback()(root_callback)


def _fail(msg: str) -> None:
    err_console.print(Text.assemble(("error: ", "bold red"), one_line(msg)), highlight=False)
    raise typer.Exit(2)


def _call(
    fn: Callable[..., Any],
    model: type,
    /,
    *,
    _progress_label: str | None = None,
    _status_lines: bool = False,
    **values: Any,
) -> Any:
    """Build the request (validated), run the service function; an :class:`InputError` is one line, exit 2.

    With ``_progress_label`` a progress bar runs on stderr while the service reports progress — on a terminal
    only. ``_status_lines`` (for work that can take minutes, e.g. a cold ShareGPT tokenization) adds, where
    stderr is not a terminal, a status line at the start and at every further 10% of that work, so a piped or
    logged run is never silent for minutes."""
    try:
        req = svc.build(model, **values)
        if _progress_label is None:
            return fn(req)
        if _status_lines and not err_console.is_terminal:
            return fn(req, progress=_StatusLines(_progress_label))
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


def _print_notes(notes: list[str], style: str | None = None) -> None:
    """Each note on a line of its own: ``warning: NOT STATIONARY …`` for a window that did not reach steady state
    (:mod:`kvhit.service.steady`), ``note: …`` for the rest."""
    for n in notes:
        if n.startswith("NOT STATIONARY"):
            console.print(f"warning: {n}", markup=False)
        else:
            console.print(f"note: {n}", markup=False, style=style)


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


class _StatusLines:
    """A progress callback that writes ``label: done/total (pct%), elapsed`` lines on stderr at the start and at
    each further tenth of the work (the progress bar's stand-in where stderr is a pipe or a log file)."""

    def __init__(self, label: str) -> None:
        import time

        self.label, self.t0, self.next = label, time.perf_counter(), 0.0

    def __call__(self, done: int, total: int | None, what: str | None = None) -> None:
        import time

        if what:
            self.label = what
        if not total:
            return
        frac = done / total
        if frac + 1e-12 < self.next:
            return
        self.next = (int(frac * 10 + 1e-9) + 1) / 10
        secs = time.perf_counter() - self.t0
        err_console.print(
            f"{self.label}: {done:,}/{total:,} ({100 * frac:.0f}%), {secs:.0f} s", markup=False, highlight=False
        )


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


def _list_of(values: list[str] | None, flag: str, kind: type) -> list | None:
    """Comma-separated values of a repeated option, parsed exactly (no silent rounding)."""
    if values is None:
        return None
    out = []
    for v in values:
        if not str(v).strip(" ,"):
            _fail(f"{flag}: empty value {v!r}")
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                out.append(kind(part))
            except ValueError:
                _fail(f"{flag}: not {'an integer' if kind is int else 'a number'}: {part!r}")
    return out
