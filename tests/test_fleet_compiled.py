"""Compiled fleet pass for the KV-aware routers (kvhit.fleet.compiled) equal, request by request, to the step-wise
fleet (the reference path of kvhit.fleet.simulate, itself tested equal to kvhit.fleet.reference)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import njit

from kvhit.fleet.compiled import _np_sum
from kvhit.fleet.simulate import simulate_fleet
from kvhit.sim.vllm.blockids import hashes_from_block_counts
from kvhit.workload.requests import kv_tokens
from test_fleet import fleets

ROUTERS = [
    ("sticky", {"ttl": 3.0}),
    ("sticky", {}),
    ("least-loaded", {}),
    ("least-loaded", {"metric": "prefill_tokens"}),
    ("dynamo", {}),
    ("dynamo", {"mode": "approx", "ttl": 2.0}),
    ("dynamo", {"overlap_score_credit": 0.5, "overlap_score_weight": 2.0, "request_weight": 0.5}),
    ("dynamo", {"overlap_score_weight": 0.0}),  # cost = decode blocks only: ties everywhere
    ("dynamo", {"temperature": 0.5, "request_weight": 1.0}),
    ("dynamo", {"mode": "approx", "temperature": 1.0, "ttl": 1.0}),
    ("llm-d", {}),
    ("llm-d", {"mode": "approx"}),
    ("llm-d", {"mode": "approx", "queue_weight": 0.0, "kv_weight": 0.0}),
    ("llm-d", {"prefix_weight": 0.0, "queue_weight": 0.0, "kv_weight": 0.0}),  # all scores tie
    ("sglang", {}),
    ("sglang", {"mode": "precise"}),
    ("sglang", {"mode": "precise", "balance_abs_threshold": 1, "balance_rel_threshold": 1.0}),
    ("sglang", {"balance_abs_threshold": 1, "balance_rel_threshold": 1.0, "cache_threshold": 0.1}),
    ("sglang", {"cache_threshold": 0.0}),
]
FIELDS = ("replica", "hit_blocks", "new_blocks", "rejected", "wait")


def _both(T, off, h, conv, **kw):
    a = simulate_fleet(T, off, h, conv, fast=True, **kw)
    s = simulate_fleet(T, off, h, conv, fast=False, **kw)
    for x in FIELDS:
        np.testing.assert_array_equal(getattr(a, x), getattr(s, x), err_msg=x)
    return a, s


@pytest.mark.parametrize("router,params", ROUTERS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(ROUTERS)])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(f=fleets(), engine=st.sampled_from(["vllm", "vllm-0.23"]))
def test_compiled_equals_stepwise(router, params, f, engine):
    a, s = _both(
        f["T"], f["off"], f["h"], f["conv"], Ns=f["Ns"], block_size=f["b"], router=router, router_params=params,
        engine=engine, times=f["times"], hold=f["hold"], seed=f["seed"], lag=f["lag"],
    )  # fmt: skip
    if f["hold"] is None:  # same operations: the replicas' probes/touches/allocations/frees plus the router's probes
        assert a.block_ops + a.router_ops == s.block_ops


@pytest.mark.parametrize("router,params", [("dynamo", {}), ("llm-d", {"mode": "approx"}), ("sglang", {})])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(f=fleets(), resp=st.lists(st.integers(0, 9), min_size=30, max_size=30))
def test_compiled_equals_stepwise_colocated(router, params, f, resp):
    n = f["T"].shape[0]
    m = np.array(resp[:n], np.int64)
    L = kv_tokens(f["T"], m)
    off, h = hashes_from_block_counts(f["conv"], L // f["b"])
    _both(
        f["T"], off, h, f["conv"], Ns=f["Ns"], block_size=f["b"], router=router, router_params=params,
        colocated=True, response_tokens=m, times=f["times"], hold=f["hold"], seed=f["seed"], lag=f["lag"],
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1e-300, 1e300), min_size=1, max_size=400))
def test_np_sum_is_numpys_pairwise_sum(xs):
    a = np.array(xs, np.float64)
    assert _np_sum(a, a.size) == np.sum(a)


def test_default_is_compiled_and_equal_on_a_sharegpt_sample(monkeypatch):
    import kvhit.fleet.simulate as fs
    from kvhit.sim.runner import block_requests
    from kvhit.workload.sharegpt_trace import build_sharegpt_trace

    tr, _ = build_sharegpt_trace(n_warm=50, n_meas=250, seed=3, lam0=2.0, block_size=16)
    rq = block_requests(tr, block_size=16)
    T, off, h = (np.asarray(x, np.int64) for x in (rq.prompt_tokens, rq.hash_offsets, rq.hashes))
    conv = tr.dense_conv().astype(np.int64)
    times = np.asarray(tr["time"], np.float64)
    hold = T / 2000.0
    for router, params in [("dynamo", {}), ("dynamo", {"temperature": 0.3}), ("llm-d", {}), ("sticky", {}),
                           ("sglang", {}), ("dynamo", {"mode": "approx"})]:  # fmt: skip
        kw = dict(Ns=[300, 300, 600], block_size=16, router=router, router_params=params, times=times, hold=hold)
        with monkeypatch.context() as mp:  # the default must not take the step-wise path
            mp.setattr(fs, "_stepwise", None)
            d = simulate_fleet(T, off, h, conv, **kw)
        _, s = _both(T, off, h, conv, **kw)
        np.testing.assert_array_equal(d.replica, s.replica)
        np.testing.assert_array_equal(d.hit_blocks, s.hit_blocks)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(f=fleets(), resp=st.lists(st.integers(0, 9), min_size=30, max_size=30))
def test_colocated_one_replica_is_the_block_simulator(f, resp):
    """The step-wise fleet once gave the engine ``L − T`` output tokens, so it allocated ``kv_tokens`` twice over
    (``L − 1`` tokens for a response of two or more): one replica must be exactly simulate_block."""
    from kvhit.sim.vllm.block import simulate_block

    n = f["T"].shape[0]
    m = np.array(resp[:n], np.int64)
    off, h = hashes_from_block_counts(f["conv"], kv_tokens(f["T"], m) // f["b"])
    kw = dict(block_size=f["b"], colocated=True, response_tokens=m, times=f["times"], hold=f["hold"])
    ref = simulate_block(f["T"], off, h, N=f["Ns"][0], **kw)
    for fast in (True, False):
        res = simulate_fleet(f["T"], off, h, f["conv"], Ns=f["Ns"][:1], router="dynamo", fast=fast, **kw)
        np.testing.assert_array_equal(res.hit_blocks, ref.hit_blocks)
        np.testing.assert_array_equal(res.new_blocks, ref.new_blocks)
        np.testing.assert_array_equal(res.wait, ref.wait)


@njit(cache=True)
def _nb_exp(x, out):
    for i in range(x.shape[0]):
        out[i] = np.exp(x[i])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e3, 0.0), min_size=1, max_size=200))
def test_numba_exp_is_libms(xs):
    """The one assumption of softmax equality: numba's exp returns libm's value (``math.exp``, what the step-wise
    Dynamo router takes) on the softmax's arguments. NumPy's vectorised exp is not it on every CPU."""
    x = np.array(xs, np.float64)
    out = np.empty_like(x)
    _nb_exp(x, out)
    np.testing.assert_array_equal(out, [math.exp(v) for v in xs])
