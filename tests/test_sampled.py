"""Tests of the sampled (SHARDS) curves (kvhit.sim.sampled): rate 1 equals the exact passes, the sample is a
deterministic function of (ids, salt), the streamed pass equals the in-memory one for every chunking."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.sim.content.stackdist import content_curve
from kvhit.sim.sampled import (
    SamplingError,
    conversation_keep,
    sampled_block_curve,
    sampled_content_curve,
    sampled_stream_curve,
)
from kvhit.sim.stream import block_request_chunk
from kvhit.sim.vllm.block import simulate_block
from kvhit.sim.vllm.curve import block_hit_thresholds
from kvhit.workload.chunks import EventChunk
from test_blockcurve import ENGINES, _footprint, traces


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tr=traces(), engine=st.sampled_from(ENGINES), seed=st.integers(0, 2**16))
def test_rate_one_equals_simulation_at_every_certified_capacity(tr, engine, seed):
    """At rate 1 every block is kept and N̂* = ρ + e: the estimated hit blocks are simulate_block's wherever the
    exact pass is certified (the sample covers every lookup block, so the scale factor is 1)."""
    if tr["resp"] is not None:  # the sampled pass models the PD prefiller only
        return
    mask = np.random.default_rng(seed).random(tr["T"].size) < 0.7
    kw = {"block_size": tr["b"], "engine": engine}
    s = sampled_block_curve(tr["T"], tr["off"], tr["h"], rate=1.0, mask=mask, **kw)
    thr = block_hit_thresholds(tr["T"], tr["off"], tr["h"], **kw)
    assert s.sampled_lookups == s.lookup_blocks
    Ns = np.arange(1, _footprint(tr) + 1)
    hb = s.hit_blocks(Ns)
    for k, N in enumerate(Ns):
        if not thr.exact(int(N))[0]:
            continue
        res = simulate_block(tr["T"], tr["off"], tr["h"], N=int(N), **kw)
        assert hb[k] == res.hit_blocks[mask].sum(), N
    assert s.N_min == thr.min_exact_N
    assert s.prompt_tokens == tr["T"][mask].sum()


@settings(max_examples=100, deadline=None)
@given(
    conv=st.lists(st.integers(0, 6), min_size=1, max_size=60),
    seed=st.integers(0, 2**16),
)
def test_content_rate_one_equals_exact(conv, seed):
    rng = np.random.default_rng(seed)
    conv = np.asarray(conv, np.int64)
    R = np.zeros(conv.size, np.int64)
    size: dict[int, int] = {}
    for i, c in enumerate(conv):
        size[int(c)] = size.get(int(c), 0) + int(rng.integers(1, 5))
        R[i] = size[int(c)]
    prev = np.zeros(conv.size, np.int64)
    last: dict[int, int] = {}
    for i, c in enumerate(conv):
        prev[i] = last.get(int(c), 0)
        last[int(c)] = int(R[i])
    Ns = np.arange(1, int(R.sum()) + 2)
    s = sampled_content_curve(conv, R, rate=1.0)
    exact = content_curve(conv, R, np.maximum(prev - 1, 0), Ns)
    assert np.array_equal(np.round(s.curve(Ns) * R.sum()).astype(np.int64), exact)


def _synthetic(n_conv=400, seed=3, b=16):
    rng = np.random.default_rng(seed)
    conv, T = [], []
    length = {}
    for _ in range(6 * n_conv):
        c = int(rng.integers(0, n_conv))
        length[c] = length.get(c, 0) + int(rng.integers(1, 6 * b))
        conv.append(c)
        T.append(length[c])
    return np.asarray(conv, np.int64), np.asarray(T, np.int64), b


def test_same_salt_same_result_other_salt_other_sample():
    conv, T, b = _synthetic()
    ch = EventChunk(conv, conv * 0 + 1, conv * 0 + 9, T // b + 1, T * 0 + 1, T * 0.0, T * 0.0, 0, T)
    _, off, hs = block_request_chunk(ch, b)
    a = sampled_block_curve(T, off, hs, block_size=b, rate=0.2, salt=1, hot=None)
    a2 = sampled_block_curve(T, off, hs, block_size=b, rate=0.2, salt=1, hot=None)
    c = sampled_block_curve(T, off, hs, block_size=b, rate=0.2, salt=2, hot=None)
    assert np.array_equal(a.thresholds, a2.thresholds)
    assert a.sampled_accesses != c.sampled_accesses or not np.array_equal(a.thresholds, c.thresholds)
    # kept share close to the rate (binomial: 5 sigma)
    n = int(off[-1])
    assert abs(a.sampled_accesses - 0.2 * n) < 5 * np.sqrt(n * 0.2 * 0.8)
    k = conversation_keep(np.arange(20_000), 0.1, salt=5)
    assert abs(k.sum() - 2000) < 5 * np.sqrt(2000 * 0.9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunk=st.integers(1, 700), engine=st.sampled_from(ENGINES), rate=st.sampled_from([0.3, 1.0]))
def test_stream_equals_in_memory_for_every_chunking(chunk, engine, rate):
    conv, T, b = _synthetic(n_conv=60, seed=chunk % 7)
    n = conv.size
    turn = np.ones(n, np.int64)
    R = -(-T // b)
    cols = dict(conv=conv, turn=turn, M=turn + 5, R=R, Z=R, time=np.arange(n, dtype=float), conv_arrival=turn * 0.0)
    chunks = [
        EventChunk(**{k: v[a : a + chunk] for k, v in cols.items()}, start=a, cum_tokens=T[a : a + chunk])
        for a in range(0, n, chunk)
    ]
    out = sampled_stream_curve(chunks, rate=rate, salt=4, block_size=b, engines=(engine,), warmup=n // 5)
    whole = EventChunk(**cols, start=0, cum_tokens=T)
    _, off, hs = block_request_chunk(whole, b)
    mem = sampled_block_curve(
        T, off, hs, block_size=b, rate=rate, salt=4, engine=engine, mask=np.arange(n) >= n // 5, hot=None
    )
    got = out["blocks"][engine]
    assert np.array_equal(got.thresholds, mem.thresholds)
    assert (got.prompt_tokens, got.lookup_blocks, got.N_min) == (mem.prompt_tokens, mem.lookup_blocks, mem.N_min)
    c = sampled_content_curve(conv, R, rate=rate, salt=4, mask=np.arange(n) >= n // 5)
    assert np.array_equal(out["content"].thresholds, c.thresholds)


@pytest.mark.parametrize("rate", [0, -0.1, 1.5, float("nan"), True, "0.1"])
def test_bad_rate_refused(rate):
    with pytest.raises(SamplingError, match="sample rate"):
        sampled_block_curve([5], [0, 1], [7], block_size=4, rate=rate)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tr=traces(), engine=st.sampled_from(ENGINES), rate=st.sampled_from([0.05, 0.3]))
def test_every_id_hot_is_exact_at_any_rate(tr, engine, rate):
    """Hot ids are kept with weight 1: with every id hot only vLLM <= 0.23's partial blocks are still sampled, and
    with vLLM >= 0.24 (no partial entries) the pass is the rate-1 pass."""
    if tr["resp"] is not None or engine != "vllm":
        return
    kw = {"block_size": tr["b"], "engine": engine}
    one = sampled_block_curve(tr["T"], tr["off"], tr["h"], rate=1.0, **kw)
    hot = sampled_block_curve(tr["T"], tr["off"], tr["h"], rate=rate, hot=np.unique(tr["h"]), **kw)
    Ns = np.arange(1, _footprint(tr) + 1)
    assert np.allclose(hot.hit_blocks(Ns), one.hit_blocks(Ns))


def test_hot_ids_rule():
    from kvhit.sim.sampled import hot_ids

    h = np.array([5, 5, 5, 5, 7, 7, 9], np.int64)
    assert hot_ids(h, 0.25).tolist() == [5]
    assert hot_ids(h, 0.5).tolist() == [5, 7]
    assert hot_ids(h, 1.0).size == 0
