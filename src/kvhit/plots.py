"""Figures (matplotlib, Agg canvas: no display needed).

:func:`plot_fig2` reproduces the paper's Fig. 2 (App. E): (a) the empirical pmf of the number of turns M per
conversation and (b) the marginal empirical pmf of the number of new KV blocks per turn Z_j (the paper's tail
rule, :mod:`kvhit.workload.blocks`), over the measured conversations of a ShareGPT trace.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["fig2_data", "plot_fig2"]


def fig2_data(trace, n_warm: int | None = None, *, measured_only: bool = True) -> dict:
    """The numbers behind Fig. 2: turn counts M of the measured conversations (ids ≥ ``n_warm``; default from
    ``trace.meta['n_warm']``, else 0) and the increments Z_j of all their turns, with summary statistics."""
    if n_warm is None:
        n_warm = int(trace.meta.get("n_warm", 0)) if measured_only else 0
    mask = trace["conv"] >= int(n_warm) if measured_only else np.ones(trace.n_turns, dtype=bool)
    if not mask.any():
        raise ValueError(f"fig2: no measured conversation (n_warm={n_warm} ≥ number of conversations)")
    sub = trace.select(mask)
    M = sub.conversations()["M"]
    Z = sub["Z"]
    return {
        "M": M,
        "Z": Z,
        "n_conversations": int(M.size),
        "n_turns": int(M.sum()),
        "mean_M": float(M.mean()),
        "var_M": float(M.var()),
        "max_M": int(M.max()),
        "mean_Z": float(Z.mean()),
        "max_Z": int(Z.max()),
    }


def _pmf(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = np.bincount(x)
    k = np.flatnonzero(counts)
    return k, counts[k] / x.size


def plot_fig2(
    trace,
    out_prefix: str | Path,
    n_warm: int | None = None,
    *,
    measured_only: bool = True,
    z_quantile: float = 0.995,
) -> list[Path]:
    """Write ``{out_prefix}.png`` and ``{out_prefix}.svg`` with panels (a) pmf of M and (b) pmf of Z_j.

    Panel (b)'s x-axis stops at the ``z_quantile`` quantile of Z (the maximum is printed in the panel).
    Returns the written paths.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    d = fig2_data(trace, n_warm, measured_only=measured_only)
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax_a, ax_b = fig.subplots(1, 2)
    k, pm = _pmf(d["M"])
    ax_a.bar(k, pm, width=0.8, color="#3b6ea8")
    ax_a.set_xlabel("number of turns M")
    ax_a.set_ylabel("empirical pmf")
    ax_a.set_title("(a) turns per conversation")
    ax_a.text(
        0.97,
        0.95,
        f"{d['n_conversations']:,} conversations\n{d['n_turns']:,} turns\n"
        f"mean {d['mean_M']:.4f}\nvar {d['var_M']:.4f}\nmax {d['max_M']}",
        transform=ax_a.transAxes,
        ha="right",
        va="top",
        fontsize=9,
    )
    k, pz = _pmf(d["Z"])
    zmax = max(1, int(np.quantile(d["Z"], z_quantile)))
    keep = k <= zmax
    ax_b.bar(k[keep], pz[keep], width=0.8, color="#c0504d")
    ax_b.set_xlabel("new KV blocks per turn $Z_j$")
    ax_b.set_ylabel("empirical pmf")
    b = trace.meta.get("block_size")
    ax_b.set_title("(b) new blocks per turn" + (f" (b = {b})" if b else ""))
    ax_b.text(
        0.97,
        0.95,
        f"mean {d['mean_Z']:.4f}\nmax {d['max_Z']}\n(x-axis to {z_quantile:.1%} quantile)",
        transform=ax_b.transAxes,
        ha="right",
        va="top",
        fontsize=9,
    )
    out = Path(out_prefix)
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "svg"):
        p = out.with_name(out.name + "." + ext)
        fig.savefig(p, dpi=150)
        paths.append(p)
    return paths
