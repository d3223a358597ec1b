"""``fleet simulate``: R replicas behind a router on a kvhit trace (``--trace``) or a production block-id trace
(``--blocks-trace``: WEKA, or Mooncake with sessions derived from prefix sharing) — fleet and per-replica hit
ratio, load imbalance, prefill tokens, queueing delay, rejections (:func:`kvhit.fleet.simulate.simulate_fleet`), for
every (router, R) asked.

Invariant: every router parameter given applies to the routers named (one given for a router that does not read it
is refused, never ignored); R ≥ 1; weights ≥ 0; ``--N`` is one capacity for all replicas or one per replica (then a
single R). Without ``--prefill-tokens-per-s`` requests are instantaneous (no holds: load-based routers see zero
load and fall back to their tie-breaks); with it request r holds its blocks for ``--prefill-overhead-s + T_r /
speed`` seconds (its prefill), plus ``(O_r − 1) / --decode-tokens-per-s``, both shortened by
``--hit-token-seconds`` per cached token (0 by default: cache savings do not shorten them); ``--prefill-hold`` drops
the prefill tokens from the router's load at the end of the prefill (:mod:`kvhit.fleet.timing`; each timing option
refused where it would change nothing). ``--decode-kv`` (``decode_kv``) puts each request's ``O − 1`` generated
tokens' blocks in its KV (the simulator's colocated mode; fresh ids on a block-id trace), refused without output
lengths. ``--engine-steps`` (``engine_steps``, ``--router dynamo`` on ``--blocks-trace`` only, no timing flag) runs
each replica pass by pass as Dynamo's mocker does (:mod:`kvhit.fleet.engine_fleet`); its rows have no estimate.
NOT modelled: see :mod:`kvhit.fleet.simulate`.

Estimates (docs/estimators.md §6): round-robin/random/session rows without holds get
:func:`kvhit.fleet.estimate.estimate_fleet` on the simulated routing; dynamo/llm-d/sglang/sticky rows get
:func:`kvhit.fleet.estimate.estimate_fleet_kv` (the stay model, with the run's holds, capacities, parameters and
seed). On ``--blocks-trace`` (§6, block-id traces) the expected value is the mean of ``replays`` (default
:data:`BAND_REPLAYS`; more until a standard error with ``replay_se``) exact fleet replays at redrawn start times
when they are affordable (:func:`kvhit.fleet.blocks.replays_affordable`:
any router, under the run's whole timing — holds, decode time, prefill overhead, prefill-done events, hit-token savings,
decode KV — computed from each re-timed trace's own lengths, with the run's lag, parameters and seed;
``estimate_method`` ``replay-mean``, ``estimate_se`` its Monte Carlo standard error, ``estimate_band`` the band for
one realisation from the same replays, :func:`kvhit.fleet.blocks.fleet_band_blocks`); otherwise the same rows as
above (and none under a timing option beyond ``T/speed`` holds, or ``--decode-kv``) get
:func:`kvhit.fleet.blocks.estimate_fleet_blocks` (the agentic estimator per replica on the routed sub-trace,
``agentic-per-replica``; KV-aware on the stay model's routing, ``stay-model+agentic-per-replica``) without a band.
``estimate_validated`` is false on block-id rows. A row the estimators do not model (least-loaded, Dynamo
temperature > 0, a load lag under holds, oblivious routers under holds, a block-id capacity below N_min, when the
replays are not run) has ``estimate`` None and a note saying why — never an estimate of a different setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator

from kvhit.service.base import Request, Response, check_capacity_memory
from kvhit.service.common import BlockEngine, Capacity, Seed
from kvhit.service.errors import InputError, translating
from kvhit.service.inputs import read_trace, window_for
from kvhit.service.steady import STEADY_WARNING, steady_note, steady_report

__all__ = [
    "FleetRouterFields",
    "FleetWorkloadFields",
    "FleetRequest",
    "FleetResponse",
    "fleet_simulate",
    "ROUTER_PARAMS",
    "load_fleet_workload",
    "router_params",
    "fleet_timing",
]

Arrival = Literal["sequential", "poisson", "uniform"]

RouterName = Literal["round-robin", "random", "session", "sticky", "least-loaded", "dynamo", "llm-d", "sglang"]

#: request field -> (router parameter, routers that read it)
ROUTER_PARAMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "overlap_score_weight": ("overlap_score_weight", ("dynamo",)),
    "overlap_score_credit": ("overlap_score_credit", ("dynamo",)),
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


#: A row whose busiest replica got at least this share of the measured requests is reported as collapsed.
COLLAPSED_SHARE = 0.99


class FleetRouterFields(Request):
    """Router parameters shared by ``fleet simulate|curve|plan``; each applies only to the routers that read it."""

    overlap_score_weight: NonNeg | None = Field(
        None, description="dynamo: prefill_load_scale (older name overlap_score_weight), ≥ 0; default 1."
    )
    overlap_score_credit: NonNeg | None = Field(
        None, description="dynamo: credit per cached block subtracted from the prefill blocks, ≥ 0; default 1."
    )
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


class FleetWorkloadFields(FleetRouterFields):
    """The workload (a kvhit trace or a production block-id trace) and the replicas' engine and timing."""

    blocks_trace: Path | None = Field(
        None,
        description="Production block-id trace: Mooncake .jsonl (sessions derived from prefix sharing), or WEKA "
        ".json file/directory; instead of --trace.",
    )
    sharegpt: bool = Field(
        False, description="Workload: the bundled ShareGPT trace of `kvhit trace sharegpt` (defaults), built once."
    )
    trace: Path | None = Field(
        None, description="kvhit trace (Parquet; e.g. from `kvhit trace sharegpt`); or give --blocks-trace."
    )
    arrival: Arrival = Field(
        "sequential", description="WEKA conversation starts: sequential | poisson (--rate) | uniform (--span)."
    )
    rate: float | None = Field(None, gt=0, le=1e9, description="WEKA poisson arrivals: conversations/s; > 0.")
    span: float | None = Field(None, ge=0, le=1e9, description="WEKA uniform arrivals over [0, span] s; ≥ 0.")
    engine: BlockEngine = Field("vllm", description="Engine model of every replica: vllm (≥ 0.24) | vllm-0.23.")
    block_size: int | None = Field(
        None, ge=1, le=2**16, description="Tokens per block, 1–65,536; default: the trace's (--trace only)."
    )
    prefill_tokens_per_s: float | None = Field(
        None, gt=0, le=1e12, description="Prefill speed (tokens/s), > 0, giving holds T/speed; default: none."
    )
    decode_tokens_per_s: float | None = Field(
        None,
        gt=0,
        le=1e12,
        description="Decode speed per request (tokens/s), > 0: each hold grows by (O − 1)/speed "
        "(O output tokens; the first comes from the prefill); needs --prefill-tokens-per-s; default: none "
        "(docs/peers.md, kvhit's timing options).",
    )
    prefill_overhead_s: float | None = Field(
        None,
        ge=0,
        le=1e6,
        description="Fixed seconds of every request's prefill, added to T/prefill speed (the "
        "intercept of a measured prefill-time line, e.g. 0.01087 for Dynamo's mocker); ≥ 0; needs "
        "--prefill-tokens-per-s; default 0 (docs/peers.md).",
    )
    prefill_hold: bool = Field(
        False,
        description="A request's prefill tokens leave the router's load when its prefill ends (overhead + T/prefill "
        "speed after its start), its blocks at the finish: Dynamo's MarkPrefillCompleted / Free; read by dynamo and "
        "least-loaded --load-metric prefill_tokens; needs --decode-tokens-per-s (docs/peers.md).",
    )
    hit_token_seconds: float | None = Field(
        None,
        ge=0,
        le=1e9,
        description="Seconds of prefill a cached prompt token saves: both holds shrink by this × "
        "hit tokens (known at admission); ≥ 0, at most 1/--prefill-tokens-per-s (= that: prefill of the uncached "
        "tokens only); default 0 (docs/peers.md).",
    )
    decode_kv: bool = Field(
        False,
        description="Each request's KV also holds its O − 1 generated tokens' blocks (the last output token gets "
        "none), allocated at admission and cached at the finish, counted in the router's active blocks: a colocated "
        "engine that decodes (on --blocks-trace they get fresh ids no prompt shares); needs output lengths; default: "
        "prompt KV only (docs/peers.md).",
    )
    lag: float = Field(0.0, ge=0, le=1e9, description="Load-snapshot interval seen by the router, s; ≥ 0; default 0.")
    warmup: int | None = Field(
        None, ge=0, description="--trace: warm-up conversations; ≥ 0; default: the trace's n_warm."
    )
    seed: Seed = 0

    FLAGS = {"blocks_trace": "--blocks-trace"}

    @field_validator("trace")
    @classmethod
    def _one_source(cls, v, info):
        other = info.data.get("blocks_trace")
        given = (v is not None) + (other is not None) + bool(info.data.get("sharegpt"))
        if given == 0:
            raise ValueError("required (or give --blocks-trace or --sharegpt)")
        if given > 1:
            raise ValueError("give one workload source, --trace, --blocks-trace or --sharegpt, not several")
        return v


#: exact fleet replays behind the realisation band of a block-id row (docs/estimators.md §6, block-id traces): the
#: default of ``--replays``
BAND_REPLAYS = 16
#: the most replays ``--replay-se`` may draw (within the replay budget,
#: :func:`kvhit.fleet.blocks.max_affordable_replays`)
MAX_REPLAYS = 1024


class FleetRequest(FleetWorkloadFields):
    """The inputs of ``kvhit fleet simulate``, validated: each field's description states its unit, range and
    default."""

    replicas: Annotated[list[Annotated[int, Field(ge=1, le=4096)]], Field(min_length=1, max_length=64)] = Field(
        description="Replica counts R, each in [1, 4096]; repeat or comma-separate; required."
    )
    router: Annotated[list[RouterName], Field(min_length=1, max_length=16)] = Field(
        ["round-robin"],
        description="Routers (one or more): round-robin | random | session | sticky | least-loaded | dynamo | "
        "llm-d | sglang; repeat or comma-separate; default: round-robin. session keys on the conversation id (on a "
        "Mooncake file, derived from prefix sharing over the whole file: a look-ahead no online router has, an "
        "upper bound; dynamo/llm-d/sglang are the online alternatives).",
    )
    N: Annotated[list[Capacity], Field(min_length=1, max_length=4096)] = Field(
        description="Blocks per replica: one value for all, or one per replica (with a single R); required."
    )
    estimates: bool = Field(
        True,
        description="Beside round-robin/random/session rows (no holds) and dynamo (temperature 0)/llm-d/sglang/"
        "sticky rows, the fleet estimators (docs/estimators.md §6); others get none, with a note.",
    )
    plot: Path | None = Field(None, description="Write hit ratio vs R per router to PLOT.png/.svg; default: none.")
    replays: int = Field(
        BAND_REPLAYS,
        ge=2,
        le=4096,
        description="--blocks-trace: exact fleet replays at redrawn start times behind a row's expected value and "
        "band (docs/estimators.md §6, block-id traces); integer in [2, 4096]; default 16. The expected value's Monte "
        "Carlo error is s/√K (printed as replay ±se).",
    )
    replay_se: float | None = Field(
        None,
        gt=0,
        le=0.1,
        description="--blocks-trace: after --replays, keep replaying until the expected value's standard error "
        "s/√K is at most this, or the replay budget (10⁸ block accesses, at most 1,024 replays) is spent; in (0, "
        "0.1]; default: off (exactly --replays). E.g. 0.003 for an expected value within ±0.006 (2 se).",
    )

    expected_se: float | None = Field(
        None,
        gt=0,
        lt=0.1,
        description="--blocks-trace: also the expected hit ratio over the exchangeable start law (replays that redraw "
        "the sessions' order: E[h], where the row's replay mean is E[h | the trace's order]), by at least 32 more "
        "replays until its standard error is at most this (within the replay budget); in (0, 0.1); default: off.",
    )

    engine_steps: bool = Field(
        False,
        description="Each replica is vLLM's scheduler pass by pass, timed as NVIDIA Dynamo's mocker times its engine "
        "(chunked prefill, 8,192-token budget, 256 sequences, decode blocks grown token by token, LIFO preemption; "
        "the mocker's polynomial pass times) behind --router dynamo, whose load follows the passes: no hold or "
        "timing flag applies; needs --blocks-trace with output lengths (kvhit.fleet.engine_fleet, docs/peers.md).",
    )

    FLAGS = {"N": "--N", "replicas": "--replicas", "router": "--router", "blocks_trace": "--blocks-trace",
             "replay_se": "--replay-se", "engine_steps": "--engine-steps",
             "expected_se": "--expected-se"}  # fmt: skip


class FleetResponse(Response):
    """The answer of ``kvhit fleet simulate`` (``--json`` prints it; strict JSON, ``null`` where a number is
    undefined)."""

    trace: str
    block_size: int
    engine: str
    rows: list[dict[str, Any]] = Field(description="One row per (router, R): fleet metrics.")
    per_replica: list[dict[str, Any]] = Field(description="Per (router, R, replica): requests, hit ratio, prefill.")
    notes: list[str] = Field(default_factory=list)
    figure: list[str] | None = Field(None, description="Figure files written.")
    timing: dict[str, Any] = Field(
        default_factory=dict, description="The timing options of the holds (speeds, prefill_hold, hit_token_seconds)."
    )
    stationarity: dict[str, Any] | None = Field(
        None,
        description="Whether the measured window reached steady state (active conversations over time, "
        "kvhit.workload.stationarity); null where not judged (a production block-id trace).",
    )


#: routers whose load signal includes outstanding prefill tokens (the ones ``--prefill-hold`` changes)
PREFILL_LOAD_ROUTERS = ("dynamo", "least-loaded --load-metric prefill_tokens")


def fleet_timing(req: FleetWorkloadFields, routers: list[str], stream=None):
    """The run's :class:`kvhit.fleet.timing.FleetTiming` from the request, or a one-line refusal naming the flag:
    a timing option without the speed it modifies, ``--prefill-hold`` for routers none of which reads prefill-token
    load (it would change nothing), ``--hit-token-seconds`` above the prefill time of a token, a decode speed on a
    stream without output lengths."""
    from kvhit.fleet.timing import FleetTiming

    p = req.prefill_tokens_per_s
    for fld in ("decode_tokens_per_s", "prefill_hold", "hit_token_seconds", "prefill_overhead_s"):
        if getattr(req, fld) not in (None, False) and p is None:
            raise InputError(f"{req.flag(fld)}: needs --prefill-tokens-per-s (a timing option of the holds it gives)")
    if req.prefill_hold:
        if req.decode_tokens_per_s is None:
            raise InputError(
                "--prefill-hold: needs --decode-tokens-per-s (without decode time a request's prefill ends at its "
                "finish, so it would change nothing)"
            )
        readers = [r for r in routers if r == "dynamo" or (r == "least-loaded" and req.load_metric == "prefill_tokens")]
        if not readers:
            raise InputError(
                f"--prefill-hold: only {' and '.join(PREFILL_LOAD_ROUTERS)} read prefill-token load; not --router "
                f"{','.join(routers)} (it would change nothing)"
            )
    hts = req.hit_token_seconds or 0.0
    if p is not None and hts > 1.0 / p:
        raise InputError(
            f"--hit-token-seconds: at most 1/--prefill-tokens-per-s = {1.0 / p:g} s (a cached token cannot save more "
            f"prefill than it costs); got {hts:g}"
        )
    for fld in ("decode_tokens_per_s", "decode_kv"):
        if getattr(req, fld) not in (None, False) and stream is not None and stream.output_tokens is None:
            raise InputError(
                f"{req.flag(fld)}: this workload has no output lengths (a kvhit trace without response_tokens, or "
                "streams resampled at --lam0)"
            )
    with translating("timing"):
        return FleetTiming(
            p, req.decode_tokens_per_s, bool(req.prefill_hold), float(hts), req.prefill_overhead_s or 0.0,
            bool(req.decode_kv),
        )  # fmt: skip


def timing_echo(t) -> dict[str, Any]:
    """The timing options as the answer echoes them (JSON)."""
    return {
        "prefill_tokens_per_s": t.prefill_tokens_per_s,
        "decode_tokens_per_s": t.decode_tokens_per_s,
        "prefill_hold": t.prefill_hold,
        "hit_token_seconds": t.hit_token_seconds,
        "prefill_overhead_s": t.prefill_overhead_s,
        "decode_kv": t.decode_kv,
    }


def router_params(req: FleetRouterFields, routers: list[str]) -> dict[str, dict]:
    """Per router, the parameters given; one given for none of ``routers`` is refused (it would be ignored)."""
    out: dict[str, dict] = {r: {} for r in routers}
    for fld, (name, readers) in ROUTER_PARAMS.items():
        v = getattr(req, fld)
        if v is None:
            continue
        used = [r for r in routers if r in readers]
        if not used:
            raise InputError(
                f"{req.flag(fld)}: applies to {' / '.join(readers)}, not to --router {','.join(routers)} "
                "(it would be ignored)"
            )
        for r in used:
            out[r][name] = v
    return out


@dataclass
class FleetWorkload:
    """A fleet command's workload: the replayed stream (measured requests marked) and what it came from."""

    label: str
    stream: Any  #: kvhit.fleet.plan.FleetStream
    source: Any  #: the Trace or ProductionTrace (for resampling)
    tr: Any = None  #: the kvhit Trace (the estimator needs it), else None
    conv_rows: Any = None
    lam0: float | None = None
    notes: list[str] = field(default_factory=list)
    stationarity: dict | None = None  #: the measured window's report (a kvhit trace), else None


def load_fleet_workload(req: FleetWorkloadFields) -> FleetWorkload:
    """Read ``--trace`` or ``--blocks-trace`` into a replay stream; sources and their flags checked here."""
    from kvhit.fleet.plan import FleetStream

    if req.blocks_trace is not None:
        from kvhit.service.inputs import production_notes, read_blocks_trace

        for name in ("block_size", "warmup"):
            if getattr(req, name) is not None:
                raise InputError(f"{req.flag(name)}: applies to --trace, not to --blocks-trace (it would be ignored)")
        pt = read_blocks_trace(req.blocks_trace, req.arrival, req.rate, req.span, req.seed)
        n = pt.n_requests
        conv = np.arange(n, dtype=np.int64) if pt.session is None else np.asarray(pt.session, np.int64)
        times = np.asarray(pt.time, np.float64)
        measured = np.ones(n, bool)
        notes = production_notes(pt)
        if pt.format == "mooncake":
            notes.append(
                "Mooncake has no session ids: conversations are derived from prefix sharing over the whole file "
                f"({pt.session_source}) — a look-ahead no online router has, so session routing here is an upper "
                "bound; the online alternative is a KV-aware router (--router dynamo/llm-d/sglang)"
            )
        notes.append("a block-id trace is measured from an empty cache (no warm-up)")
        span = float(times.max() - times.min()) if n else 0.0
        brq = pt.to_block_requests(colocated=bool(req.decode_kv))  # decode KV: fresh ids after the prompt's
        st = FleetStream(
            np.asarray(pt.prompt_tokens, np.int64), np.asarray(brq.hash_offsets, np.int64),
            np.asarray(brq.hashes, np.int64), conv, times, measured, int(pt.block_size), span,
            np.asarray(pt.output_tokens, np.int64), bool(req.decode_kv),
        )  # fmt: skip
        label = "WEKA" if pt.format == "weka" else Path(pt.files[0]).name
        return FleetWorkload(f"{label} ({len(pt.files)} file(s), {n:,} requests)", st, pt, notes=notes)
    if req.arrival != "sequential" or req.rate is not None or req.span is not None:
        raise InputError("--arrival/--rate/--span: apply to --blocks-trace (WEKA), not to --trace")
    from kvhit.sim.runner import block_requests

    if req.sharegpt:
        from kvhit.service.traces import bundled_sharegpt

        with translating("ShareGPT"):
            tr = bundled_sharegpt(req.block_size)
        where = "ShareGPT"
    else:
        tr = read_trace(req.trace)
        where = str(req.trace)
    window = window_for(tr, req.warmup, None, where)
    mask = window.mask(tr)
    ca = np.asarray(tr["conv_arrival"], float)
    conv_rows = (ca >= window.start) & (ca <= window.end)  # the estimator's measured conversations
    colo = bool(req.decode_kv) and "response_tokens" in tr.cols  # without: refused by fleet_timing
    with translating(f"--trace {where}"):
        rq = block_requests(tr, block_size=req.block_size, colocated=colo)
    times = np.asarray(tr["time"], np.float64)
    order = np.argsort(times, kind="stable")
    if not np.array_equal(order, np.arange(times.size)):
        raise InputError(f"--trace {where}: rows are not in arrival-time order")
    tm = times[mask]
    span = float(tm.max() - tm.min()) if tm.size else 0.0
    st = FleetStream(
        np.asarray(rq.prompt_tokens, np.int64), np.asarray(rq.hash_offsets, np.int64),
        np.asarray(rq.hashes, np.int64), tr.dense_conv().astype(np.int64), times, np.asarray(mask, bool),
        int(rq.block_size), span,
        np.asarray(tr["response_tokens"], np.int64) if "response_tokens" in tr.cols else None, colo,
    )  # fmt: skip
    lam0 = float(tr.meta["lam0"]) if "lam0" in tr.meta else None
    from kvhit.service.steady import steady_note, steady_report

    rep = steady_report(tr, np.asarray(mask, bool))
    label = "ShareGPT (bundled)" if req.sharegpt else Path(req.trace).name
    return FleetWorkload(label, st, tr, tr=tr, conv_rows=conv_rows, lam0=lam0, notes=steady_note(rep), stationarity=rep)


#: routers whose rows get :func:`kvhit.fleet.estimate.estimate_fleet` on the simulated routing (no holds)
OBLIVIOUS_ESTIMATED = ("round-robin", "random", "session")
#: routers whose rows get :func:`kvhit.fleet.estimate.estimate_fleet_kv` (its stay model; Dynamo at temperature 0)
KV_ESTIMATED = ("dynamo", "llm-d", "sglang", "sticky")


def measured_rate(times: np.ndarray, mask: np.ndarray) -> float | None:
    """Measured requests per second (the rows ``mask`` counts over their time span): the load rate of the KV
    estimator's M/G/∞ snapshots, as in ``benchmarks/fleet_accuracy.py --only kv``; None (the library's default)
    when the span is empty."""
    tm = np.asarray(times, float)[np.asarray(mask, bool)]
    span = float(tm.max() - tm.min()) if tm.size else 0.0
    return float(tm.size / span) if span > 0 else None


def _row_estimate(req: FleetRequest, wl: FleetWorkload, name: str, params: dict, res, Ns, hold, tmg):
    """(estimate, None) for a row the fleet estimators cover, else (None, the reason, one line for the notes).

    Oblivious routers: :func:`~kvhit.fleet.estimate.estimate_fleet` on the routing the simulator drew, without
    holds only. KV-aware routers and sticky: :func:`~kvhit.fleet.estimate.estimate_fleet_kv` (its own routing
    from the stay model; holds, capacities, router parameters and seed as given); not with a load-snapshot lag
    under holds or Dynamo's softmax (temperature > 0), which the model does not have."""
    st = wl.stream
    if wl.tr is None:
        return _row_estimate_blocks(req, wl, name, params, res, Ns, hold, tmg)
    kw = dict(engine=req.engine, window=st.measured, lam0=wl.lam0, block_size=st.block_size)
    if req.decode_kv:
        return None, (
            f"no estimate for {name} with --decode-kv: the fleet estimators on a kvhit trace model the prompt's KV "
            "only (on --blocks-trace the exact replays model it)"
        )
    if name in OBLIVIOUS_ESTIMATED:
        if hold is not None:
            return None, (
                "no estimate for round-robin/random/session with --prefill-tokens-per-s: the oblivious fleet "
                "estimator is measured without holds only (docs/estimators.md §6)"
            )
        from kvhit.fleet.estimate import estimate_fleet

        with translating("estimate"):  # the rows the simulated ratio counts (docs/estimators.md §6)
            return estimate_fleet(wl.tr, res.replica, Ns, **kw), None
    if name not in KV_ESTIMATED:
        return None, f"no estimate for {name}: no fleet estimator models it"
    why = _kv_unmodelled(req, name, params, hold)
    if why is not None:
        return None, why
    from kvhit.fleet.estimate import estimate_fleet_kv

    with translating("estimate"):
        est = estimate_fleet_kv(
            wl.tr, name, Ns, hold=hold, params=params, rate=measured_rate(st.times, st.measured), seed=req.seed, **kw
        )
    return est, None


def _kv_unmodelled(req: FleetRequest, name: str, params: dict, hold) -> str | None:
    """Why the KV-aware estimator has no number for this row (token and block-id traces alike), or None."""
    if req.prefill_hold or req.hit_token_seconds:
        return (
            f"no estimate for {name} with --prefill-hold or --hit-token-seconds: the KV-aware estimator does not model "
            "the prefill-done event or holds shortened by cache hits"
        )
    if name == "dynamo" and float(params.get("temperature", 0.0)) != 0.0:
        return (
            "no estimate for dynamo with --temperature > 0: the KV-aware estimator models Dynamo's argmin "
            "(temperature 0) only"
        )
    if req.lag > 0 and hold is not None:
        return f"no estimate for {name} with --lag > 0: the KV-aware estimator does not model lagged load snapshots"
    return None


#: the timing options the replays model (each replay is the simulator under the run's timing) and the per-replica
#: estimators do not
TIMING_FLAGS = ("decode_tokens_per_s", "prefill_hold", "hit_token_seconds", "prefill_overhead_s", "decode_kv")


def _row_estimate_blocks(req: FleetRequest, wl: FleetWorkload, name: str, params: dict, res, Ns, hold, tmg):
    """A ``--blocks-trace`` row: ``(estimate, None)`` with the estimate a dict (``h``, ``method``, ``se``, the band
    for one realisation of the start times where it applies, ``validated``), or ``(None, reason)``.

    The replay rule (:func:`kvhit.fleet.blocks.replays_affordable`): when ``req.replays`` (default
    :data:`BAND_REPLAYS`; more, until ``req.replay_se`` is reached, within the budget) exact fleet replays at redrawn
    start times cost at most :data:`kvhit.fleet.blocks.REPLAY_MAX_ACCESSES` block accesses, the expected value is
    their mean (``method`` ``replay-mean``, ``se`` its Monte Carlo standard error) and the band comes from
    the same replays — for every router the simulator runs and every timing option (the replays are the simulator
    itself under the run's :class:`~kvhit.fleet.timing.FleetTiming` ``tmg``, lag, parameters and seed). Otherwise
    the per-replica estimator answers (oblivious routers: the simulated routing; KV-aware: the stay model's routing,
    :mod:`kvhit.fleet.blocks`), without a band, and not under :data:`TIMING_FLAGS` (it holds ``T/speed`` at most)."""
    from kvhit.fleet.blocks import (
        METHOD_AGENTIC,
        METHOD_STAY,
        estimate_fleet_blocks,
        fleet_band_blocks,
        kv_routes_blocks,
        max_affordable_replays,
        replays_affordable,
        stay_probabilities_blocks,
    )

    pt = wl.source
    st = wl.stream
    if pt.session is not None and replays_affordable(pt, req.replays):
        K_max = (
            max(max_affordable_replays(pt, cap=MAX_REPLAYS), req.replays)
            if req.replay_se or req.expected_se
            else req.replays
        )
        with translating("estimate"):
            band = fleet_band_blocks(
                pt, name, Ns, engine=req.engine, router_params=params, lag=req.lag, replays=req.replays,
                seed=req.seed, timing=tmg, se_target=req.replay_se, max_replays=K_max, expected_se=req.expected_se,
            )  # fmt: skip
        if req.replay_se is not None and band["h_se"] > req.replay_se:
            band["notes"].append(
                f"--replay-se {req.replay_se:g} not reached: standard error {band['h_se']:.4f} after "
                f"{band['replays']} replays (the replay budget)"
            )
        return {"h": band["h_mc"], "method": band["method"], "se": band["h_se"], "validated": False, "band": band}, None
    extra = [f for f in TIMING_FLAGS if getattr(req, f)]
    if extra:  # the per-replica estimators hold T/speed at most: they would answer a different setting
        why = "no session ids" if pt.session is None else "too many block accesses for the replays"
        return None, (
            f"no estimate for {name} with {', '.join(req.flag(f) for f in extra)}: {why}, and the per-replica "
            "block-id fleet estimators model holds of T / --prefill-tokens-per-s and the prompt's KV only"
        )
    if name in OBLIVIOUS_ESTIMATED:
        if hold is not None:
            return None, (
                "no estimate for round-robin/random/session with --prefill-tokens-per-s: the oblivious fleet "
                "estimator is measured without holds only (docs/estimators.md §6)"
            )
        rep = res.replica
        method = METHOD_AGENTIC
    elif name in KV_ESTIMATED:
        why = _kv_unmodelled(req, name, params, hold)
        if why is not None:
            return None, why
        with translating("estimate"):
            q, prev = stay_probabilities_blocks(
                pt, name, len(Ns), hold=hold, Ns=Ns, params=params, rate=measured_rate(st.times, st.measured),
                seed=req.seed,
            )  # fmt: skip
            rep = kv_routes_blocks(prev, q, len(Ns), seed=req.seed + 1)
        method = METHOD_STAY
    else:
        return None, f"no estimate for {name}: no fleet estimator models it"
    with translating("estimate"):
        e = estimate_fleet_blocks(pt, rep, Ns, engine=req.engine)
    if not e.feasible:
        return None, (
            "no estimate below N_min (a replica's largest prompt does not fit: the simulator drops refused requests "
            "from its ratio, the estimator counts them as misses)"
        )
    return {"h": e.h, "method": method, "se": None, "validated": False, "band": None}, None


def _simulate(st, conv, times, Ns, name, params, req, hold, ph, hts):
    """One (router, R) run of :func:`kvhit.fleet.simulate.simulate_fleet` under the request's options."""
    from kvhit.fleet.simulate import simulate_fleet

    return simulate_fleet(
        st.prompt_tokens, st.hash_offsets, st.hashes, conv, Ns=Ns, block_size=st.block_size, router=name,
        router_params=params[name], engine=req.engine, times=times, hold=hold, seed=req.seed, lag=req.lag,
        prefill_hold=ph, hit_token_seconds=hts, **st.simulate_kw,
    )  # fmt: skip


#: flags --engine-steps replaces (the engine's passes time every request) and their defaults
ENGINE_STEPS_OFF = {"prefill_tokens_per_s": None, "decode_tokens_per_s": None, "prefill_hold": False,
                    "hit_token_seconds": None, "prefill_overhead_s": None, "decode_kv": False}  # fmt: skip


def _check_engine_steps(req: FleetRequest) -> None:
    """``--engine-steps``: the Dynamo router only, a block-id trace, the vLLM engine, no hold, timing or lag flag."""
    if list(req.router) != ["dynamo"]:
        raise InputError(f"--engine-steps: models the fleet behind --router dynamo only, not {','.join(req.router)}")
    if req.blocks_trace is None:
        raise InputError("--engine-steps: needs --blocks-trace (a Mooncake or WEKA file with output lengths)")
    if req.engine != "vllm":
        raise InputError(f"--engine-steps: the engine is vLLM's scheduler; not --engine {req.engine}")
    if req.lag:
        raise InputError("--lag: does not apply with --engine-steps (the router sees the passes as they happen)")
    for fld, off in ENGINE_STEPS_OFF.items():
        if getattr(req, fld) != off:
            raise InputError(
                f"{req.flag(fld)}: does not apply with --engine-steps (the engine's passes time every request and "
                "hold its decode blocks)"
            )


def fleet_simulate(req: FleetRequest, progress=None) -> FleetResponse:
    """``kvhit fleet simulate``: cross-field checks and output paths first, then the library; refused input raises
    :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    from kvhit.fleet.blocks import METHOD_REPLAY

    if len(req.N) > 1 and (len(req.replicas) != 1 or req.replicas[0] != len(req.N)):
        raise InputError(
            f"--N: {len(req.N)} capacities given; one per replica needs a single --replicas {len(req.N)} "
            f"(got --replicas {','.join(map(str, req.replicas))})"
        )
    for N in req.N:
        check_capacity_memory(N * (req.replicas[0] if len(req.N) == 1 else 1), "--N")
    params = router_params(req, list(req.router))
    if req.expected_se is not None and req.blocks_trace is None:
        raise InputError("--expected-se: applies to --blocks-trace (the replays redraw the trace's start times)")
    if req.engine_steps:
        _check_engine_steps(req)
    fleet_timing(req, list(req.router))  # refused before the workload is read
    if req.plot is not None:
        from kvhit.service.io import check_output_file

        check_output_file(str(req.plot) + ".png", "--plot")
    wl = load_fleet_workload(req)
    st = wl.stream
    mask, conv, times = st.measured, st.conv, st.times
    if req.engine_steps and st.output_tokens is None:
        raise InputError("--engine-steps: this trace has no output lengths (the engine decodes them)")
    # the loader judged a kvhit trace's window (its notes carry the verdict); a block-id trace is not judged
    steady = wl.stationarity
    steady_notes: list[str] = []
    if steady is None and wl.tr is not None:
        steady = steady_report(wl.tr, mask)
        steady_notes = steady_note(steady)
    tmg = fleet_timing(req, list(req.router), st)
    hold, ph, hts = tmg.holds(st.prompt_tokens, st.output_tokens)
    #: Mooncake sessions are derived from prefix sharing over the whole file: session routing sees the future
    lookahead = getattr(wl.source, "format", None) == "mooncake"
    rows, per = [], []
    est_notes: list[str] = []
    queued: list[str] = []  # estimated rows whose run queued or rejected requests
    collapses: list[str] = []  # rows whose router sent (nearly) everything to one replica
    total = len(req.router) * len(req.replicas)
    done = 0
    for name in req.router:
        for R in req.replicas:
            if progress:
                progress(done, total, f"{name}, R = {R}")
            Ns = list(req.N) if len(req.N) > 1 else [req.N[0]] * R
            if req.engine_steps:
                from kvhit.fleet.engine_fleet import simulate_engine_fleet

                with translating("--engine-steps"):
                    res = simulate_engine_fleet(
                        st.prompt_tokens, st.output_tokens, st.hash_offsets, st.hashes, times, Ns=Ns,
                        block_size=st.block_size, seed=req.seed, router_params=params[name],
                    ).as_fleet_result()  # fmt: skip
            else:
                with translating("router"):
                    res = _simulate(st, conv, times, Ns, name, params, req, hold, ph, hts)
            s = res.summary(mask)
            est = band = None
            validated = method = se = None
            if req.estimates and req.engine_steps:
                why = "no estimate with --engine-steps: the fleet estimators do not model the engine's passes"
                if why not in est_notes:
                    est_notes.append(why)
            elif req.estimates:
                est, why = _row_estimate(req, wl, name, params[name], res, Ns, hold, tmg)
                if isinstance(est, dict):  # a block-id row: the point, its method, band and the validation flag
                    est, method, se, band, validated = est["h"], est["method"], est["se"], est["band"], est["validated"]
                if why is not None and why not in est_notes:
                    est_notes.append(why)
                # the replays are the simulator itself: they queue and reject as the run does
                if est is not None and method != METHOD_REPLAY and (s["rejected"] > 0 or s["mean_wait"] > 0):
                    queued.append(f"{name} R = {R}")
            reps = res.per_replica(mask)
            n_req = [p["requests"] for p in reps]
            share = max(n_req) / sum(n_req) if sum(n_req) else float("nan")
            collapsed = R > 1 and share >= COLLAPSED_SHARE
            if collapsed:
                collapses.append(f"{name} at R = {R} sent {100 * share:.1f}% of the measured requests to one replica")
            rows.append(
                {
                    **s,
                    "session_lookahead": name == "session" and lookahead,
                    "estimate": est,
                    "estimate_band": band,
                    "estimate_validated": validated,
                    "estimate_method": method,
                    "estimate_se": se,
                    "N_total": int(sum(Ns)),
                    "params": params[name],
                    "busiest_replica_share": share,
                    "collapsed": collapsed,
                }
            )
            per += [{"router": name, "replicas": R, **p} for p in reps]
            done += 1
    figure = None
    if req.plot is not None:
        from kvhit.plots.fleet import plot_fleet

        warn = None if steady is None or steady["stationary"] else STEADY_WARNING
        figure = [
            str(p) for p in plot_fleet(rows, req.plot, title=f"{wl.label}, N = {req.N[0]:,} blocks", warning=warn)
        ]
    notes = steady_notes + list(wl.notes)
    if hold is None and not req.engine_steps:
        notes.append("no --prefill-tokens-per-s: requests are instantaneous, so load-based routers see no load")
    notes += est_notes
    if collapses:
        notes.append("collapsed onto one replica (the fleet is one cache, the others idle): " + "; ".join(collapses))
    if queued:
        notes.append(
            "the estimates do not model queueing or rejected requests, which these rows have: " + ", ".join(queued)
        )
    return FleetResponse(
        trace="ShareGPT" if req.sharegpt else str(req.trace if req.trace is not None else req.blocks_trace),
        block_size=st.block_size,
        engine=req.engine,
        rows=rows,
        per_replica=per,
        notes=notes,
        figure=figure,
        timing={**timing_echo(tmg), "engine_steps": bool(req.engine_steps)},
        stationarity=steady,
    )
