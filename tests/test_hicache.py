"""SGLang HiCache (kvhit.sim.tiers.hicache): hand-worked cases, the slow reference, invariants."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.sim.engine import Request, replay
from kvhit.sim.sglang.engine import SglangEngine
from kvhit.sim.tiers import TierOutcome
from kvhit.sim.tiers.hicache import HiCacheTier, host_tokens, make_hicache
from kvhit.sim.tiers.hicache_reference import ReferenceHiCache

POLICIES = ["write_through", "write_through_selective", "write_back"]


def req(rid, prompt, output=1):
    out = [10_000 + rid * 100 + i for i in range(output)]
    return Request(rid=rid, prompt_tokens=len(prompt), output_tokens=output, token_ids=tuple(prompt) + tuple(out))


def hits(e, reqs):
    res = replay(e, reqs)
    return [(o.gpu_hit_tokens, o.cpu_hit_tokens) for o in res.outcomes]


A = list(range(30))
B = list(range(100, 130))


def test_host_pool_size_as_sglang_computes_it():
    assert host_tokens(1000, ratio=2.0) == 2001  # int(C * ratio) // p + 1 pages
    assert host_tokens(1000, ratio=2.0, page_size=16) == (2000 // 16 + 1) * 16
    assert host_tokens(1000, ratio=0.5, page_size=64) == 512
    assert host_tokens(10, size_gb=1.0, bytes_per_token=4096) == 1e9 // 4096 + 1  # --hicache-size overrides
    with pytest.raises(ValueError, match="ratio"):
        host_tokens(10, ratio=0)


def test_evicted_prompt_comes_back_from_host():
    # C = 40: A (30) is evicted by B (shortfall 20), then A + 1 token hits A on the host: 30 tokens loaded
    for pol in ("write_through", "write_back"):
        e = make_hicache(40, host_capacity=100, write_policy=pol, bytes_per_token=8)
        res = replay(e, [req(0, A), req(1, B), req(2, A + [7])])
        o = res.outcomes[2]
        assert isinstance(o, TierOutcome)
        assert (o.gpu_hit_tokens, o.cpu_hit_tokens, o.computed_tokens, o.load_bytes) == (0, 30, 1, 240)
        assert o.hit_tokens == 30


def test_selective_backs_up_only_on_the_second_insert():
    e = make_hicache(40, host_capacity=100, write_policy="write_through_selective")
    # A inserted once (hit count 1): not backed up, deleted on eviction -> no host hit
    assert hits(e, [req(0, A), req(1, B), req(2, A + [7])])[2] == (0, 0)
    e = make_hicache(40, host_capacity=100, write_policy="write_through_selective")
    # A + [5] walks A's node (count 2 -> backup of A); the match alone counts nothing
    out = hits(e, [req(0, A), req(1, A + [5]), req(2, B), req(3, A + [6])])
    assert out[1] == (30, 0) and out[3] == (0, 30)
    assert e.host.backups == 1


def test_write_through_and_write_back_differ_when_the_host_is_small():
    # H = 31 tokens. write_through copies A at insert; B's copy then needs A's host space, and A (evicted from
    # the device, an H-leaf) goes: r2 finds nothing. write_back copies only on device eviction: A is on the host
    # when r2 comes; its load evicts B, whose backup fails (A is locked) and B is dropped.
    wt = make_hicache(40, host_capacity=31, write_policy="write_through")
    assert hits(wt, [req(0, A), req(1, B), req(2, A + [7])])[2] == (0, 0)
    assert wt.host.host_evicted == [tuple(A), tuple(B)]  # r2's own 31-token copy then evicts B (demoted by r2)
    wb = make_hicache(40, host_capacity=31, write_policy="write_back")
    assert hits(wb, [req(0, A), req(1, B), req(2, A + [7])])[2] == (0, 30)
    assert wb.host.dropped == 1 and wb.host.backup_failures == 1


def test_load_back_threshold_is_ten_tokens():
    for seg, loaded in ((9, 0), (10, 10)):
        e = make_hicache(20, host_capacity=100)
        p = list(range(seg))
        other = list(range(100, 120))
        out = hits(e, [req(0, p), req(1, other), req(2, p + [5])])
        assert out[2] == (0, loaded)
    assert e.host.loads == 1


def test_skipped_load_refills_the_host_node():
    # a 9-token host segment is recomputed; the insert puts the request's KV into the evicted node
    e = make_hicache(20, host_capacity=100)
    p = list(range(9))
    hits(e, [req(0, p), req(1, list(range(100, 120))), req(2, p + [5])])
    assert e.host.loads_skipped == 1
    # r2's prefill evicted r1's 20 tokens to the host; p's node holds r2's KV again (and its host copy)
    assert e.host.host_only_tokens() == 20 and e.cached_tokens() == 10 and e.available == 10
    assert e.host.used == 9 + 20 + 1


def test_host_eviction_is_lru_over_evicted_leaves():
    # C = 12, H = 21: X, Y, Z (10 tokens each) evict each other from the device; the host holds two
    X, Y, Z = list(range(10)), list(range(20, 30)), list(range(40, 50))
    e = make_hicache(12, host_capacity=21)
    hits(e, [req(0, X), req(1, Y)])
    assert e.host.eviction_order() == [tuple(X)]
    hits(e, [req(2, Z)])  # Z's backup needs 10: X (oldest H-leaf) goes
    assert e.host.host_evicted == [tuple(X)] and e.host.used == 20
    out = hits(e, [req(3, Y + [1]), req(4, X + [1])])
    assert out == [(0, 10), (0, 0)]


def test_zero_host_tier_is_plain_sglang():
    reqs = [req(i, list(range(i % 3 * 7, i % 3 * 7 + 12 + i))) for i in range(12)]
    for pol in POLICIES:
        plain = replay(SglangEngine(30), reqs)
        tier = HiCacheTier(0, write_policy=pol)
        hi = replay(SglangEngine(30, host=tier), reqs)
        assert list(plain.hit_tokens) == list(hi.hit_tokens)
        assert [o.evicted for o in plain.outcomes] == [o.evicted for o in hi.outcomes]


def test_validation():
    with pytest.raises(ValueError, match="write_policy"):
        HiCacheTier(10, write_policy="write_around")
    with pytest.raises(ValueError, match="pages"):
        SglangEngine(16, page_size=4, host=HiCacheTier(10))
    with pytest.raises(ValueError, match="capacity"):
        HiCacheTier(-1)


@st.composite
def workloads(draw, pages=(1, 2, 4)):
    p = draw(st.sampled_from(list(pages)))
    C = p * draw(st.integers(4, 40))
    H = p * draw(st.integers(0, 80))
    nconv = draw(st.integers(1, 5))
    hist = {c: [] for c in range(nconv)}
    nxt = {c: 1000 * (c + 1) for c in range(nconv)}
    reqs = []
    for rid in range(draw(st.integers(1, 25))):
        c = draw(st.integers(0, nconv - 1))
        for _ in range(draw(st.integers(1, 14))):
            hist[c].append(nxt[c])
            nxt[c] += 1
        out = draw(st.integers(1, 2 * p + 1))
        outs = tuple(range(-out - rid * 50, -rid * 50))
        r = Request(rid, len(hist[c]), output_tokens=out, token_ids=tuple(hist[c]) + outs)
        reqs.append(r)
        hist[c] = list(r.token_ids)
        if len(hist[c]) > 2 * C:
            hist[c] = []
    # the threshold is SGLang's 10 or 1 (more loads on small cases)
    return p, C, H, reqs, draw(st.sampled_from(POLICIES)), draw(st.sampled_from([1, 10]))


def _nodes(e):
    stack = list(e.root.children.values())
    while stack:
        x = stack.pop()
        yield x
        stack.extend(x.children.values())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), held=st.booleans())
def test_invariants(w, held):
    p, C, H, reqs, pol, lbt = w
    e = SglangEngine(C, page_size=p, host=HiCacheTier(H, write_policy=pol, load_back_threshold=lbt))

    def check(kind, rid, out):
        assert 0 <= e.host.used <= H
        assert e.host.used == sum(len(x.key) for x in _nodes(e) if x.host)
        assert 0 <= e.available <= C and e.available + e.cached_tokens() <= C
        for x in _nodes(e):
            assert x.dev or x.host  # an evicted node in the tree has its host copy
            if not x.dev:
                assert all(not c.dev for c in x.children.values())  # device part is top-closed
            if x.host and pol != "write_back":
                assert x.parent is e.root or x.parent.host  # host ⊇ device: backed-up ancestors
        if kind == "submit":
            r = reqs[rid]
            assert out.gpu_hit_tokens % p == 0 and out.cpu_hit_tokens % p == 0
            assert out.cpu_hit_tokens == 0 or out.cpu_hit_tokens >= lbt
            assert out.hit_tokens == out.gpu_hit_tokens + out.cpu_hit_tokens <= (r.prompt_tokens - 1) // p * p
            assert out.computed_tokens == r.prompt_tokens - out.hit_tokens
        if kind == "finish" and not e.running:
            assert e.available + e.cached_tokens() == C
            assert e.evictable_size() == e.cached_tokens()

    if held:
        times = [float(i) for i in range(len(reqs))]
        hold = [float(1 + (i * 7) % 3) for i in range(len(reqs))]
        replay(e, reqs, times=times, hold=hold, on_event=check)
    else:
        replay(e, reqs, on_event=check)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(pages=(1,)))
def test_model_equals_reference(w):
    _, C, H, reqs, pol, lbt = w
    e = SglangEngine(C, host=HiCacheTier(H, write_policy=pol, load_back_threshold=lbt))
    ref = ReferenceHiCache(C, H, write_policy=pol, load_back_threshold=lbt)
    for r in reqs:
        if not e.fits(r):
            continue
        o = e.submit(r)
        e.finish(r.rid)
        want = ref.run(r.prompt_tokens, max(r.output_tokens, 1), r.token_ids)
        assert (o.gpu_hit_tokens, o.cpu_hit_tokens) == want
        assert e.host.used == ref.used
        assert e.available == ref.avail
