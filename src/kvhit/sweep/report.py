"""``kvhit sweep report DIR``: a sweep's result set as tables (counts, h by each axis, the failed points), a
per-point CSV and faceted figures of the hit ratio against each numeric axis.

Per point, the latest row of each replication counts (:func:`.store.latest`); over ``R ≥ 2`` ok replications the
point's h is their mean with a Student-t 95% half-width, with one replication the row's own CI (batch means,
where the service gives one). Figures: for each numeric axis x with at least two values (capacity as ``hbm_gb``
when given in GiB, else ``N``; ``lam0``; ``replicas``), one line per engine (or router), one panel per combination
of the remaining axes that take several values (at most 12 panels: evenly spaced ones are drawn and the title says
so). Written to ``DIR/report/`` (atomically, byte-reproducible).

NOT done here: any recomputation — the report reads rows only.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from kvhit.sweep.grid import AXES
from kvhit.sweep.store import latest, read_results

__all__ = ["ReportError", "report", "point_table"]

MAX_PANELS = 12


class ReportError(ValueError):
    """A directory that is not a sweep result set; one line naming it."""


def _t95(n: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1))


def point_table(directory: Path) -> tuple[list[dict], dict]:
    """One dict per point (coordinates, h, ci95, replications ok/total, status) and the row counts."""
    d = Path(directory)
    if not d.is_dir() or not (d / "sweep.json").exists():
        raise ReportError(f"{d}: not a sweep result directory (no sweep.json)")
    t = read_results(d)
    if t is None:
        raise ReportError(f"{d}: no results yet (results/part-*.parquet)")
    rows = latest(t).to_pylist()
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "refused", "error")}
    by_point: dict[str, list[dict]] = {}
    for r in rows:
        by_point.setdefault(r["point_id"], []).append(r)
    points = []
    for pid, rs in by_point.items():
        rs.sort(key=lambda r: r["replication"])  # the mean's last digit must not depend on the order rows were written
        ok = [r for r in rs if r["status"] == "ok" and r["h"] is not None]
        hs = [r["h"] for r in ok]
        p: dict[str, Any] = {"point_id": pid, "workload": rs[0]["workload"], **{a: rs[0][a] for a in AXES}}
        p["compute"], p["metric"] = rs[0]["compute"], (ok[0]["metric"] if ok else None)
        p["replications"], p["ok"] = len(rs), len(ok)
        if len(hs) >= 2:
            p["h"] = float(np.mean(hs))
            p["ci95"] = _t95(len(hs)) * float(np.std(hs, ddof=1)) / math.sqrt(len(hs))
        elif hs:
            p["h"], p["ci95"] = hs[0], ok[0]["h_ci95"]
        else:
            p["h"], p["ci95"] = None, None
        flags = [json.loads(r["extra"]).get("stationary") for r in ok if r.get("extra")]
        flags = [f for f in flags if f is not None]
        p["stationary"] = all(flags) if flags else None  # null: no simulated window judged
        ests = [r["h_estimate"] for r in ok if r["h_estimate"] is not None]
        p["h_estimate"] = float(np.mean(ests)) if ests else None
        bad = [r for r in rs if r["status"] != "ok"]
        p["status"] = "ok" if not bad else bad[0]["status"]
        p["error"] = bad[0]["error"] if bad else None
        points.append(p)
    counts.update(
        not_stationary=sum(p["stationary"] is False for p in points),
        points=len(points),
        replications=max((p["replications"] for p in points), default=0),
        wall_s=float(sum(r["wall_s"] or 0.0 for r in rows)),
    )
    keys = ["workload", *AXES]
    points.sort(key=lambda p: tuple((p[k] is None, str(p[k]) if isinstance(p[k], str) else p[k] or 0) for k in keys))
    return points, counts


def _varying(points: list[dict]) -> list[str]:
    """Axes (and the workload) that take at least two values among the points."""
    out = []
    for a in ("workload", *AXES):
        vals = {p[a] for p in points if p[a] is not None}
        if len(vals) >= 2:
            out.append(a)
    if "hbm_gb" in out and "N" in out:  # N is derived from hbm_gb (and the workload's block size)
        out.remove("N")
    return out


def _write_csv(points: list[dict], path: Path) -> None:
    cols = ["point_id", "workload", *AXES, "compute", "metric", "h", "ci95", "h_estimate", "replications", "ok"]
    cols += ["status", "error", "stationary"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for p in points:
        w.writerow({k: ("" if p[k] is None else p[k]) for k in cols})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(buf.getvalue())
    os.replace(tmp, path)


def _fmt_val(a: str, v) -> str:
    unit = {"hbm_gb": " GiB", "dram_gb": " GiB DRAM", "lam0": "/s", "N": " blocks"}.get(a, "")
    return f"{a} = {v:g}{unit}" if isinstance(v, float) else f"{a} = {v}{unit}"


def _figure(points: list[dict], x: str, varying: list[str], out_prefix: Path, title: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvhit.plots.curves import save_figure

    hue = next((a for a in ("engine", "router", "workload") if a in varying and a != x), None)
    facet_axes = [a for a in varying if a not in (x, hue)]
    combos = sorted({tuple(p[a] for a in facet_axes) for p in points}, key=lambda c: tuple(map(str, c)))
    note = ""
    if len(combos) > MAX_PANELS:
        idx = np.unique(np.round(np.linspace(0, len(combos) - 1, MAX_PANELS)).astype(int))
        note = f" ({idx.size} of {len(combos)} panels shown)"
        combos = [combos[i] for i in idx]
    ncol = min(4, len(combos))
    nrow = math.ceil(len(combos) / ncol)
    fig, axs = plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 2.9 * nrow), squeeze=False, sharey=True)
    hues = sorted({p[hue] for p in points}, key=str) if hue else [None]
    for k, combo in enumerate(combos):
        ax = axs[k // ncol][k % ncol]
        sel = [p for p in points if tuple(p[a] for a in facet_axes) == combo and p["h"] is not None]
        for j, hv in enumerate(hues):
            pts = sorted((p for p in sel if hue is None or p[hue] == hv), key=lambda p: p[x])
            if not pts:
                continue
            xs = [p[x] for p in pts]
            ys = [p["h"] for p in pts]
            err = [p["ci95"] or 0.0 for p in pts]
            ax.errorbar(xs, ys, yerr=err, marker="o", ms=3.5, lw=1.2, capsize=2, color=f"C{j}", label=str(hv))
        vals = sorted({p[x] for p in sel})
        if (
            x in ("N", "hbm_gb", "dram_gb", "replicas", "lam0")
            and len(vals) > 2
            and vals[0] > 0
            and vals[-1] / vals[0] >= 8
        ):
            ax.set_xscale("log")
            ax.set_xticks(vals, [f"{v:g}" for v in vals])
            ax.minorticks_off()
        ax.set_title(", ".join(_fmt_val(a, v) for a, v in zip(facet_axes, combo, strict=True)) or " ", fontsize=8)
        ax.set_xlabel(
            {"hbm_gb": "KV memory (GiB)", "N": "capacity N (blocks)", "lam0": "λ0 (conversations/s)"}.get(x, x)
        )
        ax.grid(alpha=0.3)
        if k % ncol == 0:
            ax.set_ylabel("hit ratio h")
    for k in range(len(combos), nrow * ncol):
        axs[k // ncol][k % ncol].set_visible(False)
    if hue:
        axs[0][0].legend(fontsize=7, title=hue, title_fontsize=7)
    fig.suptitle(title + note, fontsize=9)
    fig.tight_layout()
    try:
        return save_figure(fig, out_prefix)
    finally:
        plt.close(fig)


def report(directory: Path) -> dict:
    """Counts, h by each axis, failed points, the per-point CSV and the figures (``DIR/report/``)."""
    d = Path(directory)
    points, counts = point_table(d)
    rdir = d / "report"
    _write_csv(points, rdir / "points.csv")
    varying = _varying(points)
    by_axis = {}
    for a in varying:
        vals = sorted({p[a] for p in points if p[a] is not None}, key=lambda v: (isinstance(v, str), v))
        rows = []
        for v in vals:
            hs = [p["h"] for p in points if p[a] == v and p["h"] is not None]
            rows.append(
                {
                    "value": v,
                    "points": len(hs),
                    "mean": float(np.mean(hs)) if hs else None,
                    "min": float(np.min(hs)) if hs else None,
                    "max": float(np.max(hs)) if hs else None,
                }
            )
        by_axis[a] = rows
    figures: list[str] = []
    xs = [a for a in ("hbm_gb", "N", "dram_gb", "lam0", "replicas") if a in varying]
    metric = {f"{p['engine']}: {p['metric']}" if p["engine"] else p["metric"] for p in points if p["metric"]}
    reps = counts["replications"]
    what = f"hit ratio ({'; '.join(sorted(metric))})" + (f", mean of {reps} replications ± 95% CI" if reps > 1 else "")
    if counts["not_stationary"]:
        what += f" — NOT STATIONARY at {counts['not_stationary']} point(s)"
    for x in xs:
        figures += [str(f) for f in _figure(points, x, varying, rdir / f"h_vs_{x}", f"{d.name}: {what} vs {x}")]
    errors = [
        {"point": ", ".join(_fmt_val(a, p[a]) for a in ("workload", *AXES) if p[a] is not None), **p}
        for p in points
        if p["status"] != "ok"
    ]
    return {
        "counts": counts,
        "by_axis": by_axis,
        "errors": [{k: e[k] for k in ("point", "status", "error")} for e in errors],
        "points_csv": str(rdir / "points.csv"),
        "figures": figures,
        "points": points,
    }
