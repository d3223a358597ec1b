"""Tests of the all-capacity block curve (kvhit.sim.vllm.curve) against simulate_block."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.sim.vllm.block import (
    block_hit_ratio,
    request_hit_rate,
    simulate_block,
    token_hit_ratio,
)
from kvhit.sim.vllm.blockids import hashes_from_block_counts, hashes_from_token_ids
from kvhit.sim.vllm.curve import (
    NEVER,
    BlockCurveError,
    block_curve,
    block_curve_from_thresholds,
    block_hit_thresholds,
)
from kvhit.workload.requests import kv_tokens

ENGINES = ["vllm", "vllm-0.23"]


def _stream(T, conv, b, shared=0, resp=None):
    T = np.asarray(T, np.int64)
    L = T if resp is None else kv_tokens(T, resp)
    return hashes_from_block_counts(np.asarray(conv), L // b, shared_prefix_blocks=shared)


def _kw(tr, engine):
    return {
        "block_size": tr["b"],
        "engine": engine,
        "colocated": tr["resp"] is not None,
        "response_tokens": tr["resp"],
    }


# ------------------------------------------------------------------------------------------------
# hand-worked cases
# ------------------------------------------------------------------------------------------------


def test_engine_orders_thresholds():
    # b=4: A (5 tok: a0 + partial), B (9 tok: b0 b1 + partial), C (3 tok: partial), A2 (9 tok: a0 a1).
    # vLLM>=0.24: a0 has 2 entries above it (b1, b0) -> rank 3, plus the head partial of C -> N* = 4.
    # vLLM<=0.23: partial blocks are LRU entries too: above a0 are B's partial, b1, b0, C's partial -> 5.
    T, conv = [5, 9, 3, 9], [0, 1, 2, 0]
    off, h = _stream(T, conv, 4)
    new = block_hit_thresholds(T, off, h, block_size=4, engine="vllm")
    old = block_hit_thresholds(T, off, h, block_size=4, engine="vllm-0.23")
    assert new.offsets.tolist() == [0, 1, 3, 3, 5]
    assert new.thresholds.tolist() == [NEVER, NEVER, NEVER, 4, NEVER]
    assert old.thresholds.tolist() == [NEVER, NEVER, NEVER, 5, NEVER]
    for N in range(3, 8):
        for eng, thr in (("vllm", new), ("vllm-0.23", old)):
            res = simulate_block(np.array(T), off, h, N=N, block_size=4, engine=eng)
            assert np.array_equal(res.hit_blocks, thr.hit_blocks(N)), (eng, N)


@pytest.mark.parametrize("engine", ENGINES)
def test_capped_duplicate_keeps_its_old_copy(engine):
    # b=1. c0; a0; a0 again (T=1: hit cap 0, a0 is recomputed into a second block, the old copy stays);
    # then c0 c1 (T=2). At N=2 the duplicate evicted c0 (the stack model counts both copies of a0).
    T, conv = [1, 1, 1, 2], [0, 1, 1, 0]
    off, h = _stream(T, conv, 1)
    thr = block_hit_thresholds(T, off, h, block_size=1, engine=engine)
    assert thr.thresholds[thr.offsets[3]] == 3
    assert thr.n_ambiguous_events == 0
    for N in (2, 3):
        res = simulate_block(np.array(T), off, h, N=N, block_size=1, engine=engine)
        assert res.hit_blocks[3] == (1 if N == 3 else 0)
        assert np.array_equal(res.hit_blocks, thr.hit_blocks(N))


def test_ambiguous_first_inserted_copy_documented_bound():
    """The one rule that breaks the stack property: ``get_one_block`` returns the *first-inserted* copy.

    b=1: A = a0 a1 a2; B = b0 b1 b2; A' = a0 (T=1, capped: a second copy of a0); A'' = a0 a1 (hits a0);
    B' = b0 b1. At N=3 the old copy of a0 is gone when A'' hits, so vLLM touches the duplicate and the old
    position holds nothing; the stack model (which moves the first-inserted copy, right for N where it is
    present) keeps a stale entry there and loses b0 for B'. The model flags N in [1, 5) as ambiguous, is
    never above the simulation there (proved one-sided), and block_curve's default fallback simulates it.
    """
    T, conv = [3, 3, 1, 2, 2], [0, 1, 0, 0, 1]
    off, h = _stream(T, conv, 1)
    thr = block_hit_thresholds(T, off, h, block_size=1)
    assert thr.ambiguous.tolist() == [[1, 5]]
    assert thr.exact([3, 4, 5, 6]).tolist() == [False, False, True, True]
    res = simulate_block(np.array(T), off, h, N=3, block_size=1)
    assert res.hit_blocks.tolist() == [0, 0, 0, 1, 1]
    assert thr.hit_blocks(3).tolist() == [0, 0, 0, 1, 0]
    cur = block_curve(T, off, h, block_size=1, Ns=[3, 6])
    assert cur["simulated"].tolist() == [True, False]
    assert cur["hit_blocks"][0] == 2
    stack = block_curve(T, off, h, block_size=1, Ns=[3, 6], fallback="stack")
    assert stack["hit_blocks"][0] == 1 and not stack["exact"][0]
    nan = block_curve(T, off, h, block_size=1, Ns=[3, 6], fallback="nan")
    assert np.isnan(nan["token_hit_ratio"][0]) and not np.isnan(nan["token_hit_ratio"][1])


def test_rejection_region_falls_back_to_simulation():
    # b=1: the 3-block request is rejected at N=2 (inclusion counterexample of test_sim_block).
    T, conv = [1, 3, 2], [0, 1, 0]
    off, h = _stream(T, conv, 1)
    thr = block_hit_thresholds(T, off, h, block_size=1)
    assert thr.min_exact_N == 3
    cur = block_curve(T, off, h, block_size=1, Ns=[2, 3])
    assert cur["simulated"].tolist() == [True, False]
    for k, N in enumerate([2, 3]):
        res = simulate_block(np.array(T), off, h, N=N, block_size=1)
        assert cur["token_hit_ratio"][k] == pytest.approx(token_hit_ratio(res))
        assert cur["prompt_tokens"][k] == int(np.array(T)[~res.rejected].sum())


def test_token_id_stream_and_chain_check():
    rng = np.random.default_rng(1)
    toks = [rng.integers(0, 1000, 300) for _ in range(3)]
    lens = [5, 30, 12, 47, 33, 90, 64, 100, 32, 64]
    cid = [0, 0, 1, 1, 2, 0, 2, 1, 0, 2]
    off, h = hashes_from_token_ids([toks[c][:n] for c, n in zip(cid, lens, strict=True)], 8)
    T = np.array(lens)
    thr = block_hit_thresholds(T, off, h, block_size=8)
    for N in range(thr.min_exact_N, 40):
        assert np.array_equal(simulate_block(T, off, h, N=N, block_size=8).hit_blocks, thr.hit_blocks(N))
    bad = h.copy()
    bad[1] = bad[0]  # the same id twice in a row: not a chained stream
    with pytest.raises(BlockCurveError, match="chained"):
        block_hit_thresholds(T, off, bad, block_size=8)
    bad2 = np.concatenate([h, [h[off[1] + 1]]])  # a known block-1 id reused as a block-0 id (new parent)
    off2 = np.concatenate([off, [off[-1] + 1]])
    with pytest.raises(BlockCurveError, match="request 10"):
        block_hit_thresholds(np.r_[T, 8], off2, bad2, block_size=8)


def test_input_validation():
    T = np.array([10, 18])
    off, h = _stream(T, [0, 0], 4)
    with pytest.raises(BlockCurveError, match="hashes"):
        block_hit_thresholds(T, off, h, block_size=8)
    with pytest.raises(BlockCurveError, match="engine"):
        block_hit_thresholds(T, off, h, block_size=4, engine="sglang")
    with pytest.raises(BlockCurveError, match="block_size"):
        block_hit_thresholds(T, off, h, block_size=0)
    with pytest.raises(BlockCurveError, match="prompt_tokens"):
        block_hit_thresholds(np.array([0, 18]), off, h, block_size=4)
    with pytest.raises(BlockCurveError, match="response_tokens"):
        block_hit_thresholds(T, off, h, block_size=4, colocated=True)
    with pytest.raises(BlockCurveError, match="hash_offsets"):
        block_hit_thresholds(T, off[:-1], h, block_size=4)
    with pytest.raises(BlockCurveError, match="Ns"):
        block_curve(T, off, h, block_size=4, Ns=[0, 4])
    with pytest.raises(BlockCurveError, match="Ns"):
        block_curve(T, off, h, block_size=4, Ns=[1.5])
    with pytest.raises(BlockCurveError, match="mask"):
        block_curve(T, off, h, block_size=4, Ns=[8], mask=np.ones(3, bool))
    with pytest.raises(BlockCurveError, match="fallback"):
        block_curve(T, off, h, block_size=4, Ns=[8], fallback="guess")
    assert isinstance(BlockCurveError("x"), ValueError)


def test_empty_trace():
    thr = block_hit_thresholds(np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64), block_size=4)
    cur = block_curve_from_thresholds(thr, [1, 2])
    assert cur["hit_blocks"].tolist() == [0, 0] and np.isnan(cur["token_hit_ratio"]).all()


# ------------------------------------------------------------------------------------------------
# properties against simulate_block at every capacity
# ------------------------------------------------------------------------------------------------


@st.composite
def traces(draw, max_n=40, allow_dups=True):
    b = draw(st.integers(1, 4))
    n = draw(st.integers(1, max_n))
    nconv = draw(st.integers(1, 5))
    conv = draw(st.lists(st.integers(0, nconv - 1), min_size=n, max_size=n))
    colocated = draw(st.booleans())
    shared = draw(st.integers(0, 2)) if allow_dups else 0
    p_mult = draw(st.sampled_from([0.0, 0.5, 1.0]))
    p_rep = draw(st.sampled_from([0.0, 0.3])) if allow_dups else 0.0
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    last: dict[int, tuple[int, int]] = {}
    T, R = [], []
    for c in conv:
        y = int(rng.integers(0, 3 * b + 1))
        if c in last and rng.random() < p_rep:
            t = last[c][0]  # the same prompt again (a retry): capped duplicates
        else:
            t = last.get(c, (0, 0))[1] + int(rng.integers(1, 3 * b + 1))
            if rng.random() < p_mult:
                t = -(-t // b) * b  # an exact multiple of the block size (hit cap)
        T.append(t)
        R.append(y)
        last[c] = (t, t + (y if colocated else int(rng.integers(0, 2 * b + 1))))
    T = np.array(T, np.int64)
    resp = np.array(R, np.int64) if colocated else None
    off, h = _stream(T, conv, b, shared, resp)
    return {"T": T, "resp": resp, "off": off, "h": h, "b": b}


def _footprint(tr):
    L = tr["T"] if tr["resp"] is None else kv_tokens(tr["T"], tr["resp"])
    return int((-(-L // tr["b"])).sum()) + 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tr=traces(), engine=st.sampled_from(ENGINES))
def test_equal_to_simulation_at_every_certified_capacity(tr, engine):
    """Certified capacities: identical hit blocks per request; the others: never above (one-sided)."""
    kw = _kw(tr, engine)
    thr = block_hit_thresholds(tr["T"], tr["off"], tr["h"], **kw)
    for N in range(1, _footprint(tr) + 1):
        res = simulate_block(tr["T"], tr["off"], tr["h"], N=N, **kw)
        stack = thr.hit_blocks(N)
        if thr.exact(N)[0]:
            assert np.array_equal(stack, res.hit_blocks), N
        elif N >= thr.min_exact_N:
            assert np.all(stack <= res.hit_blocks), N
        else:
            assert N < int(np.max(-(-(tr["T"] if tr["resp"] is None else kv_tokens(tr["T"], tr["resp"])) // tr["b"])))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tr=traces(allow_dups=False), engine=st.sampled_from(ENGINES))
def test_growing_conversations_are_exact_everywhere(tr, engine):
    """No shared prefix, no retried prompt: no duplicate is ever hit, so every N >= N_min is certified."""
    kw = _kw(tr, engine)
    thr = block_hit_thresholds(tr["T"], tr["off"], tr["h"], **kw)
    assert thr.n_ambiguous_events == 0
    Ns = np.arange(thr.min_exact_N, _footprint(tr) + 1)
    assert thr.exact(Ns).all()
    cur = block_curve(tr["T"], tr["off"], tr["h"], Ns=Ns, **kw)
    assert not cur["simulated"].any()
    for k, N in enumerate(Ns):
        res = simulate_block(tr["T"], tr["off"], tr["h"], N=int(N), **kw)
        assert cur["hit_blocks"][k] == res.hit_blocks.sum()
        assert cur["token_hit_ratio"][k] == pytest.approx(token_hit_ratio(res), nan_ok=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tr=traces(max_n=25), engine=st.sampled_from(ENGINES), seed=st.integers(0, 2**16))
def test_block_curve_default_is_exact_everywhere(tr, engine, seed):
    """With fallback="simulate" every metric equals the simulation's at every N, rejections included."""
    kw = _kw(tr, engine)
    mask = np.random.default_rng(seed).random(tr["T"].size) < 0.7
    Ns = np.arange(1, _footprint(tr) + 1)
    cur = block_curve(tr["T"], tr["off"], tr["h"], Ns=Ns[::-1], mask=mask, **kw)
    for k, N in enumerate(Ns[::-1]):
        res = simulate_block(tr["T"], tr["off"], tr["h"], N=int(N), **kw)
        m = mask & ~res.rejected
        assert cur["hit_blocks"][k] == res.hit_blocks[m].sum()
        assert cur["token_hit_ratio"][k] == pytest.approx(token_hit_ratio(res, mask), nan_ok=True)
        assert cur["block_hit_ratio"][k] == pytest.approx(block_hit_ratio(res, mask), nan_ok=True)
        assert cur["request_hit_rate"][k] == pytest.approx(request_hit_rate(res, mask), nan_ok=True)
        assert cur["full_hit_rate"][k] == pytest.approx(request_hit_rate(res, mask, full=True), nan_ok=True)


# ------------------------------------------------------------------------------------------------
# realistic synthetic multi-turn trace
# ------------------------------------------------------------------------------------------------


def _multiturn(seed=0, n_conv=400, b=16, shared=8):
    rng = np.random.default_rng(seed)
    M = rng.geometric(1 / 4.5, n_conv)
    conv = np.repeat(np.arange(n_conv), M)
    first = np.r_[0, np.cumsum(M)[:-1]]
    X = rng.geometric(1 / 150, conv.size)
    Y = rng.geometric(1 / 250, conv.size)
    inc = X.copy()
    inc[1:] += Y[:-1]
    inc[first] = X[first] + shared * b  # every conversation starts with the shared system prompt
    cs = np.cumsum(inc)
    T = cs - np.repeat(cs[first] - inc[first], M)
    t = np.repeat(np.cumsum(rng.exponential(1.0, n_conv)), M)  # Poisson conversation starts
    gaps = rng.exponential(60.0, conv.size)
    gaps[first] = 0
    gs = np.cumsum(gaps)
    t = t + gs - np.repeat(gs[first], M)
    order = np.argsort(t, kind="stable")
    conv, T = conv[order], T[order]
    off, h = hashes_from_block_counts(conv, T // b, shared_prefix_blocks=shared)
    return T, off, h, b


@pytest.mark.parametrize("engine", ENGINES)
def test_realistic_multiturn_trace_30_capacities(engine):
    T, off, h, b = _multiturn()
    thr = block_hit_thresholds(T, off, h, block_size=b, engine=engine)
    finite = thr.thresholds[thr.thresholds < NEVER]
    Ns = np.unique(np.linspace(thr.min_exact_N, finite.max() + 5, 30).astype(np.int64))
    assert Ns.size >= 20
    mask = np.arange(T.size) >= T.size // 5  # warm-up excluded
    cur = block_curve(T, off, h, block_size=b, Ns=Ns, engine=engine, mask=mask, fallback="stack")
    assert cur["exact"].all()
    for k, N in enumerate(Ns):
        res = simulate_block(T, off, h, N=int(N), block_size=b, engine=engine)
        assert not res.rejected.any()
        assert np.array_equal(res.hit_blocks, thr.hit_blocks(int(N)))
        assert cur["token_hit_ratio"][k] == pytest.approx(token_hit_ratio(res, mask), rel=1e-12)
        assert cur["block_hit_ratio"][k] == pytest.approx(block_hit_ratio(res, mask), rel=1e-12)
        assert cur["request_hit_rate"][k] == pytest.approx(request_hit_rate(res, mask), rel=1e-12)
    h_curve = cur["block_hit_ratio"]
    assert np.all(np.diff(h_curve) >= 0) and h_curve[-1] > h_curve[0]
