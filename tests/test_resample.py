"""Resample-and-simulate (kvhit.sim.resample) and feasibility (kvhit.sim.feasibility).

The resampled stream is checked against a plain-Python reference built from the raw trace (dicts and sets,
sharing no code with the vectorized builder), the simulation against per-capacity runs of the block simulator
and the OrderedDict reference of Algorithm 1, and the refused shares against hand counts.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.sim.feasibility import feasibility
from kvhit.sim.resample import ResampleError, conversation_pool, resample, resample_simulate
from kvhit.sim.vllm.block import simulate_block, token_hit_ratio
from kvhit.workload.production import read_mooncake, read_weka

B = 4


def _weka_dir(tmp_path, C=5, seed=0, max_turns=6):
    """C WEKA-format conversations: growing prompts, prefix-chained local ids, random gaps."""
    rng = np.random.default_rng(seed)
    files = []
    for c in range(C):
        t, T, reqs = 0.0, 0, []
        for _ in range(int(rng.integers(1, max_turns + 1))):
            T += int(rng.integers(1, 4 * B))
            reqs.append({"t": t, "type": "n", "in": T, "out": 3, "hash_ids": list(range(100 + 0, 100 + T // B))})
            t += float(rng.exponential(5.0))
            T += 3
        f = tmp_path / f"trace_{c:04d}.json"
        f.write_text(json.dumps({"block_size": B, "hash_id_scope": "local", "requests": reqs}))
        files.append(f)
    return files


def _mooncake(tmp_path):
    """Three sessions sharing a 1-block system prefix [0]; their own blocks after it."""
    rows = [
        (0, 8, [0, 10]),  # session A
        (1000, 13, [0, 20, 21, 22]),  # session B (13 tokens: ceil = 4 ids, the partial one dropped)
        (2000, 12, [0, 10, 11]),  # A again
        (4000, 9, [0, 30, 31]),  # session C (9 tokens: 3 ids, the partial one dropped)
    ]
    p = tmp_path / "mc.jsonl"
    p.write_text(
        "\n".join(
            json.dumps({"timestamp": t, "input_length": T, "output_length": 1, "hash_ids": h}) for t, T, h in rows
        )
    )
    return read_mooncake(p, block_size=B, shared_min_successors=2)


def _reference_stream(pt, starts, origins, warmup, H):
    """Plain-Python resampled stream: (time, T, labels) sorted by (time, copy, position)."""
    sess = pt.session.tolist()
    by_conv: dict[int, list[int]] = {}
    for r in sorted(range(pt.n_requests), key=lambda r: (sess[r], pt.time[r], r)):
        by_conv.setdefault(sess[r], []).append(r)
    convs = sorted(by_conv)
    seen_in: dict[int, set] = {}
    for r in range(pt.n_requests):
        for x in pt.hashes[pt.hash_offsets[r] : pt.hash_offsets[r + 1]].tolist():
            seen_in.setdefault(x, set()).add(sess[r])
    out = []
    for k, (s, c) in enumerate(zip(starts.tolist(), origins.tolist(), strict=True)):
        rows = by_conv[convs[c]]
        t0 = pt.time[rows[0]]
        for pos, r in enumerate(rows):
            t = s + (pt.time[r] - t0)
            if t < -warmup or t > H:
                continue
            ids = pt.hashes[pt.hash_offsets[r] : pt.hash_offsets[r + 1]].tolist()
            lab = [("s", x) if len(seen_in[x]) >= 2 else ("p", k, x) for x in ids]
            out.append((t, k, pos, int(pt.prompt_tokens[r]), lab))
    out.sort(key=lambda x: (x[0], x[1], x[2]))
    return out


def _check_against_reference(pt, st):
    ref = _reference_stream(pt, st.starts, st.origins, st.warmup, st.horizon)
    assert len(ref) == st.time.shape[0]
    assert np.array_equal(np.array([x[0] for x in ref]), st.time)
    assert np.array_equal(np.array([x[3] for x in ref]), st.prompt_tokens)
    fwd: dict = {}
    back: dict = {}
    for q, x in enumerate(ref):
        ours = st.hashes[st.hash_offsets[q] : st.hash_offsets[q + 1]].tolist()
        assert len(ours) == len(x[4])
        for lab, h in zip(x[4], ours, strict=True):
            assert fwd.setdefault(lab, h) == h  # one label, one id
            assert back.setdefault(h, lab) == lab  # one id, one label (copies never collide)


def test_stream_matches_reference_weka(tmp_path):
    pt = read_weka(_weka_dir(tmp_path, C=6), arrival="uniform", span=20.0, seed=3)
    pool = conversation_pool(pt)
    assert pool.n_shared == 0 and pool.n_conversations == 6
    for seed in range(4):
        st = resample(pool, lam0=0.2, horizon=60.0, warmup=10.0, seed=seed)
        assert st.time.shape[0] > 10
        _check_against_reference(pt, st)


def test_stream_matches_reference_shared_prefix(tmp_path):
    pt = _mooncake(tmp_path)
    pool = conversation_pool(pt)
    # id 0 occurs in three sessions: shared; 10, 11, 20, 21, 30 private
    assert pool.n_conversations == 3
    assert pool.n_shared == 1 and pool.n_private == 5
    st = resample(pool, lam0=0.5, horizon=40.0, warmup=5.0, seed=1)
    _check_against_reference(pt, st)
    # every copy starts with the same shared id; private ids differ between copies of one origin
    firsts = {int(st.hashes[st.hash_offsets[q]]) for q in range(st.time.shape[0])}
    assert len(firsts) == 1
    assert len(set(st.origins.tolist())) == 3 and st.time.shape[0] > 10
    k_of = {}
    for q in range(st.time.shape[0]):
        ids = st.hashes[st.hash_offsets[q] + 1 : st.hash_offsets[q + 1]].tolist()
        for h in ids:
            assert k_of.setdefault(h, st.conv[q]) == st.conv[q]


def test_copies_of_one_conversation_do_not_share_private_blocks(tmp_path):
    """One single-request conversation, resampled: no copy ever hits another (ids private), so h = 0."""
    f = tmp_path / "one.json"
    f.write_text(
        json.dumps(
            {
                "block_size": B,
                "hash_id_scope": "local",
                "requests": [{"t": 0, "type": "n", "in": 40, "out": 1, "hash_ids": list(range(10))}],
            }
        )
    )
    pool = conversation_pool(read_weka(f))
    r = resample_simulate(pool, [10, 1000], lam0=1.0, horizon=50.0, warmup=0.0, replications=2)
    assert np.all(r.h == 0.0)


def test_determinism_and_seeds(tmp_path):
    pool = conversation_pool(read_weka(_weka_dir(tmp_path, C=6), arrival="uniform", span=20.0, seed=0))
    a = resample(pool, lam0=0.3, n_conversations=40, seed=7)
    b = resample(pool, lam0=0.3, n_conversations=40, seed=7)
    c = resample(pool, lam0=0.3, n_conversations=40, seed=8)
    for k in ("time", "prompt_tokens", "hash_offsets", "hashes", "conv", "origin", "measured", "starts"):
        assert np.array_equal(getattr(a, k), getattr(b, k)), k
    assert not np.array_equal(a.time, c.time)
    assert a.n_started == 40 == c.n_started
    r1 = resample_simulate(pool, [8, 30, 200], lam0=0.3, n_conversations=40, replications=3, seed=7)
    r2 = resample_simulate(pool, [8, 30, 200], lam0=0.3, n_conversations=40, replications=3, seed=7)
    assert np.array_equal(r1.token_hit_ratio, r2.token_hit_ratio, equal_nan=True)
    assert r1.seeds == [7, 8, 9]
    # replication r is the stream of seed + r
    st = resample(pool, lam0=0.3, n_conversations=40, seed=8)
    N = 200
    res = simulate_block(st.prompt_tokens, st.hash_offsets, st.hashes, N=N, block_size=B)
    assert r1.token_hit_ratio[1, 2] == pytest.approx(token_hit_ratio(res, st.measured), abs=1e-15)


def test_simulation_matches_per_capacity_simulator_both_orders(tmp_path):
    pool = conversation_pool(read_weka(_weka_dir(tmp_path, C=8, seed=2), arrival="uniform", span=30.0, seed=1))
    Ns = [pool.N_min, pool.N_min + 3, 40, 400]
    for engine in ("vllm", "vllm-0.23"):
        r = resample_simulate(pool, Ns, engine=engine, lam0=0.5, horizon=80.0, warmup=20.0, replications=2, seed=4)
        for i in range(2):
            st = resample(pool, lam0=0.5, horizon=80.0, warmup=20.0, seed=4 + i)
            for k, N in enumerate(Ns):
                res = simulate_block(st.prompt_tokens, st.hash_offsets, st.hashes, N=N, block_size=B, engine=engine)
                assert not res.rejected.any()
                m = st.measured
                assert r.token_hit_ratio[i, k] == pytest.approx(token_hit_ratio(res, m), abs=1e-14)
                assert r.block_hit_ratio[i, k] == pytest.approx(
                    res.hit_blocks[m].sum() / res.prompt_blocks[m].sum(), abs=1e-14
                )


def test_infinite_capacity_equals_within_conversation_reuse(tmp_path):
    """At a capacity holding every block, h = Σ min(leading ids seen before, (T−1)//b)·b / Σ T over the measured
    requests — counted here with a Python set over the resampled stream (cold at −w)."""
    pool = conversation_pool(read_weka(_weka_dir(tmp_path, C=6, seed=5), arrival="uniform", span=30.0, seed=2))
    r = resample_simulate(pool, [10**6], lam0=0.4, horizon=50.0, warmup=15.0, replications=1, seed=11)
    st = resample(pool, lam0=0.4, horizon=50.0, warmup=15.0, seed=11)
    seen: set = set()
    hit = tok = 0
    for q in range(st.time.shape[0]):
        ids = st.hashes[st.hash_offsets[q] : st.hash_offsets[q + 1]].tolist()
        run = 0
        for x in ids:
            if x not in seen:
                break
            run += 1
        T = int(st.prompt_tokens[q])
        if st.measured[q]:
            hit += min(run, (T - 1) // B) * B
            tok += T
        seen.update(ids)
    assert r.token_hit_ratio[0, 0] == pytest.approx(hit / tok, abs=1e-14)


def test_content_engine_against_ordered_dict_reference():
    from kvhit.sim.content.reference import simulate_content_reference
    from kvhit.workload import Exponential, WorkloadSpec, generate
    from kvhit.workload.dists import Geometric

    sp = WorkloadSpec.scm(0.5, 0.7, x=Geometric.from_mean(3), y=Geometric.from_mean(2), mean_w=10.0)
    tr = generate(sp, 0, n_conversations=60)
    tr.meta["block_size"] = 16
    pool = conversation_pool(tr)
    assert pool.rate == pytest.approx(0.5)
    Ns = [5, 20, 60]
    r = resample_simulate(pool, Ns, engine="content", scale=2.0, horizon=100.0, replications=2, seed=3)
    assert r.lam0 == pytest.approx(1.0) and r.metric == "blocks"
    st = resample(pool, scale=2.0, horizon=100.0, seed=4)
    for k, N in enumerate(Ns):
        hit = simulate_content_reference(st.conv, st.R, N).hit.astype(bool)
        m = st.measured
        h = np.where(hit & m, np.maximum(st.R_prev - 1, 0), 0).sum() / st.R[m].sum()
        if N >= pool.N_min:
            assert r.block_hit_ratio[1, k] == pytest.approx(h, abs=1e-14)
    _ = Exponential  # spec helpers imported for clarity


def test_poisson_starts_rate():
    """E[#starts in [0, H]] = λ0·H: over 300 seeds the mean count is within 4 standard errors."""
    from kvhit.workload.production_trace import ProductionTrace

    n = 1
    pt = ProductionTrace(
        time=np.zeros(n),
        prompt_tokens=np.array([8]),
        output_tokens=np.zeros(n, np.int64),
        hash_offsets=np.array([0, 2]),
        hashes=np.array([1, 2]),
        block_size=B,
        session=np.zeros(n, np.int64),
        agent=np.zeros(n, np.int32),
        model=None,
        models=(),
        file_index=np.zeros(n, np.int32),
        record=np.zeros(n, np.int64),
        sub_record=np.full(n, -1, np.int32),
        files=("x",),
        format="weka",
        session_source="file",
        rechained=False,
        n_partial_dropped=0,
    )
    pool = conversation_pool(pt)
    lam, H = 0.7, 50.0
    counts = np.array([resample(pool, lam0=lam, horizon=H, seed=s).n_started for s in range(300)])
    assert abs(counts.mean() - lam * H) < 4 * np.sqrt(lam * H / 300)


def test_infeasible_capacities_get_no_ratio(tmp_path):
    pool = conversation_pool(read_weka(_weka_dir(tmp_path, C=5), arrival="uniform", span=20.0, seed=0))
    Ns = [1, pool.N_min - 1, pool.N_min]
    r = resample_simulate(pool, Ns, lam0=0.3, horizon=30.0, replications=2)
    assert np.isnan(r.h[:, :2]).all() and np.isfinite(r.h[:, 2]).all()
    m, hw = r.mean_ci()
    assert np.isnan(m[:2]).all() and np.isfinite(m[2])
    d = r.to_dict()
    assert d["feasibility"]["feasible"] == [False, False, True]
    json.dumps(d)  # serializable (NaN handled by the front end's strict encoder)


def test_feasibility_by_hand():
    # b = 4: T = 3, 4, 5, 9, 16 → ceil(T/4) = 1, 1, 2, 3, 4
    T = np.array([3, 4, 5, 9, 16])
    f = feasibility(T, 4, [1, 2, 3, 4, 10])
    assert f.N_min == 4
    assert f.feasible.tolist() == [False, False, False, True, True]
    assert f.refused_requests.tolist() == [3 / 5, 2 / 5, 1 / 5, 0.0, 0.0]
    assert f.refused_tokens.tolist() == [(5 + 9 + 16) / 37, (9 + 16) / 37, 16 / 37, 0.0, 0.0]
    # measured subset: shares over the measured requests, N_min over all
    g = feasibility(T, 4, [3], mask=np.array([True, True, True, True, False]))
    assert g.N_min == 4 and not g.feasible[0] and g.refused_requests[0] == 0.0
    # colocated: the response counts, all but its last token (T + m − 1 tokens hold KV; vLLM 0.32.0, make live)
    h = feasibility(np.array([3]), 4, [1, 2], response_tokens=np.array([2]))
    assert h.feasible.tolist() == [True, True]
    h = feasibility(np.array([3]), 4, [1, 2], response_tokens=np.array([3]))
    assert h.feasible.tolist() == [False, True]


def test_bad_arguments(tmp_path):
    pool = conversation_pool(read_weka(_weka_dir(tmp_path, C=3)))
    with pytest.raises(ResampleError, match="lam0"):
        resample(pool, horizon=10.0)
    with pytest.raises(ResampleError, match="horizon"):
        resample(pool, lam0=1.0)
    with pytest.raises(ResampleError, match="lam0"):
        resample(pool, lam0=float("nan"), horizon=1.0)
    with pytest.raises(ResampleError, match="warmup"):
        resample(pool, lam0=1.0, horizon=1.0, warmup=-1.0)
    with pytest.raises(ResampleError, match="content"):
        resample_simulate(pool, [10], engine="content", lam0=1.0, horizon=1.0)
    with pytest.raises(ResampleError, match="engine"):
        resample_simulate(pool, [10], engine="sglang", lam0=1.0, horizon=1.0)


@settings(max_examples=60, deadline=None)
@given(
    T=st.lists(st.integers(1, 500), min_size=1, max_size=40),
    b=st.integers(1, 64),
    Ns=st.lists(st.integers(1, 600), min_size=1, max_size=10),
)
def test_feasibility_invariants(T, b, Ns):
    T = np.array(T)
    f = feasibility(T, b, Ns)
    need = -(-T // b)
    for k, N in enumerate(Ns):
        assert f.feasible[k] == (N >= need.max()) == (f.refused_requests[k] == 0)
        assert f.refused_requests[k] == pytest.approx((need > N).mean(), abs=1e-15)
        assert f.refused_tokens[k] == pytest.approx(T[need > N].sum() / T.sum(), abs=1e-15)
    o = np.argsort(Ns, kind="stable")
    assert np.all(np.diff(f.refused_requests[o]) <= 0) and np.all(np.diff(f.refused_tokens[o]) <= 1e-15)
