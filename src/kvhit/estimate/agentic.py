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

This module holds the estimator (:func:`estimate_trace`, :func:`estimate_spec_agentic`), its answer
(:class:`AgenticEstimate`), the hit sums of (A1) over the segments given the law of ``D``, and the regime flags.
The law of ``D_r(a)`` is :mod:`kvhit.estimate.agentic_displacement`: ``form="poisson"`` (the estimator;
default) the compound Poisson law of the other conversations' footprints (:mod:`kvhit.estimate.agentic_footprint`)
plus the request's own session's, ``form="replay"`` (the working-set identity) the trace's own load. The
stationary form (``lam0``) carries an error band ``h ± tol`` and is ``validated`` only inside
:data:`STATIONARY_VALIDATED` (the benchmarked region; outside it the band is widened and a note says why).

Invariant: ``0 ≤ h ≤ h_max`` at every ``N`` (each block of a segment is hit with a probability in [0, 1], and
only the reusable run up to the cap is counted); rejected requests stay in the denominator as misses.

Not modelled: requests' durations (instantaneous, as :func:`kvhit.sim.vllm.curve.block_curve`); the vLLM ≥ 0.24
``e`` is exact only when the previous request's partial block is the last one (see :mod:`kvhit.sim.vllm.curve`
(★)); colocated response blocks (Remark B.1); what the law of ``D`` leaves out (see
:mod:`kvhit.estimate.agentic_displacement`).
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit

from kvhit.estimate.agentic_displacement import _poisson_table, _poisson_tables, _window_D
from kvhit.estimate.startbins import RULES as BIN_RULES
from kvhit.workload.reuse import RequestReuse, request_reuse

__all__ = [
    "STATIONARY_VALIDATED",
    "AgenticError",
    "AgenticEstimate",
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
    #: the expected hit ratio over the exchangeable start law by exact replays to a requested standard error
    #: (:func:`kvhit.estimate.band.expected_replays`; ``band["expected"]`` says how many), and that error
    h_exp: np.ndarray | None = None
    h_exp_se: np.ndarray | None = None

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
            }
            | ({} if self.h_exp is None else {"h_exp": fl(self.h_exp), "h_exp_se": fl(self.h_exp_se)})
            | {
                "band": self.band,
            }
        )


# --------------------------------------------------------------------------------------------------
# the hit sums of (A1) given the tabulated law of D
# --------------------------------------------------------------------------------------------------


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
    _table: Any = None,
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
    (the distinct blocks its requests in the window touch, Lemma D.1's ``Φ``;
    :func:`~kvhit.estimate.agentic_footprint._footprint_table`), ``"own"`` (first request whole, later ones their
    growth over their own stream's previous request: the behaviour before issue 23 §3), or ``"auto"``: ``"exact"``
    with ``lam0`` (the stationary what-if, where it was validated: ``docs/accuracy.md``), ``"own"`` on the trace's
    own start times (not re-validated yet).

    ``_table`` (internal): the law table and its notes, built by :func:`law_tables` for these very arguments.
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
            if table is None and _table is not None:
                table, tnotes = _table
                notes.extend(tnotes)
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


def law_tables(calls: list) -> list | None:
    """The law tables of several :func:`estimate_trace` calls ``(source, Ns, kwargs)`` on one trace's
    conversations (e.g. the two-tier estimator's GPU term and its tail term: the same requests, other segments),
    built together where they share the templates and value grid (one Lévy sweep per age for all their rows,
    :func:`kvhit.estimate.agentic_displacement._poisson_tables`: equal to rounding to the tables built apart). Each
    entry ``(table, notes)`` goes back as ``_table=`` of the same call. None where a call does not build one table
    for all its capacities (the replay form, an argument it would refuse): the calls then build their own."""
    import inspect

    dflt = {k: v.default for k, v in inspect.signature(estimate_trace).parameters.items()}
    reqs = []
    for source, Ns, kw in calls:
        o = dflt | kw
        lam0 = o["lam0"]
        if (
            o["form"] != "poisson"
            or o["engine"] not in ENGINES
            or o["footprint"] not in FOOTPRINTS
            or o["bin_rule"] not in BIN_RULES
            or (lam0 is not None and not (math.isfinite(float(lam0)) and float(lam0) > 0))
        ):
            return None
        try:
            Ns = _capacities(Ns)
        except AgenticError:
            return None
        u = _prepare(source, o["engine"])
        n = u.n
        meas = np.ones(n, bool) if o["mask"] is None else np.asarray(o["mask"])
        if meas.dtype != np.bool_ or meas.shape != (n,):
            return None
        # as estimate_trace: the measured segments that hold a block below the cap
        cap = u.hit_cap if o["cap_last"] else u.full_blocks
        b = u.block_size
        part = (u.prompt_tokens % b != 0).astype(np.int64)
        Fx = u.full_blocks + (part if o["engine"] == "vllm-0.23" else 0)
        seg_req = np.repeat(np.arange(n, dtype=np.int64), np.diff(u.seg_off))
        keep = (np.minimum(u.seg_end, cap[seg_req]) > u.seg_start) & meas[seg_req]
        if not keep.any():
            return None
        notes: list[str] = []
        fp = o["footprint"]
        args = (u, seg_req[keep], u.seg_src[keep], Fx, Ns, None if lam0 is None else float(lam0), o["bins"],
                o["n_values"], o["n_ages"], o["n_times"], o["exclude"], notes, o["work_budget"])  # fmt: skip
        kwargs = {"footprint": ("exact" if lam0 is not None else "own") if fp == "auto" else fp,
                  "bin_rule": o["bin_rule"]}  # fmt: skip
        reqs.append(((args, kwargs), notes))
    tables = _poisson_tables([r[0] for r in reqs])
    return [(t, r[1]) for t, r in zip(tables, reqs, strict=True)]


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
