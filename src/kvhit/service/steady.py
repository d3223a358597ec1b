"""Steady-state sizing and reporting for every service command that shows a simulated ratio.

Invariant: a spec simulation is sized from the spec (:func:`kvhit.workload.stationarity.spec_sizing`) unless the
request gives the size; the generated trace must fit in memory (checked before generating); every simulated answer
carries a ``stationarity`` report and, when the window did not reach steady state, a note that says so.
NOT modelled here: the check itself (:mod:`kvhit.workload.stationarity`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvhit.service.base import available_memory_bytes
from kvhit.service.errors import InputError

__all__ = ["STEADY_WARNING", "TURN_BYTES", "check_trace_memory", "size_spec", "steady_report", "steady_note"]

#: The text written across a plot whose measured window did not reach steady state.
STEADY_WARNING = "NOT STATIONARY: the measured window did not reach steady state"

#: Memory one generated and simulated turn needs (trace columns, requests, hashes and per-turn results), bytes.
TURN_BYTES = 512


def check_trace_memory(conversations: int, mean_turns: float, flag: str) -> None:
    """Refuse a spec simulation whose generated trace would not fit in half of this machine's memory."""
    turns = float(conversations) * float(mean_turns)
    have = available_memory_bytes() // 2
    if turns * TURN_BYTES > have:
        fit = int(have // (TURN_BYTES * max(mean_turns, 1.0)))
        raise InputError(
            f"{flag}: {int(conversations):,} conversations (warm-up included) × E[M] = {mean_turns:.3g} turns need "
            f"{turns * TURN_BYTES / 2**30:,.1f} GiB of simulator memory; at most {fit:,} conversations fit in half "
            f"of this machine's {2 * have / 2**30:,.1f} GiB"
        )


def size_spec(sp, measured: int | None, warmup: int | None, flag: str = "--conversations") -> tuple[int, int]:
    """``(measured, warm-up)`` conversations for a spec (sized from it when not given), memory-checked."""
    from kvhit.workload.stationarity import MEASURE_LIFETIMES, WARM_LIFETIMES, spec_lifetime, spec_sizing

    m, w = spec_sizing(sp, measured, warmup)
    em = float(sp.M.mean)
    if measured is None and warmup is None:
        _, alive, _ = spec_lifetime(sp)
        turns = (m + w) * em
        if turns * TURN_BYTES > available_memory_bytes() // 2:
            raise InputError(
                f"spec: steady state needs {WARM_LIFETIMES:g} + {MEASURE_LIFETIMES:g} conversation lifetimes, "
                f"{m + w:,} conversations (λ0·E[M]·E[W] = {alive:,.0f} alive at once), more than this machine can "
                f"simulate; give {flag} to simulate fewer (the answer is then reported as not stationary)"
            )
    check_trace_memory(m + w, em, flag)
    if not math.isfinite(em):
        raise InputError("spec: E[M] is infinite; the trace cannot be sized")
    return m, w


def steady_report(tr, mask: np.ndarray, sp=None) -> dict[str, Any]:
    """The window's stationarity report (JSON-ready): against λ0·(E[M]−1)·E[W] for a spec, else the window's own
    median active count."""
    from kvhit.workload.stationarity import check_window, spec_lifetime

    ref = spec_lifetime(sp)[2] if sp is not None else None
    return check_window(tr["time"], tr["conv"], mask, ref).to_dict()


def steady_note(report: dict[str, Any] | None) -> list[str]:
    """The warning note for a non-stationary window (none when stationary or not judged)."""
    if report is None or report["stationary"]:
        return []
    return [report["message"]]
