"""The compiled host-tier passes (native_fast, lmcache_fast, simple_fast, via surface.compiled_tier_pass) equal the
step-wise tier models request by request (GPU and CPU hit tokens, rejections), under hypothesis and on the
hand-worked cases of tests/test_tiers.py and tests/test_tiers_lazy.py (whose expected values were derived by hand)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvhit.sim.engine import Request, replay, requests_from_stream
from kvhit.sim.tiers import make_tiered
from kvhit.sim.tiers.native_fast import native_lru_host_pass
from kvhit.sim.tiers.surface import compiled_covers, compiled_tier_pass, hit_surface, host_pass
from kvhit.sim.vllm.block import simulate_block
from kvhit.sim.vllm.blockids import hashes_from_block_counts
from test_tiers import _S, HAND, traces


def _stream(reqs):
    T = np.array([q.prompt_tokens for q in reqs], np.int64)
    off = np.cumsum([0] + [len(q.block_hashes) for q in reqs]).astype(np.int64)
    h = np.array([x for q in reqs for x in q.block_hashes], np.int64)
    return T, off, h


def _both(T, off, h, N, b, C, bpc, **kw):
    res = simulate_block(T, off, h, N=N, block_size=b)
    g = res.hit_blocks.astype(np.int64) * b
    adm = ~res.rejected
    py = host_pass(requests_from_stream(T, off, h), g, adm, tier="native", C=C, b=b, blocks_per_chunk=bpc, **kw)
    fast = native_lru_host_pass(T, off, h, g, adm, C=C, block_size=b, bpc=bpc, **kw)
    return py, fast


def _stepwise(tier, reqs, N, b, C, **kw):
    res = replay(make_tiered(tier, gpu_blocks=N, host_capacity=C, block_size=b, **kw), reqs)
    return [None if o is None else (o.gpu_hit_tokens, o.cpu_hit_tokens) for o in res.outcomes]


def _compiled(tier, reqs, N, b, C, **kw):
    g, c, rej = compiled_tier_pass(*_stream(reqs), tier=tier, N=N, C=C, block_size=b, **kw)
    return [None if rej[r] else (int(g[r]), int(c[r])) for r in range(len(reqs))]


def _shrink(tr, d):
    """The drawn trace with the GPU made smaller by ``d`` blocks (the largest requests are rejected)."""
    b, N, reqs = tr
    return b, max(1, N - d), reqs


# ---- hypothesis: compiled == step-wise, request by request ------------------------------------------------------
@_S
@given(traces(), st.integers(0, 20), st.integers(1, 3))
def test_fast_host_pass_equals_python(tr, C, bpc):
    b, N, reqs = tr
    py, fast = _both(*_stream(reqs), N, b, C, bpc)
    assert fast.tolist() == py.tolist()


@_S
@given(
    traces(),
    st.integers(0, 4),
    st.integers(0, 20),
    st.integers(1, 3),
    st.sampled_from([0, 1, 2, 3]),
    st.sampled_from([0, 1, 3, 64_000]),
)
def test_native_compiled_equals_stepwise(tr, d, C, bpc, thr, mts):
    b, N, reqs = _shrink(tr, d)
    kw = {"blocks_per_chunk": bpc, "store_threshold": thr, "max_tracker_size": mts}
    assert _compiled("native", reqs, N, b, C, **kw) == _stepwise("native", reqs, N, b, C, **kw)


@_S
@given(traces(), st.integers(0, 4), st.integers(0, 12), st.integers(1, 3), st.sampled_from(["vllm", "vllm-0.23"]))
def test_lmcache_compiled_equals_stepwise(tr, d, C, k, engine):
    b, N, reqs = _shrink(tr, d)
    kw = {"chunk_tokens": k * b, "engine": engine}
    assert _compiled("lmcache", reqs, N, b, C, **kw) == _stepwise("lmcache", reqs, N, b, C, **kw)


@_S
@given(traces(), st.integers(0, 4), st.integers(1, 24), st.sampled_from(["vllm", "vllm-0.23"]))
def test_simple_compiled_equals_stepwise(tr, d, C, engine):
    b, N, reqs = _shrink(tr, d)
    assert _compiled("simple", reqs, N, b, C, engine=engine) == _stepwise("simple", reqs, N, b, C, engine=engine)


@_S
@given(traces(), st.integers(0, 4), st.integers(1, 24), st.integers(1, 64))
def test_simple_lazy_compiled_equals_stepwise(tr, d, C, mnbt):
    b, N, reqs = _shrink(tr, d)
    kw = {"max_num_batched_tokens": mnbt}
    assert _compiled("simple-lazy", reqs, N, b, C, **kw) == _stepwise("simple-lazy", reqs, N, b, C, **kw)


# ---- hand-worked cases (values derived in tests/test_tiers.py and tests/test_tiers_lazy.py) -----------------------
def _req(rid, T, conv=0, b=4):
    return Request(rid=rid, prompt_tokens=T, block_hashes=tuple(conv * 1000 + i for i in range(T // b)))


def test_hand_cases():
    assert _compiled("native", HAND, 5, 4, 10) == [(0, 0), (0, 0), (0, 16), (0, 16), (4, 12)]
    assert _compiled("lmcache", HAND, 5, 4, 10, chunk_tokens=8) == [(0, 0), (0, 0), (0, 16), (0, 15), (4, 11)]
    assert _compiled("simple", HAND, 5, 4, 11) == [(0, 0), (0, 0), (0, 16), (0, 12), (4, 8)]
    # the eager prefill-step store before the flush (found by the conformance suite)
    reqs = [Request(0, 2, (1, 2)), Request(1, 5, (1, 2, 3, 4, 5)), Request(2, 3, (1, 2, 3))]
    assert _compiled("simple", reqs, 5, 1, 4) == [(0, 0), (2, 0), (2, 0)]
    # lazy: a request is written back tail first, so the CPU keeps its head (eager loses it)
    reqs = [_req(0, 8, 0), _req(1, 4, 1), _req(2, 12, 3), _req(3, 9, 0)]
    assert _compiled("simple-lazy", reqs, 4, 4, 6) == [(0, 0), (0, 0), (0, 0), (0, 4)]
    assert _compiled("simple", reqs, 4, 4, 6) == [(0, 0), (0, 0), (0, 0), (0, 0)]
    # lazy: the walk covers 2·⌈4/4⌉ = 2 blocks per step, so A's head is never written back
    reqs = [_req(0, 12, 0), _req(1, 8, 1), _req(2, 13, 0)]
    assert _compiled("simple-lazy", reqs, 4, 4, 6, max_num_batched_tokens=4) == [(0, 0), (0, 0), (0, 0)]
    assert _compiled("simple", reqs, 4, 4, 6)[2] == (0, 12)


def test_store_threshold_and_tracker_bound():
    """b=4, 2 GPU blocks, 8 CPU chunks, store_threshold=2. Conversations 0 and 1 (2 blocks each) alternate, each
    flushing the other from the GPU. Unbounded tracker: conv 0 is offered at r0 (count 1) and r2 (count 2: stored),
    conv 1 at r1 and r3; r4 (conv 0 again) misses the GPU and loads both chunks (8 tokens: no T - 1 cap on the CPU
    side). With max_tracker_size=2 every offer of one conversation pushes the other's counts out of the tracker:
    nothing is ever offered twice in a row, nothing stored, nothing loaded."""
    reqs = [_req(0, 8, 0), _req(1, 8, 1), _req(2, 8, 0), _req(3, 8, 1), _req(4, 8, 0)]
    for mts, last in ((64_000, (0, 8)), (2, (0, 0))):
        kw = {"store_threshold": 2, "max_tracker_size": mts}
        want = [(0, 0)] * 4 + [last]
        assert _stepwise("native", reqs, 2, 4, 8, **kw) == want
        assert _compiled("native", reqs, 2, 4, 8, **kw) == want
    # without the threshold conv 0 is stored at r0 and r2 already loads it
    assert _compiled("native", reqs, 2, 4, 8)[2] == (0, 8)


def _workload(seed=7, n=400, b=4):
    rng = np.random.default_rng(seed)
    conv = rng.integers(0, 40, n)
    last: dict[int, int] = {}
    T = np.zeros(n, np.int64)
    for r, c in enumerate(conv):
        T[r] = last.get(int(c), 0) + int(rng.integers(1, 40))
        last[int(c)] = int(T[r]) + int(rng.integers(0, 8))
    off, h = hashes_from_block_counts(conv, T // b, shared_prefix_blocks=3)
    return T, off, h


def test_fast_host_pass_on_a_longer_workload():
    """400 requests over 40 conversations with a shared system prompt: tight and roomy tiers, loads and refusals."""
    b = 4
    T, off, h = _workload()
    for C, bpc in ((5, 1), (40, 1), (200, 2), (1000, 3)):
        py, fast = _both(T, off, h, 60, b, C, bpc)
        assert fast.tolist() == py.tolist()
        assert C < 100 or py.sum() > 0  # a roomy tier serves loads
    py2, fast2 = _both(T, off, h, 60, b, 200, 1, store_threshold=2)
    assert fast2.tolist() == py2.tolist()
    assert py2.sum() != _both(T, off, h, 60, b, 200, 1)[0].sum()  # the threshold changes what is loaded here


@pytest.mark.parametrize(
    "tier,kw",
    [
        ("simple", {}),
        ("simple", {"engine": "vllm-0.23"}),
        ("simple-lazy", {}),
        ("simple-lazy", {"max_num_batched_tokens": 16}),
        ("lmcache", {"chunk_tokens": 8}),
    ],
)
def test_compiled_on_a_longer_workload(tier, kw):
    """The same 400 requests (some longer than the 20-block GPU: rejected) at tight and roomy CPU sizes."""
    b = 4
    T, off, h = _workload()
    reqs = requests_from_stream(T, off, h)
    served = 0
    for N, C in ((20, 3), (60, 40), (60, 400)):
        got = _compiled(tier, reqs, N, b, C, **kw)
        assert got == _stepwise(tier, reqs, N, b, C, **kw)
        served += sum(x[1] for x in got if x)
    assert served > 0 and any(x is None for x in _compiled(tier, reqs, 20, b, 3, **kw))


# ---- the surface uses them where they cover the configuration ---------------------------------------------------
def test_compiled_covers():
    assert compiled_covers("native") and compiled_covers("native", {"store_threshold": 3, "blocks_per_chunk": 2})
    assert not compiled_covers("native", {"policy": "arc"})
    assert not compiled_covers("native", {"prompt_only": False})
    assert compiled_covers("lmcache", {"chunk_tokens": 512}) and compiled_covers("simple")
    assert compiled_covers("simple", {"colocated": False}) and not compiled_covers("simple", {"colocated": True})
    assert compiled_covers("simple-lazy", {"max_num_batched_tokens": 4})
    assert not compiled_covers("simple-lazy", engine="vllm-0.23")
    assert not compiled_covers("hicache")
    with pytest.raises(ValueError, match="no compiled pass covers 'native'"):
        compiled_tier_pass([4], [0, 1], [1], tier="native", N=2, C=1, block_size=4, policy="arc")


@pytest.mark.parametrize(
    "tier,kw",
    [
        ("native", {}),
        ("native", {"store_threshold": 2}),
        ("lmcache", {"chunk_tokens": 8}),
        ("simple", {}),
        ("simple-lazy", {}),
    ],
)
def test_surface_compiled_equals_stepwise(tier, kw):
    T, off, h = _workload(seed=3, n=150)
    args = dict(tier=tier, gpu_blocks=[20, 60], host=[1, 16, 200], block_size=4, **kw)
    a = hit_surface(T, off, h, **args)
    s = hit_surface(T, off, h, compiled=False, **args)
    np.testing.assert_array_equal(a.hit, s.hit)
    np.testing.assert_array_equal(a.load_tokens, s.load_tokens)
    assert (a.load_tokens > 0).any()
