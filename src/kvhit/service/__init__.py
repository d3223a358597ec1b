"""kvhit's service layer: one typed request → one function → one typed response per command.

Every front end (the ``kvhit`` CLI, the planned web API of issue 14) goes through here and nowhere else:

* ``XxxRequest`` (pydantic, :class:`~kvhit.service.base.Request`): every input of a command, with unit, range and
  default in each field's description. Building one validates it: types, ranges, finiteness, integers that are
  integers, required inputs; cross-field rules (mutually exclusive sources, output paths, memory) are checked by
  the command function before any computing begins. Use :func:`~kvhit.service.base.build` to turn a
  ``ValidationError`` into an :class:`~kvhit.service.errors.InputError` that names the flag.
* ``xxx(req) -> XxxResponse`` loads inputs, validates what depends on them, calls the library (workload →
  theory/estimate | sim → plan), and returns plain data; it never prints. Library "bad input" exceptions are
  translated to :class:`InputError` (one line naming the file/record/flag/field) with
  :func:`~kvhit.service.errors.translating`.
* ``XxxResponse`` (:class:`~kvhit.service.base.Response`) serializes to strict JSON (``to_json``: ``null`` for
  undefined numbers).

Adding a command: write ``service/<command>.py`` with the three pieces, export them here, and add a thin typer
function in ``kvhit.cli`` that parses flags into the request (``build(XxxRequest, ...)``), calls the function
through ``cli._call`` and renders the response (a table, or ``--json``). No domain logic in the CLI.
"""

from kvhit.service.base import Request, Response, build, strict_json
from kvhit.service.block_stats import BlockStatsRequest, BlockStatsResponse, block_stats, is_block_trace
from kvhit.service.curve import CurveRequest, CurveResponse, curve
from kvhit.service.errors import InputError, translating
from kvhit.service.estimate import EstimateRequest, EstimateResponse, estimate
from kvhit.service.explain import (
    ChatTraceRequest,
    ChatTraceResponse,
    ExplainRequest,
    ExplainResponse,
    chat_trace,
    explain,
)
from kvhit.service.fleet import FleetRequest, FleetResponse, fleet_simulate
from kvhit.service.fleet_plan import (
    FleetCurveRequest,
    FleetCurveResponse,
    FleetPlanRequest,
    FleetPlanResponse,
    fleet_curve,
    fleet_plan,
)
from kvhit.service.kv import HardwareFields, KvRequest, KvResponse, kv, list_presets
from kvhit.service.plan import PlanRequest, PlanResponse, plan
from kvhit.service.replay import ReplayRequest, ReplayResponse, replay
from kvhit.service.runs import PAPER_N, DemoRequest, DemoResponse, ReproduceRequest, ReproduceResponse, demo, reproduce
from kvhit.service.simulate import SimulateRequest, SimulateResponse, simulate
from kvhit.service.spec import SpecFields, TraceOrSpecFields, load_spec
from kvhit.service.stream import StreamRequest, StreamResponse, stream
from kvhit.service.tiers import TiersRequest, TiersResponse, tiers
from kvhit.service.trace_estimate import TraceEstimateRequest, TraceEstimateResponse, trace_estimate
from kvhit.service.traces import (
    GenerateRequest,
    GenerateResponse,
    ShareGPTRequest,
    ShareGPTResponse,
    StatsRequest,
    StatsResponse,
    generate_trace,
    sharegpt_trace,
    trace_stats,
)

__all__ = [
    "InputError",
    "translating",
    "Request",
    "Response",
    "build",
    "strict_json",
    "SpecFields",
    "TraceOrSpecFields",
    "HardwareFields",
    "load_spec",
    "EstimateRequest",
    "EstimateResponse",
    "estimate",
    "ChatTraceRequest",
    "ChatTraceResponse",
    "chat_trace",
    "ExplainRequest",
    "ExplainResponse",
    "explain",
    "KvRequest",
    "KvResponse",
    "kv",
    "list_presets",
    "ReplayRequest",
    "ReplayResponse",
    "replay",
    "TraceEstimateRequest",
    "TraceEstimateResponse",
    "trace_estimate",
    "BlockStatsRequest",
    "BlockStatsResponse",
    "block_stats",
    "is_block_trace",
    "SimulateRequest",
    "SimulateResponse",
    "simulate",
    "StreamRequest",
    "StreamResponse",
    "stream",
    "GenerateRequest",
    "GenerateResponse",
    "generate_trace",
    "StatsRequest",
    "StatsResponse",
    "trace_stats",
    "ShareGPTRequest",
    "ShareGPTResponse",
    "sharegpt_trace",
    "CurveRequest",
    "CurveResponse",
    "curve",
    "PlanRequest",
    "PlanResponse",
    "plan",
    "PAPER_N",
    "DemoRequest",
    "DemoResponse",
    "demo",
    "ReproduceRequest",
    "ReproduceResponse",
    "reproduce",
    "FleetRequest",
    "FleetResponse",
    "fleet_simulate",
    "FleetPlanRequest",
    "FleetPlanResponse",
    "fleet_plan",
    "FleetCurveRequest",
    "FleetCurveResponse",
    "fleet_curve",
    "TiersRequest",
    "TiersResponse",
    "tiers",
]
