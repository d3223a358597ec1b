"""Step-wise engine models: one request at a time, every cache decision inspectable.

This is the one interface through which kvhit drives an engine's prefix cache step by step. The bulk
simulators (:func:`kvhit.sim.vllm.block.simulate_block`, compiled) stay the fast path for long traces; an
:class:`Engine` is the same model as a Python object that answers, for each request, what hit, what was
allocated and what was evicted, and shows the eviction order at any moment. It is what the conformance
suite (``conformance/``) drives side by side with the engines' own cache code, what a user debugging a
miss inspects, and what wrappers compose onto (a host-memory tier wraps an :class:`Engine`; a fleet routes
requests over several).

Protocol (:class:`Engine`)
--------------------------
* ``fits(req)`` – whether the request could ever run on an empty pool (else the driver *rejects* it,
  no state change, like an engine rejecting a prompt longer than its KV cache).
* ``submit(req)`` – admission: lookup, allocation (evicting what the engine evicts) and caching of what
  the engine caches at admission. Returns a :class:`RequestOutcome`, or ``None`` when the request does
  not fit *now* (pool state unchanged, except where the engine itself changes state on a failed
  admission — documented by the engine). The request then holds its blocks until ``finish``.
* ``finish(rid)`` – the request completes: its blocks are released (and, for engines that cache
  responses, its output is inserted). Returns a :class:`FinishOutcome`.
* ``eviction_order()`` – the cached content ids in the order the engine would evict them now (first =
  next victim); ``in_use()`` – units held by running requests.

Units: ``capacity`` and the counts are in the engine's allocation unit (``unit``: ``"block"`` for vLLM).
Hit tokens are always tokens.

:func:`replay` is the discrete-event driver shared by every engine and by the conformance adapters around
real engine code (so a difference found there is a difference of the cache, never of the driver). Its
rules are those of :func:`kvhit.sim.vllm.block.simulate_block`: without ``hold`` each request is submitted
and finished at once; with ``hold`` request ``r`` arrives at ``times[r]``, waits FIFO behind earlier
waiting requests (head-of-line blocking, vLLM's FCFS queue), is re-tried whenever something finishes,
and finishes at ``start + hold[r]``; at equal times finishes come before arrivals, in (time, index)
order.

Not modelled here: whatever the wrapped engine model does not model (see its docstring).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Engine",
    "FinishOutcome",
    "ReplayResult",
    "Request",
    "RequestOutcome",
    "replay",
    "requests_from_stream",
]


@dataclass(frozen=True)
class Request:
    """One request as an engine sees it.

    ``prompt_tokens`` – ``T``, the whole prompt (history + new turn). ``output_tokens`` – tokens generated
    (kept in the cache by engines/modes that keep response KV). ``block_hashes`` – chained ids of the
    full blocks of the allocated tokens (:mod:`kvhit.sim.vllm.blockids`; ``L // b`` of them, ``L = T`` or
    ``T + output`` when colocated) — what block-hash engines (vLLM) key on. ``token_ids`` – the content
    token by token (prompt then output) for engines that key on tokens (radix trees); optional.
    """

    rid: int
    prompt_tokens: int
    block_hashes: tuple[int, ...] = ()
    output_tokens: int = 0
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class RequestOutcome:
    """What admission did: ``hit_tokens`` reused, ``hit_units`` (blocks/pages) hit, the physical
    ``new_blocks`` allocated (engine ids), the content ids ``evicted`` to make room (in eviction order)
    and ``evicted_units`` (blocks, or tokens for token-granular engines)."""

    rid: int
    hit_tokens: int
    hit_units: int
    new_blocks: tuple[int, ...]
    evicted: tuple = ()
    evicted_units: int = 0


@dataclass(frozen=True)
class FinishOutcome:
    """What ``finish`` did: units returned to the free pool, content ids inserted and evicted."""

    rid: int
    freed_units: int
    inserted: tuple = ()
    evicted: tuple = ()
    evicted_units: int = 0


@runtime_checkable
class Engine(Protocol):
    """Step-wise prefix-cache model (see module docstring)."""

    name: str
    unit: str
    capacity: int

    def fits(self, req: Request) -> bool: ...

    def submit(self, req: Request) -> RequestOutcome | None: ...

    def finish(self, rid: int) -> FinishOutcome: ...

    def eviction_order(self) -> list: ...

    def in_use(self) -> int: ...


@dataclass
class ReplayResult:
    """Per-request outcomes of :func:`replay` (``outcomes[r]`` is None for a rejected request)."""

    outcomes: list[RequestOutcome | None]
    finishes: list[FinishOutcome | None]
    wait: np.ndarray
    rejected: np.ndarray
    peak_in_use: int
    events: list = field(default_factory=list)  #: ("submit"|"finish"|"reject", rid, time) in order

    @property
    def hit_tokens(self) -> np.ndarray:
        return np.array([o.hit_tokens if o else 0 for o in self.outcomes], np.int64)

    @property
    def hit_units(self) -> np.ndarray:
        return np.array([o.hit_units if o else 0 for o in self.outcomes], np.int64)

    @property
    def new_units(self) -> np.ndarray:
        return np.array([len(o.new_blocks) if o else 0 for o in self.outcomes], np.int64)

    @property
    def evicted_units(self) -> int:
        return sum(o.evicted_units for o in self.outcomes if o) + sum(f.evicted_units for f in self.finishes if f)


def replay(engine: Engine, requests: Sequence[Request], times=None, hold=None, on_event=None) -> ReplayResult:
    """Drive ``engine`` through ``requests`` (arrival order); see the module docstring for the rules.

    ``on_event(kind, rid, outcome)`` is called after every submit/finish/reject (inspection hook: the
    conformance suite compares eviction orders there).
    """
    n = len(requests)
    outcomes: list[RequestOutcome | None] = [None] * n
    finishes: list[FinishOutcome | None] = [None] * n
    wait = np.zeros(n, np.float64)
    rejected = np.zeros(n, bool)
    events: list = []
    peak = 0

    def note(kind, r, out, now):
        events.append((kind, r, now))
        if on_event is not None:
            on_event(kind, r, out)

    def reject(r, now):
        rejected[r] = True
        wait[r] = np.nan
        note("reject", r, None, now)

    if hold is None:
        for r, req in enumerate(requests):
            if not engine.fits(req):
                reject(r, 0.0)
                continue
            out = engine.submit(req)
            if out is None:  # an empty pool between instantaneous requests: only a faulty engine refuses
                raise RuntimeError(f"engine {engine.name} refused request {r} on an idle pool")
            outcomes[r] = out
            note("submit", r, out, 0.0)
            peak = max(peak, engine.in_use())
            finishes[r] = engine.finish(req.rid)
            note("finish", r, finishes[r], 0.0)
        return ReplayResult(outcomes, finishes, wait, rejected, peak, events)

    tm = [float(x) for x in np.asarray(times, np.float64)]
    hd = [float(x) for x in np.asarray(hold, np.float64)]
    if len(tm) != n or len(hd) != n:
        raise ValueError(f"times/hold: expected {n} values each, got {len(tm)} and {len(hd)}")
    running: list[tuple[float, int]] = []
    waiting: deque[int] = deque()
    r = 0
    while r < n or running:
        if running and (r >= n or running[0][0] <= tm[r]):
            now, f = heapq.heappop(running)
            finishes[f] = engine.finish(requests[f].rid)
            note("finish", f, finishes[f], now)
        else:
            now = tm[r]
            if engine.fits(requests[r]):
                waiting.append(r)
            else:
                reject(r, now)
            r += 1
        while waiting:
            w = waiting[0]
            out = engine.submit(requests[w])
            if out is None:
                break
            waiting.popleft()
            outcomes[w] = out
            wait[w] = now - tm[w]
            note("submit", w, out, now)
            peak = max(peak, engine.in_use())
            heapq.heappush(running, (now + hd[w], w))
    return ReplayResult(outcomes, finishes, wait, rejected, peak, events)


def requests_from_stream(prompt_tokens, hash_offsets, hashes, response_tokens=None) -> list[Request]:
    """The CSR stream of :func:`kvhit.sim.vllm.block.simulate_block` as a list of :class:`Request` (``rid`` =
    index; ``output_tokens`` = ``response_tokens`` when given, i.e. the colocated mode)."""
    T = np.asarray(prompt_tokens, np.int64)
    off = np.asarray(hash_offsets, np.int64)
    hs = np.asarray(hashes)
    hs = hs.view(np.int64) if hs.dtype == np.uint64 else hs.astype(np.int64)
    resp = np.zeros_like(T) if response_tokens is None else np.asarray(response_tokens, np.int64)
    return [
        Request(
            rid=r,
            prompt_tokens=int(T[r]),
            block_hashes=tuple(int(x) for x in hs[off[r] : off[r + 1]]),
            output_tokens=int(resp[r]),
        )
        for r in range(T.shape[0])
    ]
