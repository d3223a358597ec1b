"""SGLang engine-aware estimator (kvhit.estimate.sglang): hand-worked accounting, closed-form limits, pages,
rejection, shared prefixes, and agreement with the SGLang radix simulator on a held-out seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvhit.estimate.agentic import AgenticError
from kvhit.estimate.sglang import estimate_sglang, estimate_sglang_window, sglang_accounting
from kvhit.estimate.sglang_agentic import estimate_trace_sglang, sglang_node_pieces
from kvhit.estimate.trace_stats import EstimateError
from kvhit.sim.sglang.radix import simulate_radix
from kvhit.sim.sglang.streams import streams_from_production, streams_from_trace
from kvhit.workload.dists import Exponential
from kvhit.workload.generate import trace_from_conversations
from kvhit.workload.production import read_mooncake, read_weka
from kvhit.workload.reuse import request_reuse
from kvhit.workload.trace import Window
from test_estimate_engine import hand_trace, token_trace


def _conv_rows(sa):
    """Own node table per revisit as [(end, hit length), ...] lists, in revisit order."""
    return [
        list(zip(sa.node_end[a:b].tolist(), sa.node_len[a:b].tolist(), strict=True))
        for a, b in zip(sa.node_ptr[:-1], sa.node_ptr[1:], strict=True)
    ]


def test_hand_worked_accounting_page_1():
    # conversation 0: T = 5, 9, 16 with outputs n = 2, 3, 1; conversation 1: T = 8, n = 1 (hand_trace)
    tr = hand_trace()
    sa = sglang_accounting(tr)
    # chain after each turn: T + n − 1 = 6, 11, 16 (c_3 = 16: n = 1 caches the prompt only); conv 1: 8
    assert sa.acc.E_B == pytest.approx((16 + 8) / 2)
    assert sa.acc.A == pytest.approx((6 + 11) / 2)  # cached chain moving on the two revisits
    # revisit 2 (T = 9, cap 8) finds nodes [0, 5) prompt, [5, 6) output; revisit 3 (cap 15) finds
    # [0, 5), [5, 6), [6, 9) (turn 2's new prompt part), [9, 11) (turn 2's output)
    assert _conv_rows(sa) == [[(5, 5), (6, 1)], [(5, 5), (6, 1), (9, 3), (11, 2)]]
    assert sa.h_max == pytest.approx((6 + 11) / (5 + 9 + 16 + 8))
    assert sa.cap_offset == 0.0


def test_hand_worked_accounting_pages_and_cap():
    # p = 4: chains ⌊6/4⌋ = 1, ⌊11/4⌋ = 2, ⌊16/4⌋ = 4 pages; caps ⌊(T − 1)/4⌋ = 1, 2, 3 pages
    sa = sglang_accounting(hand_trace(), page_size=4)
    # revisit 2: boundaries ⌊5/4⌋ = 1 and c_1 = 1 → one node [0, 1); revisit 3: [0, 1), [1, 2) (⌊9/4⌋ = c_2 = 2)
    assert _conv_rows(sa) == [[(1, 1)], [(1, 1), (2, 1)]]
    assert sa.h_max == pytest.approx(4 * (1 + 2) / (5 + 9 + 16 + 8))
    # one page of conservative demand + the partial last page (T + n − 1 = 6, 11, 16, 8: two of four partial)
    assert sa.cap_offset == pytest.approx(1.0 + 0.5)
    assert sa.max_need == 5  # ⌈16/4⌉ + 1


def test_cap_cuts_the_cached_output():
    # one conversation, T = 10 then 12 (a prompt shorter than the cached chain T + n − 1 = 14): hit ≤ T − 1 = 11
    cols = {
        "prompt_tokens": np.array([10, 2]),
        "response_tokens": np.array([5, 1]),
        "cum_tokens": np.array([10, 12]),
    }
    tr = trace_from_conversations(
        np.array([2]), np.array([1, 1]), lam0=1.0, interarrival=Exponential(1.0), seed=0, extra=cols
    )
    sa = sglang_accounting(tr)
    assert _conv_rows(sa) == [[(10, 10), (14, 1)]]  # the output node [10, 14) survives whole or not at all
    assert sa.h_max == pytest.approx(11 / 22)


@pytest.mark.parametrize("p", [1, 8])
def test_unbounded_pool_equals_ceiling_and_simulator(p):
    """C ≥ every token of the trace: no eviction, every revisit hits its whole cached chain up to the cap —
    the estimate is the closed-form ceiling, equal to the simulator's ratio."""
    tr = token_trace(3, n_conv=300)
    ts = streams_from_trace(tr, source="counts")
    C = (int(tr["cum_tokens"].sum() + tr["response_tokens"].sum()) // p + 2) * p
    sim = simulate_radix(ts, C, page_size=p).token_hit_ratio()
    sa = sglang_accounting(tr, page_size=p)
    est = estimate_sglang(sa, C, 1.0)
    assert sa.h_max == pytest.approx(sim, abs=1e-12)
    assert est.h == pytest.approx(sa.h_max, abs=1e-9)
    assert est.rejected_share == 0.0


def test_monotone_bounded_and_mean_field():
    tr = token_trace(4, n_conv=400)
    Cs = np.array([200, 1000, 4000, 16000, 64000])
    for fl in (True, False):
        h = estimate_sglang(tr, Cs, 1.0, fluctuations=fl).h
        assert (np.diff(h) >= -1e-12).all()
        assert (h >= 0).all() and (h <= sglang_accounting(tr).h_max + 1e-12).all()


def test_rejection_counts_misses():
    tr = token_trace(5, n_conv=200)
    sa = sglang_accounting(tr)
    small = int(np.median(sa.need))
    est = estimate_sglang(sa, [small, sa.max_need], 1.0)
    assert est.rejected_share[0] > 0 and est.rejected_share[1] == 0.0
    assert est.h[0] < est.h[1]
    off = estimate_sglang(sa, [small], 1.0, rejection=False).h[0]
    assert off != est.h[0]


def test_pages_move_the_estimate_like_the_simulator():
    """p = 16 loses the partial pages and a page of capacity: both the simulator and the estimate drop."""
    tr = token_trace(6, n_conv=600)
    win = Window.warmup_conversations(tr, 100)
    ts = streams_from_trace(tr, source="counts")
    C = 24_000
    sim = [simulate_radix(ts, C, page_size=p).token_hit_ratio(win.mask(tr)) for p in (1, 16)]
    est = [estimate_sglang_window(tr, C, 1.0, window=win, page_size=p).h for p in (1, 16)]
    assert sim[1] < sim[0] and est[1] < est[0]


def test_shared_prefix_groups_and_ceiling():
    # three one-turn conversations sharing 4 tokens, two of them 6; a fourth sharing nothing
    toks = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 9, 9], [1, 2, 3, 4, 8, 8], [7, 7, 7]]
    n = len(toks)
    cols = {
        "prompt_tokens": np.array([len(t) for t in toks]),
        "response_tokens": np.ones(n, np.int64),
        "cum_tokens": np.array([len(t) for t in toks]),
    }
    tr = trace_from_conversations(
        np.ones(n, np.int64), np.ones(n, np.int64), lam0=1.0, interarrival=Exponential(1.0), seed=0, extra=cols
    )
    tr.lists["new_tokens"] = [np.array(toks[int(c)]) for c in tr["conv"]]
    sa = sglang_accounting(tr)
    assert sa.shared
    # conv 0, 1: [0, 4) shared by 3, [4, 6) by 2; conv 2: [0, 4) by 3; conv 3: nothing
    segs = sorted(zip(sa.seg_end.tolist(), sa.seg_len.tolist(), sa.seg_g.tolist(), strict=True))
    assert segs == sorted([(4, 4, 3), (6, 2, 2), (4, 4, 3), (6, 2, 2), (4, 4, 3)])
    # ceiling: a first turn finds a shared segment with probability 1 − 1/g (an earlier group member)
    want = (3 * 4 * (2 / 3) + 2 * 2 * (1 / 2)) / sum(len(t) for t in toks)
    assert sa.h_max == pytest.approx(want)
    assert sglang_accounting(tr, shared=False).h_max == 0.0


def test_bad_input_names_the_field():
    tr = hand_trace()
    with pytest.raises(EstimateError, match="page_size"):
        sglang_accounting(tr, page_size=0)
    with pytest.raises(EstimateError, match="C:"):
        estimate_sglang(tr, [3], 1.0, page_size=4)
    with pytest.raises(EstimateError, match="shared"):
        sglang_accounting(tr, shared=True)


def test_agrees_with_simulator_on_held_out_seed():
    """Window-exact form against the SGLang radix simulator (page size 1, LRU, no holds). Designed on seeds
    11 and 12 of this workload (max |error| 0.022 at h ≈ 0.3, 1,200 measured conversations); seed 14 was not
    looked at before this tolerance was written."""
    tr = token_trace(14, n_conv=1500, lam0=1.0, mu=20.0)
    win = Window.warmup_conversations(tr, 300)
    ts = streams_from_trace(tr, source="counts")
    Cs = np.array([16_000, 32_000, 64_000])
    sim = np.array([simulate_radix(ts, int(C)).token_hit_ratio(win.mask(tr)) for C in Cs])
    est = estimate_sglang_window(tr, Cs, 1.0, window=win).h
    assert np.abs(est - sim).max() < 0.025


# ------------------------------------------------------------------------------------------------------
# production block-id traces (kvhit.estimate.sglang_agentic)
# ------------------------------------------------------------------------------------------------------

PROD = Path(__file__).parent / "data" / "production"
WEKA3 = [PROD / "weka_0022.json", PROD / "weka_0026.json", PROD / "weka_0014_cut.json"]


def _radix(pt, Cs):
    ts = streams_from_production(pt)
    return np.array([simulate_radix(ts, int(C)).token_hit_ratio() for C in Cs])


def _grid(pt, k=12):
    need = pt.prompt_tokens + np.maximum(pt.output_tokens, 1) - 1
    return np.unique(np.geomspace(need.max(), need.sum(), k).astype(np.int64))


def test_node_pieces_partition_the_reusable_run():
    pt = read_mooncake(PROD / "mooncake_small.jsonl")
    u = request_reuse(pt)
    pc = sglang_node_pieces(pt, u)
    b = u.block_size
    covered = np.bincount(pc["req"], weights=pc["end"] - pc["start"], minlength=u.n)
    np.testing.assert_array_equal(covered, u.L_any * b)
    same = pc["req"][1:] == pc["req"][:-1]
    assert (pc["start"][1:][same] == pc["end"][:-1][same]).all()  # contiguous, increasing
    # every age segment ends a piece
    assert int(pc["last"].sum()) == int(u.seg_start.size)
    np.testing.assert_array_equal(pc["len"], np.minimum(pc["end"], u.prompt_tokens[pc["req"]] - 1) - pc["start"])


def test_agentic_one_conversation_at_a_time_equals_the_simulator():
    """No background (conversations never overlap, λ0 → 0): D is the own conversation's other streams, read from
    the trace, so the node recursion (a miss re-inserts the rest of the history as one node) is the simulator's
    tree — equal up to 2e-3 (measured: 0.00085 at the smallest pool, 0 elsewhere). At λ0 = 1/s the others
    displace: fewer hits somewhere."""
    pt = read_weka(WEKA3, arrival="sequential", gap=10.0)
    Cs = _grid(pt)
    sim = _radix(pt, Cs)
    est = estimate_trace_sglang(pt, Cs, lam0=1e-12)
    assert np.abs(est.h - sim).max() < 2e-3
    assert np.any(estimate_trace_sglang(pt, Cs, lam0=1.0).h < sim - 0.01)


def test_agentic_unbounded_pool_is_the_ceiling_and_infeasible_below_the_largest():
    pt = read_weka(WEKA3, arrival="uniform", span=600, seed=3)
    need = pt.prompt_tokens + np.maximum(pt.output_tokens, 1) - 1
    big = int(need.sum()) + 1
    est = estimate_trace_sglang(pt, [int(need.max()) - 1, big])
    assert est.h[1] == pytest.approx(_radix(pt, [big])[0], abs=1e-12)
    assert est.h[1] == pytest.approx(est.h_max, abs=1e-12)
    assert est.infeasible.tolist() == [True, False] and est.N_min == int(need.max())
    assert est.rejected_requests[0] > 0 and est.h[0] <= est.h[1]


def test_agentic_seeded_and_bad_input():
    pt = read_weka(WEKA3, arrival="uniform", span=600, seed=3)
    Cs = _grid(pt, 5)
    a = estimate_trace_sglang(pt, Cs, samples=8, seed=1).h
    np.testing.assert_array_equal(a, estimate_trace_sglang(pt, Cs, samples=8, seed=1).h)
    assert (np.diff(estimate_trace_sglang(pt, Cs).h) >= -0.01).all()  # nondecreasing up to sampling noise
    with pytest.raises(AgenticError, match="Cs"):
        estimate_trace_sglang(pt, [0])
    with pytest.raises(AgenticError, match="lam0"):
        estimate_trace_sglang(pt, Cs, lam0=-1.0)


def test_agentic_replay_form_equals_the_simulator_on_overlapping_conversations():
    """form='replay' reads every window's displacement from the trace (the working-set identity, no model): the
    hit rule and the node recursion alone are then within 2e-3 of the simulator (measured 0.00085)."""
    pt = read_weka(WEKA3, arrival="uniform", span=300, seed=5)
    Cs = _grid(pt)
    assert np.abs(estimate_trace_sglang(pt, Cs, form="replay").h - _radix(pt, Cs)).max() < 2e-3
    with pytest.raises(AgenticError, match="lam0"):
        estimate_trace_sglang(pt, Cs, form="replay", lam0=1.0)


def test_agentic_joint_background_leaves_the_own_conversation_out():
    """A pool of one conversation: the joint background (every *other* conversation once) is empty, so the
    default estimate is the recursion on the own conversation's displacement — the simulator (within 2e-3). If
    the tagged conversation's own template were drawn as background, hits would drop."""
    pt = read_weka(WEKA3[:1], arrival="uniform", span=600, seed=3)
    assert int(np.unique(pt.session).size) == 1
    Cs = _grid(pt)
    est = estimate_trace_sglang(pt, Cs, samples=4)
    assert np.abs(est.h - _radix(pt, Cs)).max() < 2e-3
    assert estimate_trace_sglang(pt, Cs, samples=4, background="marginal").h.min() >= 0.0
    with pytest.raises(AgenticError, match="background"):
        estimate_trace_sglang(pt, Cs, background="poisson")


@pytest.mark.parametrize(
    "kw",
    [{"samples": 6}, {"samples": 4, "background": "marginal"}, {"form": "replay"}, {"samples": 4, "lam0": 0.05}],
)
def test_curve_kernel_equals_the_per_pool_recursion_bit_for_bit(kw):
    """The all-pools compiled pass (one per draw, with the pool-free lookups and the reuse above the largest
    node end) gives the same sums as the per-pool recursion: pools unsorted, repeated, below the largest request
    and far above every node end (where the shortcut applies)."""
    pt = read_weka(WEKA3, arrival="uniform", span=600, seed=3)
    need = pt.prompt_tokens + np.maximum(pt.output_tokens, 1) - 1
    grid = np.unique(np.geomspace(need.max() // 2, need.sum() // 8, 9).astype(np.int64))[::-1]
    Cs = np.concatenate([grid, [int(need.max()) - 1, int(need.sum()) * 3, int(need.sum()) * 3]])
    new = estimate_trace_sglang(pt, Cs, **kw).h
    ref = estimate_trace_sglang(pt, Cs, curve_kernel=False, **kw).h
    np.testing.assert_array_equal(new, ref)
    assert new[-1] == new[-2] and len(np.unique(new)) > 3
