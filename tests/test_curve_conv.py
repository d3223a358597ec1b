"""The conversation-structured block curve (kvhit.sim.vllm.curve_conv) equals block_hit_thresholds on the ids of
hashes_from_block_counts: histogram of the measured finite thresholds, min_exact_N, ambiguity intervals — with a
tiny tree, so that compaction runs many times."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.sim.vllm.blockids import hashes_from_block_counts
from kvhit.sim.vllm.curve import NEVER, block_hit_thresholds
from kvhit.sim.vllm.curve_conv import conv_threshold_histogram


@st.composite
def streams(draw):
    b = draw(st.integers(1, 5))
    n = draw(st.integers(1, 80))
    nconv = draw(st.integers(1, 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    conv = rng.integers(0, nconv, n)
    p_mult = draw(st.sampled_from([0.0, 0.5]))
    p_rep = draw(st.sampled_from([0.0, 0.3]))
    last: dict[int, int] = {}
    T = []
    for c in conv:
        c = int(c)
        if c in last and rng.random() < p_rep:
            t = last[c]  # a retried prompt: capped duplicates
        else:
            t = last.get(c, 0) + int(rng.integers(1, 3 * b + 1))
            if rng.random() < p_mult:
                t = -(-t // b) * b
        T.append(t)
        last[c] = t
    mask = rng.random(n) < 0.7
    return conv.astype(np.int64), np.asarray(T, np.int64), b, mask


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=streams(), engine=st.sampled_from(["vllm", "vllm-0.23"]), cap=st.sampled_from([16, 40, None]))
def test_equals_block_hit_thresholds(s, engine, cap):
    conv, T, b, mask = s
    off, hs = hashes_from_block_counts(conv, T // b)
    ref = block_hit_thresholds(T, off, hs, block_size=b, engine=engine)
    got = conv_threshold_histogram(conv, T, block_size=b, engine=engine, mask=mask, tree_capacity=cap)
    sel = np.repeat(mask, np.diff(ref.offsets)) & (ref.thresholds < NEVER)
    want = np.bincount(ref.thresholds[sel], minlength=got.hist.size)
    assert np.array_equal(got.hist, want[: got.hist.size]) and want[got.hist.size :].sum() == 0
    assert got.min_exact_N == ref.min_exact_N
    assert np.array_equal(got.ambiguous, ref.ambiguous)
    assert got.n_ambiguous_events == ref.n_ambiguous_events


def test_compaction_happens_and_changes_nothing():
    rng = np.random.default_rng(0)
    conv = rng.integers(0, 50, 3000)
    T = np.zeros(conv.size, np.int64)
    tot: dict[int, int] = {}
    for r, c in enumerate(conv):
        tot[int(c)] = tot.get(int(c), 0) + int(rng.integers(1, 40))
        T[r] = tot[int(c)]
    a = conv_threshold_histogram(conv, T, block_size=4, tree_capacity=64)
    big = conv_threshold_histogram(conv, T, block_size=4, tree_capacity=10**7)
    assert a.compactions > 10 and big.compactions == 0
    assert np.array_equal(a.hist, big.hist)
