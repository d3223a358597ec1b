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
    m = ids.shape[0]
    req_of = np.repeat(np.arange(n, dtype=np.int64), F)
    # previous access of every id (stream order = arrival order, ties in file order)
    order = np.argsort(ids, kind="stable")
    sid = ids[order]
    same = np.zeros(m, bool)
    if m:
        same[1:] = sid[1:] == sid[:-1]
    prev_pos = np.full(m, -1, np.int64)
    prev_pos[order[same]] = order[np.flatnonzero(same) - 1]
    prev_req = np.where(prev_pos >= 0, req_of[np.maximum(prev_pos, 0)], -1)
    L_any = _leading(prev_pos >= 0, off)
    # sessions per id (shared prefixes)
    if m:
        grp_start = ~same
        gid = np.cumsum(grp_start) - 1
        key = np.unique(gid * (int(sess.max()) + 1) + sess[req_of[order]])
        nsess = np.bincount(key // (int(sess.max()) + 1), minlength=int(gid[-1]) + 1)
        sess_of_id = np.empty(m, np.int64)
        sess_of_id[order] = nsess[gid]
        distinct = int(gid[-1]) + 1
        n_shared = int((nsess >= 2).sum())
    else:
        sess_of_id = np.zeros(0, np.int64)
        distinct = n_shared = 0
    L_shared = _leading(sess_of_id >= 2, off)
    last_sh = np.zeros(n, np.int64)
    has = L_shared > 0
    last_sh[has] = sess_of_id[off[:-1][has] + L_shared[has] - 1]
    # previous request of the same stream and the common leading prefix with it
    so = np.lexsort((np.arange(n), stream))
    prev = np.full(n, -1, np.int64)
    if n:
        cont = np.zeros(n, bool)
        cont[1:] = stream[so[1:]] == stream[so[:-1]]
        prev[so[cont]] = so[np.flatnonzero(cont) - 1]
    gap = np.full(n, np.nan)
    hp = prev >= 0
    gap[hp] = time[hp] - time[prev[hp]]
    L_own = np.zeros(n, np.int64)
    if hp.any():
        r = np.flatnonzero(hp)
        p = prev[r]
        mm = np.minimum(F[r], F[p])
        tot = int(mm.sum())
        if tot:
            within = np.arange(tot, dtype=np.int64) - np.repeat(np.cumsum(mm) - mm, mm)
            eq = ids[np.repeat(off[r], mm) + within] == ids[np.repeat(off[p], mm) + within]
            o2 = np.zeros(r.shape[0] + 1, np.int64)
            np.cumsum(mm, out=o2[1:])
            L_own[r] = _leading(eq, o2)
    # age segments of the reusable run: runs of equal prev_req inside [0, L_any)
    within_all = np.arange(m, dtype=np.int64) - np.repeat(off[:-1], F)
    in_run = within_all < L_any[req_of] if m else np.zeros(0, bool)
    start = in_run.copy()
    if m:
        start[1:] &= (within_all[1:] == 0) | (prev_req[1:] != prev_req[:-1])
        start[0] = in_run[0]
    spos = np.flatnonzero(start)
    seg_req = req_of[spos]
    seg_start = within_all[spos]
    seg_src = prev_req[spos]
    seg_off = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(seg_req, minlength=n), out=seg_off[1:])
    nxt = np.empty(spos.shape[0], np.int64)
    if spos.shape[0]:
        nxt[:-1] = seg_start[1:]
        same_req = np.zeros(spos.shape[0], bool)
        same_req[:-1] = seg_req[1:] == seg_req[:-1]
        nxt = np.where(same_req, nxt, L_any[seg_req])
    seg_end = nxt
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
