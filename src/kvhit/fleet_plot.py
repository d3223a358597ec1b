"""Figure: fleet token hit ratio vs number of replicas R, one line per router (rows of ``fleet simulate``).

Invariant: the figure shows the simulated numbers only (solid, markers) and, where present, the fleet estimator
(dashed, same colour); byte-reproducible (:func:`kvhit.plots.save_figure`).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_fleet"]


def plot_fleet(rows: list[dict], out_prefix: str | Path, *, title: str = "") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plots import save_figure

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
    ax.set_title(title + " — dashed: estimator", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        return save_figure(fig, out_prefix)
    finally:
        plt.close(fig)
