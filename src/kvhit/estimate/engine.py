"""The engine-aware hit-ratio estimators: the hit ratio of the engine the user runs, from a trace (docs/estimators.md).

* :func:`estimate_engine`: stationary, at capacities N, with the engine's accounting
  (:mod:`kvhit.estimate.accounting`), each history's own size against N (finite capacity), vLLM's tail-first
  partial hits, the Gaussian fluctuations of the displacement (:mod:`kvhit.estimate.occupancy`, Lemma D.1) and
  vLLM's rejections (capacities grouped by the admitted set).
* :func:`estimate_finite`: the paper's model (``accounting="paper"``) with each history's own size in its
  threshold.
* :func:`estimate_window`: the window-exact (transient) form: the rows a measurement counts, each with its own
  realized gap, and no conversation before the system origin (App. E's warm-up).

``accounting="paper", finite=False, fluctuations=False`` is :func:`kvhit.estimate.mean_field.estimate`
(eq. (35)–(39)) exactly.

Invariant: deterministic in the inputs (no sampling); h ≥ 0, of the broadcast shape of N and λ0 (a float for
scalars); without rejections h ≤ h_max = A_hit/A_R.

NOT modelled here: SGLang's radix accounting (:mod:`kvhit.estimate.sglang`), block-id (agentic) traces
(:mod:`kvhit.estimate.agentic`), host tiers (:mod:`kvhit.estimate.tiers`), and any dependence between a tagged
gap and the background displacement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from kvhit.estimate.accounting import EngineAccounting, engine_accounting
from kvhit.estimate.displacement import _phi_table_kernel
from kvhit.estimate.occupancy import _fluct_grid, _hits_per_lambda, _PrefixVariance, _resolve_F
from kvhit.estimate.trace_stats import EstimateError
from kvhit.workload.dists import Interarrival
from kvhit.workload.trace import Trace

# engine_accounting is also imported from here by kvhit.fleet.estimate (kept importable from this module).
__all__ = ["EngineEstimate", "estimate_engine", "estimate_finite", "estimate_window"]


@dataclass(frozen=True, eq=False)
class EngineEstimate:
    """Result of :func:`estimate_engine` (arrays of the broadcast shape of ``N`` and ``lam0``; floats for
    scalars).

    Attributes:
        h: the predicted hit ratio in the chosen metric.
        T_C: τ(C), the root of λ0 E_B τ + λ0 A ∫₀^τ F̄ = C (eq. (38) with the engine's E_B, A and C).
        h_max: the metric's ceiling A_hit/A_R.
        N, lam0: the inputs, broadcast.
        engine, metric, accounting, finite, partial, fluctuations: the model used.
    """

    h: Any
    T_C: Any
    h_max: float
    N: Any
    lam0: Any
    engine: str
    metric: str
    accounting: str
    finite: bool
    partial: bool
    fluctuations: bool


def _capacities(N: Any, integer: bool) -> np.ndarray:
    a = np.asarray(N, dtype=float)
    if a.size == 0:
        raise EstimateError("N: empty")
    if not np.isfinite(a).all() or (a <= 0).any():
        raise EstimateError("N: capacities must be finite and > 0")
    if integer and (a != np.round(a)).any():
        raise EstimateError("N: the finite-capacity / engine estimators need integer capacities (blocks)")
    return a


def estimate_engine(
    source: Trace | EngineAccounting,
    N: Any,
    lam0: Any = None,
    F: Interarrival | str = "empirical",
    *,
    engine: str = "vllm",
    metric: str = "tokens",
    accounting: str = "engine",
    finite: bool = True,
    partial: bool = True,
    fluctuations: bool = True,
    block_size: int | None = None,
    rows: Any = None,
    rejection: bool = True,
) -> EngineEstimate:
    """Hit ratio of the engine the user runs, from a trace (docs/estimators.md derives every term).

    Let C = N − cap_offset and τ(x) the root of λ0 E_B τ + λ0 A ∫₀^τ F̄ = x (eq. (38) with the engine's
    new-block displacement E_B and history displacement A, :class:`EngineAccounting`), and
    G(x) = P(D(W) ≤ x) the probability that a tagged history is displaced by at most x blocks over its gap W:
    F(τ(x)) (mean field) or the Gaussian correction of :class:`_Occupancy` (``fluctuations=True``, Lemma D.1).
    Then ĥ = Σ_{turns j<M} unit · hits_j / Σ_{turns} demand_j with

    * ``finite=False``: hits_j = reuse_j · G(C) (eq. (39): own size negligible against N);
    * ``finite=True`` and whole-content hits (Algorithm 1, ``accounting="paper"``, or ``partial=False``):
      hits_j = reuse_j · G(C − size_j) — no hit when size_j > C;
    * ``finite=True, partial=True`` on a vLLM engine: hits_j = Σ_{i<H_j} G(C − 1 − i) (tail-first freeing:
      block i of the history survives iff D + i + 1 ≤ C).

    ``accounting="paper", finite=False, fluctuations=False`` is :func:`estimate` (eq. (35)–(39)) exactly.

    ``rejection=True`` (vLLM engines): at each capacity N the accounting is that of the admitted requests
    (:meth:`EngineAccounting.admitted`: a request with ⌈T_j/b⌉ > N is rejected — no displacement, no demand,
    no hit — and so are the later turns of its conversation); capacities are grouped by the admitted set,
    which only changes at the distinct values of ⌈T_j/b⌉. When no request is admitted, h = 0. Without
    rejections (N ≥ max ⌈T_j/b⌉, and always for Algorithm 1 / the paper's rule) nothing changes.

    Args:
        source: a :class:`Trace` (read with :func:`engine_accounting`; ``rows`` selects conversations as in
            :func:`trace_moments`) or a precomputed :class:`EngineAccounting` (then ``engine``, ``metric``,
            ``accounting``, ``block_size``, ``rows`` are taken from it).
        N: capacities in blocks (integers unless ``finite=False`` and whole-content), array or scalar.
        lam0: unscaled conversation arrival rate(s), broadcast with N; default: the trace's λ̂0.
        F: ``"empirical"`` (F̂ of the trace's gaps), ``"posterior"`` (exponential, observed mean) or an
            :class:`Interarrival`.
        engine: ``"vllm"`` (≥ 0.24), ``"vllm-0.23"`` or ``"content"`` (Algorithm 1).
        metric: ``"tokens"`` (vLLM's prefix_cache_hits / queries) or ``"blocks"`` (Σ hit blocks / Σ ⌈T/b⌉).
        accounting: ``"engine"`` or ``"paper"``.
        finite, partial, fluctuations: the ingredients above.
    """
    if isinstance(source, Trace):
        acc = engine_accounting(
            source, engine=engine, metric=metric, accounting=accounting, block_size=block_size, rows=rows
        )
    elif isinstance(source, EngineAccounting):
        acc = source
    else:
        raise EstimateError(f"source: expected a Trace or EngineAccounting, got {type(source).__name__}")
    Fr = _resolve_F(F, acc.W)
    if lam0 is None:
        lam0 = acc.lam0_hat
        if not (isinstance(lam0, float) and math.isfinite(lam0) and lam0 > 0):
            raise EstimateError("lam0: not given and not estimable from the source")
    lam = np.asarray(lam0, dtype=float)
    if not np.isfinite(lam).all() or (lam <= 0).any():
        raise EstimateError("lam0: must be finite and > 0")
    Nb, lb = np.broadcast_arrays(_capacities(N, finite and acc.mode == "prefix" and partial), lam)
    if acc.cap_offset and (Nb <= acc.cap_offset).any():
        raise EstimateError(f"N: must exceed {acc.cap_offset} block(s) for engine {acc.engine!r}")
    h = np.empty(Nb.shape)
    tc = np.empty(Nb.shape)
    pv = None
    for lv in np.unique(lb):
        sel = lb == lv
        for acc_g, sub, n_adm in _admission_groups(acc, Nb, sel, rejection):
            v1 = None
            if fluctuations and acc_g is not acc and acc_g.A_R > 0 and acc_g.E_B > 0:
                if pv is None:
                    pv = _PrefixVariance(acc, _fluct_grid(Fr)[2])
                v1 = pv.v1(n_adm)
            hh, tt = _hits_per_lambda(acc_g, Fr, float(lv), Nb[sub].astype(float), finite, partial, fluctuations, v1=v1)
            h[sub], tc[sub] = hh, tt
    scalar = h.ndim == 0

    def out(x):
        return float(x) if scalar else x

    return EngineEstimate(
        h=out(h),
        T_C=out(tc),
        h_max=acc.h_max,
        N=out(Nb.copy()),
        lam0=out(lb.copy()),
        engine=acc.engine,
        metric=acc.metric,
        accounting=acc.accounting,
        finite=bool(finite),
        partial=bool(partial and acc.mode == "prefix"),
        fluctuations=bool(fluctuations),
    )


def _admission_groups(acc: EngineAccounting, Nb: np.ndarray, sel: np.ndarray, rejection: bool):
    """(accounting of the admitted requests, boolean mask of the capacities) for each distinct admitted set
    among the capacities ``Nb[sel]`` (:meth:`EngineAccounting.admitted`)."""
    if not rejection or acc.need is None:
        yield acc, sel, math.inf
        return
    thr = np.unique(acc.need)
    key = np.searchsorted(thr, Nb, side="right")  # number of distinct thresholds ⌈T/b⌉ ≤ N
    for k in np.unique(key[sel]):
        sub = sel & (key == k)
        n_adm = float(thr[k - 1]) if k else 0.0  # the admitted set is {⌈T/b⌉ ≤ n_adm}
        yield (acc if k == thr.size else acc.admitted(n_adm)), sub, n_adm


def estimate_finite(
    source: Trace | EngineAccounting,
    N: Any,
    lam0: Any = None,
    F: Interarrival | str = "empirical",
    *,
    rows: Any = None,
) -> EngineEstimate:
    """The finite-capacity estimator of the paper's model (each turn its own threshold):
    ĥ = Σ_i Σ_{j<M_i} (R_{i,j} − 1) F̂(τ(N − R_{i,j})) / Σ_i Σ_j R_{i,j}, τ(x) solving
    λ0 Ê[B] τ + λ0 Â_H^hash ∫₀^τ F̂̄ = x (eq. (38) with x for N), and no hit when R_{i,j} ≥ N (τ(0) = 0).
    It tends to eq. (39) when R_{i,j}/N → 0. Same as ``estimate_engine(..., accounting="paper",
    finite=True, fluctuations=False)``; vectorized over N and λ0."""
    if isinstance(source, Trace):
        source = engine_accounting(source, accounting="paper", rows=rows)
    return estimate_engine(source, N, lam0, F, accounting="paper", finite=True, fluctuations=False)


# ----------------------------------------------------------------------------------------------------------
# Window-exact (transient) form: the measured rows, their own gaps, and no conversation before the origin
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _prefix_term(C, i, m, sd):  # pragma: no cover - numba
    return 0.5 * math.erfc(-(C - 1 - i + 0.5 - m) / (sd * math.sqrt(2.0)))


@njit(cache=True)
def _row_hits_kernel(H, size, mean, sd, C, prefix, out, xsat, mval, mkey):  # pragma: no cover - numba
    """Expected hit blocks per row: Σ_{i<H} P(D ≤ C − 1 − i) (prefix) or H·P(D ≤ C − size) (whole), with
    D ~ Normal(mean, sd²) and a ½-block continuity correction (sd = 0: D = mean).

    The prefix sum is summed term by term as :func:`_row_hits_reference` sums it, with two exact shortcuts. A
    term is a function of the whole number x = C − 1 − i alone, not decreasing in x, exactly 1.0 from
    ``xsat[r]`` on (:func:`_saturation_point`): the leading terms with x ≥ xsat add up to their count exactly
    (sums of 1.0 from 0.0). And the terms do not increase with i, so once one no longer changes the running sum
    no later one can. Bit for bit the reference's sums (tested).

    ``mval``/``mkey`` (each ``P`` slots per row, P a power of two; empty: none) remember evaluated terms across
    calls at other capacities: a term depends on the whole number x alone (C − 1 − i is exact), so slot
    ``x mod P`` of row r keeps the last (x, term) evaluated there and a call at a nearby capacity reads it back
    instead of evaluating erfc again (the same value: bit for bit). The caller initialises ``mkey`` to NaN."""
    P = mkey.size // H.size if H.size else 0
    for r in range(H.size):
        h = H[r]
        tot = 0.0
        if prefix:
            if sd[r] > 0:
                n = int(h)
                k = 0
                if C - 1 >= 0:
                    k = min(n, int(math.floor(C - 1)) + 1)  # the terms with x ≥ 0 (the reference's break)
                    sat = C - xsat[r]  # the terms with x ≥ xsat
                    k = min(k, int(sat)) if sat > 0 else 0
                    tot = float(k)
                m = mean[r]
                s_ = sd[r]
                for i in range(k, n):
                    x = C - 1 - i
                    if x < 0:
                        break
                    if P:
                        slot = r * P + (int(x) & (P - 1))
                        if mkey[slot] == x:
                            term = mval[slot]
                        else:
                            term = _prefix_term(C, i, m, s_)
                            mval[slot] = term
                            mkey[slot] = x
                    else:
                        term = _prefix_term(C, i, m, s_)
                    nxt = tot + term
                    if nxt == tot:
                        break
                    tot = nxt
            else:
                for i in range(int(h)):
                    x = C - 1 - i
                    if x < 0:
                        break
                    if mean[r] <= x:
                        tot += 1.0
        else:
            x = C - size[r]
            if x >= 0:
                if sd[r] > 0:
                    tot = h * 0.5 * math.erfc(-(x + 0.5 - mean[r]) / (sd[r] * math.sqrt(2.0)))
                elif mean[r] <= x:
                    tot = h
        out[r] = tot


@njit(cache=True)
def _saturation_point(mean, sd, out):  # pragma: no cover - numba
    """Per row, the smallest whole x ≥ 0 at which the prefix sum's term P(D ≤ x) = ½·erfc(−(x + ½ − mean) /
    (sd·√2)) evaluates to exactly 1.0 (then it does at every larger x: the expression does not decrease in x),
    found by bisection on the kernel's own expression (:func:`_prefix_term` with C − 1 − i = x); +inf where
    there is none (sd = 0, or not 1.0 even at x = mean + 10·sd + 2)."""
    for r in range(mean.size):
        out[r] = math.inf
        if not sd[r] > 0:
            continue
        m = mean[r]
        s_ = sd[r]
        hi = math.ceil(max(m, 0.0) + 10.0 * s_) + 2.0
        if not hi < 4.0e15 or _prefix_term(hi + 1.0, 0, m, s_) != 1.0:
            continue
        lo = 0.0
        if _prefix_term(lo + 1.0, 0, m, s_) == 1.0:
            out[r] = lo
            continue
        # narrow the bracket to where ½·erfc first rounds to 1.0 (its argument between −5.6 and −6.2): two
        # evaluations, each moving an end only where term(lo) < 1.0 == term(hi) still holds (the same point is
        # found, in fewer steps)
        g = math.floor(m - 0.5 + 5.6 * s_ * math.sqrt(2.0))
        if lo < g < hi and _prefix_term(g + 1.0, 0, m, s_) != 1.0:
            lo = g
        g = math.ceil(m - 0.5 + 6.2 * s_ * math.sqrt(2.0))
        if lo < g < hi and _prefix_term(g + 1.0, 0, m, s_) == 1.0:
            hi = g
        while hi - lo > 1.0:  # term(lo) < 1.0 == term(hi)
            mid = math.floor(0.5 * (lo + hi))
            if _prefix_term(mid + 1.0, 0, m, s_) == 1.0:
                hi = mid
            else:
                lo = mid
        out[r] = hi


@njit(cache=True)
def _row_hits_reference(H, size, mean, sd, C, prefix, out):  # pragma: no cover - numba
    """:func:`_row_hits_kernel` as first written (every term of the prefix sum evaluated): the reference the tests
    compare the kernel with, bit for bit."""
    for r in range(H.size):
        h = H[r]
        tot = 0.0
        if prefix:
            for i in range(int(h)):
                x = C - 1 - i
                if x < 0:
                    break
                if sd[r] > 0:
                    tot += 0.5 * math.erfc(-(x + 0.5 - mean[r]) / (sd[r] * math.sqrt(2.0)))
                elif mean[r] <= x:
                    tot += 1.0
        else:
            x = C - size[r]
            if x >= 0:
                if sd[r] > 0:
                    tot = h * 0.5 * math.erfc(-(x + 0.5 - mean[r]) / (sd[r] * math.sqrt(2.0)))
                elif mean[r] <= x:
                    tot = h
        out[r] = tot


def _bilinear(tab: np.ndarray, tg: np.ndarray, sg: np.ndarray, t: np.ndarray, s: np.ndarray) -> np.ndarray:
    t = np.clip(t, tg[0], tg[-1])
    s = np.clip(s, sg[0], sg[-1])
    i = np.clip(np.searchsorted(tg, t, side="right") - 1, 0, tg.size - 2)
    j = np.clip(np.searchsorted(sg, s, side="right") - 1, 0, sg.size - 2)
    u = (t - tg[i]) / (tg[i + 1] - tg[i])
    v = (s - sg[j]) / (sg[j + 1] - sg[j])
    return (
        tab[i, j] * (1 - u) * (1 - v)
        + tab[i + 1, j] * u * (1 - v)
        + tab[i, j + 1] * (1 - u) * v
        + tab[i + 1, j + 1] * u * v
    )


def estimate_window(
    trace: Trace,
    N: Any,
    lam0: float,
    *,
    window: Any = None,
    engine: str = "vllm",
    metric: str = "tokens",
    accounting: str = "engine",
    partial: bool = True,
    fluctuations: bool = True,
    origin: float | None = 0.0,
    block_size: int | None = None,
    n_t: int = 96,
    n_s: int = 48,
    rejection: bool = True,
    tables: Any = None,
) -> EngineEstimate:
    """The engine estimator evaluated on the rows a measurement actually counts (window-exact form).

    The predicted hit ratio is Σ_{r ∈ window} unit·E[hits_r] / Σ_{r ∈ window} demand_r over the window's rows
    (the metric's own ratio of sums), where row r (turn j+1 ≥ 2 of its conversation, gap W_r since turn j,
    which happened s_r seconds after ``origin``) has E[hits_r] = Σ_{i<H_j} P(D_r ≤ C − 1 − i) (vLLM,
    tail-first freeing; ``partial=False`` or whole content: H_j·P(D_r ≤ C − size_j)). D_r, the displacement
    over (s_r, s_r + W_r], is the Poisson random measure of Lemma D.1 restricted to conversations that arrived
    after the origin (no conversation exists before the system starts: the warm-up transient of App. E), with
    mean λ0 m₁(W_r; s_r) and variance λ0 V₁(W_r; s_r) tabulated on an ``n_t`` × ``n_s`` grid and
    interpolated; the marks are the trace's own conversations (all of them). ``origin=None`` drops the
    restriction (stationary). ``fluctuations=False`` uses D_r = its mean.

    Each row's own realized gap W_r is used (the tagged gap, independent of the background in the model);
    the background is never replayed.

    ``rejection=True`` (vLLM engines): at capacity N, rows with ⌈T_j/b⌉ > N are rejected (left out of the
    numerator and the denominator, as the simulator's metrics do) and the background is the admitted
    accounting :meth:`EngineAccounting.admitted` (one moment table per distinct admitted set).

    ``tables``: a callable ``(accounting, tgrid, sgrid) → (m_tab, v_tab)`` that returns the moment tables of the
    whole accounting (admitted subsets still use the kernel) in place of
    :func:`kvhit.estimate.displacement._phi_table_kernel` (the fleet curve's tables shared across routings,
    :func:`kvhit.fleet.shared_tables.SharedTables`); default: the kernel.
    """
    if not isinstance(trace, Trace):
        raise EstimateError(f"trace: expected a Trace, got {type(trace).__name__}")
    acc = engine_accounting(trace, engine=engine, metric=metric, accounting=accounting, block_size=block_size)
    lam0 = float(lam0)
    if not (math.isfinite(lam0) and lam0 > 0):
        raise EstimateError(f"lam0: must be finite and > 0, got {lam0!r}")
    Ns = _capacities(N, True)
    if window is None:
        wmask = np.ones(trace.n_turns, bool)
    elif hasattr(window, "mask"):
        wmask = np.asarray(window.mask(trace), bool)
    else:
        wmask = np.asarray(window, bool)
        if wmask.shape != (trace.n_turns,):
            raise EstimateError(f"window: a row mask must have shape ({trace.n_turns},), got {wmask.shape}")
    # rows in conversation-major order, as in engine_accounting (all conversations)
    order = trace.conv_index()[2]
    conv = trace["conv"][order]
    first = np.concatenate([[True], conv[1:] != conv[:-1]])
    t_abs = np.asarray(trace["time"], dtype=float)[order]
    wm = wmask[order]
    # metric demand per row and the previous turn's reuse/size
    ptr = acc.conv_ptr
    last = np.zeros(conv.size, bool)
    last[ptr[1:] - 1] = True
    reuse_all = np.empty(conv.size)
    size_all = np.empty(conv.size)
    reuse_all[~last] = acc.reuse
    size_all[~last] = acc.size
    reuse_all[last] = 0.0
    size_all[last] = 0.0
    demand = _row_demand(trace, acc, order)
    rev = wm & ~first  # measured revisits
    H = np.concatenate([[0.0], reuse_all[:-1]])[rev]
    S = np.concatenate([[0.0], size_all[:-1]])[rev]
    W = (t_abs - np.concatenate([[0.0], t_abs[:-1]]))[rev]
    t0 = float(trace["conv_arrival"].min()) if origin is None else float(origin)
    s_start = t_abs[rev] - W - t0  # time of the previous access since the origin
    if origin is None:
        s_start = np.full(W.size, np.inf)
    wmax = float(W.max()) if W.size else 1.0
    tg = np.unique(np.concatenate([np.linspace(0.0, wmax, n_t), np.quantile(W, np.linspace(0, 1, n_t))]))
    life = float(acc.offsets.max())
    if origin is None:
        sg = np.array([0.0, 1.0]) * (life + 1.0) + 1e12  # beyond every lifetime: stationary
        s_eval = np.full(W.size, sg[0])
    else:
        sg = np.unique(np.concatenate([np.linspace(0.0, life + wmax, n_s), [life + wmax + 1.0]]))
        s_eval = np.maximum(s_start, 0.0)
    h = np.empty(Ns.shape)
    flat = Ns.ravel()
    hf = h.ravel()
    # rows of ``order`` are the accounting's rows (conversation-major, all conversations)
    need_rows = acc.need if (rejection and acc.need is not None) else None
    groups = (
        [(acc, np.ones(flat.size, bool), math.inf)]
        if need_rows is None
        else list(_admission_groups(acc, flat, np.ones(flat.size, bool), True))
    )
    for acc_g, sub, n_adm in groups:
        adm = np.ones(conv.size, bool) if need_rows is None else need_rows <= n_adm
        den = float(demand[wm & adm].sum())
        if den <= 0:
            hf[sub] = 0.0
            continue
        keep = adm[rev]  # the measured revisits that are admitted (their previous turn then is too)
        if tables is not None and acc_g is acc:
            m_tab, v_tab = tables(acc_g, tg, sg)
        else:
            m_tab = np.zeros((tg.size, sg.size))
            v_tab = np.zeros((tg.size, sg.size))
            _phi_table_kernel(acc_g.conv_ptr, acc_g.offsets, acc_g.cum_new, acc_g.hist_all, tg, sg, m_tab, v_tab)
        Wk, sk = W[keep], s_eval[keep]
        mean = lam0 * _bilinear(m_tab, tg, sg, Wk, sk) / acc.L
        sd = np.sqrt(lam0 * _bilinear(v_tab, tg, sg, Wk, sk) / acc.L) if fluctuations else np.zeros(Wk.size)
        out = np.empty(Wk.size)
        Hk, Sk = H[keep], S[keep]
        xsat = np.empty(Wk.size)
        _saturation_point(mean, sd, xsat)
        ks = np.flatnonzero(sub)
        # terms remembered across capacities (P slots a row: twice the longest history, at most 16), ascending N
        P = 0 if ks.size < 2 or Hk.size == 0 else min(16, 1 << int(2 * max(float(Hk.max()), 1.0) - 1).bit_length())
        mval, mkey = np.empty(Hk.size * P), np.full(Hk.size * P, np.nan)
        for k in ks[np.argsort(flat[ks], kind="stable")]:
            n = flat[k]
            C = float(n - acc.cap_offset)
            _row_hits_kernel(Hk, Sk, mean, sd, C, acc.mode == "prefix" and partial, out, xsat, mval, mkey)
            hf[k] = acc.unit * out.sum() / den
    h = hf.reshape(Ns.shape)
    scalar = h.ndim == 0
    return EngineEstimate(
        h=float(h) if scalar else h,
        T_C=math.nan,
        h_max=acc.h_max,
        N=float(Ns) if scalar else Ns,
        lam0=lam0,
        engine=acc.engine,
        metric=acc.metric,
        accounting=acc.accounting,
        finite=True,
        partial=bool(partial and acc.mode == "prefix"),
        fluctuations=bool(fluctuations),
    )


def _row_demand(trace: Trace, acc: EngineAccounting, order: np.ndarray) -> np.ndarray:
    if acc.engine in ("paper", "content"):
        return np.asarray(trace["R"], dtype=float)[order]
    b = acc.block_size
    T = (
        np.asarray(trace["cum_tokens"], dtype=np.int64)[order]
        if "cum_tokens" in trace.cols
        else np.asarray(trace["R"], dtype=np.int64)[order] * b - 1
    )
    return T.astype(float) if acc.metric == "tokens" else (-(-T // b)).astype(float)
