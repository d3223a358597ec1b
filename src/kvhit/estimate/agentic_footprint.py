"""A background conversation's footprint over a window: the agentic estimator's marks (Lemma D.1's ``Φ``).

The compound Poisson law of :mod:`kvhit.estimate.agentic_displacement` draws the other conversations from the
trace's sessions taken as *templates* (:func:`_templates`: each session's admitted requests in arrival order,
their times relative to its first request, the first request's footprint and the running sum of new blocks).
A conversation of template ``k`` whose requests ``lo … hi−1`` fall in the window adds ``f_k(lo, hi)`` distinct
blocks to ``D``. ``footprint="exact"`` counts them exactly (:func:`_footprint_table`, a table per template over
its request windows); ``"own"`` (first request whole, later ones their growth ``F_q − L_own,q`` over their own
stream's previous request, read from :func:`_templates`' running sums) over-counts a sub-agent's shared prefix
and under-counts a parent's history re-touched after a sub-agent burst. ``"auto"`` (the estimator's default):
exact for the stationary form, own for the trace's own start times.

Invariant: ``f_k(lo, lo + 1)`` is request ``lo``'s own footprint and each later request adds at most its own
(``k_q ≥ 0``): a window's footprint never exceeds the sum of its requests' footprints.

Not modelled: with ``footprint="own"`` a conversation's footprint assumes a dropped (diverged) block is never
reused; the exact table falls back to ``"own"`` past ``max_cells`` entries.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvhit.workload.reuse import RequestReuse


def _templates(u: RequestReuse, adm: np.ndarray, Fx: np.ndarray, bunit: int = 1):
    """Per session (admitted requests only): relative times, first-request footprint, cumulative new blocks
    (``bunit``: units of ``Fx`` per block)."""
    idx = np.flatnonzero(adm)
    sess = u.session[idx]
    o = np.lexsort((idx, sess))
    idx = idx[o]
    sess = sess[o]
    start_mask = np.concatenate([[True], sess[1:] != sess[:-1]]) if idx.size else np.zeros(0, bool)
    starts = np.flatnonzero(start_mask)
    ends = np.concatenate([starts[1:], [idx.size]])
    t = u.time[idx]
    t_first = t[starts]
    tau = t - np.repeat(t_first, ends - starts)
    new = (Fx[idx] - bunit * np.minimum(u.L_own[idx], u.full_blocks[idx])).astype(np.float64)
    # cumnew per template with a leading 0 at each template's first slot: cumnew[i] = Σ_{templ. reqs < i} new
    cumnew = np.zeros(idx.size + 1)
    np.cumsum(new, out=cumnew[1:])
    return (
        starts.astype(np.int64),
        ends.astype(np.int64),
        tau,
        Fx[idx].astype(np.float64),
        cumnew,
        t_first,
        sess[starts],
    )


@njit(cache=True)
def _foot_kernel(
    idx, starts, ends, fbase, Fx, F, seg_off, seg_end, seg_src, session, prev, L_own, bunit, foot
):  # pragma: no cover
    """Exact footprint table of every template (see :func:`_footprint_table`)."""
    for k in range(starts.shape[0]):
        a = starts[k]
        b = ends[k]
        m1 = b - a + 1
        base = fbase[k]
        for lo in range(a, b):
            x = idx[lo]  # blocks last touched by a request at or after x (same session) are in the window
            acc = float(Fx[idx[lo]])
            foot[base + (lo - a) * m1 + (lo + 1 - a)] = acc
            for q in range(lo + 1, b):
                g = idx[q]
                kq = 0
                for j in range(seg_off[g], seg_off[g + 1]):
                    sj = seg_src[j]
                    if sj >= x and session[sj] == session[g]:
                        kq = seg_end[j]
                    else:
                        break
                if prev[g] >= x and L_own[g] > kq:
                    kq = L_own[g]
                if kq > F[g]:
                    kq = F[g]
                acc += Fx[g] - bunit * kq
                foot[base + (lo - a) * m1 + (q + 1 - a)] = acc


def _footprint_table(u: RequestReuse, adm: np.ndarray, Fx: np.ndarray, bunit: int = 1, max_cells: float = 3e7):
    """Exact footprint ``f_k(lo, hi)`` of every template (Lemma D.1's ``Φ``: a background conversation adds each
    of its blocks to the displacement at most once): the distinct blocks touched by its admitted requests
    ``lo … hi−1`` (positions as :func:`_templates`), i.e. ``Fx_lo + Σ_{lo<q<hi} (Fx_q − b_u·k_q(lo))`` with
    ``k_q(lo)`` the leading blocks of ``q`` last touched (same session) by a request at or after ``lo`` — or its
    common prefix with its own stream's previous request when that one is in the window. ``footprint="own"`` used
    ``k_q = L_own`` whatever the window (exact for one stream of growing prompts; for a WEKA conversation with
    sub-agents it misses the parent's history re-touched after a sub-agent burst whose parent turn was before the
    window, and counts twice what a branch shares with an older request in the window). Returns ``(foot, fbase)``
    or ``None`` when ``Σ m_k (m_k + 1)`` exceeds ``max_cells`` (the caller falls back to ``"own"``)."""
    idx = np.flatnonzero(adm)
    sess = u.session[idx]
    o = np.lexsort((idx, sess))
    idx = idx[o].astype(np.int64)
    sess = sess[o]
    start_mask = np.concatenate([[True], sess[1:] != sess[:-1]]) if idx.size else np.zeros(0, bool)
    starts = np.flatnonzero(start_mask).astype(np.int64)
    ends = np.concatenate([starts[1:], [idx.size]]).astype(np.int64)
    m = ends - starts
    sz = m * (m + 1)
    if float(sz.sum()) > max_cells:
        return None
    fbase = np.zeros(starts.shape[0], np.int64)
    if sz.size:
        fbase[1:] = np.cumsum(sz)[:-1]
    foot = np.zeros(max(int(sz.sum()), 1))
    _foot_kernel(
        idx,
        starts,
        ends,
        fbase,
        np.asarray(Fx, np.int64),
        np.asarray(u.full_blocks, np.int64),
        np.asarray(u.seg_off, np.int64),
        np.asarray(u.seg_end, np.int64),
        np.asarray(u.seg_src, np.int64),
        np.asarray(u.session, np.int64),
        np.asarray(u.prev, np.int64),
        np.asarray(u.L_own, np.int64),
        int(bunit),
        foot,
    )
    return foot, fbase
