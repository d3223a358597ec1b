"""Capacity planning: hit ratio at a KV budget, KV memory for a target hit ratio, the largest λ0 for a target, and
the prefill work saved — from a workload (trace or spec), a model's real KV size and an accelerator.

Every answer comes from a *predictor* h(N, λ0) — by default the mean-field estimator (eq. (38)–(39)) — which is
increasing in N and decreasing in λ0, so the inverse questions are answered by bisection on a monotone function.
``verify`` re-checks an answer by exact simulation and reports the disagreement.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import hardware
from .workload.spec import WorkloadSpec
from .workload.trace import Trace

__all__ = ["PlanError", "Workload", "Capacity", "Plan", "make_workload", "capacity", "plan"]


class PlanError(ValueError):
    """A planning question without an answer (e.g. a target above h_max); the message says why."""


Predictor = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass
class Workload:
    """What the planner needs of a workload: a vectorized predictor h(N, λ0), its ceiling h_max, λ0, and the
    per-conversation demand in blocks (Â_R) and prompt tokens, for converting h into work saved."""

    predict: Predictor
    h_max: float
    lam0: float
    A_R_blocks: float
    prompt_tokens_per_conv: float
    block_size: int
    description: str
    trace: Trace | None = None
    spec: WorkloadSpec | None = None
    estimator: str = "paper"


def make_workload(
    source: Trace | WorkloadSpec,
    *,
    lam0: float | None = None,
    block_size: int = 128,
    engine: str = "paper",
    n_warm: int | None = None,
) -> Workload:
    """Wrap a trace (empirical moments and F̂ over its measured conversations) or a spec (prior moments and F).

    ``engine`` selects the predictor: ``"paper"`` is the paper's practical estimator (eq. (39)); engine-aware
    predictors (``"vllm"``, ``"vllm-0.23"``, ``"content"``) use :func:`kvhit.estimate.estimate_engine` when it is
    available for a trace.
    """
    from . import estimate as est
    from . import theory

    if isinstance(source, Trace):
        tr = source
        b = tr.block_size or block_size
        nw = int(tr.meta.get("n_warm", 0)) if n_warm is None else n_warm
        conv_ids = np.unique(tr["conv"])
        mom = est.trace_moments(tr, conv_ids >= nw if nw > 0 else None)
        lam = float(lam0 if lam0 is not None else mom.lam0_hat)
        F = est.empirical_F(mom)
        if engine == "paper":

            def predict(N, lam_):
                return np.asarray(est.estimate(mom, N, lam_, F, practical=True).h, dtype=float)

            h_max = mom.h_max_hash
        else:
            if not hasattr(est, "estimate_engine"):
                raise PlanError(f"engine {engine!r}: engine-aware estimators are not available in this build")
            sel = np.isin(tr["conv"], conv_ids[conv_ids >= nw]) if nw > 0 else None

            def predict(N, lam_):
                return np.asarray(est.estimate_engine(tr, N, lam_, "empirical", engine=engine, mask=sel).h, dtype=float)

            h_max = float(predict(np.array([1e12]), np.array([lam]))[0])
        if "cum_tokens" in tr.cols:
            per = np.bincount(np.searchsorted(conv_ids, tr["conv"]), weights=tr["cum_tokens"].astype(float))
            tokens = float(per[conv_ids >= nw].mean()) if nw > 0 else float(per.mean())
        else:
            tokens = mom.A_R * b
        return Workload(
            predict,
            h_max,
            lam,
            mom.A_R,
            tokens,
            b,
            f"trace {Path(str(tr.meta.get('source', ''))).name} ({mom.L:,} conversations)",
            trace=tr,
            estimator=engine,
        )
    if isinstance(source, WorkloadSpec):
        if engine != "paper":
            raise PlanError("engine-aware estimates need a trace (token counts per turn); use engine='paper'")
        spec = source if lam0 is None else source.with_lam0(lam0)
        mom = theory.moments(spec)

        def predict(N, lam_):
            return np.asarray(theory.mean_field(mom.A_R, mom.A_H_hash, mom.E_B, spec.interarrival, lam_, N)[0])

        return Workload(
            predict,
            mom.h_max_hash,
            spec.lam0,
            mom.A_R,
            mom.A_R * block_size,
            block_size,
            f"spec {spec.name or ''}".strip(),
            spec=spec,
        )
    raise PlanError(f"workload: expected a Trace or a WorkloadSpec, got {type(source).__name__}")


@dataclass(frozen=True)
class Capacity:
    """KV memory available: N blocks of ``bytes_per_block`` (from the model's KV bytes per token × block size)."""

    N: int
    bytes_per_block: int
    kv_bytes: int
    model: str
    accelerator: str
    block_size: int

    @property
    def kv_gib(self) -> float:
        return self.kv_bytes / hardware.GIB


def capacity(
    model: str | Any,
    *,
    accelerator: str | None = None,
    kv_gb: float | None = None,
    block_size: int = 128,
    dtype: str = "bf16",
    tp: int = 1,
    gpu_memory_utilization: float = hardware.DEFAULT_GPU_MEMORY_UTILIZATION,
) -> Capacity:
    """KV capacity in blocks for a model on an accelerator (or a KV budget in GiB, the paper's reading: 40 GiB of
    Qwen3-8B at 128-token blocks is N = 2,275)."""
    m = hardware.resolve_model(model)
    bpb = m.bytes_per_block(block_size, dtype, tp)
    if (accelerator is None) == (kv_gb is None):
        raise PlanError("give exactly one of an accelerator or a KV budget in GB")
    if kv_gb is not None:
        kv_bytes = int(hardware.gb_to_bytes(kv_gb))
        acc = f"{kv_gb:g} GiB KV budget"
    else:
        a = hardware.get_accelerator(accelerator)
        kv_bytes = int(hardware.kv_budget_bytes(a, m, gpu_memory_utilization=gpu_memory_utilization, tp=tp))
        acc = a.name
    return Capacity(int(hardware.blocks_from_bytes(kv_bytes, bpb)), int(bpb), kv_bytes, m.name, acc, block_size)


def _bisect_increasing(
    f: Callable[[float], float], target: float, lo: float, hi: float, *, integer: bool, iters: int = 200
) -> float:
    """Smallest x in [lo, hi] with f(x) ≥ target for nondecreasing f (integer or real x)."""
    for _ in range(iters):
        if integer and hi - lo <= 1:
            return hi
        mid = (lo + hi) / 2 if not integer else (lo + hi) // 2
        if f(mid) >= target:
            hi = mid
        else:
            lo = mid
        if not integer and hi - lo <= 1e-9 * max(1.0, hi):
            break
    return hi


@dataclass
class Plan:
    """Answers of :func:`plan` (missing questions are None)."""

    workload: str
    estimator: str
    lam0: float
    h_max: float
    capacity: dict | None = None
    h_at_capacity: float | None = None
    target: float | None = None
    N_for_target: int | None = None
    gib_for_target: float | None = None
    lam0_max_for_target: float | None = None
    saved_prefill_tokens_per_s: float | None = None
    saved_fraction: float | None = None
    verify: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def plan(
    wl: Workload,
    cap: Capacity | None = None,
    *,
    target: float | None = None,
    verify: bool = False,
    verify_policy: str = "block",
    verify_engine: str = "vllm",
) -> Plan:
    """Answer (a) h at the capacity, (b) N and GiB for ``target``, (c) the largest λ0 keeping ``target`` at the
    capacity, (d) prefill tokens saved per second and the fraction of prefill tokens (≈ compute) avoided."""
    p = Plan(wl.description, wl.estimator, wl.lam0, wl.h_max)

    def h_at(N: float, lam0: float = wl.lam0) -> float:
        return float(wl.predict(np.array([float(N)]), np.array([lam0]))[0])

    if cap is not None:
        p.capacity = asdict(cap) | {"kv_gib": cap.kv_gib}
        p.h_at_capacity = h_at(cap.N)
        # h is the fraction of the prompt demand served from cache (blocks ≈ tokens at block granularity)
        p.saved_fraction = p.h_at_capacity
        p.saved_prefill_tokens_per_s = p.h_at_capacity * wl.lam0 * wl.prompt_tokens_per_conv
        p.notes.append(
            "prefill saved = h × λ0 × prompt tokens per conversation; it counts prompt tokens not "
            "recomputed — attention cost grows with context, so the FLOP fraction saved is larger"
        )
    if target is not None:
        p.target = float(target)
        if not 0 < target < 1:
            raise PlanError(f"target hit ratio must be in (0, 1), got {target}")
        if target >= wl.h_max:
            raise PlanError(
                f"target hit ratio {target:.4f} is not reachable: this workload's ceiling is "
                f"h_max = {wl.h_max:.4f} (only history of continuing conversations can be reused)"
            )
        hi = 1
        while h_at(hi) < target:
            hi *= 2
            if hi > 1 << 40:
                raise PlanError("no finite capacity reaches the target")
        p.N_for_target = int(_bisect_increasing(h_at, target, 0, hi, integer=True))
        if cap is not None:
            p.gib_for_target = p.N_for_target * cap.bytes_per_block / hardware.GIB
            h_cap = h_at(cap.N)
            if h_cap < target:
                p.notes.append(f"at λ0 = {wl.lam0:g} the capacity reaches only h = {h_cap:.4f} < target")
            # (c) the largest λ0 with h(N, λ0) ≥ target (h decreases in λ0)
            hi_l = max(wl.lam0, 1e-6)
            while h_at(cap.N, hi_l) >= target and hi_l < 1e12:
                hi_l *= 2
            p.lam0_max_for_target = _largest_lam0(lambda lam0: h_at(cap.N, lam0), target, hi_l)
    if verify and cap is not None:
        p.verify = _verify(wl, cap.N, p.h_at_capacity, verify_policy, verify_engine)
    return p


def _largest_lam0(h: Callable[[float], float], target: float, hi: float) -> float | None:
    """Largest λ0 in (0, hi] with h(λ0) ≥ target for nonincreasing h (None if even λ0 → 0 misses)."""
    lo = hi * 1e-9
    if h(lo) < target:
        return None
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if h(mid) >= target:
            lo = mid
        else:
            hi = mid
        if hi / lo - 1 < 1e-9:
            break
    return lo


def _verify(wl: Workload, N: int, predicted: float | None, policy: str, engine: str) -> dict:
    """Exact simulation at capacity N on the workload's trace (or a generated one for a spec)."""
    from .sim.runner import simulate_trace_block, simulate_trace_content
    from .workload.generate import generate
    from .workload.trace import Window

    tr = wl.trace
    if tr is None:
        tr = generate(wl.spec, 0, n_conversations=30_000)
        tr.meta["n_warm"] = 5_000
    tr.meta.setdefault("block_size", wl.block_size)
    nw = int(tr.meta.get("n_warm", 0))
    window = Window.warmup_conversations(tr, nw) if nw > 0 else Window.all()
    if policy == "content":
        h = simulate_trace_content(tr, N, window=window, practical=True).h
    else:
        h = simulate_trace_block(tr, N, engine=engine, window=window)[1]["h_blocks"]
    return {
        "policy": policy,
        "engine": engine if policy == "block" else None,
        "h_simulated": h,
        "h_predicted": predicted,
        "difference": None if predicted is None else predicted - h,
    }
