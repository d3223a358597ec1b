"""The block simulator's request stream: what :func:`kvhit.sim.vllm.block.simulate_block` consumes.

It lives in ``workload`` (the bottom layer) because the readers build it directly from production block-id
traces (:meth:`kvhit.workload.production_trace.ProductionTrace.block_requests`) and from kvhit traces
(:func:`kvhit.sim.runner.block_requests`); the simulators only read it.

Invariant: ``hashes[hash_offsets[r]:hash_offsets[r + 1]]`` are request r's chained full-block ids in prompt
order (then, when ``response_tokens`` is set, the blocks its response completes: ``kv_tokens(T, m) // b`` ids in all,
the prompt and the first ``m − 1`` generated tokens, :func:`kv_tokens`). Not modelled here: anything
about the cache itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["BlockRequests", "kv_tokens"]


def kv_tokens(prompt_tokens, response_tokens):
    """Tokens whose KV a colocated vLLM request holds and caches: the prompt and the first ``m − 1`` of its ``m``
    generated tokens. The last sampled token is returned to the client but never fed back through the model, so
    it never gets KV (vLLM 0.32.0 on a live server: a next turn hits the block ending at ``T + m − 1``, never the
    one ending at ``T + m``; ``live/facts.py``). ``m = 0`` keeps the prompt only. Scalars or arrays."""
    T = np.asarray(prompt_tokens, dtype=np.int64)
    m = np.asarray(response_tokens, dtype=np.int64)
    out = T + np.maximum(m - 1, 0)
    return int(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class BlockRequests:
    """A trace turned into the block simulator's request stream (row order of the trace = request order).

    ``source`` says where the block identities came from: ``"tokens"`` (chained hashes of real token ids, like
    vLLM), ``"counts"`` (synthetic ids from conversation and block index, token counts from ``cum_tokens``) or
    ``"blocks"`` (block counts only: T_j = R_j·b − 1 tokens, i.e. R_j − 1 full blocks and one partial block —
    the paper's practical model, eq. (28)).
    """

    prompt_tokens: np.ndarray
    hash_offsets: np.ndarray
    hashes: np.ndarray
    response_tokens: np.ndarray | None
    block_size: int
    source: str
