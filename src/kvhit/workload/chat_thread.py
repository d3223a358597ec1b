"""Threading chat requests into trace conversations: which earlier request each request continues.

Threading. A request that names its conversation (``conversation_id``, ``session_id``, ``thread_id``,
``metadata.conversation_id``/``session_id``, or a conversation file's record) continues that conversation's
previous request when that request's prompt is a proper token prefix of its own. A request that names none
continues the earlier request whose prompt is its longest proper token prefix (what a prefix cache sees), if
that request has not been continued yet. Every other request starts a new trace conversation: a branch
(the prefix was continued already), a prompt that edits its history (e.g. a template that drops earlier
reasoning) and an exact repeat of an earlier prompt; :class:`kvhit.workload.chat.ChatTraceReport` counts each
kind. Sharing between such conversations (a common system prompt, a regenerated answer) is still seen by the block
simulators, which identify blocks by chained hashes of the token ids.

Invariant: a request continues at most one request, an earlier one whose prompt is a proper token prefix of its
own (``Threads.parent[r] < r``), so the prompts of one trace conversation are nested.

NOT modelled here: reading the log or tokenizing (:mod:`kvhit.workload.chat_log`,
:mod:`kvhit.workload.chat_model`); the engines' block hashes (:mod:`kvhit.sim.vllm.blockids`): the granule hashes
here serve the prefix search only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from kvhit.workload.hashing import fmix64

__all__ = ["Threads", "thread_requests", "granule_hashes"]


_SEED = np.uint64(0x6B76686974636861)  # "kvhitcha"
_MUL = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True)
def _granule_kernel(tok_off, tokens, g, out_off):  # pragma: no cover - compiled
    n = tok_off.shape[0] - 1
    out = np.empty(out_off[n], np.int64)
    for r in range(n):
        h = _SEED
        s = tok_off[r]
        for i in range(out_off[r + 1] - out_off[r]):
            for j in range(s + i * g, s + (i + 1) * g):
                h = fmix64(h * _MUL + fmix64(np.uint64(tokens[j]) ^ _MUL))
            out[out_off[r] + i] = np.int64(h)
    return out


def granule_hashes(ids: list[np.ndarray], g: int) -> tuple[np.ndarray, np.ndarray]:
    """Chained hashes of every full ``g``-token piece of every prompt: ``(offsets int64[n+1], hashes int64[…])``;
    piece i of prompt r hashes the whole prefix ``r[: (i+1)·g]`` (equal prefixes ↦ equal hashes; different ones
    collide with probability ~2⁻⁶⁴ per pair). Internal to threading: the engines' block hashes are
    :mod:`kvhit.sim.vllm.blockids`'."""
    lens = np.array([q.size for q in ids], np.int64)
    tok_off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    flat = np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, np.int64)
    out_off = np.concatenate([[0], np.cumsum(lens // g)]).astype(np.int64)
    return out_off, _granule_kernel(tok_off, flat, np.int64(g), out_off)


@dataclass
class Threads:
    """``parent[r]``: the request that request r continues (−1: it starts a trace conversation); ``reason[r]``:
    ``"id"``/``"prefix"`` (continues), ``"new"``, ``"branch"``, ``"edited"``, ``"repeat"`` (starts one)."""

    parent: np.ndarray
    reason: list[str]


def thread_requests(ids: list[np.ndarray], conv: list[str | None], *, granule: int = 16) -> Threads:
    """Thread requests given in arrival order (see the module docstring): a request with a conversation id
    continues that conversation's latest request when it is a proper token prefix; one without continues the
    earlier, not yet continued request whose prompt is its longest proper token prefix.

    The search walks a hash trie of ``granule``-token pieces (:func:`granule_hashes`): O(log(prompt / granule))
    set probes per request to find the deepest shared piece, then the candidates ending below it.
    """
    n = len(ids)
    g = int(granule)
    off, hs = granule_hashes(ids, g)
    parent = np.full(n, -1, np.int64)
    reason = ["new"] * n
    continued = np.zeros(n, bool)
    seen: set[int] = set()  # chained hashes of every g-piece prefix of earlier prompts
    ends: dict[int, list[int]] = {}  # chained hash of an earlier prompt's full pieces -> the requests ending there
    ROOT = 0
    last_of_conv: dict[str, int] = {}
    for r in range(n):
        q = ids[r]
        h = hs[off[r] : off[r + 1]]
        c = conv[r]
        if c is not None and c in last_of_conv:
            p = last_of_conv[c]
            P = ids[p]
            if P.size < q.size and np.array_equal(q[: P.size], P):
                parent[r], reason[r] = p, "id"
            else:
                reason[r] = "repeat" if np.array_equal(P, q) else "edited"
        elif c is None:
            # longest k with the first k pieces present (monotone): binary search
            lo, hi = 0, h.size
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if int(h[mid - 1]) in seen:
                    lo = mid
                else:
                    hi = mid - 1
            best, best_len, exact = -1, -1, False
            for k in range(lo, -1, -1):  # nodes deeper in the trie hold longer prompts: the first match is longest
                cands = ends.get(ROOT if k == 0 else int(h[k - 1]))
                if not cands:
                    continue
                for p in reversed(cands):  # latest first
                    P = ids[p]
                    if P.size > q.size or not np.array_equal(q[k * g : P.size], P[k * g :]):
                        continue
                    if P.size == q.size:
                        exact = True
                    elif P.size > best_len or (P.size == best_len and continued[best] and not continued[p]):
                        best, best_len = p, P.size
                if best >= 0:
                    break
            if best >= 0:
                if continued[best]:
                    reason[r] = "branch"
                else:
                    parent[r], reason[r] = best, "prefix"
            elif exact:
                reason[r] = "repeat"
        if parent[r] >= 0:
            continued[parent[r]] = True
        if c is not None:
            last_of_conv[c] = r
        seen.update(h.tolist())
        kq = q.size // g
        node = ROOT if kq == 0 else int(h[kq - 1])
        ends.setdefault(node, []).append(r)
    return Threads(parent, reason)
