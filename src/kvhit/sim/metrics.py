"""Hit-ratio metrics computed from a simulator's per-turn outcomes, over a measurement window.

Simulators return per-event outcomes (a hit indicator for whole-content LRU, hit blocks for the block-level cache);
the weighting and the window are applied here, once, for every simulator:

* eq. (12): h = Σ R_{j−1}·H_j / Σ R_j over measured turns (turns j = 1 have no history and weight 0);
* eq. (31) (practical model): the hit weight is R_{j−1} − 1 (the unhashable tail block is never reused);
* request-level hit rate: the fraction of measured turns j ≥ 2 that hit;
* hit rate per turn index.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from kvhit.workload.trace import Trace, Window

__all__ = ["HitStats", "batch_means", "content_hit_stats", "hit_stats", "mean_ci"]


@dataclass(frozen=True)
class HitStats:
    """Hit statistics over the measured turns.

    Attributes:
        h: block-weighted hit ratio (numerator / denominator).
        numerator: Σ of hit weights over measured turns.
        denominator: Σ R_j over measured turns (the paper's A_R-type demand).
        request_hit_rate: fraction of measured turns with j ≥ 2 that hit (had any reuse).
        n_measured: measured turns (all j).
        n_revisits: measured turns with j ≥ 2.
        per_turn: hit rate among measured turns with index j = 2, 3, … (entry k is turn k + 2).
    """

    h: float
    numerator: float
    denominator: float
    request_hit_rate: float
    n_measured: int
    n_revisits: int
    per_turn: np.ndarray

    def to_dict(self) -> dict:
        d = asdict(self)
        d["per_turn"] = [float(x) for x in self.per_turn]
        return d


def hit_stats(
    trace: Trace,
    hit_weight: np.ndarray,
    hit_any: np.ndarray,
    demand: np.ndarray,
    window: Window | None = None,
) -> HitStats:
    """General form: per-row hit weight (blocks reused), per-row hit indicator and per-row demand."""
    mask = np.ones(trace.n_turns, bool) if window is None else window.mask(trace)
    turn = trace["turn"]
    rev = mask & (turn >= 2)
    num = float(np.sum(hit_weight[mask]))
    den = float(np.sum(demand[mask]))
    n_rev = int(rev.sum())
    req = float(np.mean(hit_any[rev])) if n_rev else float("nan")
    if n_rev:
        jmax = int(turn[rev].max())
        counts = np.bincount(turn[rev] - 2, minlength=jmax - 1)
        hits = np.bincount(turn[rev] - 2, weights=hit_any[rev].astype(float), minlength=jmax - 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            per_turn = np.where(counts > 0, hits / np.maximum(counts, 1), np.nan)
    else:
        per_turn = np.zeros(0)
    return HitStats(num / den if den > 0 else float("nan"), num, den, req, int(mask.sum()), n_rev, per_turn)


def content_hit_stats(
    trace: Trace, hit: np.ndarray, *, window: Window | None = None, practical: bool = False
) -> HitStats:
    """Eq. (12) (``practical=False``) or eq. (31) (``practical=True``) from whole-content hit indicators H_j."""
    hit = np.asarray(hit).astype(bool)
    if hit.shape != (trace.n_turns,):
        raise ValueError(f"hit has shape {hit.shape}, expected ({trace.n_turns},)")
    R_prev = trace.R_prev()
    w = np.maximum(R_prev - 1, 0) if practical else R_prev
    return hit_stats(trace, np.where(hit, w, 0), hit & (trace["turn"] >= 2), trace["R"], window)


def mean_ci(values, level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of a Student-t confidence interval over independent replications."""
    from scipy import stats

    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return float("nan"), float("nan")
    if v.size == 1:
        return float(v[0]), float("inf")
    half = stats.t.ppf(0.5 + level / 2, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size)
    return float(v.mean()), float(half)


def batch_means(
    trace: Trace,
    hit_weight: np.ndarray,
    demand: np.ndarray,
    window: Window | None = None,
    n_batches: int = 10,
    level: float = 0.95,
) -> tuple[float, float]:
    """Batch-means confidence interval for a single long run: the measured turns are cut into ``n_batches``
    consecutive time batches of equal turn counts; h is computed per batch (ratio of sums) and a Student-t
    interval is formed over batches. Returns (h over the whole window, half-width)."""
    mask = np.ones(trace.n_turns, bool) if window is None else window.mask(trace)
    idx = np.flatnonzero(mask)  # rows are sorted by time
    if idx.size < 2 * n_batches:
        return float("nan"), float("nan")
    parts = np.array_split(idx, n_batches)
    hs = [float(hit_weight[p].sum() / demand[p].sum()) for p in parts if demand[p].sum() > 0]
    _, half = mean_ci(hs, level)
    h = float(hit_weight[idx].sum() / demand[idx].sum())
    return h, half
