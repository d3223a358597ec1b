"""SimpleCPUOffloadConnector lazy mode (kvhit.sim.tiers.simple_lazy): hand-worked cases, where write-back (lazy)
and write-through (eager) differ, and equality with an independent plain-Python reference on hypothesis workloads.

The reference below transcribes vLLM 0.33.0's code paths with plain lists (free queues as Python lists, blocks as
dicts, ``list.index`` for ``iter_blocks_after``) instead of the model's linked free queue and reference block pool.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvhit.sim.engines import Request, replay
from kvhit.sim.tiers import make_tiered
from kvhit.sim.tiers.simple_lazy import LinkedFreeQueue, SimpleLazyEngine, lazy_target_blocks
from test_tiers import _S, traces


def _req(rid, T, conv=0, b=4):
    return Request(rid=rid, prompt_tokens=T, block_hashes=tuple(conv * 1000 + i for i in range(T // b)))


def _out(res):
    return [(o.gpu_hit_tokens, o.cpu_hit_tokens, o.computed_tokens) for o in res.outcomes]


# ---- hand-worked cases ----------------------------------------------------------------------------------
def test_cursor_skips_blocks_freed_behind_it_and_lazy_rotates_the_gpu():
    """b=4, 4 GPU blocks b0..b3, 5 CPU blocks (4 usable), walk of 2·⌈8192/4⌉ (covers the whole queue).

    r0 (A, 8 tokens) takes b0, b1; the walk after allocation sees only unhashed b2, b3 -> cursor b3; the free
    gives [b2 b3 b1=A1 b0=A0]. r1 (B) pops b2, b3: the cursor's block is in use -> walk from the head, stores
    A1, A0 (cursor = b0); r1 frees [b3=B1 b2=B0], then the store completes and frees b1, b0 to the GPU TAIL:
    [b3 b2 b1 b0], the cursor on the tail. r2 (C) pops b3, b2 (evicts B, never stored: it lay before the
    cursor), the walk after b0 finds nothing. r3 (B, 9 tokens): no GPU hit, no CPU hit, 9 computed. Eager
    stores B at r1's finish and keeps it on the GPU (r2 evicts A): r3 is a GPU hit of 8 tokens there.
    """
    reqs = [_req(0, 8, 0), _req(1, 8, 1), _req(2, 8, 2), _req(3, 9, 1)]
    lazy = make_tiered("simple-lazy", gpu_blocks=4, host_capacity=5, block_size=4)
    assert _out(replay(lazy, reqs)) == [(0, 0, 8), (0, 0, 8), (0, 0, 8), (0, 0, 9)]
    # r3 (B0 b1, B1 b0, partial b2) frees b2 to the head, then b0, b1; its walk (cursor reset: b0 reused) stored
    # C0 (b3) from the head; the store completion puts b3 on the tail
    assert lazy.eviction_order() == [1001, 1000, 2000]
    assert lazy.host_eviction_order() == [1, 0, 2000]  # CPU: A1, A0 (r1's walk order), then C0
    eager = make_tiered("simple", gpu_blocks=4, host_capacity=4, block_size=4)
    assert _out(replay(eager, reqs))[3] == (8, 0, 1)


def test_load_step_walk_and_pinned_cpu_hit():
    """Short walk (max_num_batched_tokens=4: 2 blocks), 4 GPU and 4 usable CPU blocks, b=4.

    r0-r2 as above leave GPU [b1=A1 b0=A0 b2=C1 b3=C0] (cursor b0) and CPU [c2 c3 c0=A1 c1=A0]. r3 (D, 16 tokens)
    evicts all four; the walk has nothing to visit. r4 (A, 9 tokens): no GPU hit, CPU hit A0 A1 (cap 9-1 = 8):
    the LOAD step pins c1, c0, allocates only the 2 loaded blocks (pops b3=D3, b2=D2), walks [b0=D1 b1=D0] with
    2 free CPU blocks: stores both (c2, c3). The load completes first (CPU [c1=A0 c0=A1]), then the store
    (CPU [.. c2=D1 c3=D0]; GPU [b0 b1] again). The compute step pops b0 (evicts D1 although it was just
    stored), walks after the cursor b1: nothing. r4 frees its partial block to the head, then A1, A0.
    """
    reqs = [_req(0, 8, 0), _req(1, 8, 1), _req(2, 8, 2), _req(3, 16, 3), _req(4, 9, 0)]
    e = make_tiered("simple-lazy", gpu_blocks=4, host_capacity=5, block_size=4, max_num_batched_tokens=4)
    assert e.target_free == 2
    assert _out(replay(e, reqs)) == [(0, 0, 8), (0, 0, 8), (0, 0, 8), (0, 0, 16), (0, 8, 1)]
    assert e.eviction_order() == [3000, 1, 0]
    assert e.host_eviction_order() == [0, 1, 3001, 3000]


def test_write_back_stores_only_what_reaches_the_free_queue():
    """Eager writes a request's blocks through at its finish; lazy writes back only blocks it walks over in
    the free queue. One request (3 full blocks) on an idle GPU: eager has 3 CPU blocks after it, lazy none
    (its only walk ran while the request held its blocks); a second, unrelated request's walk stores them."""
    reqs = [_req(0, 12, 0), _req(1, 4, 1)]
    lazy = make_tiered("simple-lazy", gpu_blocks=8, host_capacity=9, block_size=4)
    eager = make_tiered("simple", gpu_blocks=8, host_capacity=8, block_size=4)
    replay(lazy, reqs[:1])
    replay(eager, reqs[:1])
    assert lazy.host.resident() == 0 and eager.host.resident() == 3
    replay(lazy, reqs[1:])
    assert lazy.host_eviction_order() == [2, 1, 0]  # walked head to tail: r0 freed tail-first (2, 1, 0)


def test_null_block_and_validation():
    e = SimpleLazyEngine(4, block_size=4, num_cpu_blocks=1)  # vLLM's CPU pool: 1 block = its null block
    assert e.cpu_usable == 0
    assert _out(replay(e, [_req(0, 8), _req(1, 8, 1), _req(2, 8)])) == [(0, 0, 8), (0, 0, 8), (8 - 4, 0, 4)]
    assert e.host.resident() == 0
    assert lazy_target_blocks(8192, 16) == 1024 and lazy_target_blocks(8193, 16) == 1026
    for kw in ({"num_cpu_blocks": 0}, {"num_cpu_blocks": 2, "max_num_batched_tokens": 0}):
        with pytest.raises(ValueError):
            SimpleLazyEngine(4, block_size=4, **{"num_cpu_blocks": 2, **kw})
    with pytest.raises(ValueError, match="colocated"):
        make_tiered("simple-lazy", gpu_blocks=4, host_capacity=2, block_size=4, colocated=True)


def test_linked_free_queue_matches_a_list():
    q = LinkedFreeQueue(range(5))
    ref = list(range(5))
    q.popitem(last=False), ref.pop(0)
    del q[3]
    ref.remove(3)
    q[7] = None
    ref.append(7)
    q[0] = None
    ref.append(0)
    q.move_to_end(7, last=False)
    ref.remove(7)
    ref.insert(0, 7)
    assert list(q) == ref and len(q) == len(ref)
    assert list(q.iter_after(None)) == ref and list(q.iter_after(2)) == ref[ref.index(2) + 1 :]
    assert 3 not in q and 4 in q


# ---- the reference ----------------------------------------------------------------------------------------
class RefLazy:
    """vLLM 0.33.0 GPU BlockPool + SimpleCPUOffloadScheduler(lazy_offload=True), lists only (see the model's
    docstring for the step semantics both implement)."""

    unit = "block"

    def __init__(self, N, b, num_cpu_blocks, mnbt):
        self.N, self.b = N, b
        self.capacity = N
        self.name = "ref-lazy"
        self.target = math.ceil(mnbt / b) * 2
        self.gb = [{"ref": 0, "hash": None} for _ in range(N)]
        self.gq = list(range(N))  # free queue, head first
        self.gmap: dict = {}  # hash -> [block ids] (first = the one a lookup returns)
        self.cb = [{"ref": 0, "hash": None} for _ in range(num_cpu_blocks - 1)]
        self.cq = list(range(num_cpu_blocks - 1))
        self.cmap: dict = {}
        self.cursor = None
        self.pending = []
        self.last = None
        self.running = {}

    # BlockPool, twice (pool = (blocks, queue, map))
    def _touch(self, pool, ids):
        bl, q, _ = pool
        for i in ids:
            if bl[i]["ref"] == 0:
                q.remove(i)
            bl[i]["ref"] += 1

    def _pop(self, pool, k):
        bl, q, m = pool
        out = [q.pop(0) for _ in range(k)]
        for i in out:
            h = bl[i]["hash"]
            if h is not None:
                m[h].remove(i)
                if not m[h]:
                    del m[h]
                bl[i]["hash"] = None
            bl[i]["ref"] = 1
        return out

    def _free(self, pool, ids):
        bl, q, _ = pool
        front, back = [], []
        for i in ids:
            bl[i]["ref"] -= 1
            if bl[i]["ref"] == 0:
                (front if bl[i]["hash"] is None else back).append(i)
        q[:0] = front
        q.extend(back)

    def _sethash(self, pool, i, h):
        bl, _, m = pool
        bl[i]["hash"] = h
        m.setdefault(h, []).append(i)

    @property
    def G(self):
        return (self.gb, self.gq, self.gmap)

    @property
    def C(self):
        return (self.cb, self.cq, self.cmap)

    def _walk(self):
        if self.cursor is not None and self.gb[self.cursor]["ref"] > 0:
            self.cursor = None
        after = self.gq if self.cursor is None else self.gq[self.gq.index(self.cursor) + 1 :]
        free = len(self.cq)
        sel = []
        last = self.cursor
        for covered, i in enumerate(after):
            if covered >= self.target or len(sel) >= free:
                break
            last = i
            h = self.gb[i]["hash"]
            if h is not None and h not in self.cmap:
                sel.append(i)
        self.cursor = last
        if sel:
            cpu = self._pop(self.C, len(sel))
            self._touch(self.G, sel)
            self.pending.append((sel, cpu))

    def _complete(self):
        for sel, cpu in self.pending:
            for gi, ci in zip(sel, cpu, strict=True):
                self._sethash(self.C, ci, self.gb[gi]["hash"])
            self._free(self.C, cpu)
            self._free(self.G, sel)
        self.pending = []
        self.last = None

    def fits(self, q):
        return math.ceil(q.prompt_tokens / self.b) <= self.N

    def submit(self, q):
        self._complete()
        b, T, hs = self.b, q.prompt_tokens, list(q.block_hashes)
        hit = []
        for h in hs[: (T - 1) // b]:
            if h not in self.gmap:
                break
            hit.append(self.gmap[h][0])
        need = math.ceil(T / b) - len(hit) + sum(self.gb[i]["ref"] == 0 for i in hit)
        if need > len(self.gq):
            return None
        g = len(hit) * b
        chit = []
        for h in hs[g // b : g // b + max(0, (T - 1 - g) // b)]:
            if h not in self.cmap:
                break
            chit.append(self.cmap[h][0])
        self._touch(self.G, hit)
        blocks = list(hit)
        if chit:
            self._touch(self.C, chit)
            blocks += self._pop(self.G, len(chit))
            self._walk()
            self._free(self.C, chit)
            self._complete()
        blocks += self._pop(self.G, math.ceil(T / b) - len(blocks))
        for k in range(len(hit), T // b):
            self._sethash(self.G, blocks[k], hs[k])
        self.running[q.rid] = blocks
        self._walk()
        self.last = q.rid
        return (g, len(chit) * b)

    def finish(self, rid):
        if self.last != rid:
            self._complete()
        self._free(self.G, list(reversed(self.running.pop(rid))))
        self._complete()

    def eviction_order(self):
        return [self.gb[i]["hash"] for i in self.gq if self.gb[i]["hash"] is not None]

    def host_eviction_order(self):
        return [self.cb[i]["hash"] for i in self.cq if self.cb[i]["hash"] is not None]

    def in_use(self):
        return self.N - len(self.gq)


def _drive(e, reqs, times=None, hold=None):
    """Replay ``e`` and record (outcome, GPU order, CPU order) after every event."""
    log = []

    def on(kind, r, out):
        o = (out.gpu_hit_tokens, out.cpu_hit_tokens) if kind == "submit" else None
        log.append((kind, r, o, e.eviction_order(), e.host_eviction_order()))

    replay(e, reqs, times=times, hold=hold, on_event=on)
    return log


class _RefEngine(RefLazy):
    """RefLazy behind the replay driver (an outcome object with the fields the driver reads)."""

    def submit(self, q):
        out = super().submit(q)
        if out is None:
            return None
        return SimpleNamespace(rid=q.rid, hit_tokens=sum(out), gpu_hit_tokens=out[0], cpu_hit_tokens=out[1])

    def finish(self, rid):
        super().finish(rid)
        return SimpleNamespace(rid=rid)


@_S
@given(traces(), st.integers(1, 12), st.integers(1, 40))
def test_lazy_equals_reference(tr, C, mnbt):
    b, N, reqs = tr
    e = make_tiered("simple-lazy", gpu_blocks=N, host_capacity=C, block_size=b, max_num_batched_tokens=mnbt)
    assert _drive(e, reqs) == _drive(_RefEngine(N, b, C, mnbt), reqs)


@_S
@given(traces(), st.integers(1, 12), st.integers(1, 40), st.floats(0.5, 4.0))
def test_lazy_equals_reference_with_hold(tr, C, mnbt, h):
    b, N, reqs = tr
    n = len(reqs)
    times, hold = np.arange(n, dtype=float), np.full(n, h)
    e = make_tiered("simple-lazy", gpu_blocks=N, host_capacity=C, block_size=b, max_num_batched_tokens=mnbt)
    assert _drive(e, reqs, times, hold) == _drive(_RefEngine(N, b, C, mnbt), reqs, times, hold)
    assert e.host.resident() <= max(C - 1, 0)


@_S
@given(traces(), st.integers(1, 12))
def test_lazy_bounds(tr, C):
    """Totals stay within the prompt, at least one token is computed, CPU content within the usable blocks."""
    b, N, reqs = tr
    e = make_tiered("simple-lazy", gpu_blocks=N, host_capacity=C, block_size=b, max_num_batched_tokens=b)
    res = replay(e, reqs)
    for q, o in zip(reqs, res.outcomes, strict=True):
        assert o.hit_tokens <= q.prompt_tokens - 1 and o.computed_tokens >= 1
        assert o.cpu_hit_tokens % b == 0
    assert e.host.resident() <= C - 1
