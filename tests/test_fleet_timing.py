"""Per-request timing of the fleet (kvhit.fleet.simulate: ``prefill_hold``, ``hit_token_seconds``): the compiled
pass equals the step-wise path, which equals the plain-Python reference, under hypothesis; closed-form cases pin
what each option does; bad values are refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.fleet.reference import reference_fleet
from kvhit.fleet.simulate import simulate_fleet
from test_fleet import fleets

ROUTERS = [
    ("dynamo", {}),
    ("dynamo", {"overlap_score_weight": 2.0, "request_weight": 0.5}),
    ("dynamo", {"mode": "approx", "ttl": 2.0}),
    ("least-loaded", {"metric": "prefill_tokens"}),
    ("llm-d", {}),
    ("sglang", {"mode": "precise"}),
    ("sticky", {}),
]


@st.composite
def timed_fleets(draw):
    f = draw(fleets())
    n = f["T"].shape[0]
    f["times"] = np.asarray(f["times"], np.float64)
    f["hold"] = np.array(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=n, max_size=n)))
    frac = np.array(draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=n, max_size=n)))
    f["ph"] = f["hold"] * frac if draw(st.booleans()) else None
    f["hts"] = draw(st.sampled_from([0.0, 0.0, 0.1, 0.25, 2.0]))
    return f


@pytest.mark.parametrize("router,params", ROUTERS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(ROUTERS)])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(f=timed_fleets())
def test_compiled_stepwise_reference_agree(router, params, f):
    kw = dict(Ns=f["Ns"], block_size=f["b"], router=router, router_params=params, times=f["times"], hold=f["hold"],
              seed=f["seed"], lag=f["lag"], prefill_hold=f["ph"], hit_token_seconds=f["hts"])  # fmt: skip
    a = simulate_fleet(f["T"], f["off"], f["h"], f["conv"], fast=True, **kw)
    s = simulate_fleet(f["T"], f["off"], f["h"], f["conv"], fast=False, **kw)
    for x in ("replica", "hit_blocks", "new_blocks", "rejected", "wait"):
        np.testing.assert_array_equal(getattr(a, x), getattr(s, x), err_msg=x)
    rep, hit, wait, rej = reference_fleet(
        f["T"], f["off"], f["h"], f["conv"], Ns=f["Ns"], b=f["b"], router=router, params=params, times=f["times"],
        hold=f["hold"], seed=f["seed"], lag=f["lag"], prefill_hold=f["ph"], hit_token_seconds=f["hts"],
    )  # fmt: skip
    assert s.replica.tolist() == rep
    assert s.hit_blocks.tolist() == hit
    assert s.rejected.tolist() == rej
    np.testing.assert_array_equal(s.wait, np.array(wait))


@pytest.mark.parametrize("router", ["round-robin", "session", "random"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(f=timed_fleets())
def test_oblivious_routers_with_hit_token_seconds(router, f):
    """An oblivious router under hit_token_seconds: the compiled pass with the routes fixed in advance (default)
    equals the step-wise path request by request, and both match the reference."""
    kw = dict(Ns=f["Ns"], block_size=f["b"], router=router, times=f["times"], hold=f["hold"], seed=f["seed"],
              prefill_hold=f["ph"], hit_token_seconds=f["hts"])  # fmt: skip
    a = simulate_fleet(f["T"], f["off"], f["h"], f["conv"], **kw)
    s = simulate_fleet(f["T"], f["off"], f["h"], f["conv"], fast=False, **kw)
    for x in ("replica", "hit_blocks", "new_blocks", "rejected", "wait"):
        np.testing.assert_array_equal(getattr(a, x), getattr(s, x), err_msg=x)
    rep, hit, wait, rej = reference_fleet(
        f["T"], f["off"], f["h"], f["conv"], Ns=f["Ns"], b=f["b"], router=router, times=f["times"], hold=f["hold"],
        seed=f["seed"], prefill_hold=f["ph"], hit_token_seconds=f["hts"],
    )  # fmt: skip
    assert s.replica.tolist() == rep and s.hit_blocks.tolist() == hit
    np.testing.assert_array_equal(s.wait, np.array(wait))


def _two(b=4):
    """Request 0: 5 full blocks at t = 0 (to whichever replica the empty fleet's tie-break picks); request 1 at
    t = 5: the same 5 blocks then 3 more (8 blocks)."""
    T = np.array([5 * b, 8 * b], np.int64)
    off = np.array([0, 5, 13], np.int64)
    h = np.array([1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 6, 7, 8], np.int64)
    return T, off, h, np.array([0, 0], np.int64)


@pytest.mark.parametrize("fast", [True, False])
def test_prefill_hold_drops_prefill_tokens_but_keeps_active_blocks(fast):
    """Dynamo, prefill_load_scale 2, R = 2: request 1 (8 blocks, 5 cached on request 0's replica k0, which still
    holds request 0's 5 active blocks). Prefill tokens still counted (no prefill_hold):
    logit_k0 = 2·(5 + 8 − 5) + (5 + 8) = 29 > logit_other = 2·8 + 8 = 24 → the other replica. Prefill done at
    t = 1 < 5: logit_k0 = 2·(8 − 5) + (5 + 8) = 19 < 24 → k0."""
    b = 4
    T, off, h, conv = _two(b)
    kw = dict(Ns=[64, 64], block_size=b, router="dynamo", router_params={"overlap_score_weight": 2.0},
              times=np.array([0.0, 5.0]), hold=np.array([100.0, 1.0]), fast=fast)  # fmt: skip
    base = simulate_fleet(T, off, h, conv, **kw)
    timed = simulate_fleet(T, off, h, conv, prefill_hold=np.array([1.0, 1.0]), **kw)
    k0 = int(base.replica[0])
    assert int(timed.replica[0]) == k0
    assert int(base.replica[1]) != k0
    assert int(timed.replica[1]) == k0 and int(timed.hit_blocks[1]) == 5
    late = simulate_fleet(T, off, h, conv, prefill_hold=np.array([6.0, 1.0]), **kw)  # prefill not done by t = 5
    assert int(late.replica[1]) != k0


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("hts", [0.0, 0.5, 10.0])
def test_hit_token_seconds_shortens_the_hold_by_the_cached_tokens(fast, hts):
    """One replica of N = 4 blocks, b = 2. A (4 blocks, t = 0, hold 10) fills it; B (A's 4 blocks, t = 1) hits
    (T − 1)//b = 3 of them but needs a free block: it waits until A finishes at 10, starts there with 3 cached
    blocks (6 tokens) and finishes at 10 + max(8 − 6·hts, 0); C (4 new blocks, t = 11) waits for B's blocks."""
    b = 2
    T = np.array([8, 8, 8], np.int64)
    off = np.array([0, 4, 8, 12], np.int64)
    h = np.array([1, 2, 3, 4, 1, 2, 3, 4, 9, 10, 11, 12], np.int64)
    res = simulate_fleet(T, off, h, np.array([0, 0, 1]), Ns=[4], block_size=b, router="dynamo",
                         times=np.array([0.0, 1.0, 11.0]), hold=np.array([10.0, 8.0, 1.0]), hit_token_seconds=hts,
                         fast=fast)  # fmt: skip
    assert res.hit_blocks.tolist() == [0, 3, 0]
    b_fin = 10.0 + max(8.0 - 6 * hts, 0.0)
    assert res.wait.tolist() == [0.0, 9.0, max(b_fin - 11.0, 0.0)]


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(prefill_hold=[1.0, 1.0]), "hold: required"),
        (dict(hit_token_seconds=0.1), "hold: required"),
        (dict(hold=[1.0, 1.0], hit_token_seconds=-1.0), "hit_token_seconds"),
        (dict(hold=[1.0, 1.0], hit_token_seconds=float("nan")), "hit_token_seconds"),
        (dict(hold=[1.0, 1.0], prefill_hold=[2.0, 0.0]), "prefill_hold"),
        (dict(hold=[1.0, 1.0], prefill_hold=[-0.5, 0.0]), "prefill_hold"),
        (dict(hold=[1.0, 1.0], prefill_hold=[0.5]), "prefill_hold"),
    ],
)
def test_bad_timing_is_refused(kw, msg):
    T, off, h, conv = _two()
    kw = {"times": [0.0, 1.0], **kw}
    if "hold" not in kw and "prefill_hold" not in kw and "hit_token_seconds" not in kw:
        kw.pop("times")
    with pytest.raises(ValueError, match=msg):
        simulate_fleet(T, off, h, conv, Ns=[8, 8], block_size=4, router="dynamo", **kw)
