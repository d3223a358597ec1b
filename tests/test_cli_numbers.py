"""Every command's numbers, pinned against an independent computation (closed forms, the simulators called
directly at the same capacity, the README's published outputs) — not shapes or ranges."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from clihelp import kvhit
from kvhit import hardware, theory
from kvhit.sim.runner import simulate_trace_block, simulate_trace_content
from kvhit.workload import Trace, Window, WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]
SCM_TOML = str(ROOT / "examples" / "scm.toml")


def run_json(*args):
    r = kvhit(*args, "--json")
    assert r.code == 0 and not r.exc, (r.err, r.exc)
    return json.loads(r.out)


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("num") / "t.parquet"
    r = kvhit("trace", "generate", "--spec", SCM_TOML, "-n", "4000", "--seed", "7", "-o", p)
    assert r.code == 0, r.err
    return p


# -- kv: bytes per token = 2 (K, V) × layers × KV heads per rank × head_dim × dtype bytes -------------------------


@pytest.mark.parametrize(
    "model, tp, dtype, layers, heads, head_dim, nbytes",
    [
        ("qwen3-8b", 1, "bf16", 36, 8, 128, 2),
        ("llama-3.1-70b", 4, "bf16", 80, 2, 128, 2),
        ("llama-3.1-70b", 16, "fp8", 80, 1, 128, 1),  # 8 heads replicated over 16 ranks: 1 per rank
    ],
)
def test_kv_bytes_closed_form(model, tp, dtype, layers, heads, head_dim, nbytes):
    d = run_json("kv", "--model", model, "--tp", tp, "--kv-dtype", dtype, "--kv-gb", "40")
    bpt = 2 * layers * heads * head_dim * nbytes
    assert d["bytes_per_token"] == bpt
    assert d["bytes_per_block"] == 128 * bpt
    assert d["N"] == (40 * 2**30) // (128 * bpt)
    assert d["kv_gib"] == pytest.approx(40.0)


def test_kv_paper_capacity_and_deepseek_mla():
    assert run_json("kv", "--kv-gb", "40")["N"] == 2275  # the paper's ⌊40 GB / 18 MB⌋ (App. E)
    d = run_json("kv", "--model", "deepseek-v3", "--kv-gb", "60", "--kv-dtype", "fp8")
    assert d["bytes_per_token"] == 61 * (512 + 64) * 1  # MLA latent: layers × (kv_lora_rank + rope dim)
    assert d["N"] == (60 * 2**30) // (128 * 61 * 576)


def test_kv_accelerator_budget():
    d = run_json("kv", "--model", "llama-3.1-70b", "--gpu", "H200", "--tp", "4")
    m = hardware.get_model("Llama-3.1-70B")
    kv = hardware.kv_budget_bytes("H200", m, tp=4)
    assert d["N"] == kv // m.bytes_per_block(128, "bf16", 4)


# -- estimate: SCM closed forms (App. B.3) -------------------------------------------------------------------------


def test_estimate_scm_closed_forms():
    d = run_json("estimate", "--spec", SCM_TOML, "--N", "1000,2275,10000")
    m = d["moments"]
    p, k, mm = 0.75, 4.0, 3.0  # geometric turns, E[X] = 4, E[Y] = 3
    EM = 1 / (1 - p)
    assert m["E_M"] == pytest.approx(EM)
    assert m["h_max"] == pytest.approx(p)  # h_max = p for the SCM (App. B.3)
    assert m["A_R"] == pytest.approx(100.0) and m["E_B"] == pytest.approx(25.0)
    assert m["E_B"] == pytest.approx(k + (EM - 1) * (k + mm))  # E[R_M] = E[X] + (E[M] − 1)(E[X] + E[Y])
    assert m["A_H_hash"] == pytest.approx(m["A_H"] - (EM - 1))  # eq. (28)
    spec = WorkloadSpec.from_toml(SCM_TOML)
    for e in d["estimates"]:  # eq. (32) by the library's independent solver, and T_C's fixed point eq. (30)
        assert e["h_prac"] == pytest.approx(float(theory.h_mean_field(spec, e["N"], practical=True)), abs=1e-12)
        T = e["T_C_prac"]
        lam, A_H, E_B = 1.5, m["A_H_hash"], m["E_B"]
        mean_w = 135.0
        # exponential F: ∫₀^T F̄ = w(1 − e^{−T/w});  λ0·E[B]·T + λ0·A_H·∫₀^T F̄ = N
        assert lam * E_B * T + lam * A_H * mean_w * (1 - math.exp(-T / mean_w)) == pytest.approx(e["N"], rel=1e-6)
        assert e["h_prac"] == pytest.approx((A_H / m["A_R"]) * (1 - math.exp(-T / mean_w)), rel=1e-6)


# -- simulate: equals the simulators called directly ---------------------------------------------------------------


def test_simulate_trace_equals_library(trace):
    tr = Trace.read(trace)
    window = Window.warmup_conversations(tr, 800)
    d = run_json("simulate", "--trace", trace, "--N", "300,2000", "--warmup", "800")
    for row in d["rows"]:
        assert row["h"] == simulate_trace_content(tr, row["N"], window=window, practical=True).h
    tr.meta["block_size"] = 16
    d = run_json(
        "simulate", "--trace", trace, "--N", "300,2000", "--warmup", "800", "--policy", "block", "--block-size", "16"
    )
    for row in d["rows"]:
        m = simulate_trace_block(tr, row["N"], engine="vllm", window=window)[1]
        assert row["h"] == m["h_blocks"] and row["token_hit_ratio"] == m["token_hit_ratio"]


def test_simulate_spec_replications_are_seed_plus_r():
    from kvhit.workload import generate

    d = run_json(
        "simulate", "--spec", SCM_TOML, "--N", "1500", "-n", "1500", "--warmup", "300", "-r", "3", "--seed", "11"
    )
    spec = WorkloadSpec.from_toml(SCM_TOML)
    hs = []
    for r in range(3):
        tr = generate(spec, 11 + r, n_conversations=1800)
        hs.append(simulate_trace_content(tr, 1500, window=Window.warmup_conversations(tr, 300), practical=True).h)
    row = d["rows"][0]
    assert row["h_reps"] == hs
    assert row["h"] == pytest.approx(np.mean(hs), abs=1e-15)
    from scipy import stats

    assert row["h_ci95"] == pytest.approx(stats.t.ppf(0.975, 2) * np.std(hs, ddof=1) / math.sqrt(3), rel=1e-9)


# -- plan: the answer is the simulator's at the planned capacity; prefill saved in closed form ---------------------


def test_plan_spec_paper_closed_forms():
    d = run_json("plan", "--spec", SCM_TOML, "--kv-gb", "40", "--target", "0.05", "--engine", "paper")
    spec = WorkloadSpec.from_toml(SCM_TOML)
    m = theory.moments(spec)
    N = d["capacity"]["N"]
    assert N == 2275
    h = float(theory.h_mean_field(spec, N, practical=True))
    assert d["h_at_capacity"] == pytest.approx(h, abs=1e-12)
    # (d) prefill saved = h × λ0 × prompt tokens per conversation (A_R blocks of b = 128 tokens)
    assert d["saved_prefill_tokens_per_s"] == pytest.approx(h * 1.5 * m.A_R * 128, rel=1e-12)
    # (b) the smallest N reaching the target
    n_t = d["N_for_target"]
    assert float(theory.h_mean_field(spec, n_t, practical=True)) >= 0.05
    assert float(theory.h_mean_field(spec, n_t - 1, practical=True)) < 0.05
    assert d["gib_for_target"] == pytest.approx(n_t * d["capacity"]["bytes_per_block"] / 2**30)
    # (c) the largest λ0 keeping h ≥ target at N: h(N, λ0_max) = target
    lam = d["lam0_max_for_target"]
    assert float(theory.h_mean_field(spec.with_lam0(lam), N, practical=True)) == pytest.approx(0.05, abs=1e-5)


def test_plan_verify_simulates_at_the_planned_capacity(trace):
    d = run_json("plan", "--trace", trace, "--kv-gb", "40", "--verify")
    N = d["capacity"]["N"]
    assert N == 2275 and d["feasible"] is True
    tr = Trace.read(trace)
    tr.meta.setdefault("block_size", 128)
    nw = int(tr.meta.get("n_warm", 0))
    window = Window.warmup_conversations(tr, nw) if nw > 0 else Window.all()
    m = simulate_trace_block(tr, N, engine="vllm", window=window)[1]
    assert d["verify"]["h_simulated"] == m["token_hit_ratio"]
    assert d["verify"]["difference"] == pytest.approx(d["h_at_capacity"] - m["token_hit_ratio"])
    # prefill saved: λ0 × h × mean prompt tokens per conversation (Σ_j R_j·b − 1 without token counts)
    conv = np.unique(tr["conv"])
    per = np.bincount(np.searchsorted(conv, tr["conv"]), weights=(tr["R"] * 128 - 1).astype(float))
    lam0 = float(tr.meta["lam0"])
    assert d["lam0"] == lam0
    assert d["saved_prefill_tokens_per_s"] == pytest.approx(d["h_at_capacity"] * lam0 * per.mean(), rel=1e-12)


def test_plan_compare_is_the_other_engine_at_the_same_capacity(trace):
    d = run_json("plan", "--trace", trace, "--kv-gb", "40", "--compare", "vllm-0.23")
    o = run_json("plan", "--trace", trace, "--kv-gb", "40", "--engine", "vllm-0.23")
    assert d["compare"]["h_at_capacity"] == pytest.approx(o["h_at_capacity"], abs=1e-12)
    assert d["compare"]["gain"] == pytest.approx(d["h_at_capacity"] - o["h_at_capacity"], abs=1e-12)


# -- curve on a spec: the one-pass curve equals the per-capacity simulator -----------------------------------------


def test_curve_on_a_spec_equals_the_simulator():
    from kvhit.workload import generate

    d = run_json(
        "curve",
        "--spec",
        SCM_TOML,
        "-n",
        "3000",
        "--seed",
        "5",
        "--n-min",
        "100",
        "--n-max",
        "20000",
        "--points",
        "6",
        "--policies",
        "content,vllm",
    )
    spec = WorkloadSpec.from_toml(SCM_TOML)
    tr = generate(spec, 5, n_conversations=3000)
    tr.meta.update(n_warm=600, block_size=128)
    window = Window.warmup_conversations(tr, 600)
    for i, N in enumerate(d["N"]):
        h = simulate_trace_content(tr, N, window=window, practical=True).h
        assert d["Algorithm 1 (content LRU)"][i] == pytest.approx(h, abs=1e-12)
        if d["feasible"][i]:
            m = simulate_trace_block(tr, N, engine="vllm", window=window)[1]
            assert d["vLLM ≥ 0.24 (block cache)"][i] == pytest.approx(m["h_blocks"], abs=1e-12)


# -- trace stats: eq. (35)–(37) by hand ----------------------------------------------------------------------------


def test_trace_stats_by_hand(trace):
    d = run_json("trace", "stats", trace, "--warmup", "1000")
    tr = Trace.read(trace)
    conv = tr["conv"]
    keep = conv >= 1000
    R, M = tr["R"][keep], tr["M"][keep]
    L = np.unique(conv[keep]).size
    last = tr["turn"][keep] == M  # the last turn of each conversation: R_M = B
    assert d["L"] == L
    assert d["A_R"] == pytest.approx(R.sum() / L)  # eq. (35)
    assert d["E_B"] == pytest.approx(R[last].mean())  # eq. (37)
    assert d["E_M"] == pytest.approx(M[last].mean())
    assert d["A_H_hash"] == pytest.approx((R[~last] - 1).sum() / L)  # eq. (36): Σ_{j<M} (R_j − 1)
