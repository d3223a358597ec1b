"""The ShareGPT trace: the bundled corpus read (:mod:`kvhit.workload.sharegpt`), tokenized once with a cache
(:mod:`kvhit.workload.cache`), sampled and timed into a kvhit :class:`~kvhit.workload.trace.Trace`.

Split from the reader so that the tokenized cache (which reads conversations) and this builder (which reads
the cache) import in one direction: ``sharegpt`` ← ``cache`` ← ``sharegpt_trace``.

Invariant: the same arguments give the same trace bit for bit (seeds split with ``numpy.random.SeedSequence``).
Not modelled: anything beyond the paper's App. E workload construction (Qwen3 tokens, chat template of
:mod:`kvhit.workload.tokenize`, Poisson arrivals, exponential think times unless given).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvhit.workload.sharegpt import PAPER_WORKLOAD, sample_indices  # noqa: F401

__all__ = ["ShareGPTTraceReport", "build_sharegpt_trace"]


@dataclass
class ShareGPTTraceReport:
    """What :func:`build_sharegpt_trace` did: the read report (dict), corpus and sample sizes, cache use."""

    read: dict[str, Any]
    n_conversations: int  # kept (tokenized) conversations
    n_eligible: int  # with ≥ min_turns turns
    n_warm: int
    n_meas: int
    tokenizer: str
    template: str
    boundary_merges: int
    cache: dict[str, Any]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_sharegpt_trace(
    n_warm: int = 1000,
    n_meas: int = 5000,
    seed: int = 0,
    lam0: float = 1.0,
    interarrival=None,
    block_size: int = 128,
    path: str | Path | None = None,
    keep_token_ids: bool = False,
    cache_dir: str | Path | None = None,
    progress=None,
    *,
    tokenizer=None,
    strict: bool = False,
    min_turns: int = 2,
    use_cache: bool = True,
    processes: int | None = None,
):
    """ShareGPT → Qwen3-tokenized multi-turn block trace (App. E).

    Reads and tokenizes all conversations of ``path`` (default: the bundled ShareGPT V3 JSON; cached, see
    :mod:`kvhit.workload.cache`), samples ``n_warm + n_meas`` distinct conversations with ≥ ``min_turns``
    turns (:func:`sample_indices`), computes blocks with :func:`kvhit.workload.blocks.block_accounting`
    (``Z``/``R`` = the paper's tail rule, ``cum_tokens``/``R_full``/``R_phys`` exact) and puts them on a time
    axis with :func:`kvhit.workload.generate.trace_from_conversations`: Poisson(``lam0``) conversation
    arrivals in sample order, so conversations ``0..n_warm-1`` are the warm-up set and ``n_warm..`` the
    measurement set, and gaps W ~ ``interarrival`` (default ``Exponential(135.0)``) between turns.

    ``seed`` seeds both the sample and the timing (two independent streams spawned from
    ``numpy.random.SeedSequence(seed)``). ``progress(done, total)`` reports tokenization progress (cold cache
    only). Returns ``(trace, ShareGPTTraceReport)``; the trace meta records n_warm, n_meas, block_size,
    block_rule, source, counts, tokenizer, template, the sampled conversation ids.
    """
    import time

    from kvhit.workload.blocks import BLOCK_RULE, block_accounting
    from kvhit.workload.cache import load_tokenized
    from kvhit.workload.dists import Exponential
    from kvhit.workload.generate import trace_from_conversations

    t0 = time.perf_counter()
    if interarrival is None:
        interarrival = Exponential(135.0)
    corpus = load_tokenized(
        path,
        tokenizer=tokenizer,
        keep_ids=keep_token_ids,
        strict=strict,
        cache_dir=cache_dir,
        use_cache=use_cache,
        processes=processes,
        progress=progress,
    )
    ss_sample, ss_time = np.random.SeedSequence(int(seed)).spawn(2)
    try:
        idx = sample_indices(corpus.M, n_warm, n_meas, np.random.default_rng(ss_sample), min_turns=min_turns)
    except ValueError as e:
        read = corpus.read_report
        skipped = {k: v for k, v in (read.get("skipped") or {}).items() if v}
        why = ""
        if skipped:
            reason, k = max(skipped.items(), key=lambda kv: kv[1])
            why = (
                f"; of {read.get('n_records', 0):,} records {read.get('n_skipped', 0):,} were skipped, "
                f"most often: {reason} ({k:,})"
            )
        raise ValueError(f"{read.get('source', path)}: {e}{why}") from None
    offs = corpus.offsets
    rows = np.concatenate([np.arange(offs[i], offs[i + 1]) for i in idx])
    M = corpus.M[idx]
    cols = block_accounting(M, corpus.prompt_tokens[rows], corpus.response_tokens[rows], block_size)
    extra = {k: cols[k] for k in ("prompt_tokens", "response_tokens", "cum_tokens", "R_full", "R_phys")}
    lists = None
    if keep_token_ids:
        assert corpus.prompt_ids is not None and corpus.response_ids is not None
        new_tokens, response_ids = [], []
        for i in idx:
            prev = None
            for row in range(offs[i], offs[i + 1]):
                pid = corpus.prompt_ids[row]
                new_tokens.append(pid if prev is None else np.concatenate([prev, pid]))
                prev = corpus.response_ids[row]
                response_ids.append(prev)
        lists = {"new_tokens": new_tokens, "response_ids": response_ids}
    read = corpus.read_report
    meta = {
        "source": f"sharegpt:{read.get('source', path)}",
        "seed": int(seed),
        "n_warm": int(n_warm),
        "n_meas": int(n_meas),
        "block_size": int(block_size),
        "block_rule": BLOCK_RULE,
        "min_turns": int(min_turns),
        "tokenizer": corpus.tokenizer,
        "template": corpus.template,
        "counts": {
            k: read.get(k)
            for k in ("n_records", "n_kept", "n_skipped", "skipped", "truncated", "trailing_user_dropped")
        }
        | {"n_eligible": int((corpus.M >= min_turns).sum())},
        "conversation_ids": [corpus.ids[i] for i in idx],
    }
    time_seed = int(ss_time.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
    trace = trace_from_conversations(
        M,
        cols["Z"],
        lam0=lam0,
        interarrival=interarrival,
        seed=time_seed,
        extra=extra,
        lists=lists,
        meta=meta,
    )
    trace.meta["time_seed"] = time_seed
    report = ShareGPTTraceReport(
        read=read,
        n_conversations=corpus.n_conversations,
        n_eligible=meta["counts"]["n_eligible"],
        n_warm=int(n_warm),
        n_meas=int(n_meas),
        tokenizer=corpus.tokenizer,
        template=corpus.template,
        boundary_merges=corpus.boundary_merges,
        cache=corpus.cache,
        seconds=time.perf_counter() - t0,
    )
    return trace, report
