"""The README's and the docs pages' snippets, as the tests run them (``tests/test_snippets.py``).

A ``console`` block holds commands (``$ kvhit …``, continued by a trailing ``\\``) each followed by the output
it prints. The test runs every command in a scratch copy of the repository's layout — ``examples/`` and
``tests/data/`` linked, ``docs/`` and ``out/`` empty, the traces at ``../shared/data/traces`` linked from the
checkout's sibling — with ``COLUMNS=120``, and checks the exit status, that stdout equals the output shown (line
ends stripped) and that every figure written under ``docs/`` equals the committed file byte for byte. The HTML
comment on the line before a block says otherwise:

A command whose output shown starts with ``error:`` is a refusal: it must exit 2 and print that line on stderr
(nothing on stdout). A here-document (``<<'EOF'`` … ``EOF``) belongs to its command.

* ``<!-- snippet: slow REASON -->`` — too slow for ``make test``: run only with ``KVHIT_SLOW_SNIPPETS=1``
  (``make docs-snippets``); docs/contributing.md lists every such block and a test holds the list to the pages;
* ``<!-- snippet: not-run REASON -->`` — never run (a server that runs until stopped, a Ray cluster, ``make``);
* ``<!-- snippet: no-output REASON -->`` — run, its stdout not compared (the page shows no output or an excerpt);
  ``slow, no-output`` combines both.

``KVHIT_SNIPPETS_REWRITE=1`` writes each run command's real output back into the page instead of comparing —
how the outputs shown were made (never edited by hand).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the pages whose snippets are run: the README and every docs page (the API reference has none)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
MARK = re.compile(r"<!--\s*snippet:\s*((?:slow|not-run|no-output)(?:\s*,\s*(?:slow|no-output))*)\b\s*(.*?)\s*-->\s*$")


@dataclass
class Command:
    line: str  #: the command as shown, continuation lines joined
    output: str  #: the output shown under it
    start: int  #: character offsets of the output in the page
    end: int


@dataclass
class Block:
    page: Path
    lang: str
    body: str
    offset: int  #: character offset of the body in the page
    lineno: int
    marks: frozenset = frozenset()
    reason: str = ""
    commands: list[Command] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.lineno}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mk = MARK.search(before)
        b = Block(
            page,
            m.group(1),
            m.group(2),
            m.start(2),
            text.count("\n", 0, m.start()) + 1,
            frozenset(x.strip() for x in mk.group(1).split(",")) if mk else frozenset(),
            mk.group(2) if mk else "",
        )
        if b.lang == "console":
            b.commands = _commands(b)
        out.append(b)
    return out


def _commands(b: Block) -> list[Command]:
    lines = b.body.splitlines(keepends=True)
    cmds: list[Command] = []
    pos = b.offset
    i = 0
    while i < len(lines):
        ln = lines[i]
        if not ln.startswith("$ "):
            raise ValueError(f"{b.id}: output before the first command: {ln!r}")
        cmd = ln[2:].rstrip("\n")
        pos += len(ln)
        i += 1
        while cmd.rstrip().endswith("\\") and i < len(lines):
            cmd = cmd.rstrip()[:-1].rstrip() + " " + lines[i].strip()
            pos += len(lines[i])
            i += 1
        here = re.search(r"<<-?\s*'?(\w+)'?\s*$", cmd)
        if here:  # a here-document: its lines, up to the terminator, belong to the command
            cmd += "\n"
            while i < len(lines):
                cmd += lines[i]
                pos += len(lines[i])
                i += 1
                if lines[i - 1].strip() == here.group(1):
                    break
            cmd = cmd.rstrip("\n")
        start = pos
        out = []
        while i < len(lines) and not lines[i].startswith("$ "):
            out.append(lines[i])
            pos += len(lines[i])
            i += 1
        if not here:
            cmd = re.sub(r"\s+#.*$", "", cmd)
        cmds.append(Command(cmd.strip(), "".join(out), start, pos))
    return cmds


def all_blocks() -> list[Block]:
    return [b for p in PAGES for b in blocks(p)]


BOX = "┏┃┡│└╭╰├┗┣━─"
ABS_PATH = re.compile(r"(?<![\w.~])/(?:[\w.+-]+/)+[\w.+-]*")
SECONDS = re.compile(r"\b\d+\.\d+ s\b")


def normalize(text: str) -> str:
    """What is compared: table lines exactly (line ends stripped); the prose between them as one paragraph with
    whitespace collapsed (rich wraps it at the terminal's width, so it rewraps with the text), in which absolute
    paths (the installed ShareGPT file, the token cache) become ``<path>`` and elapsed seconds ``<t> s`` — they
    differ from machine to machine and run to run; every other word and number must be as shown."""
    out: list[str] = []
    para: list[str] = []

    def flush() -> None:
        if para:
            joined = " ".join(" ".join(para).split())
            out.append(SECONDS.sub("<t> s", ABS_PATH.sub("<path>", joined)))
            para.clear()

    for ln in text.strip("\n").splitlines():
        if ln[:1] in BOX:
            flush()
            out.append(ln.rstrip())
        elif ln.strip():
            para.append(ln)
    flush()
    return "\n".join(out)
