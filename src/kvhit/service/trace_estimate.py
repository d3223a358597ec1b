"""``estimate --trace / --blocks-trace``: the predicted vLLM hit ratio of a trace at given capacities, with the
capacities that cannot serve it marked.

* ``--blocks-trace`` (Mooncake / WEKA block ids): the agentic estimator
  (:func:`kvhit.estimate.agentic.estimate_trace`) of both vLLM orders (or ``--engine``), at the trace's own
  load (its conversations at the start times it was read with) or, with ``--lam0``, a stationary stream of its
  conversations at that rate; the estimator's own regime flag (``validated`` and why not) is passed on.
* ``--trace`` (kvhit Parquet): the engine-aware estimator (:func:`kvhit.plan.planner.make_workload`, eq. (38)–(39) with
  the engine's block accounting, docs/estimators.md) at the trace's λ0 (or ``--lam0``).
* ``--engine sglang``: SGLang 0.5.23's radix cache (:mod:`kvhit.estimate.sglang` on a kvhit trace,
  :mod:`kvhit.estimate.sglang_agentic` on a block-id trace; docs/estimators.md §7); ``--N`` is then its KV pool in
  **tokens** (as ``simulate --engine sglang``), feasibility is SGLang's (a request needing
  ``T + n − 1`` tokens more than the pool is refused), the ratio is SGLang's token hit ratio. With ``--replays K``
  (``--blocks-trace`` only) ``h_mc`` is the mean of K exact SGLang replays at start times redrawn from the trace's
  start histogram (``h_mc_se`` its standard error) and ``h_lo`` / ``h_hi`` their (B1) band, widened to contain the
  analytic ``h`` where they disagree (:func:`kvhit.estimate.replay_band.sglang_band`, as the vLLM band);
  ``validated`` is false.

Invariant: a capacity below the largest request (``N_min``) is infeasible: its ``h`` is ``None`` for every engine
and the row carries the shares of requests and prompt tokens vLLM would refuse (:mod:`kvhit.sim.feasibility`).
NOT modelled here: anything the estimators do not model (see their docstrings); use ``simulate`` or
``plan --verify`` for the exact answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from kvhit.service.base import Request, Response
from kvhit.service.common import BlockEngine, Capacities, Seed
from kvhit.service.errors import InputError, translating

__all__ = ["TraceEstimateRequest", "TraceEstimateResponse", "trace_estimate"]


class TraceEstimateRequest(Request):
    """The inputs of ``kvhit estimate --blocks-trace``, validated: each field's description states its unit, range
    and default."""

    N: Capacities
    trace: Path | None = Field(None, description="kvhit trace (Parquet); default: none.")
    blocks_trace: Path | None = Field(
        None, description="Production block-id trace: Mooncake .jsonl, or WEKA .json file/dir; default: none."
    )
    arrival: Literal["sequential", "poisson", "uniform"] = Field(
        "sequential", description="WEKA conversation starts: sequential | poisson (--rate) | uniform (--span)."
    )
    rate: float | None = Field(None, gt=0, description="WEKA poisson arrivals: conversations/s; > 0.")
    span: float | None = Field(None, ge=0, description="WEKA uniform arrivals over [0, span] seconds; ≥ 0.")
    seed: Seed = 0
    engine: BlockEngine | Literal["sglang"] | None = Field(
        None, description="vllm (≥ 0.24) | vllm-0.23 | sglang (--N in tokens); default: both vLLM orders."
    )
    page_size: int | None = Field(
        None, ge=1, le=2**16, description="--engine sglang on --trace: tokens per page, 1–65,536; default 1."
    )
    metric: Literal["tokens", "blocks"] = Field(
        "tokens", description="tokens (vLLM's prefix_cache_hits/queries) | blocks (block-weighted h)."
    )
    lam0: float | None = Field(
        None, gt=0, description="Predict a stationary stream of the trace's conversations at λ0 (conversations/s)."
    )

    replays: int | None = Field(
        None,
        ge=2,
        le=1000,
        description="--engine sglang with --blocks-trace: K exact SGLang replays at start times redrawn from the "
        "trace's start histogram: h_mc (their mean), h_mc_se and h_lo/h_hi (the 90 % band of one "
        "realisation (K simulations per pool: ~0.4 s each on a 35-conversation WEKA pool); 2–1,000; default none "
        "(the analytic estimate, no band).",
    )

    expected_se: float | None = Field(
        None,
        gt=0,
        lt=0.1,
        description="--blocks-trace (vLLM): also h_exp, the expected hit ratio over the exchangeable start law "
        "(i.i.d. starts on the trace's widened span, every order of the conversations equally likely), by exact "
        "replays added 16 at a time until its standard error is at most this at every feasible capacity (32–512 "
        "replays, ~0.15–0.4 s each on a 35-conversation WEKA pool); in (0, 0.1); default none.",
    )

    FLAGS = {
        "N": "--N",
        "expected_se": "--expected-se",
        "blocks_trace": "--blocks-trace",
        "lam0": "--lam0",
        "page_size": "--page-size",
        "replays": "--replays",
    }


class TraceEstimateRow(Response):
    """One capacity of ``kvhit estimate --blocks-trace``: feasibility, refused shares and the agentic estimator's
    hit ratios."""

    N: int = Field(description="Capacity in blocks (SGLang: tokens).")
    feasible: bool = Field(description="N ≥ the largest request: vLLM can serve every request.")
    refused_request_share: float = Field(description="Share of requests vLLM would refuse at N.")
    refused_token_share: float = Field(description="Share of prompt tokens in refused requests.")
    h: dict[str, float | None] = Field(description="Predicted hit ratio per engine (None where infeasible).")
    h_lo: dict[str, float | None] = Field(
        default_factory=dict, description="Lower end of the band for one realisation of the starts (--blocks-trace)."
    )
    h_hi: dict[str, float | None] = Field(default_factory=dict, description="Upper end of that band.")
    h_mc: dict[str, float | None] = Field(
        default_factory=dict,
        description="Mean of the band's exact replays: the expected value to report on WEKA pools (--blocks-trace; "
        "SGLang with --replays).",
    )
    h_mc_se: dict[str, float | None] = Field(default_factory=dict, description="Monte Carlo standard error of h_mc.")
    h_exp: dict[str, float | None] = Field(
        default_factory=dict,
        description="--expected-se: the expected hit ratio over the exchangeable start law (exact replays).",
    )
    h_exp_se: dict[str, float | None] = Field(default_factory=dict, description="Monte Carlo standard error of h_exp.")


class TraceEstimateResponse(Response):
    """The answer of ``kvhit estimate --blocks-trace`` (``--json`` prints it; strict JSON, ``null`` where a number
    is undefined)."""

    source: str
    format: str
    estimator: str
    metric: str
    lam0: float | None
    h_max: float | None = Field(description="Infinite-cache ceiling of the metric.")
    N_min: int = Field(description="Largest request (blocks; SGLang: tokens): smaller capacities are infeasible.")
    unit: Literal["blocks", "tokens"] = Field("blocks", description="Unit of N and N_min.")
    regime: dict[str, Any] = Field(default_factory=dict, description="The estimator's own validity flag and notes.")
    level: float | None = Field(None, description="Level of the h_lo–h_hi band (None: no band).")
    band: dict[str, Any] | None = Field(
        None, description="How the band was made (--engine sglang --replays: replays, seed, the analytic estimate)."
    )
    rows: list[TraceEstimateRow]


def _read_blocks(req: TraceEstimateRequest):
    from kvhit.service.inputs import load_production_file

    p = req.blocks_trace
    kw: dict[str, Any] = {}
    if p.is_dir() or p.suffix == ".json":
        kw = {"arrival": req.arrival, "rate": req.rate, "span": req.span, "seed": req.seed}
    with translating(str(p)):
        return load_production_file(p, **kw)


def trace_estimate(req: TraceEstimateRequest) -> TraceEstimateResponse:
    """``kvhit estimate --blocks-trace``: cross-field checks and output paths first, then the library; refused input
    raises :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    from kvhit.sim.feasibility import feasibility

    if (req.trace is None) == (req.blocks_trace is None):
        raise InputError("--trace / --blocks-trace: give exactly one")
    if req.expected_se is not None and (req.blocks_trace is None or req.engine == "sglang" or req.lam0 is not None):
        raise InputError(
            "--expected-se: applies to --blocks-trace at the trace's own load with the vLLM engines (it redraws the "
            "trace's start times; not with --trace, --lam0 or --engine sglang)"
        )
    if req.engine == "sglang":
        return _sglang(req)
    if req.replays is not None:
        raise InputError("--replays: applies to --engine sglang (the vLLM band always replays 16 realisations)")
    if req.page_size is not None:
        raise InputError("--page-size: applies to --engine sglang")
    engines = [req.engine] if req.engine else ["vllm", "vllm-0.23"]
    Ns = np.asarray(req.N, dtype=np.int64)
    h: dict[str, np.ndarray] = {}
    regime: dict[str, Any] = {}
    lo: dict[str, np.ndarray] = {}
    hi: dict[str, np.ndarray] = {}
    mc: dict[str, np.ndarray] = {}
    mc_se: dict[str, np.ndarray] = {}
    ex: dict[str, np.ndarray] = {}
    ex_se: dict[str, np.ndarray] = {}
    level = None
    if req.blocks_trace is not None:
        from kvhit.service.agentic_band import agentic_estimates

        pt = _read_blocks(req)
        with translating(str(req.blocks_trace)):
            ests = agentic_estimates(
                pt, Ns, engines, metric=req.metric, lam0=req.lam0, seed=req.seed, expected_se=req.expected_se
            )
            for e, d in ests.items():
                h[e], lo[e], hi[e] = d["h"], d["h_lo"], d["h_hi"]
                mc[e], mc_se[e] = d["h_mc"], d["h_mc_se"]
                if req.expected_se is not None:
                    ex[e], ex_se[e] = d["h_exp"], d["h_exp_se"]
                regime[e] = d["regime"]
                level = d["level"]
                h_max = d["h_max"]
        T, b, fmt, src = pt.prompt_tokens, pt.block_size, pt.format, str(req.blocks_trace)
        estimator = "agentic (kvhit.estimate.agentic, compound Poisson displacement)"
        lam = req.lam0
    else:
        from kvhit.plan.planner import make_workload
        from kvhit.service.inputs import load_trace_file
        from kvhit.sim.runner import block_requests

        with translating(str(req.trace)):
            tr = load_trace_file(req.trace)
            b = tr.block_size or 128
            for e in engines:
                wl = make_workload(tr, lam0=req.lam0, engine=e, metric=req.metric, block_size=b)
                h[e] = np.asarray(wl.predict(Ns.astype(float), np.full(Ns.shape[0], wl.lam0)), float)
            h_max, lam = float(wl.h_max), float(wl.lam0)
            T = block_requests(tr, block_size=b).prompt_tokens
        fmt, src = "kvhit", str(req.trace)
        estimator = "engine-aware (kvhit.estimate.engine.estimate_engine, eq. (38)-(39))"
    feas = feasibility(T, b, Ns)
    rows = []
    for k, N in enumerate(req.N):
        ok = bool(feas.feasible[k])
        rows.append(
            TraceEstimateRow(
                **feas.row(k) | {"N": N, "feasible": ok},
                h={e: (float(v[k]) if ok and np.isfinite(v[k]) else None) for e, v in h.items()},
                h_lo={e: (float(v[k]) if ok and np.isfinite(v[k]) else None) for e, v in lo.items()},
                h_hi={e: (float(v[k]) if ok and np.isfinite(v[k]) else None) for e, v in hi.items()},
                h_mc={e: (float(v[k]) if ok and np.isfinite(v[k]) else None) for e, v in mc.items()},
                h_mc_se={e: (float(v[k]) if ok and np.isfinite(v[k]) else None) for e, v in mc_se.items()},
                h_exp={e: (float(v[k]) if ok and np.isfinite(v[k]) else None) for e, v in ex.items()},
                h_exp_se={e: (float(v[k]) if ok and np.isfinite(v[k]) else None) for e, v in ex_se.items()},
            )
        )
    return TraceEstimateResponse(
        source=src,
        format=fmt,
        estimator=estimator,
        metric=req.metric,
        lam0=lam,
        h_max=h_max if np.isfinite(h_max) else None,
        N_min=feas.N_min,
        regime=regime,
        level=level,
        rows=rows,
    )


def _sglang(req: TraceEstimateRequest) -> TraceEstimateResponse:
    """``--engine sglang``: the SGLang estimators at pools of ``--N`` tokens (``--page-size``, LRU)."""
    if "metric" in req.model_fields_set and req.metric != "tokens":
        raise InputError("--metric blocks: SGLang's hit ratio is in tokens (cached prompt tokens / prompt tokens)")
    from kvhit.estimate.sglang import estimate_sglang, sglang_accounting
    from kvhit.sim.sglang.run import radix_feasibility
    from kvhit.sim.sglang.streams import streams_from_trace
    from kvhit.workload import Trace

    Ns = np.asarray(req.N, dtype=np.int64)
    p = int(req.page_size or 1)
    bad = [int(c) for c in req.N if c % p]
    if bad:
        raise InputError(
            f"--N {bad[0]}: an SGLang pool is whole pages; {bad[0]:,} tokens is not a multiple of --page-size {p}"
        )
    regime: dict[str, Any] = {}
    if req.blocks_trace is not None and p > 1:
        raise InputError("--page-size: the SGLang estimator for --blocks-trace models page size 1 only")
    if req.replays is not None and req.blocks_trace is None:
        raise InputError("--replays: applies to --blocks-trace (it redraws the conversations' start times)")
    if req.replays is not None and req.lam0 is not None:
        raise InputError("--replays: the band redraws the trace's own start times; not with a stationary --lam0")
    level = band = None
    lo = hi = se = mc = None
    if req.blocks_trace is not None:
        from kvhit.estimate.sglang_agentic import estimate_trace_sglang
        from kvhit.sim.sglang.streams import streams_from_production

        pt = _read_blocks(req)
        with translating(str(req.blocks_trace)):
            est = estimate_trace_sglang(pt, Ns, lam0=req.lam0)
            feas = radix_feasibility(streams_from_production(pt), Ns, 1)
            if req.replays is not None:
                from kvhit.estimate.replay_band import sglang_band

                est = sglang_band(pt, Ns, replays=req.replays, seed=req.seed, estimate=est)
                level, band, lo, hi = est.level, est.band, est.h_lo, est.h_hi
                se, mc = band["mc_se"], est.h_mc
        regime["sglang"] = est.regime
        src, fmt, lam, h_max = str(req.blocks_trace), pt.format, req.lam0, float(est.h_max)
        what = "SGLang agentic (kvhit.estimate.sglang_agentic: compound Poisson displacement, whole-node recursion)"
        if req.replays is not None:
            what += f"; band: {req.replays} exact SGLang replays at redrawn start times (kvhit.estimate.replay_band)"
    else:
        with translating(str(req.trace)):
            tr = Trace.read(req.trace)
            ids = tr.conv_index()[0]
            measured = ids >= int(tr.meta.get("n_warm", 0))
            sa = sglang_accounting(tr, page_size=p, block_size=tr.block_size or 128, mask=measured)
            lam = float(req.lam0 if req.lam0 is not None else tr.meta.get("lam0", sa.acc.lam0_hat))
            est = estimate_sglang(sa, Ns, lam)
            feas = radix_feasibility(streams_from_trace(tr, block_size=tr.block_size or 128), Ns, p)
        src, fmt, h_max = str(req.trace), "kvhit", float(sa.h_max)
        what = "SGLang engine-aware (kvhit.estimate.sglang, eq. (38)-(39) with SGLang's accounting)"
    h = np.atleast_1d(est.h)
    rows = []
    for k, N in enumerate(req.N):
        r = feas.row(k)
        rows.append(
            TraceEstimateRow(
                N=N,
                feasible=r["feasible"],
                refused_request_share=r["refused_request_share"],
                refused_token_share=r["refused_token_share"],
                h={"sglang": float(h[k]) if r["feasible"] else None},
                h_lo={} if lo is None else {"sglang": float(lo[k]) if r["feasible"] else None},
                h_hi={} if hi is None else {"sglang": float(hi[k]) if r["feasible"] else None},
                h_mc={} if mc is None else {"sglang": float(mc[k]) if r["feasible"] else None},
                h_mc_se={} if se is None else {"sglang": se[k] if r["feasible"] else None},
            )
        )
    return TraceEstimateResponse(
        source=src,
        format=fmt,
        estimator=what,
        metric="tokens",
        lam0=lam,
        h_max=h_max if np.isfinite(h_max) else None,
        N_min=feas.C_min,
        unit="tokens",
        regime=regime,
        level=level,
        band=band,
        rows=rows,
    )


def agentic_lines(pt, Ns, feasible, *, metric: str = "tokens", lam0: float | None = None, seed: int = 0) -> dict:
    """The agentic estimator's curves beside the simulated ones of ``kvhit curve --blocks-trace``: one array per
    vLLM order (NaN where infeasible) labelled ``estimate: vLLM ≥ 0.24 (agentic)`` etc., its prediction band for
    one realisation of the start times as ``band low: <label>`` / ``band high: <label>``
    (:mod:`kvhit.service.agentic_band`), and its regime flags under ``estimator_regime``."""
    from kvhit.service.agentic_band import agentic_estimates
    from kvhit.sim.tracerun import ENGINE_LABELS

    Ns = np.asarray(Ns, dtype=np.int64)
    ok = np.asarray(feasible, bool)
    out: dict[str, Any] = {"estimator_regime": {}}
    ests = agentic_estimates(pt, Ns[ok], tuple(ENGINE_LABELS), metric=metric, lam0=lam0, seed=seed) if ok.any() else {}
    for e, label in ENGINE_LABELS.items():
        h, lo, hi = np.full(Ns.shape, np.nan), np.full(Ns.shape, np.nan), np.full(Ns.shape, np.nan)
        if e in ests:
            h[ok], lo[ok], hi[ok] = ests[e]["h"], ests[e]["h_lo"], ests[e]["h_hi"]
            out["estimator_regime"][e] = ests[e]["regime"] | {"band_level": ests[e]["level"]}
        name = f"estimate: {label} (agentic)"
        out[name] = h
        if np.isfinite(lo).any():
            out[f"band low: {name}"] = lo
            out[f"band high: {name}"] = hi
    return out
