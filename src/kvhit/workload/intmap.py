"""An open-addressing hash map from int64 keys to int64 values, in numba (for per-conversation state in streams).

Layout: ``tab`` is int64[cap, 2] (key, value) with ``cap`` a power of two and ``value == -1`` marking an empty
slot; the home slot of a key is ``fmix64(key) & (cap − 1)``; collisions probe linearly; deletion shifts later
entries of the probe run back (no tombstones), so a lookup's cost stays bounded by the load, which the callers
keep ≤ 1/2. Values must be ≥ 0.

Invariant: after any sequence of :func:`map_find` / :func:`map_put` / :func:`map_delete`, every stored key is
found from its home slot without crossing an empty slot. NOT here: growing the table (callers size it, with
:func:`map_capacity`, before a batch of insertions, and rebuild with :func:`map_rebuild`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvhit.workload.hashing import fmix64

__all__ = ["map_capacity", "map_delete", "map_empty", "map_find", "map_put", "map_rebuild"]


def map_capacity(n: int) -> int:
    """The table size (a power of two ≥ 16) that holds ``n`` keys at load ≤ 1/2."""
    cap = 16
    while cap < 2 * n:
        cap *= 2
    return cap


def map_empty(cap: int) -> np.ndarray:
    """An empty open-addressing table of ``cap`` slots: rows (key, value), every value -1 (no entry)."""
    tab = np.zeros((cap, 2), np.int64)
    tab[:, 1] = -1
    return tab


@njit(cache=True, inline="always")
def _home(key, mask):
    return np.int64(fmix64(np.uint64(key)) & np.uint64(mask))


@njit(cache=True)
def map_find(key, tab):  # pragma: no cover - compiled
    """Slot holding ``key``, or ``-(empty slot + 1)`` where it would go."""
    mask = np.int64(tab.shape[0] - 1)
    i = _home(key, mask)
    while tab[i, 1] != -1:
        if tab[i, 0] == key:
            return i
        i = (i + 1) & mask
    return -(i + 1)


@njit(cache=True)
def map_put(slot, key, value, tab):  # pragma: no cover - compiled
    """Store ``key → value`` at ``slot`` (an empty slot, ``-(map_find(key) + 1)``)."""
    tab[slot, 0] = key
    tab[slot, 1] = value


@njit(cache=True)
def map_delete(i, tab):  # pragma: no cover - compiled
    """Delete the entry in slot ``i`` (backward-shift deletion)."""
    mask = np.int64(tab.shape[0] - 1)
    j = i
    while True:
        j = (j + 1) & mask
        if tab[j, 1] == -1:
            break
        k = _home(tab[j, 0], mask)
        if i <= j:
            stay = i < k and k <= j
        else:
            stay = i < k or k <= j
        if stay:
            continue
        tab[i, 0] = tab[j, 0]
        tab[i, 1] = tab[j, 1]
        i = j
    tab[i, 1] = -1


@njit(cache=True)
def map_rebuild(old, new):  # pragma: no cover - compiled
    """Insert every entry of table ``old`` into the (empty, larger) table ``new``."""
    for j in range(old.shape[0]):
        if old[j, 1] != -1:
            i = -map_find(old[j, 0], new) - 1
            new[i, 0] = old[j, 0]
            new[i, 1] = old[j, 1]
