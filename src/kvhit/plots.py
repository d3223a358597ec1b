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


def plot_curves(
    curves: dict,
    out_prefix,
    *,
    h_max: float | None = None,
    bytes_per_block: int | None = None,
    title: str = "",
    log_x: bool = False,
    infeasible_below: int | None = None,
    model: str | None = None,
    h_max_label: str = "h_max",
) -> list:
    """Hit ratio vs capacity: one line per entry of ``curves`` (``{label: (N array, h array)}``; labels starting
    with "estimate" dashed, in the colour of the engine they predict), h_max as a dotted line, and a secondary
    x-axis in GiB of KV when ``bytes_per_block`` is given (of ``model``, named on the axis). ``log_x`` puts N on a
    log axis (use it for a log-spaced grid). ``infeasible_below`` shades ``N < N_min`` — capacities below the
    largest request, which cannot serve the workload (no hit ratio is drawn there). Writes PNG and SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    family = {"Algorithm 1": "C0", "≥ 0.24": "C1", "≤ 0.23": "C2", "paper": "C3"}
    lo = min((float(np.nanmin(N)) for N, _ in curves.values() if len(N)), default=None)
    for i, (label, (N, h)) in enumerate(curves.items()):
        style = "--" if label.startswith("estimate") else "-"
        color = next((c for key, c in family.items() if key in label), f"C{4 + i % 6}")
        ax.plot(N, h, style, color=color, label=label, lw=1.6)
    if log_x:
        ax.set_xscale("log")
    if infeasible_below is not None and lo is not None and infeasible_below > lo:
        ax.axvspan(
            lo,
            infeasible_below,
            color="0.85",
            zorder=0,
            label=f"infeasible: N < largest request ({infeasible_below:,} blocks)",
        )
    if h_max is not None and np.isfinite(h_max):
        ax.axhline(h_max, color="0.3", ls=":", lw=1.2, label=f"{h_max_label} = {h_max:.3f}")
    ax.set_xlabel("KV capacity N (blocks)")
    ax.set_ylabel("hit ratio h")
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3, which="both" if log_x else "major")
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title, fontsize=10)
    if bytes_per_block:
        gib = bytes_per_block / 2**30
        sec = ax.secondary_xaxis("top", functions=(lambda n: n * gib, lambda g: g / gib))
        sec.set_xlabel(f"KV memory (GiB{', ' + model if model else ''})")
    fig.tight_layout()
    out = []
    for ext in ("png", "svg"):
        path = f"{out_prefix}.{ext}"
        fig.savefig(path, dpi=130)
        out.append(path)
    plt.close(fig)
    return out
