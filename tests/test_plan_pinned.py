"""Every planning answer pinned against an independent computation: the simulator at the planned capacity, the
estimator called directly, closed forms, and the answers' definitions as inverses of one another."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvhit.estimate import theory
from kvhit.estimate.accounting import engine_accounting
from kvhit.estimate.engine import estimate_engine
from kvhit.estimate.mean_field import empirical_F
from kvhit.estimate.trace_stats import trace_moments
from kvhit.plan import hardware
from kvhit.plan.planner import PlanError, _largest_lam0, _smallest_capacity, capacity, make_workload, plan
from kvhit.sim.runner import simulate_trace_block, simulate_trace_content
from kvhit.workload import Geometric, Window, WorkloadSpec, generate

B = 16  # tokens per block: small blocks keep the traces small
N_WARM = 500
TARGET = 0.3


@pytest.fixture(scope="module")
def spec():
    # λ0 = 0.5 ≠ 1: an answer that drops its λ0 factor is wrong by 2×
    return WorkloadSpec.scm(0.5, 0.75, x=Geometric.from_mean(4), y=Geometric.from_mean(3), mean_w=60.0)


@pytest.fixture(scope="module")
def trace(spec):
    tr = generate(spec, 7, n_conversations=3000)
    tr.meta.update(n_warm=N_WARM, block_size=B)
    return tr


def _cap_at(N: int, model: str = "qwen3-8b"):
    bpb = hardware.resolve_model(model).bytes_per_block(B)
    cap = capacity(model, kv_gb=N * bpb / hardware.GIB, block_size=B)
    assert cap.N == N
    return cap


def _measured(tr):
    ids = tr.conversations()["conv"]
    return ids >= N_WARM


@pytest.mark.parametrize("engine", ["vllm", "vllm-0.23", "content"])
def test_h_at_capacity_is_the_engine_estimator_called_directly(trace, engine):
    wl = make_workload(trace, engine=engine)
    cap = _cap_at(1500)
    p = plan(wl, cap)
    measured = _measured(trace)
    acc = engine_accounting(trace, engine=engine, metric="tokens", block_size=B, mask=measured)
    F = empirical_F(trace_moments(trace, measured))
    h = float(estimate_engine(acc, 1500, trace.meta["lam0"], F).h)
    assert p.h_at_capacity == pytest.approx(h, rel=1e-12)
    assert wl.lam0 == trace.meta["lam0"] == 0.5


@pytest.mark.parametrize("engine", ["vllm", "vllm-0.23", "content"])
def test_verify_simulates_at_the_planned_capacity(trace, engine):
    wl = make_workload(trace, engine=engine)
    N = 1500
    p = plan(wl, _cap_at(N), verify=True)
    window = Window.warmup_conversations(trace, N_WARM)
    if engine == "content":
        h_sim = simulate_trace_content(trace, N, window=window, practical=True).h
        # and not at any other capacity: the curve is strictly increasing around N
        assert simulate_trace_content(trace, N // 2, window=window, practical=True).h < h_sim
    else:
        m = simulate_trace_block(trace, N, engine=engine, window=window)[1]
        h_sim = m["token_hit_ratio"]
        assert simulate_trace_block(trace, N // 2, engine=engine, window=window)[1]["token_hit_ratio"] < h_sim
    v = p.verify
    assert v["h_simulated"] == pytest.approx(h_sim, abs=1e-15)
    assert v["h_predicted"] == p.h_at_capacity
    assert v["difference"] == pytest.approx(p.h_at_capacity - h_sim, abs=1e-15)
    assert v["metric"] == ("blocks" if engine == "content" else "tokens")


def test_verify_uses_the_planned_metric(trace):
    wl = make_workload(trace, engine="vllm", metric="blocks")
    p = plan(wl, _cap_at(1500), verify=True)
    window = Window.warmup_conversations(trace, N_WARM)
    m = simulate_trace_block(trace, 1500, engine="vllm", window=window)[1]
    assert p.verify["h_simulated"] == pytest.approx(m["h_blocks"], abs=1e-15)
    assert m["h_blocks"] != pytest.approx(m["token_hit_ratio"], abs=1e-4)  # the two metrics differ here


def test_prefill_saved_is_h_times_lam0_times_prompt_tokens(trace):
    wl = make_workload(trace, engine="vllm")
    p = plan(wl, _cap_at(1500))
    # prompt tokens per measured conversation, computed here from the trace: T_j = R_j·b − 1 (no cum_tokens)
    assert "cum_tokens" not in trace.cols
    conv = trace["conv"]
    meas = conv >= N_WARM
    tokens = (trace["R"][meas] * B - 1).sum() / np.unique(conv[meas]).size
    assert wl.prompt_tokens_per_conv == pytest.approx(tokens, rel=1e-12)
    assert p.saved_prefill_tokens_per_s == pytest.approx(p.h_at_capacity * 0.5 * tokens, rel=1e-12)
    assert p.saved_fraction == p.h_at_capacity


def test_prefill_saved_on_a_spec_uses_the_closed_form(spec):
    wl = make_workload(spec, engine="paper", block_size=128)
    cap = capacity("qwen3-8b", kv_gb=40)
    p = plan(wl, cap)
    m = theory.moments(spec)
    h = float(theory.h_mean_field(spec, cap.N, practical=True))
    assert p.h_at_capacity == pytest.approx(h, rel=1e-12)
    assert p.saved_prefill_tokens_per_s == pytest.approx(h * spec.lam0 * m.A_R * 128, rel=1e-12)
    assert wl.h_max == pytest.approx(m.A_H_hash / m.A_R, rel=1e-12)


@pytest.mark.parametrize("engine", ["vllm", "content"])
def test_memory_for_target_inverts_h_at_capacity(trace, engine):
    wl = make_workload(trace, engine=engine)
    cap = _cap_at(1500)
    p = plan(wl, cap, target=TARGET)
    N = p.N_for_target
    assert plan(wl, _cap_at(N)).h_at_capacity >= TARGET > plan(wl, _cap_at(N - 1)).h_at_capacity
    assert p.gib_for_target == pytest.approx(N * cap.bytes_per_block / 2**30, rel=1e-15)


@pytest.mark.parametrize("engine", ["vllm", "content"])
def test_largest_lam0_is_where_h_at_capacity_crosses_the_target(trace, engine):
    N = 4000
    p = plan(make_workload(trace, engine=engine), _cap_at(N), target=TARGET)
    lm = p.lam0_max_for_target
    assert lm is not None and lm > 0
    # a workload rebuilt at λ0 = lm (and slightly above) answers (a) on either side of the target
    at = plan(make_workload(trace, engine=engine, lam0=lm * (1 - 1e-4)), _cap_at(N)).h_at_capacity
    above = plan(make_workload(trace, engine=engine, lam0=lm * (1 + 1e-4)), _cap_at(N)).h_at_capacity
    assert at >= TARGET > above


def test_largest_lam0_on_a_spec_against_the_closed_form(spec):
    wl = make_workload(spec, engine="paper")
    cap = capacity("qwen3-8b", kv_gb=10)
    lm = plan(wl, cap, target=0.2).lam0_max_for_target

    def h(lam):
        return float(theory.h_mean_field(spec, cap.N, lam0=lam, practical=True))

    assert h(lm * (1 - 1e-4)) >= 0.2 > h(lm * (1 + 1e-4))


def test_capacity_below_two_blocks_holds_nothing(trace):
    wl = make_workload(trace, engine="content")
    assert plan(wl, _cap_at(1)).h_at_capacity == 0.0


def test_capacity_is_floor_of_budget_over_block_bytes():
    bpt = 36 * 8 * 128 * 2 * 2  # Qwen3-8B: layers × KV heads × head dim × (K, V) × bf16 bytes
    for gb in (1.0, 40.0, 80.5):
        c = capacity("qwen3-8b", kv_gb=gb)
        assert c.bytes_per_block == bpt * 128
        assert c.N == math.floor(gb * 2**30 / (bpt * 128))
        assert c.kv_gib == pytest.approx(gb)


def test_smallest_capacity_on_a_known_step():
    for n0 in (2, 3, 17, 1000, 123_457, 2**30 + 5):
        h = lambda Ns, n0=n0: (np.asarray(Ns) >= n0).astype(float)  # noqa: E731
        assert _smallest_capacity(h, 0.5) == n0
    with pytest.raises(PlanError):
        _smallest_capacity(lambda Ns: np.zeros(np.shape(Ns)), 0.5)


def test_largest_lam0_on_a_known_function():
    # h(λ) = 1/(1 + λ): h ≥ t ⇔ λ ≤ 1/t − 1
    for t, ref in ((0.5, 1.0), (0.2, 7.3), (0.9, 0.01)):
        lm = _largest_lam0(lambda lam: 1 / (1 + lam), t, ref)
        assert lm == pytest.approx(1 / t - 1, rel=1e-4)
    assert _largest_lam0(lambda lam: 0.1, 0.5, 1.0) is None


def test_target_validation(spec):
    wl = make_workload(spec, engine="paper")
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(PlanError, match="target"):
            plan(wl, None, target=bad)
    p = plan(wl, None, target=0.2)
    assert p.lam0_max_for_target is None and p.gib_for_target is None and p.N_for_target > 0


def test_smallest_capacity_counts_reaching_the_target_exactly():
    # h(N) equal to the target is enough ("h ≥ target"), not only strictly above it
    assert _smallest_capacity(lambda Ns: np.where(np.asarray(Ns) >= 37, 0.25, 0.0), 0.25) == 37


@pytest.mark.parametrize("engine", ["vllm", "vllm-0.23"])
def test_ceiling_is_the_engines_own(trace, engine):
    wl = make_workload(trace, engine=engine)
    measured = _measured(trace)
    acc = engine_accounting(trace, engine=engine, metric="tokens", block_size=B, mask=measured)
    assert wl.h_max == pytest.approx(acc.A_hit / acc.A_R, rel=1e-12)
    assert abs(wl.h_max - trace_moments(trace, measured).h_max_hash) > 1e-3  # differs from the paper's ceiling


def test_one_block_is_infeasible_for_vllm(trace):
    p = plan(make_workload(trace, engine="vllm"), _cap_at(1))
    assert p.feasible is False and p.h_at_capacity is None and p.N_min == int(trace["R"].max())


def test_capacity_needs_exactly_one_of_accelerator_and_budget():
    with pytest.raises(PlanError, match="exactly one"):
        capacity("qwen3-8b", accelerator="H100", kv_gb=40)
    with pytest.raises(PlanError, match="exactly one"):
        capacity("qwen3-8b")


def test_note_when_the_budget_misses_the_target(trace):
    wl = make_workload(trace, engine="vllm")
    small = plan(wl, _cap_at(800), target=TARGET)
    assert small.h_at_capacity < TARGET
    assert any("reaches only" in n for n in small.notes)
    big = plan(wl, _cap_at(20_000), target=TARGET)
    assert big.h_at_capacity >= TARGET
    assert not any("reaches only" in n for n in big.notes)
