"""Every command's numbers, pinned against an independent computation (closed forms, the simulators called
directly at the same capacity, the README's published outputs) — not shapes or ranges."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from clihelp import kvhit
from kvhit.estimate import theory
from kvhit.plan import hardware
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


@pytest.mark.parametrize(
    "flags, F",
    [
        (["--w-dist", "gamma", "--w-cv", "0.5"], ("gamma", 4.0)),  # shape k = 1/cv²
        (["--w-dist", "lognormal", "--w-cv", "2"], ("lognormal", 2.0)),
        (["--w-dist", "deterministic", "--w-mean", "60"], ("deterministic", 60.0)),
        (["--lam0", "0.7"], ("lam0", 0.7)),
    ],
)
def test_estimate_spec_overrides_are_used(flags, F):
    from kvhit.workload import Deterministic, GammaW, LogNormalW

    d = run_json("estimate", "--spec", SCM_TOML, "--N", "2275", *flags)
    spec = WorkloadSpec.from_toml(SCM_TOML)
    kind, x = F
    if kind == "gamma":
        spec = spec.with_interarrival(GammaW(x, 135.0))
    elif kind == "lognormal":
        spec = spec.with_interarrival(LogNormalW.from_mean_cv(135.0, x))
    elif kind == "deterministic":
        spec = spec.with_interarrival(Deterministic(x))
    else:
        spec = spec.with_lam0(x)
    assert d["spec"] == spec.to_dict()
    h = float(theory.h_mean_field(spec, 2275, practical=True))
    assert d["estimates"][0]["h_prac"] == pytest.approx(h, abs=1e-12)


def test_estimate_h_is_practical_and_engine_estimate_is_the_planners():
    from kvhit.plan.planner import make_workload

    d = run_json("estimate", "--spec", SCM_TOML, "--N", "2275", "--engine", "vllm", "--sample", "3000", "--seed", "4")
    e = d["estimates"][0]
    assert e["h"] == e["h_prac"]
    spec = WorkloadSpec.from_toml(SCM_TOML)
    for metric in ("blocks", "tokens"):
        wl = make_workload(spec, engine="vllm", metric=metric, sample_conversations=3000, seed=4)
        assert e[f"h_engine_{metric}"] == float(wl.predict(np.array([2275.0]), np.array([1.5]))[0])


def test_simulate_defaults_pinned(tmp_path):
    """No --warmup: a spec warms up on max(20% of -n, 3 lifetimes of arrivals λ0·E[M]·E[W]) (issue 24: steady
    state); a trace on its recorded n_warm. Estimates beside the simulation are the paper's (practical, empirical
    F̂) and the engine-aware one at b = 128."""
    from kvhit.estimate.mean_field import estimate
    from kvhit.estimate.trace_stats import trace_moments
    from kvhit.plan.planner import make_workload
    from kvhit.workload import generate

    spec = WorkloadSpec.from_toml(SCM_TOML)
    d = run_json("simulate", "--spec", SCM_TOML, "--N", "2000", "-n", "1000", "-r", "1", "--policy", "block")
    n_warm = 2430  # by hand: 3 × λ0·E[M]·E[W] = 3 × 1.5 × 4 × 135 = 2,430 > 20% of 1,000
    tr = generate(spec, 0, n_conversations=1000 + n_warm)
    tr.meta["block_size"] = 128
    m = simulate_trace_block(tr, 2000, engine="vllm", window=Window.warmup_conversations(tr, n_warm))[1]
    assert d["rows"][0]["h"] == m["h_blocks"]
    wl = make_workload(spec, engine="vllm", metric="blocks", block_size=128)
    assert d["estimate"][0]["h_engine"] == float(wl.predict(np.array([2000.0]), np.array([1.5]))[0])

    tr = generate(spec, 3, n_conversations=2000)
    tr.meta.update(n_warm=400)
    p = tmp_path / "nw.parquet"
    tr.write(p)
    d = run_json("simulate", "--trace", p, "--N", "1500")
    window = Window.warmup_conversations(tr, 400)
    assert d["rows"][0]["h"] == simulate_trace_content(tr, 1500, window=window, practical=True).h
    conv = tr.conversations()
    mom = trace_moments(tr, conv["conv"][(conv["arrival"] >= window.start) & (conv["arrival"] <= window.end)])
    assert d["estimate"][0]["h"] == pytest.approx(
        float(np.atleast_1d(estimate(mom, [1500.0], 1.5, "empirical", practical=True).h)[0]), abs=1e-12
    )


def test_simulate_blocks_trace_warmup_time_is_used():
    from kvhit.sim.tracerun import production_rows
    from kvhit.workload.production import read_production

    path = str(ROOT / "tests" / "data" / "production" / "mooncake_small.jsonl")
    d = run_json("simulate", "--blocks-trace", path, "--N", "3000", "--warmup-time", "600")
    rows, _ = production_rows(read_production(path), [3000], ["vllm", "vllm-0.23"], warmup_time=600.0)
    assert [r["token_hit_ratio"] for r in d["rows"]] == [r["token_hit_ratio"] for r in rows]
    d0 = run_json("simulate", "--blocks-trace", path, "--N", "3000")
    assert d0["rows"][0]["token_hit_ratio"] != d["rows"][0]["token_hit_ratio"]


def test_plan_lam0_with_a_trace_is_used(trace):
    from kvhit.plan.planner import make_workload

    d = run_json("plan", "--trace", trace, "--kv-gb", "40", "--lam0", "0.5")
    assert d["lam0"] == 0.5
    wl = make_workload(Trace.read(trace), lam0=0.5, engine="vllm", metric="tokens")
    assert d["h_at_capacity"] == float(wl.predict(np.array([2275.0]), np.array([0.5]))[0])


def test_curve_grid_is_log_spaced():
    d = run_json(
        "curve",
        "--spec",
        SCM_TOML,
        "-n",
        "500",
        "--n-min",
        "100",
        "--n-max",
        "20000",
        "--points",
        "7",
        "--policies",
        "content",
        "--no-estimate",
    )
    assert d["N"] == np.unique(np.geomspace(100, 20000, 7).astype(np.int64)).tolist()
    assert d["grid"] == "log"


def test_demo_says_when_N_is_not_the_papers():
    d = run_json("demo", "--N", "1000")
    assert d["N"] == 1000 and d["N_is_paper_default"] is False
