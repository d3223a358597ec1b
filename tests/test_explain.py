"""kvhit explain: every waterfall stage against a hand-computed example, the reusable prefix against brute force,
prefix breakers and the what-if by hand, the service/CLI refusals and JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvhit.explain import explain_trace, find_breakers, full_prompts, reusable_prefix, what_if
from kvhit.workload.chat import trace_from_prompts


def _trace(ids, parent, times, b=4):
    arrs = [np.asarray(x, np.int32) for x in ids]
    tr, perm = trace_from_prompts(arrs, np.asarray(times, float), np.asarray(parent), b, {})
    assert perm.tolist() == list(range(len(ids)))  # rows stay in arrival order in these examples
    return tr


A1 = list(range(1, 10))  # 9 tokens
B1 = [1, 2, 3, 4, 50, 51, 52, 53, 54, 55]  # shares the first 4 tokens with A1
A2 = A1 + [10, 11, 12, 13, 14, 15, 16]
B2 = B1 + [60, 61]


def test_reusable_engine_and_weightings_by_hand():
    # b = 4, N = 100 (nothing evicted). Reusable prefixes: A1 0, B1 4 (shares 1..4 with A1), A2 9, B2 10.
    # vLLM: B1 may hit ⌊(10-1)/4⌋ = 2 blocks, block 1 [1,2,3,4] is cached, block 2 is not → 1 block = 4 tokens;
    # A2: ⌊15/4⌋ = 3, A1 cached 2 full blocks → 8; B2: ⌊11/4⌋ = 2, both of B1's full blocks → 8.
    tr = _trace([A1, B1, A2, B2], [-1, -1, 0, 1], [0, 1, 2, 3])
    wf = explain_trace(tr, N=100)
    assert wf.hits["reusable"].tolist() == [0, 4, 9, 10]
    assert wf.hits["capacity"].tolist() == [0, 4, 9, 10]
    assert wf.hits["engine"].tolist() == [0, 4, 8, 8]
    T = 9 + 10 + 16 + 12
    blocks = 3 + 3 + 4 + 3
    assert wf.value("reusable", "token") == pytest.approx(23 / T)
    assert wf.value("reusable", "block") == pytest.approx(23 / 4 / blocks)
    assert wf.value("engine", "token") == pytest.approx(20 / T)
    assert wf.value("engine", "block") == pytest.approx(5 / blocks)
    assert wf.value("engine", "request") == pytest.approx(3 / 4)
    rows = wf.table()
    for w in ("token", "block", "request"):  # the steps add up to the final value exactly
        assert rows[0][w] + sum(r[f"{w}_step"] for r in rows[1:]) == pytest.approx(wf.final(w), abs=1e-15)
    assert rows[2]["token_step"] == pytest.approx(-3 / T)
    assert [r["configured"] for r in rows] == [True, True, True, False, False, False]


def test_capacity_stage_is_algorithm_1_by_hand():
    # N = 3: R = (3, 3, 5, 4) with the paper-tail rule. Algorithm 1: A1 (3) in; B1 (3) evicts A; A2 misses and,
    # loaded (5 > 3), cannot stay; B2's conversation was evicted by A2's admission attempt → miss too.
    # A missed conversation keeps the prefix its first prompt shared: A → 0, B → 4 (shared with A1).
    tr = _trace([A1, B1, A2, B2], [-1, -1, 0, 1], [0, 1, 2, 3])
    assert tr["R"].tolist() == [3, 3, 5, 4]
    wf = explain_trace(tr, N=3)
    assert wf.hits["capacity"].tolist() == [0, 4, 0, 4]
    # N = 6: A1 (3) + B1 (3) fit; A2 hits (R 5: evicts B), B2 misses → min(10, 4) = 4
    wf6 = explain_trace(tr, N=6)
    assert wf6.hits["capacity"].tolist() == [0, 4, 9, 4]


def test_capacity_reblocks_R_at_another_block_size():
    # the trace is blocked at b = 4; at b = 8 the paper-tail rule gives R = ⌈9/8⌉ = 2 (A1), ⌈10/8⌉ = 2 (B1),
    # A2: 2 + ⌈16/8⌉ − ⌊9/8⌋ = 3, B2: 2 + ⌈12/8⌉ − ⌊10/8⌋ = 3. With N = 4: A1, B1 fit (4); A2 hits, grows to 3 and
    # evicts B (LRU); B2 misses → keeps the 4 tokens B1 shared with A1.
    from kvhit.explain.waterfall import _history_blocks

    tr = _trace([A1, B1, A2, B2], [-1, -1, 0, 1], [0, 1, 2, 3])
    T = tr["cum_tokens"]
    assert _history_blocks(tr, T, 8).tolist() == [2, 2, 3, 3]
    assert _history_blocks(tr, T, 4).tolist() == tr["R"].tolist()
    wf = explain_trace(tr, N=4, block_size=8)
    assert wf.hits["capacity"].tolist() == [0, 4, 9, 4]


def test_concurrency_stage_by_hand():
    # b = 4, N = 3, arrivals 0, 1, 2, 3, holds T / 1 token/s.
    # Instantaneous: P (6 tokens: blocks 0, 1) frees → queue [1, 2, 0]; Q (q1 on block 1) → [2, 0, 1]; S (on 2)
    # → [0, 1, 2]; Q+1 hits q1 (⌊4/4⌋ = 1 block) → 4 tokens.
    # Held: P holds blocks 0, 1 until 6; Q takes block 2 until 5; S waits (no free block), Q+1 waits behind it
    # (FIFO); at 5 Q frees block 2, S takes it — evicting q1; Q+1 then misses → 0.
    P, Q, S = [101, 102, 103, 104, 105, 106], [201, 202, 203, 204], [1, 2, 3, 4]
    tr = _trace([P, Q, S, Q + [3500]], [-1, -1, -1, 1], [0, 1, 2, 3])
    wf = explain_trace(tr, N=3, prefill_tokens_per_s=1.0)
    assert wf.hits["engine"].tolist() == [0, 0, 0, 4]
    assert wf.hits["concurrency"].tolist() == [0, 0, 0, 0]
    rows = {r["stage"]: r for r in wf.table()}
    assert rows["concurrency"]["token_step"] == pytest.approx(-4 / (6 + 4 + 4 + 5))
    assert rows["concurrency"]["configured"]


def test_routing_stage_by_hand():
    # two replicas of 8 blocks, round-robin in arrival order A1 → 0, A2 → 1, B1 → 0, B2 → 1: both second turns
    # land where their history is not; one pool of 16 blocks hits ⌊11/4⌋ = 2 blocks = 8 tokens for each.
    a1, b1 = list(range(1, 10)), list(range(21, 30))
    tr = _trace([a1, a1 + [10, 11, 12], b1, b1 + [30, 31, 32]], [-1, 0, -1, 2], [0, 1, 2, 3])
    wf = explain_trace(tr, N=8, replicas=2, router="round-robin")
    assert wf.extra["N_total"] == 16
    assert wf.hits["engine"].tolist() == [0, 8, 0, 8]
    assert wf.hits["routing"].tolist() == [0, 0, 0, 0]
    causes = {c["cause"]: c for c in wf.causes()}
    assert causes["routed elsewhere"]["tokens"] == 16
    assert causes["routed elsewhere"]["requests"] == 2


def test_host_tier_stage_by_hand():
    # N = 3: C (9 tokens, 3 blocks) is evicted whole by D (3 blocks); C + 3 tokens misses on the GPU, and the
    # native CPU tier (16 blocks) holds C's 2 full blocks: 8 tokens loaded → won back.
    c1, d1 = list(range(1, 10)), list(range(21, 30))
    tr = _trace([c1, d1, c1 + [10, 11, 12]], [-1, -1, 0], [0, 1, 2])
    wf = explain_trace(tr, N=3, host_blocks=16)
    assert wf.hits["engine"].tolist() == [0, 0, 0]
    assert wf.hits["host tier"].tolist() == [0, 0, 8]
    rows = {r["stage"]: r for r in wf.table()}
    assert rows["host tier"]["token_step"] == pytest.approx(8 / 30)


def test_counts_only_trace_reuses_the_previous_turn():
    # without token ids the reusable prefix is the conversation's previous prompt (cum_tokens of turn j−1)
    from kvhit.workload.trace import Trace

    tr = _trace([A1, B1, A2, B2], [-1, -1, 0, 1], [0, 1, 2, 3])
    bare = Trace(dict(tr.cols), dict(tr.meta), {})
    wf = explain_trace(bare, N=100)
    assert wf.hits["reusable"].tolist() == [0, 0, 9, 10]
    assert wf.partner is None


def test_reusable_prefix_equals_brute_force():
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 3, size=int(rng.integers(1, 12))).astype(np.int32) for _ in range(300)]
    lcp, partner = reusable_prefix(prompts)
    for r, q in enumerate(prompts):
        best = 0
        for p in range(r):
            m = min(q.size, prompts[p].size)
            k = 0
            while k < m and q[k] == prompts[p][k]:
                k += 1
            best = max(best, k)
        assert lcp[r] == best
        if r and best:
            p = partner[r]
            assert 0 <= p < r and np.array_equal(prompts[p][:best], q[:best])


def test_breaker_and_what_if_by_hand():
    # two conversations whose prompts differ only in tokens 2..3 (a "timestamp") followed by 12 common tokens
    sys_a = [7, 7, 1, 1] + list(range(100, 112))
    sys_b = [7, 7, 2, 2] + list(range(100, 112))
    ids = [sys_a + [201], sys_b + [202]]
    tr = _trace(ids, [-1, -1], [0, 1])
    prompts = full_prompts(tr)
    lcp, partner = reusable_prefix(prompts)
    assert lcp.tolist() == [0, 2] and partner.tolist() == [-1, 0]
    brk, lost = find_breakers(prompts, lcp, partner, min_run=4)
    assert len(brk) == 1
    g = brk[0]
    assert (g.position, g.requests, g.tokens_lost) == (2, 1, 12)
    assert g.examples[0]["ids"] == [2, 2] and g.examples[0]["earlier_ids"] == [1, 1]
    assert lost.tolist() == [0, 12]
    # what-if: both prompts become [7, 7, 100..111, x, x, 20y]: the second hits ⌊(17-1)/4⌋ = 4 blocks? Its first
    # 14 tokens equal the first prompt's, so 3 full blocks (12 tokens) are shared: 0 → 12 hit tokens.
    out = what_if(tr, prompts, g, N=100, engine="vllm", block_size=4)
    assert out["token"] == (pytest.approx(0.0), pytest.approx(12 / 34))
    assert out["request"] == (0.0, 0.5)


def test_no_breaker_without_resync():
    ids = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 9, 9, 9, 9, 9, 9]]
    tr = _trace(ids, [-1, -1], [0, 1])
    prompts = full_prompts(tr)
    lcp, partner = reusable_prefix(prompts)
    brk, lost = find_breakers(prompts, lcp, partner, min_run=4)
    assert brk == [] and lost.tolist() == [0, 0]


def test_refusals():
    from kvhit.explain import ExplainError

    tr = _trace([A1, B1], [-1, -1], [0, 1])
    with pytest.raises(ExplainError, match="--engine"):
        explain_trace(tr, N=10, engine="sglang")
    with pytest.raises(ExplainError, match="--router"):
        explain_trace(tr, N=10, router="random")
    with pytest.raises(ExplainError, match="host tier behind a fleet"):
        explain_trace(tr, N=10, replicas=2, host_blocks=4)


def _cli(argv, capsys):
    import kvhit.cli.explain  # noqa: F401  (registers the commands)
    from kvhit.cli import main

    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_json_and_refusal(tmp_path, capsys):
    tr = _trace([A1, B1, A2, B2], [-1, -1, 0, 1], [0, 1, 2, 3])
    p = tmp_path / "t.parquet"
    tr.write(p)
    rc, out, _ = _cli(["explain", "--trace", str(p), "--N", "100", "--json"], capsys)
    assert rc == 0
    d = json.loads(out)
    assert [r["stage"] for r in d["waterfall"]][0] == "reusable"
    assert d["final"]["token"] == pytest.approx(20 / 47)
    rc, _, err = _cli(["explain", "--trace", str(p), "--N", "100", "--router", "random"], capsys)
    assert rc == 2 and "--router" in err and len(err.strip().splitlines()) == 1
    rc, _, err = _cli(["explain", "--trace", str(p), "--N", "100", "--model-dir", str(tmp_path)], capsys)
    assert rc == 2 and "tokenizer.json" in err


def test_cli_kv_gb_sizes_N_by_hand(tmp_path, capsys):
    # Qwen3-8B: 36 layers × 8 KV heads × 128 dims × 2 (K, V) × 2 bytes (bf16) = 147,456 bytes per token;
    # 16-token blocks: 2,359,296 bytes; 1 GiB = 1,073,741,824 bytes → N = ⌊455.1⌋ = 455
    tr = _trace([A1, B1, A2, B2], [-1, -1, 0, 1], [0, 1, 2, 3], b=16)
    p = tmp_path / "t.parquet"
    tr.write(p)
    rc, out, _ = _cli(["explain", "--trace", str(p), "--kv-gb", "1", "--json"], capsys)
    assert rc == 0
    d = json.loads(out)
    assert d["config"]["N"] == 455 and d["config"]["sizing"]["bytes_per_block"] == 2_359_296
    rc, _, err = _cli(["explain", "--trace", str(p), "--kv-gb", "1", "--N", "5"], capsys)
    assert rc == 2 and "--N and --kv-gb" in err
    rc, _, err = _cli(["explain", "--trace", str(p)], capsys)
    assert rc == 2 and "--N and --kv-gb" in err
