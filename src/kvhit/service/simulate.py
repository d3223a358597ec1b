"""``simulate``: the exact hit ratio — Algorithm 1 (``policy="content"``) or the vLLM block cache
(``policy="block"``) — on a kvhit trace (95% CI from batch means), on a spec (independent replications, seed
+ r, Student-t CI), or on a production block-id trace (both vLLM free-queue orders); beside the estimators.

Invariant: every flag given changes the answer or is refused (a replication count with ``--trace``, a weighting
with the block policy, …); simulated capacities fit in memory (checked before allocating). NOT modelled here:
the simulators themselves (``kvhit.sim``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from kvhit.service.base import Response, check_capacity_memory
from kvhit.service.common import BlockEngine, Capacities, Seed
from kvhit.service.engines import check_pools, check_sglang_flags, sglang_model, sglang_notes
from kvhit.service.errors import InputError, translating
from kvhit.service.inputs import (
    measured_moments,
    production_mask,
    production_notes,
    read_blocks_trace,
    read_trace,
    window_for,
)
from kvhit.service.spec import TraceOrSpecFields, load_spec
from kvhit.service.steady import size_spec, steady_note, steady_report

__all__ = ["SimulateRequest", "SimulateResponse", "simulate", "simulate_trace_rows", "trace_estimates"]

Arrival = Literal["sequential", "poisson", "uniform"]


class BlocksTraceFields(TraceOrSpecFields):
    """The input fields shared by commands that take a trace, a spec or a production block-id trace (``--blocks-
    trace`` with its arrival options)."""

    blocks_trace: Path | None = Field(
        None, description="Production block-id trace: Mooncake .jsonl, or WEKA .json file/directory."
    )
    arrival: Arrival = Field(
        "sequential", description="WEKA conversation starts: sequential | poisson (--rate) | uniform (--span)."
    )
    rate: float | None = Field(None, gt=0, description="WEKA poisson arrivals: conversations/s; > 0.")
    span: float | None = Field(None, ge=0, description="WEKA uniform arrivals over [0, span] seconds; ≥ 0.")

    FLAGS = {**TraceOrSpecFields.FLAGS, "blocks_trace": "--blocks-trace"}

    def check_sources(self) -> str:
        """Which workload source: ``"blocks"``, ``"trace"`` or ``"spec"``; mixed sources are refused."""
        if self.blocks_trace is not None:
            if self.trace is not None or self.spec is not None:
                other = "--trace" if self.trace is not None else "--spec"
                raise InputError(f"--blocks-trace and {other}: give one workload source, not both")
            from kvhit.service.spec import spec_flags_given

            extra = spec_flags_given(self)
            if extra:
                raise InputError(f"{extra[0]}: applies to a spec, not to --blocks-trace (it would be ignored)")
            return "blocks"
        if self.arrival != "sequential" or self.rate is not None or self.span is not None:
            raise InputError("--arrival/--rate/--span: apply to --blocks-trace (WEKA), not to this source")
        self.check_source()
        return "trace" if self.trace is not None else "spec"


class SimulateRequest(BlocksTraceFields):
    """The inputs of ``kvhit simulate``, validated: each field's description states its unit, range and default."""

    N: Capacities
    policy: Literal["content", "block"] = Field(
        "content",
        description="content (Algorithm 1, whole-conversation LRU) | block (vLLM prefix cache); default: content "
        "(with --engine sglang: the SGLang model).",
    )
    engine: BlockEngine | Literal["sglang"] = Field(
        "vllm",
        description="vllm (≥ 0.24) | vllm-0.23 (block policy) | sglang (SGLang 0.5.23 radix cache, --N in tokens).",
    )
    page_size: int | None = Field(
        None, ge=1, le=2**16, description="--engine sglang: tokens per page, 1–65,536; default 1."
    )
    evict_policy: str | None = Field(
        None, description="--engine sglang: lru (default) | fifo | mru | filo | lfu | slru | priority | tlru."
    )
    sglang_cache: str | None = Field(
        None,
        description="--engine sglang: SGLang's cache class, unified (UnifiedRadixCache, default) | radix (RadixCache).",
    )
    tlru_threshold: int | None = Field(
        None,
        ge=0,
        le=2**40,
        description="--evict-policy tlru: T-LRU threshold − next-prompt estimate (tokens); default 0.",
    )
    prefill_tokens_per_s: float | None = Field(
        None, gt=0, le=1e12, description="--engine sglang: in-flight holds of T/speed seconds (FIFO admission); > 0."
    )
    decode_tokens_per_s: float | None = Field(
        None, gt=0, le=1e12, description="--engine sglang: adds n/speed seconds of decode to each hold; > 0."
    )
    weighting: Literal["base", "practical"] | None = Field(
        None, description="Content policy hit weight: base (eq. 12) | practical (eq. 31); default: practical."
    )
    colocated: bool = Field(False, description="Block policy: keep the response KV (prefill/decode colocated).")
    block_size: int | None = Field(
        None, ge=1, le=2**16, description="Tokens per block, 1–65,536; default: the trace's, else 128."
    )
    conversations: int | None = Field(
        None,
        ge=1,
        le=10**8,
        description="Spec mode: measured conversations per replication; 1–10^8; default: sized from the spec "
        "(max(20,000, 5 lifetimes × λ0·E[M]·E[W] alive)) — a smaller value is reported if not stationary.",
    )
    warmup: int | None = Field(
        None,
        ge=0,
        description="Warm-up conversations; ≥ 0; default: the trace's n_warm, or on a spec max(20% of -n, 3 lifetimes "
        "× λ0·E[M]·E[W]).",
    )
    warmup_time: float | None = Field(None, ge=0, description="Warm-up by time, seconds; ≥ 0.")
    replications: int | None = Field(
        None, ge=1, le=10_000, description="Spec mode: independent replications (seed + r); ≥ 1; default: 5."
    )
    seed: Seed = 0
    estimates: bool = Field(True, description="Also compute the estimators beside the simulation.")

    FLAGS = {**BlocksTraceFields.FLAGS, "N": "--N"}


class SimulateResponse(Response):
    """The answer of ``kvhit simulate`` (``--json`` prints it; strict JSON, ``null`` where a number is undefined)."""

    policy: str
    rows: list[dict[str, Any]] = Field(description="One row per capacity (and engine): simulated h, 95% CI, …")
    estimate: list[dict[str, Any]] = Field(default_factory=list, description="Estimators at each N.")
    trace: str | None = None
    spec: dict[str, Any] | None = None
    blocks_trace: str | None = None
    describe: dict[str, Any] | None = Field(None, description="Production trace summary (--blocks-trace).")
    notes: list[str] = Field(default_factory=list, description="What the reader changed or noticed.")
    N_min: int | None = Field(None, description="Largest request in blocks: vLLM cannot serve smaller capacities.")
    stationarity: dict[str, Any] | None = Field(
        None,
        description="Whether the measured window reached steady state (active conversations over time, "
        "kvhit.workload.stationarity); null where not judged (a production block-id trace).",
    )


def simulate_trace_rows(
    tr, Ns, policy, engine, weighting, colocated, window, block_size=None, progress=None
) -> list[dict]:
    """One row per capacity: simulated h (batch-means 95% CI) on a fixed trace. Block policy: capacities below
    the largest request are infeasible (vLLM would refuse requests; refused shares, no ratio:
    :mod:`kvhit.sim.feasibility`). Algorithm 1 serves every request (a content larger than N is a miss, nothing is
    left out), so the content policy has no infeasible capacity. ``progress(done, total, what)`` is called before
    each simulated capacity."""
    from kvhit.sim.content.lru import simulate_content
    from kvhit.sim.feasibility import feasibility
    from kvhit.sim.metrics import batch_means, content_hit_stats
    from kvhit.sim.runner import block_requests, simulate_trace_block

    rows = []
    wmask = window.mask(tr) if window is not None else np.ones(tr.n_turns, bool)
    rq0 = None
    if policy == "block":
        rq0 = block_requests(tr, block_size=block_size, colocated=colocated)
        feas = feasibility(rq0.prompt_tokens, rq0.block_size, Ns, mask=wmask, response_tokens=rq0.response_tokens)
        for k in range(len(Ns)):
            if not feas.feasible[k]:
                rows.append(
                    {"N": Ns[k], "policy": policy, **feas.row(k), "h": None, "h_ci95": None, "N_min": feas.N_min}
                )
        Ns = [n for k, n in enumerate(Ns) if feas.feasible[k]]
    if policy == "content":
        conv, practical = tr.dense_conv(), weighting == "practical"
        R_prev = tr.R_prev()
        weight = np.maximum(R_prev - 1, 0) if practical else R_prev  # eq. (31) or eq. (12)
        for k, N in enumerate(Ns):
            if progress:
                progress(k, len(Ns), f"Algorithm 1 at N = {N:,}")
            hit = simulate_content(conv, tr["R"], N).hit.astype(bool)
            st = content_hit_stats(tr, hit, window=window, practical=practical)
            _, half = batch_means(tr, np.where(hit, weight, 0), tr["R"], window)
            rows.append(
                {
                    "N": N,
                    "policy": "content",
                    "weighting": weighting,
                    "h": st.h,
                    "h_ci95": half,
                    "request_hit_rate": st.request_hit_rate,
                    "n_measured": st.n_measured,
                }
            )
    else:
        rq = rq0
        for k, N in enumerate(Ns):
            if progress:
                progress(k, len(Ns), f"{engine} block cache at N = {N:,}")
            res, m = simulate_trace_block(tr, N, engine=engine, colocated=colocated, window=window, requests=rq)
            _, half = batch_means(tr, res.hit_blocks.astype(float), res.prompt_blocks, window)
            rows.append(
                {
                    "N": N,
                    "policy": "block",
                    "engine": engine,
                    "source": rq.source,
                    "h": m["h_blocks"],
                    "h_ci95": half,
                    "token_hit_ratio": m["token_hit_ratio"],
                    "request_hit_rate": m["request_hit_rate"],
                    "evictions": m["evictions"],
                    "rejected": m["rejected"],
                    "n_measured": m["n_measured"],
                }
            )
    for r in rows:
        r.setdefault("feasible", True)
        r.setdefault("refused_request_share", 0.0)
        r.setdefault("refused_token_share", 0.0)
    return sorted(rows, key=lambda r: r["N"])


def _null_infeasible_estimates(rows: list[dict], est: list[dict]) -> None:
    """No estimated ratio either where the capacity cannot serve the workload."""
    bad = {r["N"] for r in rows if not r.get("feasible", True)}
    for e in est:
        if e["N"] in bad:
            for k in list(e):
                if k.startswith("h"):
                    e[k] = None
            e["feasible"] = False


def trace_estimates(tr, Ns: list[int], window, practical: bool) -> list[dict]:
    """The paper's estimator (eq. (35)–(39), empirical F̂) on the measured conversations of a trace."""
    from kvhit.estimate.mean_field import estimate

    mom, lam0 = measured_moments(tr, window)
    e_b = estimate(mom, np.asarray(Ns, float), lam0, "empirical", practical=False)
    e_p = estimate(mom, np.asarray(Ns, float), lam0, "empirical", practical=True)
    out = []
    for i, n in enumerate(Ns):
        hb, hp = float(np.atleast_1d(e_b.h)[i]), float(np.atleast_1d(e_p.h)[i])
        out.append(
            {
                "N": n,
                "h": hp if practical else hb,
                "h_base": hb,
                "h_prac": hp,
                "lam0": lam0,
                "T_C": float(np.atleast_1d(e_b.T_C)[i]),
                "T_C_prac": float(np.atleast_1d(e_p.T_C)[i]),
            }
        )
    return out


def _add_engine_estimates(est: list[dict], source, Ns, policy, engine, block_size=128) -> None:
    """The engine-aware estimate (block-weighted, like the simulated h) of the simulated engine beside each row."""
    from kvhit.plan.planner import make_workload

    wl = make_workload(
        source, engine="content" if policy == "content" else engine, metric="blocks", block_size=block_size
    )
    h = wl.predict(np.asarray(Ns, float), np.full(len(Ns), wl.lam0))
    for e, v in zip(est, h, strict=True):
        e["h_engine"] = float(v)


def simulate(req: SimulateRequest, progress=None) -> SimulateResponse:
    """Run the request; ``progress(done, total, what)`` reports replications (spec) or capacities (trace).
    Dispatches once on ``req.engine`` (:data:`_SIMULATE`, keyed like :data:`kvhit.sim.registry.ENGINES`)."""
    source = req.check_sources()
    return _SIMULATE[req.engine](req, source, progress)


def _simulate_vllm(req: SimulateRequest, source: str, progress=None) -> SimulateResponse:
    """``simulate`` with vLLM's block cache (both free-queue orders) or Algorithm 1 (``--policy content``)."""
    check_sglang_flags(req, False)
    for name in ("prefill_tokens_per_s", "decode_tokens_per_s"):
        if getattr(req, name) is not None:
            raise InputError(f"{req.flag(name)}: in-flight holds are simulated for --engine sglang")
    if req.policy == "block" and req.weighting is not None:
        raise InputError("--weighting: applies to --policy content (the block policy counts blocks)")
    if req.policy == "content" and req.colocated:
        raise InputError("--colocated: applies to --policy block")
    if source != "spec":
        for name in ("conversations", "replications"):
            if getattr(req, name) is not None:
                raise InputError(f"{req.flag(name)}: applies to a spec (a trace file is simulated once)")
    if source == "blocks" and req.warmup is not None:
        raise InputError("--warmup: a production trace has no conversation warm-up; use --warmup-time")
    if source == "spec" and req.warmup_time is not None:
        raise InputError("--warmup-time: applies to a trace file; on a spec use --warmup (conversations)")
    for n in req.N:  # the block pool and the engine-aware estimator's tables grow with N
        check_capacity_memory(n, "--N")
    weighting = req.weighting or "practical"
    Ns = list(req.N)

    if source == "blocks":
        from kvhit.sim.tracerun import production_rows

        pt = read_blocks_trace(req.blocks_trace, req.arrival, req.rate, req.span, req.seed)
        production_mask(pt, req.warmup_time)  # refuses a warm-up that leaves nothing to measure
        with translating(f"--blocks-trace {req.blocks_trace}"):
            rows, feas = production_rows(pt, Ns, ["vllm", "vllm-0.23"], warmup_time=req.warmup_time)
            est: list[dict] = []
            notes = production_notes(pt)
            if req.estimates:
                from kvhit.service.agentic_band import agentic_estimates, band_rows
                from kvhit.sim.tracerun import measured_mask

                m = measured_mask(pt, req.warmup_time) if req.warmup_time is not None else None
                ests = agentic_estimates(pt, Ns, mask=m, seed=req.seed)
                est = band_rows(ests, Ns)
                for e, d in ests.items():
                    notes += [f"estimate ({e}): {n}" for n in d["regime"].get("notes", [])]
            return SimulateResponse(
                N_min=feas.N_min,
                policy="block",
                blocks_trace=str(req.blocks_trace),
                describe=pt.describe(),
                rows=rows,
                estimate=est,
                notes=notes,
            )

    if source == "trace":
        tr = read_trace(req.trace)
        if tr.block_size is None:
            tr.meta["block_size"] = req.block_size or 128
        window = window_for(tr, req.warmup, req.warmup_time, str(req.trace))
        with translating(f"--trace {req.trace}"):
            rows = simulate_trace_rows(
                tr, Ns, req.policy, req.engine, weighting, req.colocated, window, req.block_size, progress=progress
            )
            est = []
            if req.estimates:
                if progress:
                    progress(len(Ns), len(Ns) + 2, "estimators: paper eq. (39)")
                est = trace_estimates(tr, Ns, window, weighting == "practical")
                if progress:
                    progress(len(Ns) + 1, len(Ns) + 2, "estimators: engine-aware")
                _add_engine_estimates(est, tr, Ns, req.policy, req.engine)
                _null_infeasible_estimates(rows, est)
            st = steady_report(tr, window.mask(tr))
        return SimulateResponse(
            policy=req.policy, trace=str(req.trace), rows=rows, estimate=est, stationarity=st, notes=steady_note(st)
        )

    from kvhit.service.estimate import spec_estimates
    from kvhit.sim.metrics import mean_ci
    from kvhit.workload import Window, generate

    sp = load_spec(req)
    conversations, n_warm = size_spec(sp, req.conversations, req.warmup)
    replications = req.replications or 5
    per_N: dict[int, list[dict]] = {n: [] for n in Ns}
    st = None
    with translating(str(req.spec) if req.spec else "spec"):
        for r in range(replications):
            tr = generate(sp, req.seed + r, n_conversations=conversations + n_warm)
            if req.block_size:
                tr.meta["block_size"] = req.block_size
            elif req.policy == "block":
                tr.meta["block_size"] = 128
            window = Window.warmup_conversations(tr, n_warm)
            if st is None:  # replications share the sizing: the first one's window is reported
                st = steady_report(tr, window.mask(tr), sp)
            for row in simulate_trace_rows(tr, Ns, req.policy, req.engine, weighting, req.colocated, window):
                per_N[row["N"]].append(row)
            if progress is not None:
                progress(r + 1, replications)
        rows = []
        for n in Ns:
            reps = per_N[n]
            if not all(x.get("feasible", True) for x in reps):
                rows.append(
                    {
                        "N": n,
                        "policy": req.policy,
                        "feasible": False,
                        "refused_request_share": float(np.mean([x["refused_request_share"] for x in reps])),
                        "refused_token_share": float(np.mean([x["refused_token_share"] for x in reps])),
                        "h": None,
                        "h_ci95": None,
                        "replications": replications,
                    }
                )
                continue
            h, half = mean_ci([x["h"] for x in reps])
            rq, _ = mean_ci([x["request_hit_rate"] for x in reps])
            row = {
                "N": n,
                "policy": req.policy,
                "feasible": True,
                "h": h,
                "h_ci95": half,
                "request_hit_rate": rq,
                "replications": replications,
                "h_reps": [x["h"] for x in reps],
            }
            if req.policy == "block":
                row["engine"] = req.engine
                row["token_hit_ratio"] = mean_ci([x["token_hit_ratio"] for x in reps])[0]
            else:
                row["weighting"] = weighting
            rows.append(row)
        est = []
        if req.estimates:
            est = spec_estimates(sp, Ns, weighting == "practical")
            _add_engine_estimates(est, sp, Ns, req.policy, req.engine, req.block_size or 128)
            _null_infeasible_estimates(rows, est)
    return SimulateResponse(
        policy=req.policy, rows=rows, estimate=est, spec=sp.to_dict(), stationarity=st, notes=steady_note(st)
    )


def _simulate_sglang(req, source: str, progress=None) -> SimulateResponse:
    """``simulate --engine sglang`` on a production trace, a kvhit trace or a spec (replications)."""
    from kvhit.service.inputs import production_mask, production_notes, read_blocks_trace, read_trace, window_for
    from kvhit.sim.sglang.run import radix_holds, radix_rows
    from kvhit.sim.sglang.streams import streams_from_production, streams_from_trace

    p, pol = check_sglang_flags(req, True, ("block_size", "colocated", "weighting"))
    model = sglang_model(req, pol)
    if "policy" in req.model_fields_set and req.policy == "content":
        raise InputError("--policy content and --engine sglang: the SGLang model is its own policy; drop --policy")
    Cs = [int(n) for n in req.N]
    check_pools(Cs, p)
    speeds = (req.prefill_tokens_per_s, req.decode_tokens_per_s)
    if source == "blocks":
        pt = read_blocks_trace(req.blocks_trace, req.arrival, req.rate, req.span, req.seed)
        mask = production_mask(pt, req.warmup_time)
        with translating(f"--blocks-trace {req.blocks_trace}"):
            ts = streams_from_production(pt)
            hold = radix_holds(ts, *speeds)
            rows, feas, _ = radix_rows(
                ts, Cs, page_size=p, evict_policy=pol, mask=mask, times=pt.time, hold=hold, progress=progress, **model
            )
        return SimulateResponse(
            policy="sglang",
            blocks_trace=str(req.blocks_trace),
            describe=pt.describe(),
            rows=rows,
            notes=sglang_notes(p, pol, hold, model["cache"]) + production_notes(pt),
            N_min=feas.C_min,
        )
    if source == "trace":
        tr = read_trace(req.trace)
        window = window_for(tr, req.warmup, req.warmup_time, str(req.trace))
        with translating(f"--trace {req.trace}"):
            ts = streams_from_trace(tr, block_size=tr.block_size or 128)
            hold = radix_holds(ts, *speeds)
            rows, feas, _ = radix_rows(
                ts,
                Cs,
                page_size=p,
                evict_policy=pol,
                mask=window.mask(tr),
                times=tr["time"],
                hold=hold,
                progress=progress,
                **model,
            )
        st = steady_report(tr, window.mask(tr))
        return SimulateResponse(
            policy="sglang",
            trace=str(req.trace),
            rows=rows,
            notes=sglang_notes(p, pol, hold, model["cache"]) + steady_note(st),
            N_min=feas.C_min,
            stationarity=st,
        )

    from kvhit.service.spec import load_spec
    from kvhit.sim.metrics import mean_ci
    from kvhit.workload import Window, generate

    sp = load_spec(req)
    conversations, n_warm = size_spec(sp, req.conversations, req.warmup)
    replications = req.replications or 5
    per: dict[int, list[dict]] = {c: [] for c in Cs}
    hold = None
    C_min = 0
    st = None
    with translating(str(req.spec) if req.spec else "spec"):
        for r in range(replications):
            tr = generate(sp, req.seed + r, n_conversations=conversations + n_warm)
            window = Window.warmup_conversations(tr, n_warm)
            if st is None:
                st = steady_report(tr, window.mask(tr), sp)
            ts = streams_from_trace(tr, block_size=128)
            hold = radix_holds(ts, *speeds)
            rows, feas, _ = radix_rows(
                ts, Cs, page_size=p, evict_policy=pol, mask=window.mask(tr), times=tr["time"], hold=hold, **model
            )
            C_min = max(C_min, feas.C_min)
            for row in rows:
                per[row["N"]].append(row)
            if progress is not None:
                progress(r + 1, replications)
    out = []
    for c in Cs:
        reps = per[c]
        base = {"N": c, "engine": "sglang", "unit": "tokens", "page_size": p, "evict_policy": pol}
        base["sglang_cache"] = model["cache"]
        if not all(x["feasible"] for x in reps):
            base.update(
                feasible=False,
                h=None,
                h_ci95=None,
                refused_request_share=float(np.mean([x["refused_request_share"] for x in reps])),
                refused_token_share=float(np.mean([x["refused_token_share"] for x in reps])),
                replications=replications,
            )
        else:
            h, half = mean_ci([x["h"] for x in reps])
            base.update(
                feasible=True,
                h=h,
                h_ci95=half,
                token_hit_ratio=h,
                request_hit_rate=mean_ci([x["request_hit_rate"] for x in reps])[0],
                refused_request_share=0.0,
                refused_token_share=0.0,
                replications=replications,
                h_reps=[x["h"] for x in reps],
            )
        out.append(base)
    notes = sglang_notes(p, pol, hold, model["cache"])
    notes[0] = notes[0].replace("CI from 10 batch means in arrival order", "CI over independent replications")
    return SimulateResponse(
        policy="sglang", rows=out, spec=sp.to_dict(), notes=notes + steady_note(st), N_min=C_min, stationarity=st
    )


#: ``simulate``'s one dispatch on the engine (names of :data:`kvhit.sim.registry.ENGINES`)
_SIMULATE = {"vllm": _simulate_vllm, "vllm-0.23": _simulate_vllm, "sglang": _simulate_sglang}
