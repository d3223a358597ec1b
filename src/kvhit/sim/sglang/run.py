"""The SGLang radix model (:func:`kvhit.sim.sglang.radix.simulate_radix`) at several KV pool sizes: rows with
confidence intervals, curves over a capacity grid, feasibility, and the paired vLLM-vs-SGLang difference.

Metric: SGLang's token hit ratio, ``Σ cached prompt tokens / Σ prompt tokens`` over the measured requests (what
SGLang's ``cached_tokens`` reports), comparable with vLLM's ``prefix_cache_hits / prefix_cache_queries``.

No stack (inclusion) property. With whole-leaf eviction and token capacity, a larger pool can hit *less*:
eviction frees whole nodes (more than the shortfall), so two pool sizes evict different leaves at different
moments, split the tree at different places, and the hit tokens of a request — and even the total — are not
monotone in the capacity. ``tests/test_radix_run.py`` pins two counterexamples found with hypothesis: one
request hitting 2 tokens at C = 10 and 0 at C = 12 (page size 2), and the total hit tokens falling from 7 at
C = 8 to 6 at C = 9 (page size 1), every request fitting both pools. So no one-pass all-capacity curve
exists: :func:`radix_curve` simulates each capacity, in parallel threads (the kernel releases the GIL).

Feasibility (as :mod:`kvhit.sim.feasibility` for vLLM): a request needing more than the pool —
``⌈(T + max(n, 1) − 1)/p⌉·p`` tokens, plus a page when ``p > 1`` — is rejected by SGLang; a capacity that
rejects any request gets no hit ratio (``None``/NaN), only the refused shares, so no ratio over the admitted
requests alone is ever reported.

NOT modelled: what :mod:`kvhit.sim.sglang.engine` does not model.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kvhit.sim.sglang.radix import RadixResult, TokenStreams, simulate_radix

__all__ = ["RadixFeasibility", "paired_batch_ci", "radix_curve", "radix_feasibility", "radix_holds", "radix_rows"]


class RadixFeasibility:
    """``C_min`` (tokens): the smallest pool serving every request; per capacity ``feasible`` and the shares of
    measured requests / prompt tokens that would be refused."""

    def __init__(self, ts: TokenStreams, Cs, page_size: int, mask=None) -> None:
        p = page_size
        need = -(-(ts.prompt_tokens + np.maximum(ts.output_tokens, 1) - 1) // p) * p + (p if p > 1 else 0)
        m = np.ones(ts.n_requests, bool) if mask is None else np.asarray(mask, bool)
        Cs = np.asarray(Cs, np.int64)
        self.C_min = int(need.max()) if need.size else 0
        self.feasible = Cs >= self.C_min
        T = ts.prompt_tokens[m]
        nm = need[m]
        tot = max(int(T.sum()), 1)
        self.refused_requests = np.array([float((nm > c).mean()) if nm.size else 0.0 for c in Cs])
        self.refused_tokens = np.array([float(T[nm > c].sum() / tot) for c in Cs])

    def row(self, k: int) -> dict:
        return {
            "feasible": bool(self.feasible[k]),
            "refused_request_share": float(self.refused_requests[k]),
            "refused_token_share": float(self.refused_tokens[k]),
            "C_min": self.C_min,
        }


def radix_feasibility(ts: TokenStreams, Cs, page_size: int = 1, mask=None) -> RadixFeasibility:
    """Which SGLang pools ``Cs`` (tokens) can serve every request of ``ts`` at ``page_size``: a
    :class:`RadixFeasibility` (the smallest pool serving every request; per pool,
    feasibility and the refused shares)."""
    return RadixFeasibility(ts, Cs, page_size, mask)


def radix_holds(ts: TokenStreams, prefill_tokens_per_s: float | None, decode_tokens_per_s: float | None = None):
    """Per-request hold (seconds a request keeps its KV): ``T/prefill + n/decode`` (``None`` without speeds)."""
    if prefill_tokens_per_s is None and decode_tokens_per_s is None:
        return None
    h = np.zeros(ts.n_requests)
    if prefill_tokens_per_s is not None:
        h += ts.prompt_tokens / float(prefill_tokens_per_s)
    if decode_tokens_per_s is not None:
        h += ts.output_tokens / float(decode_tokens_per_s)
    return h


def _batches(idx: np.ndarray, n_batches: int) -> list[np.ndarray]:
    return np.array_split(idx, n_batches) if idx.size >= 2 * n_batches else []


def batch_ci(hit: np.ndarray, demand: np.ndarray, mask, n_batches: int = 10) -> tuple[float, float]:
    """(ratio over the measured rows, 95% batch-means half-width): rows in time order cut into ``n_batches``
    consecutive batches (as :func:`kvhit.sim.metrics.batch_means`)."""
    from kvhit.sim.metrics import mean_ci

    idx = np.flatnonzero(mask)
    d = demand[idx].sum()
    h = float(hit[idx].sum() / d) if d else float("nan")
    parts = _batches(idx, n_batches)
    hs = [float(hit[q].sum() / demand[q].sum()) for q in parts if demand[q].sum() > 0]
    return h, (mean_ci(hs)[1] if len(hs) >= 2 else float("nan"))


def paired_batch_ci(hit_a, hit_b, demand, mask, n_batches: int = 10) -> tuple[float, float]:
    """The difference ``h_a − h_b`` of two ratios on the *same* requests and its 95% batch-means half-width
    (paired: the difference is formed per batch, so the common workload noise cancels)."""
    from kvhit.sim.metrics import mean_ci

    idx = np.flatnonzero(mask)
    d = demand[idx].sum()
    diff = float((hit_a[idx].sum() - hit_b[idx].sum()) / d) if d else float("nan")
    parts = _batches(idx, n_batches)
    ds = [float((hit_a[q].sum() - hit_b[q].sum()) / demand[q].sum()) for q in parts if demand[q].sum() > 0]
    return diff, (mean_ci(ds)[1] if len(ds) >= 2 else float("nan"))


def _run(ts, C, page_size, evict_policy, times, hold, model) -> RadixResult:
    return simulate_radix(ts, int(C), page_size=page_size, evict_policy=evict_policy, times=times, hold=hold, **model)


def _workers(workers: int | None, n: int) -> int:
    return max(1, min(n, workers or os.cpu_count() or 1))


def radix_rows(
    ts: TokenStreams,
    Cs,
    *,
    page_size: int = 1,
    evict_policy: str = "lru",
    mask=None,
    times=None,
    hold=None,
    workers: int | None = None,
    progress=None,
    cache: str = "unified",
    tlru_tail_budget: int = 0,
) -> tuple[list[dict], RadixFeasibility, dict]:
    """One row per capacity (tokens): ``h`` (token hit ratio), ``h_ci95`` (batch means over the measured rows in
    arrival order), ``request_hit_rate``, ``evicted_tokens``, ``mean_wait`` (with holds); infeasible capacities
    get ``h = None`` and the refused shares. Also returns the per-capacity :class:`RadixResult` (feasible ones).
    ``cache``, ``tlru_tail_budget``: as :func:`~kvhit.sim.sglang.radix.simulate_radix`."""
    model = {"cache": cache, "tlru_tail_budget": tlru_tail_budget}
    m = np.ones(ts.n_requests, bool) if mask is None else np.asarray(mask, bool)
    Cs = [int(c) for c in Cs]
    feas = radix_feasibility(ts, Cs, page_size, m)
    ok = [c for k, c in enumerate(Cs) if feas.feasible[k]]
    results: dict[int, RadixResult] = {}
    if ok:
        if progress:
            progress(0, len(ok), f"SGLang radix cache at {len(ok)} pool size(s)")
        with ThreadPoolExecutor(_workers(workers, len(ok))) as ex:
            runs = ex.map(lambda c: _run(ts, c, page_size, evict_policy, times, hold, model), ok)
            for c, res in zip(ok, runs, strict=True):
                results[c] = res
    rows = []
    T = ts.prompt_tokens.astype(float)
    for k, C in enumerate(Cs):
        row = {"N": C, "engine": "sglang", "unit": "tokens", "page_size": page_size, "evict_policy": evict_policy}
        row["sglang_cache"] = cache
        row.update(feas.row(k))
        if C in results:
            res = results[C]
            h, half = batch_ci(res.hit_tokens.astype(float), T, m)
            w = res.wait[m]
            row.update(
                h=h,
                h_ci95=half,
                token_hit_ratio=h,
                request_hit_rate=res.request_hit_rate(m),
                evicted_tokens=int(res.evictions),
                n_measured=int(m.sum()),
                mean_wait=float(w[np.isfinite(w)].mean()) if hold is not None and np.isfinite(w).any() else None,
            )
        else:
            row.update(h=None, h_ci95=None, token_hit_ratio=None, request_hit_rate=None, evicted_tokens=None)
        rows.append(row)
    return rows, feas, results


def radix_curve(
    ts: TokenStreams,
    Cs,
    *,
    page_size: int = 1,
    evict_policy: str = "lru",
    mask=None,
    workers: int | None = None,
    cache: str = "unified",
    tlru_tail_budget: int = 0,
) -> dict:
    """Token hit ratio at every capacity of ``Cs`` (tokens), NaN where infeasible — one simulation per
    capacity, in parallel (no one-pass curve exists: see the module docstring). Keys: ``C``,
    ``token_hit_ratio``, ``feasibility``, ``method`` (``"per-capacity simulation"``). ``cache``,
    ``tlru_tail_budget``: as :func:`~kvhit.sim.sglang.radix.simulate_radix`."""
    model = {"cache": cache, "tlru_tail_budget": tlru_tail_budget}
    m = np.ones(ts.n_requests, bool) if mask is None else np.asarray(mask, bool)
    Cs = np.asarray(Cs, np.int64)
    feas = radix_feasibility(ts, Cs, page_size, m)
    h = np.full(Cs.shape, np.nan)
    ks = np.flatnonzero(feas.feasible)
    if ks.size:
        with ThreadPoolExecutor(_workers(workers, ks.size)) as ex:
            res = list(ex.map(lambda k: _run(ts, Cs[k], page_size, evict_policy, None, None, model), ks))
        for k, r in zip(ks, res, strict=True):
            h[k] = r.token_hit_ratio(m)
    return {"C": Cs, "token_hit_ratio": h, "feasibility": feas, "method": "per-capacity simulation"}
