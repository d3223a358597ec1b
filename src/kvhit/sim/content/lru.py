"""Exact whole-content LRU simulator (paper App. B.4, Algorithm 1).

Input is an event stream sorted by time with one event per conversation turn:

* ``conv`` — int64[n], conversation index of the event (dense ``0..C-1`` is fastest; any non-negative
  labels are accepted and compacted internally);
* ``R`` — int64[n], the history content size ``R_j`` (in KV blocks) of that conversation right after the
  turn-``j`` prompt, i.e. the new stored content size ``Z_θ ← R_j`` of Algorithm 1, line 4.

Turn ``j`` of a conversation must come after turn ``j-1`` in the stream, and ``R`` is nondecreasing within a
conversation (``R_j = R_{j-1} + X_j + Y_{j-1}``, eq. (1)).

For each event Algorithm 1 sets ``H_{θ,j} = 1{θ ∈ L}`` (the stored content, of size ``R_{j-1}``, is still
resident when turn ``j`` arrives), replaces the content by ``R_j`` and moves it to the MRU end, then evicts
whole conversations from the LRU end while the resident total exceeds ``N``. A content larger than ``N`` is
therefore inserted and then evicted by the same loop (together with everything behind it). First turns are
always misses (``H = 0``); the empirical hit ratio is eq. (12): ``Σ_{j≥2} R_{j-1} H_j / Σ_j R_j``.

The kernel keeps the resident list as an array-based doubly linked list indexed by conversation, so every
event costs O(1) amortized (each eviction is paid for by the insertion that preceded it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

__all__ = [
    "ContentInputError",
    "ContentResult",
    "ContentSweep",
    "previous_content_sizes",
    "simulate_content",
    "simulate_content_many",
]


class ContentInputError(ValueError):
    """Invalid event stream or capacity given to the whole-content LRU simulator."""


# ----------------------------------------------------------------------------------------------------------
# input validation (shared with kvhit.sim.content.stackdist and kvhit.sim.content.reference)
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _first_bad_R(conv, R, C):  # pragma: no cover - compiled
    """First event index with ``R < 1`` or ``R`` below the conversation's previous ``R``; -1 if none."""
    last = np.zeros(C, dtype=np.int64)
    for i in range(conv.shape[0]):
        c = np.uint64(conv[i])
        r = R[i]
        if r < 1 or r < last[c]:
            return i
        last[c] = r
    return -1


def _raise_bad_R(conv: np.ndarray, R: np.ndarray, i: int) -> None:
    """Raise the :class:`ContentInputError` for event ``i`` flagged by a kernel's ``R`` check."""
    r = int(R[i])
    if r < 1:
        raise ContentInputError(f"R must be >= 1 (content size in blocks), found R={r} at event {i}")
    raise ContentInputError(
        f"R must be nondecreasing within a conversation: event {i} has R={r}, below the previous R of "
        f"the same conversation (conv index {int(conv[i])})"
    )


def _as_int_array(x, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise ContentInputError(f"{name} must be a 1-D array, got shape {a.shape}")
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.dtype.kind == "b" or a.dtype.kind not in "iuf":
        raise ContentInputError(f"{name} must be an integer array, got dtype {a.dtype}")
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or not np.all(a == np.floor(a)):
            raise ContentInputError(f"{name} must hold integer values")
        if np.abs(a).max() >= 2.0**63:
            raise ContentInputError(f"{name} has values beyond int64")
    if a.dtype == np.uint64 and int(a.max()) > np.iinfo(np.int64).max:
        raise ContentInputError(f"{name} has values beyond int64")
    return np.ascontiguousarray(a, dtype=np.int64)


def _prepare_events(conv, R) -> tuple[np.ndarray, np.ndarray, int]:
    """Dtype, length and ``conv`` checks; return int64 ``(conv, R, C)`` with ``conv`` in ``[0, C)``.

    The ``R`` checks (``R ≥ 1``, nondecreasing per conversation) are left to the caller (fused into the
    kernels, or :func:`validate_events`).
    """
    conv = _as_int_array(conv, "conv")
    R = _as_int_array(R, "R")
    if conv.shape[0] != R.shape[0]:
        raise ContentInputError(f"conv and R must have equal lengths, got {conv.shape[0]} and {R.shape[0]}")
    n = conv.shape[0]
    if n == 0:
        return conv, R, 0
    cmin = int(conv.min())
    if cmin < 0:
        raise ContentInputError(f"conv must be >= 0, found {cmin} at event {int(np.argmin(conv))}")
    C = int(conv.max()) + 1
    if C > n:  # sparse labels: compact to 0..C-1 (labels are never reported)
        _, conv = np.unique(conv, return_inverse=True)
        conv = np.ascontiguousarray(conv.reshape(-1), dtype=np.int64)
        C = int(conv.max()) + 1
    if C >= np.iinfo(np.int32).max:
        raise ContentInputError(f"conv: too many distinct conversations ({C}); fewer than 2**31-1 supported")
    return conv, R, C


def validate_events(conv, R) -> tuple[np.ndarray, np.ndarray, int]:
    """Validate an event stream and return ``(conv, R, C)`` as contiguous int64 arrays.

    ``conv`` is compacted to ``0..C-1`` when its labels are sparse (max label ≥ n), which does not change
    any simulator output (conversation labels are never reported).

    Raises :class:`ContentInputError` naming the offending field: non-integer or non-1-D input, lengths
    differ, ``conv < 0``, ``R < 1``, or ``R`` decreasing within a conversation.
    """
    conv, R, C = _prepare_events(conv, R)
    if conv.shape[0]:
        bad = int(_first_bad_R(conv, R, C))
        if bad >= 0:
            _raise_bad_R(conv, R, bad)
    return conv, R, C


def _validate_capacity(N, name: str = "N") -> int:
    if isinstance(N, bool | np.bool_):
        raise ContentInputError(f"{name} must be an integer capacity in blocks, got bool")
    try:
        Ni = int(N)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ContentInputError(f"{name} must be an integer capacity in blocks, got {N!r}") from exc
    if Ni != N:
        raise ContentInputError(f"{name} must be an integer capacity in blocks, got {N!r}")
    if Ni < 0:
        raise ContentInputError(f"{name} must be >= 0, got {Ni}")
    if Ni > np.iinfo(np.int64).max:
        raise ContentInputError(f"{name} must fit in int64, got {Ni}")
    return Ni


def _validate_capacities(Ns, name: str = "Ns") -> np.ndarray:
    a = np.asarray(Ns)
    if a.ndim == 0:
        a = a.reshape(1)
    if a.ndim != 1:
        raise ContentInputError(f"{name} must be a 1-D array of capacities, got shape {a.shape}")
    a = _as_int_array(a, name)
    if a.size and int(a.min()) < 0:
        raise ContentInputError(f"{name} must be >= 0, found {int(a.min())}")
    return a


# ----------------------------------------------------------------------------------------------------------
# compiled kernel
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _lru_kernel(conv, R, C, N, hit):  # pragma: no cover - compiled
    """Algorithm 1 over the whole stream; writes ``hit`` in place.

    The resident list L is a circular doubly linked list over conversation indices with a sentinel node
    ``C`` (``nxt`` points towards the LRU end); a non-resident conversation is a self-loop, so unlinking
    it is a no-op and the hit/miss path has no branch. ``size[c] > 0`` is the resident ``Z_c``; after an
    eviction ``size[c] = -Z_c`` keeps the last ``R`` for the monotonicity check. Indices are unsigned to
    avoid numba's negative-index fix-ups.

    Returns ``(bad, evictions, evicted_blocks, max_resident, reused_blocks, n_hits, total_blocks)``;
    ``bad`` is the first event with an invalid ``R`` (``R < 1`` or decreasing), -1 if none, in which
    case the other outputs are meaningless.
    """
    S = np.uint32(C)  # sentinel: nxt[S] = MRU end, prv[S] = LRU end
    nxt = np.arange(C + 1).astype(np.uint32)
    prv = np.arange(C + 1).astype(np.uint32)
    size = np.zeros(C + 1, dtype=np.int64)
    total = 0
    evictions = 0
    evicted_blocks = 0
    max_resident = 0
    reused = 0
    n_hits = 0
    sum_R = 0
    for i in range(conv.shape[0]):
        ii = np.uint64(i)
        c = np.uint64(conv[ii])
        r = R[ii]
        s = size[c]
        if r < 1 or r < abs(s):
            return i, 0, 0, 0, 0, 0, 0
        # line 1: H = 1{θ ∈ L}; the stored content has size R_{j-1} = s
        h = s > 0
        sp = s if h else 0
        hit[ii] = h
        n_hits += h
        reused += sp
        # line 2-3: unlink (no-op for a non-resident self-loop)
        p = prv[c]
        q = nxt[c]
        nxt[p] = q
        prv[q] = p
        # line 4-5: Z_θ <- R_j at the MRU end
        size[c] = r
        total += r - sp
        sum_R += r
        f = nxt[S]
        prv[c] = S
        nxt[c] = f
        prv[f] = c
        nxt[S] = c
        # line 6-9: whole-content eviction from the LRU end
        while total > N:
            v = prv[S]
            sv = size[v]
            total -= sv
            evicted_blocks += sv
            evictions += 1
            size[v] = -sv
            p = prv[v]
            prv[S] = p
            nxt[p] = S
            prv[v] = v
            nxt[v] = v
        if total > max_resident:
            max_resident = total
    return -1, evictions, evicted_blocks, max_resident, reused, n_hits, sum_R


@njit(cache=True)
def _previous_sizes_kernel(conv, R, C):  # pragma: no cover - compiled
    last = np.zeros(C, dtype=np.int64)
    out = np.empty(conv.shape[0], dtype=np.int64)
    for i in range(conv.shape[0]):
        c = np.uint64(conv[i])
        out[i] = last[c]
        last[c] = R[i]
    return out


@njit(cache=True, parallel=True)
def _many_kernel(conv, R, C, Ns, keep_hits):  # pragma: no cover - compiled
    K = Ns.shape[0]
    n = conv.shape[0]
    stats = np.zeros((K, 7), dtype=np.int64)
    hits = np.zeros((K if keep_hits else 0, n), dtype=np.uint8)
    for k in prange(K):
        if keep_hits:
            h = hits[k]
        else:
            h = np.empty(n, dtype=np.uint8)
        out = _lru_kernel(conv, R, C, Ns[k], h)
        for m in range(7):
            stats[k, m] = out[m]
    return stats, hits


# ----------------------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContentResult:
    """Outcome of one whole-content LRU run (Algorithm 1) at capacity ``N``.

    Attributes
    ----------
    hit : uint8[n]
        ``H_{θ,j}`` per event (0 for first turns).
    N : int
        HBM capacity in blocks.
    evictions : int
        Number of whole-content evictions (line 8 executions).
    evicted_blocks : int
        Total blocks evicted (Σ of evicted ``Z_i``).
    max_resident : int
        Largest resident total after any event's eviction loop; always ≤ ``N``.
    reused_blocks : int
        Σ_{j≥2} R_{j-1} H_j — the numerator of eq. (12).
    total_blocks : int
        Σ_j R_j — the denominator of eq. (12) (sum of ``R`` over all events).
    """

    hit: np.ndarray
    N: int
    evictions: int
    evicted_blocks: int
    max_resident: int
    reused_blocks: int
    total_blocks: int

    @property
    def capacity_ok(self) -> bool:
        """True iff the resident total never exceeded ``N`` after an event (Algorithm 1 invariant)."""
        return self.max_resident <= self.N

    @property
    def n_hits(self) -> int:
        return int(self.hit.sum(dtype=np.int64))

    @property
    def hit_ratio(self) -> float:
        """Empirical block hit ratio, eq. (12): Σ R_{j-1} H_j / Σ R_j (nan for an empty stream)."""
        return self.reused_blocks / self.total_blocks if self.total_blocks > 0 else float("nan")


@dataclass(frozen=True)
class ContentSweep:
    """Whole-content LRU runs at several capacities ``Ns`` (same event stream).

    Every array is indexed like ``Ns``; ``hit`` is uint8[len(Ns), n] when requested, else ``None``.
    """

    Ns: np.ndarray
    evictions: np.ndarray
    evicted_blocks: np.ndarray
    max_resident: np.ndarray
    reused_blocks: np.ndarray
    n_hits: np.ndarray
    total_blocks: int
    hit: np.ndarray | None

    @property
    def capacity_ok(self) -> bool:
        return bool(np.all(self.max_resident <= self.Ns))

    @property
    def hit_ratio(self) -> np.ndarray:
        """Eq. (12) per capacity."""
        if self.total_blocks <= 0:
            return np.full(self.Ns.shape, np.nan)
        return self.reused_blocks / self.total_blocks


def previous_content_sizes(conv, R) -> np.ndarray:
    """Per event, the stored size ``R_{j-1}`` of the conversation when turn ``j`` arrives (0 for first turns).

    This is the base weight of eq. (12); ``max(R_{j-1} - 1, 0)`` is the practical weight.
    """
    conv, R, C = validate_events(conv, R)
    return _previous_sizes_kernel(conv, R, C)


def simulate_content(conv, R, N) -> ContentResult:
    """Run the whole-content LRU policy (Algorithm 1) exactly at HBM capacity ``N`` blocks.

    Parameters
    ----------
    conv, R : array_like of int
        Event stream sorted by time (see module docstring): conversation index and ``R_j`` per turn.
    N : int
        HBM capacity in KV blocks (``N ≥ 0``).

    Raises
    ------
    ContentInputError
        (a ``ValueError``) on malformed input; the message names the field.
    """
    N = _validate_capacity(N)
    conv, R, C = _prepare_events(conv, R)
    n = conv.shape[0]
    hit = np.empty(n, dtype=np.uint8)
    if n == 0:
        return ContentResult(hit, N, 0, 0, 0, 0, 0)
    bad, ev, eb, mr, ru, _nh, tot = _lru_kernel(conv, R, C, np.int64(N), hit)
    if bad >= 0:
        _raise_bad_R(conv, R, int(bad))
    res = ContentResult(
        hit=hit,
        N=N,
        evictions=int(ev),
        evicted_blocks=int(eb),
        max_resident=int(mr),
        reused_blocks=int(ru),
        total_blocks=int(tot),
    )
    if not res.capacity_ok:  # pragma: no cover - kernel invariant
        raise AssertionError(f"resident total {res.max_resident} exceeded capacity N={N}")
    return res


def simulate_content_many(conv, R, Ns, *, keep_hits: bool = False) -> ContentSweep:
    """Run Algorithm 1 independently for every capacity in ``Ns`` (parallel over capacities).

    With ``keep_hits=True`` the per-event hit matrix ``uint8[len(Ns), n]`` is returned (memory
    ``len(Ns)·n`` bytes). For many capacities prefer :func:`kvhit.sim.content.stackdist.content_curve`, which gives
    the eq. (12) numerators for all capacities from one pass.
    """
    Ns = _validate_capacities(Ns)
    conv, R, C = validate_events(conv, R)
    n = conv.shape[0]
    K = Ns.shape[0]
    if n == 0 or K == 0:
        z = np.zeros(K, dtype=np.int64)
        hit = np.zeros((K, n), dtype=np.uint8) if keep_hits else None
        return ContentSweep(Ns, z, z.copy(), z.copy(), z.copy(), z.copy(), int(R.sum()), hit)
    stats, hits = _many_kernel(conv, R, C, Ns, bool(keep_hits))
    sweep = ContentSweep(
        Ns=Ns,
        evictions=stats[:, 1].copy(),
        evicted_blocks=stats[:, 2].copy(),
        max_resident=stats[:, 3].copy(),
        reused_blocks=stats[:, 4].copy(),
        n_hits=stats[:, 5].copy(),
        total_blocks=int(R.sum()),
        hit=hits if keep_hits else None,
    )
    if not sweep.capacity_ok:  # pragma: no cover - kernel invariant
        raise AssertionError("resident total exceeded capacity in simulate_content_many")
    return sweep
