"""KV-aware router estimator (kvhit.fleet.estimate.stay_probabilities / kv_routes / estimate_fleet_kv,
docs/estimators.md §6): exact limits of the stay model, and agreement with the exact fleet simulator (with holds)
on a small synthetic workload (the ShareGPT numbers are benchmarks/fleet_accuracy.py --only kv)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from kvhit.cli import app
from kvhit.fleet import estimate as fe
from kvhit.fleet.estimate import _prev_rows, estimate_fleet, estimate_fleet_kv, kv_routes, routes, stay_probabilities
from kvhit.fleet.simulate import simulate_fleet
from kvhit.sim.runner import block_requests
from kvhit.workload import Trace
from kvhit.workload.trace import Window

B = 16
SCM = ["--lam0", "0.5", "--p", "0.75", "--x-mean", "4", "--y-mean", "3", "--w-mean", "60"]
N = 600
SPEED = 1500.0  # prefill tokens/s: holds T/speed keep ~0.5 requests in flight per replica at R = 2


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    out = tmp_path_factory.mktemp("fleet_kv") / "t.parquet"
    r = CliRunner().invoke(app, ["trace", "generate", *SCM, "-n", "1500", "--seed", "7", "-o", str(out)])
    assert r.exit_code == 0, r.output
    tr = Trace.read(out)
    mask = Window.warmup_conversations(tr, 300).mask(tr)
    rq = block_requests(tr, block_size=B)
    t = np.asarray(tr["time"], float)
    rate = float(mask.sum() / (t[mask].max() - t[mask].min()))
    return tr, mask, rq, rate


def _H_W(tr):
    prev = _prev_rows(tr)
    rev = prev >= 0
    T = np.asarray(tr["R"], np.int64) * B - 1  # the SCM trace has no cum_tokens: T = R·b − 1 (eq. (28))
    t = np.asarray(tr["time"], float)
    return prev, rev, T[np.maximum(prev, 0)] // B, t - t[np.maximum(prev, 0)]


def test_without_load_kv_routers_stay_whenever_there_is_overlap(setting):
    tr, _, _, _ = setting
    prev, rev, H, _ = _H_W(tr)
    for router in ("dynamo", "llm-d"):
        q = stay_probabilities(tr, router, 3, block_size=B, Ns=[N] * 3)
        assert np.isnan(q[~rev]).all()
        np.testing.assert_array_equal(q[rev & (H > 0)], 1.0)
    # Dynamo with nothing cached anywhere and no load: a three-way tie
    q = stay_probabilities(tr, "dynamo", 3, block_size=B, Ns=[N] * 3)
    np.testing.assert_allclose(q[rev & (H == 0)], 1 / 3)


def test_sticky_stays_within_its_ttl_else_a_tie_over_all_replicas(setting):
    tr, _, _, _ = setting
    _, rev, _, W = _H_W(tr)
    q = stay_probabilities(tr, "sticky", 4, params={"ttl": 90.0}, block_size=B)
    np.testing.assert_array_equal(q[rev & (W < 90.0)], 1.0)
    np.testing.assert_allclose(q[rev & (W >= 90.0)], 0.25)


def test_dynamo_stay_grows_with_the_overlap_and_falls_with_the_load(setting):
    tr, _, rq, rate = setting
    _, rev, H, _ = _H_W(tr)
    hold = rq.prompt_tokens / SPEED
    q = stay_probabilities(tr, "dynamo", 4, hold=hold, Ns=[N] * 4, rate=rate, block_size=B)
    hs = np.unique(H[rev])
    qh = np.array([q[rev & (H == h)][0] for h in hs])
    assert (np.diff(qh) >= -1e-12).all() and qh[-1] > qh[0] + 0.2  # the same load samples for every overlap
    heavy = stay_probabilities(tr, "dynamo", 4, hold=4 * hold, Ns=[N] * 4, rate=rate, block_size=B)
    assert np.nanmean(heavy[rev]) < np.nanmean(q[rev]) - 0.05
    # overlap weight 0: the cache plays no part, symmetric replicas -> about 1/R
    q0 = stay_probabilities(
        tr, "dynamo", 4, hold=hold, Ns=[N] * 4, rate=rate, block_size=B, params={"overlap_score_weight": 0.0}
    )
    assert abs(np.nanmean(q0[rev]) - 0.25) < 0.03


def test_dynamo_overlap_credit_only_helps_home_and_is_clamped(setting):
    """cost_h = w·max(0, (P_h + T)/b − c·x) + …: a larger credit c never lowers the stay probability (same load
    samples), and with the clamp the home advantage is bounded by the whole prefill, so q stays below 1."""
    tr, _, rq, rate = setting
    _, rev, _, _ = _H_W(tr)
    kw = dict(hold=rq.prompt_tokens / SPEED, Ns=[N] * 4, rate=rate, block_size=B)
    q = {
        c: stay_probabilities(tr, "dynamo", 4, params={"overlap_score_credit": c}, **kw)[rev] for c in (1.0, 4.0, 64.0)
    }
    assert (q[4.0] >= q[1.0] - 1e-12).all() and (q[64.0] >= q[4.0] - 1e-12).all()
    assert q[4.0].mean() > q[1.0].mean() + 0.01
    assert q[64.0].mean() < 0.99


def test_between_the_two_limits(setting):
    """q ≡ 1 is affinity (every conversation on one replica), q ≡ 1/R random routing; the KV estimate lies
    between the two oblivious estimates."""
    tr, mask, rq, rate = setting
    R = 4
    ones = np.ones(tr.n_turns)
    rep = kv_routes(tr, ones, R, seed=2)
    conv = tr.dense_conv()
    assert all(np.unique(rep[conv == c]).size == 1 for c in np.unique(conv)[:200])
    aff = estimate_fleet(tr, rep, [N] * R, window=mask, block_size=B)
    rnd = estimate_fleet(tr, routes(tr, "random", R), [N] * R, window=mask, block_size=B)
    quarter = estimate_fleet(tr, kv_routes(tr, ones / R, R, seed=2), [N] * R, window=mask, block_size=B)
    assert quarter == pytest.approx(rnd, abs=0.01)
    kv = estimate_fleet_kv(tr, "dynamo", [N] * R, hold=rq.prompt_tokens / SPEED, window=mask, rate=rate, block_size=B)
    assert rnd + 0.02 < kv < aff - 0.005


@pytest.mark.parametrize(
    "router,params,R",
    [("dynamo", {}, 2), ("dynamo", {"mode": "approx", "ttl": 60.0}, 3), ("llm-d", {}, 2), ("sticky", {"ttl": 60.0}, 3)],
)
def test_close_to_the_simulator_with_holds(setting, router, params, R):
    tr, mask, rq, rate = setting
    hold = rq.prompt_tokens / SPEED
    res = simulate_fleet(
        rq.prompt_tokens, rq.hash_offsets, rq.hashes, tr.dense_conv(), Ns=[N] * R, block_size=B, router=router,
        router_params=params, times=np.asarray(tr["time"], float), hold=hold,
    )  # fmt: skip
    sim = res.token_hit_ratio(mask)
    prev, rev, _, _ = _H_W(tr)
    rv = rev & mask
    stay_sim = (res.replica[rv] == res.replica[prev[rv]]).mean()
    q = stay_probabilities(tr, router, R, hold=hold, Ns=[N] * R, params=params, rate=rate, block_size=B)
    assert 0.3 < stay_sim < 0.97  # the load moves turns: not the affinity limit
    if router == "sticky" or params.get("mode") == "approx":  # the model sees what the router sees
        assert abs(np.nanmean(q[rv]) - stay_sim) < 0.03
    else:  # precise: an evicted history is taken as present (it misses anyway), so the model stays more
        assert stay_sim < np.nanmean(q[rv]) + 0.02
    h = estimate_fleet_kv(tr, router, [N] * R, hold=hold, params=params, window=mask, rate=rate, block_size=B)
    # measured on this small, heavily evicting workload: −0.018 … 0 (ShareGPT: benchmarks/fleet_accuracy.py)
    assert abs(h - sim) < 0.025, (h, sim)


def test_refusals(setting):
    tr, _, _, _ = setting
    with pytest.raises(ValueError, match="router"):
        stay_probabilities(tr, "round-robin", 2, block_size=B)
    with pytest.raises(ValueError, match="temperature"):
        stay_probabilities(tr, "dynamo", 2, params={"temperature": 0.5}, block_size=B)
    with pytest.raises(ValueError, match="unknown parameter"):
        stay_probabilities(tr, "sticky", 2, params={"prefix_weight": 1.0}, block_size=B)


def test_dynamo_routes_limits(setting):
    """dynamo_routes (Dynamo's rule on every replica's overlap, evictions by the block-tail rule): without load and
    with room for everything (N = 10⁹), every turn with a cached history (H > 0) goes where its conversation's last
    turn went — affinity, the stay model's q = 1; with a tiny N (no history ever survives: N − 1 − D < 0 after one
    allocation) and no load, every turn is a tie over all replicas (stay fraction 1/R). Seeded: the same routing
    twice."""
    tr, _, _, _ = setting
    from kvhit.fleet.estimate import dynamo_routes

    prev, rev, H, _ = _H_W(tr)
    rep = dynamo_routes(tr, 3, Ns=[10**9] * 3, block_size=B)
    keep = rev & (H > 0)
    np.testing.assert_array_equal(rep[keep], rep[prev[keep]])
    np.testing.assert_array_equal(rep, dynamo_routes(tr, 3, Ns=[10**9] * 3, block_size=B))
    rep = dynamo_routes(tr, 4, Ns=[1] * 4, block_size=B, seed=3)
    stay = float((rep[rev] == rep[prev[rev]]).mean())
    n = int(rev.sum())
    assert abs(stay - 0.25) < 4 * np.sqrt(0.25 * 0.75 / n)


@pytest.mark.parametrize(
    "router,params,R,held,destination",
    [
        ("dynamo", {}, 2, True, "uniform"),
        ("dynamo", {"mode": "approx", "ttl": 60.0}, 3, True, "uniform"),
        ("dynamo", {}, 4, False, "uniform"),
        ("dynamo", {}, 2, True, "overlap"),
        ("llm-d", {}, 2, True, "uniform"),
        ("llm-d", {}, 3, False, "uniform"),
        ("sglang", {"mode": "precise"}, 3, True, "uniform"),
        ("sglang", {}, 2, False, "uniform"),
        ("sticky", {"ttl": 60.0}, 4, True, "uniform"),
    ],
)
def test_kv_curve_is_the_per_capacity_estimate_bit_for_bit(setting, router, params, R, held, destination):
    """estimate_fleet_kv_curve answers every capacity in one call: exactly the per-capacity estimate_fleet_kv
    (capacities unsorted, repeated, below the largest request), for routings that do and do not read N; where
    the routing reads N, the default shares the Φ tables across routings (to 1e-12), ``bitwise=True`` does not."""
    from kvhit.fleet.estimate import estimate_fleet_kv_curve, routing_reads_capacity

    tr, mask, rq, rate = setting
    hold = rq.prompt_tokens / SPEED if held else None
    Ns = [1200, 5, 150, 600, 150, 40, 300]
    kw = dict(hold=hold, params=params, window=mask, rate=rate, block_size=B, seed=3, destination=destination)
    h = estimate_fleet_kv_curve(tr, router, R, Ns, bitwise=True, **kw)
    ref = [estimate_fleet_kv(tr, router, [N] * R, **kw) for N in Ns]
    np.testing.assert_array_equal(h, ref)
    assert h[0] > h[-2] + 0.05
    h2 = estimate_fleet_kv_curve(tr, router, R, Ns, **kw)
    if routing_reads_capacity(router, hold=hold, params=params, destination=destination):
        np.testing.assert_allclose(h2, ref, rtol=0, atol=1e-12)
    else:
        np.testing.assert_array_equal(h2, ref)
    assert estimate_fleet_kv_curve(tr, router, R, [], **kw).shape == (0,)


def test_which_routings_read_the_capacity(setting):
    """The premise of the curve's shared routing: Dynamo's stay model, SGLang and sticky give the same stay
    probabilities at every N (same seed); llm-d under load does not (its KV-usage term A/N), nor Dynamo's
    overlap destination (the eviction cut) — those are drawn per capacity."""
    from kvhit.fleet.estimate import dynamo_routes, routing_reads_capacity

    tr, _, rq, rate = setting
    hold = rq.prompt_tokens / SPEED
    for router in ("dynamo", "sglang", "sticky", "llm-d"):
        q = [stay_probabilities(tr, router, 3, hold=hold, Ns=[N] * 3, rate=rate, block_size=B) for N in (40, 5000)]
        reads = routing_reads_capacity(router, hold=hold)
        assert reads == (router == "llm-d")
        assert np.array_equal(q[0], q[1], equal_nan=True) != reads
    assert not routing_reads_capacity("llm-d", hold=None)
    assert not routing_reads_capacity("llm-d", hold=hold, params={"kv_weight": 0.0})
    assert routing_reads_capacity("dynamo", destination="overlap")
    reps = [dynamo_routes(tr, 3, Ns=[N] * 3, block_size=B) for N in (40, 10**9)]
    assert not np.array_equal(reps[0], reps[1])


# ----------------------------------------------------------------------------------------------------------
# dynamo_routes' compiled walk against the NumPy loop it replaced


def _dynamo_routes_reference(
    trace,
    R: int,
    *,
    hold=None,
    Ns=None,
    params: dict | None = None,
    rate: float | None = None,
    block_size: int | None = None,
    samples: int = 2048,
    seed: int = 0,
) -> np.ndarray:
    """The NumPy loop dynamo_routes ran before its compiled walk (kvhit.fleet.dynamo_kernel), verbatim."""
    p = dict(params or {})
    bad = sorted(set(p) - set(fe.KV_ROUTERS["dynamo"]))
    if bad:
        raise ValueError(f"router dynamo: unknown parameter(s) {bad}")
    if float(p.get("temperature", 0.0)) != 0.0:
        raise ValueError("temperature: the KV-aware estimator models Dynamo's argmin (temperature 0) only")
    b = int(block_size or trace.block_size or 0)
    if b < 1:
        raise ValueError("block_size: unknown (the trace has no block_size); pass block_size=")
    Ns = [1] * R if Ns is None else [int(x) for x in Ns]
    Nv = np.asarray(Ns, float)
    T = np.asarray(trace["cum_tokens"] if "cum_tokens" in trace.cols else trace["R"] * b - 1, np.int64)
    t = np.asarray(trace["time"], float)
    prev = fe._prev_rows(trace)
    H = np.where(prev < 0, 0, T[np.maximum(prev, 0)] // b)
    if rate is None:
        span = float(t.max() - t.min())
        rate = trace.n_turns / span if span > 0 else 0.0
    rng = np.random.default_rng(seed)
    I, P, A, _ = fe._load_samples(T, H, hold, rate, R, Ns, b, samples, rng)
    w, wr = float(p.get("overlap_score_weight", 1.0)), float(p.get("request_weight", 0.0))
    c = float(p.get("overlap_score_credit", 1.0))
    approx = p.get("mode", "precise") == "approx"
    ttl = float(p.get("ttl", 120.0))
    n = trace.n_turns
    srow = rng.integers(0, P.shape[0], size=n)
    tie_u = rng.random(n)
    conv = trace.dense_conv().astype(np.int64)
    n_conv = int(conv.max()) + 1 if n else 0
    last_x = np.zeros((n_conv, R))  # full blocks of the conversation's last turn on each replica
    last_t = np.full((n_conv, R), -np.inf)
    last_a = np.zeros((n_conv, R))  # the replica's allocation count just after that turn
    alloc = np.zeros(R)
    rep = np.empty(n, np.int64)
    Tb = T / b
    Fb = T // b
    nb = -(-T // b)
    for r in np.argsort(t, kind="stable"):
        cv = conv[r]
        x = np.clip(np.minimum(last_x[cv], Nv - 1.0 - (alloc - last_a[cv])), 0.0, None)
        if approx:
            x = np.where(t[r] - last_t[cv] < ttl, last_x[cv], 0.0)
        s = srow[r]
        cost = w * np.maximum(P[s] / b + Tb[r] - c * x, 0.0) + A[s] + wr * I[s]
        cand = np.flatnonzero(np.isclose(cost, cost.min(), rtol=0, atol=1e-9))
        k = int(cand[int(tie_u[r] * cand.size)]) if cand.size > 1 else int(cand[0])
        rep[r] = k
        hit = (
            min(float(x[k]), float(max((T[r] - 1) // b, 0)))
            if not approx
            else float(np.clip(min(last_x[cv, k], Nv[k] - 1.0 - (alloc[k] - last_a[cv, k])), 0.0, None))
        )
        alloc[k] += nb[r] - hit
        last_x[cv, k] = Fb[r]
        last_t[cv, k] = t[r]
        last_a[cv, k] = alloc[k]
    return rep


@pytest.mark.parametrize(
    "Nr,held,params",
    [
        (40, False, {}),
        (600, True, {}),
        (10**9, True, {"overlap_score_credit": 2.0}),
        (150, True, {"mode": "approx", "ttl": 60.0}),
        (600, True, {"request_weight": 1.0}),
    ],
)
def test_dynamo_routes_compiled_is_the_numpy_loop(setting, Nr, held, params):
    from kvhit.fleet.estimate import dynamo_routes

    tr, _, rq, rate = setting
    hold = rq.prompt_tokens / SPEED if held else None
    for R in (2, 3):
        kw = dict(hold=hold, Ns=[Nr] * R, params=params, rate=rate, block_size=B, seed=5)
        np.testing.assert_array_equal(dynamo_routes(tr, R, **kw), _dynamo_routes_reference(tr, R, **kw))


def test_shared_tables_are_each_routings_own_tables(setting):
    """SharedTables: routings that differ in a few conversations get the moment tables of their whole fragment
    traces (the kernel's, to 1e-12 relative) and the same fleet curve (to 1e-12), grids and fallbacks included."""
    from kvhit.estimate.accounting import engine_accounting
    from kvhit.estimate.displacement import _phi_table_kernel
    from kvhit.fleet.estimate import estimate_fleet_curve, fragment_trace, kv_routes
    from kvhit.fleet.shared_tables import SharedTables

    tr, mask, _, _ = setting
    R = 3
    q = stay_probabilities(tr, "dynamo", R, block_size=B)
    rep0 = kv_routes(tr, q, R, seed=1)
    conv = tr.dense_conv()
    rng = np.random.default_rng(5)
    reps = [rep0]
    for k in range(3):  # move every row of a few conversations
        rep = rep0.copy()
        for c in rng.choice(int(conv.max()) + 1, size=3 + k, replace=False):
            rep[conv == c] = (rep[conv == c] + 1 + k) % R
        reps.append(rep)
    st = SharedTables(tr, reps, R)
    assert 3 <= st.changed.sum() <= 3 + 4 + 5
    tg = np.array([0.0, 3.0, 40.0, 41.5, 400.0])
    for i, rep in enumerate(reps):
        acc = engine_accounting(fragment_trace(tr, rep, R), engine="vllm", block_size=B)
        sg = np.array([0.0, 10.0, 100.0, 1e4]) if i < 3 else np.array([0.0, 5.0])  # the last: another s-grid
        tgi = np.unique(np.concatenate([tg[i:], tg[i:] + 0.25 * i]))  # shared and new grid points
        m, v = st.for_routing(rep)(acc, tgi, sg)
        m0, v0 = np.zeros_like(m), np.zeros_like(v)
        _phi_table_kernel(acc.conv_ptr, acc.offsets, acc.cum_new, acc.hist_all, tgi, sg, m0, v0)
        np.testing.assert_allclose(m, m0, rtol=1e-12, atol=1e-12 * float(m0.max()))
        np.testing.assert_allclose(v, v0, rtol=1e-12, atol=1e-12 * float(v0.max()))
    Ns = [40, 150, 600]
    st = SharedTables(tr, reps, R)
    for rep in reps:
        h = estimate_fleet_curve(tr, rep, R, Ns, window=mask, block_size=B, tables=st.for_routing(rep))
        np.testing.assert_allclose(h, estimate_fleet_curve(tr, rep, R, Ns, window=mask, block_size=B), atol=1e-12)


def test_share_runs_cut_where_too_many_conversations_change(setting):
    """share_runs keeps consecutive routings together while at most max_changed of the conversations differ
    within the run, and starts a new run at a routing that would push the share above it."""
    from kvhit.fleet.shared_tables import share_runs

    tr = setting[0]
    conv = tr.dense_conv()
    n_conv = int(conv.max()) + 1
    a = np.zeros(tr.n_turns, np.int64)
    few = a.copy()
    few[np.isin(conv, np.arange(max(1, n_conv // 20)))] = 1  # ≤ 5 % of the conversations moved
    many = np.ones(tr.n_turns, np.int64)  # every conversation moved
    assert share_runs(tr, [a, a, few]) == [[0, 1, 2]]
    assert share_runs(tr, [a, few, many, many, a]) == [[0, 1], [2, 3], [4]]
    assert share_runs(tr, [a, few], max_changed=0.0) == [[0], [1]]
    assert share_runs(tr, []) == []
