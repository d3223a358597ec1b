"""MurmurHash3's 64-bit finalizer, the one word mixer of kvhit's block ids.

Invariant: :func:`fmix64` is a bijection of uint64 words, so ids built from it (synthetic block ids, the
re-chained production-trace ids, the block pool's hash-table home slots) are injective in their inputs. It lives
at the bottom layer (no kvhit import, no scipy) so that readers (``workload``), simulators (``sim``) and the
conformance environments share it without importing upwards.
Not modelled: nothing — this is a pure function, not a model of an engine's hash (vLLM hashes token content).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["fmix64"]

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)


@njit(cache=True, inline="always")
def fmix64(x):
    """MurmurHash3's 64-bit finalizer: a bijection of uint64 words (shared by the hash table, the synthetic
    block ids and the production-trace re-chaining)."""
    x ^= x >> _S33
    x *= _M1
    x ^= x >> _S33
    x *= _M2
    x ^= x >> _S33
    return x
