"""Steady state of a simulated window: how long a spec simulation must run, and whether a trace's measured
window saw the conversation population at its stationary level.

A conversation is *active* from its first to its last prompt. With Poisson(λ0) conversation arrivals the number
active is an M/G/∞ queue: in steady state it is Poisson with mean λ0·E[D], D = W_1 + … + W_{M−1}, so
E[D] = (E[M] − 1)·E[W] (Wald). A cache's content depends on every conversation alive, so a window measured before
that population has built up (too short a warm-up) or while it drains reports a hit ratio of a lighter load than
λ0 — the trap of simulating 4,000 conversations where ~6,700 are alive at once.

Sizing (:func:`spec_sizing`): warm-up ≥ ``WARM_LIFETIMES`` lifetimes and a measured window ≥
``MEASURE_LIFETIMES`` lifetimes, in conversations: a lifetime E[M]·E[W] holds λ0·E[M]·E[W] arrivals
(the "number alive", counted generously: the last W included).

Check (:func:`check_window`): the share of measured turns that arrive while the active count is within
``max(BAND·ref, 3·√ref)`` of its reference level (λ0·E[D] for a spec; the median over the measured turns for a
trace of unknown rate), and the warm-up time against the mean conversation duration. Stationary when at least
``MIN_SHARE`` of the measured turns are in the band and the warm-up lasted ≥ one mean duration.

Invariant: pure functions of the trace (no randomness); the series returned is the exact active count at evenly
spaced times. NOT modelled: cache occupancy over time (the simulators do not record it per step; the active
count is the load that drives it), non-Poisson or time-varying arrival rates (a trace's rate is taken as it is:
a diurnal trace is judged against its own median).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "BAND",
    "MEASURE_LIFETIMES",
    "MIN_SHARE",
    "WARM_LIFETIMES",
    "Stationarity",
    "active_count",
    "check_window",
    "spec_lifetime",
    "spec_sizing",
]

#: Warm-up and measured window, in conversation lifetimes E[M]·E[W].
WARM_LIFETIMES = 3.0
MEASURE_LIFETIMES = 5.0
#: Relative band around the steady active count, and the share of measured turns that must fall in it.
BAND = 0.15
MIN_SHARE = 0.8
#: Points of the active-count series reported.
SERIES_POINTS = 60


def spec_lifetime(spec) -> tuple[float, float, float]:
    """``(lifetime, alive, active_mean)``: E[M]·E[W] seconds, λ0·E[M]·E[W] conversations, and the steady mean
    number active λ0·(E[M] − 1)·E[W] (first to last prompt)."""
    em, ew, lam0 = float(spec.M.mean), float(spec.interarrival.mean), float(spec.lam0)
    return em * ew, lam0 * em * ew, lam0 * max(em - 1.0, 0.0) * ew


def spec_sizing(spec, measured: int | None, warmup: int | None, *, floor: int = 20_000) -> tuple[int, int]:
    """``(measured, warmup)`` conversations for a spec simulation: each given value is kept; a missing one is
    sized from the spec — measured ≥ max(``floor``, MEASURE_LIFETIMES × alive), warm-up ≥
    max(measured/5, WARM_LIFETIMES × alive) — where alive = λ0·E[M]·E[W]."""
    _, alive, _ = spec_lifetime(spec)
    if measured is None:
        measured = max(int(floor), math.ceil(MEASURE_LIFETIMES * alive))
    if warmup is None:
        warmup = max(1, measured // 5, math.ceil(WARM_LIFETIMES * alive))
    return int(measured), int(warmup)


def active_count(first: np.ndarray, last: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Conversations with ``first ≤ t ≤ last`` at each time ``t`` (exact, by two sorted searches)."""
    fs, ls = np.sort(first), np.sort(last)
    return np.searchsorted(fs, t, side="right") - np.searchsorted(ls, t, side="left")


@dataclass
class Stationarity:
    """Whether a measured window reached steady state; JSON-ready via :meth:`to_dict`."""

    stationary: bool
    reference_active: float
    reference: str
    in_band_share: float
    band: float
    warmup_s: float
    mean_duration_s: float
    window: tuple[float, float]
    times: list[float] = field(default_factory=list)
    active: list[int] = field(default_factory=list)
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["window"] = list(self.window)
        return d


def check_window(
    time: np.ndarray, conv: np.ndarray, measured: np.ndarray, reference: float | None = None
) -> Stationarity:
    """Judge a measured window: ``time`` and ``conv`` per turn, ``measured`` the window's mask, ``reference`` the
    steady active count when known (a spec: λ0·(E[M] − 1)·E[W]); else the median active count over the measured
    turns is the reference and only the shape of the window is judged."""
    time = np.asarray(time, float)
    conv = np.asarray(conv)
    measured = np.asarray(measured, bool)
    if time.size == 0 or not measured.any():
        return Stationarity(False, 0.0, "none", 0.0, BAND, 0.0, 0.0, (0.0, 0.0), message="no measured turns")
    _, dense = np.unique(conv, return_inverse=True)
    dense = dense.ravel()
    n = int(dense.max()) + 1
    first = np.full(n, np.inf)
    last = np.full(n, -np.inf)
    np.minimum.at(first, dense, time)
    np.maximum.at(last, dense, time)
    tm = time[measured]
    a_meas = active_count(first, last, tm)
    if reference is None:
        ref, how = float(np.median(a_meas)), "median over the measured turns"
    else:
        ref, how = float(reference), "λ0·(E[M]−1)·E[W]"
    tol = max(BAND * ref, 3.0 * math.sqrt(max(ref, 0.0)), 1.0)
    share = float(np.mean(np.abs(a_meas - ref) <= tol))
    t0, t1 = float(tm.min()), float(tm.max())
    warm = t0 - float(time.min())
    dur = float(np.mean(last - first))
    ok = share >= MIN_SHARE and warm >= dur
    ts = np.linspace(float(time.min()), float(time.max()), SERIES_POINTS)
    series = active_count(first, last, ts)
    if ok:
        msg = (
            f"steady state: {100 * share:.0f}% of the measured turns arrived with the active conversations within "
            f"±{tol:,.0f} of {ref:,.0f} ({how}); warm-up {warm:,.0f} s ≥ mean conversation duration {dur:,.0f} s"
        )
    else:
        why = []
        if share < MIN_SHARE:
            why.append(
                f"only {100 * share:.0f}% of the measured turns arrived with the active conversations within "
                f"±{tol:,.0f} of {ref:,.0f} ({how}; need {100 * MIN_SHARE:.0f}%)"
            )
        if warm < dur:
            why.append(f"the warm-up ({warm:,.0f} s) is shorter than a mean conversation ({dur:,.0f} s)")
        msg = "NOT STATIONARY — not an answer for this load: " + "; ".join(why)
    return Stationarity(
        ok,
        ref,
        how,
        share,
        BAND,
        warm,
        dur,
        (t0, t1),
        [float(x) for x in ts],
        [int(x) for x in series],
        msg,
    )
