"""SGLang estimator for production block-id traces (Mooncake, WEKA): the agentic estimator
(:mod:`kvhit.estimate.agentic`, docs/estimators.md §4) with SGLang 0.5.23's accounting (§7).

The simulated model is :func:`kvhit.sim.sglang.streams.streams_from_production` driven through
:func:`kvhit.sim.sglang.radix.simulate_radix`: each full-block id is a run of ``b`` tokens, each request's partial
prompt tail and outputs are its own tokens (never reused). Changes against the vLLM form:

* units are **tokens** (the pool C, the displacement D, the hits);
* footprint of a request: everything it inserts, T + max(n, 1) − 1 tokens (prompt, own tail, cached outputs —
  the outputs are a leaf of their own that displaces like any other), and its new part
  T + max(n, 1) − 1 − b·L_own when its conversation's previous request is already in the window
  (``bunit = b`` in :func:`kvhit.estimate.agentic_displacement._poisson_table`);
* hit condition: whole nodes. A node [s, e) (tokens from the root) last touched by ``src`` at age a survives iff
  D_r(a) + e ≤ C; the hit is the end of the last surviving node, cut at SGLang's cap T_r − 1 (vLLM: block i
  survives iff D + i + 1 + e ≤ N, block by block);
* node boundaries: candidates are read from the ids (:func:`sglang_node_pieces`; chained ids name the whole
  prefix): after block i − 1 iff an earlier request's prompt ended there (its own tail and outputs branch off) or
  diverged there, and at every age-segment end. Which of them exist is decided by a recursion in arrival order
  (:func:`_replay_nodes`): a request's path keeps its source's boundaries up to its own hit, then its hit point
  and its prompt end — a miss re-inserts the rest of the history as *one* node, so the next revisit keeps or
  loses it whole (misses compound). The recursion runs on ``samples`` draws of the displacements and the hits
  are averaged: joint realizations of the background (each of the trace's other conversations once, started at
  a time drawn from the start-time density: a pool holds each conversation once, and consecutive windows must
  see the same background, or runs of misses are spread out), or with ``lam0`` independent draws from each
  request's compound Poisson law (one uniform per request: its segments' windows are nested);
* a request needing T + max(n, 1) − 1 tokens > C never runs: a miss (``infeasible`` below the largest);
* cost (issue 23 §6): the pool enters the recursion only through ``need ≤ C`` and ``D + e ≤ C`` and every
  boundary flag is monotone in C, so one pass per draw gives every piece the pool from which its tokens count
  (:func:`_curve_thresholds`); the joint background of every window is one sweep per draw
  (:func:`_joint_other_sweep`). Both give the per-pool, per-conversation sums exactly (tests).

Invariant: h ≤ h_max = Σ min(b·L_any, T − 1) / Σ T (every node survives); without background (λ0 → 0) and with
``form="replay"`` the recursion reproduces the simulator (tests: within 2e-3). NOT modelled: the cap's split of
a last block, holds, page sizes > 1, and what :mod:`kvhit.estimate.agentic` does not model; the stationary
form's independent draws lose the dependence between consecutive windows (docs/estimators.md §7).
"""

from __future__ import annotations

import math
import time as _time
from typing import Any

import numpy as np
from numba import njit

from kvhit.estimate.agentic import AgenticError, AgenticEstimate, _regime
from kvhit.estimate.agentic_displacement import _poisson_table, _window_D
from kvhit.estimate.agentic_footprint import _templates
from kvhit.workload.reuse import request_reuse

__all__ = ["sglang_node_pieces", "estimate_trace_sglang"]


@njit(cache=True)
def _pieces(
    ids, off, F, seg_off, seg_start, seg_end, seg_src, U, out_req, out_src, out_end, out_start, out_last
):  # pragma: no cover
    """Nodes of every request's reusable run (see the module docstring), in blocks; returns their number."""
    ended = np.zeros(U, np.bool_)
    multi = np.zeros(U, np.bool_)
    child = np.full(U, -1, np.int64)
    n = F.shape[0]
    k = 0
    for r in range(n):
        o = off[r]
        for sg in range(seg_off[r], seg_off[r + 1]):
            s = seg_start[sg]
            e = seg_end[sg]
            prev = s
            for i in range(s + 1, e + 1):
                cut = i == e
                if not cut:
                    x = ids[o + i - 1]
                    cut = ended[x] or multi[x] or child[x] != ids[o + i]
                if cut:
                    out_req[k] = r
                    out_src[k] = seg_src[sg]
                    out_end[k] = i
                    out_start[k] = prev
                    out_last[k] = i == e
                    k += 1
                    prev = i
        # the tree after r: its blocks as one path, its own tail/outputs branching off the last one
        for i in range(F[r]):
            x = ids[o + i]
            if i + 1 < F[r]:
                y = ids[o + i + 1]
                if child[x] == -1:
                    child[x] = y
                elif child[x] != y:
                    multi[x] = True
        if F[r] > 0:
            ended[ids[o + F[r] - 1]] = True
    return k


@njit(cache=True)
def _replay_nodes(ptr, src, end, last, ln, Dp, need, Fb, C, hit, flag):  # pragma: no cover - numba
    """One realization: requests in order; request q's candidate boundaries (its pieces, ``ptr``) are actual
    node ends iff they end an age segment or belong to the structure of the piece's source ``src`` — its
    kept boundaries up to its own hit, its hit point and its prompt end ``Fb`` (a miss re-inserts the rest as
    one node: the finer boundaries are gone). Node [·, x) survives iff Dp + x ≤ C; the hit is the end of the
    last surviving node (cut at the cap through ``ln``). ``flag[i]``: piece i is a boundary of its request's
    structure after it ran. Returns Σ hit tokens per request in ``hit``."""
    n = ptr.shape[0] - 1
    for q in range(n):
        a = ptr[q]
        z = ptr[q + 1]
        hit[q] = 0
        if need[q] > C:
            for i in range(a, z):
                flag[i] = False
            continue
        tot = 0
        hx = 0
        alive = True
        for i in range(a, z):
            s = src[i]
            x = end[i]
            isb = last[i] or x == Fb[s]
            if not isb:
                # is x a kept boundary of s? binary search in s's pieces (sorted by end)
                lo = ptr[s]
                hi = ptr[s + 1]
                while lo < hi:
                    mid = (lo + hi) // 2
                    if end[mid] < x:
                        lo = mid + 1
                    else:
                        hi = mid
                isb = lo < ptr[s + 1] and end[lo] == x and flag[lo]
            flag[i] = isb
            if not isb:
                continue
            if alive and Dp[i] + x <= C:
                hx = x
            else:
                alive = False
        # the hit: the pieces up to the last surviving node end (cut at the cap through ``ln``); what lies
        # beyond is re-inserted as one node, so only the boundaries up to the hit stay in the structure
        for i in range(a, z):
            if end[i] <= hx:
                tot += ln[i]
            elif flag[i]:
                flag[i] = False
        hit[q] = tot


@njit(cache=True)
def _piece_links(ptr, src, end, last, Fb):  # pragma: no cover - numba
    """What :func:`_replay_nodes` looks up for every piece, independent of the pool and the draw: ``fixed[i]``
    (the piece ends its age segment or its source's prompt: always a boundary) and ``match[i]``, the index of
    the source's piece that ends at the same place (its flag decides), or −1 (no such piece: never a
    boundary). Pieces of one request are sorted by ``end`` (segments are disjoint and in order)."""
    m = src.shape[0]
    fixed = np.zeros(m, np.bool_)
    match = np.full(m, -1, np.int64)
    for i in range(m):
        s = src[i]
        x = end[i]
        if last[i] or x == Fb[s]:
            fixed[i] = True
            continue
        lo = ptr[s]
        hi = ptr[s + 1]
        while lo < hi:
            mid = (lo + hi) // 2
            if end[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        if lo < ptr[s + 1] and end[lo] == x:
            match[i] = lo
    return fixed, match


@njit(cache=True)
def _segment_constant(ptr, last, Dp):  # pragma: no cover - numba
    """True iff every age segment's pieces share one displacement (NaN equal to NaN): what
    :func:`_curve_thresholds` assumes. Pieces of a segment are consecutive and end with ``last``."""
    for i in range(Dp.shape[0] - 1):
        if not last[i]:
            x = Dp[i]
            y = Dp[i + 1]
            if x != y and not (x != x and y != y):
                return False
    return True


@njit(cache=True)
def _flag_threshold(fixed, match, f, i):  # pragma: no cover - numba
    """b_i of :func:`_curve_thresholds`: −∞ for a fixed boundary, the flag threshold of its match, +∞ without."""
    if fixed[i]:
        return -np.inf
    if match[i] >= 0:
        return f[match[i]]
    return np.inf


@njit(cache=True)
def _curve_thresholds(ptr, end, ln, fixed, match, last, Dp, need, meas, Cs_sorted, cnt):  # pragma: no cover
    """:func:`_replay_nodes` at every pool at once for one draw ``Dp`` (constant over each age segment:
    :func:`_segment_constant`), by thresholds: adds to ``cnt[j]`` the hit tokens over the measured requests
    that first count at the pool ``Cs_sorted[j]`` (ascending), so that the cumulative sum of ``cnt`` is Σ hit
    tokens at each pool — the per-pool recursion's integer sums exactly.

    Why thresholds exist: the pool C enters the recursion only through the tests ``need ≤ C`` and
    ``Dp + x ≤ C``, and every flag (piece i is a node boundary of its request after it ran) is monotone in C.
    By induction in arrival order: piece i is present (a boundary) at C iff C ≥ b_i (−∞ when ``fixed``, the
    flag threshold of ``match[i]``, +∞ when it has no match). Present boundaries of one segment share Dp, so a
    failing one fails every later one in it, and the segment end is always present: request q is alive at its
    piece i iff C ≥ P_i = max(Dp + end over the earlier segments' ends, Dp_i + x_i). The hit reaches x_i iff
    some piece k ≥ i is present, alive and passes: C ≥ H_i = min_{k ≥ i} max(b_k, P_k, need_q); piece i's
    tokens count from H_i on, and its flag from f_i = max(b_i, need_q, H_i). A NaN displacement never passes
    (+∞)."""
    n = ptr.shape[0] - 1
    m = end.shape[0]
    f = np.empty(m)
    g = np.empty(m)
    inf = np.inf
    for q in range(n):
        a = ptr[q]
        z = ptr[q + 1]
        nq = float(need[q])
        pre = -inf
        for i in range(a, z):
            bi = _flag_threshold(fixed, match, f, i)
            v = Dp[i] + end[i]
            if v != v:
                v = inf
            P = pre if pre > v else v
            gi = bi if bi > P else P
            g[i] = gi if gi > nq else nq
            if last[i]:
                pre = P
        h = inf
        mq = meas[q]
        for i in range(z - 1, a - 1, -1):
            if g[i] < h:
                h = g[i]
            bi = _flag_threshold(fixed, match, f, i)
            fi = bi if bi > nq else nq
            f[i] = fi if fi > h else h
            if mq and ln[i] > 0 and h < inf:
                cnt[np.searchsorted(Cs_sorted, h, side="left")] += ln[i]


@njit(cache=True)
def _replay_curve(ptr, end, ln, fixed, match, Dp, need, meas, Cs, acc):  # pragma: no cover - numba
    """:func:`_replay_nodes` at every pool of ``Cs`` for one draw ``Dp``, with the lookups of
    :func:`_piece_links`; adds Σ hit tokens over the measured requests to ``acc[j]``. Every test of a node
    (``Dp + x ≤ C``, ``need ≤ C``) passes at every pool ≥ the largest ``Dp + end`` and ``need``, so the answer
    there is computed once and reused (the same sums, bit for bit)."""
    n = ptr.shape[0] - 1
    m = end.shape[0]
    flag = np.zeros(m, np.bool_)
    top = 0.0
    for i in range(m):
        v = Dp[i] + end[i]
        if v > top:
            top = v
        elif v != v:  # NaN: a test that never passes; no shortcut
            top = np.inf
            break
    for q in range(n):
        if need[q] > top:
            top = float(need[q])
    top_sum = -1.0
    for j in range(Cs.shape[0]):
        C = Cs[j]
        if C >= top and top_sum >= 0.0:
            acc[j] += top_sum
            continue
        tot_m = 0
        for q in range(n):
            a = ptr[q]
            z = ptr[q + 1]
            if need[q] > C:
                for i in range(a, z):
                    flag[i] = False
                continue
            hx = 0
            alive = True
            for i in range(a, z):
                x = end[i]
                isb = fixed[i]
                if not isb:
                    k = match[i]
                    isb = k >= 0 and flag[k]
                flag[i] = isb
                if not isb:
                    continue
                if alive and Dp[i] + x <= C:
                    hx = x
                else:
                    alive = False
            tot = 0
            for i in range(a, z):
                if end[i] <= hx:
                    tot += ln[i]
                elif flag[i]:
                    flag[i] = False
            if meas[q]:
                tot_m += tot
        acc[j] += float(tot_m)
        if C >= top:
            top_sum = float(tot_m)


def sglang_node_pieces(pt, u=None) -> dict:
    """Candidate nodes of every request's reusable run (the infinite tree read from the ids): ``req``, ``src``
    (last toucher), ``start``/``end`` (tokens), ``len`` (hit tokens, cut at T_r − 1), ``last`` (the piece ends
    its age segment: always a node boundary), ordered by request then position."""
    if u is None:
        u = request_reuse(pt)
    b = int(u.block_size)
    ids = np.unique(np.asarray(pt.hashes, np.int64), return_inverse=True)[1].astype(np.int64).reshape(-1)
    off = np.asarray(pt.hash_offsets, np.int64)
    m = int(u.seg_end.sum() - u.seg_start.sum()) + 1
    req = np.zeros(m, np.int64)
    src = np.zeros(m, np.int64)
    end = np.zeros(m, np.int64)
    start = np.zeros(m, np.int64)
    last = np.zeros(m, np.bool_)
    k = _pieces(
        ids,
        off,
        u.full_blocks,
        u.seg_off,
        u.seg_start,
        u.seg_end,
        u.seg_src,
        int(ids.max()) + 1 if ids.size else 1,
        req,
        src,
        end,
        start,
        last,
    )
    req, src, end, start, last = req[:k], src[:k], end[:k] * b, start[:k] * b, last[:k]
    cap = u.prompt_tokens[req] - 1
    ln = np.maximum(np.minimum(end, cap) - np.minimum(start, cap), 0)
    return {"req": req, "src": src, "start": start, "end": end, "len": ln, "last": last}


@njit(cache=True)
def _joint_other(
    seg_r, seg_s, time, tmpl_of_req, bg_start, bg_tmpl, max_dur, ts, te, tau, fx_first, cumnew, out
):  # pragma: no cover
    """D_other of each window (time[seg_s], time[seg_r]) from one realization of the background: conversation j
    of template ``bg_tmpl[j]`` started at ``bg_start[j]`` (sorted) contributes its footprint in the window (first
    request in it whole, later ones their new part: Lemma D.1's Φ); the tagged request's own template is left
    out (``tmpl_of_req``; −1: none). The slow reference of :func:`_joint_other_sweep` (tests pin the two
    equal)."""
    for i in range(seg_r.shape[0]):
        t1 = time[seg_s[i]]
        t2 = time[seg_r[i]]
        ex = tmpl_of_req[seg_r[i]]
        tot = 0.0
        j0 = np.searchsorted(bg_start, t1 - max_dur, side="left")
        j1 = np.searchsorted(bg_start, t2, side="left")
        for j in range(j0, j1):
            k = bg_tmpl[j]
            if k == ex:
                continue
            s0 = bg_start[j]
            a = ts[k]
            z = te[k]
            if tau[z - 1] <= t1 - s0:  # ended before the window: lo = z below, nothing added
                continue
            lo = a + np.searchsorted(tau[a:z], t1 - s0, side="right")
            hi = a + np.searchsorted(tau[a:z], t2 - s0, side="left")
            if hi > lo:
                tot += fx_first[lo] + cumnew[hi] - cumnew[lo + 1]
        out[i] = tot


@njit(cache=True)
def _joint_other_sweep(w_t1, w_t2, w_ex, w_ord, st, ts, te, tau, fx, nw, cn, out):  # pragma: no cover - numba
    """:func:`_joint_other` by one sweep: the background's requests at their absolute times A = start + τ
    (template k's conversation started at ``st[k]``). A window (t1, t2) holds Φ = Σ over the requests in it of
    their footprint ``fx`` less, for each that is not the first of its conversation in the window, its own
    reuse ``fx − nw`` (``nw``: the new part): the requests with t1 < A < t2 by a prefix sum over A sorted, the
    non-first ones — previous request of the conversation at A' > t1 and A < t2 — by a Fenwick tree over A's
    rank, filled in order of A' while the windows are taken by t1 descending (``w_ord``). The tagged
    request's own template (``w_ex``; −1: none) is subtracted: its requests in the window, first whole, the
    others their new part (``cn``: running sum of ``nw``). Integer token sums: exact. The window tests are on
    A (``start + τ > t1``) where :func:`_joint_other` tests ``τ > t1 − start``: the same but for a rounding
    tie."""
    C = ts.shape[0]
    P = tau.shape[0]
    A = np.empty(P)
    Ap = np.empty(P)
    for k in range(C):
        s0 = st[k]
        for i in range(ts[k], te[k]):
            A[i] = s0 + tau[i]
            Ap[i] = A[i - 1] if i > ts[k] else -np.inf
    oa = np.argsort(A)
    As = A[oa]
    rank = np.empty(P, np.int64)
    cfx = np.zeros(P + 1, np.int64)
    for r in range(P):
        rank[oa[r]] = r
        cfx[r + 1] = cfx[r] + fx[oa[r]]
    op = np.argsort(-Ap)
    fen = np.zeros(P + 1, np.int64)
    ptr = 0
    for wi in range(w_ord.shape[0]):
        w = w_ord[wi]
        t1 = w_t1[w]
        t2 = w_t2[w]
        while ptr < P and Ap[op[ptr]] > t1:
            p = op[ptr]
            j = rank[p] + 1
            v = fx[p] - nw[p]
            while j <= P:
                fen[j] += v
                j += j & (-j)
            ptr += 1
        i1 = np.searchsorted(As, t1, side="right")
        i2 = np.searchsorted(As, t2, side="left")
        tot = 0
        if i2 > i1:
            tot = cfx[i2] - cfx[i1]
            j = i2
            while j > 0:
                tot -= fen[j]
                j -= j & (-j)
            ex = w_ex[w]
            if ex >= 0:
                a = ts[ex]
                z = te[ex]
                lo = a + np.searchsorted(A[a:z], t1, side="right")
                hi = a + np.searchsorted(A[a:z], t2, side="left")
                if hi > lo:
                    tot -= fx[lo] + cn[hi] - cn[lo + 1]
        out[w] = float(tot)


def _joint_draws(u, sr, src, Fx, b, bins, samples, seed):
    """Displacements of every piece for ``samples`` joint realizations of the time-varying background: each of
    the trace's conversations once (the tagged one's own left out), its start drawn from the start-time
    histogram (``bins``, as :func:`kvhit.estimate.agentic_displacement._poisson_table`) — a pool holds each conversation
    once, and consecutive windows see the same realization (the dependence independent draws lose)."""
    n = u.n
    adm = np.ones(n, bool)
    same = np.zeros(sr.shape[0], np.int64)
    oth = np.zeros(sr.shape[0], np.int64)
    _window_D(sr, src, u.seg_src, u.seg_off, u.seg_end, Fx, u.session, adm, same, oth, b)
    ts, te, tau, fx_first, cumnew, t_first, t_sess = _templates(u, adm, Fx, b)
    C = ts.shape[0]
    tmpl_of = np.full(int(u.session.max()) + 1, -1, np.int64)
    tmpl_of[t_sess] = np.arange(C)
    tmpl_of_req = tmpl_of[u.session]
    nb = int(bins) if bins else int(np.clip(round(math.sqrt(C)), 1, 24))
    lo, hi = float(t_first.min()), float(t_first.max())
    cnt, edges = np.histogram(t_first, bins=nb, range=(lo, hi if hi > lo else lo + 1.0))
    # windows are per (request, source): compute once per distinct pair
    key = sr * (n + 1) + src
    uk, first_i, inv = np.unique(key, return_index=True, return_inverse=True)
    seg_r, seg_s = sr[first_i], src[first_i]
    w_t1, w_t2, w_ex = u.time[seg_s], u.time[seg_r], tmpl_of_req[seg_r].astype(np.int64)
    w_ord = np.argsort(-w_t1, kind="stable").astype(np.int64)
    # the footprints as whole token counts (exact in the doubles of _templates: < 2**53)
    fxi, cni = fx_first.astype(np.int64), cumnew.astype(np.int64)
    nwi = np.diff(cni)
    rng = np.random.default_rng(seed)
    out = np.zeros(uk.shape[0])
    for _ in range(samples):
        bins_ = rng.choice(nb, size=C, p=cnt / cnt.sum())
        st = rng.uniform(edges[bins_], edges[bins_ + 1])
        _joint_other_sweep(w_t1, w_t2, w_ex, w_ord, st, ts, te, tau, fxi, nwi, cni, out)
        yield same + out[inv.reshape(-1)]


def _quantile(cdf: np.ndarray, rows: np.ndarray, U: np.ndarray, delta: float) -> np.ndarray:
    """D at probability U from the tabulated CDF of each piece's cell (linear between grid points; beyond the
    grid: +∞, i.e. no node survives)."""
    out = np.full(U.shape[0], np.inf)
    G = cdf.shape[1]
    for r_ in np.unique(rows):
        sel = np.flatnonzero(rows == r_)
        c = cdf[r_]
        j = np.searchsorted(c, U[sel], side="left")
        ok = j < G
        jj = j[ok]
        lo = np.where(jj > 0, c[np.maximum(jj - 1, 0)], 0.0)
        hi = c[jj]
        fr = np.where(hi > lo, (U[sel][ok] - lo) / np.where(hi > lo, hi - lo, 1.0), 1.0)
        out[sel[ok]] = delta * (np.maximum(jj - 1, 0) + np.where(jj > 0, fr, 0.0))
    return out


def estimate_trace_sglang(
    pt: Any,
    Cs: Any,
    *,
    lam0: float | None = None,
    mask: Any = None,
    bins: int | None = None,
    n_values: int = 2048,
    n_ages: int = 16,
    n_times: int = 64,
    exclude: str | bool = "auto",
    work_budget: float = 6e7,
    reuse: Any = None,
    samples: int = 32,
    seed: int = 0,
    form: str = "poisson",
    background: str = "joint",
    curve_kernel: bool = True,
) -> AgenticEstimate:
    """Predicted SGLang token hit ratio of a production trace ``pt`` at pools ``Cs`` (tokens, page size 1, LRU);
    the law of D as :func:`kvhit.estimate.agentic.estimate_trace` (``form="poisson"``: the trace's own
    start-time intensity, or a stationary ``lam0``). ``mask``: the measured requests (arrival order).
    ``AgenticEstimate.N`` holds the pools in tokens and ``N_min`` the largest request (tokens). ``samples``
    displacement draws (stratified, ``seed``) feed the node recursion. ``form="replay"``: the displacement of
    every window read from the trace's own requests (:func:`kvhit.estimate.agentic_displacement._window_D`, the
    working-set identity; a check of the hit rule and the recursion, not a model: it needs the trace it predicts).
    ``background`` (time-varying form): ``"joint"`` (default) draws whole realizations of the background — each
    of the trace's other conversations once, its start from the start-time histogram — so that the windows of
    consecutive requests see the same realization; ``"marginal"`` draws each request's D independently from its
    cell's compound Poisson law (as the vLLM estimator's law tables). With ``lam0`` (stationary) the marginal
    laws are used. ``curve_kernel``: every pool at once per draw, by each piece's threshold pool
    (:func:`_curve_thresholds`; default; the same sums as the per-pool recursion, ``False``, bit for bit)."""
    t0 = _time.perf_counter()
    if form not in ("poisson", "replay"):
        raise AgenticError(f"form: expected 'poisson' or 'replay', got {form!r}")
    if form == "replay" and lam0 is not None:
        raise AgenticError("lam0: the replay form predicts the trace's own load; use form='poisson'")
    if background not in ("joint", "marginal"):
        raise AgenticError(f"background: expected 'joint' or 'marginal', got {background!r}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise AgenticError(f"samples: expected a positive integer, got {samples!r}")
    a = np.atleast_1d(np.asarray(Cs))
    if a.ndim != 1 or a.size == 0 or a.dtype.kind not in "iuf" or not np.all(np.isfinite(a)) or (a < 1).any():
        raise AgenticError("Cs: expected a non-empty 1-D sequence of pool sizes ≥ 1 token")
    if (a != np.round(a)).any():
        raise AgenticError("Cs: pool sizes must be whole numbers of tokens")
    Cs = a.astype(np.int64)
    if lam0 is not None:
        lam0 = float(lam0)
        if not (math.isfinite(lam0) and lam0 > 0):
            raise AgenticError(f"lam0: must be finite and > 0 (conversations/s), got {lam0!r}")
    u = reuse if reuse is not None else request_reuse(pt)
    n = u.n
    b = int(u.block_size)
    T = u.prompt_tokens.astype(np.int64)
    out = np.asarray(pt.output_tokens, np.int64)
    need = T + np.maximum(out, 1) - 1  # tokens held at once; also the request's whole insert (its footprint)
    Fx = need.copy()
    N_min = int(need.max()) if n else 0
    meas = np.ones(n, bool) if mask is None else np.asarray(mask)
    if meas.dtype != np.bool_ or meas.shape != (n,):
        raise AgenticError(f"mask: expected a boolean array of shape ({n},)")
    den = float(T[meas].sum())
    hit_inf = float(np.minimum(b * u.L_any, T - 1)[meas].sum())
    h_max = hit_inf / den if den else float("nan")
    pc = sglang_node_pieces(pt, u)
    notes: list[str] = []
    h = np.zeros(Cs.shape[0])
    nm = int(meas.sum())
    needm, Tm = need[meas], T[meas]
    o = np.argsort(needm, kind="stable")
    Tcum = np.concatenate([[0], np.cumsum(Tm[o])])
    kadm = np.searchsorted(needm[o], Cs, side="right")
    rej_req = 1.0 - kadm / nm if nm else np.zeros(Cs.shape[0])
    rej_tok = 1.0 - Tcum[kadm] / Tcum[-1] if nm and Tcum[-1] else np.zeros(Cs.shape[0])
    sr, src = pc["req"], pc["src"]
    if sr.size:
        ptr = np.searchsorted(sr, np.arange(n + 1)).astype(np.int64)
        Fb = (u.full_blocks * b).astype(np.int64)
        hit = np.zeros(n, np.int64)
        flag = np.zeros(sr.size, np.bool_)
        acc = np.zeros(Cs.shape[0])
        if form == "replay":
            same = np.zeros(sr.size, np.int64)
            other = np.zeros(sr.size, np.int64)
            _window_D(sr, src, u.seg_src, u.seg_off, u.seg_end, Fx, u.session, np.ones(n, bool), same, other, b)
            draws = [(same + other).astype(np.float64)]
        elif background == "joint" and lam0 is None:
            draws = _joint_draws(u, sr, src, Fx, b, bins, samples, seed)
        else:
            Hb, delta, rows, d_same = _poisson_table(
                u, sr, src, Fx, Cs, lam0, bins, n_values, n_ages, n_times, exclude, notes, work_budget, bunit=b
            )
            cdf = np.diff(Hb, axis=1) / delta  # P(D ≤ jδ) per cell
            rng = np.random.default_rng(seed)
            # one uniform per request and draw (its segments' displacements are nested windows: comonotone),
            # stratified: each request visits every 1/samples stratum once
            strata = np.argsort(rng.random((samples, n)), axis=0)
            U = (strata + rng.random((samples, n))) / samples
            draws = (d_same + _quantile(cdf, rows, U[k][sr], delta) for k in range(samples))
        n_draws = 0
        if curve_kernel:
            fixed, match = _piece_links(ptr, src, pc["end"], pc["last"], Fb)
            Cf = Cs.astype(np.float64)
            order = np.argsort(Cf, kind="stable")
            Cso = Cf[order]
            cnt = np.zeros(Cs.shape[0] + 1, np.int64)
            for Dp in draws:
                n_draws += 1
                if _segment_constant(ptr, pc["last"], Dp):
                    cnt[:] = 0
                    _curve_thresholds(ptr, pc["end"], pc["len"], fixed, match, pc["last"], Dp, need, meas, Cso, cnt)
                    acc[order] += np.cumsum(cnt[:-1]).astype(np.float64)
                else:  # not met by the draws above; the per-pool pass covers it
                    _replay_curve(ptr, pc["end"], pc["len"], fixed, match, Dp, need, meas, Cf, acc)
        else:  # the reference: one recursion per pool (tests pin the two equal)
            for Dp in draws:
                n_draws += 1
                for j, C_val in enumerate(Cs):
                    _replay_nodes(ptr, src, pc["end"], pc["last"], pc["len"], Dp, need, Fb, float(C_val), hit, flag)
                    acc[j] += float(hit[meas].sum())
        h = acc / n_draws / den if den else np.full(Cs.shape[0], np.nan)
    if n and Cs.max() < N_min:
        notes.append("every pool asked is below the largest request (infeasible)")
    return AgenticEstimate(
        N=Cs,
        h=h,
        h_max=float(h_max),
        infeasible=Cs < N_min,
        N_min=N_min,
        rejected_requests=rej_req,
        rejected_tokens=rej_tok,
        engine="sglang",
        metric="tokens",
        form=form,
        lam0=lam0,
        regime=_regime(u, lam0, form, notes),
        elapsed_s=_time.perf_counter() - t0,
    )
