"""SGLang's cache classes and eviction policies in kvhit's model: hand-worked cases, one per rule.

Each case is worked by hand (comments at ``CASES``) from SGLang 0.5.23's code (``evict_policy.py``,
``radix_cache.py``, ``unified_cache/unified_tree_core.py``). The same cases were replayed through SGLang's own
caches (``RadixCache``; ``UnifiedRadixCache`` with the Python and Rust tree cores) in the SGLang 0.5.23
environment — ``conformance/pinned_sglang.py`` prints the evicted token counts there, equal to the ones pinned
here. Capacity is in tokens, page size 1, requests run one at a time (admitted, decoded, finished).
"""

from __future__ import annotations

from kvhit.sim.engine import Request, replay
from kvhit.sim.sglang.engine import SglangEngine
from kvhit.sim.sglang.radix import TokenStreams, simulate_radix

#: name -> (capacity in tokens, [(prompt ids, output count)]); expected outcomes in the tests below
CASES = {
    # r0 caches X=[1,2,3,4]; r1 caches Y=[5,6]; r2 (r0 again) matches [1,2,3] (T - 1), which splits X into
    # U=[1,2,3] + X'=[4] (its prefill token is a duplicate, freed). FIFO, pool of 7 with 1 free, r3 needs 3: X' goes
    # (1 token) and U becomes a leaf. UnifiedRadixCache: U kept X's creation time (older than Y) -> U goes
    # (1 + 3 = 4 tokens). RadixCache: U was created at the split (newer than Y) -> Y goes (1 + 2 = 3 tokens).
    "split": (7, [([1, 2, 3, 4], 1), ([5, 6], 1), ([1, 2, 3, 4], 1), ([20, 21, 22], 1)]),
    # r0 caches A=[1,2]; r1 (an exact retry) splits it at T - 1 into U=[1] + A'=[2] and its insert walks both:
    # hit counts 2 each; r2 caches B=[5,6] (hit count 1, accessed last). Pool of 4 full; r3 needs 1 token.
    # LRU: A' (oldest access, 1 token). LFU: B (fewest hits, 2 tokens). SLRU (protected at 2 hits): B too.
    "hits": (4, [([1, 2], 1), ([1, 2], 1), ([5, 6], 1), ([8], 1)]),
    # r0 (prompt [1,2], 2 outputs) caches P=[1,2] at priority 1 (the prompt re-insert at release) and its
    # output leaf O=[o] at priority 0; r1 caches Q=[5,6] (priority 0, accessed last). Pool of 5 full; r2 needs 2.
    # O goes first under both (priority 0, oldest), then P becomes a leaf: LRU takes P (older than Q),
    # priority takes Q (priority 0 < 1).
    "priority": (5, [([1, 2], 2), ([5, 6], 1), ([8, 9], 1)]),
    # r0 caches A=[1..4] (depth 4); r1 extends it with A2=[5,6] (depth 6: A's high-water depth becomes 6);
    # r2 caches Z=[9,9] (depth 2, accessed last). Pool of 8 full; r3 needs 3 tokens. T-LRU, tail budget B: a
    # leaf is TEL-safe when its parent's depth >= max(high-water - B, 0). B = 0: none is safe -> LRU: A2 then A.
    # B = 2: A2 (4 >= 4) and Z (0 >= 0) are safe, A (0 >= 4) is not: A2 (older) then Z.
    "tlru": (8, [([1, 2, 3, 4], 1), ([1, 2, 3, 4, 5, 6], 1), ([9, 9], 1), ([7, 7, 7], 1)]),
}


def _requests(spec):
    out = []
    for rid, (prompt, n) in enumerate(spec):
        outs = tuple(10_000 + 100 * rid + i for i in range(n))
        out.append(Request(rid=rid, prompt_tokens=len(prompt), output_tokens=n, token_ids=tuple(prompt) + outs))
    return out


def _last(name, **kw):
    C, spec = CASES[name]
    e = SglangEngine(C, **kw)
    res = replay(e, _requests(spec))
    o = res.outcomes[-1]
    return [list(p) for p in o.evicted], o.evicted_units


def _streams(spec):
    """The same requests as token streams (one real-token run per id) for the compiled model."""
    toks = [r.token_ids for r in _requests(spec)]
    sym = [t for ts in toks for t in ts]
    off = [0]
    for ts in toks:
        off.append(off[-1] + len(ts))
    n = len(spec)
    return TokenStreams(
        sym, [0] * len(sym), [1] * len(sym), off, list(range(n)), [len(p) for p, _ in spec], [o for _, o in spec]
    )


def test_split_creation_time_unified_vs_radix():
    # UnifiedRadixCache keeps the split node's creation time on the new upper node; RadixCache stamps a new one
    assert _last("split", evict_policy="fifo") == ([[1, 2, 3, 4], [1, 2, 3]], 4)
    assert _last("split", evict_policy="fifo", cache="radix") == ([[1, 2, 3, 4], [5, 6]], 3)
    # the two classes agree on every policy that does not read the creation time
    for pol in ("lru", "mru", "lfu", "slru", "priority"):
        assert _last("split", evict_policy=pol) == _last("split", evict_policy=pol, cache="radix")


def test_hit_count_policies():
    assert _last("hits", evict_policy="lru") == ([[1, 2]], 1)
    assert _last("hits", evict_policy="lfu") == ([[5, 6]], 2)
    assert _last("hits", evict_policy="slru") == ([[5, 6]], 2)


def test_priority_keeps_finished_prompts_longer():
    o = 10_000  # r0's first output token
    assert _last("priority", evict_policy="lru") == ([[1, 2, o], [1, 2]], 3)
    assert _last("priority", evict_policy="priority") == ([[1, 2, o], [5, 6]], 3)


def test_tlru_tail_budget():
    assert _last("tlru", evict_policy="tlru") == ([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4]], 6)
    assert _last("tlru", evict_policy="tlru") == _last("tlru", evict_policy="lru")  # SGLang's default config
    assert _last("tlru", evict_policy="tlru", tlru_tail_budget=2) == ([[1, 2, 3, 4, 5, 6], [9, 9]], 4)


def test_compiled_model_agrees_on_the_hand_cases():
    for name, kw in [
        ("split", {"evict_policy": "fifo"}),
        ("split", {"evict_policy": "fifo", "cache": "radix"}),
        ("hits", {"evict_policy": "lfu"}),
        ("hits", {"evict_policy": "slru"}),
        ("priority", {"evict_policy": "priority"}),
        ("tlru", {"evict_policy": "tlru", "tlru_tail_budget": 2}),
    ]:
        C, spec = CASES[name]
        got = simulate_radix(_streams(spec), C, **kw)
        assert int(got.evicted_tokens[-1]) == _last(name, **kw)[1], (name, kw)


def test_issue26_admission_example_is_not_served_by_sglang_either():
    # Page 16, pool 48, a 40-token prompt with 9 outputs (issue 26). SGLang 0.5.23's scheduler, not its allocator
    # alone, decides: Scheduler.init_req_max_new_tokens clips max_new_tokens to min(9, max_req_len − T − 1) with
    # max_req_len = pool − 1 = 47 -> 6, then allocator.max_new_tokens_for_memory to
    # max(0, min(6, 48 − ceil16(40) − 16 − 1)) = 0; PrefillAdder.add_one_req admits when
    # extend + max_new + page_size < available + evictable: 40 + 0 + 16 = 56 < 48 fails, on an idle pool too, so the
    # request is never admitted (conformance/pinned_sglang.py computes both from SGLang's own classes). kvhit
    # rejects it: ceil16(40 + 9 − 1) + 16 = 64 > 48.
    e = SglangEngine(48, page_size=16)
    r = Request(rid=0, prompt_tokens=40, output_tokens=9, token_ids=tuple(range(48)))
    assert not e.fits(r)
    assert replay(e, [r]).rejected.tolist() == [True]
