"""``planner``: everything the planner page draws at once for one set of inputs, in one answer — the KV layout and
capacity (``kv``), the paper's reference curve over a capacity grid (``estimate``, eq. (32)/(39); on a spec only)
and the closed-form plan (``plan`` with the paper's estimator) — so that one slider move is one request.

Invariant: each part *is* its own command's answer: built by that command's own request model from the fields the
client gave (nothing defaulted or recomputed here) and answered by its function, so ``planner(...).kv`` equals
``kv(...)``, ``.estimate`` equals ``estimate(...)`` and ``.plan`` equals ``plan(engine="paper", ...)`` value for
value (pinned in ``tests/test_web_planner.py``). A refusal is the part's own one-line message.

NOT here: the engine's own curve (a simulation, seconds: ``curve``, a job), engine-aware plans (``plan`` with an
engine: jobs), uploaded traces (reading a trace is a job).
"""

from __future__ import annotations

from pydantic import Field

from kvhit.service.base import Response, build
from kvhit.service.common import Capacity
from kvhit.service.errors import InputError
from kvhit.service.estimate import EstimateRequest, EstimateResponse, estimate
from kvhit.service.kv import HardwareFields, KvRequest, KvResponse, kv
from kvhit.service.plan import PlanRequest, PlanResponse, plan
from kvhit.service.spec import SpecFields

__all__ = ["PlannerRequest", "PlannerResponse", "planner"]


class PlannerRequest(HardwareFields, SpecFields):
    """One question of the planner page: a model and KV budget, a workload (the SCM's or a spec's fields, or the
    bundled ShareGPT trace), the reference curve's capacities and a target hit ratio."""

    N: list[Capacity] | None = Field(
        None,
        min_length=1,
        max_length=100_000,
        description="Capacities (blocks) of the paper's reference curve (eq. 39), integers in [1, 2^40]; a spec "
        "only; default: no curve.",
    )
    target: float | None = Field(None, gt=0, lt=1, description="Target hit ratio of the plan; in (0, 1).")
    sharegpt: bool = Field(False, description="Workload: the bundled ShareGPT trace instead of a spec.")

    FLAGS = {**SpecFields.FLAGS, **HardwareFields.FLAGS, "N": "--N"}


class PlannerResponse(Response):
    """The page's answer: each part exactly its own command's answer (``null``: not asked)."""

    kv: KvResponse = Field(description="The answer of `kv` for the model and budget.")
    estimate: EstimateResponse | None = Field(description="The answer of `estimate` at N (null without N).")
    plan: PlanResponse = Field(description="The answer of `plan` with the paper's estimator (eq. 39).")


_HARDWARE = frozenset(HardwareFields.model_fields)
_SPEC = frozenset(SpecFields.model_fields)


def planner(req: PlannerRequest) -> PlannerResponse:
    """The ``kv``, ``estimate`` and paper ``plan`` answers for one set of inputs; refused input raises
    :class:`~kvhit.service.errors.InputError` (one line naming the field)."""
    given = req.model_dump(exclude_unset=True)  # exactly what the client sent: each part sees the same fields
    hw = {k: v for k, v in given.items() if k in _HARDWARE}
    spec = {k: v for k, v in given.items() if k in _SPEC}
    if req.N is not None and req.sharegpt:
        raise InputError("--N: the paper's reference curve is of a spec (lam0, mean_turns, …), not of ShareGPT")
    sharegpt = {"sharegpt": True} if req.sharegpt else {}
    target = {"target": req.target} if "target" in given else {}
    kv_ans = kv(build(KvRequest, **hw))
    est = estimate(build(EstimateRequest, N=req.N, **spec)) if req.N is not None else None
    plan_ans = plan(build(PlanRequest, engine="paper", **target, **sharegpt, **hw, **spec))
    return PlannerResponse(kv=kv_ans, estimate=est, plan=plan_ans)
