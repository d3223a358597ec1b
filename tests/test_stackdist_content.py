"""Tests of the all-capacity whole-content LRU curve (hit thresholds N* = D + R_{j-1})."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.sim.content.lru import (
    ContentInputError,
    previous_content_sizes,
    simulate_content,
    simulate_content_many,
)
from kvhit.sim.content.reference import simulate_content_reference
from kvhit.sim.content.stackdist import (
    FIRST_TURN,
    content_curve,
    content_curve_from_thresholds,
    content_hit_thresholds,
)

INF = FIRST_TURN


def test_hand_thresholds():
    # A(4) B(5) A(6) B(7): A's revisit sees B (current size 5) ahead -> N* = 5 + 4 = 9;
    # B's revisit sees A at its current size 6 -> N* = 6 + 5 = 11.
    assert content_hit_thresholds([0, 1, 0, 1], [4, 5, 6, 7]).tolist() == [INF, INF, 9, 11]
    # A(5) B(5) C(5) A(6) A(7): N* = (5+5) + 5 = 15, then nothing in between -> N* = 6.
    assert content_hit_thresholds([0, 1, 2, 0, 0], [5, 5, 5, 6, 7]).tolist() == [INF, INF, INF, 15, 6]
    # B accessed twice in between counts once, at its latest size: A(2) B(3) B(8) A(2) -> 8 + 2 = 10.
    assert content_hit_thresholds([0, 1, 1, 0], [2, 3, 8, 2]).tolist() == [INF, INF, 3, 10]
    # a content larger than N in between: A(3) B(8) A(4) -> N* = 11; at N=5 B evicts everything.
    thr = content_hit_thresholds([0, 1, 0], [3, 8, 4])
    assert thr.tolist() == [INF, INF, 11]
    assert simulate_content([0, 1, 0], [3, 8, 4], 10).hit[2] == 0
    assert simulate_content([0, 1, 0], [3, 8, 4], 11).hit[2] == 1


def test_thresholds_validation():
    with pytest.raises(ContentInputError, match="nondecreasing"):
        content_hit_thresholds([0, 0], [3, 2])
    with pytest.raises(ContentInputError, match="R must be >= 1"):
        content_hit_thresholds([0, 1], [3, 0])
    with pytest.raises(ContentInputError, match="equal lengths"):
        content_hit_thresholds([0, 1], [3])
    with pytest.raises(ContentInputError, match="weights"):
        content_curve([0, 0], [1, 2], [1.0], [3])
    with pytest.raises(ContentInputError, match="weights must be finite"):
        content_curve([0, 0], [1, 2], [1.0, np.nan], [3])
    with pytest.raises(ContentInputError, match="Ns must be >= 0"):
        content_curve([0, 0], [1, 2], None, [3, -1])
    with pytest.raises(ContentInputError, match="thresholds"):
        content_curve_from_thresholds([1.5], [1], [3])
    assert content_hit_thresholds([], []).shape == (0,)
    assert content_curve([], [], None, [1, 2]).tolist() == [0, 0]


@st.composite
def event_streams(draw, max_events=40, max_convs=7, max_inc=10):
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


@settings(max_examples=120, deadline=None)
@given(event_streams())
def test_thresholds_reproduce_simulation_for_every_N(stream):
    conv, R = stream
    thr = content_hit_thresholds(conv, R)
    Ns = np.arange(0, int(R.sum()) + 2)  # exhaustive: beyond Σ R nothing changes
    sweep = simulate_content_many(conv, R, Ns, keep_hits=True)
    expected = (thr[None, :] <= Ns[:, None]).astype(np.uint8)
    assert np.array_equal(sweep.hit, expected)
    # LRU inclusion holds by construction of the thresholds; check it on the simulation too
    assert np.all(np.diff(sweep.hit.astype(np.int8), axis=0) >= 0)
    # first turns never hit; revisits always hit when nothing is ever evicted
    first = np.zeros(conv.shape[0], dtype=bool)
    first[np.unique(conv, return_index=True)[1]] = True
    assert np.all(thr[first] == FIRST_TURN)
    assert np.all(thr[~first] <= R.sum())
    # curve with base weights equals the eq. (12) numerators of the simulations
    assert np.array_equal(content_curve(conv, R, None, Ns), sweep.reused_blocks)


@settings(max_examples=60, deadline=None)
@given(event_streams(), st.lists(st.integers(0, 400), min_size=1, max_size=30), st.integers(0, 2**31))
def test_curve_weights_and_capacity_order(stream, Ns, seed):
    conv, R = stream
    Ns = np.array(Ns, dtype=np.int64)  # unsorted, duplicates allowed
    prev = previous_content_sizes(conv, R)
    practical = np.maximum(prev - 1, 0)
    rng = np.random.default_rng(seed)
    fw = rng.random(conv.shape[0])
    thr = content_hit_thresholds(conv, R)
    cp = content_curve(conv, R, practical, Ns)
    cf = content_curve_from_thresholds(thr, fw, Ns)
    assert cp.dtype == np.int64 and cf.dtype == np.float64
    for k, N in enumerate(Ns):
        ref = simulate_content_reference(conv, R, int(N))
        assert cp[k] == int((practical * ref.hit).sum())
        assert cf[k] == pytest.approx(float((fw * ref.hit).sum()), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("kind", ["linear", "log", "crowded", "single", "dups"])
def test_bucketing_matches_sort_cumsum(kind):
    rng = np.random.default_rng(3)
    thr = rng.integers(1, 10**6, 50_000)
    thr[rng.random(thr.shape[0]) < 0.2] = FIRST_TURN
    w = rng.integers(0, 50, thr.shape[0])
    Ns = {
        "linear": np.linspace(0, 9 * 10**5, 1000).astype(np.int64),
        "log": np.unique(np.geomspace(1, 2 * 10**6, 700).astype(np.int64)),
        "crowded": np.concatenate([np.arange(0, 300), [10**5, 5 * 10**5, 10**7]]),
        "single": np.array([123_456]),
        "dups": rng.integers(0, 10**6, 500),
    }[kind]
    Ns = rng.permutation(Ns)
    order = np.argsort(thr, kind="stable")
    cum = np.concatenate([[0], np.cumsum(w[order])])
    expected = cum[np.searchsorted(thr[order], Ns, side="right")]
    assert np.array_equal(content_curve_from_thresholds(thr, w, Ns), expected)


def test_curve_on_larger_trace_matches_simulation():
    rng = np.random.default_rng(11)
    n, C = 30_000, 600
    conv = rng.integers(0, C, n)
    R = np.zeros(n, dtype=np.int64)
    cur = np.zeros(C, dtype=np.int64)
    for i, c in enumerate(conv):
        cur[c] += rng.integers(1, 25)
        R[i] = cur[c]
    Ns = np.array([0, 5, 100, 1_000, 5_000, 20_000, 80_000, 10**9])
    curve = content_curve(conv, R, None, Ns)
    thr = content_hit_thresholds(conv, R)
    for k, N in enumerate(Ns):
        res = simulate_content(conv, R, N)
        assert curve[k] == res.reused_blocks
        assert np.array_equal(res.hit, (thr <= N).astype(np.uint8))
