"""Run the ``kvhit`` command line in-process (``kvhit.cli.main``), capturing stdout and stderr.

With ``KVHIT_CLI_SUBPROCESS=1`` each call runs ``python -m kvhit.cli`` in a subprocess instead, so the same
tests can be run against an older checkout (``PYTHONPATH=<checkout>/src``) to show they fail there.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass


@dataclass
class CliResult:
    code: int
    out: str
    err: str
    exc: str = ""  #: a traceback that escaped main (a bug)

    @property
    def err_lines(self) -> list[str]:
        return [ln for ln in self.err.splitlines() if ln.strip()]


def kvhit(*args, cwd: str | None = None) -> CliResult:
    argv = [str(a) for a in args]
    if os.environ.get("KVHIT_CLI_SUBPROCESS"):
        p = subprocess.run(
            [sys.executable, "-m", "kvhit.cli", *argv], capture_output=True, text=True, cwd=cwd, timeout=600
        )
        exc = p.stderr if "Traceback" in p.stderr else ""
        return CliResult(p.returncode, p.stdout, p.stderr, exc)
    from kvhit.cli import main

    out, err = io.StringIO(), io.StringIO()
    exc = ""
    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # pragma: no cover - main returns, it does not exit
                code = int(e.code or 0)
            except Exception:
                exc = traceback.format_exc()
                code = 1
    finally:
        os.chdir(old)
    return CliResult(code, out.getvalue(), err.getvalue(), exc)


def assert_refused(r: CliResult, *needles: str) -> None:
    """Exit 2, exactly one stderr line naming each needle, no traceback, nothing on stdout."""
    assert not r.exc, r.exc
    assert "Traceback" not in r.err, r.err
    assert r.code == 2, (r.code, r.out[-2000:], r.err)
    assert len(r.err_lines) == 1, r.err
    for n in needles:
        assert n in r.err, (n, r.err)
