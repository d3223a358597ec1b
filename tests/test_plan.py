"""Capacity planning answers are consistent inverses of the predictor, and impossible targets are refused."""

from __future__ import annotations

import numpy as np
import pytest

from kvhit.estimate import theory
from kvhit.plan.planner import PlanError, capacity, make_workload, plan
from kvhit.workload import Geometric, WorkloadSpec, generate


@pytest.fixture(scope="module")
def spec():
    return WorkloadSpec.scm(0.5, 0.75, x=Geometric.from_mean(4), y=Geometric.from_mean(3), mean_w=60.0)


def test_capacity_matches_paper():
    c = capacity("qwen3-8b", kv_gb=40)
    assert (c.N, c.bytes_per_block) == (2275, 18_874_368)
    assert capacity("qwen3-8b", kv_gb=40, dtype="fp8").N == 4551
    with pytest.raises(PlanError):
        capacity("qwen3-8b")


def test_plan_answers_are_inverses(spec):
    wl = make_workload(spec, engine="paper")
    cap = capacity("qwen3-8b", kv_gb=10)
    p = plan(wl, cap, target=0.5)
    assert p.h_at_capacity == pytest.approx(float(theory.h_mean_field(spec, cap.N, practical=True)))
    h = lambda N, lam=spec.lam0: float(theory.h_mean_field(spec, N, lam0=lam, practical=True))  # noqa: E731
    assert h(p.N_for_target) >= 0.5 > h(p.N_for_target - 1)
    assert p.gib_for_target == pytest.approx(p.N_for_target * cap.bytes_per_block / 2**30)
    lm = p.lam0_max_for_target
    assert h(cap.N, lm) >= 0.5 - 1e-9 and h(cap.N, lm * (1 + 1e-6)) < 0.5
    assert p.saved_fraction == pytest.approx(p.h_at_capacity)
    assert p.saved_prefill_tokens_per_s > 0


def test_target_above_ceiling_is_refused(spec):
    wl = make_workload(spec, engine="paper")
    with pytest.raises(PlanError, match="h_max"):
        plan(wl, None, target=0.73)  # practical ceiling A_H_hash/A_R < p = 0.75


@pytest.mark.parametrize("engine", ["vllm", "vllm-0.23", "content"])
def test_engine_plan_on_trace_inverse_and_verify(spec, engine):
    tr = generate(spec, 1, n_conversations=6000)
    tr.meta.update(n_warm=1000, block_size=16)
    wl = make_workload(tr, engine=engine)
    cap = capacity("qwen3-8b", kv_gb=5, block_size=16)
    p = plan(wl, cap, target=0.3, verify=True)
    v = p.verify
    assert 0 < v["h_simulated"] < wl.h_max and np.isfinite(v["difference"])
    h = lambda N: float(wl.predict(np.array([float(N)]), np.array([wl.lam0]))[0])  # noqa: E731
    assert h(p.N_for_target) >= 0.3 > h(p.N_for_target - 1)
    lm = p.lam0_max_for_target
    hl = lambda lam: float(wl.predict(np.array([float(cap.N)]), np.array([lam]))[0])  # noqa: E731
    assert hl(lm * (1 - 1e-4)) >= 0.3 > hl(lm * (1 + 1e-4))


def test_unknown_engine_refused(spec):
    with pytest.raises(PlanError, match="engine"):
        make_workload(spec, engine="tensorrt-llm")


def test_sglang_workload_is_the_sglang_estimator_at_the_same_memory(spec):
    """engine="sglang": N blocks of b tokens = an SGLang pool of N·b tokens (kvhit.estimate.sglang)."""
    from kvhit.estimate.sglang import estimate_sglang, sglang_accounting
    from kvhit.workload.dists import EmpiricalW

    wl = make_workload(spec, engine="sglang", sample_conversations=400, seed=2)
    tr = wl.trace
    measured = tr.conv_index()[0] >= int(tr.meta["n_warm"])
    sa = sglang_accounting(tr, block_size=128, mask=measured)
    F = EmpiricalW(sa.acc.W)
    N = np.array([200.0, 800.0])
    want = estimate_sglang(sa, N * 128, spec.lam0, F).h
    np.testing.assert_allclose(wl.predict(N, np.full(2, spec.lam0)), want, rtol=1e-12)
    assert wl.metric == "tokens" and wl.h_max == sa.h_max
