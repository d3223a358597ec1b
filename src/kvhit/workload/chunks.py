"""Traces in chunks: a spec's event stream generated piece by piece, or a Parquet trace read by row groups.

A trace of 10⁸ turn events does not fit in memory as columns (and need not): the streaming simulators
(:mod:`kvhit.sim.stream`) consume it as a sequence of :class:`EventChunk` s in time order. Two sources:

* :func:`spec_chunks` — the *stream trace* of a :class:`~kvhit.workload.spec.WorkloadSpec` and a seed: conversations
  are drawn in fixed blocks of :data:`CONVERSATIONS_PER_BLOCK` (block ``k`` from its own generator,
  ``SeedSequence(seed, spawn_key=(k,))``; arrivals continue the Poisson process of rate λ0 across blocks; M, Z and
  the gaps W as in :func:`~kvhit.workload.generate.generate`), and their turns are merged into time order
  through a pending pool that holds the not-yet-due turns of live conversations only. The first ``n_events``
  events in (time, conv, turn) order are emitted, in chunks of ``chunk`` events.
* :func:`parquet_chunks` — a kvhit Parquet trace read ``chunk`` rows at a time (Arrow record batches), each chunk
  checked by a streaming validator (:class:`StreamValidator`) that keeps one record per live conversation.

Invariant: the stream trace depends on ``(spec, seed, n_events)`` only — never on ``chunk`` — and
:func:`materialize` builds the same events as one :class:`~kvhit.workload.trace.Trace` by an independent path
(all blocks concatenated, sorted by ``Trace.from_columns``), so simulating the chunks equals simulating the
whole trace bit for bit (tested). Memory is bounded by the pending turns of live conversations plus two blocks,
not by ``n_events``.

NOT modelled: the stream trace is a different draw from ``generate(spec, seed, ...)`` with the same seed (that
function draws every M first, then every Z, which cannot be done block by block); both are exact samples of the
same model. A stream trace always starts empty (time 0, no conversation in flight): warm-up is the caller's
(``warmup`` events of :mod:`kvhit.sim.stream`). Horizon-based generation and ``max_turns`` are not offered.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from kvhit.workload.dists import SpecError
from kvhit.workload.intmap import map_capacity, map_delete, map_empty, map_find, map_put, map_rebuild
from kvhit.workload.spec import EmpiricalConversations, PromptResponse, WorkloadSpec
from kvhit.workload.trace import SCHEMA_VERSION, Trace, TraceError

__all__ = [
    "CONVERSATIONS_PER_BLOCK",
    "MAX_CHUNK",
    "EventChunk",
    "StreamValidator",
    "check_chunk_args",
    "materialize",
    "parquet_chunks",
    "parquet_rows",
    "spec_chunks",
    "trace_block_size",
]

#: conversations drawn per generator block (part of the stream trace's definition: changing it changes the trace)
CONVERSATIONS_PER_BLOCK = 16_384
#: the largest chunk accepted (events held at once)
MAX_CHUNK = 100_000_000
#: the most events one stream may ask for
MAX_EVENTS = 10**12

_COLS = ("conv", "turn", "M", "R", "Z", "time", "conv_arrival")


@dataclass(frozen=True)
class EventChunk:
    """Consecutive events of a time-sorted trace (one row per turn; columns as in :mod:`kvhit.workload.trace`).

    ``cum_tokens`` is present when the source knows token counts (a trace with that column), else ``None``.
    ``start`` is the index of the chunk's first event in the whole stream.
    """

    conv: np.ndarray  # int64
    turn: np.ndarray  # int64
    M: np.ndarray  # int64
    R: np.ndarray  # int64
    Z: np.ndarray  # int64
    time: np.ndarray  # float64
    conv_arrival: np.ndarray  # float64
    start: int = 0
    cum_tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.conv.shape[0])

    @property
    def last(self) -> np.ndarray:
        """True where the event is its conversation's final turn (``turn == M``): its state may be released."""
        return self.turn == self.M


def check_chunk_args(n_events, chunk) -> tuple[int | None, int]:
    """Validate ``n_events`` (a positive integer, or ``None`` = the whole source) and ``chunk`` (positive integer
    ≤ :data:`MAX_CHUNK`); integral floats (``1e8``) are accepted, anything else refused naming the argument."""

    def as_int(x, name: str, hi: int) -> int:
        if isinstance(x, bool | np.bool_):
            raise SpecError(f"{name} must be a positive integer, got {x!r}")
        if isinstance(x, float | np.floating):
            if not np.isfinite(x) or x != np.floor(x):
                raise SpecError(f"{name} must be a positive integer, got {x!r}")
            x = int(x)
        if not isinstance(x, int | np.integer):
            raise SpecError(f"{name} must be a positive integer, got {x!r}")
        x = int(x)
        if x < 1 or x > hi:
            raise SpecError(f"{name} must be an integer in [1, {hi:,}], got {x:,}")
        return x

    n = None if n_events is None else as_int(n_events, "n_events", MAX_EVENTS)
    return n, as_int(chunk, "chunk", MAX_CHUNK)


# ----------------------------------------------------------------------------------------------------------------
# the stream trace of a spec
# ----------------------------------------------------------------------------------------------------------------


def _block(spec: WorkloadSpec, seed: int, k: int, start: float) -> dict[str, np.ndarray]:
    """Conversations ``k·B … (k+1)·B − 1`` (B = :data:`CONVERSATIONS_PER_BLOCK`), arriving after ``start``, with all
    their turns in (conv, turn) order."""
    from kvhit.workload.generate import _timed_columns

    B = CONVERSATIONS_PER_BLOCK
    rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(int(k),)))
    arrivals = start + np.cumsum(rng.exponential(1.0 / float(spec.lam0), size=B))
    inc = spec.increments
    if isinstance(inc, EmpiricalConversations):
        M, Z = inc.draw(rng, B)
    else:
        M = spec.M.sample(rng, B).astype(np.int64)
        if isinstance(inc, PromptResponse):
            X, Y = inc.sample_xy(rng, M)
            Z = inc.z_from_xy(X, Y, M)
        else:
            Z = inc.sample(rng, M)
    if (M < 1).any():
        raise SpecError("turn distribution produced M < 1")
    if (Z < 1).any():
        raise SpecError("increment distribution produced Z_j < 1")
    cols = _timed_columns(rng, M, Z, arrivals, spec.interarrival)
    cols["conv"] = cols["conv"] + np.int64(k) * B
    cols["turn"] = cols["turn"].astype(np.int64)
    cols["M"] = cols["M"].astype(np.int64)
    return {c: cols[c] for c in _COLS}


def _take(cols: dict[str, np.ndarray], a: int, b: int, start: int) -> EventChunk:
    return EventChunk(**{c: cols[c][a:b] for c in _COLS}, start=start)


def spec_chunks(spec: WorkloadSpec, seed: int, n_events, chunk) -> Iterator[EventChunk]:
    """The first ``n_events`` events of the stream trace of ``(spec, seed)``, in chunks of ``chunk`` events (the
    last one shorter). See the module docstring; memory is O(chunk + pending turns + one block)."""
    n, chunk = check_chunk_args(n_events, chunk)
    if n is None:
        raise SpecError("n_events: a spec's stream is endless; give the number of events")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or int(seed) < 0:
        raise SpecError(f"seed must be an integer ≥ 0, got {seed!r}")
    emitted = 0
    buf: list[dict[str, np.ndarray]] = []  # due events not yet emitted (fewer than ``chunk``)
    nbuf = 0
    pending = {c: np.zeros(0, np.float64 if c in ("time", "conv_arrival") else np.int64) for c in _COLS}
    cur = _block(spec, seed, 0, 0.0)
    k = 0
    while emitted < n:
        nxt = _block(spec, seed, k + 1, float(cur["conv_arrival"][-1]))
        boundary = nxt["conv_arrival"][0]  # every later event is at or after it (and has a larger conv)
        merged = {c: np.concatenate([pending[c], cur[c]]) for c in _COLS}
        # pending is sorted and cur is (conv, turn)-ordered with conv above pending's: a stable sort by time
        # alone yields (time, conv, turn) order — the order of Trace.from_columns
        order = np.argsort(merged["time"], kind="stable")
        merged = {c: v[order] for c, v in merged.items()}
        cut = int(np.searchsorted(merged["time"], boundary, side="right"))
        due = {c: v[:cut] for c, v in merged.items()}
        pending = {c: v[cut:] for c, v in merged.items()}
        cur, k = nxt, k + 1
        pos = 0
        while pos < cut and emitted < n:
            take = min(cut - pos, chunk - nbuf, n - emitted - nbuf)
            buf.append({c: v[pos : pos + take] for c, v in due.items()})
            nbuf += take
            pos += take
            if nbuf == chunk or emitted + nbuf == n:
                out = buf[0] if len(buf) == 1 else {c: np.concatenate([b[c] for b in buf]) for c in _COLS}
                yield _take(out, 0, nbuf, emitted)
                emitted += nbuf
                buf, nbuf = [], 0


def materialize(spec: WorkloadSpec, seed: int, n_events) -> Trace:
    """The first ``n_events`` events of the stream trace of ``(spec, seed)`` as one :class:`Trace` — built without
    the streaming merge: blocks are drawn until the next block's first arrival lies beyond ``n_events`` due
    events, concatenated and sorted by :meth:`Trace.from_columns`. For tests and small sizes (memory O(n))."""
    n, _ = check_chunk_args(n_events, 1)
    if n is None:
        raise SpecError("n_events: required")
    blocks = [_block(spec, seed, 0, 0.0)]
    while True:
        nxt = _block(spec, seed, len(blocks), float(blocks[-1]["conv_arrival"][-1]))
        due = sum(int((b["time"] <= nxt["conv_arrival"][0]).sum()) for b in blocks)
        if due >= n:
            break
        blocks.append(nxt)
    cols = {c: np.concatenate([b[c] for b in blocks]) for c in _COLS}
    tr = Trace.from_columns(cols, {"source": "stream", "seed": int(seed), "lam0": float(spec.lam0)})
    return tr.select(np.arange(tr.n_turns) < n)


# ----------------------------------------------------------------------------------------------------------------
# streaming validation (Trace.validate, one chunk at a time)
# ----------------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _validate_kernel(conv, turn, M, R, Z, time, arr, tab, rec, frec, free, nfree, st, last_time):  # pragma: no cover
    """Check a chunk against the live-conversation records; return (bad row, code, n live, n free, last time).

    ``rec[s] = (turn, M, R)`` and ``frec[s] = (time, arrival)`` of the conversation in slot ``s``; a conversation's
    record is dropped at its last turn. Codes: 1 conv < 0, 2 turn < 1, 3 Z < 1, 4 turn > M, 5 time not finite or
    before arrival, 6 rows not sorted by time, 7 first seen at turn > 1, 8 turn gap, 9 R ≠ R_prev + Z,
    10 M or arrival differ between turns, 11 turn earlier than the previous one, 12 no free slot.
    """
    live = st[0]
    for i in range(conv.shape[0]):
        c = conv[i]
        t = turn[i]
        if c < 0:
            return i, 1, live, nfree, last_time
        if t < 1:
            return i, 2, live, nfree, last_time
        if Z[i] < 1:
            return i, 3, live, nfree, last_time
        if t > M[i]:
            return i, 4, live, nfree, last_time
        if not (np.isfinite(time[i]) and np.isfinite(arr[i])) or time[i] < arr[i]:
            return i, 5, live, nfree, last_time
        if time[i] < last_time:
            return i, 6, live, nfree, last_time
        last_time = time[i]
        j = map_find(c, tab)
        if j < 0:
            if t != 1:
                return i, 7, live, nfree, last_time
            if R[i] != Z[i]:
                return i, 9, live, nfree, last_time
            if t == M[i]:
                continue  # a one-turn conversation (or the last turn) needs no record
            if nfree == 0:
                return i, 12, live, nfree, last_time
            nfree -= 1
            s = free[nfree]
            map_put(-j - 1, c, s, tab)
            live += 1
        else:
            s = tab[j, 1]
            if t != rec[s, 0] + 1:
                return i, 8, live, nfree, last_time
            if R[i] != rec[s, 2] + Z[i]:
                return i, 9, live, nfree, last_time
            if M[i] != rec[s, 1] or arr[i] != frec[s, 1]:
                return i, 10, live, nfree, last_time
            if time[i] < frec[s, 0]:
                return i, 11, live, nfree, last_time
            if t == M[i]:
                map_delete(j, tab)
                free[nfree] = s
                nfree += 1
                live -= 1
                continue
        rec[s, 0] = t
        rec[s, 1] = M[i]
        rec[s, 2] = R[i]
        frec[s, 0] = time[i]
        frec[s, 1] = arr[i]
    return -1, 0, live, nfree, last_time


_CODES = {
    1: ("conv", "must be ≥ 0"),
    2: ("turn", "must be ≥ 1"),
    3: ("Z", "every turn must add at least one block (Z_j ≥ 1)"),
    4: ("M", "turn index exceeds the conversation's turn count M"),
    5: ("time", "not a finite number, or before its conversation's arrival"),
    6: ("time", "rows not sorted by time"),
    7: ("turn", "a conversation's first row must be turn 1"),
    8: ("turn", "turns of a conversation must be 1, 2, … without gaps or repeats"),
    9: ("R", "R_j must equal R_(j-1) + Z_j"),
    10: ("M", "M or conv_arrival differs between turns of one conversation"),
    11: ("time", "turn earlier than the previous turn"),
}


class StreamValidator:
    """:meth:`Trace.validate`'s per-row and per-conversation checks, one chunk at a time, with one record per live
    conversation (released at its last turn ``turn == M``). :meth:`check` raises :class:`TraceError` naming the
    row (index in the whole stream), the conversation and the column."""

    def __init__(self, where: str = "trace") -> None:
        self.where = where
        self._alloc(1024)
        self.live = 0
        self.last_time = -np.inf

    def _alloc(self, slots: int, old=None) -> None:
        tab = map_empty(map_capacity(slots))
        rec = np.zeros((slots, 3), np.int64)
        frec = np.zeros((slots, 2), np.float64)
        free = np.arange(slots - 1, -1, -1, dtype=np.int64)
        if old is not None:  # keep the live records (slots below the old size), free the new slots
            otab, orec, ofrec, ofree, onfree = old
            map_rebuild(otab, tab)
            rec[: orec.shape[0]] = orec
            frec[: ofrec.shape[0]] = ofrec
            free = np.concatenate([np.arange(slots - 1, orec.shape[0] - 1, -1, dtype=np.int64), ofree[:onfree]])
        self.tab, self.rec, self.frec = tab, rec, frec
        self.free = np.zeros(slots, np.int64)
        self.free[: free.size] = free
        self.nfree = int(free.size)

    def check(self, ch: EventChunk) -> None:
        need = self.live + len(ch)
        if need > self.rec.shape[0]:
            self._alloc(max(need, 2 * self.rec.shape[0]), (self.tab, self.rec, self.frec, self.free, self.nfree))
        bad, code, live, nfree, last = _validate_kernel(
            ch.conv, ch.turn, ch.M, ch.R, ch.Z, ch.time, ch.conv_arrival,
            self.tab, self.rec, self.frec, self.free, np.int64(self.nfree),
            np.array([self.live], np.int64), float(self.last_time),
        )  # fmt: skip
        self.live, self.nfree, self.last_time = int(live), int(nfree), float(last)
        if bad >= 0:
            if code == 12:  # pragma: no cover - capacity is ensured above
                raise AssertionError("stream validator table full")
            col, what = _CODES[int(code)]
            i = int(bad)
            raise TraceError(
                f"{self.where}: row {ch.start + i} (conv {int(ch.conv[i])}, turn {int(ch.turn[i])}), column {col!r}: "
                f"{what}"
            )


# ----------------------------------------------------------------------------------------------------------------
# Parquet by row groups
# ----------------------------------------------------------------------------------------------------------------


def parquet_chunks(path: str | Path, chunk, n_events=None) -> Iterator[EventChunk]:
    """A kvhit Parquet trace (:meth:`Trace.write`) read ``chunk`` rows at a time — the first ``n_events`` rows
    (all by default) — each chunk validated by a :class:`StreamValidator`. Memory is O(chunk + live
    conversations + one Parquet row group), whatever the file's length. Raises :class:`TraceError` naming the
    file (and row/column) on an unreadable file, a missing column, a null or a broken invariant."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    n, chunk = check_chunk_args(n_events, chunk)
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.is_dir():
        raise TraceError(f"{path}: is a directory, expected a Parquet trace file")
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise TraceError(f"{path}: not a readable Parquet file ({e})") from None
    raw = (pf.schema_arrow.metadata or {}).get(b"kvhit")
    if raw is None:
        raise TraceError(f"{path}: not a kvhit trace (no kvhit metadata in the Parquet schema)")
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"{path}: the kvhit metadata in the Parquet schema is not JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("schema_version") != SCHEMA_VERSION:
        got = meta.get("schema_version") if isinstance(meta, dict) else None
        raise TraceError(f"{path}: trace schema version {got!r}, this kvhit reads version {SCHEMA_VERSION}")
    names = set(pf.schema_arrow.names)
    missing = [c for c in _COLS if c not in names]
    if missing:
        raise TraceError(f"{path}: missing required column(s) {missing}")
    cols = list(_COLS) + (["cum_tokens"] if "cum_tokens" in names else [])
    val = StreamValidator(str(path))
    done = 0
    try:
        for batch in pf.iter_batches(batch_size=chunk, columns=cols):
            if n is not None and done >= n:
                break
            arrays = {}
            for name in cols:
                col = batch.column(name)
                if col.null_count:
                    i = int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
                    raise TraceError(f"{path}: row {done + i}, column {name!r}: missing value")
                a = col.to_numpy(zero_copy_only=False)
                want = np.float64 if name in ("time", "conv_arrival") else np.int64
                if a.dtype.kind not in ("f" if want is np.float64 else "iu"):
                    raise TraceError(f"{path}: column {name!r} must be {np.dtype(want).name}-like, got {a.dtype}")
                arrays[name] = np.ascontiguousarray(a, dtype=want)
            m = len(batch) if n is None else min(len(batch), n - done)
            ch = EventChunk(
                **{c: arrays[c][:m] for c in _COLS},
                start=done,
                cum_tokens=arrays["cum_tokens"][:m] if "cum_tokens" in arrays else None,
            )
            val.check(ch)
            yield ch
            done += m
    except (pa.ArrowInvalid, OSError) as e:
        raise TraceError(f"{path}: unreadable Parquet data at row {done} ({e})") from None


def trace_block_size(path: str | Path) -> int | None:
    """The ``block_size`` recorded in a Parquet trace's kvhit metadata (``None`` when absent or unreadable)."""
    import json

    import pyarrow.parquet as pq

    try:
        raw = (pq.ParquetFile(path).schema_arrow.metadata or {}).get(b"kvhit")
        b = json.loads(raw).get("block_size") if raw else None
        return int(b) if b is not None else None
    except Exception:  # noqa: BLE001 - parquet_chunks reports unreadable files with their cause
        return None


def parquet_rows(path: str | Path) -> int:
    """Rows of a Parquet file from its footer (no data read); :class:`TraceError` if unreadable."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.is_dir():
        raise TraceError(f"{path}: is a directory, expected a Parquet trace file")
    try:
        return int(pq.ParquetFile(path).metadata.num_rows)
    except (pa.ArrowInvalid, OSError) as e:
        raise TraceError(f"{path}: not a readable Parquet file ({e})") from None
