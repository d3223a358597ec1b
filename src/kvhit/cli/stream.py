"""``kvhit stream``: a long trace simulated in bounded memory — generated or read chunk by chunk and pushed through
simulator state that persists between chunks (10⁸ events in a few hundred MB)."""

from __future__ import annotations

import math
import re
from typing import Annotated

import typer

from kvhit.cli._common import (
    JsonOpt,
    Lam0Opt,
    NOpt,
    POpt,
    SpecOpt,
    TraceOpt,
    TurnsOpt,
    WCvOpt,
    WDistOpt,
    WMeanOpt,
    XOpt,
    YOpt,
    _call,
    _fail,
    _fmt,
    _opt,
    _print_json,
    _print_notes,
    _split,
    _table,
    app,
    console,
    svc,
)

SQ = svc.StreamRequest
_COUNT = re.compile(r"^\d[\d_,]*$|^\d+(\.\d*)?e\+?\d+$", re.IGNORECASE)


def _count(value: str | None, flag: str) -> int | None:
    """``100000000``, ``100_000_000``, ``100,000,000`` or ``1e8`` → an exact integer; anything else refused."""
    if value is None:
        return None
    v = value.strip()
    if v.startswith("-") and _COUNT.match(v[1:].strip()):
        _fail(f"{flag}: must be ≥ 0, got {value!r} (a count of events)")
    if not _COUNT.match(v):
        _fail(f"{flag}: not a whole number: {value!r} (write 100000000, 100_000_000 or 1e8)")
    if "e" in v.lower():
        mant, exp = v.lower().split("e")
        whole, _, frac = mant.partition(".")
        e = int(exp.lstrip("+"))
        if len(frac.rstrip("0")) > e or e > 30:
            _fail(f"{flag}: not a whole number: {value!r}")
        digits = (whole + frac).lstrip("0") or "0"
        return int(digits) * 10 ** (e - len(frac))
    return int(v.replace("_", "").replace(",", ""))


@app.command()
def stream(
    N: NOpt = None,
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
    policy: Annotated[str, _opt(SQ, "policy", "--policy")] = "content",
    engine: Annotated[str | None, _opt(SQ, "engine", "--engine")] = None,
    events: Annotated[str | None, _opt(SQ, "events", "--events", "-e")] = None,
    chunk: Annotated[str, _opt(SQ, "chunk", "--chunk")] = "250000",
    warmup: Annotated[str | None, _opt(SQ, "warmup", "--warmup")] = None,
    block_size: Annotated[int | None, _opt(SQ, "block_size", "--block-size")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the spec's stream trace; integer ≥ 0; default: 0.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Simulate a long trace in bounded memory: a spec's stream trace generated in chunks (--events, e.g. 1e8), or a
    Parquet trace read by row groups; Algorithm 1 (content) or the vLLM block cache, one pass for every --N.

    The answer does not depend on --chunk (memory and speed do). Prints the hit ratios, the time, the throughput
    and the peak RSS of this process.
    """
    res = _call(
        svc.stream,
        SQ,
        _progress_label="streaming",
        N=_split(N),
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
        policy=policy,
        engine=engine,
        events=_count(events, "--events"),
        chunk=_count(chunk, "--chunk"),
        warmup=_count(warmup, "--warmup"),
        block_size=block_size,
        seed=seed,
    )
    if as_json:
        _print_json(res)
        return
    if res.policy == "content":
        title = "streamed hit ratio — Algorithm 1 (whole-content LRU)"
        cols = ["N", "h (eq. 12)", "h practical (eq. 31)", "request hit rate", "evictions", "peak conversations held"]
        rows = [
            [_fmt(r["N"]), _fmt(r["h"]), _fmt(r["h_practical"]), _fmt(r["request_hit_rate"]), _fmt(r["evictions"]),
             _fmt(r["peak_state"])]
            for r in res.rows
        ]  # fmt: skip
    else:
        title = f"streamed hit ratio — vLLM block cache, engine {res.engine}, {res.block_size}-token blocks"
        cols = ["N", "h (blocks)", "token hit ratio", "request hit rate", "evictions", "rejected"]
        rows = [
            [_fmt(r["N"]), _fmt(r["h"]), _fmt(r["token_hit_ratio"]), _fmt(r["request_hit_rate"]),
             _fmt(r["evictions"]), _fmt(r["rejected"])]
            for r in res.rows
        ]  # fmt: skip
    _table(title, cols, rows)
    what = f"{res.events:,} events" + (f" ({res.block_accesses:,} block accesses)" if res.block_accesses else "")
    rate = f"{res.events_per_s / 1e6:,.2f} M events/s" if math.isfinite(res.events_per_s) else "–"
    console.print(
        f"{what} in {res.elapsed_s:,.1f} s ({rate}); first {res.warmup:,} events not measured; "
        f"peak RSS {res.peak_rss_mib:,.0f} MiB",
        markup=False,
    )
    _print_notes(res.notes)
