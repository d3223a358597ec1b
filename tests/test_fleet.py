"""Fleet simulator (kvhit.fleet.simulate): equal to the plain-Python reference, fast path equal to the step-wise
path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.fleet.reference import reference_fleet
from kvhit.fleet.routers import make_router
from kvhit.fleet.simulate import simulate_fleet
from kvhit.sim.vllm.block import simulate_block
from kvhit.sim.vllm.blockids import hashes_from_block_counts

ROUTERS = [
    ("round-robin", {}),
    ("random", {}),
    ("session", {}),
    ("sticky", {"ttl": 3.0}),
    ("least-loaded", {}),
    ("least-loaded", {"metric": "prefill_tokens"}),
    ("dynamo", {}),
    ("dynamo", {"temperature": 0.5, "request_weight": 1.0}),
    ("llm-d", {}),
    ("sglang", {"mode": "precise", "balance_abs_threshold": 1, "balance_rel_threshold": 1.0}),
    ("sglang", {"mode": "precise"}),
    # approximate (shadow) modes and Dynamo's overlap credit
    ("dynamo", {"mode": "approx", "ttl": 2.0}),
    ("dynamo", {"overlap_score_credit": 0.5, "overlap_score_weight": 2.0, "request_weight": 0.5}),
    ("dynamo", {"mode": "approx", "temperature": 1.0}),
    ("llm-d", {"mode": "approx"}),
    ("llm-d", {"mode": "approx", "queue_weight": 0.0, "kv_weight": 0.0}),
    ("sglang", {}),
    ("sglang", {"balance_abs_threshold": 1, "balance_rel_threshold": 1.0, "cache_threshold": 0.1}),
]


@st.composite
def fleets(draw, max_n=30):
    b = draw(st.integers(1, 4))
    n = draw(st.integers(1, max_n))
    nconv = draw(st.integers(1, 6))
    conv = np.array(draw(st.lists(st.integers(0, nconv - 1), min_size=n, max_size=n)))
    inc = draw(st.lists(st.integers(1, 3 * b), min_size=n, max_size=n))
    last: dict[int, int] = {}
    T = []
    for c, d in zip(conv, inc, strict=True):
        last[c] = last.get(c, 0) + d + draw(st.integers(0, b))
        T.append(last[c] - 0)
    T = np.array(T, np.int64)
    off, h = hashes_from_block_counts(conv, T // b, shared_prefix_blocks=draw(st.integers(0, 2)))
    R = draw(st.integers(1, 4))
    Ns = draw(st.lists(st.integers(1, 12), min_size=R, max_size=R))
    timed = draw(st.booleans())
    times = np.cumsum(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=n, max_size=n)))
    hold = np.array(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=n, max_size=n))) if timed else None
    lag = draw(st.sampled_from([0.0, 0.0, 1.5]))
    return dict(T=T, off=off, h=h, conv=conv, b=b, Ns=Ns, times=times, hold=hold, lag=lag, seed=draw(st.integers(0, 3)))


@pytest.mark.parametrize("router,params", ROUTERS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(ROUTERS)])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(f=fleets(), engine=st.sampled_from(["vllm", "vllm-0.23"]))
def test_stepwise_equals_reference(router, params, f, engine):
    res = simulate_fleet(
        f["T"], f["off"], f["h"], f["conv"], Ns=f["Ns"], block_size=f["b"], router=router, router_params=params,
        engine=engine, times=f["times"], hold=f["hold"], seed=f["seed"], lag=f["lag"], fast=False,
    )  # fmt: skip
    rep, hit, wait, rej = reference_fleet(
        f["T"], f["off"], f["h"], f["conv"], Ns=f["Ns"], b=f["b"], router=router, params=params, engine=engine,
        times=f["times"], hold=f["hold"], seed=f["seed"], lag=f["lag"],
    )  # fmt: skip
    assert res.replica.tolist() == rep
    assert res.hit_blocks.tolist() == hit
    assert res.rejected.tolist() == rej
    np.testing.assert_array_equal(res.wait, np.array(wait))


@pytest.mark.parametrize("router", ["round-robin", "random", "session"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(f=fleets(), engine=st.sampled_from(["vllm", "vllm-0.23"]))
def test_fast_path_equals_stepwise(router, f, engine):
    kw = dict(
        Ns=f["Ns"], block_size=f["b"], router=router, engine=engine, times=f["times"], hold=f["hold"], seed=f["seed"]
    )
    a = simulate_fleet(f["T"], f["off"], f["h"], f["conv"], fast=True, **kw)
    s = simulate_fleet(f["T"], f["off"], f["h"], f["conv"], fast=False, **kw)
    for x in ("replica", "hit_blocks", "new_blocks", "rejected", "wait"):
        np.testing.assert_array_equal(getattr(a, x), getattr(s, x), err_msg=x)


def test_one_replica_is_the_block_simulator():
    rng = np.random.default_rng(1)
    conv = rng.integers(0, 20, 300)
    T = np.zeros(300, np.int64)
    last: dict[int, int] = {}
    for r, c in enumerate(conv):
        last[c] = last.get(c, 0) + int(rng.integers(1, 40))
        T[r] = last[c]
    off, h = hashes_from_block_counts(conv, T // 8)
    times = np.arange(300) * 0.1
    hold = rng.uniform(0, 2, 300)
    ref = simulate_block(T, off, h, N=30, block_size=8, times=times, hold=hold)
    for router in ("dynamo", "llm-d", "sglang", "least-loaded"):
        res = simulate_fleet(T, off, h, conv, Ns=[30], block_size=8, router=router, times=times, hold=hold)
        np.testing.assert_array_equal(res.hit_blocks, ref.hit_blocks)
        np.testing.assert_array_equal(res.wait, ref.wait)


def test_affinity_keeps_conversations_together_and_round_robin_scatters():
    conv = np.repeat(np.arange(50), 4)
    T = np.tile(np.array([16, 32, 48, 64]), 50)
    off, h = hashes_from_block_counts(conv, T // 8)
    big = [10_000] * 4
    s = simulate_fleet(T, off, h, conv, Ns=big, block_size=8, router="session")
    for c in range(50):
        assert len(set(s.replica[conv == c].tolist())) == 1
    rr = simulate_fleet(T, off, h, conv, Ns=big, block_size=8, router="round-robin")
    # turns of a conversation are consecutive, so round-robin puts turn j on replica (4c + j) mod 4 = j: no reuse
    assert rr.token_hit_ratio() == 0.0
    assert s.token_hit_ratio() > 0.5
    dyn = simulate_fleet(T, off, h, conv, Ns=big, block_size=8, router="dynamo")
    assert dyn.token_hit_ratio() == pytest.approx(s.token_hit_ratio())  # no load without holds: overlap decides


def test_bad_router_parameters():
    with pytest.raises(ValueError, match="router"):
        make_router("nope", 2)
    with pytest.raises(ValueError, match="replicas"):
        make_router("random", 0)
    with pytest.raises(ValueError, match="overlap_score_weight"):
        make_router("dynamo", 2, overlap_score_weight=-1.0)
    with pytest.raises(ValueError, match="unknown parameter"):
        make_router("random", 2, weight=1.0)


def test_seeded_and_deterministic():
    conv = np.arange(200) % 17
    T = 8 * (1 + np.arange(200) // 17)
    off, h = hashes_from_block_counts(conv, T // 8)
    kw = dict(Ns=[40, 40, 80], block_size=8, router="random", times=np.arange(200.0), hold=np.full(200, 3.0))
    a = simulate_fleet(T, off, h, conv, seed=5, **kw)
    b = simulate_fleet(T, off, h, conv, seed=5, **kw)
    c = simulate_fleet(T, off, h, conv, seed=6, **kw)
    np.testing.assert_array_equal(a.replica, b.replica)
    assert not np.array_equal(a.replica, c.replica)
