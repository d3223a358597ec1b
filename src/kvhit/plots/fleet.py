"""Figures: fleet token hit ratio vs number of replicas R, one line per router (rows of ``fleet simulate``); hit
ratio vs load imbalance as a router parameter is swept (``fleet curve``).

Invariant: the figure shows the simulated numbers only (solid, markers) and, where present, the fleet estimator
(dashed, same colour); byte-reproducible (:func:`kvhit.plots.curves.save_figure`).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_fleet", "plot_fleet_curve"]


def plot_fleet(rows: list[dict], out_prefix: str | Path, *, title: str = "", warning: str | None = None) -> list[Path]:
    """Fleet hit ratio against replicas, one line per router, from ``kvhit fleet simulate``'s rows; written by
    :func:`kvhit.plots.curves.save_figure` (``.png`` and ``.svg``, byte-reproducible). Returns the paths.
    ``warning`` (a window that did not reach steady state) is written across the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvhit.plots.curves import save_figure

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    routers = list(dict.fromkeys(r["router"] for r in rows))
    for i, name in enumerate(routers):
        rr = sorted((r for r in rows if r["router"] == name), key=lambda r: r["replicas"])
        x = [r["replicas"] for r in rr]
        (ln,) = ax.plot(x, [r["token_hit_ratio"] for r in rr], marker="o", ms=4, label=name, color=f"C{i}")
        if any(r.get("estimate") is not None for r in rr):
            xe = [r["replicas"] for r in rr if r.get("estimate") is not None]
            ye = [r["estimate"] for r in rr if r.get("estimate") is not None]
            ax.plot(xe, ye, ls="--", color=ln.get_color(), lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("replicas R (each with the same N)")
    ax.set_ylabel("fleet token hit ratio")
    est = any(r.get("estimate") is not None for r in rows)
    ax.set_title(title + (" — dashed: estimator" if est else ""), fontsize=9)
    ax.grid(alpha=0.3)
    if warning:  # a measured window that did not reach steady state (kvhit.service.steady)
        ax.text(0.5, 0.5, warning, transform=ax.transAxes, ha="center", va="center", color="#c00", fontsize=11,
                wrap=True, bbox={"facecolor": "white", "edgecolor": "#c00", "alpha": 0.9})  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        return save_figure(fig, out_prefix)
    finally:
        plt.close(fig)


def plot_fleet_curve(
    rows: list[dict],
    baselines: list[dict],
    out_prefix: str | Path,
    *,
    label: str,
    title: str = "",
    warning: str | None = None,
):
    """Fleet token hit ratio against load imbalance over time (∫ max / ∫ mean requests in flight per replica), one
    point per value of the swept parameter (annotated), and the baselines' points (``fleet curve``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvhit.plots.curves import save_figure

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    x = [r["imbalance_inflight"] for r in rows]
    y = [r["token_hit_ratio"] for r in rows]
    ax.plot(x, y, marker="o", ms=4, color="C0", label=label)
    for r, xi, yi in zip(rows, x, y, strict=True):
        ax.annotate(f"{r['value']:g}", (xi, yi), textcoords="offset points", xytext=(4, 3), fontsize=7)
    for i, b in enumerate(baselines):
        ax.plot([b["imbalance_inflight"]], [b["token_hit_ratio"]], marker="s", ls="", color=f"C{i + 1}",
                label=b["router"])  # fmt: skip
    ax.set_xlabel("load imbalance over time: ∫ max / ∫ mean requests in flight per replica")
    ax.set_ylabel("fleet token hit ratio")
    ax.set_title(title, fontsize=9)
    if warning:  # a measured window that did not reach steady state (kvhit.service.steady)
        ax.text(0.5, 0.5, warning, transform=ax.transAxes, ha="center", va="center", color="#c00", fontsize=11,
                wrap=True, bbox={"facecolor": "white", "edgecolor": "#c00", "alpha": 0.9})  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        return save_figure(fig, out_prefix)
    finally:
        plt.close(fig)
