"""`kvhit tiers --tier hicache` (service.tiers): SGLang HiCache curves through the service layer and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvhit.cli import main
from kvhit.sim.engine import replay
from kvhit.sim.sglang.engine import SglangEngine
from kvhit.sim.tiers.hicache import host_tokens
from kvhit.sim.tiers.hicache_curve import hicache_surface, token_requests, trace_token_requests
from kvhit.workload.production import read_production
from kvhit.workload.trace import Trace


@pytest.fixture
def mooncake(tmp_path):
    """A tiny Mooncake-format trace (block size 512): conversations returning after others evicted them."""
    rows = [
        (0, 1100, [0, 1, 2]),
        (1, 1200, [3, 4, 5]),
        (2, 1700, [0, 1, 2, 6]),
        (3, 1600, [7, 8, 9, 10]),
        (4, 2100, [3, 4, 5, 11, 15]),
        (5, 700, [12, 13]),
        (6, 2100, [0, 1, 2, 6, 14]),
    ]
    p = tmp_path / "t.jsonl"
    p.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": 10, "hash_ids": h}) + "\n"
            for t, n, h in rows
        )
    )
    return p


def run(args, capsys):
    rc = main(args)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_json_equals_library(mooncake, capsys):
    rc, out, _ = run(
        ["tiers", "--blocks-trace", str(mooncake), "--tier", "hicache", "--hbm-blocks", "4,6",
         "--hicache-ratio", "0.5,1,4", "--target", "0.3", "--json"],
        capsys,
    )  # fmt: skip
    assert rc == 0
    res = json.loads(out)
    rq = read_production(mooncake).to_block_requests()
    reqs = token_requests(rq.prompt_tokens, rq.hash_offsets, rq.hashes, 512)
    grid = [[host_tokens(N * 512, ratio=r) for r in (0.5, 1, 4)] for N in (4, 6)]
    s = hicache_surface(reqs, hbm_blocks=[4, 6], block_size=512, host_tokens=grid, columns=[0.5, 1, 4])
    assert res["h"] == s.hit.tolist() and res["h_gpu"] == s.gpu_hit.tolist()
    assert res["host_tokens"] == grid and grid[0] == [1025, 2049, 8193]
    assert res["h_device"] == s.device_hit.tolist()
    # h_gpu is plain SGLang: the engine without a host tier on the same requests
    plain = replay(SglangEngine(4 * 512), reqs)
    assert res["h_gpu"][0] == plain.hit_tokens.sum() / rq.prompt_tokens.sum()
    # 4 device blocks hold one conversation: the host pool brings the others back
    assert res["h"][0][2] > res["h_gpu"][0]
    need = res["ratio_for_target"]
    for i, row in enumerate(res["h"]):
        ok = [r for r, h in zip((0.5, 1, 4), row, strict=True) if h >= 0.3]
        assert need[i] == (min(ok) if ok else None)
    assert res["dram_for_target"] is None and res["host_units"] == []


def test_zero_host_tokens_is_plain_sglang_and_policies_differ(mooncake, capsys):
    cols = {}
    for pol in ("write_through", "write_through_selective", "write_back"):
        rc, out, _ = run(
            ["tiers", "--blocks-trace", str(mooncake), "--tier", "hicache", "--hbm-blocks", "4",
             "--host-units", "0,8192", "--hicache-write-policy", pol, "--json"],
            capsys,
        )  # fmt: skip
        assert rc == 0
        res = json.loads(out)
        assert res["h"][0][0] == res["h_gpu"][0]  # no host pool
        cols[pol] = res["h"][0][1]
    # a request's blocks come back once: selective (backup at the second insert) gains less than write_through
    assert cols["write_through_selective"] < cols["write_through"]


def test_table_and_plot(mooncake, tmp_path, capsys):
    fig = tmp_path / "hc"
    rc, out, _ = run(
        ["tiers", "--blocks-trace", str(mooncake), "--tier", "hicache", "--hbm-blocks", "4",
         "--hicache-ratio", "1,4", "--target", "0.3", "--plot", str(fig)],
        capsys,
    )  # fmt: skip
    assert rc == 0
    assert "without HiCache" in out and "--hicache-ratio reaching the target" in out
    assert (tmp_path / "hc.png").stat().st_size > 0


def test_dram_gb_is_hicache_size_per_rank(mooncake, capsys):
    rc, out, _ = run(
        ["tiers", "--blocks-trace", str(mooncake), "--tier", "hicache", "--hbm-blocks", "4",
         "--dram-gb", "0,1", "--tp", "2", "--json"],
        capsys,
    )  # fmt: skip
    assert rc == 0
    res = json.loads(out)
    from kvhit.plan import model_config

    bpt = model_config.resolve_model("qwen3-8b").bytes_per_token("bf16", 2)
    assert res["host_tokens"] == [[0, int(2**30 / 2 // bpt) + 1]]


@pytest.mark.parametrize(
    "extra, msg",
    [
        (["--tier", "native", "--hicache-ratio", "2"], "--hicache-ratio: applies to --tier hicache only"),
        (["--tier", "native", "--host-units", "2", "--hicache-write-policy", "write_back"], "--hicache-write-policy"),
        (["--tier", "hicache", "--hicache-ratio", "2", "--host-units", "8"], "give exactly one"),
        (["--tier", "hicache"], "give exactly one"),
        (["--tier", "hicache", "--hicache-ratio", "2", "--page-size", "3"], "--page-size: 3 does not divide"),
        (["--tier", "hicache", "--host-units", "10", "--page-size", "4"], "--host-units: 10 host tokens"),
        (["--tier", "hicache", "--hicache-ratio", "2", "--policy", "arc"], "--policy: applies to the vLLM"),
        (["--tier", "hicache", "--hicache-ratio", "0"], "--hicache-ratio"),
    ],
)
def test_refusals(mooncake, capsys, extra, msg):
    rc, _, err = run(["tiers", "--blocks-trace", str(mooncake), "--hbm-blocks", "4", *extra], capsys)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_trace_token_ids_are_used_when_kept():
    n = 3
    cols = {
        "conv": np.array([0, 0, 1]),
        "conv_arrival": np.zeros(n),
        "turn": np.array([1, 2, 1]),
        "time": np.array([0.0, 1.0, 2.0]),
        "M": np.array([2, 2, 1], np.int32),
        "Z": np.ones(n, np.int64),
        "R": np.array([1, 2, 1], np.int64),
    }
    tr = Trace.from_columns(cols, lists={"new_tokens": [np.array([1, 2, 3]), np.array([4, 5]), np.array([1, 2, 9])]})
    reqs = trace_token_requests(tr)
    assert [q.token_ids for q in reqs] == [(1, 2, 3), (1, 2, 3, 4, 5), (1, 2, 9)]
    assert trace_token_requests(Trace.from_columns(cols)) is None
