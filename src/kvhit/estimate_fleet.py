"""Fleet hit-ratio estimators for cache-oblivious routers (docs/estimators.md, section "The fleet").

Idea: a replica sees *fragments* of conversations — the turns of conversation c that the router sent to replica k,
in order. A fragment behaves, for replica k's cache, exactly like a conversation of its own: its first turn finds
nothing of c cached on k (the history was built elsewhere) and allocates its whole prompt, ⌈T/b⌉ blocks; a later
turn j of the fragment can hit the full blocks of the fragment's previous prompt T_i (i = the last earlier turn of c
on k), if they survived the gap t_j − t_i. So the engine-aware estimator (:func:`kvhit.estimate.estimate_engine`:
eq. (38) with the engine's displacement, tail-first partial survival, finite N and fluctuations) applies to each
replica's fragment trace at that replica's fragment arrival rate.

* session affinity (ring, or sticky with a TTL longer than every gap): fragments = whole conversations, so a
  replica is one cache at λ0·p_k (p_k = its share of conversations; 1/R in expectation) — "R independent caches at
  λ0/R".
* round-robin and random: a turn's replica is (nearly) independent of the previous turn's, so fragments are
  thinned conversations (each turn kept with probability 1/R); the j-th turn hits only if an earlier turn of its
  conversation went to the same replica and survived there.

The routing itself is taken as given (:func:`routes`: the router is run, which needs no cache simulation for these
routers). Heterogeneous capacities: each replica is estimated with its own N and fragments, and the fleet ratio is
the demand-weighted mean.

Two forms (docs/estimators.md §6 derives and measures both):

* :func:`estimate_fleet` (the default everywhere): the window-exact form of :func:`kvhit.estimate.estimate_window`
  on the fragment trace. Every measured fragment revisit j is paired with *its own* fragment gap W_j (the sum of
  the conversation gaps since the last turn of c on the same replica) and survives iff D(W_j) ≤ C − 1 − i for
  block i; D(W_j) has the Lemma D.1/D.4 mean and variance of the other fragments (the characteristic-time
  equation (38) with each fragment's own gaps). This is what makes R = 2 right: a fragment revisit's gap and its
  history are *correlated* (a late turn can skip more turns, so it has both a bigger history and a longer gap;
  turn 2 is a revisit only with lag 1), so the pooled F̂ of eq. (38)–(39), which pairs every history with every
  gap, misplaces the hits (−0.016 at R = 2 on ShareGPT even after a 4,000-conversation warm-up). The rows are the
  ones the simulator counts (a row mask or :class:`~kvhit.workload.trace.Window`).
* :func:`estimate_fleet_oblivious`: the stationary estimator :func:`kvhit.estimate.estimate_engine` (pooled F̂) on
  the fragments of the conversations selected by ``rows`` — kept for comparison; exact for affinity only.

NOT modelled: load-dependent routing (KV-aware routers lie between round-robin and affinity; no estimator here),
in-flight holds, shared prefixes across conversations (as the engine-aware estimator).
"""

from __future__ import annotations

import numpy as np

from .estimate import estimate_engine
from .workload.trace import Trace

__all__ = ["fragment_trace", "routes", "estimate_fleet", "estimate_fleet_oblivious"]


def routes(trace: Trace, router: str, R: int, seed: int = 0, **params) -> np.ndarray:
    """The replica of every row (trace order) under an oblivious router (round-robin, random, session)."""
    from .sim.routers import RouteView, make_router

    rt = make_router(router, R, seed, **params)
    if not rt.oblivious:
        raise ValueError(f"router {router}: routes() needs an oblivious router (round-robin, random, session)")
    conv = trace.dense_conv()
    z = np.zeros(R)
    out = np.empty(trace.n_turns, np.int64)
    for r in range(trace.n_turns):
        out[r] = rt.route(RouteView(0.0, int(conv[r]), 1, 1, (), 1, (1,) * R, z, z, z, z, None))
    return out


def fragment_trace(trace: Trace, replica: np.ndarray, R: int) -> Trace:
    """The routed fragments as a trace: conversation ``c·R + k`` = the turns of ``c`` on replica ``k`` (turns
    renumbered 1.., ``M`` = fragment length, ``conv_arrival`` = its first turn); token columns unchanged."""
    c = trace.cols
    rep = np.asarray(replica, np.int64)
    fid = trace.dense_conv().astype(np.int64) * R + rep
    order = np.lexsort((c["turn"], fid))
    f = fid[order]
    start = np.concatenate([[True], f[1:] != f[:-1]])
    sidx = np.flatnonzero(start)
    counts = np.diff(np.append(sidx, f.size))
    turn = np.empty(f.size, np.int64)
    turn[order] = np.arange(f.size) - np.repeat(sidx, counts) + 1
    M = np.empty(f.size, np.int64)
    M[order] = np.repeat(counts, counts)
    arr = np.empty(f.size)
    arr[order] = np.repeat(np.asarray(c["time"], float)[order][sidx], counts)
    cols = dict(c)
    R_blocks = np.asarray(c["R"], np.int64)
    Rprev = np.zeros(f.size, np.int64)
    ro = R_blocks[order]
    Rprev_o = np.concatenate([[0], ro[:-1]])
    Rprev_o[start] = 0
    Rprev[order] = Rprev_o
    cols.update(
        conv=fid,
        turn=turn.astype(np.int32),
        M=M.astype(np.int32),
        conv_arrival=arr,
        Z=np.maximum(R_blocks - Rprev, 1),
    )
    return Trace(cols, dict(trace.meta), {})


def _lam0(trace: Trace, lam0, engine, block_size) -> float:
    if lam0 is not None:
        return float(lam0)
    if "lam0" in trace.meta:
        return float(trace.meta["lam0"])
    from .estimate import engine_accounting

    return float(engine_accounting(trace, engine=engine, block_size=block_size).lam0_hat)


def estimate_fleet(
    trace: Trace,
    replica: np.ndarray,
    Ns,
    *,
    window=None,
    engine: str = "vllm",
    metric: str = "tokens",
    lam0: float | None = None,
    block_size: int | None = None,
    origin: float | None = 0.0,
    fluctuations: bool = True,
) -> float:
    """Fleet hit ratio over the rows ``window`` counts (row mask or Window; default all) when row ``r`` went to
    ``replica[r]`` and replica k has ``Ns[k]`` blocks: the window-exact engine estimator
    (:func:`kvhit.estimate.estimate_window`, own gap per revisit, Lemma D.1 variance, no conversation before
    ``origin``) on each replica's fragments at λ_k = λ0 · (#fragments on k)/(#conversations) (``lam0``: the
    fleet's conversation rate; default the trace's ``lam0`` metadata, else λ̂0).

    With R = 1 this is :func:`kvhit.estimate.estimate_window` on the trace itself; with every conversation on
    one replica (affinity) and equal N it is the single-replica estimate at λ0/R (both tested). Equal capacities
    are estimated in one call on all fragments at the mean λ_k; unequal ones per replica, combined by the
    measured demand of each replica's rows (the metric's denominator; rejected rows are not removed from it).
    """
    from .estimate import _row_demand, engine_accounting, estimate_window

    Ns = [int(x) for x in Ns]
    R = len(Ns)
    rep = np.asarray(replica, np.int64)
    if rep.shape != (trace.n_turns,):
        raise ValueError(f"replica: expected one replica per row ({trace.n_turns}), got shape {rep.shape}")
    if R < 1 or (rep < 0).any() or (rep >= R).any():
        raise ValueError(f"replica: every entry must be in [0, {R}) (one capacity per replica in Ns)")
    if window is None:
        wm = np.ones(trace.n_turns, bool)
    elif hasattr(window, "mask"):
        wm = np.asarray(window.mask(trace), bool)
    else:
        wm = np.asarray(window, bool)
    lam = _lam0(trace, lam0, engine, block_size)
    frag = fragment_trace(trace, rep, R)
    n_conv = np.unique(trace["conv"]).size
    fid = frag["conv"]
    kw = dict(engine=engine, metric=metric, block_size=block_size, origin=origin, fluctuations=fluctuations)
    if len(set(Ns)) == 1:
        n_frag = np.unique(fid).size
        return float(estimate_window(frag, Ns[0], lam * n_frag / n_conv / R, window=wm, **kw).h)
    acc = engine_accounting(frag, engine=engine, metric=metric, block_size=block_size)
    order = frag.conv_index()[2]
    dem = np.empty(trace.n_turns)
    dem[order] = _row_demand(frag, acc, order)
    hits = den = 0.0
    for k in range(R):
        on = rep == k
        if not (on & wm).any():
            continue
        sub = frag.select(on)
        n_frag = np.unique(fid[on]).size
        h = float(estimate_window(sub, Ns[k], lam * n_frag / n_conv, window=wm[on], **kw).h)
        d = float(dem[on & wm].sum())
        hits += h * d
        den += d
    return hits / den if den else float("nan")


def estimate_fleet_oblivious(
    trace: Trace,
    replica: np.ndarray,
    Ns,
    *,
    engine: str = "vllm",
    rows=None,
    lam0: float | None = None,
    block_size: int | None = None,
) -> float:
    """Token hit ratio of a fleet whose router sent row ``r`` to ``replica[r]`` (``Ns[k]`` blocks on replica k).

    ``lam0``: the fleet's conversation arrival rate (default: the trace's λ̂0). Replica k's fragment rate is
    ``lam0 · (fragments on k) / (conversations)``.
    """
    R = len(Ns)
    frag = fragment_trace(trace, replica, R)
    if lam0 is None:
        from .estimate import engine_accounting

        lam0 = float(engine_accounting(trace, engine=engine, block_size=block_size).lam0_hat)
    n_conv = np.unique(trace["conv"]).size
    fid = frag["conv"]
    mrow = np.ones(trace.n_turns, bool) if rows is None else np.asarray(rows, bool)
    T = np.asarray(trace["cum_tokens"] if "cum_tokens" in trace.cols else trace["R"], float)
    hits = dem = 0.0
    if len(set(Ns)) == 1:
        n_frag = np.unique(fid).size
        e = estimate_engine(frag, Ns[0], lam0 * n_frag / n_conv / R, engine=engine, rows=mrow, block_size=block_size)
        return float(e.h)
    for k in range(R):
        on = np.asarray(replica) == k
        if not (on & mrow).any():
            continue
        sub = frag.select(on)
        n_frag = np.unique(fid[on]).size
        e = estimate_engine(sub, Ns[k], lam0 * n_frag / n_conv, engine=engine, rows=mrow[on], block_size=block_size)
        d = float(T[on & mrow].sum())
        hits += float(e.h) * d
        dem += d
    return hits / dem if dem else float("nan")
