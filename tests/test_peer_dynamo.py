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
