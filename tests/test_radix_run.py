"""SGLang radix model on workloads: stream builders, no inclusion property (pinned counterexamples), curves, CIs."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.sim.sglang.radix import TokenStreams, simulate_radix
from kvhit.sim.sglang.run import paired_batch_ci, radix_curve, radix_feasibility, radix_rows
from kvhit.sim.sglang.streams import _real_streams, streams_from_production, streams_from_trace


def _ts(sym, ln, off, stream, T, n):
    return TokenStreams(sym, [0] * len(sym), ln, off, stream, T, n)


def test_no_inclusion_per_request_page_size_2():
    # found by hypothesis (every request fits both pools): request 4 hits 2 tokens at C = 10, none at C = 12
    ts = _ts([0, 1, 0] + [0] * 12, [1] * 15, [0, 3, 9, 10, 15], [1, 0, 0, 1, 0], [6, 2, 1, 3, 3], [0, 0, 0, 4, 0])
    assert simulate_radix(ts, 10, page_size=2).hit_tokens[4] == 2
    assert simulate_radix(ts, 12, page_size=2).hit_tokens[4] == 0


def test_no_inclusion_total_page_size_1():
    # found by hypothesis: the total hit tokens fall from 7 (C = 8) to 6 (C = 9)
    ts = _ts(
        [100, 0, 0, 100] + [0] * 9,
        [3, 1, 1, 2] + [1] * 9,
        [0, 4, 8, 13],
        [0, 0, 0, 0, 0, 1, 0, 0, 0, 1],
        [7, 1, 1, 1, 3, 2, 5, 1, 1, 3],
        [0] * 10,
    )
    assert radix_feasibility(ts, [8, 9]).feasible.all()
    assert simulate_radix(ts, 8).hit_tokens.sum() == 7
    assert simulate_radix(ts, 9).hit_tokens.sum() == 6
    c = radix_curve(ts, [8, 9])
    assert c["token_hit_ratio"][0] > c["token_hit_ratio"][1]


@st.composite
def real_token_streams(draw):
    C = draw(st.integers(1, 5))
    seqs = []
    for c in range(C):
        if c and draw(st.booleans()):
            base = seqs[draw(st.integers(0, c - 1))]
            s = list(base[: draw(st.integers(0, len(base)))])
        else:
            s = []
        s += draw(st.lists(st.integers(0, 3), min_size=1, max_size=12))
        seqs.append(np.asarray(s, np.int64))
    return seqs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seqs=real_token_streams(), data=st.data())
def test_real_token_compression_changes_no_decision(seqs, data):
    """Real ids up to one past the longest shared prefix, then one own run: same outcomes as token by token."""
    need = np.array([len(s) for s in seqs])
    sym, idx, ln, off = _real_streams(seqs, need, 1000)
    reqs = []
    for _ in range(data.draw(st.integers(1, 15))):
        c = data.draw(st.integers(0, len(seqs) - 1))
        T = data.draw(st.integers(1, len(seqs[c])))
        reqs.append((c, T, data.draw(st.integers(0, len(seqs[c]) - T + 1))))
    s, T, n = (np.array([r[k] for r in reqs]) for k in range(3))
    packed = TokenStreams(sym, idx, ln, off, s, T, n)
    flat = np.concatenate(seqs)
    full = TokenStreams(flat, np.zeros_like(flat), np.ones_like(flat), np.cumsum([0] + list(need)), s, T, n)
    assert packed.run_sym.shape[0] <= full.run_sym.shape[0]
    for C in (3, 7, 40):
        a = simulate_radix(packed, C)
        b = simulate_radix(full, C)
        np.testing.assert_array_equal(a.hit_tokens, b.hit_tokens)
        np.testing.assert_array_equal(a.evicted_tokens, b.evicted_tokens)


def test_streams_from_trace_counts_and_production():
    from kvhit.workload import WorkloadSpec, generate

    tr = generate(WorkloadSpec.scm(1.0, 0.8, x=3, y=2), 1, n_conversations=50)
    tr.meta["block_size"] = 16
    ts = streams_from_trace(tr)
    assert ts.n_requests == tr.n_turns and ts.source in ("counts", "blocks")
    r = simulate_radix(ts, 10**7)
    # infinite pool: a conversation's later turns hit their whole history (T_{j-1} + n_{j-1} − 1 at least)
    assert r.token_hit_ratio() > 0.5

    class PT:  # the ProductionTrace fields the builder reads
        block_size = 4
        n_requests = 3
        prompt_tokens = np.array([9, 9, 5])
        output_tokens = np.array([2, 0, 1])
        hash_offsets = np.array([0, 2, 4, 5])
        hashes = np.array([11, 12, 11, 12, 11])

    ts = streams_from_production(PT())
    r = simulate_radix(ts, 1000)
    # request 1 shares both full blocks of request 0 (8 tokens; the partial tail and outputs are never shared)
    assert r.hit_tokens.tolist() == [0, 8, 4]


def test_rows_feasibility_and_paired_ci():
    ts = _ts([1, 2], [40, 40], [0, 1, 2], [0, 1, 0, 1] * 10, [10, 12, 20, 22] * 10, [3] * 40)
    rows, feas, res = radix_rows(ts, [10, 40, 400])
    assert feas.C_min == 22 + 3 - 1
    assert rows[0]["h"] is None and rows[0]["refused_request_share"] > 0
    assert rows[2]["h"] is not None and rows[2]["h"] >= rows[1]["h"]
    a = res[400].hit_tokens.astype(float)
    d, half = paired_batch_ci(a, np.zeros_like(a), ts.prompt_tokens.astype(float), np.ones(40, bool), n_batches=4)
    assert abs(d - rows[2]["h"]) < 1e-12 and half >= 0
