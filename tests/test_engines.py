"""Step-wise engine API (kvhit.sim.engine): equal, request by request, to the compiled simulators."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.sim.engine import Engine, Request, replay, requests_from_stream
from kvhit.sim.registry import make_engine
from kvhit.sim.vllm.block import simulate_block
from kvhit.sim.vllm.blockids import hashes_from_block_counts
from kvhit.sim.vllm.engine import VllmEngine
from kvhit.workload.requests import kv_tokens

ENGINES = ["vllm", "vllm-0.23"]


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


def _both(tr, N, engine, times=None, hold=None):
    kw = {"N": N, "block_size": tr["b"], "engine": engine, "colocated": tr["colocated"]}
    res = simulate_block(tr["T"], tr["off"], tr["h"], response_tokens=tr["resp"], times=times, hold=hold, **kw)
    eng = VllmEngine(N, block_size=tr["b"], engine=engine, colocated=tr["colocated"])
    reqs = requests_from_stream(tr["T"], tr["off"], tr["h"], tr["resp"])
    rep = replay(eng, reqs, times=times, hold=hold)
    return res, eng, rep


def _assert_same(res, eng, rep):
    assert np.array_equal(rep.rejected, res.rejected)
    assert np.array_equal(rep.hit_units, np.where(res.rejected, 0, res.hit_blocks))
    assert np.array_equal(rep.new_units, np.where(res.rejected, 0, res.new_blocks))
    np.testing.assert_allclose(rep.wait, res.wait, equal_nan=True)
    assert rep.evicted_units == res.evictions == eng.evictions
    assert rep.peak_in_use == res.peak_blocks_in_use


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tr=traces(), N=st.integers(1, 30), engine=st.sampled_from(ENGINES))
def test_stepwise_equals_compiled_instantaneous(tr, N, engine):
    res, eng, rep = _both(tr, N, engine)
    _assert_same(res, eng, rep)
    assert eng.in_use() == 0 and len(eng.free_queue_order()) == N


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tr=traces(), N=st.integers(1, 30), engine=st.sampled_from(ENGINES), seed=st.integers(0, 2**32 - 1))
def test_stepwise_equals_compiled_with_holds(tr, N, engine, seed):
    rng = np.random.default_rng(seed)
    n = tr["T"].size
    times = np.sort(np.round(rng.uniform(0, 10, n), 1))
    hold = np.round(rng.exponential(2.0, n), 1) * (rng.random(n) >= 0.3)
    res, eng, rep = _both(tr, N, engine, times, hold)
    _assert_same(res, eng, rep)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tr=traces(), N=st.integers(1, 30), engine=st.sampled_from(ENGINES))
def test_evicted_hashes_leave_the_cache_and_order_is_consistent(tr, N, engine):
    eng = VllmEngine(N, block_size=tr["b"], engine=engine, colocated=tr["colocated"])
    for req in requests_from_stream(tr["T"], tr["off"], tr["h"], tr["resp"]):
        if not eng.fits(req):
            continue
        fq = eng.free_queue_order()
        bh = list(eng.pool.block_hash)
        out = eng.submit(req)
        # hit blocks leave the free queue first (touch), then new blocks pop from the head; the evicted
        # hashes are those of the popped blocks that had one, in queue order
        hit = set(eng.running[req.rid][: out.hit_units])
        popped = [x for x in fq if x not in hit][: len(out.new_blocks)]
        assert list(out.new_blocks) == popped
        assert list(out.evicted) == [bh[x] for x in popped if bh[x] is not None]
        eng.finish(req.rid)
        assert len(eng.free_queue_order()) == N


def test_worked_example_and_inspection():
    # b=4, N=6 (tests/test_sim_block.py::test_tail_first_eviction_keeps_a_prefix): B evicts A's tail a3
    off, h = hashes_from_block_counts(np.array([0, 1, 0]), np.array([17, 9, 21]) // 4)
    reqs = requests_from_stream([17, 9, 21], off, h)
    eng = make_engine("vllm", 6, block_size=4)
    assert isinstance(eng, Engine)
    a1 = eng.submit(reqs[0])
    assert (a1.hit_tokens, len(a1.new_blocks), a1.evicted) == (0, 5, ())
    assert eng.in_use() == 5 and eng.eviction_order() == []
    eng.finish(0)
    a0, a1_, a2, a3 = (int(x) for x in h[:4])
    # vLLM >= 0.24: the unhashed partial block goes to the head, hashed blocks tail first
    assert eng.eviction_order() == [a3, a2, a1_, a0]
    assert eng.free_queue_order() == [4, 5, 3, 2, 1, 0]  # freed partial block 4 prepended before 5
    b = eng.submit(reqs[1])
    assert b.evicted == (a3,) and b.hit_tokens == 0
    eng.finish(1)
    c = eng.submit(reqs[2])
    assert c.hit_units == 3 and c.hit_tokens == 12 and len(c.evicted) == 2
    # not admissible while it holds its blocks: None, nothing changes
    assert eng.submit(Request(rid=9, prompt_tokens=9, block_hashes=tuple(h[4:6].tolist()))) is None
    with pytest.raises(ValueError, match="block_hashes"):
        eng.submit(Request(rid=10, prompt_tokens=9))


def test_request_validation_names_the_field():
    with pytest.raises(ValueError, match="engine"):
        make_engine("tgi", 4, block_size=2)
    with pytest.raises(ValueError, match="N"):
        VllmEngine(0, block_size=2)
