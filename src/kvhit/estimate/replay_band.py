"""Expected value and realisation band of SGLang and of the host tiers on a block-id trace, by exact replays at
redrawn start times (issue 23 §5/§6; ``docs/estimators.md`` §4.3).

The vLLM band (:mod:`kvhit.estimate.band`) replays the trace ``K`` times through the exact vLLM simulator, the
conversations' start times redrawn by the band's start law (:data:`kvhit.estimate.band.DEFAULT_ORDER`, ``keep-span``:
the order kept, starts uniform on the observed span widened by one mean spacing, the start histogram where a KS
test rejects uniformity; until 2026-12-03 ``random``: i.i.d. from the start histogram — the measurements of
docs/estimators.md §4.3 were made with it), and keeps the estimator's ``E[h]`` beside the replays' mean. Here the
same ``K`` realisations (same draws at the same ``seed`` and ``order``: :func:`start_draws`) go through

* SGLang 0.5.23 ``UnifiedRadixCache`` with LRU, page size 1 (:func:`kvhit.sim.sglang.run.radix_curve` on
  :func:`kvhit.sim.sglang.streams.streams_from_production`, one simulation per pool: no one-pass curve), and
* the two-tier GPU + host surface (:func:`kvhit.sim.tiers.surface.hit_surface`, compiled passes: vLLM native
  offloading, LMCache, SimpleCPUOffload eager),

and the *replays' mean is the expected value*: ``m = (1/K) Σ_k h_{S^(k)}``, an unbiased Monte Carlo estimate of
``E_S[h_S]`` under the fitted start law, with standard error ``se = s/√K`` (returned). The band for one new
realisation is (B1) of :mod:`kvhit.estimate.band`: ``m ∓ t_{K−1, 1−α/2} · √(1 + 1/K) · s``, clipped to
``[0, h_max]``. The analytic estimators (:mod:`kvhit.estimate.sglang_agentic`, :mod:`kvhit.estimate.tiers`) missed
the issue's 0.01 target on WEKA (0.048 and 0.030–0.046); the replay mean has no model bias, only its Monte Carlo
error and the fitted start law's difference from the true one.

Invariant: at seed ``seed`` the K realisations are those of :func:`kvhit.estimate.band.realisation_replays` at the
same seed (the vLLM band's), and the result is bit-for-bit reproducible; infeasible capacities (SGLang: a request
needing more than the pool; tiers: a request larger than the GPU) are NaN. ``validated`` is false: no benchmark has
shown the targets for these bands (``benchmarks/replay_band_accuracy.py``).

NOT modelled: what the simulators do not model (their docstrings: holds, page sizes > 1 here, SGLang policies other
than LRU), randomness of the number of conversations or of their inner timing (only start times are redrawn), and
the normality behind (B1) (its coverage is measured). Cost: ``K`` exact simulations per capacity (SGLang) or per
(HBM, host) pair (tiers) — see the benchmark for the seconds per 1,000 capacities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvhit.estimate.agentic import AgenticError
from kvhit.estimate.band import DEFAULT_ORDER, ORDERS, prediction_factor, realisations

__all__ = [
    "ReplayBand",
    "replay_band",
    "sglang_band",
    "sglang_replays",
    "start_draws",
    "tier_replays",
    "tiers_band",
]

#: the note every output of this module carries: no benchmark has shown the targets for these bands
NOT_VALIDATED = (
    "not validated: the expected value is the mean of {K} exact {what} replays at redrawn start times (the "
    "conversations' order kept; Monte Carlo standard error up to {se:.3f}); benchmarks/replay_band_accuracy.py "
    "measures it against held-out WEKA pools (docs/estimators.md §4.3)"
)


def start_draws(pt, replays: int, seed: int, bins=None, order: str = DEFAULT_ORDER):
    """The ``replays`` re-timed traces of ``pt`` (generator), start times drawn by the band's law ``order``
    (:data:`~kvhit.estimate.band.DEFAULT_ORDER`: :func:`~kvhit.estimate.band.draw_span_starts`; ``random`` /
    ``keep``: :func:`~kvhit.estimate.band.draw_starts`) with one ``default_rng(seed)`` drawn in order — the
    realisations of :func:`kvhit.estimate.band.realisation_replays` at the same seed and order."""
    if isinstance(replays, bool) or not isinstance(replays, int) or not 2 <= replays <= 1000:
        raise AgenticError(f"replays: expected an integer in 2–1000, got {replays!r}")
    if order not in ORDERS:
        raise AgenticError(f"order: expected one of {ORDERS}, got {order!r}")
    yield from realisations(pt, replays, seed, order, bins)


def sglang_replays(
    pt,
    Cs: Any,
    *,
    replays: int = 16,
    seed: int = 0,
    bins=None,
    workers: int | None = None,
    order: str = DEFAULT_ORDER,
) -> np.ndarray:
    """Exact SGLang token hit ratios (``replays`` × len(Cs)) of ``replays`` start-time realisations of ``pt``
    (UnifiedRadixCache, LRU, page size 1; pools ``Cs`` in tokens); NaN where a request does not fit the pool."""
    from kvhit.sim.sglang.run import radix_curve
    from kvhit.sim.sglang.streams import streams_from_production

    Cs = np.asarray(Cs, np.int64)
    if Cs.ndim != 1 or Cs.size == 0 or (Cs < 1).any():
        raise AgenticError("Cs: expected a non-empty 1-D sequence of pool sizes ≥ 1 token")
    out = np.full((replays, Cs.shape[0]), np.nan)
    for k, q in enumerate(start_draws(pt, replays, seed, bins, order)):
        out[k] = radix_curve(streams_from_production(q), Cs, workers=workers)["token_hit_ratio"]
    return out


def tier_replays(
    pt,
    hbm_blocks: Any,
    host_units: Any,
    *,
    tier: str,
    replays: int = 16,
    seed: int = 0,
    bins=None,
    engine: str = "vllm",
    workers: int = 1,
    order: str = DEFAULT_ORDER,
    **kw: Any,
) -> np.ndarray:
    """Exact two-tier hit ratios (``replays`` × len(hbm) × len(host)) of ``replays`` start-time realisations of
    ``pt`` (:func:`kvhit.sim.tiers.surface.hit_surface`; ``kw``: the tier's options, e.g. ``chunk_tokens``); NaN
    where a request is larger than the GPU (as the estimator, the ratio would be over admitted requests only)."""
    from kvhit.sim.tiers.surface import hit_surface

    Ns = np.asarray(hbm_blocks, np.int64)
    Hs = np.asarray(host_units, np.int64)
    N_min = int((-(-pt.prompt_tokens // pt.block_size)).max()) if pt.n_requests else 0
    out = np.full((replays, Ns.shape[0], Hs.shape[0]), np.nan)
    ok = Ns >= N_min
    if not ok.any():
        return out
    for k, q in enumerate(start_draws(pt, replays, seed, bins, order)):
        rq = q.to_block_requests()
        s = hit_surface(
            rq.prompt_tokens,
            rq.hash_offsets,
            rq.hashes,
            tier=tier,
            gpu_blocks=Ns[ok],
            host=Hs,
            block_size=rq.block_size,
            engine=engine,
            workers=workers,
            **kw,
        )
        out[k, ok] = s.hit
    return out


@dataclass(frozen=True)
class ReplayBand:
    """Summary of ``K`` replays ``h`` (K, …): ``mean`` (the expected value), ``se`` (its Monte Carlo standard
    error s/√K), ``sd``, the band ``lo`` / ``hi`` (B1) at ``level``, clipped to ``[0, h_max]``."""

    h: np.ndarray
    mean: np.ndarray
    se: np.ndarray
    sd: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    level: float

    def band_dict(self, seed: int, what: str) -> dict:
        """The ``band`` field of the outputs: how the band was made, and the replay mean's standard error."""
        se = np.asarray(self.se, float).ravel()
        return {
            "method": f"mean and spread of {self.h.shape[0]} exact {what} replays at redrawn start times "
            "(docs/estimators.md §4.3, eq. (B1))",
            "level": float(self.level),
            "replays": int(self.h.shape[0]),
            "seed": int(seed),
            "expected_value": "replay mean",
            "mc_se": [float(x) if math.isfinite(x) else None for x in se],
        }


def replay_band(H: np.ndarray, level: float = 0.9, h_max: float = 1.0) -> ReplayBand:
    """(B1) over axis 0 of ``H`` (replays × …): mean, standard error, and the prediction band for one new
    realisation at ``level``; NaN where any replay is NaN (infeasible)."""
    if not (isinstance(level, float | int) and 0.5 <= float(level) < 1.0):
        raise AgenticError(f"level: expected a probability in [0.5, 1), got {level!r}")
    H = np.asarray(H, np.float64)
    K = H.shape[0]
    if K < 2:
        raise AgenticError(f"replays: expected at least 2, got {K}")
    m = H.mean(axis=0)
    s = H.std(axis=0, ddof=1)
    q = prediction_factor(level, K)
    top = float(h_max) if math.isfinite(h_max) else 1.0
    lo = np.clip(m - q * s, 0.0, top)
    hi = np.clip(m + q * s, 0.0, top)
    return ReplayBand(h=H, mean=m, se=s / math.sqrt(K), sd=s, lo=lo, hi=hi, level=float(level))


def _max_se(se: np.ndarray) -> float:
    f = np.asarray(se, float)[np.isfinite(se)]
    return float(f.max()) if f.size else float("nan")


def sglang_band(
    pt,
    Cs: Any,
    *,
    level: float = 0.9,
    replays: int = 16,
    seed: int = 0,
    widen: float = 0.0,
    tol: float = 0.01,
    workers: int | None = None,
    estimate: Any = None,
):
    """SGLang on a block-id trace at pools ``Cs`` (tokens), treated as the vLLM band
    (:func:`kvhit.estimate.band.estimate_trace_band`): an :class:`~kvhit.estimate.agentic.AgenticEstimate` whose
    ``h`` is the analytic estimate (:func:`kvhit.estimate.sglang_agentic.estimate_trace_sglang`; ``estimate``: it,
    if already computed), ``h_mc`` the mean of ``replays`` exact SGLang replays at redrawn start times (an
    unbiased Monte Carlo estimate of the expected value; its standard error in ``band["mc_se"]``), ``h_lo`` /
    ``h_hi`` the band (B1) at ``level`` around ``h_mc`` — widened to contain ``h`` where ``|h − h_mc|`` exceeds
    ``tol`` + 2 standard errors, and by ``widen`` on each side — and ``regime["validated"]`` false."""
    from dataclasses import replace

    from kvhit.estimate.sglang_agentic import estimate_trace_sglang

    est = estimate if estimate is not None else estimate_trace_sglang(pt, Cs)
    H = sglang_replays(pt, est.N, replays=replays, seed=seed, workers=workers)
    rb = replay_band(H, level, est.h_max)
    ok = ~est.infeasible
    m = np.where(ok, rb.mean, np.nan)
    off = ok & (np.abs(est.h - rb.mean) > tol + 2.0 * rb.se)
    lo = np.where(off, np.minimum(rb.lo, est.h), rb.lo)
    hi = np.where(off, np.maximum(rb.hi, est.h), rb.hi)
    lo = np.where(ok, np.clip(lo - widen, 0.0, est.h_max), np.nan)
    hi = np.where(ok, np.clip(hi + widen, 0.0, est.h_max), np.nan)
    regime = dict(est.regime)
    regime["validated"] = False
    notes = list(regime.get("notes", []))
    if off.any():
        worst = float(np.abs(est.h - rb.mean)[off].max())
        notes.append(
            f"the estimate differs from the mean of {replays} exact replays by up to {worst:.3f} at "
            f"{int(off.sum())} pools: band widened to contain it"
        )
    notes.append(NOT_VALIDATED.format(K=replays, what="SGLang", se=_max_se(rb.se[ok])))
    regime["notes"] = notes
    band = rb.band_dict(seed, "SGLang (UnifiedRadixCache, LRU)")
    band["expected_value"] = "h: the analytic estimate; h_mc: the replay mean"
    band["widen"] = float(widen)
    band["widened"] = [bool(x) for x in off]
    return replace(est, h_mc=m, h_lo=lo, h_hi=hi, level=float(level), band=band, regime=regime)


def tiers_band(
    pt,
    hbm_blocks: Any,
    host_units: Any,
    *,
    tier: str,
    level: float = 0.9,
    replays: int = 16,
    seed: int = 0,
    widen: float = 0.0,
    workers: int = 1,
    **kw: Any,
) -> dict:
    """Two-tier surface of a block-id trace from ``replays`` exact replays at redrawn start times: ``h`` (the
    replays' mean, the expected value; NaN where a request is larger than the GPU), ``h_lo`` / ``h_hi`` (B1 at
    ``level``, widened by ``widen``), ``mc_se``, ``level``, ``band`` (how), ``validated`` (false) and ``notes``
    — arrays of shape (len(hbm), len(host)). ``kw``: the tier's options (``chunk_tokens``, …)."""
    H = tier_replays(pt, hbm_blocks, host_units, tier=tier, replays=replays, seed=seed, workers=workers, **kw)
    from kvhit.workload.reuse import request_reuse

    u = request_reuse(pt)
    T = u.prompt_tokens.astype(np.float64)
    # the ceiling: every full block seen before is found (no tier caps its hit at T − 1 here: native does not),
    # or the largest replay where a realisation's own order reaches further
    ceil = float(np.minimum(u.block_size * u.L_any, T).sum() / T.sum()) if T.sum() else 1.0
    top = np.fmax(ceil, np.nanmax(np.where(np.isfinite(H), H, -np.inf), axis=0))
    rb = replay_band(H, level, 1.0)
    lo = np.clip(rb.lo - widen, 0.0, top)
    hi = np.clip(rb.hi + widen, 0.0, top)
    band = rb.band_dict(seed, f"two-tier ({tier})")
    band["widen"] = float(widen)
    return {
        "h": rb.mean,
        "h_lo": lo,
        "h_hi": hi,
        "mc_se": rb.se,
        "level": float(level),
        "band": band,
        "validated": False,
        "notes": [NOT_VALIDATED.format(K=replays, what=f"two-tier ({tier})", se=_max_se(rb.se))],
    }
