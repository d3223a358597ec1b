"""The settings of the paper's LLM-serving experiments (§4, App. E): workload size, capacity, timing, grids.

Setting (App. E)
----------------
* Workload: ``n_warm`` = 1,000 warm-up + ``n_meas`` = 5,000 measured ShareGPT conversations with ≥ 2 turns,
  Qwen3-tokenized (:func:`kvhit.workload.sharegpt_trace.build_sharegpt_trace`), Poisson(λ0) conversation arrivals
  in sample order (warm-up first).
* Capacity: N = ⌊40 GB / 18 MB⌋ = 2,275 blocks of b = 128 tokens (Qwen3-8B, :mod:`kvhit.plan.hardware`).
* Timing, eq. (80): the prompt of turn j+1 is submitted W_ij = max(W^E2E_ij, W^sample_ij) after the prompt of
  turn j, with W^sample_ij ~ Exp(mean μ_F) and W^E2E_ij the end-to-end latency of turn j from
  :class:`LatencyModel`.
* Window: from the submission of the first to that of the last measured conversation
  (:meth:`kvhit.workload.trace.Window.warmup_conversations`); turns after it are not counted (censoring).
* Experiment 1: λ0 = 1.5 conv/s, μ_F ∈ {90, 105, …, 240} s.
* Experiment 2: μ_F = 135 s, λ0 ∈ {0.5, 0.75, …, 2.0}.

Invariant: a :class:`Setting` (and its :class:`LatencyModel`) is frozen and validated when built; a bad field
raises :class:`ExperimentError` naming it. The named settings are :data:`SETTINGS`.

NOT modelled here: running anything; the runs are :mod:`kvhit.experiments.paper_runs`, the grids and the
summary :mod:`kvhit.experiments.paper`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["ExperimentError", "LatencyModel", "Setting", "SETTINGS", "get_setting"]


class ExperimentError(ValueError):
    """Invalid experiment configuration; the message names the field."""


@dataclass(frozen=True)
class LatencyModel:
    """End-to-end latency W^E2E of one turn (eq. (80)): TTFT + response tokens × TPOT, with
    TTFT = ``ttft_base_s`` + (uncached prompt tokens) / ``prefill_tokens_per_s``.

    ``prefill="full"`` counts the whole prompt T_j as uncached (a conservative upper bound: it ignores prefix
    hits); ``"new"`` counts only the new tokens T_j − T_{j−1} (every prefix hit).

    Defaults (an 8B model, BF16, one accelerator per role as in App. E's PD-disaggregated testbed):

    * ``ttft_base_s = 0.05``: scheduling + KV transfer prefiller → decoder + first decode step;
    * ``prefill_tokens_per_s = 20,000``: compute-bound prefill of an 8B model (≈ 16 GFLOP/token) on one
      accelerator at a few hundred TFLOP/s effective;
    * ``tpot_s = 0.15``: the effective time per output token of a decode instance under the experiments'
      load (decode step of a large batch plus queueing and KV-transfer waits). At λ0 = 1.5 and Ê[M] ≈ 4.5,
      about 6.7 prompts/s each decode ≈ 260 tokens (the paper forces the recorded response lengths, up to
      ≈ 3,000 tokens), ≈ 1,750 tokens/s over the 4-NPU decode pool. The value is CALIBRATED to App. E's
      observation that the realized mean gap μ̂_F is closest to μ_F at μ_F = 135 s: with the window's
      censoring bias of this workload (μ̂_F/μ_F − 1 ≈ −3% at 90 s to −9% at 240 s without the E2E effect),
      0.15 s/token puts the crossing at 135 s (0.10 puts it near 105 s, 0.025 — a lightly loaded GPU —
      removes the E2E effect almost entirely: μ̂_F < μ_F everywhere).
    """

    ttft_base_s: float = 0.05
    prefill_tokens_per_s: float = 20_000.0
    tpot_s: float = 0.15
    prefill: str = "full"

    def __post_init__(self):
        for name in ("ttft_base_s", "tpot_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ExperimentError(f"latency.{name}: expected a finite number ≥ 0, got {v!r}")
        v = self.prefill_tokens_per_s
        if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise ExperimentError(f"latency.prefill_tokens_per_s: expected a finite number > 0, got {v!r}")
        if self.prefill not in ("full", "new"):
            raise ExperimentError(f"latency.prefill: expected 'full' or 'new', got {self.prefill!r}")

    def ttft(self, cum_tokens, new_tokens) -> np.ndarray:
        """Time to first token of each turn (seconds)."""
        tok = np.asarray(cum_tokens if self.prefill == "full" else new_tokens, dtype=float)
        return self.ttft_base_s + tok / self.prefill_tokens_per_s

    def e2e(self, cum_tokens, new_tokens, response_tokens) -> np.ndarray:
        """W^E2E of each turn: TTFT + response tokens × TPOT (seconds)."""
        return self.ttft(cum_tokens, new_tokens) + np.asarray(response_tokens, dtype=float) * self.tpot_s


@dataclass(frozen=True)
class Setting:
    """Everything that defines a reproduction (App. E; see the module docstring)."""

    name: str = "paper"
    n_warm: int = 1000
    n_meas: int = 5000
    block_size: int = 128
    model: str = "qwen3-8b"
    kv_gb: float = 40.0
    N: int | None = None  # default: kv_capacity_blocks(model, kv_gb, block_size) = 2,275
    exp1_lam0: float = 1.5
    exp1_mu_F: tuple[float, ...] = tuple(float(x) for x in range(90, 241, 15))
    exp2_mu_F: float = 135.0
    exp2_lam0: tuple[float, ...] = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    latency: LatencyModel = field(default_factory=LatencyModel)
    engines: tuple[str, ...] = ("vllm-0.23", "vllm")
    hold: bool = True  # block simulator: a request holds its blocks for its TTFT (in-flight protection)
    ingredients: bool = True  # per run: the engine estimate as each ingredient is added (INGREDIENT_COLUMNS)

    def __post_init__(self):
        if self.n_warm < 1 or self.n_meas < 2:
            raise ExperimentError(f"n_warm must be ≥ 1 and n_meas ≥ 2, got {self.n_warm}, {self.n_meas}")
        if self.block_size < 1:
            raise ExperimentError(f"block_size: expected ≥ 1, got {self.block_size}")
        if self.N is not None and self.N < 1:
            raise ExperimentError(f"N: expected ≥ 1 blocks, got {self.N}")
        for name in ("exp1_mu_F", "exp2_lam0"):
            v = getattr(self, name)
            if len(v) == 0 or any(not (math.isfinite(x) and x > 0) for x in v):
                raise ExperimentError(f"{name}: expected a non-empty list of positive numbers, got {v!r}")
        for name in ("exp1_lam0", "exp2_mu_F"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ExperimentError(f"{name}: expected a positive number, got {v!r}")
        if len(self.seeds) == 0 or len(set(self.seeds)) != len(self.seeds):
            raise ExperimentError(f"seeds: expected distinct seeds, got {self.seeds!r}")
        from kvhit.sim.vllm.block import ENGINES

        bad = [e for e in self.engines if e not in ENGINES]
        if bad or not self.engines:
            raise ExperimentError(f"engines: expected a subset of {sorted(ENGINES)}, got {self.engines!r}")

    @property
    def capacity(self) -> int:
        """N in blocks (App. E: ⌊40 GB / 18 MB⌋ = 2,275 for Qwen3-8B)."""
        if self.N is not None:
            return int(self.N)
        from kvhit.plan.hardware import get_model, kv_capacity_blocks

        return int(kv_capacity_blocks(get_model(self.model), kv_gb=self.kv_gb, block_size=self.block_size))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["N"] = self.capacity
        return d


#: Named settings: the paper's, a quick one (same workload size, fewer seeds and points), a tiny one
#: for tests.
SETTINGS: dict[str, Setting] = {
    "paper": Setting(),
    "quick": Setting(name="quick", exp1_mu_F=(90.0, 135.0, 180.0, 240.0), exp2_lam0=(0.5, 1.25, 2.0), seeds=(0, 1)),
    "tiny": Setting(name="tiny", n_warm=100, n_meas=400, exp1_mu_F=(90.0, 240.0), exp2_lam0=(0.5, 2.0), seeds=(0,)),
}


def get_setting(setting: str | Setting) -> Setting:
    """The named experiment setting (a :class:`Setting` passes through); an unknown name raises
    :class:`ExperimentError`."""
    if isinstance(setting, Setting):
        return setting
    if setting not in SETTINGS:
        raise ExperimentError(f"setting: unknown {setting!r} (one of {sorted(SETTINGS)})")
    return SETTINGS[setting]
