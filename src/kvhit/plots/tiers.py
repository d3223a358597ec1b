"""Figure of the h(HBM, DRAM) surface (:class:`kvhit.sim.tiers.surface.Surface`): a heatmap with iso-hit contours.

Invariant: the figure shows the surface's numbers only (cells = simulated pairs, contours interpolated between
them, labelled); byte-reproducible like every kvhit figure (:func:`kvhit.plots.curves.save_figure`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["plot_ratio_curve", "plot_surface"]


def plot_surface(
    surface, out_prefix: str | Path, *, x=None, xlabel: str = "host capacity", levels=None, warning: str | None = None
) -> list[Path]:
    """Heatmap of ``surface.hit`` (rows: GPU blocks, columns: ``x``) with labelled iso-hit contours; ``warning`` (a
    window that did not reach steady state) is written across the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvhit.plots.curves import save_figure

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
    if warning:  # a measured window that did not reach steady state (kvhit.service.steady)
        ax.text(0.5, 0.5, warning, transform=ax.transAxes, ha="center", va="center", color="#c00", fontsize=11,
                wrap=True, bbox={"facecolor": "white", "edgecolor": "#c00", "alpha": 0.9})  # fmt: skip
    fig.tight_layout()
    try:
        return save_figure(fig, out_prefix)
    finally:
        plt.close(fig)


def plot_ratio_curve(
    surface, out_prefix: str | Path, *, x, xlabel: str = "--hicache-ratio", warning: str | None = None
) -> list[Path]:
    """h against the host pool (one line per HBM size, columns ``x``) with each HBM size's hit ratio without the
    host tier dashed (``surface.gpu_hit``): the HiCache curve of ``kvhit tiers --tier hicache``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvhit.plots.curves import save_figure

    H = np.asarray(surface.hit, float)
    xs = np.asarray(x, float)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, N in enumerate(surface.gpu_blocks):
        (line,) = ax.plot(xs, H[i], marker="o", label=f"{int(N):,} device blocks")
        if np.isfinite(surface.gpu_hit[i]):
            ax.axhline(surface.gpu_hit[i], color=line.get_color(), ls="--", lw=0.8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("token hit ratio h (device + host)")
    ax.set_ylim(0, max(0.05, float(np.nanmax(H)) * 1.1) if np.isfinite(H).any() else 1)
    ax.set_title(f"{surface.tier}: h vs host pool (dashed: without HiCache)", fontsize=10)
    if warning:  # a measured window that did not reach steady state (kvhit.service.steady)
        ax.text(0.5, 0.5, warning, transform=ax.transAxes, ha="center", va="center", color="#c00", fontsize=11,
                wrap=True, bbox={"facecolor": "white", "edgecolor": "#c00", "alpha": 0.9})  # fmt: skip
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        return save_figure(fig, out_prefix)
    finally:
        plt.close(fig)
