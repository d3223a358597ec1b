"""Tests of the vLLM v1 block-level prefix-cache simulator (kvhit.sim.vllm.block) and its streams."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.sim.vllm.block import (
    BlockSimError,
    block_hit_ratio,
    partial_hit_histogram,
    request_hit_rate,
    simulate_block,
    token_hit_ratio,
)
from kvhit.sim.vllm.blockids import block_id, hashes_from_block_counts, hashes_from_token_ids
from kvhit.sim.vllm.reference import simulate_block_reference
from kvhit.workload.requests import kv_tokens

ENGINES = ["vllm", "vllm-0.23"]


def _sim(T, conv, b, N, engine="vllm", shared=0, **kw):
    T = np.asarray(T, np.int64)
    off, h = hashes_from_block_counts(np.asarray(conv), T // b, shared_prefix_blocks=shared)
    return simulate_block(T, off, h, N=N, block_size=b, engine=engine, **kw)


# ------------------------------------------------------------------------------------------------
# hand-worked cases
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_turn2_hits_turn1_full_blocks(engine):
    # b=4: turn 1 has 10 tokens = 2 full blocks + partial; turn 2 (18 tokens) hits the 2 full blocks.
    r = _sim([10, 18], [0, 0], b=4, N=16, engine=engine)
    assert r.hit_blocks.tolist() == [0, 2]
    assert r.new_blocks.tolist() == [3, 5 - 2]
    assert r.evictions == 0
    assert token_hit_ratio(r) == pytest.approx(8 / 28)
    assert block_hit_ratio(r) == pytest.approx(2 / 8)


@pytest.mark.parametrize("engine", ENGINES)
def test_tail_first_eviction_keeps_a_prefix(engine):
    # N=6, b=4. A1 (17 tok) = a0..a3 + partial; B (9 tok) needs 3 blocks and evicts only a3 (tail
    # first), so A2 (21 tok, a0..a4) still hits the prefix a0 a1 a2.
    r = _sim([17, 9, 21], [0, 1, 0], b=4, N=6, engine=engine)
    assert r.hit_blocks.tolist() == [0, 0, 3]
    # B evicts a3; A2 then pops B's partial block and b1, b0 (2 more evictions)
    assert r.evictions == 3


def test_shared_system_prompt_hits_across_conversations():
    # 2 shared blocks (system prompt) + conversation-specific content: a new conversation hits them.
    r = _sim([13, 14, 11], [0, 1, 2], b=4, N=32, shared=2)
    assert r.hit_blocks.tolist() == [0, 2, 2]
    r0 = _sim([13, 14, 11], [0, 1, 2], b=4, N=32, shared=0)
    assert r0.hit_blocks.tolist() == [0, 0, 0]


@pytest.mark.parametrize("engine", ENGINES)
def test_hit_cap_exact_multiple_of_block_size(engine):
    # 12 tokens = 3 full blocks; the same prompt again may only hit (12-1)//4 = 2 blocks: the last
    # block is recomputed into a new block that duplicates the cached hash.
    r = _sim([12, 12, 12], [0, 0, 0], b=4, N=16, engine=engine)
    assert r.hit_blocks.tolist() == [0, 2, 2]
    assert r.new_blocks.tolist() == [3, 1, 1]
    # one more token: the third block can hit
    r = _sim([12, 13], [0, 0], b=4, N=16, engine=engine)
    assert r.hit_blocks.tolist() == [0, 3]
    # prompt shorter than a block: nothing can hit
    r = _sim([3, 3], [0, 0], b=4, N=16, engine=engine)
    assert r.hit_blocks.tolist() == [0, 0]


def test_engine_orders_differ():
    # N=4, b=4. A (5 tok: a0 + partial), B (9 tok: b0 b1 + partial), C (3 tok: one partial block),
    # A2 (9 tok: a0 a1). After B, vLLM>=0.24 keeps B's partial block at the queue head, so C reuses it;
    # vLLM<=0.23 appended it at the tail, so C pops the LRU hashed block a0 and A2 misses.
    T, conv = [5, 9, 3, 9], [0, 1, 2, 0]
    new = _sim(T, conv, b=4, N=4, engine="vllm")
    old = _sim(T, conv, b=4, N=4, engine="vllm-0.23")
    assert new.hit_blocks.tolist() == [0, 0, 0, 1]
    assert old.hit_blocks.tolist() == [0, 0, 0, 0]
    assert new.evictions < old.evictions or new.hit_blocks.sum() > old.hit_blocks.sum()


def test_hold_protects_in_flight_blocks_and_waits_fifo():
    # b=4, N=8. r0 (10 tok, 3 blocks) holds [0, 2.5); r1 (14 tok) hits r0's 2 full blocks while they are
    # in flight (ref_cnt 2); r2 takes 3 fresh blocks; r3 (22 tok, 6 blocks, 3 hits) must wait until
    # r2 finishes at 4.5 (r1 finishing at 3.5 frees only 5 blocks).
    T = np.array([10, 14, 9, 22])
    off, h = hashes_from_block_counts(np.array([0, 0, 1, 0]), T // 4)
    r = simulate_block(T, off, h, N=8, block_size=4, times=np.arange(4.0), hold=np.full(4, 2.5))
    assert r.hit_blocks.tolist() == [0, 2, 0, 3]
    assert r.wait.tolist() == [0.0, 0.0, 0.0, 1.5]
    assert r.peak_blocks_in_use == 8
    # instantaneous: no waiting, nothing held
    r = simulate_block(T, off, h, N=8, block_size=4)
    assert r.wait.tolist() == [0.0] * 4


def test_rejected_requests():
    r = _sim([40, 8, 9], [0, 1, 1], b=4, N=5)
    assert r.rejected.tolist() == [True, False, False]
    assert r.n_rejected == 1
    assert np.isnan(r.wait[0]) and r.hit_blocks[0] == 0
    assert r.hit_blocks.tolist() == [0, 0, 2]
    r = _sim([40, 8], [0, 1], b=4, N=5, times=np.array([0.0, 1.0]), hold=np.array([1.0, 1.0]))
    assert r.rejected.tolist() == [True, False]


def test_colocated_keeps_response_blocks():
    # b=4: turn 1 prompt 6 + 6 generated tokens: vLLM keeps the KV of 6 + 6 − 1 = 11 tokens (the last sampled token
    # is never fed back), 2 full blocks hashed in colocated mode; turn 2 (history 12 + 5 new = 17 tokens) hits 2
    # blocks, not 3. The same boundary (T + m = 3 blocks) on a live vLLM 0.32.0 server at b = 32, 64 and 128:
    # the next turn hits 2 blocks (live/facts.py, `make live`). PD mode hits only 1.
    T = np.array([6, 17])
    resp = np.array([6, 4])
    off, h = hashes_from_block_counts(np.array([0, 0]), (T + resp - 1) // 4)
    r = simulate_block(T, off, h, N=16, block_size=4, colocated=True, response_tokens=resp)
    assert r.hit_blocks.tolist() == [0, 2]
    assert r.new_blocks.tolist() == [3, 5 - 2]
    rp = _sim([6, 17], [0, 0], b=4, N=16)
    assert rp.hit_blocks.tolist() == [0, 1]
    # one generated token more completes the third block: T + m − 1 = 12
    resp2 = np.array([7, 4])
    off, h = hashes_from_block_counts(np.array([0, 0]), (np.array([6, 18]) + resp2 - 1) // 4)
    r2 = simulate_block(np.array([6, 18]), off, h, N=16, block_size=4, colocated=True, response_tokens=resp2)
    assert r2.hit_blocks.tolist() == [0, 3]


def test_metric_helpers():
    r = _sim([10, 18, 9, 30], [0, 0, 1, 0], b=4, N=64)
    # hits: 0, 2, 0, 4 (r3: 29//4=7 cap, 4 full blocks cached from r1)
    assert r.hit_blocks.tolist() == [0, 2, 0, 4]
    m = np.array([False, True, True, True])
    assert token_hit_ratio(r, m) == pytest.approx((2 + 4) * 4 / (18 + 9 + 30))
    assert block_hit_ratio(r, m) == pytest.approx(6 / (5 + 3 + 8))
    assert request_hit_rate(r, m) == pytest.approx(2 / 3)
    assert request_hit_rate(r, m, full=True) == pytest.approx(0.0)
    hist = partial_hit_histogram(r, m, bins=4)
    assert hist["n_miss"] == 1 and hist["n_full"] == 0 and hist["n_partial"] == 2
    assert hist["counts"].sum() == 3
    with pytest.raises(BlockSimError, match="mask"):
        token_hit_ratio(r, np.ones(3, bool))


def test_input_validation():
    T = np.array([10, 18])
    off, h = hashes_from_block_counts(np.array([0, 0]), T // 4)
    with pytest.raises(BlockSimError, match="hashes"):
        simulate_block(T, off, h, N=8, block_size=8)  # wrong block size -> wrong hash count
    with pytest.raises(BlockSimError, match="engine"):
        simulate_block(T, off, h, N=8, block_size=4, engine="sglang")
    with pytest.raises(BlockSimError, match="times"):
        simulate_block(T, off, h, N=8, block_size=4, times=np.array([1.0, 0.0]), hold=np.ones(2))
    with pytest.raises(BlockSimError, match="hold"):
        simulate_block(T, off, h, N=8, block_size=4, times=np.zeros(2), hold=np.array([1.0, -1.0]))
    with pytest.raises(BlockSimError, match="response_tokens"):
        simulate_block(T, off, h, N=8, block_size=4, colocated=True)
    with pytest.raises(BlockSimError, match="prompt_tokens"):
        simulate_block(np.array([0, 18]), off, h, N=8, block_size=4)
    with pytest.raises(BlockSimError, match="N"):
        simulate_block(T, off, h, N=0, block_size=4)
    with pytest.raises(BlockSimError, match="hash_offsets"):
        simulate_block(T, off[:-1], h, N=8, block_size=4)


# ------------------------------------------------------------------------------------------------
# block-id streams
# ------------------------------------------------------------------------------------------------


def test_block_count_ids_injective_and_shared():
    off, h = hashes_from_block_counts(np.array([0, 1, 0]), np.array([3, 4, 5]), shared_prefix_blocks=2)
    assert off.tolist() == [0, 3, 7, 12]
    assert h[0] == h[3] and h[1] == h[4]  # shared system prompt
    assert h[2] != h[5]
    assert h[7:10].tolist() == h[0:3].tolist()  # same conversation: same prefix ids
    assert int(h[0]) == block_id((1 << 40) - 1, 0)
    big = hashes_from_block_counts(np.arange(2000), np.full(2000, 50))[1]
    assert np.unique(big).size == big.size
    with pytest.raises(BlockSimError, match="conversation_ids"):
        hashes_from_block_counts(np.array([-1]), np.array([1]))


def test_token_hashes_chained_prefix_and_deterministic():
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 50_000, 40)
    off, h = hashes_from_token_ids([toks[:10], toks[:17], toks, toks[:3]], 4)
    assert off.tolist() == [0, 2, 6, 16, 16]
    assert h[0:2].tolist() == h[2:4].tolist() == h[6:8].tolist()
    # a change in block 1 changes every later hash, not the earlier ones
    t2 = toks.copy()
    t2[5] += 1
    _, h2 = hashes_from_token_ids([t2], 4)
    assert h2[0] == h[6] and np.all(h2[1:] != h[7:16])
    # extra_key separates otherwise identical prompts
    _, h3 = hashes_from_token_ids([toks], 4, extra_key=7)
    assert np.all(h3 != h[6:16])
    # CSR input gives the same answer
    _, h4 = hashes_from_token_ids((np.array([0, 40]), toks), 4)
    assert np.array_equal(h4, h[6:16])
    # identical across processes (no Python hash())
    code = (
        "import numpy as np; from kvhit.sim.vllm.blockids import hashes_from_token_ids as f;"
        "print(int(f([np.arange(64)], 16, extra_key=3)[1][-1]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert int(out.stdout.strip()) == int(hashes_from_token_ids([np.arange(64)], 16, extra_key=3)[1][-1])


def test_token_stream_simulation_matches_block_count_stream():
    rng = np.random.default_rng(1)
    convs = [rng.integers(0, 1000, 200) for _ in range(3)]
    lens = [5, 30, 12, 47, 33, 90, 64, 100]
    cid = [0, 0, 1, 1, 2, 0, 2, 1]
    T = np.array(lens)
    o1, h1 = hashes_from_token_ids([convs[c][:n] for c, n in zip(cid, lens, strict=True)], 8)
    o2, h2 = hashes_from_block_counts(np.array(cid), T // 8)
    a = simulate_block(T, o1, h1, N=12, block_size=8)
    b = simulate_block(T, o2, h2, N=12, block_size=8)
    assert np.array_equal(a.hit_blocks, b.hit_blocks) and a.evictions == b.evictions


# ------------------------------------------------------------------------------------------------
# properties: numba == reference, inclusion, capacity
# ------------------------------------------------------------------------------------------------


@st.composite
def traces(draw, max_n=40):
    b = draw(st.integers(1, 4))
    n = draw(st.integers(1, max_n))
    nconv = draw(st.integers(1, 5))
    conv = draw(st.lists(st.integers(0, nconv - 1), min_size=n, max_size=n))
    inc = draw(st.lists(st.integers(1, 3 * b), min_size=n, max_size=n))
    resp = draw(st.lists(st.integers(0, 3 * b), min_size=n, max_size=n))
    colocated = draw(st.booleans())
    shared = draw(st.integers(0, 2))
    last: dict[int, int] = {}
    T = []
    for c, d, y in zip(conv, inc, resp, strict=True):
        t = last.get(c, 0) + d
        T.append(t)
        last[c] = t + (y if colocated else draw(st.integers(0, 2 * b)))
    T = np.array(T, np.int64)
    resp = np.array(resp, np.int64)
    L = kv_tokens(T, resp) if colocated else T  # prompt + first m − 1 generated tokens
    off, h = hashes_from_block_counts(np.array(conv), L // b, shared_prefix_blocks=shared)
    return {"T": T, "resp": resp if colocated else None, "colocated": colocated, "off": off, "h": h, "b": b}


def _kw(tr, N, engine):
    return {
        "N": N,
        "block_size": tr["b"],
        "engine": engine,
        "colocated": tr["colocated"],
        "response_tokens": tr["resp"],
    }


def _assert_same(res, ref, ops=True):
    assert np.array_equal(res.hit_blocks, ref["hit_blocks"])
    assert np.array_equal(res.new_blocks, ref["new_blocks"])
    assert np.array_equal(res.rejected, ref["rejected"])
    np.testing.assert_allclose(res.wait, ref["wait"], equal_nan=True)
    assert res.evictions == ref["evictions"]
    assert res.peak_blocks_in_use == ref["peak_blocks_in_use"]
    assert res.n_rejected == ref["n_rejected"]
    if ops:
        assert res.block_ops == ref["block_ops"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tr=traces(), N=st.integers(1, 30), engine=st.sampled_from(ENGINES))
def test_numba_equals_reference_instantaneous(tr, N, engine):
    res = simulate_block(tr["T"], tr["off"], tr["h"], **_kw(tr, N, engine))
    ref = simulate_block_reference(tr["T"], tr["off"], tr["h"], **_kw(tr, N, engine))
    _assert_same(res, ref)
    assert res.peak_blocks_in_use <= N


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tr=traces(),
    N=st.integers(1, 30),
    engine=st.sampled_from(ENGINES),
    seed=st.integers(0, 2**32 - 1),
    p_zero=st.sampled_from([0.0, 0.3]),
)
def test_numba_equals_reference_with_holds(tr, N, engine, seed, p_zero):
    rng = np.random.default_rng(seed)
    n = tr["T"].size
    times = np.sort(np.round(rng.uniform(0, 10, n), 1))  # rounding creates ties
    hold = np.round(rng.exponential(2.0, n), 1) * (rng.random(n) >= p_zero)
    kw = _kw(tr, N, engine)
    res = simulate_block(tr["T"], tr["off"], tr["h"], times=times, hold=hold, **kw)
    ref = simulate_block_reference(tr["T"], tr["off"], tr["h"], times=times, hold=hold, **kw)
    _assert_same(res, ref, ops=False)
    assert res.peak_blocks_in_use <= N
    ok = ~res.rejected
    assert np.all(res.wait[ok] >= 0)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tr=traces(max_n=60), N=st.integers(1, 40), engine=st.sampled_from(ENGINES))
def test_lru_inclusion_without_in_flight_blocks(tr, N, engine):
    """Instantaneous requests: every request hits at least as many blocks with N + 1 blocks as with N.

    Holds empirically for both engine orders, the hit cap and duplicate hashes, *provided no request
    is rejected*. Rejection breaks it (documented counterexample, checked below): b=1, N=2, requests
    (conversation, T) = (X, 1), (Y, 3), (X, 2). With N=2 the Y request (3 blocks) is rejected and X's
    block survives (hit 1); with N=3 it runs and evicts it (hit 0).
    """
    r1 = simulate_block(tr["T"], tr["off"], tr["h"], **_kw(tr, N, engine))
    if r1.n_rejected:
        return
    r2 = simulate_block(tr["T"], tr["off"], tr["h"], **_kw(tr, N + 1, engine))
    assert np.all(r1.hit_blocks <= r2.hit_blocks)
    assert r1.peak_blocks_in_use <= N


@pytest.mark.parametrize("engine", ENGINES)
def test_inclusion_counterexample_with_rejection(engine):
    r2 = _sim([1, 3, 2], [0, 1, 0], b=1, N=2, engine=engine)
    r3 = _sim([1, 3, 2], [0, 1, 0], b=1, N=3, engine=engine)
    assert r2.rejected.tolist() == [False, True, False]
    assert r2.hit_blocks[2] == 1 and r3.hit_blocks[2] == 0


def test_capacity_never_exceeded_under_heavy_load():
    rng = np.random.default_rng(3)
    n = 3000
    conv = rng.integers(0, 200, n)
    T = np.zeros(n, np.int64)
    last: dict[int, int] = {}
    for r, c in enumerate(conv):
        T[r] = last.get(int(c), 0) + int(rng.integers(1, 200))
        last[int(c)] = int(T[r]) + int(rng.integers(0, 100))
    off, h = hashes_from_block_counts(conv, T // 16)
    times = np.sort(rng.uniform(0, 100, n))
    hold = rng.exponential(5.0, n)
    N = 400
    r = simulate_block(T, off, h, N=N, block_size=16, times=times, hold=hold)
    assert r.peak_blocks_in_use <= N
    assert r.peak_blocks_in_use >= 0.9 * N  # the load saturates the pool
    assert np.nanmax(r.wait) > 0
    ok = ~r.rejected
    assert np.all(r.hit_blocks[ok] + r.new_blocks[ok] == -(-T[ok] // 16))
    assert np.all(r.hit_blocks[ok] <= (T[ok] - 1) // 16)
