"""SGLang radix-cache model (kvhit.sim.sglang.engine): hand-worked cases and invariants."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.sim.engine import Request, replay
from kvhit.sim.registry import make_engine
from kvhit.sim.sglang.engine import SglangEngine


def req(rid, prompt, output=1):
    """Prompt and output token lists -> Request (output tokens are ids 10_000 + ...)."""
    out = [10_000 + rid * 100 + i for i in range(output)]
    return Request(rid=rid, prompt_tokens=len(prompt), output_tokens=output, token_ids=tuple(prompt) + tuple(out))


def run(eng, r):
    o = eng.submit(r)
    eng.finish(r.rid)
    return o


def test_hit_cap_is_prompt_minus_one_rounded_to_pages():
    e = SglangEngine(100)
    assert run(e, req(0, range(8))).hit_tokens == 0
    assert run(e, req(1, range(8))).hit_tokens == 7  # (T - 1) tokens, p = 1
    e = SglangEngine(100, page_size=4)
    run(e, req(0, range(8)))
    assert run(e, req(1, range(8))).hit_tokens == 4  # floor(7 / 4) * 4
    assert run(e, req(2, range(9))).hit_tokens == 8


def test_responses_are_cached_minus_the_last_token():
    e = SglangEngine(100)
    r0 = req(0, range(5), output=3)  # prompt 0..4, outputs o0 o1 o2: KV for 5 + 3 - 1 = 7 tokens
    run(e, r0)
    assert e.cached_tokens() == 7
    nxt = list(r0.token_ids) + [50, 51]  # the next turn: history + response + new prompt
    assert run(e, req(1, nxt)).hit_tokens == 7


def test_outputs_are_a_leaf_evicted_before_their_prompt():
    # C = 12: conversation X (prompt 6, 3 outputs -> 8 cached: prompt node 6 + output leaf 2)
    e = SglangEngine(12)
    x = req(0, range(6), output=3)
    run(e, x)
    assert e.eviction_order() == [tuple(x.token_ids[:8])]  # only the output leaf is a leaf
    # Y needs 5 slots, 4 free: shortfall 1 -> the whole output leaf (2 tokens) goes, the prompt stays
    y = run(e, req(1, [100 + i for i in range(5)]))
    assert y.evicted == (tuple(x.token_ids[:8]),) and y.evicted_units == 2
    assert run(e, req(2, list(range(6)) + [7])).hit_tokens == 6


def test_eviction_frees_whole_nodes_lru_and_cascades_to_parents():
    e = SglangEngine(10)
    run(e, req(0, range(4)))  # 4 cached
    run(e, req(1, [20, 21, 22]))  # 3 cached, newer
    # needs 6, 3 free: shortfall 3 -> the LRU leaf (0..3, 4 tokens) goes whole, more than asked
    o = run(e, req(2, [30, 31, 32, 33, 34, 35]))
    assert o.evicted == ((0, 1, 2, 3),) and o.evicted_units == 4
    assert e.available + e.cached_tokens() == 10


def test_split_on_partial_match_persists_and_locks_protect():
    e = SglangEngine(20)
    run(e, req(0, range(8)))
    a = e.submit(req(1, [0, 1, 2, 9, 9]))  # match ends inside the node: split at 3
    assert a.hit_tokens == 3
    # while r1 runs, its matched prefix is locked: a big request cannot evict it
    assert e.evictable_size() == 5  # the unlocked lower half of the split node
    e.finish(1)
    assert e.evictable_size() == e.cached_tokens()


def test_page_demand_and_decode_pages():
    # p = 4, C = 16: prefill of 5 tokens demands 5 + 4 (a page more), takes 2 pages; 4 decode steps fill
    # position 5..8 (the third page at position 8)
    e = SglangEngine(16, page_size=4)
    r = req(0, range(5), output=5)
    e.submit(r)
    assert e.available == 16 - 12
    e.finish(0)
    assert e.cached_tokens() == 8  # 5 + 5 - 1 = 9 tokens, page-aligned down
    assert e.available == 8


def test_rejection_and_refusal():
    e = SglangEngine(8, page_size=2)
    assert not e.fits(req(0, range(7), output=2))  # 8 tokens + a page > 8
    assert e.fits(req(0, range(5), output=1))
    big = req(1, range(6), output=1)
    held = e.submit(req(2, [50, 51, 52], output=1))
    assert held is not None
    assert e.submit(big) is None  # demand 6 + 2 > 4 free + 0 evictable


def test_validation():
    with pytest.raises(ValueError, match="capacity"):
        SglangEngine(10, page_size=4)
    with pytest.raises(ValueError, match="evict_policy"):
        SglangEngine(10, evict_policy="lfu2")
    with pytest.raises(ValueError, match="cache"):
        SglangEngine(10, cache="hybrid")
    with pytest.raises(ValueError, match="tlru"):
        SglangEngine(10, evict_policy="tlru", cache="radix")
    with pytest.raises(ValueError, match="tlru_tail_budget"):
        SglangEngine(10, evict_policy="tlru", tlru_tail_budget=-1)
    with pytest.raises(ValueError, match="token_ids"):
        SglangEngine(10).submit(Request(rid=0, prompt_tokens=3))
    assert isinstance(make_engine("sglang", 8, page_size=2), SglangEngine)


@st.composite
def workloads(draw):
    p = draw(st.sampled_from([1, 2, 4]))
    C = p * draw(st.integers(2, 12))
    nconv = draw(st.integers(1, 4))
    hist = {c: [] for c in range(nconv)}
    nxt = {c: 1000 * (c + 1) for c in range(nconv)}
    reqs = []
    for rid in range(draw(st.integers(1, 25))):
        c = draw(st.integers(0, nconv - 1))
        for _ in range(draw(st.integers(1, 3 * p))):
            hist[c].append(nxt[c])
            nxt[c] += 1
        out = draw(st.integers(1, 2 * p))
        r = Request(rid, len(hist[c]), output_tokens=out, token_ids=tuple(hist[c]) + tuple(range(-out, 0)))
        reqs.append(r)
        hist[c] = list(r.token_ids)
        if len(hist[c]) > 2 * C:
            hist[c] = []
    return p, C, reqs, draw(st.sampled_from(["lru", "fifo", "mru", "filo", "lfu", "slru", "priority", "tlru"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads())
def test_invariants(w):
    p, C, reqs, pol = w
    e = SglangEngine(C, page_size=p, evict_policy=pol)

    def check(kind, rid, out):
        assert 0 <= e.available <= C
        assert e.available + e.cached_tokens() <= C
        if kind == "submit":
            r = reqs[rid]
            assert out.hit_tokens % p == 0 and out.hit_tokens <= (r.prompt_tokens - 1) // p * p
        if kind == "finish" and not e.running:
            assert e.available + e.cached_tokens() == C  # nothing leaks
            assert e.evictable_size() == e.cached_tokens()  # nothing stays locked

    res = replay(e, reqs, on_event=check)
    assert all(o is None or o.hit_tokens >= 0 for o in res.outcomes)
