"""Fleet estimates on production block-id traces (WEKA, Mooncake): docs/estimators.md §6, block-id traces.

Idea (the block-id form of :mod:`kvhit.fleet.estimate`). Replica k's cache sees only the requests routed to it, in
time order; under the vLLM model a replica is an independent single-replica engine (:mod:`kvhit.fleet.simulate`),
so replica k's hit ratio is the single-replica agentic estimate (:func:`kvhit.estimate.agentic.estimate_trace`,
eq. (A1): block i of a reuse segment of age a hits iff N_k ≥ 1 + e + i + D_k(a)) applied to the *routed
sub-trace* ``pt.select(replica == k)``. The thinning by the router therefore enters twice, exactly as the paper's
fragment argument (eq. (38)/(47) per replica, docs/estimators.md §6): (i) a request's reuse segments are recomputed on
the sub-trace, so a request hits only blocks an earlier request *on the same replica* touched (its age is the time
since that request: the thinned gap); (ii) the displacement D_k(a) counts only the other requests on replica k
(the background templates and the start-time intensity of the estimator are those of the replica's fragments).
The fleet ratio is the demand-weighted mean ``Σ_k h_k·den_k / Σ_k den_k`` (den = prompt tokens, or prompt blocks
for ``metric="blocks"``), the simulator's ``hits/queries``.

Routing (the per-replica thinning, from each router's rule):

* round-robin, random, session (oblivious): the router is run on the request stream (it reads only the request
  index, its own seeded generator, or the session id) — :func:`route_oblivious`; no cache simulation is needed;
* dynamo (temperature 0), llm-d, sglang, sticky (KV-aware): a request's *home* is the replica of the previous
  request of its stream (RequestReuse ``prev``: same session and agent), where its common prefix ``L_own`` with
  that request sits; the router keeps it there with the stay probability of
  :func:`kvhit.fleet.estimate.stay_probabilities_arrays` (the router's own rule, overlap x = min(L_own, (T−1)//b)
  blocks, gap W = t_r − t_prev, independent M/G/∞ load snapshots) and otherwise sends it to one of the R − 1 others
  uniformly (:func:`kv_routes_blocks`); a request without a previous one goes to a uniform replica.

Expected value by replay, and the band for one realisation (any router :func:`kvhit.fleet.simulate.simulate_fleet`
runs — the KV-aware ones through the compiled fleet pass): ``K`` exact fleet replays of the trace with its session
starts redrawn (:func:`fleet_replays_blocks`: :func:`start_law` / :func:`draw_fleet_starts` — uniform on the
observed range unless a KS test rejects it, then :func:`kvhit.estimate.band.draw_starts`' histogram; the sessions'
order kept; :func:`kvhit.estimate.band.restart_sessions`). Their mean is the expected value where they are
affordable (:func:`replays_affordable`, :data:`REPLAY_MAX_ACCESSES`; issue 23 §6: where an exact replay is cheaper
than the estimator, use it), with its Monte Carlo standard error; the band is eq. (B1) from the same replays,
widened by :data:`kvhit.estimate.band.WIDEN` and flagged not validated (:func:`fleet_band_blocks`). The mean's
Monte Carlo error s/√K (0.005–0.014 at K = 16 on 35-conversation WEKA pools) is the answer's error against E[h | order]
beyond the law: ``se_target`` (opt-in) draws replays until it is met. Elsewhere the
per-replica estimator above is the fast path. The replays run under the run's whole
:class:`~kvhit.fleet.timing.FleetTiming` (holds, decode time, prefill-done events, hit-token savings, decode KV, from
each re-timed trace's own lengths); the per-replica estimator models none of it beyond holds ``T/speed``. Invariant:
replay j equals ``simulate_fleet`` on the j-th re-timed trace under that timing (tested against a direct loop with
the holds computed by hand).

NOT modelled: everything :mod:`kvhit.estimate.agentic` does not (request durations, in-flight holds, queueing);
the simulator leaves rejected requests out of its ratio while the estimate counts them as misses, so below
``N_min`` the two are different quantities (the estimate is flagged infeasible there). For the KV-aware routers:
the destination's overlap (a moved request goes preferably where an older prefix or a shared system prompt of it
survives; modelled as uniform), prefixes shared across sessions in the stay rule (Mooncake's hot prompts: the
router sees them on several replicas), correlated loads, load-snapshot lag, Dynamo's softmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# the replays' start-time law lives with the single-replica band (one law for both, docs/estimators.md §4.1 and §6),
# re-exported here under its fleet names
from kvhit.estimate.band import UNIFORM_KS_LEVEL, start_law
from kvhit.estimate.band import draw_span_starts as draw_fleet_starts

__all__ = [
    "FleetBlocksEstimate",
    "estimate_fleet_blocks",
    "estimate_fleet_blocks_curve",
    "METHOD_AGENTIC",
    "METHOD_REPLAY",
    "METHOD_STAY",
    "REPLAY_MAX_ACCESSES",
    "UNIFORM_KS_LEVEL",
    "band_from_replays",
    "draw_fleet_starts",
    "fleet_band_blocks",
    "fleet_replays_blocks",
    "max_affordable_replays",
    "kv_routes_blocks",
    "replays_affordable",
    "replay_timing",
    "route_oblivious",
    "start_law",
    "stay_probabilities_blocks",
]


@dataclass(frozen=True)
class FleetBlocksEstimate:
    """A fleet estimate on a block-id trace: ``h`` (fleet), per-replica ``h_k`` and demand ``den_k``, whether the
    capacity is feasible for every replica (``N_k ≥`` its largest prompt), and notes."""

    h: float
    h_k: np.ndarray
    den_k: np.ndarray
    feasible: bool
    notes: list = field(default_factory=list)


def route_oblivious(conv, router: str, R: int, seed: int = 0, **params) -> np.ndarray:
    """Replica of every request (arrival order) under an oblivious router (round-robin, random, session), by running
    the router itself (:mod:`kvhit.fleet.routers`; the same draws as :func:`kvhit.fleet.simulate.simulate_fleet`)."""
    from kvhit.fleet.routers import RouteView, make_router

    rt = make_router(router, R, seed, **params)
    if not rt.oblivious:
        raise ValueError(f"router {router}: route_oblivious needs round-robin, random or session")
    cv = np.asarray(conv, np.int64)
    z = np.zeros(R)
    caps = (1,) * R
    return np.array([rt.route(RouteView(0.0, int(c), 1, 1, (), 1, caps, z, z, z, z, None)) for c in cv], np.int64)


def estimate_fleet_blocks_curve(
    pt,
    replica,
    R: int,
    Ns,
    *,
    engine: str = "vllm",
    metric: str = "tokens",
    form: str = "poisson",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """Fleet hit ratio at every capacity in ``Ns`` when *each* of the ``R`` replicas has that capacity: one agentic
    estimate per replica on its routed sub-trace (all capacities in one call), demand-weighted. Returns ``(h,
    h_k, infeasible, notes)``: ``h`` (len(Ns)), ``h_k`` (R × len(Ns), NaN for an idle replica), ``infeasible``
    (some replica's largest prompt exceeds N) and the estimator's notes, prefixed by the replica."""
    from kvhit.estimate.agentic import estimate_trace

    Ns = np.asarray([int(x) for x in np.atleast_1d(Ns)], np.int64)
    rep = np.asarray(replica, np.int64)
    if rep.shape != (pt.n_requests,):
        raise ValueError(f"replica: expected one replica per request ({pt.n_requests}), got shape {rep.shape}")
    if R < 1 or (rep < 0).any() or (rep >= R).any():
        raise ValueError(f"replica: every entry must be in [0, {R})")
    h_k = np.full((R, Ns.shape[0]), np.nan)
    den_k = np.zeros(R)
    infeasible = np.zeros(Ns.shape[0], bool)
    notes: list[str] = []
    T = np.asarray(pt.prompt_tokens, np.int64)
    nb = np.asarray(pt.prompt_blocks, np.int64)
    for k in range(R):
        on = rep == k
        if not on.any():
            continue
        e = estimate_trace(pt.select(on), Ns, engine=engine, metric=metric, form=form)
        h_k[k] = e.h
        den_k[k] = float(T[on].sum() if metric == "tokens" else nb[on].sum())
        infeasible |= np.asarray(e.infeasible, bool)
        notes += [f"replica {k}: {n}" for n in e.regime.get("notes", []) if not any(n in m for m in notes)]
    ok = den_k > 0
    h = (h_k[ok] * den_k[ok, None]).sum(axis=0) / den_k[ok].sum() if ok.any() else np.full(Ns.shape[0], np.nan)
    return h, h_k, infeasible, notes


def estimate_fleet_blocks(
    pt,
    replica,
    Ns,
    *,
    engine: str = "vllm",
    metric: str = "tokens",
    form: str = "poisson",
) -> FleetBlocksEstimate:
    """Fleet hit ratio of the block-id trace ``pt`` (a :class:`~kvhit.workload.production.ProductionTrace`, requests
    in time order) when request ``r`` went to ``replica[r]`` and replica k has ``Ns[k]`` blocks: the agentic
    estimator on each replica's routed sub-trace, demand-weighted (module docstring). ``form="replay"`` uses the
    estimator's working-set identity per replica (exact window footprints; a reference, not a model)."""
    from kvhit.estimate.agentic import estimate_trace

    Ns = [int(x) for x in Ns]
    R = len(Ns)
    if len(set(Ns)) == 1:
        h, h_k, inf, notes = estimate_fleet_blocks_curve(pt, replica, R, Ns[:1], engine=engine, metric=metric,
                                                         form=form)  # fmt: skip
        rep = np.asarray(replica, np.int64)
        T = np.asarray(pt.prompt_tokens if metric == "tokens" else pt.prompt_blocks, float)
        den_k = np.bincount(rep, weights=T, minlength=R)
        return FleetBlocksEstimate(float(h[0]), h_k[:, 0], den_k, not bool(inf[0]), notes)
    rep = np.asarray(replica, np.int64)
    if rep.shape != (pt.n_requests,):
        raise ValueError(f"replica: expected one replica per request ({pt.n_requests}), got shape {rep.shape}")
    if R < 1 or (rep < 0).any() or (rep >= R).any():
        raise ValueError(f"replica: every entry must be in [0, {R}) (one capacity per replica in Ns)")
    h_k = np.full(R, np.nan)
    den_k = np.zeros(R)
    feasible = True
    notes: list[str] = []
    T = np.asarray(pt.prompt_tokens, np.int64)
    nb = np.asarray(pt.prompt_blocks, np.int64)
    for k in range(R):
        on = rep == k
        if not on.any():
            continue
        e = estimate_trace(pt.select(on), [Ns[k]], engine=engine, metric=metric, form=form)
        h_k[k] = float(e.h[0])
        den_k[k] = float(T[on].sum() if metric == "tokens" else nb[on].sum())
        feasible &= not bool(e.infeasible[0])
        notes += [f"replica {k}: {n}" for n in e.regime.get("notes", []) if not any(n in m for m in notes)]
    ok = den_k > 0
    h = float((h_k[ok] * den_k[ok]).sum() / den_k[ok].sum()) if ok.any() else float("nan")
    return FleetBlocksEstimate(h, h_k, den_k, bool(feasible), notes)


def stay_probabilities_blocks(
    pt,
    router: str,
    R: int,
    *,
    hold=None,
    Ns=None,
    params: dict | None = None,
    rate: float | None = None,
    samples: int = 2048,
    seed: int = 0,
    reuse=None,
):
    """Per request, the probability that a KV-aware (or sticky) router keeps it on the replica of the previous
    request of its stream (NaN without one), and that previous request (−1 without): the rules of
    :func:`kvhit.fleet.estimate.stay_probabilities_arrays` with overlap ``x = min(L_own, (T−1)//b)`` (the common
    prefix with the previous request, capped as vLLM) and gap ``W = t_r − t_prev``."""
    from kvhit.fleet.estimate import stay_probabilities_arrays
    from kvhit.workload.reuse import request_reuse

    u = reuse if reuse is not None else request_reuse(pt)
    prev = np.asarray(u.prev, np.int64)
    first = prev < 0
    x = np.where(first, 0, np.minimum(u.L_own, u.hit_cap)).astype(np.int64)
    t = np.asarray(pt.time, float)
    W = np.where(first, np.inf, t - t[np.maximum(prev, 0)])
    T = np.asarray(pt.prompt_tokens, np.int64)
    q = stay_probabilities_arrays(
        T, x, W, first, t, router, R, hold=hold, Ns=Ns, params=params, rate=rate, block_size=int(pt.block_size),
        samples=samples, seed=seed,
    )  # fmt: skip
    return q, prev


def kv_routes_blocks(prev, q, R: int, seed: int = 0) -> np.ndarray:
    """A routing drawn from the stay model (requests in time order, ``prev[r] < r``): a request without a previous
    one goes to a uniform replica; request r stays on ``prev[r]``'s replica with probability ``q[r]``, else goes to
    one of the R − 1 others uniformly. Seeded (one uniform, one destination and one jump per request)."""
    prev = np.asarray(prev, np.int64)
    n = prev.shape[0]
    if (prev >= np.arange(n)).any():
        raise ValueError("prev: every previous request must come earlier in time order")
    rng = np.random.default_rng(seed)
    u = rng.random(n)
    d = rng.integers(0, R, size=n)
    jump = rng.integers(1, max(R, 2), size=n)
    qa = np.asarray(q, float)
    out = np.empty(n, np.int64)
    for r in range(n):
        p = prev[r]
        if p < 0:
            out[r] = d[r]
        elif u[r] < qa[r]:
            out[r] = out[p]
        else:
            out[r] = (out[p] + jump[r]) % R
    return out


#: The replay rule (issue 23 §6: where an exact replay is cheaper than the estimator, use it). A block-id fleet row's
#: expected value is the mean of ``K`` exact fleet replays at redrawn start times when ``K`` × (the trace's block
#: accesses, Σ full prompt blocks) is at most this many block accesses — ≈ 4 s at the ≈ 2.5·10⁷ accesses/s the
#: compiled fleet passes run at (benchmarks/fleet_blocks_accuracy.py ``--only replay`` prints the cost) — and the
#: per-replica estimator otherwise (its cost does not grow with the trace's block count: ≈ 1 s on a 35-conversation
#: WEKA pool, 1–2 s on Mooncake, where 16 replays take ≈ 2.5 s and ≈ 1 s).
REPLAY_MAX_ACCESSES = 100_000_000

#: The method names a block-id fleet row reports (``estimate_method``).
METHOD_REPLAY = "replay-mean"
METHOD_AGENTIC = "agentic-per-replica"
METHOD_STAY = "stay-model+agentic-per-replica"


def replays_affordable(pt, replays: int) -> bool:
    """The replay rule: ``replays`` × ``pt``'s block accesses ≤ :data:`REPLAY_MAX_ACCESSES` (every router and timing
    runs compiled: the KV-aware fleet pass, or an oblivious router per replica or, with hit-token savings, through
    the fleet pass with its routes fixed in advance)."""
    return int(replays) * int(np.asarray(pt.full_blocks, np.int64).sum()) <= REPLAY_MAX_ACCESSES


def max_affordable_replays(pt, cap: int = 1024) -> int:
    """The most replays of ``pt`` within :data:`REPLAY_MAX_ACCESSES` block accesses, at most ``cap``."""
    n = max(int(np.asarray(pt.full_blocks, np.int64).sum()), 1)
    return int(min(int(cap), REPLAY_MAX_ACCESSES // n))


def replay_timing(speed=None, timing=None):
    """The replays' :class:`kvhit.fleet.timing.FleetTiming`: ``timing`` as given, or holds ``T/speed`` from the
    shorthand ``speed`` (None: instantaneous requests); both given is refused."""
    from kvhit.fleet.timing import FleetTiming

    if timing is not None and speed is not None:
        raise ValueError("speed: give the prefill speed inside timing, not both")
    return timing if timing is not None else FleetTiming(prefill_tokens_per_s=speed)


def _fleet_ratios(p2, router, caps, *, engine, router_params, speed=None, lag, seed, timing=None) -> np.ndarray:
    """Exact fleet token hit ratio of ``p2`` at every capacity vector in ``caps`` (P × R): per replica
    :func:`kvhit.sim.vllm.curve.block_curve` on the routed sub-trace for an oblivious router without holds or decode
    KV when every capacity fits the largest prompt (one pass for all capacities; the fleet is R independent
    replicas, equal to :func:`kvhit.fleet.simulate.simulate_fleet` — tested), else
    :func:`~kvhit.fleet.simulate.simulate_fleet` per capacity vector (the compiled pass for the KV-aware routers)
    under ``timing`` (:func:`replay_timing`: holds, prefill-done events, hit-token savings computed from ``p2``'s own
    prompt and output lengths, and with ``timing.decode_kv`` the generated tokens' blocks, fresh ids, allocated in
    the KV: :meth:`~kvhit.workload.production.ProductionTrace.to_block_requests` ``colocated=True``)."""
    from kvhit.fleet.routers import make_router
    from kvhit.fleet.simulate import simulate_fleet

    tmg = replay_timing(speed, timing)
    caps = np.asarray(caps, np.int64)
    P, R = caps.shape
    hold, ph, hts = tmg.holds(p2.prompt_tokens, p2.output_tokens)
    obl = make_router(router, R, seed, **(router_params or {})).oblivious
    if obl and hold is None and not tmg.decode_kv and caps.min() >= int(p2.prompt_blocks.max()):
        from kvhit.sim.vllm.curve import block_curve

        rep = route_oblivious(p2.session, router, R, seed=seed, **(router_params or {}))
        hits = np.zeros(P)
        for k in range(R):
            on = rep == k
            if not on.any():
                continue
            rq = p2.select(on).to_block_requests()
            u = np.unique(caps[:, k])
            c = block_curve(rq.prompt_tokens, rq.hash_offsets, rq.hashes, block_size=rq.block_size, Ns=u, engine=engine)
            ht = dict(zip(np.asarray(c["N"]).tolist(), np.asarray(c["hit_tokens"], float).tolist(), strict=True))
            hits += np.array([ht[int(n)] for n in caps[:, k]])
        return hits / float(np.asarray(p2.prompt_tokens, np.int64).sum())
    rq = p2.to_block_requests(colocated=tmg.decode_kv)
    kv = dict(colocated=True, response_tokens=rq.response_tokens) if tmg.decode_kv else {}
    out = np.empty(P)
    for i in range(P):
        res = simulate_fleet(
            p2.prompt_tokens, rq.hash_offsets, rq.hashes, np.asarray(p2.session, np.int64), Ns=caps[i].tolist(),
            block_size=int(p2.block_size), router=router, router_params=router_params, engine=engine,
            times=np.asarray(p2.time, float), hold=hold, seed=seed, lag=lag, prefill_hold=ph, hit_token_seconds=hts,
            **kv,
        )  # fmt: skip
        out[i] = res.token_hit_ratio()
    return out


def fleet_replays_blocks(
    pt,
    router: str,
    caps,
    *,
    engine: str = "vllm",
    router_params: dict | None = None,
    speed: float | None = None,
    lag: float = 0.0,
    replays: int = 16,
    seed: int = 0,
    law: str | None = None,
    timing=None,
    se_target: float | None = None,
    max_replays: int = 1024,
    keep: bool = True,
    start_seed=None,
) -> np.ndarray:
    """Exact fleet hit ratios (``replays`` × P) of ``pt`` re-timed at ``replays`` start-time draws
    (:func:`draw_fleet_starts` with the law :func:`start_law` picks, or ``law``; generator ``seed``;
    :func:`kvhit.estimate.band.restart_sessions`), at each of the P capacity vectors ``caps`` (P × R, or one vector
    of R), any router :func:`kvhit.fleet.simulate.simulate_fleet` runs (router seed ``seed``; the load lag ``lag``;
    holds ``T/speed`` when ``speed`` is given, or the run's :class:`~kvhit.fleet.timing.FleetTiming` ``timing`` —
    decode time, prefill-done events, hit-token savings, decode KV — applied to each re-timed trace's own prompt and
    output lengths, which :func:`~kvhit.estimate.band.restart_sessions` carries with their requests). Replay j is
    ``simulate_fleet`` on the j-th re-timed trace under that timing.

    ``se_target`` (opt-in, default off): after the first ``replays`` draws, keep drawing (same generator, so the
    first ``replays`` rows are those of the fixed count) until the Monte Carlo standard error of the mean, ``s/√K``,
    is at most ``se_target`` at every capacity, or ``max_replays`` rows. The replays' mean is an estimate of
    E[h | order] with that error (docs/estimators.md §6, block-id traces: the error of 16 replays, not the start law,
    is what ``benchmarks/fleet_bias_diagnosis.py`` found behind the held-35new miss).

    ``keep=False``: the same draws handed out i.i.d. (the order of the sessions redrawn: the exchangeable law of
    :func:`kvhit.estimate.band.expected_replays`), so the mean estimates E[h] over the start law instead of E[h |
    order]. ``start_seed`` (default ``seed``): the start-time generator's seed alone (an int or a sequence of ints),
    the routers keep ``seed``."""
    from kvhit.estimate.band import restart_sessions, session_starts

    tmg = replay_timing(speed, timing)
    caps = np.atleast_2d(np.asarray(caps, np.int64))
    first = session_starts(pt)
    law = law or start_law(first)
    rng = np.random.default_rng(seed if start_seed is None else start_seed)
    if se_target is not None and not se_target > 0:
        raise ValueError(f"se_target: expected a positive standard error, got {se_target}")
    K0 = int(replays)
    cap = max(K0, int(max_replays)) if se_target is not None else K0
    H = np.empty((cap, caps.shape[0]))
    K = 0
    while K < cap:
        if K >= max(K0, 2) and float(H[:K].std(axis=0, ddof=1).max()) / math.sqrt(K) <= se_target:
            break
        p2 = restart_sessions(pt, draw_fleet_starts(first, rng, law, keep))
        H[K] = _fleet_ratios(p2, router, caps, engine=engine, router_params=router_params, lag=lag, seed=seed,
                             timing=tmg)  # fmt: skip
        K += 1
    return H[:K]


def band_from_replays(H, est: float | None = None, *, level: float = 0.9, tol: float = 0.01, widen: bool = True):
    """``(lo, hi, m, se, notes)`` from replay ratios ``H`` (K,): eq. (B1) ``m ∓ t_{K−1}·√(1 + 1/K)·s``, widened to
    contain ``est`` when it differs from ``m`` by more than ``tol`` + 2 standard errors, then by
    :data:`~kvhit.estimate.band.WIDEN` on each side when ``widen``; ``se = s/√K`` (the mean's Monte Carlo error)."""
    from kvhit.estimate.band import WIDEN, prediction_factor

    H = np.asarray(H, float)
    K = H.shape[0]
    m, s = float(H.mean()), float(H.std(ddof=1)) if K > 1 else 0.0
    q = prediction_factor(level, K)
    lo, hi = m - q * s, m + q * s
    notes = []
    if est is not None and math.isfinite(est) and abs(est - m) > tol + 2.0 * s / math.sqrt(K):
        lo, hi = min(lo, est), max(hi, est)
        notes.append(f"the estimate differs from the mean of {K} exact fleet replays by {abs(est - m):.3f}")
    if widen:
        lo, hi = lo - WIDEN, hi + WIDEN
    return max(lo, 0.0), min(hi, 1.0), m, s / math.sqrt(K), notes


def fleet_band_blocks(
    pt,
    router: str,
    Ns,
    est: float | None = None,
    *,
    engine: str = "vllm",
    router_params: dict | None = None,
    speed: float | None = None,
    lag: float = 0.0,
    level: float = 0.9,
    replays: int = 16,
    seed: int = 0,
    tol: float = 0.01,
    timing=None,
    se_target: float | None = None,
    max_replays: int = 1024,
    expected_se: float | None = None,
) -> dict:
    """Expected value and band (B1) for one realisation of the start times of a fleet on ``pt`` (one capacity per
    replica in ``Ns``) behind any router ``simulate_fleet`` runs (oblivious, or KV-aware through the compiled fleet
    pass; holds ``T/speed``, or the run's ``timing``): ``replays`` exact fleet replays
    (:func:`fleet_replays_blocks`). ``h_mc`` (their mean) is the row's expected value (``method``
    :data:`METHOD_REPLAY`), ``h_se`` its Monte Carlo standard error; the band is ``m ∓ t_{K−1}·√(1 + 1/K)·s``,
    widened to contain ``est`` (an estimator's value, when given) if they disagree by more than ``tol`` + 2
    standard errors, and by :data:`~kvhit.estimate.band.WIDEN` on each side. Returns ``h_lo``, ``h_hi``, ``h_mc``,
    ``h_se``, ``level``, ``replays`` (drawn: more than asked with ``se_target``, :func:`fleet_replays_blocks`),
    ``seed``, ``validated`` (False), ``method``, ``notes``. ``expected_se``: also ``h_exp`` / ``h_exp_se`` /
    ``exp_replays``, the mean of replays that redraw the sessions' order (``keep=False``: E[h] over the exchangeable
    start law, not E[h | order]; generator ``[seed, 1]``, at least 32, until s/√K ≤ ``expected_se`` or
    ``max_replays``)."""
    from kvhit.estimate.band import WIDEN, session_starts

    Ns = [int(x) for x in Ns]
    law = start_law(session_starts(pt))
    H = fleet_replays_blocks(pt, router, [Ns], engine=engine, router_params=router_params, speed=speed, lag=lag,
                             replays=replays, seed=seed, law=law, timing=timing, se_target=se_target,
                             max_replays=max_replays)[:, 0]  # fmt: skip
    lo, hi, m, se, notes = band_from_replays(H, est, level=level, tol=tol)
    notes.append(f"not validated (docs/estimators.md §6, block-id traces): widened by ±{WIDEN}")
    exp = {}
    if expected_se is not None:
        X = fleet_replays_blocks(pt, router, [Ns], engine=engine, router_params=router_params, speed=speed, lag=lag,
                                 replays=32, seed=seed, start_seed=[int(seed), 1], law=law, timing=timing,
                                 se_target=expected_se, max_replays=max(32, max_replays), keep=False)[:, 0]  # fmt: skip
        exp = {"h_exp": float(X.mean()), "h_exp_se": float(X.std(ddof=1) / math.sqrt(X.shape[0])),
               "exp_replays": int(X.shape[0])}  # fmt: skip
        if exp["h_exp_se"] > expected_se:
            notes.append(
                f"the expected value h_exp: standard error {exp['h_exp_se']:.4f} after {X.shape[0]} replays, above "
                f"the {expected_se:g} asked"
            )
    return exp | {
        "h_lo": lo,
        "h_hi": hi,
        "h_mc": m,
        "h_se": se,
        "level": float(level),
        "replays": int(H.shape[0]),
        "seed": int(seed),
        "validated": False,
        "method": METHOD_REPLAY,
        "starts": law,
        "notes": notes,
    }
