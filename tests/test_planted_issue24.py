"""Issue 24's planted bugs, each pinned by a value computed independently of the code under test."""

from __future__ import annotations

import numpy as np
import pytest

from kvhit.workload import Exponential, Geometric, PromptResponse, WorkloadSpec, generate


@pytest.fixture(scope="module")
def scm_trace():
    sp = WorkloadSpec(
        0.5, Geometric(0.75), PromptResponse(Geometric.from_mean(4), Geometric.from_mean(3)), Exponential(60)
    )
    tr = generate(sp, 5, n_conversations=1500)
    tr.meta["block_size"] = 16
    return tr


@pytest.mark.parametrize("R", [2, 3])
def test_oblivious_fleet_estimator_divides_lam0_by_R(scm_trace, R):
    """Session affinity sends whole conversations to a replica: R independent caches at λ0/R (the paper's model
    at a thinned Poisson rate). So the fleet estimate at R equals the single-cache engine estimate at λ0/R — and
    not the one at λ0 (the planted bug: the rate not divided by R)."""
    from kvhit.estimate.engine import estimate_engine
    from kvhit.fleet.estimate import estimate_fleet_oblivious, routes

    tr, N = scm_trace, 60
    lam0 = float(tr.meta["lam0"])
    rep = routes(tr, "session", R)
    h = estimate_fleet_oblivious(tr, rep, [N] * R, block_size=16, lam0=lam0)
    want = float(estimate_engine(tr, N, lam0 / R, block_size=16).h)
    wrong = float(estimate_engine(tr, N, lam0, block_size=16).h)
    assert h == pytest.approx(want, rel=1e-9)
    assert abs(want - wrong) > 0.01  # the check can tell the two apart


def _shared_prefix_trace(starts, b=16):
    """One request per session: a 6-block shared system prompt and a session's own 1–4 blocks (chained ids)."""
    from kvhit.workload.production_trace import ProductionTrace

    ids = [[0, 1, 2, 3, 4, 5] + [1000 * (s + 1) + k for k in range(1 + s % 4)] for s in range(len(starts))]
    n = len(ids)
    return ProductionTrace(
        time=np.asarray(starts, float),
        prompt_tokens=np.array([b * len(x) + 5 for x in ids], np.int64),
        output_tokens=np.full(n, 10, np.int64),
        hash_offsets=np.concatenate([[0], np.cumsum([len(x) for x in ids])]).astype(np.int64),
        hashes=np.concatenate([np.asarray(x, np.int64) for x in ids]),
        block_size=b,
        session=np.arange(n, dtype=np.int64),
        agent=np.zeros(n, np.int64),
        model=None,
        models=(),
        file_index=np.zeros(n, np.int64),
        record=np.arange(1, n + 1),
        sub_record=np.full(n, -1),
        files=("x",),
        format="mooncake",
        session_source="file",
        rechained=False,
        n_partial_dropped=0,
    )


@pytest.mark.parametrize("lam0", [0.05, 0.3])
def test_agentic_stationary_form_rescales_cross_session_ages(lam0):
    """The stationary form (``lam0``) keeps only the shape of the trace's conversations: its start times enter
    through λ̂ alone, a cross-session age a becoming a·λ̂/λ0 (the characteristic-time rule). Stretching every start
    time by 3 (λ̂/3, ages × 3) must leave the prediction at a given λ0 unchanged — exactly; without the rescaling
    (the planted bug) it moves by up to 0.23 here."""
    from kvhit.estimate.agentic import estimate_trace

    starts = np.cumsum(np.random.default_rng(1).exponential(10.0, 60))
    Ns = np.array([8, 10, 14, 20, 40])
    a = estimate_trace(_shared_prefix_trace(starts), Ns, lam0=lam0).h
    b = estimate_trace(_shared_prefix_trace(3 * starts), Ns, lam0=lam0).h
    assert np.array_equal(a, b) or np.max(np.abs(a - b)) < 1e-12
    assert 0.2 < a[2] < 0.6  # a non-trivial point of the curve


def test_sweep_hicache_point_is_recorded_as_sglang(tmp_path):
    """HiCache is SGLang's host tier: a sweep point with ``tier = "hicache"`` is SGLang's answer and must be
    recorded as engine sglang, with the value ``kvhit tiers --tier hicache`` gives (the planted bug recorded vLLM)."""
    from kvhit import service as svc
    from kvhit.sweep import load_grid
    from kvhit.sweep.backends import run_sweep
    from kvhit.sweep.store import RESULT_COLUMNS, latest, read_results

    tr = tmp_path / "t.parquet"
    scm = {"lam0": 0.5, "p": 0.75, "x_mean": 4.0, "y_mean": 3.0, "w_mean": 60.0}
    svc.generate_trace(svc.build(svc.GenerateRequest, out=tr, conversations=200, seed=3, **scm))
    g = tmp_path / "g.toml"
    g.write_text(f'[sweep]\ncompute = "simulate"\ntier = "hicache"\n[workloads.t]\ntrace = "{tr}"\n'
                 "[axes]\nN = [100]\ndram_gb = [1]\n")  # fmt: skip
    assert run_sweep(load_grid(g), tmp_path / "o").ok == 1
    (row,) = latest(read_results(tmp_path / "o")).select(RESULT_COLUMNS).to_pylist()
    assert row["engine"] == "sglang"
    want = svc.tiers(svc.build(svc.TiersRequest, trace=tr, hbm_blocks=[100], dram_gb=[1], tier="hicache",
                               estimate="none", block_size=128))  # fmt: skip
    assert row["h"] == want.h[0][0]
