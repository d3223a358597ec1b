"""``kvhit`` loads a command's module only when that command runs (issue 24: ``kvhit --help`` ≤ 0.5 s): the root's
static command table (:data:`kvhit.cli._lazy.COMMANDS`) must stay equal to the commands the modules register, and
the lazily rendered help and refusals must be the eager app's, character for character."""

from __future__ import annotations

import inspect
import subprocess
import sys

import typer
from typer.testing import CliRunner

from clihelp import kvhit
from kvhit.cli import app
from kvhit.cli._lazy import COMMANDS


def _eager():
    return typer.main.get_command(app)


def test_table_equals_the_registered_commands():
    group = _eager()
    assert list(COMMANDS) == group.list_commands(None)
    for name, (modules, text) in COMMANDS.items():
        cmd = group.commands[name]
        real = inspect.cleandoc(cmd.short_help or cmd.help or "").split("\n\n")[0].strip()
        assert text == real, name
        mods = {c.callback.__module__ for c in getattr(cmd, "commands", {name: cmd}).values()}
        assert mods == set(modules), name


def test_lazy_help_is_the_eager_help():
    eager = CliRunner().invoke(app, ["--help"], prog_name="kvhit")
    assert eager.exit_code == 0
    for args in (["--help"], []):
        r = kvhit(*args)
        assert r.code == 0 and r.err == ""
        assert r.out == eager.output, args


def test_lazy_refusal_is_the_eager_refusal():
    for args in (["estimat"], ["--nope"], ["fleet", "simulat"]):
        eager = CliRunner().invoke(app, args, prog_name="kvhit")
        r = kvhit(*args)
        assert r.code == eager.exit_code == 2
        msg = [ln for ln in eager.output.splitlines() if "│" in ln and ("No such" in ln or "No such option" in ln)]
        assert msg, eager.output
        assert msg[0].strip("│ ").rstrip() in r.err, (r.err, eager.output)


def test_help_and_version_import_no_command_and_no_numeric_stack():
    code = (
        "import sys\nfrom kvhit.cli import main\nfor a in (['--help'], ['--version']): main(a)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('numpy', 'pydantic', 'scipy', 'numba', 'pyarrow')"
        " or (m.startswith('kvhit.cli.') and m not in ('kvhit.cli._lazy', 'kvhit.cli._root', 'kvhit.cli._malloc'))"
        " or (m.startswith('kvhit.service.') and m not in ('kvhit.service.errors', 'kvhit.service.io'))]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[]"


def test_a_command_imports_only_its_own_module():
    code = (
        "import sys\nfrom kvhit.cli import main\n"
        "rc = main(['kv', '--model', 'qwen3-8b', '--kv-gb', '10', '--json'])\n"
        "print(rc, sorted(m for m in sys.modules if m.startswith('kvhit.cli.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == (
        "0 ['kvhit.cli._common', 'kvhit.cli._lazy', 'kvhit.cli._malloc', 'kvhit.cli._root', 'kvhit.cli.plan']"
    )
