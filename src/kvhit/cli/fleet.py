"""``kvhit fleet ...``: R replicas behind a router."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from kvhit.cli._common import (
    JsonOpt,
    SeedOpt,
    _call,
    _fail,
    _fmt,
    _help,
    _print_json,
    _print_notes,
    _split,
    _table,
    app,
    console,
    svc,
)

# ---------------------------------------------------------------------------------------------------------------
# kvhit fleet simulate
# ---------------------------------------------------------------------------------------------------------------

fleet_app = typer.Typer(no_args_is_help=True, help="R replicas behind a router (exact simulation).")
app.add_typer(fleet_app, name="fleet")
FR = svc.FleetRequest


def _fopt(field: str, *flags: str, model: type = FR) -> Any:
    return typer.Option(*flags, help=_help(model, field))


# router parameters and workload options shared by simulate / curve / plan (help from the request fields)
RF = svc.FleetRequest
TraceO = Annotated[Path | None, _fopt("trace", "--trace")]
BlocksO = Annotated[Path | None, _fopt("blocks_trace", "--blocks-trace")]
ArrivalO = Annotated[str, _fopt("arrival", "--arrival")]
RateO = Annotated[float | None, _fopt("rate", "--rate")]
SpanO = Annotated[float | None, _fopt("span", "--span")]
EngineO = Annotated[str, _fopt("engine", "--engine")]
BlockSizeO = Annotated[int | None, _fopt("block_size", "--block-size")]
PrefillO = Annotated[float | None, _fopt("prefill_tokens_per_s", "--prefill-tokens-per-s")]
LagO = Annotated[float, _fopt("lag", "--lag")]
DecodeO = Annotated[float | None, _fopt("decode_tokens_per_s", "--decode-tokens-per-s")]
PrefillHoldO = Annotated[bool, _fopt("prefill_hold", "--prefill-hold")]
HitTokO = Annotated[float | None, _fopt("hit_token_seconds", "--hit-token-seconds")]
OverheadO = Annotated[float | None, _fopt("prefill_overhead_s", "--prefill-overhead-s")]
DecodeKvO = Annotated[bool, _fopt("decode_kv", "--decode-kv")]
WarmupO = Annotated[int | None, _fopt("warmup", "--warmup")]
OswO = Annotated[float | None, _fopt("overlap_score_weight", "--overlap-score-weight", "--prefill-load-scale")]
OscO = Annotated[float | None, _fopt("overlap_score_credit", "--overlap-score-credit")]
TempO = Annotated[float | None, _fopt("temperature", "--temperature")]
ReqWO = Annotated[float | None, _fopt("request_weight", "--request-weight")]
KvTtlO = Annotated[float | None, _fopt("kv_ttl", "--kv-ttl")]
SessTtlO = Annotated[float | None, _fopt("session_ttl", "--session-ttl")]
PrefWO = Annotated[float | None, _fopt("prefix_weight", "--prefix-weight")]
QueueWO = Annotated[float | None, _fopt("queue_weight", "--queue-weight")]
KvWO = Annotated[float | None, _fopt("kv_weight", "--kv-weight")]
CacheThO = Annotated[float | None, _fopt("cache_threshold", "--cache-threshold")]
BalAbsO = Annotated[float | None, _fopt("balance_abs_threshold", "--balance-abs-threshold")]
BalRelO = Annotated[float | None, _fopt("balance_rel_threshold", "--balance-rel-threshold")]
LoadMetricO = Annotated[str | None, _fopt("load_metric", "--load-metric")]
KvModeO = Annotated[str | None, _fopt("kv_mode", "--kv-mode")]


def _routers(values: list[str] | None) -> list[str]:
    """``--router`` values; an empty one (``--router ""``) is refused, never read as the default."""
    if values is not None and not _split(values):
        _fail("--router: empty; name one or more routers (see --help)")
    return _split(values)


def _router_values(**kw: Any) -> dict[str, Any]:
    """Map the CLI's shared option names onto the request fields."""
    ren = {
        "balance_abs": "balance_abs_threshold",
        "balance_rel": "balance_rel_threshold",
        "prefill": "prefill_tokens_per_s",
        "blocks": "blocks_trace",
    }
    return {ren.get(k, k): v for k, v in kw.items()}


def _band(b: dict | None) -> str:
    """``lo–hi`` of a block-id row's realisation band (``*``: not validated), or ``-``."""
    if not b:
        return "–"
    return f"{_fmt(b['h_lo'])}–{_fmt(b['h_hi'])}" + ("" if b.get("validated") else "*")


def _method(r: dict) -> str:
    """Which answered a row's estimate: ``replay ±se`` (the mean of exact fleet replays), ``agentic``, ``stay``."""
    m = r.get("estimate_method")
    if r.get("estimate") is None or not m:
        return "–"
    if m == "replay-mean":
        return f"replay ±{r['estimate_se']:.4f}"
    return "stay" if m.startswith("stay") else "agentic"


@fleet_app.command("simulate")
def fleet_simulate(
    replicas: Annotated[list[str], _fopt("replicas", "--replicas")],
    trace: TraceO = None,
    blocks: BlocksO = None,
    arrival: ArrivalO = "sequential",
    rate: RateO = None,
    span: SpanO = None,
    N: Annotated[
        list[str] | None,
        typer.Option(
            "--N",
            "-N",
            help="KV capacity of EACH replica in blocks (one value for all replicas), or one value per replica "
            "with a single --replicas; integers in [1, 2^40]; required.",
        ),
    ] = None,
    router: Annotated[list[str] | None, _fopt("router", "--router")] = None,
    engine: EngineO = "vllm",
    block_size: BlockSizeO = None,
    prefill: PrefillO = None,
    decode_tokens_per_s: DecodeO = None,
    prefill_hold: PrefillHoldO = False,
    hit_token_seconds: HitTokO = None,
    prefill_overhead_s: OverheadO = None,
    decode_kv: DecodeKvO = False,
    lag: LagO = 0.0,
    warmup: WarmupO = None,
    seed: SeedOpt = 0,
    overlap_score_weight: OswO = None,
    overlap_score_credit: OscO = None,
    temperature: TempO = None,
    request_weight: ReqWO = None,
    kv_ttl: KvTtlO = None,
    session_ttl: SessTtlO = None,
    prefix_weight: PrefWO = None,
    queue_weight: QueueWO = None,
    kv_weight: KvWO = None,
    cache_threshold: CacheThO = None,
    balance_abs: BalAbsO = None,
    balance_rel: BalRelO = None,
    load_metric: LoadMetricO = None,
    kv_mode: KvModeO = None,
    no_estimates: Annotated[bool, typer.Option("--no-estimates", help="Skip the fleet estimator.")] = False,
    replays: Annotated[int, _fopt("replays", "--replays")] = FR.model_fields["replays"].default,
    replay_se: Annotated[float | None, _fopt("replay_se", "--replay-se")] = None,
    expected_se: Annotated[float | None, _fopt("expected_se", "--expected-se")] = None,
    plot: Annotated[Path | None, _fopt("plot", "--plot")] = None,
    engine_steps: Annotated[bool, _fopt("engine_steps", "--engine-steps")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Fleet token hit ratio, per-replica load and prefill, for each router and replica count."""
    kw = dict(locals())
    for k in ("replicas", "N", "router", "no_estimates", "as_json"):
        kw.pop(k)
    res = _call(
        svc.fleet_simulate,
        FR,
        _progress_label="fleet",
        replicas=_split(replicas),
        N=_split(N),
        router=_routers(router) or ["round-robin"],
        estimates=not no_estimates,
        **_router_values(**kw),
    )
    if as_json:
        _print_json(res)
        return
    cols = ["router", "R", "token h", "estimate", "method", "band 90%", "imbalance req", "imbalance prefill",
            "prefill tokens", "mean wait s", "rejected"]  # fmt: skip
    rows = [
        [
            r["router"]
            + (" (look-ahead sessions: upper bound)" if r.get("session_lookahead") else "")
            + (" (collapsed: one replica)" if r.get("collapsed") else ""),
            _fmt(r["replicas"]),
            _fmt(r["token_hit_ratio"]),
            _fmt(r["estimate"]),
            _method(r),
            _band(r.get("estimate_band")),
            _fmt(r["imbalance_requests"], 3),
            _fmt(r["imbalance_prefill_tokens"], 3),
            _fmt(r["prefill_tokens"]),
            _fmt(r["mean_wait"], 3),
            _fmt(r["rejected"]),
        ]
        for r in res.rows
    ]
    _table(f"fleet on {res.trace} — engine {res.engine}, block size {res.block_size}", cols, rows)
    if any(r.get("estimate_band") for r in res.rows):
        console.print(
            Text(
                "note: band 90% = one realisation of the start times (exact fleet replays, docs/estimators.md §6, "
                "block-id traces); replay ±se = the mean of those replays and its standard error; * = not validated",
                style="italic",
            )
        )
        for r in res.rows:  # a --replay-se target the replay budget stopped short of
            b = r.get("estimate_band") or {}
            for n in b.get("notes", []):
                if n.startswith(("--replay-se", "the expected value h_exp")):
                    console.print(Text(f"note: {r['router']}, R = {r['replicas']}: {n}", style="italic"))
            if b.get("h_exp") is not None:
                console.print(
                    f"{r['router']}, R = {r['replicas']}: expected over the start law (order redrawn, "
                    f"{b['exp_replays']} replays) {b['h_exp']:.4f} ± {b['h_exp_se']:.4f}; for this trace's order "
                    f"{b['h_mc']:.4f} ± {b['h_se']:.4f}"
                )
    _print_notes(res.notes, style="italic")
    if res.figure:
        console.print("wrote " + ", ".join(res.figure))


# ---------------------------------------------------------------------------------------------------------------
# kvhit fleet plan / curve
# ---------------------------------------------------------------------------------------------------------------

PR = svc.FleetPlanRequest
CR = svc.FleetCurveRequest
ModelO = Annotated[str, _fopt("model", "--model", model=PR)]
GpuO = Annotated[str | None, _fopt("accelerator", "--gpu", "--accelerator", model=PR)]
KvDtypeO = Annotated[str, _fopt("kv_dtype", "--kv-dtype", model=PR)]
TpO = Annotated[int, _fopt("tp", "--tp", model=PR)]
UtilO = Annotated[float | None, _fopt("gpu_memory_utilization", "--gpu-memory-utilization", model=PR)]
MfuO = Annotated[float, _fopt("mfu", "--mfu", model=PR)]
PeakO = Annotated[float | None, _fopt("peak_tflops", "--peak-tflops", model=PR)]
ActiveO = Annotated[int | None, _fopt("active_params", "--active-params", model=PR)]


def _gpus(x: Any) -> str:
    return _fmt(x, 3)


@fleet_app.command("plan")
def fleet_plan(
    target: Annotated[float, _fopt("target", "--target", model=PR)],
    trace: TraceO = None,
    blocks: BlocksO = None,
    arrival: ArrivalO = "sequential",
    rate: RateO = None,
    span: SpanO = None,
    router: Annotated[list[str] | None, _fopt("router", "--router", model=PR)] = None,
    vary: Annotated[str, _fopt("vary", "--vary", model=PR)] = "replicas",
    N: Annotated[int | None, _fopt("N", "--N", model=PR)] = None,
    kv_gb: Annotated[float | None, _fopt("kv_gb", "--kv-gb", model=PR)] = None,
    replicas: Annotated[int | None, _fopt("replicas", "--replicas", model=PR)] = None,
    max_replicas: Annotated[int, _fopt("max_replicas", "--max-replicas", model=PR)] = 64,
    rtol: Annotated[float, _fopt("rtol", "--rtol", model=PR)] = 0.02,
    lam0: Annotated[float | None, _fopt("lam0", "--lam0", model=PR)] = None,
    replications: Annotated[int | None, _fopt("replications", "--replications", "-r", model=PR)] = None,
    conversations: Annotated[int | None, _fopt("conversations", "--conversations", model=PR)] = None,
    model: ModelO = "qwen3-8b",
    accelerator: GpuO = None,
    kv_dtype: KvDtypeO = "bf16",
    tp: TpO = 1,
    gpu_memory_utilization: UtilO = None,
    mfu: MfuO = 0.5,
    peak_tflops: PeakO = None,
    active_params: ActiveO = None,
    engine: EngineO = "vllm",
    block_size: BlockSizeO = None,
    prefill: PrefillO = None,
    decode_tokens_per_s: DecodeO = None,
    prefill_hold: PrefillHoldO = False,
    hit_token_seconds: HitTokO = None,
    prefill_overhead_s: OverheadO = None,
    decode_kv: DecodeKvO = False,
    lag: LagO = 0.0,
    warmup: WarmupO = None,
    seed: SeedOpt = 0,
    overlap_score_weight: OswO = None,
    overlap_score_credit: OscO = None,
    temperature: TempO = None,
    request_weight: ReqWO = None,
    kv_ttl: KvTtlO = None,
    session_ttl: SessTtlO = None,
    prefix_weight: PrefWO = None,
    queue_weight: QueueWO = None,
    kv_weight: KvWO = None,
    cache_threshold: CacheThO = None,
    balance_abs: BalAbsO = None,
    balance_rel: BalRelO = None,
    load_metric: LoadMetricO = None,
    kv_mode: KvModeO = None,
    as_json: JsonOpt = False,
) -> None:
    """Replicas (or HBM per replica) to reach a target fleet hit ratio, per router, with the prefill saved."""
    kw = dict(locals())
    for k in ("router", "as_json"):
        kw.pop(k)
    res = _call(
        svc.fleet_plan, PR, _progress_label="fleet plan", router=_routers(router) or PR.model_fields["router"].default,
        **_router_values(**kw),
    )  # fmt: skip
    if as_json:
        _print_json(res)
        return
    hbm = res.vary == "hbm"
    cols = ["router", "R", "N / replica", *(["GiB / replica"] if hbm else []), "token h", "saved tok/s",
            "saved GPUs", "prefill GPUs", "imbalance req"]  # fmt: skip
    rows = []
    for a in res.answers:
        rows.append(
            [
                a["router"],
                _fmt(a["replicas"]) if a["found"] or hbm else "not reached",
                _fmt(a["N"]) if a["found"] or not hbm else "not reached",
                *([_fmt(a.get("gib_per_replica"), 2)] if hbm else []),
                _fmt(a.get("token_hit_ratio")),
                _fmt(a.get("saved_tokens_per_s"), 1),
                _gpus(a.get("saved_gpus")),
                _gpus(a.get("prefill_gpus")),
                _fmt(a.get("imbalance_requests"), 3),
            ]
        )
    what = "HBM per replica" if hbm else "replicas"
    load = f"λ0 = {res.lam0:g}/s (resampled)" if res.lam0 is not None else "the trace's own load"
    _table(f"fleet plan — {what} for token hit ratio ≥ {res.target:g} on {res.workload}, {load}", cols, rows)
    c = res.compute
    peak = c["peak_tflops_per_gpu"]
    console.print(
        Text(
            f"compute: {c['model']}, {c['flops_per_token_linear'] / 1e9:.2f} GFLOP/token (2 × "
            f"{c['linear_params_per_token']:,} params) + attention {c['attention']}; "
            + (f"GPUs = FLOP/s ÷ ({peak:g} TFLOP/s × mfu {c['mfu']:g}, assumed)" if peak else
               "no --gpu/--peak-tflops: GPU columns empty"),
            style="italic",
        ),
        soft_wrap=True,
    )  # fmt: skip
    cols = ["router", "R", "N", "token h", "±95%", "imbalance req", "imbalance prefill", "saved GPUs", "rejected"]
    rows = [
        [r["router"], _fmt(r["replicas"]), _fmt(r["N"]), _fmt(r["token_hit_ratio"]), _fmt(r["ci95"]),
         _fmt(r["imbalance_requests"], 3), _fmt(r["imbalance_prefill_tokens"], 3), _gpus(r["saved_gpus"]),
         _fmt(r["rejected"])]
        for r in res.rows
    ]  # fmt: skip
    _table("every point simulated", cols, rows)
    for n in res.notes:
        console.print(Text("note: " + n, style="italic"), soft_wrap=True)


@fleet_app.command("curve")
def fleet_curve(
    replicas: Annotated[int, _fopt("replicas", "--replicas", model=CR)],
    N: Annotated[int, _fopt("N", "--N", model=CR)],
    trace: TraceO = None,
    blocks: BlocksO = None,
    arrival: ArrivalO = "sequential",
    rate: RateO = None,
    span: SpanO = None,
    router: Annotated[str, _fopt("router", "--router", model=CR)] = "dynamo",
    param: Annotated[str | None, _fopt("param", "--param", model=CR)] = None,
    values: Annotated[list[str] | None, _fopt("values", "--values", model=CR)] = None,
    no_baselines: Annotated[bool, typer.Option("--no-baselines", help="Skip the baseline routers.")] = False,
    model: ModelO = "qwen3-8b",
    accelerator: GpuO = None,
    kv_dtype: KvDtypeO = "bf16",
    tp: TpO = 1,
    mfu: MfuO = 0.5,
    peak_tflops: PeakO = None,
    active_params: ActiveO = None,
    engine: EngineO = "vllm",
    block_size: BlockSizeO = None,
    prefill: PrefillO = None,
    decode_tokens_per_s: DecodeO = None,
    prefill_hold: PrefillHoldO = False,
    hit_token_seconds: HitTokO = None,
    prefill_overhead_s: OverheadO = None,
    decode_kv: DecodeKvO = False,
    lag: LagO = 0.0,
    warmup: WarmupO = None,
    seed: SeedOpt = 0,
    overlap_score_weight: OswO = None,
    overlap_score_credit: OscO = None,
    temperature: TempO = None,
    request_weight: ReqWO = None,
    kv_ttl: KvTtlO = None,
    prefix_weight: PrefWO = None,
    queue_weight: QueueWO = None,
    kv_weight: KvWO = None,
    cache_threshold: CacheThO = None,
    balance_abs: BalAbsO = None,
    balance_rel: BalRelO = None,
    kv_mode: KvModeO = None,
    plot: Annotated[Path | None, _fopt("plot", "--plot", model=CR)] = None,
    as_json: JsonOpt = False,
) -> None:
    """Hit ratio vs load imbalance as a KV-aware router's load weight varies (the cost of load balancing)."""
    kw = dict(locals())
    for k in ("values", "no_baselines", "as_json"):
        kw.pop(k)
    res = _call(
        svc.fleet_curve, CR, _progress_label="fleet curve", values=_split(values) or None,
        baselines=not no_baselines, **_router_values(**kw),
    )  # fmt: skip
    if as_json:
        _print_json(res)
        return
    cols = [res.param, "token h", "imbalance in flight", "imbalance req", "imbalance prefill", "mean wait s",
            "saved GPUs"]  # fmt: skip
    rows = [
        [_fmt(r["value"]) if "value" in r else r["router"], _fmt(r["token_hit_ratio"]),
         _fmt(r["imbalance_inflight"], 3), _fmt(r["imbalance_requests"], 3), _fmt(r["imbalance_prefill_tokens"], 3),
         _fmt(r["mean_wait"], 3), _gpus(r["saved_gpus"])]
        for r in [*res.rows, *res.baselines]
    ]  # fmt: skip
    _table(
        f"fleet curve — {res.router} {res.param} on {res.workload}, R = {res.replicas}, N = {res.N:,} blocks",
        cols,
        rows,
    )
    _print_notes(res.notes, style="italic")
    if res.figure:
        console.print("wrote " + ", ".join(res.figure))
