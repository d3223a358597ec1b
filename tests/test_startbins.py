"""The start-time histogram's bin count (Birgé–Rozenholc penalised likelihood), pinned on hand-worked samples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.estimate.startbins import MAX_BINS, start_bins


def test_hand_worked_clustered_sample():
    # n = 12: ten starts at 0.00 … 0.09, two at 0.95 and 1.0; D ≤ ⌊12 / ln 12⌋ = 4.
    # L(D) = Σ N_j ln(D N_j / n) − (D − 1 + (ln D)^2.5), worked by hand:
    #   D=1: 0;  D=2 (10, 2): 5.108 − 2.197 − 1.400 = 1.511;  D=3 (10, 0, 2): 9.163 − 1.386 − 3.265 = 4.512;
    #   D=4 (10, 0, 0, 2): 12.040 − 0.811 − 5.263 = 5.966  →  D = 4
    x = np.array([0.01 * k for k in range(10)] + [0.95, 1.0])
    assert start_bins(x) == 4
    # the criterion's values, from the formula evaluated term by term (not by the function under test)
    vals = {2: 1.511, 3: 4.512, 4: 5.966}
    for d, v in vals.items():
        cnt = np.histogram(x, bins=d, range=(0.0, 1.0))[0]
        c = cnt[cnt > 0]
        assert sum(ci * math.log(d * ci / 12) for ci in c) - (d - 1 + math.log(d) ** 2.5) == pytest.approx(v, abs=2e-3)


def test_evenly_spaced_starts_take_one_bin():
    # 40 evenly spaced starts: every regular histogram has equal counts (± 1), L(D) ≈ 0 − pen(D) < 0 for D > 1
    assert start_bins(np.arange(40.0)) == 1


def test_uniform_and_poisson_pools_of_35_take_one_bin_sqrt_takes_six():
    for s in range(5):
        r = np.random.default_rng(s)
        u = r.uniform(0, 3600, 35)
        assert start_bins(u) == 1
        assert start_bins(u, "sqrt") == 6  # round(√35) = 6


def test_degenerate_and_bad_rule():
    assert start_bins(np.array([5.0])) == 1
    assert start_bins(np.array([1.0, 2.0])) == 1
    assert start_bins(np.full(30, 7.0)) == 1
    with pytest.raises(ValueError, match="rule"):
        start_bins(np.arange(10.0), "scott")


def test_a_strong_trend_gets_more_than_one_bin():
    # 60 starts in the first tenth of the window, 6 spread over the rest: a real shape, not noise
    x = np.concatenate([np.linspace(0.0, 0.1, 60), np.linspace(0.2, 1.0, 6)])
    assert start_bins(x) > 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.0, 1e4, allow_nan=False, allow_subnormal=False), min_size=3, max_size=80),
    st.integers(-10, 10),
)
def test_scale_invariance_and_bounds(xs, k):
    x = np.array(xs)
    d = start_bins(x)
    n = x.shape[0]
    assert 1 <= d <= min(MAX_BINS, max(1, math.floor(n / math.log(n))))
    # rescaling the time axis (powers of two: exact in floating point) leaves the bin count unchanged
    assert start_bins(x * 2.0**k) == d


def test_a_subnormal_spread_is_one_bin_not_an_error():
    # found by hypothesis in a fresh-clone make test: np.histogram refused 2 bins on the range [0, 5e-324]
    assert start_bins(np.array([0.0, 0.0, 5e-324, 5e-324])) == 1
    x = np.array([0.0, 1e-310, 2e-310, 3e-310, 1e-309])
    assert 1 <= start_bins(x) <= 24
