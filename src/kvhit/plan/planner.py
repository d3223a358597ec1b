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

from kvhit.plan import hardware
from kvhit.workload.spec import WorkloadSpec
from kvhit.workload.trace import Trace

__all__ = ["PlanError", "Workload", "Capacity", "Plan", "make_workload", "capacity", "plan"]


class PlanError(ValueError):
    """A planning question without an answer (e.g. a target above h_max); the message says why."""


Predictor = Callable[[np.ndarray, np.ndarray], np.ndarray]


ENGINES = ("vllm", "vllm-0.23", "content", "paper", "sglang")


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

    ``engine`` selects the predictor of the engine the user runs (:func:`kvhit.estimate.engine.estimate_engine`, with
    the engine's own block accounting, finite capacity, tail-first partial hits and fluctuations):
    ``"vllm"`` (≥ 0.24 free-queue order), ``"vllm-0.23"``, ``"content"`` (Algorithm 1); or ``"paper"``, the
    paper's estimator eq. (38)–(39) with its block rule. ``metric`` is vLLM's token hit ratio (``"tokens"``) or
    the block-weighted h (``"blocks"``); the paper's and Algorithm 1's h are block-weighted. ``"sglang"``:
    SGLang 0.5.23's radix cache (:func:`kvhit.estimate.sglang.estimate_sglang`, page size 1) at the same KV
    memory, i.e. a pool of N·b tokens for N blocks; its h is SGLang's token hit ratio (``metric`` is ignored).

    A spec is evaluated in closed form with ``engine="paper"``; the engine-aware predictors need per-turn token
    counts, so a spec is first sampled into a trace of ``sample_conversations`` conversations (``seed``), read
    as the practical model (T_j = R_j·b − 1 tokens: R_j − 1 full blocks and one partial block).
    """
    from kvhit.estimate import theory
    from kvhit.estimate.accounting import engine_accounting
    from kvhit.estimate.engine import estimate_engine
    from kvhit.estimate.mean_field import empirical_F, estimate
    from kvhit.estimate.trace_stats import trace_moments
    from kvhit.workload.generate import generate

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
    mom = trace_moments(tr, measured)
    lam = float(lam0 if lam0 is not None else tr.meta.get("lam0", mom.lam0_hat))
    F = empirical_F(mom)
    if engine == "paper":

        def predict(N, lam_):
            return np.asarray(estimate(mom, N, lam_, F, practical=True).h, dtype=float)

        h_max, metric = mom.h_max_hash, "blocks"
    elif engine == "sglang":
        from kvhit.estimate.sglang import estimate_sglang, sglang_accounting

        sa = sglang_accounting(tr, block_size=b, mask=measured)

        def predict(N, lam_):
            N_, l_ = np.broadcast_arrays(np.asarray(N, float), np.asarray(lam_, float))
            out = np.empty(N_.shape)
            for lv in np.unique(l_):
                s = l_ == lv
                out[s] = estimate_sglang(sa, np.round(N_[s]) * b, float(lv), F).h
            return out

        h_max, metric = sa.h_max, "tokens"
    else:
        acc = engine_accounting(tr, engine=engine, metric=metric, block_size=b, mask=measured)

        def predict(N, lam_):
            return np.asarray(estimate_engine(acc, N, lam_, F).h, dtype=float)

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
    N_min: int | None = None  #: the largest request (blocks): smaller capacities cannot serve the workload
    feasible: bool | None = None  #: the capacity is ≥ N_min (None: no capacity asked)
    refused_request_share: float | None = None  #: at the capacity
    refused_token_share: float | None = None
    answered_by: str = "estimator"  #: estimator | replay (exact, the trace as read) | resample (exact, λ0)
    #: block-id traces at their own load: prediction band for one realisation of the start times
    #: (:mod:`kvhit.estimate.band`) at the capacity, its level, and the smallest N whose band's lower end reaches
    #: the target ("N for h ≥ target with ``band_level`` confidence")
    h_band: list[float] | None = None
    band_level: float | None = None
    N_for_target_confident: int | None = None
    gib_for_target_confident: float | None = None

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

    feas = _trace_feasibility(wl, cap)
    if feas is not None:
        p.N_min = feas.N_min
    if cap is not None:
        p.capacity = asdict(cap) | {"kv_gib": cap.kv_gib}
        if feas is not None:
            p.feasible = bool(feas.feasible[0])
            p.refused_request_share = float(feas.refused_requests[0])
            p.refused_token_share = float(feas.refused_tokens[0])
        if p.feasible is False:
            p.notes.append(
                f"N = {cap.N:,} blocks is below the largest request ({feas.N_min:,} blocks): vLLM cannot serve this "
                "workload there (it refuses to start when max_model_len exceeds the KV cache); no hit ratio"
            )
        else:
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
        if p.N_min is not None and p.N_for_target < p.N_min:
            p.notes.append(
                f"the predictor reaches h = {target:g} at {p.N_for_target:,} blocks, below the largest request: "
                f"the smallest capacity that serves the workload is N_min = {p.N_min:,}"
            )
            p.N_for_target = p.N_min
        if cap is not None:
            p.gib_for_target = p.N_for_target * cap.bytes_per_block / hardware.GIB
            if p.N_for_target_confident is not None:
                p.gib_for_target_confident = p.N_for_target_confident * cap.bytes_per_block / hardware.GIB
            if p.feasible is not False:
                h_cap = h_at(cap.N)
                if h_cap < target:
                    p.notes.append(f"at λ0 = {wl.lam0:g} the capacity reaches only h = {h_cap:.4f} < target")
                # (c) the largest λ0 with h(N, λ0) ≥ target (h decreases in λ0)
                p.lam0_max_for_target = _largest_lam0(lambda lam0: h_at(cap.N, lam0), target, wl.lam0)
    if verify and cap is not None and p.feasible is not False:
        p.verify = _verify(wl, cap.N, p.h_at_capacity)
    return p


def _trace_feasibility(wl: Workload, cap: Capacity | None):
    """Refused shares at the capacity for a workload with a trace (vLLM engines: block requests of the trace;
    Algorithm 1 and the paper's model serve every request, so they have no infeasible capacity)."""
    if wl.trace is None or wl.estimator not in ("vllm", "vllm-0.23"):
        return None
    from kvhit.sim.feasibility import feasibility
    from kvhit.sim.runner import block_requests

    tr = wl.trace
    nw = int(tr.meta.get("n_warm", 0))
    measured = tr["conv"] >= nw if nw > 0 else np.ones(tr.n_turns, bool)
    rq = block_requests(tr, block_size=tr.block_size or wl.block_size)
    return feasibility(rq.prompt_tokens, rq.block_size, [cap.N if cap is not None else 1], mask=measured)


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
    from kvhit.sim.runner import simulate_trace_block, simulate_trace_content
    from kvhit.workload.trace import Window

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


# --------------------------------------------------------------------------------------------------
# production block-id traces
# --------------------------------------------------------------------------------------------------


def plan_production(
    pt,
    cap: Capacity | None = None,
    *,
    target: float | None = None,
    engine: str = "vllm",
    metric: str = "tokens",
    lam0: float | None = None,
    scale: float | None = None,
    verify: bool = False,
    replications: int = 5,
    n_conversations: int | None = 200,
    horizon: float | None = None,
    warmup: float | None = None,
    seed: int = 0,
    use_estimator: bool = True,
    grid_points: int = 200,
    band_level: float = 0.9,
    band_replays: int = 16,
) -> Plan:
    """Plan from a production block-id trace (:class:`~kvhit.workload.production_trace.ProductionTrace`).

    The load is the trace's own (its conversations at the start times it was read with: the answer is exact by
    *replay*, :mod:`kvhit.sim.tracerun`) or, with ``lam0`` / ``scale``, a stationary stream of its conversations
    at that rate (exact by *resample-and-simulate*, :mod:`kvhit.sim.resample`, mean of ``replications``). The
    predictor is the agentic estimator (:func:`kvhit.estimate.agentic.estimate_trace`) when it is available and
    says its regime is validated and the load is the trace's own; otherwise every answer comes from the exact
    simulation (``answered_by``), (b) to the resolution of a ``grid_points`` log grid. (c) is not answered (the
    estimator's stationary form is not validated; a simulation per trial λ0 is too slow). Capacities below the
    largest request are infeasible (no hit ratio). ``verify`` checks (a) by the exact simulation of the same load.
    """
    from kvhit.sim.feasibility import feasibility
    from kvhit.sim.resample import conversation_pool, resample_simulate
    from kvhit.sim.tracerun import production_curve, production_rows

    if engine not in ("vllm", "vllm-0.23"):
        raise PlanError(f"engine: a block-id trace is planned for vllm or vllm-0.23, got {engine!r}")
    if metric not in ("tokens", "blocks"):
        raise PlanError(f"metric: expected tokens or blocks, got {metric!r}")
    if lam0 is not None and scale is not None:
        raise PlanError("give at most one of lam0 or scale")
    pool = conversation_pool(pt)
    stationary = lam0 is not None or scale is not None
    lam = lam0 if lam0 is not None else (scale * pool.rate if scale is not None else pool.rate)
    if stationary and not (math.isfinite(lam) and lam > 0):
        raise PlanError(f"lam0: expected a finite rate > 0, got {lam!r}")
    d = pt.describe()
    h_max = d["ideal_token_hit_ratio"] if metric == "tokens" else d["ideal_block_hit_ratio"]
    name = f"{Path(pt.files[0]).parent.name if pt.format == 'weka' else Path(pt.files[0]).name}"
    desc = f"{name} ({pt.format}, {pool.n_conversations:,} conversations, {pt.n_requests:,} requests)"
    p = Plan(desc, engine, metric, float(lam) if math.isfinite(lam) else None, float(h_max))
    if not math.isfinite(lam):
        p.notes.append(
            f"λ0: undefined — the trace has {pool.n_conversations} conversation(s), no conversation rate to measure "
            "(give --lam0 to plan a stream of it)"
        )
    p.N_min = pool.N_min
    rs_kw = dict(
        engine=engine,
        metric=metric,
        lam0=lam if stationary else None,
        horizon=horizon,
        n_conversations=None if horizon is not None else n_conversations,
        warmup=warmup,
        replications=replications,
        seed=seed,
    )

    runs: dict = {}

    def resampled(Ns):
        key = tuple(int(x) for x in Ns)
        if key not in runs:  # seeded: the same capacities give the same replications, computed once
            runs[key] = resample_simulate(pool, np.asarray(key, dtype=np.int64), **rs_kw)
        return runs[key]

    def exact(Ns) -> np.ndarray:
        Ns = np.asarray(Ns, dtype=np.int64)
        if stationary:
            return resampled(Ns).stationary_ci()[0]  # the stationary hit ratio: a ratio of expectations
        c = production_curve(pt, Ns, engines=(engine,))["engines"][engine]
        return c["token_hit_ratio"] if metric == "tokens" else c["block_hit_ratio"]

    # predictor
    est_fn = None
    if use_estimator:
        try:
            from kvhit.estimate.agentic import estimate_trace
            from kvhit.workload.reuse import request_reuse
        except ImportError:
            p.notes.append("the agentic estimator is not installed: answers are exact simulations")
        else:
            reuse = request_reuse(pt)

            def est_fn(Ns, lam_=None):
                return estimate_trace(
                    reuse,
                    np.asarray(Ns, dtype=np.int64),
                    engine=engine,
                    metric=metric,
                    lam0=lam_ if lam_ is not None else (lam if stationary else None),
                )

            probe = est_fn(np.array([max(pool.N_min, 1)]))
            # the stationary form answers inside or outside its validated region (its error band and note say
            # which; resampling instead took minutes, issue 23): only the time-varying form falls back
            if not stationary and not probe.regime.get("validated", False):
                p.notes.append(
                    "the estimator flags this workload as outside its validated regime "
                    f"({'; '.join(probe.regime.get('notes', [])) or 'no reason given'}): answers are exact simulations"
                )
                est_fn = None
    est_ref = None
    if stationary and est_fn is not None:
        # the stationary form (lam0=) answers in seconds; resample-and-simulate took minutes (issue 23). Validated
        # only inside STATIONARY_VALIDATED (benchmarks/agentic_accuracy.py --only whatif, docs/accuracy.md)
        half = (probe.band or {}).get("half_width", float("nan"))
        if probe.regime.get("validated", False):
            p.notes.append(
                "at a stationary λ0 the answers are the estimator's stationary form, validated here: within "
                f"±{half:.2f} of resample-and-simulate on held-out WEKA pools (docs/accuracy.md); --verify adds the "
                "exact resample-and-simulate answer (minutes)"
            )
        else:
            p.notes.append(
                "at a stationary λ0 the answers are the estimator's stationary form — NOT validated here ("
                + "; ".join(n for n in probe.regime.get("notes", []) if not n.startswith("info:"))
                + f"); error band ±{half:.2f}; --verify adds the exact resample-and-simulate answer (minutes)"
            )
        est_ref = est_fn
    p.answered_by = "estimator" if est_fn is not None else ("resample" if stationary else "replay")
    # the realisation band (own load only; docs/estimators.md §4.1) on the log grid of (b) plus the capacity: for
    # another realisation of the start times (also where the answer is this realisation's exact replay)
    band = None
    if use_estimator and not stationary and pool.n_conversations >= 2 and pt.session is not None:
        from kvhit.estimate.band import estimate_trace_band
        from kvhit.workload.reuse import request_reuse

        hi_b = max(int(d["distinct_blocks"]), pool.N_min + 1) * 2
        grid_b = np.geomspace(pool.N_min, hi_b, grid_points).astype(np.int64)
        if cap is not None:
            grid_b = np.append(grid_b, cap.N)
        band, _ = estimate_trace_band(
            pt,
            np.unique(grid_b),
            engine=engine,
            metric=metric,
            level=band_level,
            replays=band_replays,
            seed=seed,
            reuse=reuse if est_fn is not None else request_reuse(pt),
        )
        p.band_level = float(band_level)
        if not band.regime.get("validated", True):
            p.notes.append("band: " + "; ".join(band.regime.get("notes", [])))
    if cap is not None:
        p.capacity = asdict(cap) | {"kv_gib": cap.kv_gib}
        f = feasibility(pt.prompt_tokens, pt.block_size, [cap.N])
        p.feasible = bool(f.feasible[0])
        p.refused_request_share = float(f.refused_requests[0])
        p.refused_token_share = float(f.refused_tokens[0])
        if not p.feasible:
            p.notes.append(
                f"N = {cap.N:,} blocks is below the largest request ({pool.N_min:,} blocks): vLLM cannot serve this "
                "workload there; no hit ratio"
            )
        else:
            p.h_at_capacity = float(est_fn([cap.N]).h[0]) if est_fn is not None else float(exact([cap.N])[0])
            if band is not None:
                k = int(np.searchsorted(band.N, cap.N))
                p.h_band = [float(band.h_lo[k]), float(band.h_hi[k])]
            tok_rate = (
                lam * float(np.add.reduceat(pool.prompt_tokens, pool.req_offsets[:-1]).mean())
                if stationary
                else float(pt.prompt_tokens.sum()) / max(d["time_span_s"], 1e-9)
            )
            p.saved_fraction = p.h_at_capacity
            p.saved_prefill_tokens_per_s = p.h_at_capacity * tok_rate
    if target is not None:
        p.target = float(target)
        if not 0 < target < 1:
            raise PlanError(f"target hit ratio must be in (0, 1), got {target}")
        if target >= h_max:
            raise PlanError(
                f"target hit ratio {target:.4f} is not reachable: this trace's infinite-cache ceiling is "
                f"{h_max:.4f} (only reused prefixes can hit)"
            )
        if est_fn is not None:

            def h_vec(Ns):
                return np.asarray(est_fn(np.maximum(Ns, 1)).h, float)

            p.N_for_target = max(_smallest_capacity(h_vec, target), pool.N_min)
            if band is not None:
                ok_b = np.flatnonzero(~band.infeasible & (band.h_lo >= target))
                if ok_b.size:
                    p.N_for_target_confident = max(int(band.N[ok_b[0]]), p.N_for_target)
                    p.notes.append(
                        f"(b) with {band_level:.0%} confidence: the smallest N of a {grid_points}-point log grid whose "
                        f"band's lower end reaches {target:g} (one realisation of the start times, docs/estimators.md "
                        "§4.1)"
                    )
                else:
                    p.notes.append(
                        f"(b) with {band_level:.0%} confidence: no capacity reaches h ≥ {target:g} (the band's lower "
                        "end stays below it)"
                    )
        else:
            hi = max(int(d["distinct_blocks"]), pool.N_min + 1) * 2
            grid = np.unique(np.geomspace(pool.N_min, hi, grid_points).astype(np.int64))
            h = exact(grid)
            ok = np.flatnonzero(h >= target)
            if ok.size == 0:
                raise PlanError(f"no capacity up to {hi:,} blocks reaches h = {target:g} (simulated)")
            p.N_for_target = int(grid[ok[0]])
            p.notes.append(
                f"(b) from the simulated curve on a {grid.shape[0]}-point log grid (resolution "
                f"{100 * (grid[1] / grid[0] - 1):.1f}% of N)"
            )
        if cap is not None:
            p.gib_for_target = p.N_for_target * cap.bytes_per_block / hardware.GIB
            if p.N_for_target_confident is not None:
                p.gib_for_target_confident = p.N_for_target_confident * cap.bytes_per_block / hardware.GIB
            if p.feasible:
                p.notes.append(
                    "(c) the largest λ0 is not answered for a block-id trace: it needs the estimator's stationary "
                    "form, validated only inside its measured region (docs/estimators.md §4.2), or one resampled "
                    "simulation per trial λ0; "
                    "plan at chosen loads with --lam0/--scale instead (--verify: exact by resample-and-simulate)"
                )
    if verify and cap is not None and p.feasible:
        if stationary:
            r = resampled([cap.N])
            m, hw = r.stationary_ci()  # ratio of expectations (per-conversation token controls with a horizon)
            h_sim = float(m[0])
            p.verify = {
                "simulator": f"{engine} block cache, resampled at λ0 = {lam:.4g}/s",
                "metric": metric,
                "h_simulated": h_sim,
                "h_simulated_ci95": float(hw[0]),
                "replications": replications,
                "conversations_started": r.n_started,
                "horizon_s": r.horizon,
                "warmup_s": r.warmup,
                "seeds": r.seeds,
            }
        else:
            row = production_rows(pt, [cap.N], (engine,))[0][0]
            h_sim = row["token_hit_ratio"] if metric == "tokens" else row["h_blocks"]
            p.verify = {"simulator": f"{engine} block cache, trace replayed", "metric": metric, "h_simulated": h_sim}
        h_pred = float(est_ref([cap.N]).h[0]) if est_ref is not None else p.h_at_capacity
        p.verify["h_predicted"] = h_pred
        p.verify["predictor"] = "estimator" if (est_ref is not None or p.answered_by == "estimator") else "exact"
        p.verify["difference"] = None if h_pred is None else h_pred - h_sim
    return p
