"""Where the vLLM-faithful block cache and Algorithm 1 must agree — and where they must not.

The regime, worked out (vLLM ≥ 0.24 free-queue order, instantaneous requests, no prefix shared across
conversations, every prompt of T_j = R_j·b − 1 tokens so that R_j − 1 blocks are full and one is partial):

* Freed partial blocks go to the free-queue head and are the first popped by the next allocation, so they never
  displace a hashed block. With instantaneous requests exactly one partial block is free at every lookup, so at
  most N − 1 hashed blocks are cached: the hashed capacity is N − 1.
* Every request fits (R_j ≤ N) and b ≥ 2 (so the last block really is partial).
* A request touches its surviving prefix and re-allocates the rest, then frees tail first, so all R_i − 1 hashed
  blocks of the last-accessed conversation i sit together at the MRU end, last block nearest the LRU end.
* Hence conversation X's whole hashed history (R_{j−1} − 1 blocks) survives to its next turn iff
  Σ_{i accessed since} (R_i − 1) + (R_{j−1} − 1) ≤ N − 1 — exactly Algorithm 1's hit condition (see
  kvhit.sim.content.stackdist) for contents of size R − 1 at capacity N − 1.

So: "the block cache served the full hashable history" ⇔ "Algorithm 1 with sizes R − 1 and capacity N − 1 hits",
request by request. Under vLLM ≤ 0.23 the orphaned partial blocks take LRU slots and the equivalence breaks
(tested below: the old order never hits more often than the new one in this regime).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.sim.content.lru import previous_content_sizes, simulate_content
from kvhit.sim.vllm.block import simulate_block
from kvhit.sim.vllm.blockids import hashes_from_block_counts


def _random_events(rng, n_conv, max_turns, zmax):
    rows = []
    for c in range(n_conv):
        m = int(rng.integers(1, max_turns + 1))
        R = np.cumsum(rng.integers(1, zmax + 1, size=m))
        R[0] += 1  # R_1 ≥ 2 so every prompt has at least one full block (R − 1 ≥ 1)
        R[1:] += 1
        start = rng.uniform(0, n_conv)
        times = start + np.cumsum(np.concatenate([[0.0], rng.exponential(3.0, size=m - 1)]))
        rows += [(t, c, j, r) for j, (t, r) in enumerate(zip(times, R, strict=True))]
    rows.sort()
    conv = np.array([r[1] for r in rows], dtype=np.int64)
    R = np.array([r[3] for r in rows], dtype=np.int64)
    turn = np.array([r[2] for r in rows], dtype=np.int64)
    return conv, R, turn


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), extra=st.integers(0, 80), b=st.sampled_from([2, 4, 16]))
def test_full_history_hit_equals_algorithm1_on_hashed_sizes(seed, extra, b):
    rng = np.random.default_rng(seed)
    conv, R, turn = _random_events(rng, n_conv=int(rng.integers(2, 25)), max_turns=6, zmax=6)
    N = int(R.max()) + extra  # every request fits (a request larger than N is rejected by vLLM but flushes
    # the whole cache in Algorithm 1 — outside the regime)
    T = R * b - 1
    off, hashes = hashes_from_block_counts(conv, T // b)
    res = simulate_block(T, off, hashes, N=N, block_size=b, engine="vllm")
    R_prev = previous_content_sizes(conv, R)
    full_hit = (res.hit_blocks == R_prev - 1) & (turn >= 1)
    alg1 = simulate_content(conv, R - 1, N - 1).hit.astype(bool)
    np.testing.assert_array_equal(full_hit[turn >= 1], alg1[turn >= 1])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), extra=st.integers(0, 80))
def test_old_free_order_never_serves_more_full_histories(seed, extra):
    rng = np.random.default_rng(seed)
    conv, R, turn = _random_events(rng, n_conv=int(rng.integers(2, 25)), max_turns=6, zmax=6)
    N = int(R.max()) + extra
    T = R * 4 - 1
    off, hashes = hashes_from_block_counts(conv, T // 4)
    new = simulate_block(T, off, hashes, N=N, block_size=4, engine="vllm")
    old = simulate_block(T, off, hashes, N=N, block_size=4, engine="vllm-0.23")
    assert old.hit_blocks.sum() <= new.hit_blocks.sum()
