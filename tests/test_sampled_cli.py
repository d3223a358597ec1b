"""``kvhit curve --sample-rate``: rate 1 reproduces the exact vLLM curves of the same Parquet trace; bad input is one
line naming the flag, exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clihelp import kvhit


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    p = tmp_path_factory.mktemp("sampled") / "t.parquet"
    r = kvhit("trace", "generate", "--spec", "examples/scm.toml", "-n", "400", "-o", p)
    assert r.code == 0, r.err
    return p


def test_rate_one_equals_exact_curve(trace):
    ex = kvhit("curve", "--trace", trace, "--policies", "vllm,vllm-0.23,content", "--no-estimate", "--json",
               "--n-max", "3000", "--points", "200")  # fmt: skip
    sm = kvhit("curve", "--trace", trace, "--policies", "vllm,vllm-0.23,content", "--json", "--n-max", "3000",
               "--points", "200", "--sample-rate", "1")  # fmt: skip
    assert ex.code == 0 and sm.code == 0, (ex.err, sm.err)
    e, s = json.loads(ex.out), json.loads(sm.out)
    assert e["N"] == s["N"] and s["sample_rate"] == 1.0
    for eng, label in (("vllm", "vLLM ≥ 0.24 (block cache)"), ("vllm-0.23", "vLLM ≤ 0.23 (block cache)")):
        a = np.array(e[label], float)
        b = np.array(s[label + ", sampled 100%"], float)
        assert np.array_equal(np.isnan(a), np.isnan(b)), eng
        assert np.allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=0, atol=1e-12), eng
    a = np.array(e["Algorithm 1 (content LRU)"], float)
    b = np.array(s["Algorithm 1 (content LRU)"], float)
    assert np.allclose(a, b, rtol=0, atol=1e-12)


def test_algorithm_1_runs_exact_under_sampling(trace):
    """Below rate 1 Algorithm 1 is still its exact per-turn pass (its conversation sample misses by 0.09 at 1 %):
    the line equals the exact curve's at the same capacities, labelled without 'sampled'."""
    args = ("--policies", "vllm,content", "--json", "--n-max", "3000", "--points", "100", "--warmup", "0")
    ex = kvhit("curve", "--trace", trace, "--no-estimate", *args)
    sm = kvhit("curve", "--trace", trace, "--sample-rate", "0.05", *args)
    assert ex.code == 0 and sm.code == 0, (ex.err, sm.err)
    e, s = json.loads(ex.out), json.loads(sm.out)
    assert e["N"] == s["N"] and not [k for k in s if k.startswith("Algorithm 1") and "sampled" in k]
    a = np.array(e["Algorithm 1 (content LRU)"], float)
    assert np.allclose(a, np.array(s["Algorithm 1 (content LRU)"], float), rtol=0, atol=1e-12)
    assert s["sample"]["content"]["kept_events"] == s["sample"]["content"]["events"]


def test_salt_changes_the_sample(trace):
    a = json.loads(kvhit("curve", "--trace", trace, "--sample-rate", "0.3", "--json", "--policies", "vllm").out)
    b = json.loads(
        kvhit(
            "curve", "--trace", trace, "--sample-rate", "0.3", "--sample-salt", "7", "--json", "--policies", "vllm"
        ).out
    )
    a2 = json.loads(kvhit("curve", "--trace", trace, "--sample-rate", "0.3", "--json", "--policies", "vllm").out)
    assert a == a2
    assert a["sample_estimator"] == "deblurred"  # the default for a streamed trace
    assert a["sample"] != b["sample"]


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--sample-rate", "0"], "--sample-rate"),
        (["--sample-rate", "1.5"], "--sample-rate"),
        (["--sample-salt", "3"], "--sample-salt"),
        (["--sample-estimator", "step"], "--sample-estimator"),
        (["--sample-rate", "0.1", "--sample-estimator", "median"], "--sample-estimator"),
        (["--sample-rate", "0.1", "--sample-estimator", "stratified"], "--sample-estimator"),
        (["--sample-rate", "0.1", "--sample-estimator", "stratified-jk"], "--sample-estimator"),  # library only
        (["--sample-rate", "0.1", "--policies", "sglang"], "--sample-rate"),
    ],
)
def test_bad_input_one_line(trace, args, flag):
    r = kvhit("curve", "--trace", trace, *args)
    assert r.code == 2 and not r.exc
    assert len(r.err_lines) == 1 and flag in r.err_lines[0], r.err


def test_spec_refused():
    r = kvhit("curve", "--spec", "examples/scm.toml", "--sample-rate", "0.1")
    assert r.code == 2 and len(r.err_lines) == 1 and "--sample-rate" in r.err_lines[0]


def test_blocks_trace_default_policies(tmp_path):
    """A production trace with the default --policies: the vLLM engines are sampled (Algorithm 1 needs
    conversation sizes); --policies content alone is refused in one line."""
    files = ["tests/data/production/mooncake_small.jsonl"]
    r = kvhit("curve", "--blocks-trace", files[0], "--sample-rate", "0.5", "--json", "--points", "20")
    assert r.code == 0, r.err
    d = json.loads(r.out)
    assert any(k.endswith("sampled 50%") for k in d) and d["sample_rate"] == 0.5
    assert d["sample_estimator"] == "stratified"  # the default for an in-memory block-id trace
    r2 = kvhit("curve", "--blocks-trace", files[0], "--sample-rate", "0.5", "--json", "--points", "20",
               "--sample-estimator", "stratified")  # fmt: skip
    assert r2.code == 0 and json.loads(r2.out) == d
    r = kvhit("curve", "--blocks-trace", files[0], "--sample-rate", "0.5", "--policies", "content")
    assert r.code == 2 and len(r.err_lines) == 1 and "--policies" in r.err_lines[0]


def test_estimator_echoed_and_equal_to_the_library(trace):
    """--sample-estimator is echoed and each reading is the library's (kvhit.sim.sampled_estimate); below rate 1
    the two readings differ."""
    from kvhit.experiments.sampled_curve import sampled_curve_from_parquet

    key = "vLLM ≥ 0.24 (block cache), sampled 20%"
    got = {}
    for est in ("step", "deblurred"):
        r = kvhit(
            "curve", "--trace", trace, "--sample-rate", "0.2", "--points", "40", "--warmup", "0", "--json",
            "--sample-estimator", est,
        )  # fmt: skip
        assert r.code == 0, r.err
        out = json.loads(r.out)
        assert out["sample_estimator"] == est
        Ns = np.asarray(out["N"], np.int64)
        lib = sampled_curve_from_parquet(trace, rate=0.2, Ns=Ns, n_warm=0, estimator=est, block_size=out["block_size"])
        got[est] = np.array([np.nan if x is None else x for x in out[key]])
        assert np.allclose(got[est], lib[key], equal_nan=True, rtol=0, atol=1e-12)
        lo, hi = (np.array([np.nan if x is None else x for x in out[f"band {s}: " + key]]) for s in ("low", "high"))
        assert np.allclose(hi - got[est], lib["band high: " + key] - lib[key], equal_nan=True, atol=1e-12)
        assert np.allclose(got[est] - lo, hi - got[est], equal_nan=True, atol=1e-12)
        assert np.nanmin(hi - lo) > 0
    assert np.nanmax(np.abs(got["deblurred"] - got["step"])) > 1e-4


@pytest.mark.parametrize("est", ["stratified"])
def test_stratified_reading_on_a_blocks_trace(est):
    """--sample-estimator stratified (--blocks-trace): echoed, the library's reading, its jackknife band."""
    from kvhit.experiments.sampled_curve import curves_from_sampled, sampled_production_curve
    from kvhit.sim.tracerun import measured_mask
    from kvhit.workload.production import read_production

    f = "tests/data/production/mooncake_small.jsonl"
    r = kvhit(
        "curve", "--blocks-trace", f, "--sample-rate", "0.3", "--json", "--points", "20", "--policies", "vllm",
        "--sample-estimator", est,
    )  # fmt: skip
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert out["sample_estimator"] == est
    key = "vLLM ≥ 0.24 (block cache), sampled 30%"
    pt = read_production(f)
    blocks = sampled_production_curve(pt, rate=0.3, engines=("vllm",), mask=measured_mask(pt, None), gaps=True)
    lib = curves_from_sampled(np.asarray(out["N"], np.int64), blocks, None, 0.3, est)
    got = np.array([np.nan if x is None else x for x in out[key]])
    assert np.allclose(got, lib[key], equal_nan=True, atol=1e-12)
    hi = np.array([np.nan if x is None else x for x in out["band high: " + key]])
    assert np.allclose(hi, lib["band high: " + key], equal_nan=True, atol=1e-12)
