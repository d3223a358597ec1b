"""``kvhit curve``: hit ratio at every capacity in one pass."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from kvhit.cli._common import (
    ArrivalOpt,
    BlocksTraceOpt,
    JsonOpt,
    Lam0Opt,
    POpt,
    RateOpt,
    SpanOpt,
    SpecOpt,
    TraceOpt,
    TurnsOpt,
    WCvOpt,
    WDistOpt,
    WMeanOpt,
    XOpt,
    YOpt,
    _call,
    _fmt,
    _opt,
    _print_json,
    _split,
    _table,
    app,
    console,
    svc,
)

# ---------------------------------------------------------------------------------------------------------------
# kvhit curve
# ---------------------------------------------------------------------------------------------------------------

CR = svc.CurveRequest


@app.command()
def curve(
    trace: TraceOpt = None,
    spec: SpecOpt = None,
    lam0: Lam0Opt = None,
    p: POpt = None,
    mean_turns: TurnsOpt = None,
    x_mean: XOpt = None,
    y_mean: YOpt = None,
    w_mean: WMeanOpt = None,
    w_dist: WDistOpt = None,
    w_cv: WCvOpt = None,
    conversations: Annotated[int | None, _opt(CR, "conversations", "--conversations", "-n")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Spec mode: seed; integer ≥ 0.")] = 0,
    n_min: Annotated[int, _opt(CR, "n_min", "--n-min")] = 64,
    n_max: Annotated[int | None, _opt(CR, "n_max", "--n-max")] = None,
    points: Annotated[int, _opt(CR, "points", "--points")] = 1000,
    policies: Annotated[
        str,
        typer.Option(
            "--policies",
            help="Comma list of simulated policies: content, vllm, vllm-0.23, sglang (SGLang at N·b tokens, the same "
            "memory; simulated per capacity at --sglang-points of the grid: no one-pass curve exists for it).",
        ),
    ] = "content,vllm,vllm-0.23",
    page_size: Annotated[int | None, _opt(CR, "page_size", "--page-size")] = None,
    evict_policy: Annotated[str | None, _opt(CR, "evict_policy", "--evict-policy")] = None,
    sglang_cache: Annotated[str | None, _opt(CR, "sglang_cache", "--sglang-cache")] = None,
    tlru_threshold: Annotated[int | None, _opt(CR, "tlru_threshold", "--tlru-threshold")] = None,
    sglang_points: Annotated[int | None, _opt(CR, "sglang_points", "--sglang-points")] = None,
    model: Annotated[str, _opt(CR, "model", "--model")] = "qwen3-8b",
    block_size: Annotated[int | None, _opt(CR, "block_size", "--block-size")] = None,
    plot: Annotated[Path | None, _opt(CR, "plot", "--plot")] = None,
    warmup: Annotated[int | None, _opt(CR, "warmup", "--warmup")] = None,
    blocks_trace: BlocksTraceOpt = None,
    arrival: ArrivalOpt = "sequential",
    rate: RateOpt = None,
    span: SpanOpt = None,
    estimates: Annotated[bool, _opt(CR, "estimates", "--estimate/--no-estimate")] = True,
    kv_gb: Annotated[float | None, _opt(CR, "kv_gb", "--kv-gb")] = None,
    sample_rate: Annotated[float | None, _opt(CR, "sample_rate", "--sample-rate")] = None,
    sample_salt: Annotated[int | None, _opt(CR, "sample_salt", "--sample-salt")] = None,
    sample_estimator: Annotated[str | None, _opt(CR, "sample_estimator", "--sample-estimator")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Hit ratio at every capacity: exact simulated curves (one pass each) beside the estimators' curves.

    Simulated and estimated curves are block-weighted (Σ hit blocks / Σ prompt blocks); vLLM's token hit ratio
    of each simulated engine is in the --json output. --sample-rate R: SHARDS-sampled curves (docs/sampling.md),
    the --trace streamed from Parquet.
    """
    extra = {} if sample_salt is None else {"sample_salt": sample_salt}
    if sample_estimator is not None:
        extra["sample_estimator"] = sample_estimator
    res = _call(
        svc.curve,
        CR,
        _progress_label="curve",
        estimates=estimates,
        kv_gb=kv_gb,
        trace=trace,
        spec=spec,
        lam0=lam0,
        p=p,
        mean_turns=mean_turns,
        x_mean=x_mean,
        y_mean=y_mean,
        w_mean=w_mean,
        w_dist=w_dist,
        w_cv=w_cv,
        conversations=conversations,
        seed=seed,
        n_min=n_min,
        n_max=n_max,
        points=points,
        policies=_split([policies]),
        page_size=page_size,
        evict_policy=evict_policy,
        sglang_cache=sglang_cache,
        tlru_threshold=tlru_threshold,
        sglang_points=sglang_points,
        model=model,
        block_size=block_size,
        plot=plot,
        warmup=warmup,
        blocks_trace=blocks_trace,
        arrival=arrival,
        rate=rate,
        span=span,
        sample_rate=sample_rate,
        **extra,
    )
    if as_json:
        _print_json(res)
        return
    Ns = res.N
    keys = [k for k in res.curves if not k.endswith("token ratio")]
    pm = {}  # a sampled curve: h ± its band's half-width (2 standard errors of the sample size) in one cell
    if res.sample_rate is not None:
        keys = [k for k in keys if not k.startswith("band ")]
        pm = {
            k: (res.curves["band low: " + k], res.curves["band high: " + k])
            for k in keys
            if "band low: " + k in res.curves
        }
    sg = [k for k in keys if k.startswith("SGLang")]
    if sg:  # show the capacities SGLang was simulated at, with vLLM's token ratios beside it
        keys = [k + " token ratio" if k + " token ratio" in res.curves else k for k in keys]
        keys = [k for k in keys if "Algorithm 1" not in k and not k.startswith("estimate")]
    feas = res.feasible
    cols = ["N (blocks)", "GiB", *keys] + (["refused (requests / tokens)"] if feas is not None else [])
    rows = []
    shown = (
        [i for i, v in enumerate(res.curves[sg[0]]) if v is not None and np.isfinite(v)]
        if sg
        else np.unique(np.linspace(0, len(Ns) - 1, 12).astype(int))
    )
    for i in shown:
        row = [
            _fmt(int(Ns[i])),
            f"{Ns[i] * res.bytes_per_block / 2**30:.2f}",
            *[_pm(res.curves[k][i], *(b[i] for b in pm[k])) if k in pm else _fmt(res.curves[k][i]) for k in keys],
        ]
        if feas is not None:
            row.append(
                "–"
                if feas[i]
                else "infeasible (N < the largest request)"
                if res.refused_request_share is None
                else f"infeasible: {100 * res.refused_request_share[i]:.2f}% / {100 * res.refused_token_share[i]:.2f}%"
            )
        rows.append(row)
    if res.sample_rate is not None:
        sizes = ", ".join(
            f"{k}: {v.get('kept_lookups', v.get('kept_events', 0)):,}" for k, v in (res.sample or {}).items()
        )
        console.print(
            f"SHARDS sample at rate {res.sample_rate:g}, salt {res.sample_salt} (kept lookups / events: {sizes}; "
            f"vLLM curves read {res.sample_estimator}); "
            "± two standard errors of the sample size (not the blur: error measured in docs/sampling.md)",
            markup=False,
        )
    what = (
        f"token hit ratio vs KV capacity (the {len(shown)} feasible capacities SGLang was simulated at, of "
        f"{len(Ns):,}; "
        "SGLang's pool = N·b tokens, the same GiB; simulated per capacity: no one-pass curve exists for SGLang)"
        if sg
        else f"hit ratio vs KV capacity ({len(Ns):,} capacities computed; 12 shown; h_max = {_fmt(res.h_max)}"
    )
    _table(
        f"{what}; GiB of {res.model} KV)",
        cols,
        rows,
    )
    if feas is not None and not all(feas):
        console.print(
            f"note: below N = {res.N_min:,} blocks (the largest request) vLLM cannot serve this workload: "
            "no vLLM hit ratio is reported there (shaded in the plot)",
            markup=False,
        )
    for n in res.notes:
        console.print(f"warning: {n}", markup=False)
    for f in res.figures:
        console.print(f"wrote {f}", markup=False)


def _pm(h, lo, hi) -> str:
    """``h ± half-width`` of a sampled curve's band (``–`` where undefined)."""
    if h is None or lo is None or hi is None or not np.isfinite(h):
        return _fmt(h)
    return f"{_fmt(h)} ± {(hi - lo) / 2:.4f}"
