"""Per-request reuse (kvhit.workload.reuse) and trace statistics (kvhit.workload.stats) against slow references."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvhit.workload.production import read_mooncake, read_weka
from kvhit.workload.reuse import ReuseError, request_reuse
from kvhit.workload.stats import trace_stats
from kvhit.workload.trace import Trace

DATA = Path(__file__).parent / "data" / "production"
MOON = DATA / "mooncake_small.jsonl"
W22, W26, W14 = DATA / "weka_0022.json", DATA / "weka_0026.json", DATA / "weka_0014_cut.json"


def _doc(path, reqs, b=4):
    path.write_text(json.dumps({"id": "x", "block_size": b, "hash_id_scope": "local", "requests": reqs}))
    return path


def _req(t, T, ids):
    return {"t": t, "type": "n", "model": "m", "in": T, "out": 1, "hash_ids": ids}


def _slow(pt):
    """Reference walk in Python: last toucher of every id, previous request per (session, agent) stream."""
    last: dict[int, int] = {}
    sess_of: dict[int, set] = {}
    prev_of: dict[tuple, int] = {}
    out = []
    n = pt.n_requests
    ids_of = [pt.hashes[pt.hash_offsets[r] : pt.hash_offsets[r + 1]].tolist() for r in range(n)]
    for r in range(n):
        for x in ids_of[r]:
            sess_of.setdefault(x, set()).add(int(pt.session[r]))
    for r in range(n):
        ids = ids_of[r]
        run = 0
        while run < len(ids) and ids[run] in last:
            run += 1
        segs = []
        for i in range(run):
            s = last[ids[i]]
            if not segs or segs[-1][2] != s:
                segs.append([i, i + 1, s])
            else:
                segs[-1][1] = i + 1
        key = (int(pt.session[r]), int(pt.agent[r]))
        p = prev_of.get(key, -1)
        own = 0
        if p >= 0:
            q = ids_of[p]
            while own < min(len(ids), len(q)) and ids[own] == q[own]:
                own += 1
        sh = 0
        while sh < len(ids) and len(sess_of[ids[sh]]) >= 2:
            sh += 1
        out.append((run, [tuple(s) for s in segs], p, own, sh))
        prev_of[key] = r
        for x in ids:
            last[x] = r
    return out


@pytest.mark.parametrize("which", ["weka", "mooncake"])
def test_reuse_matches_slow_walk(which):
    pt = read_weka([W22, W26, W14], arrival="uniform", span=600, seed=1) if which == "weka" else read_mooncake(MOON)
    u = request_reuse(pt)
    ref = _slow(pt)
    for r, (run, segs, p, own, sh) in enumerate(ref):
        assert u.L_any[r] == run
        got = [
            (int(u.seg_start[k]), int(u.seg_end[k]), int(u.seg_src[k])) for k in range(u.seg_off[r], u.seg_off[r + 1])
        ]
        assert got == segs, r
        assert u.prev[r] == p and u.L_own[r] == own and u.L_shared[r] == sh
    assert u.ceiling() == pytest.approx(pt.describe()["ideal_token_hit_ratio"], abs=1e-12)


def test_grow_shrink_diverge_counts(tmp_path):
    # b = 4: request 2 grows (reuses all of 1), 3 shrinks to a prefix of 2, 4 diverges after one block
    reqs = [_req(0, 9, [1, 2]), _req(10, 17, [1, 2, 3, 4]), _req(30, 9, [1, 2]), _req(31, 13, [1, 7, 8])]
    pt = read_weka([_doc(tmp_path / "a.json", reqs)])
    s = trace_stats(pt)
    assert s.reuse["requests_with_previous"] == 3
    assert s.reuse["grow_rate"] == pytest.approx(1 / 3)
    assert s.reuse["shrink_rate"] == pytest.approx(1 / 3)
    assert s.reuse["diverge_rate"] == pytest.approx(1 / 3)
    assert s.gaps["count"] == 3 and s.gaps["max"] == 20.0
    assert s.summary["min_N"] == 5
    # infinite cache: hits 0, 2 (cap (17-1)//4 = 4, run 2), 2 (cap 2), 1 → tokens 4·5 / 48
    assert s.summary["ceiling_token_hit_ratio"] == pytest.approx(4 * 5 / 48)
    json.dumps(s.to_dict(), allow_nan=False)


def test_shared_prefix_and_concurrency(tmp_path):
    a = _doc(tmp_path / "a.json", [_req(0, 9, [1, 2]), _req(10, 13, [1, 2, 3])])
    b = _doc(tmp_path / "b.json", [_req(0, 9, [1, 5])])
    pt = read_weka([a, b], starts=[0.0, 5.0])
    # namespaced ids: no sharing across files
    assert trace_stats(pt).shared["shared_ids"] == 0
    s = trace_stats(pt, grid=11)
    # session 0 live on [0, 10] (2 blocks then 3), session 1 only at t = 5 (zero length)
    assert s.concurrency_active.max() == 2
    assert s.concurrency_live_blocks[0] == 2


def test_mooncake_shared_system_block():
    s = trace_stats(read_mooncake(MOON, sessions="none"))  # every request its own session
    assert s.shared["shared_ids"] >= 1
    assert s.shared["requests_with_shared_prefix"] > 0
    json.dumps(s.to_dict(), allow_nan=False)


def test_kvhit_trace_view():
    cols = {
        "conv": [0, 0, 1],
        "conv_arrival": [0.0, 0.0, 1.0],
        "turn": [1, 2, 1],
        "time": [0.0, 2.0, 1.0],
        "M": [2, 2, 1],
        "Z": [2, 2, 3],
        "R": [2, 4, 3],
        "cum_tokens": [7, 15, 11],
    }
    tr = Trace.from_columns(cols, meta={"block_size": 4})
    u = request_reuse(tr)
    assert u.time.tolist() == [0.0, 1.0, 2.0]
    assert u.full_blocks.tolist() == [1, 2, 3]
    assert u.L_own.tolist() == [0, 0, 1] and u.L_any.tolist() == [0, 0, 1]
    assert u.gap[2] == 2.0
    with pytest.raises(ReuseError, match="source"):
        request_reuse(object())
