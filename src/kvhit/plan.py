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


ENGINES = ("vllm", "vllm-0.23", "content", "paper")


@dataclass
class Workload:
    """What the planner needs of a workload: a vectorized predictor h(N, λ0), its ceiling h_max, λ0, and the
    prompt tokens per conversation (to turn h into prefill work saved)."""

    predict: Predictor
    h_max: float
    lam0: float
    prompt_tokens_per_conv: float
    block_size: int
    description: str
    trace: Trace | None = None
    spec: WorkloadSpec | None = None
    estimator: str = "vllm"
    metric: str = "tokens"


def make_workload(
    source: Trace | WorkloadSpec,
    *,
    lam0: float | None = None,
    block_size: int = 128,
    engine: str = "vllm",
    metric: str = "tokens",
    n_warm: int | None = None,
    sample_conversations: int = 20_000,
    seed: int = 0,
) -> Workload:
    """Wrap a trace (statistics and F̂ over its measured conversations, i.e. those after ``n_warm``) or a spec.

    ``engine`` selects the predictor of the engine the user runs (:func:`kvhit.estimate.estimate_engine`, with
    the engine's own block accounting, finite capacity, tail-first partial hits and fluctuations):
    ``"vllm"`` (≥ 0.24 free-queue order), ``"vllm-0.23"``, ``"content"`` (Algorithm 1); or ``"paper"``, the
    paper's estimator eq. (38)–(39) with its block rule. ``metric`` is vLLM's token hit ratio (``"tokens"``) or
    the block-weighted h (``"blocks"``); the paper's and Algorithm 1's h are block-weighted.

    A spec is evaluated in closed form with ``engine="paper"``; the engine-aware predictors need per-turn token
    counts, so a spec is first sampled into a trace of ``sample_conversations`` conversations (``seed``), read
    as the practical model (T_j = R_j·b − 1 tokens: R_j − 1 full blocks and one partial block).
    """
    from . import estimate as est
    from . import theory
    from .workload.generate import generate

    if engine not in ENGINES:
        raise PlanError(f"engine: unknown engine {engine!r} ({', '.join(ENGINES)})")
    if metric not in ("tokens", "blocks"):
        raise PlanError(f"metric: expected tokens or blocks, got {metric!r}")
    if isinstance(source, WorkloadSpec):
        spec = source if lam0 is None else source.with_lam0(lam0)
        if engine == "paper":
            mom = theory.moments(spec)

            def predict(N, lam_):
                return np.asarray(theory.mean_field(mom.A_R, mom.A_H_hash, mom.E_B, spec.interarrival, lam_, N)[0])

            return Workload(
                predict,
                mom.h_max_hash,
                spec.lam0,
                mom.A_R * block_size,
                block_size,
                f"spec {spec.name or ''}".strip(),
                spec=spec,
                estimator="paper",
                metric="blocks",
            )
        n_warm = sample_conversations // 4 if n_warm is None else n_warm
        source = generate(spec, seed, n_conversations=sample_conversations + n_warm)
        source.meta.update(n_warm=n_warm, block_size=block_size)
    if not isinstance(source, Trace):
        raise PlanError(f"workload: expected a Trace or a WorkloadSpec, got {type(source).__name__}")
    tr = source
    b = tr.block_size or block_size
    nw = int(tr.meta.get("n_warm", 0)) if n_warm is None else n_warm
    conv_ids, dense, _ = tr.conv_index()
    measured = conv_ids >= nw
    mom = est.trace_moments(tr, measured)
    lam = float(lam0 if lam0 is not None else tr.meta.get("lam0", mom.lam0_hat))
    F = est.empirical_F(mom)
    if engine == "paper":

        def predict(N, lam_):
            return np.asarray(est.estimate(mom, N, lam_, F, practical=True).h, dtype=float)

        h_max, metric = mom.h_max_hash, "blocks"
    else:
        acc = est.engine_accounting(tr, engine=engine, metric=metric, block_size=b, mask=measured)

        def predict(N, lam_):
            return np.asarray(est.estimate_engine(acc, N, lam_, F).h, dtype=float)

        h_max = float(acc.h_max)
        if engine == "content":
            metric = "blocks"
    if "cum_tokens" in tr.cols:
        per = np.bincount(dense, weights=tr["cum_tokens"].astype(float))
    else:
        per = np.bincount(dense, weights=(tr["R"] * b - 1).astype(float))
    tokens = float(per[measured].mean())
    name = Path(str(tr.meta.get("source", ""))).name or "trace"
    return Workload(
        predict,
        h_max,
        lam,
        tokens,
        b,
        f"{name} ({mom.L:,} conversations)",
        trace=tr,
        spec=source if isinstance(source, WorkloadSpec) else None,
        estimator=engine,
        metric=metric,
    )


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


def _smallest_capacity(h: Callable[[np.ndarray], np.ndarray], target: float, points: int = 128) -> int:
    """Smallest integer N with h(N) ≥ target for nondecreasing, vectorized h: a doubling search for a bracket,
    then grids of ``points`` capacities that shrink the bracket until it is one block wide (few vectorized
    evaluations instead of one scalar call per bisection step)."""
    hi = 2
    while h(np.array([hi]))[0] < target:
        hi *= 4
        if hi > 1 << 42:
            raise PlanError("no finite capacity reaches the target")
    lo = 1  # h(1) = 0 < target
    while hi - lo > 1:
        grid = np.unique(np.linspace(lo, hi, min(points, hi - lo + 1)).astype(np.int64))
        ok = h(grid) >= target
        k = int(np.argmax(ok))  # first capacity reaching the target (ok[-1] is true: grid[-1] = hi)
        hi = int(grid[k])
        lo = int(grid[k - 1]) if k > 0 else lo
        if k > 0 and hi - lo <= 1:
            break
    return hi


@dataclass
class Plan:
    """Answers of :func:`plan` (missing questions are None)."""

    workload: str
    estimator: str
    metric: str
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
    compare: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def plan(
    wl: Workload,
    cap: Capacity | None = None,
    *,
    target: float | None = None,
    verify: bool = False,
) -> Plan:
    """Answer (a) h at the capacity, (b) N and GiB for ``target``, (c) the largest λ0 keeping ``target`` at the
    capacity, (d) prefill tokens saved per second and the fraction of prefill tokens (≈ compute) avoided."""
    p = Plan(wl.description, wl.estimator, wl.metric, wl.lam0, wl.h_max)

    def h_at(N: float, lam0: float = wl.lam0) -> float:
        if N < 2:  # one block holds nothing reusable (vLLM keeps one free block for the next allocation)
            return 0.0
        return float(wl.predict(np.array([float(N)]), np.array([lam0]))[0])

    def h_vec_N(Ns: np.ndarray) -> np.ndarray:
        h = np.zeros(Ns.shape)
        ok = Ns >= 2
        if ok.any():
            h[ok] = wl.predict(Ns[ok].astype(float), np.full(int(ok.sum()), wl.lam0))
        return h

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
        p.N_for_target = _smallest_capacity(h_vec_N, target)
        if cap is not None:
            p.gib_for_target = p.N_for_target * cap.bytes_per_block / hardware.GIB
            h_cap = h_at(cap.N)
            if h_cap < target:
                p.notes.append(f"at λ0 = {wl.lam0:g} the capacity reaches only h = {h_cap:.4f} < target")
            # (c) the largest λ0 with h(N, λ0) ≥ target (h decreases in λ0)
            p.lam0_max_for_target = _largest_lam0(lambda lam0: h_at(cap.N, lam0), target, wl.lam0)
    if verify and cap is not None:
        p.verify = _verify(wl, cap.N, p.h_at_capacity)
    return p


def _largest_lam0(h: Callable[[float], float], target: float, lam_ref: float, rtol: float = 1e-5) -> float | None:
    """Largest λ0 with h(λ0) ≥ target for nonincreasing h: bracket by factors of 4 around ``lam_ref``, then
    Brent's method on log λ0 (each evaluation of an engine predictor costs a fraction of a second, so few
    evaluations matter more than vectorization here). None if even λ_ref·4⁻²⁰ misses the target."""
    from scipy.optimize import brentq

    def g(x: float) -> float:
        return h(math.exp(x)) - target

    x0 = math.log(lam_ref)
    lo, hi = x0, x0
    if g(x0) >= 0:
        for _ in range(40):
            hi += math.log(4)
            if g(hi) < 0:
                break
            lo = hi
        else:
            return math.exp(hi)
    else:
        for _ in range(20):
            lo -= math.log(4)
            if g(lo) >= 0:
                break
            hi = lo
        else:
            return None
    return math.exp(brentq(g, lo, hi, xtol=rtol))


def _verify(wl: Workload, N: int, predicted: float | None) -> dict:
    """Exact simulation at capacity N on the workload's trace, by the simulator of the predicted engine (the
    vLLM block cache, or Algorithm 1 for ``content``/``paper``), in the predicted metric."""
    from .sim.runner import simulate_trace_block, simulate_trace_content
    from .workload.trace import Window

    tr = wl.trace
    tr.meta.setdefault("block_size", wl.block_size)
    nw = int(tr.meta.get("n_warm", 0))
    window = Window.warmup_conversations(tr, nw) if nw > 0 else Window.all()
    if wl.estimator in ("content", "paper"):
        sim, h = "Algorithm 1 (practical weight)", simulate_trace_content(tr, N, window=window, practical=True).h
    else:
        m = simulate_trace_block(tr, N, engine=wl.estimator, window=window)[1]
        sim, h = f"{wl.estimator} block cache", m["token_hit_ratio"] if wl.metric == "tokens" else m["h_blocks"]
    return {
        "simulator": sim,
        "metric": wl.metric,
        "h_simulated": h,
        "h_predicted": predicted,
        "difference": None if predicted is None else predicted - h,
    }
