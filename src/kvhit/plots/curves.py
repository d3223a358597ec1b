"""Figures (matplotlib, Agg canvas: no display needed).

:func:`plot_fig2` reproduces the paper's Fig. 2 (App. E): (a) the empirical pmf of the number of turns M per
conversation and (b) the marginal empirical pmf of the number of new KV blocks per turn Z_j (the paper's tail
rule, :mod:`kvhit.workload.blocks`), over the measured conversations of a ShareGPT trace; :func:`plot_curves`
draws hit-ratio-vs-capacity curves.

Every figure is written by :func:`save_figure`: atomically (temporary file renamed into place), with the mode the
umask gives, and byte-reproducible — the SVG carries no date and its element ids are hashed from a fixed salt
(``svg.hashsalt``), so regenerating a figure from the same data leaves git clean.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["fig2_data", "plot_fig2", "plot_curves", "plot_trace_stats", "save_figure"]

#: salt of matplotlib's SVG id hashing (``svg.hashsalt``): fixed, so ids are the same on every run
SVG_HASHSALT = "kvhit"


def save_figure(fig, out_prefix: str | Path, *, dpi: int = 150, formats=("png", "svg")) -> list[Path]:
    """Write ``{out_prefix}.{ext}`` for each format, atomically and reproducibly (see the module docstring);
    creates the parent directory. Returns the paths."""
    import matplotlib

    from kvhit.workload.trace import file_mode

    out = Path(out_prefix)
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in formats:
        p = out.with_name(out.name + "." + ext)
        fd, tmp = tempfile.mkstemp(prefix=p.name + ".", suffix=".tmp", dir=p.parent)
        os.close(fd)
        try:
            meta = {"Date": None} if ext == "svg" else None
            with matplotlib.rc_context({"svg.hashsalt": SVG_HASHSALT, "svg.fonttype": "path"}):
                fig.savefig(tmp, format=ext, dpi=dpi, metadata=meta)
            os.chmod(tmp, file_mode())
            os.replace(tmp, p)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        paths.append(p)
    return paths


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
    return save_figure(fig, out_prefix, dpi=150)


def plot_curves(
    curves: dict,
    out_prefix,
    *,
    h_max: float | None = None,
    bytes_per_block: int | None = None,
    model: str | None = None,
    budget_N: int | None = None,
    N_min: int | None = None,
    log_x: bool = True,
    title: str = "",
    warning: str | None = None,
    bands: dict | None = None,
    band_label: str = "prediction band",
) -> list:
    """Hit ratio vs capacity: one line per entry of ``curves`` (``{label: (N array, h array)}``; labels starting
    with "estimate" dashed, in the colour of the engine they predict), h_max as a dotted line, a secondary x-axis
    in GiB of KV of ``model`` when ``bytes_per_block`` is given (the model is named on the axis), the budget
    ``budget_N`` as a vertical line and capacities below the largest request ``N_min`` (infeasible under vLLM)
    shaded — every reference line in the legend. ``warning`` (a window that did not reach steady state) is written
    across the plot in red. ``bands``: ``{label: (N, lo, hi)}`` bands (named ``band_label`` in the legend: prediction
    bands by default), shaded in the colour of the line ``label`` predicts. ``log_x``: a log-spaced grid is drawn on a
    log axis. Writes PNG and SVG (:func:`save_figure`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.5, 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    family = {"Algorithm 1": "C0", "≥ 0.24": "C1", "≤ 0.23": "C2", "paper": "C3"}
    for i, (label, (N, h)) in enumerate(curves.items()):
        style = "--" if label.startswith("estimate") else "-"
        color = next((c for key, c in family.items() if key in label), f"C{4 + i % 6}")
        ax.plot(N, h, style, color=color, label=label, lw=1.6)
        if bands and label in bands:
            bN, lo, hi = bands[label]
            ax.fill_between(bN, lo, hi, color=color, alpha=0.18, lw=0, label=f"{label}: {band_label}")
    if log_x:
        ax.set_xscale("log")
    if h_max is not None and np.isfinite(h_max):
        ax.axhline(h_max, color="0.3", ls=":", lw=1.2, label=f"ceiling h_max = {h_max:.3f} (every history hits)")
    if N_min:
        lo = min(float(np.min(N)) for N, _ in curves.values()) if curves else 1.0
        if N_min > lo:
            ax.axvspan(
                lo, N_min, color="0.85", alpha=0.6, lw=0, label=f"infeasible: N < largest request ({N_min:,} blocks)"
            )
    if budget_N:
        gib = f" = {budget_N * bytes_per_block / 2**30:.1f} GiB" if bytes_per_block else ""
        ax.axvline(budget_N, color="k", lw=1.2, ls="-.", label=f"budget: N = {budget_N:,} blocks{gib}")
    ax.set_xlabel("KV capacity N (blocks" + (", log scale)" if log_x else ")"))
    ax.set_ylabel("hit ratio h")
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3, which="both" if log_x else "major")
    ax.legend(fontsize=8, loc="upper left")
    if title:
        ax.set_title(title, fontsize=10)
    if warning:
        ax.text(0.5, 0.5, warning, transform=ax.transAxes, ha="center", va="center", color="#c00", fontsize=11,
                wrap=True, bbox={"facecolor": "white", "edgecolor": "#c00", "alpha": 0.9})  # fmt: skip
    if bytes_per_block:
        gib = bytes_per_block / 2**30

        def fwd(n):
            return np.asarray(n, dtype=float) * gib

        def inv(g):
            return np.asarray(g, dtype=float) / gib

        sec = ax.secondary_xaxis("top", functions=(fwd, inv))
        who = f"{model}, " if model else ""
        sec.set_xlabel(f"KV memory (GiB; {who}{bytes_per_block / 2**20:.2f} MiB per block)")
    return [str(p) for p in save_figure(fig, out_prefix, dpi=130)]


def plot_trace_stats(stats, out_prefix, *, title: str = "") -> list:
    """Four panels of a :class:`kvhit.workload.stats.TraceStats`: (a) gap CDF (log time), (b) share of the
    previous request reused (L_own / F_prev), (c) requests per session, (d) active sessions and live context
    over time. Writes PNG and SVG; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(2, 2, figsize=(10, 7))
    g = np.sort(stats.gap_sample[stats.gap_sample > 0])
    ax = axs[0, 0]
    if g.size:
        ax.step(g, np.arange(1, g.size + 1) / g.size, where="post")
        ax.set_xscale("log")
    ax.set_xlabel("gap W between requests of a stream (s)")
    ax.set_ylabel("CDF")
    ax = axs[0, 1]
    if stats.reuse_fraction.size:
        ax.hist(stats.reuse_fraction, bins=40, range=(0, 1))
    ax.set_xlabel("reused share of the previous request (L_own / F_prev)")
    ax.set_ylabel("requests")
    ax = axs[1, 0]
    if stats.session_requests.size:
        ax.hist(stats.session_requests, bins=min(50, max(int(stats.session_requests.max()), 1)))
    ax.set_xlabel("requests per session")
    ax.set_ylabel("sessions")
    ax = axs[1, 1]
    t = stats.concurrency_t
    ax.plot(t - (t[0] if t.size else 0.0), stats.concurrency_active, color="C0")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("active sessions", color="C0")
    ax2 = ax.twinx()
    ax2.plot(t - (t[0] if t.size else 0.0), stats.concurrency_live_blocks, color="C1")
    ax2.set_ylabel("live context (blocks)", color="C1")
    for a in axs.flat:
        a.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    try:
        return [str(p) for p in save_figure(fig, out_prefix, dpi=110)]
    finally:
        plt.close(fig)
