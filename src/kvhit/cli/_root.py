"""The root of ``kvhit``: its help line and its one option (``--version``), shared by the eagerly built app
(:mod:`kvhit.cli._common`) and the lazily loading root (:mod:`kvhit.cli._lazy`). Imports nothing of the service
layer."""

from __future__ import annotations

import sys
from typing import Annotated, Any

__all__ = ["HELP", "root_callback"]

HELP = "Predict, simulate and plan KV-cache hit ratios for multi-turn LLM serving."


def _version(value: bool) -> None:
    if value:
        import typer

        from kvhit import __version__

        sys.stdout.write(f"kvhit {__version__}\n")
        raise typer.Exit(0)


def _version_option() -> Any:
    import typer

    return typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")


def root_callback(
    version: Annotated[bool, _version_option()] = False,
) -> None:
    """Predict, simulate and plan KV-cache hit ratios for multi-turn LLM serving."""
