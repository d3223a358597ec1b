"""The engine's step clock from a vLLM server's KV-cache events: observed step ends for the scheduler model.

vLLM 0.32.0 (``--kv-events-config``, ZMQ publisher) publishes one ``KVEventBatch`` per engine step that stored or
removed a block, stamped with ``time.time()`` at the step's end (``vllm/v1/core/sched/scheduler.py``
``Scheduler.update_from_output``: ``KVEventBatch(ts=time.time(), events=…)``, after the step has run; the events
are those ``allocate_slots`` produced while scheduling it). ``live/kv_events.py record`` keeps the batches and
``decode`` writes them as JSON lines ``{"ts": UNIX, "ev": [["S", [hash…], parent, [token id…]] | ["R", [hash…]] |
["C"], …]}`` — the format read here (:func:`read_kv_events`).

A ``BlockStored`` carries its blocks' token ids and its parent's hash, so each stored block is known by its token
prefix (a chain of SHA-1 over the token ids, no knowledge of vLLM's hash function needed), the same key as a
request's blocks computed from its prompt and returned tokens. :func:`step_marks` turns the batches into the
scheduler model's ``marks`` (:func:`kvhit.sim.vllm.scheduler.simulate_schedule`): for each request, each full
block of its sequence whose prefix appears in **no** request that reached the server before it (a block that only
this request can compute: nobody cached it earlier, so it is not a hit, and the engine stores it in the step that
computes it) is paired with the first batch, after the last cache reset before the run, that stores that prefix —
"the step in which this request's computed tokens reached ``(i + 1) · b`` ended at ``ts``". Blocks shared with an
earlier request are left out (who stored them, and when, is ambiguous); so are steps that only removed blocks
(which step of the model's they are depends on the model's own eviction order).

Invariant: a file either parses completely or is refused with its name and line (:class:`KvEventsError`); a
mark's time is the ``ts`` of an actual batch; marks per request are increasing in tokens.

Not modelled: steps that store nothing new (most decode steps: their ends are not published; the model's own
step rule paces them), and a block stored twice in one run before the request's own store (cannot happen for a
new prefix).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["KvEventsError", "prefix_keys", "read_kv_events", "step_marks"]


class KvEventsError(ValueError):
    """A KV-events file that cannot be read as vLLM's event batches (the message names the file and the line)."""


def _key(base: bytes, toks) -> bytes:
    return hashlib.sha1(base + np.asarray(toks, np.int64).tobytes()).digest()


def prefix_keys(tokens, block_size: int) -> list[bytes]:
    """The prefix key of each full block of ``tokens`` (block ``i``: a chained SHA-1 of tokens ``[0, (i+1)·b)``)."""
    t = np.asarray(tokens, np.int64)
    base, out = b"", []
    for i in range(t.shape[0] // block_size):
        base = _key(base, t[i * block_size : (i + 1) * block_size])
        out.append(base)
    return out


def read_kv_events(path, block_size: int) -> list[tuple[float, list[bytes], bool]]:
    """The batches of ``path`` in file order: ``(ts, prefix keys stored, reset)`` — ``reset``: the batch cleared
    the cache (``AllBlocksCleared``: a prefix-cache reset, published with the next step's batch, so the keys are
    those stored after it). Removals are read for validity only."""
    p = Path(path)
    try:
        fh = p.open(encoding="utf-8")
    except OSError as e:
        raise KvEventsError(f"--kv-events {p}: cannot be read ({e.strerror or e})") from None
    b = int(block_size)
    prefix: dict[object, bytes] = {}
    out: list[tuple[float, list[bytes], bool]] = []
    last = -math.inf
    with fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"--kv-events {p}, line {i}"
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise KvEventsError(
                    f"{where}: not a JSON object (live/kv_events.py decode writes one per line)"
                ) from None
            if not isinstance(rec, dict) or not isinstance(rec.get("ev"), list):
                raise KvEventsError(f"{where}: expected {{'ts': …, 'ev': [...]}} (live/kv_events.py decode)")
            ts = rec.get("ts")
            if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
                raise KvEventsError(f"{where}: 'ts' must be a finite Unix time, got {ts!r}")
            if ts < last:
                raise KvEventsError(
                    f"{where}: 'ts' {ts} is earlier than the previous batch's ({last}); batches are in order"
                )
            last = float(ts)
            stored: list[bytes] = []
            reset = False
            for ev in rec["ev"]:
                kind = ev[0] if isinstance(ev, list) and ev else None
                if kind == "C":
                    stored, reset = [], True
                    prefix.clear()
                elif kind == "S":
                    if len(ev) != 4 or not isinstance(ev[1], list) or not isinstance(ev[3], list):
                        raise KvEventsError(f"{where}: a stored event must be ['S', hashes, parent, token ids]")
                    hashes, parent, toks = ev[1], ev[2], ev[3]
                    if len(toks) != len(hashes) * b or not all(isinstance(x, int) for x in toks):
                        raise KvEventsError(
                            f"{where}: a stored event of {len(hashes)} blocks has {len(toks)} token ids, expected "
                            f"{len(hashes) * b} integers (block size {b}: the server's?)"
                        )
                    base = prefix.get(parent, b"") if parent is not None else b""
                    for j, h in enumerate(hashes):
                        base = _key(base, toks[j * b : (j + 1) * b])
                        prefix[h] = base
                        stored.append(base)
                elif kind == "R":
                    if len(ev) != 2 or not isinstance(ev[1], list):
                        raise KvEventsError(f"{where}: a removed event must be ['R', hashes]")
                else:
                    raise KvEventsError(f"{where}: unknown event {str(ev)[:60]!r} (expected 'S', 'R' or 'C')")
            out.append((last, stored, reset))
    if not out:
        raise KvEventsError(f"--kv-events {p}: no event batches")
    return out


def step_marks(
    sequences: Sequence, server_added, batches, block_size: int, *, path="--kv-events"
) -> tuple[list[list[tuple[int, float]]], dict]:
    """Per request, its step marks ``[(tokens, Unix time), …]`` from ``batches`` (:func:`read_kv_events`), and
    counts. ``sequences[r]``: request ``r``'s tokens that get KV (prompt + returned tokens but the last);
    ``server_added[r]``: its arrival at the server (Unix). Only the batches from the run's cache reset on are
    used: the last reset published up to the first batch that ends after the earliest arrival (vLLM publishes a
    reset with the next step's batch: a replay's reset comes with its first step, which ends after the first
    arrival), only its stores after the reset; a run with no store is refused (:class:`KvEventsError`)."""
    b = int(block_size)
    added = np.asarray(server_added, np.float64)
    n = len(sequences)
    t0 = float(np.min(added)) if n else 0.0
    start = 0
    for j, (ts, _st, reset) in enumerate(batches):
        if reset:
            start = j
        if ts > t0:
            break
    first_store: dict[bytes, float] = {}
    for ts, st, _reset in batches[start:]:
        for k in st:
            first_store.setdefault(k, ts)
    if not first_store:
        raise KvEventsError(f"{path}: no stored block after the run's start (is it this run's events file?)")
    keys = [prefix_keys(s, b) for s in sequences]
    seen: set[bytes] = set()
    marks: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    new_blocks = found = 0
    for r in np.argsort(added, kind="stable"):
        own = keys[r]
        for i, k in enumerate(own):
            if k in seen:
                continue
            new_blocks += 1
            t = first_store.get(k)
            if t is not None and t >= t0:
                found += 1
                marks[r].append(((i + 1) * b, t))
        seen.update(own)
    info = {"batches": len(batches) - start, "new_blocks": new_blocks, "marks": found}
    return marks, info
