"""The trace: a columnar table of conversation turns, sorted by turn time, with Parquet I/O.

One row per turn (i, j) of the multi-turn model:

==================  =========  ===================================================================================
column              dtype      meaning
==================  =========  ===================================================================================
``conv``            int64      conversation id, dense 0..C−1 in order of conversation arrival
``conv_arrival``    float64    arrival (first-prompt submission) time of the conversation, seconds
``turn``            int32      turn index j (1-based)
``time``            float64    submission time of the turn-j prompt, seconds
``M``               int32      number of turns of the conversation (M_i)
``Z``               int64      block increment Z_j (≥ 1)
``R``               int64      history content R_j = Z_1 + … + Z_j, blocks, after the turn-j prompt (eq. (4))
==================  =========  ===================================================================================

Optional columns (present when the source knows them; all per turn):

==================  =============  ===============================================================================
``prompt_tokens``   int64          tokens of the turn-j user prompt, chat template included
``response_tokens`` int64          tokens of the turn-j assistant response
``cum_tokens``      int64          T_j: total prompt tokens at turn j (whole history + new prompt)
``R_full``          int64          ⌊T_j / b⌋ — full (hashable) blocks of the turn-j prompt
``R_phys``          int64          ⌈T_j / b⌉ — physical blocks the turn-j prompt occupies
``new_tokens``      list<int32>    token ids T_{j−1}..T_j (the prompt of turn j is their concatenation over 1..j)
``response_ids``    list<int32>    token ids of the turn-j response (for the colocated block simulator)
==================  =============  ===============================================================================

Trace-level metadata (``Trace.meta``, stored in the Parquet schema): ``schema_version``, ``block_size``,
``source``, ``seed``, ``spec`` (JSON), ``block_rule`` and anything else a producer records.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["SCHEMA_VERSION", "Trace", "TraceError", "Window"]

SCHEMA_VERSION = 1

REQUIRED: dict[str, Any] = {
    "conv": np.int64,
    "conv_arrival": np.float64,
    "turn": np.int32,
    "time": np.float64,
    "M": np.int32,
    "Z": np.int64,
    "R": np.int64,
}
OPTIONAL: dict[str, Any] = {
    "prompt_tokens": np.int64,
    "response_tokens": np.int64,
    "cum_tokens": np.int64,
    "R_full": np.int64,
    "R_phys": np.int64,
}
LIST_COLUMNS = ("new_tokens", "response_ids")
_META_KEY = b"kvhit"


class TraceError(ValueError):
    """An invalid trace; the message names the file (when there is one), the row and the column."""


@dataclass
class Trace:
    """A multi-turn block trace (see the module docstring for the columns).

    Build one with :meth:`from_columns` (validates and sorts) or read one with :meth:`read`.
    """

    cols: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)
    lists: dict[str, list[np.ndarray]] = field(default_factory=dict)

    # -- construction -------------------------------------------------------------------------------------------
    @classmethod
    def from_columns(
        cls,
        cols: dict[str, Any],
        meta: dict[str, Any] | None = None,
        lists: dict[str, list] | None = None,
        *,
        sort: bool = True,
        where: str = "trace",
    ) -> Trace:
        """Validate columns (and optional per-turn token-id lists), sort rows by (time, conv, turn)."""
        missing = [c for c in REQUIRED if c not in cols]
        if missing:
            raise TraceError(f"{where}: missing required column(s) {missing}")
        unknown = set(cols) - set(REQUIRED) - set(OPTIONAL)
        if unknown:
            raise TraceError(f"{where}: unknown column(s) {sorted(unknown)}")
        n = len(cols["conv"])
        out: dict[str, np.ndarray] = {}
        for name, arr in cols.items():
            a = np.asarray(arr)
            if a.ndim != 1 or a.shape[0] != n:
                raise TraceError(f"{where}: column {name!r} has shape {a.shape}, expected ({n},)")
            dtype = REQUIRED.get(name, OPTIONAL.get(name))
            if np.issubdtype(np.dtype(dtype), np.integer):
                if a.dtype.kind == "f":
                    bad = ~np.isfinite(a) | (a != np.round(a))
                    if bad.any():
                        raise TraceError(f"{where}: row {int(np.argmax(bad))}, column {name!r}: not an integer")
                elif a.dtype.kind not in "iu":
                    raise TraceError(f"{where}: column {name!r} must be integer, got {a.dtype}")
            elif a.dtype.kind not in "iuf":  # never coerced: strings or booleans in a numeric column are refused
                raise TraceError(f"{where}: column {name!r} must be numeric, got {a.dtype}")
            out[name] = a.astype(dtype, copy=False)
        lists_out: dict[str, list[np.ndarray]] = {}
        for name, seq in (lists or {}).items():
            if name not in LIST_COLUMNS:
                raise TraceError(f"{where}: unknown list column {name!r}")
            if len(seq) != n:
                raise TraceError(f"{where}: list column {name!r} has {len(seq)} rows, expected {n}")
            lists_out[name] = [np.asarray(x, dtype=np.int32) for x in seq]
        meta = dict(meta or {})
        meta.setdefault("schema_version", SCHEMA_VERSION)
        tr = cls(out, meta, lists_out)
        if sort:
            tr = tr._sorted()
        tr.validate(where)
        return tr

    def _sorted(self) -> Trace:
        order = np.lexsort((self.cols["turn"], self.cols["conv"], self.cols["time"]))
        if np.all(order == np.arange(order.size)):
            return self
        cols = {k: v[order] for k, v in self.cols.items()}
        lists = {k: [v[i] for i in order] for k, v in self.lists.items()}
        return Trace(cols, self.meta, lists)

    # -- validation -------------------------------------------------------------------------------------------
    def validate(self, where: str = "trace") -> None:
        """Check the invariants; raise :class:`TraceError` naming the first offending row and column."""
        c = self.cols
        n = self.n_turns

        def fail(mask: np.ndarray, col: str, what: str) -> None:
            if mask.any():
                i = int(np.argmax(mask))
                raise TraceError(
                    f"{where}: row {i} (conv {int(c['conv'][i])}, turn {int(c['turn'][i])}), column {col!r}: {what}"
                )

        if n == 0:
            return
        for name in ("conv_arrival", "time"):
            fail(~np.isfinite(c[name]), name, "not a finite number")
        fail(c["conv"] < 0, "conv", "must be ≥ 0")
        fail(c["turn"] < 1, "turn", "must be ≥ 1")
        fail(c["Z"] < 1, "Z", "every turn must add at least one block (Z_j ≥ 1)")
        fail(c["M"] < c["turn"], "M", "turn index exceeds the conversation's turn count M")
        fail(c["time"] < c["conv_arrival"], "time", "turn before its conversation's arrival")
        fail(np.diff(c["time"], prepend=c["time"][0]) < 0, "time", "rows not sorted by time")
        # per-conversation checks: turns consecutive from 1, R = cumsum Z, times nondecreasing
        order = self.conv_index()[2]
        conv_s, turn_s = c["conv"][order], c["turn"][order]
        first = np.concatenate([[True], conv_s[1:] != conv_s[:-1]])
        expected_turn = np.arange(n) - np.maximum.accumulate(np.where(first, np.arange(n), 0)) + 1
        bad = turn_s != expected_turn
        if bad.any():
            i = int(order[np.argmax(bad)])
            raise TraceError(
                f"{where}: row {i} (conv {int(c['conv'][i])}), column 'turn': turns of a "
                f"conversation must be 1, 2, … without gaps or repeats"
            )
        Z_s, R_s = c["Z"][order], c["R"][order]
        R_prev = np.concatenate([[0], R_s[:-1]])
        bad = R_s != np.where(first, 0, R_prev) + Z_s
        if bad.any():
            i = int(order[np.argmax(bad)])
            raise TraceError(
                f"{where}: row {i} (conv {int(c['conv'][i])}, turn {int(c['turn'][i])}), "
                f"column 'R': R_j must equal R_(j-1) + Z_j"
            )
        t_s = c["time"][order]
        bad = ~first & (t_s < np.concatenate([[0.0], t_s[:-1]]))
        if bad.any():
            i = int(order[np.argmax(bad)])
            raise TraceError(f"{where}: row {i}, column 'time': turn earlier than the previous turn")
        for name in ("conv_arrival", "M"):
            v = c[name][order]
            bad = ~first & (v != np.concatenate([v[:1], v[:-1]]))
            if bad.any():
                i = int(order[np.argmax(bad)])
                raise TraceError(f"{where}: row {i}, column {name!r}: differs between turns of one conversation")

    # -- views ------------------------------------------------------------------------------------------------
    @property
    def n_turns(self) -> int:
        return int(self.cols["conv"].shape[0])

    @property
    def n_conversations(self) -> int:
        return int(self.conv_index()[0].size)

    def conv_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids, dense, order)``: the sorted distinct conversation ids, each row's conversation as 0..C−1, and
        the rows in conversation-major order (by conversation id, then turn). Computed once per trace (columns
        are read-only after construction; replacing the ``conv`` or ``turn`` array recomputes it): O(n) for
        dense non-negative ids, which every generator and reader produces, else by sorting."""
        conv, turn = self.cols["conv"], self.cols["turn"]
        cached = self.__dict__.get("_conv_index")
        # the cache holds the very arrays it was computed from (identity, not id(): no address reuse)
        if cached is not None and cached[0] is conv and cached[1] is turn and cached[2] == conv.shape[0]:
            return cached[3]
        n = conv.shape[0]
        if n and int(conv.min()) >= 0 and int(conv.max()) < 2 * n + 1024:
            counts = np.bincount(conv)
            present = counts > 0
            ids = np.flatnonzero(present).astype(conv.dtype)
            dense = (np.cumsum(present) - 1)[conv]
        else:
            ids, dense = np.unique(conv, return_inverse=True)
            dense = dense.ravel()
        dense = dense.astype(np.int64)
        order = np.argsort(dense, kind="stable")  # rows are time-sorted, so turns ascend within a conversation
        d_s, t_s = dense[order], turn[order]
        if n > 1 and bool(((d_s[1:] == d_s[:-1]) & (t_s[1:] < t_s[:-1])).any()):
            order = np.lexsort((turn, dense))
        res = (ids, dense, order)
        self.__dict__["_conv_index"] = (conv, turn, n, res)
        return res

    @property
    def block_size(self) -> int | None:
        b = self.meta.get("block_size")
        return int(b) if b is not None else None

    def __getitem__(self, name: str) -> np.ndarray:
        return self.cols[name]

    def __contains__(self, name: str) -> bool:
        return name in self.cols or name in self.lists

    def __len__(self) -> int:
        return self.n_turns

    def has(self, *names: str) -> bool:
        return all(n in self for n in names)

    def dense_conv(self) -> np.ndarray:
        """Conversation ids mapped to 0..C−1 (in id order)."""
        return self.conv_index()[1]

    def R_prev(self) -> np.ndarray:
        """R_{j−1} for every row (0 at first turns)."""
        return self.cols["R"] - self.cols["Z"]

    def interarrivals(self) -> np.ndarray:
        """The observed prompt interarrival times W (time of turn j+1 − time of turn j), within conversations."""
        c = self.cols
        order = self.conv_index()[2]
        conv_s, t_s = c["conv"][order], c["time"][order]
        same = conv_s[1:] == conv_s[:-1]
        return (t_s[1:] - t_s[:-1])[same]

    def conversations(self) -> dict[str, np.ndarray]:
        """Per-conversation arrays in id order: ``conv``, ``arrival``, ``M`` (turn count), ``B`` (= R_M, eq. (1)),
        ``observed`` (turns present in the trace)."""
        c = self.cols
        ids, dense, order = self.conv_index()
        counts = np.bincount(dense, minlength=ids.size)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        first = order[starts] if ids.size else np.zeros(0, np.int64)
        B = np.zeros(ids.size, dtype=np.int64)
        if ids.size:
            B = np.maximum.reduceat(c["R"][order], starts).astype(np.int64)
        return {
            "conv": ids,
            "arrival": c["conv_arrival"][first],
            "M": c["M"][first].astype(np.int64),
            "B": B,
            "observed": counts,
        }

    def select(self, mask: np.ndarray) -> Trace:
        """A new trace with the rows where ``mask`` is true (no re-validation of conversation completeness)."""
        mask = np.asarray(mask, dtype=bool)
        cols = {k: v[mask] for k, v in self.cols.items()}
        idx = np.flatnonzero(mask)
        lists = {k: [v[i] for i in idx] for k, v in self.lists.items()}
        return Trace(cols, dict(self.meta), lists)

    # -- Parquet I/O ------------------------------------------------------------------------------------------
    def write(self, path: str | Path) -> Path:
        """Write to Parquet atomically (a temporary file renamed into place: no half-written output)."""
        import pyarrow as pa

        arrays = {k: pa.array(v) for k, v in self.cols.items()}
        arrays.update({k: list_column(v) for k, v in self.lists.items()})
        meta = dict(self.meta)
        meta["schema_version"] = SCHEMA_VERSION
        return write_table_atomic(pa.table(arrays), path, meta)

    @classmethod
    def read(cls, path: str | Path) -> Trace:
        """Read and validate a trace written by :meth:`write` (schema version checked)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = Path(path)
        if not path.exists():
            raise TraceError(f"{path}: no such file")
        try:
            pf = pq.ParquetFile(path)
            schema = pf.schema_arrow
        except (pa.ArrowInvalid, OSError) as e:
            raise TraceError(f"{path}: not a readable Parquet file ({e})") from None
        raw = (schema.metadata or {}).get(_META_KEY)
        if raw is None:
            raise TraceError(f"{path}: not a kvhit trace (no kvhit metadata in the Parquet schema)")
        try:
            meta = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TraceError(f"{path}: the kvhit metadata in the Parquet schema is not JSON ({e})") from None
        if not isinstance(meta, dict):
            raise TraceError(f"{path}: the kvhit metadata in the Parquet schema is not a JSON object")
        version = meta.get("schema_version")
        if version != SCHEMA_VERSION:
            raise TraceError(f"{path}: trace schema version {version!r}, this kvhit reads version {SCHEMA_VERSION}")
        cols: dict[str, np.ndarray] = {}
        lists: dict[str, list[np.ndarray]] = {}
        pool = pa.default_memory_pool()
        # one column at a time: the peak is the arrays read so far plus one column's Arrow buffers (reading the
        # whole table first held every column twice while its row groups were combined: 2.15 GB at 10⁷ turns)
        for name in schema.names:
            try:
                col = pf.read(columns=[name]).column(0).combine_chunks()
            except (pa.ArrowInvalid, OSError) as e:
                raise TraceError(f"{path}: column {name!r} is not readable ({e})") from None
            if name in LIST_COLUMNS:
                offsets = col.offsets.to_numpy()
                flat = col.values.to_numpy(zero_copy_only=False)
                lists[name] = [flat[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
            else:
                if col.null_count:
                    i = int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
                    raise TraceError(f"{path}: row {i}, column {name!r}: missing value")
                cols[name] = col.to_numpy(zero_copy_only=False)
            del col
            pool.release_unused()
        out = cls.from_columns(cols, meta, lists, sort=False, where=str(path))
        del cols
        pa.default_memory_pool().release_unused()  # Arrow's allocator keeps freed pages otherwise (~1 GB at 10⁷ turns)
        return out


def json_default(o: Any) -> Any:
    """``json.dumps(default=...)`` for numpy scalars and arrays."""
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON-serializable: {type(o).__name__}")


def list_column(seq: list) -> Any:
    """A ragged list of integer arrays as an Arrow ``large_list<int32>`` column."""
    import pyarrow as pa

    offsets = np.concatenate([[0], np.cumsum([len(x) for x in seq])]).astype(np.int64)
    flat = np.concatenate(seq).astype(np.int32) if seq else np.zeros(0, np.int32)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat))


def file_mode() -> int:
    """The mode ``open()`` gives a new file under the current umask (0o666 & ~umask)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_table_atomic(table: Any, path: str | Path, meta: dict[str, Any]) -> Path:
    """Write an Arrow table with kvhit metadata to Parquet through a temporary file renamed into place, so a
    reader never sees a half-written file."""
    import pyarrow.parquet as pq

    path = Path(path)
    table = table.replace_schema_metadata({_META_KEY: json.dumps(meta, default=json_default).encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.chmod(tmp, file_mode())  # mkstemp creates 0600; a written file follows the umask like open() does
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@dataclass(frozen=True)
class Window:
    """A measurement window (App. E): a turn is measured when ``start ≤ time ≤ end`` and its conversation id is
    ``≥ min_conv``. Turns after ``end`` are not counted (the paper's censoring of late turns).

    ``Window.warmup_conversations(trace, n_warm)`` reproduces App. E: the window opens at the submission of the
    first measured conversation (the (n_warm+1)-th to arrive) and closes at the last conversation's submission;
    by default every turn in that window counts, warm-up conversations' late turns included, the way an engine's
    counters see it (``only_measured=True`` restricts to measured conversations).
    """

    start: float = -np.inf
    end: float = np.inf
    min_conv: int = 0

    @classmethod
    def all(cls) -> Window:
        return cls()

    @classmethod
    def warmup_conversations(cls, trace: Trace, n_warm: int, *, only_measured: bool = False) -> Window:
        conv = trace.conversations()
        if n_warm < 0 or n_warm >= conv["conv"].size:
            raise TraceError(f"warm-up of {n_warm} conversations leaves none of {conv['conv'].size} to measure")
        order = np.argsort(conv["arrival"], kind="stable")
        start = float(conv["arrival"][order[n_warm]])
        end = float(conv["arrival"][order[-1]])
        min_conv = int(conv["conv"][order[n_warm]]) if only_measured else 0
        return cls(start, end, min_conv)

    @classmethod
    def warmup_time(cls, trace: Trace, t_warm: float, end: float | None = None) -> Window:
        return cls(float(t_warm), np.inf if end is None else float(end), 0)

    def mask(self, trace: Trace) -> np.ndarray:
        t = trace["time"]
        return (t >= self.start) & (t <= self.end) & (trace["conv"] >= self.min_conv)
