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

from kvhit.sim.engine import Request, replay
from kvhit.sim.tiers import make_tiered
from kvhit.sim.tiers.simple_lazy import LinkedFreeQueue, SimpleLazyEngine, lazy_target_blocks
from test_tiers import _S, traces


def _req(rid, T, conv=0, b=4):
    return Request(rid=rid, prompt_tokens=T, block_hashes=tuple(conv * 1000 + i for i in range(T // b)))


def _out(res):
    return [(o.gpu_hit_tokens, o.cpu_hit_tokens, o.computed_tokens) for o in res.outcomes]


# ---- hand-worked cases ----------------------------------------------------------------------------------
def test_lazy_stores_a_request_tail_first_so_the_cpu_keeps_its_head():
    """b=4, GPU blocks b0..b3, 6 CPU blocks (5 usable c0..c4; one is the pool's null block), walk covering the queue.

    r0 (A, 8 tokens) takes b0, b1; its step's walk sees only unhashed b2, b3 (cursor b3). r0 frees tail first:
    GPU [b2 b3 b1=A1 b0=A0]. The step that reports r0 walks after b3: stores A1, A0 (c0, c1) in that order, so
    the CPU LRU is [c2 c3 c4 c0=A1 c1=A0]: A's TAIL is older. r1 (B, 4 tokens) takes b2; its finish step stores
    B0 (c2). r2 (D, 12 tokens) pops b3, b1, b0 (A leaves the GPU); its finish step stores D2, D1, D0 into c3,
    c4 and c0 — evicting A1, keeping A0. r3 (A, 9 tokens): no GPU hit, CPU hit A0: 4 tokens loaded, 5 computed.
    Eager writes A through in prefix order (A0 older), loses A0 to D and r3 loads nothing.
    """
    reqs = [_req(0, 8, 0), _req(1, 4, 1), _req(2, 12, 3), _req(3, 9, 0)]
    lazy = make_tiered("simple-lazy", gpu_blocks=4, host_capacity=6, block_size=4)
    assert _out(replay(lazy, reqs)) == [(0, 0, 8), (0, 0, 4), (0, 0, 12), (0, 4, 5)]
    # r3: the load step pops b2 (B0) for the loaded block; the compute step pops b0, b1 (D2, D1); r3 frees its
    # partial block to the head, A1, A0 to the tail; its finish step stores A1 (A0 is on the CPU, loaded)
    assert lazy.eviction_order() == [3000, 0, 1]
    assert lazy.host_eviction_order() == [3002, 3001, 3000, 0, 1]
    eager = make_tiered("simple", gpu_blocks=4, host_capacity=6, block_size=4)
    assert _out(replay(eager, reqs)) == [(0, 0, 8), (0, 0, 4), (0, 0, 12), (0, 0, 9)]


def test_walk_length_bounds_what_is_written_back():
    """max_num_batched_tokens=4, b=4: the walk covers 2·⌈4/4⌉ = 2 free blocks per step.

    r0 (A, 12 tokens: b0..b2) frees [b3 b2=A2 b1=A1 b0=A0]; the finish step walks after the cursor b3 and stops
    after two blocks: A2, A1 stored, A0 not (cursor b1). r1 (B, 8 tokens) pops b3 and b0 (A0 evicted from the
    GPU, never written back); its finish step stores B1, B0. r2 (A, 13 tokens): no GPU hit, and the CPU lacks
    A's head: nothing loaded. Eager stored all of A at r0's finish: r2 loads 12 tokens.
    """
    reqs = [_req(0, 12, 0), _req(1, 8, 1), _req(2, 13, 0)]
    lazy = make_tiered("simple-lazy", gpu_blocks=4, host_capacity=6, block_size=4, max_num_batched_tokens=4)
    assert lazy.target_free == 2
    assert _out(replay(lazy, reqs)) == [(0, 0, 12), (0, 0, 8), (0, 0, 13)]
    # r2 pops all four blocks (cursor reset); its finish step walks from the head: its partial block, then A2
    # (already on the CPU): two blocks covered, A0 again not written back
    assert lazy.host_eviction_order() == [2, 1, 1001, 1000]
    assert lazy.eviction_order() == [2, 1, 0]
    eager = make_tiered("simple", gpu_blocks=4, host_capacity=6, block_size=4)
    assert _out(replay(eager, reqs))[2] == (0, 12, 1)


def test_write_back_happens_in_the_step_after_the_finish():
    """On an idle GPU a request's own step walks only free (here unhashed) blocks; its blocks are written back
    by the step that reports it finished, in free-queue order (tail first), not in prefix order as eager."""
    lazy = make_tiered("simple-lazy", gpu_blocks=8, host_capacity=9, block_size=4)
    eager = make_tiered("simple", gpu_blocks=8, host_capacity=9, block_size=4)
    replay(lazy, [_req(0, 12, 0)])
    replay(eager, [_req(0, 12, 0)])
    assert lazy.host_eviction_order() == [2, 1, 0] and eager.host_eviction_order() == [0, 1, 2]


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
        self._walk()  # the step that reports the finished request
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
