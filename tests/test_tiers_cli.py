"""`kvhit tiers` (service.tiers): the surface through the service layer; bad input is one line, exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvhit.cli import main
from kvhit.sim.tiers.sizing import host_units
from kvhit.sim.tiers.surface import hit_surface
from kvhit.workload.production import read_production


@pytest.fixture
def mooncake(tmp_path):
    """A tiny Mooncake-format trace (block size 512): two conversations sharing a system prompt block."""
    rows = [
        (0, 1100, [0, 1, 2]),
        (1, 1200, [0, 3, 4]),
        (2, 1700, [0, 1, 2, 5]),
        (3, 1600, [0, 3, 4, 6]),
        (4, 2100, [0, 1, 2, 5, 7]),
        (5, 700, [8, 9]),
        (6, 2100, [0, 1, 2, 5, 7]),
    ]
    p = tmp_path / "t.jsonl"
    p.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": 10, "hash_ids": h}) + "\n"
            for t, n, h in rows
        )
    )
    return p


def test_tiers_json_equals_library(mooncake, capsys):
    rc = main(["tiers", "--blocks-trace", str(mooncake), "--hbm-blocks", "4,8", "--host-units", "0,2,6", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rq = read_production(mooncake).to_block_requests()
    s = hit_surface(
        rq.prompt_tokens, rq.hash_offsets, rq.hashes, tier="native", gpu_blocks=[4, 8], host=[0, 2, 6], block_size=512
    )
    assert out["h"] == s.hit.tolist() and out["h_gpu"] == s.gpu_hit.tolist()
    assert [row[0] for row in out["h"]] == out["h_gpu"]  # no host tier: the GPU alone
    assert out["h"][0][2] > out["h"][0][0]  # the host tier serves what 4 GPU blocks lost


def test_tiers_dram_gb_conversion_and_plot(mooncake, tmp_path, capsys):
    fig = tmp_path / "surf"
    rc = main(
        ["tiers", "--blocks-trace", str(mooncake), "--tier", "simple", "--hbm-blocks", "4", "--hbm-blocks", "8",
         "--dram-gb", "0.2,1", "--model", "qwen3-8b", "--plot", str(fig), "--json"]
    )  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    from kvhit.plan import model_config

    bpb = model_config.resolve_model("qwen3-8b").bytes_per_block(512, "bf16", 1)
    assert out["host_units"] == [host_units("simple", int(g * 2**30), bytes_per_block_rank=bpb, block_size=512)
                                 for g in (0.2, 1)]  # fmt: skip
    assert (tmp_path / "surf.png").stat().st_size > 0 and (tmp_path / "surf.svg").stat().st_size > 0


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--hbm-blocks", "4", "--host-units", "1"], "--trace and --blocks-trace"),
        (["--blocks-trace", "{t}", "--hbm-blocks", "4"], "--dram-gb and --host-units"),
        (["--blocks-trace", "{t}", "--hbm-blocks", "4", "--host-units", "1", "--dram-gb", "1"], "--dram-gb and"),
        (["--blocks-trace", "{t}", "--hbm-blocks", "1.5", "--host-units", "1"], "--hbm-blocks"),
        (["--blocks-trace", "{t}", "--hbm-blocks", "0", "--host-units", "1"], "--hbm-blocks"),
        (["--blocks-trace", "{t}", "--hbm-blocks", "4", "--host-units", "1", "--tier", "lmcache"], "--chunk-tokens"),
        (["--blocks-trace", "{t}", "--hbm-blocks", "4", "--host-units", "0", "--tier", "simple"], "simple tier"),
        (["--blocks-trace", "{t}", "--hbm-blocks", "4", "--host-units", "1", "--tier", "lru"], "--tier"),
        (["--blocks-trace", "{t}", "--hbm-blocks", "4", "--host-units", "0", "--tier", "simple-lazy"], "simple-lazy"),
        (
            ["--blocks-trace", "{t}", "--hbm-blocks", "4", "--host-units", "1", "--max-num-batched-tokens", "8"],
            "--max-num-batched-tokens",
        ),
        (["--blocks-trace", "{t}", "--hbm-blocks", "4", "--host-units", "2", "--tier", "simple-lazy",
          "--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
        (["--blocks-trace", "{t}", "--hbm-blocks", "4", "--host-units", "2", "--tier", "simple-lazy",
          "--estimate", "only"], "--estimate"),
        (["--blocks-trace", "/nonexistent.jsonl", "--hbm-blocks", "4", "--host-units", "1"], "--blocks-trace"),
    ],
)  # fmt: skip
def test_tiers_bad_input_one_line_exit_2(mooncake, capsys, args, flag):
    rc = main(["tiers", *[a.replace("{t}", str(mooncake)) for a in args]])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and flag in err, err
    assert "Traceback" not in err


def test_tiers_simple_lazy_equals_library(mooncake, capsys):
    """--tier simple-lazy: the JSON is the library's replay; 0 GiB is vLLM's one-block (null-only) CPU pool, the
    GPU alone; --max-num-batched-tokens reaches the model."""
    from kvhit.sim.engine import replay, requests_from_stream
    from kvhit.sim.tiers import make_tiered

    args = ["tiers", "--blocks-trace", str(mooncake), "--tier", "simple-lazy", "--hbm-blocks", "4,8", "--json"]
    rc = main([*args, "--host-units", "1,3,6", "--max-num-batched-tokens", "512"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rq = read_production(mooncake).to_block_requests()
    reqs = requests_from_stream(rq.prompt_tokens, rq.hash_offsets, rq.hashes)
    for i, N in enumerate((4, 8)):
        for j, C in enumerate((1, 3, 6)):
            e = make_tiered("simple-lazy", gpu_blocks=N, host_capacity=C, block_size=512, max_num_batched_tokens=512)
            res = replay(e, reqs)
            adm = [q.prompt_tokens for q, o in zip(reqs, res.outcomes, strict=True) if o is not None]
            assert out["h"][i][j] == pytest.approx(sum(o.hit_tokens for o in res.outcomes if o) / sum(adm))
    assert [row[0] for row in out["h"]] == out["h_gpu"]  # one CPU block = the null block: no host tier
    assert out["tier"].startswith("simple-lazy")
    rc = main([*args, "--dram-gb", "0,1"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["host_units"][0] == 1 and [row[0] for row in out["h"]] == out["h_gpu"]


def test_tiers_ttft_saved(mooncake, capsys):
    """TTFT saved = Σ loaded tokens · (1/prefill − bytes_per_token/bandwidth) / requests, per pair."""
    args = ["tiers", "--blocks-trace", str(mooncake), "--hbm-blocks", "4", "--host-units", "0,6", "--json"]
    rc = main([*args, "--prefill-tokens-per-s", "10000", "--pcie-gb-per-s", "20"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    from kvhit.plan import model_config

    bpt = model_config.resolve_model("qwen3-8b").bytes_per_token("bf16", 1)
    rq = read_production(mooncake).to_block_requests()
    T = rq.prompt_tokens
    adm = -(-T // 512) <= 4  # a request needing more than the 4 GPU blocks is rejected
    load = (out["h"][0][1] - out["h_gpu"][0]) * T[adm].sum()
    assert out["ttft_saved_s"][0][0] == 0.0
    assert out["ttft_saved_s"][0][1] == pytest.approx(load * (1e-4 - bpt / 20e9) / adm.sum(), rel=1e-9)


def test_plan_tiers_on_a_hand_grid():
    from kvhit.plan.tiers import cheapest_split, dram_for_target

    H = np.array([[0.1, 0.3, 0.25, 0.5], [0.4, 0.45, 0.5, 0.6]])  # not monotone in DRAM (row 0)
    dram = np.array([0, 64, 128, 256])
    assert dram_for_target(H, dram, 0.3) == [64.0, 0.0]
    assert dram_for_target(H, dram, 0.55) == [None, 256.0]
    # HBM 80 / 160 GiB at 10/GiB, DRAM at 1/GiB: (80, 256) costs 1056, (160, 0) costs 1600 -> first
    sp = cheapest_split(H, [80, 160], dram, 0.4, 10.0, 1.0)
    assert (sp.hbm_gib, sp.dram_gib, sp.cost, sp.h) == (80.0, 256.0, 1056.0, 0.5)
    assert cheapest_split(H, [80, 160], dram, 0.7, 10.0, 1.0) is None


def test_tiers_target_and_prices(mooncake, capsys):
    args = ["tiers", "--blocks-trace", str(mooncake), "--hbm-blocks", "4,8", "--dram-gb", "0,0.2,1", "--json"]
    rc = main([*args, "--target", "0.3", "--price-hbm-per-gib", "20", "--price-dram-per-gib", "2"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    from kvhit.plan.tiers import cheapest_split, dram_for_target

    assert out["dram_for_target"] == dram_for_target(np.array(out["h"], float), np.array([0, 0.2, 1]), 0.3)
    sp = cheapest_split(np.array(out["h"], float), out["hbm_gib"], np.array([0, 0.2, 1]), 0.3, 20, 2)
    assert (out["cheapest"] is None) == (sp is None)
    rc = main([*args, "--price-hbm-per-gib", "20"])
    assert rc == 2 and "give both" in capsys.readouterr().err


def test_kv_dram_capacity(capsys):
    rc = main(["kv", "--model", "qwen3-8b", "--block-size", "16", "--tp", "2", "--dram-gb", "64", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    t = out["host_tier"]
    bpb = out["bytes_per_block"]  # per rank
    assert t["native_chunks"] == (64 << 30) // (bpb * 2)  # one chunk holds both ranks' copies
    assert t["simple_cpu_blocks"] == (32 << 30) // bpb  # per rank
    assert t["lmcache_chunks_per_rank"] == (32 << 30) // (bpb * 16)  # 256-token chunks, per rank
    rc = main(["kv", "--block-size", "48", "--dram-gb", "1"])
    assert rc == 2 and "--chunk-tokens" in capsys.readouterr().err


def test_tiers_prints_tables_like_every_other_command(mooncake, capsys):
    """Issue 21: ``tiers`` printed ``|``-separated rows; it prints the bordered tables the other commands print,
    with the same numbers as ``--json`` (4 decimals) in every cell."""
    args = ["tiers", "--blocks-trace", str(mooncake), "--hbm-blocks", "4,8", "--host-units", "0,2,6"]
    assert main([*args, "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert main([*args, "--estimate", "also", "--prefill-tokens-per-s", "5000"]) == 0
    out = capsys.readouterr().out
    assert " | " not in out
    assert out.count("┏") == 3 and out.count("└") == 3  # the surface, the estimate, the TTFT saved
    head = next(ln for ln in out.splitlines() if "HBM blocks" in ln)
    assert [c.strip() for c in head.strip("┃ ").split("┃")] == [
        "HBM blocks",
        "GPU only",
        "0 units",
        "2 units",
        "6 units",
    ]
    rows = [ln for ln in out.splitlines() if ln.startswith("│")]
    for N, hg, h in zip(js["hbm_blocks"], js["h_gpu"], js["h"], strict=True):
        cells = [c.strip() for c in rows.pop(0).strip("│ ").split("│")]
        assert cells == [f"{N:,}", f"{hg:,.4f}", *(f"{v:,.4f}" for v in h)]


def test_tiers_simple_estimate_model_by_trace_kind(mooncake, tmp_path, capsys):
    """simple eager: a block-id trace is estimated by the one-displacement estimator, a kvhit trace by the
    store-time recency model (docs/estimators.md §5.2), each equal to estimate_tiers with that model, and the
    notes say which; the two models differ here (the test sees a swap)."""
    from kvhit.estimate.tiers import estimate_tiers

    args = ["--tier", "simple", "--hbm-blocks", "4,8", "--host-units", "1,6", "--estimate", "also", "--json"]
    assert main(["tiers", "--blocks-trace", str(mooncake), *args]) == 0
    out = json.loads(capsys.readouterr().out)
    pt = read_production(mooncake)
    one = estimate_tiers(pt, [4, 8], [1, 6], tier="simple", simple_model="onedim").hit
    rec = estimate_tiers(pt, [4, 8], [1, 6], tier="simple", simple_model="recency").hit
    assert np.allclose(out["h_estimate"], one, rtol=0, atol=1e-15) and not np.allclose(one, rec, rtol=0, atol=1e-6)
    assert any("one-displacement estimator on a block-id trace" in n for n in out["notes"])
    tr = tmp_path / "sg.parquet"
    assert main(["trace", "sharegpt", "--source", "tests/data/sharegpt_small.jsonl", "--warmup", "1", "--measured",
                 "1", "--cache-dir", str(tmp_path / "cache"), "-o", str(tr)]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["tiers", "--trace", str(tr), *args[:2], "--hbm-blocks", "60", "--host-units", "20,80",
                 "--estimate", "only", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert any("store-time recency model" in n for n in out["notes"])
    assert not any("one-displacement" in n for n in out["notes"])
    # this tiny trace never looks a full block up again (prompts within one 128-token block of each other): 0, as
    # the simulator says — the recency model once failed here on an empty law table
    assert out["h"] == [[0.0, 0.0]]
    assert main(["tiers", "--trace", str(tr), *args[:2], "--hbm-blocks", "60", "--host-units", "20,80", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["h"] == [[0.0, 0.0]]
