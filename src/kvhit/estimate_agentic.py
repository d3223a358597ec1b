"""Hit-ratio estimator for agentic / production traffic: few, long contexts and a lumpy displacement.

Derivation: ``docs/estimators.md`` §"Agentic traffic". Per request ``r`` (arrival order) the reusable run
``[0, L_r)`` of its prompt splits into *age segments* (:mod:`kvhit.workload.reuse`): blocks last touched by
the same earlier request ``src`` at age ``a = t_r − t_src``. Under the vLLM free-queue order (tail-first
freeing: block 0 of a request is the most recently used, :mod:`kvhit.sim.blockcurve`) block ``i`` of such a
segment is found at capacity ``N`` iff

    N ≥ 1 + e + i + D_r(a),                                                                           (A1)

``D_r(a)`` = distinct other blocks touched in the window ``(t_src, t_r)`` (the displacement ``D(W)`` of
Lemma D.1, here over the age of the segment) and ``e`` the engine's partial-block term (vLLM ≥ 0.24: the
head partial block of the previous request, ``e = 1`` if its prompt is not a multiple of ``b``; ≤ 0.23:
``e = 0`` and every request in the window adds its freed partial block to ``D``). Hits stop at vLLM's cap
``(T_r − 1)//b``. The ratio is vLLM's ``prefix_cache_hits / prefix_cache_queries`` (``metric="tokens"``) or
``Σ hit / Σ ⌈T/b⌉`` (``"blocks"``), over *all* requests: a request with ``⌈T/b⌉ > N`` is rejected by vLLM,
counts as a miss and touches nothing (never left out of the ratio: below ``N_min = max ⌈T/b⌉`` the
estimate is a lower bound of what the admitted requests see and the capacity is flagged infeasible).

Two forms of ``D``:

``form="poisson"`` (the estimator; default). ``D_r(a) = D_same + D_other``: ``D_same`` the deterministic
footprint of the request's own session in the window (a WEKA sub-agent burst between two main-agent
turns); ``D_other`` the *exact* compound (marked) Poisson law of the other conversations' footprints — a
conversation started ``u`` seconds before ``t_r`` (intensity ``λ(t_r − u)``, template ``k`` uniform over the
trace's sessions) contributes ``f_k(u − a, u)``, the distinct blocks of its requests in the window
(first request whole, later ones their new blocks: ``F_q − L_own,q``). ``λ`` is the trace's own start-time
histogram (time-varying: the non-stationary pooled window) or, with ``lam0``, a stationary ``λ0`` (the
stationary stream the trace's conversations would make at that rate; Lemma D.1's Poisson random measure
with the discrete marks kept instead of eq. (15)'s Gaussian). The law is computed on a value grid by an
exponentially tilted FFT (no wrap-around), tabulated over ``(t, a)`` and interpolated.

``form="replay"`` (the working-set identity): ``D_r(a)`` = ``Σ_{src<q<r} (F_q − k_q)`` from the trace's own
requests (``k_q`` = leading blocks of ``q`` already touched in the window), i.e. the trace's own load
``T_C(t)`` at request granularity. It needs the very trace it predicts (no new λ0) and is near-exact by
construction; it is offered as the reference for the model's ingredients, not as a model.

Hot shared prefixes (a system prompt touched by many sessions) are segments whose ``src`` is another
session: their age is the trace's own (with ``lam0``: scaled by ``λ̂/λ0``, the characteristic-time rule that
a popular block's age scales inversely with the load).

Not modelled: requests' durations (instantaneous, as :func:`kvhit.sim.blockcurve.block_curve`); blocks of a
shared segment re-touched inside the window are counted twice in ``D`` (an over-estimate of ``D`` for deep
shared segments only); the vLLM ≥ 0.24 ``e`` is exact only when the previous request's partial block is the
last one (see :mod:`kvhit.sim.blockcurve` (★)); a conversation's footprint assumes a dropped (diverged) block
is never reused; colocated response blocks (Remark B.1).
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit

from kvhit.workload.reuse import RequestReuse, request_reuse

__all__ = ["AgenticError", "AgenticEstimate", "estimate_trace", "compound_poisson_cdf"]

ENGINES = ("vllm", "vllm-0.23")
FORMS = ("poisson", "replay")


class AgenticError(ValueError):
    """Bad argument to the agentic estimator (the message names the argument)."""


@dataclass(frozen=True)
class AgenticEstimate:
    """Predicted hit ratio at each capacity ``N`` (blocks).

    ``h``: the metric over all requests (rejected ones are misses); ``h_max``: the infinite-cache ceiling;
    ``infeasible``: ``N < N_min`` (some request is larger than the pool and would be refused);
    ``rejected_requests`` / ``rejected_tokens``: shares refused at each ``N``; ``regime``: ``validated``
    (bool) and ``notes`` (why not).
    """

    N: np.ndarray
    h: np.ndarray
    h_max: float
    infeasible: np.ndarray
    N_min: int
    rejected_requests: np.ndarray
    rejected_tokens: np.ndarray
    engine: str
    metric: str
    form: str
    lam0: float | None
    regime: dict = field(default_factory=dict)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict:
        def fl(x):
            return [None if not math.isfinite(v) else float(v) for v in np.asarray(x, float)]

        return {
            "N": [int(x) for x in self.N],
            "h": fl(self.h),
            "h_max": self.h_max if math.isfinite(self.h_max) else None,
            "infeasible": [bool(x) for x in self.infeasible],
            "N_min": int(self.N_min),
            "rejected_requests": fl(self.rejected_requests),
            "rejected_tokens": fl(self.rejected_tokens),
            "engine": self.engine,
            "metric": self.metric,
            "form": self.form,
            "lam0": self.lam0,
            "regime": self.regime,
            "elapsed_s": self.elapsed_s,
        }


# --------------------------------------------------------------------------------------------------
# the compound Poisson law (tilted FFT)
# --------------------------------------------------------------------------------------------------


def compound_poisson_cdf(nu: np.ndarray, G: int) -> np.ndarray:
    """CDF on ``0..G−1`` of ``D = Σ_{k ≤ K} X_k``, ``K`` Poisson, jump masses ``nu[j] = E[#jumps of size j]``
    (``j ≥ 1``; ``nu[0]`` ignored; rows of a 2-D ``nu`` are independent laws). Jumps ``≥ G`` must be
    clamped to ``G`` by the caller (they only matter as "≥ G"). Exponential tilting ``θ^j`` with
    ``θ^M = 10⁻⁹`` (``M ≥ 2G`` the FFT size) removes the FFT's wrap-around: the returned CDF is exact up to
    ~1e-9 relative (closed form: ``P(D = x) θ^x = IDFT[exp(DFT(ν θ^j) − Λ)]``)."""
    nu = np.atleast_2d(np.asarray(nu, np.float64))
    M = 1 << int(math.ceil(math.log2(max(2 * G + 2, 8))))
    J = nu.shape[1]
    theta = 10.0 ** (-9.0 / M)
    tilt = theta ** np.arange(M)
    buf = np.zeros((nu.shape[0], M))
    buf[:, 1:J] = nu[:, 1:J]
    lam = buf.sum(axis=1, keepdims=True)
    phi = np.fft.rfft(buf * tilt, axis=1)
    g = np.fft.irfft(np.exp(phi - lam), n=M, axis=1)[:, :G]
    pmf = np.maximum(g / tilt[:G], 0.0)
    return np.minimum(np.cumsum(pmf, axis=1), 1.0)


# --------------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------------


@njit(cache=True)
def _window_D(
    seg_req, seg_src, seg_off, seg_start, seg_end, Fx, L_any, session, adm, out_same, out_other
):  # pragma: no cover
    """Replay displacement of every segment: Σ over requests q strictly between src and r (admitted) of
    F_q + x_q − k_q, k_q = leading blocks of q whose last toucher is after src (the window start)."""
    for s in range(seg_req.shape[0]):
        r = seg_req[s]
        x = seg_src[s]
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
            c = Fx[q] - k
            if session[q] == sr:
                same += c
            else:
                other += c
        out_same[s] = same
        out_other[s] = other


@njit(cache=True)
def _levy_kernel(
    t_start, t_end, tau, fx_first, cumnew, a_pts, t_pts, excl, s_grid, Lc, delta, G, scale, out
):  # pragma: no cover
    """Jump masses ν[p, j] of the other conversations' footprints over the window (t_p − a_p, t_p); template
    ``excl[p]`` (the tagged request's own conversation in a pool where each conversation occurs once) is left
    out (−1: none).

    Template k = requests t_start[k]:t_end[k] (relative times ``tau``, sorted); a conversation of template k
    started at s = t − u contributes f = fx_first[lo] + cumnew[hi] − cumnew[lo+1] over the requests with
    τ in (u − a, u); its weight is scale·∫ λ(t − u) du over the interval (``Lc``: cumulative intensity on
    the knots ``s_grid``, linear in between, constant outside)."""
    nK = t_start.shape[0]
    for row in range(t_pts.shape[0]):
        t = t_pts[row]
        a = a_pts[row]
        if a <= 0.0:
            continue
        if True:
            for k in range(nK):
                if k == excl[row]:
                    continue
                i0 = t_start[k]
                i1 = t_end[k]
                pe = i0  # next enter event (tau[pe])
                pl = i0  # next leave event (tau[pl] + a)
                lo = i0
                hi = i0
                u_prev = tau[i0]
                while pe < i1 or pl < i1:
                    if pe < i1 and tau[pe] <= tau[pl] + a:
                        u = tau[pe]
                    else:
                        u = tau[pl] + a
                    if hi > lo and u > u_prev:
                        f = fx_first[lo] + cumnew[hi] - cumnew[lo + 1]
                        w = scale * (_cum(Lc, s_grid, t - u_prev) - _cum(Lc, s_grid, t - u))
                        if w > 0.0:
                            j = int(f / delta + 0.5)
                            if j > G:
                                j = G
                            out[row, j] += w
                    if pe < i1 and tau[pe] <= tau[pl] + a:
                        pe += 1
                        hi = pe
                    else:
                        pl += 1
                        lo = pl
                    u_prev = u


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


@njit(cache=True)
def _hits_kernel(Hb, delta, seg_row, c0, ln, wgt, Ns, out):  # pragma: no cover
    """out[k] = Σ_seg wgt·Σ_{i<ln} P(D_row ≤ N_k − c0 − i) = wgt·(H(N − c0) − H(N − c0 − ln)), with
    H(y) = Σ_{z≤y} P(D ≤ z) = ∫₀^{y+1} CDF and Hb[row, j] = δ·Σ_{j'<j} CDF[row, j']."""
    G = Hb.shape[1] - 1
    for s in range(seg_row.shape[0]):
        row = seg_row[s]
        for kk in range(Ns.shape[0]):
            yhi = Ns[kk] - c0[s]
            if yhi < 0:
                continue
            out[kk] += wgt[s] * (_H(Hb, row, yhi + 1.0, delta, G) - _H(Hb, row, yhi - ln[s] + 1.0, delta, G))


@njit(cache=True)
def _H(Hb, row, y, delta, G):  # pragma: no cover
    if y <= 0.0:
        return 0.0
    x = y / delta
    j = int(x)
    if j >= G:
        return Hb[row, G] + (y - G * delta)
    return Hb[row, j] + (x - j) * (Hb[row, j + 1] - Hb[row, j])


# --------------------------------------------------------------------------------------------------
# the estimator
# --------------------------------------------------------------------------------------------------


def _capacities(Ns) -> np.ndarray:
    a = np.atleast_1d(np.asarray(Ns))
    if a.ndim != 1 or a.size == 0:
        raise AgenticError("Ns: expected a non-empty 1-D sequence of capacities (blocks)")
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
            raise AgenticError("Ns: capacities must be whole numbers of blocks")
    elif a.dtype.kind not in "iu":
        raise AgenticError(f"Ns: expected integers, got dtype {a.dtype}")
    a = a.astype(np.int64)
    if np.any(a < 1):
        raise AgenticError("Ns: capacities must be >= 1 block")
    return a


def _sum_clip(c: np.ndarray, ln: np.ndarray, w: np.ndarray, Ns: np.ndarray) -> np.ndarray:
    """Σ_s w_s · clip(N − c_s + 1, 0, ln_s) for every N (sorted cumulative sums)."""

    def ramp(c_):
        o = np.argsort(c_, kind="stable")
        cs = c_[o].astype(np.float64)
        ws = w[o]
        cw = np.concatenate([[0.0], np.cumsum(ws)])
        cwc = np.concatenate([[0.0], np.cumsum(ws * cs)])
        k = np.searchsorted(cs, Ns.astype(np.float64) + 1.0, side="left")  # c ≤ N  ⇔  N − c + 1 > 0
        return (Ns + 1.0) * cw[k] - cwc[k]

    return ramp(c) - ramp(c + ln)


def _prepare(source, engine: str):
    from kvhit.workload.spec import WorkloadSpec

    if isinstance(source, WorkloadSpec):
        raise AgenticError("source: pass a trace generated from the spec (kvhit.workload.generate) — see estimate_spec")
    u = source if isinstance(source, RequestReuse) else request_reuse(source)
    return u


def estimate_trace(
    source: Any,
    Ns: Any,
    *,
    engine: str = "vllm",
    metric: str = "tokens",
    form: str = "poisson",
    lam0: float | None = None,
    bins: int | None = None,
    n_values: int = 2048,
    n_ages: int = 30,
    n_times: int = 4096,
) -> AgenticEstimate:
    """Predicted vLLM hit ratio of a request trace at capacities ``Ns`` (blocks); see the module docstring.

    ``source``: a :class:`~kvhit.workload.production.ProductionTrace` (Mooncake, WEKA), a kvhit
    :class:`~kvhit.workload.trace.Trace` or a :class:`~kvhit.workload.reuse.RequestReuse` (precomputed:
    reuse it across calls). ``engine``: ``"vllm"`` (≥ 0.24) or ``"vllm-0.23"``. ``metric``: ``"tokens"``
    (vLLM's ``prefix_cache_hits / prefix_cache_queries``) or ``"blocks"``. ``form``: ``"poisson"`` (the
    estimator) or ``"replay"`` (working-set identity on the trace's own load). ``lam0`` (poisson only):
    predict the *stationary* stream of the trace's conversations started as a Poisson process at ``lam0``
    per second instead of the trace's own (non-stationary) start times. ``bins``: start-time histogram bins
    of the time-varying intensity (default ``clip(√C, 1, 24)``). ``n_values`` / ``n_ages`` / ``n_times``:
    grid sizes of the tabulated law.
    """
    t0 = _time.perf_counter()
    if engine not in ENGINES:
        raise AgenticError(f"engine: expected one of {ENGINES}, got {engine!r}")
    if metric not in ("tokens", "blocks"):
        raise AgenticError(f"metric: expected 'tokens' or 'blocks', got {metric!r}")
    if form not in FORMS:
        raise AgenticError(f"form: expected one of {FORMS}, got {form!r}")
    if lam0 is not None:
        lam0 = float(lam0)
        if not (math.isfinite(lam0) and lam0 > 0):
            raise AgenticError(f"lam0: must be finite and > 0 (conversations/s), got {lam0!r}")
        if form == "replay":
            raise AgenticError("lam0: the replay form predicts the trace's own load; use form='poisson'")
    Ns = _capacities(Ns)
    u = _prepare(source, engine)
    n = u.n
    b = u.block_size
    T = u.prompt_tokens
    R = u.prompt_blocks
    F = u.full_blocks
    cap = u.hit_cap
    new23 = engine == "vllm-0.23"
    part = (T % b != 0).astype(np.int64)
    Fx = F + (part if new23 else 0)
    N_min = int(R.max()) if n else 0
    h_max = u.ceiling(metric)
    den = float(T.sum()) if metric == "tokens" else float(R.sum())
    unit = float(b) if metric == "tokens" else 1.0
    # segments, capped at (T-1)//b
    seg_req = np.repeat(np.arange(n, dtype=np.int64), np.diff(u.seg_off))
    s0 = u.seg_start
    s1 = np.minimum(u.seg_end, cap[seg_req])
    keep = s1 > s0
    # e: vLLM ≥ 0.24 keeps the previous request's partial block at the queue head
    prev_any = np.maximum(seg_req - 1, 0)
    e = np.where(seg_req > 0, part[prev_any], 0) if not new23 else np.zeros(seg_req.shape[0], np.int64)
    notes: list[str] = []
    h = np.zeros(Ns.shape[0])
    # rejected shares at every N; admission groups: all feasible N share one admitted set (everyone), the
    # infeasible ones are computed in at most 8 geometric groups with the group's smallest N's admitted set
    Rsort = np.sort(R)
    Tcum = np.concatenate([[0], np.cumsum(T[np.argsort(R, kind="stable")])])
    kadm = np.searchsorted(Rsort, Ns, side="right")
    rej_req = 1.0 - kadm / n if n else np.zeros(Ns.shape[0])
    rej_tok = 1.0 - Tcum[kadm] / Tcum[-1] if n and Tcum[-1] else np.zeros(Ns.shape[0])
    key = np.zeros(Ns.shape[0], np.int64)
    inf_ = Ns < N_min
    if inf_.any():
        edges = np.geomspace(max(int(Ns[inf_].min()), 1), N_min, 9)
        key[inf_] = 1 + np.clip(np.searchsorted(edges, Ns[inf_], side="right") - 1, 0, 7)
    if n and Ns.max() < N_min:
        notes.append("every capacity asked is below N_min (infeasible)")
    for kval in np.unique(key):
        sel = key == kval
        Nsel = Ns[sel]
        adm = R <= Nsel.min()
        ks = keep & adm[seg_req]
        if not ks.any():
            continue
        sr = seg_req[ks]
        src = u.seg_src[ks]
        same = np.zeros(int(ks.sum()), np.int64)
        other = np.zeros(int(ks.sum()), np.int64)
        _window_D(sr, src, u.seg_off, u.seg_start, u.seg_end, Fx, u.L_any, u.session, adm, same, other)
        c0 = 1 + e[ks] + s0[ks]  # block i = s0 + m needs N ≥ c0 + m + D
        ln = s1[ks] - s0[ks]
        if form == "replay":
            num = _sum_clip(c0 + same + other, ln, np.full(ln.shape[0], unit), Nsel)
        else:
            num = _poisson_hits(
                u, sr, src, c0 + same, ln, unit, Nsel, adm, Fx, lam0, bins, n_values, n_ages, n_times, notes
            )
        h[sel] = num / den if den else np.nan
    infeasible = Ns < N_min
    regime = _regime(u, lam0, form, notes)
    return AgenticEstimate(
        N=Ns,
        h=h,
        h_max=float(h_max),
        infeasible=infeasible,
        N_min=N_min,
        rejected_requests=rej_req,
        rejected_tokens=rej_tok,
        engine=engine,
        metric=metric,
        form=form,
        lam0=lam0,
        regime=regime,
        elapsed_s=_time.perf_counter() - t0,
    )


def _regime(u: RequestReuse, lam0, form, notes) -> dict:
    out = list(notes)
    n_sess = int(u.session.max()) + 1 if u.n else 0
    if n_sess < 2:
        out.append("fewer than 2 sessions: no background to model")
    elif form == "poisson" and lam0 is None and n_sess < 10:
        out.append(
            f"only {n_sess} sessions: their start-time intensity is poorly determined "
            "(form='replay' uses the trace's own timing; lam0= a stationary rate)"
        )
    return {"validated": not out, "notes": out, "sessions": n_sess}


def _templates(u: RequestReuse, adm: np.ndarray, Fx: np.ndarray):
    """Per session (admitted requests only): relative times, first-request footprint, cumulative new blocks."""
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
    new = (Fx[idx] - np.minimum(u.L_own[idx], u.full_blocks[idx])).astype(np.float64)
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


def _poisson_hits(u, sr, src, c0, ln, unit, Ns, adm, Fx, lam0, bins, n_values, n_ages, n_times, notes):
    """Σ over segments of unit·E[hits] with D_other the compound Poisson law at the segment's (t, a) cell.

    Cells: ``n_times`` uniform time bins × log-age bins of ratio ``(1 + 1/n_ages)``; the law is computed
    exactly at each occupied cell's centre (nearest cell, no interpolation across a lumpy law)."""
    t_r = u.time[sr]
    age = t_r - u.time[src]
    other_sess = u.session[src] != u.session[sr]
    ts, te, tau, fx_first, cumnew, t_first, t_sess = _templates(u, adm, Fx)
    C = ts.shape[0]
    span_starts = float(t_first.max() - t_first.min()) if C else 0.0
    if lam0 is not None:
        # stationary: constant intensity; ages of hot shared segments scale as 1/λ (characteristic time)
        lam_hat = (C - 1) / span_starts if span_starts > 0 and C > 1 else lam0
        age = np.where(other_sess, age * lam_hat / lam0, age)
        t_eval = np.zeros_like(t_r)
        lo = -float((tau.max() if tau.size else 0.0) + age.max() + 1.0)
        s_grid = np.array([lo, 1.0])
        Lc = np.array([0.0, lam0 * (1.0 - lo)])
        scale = 1.0 / C if C else 0.0
    else:
        nb = int(bins) if bins else int(np.clip(round(math.sqrt(C)), 1, 24))
        lo, hi = float(t_first.min()), float(t_first.max())
        if hi <= lo:
            hi = lo + 1.0
        cnt, edges = np.histogram(t_first, bins=nb, range=(lo, hi))
        s_grid = edges
        Lc = np.concatenate([[0.0], np.cumsum(cnt).astype(np.float64)])
        scale = 1.0 / C  # each of the other C − 1 conversations once: its own template excluded per cell
        t0, t1 = float(t_r.min()), float(t_r.max())
        nt = max(int(n_times), 1)
        w = (t1 - t0) / nt if t1 > t0 else 1.0
        ti = np.minimum(((t_r - t0) / w).astype(np.int64), nt - 1)
        t_eval = t0 + (ti + 0.5) * w
    q = math.log1p(1.0 / max(int(n_ages), 1))
    la = np.where(age > 0, np.round(np.log(np.maximum(age, 1e-9)) / q), -(10**9)).astype(np.int64)
    a_eval = np.where(age > 0, np.exp(la * q), 0.0)
    # template index of each session (templates are the sessions with an admitted request, in session order)
    tmpl_of = np.full(int(u.session.max()) + 1, -1, np.int64)
    tmpl_of[t_sess] = np.arange(C)
    excl = tmpl_of[u.session[sr]] if lam0 is None else np.full(sr.shape[0], -1, np.int64)
    key = np.stack([t_eval, a_eval, excl.astype(np.float64)], axis=1)
    cells, row = np.unique(key, axis=0, return_inverse=True)
    row = row.reshape(-1).astype(np.int64)
    Vmax = int(Ns.max()) + 1
    G = int(min(n_values, Vmax))
    delta = Vmax / G
    P = cells.shape[0]
    Hb = np.zeros((P, G + 1))
    chunk = max(1, (1 << 22) // (4 * G))
    for c_lo in range(0, P, chunk):
        c_hi = min(P, c_lo + chunk)
        nu = np.zeros((c_hi - c_lo, G + 1))
        if C:
            _levy_kernel(
                ts,
                te,
                tau,
                fx_first,
                cumnew,
                cells[c_lo:c_hi, 1].copy(),
                cells[c_lo:c_hi, 0].copy(),
                cells[c_lo:c_hi, 2].astype(np.int64),
                s_grid,
                Lc,
                delta,
                G,
                scale,
                nu,
            )
        cdf = compound_poisson_cdf(nu, G)
        np.cumsum(cdf * delta, axis=1, out=Hb[c_lo:c_hi, 1:])
    out = np.zeros(Ns.shape[0])
    _hits_kernel(
        Hb,
        delta,
        row,
        c0.astype(np.float64),
        ln.astype(np.float64),
        np.full(sr.shape[0], unit),
        Ns.astype(np.float64),
        out,
    )
    return out
