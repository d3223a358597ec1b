"""Figures (matplotlib): hit-ratio curves and trace statistics (:mod:`~kvhit.plots.curves`), host tiers
(:mod:`~kvhit.plots.tiers`), fleets (:mod:`~kvhit.plots.fleet`). SVG output is byte-stable (fixed hash salt).

Layer: imports everything below (workload … fleet/plan); imported by experiments, service and front ends.
The names of the old ``kvhit.plots`` module stay importable from here (lazily).
"""

from kvhit._compat import lazy_exports

_NAMES = ["fig2_data", "plot_fig2", "plot_curves", "plot_trace_stats", "save_figure"]
__all__ = list(_NAMES)
__getattr__ = lazy_exports(__name__, dict.fromkeys(_NAMES, "kvhit.plots.curves"))
