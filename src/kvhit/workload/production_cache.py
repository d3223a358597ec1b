"""A columnar cache of parsed Mooncake traces: the JSON parse, the block-id flattening and the prefix-subtree
session derivation of :func:`kvhit.workload.production.read_mooncake` (seconds for the 12,031-request
``conversation_trace.jsonl``) are done once per file and reader version; later reads load the arrays (``.npz``,
no pickle) in milliseconds.

Invariant: a cached read returns a :class:`~kvhit.workload.production_trace.ProductionTrace` equal, array for array and
field for field, to a fresh :func:`read_mooncake` of the same bytes with the same keyword arguments
(tests/test_production_cache.py): the key is the SHA-256 of the file's bytes, the keyword arguments, and the
SHA-256 of the reader's own source file (``production.py``) and of this file — any change of either invalidates
every entry. Writes are atomic (temporary file + ``os.replace``); an unreadable entry is ignored and rewritten.
Location: ``cache_dir``, else ``$KVHIT_CACHE_DIR``, else ``~/.cache/kvhit``, under ``mooncake/``.

NOT cached: WEKA traces (a directory of JSON files read with arrival-time options), reads with ``strict=False``
(their ``skipped`` records are kept as read, not cached).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from kvhit.workload.production import read_mooncake
from kvhit.workload.production_trace import ProductionTrace

__all__ = ["cache_key", "read_mooncake_cached"]

_ARRAYS = (
    "time", "prompt_tokens", "output_tokens", "hash_offsets", "hashes", "session", "agent", "model", "file_index",
    "record", "sub_record",
)  # fmt: skip


def _code_digest() -> str:
    h = hashlib.sha256()
    for f in (Path(__file__).with_name("production.py"), Path(__file__)):
        h.update(f.read_bytes())
    return h.hexdigest()


def cache_key(path: str | os.PathLike, **kw: Any) -> str:
    """The entry's key: SHA-256 over the file's bytes, the keyword arguments and the reader's source."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    h.update(json.dumps(kw, sort_keys=True, default=str).encode())
    h.update(_code_digest().encode())
    return h.hexdigest()[:32]


def _dir(cache_dir: str | os.PathLike | None) -> Path:
    from kvhit.workload.cache import resolve_cache_dir

    return Path(resolve_cache_dir(cache_dir)) / "mooncake"


def _load(f: Path, path: str) -> ProductionTrace | None:
    try:
        with np.load(f, allow_pickle=False) as z:
            meta = json.loads(str(z["_fields"]))
            arrays = {k: (z[k] if k in z.files else None) for k in _ARRAYS}
    except (OSError, ValueError, KeyError):
        return None
    meta["files"] = (str(path),)  # the entry is path-independent; provenance names the file read
    meta["models"] = tuple(meta["models"])
    meta["skipped"] = tuple(tuple(s) for s in meta["skipped"])
    return ProductionTrace(**arrays, **meta)


def _store(f: Path, pt: ProductionTrace) -> None:
    fields = {
        "block_size": int(pt.block_size),
        "models": list(pt.models),
        "format": pt.format,
        "session_source": pt.session_source,
        "rechained": bool(pt.rechained),
        "n_partial_dropped": int(pt.n_partial_dropped),
        "skipped": [list(s) for s in pt.skipped],
        "meta": pt.meta,
    }
    arrays = {k: getattr(pt, k) for k in _ARRAYS if getattr(pt, k) is not None}
    f.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=f.parent, suffix=".npz.tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, _fields=np.array(json.dumps(fields)), **arrays)
        os.replace(tmp, f)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_mooncake_cached(
    path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None, **kw: Any
) -> ProductionTrace:
    """:func:`read_mooncake` of ``path`` with ``kw``, through the cache (see the module docstring)."""
    if kw.get("strict") is False:
        return read_mooncake(path, **kw)
    f = _dir(cache_dir) / f"{cache_key(path, **kw)}.npz"
    if f.exists():
        pt = _load(f, str(path))
        if pt is not None:
            return pt
    pt = read_mooncake(path, **kw)
    try:
        _store(f, pt)
    except OSError:
        pass  # a read-only cache directory: the answer stands, only the next read is slow
    return pt
