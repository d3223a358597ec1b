"""Predict exactly what a replay recorded, and compare it request by request with what the server measured.

The recorded sequence — each request's prompt ids as sent and the output ids the server returned — is run
through kvhit's step-wise vLLM engine (:class:`kvhit.sim.vllm.engine.VllmEngine`) in the colocated mode, with
the server's own configuration read from its ``vllm:cache_config_info``:

* ``N = num_gpu_blocks − 1`` usable blocks (vLLM's block 0 is the reserved null block);
* a request of ``T`` prompt tokens and ``m`` generated tokens keeps the KV of ``T + m − 1`` tokens: the last
  sampled token is never fed back, so it never gets KV (``output_cached="m-1"``; ``"m"`` and ``"0"`` — the PD
  prefiller — are there to show what a wrong rule gives);
* block hashes are chained over the token ids (``prompt + output[:m−1]``), so a later prompt that repeats a
  conversation's history and the returned tokens hits exactly the blocks vLLM would find.

Sequential replays are simulated request by request with nothing in flight; concurrent ones with holds from
the measured send/finish times (:func:`kvhit.sim.engine.replay` with ``times``/``hold``): the engine's
scheduler (batching, chunked prefill, decode allocation step by step, preemption) is not modelled, so there
only the aggregate is compared.

The engine-aware estimator (:func:`kvhit.estimate.estimate_engine`) is evaluated on the recorded prompts
(``cum_tokens`` = the prompt length sent) at the same ``N``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CheckResult", "OUTPUT_RULES", "compare", "estimate_recorded", "recorded_trace", "simulate_recorded"]

#: how many generated tokens keep KV: vLLM caches ``m − 1`` (the default); ``m`` and ``0`` are controls
OUTPUT_RULES = ("m-1", "m", "0")


def _cached_outputs(m: int, rule: str) -> int:
    if rule == "m-1":
        return max(m - 1, 0)
    if rule == "m":
        return m
    if rule == "0":
        return 0
    raise ValueError(f"output_cached: expected one of {OUTPUT_RULES}, got {rule!r}")


def simulate_recorded(
    prompts,
    outputs,
    *,
    block_size: int,
    num_gpu_blocks: int,
    engine: str = "vllm",
    output_cached: str = "m-1",
    t_send=None,
    t_done=None,
) -> np.ndarray:
    """Simulated hit tokens of each recorded request (-1: kvhit's engine would reject it).

    ``prompts``/``outputs``: per request the token ids sent and returned (request order = send order for a
    sequential replay); ``t_send``/``t_done`` (both or neither): measured times, simulated as holds.
    """
    from kvhit.sim.engine import Request, replay
    from kvhit.sim.vllm.blockids import hashes_from_token_ids
    from kvhit.sim.vllm.engine import VllmEngine

    n = len(prompts)
    if num_gpu_blocks < 2:
        raise ValueError(f"num_gpu_blocks: expected ≥ 2 (one is vLLM's null block), got {num_gpu_blocks}")
    seqs, T, m = [], np.zeros(n, np.int64), np.zeros(n, np.int64)
    for r in range(n):
        p = np.asarray(prompts[r], np.int64)
        o = np.asarray(outputs[r], np.int64)
        k = _cached_outputs(int(o.shape[0]), output_cached)
        seqs.append(np.concatenate([p, o[:k]]))
        # the engine keeps the KV of output_tokens − 1 generated tokens (kvhit.workload.requests.kv_tokens)
        T[r], m[r] = p.shape[0], k + 1
    off, hs = hashes_from_token_ids(seqs, int(block_size)) if n else (np.zeros(1, np.int64), np.zeros(0, np.int64))
    reqs = [Request(r, int(T[r]), tuple(int(x) for x in hs[off[r] : off[r + 1]]), int(m[r])) for r in range(n)]
    eng = VllmEngine(int(num_gpu_blocks) - 1, block_size=int(block_size), engine=engine, colocated=True)
    if t_send is None:
        res = replay(eng, reqs)
        order = np.arange(n)
    else:
        ts = np.asarray(t_send, np.float64)
        td = np.asarray(t_done, np.float64)
        order = np.argsort(ts, kind="stable")
        sreqs = [
            Request(i, reqs[r].prompt_tokens, reqs[r].block_hashes, reqs[r].output_tokens) for i, r in enumerate(order)
        ]
        res = replay(eng, sreqs, times=ts[order], hold=np.maximum(td[order] - ts[order], 0.0))
    hit = np.full(n, -1, np.int64)
    for i, r in enumerate(order):
        o = res.outcomes[i]
        if o is not None:
            hit[r] = o.hit_tokens
    return hit


def recorded_trace(conv, turn, time, prompt_tokens, completion_tokens, block_size: int):
    """The recorded requests as a kvhit :class:`~kvhit.workload.Trace` (``cum_tokens`` = prompt sent)."""
    from kvhit.workload import Trace

    conv = np.asarray(conv, np.int64)
    T = np.asarray(prompt_tokens, np.int64)
    b = int(block_size)
    need = -(-T // b)
    # Z_j ≥ 1 blocks per turn and R = cumsum Z (the trace schema); the estimator reads the prompts from cum_tokens
    order = np.lexsort((np.asarray(turn), conv))
    first = np.ones(conv.size, bool)
    first[order[1:]] = conv[order[1:]] != conv[order[:-1]]
    prev = np.zeros_like(need)
    prev[order[1:]] = need[order[:-1]]
    Z = np.where(first, np.maximum(need, 1), np.maximum(need - prev, 1))
    R = np.empty_like(Z)
    run = 0
    for r in order:
        run = Z[r] if first[r] else run + Z[r]
        R[r] = run
    _, inv, cnt = np.unique(conv, return_inverse=True, return_counts=True)
    tm = np.asarray(time, np.float64)
    first_time = np.full(cnt.size, np.inf)
    np.minimum.at(first_time, inv, tm)
    cols = {
        "conv": conv,
        "conv_arrival": first_time[inv],
        "turn": np.asarray(turn, np.int32),
        "time": tm,
        "M": cnt[inv].astype(np.int32),
        "Z": Z.astype(np.int64),
        "R": R.astype(np.int64),
        "cum_tokens": T,
        "response_tokens": np.asarray(completion_tokens, np.int64),
    }
    return Trace.from_columns(cols, {"block_size": b, "source": "kvhit replay"}, where="recorded replay")


def estimate_recorded(trace, N: int, block_size: int, rows=None) -> float:
    """The engine-aware estimator (vLLM ≥ 0.24, token hit ratio) at ``N`` usable blocks on the recorded trace."""
    from kvhit.estimate import estimate_engine

    est = estimate_engine(trace, int(N), engine="vllm", metric="tokens", block_size=int(block_size), rows=rows)
    return float(est.h)


@dataclass(frozen=True)
class CheckResult:
    """Measured vs simulated, per request and in aggregate (over ``mask``)."""

    n: int
    mismatches: int
    first_mismatch: int | None
    measured_hit_tokens: int
    simulated_hit_tokens: int
    prompt_tokens: int
    measured_ratio: float
    simulated_ratio: float
    rejected: int

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def compare(measured, simulated, prompt_tokens, mask=None) -> CheckResult:
    """Per-request comparison of measured ``cached_tokens`` and simulated hit tokens."""
    meas = np.asarray(measured, np.int64)
    sim = np.asarray(simulated, np.int64)
    T = np.asarray(prompt_tokens, np.int64)
    sel = np.ones(meas.size, bool) if mask is None else np.asarray(mask, bool)
    diff = sel & (meas != sim)
    idx = np.flatnonzero(diff)
    denom = int(T[sel].sum())
    return CheckResult(
        n=int(sel.sum()),
        mismatches=int(diff.sum()),
        first_mismatch=int(idx[0]) if idx.size else None,
        measured_hit_tokens=int(meas[sel].sum()),
        simulated_hit_tokens=int(np.maximum(sim[sel], 0).sum()),
        prompt_tokens=denom,
        measured_ratio=float(meas[sel].sum() / denom) if denom else float("nan"),
        simulated_ratio=float(np.maximum(sim[sel], 0).sum() / denom) if denom else float("nan"),
        rejected=int((sel & (sim < 0)).sum()),
    )
