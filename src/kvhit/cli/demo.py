"""``kvhit demo``: a one-minute tour of estimate, simulate and plan."""

from __future__ import annotations

from typing import Annotated

import typer

from kvhit.cli._common import (
    JsonOpt,
    _call,
    _fmt,
    _opt,
    _print_json,
    _print_notes,
    _table,
    app,
    svc,
)
from kvhit.cli.trace import _print_build_report, _print_stats

# ---------------------------------------------------------------------------------------------------------------
# kvhit demo
# ---------------------------------------------------------------------------------------------------------------

DR = svc.DemoRequest


@app.command()
def demo(
    N: Annotated[int, _opt(DR, "N", "--N")] = svc.PAPER_N,
    lam0: Annotated[float, _opt(DR, "lam0", "--lam0")] = 1.0,
    w_mean: Annotated[float, _opt(DR, "w_mean", "--w-mean")] = 135.0,
    seed: Annotated[int, typer.Option("--seed", help="Sampling and timing seed; integer ≥ 0.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """The real job: ShareGPT → Qwen3 block trace (cached), its statistics, the paper's estimate at N = 2,275
    (the paper's App. E capacity) beside the whole-content simulation and the vLLM block cache (both orders)."""
    res = _call(svc.demo, DR, _progress_label="tokenizing ShareGPT", N=N, lam0=lam0, w_mean=w_mean, seed=seed)
    if as_json:
        _print_json(res)
        return
    _print_build_report(res.report)
    _print_stats(res.stats, paper=True)
    what = " (the paper's App. E capacity: 40 GiB of Qwen3-8B KV)" if res.N_is_paper_default else ""
    e, sim = res.estimates, res.simulated
    rows = [
        ["estimate: prior", _fmt(e["prior"]), "eq. (38)–(39), F = Exp(mean w), paper block rule"],
        ["estimate: posterior", _fmt(e["posterior"]), "same, F = Exp(realized mean)"],
        ["estimate: empirical F̂", _fmt(e["empirical"]), "same, F = empirical CDF of the gaps"],
        ["estimate: engine-aware, Algorithm 1", _fmt(e["engine:content"]), "finite N + fluctuations"],
        [
            "estimate: engine-aware, vLLM ≥ 0.24",
            _fmt(e["engine:vllm"]),
            "engine block accounting, tail-first partial hits, finite N, fluctuations (docs/estimators.md)",
        ],
        ["estimate: engine-aware, vLLM ≤ 0.23", _fmt(e["engine:vllm-0.23"]), "same, older free-queue order"],
        ["simulated: Algorithm 1", _fmt(sim["content"]), "whole-content LRU, practical weight (eq. 31)"],
        [
            "simulated: vLLM ≥ 0.24",
            _fmt(sim["vllm"]),
            f"block-level prefix cache, block-weighted h (token hit ratio {_fmt(sim['vllm_token_hit_ratio'])})",
        ],
        [
            "simulated: vLLM ≤ 0.23",
            _fmt(sim["vllm-0.23"]),
            f"older free-queue order (token hit ratio {_fmt(sim['vllm-0.23_token_hit_ratio'])})",
        ],
    ]
    _table(
        f"hit ratio at N = {res.N:,} blocks{what}, λ0 = {res.lam0:g}/s, exponential W with mean {res.w_mean:g} s "
        f"(measurement window of App. E)",
        ["source", "h", "what it is"],
        rows,
        right={"h"},
    )
    _print_notes(res.notes)
