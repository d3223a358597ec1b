"""All-capacity hit curve of the vLLM-faithful block pool (:mod:`kvhit.sim.vllm.block`) from one pass.

For instantaneous requests (no ``hold``: nothing in flight) this computes, for every request ``r`` and every
leading prompt block ``i < (T_r - 1) // b`` (the hit cap of ``get_computed_blocks``), the smallest usable pool
size ``N*_{r,i}`` at which block ``i`` is found by the lookup, so that at any capacity ``N``

    hit_blocks_r(N) = #{ i < (T_r - 1) // b : N*_{r,i} ≤ N }          (``R^H_j`` of eq. (6))

and the vLLM token hit ratio, the block-weighted ``h`` of eq. (6)/(31) and the request hit rate follow for
every ``N`` from one sort-and-cumulate pass (:func:`kvhit.sim.content.stackdist.content_curve_from_thresholds`),
instead of one :func:`~kvhit.sim.vllm.block.simulate_block` run per capacity. It is the block-level analogue of
the whole-content stack distance of :mod:`kvhit.sim.content.stackdist`.

Claim (exact where certified)
-----------------------------
Assumptions: requests instantaneous; the hash stream is *chained* (every id has one parent id and one block
index wherever it occurs — what vLLM's chained ``hash_block_tokens`` and
:func:`~kvhit.sim.vllm.blockids.hashes_from_block_counts` produce; checked, :class:`BlockCurveError` otherwise);
``N ≥ N_min := max_r ceil(L_r / b)`` (no request is rejected; below ``N_min`` a rejected request leaves the
pool untouched, which breaks inclusion — see ``test_inclusion_counterexample_with_rejection``). Then
``hit_blocks_r(N)`` above equals ``simulate_block(...).hit_blocks`` for every ``N ≥ N_min`` outside the
*ambiguity intervals* returned with the thresholds (empty unless a duplicate copy of a block is hit, see
(c) below; never met on growing multi-turn traces).

*Positions.* Request ``r`` takes fresh consecutive positions: (``engine="vllm-0.23"`` only) one for its
partial tail block, then one per full block in the order ``F-1, …, 0`` (``F = L // b``). This is the order
in which ``free`` (``reversed(req_blocks)``) appends them to the free-queue tail, so block 0 is the most
recently used. An *entry* is a physical block on the free queue that holds a hash (vLLM ≤ 0.23: also a freed
partial block, a fresh never-found id); its position is that of the access that last placed it
(allocation or ``touch``).

*Queue shape.* With all blocks free between requests the free queue is ``U ⧺ E``: ``U`` the unhashed blocks
at the head (vLLM ≥ 0.24: ``prepend_n`` keeps every unhashed block there; ≤ 0.23: only the never-used
initial ones), ``E`` the entries by increasing position (``append_n`` adds a request's blocks in position
order, ``touch`` only removes, ``popleft`` pops ``U`` first, then the oldest entries). So at capacity ``N``
the present entries after request ``q`` are those at or above a cutoff position, and an entry at position
``P`` present before ``q`` survives ``q`` iff ``ρ_q(P) + u_q ≤ N``, where ``ρ_q(P) = 1 + #(entries above
P)`` and ``u_q = |U|`` after ``q``. While initial blocks remain (cold phase) nothing hashed is evicted and
the condition holds trivially (``ρ_q + u_q ≤ |E| + |U| = N``). Afterwards ``u_q = p_q := 1{L_q mod b ≠ 0}``
for vLLM ≥ 0.24 (each request allocates ``≥ 1`` block, since ``hit ≤ (T-1)//b < ceil(T/b)``, so it
reuses the previous request's head partial block first and leaves its own) and ``u_q = 0`` for ≤ 0.23.

*Weights.* A Fenwick tree holds weight 1 at a set ``S`` of positions. Invariant ``I(N)``: the positions of
``S`` at or above the cutoff at capacity ``N`` are exactly the present entries (weights below the cutoff are
irrelevant: every entry older than an absent one is absent). Per access of id ``x`` at new position ``t``:

(a) ``x`` never seen: add ``t``. (b) Look-up block (``i < (T-1)//b``): vLLM touches
``BlockHashToBlockMap.get_one_block(x)``, the *first-inserted* present copy; the model moves the weight of
``x``'s first-inserted copy ``c_1`` to ``t``. At ``N`` where ``x`` misses all copies are below the cutoff
(the new block is a fresh allocation at ``t``): correct. Where ``x`` hits and ``c_1`` is present: correct.
(c) Where ``x`` hits, ``c_1`` is absent but a later copy is present — only possible if ``c_1`` is not ``x``'s
most recent copy, i.e. a capped duplicate (d) was made and not yet re-touched — the model leaves a stale
weight: these ``N`` form the interval ``[N*_x, N*_{c_1})`` recorded as ambiguous; ``I(N)`` can fail only for
``N`` in the union of those intervals. (d) Capped block (``i ≥ (T-1)//b``, e.g. ``T`` an exact multiple of
``b``): vLLM recomputes it into a *new* block cached under the same hash and keeps the old copy (lazy
eviction): add ``t`` and keep the old weight(s) — correct at every ``N`` (where the old copy is absent its
weight is below the cutoff). Blocks past the first miss cannot have a present copy (chain property:
``x_{i'}``, ``i' < i``, is always accessed with ``x_i`` and more recently), so they create no duplicate.
Popped entries fall below the cutoff. Hence ``ρ_q(P)`` read from the tree is exact for present ``P``.

*Threshold.* ``ρ_q(P)`` is nondecreasing in ``q`` (a move takes weight from one position to a newer one, an
add only adds), so for ``x`` last placed at ``P`` by request ``s < r``:

    N*(P) = max_{s ≤ q < r} (ρ_q(P) + p_q) = ρ_{r-1}(P) + e(P),                                    (★)

with ``e(P) = 1`` iff (vLLM ≥ 0.24) the last request ``q* < r`` with a partial block satisfies ``q* ≥ s`` and
no access after ``q*`` raised ``ρ(P)`` (each access after ``q*`` removed a weight above ``P``); ``e = 0``
for ≤ 0.23 (there partial blocks are weights themselves). ``ρ_{r-1}(P) = 1 + W - prefix(P)``, O(log n).
Chaining gives ``P(x_{i'}) > P(x_i)`` for ``i' < i`` so ``N*`` is nondecreasing in ``i``: the lookup's
stop-at-first-miss rule is the leading run ``N*_{r,i} ≤ N`` (stored as a running max for safety).

The ambiguity intervals, ``N_min`` and a per-capacity ``exact`` flag are returned; :func:`block_curve`
computes non-certified capacities with :func:`~kvhit.sim.vllm.block.simulate_block` by default
(``fallback="simulate"``), so its numbers are exact unless ``fallback="stack"`` is asked for.

Cost: O(log n) per block access, O(1) amortized on multi-turn traces. Ids are resolved through the
parent's child hint (a previous turn's blocks sit in consecutive rows), the hash table is probed only for
chain roots, branches and new ids; the Fenwick prefix query is done once per run of consecutive positions,
a run of removed positions costs O(run + log n) and appends at the frontier are amortized O(1). The pass
must remember every distinct id ever seen (the simulator only ``N`` of them), which is what it pays for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from kvhit.sim.content.stackdist import FIRST_TURN, content_curve_from_thresholds
from kvhit.sim.vllm.block import (
    ENGINES,
    BlockSimError,
    request_stream,
    simulate_block,
)
from kvhit.workload.hashing import fmix64

__all__ = [
    "NEVER",
    "BlockCurveError",
    "BlockThresholds",
    "block_hit_thresholds",
    "block_curve",
    "block_curve_from_thresholds",
]

#: Threshold sentinel: the block is never cached before this lookup (a miss at every capacity).
NEVER: int = FIRST_TURN

_FALLBACKS = ("simulate", "stack", "nan", "infeasible")


class BlockCurveError(BlockSimError):
    """Invalid input to the all-capacity block curve (the message names the field)."""


# --------------------------------------------------------------------------------------------------
# numba core
# --------------------------------------------------------------------------------------------------

_S32 = np.uint64(32)
_ID = np.int64((1 << 31) - 1)


@njit(cache=True)
def _rehash(tab, newcap):  # pragma: no cover - compiled
    """Re-insert every entry ``fp << 31 | id`` of ``tab`` into ``newcap`` slots (home slot = low bits of
    the 32-bit fingerprint ``fp``, so it is recomputed from the entry alone)."""
    nt = np.full(newcap, -1, np.int64)
    m = newcap - 1
    for j in range(tab.shape[0]):
        e = tab[j]
        if e >= 0:
            i = (e >> 31) & m
            while nt[i] >= 0:
                i = (i + 1) & m
            nt[i] = e
    return nt


@njit(cache=True)
def _grow_rows(D):  # pragma: no cover - compiled
    E = np.empty((2 * D.shape[0], D.shape[1]), np.int64)
    E[: D.shape[0]] = D
    return E


@njit(cache=True, inline="always")
def _prefix(tree, P, LB):  # pragma: no cover - compiled
    """Inclusive prefix sum of the weights at positions ``0..P``."""
    acc = 0
    jj = np.uint64(P + 1)
    for _ in range(LB):
        acc += tree[jj]
        jj &= jj - np.uint64(1)
    return acc


@njit(cache=True, inline="always")
def _append(tree, F, w):  # pragma: no cover - compiled
    """Append weight ``w`` at position ``F`` (node ``F+1`` built from the lower nodes)."""
    k = F + 1
    ii = np.uint64(F)
    lo = np.uint64(k & (k - 1))
    acc = w
    while ii > lo:
        acc += tree[ii]
        ii &= ii - np.uint64(1)
    tree[k] = acc


@njit(cache=True)
def _range_remove(tree, a, c, F):  # pragma: no cover - compiled
    """Subtract 1 at every position of ``[a, c]`` (0-based, ``c < F``) in O(c - a + log F).

    Nodes ``j`` (1-based) whose range ``(j - lowbit(j), j]`` meets ``[a+1, c+1]`` are the nodes in that
    interval plus the update path above ``c+1``; each loses the size of the overlap.
    """
    for j in range(a + 1, c + 2):
        lb = j & (-j)
        lo = j - lb
        tree[j] -= j - (lo if lo > a else a)
    j = c + 1
    j += j & (-j)
    while j <= F:
        lb = j & (-j)
        lo = j - lb
        tree[j] -= c + 1 - (lo if lo > a else a)
        j += lb


@njit(cache=True)
def _remove_runs(tree, rems, nrem, F):  # pragma: no cover - compiled
    """Subtract 1 at the positions ``rems[:nrem]``, taken in runs of consecutive ascending positions: a run of up to
    4 by point updates, a longer one by :func:`_range_remove`."""
    k = 0
    while k < nrem:
        a = rems[k]
        c = a
        k += 1
        while k < nrem and rems[k] == c + 1:
            c += 1
            k += 1
        if c - a < 4:
            for pp in range(a, c + 1):
                kk = pp + 1
                while kk <= F:
                    tree[kk] -= 1
                    kk += kk & (-kk)
        else:
            _range_remove(tree, a, c, F)


@njit(cache=True)
def _thresholds_kernel(T, L, off, hashes, b, new_engine):  # pragma: no cover - compiled
    """One pass over the requests; see the module docstring for the model.

    Returns ``(thr_off, thr, amb, n_amb, bad)``: CSR thresholds (running max of (★) per leading lookup
    block), ambiguity intervals ``amb[:n_amb] = [lo, hi)`` and the first request violating the chain
    property (or -1).

    Fenwick tree over 1-based nodes ``k = position + 1``; ``F`` positions appended so far. Appending sets
    ``tree[F+1]`` from the already-built lower nodes, removals walk up to the frontier only (a run of
    consecutive positions at once), prefix queries run a fixed number of iterations (``tree[0] = 0``
    absorbs the tail). Distinct ids get dense ids (open-addressing key table); row ``D[id]`` holds key,
    parent id (-1 for a chain root), child hint, position of the first-inserted copy, position of the
    most recent copy (-1: not placed yet). The parent keeps the dense id of its last-seen child as a
    hint, so the blocks of a previous turn are found without hashing (they sit in consecutive rows).
    """
    n = T.shape[0]
    never = np.iinfo(np.int64).max
    total = off[n]
    npos = total
    mh_arr = np.empty(n, np.int64)
    thr_off = np.zeros(n + 1, np.int64)
    maxf = 1
    for r in range(n):
        mh_arr[r] = (T[r] - 1) // b
        thr_off[r + 1] = thr_off[r] + mh_arr[r]
        f = off[r + 1] - off[r]
        if f > maxf:
            maxf = f
        if not new_engine and L[r] % b != 0:
            npos += 1
    thr = np.empty(thr_off[n], np.int64)

    LB = 1
    while (1 << LB) <= npos + 1:
        LB += 1
    tree = np.zeros(npos + 1, np.int32)
    F = 0  # positions appended
    W = 0  # total weight

    # key -> dense id table (entries fingerprint << 31 | id, -1 empty); per dense id one row D[id] =
    # (key, parent id or -1, child hint or -1, position of the first-inserted copy, position of the most
    # recent copy or -1 if not placed yet)
    cap = 1024
    while cap < 4 * maxf:
        cap *= 2
    tab = np.full(cap, -1, np.int64)
    D = np.empty((cap // 2, 5), np.int64)
    nid = 0

    slots = np.empty(maxf, np.int64)
    rems = np.empty(maxf, np.int64)
    amb = np.empty((16, 2), np.int64)
    n_amb = 0

    qb = 0  # positions < qb belong to requests up to the last one with a partial block (vLLM >= 0.24)
    mrem = never  # min removed position (-1 for an add) over accesses after that request

    for r in range(n):
        o = off[r]
        nf = off[r + 1] - o
        mh = mh_arr[r]
        # ---- resolve ids (child hint of the parent, else the hash table), check the chain property
        if 2 * (nid + nf) > cap:
            while 2 * (nid + nf) > cap:
                cap *= 2
            tab = _rehash(tab, cap)
        while nid + nf > D.shape[0]:
            D = _grow_rows(D)
        cm = cap - 1
        par = -1
        for i in range(nf):
            key = hashes[o + i]
            if par >= 0:
                v = D[par, 2]
                if v >= 0 and D[v, 0] == key:
                    slots[i] = v
                    par = v
                    continue
            fp = np.int64(fmix64(np.uint64(key)) >> _S32)
            j = fp & cm
            while True:
                e = tab[j]
                if e < 0:
                    v = nid
                    nid += 1
                    tab[j] = (fp << 31) | v
                    D[v, 0] = key
                    D[v, 1] = par
                    D[v, 2] = -1
                    D[v, 3] = -1
                    D[v, 4] = -1
                    break
                if (e >> 31) == fp:
                    v = e & _ID
                    if D[v, 0] == key:
                        if D[v, 1] != par:
                            return thr_off, thr, amb, n_amb, r
                        break
                j = (j + 1) & cm
            if par >= 0:
                D[par, 2] = v
            slots[i] = v
            par = v

        # ---- thresholds of the lookup blocks, from the state after request r - 1
        base = thr_off[r]
        run = 0
        prevP = -2
        rk = 0
        for i in range(mh):
            s = slots[i]
            P = D[s, 4]
            if P < 0:
                for k in range(i, mh):
                    thr[base + k] = never
                break
            if P == prevP - 1:
                rk += 1  # the weight at prevP is x_{i-1}'s own
            else:
                rk = 1 + W - _prefix(tree, P, LB)
            th = rk
            if new_engine and P < qb and mrem > P:
                th += 1
            if th > run:
                run = th
            thr[base + i] = run
            P1 = D[s, 3]
            if P1 != P:  # the first-inserted copy is not the most recent one: case (c)
                th1 = 1 + W - _prefix(tree, P1, LB)
                if new_engine and P1 < qb and mrem > P1:
                    th1 += 1
                if th1 > run:
                    if n_amb == amb.shape[0]:
                        a2 = np.empty((2 * n_amb, 2), np.int64)
                        a2[:n_amb] = amb
                        amb = a2
                    amb[n_amb, 0] = run
                    amb[n_amb, 1] = th1
                    n_amb += 1
            prevP = P

        # ---- accesses of request r: removals (moves of first-inserted copies), in runs
        nrem = 0
        for i in range(nf - 1, -1, -1):
            s = slots[i]
            if i < mh and D[s, 4] >= 0:
                rems[nrem] = D[s, 3]
                nrem += 1
        _remove_runs(tree, rems, nrem, F)
        W -= nrem

        # ---- appends, in free (position) order
        if not new_engine and L[r] % b != 0:  # vLLM <= 0.23: the partial block is an LRU entry
            _append(tree, F, 1)
            F += 1
            W += 1
        for i in range(nf - 1, -1, -1):
            s = slots[i]
            t = F
            rem = -1
            if D[s, 4] < 0:  # never placed: a new id
                D[s, 3] = t
            elif i < mh:  # touch (or re-allocation after a miss): move the first-inserted copy
                rem = D[s, 3]
                D[s, 3] = t
            # else: capped duplicate, the old copies stay (first-inserted position unchanged)
            D[s, 4] = t
            _append(tree, F, 1)
            F += 1
            if rem < mrem:
                mrem = rem
        W += nf
        if new_engine and L[r] % b != 0:
            qb = F
            mrem = never
    return thr_off, thr, amb, n_amb, -1


# --------------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockThresholds:
    """Per-request hit thresholds of the vLLM block pool (see the module docstring).

    ``thresholds[offsets[r]:offsets[r+1]]`` (length ``(T_r - 1) // b``, nondecreasing) are the ``N*_{r,i}``:
    block ``i`` of request ``r`` is a hit at capacity ``N`` iff ``N ≥ N*_{r,i}`` (:data:`NEVER` if the block
    was never cached). Exact for ``N ≥ min_exact_N`` outside ``ambiguous`` (sorted disjoint ``[lo, hi)``
    capacity intervals, case (c) of the module docstring).
    """

    offsets: np.ndarray
    thresholds: np.ndarray
    prompt_tokens: np.ndarray
    alloc_tokens: np.ndarray
    block_size: int
    engine: str
    colocated: bool
    min_exact_N: int  #: ``max_r ceil(L_r / b)``: below it some request is rejected
    ambiguous: np.ndarray  #: int64[k, 2], merged half-open capacity intervals of case (c)
    n_ambiguous_events: int
    extra: dict = field(default_factory=dict)

    @property
    def max_hit_blocks(self) -> np.ndarray:
        """``(T - 1) // b`` per request (hit cap of ``get_computed_blocks``)."""
        return (self.prompt_tokens - 1) // self.block_size

    @property
    def prompt_blocks(self) -> np.ndarray:
        """``R_j = ceil(T / b)`` per request."""
        return -(-self.prompt_tokens // self.block_size)

    def exact(self, Ns) -> np.ndarray:
        """Boolean per capacity: the stack model is certified equal to :func:`simulate_block`."""
        Ns = _capacities(Ns)
        ok = Ns >= self.min_exact_N
        if self.ambiguous.shape[0]:
            k = np.searchsorted(self.ambiguous[:, 0], Ns, side="right") - 1
            inside = (k >= 0) & (Ns < self.ambiguous[np.maximum(k, 0), 1])
            ok &= ~inside
        return ok

    def hit_blocks(self, N: int) -> np.ndarray:
        """Stack-model hit blocks of every request at capacity ``N`` (int64[n])."""
        N = int(_capacities(N)[0])
        n = self.prompt_tokens.shape[0]
        req = np.repeat(np.arange(n), np.diff(self.offsets))
        return np.bincount(req, weights=self.thresholds <= N, minlength=n).astype(np.int64)


# --------------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------------


def _capacities(Ns) -> np.ndarray:
    a = np.asarray(Ns)
    if a.ndim == 0:
        a = a.reshape(1)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)) or a.dtype == np.bool_:
        raise BlockCurveError(f"Ns: expected a 1-d integer array of capacities, got {a.dtype} {a.shape}")
    a = a.astype(np.int64)
    if a.size and int(a.min()) < 1:
        raise BlockCurveError(f"Ns: capacities must be >= 1, got {int(a.min())}")
    if a.size and int(a.max()) >= NEVER:
        raise BlockCurveError("Ns: capacities must be < 2**63 - 1")
    return a


def _inputs(prompt_tokens, hash_offsets, hashes, block_size, engine, colocated, response_tokens):
    T, L, resp, off, hs, b = request_stream(
        prompt_tokens,
        hash_offsets,
        hashes,
        block_size=block_size,
        engine=engine,
        colocated=colocated,
        response_tokens=response_tokens,
        error=BlockCurveError,
    )
    if hs.shape[0] >= 2**31 - 1:
        raise BlockCurveError("hashes: at most 2**31 - 2 block accesses supported")
    return T, L, resp, off, hs, b


def _merge(iv: np.ndarray) -> np.ndarray:
    if iv.shape[0] == 0:
        return np.zeros((0, 2), np.int64)
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    out = [list(iv[0])]
    for lo, hi in iv[1:]:
        if lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return np.asarray(out, np.int64).reshape(-1, 2)


# --------------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------------


def block_hit_thresholds(
    prompt_tokens,
    hash_offsets,
    hashes,
    *,
    block_size: int,
    engine: str = "vllm",
    colocated: bool = False,
    response_tokens=None,
) -> BlockThresholds:
    """Hit thresholds ``N*_{r,i}`` of every leading lookup block, for instantaneous requests.

    Inputs as :func:`kvhit.sim.vllm.block.simulate_block` (without ``N``, ``times``, ``hold``). The hash stream
    must be chained (each id always has the same parent id and block index); otherwise
    :class:`BlockCurveError` names the first offending request. See the module docstring for the proof
    of (★) and for where the result is certified exact (:meth:`BlockThresholds.exact`).
    """
    T, L, _, off, hs, b = _inputs(prompt_tokens, hash_offsets, hashes, block_size, engine, colocated, response_tokens)
    n = T.shape[0]
    new_engine = ENGINES[engine]
    if n:
        thr_off, thr, amb, n_amb, bad = _thresholds_kernel(T, L, off, hs, b, new_engine)
    else:
        thr_off, thr, amb, n_amb, bad = np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros((0, 2)), 0, -1
    if bad >= 0:
        raise BlockCurveError(
            f"hashes: request {int(bad)} reuses a block id with a different parent id or block index; the "
            "stream is not a chained prefix-hash stream (use kvhit.sim.vllm.blockids to build one)"
        )
    amb = np.asarray(amb[:n_amb], np.int64)
    nb_max = int((-(-L // b)).max()) if n else 1
    return BlockThresholds(
        offsets=thr_off,
        thresholds=thr,
        prompt_tokens=T,
        alloc_tokens=L,
        block_size=b,
        engine=engine,
        colocated=bool(colocated),
        min_exact_N=max(nb_max, 1),
        ambiguous=_merge(amb),
        n_ambiguous_events=int(n_amb),
    )


def _mask(mask, n: int) -> np.ndarray:
    if mask is None:
        return np.ones(n, bool)
    m = np.asarray(mask)
    if m.dtype != np.bool_ or m.shape != (n,):
        raise BlockCurveError(f"mask: expected a boolean array of shape ({n},), got {m.dtype} {m.shape}")
    return m


def block_curve_from_thresholds(thr: BlockThresholds, Ns, mask=None) -> dict:
    """Stack-model curve at every capacity in ``Ns`` (any order) from :func:`block_hit_thresholds`.

    Returns arrays over ``Ns``: ``N``, ``hit_blocks`` (``Σ R^H_j``), ``hit_tokens`` (``b·Σ R^H_j``),
    ``prompt_tokens`` (``Σ T_j``), ``prompt_blocks`` (``Σ R_j``, ``R_j = ceil(T_j/b)``),
    ``token_hit_ratio`` (vLLM's ``prefix_cache_hits / prefix_cache_queries``), ``block_hit_ratio`` (the
    paper's ``h``, eq. (6)/(31)), ``request_hit_rate`` / ``full_hit_rate`` (requests with ``≥ 1`` / all
    ``(T-1)//b`` blocks hit, among those with ``(T-1)//b ≥ 1``), ``exact`` (certified capacities), all
    over the measured requests ``mask``. No request is treated as rejected (see ``min_exact_N``).
    """
    Ns = _capacities(Ns)
    n = thr.prompt_tokens.shape[0]
    m = _mask(mask, n)
    mh = np.diff(thr.offsets)
    w = np.repeat(m.astype(np.int64), mh)
    hit = content_curve_from_thresholds(thr.thresholds, w, Ns)
    has = mh >= 1
    first = thr.thresholds[thr.offsets[:-1][has]]
    last = thr.thresholds[thr.offsets[1:][has] - 1]
    wm = m[has].astype(np.int64)
    any_hit = content_curve_from_thresholds(first, wm, Ns)
    full_hit = content_curve_from_thresholds(last, wm, Ns)
    b = thr.block_size
    ptok = int(thr.prompt_tokens[m].sum())
    pblk = int(thr.prompt_blocks[m].sum())
    nreq = int((m & has).sum())
    K = Ns.shape[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "N": Ns,
            "hit_blocks": hit,
            "hit_tokens": hit * b,
            "prompt_tokens": np.full(K, ptok, np.int64),
            "prompt_blocks": np.full(K, pblk, np.int64),
            "token_hit_ratio": hit * b / np.float64(ptok) if ptok else np.full(K, np.nan),
            "block_hit_ratio": hit / np.float64(pblk) if pblk else np.full(K, np.nan),
            "request_hit_rate": any_hit / np.float64(nreq) if nreq else np.full(K, np.nan),
            "full_hit_rate": full_hit / np.float64(nreq) if nreq else np.full(K, np.nan),
            "exact": thr.exact(Ns),
            "simulated": np.zeros(K, bool),
        }


def block_curve(
    prompt_tokens,
    hash_offsets,
    hashes,
    *,
    block_size: int,
    Ns,
    engine: str = "vllm",
    colocated: bool = False,
    response_tokens=None,
    mask=None,
    fallback: str = "simulate",
    thresholds: BlockThresholds | None = None,
) -> dict:
    """Hit ratios of :func:`kvhit.sim.vllm.block.simulate_block` (no holds) at every capacity in ``Ns``.

    One threshold pass (:func:`block_hit_thresholds`) plus one bucketing pass give all certified
    capacities; the others (``N < min_exact_N`` where some request is rejected, or inside an ambiguity
    interval) are handled by ``fallback``: ``"simulate"`` (default: run :func:`simulate_block` at those
    ``N``, exact, rejected requests excluded as in :func:`kvhit.sim.vllm.block.token_hit_ratio`), ``"stack"``
    (keep the stack-model value), ``"nan"``, or ``"infeasible"``: ``N < min_exact_N`` cannot serve the
    workload (its largest request would be refused), so no ratio is computed there (NaN, ``feasible`` false —
    no simulation, which is what made all-capacity curves of 10⁷-turn traces slow), and the rare ambiguity
    intervals above it are simulated. Keys as :func:`block_curve_from_thresholds` plus ``feasible``
    (``N ≥ min_exact_N``); ``exact`` marks certified capacities and ``simulated`` those computed by
    simulation. ``mask`` selects the measured requests. ``thresholds``: a precomputed
    :func:`block_hit_thresholds` of the same inputs (saves the threshold pass).
    """
    if fallback not in _FALLBACKS:
        raise BlockCurveError(f"fallback: expected one of {_FALLBACKS}, got {fallback!r}")
    thr = (
        thresholds
        if thresholds is not None
        else block_hit_thresholds(
            prompt_tokens,
            hash_offsets,
            hashes,
            block_size=block_size,
            engine=engine,
            colocated=colocated,
            response_tokens=response_tokens,
        )
    )
    out = block_curve_from_thresholds(thr, Ns, mask)
    out["feasible"] = out["N"] >= thr.min_exact_N
    ratio_keys = ("token_hit_ratio", "block_hit_ratio", "request_hit_rate", "full_hit_rate")
    if fallback == "infeasible":
        bad = np.flatnonzero(~out["feasible"])
        for k in ratio_keys:
            out[k][bad] = np.nan
        todo = np.flatnonzero(~out["exact"] & out["feasible"])
    else:
        todo = np.flatnonzero(~out["exact"])
    if fallback == "stack" or todo.size == 0:
        return out
    if fallback == "nan":
        for k in ratio_keys:
            out[k][todo] = np.nan
        return out
    m = _mask(mask, thr.prompt_tokens.shape[0])
    b = thr.block_size
    mh = thr.max_hit_blocks
    pb = thr.prompt_blocks
    done: dict[int, tuple] = {}
    for k in todo:
        N = int(out["N"][k])
        if N not in done:
            res = simulate_block(
                thr.prompt_tokens,
                hash_offsets,
                hashes,
                N=N,
                block_size=b,
                engine=engine,
                colocated=colocated,
                response_tokens=response_tokens,
            )
            mm = m & ~res.rejected
            hb = int(res.hit_blocks[mm].sum())
            cand = mm & (mh >= 1)
            done[N] = (
                hb,
                int(thr.prompt_tokens[mm].sum()),
                int(pb[mm].sum()),
                int((res.hit_blocks[cand] >= 1).sum()),
                int((res.hit_blocks[cand] == mh[cand]).sum()),
                int(cand.sum()),
            )
        hb, pt, pbk, anyh, fullh, nreq = done[N]
        out["hit_blocks"][k] = hb
        out["hit_tokens"][k] = hb * b
        out["prompt_tokens"][k] = pt
        out["prompt_blocks"][k] = pbk
        out["token_hit_ratio"][k] = hb * b / pt if pt else np.nan
        out["block_hit_ratio"][k] = hb / pbk if pbk else np.nan
        out["request_hit_rate"][k] = anyh / nreq if nreq else np.nan
        out["full_hit_rate"][k] = fullh / nreq if nreq else np.nan
        out["simulated"][k] = True
    return out
