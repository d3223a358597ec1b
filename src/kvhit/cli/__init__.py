"""kvhit command line: a thin typer + rich front end over the service layer (:mod:`kvhit.service`).

Each command parses its flags into the service's request object (validated there, once), calls the service
function and renders the response: a rich table, or strict JSON with ``--json`` (``null`` for undefined numbers).
Refused input — a usage error or an :class:`~kvhit.service.InputError` — is one stderr line naming the
file/flag/field, exit status 2, no traceback; outputs are checked before computing and written atomically.
Tables never truncate a number: when the columns do not fit the terminal (80 columns in a pipe), each row is
printed as a block of ``name: value`` lines instead. No domain logic lives here.
"""

from __future__ import annotations

import sys

__all__ = ["app", "main"]


def _load():
    """Import the command modules (each registers its commands on ``app`` when imported; the import order is the
    order of ``kvhit --help``: typer lists sub-command groups after the commands). Deferred so that ``kvhit
    --version`` answers without importing typer, pydantic and the service layer."""
    # isort: off
    from kvhit.cli import estimate, simulate, stream, trace, demo, plan, reproduce, curve, tiers, serve, fleet, sweep  # noqa: F401
    from kvhit.cli import explain  # noqa: F401  (kvhit explain, kvhit trace chat)
    from kvhit.cli import replay  # noqa: F401

    # isort: on
    from kvhit.cli._common import app

    return app


def __getattr__(name: str):
    if name == "app":
        return _load()
    raise AttributeError(name)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: every usage error and every refused input is one stderr line, exit 2."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:  # the fast path: nothing of the service layer is imported
        from kvhit import __version__

        sys.stdout.write(f"kvhit {__version__}\n")
        return 0
    import typer
    from rich.console import Console
    from rich.text import Text
    from typer._click import exceptions as cx

    from kvhit.cli._lazy import root
    from kvhit.service.errors import one_line
    from kvhit.service.io import install_signal_handlers

    install_signal_handlers()
    if not args or args[0] != "serve":
        from kvhit.cli._malloc import keep_freed_memory

        keep_freed_memory()  # batch commands: reuse freed arrays instead of faulting fresh pages (see _malloc)
    cmd = root()  # each command's module is imported only when that command runs or shows its own help
    try:
        rv = cmd.main(args=argv, prog_name="kvhit", standalone_mode=False)
    except cx.NoArgsIsHelpError as e:
        Console().print(e.format_message(), markup=False, highlight=False)
        return 0
    except cx.ClickException as e:
        Console(stderr=True, soft_wrap=True).print(
            Text.assemble(("error: ", "bold red"), one_line(e.format_message())), highlight=False
        )
        return e.exit_code
    except typer.Abort:
        return 1
    except typer.Exit as e:
        return e.exit_code
    return rv if isinstance(rv, int) else 0
