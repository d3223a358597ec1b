"""ShareGPT reading, recovery, normalization, sampling, the cached trace builder and Fig. 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvhit.workload.blocks import block_accounting
from kvhit.workload.cache import load_tokenized, resolve_cache_dir
from kvhit.workload.dists import Exponential
from kvhit.workload.sharegpt import (
    SKIP_REASONS,
    ShareGPTFormatError,
    load_sharegpt,
    sample_indices,
)
from kvhit.workload.sharegpt_trace import build_sharegpt_trace
from kvhit.workload.tokenize import QWEN3_TEMPLATE, ByteTokenizer
from kvhit.workload.trace import Trace

DATA = Path(__file__).parent / "data"


def test_recovers_complete_records_of_truncated_json():
    convs, rep = load_sharegpt(DATA / "sharegpt_truncated.json")
    assert rep.truncated and rep.format == "json"
    assert rep.n_records == 3 and rep.n_kept == 3 and rep.n_skipped == 0
    assert [c.id for c in convs] == ["a_0", "b_0", "c_0"]
    # roles normalized: chatgpt / bard / bing → assistant; system kept; escapes and "]" inside strings survive
    assert convs[1].system == "You are terse." and convs[1].turns == (("2+2?", "4"),)
    assert convs[2].turns[0] == (
        'Write "quoted" text with a ] bracket and a \\ backslash',
        'Sure: "quoted" ] \\',
    )
    # the trailing unanswered user message is dropped and counted
    assert convs[2].M == 2 and rep.trailing_user_dropped == 1
    assert rep.turns_total == 2 + 1 + 2


@pytest.mark.parametrize("tail,n", [("", 0), ("\n", 0), (' {"id": "x", "conv', 1), (" {}, ", 2), (" {}", 2)])
def test_truncation_points(tmp_path, tail, n):
    body = '[ {"id": "r0", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},'
    if n == 2:
        body += ' {"id": "r1", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}'
        body += "," if tail.strip().endswith(",") else ""
        tail = ""
    f = tmp_path / "t.json"
    f.write_text(body + tail)
    convs, rep = load_sharegpt(f)
    assert rep.truncated
    assert rep.n_kept == max(1, n)


def test_complete_json_is_not_truncated_and_corruption_is_an_error(tmp_path):
    f = tmp_path / "ok.json"
    f.write_text(json.dumps([{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}]))
    convs, rep = load_sharegpt(f)
    assert not rep.truncated and rep.n_kept == 1 and convs[0].id == "0"
    bad = tmp_path / "bad.json"
    bad.write_text('[{"id": 1}, {"id": 2,, "x": 3}, {"id": 4}]')
    with pytest.raises(ShareGPTFormatError, match=r"bad.json: record 1: invalid JSON"):
        load_sharegpt(bad)
    with pytest.raises(ShareGPTFormatError, match="no such file"):
        load_sharegpt(tmp_path / "missing.json")


def test_malformed_records_counted_by_reason():
    convs, rep = load_sharegpt(DATA / "sharegpt_malformed.json")
    assert [c.id for c in convs] == ["ok", "ok2"]
    assert rep.skipped == {
        "not_an_object": 1,
        "no_messages": 1,
        "empty_conversation": 1,
        "bad_message": 1,
        "missing_role": 1,
        "unknown_role": 1,
        "text_not_string": 2,
        "empty_text": 1,
        "system_not_first": 1,
        "starts_with_assistant": 1,
        "roles_not_alternating": 1,
        "no_complete_turn": 1,
    }
    assert set(rep.skipped) <= set(SKIP_REASONS)
    assert rep.n_records == 15 == rep.n_kept + rep.n_skipped
    assert rep.trailing_user_dropped == 1 and convs[1].system == "s" and convs[1].M == 1


def test_strict_names_file_record_id_and_field(tmp_path):
    with pytest.raises(ShareGPTFormatError) as e:
        load_sharegpt(DATA / "sharegpt_malformed.json", strict=True)
    msg = str(e.value)
    assert "sharegpt_malformed.json" in msg and "record 1" in msg and "not_an_object" in msg
    recs = json.loads((DATA / "sharegpt_malformed.json").read_text())
    k = next(i for i, rec in enumerate(recs) if isinstance(rec, dict) and rec.get("id") == "unknown")
    f = tmp_path / "two.json"
    f.write_text(json.dumps([recs[0], recs[k]]))
    with pytest.raises(ShareGPTFormatError, match=r"record 1 \(id 'unknown'\), field conversations\[1\]\.from"):
        load_sharegpt(f, strict=True)


def test_user_supplied_jsonl(tmp_path):
    convs, rep = load_sharegpt(DATA / "sharegpt_small.jsonl")
    assert rep.format == "jsonl" and not rep.truncated
    assert [c.id for c in convs] == ["j1", "j2", "j5"] and [c.M for c in convs] == [2, 1, 3]
    assert convs[1].turns == (("hi", "hello"),)  # role/content keys accepted
    assert rep.skipped == {"invalid_json": 1, "starts_with_assistant": 1}
    with pytest.raises(ShareGPTFormatError, match="line 3"):
        load_sharegpt(DATA / "sharegpt_small.jsonl", strict=True)
    # an unparsable last line without a newline is a truncation, not a malformed record
    cut = tmp_path / "cut.jsonl"
    lines = (DATA / "sharegpt_small.jsonl").read_text().splitlines()
    cut.write_text("\n".join([lines[0], lines[1], lines[4][:30]]))
    convs, rep = load_sharegpt(cut)
    assert rep.truncated and rep.truncated_at == 3 and rep.n_kept == 2 and rep.n_skipped == 0


def test_sampling_is_seeded_distinct_and_filtered():
    M = np.array([1, 2, 3, 1, 5, 2, 2, 1, 4, 2])
    a = sample_indices(M, 2, 3, 7)
    assert np.array_equal(a, sample_indices(M, 2, 3, 7))
    assert len(set(a.tolist())) == 5 and (M[a] >= 2).all()
    allidx = sample_indices(M, 0, 7, 0)
    assert sorted(allidx.tolist()) == np.flatnonzero(M >= 2).tolist()
    with pytest.raises(ValueError, match="only 7 have"):
        sample_indices(M, 3, 5, 0)


def _synthetic_jsonl(path: Path, n: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(n):
            m = int(rng.integers(1, 6))
            msgs = []
            for j in range(m):
                msgs.append({"from": "human", "value": f"question {i}.{j} " + "x" * int(rng.integers(1, 300))})
                msgs.append({"from": "gpt", "value": f"answer {i}.{j} " + "y" * int(rng.integers(1, 600))})
            f.write(json.dumps({"id": f"s{i}", "conversations": msgs}) + "\n")
    return path


def test_build_trace_cache_and_ids(tmp_path):
    src = _synthetic_jsonl(tmp_path / "syn.jsonl", 60)
    cache = tmp_path / "cache"
    calls = []
    tr, rep = build_sharegpt_trace(
        n_warm=5,
        n_meas=20,
        seed=3,
        lam0=2.0,
        interarrival=Exponential(10.0),
        block_size=16,
        path=src,
        keep_token_ids=True,
        cache_dir=cache,
        progress=lambda d, t: calls.append((d, t)),
        tokenizer=ByteTokenizer(),
    )
    assert not rep.cache["hit"] and calls and calls[-1][0] == calls[-1][1] == rep.n_conversations
    assert tr.n_conversations == 25 and tr.meta["n_warm"] == 5 and tr.meta["n_meas"] == 20
    assert tr.meta["block_size"] == 16 and "paper-tail" in tr.meta["block_rule"]
    assert tr.meta["counts"]["n_kept"] == 60 and len(tr.meta["conversation_ids"]) == 25
    assert (tr["M"] >= 2).all()
    # rows agree with an independent recomputation from the source texts
    convs = {c.id: c for c in load_sharegpt(src)[0]}
    tok = ByteTokenizer()
    order = np.lexsort((tr["turn"], tr["conv"]))
    for ci, cid in enumerate(tr.meta["conversation_ids"]):
        c = convs[cid]
        rows = order[tr["conv"][order] == ci]
        assert tr["M"][rows[0]] == c.M
        for j, row in enumerate(rows, start=1):
            full = tok.encode(QWEN3_TEMPLATE.render_history(None, c.turns, j))
            assert tr["cum_tokens"][row] == len(full)
            # new_tokens concatenated over 1..j is the turn-j prompt
            ids = np.concatenate([tr.lists["new_tokens"][r] for r in rows[:j]])
            assert ids.tolist() == full
            assert tr["R_full"][row] == len(full) // 16 and tr["R_phys"][row] == -(-len(full) // 16)
    ref = block_accounting(
        tr["M"][order][np.r_[True, np.diff(tr["conv"][order]) != 0]],
        tr["prompt_tokens"][order],
        tr["response_tokens"][order],
        16,
    )
    assert np.array_equal(ref["Z"], tr["Z"][order]) and np.array_equal(ref["R"], tr["R"][order])
    # the same call again hits the cache and gives the identical trace
    tr2, rep2 = build_sharegpt_trace(
        n_warm=5,
        n_meas=20,
        seed=3,
        lam0=2.0,
        interarrival=Exponential(10.0),
        block_size=16,
        path=src,
        keep_token_ids=True,
        cache_dir=cache,
        tokenizer=ByteTokenizer(),
    )
    assert rep2.cache["hit"] and rep2.cache["path"] == rep.cache["path"]
    for k in tr.cols:
        assert np.array_equal(tr[k], tr2[k]), k
    assert all(np.array_equal(a, b) for a, b in zip(tr.lists["new_tokens"], tr2.lists["new_tokens"], strict=True))
    # another block size reuses the token cache; Parquet round trip of the trace
    tr3, rep3 = build_sharegpt_trace(
        n_warm=5,
        n_meas=20,
        seed=3,
        block_size=128,
        path=src,
        cache_dir=cache,
        tokenizer=ByteTokenizer(),
        keep_token_ids=True,
    )
    assert rep3.cache["hit"] and tr3.meta["block_size"] == 128
    back = Trace.read(tr.write(tmp_path / "t.parquet"))
    assert np.array_equal(back["R"], tr["R"]) and back.meta["n_warm"] == 5


def test_cache_dir_env_and_corrupt_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVHIT_CACHE_DIR", str(tmp_path / "envcache"))
    assert resolve_cache_dir() == tmp_path / "envcache"
    assert resolve_cache_dir(tmp_path / "arg") == tmp_path / "arg"
    src = _synthetic_jsonl(tmp_path / "s.jsonl", 10)
    c1 = load_tokenized(src, tokenizer=ByteTokenizer())
    assert Path(c1.cache["path"]).parent.parent == tmp_path / "envcache" and not c1.cache["hit"]
    Path(c1.cache["path"]).write_bytes(b"garbage")
    c2 = load_tokenized(src, tokenizer=ByteTokenizer())
    assert not c2.cache["hit"] and np.array_equal(c1.prompt_tokens, c2.prompt_tokens)
    assert load_tokenized(src, tokenizer=ByteTokenizer()).cache["hit"]
    # editing the file changes its identity → a new cache entry
    with open(src, "a") as f:
        f.write(
            json.dumps(
                {
                    "id": "new",
                    "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
                }
            )
            + "\n"
        )
    c3 = load_tokenized(src, tokenizer=ByteTokenizer())
    assert not c3.cache["hit"] and c3.n_conversations == c1.n_conversations + 1
    assert not list((tmp_path / "envcache").rglob("*.tmp"))


def test_plot_fig2(tmp_path):
    from kvhit.plots.curves import fig2_data, plot_fig2

    src = _synthetic_jsonl(tmp_path / "syn.jsonl", 30)
    tr, _ = build_sharegpt_trace(
        n_warm=3,
        n_meas=10,
        seed=0,
        path=src,
        cache_dir=tmp_path / "c",
        tokenizer=ByteTokenizer(),
        block_size=32,
    )
    d = fig2_data(tr)
    assert d["n_conversations"] == 10 and d["n_turns"] == int(tr.select(tr["conv"] >= 3).conversations()["M"].sum())
    paths = plot_fig2(tr, tmp_path / "out" / "fig2")
    assert [p.suffix for p in paths] == [".png", ".svg"] and all(p.stat().st_size > 1000 for p in paths)


@pytest.mark.slow
def test_bundled_dataset_end_to_end(tmp_path):
    """The bundled ShareGPT JSON: truncated, all complete records recovered, the App. E sample drawn."""
    tr, rep = build_sharegpt_trace(cache_dir=tmp_path)
    r = rep.read
    assert r["truncated"] and r["n_records"] == r["n_kept"] + r["n_skipped"] and r["n_records"] > 17000
    assert tr.n_conversations == 6000 and rep.boundary_merges == 0
    M = tr.select(tr["conv"] >= 1000).conversations()["M"]
    assert M.size == 5000 and 4.2 < M.mean() < 4.8
