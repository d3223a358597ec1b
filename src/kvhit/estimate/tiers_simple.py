"""SimpleCPUOffload eager (vLLM 0.33.0) two-tier estimator with the CPU's *store-time recency*.

Derivation: ``docs/estimators.md`` §5.2. Setting and engine facts: :mod:`kvhit.sim.tiers.simple` (read from vLLM's
``simple_kv_offload/manager.py``): the CPU copy of a block is written (store) or re-queued (load) only when the
GPU did *not* hit the block — a block the GPU hits and the CPU already holds is not touched on the CPU; a request's
CPU blocks are freed in prefix order (its head is the CPU's next victim); the CPU pool has ``C − 1`` usable blocks
(the null block); the CPU lookup starts at the GPU hit and stops at the first CPU miss, capped at ``(T − 1)//b``.

Model, per request ``r`` and age segment ``[s0, s1)`` (source ``j_1``; the GPU side is the engine-aware estimator
of ``kvhit.estimate.agentic``, hit condition (A1) with the tabulated law of the displacement ``D``):

* GPU: block ``i`` is hit iff ``D_1 ≤ n_1(i) = N − c0 − (i − s0)`` (``c0 = 1 + e + s0 + D_same``), so the first
  GPU-missed block (the *boundary*) is ``x = s0 + n_1(s0) + 1 − D_1`` clipped to the segment.
* CPU order: the last refresh of a block is no older than that of the block before it (a GPU hit is a prefix),
  and inside one refresh the head is older, so every block ``i' > x`` of the source's prompt sits above ``x`` in
  the CPU's LRU order. The CPU holds a *suffix* of the chain, so it serves ``[x, s1)`` whole iff it still holds
  ``x``, else nothing. A request stores at most ``C − 1`` blocks from its head (a store takes at most the CPU's
  free blocks and its own batch stays pinned), so only ``F′ = min(F_{j_1}, C − 1)`` blocks of the source reach the
  CPU: it serves ``[x, min(s1, F′))``, with ``F′ − 1 − x`` own blocks above ``x``, iff

      κ·D_1 + S_m + D_same ≤ C − 1 − F′ + x,

  ``m`` the step of the chain ``j_1, j_2, …`` (the earlier toucher of ``x`` at each step) at which ``x`` was last
  refreshed (the GPU missed it there, or it was new): ``P(m) = (1 − q_m) Π_{l<m} q_l`` with ``q_l = P(D_l ≤
  n_l(x))`` (that step's segment law and threshold; the gaps independent). The CPU's displacement is counted in
  CPU *insertions*: request ``q`` inserts ``min(E[F_q − g_q], C − 1)`` blocks (the GPU's expected misses), less
  what its stream's previous request inserted too when both are in the window; other sessions only. ``D_H(j, r)``
  = that count strictly between ``j`` and ``r``. Over the last gap it is tied to the GPU's ``D_1``: ``κ =
  D_H(j_1, r) / E[D_1]``; before it, the deterministic ``S_m = D_H(j_m, r) − D_H(j_1, r)``.
* Expected CPU-served blocks of the segment = ``Σ_x P(boundary = x)·(min(s1, F′) − x)⁺·Σ_m P(m)·1[·]`` (for
  ``x = s0`` the CPU condition is a threshold on ``D_1`` over ``D_1 > n_1(s0)``).
  :func:`kvhit.estimate.tiers.estimate_tiers` adds it to the single-tier estimator ``h_G``.

Invariant: ``h_G(N) ≤ h(N, C) ≤`` the ceiling, ``h(N, 0) = h(N, 1) = h_G(N)`` (a 1-block CPU pool is the null
block only), and ``h`` is non-decreasing in ``C`` (every threshold grows with ``C``).

Not modelled: a GPU-hit block re-stored because the CPU had lost it (insertions count GPU misses only); the stale
CPU tail left when a refresh re-stores an evicted head (the suffix order is then broken); CPU blocks present beyond
a CPU miss that are recomputed without a refresh; the eager stores' GPU free-order change (stored blocks are freed
head first after the request's own free: near ``N_min`` with a CPU smaller than the largest requests it dominates
and the estimate is too high, docs §5.2); the joint law of the gap displacements (independent, the earlier gaps
deterministic); the run across segments (each segment on its own); timing (holds).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvhit.estimate.agentic import _H

__all__ = ["simple_eager_hits"]


@njit(cache=True)
def _cdf(Hb, row, z, delta, G):  # pragma: no cover
    """P(D ≤ z) on the table's interpolation (``H(z + 1) − H(z)``); 0 below 0."""
    if z < 0.0:
        return 0.0
    if z >= (G + 2) * delta:  # z and z + 1 beyond the grid: _H's linear extension, without its division
        return (Hb[row, G] + (z + 1.0 - G * delta)) - (Hb[row, G] + (z - G * delta))
    return _H(Hb, row, z + 1.0, delta, G) - _H(Hb, row, z, delta, G)


@njit(cache=True)
def _H_q(Hb, row, y, x, G, delta):  # pragma: no cover
    """``_H(Hb, row, y, delta, G)`` given its quotient ``x = y / delta``."""
    if y <= 0.0:
        return 0.0
    j = int(x)
    if j >= G:
        return Hb[row, G] + (y - G * delta)
    return Hb[row, j] + (x - j) * (Hb[row, j + 1] - Hb[row, j])


@njit(cache=True)
def _cdf_q(Hb, row, z, xz, xz1, delta, G):  # pragma: no cover
    """``_cdf(Hb, row, z, delta, G)`` given the quotients ``xz = z / delta``, ``xz1 = (z + 1) / delta``."""
    if z < 0.0:
        return 0.0
    return _H_q(Hb, row, z + 1.0, xz1, G, delta) - _H_q(Hb, row, z, xz, G, delta)


@njit(cache=True)
def _seg_of(seg_off, seg_start, s1cap, j, x):  # pragma: no cover
    """The segment of request ``j`` whose GPU-hittable part holds block ``x``, or -1."""
    for s in range(seg_off[j], seg_off[j + 1]):
        if seg_start[s] <= x < s1cap[s]:
            return s
        if seg_start[s] > x:
            return -1
    return -1


@njit(cache=True)
def _gpu_hits(Hb, delta, seg_row, seg_c0, seg_off, seg_start, s1cap, N, out_g):  # pragma: no cover
    """out_g[r] += E GPU hit blocks of each segment of request r (every request)."""
    G = Hb.shape[1] - 1
    for r in range(seg_off.shape[0] - 1):
        for sg in range(seg_off[r], seg_off[r + 1]):
            s0 = seg_start[sg]
            s1 = s1cap[sg]
            row = seg_row[sg]
            if s1 <= s0 or row < 0:
                continue
            n0 = N - seg_c0[sg]
            g = 0.0
            for i in range(s0, s1):
                g += _cdf(Hb, row, n0 - (i - s0), delta, G)
            out_g[r] += g


@njit(cache=True)
def _eager_kernel(
    Hb,
    delta,
    seg_row,
    seg_c0,
    seg_off,
    seg_start,
    s1cap,
    seg_src,
    F,
    req_use,
    same,
    N,
    Cs,
    grp,
    push,
    ov,
    prev,
    sess,
    nxt,
    mean_D,
    out_h,
):  # pragma: no cover
    """out_h[r, k] = E blocks the CPU adds at capacity ``Cs[k]`` for the requests ``req_use``.

    ``push[g, q]`` = E blocks q inserts on the CPU under store cap group ``g`` (``grp[k]``: the group of ``Cs[k]``),
    ``ov[g, q]`` = how many of them its stream's previous request ``prev[q]`` inserted too (not distinct when both
    are in a window); ``nxt[q]`` = the next request of q's stream (prev's inverse, −1); ``mean_D[row]`` = E D of a
    row. Every value is the one-pass-per-group reference's (e442ffa's, kept in ``tests/test_tiers_simple_fast.py``),
    bit for bit: each sum has the same operands in the same order. The chain's CPU insertion counts ``S`` depend on
    the chain's requests only, so they are computed once per distinct chain prefix of a segment (memo) instead of
    once per block ``x``; every group is served by one walk; a capacity's x > s0 sum is a running sum of π up to
    the first step whose running maximum of κ·d + S exceeds its room."""
    G = Hb.shape[1] - 1
    nC = Cs.shape[0]
    nG = push.shape[0]
    MAXM = 256
    pi = np.zeros(MAXM)
    mj = np.empty(MAXM, np.int64)  # memo: the chain's requests j_0 … j_{L−1}
    msacc = np.zeros((MAXM, nG))  # D_H(j_m, r) per group after step m
    d1 = np.zeros(nG)
    kap = np.zeros(nG)
    buf = np.empty(seg_off.shape[0], np.int64)
    cn0 = 0.0
    gains = np.zeros(nC)
    rooms = np.zeros(nC)
    tots = np.zeros(nC)
    live = np.zeros(nC, np.bool_)
    am = np.zeros((MAXM, nG))
    tk = np.zeros(nC)
    x0 = np.zeros(nC)
    x1 = np.zeros(nC)
    kapk = np.zeros(nC)
    vm = np.zeros((MAXM, nG))
    nan = np.zeros(nG, np.bool_)
    pmax = np.zeros((MAXM, nG))
    smin = np.zeros((MAXM, nG))
    run = np.zeros(MAXM + 1)
    for r in range(seg_off.shape[0] - 1):
        if not req_use[r]:
            continue
        sr = sess[r]
        for sg in range(seg_off[r], seg_off[r + 1]):
            s0 = seg_start[sg]
            s1 = s1cap[sg]
            row = seg_row[sg]
            if s1 <= s0 or row < 0:
                continue
            c0 = seg_c0[sg]
            n0 = N - c0  # n_1(s0)
            j1 = seg_src[sg]
            Fj1 = F[j1]
            ds = same[sg]
            for gi in range(nG):
                acc1 = 0.0
                for q in range(j1 + 1, r):
                    if sess[q] != sr:
                        acc1 += push[gi, q] - (ov[gi, q] if prev[q] > j1 else 0.0)
                d1[gi] = acc1
                kap[gi] = max(acc1 / mean_D[row], 1e-9) if mean_D[row] > 0.0 else 1.0
            mj[0] = j1
            for gi in range(nG):
                msacc[0, gi] = d1[gi]
            L = 1
            for x in range(s0, s1):
                if x == s0:
                    cn0 = _cdf(Hb, row, n0, delta, G)
                    pb = 1.0 - cn0
                else:
                    nx = n0 - (x - s0)
                    if nx + 1.0 < 0.0:
                        break
                    # P(D ≤ nx + 1) is the previous block's P(D ≤ nx) (the same argument), else computed
                    pb = _cdf(Hb, row, nx + 1.0, delta, G) - _cdf(Hb, row, nx, delta, G)
                if pb <= 1e-12:
                    continue
                M = 0
                acc = 1.0
                j = j1
                while M < MAXM:
                    if M >= L or mj[M] != j:  # a new chain step: D_H(j, r) from the previous step's
                        jprev = mj[M - 1]
                        # the requests after jprev whose previous request enters the window now: the next
                        # requests of (j, jprev], in arrival order (the reference scans (jprev, r) for them)
                        nb = 0
                        for p in range(j + 1, jprev + 1):
                            q = nxt[p]
                            if jprev < q < r and sess[q] != sr:
                                buf[nb] = q
                                nb += 1
                        if nb > 1:
                            buf[:nb].sort()
                        for gi in range(nG):
                            sacc = msacc[M - 1, gi]
                            for q in range(j + 1, jprev + 1):
                                if sess[q] != sr:
                                    sacc += push[gi, q] - (ov[gi, q] if prev[q] > j else 0.0)
                            for t in range(nb):
                                sacc -= ov[gi, buf[t]]
                            msacc[M, gi] = sacc
                        mj[M] = j
                        L = M + 1
                    sj = _seg_of(seg_off, seg_start, s1cap, j, x)
                    if sj < 0 or seg_row[sj] < 0 or seg_src[sj] < 0:
                        pi[M] = acc
                        M += 1
                        break
                    nl = N - seg_c0[sj] - (x - seg_start[sj])
                    qq = _cdf(Hb, seg_row[sj], nl, delta, G)
                    pi[M] = acc * (1.0 - qq)
                    M += 1
                    acc *= qq
                    if acc < 1e-9 or qq <= 0.0:
                        break
                    j = seg_src[sj]
                # per capacity: the gain and the room (κ·D_1 + S_m ≤ room); a capacity with no room or gain adds 0
                for k in range(nC):
                    Feff = min(float(Fj1), Cs[k] - 1.0)
                    gains[k] = min(float(s1), Feff) - x
                    rooms[k] = Cs[k] - 1.0 - Feff + x - ds
                    live[k] = not (rooms[k] < 0.0 or gains[k] <= 0.0)
                    tots[k] = 0.0
                    kapk[k] = kap[grp[k]]
                for gi in range(nG):
                    for m in range(M):
                        am[m, gi] = msacc[m, gi] - d1[gi]  # S_m
                if x == s0:
                    # chain steps outside, capacities inside: each capacity's sum still runs over m in order
                    for m in range(M):
                        pm = pi[m]
                        if pm == 0.0:  # adds exactly 0
                            continue
                        # the divisions first (a loop without branches: vectorized), then _cdf's interpolation on
                        # them (the same quotients _H computes)
                        for k in range(nC):
                            t = (rooms[k] - am[m, grp[k]]) / kapk[k]
                            tk[k] = t
                            x0[k] = t / delta
                            x1[k] = (t + 1.0) / delta
                        for k in range(nC):
                            t = tk[k]
                            if live[k] and t > n0:
                                tots[k] += pm * (_cdf_q(Hb, row, t, x0[k], x1[k], delta, G) - cn0)
                    for k in range(nC):
                        if live[k]:
                            out_h[r, k] += gains[k] * tots[k]
                else:
                    d = n0 - (x - s0) + 1.0
                    # v_m = κ·d + S_m, each group's. A capacity counts the steps with v_m ≤ room, in m order: all of
                    # them before the first m* whose running maximum of v exceeds the room (the running sum of pi at
                    # m*, the reference's partial sum exactly), then those after m* up to the last m whose suffix
                    # minimum of v is within the room
                    for gi in range(nG):
                        kd = kap[gi] * d
                        nan[gi] = False
                        for m in range(M):
                            v = kd + am[m, gi]
                            vm[m, gi] = v
                            if v != v:
                                nan[gi] = True
                            pmax[m, gi] = v if m == 0 or v > pmax[m - 1, gi] else pmax[m - 1, gi]
                        for m in range(M - 1, -1, -1):
                            v = vm[m, gi]
                            smin[m, gi] = v if m == M - 1 or v < smin[m + 1, gi] else smin[m + 1, gi]
                    run[0] = 0.0
                    for m in range(M):
                        run[m + 1] = run[m] + pi[m]
                    for k in range(nC):
                        if live[k]:
                            gi = grp[k]
                            rk = rooms[k]
                            if nan[gi]:
                                tot = 0.0
                                for m in range(M):
                                    if vm[m, gi] <= rk:
                                        tot += pi[m]
                            else:
                                lo = 0  # m* = the first m with pmax > room (bisection: pmax does not fall)
                                hi = M
                                while lo < hi:
                                    mid = (lo + hi) >> 1
                                    if pmax[mid, gi] <= rk:
                                        lo = mid + 1
                                    else:
                                        hi = mid
                                tot = run[lo]
                                for m in range(lo + 1, M):
                                    if smin[m, gi] > rk:
                                        break
                                    if vm[m, gi] <= rk:
                                        tot += pi[m]
                            out_h[r, k] += gains[k] * pb * tot


def simple_eager_hits(u, table, c0, same, N: int, Cs: np.ndarray, use: np.ndarray, seg_keep: np.ndarray):
    """Per request: (E GPU hit blocks at ``N``, E CPU-added blocks at each ``Cs``) — the module docstring's model.

    ``table`` = ``(Hb, delta, rows)`` with ``rows`` one per kept segment (``seg_keep``: the segments of ``u`` with a
    GPU-hittable part, in order); ``c0`` / ``same`` per kept segment; ``use``: the requests counted (their chains run
    over every request)."""
    Hb, delta, rows = table
    nseg = u.seg_start.shape[0]
    seg_row = np.full(nseg, -1, np.int64)
    seg_row[seg_keep] = rows
    seg_c0 = np.zeros(nseg)
    seg_c0[seg_keep] = c0
    seg_same = np.zeros(nseg)
    seg_same[seg_keep] = same
    seg_req = np.repeat(np.arange(u.n, dtype=np.int64), np.diff(u.seg_off))
    s1cap = np.minimum(u.seg_end, u.hit_cap[seg_req]).astype(np.int64)
    F = u.full_blocks.astype(np.int64)
    out_g = np.zeros(u.n)
    G = Hb.shape[1] - 1
    mean_D = G * delta - Hb[:, G]
    # the CPU's insertions: every full block the GPU does not hit (store or load), request by request
    _gpu_hits(Hb, delta, seg_row, seg_c0, u.seg_off, u.seg_start, s1cap, float(N), out_g)
    miss = np.maximum(F - out_g, 0.0)
    prev = u.prev.astype(np.int64)
    pp = np.maximum(prev, 0)
    # q's inserts [g_q, F_q) overlap its previous request's [g_p, F_p) on [max(g_q, g_p), F_p)
    ov0 = np.where(prev >= 0, np.maximum(np.minimum(F[pp], F) - np.maximum(out_g, out_g[pp]), 0.0), 0.0)
    sess = u.session.astype(np.int64)
    tot = float(F.sum())
    rho = 1.0 - float(out_g.sum()) / tot if tot else 1.0
    out_h = np.zeros((u.n, Cs.shape[0]))
    if Cs.shape[0] == 0:
        return np.zeros(u.n), out_h, rho
    # insertions per request capped at C − 1 (the store cap): one group per distinct cap that binds, every group
    # in one kernel pass; C ≤ 1 adds nothing (F′ = min(F, C − 1) ≤ 0: no block to gain), left at 0
    act = np.flatnonzero(Cs > 1)
    if act.size:
        top = float(miss.max()) if miss.size else 0.0
        cap = np.minimum(Cs[act].astype(np.float64) - 1.0, top)
        cvs, grp = np.unique(cap, return_inverse=True)
        push = np.minimum(miss[None, :], cvs[:, None])
        ov = np.minimum(ov0[None, :], push)
        nxt = np.full(u.n, -1, np.int64)  # the next request of each request's stream (prev's inverse)
        has = prev >= 0
        nxt[prev[has]] = np.flatnonzero(has)
        # the kernel adds into out_h's own columns where the active ones are a range (C ≤ 1 comes first when sorted)
        rng = act[-1] - act[0] + 1 == act.size
        h = out_h[:, act[0] : act[-1] + 1] if rng else np.zeros((u.n, act.size))
        _eager_kernel(Hb, delta, seg_row, seg_c0, u.seg_off, u.seg_start, s1cap, u.seg_src, F, use, seg_same,
                      float(N), Cs[act].astype(np.float64), grp.astype(np.int64), push, ov, prev, sess, nxt, mean_D,
                      h)  # fmt: skip
        if not rng:
            out_h[:, act] = h
    # the GPU hits of the counted requests (the same sums as out_g's)
    out_g2 = np.where(use, out_g, 0.0)
    return out_g2, out_h, rho


def estimate_simple_eager(u, Ns: np.ndarray, Cs: np.ndarray, *, lam0=None, meas=None, n_values: int = 4096, **kw):
    """(gpu[i], host[i, j], hit[i, j], rho[i]) at ``Ns[i]`` GPU blocks × ``Cs[j]`` CPU blocks (token metric, over the
    measured requests the GPU admits; ``NaN`` where none): the module docstring's model on one law table."""
    from kvhit.estimate.agentic_displacement import _poisson_table

    n = u.n
    b = u.block_size
    seg_req = np.repeat(np.arange(n, dtype=np.int64), np.diff(u.seg_off))
    s1cap = np.minimum(u.seg_end, u.hit_cap[seg_req])
    keep = (s1cap > u.seg_start) & (u.seg_src >= 0)
    T = u.prompt_tokens
    part = (T % b != 0).astype(np.int64)
    e = np.where(seg_req > 0, part[np.maximum(seg_req - 1, 0)], 0)
    notes: list = []
    meas = np.ones(n, bool) if meas is None else meas
    if not keep.any():  # nothing is ever looked up again (no law table to build): 0 wherever a request is admitted
        adm = np.array([(meas & (u.prompt_blocks <= N)).any() for N in Ns])
        gpu = np.where(adm, 0.0, np.nan)
        host = np.where(adm[:, None], 0.0, np.nan) * np.ones((1, Cs.shape[0]))
        return gpu, host, host.copy(), np.where(adm, 0.0, np.nan)
    big = int(max(int(Ns.max()), 4 * int(Cs.max()) if Cs.size else 1))
    lam = None if lam0 is None else float(lam0)
    Hb, delta, rows, d_same = _poisson_table(
        u, seg_req[keep], u.seg_src[keep], u.full_blocks, np.array([big]), lam, kw.get("bins"), n_values,
        kw.get("n_ages", 16), kw.get("n_times", 64), kw.get("exclude", "auto"), notes, kw.get("work_budget", 6e7),
        footprint=kw.get("footprint", "exact" if lam is not None else "own"), bin_rule=kw.get("bin_rule", "br"),
    )  # fmt: skip
    c0 = (1 + e[keep] + u.seg_start[keep] + d_same).astype(np.float64)
    R = u.prompt_blocks
    gpu = np.full(Ns.shape[0], np.nan)
    host = np.full((Ns.shape[0], Cs.shape[0]), np.nan)
    hit = np.full((Ns.shape[0], Cs.shape[0]), np.nan)
    rhos = np.full(Ns.shape[0], np.nan)
    kidx = np.flatnonzero(keep)
    Cu = np.maximum(Cs, 1)
    for i, N in enumerate(Ns):
        use = meas & (R <= N)
        if not use.any():
            continue
        g, hh, rho = simple_eager_hits(u, (Hb, delta, rows), c0, d_same.astype(np.float64), int(N), Cu, use, kidx)
        den = float(T[use].sum())
        gpu[i] = float(g[use].sum()) * b / den
        host[i] = hh[use].sum(axis=0) * b / den
        hit[i] = gpu[i] + host[i]
        rhos[i] = rho
    return gpu, host, hit, rhos
