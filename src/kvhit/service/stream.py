"""``stream``: a long trace simulated in bounded memory — a spec's stream trace generated in chunks, or a Parquet
trace read by row groups — pushed through Algorithm 1 (``policy="content"``) or the vLLM block pool
(``policy="block"``) whose state persists between chunks (:mod:`kvhit.sim.stream`); one state per capacity, one
pass over the trace. Reports the hit ratios, the time, the throughput and the process's peak RSS.

Invariant: the answer does not depend on ``chunk`` (only memory and speed do; tested bit for bit); every flag
given changes the answer or is refused (``--block-size``/``--engine`` with the content policy, a seed or spec
flags with ``--trace``, a warm-up that leaves nothing to measure, more events than the trace holds). NOT
modelled here: the simulators (:mod:`kvhit.sim.stream`); the stream trace of a spec is its own draw
(:mod:`kvhit.workload.chunks`), not ``kvhit trace generate``'s trace for the same seed.
"""

from __future__ import annotations

import math
import resource
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from kvhit.service.base import Response, check_capacity_memory
from kvhit.service.common import BlockEngine, Capacities, Seed
from kvhit.service.errors import InputError, translating
from kvhit.service.spec import TraceOrSpecFields, load_spec
from kvhit.service.steady import steady_note

__all__ = ["StreamRequest", "StreamResponse", "stream"]

#: the largest chunk a request may ask for (events held in memory at once)
MAX_CHUNK = 10**7


class StreamRequest(TraceOrSpecFields):
    """The inputs of ``kvhit stream``, validated: each field's description states its unit, range and default."""

    N: Capacities
    policy: Literal["content", "block"] = Field(
        "content", description="content (Algorithm 1, whole-conversation LRU) | block (vLLM prefix cache)."
    )
    engine: BlockEngine | None = Field(
        None, description="Block policy engine: vllm (≥ 0.24 order) | vllm-0.23; default: vllm."
    )
    events: int | None = Field(
        None,
        ge=1,
        le=10**11,
        description="Turn events (requests) to simulate, 1–10^11; required on a spec; default: every row of --trace.",
    )
    chunk: int = Field(
        250_000, ge=1, le=MAX_CHUNK, description="Events per chunk (memory, not the answer), 1–10^7; default: 250,000."
    )
    warmup: int | None = Field(
        None, ge=0, description="Leading events not measured (warm-up), ≥ 0; default: 10% of the events."
    )
    block_size: int | None = Field(
        None, ge=1, le=2**16, description="Block policy: tokens per block, 1–65,536; default: the trace's, else 128."
    )
    seed: Seed = 0

    FLAGS = {**TraceOrSpecFields.FLAGS, "N": "--N"}


class StreamResponse(Response):
    """The answer of ``kvhit stream`` (``--json`` prints it; strict JSON, ``null`` where a number is undefined)."""

    policy: str
    engine: str | None = None
    rows: list[dict[str, Any]] = Field(description="One row per capacity: h, request hit rate, evictions, state size…")
    events: int = Field(description="Turn events (requests) simulated.")
    warmup: int = Field(description="Leading events not measured.")
    chunk: int
    block_size: int | None = None
    block_accesses: int | None = Field(None, description="Block policy: blocks touched by admitted requests.")
    trace: str | None = None
    spec: dict[str, Any] | None = None
    seed: int | None = None
    elapsed_s: float = Field(description="Wall seconds: generation or reading plus every capacity's simulation.")
    events_per_s: float = Field(description="Events per wall second, every capacity included (one pass).")
    block_accesses_per_s: float | None = None
    peak_rss_mib: float = Field(description="Peak resident memory of this process so far (ru_maxrss), MiB.")
    stationarity: dict[str, Any] | None = Field(
        None,
        description="Whether the measured events were at steady state (active conversations over time, "
        "kvhit.workload.stationarity), judged in bounded memory on every conversation_sample-th conversation "
        "(conv id divisible by it; the reference scaled alike).",
    )
    notes: list[str] = Field(default_factory=list, description="Warnings: a window that did not reach steady state.")


#: at most about this many events are kept for the stationarity check (every K-th conversation's)
SAMPLE_EVENTS = 300_000


class _SteadySample:
    """Every ``K``-th conversation's events (``conv % K == 0``, K = ⌈events / SAMPLE_EVENTS⌉) as the chunks pass,
    each marked measured when its index in the stream is ≥ the warm-up: the stationarity check in bounded memory.
    Thinning the conversations by K divides the steady active count by K (λ0/K arrivals, the same durations)."""

    def __init__(self, n: int, warmup: int) -> None:
        self.K = max(1, math.ceil(n / SAMPLE_EVENTS))
        self.warmup, self.seen = int(warmup), 0
        self.t: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.m: list[np.ndarray] = []

    def wrap(self, chunks):
        for ch in chunks:
            sel = np.asarray(ch.conv) % self.K == 0
            idx = self.seen + np.flatnonzero(sel)
            self.t.append(np.asarray(ch.time, float)[sel])
            self.c.append(np.asarray(ch.conv)[sel])
            self.m.append(idx >= self.warmup)
            self.seen += len(ch)
            yield ch

    def report(self, reference: float | None) -> dict[str, Any]:
        from kvhit.workload.stationarity import check_window

        if not self.t:
            return check_window(np.zeros(0), np.zeros(0), np.zeros(0, bool)).to_dict() | {"conversation_sample": 1}
        ref = None if reference is None else reference / self.K
        d = check_window(np.concatenate(self.t), np.concatenate(self.c), np.concatenate(self.m), ref).to_dict()
        if self.K > 1:
            d["message"] += f" (counted on every {self.K:,}th conversation)"
        return d | {"conversation_sample": self.K}


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _spec_dict(sp) -> dict[str, Any]:
    from kvhit.workload import EmpiricalConversations

    if isinstance(sp.increments, EmpiricalConversations):
        return {"lam0": float(sp.lam0), "increments": "empirical", "name": sp.name}
    return sp.to_dict()


def stream(req: StreamRequest, progress=None) -> StreamResponse:
    """Run the request; ``progress(done, total, what)`` after each chunk (events done of the total)."""
    from kvhit.sim.stream import simulate_stream
    from kvhit.workload.chunks import parquet_chunks, parquet_rows, spec_chunks, trace_block_size

    req.check_source()
    if req.policy == "content":
        for name in ("engine", "block_size"):
            if getattr(req, name) is not None:
                raise InputError(f"{req.flag(name)}: applies to --policy block")
    else:
        for n in req.N:  # the block pool is O(N)
            check_capacity_memory(n, "--N")
    engine = req.engine or "vllm"
    Ns = list(dict.fromkeys(req.N))
    if req.trace is not None:
        if req.seed != 0:
            raise InputError("--seed: a trace file is read as it is (no random draw); drop --seed")
        path: Path = req.trace
        with translating(f"--trace {path}"):
            rows = parquet_rows(path)
        if rows == 0:
            raise InputError(f"--trace {path}: the trace has no rows (no turns to simulate or measure)")
        if req.events is not None and req.events > rows:
            raise InputError(f"--events: {req.events:,} events asked, the trace has {rows:,} rows")
        n = req.events if req.events is not None else rows
        b = req.block_size or trace_block_size(path) or 128
    else:
        if req.events is None:
            raise InputError("--events: required on a spec (its stream trace is endless)")
        sp = load_spec(req)
        n = req.events
        b = req.block_size or 128
    warmup = req.warmup if req.warmup is not None else n // 10
    if warmup >= n:
        raise InputError(f"--warmup: {warmup:,} warm-up events leave none of the {n:,} to measure")

    def tick(done: int) -> None:
        if progress is not None:
            progress(done, n, f"{req.policy} stream, {len(Ns)} capacit{'y' if len(Ns) == 1 else 'ies'}")

    where = f"--trace {req.trace}" if req.trace is not None else (str(req.spec) if req.spec else "spec")
    sample = _SteadySample(n, warmup)
    t0 = time.perf_counter()
    with translating(where):
        chunks = (
            parquet_chunks(req.trace, req.chunk, n)
            if req.trace is not None
            else spec_chunks(sp, req.seed, n, req.chunk)
        )
        results = simulate_stream(
            sample.wrap(chunks), Ns, policy=req.policy, engine=engine, block_size=b, warmup=warmup, progress=tick
        )
    dt = time.perf_counter() - t0
    ref = None
    if req.trace is None and hasattr(sp, "M"):  # a parametric spec: λ0·(E[M]−1)·E[W]; else the window's median
        from kvhit.workload.stationarity import spec_lifetime

        ref = spec_lifetime(sp)[2]
    steady = sample.report(ref)
    acc = results[0].block_accesses if req.policy == "block" else None
    return StreamResponse(
        policy=req.policy,
        engine=engine if req.policy == "block" else None,
        rows=[r.to_dict() for r in results],
        events=n,
        warmup=warmup,
        chunk=req.chunk,
        block_size=b if req.policy == "block" else None,
        block_accesses=acc,
        trace=str(req.trace) if req.trace is not None else None,
        spec=_spec_dict(sp) if req.trace is None else None,
        seed=req.seed if req.trace is None else None,
        elapsed_s=dt,
        events_per_s=n / dt if dt > 0 else float("nan"),
        block_accesses_per_s=(acc / dt if dt > 0 else float("nan")) if acc is not None else None,
        peak_rss_mib=_peak_rss_mib(),
        stationarity=steady,
        notes=steady_note(steady),
    )
