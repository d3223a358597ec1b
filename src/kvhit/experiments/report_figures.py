"""Figures 3–6 of the paper (App. E) from a reproduction's summary (:func:`kvhit.experiments.paper.summarize`).

* ``fig3``/``fig5`` (:func:`plot_estimates`): one panel per simulated engine (vLLM ≤ 0.23, vLLM ≥ 0.24,
  Algorithm 1): its actual hit ratio and the estimates of it vs μ_F (Exp. 1) and vs λ0 (Exp. 2), mean over seeds
  with 95% t-interval error bars; one legend in plain words;
* ``fig4``/``fig6`` (:func:`plot_errors`): absolute and relative errors, one column per engine, with the paper's
  bounds and kvhit's engine target as reference lines — every series and reference line in the legend.

Invariant: a figure is a function of the summary alone (no run is repeated); each is saved as PNG and SVG by
:func:`kvhit.plots.curves.save_figure` under the prefix given.

NOT modelled here: Fig. 2 (:func:`kvhit.plots.curves.plot_fig2`), ``results.json`` and ``report.md``
(:mod:`kvhit.experiments.report`, :mod:`kvhit.experiments.report_markdown`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kvhit.experiments.paper import _targets, _untargeted
from kvhit.experiments.paper_estimators import ENGINE_TARGET
from kvhit.experiments.paper_runs import PRIMARY_ACTUAL

__all__ = ["plot_estimates", "plot_errors"]


_EST_STYLE = {"prior": ("#1f77b4", "s"), "posterior": ("#ff7f0e", "D"), "empirical": ("#9467bd", "v")}
#: engine-aware estimators: drawn in their target actual's colour, line style by family
_FAMILY_LS = {"engine": "--", "window": ":", "finite": "-."}
_X_LABEL = {
    "1": "target mean interarrival time $\\mu_F$ (s)",
    "2": "conversation arrival rate $\\lambda_0$ (1/s)",
}


def _series(points: list[dict], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.array([p["x"] for p in points], float)
    m = np.array([p["stats"][key]["mean"] for p in points], float)
    ci = np.array([p["stats"][key]["ci95"] for p in points], float)
    return x, m, np.where(np.isfinite(ci), ci, 0.0)


def _new_figure(ncols: int, size: tuple[float, float]):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def _save(fig, prefix: Path) -> list[Path]:
    from kvhit.plots.curves import save_figure

    return save_figure(fig, prefix, dpi=150)


_FACET_TITLE = {
    "vllm-0.23": "vLLM ≤ 0.23 (the paper's testbed order)",
    "vllm": "vLLM ≥ 0.24",
    "alg1": "Algorithm 1 (the paper's model)",
}
_EST_PLAIN = {
    "prior": "paper's estimator, F = exponential with the target mean (prior)",
    "posterior": "paper's estimator, F = exponential with the realized mean (posterior)",
    "empirical": "paper's estimator, F = empirical distribution of the gaps",
    "engine": "kvhit engine-aware estimator (stationary)",
    "window": "kvhit engine-aware estimator, measurement-window form",
    "finite": "kvhit finite-capacity estimator",
}


def _est_plain(en: str) -> str:
    return _EST_PLAIN.get(en, _EST_PLAIN.get(en.split(":")[0], en))


def _facets(summary: dict[str, Any]) -> list[str]:
    """One panel per simulated engine (actual) the run produced, the paper's testbed order first."""
    return [a for a in (PRIMARY_ACTUAL, "vllm", "alg1") if a in summary["actuals"]]


def _estimators_for(summary: dict[str, Any], a: str) -> list[str]:
    """The estimators drawn against actual ``a``: the paper's (untargeted) ones, then those targeting ``a``."""
    return list(_untargeted(summary)) + [en for en, t in _targets(summary).items() if t == a]


def _est_style(summary: dict[str, Any], en: str) -> tuple[str, str, str]:
    if en in _targets(summary):
        fam = en.split(":")[0]
        col = {"engine": "#2ca02c", "window": "#8c564b", "finite": "#e377c2"}.get(fam, "#17becf")
        mk = {"engine": "P", "window": "X", "finite": "*"}.get(fam, "P")
        return col, mk, _FAMILY_LS.get(fam, "-.")
    col, mk = _EST_STYLE.get(en, ("#17becf", "P"))
    return col, mk, "--"


def _figure_legend(fig, axes, ncol: int = 2) -> None:
    """One legend for the whole figure with every labelled artist of every panel (series and reference
    lines), each label once."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=ncol, fontsize=8, frameon=False)


def plot_estimates(summary: dict[str, Any], experiment: int, out_prefix: str | Path) -> list[Path]:
    """Fig. 3 (experiment 1) / Fig. 5 (experiment 2): one panel per simulated engine — its actual hit ratio and
    the estimates of it (the paper's estimators in every panel, kvhit's engine-aware ones in their engine's
    panel) vs μ_F or λ0, mean ± 95% CI over seeds; one legend in plain words."""
    e = str(experiment)
    pts = summary["experiments"][e]["points"]
    facets = _facets(summary)
    fig, axes = _new_figure(len(facets), (4.6 * len(facets), 5.6))
    for ax, a in zip(axes, facets, strict=True):
        x, m, ci = _series(pts, f"actual/{a}")
        ax.errorbar(
            x, m, yerr=ci, color="black", marker="o", ls="-", lw=2, capsize=3, label="simulated engine (actual)"
        )
        for en in _estimators_for(summary, a):
            col, mk, ls = _est_style(summary, en)
            x, m, ci = _series(pts, f"est/{en}")
            ax.errorbar(x, m, yerr=ci, color=col, marker=mk, ms=5, ls=ls, lw=1.2, capsize=2, label=_est_plain(en))
        ax.set_title(_FACET_TITLE.get(a, a), fontsize=10)
        ax.set_xlabel(_X_LABEL[e])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("hit ratio (block-weighted)")
    fig.suptitle(f"Experiment {e}: simulated vs estimated hit ratio, one panel per engine (mean ± 95% CI over seeds)")
    _figure_legend(fig, axes)
    return _save(fig, Path(out_prefix))


def plot_errors(
    summary: dict[str, Any],
    experiment: int,
    out_prefix: str | Path,
    bounds: list[dict[str, Any]] | None = None,
) -> list[Path]:
    """Fig. 4 (experiment 1) / Fig. 6 (experiment 2): absolute (top row) and relative (bottom row) errors, one
    column per simulated engine, of the paper's estimators and of kvhit's estimators of that engine; the
    paper's bounds and kvhit's engine target drawn as reference lines, every one in the legend."""
    from kvhit.experiments.paper import PAPER_BOUNDS

    e = str(experiment)
    pts = summary["experiments"][e]["points"]
    facets = _facets(summary)
    n = len(facets)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.6 * n, 8.2), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(2, n, squeeze=False, sharex="col")
    bl = [b for b in (bounds if bounds is not None else PAPER_BOUNDS) if str(b["experiment"]) == e]
    for j, a in enumerate(facets):
        ax_ae, ax_re = grid[0, j], grid[1, j]
        for en in _estimators_for(summary, a):
            col, mk, ls = _est_style(summary, en)
            for ax, metric, scale in ((ax_ae, "ae", 1.0), (ax_re, "re", 100.0)):
                x, m, ci = _series(pts, f"{metric}/{en}/{a}")
                ax.errorbar(x, m * scale, yerr=ci * scale, color=col, marker=mk, ms=5, ls=ls, lw=1.2, capsize=2,
                            label=_est_plain(en))  # fmt: skip
        if any(t == a for t in _targets(summary).values()):
            ax_ae.axhline(
                ENGINE_TARGET,
                color="purple",
                lw=1,
                ls=":",
                label=f"kvhit's target for its engine estimators: AE ≤ {ENGINE_TARGET:g}",
            )
        for b in bl:
            ax = ax_ae if b["metric"] == "ae" else ax_re
            val = b["bound"] * (100.0 if b["metric"] == "re" else 1.0)
            if b["range"] is None:
                ax.axhline(val, color="red", lw=1, ls="-.", label=f"paper's bound: {b['text']}")
            else:
                ax.hlines(val, *b["range"], color="darkred", lw=2.5, label=f"paper's bound: {b['text']}")
        ax_ae.set_title(_FACET_TITLE.get(a, a), fontsize=10)
        ax_re.set_xlabel(_X_LABEL[e])
        for ax in (ax_ae, ax_re):
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)
    grid[0, 0].set_ylabel("absolute error |estimate − actual|")
    grid[1, 0].set_ylabel("relative error |estimate − actual| / actual (%)")
    fig.suptitle(f"Experiment {e}: estimation errors against each simulated engine (mean ± 95% CI over seeds)")
    _figure_legend(fig, list(grid.ravel()))
    return _save(fig, Path(out_prefix))
