"""Figure of the h(HBM, DRAM) surface (:class:`kvhit.sim.tiers.surface.Surface`): a heatmap with iso-hit contours.

Invariant: the figure shows the surface's numbers only (cells = simulated pairs, contours interpolated between
them, labelled); byte-reproducible like every kvhit figure (:func:`kvhit.plots.save_figure`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["plot_surface"]


def plot_surface(surface, out_prefix: str | Path, *, x=None, xlabel: str = "host capacity", levels=None) -> list[Path]:
    """Heatmap of ``surface.hit`` (rows: GPU blocks, columns: ``x``) with labelled iso-hit contours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plots import save_figure

    H = np.asarray(surface.hit, float)
    xs = np.asarray(surface.host if x is None else x, float)
    ys = np.asarray(surface.gpu_blocks, float)
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    im = ax.pcolormesh(np.arange(len(xs) + 1), np.arange(len(ys) + 1), H, cmap="viridis", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, label="token hit ratio h (GPU + host)")
    if H.shape[0] >= 2 and H.shape[1] >= 2 and np.isfinite(H).all():
        lv = levels if levels is not None else np.round(np.linspace(np.nanmin(H), np.nanmax(H), 7)[1:-1], 3)
        lv = np.unique(lv)
        if len(lv) and np.nanmax(H) > np.nanmin(H):
            cs = ax.contour(np.arange(len(xs)) + 0.5, np.arange(len(ys)) + 0.5, H, levels=lv, colors="white")
            ax.clabel(cs, fmt="%.3f", fontsize=7)
    ax.set_xticks(np.arange(len(xs)) + 0.5, [f"{v:g}" for v in xs], rotation=45, fontsize=7)
    ax.set_yticks(np.arange(len(ys)) + 0.5, [f"{int(v):,}" for v in ys], fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("HBM for the KV cache (GPU blocks)")
    ax.set_title(f"h(HBM, DRAM): {surface.tier} tier", fontsize=10)
    fig.tight_layout()
    try:
        return save_figure(fig, out_prefix)
    finally:
        plt.close(fig)
