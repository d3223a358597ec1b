"""Reading a command's workload inputs — a kvhit trace, a production block-id trace — with refusals that name
the file and flag, and the measurement-window rules shared by ``simulate``, ``curve`` and ``trace stats``.

Invariant: an input that yields nothing to measure (zero rows, a warm-up that covers the whole trace, an empty
production trace) is refused here with the reason, never turned into a table of NaN.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from kvhit.service.errors import InputError, translating

__all__ = [
    "read_trace",
    "load_trace_file",
    "load_production_file",
    "preload_trace",
    "window_for",
    "measured_moments",
    "read_blocks_trace",
]

#: Traces already in memory, by path: a sweep worker (:mod:`kvhit.sweep`) installs the workloads shipped to it
#: once, so that the requests of its points, which name a trace file, do not read the file again per point.
_PRELOADED: dict[str, object] = {}


def preload_trace(path: Path, trace) -> None:
    """Serve ``trace`` for ``path`` from memory in :func:`read_trace` / :func:`load_trace_file` (this process);
    ``trace=None`` forgets it."""
    if trace is None:
        _PRELOADED.pop(str(path), None)
    else:
        _PRELOADED[str(path)] = trace


def load_trace_file(path: Path):
    """``Trace.read(path)``, or a preloaded trace (each call gets its own ``cols``/``meta``/``lists`` dicts, so a
    caller's changes do not reach the preloaded one; the column arrays are shared and never written)."""
    from kvhit.workload import Trace

    tr = _PRELOADED.get(str(path))
    if tr is None:
        return Trace.read(path)
    return dataclasses.replace(tr, cols=dict(tr.cols), meta=dict(tr.meta), lists=dict(tr.lists))


def load_production_file(path: Path, **kw):
    """``read_production(path, **kw)``, or the preloaded production trace of ``path`` when the read asks for its
    own arrival times (sequential, no rate/span: what was preloaded); a Mooncake ``.jsonl`` read with no options
    goes through :func:`kvhit.workload.production_cache.read_mooncake_cached` (equal to a fresh read)."""
    from kvhit.workload.production import read_production

    pt = _PRELOADED.get(str(path))
    own = kw.get("arrival", "sequential") == "sequential" and kw.get("rate") is None and kw.get("span") is None
    if pt is not None and own:
        return pt
    if not kw and Path(path).suffix == ".jsonl" and Path(path).is_file():
        from kvhit.workload.production_cache import read_mooncake_cached

        return read_mooncake_cached(path)  # parsed once per file and reader version (a columnar cache)
    return read_production(path, **kw)


def read_trace(path: Path, flag: str = "--trace"):
    """A validated :class:`~kvhit.workload.Trace`; zero-row traces refused."""
    if str(path) in _PRELOADED:
        return load_trace_file(path)
    if path.is_dir() or path.suffix in (".json", ".jsonl"):
        raise InputError(
            f"{flag} {path}: reads kvhit Parquet traces; this looks like a production block-id trace (Mooncake "
            ".jsonl, WEKA .json file or directory): use --blocks-trace"
        )
    with translating(f"{flag} {path}"):
        tr = load_trace_file(path)
    if tr.n_turns == 0:
        raise InputError(f"{flag} {path}: the trace has no rows (no turns to simulate or measure)")
    return tr


def window_for(tr, warmup: int | None, warmup_time: float | None, where: str = ""):
    """The measurement window: ``warmup`` conversations (default: the trace's ``n_warm``) or ``warmup_time``
    seconds; a warm-up that leaves nothing to measure is refused."""
    from kvhit.workload import Window

    if warmup is not None and warmup_time is not None:
        raise InputError("--warmup and --warmup-time: give one warm-up, not both")
    if warmup_time is not None:
        t_last = float(tr["time"].max())
        if warmup_time > t_last:
            raise InputError(
                f"--warmup-time: {warmup_time:g} s is after the last turn of {where or 'the trace'} "
                f"(at {t_last:,.1f} s); nothing would be measured"
            )
        return Window.warmup_time(tr, warmup_time)
    n_warm = warmup if warmup is not None else int(tr.meta.get("n_warm", 0))
    if n_warm >= tr.n_conversations:
        flag = "--warmup" if warmup is not None else f"{where}: metadata n_warm"
        raise InputError(
            f"{flag}: a warm-up of {n_warm:,} conversations leaves none of the trace's "
            f"{tr.n_conversations:,} to measure"
        )
    return Window.warmup_conversations(tr, n_warm) if n_warm > 0 else Window.all()


def measured_moments(tr, window):
    """Eq. (35)–(37) over the measured conversations (those arriving inside the window, i.e. after the warm-up),
    and λ0: the trace's recorded rate when it has one, else the Poisson estimate from those arrivals."""
    from kvhit.estimate.trace_stats import trace_moments

    conv = tr.conversations()
    sel = (conv["arrival"] >= window.start) & (conv["arrival"] <= window.end)
    mom = trace_moments(tr, conv["conv"][sel])
    lam0 = float(tr.meta["lam0"]) if "lam0" in tr.meta else mom.lam0_hat
    return mom, lam0


def read_blocks_trace(path: Path, arrival: str, rate: float | None, span: float | None, seed: int):
    """A production block-id trace (Mooncake .jsonl, WEKA .json file or directory); empty traces refused."""
    kw: dict = {}
    if path.is_dir() or path.suffix == ".json":
        kw = {"arrival": arrival, "rate": rate, "span": span, "seed": seed}
    elif arrival != "sequential" or rate is not None or span is not None:
        raise InputError(f"--arrival/--rate/--span: apply to WEKA .json traces, not to {path.name}")
    with translating(f"--blocks-trace {path}"):
        pt = load_production_file(path, **kw)
    if pt.n_requests == 0:
        raise InputError(f"--blocks-trace {path}: no requests in the trace (nothing to simulate)")
    return pt


def production_mask(pt, warmup_time: float | None) -> np.ndarray:
    """Requests measured after a warm-up of ``warmup_time`` seconds from the first request."""
    if warmup_time is None:
        return np.ones(pt.n_requests, bool)
    mask = pt.time >= pt.time[0] + warmup_time
    if not mask.any():
        raise InputError(
            f"--warmup-time: {warmup_time:g} s is longer than the trace "
            f"({float(pt.time[-1] - pt.time[0]):,.1f} s); nothing would be measured"
        )
    return mask


def production_notes(pt) -> list[str]:
    """What a user must know about how a production trace was read (re-sorting, re-chaining, skipped records)."""
    notes = []
    k = int(pt.meta.get("out_of_order", 0) or 0)
    if k:
        notes.append(
            f"{k:,} request(s) were out of time order in the file and were sorted by timestamp "
            f"(requests with equal timestamps keep their file order)"
        )
    if getattr(pt, "rechained", False):
        notes.append("block ids did not form prefix chains and were re-chained")
    if getattr(pt, "skipped", ()):
        notes.append(f"{len(pt.skipped):,} malformed record(s) skipped (first: {pt.skipped[0][1]}: {pt.skipped[0][2]})")
    return notes
