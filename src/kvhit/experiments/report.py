"""Figures 2–6 of the paper (App. E), ``results.json`` and ``report.md`` for a reproduction, and the entry
point :func:`reproduce`.

Outputs (in ``out_dir``; every file is written to a temporary directory first and renamed into place, so no
file is ever half-written):

* ``fig2.png/.svg``: the workload of the first seed's measurement set (:func:`kvhit.plots.curves.plot_fig2`);
* ``fig3``–``fig6``: the estimates and their errors (:mod:`kvhit.experiments.report_figures`);
* ``results.json``: the setting, every run (every point, every seed), the per-point statistics and, under
  ``"ingredients"``, each ingredient's signed error on every grid point with the max |error| per grid, engine and
  column against the 0.005 target (:func:`kvhit.experiments.paper.summarize`);
* ``report.md``: settings, per-point tables, the paper's bounds beside ours (pass/fail), the engine-aware
  estimators against their engines, the ingredient tables and a discussion generated from the numbers
  (:mod:`kvhit.experiments.report_markdown`).

NOT modelled here: the runs and their statistics (:mod:`kvhit.experiments.paper`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvhit.experiments.paper import run_experiments, summarize
from kvhit.experiments.paper_runs import PRIMARY_ACTUAL
from kvhit.experiments.paper_setting import Setting, get_setting
from kvhit.experiments.report_figures import plot_errors, plot_estimates
from kvhit.experiments.report_markdown import render_report
from kvhit.workload.sharegpt import PAPER_WORKLOAD

__all__ = ["PAPER_WORKLOAD", "ReproduceResult", "reproduce", "write_outputs"]


@dataclass(frozen=True)
class ReproduceResult:
    """What :func:`reproduce` did: the output directory and files, the setting, the per-point summary
    (``summary["experiments"]["1"|"2"]["points"]``), the paper's bounds checked (``checks``), the raw runs
    and wall times (``seconds``: ``runs``, ``outputs``, ``total``)."""

    out_dir: Path
    files: list[Path]
    setting: Setting
    summary: dict[str, Any]
    runs: list[dict[str, Any]]
    seconds: dict[str, float]
    jobs: int

    @property
    def checks(self) -> list[dict[str, Any]]:
        return self.summary["checks"]

    @property
    def passed(self) -> bool:
        """All of the paper's bounds hold for the paper's two estimators against the primary actual."""
        sel = [c for c in self.checks if c["paper_estimator"] and c["actual"] == PRIMARY_ACTUAL]
        return bool(sel) and all(c["pass"] for c in sel)


# ------------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------------


def _jsonable(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_jsonable(v) for v in o]
    if isinstance(o, np.ndarray):
        return [_jsonable(v) for v in o.tolist()]
    if isinstance(o, np.integer | bool | np.bool_):
        return bool(o) if isinstance(o, bool | np.bool_) else int(o)
    if isinstance(o, float | np.floating):
        f = float(o)
        return f if math.isfinite(f) else None
    if isinstance(o, Path):
        return str(o)
    return o


# ------------------------------------------------------------------------------------------------------------
# outputs and the entry point
# ------------------------------------------------------------------------------------------------------------


def write_outputs(
    out_dir: str | Path,
    raw: dict[str, Any],
    summary: dict[str, Any],
    fig2_trace=None,
    seconds: dict[str, float] | None = None,
) -> list[Path]:
    """Write figures, ``results.json`` and ``report.md`` atomically into ``out_dir`` (a temporary directory
    next to it, then one ``os.replace`` per file). Returns the final paths."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        names: list[Path] = []
        if fig2_trace is not None:
            from kvhit.plots.curves import plot_fig2

            names += plot_fig2(fig2_trace, tmp / "fig2", n_warm=raw["setting"].n_warm)
        names += plot_estimates(summary, 1, tmp / "fig3")
        names += plot_errors(summary, 1, tmp / "fig4")
        names += plot_estimates(summary, 2, tmp / "fig5")
        names += plot_errors(summary, 2, tmp / "fig6")
        files = [p.name for p in names] + ["results.json", "report.md"]
        st: Setting = raw["setting"]
        from kvhit import __version__ as version

        payload = {
            "kvhit_version": version,
            "python": platform.python_version(),
            "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "setting": st.to_dict(),
            "jobs": raw["jobs"],
            "seconds": dict(seconds or {"runs": raw["seconds"]}),
            "paper_workload": PAPER_WORKLOAD,
            "files": files,
            "ingredients": summary.get("ingredients"),
            "runs": raw["runs"],
            "summary": summary,
        }
        (tmp / "results.json").write_text(
            json.dumps(_jsonable(payload), indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        (tmp / "report.md").write_text(render_report({**payload, "_setting": st}), encoding="utf-8")
        out.mkdir(parents=True, exist_ok=True)
        final = []
        for name in files:
            os.replace(tmp / name, out / name)
            final.append(out / name)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def reproduce(
    out_dir: str | Path,
    quick: bool = False,
    seeds=None,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    *,
    setting: str | Setting | None = None,
    cache_dir=None,
    estimators=None,
) -> ReproduceResult:
    """Reproduce App. E's Experiments 1 and 2 (Figs. 2–6) and write the outputs into ``out_dir``.

    Args:
        out_dir: output directory (created; files in it with the same names are replaced atomically).
        quick: the ``"quick"`` setting (2 seeds, 4 μ_F and 3 λ0 points) instead of ``"paper"``.
        seeds: override the setting's seeds.
        jobs: worker processes (default ``os.cpu_count()``).
        progress: ``progress(done, total)`` over runs (one run = one seed at one point).
        setting: a setting name (``"paper"``, ``"quick"``, ``"tiny"``) or a :class:`Setting`; overrides
            ``quick``.
        cache_dir: the ShareGPT token cache directory (default: the library's).
        estimators: the estimator registry to use (default :data:`kvhit.experiments.paper_estimators.ESTIMATORS`).
    """
    t0 = time.perf_counter()
    st = get_setting(setting if setting is not None else "quick" if quick else "paper")
    if seeds is not None:
        st = replace(st, seeds=tuple(int(s) for s in seeds))
    raw = run_experiments(st, jobs=jobs, cache_dir=cache_dir, estimators=estimators, progress=progress)
    summary = summarize(raw)
    t_runs = time.perf_counter() - t0
    from kvhit.workload.sharegpt_trace import build_sharegpt_trace

    fig2_trace, _ = build_sharegpt_trace(
        n_warm=st.n_warm,
        n_meas=st.n_meas,
        seed=st.seeds[0],
        block_size=st.block_size,
        keep_token_ids=True,
        cache_dir=cache_dir,
    )
    seconds = {"runs": t_runs}
    files = write_outputs(out_dir, raw, summary, fig2_trace, seconds=seconds)
    seconds = {
        "runs": t_runs,
        "outputs": time.perf_counter() - t0 - t_runs,
        "total": time.perf_counter() - t0,
    }
    return ReproduceResult(Path(out_dir), files, st, summary, raw["runs"], seconds, raw["jobs"])
