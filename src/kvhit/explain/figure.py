"""The waterfall figure: one bar per stage step (floating), in the token-weighted hit ratio, with the values.

Invariant: the figure shows :meth:`kvhit.explain.waterfall.Waterfall.table`'s numbers only; byte-reproducible
like every kvhit figure (:func:`kvhit.plots.curves.save_figure`).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_waterfall"]


def plot_waterfall(wf, out_prefix: str | Path, *, weighting: str = "token") -> list[Path]:
    """Write ``PREFIX.png`` and ``PREFIX.svg``: reusable share, each step (red: lost, green: won back), final."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvhit.plots.curves import save_figure

    rows = wf.table()
    labels, bottoms, heights, colors = [], [], [], []
    level = 0.0
    for i, r in enumerate(rows):
        step = r[f"{weighting}_step"]
        if i == 0:
            labels.append("reusable\n(infinite cache)")
            bottoms.append(0.0)
            heights.append(step)
            colors.append("#4c72b0")
        else:
            labels.append(r["stage"] + ("" if r["configured"] else "\n(not configured)"))
            lo, hi = sorted((level, level + step))
            bottoms.append(lo)
            heights.append(hi - lo)
            colors.append("#c44e52" if step < 0 else "#55a868")
        level += step
    labels.append("final")
    bottoms.append(0.0)
    heights.append(level)
    colors.append("#4c72b0")
    fig, ax = plt.subplots(figsize=(8.0, 4.2))
    x = range(len(labels))
    ax.bar(x, heights, bottom=bottoms, color=colors, width=0.6)
    for i, (b, h) in enumerate(zip(bottoms, heights, strict=True)):
        txt = f"{h:.4f}" if i in (0, len(labels) - 1) else f"{rows[i][f'{weighting}_step']:+.4f}"
        ax.text(i, b + h + 0.01, txt, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel(f"{weighting}-weighted hit ratio")
    ax.set_ylim(0, max(1.0, max(b + h for b, h in zip(bottoms, heights, strict=True)) + 0.08))
    extra = f", {wf.replicas} replicas ({wf.router})" if wf.replicas > 1 else ""
    ax.set_title(f"where the hit ratio goes: {wf.engine}, N = {wf.N:,} blocks of {wf.block_size}{extra}", fontsize=9)
    fig.tight_layout()
    paths = save_figure(fig, out_prefix)
    plt.close(fig)
    return paths
