"""Generate-and-simulate with independent replications: the simulated hit ratio with a confidence interval.

Each replication r draws a fresh trace from the spec with seed ``seed + r`` (so the replications are independent
and each is reproducible), runs the simulator and measures the hit ratio over a window that skips the warm-up
conversations; the mean and a Student-t 95% interval over replications are reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kvhit.sim.metrics import HitStats, content_hit_stats, hit_stats, mean_ci
from kvhit.workload.generate import generate
from kvhit.workload.requests import BlockRequests, kv_tokens
from kvhit.workload.spec import WorkloadSpec
from kvhit.workload.trace import Trace, Window

__all__ = [
    "BlockRequests",
    "Replications",
    "block_hit_stats",
    "block_requests",
    "replicate_content",
    "simulate_trace_block",
    "simulate_trace_content",
]


@dataclass(frozen=True)
class Replications:
    """Per-replication hit statistics and their summary."""

    N: int
    stats: list[HitStats]
    seeds: list[int]
    practical: bool
    h_mean: float = field(init=False)
    h_ci95: float = field(init=False)

    def __post_init__(self):
        m, hw = mean_ci([s.h for s in self.stats])
        object.__setattr__(self, "h_mean", m)
        object.__setattr__(self, "h_ci95", hw)

    @property
    def h(self) -> np.ndarray:
        return np.array([s.h for s in self.stats])

    def request_hit_rate(self) -> tuple[float, float]:
        return mean_ci([s.request_hit_rate for s in self.stats])

    def to_dict(self) -> dict:
        rq, rq_hw = self.request_hit_rate()
        return {
            "N": self.N,
            "h_mean": self.h_mean,
            "h_ci95": self.h_ci95,
            "h": self.h.tolist(),
            "request_hit_rate": rq,
            "request_hit_rate_ci95": rq_hw,
            "seeds": self.seeds,
            "practical": self.practical,
            "n_measured": [s.n_measured for s in self.stats],
        }


def simulate_trace_content(trace: Trace, N: int, *, window: Window | None = None, practical: bool = False) -> HitStats:
    """Algorithm 1 (whole-content LRU) on a trace at capacity ``N``; eq. (12) or (31) over the window."""
    from kvhit.sim.content.lru import simulate_content

    res = simulate_content(trace.dense_conv(), trace["R"], int(N))
    return content_hit_stats(trace, res.hit, window=window, practical=practical)


def replicate_content(
    spec: WorkloadSpec,
    N: int,
    *,
    n_conversations: int,
    n_warm: int,
    replications: int = 5,
    seed: int = 0,
    practical: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Replications:
    """Independent replications of generate → Algorithm 1 → h over the window after ``n_warm`` conversations."""
    if replications < 1:
        raise ValueError("replications must be ≥ 1")
    stats, seeds = [], []
    for r in range(replications):
        s = seed + r
        tr = generate(spec, s, n_conversations=n_conversations + n_warm)
        window = Window.warmup_conversations(tr, n_warm)
        stats.append(simulate_trace_content(tr, N, window=window, practical=practical))
        seeds.append(s)
        if progress is not None:
            progress(r + 1, replications)
    return Replications(int(N), stats, seeds, practical)


def _prefix_csr(conv_off: np.ndarray, conv_idx: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Indices into a per-conversation CSR array selecting the first ``counts[r]`` entries of conversation
    ``conv_idx[r]`` for every request r (flattened)."""
    starts = np.repeat(conv_off[conv_idx], counts)
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return starts + within


def block_requests(
    trace: Trace, *, block_size: int | None = None, colocated: bool = False, source: str = "auto"
) -> BlockRequests:
    """Build the block simulator's input from a trace (see :class:`BlockRequests` for the three sources)."""
    from kvhit.sim.vllm.blockids import hashes_from_block_counts, hashes_from_token_ids

    b = int(block_size or trace.block_size or 0)
    if b < 1:
        raise ValueError("block size unknown: the trace has no block_size; pass block_size=")
    if source == "auto":
        source = "tokens" if "new_tokens" in trace.lists else "counts" if "cum_tokens" in trace.cols else "blocks"
    conv = trace.dense_conv()
    resp = trace["response_tokens"] if "response_tokens" in trace.cols else None
    if colocated and resp is None:
        raise ValueError("colocated mode needs the trace's response_tokens column")
    if source == "tokens":
        if "new_tokens" not in trace.lists:
            raise ValueError("source='tokens' needs the trace's new_tokens list column (build it with token ids)")
        if colocated and "response_ids" not in trace.lists:
            raise ValueError("colocated mode with token ids needs the response_ids list column")
        C = int(conv.max()) + 1 if conv.size else 0
        order = np.lexsort((trace["turn"], conv))
        seqs: list[list[np.ndarray]] = [[] for _ in range(C)]
        new = trace.lists["new_tokens"]
        T = np.zeros(trace.n_turns, dtype=np.int64)
        running = np.zeros(C, dtype=np.int64)
        last_row = np.full(C, -1, dtype=np.int64)
        for r in order:  # one pass in conversation-major order: T_j = running length of the prompt
            c = conv[r]
            seqs[c].append(new[r])
            running[c] += new[r].size
            T[r] = running[c]
            last_row[c] = r
        if colocated:
            for c in range(C):
                seqs[c].append(trace.lists["response_ids"][last_row[c]])
        full_seqs = [np.concatenate(s) if s else np.zeros(0, np.int32) for s in seqs]
        conv_off, conv_hashes = hashes_from_token_ids(full_seqs, b)
        if "cum_tokens" in trace.cols and not np.array_equal(trace["cum_tokens"], T):
            raise ValueError("trace column cum_tokens disagrees with the lengths of new_tokens")
        L = kv_tokens(T, resp) if colocated else T
        counts = L // b
        hashes = conv_hashes[_prefix_csr(conv_off, conv, counts)]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return BlockRequests(T, offsets, hashes, resp if colocated else None, b, "tokens")
    if source == "counts":
        if "cum_tokens" not in trace.cols:
            raise ValueError("source='counts' needs the trace's cum_tokens column")
        T = trace["cum_tokens"].astype(np.int64)
    elif source == "blocks":
        if colocated:
            raise ValueError("colocated mode needs token counts (cum_tokens, response_tokens)")
        T = trace["R"].astype(np.int64) * b - 1
    else:
        raise ValueError(f"unknown source {source!r} (auto, tokens, counts, blocks)")
    L = kv_tokens(T, resp) if colocated else T
    offsets, hashes = hashes_from_block_counts(conv, L // b)
    return BlockRequests(T, offsets, hashes, resp if colocated else None, b, source)


def block_hit_stats(trace: Trace, res, *, window: Window | None = None) -> dict:
    """Hit metrics of a block simulation over a window: vLLM's token hit ratio (hits / queried prompt tokens),
    the paper's block-weighted h (hit blocks / ⌈T_j/b⌉, eq. (6)), request hit rates and the partial-hit
    histogram."""
    from kvhit.sim.vllm import block as blk

    mask = np.ones(trace.n_turns, bool) if window is None else window.mask(trace)
    demand = res.prompt_blocks
    stats = hit_stats(trace, res.hit_blocks.astype(float), res.hit_blocks > 0, demand, window)
    return {
        "token_hit_ratio": blk.token_hit_ratio(res, mask),
        "h_blocks": blk.block_hit_ratio(res, mask),
        "request_hit_rate": blk.request_hit_rate(res, mask),
        "request_full_hit_rate": blk.request_hit_rate(res, mask, full=True),
        "partial_hits": blk.partial_hit_histogram(res, mask),
        "per_turn": stats.per_turn,
        "n_measured": int(mask.sum()),
        "evictions": int(res.evictions),
        "peak_blocks_in_use": int(res.peak_blocks_in_use),
        "rejected": int(res.n_rejected),
        "mean_wait": float(np.mean(w[np.isfinite(w)])) if np.isfinite(w := res.wait[mask]).any() else float("nan"),
    }


def simulate_trace_block(
    trace: Trace,
    N: int,
    *,
    engine: str = "vllm",
    colocated: bool = False,
    window: Window | None = None,
    block_size: int | None = None,
    source: str = "auto",
    hold: np.ndarray | None = None,
    requests: BlockRequests | None = None,
):
    """Run the vLLM-faithful block simulator on a trace; returns ``(BlockResult, metrics dict)``."""
    from kvhit.sim.vllm.block import simulate_block

    rq = requests or block_requests(trace, block_size=block_size, colocated=colocated, source=source)
    res = simulate_block(
        rq.prompt_tokens,
        rq.hash_offsets,
        rq.hashes,
        N=int(N),
        block_size=rq.block_size,
        engine=engine,
        colocated=colocated,
        response_tokens=rq.response_tokens,
        times=trace["time"] if hold is not None else None,
        hold=hold,
    )
    return res, block_hit_stats(trace, res, window=window)
