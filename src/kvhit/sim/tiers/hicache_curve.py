"""Hit ratio of SGLang with HiCache over a grid of device pools and host pools (``--hicache-ratio`` curves).

``h(C, H) = Σ_r (g_r + c_r) / Σ_r T_r`` over admitted requests (device prefix hit plus host tokens loaded, over
prompt tokens) for a device pool of ``C = N · b`` tokens (``N`` = ``hbm_blocks``) and a host pool of ``H``
tokens sized as SGLang sizes it (:func:`kvhit.sim.tiers.hicache.host_tokens`: from ``--hicache-ratio``,
``--hicache-size`` or given in tokens). Every pair is a full sequential replay of
:class:`~kvhit.sim.sglang.engine.SglangEngine` with a :class:`~kvhit.sim.tiers.hicache.HiCacheTier` (no ``hold``):
unlike vLLM's tiers the device state depends on the host tier (loads re-fill evicted nodes, demoted nodes stay
in the tree), so nothing is shared between pairs; ``gpu_hit`` is SGLang without HiCache at each ``C``.

Token ids: the step-wise SGLang model keys on tokens. A kvhit block stream (chained block hashes, ``T`` prompt
tokens) is expanded by :func:`token_requests`: token ``j`` of full block ``k`` is ``hash_k · b + j`` (equal blocks,
equal tokens; distinct blocks differ at their first token), the ``T mod b`` tokens after the last full block are
unique to the request. So sharing is resolved to whole blocks, as the trace records it: SGLang's token
granularity can only add the ``b − 1`` tokens of a last, capped block (``T − 1``); the tokens of a turn's
partial last block that the next turn shares are not seen (the trace does not say they are shared).

Not modelled: what :mod:`kvhit.sim.tiers.hicache` does not model; outputs (block streams carry prompts only:
each request is a one-token generation, so responses are not inserted); timing (``hold``).
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from kvhit.sim.engine import Request, replay

__all__ = ["HiCacheSurface", "hicache_surface", "token_requests", "trace_token_requests"]


def token_requests(prompt_tokens, hash_offsets, hashes, block_size: int) -> list[Request]:
    """A kvhit block stream as token-level :class:`~kvhit.sim.engine.Request` s (see module docstring)."""
    T = np.asarray(prompt_tokens, np.int64)
    off = np.asarray(hash_offsets, np.int64)
    hs = np.asarray(hashes)
    hs = hs.view(np.uint64) if hs.dtype == np.int64 else hs.astype(np.uint64)
    b = int(block_size)
    out = []
    for r in range(T.shape[0]):
        t = int(T[r])
        blocks = [int(h) for h in hs[off[r] : off[r + 1]]][: t // b]
        toks = [h * b + j for h in blocks for j in range(b)]
        toks += [-((r + 1) << 32) - i for i in range(t - len(toks))]
        out.append(Request(rid=r, prompt_tokens=t, output_tokens=1, token_ids=tuple(toks)))
    return out


@dataclass
class HiCacheSurface:
    """``hit[i, j]`` = h(``hbm_blocks[i]``, column ``j``); ``host_tokens[i, j]`` the host pool of that pair."""

    tier: str
    gpu_blocks: np.ndarray  #: rows: device pool in blocks (``C = N · block_size`` tokens)
    host: np.ndarray  #: column values (ratios, GB or host tokens, as given)
    host_tokens: np.ndarray
    hit: np.ndarray
    gpu_hit: np.ndarray  #: SGLang without HiCache at each C
    device_hit: np.ndarray  #: Σ g / Σ T per pair (the device part of ``hit``)
    load_tokens: np.ndarray  #: Σ c_r per pair
    prompt_tokens: int
    admitted: np.ndarray


def _pair(args):
    reqs, C, H, p, policy = args
    from kvhit.sim.sglang.engine import SglangEngine
    from kvhit.sim.tiers.hicache import HiCacheTier

    host = None if H is None else HiCacheTier(int(H), write_policy=policy)
    e = SglangEngine(int(C), page_size=p, host=host)
    res = replay(e, reqs)
    g = np.array([(o.gpu_hit_tokens if host else o.hit_tokens) if o else 0 for o in res.outcomes], np.int64)
    c = np.array([o.cpu_hit_tokens if (o and host) else 0 for o in res.outcomes], np.int64)
    return g, c, ~res.rejected


def hicache_surface(
    requests: list[Request],
    *,
    hbm_blocks,
    block_size: int,
    host_tokens,
    columns=None,
    write_policy: str = "write_through",
    page_size: int = 1,
    workers: int = 1,
) -> HiCacheSurface:
    """h over ``hbm_blocks`` × columns; ``host_tokens[i][j]`` – the host pool (tokens) of each pair (see
    :func:`kvhit.sim.tiers.hicache.host_tokens`); ``columns`` – the column values to report (default: the
    host tokens of the first row)."""
    Ns = np.asarray(hbm_blocks, np.int64)
    Hs = np.asarray(host_tokens, np.int64)
    if Ns.ndim != 1 or not len(Ns) or Hs.shape[0] != len(Ns) or Hs.ndim != 2 or not Hs.shape[1]:
        raise ValueError("hbm_blocks and host_tokens: expected N values and an N × K grid")
    b, p = int(block_size), int(page_size)
    Cs = [int(N) * b for N in Ns]
    tasks = [(requests, C, None, p, write_policy) for C in Cs]
    tasks += [(requests, C, int(H), p, write_policy) for i, C in enumerate(Cs) for H in Hs[i]]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as ex:
            outs = list(ex.map(_pair, tasks))
    else:
        outs = [_pair(t) for t in tasks]
    T = np.array([q.prompt_tokens for q in requests], np.int64)
    K = Hs.shape[1]
    plain, pairs = outs[: len(Ns)], outs[len(Ns) :]
    den = np.array([T[a].sum() for _, _, a in plain], np.float64)
    den = np.where(den > 0, den, np.nan)
    gpu_hit = np.array([g[a].sum() for g, _, a in plain], np.float64) / den
    hit = np.zeros((len(Ns), K))
    dev = np.zeros((len(Ns), K))
    load = np.zeros((len(Ns), K), np.int64)
    for k, (g, c, a) in enumerate(pairs):
        i, j = divmod(k, K)
        hit[i, j] = (g + c)[a].sum() / den[i]
        dev[i, j] = g[a].sum() / den[i]
        load[i, j] = c[a].sum()
    cols = Hs[0] if columns is None else np.asarray(columns)
    return HiCacheSurface(
        tier=f"hicache-{write_policy}",
        gpu_blocks=Ns,
        host=cols,
        host_tokens=Hs,
        hit=hit,
        gpu_hit=gpu_hit,
        device_hit=dev,
        load_tokens=load,
        prompt_tokens=int(T.sum()),
        admitted=np.array([int(a.sum()) for _, _, a in plain]),
    )


def trace_token_requests(trace) -> list[Request] | None:
    """Token-level requests from a kvhit trace that keeps token ids (``new_tokens`` list column: each turn's new
    tokens; the prompt is the conversation's tokens so far), in the trace's row order; ``None`` without them."""
    if "new_tokens" not in trace.lists:
        return None
    conv = trace.dense_conv()
    order = np.lexsort((trace["turn"], conv))
    new = trace.lists["new_tokens"]
    hist: dict[int, list[int]] = {}
    prompts: list[tuple[int, ...] | None] = [None] * trace.n_turns
    for r in order:  # conversation-major: the prompt of a turn is every earlier turn's new tokens plus its own
        h = hist.setdefault(int(conv[r]), [])
        h.extend(int(x) for x in new[r])
        prompts[r] = tuple(h)
    return [Request(rid=r, prompt_tokens=len(p), output_tokens=1, token_ids=p) for r, p in enumerate(prompts)]
