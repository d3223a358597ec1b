"""The compiled SGLang radix model (kvhit.sim.sglang.radix) equals the step-wise SglangEngine, request by request."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.sim.engine import replay
from kvhit.sim.sglang.engine import SglangEngine
from kvhit.sim.sglang.radix import TokenStreams, simulate_radix


@st.composite
def workloads(draw):
    p = draw(st.sampled_from([1, 1, 2, 4]))
    C = p * draw(st.integers(1, 12))
    nstreams = draw(st.integers(1, 4))
    runs: list[list[tuple[int, int, int]]] = []
    for s in range(nstreams):
        rs: list[tuple[int, int, int]] = []
        if s and draw(st.booleans()):  # duplicated content: start with a prefix of an earlier stream
            src = runs[draw(st.integers(0, s - 1))]
            rs = list(src[: draw(st.integers(0, len(src)))])
        for _ in range(draw(st.integers(1, 6))):
            kind = draw(st.integers(0, 2))
            if kind == 0:  # a "real token": small alphabet, repeats across streams
                rs.append((draw(st.integers(0, 3)), 0, 1))
            elif kind == 1:  # a block-like run shared by id
                rs.append((100 + draw(st.integers(0, 3)), 0, draw(st.integers(1, 3 * p))))
            else:  # a stream's own run (synthetic conversation content)
                rs.append((1000 + s, draw(st.integers(0, 2)), draw(st.integers(1, 4 * p))))
        runs.append(rs)
    lens = [sum(r[2] for r in rs) for rs in runs]
    reqs = []
    for _ in range(draw(st.integers(1, 22))):
        s = draw(st.integers(0, nstreams - 1))
        if lens[s] < 1:
            continue
        n = draw(st.integers(0, 2 * p + 1))
        T = draw(st.integers(1, lens[s]))
        n = min(n, lens[s] - T + 1)
        reqs.append((s, T, n))
    if not reqs:
        reqs = [(0, 1, 0)] if lens[0] else []
    flat = [r for rs in runs for r in rs]
    off = np.cumsum([0] + [len(rs) for rs in runs])
    ts = TokenStreams(
        run_sym=[r[0] for r in flat],
        run_idx=[r[1] for r in flat],
        run_len=[r[2] for r in flat],
        stream_off=off,
        stream=[r[0] for r in reqs],
        prompt_tokens=[r[1] for r in reqs],
        output_tokens=[r[2] for r in reqs],
    )
    timing = None
    if draw(st.booleans()):
        gaps = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=len(reqs), max_size=len(reqs)))
        hold = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=len(reqs), max_size=len(reqs)))
        timing = (np.cumsum(gaps), np.asarray(hold))
    pol = draw(st.sampled_from(["lru", "lru", "fifo", "mru", "filo", "lfu", "slru", "priority", "tlru"]))
    cache = "unified" if pol == "tlru" else draw(st.sampled_from(["unified", "radix"]))
    budget = draw(st.sampled_from([0, 1, 3, 8])) if pol == "tlru" else 0
    return p, C, ts, timing, pol, cache, budget


def _compare(p, C, ts, timing, pol, cache="unified", budget=0):
    times, hold = timing if timing is not None else (None, None)
    eng = SglangEngine(C, page_size=p, evict_policy=pol, cache=cache, tlru_tail_budget=budget)
    ref = replay(eng, ts.to_requests(), times=times, hold=hold)
    got = simulate_radix(
        ts, C, page_size=p, evict_policy=pol, times=times, hold=hold, cache=cache, tlru_tail_budget=budget
    )
    np.testing.assert_array_equal(got.rejected, ref.rejected)
    np.testing.assert_array_equal(got.hit_tokens, ref.hit_tokens)
    ev_tok = [o.evicted_units if o else 0 for o in ref.outcomes]
    ev_nodes = [len(o.evicted) if o else 0 for o in ref.outcomes]
    np.testing.assert_array_equal(got.evicted_tokens, ev_tok)
    np.testing.assert_array_equal(got.evicted_nodes, ev_nodes)
    np.testing.assert_array_equal(got.wait, ref.wait)
    assert got.peak_in_use == ref.peak_in_use
    assert got.evictions == ref.evicted_units


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads())
def test_radix_equals_stepwise_engine(w):
    _compare(*w)


def test_multi_turn_chain_hits_history_and_cached_responses():
    # one conversation, 3 turns on one synthetic stream: each turn's prompt = previous prompt + output + new
    ts = TokenStreams([7], [0], [100], [0, 1], [0, 0, 0], [10, 30, 60], [5, 5, 5])
    r = simulate_radix(ts, 1000)
    # turn 2 hits turn 1's prompt and its cached output minus the last token: 10 + 5 - 1
    assert r.hit_tokens.tolist() == [0, 14, 34]
    _compare(1, 1000, ts, None, "lru")


def test_whole_leaf_eviction_frees_more_than_asked():
    # C = 12: request 0 caches 8 tokens (prompt 6 + output leaf 2), request 1 needs 5 -> the output leaf goes
    ts = TokenStreams([1, 2], [0, 0], [20, 20], [0, 1, 2], [0, 1, 0], [6, 5, 7], [3, 1, 1])
    r = simulate_radix(ts, 12)
    assert r.evicted_tokens.tolist()[:2] == [0, 2]
    assert r.hit_tokens[2] == 6
    _compare(1, 12, ts, None, "lru")


def test_validation():
    ts = TokenStreams([1], [0], [8], [0, 1], [0], [4], [1])
    with pytest.raises(ValueError, match="capacity"):
        simulate_radix(ts, 10, page_size=4)
    with pytest.raises(ValueError, match="evict_policy"):
        simulate_radix(ts, 8, evict_policy="lfu2")
    with pytest.raises(ValueError, match="cache"):
        simulate_radix(ts, 8, cache="hybrid")
    with pytest.raises(ValueError, match="tlru"):
        simulate_radix(ts, 8, evict_policy="tlru", cache="radix")
    with pytest.raises(ValueError, match="request 0: needs 9 tokens"):
        TokenStreams([1], [0], [8], [0, 1], [0], [4], [6])
