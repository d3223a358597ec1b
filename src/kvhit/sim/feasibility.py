"""Which capacities can serve a workload at all: requests a KV pool of ``N`` blocks must refuse.

A request needing ``ceil(L/b)`` blocks (``L = T`` prompt tokens; ``T + response − 1`` colocated) can never be admitted
to a pool of ``N < ceil(L/b)`` usable blocks: vLLM refuses to start when ``max_model_len`` exceeds the KV cache, and
the block simulator (:mod:`kvhit.sim.vllm.block`) *rejects* such a request. A hit ratio measured over the admitted
requests only is not the workload's hit ratio — it leaves out the longest (and most reusable) prompts, can exceed
the infinite-cache ceiling and can *fall* as ``N`` grows. So every front end reports ``N < N_min =
max_j ceil(L_j/b)`` as **infeasible**, with the share of requests and of prompt tokens that would be refused, and
prints no hit ratio there.

Invariant: ``feasible[k] ⇔ N_k ≥ N_min`` (and, without a ``mask``, ``⇔ refused_requests[k] = 0``); the refused
shares are nonincreasing in ``N`` and are computed over the measured requests (``mask``).

NOT modelled: a server that truncates or splits long prompts instead of refusing them (then the ratio of the
truncated workload is a different question).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvhit.workload.requests import kv_tokens

__all__ = ["Feasibility", "feasibility"]


@dataclass(frozen=True)
class Feasibility:
    """Per capacity ``N[k]``: ``feasible`` (no request refused), ``refused_requests`` / ``refused_tokens`` (shares
    of the measured requests and of their prompt tokens that need more than ``N`` blocks) and ``N_min``."""

    N: np.ndarray
    N_min: int
    feasible: np.ndarray
    refused_requests: np.ndarray
    refused_tokens: np.ndarray
    n_requests: int
    prompt_tokens: int

    def to_dict(self) -> dict:
        return {
            "N_min": self.N_min,
            "feasible": self.feasible.tolist(),
            "refused_request_share": self.refused_requests.tolist(),
            "refused_token_share": self.refused_tokens.tolist(),
        }

    def row(self, k: int) -> dict:
        """The entries of capacity ``N[k]`` for a table or JSON row."""
        return {
            "feasible": bool(self.feasible[k]),
            "refused_request_share": float(self.refused_requests[k]),
            "refused_token_share": float(self.refused_tokens[k]),
        }


def feasibility(prompt_tokens, block_size: int, Ns, *, mask=None, response_tokens=None) -> Feasibility:
    """Refused shares at every capacity in ``Ns`` (any order) for requests of ``prompt_tokens`` tokens.

    ``response_tokens`` (colocated serving) adds the first ``m − 1`` generated tokens to the blocks a request
    holds (:func:`~kvhit.workload.requests.kv_tokens`). ``mask`` (bool per
    request) selects the measured requests; ``N_min`` is over *all* requests (one refused request anywhere makes
    the capacity unable to serve the workload).
    """
    T = np.asarray(prompt_tokens, dtype=np.int64)
    b = int(block_size)
    if b < 1:
        raise ValueError(f"block_size: expected a positive integer, got {block_size!r}")
    L = T if response_tokens is None else kv_tokens(T, response_tokens)
    need = -(-L // b)
    Ns = np.atleast_1d(np.asarray(Ns, dtype=np.int64))
    m = np.ones(T.shape[0], bool) if mask is None else np.asarray(mask, bool)
    n_min = int(need.max()) if need.size else 0
    nm = need[m]
    order = np.argsort(nm, kind="stable")
    sn = nm[order]
    ctok = np.concatenate([[0], np.cumsum(T[m][order])])
    k = np.searchsorted(sn, Ns, side="right")  # requests needing ≤ N blocks
    n = int(sn.shape[0])
    tot = int(ctok[-1])
    with np.errstate(invalid="ignore", divide="ignore"):
        rq = (n - k) / n if n else np.zeros(Ns.shape)
        tk = (tot - ctok[k]) / tot if tot else np.zeros(Ns.shape)
    return Feasibility(
        N=Ns,
        N_min=n_min,
        feasible=Ns >= n_min,
        refused_requests=np.asarray(rq, float),
        refused_tokens=np.asarray(tk, float),
        n_requests=n,
        prompt_tokens=tot,
    )
