"""vLLM v1's scheduler, step by step, on top of kvhit's block pool: when each request is admitted, what it hits.

This is the concurrent counterpart of :class:`kvhit.sim.vllm.engine.VllmEngine`: where that engine admits a
request with all its blocks (prompt and output) at once and holds them for a given time, this model runs
vLLM's own scheduling loop (``vllm/v1/core/sched/scheduler.py`` ``Scheduler.schedule`` /
``update_from_output``, vLLM 0.32.0, the synchronous ``Scheduler`` the CPU platform forces, FCFS policy) over
the same block pool (:class:`kvhit.sim.vllm.reference.ReferenceBlockPool`, the mirror of vLLM's ``BlockPool``
and full-attention ``KVCacheManager``). One call of :meth:`VllmScheduler.step` is one engine step:

1. **Running requests first**, in ``running`` order: each gets ``num_tokens − num_computed_tokens`` tokens (a
   decode: 1; a continuing chunked prefill: the rest of its prompt), capped by the remaining token budget
   (``max_num_batched_tokens``). ``allocate_slots`` gives it blocks for ``num_computed + new`` tokens, popped
   from the free-queue head. When the pool has too few free blocks, the **last** request of ``running`` is
   preempted (its blocks freed tail first, ``num_computed_tokens = 0``, put at the *front* of ``waiting``) and
   the allocation is retried; when the request preempts itself, scheduling of running requests stops
   (``break``).
2. **Waiting requests**, only if nothing was preempted in this step, FCFS from the head of ``waiting`` while the
   budget is positive and fewer than ``max_num_seqs`` run: prefix lookup (``get_computed_blocks``: chained
   hashes, hit capped at ``num_tokens − 1``, where ``num_tokens`` includes the outputs a preempted request
   already generated); admission only if the **whole** sequence fits (``scheduler_reserve_full_isl = True``,
   vLLM's default: ``ceil(num_tokens / b) − hit + hit blocks with ref_cnt 0 ≤ free``) and the first chunk's
   allocation does; the first chunk is ``min(num_tokens − hit tokens, budget)`` tokens. A request that does not
   fit stops the scan (head-of-line blocking). The hit recorded for a request is the one of its **first**
   admission (vLLM's ``cached_tokens`` and its prefix-cache counters skip re-admissions after preemption).
3. **Caching**: every block made full by the tokens scheduled in this step gets its hash at scheduling
   (``cache_blocks(request, min(num_computed + new, num_tokens))``) — before the step runs, as vLLM does.
4. **Step end** (``update_from_output``), in the order the requests were scheduled: a request whose
   ``num_computed_tokens`` reached ``num_tokens`` samples one token; the one that reaches its ``m`` output
   tokens finishes and frees its blocks (tail first; unhashed blocks to the head of the free queue, hashed
   ones to the tail — :mod:`kvhit.sim.vllm.block`). The last sampled token is never fed back, so a request
   keeps the KV of ``T + m − 1`` tokens, as in the rest of kvhit.

Time: either a step that schedules ``k`` tokens over ``s`` requests lasts ``StepTime.duration(k, s)
= a + b·k + c·s`` seconds, or (``deadlines``, the *measured clock* a replay check uses) each step lasts just
long enough for the requests it runs to finish by their measured finish times (:func:`simulate_schedule`).
Requests enter ``waiting`` when their arrival time is ≤ the step's start (vLLM's engine core drains its input
queue before each step); an idle engine jumps to the next arrival. ``after[r]`` (optional) holds a request
until another one has finished plus a gap (a chat turn is sent only after the previous turn's answer came
back).

Invariants (checked by ``tests/test_scheduler.py``): at most ``max_num_batched_tokens`` tokens and
``max_num_seqs`` requests per step; ``Σ`` blocks held by running requests + free blocks = ``N``; a request's
hit is a multiple of the block size and at most ``(T − 1) // b`` blocks; with one request at a time the hits
equal :class:`~kvhit.sim.vllm.engine.VllmEngine`'s (sequential exactness).

NOT modelled: async scheduling (off on CPU), speculative decoding, KV connectors, priority scheduling,
``long_prefill_token_threshold`` (0 by default), a watermark (0 by default), encoder inputs, hybrid/sliding
window models, ``max_model_len`` caps, aborts, and everything the step-time model leaves out (it is a
fitted line, not the model's cost; see :func:`fit_step_time`).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvhit.sim.vllm.block import ENGINES
from kvhit.sim.vllm.reference import ReferenceBlockPool

__all__ = ["SchedRequest", "SchedResult", "StepTime", "VllmScheduler", "fit_step_time", "simulate_schedule"]


@dataclass(frozen=True)
class StepTime:
    """Duration of one engine step: ``a + b · scheduled tokens + c · scheduled requests`` seconds; ``d_in``: from
    a request's send time to its arrival at the scheduler; ``d_out``: from its last step's end to its answer."""

    a: float = 0.005
    b: float = 2e-5
    c: float = 0.0
    d_in: float = 0.0
    d_out: float = 0.0

    def duration(self, tokens: int, seqs: int) -> float:
        """Seconds of a step that schedules ``tokens`` tokens over ``seqs`` requests."""
        return self.a + self.b * tokens + self.c * seqs


@dataclass(frozen=True)
class SchedRequest:
    """One request for the scheduler: ``prompt_tokens`` ``T``, ``output_tokens`` ``m ≥ 1`` generated, the chained
    ``block_hashes`` of the full blocks of its first ``T + m − 1`` tokens (``(T + m − 1) // b`` ids), its
    ``arrival`` time, and optionally ``after`` (a request that must finish first) and ``gap`` (seconds between
    that finish and this arrival)."""

    rid: int
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...]
    arrival: float = 0.0
    after: int = -1
    gap: float = 0.0


@dataclass
class _Req:
    req: SchedRequest
    index: int
    num_tokens: int
    num_computed: int = 0
    outputs: int = 0
    blocks: list[int] = field(default_factory=list)
    num_cached: int = 0
    preemptions: int = 0
    hit_tokens: int = -1
    arrival: float = math.inf
    admitted: float = math.nan
    finished: float = math.nan


@dataclass
class SchedResult:
    """Per request (input order): ``hit_tokens`` at first admission, times of ``arrival`` at the scheduler, first
    ``admitted``, ``finished`` (end of its last step), ``preemptions``; ``steps``: one row per step
    ``(start, duration, tokens, requests)``; ``steps_of[r]``: the indices of the steps request ``r`` waited or
    ran through (from the step in progress at its arrival to its last step)."""

    hit_tokens: np.ndarray
    arrival: np.ndarray
    admitted: np.ndarray
    finished: np.ndarray
    preemptions: np.ndarray
    steps: np.ndarray
    evictions: int
    #: per request, ``(computed tokens after the step, step end)`` for every step in which it cached new full
    #: blocks (its first computation only): the steps whose ends a vLLM engine publishes as KV event batches
    stores: list[list[tuple[int, float]]] = field(default_factory=list)
    #: marked steps (``marks``) ended at their mark; of those, steps whose marks disagreed (earliest taken)
    marked_steps: int = 0
    mark_conflicts: int = 0
    #: per marked step, its observed end minus the end the model's own step rule would have given it (seconds)
    mark_shifts: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: marked steps whose mark was not after their start (the model reached the step late; it lasts ``min_step``)
    marks_late: int = 0

    @property
    def total_preemptions(self) -> int:
        """Preemptions over the run."""
        return int(self.preemptions.sum())


class VllmScheduler:
    """vLLM's synchronous FCFS scheduler over ``N`` usable blocks of ``block_size`` tokens (module docstring)."""

    def __init__(
        self,
        N: int,
        *,
        block_size: int,
        max_num_batched_tokens: int = 2048,
        max_num_seqs: int = 128,
        engine: str = "vllm",
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine: expected one of {sorted(ENGINES)}, got {engine!r}")
        for name, v in (
            ("N", N),
            ("block_size", block_size),
            ("max_num_batched_tokens", max_num_batched_tokens),
            ("max_num_seqs", max_num_seqs),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive integer, got {v!r}")
        self.N = N
        self.b = block_size
        self.max_tokens = max_num_batched_tokens
        self.max_seqs = max_num_seqs
        self.pool = ReferenceBlockPool(N, block_size, ENGINES[engine])
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        #: optional ``release(request) -> time``: a request done before that time keeps its blocks until then
        self.release = None
        self.held: list[tuple[float, int, _Req]] = []

    # ---- KVCacheManager.allocate_slots --------------------------------------------------------------
    def _cache(self, q: _Req, upto_tokens: int) -> None:
        full = min(upto_tokens, q.num_tokens) // self.b
        if full > q.num_cached:
            self.pool.cache_full_blocks(q.blocks, list(q.req.block_hashes), q.num_cached, full)
            q.num_cached = full

    def _grow(self, q: _Req, new_tokens: int) -> bool:
        need = -(-(q.num_computed + new_tokens) // self.b) - len(q.blocks)
        if need > len(self.pool.free_queue):
            return False
        if need > 0:
            q.blocks += self.pool.get_new_blocks(need)
        self._cache(q, q.num_computed + new_tokens)
        return True

    def _free(self, q: _Req) -> None:
        self.pool.free(q.blocks)
        q.blocks = []
        q.num_cached = 0

    def _preempt(self, q: _Req) -> None:
        self._free(q)
        q.num_computed = 0
        q.preemptions += 1
        self.waiting.appendleft(q)

    # ---- Scheduler.schedule -------------------------------------------------------------------------
    def schedule(self, now: float) -> list[tuple[_Req, int]]:
        """One ``schedule()`` call: the (request, tokens) scheduled, in vLLM's order."""
        budget = self.max_tokens
        out: list[tuple[_Req, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            q = self.running[i]
            new = min(q.num_tokens - q.num_computed, budget)
            if new <= 0:
                i += 1
                continue
            ok = False
            while True:
                if self._grow(q, new):
                    ok = True
                    break
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is q:
                    break
            if not ok:
                break
            out.append((q, new))
            budget -= new
            i += 1
        if not preempted:
            pool = self.pool
            while budget > 0 and self.waiting and len(self.running) < self.max_seqs:
                q = self.waiting[0]
                hashes = list(q.req.block_hashes)
                hit = pool.get_computed_blocks(hashes, q.num_tokens)
                hit_tok = len(hit) * self.b
                new = min(q.num_tokens - hit_tok, budget)
                evictable = sum(1 for x in hit if pool.ref_cnt[x] == 0)
                free = len(pool.free_queue)
                if -(-q.num_tokens // self.b) - len(hit) + evictable > free:  # full_sequence_must_fit
                    break
                if -(-(hit_tok + new) // self.b) - len(hit) + evictable > free:
                    break
                pool.touch(hit)
                q.blocks = list(hit)
                q.num_cached = len(hit)
                q.num_computed = hit_tok
                self._grow(q, new)
                if q.preemptions == 0:
                    q.hit_tokens = hit_tok
                    q.admitted = now
                self.waiting.popleft()
                self.running.append(q)
                out.append((q, new))
                budget -= new
        for q, new in out:  # _update_after_schedule
            q.num_computed += new
        return out

    # ---- Scheduler.update_from_output ---------------------------------------------------------------
    def finish_step(self, out: list[tuple[_Req, int]], now: float) -> list[_Req]:
        """Sample a token for every request whose prompt is computed; finish and free those done (in order)."""
        done = []
        for q, _new in out:
            if q.num_computed >= q.num_tokens:
                q.outputs += 1
                if q.outputs >= q.req.output_tokens:
                    q.finished = now
                    t = now if self.release is None else self.release(q)
                    if t > now:
                        heapq.heappush(self.held, (t, q.index, q))
                    else:
                        self._free(q)
                    done.append(q)
                else:
                    q.num_tokens += 1
        if done:
            gone = {id(q) for q in done}
            self.running = [q for q in self.running if id(q) not in gone]
        return done

    def release_held(self, now: float) -> None:
        """Free the blocks of held requests whose release time is ≤ ``now`` (in time order)."""
        while self.held and self.held[0][0] <= now:
            self._free(heapq.heappop(self.held)[2])


def _check_requests(reqs: Sequence[SchedRequest], b: int, N: int) -> None:
    for r, q in enumerate(reqs):
        if q.prompt_tokens < 1 or q.output_tokens < 1:
            raise ValueError(f"request {r}: prompt_tokens and output_tokens must be ≥ 1")
        L = q.prompt_tokens + q.output_tokens - 1
        if len(q.block_hashes) != L // b:
            raise ValueError(
                f"request {r}: block_hashes has {len(q.block_hashes)} ids, expected {L // b} "
                "((prompt + output − 1) // block_size)"
            )
        if -(-L // b) > N:
            raise ValueError(f"request {r}: its {L} tokens (prompt + output − 1) need more than the {N} usable blocks")
        if not (q.after < r):
            raise ValueError(f"request {r}: after must name an earlier request (got {q.after})")


def simulate_schedule(
    reqs: Sequence[SchedRequest],
    *,
    N: int,
    block_size: int,
    step_time: StepTime = StepTime(),
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 128,
    engine: str = "vllm",
    deadlines=None,
    first_deadlines=None,
    hold_to_deadline: bool = False,
    min_step: float = 1e-6,
    marks=None,
    mark_pacing: str = "forced",
    step_ends=None,
) -> SchedResult:
    """Run every request through :class:`VllmScheduler` at its arrival time (``+ step_time.d_in``; later if its
    ``after`` request has not finished by then) and return what happened (:class:`SchedResult`).

    ``deadlines`` (per request, optional) replaces the step-time line by the *measured clock*: each step lasts
    ``min over the requests it schedules of (deadline − now) / (steps that request still needs, this one
    included)`` (at least ``min_step``) — the engine runs just fast enough for every request to finish by its
    deadline (its measured finish time) if nothing is preempted; ``step_time.a, b, c`` are then unused.

    ``marks`` (per request, optional; the *step clock*): ``[(n, t), …]`` — the step in which that request's
    computed tokens first reach ``n`` (during its first computation: before any preemption) ended at ``t``, as
    observed (a vLLM engine publishes a KV event batch stamped with the step's end whenever a step stores a full
    block; :func:`kvhit.replay.kvevents.step_marks`). A step that crosses a mark ends at it (at the earliest one
    when several disagree; at least ``min_step`` after its start); every other step follows the deadline rule
    (``mark_pacing="forced"``), or the deadline rule with each pending mark as one more deadline
    (``"spread"``: steps before a mark share the time up to it), or with a request's next mark *instead of* its
    deadline while it has one (``"targets"``: steps before a mark are also stretched to it). A mark whose ``n``
    the request's prefix hit already covers is skipped (the model did not compute that block). With a run's own
    ``stores`` as marks, the forced step clock reproduces the run exactly.

    ``step_ends`` (optional, increasing; the *iteration clock*): the engine's observed step ends, every step — a
    step starting at ``now`` ends at the first of them after ``now`` (the deadline rule or the step-time line only
    past the last one); ``marks`` are then not used."""
    if mark_pacing not in ("forced", "spread", "targets"):
        raise ValueError(f"mark_pacing: expected 'forced', 'spread' or 'targets', got {mark_pacing!r}")
    sch = VllmScheduler(
        N,
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        engine=engine,
    )
    _check_requests(reqs, block_size, N)
    n = len(reqs)
    qs = [_Req(reqs[r], r, reqs[r].prompt_tokens) for r in range(n)]
    # pending arrivals: those whose `after` is resolved, ordered by (time, index)
    heap: list[tuple[float, int]] = []
    dependents: dict[int, list[int]] = {}
    for r, q in enumerate(reqs):
        if q.after >= 0:
            dependents.setdefault(q.after, []).append(r)
        else:
            qs[r].arrival = q.arrival + step_time.d_in
            heapq.heappush(heap, (qs[r].arrival, r))
    steps: list[tuple[float, float, int, int]] = []
    dl = None if deadlines is None else [float(x) for x in np.asarray(deadlines, np.float64)]
    fdl = None if first_deadlines is None else [float(x) for x in np.asarray(first_deadlines, np.float64)]
    mk = None
    if marks is not None:
        if len(marks) != n:
            raise ValueError(f"marks: expected one list per request ({n}), got {len(marks)}")
        mk = [sorted((int(a), float(t)) for a, t in marks[r]) for r in range(n)]
    mpos = [0] * n
    grid = None if step_ends is None else [float(x) for x in np.asarray(step_ends, np.float64)]
    if grid is not None and any(b <= a for a, b in zip(grid, grid[1:], strict=False)):
        raise ValueError("step_ends: expected increasing times")
    stores: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    marked = conflicts = late = 0
    shifts: list[float] = []
    now = 0.0
    left = n
    empty = 0
    if hold_to_deadline and dl is not None:
        sch.release = lambda q: dl[q.index]
    while left:
        sch.release_held(now)
        while heap and heap[0][0] <= now:
            _, r = heapq.heappop(heap)
            sch.waiting.append(qs[r])
        if not sch.running and not sch.waiting:
            nxt = min(heap[0][0] if heap else math.inf, sch.held[0][0] if sch.held else math.inf)
            if nxt == math.inf:  # cannot happen: every request is reachable through `after`
                raise RuntimeError("scheduler idle with requests left")
            now = max(now, nxt)
            continue
        out = sch.schedule(now)
        if not out and sch.held and not sch.running:  # waiting for held blocks
            now = max(now, min(sch.held[0][0], heap[0][0] if heap else math.inf))
            continue
        if not out:  # a step that only preempted (vLLM runs it empty); admission comes at the next one
            empty += 1
            if empty > 1:
                raise RuntimeError(f"scheduler stuck at t={now:.6f}: {len(sch.waiting)} waiting, nothing runs")
            continue
        empty = 0
        tok = sum(k for _, k in out)
        hit_marks: list[float] = []
        if mk is not None:
            for q, k in out:
                if q.preemptions:
                    continue
                lst, j = mk[q.index], mpos[q.index]
                before = q.num_computed - k
                while j < len(lst) and lst[j][0] <= q.num_computed:
                    if lst[j][0] > before:
                        hit_marks.append(lst[j][1])
                    j += 1
                mpos[q.index] = j
        if deadlines is None:
            dur = step_time.duration(tok, len(out))
        else:
            dur = math.inf
            for q, _k in out:
                k = q.req.output_tokens - q.outputs  # steps that sample (this one, if its prompt is done)
                rest = q.num_tokens - q.num_computed
                if rest > 0:  # prefill continues: more chunks, and this step samples nothing
                    k += -(-rest // sch.max_tokens)
                pending = mk is not None and q.preemptions == 0 and mpos[q.index] < len(mk[q.index])
                if not (pending and mark_pacing == "targets"):
                    dur = min(dur, (dl[q.index] - now) / k)
                if fdl is not None and q.outputs == 0 and q.preemptions == 0:
                    dur = min(dur, (fdl[q.index] - now) / (1 + (-(-rest // sch.max_tokens) if rest > 0 else 0)))
                if pending and mark_pacing in ("spread", "targets"):
                    a_next, t_next = mk[q.index][mpos[q.index]]
                    # steps up to the one that crosses the mark, this one included: the rest of the prefill in
                    # budget-sized chunks, then one token a step
                    left_tok = a_next - q.num_computed
                    if rest > 0:
                        ahead = -(-min(left_tok, rest) // sch.max_tokens) + max(left_tok - rest, 0)
                    else:
                        ahead = left_tok
                    dur = min(dur, (t_next - now) / (1 + ahead))
            dur = max(dur, min_step)
        if grid is not None:
            j = bisect.bisect_right(grid, now)
            if j < len(grid):
                hit_marks = []
                dur = max(grid[j] - now, min_step)
        if hit_marks:
            marked += 1
            conflicts += max(hit_marks) - min(hit_marks) > 0
            end = min(hit_marks)
            shifts.append(end - (now + dur))  # the observed end against the model's own rule
            dur = end - now
            if dur < min_step:
                late += 1
                dur, end = min_step, now + min_step
        steps.append((now, dur, tok, len(out)))
        now = end if hit_marks else now + dur
        for q, k in out:
            if q.preemptions == 0 and q.num_computed // sch.b > (q.num_computed - k) // sch.b:
                full = min(q.num_computed, q.num_tokens) // sch.b
                if full * sch.b > max(q.num_computed - k, q.hit_tokens):
                    stores[q.index].append((q.num_computed, now))
        for q in sch.finish_step(out, now):
            left -= 1
            for d in dependents.get(q.index, ()):
                rq = reqs[d]
                answered = q.finished if sch.release is None else max(q.finished, sch.release(q))
                t = max(rq.arrival, answered + step_time.d_out + rq.gap) + step_time.d_in
                qs[d].arrival = t
                heapq.heappush(heap, (t, d))
    return SchedResult(
        hit_tokens=np.array([q.hit_tokens for q in qs], np.int64),
        arrival=np.array([q.arrival for q in qs], np.float64),
        admitted=np.array([q.admitted for q in qs], np.float64),
        finished=np.array([q.finished for q in qs], np.float64),
        preemptions=np.array([q.preemptions for q in qs], np.int64),
        steps=np.array(steps, np.float64).reshape(-1, 4),
        evictions=sch.pool.evictions,
        stores=stores,
        marked_steps=marked,
        mark_conflicts=conflicts,
        mark_shifts=np.array(shifts, np.float64),
        marks_late=late,
    )


def fit_step_time(
    reqs: Sequence[SchedRequest],
    measured_latency,
    *,
    N: int,
    block_size: int,
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 128,
    engine: str = "vllm",
    iterations: int = 8,
    start: StepTime = StepTime(),
) -> StepTime:
    """Fit ``a``, ``b`` and the HTTP overhead ``d = d_in + d_out`` (split evenly) of :class:`StepTime` to measured
    per-request latencies (answer time − send time), by fixed-point least squares: simulate, write each
    request's simulated latency as ``d + a · (steps it waited or ran through) + b · (their tokens)``, refit
    (non-negative), repeat. ``c`` is kept at ``start.c``. The fit uses timings only, never the hits."""
    lat = np.asarray(measured_latency, np.float64)
    st = start
    for _ in range(iterations):
        res = simulate_schedule(
            reqs,
            N=N,
            block_size=block_size,
            step_time=st,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            engine=engine,
        )
        s0 = res.steps[:, 0]
        dur = res.steps[:, 1]
        ends = s0 + dur
        tok = res.steps[:, 2]
        seq = res.steps[:, 3]
        ctok = np.concatenate([[0.0], np.cumsum(tok)])
        cseq = np.concatenate([[0.0], np.cumsum(seq)])
        # steps from the one in progress at arrival (first with end > arrival; counted for the part left of it)
        # to the one ending at finish
        lo = np.searchsorted(ends, res.arrival, side="right")
        hi = np.searchsorted(ends, res.finished, side="left") + 1
        frac = np.clip((ends[lo] - res.arrival) / np.where(dur[lo] > 0, dur[lo], 1.0), 0.0, 1.0)
        n_steps = (hi - lo - 1) + frac
        n_tok = ctok[hi] - ctok[lo + 1] + frac * tok[lo]
        n_seq = cseq[hi] - cseq[lo + 1] + frac * seq[lo]
        X = np.column_stack([np.ones_like(n_steps), n_steps, n_tok])
        y = lat - st.c * n_seq
        coef = _nnls(X, y)
        new = StepTime(a=float(coef[1]), b=float(coef[2]), c=st.c, d_in=float(coef[0]) / 2, d_out=float(coef[0]) / 2)
        if new.a <= 0 and new.b <= 0:  # degenerate (no timing information): keep the previous step time
            break
        st = new
    return st


def _nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (active set over ≤ 3 columns: try every subset)."""
    best, best_err = np.zeros(X.shape[1]), float(np.sum(y * y))
    k = X.shape[1]
    for mask in range(1, 2**k):
        cols = [j for j in range(k) if mask >> j & 1]
        coef, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
        if np.any(coef < 0):
            continue
        full = np.zeros(k)
        full[cols] = coef
        err = float(np.sum((X @ full - y) ** 2))
        if err < best_err:
            best, best_err = full, err
    return best
