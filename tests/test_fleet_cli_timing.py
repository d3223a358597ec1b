"""The fleet timing options on the CLI (``--decode-tokens-per-s``, ``--prefill-hold``, ``--hit-token-seconds``:
service.fleet.fleet_timing, kvhit.fleet.timing): ``fleet simulate|curve|plan`` equal ``simulate_fleet`` called with
holds computed here from the trace's own lengths; each bad value or inapplicable option is one line, exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvhit.cli import app
from kvhit.fleet.simulate import simulate_fleet
from kvhit.service.inputs import read_blocks_trace

runner = CliRunner()
P, D, HTS, OV = 2000.0, 20.0, 0.0004, 0.01


def _mooncake(path, n=300, seed=0, convs=24, bs=512):
    """A Mooncake-format file: conversations growing by 1–3 blocks a turn, requests 0–0.4 s apart (load enough
    that the timing options change the routing)."""
    rng = np.random.default_rng(seed)
    hist: list[list[int]] = [[] for _ in range(convs)]
    nxt = t = 0
    rows = []
    for _ in range(n):
        c = int(rng.integers(convs))
        add = int(rng.integers(1, 4))
        hist[c] = hist[c] + list(range(nxt, nxt + add))
        nxt += add
        ids = hist[c][-12:]
        T = len(ids) * bs - int(rng.integers(0, bs))
        rows.append({"timestamp": t, "input_length": T, "output_length": int(rng.integers(1, 400)), "hash_ids": ids})
        t += int(rng.integers(0, 400))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


@pytest.fixture(scope="module")
def mc(tmp_path_factory):
    p = tmp_path_factory.mktemp("timing") / "m.jsonl"
    rows = _mooncake(p)
    return p, rows


def _lib(path, rows, R, N, router, params=None, ph=True, hts=HTS, decode=True, ov=OV):
    pt = read_blocks_trace(path, "sequential", None, None, 0)
    T = np.array([r["input_length"] for r in rows], float)
    O = np.array([r["output_length"] for r in rows], float)
    assert np.array_equal(np.asarray(pt.prompt_tokens), T.astype(np.int64))  # the reader keeps file order
    pre = ov + T / P
    hold = pre + (np.maximum(O - 1, 0) / D if decode else 0.0)
    conv = np.asarray(pt.session, np.int64)
    return simulate_fleet(
        pt.prompt_tokens, pt.hash_offsets, pt.hashes, conv, Ns=[N] * R, block_size=int(pt.block_size), router=router,
        router_params=params, times=pt.time, hold=hold, prefill_hold=pre if ph else None, hit_token_seconds=hts,
    )  # fmt: skip


TIMING = ["--prefill-tokens-per-s", str(P), "--decode-tokens-per-s", str(D), "--prefill-hold",
          "--hit-token-seconds", str(HTS), "--prefill-overhead-s", str(OV)]  # fmt: skip


def _json(args):
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_simulate_equals_the_library_and_echoes_the_options(mc):
    path, rows = mc
    out = _json(["fleet", "simulate", "--blocks-trace", str(path), "--replicas", "3", "--N", "40", "--router",
                 "dynamo,least-loaded", "--load-metric", "prefill_tokens", *TIMING, "--json"])  # fmt: skip
    assert out["timing"] == {"prefill_tokens_per_s": P, "decode_tokens_per_s": D, "prefill_hold": True,
                             "hit_token_seconds": HTS, "prefill_overhead_s": OV, "decode_kv": False,
                             "engine_steps": False}  # fmt: skip
    cases = (("dynamo", {}), ("least-loaded", {"metric": "prefill_tokens"}))
    for row, (router, params) in zip(out["rows"], cases, strict=True):
        lib = _lib(path, rows, 3, 40, router, params).summary()
        for k in ("token_hit_ratio", "mean_wait", "imbalance_requests", "prefill_tokens", "rejected"):
            assert row[k] == lib[k], (router, k)
        # the options matter here: without them the library gives another answer (the test can fail)
        plain = _lib(path, rows, 3, 40, router, params, ph=False, hts=0.0, ov=0.0).summary()
        assert plain["token_hit_ratio"] != lib["token_hit_ratio"]
        # block-id rows: the exact replays run under the same timing (tests/test_fleet_blocks.py pins their values)
        assert row["estimate_method"] == "replay-mean" and 0 < row["estimate"] < 1
    assert not any("no estimate" in n for n in out["notes"])
    # the replays queue and reject as the run does: no "the estimates do not model queueing" note for them
    assert max(r["mean_wait"] for r in out["rows"]) > 0 and not any("queueing" in n for n in out["notes"])


def test_decode_alone_equals_the_library(mc):
    path, rows = mc
    out = _json(["fleet", "simulate", "--blocks-trace", str(path), "--replicas", "2", "--N", "40", "--router",
                 "dynamo", "--prefill-tokens-per-s", str(P), "--decode-tokens-per-s", str(D), "--json"])  # fmt: skip
    assert out["timing"]["prefill_hold"] is False and out["timing"]["hit_token_seconds"] == 0.0
    lib = _lib(path, rows, 2, 40, "dynamo", ph=False, hts=0.0, ov=0.0)
    assert out["rows"][0]["token_hit_ratio"] == lib.token_hit_ratio()


def test_curve_equals_the_library(mc):
    path, rows = mc
    out = _json(["fleet", "curve", "--blocks-trace", str(path), "--replicas", "3", "--N", "40", "--router", "dynamo",
                 "--values", "0,1", *TIMING, "--no-baselines", "--json"])  # fmt: skip
    assert out["timing"]["prefill_hold"] is True
    for row in out["rows"]:
        lib = _lib(path, rows, 3, 40, "dynamo", {"overlap_score_credit": row["value"]})
        assert row["token_hit_ratio"] == lib.token_hit_ratio()
        assert row["mean_wait"] == lib.summary()["mean_wait"]


def test_plan_equals_the_library(mc):
    path, rows = mc
    out = _json(["fleet", "plan", "--blocks-trace", str(path), "--target", "0.99", "--N", "40", "--max-replicas",
                 "2", "--router", "dynamo", *TIMING, "--json"])  # fmt: skip
    assert out["timing"]["hit_token_seconds"] == HTS
    got = {r["replicas"]: r["token_hit_ratio"] for r in out["rows"]}
    assert 2 in got
    assert got[2] == _lib(path, rows, 2, 40, "dynamo").token_hit_ratio()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--decode-tokens-per-s", "20"], "--decode-tokens-per-s: needs --prefill-tokens-per-s"),
        (["--hit-token-seconds", "0.001"], "--hit-token-seconds: needs --prefill-tokens-per-s"),
        (["--prefill-hold"], "--prefill-hold: needs --prefill-tokens-per-s"),
        (["--prefill-overhead-s", "0.01"], "--prefill-overhead-s: needs --prefill-tokens-per-s"),
        (["--prefill-tokens-per-s", "2000", "--prefill-overhead-s", "-1"], "--prefill-overhead-s"),
        (["--prefill-tokens-per-s", "2000", "--prefill-hold"], "--prefill-hold: needs --decode-tokens-per-s"),
        (["--prefill-tokens-per-s", "2000", "--decode-tokens-per-s", "-1"], "--decode-tokens-per-s"),
        (["--prefill-tokens-per-s", "2000", "--decode-tokens-per-s", "nan"], "--decode-tokens-per-s"),
        (["--prefill-tokens-per-s", "2000", "--hit-token-seconds", "-0.001"], "--hit-token-seconds"),
        (["--prefill-tokens-per-s", "2000", "--hit-token-seconds", "nan"], "--hit-token-seconds"),
        (["--prefill-tokens-per-s", "2000", "--hit-token-seconds", "0.001"], "at most 1/--prefill-tokens-per-s"),
        (
            [
                "--prefill-tokens-per-s",
                "2000",
                "--decode-tokens-per-s",
                "20",
                "--prefill-hold",
                "--router",
                "round-robin,llm-d,sglang",
            ],
            "--prefill-hold: only dynamo",
        ),  # fmt: skip
        (
            [
                "--prefill-tokens-per-s",
                "2000",
                "--decode-tokens-per-s",
                "20",
                "--prefill-hold",
                "--router",
                "least-loaded",
            ],
            "--prefill-hold: only dynamo",
        ),  # fmt: skip (least-loaded counts requests by default)
    ],
)
def test_simulate_refusals_one_line_exit_2(mc, args, needle):
    base = ["fleet", "simulate", "--blocks-trace", str(mc[0]), "--replicas", "2", "--N", "40"]
    if "--router" not in args:
        base += ["--router", "dynamo"]
    r = runner.invoke(app, base + args)
    assert r.exit_code == 2, r.output
    err = r.stderr.strip() if r.stderr else r.output.strip()
    assert needle in err and "Traceback" not in r.output, err
    assert len(err.splitlines()) == 1


def test_curve_and_plan_refusals(mc, tmp_path):
    path = str(mc[0])
    r = runner.invoke(app, ["fleet", "curve", "--blocks-trace", path, "--replicas", "2", "--N", "40", "--router",
                            "llm-d", "--prefill-tokens-per-s", "2000", "--decode-tokens-per-s", "20",
                            "--prefill-hold"])  # fmt: skip
    assert r.exit_code == 2 and "--prefill-hold: only dynamo" in (r.stderr or r.output)
    # a kvhit trace without response_tokens has no output lengths for a decode time
    tr = tmp_path / "t.parquet"
    g = runner.invoke(app, ["trace", "generate", "--lam0", "0.5", "--p", "0.75", "--x-mean", "4", "--y-mean", "3",
                            "--w-mean", "60", "-n", "50", "--seed", "1", "-o", str(tr)])  # fmt: skip
    assert g.exit_code == 0, g.output
    r = runner.invoke(app, ["fleet", "plan", "--trace", str(tr), "--target", "0.5", "--N", "60", "--block-size", "16",
                            "--prefill-tokens-per-s", "2000", "--decode-tokens-per-s", "20"])  # fmt: skip
    assert r.exit_code == 2 and "--decode-tokens-per-s: this workload has no output lengths" in (r.stderr or r.output)
    for cmd in (["simulate", "--replicas", "2"], ["plan", "--target", "0.5"]):
        r = runner.invoke(app, ["fleet", *cmd, "--trace", str(tr), "--N", "60", "--block-size", "16", "--decode-kv"])
        err = (r.stderr or r.output).strip()
        want = "--decode-kv: this workload has no output lengths (a kvhit trace without response_tokens, or streams"
        assert r.exit_code == 2 and want in err
        assert len(err.splitlines()) == 1 and "Traceback" not in r.output
    r = runner.invoke(app, ["fleet", "plan", "--blocks-trace", path, "--target", "0.5", "--N", "40", "--lam0", "0.1",
                            "--decode-kv"])  # fmt: skip
    assert r.exit_code == 2 and "--decode-kv: this workload has no output lengths" in (r.stderr or r.output)


def test_decode_kv_curve_and_plan_equal_the_library(mc):
    """``--decode-kv`` on ``fleet curve`` and ``fleet plan``: simulate_fleet colocated, the generated tokens' blocks
    fresh ids after the prompt's (ProductionTrace.to_block_requests), with the same holds; it changes the answer."""
    path, rows = mc
    pt = read_blocks_trace(path, "sequential", None, None, 0)
    rq = pt.to_block_requests(colocated=True)
    T = np.array([r["input_length"] for r in rows], float)
    O = np.array([r["output_length"] for r in rows], float)
    pre = OV + T / P
    hold = pre + np.maximum(O - 1, 0) / D

    def lib(R, params=None, colocated=True):
        off, hs = (rq.hash_offsets, rq.hashes) if colocated else (pt.hash_offsets, pt.hashes)
        kw = dict(colocated=True, response_tokens=rq.response_tokens) if colocated else {}
        return simulate_fleet(pt.prompt_tokens, off, hs, np.asarray(pt.session, np.int64), Ns=[40] * R, block_size=512,
                              router="dynamo", router_params=params, times=pt.time, hold=hold, prefill_hold=pre,
                              hit_token_seconds=HTS, **kw).token_hit_ratio()  # fmt: skip

    out = _json(["fleet", "curve", "--blocks-trace", str(path), "--replicas", "3", "--N", "40", "--router", "dynamo",
                 "--values", "0,1", *TIMING, "--decode-kv", "--no-baselines", "--json"])  # fmt: skip
    assert out["timing"]["decode_kv"] is True
    for row in out["rows"]:
        assert row["token_hit_ratio"] == lib(3, {"overlap_score_credit": row["value"]})
    assert lib(3) != lib(3, colocated=False)
    out = _json(["fleet", "plan", "--blocks-trace", str(path), "--target", "0.99", "--N", "40", "--max-replicas", "2",
                 "--router", "dynamo", *TIMING, "--decode-kv", "--json"])  # fmt: skip
    got = {r["replicas"]: r["token_hit_ratio"] for r in out["rows"]}
    assert got[2] == lib(2)


def test_hit_token_seconds_on_a_kvhit_trace_equals_the_library(tmp_path):
    """No decode: ``--hit-token-seconds`` alone, on a generated trace (prefill holds shortened by hits)."""
    from kvhit.service.inputs import window_for
    from kvhit.sim.runner import block_requests
    from kvhit.workload import Trace

    tr_p = tmp_path / "t.parquet"
    g = runner.invoke(app, ["trace", "generate", "--lam0", "0.5", "--p", "0.75", "--x-mean", "4", "--y-mean", "3",
                            "--w-mean", "60", "-n", "300", "--seed", "2", "-o", str(tr_p)])  # fmt: skip
    assert g.exit_code == 0, g.output
    out = _json(["fleet", "simulate", "--trace", str(tr_p), "--replicas", "3", "--N", "60", "--block-size", "16",
                 "--router", "dynamo", "--prefill-tokens-per-s", "20", "--hit-token-seconds", "0.05",
                 "--json"])  # fmt: skip
    tr = Trace.read(tr_p)
    rq = block_requests(tr, block_size=16)
    mask = window_for(tr, None, None).mask(tr)
    lib = simulate_fleet(
        rq.prompt_tokens, rq.hash_offsets, rq.hashes, tr.dense_conv(), Ns=[60] * 3, block_size=16, router="dynamo",
        times=tr["time"], hold=np.asarray(rq.prompt_tokens) / 20.0, hit_token_seconds=0.05,
    )  # fmt: skip
    assert out["rows"][0]["token_hit_ratio"] == lib.token_hit_ratio(mask)
    assert out["rows"][0]["mean_wait"] == lib.summary(mask)["mean_wait"]


def test_fleet_timing_holds_closed_form():
    """``FleetTiming.holds``: prefill = overhead + T/P, hold = prefill + (O − 1)⁺/D, by hand on three requests."""
    from kvhit.fleet.timing import FleetTiming

    t = FleetTiming(prefill_tokens_per_s=100.0, decode_tokens_per_s=10.0, prefill_hold=True, hit_token_seconds=0.01,
                    prefill_overhead_s=0.5)  # fmt: skip
    hold, ph, hts = t.holds(np.array([100, 50, 0]), np.array([11, 1, 0]))
    np.testing.assert_array_equal(ph, [1.5, 1.0, 0.5])
    np.testing.assert_array_equal(hold, [2.5, 1.0, 0.5])
    assert hts == 0.01
    assert FleetTiming().holds(np.array([5])) == (None, None, 0.0)
    hold, ph, _ = FleetTiming(prefill_tokens_per_s=100.0).holds(np.array([100]))
    assert ph is None and hold.tolist() == [1.0]


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(decode_tokens_per_s=1.0), "prefill_tokens_per_s: required"),
        (dict(prefill_tokens_per_s=0.0), "prefill_tokens_per_s"),
        (dict(prefill_tokens_per_s=float("nan")), "prefill_tokens_per_s"),
        (dict(prefill_tokens_per_s=10.0, hit_token_seconds=0.2), "hit_token_seconds: at most"),
        (dict(prefill_tokens_per_s=10.0, prefill_hold=True), "prefill_hold: needs decode_tokens_per_s"),
        (dict(prefill_tokens_per_s=10.0, prefill_overhead_s=-1.0), "prefill_overhead_s"),
    ],
)
def test_fleet_timing_refusals(kw, needle):
    from kvhit.fleet.timing import FleetTiming

    with pytest.raises(ValueError, match=needle):
        FleetTiming(**kw)


@settings(max_examples=60, deadline=None)
@given(
    T=st.lists(st.integers(1, 5000), min_size=1, max_size=20),
    P=st.floats(1.0, 1e5),
    frac=st.floats(0.0, 1.0),
    ov=st.floats(0.0, 1.0),
)
def test_hit_token_seconds_never_clips_a_hold(T, P, frac, ov):
    """At any ``hit_token_seconds ≤ 1/P`` and any hit ≤ T, ``prefill − hts · hit ≥ 0``: the simulator's clip at 0
    never acts beyond rounding (the invariant :mod:`kvhit.fleet.timing` states)."""
    from kvhit.fleet.timing import FleetTiming

    hts = frac / P
    _, ph, h = FleetTiming(prefill_tokens_per_s=P, decode_tokens_per_s=1.0, prefill_hold=True, hit_token_seconds=hts,
                           prefill_overhead_s=ov).holds(np.array(T), np.ones(len(T)))  # fmt: skip
    assert (ph - h * np.array(T, float) >= -1e-12 * ph).all()  # up to the rounding of 1/P · T against T/P
