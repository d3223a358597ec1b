"""conformance/check_dynamo_mocker.py, the kvhit side of the Dynamo mocker peer check: the timing mappings, the
output-block stream and the one-line refusals (the mocker side needs its own environment: make peer-dynamo)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "conformance"))
import check_dynamo_mocker as c  # noqa: E402

from kvhit.workload.production import read_mooncake  # noqa: E402

PROBE = {"prefill_fit_ms": {"a": 10.0, "s_per_token": 0.02}, "itl_ms": 5.0}
CELL = {"R": 2, "N": 64, "runs": [{"hit": 0.1, "mean_itl_ms": 8.0}, {"hit": 0.2, "mean_itl_ms": 12.0}]}


def _trace(tmp_path):
    p = tmp_path / "t.jsonl"
    recs = [
        {"timestamp": 0, "input_length": 1030, "output_length": 600, "hash_ids": [0, 1, 2]},
        {"timestamp": 1000, "input_length": 1536, "output_length": 1, "hash_ids": [0, 1, 3]},
        {"timestamp": 2000, "input_length": 512, "output_length": 0, "hash_ids": [0]},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p, read_mooncake(p, block_size=512)


def test_timing_mappings_by_hand(tmp_path):
    _, tr = _trace(tmp_path)
    T = np.array([1030, 1536, 512.0])
    pre = (10.0 + 0.02 * T) / 1000
    assert c.timing(tr, "instant", PROBE, CELL) == (None, None, 0.0)
    hold, ph, hts = c.timing(tr, "prefill", PROBE, CELL)
    np.testing.assert_allclose(hold, pre)
    assert ph is None and hts == 0.0
    hold, ph, hts = c.timing(tr, "isolated", PROBE, CELL)
    np.testing.assert_allclose(ph, pre)
    np.testing.assert_allclose(hold, pre + np.array([599, 0, 0]) * 0.005)
    assert hts == pytest.approx(2e-5)
    hold, _, _ = c.timing(tr, "loaded", PROBE, CELL)  # the mean of the cell's runs' mean ITL: 10 ms
    np.testing.assert_allclose(hold, pre + np.array([599, 0, 0]) * 0.010)


def test_output_blocks_keep_the_prompt_ids_then_fresh_ones(tmp_path):
    _, tr = _trace(tmp_path)
    off, hs = c.with_output_blocks(tr, 512)
    # kv tokens 1030 + 599 = 1629 → 3 blocks; 1536 + 0 → 3; 512 → 1
    assert off.tolist() == [0, 3, 6, 7]
    assert hs[:2].tolist() == tr.hashes[:2].tolist() and hs[2] < 0  # the partial prompt block filled by output
    assert hs[3:6].tolist() == tr.hashes[2:5].tolist() and hs[6] == tr.hashes[5]
    assert len(set(hs[hs < 0].tolist())) == int((hs < 0).sum())


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--rows", "bogus:prompt"], "--rows/--target"),
        (["--target", "isolated"], "--rows/--target"),
        (["--rows", "engine:prompt"], "--rows/--target"),
        (["--rows", "isolated:steps"], "--rows/--target"),
        (["--seeds", "0"], "--seeds"),
        (["--mocker-json", "/nonexistent.json"], "--mocker-json"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, msg):
    p, _ = _trace(tmp_path)
    mj = tmp_path / "m.json"
    mj.write_text(
        json.dumps({"block_size": 512, "trace": str(p), "ai_dynamo": "1.6.1", "cells": [CELL], "probe": PROBE})
    )
    base = ["--mocker-json", str(mj)]
    r = subprocess.run([sys.executable, str(ROOT / "conformance" / "check_dynamo_mocker.py"), *base, *args],
                       capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "",
                            "NUMBA_CACHE_DIR": str(ROOT / ".numba_cache")})  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert msg in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def _busy_trace(tmp_path, n=240, convs=16, seed=3):
    """A Mooncake-format file busy enough that the timing and the decode KV change Dynamo's routing: conversations
    growing by 1–3 blocks of 512 tokens a turn, requests 0–60 ms apart, outputs 1–1,500 tokens."""
    rng = np.random.default_rng(seed)
    hist: list[list[int]] = [[] for _ in range(convs)]
    nxt = t = 0
    rows = []
    for _ in range(n):
        k = int(rng.integers(convs))
        add = int(rng.integers(1, 4))
        hist[k] = hist[k] + list(range(nxt, nxt + add))
        nxt += add
        ids = hist[k][-10:]
        rows.append({"timestamp": t, "input_length": len(ids) * 512 - int(rng.integers(0, 512)),
                     "output_length": int(rng.integers(1, 1500)), "hash_ids": ids})  # fmt: skip
        t += int(rng.integers(0, 60))
    p = tmp_path / "busy.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p, read_mooncake(p, block_size=512)


@pytest.mark.parametrize("mapping", ["isolated", "loaded"])
def test_cli_decode_kv_reproduces_the_peer_check(tmp_path, mapping):
    """``fleet simulate --decode-kv`` with the mapping's speeds as flags gives the peer check's ``mapping:output``
    value (check_dynamo_mocker.run_cell: with_output_blocks, colocated) — the library call docs/peers.md reports;
    without ``--decode-kv`` the ``:prompt`` value, which differs here (the test sees the flag)."""
    from typer.testing import CliRunner

    from kvhit.cli import app

    p, tr = _busy_trace(tmp_path)
    probe = {"prefill_fit_ms": {"a": 10.87, "s_per_token": 0.018848}, "itl_ms": 5.764}
    cell = {"R": 3, "N": 40, "runs": [{"mean_itl_ms": 7.0}, {"mean_itl_ms": 9.0}]}
    itl = 5.764 if mapping == "isolated" else 8.0
    flags = ["--prefill-tokens-per-s", repr(1000 / 0.018848), "--prefill-overhead-s", repr(10.87 / 1000),
             "--hit-token-seconds", repr(0.018848 / 1000), "--decode-tokens-per-s", repr(1000 / itl),
             "--prefill-hold"]  # fmt: skip
    base = ["fleet", "simulate", "--blocks-trace", str(p), "--replicas", "3", "--N", "40", "--router", "dynamo",
            "--seed", "1", "--no-estimates", "--json", *flags]  # fmt: skip
    run = CliRunner().invoke
    got = {}
    for kv in ("output", "prompt"):
        r = run(app, base + (["--decode-kv"] if kv == "output" else []))
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert out["timing"]["decode_kv"] is (kv == "output")
        got[kv] = out["rows"][0]["token_hit_ratio"]
        want = c.run_cell(tr, cell, mapping, kv, probe, [1], 512, c.with_output_blocks(tr, 512))[0]
        assert got[kv] == pytest.approx(want, abs=1e-12), kv
    assert abs(got["output"] - got["prompt"]) > 1e-4


def test_engine_row_runs_the_engine_fleet_against_first_admissions(tmp_path):
    """``engine:steps``: kvhit's side is simulate_engine_fleet per seed; the mocker's side the mean of its runs'
    ``hit_first_admission`` (kvhit counts first admissions), the all-admissions mean kept beside it."""
    from kvhit.fleet.engine_fleet import simulate_engine_fleet

    p, tr = _trace(tmp_path)
    cell = {"R": 2, "N": 64, "mean_hit": 0.15, "spread": 0.1,
            "runs": [{"hit": 0.1, "hit_first_admission": 0.05}, {"hit": 0.2, "hit_first_admission": 0.07}]}  # fmt: skip
    mj, out = tmp_path / "m.json", tmp_path / "o.json"
    mj.write_text(json.dumps({"block_size": 512, "trace": str(p), "ai_dynamo": "1.6.1", "cells": [cell]}))
    rc = c.main(["--mocker-json", str(mj), "--rows", "engine:steps", "--seeds", "2", "--json", str(out), "--tol", "1"])
    assert rc == 0
    (row,) = json.loads(out.read_text())["rows"]
    want = [simulate_engine_fleet(tr.prompt_tokens, tr.output_tokens, tr.hash_offsets, tr.hashes, tr.time,
                                  Ns=[64, 64], block_size=512, seed=sd).token_hit_ratio() for sd in (0, 1)]  # fmt: skip
    assert row["kvhit_seeds"] == want
    assert row["mocker"] == pytest.approx(0.06) and row["mocker_all_admissions"] == 0.15
    assert row["gap"] == pytest.approx(np.mean(want) - 0.06)
