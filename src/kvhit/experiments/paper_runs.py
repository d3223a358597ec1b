"""One run of the paper's LLM-serving experiments (App. E): a seed's sample, re-timed for a point (eq. (80)),
the actual hit ratios over the window and every estimate.

"Actual" hit ratios (per run)
-----------------------------
* the vLLM-faithful block simulator (:func:`kvhit.sim.runner.simulate_trace_block`) on the exact chained token
  block hashes, for both free-queue orders (``"vllm-0.23"``: vLLM ≤ 0.23, the paper's testbed ran 0.22.1;
  ``"vllm"``: ≥ 0.24), reporting the paper's block-weighted h (``h_blocks``, eq. (6)) and vLLM's token hit
  ratio; a request holds its blocks during its prefill (TTFT of the latency model) unless ``hold=False``;
* Algorithm 1 (whole-content LRU) with the practical weighting eq. (31) on the paper's block accounting
  (``alg1``), and on vLLM's exact accounting (``alg1-phys``: sizes ⌈T_j/b⌉, hit weight ⌊T_{j−1}/b⌋), which
  separates the accounting from the engine's block-level eviction in the comparison.

Invariant: within a seed every point uses the same sample and the same unit-exponential draws (arrivals E_i/λ0,
gaps max(W^E2E, μ_F·E'_ij): common random numbers), so a run's hit ratios and estimates are a deterministic
function of (setting, seed, λ0, μ_F).

NOT modelled here: the grids of points, the parallel runner and the statistics over seeds
(:mod:`kvhit.experiments.paper`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kvhit.estimate.trace_stats import trace_moments
from kvhit.experiments.paper_estimators import (
    ESTIMATORS,
    Estimator,
    _memo_clear,
    _metric_key,
    _moments,
    ingredient_estimates,
    observed_gaps,
)
from kvhit.experiments.paper_setting import ExperimentError, LatencyModel, Setting
from kvhit.workload.trace import Trace, Window

__all__ = [
    "Sample",
    "load_sample",
    "retime",
    "TimedRun",
    "run_point",
    "ACTUALS_BASE",
    "actuals",
    "PRIMARY_ACTUAL",
]


@dataclass(frozen=True, eq=False)
class Sample:
    """One seed's ShareGPT sample in conversation-major row order (conversation ids 0..C−1 in sample order:
    0..n_warm−1 warm-up), its chained block hashes and the seed's unit-exponential timing draws."""

    seed: int
    cols: dict[str, np.ndarray]  # conv, turn, M, Z, R, prompt_tokens, response_tokens, cum_tokens, R_full, R_phys
    new_tokens: np.ndarray  # T_j − T_{j−1} per row
    conv_off: np.ndarray  # CSR offsets of the per-conversation block hashes
    conv_hashes: np.ndarray
    u_arrival: np.ndarray  # Exp(1) per conversation
    u_gap: np.ndarray  # Exp(1) per row (the gap before turn j; unused at j = 1)
    meta: dict[str, Any]


def load_sample(setting: Setting, seed: int, *, cache_dir=None) -> Sample:
    """Sample ``n_warm + n_meas`` conversations exactly as :func:`build_sharegpt_trace` does for ``seed`` and
    hash their token blocks (vLLM-style chained hashes, :func:`kvhit.sim.vllm.blockids.hashes_from_token_ids`)."""
    from kvhit.sim.vllm.blockids import hashes_from_token_ids
    from kvhit.workload.sharegpt_trace import build_sharegpt_trace

    base, _ = build_sharegpt_trace(
        n_warm=setting.n_warm,
        n_meas=setting.n_meas,
        seed=int(seed),
        block_size=setting.block_size,
        keep_token_ids=True,
        cache_dir=cache_dir,
    )
    order = np.lexsort((base["turn"], base["conv"]))
    names = (
        "conv",
        "turn",
        "M",
        "Z",
        "R",
        "prompt_tokens",
        "response_tokens",
        "cum_tokens",
        "R_full",
        "R_phys",
    )
    cols = {k: np.ascontiguousarray(base[k][order]) for k in names}
    conv = cols["conv"]
    C = int(conv.max()) + 1
    if not np.array_equal(np.unique(conv), np.arange(C)):
        raise ExperimentError("sample: conversation ids are not dense 0..C-1")
    T = cols["cum_tokens"]
    first = cols["turn"] == 1
    new = T - np.where(first, 0, np.concatenate([[0], T[:-1]]))
    pieces = [base.lists["new_tokens"][i] for i in order]
    lens = np.array([p.size for p in pieces], np.int64)
    if not np.array_equal(lens, new):
        raise ExperimentError("sample: new_tokens lengths disagree with cum_tokens")
    conv_len = np.bincount(conv, weights=lens, minlength=C).astype(np.int64)
    tok_off = np.concatenate([[0], np.cumsum(conv_len)]).astype(np.int64)
    flat = np.concatenate(pieces).astype(np.int64)
    conv_off, conv_hashes = hashes_from_token_ids((tok_off, flat), setting.block_size)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 80]))  # timing stream of eq. (80)
    u_arrival = rng.exponential(1.0, size=C)
    u_gap = rng.exponential(1.0, size=conv.size)
    meta = {
        k: base.meta[k]
        for k in ("source", "n_warm", "n_meas", "block_size", "block_rule", "tokenizer", "template", "counts")
        if k in base.meta
    }
    meta["seed"] = int(seed)
    return Sample(int(seed), cols, new, conv_off, conv_hashes, u_arrival, u_gap, meta)


@dataclass(frozen=True, eq=False)
class TimedRun:
    """A sample put on a time axis for one point: the trace (rows sorted by time), ``order`` (trace row →
    sample row), per-row TTFT and W^E2E (trace order), and per-row flags ``e2e_binds`` (the gap before this
    turn was W^E2E of the previous turn, not the exponential sample)."""

    trace: Trace
    order: np.ndarray
    ttft: np.ndarray
    e2e: np.ndarray
    e2e_binds: np.ndarray
    lam0: float
    mu_F: float


def retime(sample: Sample, lam0: float, mu_F: float, latency: LatencyModel) -> TimedRun:
    """Poisson(λ0) arrivals a_i = (E_1 + … + E_i)/λ0 and turn-(j+1) submission = turn-j submission +
    max(W^E2E_ij, μ_F·E'_ij) (eq. (80))."""
    if not (math.isfinite(lam0) and lam0 > 0):
        raise ExperimentError(f"lam0: expected > 0, got {lam0!r}")
    if not (math.isfinite(mu_F) and mu_F > 0):
        raise ExperimentError(f"mu_F: expected > 0, got {mu_F!r}")
    c = sample.cols
    conv, turn = c["conv"], c["turn"]
    first = turn == 1
    arrivals = np.cumsum(sample.u_arrival) / float(lam0)
    ttft = latency.ttft(c["cum_tokens"], sample.new_tokens)
    e2e = ttft + c["response_tokens"].astype(float) * latency.tpot_s
    e2e_prev = np.concatenate([[0.0], e2e[:-1]])
    w_sample = float(mu_F) * sample.u_gap
    W = np.where(first, 0.0, np.maximum(e2e_prev, w_sample))
    binds = ~first & (e2e_prev > w_sample)
    cumW = np.cumsum(W)
    starts = np.flatnonzero(first)
    offset = cumW - np.repeat(cumW[starts], np.diff(np.append(starts, conv.size)))
    t = arrivals[conv] + offset
    order = np.lexsort((turn, conv, t))
    cols = {k: v[order] for k, v in c.items()}
    cols["time"] = t[order]
    cols["conv_arrival"] = arrivals[conv][order]
    meta = dict(sample.meta)
    meta.update({"lam0": float(lam0), "mu_F": float(mu_F), "interarrival": "eq. (80)", "latency": asdict(latency)})
    trace = Trace.from_columns(cols, meta, where="retimed trace")
    return TimedRun(trace, order, ttft[order], e2e[order], binds[order], float(lam0), float(mu_F))


def _block_requests(sample: Sample, run: TimedRun, block_size: int):
    """:class:`kvhit.workload.requests.BlockRequests` of the re-timed trace: request r (sample row ``order[r]``,
    conversation c) gets the first ⌊T_r/b⌋ hashes of conversation c."""
    from kvhit.workload.requests import BlockRequests

    rows = run.order
    T = sample.cols["cum_tokens"][rows].astype(np.int64)
    counts = T // block_size
    starts = sample.conv_off[sample.cols["conv"][rows]]
    total = int(counts.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    hashes = sample.conv_hashes[np.repeat(starts, counts) + within]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return BlockRequests(T, offsets, hashes, None, int(block_size), "tokens")


#: Actual hit ratios, ``key -> description``. Keys are ``<engine>`` (block-weighted h of the vLLM simulator),
#: ``<engine>:token`` (vLLM's token hit ratio), ``alg1`` (Algorithm 1, eq. (31)) and ``alg1-phys``
#: (Algorithm 1 with exact physical block sizes, to separate the accounting from the engine's eviction order).
ACTUALS_BASE = {
    "alg1": "Algorithm 1 (whole-content LRU), paper accounting, practical weighting eq. (31)",
    "alg1-phys": "Algorithm 1 with vLLM's exact accounting (size ⌈T_j/b⌉, hit weight ⌊T_{j−1}/b⌋)",
}
#: The actual the paper's bounds are checked against: vLLM ≤ 0.23 order (the testbed ran vLLM 0.22.1),
#: h_blocks.
PRIMARY_ACTUAL = "vllm-0.23"


def actuals(setting: Setting) -> dict[str, str]:
    """The actual hit ratios a setting produces (see :data:`ACTUALS_BASE`)."""
    d: dict[str, str] = {}
    for e in setting.engines:
        d[e] = f"vLLM block simulator ({e}), block-weighted h (eq. (6))"
    for e in setting.engines:
        d[f"{e}:token"] = f"vLLM block simulator ({e}), vLLM token hit ratio"
    d.update(ACTUALS_BASE)
    return d


def _alg1_phys(trace: Trace, new_tokens: np.ndarray, N: int, b: int, mask: np.ndarray) -> float:
    """Algorithm 1 (whole-content LRU) with vLLM's exact block accounting: content size ⌈T_j/b⌉ (column
    R_phys), hit weight ⌊T_{j−1}/b⌋ (the full blocks of the previous prompt), h = Σ hit·⌊T_{j−1}/b⌋ /
    Σ ⌈T_j/b⌉ over the window (eq. (31) with the practical model's R_j − 1 replaced by the exact count)."""
    from kvhit.sim.content.lru import simulate_content

    res = simulate_content(trace.dense_conv(), trace["R_phys"], int(N))
    prev_full = (trace["cum_tokens"] - new_tokens) // b
    num = float(np.sum(np.where(res.hit, prev_full, 0)[mask]))
    den = float(np.sum(trace["R_phys"][mask]))
    return num / den if den > 0 else math.nan


def run_point(
    sample: Sample,
    setting: Setting,
    lam0: float,
    mu_F: float,
    estimators: dict[str, Estimator] | None = None,
) -> dict[str, Any]:
    """One run: re-time ``sample`` for (λ0, μ_F), simulate the actuals over the window and evaluate every
    estimator. Returns a flat dict of floats (keys ``actual/…``, ``est/…``, ``W/…``, and with
    ``setting.ingredients`` ``ingr/<actual>/<column>``: :func:`ingredient_estimates` for each engine and metric),
    ``steady/…`` (the window's :func:`kvhit.workload.stationarity.check_window`: ``stationary`` 1.0 or 0.0,
    ``in_band_share``, ``warmup_s``, ``mean_duration_s``) plus ``seed``, ``lam0``, ``mu_F``, ``moments`` and
    ``seconds``."""
    from kvhit.sim.runner import simulate_trace_block, simulate_trace_content

    t0 = time.perf_counter()
    est = ESTIMATORS if estimators is None else estimators
    N = setting.capacity
    run = retime(sample, lam0, mu_F, setting.latency)
    tr = run.trace
    window = Window.warmup_conversations(tr, setting.n_warm)
    in_window = window.mask(tr)
    measured = in_window & (tr["conv"] >= setting.n_warm)
    out: dict[str, Any] = {"seed": sample.seed, "lam0": float(lam0), "mu_F": float(mu_F)}
    rq = _block_requests(sample, run, setting.block_size)
    hold = run.ttft if setting.hold else None
    for eng in setting.engines:
        res, m = simulate_trace_block(tr, N, engine=eng, window=window, requests=rq, hold=hold)
        out[f"actual/{eng}"] = float(m["h_blocks"])
        out[f"actual/{eng}:token"] = float(m["token_hit_ratio"])
        out[f"sim/{eng}/rejected"] = int(m["rejected"])
        out[f"sim/{eng}/mean_wait"] = float(m["mean_wait"])
        ph = m["partial_hits"]
        n_ph = ph["n_miss"] + ph["n_full"] + ph["n_partial"]
        out[f"sim/{eng}/partial_frac"] = ph["n_partial"] / n_ph if n_ph else math.nan
    out["actual/alg1"] = float(simulate_trace_content(tr, N, window=window, practical=True).h)
    out["actual/alg1-phys"] = _alg1_phys(tr, sample.new_tokens[run.order], N, setting.block_size, in_window)
    try:
        for name, fn in est.items():
            out[f"est/{name}"] = float(fn(tr, measured, N, float(lam0), float(mu_F)))
        if setting.ingredients:
            for eng in setting.engines:
                for metric in ("blocks", "tokens"):
                    vals = ingredient_estimates(tr, measured, N, float(lam0), eng, metric)
                    for col, v in vals.items():
                        out[f"ingr/{_metric_key(eng, metric)}/{col}"] = v
    finally:
        _memo_clear()
    from kvhit.workload.stationarity import check_window

    steady = check_window(tr["time"], tr["conv"], in_window)  # against the window's own median active count
    out["steady/stationary"] = float(steady.stationary)
    out["steady/in_band_share"] = float(steady.in_band_share)
    out["steady/warmup_s"] = float(steady.warmup_s)
    out["steady/mean_duration_s"] = float(steady.mean_duration_s)
    gaps = observed_gaps(tr, measured)
    all_gaps = observed_gaps(tr, tr["conv"] >= setting.n_warm)
    rev = measured & (tr["turn"] >= 2)
    out["W/realized_mean"] = float(gaps.mean()) if gaps.size else math.nan  # μ̂_F (censored by the window)
    out["W/uncensored_mean"] = float(all_gaps.mean()) if all_gaps.size else math.nan
    out["W/frac_e2e"] = float(run.e2e_binds[rev].mean()) if rev.any() else math.nan
    out["W/mean_e2e"] = float(run.e2e[measured].mean())
    out["W/censored_frac"] = 1.0 - gaps.size / all_gaps.size if all_gaps.size else math.nan
    mom = _moments(tr, measured)
    out["moments"] = {
        "L": mom.L,
        "n_turns": mom.n_turns,
        "A_R": mom.A_R,
        "A_H_hash": mom.A_H_hash,
        "E_B": mom.E_B,
        "E_M": mom.E_M,
        "h_max_hash": mom.h_max_hash,
        "h_max": mom.h_max,
    }
    full = trace_moments(tr, rows=measured, block="full")  # exact token accounting, for comparison only
    out["moments_full"] = {
        "A_R": full.A_R,
        "A_H_hash": full.A_H_hash,
        "E_B": full.E_B,
        "h_max_hash": full.h_max_hash,
    }
    out["n_window_turns"] = int(in_window.sum())
    out["window_s"] = float(window.end - window.start)
    out["seconds"] = time.perf_counter() - t0
    return out
