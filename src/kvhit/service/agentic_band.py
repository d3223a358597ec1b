"""The agentic estimator with its realisation band, as every block-id (``--blocks-trace``) command shows it.

One function, :func:`agentic_estimates`, runs :func:`kvhit.estimate.band.estimate_trace_band` (the expected hit
ratio plus a prediction band for one realisation of the conversations' start times, ``docs/estimators.md`` §4.1)
for each vLLM order, or the plain estimator where no realisation band exists: with a stationary ``--lam0`` the
band is the stationary what-if's error band (``h ± tol``, widened outside
:data:`kvhit.estimate.agentic.STATIONARY_VALIDATED`, issue 23 §4); with a ``--warmup-time`` mask ``h_lo`` /
``h_hi`` are ``None``. A note says which.

Invariant: ``h``, ``h_lo``, ``h_hi`` are ``None`` at infeasible capacities (``N < N_min``); ``validated`` is the
estimator's regime flag *and* the band's region (:data:`kvhit.estimate.band.VALIDATED_REGION`); outside it the
band is widened (:func:`kvhit.estimate.band.estimate_trace_band`) and the note says so. NOT modelled: whatever the
estimator and the band do not model (their docstrings).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["agentic_estimates", "band_rows"]


def agentic_estimates(
    pt,
    Ns,
    engines=("vllm", "vllm-0.23"),
    *,
    metric: str = "tokens",
    lam0: float | None = None,
    mask=None,
    band: bool = True,
    level: float = 0.9,
    replays: int = 16,
    seed: int = 0,
    expected_se: float | None = None,
) -> dict[str, dict[str, Any]]:
    """Per engine: ``h``, ``h_lo``, ``h_hi``, ``h_mc``, ``h_mc_se`` (arrays over ``Ns``, NaN where infeasible or no
    band), ``level``,
    ``regime`` (``validated``, ``notes``), ``band`` (how it was made) and ``h_max``; with ``expected_se`` also
    ``h_exp`` / ``h_exp_se``, the expected value over the exchangeable start law by exact replays to that standard
    error (:func:`kvhit.estimate.band.expected_replays`; NaN without a realisation band)."""
    from kvhit.estimate.agentic import estimate_trace
    from kvhit.estimate.band import estimate_trace_band
    from kvhit.workload.reuse import request_reuse

    Ns = np.asarray(Ns, dtype=np.int64)
    reuse = request_reuse(pt)
    n_sess = int(pt.session.max()) + 1 if pt.session is not None and pt.n_requests else 0
    why_no_band = None
    if not band:
        why_no_band = "no band asked"
    elif lam0 is not None:
        why_no_band = "no realisation band for a stationary --lam0 (the band redraws the trace's own start times)"
    elif mask is not None:
        why_no_band = "no realisation band with a measurement warm-up (--warmup-time)"
    elif n_sess < 2:
        why_no_band = "one conversation: its hit ratio does not depend on when it starts (no band needed)"
    out: dict[str, dict[str, Any]] = {}
    for e in engines:
        if why_no_band is None:
            est, _ = estimate_trace_band(
                pt,
                Ns,
                engine=e,
                metric=metric,
                level=level,
                replays=replays,
                seed=seed,
                reuse=reuse,
                expected_se=expected_se,
            )
            lo, hi = np.asarray(est.h_lo, float), np.asarray(est.h_hi, float)
            mc, mc_se = np.asarray(est.h_mc, float), np.asarray(est.h_mc_se, float)
            if est.h_exp is not None:
                ex, ex_se = np.asarray(est.h_exp, float), np.asarray(est.h_exp_se, float)
            else:
                ex = ex_se = np.full(Ns.shape[0], np.nan)
        else:
            mc = mc_se = ex = ex_se = np.full(Ns.shape[0], np.nan)
            est = estimate_trace(reuse, Ns, engine=e, metric=metric, lam0=lam0, mask=mask)
            lo = hi = np.full(Ns.shape[0], np.nan)
            if lam0 is not None and est.h_lo is not None and band:
                lo, hi = np.asarray(est.h_lo, float), np.asarray(est.h_hi, float)
        regime = dict(est.regime)
        notes = list(regime.get("notes", []))
        if lam0 is not None and why_no_band != "no band asked":
            half = (est.band or {}).get("half_width")
            notes.append(
                f"stationary --lam0: the band is the what-if's error band ±{half:.2f} (the expected hit ratio of the "
                "stationary stream, not one realisation; docs/accuracy.md)"
                + ("" if regime.get("validated") else " — NOT validated here")
            )
        elif why_no_band is not None and why_no_band != "no band asked" and n_sess >= 2:
            notes.append(why_no_band)
            regime["validated"] = False
        regime["notes"] = notes
        h = np.where(est.infeasible, np.nan, est.h)
        lo = np.where(est.infeasible, np.nan, lo)
        hi = np.where(est.infeasible, np.nan, hi)
        out[e] = {
            "h": h,
            "h_lo": lo,
            "h_hi": hi,
            # the replays' mean (the expected value to report on WEKA pools, docs/estimators.md §4.1) and its
            # Monte Carlo standard error; NaN without a realisation band
            "h_mc": np.where(est.infeasible, np.nan, mc),
            "h_mc_se": np.where(est.infeasible, np.nan, mc_se),
            "h_exp": np.where(est.infeasible, np.nan, ex),
            "h_exp_se": np.where(est.infeasible, np.nan, ex_se),
            "level": level if why_no_band is None else None,  # the stationary error band has no level
            "regime": regime,
            "band": est.band,
            "h_max": float(est.h_max),
        }
    return out


def _f(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def band_rows(ests: dict[str, dict[str, Any]], Ns) -> list[dict[str, Any]]:
    """One JSON row per (engine, N): ``N``, ``engine``, ``h``, ``h_lo``, ``h_hi``, ``h_mc``, ``h_mc_se``, ``h_exp``,
    ``h_exp_se``, ``level``,
    ``validated``."""
    rows = []
    for e, d in ests.items():
        for k, N in enumerate(Ns):
            rows.append(
                {
                    "N": int(N),
                    "engine": e,
                    "estimator": "agentic",
                    "h": _f(d["h"][k]),
                    "h_lo": _f(d["h_lo"][k]),
                    "h_hi": _f(d["h_hi"][k]),
                    "h_mc": _f(d["h_mc"][k]) if "h_mc" in d else None,
                    "h_mc_se": _f(d["h_mc_se"][k]) if "h_mc_se" in d else None,
                    "h_exp": _f(d["h_exp"][k]) if "h_exp" in d else None,
                    "h_exp_se": _f(d["h_exp_se"][k]) if "h_exp_se" in d else None,
                    "level": d["level"],
                    "validated": bool(d["regime"].get("validated", False)),
                }
            )
    return rows
