"""Every command shown in the README and the docs pages runs as shown and prints what is shown; every figure it
writes under ``docs/`` is byte-identical to the committed one; every TOML shown is an ``examples/`` file verbatim.
How blocks are read and marked: ``tests/snippets.py``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from snippets import PAGES, ROOT, Block, all_blocks, blocks, normalize

SLOW = bool(os.environ.get("KVHIT_SLOW_SNIPPETS"))
REWRITE = bool(os.environ.get("KVHIT_SNIPPETS_REWRITE"))
SHARED = ROOT.parent / "shared"
BLOCKS = all_blocks()
CONSOLE = [b for b in BLOCKS if b.lang == "console" and "not-run" not in b.marks]


def _params():
    """One test per distinct block: a block shown on two pages (the README's tasks in getting-started) runs once."""
    seen: dict[tuple, Block] = {}
    for b in CONSOLE:
        seen.setdefault((b.body, b.marks), b)
    for b in seen.values():
        marks = [pytest.mark.slow] if "slow" in b.marks else []
        yield pytest.param(b, id=b.id, marks=marks)


def _workdir(tmp: Path) -> Path:
    """A scratch repository layout: the inputs linked, ``docs/`` and ``out/`` empty, ``../shared`` linked."""
    repo = tmp / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "out").mkdir()
    for name in ("examples", "tests", "benchmarks", "src", ".venv", "Makefile", "conformance"):
        if (ROOT / name).exists():
            (repo / name).symlink_to(ROOT / name)
    if SHARED.exists():
        (tmp / "shared").symlink_to(SHARED)
    return repo


def _run(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "COLUMNS": "120",
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT / "benchmarks"),
        "NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache")),
        "PY": sys.executable,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    }
    script = 'kvhit() { "$PY" -m kvhit.cli "$@"; }\npython() { "$PY" "$@"; }\n' + cmd + "\n"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=cwd, env=env, timeout=3600)


def _outputs(cmd: str) -> list[str]:
    """Files a command writes, relative to the repository: ``-o/--out FILE`` and ``--plot/--fig PREFIX``."""
    found = re.findall(r"(?:^|\s)(?:-o|--out)\s+(\S+)", cmd)
    for prefix in re.findall(r"(?:^|\s)--(?:plot|fig)\s+(\S+)", cmd):
        found += [prefix + ".png", prefix + ".svg"]
    return found


def _prerequisites(b: Block, repo: Path) -> None:
    """Run the earlier commands of the same page that write a file this block reads (e.g. ``out/sharegpt.parquet``)."""
    needed = {p for c in b.commands for p in re.findall(r"\b(out/\S+\.parquet)\b", c.line) if p not in _outputs(c.line)}
    page = [x for x in blocks(b.page) if x.lang == "console"]
    here = next(i for i, x in enumerate(page) if x.body == b.body)
    for earlier in page[:here]:
        for c in earlier.commands:
            makes = needed & set(_outputs(c.line))
            if makes and not all((repo / m).exists() for m in makes):
                p = _run(c.line, repo)
                assert p.returncode == 0, f"{earlier.id}: {c.line}\n{p.stderr[-2000:]}"


@pytest.mark.parametrize("block", list(_params()))
def test_console_snippet_runs_as_shown(block: Block, tmp_path):
    if "slow" in block.marks and not (SLOW or REWRITE):
        pytest.skip(f"slow snippet ({block.reason}): KVHIT_SLOW_SNIPPETS=1 / make docs-snippets")
    if any("../shared/" in c.line for c in block.commands) and not SHARED.exists():
        pytest.skip("the traces are not beside this checkout (../shared/data/traces)")
    repo = _workdir(tmp_path)
    _prerequisites(block, repo)
    got = []
    for c in block.commands:
        p = _run(c.line, repo)
        if c.output.startswith("error:"):  # a refusal: exit 2, the one line on stderr, nothing on stdout
            assert p.returncode == 2 and not p.stdout, f"{block.id}: `{c.line}` exited {p.returncode}\n{p.stderr}"
            got.append(p.stderr)
            if not REWRITE:
                assert normalize(p.stderr) == normalize(c.output), f"{block.id}: `{c.line}` printed {p.stderr!r}"
            continue
        assert p.returncode == 0, f"{block.id}: `{c.line}` exited {p.returncode}\n{p.stderr[-3000:]}"
        got.append(p.stdout)
        for rel in _outputs(c.line):
            if not rel.startswith("docs/"):
                continue
            made, committed = repo / rel, ROOT / rel
            assert made.is_file(), f"{block.id}: `{c.line}` did not write {rel}"
            if REWRITE:
                shutil.copyfile(made, committed)
            else:
                assert committed.is_file(), f"{rel} is not committed"
                assert made.read_bytes() == committed.read_bytes(), f"{block.id}: regenerating {rel} changes it"
        if "no-output" not in block.marks and not REWRITE:
            assert normalize(p.stdout) == normalize(c.output), (
                f"{block.id}: `{c.line}` printed\n{p.stdout}\nbut the page shows\n{c.output}"
            )
    if REWRITE and "no-output" not in block.marks:
        _rewrite(block, got)


def _rewrite(block: Block, got: list[str]) -> None:
    """Put the real outputs into every page showing this block (``KVHIT_SNIPPETS_REWRITE=1``; run without ``-n``)."""
    for page in PAGES:
        while True:
            same = [b for b in blocks(page) if b.lang == "console" and b.body == block.body]
            if not same:
                break
            fresh = same[0]
            text = page.read_text(encoding="utf-8")
            for c, out in reversed(list(zip(fresh.commands, got, strict=True))):
                out = "\n".join(ln.rstrip() for ln in out.rstrip("\n").splitlines())
                text = text[: c.start] + (out + "\n" if out else "") + text[c.end :]
            page.write_text(text, encoding="utf-8")
            if all(normalize(c.output) == normalize(o) for c, o in zip(fresh.commands, got, strict=True)):
                break  # the output shown was already the real one: the body is unchanged


def test_slow_snippets_are_listed_in_contributing():
    """docs/contributing.md lists every snippet that ``make test`` does not run, by page and command."""
    listed = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    section = listed.split("<!-- slow-snippets -->", 2)[1]
    for b in BLOCKS:
        if b.marks & {"slow", "not-run"}:
            for c in b.commands:
                assert f"`{c.line}`" in section, f"{b.id}: `{c.line}` is not listed in docs/contributing.md"


def test_every_mark_says_why():
    for b in BLOCKS:
        if b.marks:
            assert b.reason, f"{b.id}: <!-- snippet: {', '.join(sorted(b.marks))} --> without a reason"


def test_toml_shown_is_an_example_file_verbatim():
    examples = {p.read_text(encoding="utf-8") for p in (ROOT / "examples").glob("*.toml")}
    for b in BLOCKS:
        if b.lang == "toml":
            assert b.body in examples, f"{b.id}: the TOML shown is not an examples/*.toml file verbatim"


def test_no_absolute_paths_and_traces_say_where_they_come_from():
    """Snippets use no machine's absolute path; every page that uses ``../shared/`` says where the traces and the
    paper come from (docs/traces.md, from their public sources)."""
    for b in BLOCKS:
        for c in b.commands:
            assert not re.search(r"(?:^|\s)/(?:work|home|root|Users)/", c.line), f"{b.id}: absolute path in `{c.line}`"
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        if "../shared/" in text and page.name != "traces.md":
            assert "traces.md" in text, f"{page.name} uses ../shared/ without linking docs/traces.md"


def test_comparison_catches_dropped_borders_and_rows_but_not_rewrapped_prose():
    """Negative controls for what the snippet comparison accepts (issue 21's listings dropped borders and rows)."""
    printed = (
        "read /home/u/.venv/x.json: 17,671 records; cache hit\n(/home/u/.cache/t.parquet); 0.89 s\n"
        "┏━━━┳━━━━━━━┓\n┃ N ┃     h ┃\n┡━━━╇━━━━━━━┩\n│ 1 │ 0.250 │\n│ 2 │ 0.500 │\n└───┴───────┘\n"
    )
    rewrapped = printed.replace("records; cache hit\n(", "records;\ncache hit (").replace("0.89 s", "12.30 s")
    assert normalize(rewrapped) == normalize(printed)
    no_borders = "\n".join(ln for ln in printed.splitlines() if not ln.startswith(("┏", "┡", "└")))
    assert normalize(no_borders) != normalize(printed)
    dropped_row = printed.replace("│ 2 │ 0.500 │\n", "")
    assert normalize(dropped_row) != normalize(printed)
    changed = printed.replace("0.500", "0.501")
    assert normalize(changed) != normalize(printed)
    assert normalize(printed.replace("17,671", "17,672")) != normalize(printed)
