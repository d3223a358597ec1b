"""The result set of a sweep: a directory holding ``sweep.json`` (the grid's fingerprint, a copy of the grid file)
and a Parquet dataset ``results/part-*.parquet`` with one row per point × replication.

Invariant: a part file is either absent or complete — each batch is written to a temporary file in the same
directory and renamed into place (``os.replace``, atomic on POSIX), so a sweep killed at any moment leaves only
whole batches behind, and ``--resume`` re-runs exactly the points without a finished row. When a point has several
rows (a failure, then a retry in a later run), the latest (``finished_at``) is the point's result.

NOT done here: computing rows (:mod:`.compute`), scheduling (:mod:`.backends`).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["SCHEMA", "StoreError", "ResultStore", "read_results", "latest"]

SCHEMA = pa.schema(
    [
        ("point_id", pa.string()),
        ("replication", pa.int32()),
        ("seed", pa.int64()),
        ("workload", pa.string()),
        ("workload_kind", pa.string()),
        ("compute", pa.string()),
        ("engine", pa.string()),
        ("N", pa.int64()),
        ("hbm_gb", pa.float64()),
        ("dram_gb", pa.float64()),
        ("lam0", pa.float64()),
        ("replicas", pa.int32()),
        ("router", pa.string()),
        ("h", pa.float64()),
        ("h_ci95", pa.float64()),
        ("metric", pa.string()),
        ("token_hit_ratio", pa.float64()),
        ("request_hit_rate", pa.float64()),
        ("h_estimate", pa.float64()),
        ("feasible", pa.bool_()),
        ("n_measured", pa.int64()),
        ("extra", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("attempts", pa.int32()),
        ("wall_s", pa.float64()),
        ("task_id", pa.string()),
        ("task_points", pa.int32()),
        ("worker", pa.string()),
        ("backend", pa.string()),
        ("finished_at", pa.float64()),
        ("kvhit_version", pa.string()),
        ("grid_fingerprint", pa.string()),
    ]
)
#: the columns that are results (compared between backends); the rest is bookkeeping
RESULT_COLUMNS = [
    f.name
    for f in SCHEMA
    if f.name not in ("wall_s", "worker", "backend", "finished_at", "attempts", "task_id", "task_points")
]


class StoreError(ValueError):
    """A result directory the sweep refuses to use; one line naming it."""


class ResultStore:
    """Append-only, batch-atomic writer of a sweep's rows."""

    def __init__(self, out: Path, grid_path: Path, fingerprint: str, resume: bool) -> None:
        self.out = Path(out)
        self.dir = self.out / "results"
        meta = self.out / "sweep.json"
        if self.out.exists() and not self.out.is_dir():
            raise StoreError(f"--out {self.out}: is a file, expected a directory")
        if meta.exists():
            try:
                old = json.loads(meta.read_text(encoding="utf-8"))
            except (ValueError, OSError):
                raise StoreError(f"--out {self.out}: sweep.json is unreadable; use another --out") from None
            if not resume:
                raise StoreError(
                    f"--out {self.out}: already holds a sweep; pass --resume to continue it, or choose another --out"
                )
            if old.get("fingerprint") != fingerprint:
                raise StoreError(
                    f"--out {self.out}: holds a sweep of another grid (settings or workloads differ from "
                    f"{grid_path}); choose another --out"
                )
        elif self.out.exists() and any(self.out.iterdir()):
            raise StoreError(f"--out {self.out}: exists and is not a sweep directory (no sweep.json)")
        self.dir.mkdir(parents=True, exist_ok=True)
        if not meta.exists():
            tmp = meta.with_name(f".sweep.json.{uuid.uuid4().hex}.tmp")
            tmp.write_text(json.dumps({"fingerprint": fingerprint, "grid": grid_path.name}, indent=2) + "\n")
            os.replace(tmp, meta)
            shutil.copyfile(grid_path, self.out / "grid.toml")

    def finished(self) -> set[tuple[str, int]]:
        """(point_id, replication) whose latest row is ``ok`` or ``refused`` (not retried on --resume)."""
        t = read_results(self.out, columns=["point_id", "replication", "status", "finished_at"])
        if t is None:
            return set()
        t = latest(t)
        return {
            (p, int(r))
            for p, r, s in zip(
                t["point_id"].to_pylist(), t["replication"].to_pylist(), t["status"].to_pylist(), strict=True
            )
            if s in ("ok", "refused")
        }

    def write(self, rows: list[dict]) -> Path | None:
        """Write one batch atomically (temp file + rename); returns the part file."""
        if not rows:
            return None
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        name = f"part-{uuid.uuid4().hex}.parquet"
        tmp = self.dir / f".{name}.tmp"
        pq.write_table(table, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, self.dir / name)
        return self.dir / name


def read_results(out: Path, columns: list[str] | None = None) -> pa.Table | None:
    """All rows of a result directory (every part file; temporary files are ignored), or None when empty."""
    d = Path(out) / "results"
    parts = sorted(d.glob("part-*.parquet")) if d.is_dir() else []
    if not parts:
        return None
    return pa.concat_tables([pq.read_table(p, columns=columns) for p in parts])


def latest(t: pa.Table) -> pa.Table:
    """The latest row of each (point_id, replication)."""
    import numpy as np

    if t.num_rows == 0:
        return t
    keys = [f"{p}|{r}" for p, r in zip(t["point_id"].to_pylist(), t["replication"].to_pylist(), strict=True)]
    fin = np.asarray(t["finished_at"].to_numpy(zero_copy_only=False), float)
    order = np.lexsort((fin, np.asarray(keys)))
    last: dict[str, int] = {}
    for i in order:
        last[keys[i]] = int(i)
    return t.take(sorted(last.values()))
