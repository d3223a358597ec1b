"""kvhit.fleet.engine_fleet: step-wise vLLM engines behind the Dynamo router, timed as Dynamo's mocker.

Pinned to the mocker itself: ``tests/data/dynamo_mocker_cases.json`` holds the per-request first-token and finish
times and reused tokens of ai-dynamo 1.6.1's own replay on one worker (``conformance/dynamo_mocker_cases.py``
regenerates it in the mocker's environment). With one replica kvhit's fleet equals
:func:`kvhit.sim.vllm.scheduler.simulate_schedule` under hypothesis (same scheduler, same step times).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.fleet.engine_fleet import MockerTiming, engine_requests, simulate_engine_fleet
from kvhit.sim.vllm.scheduler import StepTime, simulate_schedule

CASES = json.loads((Path(__file__).parent / "data" / "dynamo_mocker_cases.json").read_text())["cases"]


def _run(case, **kw):
    reqs = case["requests"]
    t0 = reqs[0]["timestamp"]
    off = np.concatenate([[0], np.cumsum([len(q["hash_ids"]) for q in reqs])])
    hs = np.array([h for q in reqs for h in q["hash_ids"]], np.int64)
    return simulate_engine_fleet(
        [q["input_length"] for q in reqs], [q["output_length"] for q in reqs], off, hs,
        [(q["timestamp"] - t0) / 1000.0 for q in reqs], Ns=[case["N"]], block_size=case["block_size"], **kw,
    )  # fmt: skip


def test_polynomials_at_the_wheels_isolated_timings():
    tm = MockerTiming()
    # prefill of x new tokens alone (TTFT of 1-output requests, docs/peers.md probe table)
    for x, ms in ((512, 24.39), (2048, 49.36), (4096, 85.76), (8192, 169.14), (6144, 125.68)):
        assert tm.pass_seconds(x, False, 0.0) * 1000 == pytest.approx(ms, abs=0.01)
    assert tm.pass_seconds(0, False, 0.5) == 0.0
    assert tm.pass_seconds(0, True, 0.0) * 1000 == pytest.approx(5.74)
    assert tm.pass_seconds(0, True, 3.0) * 1000 == 1.0  # −25.74·9 + 54.01·3 + 5.74 < 1: floored at 1 ms


@pytest.mark.parametrize(
    "name",
    ["isolated_512_out3", "overlap_4096_2048", "long_prompt_2000_blocks", "finished_then_alone_N64",
     "two_decoding_N64", "two_prefills_one_pass"],
)  # fmt: skip
def test_small_cases_equal_the_mocker_to_the_microsecond(name):
    case = CASES[name]
    res = _run(case)
    m_first = np.array([p["first_token_ms"] for p in case["per_request"]])
    m_end = np.array([p["terminal_time_ms"] for p in case["per_request"]])
    np.testing.assert_allclose(res.first_token * 1000, m_first, atol=1e-3)
    np.testing.assert_allclose(res.finished * 1000, m_end, atol=1e-3)
    assert res.hit_tokens.tolist() == [p["reused_input_tokens"] for p in case["per_request"]]


@pytest.mark.parametrize("name", [k for k in CASES if k.startswith(("shared_prefixes", "preemption"))])
def test_random_sets_equal_the_mocker(name):
    """40 requests with shared prefixes on 16–200 blocks, with and without preemption (LIFO): the same requests are
    preempted the same number of times; the first-admission token hit ratio equals the mocker's
    ``first_admission_prefix_cache_reused_ratio``; every never-preempted request's hit equals the mocker's
    ``reused_input_tokens`` (for a preempted one the mocker reports the last admission's); first-token and finish
    times within 1 % (measured: ≤ 0.76 %; in the N = 24 set one pass near 1.99 s is 7.5 ms longer in the mocker,
    not explained)."""
    case = CASES[name]
    res = _run(case)
    per = case["per_request"]
    assert res.preemptions.tolist() == [p["readmission_count"] for p in per]
    if name.startswith("preemption"):
        assert res.preemptions.sum() > 0
    assert res.token_hit_ratio() == pytest.approx(case["first_admission_prefix_cache_reused_ratio"], abs=1e-12)
    once = [i for i, p in enumerate(per) if p["readmission_count"] == 0]
    assert len(once) >= 20
    assert [int(res.hit_tokens[i]) for i in once] == [per[i]["reused_input_tokens"] for i in once]
    m_end = np.array([p["terminal_time_ms"] for p in per])
    m_first = np.array([p["first_token_ms"] for p in per])
    assert np.max(np.abs(res.finished * 1000 - m_end) / m_end) < 0.01
    assert np.max(np.abs(res.first_token * 1000 - m_first) / m_first) < 0.01


def _trace(draw, n_max=14, b=4):
    n = draw(st.integers(1, n_max))
    T = [draw(st.integers(1, 5 * b)) for _ in range(n)]
    O = [draw(st.integers(1, 3 * b)) for _ in range(n)]
    gaps = [draw(st.sampled_from([0.0, 0.001, 0.003, 0.01])) for _ in range(n)]
    t = np.cumsum(gaps)
    roots = [[draw(st.integers(0, 3)) * 100 + j for j in range(5)] for _ in range(3)]
    ids = []
    for r in range(n):
        root = roots[draw(st.integers(0, 2))]
        k = min(draw(st.integers(0, 5)), -(-T[r] // b))
        ids.append(root[:k] + [1000 * (r + 1) + j for j in range(-(-T[r] // b) - k)])
    off = np.concatenate([[0], np.cumsum([len(x) for x in ids])])
    return T, O, off, np.array([h for x in ids for h in x], np.int64), t


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.integers(6, 14), st.integers(4, 40))
def test_one_replica_equals_simulate_schedule(data, N, budget):
    b = 4
    T, O, off, hs, t = _trace(data.draw)
    if max(-(-(T[r] + O[r] - 1) // b) for r in range(len(T))) > N:
        return
    stime = StepTime(a=0.002, b=1e-4, c=3e-4)
    res = simulate_engine_fleet(T, O, off, hs, t, Ns=[N], block_size=b, max_num_batched_tokens=budget,
                                max_num_seqs=3, step_seconds=lambda x, k, s, d, u: stime.duration(k, s))  # fmt: skip
    ref = simulate_schedule(engine_requests(T, O, off, hs, t, b), N=N, block_size=b, step_time=stime,
                            max_num_batched_tokens=budget, max_num_seqs=3)  # fmt: skip
    assert res.hit_tokens.tolist() == ref.hit_tokens.tolist()
    assert res.preemptions.tolist() == ref.preemptions.tolist()
    np.testing.assert_allclose(res.finished, ref.finished, rtol=0, atol=1e-12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.integers(1, 3), st.integers(8, 20), st.integers(0, 3))
def test_fleet_invariants(data, R, N, seed):
    b = 4
    T, O, off, hs, t = _trace(data.draw)
    if max(-(-(T[r] + O[r] - 1) // b) for r in range(len(T))) > N:
        return
    res = simulate_engine_fleet(T, O, off, hs, t, Ns=[N] * R, block_size=b, seed=seed, max_num_batched_tokens=8)
    T = np.array(T)
    assert ((res.replica >= 0) & (res.replica < R)).all()
    assert (res.hit_tokens % b == 0).all() and (res.hit_tokens <= (T - 1) // b * b).all()
    assert (res.first_token >= t - 1e-12).all() and (res.finished >= res.first_token).all()
    fr = res.as_fleet_result()
    assert fr.token_hit_ratio() == pytest.approx(res.token_hit_ratio(), abs=1e-12)
    assert (fr.wait >= 0).all() and fr.summary()["requests"] == len(T) and fr.router == "dynamo"
    again = simulate_engine_fleet(T, O, off, hs, t, Ns=[N] * R, block_size=b, seed=seed, max_num_batched_tokens=8)
    assert again.replica.tolist() == res.replica.tolist() and again.finished.tolist() == res.finished.tolist()


def test_refusals():
    with pytest.raises(ValueError, match="Ns"):
        simulate_engine_fleet([4], [1], [0, 1], [1], [0.0], Ns=[], block_size=4)
    with pytest.raises(ValueError, match="more than a replica"):
        simulate_engine_fleet([40], [1], [0, 10], list(range(10)), [0.0], Ns=[4], block_size=4)
    with pytest.raises(ValueError, match="non-decreasing"):
        simulate_engine_fleet([4, 4], [1, 1], [0, 1, 2], [1, 2], [1.0, 0.0], Ns=[8], block_size=4)
    with pytest.raises(ValueError, match="block ids"):
        simulate_engine_fleet([8], [1], [0, 1], [1], [0.0], Ns=[8], block_size=4)


def _mooncake(tmp_path):
    p = tmp_path / "t.jsonl"
    recs = [
        {"timestamp": 0, "input_length": 1030, "output_length": 600, "hash_ids": [0, 1, 2]},
        {"timestamp": 10, "input_length": 1536, "output_length": 40, "hash_ids": [0, 1, 3]},
        {"timestamp": 20, "input_length": 700, "output_length": 3, "hash_ids": [0, 5]},
        {"timestamp": 900, "input_length": 2100, "output_length": 9, "hash_ids": [0, 1, 3, 7, 8]},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


def test_cli_engine_steps_equals_the_library(tmp_path):
    from typer.testing import CliRunner

    from kvhit.cli import app
    from kvhit.service.inputs import read_blocks_trace

    p = _mooncake(tmp_path)
    r = CliRunner().invoke(app, ["fleet", "simulate", "--blocks-trace", str(p), "--replicas", "1,2", "--N", "8",
                                 "--router", "dynamo", "--engine-steps", "--seed", "3", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["timing"]["engine_steps"] is True
    pt = read_blocks_trace(p, "sequential", None, None, 3)
    brq = pt.to_block_requests(colocated=False)
    for row, R in zip(out["rows"], (1, 2), strict=True):
        lib = simulate_engine_fleet(pt.prompt_tokens, pt.output_tokens, brq.hash_offsets, brq.hashes, pt.time,
                                    Ns=[8] * R, block_size=512, seed=3)  # fmt: skip
        assert row["token_hit_ratio"] == pytest.approx(lib.token_hit_ratio(), abs=1e-12)
        assert row["estimate"] is None


@pytest.mark.parametrize(
    "extra,msg",
    [
        (["--router", "round-robin"], "--engine-steps: models the fleet behind --router dynamo only"),
        (["--router", "dynamo", "--prefill-tokens-per-s", "1000"], "--prefill-tokens-per-s: does not apply"),
        (["--router", "dynamo", "--decode-kv"], "--decode-kv: does not apply"),
        (["--router", "dynamo", "--lag", "1"], "--lag: does not apply"),
    ],
)
def test_cli_engine_steps_refusals(tmp_path, extra, msg):
    from typer.testing import CliRunner

    from kvhit.cli import app

    p = _mooncake(tmp_path)
    r = CliRunner().invoke(app, ["fleet", "simulate", "--blocks-trace", str(p), "--replicas", "2", "--N", "8",
                                 "--engine-steps", *extra])  # fmt: skip
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output
