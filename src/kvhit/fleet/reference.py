"""Plain-Python reference of the fleet (:mod:`kvhit.fleet.simulate`) for tests: slow, simple, written separately.

It keeps one status per request (pending / waiting / running / done / rejected) and, at every step, scans all
requests for the next event (earliest finish by (time, index), else the next arrival); loads are recomputed
from the statuses by scanning; each replica is a bare :class:`~kvhit.sim.vllm.reference.ReferenceBlockPool`
(not the :class:`~kvhit.sim.engine.Engine` wrapper); the routers are re-implemented below from the definitions
in :mod:`kvhit.fleet.routers` (sharing only the tie-break and draw order, so results match bit for bit). The
approximate modes of the KV-aware routers keep their own shadow here: per replica a dict ``hash -> (expiry,
last-use tick)`` — Dynamo's TTL (an entry counts while ``t < expiry``), llm-d's LRU sized to the replica's ``N``
(evict the smallest tick while over size), SGLang's tree without eviction (its size is the fallback's key).
The per-request timing (``prefill_hold``, ``hit_token_seconds``) is a second deadline per running request: its
prefill tokens count until ``pre_at[r]`` (a prefill-done event, ordered by (time, n + r) with the finishes).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from kvhit.sim.vllm.block import ENGINES
from kvhit.sim.vllm.reference import ReferenceBlockPool

__all__ = ["reference_fleet"]

PENDING, WAITING, RUNNING, DONE, REJECTED = range(5)


def _tie(rng, vals, best):
    c = [k for k, v in enumerate(vals) if v == best]
    return c[int(rng.integers(len(c)))] if len(c) > 1 else c[0]


def _h(s):
    return int.from_bytes(hashlib.md5(s.encode()).digest()[:8], "big")


def reference_fleet(
    T, off, hs, conv, *, Ns, b, router, params=None, engine="vllm", times=None, hold=None, seed=0, lag=0.0,
    prefill_hold=None, hit_token_seconds=0.0,
):  # fmt: skip
    """Returns ``(replica, hit_blocks, wait, rejected)`` lists (PD mode, ``L = T``)."""
    p = dict(params or {})
    n, R = len(T), len(Ns)
    rng = np.random.default_rng(seed)
    pools = [ReferenceBlockPool(N, b, ENGINES[engine]) for N in Ns]
    H = [[int(x) for x in hs[off[r] : off[r + 1]]] for r in range(n)]
    tm = [0.0] * n if times is None else [float(x) for x in times]
    hd = None if hold is None else [float(x) for x in hold]
    st = [PENDING] * n
    rep = [-1] * n
    hit = [0] * n
    wait = [0.0] * n
    fin_at = [math.inf] * n
    ph = None if prefill_hold is None else [float(x) for x in prefill_hold]
    pre_at = [math.inf] * n  # prefill done (with prefill_hold)
    pre_done = [False] * n
    held: dict[int, list[int]] = {}
    rr = [0]
    bind: dict[int, tuple[int, float]] = {}
    ring = sorted((_h(f"replica-{k}-{j}"), k) for k in range(R) for j in range(p.get("vnodes", 160)))

    def loads():
        inf, pre, act = [0.0] * R, [0.0] * R, [0.0] * R
        for r in range(n):
            if st[r] in (WAITING, RUNNING):
                k = rep[r]
                inf[k] += 1
                if not pre_done[r]:
                    pre[k] += T[r] - (hit[r] * b if st[r] == RUNNING else 0)
                act[k] += -(-T[r] // b)
        use = [(pl.N - len(pl.free_queue)) / pl.N for pl in pools]
        return inf, pre, act, use

    def overlap(k, r):
        n_hit = 0
        for i in range((T[r] - 1) // b):
            if not pools[k].cached.get(H[r][i]):
                break
            n_hit += 1
        return n_hit

    mode_default = "approx" if router == "sglang" else "precise"
    approx = p.get("mode", mode_default) == "approx"
    shadow: list[dict[int, list]] = [{} for _ in range(R)]
    clock = [0]
    ttl = p.get("ttl", 120.0) if router == "dynamo" else math.inf

    def sh_overlap(k, r, t):
        n_hit = 0
        for h in H[r]:
            e = shadow[k].get(h)
            if e is None or e[0] <= t:
                break
            n_hit += 1
        return n_hit

    def sh_add(k, r, t):
        for h in H[r]:
            clock[0] += 1
            shadow[k][h] = [t + ttl, clock[0]]
        if router == "llm-d":
            while len(shadow[k]) > Ns[k]:
                old = min(shadow[k], key=lambda x: shadow[k][x][1])
                del shadow[k][old]

    def ovl(k, r, t):
        return sh_overlap(k, r, t) if approx else overlap(k, r)

    def route(r, ld):
        k = route0(r, ld)
        if approx and router in ("dynamo", "llm-d", "sglang"):
            sh_add(k, r, tm[r])
        return k

    def route0(r, ld):
        inf, pre, act, use = ld
        t = tm[r]
        if router == "round-robin":
            k = rr[0] % R
            rr[0] += 1
            return k
        if router == "random":
            return int(rng.integers(R))
        if router == "session":
            x = _h(str(int(conv[r])))
            for pt, k in ring:
                if pt > x:
                    return k
            return ring[0][1]
        if router == "sticky":
            bd = bind.get(int(conv[r]))
            k = bd[0] if bd and t < bd[1] else _tie(rng, inf, min(inf))
            bind[int(conv[r])] = (k, t + p.get("ttl", 300.0))
            return k
        if router == "least-loaded":
            x = pre if p.get("metric") == "prefill_tokens" else inf
            return _tie(rng, x, min(x))
        if router == "dynamo":
            w, wr, temp = p.get("overlap_score_weight", 1.0), p.get("request_weight", 0.0), p.get("temperature", 0.0)
            cr = p.get("overlap_score_credit", 1.0)
            lg = [
                # decode blocks summed first (integers, exact), as Dynamo and the router do: the float sum's order
                # decides ties (2.3333333333333335 + 0 + 3 == 0.3333333333333333 + 2 + 3, but != 0.333... + 5)
                w * (max(pre[k] + T[r] - cr * ovl(k, r, t) * b, 0.0) / b) + (act[k] + -(-T[r] // b)) + wr * inf[k]
                for k in range(R)
            ]
            if temp == 0:
                return _tie(rng, lg, min(lg))
            lo, hi = min(lg), max(lg)
            ws = [math.exp(-((x - lo) / (hi - lo) if hi > lo else 0.0) / temp) for x in lg]
            u, acc = rng.random() * sum(ws), 0.0
            for k in range(R):
                acc += ws[k]
                if u < acc:
                    return k
            return R - 1
        if router == "llm-d":
            nb = len(H[r])
            qmin, qmax = min(inf), max(inf)
            sc = [
                p.get("prefix_weight", 3.0) * (ovl(k, r, t) / nb if nb else 0.0)
                + p.get("queue_weight", 2.0) * ((qmax - inf[k]) / (qmax - qmin) if qmax > qmin else 1.0)
                + p.get("kv_weight", 2.0) * (1.0 - use[k])
                for k in range(R)
            ]
            return _tie(rng, sc, max(sc))
        if router == "sglang":
            if max(inf) - min(inf) > p.get("balance_abs_threshold", 64) and max(inf) > p.get(
                "balance_rel_threshold", 1.5
            ) * min(inf):
                return _tie(rng, inf, min(inf))
            ov = [ovl(k, r, t) for k in range(R)]
            nb = len(H[r])
            if nb and max(ov) / nb > p.get("cache_threshold", 0.3):
                return _tie(rng, ov, max(ov))
            if approx:
                sizes = [len(shadow[k]) for k in range(R)]
                return _tie(rng, sizes, min(sizes))
            return _tie(rng, inf, min(inf))
        raise ValueError(router)

    def try_start(k, now):
        for r in range(n):  # FIFO: the earliest waiting request of replica k, and stop at the first refusal
            if st[r] != WAITING or rep[r] != k:
                continue
            pl = pools[k]
            hb = pl.get_computed_blocks(H[r], T[r])
            if not pl.can_allocate(hb, T[r]):
                return
            held[r] = pl.allocate(hb, H[r], T[r])
            hit[r] = len(hb)
            wait[r] = now - tm[r]
            st[r] = RUNNING
            if hd is None:
                finish(r)
            else:
                saved = hit_token_seconds * (hit[r] * b)
                fin_at[r] = now + max(hd[r] - saved, 0.0)
                if ph is not None:
                    pre_at[r] = now + max(ph[r] - saved, 0.0)

    def finish(r):
        pools[rep[r]].free(held.pop(r))
        st[r] = DONE

    snap, tick = None, 0.0
    while True:
        evs = [(fin_at[r], r) for r in range(n) if st[r] == RUNNING]
        evs += [(pre_at[r], n + r) for r in range(n) if st[r] == RUNNING and ph is not None and not pre_done[r]]
        ev = min(evs, default=None)
        a = next((r for r in range(n) if st[r] == PENDING), None)
        if ev is None and a is None:
            break
        is_fin = ev is not None and (a is None or ev[0] <= tm[a])
        now = ev[0] if is_fin else tm[a]
        if lag > 0 and (snap is None or now >= tick):
            snap = loads()
            tick = (math.floor(now / lag) + 1) * lag
        if is_fin and ev[1] >= n:
            pre_done[ev[1] - n] = True
            continue
        if is_fin:
            f = ev[1]
            finish(f)
            try_start(rep[f], now)
            continue
        k = route(a, snap if lag > 0 else loads())
        rep[a] = k
        if -(-T[a] // b) > Ns[k]:
            st[a] = REJECTED
            wait[a] = math.nan
        else:
            st[a] = WAITING
            try_start(k, now)
    return rep, hit, wait, [s == REJECTED for s in st]
