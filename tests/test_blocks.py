"""Block accounting (kvhit.workload.blocks): the paper's tail rule (a) and the exact rule (b)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.workload.blocks import BlockError, block_accounting, block_accounting_reference, turn_index


def one(p, r, b=128):
    out = block_accounting([len(p)], p, r, b)
    return {k: v.tolist() for k, v in out.items()}


def test_hand_worked_partial_tail():
    # T1 = 100 (tail 100); Z2 = ceil((100 + 30 + 50)/128) = 2; T2 = 180
    o = one([100, 50], [30, 7])
    assert o["Z"] == [1, 2] and o["R"] == [1, 3]
    assert o["cum_tokens"] == [100, 180]
    assert o["R_full"] == [0, 1] and o["R_phys"] == [1, 2]
    assert o["tail_prev"] == [0, 100]


def test_hand_worked_exact_multiple_has_no_tail():
    # T1 = 128 exactly: the last block is full (hashable), tail_1 = 0, nothing is prefilled twice
    o = one([128, 10], [5, 0])
    assert o["tail_prev"] == [0, 0]
    assert o["Z"] == [1, 1] and o["R"] == [1, 2]
    assert o["cum_tokens"] == [128, 143] and o["R_full"] == [1, 1] and o["R_phys"] == [1, 2]


def test_hand_worked_tail_then_exact_multiple():
    # T1 = 100 (tail 100), T2 = 100 + 8 + 20 = 128 (increment 128 = one block, tail 0), T3 = 133
    o = one([100, 20, 5], [8, 0, 3])
    assert o["cum_tokens"] == [100, 128, 133]
    assert o["Z"] == [1, 1, 1] and o["R"] == [1, 2, 3]
    assert o["tail_prev"] == [0, 100, 0]
    assert o["R_phys"] == [1, 1, 2] and o["R_full"] == [0, 1, 1]


def test_hand_worked_tail_pushes_over_boundary():
    # T1 = 120; new tokens at turn 2: 120 (tail) + 8 + 128 = 256 → Z2 = 2 while R_phys only grows by 1
    o = one([120, 128], [8, 1])
    assert o["Z"] == [1, 2] and o["R"] == [1, 3]
    assert o["cum_tokens"] == [120, 256] and o["R_phys"] == [1, 2] and o["R_full"] == [0, 2]


def test_block_size_one_is_token_count():
    o = one([3, 4, 5], [2, 6, 1], b=1)
    assert o["Z"] == [3, 2 + 4, 6 + 5]
    assert o["R"] == o["cum_tokens"] == o["R_phys"] == o["R_full"]


def test_several_conversations_and_turn_index():
    M = [2, 1, 3]
    p = [100, 50, 200, 100, 20, 5]
    r = [30, 7, 0, 8, 0, 3]
    out = block_accounting(M, p, r, 128)
    assert turn_index(np.array(M)).tolist() == [1, 2, 1, 1, 2, 3]
    assert out["R"].tolist() == [1, 3, 2, 1, 2, 3]


@st.composite
def conversations(draw):
    M = draw(st.lists(st.integers(1, 6), min_size=1, max_size=6))
    n = sum(M)
    p = draw(st.lists(st.integers(1, 400), min_size=n, max_size=n))
    r = draw(st.lists(st.integers(0, 400), min_size=n, max_size=n))
    b = draw(st.sampled_from([1, 2, 3, 16, 128]))
    return M, p, r, b


@settings(max_examples=200, deadline=None)
@given(conversations())
def test_vectorized_matches_reference_and_identities(case):
    M, p, r, b = case
    out = block_accounting(M, p, r, b)
    starts = np.cumsum(M) - M
    for s, m in zip(starts, M, strict=True):
        ref = block_accounting_reference(p[s : s + m], r[s : s + m], b)
        for k, v in ref.items():
            assert out[k][s : s + m].tolist() == v, k
        T = np.array(ref["cum_tokens"])
        # R_j = ⌈T_j/b⌉ + #{l < j : T_l mod b ≠ 0}
        stale = np.concatenate([[0], np.cumsum(T % b != 0)[:-1]])
        assert out["R"][s : s + m].tolist() == (-(-T // b) + stale).tolist()
    assert (out["Z"] >= 1).all()
    assert (out["R"] >= out["R_phys"]).all() and (out["R_phys"] >= out["R_full"]).all()


def test_errors_name_the_field():
    with pytest.raises(BlockError, match="block_size"):
        block_accounting([1], [5], [1], 0)
    with pytest.raises(BlockError, match="prompt_tokens"):
        block_accounting([1], [0], [1], 128)
    with pytest.raises(BlockError, match="response_tokens"):
        block_accounting([1], [3], [-1], 128)
    with pytest.raises(BlockError, match="Σ M"):
        block_accounting([2], [3], [1], 128)
    with pytest.raises(BlockError, match="M"):
        block_accounting([0, 1], [3], [1], 128)
