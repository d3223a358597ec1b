"""--engine sglang in the service layer: simulate, curve, plan --compare sglang (answers equal the library's;
refusals are one line naming the flag)."""

from __future__ import annotations

import numpy as np
import pytest

from kvhit.service.errors import InputError
from kvhit.service.registry import run
from kvhit.sim.sglang.radix import simulate_radix
from kvhit.sim.sglang.streams import streams_from_trace
from kvhit.workload import Trace, WorkloadSpec, generate

SPEC = "examples/scm.toml"


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    tr = generate(WorkloadSpec.scm(2.0, 0.8, x=4, y=2, mean_w=5.0), 3, n_conversations=300)
    tr.meta.update(n_warm=50, block_size=16)
    p = tmp_path_factory.mktemp("t") / "t.parquet"
    tr.write(p)
    return p


def test_simulate_trace_equals_library(trace_file):
    r = run("simulate", {"trace": trace_file, "N": [4096, 16384], "engine": "sglang", "page_size": 4})
    tr = Trace.read(trace_file)
    from kvhit.workload import Window

    mask = Window.warmup_conversations(tr, 50).mask(tr)
    ts = streams_from_trace(tr)
    for row, C in zip(r.rows, (4096, 16384), strict=True):
        res = simulate_radix(ts, C, page_size=4)
        assert row["h"] == pytest.approx(res.token_hit_ratio(mask), abs=1e-12)
        assert row["unit"] == "tokens" and row["h_ci95"] > 0
    assert r.policy == "sglang" and "tokens" in r.notes[0]


def test_simulate_holds_wait_and_change_nothing_at_zero_load(trace_file):
    fast = run("simulate", {"trace": trace_file, "N": [8192], "engine": "sglang", "prefill_tokens_per_s": 1e9}).rows[0]
    none = run("simulate", {"trace": trace_file, "N": [8192], "engine": "sglang"}).rows[0]
    assert fast["h"] == pytest.approx(none["h"])  # holds of ~1 ns: nothing overlaps
    slow = run("simulate", {"trace": trace_file, "N": [8192], "engine": "sglang", "prefill_tokens_per_s": 50.0})
    assert slow.rows[0]["mean_wait"] > 0


def test_simulate_spec_replications_and_infeasible():
    r = run("simulate", {"spec": SPEC, "N": [64, 200_000], "engine": "sglang", "conversations": 300, "replications": 2})
    small, big = r.rows
    assert small["h"] is None and small["feasible"] is False and small["refused_request_share"] > 0
    assert big["feasible"] and len(big["h_reps"]) == 2 and 0 < big["h"] < 1
    assert r.N_min > 64


@pytest.mark.parametrize(
    "fields, msg",
    [
        ({"sglang_cache": "hybrid"}, "--sglang-cache hybrid: expected one of unified, radix"),
        (
            {"evict_policy": "tlru", "sglang_cache": "radix"},
            "--sglang-cache radix: SGLang 0.5.23 offers --evict-policy tlru on UnifiedRadixCache only",
        ),
        ({"tlru_threshold": 8}, "--tlru-threshold: applies to --evict-policy tlru"),
        ({"engine": "vllm", "sglang_cache": "radix"}, "--sglang-cache: applies to --engine sglang"),
        ({"evict_policy": "xyz"}, "--evict-policy xyz: not an SGLang 0.5.23 policy"),
        ({"block_size": 16}, "--block-size: a vLLM block-cache flag"),
        ({"colocated": True}, "--colocated: a vLLM block-cache flag"),
        ({"weighting": "base"}, "--weighting: a vLLM block-cache flag"),
        ({"policy": "content"}, "--policy content and --engine sglang"),
        ({"N": [1001], "page_size": 16}, "--N 1001: an SGLang pool is whole pages"),
        ({"engine": "vllm", "page_size": 4}, "--page-size: applies to --engine sglang"),
        ({"engine": "vllm", "evict_policy": "lru"}, "--evict-policy: applies to --engine sglang"),
        ({"engine": "vllm", "prefill_tokens_per_s": 5.0}, "--prefill-tokens-per-s: in-flight holds"),
    ],
)
def test_simulate_refusals(fields, msg):
    with pytest.raises(InputError, match=msg.replace("(", r"\(").replace(")", r"\)")) as e:
        run("simulate", {"spec": SPEC, "N": [4096], "engine": "sglang", **fields})
    assert "\n" not in str(e.value)


def test_curve_sglang_line_at_subset(trace_file, tmp_path):
    r = run(
        "curve",
        {
            "trace": trace_file,
            "policies": ["vllm", "sglang"],
            "points": 30,
            "sglang_points": 5,
            "estimates": False,
            "plot": tmp_path / "c",
        },
    )
    line = np.array([np.nan if x is None else x for x in r.curves["SGLang 0.5.23 radix cache (N·b tokens)"]])
    assert np.isfinite(line).sum() <= 5 and np.isfinite(line).sum() >= 2
    tr = Trace.read(trace_file)
    from kvhit.workload import Window

    mask = Window.warmup_conversations(tr, 50).mask(tr)
    k = int(np.flatnonzero(np.isfinite(line))[-1])
    C = r.N[k] * 16
    assert line[k] == pytest.approx(simulate_radix(streams_from_trace(tr), C).token_hit_ratio(mask))
    assert not any("colocated" in key for key in r.curves)  # the trace has no response lengths
    assert len(r.figures) == 2
    with pytest.raises(InputError, match="--sglang-points: applies to"):
        run("curve", {"trace": trace_file, "sglang_points": 5})
    with pytest.raises(InputError, match=r"--page-size: applies to --policies \.\.\. sglang"):
        run("curve", {"trace": trace_file, "page_size": 4})


def test_plan_compare_sglang(trace_file):
    r = run("plan", {"trace": trace_file, "kv_gb": 2.0, "compare": "sglang", "lam0": 2.0, "block_size": 16})
    c = r.compare
    assert c["engine"] == "sglang" and c["vllm_blocks"] >= 1 and c["sglang_tokens"] >= c["vllm_blocks"] * 16
    assert c["sglang_tokens"] < (c["vllm_blocks"] + 1) * 16  # the same bytes
    assert c["difference"] == pytest.approx(c["h_sglang"] - c["h_vllm"], abs=1e-12)
    assert c["difference_ci95"] >= 0 and c["better"] is not None
    with pytest.raises(InputError, match="--compare sglang: needs a KV budget"):
        run("plan", {"trace": trace_file, "compare": "sglang", "target": 0.5})
    with pytest.raises(InputError, match="--compare sglang: compares simulated vLLM"):
        run("plan", {"trace": trace_file, "compare": "sglang", "kv_gb": 1.0, "engine": "content"})
    with pytest.raises(InputError, match="--page-size: applies to --compare sglang"):
        run("plan", {"trace": trace_file, "kv_gb": 1.0, "page_size": 4})
