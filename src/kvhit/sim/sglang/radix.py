"""Compiled fast path of the SGLang radix-cache model (:class:`kvhit.sim.sglang.engine.SglangEngine`).

Same model, same decisions, request by request — hit tokens, evicted tokens and nodes, waits, rejections —
as the step-wise :class:`~kvhit.sim.sglang.engine.SglangEngine` driven by :func:`kvhit.sim.engine.replay`
(read their docstrings for what SGLang 0.5.23 does and what is not modelled); tested equal on random
workloads (``tests/test_radix.py``) and timed in ``benchmarks/bench_radix.py``.

Workload representation (:class:`TokenStreams`). A multi-turn workload's token sequences are prefixes of a
few long *streams*: request ``j`` of a conversation is the first ``T_j`` tokens of the conversation's stream
(history + new turn), and its ``n_j`` output tokens are the stream's next tokens (the next turn's prompt
starts with them). A stream is a list of *runs*; run ``(sym, idx, len)`` stands for the tokens ``(sym, idx),
(sym, idx + 1), …, (sym, idx + len − 1)`` — a token is equal to another exactly when both components are.
Real token ids are runs of length 1; a synthetic conversation is one run; a production block-id trace gives
one ``b``-token run per block id. Two sequences are compared run by run, so matching costs
``O(runs)``, not ``O(tokens)``.

The tree is :mod:`kvhit.sim.sglang.radix_tree` (arrays, eviction heap, tree operations); the request-level
kernel :mod:`kvhit.sim.sglang.radix_kernel`; here the workload and result types and the checked entry point.

Invariant: ``available + tokens in the tree + tokens held by running requests outside the tree =
capacity`` after every event; the outcome of every request equals the step-wise engine's.
NOT modelled: what :mod:`kvhit.sim.sglang.engine` does not model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvhit.sim.sglang.radix_kernel import _radix_kernel
from kvhit.sim.sglang.radix_tree import _ERR, _EVT_ALL, _PEAK

__all__ = ["CACHES", "POLICIES", "RadixResult", "TokenStreams", "simulate_radix"]

#: eviction policies modelled (code passed to the kernel, with the cache class and T-LRU's tail budget)
POLICIES = {"lru": 0, "fifo": 1, "mru": 2, "filo": 3, "lfu": 4, "slru": 5, "priority": 6, "tlru": 7}
#: cache classes: UnifiedRadixCache (default; a split's upper node keeps the creation time) and RadixCache
CACHES = ("unified", "radix")


@dataclass(frozen=True)
class TokenStreams:
    """Requests as prefixes of token streams (see the module docstring).

    Runs: ``run_sym``, ``run_idx``, ``run_len`` (int64); stream ``s`` owns runs ``stream_off[s] ..
    stream_off[s+1]``. Request ``r`` reads stream ``stream[r]``: its prompt is the first ``prompt_tokens[r]``
    tokens, its output the next ``output_tokens[r]`` (the model needs ``T + max(n, 1) − 1`` of them).
    ``source`` says where the token identities came from.
    """

    run_sym: np.ndarray
    run_idx: np.ndarray
    run_len: np.ndarray
    stream_off: np.ndarray
    stream: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str = "runs"

    def __post_init__(self) -> None:
        for name in ("run_sym", "run_idx", "run_len", "stream_off", "stream", "prompt_tokens", "output_tokens"):
            a = np.ascontiguousarray(getattr(self, name), dtype=np.int64)
            if a.ndim != 1:
                raise ValueError(f"{name}: expected a 1-d array")
            object.__setattr__(self, name, a)
        R = self.run_sym.shape[0]
        if self.run_idx.shape[0] != R or self.run_len.shape[0] != R:
            raise ValueError("run_sym, run_idx, run_len: expected equal lengths")
        if R and self.run_len.min() < 1:
            raise ValueError("run_len: every run needs at least one token")
        so = self.stream_off
        if so.shape[0] < 1 or so[0] != 0 or so[-1] != R or (np.diff(so) < 0).any():
            raise ValueError("stream_off: expected a CSR offset array from 0 to the number of runs")
        n = self.stream.shape[0]
        if self.prompt_tokens.shape[0] != n or self.output_tokens.shape[0] != n:
            raise ValueError("stream, prompt_tokens, output_tokens: expected equal lengths")
        if n:
            if self.stream.min() < 0 or self.stream.max() >= so.shape[0] - 1:
                raise ValueError("stream: index out of range")
            if self.prompt_tokens.min() < 1:
                raise ValueError("prompt_tokens: every request needs at least one prompt token")
            if self.output_tokens.min() < 0:
                raise ValueError("output_tokens: expected ≥ 0")
            need = self.prompt_tokens + np.maximum(self.output_tokens, 1) - 1
            have = self.stream_lengths()[self.stream]
            bad = np.flatnonzero(need > have)
            if bad.size:
                r = int(bad[0])
                raise ValueError(
                    f"request {r}: needs {int(need[r])} tokens of stream {int(self.stream[r])}, "
                    f"which has {int(have[r])}"
                )

    @property
    def n_requests(self) -> int:
        return int(self.stream.shape[0])

    def stream_lengths(self) -> np.ndarray:
        cs = np.concatenate([[0], np.cumsum(self.run_len)])
        return cs[self.stream_off[1:]] - cs[self.stream_off[:-1]]

    def tokens(self, r: int) -> tuple:
        """Request ``r``'s ``T + max(n, 1) − 1`` tokens as ``(sym, idx)`` pairs (for the step-wise engine)."""
        need = int(self.prompt_tokens[r] + max(int(self.output_tokens[r]), 1) - 1)
        s = int(self.stream[r])
        out: list = []
        for i in range(int(self.stream_off[s]), int(self.stream_off[s + 1])):
            sym, idx, ln = int(self.run_sym[i]), int(self.run_idx[i]), int(self.run_len[i])
            out.extend((sym, idx + k) for k in range(min(ln, need - len(out))))
            if len(out) >= need:
                break
        return tuple(out)

    def to_requests(self) -> list:
        """The workload as :class:`kvhit.sim.engine.Request` objects (``token_ids`` = :meth:`tokens`)."""
        from kvhit.sim.engine import Request

        return [
            Request(
                rid=r,
                prompt_tokens=int(self.prompt_tokens[r]),
                output_tokens=int(self.output_tokens[r]),
                token_ids=self.tokens(r),
            )
            for r in range(self.n_requests)
        ]


@dataclass(frozen=True)
class RadixResult:
    """Per request (input order): ``hit_tokens``, ``evicted_tokens`` / ``evicted_nodes`` (by its admission,
    counting its decode steps), ``wait`` (NaN if rejected), ``rejected``; and totals."""

    hit_tokens: np.ndarray
    evicted_tokens: np.ndarray
    evicted_nodes: np.ndarray
    wait: np.ndarray
    rejected: np.ndarray
    prompt_tokens: np.ndarray
    capacity: int
    page_size: int
    evict_policy: str
    peak_in_use: int  #: max slots held by running requests or locked nodes, after an admission
    evictions: int  #: tokens evicted in all
    cache: str = "unified"  #: SGLang cache class modelled (``unified`` or ``radix``)

    @property
    def n_rejected(self) -> int:
        return int(self.rejected.sum())

    def token_hit_ratio(self, mask=None) -> float:
        """SGLang's ``cached_tokens / prompt_tokens`` summed over the (measured) requests; rejected requests
        count as misses of their whole prompt."""
        m = np.ones(self.hit_tokens.shape[0], bool) if mask is None else np.asarray(mask, bool)
        T = self.prompt_tokens[m].sum()
        return float(self.hit_tokens[m].sum() / T) if T else float("nan")

    def request_hit_rate(self, mask=None) -> float:
        m = np.ones(self.hit_tokens.shape[0], bool) if mask is None else np.asarray(mask, bool)
        return float((self.hit_tokens[m] > 0).mean()) if m.any() else float("nan")


def simulate_radix(
    ts: TokenStreams,
    capacity: int,
    *,
    page_size: int = 1,
    evict_policy: str = "lru",
    times=None,
    hold=None,
    cache: str = "unified",
    tlru_tail_budget: int = 0,
) -> RadixResult:
    """Run the SGLang radix-cache model over ``ts`` with a KV pool of ``capacity`` tokens.

    ``cache``, ``tlru_tail_budget``: as :class:`~kvhit.sim.sglang.engine.SglangEngine` (``unified`` by default;
    ``radix`` differs only for ``fifo``/``filo``).

    Timing as :func:`kvhit.sim.engine.replay` (and :func:`kvhit.sim.vllm.block.simulate_block`): without ``hold``
    each request runs alone (admitted, decoded and finished at once); with ``hold`` request ``r`` arrives at
    ``times[r]``, waits FIFO, and finishes ``hold[r]`` seconds after it starts.
    """
    p = page_size
    if isinstance(p, bool) or not isinstance(p, int | np.integer) or p < 1:
        raise ValueError(f"page_size: expected a positive integer, got {page_size!r}")
    if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer) or capacity < p or capacity % p:
        raise ValueError(f"capacity: expected a positive multiple of page_size ({p}) tokens, got {capacity!r}")
    if evict_policy not in POLICIES:
        raise ValueError(f"evict_policy: expected one of {sorted(POLICIES)}, got {evict_policy!r}")
    if cache not in CACHES:
        raise ValueError(f"cache: expected one of {list(CACHES)}, got {cache!r}")
    if evict_policy == "tlru" and cache != "unified":
        raise ValueError("evict_policy='tlru' needs cache='unified' (SGLang refuses T-LRU on RadixCache)")
    B = tlru_tail_budget
    if isinstance(B, bool) or not isinstance(B, int | np.integer) or B < 0 or B >= 1 << 40:
        raise ValueError(f"tlru_tail_budget: expected an integer in [0, 2**40), got {tlru_tail_budget!r}")
    pol = POLICIES[evict_policy] | (8 if cache == "unified" else 0) | (int(B) << 4)
    n = ts.n_requests
    use_events = hold is not None
    if use_events:
        tm = np.ascontiguousarray(times, np.float64)
        hd = np.ascontiguousarray(hold, np.float64)
        if tm.shape != (n,) or hd.shape != (n,):
            raise ValueError(f"times/hold: expected {n} values each")
        if not (np.isfinite(tm).all() and np.isfinite(hd).all()) or (hd < 0).any() or (np.diff(tm) < 0).any():
            raise ValueError("times/hold: expected finite values, hold ≥ 0, times non-decreasing")
    else:
        tm = np.zeros(0, np.float64)
        hd = np.zeros(0, np.float64)
    run_pos = np.zeros(ts.run_len.shape[0], np.int64)
    if ts.run_len.shape[0]:
        cs = np.concatenate([[0], np.cumsum(ts.run_len)])
        # position of each run inside its own stream
        sid = np.repeat(np.arange(ts.stream_off.shape[0] - 1), np.diff(ts.stream_off))
        run_pos = cs[:-1] - cs[ts.stream_off[sid]]
    hit, evt, evn, wait, rej, st = _radix_kernel(
        ts.run_sym,
        ts.run_idx,
        ts.run_len,
        run_pos,
        ts.stream_off,
        ts.stream,
        ts.prompt_tokens,
        ts.output_tokens,
        int(capacity),
        int(p),
        pol,
        tm,
        hd,
        use_events,
    )
    if st[_ERR]:
        raise RuntimeError(f"radix kernel: internal error {int(st[_ERR])}")  # pragma: no cover
    return RadixResult(
        hit_tokens=hit,
        evicted_tokens=evt,
        evicted_nodes=evn,
        wait=wait,
        rejected=rej,
        prompt_tokens=ts.prompt_tokens,
        capacity=int(capacity),
        page_size=int(p),
        evict_policy=evict_policy,
        peak_in_use=int(st[_PEAK]),
        evictions=int(st[_EVT_ALL]),
        cache=cache,
    )
