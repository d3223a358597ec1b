"""The compiled native-tier host pass (kvhit.sim.tiers.native_fast) equals the Python tier model request by request."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvhit.sim.engine import requests_from_stream
from kvhit.sim.tiers.native_fast import native_lru_host_pass
from kvhit.sim.tiers.surface import host_pass
from kvhit.sim.vllm.block import simulate_block
from kvhit.sim.vllm.blockids import hashes_from_block_counts
from test_tiers import _S, traces


def _stream(reqs):
    T = np.array([q.prompt_tokens for q in reqs], np.int64)
    off = np.cumsum([0] + [len(q.block_hashes) for q in reqs]).astype(np.int64)
    h = np.array([x for q in reqs for x in q.block_hashes], np.int64)
    return T, off, h


def _both(T, off, h, N, b, C, bpc):
    res = simulate_block(T, off, h, N=N, block_size=b)
    g = res.hit_blocks.astype(np.int64) * b
    adm = ~res.rejected
    py = host_pass(requests_from_stream(T, off, h), g, adm, tier="native", C=C, b=b, blocks_per_chunk=bpc)
    fast = native_lru_host_pass(T, off, h, g, adm, C=C, block_size=b, bpc=bpc)
    return py, fast


@_S
@given(traces(), st.integers(0, 20), st.integers(1, 3))
def test_fast_host_pass_equals_python(tr, C, bpc):
    b, N, reqs = tr
    py, fast = _both(*_stream(reqs), N, b, C, bpc)
    assert fast.tolist() == py.tolist()


def test_fast_host_pass_on_a_longer_workload():
    """400 requests over 40 conversations with a shared system prompt: tight and roomy tiers, loads and refusals."""
    rng = np.random.default_rng(7)
    b, n = 4, 400
    conv = rng.integers(0, 40, n)
    last: dict[int, int] = {}
    T = np.zeros(n, np.int64)
    for r, c in enumerate(conv):
        T[r] = last.get(int(c), 0) + int(rng.integers(1, 40))
        last[int(c)] = int(T[r]) + int(rng.integers(0, 8))
    off, h = hashes_from_block_counts(conv, T // b, shared_prefix_blocks=3)
    for C, bpc in ((5, 1), (40, 1), (200, 2), (1000, 3)):
        py, fast = _both(T, off, h, 60, b, C, bpc)
        assert fast.tolist() == py.tolist()
        assert C < 100 or py.sum() > 0  # a roomy tier serves loads
