"""Resample-and-simulate: the exact hit ratio of a trace's conversations at a new load, with a confidence interval.

A trace (a production block-id :class:`~kvhit.workload.production_trace.ProductionTrace` or a kvhit
:class:`~kvhit.workload.trace.Trace`) is cut into its conversations (:func:`conversation_pool`), each kept whole:
its requests, their prompt lengths, block ids and times *relative to the conversation's first request*. A
replication (:func:`resample`) starts copies of them at the points of a Poisson process of rate ``λ0`` — the
paper's arrival model (Sec. 2: conversations arrive as a Poisson process, each an i.i.d. draw of the per-turn
sizes and gaps) with the empirical law of whole conversations — and :func:`resample_simulate` replays the stream
through the exact simulators (the vLLM block pool of :mod:`kvhit.sim.vllm.block`, both free-queue orders, via
the one-pass curve of :mod:`kvhit.sim.vllm.curve`; or Algorithm 1 via :mod:`kvhit.sim.content.stackdist`) and reports
the mean and a Student-t 95% interval over independent replications (seed ``seed + r``), as
:class:`kvhit.sim.runner.Replications` does for specs. The *stationary* hit ratio is a ratio of expectations
(``E[hits]/E[queries]``), not the mean of the replications' ratios:
:meth:`ResampleResult.stationary_ci` estimates it, with each pool conversation's measured tokens (known mean
``λ0·H·T_k/C``) as control variates.

Stream of one replication
-------------------------
Conversation starts ``s_k`` are a Poisson process of rate ``λ0`` on ``[−D − w, H]`` (``D`` the longest
conversation's duration, ``w`` the warm-up, ``H`` the horizon — given, or the start of the first conversation
after ``n_conversations`` have started in ``[0, H)``); copy ``k`` is conversation ``c_k``, uniform over the pool
(with replacement). Its requests arrive at ``s_k + t_rel``. Requests outside ``[−w, H]`` are dropped, so the set
of conversations *active* at any instant of ``[−w, H]`` has exactly its stationary law (a conversation active at
``t ≥ −w`` started after ``−D − w``); the cache starts empty at ``−w`` and warms up over ``[−w, 0)``; requests in
``[0, H]`` are measured. Requests are ordered by time (ties: by start, then by order within the conversation).

Block ids of copies (namespacing)
---------------------------------
An id is *shared* if it occurs in two or more conversations of the source trace (Mooncake's system prompt
blocks; an id's chained prefix is then shared too) and *private* otherwise (every WEKA id: WEKA namespaces ids
per conversation). Shared ids keep one identity in every copy; private ids get a fresh identity per copy (copy
``k`` of private id ``p`` ↦ ``S + k·P + p``, with ``S``/``P`` the numbers of shared/private ids, densely
numbered), so two copies of one conversation never hit each other's private blocks, exactly as two users
sending the same-shaped conversation would not. The map keeps a chained stream chained (the parent of a shared
id is shared, the parent of a private id is private to the same conversation or shared), which
:func:`~kvhit.sim.vllm.curve.block_curve` requires. Sessions: WEKA files are conversations; Mooncake sessions
are derived from prefix sharing (:func:`~kvhit.workload.production.read_mooncake`); a trace without sessions
makes every request its own conversation.

Invariant: for a given pool, ``λ0``, horizon, warm-up and seed the stream and every number are reproducible bit
for bit; capacities below the pool's largest request (``N_min``) are infeasible (:mod:`kvhit.sim.feasibility`)
and get no hit ratio.

NOT modelled: correlation between conversations (sessions of one user, bursts), time-of-day rate changes (the
rate is constant), in-flight holds (requests are instantaneous, as in :mod:`kvhit.sim.vllm.curve`), and
conversations longer than the source trace's observation window (a conversation is as the trace recorded it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kvhit.sim.feasibility import Feasibility, feasibility
from kvhit.sim.metrics import mean_ci
from kvhit.workload.production_trace import ProductionTrace
from kvhit.workload.trace import Trace

__all__ = [
    "ConversationPool",
    "ResampleError",
    "ResampleResult",
    "ResampledStream",
    "conversation_pool",
    "resample",
    "resample_simulate",
]

ENGINES = ("vllm", "vllm-0.23", "content")
_CHUNK = 4096


class ResampleError(ValueError):
    """Invalid resampling request (the message names the argument)."""


def _csr_gather(off: np.ndarray, vals: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``rows`` of a CSR array, concatenated in that order (values and new offsets)."""
    counts = off[1:][rows] - off[:-1][rows]
    new_off = np.zeros(rows.shape[0] + 1, np.int64)
    np.cumsum(counts, out=new_off[1:])
    starts = np.repeat(off[:-1][rows], counts)
    within = np.arange(int(new_off[-1]), dtype=np.int64) - np.repeat(new_off[:-1], counts)
    return vals[starts + within], new_off


@dataclass(frozen=True)
class ConversationPool:
    """A trace's conversations as resampling units (requests grouped by conversation, in time order).

    Per request ``q`` (conversation ``c`` owns rows ``req_offsets[c]:req_offsets[c+1]``): ``rel_time`` (s since
    the conversation's first request), ``prompt_tokens`` (``T_j``), ``hash_offsets``/``hashes`` (CSR of the
    ``⌊T_j/b⌋`` full-block ids, renumbered densely: shared ids in ``[0, n_shared)``, private ids in
    ``[n_shared, n_shared + n_private)``), and for a kvhit trace ``R`` / ``R_prev`` (Algorithm 1's history sizes,
    eq. (4); ``R_prev = 0`` on a first turn). ``rate`` is the source's own conversation rate (the trace's ``λ0``
    when it records one, else ``(C − 1)`` over the span of the conversations' first requests).
    """

    req_offsets: np.ndarray
    rel_time: np.ndarray
    prompt_tokens: np.ndarray
    hash_offsets: np.ndarray
    hashes: np.ndarray
    n_shared: int
    n_private: int
    block_size: int
    rate: float
    duration: np.ndarray
    R: np.ndarray | None = None
    R_prev: np.ndarray | None = None
    source: str = ""

    @property
    def n_conversations(self) -> int:
        return int(self.req_offsets.shape[0] - 1)

    @property
    def n_requests(self) -> int:
        return int(self.prompt_tokens.shape[0])

    @property
    def N_min(self) -> int:
        """``max_j ⌈T_j/b⌉``: the smallest pool that can serve every request of the workload."""
        return int((-(-self.prompt_tokens // self.block_size)).max()) if self.n_requests else 0


def conversation_pool(source: ProductionTrace | Trace, *, block_size: int | None = None) -> ConversationPool:
    """Cut a trace into whole conversations (see the module docstring for the shared/private ids)."""
    if isinstance(source, ProductionTrace):
        n = source.n_requests
        sess = np.arange(n, dtype=np.int64) if source.session is None else np.asarray(source.session, np.int64)
        time = np.asarray(source.time, np.float64)
        T = np.asarray(source.prompt_tokens, np.int64)
        off, hs = np.asarray(source.hash_offsets, np.int64), np.asarray(source.hashes, np.int64)
        b = int(source.block_size)
        R = None
        lam = None
        name = f"{source.format}: {len(source.files)} file(s)"
    elif isinstance(source, Trace):
        from kvhit.sim.runner import block_requests

        b = int(block_size or source.block_size or 0)
        if b < 1:
            raise ResampleError("block_size: the trace records none; pass block_size=")
        rq = block_requests(source, block_size=b)
        sess = source.dense_conv().astype(np.int64)
        time = np.asarray(source["time"], np.float64)
        T = np.asarray(rq.prompt_tokens, np.int64)
        off, hs = np.asarray(rq.hash_offsets, np.int64), np.asarray(rq.hashes, np.int64)
        R = np.asarray(source["R"], np.int64)
        lam = source.meta.get("lam0")
        name = str(source.meta.get("source", "trace"))
    else:
        raise ResampleError(f"source: expected a ProductionTrace or a Trace, got {type(source).__name__}")
    n = T.shape[0]
    if n == 0:
        raise ResampleError("source: the trace has no requests")
    _, conv = np.unique(sess, return_inverse=True)
    conv = conv.astype(np.int64)
    order = np.lexsort((np.arange(n), time, conv))  # by conversation, then time, then input order
    C = int(conv.max()) + 1
    counts = np.bincount(conv, minlength=C)
    req_off = np.zeros(C + 1, np.int64)
    np.cumsum(counts, out=req_off[1:])
    t_sorted = time[order]
    first = t_sorted[req_off[:-1]]
    conv_sorted = conv[order]
    rel = t_sorted - first[conv_sorted]
    duration = t_sorted[req_off[1:] - 1] - first
    hs_sorted, hoff = _csr_gather(off, hs, order)
    # shared ids: those occurring in ≥ 2 conversations
    hconv = np.repeat(conv_sorted, np.diff(hoff))
    uid, inv = np.unique(hs_sorted, return_inverse=True)
    pairs = np.unique(inv.astype(np.int64) * C + hconv)
    nconv = np.bincount(pairs // C, minlength=uid.shape[0])
    shared = nconv >= 2
    dense = np.empty(uid.shape[0], np.int64)
    S = int(shared.sum())
    dense[shared] = np.arange(S, dtype=np.int64)
    dense[~shared] = S + np.arange(uid.shape[0] - S, dtype=np.int64)
    R_s = Rp = None
    if R is not None:
        R_s = R[order]
        Rp = np.zeros(n, np.int64)
        Rp[1:] = R_s[:-1]
        Rp[req_off[:-1]] = 0
    if lam is None:
        span = float(first.max() - first.min())
        lam = (C - 1) / span if C >= 2 and span > 0 else float("nan")
    return ConversationPool(
        req_offsets=req_off,
        rel_time=rel,
        prompt_tokens=T[order],
        hash_offsets=hoff,
        hashes=dense[inv],
        n_shared=S,
        n_private=int(uid.shape[0] - S),
        block_size=b,
        rate=float(lam),
        duration=duration,
        R=R_s,
        R_prev=Rp,
        source=name,
    )


@dataclass(frozen=True)
class ResampledStream:
    """One replication's request stream, in time order (see the module docstring).

    ``conv`` is the copy index ``k`` (dense, by start), ``origin`` the pool conversation it copies, ``measured``
    the requests in ``[0, horizon]``; ``R``/``R_prev`` only for a kvhit trace's pool.
    """

    time: np.ndarray
    prompt_tokens: np.ndarray
    hash_offsets: np.ndarray
    hashes: np.ndarray
    conv: np.ndarray
    origin: np.ndarray
    measured: np.ndarray
    block_size: int
    lam0: float
    horizon: float
    warmup: float
    seed: int
    n_started: int  #: conversations started in [0, horizon]
    starts: np.ndarray  #: start time of copy ``k``
    origins: np.ndarray  #: pool conversation of copy ``k``
    R: np.ndarray | None = None
    R_prev: np.ndarray | None = None


def _rate(pool: ConversationPool, lam0: float | None, scale: float | None) -> float:
    if (lam0 is None) == (scale is None):
        raise ResampleError("give exactly one of lam0 (conversations/s) or scale (× the trace's own rate)")
    if lam0 is not None:
        lam = lam0
        what = "lam0"
    else:
        if not math.isfinite(pool.rate) or pool.rate <= 0:
            raise ResampleError("scale: the trace has no own conversation rate (one conversation?); give lam0")
        lam = scale * pool.rate
        what = "scale"
    if not isinstance(lam, int | float) or not math.isfinite(lam) or lam <= 0:
        raise ResampleError(f"{what}: expected a finite number > 0, got {lam0 if lam0 is not None else scale!r}")
    return float(lam)


def _starts(rng, lam: float, t0: float, horizon: float | None, n_conv: int | None) -> tuple[np.ndarray, float]:
    """Poisson points of rate ``lam`` from ``t0``: up to ``horizon``, or until ``n_conv`` have started in
    ``[0, ·)`` (then the horizon is the next point). Drawn in fixed-size chunks: reproducible for a seed."""
    pts: list[np.ndarray] = []
    t = t0
    while True:
        gaps = rng.exponential(1.0 / lam, _CHUNK)
        c = t + np.cumsum(gaps)
        pts.append(c)
        t = float(c[-1])
        if horizon is not None and t > horizon:
            s = np.concatenate(pts)
            return s[s <= horizon], float(horizon)
        if n_conv is not None:
            s = np.concatenate(pts)
            after = np.flatnonzero(s >= 0.0)
            if after.shape[0] > n_conv:
                H = float(s[after[n_conv]])
                return s[s < H], H


def resample(
    pool: ConversationPool,
    *,
    lam0: float | None = None,
    scale: float | None = None,
    horizon: float | None = None,
    n_conversations: int | None = None,
    warmup: float | None = None,
    seed: int = 0,
) -> ResampledStream:
    """One replication: Poisson starts at ``λ0`` (or ``scale`` × the pool's own rate), whole conversations drawn
    uniformly with replacement, private block ids renamed per copy (module docstring).

    Give ``horizon`` (s) or ``n_conversations`` (measured starts). ``warmup`` (s) defaults to ``min(horizon, D)``
    with ``D`` the longest conversation's duration (for ``n_conversations``: ``n_conversations / λ0`` stands for
    the horizon). ``seed`` seeds ``numpy.random.default_rng``.
    """
    lam = _rate(pool, lam0, scale)
    if (horizon is None) == (n_conversations is None):
        raise ResampleError("give exactly one of horizon (s) or n_conversations")
    if horizon is not None and (not isinstance(horizon, int | float) or not math.isfinite(horizon) or horizon <= 0):
        raise ResampleError(f"horizon: expected a finite number of seconds > 0, got {horizon!r}")
    if n_conversations is not None and (
        not isinstance(n_conversations, int | np.integer) or isinstance(n_conversations, bool) or n_conversations < 1
    ):
        raise ResampleError(f"n_conversations: expected an integer >= 1, got {n_conversations!r}")
    D = float(pool.duration.max())
    if warmup is None:
        warmup = min(float(horizon if horizon is not None else n_conversations / lam), D)
    if not isinstance(warmup, int | float) or not math.isfinite(warmup) or warmup < 0:
        raise ResampleError(f"warmup: expected a finite number of seconds >= 0, got {warmup!r}")
    if not isinstance(seed, int | np.integer) or isinstance(seed, bool):
        raise ResampleError(f"seed: expected an integer, got {seed!r}")
    rng = np.random.default_rng(int(seed))
    s, H = _starts(rng, lam, -D - float(warmup), horizon, n_conversations)
    C = pool.n_conversations
    c = rng.integers(0, C, size=s.shape[0]) if s.shape[0] else np.zeros(0, np.int64)
    # keep conversations active at some t ≥ −w (start + duration ≥ −w)
    alive = s + pool.duration[c] >= -float(warmup)
    s, c = s[alive], c[alive].astype(np.int64)
    K = s.shape[0]
    ro = pool.req_offsets
    nreq = ro[1:][c] - ro[:-1][c]
    copy = np.repeat(np.arange(K, dtype=np.int64), nreq)
    rows = np.repeat(ro[:-1][c], nreq) + (
        np.arange(int(nreq.sum()), dtype=np.int64) - np.repeat(np.cumsum(nreq) - nreq, nreq)
    )
    t = s[copy] + pool.rel_time[rows]
    keep = (t >= -float(warmup)) & (t <= H)
    rows, copy, t = rows[keep], copy[keep], t[keep]
    order = np.argsort(t, kind="stable")
    rows, copy, t = rows[order], copy[order], t[order]
    hs, hoff = _csr_gather(pool.hash_offsets, pool.hashes, rows)
    S, P = pool.n_shared, pool.n_private
    if K and P and (K * P + S) >= 2**62:
        raise ResampleError("too many conversations × private blocks for 64-bit ids; shorten the horizon")
    hcopy = np.repeat(copy, np.diff(hoff))
    priv = hs >= S
    hs = np.where(priv, hs + hcopy * P, hs)
    return ResampledStream(
        time=t,
        prompt_tokens=pool.prompt_tokens[rows],
        hash_offsets=hoff,
        hashes=hs,
        conv=copy,
        origin=c[copy],
        measured=t >= 0.0,
        block_size=pool.block_size,
        lam0=lam,
        horizon=H,
        warmup=float(warmup),
        seed=int(seed),
        n_started=int(((s >= 0.0) & (s <= H)).sum()),
        starts=s,
        origins=c,
        R=None if pool.R is None else pool.R[rows],
        R_prev=None if pool.R_prev is None else pool.R_prev[rows],
    )


@dataclass(frozen=True)
class ResampleResult:
    """Per replication ``r`` and capacity ``N[k]``: ``token_hit_ratio`` (vLLM's ``prefix_cache_hits /
    prefix_cache_queries``; NaN for Algorithm 1) and ``block_hit_ratio`` (the paper's block-weighted ``h``, eq.
    (6)/(31); Algorithm 1 with the practical weight), over the measured requests; NaN where ``N`` is infeasible.
    ``horizon`` is the mean over replications (they differ with ``n_conversations``; each is in
    ``extra["horizons_s"]``). ``h`` is the one in ``metric``; :meth:`mean_ci` gives the mean and Student-t 95%
    half-width over replications (the mean of per-replication *ratios*); :meth:`stationary_ci` the stationary
    hit ratio (a ratio of expectations, see there). ``token_queries`` / ``block_queries``: each ratio's
    denominator (``Σ T_j`` / ``Σ ⌈T_j/b⌉`` over the measured admitted requests), same shape."""

    N: np.ndarray
    engine: str
    metric: str
    lam0: float
    horizon: float
    warmup: float
    seeds: list[int]
    token_hit_ratio: np.ndarray
    block_hit_ratio: np.ndarray
    feasibility: Feasibility
    n_measured: list[int]
    n_started: list[int]
    extra: dict = field(default_factory=dict)
    token_queries: np.ndarray | None = None
    block_queries: np.ndarray | None = None
    #: per replication and pool conversation: measured prompt tokens of its copies (control variates)
    control_tokens: np.ndarray | None = None
    #: their known expectation ``λ0·H·T_k/C`` (``T_k`` the pool conversation's prompt tokens; only with a fixed
    #: horizon ``H``, else None)
    control_mean: np.ndarray | None = None

    @property
    def h(self) -> np.ndarray:
        return self.token_hit_ratio if self.metric == "tokens" else self.block_hit_ratio

    @property
    def queries(self) -> np.ndarray | None:
        """Denominator of :attr:`h` per replication and capacity (None for a result built without them)."""
        return self.token_queries if self.metric == "tokens" else self.block_queries

    def stationary_ci(self, level: float = 0.95, controls: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The stationary hit ratio ``E[hits]/E[queries]`` and its ``level`` half-width, per capacity.

        The long-run hit ratio of the stationary stream is a ratio of expectations (the hits and queries of
        a replication scale together with the number of conversations it happens to contain); the mean of
        per-replication ratios (:meth:`mean_ci`) is a different number, biased towards replications with few
        queries. Estimator: ``R̂ = Σ_i x_i / Σ_i q_i`` (``x_i = h_i q_i`` the hits of replication ``i``); its
        half-width is the delta-method one, ``t_{n−1} · s_d / (√n · q̄)`` with ``s_d`` the sample standard
        deviation of the residuals ``d_i = x_i − R̂ q_i`` — i.e. the queries act as a control variate for the
        hits. NaN where infeasible; ∞ half-width with one replication. Falls back to :meth:`mean_ci` when the
        denominators were not recorded.

        ``controls`` (with a fixed horizon and more replications than pool conversations + 2): the measured
        prompt tokens of each pool conversation's copies, ``c_ik``, have the known mean ``μ_k = λ0·H·T_k/C``
        (each request of a copy started at ``s`` is measured iff ``s + τ ∈ [0, H]``; starts are Poisson on a
        range covering ``[−D−w, H]``). They are used as control variates (regression estimator):
        ``R̂ = (x̄ − β_x·(c̄ − μ)) / (q̄ − β_q·(c̄ − μ))`` with ``β`` the least-squares slopes, and the half-width
        from the regression residuals of ``x − R̂ q`` (``n − 1 − C`` degrees of freedom). Which conversations a
        replication happened to draw is most of its hit ratio's variance; the controls remove that part."""
        q = self.queries
        if q is None:
            return self.mean_ci()
        from scipy import stats

        h = self.h
        K = h.shape[1]
        m = np.full(K, np.nan)
        hw = np.full(K, np.nan)
        ct, mu = self.control_tokens, self.control_mean
        for k in range(K):
            if not self.feasibility.feasible[k]:
                continue
            ok = np.isfinite(h[:, k]) & (q[:, k] > 0)
            n = int(ok.sum())
            if n == 0:
                continue
            qq = q[ok, k].astype(np.float64)
            x = h[ok, k] * qq
            use = controls and ct is not None and mu is not None and n >= ct.shape[1] + 3
            if use:
                c = ct[ok].astype(np.float64) / qq.mean()  # scaled: a well-conditioned design
                cm = mu / qq.mean()
                Z = np.column_stack([np.ones(n), c - c.mean(axis=0)])
                bx = np.linalg.lstsq(Z, x, rcond=None)[0][1:]
                bq = np.linalg.lstsq(Z, qq, rcond=None)[0][1:]
                gap = c.mean(axis=0) - cm
                xt = x.mean() - float(bx @ gap)
                qt = qq.mean() - float(bq @ gap)
                m[k] = float(xt / qt)
                d = x - m[k] * qq
                e = d - Z @ np.linalg.lstsq(Z, d, rcond=None)[0]
                dof = n - 1 - c.shape[1]
                s_e = math.sqrt(float(e @ e) / dof)
                hw[k] = float(stats.t.ppf(0.5 + level / 2, dof) * s_e / (math.sqrt(n) * qt))
                continue
            m[k] = float(x.sum() / qq.sum())
            if n == 1:
                hw[k] = float("inf")
                continue
            d = x - m[k] * qq
            hw[k] = float(stats.t.ppf(0.5 + level / 2, n - 1) * d.std(ddof=1) / (math.sqrt(n) * qq.mean()))
        return m, hw

    def mean_ci(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and 95% half-width per capacity (NaN where infeasible; ∞ half-width with one replication)."""
        h = self.h
        m = np.full(h.shape[1], np.nan)
        hw = np.full(h.shape[1], np.nan)
        for k in range(h.shape[1]):
            if self.feasibility.feasible[k]:
                m[k], hw[k] = mean_ci(h[:, k])
        return m, hw

    def to_dict(self) -> dict:
        m, hw = self.mean_ci()
        return {
            "N": self.N.tolist(),
            "engine": self.engine,
            "metric": self.metric,
            "lam0": self.lam0,
            "horizon_s": self.horizon,
            "horizons_s": self.extra.get("horizons_s", []),
            "warmup_s": self.warmup,
            "replications": len(self.seeds),
            "seeds": self.seeds,
            "h_mean": m.tolist(),
            "h_ci95": hw.tolist(),
            "h_stationary": self.stationary_ci()[0].tolist(),
            "h_stationary_ci95": self.stationary_ci()[1].tolist(),
            "h": self.h.tolist(),
            "token_hit_ratio": self.token_hit_ratio.tolist(),
            "block_hit_ratio": self.block_hit_ratio.tolist(),
            "feasibility": self.feasibility.to_dict(),
            "n_measured": self.n_measured,
            "conversations_started": self.n_started,
        }


def _simulate_stream(st: ResampledStream, Ns: np.ndarray, engine: str) -> tuple[np.ndarray, ...]:
    """(token ratio, block ratio, token queries, block queries) of one stream at the feasible capacities ``Ns``."""
    if not st.measured.any() or Ns.shape[0] == 0:
        nan = np.full(Ns.shape, np.nan)
        return nan, nan, np.zeros(Ns.shape), np.zeros(Ns.shape)
    if engine == "content":
        from kvhit.sim.content.stackdist import content_curve_from_thresholds, content_hit_thresholds

        thr = content_hit_thresholds(st.conv, st.R)
        w = np.where(st.measured, np.maximum(st.R_prev - 1, 0), 0)  # practical weight, eq. (31)
        den = float(st.R[st.measured].sum())
        h = content_curve_from_thresholds(thr, w, Ns) / den
        return np.full(Ns.shape, np.nan), np.asarray(h, float), np.full(Ns.shape, np.nan), np.full(Ns.shape, den)
    from kvhit.sim.vllm.curve import block_curve

    c = block_curve(
        st.prompt_tokens,
        st.hash_offsets,
        st.hashes,
        block_size=st.block_size,
        Ns=Ns,
        engine=engine,
        mask=st.measured,
    )
    return (
        np.asarray(c["token_hit_ratio"], float),
        np.asarray(c["block_hit_ratio"], float),
        np.asarray(c["prompt_tokens"], float),
        np.asarray(c["prompt_blocks"], float),
    )


def resample_simulate(
    pool: ConversationPool,
    Ns,
    *,
    engine: str = "vllm",
    metric: str = "tokens",
    lam0: float | None = None,
    scale: float | None = None,
    horizon: float | None = None,
    n_conversations: int | None = None,
    warmup: float | None = None,
    replications: int = 5,
    seed: int = 0,
) -> ResampleResult:
    """Exact hit ratio at every capacity in ``Ns`` on ``replications`` resampled streams (seed ``seed + r``).

    ``engine``: ``"vllm"`` (≥ 0.24 free-queue order), ``"vllm-0.23"`` or ``"content"`` (Algorithm 1, practical
    weight; needs a kvhit trace's pool and ``metric="blocks"``). Capacities below :attr:`ConversationPool.N_min`
    are infeasible: not simulated, NaN, with the refused shares of the pool's requests in ``feasibility``.
    """
    if engine not in ENGINES:
        raise ResampleError(f"engine: expected one of {ENGINES}, got {engine!r}")
    if metric not in ("tokens", "blocks"):
        raise ResampleError(f"metric: expected tokens or blocks, got {metric!r}")
    if engine == "content":
        if pool.R is None:
            raise ResampleError("engine: 'content' (Algorithm 1) needs a kvhit trace (history sizes R), not block ids")
        metric = "blocks"
    if not isinstance(replications, int | np.integer) or isinstance(replications, bool) or replications < 1:
        raise ResampleError(f"replications: expected an integer >= 1, got {replications!r}")
    N = np.atleast_1d(np.asarray(Ns))
    if N.ndim != 1 or N.size == 0 or not np.issubdtype(N.dtype, np.integer) or int(N.min()) < 1:
        raise ResampleError("Ns: expected a non-empty list of integer capacities >= 1")
    N = N.astype(np.int64)
    feas = feasibility(pool.prompt_tokens, pool.block_size, N)
    ok = feas.feasible
    K = N.shape[0]
    tok = np.full((replications, K), np.nan)
    blk = np.full((replications, K), np.nan)
    tq = np.full((replications, K), np.nan)
    bq = np.full((replications, K), np.nan)
    seeds, nm, ns, hz = [], [], [], []
    C = pool.n_conversations
    ctl = np.zeros((replications, C))
    W = lam = float("nan")
    for r in range(int(replications)):
        st = resample(
            pool,
            lam0=lam0,
            scale=scale,
            horizon=horizon,
            n_conversations=n_conversations,
            warmup=warmup,
            seed=int(seed) + r,
        )
        t, b, qt, qb = _simulate_stream(st, N[ok], engine)
        tok[r, ok], blk[r, ok], tq[r, ok], bq[r, ok] = t, b, qt, qb
        ctl[r] = np.bincount(st.origin[st.measured], weights=st.prompt_tokens[st.measured], minlength=C)
        seeds.append(int(seed) + r)
        nm.append(int(st.measured.sum()))
        ns.append(st.n_started)
        hz.append(st.horizon)
        W, lam = st.warmup, st.lam0
    return ResampleResult(
        N=N,
        engine=engine,
        metric=metric,
        lam0=lam,
        horizon=float(np.mean(hz)),
        warmup=W,
        seeds=seeds,
        token_hit_ratio=tok,
        block_hit_ratio=blk,
        feasibility=feas,
        n_measured=nm,
        n_started=ns,
        extra={"horizons_s": hz, "pool": pool.source, "pool_rate": pool.rate},
        token_queries=tq,
        block_queries=bq,
        control_tokens=ctl,
        control_mean=None if horizon is None else _control_mean(pool, lam, float(horizon)),
    )


def _control_mean(pool: ConversationPool, lam: float, horizon: float) -> np.ndarray:
    """``E[c_k] = λ0·H·T_k/C``: the expected measured prompt tokens of pool conversation ``k``'s copies."""
    Tk = np.add.reduceat(pool.prompt_tokens.astype(np.float64), pool.req_offsets[:-1])
    return lam * horizon * Tk / pool.n_conversations
