"""Tests of the exact whole-content LRU simulator (paper App. B.4, Algorithm 1)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.sim.content.lru import (
    ContentInputError,
    previous_content_sizes,
    simulate_content,
    simulate_content_many,
)
from kvhit.sim.content.reference import simulate_content_reference

# ---------------------------------------------------------------------------------------------------------
# hand-worked cases (A=0, B=1, C=2, D=3); the list L is written MRU -> LRU
# ---------------------------------------------------------------------------------------------------------


def _both(conv, R, N):
    a = simulate_content(conv, R, N)
    b = simulate_content_reference(conv, R, N)
    return a, b


def _check(res, hit, evictions, evicted_blocks, max_resident, reused, total):
    assert res.hit.tolist() == hit
    assert res.evictions == evictions
    assert res.evicted_blocks == evicted_blocks
    assert res.max_resident == max_resident
    assert res.reused_blocks == reused
    assert res.total_blocks == total
    assert res.capacity_ok


def test_hand_basic_eviction():
    # N=10. A(4): miss, L=[A] 4.  B(5): miss, L=[B,A] 9.
    # A(6): hit (stored R_{j-1}=4), L=[A,B] 11 > 10 -> evict B(5) -> 6.
    # B(7): miss (evicted), L=[B,A] 13 > 10 -> evict A(6) -> 7.
    conv, R = [0, 1, 0, 1], [4, 5, 6, 7]
    for res in _both(conv, R, 10):
        _check(res, [0, 0, 1, 0], evictions=2, evicted_blocks=11, max_resident=9, reused=4, total=22)
        assert res.hit_ratio == pytest.approx(4 / 22)  # eq. (12)


def test_hand_content_larger_than_N():
    # N=5. A(3): L=[A] 3.  B(8): L=[B,A] 11 > 5 -> evict A(3) -> 8 > 5 -> evict B(8) itself -> 0, L=[].
    # A(4): miss (evicted), L=[A] 4.  B(9): miss, L=[B,A] 13 -> evict A(4) -> 9 -> evict B(9) -> 0.
    conv, R = [0, 1, 0, 1], [3, 8, 4, 9]
    for res in _both(conv, R, 5):
        _check(res, [0, 0, 0, 0], evictions=4, evicted_blocks=24, max_resident=4, reused=0, total=24)


def test_hand_ties_exactly_full_is_not_evicted():
    # N=10: A(4), B(6) -> total 10 == N: no eviction (the loop needs total > N); A(4) hit, B(6) hit.
    conv, R = [0, 1, 0, 1], [4, 6, 4, 6]
    for res in _both(conv, R, 10):
        _check(res, [0, 0, 1, 1], evictions=0, evicted_blocks=0, max_resident=10, reused=10, total=20)
    # N=9: B(6) -> 10 > 9 -> evict A(4) -> 6;  A(4) miss -> 10 -> evict B -> 4;  B(6) miss -> evict A -> 6.
    for res in _both(conv, R, 9):
        _check(res, [0, 0, 0, 0], evictions=3, evicted_blocks=14, max_resident=6, reused=0, total=20)


def test_hand_reinsertion_after_eviction():
    # N=10. A(5) [A] 5; B(5) [B,A] 10; C(5) [C,B,A] 15 -> evict A -> 10.
    # A(6): miss, re-inserted: [A,C,B] 16 -> evict B(5) -> 11 -> evict C(5) -> 6.
    # A(7): hit (stored 6), [A] 7.
    conv, R = [0, 1, 2, 0, 0], [5, 5, 5, 6, 7]
    for res in _both(conv, R, 10):
        _check(res, [0, 0, 0, 0, 1], evictions=3, evicted_blocks=15, max_resident=10, reused=6, total=28)


def test_hand_hit_refreshes_lru_position():
    # N=10. A(3),B(3),C(3): [C,B,A] 9.  A(3) hit -> [A,C,B] 9.  D(3): [D,A,C,B] 12 -> evict B (LRU) -> 9.
    # C(3) hit -> [C,D,A] 9.  B(3) miss -> [B,C,D,A] 12 -> evict A -> 9.
    conv, R = [0, 1, 2, 0, 3, 2, 1], [3, 3, 3, 3, 3, 3, 3]
    for res in _both(conv, R, 10):
        _check(res, [0, 0, 0, 1, 0, 1, 0], evictions=2, evicted_blocks=6, max_resident=9, reused=6, total=21)


def test_zero_capacity_and_empty_stream():
    for res in _both([0, 0, 1], [1, 2, 3], 0):
        _check(res, [0, 0, 0], evictions=3, evicted_blocks=6, max_resident=0, reused=0, total=6)
    res = simulate_content(np.zeros(0, np.int64), np.zeros(0, np.int64), 7)
    assert res.hit.shape == (0,) and res.evictions == 0 and np.isnan(res.hit_ratio)


def test_sparse_labels_equal_dense_labels():
    conv = np.array([10**12, 7, 10**12, 3, 7, 3])
    dense = np.array([2, 1, 2, 0, 1, 0])
    R = np.array([2, 3, 4, 5, 6, 7])
    for N in (0, 5, 9, 12, 100):
        a, b = simulate_content(conv, R, N), simulate_content(dense, R, N)
        assert np.array_equal(a.hit, b.hit) and a.evictions == b.evictions


def test_previous_content_sizes():
    assert previous_content_sizes([0, 1, 0, 0, 1], [2, 3, 5, 5, 4]).tolist() == [0, 0, 2, 5, 3]


# ---------------------------------------------------------------------------------------------------------
# input validation
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("conv", "R", "N", "match"),
    [
        ([0, 1], [1], 5, "equal lengths"),
        ([0, -1], [1, 1], 5, "conv must be >= 0"),
        ([0, 1], [1, 0], 5, "R must be >= 1"),
        ([0, 1, 0], [3, 1, 2], 5, "nondecreasing"),
        ([0, 1], [1, 1], -1, "N must be >= 0"),
        ([0, 1], [1, 1], 2.5, "N must be an integer"),
        ([0, 1], [1, 1], "10", "N must be an integer"),
        ([0, 1], [1.5, 2.0], 5, "R must hold integer"),
        ([[0, 1]], [[1, 1]], 5, "conv must be a 1-D"),
        (["a", "b"], [1, 1], 5, "conv must be an integer"),
    ],
)
def test_invalid_input_raises(conv, R, N, match):
    for fn in (simulate_content, simulate_content_reference):
        with pytest.raises(ContentInputError, match=match):
            fn(conv, R, N)
    assert issubclass(ContentInputError, ValueError)


def test_invalid_input_many():
    with pytest.raises(ContentInputError, match="nondecreasing"):
        simulate_content_many([0, 0], [2, 1], [1, 2])
    with pytest.raises(ContentInputError, match="Ns must be >= 0"):
        simulate_content_many([0, 0], [1, 2], [1, -2])


# ---------------------------------------------------------------------------------------------------------
# randomized: compiled == OrderedDict reference, capacity never exceeded, LRU inclusion
# ---------------------------------------------------------------------------------------------------------


@st.composite
def event_streams(draw, max_events=60, max_convs=8, max_inc=12):
    """Random valid stream: per event a conversation and an increment Z >= 0 (Z_1 >= 1), R = running sum."""
    n = draw(st.integers(1, max_events))
    C = draw(st.integers(1, max_convs))
    conv = draw(st.lists(st.integers(0, C - 1), min_size=n, max_size=n))
    inc = draw(st.lists(st.integers(0, max_inc), min_size=n, max_size=n))
    R = np.zeros(n, dtype=np.int64)
    cur = {}
    for i, (c, z) in enumerate(zip(conv, inc, strict=True)):
        cur[c] = max(cur.get(c, 0) + z, 1)
        R[i] = cur[c]
    return np.array(conv, dtype=np.int64), R


def _capacities(R):
    tot = int(R.sum())
    return np.unique(np.concatenate([np.arange(0, 12), [int(R.max()), int(R.max()) + 1, tot // 3, tot // 2, tot]]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_streams())
def test_compiled_equals_reference(stream):
    conv, R = stream
    for N in _capacities(R):
        a = simulate_content(conv, R, N)
        b = simulate_content_reference(conv, R, N)
        assert np.array_equal(a.hit, b.hit)
        assert (a.evictions, a.evicted_blocks, a.max_resident, a.reused_blocks, a.total_blocks) == (
            b.evictions,
            b.evicted_blocks,
            b.max_resident,
            b.reused_blocks,
            b.total_blocks,
        )
        assert a.max_resident <= N and a.capacity_ok
        # conservation: every inserted block is either still resident or was evicted
        assert a.reused_blocks == int((a.hit * previous_content_sizes(conv, R)).sum())
        assert a.hit[np.unique(conv, return_index=True)[1]].sum() == 0  # first turns never hit


@settings(max_examples=60, deadline=None)
@given(event_streams())
def test_many_equals_single_and_lru_inclusion(stream):
    conv, R = stream
    Ns = np.arange(0, int(R.sum()) + 2)
    sweep = simulate_content_many(conv, R, Ns, keep_hits=True)
    assert sweep.capacity_ok
    # LRU inclusion: a hit at N is a hit at every N' >= N (hits never fall as N grows)
    assert np.all(np.diff(sweep.hit.astype(np.int8), axis=0) >= 0)
    assert np.all(np.diff(sweep.reused_blocks) >= 0)
    # at N >= Σ R nothing is ever evicted: every non-first turn hits
    assert sweep.evictions[-1] == 0
    assert sweep.hit[-1].sum() == conv.shape[0] - np.unique(conv).shape[0]
    for k in np.unique(np.linspace(0, Ns.shape[0] - 1, 7).astype(int)):
        single = simulate_content(conv, R, Ns[k])
        assert np.array_equal(single.hit, sweep.hit[k])
        assert single.evictions == sweep.evictions[k] and single.reused_blocks == sweep.reused_blocks[k]
        assert single.evicted_blocks == sweep.evicted_blocks[k] and single.max_resident == sweep.max_resident[k]


def test_random_larger_trace_against_reference():
    rng = np.random.default_rng(7)
    n, C = 20_000, 400
    conv = rng.integers(0, C, n)
    R = np.zeros(n, dtype=np.int64)
    cur = np.zeros(C, dtype=np.int64)
    for i, c in enumerate(conv):
        cur[c] += rng.integers(1, 30)
        R[i] = cur[c]
    for N in (0, 1, 37, 500, 4_000, 20_000, 10**9):
        a = simulate_content(conv, R, N)
        b = simulate_content_reference(conv, R, N)
        assert np.array_equal(a.hit, b.hit) and a.evictions == b.evictions
        assert a.evicted_blocks == b.evicted_blocks and a.max_resident == b.max_resident <= N
