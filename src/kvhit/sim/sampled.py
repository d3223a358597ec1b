"""Sampled (SHARDS) all-capacity curves for traces too big for the exact one-pass curves.

SHARDS (Waldspurger et al., FAST '15) keeps every access of a key whose hash falls below ``rate · 2⁶⁴``, runs the
stack-distance pass on that sample only and reads a sampled distance ``ρ_s`` as ``ρ_s / rate`` of the full trace:
each entry above the reused one is in the sample with probability ``rate``, independently of the others (a salted
hash), so ``E[ρ_s − 1] = rate · (ρ − 1)``. Here the two exact passes of kvhit are sampled:

* **vLLM block pool** (:mod:`kvhit.sim.vllm.curve`, both free-queue orders). The key is the *block id*. The
  threshold of a leading lookup block ``i < (T_r − 1) // b`` (the hit cap of ``get_computed_blocks``) is
  ``N*_{r,i} = ρ + e`` (eq. (★) of that module: ``ρ`` = 1 + entries above the block's position, ``e ∈ {0, 1}`` the
  unhashed head block of vLLM ≥ 0.24); the sampled pass keeps the same positions (a request appends its sampled
  blocks in free order ``F−1 … 0``; a looked-up block moves its first-inserted copy; a capped block past the
  ``T − 1`` cap is a duplicate that keeps the old copy) and estimates

      N̂*_{r,i} = 1 + e_s + ⌈(ρ_s − 1) / rate⌉,

  the block itself and ``e`` unscaled (they are not sampled quantities). Why blocks and not conversations: a
  chained stream evicts a conversation suffix-first and every block's hit is its own threshold test (``N*`` is
  nondecreasing along the chain, so the lookup's stop-at-first-miss adds nothing), so blocks can be sampled
  one by one; the entries above a block are then ``Binomial(ρ − 1, rate)``, relative spread ``1/√(rate·(ρ−1))``,
  where sampling whole conversations would give ``1/√(rate·k)`` with ``k`` the *conversations* above it (tens of
  times fewer). vLLM ≤ 0.23's freed partial blocks are entries of their own: each is kept with the same
  probability (keyed by the request's stream index). The curve is a ratio estimator:

      ĥ(N) = (Σ_{sampled lookup blocks} 1{N̂* ≤ N}) / (sampled lookup blocks) · Σ_r (T_r − 1)//b / Σ_r ⌈T_r/b⌉

  over the measured requests (the token ratio uses ``b · … / Σ T_r``); the two sums on the right are exact (every
  request is read). That indicator is the *step* reading (SHARDS as published); by default the thresholds are read
  *deblurred* instead (:mod:`kvhit.sim.sampled_estimate`: each a ramp over its ``1/rate`` lattice step, placed where
  the binomial law puts it, then one deconvolution step for the remaining blur), which removes most of the error
  below 5 % (docs/sampling.md). ``e_s`` is ``e``'s rule applied to the sampled accesses (an unsampled add after the last
  partial-block request can make it 1 where the full pass has 0: at most one block).

* **Algorithm 1** (whole-conversation LRU, :mod:`kvhit.sim.content.stackdist`). The unit of Algorithm 1 is a whole
  conversation, so the key is the conversation id: ``N* = D + R_{j−1}`` with ``D`` the current sizes of the other
  conversations accessed since, estimated ``N̂* = R_{j−1} + ⌈D_s / rate⌉``; the curve is the ratio of the sampled
  practical hit weight (eq. (31)) to the sampled demand ``Σ R``.

Error. Parts, all measured (``benchmarks/sampling_accuracy.py``, ``docs/sampling.md``), not bounded in closed
form: the noise of which accesses are measured (a ratio estimator over ``≈ rate · n`` lookups; its spread shrinks as
``1/√(rate · n)``); the ``1/rate`` lattice of the thresholds (the step reading's staircase); and the smoothing of each
threshold by the binomial noise of ``ρ_s`` (relative spread ``1/√(rate · N)`` at capacity ``N``). The deblurred
reading removes the second and the leading term of the third; the first is what remains on small traces. For a trace
held in memory, ``sampled_block_curve(gaps=True)`` adds an exact pass over every access (each lookup's reuse gap) and
the ``stratified`` reading (:mod:`kvhit.sim.sampled_strata`: post-stratified by the gap, ratio thresholds, jackknife
error), which removes most of that first part (docs/sampling.md §5).

Invariants: ``rate = 1`` keeps every key and reproduces the exact curves (tested: the sampled pass equals
:func:`~kvhit.sim.vllm.curve.block_hit_thresholds`'s unrounded stack model at rate 1, and
:func:`~kvhit.sim.content.stackdist.content_hit_thresholds`); the sample is a deterministic function of
``(ids, salt)``, so a result is reproducible bit for bit. Memory is O(sampled accesses), plus O(chunk) when read
from Parquet (:func:`sampled_stream_curve`).

NOT modelled: requests in flight (``hold``), the colocated mode, the ambiguity intervals of the exact pass (the
rare duplicate-copy case (c); sampled thresholds use the most recent copy), the request hit rates (they need
block 0 of every request, which a block sample does not keep), and rejection below ``N_min`` (capacities below
the largest request are reported infeasible, as the exact curve does).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numba import njit

from kvhit.sim.content.lru import ContentInputError, _previous_sizes_kernel
from kvhit.sim.content.stackdist import FIRST_TURN, content_curve_from_thresholds, content_hit_thresholds
from kvhit.sim.sampled_estimate import id_ranks, sampled_hits, sampling_se
from kvhit.sim.sampled_strata import (
    GROUPS,
    ReuseGaps,
    gap_pass,
    jackknife_se,
    jackknife_thresholds,
    ratio_thresholds,
    sample_gaps,
    stratified_hits,
    stratified_se,
)
from kvhit.sim.vllm.block import ENGINES, BlockSimError, request_stream
from kvhit.sim.vllm.blockids import _MAX_POS, MAX_CONVERSATION_ID, _seedmix
from kvhit.sim.vllm.blockids import _POS_BITS as _BLOCKID_POS_BITS
from kvhit.sim.vllm.curve import _append, _prefix  # the position tree (Fenwick) of the exact pass
from kvhit.workload.hashing import fmix64

__all__ = [
    "SampledBlockCurve",
    "SampledContentCurve",
    "SamplingError",
    "check_rate",
    "sample_threshold",
    "sampled_block_curve",
    "sampled_content_curve",
    "sampled_stream_curve",
]

NEVER: int = FIRST_TURN
_U64 = 2.0**64
_EMPTY = np.zeros(0, np.int64)
_SEEDMIX0 = _seedmix(0)  # the ids of hashes_from_block_counts(..., seed=0), as kvhit.sim.stream builds them


class SamplingError(BlockSimError):
    """Invalid sampling input (the message names the argument)."""


def check_rate(rate) -> float:
    """``rate`` as a float in (0, 1]; :class:`SamplingError` naming ``--sample-rate`` otherwise."""
    if isinstance(rate, bool) or not isinstance(rate, int | float | np.integer | np.floating):
        raise SamplingError(f"sample rate: expected a number in (0, 1], got {rate!r}")
    r = float(rate)
    if not (0.0 < r <= 1.0):
        raise SamplingError(f"sample rate: expected a number in (0, 1], got {rate!r}")
    return r


def sample_threshold(rate: float) -> np.uint64:
    """Keys whose salted hash is ``< sample_threshold(rate)`` are kept (``rate = 1``: every key)."""
    r = check_rate(rate)
    if r >= 1.0:
        return np.uint64(2**64 - 1)
    return np.uint64(min(int(r * _U64), 2**64 - 2))


def _saltmix(salt: int) -> np.uint64:
    if isinstance(salt, bool) or not isinstance(salt, int | np.integer) or salt < 0:
        raise SamplingError(f"salt: expected an integer >= 0, got {salt!r}")
    return np.uint64(fmix64(np.uint64((int(salt) * 0x9E3779B97F4A7C15 + 0x5851F42D4C957F2D) & (2**64 - 1))))


@njit(cache=True, inline="always")
def _keep(key, saltmix, thr, full):  # pragma: no cover - compiled
    return full or fmix64(np.uint64(key) ^ saltmix) < thr


@njit(cache=True, inline="always")
def _keepd(key, saltmix, thr, full, lo, hi):  # pragma: no cover - compiled
    """:func:`_keep` less the hashes in ``[lo, hi)`` (a jackknife replicate drops one group of the kept ids)."""
    if full:
        return True
    h = fmix64(np.uint64(key) ^ saltmix)
    return h < thr and not (lo <= h and h < hi)


# --------------------------------------------------------------------------------------------------
# phase 1: the sample (streamable, one chunk of requests at a time)
# --------------------------------------------------------------------------------------------------

_POS_BITS = np.uint64(_BLOCKID_POS_BITS)  # kvhit.sim.vllm.blockids: id(c, i) = fmix64(((c << 24) | i) ^ mix(seed))


@njit(cache=True, inline="always")
def _is_hot(x, hot):  # pragma: no cover - compiled
    if hot.shape[0] == 0:
        return False
    j = np.searchsorted(hot, x)
    return j < hot.shape[0] and hot[j] == x


@njit(cache=True, inline="always")
def _key(hs, off, conv, seedmix, r, i):  # pragma: no cover - compiled
    if conv.shape[0] == 0:
        return hs[off[r] + i]
    x = fmix64(((np.uint64(conv[r]) << _POS_BITS) | np.uint64(i)) ^ seedmix)
    return np.int64(x)


@njit(cache=True)
def _select_kernel(T, L, off, hs, conv, seedmix, hot, measured, b, new_engine, thr, full, saltmix, r0, st, lo, hi):  # noqa: E501  # pragma: no cover
    """Sampled records of one chunk of requests (global stream index of request 0: ``r0``).

    A record is a request with ≥ 1 kept block or a kept vLLM ≤ 0.23 partial block, or (vLLM ≥ 0.24) a *marker*
    for an unsampled partial-block request that changes ``e``'s rule (emitted only when the previous record
    does not already end with that flag). Block ids: ``hs[off[r] + i]``, or — when ``conv`` is not empty — the
    ids of :func:`~kvhit.sim.vllm.blockids.hashes_from_block_counts` computed on the fly (no id stream).
    ``st``: 0 last record flagged, 1 Σ T (measured), 2 Σ ⌈T/b⌉, 3 Σ (T−1)//b, 4 max ⌈L/b⌉, 5 measured requests.
    Returns ``(rec, blk_i, blk_id)``: rec rows = (mh, partial flag, kept partial, measured, kept blocks).
    """
    n = T.shape[0]
    # count
    nrec = 0
    nblk = 0
    flagged = st[0]
    for r in range(n):
        k = 0
        for i in range(L[r] // b):
            x = _key(hs, off, conv, seedmix, r, i)
            if _keepd(x, saltmix, thr, full, lo, hi) or _is_hot(x, hot):
                k += 1
        part = L[r] % b != 0
        ps = (not new_engine) and part and _keepd(np.int64(r0 + r) ^ np.int64(0x5BD1E995), saltmix, thr, full, lo, hi)
        if k > 0 or ps:
            nrec += 1
            nblk += k
            flagged = part
        elif new_engine and part and not flagged:
            nrec += 1
            flagged = True
    rec = np.empty((nrec, 5), np.int64)
    blk_i = np.empty(nblk, np.int32)
    blk_id = np.empty(nblk, np.int64)
    blk_hot = np.zeros(nblk, np.int8)
    q = 0
    m = 0
    flagged = st[0]
    for r in range(n):
        k0 = m
        for i in range(L[r] // b):
            x = _key(hs, off, conv, seedmix, r, i)
            h = _is_hot(x, hot)
            if h or _keepd(x, saltmix, thr, full, lo, hi):
                blk_hot[m] = h
                blk_i[m] = i
                blk_id[m] = x
                m += 1
        part = L[r] % b != 0
        ps = (not new_engine) and part and _keepd(np.int64(r0 + r) ^ np.int64(0x5BD1E995), saltmix, thr, full, lo, hi)
        mh = (T[r] - 1) // b
        if m > k0 or ps:
            rec[q, 0] = mh
            rec[q, 1] = part
            rec[q, 2] = ps
            rec[q, 3] = measured[r]
            rec[q, 4] = m - k0
            q += 1
            flagged = part
        elif new_engine and part and not flagged:
            rec[q, 0] = 0
            rec[q, 1] = 1
            rec[q, 2] = 0
            rec[q, 3] = 0
            rec[q, 4] = 0
            q += 1
            flagged = True
        if measured[r]:
            st[1] += T[r]
            st[2] += (T[r] + b - 1) // b
            st[3] += mh
            st[5] += 1
        nb = (L[r] + b - 1) // b
        if nb > st[4]:
            st[4] = nb
    st[0] = flagged
    return rec, blk_i, blk_id, blk_hot


# --------------------------------------------------------------------------------------------------
# phase 2: the stack pass over the sample
# --------------------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _add(tree, P, F, w):  # pragma: no cover - compiled
    kk = P + 1
    while kk <= F:
        tree[kk] += w
        kk += kk & (-kk)


@njit(cache=True)
def _sampled_block_kernel(rec, blk_i, blk_id, blk_hot, inv, new_engine, track):  # pragma: no cover - compiled
    """Estimated thresholds ``N̂*`` per kept block (NEVER: never placed before; -1: not a lookup block, i ≥ mh),
    and (``track``) the kept non-hot entries above each (``K``; else an empty array).

    Same positions and weights as :func:`kvhit.sim.vllm.curve._thresholds_kernel` restricted to the kept
    entries: Fenwick tree over positions, per distinct id the position of its first-inserted copy and of its
    most recent one; ``qb``/``mrem`` give ``e`` (vLLM ≥ 0.24). With ``track`` a second tree counts the entries
    kept with probability ``rate`` (hot ones excluded).
    """
    nrec = rec.shape[0]
    nblk = blk_i.shape[0]
    never = np.iinfo(np.int64).max
    npos = nblk
    maxk = 1
    for q in range(nrec):
        npos += rec[q, 2]
        if rec[q, 4] > maxk:
            maxk = rec[q, 4]
    LB = 1
    while (1 << LB) <= npos + 1:
        LB += 1
    tree = np.zeros(npos + 1, np.float64)
    treek = np.zeros(npos + 1 if track else 1, np.float64)
    kab = np.zeros(nblk if track else 0, np.int64)
    Wk = 0.0
    F = 0
    W = 0.0
    cap = 1024
    while cap < 2 * nblk + 2:
        cap *= 2
    cm = cap - 1
    tab = np.full(cap, -1, np.int32)
    keys = np.empty(nblk + 1, np.int64)
    first = np.empty(nblk + 1, np.int64)
    recent = np.empty(nblk + 1, np.int64)
    nid = 0
    thr = np.empty(nblk, np.int64)
    slots = np.empty(maxk, np.int64)
    qb = 0
    mrem = never
    m0 = 0
    for q in range(nrec):
        mh = rec[q, 0]
        k = rec[q, 4]
        # resolve ids, thresholds from the state before this request
        for a in range(k):
            x = blk_id[m0 + a]
            j = np.int64(fmix64(np.uint64(x)) >> np.uint64(1)) & cm
            while True:
                v = tab[j]
                if v < 0:
                    v = nid
                    nid += 1
                    tab[j] = v
                    keys[v] = x
                    first[v] = -1
                    recent[v] = -1
                    break
                if keys[v] == x:
                    break
                j = (j + 1) & cm
            slots[a] = v
            if blk_i[m0 + a] >= mh:
                thr[m0 + a] = -1
                continue
            P = recent[v]
            if P < 0:
                thr[m0 + a] = never
                continue
            above = W - _prefix(tree, P, LB)  # Horvitz-Thompson: Σ 1/p over the kept entries above P
            e = 1 if (new_engine and P < qb and mrem > P) else 0
            thr[m0 + a] = 1 + e + np.int64(np.ceil(above - 1e-6))
            if track:
                kab[m0 + a] = np.int64(np.round(Wk - _prefix(treek, P, LB)))
        # removals: first-inserted copies of looked-up blocks
        for a in range(k):
            v = slots[a]
            if blk_i[m0 + a] < mh and recent[v] >= 0:
                wv = 1.0 if blk_hot[m0 + a] else inv
                _add(tree, first[v], F, -wv)
                W -= wv
                if track and not blk_hot[m0 + a]:
                    _add(treek, first[v], F, -1.0)
                    Wk -= 1.0
        # appends in free order: the kept partial block (vLLM <= 0.23), then blocks F-1 ... 0
        if rec[q, 2]:
            _append(tree, F, inv)
            if track:
                _append(treek, F, 1.0)
                Wk += 1.0
            F += 1
            W += inv
            mrem = -1
        for a in range(k - 1, -1, -1):
            v = slots[a]
            t = F
            rem = -1
            if recent[v] < 0:
                first[v] = t
            elif blk_i[m0 + a] < mh:
                rem = first[v]
                first[v] = t
            recent[v] = t
            wv = 1.0 if blk_hot[m0 + a] else inv
            _append(tree, F, wv)
            if track:
                kv = 0.0 if blk_hot[m0 + a] else 1.0
                _append(treek, F, kv)
                Wk += kv
            F += 1
            W += wv
            if rem < mrem:
                mrem = rem
        if new_engine and rec[q, 1]:
            qb = F
            mrem = never
        m0 += k
    return thr, kab


# --------------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampledBlockCurve:
    """A sampled vLLM block-pool pass: estimated thresholds of the kept measured lookup blocks and the exact
    totals of the whole stream. :meth:`curve` gives the ratio estimator of the module docstring."""

    thresholds: np.ndarray  #: N̂* of the kept measured lookup blocks (NEVER: not cached before)
    rate: float
    salt: int
    engine: str
    block_size: int
    prompt_tokens: int  #: Σ T over the measured requests (all of them, not only sampled ones)
    prompt_blocks: int  #: Σ ⌈T/b⌉ (measured)
    lookup_blocks: int  #: Σ (T−1)//b (measured)
    measured_requests: int
    N_min: int  #: max ⌈L/b⌉ over every request: below it vLLM refuses a request
    sampled_accesses: int  #: kept block accesses (all requests)
    sampled_lookups: int  #: kept measured lookup blocks (the estimator's sample size)
    weights: np.ndarray | None = None  #: 1/p per kept lookup (None: all 1/rate, no hot ids)
    exact: bool = False  #: no entry was kept with probability < 1 (rate 1, or every kept entry hot): no noise
    kept_above: np.ndarray | None = None  #: per kept lookup, the non-hot kept entries above it (None: no hot ids)
    lookup_ids: np.ndarray | None = None  #: the block id of each kept lookup (for :meth:`standard_error`)
    gaps: ReuseGaps | None = None  #: exact reuse gaps (``sampled_block_curve(gaps=True)``): the ``stratified`` reading
    replicates: tuple | None = None  #: delete-a-group jackknife replicates (with gaps) for the stratified error

    def _hot(self) -> np.ndarray:
        return np.zeros(self.thresholds.shape[0], bool) if self.weights is None else self.weights == 1.0

    def _need_gaps(self) -> ReuseGaps:
        if self.gaps is None:
            raise SamplingError("estimator: 'stratified' needs the exact reuse gaps (an in-memory trace, gaps=True)")
        return self.gaps

    def hit_blocks(self, Ns, estimator: str = "deblurred") -> np.ndarray:
        """Estimated Σ hit blocks of the measured requests at each capacity (float64); ``estimator``: ``deblurred``
        (default) or ``step`` (:mod:`kvhit.sim.sampled_estimate`)."""
        Ns = np.asarray(Ns, np.int64)
        if estimator == "stratified":
            g = self._need_gaps()
            if self.sampled_lookups == 0:
                return np.zeros(Ns.shape)
            return stratified_hits(self.thresholds, self._hot(), g, Ns)
        if estimator == "stratified-jk":
            g = self._need_gaps()
            if self.sampled_lookups == 0:
                return np.zeros(Ns.shape)
            return stratified_hits(self._jk_thresholds, self._hot(), g, Ns, ratio=False)
        if self.sampled_lookups == 0:
            return np.zeros(Ns.shape)
        hit = sampled_hits(
            self.thresholds, self.weights, self.rate, Ns, estimator=estimator, exact=self.exact,
            kept_above=self.kept_above,
        )  # fmt: skip
        total = self.sampled_lookups if self.weights is None else float(self.weights.sum())
        return hit * (self.lookup_blocks / total)

    def standard_error(self, Ns, estimator: str = "deblurred") -> np.ndarray:
        """Standard error of :meth:`curve`'s ``block_hit_ratio`` from *which ids* the sample kept (the sample-size
        part of the error, :func:`kvhit.sim.sampled_estimate.sampling_se`, or for ``estimator="stratified"``
        :func:`kvhit.sim.sampled_strata.stratified_se`; not the lattice or the blur); NaN below ``N_min``, 0 where
        the pass is exact."""
        Ns = np.asarray(Ns, np.int64)
        if estimator == "stratified-jk":
            estimator = "stratified"  # the same replicates give its error (the correction is not re-jackknifed)
        if estimator in ("stratified", "stratified-linear"):
            g = self._need_gaps()
            if self.exact or self.sampled_lookups == 0 or not self.prompt_blocks:
                se = np.zeros(Ns.shape) if self.prompt_blocks else np.full(Ns.shape, np.nan)
            elif estimator == "stratified" and self.replicates:
                se = jackknife_se([r.hit_blocks(Ns, "stratified") for r in self.replicates]) / self.prompt_blocks
            else:
                se = stratified_se(self.thresholds, self._hot(), self.lookup_ids, g, self.rate, Ns)
                se = se / self.prompt_blocks
            return np.where(Ns >= self.N_min, se, np.nan)
        if self.exact or self.sampled_lookups == 0 or self.lookup_ids is None:
            se = np.zeros(Ns.shape)
        else:
            rank, group = self._id_ranks
            se = sampling_se(self.thresholds, rank, group, self.weights, self.rate, Ns)
            se = se * self.lookup_blocks / self.prompt_blocks if self.prompt_blocks else se * np.nan
        return np.where(Ns >= self.N_min, se, np.nan)

    @cached_property
    def _jk_thresholds(self) -> np.ndarray:
        """The jackknife bias-corrected ratio thresholds (:func:`kvhit.sim.sampled_strata.jackknife_thresholds`);
        the ratio thresholds themselves without replicates (rate 1, exact, or ``jackknife=0``)."""
        g = self._need_gaps()
        t0 = ratio_thresholds(self.thresholds, g.gap, g.since)
        if not self.replicates:
            return t0
        G = len(self.replicates)
        thr = int(sample_threshold(self.rate))  # the full sample's: replicates drop slices of [0, thr)
        reps = [
            (ratio_thresholds(r.thresholds, r.gaps.gap, r.gaps.since), thr * k // G, thr * (k + 1) // G)
            for k, r in enumerate(self.replicates)
        ]
        return jackknife_thresholds(t0, self._hot(), self.lookup_ids, reps, saltmix=_saltmix(self.salt), thr=thr)

    @cached_property
    def _id_ranks(self) -> tuple[np.ndarray, np.ndarray]:
        """Each kept lookup's rank within its id and its id's lookup count (:func:`id_ranks`; hot ids: weight 1),
        computed when first asked: one sort of the kept lookups, not paid by a curve read without its error."""
        hot = np.zeros(self.thresholds.shape[0], bool) if self.weights is None else self.weights == 1.0
        return id_ranks(self.lookup_ids, self.thresholds, hot)

    def curve(self, Ns, estimator: str = "deblurred") -> dict:
        """``N``, ``hit_blocks`` (estimated), ``block_hit_ratio`` (h of eq. (6)), ``token_hit_ratio``, ``feasible``
        (``N ≥ N_min``; the ratios are NaN below it)."""
        Ns = np.asarray(Ns, np.int64)
        hb = self.hit_blocks(Ns, estimator)
        feas = Ns >= self.N_min
        with np.errstate(invalid="ignore", divide="ignore"):
            blk = np.where(feas, hb / self.prompt_blocks, np.nan) if self.prompt_blocks else np.full(Ns.shape, np.nan)
            tok = (
                np.where(feas, hb * self.block_size / self.prompt_tokens, np.nan)
                if self.prompt_tokens
                else np.full(Ns.shape, np.nan)
            )
        return {"N": Ns, "hit_blocks": hb, "block_hit_ratio": blk, "token_hit_ratio": tok, "feasible": feas}


class _BlockSampler:
    """Phase 1 fed chunk by chunk (requests in stream order), then phase 2 once."""

    def __init__(self, block_size: int, engine: str, rate: float, salt: int, hot=None):
        if engine not in ENGINES:
            raise SamplingError(f"engine: expected one of {sorted(ENGINES)}, got {engine!r}")
        self.b = int(block_size)
        self.engine = engine
        self.new = ENGINES[engine]
        self.rate = check_rate(rate)
        self.salt = int(salt)
        self.thr = sample_threshold(self.rate)
        self.full = self.rate >= 1.0
        self.mix = _saltmix(salt)
        self.st = np.zeros(6, np.int64)
        self.recs: list[np.ndarray] = []
        self.bi: list[np.ndarray] = []
        self.bid: list[np.ndarray] = []
        self.r0 = 0
        self.hot = _EMPTY if hot is None else np.unique(np.asarray(hot, np.int64))
        self.bh: list[np.ndarray] = []
        self.lo = self.hi = np.uint64(0)

    def drop(self, g: int, groups: int) -> None:
        """Jackknife replicate: drop the ``g``-th of ``groups`` equal slices of the kept hash range ``[0, thr)``;
        the others are kept with probability ``rate·(1 − 1/groups)`` (their weight)."""
        t = int(self.thr)
        self.lo = np.uint64(t * g // groups)
        self.hi = np.uint64(t * (g + 1) // groups)
        self.rate = self.rate * (1.0 - (int(self.hi) - int(self.lo)) / t)

    def push(self, T, L, off, hs, measured, conv=None) -> None:
        """One chunk of requests: ids ``hs`` (CSR ``off``), or ``conv`` for the ids of ``hashes_from_block_counts``."""
        c = _EMPTY if conv is None else np.ascontiguousarray(conv, np.int64)
        rec, bi, bid, bh = _select_kernel(
            T, L, off, hs, c, _SEEDMIX0, self.hot, measured, self.b, self.new, self.thr, self.full, self.mix, self.r0,
            self.st, self.lo, self.hi,
        )  # fmt: skip
        self.recs.append(rec)
        self.bh.append(bh)
        self.bi.append(bi)
        self.bid.append(bid)
        self.r0 += T.shape[0]

    def finish(self) -> SampledBlockCurve:
        rec = np.concatenate(self.recs) if self.recs else np.zeros((0, 5), np.int64)
        bi = np.concatenate(self.bi) if self.bi else np.zeros(0, np.int32)
        bid = np.concatenate(self.bid) if self.bid else np.zeros(0, np.int64)
        bh = np.concatenate(self.bh) if self.bh else np.zeros(0, np.int8)
        self.recs, self.bi, self.bid, self.bh = [], [], [], []
        track = bool(self.hot.size) and not self.full
        thr, kab = _sampled_block_kernel(rec, bi, bid, bh, 1.0 / self.rate, self.new, track)
        per = rec[:, 4]
        meas = np.repeat(rec[:, 3].astype(bool), per)
        look = np.repeat(rec[:, 0], per) > bi
        sel = meas & look
        del meas, look, bi
        st = self.st
        w = np.where(bh[sel] != 0, 1.0, 1.0 / self.rate) if self.hot.size else None
        return SampledBlockCurve(
            thresholds=np.ascontiguousarray(thr[sel]),
            lookup_ids=np.ascontiguousarray(bid[sel]),
            weights=w,
            kept_above=np.ascontiguousarray(kab[sel]) if track else None,
            rate=self.rate,
            salt=self.salt,
            engine=self.engine,
            block_size=self.b,
            prompt_tokens=int(st[1]),
            prompt_blocks=int(st[2]),
            lookup_blocks=int(st[3]),
            measured_requests=int(st[5]),
            N_min=int(st[4]),
            sampled_accesses=int(thr.shape[0]),
            sampled_lookups=int(sel.sum()),
            exact=self.full or not (bool((bh == 0).any()) or bool(rec[:, 2].any())),
        )


def sampled_block_curve(
    prompt_tokens,
    hash_offsets,
    hashes,
    *,
    block_size: int,
    rate: float,
    salt: int = 0,
    engine: str = "vllm",
    mask=None,
    hot="auto",
    gaps: bool = False,
    jackknife: int = GROUPS,
) -> SampledBlockCurve:
    """SHARDS pass of the vLLM block pool over an in-memory request stream (inputs as
    :func:`kvhit.sim.vllm.curve.block_hit_thresholds`, chained or not); ``mask`` selects the measured requests.
    See the module docstring for the estimator. ``gaps``: also make the exact reuse-gap pass over every access
    (:mod:`kvhit.sim.sampled_strata`), which the ``stratified`` reading needs, and (``jackknife`` groups > 0) the
    delete-a-group replicates of its stated error (each a sampled pass less one slice of the kept hash range)."""
    T, L, _, off, hs, b = request_stream(
        prompt_tokens,
        hash_offsets,
        hashes,
        block_size=block_size,
        engine=engine,
        colocated=False,
        error=SamplingError,
    )
    n = T.shape[0]
    m = np.ones(n, bool) if mask is None else np.asarray(mask)
    if m.dtype != np.bool_ or m.shape != (n,):
        raise SamplingError(f"mask: expected a boolean array of shape ({n},), got {m.dtype} {m.shape}")
    if isinstance(hot, str):
        if hot != "auto":
            raise SamplingError(f"hot: expected 'auto', None or an array of ids, got {hot!r}")
        hot = hot_ids(hs, rate)
    s = _BlockSampler(b, engine, rate, salt, hot)
    s.push(T, L, off, hs, m)
    out = s.finish()
    if not gaps:
        return out
    if (
        isinstance(jackknife, bool)
        or not isinstance(jackknife, int | np.integer)
        or not (jackknife == 0 or jackknife >= 2)
    ):
        raise SamplingError(f"jackknife: expected 0 or an integer >= 2, got {jackknife!r}")
    gp = gap_pass(T, L, off, hs, b=b, new_engine=s.new, measured=m, hot=s.hot)

    def with_gaps(smp: _BlockSampler, res: SampledBlockCurve, lo=0, hi=0) -> SampledBlockCurve:
        g = sample_gaps(gp, saltmix=smp.mix, thr=smp.thr, full=smp.full, rate=smp.rate, lo=lo, hi=hi)
        if g.gap.shape[0] != res.sampled_lookups:  # pragma: no cover - the two passes share one keep rule
            raise SamplingError("gaps: the reuse-gap pass kept a different sample (internal error)")
        return dataclasses.replace(res, gaps=g)

    out = with_gaps(s, out)
    if jackknife == 0 or s.full or out.exact:
        return out
    reps = []
    for grp in range(int(jackknife)):
        sr = _BlockSampler(b, engine, rate, salt, s.hot)
        sr.drop(grp, int(jackknife))
        sr.push(T, L, off, hs, m)
        rep = with_gaps(sr, sr.finish(), sr.lo, sr.hi)
        reps.append(dataclasses.replace(rep, lookup_ids=None, kept_above=None))  # only its stratified reading
    return dataclasses.replace(out, replicates=tuple(reps))


def hot_ids(hashes, rate: float) -> np.ndarray:
    """Ids accessed at least ``1/rate`` times: kept with probability 1 (weight 1) instead of ``rate`` (weight
    ``1/rate``). A few such ids (a shared system prompt) can carry much of a trace's reuse; sampling them at
    ``rate`` makes the curve depend on whether they fall in the sample (measured on Mooncake: docs/sampling.md)."""
    r = check_rate(rate)
    if r >= 1.0 or np.asarray(hashes).size == 0:
        return _EMPTY
    ids, cnt = np.unique(np.asarray(hashes, np.int64), return_counts=True)
    return ids[cnt >= math.ceil(1.0 / r - 1e-9)]


# --------------------------------------------------------------------------------------------------
# Algorithm 1
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampledContentCurve:
    """A sampled Algorithm 1 pass (conversations kept by a salted hash of their id)."""

    thresholds: np.ndarray  #: N̂* of the kept measured revisits
    weights: np.ndarray  #: practical weight max(R_{j−1} − 1, 0) of each (eq. (31))
    demand: float  #: Σ R over the kept measured events
    rate: float
    salt: int
    sampled_events: int

    def curve(self, Ns) -> np.ndarray:
        """Estimated practical hit ratio (eq. (31)) at each capacity."""
        Ns = np.asarray(Ns, np.int64)
        if not self.demand:
            return np.full(Ns.shape, np.nan)
        return content_curve_from_thresholds(self.thresholds, self.weights, Ns) / self.demand


@njit(cache=True)
def _conv_keep(conv, saltmix, thr, full):  # pragma: no cover - compiled
    out = np.empty(conv.shape[0], np.bool_)
    for i in range(conv.shape[0]):
        out[i] = _keep(conv[i] ^ np.int64(0x27D4EB2F), saltmix, thr, full)
    return out


def conversation_keep(conv, rate: float, salt: int = 0) -> np.ndarray:
    """Boolean per event: its conversation id's salted hash is below ``rate · 2⁶⁴`` (a whole conversation is
    kept or dropped)."""
    r = check_rate(rate)
    c = np.ascontiguousarray(np.asarray(conv), dtype=np.int64)
    return _conv_keep(c, _saltmix(salt), sample_threshold(r), r >= 1.0)


def _content_from_kept(conv, R, measured, rate: float, salt: int) -> SampledContentCurve:
    from kvhit.sim.content.lru import _prepare_events

    if conv.shape[0] == 0:
        z = np.zeros(0, np.int64)
        return SampledContentCurve(z, z, 0.0, rate, salt, 0)
    thr = content_hit_thresholds(conv, R)
    dc, Rr, C = _prepare_events(conv, R)
    prev = _previous_sizes_kernel(dc, Rr, C)
    rev = thr < FIRST_TURN
    D = thr[rev] - prev[rev]
    est = np.full(thr.shape, NEVER, np.int64)
    est[rev] = prev[rev] + np.ceil(D / rate - 1e-9).astype(np.int64)
    keep = measured & rev
    return SampledContentCurve(
        thresholds=est[keep],
        weights=np.maximum(prev[keep] - 1, 0),
        demand=float(R[measured].sum()),
        rate=rate,
        salt=int(salt),
        sampled_events=int(conv.shape[0]),
    )


def sampled_content_curve(conv, R, *, rate: float, salt: int = 0, mask=None) -> SampledContentCurve:
    """SHARDS pass of Algorithm 1 over an in-memory event stream (``conv``, ``R`` as
    :func:`~kvhit.sim.content.stackdist.content_hit_thresholds`); ``mask`` selects the measured events."""
    r = check_rate(rate)
    conv = np.asarray(conv)
    R = np.asarray(R)
    if conv.shape != R.shape or conv.ndim != 1:
        raise ContentInputError(f"conv and R must be 1-D arrays of one length, got {conv.shape} and {R.shape}")
    m = np.ones(conv.shape[0], bool) if mask is None else np.asarray(mask, bool)
    k = conversation_keep(conv, r, salt)
    return _content_from_kept(conv[k].astype(np.int64), R[k].astype(np.int64), m[k], r, salt)


# --------------------------------------------------------------------------------------------------
# streamed from chunks (Parquet)
# --------------------------------------------------------------------------------------------------


def sampled_stream_curve(
    chunks: Iterable,
    *,
    rate: float,
    salt: int = 0,
    block_size: int = 128,
    engines: tuple[str, ...] = ("vllm",),
    content: bool = True,
    content_rate: float | None = None,
    warmup: int = 0,
    window: tuple[float, float] | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict:
    """Sampled curves of a chunked event stream (:func:`kvhit.workload.chunks.parquet_chunks` or
    :func:`~kvhit.workload.chunks.spec_chunks`): the block ids of :func:`kvhit.sim.stream.block_request_chunk`
    (``T = cum_tokens`` or ``R·b − 1``), events at stream index ≥ ``warmup`` measured (or, given ``window = (start,
    end)``, events at times in ``[start, end]``, as :class:`kvhit.workload.trace.Window`). Only the sample is kept:
    memory O(chunk + sampled accesses). Returns ``{"blocks": {engine: SampledBlockCurve}, "content":
    SampledContentCurve | None, "events": n}``. ``content_rate``: Algorithm 1's own rate
    (default ``rate``; 1: its exact pass, which holds every event's ``(conv, R)`` — 17 bytes a turn — but no block)"""
    r = check_rate(rate)
    rc = r if content_rate is None else check_rate(content_rate)
    b = int(block_size)
    samplers = {e: _BlockSampler(b, e, r, salt) for e in engines}
    cc: list[np.ndarray] = []
    cr: list[np.ndarray] = []
    cm: list[np.ndarray] = []
    done = 0
    for ch in chunks:
        idx = ch.start + np.arange(len(ch), dtype=np.int64)
        meas = idx >= warmup if window is None else (ch.time >= window[0]) & (ch.time <= window[1])
        if samplers:
            T = ch.cum_tokens.astype(np.int64) if ch.cum_tokens is not None else ch.R * b - 1
            if ch.conv.size and (ch.conv.min() < 0 or ch.conv.max() > MAX_CONVERSATION_ID):
                raise SamplingError(f"conv: conversation ids must be in [0, {MAX_CONVERSATION_ID}]")
            if T.size and (T.min() < 1 or int(T.max()) // b > _MAX_POS + 1):
                raise SamplingError(f"prompt tokens: must be in [1, {(_MAX_POS + 1) * b}] (row {ch.start})")
            for s in samplers.values():
                s.push(T, T, _EMPTY, _EMPTY, meas, conv=ch.conv)
        if content:
            k = conversation_keep(ch.conv, rc, salt)
            cc.append(ch.conv[k])
            cr.append(ch.R[k])
            cm.append(meas[k])
        done = ch.start + len(ch)
        if progress is not None:
            progress(done)
    if warmup and done <= warmup:
        raise SamplingError(f"warmup: {warmup:,} events leave none of the {done:,} to measure")
    out: dict = {"events": done, "blocks": {e: s.finish() for e, s in samplers.items()}, "content": None}
    if content:
        conv = np.concatenate(cc) if cc else np.zeros(0, np.int64)
        R = np.concatenate(cr) if cr else np.zeros(0, np.int64)
        m = np.concatenate(cm) if cm else np.zeros(0, bool)
        out["content"] = _content_from_kept(conv, R, m, rc, salt)
    return out
