"""The compiled llm-d stay probability (:func:`kvhit.fleet.stay_kernel.stay_max`) against the NumPy form it
replaces (:func:`kvhit.fleet.estimate._stay_prob` with ``better="max"``), bit for bit (within 1e-15 for a single
prefix fraction, where NumPy sums the one contiguous column pairwise), on scores with many exact
ties (small integers and multiples of 1/4, as in-flight counts and min–max queue scores give) and on continuous
ones; and llm-d's stay probabilities under load at several capacities against values the NumPy form computed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.fleet.estimate import _stay_prob, stay_probabilities_arrays
from kvhit.fleet.stay_kernel import stay_max


def _numpy_form(base, fs, wp):
    return _stay_prob(base[:, :1] + wp * fs[None, :], base[:, 1:], "max")


@settings(max_examples=150, deadline=None)
@given(
    S=st.integers(1, 40),
    R=st.integers(2, 6),
    K=st.integers(1, 12),
    wp=st.sampled_from([0.0, 1.0, 3.0, 0.7]),
    grid=st.sampled_from([0.25, 1.0, None]),
    seed=st.integers(0, 2**31 - 1),
)
def test_stay_max_equals_numpy_form(S, R, K, wp, grid, seed):
    rng = np.random.default_rng(seed)
    if grid is None:
        base = rng.normal(size=(S, R))
        fs = np.sort(rng.random(K))
    else:  # exact ties between replicas and between home and the best other
        base = rng.integers(0, 4, size=(S, R)) * grid
        fs = np.unique(rng.integers(0, 5, size=K) * 0.25)
    got = stay_max(np.ascontiguousarray(base[:, 0]), np.ascontiguousarray(base[:, 1:]), fs, wp)
    want = _numpy_form(base, fs, wp)
    if fs.size > 1:  # NumPy's mean over axis 0 of an (S, K ≥ 2) array adds row by row, as the kernel does
        assert np.array_equal(got, want)
    else:  # one column is contiguous: NumPy sums it pairwise, so the tie shares (1/3, …) may round differently
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_stay_max_hand_case():
    """Two snapshots, R = 3: s0 others (1, 1) tie, s1 others (0, 2). Home base (1, 1), f in {0, 0.5}, w_p = 2:
    f = 0 → s0 ties with both others (1/3), s1 loses (2 > 1): 1/6; f = 0.5 → home 2: s0 wins, s1 ties with one
    other (1/2): (1 + 1/2)/2 = 0.75."""
    base = np.array([[1.0, 1.0, 1.0], [1.0, 0.0, 2.0]])
    got = stay_max(np.ascontiguousarray(base[:, 0]), np.ascontiguousarray(base[:, 1:]), np.array([0.0, 0.5]), 2.0)
    assert got.tolist() == pytest.approx([1 / 6, 0.75], abs=0)


def test_llmd_stay_under_load_pinned():
    """llm-d's stay probabilities under load (the KV usage term reads N) at three capacities of one generator
    (the memoised prefix fractions and queue score) equal those of separate calls, and one value per capacity
    equals what the NumPy form gave at the commit before the kernel (literals)."""
    rng = np.random.default_rng(3)
    n = 400
    T = rng.integers(40, 4000, n)
    first = rng.random(n) < 0.25
    H = np.where(first, 0, rng.integers(0, 30, n))
    W = np.where(first, np.inf, rng.exponential(60.0, n))
    t = np.sort(rng.random(n) * 600.0)
    hold = rng.exponential(2.0, n)
    qs = {
        N: stay_probabilities_arrays(T, H, W, first, t, "llm-d", 4, hold=hold, Ns=[N] * 4, block_size=128, seed=5)
        for N in (40, 400, 4000)
    }
    from kvhit.fleet.estimate import _stay_arrays_over_capacities

    gen = _stay_arrays_over_capacities(
        T, H, W, first, t, "llm-d", 4, [[N] * 4 for N in (40, 400, 4000)], hold=hold, params=None, rate=None,
        block_size=128, samples=2048, seed=5,
    )  # fmt: skip
    for N, q in zip((40, 400, 4000), gen, strict=True):
        assert np.array_equal(q, qs[N], equal_nan=True)
    rows = np.flatnonzero(~first & (qs[40] < 1.0))[:3]
    # computed by the NumPy form at e442ffa (before the kernel); the KV-usage term makes them differ by N
    want = {
        40: (244.95703125, [0.7255859375, 0.85986328125, 0.72607421875]),
        400: (255.63798014322916, [0.7265625, 1.0, 0.728515625]),
        4000: (257.3336181640625, [0.72705078125, 1.0, 0.728515625]),
    }
    for N, (total, at_rows) in want.items():
        assert float(np.nansum(qs[N])) == total
        assert qs[N][rows].tolist() == at_rows


def _kv_walk_loop(first, stay, d, jump, R):
    """kvhit.fleet.estimate._kv_walk's Python loop before kv_walk compiled it, verbatim."""
    out = np.empty(first.size, np.int64)
    cur = 0
    for i in range(first.size):
        if first[i]:
            cur = int(d[i])
        elif not stay[i]:
            cur = (cur + int(jump[i])) % R
        out[i] = cur
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 60), st.integers(0, 2**32 - 1))
def test_kv_walk_is_the_python_loop(R, n, seed):
    """The compiled walk of the stay model's routing gives the replicas the Python loop gave."""
    from kvhit.fleet.stay_kernel import kv_walk

    rng = np.random.default_rng(seed)
    first = rng.random(n) < 0.3
    first[0] = True
    stay = rng.random(n) < 0.6
    d = rng.integers(0, R, n)
    jump = rng.integers(1, max(R, 2), n)
    np.testing.assert_array_equal(kv_walk(first, stay, d, jump, R), _kv_walk_loop(first, stay, d, jump, R))
