"""The Mooncake columnar cache (issue 24: reading Mooncake ≤ 1 s): a cached read equals a fresh read field for
field and array for array; the key follows the file's bytes and the reader's options; a broken entry is rewritten."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from kvhit.workload.production import read_mooncake
from kvhit.workload.production_cache import cache_key, read_mooncake_cached

REAL = Path("/work/shared/data/traces/mooncake_fast25/conversation_trace.jsonl")


def _write(p: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    lines, t = [], 0
    for i in range(n):
        t += int(rng.integers(0, 50))
        k = int(rng.integers(1, 6))
        base = [1, 2, 3][: int(rng.integers(0, 4))]
        ids = base + [100 * i + j for j in range(k)]
        lines.append(json.dumps({"timestamp": t, "input_length": 512 * len(ids) - 7, "output_length": 10,
                                 "hash_ids": ids}))  # fmt: skip
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def _equal(a, b) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert x == y, f.name


def test_cached_equals_fresh_and_is_reused(tmp_path):
    p = _write(tmp_path / "m.jsonl", 300, 0)
    fresh = read_mooncake(p)
    first = read_mooncake_cached(p, cache_dir=tmp_path / "c")
    again = read_mooncake_cached(p, cache_dir=tmp_path / "c")
    _equal(fresh, first)
    _equal(fresh, again)
    entries = list((tmp_path / "c" / "mooncake").glob("*.npz"))
    assert len(entries) == 1
    # options are part of the key, and so are the bytes
    _equal(read_mooncake(p, sessions="none"),
           read_mooncake_cached(p, cache_dir=tmp_path / "c", sessions="none"))  # fmt: skip
    k0 = cache_key(p)
    _write(p, 300, 1)
    assert cache_key(p) != k0
    _equal(read_mooncake(p), read_mooncake_cached(p, cache_dir=tmp_path / "c"))


def test_broken_entry_is_rewritten(tmp_path):
    p = _write(tmp_path / "m.jsonl", 50, 2)
    f = tmp_path / "c" / "mooncake" / f"{cache_key(p)}.npz"
    f.parent.mkdir(parents=True)
    f.write_bytes(b"not an npz")
    _equal(read_mooncake(p), read_mooncake_cached(p, cache_dir=tmp_path / "c"))
    _equal(read_mooncake(p), read_mooncake_cached(p, cache_dir=tmp_path / "c"))


@pytest.mark.skipif(not REAL.exists(), reason="the stored Mooncake trace is not on this machine")
def test_real_trace_cached_equals_fresh(tmp_path):
    _equal(read_mooncake(REAL), read_mooncake_cached(REAL, cache_dir=tmp_path))
    _equal(read_mooncake(REAL), read_mooncake_cached(REAL, cache_dir=tmp_path))
