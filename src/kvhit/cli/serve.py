"""``kvhit serve``: the planner page and the JSON API."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from kvhit.cli._common import (
    _fail,
    app,
    console,
    err_console,
)


@app.command()
def serve(
    host: Annotated[
        str, typer.Option("--host", help="Interface to bind; default 127.0.0.1 (this machine only).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port, 1–65,535 (0: any free port).")] = 8765,
    workers: Annotated[int, typer.Option("--workers", help="Job worker processes, 1–64.")] = 2,
    api_workers: Annotated[
        int | None,
        typer.Option(
            "--api-workers",
            help="Processes answering the synchronous API (estimate, kv, plan's closed form) in parallel, 0–64; "
            "0: this process's threads; default: min(4, CPU cores).",
        ),
    ] = None,
) -> None:
    """The planner page and the JSON API (OpenAPI at /docs) over the service layer; opens nothing by itself."""
    if not 0 <= port <= 65535:
        _fail(f"--port: expected 0–65,535 (got {port})")
    if not 1 <= workers <= 64:
        _fail(f"--workers: expected 1–64 (got {workers})")
    if api_workers is None:
        import os

        api_workers = min(4, os.cpu_count() or 1)
    if not 0 <= api_workers <= 64:
        _fail(f"--api-workers: expected 0–64 (got {api_workers})")
    if host in ("0.0.0.0", "::"):
        err_console.print(
            Text.assemble(
                ("warning: ", "bold yellow"),
                f"--host {host}: the planner (no authentication) is reachable from every network this machine is on",
            ),
            highlight=False,
        )
    import uvicorn

    from kvhit.web import create_app

    shown = f"[{host}]" if ":" in host else host
    where = f"http://{shown}:{port}/" if port else f"http://{shown}:<a free port chosen at start>/"
    console.print(f"kvhit planner: {where}  (API docs: {where}docs; Ctrl-C stops)", markup=False, highlight=False)
    from kvhit.workload.cache import resolve_cache_dir

    persist = resolve_cache_dir() / "web-answers"
    try:
        persist.mkdir(parents=True, exist_ok=True)
    except OSError:
        persist = None  # a read-only home: answers are kept in memory only
    app = create_app(workers=workers, warm=True, persist=persist, api_workers=api_workers)
    uvicorn.run(app, host=host, port=port, log_level="warning")
