"""Per-request prefix reuse of a block-id trace: what each request can reuse, from whom, and how long ago.

One view for every trace kvhit reads — a :class:`~kvhit.workload.production_trace.ProductionTrace` (Mooncake,
WEKA) or a kvhit :class:`~kvhit.workload.trace.Trace` (Parquet, ShareGPT, generated) — of the request
stream as the block pool sees it: per request ``r`` (arrival order) its time ``t_r``, prompt tokens ``T_r``,
its ``F_r = ⌊T_r/b⌋`` full-block ids (chained: equal id ⇒ equal prefix), its session and its *stream*
(session × agent: a WEKA sub-agent is its own stream inside its parent's conversation).

Quantities (all exact functions of the id stream, no cache model):

* ``L_any[r]`` — leading ids of ``r`` already seen earlier in the stream (by anyone): the reusable prefix of an
  infinite cache; the hit is ``min(L_any, (T_r − 1)//b)`` blocks (vLLM's cap; ``R^H_j`` of eq. (6)).
* ``prev[r]``, ``gap[r]`` — the previous request of the same stream and the time since it (the paper's
  interarrival ``W``, eq. (1)); ``L_own[r]`` — the common leading prefix with that request: what the previous
  request of the same conversation makes reusable. ``F_r ≥ F_prev = L_own`` is growth (the paper's model,
  eq. (4)); ``L_own = F_r < F_prev`` a shrink (context compaction, a shorter sub-agent prompt);
  ``L_own < min(F_r, F_prev)`` a divergence (the prompt rewrites part of the history).
* ``L_shared[r]`` — leading ids that occur in at least two sessions (cross-conversation shared prefix: system
  prompt, tool definitions).
* *Age segments* of the reusable run: because ids are chained, the last access of block ``i`` is no older than
  that of block ``i+1``, so the run ``[0, L_any)`` splits into a few segments ``[s, e)`` whose blocks were last
  touched by the same earlier request ``src`` (at ``t_src``). These are the inputs of the agentic estimator
  (:mod:`kvhit.estimate.agentic`): block ``i`` of a segment is hit at capacity ``N`` iff the displacement over
  the segment's age ``t_r − t_src`` leaves room for it.
* ``k_q(x)`` — for the window ``(x, t_q)``: the number of leading blocks of ``q`` touched inside the window
  before ``q`` (from the same segments); ``F_q − k_q(x)`` is what ``q`` adds to the distinct blocks touched
  in ``(x, t_q]`` (the working-set increments the displacement ``D(W)`` is made of, Lemma D.1).

Mapping of a kvhit :class:`~kvhit.workload.trace.Trace`: prompt tokens ``cum_tokens`` (else ``R·b − 1``, the
practical model of eq. (28)), block size from its metadata, ids ``(conv ≪ 32) | i`` — the history-prefix ids
of :func:`kvhit.sim.vllm.blockids.hashes_from_block_counts` up to relabelling (no sharing across conversations;
token-level sharing of a ShareGPT system prompt is not seen). Sessions = conversations, one agent each.

Not modelled here: anything about the cache (see :mod:`kvhit.estimate.agentic`); the response blocks of a
colocated engine (Remark B.1; prefiller view only); requests' durations (instantaneous, as
:func:`kvhit.sim.vllm.curve.block_curve`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

__all__ = ["RequestReuse", "ReuseError", "request_reuse"]


class ReuseError(ValueError):
    """The source is not a trace kvhit can read requests from (the message names the argument)."""


@dataclass(frozen=True)
class RequestReuse:
    """Per-request reuse facts of a request stream (arrays of length ``n`` unless noted; see the module doc).

    Segments (CSR over requests, ``seg_off[r]:seg_off[r+1]``): ``seg_start``/``seg_end`` block indices,
    ``seg_src`` the request that last touched them (``t_src = time[seg_src]``).
    """

    time: np.ndarray  #: float64, nondecreasing
    prompt_tokens: np.ndarray  #: T_r
    full_blocks: np.ndarray  #: F_r = ⌊T_r / b⌋
    session: np.ndarray  #: dense session id (a request without one is its own session)
    stream: np.ndarray  #: dense (session, agent) id
    block_size: int
    prev: np.ndarray  #: previous request of the same stream, or -1
    gap: np.ndarray  #: t_r − t_prev (NaN without prev)
    L_own: np.ndarray  #: common leading prefix with prev (0 without prev)
    L_any: np.ndarray  #: leading ids seen earlier by anyone
    L_shared: np.ndarray  #: leading ids occurring in ≥ 2 sessions
    seg_off: np.ndarray
    seg_start: np.ndarray
    seg_end: np.ndarray
    seg_src: np.ndarray
    source: str  #: "mooncake", "weka", "trace"
    n_shared_ids: int  #: distinct ids occurring in ≥ 2 sessions
    shared_sessions_of_last: np.ndarray  #: per request, sessions holding its last shared id (0 if L_shared = 0)
    distinct_blocks: int

    @property
    def n(self) -> int:
        return int(self.time.shape[0])

    @property
    def hit_cap(self) -> np.ndarray:
        """``(T_r − 1)//b``: vLLM never hits the block holding the last prompt token (``get_computed_blocks``)."""
        return np.maximum((self.prompt_tokens - 1) // self.block_size, 0)

    @property
    def reusable(self) -> np.ndarray:
        """``min(L_any, (T−1)//b)``: hit blocks of an infinite cache."""
        return np.minimum(self.L_any, self.hit_cap)

    @property
    def prompt_blocks(self) -> np.ndarray:
        """``R_r = ⌈T_r / b⌉``: blocks the request must hold (larger than the pool ⇒ rejected)."""
        return -(-self.prompt_tokens // self.block_size)

    def ceiling(self, metric: str = "tokens") -> float:
        """The infinite-cache hit ratio: vLLM's token metric ``b·Σ hit / Σ T`` or blocks ``Σ hit / Σ R``."""
        hit = float(self.reusable.sum())
        if metric == "tokens":
            den = float(self.prompt_tokens.sum())
            return hit * self.block_size / den if den else float("nan")
        den = float(self.prompt_blocks.sum())
        return hit / den if den else float("nan")


def _dense(x: np.ndarray) -> np.ndarray:
    return np.unique(x, return_inverse=True)[1].astype(np.int64).reshape(-1)


def _table(source) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, str]:
    """(time, T, offsets, ids, session, stream, b, kind) of a ProductionTrace or a kvhit Trace."""
    from kvhit.workload.production_trace import ProductionTrace
    from kvhit.workload.trace import Trace

    if isinstance(source, ProductionTrace):
        n = source.n_requests
        sess = source.session
        if sess is None:
            sess = np.arange(n, dtype=np.int64)
        sess = _dense(np.asarray(sess, np.int64))
        agent = np.asarray(source.agent, np.int64)
        stream = _dense(sess * (int(agent.max()) + 1 if n else 1) + agent)
        return (
            np.asarray(source.time, np.float64),
            np.asarray(source.prompt_tokens, np.int64),
            np.asarray(source.hash_offsets, np.int64),
            np.asarray(source.hashes, np.int64),
            sess,
            stream,
            int(source.block_size),
            source.format,
        )
    if isinstance(source, Trace):
        b = source.block_size
        if not b:
            raise ReuseError("source: the trace has no block_size in its metadata")
        b = int(b)
        order = np.lexsort((source["turn"], source["conv"], source["time"]))
        conv = source.dense_conv()[order]
        T = (source["cum_tokens"] if "cum_tokens" in source else source["R"] * b - 1).astype(np.int64)[order]
        F = T // b
        off = np.zeros(T.shape[0] + 1, np.int64)
        np.cumsum(F, out=off[1:])
        within = np.arange(int(off[-1]), dtype=np.int64) - np.repeat(off[:-1], F)
        ids = (np.repeat(conv, F) << 32) | within
        return source["time"][order].astype(np.float64), T, off, ids, conv, conv.copy(), b, "trace"
    raise ReuseError(f"source: expected a ProductionTrace or a kvhit Trace, got {type(source).__name__}")


def _leading(flag: np.ndarray, off: np.ndarray) -> np.ndarray:
    """Per request, the length of the leading run where ``flag`` (per id) is true."""
    n = off.shape[0] - 1
    counts = np.diff(off)
    out = np.zeros(n, np.int64)
    if flag.shape[0] == 0:
        return out
    pos = np.arange(flag.shape[0], dtype=np.int64)
    stop = np.where(flag, np.iinfo(np.int64).max, pos)
    ne = counts > 0
    if ne.any():
        first = np.minimum.reduceat(stop, off[:-1][ne])
        out[ne] = np.minimum(first, off[1:][ne]) - off[:-1][ne]
    return out


def _chunked(T: np.ndarray, off: np.ndarray, ids: np.ndarray, b: int, k: int):
    """Full chunks of ``k`` blocks: chunk ``c`` of a request is named by the id of its last block (chained ids
    name the whole prefix), ``⌊F/k⌋`` chunks per request (a host tier's unit; issue 16)."""
    F = np.diff(off)
    Fc = F // k
    offc = np.zeros(T.shape[0] + 1, np.int64)
    np.cumsum(Fc, out=offc[1:])
    within = np.arange(int(offc[-1]), dtype=np.int64) - np.repeat(offc[:-1], Fc)
    pos = np.repeat(off[:-1], Fc) + (within + 1) * k - 1
    return offc, ids[pos], b * k


@njit(cache=True)
def _id_groups(ids, order, off, sess, n_sess):  # pragma: no cover
    """Per id position: the request that touched the same id last before it (−1: none) and the number of
    sessions touching that id; and the counts of distinct ids and of ids touched by ≥ 2 sessions. ``order``: a
    stable argsort of ``ids`` (equal ids adjacent, in arrival order)."""
    m = ids.shape[0]
    n = off.shape[0] - 1
    req_of = np.empty(m, np.int64)
    for r in range(n):
        for i in range(off[r], off[r + 1]):
            req_of[i] = r
    prev_req = np.full(m, -1, np.int64)
    sess_of_id = np.zeros(m, np.int64)
    marker = np.full(n_sess, -1, np.int64)
    distinct = 0
    n_shared = 0
    i = 0
    while i < m:
        v = ids[order[i]]
        j = i + 1
        while j < m and ids[order[j]] == v:
            j += 1
        cnt = 0
        for q in range(i, j):
            pos = order[q]
            if q > i:
                prev_req[pos] = req_of[order[q - 1]]
            s_ = sess[req_of[pos]]
            if marker[s_] != distinct:
                marker[s_] = distinct
                cnt += 1
        for q in range(i, j):
            sess_of_id[order[q]] = cnt
        if cnt >= 2:
            n_shared += 1
        distinct += 1
        i = j
    return prev_req, sess_of_id, distinct, n_shared


def _stream_prev(stream: np.ndarray) -> np.ndarray:
    """The previous request (arrival order) of each request's stream, or −1."""
    n = stream.shape[0]
    so = np.lexsort((np.arange(n), stream))
    prev = np.full(n, -1, np.int64)
    if n:
        cont = np.zeros(n, bool)
        cont[1:] = stream[so[1:]] == stream[so[:-1]]
        prev[so[cont]] = so[np.flatnonzero(cont) - 1]
    return prev


@njit(cache=True)
def _per_request(ids, off, prev_req, sess_of_id, prev):  # pragma: no cover
    """Per request: ``L_any`` (leading ids seen before), ``L_shared`` (leading ids of ≥ 2 sessions), the sessions
    of its last shared id, ``L_own`` (common leading prefix with ``prev``) and its number of age segments (runs of
    equal ``prev_req`` inside ``[0, L_any)``)."""
    n = off.shape[0] - 1
    L_any = np.zeros(n, np.int64)
    L_shared = np.zeros(n, np.int64)
    last_sh = np.zeros(n, np.int64)
    L_own = np.zeros(n, np.int64)
    seg_cnt = np.zeros(n, np.int64)
    for r in range(n):
        a = off[r]
        F = off[r + 1] - a
        k = 0
        while k < F and prev_req[a + k] >= 0:
            k += 1
        L_any[r] = k
        k = 0
        while k < F and sess_of_id[a + k] >= 2:
            k += 1
        L_shared[r] = k
        if k > 0:
            last_sh[r] = sess_of_id[a + k - 1]
        p = prev[r]
        if p >= 0:
            b = off[p]
            mm = min(F, off[p + 1] - b)
            k = 0
            while k < mm and ids[a + k] == ids[b + k]:
                k += 1
            L_own[r] = k
        c = 0
        for i in range(L_any[r]):
            if i == 0 or prev_req[a + i] != prev_req[a + i - 1]:
                c += 1
        seg_cnt[r] = c
    return L_any, L_shared, last_sh, L_own, seg_cnt


@njit(cache=True)
def _segments(off, prev_req, L_any, seg_off):  # pragma: no cover
    """The age segments ``[start, end)`` (block indices) and their source request, CSR by ``seg_off``."""
    ns = seg_off[-1]
    start = np.empty(ns, np.int64)
    end = np.empty(ns, np.int64)
    src = np.empty(ns, np.int64)
    n = off.shape[0] - 1
    for r in range(n):
        a = off[r]
        s = seg_off[r]
        for i in range(L_any[r]):
            if i == 0 or prev_req[a + i] != prev_req[a + i - 1]:
                if i > 0:
                    end[s - 1] = i
                start[s] = i
                src[s] = prev_req[a + i]
                s += 1
        if s > seg_off[r]:
            end[s - 1] = L_any[r]
    return start, end, src


def request_reuse(source, chunk_blocks: int = 1) -> RequestReuse:
    """The :class:`RequestReuse` of a ProductionTrace or a kvhit Trace (see the module docstring).

    ``chunk_blocks`` > 1: the same stream seen in chunks of that many blocks (block size ``b·chunk_blocks``,
    only full chunks, each named by the id of its last block) — the unit of a host tier (vLLM native offloading
    with ``blocks_per_chunk``, LMCache's 256-token chunks)."""
    time, T, off, ids, sess, stream, b, kind = _table(source)
    if isinstance(chunk_blocks, bool) or not isinstance(chunk_blocks, int | np.integer) or chunk_blocks < 1:
        raise ReuseError(f"chunk_blocks: expected a positive integer, got {chunk_blocks!r}")
    if chunk_blocks > 1:
        off, ids, b = _chunked(T, off, ids, b, int(chunk_blocks))
    n = T.shape[0]
    F = np.diff(off)
    # previous access of every id (stream order = arrival order, ties in file order): equal ids are adjacent in
    # the stable sort; the rest in compiled passes (_id_groups, _per_request, _segments)
    order = np.argsort(ids, kind="stable")
    n_sess = int(sess.max()) + 1 if n else 1
    prev_req, sess_of_id, distinct, n_shared = _id_groups(ids, order, off, sess, n_sess)
    # previous request of the same stream (arrival order)
    prev = _stream_prev(stream)
    gap = np.full(n, np.nan)
    hp = prev >= 0
    gap[hp] = time[hp] - time[prev[hp]]
    L_any, L_shared, last_sh, L_own, seg_cnt = _per_request(ids, off, prev_req, sess_of_id, prev)
    seg_off = np.zeros(n + 1, np.int64)
    np.cumsum(seg_cnt, out=seg_off[1:])
    seg_start, seg_end, seg_src = _segments(off, prev_req, L_any, seg_off)
    return RequestReuse(
        time=time,
        prompt_tokens=T,
        full_blocks=F,
        session=sess,
        stream=stream,
        block_size=b,
        prev=prev,
        gap=gap,
        L_own=L_own,
        L_any=L_any,
        L_shared=L_shared,
        seg_off=seg_off,
        seg_start=seg_start,
        seg_end=seg_end,
        seg_src=seg_src,
        source=kind,
        n_shared_ids=n_shared,
        shared_sessions_of_last=last_sh,
        distinct_blocks=distinct,
    )
