"""kvhit simulate/curve/plan with SGLang: the command line prints the service's numbers (token units named)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clihelp import kvhit

SCM = ["--lam0", "0.5", "--p", "0.75", "--x-mean", "4", "--y-mean", "3", "--w-mean", "60"]
MOONCAKE = str(Path(__file__).parent / "data" / "production" / "mooncake_small.jsonl")


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("sg") / "t.parquet"
    assert kvhit("trace", "generate", *SCM, "-n", "300", "--seed", "4", "-o", p).code == 0
    return p


def test_simulate_table_and_json_agree(trace_file):
    args = ["simulate", "--trace", trace_file, "--engine", "sglang", "--N", "30000,60000", "--page-size", "4"]
    r = kvhit(*args)
    assert r.code == 0, r.err
    assert "N (tokens)" in r.out and "SGLang radix cache (page size 4, lru)" in " ".join(r.out.split())
    j = json.loads(kvhit(*args, "--json").out)
    for row in j["rows"]:
        assert f"{row['h']:.4f}" in r.out and row["unit"] == "tokens"


def test_simulate_blocks_trace_with_holds():
    r = kvhit(
        "simulate", "--blocks-trace", MOONCAKE, "--engine", "sglang", "--N", "100000", "--prefill-tokens-per-s", "1000"
    )
    assert r.code == 0, r.err
    assert "mean wait" in r.out and "in-flight holds" in r.out


def test_simulate_refuses_tlru_on_radixcache_in_one_line(trace_file):
    args = ("simulate", "--trace", trace_file, "--engine", "sglang", "--N", "30000")
    r = kvhit(*args, "--evict-policy", "tlru", "--sglang-cache", "radix")
    assert r.code == 2 and len(r.err_lines) == 1 and "--sglang-cache radix" in r.err and "tlru" in r.err
    r = kvhit(*args, "--evict-policy", "slru", "--tlru-threshold", "8")
    assert r.code == 2 and len(r.err_lines) == 1 and "--tlru-threshold: applies to --evict-policy tlru" in r.err


def test_simulate_cache_class_and_policy_reach_the_rows(trace_file):
    args = ("simulate", "--trace", trace_file, "--engine", "sglang", "--N", "30000", "--json")
    r = kvhit(*args, "--evict-policy", "fifo", "--sglang-cache", "radix")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert out["rows"][0]["sglang_cache"] == "radix" and out["rows"][0]["evict_policy"] == "fifo"
    assert any("RadixCache, page size 1, fifo" in n for n in out["notes"])
    r = kvhit(*args, "--evict-policy", "lfu")
    assert r.code == 0, r.err
    assert json.loads(r.out)["rows"][0]["sglang_cache"] == "unified"


def test_curve_and_plan_compare(trace_file):
    r = kvhit("curve", "--trace", trace_file, "--policies", "vllm,sglang", "--points", "20", "--sglang-points", "3")
    assert r.code == 0, r.err
    flat = " ".join(r.out.split())
    assert "feasible capacities SGLang was simulated at" in flat and "no one-pass curve" in flat
    r = kvhit("plan", "--trace", trace_file, "--kv-gb", "4", "--compare", "sglang", "--json")
    assert r.code == 0, r.err
    c = json.loads(r.out)["compare"]
    t = kvhit("plan", "--trace", trace_file, "--kv-gb", "4", "--compare", "sglang")
    assert f"{c['difference']:+.4f}" in t.out and "SGLang − vLLM" in " ".join(t.out.split())


def test_estimate_trace_sglang_prints_the_library(trace_file):
    """estimate --trace --engine sglang: --N in tokens, numbers = kvhit.estimate.sglang on the measured
    conversations at the trace's λ0; a pool below the largest request is infeasible."""
    import numpy as np

    from kvhit.estimate.sglang import estimate_sglang, sglang_accounting
    from kvhit.workload import Trace

    args = ["estimate", "--trace", trace_file, "--engine", "sglang", "--N", "30000,60000,50"]
    r = kvhit(*args)
    assert r.code == 0, r.err
    assert "N (tokens)" in r.out and "SGLang token hit ratio" in r.out
    j = json.loads(kvhit(*args, "--json").out)
    assert j["unit"] == "tokens" and not j["rows"][2]["feasible"] and j["rows"][2]["h"]["sglang"] is None
    tr = Trace.read(trace_file)
    sa = sglang_accounting(tr, block_size=128, mask=tr.conv_index()[0] >= int(tr.meta.get("n_warm", 0)))
    want = estimate_sglang(sa, [30000, 60000], float(tr.meta["lam0"])).h
    got = np.array([row["h"]["sglang"] for row in j["rows"][:2]])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    for row in j["rows"][:2]:
        assert f"{row['h']['sglang']:.4f}" in r.out


def test_estimate_sglang_refusals_one_line(trace_file):
    r = kvhit("estimate", "--trace", trace_file, "--engine", "sglang", "--N", "30000", "--metric", "blocks")
    assert r.code == 2 and len(r.err_lines) == 1 and "--metric blocks" in r.err
    r = kvhit("estimate", "--trace", trace_file, "--engine", "sglang", "--N", "0")
    assert r.code == 2 and len(r.err_lines) == 1 and "--N" in r.err


def test_estimate_blocks_trace_sglang_prints_the_library():
    import numpy as np

    from kvhit.estimate.sglang_agentic import estimate_trace_sglang
    from kvhit.workload.production import read_mooncake

    args = ["estimate", "--blocks-trace", MOONCAKE, "--engine", "sglang", "--N", "2000000,4000000,1000"]
    r = kvhit(*args)
    assert r.code == 0, r.err
    assert "N (tokens)" in r.out and "SGLang token hit ratio" in r.out
    j = json.loads(kvhit(*args, "--json").out)
    assert j["unit"] == "tokens" and j["rows"][2]["h"]["sglang"] is None and not j["rows"][2]["feasible"]
    want = estimate_trace_sglang(read_mooncake(MOONCAKE), [2000000, 4000000]).h
    np.testing.assert_allclose([row["h"]["sglang"] for row in j["rows"][:2]], want, rtol=1e-12)


def test_estimate_spec_sglang_at_the_same_memory():
    r = kvhit("estimate", *SCM, "--engine", "sglang", "--N", "200,800", "--sample", "500", "--json")
    assert r.code == 0, r.err
    rows = json.loads(r.out)["estimates"]
    assert all(e["h_engine_blocks"] is None for e in rows)
    assert 0 < rows[0]["h_engine_tokens"] < rows[1]["h_engine_tokens"] < 1


def test_estimate_trace_sglang_page_size(trace_file):
    import numpy as np

    from kvhit.estimate.sglang import estimate_sglang, sglang_accounting
    from kvhit.workload import Trace

    args = ["estimate", "--trace", trace_file, "--engine", "sglang", "--N", "30000,60000", "--page-size", "16"]
    j = json.loads(kvhit(*args, "--json").out)
    tr = Trace.read(trace_file)
    sa = sglang_accounting(tr, page_size=16, block_size=128, mask=tr.conv_index()[0] >= int(tr.meta.get("n_warm", 0)))
    want = estimate_sglang(sa, [30000, 60000], float(tr.meta["lam0"])).h
    np.testing.assert_allclose([row["h"]["sglang"] for row in j["rows"]], want, rtol=1e-12)
    for bad, what in (
        (["--N", "30001", "--page-size", "16"], "--N 30001"),
        (["--N", "30000", "--page-size", "16", "--engine", "vllm"], "--page-size"),
    ):
        base = ["estimate", "--trace", trace_file, "--engine", "sglang", *bad]
        r = kvhit(*base)
        assert r.code == 2 and len(r.err_lines) == 1 and what in r.err, r.err
    r = kvhit("estimate", "--blocks-trace", MOONCAKE, "--engine", "sglang", "--N", "160000", "--page-size", "16")
    assert r.code == 2 and len(r.err_lines) == 1 and "--page-size" in r.err
    r = kvhit("estimate", *SCM, "--N", "100", "--page-size", "16")
    assert r.code == 2 and len(r.err_lines) == 1 and "--page-size" in r.err
