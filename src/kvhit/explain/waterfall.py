"""The waterfall: from the reuse a workload offers to the hit ratio a configuration delivers, stage by stage.

Every stage gives each request r (trace rows, prompt of T_r tokens, b-token blocks) a number of hit tokens
``h_s[r]``; the stages are, in order (symbols as in the paper: N blocks, T−1 cap of eq. (28)):

``reusable``   h0 = the longest common prefix, in tokens, of r's prompt with any earlier prompt of the trace
               (an infinite, token-granular cache: every reuse the workload offers). Needs token ids
               (``new_tokens``); a trace with token counts only uses the previous turn's prompt
               (``cum_tokens`` of turn j−1: reuse inside the conversation only).
``capacity``   h1 = h0 where Algorithm 1 (whole-conversation LRU at N blocks, :mod:`kvhit.sim.content.lru`, on
               the trace's conversations and R_j) hits or r is a conversation's first turn; where it misses,
               only the prefix the conversation's first prompt shared with earlier prompts (a common system
               prompt) is kept: min(h0[r], h0[first turn]).
``engine``     h2 = the vLLM block cache at N blocks, requests instantaneous (:mod:`kvhit.sim.vllm.block`: whole
               blocks only, the T−1 cap, tail-first eviction, reference counts): ``hit_blocks · b``.
``concurrency`` h3 = the same with each request holding its blocks for ``T / prefill_tokens_per_s`` seconds
               from its start (FIFO admission, head-of-line blocking).
``routing``    h4 = R replicas of N blocks each behind the router (:mod:`kvhit.fleet.simulate`), same holds. With
               R > 1 the single-replica stages above run at R·N blocks: one pool holding the whole fleet's KV.
``host tier``  h5 = the single replica with vLLM's native CPU offloading tier of ``host_blocks`` blocks
               (:mod:`kvhit.sim.tiers`), same holds: GPU hit + tokens loaded from DRAM.

A stage that is not configured (no holds, one replica, no tier) repeats the previous one (its step is 0).
The ``final`` value is the last stage's. Steps are differences of consecutive stages, so they add up to
``final − reusable`` exactly; a step can be negative (e.g. the vLLM cache keeps a conversation's prefix when
whole-conversation LRU drops it all: the engine wins some reuse back).

Weightings, named as everywhere in kvhit: ``token`` = Σ h / Σ T (vLLM's ``prefix_cache_hits / queries``);
``block`` = Σ h/b / Σ ⌈T/b⌉ (the paper's block-weighted h, eq. (6), fractional blocks for the token-granular
stages); ``request`` = share of requests with h > 0 (request hit rate). Every request counts in every
denominator; a request an engine rejects (⌈T/b⌉ > N) hits 0.

Per-miss causes: the missed tokens T − h_final of each request split into ``cold`` (T − h0: content no
earlier prompt had), ``prefix divergence`` (the part of the cold tokens a detected prefix breaker would have
shared, :mod:`kvhit.explain.breakers`), ``evicted (capacity)`` (h0 − h1), ``engine accounting`` (h1 − h2),
``concurrency`` (h2 − h3), ``routed elsewhere`` (h3 − h4) and ``host tier`` (h4 − h5, ≤ 0: won back). Request
counts are by each missing request's largest cause.

Not modelled here: SGLang (its own accounting), a host tier behind a fleet, chunked prefill and preemption
(see the simulators' docstrings), the response KV (prefill/decode disaggregated: prompts only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["STAGES", "ExplainError", "Waterfall", "explain_trace", "full_prompts", "reusable_prefix"]

STAGES = ("reusable", "capacity", "engine", "concurrency", "routing", "host tier")
STEP_NAMES = {
    "capacity": "lost to capacity",
    "engine": "lost to the engine's accounting",
    "concurrency": "lost to concurrency",
    "routing": "lost to routing",
    "host tier": "won back by the host tier",
}
WEIGHTINGS = ("block", "token", "request")


class ExplainError(ValueError):
    """Bad input to explain; the message names the flag or the trace column."""


@dataclass
class Waterfall:
    """The stage hit tokens per request (``hits[stage]``, trace row order) and what they add up to."""

    prompt_tokens: np.ndarray
    block_size: int
    hits: dict[str, np.ndarray]
    configured: dict[str, bool]
    N: int
    engine: str
    replicas: int
    router: str | None
    host_blocks: int | None
    prefill_tokens_per_s: float | None
    partner: np.ndarray | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def value(self, stage: str, weighting: str) -> float:
        return _weighted(self.hits[stage], self.prompt_tokens, self.block_size, weighting)

    def table(self) -> list[dict[str, Any]]:
        """One row per stage: the value after it and the step from the previous stage, in each weighting."""
        rows = []
        prev = None
        for s in STAGES:
            row: dict[str, Any] = {"stage": s, "step": STEP_NAMES.get(s, "reusable share"), "configured": True}
            row["configured"] = self.configured[s]
            for w in WEIGHTINGS:
                v = self.value(s, w)
                row[w] = v
                row[f"{w}_step"] = v if prev is None else v - prev[w]
            rows.append(row)
            prev = row
        return rows

    def final(self, weighting: str) -> float:
        return self.value(STAGES[-1], weighting)

    def causes(self, divergence_tokens: np.ndarray | None = None) -> list[dict[str, Any]]:
        """Missed tokens by cause (see the module docstring): tokens, share of all missed tokens, requests."""
        T = self.prompt_tokens.astype(np.int64)
        h = [self.hits[s].astype(np.int64) for s in STAGES]
        div = np.zeros_like(T) if divergence_tokens is None else np.minimum(divergence_tokens, T - h[0])
        parts = {
            "cold": T - h[0] - div,
            "prefix divergence": div,
            "evicted (capacity)": h[0] - h[1],
            "engine accounting": h[1] - h[2],
            "concurrency": h[2] - h[3],
            "routed elsewhere": h[3] - h[4],
            "host tier (won back)": h[4] - h[5],
        }
        missed = int((T - h[5]).sum())
        names = list(parts)
        M = np.stack([parts[k] for k in names])
        dominant = np.argmax(M, axis=0)
        has_miss = (T - h[5]) > 0
        out = []
        for i, k in enumerate(names):
            tok = int(parts[k].sum())
            out.append(
                {
                    "cause": k,
                    "tokens": tok,
                    "share": tok / missed if missed else float("nan"),
                    "requests": int(((dominant == i) & has_miss & (M[i] > 0)).sum()),
                }
            )
        return out


def _weighted(h: np.ndarray, T: np.ndarray, b: int, weighting: str) -> float:
    if weighting == "token":
        den = float(T.sum())
        return float(h.sum()) / den if den else float("nan")
    if weighting == "block":
        den = float((-(-T // b)).sum())
        return float(h.sum()) / b / den if den else float("nan")
    if weighting == "request":
        return float((h > 0).mean()) if h.size else float("nan")
    raise ExplainError(f"weighting: expected one of {', '.join(WEIGHTINGS)}, got {weighting!r}")


def full_prompts(trace) -> list[np.ndarray] | None:
    """Every row's whole prompt (the concatenation of its conversation's ``new_tokens`` up to its turn), or
    None when the trace carries no token ids."""
    if "new_tokens" not in trace.lists:
        return None
    new = trace.lists["new_tokens"]
    conv = trace.dense_conv()
    order = np.lexsort((trace["turn"], conv))
    out: list[np.ndarray] = [np.zeros(0, np.int32)] * trace.n_turns
    prev_c, acc = -1, np.zeros(0, np.int32)
    for r in order:
        c = conv[r]
        acc = np.asarray(new[r], np.int32) if c != prev_c else np.concatenate([acc, new[r]]).astype(np.int32)
        out[r] = acc
        prev_c = c
    return out


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    m = min(a.size, b.size)
    if m == 0:
        return 0
    ne = np.flatnonzero(a[:m] != b[:m])
    return int(ne[0]) if ne.size else m


def reusable_prefix(prompts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """For every request r (in order): the longest common prefix, in tokens, of its prompt with any earlier
    prompt, and that earlier request (−1 if none).

    Offline and exact: prompts sorted lexicographically by token (big-endian bytes), the LCP of r with a set
    of strings is reached at r's nearest neighbours in sorted order among the earlier ones (the previous
    request index smaller than r on each side: monotone stacks), and the LCP of two sorted positions is the
    minimum of the adjacent LCPs between them (a sparse table)."""
    n = len(prompts)
    lcp = np.zeros(n, np.int64)
    partner = np.full(n, -1, np.int64)
    if n < 2:
        return lcp, partner
    keys = [p.astype(">u4").tobytes() for p in prompts]
    order = sorted(range(n), key=keys.__getitem__)
    del keys
    adj = np.array([_lcp(prompts[order[i]], prompts[order[i + 1]]) for i in range(n - 1)], np.int64)
    # sparse table over adj for range minima
    table = [adj]
    k = 1
    while (1 << k) <= adj.size:
        prev = table[-1]
        half = 1 << (k - 1)
        table.append(np.minimum(prev[:-half], prev[half:]))
        k += 1

    def range_min(i: int, j: int) -> int:  # min adj[i..j-1], i < j
        L = j - i
        lv = L.bit_length() - 1
        t = table[lv]
        return int(min(t[i], t[j - (1 << lv)]))

    idx = np.asarray(order, np.int64)
    left = np.full(n, -1, np.int64)  # sorted position of the nearest earlier request to the left
    right = np.full(n, -1, np.int64)
    stack: list[int] = []
    for pos in range(n):
        r = idx[pos]
        while stack and idx[stack[-1]] > r:
            stack.pop()
        left[pos] = stack[-1] if stack else -1
        stack.append(pos)
    stack = []
    for pos in range(n - 1, -1, -1):
        r = idx[pos]
        while stack and idx[stack[-1]] > r:
            stack.pop()
        right[pos] = stack[-1] if stack else -1
        stack.append(pos)
    for pos in range(n):
        r = int(idx[pos])
        best, who = -1, -1
        if left[pos] >= 0:
            v = range_min(int(left[pos]), pos)
            best, who = v, int(idx[left[pos]])
        if right[pos] >= 0:
            v = range_min(pos, int(right[pos]))
            if v > best or (v == best and int(idx[right[pos]]) > who):
                best, who = v, int(idx[right[pos]])
        if who >= 0:
            lcp[r], partner[r] = best, who
    return lcp, partner


def _history_blocks(trace, T: np.ndarray, b: int) -> np.ndarray:
    """R_j of the paper-tail rule (:mod:`kvhit.workload.blocks`) in blocks of b: the trace's column when b is its
    block size, else recomputed from the prompt lengths T_j."""
    from kvhit.workload.blocks import block_accounting

    if trace.block_size == b:
        return trace["R"]
    conv, turn = trace.dense_conv(), trace["turn"]
    order = np.lexsort((turn, conv))
    Ts, cs = T[order], conv[order]
    first = np.concatenate([[True], cs[1:] != cs[:-1]])
    p = Ts - np.where(first, 0, np.concatenate([[0], Ts[:-1]]))
    if (p < 1).any():
        raise ExplainError("--block-size: the trace's prompts do not grow turn by turn; cannot re-block its R_j")
    acc = block_accounting(np.bincount(cs), p, np.zeros_like(p), b)
    R = np.empty_like(acc["R"])
    R[order] = acc["R"]
    return R


def _hold(T: np.ndarray, speed: float | None) -> np.ndarray | None:
    return None if speed is None else T.astype(np.float64) / float(speed)


def explain_trace(
    trace,
    *,
    N: int,
    engine: str = "vllm",
    block_size: int | None = None,
    prefill_tokens_per_s: float | None = None,
    replicas: int = 1,
    router: str | None = None,
    host_blocks: int | None = None,
    seed: int = 0,
    prompts: list[np.ndarray] | None = None,
) -> Waterfall:
    """Measure every stage of the module docstring on ``trace`` (rows in trace order)."""
    from kvhit.sim.content.lru import simulate_content
    from kvhit.sim.runner import block_requests
    from kvhit.sim.vllm.block import ENGINES, simulate_block

    if engine not in ENGINES:
        raise ExplainError(f"--engine: explain models {', '.join(sorted(ENGINES))} (SGLang is not modelled here)")
    if isinstance(N, bool) or int(N) != N or N < 1:
        raise ExplainError(f"--N: expected a positive integer, got {N!r}")
    if replicas < 1:
        raise ExplainError(f"--replicas: expected ≥ 1, got {replicas}")
    if replicas > 1 and host_blocks is not None:
        raise ExplainError("--host-blocks with --replicas > 1: a host tier behind a fleet is not modelled")
    if replicas == 1 and router is not None:
        raise ExplainError("--router: needs --replicas ≥ 2")
    b = int(block_size or trace.block_size or 0)
    if b < 1:
        raise ExplainError("--block-size: the trace records no block size; give one")
    n = trace.n_turns
    if n == 0:
        raise ExplainError("the trace has no rows")
    N_total = int(N) * int(replicas)
    rq = block_requests(trace, block_size=b)
    T = rq.prompt_tokens.astype(np.int64)
    conv = trace.dense_conv()
    turn = trace["turn"]
    if prompts is None:
        prompts = full_prompts(trace)
    partner = None
    if prompts is not None:
        h0, partner = reusable_prefix(prompts)
    elif "cum_tokens" in trace.cols:
        h0 = np.zeros(n, np.int64)
        order = np.lexsort((turn, conv))
        ct = trace["cum_tokens"][order]
        same = np.concatenate([[False], conv[order][1:] == conv[order][:-1]])
        h0[order] = np.where(same, np.concatenate([[0], ct[:-1]]), 0)
    else:
        raise ExplainError("the trace has neither token ids (new_tokens) nor token counts (cum_tokens)")
    h0 = np.minimum(h0, T)
    # capacity: Algorithm 1 at N_total, on R_j in blocks of b (re-blocked when b is not the trace's block size)
    alg1 = simulate_content(conv, _history_blocks(trace, T, b), N_total).hit.astype(bool)
    first_row = np.full(int(conv.max()) + 1, -1, np.int64)
    fr = turn == 1
    first_row[conv[fr]] = np.flatnonzero(fr)
    h0_first = h0[first_row[conv]]
    h1 = np.where(alg1 | (turn == 1), h0, np.minimum(h0, h0_first))
    # engine: vLLM block cache at N_total, instantaneous
    res = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=N_total, block_size=b, engine=engine)
    h2 = np.where(res.rejected, 0, res.hit_blocks * b).astype(np.int64)
    hold = _hold(T, prefill_tokens_per_s)
    times = trace["time"]
    if hold is not None:
        res3 = simulate_block(
            rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=N_total, block_size=b, engine=engine, times=times, hold=hold
        )
        h3 = np.where(res3.rejected, 0, res3.hit_blocks * b).astype(np.int64)
    else:
        h3 = h2
    if replicas > 1:
        from kvhit.fleet.simulate import simulate_fleet

        try:
            fl = simulate_fleet(
                rq.prompt_tokens,
                rq.hash_offsets,
                rq.hashes,
                conv,
                Ns=[int(N)] * int(replicas),
                block_size=b,
                router=router or "round-robin",
                engine=engine,
                times=times,
                hold=hold,
                seed=seed,
            )
        except ValueError as e:
            raise ExplainError(f"--router: {e}") from None
        h4 = np.where(fl.rejected, 0, fl.hit_blocks * b).astype(np.int64)
    else:
        h4 = h3
    if host_blocks is not None:
        if host_blocks < 1:
            raise ExplainError(f"--host-blocks: expected ≥ 1, got {host_blocks}")
        from kvhit.sim.engine import replay, requests_from_stream
        from kvhit.sim.tiers import make_tiered

        eng = make_tiered("native", gpu_blocks=N_total, host_capacity=int(host_blocks), block_size=b, engine=engine)
        reqs = requests_from_stream(rq.prompt_tokens, rq.hash_offsets, rq.hashes)
        rr = replay(eng, reqs, times=times if hold is not None else None, hold=hold)
        h5 = np.where(rr.rejected, 0, rr.hit_tokens).astype(np.int64)
    else:
        h5 = h4
    hits = {"reusable": h0, "capacity": h1, "engine": h2, "concurrency": h3, "routing": h4, "host tier": h5}
    configured = {
        "reusable": True,
        "capacity": True,
        "engine": True,
        "concurrency": hold is not None,
        "routing": replicas > 1,
        "host tier": host_blocks is not None,
    }
    return Waterfall(
        prompt_tokens=T,
        block_size=b,
        hits=hits,
        configured=configured,
        N=int(N),
        engine=engine,
        replicas=int(replicas),
        router=(router or "round-robin") if replicas > 1 else None,
        host_blocks=host_blocks,
        prefill_tokens_per_s=prefill_tokens_per_s,
        partner=partner,
        extra={"rejected_engine": int(res.n_rejected), "N_total": N_total},
    )
