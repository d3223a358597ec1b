"""The surface h(HBM, DRAM): total token hit ratio over a grid of GPU and host-tier sizes.

``h(N, C) = Σ_r (g_r(N) + c_r(N, C)) / Σ_r T_r`` over admitted requests (vLLM's token metric, GPU plus external
hits: ``vllm:prefix_cache_hits + vllm:external_prefix_cache_hits`` over the prompt tokens), for ``N`` GPU blocks
and ``C`` host units (chunks; CPU blocks for ``simple``). Sequential replay (no ``hold``).

What is computed once, and why it is exact:

1. **GPU independence** (native, LMCache). A host load allocates the blocks a recompute would and the loaded
   blocks become ordinary prefix-cache blocks, so the GPU engine's state, and ``g_r(N)``, depend on the request
   stream only (``tests/test_tiers.py::test_gpu_hits_equal_single_tier``). ``g_r(N)`` is therefore taken from
   the compiled :func:`kvhit.sim.vllm.block.simulate_block`, once per ``N``, and only the host tier is stepped per
   pair (:func:`host_pass`; compiled for LRU without a store threshold: :mod:`kvhit.sim.tiers.native_fast`, tested
   equal). Not for ``simple`` / ``simple-lazy``: their store paths change the GPU free-queue
   order, so every pair is a full replay (:class:`~kvhit.sim.tiers.TieredEngine`,
   :class:`~kvhit.sim.tiers.simple_lazy.SimpleLazyEngine`).
2. **LMCache separation**. LMCache's lookup (prefix from token 0), touch and store (from its own hit ``l``) never
   read ``g``, so ``l_r(C)`` does not depend on ``N`` and ``g_r + c_r = max(g_r, l_r - [l_r = T_r])``. The
   surface costs ``|N grid|`` GPU runs plus ``|C grid|`` host runs, combined per pair in O(n).
3. **No one-pass over DRAM sizes.** A one-pass (stack-distance) computation over ``C`` needs the inclusion
   property (the content at ``C`` is a subset of the content at ``C + 1`` after every request), which implies
   that every request's host hit is non-decreasing in ``C``. Neither tier has it, and the counterexamples are in
   ``tests/test_tiers_surface.py``: vLLM native — the all-or-nothing store (a request's chunks that do not all
   fit are not stored at all, so a small tier can keep older content a larger tier evicted to store them) and
   the recency that depends on ``g`` (GPU-hit chunks are not refreshed when a load happens); LMCache — chunks
   beyond the first lookup miss are not touched when resident but inserted as most recent when absent, so a
   larger tier can hold a *staler* copy and evict it first. Hence the DRAM axis is simulated per size, in
   parallel (``workers``: a process pool; 1 = in process).
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from kvhit.sim.engine import Request, replay, requests_from_stream
from kvhit.sim.vllm.block import simulate_block

__all__ = ["Surface", "host_pass", "hit_surface", "lmcache_lookup_pass"]


@dataclass
class Surface:
    """``hit[i, j]`` = h(``gpu_blocks[i]``, ``host[j]``); ``gpu_hit[i]`` = h(``gpu_blocks[i]``, 0)."""

    tier: str
    gpu_blocks: np.ndarray
    host: np.ndarray
    hit: np.ndarray
    gpu_hit: np.ndarray
    load_tokens: np.ndarray  #: Σ c_r per pair (admitted measured requests)
    prompt_tokens: int  #: of the measured requests
    admitted: np.ndarray  #: admitted measured requests per GPU size (a request larger than the GPU is rejected)


def _host(tier: str, C: int, b: int, kw: dict):
    if tier == "native":
        from kvhit.sim.tiers.native import NativeCpuTier

        return NativeCpuTier(C, block_size=b, **kw)
    if tier == "lmcache":
        from kvhit.sim.tiers.lmcache import LMCacheTier

        return LMCacheTier(C, block_size=b, **kw)
    raise ValueError(f"tier: host-only passes exist for 'native' and 'lmcache', got {tier!r}")


class _NoGpu:
    colocated = False


def host_pass(
    reqs: list[Request], g: np.ndarray, admitted: np.ndarray, *, tier: str, C: int, b: int, **kw
) -> np.ndarray:
    """The host tier alone, driven by the GPU hits ``g`` (tokens) of a sequential replay: loaded tokens per
    request (exact for native and LMCache by GPU independence; see the module docstring)."""
    host = _host(tier, int(C), b, kw)
    host.bind(_NoGpu())
    c = np.zeros(len(reqs), np.int64)
    for r, q in enumerate(reqs):
        if not admitted[r]:
            continue
        gr = int(g[r])
        c[r] = host.lookup(q, gr)
        host.admit(q, gr, int(c[r]))
        host.finish(q)
        host.after_finish(q)
    return c


def lmcache_lookup_pass(
    reqs: list[Request], admitted: np.ndarray, *, C: int, b: int, chunk_tokens: int = 256
) -> np.ndarray:
    """LMCache's own prefix hit ``l_r`` per request (tokens), independent of the GPU (separation, item 2)."""
    from kvhit.sim.tiers.lmcache import LMCacheTier

    host = LMCacheTier(int(C), block_size=b, chunk_tokens=chunk_tokens)
    out = np.zeros(len(reqs), np.int64)
    for r, q in enumerate(reqs):
        if not admitted[r]:
            continue
        host.lookup(q, q.prompt_tokens)  # g only enters the returned load, not the state
        out[r] = host._found[q.rid]
        host.admit(q, 0, 0)
    return out


def _gpu(T, off, h, N, b, engine):
    res = simulate_block(T, off, h, N=int(N), block_size=b, engine=engine)
    return res.hit_blocks.astype(np.int64) * b, ~res.rejected


_FAST_KW = {"policy", "blocks_per_chunk", "store_threshold", "prompt_only", "max_tracker_size"}


def _fast_native(tier: str, kw: dict) -> bool:
    """Whether the compiled native host pass (:mod:`kvhit.sim.tiers.native_fast`, tested equal) covers ``kw``."""
    return (
        tier == "native"
        and set(kw) <= _FAST_KW
        and kw.get("policy", "lru") == "lru"
        and int(kw.get("store_threshold", 0)) < 2
        and kw.get("prompt_only", True)
    )


def _pair_task(args):
    kind, T, off, h, b, engine, N, C, tier, kw, g, adm = args
    if kind == "host" and _fast_native(tier, kw):
        from kvhit.sim.tiers.native_fast import native_lru_host_pass

        return native_lru_host_pass(T, off, h, g, adm, C=C, block_size=b, bpc=kw.get("blocks_per_chunk", 1))
    reqs = requests_from_stream(T, off, h)
    if kind == "host":
        return host_pass(reqs, g, adm, tier=tier, C=C, b=b, **kw)
    if kind == "lookup":
        return lmcache_lookup_pass(reqs, adm, C=C, b=b, **kw)
    from kvhit.sim.tiers import make_tiered

    e = make_tiered(tier, gpu_blocks=int(N), host_capacity=int(C), block_size=b, engine=engine, **kw)
    res = replay(e, reqs)
    return np.array([o.hit_tokens if o else 0 for o in res.outcomes], np.int64)


def hit_surface(
    prompt_tokens,
    hash_offsets,
    hashes,
    *,
    tier: str,
    gpu_blocks,
    host,
    block_size: int,
    engine: str = "vllm",
    workers: int = 1,
    measured=None,
    **kw,
) -> Surface:
    """h(N, C) over ``gpu_blocks`` × ``host`` (see module docstring); ``kw`` go to the tier model. ``measured``
    (a mask over the requests; default all) selects the requests counted: every request still passes through the
    caches, so the leading unmeasured ones are a warm-up."""
    T = np.asarray(prompt_tokens, np.int64)
    off = np.asarray(hash_offsets, np.int64)
    h = np.asarray(hashes)
    Ns = np.asarray(gpu_blocks, np.int64)
    Cs = np.asarray(host, np.int64)
    if Ns.ndim != 1 or Cs.ndim != 1 or not len(Ns) or not len(Cs):
        raise ValueError("gpu_blocks and host: expected non-empty 1-D grids")
    if (Ns < 1).any() or (Cs < 0).any():
        raise ValueError("gpu_blocks: expected >= 1 blocks; host: expected >= 0")
    if tier not in ("native", "lmcache", "simple", "simple-lazy"):
        raise ValueError(f"tier: expected one of ['lmcache', 'native', 'simple', 'simple-lazy'], got {tier!r}")
    b = int(block_size)
    gs, adms = zip(*(_gpu(T, off, h, N, b, engine) for N in Ns), strict=True)
    meas = np.ones(T.size, bool) if measured is None else np.asarray(measured, bool)
    if meas.shape != T.shape:
        raise ValueError(f"measured: expected a mask of {T.size} requests, got shape {meas.shape}")
    total = np.zeros((len(Ns), len(Cs)), np.int64)
    tasks = []
    if tier == "lmcache":
        # l_r depends on N only through which requests are admitted (a rejected request is never looked up)
        masks = {m.tobytes(): m for m in adms}
        keys = list(masks)
        tasks = [("lookup", T, off, h, b, engine, 0, C, tier, kw, None, masks[k]) for k in keys for C in Cs]
    elif tier == "native":
        tasks = [("host", T, off, h, b, engine, N, C, tier, kw, gs[i], adms[i]) for i, N in enumerate(Ns) for C in Cs]
    else:
        tasks = [("full", T, off, h, b, engine, N, C, tier, kw, None, None) for N in Ns for C in Cs]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as ex:
            outs = list(ex.map(_pair_task, tasks))
    else:
        outs = [_pair_task(t) for t in tasks]
    cnt = [a & meas for a in adms]  # counted: admitted and measured
    if tier == "lmcache":
        for k, lt in enumerate(outs):
            m, j = divmod(k, len(Cs))
            full = (lt == T).astype(np.int64)
            for i in range(len(Ns)):
                if adms[i].tobytes() != keys[m]:
                    continue
                tot = np.maximum(gs[i], lt - full)
                total[i, j] = tot[cnt[i]].sum()
    elif tier == "native":
        for k, c in enumerate(outs):
            i, j = divmod(k, len(Cs))
            total[i, j] = (gs[i] + c)[cnt[i]].sum()
    else:
        for k, hit in enumerate(outs):
            i, j = divmod(k, len(Cs))
            total[i, j] = hit[cnt[i]].sum()
    den = np.array([T[a].sum() for a in cnt], np.float64)
    den = np.where(den > 0, den, np.nan)  # no admitted request at this N: NaN
    gpu_hit = np.array([gs[i][cnt[i]].sum() for i in range(len(Ns))], np.float64) / den
    hit = total / den[:, None]
    load = total - np.array([gs[i][cnt[i]].sum() for i in range(len(Ns))])[:, None]
    return Surface(tier, Ns, Cs, hit, gpu_hit, load, int(T[meas].sum()), np.array([int(a.sum()) for a in cnt]))
