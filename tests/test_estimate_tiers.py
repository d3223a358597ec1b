"""The two-tier estimator (kvhit.estimate.tiers): structure of the block-by-block union and agreement with the
tier simulator; `kvhit tiers --estimate` through the service."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvhit.cli import main
from kvhit.estimate.agentic import estimate_trace
from kvhit.estimate.tiers import TierEstimateError, estimate_tiers
from kvhit.sim.tiers.surface import hit_surface
from kvhit.workload.production import read_mooncake, read_weka
from kvhit.workload.reuse import request_reuse

DATA = Path(__file__).parent / "data" / "production"
MOON = DATA / "mooncake_small.jsonl"
WEKA = [DATA / "weka_0022.json", DATA / "weka_0014_cut.json", DATA / "weka_0026.json"]


@pytest.fixture(scope="module")
def weka():
    return read_weka(WEKA, arrival="uniform", span=600, seed=0)


def _grid(pt, k=4):
    R = -(-pt.prompt_tokens // pt.block_size)
    U = int(np.unique(pt.hashes).size)
    return np.unique(np.geomspace(int(R.max()), U, k).astype(np.int64))


@pytest.mark.parametrize("tier,kw", [("native", {}), ("lmcache", {"chunk_tokens": 256}), ("simple", {})])
def test_no_host_is_the_single_tier_estimator(weka, tier, kw):
    R = -(-weka.prompt_tokens // weka.block_size)
    Ns = np.array([1500, 3000, 6000])  # ≥ N_min = 1,192: one call, as the single-tier estimator over the same Ns
    e = estimate_tiers(weka, Ns, [0, 500], tier=tier, **kw)
    ref = estimate_trace(weka, Ns).h
    assert np.array_equal(e.hit[:, 0], ref) and np.array_equal(e.gpu_hit, ref)
    # below N_min: the ratio over the admitted requests (as the surface), nothing admitted → NaN
    for N in (40, 600):
        e = estimate_tiers(weka, [N], [0, 500], tier=tier, **kw)
        if not (R <= N).any():
            assert np.isnan(e.hit[0, 0])
            continue
        assert e.hit[0, 0] == estimate_trace(weka, [N], mask=R <= N).h[0]


def test_native_host_smaller_than_gpu_adds_nothing_and_larger_is_the_host(weka):
    # no prompt a multiple of the block size (the T − 1 cap is the one exception, see the module docstring): one
    # token more keeps the same full blocks
    T = weka.prompt_tokens
    weka = replace(weka, prompt_tokens=T + (T % weka.block_size == 0))
    Ns = _grid(weka)
    Cs = np.array([1, 100, 1000, 2000, 4000, 8000])
    e = estimate_tiers(weka, Ns, Cs, tier="native")
    for i, N in enumerate(Ns):
        small = Cs <= N - 2
        assert np.all(e.hit[i, small] == e.gpu_hit[i])
        big = Cs >= N
        # equal to rounding: the GPU's and the host's law tables are built apart, and since the by-age sweep
        # (issue 23 §6) a row's last bits depend on the rows swept with it, so a request where the two counts tie
        # may take either (exactly equal before, when both tables computed the tied rows the same way)
        assert np.all(np.abs(e.hit[i, big] - e.host_hit[i, big]) <= 1e-12)
        assert np.all(e.host_hit[i, big] >= e.gpu_hit[i] - 1e-12)


@pytest.mark.parametrize("tier,kw", [("native", {}), ("native", {"blocks_per_chunk": 4}), ("lmcache", {})])
def test_monotone_in_hbm_and_dram(weka, tier, kw):
    Ns = _grid(weka, 6)
    Cs = np.array([0, 50, 300, 1000, 3000, 9000]) // kw.get("blocks_per_chunk", 4 if tier == "lmcache" else 1)
    e = estimate_tiers(weka, Ns, Cs, tier=tier, **kw)
    assert np.all(np.diff(e.hit, axis=0) >= -1e-12)
    assert np.all(np.diff(e.hit, axis=1) >= -1e-12)
    assert np.all((e.hit >= 0) & (e.hit <= request_reuse(weka).ceiling() + 1e-9 + 0.01))


def test_lmcache_put_after_touch_is_stricter_than_native_chunks(weka):
    """Same 256-token chunks: LMCache's new chunks sit above the found prefix (seg_shift ≥ 0), so its host part
    can only lose against vLLM native's head-most-recent order at the same number of chunks."""
    Ns, Cs = [1200], [20, 100, 400, 1000]
    lm = estimate_tiers(weka, Ns, Cs, tier="lmcache", chunk_tokens=256)
    nat = estimate_tiers(weka, Ns, Cs, tier="native", blocks_per_chunk=4)
    assert np.all(lm.host_hit <= nat.host_hit + 1e-12)
    assert np.any(lm.host_hit < nat.host_hit - 1e-6)


def test_chunked_reuse_names_chunks_by_their_last_block(weka):
    u, uc = request_reuse(weka), request_reuse(weka, chunk_blocks=4)
    assert uc.block_size == 4 * u.block_size
    assert np.array_equal(uc.full_blocks, u.full_blocks // 4)
    assert np.all(uc.L_any <= u.L_any // 4)  # a chunk is seen only if its last block was


@pytest.mark.parametrize("tier,kw", [("native", {}), ("lmcache", {"chunk_tokens": 256})])
def test_estimate_near_the_simulator_on_the_fixture(weka, tier, kw):
    """18 requests of 3 WEKA conversations, the issue's agentic target 0.02 (measured when written: max 0.014,
    at the smallest HBM without a useful host tier — the single-tier estimator's own error)."""
    rq = weka.to_block_requests()
    Ns = _grid(weka, 3)
    bpc = 4 if tier == "lmcache" else 1
    Cs = np.array([0, 600, 1500, 3000, 6000]) // bpc
    s = hit_surface(
        rq.prompt_tokens, rq.hash_offsets, rq.hashes, tier=tier, gpu_blocks=Ns, host=Cs, block_size=64, **kw
    )
    e = estimate_tiers(weka, Ns, Cs, tier=tier, **kw)
    assert np.abs(e.hit - s.hit).max() < 0.02


def test_bad_arguments(weka):
    with pytest.raises(TierEstimateError, match="tier"):
        estimate_tiers(weka, [100], [0], tier="hicache")
    with pytest.raises(TierEstimateError, match="chunk_tokens"):
        estimate_tiers(weka, [100], [0], tier="lmcache", chunk_tokens=100)
    with pytest.raises(TierEstimateError, match="host_units"):
        estimate_tiers(weka, [100], [-1])
    with pytest.raises(TierEstimateError, match="hbm_blocks"):
        estimate_tiers(weka, [0], [1])


def test_cli_estimate_only_and_also(capsys):
    args = ["tiers", "--blocks-trace", str(MOON), "--hbm-blocks", "200,400", "--host-units", "0,100,800", "--json"]
    assert main([*args, "--estimate", "only"]) == 0
    only = json.loads(capsys.readouterr().out)
    e = estimate_tiers(read_mooncake(MOON), [200, 400], [0, 100, 800])
    assert only["h_source"] == "estimate" and only["h"] == e.hit.tolist() and only["h_estimate"] == e.hit.tolist()
    assert only["h_gpu"] == e.gpu_hit.tolist()
    assert main([*args, "--estimate", "also"]) == 0
    also = json.loads(capsys.readouterr().out)
    rq = read_mooncake(MOON).to_block_requests()
    s = hit_surface(rq.prompt_tokens, rq.hash_offsets, rq.hashes, tier="native", gpu_blocks=[200, 400],
                    host=[0, 100, 800], block_size=512)  # fmt: skip
    assert also["h_source"] == "simulated" and also["h"] == s.hit.tolist() and also["h_estimate"] == e.hit.tolist()
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["h_estimate"] is None


@pytest.mark.parametrize(
    "extra,flag",
    [
        (["--tier", "hicache", "--estimate", "only"], "--estimate"),
        (["--policy", "arc", "--estimate", "also"], "--policy"),
        (["--store-threshold", "2", "--estimate", "only"], "--store-threshold"),
        (["--estimate", "maybe"], "--estimate"),
    ],
)
def test_cli_estimate_refusals(capsys, extra, flag):
    rc = main(["tiers", "--blocks-trace", str(MOON), "--hbm-blocks", "200", "--host-units", "0,10", *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and flag in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_lmcache_split_keeps_the_segments_and_shifts_the_put_part(weka):
    """Each age segment is cut at the source's found prefix: same blocks, same sources; a found chunk is shifted by
    the source's put chunks F − l, a put chunk by the ramp with the step's mean threshold F − (a + e + 1)/2."""
    from kvhit.estimate.tiers import _lmcache_segments

    uc = request_reuse(weka, chunk_blocks=4)
    sp, sh = _lmcache_segments(uc)
    n_blocks = lambda u: np.bincount(  # noqa: E731
        np.repeat(np.arange(u.n), np.diff(u.seg_off)), weights=u.seg_end - u.seg_start, minlength=u.n
    )
    assert np.array_equal(n_blocks(sp), n_blocks(uc))
    assert sh.shape == sp.seg_start.shape and (sh >= 0).all()
    src = sp.seg_src
    F, lf = uc.full_blocks[src], uc.L_any[src]
    found = sp.seg_end <= lf
    assert np.array_equal(sh[found], (F - lf)[found])
    put = sp.seg_start >= lf
    assert np.array_equal(sh[put], np.maximum(F - (sp.seg_start + sp.seg_end + 1) // 2, 0)[put])
    assert (found | put).all()  # no piece straddles the cut


def test_per_request_hits_sum_to_h_and_rejection_off_only_adds(weka):
    Ns = [300, 800, 1500]
    e = estimate_trace(weka, Ns, per_request=True)
    den = weka.prompt_tokens.sum()
    assert np.allclose(e.per_request.sum(axis=0) / den, e.h, rtol=1e-12, atol=1e-12)
    assert estimate_trace(weka, Ns).per_request is None
    off = estimate_trace(weka, Ns, rejection=False, per_request=True)
    assert np.all(off.per_request >= e.per_request - 1e-9)  # refused requests only lose their own hits
    assert np.any(off.h > e.h + 1e-6)  # 300/800 blocks are below N_min = 1,192: some are refused there
    with pytest.raises(ValueError, match="per_request"):
        estimate_trace(weka, Ns, form="replay", per_request=True)


def test_all_or_nothing_stream(weka):
    from kvhit.estimate.tiers import _all_or_nothing

    u = request_reuse(weka)
    assert _all_or_nothing(u, int(u.full_blocks.max())) is u  # every request fits: the stream is unchanged
    C = 600
    a = _all_or_nothing(u, C)
    big = u.full_blocks > C
    assert np.array_equal(a.full_blocks[~big], u.full_blocks[~big])
    assert np.all(a.full_blocks[big] == np.minimum(u.full_blocks, u.L_any)[big])  # found prefix only
    src = a.seg_src
    cut = big[src]
    assert np.all(a.seg_end[cut] <= np.maximum(np.minimum(u.full_blocks, u.L_any)[src][cut], a.seg_start[cut]))
