"""Planning over the h(HBM, DRAM) surface (issue 16 §4): DRAM for a target hit ratio, cheapest HBM/DRAM split.

Both answers are read off a simulated grid (:class:`kvhit.sim.tiers.surface.Surface`), never interpolated:
h is not monotone in DRAM for vLLM native offloading (the all-or-nothing store; see
:mod:`kvhit.sim.tiers.surface`), so "the smallest DRAM size reaching the target" is the smallest *grid* size whose
simulated h reaches it, and a finer answer needs a finer grid. Costs are ``hbm_gib · price_hbm + dram_gib ·
price_dram`` with per-GiB prices the caller gives (no default prices: kvhit ships no price data).

NOT modelled: anything but capacity (bandwidth, latency, the TTFT effect of loads — see ``ttft_saved_s`` of
``kvhit tiers``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Split", "cheapest_split", "dram_for_target"]


def dram_for_target(hit: np.ndarray, dram: np.ndarray, target: float) -> list[float | None]:
    """Per HBM row of ``hit`` (rows: HBM, columns: ``dram``): the smallest ``dram`` whose h ≥ ``target``
    (``None`` if no grid size reaches it)."""
    H = np.asarray(hit, float)
    x = np.asarray(dram, float)
    if H.ndim != 2 or H.shape[1] != x.shape[0]:
        raise ValueError(f"hit: expected shape (HBM, {x.shape[0]}), got {H.shape}")
    order = np.argsort(x, kind="stable")
    out: list[float | None] = []
    for row in H:
        ok = [j for j in order if np.isfinite(row[j]) and row[j] >= target]
        out.append(float(x[ok[0]]) if ok else None)
    return out


@dataclass(frozen=True)
class Split:
    """The cheapest grid pair reaching the target."""

    hbm_index: int
    dram_index: int
    hbm_gib: float
    dram_gib: float
    cost: float
    h: float


def cheapest_split(
    hit: np.ndarray, hbm_gib: np.ndarray, dram_gib: np.ndarray, target: float, price_hbm: float, price_dram: float
) -> Split | None:
    """Among grid pairs with h ≥ ``target``, the one with the lowest ``hbm_gib·price_hbm + dram_gib·price_dram``
    (ties: the higher h, then the smaller HBM); ``None`` if no pair reaches the target."""
    if not (price_hbm >= 0 and price_dram >= 0):
        raise ValueError("prices: expected non-negative numbers")
    H = np.asarray(hit, float)
    hg = np.asarray(hbm_gib, float)
    dg = np.asarray(dram_gib, float)
    best: Split | None = None
    for i in range(H.shape[0]):
        for j in range(H.shape[1]):
            h = H[i, j]
            if not np.isfinite(h) or h < target:
                continue
            c = float(hg[i] * price_hbm + dg[j] * price_dram)
            cand = Split(i, j, float(hg[i]), float(dg[j]), c, float(h))
            if best is None or (c, -h, hg[i]) < (best.cost, -best.h, best.hbm_gib):
                best = cand
    return best
