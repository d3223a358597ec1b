"""Moments of the displacement D(t) over a tagged gap (Lemma D.1), in time near-linear in the trace.

For a conversation with accesses k = 0..M−1 at offsets 0 = s_0 ≤ s_1 ≤ … ≤ s_{M−1} from its first access,
new-block mass n_k and history mass h_k (:class:`kvhit.estimate.accounting.EngineAccounting`), arriving at time a, the
mass it moves ahead of a block tagged at time 0 during the window (0, t] is (Lemma D.1)

    Φ_t(a) = Σ_{f ≤ k ≤ l} n_k + h_{f−1}·1{f ≥ 1},

with f ≤ l its first and last access inside the window (Φ = 0 when no access falls inside). The estimator
needs Σ_i ∫ Φ_t^{(i)}(a) da and Σ_i ∫ Φ_t^{(i)}(a)² da at every t of a grid (Campbell's formula: the mean and
variance of D(t) per unit λ0).

Closed form (what :func:`phi_moments` computes). Write Φ = Σ_k n_k I_k + Σ_{f≥1} h_{f−1} J_f with
I_k(a) = 1{0 < a + s_k ≤ t} and J_f(a) = 1{a + s_{f−1} ≤ 0 < a + s_f ≤ t} (at most one J_f is 1 at a time,
and J_f I_k = 0 for k < f). With W_f = s_f − s_{f−1} and x₊ = max(x, 0), for t ≥ 0:

    ∫ I_k I_k' da = (t − |s_k − s_k'|)₊,      ∫ J_f da = t₊ − (t − W_f)₊,
    ∫ J_f I_k da = (t − (s_k − s_f))₊ − (t − (s_k − s_{f−1}))₊      (k ≥ f),

so ∫Φ = (Σ_k n_k) t + Σ_f h_{f−1} (t₊ − (t − W_f)₊) (Lemma D.4) and

    ∫Φ² = Σ_k n_k² t + 2 Σ_{k<k'} n_k n_k' (t − (s_k' − s_k))₊
          + 2 Σ_{f≥1} h_{f−1} Σ_{k≥f} n_k [(t − (s_k − s_f))₊ − (t − (s_k − s_{f−1}))₊]
          + Σ_{f≥1} h_{f−1}² [t₊ − (t − W_f)₊].

Both are sums of terms c·(t − e)₊ with e ≥ 0. A term with e ≥ max(t-grid) vanishes on the whole grid; the
others are binned by the first grid point above e and cumulated once: Σ_j c_j (t_i − e_j)₊ =
t_i·Σ_{e_j < t_i} c_j − Σ_{e_j < t_i} c_j e_j. The cost is O(P log G) for P surviving terms and G grid points
(P ≈ 1.5·Σ_i M_i² at worst, ≈ 7 per turn on the SCM of App. B.3) instead of O(G · Σ_i M_i log M_i) for the
segment-by-segment integration (:func:`phi_moments_reference`, kept as the independent reference the tests
compare against). A conversation whose surviving pair count would exceed 4·G·M is integrated segment by segment
(the same cost as before, exact either way), so the cost is never worse than the reference's.

Two segment-by-segment variants serve the estimators: :func:`_phi2_prefix_kernel` (∫Φ² of every admitted
prefix of a conversation, for :meth:`kvhit.estimate.accounting.EngineAccounting.admitted`) and
:func:`_phi_table_kernel` (∫Φ and ∫Φ² restricted to conversations that arrived after the system origin, for the
window-exact forms; it reuses the whole-segment sums for every origin cut below a conversation's first segment and
skips the segments that end before the cut — the same additions in the same order as
:func:`_phi_table_reference`, bit for bit, tested).

NOT modelled here: anything beyond the ingredients above (the estimator's Gaussian approximation of D(t) lives in
:mod:`kvhit.estimate.occupancy`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["phi_moments", "phi_moments_reference"]


@njit(cache=True)
def _bin(tg, e):  # pragma: no cover - numba
    """Index of the first grid point > e (G if none)."""
    lo = 0
    hi = tg.size
    while lo < hi:
        mid = (lo + hi) >> 1
        if tg[mid] <= e:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _segments_one(s, cum_new, hist, p0, M, tgrid, out_m, out_v):  # pragma: no cover - numba
    """∫Φ and ∫Φ² of one conversation at every t of ``tgrid`` by integrating Φ over its constant segments."""
    bp = np.empty(2 * M)
    for it in range(tgrid.size):
        t = tgrid[it]
        for k in range(M):
            bp[2 * k] = -s[k]
            bp[2 * k + 1] = t - s[k]
        bp.sort()
        lo_lim = -s[M - 1]
        acc_m = 0.0
        acc_v = 0.0
        for q in range(2 * M - 1):
            lo = max(bp[q], lo_lim)
            hi = min(bp[q + 1], t)
            if hi <= lo:
                continue
            am = 0.5 * (lo + hi)
            kl = np.searchsorted(s, t - am, side="right")  # accesses with a + s_k ≤ t
            kf = np.searchsorted(s, -am, side="right") + 1  # first access with a + s_k > 0
            if kf > kl:
                continue
            phi = cum_new[p0 + kl - 1]
            if kf >= 2:
                phi += hist[p0 + kf - 2] - cum_new[p0 + kf - 2]
            acc_m += phi * (hi - lo)
            acc_v += phi * phi * (hi - lo)
        out_m[it] += acc_m
        out_v[it] += acc_v


@njit(cache=True)
def phi_moments_reference(conv_ptr, offsets, cum_new, hist, tgrid, out_m, out_v):  # pragma: no cover - numba
    """Σ_i ∫Φ_t^{(i)} da and Σ_i ∫(Φ_t^{(i)})² da added to ``out_m``/``out_v`` for every t of ``tgrid`` (any
    order), by integrating Φ over its constant segments (breaks at −s_k and t − s_k): O(G·Σ M log M)."""
    for c in range(conv_ptr.size - 1):
        p0 = conv_ptr[c]
        p1 = conv_ptr[c + 1]
        _segments_one(offsets[p0:p1], cum_new, hist, p0, p1 - p0, tgrid, out_m, out_v)


@njit(cache=True)
def _terms_kernel(conv_ptr, offsets, cum_new, hist, tg, Cm, CEm, Cv, CEv, out_m, out_v):  # pragma: no cover
    G = tg.size
    tmax = tg[G - 1]
    for c in range(conv_ptr.size - 1):
        p0 = conv_ptr[c]
        p1 = conv_ptr[c + 1]
        M = p1 - p0
        if M == 0:
            continue
        s = offsets[p0:p1]
        # surviving pair count (s_k' − s_k < tmax), by two pointers: decide the method for this conversation
        npairs = 0
        lo = 0
        for k2 in range(M):
            while s[k2] - s[lo] >= tmax:
                lo += 1
            npairs += k2 - lo
        if npairs > 4 * G * M:
            _segments_one(s, cum_new, hist, p0, M, tg, out_m, out_v)
            continue
        sum_n = 0.0
        sum_n2 = 0.0
        for k in range(M):
            nk = cum_new[p0 + k] - (cum_new[p0 + k - 1] if k > 0 else 0.0)
            sum_n += nk
            sum_n2 += nk * nk
        Cm[0] += sum_n  # (Σ n_k)·t
        Cv[0] += sum_n2  # Σ n_k²·t
        for k in range(M):
            nk = cum_new[p0 + k] - (cum_new[p0 + k - 1] if k > 0 else 0.0)
            if nk != 0.0:
                for k2 in range(k + 1, M):
                    e = s[k2] - s[k]
                    if e >= tmax:
                        break
                    n2 = cum_new[p0 + k2] - cum_new[p0 + k2 - 1]
                    if n2 != 0.0:
                        b = _bin(tg, e)
                        w = 2.0 * nk * n2
                        Cv[b] += w
                        CEv[b] += w * e
        for f in range(1, M):
            h = hist[p0 + f - 1]
            if h == 0.0:
                continue
            Wf = s[f] - s[f - 1]
            # ∫J_f = t₊ − (t − W_f)₊
            Cm[0] += h
            Cv[0] += h * h
            if Wf < tmax:
                b = _bin(tg, Wf)
                Cm[b] -= h
                CEm[b] -= h * Wf
                Cv[b] -= h * h
                CEv[b] -= h * h * Wf
            # 2 h Σ_{k≥f} n_k [(t − (s_k − s_f))₊ − (t − (s_k − s_{f−1}))₊]
            for k in range(f, M):
                e1 = s[k] - s[f]
                if e1 >= tmax:
                    break
                nk = cum_new[p0 + k] - cum_new[p0 + k - 1]
                if nk == 0.0:
                    continue
                w = 2.0 * h * nk
                b = _bin(tg, e1)
                Cv[b] += w
                CEv[b] += w * e1
                e2 = s[k] - s[f - 1]
                if e2 < tmax:
                    b = _bin(tg, e2)
                    Cv[b] -= w
                    CEv[b] -= w * e2
    cm = 0.0
    cem = 0.0
    cv = 0.0
    cev = 0.0
    for i in range(G):
        cm += Cm[i]
        cem += CEm[i]
        cv += Cv[i]
        cev += CEv[i]
        t = tg[i]
        out_m[i] += cm * t - cem
        out_v[i] += cv * t - cev


def phi_moments(conv_ptr, offsets, cum_new, hist, tgrid) -> tuple[np.ndarray, np.ndarray]:
    """(Σ_i ∫Φ_t^{(i)} da, Σ_i ∫(Φ_t^{(i)})² da) at every t of ``tgrid`` (finite, ≥ 0, any order) by the
    closed form of the module docstring; equal to :func:`phi_moments_reference` up to rounding.

    ``conv_ptr`` (int64[L+1]) delimits each conversation's rows of ``offsets`` (time of access k since the
    conversation's first access, nondecreasing within a conversation), ``cum_new`` (within-conversation
    cumulative new-block mass) and ``hist`` (history mass after access k)."""
    t = np.asarray(tgrid, dtype=float).ravel()
    if t.size == 0:
        return np.zeros(0), np.zeros(0)
    u, inv = np.unique(t, return_inverse=True)
    G = u.size
    m = np.zeros(G)
    v = np.zeros(G)
    if u[-1] <= 0:  # a window of length 0 contains no access
        return m[inv.ravel()], v[inv.ravel()]
    Cm, CEm, Cv, CEv = (np.zeros(G + 1) for _ in range(4))
    _terms_kernel(
        np.asarray(conv_ptr, np.int64),
        np.asarray(offsets, float),
        np.asarray(cum_new, float),
        np.asarray(hist, float),
        u,
        Cm,
        CEm,
        Cv,
        CEv,
        m,
        v,
    )
    return m[inv.ravel()], v[inv.ravel()]


@njit(cache=True)
def _phi2_prefix_kernel(conv_ptr, offsets, cum_new, hist, tgrid, out_v):  # pragma: no cover - numba
    """out_v[p0 + J − 1, it] = ∫ Φ_t^{(i,J)}(a)² da for every conversation i (rows p0..p1−1) and every admitted
    prefix J = 1..M_i of its turns (the conversation truncated to its first J turns, as
    :meth:`kvhit.estimate.accounting.EngineAccounting.admitted` makes it): the same segments as
    :func:`phi_moments_reference`; on a segment with first/last in-window access
    k_f ≤ k_l the truncated Φ is 0 for J < k_f, hist[k_f − 1] − cum_new[k_f − 1] + cum_new[J]
    for k_f ≤ J < k_l and the full Φ for J ≥ k_l (a difference array)."""
    nconv = conv_ptr.size - 1
    for c in range(nconv):
        p0 = conv_ptr[c]
        p1 = conv_ptr[c + 1]
        M = p1 - p0
        s = offsets[p0:p1]
        bp = np.empty(2 * M)
        tail = np.zeros(M + 1)
        for it in range(tgrid.size):
            t = tgrid[it]
            for k in range(M):
                bp[2 * k] = -s[k]
                bp[2 * k + 1] = t - s[k]
            bp.sort()
            lo_lim = -s[M - 1]
            tail[:] = 0.0
            for q in range(2 * M - 1):
                lo = max(bp[q], lo_lim)
                hi = min(bp[q + 1], t)
                if hi <= lo:
                    continue
                am = 0.5 * (lo + hi)
                kl = np.searchsorted(s, t - am, side="right")
                kf = np.searchsorted(s, -am, side="right") + 1
                if kf > kl:
                    continue
                h0 = 0.0
                if kf >= 2:
                    h0 = hist[p0 + kf - 2] - cum_new[p0 + kf - 2]
                ln = hi - lo
                for J in range(kf, kl):
                    phi = h0 + cum_new[p0 + J - 1]
                    out_v[p0 + J - 1, it] += phi * phi * ln
                phi = h0 + cum_new[p0 + kl - 1]
                tail[kl] += phi * phi * ln
            run = 0.0
            for J in range(1, M + 1):
                run += tail[J]
                out_v[p0 + J - 1, it] += run


@njit(cache=True)
def _segments(s, M, t, p0, cum_new, hist, bp, seg_lo, seg_hi, seg_m, seg_v):  # pragma: no cover - numba
    """The segments of one conversation (offsets ``s``, ``M`` accesses, rows from ``p0``) at window ``t``, as
    :func:`_phi_table_kernel` and :func:`_phi_table_grouped` read them: ``seg_lo/seg_hi`` in ascending order, Φ
    (``seg_m``) and Φ² (``seg_v``) on each; returns their number. ``bp`` is scratch of size 2M."""
    # the breakpoints −s_k and t − s_k in ascending order: two descending runs in k, merged (the same values as
    # sorting them; only the order of equal values, ±0 at most, can differ, which no result reads)
    i0 = M - 1
    i1 = M - 1
    for k in range(2 * M):
        if i1 < 0 or (i0 >= 0 and -s[i0] <= t - s[i1]):
            bp[k] = -s[i0]
            i0 -= 1
        else:
            bp[k] = t - s[i1]
            i1 -= 1
    lo_lim = -s[M - 1]
    nseg = 0
    # kl = #{k: s_k ≤ t − am} and kf − 1 = #{k: s_k ≤ −am} (searchsorted, side right): both arguments fall as the
    # segment midpoint am rises, so two pointers walk down s
    cl = M
    cf = M
    for q in range(2 * M - 1):
        lo = max(bp[q], lo_lim)
        hi = min(bp[q + 1], t)
        if hi <= lo:
            continue
        am = 0.5 * (lo + hi)
        vl = t - am
        while cl > 0 and s[cl - 1] > vl:
            cl -= 1
        vf = -am
        while cf > 0 and s[cf - 1] > vf:
            cf -= 1
        kl = cl
        kf = cf + 1
        if kf > kl:
            continue
        phi = cum_new[p0 + kl - 1]
        if kf >= 2:
            phi += hist[p0 + kf - 2] - cum_new[p0 + kf - 2]
        seg_lo[nseg] = lo
        seg_hi[nseg] = hi
        seg_m[nseg] = phi
        seg_v[nseg] = phi * phi
        nseg += 1
    return nseg


@njit(cache=True)
def _phi_table_kernel(conv_ptr, offsets, cum_new, hist, tgrid, sgrid, out_m, out_v):  # pragma: no cover
    """out[it, is] += Σ_i ∫_{a > −s} Φ_t^{(i)}(a) (and Φ²) da: the background mass of conversations that
    arrived after the system origin, for a tagged access s seconds after the origin (see
    :func:`phi_moments_reference`)."""
    nconv = conv_ptr.size - 1
    ns = sgrid.size
    for c in range(nconv):
        p0 = conv_ptr[c]
        p1 = conv_ptr[c + 1]
        M = p1 - p0
        s = offsets[p0:p1]
        bp = np.empty(2 * M)
        seg_lo = np.empty(2 * M)
        seg_hi = np.empty(2 * M)
        seg_m = np.empty(2 * M)
        seg_v = np.empty(2 * M)
        for it in range(tgrid.size):
            t = tgrid[it]
            nseg = _segments(s, M, t, p0, cum_new, hist, bp, seg_lo, seg_hi, seg_m, seg_v)
            # the whole-segment sums: every s whose cut −s lies at or below the first segment's start (the
            # segments start in ascending order) adds exactly these, the same products in the same order
            fm = 0.0
            fv = 0.0
            for q in range(nseg):
                fm += seg_m[q] * (seg_hi[q] - seg_lo[q])
                fv += seg_v[q] * (seg_hi[q] - seg_lo[q])
            for js in range(ns):
                cut = -sgrid[js]
                if nseg == 0 or cut <= seg_lo[0]:
                    out_m[it, js] += fm
                    out_v[it, js] += fv
                    continue
                # segments ending at or before the cut add nothing (a prefix: their ends ascend too)
                q0 = np.searchsorted(seg_hi[:nseg], cut, side="right")
                am_ = 0.0
                av_ = 0.0
                for q in range(q0, nseg):
                    lo = max(seg_lo[q], cut)
                    if seg_hi[q] > lo:
                        am_ += seg_m[q] * (seg_hi[q] - lo)
                        av_ += seg_v[q] * (seg_hi[q] - lo)
                out_m[it, js] += am_
                out_v[it, js] += av_


@njit(cache=True)
def _phi_table_reference(conv_ptr, offsets, cum_new, hist, tgrid, sgrid, out_m, out_v):  # pragma: no cover
    """:func:`_phi_table_kernel` as first written (every segment at every s): the reference the tests compare the
    kernel with, bit for bit."""
    nconv = conv_ptr.size - 1
    ns = sgrid.size
    for c in range(nconv):
        p0 = conv_ptr[c]
        p1 = conv_ptr[c + 1]
        M = p1 - p0
        s = offsets[p0:p1]
        bp = np.empty(2 * M)
        seg_lo = np.empty(2 * M)
        seg_hi = np.empty(2 * M)
        seg_m = np.empty(2 * M)
        seg_v = np.empty(2 * M)
        for it in range(tgrid.size):
            t = tgrid[it]
            for k in range(M):
                bp[2 * k] = -s[k]
                bp[2 * k + 1] = t - s[k]
            bp.sort()
            lo_lim = -s[M - 1]
            nseg = 0
            for q in range(2 * M - 1):
                lo = max(bp[q], lo_lim)
                hi = min(bp[q + 1], t)
                if hi <= lo:
                    continue
                am = 0.5 * (lo + hi)
                kl = np.searchsorted(s, t - am, side="right")
                kf = np.searchsorted(s, -am, side="right") + 1
                if kf > kl:
                    continue
                phi = cum_new[p0 + kl - 1]
                if kf >= 2:
                    phi += hist[p0 + kf - 2] - cum_new[p0 + kf - 2]
                seg_lo[nseg] = lo
                seg_hi[nseg] = hi
                seg_m[nseg] = phi
                seg_v[nseg] = phi * phi
                nseg += 1
            for js in range(ns):
                cut = -sgrid[js]
                am_ = 0.0
                av_ = 0.0
                for q in range(nseg):
                    lo = max(seg_lo[q], cut)
                    if seg_hi[q] > lo:
                        am_ += seg_m[q] * (seg_hi[q] - lo)
                        av_ += seg_v[q] * (seg_hi[q] - lo)
                out_m[it, js] += am_
                out_v[it, js] += av_


@njit(cache=True)
def _phi_table_grouped(conv_ptr, offsets, cum_new, hist, tgrid, sgrid, out_m, out_v):  # pragma: no cover
    """:func:`_phi_table_kernel`'s table with its sums grouped (the same segments and the same Φ on them; only the
    order of the additions differs, so the result agrees to rounding, not bit for bit: tested to 1e-12 relative).

    Two regroupings. (1) A conversation adds its whole-segment sum to every column s whose cut −s lies at or below
    its first segment's start, a suffix of the ascending ``sgrid``: it is added once, to the suffix's first
    column of a per-t bucket row, and the buckets are summed cumulatively over s at the end (one addition per
    conversation and t instead of one per column). (2) Below that suffix, a column's sum is the cut segment's
    part plus the suffix sum of the whole segments after it (precomputed per conversation and t) instead of a
    loop over the segments. (3) The conversations of one access (offset 0; 45 % of the ShareGPT fleet fragments)
    each add Φ·t to every column: their Φ (and Φ²) are summed once and multiplied by t. ≈ 2.4× faster than the
    kernel on the ShareGPT fleet fragments (without (3))."""
    nconv = conv_ptr.size - 1
    ns = sgrid.size
    G = tgrid.size
    fast_m = np.zeros((G, ns))
    fast_v = np.zeros((G, ns))
    one_m = 0.0  # single-access conversations (offset 0): one segment [0, t] with Φ = cum_new, summed over them
    one_v = 0.0
    for c in range(nconv):
        p0 = conv_ptr[c]
        p1 = conv_ptr[c + 1]
        M = p1 - p0
        s = offsets[p0:p1]
        if M == 1 and s[0] == 0.0:
            one_m += cum_new[p0]
            one_v += cum_new[p0] * cum_new[p0]
            continue
        bp = np.empty(2 * M)
        seg_lo = np.empty(2 * M)
        seg_hi = np.empty(2 * M)
        seg_m = np.empty(2 * M)
        seg_v = np.empty(2 * M)
        suf_m = np.empty(2 * M + 1)
        suf_v = np.empty(2 * M + 1)
        for it in range(G):
            t = tgrid[it]
            nseg = _segments(s, M, t, p0, cum_new, hist, bp, seg_lo, seg_hi, seg_m, seg_v)
            if nseg == 0:
                continue
            suf_m[nseg] = 0.0
            suf_v[nseg] = 0.0
            for q in range(nseg - 1, -1, -1):
                ln = seg_hi[q] - seg_lo[q]
                suf_m[q] = suf_m[q + 1] + seg_m[q] * ln
                suf_v[q] = suf_v[q + 1] + seg_v[q] * ln
            # columns js ≥ j0 (−sgrid[js] ≤ first segment's start) take the whole sum: one bucket entry
            j0 = np.searchsorted(sgrid, -seg_lo[0], side="left")
            if j0 < ns:
                fast_m[it, j0] += suf_m[0]
                fast_v[it, j0] += suf_v[0]
            # columns below: the cuts −sgrid[js] descend with js, so the first segment ending after the cut moves down
            q0 = nseg
            for js in range(j0):
                cut = -sgrid[js]
                while q0 > 0 and seg_hi[q0 - 1] > cut:
                    q0 -= 1
                if q0 >= nseg:
                    continue
                ln = seg_hi[q0] - max(seg_lo[q0], cut)
                out_m[it, js] += seg_m[q0] * ln + suf_m[q0 + 1]
                out_v[it, js] += seg_v[q0] * ln + suf_v[q0 + 1]
    for it in range(G):
        rm = 0.0
        rv = 0.0
        if tgrid[it] > 0 and ns > 0:  # their whole segment reaches every column (its start −0 ≤ every cut)
            fast_m[it, 0] += one_m * tgrid[it]
            fast_v[it, 0] += one_v * tgrid[it]
        for js in range(ns):
            rm += fast_m[it, js]
            rv += fast_v[it, js]
            out_m[it, js] += rm
            out_v[it, js] += rv
