"""The simple-eager tier kernel (``kvhit.estimate.tiers_simple``) against the one it replaced, bit for bit.

The reference below is ``_cdf``, ``_seg_of``, ``_eager_kernel`` and ``simple_eager_hits`` of
``src/kvhit/estimate/tiers_simple.py`` at commit e442ffa (the branch point of w9-eager), verbatim but for the
names (``_ref``) and numba's on-disk cache: one kernel pass per store-cap group, the chain's CPU insertion counts
recomputed at every block ``x``, the window scanned to ``r`` at every chain step. The new kernel reorganises the same
floating-point operations (one pass for every group, the counts memoized per distinct chain prefix, capacities
inside the chain steps, prefix sums where the counted steps are a prefix, ``_cdf`` without ``_H``'s division beyond
the grid); its outputs must be *equal*, not close: on the stored WEKA conversations through ``estimate_tiers``, and on
generated request structures and laws (hypothesis), with store caps that bind (many groups) and chains whose
``S_m`` fall as well as rise.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import njit

import kvhit.estimate.tiers_simple as ts
from kvhit.estimate.agentic import _H
from kvhit.estimate.tiers import estimate_tiers
from kvhit.workload.production import read_weka
from kvhit.workload.reuse import request_reuse

DATA = Path(__file__).parent / "data" / "production"
WEKA = [DATA / "weka_0022.json", DATA / "weka_0014_cut.json", DATA / "weka_0026.json"]


# ---- the reference: e442ffa's code ------------------------------------------------------------------------------
@njit
def _cdf_ref(Hb, row, z, delta, G):  # pragma: no cover
    """P(D ≤ z) on the table's interpolation (``H(z + 1) − H(z)``); 0 below 0."""
    if z < 0.0:
        return 0.0
    return _H(Hb, row, z + 1.0, delta, G) - _H(Hb, row, z, delta, G)


@njit
def _seg_of_ref(seg_off, seg_start, s1cap, j, x):  # pragma: no cover
    """The segment of request ``j`` whose GPU-hittable part holds block ``x``, or -1."""
    for s in range(seg_off[j], seg_off[j + 1]):
        if seg_start[s] <= x < s1cap[s]:
            return s
        if seg_start[s] > x:
            return -1
    return -1


@njit
def _eager_kernel_ref(
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
    push,
    ov,
    prev,
    sess,
    mean_D,
    out_g,
    out_h,
):  # pragma: no cover
    """out_g[r] = E GPU hit blocks of request r; out_h[r, k] = E blocks the CPU adds at capacity Cs[k].

    ``push[q]`` = E blocks q inserts on the CPU, ``ov[q]`` = how many of them its stream's previous request
    ``prev[q]`` inserted too (not distinct when both are in a window); ``mean_D[row]`` = E D of a row."""
    G = Hb.shape[1] - 1
    nC = Cs.shape[0]
    MAXM = 256
    pi = np.zeros(MAXM)
    S = np.zeros(MAXM)
    for r in range(seg_off.shape[0] - 1):
        if not req_use[r]:
            continue
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
            g = 0.0
            for i in range(s0, s1):
                g += _cdf_ref(Hb, row, n0 - (i - s0), delta, G)
            out_g[r] += g
            if nC == 0:
                continue
            # the CPU's displacement D_H(j, r) (distinct other blocks inserted strictly between j and r), for every
            # j of the window back to the oldest chain step, accumulated backwards from r
            sr = sess[r]
            d1 = 0.0
            for q in range(j1 + 1, r):
                if sess[q] != sr:
                    d1 += push[q] - (ov[q] if prev[q] > j1 else 0.0)
            kap = max(d1 / mean_D[row], 1e-9) if mean_D[row] > 0.0 else 1.0
            for x in range(s0, s1):
                # probability that x is the boundary (first GPU miss)
                if x == s0:
                    pb = 1.0 - _cdf_ref(Hb, row, n0, delta, G)
                else:
                    nx = n0 - (x - s0)
                    if nx + 1.0 < 0.0:
                        break
                    pb = _cdf_ref(Hb, row, nx + 1.0, delta, G) - _cdf_ref(Hb, row, nx, delta, G)
                if pb <= 1e-12:
                    continue
                # the refresh chain of x: S[m] = the CPU's insertions between the refresh and t_j1
                M = 0
                acc = 1.0
                j = j1
                sacc = d1  # D_H(j, r) for the current chain step j
                jprev = j1
                while M < MAXM:
                    sj = _seg_of_ref(seg_off, seg_start, s1cap, j, x)
                    if j < jprev:  # the insertions in [j + 1, jprev] (distinct within the window (j, r))
                        for q in range(j + 1, jprev + 1):
                            if sess[q] != sr:
                                sacc += push[q] - (ov[q] if prev[q] > j else 0.0)
                        # requests after jprev whose previous request entered the window now
                        for q in range(jprev + 1, r):
                            if sess[q] != sr and j < prev[q] <= jprev:
                                sacc -= ov[q]
                        jprev = j
                    S[M] = sacc - d1
                    if sj < 0 or seg_row[sj] < 0 or seg_src[sj] < 0:
                        pi[M] = acc
                        M += 1
                        break
                    nl = N - seg_c0[sj] - (x - seg_start[sj])
                    q = _cdf_ref(Hb, seg_row[sj], nl, delta, G)
                    pi[M] = acc * (1.0 - q)
                    M += 1
                    acc *= q
                    if acc < 1e-9 or q <= 0.0:
                        break
                    j = seg_src[sj]
                for k in range(nC):
                    # a request stores at most C − 1 blocks (the CPU's free count; its own pinned batch cannot
                    # evict itself), head first: of j_1's prompt the CPU can hold [.., min(F_j1, C − 1)) only
                    Feff = min(float(Fj1), Cs[k] - 1.0)
                    gain = min(float(s1), Feff) - x
                    room = Cs[k] - 1.0 - Feff + x - ds  # κ·D_1 + S_m ≤ room
                    if room < 0.0 or gain <= 0.0:
                        continue
                    tot = 0.0
                    if x == s0:
                        for m in range(M):
                            t = (room - S[m]) / kap
                            if t > n0:
                                tot += pi[m] * (_cdf_ref(Hb, row, t, delta, G) - _cdf_ref(Hb, row, n0, delta, G))
                        out_h[r, k] += gain * tot
                    else:
                        d = n0 - (x - s0) + 1.0
                        for m in range(M):
                            if kap * d + S[m] <= room:
                                tot += pi[m]
                        out_h[r, k] += gain * pb * tot


def _simple_eager_hits_ref(u, table, c0, same, N: int, Cs: np.ndarray, use: np.ndarray, seg_keep: np.ndarray):
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
    _eager_kernel_ref(Hb, delta, seg_row, seg_c0, u.seg_off, u.seg_start, s1cap, u.seg_src, F, np.ones(u.n, np.bool_),
                  seg_same, float(N), np.zeros(0), F * 0.0, F * 0.0, u.prev, u.session, mean_D, out_g,
                  np.zeros((u.n, 0)))  # fmt: skip
    miss = np.maximum(F - out_g, 0.0)
    prev = u.prev.astype(np.int64)
    pp = np.maximum(prev, 0)
    # q's inserts [g_q, F_q) overlap its previous request's [g_p, F_p) on [max(g_q, g_p), F_p)
    ov0 = np.where(prev >= 0, np.maximum(np.minimum(F[pp], F) - np.maximum(out_g, out_g[pp]), 0.0), 0.0)
    sess = u.session.astype(np.int64)
    tot = float(F.sum())
    rho = 1.0 - float(out_g.sum()) / tot if tot else 1.0
    out_g2 = np.zeros(u.n)
    out_h = np.zeros((u.n, Cs.shape[0]))
    # insertions per request capped at C − 1 (the store cap): one kernel pass per distinct cap that binds
    top = float(miss.max()) if miss.size else 0.0
    cap = np.minimum(Cs.astype(np.float64) - 1.0, top)
    for cv in np.unique(cap):
        ks = np.flatnonzero(cap == cv)
        push = np.minimum(miss, cv)
        ov = np.minimum(ov0, push)
        g2 = np.zeros(u.n)
        h2 = np.zeros((u.n, ks.shape[0]))
        _eager_kernel_ref(Hb, delta, seg_row, seg_c0, u.seg_off, u.seg_start, s1cap, u.seg_src, F, use, seg_same,
                      float(N), Cs[ks].astype(np.float64), push, ov, prev, sess, mean_D, g2, h2)  # fmt: skip
        out_g2 = g2
        out_h[:, ks] = h2
    return out_g2, out_h, rho


# ---- equality ----------------------------------------------------------------------------------------------------
def _both(monkeypatch, *args, **kw):
    new = estimate_tiers(*args, tier="simple", **kw)
    with monkeypatch.context() as m:
        m.setattr(ts, "simple_eager_hits", _simple_eager_hits_ref)
        old = estimate_tiers(*args, tier="simple", **kw)
    return new, old


def _equal(new, old):
    for f in ("hit", "gpu_hit", "host_hit"):
        a, b = getattr(new, f), getattr(old, f)
        assert np.array_equal(a, b, equal_nan=True), (f, np.nanmax(np.abs(a - b)))


@pytest.mark.parametrize("lam0", [None, 1 / 60])
def test_weka_conversations_bit_for_bit(monkeypatch, lam0):
    tr = read_weka([str(p) for p in WEKA], arrival="uniform", span=3600, seed=0)
    u = request_reuse(tr)
    n_min = int(u.prompt_blocks.max())
    hbm = np.unique(np.geomspace(max(n_min // 2, 1), 4 * n_min, 6).astype(np.int64))  # below N_min too
    # store caps that bind (C − 1 below the largest miss: many groups) and hosts far beyond
    host = np.unique(np.concatenate([[0, 1, 2, 5], np.geomspace(8, 8 * n_min, 10).astype(np.int64)]))
    new, old = _both(monkeypatch, u, hbm, host, lam0=lam0)
    _equal(new, old)
    assert np.nanmax(new.host_hit) > 0  # the CPU adds something: the comparison is not of zeros
    meas = np.arange(u.n) % 3 != 0
    new, old = _both(monkeypatch, u, hbm[-2:], host, measured=meas)
    _equal(new, old)


def _table(rng, rows, G, delta):
    """``rows`` laws on ``G`` cells of width ``delta``: point masses, spreads, a tail past the grid."""
    Hb = np.zeros((rows, G + 1))
    for k in range(rows):
        kind = rng.integers(3)
        if kind == 0:
            pdf = np.zeros(G)
            pdf[rng.integers(G)] = 1.0
        elif kind == 1:
            pdf = rng.dirichlet(np.full(G, 0.3))
        else:
            pdf = rng.dirichlet(np.full(G, 1.0)) * 0.9  # 10 % beyond the grid
        Hb[k, 1:] = delta * np.cumsum(np.cumsum(pdf))
    return Hb


@st.composite
def _structures(draw):
    n = draw(st.integers(2, 14))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    sess = rng.integers(0, draw(st.integers(1, 4)), n)
    prev = np.full(n, -1, np.int64)
    last: dict = {}
    for r in range(n):
        prev[r] = last.get(int(sess[r]), -1)
        last[int(sess[r])] = r
    F = rng.integers(1, 12, n)
    cap = np.where(rng.random(n) < 0.5, F, np.maximum(F - 1, 0))
    segs = []
    for r in range(n):
        cuts = np.unique(np.concatenate([[0], rng.integers(0, F[r] + 1, rng.integers(0, 3)), [F[r]]]))
        out = []
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            if r > 0 and rng.random() < 0.8:
                out.append((int(a), int(b), int(rng.integers(0, r))))
        segs.append(out)
    off = np.concatenate([[0], np.cumsum([len(s) for s in segs])]).astype(np.int64)
    flat = [x for s in segs for x in s]
    u = SimpleNamespace(
        n=n,
        full_blocks=F.astype(np.int64),
        hit_cap=cap.astype(np.int64),
        session=sess.astype(np.int64),
        prev=prev,
        seg_off=off,
        seg_start=np.array([s[0] for s in flat], np.int64),
        seg_end=np.array([s[1] for s in flat], np.int64),
        seg_src=np.array([s[2] for s in flat], np.int64),
    )
    seg_req = np.repeat(np.arange(n), np.diff(off))
    keep = np.flatnonzero((np.minimum(u.seg_end, cap[seg_req]) > u.seg_start) & (u.seg_src >= 0))
    G = 32
    delta = float(draw(st.sampled_from([1.0, 0.75, 2.5])))
    nrows = int(rng.integers(1, 4))
    Hb = _table(rng, nrows, G, delta)
    rows = rng.integers(0, nrows, keep.size)
    c0 = rng.integers(1, 6, keep.size) + rng.random(keep.size) * (rng.random() < 0.5)
    same = rng.integers(0, 3, keep.size).astype(float)
    N = int(rng.integers(1, 60))
    Cs = np.unique(rng.integers(0, 90, int(rng.integers(1, 9))))
    use = rng.random(n) < 0.8
    return u, (Hb, delta, rows), c0, same, N, Cs, use, keep


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_structures())
def test_generated_structures_bit_for_bit(case):
    new = ts.simple_eager_hits(*case)
    old = _simple_eager_hits_ref(*case)
    for a, b in zip(new[:2], old[:2], strict=True):
        assert np.array_equal(a, b)
    assert new[2] == old[2]


def test_cdf_fast_path_is_the_interpolation():
    # beyond the grid the new _cdf skips _H's division; the value must be _H's
    rng = np.random.default_rng(3)
    for delta in (1.0, 0.3, 46.894287109375):
        Hb = _table(rng, 2, 64, delta)
        for z in np.concatenate([rng.uniform(0, 70 * delta, 2000), (64 + np.arange(-3, 4)) * delta]):
            ref = _H(Hb, 1, z + 1.0, delta, 64) - _H(Hb, 1, z, delta, 64)
            assert ts._cdf(Hb, 1, z, delta, 64) == ref
