"""The all-capacity vLLM block curve of :mod:`kvhit.sim.vllm.curve` for conversation-structured block ids, in
O(distinct blocks) memory besides the position tree.

When block ids come from block counts (:func:`kvhit.sim.vllm.blockids.hashes_from_block_counts`, no shared
prefix: what :func:`kvhit.sim.runner.block_requests` builds for ``source`` counts / blocks), block ``i`` of
conversation ``c`` *is* the pair ``(c, i)``. So the pass needs no id stream, no hash table and no chain check:
the dense id is ``base[c] + i`` (``base`` = prefix sums of each conversation's largest block count), and per
dense id it keeps two int32 positions (first-inserted copy, most recent copy). It runs the same model as
:func:`~kvhit.sim.vllm.curve._thresholds_kernel` — the same positions, weights, (★) thresholds with their running
max, the same ``e`` rule and the same ambiguity intervals — and, instead of one int64 threshold per lookup block,
accumulates the measured thresholds into a histogram over threshold values (``N* ≤ W + 2``, ``W`` the live
weights), which is all an all-capacity curve needs.

Memory (bytes): 4 per position of the Fenwick tree (one per block access), kept at most twice the live weights by
*compaction* (when the frontier would pass the tree's capacity, the live positions are renumbered densely in
order — every position an id refers to holds a weight, so order and every ``ρ`` are kept; ``qb``/``mrem`` map to
the count of live positions below them), 8 per distinct block, 8 per histogram value; against ~40 per block
access for the id stream, the hash table, the threshold array and its filtered copy. Invariant: equal to
:func:`~kvhit.sim.vllm.curve.block_hit_thresholds` on ``hashes_from_block_counts(conv, L // b)`` — the histogram
of the measured finite thresholds, ``min_exact_N`` and the ambiguity intervals (tested under hypothesis).

NOT modelled: what :mod:`kvhit.sim.vllm.curve` does not model (requests in flight), plus the colocated mode, shared
prefixes and token-id streams (those use :func:`~kvhit.sim.vllm.curve.block_hit_thresholds`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from kvhit.sim.vllm.block import ENGINES, BlockSimError
from kvhit.sim.vllm.curve import _append, _prefix, _remove_runs  # the position tree (Fenwick) of the exact pass

__all__ = ["ConvThresholdHistogram", "conv_threshold_histogram"]


@njit(cache=True)
def _compact(tree, F, first, recent, nd):  # pragma: no cover - compiled
    """Renumber the live positions ``0..F-1`` densely; returns the map as ``tree`` itself: after the call
    ``tree[P]`` (0-based P ≤ F) is the number of live positions below ``P``. The caller remaps and rebuilds."""
    # Fenwick -> point weights (nodes 1..F), in place
    for i in range(F, 0, -1):
        p = i + (i & (-i))
        if p <= F:
            tree[p] -= tree[i]
    # point weights -> exclusive prefix counts, shifted to 0-based: tree[P] = live positions < P
    acc = 0
    for P in range(F + 1):
        w = tree[P + 1] if P < F else 0
        tree[P] = acc
        acc += w
    for d in range(nd):
        if recent[d] >= 0:
            first[d] = tree[first[d]]
            recent[d] = tree[recent[d]]
    return acc


@njit(cache=True)
def _rebuild(tree, W):  # pragma: no cover - compiled
    """Fenwick tree of ``W`` unit weights at positions ``0..W-1`` (nodes ``1..W``), the rest zero."""
    tree[:] = 0
    for k in range(1, W + 1):
        tree[k] = k & (-k)


@njit(cache=True)
def _conv_kernel(conv, T, b, base, nd, meas, new_engine, cap0):  # pragma: no cover - compiled
    """See the module docstring; the body follows ``kvhit.sim.vllm.curve._thresholds_kernel`` line for line, with
    ``slots[i] = base[conv[r]] + i`` and thresholds binned into ``hist``.
    Returns ``(hist, amb, n_amb, compactions)``."""
    n = T.shape[0]
    never = np.iinfo(np.int64).max
    maxf = 1
    for r in range(n):
        f = T[r] // b
        if f > maxf:
            maxf = f
    cap = max(cap0, 4 * maxf + 16)
    LB = 1
    while (1 << LB) <= cap + 1:
        LB += 1
    tree = np.zeros(cap + 2, np.int32)
    F = 0
    W = 0
    first = np.empty(nd, np.int32)
    recent = np.full(nd, -1, np.int32)
    hist = np.zeros(1024, np.int64)
    slots = np.empty(maxf, np.int64)
    rems = np.empty(maxf, np.int64)
    amb = np.empty((16, 2), np.int64)
    n_amb = 0
    ncomp = 0
    qb = 0
    mrem = never
    for r in range(n):
        nf = T[r] // b
        mh = (T[r] - 1) // b
        part = T[r] % b != 0
        grow = nf + (0 if new_engine or not part else 1)
        if F + grow > cap:  # compaction: renumber the live positions densely
            Wc = _compact(tree, F, first, recent, nd)
            if qb > 0:
                qb = tree[qb] if qb <= F else Wc
            if mrem != never and mrem >= 0:
                mrem = tree[mrem] if mrem <= F else Wc
            F = Wc
            ncomp += 1
            if 2 * (F + grow) > cap:
                cap = 2 * (F + grow)
                tree = np.zeros(cap + 2, np.int32)
                while (1 << LB) <= cap + 1:
                    LB += 1
            _rebuild(tree, F)
        c0 = base[conv[r]]
        for i in range(nf):
            slots[i] = c0 + i
        # ---- thresholds of the lookup blocks, from the state after request r - 1
        run = 0
        prevP = -2
        rk = 0
        for i in range(mh):
            s = slots[i]
            P = recent[s]
            if P < 0:
                break
            if P == prevP - 1:
                rk += 1
            else:
                rk = 1 + W - _prefix(tree, P, LB)
            th = rk
            if new_engine and P < qb and mrem > P:
                th += 1
            if th > run:
                run = th
            if meas[r]:
                if run >= hist.shape[0]:
                    h2 = np.zeros(max(2 * hist.shape[0], run + 1), np.int64)
                    h2[: hist.shape[0]] = hist
                    hist = h2
                hist[run] += 1
            P1 = first[s]
            if P1 != P:
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
        # ---- removals (moves of first-inserted copies), in runs
        nrem = 0
        for i in range(nf - 1, -1, -1):
            s = slots[i]
            if i < mh and recent[s] >= 0:
                rems[nrem] = first[s]
                nrem += 1
        _remove_runs(tree, rems, nrem, F)
        W -= nrem
        # ---- appends, in free (position) order
        if not new_engine and part:
            _append(tree, F, 1)
            F += 1
            W += 1
        for i in range(nf - 1, -1, -1):
            s = slots[i]
            t = F
            rem = -1
            if recent[s] < 0:
                first[s] = t
            elif i < mh:
                rem = first[s]
                first[s] = t
            recent[s] = t
            _append(tree, F, 1)
            F += 1
            if rem < mrem:
                mrem = rem
        W += nf
        if new_engine and part:
            qb = F
            mrem = never
    return hist, amb, n_amb, ncomp


@dataclass(frozen=True)
class ConvThresholdHistogram:
    """``hist[v]``: measured leading lookup blocks with (running-max) threshold ``N* = v``; blocks never cached
    before are not counted. ``min_exact_N`` and ``ambiguous`` as :class:`~kvhit.sim.vllm.curve.BlockThresholds`."""

    hist: np.ndarray
    min_exact_N: int
    ambiguous: np.ndarray
    n_ambiguous_events: int
    compactions: int


def conv_threshold_histogram(
    conv, prompt_tokens, *, block_size: int, engine: str = "vllm", mask=None, tree_capacity: int | None = None
) -> ConvThresholdHistogram:
    """Threshold histogram of the vLLM block pool for ids ``(conv[r], i)`` (``conv`` dense in ``[0, C)``), prompt
    lengths ``prompt_tokens`` (PD mode: ``L = T``), measured requests ``mask``. ``tree_capacity``: initial tree
    positions (default: the block accesses, capped at 2²⁴; compaction keeps it ≤ 2× the live weights)."""
    from kvhit.sim.vllm.curve import _merge

    if engine not in ENGINES:
        raise BlockSimError(f"engine: expected one of {sorted(ENGINES)}, got {engine!r}")
    b = int(block_size)
    if b < 1:
        raise BlockSimError(f"block_size: expected a positive integer, got {block_size!r}")
    conv = np.ascontiguousarray(conv, np.int64)
    T = np.ascontiguousarray(prompt_tokens, np.int64)
    n = T.shape[0]
    if conv.shape != (n,):
        raise BlockSimError(f"conv: expected shape ({n},), got {conv.shape}")
    if n and (T.min() < 1 or conv.min() < 0):
        raise BlockSimError("prompt_tokens must be >= 1 and conv >= 0")
    m = np.ones(n, bool) if mask is None else np.asarray(mask, bool)
    if n == 0:
        return ConvThresholdHistogram(np.zeros(1, np.int64), 1, np.zeros((0, 2), np.int64), 0, 0)
    C = int(conv.max()) + 1
    mx = np.zeros(C, np.int64)
    np.maximum.at(mx, conv, T // b)
    base = np.zeros(C, np.int64)
    np.cumsum(mx[:-1], out=base[1:])
    nd = int(mx.sum())
    acc = int((T // b).sum()) + n
    if acc >= 2**31 - 1 or nd >= 2**31 - 1:
        raise BlockSimError("prompt_tokens: at most 2**31 - 2 block accesses supported")
    cap0 = int(tree_capacity) if tree_capacity is not None else min(acc, 1 << 24)
    hist, amb, n_amb, ncomp = _conv_kernel(conv, T, b, base, nd, m, ENGINES[engine], max(cap0, 16))
    del base, mx
    nb_max = int((-(-T // b)).max())
    return ConvThresholdHistogram(
        hist=hist,
        min_exact_N=max(nb_max, 1),
        ambiguous=_merge(np.asarray(amb[:n_amb], np.int64)),
        n_ambiguous_events=int(n_amb),
        compactions=int(ncomp),
    )
