"""The two-tier union's compiled sums (``kvhit.estimate.tiers._union_sums``, issue 23 §6) against the numpy
expression they replace (``np.maximum(G[:, i:i+1], H + tail[:, i:i+1]).sum(axis=0)``, estimate_tiers at da358f2):
bit for bit, NaN included, for ≥ 2 host sizes (one host size keeps the numpy expression: numpy sums a contiguous
column pairwise)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.estimate.tiers import _union_sums


def _numpy(G, H, tail):
    return np.stack([np.maximum(G[:, i : i + 1], H + tail[:, i : i + 1]).sum(axis=0) for i in range(G.shape[1])])


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    n=st.integers(1, 300),
    nN=st.integers(1, 6),
    nC=st.integers(2, 9),
    nan=st.booleans(),
    zero_tail=st.booleans(),
)
def test_union_sums_equal_numpy_bit_for_bit(seed, n, nN, nC, nan, zero_tail):
    rng = np.random.default_rng(seed)
    G = rng.random((n, nN)) * rng.choice([1.0, 1e3])
    H = rng.random((n, nC)) * rng.choice([1.0, 1e3])
    tail = np.zeros((n, nN)) if zero_tail else rng.random((n, nN)) * 5
    G[rng.random((n, nN)) < 0.3] = 0.0  # ties and zeros
    if nan:
        G[rng.integers(0, n), rng.integers(0, nN)] = np.nan
        H[rng.integers(0, n), rng.integers(0, nC)] = np.nan
    assert np.array_equal(_union_sums(G, H, tail), _numpy(G, H, tail), equal_nan=True)


def test_union_sums_long_columns_bit_for_bit():
    rng = np.random.default_rng(0)
    G, H, tail = rng.random((27_000, 20)) * 500, rng.random((27_000, 50)) * 500, rng.random((27_000, 20))
    assert np.array_equal(_union_sums(G, H, tail), _numpy(G, H, tail))
