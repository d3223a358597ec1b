"""``trace stats`` on a production block-id trace (Mooncake .jsonl, WEKA .json file or directory): the workload
statistics an estimator needs (:mod:`kvhit.workload.stats` — reusable prefix, shared prefixes, gaps,
conversations, concurrency, the largest request and the infinite-cache ceiling) and its four-panel figure.

Invariant: the numbers are :func:`kvhit.workload.stats.trace_stats`'s, unchanged. NOT modelled: anything about
a cache (see ``curve`` / ``simulate``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from kvhit.service.base import Request, Response
from kvhit.service.common import Seed
from kvhit.service.errors import translating
from kvhit.service.inputs import read_blocks_trace
from kvhit.service.io import check_output_file

__all__ = ["BlockStatsRequest", "BlockStatsResponse", "block_stats", "is_block_trace"]


def is_block_trace(path: Path) -> bool:
    """A directory, ``.json`` or ``.jsonl`` path is a production block-id trace (kvhit traces are Parquet)."""
    p = Path(path)
    return p.is_dir() or p.suffix in (".json", ".jsonl")


class BlockStatsRequest(Request):
    """The inputs of ``kvhit trace stats`` on a block-id trace, validated: each field's description states its unit,
    range and default."""

    path: Path = Field(description="Production block-id trace: Mooncake .jsonl, or WEKA .json file/dir.")
    arrival: Literal["sequential", "poisson", "uniform"] = Field(
        "sequential", description="WEKA conversation starts: sequential | poisson (--rate) | uniform (--span)."
    )
    rate: float | None = Field(None, gt=0, description="WEKA poisson arrivals: conversations/s; > 0.")
    span: float | None = Field(None, ge=0, description="WEKA uniform arrivals over [0, span] seconds; ≥ 0.")
    seed: Seed = 0
    fig: Path | None = Field(None, description="Write the four-panel figure to PREFIX.png and PREFIX.svg.")

    FLAGS = {"path": "PATH"}


class BlockStatsResponse(Response):
    """The answer of ``kvhit trace stats`` on a block-id trace (``--json`` prints it; strict JSON, ``null`` where a
    number is undefined)."""

    summary: dict[str, Any]
    reuse: dict[str, Any]
    shared: dict[str, Any]
    gaps: dict[str, Any]
    conversations: dict[str, Any]
    concurrency: dict[str, Any]
    figures: list[str] = Field(default_factory=list)


def block_stats(req: BlockStatsRequest) -> BlockStatsResponse:
    """``kvhit trace stats`` on a block-id trace: cross-field checks and output paths first, then the library; refused
    input raises :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    from kvhit.workload.stats import trace_stats

    check_output_file(req.fig, "--fig", (".png", ".svg"))
    pt = read_blocks_trace(req.path, req.arrival, req.rate, req.span, req.seed)
    with translating(str(req.path)):
        st = trace_stats(pt)
        out = st.to_dict()
        figs: list[str] = []
        if req.fig is not None:
            from kvhit.plots.curves import plot_trace_stats

            req.fig.parent.mkdir(parents=True, exist_ok=True)
            title = f"{req.path.name} ({pt.format}, {req.arrival} starts)"
            figs = [str(x) for x in plot_trace_stats(st, str(req.fig), title=title)]
    return BlockStatsResponse(**out, figures=figs)
