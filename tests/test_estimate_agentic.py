"""The agentic estimator (kvhit.estimate.agentic): closed forms, invariants and agreement with the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.estimate.agentic import AgenticError, estimate_trace
from kvhit.estimate.agentic_displacement import compound_poisson_cdf
from kvhit.sim.vllm.curve import block_curve
from kvhit.workload.production import read_mooncake, read_weka
from kvhit.workload.reuse import request_reuse

DATA = Path(__file__).parent / "data" / "production"
MOON = DATA / "mooncake_small.jsonl"
W22, W26, W14 = DATA / "weka_0022.json", DATA / "weka_0026.json", DATA / "weka_0014_cut.json"


def _direct_cdf(nu: np.ndarray, G: int) -> np.ndarray:
    """Reference: Σ_k P(K = k) · ν̂^{*k} by repeated direct convolution (K ~ Poisson(Σν), ν̂ = ν/Σν)."""
    lam = nu[1:].sum()
    p = np.zeros(G)
    jump = np.zeros(G)
    jump[1 : min(G, nu.shape[0])] = nu[1:G] / lam
    conv = np.zeros(G)
    conv[0] = 1.0
    pk = np.exp(-lam)
    for k in range(200):
        p += pk * conv
        conv = np.convolve(conv, jump)[:G]
        pk *= lam / (k + 1)
    return np.cumsum(p)


@pytest.mark.parametrize("lam", [0.3, 4.0, 40.0])
def test_compound_poisson_matches_direct_convolution(lam):
    rng = np.random.default_rng(1)
    G = 300
    nu = np.zeros(G + 1)
    nu[rng.integers(1, 80, 12)] += rng.random(12)
    nu *= lam / nu.sum()
    got = compound_poisson_cdf(nu, G)[0]
    ref = _direct_cdf(nu, G)
    assert np.abs(got - ref).max() < 1e-8


def test_compound_poisson_monte_carlo_seeded():
    rng = np.random.default_rng(7)
    G = 200
    sizes, w = np.array([3, 17, 60]), np.array([0.5, 1.0, 0.7])
    nu = np.zeros(G + 1)
    nu[sizes] = w
    K = rng.poisson(w.sum(), 200_000)
    D = np.array([rng.choice(sizes, k, p=w / w.sum()).sum() for k in K[:20000]])
    emp = np.array([(D <= x).mean() for x in range(G)])
    assert np.abs(compound_poisson_cdf(nu, G)[0] - emp).max() < 0.015  # 20,000 draws: 4.5 σ ≈ 0.016


def _sim(pt, Ns, engine):
    rq = pt.to_block_requests()
    return block_curve(rq.prompt_tokens, rq.hash_offsets, rq.hashes, block_size=rq.block_size, Ns=Ns, engine=engine)


@pytest.mark.parametrize("engine", ["vllm", "vllm-0.23"])
def test_replay_form_equals_simulator_on_weka(engine):
    pt = read_weka([W22, W26, W14], arrival="uniform", span=600, seed=3)
    d = pt.describe()
    Ns = np.unique(np.geomspace(d["min_N"], 4 * d["distinct_blocks"], 40).astype(np.int64))
    sim = _sim(pt, Ns, engine)["token_hit_ratio"]
    est = estimate_trace(pt, Ns, engine=engine, form="replay")
    assert np.abs(est.h - sim).max() < 5e-3


def test_replay_with_measurement_mask_equals_masked_simulator():
    pt = read_weka([W22, W26, W14], arrival="uniform", span=300, seed=5)
    d = pt.describe()
    Ns = np.unique(np.geomspace(d["min_N"], 2 * d["distinct_blocks"], 25).astype(np.int64))
    mask = pt.time > np.median(pt.time)
    rq = pt.to_block_requests()
    sim = block_curve(
        rq.prompt_tokens, rq.hash_offsets, rq.hashes, block_size=rq.block_size, Ns=Ns, engine="vllm", mask=mask
    )["token_hit_ratio"]
    assert np.abs(estimate_trace(pt, Ns, form="replay", mask=mask).h - sim).max() < 5e-3


@pytest.mark.parametrize("engine", ["vllm", "vllm-0.23"])
def test_one_conversation_at_a_time_is_exact(engine):
    """Conversations that never overlap: D_other = 0. The replay form sees it in the timing; the stationary
    form at λ0 → 0 (one conversation at a time) must give the same answer."""
    pt = read_weka([W22, W26, W14], arrival="sequential", gap=10.0)
    d = pt.describe()
    Ns = np.unique(np.geomspace(d["min_N"], 2 * d["distinct_blocks"], 30).astype(np.int64))
    sim = _sim(pt, Ns, engine)["token_hit_ratio"]
    assert np.abs(estimate_trace(pt, Ns, engine=engine, form="replay").h - sim).max() < 5e-3
    assert np.abs(estimate_trace(pt, Ns, engine=engine, lam0=1e-12).h - sim).max() < 5e-3
    # at a high rate the other conversations displace: strictly fewer hits somewhere
    assert np.any(estimate_trace(pt, Ns, engine=engine, lam0=1.0).h < sim - 0.01)


def test_result_object_and_infeasible():
    pt = read_mooncake(MOON)
    u = request_reuse(pt)
    Ns = np.array([1, 5, 50, 500, 5000])
    e = estimate_trace(u, Ns)
    assert e.N_min == int(u.prompt_blocks.max())
    assert e.infeasible.tolist() == [bool(N < e.N_min) for N in Ns]
    assert np.all(e.rejected_requests[~e.infeasible] == 0) and e.rejected_requests[0] > 0
    d = e.to_dict()
    json.dumps(d, allow_nan=False)
    assert d["h_max"] == pytest.approx(u.ceiling())
    with pytest.raises(AgenticError, match="engine"):
        estimate_trace(u, Ns, engine="sglang")
    with pytest.raises(AgenticError, match="Ns"):
        estimate_trace(u, [0, 5])
    with pytest.raises(AgenticError, match="lam0"):
        estimate_trace(u, Ns, form="replay", lam0=1.0)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 1000),
    engine=st.sampled_from(["vllm", "vllm-0.23"]),
    form=st.sampled_from(["poisson", "replay"]),
    lam0=st.sampled_from([None, 0.01, 1.0]),
)
def test_monotone_and_bounded(seed, engine, form, lam0):
    if form == "replay" and lam0 is not None:
        return
    pt = read_weka([W22, W26, W14], arrival="uniform", span=900, seed=seed)
    u = request_reuse(pt)
    Ns = np.unique(np.geomspace(u.prompt_blocks.max(), 4 * u.distinct_blocks, 25).astype(np.int64))
    e = estimate_trace(u, Ns, engine=engine, form=form, lam0=lam0)
    assert np.all(np.diff(e.h) >= -1e-9)
    assert np.all(e.h >= -1e-12) and np.all(e.h <= e.h_max + 1e-9)


REAL_WEKA = (
    Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces" / "weka_kv_cache_tester" / "traces"
)


@pytest.mark.slow
@pytest.mark.skipif(not REAL_WEKA.is_dir(), reason="WEKA traces not present")
@pytest.mark.parametrize("engine", ["vllm", "vllm-0.23"])
def test_held_in_weka_pool_within_measured_bound(engine):
    """Design-set WEKA pool (trace_0001–0029, uniform starts over 1 h, seed 0): the Poisson form is within
    0.015 of the simulator on the feasible 10–90 %-of-ceiling band (measured: 0.008; benchmarks/agentic_accuracy.py)."""
    files = sorted(str(p) for p in REAL_WEKA.glob("trace_*.json") if int(p.stem.split("_")[1]) < 30)
    pt = read_weka(files, arrival="uniform", span=3600, seed=0)
    d = pt.describe()
    Ns = np.unique(np.geomspace(d["min_N"], 4 * d["distinct_blocks"], 120).astype(np.int64))
    rq = pt.to_block_requests()
    sim = block_curve(
        rq.prompt_tokens, rq.hash_offsets, rq.hashes, block_size=rq.block_size, Ns=Ns, engine=engine, fallback="nan"
    )["token_hit_ratio"]
    hm = d["ideal_token_hit_ratio"]
    band = (sim >= 0.1 * hm) & (sim <= 0.9 * hm)
    assert band.sum() >= 5
    est = estimate_trace(pt, Ns, engine=engine)
    assert np.abs(est.h - sim)[band].max() < 0.015


def test_spec_entry_point_single_turn_and_monotone():
    from kvhit.estimate.agentic import estimate_spec_agentic
    from kvhit.workload.dists import Constant, Exponential, Geometric
    from kvhit.workload.spec import IIDIncrements, WorkloadSpec

    spec = WorkloadSpec(0.05, Geometric(0.25), IIDIncrements(Constant(40)), Exponential(30.0))
    Ns = np.array([50, 200, 800, 3200, 12800])
    e = estimate_spec_agentic(spec, Ns, conversations=300, seed=1)
    assert np.all(np.diff(e.h) >= -1e-12) and e.h[-1] <= e.h_max + 1e-12
    assert e.h[-1] > 0.9 * e.h_max  # a pool far larger than the live histories keeps almost everything
    with pytest.raises(AgenticError, match="spec"):
        estimate_spec_agentic(object(), Ns)
