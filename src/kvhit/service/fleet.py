"""``fleet simulate``: R replicas behind a router on a kvhit trace — fleet and per-replica hit ratio, load imbalance,
prefill tokens, queueing delay, rejections (:func:`kvhit.sim.fleet.simulate_fleet`), for every (router, R) asked.

Invariant: every router parameter given applies to the routers named (one given for a router that does not read it
is refused, never ignored); R ≥ 1; weights ≥ 0; ``--N`` is one capacity for all replicas or one per replica (then a
single R). Without ``--prefill-tokens-per-s`` requests are instantaneous (no holds: load-based routers see zero
load and fall back to their tie-breaks); with it request r holds its blocks for ``T_r / speed`` seconds (the whole
prompt's prefill time — cache savings do not shorten it). NOT modelled: see :mod:`kvhit.sim.fleet`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field

from .base import Request, Response, check_capacity_memory
from .common import BlockEngine, Capacity, Seed
from .errors import InputError, translating
from .inputs import read_trace, window_for

__all__ = ["FleetRequest", "FleetResponse", "fleet_simulate", "ROUTER_PARAMS"]

RouterName = Literal["round-robin", "random", "session", "sticky", "least-loaded", "dynamo", "llm-d", "sglang"]

#: request field -> (router parameter, routers that read it)
ROUTER_PARAMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "overlap_score_weight": ("overlap_score_weight", ("dynamo",)),
    "temperature": ("temperature", ("dynamo",)),
    "request_weight": ("request_weight", ("dynamo",)),
    "kv_ttl": ("ttl", ("dynamo",)),
    "session_ttl": ("ttl", ("sticky",)),
    "prefix_weight": ("prefix_weight", ("llm-d",)),
    "queue_weight": ("queue_weight", ("llm-d",)),
    "kv_weight": ("kv_weight", ("llm-d",)),
    "cache_threshold": ("cache_threshold", ("sglang",)),
    "balance_abs_threshold": ("balance_abs_threshold", ("sglang",)),
    "balance_rel_threshold": ("balance_rel_threshold", ("sglang",)),
    "load_metric": ("metric", ("least-loaded",)),
    "kv_mode": ("mode", ("dynamo", "llm-d", "sglang")),
}

NonNeg = Annotated[float, Field(ge=0, le=1e9)]


class FleetRequest(Request):
    trace: Path = Field(description="kvhit trace (Parquet; e.g. from `kvhit trace sharegpt`); required.")
    replicas: Annotated[list[Annotated[int, Field(ge=1, le=4096)]], Field(min_length=1, max_length=64)] = Field(
        description="Replica counts R, each in [1, 4096]; repeat or comma-separate; required."
    )
    router: Annotated[list[RouterName], Field(min_length=1, max_length=16)] = Field(
        ["round-robin"],
        description="Routers (one or more): round-robin | random | session | sticky | least-loaded | dynamo | "
        "llm-d | sglang; "
        "repeat or comma-separate; default: round-robin.",
    )
    N: Annotated[list[Capacity], Field(min_length=1, max_length=4096)] = Field(
        description="Blocks per replica: one value for all, or one per replica (with a single R); required."
    )
    engine: BlockEngine = Field("vllm", description="Engine model of every replica: vllm (≥ 0.24) | vllm-0.23.")
    block_size: int | None = Field(
        None, ge=1, le=2**16, description="Tokens per block, 1–65,536; default: the trace's."
    )
    prefill_tokens_per_s: float | None = Field(
        None, gt=0, le=1e12, description="Prefill speed (tokens/s), > 0, giving holds T/speed; default: none."
    )
    lag: float = Field(0.0, ge=0, le=1e9, description="Load-snapshot interval seen by the router, s; ≥ 0; default 0.")
    warmup: int | None = Field(None, ge=0, description="Warm-up conversations; ≥ 0; default: the trace's n_warm.")
    seed: Seed = 0
    overlap_score_weight: NonNeg | None = Field(None, description="dynamo: prefill-blocks weight, ≥ 0; default 1.")
    temperature: NonNeg | None = Field(None, description="dynamo: softmax temperature, ≥ 0 (0 = argmin); default 0.")
    request_weight: NonNeg | None = Field(None, description="dynamo: weight of in-flight requests, ≥ 0; default 0.")
    kv_ttl: float | None = Field(None, gt=0, le=1e9, description="dynamo approx: shadow TTL, s, > 0; default 120.")
    session_ttl: float | None = Field(None, gt=0, le=1e9, description="sticky: binding TTL, s, > 0; default 300.")
    prefix_weight: NonNeg | None = Field(None, description="llm-d: prefix-cache scorer weight, ≥ 0; default 3.")
    queue_weight: NonNeg | None = Field(None, description="llm-d: queue scorer weight, ≥ 0; default 2.")
    kv_weight: NonNeg | None = Field(None, description="llm-d: kv-utilization scorer weight, ≥ 0; default 2.")
    cache_threshold: float | None = Field(None, ge=0, le=1, description="sglang: match rate, [0, 1]; default 0.3.")
    balance_abs_threshold: NonNeg | None = Field(None, description="sglang: abs imbalance, ≥ 0; default 64.")
    balance_rel_threshold: float | None = Field(None, ge=1, le=1e9, description="sglang: rel imbalance ≥ 1; 1.5.")
    load_metric: Literal["requests", "prefill_tokens"] | None = Field(
        None, description="least-loaded: requests | prefill_tokens; default: requests."
    )
    kv_mode: Literal["precise", "approx"] | None = Field(
        None, description="dynamo/llm-d/sglang cache view: precise | approx; default precise (sglang: approx)."
    )
    estimates: bool = Field(
        True, description="Beside round-robin/random/session rows, the fleet estimator (docs/estimators.md)."
    )
    plot: Path | None = Field(None, description="Write hit ratio vs R per router to PLOT.png/.svg; default: none.")

    FLAGS = {"N": "--N", "replicas": "--replicas", "router": "--router"}


class FleetResponse(Response):
    trace: str
    block_size: int
    engine: str
    rows: list[dict[str, Any]] = Field(description="One row per (router, R): fleet metrics.")
    per_replica: list[dict[str, Any]] = Field(description="Per (router, R, replica): requests, hit ratio, prefill.")
    notes: list[str] = Field(default_factory=list)
    figure: list[str] | None = Field(None, description="Figure files written.")


def _params(req: FleetRequest) -> dict[str, dict]:
    out: dict[str, dict] = {r: {} for r in req.router}
    for field, (name, routers) in ROUTER_PARAMS.items():
        v = getattr(req, field)
        if v is None:
            continue
        used = [r for r in req.router if r in routers]
        if not used:
            raise InputError(
                f"{req.flag(field)}: applies to {' / '.join(routers)}, not to --router {','.join(req.router)} "
                "(it would be ignored)"
            )
        for r in used:
            out[r][name] = v
    return out


def fleet_simulate(req: FleetRequest, progress=None) -> FleetResponse:
    from ..sim.fleet import simulate_fleet
    from ..sim.runner import block_requests

    if len(req.N) > 1 and (len(req.replicas) != 1 or req.replicas[0] != len(req.N)):
        raise InputError(
            f"--N: {len(req.N)} capacities given; one per replica needs a single --replicas {len(req.N)} "
            f"(got --replicas {','.join(map(str, req.replicas))})"
        )
    for N in req.N:
        check_capacity_memory(N * (req.replicas[0] if len(req.N) == 1 else 1), "--N")
    params = _params(req)
    if req.plot is not None:
        from .io import check_output_file

        check_output_file(str(req.plot) + ".png", "--plot")
    tr = read_trace(req.trace)
    window = window_for(tr, req.warmup, None, str(req.trace))
    mask = window.mask(tr)
    with translating(f"--trace {req.trace}"):
        rq = block_requests(tr, block_size=req.block_size)
    conv = tr.dense_conv()
    times = np.asarray(tr["time"], np.float64)
    order = np.argsort(times, kind="stable")
    if not np.array_equal(order, np.arange(times.size)):
        raise InputError(f"--trace {req.trace}: rows are not in arrival-time order")
    hold = None if req.prefill_tokens_per_s is None else rq.prompt_tokens / req.prefill_tokens_per_s
    rows, per = [], []
    total = len(req.router) * len(req.replicas)
    done = 0
    for name in req.router:
        for R in req.replicas:
            if progress:
                progress(done, total, f"{name}, R = {R}")
            Ns = list(req.N) if len(req.N) > 1 else [req.N[0]] * R
            with translating("router"):
                res = simulate_fleet(
                    rq.prompt_tokens,
                    rq.hash_offsets,
                    rq.hashes,
                    conv,
                    Ns=Ns,
                    block_size=rq.block_size,
                    router=name,
                    router_params=params[name],
                    engine=req.engine,
                    times=times,
                    hold=hold,
                    seed=req.seed,
                    lag=req.lag,
                )
            s = res.summary(mask)
            est = None
            if req.estimates and name in ("round-robin", "random", "session") and hold is None:
                from ..estimate_fleet import estimate_fleet

                lam0 = float(tr.meta["lam0"]) if "lam0" in tr.meta else None
                with translating("estimate"):  # the rows the simulated ratio counts (docs/estimators.md §6)
                    est = estimate_fleet(
                        tr, res.replica, Ns, engine=req.engine, window=mask, lam0=lam0, block_size=rq.block_size
                    )
            rows.append({**s, "estimate": est, "N_total": int(sum(Ns)), "params": params[name]})
            per += [{"router": name, "replicas": R, **p} for p in res.per_replica(mask)]
            done += 1
    figure = None
    if req.plot is not None:
        from ..fleet_plot import plot_fleet

        figure = [str(p) for p in plot_fleet(rows, req.plot, title=f"{Path(req.trace).name}, N = {req.N[0]:,} blocks")]
    notes = []
    if hold is None:
        notes.append("no --prefill-tokens-per-s: requests are instantaneous, so load-based routers see no load")
    return FleetResponse(
        trace=str(req.trace),
        block_size=rq.block_size,
        engine=req.engine,
        rows=rows,
        per_replica=per,
        notes=notes,
        figure=figure,
    )
