"""Host-memory tiers (kvhit.sim.tiers): hand-worked cases and equality with independent plain-Python references.

The references below are written differently from the models (timestamps and explicit sorts instead of heaps,
ordered dicts and block pools) and only for the sequential replay (each request submitted and finished before
the next), where every rule of the engines' code reduces to an order on timestamps.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.sim.engine import Engine, Request, replay, requests_from_stream
from kvhit.sim.tiers import TieredEngine, make_tiered
from kvhit.sim.tiers.native import cpu_chunks
from kvhit.sim.vllm.block import simulate_block
from kvhit.sim.vllm.blockids import hashes_from_block_counts
from kvhit.sim.vllm.reference import ReferenceBlockPool


def _req(rid, T, conv=0, b=4):
    return Request(rid=rid, prompt_tokens=T, block_hashes=tuple(conv * 1000 + i for i in range(T // b)))


HAND = [_req(0, 16, 0), _req(1, 20, 1), _req(2, 17, 0), _req(3, 16, 1), _req(4, 16, 0)]


def _run(tier, reqs, **kw):
    e = make_tiered(tier, **kw)
    res = replay(e, reqs)
    return e, [(o.gpu_hit_tokens, o.cpu_hit_tokens, o.computed_tokens) for o in res.outcomes]


# ---- hand-worked cases (derivations in the comments) ---------------------------------------------------
def test_native_hand_case():
    # b=4, 5 GPU blocks, 10 CPU chunks (1 block each). r2: GPU lost conv 0, CPU holds its 4 chunks: loads 16
    # (no T-1 cap on the CPU side: T=17 has 4 full blocks), 1 token computed. r3: T=16 fully resident on CPU:
    # loads all 16 (no cap), recomputes 1. r4: GPU kept block 0 of conv 0 (g=4), loads chunks 1..3 (12);
    # chunk 0 was a GPU hit in a request that loaded: neither re-offered nor refreshed, so it keeps the rank
    # committed by r2 (13) and sits just above conv 1's last chunk (rank 5).
    e, out = _run("native", HAND, gpu_blocks=5, host_capacity=10, block_size=4)
    assert out == [(0, 0, 16), (0, 0, 20), (0, 16, 1), (0, 16, 1), (4, 12, 1)]
    assert e.host_eviction_order() == [1004, 0, 1003, 1002, 1001, 1000, 3, 2, 1]


def test_lmcache_hand_case():
    # 8-token chunks (2 blocks): conv 0 keys (1, 3), conv 1 keys (1001, 1003). r2: both chunks found, T=17 > 16:
    # loads 16. r3: T=16 fully found: loads 16 - 1 (the CPU-side T-1 cap). r4: g=4 on the GPU: 16 - 4 - 1 = 11.
    # Lookups touch in reverse: the head chunk ends most recent.
    e, out = _run("lmcache", HAND, gpu_blocks=5, host_capacity=10, block_size=4, chunk_tokens=8)
    assert out == [(0, 0, 16), (0, 0, 20), (0, 16, 1), (0, 15, 1), (4, 11, 1)]
    assert e.host_eviction_order() == [1003, 1001, 3, 1]


def test_lmcache_chunk_alignment():
    # 256-token chunks, 16-token blocks: a 511-token prompt has ONE full chunk; the partial chunk is never
    # stored, so a repeat after the GPU was flushed finds 256 tokens and computes the other 255.
    b = 16
    r0 = Request(0, 511, tuple(range(511 // b)))
    r1 = Request(1, 16 * 64, tuple(range(100, 164)))  # needs the whole 64-block GPU: flushes r0
    r2 = Request(2, 511, tuple(range(511 // b)))
    e, out = _run("lmcache", [r0, r1, r2], gpu_blocks=64, host_capacity=5, block_size=b)
    assert out == [(0, 0, 511), (0, 0, 1024), (0, 256, 255)]
    assert e.host.resident() == 5  # r0's one chunk + r1's four; r2 stores nothing (its 2nd chunk is partial)
    assert e.host_eviction_order()[-1] == 15  # r2's lookup touched r0's chunk (key = hash of block 15)


def test_simple_hand_case():
    # CPU pool of 11 blocks (10 usable: one is vLLM's null block).
    # r0 (PD) is stored by the finish-time flush: its GPU blocks are freed AFTER the
    # request's own free, in prefix order. r3: T=16, the CPU side keeps the T-1 cap: 3 blocks (12) loaded.
    # r4: g=4, cap 16-1-4=11 -> 2 blocks (8). The CPU pool frees stored and loaded blocks in prefix order.
    e, out = _run("simple", HAND, gpu_blocks=5, host_capacity=11, block_size=4)
    assert out == [(0, 0, 16), (0, 0, 20), (0, 16, 1), (0, 12, 4), (4, 8, 4)]
    assert e.host_eviction_order() == [1003, 1004, 0, 3, 1000, 1001, 1002, 1, 2]


def test_simple_prefill_step_store_before_the_flush():
    """b=1, CPU pool of 4 blocks (3 usable). The found-by-conformance case: r0 [A B] is flushed to the CPU. r1
    [A B C X D]: GPU hit A, AB (g=2), already on the CPU; the flush stores ABC, ABCX, ABCXD, evicting A, AB. r2
    [A B C]: GPU hit A, AB (cap T-1); its prefill step stores the GPU-hit blocks A, AB (confirmed before the
    step), evicting ABC and ABCX; the flush, selected while those copies are in flight, finds ABC gone from the
    CPU and stores it again (evicting ABCXD). A flush of all three at once would skip ABC (on the CPU then)."""
    reqs = [Request(0, 2, (1, 2)), Request(1, 5, (1, 2, 3, 4, 5)), Request(2, 3, (1, 2, 3))]
    e, out = _run("simple", reqs, gpu_blocks=5, host_capacity=4, block_size=1)
    assert out == [(0, 0, 2), (2, 0, 3), (2, 0, 1)]
    assert e.host_eviction_order() == [1, 2, 3]
    # GPU: r2's blocks are all pinned at its free; the prefill-step copies complete first (A, AB), then the flush
    assert e.eviction_order() == [4, 5, 1, 2, 3]


def test_native_all_or_nothing_and_protection():
    # 3 CPU chunks; a request offering 4 new chunks stores none (cannot free room for all).
    b = 4
    e = make_tiered("native", gpu_blocks=8, host_capacity=3, block_size=b)
    replay(e, [_req(0, 8, 0)])
    assert e.host.resident() == 2
    replay(e, [Request(1, 16, tuple(2000 + i for i in range(4)))])
    assert e.host.resident() == 2 and e.host.mgr.store_failures >= 1
    assert sorted(e.host_eviction_order()) == [0, 1]


def test_native_store_threshold():
    # store_threshold=2: a chunk is stored on its second offer only.
    e = make_tiered("native", gpu_blocks=2, host_capacity=8, block_size=4, store_threshold=2)
    replay(e, [_req(0, 8, 0)])
    assert e.host.resident() == 0
    replay(e, [_req(1, 8, 1), _req(2, 8, 0)])  # conv 1 flushes the GPU; conv 0 offered a second time
    assert sorted(e.host_eviction_order()) == [0, 1]


def test_native_decode_chunks():
    # colocated, prompt_only=False: chunks of the response (up to T + out - 1 tokens) are stored too.
    r = Request(0, 8, tuple(range(3)), output_tokens=8)  # KV of T + out - 1 = 15 tokens: 3 full blocks of 4, 3 chunks
    e = make_tiered("native", gpu_blocks=8, host_capacity=8, block_size=4, colocated=True, prompt_only=False)
    replay(e, [r])
    assert sorted(e.host_eviction_order()) == [0, 1, 2]
    e = make_tiered("native", gpu_blocks=8, host_capacity=8, block_size=4, colocated=True)
    replay(e, [r])
    assert sorted(e.host_eviction_order()) == [0, 1]


def test_cpu_chunks_formula():
    # 1 GiB, 64 KiB per block per rank, TP 2, 2 blocks per chunk, 4 KiB alignment
    assert cpu_chunks(1 << 30, 65536, world_size=2, blocks_per_chunk=2, alignment=4096) == (1 << 30) // (4 * 65536)
    assert cpu_chunks(1000, 300, alignment=256) == 1000 // 512
    assert cpu_chunks(1 << 20, 1024, world_size=4, replicated=True) == 1024


def test_tiered_is_an_engine():
    e = make_tiered("native", gpu_blocks=4, host_capacity=4, block_size=4)
    assert isinstance(e, Engine) and isinstance(e, TieredEngine)
    with pytest.raises(ValueError, match="tier"):
        make_tiered("nope", gpu_blocks=4, host_capacity=4, block_size=4)
    with pytest.raises(ValueError, match="chunk_tokens"):
        make_tiered("lmcache", gpu_blocks=4, host_capacity=4, block_size=16, chunk_tokens=100)
    with pytest.raises(ValueError, match="policy"):
        make_tiered("native", gpu_blocks=4, host_capacity=4, block_size=4, policy="fifo")
    with pytest.raises(ValueError, match="colocated"):
        make_tiered("native", gpu_blocks=4, host_capacity=4, block_size=4, prompt_only=False)


def test_load_bytes_and_seconds():
    e = make_tiered("native", gpu_blocks=5, host_capacity=10, block_size=4, bytes_per_token=1000, pcie_bytes_per_s=1e6)
    res = replay(e, HAND)
    o = res.outcomes[2]
    assert o.load_bytes == 16_000 and o.load_seconds == pytest.approx(0.016)
    assert o.hit_tokens == o.gpu_hit_tokens + o.cpu_hit_tokens


# ---- independent references (sequential replay) -------------------------------------------------------
def ref_native_lru(reqs, *, N, b, C, bpc=1):
    """vLLM 0.33.0 native offloading, LRU, prompt only, PD, sequential: timestamps + explicit sorts."""
    gpu = ReferenceBlockPool(N, b, True)
    t = 0
    stamp: dict[int, int] = {}  # committed recency (bigger = newer)
    out = []
    tpc = bpc * b
    for q in reqs:
        T = q.prompt_tokens
        hashes = list(q.block_hashes)
        keys = [hashes[(k + 1) * bpc - 1] for k in range(len(hashes) // bpc)][: T // tpc]
        hit = gpu.get_computed_blocks(hashes, T)
        g = len(hit) * b
        # lookup
        c = 0
        max_hit = min(T, len(keys) * tpc)
        if max_hit - g >= tpc:
            s, n = g // tpc, 0
            while s + n < -(-max_hit // tpc) and keys[s + n] in stamp:
                n += 1
            c = min(max_hit, tpc * (s + n)) - g
            c = c if c >= tpc else 0
        blocks = gpu.allocate(hit, hashes, T)
        recorded = []
        nxt = 0
        if c:
            nxt = -(-(g + c) // tpc)
            recorded += keys[(g // b) // bpc : nxt]
        offer = keys[nxt:]
        new = [k for k in offer if k not in stamp]
        recorded += offer
        if new:
            need = len(new) - (C - len(stamp))
            if need > 0:
                # victims: committed keys not offered, oldest first; then this request's provisional keys
                # (the loaded ones: rank newer than everything committed), tail first
                prov = {k for k in recorded if k in stamp}
                cand = sorted((k for k in stamp if k not in prov and k not in offer), key=stamp.get)
                cand += sorted((k for k in prov if k not in offer), key=lambda k: -keys.index(k))
                if need <= len(cand):
                    for k in cand[:need]:
                        del stamp[k]
                    for k in new:
                        stamp[k] = -1
            else:
                for k in new:
                    stamp[k] = -1
        for k in sorted({k for k in recorded if k in stamp}, key=lambda k: -keys.index(k)):
            t += 1
            stamp[k] = t
        gpu.free(blocks)
        out.append((g, c))
    return out


def ref_lmcache(reqs, *, N, b, C, ct):
    gpu = ReferenceBlockPool(N, b, True)
    t = 0
    stamp: dict[int, int] = {}
    out = []
    for q in reqs:
        T = q.prompt_tokens
        hashes = list(q.block_hashes)
        keys = [hashes[(k + 1) * (ct // b) - 1] for k in range(T // ct)]
        n = 0
        while n < len(keys) and keys[n] in stamp:
            n += 1
        for k in reversed(keys[:n]):
            t += 1
            stamp[k] = t
        hit = gpu.get_computed_blocks(hashes, T)
        g = len(hit) * b
        c = max(0, n * ct - g - (n * ct == T))
        for k in keys[n:]:
            if k in stamp or C == 0:
                continue
            if len(stamp) >= C:
                del stamp[min(stamp, key=stamp.get)]
            t += 1
            stamp[k] = t
        gpu.free(gpu.allocate(hit, hashes, T))
        out.append((g, c))
    return out


def _ref_select(hashes, stamp, start, end, free):
    """Blocks of [start, end) not on the CPU, at most ``free``; the cursor stops at the first one left out."""
    idx, i = [], start
    while i < end:
        if hashes[i] not in stamp:
            if len(idx) >= free:
                break
            idx.append(i)
        i += 1
    return idx, i


def _ref_take(stamp, k, C, taken):
    """Take k CPU blocks from the free-queue head: unhashed blocks first, then the oldest stamps."""
    for _ in range(max(0, k - (C - len(stamp) - taken))):
        del stamp[min(stamp, key=stamp.get)]


def ref_simple(reqs, *, N, b, C):
    """SimpleCPUOffloadConnector eager, PD, sequential: CPU recency as timestamps; GPU via the reference pool.

    Per request: the prefill step stores the blocks confirmed before it (the GPU hit and the loaded blocks) that
    are not on the CPU; the finish-time flush, selected while those copies are in flight (their CPU blocks taken,
    not yet hashed), stores the rest from the step's cursor; both complete after the request's GPU free."""
    gpu = ReferenceBlockPool(N, b, True)
    t = 0
    stamp: dict[int, int] = {}
    out = []
    for q in reqs:
        T = q.prompt_tokens
        hashes = list(q.block_hashes)
        hit = gpu.get_computed_blocks(hashes, T)
        g = len(hit) * b
        m = max(0, T - 1 - g) // b
        n = 0
        while n < m and g // b + n < len(hashes) and hashes[g // b + n] in stamp:
            n += 1
        for k in hashes[g // b : g // b + n]:
            t += 1
            stamp[k] = t
        blocks = gpu.allocate(hit, hashes, T)
        # CPU blocks of copies in flight are taken (out of the free queue) but not yet hashed
        first, cursor = _ref_select(hashes, stamp, 0, g // b + n, C)
        _ref_take(stamp, len(first), C, 0)
        flush, _ = _ref_select(hashes, stamp, cursor, T // b, C - len(first))
        _ref_take(stamp, len(flush), C, len(first))
        for i in first + flush:
            t += 1
            stamp[hashes[i]] = t
        pinned = [blocks[i] for i in first + flush]
        gpu.touch(pinned)
        gpu.free(blocks)
        gpu.free_blocks(pinned)
        out.append((g, n * b))
    return out


@st.composite
def traces(draw, max_n=30):
    b = draw(st.integers(1, 4))
    n = draw(st.integers(1, max_n))
    nconv = draw(st.integers(1, 6))
    conv = draw(st.lists(st.integers(0, nconv - 1), min_size=n, max_size=n))
    inc = draw(st.lists(st.integers(1, 4 * b), min_size=n, max_size=n))
    last: dict[int, int] = {}
    T = []
    for c, d in zip(conv, inc, strict=True):
        t = last.get(c, 0) + d
        T.append(t)
        last[c] = t + draw(st.integers(0, 2 * b))
    T = np.array(T, np.int64)
    off, h = hashes_from_block_counts(np.array(conv), T // b, shared_prefix_blocks=draw(st.integers(0, 2)))
    N = draw(st.integers(int(-(-T.max() // b)), int(-(-T.max() // b)) + 12))
    return b, N, requests_from_stream(T, off, h)


_S = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_S
@given(traces(), st.integers(0, 20), st.integers(1, 3))
def test_native_lru_equals_reference(tr, C, bpc):
    b, N, reqs = tr
    e = make_tiered("native", gpu_blocks=N, host_capacity=C, block_size=b, blocks_per_chunk=bpc)
    res = replay(e, reqs)
    got = [(o.gpu_hit_tokens, o.cpu_hit_tokens) for o in res.outcomes]
    assert got == ref_native_lru(reqs, N=N, b=b, C=C, bpc=bpc)


@_S
@given(traces(), st.integers(0, 12), st.integers(1, 3))
def test_lmcache_equals_reference(tr, C, k):
    b, N, reqs = tr
    e = make_tiered("lmcache", gpu_blocks=N, host_capacity=C, block_size=b, chunk_tokens=k * b)
    res = replay(e, reqs)
    got = [(o.gpu_hit_tokens, o.cpu_hit_tokens) for o in res.outcomes]
    assert got == ref_lmcache(reqs, N=N, b=b, C=C, ct=k * b)


@_S
@given(traces(), st.integers(1, 20))
def test_simple_equals_reference(tr, C):
    b, N, reqs = tr
    e = make_tiered("simple", gpu_blocks=N, host_capacity=C + 1, block_size=b)  # + vLLM's null block
    res = replay(e, reqs)
    got = [(o.gpu_hit_tokens, o.cpu_hit_tokens) for o in res.outcomes]
    assert got == ref_simple(reqs, N=N, b=b, C=C)


@_S
@given(traces(), st.integers(0, 20), st.sampled_from(["native", "lmcache", "native-arc"]))
def test_gpu_hits_equal_single_tier(tr, C, tier):
    """Invariant: native and LMCache leave the GPU state to the request stream (load = recompute)."""
    b, N, reqs = tr
    kw = {"policy": "arc"} if tier == "native-arc" else {}
    if tier == "lmcache":
        kw = {"chunk_tokens": b}
    e = make_tiered(tier.split("-")[0], gpu_blocks=N, host_capacity=C, block_size=b, **kw)
    res = replay(e, reqs)
    T = np.array([q.prompt_tokens for q in reqs])
    off = np.cumsum([0] + [len(q.block_hashes) for q in reqs])
    h = np.array([x for q in reqs for x in q.block_hashes], np.int64)
    single = simulate_block(T, off, h, N=N, block_size=b)
    assert [o.gpu_hit_tokens for o in res.outcomes] == list(single.hit_blocks * b)
    tot = np.array([o.hit_tokens for o in res.outcomes])
    assert np.all(tot <= T) and np.all(tot >= single.hit_blocks * b)


@_S
@given(traces(), st.integers(0, 12))
def test_hold_mode_runs_and_bounds(tr, C):
    """With concurrency (hold), the tiers stay consistent: total hit <= T, computed >= 1, capacity respected."""
    b, N, reqs = tr
    n = len(reqs)
    times = np.arange(n, dtype=float)
    hold = np.full(n, 2.5)
    for tier in ("native", "lmcache", "simple"):
        kw = {"chunk_tokens": b} if tier == "lmcache" else {}
        e = make_tiered(tier, gpu_blocks=N, host_capacity=max(C, 1), block_size=b, **kw)
        res = replay(e, reqs, times=times, hold=hold)
        for q, o in zip(reqs, res.outcomes, strict=True):
            if o is None:
                continue
            assert o.hit_tokens <= q.prompt_tokens and o.computed_tokens >= 1
        assert e.host.resident() <= max(C, 1)
