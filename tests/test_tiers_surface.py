"""h(HBM, DRAM) surface (kvhit.sim.tiers.surface): equal to per-pair TieredEngine replays; the counterexamples
that rule out a one-pass (stack) computation over DRAM sizes."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.sim.engine import Request, replay, requests_from_stream
from kvhit.sim.tiers import make_tiered
from kvhit.sim.tiers.lmcache import LMCacheTier
from kvhit.sim.tiers.surface import hit_surface
from kvhit.sim.vllm.blockids import hashes_from_block_counts


@st.composite
def streams(draw):
    b = draw(st.integers(1, 3))
    n = draw(st.integers(1, 25))
    nconv = draw(st.integers(1, 5))
    conv = np.array(draw(st.lists(st.integers(0, nconv - 1), min_size=n, max_size=n)))
    last: dict[int, int] = {}
    T = []
    for c in conv:
        t = last.get(int(c), 0) + draw(st.integers(1, 4 * b))
        T.append(t)
        last[int(c)] = t + draw(st.integers(0, b))
    T = np.array(T, np.int64)
    off, h = hashes_from_block_counts(conv, T // b, shared_prefix_blocks=draw(st.integers(0, 2)))
    return b, T, off, h


def _per_pair(tier, T, off, h, b, Ns, Cs, **kw):
    reqs = requests_from_stream(T, off, h)
    out = np.zeros((len(Ns), len(Cs)))
    for i, N in enumerate(Ns):
        for j, C in enumerate(Cs):
            e = make_tiered(tier, gpu_blocks=int(N), host_capacity=int(C), block_size=b, **kw)
            res = replay(e, reqs)
            adm = ~res.rejected
            out[i, j] = res.hit_tokens[adm].sum() / T[adm].sum() if adm.any() else np.nan
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.sampled_from(["native", "native-arc", "lmcache", "simple"]), st.integers(1, 2))
def test_surface_equals_per_pair_replay(s, tier, k):
    b, T, off, h = s
    kw = {"policy": "arc"} if tier == "native-arc" else {}
    name = tier.split("-")[0]
    if name == "lmcache":
        kw = {"chunk_tokens": k * b}
    Ns = np.array([1, 3, 8, 20])
    Cs = np.array([0, 1, 4, 12]) if name != "simple" else np.array([1, 4, 12])
    surf = hit_surface(T, off, h, tier=name, gpu_blocks=Ns, host=Cs, block_size=b, **kw)
    ref = _per_pair(name, T, off, h, b, Ns, Cs, **kw)
    np.testing.assert_array_equal(np.isnan(surf.hit), np.isnan(ref))
    np.testing.assert_allclose(np.nan_to_num(surf.hit), np.nan_to_num(ref), rtol=0, atol=1e-12)


def test_surface_process_pool_equals_in_process():
    rng = np.random.default_rng(7)
    conv = rng.integers(0, 6, 60)
    T = np.zeros(60, np.int64)
    last: dict[int, int] = {}
    for r, c in enumerate(conv):
        T[r] = last.get(int(c), 0) + int(rng.integers(1, 40))
        last[int(c)] = int(T[r]) + 5
    off, h = hashes_from_block_counts(conv, T // 4)
    kw = dict(tier="native", gpu_blocks=[40, 80], host=[0, 16, 64], block_size=4)
    a = hit_surface(T, off, h, workers=1, **kw)
    b = hit_surface(T, off, h, workers=2, **kw)
    np.testing.assert_array_equal(a.hit, b.hit)
    assert (a.hit >= a.gpu_hit[:, None] - 1e-12).all()


def _req(rid, T, conv):
    return Request(rid, T, tuple(conv * 100 + i for i in range(T)))


def test_native_not_monotone_in_dram():
    """More DRAM, fewer hits: the all-or-nothing store. b = 1, 6 GPU blocks. With 5 CPU chunks r2 cannot make
    room for its 3 new chunks (only conv 1's chunk is evictable; its own offered chunks are protected), stores
    nothing and conv 1's chunk survives to serve r3; with 6 it evicts that chunk to store. No stack algorithm
    (inclusion property) can do this, so the DRAM axis is simulated per size."""
    reqs = [_req(0, 3, 0), _req(1, 1, 1), _req(2, 6, 0), _req(3, 4, 1)]
    hits = []
    for C in (5, 6):
        e = make_tiered("native", gpu_blocks=6, host_capacity=C, block_size=1)
        hits.append([o.hit_tokens for o in replay(e, reqs).outcomes])
    assert hits == [[0, 0, 3, 1], [0, 0, 3, 0]]


def test_lmcache_no_inclusion():
    """LMCache content at C = 6 is not a subset of the content at C = 7 (chunks of 1 block): the request
    (999, 101..109) finds only its head in the small tier and re-inserts 101..109 in order, pushing its own
    chunks out head first; the large tier finds 999, 101..106, touches them head-most-recent and evicts 106,
    105, 104 for the new ones. Chunk 104 ends up in the small tier only."""
    reqs = [
        Request(0, 2, (999, 101)),
        Request(1, 7, (999, 101, 102, 103, 104, 105, 106)),
        Request(2, 10, (999, 101, 102, 103, 104, 105, 106, 107, 108, 109)),
    ]
    tiers = [LMCacheTier(C, block_size=1, chunk_tokens=1) for C in (6, 7)]
    for q in reqs:
        for t in tiers:
            t.lookup(q, 0)
            t.admit(q, 0, 0)
    small, large = (set(t.eviction_order()) for t in tiers)
    assert small == {104, 105, 106, 107, 108, 109}
    assert large == {103, 102, 101, 999, 107, 108, 109}
    assert not small <= large
