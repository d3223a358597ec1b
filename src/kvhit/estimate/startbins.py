"""Number of bins of the start-time histogram behind the agentic estimator's intensity ``λ̂`` and the band's redraws.

The time-varying agentic estimator (:func:`kvhit.estimate.agentic.estimate_trace`) and the realisation band
(:func:`kvhit.estimate.band.draw_starts`) both model the conversations' start times ``S_1 … S_C`` as i.i.d. draws
from a regular histogram of the trace's own starts on ``[min, max]``. Too many bins make that density lumpier than
the law that generated the starts (each bin's height carries the Poisson noise of a handful of starts), which
inflates the modelled overlap of conversations; one bin erases a real trend.

Rule (``"br"``, the default): the penalised maximum likelihood of Birgé & Rozenholc (2006, "How many bins should be
put in a regular histogram", ESAIM: P&S 10, 24–45): with ``n`` starts and ``N_j`` of them in bin ``j`` of ``D``
equal bins, choose the ``D`` in ``1 … max(1, ⌊n / ln n⌋)`` that maximises

    L(D) = Σ_j N_j · ln(D · N_j / n) − (D − 1 + (ln D)^2.5)                                         (BR)

(``0 · ln 0 = 0``; the first maximiser wins ties), capped at :data:`MAX_BINS`. ``"sqrt"`` is the former rule
``clip(round(√n), 1, MAX_BINS)``.

Invariant: a pure function of the starts (deterministic; invariant under shifting and scaling the times); ``D = 1``
when all starts coincide or ``n < 3``. Not modelled: non-regular (variable-width) bins, smoothing.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["MAX_BINS", "RULES", "start_bins"]

#: the largest number of bins either rule returns (bounds the estimator's cost on traces with many sessions)
MAX_BINS = 24
RULES = ("br", "sqrt")


def start_bins(first, rule: str = "br") -> int:
    """Number of regular bins on ``[min(first), max(first)]`` for the start-time histogram (rule ``"br"`` or
    ``"sqrt"``, see the module docstring)."""
    x = np.asarray(first, np.float64)
    n = int(x.shape[0])
    if rule == "sqrt":
        return int(np.clip(round(math.sqrt(n)), 1, MAX_BINS))
    if rule != "br":
        raise ValueError(f"rule: expected one of {RULES}, got {rule!r}")
    if n < 3:
        return 1
    lo, hi = float(x.min()), float(x.max())
    if hi <= lo:
        return 1
    d_max = int(min(MAX_BINS, max(1, math.floor(n / math.log(n)))))
    # bins on the unit interval: np.histogram refuses d bins on a range too narrow to split (subnormal spreads)
    y = (x - lo) / (hi - lo)
    if not np.isfinite(y).all():
        return 1
    best, best_d = -math.inf, 1
    for d in range(1, d_max + 1):
        cnt, _ = np.histogram(y, bins=d, range=(0.0, 1.0))
        c = cnt[cnt > 0].astype(np.float64)
        val = float(np.sum(c * np.log(d * c / n))) - (d - 1 + math.log(d) ** 2.5)
        if val > best + 1e-12:
            best, best_d = val, d
    return best_d
