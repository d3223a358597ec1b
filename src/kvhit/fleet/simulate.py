"""A fleet: R replicas, each an :class:`~kvhit.sim.engine.Engine` with its own ``N``, behind a router.

Invariant. Each replica is exactly the single-replica model of :mod:`kvhit.sim.vllm.block` (the same engine
objects, driven by the same rules as :func:`kvhit.sim.engine.replay`): request ``r`` arrives at
``times[r]``, is routed at once (:mod:`kvhit.fleet.routers`), is *rejected* if it could never fit its
replica (``⌈L/b⌉ > N_k``), else waits FIFO in that replica's queue (head-of-line blocking), is admitted when
the replica's pool allows, and holds its blocks until ``start + hold[r]``. Events are processed in global
time order, finishes before arrivals at equal times, finishes in (time, request index) order; after every
event the affected replica retries its queue. Without ``hold`` every request is instantaneous (loads are
then always zero, so load-based routers fall back to their tie-breaks). So, for a router that ignores load
and cache (``oblivious``: round-robin, random, session ring), the fleet is exactly R independent
single-replica simulations of the routed sub-streams: :func:`simulate_fleet` then routes first and runs the
compiled :func:`kvhit.sim.vllm.block.simulate_block` per replica (``fast=True``, tested equal to the step-wise
path) — or, with ``hit_token_seconds > 0`` (which ``simulate_block`` has not), the compiled fleet pass with those
routes fixed. The load- and cache-aware routers (sticky, least-loaded, Dynamo, llm-d, SGLang) run by default in one
compiled pass over R compiled pools (:mod:`kvhit.fleet.compiled`, tested equal request by request to the
step-wise path, which stays as the reference: ``fast=False``).

Load signals the router reads (per replica): in-flight requests (routed, not finished), outstanding prefill
tokens (``T`` while waiting, ``T − hit`` while running), active blocks (``⌈L/b⌉`` of in-flight requests),
KV usage ``in_use/N``. With ``lag > 0`` they are snapshots taken at the multiples of ``lag`` (a scrape
interval): the router at time ``t`` sees the state at ``⌊t/lag⌋·lag``. Cache overlaps (precise KV-aware
routers) are always current (KV events).

Per-request timing (optional, both need ``hold``). ``prefill_hold[r]`` (``0 ≤ prefill_hold ≤ hold``) ends request
r's prefill at ``start + prefill_hold[r]``: its outstanding prefill tokens leave the router's load then (a
*prefill-done* event, which touches no block), while its blocks, its active blocks and its in-flight count stay
until ``start + hold[r]`` — Dynamo's router, which drops a request's prefill tokens when its first token comes
back (``MarkPrefillCompleted``) and its active blocks when it finishes (``Free``). Without it the prefill tokens
stay until the finish. ``hit_token_seconds`` (s per cached prompt token, ≥ 0) shortens both holds of a request
by ``hit_token_seconds · hit_tokens`` (clipped at 0), known only at admission: the prefill a cached prefix saves
(an engine whose prefill time grows with the uncached tokens). Prefill-done events sort with the finishes by
(time, ``n + r``): after every finish at the same time, before arrivals at that time; they retry no
queue.

Outputs (:class:`FleetResult`): per request the replica, hit blocks, new blocks, wait, rejection; fleet and
per-replica token hit ratio (vLLM's ``hits/queries`` over admitted requests), load imbalance (max/mean of
requests and of prefill tokens computed), mean queueing delay, rejected requests.

NOT modelled: network/transfer between replicas, replica failures, router replicas, the router's own latency,
and anything the engine model does not model (see :mod:`kvhit.sim.vllm.block`).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

import numpy as np

from kvhit.fleet.compiled import COMPILED_ROUTERS, simulate_compiled
from kvhit.fleet.routers import RouteView, make_router
from kvhit.sim.engine import Request
from kvhit.sim.registry import make_engine
from kvhit.sim.vllm.block import ENGINES, simulate_block
from kvhit.workload.requests import kv_tokens

__all__ = ["FleetResult", "simulate_fleet"]


@dataclass(frozen=True)
class FleetResult:
    """Per-request outcome of a fleet run (arrays in input order) and the replicas' capacities."""

    replica: np.ndarray
    hit_blocks: np.ndarray
    new_blocks: np.ndarray
    wait: np.ndarray
    rejected: np.ndarray
    prompt_tokens: np.ndarray
    block_size: int
    Ns: tuple
    router: str
    block_ops: int = 0  #: fast path: simulate_block's count; step-wise: the pools' counters (router probes too)
    router_ops: int = 0  #: compiled KV-aware pass: the router's probes of the replicas' caches (not in block_ops)

    @property
    def R(self) -> int:
        return len(self.Ns)

    def _m(self, mask):
        m = np.ones(self.replica.shape[0], bool) if mask is None else np.asarray(mask, bool)
        return m & ~self.rejected

    def token_hit_ratio(self, mask=None) -> float:
        m = self._m(mask)
        den = int(self.prompt_tokens[m].sum())
        return float((self.hit_blocks[m] * self.block_size).sum() / den) if den else float("nan")

    def per_replica(self, mask=None) -> list[dict]:
        """Per replica: requests, token hit ratio, prefill tokens computed (``T − hit tokens``), mean wait."""
        m = self._m(mask)
        rows = []
        for k in range(self.R):
            s = m & (self.replica == k)
            T = int(self.prompt_tokens[s].sum())
            hit = int((self.hit_blocks[s] * self.block_size).sum())
            w = self.wait[s]
            rows.append(
                {
                    "replica": k,
                    "N": int(self.Ns[k]),
                    "requests": int(s.sum()),
                    "token_hit_ratio": hit / T if T else float("nan"),
                    "prefill_tokens": T - hit,
                    "mean_wait": float(w.mean()) if w.size else float("nan"),
                }
            )
        return rows

    def summary(self, mask=None) -> dict:
        m = self._m(mask)
        rows = self.per_replica(mask)
        req = np.array([r["requests"] for r in rows], float)
        pre = np.array([r["prefill_tokens"] for r in rows], float)
        meas = np.ones_like(m) if mask is None else np.asarray(mask, bool)
        return {
            "router": self.router,
            "replicas": self.R,
            "token_hit_ratio": self.token_hit_ratio(mask),
            "imbalance_requests": float(req.max() / req.mean()) if req.mean() > 0 else float("nan"),
            "imbalance_prefill_tokens": float(pre.max() / pre.mean()) if pre.mean() > 0 else float("nan"),
            "prefill_tokens": int(pre.sum()),
            "mean_wait": float(self.wait[m].mean()) if m.any() else float("nan"),
            "rejected": int((self.rejected & meas).sum()),
            "requests": int(meas.sum()),
        }


def _stream(prompt_tokens, hash_offsets, hashes, response_tokens, colocated):
    T = np.asarray(prompt_tokens, np.int64)
    off = np.asarray(hash_offsets, np.int64)
    hs = np.asarray(hashes)
    hs = hs.view(np.int64) if hs.dtype == np.uint64 else hs.astype(np.int64)
    L = kv_tokens(T, response_tokens) if colocated else T
    return T, L, off, hs


def simulate_fleet(
    prompt_tokens,
    hash_offsets,
    hashes,
    conv,
    *,
    Ns,
    block_size: int,
    router: str = "round-robin",
    router_params: dict | None = None,
    engine: str = "vllm",
    colocated: bool = False,
    response_tokens=None,
    times=None,
    hold=None,
    seed: int = 0,
    lag: float = 0.0,
    fast: bool | None = None,
    prefill_hold=None,
    hit_token_seconds: float = 0.0,
) -> FleetResult:
    """Route a request stream over ``len(Ns)`` replicas (``Ns[k]`` usable blocks each) and simulate them.

    The stream is :func:`kvhit.sim.vllm.block.simulate_block`'s (CSR block hashes, ``L // b`` per request);
    ``conv[r]`` is request ``r``'s conversation id (session routers key on it). ``fast=None`` (or ``True``)
    uses a compiled path: per replica when the router is oblivious, else the compiled fleet pass
    (:mod:`kvhit.fleet.compiled`); ``fast=False`` forces the step-wise path (the reference). ``prefill_hold`` and
    ``hit_token_seconds``: the per-request timing of the module docstring (an oblivious router with
    ``hit_token_seconds > 0`` routes first, then runs the compiled fleet pass with those routes).
    """
    Ns = tuple(int(x) for x in Ns)
    if not Ns or any(x < 1 for x in Ns):
        raise ValueError(f"Ns: expected one positive capacity per replica (at least one), got {list(Ns)}")
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {sorted(ENGINES)}, got {engine!r}")
    if not (np.isfinite(lag) and lag >= 0):
        raise ValueError(f"lag: expected a finite number >= 0, got {lag!r}")
    R = len(Ns)
    b = int(block_size)
    rt = make_router(router, R, seed, capacities=Ns, **(router_params or {}))
    T, L, off, hs = _stream(prompt_tokens, hash_offsets, hashes, response_tokens, colocated)
    n = T.shape[0]
    cv = np.asarray(conv, np.int64)
    if cv.shape != (n,):
        raise ValueError(f"conv: expected shape ({n},), got {cv.shape}")
    tm = np.zeros(n) if times is None else np.asarray(times, np.float64)
    if hold is not None and times is None:
        raise ValueError("times: required when hold is given")
    ph, hts = _timing(hold, prefill_hold, hit_token_seconds, n)
    compiled = rt.name in COMPILED_ROUTERS or rt.oblivious
    if fast is None:
        fast = compiled
    if fast and not compiled:
        raise ValueError(f"router {router}: no compiled path (fast=True); use fast=False")
    if fast and rt.oblivious and hts == 0.0:
        return _fast(rt, T, L, off, hs, cv, tm, hold, Ns, b, engine, colocated, response_tokens, router)
    if fast and rt.oblivious:  # hit-token savings couple no replicas: route first, then the compiled event loop
        rep = _routes(rt, T, L, cv, tm, Ns, b)
        rep, hit, new, wait, rej, ops, rops = simulate_compiled(
            rt, T, L, off, hs, cv, tm, hold, Ns, b, ENGINES[engine], lag, ph, hts, routes=rep
        )
        return FleetResult(rep, hit, new, wait, rej, T, b, Ns, router, ops, rops)
    if fast:
        rep, hit, new, wait, rej, ops, rops = simulate_compiled(
            rt, T, L, off, hs, cv, tm, hold, Ns, b, ENGINES[engine], lag, ph, hts
        )
        return FleetResult(rep, hit, new, wait, rej, T, b, Ns, router, ops, rops)
    return _stepwise(rt, T, L, off, hs, cv, tm, hold, Ns, b, engine, colocated, router, lag, ph, hts)


def _timing(hold, prefill_hold, hit_token_seconds, n):
    """Check the per-request timing options; ``(prefill_hold as float64 or None, hit_token_seconds)``."""
    hts = float(hit_token_seconds)
    if not (np.isfinite(hts) and hts >= 0):
        raise ValueError(f"hit_token_seconds: expected a finite number >= 0, got {hit_token_seconds!r}")
    if hold is None and (prefill_hold is not None or hts > 0):
        raise ValueError("hold: required when prefill_hold or hit_token_seconds is given")
    if prefill_hold is None:
        return None, hts
    ph = np.asarray(prefill_hold, np.float64)
    hd = np.asarray(hold, np.float64)
    if ph.shape != (n,):
        raise ValueError(f"prefill_hold: expected shape ({n},), got {ph.shape}")
    if not (np.isfinite(ph).all() and (ph >= 0).all() and (ph <= hd).all()):
        raise ValueError("prefill_hold: expected finite values with 0 <= prefill_hold <= hold")
    return ph, hts


def _view(rt, t, c, T, Lr, hsr, b, Ns, loads, overlap):
    return RouteView(t, c, T, Lr, hsr, b, Ns, loads[0], loads[1], loads[2], loads[3], overlap)


def _routes(rt, T, L, cv, tm, Ns, b) -> np.ndarray:
    """Every request's replica under an oblivious router (arrival order; it reads no load and no cache)."""
    n, R = T.shape[0], len(Ns)
    z = np.zeros(R)
    rep = np.empty(n, np.int64)
    for r in range(n):
        v = _view(rt, float(tm[r]), int(cv[r]), int(T[r]), int(L[r]), (), b, Ns, (z, z, z, z), None)
        rep[r] = rt.route(v)
    return rep


def _fast(rt, T, L, off, hs, cv, tm, hold, Ns, b, engine, colocated, resp, name) -> FleetResult:
    n, R = T.shape[0], len(Ns)
    rep = _routes(rt, T, L, cv, tm, Ns, b)
    hit = np.zeros(n, np.int64)
    new = np.zeros(n, np.int64)
    wait = np.zeros(n)
    rej = np.zeros(n, bool)
    ops = 0
    cnt = np.diff(off)
    for k in range(R):
        idx = np.flatnonzero(rep == k)
        if not idx.size:
            continue
        c = cnt[idx]
        sub_off = np.concatenate([[0], np.cumsum(c)]).astype(np.int64)
        starts = np.repeat(off[idx], c)
        within = np.arange(int(c.sum()), dtype=np.int64) - np.repeat(sub_off[:-1], c)
        res = simulate_block(
            T[idx],
            sub_off,
            hs[starts + within],
            N=Ns[k],
            block_size=b,
            engine=engine,
            colocated=colocated,
            response_tokens=None if resp is None else np.asarray(resp, np.int64)[idx],
            times=None if hold is None else tm[idx],
            hold=None if hold is None else np.asarray(hold, np.float64)[idx],
        )
        hit[idx], new[idx], wait[idx], rej[idx] = res.hit_blocks, res.new_blocks, res.wait, res.rejected
        ops += res.block_ops
    return FleetResult(rep, hit, new, wait, rej, T, b, Ns, name, ops)


def _stepwise(rt, T, L, off, hs, cv, tm, hold, Ns, b, engine, colocated, name, lag, ph=None, hts=0.0) -> FleetResult:
    n, R = T.shape[0], len(Ns)
    engines = [make_engine(engine, N, block_size=b, colocated=colocated) for N in Ns]
    # the engine allocates kv_tokens(T, m) = T + max(m - 1, 0) = L: m = L - T + 1 when L > T (the response)
    reqs = [
        Request(rid=r, prompt_tokens=int(T[r]), block_hashes=tuple(int(x) for x in hs[off[r] : off[r + 1]]),
                output_tokens=int(L[r] - T[r] + 1) if L[r] > T[r] else 0)
        for r in range(n)
    ]  # fmt: skip
    rep = np.full(n, -1, np.int64)
    hit = np.zeros(n, np.int64)
    new = np.zeros(n, np.int64)
    wait = np.zeros(n)
    rej = np.zeros(n, bool)
    inflight = np.zeros(R)
    pre = np.zeros(R)
    act = np.zeros(R)
    nblk = -(-L // b)
    snap = None
    next_snap = 0.0
    hd = None if hold is None else np.asarray(hold, np.float64)
    waiting = [deque() for _ in range(R)]
    running: list = []

    def loads_now():
        return (inflight.copy(), pre.copy(), act.copy(), np.array([e.in_use() / e.capacity for e in engines]))

    def start(k, now):
        q = waiting[k]
        while q:
            w = q[0]
            out = engines[k].submit(reqs[w])
            if out is None:
                break
            q.popleft()
            hit[w], new[w] = out.hit_units, len(out.new_blocks)
            wait[w] = now - tm[w]
            pre[k] -= out.hit_tokens
            if hd is None:
                fin(w)
            else:
                d = hts * (hit[w] * b)
                heapq.heappush(running, (now + max(hd[w] - d, 0.0), w))
                if ph is not None:
                    heapq.heappush(running, (now + max(ph[w] - d, 0.0), w + n))

    def fin(w):
        k = rep[w]
        engines[k].finish(w)
        inflight[k] -= 1
        if ph is None:
            pre[k] -= T[w] - hit[w] * b
        act[k] -= nblk[w]

    r = 0
    while r < n or running:
        is_fin = bool(running) and (r >= n or running[0][0] <= tm[r])
        now = running[0][0] if is_fin else float(tm[r])
        if lag > 0 and (snap is None or now >= next_snap):  # the state just before the first event at/after a tick
            snap = loads_now()
            next_snap = (np.floor(now / lag) + 1.0) * lag
        if is_fin:
            _, f = heapq.heappop(running)
            if f >= n:  # prefill done: its outstanding prefill tokens leave the load; no block changes
                f -= n
                pre[rep[f]] -= T[f] - hit[f] * b
                continue
            fin(f)
            start(int(rep[f]), now)
            continue
        ld = snap if lag > 0 else loads_now()
        rq = reqs[r]
        v = _view(rt, now, int(cv[r]), int(T[r]), int(L[r]), rq.block_hashes, b, Ns, ld,
                  lambda k, rq=rq: engines[k].lookup(rq))  # fmt: skip
        k = int(rt.route(v))
        rep[r] = k
        if not engines[k].fits(rq):
            rej[r] = True
            wait[r] = np.nan
        else:
            waiting[k].append(r)
            inflight[k] += 1
            pre[k] += T[r]
            act[k] += nblk[r]
            start(k, now)
        r += 1
    ops = sum(int(getattr(getattr(e, "pool", None), "ops", 0)) for e in engines)
    return FleetResult(rep, hit, new, wait, rej, T, b, Ns, name, ops)
