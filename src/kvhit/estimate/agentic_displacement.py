"""The law of the displacement ``D_r(a)`` in the agentic estimator's hit condition (A1).

(A1) and the estimator built on this law: :mod:`kvhit.estimate.agentic`.

Two forms of ``D``:

``form="poisson"`` (the estimator; :func:`_poisson_table`). ``D_r(a) = D_same + D_other``: ``D_same`` the
deterministic footprint of the request's own session in the window (a WEKA sub-agent burst between two main-agent
turns); ``D_other`` the *exact* compound (marked) Poisson law of the other conversations' footprints — a
conversation started ``u`` seconds before ``t_r`` (intensity ``λ(t_r − u)``, template ``k`` uniform over the
trace's sessions) contributes ``f_k(u − a, u)``, the distinct blocks of its requests in the window (Lemma D.1's
``Φ``: each block at most once; :mod:`kvhit.estimate.agentic_footprint`). ``λ`` is the trace's own start-time
histogram (time-varying: the non-stationary pooled window) or, with ``lam0``, a stationary ``λ0`` (the
stationary stream the trace's conversations would make at that rate; Lemma D.1's Poisson random measure
with the discrete marks kept instead of eq. (15)'s Gaussian). The law is computed on a value grid by an
exponentially tilted FFT (no wrap-around, :func:`compound_poisson_cdf`), tabulated over ``(t, a)`` and
interpolated. The jump masses of the rows sharing an age (and excluded template) come from one sweep of the
conversations' windows (:func:`_levy_by_age`; :func:`_levy_kernel`, row by row, is the reference: equal to
rounding). Several tables on the same templates and value grid (the two-tier estimator's GPU and tail terms) can be
filled by the same sweeps (:func:`_poisson_tables`; equal to rounding to each built apart).

``form="replay"`` (the working-set identity; :func:`_window_D`): ``D_r(a)`` = ``Σ_{src<q<r} (F_q − k_q)`` from
the trace's own requests (``k_q`` = leading blocks of ``q`` already touched in the window), i.e. the trace's own
load ``T_C(t)`` at request granularity. It needs the very trace it predicts (no new λ0) and is near-exact by
construction; it is offered as the reference for the model's ingredients, not as a model.

Hot shared prefixes (a system prompt touched by many sessions) are segments whose ``src`` is another
session: their age is the trace's own (with ``lam0``: scaled by ``λ̂/λ0``, the characteristic-time rule that
a popular block's age scales inversely with the load).

Invariant: every row of the tabulated law is a distribution function on the value grid (the CDF of
:func:`compound_poisson_cdf` is non-decreasing and at most 1), so ``Hb[row]`` (δ times its running sum) is
non-decreasing from 0; the replay ``D`` is a whole count of ``Fx`` units over admitted requests only.

Not modelled: blocks of a shared segment re-touched inside the window are counted twice in ``D`` (an
over-estimate of ``D`` for deep shared segments only); the cache itself (the hit sums are
:mod:`kvhit.estimate.agentic`'s).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from kvhit.estimate.agentic_footprint import _footprint_table, _templates
from kvhit.estimate.startbins import start_bins

__all__ = ["compound_poisson_cdf"]


# --------------------------------------------------------------------------------------------------
# the compound Poisson law (tilted FFT)
# --------------------------------------------------------------------------------------------------


def _tilted_blocks(nu: np.ndarray, G: int):
    """The FFT steps of :func:`compound_poisson_cdf` (a generator): per block of rows ``[r0, r1)`` of the 2-D
    ``nu``, ``(r0, r1, g, tilt)`` with ``g = IDFT[exp(DFT(ν θ^j) − Λ)]`` (all ``M`` columns; ``g[:, x] / θ^x`` is
    P(D = x)). Rows are independent: blocks of ~2 MB of buffer (cache-resident; every row's arithmetic is the same
    as in one batch, bit for bit), the steps in place; one buffer for every block: columns ≥ J stay 0 (0·θ^j = 0
    exactly, so only [0, J) is tilted) and column 0 is never written, so each block's rows hold the same values as
    a fresh zeroed buffer, bit for bit. ``g`` is read before the next block is drawn."""
    M = 1 << int(math.ceil(math.log2(max(2 * G, 8))))
    J = nu.shape[1]
    theta = 10.0 ** (-9.0 / M)
    tilt = theta ** np.arange(M)
    P = nu.shape[0]
    step = max(1, (1 << 18) // M)
    buf_all = np.zeros((min(step, P), M))
    for r0 in range(0, P, step):
        r1 = min(P, r0 + step)
        buf = buf_all[: r1 - r0]
        buf[:, 1:J] = nu[r0:r1, 1:J]
        lam = buf.sum(axis=1, keepdims=True)
        buf[:, :J] *= tilt[:J]
        phi = np.fft.rfft(buf, axis=1)
        phi -= lam
        np.exp(phi, out=phi)
        yield r0, r1, np.fft.irfft(phi, n=M, axis=1), tilt


def compound_poisson_cdf(nu: np.ndarray, G: int) -> np.ndarray:
    """CDF on ``0..G−1`` of ``D = Σ_{k ≤ K} X_k``, ``K`` Poisson, jump masses ``nu[j] = E[#jumps of size j]``
    (``j ≥ 1``; ``nu[0]`` ignored; rows of a 2-D ``nu`` are independent laws). Jumps ``≥ G`` must be
    clamped to ``G`` by the caller (they only matter as "≥ G"). Exponential tilting ``θ^j`` with
    ``θ^M = 10⁻⁹`` (``M ≥ 2G`` the FFT size, a power of two) removes the FFT's wrap-around: the returned
    CDF is exact up to ~1e-9 relative (closed form: ``P(D = x) θ^x = IDFT[exp(DFT(ν θ^j) − Λ)]``)."""
    nu = np.atleast_2d(np.asarray(nu, np.float64))
    out = np.empty((nu.shape[0], G))
    for r0, r1, g, tilt in _tilted_blocks(nu, G):
        g = g[:, :G]
        g /= tilt[:G]
        np.maximum(g, 0.0, out=g)
        np.cumsum(g, axis=1, out=out[r0:r1])
    return np.minimum(out, 1.0, out=out)


def _cdf_running_sums(nu: np.ndarray, G: int, delta: float, Hb: np.ndarray, rows: np.ndarray) -> None:
    """``Hb[rows[i], 1:] = cumsum(compound_poisson_cdf(nu)[i] · δ)``: the law table's running sums, the CDF's
    clamps and both running sums in one compiled pass per row (:func:`_cdf_sums_kernel`) after the same FFT steps
    as :func:`compound_poisson_cdf` — the same operations in the same order, bit for bit."""
    for r0, r1, g, tilt in _tilted_blocks(np.atleast_2d(np.asarray(nu, np.float64)), G):
        _cdf_sums_kernel(g, tilt, G, float(delta), Hb, rows[r0:r1])


@njit(cache=True)
def _cdf_sums_kernel(g, tilt, G, delta, Hb, rows):  # pragma: no cover
    """Per row: ``v = max(g/θ^j, 0)`` (numpy's maximum: NaN kept, −0 → +0), ``c = min(Σ_{≤j} v, 1)`` and
    ``Hb[row, j + 1] = Σ_{≤j} c·δ`` — numpy's ``cumsum`` adds left to right from the first element."""
    for i in range(g.shape[0]):
        r = rows[i]
        s = 0.0
        h = 0.0
        for j in range(G):
            v = g[i, j] / tilt[j]
            if not (v > 0.0 or v != v):
                v = 0.0
            s = v if j == 0 else s + v
            c = s if (s < 1.0 or s != s) else 1.0
            d = c * delta
            h = d if j == 0 else h + d
            Hb[r, j + 1] = h


# --------------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------------


@njit(cache=True)
def _window_D(
    tag_req, tag_src, seg_src, seg_off, seg_end, Fx, session, adm, out_same, out_other, bunit=1
):  # pragma: no cover
    """Replay displacement of the tagged segments (request ``tag_req``, last toucher ``tag_src``): Σ over
    requests q strictly between src and r (admitted) of F_q + x_q − k_q, k_q = leading blocks of q whose last
    toucher is after src (from *all* segments: ``seg_src``/``seg_off``/``seg_end``); split into the tagged
    request's own session and the others. ``bunit``: units of ``Fx`` per block (b when Fx counts tokens:
    SGLang)."""
    for s in range(tag_req.shape[0]):
        r = tag_req[s]
        x = tag_src[s]
        sr = session[r]
        same = 0
        other = 0
        for q in range(x + 1, r):
            if not adm[q]:
                continue
            k = 0
            for j in range(seg_off[q], seg_off[q + 1]):
                if seg_src[j] > x:
                    k = seg_end[j]
                else:
                    break
            c = Fx[q] - bunit * k
            if session[q] == sr:
                same += c
            else:
                other += c
        out_same[s] = same
        out_other[s] = other


@njit(cache=True)
def _window_same(
    tag_req, tag_src, seg_src, seg_off, seg_end, Fx, session, s_off, s_req, out_same, bunit
):  # pragma: no cover
    """:func:`_window_D`'s ``out_same`` (every request admitted), walking only the tagged request's session:
    ``s_req[s_off[c]:s_off[c + 1]]`` its requests in arrival order. The same integer sum, in the same order."""
    for s in range(tag_req.shape[0]):
        r = tag_req[s]
        x = tag_src[s]
        sr = session[r]
        a = s_off[sr]
        b = s_off[sr + 1]
        i = a + np.searchsorted(s_req[a:b], x, side="right")
        same = 0
        while i < b and s_req[i] < r:
            q = s_req[i]
            k = 0
            for j in range(seg_off[q], seg_off[q + 1]):
                if seg_src[j] > x:
                    k = seg_end[j]
                else:
                    break
            same += Fx[q] - bunit * k
            i += 1
        out_same[s] = same


@njit(cache=True)
def _levy_kernel(
    t_start, t_end, tau, fx_first, cumnew, a_pts, t_pts, excl, s_grid, Lc, delta, G, scale, out, mom, foot, fbase
):  # pragma: no cover
    """Jump masses ν[p, j] of the other conversations' footprints over the window (t_p − a_p, t_p); template
    ``excl[p]`` (the tagged request's own conversation in a pool where each conversation occurs once) is left
    out (−1: none).

    Template k = requests t_start[k]:t_end[k] (relative times ``tau``, sorted); a conversation of template k
    started at s = t − u contributes f = fx_first[lo] + cumnew[hi] − cumnew[lo+1] over the requests with
    τ in (u − a, u); its weight is scale·∫ λ(t − u) du over the interval (``Lc``: cumulative intensity on
    the knots ``s_grid``, linear in between, constant outside). A jump of size f adds its weight to the two
    bins around f/δ in proportion (the mean is kept exactly); ``mom[p]`` accumulates Σw, Σw·f, Σw·f² (exact
    units); ``G = 0``: moments only. ``foot`` non-empty (``footprint="exact"``): f is read from the template's
    table instead, ``foot[fbase[k] + (lo − t_start[k])·(m + 1) + hi − t_start[k]]`` (``m`` its requests)."""
    nK = t_start.shape[0]
    for row in range(t_pts.shape[0]):
        t = t_pts[row]
        a = a_pts[row]
        if a <= 0.0:
            continue
        u_min = t - s_grid[s_grid.shape[0] - 1]  # λ(t − u) > 0 only for u in [u_min, u_max]
        u_max = t - s_grid[0]
        for k in range(nK):
            if k == excl[row]:
                continue
            i1 = t_end[k]
            # requests with τ ≤ u_min − a have left the window before u_min: start after them
            i0 = t_start[k] + np.searchsorted(tau[t_start[k] : i1], u_min - a, side="right")
            if i0 >= i1:
                continue
            pe = i0  # next enter event (tau[pe])
            pl = i0  # next leave event (tau[pl] + a)
            lo = i0
            hi = i0
            u_prev = tau[i0]
            c_prev = _cum(Lc, s_grid, t - u_prev)
            while (pe < i1 or pl < i1) and u_prev < u_max:
                if pe < i1 and tau[pe] <= tau[pl] + a:
                    u = tau[pe]
                else:
                    u = tau[pl] + a
                c_u = _cum(Lc, s_grid, t - u)
                if hi > lo and u > u_prev:
                    if foot.shape[0] > 0:
                        m1 = i1 - t_start[k] + 1
                        f = foot[fbase[k] + (lo - t_start[k]) * m1 + hi - t_start[k]]
                    else:
                        f = fx_first[lo] + cumnew[hi] - cumnew[lo + 1]
                    w = scale * (c_prev - c_u)
                    if w > 0.0:
                        mom[row, 0] += w
                        mom[row, 1] += w * f
                        mom[row, 2] += w * f * f
                        if G > 0:
                            x = f / delta
                            j = int(x)
                            if j >= G:
                                out[row, G] += w
                            else:
                                fr = x - j
                                out[row, j] += w * (1.0 - fr)
                                out[row, j + 1] += w * fr
                if pe < i1 and tau[pe] <= tau[pl] + a:
                    pe += 1
                    hi = pe
                else:
                    pl += 1
                    lo = pl
                u_prev = u
                c_prev = c_u


@njit(cache=True)
def _levy_by_age(
    t_start, t_end, tau, fx_first, cumnew, a, excl, t_rows, s_grid, Lc, delta, G, scale, out, orow, foot, fbase, W
):  # pragma: no cover
    """:func:`_levy_kernel`'s jump masses (``G > 0``) for rows that share one age ``a`` (``a > 0``) and excluded
    template ``excl`` (−1: none) at times ``t_rows``, with one sweep of the templates' windows for all of them.

    The windows (their intervals of ``u`` and footprints ``f``) depend on ``a`` only; a row's weight of an interval
    is ``scale·∫ λ(t − u) du`` over it, and ``λ`` is constant between the knots ``t − s_grid[i]``. So the
    intervals are cut at the union of every row's knots, the binned footprints accumulated per cut segment as
    ``length × split(f)``, and row ``t``'s masses are ``scale·Σ_i λ_i ×`` (the sum over the segments of its bin
    ``i``: added directly, or as a difference of prefix sums past :data:`DIRECT_CELLS`). The same sum as
    :func:`_levy_kernel` regrouped (``λ_i·Δu`` for ``Λ(t − u_prev) − Λ(t − u)``): equal to rounding
    (``tests/test_levy_by_age.py``).

    Row ``r``'s masses are added into ``out[orow[r]]`` (rows of ``out`` not shared between calls; ``out`` starts
    at 0). Only the value cells below ``W`` and the cell ``G`` are stored while sweeping (one conversation's
    footprints fill a few cells of the grid): the same additions in the same order as a full ``(·, G + 1)``
    array, bit for bit. Returns 0, or — when a footprint needs a cell in ``[W, G)`` — ``G`` with nothing written
    (the caller calls again with ``W = G``)."""
    nr = t_rows.shape[0]
    ns = s_grid.shape[0]
    kn = np.empty(nr * ns)
    for r in range(nr):
        for i in range(ns):
            kn[r * ns + i] = t_rows[r] - s_grid[i]
    kn = np.unique(kn)
    nk = kn.shape[0]
    u_lo = kn[0]
    u_hi = kn[nk - 1]
    # H[q + 1] accumulates segment q = [kn[q], kn[q + 1]]; then prefix sums: H[q] = Σ of the segments < q.
    # Value cells 0 … W − 1 in H, the cell G in HG
    W = max(1, min(W, G))
    H = np.zeros((nk, W))
    HG = np.zeros(nk)
    jhi = -1  # the highest value cell written below G (one conversation's footprints: a few cells of the grid)
    has_big = False
    nK = t_start.shape[0]
    for k in range(nK):
        if k == excl:
            continue
        i1 = t_end[k]
        k0 = t_start[k]
        if tau[i1 - 1] <= u_lo - a:  # every window of k closes before u_lo
            continue
        i0 = k0 + np.searchsorted(tau[k0:i1], u_lo - a, side="right")
        pe = i0
        pl = i0
        lo = i0
        hi = i0
        u_prev = tau[i0]
        qc = np.searchsorted(kn, max(u_prev, u_lo), side="right") - 1  # kn[qc] ≤ x0 < kn[qc + 1]: walked forward
        while (pe < i1 or pl < i1) and u_prev < u_hi:
            if pe < i1 and tau[pe] <= tau[pl] + a:
                u = tau[pe]
            else:
                u = tau[pl] + a
            if hi > lo and u > u_prev:
                x0 = max(u_prev, u_lo)
                x1 = min(u, u_hi)
                if x1 > x0:
                    if foot.shape[0] > 0:
                        m1 = i1 - k0 + 1
                        f = foot[fbase[k] + (lo - k0) * m1 + hi - k0]
                    else:
                        f = fx_first[lo] + cumnew[hi] - cumnew[lo + 1]
                    x = f / delta
                    j = int(x)
                    big = j >= G
                    if big:
                        has_big = True
                    elif j + 1 > jhi:
                        jhi = j + 1
                    fr = x - j
                    if not big and min(j + 2, G) > W:
                        return G  # a cell beyond the stored ones: the caller calls again with W = G
                    while qc + 1 < nk and kn[qc + 1] <= x0:
                        qc += 1
                    q = qc
                    while q < nk - 1 and kn[q] < x1:
                        d = min(x1, kn[q + 1]) - max(x0, kn[q])
                        if d > 0.0:
                            if big:
                                HG[q + 1] += d
                            else:
                                H[q + 1, j] += d * (1.0 - fr)
                                if j + 1 < G:
                                    H[q + 1, j + 1] += d * fr
                                else:
                                    HG[q + 1] += d * fr
                        q += 1
            if pe < i1 and tau[pe] <= tau[pl] + a:
                pe += 1
                hi = pe
            else:
                pl += 1
                lo = pl
            u_prev = u
    # only the written cells (the others stay 0: skipping them changes no sum). A bin's sum over its segments:
    # added directly where that is cheap (no cancellation); else as a difference of prefix sums (cancellation
    # ~1e-16 of the prefix total, amplified by a narrow bin's slope: harmless on the equal-width start bins)
    cols = np.arange(min(jhi, G) + 1)
    if has_big and (cols.shape[0] == 0 or cols[cols.shape[0] - 1] < G):
        cols = np.append(cols, G)
    nc = cols.shape[0]
    Hc = np.empty((nk, nc))  # the written cells: column ii is the value cell cols[ii]
    for ii in range(nc):
        if cols[ii] < G:
            Hc[:, ii] = H[:, cols[ii]]
        else:
            Hc[:, ii] = HG
    direct = nk * nc <= DIRECT_CELLS
    if not direct:
        for q in range(1, nk):
            for ii in range(nc):
                Hc[q, ii] += Hc[q - 1, ii]
    acc = np.zeros(nc)
    for r in range(nr):
        t = t_rows[r]
        for i in range(ns - 1):
            lam = (Lc[i + 1] - Lc[i]) / (s_grid[i + 1] - s_grid[i])
            if not lam > 0.0:
                continue
            qa = np.searchsorted(kn, t - s_grid[i + 1])
            qb = np.searchsorted(kn, t - s_grid[i])
            c = scale * lam
            if direct:
                acc[:] = 0.0
                for q in range(qa + 1, qb + 1):
                    for ii in range(nc):
                        acc[ii] += Hc[q, ii]
                for ii in range(nc):
                    out[orow[r], cols[ii]] += c * acc[ii]
            else:
                for ii in range(nc):
                    out[orow[r], cols[ii]] += c * (Hc[qb, ii] - Hc[qa, ii])
    return 0


#: :func:`_levy_by_age` sums a bin's segments directly up to this many (segment × value cell) terms per bin
DIRECT_CELLS = 1 << 16


@njit(cache=True)
def _cum(Lc, s_grid, s):  # pragma: no cover
    n = s_grid.shape[0]
    if s <= s_grid[0]:
        return Lc[0]
    if s >= s_grid[n - 1]:
        return Lc[n - 1]
    lo = 0
    hi = n - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if s_grid[mid] <= s:
            lo = mid
        else:
            hi = mid
    f = (s - s_grid[lo]) / (s_grid[hi] - s_grid[lo])
    return Lc[lo] + f * (Lc[hi] - Lc[lo])


# --------------------------------------------------------------------------------------------------
# the tabulated law
# --------------------------------------------------------------------------------------------------


def _unique_rows(k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(k, axis=0, return_inverse=True)`` for a 2-D float array without NaN (rows in lexicographic
    order, the inverse flat) by one ``lexsort``: the same arrays, ~4× faster than numpy's structured-row sort."""
    n = k.shape[0]
    if n == 0:
        return k[:0], np.zeros(0, np.int64)
    o = np.lexsort(k.T[::-1])
    srt = k[o]
    new = np.ones(n, bool)
    new[1:] = (srt[1:] != srt[:-1]).any(axis=1)
    inv = np.empty(n, np.int64)
    inv[o] = np.cumsum(new) - 1
    return srt[new], inv


def _template_classes(ts, te, tau, fx_first, cumnew) -> tuple[np.ndarray, int]:
    """Identical templates (length, times, first footprints, new blocks): ``rep[k]`` = the first template of ``k``'s
    class, and the number of classes. A cheap key that is a function of the signature (length, last time, first and
    last footprint, last new-block count) settles every template whose key no other template has (its own class);
    only the templates sharing a key are compared whole, in template order — the same classes and representatives
    as comparing every template."""
    C = ts.shape[0]
    rep = np.arange(C, dtype=np.int64)
    cn = np.diff(cumnew)
    cand = np.arange(C)
    if C:
        last = te - 1
        key = np.stack(
            [
                (te - ts).astype(np.float64),
                tau[last],
                fx_first[ts],
                fx_first[last],
                np.where(te - ts > 1, cn[last], 0.0),
            ],
            axis=1,
        )
        if np.isfinite(key).all():
            inv = _unique_rows(key)[1]
            cand = np.flatnonzero(np.bincount(inv)[inv] > 1)
    seen: dict = {}
    for k in cand:
        a_, b_ = int(ts[k]), int(te[k])
        sig = (b_ - a_, tau[a_:b_].tobytes(), fx_first[a_:b_].tobytes(), cn[a_ + 1 : b_].tobytes())
        rep[k] = seen.setdefault(sig, int(k))
    return rep, (C - cand.shape[0]) + len(seen)


def _split_hist(f: np.ndarray, delta: float, G: int) -> np.ndarray:
    """Counts of the values ``f`` on the grid ``jδ`` (a value between two knots split in proportion; ``≥ Gδ``
    clamped to ``G``), as the kernel bins jumps."""
    out = np.zeros(G + 1)
    x = np.asarray(f, np.float64) / delta
    j = np.floor(x).astype(np.int64)
    big = j >= G
    np.add.at(out, np.full(int(big.sum()), G), 1.0)
    j, fr = j[~big], (x - np.floor(x))[~big]
    np.add.at(out, j, 1.0 - fr)
    np.add.at(out, j + 1, fr)
    return out


def _poisson_prepare(
    u,
    sr,
    src,
    Fx,
    Ns,
    lam0,
    bins,
    n_values,
    n_ages,
    n_times,
    exclude,
    notes,
    work_budget=6e7,
    bunit=1,
    footprint="own",
    bin_rule="sqrt",
):
    """The cells, value grid and marks of :func:`_poisson_table` (all but the law's rows: :func:`_poisson_finish`).

    The table (:func:`_poisson_finish`) is ``(Hb, delta, row, D_same)``: ``Hb[row]`` = δ·cumulative CDF on the value
    grid of the segment's cell. Cells: ``n_times`` uniform time bins × log-age bins of ratio ``1 + 1/n_ages`` (× the
    tagged conversation when its own template is excluded); the law is computed exactly at each occupied cell's
    centre (nearest cell: no interpolation across a lumpy law). ``bunit``: units of ``Fx`` (and of ``Ns``) per block
    (1: blocks, vLLM; b: tokens, :mod:`kvhit.estimate.sglang_agentic`)."""
    n = u.n
    adm = np.ones(n, bool)
    same = np.zeros(sr.shape[0], np.int64)
    if sr.shape[0]:
        # _window_D's own-session part, over the session's requests only (D_other is the law's)
        s_req = np.argsort(u.session, kind="stable")
        s_off = np.zeros(int(u.session.max()) + 2, np.int64)
        np.cumsum(np.bincount(u.session, minlength=s_off.shape[0] - 1), out=s_off[1:])
        _window_same(sr, src, u.seg_src, u.seg_off, u.seg_end, Fx, u.session, s_off, s_req, same, bunit)
    t_r = u.time[sr]
    age = t_r - u.time[src]
    other_sess = u.session[src] != u.session[sr]
    ts, te, tau, fx_first, cumnew, t_first, t_sess = _templates(u, adm, Fx, bunit)
    C = ts.shape[0]
    foot, fbase = np.zeros(0), np.zeros(0, np.int64)
    if footprint == "exact":
        ft = _footprint_table(u, adm, Fx, bunit)
        if ft is None:
            notes.append("info: footprint table too large; the 'own' footprint is used")
        else:
            foot, fbase = ft
    span_starts = float(t_first.max() - t_first.min()) if C else 0.0
    if lam0 is not None:
        # stationary: constant intensity; ages of hot shared segments scale as 1/λ (characteristic time)
        lam_hat = (C - 1) / span_starts if span_starts > 0 and C > 1 else lam0
        age = np.where(other_sess, age * lam_hat / lam0, age)
        t_eval = np.zeros_like(t_r)
        lo = -float((tau.max() if tau.size else 0.0) + (age.max() if age.size else 0.0) + 1.0)
        s_grid = np.array([lo, 1.0])
        Lc = np.array([0.0, lam0 * (1.0 - lo)])
        scale = 1.0 / C if C else 0.0
        excl = np.full(sr.shape[0], -1, np.int64)
    else:
        nb = int(bins) if bins else (start_bins(t_first, bin_rule) if C else 1)
        lo, hi = (float(t_first.min()), float(t_first.max())) if C else (0.0, 1.0)
        if hi <= lo:
            hi = lo + 1.0
        cnt, edges = np.histogram(t_first, bins=nb, range=(lo, hi))
        s_grid = edges
        Lc = np.concatenate([[0.0], np.cumsum(cnt).astype(np.float64)])
        scale = 1.0 / C if C else 0.0
        # the others are the C − 1 other conversations: leave the tagged one's template out of the marks.
        # Identical templates (copies of one conversation in a resampled stream) form one class, and leaving
        # out any copy is the same, so cells are keyed by the class's first template; with more than 64
        # classes the Palm factor (C − 1)/C is used instead (``exclude="auto"``)
        rep, n_classes = _template_classes(ts, te, tau, fx_first, cumnew)
        excl_on = n_classes <= 64 if exclude == "auto" else bool(exclude)
        tmpl_of = np.full(int(u.session.max()) + 1 if n else 1, -1, np.int64)
        tmpl_of[t_sess] = rep
        if excl_on:
            excl = tmpl_of[u.session[sr]]
        else:
            excl = np.full(sr.shape[0], -1, np.int64)
            scale = (C - 1) / C / C if C > 1 else 0.0
        # time cells: quantiles of the tagged requests' times (dense where the requests are), evaluated at the
        # cell's median request time; halved until (occupied cells × requests of multi-request conversations)
        # fits the work budget of the Lévy sweep
        qa = math.log1p(1.0 / max(int(n_ages), 1))
        la_ = np.where(age > 0, np.round(np.log(np.maximum(age, 1e-9)) / qa), -(10**9))
        n_multi = max(int((te - ts)[(te - ts) > 1].sum()), 1)
        nt = max(int(n_times), 1)
        t_eval = t_r.copy()
        while t_r.size:
            edges_t = np.unique(np.quantile(t_r, np.linspace(0.0, 1.0, nt + 1)))
            ti = np.clip(np.searchsorted(edges_t, t_r, side="right") - 1, 0, max(edges_t.shape[0] - 2, 0))
            cnt_t = np.bincount(ti)
            med = np.zeros(cnt_t.shape[0])
            o_t = np.lexsort((t_r, ti))
            starts_t = np.concatenate([[0], np.cumsum(cnt_t)[:-1]])
            ok_t = cnt_t > 0
            med[ok_t] = t_r[o_t][starts_t[ok_t] + (cnt_t[ok_t] - 1) // 2]  # lower median (a request time)
            t_eval = med[ti]
            n_cells = _unique_rows(np.stack([t_eval, la_, excl.astype(np.float64)], axis=1))[0].shape[0]
            if n_cells * n_multi <= work_budget or nt <= 4:
                break
            nt = max(4, nt // 2)
        if nt < int(n_times):
            notes.append(f"info: time cells reduced to {nt} (work budget)")
    q = math.log1p(1.0 / max(int(n_ages), 1))
    la = np.where(age > 0, np.round(np.log(np.maximum(age, 1e-9)) / q), -(10**9)).astype(np.int64)
    a_eval = np.where(age > 0, np.exp(la * q), 0.0)
    key = np.stack([t_eval, a_eval, excl.astype(np.float64)], axis=1)
    cells, row = _unique_rows(key)
    row = row.reshape(-1).astype(np.int64)
    P = cells.shape[0]
    a_c = cells[:, 1].copy()
    t_c = cells[:, 0].copy()
    x_c = cells[:, 2].astype(np.int64)
    # one-request conversations (most of a production trace) in closed form: footprint F over u ∈ (0, a),
    # weight scale·(Λ(t) − Λ(t − a)); the others through the kernel
    single = (te - ts) == 1
    F1 = fx_first[ts[single]]
    w1 = scale * (np.interp(t_c, s_grid, Lc) - np.interp(t_c - a_c, s_grid, Lc))
    excl_single = np.zeros(P)  # the excluded template's own footprint when it is a one-request one
    if C:
        ex = (x_c >= 0) & single[np.maximum(x_c, 0)]
        excl_single[ex] = fx_first[ts[x_c[ex]]]
    multi = np.flatnonzero(~single)
    remap = np.full(C + 1, -1, np.int64)
    remap[multi] = np.arange(multi.shape[0])
    x_m = np.where(x_c >= 0, remap[np.maximum(x_c, 0)], -1)
    ts_m, te_m = ts[multi], te[multi]
    # moments at the oldest cell of every (time, excluded) group (D grows with the age: an upper bound)
    grp = _unique_rows(np.stack([t_c, x_c.astype(np.float64)], axis=1))[1]
    oldest = np.full(int(grp.max()) + 1 if P else 0, -1, np.int64)
    order_a = np.argsort(a_c, kind="stable")
    oldest[grp[order_a]] = order_a  # last write wins: the largest age of each group
    mom = np.zeros((oldest.shape[0], 3))
    if C and P:
        _levy_kernel(
            ts,
            te,
            tau,
            fx_first,
            cumnew,
            a_c[oldest],
            t_c[oldest],
            x_c[oldest],
            s_grid,
            Lc,
            1.0,
            0,
            scale,
            np.zeros((1, 1)),
            mom,
            foot,
            fbase,
        )
    # value range: the largest N asked, or where every segment's last block fits even when D is 12 sd above
    # its mean (beyond it CDF = 1 to ~1e-30; a finer grid where it matters)
    sd = np.sqrt(mom[:, 2])
    d_hi = float(
        np.max(mom[:, 1] + 12.0 * sd + 12.0 * np.sqrt(np.maximum(mom[:, 2] / np.maximum(mom[:, 0], 1e-300), 0.0)))
    )
    big = (
        float(u.prompt_blocks.max()) * bunit
        if bunit == 1
        else max(float(u.prompt_blocks.max()) * bunit, float(Fx.max()))
    )
    fit = float(np.max(same) if same.size else 0.0) + big + 2.0
    Vmax = int(min(int(Ns.max()) + 1, math.ceil(fit + d_hi)))
    Vmax = max(Vmax, 2)
    G = int(min(n_values, Vmax))
    delta = Vmax / G
    fb_m = fbase[multi] if foot.shape[0] else fbase
    return {
        "P": P, "G": G, "delta": delta, "row": row, "same": same, "a_c": a_c, "t_c": t_c, "x_c": x_c, "x_m": x_m,
        "multi": multi, "ts_m": ts_m, "te_m": te_m, "tau": tau, "fx_first": fx_first, "cumnew": cumnew,
        "s_grid": s_grid, "Lc": Lc, "scale": scale, "foot": foot, "fb_m": fb_m, "F1": F1, "w1": w1,
        "excl_single": excl_single,
    }  # fmt: skip


def _poisson_finish(states: list) -> list:
    """The law tables ``(Hb, delta, row, D_same)`` of prepared cells (:func:`_poisson_prepare`). Several states
    on the same templates and value grid (:func:`_shareable`) are filled together: their rows' Lévy masses come
    from one sweep per (age, excluded template) over all their rows (:func:`_levy_by_age` with every row's knots,
    so a bin's sum is cut at more points: equal to rounding, not bit for bit); one state is today's table."""
    st = states[0]
    G, delta = st["G"], st["delta"]

    def cat(k):
        return np.concatenate([x[k] for x in states]) if len(states) > 1 else st[k]

    a_c, t_c, x_c, x_m, w1, excl_single = (cat(k) for k in ("a_c", "t_c", "x_c", "x_m", "w1", "excl_single"))
    own = np.concatenate([np.full(x["P"], i, np.int64) for i, x in enumerate(states)])
    loc = np.concatenate([np.arange(x["P"], dtype=np.int64) for x in states])
    P = own.shape[0]
    multi, F1, foot = st["multi"], st["F1"], st["foot"]
    Hbs = [np.zeros((x["P"], G + 1)) for x in states]
    hist1 = _split_hist(F1, delta, G)
    chunk = max(1, (1 << 22) // (4 * G))
    # rows in (age, excluded template) order, so that the rows of one group (one sweep of the windows,
    # _levy_by_age) share a chunk
    perm = np.lexsort((t_c, x_c, a_c)) if LEVY_BY_AGE else np.arange(P)
    dup = np.zeros(0, np.int64)
    if len(states) > 1:
        # a cell of several tables (the same (t, a, x)) is computed once, its row copied: its masses come from the
        # same sweep with the same knots (the duplicates add none), so the copies are its own bits
        key = np.stack([a_c, t_c, x_c.astype(np.float64)], axis=1)[perm]
        same_prev = np.zeros(P, bool)
        same_prev[1:] = (key[1:] == key[:-1]).all(axis=1)
        first = perm[np.maximum.accumulate(np.where(same_prev, 0, np.arange(P)))]
        dup = np.stack([perm[same_prev], first[same_prev]], axis=1)
        perm = perm[~same_prev]
        P = perm.shape[0]
    zero_cdf = None
    for c_lo in range(0, P, chunk):
        idx = perm[c_lo : min(P, c_lo + chunk)]
        nu = np.zeros((idx.shape[0], G + 1))
        if multi.size:
            _levy_rows(st["ts_m"], st["te_m"], st["tau"], st["fx_first"], st["cumnew"], a_c[idx], t_c[idx], x_m[idx],
                       st["s_grid"], st["Lc"], delta, G, st["scale"], nu, foot, st["fb_m"])  # fmt: skip
        if F1.size:
            nu += w1[idx, None] * hist1[None, :]
            xs = excl_single[idx]
            for r_ in np.flatnonzero(xs > 0):
                nu[r_] -= w1[idx[r_]] * _split_hist(np.array([xs[r_]]), delta, G)
            np.maximum(nu, 0.0, out=nu)
        # rows without jumps (age 0) all have the law of ν = 0: its running sums computed once (a row's CDF is
        # the same bits alone as in any batch, test_compound_poisson_rows_bit_for_bit_in_any_batch)
        z = ~nu[:, 1:].any(axis=1)
        one = len(states) == 1
        hb = Hbs[0] if one else np.zeros((idx.shape[0], G + 1))  # one table: its rows written in place
        at = idx if one else np.arange(idx.shape[0])
        if z.any():
            _cdf_running_sums(nu[~z], G, delta, hb, at[~z])
            if zero_cdf is None:
                zero_cdf = np.zeros((1, G + 1))
                _cdf_running_sums(np.zeros((1, G + 1)), G, delta, zero_cdf, np.zeros(1, np.int64))
            hb[at[z]] = zero_cdf[0]
        else:
            _cdf_running_sums(nu, G, delta, hb, at)
        if not one:
            for i in range(len(states)):
                m = own[idx] == i
                Hbs[i][loc[idx[m]]] = hb[m]
    for j, f in dup:
        Hbs[own[j]][loc[j]] = Hbs[own[f]][loc[f]]
    return [(Hb, delta, x["row"], x["same"]) for Hb, x in zip(Hbs, states, strict=True)]


def _poisson_table(*args, **kw):
    """Law of D_other at every segment's (t, a) cell and the deterministic own-session part D_same
    (:func:`_poisson_prepare`'s arguments; returns ``(Hb, delta, row, D_same)``)."""
    return _poisson_finish([_poisson_prepare(*args, **kw)])[0]


_SHARED_KEYS = ("ts_m", "te_m", "tau", "fx_first", "cumnew", "s_grid", "Lc", "foot", "fb_m", "F1", "multi")


def _shareable(states: list) -> bool:
    """States whose Lévy masses one sweep can give: the same templates, intensity, value grid and scale."""
    s0 = states[0]
    return LEVY_BY_AGE and all(
        x["G"] == s0["G"]
        and x["delta"] == s0["delta"]
        and x["scale"] == s0["scale"]
        and all(np.array_equal(x[k], s0[k]) for k in _SHARED_KEYS)
        for x in states[1:]
    )


def _poisson_tables(calls: list) -> list:
    """:func:`_poisson_table` of several ``(args, kwargs)`` calls, filled together where :func:`_shareable`
    (e.g. the two-tier estimator's GPU table and its tail table: the same conversations, other segments)."""
    states = [_poisson_prepare(*a, **k) for a, k in calls]
    if len(states) > 1 and _shareable(states):
        return _poisson_finish(states)
    return [_poisson_finish([x])[0] for x in states]


#: the Lévy masses by one sweep per (age, excluded template) (:func:`_levy_by_age`); False: the per-row sweep
#: :func:`_levy_kernel` (the reference, equal to rounding)
LEVY_BY_AGE = True


def _cell_bound(ts, te, fx_first, cumnew, foot, delta, G) -> int:
    """Value cells ``0 … W − 1`` hold every binned footprint when the footprints are non-negative counts:
    ``f ≤ max fx_first + max_k (cumnew[te_k] − cumnew[ts_k + 1])`` (own; the new blocks are ≥ 0) or ``max foot``
    (exact); ``W = ⌊f_max/δ⌋ + 2``, at most ``G``. Only a hint: :func:`_levy_by_age` checks every cell."""
    if foot.shape[0]:
        fmax = float(foot.max())
    elif ts.shape[0]:
        fmax = float(fx_first.max()) + max(float((cumnew[te] - cumnew[np.minimum(ts + 1, te)]).max()), 0.0)
    else:
        return 1
    if not math.isfinite(fmax) or fmax < 0:
        return G
    return int(min(G, math.floor(fmax / delta) + 2))


def _levy_rows(ts, te, tau, fx_first, cumnew, a, t, x, s_grid, Lc, delta, G, scale, nu, foot, fbase):
    """Jump masses of the rows ``(t, a, x)`` into ``nu``: by groups of equal age and excluded template through
    :func:`_levy_by_age` (with :data:`LEVY_BY_AGE`; else row by row through :func:`_levy_kernel`). Rows with
    ``a ≤ 0`` stay 0 (as in :func:`_levy_kernel`). ``nu`` holds zeros on entry (the masses are added)."""
    if not LEVY_BY_AGE:
        _levy_kernel(ts, te, tau, fx_first, cumnew, a, t, x, s_grid, Lc, delta, G, scale, nu,
                     np.zeros((a.shape[0], 3)), foot, fbase)  # fmt: skip
        return
    grp = np.flatnonzero(a > 0)
    if not grp.size:
        return
    grp = grp[np.lexsort((t[grp], x[grp], a[grp]))]
    ag, xg = a[grp], x[grp]
    cut = np.flatnonzero((np.diff(ag) != 0) | (np.diff(xg) != 0)) + 1
    # the value cells a footprint can reach (f ≤ the largest window footprint of any template; a bound that
    # is too small only costs a second sweep): the sweep stores cells below W and the cell G only
    W = _cell_bound(ts, te, fx_first, cumnew, foot, delta, G)
    for g in np.split(np.arange(grp.size), cut):
        rows = grp[g]
        args = (ts, te, tau, fx_first, cumnew, float(ag[g[0]]), int(xg[g[0]]), t[rows], s_grid, Lc, delta, G, scale,
                nu, rows, foot, fbase)  # fmt: skip
        if _levy_by_age(*args, W):
            _levy_by_age(*args, G)
