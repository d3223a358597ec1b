"""Fleet estimates on block-id traces (kvhit.fleet.blocks): a two-replica trace computed by hand, the KV stay model's
closed forms, and ``fleet simulate --blocks-trace`` printing the library's numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvhit.cli import app
from kvhit.fleet.blocks import (
    estimate_fleet_blocks,
    estimate_fleet_blocks_curve,
    fleet_band_blocks,
    kv_routes_blocks,
    route_oblivious,
    stay_probabilities_blocks,
)
from kvhit.fleet.simulate import simulate_fleet
from kvhit.workload.production import read_production, read_weka
from kvhit.workload.production_trace import ProductionTrace

runner = CliRunner()
DATA = Path(__file__).parent / "data" / "production"
B = 4
#: three WEKA conversations (3 sessions, 18 requests): redrawn start times change their interleaving
WEKA3 = ("weka_0014_cut.json", "weka_0022.json", "weka_0026.json")


def _pt(rows):
    """rows: (time, session, block ids); T = 4·len(ids) (every prompt a whole number of blocks)."""
    n = len(rows)
    ids = [list(r[2]) for r in rows]
    off = np.concatenate([[0], np.cumsum([len(x) for x in ids])]).astype(np.int64)
    return ProductionTrace(
        time=np.array([r[0] for r in rows], float),
        prompt_tokens=np.array([B * len(x) for x in ids], np.int64),
        output_tokens=np.ones(n, np.int64),
        hash_offsets=off,
        hashes=np.array([h for x in ids for h in x], np.int64),
        block_size=B,
        session=np.array([r[1] for r in rows], np.int64),
        agent=np.zeros(n, np.int32),
        model=None,
        models=(),
        file_index=np.zeros(n, np.int32),
        record=np.arange(n, dtype=np.int64),
        sub_record=np.full(n, -1, np.int32),
        files=("hand",),
        format="weka",
        session_source="file",
        rechained=False,
        n_partial_dropped=0,
    )


#: A0, B0, B1, C0, A1 at t = 0…4. Round-robin over 2 replicas: replica 0 serves A0, B1, A1; replica 1 B0, C0.
HAND = [(0.0, 0, [1, 2]), (1.0, 1, [10, 11]), (2.0, 1, [10, 11, 12]), (3.0, 2, [20, 21]), (4.0, 0, [1, 2, 3])]


def test_round_robin_two_replicas_by_hand():
    """Replica 0: A1 can reuse A0's 2 blocks (vLLM caps a 12-token prompt at (12 − 1)//4 = 2); in between B1 touched
    3 blocks *there* (its prefix [10, 11] was cached on replica 1, so B1 reuses nothing on replica 0). (A1): block i
    of A1 survives iff N ≥ 1 + e + i + D = 1 + 0 + i + 3. Replica 1 reuses nothing. Prompt tokens: 32 + 16 = 48.
    So h = 0 (N = 3), 4/48 (N = 4), 8/48 (N ≥ 5) — the replay form by (A1) and the exact fleet simulation."""
    pt = _pt(HAND)
    rep = route_oblivious(pt.session, "round-robin", 2)
    assert rep.tolist() == [0, 1, 0, 1, 0]
    want = {3: 0.0, 4: 4 / 48, 5: 8 / 48, 9: 8 / 48}
    h, h_k, inf, _ = estimate_fleet_blocks_curve(pt, rep, 2, list(want), form="replay")
    assert h == pytest.approx(list(want.values()), abs=1e-12)
    assert h_k[1] == pytest.approx([0, 0, 0, 0], abs=1e-12) and not inf.any()
    for N, w in want.items():
        res = simulate_fleet(pt.prompt_tokens, pt.hash_offsets, pt.hashes, pt.session, Ns=[N, N], block_size=B,
                             router="round-robin", times=pt.time)  # fmt: skip
        assert res.token_hit_ratio() == pytest.approx(w, abs=1e-12)
        e = estimate_fleet_blocks(pt, rep, [N, N], form="replay")
        assert e.h == pytest.approx(w, abs=1e-12) and e.den_k.tolist() == [32, 16]
    # the model form (compound Poisson background): at a capacity no window can fill, every reusable block hits
    e = estimate_fleet_blocks(pt, rep, [1000, 1000])
    assert e.h == pytest.approx(8 / 48, abs=1e-9)
    # unequal capacities: replica 0 at 4 blocks, replica 1 at 2 (its largest prompt): 4/48 again
    assert estimate_fleet_blocks(pt, rep, [4, 2], form="replay").h == pytest.approx(4 / 48, abs=1e-12)
    # session affinity (every session on one replica) at R = 1: the single-replica estimate, A1 behind B0, B1, C0
    one = estimate_fleet_blocks(pt, np.zeros(5, np.int64), [9], form="replay")
    # R = 1: B1 hits [10, 11] (2 blocks, nothing in between); A1's window holds B0/B1 (3 distinct) + C0 (2): block i
    # survives iff 9 ≥ 1 + i + 5 → both; hits 4·(2 + 2) = 16 of 48 tokens
    assert one.h == pytest.approx(16 / 48, abs=1e-12)


def test_stay_model_closed_forms_without_load():
    """No holds (no load): Dynamo keeps a request with an overlap x > 0 on its home (cost −w·x < 0 elsewhere), so
    q = 1 and the routing keeps every session on one replica; sticky with ttl = 2 keeps B1 (gap 1 < 2) and sends A1
    (gap 4) to the least loaded of 2 equally idle replicas, home with probability 1/2."""
    pt = _pt(HAND)
    q, prev = stay_probabilities_blocks(pt, "dynamo", 2)
    assert prev.tolist() == [-1, -1, 1, -1, 0]
    assert np.isnan(q[[0, 1, 3]]).all() and q[[2, 4]].tolist() == [1.0, 1.0]
    rep = kv_routes_blocks(prev, q, 2, seed=5)
    assert rep[2] == rep[1] and rep[4] == rep[0]
    q, _ = stay_probabilities_blocks(pt, "sticky", 2, params={"ttl": 2.0})
    assert q[2] == 1.0 and q[4] == pytest.approx(0.5, abs=0)
    with pytest.raises(ValueError, match="prev"):
        kv_routes_blocks(np.array([1, -1]), np.array([1.0, np.nan]), 2)


def test_band_of_a_single_session_is_the_replay_widened():
    """One session: redrawn start times only shift it, so every replay gives the same ratio (sd 0): the band is that
    ratio ± WIDEN and its mean the simulated ratio."""
    from kvhit.estimate.band import WIDEN

    rows = [(float(t), 0, list(range(1, 3 + t))) for t in range(6)]
    pt = _pt(rows)
    res = simulate_fleet(pt.prompt_tokens, pt.hash_offsets, pt.hashes, pt.session, Ns=[9, 9], block_size=B,
                         router="round-robin", times=pt.time)  # fmt: skip
    b = fleet_band_blocks(pt, "round-robin", [9, 9], res.token_hit_ratio(), replays=4, seed=3)
    assert b["h_mc"] == pytest.approx(res.token_hit_ratio(), abs=1e-12)
    assert b["h_lo"] == pytest.approx(b["h_mc"] - WIDEN) and b["h_hi"] == pytest.approx(b["h_mc"] + WIDEN)
    assert b["validated"] is False and b == fleet_band_blocks(pt, "round-robin", [9, 9], res.token_hit_ratio(),
                                                              replays=4, seed=3)  # fmt: skip


def _hand_timing(p2, tm):
    """simulate_fleet's timing arguments for the re-timed trace ``p2`` by hand from ``tm`` (keys P, D, ov, ph, hts,
    kv): prefill = ov + T/P, hold = prefill + (O − 1)⁺/D; with ``kv`` the CSR gets (T + O − 1)//b − T//b fresh
    negative ids after each prompt's (the generated tokens' blocks) and the run is colocated."""
    T = np.asarray(p2.prompt_tokens, float)
    O = np.asarray(p2.output_tokens, float)
    pre = tm.get("ov", 0.0) + T / tm["P"]
    hold = pre + (np.maximum(O - 1.0, 0.0) / tm["D"] if "D" in tm else 0.0)
    kw = dict(hold=hold, prefill_hold=pre if tm.get("ph") else None, hit_token_seconds=tm.get("hts", 0.0))
    off, hs = p2.hash_offsets, p2.hashes
    if tm.get("kv"):
        ids, nxt = [], -1
        for r in range(p2.n_requests):
            own = [int(x) for x in p2.hashes[p2.hash_offsets[r] : p2.hash_offsets[r + 1]]]
            k = (int(T[r]) + max(int(O[r]) - 1, 0)) // p2.block_size - len(own)
            ids.append(own + list(range(nxt, nxt - k, -1)))
            nxt -= k
        off = np.concatenate([[0], np.cumsum([len(x) for x in ids])]).astype(np.int64)
        hs = np.array([h for x in ids for h in x], np.int64)
        kw.update(colocated=True, response_tokens=p2.output_tokens)
    return off, hs, kw


def _direct_replays(pt, router, Ns, *, seed, K, speed=None, params=None, tm=None, keep=True, start_seed=None):
    """The replays by hand: K start-time draws (one generator; uniform on the starts' range widened by one mean
    spacing each side unless a KS test rejects uniformity, then draw_starts' histogram; sorted and handed out in
    the sessions' observed order), each a plain simulate_fleet call on the re-timed trace (holds T/speed, or the
    timing ``tm`` by hand, :func:`_hand_timing`)."""
    from scipy.stats import kstest

    from kvhit.estimate.band import draw_starts, restart_sessions

    C = int(pt.session.max()) + 1
    first = np.full(C, np.inf)
    np.minimum.at(first, pt.session, pt.time)
    lo, hi = first.min(), first.max()
    uniform = C < 3 or kstest(first, "uniform", args=(lo, hi - lo)).pvalue >= 0.05
    rng = np.random.default_rng(seed if start_seed is None else start_seed)
    out = []
    for _ in range(K):
        d = (hi - lo) / (C - 1) if C > 1 else 0.0
        x = rng.uniform(lo - d, hi + d, C) if uniform else draw_starts(first, rng)
        starts = np.empty(C)
        for rank, k in enumerate(sorted(range(C), key=lambda k: (first[k], k))):  # the observed order, kept
            starts[k] = np.sort(x)[rank]
        if not keep:  # the exchangeable law: session k gets the k-th draw
            starts = x
        p2 = restart_sessions(pt, starts)
        if tm is None:
            off, hs = p2.hash_offsets, p2.hashes
            kw = dict(hold=None if speed is None else p2.prompt_tokens / speed)
        else:
            off, hs, kw = _hand_timing(p2, tm)
        res = simulate_fleet(p2.prompt_tokens, off, hs, p2.session, Ns=Ns, block_size=p2.block_size, router=router,
                             router_params=params, times=p2.time, seed=seed, **kw)  # fmt: skip
        out.append(res.token_hit_ratio())
    return np.array(out)


@pytest.mark.parametrize(
    ("router", "speed", "params"),
    [("round-robin", None, None), ("random", None, None), ("session", None, None), ("dynamo", 20000.0, None),
     ("sticky", 5000.0, {"ttl": 30.0}), ("llm-d", None, None)],
)  # fmt: skip
def test_replay_mean_is_the_mean_of_direct_simulate_fleet_calls(router, speed, params):
    """fleet_replays_blocks (oblivious routers: block_curve per replica, all capacities in one pass; KV-aware: the
    compiled fleet pass with holds) equals a direct loop over simulate_fleet at the same seeds, replay by replay,
    and fleet_band_blocks' h_mc / h_se are their mean and sd/√K."""
    from kvhit.fleet.blocks import fleet_replays_blocks

    pt = read_weka([str(DATA / f) for f in WEKA3])
    R, K, seed = 3, 5, 4
    Nmin = int(pt.prompt_blocks.max())
    caps = [[Nmin] * R, [2 * Nmin] * R, [Nmin, 3 * Nmin, 2 * Nmin]]
    H = fleet_replays_blocks(pt, router, caps, router_params=params, speed=speed, replays=K, seed=seed)
    for i, Ns in enumerate(caps):
        want = _direct_replays(pt, router, Ns, seed=seed, K=K, speed=speed, params=params)
        assert H[:, i] == pytest.approx(want, abs=1e-12)
    if router != "session":  # session affinity here puts each of the 3 sessions on its own replica: timing-free
        assert np.ptp(H, axis=0).max() > 1e-3  # the draws move the ratio: the test can see a wrong seed or order
    b = fleet_band_blocks(pt, router, caps[1], router_params=params, speed=speed, replays=K, seed=seed)
    assert b["h_mc"] == pytest.approx(H[:, 1].mean(), abs=1e-12)
    assert b["h_se"] == pytest.approx(H[:, 1].std(ddof=1) / np.sqrt(K), abs=1e-12)
    assert b["h_lo"] < b["h_mc"] < b["h_hi"] and b["method"] == "replay-mean"


@pytest.mark.parametrize(("router", "speed"), [("round-robin", None), ("dynamo", 20000.0)])
def test_exchangeable_replays_redraw_the_order(router, speed):
    """keep=False: the same draws handed out i.i.d. (session k the k-th), replay by replay a direct simulate_fleet
    loop; the ratios differ from the order-keeping replays at the same seed."""
    from kvhit.fleet.blocks import fleet_replays_blocks

    pt = read_weka([str(DATA / f) for f in WEKA3])
    R, K, seed = 3, 4, 6
    Nmin = int(pt.prompt_blocks.max())
    caps = [[Nmin] * R, [2 * Nmin, Nmin, Nmin]]
    H = fleet_replays_blocks(pt, router, caps, speed=speed, replays=K, seed=seed, keep=False)
    for i, Ns in enumerate(caps):
        want = _direct_replays(pt, router, Ns, seed=seed, K=K, speed=speed, keep=False)
        assert H[:, i] == pytest.approx(want, abs=1e-12)
    assert not np.allclose(H, fleet_replays_blocks(pt, router, caps, speed=speed, replays=K, seed=seed))


#: timing cases: (router, router params, hand timing); hit_token_seconds on an oblivious router runs the compiled
#: fleet pass with the routes fixed in advance
TIMED = [
    ("round-robin", None, {"P": 2000.0, "D": 20.0, "ov": 0.01, "hts": 0.0004}),
    ("random", None, {"P": 2000.0, "D": 0.5, "hts": 0.0004, "kv": True}),
    ("random", None, {"P": 2000.0, "D": 5.0, "kv": True}),
    ("dynamo", None, {"P": 2000.0, "D": 20.0, "ov": 0.01, "ph": True, "hts": 0.0004}),
    ("dynamo", None, {"P": 2000.0, "D": 20.0, "ph": True, "hts": 0.0005, "kv": True}),
    ("least-loaded", {"metric": "prefill_tokens"}, {"P": 2000.0, "D": 0.05, "ph": True}),
    ("sticky", {"ttl": 30.0}, {"P": 5000.0, "D": 0.05, "ov": 0.2}),
]


def _fleet_timing(tm):
    from kvhit.fleet.timing import FleetTiming

    return FleetTiming(tm["P"], tm.get("D"), bool(tm.get("ph")), tm.get("hts", 0.0), tm.get("ov", 0.0),
                       bool(tm.get("kv")))  # fmt: skip


@pytest.mark.parametrize(("router", "params", "tm"), TIMED)
def test_replay_mean_under_timing_is_the_mean_of_direct_simulate_fleet_calls(router, params, tm):
    """Under a FleetTiming (decode time, prefill overhead, prefill-done events, hit-token savings, decode KV) each
    replay is simulate_fleet on the re-timed trace with holds computed by hand from that trace's own prompt and output
    lengths (restart_sessions carries them with their requests): equal replay by replay; and the timing changes the
    replays (the test can see it dropped)."""
    from kvhit.fleet.blocks import fleet_replays_blocks

    pt = read_weka([str(DATA / f) for f in WEKA3])
    assert pt.output_tokens.min() >= 1 and np.ptp(pt.output_tokens) > 0
    R, K, seed = 3, 4, 5
    Nmin = int(pt.prompt_blocks.max()) + (int(pt.output_tokens.max()) // B + 2 if tm.get("kv") else 0)
    caps = [[Nmin] * R, [Nmin, 3 * Nmin, 2 * Nmin]]
    tmg = _fleet_timing(tm)
    H = fleet_replays_blocks(pt, router, caps, router_params=params, replays=K, seed=seed, timing=tmg)
    for i, Ns in enumerate(caps):
        want = _direct_replays(pt, router, Ns, seed=seed, K=K, params=params, tm=tm)
        assert H[:, i] == pytest.approx(want, abs=1e-12)
    plain = fleet_replays_blocks(pt, router, caps, router_params=params, replays=K, seed=seed, speed=tm["P"])
    assert np.abs(H - plain).max() > 1e-6
    b = fleet_band_blocks(pt, router, caps[1], router_params=params, replays=K, seed=seed, timing=tmg)
    assert b["h_mc"] == pytest.approx(H[:, 1].mean(), abs=1e-12) and b["method"] == "replay-mean"
    with pytest.raises(ValueError, match="speed"):
        fleet_replays_blocks(pt, router, caps, replays=1, speed=1.0, timing=tmg)


def test_start_law_is_uniform_unless_the_starts_show_structure():
    from kvhit.fleet.blocks import draw_fleet_starts, start_law

    even = np.linspace(0.0, 3600.0, 35)
    assert start_law(even) == "uniform" and start_law(np.array([5.0, 7.0])) == "uniform"
    lumpy = np.concatenate([np.linspace(0.0, 60.0, 30), np.linspace(1000.0, 3600.0, 5)])
    assert start_law(lumpy) == "histogram"
    x = draw_fleet_starts(even, np.random.default_rng(1), "uniform")
    d = 3600.0 / 34
    assert x.shape == (35,) and x.min() >= -d and x.max() <= 3600.0 + d
    assert (np.diff(x) >= 0).all()  # the sessions' order is kept
    rev = draw_fleet_starts(lumpy[::-1].copy(), np.random.default_rng(1), "histogram")
    assert (np.diff(rev) <= 0).all()


def test_replay_rule_counts_block_accesses(monkeypatch):
    import kvhit.fleet.blocks as fb

    pt = read_production(DATA / "mooncake_small.jsonl")
    n = int(pt.full_blocks.sum())
    monkeypatch.setattr(fb, "REPLAY_MAX_ACCESSES", 16 * n)
    assert fb.replays_affordable(pt, 16) and not fb.replays_affordable(pt, 17)


def test_fleet_simulate_blocks_trace_prints_the_estimate(monkeypatch, tmp_path):
    import shutil

    import kvhit.fleet.blocks as fb
    from kvhit.service.fleet import BAND_REPLAYS

    for f in WEKA3:
        shutil.copy(DATA / f, tmp_path / f)
    wk = read_production(tmp_path)
    assert int(wk.session.max()) + 1 == 3
    # a small trace: the replays are affordable, so every router's expected value is the replays' mean
    wbase = ["fleet", "simulate", "--blocks-trace", str(tmp_path), "--replicas", "2", "--N", "1500"]
    r = runner.invoke(app, [*wbase, "--router", "round-robin,least-loaded", "--json"])
    assert r.exit_code == 0, r.output
    rows = {x["router"]: x for x in json.loads(r.stdout)["rows"]}
    for name, row in rows.items():
        H = _direct_replays(wk, name, [1500, 1500], seed=0, K=BAND_REPLAYS)
        assert row["estimate"] == pytest.approx(H.mean(), abs=1e-12) and row["estimate_method"] == "replay-mean"
        assert row["estimate_se"] == pytest.approx(H.std(ddof=1) / np.sqrt(BAND_REPLAYS), abs=1e-12)
        band = row["estimate_band"]
        assert band["h_lo"] <= band["h_mc"] <= band["h_hi"] and band["validated"] is False
    assert H.std() > 0
    r = runner.invoke(app, [*wbase, "--router", "dynamo", "--prefill-tokens-per-s", "2000", "--seed", "2", "--json"])
    row = json.loads(r.stdout)["rows"][0]
    H = _direct_replays(wk, "dynamo", [1500, 1500], seed=2, K=BAND_REPLAYS, speed=2000.0)
    assert row["estimate"] == pytest.approx(H.mean(), abs=1e-12) and row["estimate_method"] == "replay-mean"
    r = runner.invoke(app, [*wbase, "--router", "round-robin"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "band 90%" in r.output and f"{rows['round-robin']['estimate']:.4f}" in r.output and "replay ±" in r.output
    # replays too expensive: the per-replica estimator answers, without a band
    path = DATA / "mooncake_small.jsonl"
    pt = read_production(path)
    base = ["fleet", "simulate", "--blocks-trace", str(path), "--replicas", "2", "--N", "300"]
    monkeypatch.setattr(fb, "REPLAY_MAX_ACCESSES", 0)
    r = runner.invoke(app, [*base, "--router", "round-robin,least-loaded", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    rows = {x["router"]: x for x in out["rows"]}
    rep = route_oblivious(pt.session, "round-robin", 2)
    want = estimate_fleet_blocks(pt, rep, [300, 300]).h
    assert 0 < want < 1 and rows["round-robin"]["estimate"] == pytest.approx(want, abs=0, rel=0)
    assert rows["round-robin"]["estimate_method"] == "agentic-per-replica"
    assert rows["round-robin"]["estimate_band"] is None and rows["round-robin"]["estimate_se"] is None
    assert rows["round-robin"]["estimate_validated"] is False
    assert rows["least-loaded"]["estimate"] is None and any("least-loaded" in n for n in out["notes"])
    # KV-aware: the stay model's routing (holds T/speed, the measured rate, seed) → the same per-replica estimator
    r = runner.invoke(app, [*base, "--router", "dynamo", "--prefill-tokens-per-s", "20000", "--seed", "2", "--json"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["rows"][0]
    hold = pt.prompt_tokens / 20000.0
    rate = pt.n_requests / float(pt.time.max() - pt.time.min())
    q, prev = stay_probabilities_blocks(pt, "dynamo", 2, hold=hold, Ns=[300, 300], rate=rate, seed=2)
    want = estimate_fleet_blocks(pt, kv_routes_blocks(prev, q, 2, seed=3), [300, 300]).h
    assert row["estimate"] == pytest.approx(want, abs=0, rel=0) and row["estimate_band"] is None
    assert row["estimate_method"] == "stay-model+agentic-per-replica"


def test_fleet_simulate_replays_and_replay_se(monkeypatch, tmp_path):
    """``--replays K`` sets how many exact replays stand behind a block-id row (their mean, by a direct loop over
    simulate_fleet); ``--replay-se S`` keeps drawing until s/√K ≤ S: the row's K is the first K ≥ --replays whose
    standard error (of the direct replays) is ≤ S, and its estimate the mean of those K; where the replay budget
    stops it first, a note says the target was not reached; bad values are refused in one line, exit 2."""
    import shutil

    import kvhit.fleet.blocks as fb

    for f in WEKA3:
        shutil.copy(DATA / f, tmp_path / f)
    wk = read_production(tmp_path)
    base = ["fleet", "simulate", "--blocks-trace", str(tmp_path), "--replicas", "2", "--N", "1500", "--router",
            "round-robin", "--seed", "1", "--json"]  # fmt: skip
    r = runner.invoke(app, [*base, "--replays", "4"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["rows"][0]
    H = _direct_replays(wk, "round-robin", [1500, 1500], seed=1, K=40)
    assert row["estimate_band"]["replays"] == 4 and row["estimate"] == pytest.approx(H[:4].mean(), abs=1e-12)
    se = np.array([H[:k].std(ddof=1) / np.sqrt(k) for k in range(2, 41)])  # se[k - 2]: after k replays
    later = se[5 - 2 : 30 - 1]
    S = float(later[later < se[4 - 2]].max())  # a target not met at 4 replays, first met at some K in (4, 30]
    K = 4 + int(np.flatnonzero(se[4 - 2 :] <= S)[0])
    assert 4 < K <= 30
    r = runner.invoke(app, [*base, "--replays", "4", "--replay-se", repr(S)])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["rows"][0]
    assert row["estimate_band"]["replays"] == K and row["estimate"] == pytest.approx(H[:K].mean(), abs=1e-12)
    assert row["estimate_se"] == pytest.approx(se[K - 2], abs=1e-12) and row["estimate_se"] <= S
    # the budget allows 6 replays: the target is not reached, and the row says so
    monkeypatch.setattr(fb, "REPLAY_MAX_ACCESSES", 6 * int(wk.full_blocks.sum()))
    r = runner.invoke(app, [*base, "--replays", "4", "--replay-se", "1e-6"])
    out = json.loads(r.stdout)
    band = out["rows"][0]["estimate_band"]
    assert band["replays"] == 6 and out["rows"][0]["estimate"] == pytest.approx(H[:6].mean(), abs=1e-12)
    assert any("--replay-se 1e-06 not reached" in n for n in band["notes"])
    r = runner.invoke(app, [*base[:-1], "--replays", "4", "--replay-se", "1e-6"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "round-robin, R = 2: --replay-se 1e-06 not reached" in r.output, r.output
    for args, flag in ((["--replays", "1"], "--replays"), (["--replay-se", "0"], "--replay-se"),
                       (["--replay-se", "0.5"], "--replay-se")):  # fmt: skip
        r = runner.invoke(app, [*base, *args])
        assert r.exit_code == 2 and flag in r.output and "Traceback" not in r.output, r.output


def test_fleet_simulate_expected_se(tmp_path):
    """``--expected-se S``: beside the row's replay mean (E[h | order]) the band carries h_exp, the mean of replays
    that redraw the sessions' order (start generator [seed, 1], at least 32, until s/√K ≤ S) — by a direct loop over
    simulate_fleet; the row's own estimate is unchanged; without --blocks-trace it is refused in one line."""
    import shutil

    for f in WEKA3:
        shutil.copy(DATA / f, tmp_path / f)
    wk = read_production(tmp_path)
    base = ["fleet", "simulate", "--blocks-trace", str(tmp_path), "--replicas", "2", "--N", "1500", "--router",
            "round-robin", "--seed", "1", "--replays", "4"]  # fmt: skip
    X = _direct_replays(wk, "round-robin", [1500, 1500], seed=1, K=64, keep=False, start_seed=[1, 1])
    se = np.array([X[:k].std(ddof=1) / np.sqrt(k) for k in range(2, 65)])
    S = float(se[40 - 2]) * 1.0000001  # met at 40 replays at the latest
    K = 32 + int(np.flatnonzero(se[32 - 2 :] <= S)[0])
    r = runner.invoke(app, [*base, "--expected-se", repr(S), "--json"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["rows"][0]
    b = row["estimate_band"]
    assert b["exp_replays"] == K and b["h_exp"] == pytest.approx(X[:K].mean(), abs=1e-12)
    assert b["h_exp_se"] == pytest.approx(se[K - 2], abs=1e-12)
    H = _direct_replays(wk, "round-robin", [1500, 1500], seed=1, K=4)
    assert row["estimate"] == pytest.approx(H.mean(), abs=1e-12)  # the row's own replays: untouched
    t = runner.invoke(app, [*base, "--expected-se", repr(S)], env={"COLUMNS": "200"})
    assert t.exit_code == 0 and f"{X[:K].mean():.4f} ± {se[K - 2]:.4f}" in t.output, t.output
    bad = runner.invoke(app, ["fleet", "simulate", "--trace", str(tmp_path / "t.parquet"), "--replicas", "2", "--N",
                              "100", "--expected-se", "0.01"])  # fmt: skip
    assert bad.exit_code == 2 and "--expected-se" in bad.output and "Traceback" not in bad.output, bad.output


def test_fleet_simulate_blocks_trace_estimates_under_timing(monkeypatch, tmp_path):
    """``fleet simulate --blocks-trace`` with the timing flags: the row's estimate is the mean of the exact replays
    run under the same timing (a direct loop with holds by hand), with its band; where the replays are not affordable
    the per-replica estimators (holds T/speed at most) give none, with a one-line reason."""
    import shutil

    import kvhit.fleet.blocks as fb
    from kvhit.service.fleet import BAND_REPLAYS

    for f in WEKA3:
        shutil.copy(DATA / f, tmp_path / f)
    wk = read_production(tmp_path)
    tm = {"P": 2000.0, "D": 20.0, "ov": 0.01, "ph": True, "hts": 0.0004, "kv": True}
    flags = ["--prefill-tokens-per-s", "2000", "--decode-tokens-per-s", "20", "--prefill-overhead-s", "0.01",
             "--prefill-hold", "--hit-token-seconds", "0.0004", "--decode-kv"]  # fmt: skip
    base = ["fleet", "simulate", "--blocks-trace", str(tmp_path), "--replicas", "2", "--N", "1500"]
    r = runner.invoke(app, [*base, "--router", "dynamo", *flags, "--seed", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    row = out["rows"][0]
    H = _direct_replays(wk, "dynamo", [1500, 1500], seed=1, K=BAND_REPLAYS, tm=tm)
    assert row["estimate"] == pytest.approx(H.mean(), abs=1e-12) and row["estimate_method"] == "replay-mean"
    assert row["estimate_se"] == pytest.approx(H.std(ddof=1) / np.sqrt(BAND_REPLAYS), abs=1e-12)
    assert row["estimate_band"]["h_lo"] <= row["estimate"] <= row["estimate_band"]["h_hi"]
    assert out["timing"]["decode_kv"] is True and not any("no estimate" in n for n in out["notes"])
    untimed = _direct_replays(wk, "dynamo", [1500, 1500], seed=1, K=BAND_REPLAYS, speed=2000.0)
    assert abs(untimed.mean() - H.mean()) > 1e-6  # the timing reaches the replays
    monkeypatch.setattr(fb, "REPLAY_MAX_ACCESSES", 0)
    r = runner.invoke(app, [*base, "--router", "round-robin", *flags[:4], "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["rows"][0]["estimate"] is None
    why = [n for n in out["notes"] if n.startswith("no estimate")]
    assert len(why) == 1 and "--decode-tokens-per-s" in why[0] and "too many block accesses" in why[0]


def test_se_target_extends_the_same_replays_until_the_standard_error_is_met():
    """fleet_replays_blocks(se_target=…): the first ``replays`` rows are the fixed count's, the count stops at the
    first K ≥ replays where s/√K ≤ se_target at every capacity (checked at every earlier K by hand), or at
    max_replays; a non-positive target is refused."""
    from kvhit.fleet.blocks import fleet_replays_blocks

    pt = read_weka([str(DATA / f) for f in WEKA3])
    Nmin = int(pt.prompt_blocks.max())
    caps = [[Nmin] * 2, [2 * Nmin] * 2]
    fixed = fleet_replays_blocks(pt, "round-robin", caps, replays=4, seed=5)
    sd = fixed.std(axis=0, ddof=1).max()
    target = 0.6 * sd / np.sqrt(4)  # not met at 4 replays unless the spread collapses
    H = fleet_replays_blocks(pt, "round-robin", caps, replays=4, seed=5, se_target=target, max_replays=64)
    assert np.array_equal(H[:4], fixed)
    K = H.shape[0]
    se = [H[:k].std(axis=0, ddof=1).max() / np.sqrt(k) for k in range(4, K + 1)]
    assert all(s > target for s in se[:-1]) and (se[-1] <= target or K == 64)
    assert K > 4
    longer = fleet_replays_blocks(pt, "round-robin", caps, replays=K + 3, seed=5)
    assert np.array_equal(H, longer[:K])  # the same generator stream: replay j does not depend on the stopping rule
    capped = fleet_replays_blocks(pt, "round-robin", caps, replays=4, seed=5, se_target=1e-9, max_replays=6)
    assert capped.shape[0] == 6
    b = fleet_band_blocks(pt, "round-robin", caps[0], replays=4, seed=5, se_target=1e-9, max_replays=6)
    assert b["replays"] == 6 and b["h_mc"] == pytest.approx(capped[:, 0].mean(), abs=1e-12)
    with pytest.raises(ValueError, match="se_target"):
        fleet_replays_blocks(pt, "round-robin", caps, replays=4, se_target=0.0)
