"""Hit-ratio estimator for agentic / production traffic: few, long contexts and a lumpy displacement.

Derivation: ``docs/estimators.md`` §"Agentic traffic". Per request ``r`` (arrival order) the reusable run
``[0, L_r)`` of its prompt splits into *age segments* (:mod:`kvhit.workload.reuse`): blocks last touched by
the same earlier request ``src`` at age ``a = t_r − t_src``. Under the vLLM free-queue order (tail-first
freeing: block 0 of a request is the most recently used, :mod:`kvhit.sim.vllm.curve`) block ``i`` of such a
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
trace's sessions) contributes ``f_k(u − a, u)``, the distinct blocks of its requests in the window (Lemma D.1's
``Φ``: each block at most once). ``footprint="exact"`` counts them exactly (a table per template over its
request windows); ``"own"`` (first request whole, later ones their growth ``F_q − L_own,q`` over their own
stream's previous request) over-counts a sub-agent's shared prefix and under-counts a parent's history
re-touched after a sub-agent burst. ``"auto"`` (default): exact for the stationary form, own for the trace's own
start times. The stationary form carries an error band ``h ± tol`` and is ``validated`` only inside
:data:`STATIONARY_VALIDATED` (the benchmarked region; outside it the band is widened and a note says why).
``λ`` is the trace's own start-time
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

Not modelled: requests' durations (instantaneous, as :func:`kvhit.sim.vllm.curve.block_curve`); blocks of a
shared segment re-touched inside the window are counted twice in ``D`` (an over-estimate of ``D`` for deep
shared segments only); the vLLM ≥ 0.24 ``e`` is exact only when the previous request's partial block is the
last one (see :mod:`kvhit.sim.vllm.curve` (★)); with ``footprint="own"`` a conversation's footprint assumes a
dropped (diverged) block is never reused; colocated response blocks (Remark B.1).
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit

from kvhit.estimate.startbins import RULES as BIN_RULES
from kvhit.estimate.startbins import start_bins
from kvhit.workload.reuse import RequestReuse, request_reuse

__all__ = [
    "STATIONARY_VALIDATED",
    "AgenticError",
    "AgenticEstimate",
    "compound_poisson_cdf",
    "estimate_spec_agentic",
    "estimate_trace",
    "stationary_region_misses",
]

ENGINES = ("vllm", "vllm-0.23")
FORMS = ("poisson", "replay")
FOOTPRINTS = ("auto", "exact", "own")

#: where ``benchmarks/agentic_accuracy.py --only whatif`` showed the stationary what-if (``lam0=``, ``footprint=
#: "exact"``) within ``tol`` of resample-and-simulate run to a 95 % half-width ≤ 0.005 (docs/accuracy.md): the
#: held-out WEKA pool (trace_0030 … trace_0037, 7 conversations), vLLM ≥ 0.24, token metric, λ0 from 1/600 to
#: 1/30 per s. Inside it the stationary estimate carries the error band ``h ± tol`` and ``validated``; outside
#: (another format, fewer sessions, another rate, engine or metric — not measured) the band is ``h ± (tol +
#: widen)``, ``validated`` is false and a note says which condition failed.
STATIONARY_VALIDATED: dict = {
    "formats": ("weka",),
    "min_sessions": 7,
    "lam0": (1.0 / 600.0, 1.0 / 30.0),
    "engines": ("vllm",),
    "metrics": ("tokens",),
    "footprint": "exact",
    "tol": 0.01,
    "widen": 0.01,
}


def stationary_region_misses(source: str, n_sessions: int, lam0: float, engine: str, metric: str, footprint: str):
    """The conditions of :data:`STATIONARY_VALIDATED` a stationary estimate fails (empty: inside the region)."""
    R = STATIONARY_VALIDATED
    out = []
    if source not in R["formats"]:
        out.append(f"trace format {source!r} (measured: {', '.join(R['formats'])})")
    if n_sessions < R["min_sessions"]:
        out.append(f"{n_sessions} conversations (measured: ≥ {R['min_sessions']})")
    lo, hi = R["lam0"]
    if not lo * (1 - 1e-9) <= lam0 <= hi * (1 + 1e-9):
        out.append(f"λ0 = {lam0:.3g}/s (measured: 1/{1 / lo:.0f} … 1/{1 / hi:.0f})")
    if engine not in R["engines"]:
        out.append(f"engine {engine} (measured: {', '.join(R['engines'])})")
    if metric not in R["metrics"]:
        out.append(f"metric {metric} (measured: {', '.join(R['metrics'])})")
    if footprint != R["footprint"]:
        out.append(f"footprint {footprint!r} (measured: {R['footprint']!r})")
    return out


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
    per_request: np.ndarray | None = None  #: with ``per_request=True``: expected hits (metric units), (n, len(N))
    #: prediction band for one realisation of the start times (:mod:`kvhit.estimate.band`), else None
    h_lo: np.ndarray | None = None
    h_hi: np.ndarray | None = None
    h_mc: np.ndarray | None = None  #: the band's replay mean (a Monte Carlo estimate of ``h``)
    level: float | None = None
    band: dict | None = None
    #: the Monte Carlo standard error s/√K of ``h_mc`` (the replays' mean is itself an estimate of the expected
    #: value under the fitted start law, docs/estimators.md §4.1)
    h_mc_se: np.ndarray | None = None

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
        } | (
            {}
            if self.h_lo is None
            else {
                "h_lo": fl(self.h_lo),
                "h_hi": fl(self.h_hi),
                "h_mc": fl(self.h_mc),
                "h_mc_se": None if self.h_mc_se is None else fl(self.h_mc_se),
                "level": self.level,
                "band": self.band,
            }
        )


# --------------------------------------------------------------------------------------------------
# the compound Poisson law (tilted FFT)
# --------------------------------------------------------------------------------------------------


def compound_poisson_cdf(nu: np.ndarray, G: int) -> np.ndarray:
    """CDF on ``0..G−1`` of ``D = Σ_{k ≤ K} X_k``, ``K`` Poisson, jump masses ``nu[j] = E[#jumps of size j]``
    (``j ≥ 1``; ``nu[0]`` ignored; rows of a 2-D ``nu`` are independent laws). Jumps ``≥ G`` must be
    clamped to ``G`` by the caller (they only matter as "≥ G"). Exponential tilting ``θ^j`` with
    ``θ^M = 10⁻⁹`` (``M ≥ 2G`` the FFT size, a power of two) removes the FFT's wrap-around: the returned
    CDF is exact up to ~1e-9 relative (closed form: ``P(D = x) θ^x = IDFT[exp(DFT(ν θ^j) − Λ)]``)."""
    nu = np.atleast_2d(np.asarray(nu, np.float64))
    M = 1 << int(math.ceil(math.log2(max(2 * G, 8))))
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
def _hits_kernel_req(Hb, delta, seg_row, seg_req, c0, ln, unit, Ns, out):  # pragma: no cover
    """:func:`_hits_kernel` per request: out[r, k] += unit·Σ_{i<ln} P(D_row ≤ N_k − c0 − i) over r's segments."""
    G = Hb.shape[1] - 1
    for s in range(seg_row.shape[0]):
        row = seg_row[s]
        r = seg_req[s]
        for kk in range(Ns.shape[0]):
            yhi = Ns[kk] - c0[s]
            if yhi < 0:
                continue
            out[r, kk] += unit * (_H(Hb, row, yhi + 1.0, delta, G) - _H(Hb, row, yhi - ln[s] + 1.0, delta, G))


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
        raise AgenticError(
            "source: a WorkloadSpec goes to estimate_spec_agentic (it needs conversations drawn from it)"
        )
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
    bin_rule: str = "br",
    n_values: int = 2048,
    n_ages: int = 16,
    n_times: int = 64,
    exclude: str | bool = "auto",
    mask: Any = None,
    work_budget: float = 6e7,
    head_partial: bool = True,
    cap_last: bool = True,
    seg_shift: Any = None,
    rejection: bool = True,
    per_request: bool = False,
    footprint: str = "auto",
) -> AgenticEstimate:
    """Predicted vLLM hit ratio of a request trace at capacities ``Ns`` (blocks); see the module docstring.

    ``source``: a :class:`~kvhit.workload.production.ProductionTrace` (Mooncake, WEKA), a kvhit
    :class:`~kvhit.workload.trace.Trace` or a :class:`~kvhit.workload.reuse.RequestReuse` (precomputed:
    reuse it across calls). ``engine``: ``"vllm"`` (≥ 0.24) or ``"vllm-0.23"``. ``metric``: ``"tokens"``
    (vLLM's ``prefix_cache_hits / prefix_cache_queries``) or ``"blocks"``. ``form``: ``"poisson"`` (the
    estimator) or ``"replay"`` (working-set identity on the trace's own load). ``lam0`` (poisson only):
    predict the *stationary* stream of the trace's conversations started as a Poisson process at ``lam0``
    per second instead of the trace's own (non-stationary) start times. ``bins``: start-time histogram bins
    of the time-varying intensity (default: chosen by ``bin_rule``, :func:`kvhit.estimate.startbins.start_bins`:
    ``"br"`` the Birgé–Rozenholc penalised likelihood, ``"sqrt"`` the former ``clip(√C, 1, 24)``).
    ``n_values`` / ``n_ages`` / ``n_times``: grid sizes of the tabulated law. ``exclude`` (time-varying form):
    leave the tagged request's own conversation out of the background templates (a pool holds each
    conversation once; ``"auto"``: when the trace has ≤ 64 sessions, else the Palm factor (C − 1)/C).
    ``mask``: boolean over the requests in arrival order (a ProductionTrace's or a time-sorted kvhit Trace's row
    order) selecting the *measured* requests (e.g. after a warm-up); every request still loads the cache.
    ``work_budget``: events of the Lévy sweep (time cells × age cells × requests of multi-request conversations)
    above which the number of time cells is lowered (reported in ``regime.notes``).

    Host-tier accounting (:mod:`kvhit.estimate.tiers`, issue 16): ``head_partial=False`` drops the partial-block
    term ``e`` of (A1) (a host tier stores full chunks only: nothing unhashed sits at its LRU head);
    ``cap_last=False`` lifts the ``(T − 1)//b`` cap (vLLM 0.33.0 native offloading loads a fully resident
    prompt's last chunk); ``seg_shift`` (one integer per segment of the :class:`RequestReuse`) is added to the
    segment's threshold ``1 + e + i + D`` (LMCache's put-after-touch order, see :mod:`kvhit.estimate.tiers`);
    ``rejection=False``: no request is refused for being larger than ``N`` (a host tier still looks up and loads
    the stored prefix of a request larger than itself); ``per_request=True`` (poisson form) also returns each
    request's expected hits (``per_request``; ``h`` = their sum over the measured requests / the denominator).

    ``footprint`` (poisson form): a background conversation's contribution to ``D`` over a window — ``"exact"``
    (the distinct blocks its requests in the window touch, Lemma D.1's ``Φ``; :func:`_footprint_table`),
    ``"own"`` (first request whole, later ones their growth over their own stream's previous request: the
    behaviour before issue 23 §3), or ``"auto"``: ``"exact"`` with ``lam0`` (the stationary what-if, where it was
    validated: ``docs/accuracy.md``), ``"own"`` on the trace's own start times (not re-validated yet).
    """
    t0 = _time.perf_counter()
    if engine not in ENGINES:
        raise AgenticError(f"engine: expected one of {ENGINES}, got {engine!r}")
    if metric not in ("tokens", "blocks"):
        raise AgenticError(f"metric: expected 'tokens' or 'blocks', got {metric!r}")
    if form not in FORMS:
        raise AgenticError(f"form: expected one of {FORMS}, got {form!r}")
    if bin_rule not in BIN_RULES:
        raise AgenticError(f"bin_rule: expected one of {BIN_RULES}, got {bin_rule!r}")
    if footprint not in FOOTPRINTS:
        raise AgenticError(f"footprint: expected one of {FOOTPRINTS}, got {footprint!r}")
    if per_request and form != "poisson":
        raise AgenticError("per_request: available for form='poisson' only")
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
    cap = u.hit_cap if cap_last else u.full_blocks
    new23 = engine == "vllm-0.23"
    part = (T % b != 0).astype(np.int64)
    Fx = F + (part if new23 else 0)
    N_min = int(R.max()) if n else 0
    if mask is None:
        meas = np.ones(n, bool)
    else:
        meas = np.asarray(mask)
        if meas.dtype != np.bool_ or meas.shape != (n,):
            raise AgenticError(f"mask: expected a boolean array of shape ({n},)")
    hit_inf = float(u.reusable[meas].sum())
    den = float(T[meas].sum()) if metric == "tokens" else float(R[meas].sum())
    h_max = hit_inf * (b if metric == "tokens" else 1) / den if den else float("nan")
    unit = float(b) if metric == "tokens" else 1.0
    # segments, capped at (T-1)//b
    seg_req = np.repeat(np.arange(n, dtype=np.int64), np.diff(u.seg_off))
    s0 = u.seg_start
    s1 = np.minimum(u.seg_end, cap[seg_req])
    keep = (s1 > s0) & meas[seg_req]
    # e: vLLM ≥ 0.24 keeps the previous request's partial block at the queue head
    prev_any = np.maximum(seg_req - 1, 0)
    e = np.where(seg_req > 0, part[prev_any], 0) if not new23 else np.zeros(seg_req.shape[0], np.int64)
    if not head_partial:
        e = np.zeros(seg_req.shape[0], np.int64)
    if seg_shift is not None:
        sh = np.asarray(seg_shift)
        if sh.shape != seg_req.shape or sh.dtype.kind not in "iu" or (sh.size and sh.min() < 0):
            raise AgenticError(f"seg_shift: expected non-negative integers, one per segment ({seg_req.shape[0]})")
        e = e + sh.astype(np.int64)
    notes: list[str] = []
    h = np.zeros(Ns.shape[0])
    # rejected shares at every N; admission groups: all feasible N share one admitted set (everyone), the
    # infeasible ones are computed in at most 8 geometric groups with the group's smallest N's admitted set
    Rm, Tm = R[meas], T[meas]
    Rsort = np.sort(Rm)
    Tcum = np.concatenate([[0], np.cumsum(Tm[np.argsort(Rm, kind="stable")])])
    kadm = np.searchsorted(Rsort, Ns, side="right")
    nm = Rm.shape[0]
    rej_req = 1.0 - kadm / nm if nm else np.zeros(Ns.shape[0])
    rej_tok = 1.0 - Tcum[kadm] / Tcum[-1] if nm and Tcum[-1] else np.zeros(Ns.shape[0])
    key = np.zeros(Ns.shape[0], np.int64)
    inf_ = Ns < N_min if rejection else np.zeros(Ns.shape[0], bool)
    if inf_.any():
        edges = np.geomspace(max(int(Ns[inf_].min()), 1), N_min, 9)
        key[inf_] = 1 + np.clip(np.searchsorted(edges, Ns[inf_], side="right") - 1, 0, 7)
    if n and Ns.max() < N_min:
        notes.append("every capacity asked is below N_min (infeasible)")
    seg_src_all = u.seg_src
    table = None
    pr = np.zeros((n, Ns.shape[0])) if per_request else None
    for kval in np.unique(key):
        sel = key == kval
        Nsel = Ns[sel]
        adm = R <= Nsel.min() if rejection else np.ones(n, bool)
        ks = keep & adm[seg_req]
        if not ks.any():
            continue
        ln = s1[ks] - s0[ks]
        if form == "replay":
            sr = seg_req[ks]
            same = np.zeros(sr.shape[0], np.int64)
            other = np.zeros(sr.shape[0], np.int64)
            _window_D(sr, seg_src_all[ks], u.seg_src, u.seg_off, u.seg_end, Fx, u.session, adm, same, other)
            num = _sum_clip(1 + e[ks] + s0[ks] + same + other, ln, np.full(ln.shape[0], unit), Nsel)
        else:
            # one law table for every capacity: the background is the feasible (everyone admitted) one; below
            # N_min only the rejected requests' own hits are dropped (their touches are not)
            if table is None:
                table = _poisson_table(
                    u,
                    seg_req[keep],
                    seg_src_all[keep],
                    Fx,
                    Ns,
                    lam0,
                    bins,
                    n_values,
                    n_ages,
                    n_times,
                    exclude,
                    notes,
                    work_budget,
                    footprint=("exact" if lam0 is not None else "own") if footprint == "auto" else footprint,
                    bin_rule=bin_rule,
                )
            Hb, delta, rows, d_same = table
            sub = ks[keep]
            c0 = 1 + e[ks] + s0[ks] + d_same[sub]
            num = np.zeros(Nsel.shape[0])
            if per_request:
                out2 = np.zeros((n, Nsel.shape[0]))
                _hits_kernel_req(
                    Hb,
                    delta,
                    rows[sub],
                    seg_req[ks],
                    c0.astype(np.float64),
                    ln.astype(np.float64),
                    unit,
                    Nsel.astype(np.float64),
                    out2,
                )
                pr[:, sel] = out2
            # h from the summing kernel either way (identical with and without per_request)
            _hits_kernel(
                Hb,
                delta,
                rows[sub],
                c0.astype(np.float64),
                ln.astype(np.float64),
                np.full(ln.shape[0], unit),
                Nsel.astype(np.float64),
                num,
            )
        h[sel] = num / den if den else np.nan
    infeasible = Ns < N_min
    regime = _regime(u, lam0, form, notes)
    h_lo = h_hi = band = None
    if lam0 is not None:
        # the stationary what-if's error band: ± the tolerance the benchmark showed inside STATIONARY_VALIDATED
        fp = "exact" if footprint == "auto" else footprint
        if any(n.startswith("info: footprint table too large") for n in regime["notes"]):
            fp = "own"  # the fallback actually used
        miss = stationary_region_misses(u.source, regime["sessions"], lam0, engine, metric, fp)
        tol = STATIONARY_VALIDATED["tol"] + (STATIONARY_VALIDATED["widen"] if miss else 0.0)
        h_lo = np.clip(h - tol, 0.0, h_max)
        h_hi = np.clip(h + tol, 0.0, h_max)
        if miss:
            regime["validated"] = False
            regime["notes"].append(
                "stationary what-if outside the validated region (" + "; ".join(miss) + "): error band widened "
                f"to ±{tol:.2f} (not a measured bound; docs/accuracy.md)"
            )
        band = {
            "method": "stationary error band: ± the tolerance met against resample-and-simulate (95 % half-width "
            "≤ 0.005) inside STATIONARY_VALIDATED (docs/accuracy.md), widened outside it",
            "half_width": tol,
            "in_region": not miss,
        }
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
        per_request=pr,
        h_lo=h_lo,
        h_hi=h_hi,
        h_mc=None if h_lo is None else np.full(h.shape[0], np.nan),
        band=band,
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
    return {"validated": not any(not x.startswith("info:") for x in out), "notes": out, "sessions": n_sess}


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


def _poisson_table(
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
    """Law of D_other at every segment's (t, a) cell and the deterministic own-session part D_same.

    Returns ``(Hb, delta, row, D_same)``: ``Hb[row]`` = δ·cumulative CDF on the value grid of the segment's
    cell. Cells: ``n_times`` uniform time bins × log-age bins of ratio ``1 + 1/n_ages`` (× the tagged
    conversation when its own template is excluded); the law is computed exactly at each occupied cell's
    centre (nearest cell: no interpolation across a lumpy law). ``bunit``: units of ``Fx`` (and of ``Ns``)
    per block (1: blocks, vLLM; b: tokens, :mod:`kvhit.estimate.sglang_agentic`)."""
    n = u.n
    adm = np.ones(n, bool)
    same = np.zeros(sr.shape[0], np.int64)
    other = np.zeros(sr.shape[0], np.int64)
    if sr.shape[0]:
        _window_D(sr, src, u.seg_src, u.seg_off, u.seg_end, Fx, u.session, adm, same, other, bunit)
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
        rep = np.arange(C, dtype=np.int64)
        seen: dict = {}
        cn = np.diff(cumnew)
        for k in range(C):
            a_, b_ = int(ts[k]), int(te[k])
            sig = (b_ - a_, tau[a_:b_].tobytes(), fx_first[a_:b_].tobytes(), cn[a_ + 1 : b_].tobytes())
            rep[k] = seen.setdefault(sig, k)
        n_classes = len(seen)
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
            n_cells = np.unique(np.stack([t_eval, la_, excl.astype(np.float64)], axis=1), axis=0).shape[0]
            if n_cells * n_multi <= work_budget or nt <= 4:
                break
            nt = max(4, nt // 2)
        if nt < int(n_times):
            notes.append(f"info: time cells reduced to {nt} (work budget)")
    q = math.log1p(1.0 / max(int(n_ages), 1))
    la = np.where(age > 0, np.round(np.log(np.maximum(age, 1e-9)) / q), -(10**9)).astype(np.int64)
    a_eval = np.where(age > 0, np.exp(la * q), 0.0)
    key = np.stack([t_eval, a_eval, excl.astype(np.float64)], axis=1)
    cells, row = np.unique(key, axis=0, return_inverse=True)
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
    grp = np.unique(np.stack([t_c, x_c.astype(np.float64)], axis=1), axis=0, return_inverse=True)[1].reshape(-1)
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
    Hb = np.zeros((P, G + 1))
    hist1 = _split_hist(F1, delta, G)
    chunk = max(1, (1 << 22) // (4 * G))
    for c_lo in range(0, P, chunk):
        c_hi = min(P, c_lo + chunk)
        nu = np.zeros((c_hi - c_lo, G + 1))
        if multi.size:
            _levy_kernel(
                ts_m,
                te_m,
                tau,
                fx_first,
                cumnew,
                a_c[c_lo:c_hi],
                t_c[c_lo:c_hi],
                x_m[c_lo:c_hi],
                s_grid,
                Lc,
                delta,
                G,
                scale,
                nu,
                np.zeros((c_hi - c_lo, 3)),
                foot,
                fbase[multi] if foot.shape[0] else fbase,
            )
        if F1.size:
            nu += w1[c_lo:c_hi, None] * hist1[None, :]
            xs = excl_single[c_lo:c_hi]
            for r_ in np.flatnonzero(xs > 0):
                nu[r_] -= w1[c_lo + r_] * _split_hist(np.array([xs[r_]]), delta, G)
            np.maximum(nu, 0.0, out=nu)
        cdf = compound_poisson_cdf(nu, G)
        np.cumsum(cdf * delta, axis=1, out=Hb[c_lo:c_hi, 1:])
    return Hb, delta, row, same


def estimate_spec_agentic(
    spec: Any,
    Ns: Any,
    *,
    conversations: int = 2000,
    seed: int = 0,
    block_size: int = 16,
    engine: str = "vllm",
    metric: str = "tokens",
    **kwargs: Any,
) -> AgenticEstimate:
    """The stationary Poisson form for a :class:`~kvhit.workload.spec.WorkloadSpec`: ``conversations`` drawn
    from the spec (:func:`kvhit.workload.generate.generate`, ``seed``) are the marks, ``spec.lam0`` the rate.
    A spec counts blocks only: prompts are ``R·b − 1`` tokens (the practical model, eq. (28)) with
    ``block_size`` b. The answer carries the sampling error of the drawn conversations (seeded)."""
    from kvhit.workload.generate import generate
    from kvhit.workload.spec import WorkloadSpec

    if not isinstance(spec, WorkloadSpec):
        raise AgenticError(f"spec: expected a WorkloadSpec, got {type(spec).__name__}")
    if not isinstance(conversations, int) or conversations < 2:
        raise AgenticError(f"conversations: expected an integer >= 2, got {conversations!r}")
    if not isinstance(block_size, int) or block_size < 1:
        raise AgenticError(f"block_size: expected an integer >= 1, got {block_size!r}")
    tr = generate(spec, seed, n_conversations=conversations)
    if not tr.block_size:
        tr.meta["block_size"] = block_size
    return estimate_trace(tr, Ns, engine=engine, metric=metric, lam0=float(spec.lam0), **kwargs)
