"""Workload statistics of a request trace: what a hit-ratio estimator needs to know about it (issue 11, §1).

:func:`trace_stats` summarises a :class:`~kvhit.workload.reuse.RequestReuse` (built from a Mooncake / WEKA
:class:`~kvhit.workload.production_trace.ProductionTrace` or a kvhit :class:`~kvhit.workload.trace.Trace`) into a
:class:`TraceStats`: per-request reusable prefix (how much of the previous request of the same stream the new
prompt reuses; growth / shrink / divergence rates), cross-conversation shared prefixes (sizes, popularity),
the gap distribution ``W`` (eq. (1)), conversation lengths ``M`` and lifetimes, concurrency over time (active
conversations and their live context ``Σ F``: the load that sets a time-varying characteristic time), the
largest request (``N_min``: below it vLLM rejects requests) and the infinite-cache ceiling ``h_max``.

Invariant: every number is an exact function of the trace's request stream (no model, no randomness).
``to_dict()`` is strict-JSON-safe (NaN ↦ ``None``). Not modelled: anything about a cache; responses of a
colocated engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kvhit.workload.reuse import RequestReuse, request_reuse

__all__ = ["QUANTILES", "TraceStats", "trace_stats"]

#: Quantiles reported for every distribution.
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)


def _f(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _dist(x: np.ndarray) -> dict:
    """Count, mean, cv, min, quantiles, max of a sample (empty ⇒ count 0 and Nones)."""
    x = np.asarray(x, np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"count": 0, "mean": None, "cv": None, "min": None, "max": None, "quantiles": {}}
    m = float(x.mean())
    return {
        "count": int(x.size),
        "mean": m,
        "cv": _f(x.std() / m) if m else None,
        "min": float(x.min()),
        "max": float(x.max()),
        "quantiles": {
            f"p{round(q * 100)}": float(v) for q, v in zip(QUANTILES, np.quantile(x, QUANTILES), strict=True)
        },
    }


@dataclass(frozen=True)
class TraceStats:
    """Summary of a request trace (see the module docstring). Arrays are kept for figures and estimators."""

    summary: dict  #: requests, sessions, block size, span, ceilings, N_min, tokens
    reuse: dict  #: per-request reusable prefix (own stream) and its growth / shrink / divergence rates
    shared: dict  #: cross-conversation shared prefixes
    gaps: dict  #: distribution of W (s) between consecutive requests of a stream
    conversations: dict  #: requests per session, lifetimes, largest context
    concurrency: dict  #: active sessions and live context over time (summary)
    concurrency_t: np.ndarray = field(repr=False)  #: grid times (s)
    concurrency_active: np.ndarray = field(repr=False)  #: sessions between their first and last request
    concurrency_live_blocks: np.ndarray = field(repr=False)  #: Σ over active sessions of their latest F (blocks)
    gap_sample: np.ndarray = field(repr=False)  #: all gaps (s)
    reuse_fraction: np.ndarray = field(repr=False)  #: L_own / F_prev per request with a previous request
    session_requests: np.ndarray = field(repr=False)  #: requests per session

    def to_dict(self) -> dict:
        return {
            "summary": self.summary,
            "reuse": self.reuse,
            "shared": self.shared,
            "gaps": self.gaps,
            "conversations": self.conversations,
            "concurrency": self.concurrency,
        }


def trace_stats(source, *, grid: int = 256) -> TraceStats:
    """:class:`TraceStats` of a ProductionTrace, a kvhit Trace or a precomputed :class:`RequestReuse`.

    ``grid``: number of time points of the concurrency series (uniform over the trace's span).
    """
    u = source if isinstance(source, RequestReuse) else request_reuse(source)
    n = u.n
    b = u.block_size
    T = u.prompt_tokens
    F = u.full_blocks
    R = u.prompt_blocks
    hit = u.reusable
    span = float(u.time[-1] - u.time[0]) if n else 0.0
    n_sess = int(u.session.max()) + 1 if n else 0
    summary = {
        "source": u.source,
        "requests": n,
        "sessions": n_sess,
        "streams": int(u.stream.max()) + 1 if n else 0,
        "block_size": b,
        "time_span_s": span,
        "prompt_tokens_total": int(T.sum()),
        "prompt_tokens": _dist(T),
        "distinct_blocks": u.distinct_blocks,
        "full_blocks_total": int(F.sum()),
        "ceiling_token_hit_ratio": _f(u.ceiling("tokens")) if n else None,
        "ceiling_block_hit_ratio": _f(u.ceiling("blocks")) if n else None,
        "min_N": int(R.max()) if n else 0,
        "reused_from_own_stream_blocks": int(np.minimum(u.L_own, hit).sum()),
        "reused_total_blocks": int(hit.sum()),
    }
    hp = u.prev >= 0
    r = np.flatnonzero(hp)
    p = u.prev[r]
    Fp = F[p]
    L = u.L_own[r]
    grow = L == Fp
    shrink = (L == F[r]) & (F[r] < Fp)
    diverge = ~grow & ~shrink
    frac = np.where(Fp > 0, L / np.maximum(Fp, 1), 1.0)
    reuse = {
        "requests_with_previous": int(r.size),
        "first_requests": int(n - r.size),
        "grow_rate": _f(grow.mean()) if r.size else None,
        "shrink_rate": _f(shrink.mean()) if r.size else None,
        "diverge_rate": _f(diverge.mean()) if r.size else None,
        "reused_blocks": _dist(L),
        "reused_fraction_of_previous": _dist(frac),
        "new_blocks": _dist(F[r] - L),
        "dropped_blocks_on_shrink_or_diverge": _dist((Fp - L)[~grow]),
    }
    has = u.L_shared > 0
    # distinct shared prefixes: keyed by the (request's) shared run length and popularity of its last id
    if has.any():
        key = np.stack([u.L_shared[has], u.shared_sessions_of_last[has]], axis=1)
        uk, cnt = np.unique(key, axis=0, return_counts=True)
        top = np.argsort(-cnt, kind="stable")[:10]
        top_list = [{"blocks": int(uk[i, 0]), "sessions": int(uk[i, 1]), "requests": int(cnt[i])} for i in top]
    else:
        top_list = []
    shared = {
        "shared_ids": u.n_shared_ids,
        "requests_with_shared_prefix": int(has.sum()),
        "request_fraction": _f(has.mean()) if n else None,
        "shared_prefix_blocks": _dist(u.L_shared[has]),
        "popularity_sessions": _dist(u.shared_sessions_of_last[has]),
        "token_fraction": _f(u.L_shared.sum() * b / T.sum()) if n and T.sum() else None,
        "top": top_list,
    }
    gaps = _dist(u.gap[hp])
    # conversations (sessions)
    cnt = np.bincount(u.session, minlength=n_sess)
    first = np.full(n_sess, np.inf)
    last = np.full(n_sess, -np.inf)
    np.minimum.at(first, u.session, u.time)
    np.maximum.at(last, u.session, u.time)
    maxF = np.zeros(n_sess, np.int64)
    np.maximum.at(maxF, u.session, F)
    conversations = {
        "requests_per_session": _dist(cnt),
        "multi_request_sessions": int((cnt >= 2).sum()),
        "lifetime_s": _dist((last - first)[cnt >= 2]),
        "largest_context_blocks": _dist(maxF),
        "start_span_s": float(first.max() - first.min()) if n_sess else 0.0,
    }
    # concurrency: sessions active on [first, last] and their latest context at grid times
    if n:
        tg = np.linspace(u.time[0], u.time[-1], max(int(grid), 2))
        active = np.searchsorted(np.sort(first), tg, side="right") - np.searchsorted(np.sort(last), tg, side="left")
        # live context: each request sets its session's live size to F until the session's next request
        nxt = np.full(n, np.inf)
        so = np.lexsort((np.arange(n), u.session))
        same = u.session[so[1:]] == u.session[so[:-1]]
        nxt[so[:-1][same]] = u.time[so[1:][same]]
        ends = np.where(np.isfinite(nxt), nxt, u.time)  # a session is live from its first to its last request
        # Σ_r F_r 1{t_r ≤ τ < end_r}, by two cumulative sums over sorted events
        ev_t = np.concatenate([u.time, ends])
        ev_w = np.concatenate([F, -F]).astype(np.float64)
        o = np.argsort(ev_t, kind="stable")
        cs = np.cumsum(ev_w[o])
        idx = np.searchsorted(ev_t[o], tg, side="right") - 1
        live = np.where(idx >= 0, cs[np.maximum(idx, 0)], 0.0)
    else:
        tg = np.zeros(0)
        active = np.zeros(0, np.int64)
        live = np.zeros(0)
    concurrency = {
        "active_sessions": _dist(active),
        "live_context_blocks": _dist(live),
        "grid_points": int(tg.shape[0]),
    }
    return TraceStats(
        summary=summary,
        reuse=reuse,
        shared=shared,
        gaps=gaps,
        conversations=conversations,
        concurrency=concurrency,
        concurrency_t=tg,
        concurrency_active=np.asarray(active),
        concurrency_live_blocks=np.asarray(live),
        gap_sample=u.gap[hp],
        reuse_fraction=frac,
        session_requests=cnt,
    )
