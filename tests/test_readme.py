"""The first hour: the Python shown (README and docs pages) is complete and runs as shown, the demo's numbers are
what ``kvhit demo`` prints, ``kvhit --version`` exists, every option's help states its unit/range/default, and
boolean flags read as flags. (The pages' shell snippets: ``tests/test_snippets.py``.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from clihelp import kvhit

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def fenced_blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, body, offset) of every fenced code block."""
    return [(m.group(1), m.group(2), m.start()) for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S)]


def test_python_shown_is_the_quickstart_file_and_runs_as_shown():
    quick = (ROOT / "examples" / "quickstart.py").read_text(encoding="utf-8")
    shown = 0
    for page in PAGES:
        blocks = fenced_blocks(page.read_text(encoding="utf-8"))
        for lang, body, off in blocks:
            if lang != "python":
                continue
            shown += 1
            assert body == quick, f"{page.name}: a Python block is not examples/quickstart.py verbatim"
            # the output block shown right after it
            following = [b for lg, b, o in blocks if o > off and lg in ("", "text")][0]
            p = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, cwd=ROOT, timeout=900)
            assert p.returncode == 0, p.stderr
            assert p.stdout.strip() == following.strip()
    assert shown == 1, "the quickstart is shown once (docs/getting-started.md)"


def test_demo_numbers_are_the_readme_numbers():
    import json

    r = kvhit("demo", "--json")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert d["N"] == 2275 and d["N_is_paper_default"]
    shown = dict(re.findall(r"^│ (estimate: [^\n]*?|simulated: [^\n]*?)\s+│\s+(0\.\d{4})\s", README, re.M))
    want = {
        "estimate: prior": d["estimates"]["prior"],
        "estimate: posterior": d["estimates"]["posterior"],
        "estimate: empirical F̂": d["estimates"]["empirical"],
        "estimate: engine-aware, Algorithm 1": d["estimates"]["engine:content"],
        "estimate: engine-aware, vLLM ≥ 0.24": d["estimates"]["engine:vllm"],
        "estimate: engine-aware, vLLM ≤ 0.23": d["estimates"]["engine:vllm-0.23"],
        "simulated: Algorithm 1": d["simulated"]["content"],
        "simulated: vLLM ≥ 0.24": d["simulated"]["vllm"],
        "simulated: vLLM ≤ 0.23": d["simulated"]["vllm-0.23"],
    }
    for label, value in want.items():
        assert label in shown, label
        assert shown[label] == f"{value:.4f}", (label, shown[label], value)
    st = d["stats"]
    for label, key in [("Â_R (eq. 35)", "A_R"), ("Ê[B] (eq. 37)", "E_B"), ("Ê[M] (eq. 37)", "E_M")]:
        m = re.search(rf"^│ {re.escape(label)}\s+│\s+([\d.]+)", README, re.M)
        assert m and m.group(1) == f"{st[key]:.4f}", (label, st[key])


def test_version():
    from kvhit import __version__

    r = kvhit("--version")
    assert r.code == 0 and r.out.strip() == f"kvhit {__version__}"


def _commands():
    import typer

    from kvhit.cli import app

    root = typer.main.get_command(app)
    out = []
    for name, cmd in root.commands.items():
        if hasattr(cmd, "commands"):
            out += [(f"{name} {sub}", c) for sub, c in cmd.commands.items()]
        else:
            out.append((name, cmd))
    return out


@pytest.mark.parametrize("name, cmd", _commands(), ids=[n for n, _ in _commands()])
def test_every_option_states_unit_range_and_default(name, cmd):
    for p in cmd.params:
        if p.name in ("help", "as_json") or not getattr(p, "opts", None):
            continue
        help_ = (getattr(p, "help", "") or "").strip()
        assert help_, f"{name} {p.opts}: no help"
        if getattr(p, "is_flag", False):
            continue  # a flag is off unless given
        shows_default = p.default is not None and getattr(p, "show_default", True) is not False
        assert shows_default or re.search(r"default|required", help_, re.I), f"{name} {p.opts}: no default stated"
        numeric = p.bare_type() in ("int", "float", "list[str]")
        if numeric and p.name not in ("seed",):
            assert re.search(r"[≥≤><]|\[|\(|\d\s*[–-]\s*\d|integer", help_), f"{name} {p.opts}: no range in {help_!r}"


def test_boolean_flags_read_as_flags():
    r = kvhit("plan", "--help")
    assert r.code == 0
    lines = [ln for ln in r.out.splitlines() if "--verify" in ln or "--json" in ln]
    assert lines and not any("bool" in ln.lower() for ln in lines), lines
    # and a flag takes no value
    r = kvhit("kv", "--list", "true")
    assert r.code == 2 and len(r.err_lines) == 1
