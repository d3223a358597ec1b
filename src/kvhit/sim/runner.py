"""Generate-and-simulate with independent replications: the simulated hit ratio with a confidence interval.

Each replication r draws a fresh trace from the spec with seed ``seed + r`` (so the replications are independent
and each is reproducible), runs the simulator and measures the hit ratio over a window that skips the warm-up
conversations; the mean and a Student-t 95% interval over replications are reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..workload.generate import generate
from ..workload.spec import WorkloadSpec
from ..workload.trace import Trace, Window
from .metrics import HitStats, content_hit_stats, mean_ci

__all__ = ["Replications", "simulate_trace_content", "replicate_content"]


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
        return {"N": self.N, "h_mean": self.h_mean, "h_ci95": self.h_ci95, "h": self.h.tolist(),
                "request_hit_rate": rq, "request_hit_rate_ci95": rq_hw, "seeds": self.seeds,
                "practical": self.practical, "n_measured": [s.n_measured for s in self.stats]}


def simulate_trace_content(trace: Trace, N: int, *, window: Window | None = None,
                           practical: bool = False) -> HitStats:
    """Algorithm 1 (whole-content LRU) on a trace at capacity ``N``; eq. (12) or (31) over the window."""
    from .content import simulate_content

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
