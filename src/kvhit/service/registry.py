"""The commands of the service layer by name: ``run(command, fields)`` builds the request (validated, one-line
:class:`~kvhit.service.errors.InputError` naming the field) and calls the command's function.

Invariant: every front end that dispatches by name (the web API of issue 14, its worker processes) goes through
:data:`COMMANDS`, so a request is validated by exactly one model and answered by exactly one function. NOT here:
transport concerns (HTTP status codes, uploads, size limits: ``kvhit.web``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from kvhit.service.base import Request, Response, build
from kvhit.service.block_stats import BlockStatsRequest, block_stats
from kvhit.service.curve import CurveRequest, curve
from kvhit.service.estimate import EstimateRequest, estimate
from kvhit.service.fleet import FleetRequest, fleet_simulate
from kvhit.service.fleet_plan import FleetCurveRequest, FleetPlanRequest, fleet_curve, fleet_plan
from kvhit.service.kv import KvRequest, kv
from kvhit.service.plan import PlanRequest, plan
from kvhit.service.planner import PlannerRequest, planner
from kvhit.service.simulate import SimulateRequest, simulate
from kvhit.service.stream import StreamRequest, stream
from kvhit.service.tiers import TiersRequest, tiers
from kvhit.service.trace_estimate import TraceEstimateRequest, trace_estimate
from kvhit.service.traces import StatsRequest, trace_stats

__all__ = ["COMMANDS", "run", "path_fields"]

#: command name → (request model, function)
COMMANDS: dict[str, tuple[type[Request], Callable[..., Response]]] = {
    "estimate": (EstimateRequest, estimate),
    "kv": (KvRequest, kv),
    "plan": (PlanRequest, plan),
    "planner": (PlannerRequest, planner),
    "simulate": (SimulateRequest, simulate),
    "stream": (StreamRequest, stream),
    "curve": (CurveRequest, curve),
    "stats": (StatsRequest, trace_stats),
    "tiers": (TiersRequest, tiers),
    "block-stats": (BlockStatsRequest, block_stats),
    "trace-estimate": (TraceEstimateRequest, trace_estimate),
    "fleet": (FleetRequest, fleet_simulate),
    "fleet-plan": (FleetPlanRequest, fleet_plan),
    "fleet-curve": (FleetCurveRequest, fleet_curve),
}


def path_fields(model: type[Request]) -> list[str]:
    """The fields of a request that name a file on this machine (inputs to read or outputs to write)."""
    out = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if ann is Path or Path in get_args(ann):
            out.append(name)
    return out


def run(command: str, fields: dict[str, Any], progress=None) -> Response:
    """Build ``command``'s request from ``fields`` and answer it; ``progress(done, total, what)`` is passed to
    commands that report progress."""
    model, fn = COMMANDS[command]
    req = build(model, **fields)
    if progress is not None and "progress" in inspect.signature(fn).parameters:
        return fn(req, progress=progress)
    return fn(req)
