"""Fleet estimates at many equal capacities in one call (a kvhit trace): the estimate column of ``fleet simulate``
for every capacity of a grid without a simulation per capacity — what ``kvhit sweep`` runs for fleets when
``sweep.compute = "estimate"``.

Invariant: each (router, R) row is the number ``fleet simulate`` would print in its ``estimate`` column at that
capacity (same workload, window, λ0, request rate, holds, router parameters and seed), computed by
:func:`kvhit.fleet.estimate.estimate_fleet_kv_curve` (KV-aware routers and sticky: the stay model's routing) or
:func:`kvhit.fleet.estimate.estimate_fleet_curve` (round-robin, random, session: the routing the router draws,
:func:`kvhit.fleet.estimate.routes`, as the simulator draws it); a row the estimators do not model has no curve and
the reason (the same refusals as ``fleet simulate``). NOT modelled: block-id traces (their fleet estimate is a mean
of exact replays, one set per capacity: ``fleet simulate --blocks-trace``), per-replica capacities.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvhit.service.errors import InputError, translating
from kvhit.service.fleet import (
    KV_ESTIMATED,
    OBLIVIOUS_ESTIMATED,
    FleetRequest,
    _kv_unmodelled,
    fleet_timing,
    load_fleet_workload,
    measured_rate,
    router_params,
)

__all__ = ["FleetEstimateCurves", "fleet_estimate_curve"]


@dataclass
class FleetEstimateCurves:
    """``curves[(router, R)]`` = ``(h, None)`` with ``h[i]`` the estimate at ``capacities[i]``, or ``(None,
    reason)``; ``n_min`` = the largest measured request in blocks (a capacity below it rejects requests)."""

    capacities: np.ndarray
    curves: dict[tuple[str, int], tuple[np.ndarray | None, str | None]]
    n_min: int


def fleet_estimate_curve(req: FleetRequest, capacities) -> FleetEstimateCurves:
    """Per (router, R) of the request, the fleet estimate when every replica has ``capacities[i]`` blocks, for
    every ``i`` (:class:`FleetEstimateCurves`). ``req.N`` is not read (the capacities are the grid's)."""
    from kvhit.fleet.estimate import estimate_fleet_curve, estimate_fleet_kv_curve, routes

    Ns = np.asarray(capacities, np.int64).reshape(-1)
    if Ns.size == 0 or (Ns < 1).any():
        raise InputError("N: every capacity must be a whole number of blocks ≥ 1")
    if req.blocks_trace is not None:
        raise InputError(
            "--blocks-trace: fleet estimate curves cover kvhit traces; a block-id trace's fleet estimate is a mean of "
            "exact replays per capacity (use fleet simulate, or sweep.compute = 'simulate')"
        )
    if req.engine_steps:
        raise InputError("--engine-steps: the fleet estimators do not model the engine's passes")
    params = router_params(req, list(req.router))
    fleet_timing(req, list(req.router))
    wl = load_fleet_workload(req)
    st = wl.stream
    tmg = fleet_timing(req, list(req.router), st)
    hold, _, _ = tmg.holds(st.prompt_tokens, st.output_tokens)
    kw = dict(engine=req.engine, window=st.measured, lam0=wl.lam0, block_size=st.block_size)
    out: dict[tuple[str, int], tuple[np.ndarray | None, str | None]] = {}
    for name in req.router:
        for R in req.replicas:
            if req.decode_kv:
                out[name, R] = (None, f"no estimate for {name} with --decode-kv: the estimators model the prompt's KV")
            elif name in OBLIVIOUS_ESTIMATED:
                if hold is not None:
                    out[name, R] = (None, f"no estimate for {name} with holds: measured without holds only")
                    continue
                with translating("estimate"):
                    rep = routes(wl.tr, name, R, seed=req.seed, **params[name])
                    out[name, R] = (estimate_fleet_curve(wl.tr, rep, R, Ns, **kw), None)
            elif name not in KV_ESTIMATED:
                out[name, R] = (None, f"no estimate for {name}: no fleet estimator models it")
            else:
                why = _kv_unmodelled(req, name, params[name], hold)
                if why is not None:
                    out[name, R] = (None, why)
                    continue
                with translating("estimate"):
                    # bitwise: the number `fleet simulate` prints, bit for bit (the shared tables agree to rounding)
                    h = estimate_fleet_kv_curve(
                        wl.tr, name, R, Ns, hold=hold, params=params[name], rate=measured_rate(st.times, st.measured),
                        seed=req.seed, bitwise=True, **kw,
                    )  # fmt: skip
                out[name, R] = (h, None)
    need = -(-np.asarray(st.prompt_tokens, np.int64)[np.asarray(st.measured, bool)] // st.block_size)
    return FleetEstimateCurves(Ns, out, int(need.max()) if need.size else 0)
