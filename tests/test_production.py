"""Readers of production block-id traces (kvhit.workload.production) and their use by the block simulator."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.sim.runner import BlockRequests
from kvhit.sim.vllm.block import block_hit_ratio, simulate_block, token_hit_ratio
from kvhit.sim.vllm.curve import block_curve
from kvhit.workload.production import read_mooncake, read_production, read_weka
from kvhit.workload.production_trace import ProductionTraceError, chain_violation, rechain

DATA = Path(__file__).parent / "data" / "production"
MOON = DATA / "mooncake_small.jsonl"
W22, W26, W14 = DATA / "weka_0022.json", DATA / "weka_0026.json", DATA / "weka_0014_cut.json"
# the shared data sit beside the repository (../shared); never an absolute path
REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"


def _mooncake_lines(path):
    return [json.loads(s) for s in Path(path).read_text().splitlines() if s.strip()]


def _write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _weka_doc(requests, block_size=4, scope="local"):
    return {"id": "x", "block_size": block_size, "hash_id_scope": scope, "requests": requests}


def _wreq(t, T, ids, out=1, typ="n", model="m"):
    return {"t": t, "type": typ, "model": model, "in": T, "out": out, "hash_ids": ids}


def _write_json(path, doc):
    path.write_text(json.dumps(doc))
    return path


def _slow_ideal(tr):
    """Reference: walk the stream with a Python set; leading ids already seen, capped at (T-1)//b."""
    seen, hits = set(), []
    for r in range(tr.n_requests):
        ids = tr.hashes[tr.hash_offsets[r] : tr.hash_offsets[r + 1]].tolist()
        run = 0
        while run < len(ids) and ids[run] in seen:
            run += 1
        hits.append(min(run, (int(tr.prompt_tokens[r]) - 1) // tr.block_size))
        seen.update(ids)
    return np.array(hits, np.int64)


# ---------------------------------------------------------------------------------------------------
# Mooncake
# ---------------------------------------------------------------------------------------------------


def test_mooncake_fixture_matches_raw_lines():
    raw = _mooncake_lines(MOON)
    tr = read_mooncake(MOON)
    b = 512
    assert tr.n_requests == len(raw) == 53 and tr.block_size == b and tr.format == "mooncake"
    # the file is time-sorted: request r is line record[r]; compare every field with the raw line
    lines = MOON.read_text().splitlines()
    for r in range(tr.n_requests):
        d = json.loads(lines[int(tr.record[r]) - 1])
        assert tr.time[r] == d["timestamp"] / 1000
        assert tr.prompt_tokens[r] == d["input_length"] and tr.output_tokens[r] == d["output_length"]
        F = d["input_length"] // b
        assert len(d["hash_ids"]) == math.ceil(d["input_length"] / b)
        got = tr.hashes[tr.hash_offsets[r] : tr.hash_offsets[r + 1]]
        assert got.tolist() == d["hash_ids"][:F]
    assert np.all(np.diff(tr.time) >= 0)
    n_exact = sum(d["input_length"] % b == 0 for d in raw)
    assert n_exact == 1 and tr.n_partial_dropped == len(raw) - n_exact
    assert not tr.rechained and chain_violation(tr.hash_offsets, tr.hashes) == -1


def test_mooncake_sessions_prefix_subtree():
    tr = read_mooncake(MOON, shared_min_successors=3)
    raw = _mooncake_lines(MOON)
    # block 0 starts every request (shared system prefix); the session key is the second raw id
    assert all(d["hash_ids"][0] == 0 for d in raw)
    lines = MOON.read_text().splitlines()
    key = [json.loads(lines[int(x) - 1])["hash_ids"][1] for x in tr.record]
    # same key <=> same session
    for i in range(tr.n_requests):
        for j in range(tr.n_requests):
            assert (key[i] == key[j]) == (tr.session[i] == tr.session[j])
    # sessions numbered by first appearance; the 17 cut lines of one long conversation form one session
    assert tr.session[0] == 0 and np.all(np.diff(np.maximum.accumulate(tr.session)) <= 1)
    assert sorted(np.bincount(tr.session).tolist())[-4:] == [4, 4, 8, 17]
    assert tr.describe()["multi_turn_sessions"] == 4
    assert read_mooncake(MOON, sessions="none").session is None


def test_mooncake_sessions_lone_and_unsorted(tmp_path):
    # a request made only of shared blocks is its own session; unsorted timestamps are sorted (stable)
    recs = [
        {"timestamp": 2000, "input_length": 9, "output_length": 1, "hash_ids": [0, 1, 2]},
        {"timestamp": 1000, "input_length": 9, "output_length": 1, "hash_ids": [0, 3, 4]},
        {"timestamp": 1000, "input_length": 4, "output_length": 1, "hash_ids": [0]},
        {"timestamp": 3000, "input_length": 13, "output_length": 1, "hash_ids": [0, 1, 2, 5]},
    ]
    tr = read_mooncake(_write_jsonl(tmp_path / "m.jsonl", recs), block_size=4, shared_min_successors=2)
    assert tr.record.tolist() == [2, 3, 1, 4]
    assert tr.time.tolist() == [1.0, 1.0, 2.0, 3.0]
    assert tr.session.tolist() == [0, 1, 2, 2]
    assert tr.hashes.tolist() == [0, 3, 0, 0, 1, 0, 1, 2]
    assert tr.hash_offsets.tolist() == [0, 2, 3, 5, 8]


# ---------------------------------------------------------------------------------------------------
# hash-count rules
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "T", "ids", "expect"),
    [
        ("ceil", 9, [1, 2, 3], [1, 2]),  # partial last block dropped
        ("ceil", 8, [1, 2], [1, 2]),  # multiple of b: ceil == floor, nothing dropped
        ("ceil", 3, [7], []),  # shorter than a block: no hashable block
        ("floor", 9, [1, 2], [1, 2]),
        ("floor", 3, [], []),
        ("auto", 9, [1, 2, 3], [1, 2]),
        ("auto", 9, [1, 2], [1, 2]),
        ("ceil", 9, [1, 2], None),
        ("floor", 9, [1, 2, 3], None),
        ("auto", 9, [1], None),
        ("auto", 9, [1, 2, 3, 4], None),
    ],
)
def test_hash_count_rules(tmp_path, rule, T, ids, expect):
    recs = [{"timestamp": 0, "input_length": T, "output_length": 0, "hash_ids": ids}]
    p = _write_jsonl(tmp_path / "m.jsonl", recs)
    if expect is None:
        with pytest.raises(ProductionTraceError, match=r"m\.jsonl: line 1: field 'hash_ids': .* ids for"):
            read_mooncake(p, block_size=4, hash_count=rule)
        tr = read_mooncake(p, block_size=4, hash_count=rule, strict=False)
        assert tr.n_requests == 0 and len(tr.skipped) == 1 and tr.skipped[0][1] == "line 1"
    else:
        tr = read_mooncake(p, block_size=4, hash_count=rule)
        assert tr.hashes.tolist() == expect
        assert tr.n_partial_dropped == int(len(ids) > T // 4)
        # the simulator accepts the stream (its own count check)
        rq = tr.to_block_requests()
        simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=8, block_size=4)


def test_weka_hash_count_ceil_option(tmp_path):
    p = _write_json(tmp_path / "w.json", _weka_doc([_wreq(0, 9, [1, 2, 3])]))
    with pytest.raises(ProductionTraceError, match=r"w\.json: requests\[0\]: field 'hash_ids': 3 ids"):
        read_weka(p)
    assert read_weka(p, hash_count="ceil").hashes.tolist() == [1, 2]


# ---------------------------------------------------------------------------------------------------
# WEKA
# ---------------------------------------------------------------------------------------------------


def test_weka_namespacing_across_files():
    a, b = read_weka(W22), read_weka(W26)
    both = read_weka([W22, W26])
    ra = json.loads(W22.read_text())["requests"]
    rb = json.loads(W26.read_text())["requests"]
    assert ra[0]["hash_ids"][0] == rb[0]["hash_ids"][0] == 1  # the raw ids collide
    ia = set(both.hashes[np.repeat(both.session == 0, both.full_blocks)].tolist())
    ib = set(both.hashes[np.repeat(both.session == 1, both.full_blocks)].tolist())
    assert not ia & ib
    da, db, dd = a.describe(), b.describe(), both.describe()
    assert dd["distinct_blocks"] == da["distinct_blocks"] + db["distinct_blocks"]
    assert dd["reused_block_accesses"] == da["reused_block_accesses"] + db["reused_block_accesses"]
    assert dd["sessions"] == 2 and both.session_source == "file"
    # low 32 bits are the raw ids
    assert (a.hashes & 0xFFFFFFFF).tolist() == a.hashes.tolist()
    assert np.array_equal(both.hashes[np.repeat(both.session == 1, both.full_blocks)] & 0xFFFFFFFF, b.hashes)


def test_weka_identical_files_never_share(tmp_path):
    doc = _weka_doc([_wreq(0, 9, [1, 2]), _wreq(5, 13, [1, 2, 3])])
    p1, p2 = _write_json(tmp_path / "a.json", doc), _write_json(tmp_path / "b.json", doc)
    tr = read_weka([p1, p2], starts=[0.0, 1.0])
    assert tr.session.tolist() == [0, 1, 0, 1]
    rq = tr.to_block_requests()
    res = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=64, block_size=4)
    assert res.hit_blocks.tolist() == [0, 0, 2, 2]  # within-conversation hits only
    assert tr.hashes.tolist() == [1, 2, 2**32 + 1, 2**32 + 2, 1, 2, 3, 2**32 + 1, 2**32 + 2, 2**32 + 3]
    # hash_id_scope "global": ids are shared across files
    doc["hash_id_scope"] = "global"
    g = read_weka([_write_json(tmp_path / "c.json", doc), _write_json(tmp_path / "d.json", doc)], starts=[0, 1])
    rq = g.to_block_requests()
    res = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=64, block_size=4)
    assert res.hit_blocks.tolist() == [0, 2, 2, 3]


def test_weka_subagents_times_and_tags():
    raw = json.loads(W14.read_text())["requests"]
    marker = raw[4]
    assert marker["type"] == "subagent"
    tr = read_weka(W14)
    assert tr.n_requests == 8 and tr.block_size == 64
    sub = tr.agent == 1
    assert sub.sum() == 2
    assert np.allclose(np.sort(tr.time[sub]), [marker["t"] + s["t"] for s in marker["requests"]])
    assert tr.record[sub].tolist() == [4, 4] and tr.sub_record[sub].tolist() == [0, 1]
    assert tr.where(int(np.flatnonzero(sub)[1])).endswith("weka_0014_cut.json: requests[4].requests[1]")
    assert np.all(np.diff(tr.time) >= 0)
    # the second sub-agent request (961.349 + 4) comes after the parent request at 965.0
    assert tr.agent.tolist() == [0, 0, 0, 0, 1, 0, 1, 0]
    assert tr.models[tr.model[sub][0]].startswith("claude-haiku")
    no = read_weka(W14, subagents=False)
    assert no.n_requests == 6 and np.all(no.agent == 0)
    # sub-agent ids are in the parent's namespace, chained, not shared with the parent's blocks
    assert chain_violation(tr.hash_offsets, tr.hashes) == -1 and not tr.rechained


def test_weka_arrival_models():
    files = [W22, W26, W14]
    last = [json.loads(f.read_text())["requests"][-1]["t"] for f in files]
    seq = read_weka(files, gap=10.0)
    assert seq.meta["starts"] == pytest.approx([0.0, last[0] + 10, last[0] + last[1] + 20])
    p1 = read_weka(files, arrival="poisson", rate=0.01, seed=3)
    p2 = read_weka(files, arrival="poisson", rate=0.01, seed=3)
    assert p1.meta["starts"] == p2.meta["starts"] and p1.meta["starts"][0] == 0.0
    gaps = np.diff(p1.meta["starts"])
    assert np.allclose(gaps, np.random.default_rng(3).exponential(100.0, 2))
    u = read_weka(files, arrival="uniform", span=3600, seed=0)
    assert np.allclose(u.meta["starts"], np.random.default_rng(0).uniform(0, 3600, 3))
    s = read_weka(files, starts=[5.0, 0.0, 7.0])
    for k, f in enumerate(files):
        first = json.loads(f.read_text())["requests"][0]["t"]
        assert s.time[s.session == k].min() == pytest.approx([5.0, 0.0, 7.0][k] + first)
    assert np.all(np.diff(s.time) >= 0)
    # same requests and per-conversation id streams whatever the arrival model
    assert sorted(s.prompt_tokens.tolist()) == sorted(seq.prompt_tokens.tolist())
    assert read_weka(DATA, max_files=2).files == tuple(str(DATA / n) for n in ("weka_0014_cut.json", "weka_0022.json"))
    with pytest.raises(ProductionTraceError, match="rate"):
        read_weka(files, arrival="poisson")
    with pytest.raises(ProductionTraceError, match="span"):
        read_weka(files, arrival="uniform")
    with pytest.raises(ProductionTraceError, match="starts"):
        read_weka(files, starts=[0.0, 1.0])
    with pytest.raises(ProductionTraceError, match="arrival"):
        read_weka(files, arrival="bursty")


# ---------------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------------


def test_malformed_fixtures():
    with pytest.raises(ProductionTraceError, match=r"mooncake_malformed\.jsonl: line 3: field 'hash_ids'"):
        read_mooncake(DATA / "mooncake_malformed.jsonl")
    tr = read_mooncake(DATA / "mooncake_malformed.jsonl", strict=False)
    assert tr.n_requests == 4 and [s[1] for s in tr.skipped] == ["line 3", "line 5"]
    assert "invalid JSON" in tr.skipped[1][2]
    assert tr.describe()["n_skipped"] == 2
    with pytest.raises(ProductionTraceError, match=r"weka_malformed\.json: requests\[1\]: field 'in'"):
        read_weka(DATA / "weka_malformed.json")
    w = read_weka(DATA / "weka_malformed.json", strict=False)
    assert w.n_requests == 2 and w.skipped[0][1] == "requests[1]"


GOOD = {"timestamp": 0, "input_length": 9, "output_length": 1, "hash_ids": [1, 2, 3]}


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"timestamp": -1}, "timestamp"),
        ({"timestamp": "0"}, "timestamp"),
        ({"timestamp": float("nan")}, "timestamp"),
        ({"input_length": 0}, "input_length"),
        ({"input_length": 9.0}, "input_length"),
        ({"input_length": True}, "input_length"),
        ({"output_length": -2}, "output_length"),
        ({"hash_ids": [1, 2.0, 3]}, "hash_ids"),
        ({"hash_ids": [1, True, 3]}, "hash_ids"),
        ({"hash_ids": [1, None, 3]}, "hash_ids"),
        ({"hash_ids": "1,2,3"}, "hash_ids"),
        ({"hash_ids": [1, -2, 3]}, "hash_ids"),
        ({"hash_ids": [1, 2**64, 3]}, "hash_ids"),
        ({"hash_ids": None}, "hash_ids"),
    ],
)
def test_mooncake_field_errors(tmp_path, patch, field):
    bad = dict(GOOD, **patch)
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(ProductionTraceError, match=rf"m\.jsonl: line 3: field '{field}'"):
        read_mooncake(p, block_size=4)


def test_mooncake_structure_errors(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps(GOOD) + "\n[1, 2]\n")
    with pytest.raises(ProductionTraceError, match=r"line 2: expected a JSON object"):
        read_mooncake(p, block_size=4)
    d = dict(GOOD)
    del d["output_length"]
    p.write_text(json.dumps(d) + "\n")
    with pytest.raises(ProductionTraceError, match=r"line 1: field 'output_length': missing"):
        read_mooncake(p, block_size=4)
    with pytest.raises(ProductionTraceError, match="cannot open"):
        read_mooncake(tmp_path / "nope.jsonl")
    with pytest.raises(ProductionTraceError, match="hash_count"):
        read_mooncake(p, hash_count="round")
    with pytest.raises(ProductionTraceError, match="block_size"):
        read_mooncake(p, block_size=0)
    with pytest.raises(ProductionTraceError, match="chain"):
        read_mooncake(MOON, chain="maybe")


def test_weka_errors(tmp_path):
    good = _wreq(0, 9, [1, 2])
    cases = [
        (_weka_doc([good, dict(good, type="x")]), r"requests\[1\]: field 'type'"),
        (_weka_doc([good, dict(good, t=-1)]), r"requests\[1\]: field 't'"),
        (_weka_doc([good, dict(good, out=None)]), r"requests\[1\]: field 'out'"),
        (
            _weka_doc([good, {k: v for k, v in good.items() if k != "hash_ids"}]),
            r"requests\[1\]: field 'hash_ids'",
        ),
        (_weka_doc([good, dict(good, hash_ids=[1, 2**32])]), r"requests\[1\]: field 'hash_ids': local ids"),
        (
            _weka_doc([good, {"t": 1, "type": "subagent", "requests": [good, dict(good, **{"in": 0})]}]),
            r"requests\[1\]\.requests\[1\]: field 'in'",
        ),
        (_weka_doc([good], block_size=0), r"field 'block_size'"),
        (_weka_doc([good], scope="weird"), r"field 'hash_id_scope'"),
        ({"block_size": 4, "hash_id_scope": "local", "requests": {}}, r"field 'requests'"),
        ([good], r"expected a JSON object"),
    ]
    for i, (doc, pat) in enumerate(cases):
        p = _write_json(tmp_path / f"w{i}.json", doc)
        with pytest.raises(ProductionTraceError, match=rf"w{i}\.json: .*{pat}"):
            read_weka(p)
    p = tmp_path / "broken.json"
    p.write_text('{"block_size": 4, "requests": [')
    with pytest.raises(ProductionTraceError, match=r"broken\.json: invalid JSON"):
        read_weka(p)
    a = _write_json(tmp_path / "a.json", _weka_doc([good]))
    b = _write_json(tmp_path / "b.json", _weka_doc([_wreq(0, 9, [1])], block_size=8))
    with pytest.raises(ProductionTraceError, match=r"b\.json: field 'block_size': 8 differs from 4"):
        read_weka([a, b])
    with pytest.raises(ProductionTraceError, match="no \\*.json"):
        read_weka(_mkdir(tmp_path / "empty"))


def _mkdir(p):
    p.mkdir()
    return p


# ---------------------------------------------------------------------------------------------------
# chain property
# ---------------------------------------------------------------------------------------------------


def _slow_chain_violation(off, hs):
    first = {}
    for r in range(len(off) - 1):
        for j in range(off[r], off[r + 1]):
            par = None if j == off[r] else hs[j - 1]
            if first.setdefault(hs[j], par) != par:
                return r
    return -1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), max_size=5), max_size=8))
def test_chain_violation_and_rechain(reqs):
    off = np.zeros(len(reqs) + 1, np.int64)
    np.cumsum([len(r) for r in reqs], out=off[1:])
    hs = np.array([x for r in reqs for x in r], np.int64)
    assert chain_violation(off, hs) == _slow_chain_violation(off.tolist(), hs.tolist())
    rc = rechain(off, hs)
    assert chain_violation(off, rc) == -1
    # equal id prefixes <=> equal re-chained ids
    pref = [tuple(r[: i + 1]) for r in reqs for i in range(len(r))]
    for i in range(len(pref)):
        for j in range(len(pref)):
            assert (pref[i] == pref[j]) == (rc[i] == rc[j])


def test_non_chained_input_is_rechained(tmp_path):
    # id 2 follows 1 in line 1 but follows 5 in line 3: not a chained stream
    recs = [
        {"timestamp": 0, "input_length": 8, "output_length": 0, "hash_ids": [1, 2]},
        {"timestamp": 1, "input_length": 8, "output_length": 0, "hash_ids": [1, 2]},
        {"timestamp": 2, "input_length": 12, "output_length": 0, "hash_ids": [5, 2, 3]},
    ]
    p = _write_jsonl(tmp_path / "m.jsonl", recs)
    with pytest.raises(ProductionTraceError, match=r"m\.jsonl: line 3: field 'hash_ids': .*not a chained"):
        read_mooncake(p, block_size=4, chain="strict")
    keep = read_mooncake(p, block_size=4, chain="keep")
    assert keep.hashes.tolist() == [1, 2, 1, 2, 5, 2, 3] and not keep.rechained
    tr = read_mooncake(p, block_size=4)
    assert tr.rechained and chain_violation(tr.hash_offsets, tr.hashes) == -1
    h = tr.hashes
    assert h[0] == h[2] and h[1] == h[3] and h[5] != h[1]
    rq = tr.to_block_requests()
    res = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=64, block_size=4)
    assert res.hit_blocks.tolist() == [0, 1, 0]  # block "2" after "5" is new content: no hit
    assert read_mooncake(p, block_size=4, chain="rechain").rechained
    # re-chaining an already chained stream changes no hit
    m = read_mooncake(MOON)
    r2 = read_mooncake(MOON, chain="rechain")
    for N in (64, 512):
        a = simulate_block(m.prompt_tokens, m.hash_offsets, m.hashes, N=N, block_size=512)
        b = simulate_block(r2.prompt_tokens, r2.hash_offsets, r2.hashes, N=N, block_size=512)
        assert np.array_equal(a.hit_blocks, b.hit_blocks)


# ---------------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["mooncake", "weka"])
def test_describe_against_reference(which):
    tr = read_mooncake(MOON) if which == "mooncake" else read_weka([W22, W26, W14], arrival="uniform", span=600)
    d = tr.describe()
    b = tr.block_size
    hits = _slow_ideal(tr)
    assert d["requests"] == tr.n_requests
    assert d["full_blocks"] == sum(int(t) // b for t in tr.prompt_tokens)
    assert d["prompt_blocks"] == sum(-(-int(t) // b) for t in tr.prompt_tokens)
    allids = tr.hashes.tolist()
    assert d["distinct_blocks"] == len(set(allids))
    assert d["shared_blocks"] == sum(c > 1 for c in Counter(allids).values())
    assert d["ideal_id_reuse"] == pytest.approx(1 - len(set(allids)) / len(allids))
    assert d["ideal_token_hit_ratio"] == pytest.approx(hits.sum() * b / tr.prompt_tokens.sum())
    assert d["ideal_block_hit_ratio"] == pytest.approx(hits.sum() / d["prompt_blocks"])
    assert d["min_N"] == int(tr.prompt_blocks.max())
    assert d["prompt_tokens_mean"] == pytest.approx(tr.prompt_tokens.mean())
    # the simulator with a pool larger than every block ever hashed reproduces the ideal values
    rq = tr.to_block_requests()
    N = int(tr.hashes.shape[0] + tr.prompt_blocks.sum())
    res = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=N, block_size=b)
    assert res.evictions == 0 and np.array_equal(res.hit_blocks, hits)
    assert token_hit_ratio(res) == pytest.approx(d["ideal_token_hit_ratio"])
    assert block_hit_ratio(res) == pytest.approx(d["ideal_block_hit_ratio"])


# ---------------------------------------------------------------------------------------------------
# end to end with the simulator
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "vllm-0.23"])
@pytest.mark.parametrize("which", ["mooncake", "weka"])
def test_simulate_and_curve_agree(engine, which):
    if which == "mooncake":
        tr = read_mooncake(MOON)
        Ns = [16, 30, 64, 128, 256, 1024]
    else:
        tr = read_weka([W22, W26, W14], arrival="poisson", rate=1 / 30, seed=1)
        Ns = [1191, 1500, 2500, 4000, 8000]
    rq = tr.to_block_requests()
    assert isinstance(rq, BlockRequests) and rq.source == "production" and rq.response_tokens is None
    curve = block_curve(rq.prompt_tokens, rq.hash_offsets, rq.hashes, block_size=rq.block_size, Ns=Ns, engine=engine)
    prev = -1.0
    for k, N in enumerate(Ns):
        res = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=N, block_size=rq.block_size, engine=engine)
        assert curve["hit_blocks"][k] == res.hit_blocks[~res.rejected].sum()
        assert curve["token_hit_ratio"][k] == pytest.approx(token_hit_ratio(res))
        if N >= tr.describe()["min_N"]:  # below it rejected requests leave the measured set
            assert token_hit_ratio(res) <= tr.describe()["ideal_token_hit_ratio"] + 1e-12
            assert token_hit_ratio(res) >= prev - 1e-12  # LRU inclusion above min_N
            prev = token_hit_ratio(res)
    assert curve["exact"][-1]


def test_colocated_block_requests():
    tr = read_weka([W26, W14], starts=[0.0, 0.0])
    rq = tr.to_block_requests(colocated=True)
    b = tr.block_size
    L = tr.prompt_tokens + tr.output_tokens
    assert np.array_equal(np.diff(rq.hash_offsets), L // b)
    assert np.array_equal(rq.response_tokens, tr.output_tokens)
    for r in range(tr.n_requests):
        seg = rq.hashes[rq.hash_offsets[r] : rq.hash_offsets[r + 1]]
        F = int(tr.prompt_tokens[r]) // b
        assert np.array_equal(seg[:F], tr.hashes[tr.hash_offsets[r] : tr.hash_offsets[r + 1]])
        assert np.all(seg[F:] < 0)
    fresh = rq.hashes[rq.hashes < 0]
    assert np.unique(fresh).shape[0] == fresh.shape[0]
    res = simulate_block(
        rq.prompt_tokens,
        rq.hash_offsets,
        rq.hashes,
        N=4000,
        block_size=b,
        colocated=True,
        response_tokens=rq.response_tokens,
    )
    pd = simulate_block(tr.prompt_tokens, tr.hash_offsets, tr.hashes, N=4000, block_size=b)
    assert np.array_equal(res.hit_blocks, pd.hit_blocks)  # fresh response ids never hit, pool large enough
    c = block_curve(
        rq.prompt_tokens,
        rq.hash_offsets,
        rq.hashes,
        block_size=b,
        Ns=[4000],
        colocated=True,
        response_tokens=rq.response_tokens,
    )
    assert c["hit_blocks"][0] == res.hit_blocks.sum()


def test_select_subset():
    tr = read_weka(W14)
    main = tr.select(tr.agent == 0)
    assert main.n_requests == 6 and main.hashes.shape[0] == main.hash_offsets[-1]
    assert np.array_equal(main.hashes, read_weka(W14, subagents=False).hashes)
    with pytest.raises(ProductionTraceError, match="mask"):
        tr.select(np.ones(3, bool))


def test_read_production_dispatch(tmp_path):
    assert read_production(MOON).format == "mooncake"
    assert read_production(W22).format == "weka"
    assert read_production([W22, W26]).n_requests == 10
    assert read_production(DATA, max_files=1).files == (str(W14),)
    assert read_production(W26, format="weka", arrival="poisson", rate=1.0).format == "weka"
    p = tmp_path / "trace.txt"
    p.write_text(MOON.read_text())
    assert read_production(p).format == "mooncake"
    with pytest.raises(ProductionTraceError, match="format"):
        read_production(MOON, format="csv")


# ---------------------------------------------------------------------------------------------------
# the stored real traces (skipped where the data is absent)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_traces_read_and_match_source_statistics():
    if not REAL.exists():  # CI must have the data: a missing directory is a failure there, not a skip
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{REAL}: the real traces (../shared/data/traces) are missing in CI")
        pytest.skip(f"{REAL}: real traces not present")
    conv = read_mooncake(REAL / "mooncake_fast25" / "conversation_trace.jsonl")
    d = conv.describe()
    assert d["requests"] == 12031 and d["sessions"] == 7373 and d["multi_turn_sessions"] == 2259
    assert d["ideal_block_hit_ratio"] == pytest.approx(0.366, abs=5e-4) and not conv.rechained
    syn = read_mooncake(REAL / "mooncake_fast25" / "synthetic_trace.jsonl")
    assert syn.describe()["sessions"] == 2211 and not syn.rechained
    w = read_weka(REAL / "weka_kv_cache_tester" / "traces")
    dw = w.describe()
    assert dw["files"] == 34 and dw["n_skipped"] == 0 and not w.rechained and dw["block_size"] == 64
