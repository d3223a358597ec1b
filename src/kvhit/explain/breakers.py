"""Prefix breakers: where a prompt that shares a long prefix with an earlier one diverges early although the
two agree again soon after (a timestamp or request id inside a system prompt, a reordered tool list).

Detection, per request r with its reusable prefix d = h0[r] and the earlier request p that has it
(:func:`kvhit.explain.waterfall.reusable_prefix`): the two prompts differ at token d. They *re-synchronise*
when, for some span lengths s ≤ ``max_span`` of r and s' = s + δ of p (|δ| ≤ ``max_shift``), the next ``window``
tokens agree: r[d+s : d+s+window] = p[d+s' : d+s'+window] (the smallest s, then the smallest |δ|). The common
run after it, c = LCP(r[d+s:], p[d+s':]), is the reuse the differing span cost r; a breaker needs c ≥
``min_run`` tokens (one block). Differences closer together than that (a date and a time) merge into one span:
the search goes on after a short run, within ``max_span`` tokens of d.

Breakers are grouped by the divergence position d: requests breaking at the same position of their prompts are
one pattern (e.g. a timestamp at token 9 of every system prompt).

What-if (:func:`what_if`): every conversation with a breaker of the group has the differing span moved to just
after the common run, in every turn whose prompt contains it (turns of a trace conversation extend each other,
so the span sits at the same position in all of them) and so has the earlier partner's conversation; the vLLM
block cache is re-simulated on the rewritten prompts (same N, engine, no holds): the engine-stage hit ratio
goes from x to y. Token counts are unchanged, only the order of tokens.

Not modelled: spans longer than ``max_span`` tokens, divergences that never re-synchronise within the window,
and what the model would answer to the reordered prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit

__all__ = ["Breaker", "find_breakers", "what_if"]


@dataclass
class Breaker:
    """One divergence position d shared by ``requests`` breaks: tokens a moved span would have shared."""

    position: int
    requests: int
    tokens_lost: int
    span_tokens: float  #: mean length s of the differing span of r
    examples: list[dict[str, Any]] = field(default_factory=list)
    members: list[tuple[int, int, int, int, int]] = field(default_factory=list, repr=False)  # (r, p, s, s', c)

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "requests": self.requests,
            "tokens_lost": self.tokens_lost,
            "span_tokens": self.span_tokens,
            "examples": self.examples,
        }


@njit(cache=True)
def _resync_kernel(q, P, d, e, max_span, max_shift, window):  # pragma: no cover - compiled
    """Smallest s (then smallest |δ|, + before −) with q[d+s : d+s+window] = P[e+s+δ : e+s+δ+window]; (-1, -1)."""
    for s in range(1, max_span + 1):
        if d + s + window > q.shape[0]:
            return -1, -1
        for ad in range(0, max_shift + 1):
            for sign in (1, -1):
                if ad == 0 and sign == -1:
                    continue
                sp = s + sign * ad
                if sp < 1 or e + sp + window > P.shape[0]:
                    continue
                ok = True
                for k in range(window):
                    if q[d + s + k] != P[e + sp + k]:
                        ok = False
                        break
                if ok:
                    return s, sp
    return -1, -1


def _resync(q: np.ndarray, P: np.ndarray, d: int, max_span: int, max_shift: int, window: int, e: int | None = None):
    s, sp = _resync_kernel(q, P, d, d if e is None else e, max_span, max_shift, window)
    return None if s < 0 else (int(s), int(sp))


def _span(q: np.ndarray, P: np.ndarray, d: int, min_run: int, max_span: int, max_shift: int, window: int):
    """``(s, s', c)``: the differing span of q (s tokens) and of P (s') from d, and the common run after it;
    nearby differences (a date and a time) merge into one span while the run between them is < ``min_run``."""
    a0, b0 = d, d
    while a0 - d <= max_span:
        found = _resync(q, P, a0, max_span - (a0 - d), max_shift, window, b0)
        if found is None:
            return None
        s, sp = found
        x, y = q[a0 + s :], P[b0 + sp :]
        m = min(x.size, y.size)
        ne = np.flatnonzero(x[:m] != y[:m])
        c = int(ne[0]) if ne.size else m
        if c >= min_run:
            return a0 + s - d, b0 + sp - d, c
        if not ne.size:
            return None
        a0, b0 = a0 + s + c, b0 + sp + c
    return None


def find_breakers(
    prompts: list[np.ndarray],
    lcp: np.ndarray,
    partner: np.ndarray,
    *,
    min_run: int,
    max_span: int = 32,
    max_shift: int = 4,
    window: int = 4,
    decode=None,
    top: int = 5,
) -> tuple[list[Breaker], np.ndarray]:
    """The breaker groups (largest ``tokens_lost`` first, at most ``top``) and, per request, the tokens its
    breaker cost (0 where none). ``decode(ids) -> str`` renders the example spans when given."""
    n = len(prompts)
    lost = np.zeros(n, np.int64)
    groups: dict[int, list[tuple[int, int, int, int, int]]] = {}
    for r in range(n):
        p = int(partner[r])
        if p < 0:
            continue
        q, P = prompts[r], prompts[p]
        d = int(lcp[r])
        if d >= q.size or d >= P.size or d == 0:
            continue
        span = _span(q, P, d, min_run, max_span, max_shift, window)
        if span is None:
            continue
        s, sp, c = span
        lost[r] = c
        groups.setdefault(d, []).append((r, p, s, sp, c))
    out = []
    for d, mem in groups.items():
        ex = []
        for r, p, s, sp, _c in mem[:3]:
            e: dict[str, Any] = {
                "request": r,
                "earlier": p,
                "ids": [int(x) for x in prompts[r][d : d + s]],
                "earlier_ids": [int(x) for x in prompts[p][d : d + sp]],
            }
            if decode is not None:
                e["text"] = decode(prompts[r][d : d + s])
                e["earlier_text"] = decode(prompts[p][d : d + sp])
                e["context"] = decode(prompts[r][max(0, d - 8) : d])
            ex.append(e)
        out.append(
            Breaker(
                position=int(d),
                requests=len(mem),
                tokens_lost=int(sum(m[4] for m in mem)),
                span_tokens=float(np.mean([m[2] for m in mem])),
                examples=ex,
                members=mem,
            )
        )
    out.sort(key=lambda g: (-g.tokens_lost, g.position))
    return out[:top], lost


def _move(q: np.ndarray, d: int, s: int, c: int) -> np.ndarray:
    if q.size < d + s + c:
        return q
    return np.concatenate([q[:d], q[d + s : d + s + c], q[d : d + s], q[d + s + c :]])


def what_if(trace, prompts: list[np.ndarray], breaker: Breaker, *, N: int, engine: str, block_size: int):
    """``(x, y)``: the engine stage's token and block hit ratios before and after moving the breaker's spans
    (see the module docstring). Returns ``{"token": (x, y), "block": (x, y), "request": (x, y)}``."""
    from kvhit.explain.waterfall import _weighted
    from kvhit.sim.vllm.block import simulate_block
    from kvhit.sim.vllm.blockids import hashes_from_token_ids

    conv = trace.dense_conv()
    ops: dict[int, tuple[int, int, int]] = {}
    for r, p, s, sp, c in breaker.members:
        ops.setdefault(int(conv[r]), (breaker.position, s, c))
        ops.setdefault(int(conv[p]), (breaker.position, sp, c))
    new = [_move(q, *ops[int(conv[r])]) if int(conv[r]) in ops else q for r, q in enumerate(prompts)]
    b = int(block_size)
    T = np.array([q.size for q in prompts], np.int64)
    out: dict[str, tuple[float, float]] = {}
    hits = []
    for seqs in (prompts, new):
        off, hs = hashes_from_token_ids(seqs, b)
        res = simulate_block(T, off, hs, N=int(N), block_size=b, engine=engine)
        hits.append(np.where(res.rejected, 0, res.hit_blocks * b).astype(np.int64))
    for w in ("token", "block", "request"):
        out[w] = (_weighted(hits[0], T, b, w), _weighted(hits[1], T, b, w))
    return out
