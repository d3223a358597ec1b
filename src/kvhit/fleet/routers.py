"""Routers in front of a fleet of replicas (:mod:`kvhit.fleet.simulate`): which replica serves each request.

A router sees a :class:`RouteView` — the request, its conversation id, the arrival time, the load snapshot of
every replica (possibly lagged, see :func:`kvhit.fleet.simulate.simulate_fleet`) and, for KV-aware routers, the
cached-prefix overlap of the request on each replica — and returns a replica index. Every random choice
draws from the router's own ``numpy`` generator seeded at construction, in a fixed order, so a run is
reproducible bit for bit. Ties are broken uniformly at random with ``rng.integers(len(ties))`` (one draw,
only when there are two or more candidates).

Definitions and the sources read (versions as stored in the public code index on 2026-12-01; where a
default could not be read it is marked *assumed*):

* ``round-robin`` – replica ``i mod R`` for the i-th request (SGLang router ``round_robin``; vLLM
  production-stack ``roundrobin``).
* ``random`` – uniform, seeded (SGLang router ``random``; Dynamo ``--router-mode random``).
* ``session`` – consistent-hash ring on the conversation id (vLLM production-stack ``session`` router, which
  uses a hash ring over the endpoints): ``vnodes`` = 160 virtual nodes per replica (*assumed*: the ketama
  default), MD5 of ``"replica-{k}-{v}"`` and of ``str(conversation)``, first 8 bytes big-endian; a key
  goes to the first ring point clockwise.
* ``sticky`` – bind on first turn with a sliding TTL (Dynamo ``x-dynamo-session-id`` affinity): an unbound
  or expired conversation goes to the least-loaded replica (in-flight requests) and is bound; every turn
  refreshes the binding to ``t + ttl``; ``ttl`` = 300 s (*assumed*; the Dynamo default was not read).
* ``least-loaded`` – argmin of in-flight requests (``metric="requests"``) or of outstanding prefill tokens
  (``metric="prefill_tokens"``), random ties.
* ``dynamo`` – Dynamo KV router (``lib/kv-router`` ``DefaultWorkerScorer::worker_logit``, read in
  ``lib/kv-router/src/scheduling/selector/default.rs`` on Dynamo ``main`` as stored 2026-12; the older
  ``lib/llm/src/kv_router/scheduler.rs`` two-term form is the special case credit = 1):
  ``logit_k = prefill_load_scale · max(0, raw_prefill_blocks_k − overlap_score_credit · overlap_k) +
  decode_blocks_k + decode_active_request_weight · active_requests_k`` with ``raw_prefill_blocks_k = (queued
  prefill tokens_k + T) / b`` and ``decode_blocks_k = active blocks_k + ⌈L/b⌉``; kvhit computes the first term
  as ``max(0, queued_k + T − credit·overlap_k·b) / b`` (the same number; exact integers when credit = 1).
  Parameters (kvhit name = Dynamo name): ``overlap_score_weight`` = ``prefill_load_scale`` (renamed; default
  1.0), ``overlap_score_credit`` (default 1.0), ``request_weight`` = ``decode_active_request_weight`` (default
  0), ``temperature`` = ``router_temperature`` (default 0.0). Temperature 0: argmin, random ties (Dynamo:
  reservoir sampling over ties, uniform); temperature > 0: softmax sampling of ``−logit`` normalised by the
  logit range (Dynamo's ``softmax_sample``: ``−(l/range)/T``, shift-invariant, so kvhit uses ``(l −
  min)/range``), one ``rng.random()`` draw. Not modelled: the credit decay (``overlap_score_credit_decay``,
  default 0 = off), host/disk tier credits, SITA bands (off by default). ``mode="precise"`` reads
  the true cache (KV events); ``mode="approx"`` (``--no-kv-events``, ``ApproxKvIndexer``) keeps a per-replica
  shadow of the block hashes it routed, each expiring ``ttl`` = 120 s after it was last routed (docs).
* ``llm-d`` – llm-d inference scheduler scorer sum: ``Σ w_i·score_i`` with the prefix-cache scorer
  (matched/total prompt blocks; precise, or approximate with a per-replica LRU shadow of routed blocks sized
  to the replica's ``N``), the queue scorer (min–max normalised: ``(max q − q)/(max q − min q)``, 1 when all
  equal) and the kv-cache-utilization scorer (``1 − in_use/N``); weights 3 / 2 / 2 as in llm-d's sample
  configuration (read in a secondary write-up of v0.7.1, not in llm-d's own repository); argmax, random ties.
* ``sglang`` – SGLang cache-aware router (``sgl-router`` ``CacheAwarePolicy``, read in its source comment):
  if the loads (in-flight requests) are imbalanced — ``max − min > balance_abs_threshold`` (64) **and**
  ``max > balance_rel_threshold · min`` (1.5) — the least-loaded replica; else, if the best prefix match
  rate (matched/total blocks on the router's approximate tree) exceeds ``cache_threshold`` (0.3), the
  replica with that best match; else the replica whose tree is smallest (``get_smallest_tenant``). The tree
  is approximated by the set of block hashes routed to each replica, never evicted (SGLang evicts only past
  ``max_tree_size``). ``mode="precise"`` uses the true cache instead.

NOT modelled: SGLang's character-level tree (kvhit matches whole blocks), router-side decode-token
growth, Dynamo's busy-threshold rejection and its approximate indexer's size pruning (only the TTL), llm-d
filters other than the three scorers, and router replicas.
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

__all__ = ["ROUTERS", "RouteView", "Router", "make_router"]


@dataclass
class RouteView:
    """What a router sees for one request.

    ``inflight``, ``prefill_tokens`` (outstanding prefill tokens), ``active_blocks`` (blocks of routed,
    unfinished requests) and ``kv_usage`` (``in_use/N``) are per-replica load snapshots; ``overlap(k)`` is
    the number of leading prompt blocks cached on replica ``k`` now (precise KV state).
    """

    t: float
    conv: int
    prompt_tokens: int
    alloc_tokens: int
    block_hashes: tuple
    block_size: int
    capacities: tuple
    inflight: np.ndarray
    prefill_tokens: np.ndarray
    active_blocks: np.ndarray
    kv_usage: np.ndarray
    overlap: object  # callable k -> int

    @property
    def R(self) -> int:
        return len(self.capacities)


def _pick(rng, cands):
    return cands[int(rng.integers(len(cands)))] if len(cands) > 1 else cands[0]


def _argmin(rng, vals):
    m = min(vals)
    return _pick(rng, [k for k, v in enumerate(vals) if v == m])


def _argmax(rng, vals):
    m = max(vals)
    return _pick(rng, [k for k, v in enumerate(vals) if v == m])


class Router:
    """Base class: ``route(view) -> replica``; ``oblivious`` routers ignore loads and cache state."""

    name = "router"
    oblivious = False

    def __init__(self, R: int, seed: int = 0) -> None:
        self.R = R
        self.rng = np.random.default_rng(seed)

    def route(self, v: RouteView) -> int:  # pragma: no cover - abstract
        raise NotImplementedError


class RoundRobin(Router):
    """Round-robin over the replicas (request i goes to replica i mod R)."""

    name, oblivious = "round-robin", True

    def __init__(self, R, seed=0):
        super().__init__(R, seed)
        self.i = 0

    def route(self, v):
        k = self.i % self.R
        self.i += 1
        return k


class Random(Router):
    """Uniformly random replica per request, from a seeded generator."""

    name, oblivious = "random", True

    def route(self, v):
        return int(self.rng.integers(self.R))


def _md5_64(s: str) -> int:
    return int.from_bytes(hashlib.md5(s.encode()).digest()[:8], "big")


class SessionRing(Router):
    """Session affinity: a consistent-hash ring on the conversation id (vLLM production-stack's session router)."""

    name, oblivious = "session", True

    def __init__(self, R, seed=0, vnodes: int = 160):
        super().__init__(R, seed)
        pts = sorted((_md5_64(f"replica-{k}-{j}"), k) for k in range(R) for j in range(vnodes))
        self.keys = [p for p, _ in pts]
        self.owner = [k for _, k in pts]

    def route(self, v):
        i = bisect_right(self.keys, _md5_64(str(int(v.conv))))
        return self.owner[i % len(self.keys)]


class Sticky(Router):
    """Dynamo's session affinity: bind a conversation on its first turn, keep the binding while it is used within a
    sliding TTL."""

    name = "sticky"

    def __init__(self, R, seed=0, ttl: float = 300.0):
        super().__init__(R, seed)
        self.ttl = float(ttl)
        self.bind: dict[int, tuple[int, float]] = {}

    def route(self, v):
        b = self.bind.get(v.conv)
        k = b[0] if b is not None and v.t < b[1] else _argmin(self.rng, list(v.inflight))
        self.bind[v.conv] = (k, v.t + self.ttl)
        return k


class LeastLoaded(Router):
    """The replica with the fewest requests (or prefill tokens) in flight; ties broken at random (seeded)."""

    name = "least-loaded"

    def __init__(self, R, seed=0, metric: str = "requests"):
        super().__init__(R, seed)
        if metric not in ("requests", "prefill_tokens"):
            raise ValueError(f"metric: expected 'requests' or 'prefill_tokens', got {metric!r}")
        self.metric = metric

    def route(self, v):
        load = v.inflight if self.metric == "requests" else v.prefill_tokens
        return _argmin(self.rng, list(load))


class _Shadow:
    """Approximate per-replica index of routed block hashes: TTL expiry (Dynamo) or LRU by size (llm-d) or
    neither (SGLang's tree without eviction)."""

    def __init__(self, R: int, ttl: float | None = None, sizes=None) -> None:
        self.ttl = ttl
        self.sizes = sizes
        self.d = [OrderedDict() for _ in range(R)]

    def overlap(self, k: int, hashes, t: float) -> int:
        d, n = self.d[k], 0
        for h in hashes:
            e = d.get(h)
            if e is None or (self.ttl is not None and e <= t):
                break
            n += 1
        return n

    def add(self, k: int, hashes, t: float) -> None:
        d = self.d[k]
        exp = t + self.ttl if self.ttl is not None else math.inf
        for h in hashes:
            d[h] = exp
            d.move_to_end(h)
        if self.sizes is not None:
            while len(d) > self.sizes[k]:
                d.popitem(last=False)

    def size(self, k: int, t: float) -> int:
        if self.ttl is None:
            return len(self.d[k])
        return sum(1 for e in self.d[k].values() if e > t)


def _check_mode(mode):
    if mode not in ("precise", "approx"):
        raise ValueError(f"mode: expected 'precise' or 'approx', got {mode!r}")


class DynamoKV(Router):
    """Dynamo's KV router: cost = prefill load scale × max(0, new prefill blocks − credit × overlap) + decode blocks
    + request weight × in flight; argmin at temperature 0, softmax above (see the module docstring for the sources)."""

    name = "dynamo"

    def __init__(
        self,
        R,
        seed=0,
        overlap_score_weight: float = 1.0,
        temperature: float = 0.0,
        request_weight: float = 0.0,
        mode: str = "precise",
        ttl: float = 120.0,
        overlap_score_credit: float = 1.0,
    ):
        super().__init__(R, seed)
        _check_mode(mode)
        for nm, x in (
            ("overlap_score_weight", overlap_score_weight),
            ("temperature", temperature),
            ("overlap_score_credit", overlap_score_credit),
        ):
            if not (math.isfinite(x) and x >= 0):
                raise ValueError(f"{nm}: expected a finite number >= 0, got {x!r}")
        if not (math.isfinite(request_weight) and request_weight >= 0):
            raise ValueError(f"request_weight: expected a finite number >= 0, got {request_weight!r}")
        if not (math.isfinite(ttl) and ttl > 0):
            raise ValueError(f"ttl: expected a finite number > 0, got {ttl!r}")
        self.w, self.temp, self.wr, self.mode = overlap_score_weight, temperature, request_weight, mode
        self.credit = overlap_score_credit
        self.shadow = _Shadow(R, ttl=ttl) if mode == "approx" else None

    def logits(self, v) -> list[float]:
        b = v.block_size
        nb = -(-v.alloc_tokens // b)
        out = []
        for k in range(self.R):
            ov = v.overlap(k) if self.shadow is None else self.shadow.overlap(k, v.block_hashes, v.t)
            pre = max(float(v.prefill_tokens[k]) + v.prompt_tokens - self.credit * ov * b, 0.0) / b
            out.append(self.w * pre + float(v.active_blocks[k] + nb) + self.wr * float(v.inflight[k]))
        return out

    def route(self, v):
        lg = self.logits(v)
        if self.temp == 0.0:
            k = _argmin(self.rng, lg)
        else:
            lo, hi = min(lg), max(lg)
            z = [(x - lo) / (hi - lo) if hi > lo else 0.0 for x in lg]
            # libm's exp (math.exp), as the compiled pass's scalar np.exp: NumPy's vectorised exp differs in the
            # last bit on some CPUs (kvhit.fleet.compiled)
            w = np.array([math.exp(-x / self.temp) for x in z])
            c = np.cumsum(w / w.sum())
            k = min(int(np.searchsorted(c, self.rng.random(), side="right")), self.R - 1)
        if self.shadow is not None:
            self.shadow.add(k, v.block_hashes, v.t)
        return k


class LlmD(Router):
    """llm-d's scorer: weighted prefix-cache, queue and KV-utilization scores (3/2/2 by default), highest wins."""

    name = "llm-d"

    def __init__(
        self,
        R,
        seed=0,
        prefix_weight: float = 3.0,
        queue_weight: float = 2.0,
        kv_weight: float = 2.0,
        mode: str = "precise",
        capacities=None,
    ):
        super().__init__(R, seed)
        _check_mode(mode)
        for nm, x in (("prefix_weight", prefix_weight), ("queue_weight", queue_weight), ("kv_weight", kv_weight)):
            if not (math.isfinite(x) and x >= 0):
                raise ValueError(f"{nm}: expected a finite number >= 0, got {x!r}")
        self.wp, self.wq, self.wk, self.mode = prefix_weight, queue_weight, kv_weight, mode
        self.shadow = _Shadow(R, sizes=list(capacities)) if mode == "approx" else None

    def route(self, v):
        nb = len(v.block_hashes)
        q = [float(x) for x in v.inflight]
        qmin, qmax = min(q), max(q)
        sc = []
        for k in range(self.R):
            ov = v.overlap(k) if self.shadow is None else self.shadow.overlap(k, v.block_hashes, v.t)
            ps = ov / nb if nb else 0.0
            qs = (qmax - q[k]) / (qmax - qmin) if qmax > qmin else 1.0
            sc.append(self.wp * ps + self.wq * qs + self.wk * (1.0 - float(v.kv_usage[k])))
        k = _argmax(self.rng, sc)
        if self.shadow is not None:
            self.shadow.add(k, v.block_hashes, v.t)
        return k


class SGLangCacheAware(Router):
    """SGLang's cache-aware router: the longest prefix match above the cache threshold unless the load is imbalanced
    (absolute and relative thresholds), then the least loaded."""

    name = "sglang"

    def __init__(
        self,
        R,
        seed=0,
        cache_threshold: float = 0.3,
        balance_abs_threshold: float = 64,
        balance_rel_threshold: float = 1.5,
        mode: str = "approx",
    ):
        super().__init__(R, seed)
        _check_mode(mode)
        if not (0.0 <= cache_threshold <= 1.0):
            raise ValueError(f"cache_threshold: expected a number in [0, 1], got {cache_threshold!r}")
        if not (math.isfinite(balance_abs_threshold) and balance_abs_threshold >= 0):
            raise ValueError(f"balance_abs_threshold: expected a finite number >= 0, got {balance_abs_threshold!r}")
        if not (math.isfinite(balance_rel_threshold) and balance_rel_threshold >= 1):
            raise ValueError(f"balance_rel_threshold: expected a finite number >= 1, got {balance_rel_threshold!r}")
        self.th, self.abs, self.rel, self.mode = cache_threshold, balance_abs_threshold, balance_rel_threshold, mode
        self.shadow = _Shadow(R) if mode == "approx" else None

    def route(self, v):
        load = [float(x) for x in v.inflight]
        lo, hi = min(load), max(load)
        if hi - lo > self.abs and hi > self.rel * lo:
            k = _argmin(self.rng, load)
        else:
            nb = len(v.block_hashes)
            ov = [
                v.overlap(k) if self.shadow is None else self.shadow.overlap(k, v.block_hashes, v.t)
                for k in range(self.R)
            ]
            best = max(ov)
            if nb and best / nb > self.th:
                k = _argmax(self.rng, ov)
            elif self.shadow is not None:
                k = _argmin(self.rng, [self.shadow.size(j, v.t) for j in range(self.R)])
            else:
                k = _argmin(self.rng, load)
        if self.shadow is not None:
            self.shadow.add(k, v.block_hashes, v.t)
        return k


ROUTERS = {c.name: c for c in (RoundRobin, Random, SessionRing, Sticky, LeastLoaded, DynamoKV, LlmD, SGLangCacheAware)}


def make_router(name: str, R: int, seed: int = 0, capacities=None, **params) -> Router:
    """A router by name (:data:`ROUTERS`) with its parameters; unknown names/parameters raise ``ValueError``."""
    if isinstance(R, bool) or not isinstance(R, int | np.integer) or R < 1:
        raise ValueError(f"replicas: expected a positive integer, got {R!r}")
    cls = ROUTERS.get(name)
    if cls is None:
        raise ValueError(f"router: expected one of {sorted(ROUTERS)}, got {name!r}")
    if cls is LlmD and params.get("mode") == "approx":
        params = {**params, "capacities": capacities}
    try:
        return cls(int(R), seed, **params)
    except TypeError as e:
        raise ValueError(f"router {name}: unknown parameter ({e})") from None
