"""Planning a fleet (:mod:`kvhit.fleet.simulate`): replicas or HBM per replica for a target hit ratio, the hit-ratio
cost of load balancing, and the prefill compute a router saves.

Every number here is an exact fleet simulation (no estimator): a *stream* (:class:`FleetStream`) is a trace
replayed at its own load, or (``lam0``) a resample of its conversations at a Poisson rate λ0
(:func:`kvhit.sim.resample.resample`, whole conversations kept, private block ids renamed per copy); with several
replications the hit ratio is their mean (seeds ``seed + r``, the same streams for every R / N tried, so two
candidates are compared on the same traffic). A point (:func:`evaluate`) routes each stream over R replicas of
N blocks, simulates them and measures the requests of the measurement window.

* :func:`plan_replicas` — the smallest R (1 … ``max_replicas``) whose fleet token hit ratio reaches the target at
  N blocks per replica: R = 1, 2, 4, … until the target is reached, then bisection between the last miss and the
  first hit. This *assumes* the hit ratio does not fall back below the target inside that bracket (true for
  affinity-like routers, which gain capacity with R; round-robin and random usually lose hit ratio as R grows,
  so their answer is R = 1 or none: the doubling stops, with a note, once the hit ratio fell at two doublings in
  a row); every R evaluated is returned, so a reader can check.
* :func:`plan_capacity` — the smallest N per replica (≥ the largest request: below it vLLM cannot serve the
  workload) reaching the target at R replicas: doubling from that minimum, then bisection to a relative
  resolution ``rtol``; the same monotonicity assumption in N, same check.
* :func:`curve` — one KV-aware router with one of its numeric parameters swept (e.g. Dynamo's
  ``overlap_score_credit`` or ``request_weight``, llm-d's ``queue_weight``): hit ratio against load imbalance —
  over the run (max/mean of requests, and of prefill tokens computed, per replica) and over time
  (:func:`inflight_imbalance`: ∫ max_k in-flight / ∫ mean_k in-flight, with holds).

Prefill compute (:mod:`kvhit.plan.compute`): per measured request, the FLOPs skipped (positions ``0 … hit·b − 1``)
and computed (``hit·b … T − 1``); divided by the measured span they are FLOP/s, and by ``peak × mfu`` they are
*GPUs' worth* of prefill (GPU-seconds per second).

NOT modelled: anything :mod:`kvhit.fleet.simulate` does not model (router latency, transfers, failures); a target met
only at some R inside a bracket where the hit ratio is not monotone may be missed (the rows show it); compute
beyond prefill (decode).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kvhit.fleet.simulate import simulate_fleet
from kvhit.fleet.timing import FleetTiming

__all__ = ["FleetStream", "FleetPoint", "FleetPlanResult", "evaluate", "plan_replicas", "plan_capacity", "curve"]


class FleetPlanError(ValueError):
    """A planning question that cannot be asked as given (one line, naming the argument)."""


@dataclass(frozen=True)
class FleetStream:
    """One request stream: CSR block hashes, conversation ids, arrival times, the measured requests and the
    measured span (s) over which rates are computed."""

    prompt_tokens: np.ndarray
    hash_offsets: np.ndarray
    hashes: np.ndarray
    conv: np.ndarray
    times: np.ndarray
    measured: np.ndarray
    block_size: int
    span: float
    output_tokens: np.ndarray | None = None  #: per request (decode holds need them); None when the source has none
    #: the CSR holds ``kv_tokens(T, O) // b`` blocks per request (the decode KV too; ``FleetTiming.decode_kv``), and
    #: the simulator runs colocated with ``output_tokens`` as the response lengths
    colocated: bool = False

    def __post_init__(self):
        if self.colocated and self.output_tokens is None:
            raise ValueError("colocated: needs output_tokens (the decode KV's lengths)")

    @property
    def n_requests(self) -> int:
        return int(self.prompt_tokens.shape[0])

    @property
    def kv_tokens(self) -> np.ndarray:
        """Tokens of KV per request: ``T``, or ``T + O − 1`` when colocated."""
        from kvhit.workload.requests import kv_tokens

        return kv_tokens(self.prompt_tokens, self.output_tokens) if self.colocated else self.prompt_tokens

    @property
    def simulate_kw(self) -> dict:
        """``simulate_fleet``'s ``colocated`` / ``response_tokens`` for this stream."""
        return {"colocated": True, "response_tokens": self.output_tokens} if self.colocated else {}

    @property
    def N_min(self) -> int:
        """Largest request in blocks ``⌈L/b⌉`` (``L`` = :attr:`kv_tokens`): a replica smaller than that rejects it."""
        return int((-(-np.asarray(self.kv_tokens) // self.block_size)).max()) if self.n_requests else 0


def stream_from_resample(rs) -> FleetStream:
    """A :class:`FleetStream` from a :class:`kvhit.sim.resample.ResampledStream` (measured: ``[0, horizon]``)."""
    return FleetStream(
        np.asarray(rs.prompt_tokens, np.int64),
        np.asarray(rs.hash_offsets, np.int64),
        np.asarray(rs.hashes, np.int64),
        np.asarray(rs.conv, np.int64),
        np.asarray(rs.time, np.float64),
        np.asarray(rs.measured, bool),
        int(rs.block_size),
        float(rs.horizon),
    )


@dataclass
class FleetPoint:
    """One (router, R, N, parameters) point, averaged over the streams (replications)."""

    router: str
    replicas: int
    N: int
    params: dict
    token_hit_ratio: float
    ci95: float | None
    per_replication: list[float]
    imbalance_requests: float
    imbalance_prefill_tokens: float
    imbalance_inflight: float | None  #: time-averaged max/mean requests in flight (with holds only)
    prefill_tokens: int  #: computed (T − hit tokens), summed over the measured requests of all streams
    hit_tokens: int
    saved_tokens_per_s: float
    computed_tokens_per_s: float
    mean_wait: float
    rejected: int
    saved_flops_per_s: float | None = None
    computed_flops_per_s: float | None = None
    saved_gpus: float | None = None  #: GPU-seconds of prefill saved per second of traffic
    prefill_gpus: float | None = None  #: GPU-seconds of prefill still computed per second of traffic

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _timing(speed: float | None, timing: FleetTiming | None) -> FleetTiming:
    if timing is not None and speed is not None:
        raise FleetPlanError("prefill_tokens_per_s: give it inside timing, not both")
    return timing if timing is not None else FleetTiming(prefill_tokens_per_s=speed)


def inflight_imbalance(replica, times, wait, hold, rejected, R: int) -> float:
    """Time-averaged load imbalance ``∫ max_k q_k(t) dt / ∫ mean_k q_k(t) dt`` with ``q_k(t)`` the requests in flight
    on replica k (routed at ``t_r``, finished at ``t_r + wait_r + hold_r``; finishes before arrivals at equal
    times, as in :mod:`kvhit.fleet.simulate`); ``nan`` when nothing is ever in flight for a positive time."""
    ok = ~np.asarray(rejected, bool)
    rep = np.asarray(replica, np.int64)[ok]
    t0 = np.asarray(times, np.float64)[ok]
    t1 = t0 + np.asarray(wait, np.float64)[ok] + np.asarray(hold, np.float64)[ok]
    ev_t = np.concatenate([t1, t0])
    ev_k = np.concatenate([rep, rep])
    ev_d = np.concatenate([-np.ones(t1.size, np.int64), np.ones(t0.size, np.int64)])
    order = np.lexsort((ev_d, ev_t))  # at equal times -1 (finish) sorts before +1 (arrival)
    q = np.zeros(R, np.int64)
    num = den = 0.0
    last = None
    for i in order:
        t = ev_t[i]
        if last is not None and t > last:
            dt = t - last
            num += dt * q.max()
            den += dt * q.mean()
        q[ev_k[i]] += ev_d[i]
        last = t
    return num / den if den > 0 else float("nan")


def evaluate(
    streams: list[FleetStream],
    *,
    replicas: int,
    N: int,
    router: str,
    params: dict | None = None,
    engine: str = "vllm",
    prefill_tokens_per_s: float | None = None,
    seed: int = 0,
    lag: float = 0.0,
    flops=None,
    gpu_flops: float | None = None,
    timing: FleetTiming | None = None,
) -> FleetPoint:
    """Simulate every stream on ``replicas`` × ``N`` blocks behind ``router`` and average (module docstring).

    ``flops`` (:class:`kvhit.plan.compute.PrefillFlops`) adds FLOP/s saved and computed; ``gpu_flops`` (effective
    FLOP/s of one GPU = peak × mfu) turns them into GPUs' worth of prefill. ``timing``
    (:class:`kvhit.fleet.timing.FleetTiming`) instead of ``prefill_tokens_per_s``: decode time, the prefill-done
    event and the prefill a cached token saves (the in-flight imbalance uses each request's shortened hold).
    """
    tmg = _timing(prefill_tokens_per_s, timing)
    if not streams:
        raise FleetPlanError("streams: none given")
    if isinstance(replicas, bool) or not isinstance(replicas, int | np.integer) or replicas < 1:
        raise FleetPlanError(f"replicas: expected a positive integer, got {replicas!r}")
    hs, imb_r, imb_p, imb_q, waits = [], [], [], [], []
    pre = hit = rej = 0
    span = 0.0
    f_saved = f_comp = 0.0
    for i, st in enumerate(streams):
        if st.colocated != tmg.decode_kv:
            raise FleetPlanError(
                f"streams: timing.decode_kv is {tmg.decode_kv} but stream {i} was built with colocated={st.colocated}"
            )
        hold, ph, hts = tmg.holds(st.prompt_tokens, st.output_tokens)
        res = simulate_fleet(
            st.prompt_tokens, st.hash_offsets, st.hashes, st.conv, Ns=[int(N)] * int(replicas),
            block_size=st.block_size, router=router, router_params=params, engine=engine, times=st.times,
            hold=hold, seed=seed + i, lag=lag, prefill_hold=ph, hit_token_seconds=hts, **st.simulate_kw,
        )  # fmt: skip
        if hold is not None:
            held = np.maximum(hold - hts * (res.hit_blocks * st.block_size), 0.0)  # as the simulator holds them
            imb_q.append(inflight_imbalance(res.replica, st.times, res.wait, held, res.rejected, int(replicas)))
        s = res.summary(st.measured)
        hs.append(s["token_hit_ratio"])
        imb_r.append(s["imbalance_requests"])
        imb_p.append(s["imbalance_prefill_tokens"])
        waits.append(s["mean_wait"])
        rej += s["rejected"]
        m = st.measured & ~res.rejected
        ht = res.hit_blocks[m] * st.block_size
        hit += int(ht.sum())
        pre += int(st.prompt_tokens[m].sum()) - int(ht.sum())
        span += st.span
        if flops is not None:
            f_saved += float(flops.flops(np.zeros_like(ht), ht).sum())
            f_comp += float(flops.flops(ht, st.prompt_tokens[m]).sum())
    h = float(np.mean(hs))
    ci = None
    if len(hs) > 1:
        from kvhit.sim.metrics import mean_ci

        ci = float(mean_ci(np.asarray(hs))[1])
    pt = FleetPoint(
        router=router,
        replicas=int(replicas),
        N=int(N),
        params=dict(params or {}),
        token_hit_ratio=h,
        ci95=ci,
        per_replication=[float(x) for x in hs],
        imbalance_requests=float(np.mean(imb_r)),
        imbalance_prefill_tokens=float(np.mean(imb_p)),
        imbalance_inflight=float(np.mean(imb_q)) if imb_q else None,
        prefill_tokens=pre,
        hit_tokens=hit,
        saved_tokens_per_s=hit / span if span > 0 else float("nan"),
        computed_tokens_per_s=pre / span if span > 0 else float("nan"),
        mean_wait=float(np.nanmean(waits)) if not all(math.isnan(w) for w in waits) else float("nan"),
        rejected=rej,
    )
    if flops is not None and span > 0:
        pt.saved_flops_per_s = f_saved / span
        pt.computed_flops_per_s = f_comp / span
        if gpu_flops:
            pt.saved_gpus = pt.saved_flops_per_s / gpu_flops
            pt.prefill_gpus = pt.computed_flops_per_s / gpu_flops
    return pt


@dataclass
class FleetPlanResult:
    """Answer of a search: ``answer`` (R or N; ``None`` when the target is not reached within the range) and
    every point evaluated, sorted by the searched variable."""

    router: str
    vary: str  #: "replicas" or "N"
    target: float
    answer: int | None
    rows: list[FleetPoint]
    notes: list[str] = field(default_factory=list)

    def point(self, x: int) -> FleetPoint | None:
        key = "replicas" if self.vary == "replicas" else "N"
        return next((p for p in self.rows if getattr(p, key) == x), None)


def _check_target(target: float) -> float:
    if not (isinstance(target, int | float) and math.isfinite(target) and 0 < target < 1):
        raise FleetPlanError(f"target: expected a hit ratio in (0, 1), got {target!r}")
    return float(target)


def _search(f, lo_start: int, hi_max: int, target: float, rtol: float, stop_falling: bool = False):
    """Smallest x in [lo_start, hi_max] with f(x) ≥ target, assuming monotone between bracket ends; with
    ``stop_falling`` the doubling stops (answer ``None``, reason returned) once f fell at two doublings in a row."""
    seen: dict[int, float] = {}

    def g(x):
        if x not in seen:
            seen[x] = f(x)
        return seen[x]

    x, lo, trail = lo_start, None, []
    while True:
        if g(x) >= target:
            hi = x
            break
        lo = x
        trail.append(seen[x])
        if x >= hi_max:
            return None, ""
        if stop_falling and len(trail) >= 3 and trail[-1] < trail[-2] < trail[-3]:
            return None, f"the hit ratio fell at two doublings in a row (up to {x}); search stopped"
        x = min(2 * x, hi_max)
    if lo is None:
        return hi, ""
    while hi - lo > max(1, int(rtol * hi)):
        mid = (lo + hi) // 2
        if g(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi, ""


def plan_replicas(
    streams: list[FleetStream], *, N: int, target: float, router: str, max_replicas: int = 64, **kw
) -> FleetPlanResult:
    """Smallest R in [1, ``max_replicas``] with fleet token hit ratio ≥ ``target`` at N blocks per replica."""
    target = _check_target(target)
    if isinstance(max_replicas, bool) or not isinstance(max_replicas, int) or max_replicas < 1:
        raise FleetPlanError(f"max_replicas: expected a positive integer, got {max_replicas!r}")
    pts: dict[int, FleetPoint] = {}

    def f(R):
        pts[R] = evaluate(streams, replicas=R, N=N, router=router, **kw)
        return pts[R].token_hit_ratio

    ans, why = _search(f, 1, max_replicas, target, 0.0, stop_falling=True)
    rows = [pts[k] for k in sorted(pts)]
    res = FleetPlanResult(router, "replicas", target, ans, rows)
    if ans is None:
        best = max(rows, key=lambda p: p.token_hit_ratio)
        upto = max(pts)
        res.notes.append(
            f"{router}: the target {target:g} is not reached at R ≤ {upto} (best {best.token_hit_ratio:.4f} "
            f"at R = {best.replicas})" + (f"; {why}" if why else "")
        )
    return res


def plan_capacity(
    streams: list[FleetStream],
    *,
    replicas: int,
    target: float,
    router: str,
    N_max: int | None = None,
    rtol: float = 0.01,
    **kw,
) -> FleetPlanResult:
    """Smallest N per replica (≥ the largest request) with fleet token hit ratio ≥ ``target`` at R replicas, to a
    relative resolution ``rtol`` (the answer is a capacity that reaches the target; the next smaller one tried
    did not, and is within ``rtol`` of it)."""
    target = _check_target(target)
    if not (0 <= rtol < 1):
        raise FleetPlanError(f"rtol: expected a number in [0, 1), got {rtol!r}")
    n_min = max(st.N_min for st in streams)
    if N_max is None:  # every distinct block plus the largest request: nothing hashed is ever evicted
        N_max = max(int(np.unique(st.hashes).shape[0]) for st in streams) + n_min
    pts: dict[int, FleetPoint] = {}

    def f(N):
        pts[N] = evaluate(streams, replicas=replicas, N=N, router=router, **kw)
        return pts[N].token_hit_ratio

    ans, _ = _search(f, max(n_min, 1), max(int(N_max), n_min, 1), target, rtol)
    rows = [pts[k] for k in sorted(pts)]
    res = FleetPlanResult(router, "N", target, ans, rows)
    if ans is None:
        best = max(rows, key=lambda p: p.token_hit_ratio)
        res.notes.append(
            f"{router}: the target {target:g} is not reached at R = {replicas} even without eviction "
            f"(N = {N_max:,} blocks per replica: {best.token_hit_ratio:.4f})"
        )
    return res


def curve(
    streams: list[FleetStream], *, replicas: int, N: int, router: str, param: str, values, params=None, **kw
) -> list[FleetPoint]:
    """Hit ratio and load imbalance as ``router``'s parameter ``param`` takes each of ``values``."""
    vals = [float(v) for v in values]
    if not vals:
        raise FleetPlanError("values: none given")
    out = []
    for v in vals:
        p = {**(params or {}), param: v}
        out.append(evaluate(streams, replicas=replicas, N=N, router=router, params=p, **kw))
    return out
