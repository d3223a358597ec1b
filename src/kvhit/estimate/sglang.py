"""Engine-aware hit-ratio estimator of SGLang's radix cache (docs/estimators.md §7).

The model estimated is :mod:`kvhit.sim.sglang.engine` (SGLang 0.5.23, read from the wheel; its docstring cites
``radix_cache.py``, ``common.py``, ``allocator/``, ``schedule_batch.py``). The estimator is the mean-field
argument of the paper (App. B.4, Lemma D.1–D.4, eq. (38)–(39)) with SGLang's accounting in place of Ê[B] and
Â_H^hash, exactly as :func:`kvhit.estimate.engine.estimate_engine` does for vLLM, and shares its machinery
(:class:`kvhit.estimate.accounting.EngineAccounting`, the displacement moments and the Gaussian occupancy law G).

Per conversation i, turn j (prompt T_j tokens, n_j output tokens, page size p, everything in pages):

* **cached responses** – on finish SGLang inserts prompt + output − 1 tokens: the conversation's chain after
  turn j is c_j = ⌊(T_j + max(n_j, 1) − 1)/p⌋ pages (not ⌊T_j/b⌋ as for a prefill-only vLLM);
* **displacement** – new_j = c_j − c_{j−1} pages go to the MRU end, hist_j = c_j pages move on a revisit
  (E_B = E c_M, A = E Σ_{j<M} c_j in eq. (38));
* **token hit cap** – a revisit matches at most ⌊(T_{j+1} − 1)/p⌋ pages (``Req._compute_max_prefix_len``);
* **whole-leaf eviction** – the chain is a path of nodes with boundaries at every ⌊T_k/p⌋ (prompt end,
  ``split_prompt``) and c_k (output end) for k ≤ j, so its outputs are a leaf evicted before its prompt. All
  nodes carry the finish time; eviction pops the LRU leaf and frees it whole, then its parent. A tagged node
  [s, e) therefore survives a gap iff D + e ≤ C' — the tokens pushed by others since (D) plus the own tokens
  between the root and the node's end — and the hit is Σ_nodes len·P(D ≤ C' − e), cut at the cap. (The
  overshoot of a whole-node eviction frees *older* nodes only: it does not change the tagged condition.)
* **capacity** – C tokens = C/p pages; C' = C/p − o with o = 0 for p = 1 and, for p > 1, one page of the
  conservative prefill/decode demand plus the request's partial last page (its share of requests), freed at
  finish but allocated at the moment the shortfall is evicted;
* **shared prefixes** (traces with token ids) – a prefix shared with g − 1 other conversations (the chat
  template's first tokens; duplicated first messages) sits in its own node, touched by every request of the
  group: hit with probability max(P_own, q), q = (1 − 1/g)(1 − exp(−ρ τ(C' − e))), ρ = λ0 E[M] (g − 1)/L the
  group's request rate, τ the mean-field inverse of eq. (38).

Rejection: a request needs ⌈(T + n − 1)/p⌉ + 1{p > 1} pages at once (``fits``); above C it never runs, counts
as a miss of its whole prompt (as :meth:`kvhit.sim.sglang.radix.RadixResult.token_hit_ratio`), and displaces nothing,
nor do the later turns of its conversation (their prompts are longer).

Invariant: h ≤ h_max, h → h_max as C → ∞ (every node survives), nondecreasing in C.
NOT modelled: in-flight holds (locked nodes, FIFO waits), the boundaries a partial hit erases (the rest of the
history is re-inserted as one node; :mod:`kvhit.estimate.sglang_agentic` models it, chat revisits rarely hit
partially), divergent continuations (a prompt that does not extend the
previous turn's tokens), HiCache, eviction policies other than LRU, and the warm-up transient in the
stationary form (:func:`estimate_sglang_window` has it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit
from scipy.special import ndtr

from kvhit.estimate.accounting import EngineAccounting
from kvhit.estimate.displacement import _phi_table_kernel
from kvhit.estimate.engine import _bilinear
from kvhit.estimate.occupancy import _fluct_grid, _Occupancy, _PrefixVariance, _resolve_F
from kvhit.estimate.occupancy_shifted import shifted_G_sums, shifted_G_values
from kvhit.estimate.sglang_window_sums import _node_cumsums, _revisit_moments, _window_hits_series
from kvhit.estimate.trace_stats import EstimateError, _conv_layout, trace_moments
from kvhit.workload.dists import Interarrival
from kvhit.workload.trace import Trace

__all__ = ["SglangAccounting", "SglangEstimate", "sglang_accounting", "estimate_sglang", "estimate_sglang_window"]


@dataclass(frozen=True, eq=False)
class SglangAccounting:
    """SGLang's accounting of the selected conversations (module docstring), all lengths in pages.

    ``acc`` carries the displacement (new/hist per turn in pages, conversation-major rows), ``need`` per row
    (pages a request needs at once) and the demand T_j (tokens). Node table of the revisits: revisit k (row
    ``rev_row[k]``, turn ≥ 2) has own nodes ``node_end[node_ptr[k]:node_ptr[k+1]]`` (end position from the
    root, pages) with hit lengths ``node_len`` (cut at the cap). Shared-prefix segments per row (every row):
    ``seg_end``, ``seg_len``, ``seg_g`` (group size), between ``seg_ptr``; ``seg_own`` says the own chain
    holds the segment too (a revisit). ``E_M``: mean turns per conversation (the shared prefixes' rates).
    """

    acc: EngineAccounting
    page_size: int
    cap_offset: float
    demand: np.ndarray
    need: np.ndarray
    rev_row: np.ndarray
    node_ptr: np.ndarray
    node_end: np.ndarray
    node_len: np.ndarray
    seg_ptr: np.ndarray
    seg_end: np.ndarray
    seg_len: np.ndarray
    seg_g: np.ndarray
    seg_own: np.ndarray
    E_M: float
    L_all: int
    shared: bool
    meta: dict = field(default_factory=dict)

    @property
    def h_max(self) -> float:
        """Ceiling at an unbounded pool: every own node hits, and every shared segment — a revisit's for sure
        (its own chain holds it), a first turn's with probability 1 − 1/g (an earlier group member inserted it)."""
        tot = self.demand.sum()
        if tot <= 0:
            return math.nan
        sh = (self.seg_len * np.where(self.seg_own, 1.0, 1.0 - 1.0 / np.maximum(self.seg_g, 1))).sum()
        return float(self.page_size * (self.node_len.sum() + sh) / tot)

    @property
    def max_need(self) -> int:
        return int(self.need.max()) if self.need.size else 0


@dataclass(frozen=True, eq=False)
class SglangEstimate:
    """Result of :func:`estimate_sglang` / :func:`estimate_sglang_window` (arrays like ``C``; floats for a
    scalar). ``C`` in tokens; ``rejected_share``: share of the requests that never run at C."""

    h: Any
    h_max: float
    C: Any
    lam0: float
    page_size: int
    fluctuations: bool
    shared: bool
    form: str
    rejected_share: Any


# ----------------------------------------------------------------------------------------------------------
# accounting
# ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def _chain_nodes(conv_ptr, prompt_pg, cached, cap, S, out_ptr, out_end, out_len, out_row):  # pragma: no cover
    """Own nodes of the chain each revisit finds (module docstring): boundaries {⌊T_k/p⌋, c_k, the split a
    capped match leaves} for the turns k before the revisit, above the shared prefix S of the conversation;
    lengths cut at the revisit's cap. Returns the number of revisits written."""
    nrev = 0
    nn = 0
    out_ptr[0] = 0
    for c in range(conv_ptr.size - 1):
        p0 = conv_ptr[c]
        p1 = conv_ptr[c + 1]
        M = p1 - p0
        bnd = np.empty(3 * M + 1, np.int64)
        nb = 0
        s0 = S[c]
        for i in range(M - 1):
            r = p0 + i
            # boundaries of turn i
            if i > 0 and cap[r] < cached[r - 1]:
                bnd[nb] = cap[r]
                nb += 1
            bnd[nb] = prompt_pg[r]
            nb += 1
            bnd[nb] = cached[r]
            nb += 1
            top = cached[r]
            lim = min(top, cap[r + 1])
            b = np.sort(bnd[:nb])
            prev = s0
            for k in range(nb):
                e = b[k]
                if e <= prev or e > top:
                    continue
                ln = min(e, lim) - min(prev, lim)
                if ln > 0:
                    out_end[nn] = e
                    out_len[nn] = ln
                    nn += 1
                prev = e
            out_row[nrev] = r + 1
            nrev += 1
            out_ptr[nrev] = nn
    return nrev


@njit(cache=True)
def _runmins(lcp, k, step, L, vals, cnts):  # pragma: no cover - numba
    """Distinct running minima (decreasing, > 0) of lcp walking from sorted position k (left: step −1, reading
    lcp[k−1], lcp[k−2], …; right: step +1, reading lcp[k], lcp[k+1], …) with how many streams each covers."""
    nv = 0
    m = 1 << 62
    j = k - 1 if step < 0 else k
    while 0 <= j < L - 1:
        v = lcp[j]
        if v < m:
            m = v
            if m <= 0:
                break
            vals[nv] = m
            cnts[nv] = 0
            nv += 1
        cnts[nv - 1] += 1
        j += step
    return nv


@njit(cache=True)
def _shared_groups(lcp, rank, S_out, seg_ptr, seg_hi, seg_g, write):  # pragma: no cover - numba
    """(``write=False``: only count the segments.) For each conversation (sorted position rank[c]) the steps
    of g(ℓ) = #conversations sharing ≥ ℓ tokens with it: segment t covers its tokens [hi_{t+1}, hi_t) shared by
    g_t conversations (hi decreasing). ``lcp[k]`` is the common prefix of sorted streams k and k + 1."""
    L = rank.size
    n = 0
    seg_ptr[0] = 0
    lv = np.empty(L, np.int64)
    lc = np.empty(L, np.int64)
    rv = np.empty(L, np.int64)
    rc = np.empty(L, np.int64)
    for c in range(L):
        k = rank[c]
        nl = _runmins(lcp, k, -1, L, lv, lc)
        nr = _runmins(lcp, k, 1, L, rv, rc)
        S_out[c] = max(lv[0] if nl else 0, rv[0] if nr else 0)
        i = 0
        j = 0
        g = 1
        while i < nl or j < nr:  # merge the two decreasing sequences
            if j >= nr or (i < nl and lv[i] >= rv[j]):
                hi = lv[i]
            else:
                hi = rv[j]
            while i < nl and lv[i] == hi:
                g += lc[i]
                i += 1
            while j < nr and rv[j] == hi:
                g += rc[j]
                j += 1
            if write:
                seg_hi[n] = hi
                seg_g[n] = g
            n += 1
        seg_ptr[c + 1] = n
    return n


def _conversation_streams(trace: Trace, ids: np.ndarray) -> list[np.ndarray]:
    """Token ids of each conversation (id order): its turns' new tokens, in turn order."""
    _, dense, order = trace.conv_index()
    parts: list[list[np.ndarray]] = [[] for _ in range(ids.size)]
    new = trace.lists["new_tokens"]
    for r in order:
        parts[dense[r]].append(np.asarray(new[r], dtype=np.int64))
    return [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]


def _shared_prefixes(trace: Trace, p: int):
    """Per conversation (id order): hot-prefix length S (pages) and its segments (end in pages, group size)."""
    ids = trace.conv_index()[0]
    seqs = _conversation_streams(trace, ids)
    L = len(seqs)
    order = sorted(range(L), key=lambda c: seqs[c].astype(">i8").tobytes())
    lcp = np.zeros(max(L - 1, 0), np.int64)
    for k in range(L - 1):
        a, b = seqs[order[k]], seqs[order[k + 1]]
        m = min(a.size, b.size)
        ne = np.flatnonzero(a[:m] != b[:m])
        lcp[k] = int(ne[0]) if ne.size else m
    rank = np.empty(L, np.int64)
    rank[np.asarray(order, np.int64)] = np.arange(L)
    S = np.zeros(L, np.int64)
    ptr = np.zeros(L + 1, np.int64)
    n = _shared_groups(lcp, rank, S, ptr, np.zeros(1, np.int64), np.zeros(1, np.int64), False)
    hi = np.zeros(n, np.int64)
    g = np.zeros(n, np.int64)
    _shared_groups(lcp, rank, S, ptr, hi, g, True)
    return S // p, ptr, hi[:n] // p, g[:n]


def sglang_accounting(
    trace: Trace,
    *,
    page_size: int = 1,
    block_size: int | None = None,
    mask: Any = None,
    rows: Any = None,
    shared: bool | str = "auto",
    incomplete: str = "error",
) -> SglangAccounting:
    """SGLang's accounting (module docstring) of the selected conversations of a kvhit trace.

    Prompt T_j: ``cum_tokens`` (else the practical model T_j = R_j·b − 1, eq. (28)); output n_j:
    ``response_tokens`` (else 0: only the prompt is cached). The next turn's prompt is taken to extend the
    cached chain (a kvhit conversation stream). ``shared="auto"``: shared prefixes from the token ids when the
    trace has them (``new_tokens``), none otherwise.
    """
    if not isinstance(trace, Trace):
        raise EstimateError(f"trace: expected a Trace, got {type(trace).__name__}")
    if isinstance(page_size, bool) or not isinstance(page_size, int | np.integer) or page_size < 1:
        raise EstimateError(f"page_size: expected a positive integer, got {page_size!r}")
    p = int(page_size)
    mom = trace_moments(trace, mask, rows=rows, incomplete=incomplete)
    sel = mom.per_conversation["conv"]
    order, conv, starts, counts, conv_ptr, first, last, offsets = _conv_layout(trace, sel)
    if "cum_tokens" in trace.cols:
        T = np.asarray(trace["cum_tokens"], dtype=np.int64)[order]
    else:
        b = int(block_size or trace.block_size or 0)
        if b < 1:
            raise EstimateError("block_size: unknown (the trace has no cum_tokens and no block_size)")
        T = np.asarray(trace["R"], dtype=np.int64)[order] * b - 1
    if (T < 1).any():
        raise EstimateError("cum_tokens: every prompt needs at least one token")
    if (np.diff(T)[~first[1:]] < 0).any():
        raise EstimateError("cum_tokens: the prompt T_j must not shrink within a conversation (cumulative)")
    n = (
        np.asarray(trace["response_tokens"], dtype=np.int64)[order]
        if "response_tokens" in trace.cols
        else np.zeros(T.size, np.int64)
    )
    if (n < 0).any():
        raise EstimateError("response_tokens: expected ≥ 0")
    n1 = np.maximum(n, 1)
    cached = (T + n1 - 1) // p
    prompt_pg = T // p
    cap = (T - 1) // p
    need = -(-(T + n1 - 1) // p) + (1 if p > 1 else 0)
    prev = np.where(first, 0, np.concatenate([[0], cached[:-1]]))
    new = np.maximum(cached - prev, 0).astype(float)
    hist = cached.astype(float)
    # shared prefixes (token ids), per selected conversation
    ids_all = trace.conv_index()[0]
    use_shared = ("new_tokens" in trace.lists) if shared == "auto" else bool(shared)
    if use_shared and "new_tokens" not in trace.lists:
        raise EstimateError("shared: needs the trace's token ids (new_tokens; kvhit trace sharegpt --token-ids)")
    pos = np.searchsorted(ids_all, sel)
    if use_shared:
        S_all, sptr, shi, sg = _shared_prefixes(trace, p)
        S = S_all[pos]
    else:
        S = np.zeros(sel.size, np.int64)
    # own nodes of every revisit
    nrev_max = int(conv.size - sel.size)
    Mi = counts.astype(np.int64)
    nn_max = int((Mi * (Mi - 1) * 3 // 2).sum()) + 1  # ≤ 3 boundaries per earlier turn
    out_ptr = np.zeros(nrev_max + 1, np.int64)
    out_end = np.zeros(nn_max, np.int64)
    out_len = np.zeros(nn_max, np.int64)
    out_row = np.zeros(nrev_max, np.int64)
    nrev = _chain_nodes(conv_ptr, prompt_pg, cached, cap, S, out_ptr, out_end, out_len, out_row)
    nn = int(out_ptr[nrev])
    # shared segments per row: the conversation's segments cut at the row's cap
    seg_rows: list = []
    if use_shared:
        se, sl, sgg, so, sp = [], [], [], [], [0]
        cid = np.repeat(np.arange(sel.size), counts)
        for r in range(conv.size):
            c = pos[cid[r]]
            his = shi[sptr[c] : sptr[c + 1]][::-1]  # increasing ends
            gs = sg[sptr[c] : sptr[c + 1]][::-1]
            lo = 0
            for hi_, g_ in zip(his, gs, strict=True):
                ln = min(int(hi_), int(cap[r])) - min(lo, int(cap[r]))
                if ln > 0:
                    se.append(int(hi_))
                    sl.append(ln)
                    sgg.append(int(g_))
                    so.append(not first[r])
                lo = int(hi_)
            sp.append(len(se))
        seg_rows = [np.asarray(x) for x in (sp, se, sl, sgg, so)]
    else:
        seg_rows = [np.zeros(conv.size + 1, np.int64), *(np.zeros(0, np.int64) for _ in range(3)), np.zeros(0, bool)]
    seg_ptr, seg_end, seg_len, seg_g, seg_own = seg_rows
    # offset: one page of conservative demand + the partial last page (p > 1)
    o = 0.0 if p == 1 else 1.0 + float(np.mean((T + n1 - 1) % p != 0))
    L = int(starts.size)
    nl = ~last
    demand = T.astype(float)
    acc = EngineAccounting(
        engine="sglang",
        metric="tokens",
        accounting="engine",
        block_size=p,
        L=L,
        E_B=float(new.sum() / L),
        A=float(hist[nl].sum() / L),
        A_R=float(demand.sum() / L),
        A_hit=float(p * out_len[:nn].sum() / L),
        unit=float(p),
        cap_offset=0,
        mode="nodes",
        reuse=hist[nl],
        size=hist[nl],
        W=mom.W,
        lam0_hat=mom.lam0_hat,
        conv_ptr=conv_ptr,
        offsets=offsets,
        cum_new=np.cumsum(new) - np.repeat(np.cumsum(new)[starts] - new[starts], counts),
        hist_all=hist,
        need=need,
        new_all=new,
        demand_all=demand,
    )
    return SglangAccounting(
        acc=acc,
        page_size=p,
        cap_offset=o,
        demand=demand,
        need=need,
        rev_row=out_row[:nrev].copy(),
        node_ptr=out_ptr[: nrev + 1].copy(),
        node_end=out_end[:nn].copy(),
        node_len=out_len[:nn].copy(),
        seg_ptr=np.asarray(seg_ptr, np.int64),
        seg_end=np.asarray(seg_end, np.int64),
        seg_len=np.asarray(seg_len, np.int64),
        seg_g=np.asarray(seg_g, np.int64),
        seg_own=np.asarray(seg_own, bool),
        E_M=float(conv.size / L),
        L_all=int(ids_all.size),
        shared=bool(use_shared),
        meta={"selected_conversations": L},
    )


# ----------------------------------------------------------------------------------------------------------
# estimators
# ----------------------------------------------------------------------------------------------------------


def _pool_pages(C: Any, p: int) -> np.ndarray:
    a = np.asarray(C, dtype=float)
    if a.size == 0:
        raise EstimateError("C: empty")
    if not np.isfinite(a).all() or (a < p).any() or (a != np.round(a)).any():
        raise EstimateError(f"C: pool sizes must be integers ≥ the page size ({p}) tokens")
    return np.floor(a / p)


def _source(source, page_size, block_size, mask, shared) -> SglangAccounting:
    if isinstance(source, SglangAccounting):
        return source
    if isinstance(source, Trace):
        return sglang_accounting(source, page_size=page_size, block_size=block_size, mask=mask, shared=shared)
    raise EstimateError(f"source: expected a Trace or SglangAccounting, got {type(source).__name__}")


def _lam(lam0: Any, acc: EngineAccounting) -> float:
    if lam0 is None:
        lam0 = acc.lam0_hat
    lam = float(lam0)
    if not (math.isfinite(lam) and lam > 0):
        raise EstimateError("lam0: must be finite and > 0 (not given and not estimable from the trace)")
    return lam


def _shared_q(g: np.ndarray, sa: SglangAccounting, G: _Occupancy, x: np.ndarray, lam: float) -> np.ndarray:
    """q = (1 − 1/g)(1 − exp(−ρ τ(x))) for shared segments of group sizes g at slack x = C' − e."""
    g = np.asarray(g, dtype=float)
    rho = lam * sa.E_M * (g - 1.0) / max(sa.L_all, 1)
    xu, xi = np.unique(np.maximum(x, 0.0), return_inverse=True)
    tau = G.tau(xu)[xi.ravel()]
    q = (1.0 - 1.0 / g) * (1.0 - np.exp(-rho * tau))
    return np.where(x >= 0, q, 0.0)


def estimate_sglang(
    source: Trace | SglangAccounting,
    C: Any,
    lam0: float | None = None,
    F: Interarrival | str = "empirical",
    *,
    page_size: int = 1,
    fluctuations: bool = True,
    rejection: bool = True,
    block_size: int | None = None,
    mask: Any = None,
    shared: bool | str = "auto",
    series: bool = True,
) -> SglangEstimate:
    """Stationary SGLang estimate at pool sizes ``C`` (tokens): ĥ = p·Σ_revisits Σ_nodes len·G(C' − e)
    (+ shared segments) / Σ_requests T (module docstring; docs/estimators.md §7). G is
    :class:`kvhit.estimate.occupancy._Occupancy` of the SGLang accounting (eq. (38) mean field, Gaussian fluctuations
    of Lemma D.1 with ``fluctuations=True``); with ``rejection`` the requests that cannot run at C are misses
    and displace nothing (:meth:`kvhit.estimate.accounting.EngineAccounting.admitted`, in pages). ``series``
    (with fluctuations): the node sum Σ len·G(C' − e) by :func:`kvhit.estimate.occupancy_shifted.shifted_G_sums`
    and G at the shared segments' ends by :func:`~kvhit.estimate.occupancy_shifted.shifted_G_values` where every
    end is below C' (the same up to rounding; ``False``: G at every (C', e), the reference)."""
    sa = _source(source, page_size, block_size, mask, shared)
    acc = sa.acc
    p = sa.page_size
    Cs = np.asarray(C, dtype=float)
    Cp = _pool_pages(Cs, p).ravel()
    lam = _lam(lam0, acc)
    Fr = _resolve_F(F, acc.W)
    total = float(sa.demand.sum())
    h = np.zeros(Cp.shape)
    rej = np.zeros(Cp.shape)
    thr = np.unique(sa.need)
    key = np.searchsorted(thr, Cp, side="right") if rejection else np.full(Cp.shape, thr.size)
    rev_need = sa.need[sa.rev_row]
    seg_rows = np.repeat(np.arange(sa.demand.size), np.diff(sa.seg_ptr))
    pv = None
    for k in np.unique(key):
        sub = key == k
        n_adm = float(thr[k - 1]) if k else 0.0
        full = k == thr.size
        acc_g = acc if full else acc.admitted(n_adm)
        rej[sub] = 0.0 if full else float((sa.need > n_adm).mean())
        if total <= 0 or acc_g.E_B <= 0 or not k:
            continue
        v1 = None
        if fluctuations and not full:
            if pv is None:
                pv = _PrefixVariance(acc, _fluct_grid(Fr)[2])
            v1 = pv.v1(n_adm)
        G = _Occupancy(acc_g, Fr, lam, fluctuations, v1=v1)
        kr = np.repeat(full or rev_need <= n_adm, np.diff(sa.node_ptr)) if not full else slice(None)
        eu, inv = np.unique(sa.node_end[kr], return_inverse=True)
        wu = np.bincount(inv, weights=sa.node_len[kr].astype(float), minlength=eu.size)
        ks = np.ones(sa.seg_end.size, bool) if full else sa.need[seg_rows] <= n_adm
        # shared segments grouped by (end, group size, own chain): their total length
        sk = np.stack([sa.seg_end[ks], sa.seg_g[ks], sa.seg_own[ks].astype(np.int64)], axis=1)
        su, sinv = np.unique(sk, axis=0, return_inverse=True) if sk.size else (np.zeros((0, 3), np.int64), None)
        sw = np.bincount(sinv.ravel(), weights=sa.seg_len[ks].astype(float), minlength=su.shape[0]) if sk.size else None
        idx = np.flatnonzero(sub)
        cs = Cp[idx] - sa.cap_offset
        node_hits = np.full(idx.size, np.nan)
        if eu.size and G.fluct and series:  # every node end below the pool: Σ w·G(c − e) by the series
            ok = cs - float(eu.max()) >= 0
            node_hits[ok] = shifted_G_sums(G, eu, wu, cs[ok])
        own_G = None
        if su.shape[0] and G.fluct and series:  # G at the shared segments' distinct ends, by the series
            se, s_inv = np.unique(su[:, 0], return_inverse=True)
            s_inv = s_inv.ravel()
            s_ok = cs - float(se.max()) >= 0
            own_G = np.full((idx.size, se.size), np.nan)
            own_G[s_ok] = shifted_G_values(G, se, cs[s_ok])
        for r, (i, c, nh) in enumerate(zip(idx, cs, node_hits, strict=True)):
            hits = (nh if nh == nh else float(wu @ G(c - eu.astype(float)))) if eu.size else 0.0
            if su.shape[0]:
                x = c - su[:, 0].astype(float)
                q = _shared_q(su[:, 1], sa, G, x, lam)
                gx = own_G[r][s_inv] if own_G is not None and s_ok[r] else G(x)
                own = np.where(su[:, 2] > 0, gx, 0.0)
                hits += float((sw * np.maximum(q, own)).sum())
            h[i] = p * hits / total
    shape = Cs.shape
    scalar = Cs.ndim == 0
    return SglangEstimate(
        h=float(h[0]) if scalar else h.reshape(shape),
        h_max=sa.h_max,
        C=float(Cs) if scalar else Cs,
        lam0=lam,
        page_size=p,
        fluctuations=bool(fluctuations),
        shared=sa.shared,
        form="stationary",
        rejected_share=float(rej[0]) if scalar else rej.reshape(shape),
    )


def estimate_sglang_window(
    trace: Trace,
    C: Any,
    lam0: float,
    *,
    window: Any = None,
    page_size: int = 1,
    fluctuations: bool = True,
    origin: float | None = 0.0,
    shared: bool | str = "auto",
    n_t: int = 96,
    n_s: int = 48,
) -> SglangEstimate:
    """The SGLang estimator on the rows a measurement counts (window-exact form, as
    :func:`kvhit.estimate.engine.estimate_window` for vLLM): each counted revisit uses its own gap W_r and the
    displacement of the conversations that arrived after ``origin`` (Lemma D.1 restricted; the warm-up
    transient of App. E), Gaussian per row; ĥ = p·Σ_window E[hits_r] / Σ_window T_r. Shared segments use
    the stationary q. No rejection: this form assumes every request fits the pool (C ≥ the largest request;
    the stationary form handles smaller pools)."""
    if not isinstance(trace, Trace):
        raise EstimateError(f"trace: expected a Trace, got {type(trace).__name__}")
    sa = sglang_accounting(trace, page_size=page_size, shared=shared)
    acc = sa.acc
    p = sa.page_size
    lam = _lam(lam0, acc)
    Cs = np.asarray(C, dtype=float)
    Cp = _pool_pages(Cs, p).ravel()
    order = trace.conv_index()[2]
    if window is None:
        wmask = np.ones(trace.n_turns, bool)
    elif hasattr(window, "mask"):
        wmask = np.asarray(window.mask(trace), bool)
    else:
        wmask = np.asarray(window, bool)
        if wmask.shape != (trace.n_turns,):
            raise EstimateError(f"window: a row mask must have shape ({trace.n_turns},), got {wmask.shape}")
    wm = wmask[order]
    t_abs = np.asarray(trace["time"], dtype=float)[order]
    rr = sa.rev_row
    keep = wm[rr]
    W = t_abs[rr] - t_abs[rr - 1]
    t0 = float(trace["conv_arrival"].min()) if origin is None else float(origin)
    Wk = W[keep]
    wmax = float(Wk.max()) if Wk.size else 1.0
    tg = np.unique(np.concatenate([np.linspace(0.0, wmax, n_t), np.quantile(Wk, np.linspace(0, 1, n_t))]))
    life = float(acc.offsets.max())
    if origin is None:
        sg = np.array([0.0, 1.0]) * (life + 1.0) + 1e12
        s_eval = np.full(Wk.size, sg[0])
    else:
        sg = np.unique(np.concatenate([np.linspace(0.0, life + wmax, n_s), [life + wmax + 1.0]]))
        s_eval = np.maximum(t_abs[rr - 1][keep] - t0, 0.0)
    m_tab = np.zeros((tg.size, sg.size))
    v_tab = np.zeros((tg.size, sg.size))
    _phi_table_kernel(acc.conv_ptr, acc.offsets, acc.cum_new, acc.hist_all, tg, sg, m_tab, v_tab)
    mean = lam * _bilinear(m_tab, tg, sg, Wk, s_eval) / acc.L
    sd = np.sqrt(lam * _bilinear(v_tab, tg, sg, Wk, s_eval) / acc.L) if fluctuations else np.zeros(Wk.size)
    # node table of the counted revisits
    kidx = np.flatnonzero(keep)
    cnt = np.diff(sa.node_ptr)[kidx]
    ptr = np.concatenate([[0], np.cumsum(cnt)]).astype(np.int64)
    sel_nodes = np.repeat(keep, np.diff(sa.node_ptr))
    ne, nl = sa.node_end[sel_nodes].astype(float), sa.node_len[sel_nodes].astype(float)
    den = float(sa.demand[wm].sum())
    seg_rows = np.repeat(np.arange(sa.demand.size), np.diff(sa.seg_ptr))
    ks = wm[seg_rows]
    # per-row Gaussian of the revisit each shared segment belongs to (for its own-chain probability)
    row_to_rev = np.full(sa.demand.size, -1, np.int64)
    row_to_rev[rr[kidx]] = np.arange(kidx.size)
    seg_rev = row_to_rev[seg_rows[ks]]
    G = _Occupancy(acc, _resolve_F("empirical", acc.W), lam, False)
    h = np.zeros(Cp.shape)
    out = np.empty(kidx.size)
    cum = _node_cumsums(ptr, nl)
    e0, R, M, nterm = _revisit_moments(ptr, ne, nl, sd, 96)
    for i, cpg in enumerate(Cp):
        c = cpg - sa.cap_offset
        _window_hits_series(ptr, ne, nl, cum, e0, R, M, nterm, mean, sd, c, out)
        hits = float(out.sum())
        if ks.any():
            x = c - sa.seg_end[ks].astype(float)
            q = _shared_q(sa.seg_g[ks], sa, G, x, lam)
            own = np.zeros(x.size)
            o = seg_rev >= 0
            if o.any():
                mu, s_ = mean[seg_rev[o]], sd[seg_rev[o]]
                pos = s_ > 0
                z = np.where(pos, (x[o] + 0.5 - mu) / np.where(pos, s_, 1.0), np.where(mu <= x[o], np.inf, -np.inf))
                own[o] = np.where(x[o] >= 0, ndtr(z), 0.0)
            hits += float((sa.seg_len[ks] * np.maximum(q, own)).sum())
        h[i] = p * hits / den if den > 0 else 0.0
    scalar = Cs.ndim == 0
    return SglangEstimate(
        h=float(h[0]) if scalar else h.reshape(Cs.shape),
        h_max=sa.h_max,
        C=float(Cs) if scalar else Cs,
        lam0=lam,
        page_size=p,
        fluctuations=bool(fluctuations),
        shared=sa.shared,
        form="window",
        rejected_share=0.0 if scalar else np.zeros(Cs.shape),
    )
