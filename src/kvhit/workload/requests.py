"""The block simulator's request stream: what :func:`kvhit.sim.vllm.block.simulate_block` consumes.

It lives in ``workload`` (the bottom layer) because the readers build it directly from production block-id
traces (:meth:`kvhit.workload.production.ProductionTrace.block_requests`) and from kvhit traces
(:func:`kvhit.sim.runner.block_requests`); the simulators only read it.

Invariant: ``hashes[hash_offsets[r]:hash_offsets[r + 1]]`` are request r's chained full-block ids in prompt
order (then, when ``response_tokens`` is set, the blocks its response completes). Not modelled here: anything
about the cache itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["BlockRequests"]


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
