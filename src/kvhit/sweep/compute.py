"""One sweep task → result rows, by building each point's service request and calling the service function.

Invariant: every number in a row comes from a service response (:mod:`kvhit.service`); this module only maps grid
coordinates to request fields and response fields to columns. A task's rows depend only on the task (its points,
replication and seed) and the shipped workloads — not on the process that runs it.

Workloads are *shipped*: the driver builds a payload once (:func:`build_payload`: ShareGPT traces per (λ0,
replication) through :func:`kvhit.service.traces.build_sharegpt`, trace files read once, spec files as text) and
every worker installs it once (:func:`install`): traces are preloaded under a path of their own
(:func:`kvhit.service.inputs.preload_trace`), so the per-point requests that name them read memory, not disk;
spec texts are written once per worker process.

NOT done here: retries, batching, storage (:mod:`.backends`, :mod:`.store`).
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from pathlib import Path
from typing import Any

from kvhit.sweep.grid import Grid, Task

__all__ = ["build_payload", "install", "run_task", "execute", "execute_batch", "OUTPUTS"]

#: output columns every row has (None where a compute mode does not produce it)
OUTPUTS = (
    "h",
    "h_ci95",
    "metric",
    "token_hit_ratio",
    "request_hit_rate",
    "h_estimate",
    "feasible",
    "n_measured",
    "extra",
)

_STATE: dict[str, Any] = {"id": None, "pid": None, "paths": {}, "grid": None, "block_sizes": {}}


def build_payload(grid: Grid, tasks: list[Task], tmp: str, progress=None) -> dict:
    """Everything the tasks read, built once in the driver: ``{"grid": Grid, "workloads": {key: item}, "tmp":
    tmp}`` with ``item`` = ``("trace", Trace)`` or ``("spec", text, filename)``; ``tmp`` is the driver's
    scratch directory (see :func:`install`)."""
    from kvhit.service import ShareGPTRequest, build
    from kvhit.service.inputs import read_trace
    from kvhit.service.traces import build_sharegpt

    need: dict[str, Task] = {}
    for t in tasks:
        need.setdefault(t.shipped, t)
    items: dict[str, tuple] = {}
    for k, (key, t) in enumerate(sorted(need.items())):
        if progress:
            progress(k, len(need), f"workload {key}")
        wl = grid.workloads[t.workload]
        if wl.kind == "sharegpt":
            o = wl.options
            req = build(
                ShareGPTRequest,
                out=None,
                seed=t.seed,
                lam0=t.lam0 if t.lam0 is not None else 1.0,
                block_size=wl.block_size,
                **({"n_warm": o["warmup"]} if "warmup" in o else {}),
                **({"n_meas": o["measured"]} if "measured" in o else {}),
                **({"w_mean": o["w_mean"]} if "w_mean" in o else {}),
            )
            items[key] = ("trace", build_sharegpt(req)[0])
        elif wl.kind == "trace":
            items[key] = ("trace", read_trace(wl.path, f"workloads.{wl.name}.trace"))
        elif wl.kind == "blocks_trace":
            from kvhit.service.inputs import read_blocks_trace

            items[key] = ("blocks", read_blocks_trace(wl.path, "sequential", None, None, 0), wl.path.name)
        else:
            items[key] = ("spec", wl.path.read_text(encoding="utf-8"), wl.path.name)
    return {"grid": grid, "workloads": items, "tmp": tmp}


def install(payload_id: str, payload: dict) -> None:
    """Make a shipped payload available in this process (once per process and payload): traces are preloaded
    under a path of their own (no file is written: the services read preloaded traces from memory), spec texts
    are written to a directory of this process under the driver's ``payload["tmp"]`` (removed by the driver at
    the end; a forked worker must not share the files of its parent)."""
    from kvhit.service.inputs import preload_trace

    if _STATE["id"] == payload_id and _STATE.get("pid") == os.getpid():
        return
    for p in _STATE["paths"].values():  # the previous payload's traces
        preload_trace(p, None)
    d = Path(payload["tmp"]) / f"{os.getpid()}-{payload_id[:12]}"
    paths, block_sizes = {}, {}
    for i, (key, item) in enumerate(sorted(payload["workloads"].items())):
        if item[0] == "trace":
            p = d / f"w{i}.parquet"
            preload_trace(p, item[1])
            block_sizes[key] = item[1].block_size
        elif item[0] == "blocks":  # the file's own name: .json / .jsonl / a WEKA directory picks the reader
            p = d / f"w{i}" / item[2]
            preload_trace(p, item[1])
            block_sizes[key] = item[1].block_size
        else:
            p = d / f"w{i}" / item[2]  # keep the spec's file name: its messages name it
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(f".{p.name}.tmp")
            tmp.write_text(item[1], encoding="utf-8")
            os.replace(tmp, p)
        paths[key] = p
    _STATE.update(id=payload_id, pid=os.getpid(), paths=paths, grid=payload["grid"], block_sizes=block_sizes)


def _source(task: Task) -> dict:
    """The request fields naming the task's workload."""
    grid: Grid = _STATE["grid"]
    wl = grid.workloads[task.workload]
    p = _STATE["paths"][task.shipped]
    if wl.kind == "spec":
        d = {"spec": p, **wl.options}
        if task.lam0 is not None:
            d["lam0"] = task.lam0
        return d
    if wl.kind == "blocks_trace":
        return {"blocks_trace": p}
    return {"trace": p}


def _f(x) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


def _row(**kw) -> dict:
    out = dict.fromkeys(OUTPUTS)
    out.update(kw)
    if isinstance(out.get("extra"), dict):
        out["extra"] = json.dumps(out["extra"], sort_keys=True, default=str, allow_nan=False)
    return out


def _steady(st: dict | None) -> dict:
    """The ``extra`` keys of a simulated row's stationarity (:mod:`kvhit.service.steady`): ``stationary`` (null
    where not judged) and, when it is false, the reason."""
    if st is None:
        return {"stationary": None}
    return {"stationary": bool(st["stationary"])} | ({} if st["stationary"] else {"stationarity": st["message"]})


def _clean(d: dict, drop=()) -> dict:
    from kvhit.service.base import jsonable

    return {k: v for k, v in jsonable(d).items() if k not in drop}


def run_task(task: Task) -> list[dict]:
    """The output columns of each of the task's points (same order as ``task.points``)."""
    from kvhit import service as svc

    grid: Grid = _STATE["grid"]
    wl = grid.workloads[task.workload]
    src = _source(task)
    Ns = [int(p["N"]) for p in task.points]
    if "dram_gb" in task.points[0]:
        return [_tiers(task, wl, src, task.points[0])]
    if task.compute == "estimate" and ("replicas" in task.points[0] or "router" in task.points[0]):
        return _fleet_estimates(task, wl, src, Ns)
    if task.compute == "estimate":
        engine = task.points[0].get("engine")
        if wl.kind == "spec":
            r = svc.estimate(svc.build(svc.EstimateRequest, **src, N=Ns, engine=engine, seed=task.seed))
            by_n = {e.N: e for e in r.estimates}
            out = []
            for n in Ns:
                e = by_n[n]
                h = e.h_engine_blocks if engine else e.h
                out.append(
                    _row(
                        h=_f(h),
                        metric="blocks" if engine else "practical",
                        token_hit_ratio=_f(e.h_engine_tokens),
                        h_estimate=_f(e.h),
                        feasible=True,
                        extra=_clean(e, ("N",)),
                    )
                )
            return out
        metric = "tokens" if wl.kind == "blocks_trace" else "blocks"  # a production trace: vLLM's own metric
        r = svc.trace_estimate(svc.build(svc.TraceEstimateRequest, **src, N=Ns, engine=engine, metric=metric))
        by_n = {e.N: e for e in r.rows}
        return [
            _row(
                h=_f(by_n[n].h.get(engine)),
                metric=metric,
                feasible=by_n[n].feasible,
                extra={"refused_request_share": by_n[n].refused_request_share, "lam0": r.lam0},
            )
            for n in Ns
        ]
    if task.compute == "curve":
        return _curve(task, wl, src, Ns)
    p = task.points[0]
    if "replicas" in p or "router" in p:
        r = svc.fleet_simulate(
            svc.build(
                svc.FleetRequest,
                **src,
                replicas=[p.get("replicas", 1)],
                router=[p.get("router", "round-robin")],
                N=[p["N"]],
                engine=p["engine"],
                seed=task.seed,
                estimates=grid.estimates,
                # a trace without a block size (e.g. generated from a spec): the grid's, as simulate assumes
                block_size=None if _STATE["block_sizes"].get(task.shipped) else wl.block_size,
            )
        )
        row = r.rows[0]
        est = row.get("estimate")
        return [
            _row(
                h=_f(row["token_hit_ratio"]),
                metric="tokens",
                token_hit_ratio=_f(row["token_hit_ratio"]),
                h_estimate=_f(est) if isinstance(est, int | float) else None,
                feasible=row.get("rejected", 0) == 0,
                n_measured=row.get("requests"),
                extra=_clean(row, ("router", "replicas", "token_hit_ratio", "estimate", "params")),
            )
        ]
    return [_simulate(task, wl, src, p)]


def _fleet_estimates(task: Task, wl, src: dict, Ns: list[int]) -> list[dict]:
    """Every capacity of one (workload, router, replicas, engine) fleet: :func:`kvhit.service.fleet_estimate_curve`
    (the estimate ``fleet simulate`` prints, all capacities in one call); ``h`` None with the reason in ``extra``
    where the estimators do not model the router."""
    from kvhit import service as svc

    p = task.points[0]
    name, R = p.get("router", "round-robin"), int(p.get("replicas", 1))
    req = svc.build(
        svc.FleetRequest,
        **src,
        replicas=[R],
        router=[name],
        N=[Ns[0]],
        engine=p["engine"],
        seed=task.seed,
        block_size=None if _STATE["block_sizes"].get(task.shipped) else wl.block_size,
    )
    res = svc.fleet_estimate_curve(req, Ns)
    h, why = res.curves[name, R]
    extra = {"router": name, "replicas": R} | ({"estimate_note": why} if why else {})
    return [
        _row(
            h=None if h is None else _f(h[i]),
            metric="tokens",
            h_estimate=None if h is None else _f(h[i]),
            feasible=n >= res.n_min,
            extra=extra,
        )
        for i, n in enumerate(Ns)
    ]


def _tiers(task: Task, wl, src: dict, p: dict) -> dict:
    """A host tier (``sweep.tier``) of ``dram_gb`` GiB behind ``N`` GPU blocks: :func:`kvhit.service.tiers`."""
    from kvhit import service as svc

    grid: Grid = _STATE["grid"]
    estimate = "only" if task.compute == "estimate" else ("also" if grid.estimates else "none")
    r = svc.tiers(
        svc.build(
            svc.TiersRequest,
            **src,
            tier=grid.tier,
            hbm_blocks=[p["N"]],
            dram_gb=[p["dram_gb"]],
            model=grid.model,
            estimate=estimate,
            block_size=None if _STATE["block_sizes"].get(task.shipped) else wl.block_size,
        )
    )
    h = r.h[0][0]
    est = r.h_estimate[0][0] if r.h_estimate else None
    return _row(
        h=_f(h),
        metric="tokens",
        token_hit_ratio=_f(h),
        h_estimate=_f(est),
        feasible=h is not None,
        extra={"tier": r.tier, "h_gpu": r.h_gpu[0], "h_source": r.h_source, "host_units": r.host_units},
    )


def _simulate(task: Task, wl, src: dict, p: dict) -> dict:
    from kvhit import service as svc

    grid: Grid = _STATE["grid"]
    engine = p["engine"]
    kw: dict[str, Any] = dict(src, seed=task.seed, estimates=grid.estimates)
    if wl.kind == "spec":
        kw.update(replications=1, conversations=grid.conversations, block_size=grid.block_size)
    if wl.kind == "blocks_trace" and engine != "sglang":  # both vLLM orders in one call; the engine's row
        r = svc.simulate(svc.build(svc.SimulateRequest, **src, N=[p["N"]]))
        row = next(x for x in r.rows if x["engine"] == engine)
        return _row(
            h=_f(row.get("token_hit_ratio")),
            metric="tokens",
            token_hit_ratio=_f(row.get("token_hit_ratio")),
            request_hit_rate=_f(row.get("request_hit_rate")),
            feasible=bool(row.get("feasible", True)),
            extra=_clean(row, ("N", "engine", "token_hit_ratio", "request_hit_rate", "feasible")),
        )
    if engine == "content":
        kw.update(policy="content", N=[p["N"]])
    elif engine == "sglang":  # SGLang's pool in tokens: the memory of N blocks of b tokens
        kw.update(engine="sglang", N=[p["N"] * wl.block_size])
    else:
        kw.update(policy="block", engine=engine, N=[p["N"]])
    r = svc.simulate(svc.build(svc.SimulateRequest, **kw))
    row = r.rows[0]
    est = r.estimate[0] if r.estimate else {}
    h_est = est.get("h_engine", est.get("h")) if est else None
    return _row(
        h=_f(row.get("h")),
        h_ci95=_f(row.get("h_ci95")),
        metric="tokens" if engine == "sglang" else ("practical" if engine == "content" else "blocks"),
        token_hit_ratio=_f(row.get("token_hit_ratio", row.get("h") if engine == "sglang" else None)),
        request_hit_rate=_f(row.get("request_hit_rate")),
        h_estimate=_f(h_est),
        feasible=bool(row.get("feasible", True)),
        n_measured=row.get("n_measured"),
        extra=_clean(row, ("N", "h", "h_ci95", "token_hit_ratio", "request_hit_rate", "feasible", "n_measured"))
        | _steady(r.stationarity),
    )


def _curve(task: Task, wl, src: dict, Ns: list[int]) -> list[dict]:
    from kvhit import service as svc
    from kvhit.experiments.curve import _EST_LABEL, POLICIES
    from kvhit.service.curve import SGLANG_LABEL
    from kvhit.sim.tracerun import ENGINE_LABELS

    grid: Grid = _STATE["grid"]
    engines = sorted({p["engine"] for p in task.points})
    caps = sorted(set(Ns))
    kw: dict[str, Any] = dict(src, seed=task.seed, estimates=grid.estimates, capacities=caps, policies=engines)
    if wl.kind == "spec":
        kw.update(conversations=grid.conversations, block_size=grid.block_size)
    if "sglang" in engines:
        kw["sglang_points"] = max(2, len(caps))
    r = svc.curve(svc.build(svc.CurveRequest, **kw))
    idx = {n: i for i, n in enumerate(r.N)}
    out = []
    blocks = wl.kind == "blocks_trace"
    for p in task.points:
        e, i = p["engine"], idx[int(p["N"])]
        if e == "sglang":
            label = SGLANG_LABEL
        elif blocks:  # production traces: vLLM's token hit ratio, the agentic estimator beside it
            label = f"{ENGINE_LABELS[e]} token hit ratio"
        else:
            label = POLICIES[e]
        tok = r.curves.get(label if blocks else label + " token ratio")
        est_label = (
            f"estimate: {ENGINE_LABELS.get(e)} (agentic)" if blocks else f"estimate: {_EST_LABEL.get(e)} (engine-aware)"
        )
        est = r.curves.get(est_label)
        feas = True if e == "content" or r.feasible is None else r.feasible[i]
        out.append(
            _row(
                h=_f(r.curves[label][i]),
                metric="tokens" if e == "sglang" or blocks else ("practical" if e == "content" else "blocks"),
                token_hit_ratio=_f(tok[i]) if tok else None,
                h_estimate=_f(est[i]) if est else None,
                feasible=bool(feas),
                extra={"h_max": r.h_max, "lam0": r.lam0} | _steady(r.stationarity),
            )
        )
    return out


def _one_line(e: BaseException) -> str:
    from kvhit.service.errors import one_line

    return one_line(f"{type(e).__name__}: {e}")[:2000]


def _named(task: Task, err: str) -> str:
    """An error names the grid's workload, not the worker's private copy of it."""
    p = _STATE["paths"].get(task.shipped)
    if p is None:
        return err
    wl = _STATE["grid"].workloads[task.workload]
    what = f"workloads.{wl.name}" + (
        f" ({wl.path})" if wl.path else f" (ShareGPT, λ0 {task.lam0}, r {task.replication})"
    )
    return err.replace(str(p), what)


def execute(task: Task) -> tuple[Task, list[dict], str, str | None, float, str]:
    """Run a task in this process: ``(task, rows, status, error, seconds, worker)``; ``status`` is ``ok``,
    ``refused`` (the service refused the request: an :class:`~kvhit.service.InputError`, not retried) or
    ``error``."""
    from kvhit.service import InputError

    t0 = time.perf_counter()
    try:
        rows = run_task(task)
        status, err = "ok", None
    except InputError as e:
        rows, status, err = [_row() for _ in task.points], "refused", _named(task, str(e))
    except Exception as e:  # a failed point is recorded, never kills the sweep
        rows, status, err = [_row() for _ in task.points], "error", _named(task, _one_line(e))
    return task, rows, status, err, time.perf_counter() - t0, worker_name()


def execute_batch(payload_id: str, payload: dict | None, tasks: list[Task]) -> list[tuple]:
    """Install the payload if this process has not yet (``payload`` may be a one-element list holding a Ray object
    reference, fetched only then), and run the tasks."""
    if _STATE["id"] != payload_id or _STATE["pid"] != os.getpid():
        if isinstance(payload, list):
            import ray

            payload = ray.get(payload[0])
        install(payload_id, payload)
    return [execute(t) for t in tasks]


def worker_name() -> str:
    """``host:pid`` of the process running a point (recorded in each result row)."""
    return f"{socket.gethostname()}:{os.getpid()}"
