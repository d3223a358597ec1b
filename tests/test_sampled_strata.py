"""Tests of the stratified reading of a block sample (kvhit.sim.sampled_strata): against a request-by-request
reference of the gaps, ratio thresholds and strata; exact at rate 1 and with every id hot; the jackknife's groups."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.sim.sampled import SamplingError, _saltmix, sample_threshold, sampled_block_curve
from kvhit.sim.sampled_strata import jackknife_se, stratified_hits
from kvhit.sim.vllm.block import ENGINES as ENGINE_NEW
from kvhit.workload.hashing import fmix64
from test_blockcurve import ENGINES, _footprint, traces

NEVER = np.iinfo(np.int64).max


def _slow_stratified(tr, engine, mask, rate, salt, s, Ns, per):
    """The stratified estimate computed request by request from its definition (no vectorised pass)."""
    T, off, hs, b = tr["T"], tr["off"], tr["h"], tr["b"]
    new = ENGINE_NEW[engine]
    full = rate >= 1.0
    mix, thr = int(_saltmix(salt)), int(sample_threshold(rate))

    def hashed(x):
        with np.errstate(over="ignore"):
            return int(fmix64(np.uint64(np.int64(x).view(np.uint64)) ^ np.uint64(mix)))

    hot_ids = set(np.unique(hs)[np.unique(hs, return_counts=True)[1] >= np.ceil(1 / rate - 1e-9)].tolist())
    hot_ids = set() if full else hot_ids

    def keep(x):
        return full or x in hot_ids or hashed(x) < thr

    n = T.size
    Ecum, Wcum = [0], [0.0]
    last: dict[int, int] = {}
    kept, pop = [], []  # kept: (gap, since, is_hot); pop: gaps of non-hot measured lookups
    for r in range(n):
        ids = [int(x) for x in hs[off[r] : off[r + 1]]]
        for i, x in enumerate(ids):
            if not (i < (T[r] - 1) // b and mask[r]):
                continue
            p = last.get(x)
            gap = NEVER if p is None else Ecum[r] - Ecum[p]
            since = 0.0 if p is None else Wcum[r] - Wcum[p]
            if p is not None and x not in hot_ids:  # the lookup's own id: its appends in request p count once
                since -= (1.0 / rate - 1.0) * sum(int(y) == x for y in hs[off[p] : off[p + 1]])
            if x not in hot_ids:
                pop.append(gap)
            if keep(x):
                kept.append((gap, since, x in hot_ids))
        part = (not new) and T[r] % b != 0
        w = sum((1.0 if x in hot_ids else 1.0 / rate) for x in ids if keep(x))
        if part and (full or hashed(np.int64(r) ^ np.int64(0x5BD1E995)) < thr):
            w += 1.0 / rate
        Ecum.append(Ecum[-1] + len(ids) + int(part))
        Wcum.append(Wcum[-1] + w)
        for x in ids:
            last[x] = r
    assert len(kept) == s.sampled_lookups
    t = []
    for (gap, since, _), ts in zip(kept, s.thresholds.tolist(), strict=True):
        t.append(1 + round((ts - 1) * gap / since) if ts < NEVER and since > 0 else ts)
    cold = [(g, tt) for (g, _, h), tt in zip(kept, t, strict=True) if not h]
    fin = sorted(g for g, _ in cold if g < NEVER)
    nb = max(1, len(fin) // per)
    edges = sorted({fin[(j * len(fin)) // nb] for j in range(1, nb)}) if nb > 1 else []

    def stratum(g):
        return sum(e <= g for e in edges)

    popk = [0] * (len(edges) + 1)
    for g in pop:
        if g < NEVER:
            popk[stratum(g)] += 1
    out = []
    for N in Ns:
        h = sum(tt <= N for (_, _, hh), tt in zip(kept, t, strict=True) if hh)
        for k in range(len(edges) + 1):
            mem = [tt for g, tt in cold if g < NEVER and stratum(g) == k]
            if mem:
                h += popk[k] / len(mem) * sum(tt <= N for tt in mem)
        out.append(h)
    return np.array(out, np.float64)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tr=traces(max_n=30), engine=st.sampled_from(ENGINES), rate=st.sampled_from([0.3, 0.6, 1.0]),
       salt=st.integers(0, 50), per=st.integers(1, 4), seed=st.integers(0, 2**16))  # fmt: skip
def test_stratified_equals_a_request_by_request_reference(tr, engine, rate, salt, per, seed):
    if tr["resp"] is not None:
        return
    mask = np.random.default_rng(seed).random(tr["T"].size) < 0.8
    s = sampled_block_curve(
        tr["T"], tr["off"], tr["h"], block_size=tr["b"], engine=engine, rate=rate, salt=salt, mask=mask, gaps=True,
        jackknife=0,
    )  # fmt: skip
    Ns = np.arange(1, _footprint(tr) + 2)
    hot = np.zeros(s.sampled_lookups, bool) if s.weights is None else s.weights == 1.0
    got = stratified_hits(s.thresholds, hot, s.gaps, Ns, per=per)
    want = _slow_stratified(tr, engine, mask, rate, salt, s, Ns, per)
    assert np.allclose(got, want, rtol=1e-12, atol=1e-9)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tr=traces(), engine=st.sampled_from(ENGINES), seed=st.integers(0, 2**16))
def test_rate_one_and_every_id_hot_are_exact(tr, engine, seed):
    """Rate 1: K = τ and every stratum is its population, so the stratified reading is the exact (rate-1 step)
    one, itself pinned against simulate_block (test_sampled). Every id hot (vLLM ≥ 0.24): nothing is sampled."""
    if tr["resp"] is not None:
        return
    mask = np.random.default_rng(seed).random(tr["T"].size) < 0.7
    kw = {"block_size": tr["b"], "engine": engine, "mask": mask}
    one = sampled_block_curve(tr["T"], tr["off"], tr["h"], rate=1.0, gaps=True, **kw)
    Ns = np.arange(1, _footprint(tr) + 2)
    exact = one.hit_blocks(Ns, "step")
    assert np.array_equal(one.hit_blocks(Ns, "stratified"), exact)
    assert np.all(np.nan_to_num(one.standard_error(Ns, "stratified")) == 0)
    if engine == "vllm":
        hot = sampled_block_curve(tr["T"], tr["off"], tr["h"], rate=0.2, hot=np.unique(tr["h"]), gaps=True, **kw)
        assert np.allclose(hot.hit_blocks(Ns, "stratified"), exact)


def test_jackknife_replicates_drop_each_kept_id_once():
    rng = np.random.default_rng(7)
    b, n = 4, 3000
    conv = rng.integers(0, 300, n)
    size: dict[int, int] = {}
    T = np.empty(n, np.int64)
    for r, c in enumerate(conv):
        size[int(c)] = size.get(int(c), 0) + int(rng.integers(1, 3 * b))
        T[r] = size[int(c)]
    off = np.concatenate([[0], np.cumsum(T // b)])
    hs = np.concatenate([int(c) * 10_000 + np.arange(t // b) for c, t in zip(conv, T, strict=True)]).astype(np.int64)
    s = sampled_block_curve(T, off, hs, block_size=b, rate=0.2, salt=3, hot=None, gaps=True, jackknife=5)
    assert len(s.replicates) == 5
    assert s.sampled_lookups > 100
    for rep in s.replicates:
        assert rep.rate == pytest.approx(0.2 * 4 / 5, rel=1e-12)
        assert 0 < rep.sampled_lookups < s.sampled_lookups
    # the five slices of the kept hash range partition the kept ids: each kept lookup is in exactly four replicates
    assert sum(r.sampled_lookups for r in s.replicates) == 4 * s.sampled_lookups
    Ns = np.array([10, 100, 1000])
    th = np.array([r.hit_blocks(Ns, "stratified") for r in s.replicates])
    want = np.sqrt(4 / 5 * ((th - th.mean(0)) ** 2).sum(0)) / s.prompt_blocks
    assert np.allclose(np.nan_to_num(s.standard_error(Ns, "stratified")), np.where(Ns >= s.N_min, want, 0))
    assert np.allclose(jackknife_se(th), np.sqrt(4 / 5 * ((th - th.mean(0)) ** 2).sum(0)))


def test_stratified_refusals():
    T = np.array([8, 12], np.int64)
    off = np.array([0, 2, 5])
    hs = np.array([1, 2, 1, 2, 3], np.int64)
    s = sampled_block_curve(T, off, hs, block_size=4, rate=0.5)
    with pytest.raises(SamplingError, match="estimator: 'stratified'"):
        s.curve([4], "stratified")
    with pytest.raises(SamplingError, match="jackknife"):
        sampled_block_curve(T, off, hs, block_size=4, rate=0.5, gaps=True, jackknife=1)


def test_jackknife_thresholds_equal_a_lookup_by_lookup_correction():
    """'stratified-jk': each kept lookup's ratio threshold corrected by its thresholds in the replicates that hold it
    (found by its hash slice), computed lookup by lookup; rate 1 gives the exact curve."""
    from kvhit.sim.sampled_strata import ratio_thresholds

    rng = np.random.default_rng(11)
    b, n = 4, 2000
    conv = rng.integers(0, 200, n)
    size: dict[int, int] = {}
    T = np.empty(n, np.int64)
    for r, c in enumerate(conv):
        size[int(c)] = size.get(int(c), 0) + int(rng.integers(1, 3 * b))
        T[r] = size[int(c)]
    off = np.concatenate([[0], np.cumsum(T // b)])
    hs = np.concatenate([int(c) * 10_000 + np.arange(t // b) for c, t in zip(conv, T, strict=True)]).astype(np.int64)
    G, rate, salt = 4, 0.25, 9
    s = sampled_block_curve(T, off, hs, block_size=b, rate=rate, salt=salt, hot=None, gaps=True, jackknife=G)
    t0 = ratio_thresholds(s.thresholds, s.gaps.gap, s.gaps.since)
    thr, mix = int(sample_threshold(rate)), np.uint64(_saltmix(salt))
    reps = []
    for g, rep in enumerate(s.replicates):
        lo, hi = thr * g // G, thr * (g + 1) // G
        with np.errstate(over="ignore"):
            h = fmix64(s.lookup_ids.view(np.uint64) ^ mix)
        present = ~((h >= np.uint64(lo)) & (h < np.uint64(hi)))
        reps.append((np.flatnonzero(present), ratio_thresholds(rep.thresholds, rep.gaps.gap, rep.gaps.since)))
    want = t0.copy()
    for a in range(t0.size):
        if t0[a] == NEVER:
            continue
        vals = [float(tg[list(idx).index(a)]) for idx, tg in reps if a in set(idx.tolist())]
        vals = [v for v in vals if v < NEVER]
        if vals:
            want[a] = max(round(G * t0[a] - (G - 1) * np.mean(vals)), 1)
    assert np.array_equal(s._jk_thresholds, want)
    Ns = np.arange(1, 400)
    assert np.array_equal(
        s.hit_blocks(Ns, "stratified-jk"), stratified_hits(want, np.zeros(t0.size, bool), s.gaps, Ns, ratio=False)
    )
    one = sampled_block_curve(T, off, hs, block_size=b, rate=1.0, gaps=True)
    assert np.array_equal(one.hit_blocks(Ns, "stratified-jk"), one.hit_blocks(Ns, "step"))
