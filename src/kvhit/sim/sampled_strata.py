"""The ``stratified`` reading of a block sample: post-stratification by the exact reuse gap, ratio thresholds.

For a trace held in memory (production block-id traces: Mooncake, WEKA) one extra pass over *every* access gives,
for each measured lookup block ``a``, its exact **reuse gap** ``τ_a``: the entries appended to the free queue by the
requests from the block id's previous request up to (not including) this one (``∞`` when the id was never seen
before: no hit at any capacity). ``N*_a − 1 − e`` (the entries above the block) counts a subset of those entries
minus the ones moved since, so ``τ`` predicts ``N*`` closely (on Mooncake ``N*/τ`` is 0.65–0.96 for 98 % of the
lookups). Two uses, both design-unbiased to first order, nothing fitted:

1. **Ratio thresholds.** The sampled pass estimates the entries above a kept lookup as ``t_s − 1`` (Horvitz–Thompson
   over the kept entries above it). The kept weight ``K_a`` appended by the same requests estimates ``τ_a``, which is
   known exactly — with the lookup's own id (in the sample by construction, its appends all in the previous
   request) counted with weight 1, not ``1/R``, or ``K`` is size-biased by ``≈ 1/R − 1`` — so

       N̂*_a = 1 + (t_s − 1) · τ_a / K_a          (``K_a = 0``: ``t_s`` kept)

   a ratio estimator: where the share ``f = N*/τ`` is stable its relative variance is ``(1 − f)/(R·N)`` instead of
   ``1/(R·N)``. At rate 1 ``K_a = τ_a`` and ``N̂* = t_s`` (exact).
2. **Post-stratification.** The non-hot measured lookups of the *whole* trace are split into strata by ``τ``
   (quantile edges of the sampled gaps, :data:`PER_STRATUM` sampled lookups each, plus the never-seen stratum, which
   has no hit); the estimated hit count is ``Σ_hot 1{N̂* ≤ N} + Σ_k P_k · (share of the stratum's sampled lookups
   with N̂* ≤ N)``, ``P_k`` the exact population count of stratum ``k``. Hot ids (kept whole) are counted directly.
   Which ids fall in a 1 % sample then matters only through the spread of ``1{N* ≤ N}`` *within* a stratum.

Standard error (:func:`stratified_se`): the linearised Horvitz–Thompson variance of that total over the kept non-hot
ids, ``(1 − R)/R² Σ_j (Σ_{a ∈ j} R·P_k/n_k·(y_a − F̂_k))²`` (``n_k`` sampled lookups of stratum ``k``); like the
other readings' error it leaves out the noise of the thresholds themselves.

Invariants (tested): rate 1, or every id hot, gives the exact curve; the reading is a deterministic function of the
sample and the exact gaps. Memory: four int64 and two bytes per access of the trace during the gap pass, then one
int64 per non-hot measured lookup (the sorted population gaps) — an in-memory trace only; the streamed Parquet path
has no gap pass. NOT modelled: the noise of ``N̂*`` in :func:`stratified_se` (the jackknife of
:class:`~kvhit.sim.sampled.SampledBlockCurve` includes it); the strata are formed from the sample (their
edges are random), which the variance formula treats as fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvhit.workload.hashing import fmix64

__all__ = [
    "GROUPS",
    "PER_STRATUM",
    "GapPass",
    "ReuseGaps",
    "gap_pass",
    "jackknife_se",
    "jackknife_thresholds",
    "sample_gaps",
    "stratified_hits",
    "stratified_se",
]

PER_STRATUM: int = 25  #: sampled non-hot lookups per stratum (fixed before the held-out evaluation)
GROUPS: int = 20  #: jackknife groups of the stated error (:func:`jackknife_se`)
_NEVER = np.iinfo(np.int64).max
_PARTIAL_KEY = np.int64(0x5BD1E995)  # the key of a vLLM ≤ 0.23 partial entry (request index ^ this), as sampled.py


@dataclass(frozen=True)
class ReuseGaps:
    """Per kept measured lookup (stream order): exact gap ``τ`` (NEVER: id not seen before) and the kept weight
    ``K`` appended by the same requests; ``population``: sorted ``τ`` of every non-hot measured lookup."""

    gap: np.ndarray
    since: np.ndarray
    population: np.ndarray


@dataclass(frozen=True)
class GapPass:
    """The sample-independent part of the gap pass: per access its id, request, hot flag, whether it is a measured
    lookup, the previous request holding its id (−1: none); per request the entries appended before it and whether
    it appends a vLLM ≤ 0.23 partial entry; the sorted population gaps."""

    ids: np.ndarray
    req: np.ndarray
    hot: np.ndarray
    look: np.ndarray
    prev: np.ndarray
    prev_count: np.ndarray  #: accesses of the same id in its previous request (its own appends in the range)
    E: np.ndarray
    part: np.ndarray
    population: np.ndarray


def gap_pass(T, L, off, hs, *, b: int, new_engine: bool, measured, hot) -> GapPass:
    """Exact reuse gaps of every access (inputs as :func:`kvhit.sim.vllm.block.request_stream` returns them)."""
    T = np.asarray(T, np.int64)
    L = np.asarray(L, np.int64)
    off = np.asarray(off, np.int64)
    n = T.shape[0]
    cnt = np.diff(off)
    part = np.zeros(n, bool) if new_engine else (L % b != 0)
    E = np.concatenate([[0], np.cumsum(cnt + part)])  # entries appended before request r
    req = np.repeat(np.arange(n, dtype=np.int64), cnt)
    ids = np.ascontiguousarray(np.asarray(hs, np.int64)[off[0] : off[-1]])
    pos = np.arange(ids.shape[0], dtype=np.int64) - (off[req] - off[0])
    # previous request (strictly earlier) holding the same id: sort by (id, request); per (id, request) group the
    # request of the group before it when that group has the same id
    o = np.lexsort((req, ids))
    sid, sreq = ids[o], req[o]
    head = np.ones(min(ids.shape[0], 1), bool)  # no access at all: empty groups
    newid = np.concatenate([head, sid[1:] != sid[:-1]])
    newreq = newid | np.concatenate([head, sreq[1:] != sreq[:-1]])
    grp = np.cumsum(newreq) - 1
    greq = sreq[newreq]
    gprev = np.where(newid[newreq], -1, np.concatenate([[-1], greq[:-1]]))
    gsize = np.diff(np.concatenate([np.flatnonzero(newreq), [ids.shape[0]]]))
    gprevn = np.where(newid[newreq], 0, np.concatenate([[0], gsize[:-1]]))
    prev = np.empty(ids.shape[0], np.int64)
    prev[o] = gprev[grp]
    prev_count = np.empty(ids.shape[0], np.int64)
    prev_count[o] = gprevn[grp]
    del o, sid, sreq, newid, newreq, grp
    hot_a = np.isin(ids, hot) if np.asarray(hot).size else np.zeros(ids.shape[0], bool)
    look = (pos < (T[req] - 1) // b) & np.asarray(measured, bool)[req]
    gap = np.where(prev >= 0, E[req] - E[np.maximum(prev, 0)], _NEVER)
    population = np.sort(gap[look & ~hot_a])
    return GapPass(ids, req, hot_a, look, prev, prev_count, E, part, population)


def _hash_keep(ids: np.ndarray, saltmix, thr, lo, hi) -> np.ndarray:
    with np.errstate(over="ignore"):
        h = fmix64(ids.view(np.uint64) ^ np.uint64(saltmix))
    return (h < np.uint64(thr)) & ~((h >= np.uint64(lo)) & (h < np.uint64(hi)))


def sample_gaps(gp: GapPass, *, saltmix, thr, full: bool, rate: float, lo=0, hi=0) -> ReuseGaps:
    """The gaps and ``K`` of the lookups kept by :mod:`kvhit.sim.sampled`'s rule (``fmix64(id ⊕ saltmix) < thr``
    less ``[lo, hi)``, or hot; vLLM ≤ 0.23's partial entries keyed by the request index), weight ``1/rate``."""
    n = gp.E.shape[0] - 1
    keep = np.ones(gp.ids.shape[0], bool) if full else gp.hot | _hash_keep(gp.ids, saltmix, thr, lo, hi)
    inv = 1.0 / rate
    wreq = np.bincount(gp.req, weights=np.where(keep, np.where(gp.hot, 1.0, inv), 0.0), minlength=n).astype(float)
    if gp.part.any():
        pk = np.ones(n, bool) if full else _hash_keep(np.arange(n, dtype=np.int64) ^ _PARTIAL_KEY, saltmix, thr, lo, hi)
        wreq += np.where(gp.part & pk, inv, 0.0)
    cumW = np.concatenate([[0.0], np.cumsum(wreq)])
    sel = gp.look & keep
    r = gp.req[sel]
    p = gp.prev[sel]
    seen = p >= 0
    pz = np.maximum(p, 0)
    gap = np.where(seen, gp.E[r] - gp.E[pz], _NEVER)
    since = np.where(seen, cumW[r] - cumW[pz], 0.0)
    # a kept lookup's own id is in the sample by construction: its appends in the range (all in its previous
    # request) count once, as in τ, not 1/rate times — else K is size-biased by ≈ 1/rate − 1
    since -= np.where(gp.hot[sel], 0.0, (inv - 1.0) * gp.prev_count[sel])
    return ReuseGaps(gap=gap, since=since, population=gp.population)


def ratio_thresholds(thresholds: np.ndarray, gap: np.ndarray, since: np.ndarray) -> np.ndarray:
    """``1 + (t_s − 1)·τ/K`` where the lookup was seen before and ``K > 0``; ``t_s`` elsewhere (rounded)."""
    thr = np.asarray(thresholds, np.int64)
    ok = (thr < _NEVER) & (since > 0)
    out = thr.copy()
    out[ok] = 1 + np.round((thr[ok] - 1).astype(np.float64) * gap[ok] / since[ok]).astype(np.int64)
    return out


def _strata(gap_cold: np.ndarray, population: np.ndarray, per: int):
    """Stratum of each sampled non-hot lookup (−1: never seen), the edges, and each stratum's exact population."""
    fin = gap_cold < _NEVER
    st = np.sort(gap_cold[fin])
    nb = max(1, st.size // per)
    edges = np.unique(st[(np.arange(1, nb) * st.size) // nb]) if nb > 1 else np.zeros(0, np.int64)
    k = np.where(fin, np.searchsorted(edges, gap_cold, side="right"), -1)
    pf = population[: np.searchsorted(population, _NEVER)]
    pop = np.bincount(np.searchsorted(edges, pf, side="right"), minlength=edges.size + 1).astype(np.float64)
    return k, pop


def _weighted_leq(thr: np.ndarray, w: np.ndarray, Ns: np.ndarray) -> np.ndarray:
    """``Σ_a w_a 1{thr_a ≤ N}`` at each ``N`` (one sort, prefix sums)."""
    o = np.argsort(thr, kind="stable")
    c = np.concatenate([[0.0], np.cumsum(w[o])])
    return c[np.searchsorted(thr[o], Ns, side="right")]


def stratified_hits(thresholds, hot, gaps: ReuseGaps, Ns, per: int = PER_STRATUM, ratio: bool = True) -> np.ndarray:
    """Estimated ``Σ 1{N* ≤ N}`` over the measured lookups of the whole trace (module docstring); ``ratio=False``:
    ``thresholds`` are already the ones to read (:func:`jackknife_thresholds`)."""
    Ns = np.asarray(Ns, np.int64)
    t = ratio_thresholds(thresholds, gaps.gap, gaps.since) if ratio else np.asarray(thresholds, np.int64)
    hot = np.asarray(hot, bool)
    cold = ~hot
    k, pop = _strata(gaps.gap[cold], gaps.population, per)
    n_k = np.bincount(k[k >= 0], minlength=pop.size).astype(np.float64)
    w = np.ones(t.shape[0])
    fin = k >= 0
    wc = np.zeros(k.shape[0])  # never-seen lookups: no hit at any capacity
    wc[fin] = pop[k[fin]] / n_k[k[fin]]
    w[cold] = wc
    return _weighted_leq(t, w, Ns)


def stratified_se(thresholds, hot, ids, gaps: ReuseGaps, rate: float, Ns, per: int = PER_STRATUM) -> np.ndarray:
    """Standard error of :func:`stratified_hits` (a count) from which non-hot ids the sample kept."""
    Ns = np.asarray(Ns, np.int64)
    hot = np.asarray(hot, bool)
    cold = ~hot
    if rate >= 1.0 or not cold.any():
        return np.zeros(Ns.shape)
    t = ratio_thresholds(thresholds, gaps.gap, gaps.since)[cold]
    k, pop = _strata(gaps.gap[cold], gaps.population, per)
    fin = k >= 0
    n_k = np.bincount(k[fin], minlength=pop.size).astype(np.float64)
    g = np.zeros(t.shape[0])
    g[fin] = rate * pop[k[fin]] / n_k[k[fin]]  # never-seen lookups: y = 0 = F̂, no residual
    _, gid = np.unique(np.asarray(ids)[cold], return_inverse=True)
    kk = np.where(fin, k, 0)
    out = np.empty(Ns.shape[0])
    for q, N in enumerate(Ns):
        y = (t <= N).astype(np.float64)
        F = np.bincount(kk[fin], weights=y[fin], minlength=pop.size) / np.maximum(n_k, 1.0)
        z = np.where(fin, g * (y - F[kk]), 0.0)
        out[q] = np.square(np.bincount(gid, weights=z)).sum()
    return np.sqrt((1.0 - rate) / rate**2 * out)


def jackknife_se(replicates) -> np.ndarray:
    """Delete-a-group jackknife: ``√((G − 1)/G · Σ_g (θ_g − θ̄)²)`` over the ``G`` replicate estimates (rows)."""
    th = np.asarray(replicates, np.float64)
    G = th.shape[0]
    return np.sqrt((G - 1) / G * np.square(th - th.mean(0)).sum(0))


def jackknife_thresholds(t0: np.ndarray, hot: np.ndarray, ids: np.ndarray, reps, *, saltmix, thr) -> np.ndarray:
    """Delete-a-group jackknife bias correction of each kept lookup's ratio threshold ``t0``: ``n·t0 − (n − 1)·t̄``
    with ``t̄`` the mean of its thresholds in the ``G`` replicates ``reps`` (``(rate_thresholds, lo, hi)`` per
    replicate, stream order of its kept lookups) that hold it, ``n`` = ``G`` (a non-hot lookup is missing from
    the replicate that drops its group; ``n`` then counts that replicate as the full sample, the usual
    delete-a-group form), rounded, at least 1; ``t0`` where it is NEVER or no replicate holds it."""
    t0 = np.asarray(t0, np.int64)
    S = np.zeros(t0.shape[0])
    C = np.zeros(t0.shape[0])
    for tg, lo, hi in reps:
        idx = np.flatnonzero(hot | _hash_keep(ids, saltmix, thr, lo, hi))
        fin = tg < _NEVER
        S[idx[fin]] += tg[fin]
        C[idx[fin]] += 1
    ok = (t0 < _NEVER) & (C > 0)
    n = C[ok] + (~hot[ok])
    out = t0.copy()
    out[ok] = np.maximum(np.round(n * t0[ok] - (n - 1) * S[ok] / C[ok]), 1).astype(np.int64)
    return out
