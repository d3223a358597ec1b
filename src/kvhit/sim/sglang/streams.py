"""Workloads as token streams for the SGLang radix model (:class:`kvhit.sim.sglang.radix.TokenStreams`).

A radix cache keys on tokens, so every workload kvhit reads is turned into token sequences:

* a kvhit trace with token ids (ShareGPT, ``new_tokens`` list column): one stream per conversation, the
  concatenation of its turns' ``new_tokens`` (each turn's new tokens begin with the previous response) and the
  last response (``response_ids``). Output ``n_j`` = ``response_tokens``. Exact: token ``i`` of a stream is its
  real token id for every position up to one past the longest prefix the stream shares with any other stream
  (found by sorting the streams); the rest of the stream is one run of the stream's own tokens — a radix match
  compares position ``i`` of two sequences only if they agree before ``i``, so this changes no comparison.
* a kvhit trace with token counts (``cum_tokens``) or block counts only (``T_j = R_j·b − 1``, eq. (28)): one
  synthetic run per conversation (conversations share nothing); output = ``response_tokens`` if the trace has
  them, else none. The outputs are the stream's next tokens, i.e. the beginning of the next turn.
* a production block-id trace (Mooncake, WEKA): one stream per request; each full-block id is a run of ``b``
  tokens named by the id (equal ids = equal tokens, a differing id differs from its first token on — a lower
  bound on sharing, since two different blocks may begin with equal tokens); the partial prompt tail and the
  outputs are the request's own tokens (the traces carry no ids for them, so they are never reused).

Invariant: every request's sequence holds its ``T + max(n, 1) − 1`` tokens (streams are padded with the
stream's own tokens where a trace lacks them). NOT modelled: tokens the trace does not record.
"""

from __future__ import annotations

import numpy as np

from kvhit.sim.sglang.radix import TokenStreams

__all__ = ["streams_from_production", "streams_from_trace"]


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    m = min(a.shape[0], b.shape[0])
    if m == 0:
        return 0
    ne = np.flatnonzero(a[:m] != b[:m])
    return int(ne[0]) if ne.size else m


def _real_streams(seqs: list[np.ndarray], need: np.ndarray, sym0: int) -> tuple:
    """Runs for real-token streams: real ids up to 1 + the longest shared prefix, then the stream's own run."""
    C = len(seqs)
    order = sorted(range(C), key=lambda c: seqs[c].astype(">i8").tobytes())
    share = np.zeros(C, np.int64)
    for k in range(C - 1):
        a, b = order[k], order[k + 1]
        v = _lcp(seqs[a], seqs[b])
        share[a] = max(share[a], v)
        share[b] = max(share[b], v)
    syms, idxs, lens, off = [], [], [], [0]
    for c in range(C):
        s = seqs[c]
        L = max(int(s.shape[0]), int(need[c]))
        keep = min(int(share[c]) + 1, int(s.shape[0]))
        syms.append(s[:keep].astype(np.int64))
        idxs.append(np.zeros(keep, np.int64))
        lens.append(np.ones(keep, np.int64))
        if L > keep:
            syms.append(np.array([sym0 + c], np.int64))
            idxs.append(np.array([keep], np.int64))
            lens.append(np.array([L - keep], np.int64))
        off.append(off[-1] + keep + (1 if L > keep else 0))
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64)  # noqa: E731
    return cat(syms), cat(idxs), cat(lens), np.asarray(off, np.int64)


def streams_from_trace(trace, *, source: str = "auto", block_size: int | None = None) -> TokenStreams:
    """The trace's requests (row order) as token streams (see the module docstring for the three sources)."""
    if source == "auto":
        source = "tokens" if "new_tokens" in trace.lists else "counts" if "cum_tokens" in trace.cols else "blocks"
    conv = trace.dense_conv().astype(np.int64)
    C = int(conv.max()) + 1 if conv.size else 0
    n_out = trace["response_tokens"].astype(np.int64) if "response_tokens" in trace.cols else np.zeros_like(conv)
    if source == "tokens":
        if "new_tokens" not in trace.lists:
            raise ValueError("source='tokens' needs the trace's new_tokens list column")
        order = np.lexsort((trace["turn"], conv))
        parts: list[list[np.ndarray]] = [[] for _ in range(C)]
        T = np.zeros(trace.n_turns, np.int64)
        run = np.zeros(C, np.int64)
        last = np.full(C, -1, np.int64)
        new = trace.lists["new_tokens"]
        for r in order:
            c = conv[r]
            parts[c].append(np.asarray(new[r]))
            run[c] += len(new[r])
            T[r] = run[c]
            last[c] = r
        if "response_ids" in trace.lists:
            for c in range(C):
                if last[c] >= 0:
                    parts[c].append(np.asarray(trace.lists["response_ids"][last[c]]))
        seqs = [np.concatenate(p).astype(np.int64) if p else np.zeros(0, np.int64) for p in parts]
        need = np.zeros(C, np.int64)
        np.maximum.at(need, conv, T + np.maximum(n_out, 1) - 1)
        top = max((int(s.max()) for s in seqs if s.size), default=0) + 1
        sym, idx, ln, off = _real_streams(seqs, need, top)
        return TokenStreams(sym, idx, ln, off, conv, T, n_out, "tokens")
    if source == "counts":
        if "cum_tokens" not in trace.cols:
            raise ValueError("source='counts' needs the trace's cum_tokens column")
        T = trace["cum_tokens"].astype(np.int64)
    elif source == "blocks":
        b = int(block_size or trace.block_size or 0)
        if b < 1:
            raise ValueError("block size unknown: the trace has no block_size; pass block_size=")
        T = trace["R"].astype(np.int64) * b - 1
    else:
        raise ValueError(f"unknown source {source!r} (auto, tokens, counts, blocks)")
    need = np.zeros(C, np.int64)
    np.maximum.at(need, conv, T + np.maximum(n_out, 1) - 1)
    return TokenStreams(
        np.arange(C, dtype=np.int64), np.zeros(C, np.int64), need, np.arange(C + 1), conv, T, n_out, source
    )


def streams_from_production(pt) -> TokenStreams:
    """A :class:`~kvhit.workload.production_trace.ProductionTrace` as one stream per request (see the module
    docstring): its full-block ids as ``b``-token runs, then its own tokens for the partial tail and outputs."""
    b = int(pt.block_size)
    n = pt.n_requests
    T = pt.prompt_tokens.astype(np.int64)
    O = pt.output_tokens.astype(np.int64)
    fb = np.diff(pt.hash_offsets).astype(np.int64)
    uniq, inv = np.unique(pt.hashes, return_inverse=True)
    own = T - fb * b + np.maximum(O, 1) - 1  # partial prompt tail + outputs
    has_own = own > 0
    per = fb + has_own
    off = np.zeros(n + 1, np.int64)
    np.cumsum(per, out=off[1:])
    R = int(off[-1])
    sym = np.empty(R, np.int64)
    idx = np.zeros(R, np.int64)
    ln = np.empty(R, np.int64)
    is_block = np.ones(R, bool)
    tail = off[1:][has_own] - 1
    is_block[tail] = False
    sym[is_block] = inv.astype(np.int64)
    ln[is_block] = b
    sym[tail] = uniq.shape[0] + np.flatnonzero(has_own)
    ln[tail] = own[has_own]
    return TokenStreams(sym, idx, ln, off, np.arange(n, dtype=np.int64), T, O, "production")
