"""Predict exactly what a replay recorded, and compare it request by request with what the server measured.

The recorded sequence — each request's prompt ids as sent and the output ids the server returned — is run
through kvhit's step-wise vLLM engine (:class:`kvhit.sim.vllm.engine.VllmEngine`) in the colocated mode, with
the server's own configuration read from its ``vllm:cache_config_info``:

* ``N = num_gpu_blocks − 1`` usable blocks (vLLM's block 0 is the reserved null block);
* a request of ``T`` prompt tokens and ``m`` generated tokens keeps the KV of ``T + m − 1`` tokens: the last
  sampled token is never fed back, so it never gets KV (``output_cached="m-1"``; ``"m"`` and ``"0"`` — the PD
  prefiller — are there to show what a wrong rule gives);
* block hashes are chained over the token ids (``prompt + output[:m−1]``), so a later prompt that repeats a
  conversation's history and the returned tokens hits exactly the blocks vLLM would find.

Sequential replays are simulated request by request with nothing in flight. Concurrent ones either

* with vLLM's scheduler (:func:`simulate_recorded_scheduler`, the default): the requests arrive at the
  scheduler at their measured send times (a chat turn never before the previous turn finished in the
  simulation) and run through :mod:`kvhit.sim.vllm.scheduler` — chunked prefill under the token budget,
  admission when the whole prompt fits, decode blocks step by step, preemption of the last running request —
  with each step paced so that the requests it runs finish by their measured finish times (the same measured
  times the holds model uses, no fitted parameter); a step-time line fitted to the measured latencies
  (:func:`kvhit.sim.vllm.scheduler.fit_step_time`) is the alternative (``clock="fitted"``) — on a loaded
  machine, where step times vary a lot, it predicts the latencies poorly and the hits worse;
* or with holds (``times``/``hold`` of :func:`kvhit.sim.engine.replay`): each request holds all its blocks
  from its measured send time to its measured finish time — the older, coarser model — or, with the server's
  log and timings, on the server's clock (:func:`server_clock_holds`): from its first schedule to its last
  token.

The engine-aware estimator (:func:`kvhit.estimate.estimate_engine`) is evaluated on the recorded prompts
(``cum_tokens`` = the prompt length sent) at the same ``N``.

SGLang servers (:func:`simulate_recorded_sglang`): the same recorded sequence through kvhit's step-wise model
of SGLang's radix cache (:class:`kvhit.sim.sglang.engine.SglangEngine`: ``UnifiedRadixCache`` by default, the
server's page size, eviction policy and KV pool of ``max_total_num_tokens`` tokens). SGLang keys its tree on
token ids, so the request carries ``prompt + output[:m−1]`` — on finish SGLang inserts the KV it holds,
``owned_kv_len = T + m − 1`` tokens (the last sampled token is never fed back), page-aligned down — and its
hit is capped at ``T − 1`` tokens rounded down to pages. Sequential replays are simulated request by request;
concurrent ones with holds from the measured times only (kvhit has no model of SGLang's scheduler: its batching,
``new_token_ratio`` reservation and retraction are not modelled). The estimator is
:func:`kvhit.estimate.sglang.estimate_sglang` (LRU only) at the same pool.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CheckResult",
    "OUTPUT_RULES",
    "compare",
    "estimate_recorded",
    "recorded_trace",
    "estimate_recorded_sglang",
    "server_clock_holds",
    "simulate_recorded",
    "simulate_recorded_scheduler",
    "simulate_recorded_sglang",
]

#: how many generated tokens keep KV: vLLM caches ``m − 1`` (the default); ``m`` and ``0`` are controls
OUTPUT_RULES = ("m-1", "m", "0")


def _cached_outputs(m: int, rule: str) -> int:
    if rule == "m-1":
        return max(m - 1, 0)
    if rule == "m":
        return m
    if rule == "0":
        return 0
    raise ValueError(f"output_cached: expected one of {OUTPUT_RULES}, got {rule!r}")


def _replay_hits(eng, reqs, t_send, t_done) -> np.ndarray:
    """Hit tokens per request (-1: rejected) of ``reqs`` (request ``r`` has rid ``r``) replayed on ``eng`` in that
    order, or — with measured ``t_send``/``t_done`` — in send order with each request held until its finish."""
    from kvhit.sim.engine import replay

    n = len(reqs)
    if t_send is None:
        res = replay(eng, reqs)
        order = np.arange(n)
    else:
        ts = np.asarray(t_send, np.float64)
        td = np.asarray(t_done, np.float64)
        order = np.argsort(ts, kind="stable")
        sreqs = [dataclasses.replace(reqs[r], rid=i) for i, r in enumerate(order)]
        res = replay(eng, sreqs, times=ts[order], hold=np.maximum(td[order] - ts[order], 0.0))
    hit = np.full(n, -1, np.int64)
    for i, r in enumerate(order):
        o = res.outcomes[i]
        if o is not None:
            hit[r] = o.hit_tokens
    return hit


def simulate_recorded(
    prompts,
    outputs,
    *,
    block_size: int,
    num_gpu_blocks: int,
    engine: str = "vllm",
    output_cached: str = "m-1",
    t_send=None,
    t_done=None,
) -> np.ndarray:
    """Simulated hit tokens of each recorded request (-1: kvhit's engine would reject it).

    ``prompts``/``outputs``: per request the token ids sent and returned (request order = send order for a
    sequential replay); ``t_send``/``t_done`` (both or neither): measured times, simulated as holds.
    """
    from kvhit.sim.engine import Request
    from kvhit.sim.vllm.blockids import hashes_from_token_ids
    from kvhit.sim.vllm.engine import VllmEngine

    n = len(prompts)
    if num_gpu_blocks < 2:
        raise ValueError(f"num_gpu_blocks: expected ≥ 2 (one is vLLM's null block), got {num_gpu_blocks}")
    seqs, T, m = [], np.zeros(n, np.int64), np.zeros(n, np.int64)
    for r in range(n):
        p = np.asarray(prompts[r], np.int64)
        o = np.asarray(outputs[r], np.int64)
        k = _cached_outputs(int(o.shape[0]), output_cached)
        seqs.append(np.concatenate([p, o[:k]]))
        # the engine keeps the KV of output_tokens − 1 generated tokens (kvhit.workload.requests.kv_tokens)
        T[r], m[r] = p.shape[0], k + 1
    off, hs = hashes_from_token_ids(seqs, int(block_size)) if n else (np.zeros(1, np.int64), np.zeros(0, np.int64))
    reqs = [Request(r, int(T[r]), tuple(int(x) for x in hs[off[r] : off[r + 1]]), int(m[r])) for r in range(n)]
    eng = VllmEngine(int(num_gpu_blocks) - 1, block_size=int(block_size), engine=engine, colocated=True)
    return _replay_hits(eng, reqs, t_send, t_done)


def server_clock_holds(server_added, server_ms):
    """Each request's hold on the server's clock, ``(start, end)`` in seconds after the earliest anchor, or None
    unless every request has an anchor and all three server durations (finite).

    ``server_added``: Unix times of the server log's ``Added request`` lines
    (:func:`kvhit.replay.serverlog.anchor_times`); ``server_ms``: ``(queue, ttft, generation)`` milliseconds per
    request (vLLM ``--enable-per-request-metrics``). A request holds its blocks from its **first schedule**,
    ``added + queue``, to its **last token**, ``added + queue + ttft + generation``. Why the first schedule and
    not the arrival (vLLM 0.32.0, ``v1/core/sched/scheduler.py``): a waiting request holds no blocks — the prefix
    lookup (``kv_cache_manager.get_computed_blocks``, which decides ``cached_tokens``) and the allocation
    (``allocate_slots``) happen in the ``schedule()`` call that first admits it, whose start
    (``scheduled_timestamp = time.monotonic()``) is the request's ``scheduled_ts``, and ``queue_time_ms`` is
    ``scheduled_ts − queued_ts``; the blocks go back to the free queue in ``update_from_output`` of the step that
    produced the last token (``_free_request``), the step whose output time is ``last_token_ts``. Not modelled:
    the delay from the log line to ``queued_ts`` (up to a step; it shifts start and end alike), preemption
    (a preempted request's blocks are freed and taken again later: holds keep them throughout), and the decode
    blocks' growth (holds allocate every block at the start)."""
    if server_added is None or server_ms is None:
        return None
    a = np.asarray(server_added, np.float64)
    q, f, g = (np.asarray(x, np.float64) / 1e3 for x in server_ms)
    if a.size == 0 or not np.all(np.isfinite(a) & np.isfinite(q) & np.isfinite(f) & np.isfinite(g)):
        return None
    start = (a - float(a.min())) + q
    return start, start + f + g


def simulate_recorded_sglang(
    prompts,
    outputs,
    *,
    page_size: int,
    pool_tokens: int,
    evict_policy: str = "lru",
    cache: str = "unified",
    tlru_tail_budget: int = 0,
    t_send=None,
    t_done=None,
) -> np.ndarray:
    """Simulated hit tokens (SGLang's ``cached_tokens``) of each recorded request on kvhit's SGLang model
    (-1: a request SGLang's pool could never hold). ``pool_tokens``: the KV pool (``max_total_num_tokens``),
    rounded down to whole pages; ``t_send``/``t_done`` (both or neither): measured times, simulated as holds."""
    from kvhit.sim.engine import Request
    from kvhit.sim.sglang.engine import SglangEngine

    n = len(prompts)
    p = int(page_size)
    C = int(pool_tokens) // p * p
    if C < p:
        raise ValueError(f"pool_tokens: expected at least one page of {p} tokens, got {pool_tokens}")
    eng = SglangEngine(C, page_size=p, evict_policy=evict_policy, cache=cache, tlru_tail_budget=int(tlru_tail_budget))
    reqs = []
    for r in range(n):
        pr = [int(x) for x in np.asarray(prompts[r], np.int64)]
        o = [int(x) for x in np.asarray(outputs[r], np.int64)]
        m = max(len(o), 1)
        reqs.append(Request(r, len(pr), (), m, tuple(pr + o[: m - 1])))
    return _replay_hits(eng, reqs, t_send, t_done)


def simulate_recorded_scheduler(
    prompts,
    outputs,
    *,
    block_size: int,
    num_gpu_blocks: int,
    t_send,
    t_done,
    prev=None,
    step_time=None,
    clock: str = "measured",
    server_ms=None,
    server_added=None,
    in_share: float = 0.5,
    hold_to_deadline: bool = False,
    kv_events=None,
    mark_pacing: str = "forced",
    iterations=None,
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 128,
    engine: str = "vllm",
) -> tuple[np.ndarray, dict]:
    """Simulated hit tokens of each recorded request under vLLM's scheduler (:mod:`kvhit.sim.vllm.scheduler`).

    ``t_send``/``t_done``: measured send and answer times; ``prev[r]``: the request whose answer request ``r``'s
    prompt contains (-1: none) — ``r`` then arrives no earlier than that request's simulated finish plus the
    measured gap. ``clock="measured"`` (default): each step lasts just long enough for the requests it schedules
    to finish by their measured finish times (:func:`~kvhit.sim.vllm.scheduler.simulate_schedule` with
    ``deadlines``; no fitted parameter: the same measured times the holds model uses); ``clock="fitted"``: a
    step-time line ``step_time`` (:class:`~kvhit.sim.vllm.scheduler.StepTime`), or None to fit one to the
    measured latencies. ``server_ms``: optional ``(queue, ttft, generation)`` milliseconds per request as the
    server measured them (vLLM ``--enable-per-request-metrics``); when every request has them, the measured clock
    uses the server's own timeline: the HTTP overhead ``o = (t_done − t_send) − (queue + ttft + generation)`` is
    split between sending (``in_share``, default one half) and answering, the request reaches the scheduler at
    ``t_send + in_share·o``, its first token is due at that plus queue + ttft, its last at
    ``t_done − (1 − in_share)·o``. ``server_added``: optional Unix times at which the server's front end handed
    each request to its engine core (:func:`kvhit.replay.serverlog.anchor_times`, vLLM ``--enable-log-requests``);
    with ``server_ms`` and finite for every request, the measured clock is *anchored* on the server: request ``r``
    reaches the scheduler at ``added_r``, its first token is due at ``added_r + queue + ttft`` and its last at that
    plus ``generation`` — the client's send and finish times are then used for nothing but the order of equal
    anchors, and a chat turn's gap after the previous answer is measured on the same server clock.
    ``kv_events``: optional batches of the server's KV-cache events (:func:`kvhit.replay.kvevents.read_kv_events`)
    — the *step clock*: on the anchored clock only, every step that stores a block only its request can compute
    ends at the batch the engine published for it (:func:`kvhit.replay.kvevents.step_marks`; ``mark_pacing`` as
    in :func:`~kvhit.sim.vllm.scheduler.simulate_schedule`).
    Returns the hits (-1: a request kvhit cannot run: more tokens than blocks) and a dict
    with the step time used, whether it was fitted, the preemptions and the simulated/measured latencies.
    """
    from kvhit.sim.vllm.blockids import hashes_from_token_ids
    from kvhit.sim.vllm.scheduler import SchedRequest, StepTime, fit_step_time, simulate_schedule

    n = len(prompts)
    if num_gpu_blocks < 2:
        raise ValueError(f"num_gpu_blocks: expected ≥ 2 (one is vLLM's null block), got {num_gpu_blocks}")
    b = int(block_size)
    N = int(num_gpu_blocks) - 1
    ts = np.asarray(t_send, np.float64)
    td = np.asarray(t_done, np.float64)
    pv = np.full(n, -1, np.int64) if prev is None else np.asarray(prev, np.int64)
    seqs, T, m = [], np.zeros(n, np.int64), np.zeros(n, np.int64)
    for r in range(n):
        p = np.asarray(prompts[r], np.int64)
        o = np.asarray(outputs[r], np.int64)
        seqs.append(np.concatenate([p, o[: max(o.shape[0] - 1, 0)]]))
        T[r], m[r] = p.shape[0], max(o.shape[0], 1)
    off, hs = hashes_from_token_ids(seqs, b) if n else (np.zeros(1, np.int64), np.zeros(0, np.int64))
    runnable = -(-(T + m - 1) // b) <= N
    # simulate in send order; `after` must point to an earlier (runnable) request in that order

    def requests(order, arrive, start, finish):
        """The scheduler's requests in ``order``: ``arrive[i]`` the i-th one's arrival; a chat turn ``after`` its
        previous turn (when that is earlier in ``order``) by the measured gap ``start[r] − finish[prev]``."""
        pos = {r: i for i, r in enumerate(order)}
        out = []
        for i, r in enumerate(order):
            p = int(pv[r])
            after = pos.get(p, -1) if p >= 0 else -1
            if after >= i:
                after = -1
            out.append(
                SchedRequest(
                    rid=i,
                    prompt_tokens=int(T[r]),
                    output_tokens=int(m[r]),
                    block_hashes=tuple(int(x) for x in hs[off[r] : off[r + 1]]),
                    arrival=float(arrive[i]),
                    after=after,
                    gap=float(max(start[r] - finish[p], 0.0)) if after >= 0 else 0.0,
                )
            )
        return out

    order = [int(r) for r in np.argsort(ts, kind="stable") if runnable[r]]
    reqs = requests(order, ts[order], ts, td)
    kw = dict(
        N=N, block_size=b, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, engine=engine
    )
    if clock not in ("measured", "fitted"):
        raise ValueError(f"clock: expected 'measured' or 'fitted', got {clock!r}")
    deadlines = None
    fitted = False
    first = None
    anchored = False
    if clock == "measured":
        step_time = StepTime(a=0.0, b=0.0)
        deadlines = np.array([td[r] for r in order], np.float64)
        if server_ms is not None:
            qm, fm, gm = (np.asarray(x, np.float64)[order] / 1e3 for x in server_ms)
            ok = np.all(np.isfinite(qm) & np.isfinite(fm) & np.isfinite(gm))
            added = None if server_added is None else np.asarray(server_added, np.float64)
            if ok and added is not None and np.all(np.isfinite(added[order])):
                anchored = True
                # one server clock: seconds after the earliest anchor; the engine's order is the anchors' order
                a_all = added - float(np.min(added[order]))
                fin_all = np.full(n, np.nan)
                fin_all[order] = a_all[order] + qm + fm + gm
                order = [int(r) for r in np.argsort(a_all, kind="stable") if runnable[r]]
                qm, fm, gm = (np.asarray(x, np.float64)[order] / 1e3 for x in server_ms)
                arrive = a_all[order]
                first = arrive + qm + fm
                deadlines = first + gm
                reqs = requests(order, arrive, a_all, fin_all)
            elif ok:
                o = np.maximum((td[order] - ts[order]) - (qm + fm + gm), 0.0)
                arrive = ts[order] + in_share * o
                first = arrive + qm + fm
                deadlines = td[order] - (1.0 - in_share) * o
                reqs = requests(order, arrive, ts, td)
    elif step_time is None:
        fitted = True
        lat = np.array([td[r] - ts[r] for r in order], np.float64)
        step_time = fit_step_time(reqs, lat, **kw)
    marks = None
    mark_info = None
    if kv_events is not None:
        if not anchored:
            raise ValueError("kv_events: the step clock needs the server's clock (server_added and server_ms)")
        from kvhit.replay.kvevents import step_marks

        mk_unix, mark_info = step_marks([seqs[r] for r in order], added[order], kv_events, b)
        t_zero = float(np.min(added[order]))
        marks = [[(a, t - t_zero) for a, t in lst] for lst in mk_unix]
    grid = None
    if iterations is not None:
        if not anchored:
            raise ValueError("iterations: the iteration clock needs the server's clock (server_added and server_ms)")
        it = np.asarray(iterations, np.float64) - float(np.min(added[order]))
        grid = np.unique(it[it >= 0.0])
        marks = None
    res = simulate_schedule(
        reqs,
        step_ends=grid,
        step_time=step_time,
        deadlines=deadlines,
        first_deadlines=first,
        hold_to_deadline=hold_to_deadline,
        marks=marks,
        mark_pacing=mark_pacing,
        **kw,
    )
    hit = np.full(n, -1, np.int64)
    sim_lat = np.full(n, np.nan)
    pre = np.zeros(n, np.int64)
    for i, r in enumerate(order):
        hit[r] = res.hit_tokens[i]
        if anchored:  # the server's span (anchor to last token), simulated, plus the client's measured overhead
            sim_lat[r] = (res.finished[i] - reqs[i].arrival) + (td[r] - ts[r]) - (deadlines[i] - reqs[i].arrival)
        else:
            tail = td[r] - deadlines[i] if deadlines is not None else step_time.d_out
            sim_lat[r] = res.finished[i] + tail - ts[r]
        pre[r] = res.preemptions[i]
    info = {
        "clock": (
            "iteration clock (server log)"
            if grid is not None
            else "step clock (KV events)"
            if marks is not None
            else "anchored (server log)"
        )
        if anchored
        else clock
        if first is None
        else "measured (server timings)",
        "step_time": {k: getattr(step_time, k) for k in ("a", "b", "c", "d_in", "d_out")},
        "step_time_fitted": fitted,
        "max_num_batched_tokens": int(max_num_batched_tokens),
        "max_num_seqs": int(max_num_seqs),
        "preemptions": int(res.total_preemptions),
        "preempted_requests": int((res.preemptions > 0).sum()),
        "steps": int(res.steps.shape[0]),
        "evictions": int(res.evictions),
        "simulated_latency": sim_lat,
        "preemptions_per_request": pre,
    }
    if mark_info is not None:
        sh = np.abs(res.mark_shifts) * 1e3
        info["step_clock"] = {
            **mark_info,
            "marked_steps": res.marked_steps,
            "mark_conflicts": res.mark_conflicts,
            "mark_shift_ms": {
                q: float(np.percentile(sh, p)) if sh.size else 0.0 for q, p in (("p50", 50), ("p90", 90))
            },
            "marks_before_step_start": res.marks_late,
        }
    if anchored:  # the steps that cached new full blocks, per request: (computed tokens, Unix time of the step's end)
        t_zero = float(np.min(added[order]))
        info["store_times"] = [[] for _ in range(n)]
        for i, r in enumerate(order):
            info["store_times"][r] = [(a, t + t_zero) for a, t in res.stores[i]]
    return hit, info


def recorded_trace(conv, turn, time, prompt_tokens, completion_tokens, block_size: int):
    """The recorded requests as a kvhit :class:`~kvhit.workload.Trace` (``cum_tokens`` = prompt sent)."""
    from kvhit.workload import Trace

    conv = np.asarray(conv, np.int64)
    T = np.asarray(prompt_tokens, np.int64)
    b = int(block_size)
    need = -(-T // b)
    # Z_j ≥ 1 blocks per turn and R = cumsum Z (the trace schema); the estimator reads the prompts from cum_tokens
    order = np.lexsort((np.asarray(turn), conv))
    first = np.ones(conv.size, bool)
    first[order[1:]] = conv[order[1:]] != conv[order[:-1]]
    prev = np.zeros_like(need)
    prev[order[1:]] = need[order[:-1]]
    Z = np.where(first, np.maximum(need, 1), np.maximum(need - prev, 1))
    R = np.empty_like(Z)
    run = 0
    for r in order:
        run = Z[r] if first[r] else run + Z[r]
        R[r] = run
    _, inv, cnt = np.unique(conv, return_inverse=True, return_counts=True)
    tm = np.asarray(time, np.float64)
    first_time = np.full(cnt.size, np.inf)
    np.minimum.at(first_time, inv, tm)
    cols = {
        "conv": conv,
        "conv_arrival": first_time[inv],
        "turn": np.asarray(turn, np.int32),
        "time": tm,
        "M": cnt[inv].astype(np.int32),
        "Z": Z.astype(np.int64),
        "R": R.astype(np.int64),
        "cum_tokens": T,
        "response_tokens": np.asarray(completion_tokens, np.int64),
    }
    return Trace.from_columns(cols, {"block_size": b, "source": "kvhit replay"}, where="recorded replay")


def estimate_recorded(trace, N: int, block_size: int, rows=None) -> float:
    """The engine-aware estimator (vLLM ≥ 0.24, token hit ratio) at ``N`` usable blocks on the recorded trace."""
    from kvhit.estimate import estimate_engine

    est = estimate_engine(trace, int(N), engine="vllm", metric="tokens", block_size=int(block_size), rows=rows)
    return float(est.h)


def estimate_recorded_sglang(trace, pool_tokens: int, page_size: int, rows=None) -> float:
    """SGLang's engine-aware estimator (:func:`kvhit.estimate.sglang.estimate_sglang`, LRU, token hit ratio) at
    a pool of ``pool_tokens`` tokens on the recorded trace (``rows``: the measured requests)."""
    from kvhit.estimate.sglang import estimate_sglang, sglang_accounting

    p = int(page_size)
    acc = sglang_accounting(trace, page_size=p, block_size=p, rows=rows)
    return float(estimate_sglang(acc, int(pool_tokens) // p * p, page_size=p).h)


@dataclass(frozen=True)
class CheckResult:
    """Measured vs simulated, per request and in aggregate (over ``mask``)."""

    n: int
    mismatches: int
    first_mismatch: int | None
    measured_hit_tokens: int
    simulated_hit_tokens: int
    prompt_tokens: int
    measured_ratio: float
    simulated_ratio: float
    rejected: int

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def compare(measured, simulated, prompt_tokens, mask=None) -> CheckResult:
    """Per-request comparison of measured ``cached_tokens`` and simulated hit tokens."""
    meas = np.asarray(measured, np.int64)
    sim = np.asarray(simulated, np.int64)
    T = np.asarray(prompt_tokens, np.int64)
    sel = np.ones(meas.size, bool) if mask is None else np.asarray(mask, bool)
    diff = sel & (meas != sim)
    idx = np.flatnonzero(diff)
    denom = int(T[sel].sum())
    return CheckResult(
        n=int(sel.sum()),
        mismatches=int(diff.sum()),
        first_mismatch=int(idx[0]) if idx.size else None,
        measured_hit_tokens=int(meas[sel].sum()),
        simulated_hit_tokens=int(np.maximum(sim[sel], 0).sum()),
        prompt_tokens=denom,
        measured_ratio=float(meas[sel].sum() / denom) if denom else float("nan"),
        simulated_ratio=float(np.maximum(sim[sel], 0).sum() / denom) if denom else float("nan"),
        rejected=int((sel & (sim < 0)).sum()),
    )
