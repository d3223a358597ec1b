"""Answer the planner page's first chart ahead of time (``make venv`` runs ``python -m kvhit.web.prepare``), so that
the first page load of ``kvhit serve`` on a fresh machine tokenizes nothing.

The first chart (:data:`kvhit.web.app.FIRST_CHART`: the bundled ShareGPT workload, vLLM ≥ 0.24, the page's default
grid) does not depend on the model or the KV budget (the GiB axis is drawn from ``/api/kv``), only on the block
size. :func:`prepare` computes it with the very function a job runs (:func:`kvhit.service.registry.run`, strict
JSON of the response) and stores it in the persisted-answer directory of ``kvhit serve`` under the key the server
looks up (:func:`kvhit.web.app._digest`: kvhit's version, a hash of kvhit's source files, the command and the
fields). Invariant: the stored answer IS a fresh computation by the code that serves it — any change of kvhit's
source changes the key, so an answer of other code is never served (it is recomputed as a job instead).
NOT prepared: other block sizes unless asked (``--block-size``), uploaded workloads, other engines.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["answer_dir", "prepare", "main"]


def answer_dir() -> Path:
    """Where ``kvhit serve`` keeps its persisted answers: ``<kvhit cache dir>/web-answers``."""
    from kvhit.workload.cache import resolve_cache_dir

    return resolve_cache_dir() / "web-answers"


def prepare(persist: Path | None = None, block_sizes: tuple[int | None, ...] = (None,), progress=None) -> list[Path]:
    """Compute the first chart per block size (``None``: the page's default) into ``persist`` (default
    :func:`answer_dir`); an answer already there for this code is kept. Returns the answer files."""
    from kvhit.service.io import atomic_write_text
    from kvhit.service.registry import run
    from kvhit.web.app import FIRST_CHART, _digest

    d = Path(persist) if persist is not None else answer_dir()
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for b in block_sizes:
        fields = dict(FIRST_CHART) if b is None else {**FIRST_CHART, "block_size": int(b)}
        f = d / f"{_digest('curve', fields).hexdigest()}.json"
        if not f.exists():
            res = run("curve", fields, progress)
            atomic_write_text(f, json.dumps(res.to_jsonable(), allow_nan=False))
        out.append(f)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m kvhit.web.prepare [--block-size B ...]``: prepare and print the answer files."""
    args = list(sys.argv[1:] if argv is None else argv)
    sizes: list[int | None] = []
    while args:
        a = args.pop(0)
        if a != "--block-size":
            sys.stderr.write(f"error: {a}: unknown option (only --block-size B)\n")
            return 2
        v = args.pop(0) if args else ""
        if not (v.isdigit() and 1 <= int(v) <= 2**16):
            sys.stderr.write(f"error: --block-size: expected a whole number of tokens 1–65,536, got {v!r}\n")
            return 2
        sizes.append(int(v))
    for f in prepare(block_sizes=tuple(sizes) or (None,)):
        sys.stdout.write(f"{f}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
