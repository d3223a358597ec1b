"""``measured`` windows of the h(HBM, DRAM) surface and of the two-tier estimator, and ``kvhit tiers --measure``.

The surface counted over a mask equals per-pair TieredEngine replays of the whole stream summed over the masked,
admitted requests (the slow reference, every request still driving the caches); the estimator with an all-true mask
is the estimator without one; the service's ``--measure window`` counts the trace's post-warm-up requests and
carries the window's stationarity report.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit import service as svc
from kvhit.sim.engine import replay, requests_from_stream
from kvhit.sim.tiers import make_tiered
from kvhit.sim.tiers.surface import hit_surface
from test_tiers_surface import streams

SCM = {"lam0": 1.0, "mean_turns": 5.0, "x_mean": 4.0, "y_mean": 3.0, "w_mean": 135.0}


def _per_pair_masked(tier, T, off, h, b, Ns, Cs, meas, **kw):
    reqs = requests_from_stream(T, off, h)
    out = np.full((len(Ns), len(Cs)), np.nan)
    for i, N in enumerate(Ns):
        for j, C in enumerate(Cs):
            e = make_tiered(tier, gpu_blocks=int(N), host_capacity=int(C), block_size=b, **kw)
            res = replay(e, reqs)
            keep = ~res.rejected & meas
            if keep.any():
                out[i, j] = res.hit_tokens[keep].sum() / T[keep].sum()
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.sampled_from(["native", "lmcache", "simple"]), st.data())
def test_masked_surface_equals_masked_per_pair_replay(s, tier, data):
    b, T, off, h = s
    meas = np.array(data.draw(st.lists(st.booleans(), min_size=len(T), max_size=len(T))), bool)
    kw = {"chunk_tokens": b} if tier == "lmcache" else {}
    Ns = np.array([1, 3, 8, 20])
    Cs = np.array([0, 1, 4, 12]) if tier != "simple" else np.array([1, 4, 12])
    surf = hit_surface(T, off, h, tier=tier, gpu_blocks=Ns, host=Cs, block_size=b, measured=meas, **kw)
    ref = _per_pair_masked(tier, T, off, h, b, Ns, Cs, meas, **kw)
    np.testing.assert_array_equal(np.isnan(surf.hit), np.isnan(ref))
    np.testing.assert_allclose(np.nan_to_num(surf.hit), np.nan_to_num(ref), rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    from kvhit.workload import Trace

    p = tmp_path_factory.mktemp("tw") / "t.parquet"
    svc.generate_trace(svc.build(svc.GenerateRequest, out=p, conversations=400, seed=5, **SCM))
    tr = Trace.read(p)
    tr.meta.update(n_warm=150, block_size=16)
    tr.write(p)
    return p


def test_service_measure_window_counts_the_post_warmup_requests(trace):
    from kvhit.sim.runner import block_requests
    from kvhit.workload import Trace, Window

    tr = Trace.read(trace)
    br = block_requests(tr)
    mask = np.asarray(Window.warmup_conversations(tr, int(tr.meta["n_warm"])).mask(tr), bool)
    assert 0 < mask.sum() < mask.size
    T = np.asarray(br.prompt_tokens, np.int64)
    Ns, Cs = [40, 200], [0, 64, 512]
    ref = _per_pair_masked("native", T, br.hash_offsets, br.hashes, int(br.block_size), Ns, Cs, mask)
    res = svc.tiers(svc.build(svc.TiersRequest, trace=trace, hbm_blocks=Ns, host_units=Cs, measure="window"))
    np.testing.assert_allclose(np.array(res.h, float), ref, rtol=0, atol=1e-12)
    assert res.measure == "window" and res.stationarity is not None
    whole = svc.tiers(svc.build(svc.TiersRequest, trace=trace, hbm_blocks=Ns, host_units=Cs))
    ref_all = _per_pair_masked("native", T, br.hash_offsets, br.hashes, int(br.block_size), Ns, Cs, mask | ~mask)
    np.testing.assert_allclose(np.array(whole.h, float), ref_all, rtol=0, atol=1e-12)
    # every request from an empty cache: no warm-up, so never a steady-state window
    assert whole.stationarity["stationary"] is False
    assert any(n.startswith("--measure all") for n in whole.notes)


def test_estimator_all_true_mask_is_the_unmasked_estimator(trace):
    from kvhit.estimate.tiers import estimate_tiers
    from kvhit.workload import Trace

    tr = Trace.read(trace)
    a = estimate_tiers(tr, [40, 200], [0, 64, 512], tier="native")
    m = estimate_tiers(tr, [40, 200], [0, 64, 512], tier="native", measured=np.ones(len(tr), bool))
    np.testing.assert_array_equal(a.hit, m.hit)
    np.testing.assert_array_equal(a.gpu_hit, m.gpu_hit)


def test_measure_window_refusals(tmp_path):
    mc = tmp_path / "m.jsonl"
    mc.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n')
    with pytest.raises(svc.InputError, match=r"^--measure window: a block-id trace has no warm-up"):
        svc.tiers(svc.build(svc.TiersRequest, blocks_trace=mc, hbm_blocks=[10], host_units=[4], measure="window"))
    with pytest.raises(svc.InputError, match=r"^--trace and --blocks-trace: give exactly one"):
        svc.tiers(svc.build(svc.TiersRequest, hbm_blocks=[10], host_units=[4]))
