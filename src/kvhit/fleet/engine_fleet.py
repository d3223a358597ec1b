"""A fleet of step-wise vLLM engines behind the Dynamo router, timed as NVIDIA Dynamo's mocker times its engine.

Each replica is :class:`kvhit.sim.vllm.scheduler.VllmScheduler` (vLLM's scheduler over vLLM's block pool:
running requests first, FCFS admission of waiting requests under a per-pass token budget
``max_num_batched_tokens`` and ``max_num_seqs``, chunked prefill, admission only when the whole sequence fits,
decode blocks grown one token at a time, LIFO preemption when a running request finds no free block, full blocks
cached when scheduled). That is the scheduling the mocker's vLLM backend follows
(``lib/mocker/src/scheduler/vllm/core.rs`` ``execute_pass_internal`` / ``schedule_request`` /
``emit_ready_tokens`` in ai-dynamo/dynamo; in ai-dynamo 1.6.1 the same engine ships as ``aisimulate-core``
0.13.0). The mocker's defaults are this module's: ``max_num_batched_tokens`` 8,192, ``max_num_seqs`` 256,
``preemption_mode`` LIFO.

Time (:class:`MockerTiming`, the mocker's built-in ``polynomial`` perf model, ``PerfModel::Polynomial`` in
``lib/mocker/src/common/perf_model.rs`` before it moved to aisimulate): one pass lasts
``prefill(x) + decode(u)`` milliseconds, where ``x`` is the number of prompt tokens the pass computes (all
prefill chunks together, as the number of chunks × their integer mean: the mocker's ``batch_size ·
avg_effective_input_length``; ``prefill(x) = 4.209989e-7·x² + 1.518344e-2·x + 16.50142``, 0 when ``x = 0``) and, when
the pass has at least one decode token, ``decode(u) = max(1, −25.74·u² + 54.01·u + 5.74)`` with ``u`` = the
context tokens of the requests decoding in this pass (each one's sequence so far, the token it computes
included; requests that prefill in the pass are not in it; shared blocks counted per request) / ``N·b``.
In the 1.6.1 wheel this is measured, not read (``tests/test_engine_fleet.py``): a lone 512-token request on 64
blocks has mean ITL 6.5947 ms = the mean of ``decode((512 + j) / 32768)``, j = 1 … 20 (``decode(1 block / 64)``
would be 6.5895); two 1,000-token requests decoding together 8.9732 ms; cached blocks of finished requests do not
count; a 2,048-token prefill joining a decoding 4,096-token request makes a pass of ``prefill(2048) +
decode(4097 / 8388608)``. Every token a pass samples appears at its end: a request's first token ends its
prefill pass (no decode time of its own in that pass), then one token per pass. Checked against the 1.6.1
wheel's replay on isolated and overlapping requests (docs/peers.md).

Router (Dynamo's KV router, :class:`kvhit.fleet.routers.DynamoKV` with every parameter at its default): at
arrival a request is routed by ``prefill blocks + active blocks``: its overlap is the longest prefix of its
prompt's block ids cached on the replica now (KV events); outstanding prefill tokens are ``T − overlap``
tokens per request from routing until its first token (``MarkPrefillCompleted``); active blocks are its
``⌈T/b⌉`` prompt block ids from routing until it finishes (``Free``), counted once per distinct id on a replica
(``router_assume_kv_reuse``; ``dedupe_active=False`` sums them per request), generated tokens' blocks not
counted (``router_track_output_blocks = False``). Ties are broken by the seeded generator (the mocker's are
unseeded).

Invariant: with ``R = 1`` the fleet is exactly :func:`kvhit.sim.vllm.scheduler.simulate_schedule` on the same
requests with the same step times (tested); a request's hit is taken at its first admission (the mocker's
``reused_input_tokens``) and is at most ``(T − 1) // b`` blocks.

NOT modelled: the mocker's KV-event lag (events are visible at once), its random tie-breaks (seeded here), the
prefill-cost terms of AI Configurator / profiled timing models, speculative decoding, disaggregation, KV
offload, and requests longer than a replica's pool (refused).
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass

import numpy as np

from kvhit.fleet.routers import DynamoKV, RouteView
from kvhit.fleet.simulate import FleetResult
from kvhit.sim.vllm.scheduler import SchedRequest, VllmScheduler, _Req

__all__ = ["EngineFleetResult", "MockerTiming", "engine_requests", "simulate_engine_fleet"]


@dataclass(frozen=True)
class MockerTiming:
    """The mocker's polynomial perf model (milliseconds): prefill ``p2·x² + p1·x + p0`` over the pass's prompt
    tokens ``x``; decode ``max(decode_min, d2·u² + d1·u + d0)`` over ``u`` = the decoding requests' context tokens
    / ``N·b``."""

    p2: float = 4.209989e-07
    p1: float = 1.518344e-02
    p0: float = 1.650142e01
    d2: float = -25.74
    d1: float = 54.01
    d0: float = 5.74
    decode_min: float = 1.0

    def pass_seconds(self, prompt_tokens: int, decodes: bool, usage: float) -> float:
        """Seconds of one pass computing ``prompt_tokens`` prompt tokens, with decode tokens when ``decodes``."""
        ms = 0.0
        if prompt_tokens > 0:
            x = float(prompt_tokens)
            ms += max(self.p2 * x * x + self.p1 * x + self.p0, 0.0)
        if decodes:
            ms += max(self.d2 * usage * usage + self.d1 * usage + self.d0, self.decode_min)
        return ms / 1000.0


@dataclass
class EngineFleetResult:
    """Per request: ``replica``, ``hit_tokens`` (first admission), ``prompt_tokens``, ``arrival``, first
    ``admitted``, ``first_token`` and ``finished`` times (s), ``preemptions``; ``passes``: passes run over all
    replicas; ``Ns`` and ``block_size`` of the run."""

    replica: np.ndarray
    hit_tokens: np.ndarray
    prompt_tokens: np.ndarray
    arrival: np.ndarray
    admitted: np.ndarray
    first_token: np.ndarray
    finished: np.ndarray
    preemptions: np.ndarray
    passes: int
    Ns: tuple = ()
    block_size: int = 1

    def token_hit_ratio(self) -> float:
        """Σ hit tokens / Σ prompt tokens over first admissions (the mocker's
        ``first_admission_prefix_cache_reused_ratio``)."""
        return float(self.hit_tokens.sum() / max(int(self.prompt_tokens.sum()), 1))

    def as_fleet_result(self) -> FleetResult:
        """The same run as a :class:`~kvhit.fleet.simulate.FleetResult` (router ``dynamo``): hit blocks, new prompt
        blocks ``⌈T/b⌉ − hit``, wait = first admission − arrival, nothing rejected."""
        b = self.block_size
        hit = self.hit_tokens // b
        n = self.replica.shape[0]
        return FleetResult(self.replica, hit, -(-self.prompt_tokens // b) - hit, self.admitted - self.arrival,
                           np.zeros(n, bool), self.prompt_tokens, b, tuple(self.Ns), "dynamo")  # fmt: skip


def engine_requests(prompt_tokens, output_tokens, hash_offsets, hashes, times, block_size: int) -> list[SchedRequest]:
    """:class:`SchedRequest` s for a trace: the first ``T // b`` of each request's block ids (its full prompt
    blocks), then fresh negative ids for the blocks the generated tokens fill (never a hit: the generated tokens
    are the request's own). Output lengths below 1 count as 1."""
    b = int(block_size)
    T = np.asarray(prompt_tokens, np.int64)
    m = np.maximum(np.asarray(output_tokens, np.int64), 1)
    off = np.asarray(hash_offsets, np.int64)
    hs = np.asarray(hashes, np.int64)
    tm = np.asarray(times, np.float64)
    out, nxt = [], -1
    for r in range(T.size):
        full = int(T[r]) // b
        if off[r + 1] - off[r] < full:
            raise ValueError(f"request {r}: {off[r + 1] - off[r]} block ids, expected at least {full} (T // b)")
        ids = [int(x) for x in hs[off[r] : off[r] + full]]
        k = (int(T[r] + m[r]) - 1) // b - full
        ids += list(range(nxt, nxt - k, -1))
        nxt -= k
        out.append(SchedRequest(r, int(T[r]), int(m[r]), tuple(ids), float(tm[r])))
    return out


def simulate_engine_fleet(
    prompt_tokens,
    output_tokens,
    hash_offsets,
    hashes,
    times,
    *,
    Ns,
    block_size: int,
    timing: MockerTiming = MockerTiming(),
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    seed: int = 0,
    dedupe_active: bool = True,
    router_params: dict | None = None,
    step_seconds=None,
) -> EngineFleetResult:
    """Route a Mooncake-style trace (``times`` in s) over ``len(Ns)`` step-wise vLLM engines (module docstring).

    ``hash_offsets``/``hashes``: CSR block ids per request, at least ``T // b`` each (all of them are the
    router's prompt ids). ``step_seconds(prompt_tokens, tokens, seqs, decodes, usage)`` (optional) replaces
    ``timing`` (the equality test against :func:`~kvhit.sim.vllm.scheduler.simulate_schedule` uses it)."""
    Ns = tuple(int(x) for x in Ns)
    if not Ns or any(x < 1 for x in Ns):
        raise ValueError(f"Ns: expected one positive capacity per replica (at least one), got {list(Ns)}")
    b = int(block_size)
    R = len(Ns)
    reqs = engine_requests(prompt_tokens, output_tokens, hash_offsets, hashes, times, b)
    n = len(reqs)
    off = np.asarray(hash_offsets, np.int64)
    hs = np.asarray(hashes, np.int64)
    tm = np.asarray(times, np.float64)
    if n > 1 and np.any(np.diff(tm) < 0):
        raise ValueError("times: expected non-decreasing arrival times")
    for q in reqs:
        need = -(-(q.prompt_tokens + q.output_tokens - 1) // b)
        if need > min(Ns):
            raise ValueError(f"request {q.rid}: needs {need} blocks, more than a replica's {min(Ns)}")
    router = DynamoKV(R, seed, **(router_params or {}))
    sch = [VllmScheduler(N, block_size=b, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)
           for N in Ns]  # fmt: skip
    qs = [_Req(reqs[r], r, reqs[r].prompt_tokens) for r in range(n)]
    rep = np.full(n, -1, np.int64)
    first = np.full(n, np.nan)
    inflight = np.zeros(R)
    pre = np.zeros(R)
    pre_of = np.zeros(n)
    active = [Counter() for _ in range(R)]
    cur: list = [None] * R  # the pass in progress on each replica
    ends: list[tuple[float, int]] = []
    passes = 0

    def step_time(k, out):
        x, npf, dec, tok, ctx = 0, 0, False, 0, 0
        for q, new in out:
            before = q.num_computed - new
            p = max(0, min(q.req.prompt_tokens, q.num_computed) - before)
            x += p
            npf += p > 0
            if before >= q.req.prompt_tokens:  # a decode token: its context is the whole sequence so far
                dec = True
                ctx += q.num_computed
            tok += new
        usage = ctx / (sch[k].N * b)
        if npf:  # the mocker times batch size × the integer mean of the chunks' new tokens
            x = npf * (x // npf)
        if step_seconds is not None:
            return step_seconds(x, tok, len(out), dec, usage)
        return timing.pass_seconds(x, dec, usage)

    def start(k, now):
        nonlocal passes
        s = sch[k]
        for _ in range(2):  # a pass that only preempts schedules nothing; the next one admits
            if not s.running and not s.waiting:
                return
            out = s.schedule(now)
            if out:
                cur[k] = out
                passes += 1
                heapq.heappush(ends, (now + step_time(k, out), k))
                return
        raise RuntimeError(f"replica {k} stuck at t={now:.6f}: {len(s.waiting)} waiting, nothing runs")

    def router_ids(r):
        return tuple(int(x) for x in hs[off[r] : off[r + 1]])

    r = 0
    while r < n or ends:
        if ends and (r >= n or ends[0][0] <= tm[r]):
            now, k = heapq.heappop(ends)
            out, cur[k] = cur[k], None
            before = {id(q): q.outputs for q, _ in out}
            done = sch[k].finish_step(out, now)
            for q, _ in out:
                if before[id(q)] == 0 and q.outputs > 0 and np.isnan(first[q.index]):
                    first[q.index] = now
                    pre[k] -= pre_of[q.index]
            for q in done:
                if np.isnan(first[q.index]):
                    first[q.index] = now
                    pre[k] -= pre_of[q.index]
                inflight[k] -= 1
                active[k].subtract(router_ids(q.index))
                active[k] = +active[k]
            if r >= n or tm[r] > now:  # else the arrivals at this time are enqueued first (vLLM drains its queue)
                start(k, now)
            continue
        now = float(tm[r])
        ids = router_ids(r)
        nb = -(-reqs[r].prompt_tokens // b)
        if dedupe_active:
            act = np.array([len(active[k].keys() | set(ids)) - nb for k in range(R)], np.float64)
        else:
            act = np.array([sum(active[k].values()) for k in range(R)], np.float64)

        def overlap(k, ids=ids):
            c = sch[k].pool.cached
            i = 0
            while i < len(ids) and ids[i] in c:
                i += 1
            return i

        usage = np.array([(s.N - len(s.pool.free_queue)) / s.N for s in sch])  # kv_usage: unread by this router
        v = RouteView(now, r, reqs[r].prompt_tokens, reqs[r].prompt_tokens, ids, b, Ns, inflight.copy(), pre.copy(),
                      act, usage, overlap)  # fmt: skip
        k = int(router.route(v))
        rep[r] = k
        pre_of[r] = max(reqs[r].prompt_tokens - overlap(k) * b, 0)
        pre[k] += pre_of[r]
        inflight[k] += 1
        active[k].update(ids)
        qs[r].arrival = now
        sch[k].waiting.append(qs[r])
        r += 1
        if r >= n or tm[r] > now:
            for j in range(R):
                if cur[j] is None:
                    start(j, now)
    return EngineFleetResult(
        replica=rep,
        hit_tokens=np.array([q.hit_tokens for q in qs], np.int64),
        prompt_tokens=np.array([q.req.prompt_tokens for q in qs], np.int64),
        arrival=np.array([q.arrival for q in qs], np.float64),
        admitted=np.array([q.admitted for q in qs], np.float64),
        first_token=first,
        finished=np.array([q.finished for q in qs], np.float64),
        preemptions=np.array([q.preemptions for q in qs], np.int64),
        passes=passes,
        Ns=Ns,
        block_size=b,
    )
