"""``kvhit fleet ...``: R replicas behind a router."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from ._common import (
    JsonOpt,
    NOpt,
    SeedOpt,
    _call,
    _fmt,
    _help,
    _print_json,
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


def _fopt(field: str, flag: str) -> Any:
    return typer.Option(flag, help=_help(FR, field))


@fleet_app.command("simulate")
def fleet_simulate(
    trace: Annotated[Path, _fopt("trace", "--trace")],
    replicas: Annotated[list[str], _fopt("replicas", "--replicas")],
    N: NOpt = None,
    router: Annotated[list[str] | None, _fopt("router", "--router")] = None,
    engine: Annotated[str, _fopt("engine", "--engine")] = "vllm",
    block_size: Annotated[int | None, _fopt("block_size", "--block-size")] = None,
    prefill: Annotated[float | None, _fopt("prefill_tokens_per_s", "--prefill-tokens-per-s")] = None,
    lag: Annotated[float, _fopt("lag", "--lag")] = 0.0,
    warmup: Annotated[int | None, _fopt("warmup", "--warmup")] = None,
    seed: SeedOpt = 0,
    overlap_score_weight: Annotated[float | None, _fopt("overlap_score_weight", "--overlap-score-weight")] = None,
    temperature: Annotated[float | None, _fopt("temperature", "--temperature")] = None,
    request_weight: Annotated[float | None, _fopt("request_weight", "--request-weight")] = None,
    kv_ttl: Annotated[float | None, _fopt("kv_ttl", "--kv-ttl")] = None,
    session_ttl: Annotated[float | None, _fopt("session_ttl", "--session-ttl")] = None,
    prefix_weight: Annotated[float | None, _fopt("prefix_weight", "--prefix-weight")] = None,
    queue_weight: Annotated[float | None, _fopt("queue_weight", "--queue-weight")] = None,
    kv_weight: Annotated[float | None, _fopt("kv_weight", "--kv-weight")] = None,
    cache_threshold: Annotated[float | None, _fopt("cache_threshold", "--cache-threshold")] = None,
    balance_abs: Annotated[float | None, _fopt("balance_abs_threshold", "--balance-abs-threshold")] = None,
    balance_rel: Annotated[float | None, _fopt("balance_rel_threshold", "--balance-rel-threshold")] = None,
    load_metric: Annotated[str | None, _fopt("load_metric", "--load-metric")] = None,
    kv_mode: Annotated[str | None, _fopt("kv_mode", "--kv-mode")] = None,
    no_estimates: Annotated[bool, typer.Option("--no-estimates", help="Skip the fleet estimator.")] = False,
    plot: Annotated[Path | None, _fopt("plot", "--plot")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fleet token hit ratio, per-replica load and prefill, for each router and replica count."""
    res = _call(
        svc.fleet_simulate,
        FR,
        _progress_label="fleet",
        trace=trace,
        replicas=_split(replicas),
        N=_split(N),
        router=_split(router) or ["round-robin"],
        engine=engine,
        block_size=block_size,
        prefill_tokens_per_s=prefill,
        lag=lag,
        warmup=warmup,
        seed=seed,
        overlap_score_weight=overlap_score_weight,
        temperature=temperature,
        request_weight=request_weight,
        kv_ttl=kv_ttl,
        session_ttl=session_ttl,
        prefix_weight=prefix_weight,
        queue_weight=queue_weight,
        kv_weight=kv_weight,
        cache_threshold=cache_threshold,
        balance_abs_threshold=balance_abs,
        balance_rel_threshold=balance_rel,
        load_metric=load_metric,
        kv_mode=kv_mode,
        estimates=not no_estimates,
        plot=plot,
    )
    if as_json:
        _print_json(res)
        return
    cols = ["router", "R", "token h", "estimate", "imbalance req", "imbalance prefill", "prefill tokens", "mean wait s",
            "rejected"]  # fmt: skip
    rows = [
        [
            r["router"],
            _fmt(r["replicas"]),
            _fmt(r["token_hit_ratio"]),
            _fmt(r["estimate"]),
            _fmt(r["imbalance_requests"], 3),
            _fmt(r["imbalance_prefill_tokens"], 3),
            _fmt(r["prefill_tokens"]),
            _fmt(r["mean_wait"], 3),
            _fmt(r["rejected"]),
        ]
        for r in res.rows
    ]
    _table(f"fleet on {res.trace} — engine {res.engine}, block size {res.block_size}", cols, rows)
    for n in res.notes:
        console.print(Text("note: " + n, style="italic"))
    if res.figure:
        console.print("wrote " + ", ".join(res.figure))
