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
from kvhit.sim.sampled_estimate import sampled_hits
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


# --------------------------------------------------------------------------------------------------
# the deblurred reading (kvhit.sim.sampled_estimate)
# --------------------------------------------------------------------------------------------------


def _expected_reading(pm, rate, Ns, estimator):
    """E[estimate] in closed form: lookups with ``m`` entries above (law ``pm``), ``K ~ Binomial(m, rate)`` kept,
    threshold ``1 + ⌈K/rate⌉``; the readings are linear in the weights, so feeding every (m, K) pair weighted by its
    probability gives the expectation exactly."""
    from scipy import stats

    m = np.arange(pm.size)
    ks = np.arange(int(rate * pm.size * 2) + 60)
    P = stats.binom.pmf(ks[None, :], m[:, None], rate) * pm[:, None]
    thr = np.broadcast_to(1 + np.ceil(ks / rate - 1e-9).astype(np.int64), P.shape).ravel()
    w = P.ravel()
    keep = w > 1e-16
    return sampled_hits(thr[keep], w[keep], rate, Ns, estimator=estimator)


@pytest.mark.parametrize("rate", [0.05, 0.1])
def test_deblurred_reading_unbiased_where_the_curve_is_linear_or_quadratic(rate):
    """F(N) = P(1 + m ≤ N). Uniform m (F linear): the ramps put each step value at the knot (k+1)/R − 1 where it
    belongs, so E[deblurred] = F exactly while the staircase is off by up to a step's rise. Linearly falling law of
    m (F quadratic, concave): the deconvolution step removes the ½σ²F'' blur (left: 10⁻⁵ of the step's 10⁻³)."""
    M = 4000
    Ns = np.array([211, 517, 1009, 1503, 2011, 2503])  # off the 1/R lattice
    for pm, tol in ((np.ones(M), 1e-8), (np.arange(M, 0, -1).astype(float), 2e-5)):
        pm = pm / pm.sum()
        F = np.array([pm[:n].sum() for n in Ns])
        deb = _expected_reading(pm, rate, Ns, "deblurred")
        step = _expected_reading(pm, rate, Ns, "step")
        assert np.abs(deb - F).max() < tol, deb - F
        assert np.abs(step - F).max() > 50 * tol


@settings(max_examples=100, deadline=None)
@given(
    thr=st.lists(st.integers(1, 3000), min_size=1, max_size=60),
    rate=st.sampled_from([0.01, 0.03, 0.2, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_deblurred_reading_equals_a_direct_sum(thr, rate, seed):
    """The prefix-sum evaluation equals the formula summed lookup by lookup: ramp_i(N) = clip((N − t_i + 1)·R, 0, 1),
    F̌(N) = F̃(N) − ½[F̃(N + σ) + F̃(N − σ) − 2F̃(N)], σ² = (N − 1)(1 − R)/R."""
    rng = np.random.default_rng(seed)
    t = np.asarray(thr, np.int64)
    t[rng.random(t.size) < 0.1] = np.iinfo(np.int64).max  # never cached: never a hit
    w = rng.uniform(0.5, 2.0, t.size)
    Ns = np.unique(rng.integers(1, 4000, 25))

    def tilde(x):
        fin = t < np.iinfo(np.int64).max
        return sum(wi * min(max((x - (ti - 1)) * rate, 0.0), 1.0) for ti, wi in zip(t[fin], w[fin], strict=True))

    want = []
    for n in Ns:
        s = np.sqrt(max(n - 1.0, 0.0) * (1 - rate) / rate)
        want.append(tilde(n) - 0.5 * (tilde(n + s) + tilde(n - s) - 2 * tilde(n)))
    assert np.allclose(sampled_hits(t, w, rate, Ns), want, rtol=1e-10, atol=1e-9)
    step = [w[(t <= n)].sum() for n in Ns]
    assert np.allclose(sampled_hits(t, w, rate, Ns, estimator="step"), step, rtol=1e-12)
    assert np.array_equal(sampled_hits(t, w, 1.0, Ns), sampled_hits(t, w, 1.0, Ns, estimator="step"))


def test_kept_above_counts_the_sampled_entries():
    """With a hot set that no id of the trace is in, the second tree (kept non-hot entries above each lookup, K)
    must agree with the HT sum of the main one: t = 1 + e + K/R with e ∈ {0, 1} (1/R = 5 is an integer)."""
    conv, T, b = _synthetic()
    ch = EventChunk(conv, conv * 0 + 1, conv * 0 + 9, T // b + 1, T * 0 + 1, T * 0.0, T * 0.0, 0, T)
    _, off, hs = block_request_chunk(ch, b)
    absent = np.array([int(hs.max()) + 1], np.int64)
    s = sampled_block_curve(T, off, hs, block_size=b, rate=0.2, salt=3, hot=absent)
    plain = sampled_block_curve(T, off, hs, block_size=b, rate=0.2, salt=3, hot=None)
    assert s.kept_above is not None and plain.kept_above is None
    assert np.array_equal(s.thresholds, plain.thresholds)
    fin = s.thresholds < np.iinfo(np.int64).max
    e = s.thresholds[fin] - 1 - 5 * s.kept_above[fin]
    assert set(np.unique(e)) <= {0, 1} and s.kept_above[fin].max() > 10
    # with a real hot set, K counts fewer entries than the HT sum implies
    hot = sampled_block_curve(T, off, hs, block_size=b, rate=0.2, salt=3, hot=np.unique(hs)[::7])
    fin = hot.thresholds < np.iinfo(np.int64).max
    assert (hot.thresholds[fin] - 1 >= 5 * hot.kept_above[fin]).all()
    assert (hot.thresholds[fin] - 2 > 5 * hot.kept_above[fin]).any()


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 80),
    n_ids=st.integers(1, 15),
    rate=st.sampled_from([0.02, 0.1, 0.5]),
    hot_share=st.sampled_from([0.0, 0.3]),
    seed=st.integers(0, 2**16),
)
def test_sampling_se_equals_the_formula_id_by_id(n, n_ids, rate, hot_share, seed):
    """sampling_se (prefix sums over ranks) equals the linearised HT variance of the ratio computed id by id:
    (1 − R)/R² · Σ_j (c_j(N) − F̂ n_j)² / (Σ w)², hot ids contributing to F̂ but not to the variance."""
    from kvhit.sim.sampled_estimate import id_ranks, sampling_se

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, n_ids, n)
    t = rng.integers(1, 500, n).astype(np.int64)
    t[rng.random(n) < 0.15] = np.iinfo(np.int64).max
    hot_ids = set(np.flatnonzero(rng.random(n_ids) < hot_share))
    hot = np.array([i in hot_ids for i in ids])
    w = np.where(hot, 1.0, 1.0 / rate)
    rank, group = id_ranks(ids, t, hot)
    Ns = np.unique(rng.integers(1, 600, 12))
    got = sampling_se(t, rank, group, w, rate, Ns)
    want = []
    for N in Ns:
        F = w[t <= N].sum() / w.sum()
        v = sum((((t <= N) & (ids == j)).sum() - F * (ids == j).sum()) ** 2 for j in set(ids) - hot_ids)
        want.append(np.sqrt((1 - rate) / rate**2 * v / w.sum() ** 2))
    # the prefix sums subtract Σc² − 2F̂Σcn + F̂²Σn²: a cancellation floor of √(ε·Σc²)·R/Σn ≲ 10⁻⁷ here
    assert np.allclose(got, want, rtol=1e-6, atol=2e-7)


def test_standard_error_zero_when_nothing_is_sampled_and_covers_the_salts():
    """Rate 1 (every id kept): no sampling error. Below: over 24 salts of one synthetic trace the spread of the
    estimate is about the stated standard error (the sample-size part; docs/sampling.md §2 measures 1.0–1.4×)."""
    conv, T, b = _synthetic()
    ch = EventChunk(conv, conv * 0 + 1, conv * 0 + 9, T // b + 1, T * 0 + 1, T * 0.0, T * 0.0, 0, T)
    _, off, hs = block_request_chunk(ch, b)
    one = sampled_block_curve(T, off, hs, block_size=b, rate=1.0, hot=None)
    Ns = one.N_min * np.array([1, 2, 4, 8])
    assert np.array_equal(one.standard_error(Ns), np.zeros(4))
    assert np.isnan(one.standard_error([one.N_min - 1])).all()  # infeasible: no ratio, no error
    runs = [sampled_block_curve(T, off, hs, block_size=b, rate=0.2, salt=s, hot=None) for s in range(24)]
    h = np.array([r.curve(Ns)["block_hit_ratio"] for r in runs])
    se = np.array([r.standard_error(Ns) for r in runs]).mean(0)
    ratio = h.std(0, ddof=1) / se
    assert np.all((ratio > 0.6) & (ratio < 2.0)), ratio
