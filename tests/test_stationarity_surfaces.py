"""Issue 24 part 1: every surface that shows a simulated ratio reports whether its measured window reached steady
state — fleet simulate, tiers, stream, plan --verify, sweep (rows and report) — with ``warning: NOT STATIONARY`` in
text. Each surface is pinned on a window that is clearly steady and one that clearly is not; the expected flag,
in-band share and warm-up are recomputed here by brute force (every conversation against every measured turn),
not by :func:`kvhit.workload.stationarity.check_window`."""

from __future__ import annotations

import math

import numpy as np
import pytest

from clihelp import kvhit
from kvhit import service as svc
from kvhit.workload import Exponential, Geometric, PromptResponse, Window, WorkloadSpec, generate

# λ0 = 0.5/s, E[M] = 4, E[W] = 60 s: a conversation lasts (E[M]−1)·E[W] = 180 s; 90 active at steady state
LAM0, TURNS, W = 0.5, 4.0, 60.0
SPEC = {"lam0": LAM0, "mean_turns": TURNS, "x_mean": 4.0, "y_mean": 3.0, "w_mean": W}
SPEC_FLAGS = ["--lam0", "0.5", "--mean-turns", "4", "--x-mean", "4", "--y-mean", "3", "--w-mean", "60"]
N_CONV, N_WARM = 1200, 300  # 300 conversations ≈ 600 s of warm-up ≥ 180 s


def _spec() -> WorkloadSpec:
    return WorkloadSpec(
        LAM0, Geometric.from_mean(TURNS), PromptResponse(Geometric.from_mean(4), Geometric.from_mean(3)), Exponential(W)
    )


def brute(time, conv, measured, reference=None) -> tuple[bool, float, float]:
    """(stationary, in-band share, warm-up s) by a sweep line: each conversation adds one at its first turn and
    removes one just after its last; the active count at a measured turn is the running sum over the distinct
    times up to it (starts at that time counted, ends at that time not yet removed)."""
    time, conv, measured = np.asarray(time, float), np.asarray(conv), np.asarray(measured, bool)
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for t, c in zip(time.tolist(), conv.tolist(), strict=True):
        first[c] = min(first.get(c, t), t)
        last[c] = max(last.get(c, t), t)
    fs, ls = np.array(list(first.values())), np.array([last[c] for c in first])
    u = np.unique(time)
    starts = np.bincount(np.searchsorted(u, fs), minlength=u.size)
    ends = np.bincount(np.searchsorted(u, ls), minlength=u.size)
    at = np.cumsum(starts) - (np.cumsum(ends) - ends)  # started by u_k, minus ended strictly before u_k
    tm = time[measured]
    active = at[np.searchsorted(u, tm)]
    ref = float(np.median(active)) if reference is None else float(reference)
    tol = max(0.15 * ref, 3 * math.sqrt(ref), 1.0)
    share = float(np.mean(np.abs(active - ref) <= tol))
    warm = float(tm.min() - time.min())
    dur = float(np.mean(ls - fs))
    return share >= 0.8 and warm >= dur, share, warm


def _check(report: dict, want: tuple[bool, float, float]) -> None:
    assert report["stationary"] is want[0]
    assert report["in_band_share"] == pytest.approx(want[1], abs=1e-12)
    assert report["warmup_s"] == pytest.approx(want[2], rel=1e-12, abs=1e-9)


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    tr = generate(_spec(), 3, n_conversations=N_CONV)
    tr.meta["block_size"] = 16
    return tr.write(tmp_path_factory.mktemp("steady") / "t.parquet")


@pytest.fixture(scope="module")
def trace_warm_file(tmp_path_factory):
    tr = generate(_spec(), 3, n_conversations=N_CONV)
    tr.meta.update(block_size=16, n_warm=N_WARM)
    return tr.write(tmp_path_factory.mktemp("steady_warm") / "t.parquet")


def _tr(path):
    from kvhit.workload import Trace

    return Trace.read(path)


def test_fleet_simulate_steady_after_warmup_not_from_cold(trace_file):
    tr = _tr(trace_file)
    for warm, steady in ((N_WARM, True), (0, False)):
        res = svc.fleet_simulate(
            svc.build(
                svc.FleetRequest, trace=trace_file, replicas=[2], N=[400], router=["round-robin"], warmup=warm,
                estimates=False,
            )
        )  # fmt: skip
        mask = Window.warmup_conversations(tr, warm).mask(tr) if warm else np.ones(len(tr["time"]), bool)
        want = brute(tr["time"], tr["conv"], mask)
        assert want[0] is steady
        _check(res.stationarity, want)
        assert any(n.startswith("NOT STATIONARY") for n in res.notes) is (not steady)
    r = kvhit("fleet", "simulate", "--trace", trace_file, "--replicas", "2", "--N", "400", "--warmup", "0")
    assert r.code == 0 and "warning: NOT STATIONARY" in r.out
    r = kvhit("fleet", "simulate", "--trace", trace_file, "--replicas", "2", "--N", "400", "--warmup", str(N_WARM))
    assert r.code == 0 and "NOT STATIONARY" not in r.out


def test_tiers_warmup_window_is_measured_and_judged(trace_file):
    from kvhit.sim.runner import block_requests
    from kvhit.sim.vllm.block import simulate_block

    tr = _tr(trace_file)
    base = {"trace": trace_file, "hbm_blocks": [300], "host_units": [0]}
    cold = svc.tiers(svc.build(svc.TiersRequest, **base))
    warm = svc.tiers(svc.build(svc.TiersRequest, **base, warmup=N_WARM))
    mask = Window.warmup_conversations(tr, N_WARM).mask(tr)
    _check(cold.stationarity, brute(tr["time"], tr["conv"], np.ones(mask.size, bool)))
    _check(warm.stationarity, brute(tr["time"], tr["conv"], mask))
    assert cold.stationarity["stationary"] is False and warm.stationarity["stationary"] is True
    assert cold.notes and cold.notes[0].startswith("NOT STATIONARY") and warm.notes == []
    # no host tier: h is the GPU block cache's token hit ratio over the measured admitted requests
    rq = block_requests(tr)
    g = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=300, block_size=rq.block_size)
    hit = g.hit_blocks.astype(np.int64) * rq.block_size
    T = np.asarray(rq.prompt_tokens, np.int64)
    for res, m in ((cold, np.ones(mask.size, bool)), (warm, mask)):
        sel = m & ~g.rejected
        assert res.h[0][0] == hit[sel].sum() / T[sel].sum()
    r = kvhit("tiers", "--trace", trace_file, "--hbm-blocks", "300", "--host-units", "0")
    assert r.code == 0 and "warning: NOT STATIONARY" in r.out
    r = kvhit("tiers", "--blocks-trace", trace_file, "--hbm-blocks", "300", "--host-units", "0", "--warmup", "5")
    assert r.code == 2 and r.err.count("\n") == 1 and "--warmup" in r.err


def test_stream_spec_long_is_steady_short_is_not():
    from kvhit.workload.chunks import spec_chunks

    ref = LAM0 * (TURNS - 1) * W  # 90 active
    for events, steady in ((20_000, True), (400, False)):
        res = svc.stream(svc.build(svc.StreamRequest, N=[500], events=events, **SPEC))
        chs = list(spec_chunks(_spec(), 0, events, 250_000))
        time = np.concatenate([c.time for c in chs])
        conv = np.concatenate([c.conv for c in chs])
        want = brute(time, conv, np.arange(time.size) >= events // 10, ref)
        assert want[0] is steady
        _check(res.stationarity, want)
        assert res.stationarity["conversation_sample"] == 1
        assert bool(res.notes) is (not steady)
    r = kvhit("stream", *SPEC_FLAGS, "--N", "500", "--events", "400")
    assert r.code == 0 and "warning: NOT STATIONARY" in r.out


def test_stream_samples_conversations_beyond_the_budget(monkeypatch):
    import importlib

    st = importlib.import_module("kvhit.service.stream")  # the module (the package attribute is the function)
    monkeypatch.setattr(st, "SAMPLE_EVENTS", 5_000)  # 20,000 events → every 4th conversation
    res = svc.stream(svc.build(svc.StreamRequest, N=[500], events=20_000, **SPEC))
    assert res.stationarity["conversation_sample"] == 4
    from kvhit.workload.chunks import spec_chunks

    chs = list(spec_chunks(_spec(), 0, 20_000, 250_000))
    time = np.concatenate([c.time for c in chs])
    conv = np.concatenate([c.conv for c in chs])
    keep = conv % 4 == 0
    want = brute(time[keep], conv[keep], (np.arange(time.size) >= 2_000)[keep], LAM0 * (TURNS - 1) * W / 4)
    _check(res.stationarity, want)
    assert want[0] is True


def test_plan_verify_spec_is_sized_and_steady_trace_from_cold_is_not(trace_file, trace_warm_file):
    from kvhit.workload.stationarity import spec_sizing

    kw = {"kv_gb": 1.0, "model": "qwen3-8b", "engine": "vllm", "verify": True}
    res = svc.plan(svc.build(svc.PlanRequest, **kw, block_size=16, **SPEC))
    assert spec_sizing(_spec(), None, None) == (20_000, 4_000)  # 5 lifetimes alive = 1,200 < the 20,000 floor
    # so the planner keeps its 20,000 + 5,000 conversations (seed 0) and measures after the 5,000th
    tr = generate(_spec(), 0, n_conversations=25_000)
    want = brute(tr["time"], tr["conv"], Window.warmup_conversations(tr, 5_000).mask(tr), 90.0)
    assert want[0] is True
    _check(res.verify["stationarity"], want)
    assert res.verify["stationarity"]["reference_active"] == 90.0
    cold = svc.plan(svc.build(svc.PlanRequest, **{**kw, "kv_gb": 40.0}, trace=trace_file))
    tr = _tr(trace_file)
    want = brute(tr["time"], tr["conv"], np.ones(len(tr["time"]), bool))
    assert want[0] is False
    _check(cold.verify["stationarity"], want)
    assert any(n.startswith("NOT STATIONARY") for n in cold.notes)
    warm = svc.plan(svc.build(svc.PlanRequest, **{**kw, "kv_gb": 40.0}, trace=trace_warm_file))
    tr = _tr(trace_warm_file)
    want = brute(tr["time"], tr["conv"], Window.warmup_conversations(tr, N_WARM).mask(tr))
    assert want[0] is True
    _check(warm.verify["stationarity"], want)
    r = kvhit("plan", "--trace", trace_file, "--kv-gb", "40", "--verify")
    assert r.code == 0 and "warning: NOT STATIONARY" in r.out


def test_sweep_rows_and_report_carry_the_flag(tmp_path, trace_file, trace_warm_file):
    from kvhit.sweep.report import report

    grid = tmp_path / "g.toml"
    grid.write_text(
        f'[sweep]\ncompute = "simulate"\n[workloads.cold]\ntrace = "{trace_file}"\n'
        f'[workloads.warm]\ntrace = "{trace_warm_file}"\n[axes]\nengine = ["vllm"]\nN = [400]\n',
        encoding="utf-8",
    )
    out = tmp_path / "out"
    r = kvhit("sweep", grid, "--out", out, "--jobs", "1")
    assert r.code == 0, r.err
    rep = report(out)
    want = {}
    for name, f, nw in (("cold", trace_file, 0), ("warm", trace_warm_file, N_WARM)):
        tr = _tr(f)
        mask = Window.warmup_conversations(tr, nw).mask(tr) if nw else np.ones(len(tr["time"]), bool)
        want[name] = brute(tr["time"], tr["conv"], mask)[0]
    assert want == {"cold": False, "warm": True}
    assert {p["workload"]: p["stationary"] for p in rep["points"]} == want
    assert rep["counts"]["not_stationary"] == 1
    r = kvhit("sweep", "report", out)
    assert r.code == 0 and "warning: NOT STATIONARY — 1 of 2 points" in r.out
