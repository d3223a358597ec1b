"""``kvhit sweep GRID.toml`` and ``kvhit sweep report DIR``: design grids over the service layer
(:mod:`kvhit.sweep`), on a local process pool or a Ray cluster, into a Parquet dataset; tables and faceted figures."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from kvhit.cli._common import JsonOpt, _fail, _fmt, _print_json, _table, app, console, err_console


def _progress_bar() -> Progress:
    # no auto-refresh thread: the local backend forks its workers, and a fork must not copy a held console lock
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
        auto_refresh=False,
        disable=not err_console.is_terminal,
    )


@app.command(no_args_is_help=True)
def sweep(
    target: Annotated[
        str,
        typer.Argument(metavar="GRID.toml | report", help="A grid file to run, or `report` followed by DIR; required."),
    ],
    directory: Annotated[
        Path | None, typer.Argument(metavar="[DIR]", help="With `report`: the sweep's result directory; default: none.")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Result directory (Parquet dataset); default: GRID's name + `_sweep`."),
    ] = None,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            max=4096,
            help="Local workers (or the CPUs of a local Ray instance); integer in [1, 4096].",
        ),
    ] = 1,
    backend: Annotated[
        str, typer.Option("--backend", help="local (process pool) | ray (Ray tasks; pip install 'kvhit\\[ray]').")
    ] = "local",
    address: Annotated[
        str | None,
        typer.Option(
            "--address", help="Ray cluster address (auto | ray://host:10001); default: start a local Ray instance."
        ),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue a sweep in --out: skip finished points, retry failed ones.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a design grid (engines × capacities × λ0 × replicas × routers × workloads × replications) through the
    service layer into a Parquet dataset, one row per point and replication; `kvhit sweep report DIR` tables and
    plots it."""
    if target == "report":
        if directory is None:
            _fail("report: missing DIR (the sweep's result directory)")
        for name, val in (("--out", out), ("--address", address)):
            if val is not None:
                _fail(f"{name}: applies to running a grid, not to `report`")
        if resume or backend != "local" or jobs != 1:
            _fail("--resume/--backend/--jobs: apply to running a grid, not to `report`")
        return _report(directory, as_json)
    if directory is not None:
        _fail(f"{directory}: unexpected second argument (only `kvhit sweep report DIR` takes one)")
    if backend not in ("local", "ray"):
        _fail(f"--backend: local or ray (got {backend!r})")
    if address is not None and backend != "ray":
        _fail("--address: applies to --backend ray")
    from kvhit.service import InputError
    from kvhit.sweep import GridError, load_grid
    from kvhit.sweep.backends import BackendError, run_sweep
    from kvhit.sweep.store import StoreError

    grid_path = Path(target)
    try:
        grid = load_grid(grid_path)
    except GridError as e:
        _fail(str(e))
    out = out if out is not None else Path(grid_path.stem + "_sweep")
    from kvhit.service.io import check_output_dir

    try:  # writable before the first point is computed (a file is created and removed to know)
        check_output_dir(out, "--out")
    except InputError as e:
        _fail(str(e))
    bar = _progress_bar()
    task = bar.add_task("sweep", total=None, failed=0)

    def progress(done: int, total: int, failed: int, what: str) -> None:
        bar.update(task, completed=done, total=total, failed=failed, description=what)
        bar.refresh()

    try:
        with bar:
            s = run_sweep(grid, out, jobs=jobs, backend=backend, address=address, resume=resume, progress=progress)
    except (StoreError, BackendError, InputError) as e:
        _fail(str(e))
    d = {
        "out": s.out,
        "backend": s.backend,
        "workers": s.workers,
        "rows": s.points,
        "skipped": s.skipped,
        "ok": s.ok,
        "refused": s.refused,
        "failed": s.failed,
        "retries": s.retries,
        "seconds": s.seconds,
        "rows_per_s": s.rows_per_s,
        "parts": s.parts,
    }
    if as_json:
        _print_json(d)
        return
    _table(
        f"kvhit sweep {grid_path.name} → {s.out}",
        ["rows", "skipped (resume)", "ok", "refused", "failed", "retries", "seconds", "rows/s"],
        [[_fmt(x) for x in (s.points, s.skipped, s.ok, s.refused, s.failed, s.retries, s.seconds, s.rows_per_s)]],
    )
    console.print(f"report: kvhit sweep report {s.out}", markup=False, highlight=False)


def _report(directory: Path, as_json: bool) -> None:
    from kvhit.sweep.report import ReportError, report

    try:
        r = report(directory)
    except ReportError as e:
        _fail(str(e))
    if as_json:
        _print_json(r)
        return
    c = r["counts"]
    _table(
        f"sweep {directory}: rows by status",
        ["ok", "refused", "failed", "points", "replications", "seconds (sum)"],
        [[_fmt(x) for x in (c["ok"], c["refused"], c["error"], c["points"], c["replications"], c["wall_s"])]],
    )
    for axis, rows in r["by_axis"].items():
        cols = [axis, "points", "mean h", "min h", "max h"]
        _table(
            f"h by {axis} (over the other axes)",
            cols,
            [[str(x["value"]), _fmt(x["points"]), _fmt(x["mean"]), _fmt(x["min"]), _fmt(x["max"])] for x in rows],
        )
    if r["errors"]:
        _table(
            "failed points (first 10)",
            ["point", "status", "error"],
            [[e["point"], e["status"], e["error"]] for e in r["errors"][:10]],
        )
    if c.get("not_stationary"):
        console.print(
            f"warning: NOT STATIONARY — {c['not_stationary']:,} of {c['points']:,} points simulated a window that did "
            "not reach steady state (points.csv column stationary; the row's extra.stationarity says why)",
            markup=False,
            highlight=False,
        )
    console.print(f"points table: {r['points_csv']}", markup=False, highlight=False)
    for f in r["figures"]:
        console.print(f"figure: {f}", markup=False, highlight=False)
