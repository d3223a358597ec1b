"""The surface h(HBM, DRAM): total token hit ratio over a grid of GPU and host-tier sizes.

``h(N, C) = Σ_r (g_r(N) + c_r(N, C)) / Σ_r T_r`` over admitted requests (vLLM's token metric, GPU plus external
hits: ``vllm:prefix_cache_hits + vllm:external_prefix_cache_hits`` over the prompt tokens), for ``N`` GPU blocks
and ``C`` host units (chunks; CPU blocks for ``simple``). Sequential replay (no ``hold``).

What is computed once, and why it is exact:

1. **GPU independence** (native, LMCache). A host load allocates the blocks a recompute would and the loaded
   blocks become ordinary prefix-cache blocks, so the GPU engine's state, and ``g_r(N)``, depend on the request
   stream only (``tests/test_tiers.py::test_gpu_hits_equal_single_tier``). ``g_r(N)`` is therefore taken from
   the compiled :func:`kvhit.sim.vllm.block.simulate_block`, once per ``N``, and only the host tier is stepped per
   pair (:func:`host_pass`; compiled for LRU, any store threshold: :mod:`kvhit.sim.tiers.native_fast`, tested
   equal). Not for ``simple`` / ``simple-lazy``: their store paths change the GPU free-queue
   order, so every pair is a full replay (:class:`~kvhit.sim.tiers.TieredEngine`,
   :class:`~kvhit.sim.tiers.simple_lazy.SimpleLazyEngine`; compiled: :mod:`kvhit.sim.tiers.simple_fast`).
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

__all__ = ["Surface", "compiled_covers", "compiled_tier_pass", "host_pass", "hit_surface", "lmcache_lookup_pass"]


@dataclass
class Surface:
    """``hit[i, j]`` = h(``gpu_blocks[i]``, ``host[j]``); ``gpu_hit[i]`` = h(``gpu_blocks[i]``, 0)."""

    tier: str
    gpu_blocks: np.ndarray
    host: np.ndarray
    hit: np.ndarray
    gpu_hit: np.ndarray
    load_tokens: np.ndarray  #: Σ c_r per pair (admitted requests)
    prompt_tokens: int
    admitted: np.ndarray  #: admitted (and measured) requests per GPU size (a request larger than the GPU is rejected)


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


_COVERED_KW = {
    "native": {"policy", "blocks_per_chunk", "store_threshold", "prompt_only", "max_tracker_size"},
    "lmcache": {"chunk_tokens"},
    "simple": {"colocated"},
    "simple-lazy": {"max_num_batched_tokens", "colocated"},
}


def compiled_covers(tier: str, kw: dict | None = None, *, engine: str = "vllm") -> bool:
    """Whether a compiled pass (tested equal to the step-wise model request by request, ``tests/test_tiers_fast.py``)
    covers ``tier`` with the tier options ``kw`` in a sequential replay: native with LRU, prompt only, any store
    threshold (:mod:`.native_fast`); LMCache (:mod:`.lmcache_fast`); simple eager and lazy, PD prefill
    (:mod:`.simple_fast`; lazy only for ``engine="vllm"``, as the step-wise model). Not covered: native ARC or decode
    chunks, colocated decode, and every replay with ``hold``."""
    kw = {} if kw is None else kw
    if tier not in _COVERED_KW or not set(kw) <= _COVERED_KW[tier] or kw.get("colocated", False):
        return False
    if tier == "native":
        return kw.get("policy", "lru") == "lru" and bool(kw.get("prompt_only", True))
    if tier == "simple-lazy":
        return engine == "vllm"
    return True


def compiled_tier_pass(
    prompt_tokens, hash_offsets, hashes, *, tier: str, N: int, C: int, block_size: int, engine: str = "vllm", **kw
):
    """A sequential PD replay of GPU + host tier, compiled: ``(gpu_hit_tokens, cpu_hit_tokens, rejected)`` per request,
    equal to ``replay(make_tiered(tier, gpu_blocks=N, host_capacity=C, ...), requests)`` (0 for rejected requests).
    Refused (``ValueError``) where :func:`compiled_covers` is false."""
    if not compiled_covers(tier, kw, engine=engine):
        raise ValueError(f"tier: no compiled pass covers {tier!r} with {sorted(kw)} (engine {engine!r}): use replay")
    kw = {k: v for k, v in kw.items() if k != "colocated"}
    T = np.asarray(prompt_tokens, np.int64)
    b = int(block_size)
    if tier == "simple":
        from kvhit.sim.tiers.simple_fast import simple_eager_pass

        return simple_eager_pass(T, hash_offsets, hashes, N=N, num_cpu_blocks=C, block_size=b, engine=engine)
    if tier == "simple-lazy":
        from kvhit.sim.tiers.simple_fast import simple_lazy_pass

        return simple_lazy_pass(T, hash_offsets, hashes, N=N, num_cpu_blocks=C, block_size=b, **kw)
    if tier == "lmcache":
        from kvhit.sim.tiers.lmcache_fast import lmcache_tier_pass

        return lmcache_tier_pass(T, hash_offsets, hashes, N=N, C=C, block_size=b, engine=engine, **kw)
    from kvhit.sim.tiers.native_fast import native_lru_host_pass

    res = simulate_block(T, hash_offsets, hashes, N=int(N), block_size=b, engine=engine)
    g = res.hit_blocks.astype(np.int64) * b
    c = native_lru_host_pass(T, hash_offsets, hashes, g, ~res.rejected, C=C, block_size=b, **_native_kw(kw))
    return g, c, res.rejected.copy()


def _native_kw(kw: dict) -> dict:
    return {
        "bpc": int(kw.get("blocks_per_chunk", 1)),
        "store_threshold": int(kw.get("store_threshold", 0)),
        "max_tracker_size": int(kw.get("max_tracker_size", 64_000)),
    }


def _pair_task(args):
    kind, T, off, h, b, engine, N, C, tier, kw, g, adm, compiled = args
    # a CPU pool of 0 blocks is refused by the step-wise simple tiers: let them say so
    fast = compiled and compiled_covers(tier, kw, engine=engine) and not (tier.startswith("simple") and C < 1)
    if kind == "host" and fast:
        from kvhit.sim.tiers.native_fast import native_lru_host_pass

        return native_lru_host_pass(T, off, h, g, adm, C=C, block_size=b, **_native_kw(kw))
    if kind == "lookup" and fast:
        from kvhit.sim.tiers.lmcache_fast import lmcache_lookup_pass_compiled

        return lmcache_lookup_pass_compiled(T, off, h, adm, C=C, block_size=b, **kw)
    if kind == "full" and fast:
        g_, c_, _rej = compiled_tier_pass(T, off, h, tier=tier, N=int(N), C=int(C), block_size=b, engine=engine, **kw)
        return g_ + c_
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
    compiled: bool = True,
    **kw,
) -> Surface:
    """h(N, C) over ``gpu_blocks`` × ``host`` (see module docstring); ``kw`` go to the tier model. ``measured``: a
    boolean mask of the requests counted in h (every request still drives the caches: a warm-up window); default
    all. ``compiled``: use the compiled passes where :func:`compiled_covers` says they cover the tier (tested equal;
    ``False`` runs the step-wise models everywhere)."""
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
    meas = np.ones(T.shape[0], bool) if measured is None else np.asarray(measured, bool)
    if meas.shape != T.shape:
        raise ValueError(f"measured: expected one flag per request ({T.shape[0]}), got shape {meas.shape}")
    counted = [a & meas for a in adms]  # admitted and measured: the rows h counts
    total = np.zeros((len(Ns), len(Cs)), np.int64)
    tasks = []
    if tier == "lmcache":
        # l_r depends on N only through which requests are admitted (a rejected request is never looked up)
        masks = {m.tobytes(): m for m in adms}
        keys = list(masks)
        tasks = [("lookup", T, off, h, b, engine, 0, C, tier, kw, None, masks[k], compiled) for k in keys for C in Cs]
    elif tier == "native":
        tasks = [
            ("host", T, off, h, b, engine, N, C, tier, kw, gs[i], adms[i], compiled)
            for i, N in enumerate(Ns)
            for C in Cs
        ]
    else:
        tasks = [("full", T, off, h, b, engine, N, C, tier, kw, None, None, compiled) for N in Ns for C in Cs]
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as ex:
            outs = list(ex.map(_pair_task, tasks))
    else:
        outs = [_pair_task(t) for t in tasks]
    if tier == "lmcache":
        for k, lt in enumerate(outs):
            m, j = divmod(k, len(Cs))
            full = (lt == T).astype(np.int64)
            for i in range(len(Ns)):
                if adms[i].tobytes() != keys[m]:
                    continue
                tot = np.maximum(gs[i], lt - full)
                total[i, j] = tot[counted[i]].sum()
    elif tier == "native":
        for k, c in enumerate(outs):
            i, j = divmod(k, len(Cs))
            total[i, j] = (gs[i] + c)[counted[i]].sum()
    else:
        for k, hit in enumerate(outs):
            i, j = divmod(k, len(Cs))
            total[i, j] = hit[counted[i]].sum()
    den = np.array([T[a].sum() for a in counted], np.float64)
    den = np.where(den > 0, den, np.nan)  # no admitted request at this N: NaN
    gpu_hit = np.array([gs[i][counted[i]].sum() for i in range(len(Ns))], np.float64) / den
    hit = total / den[:, None]
    load = total - np.array([gs[i][counted[i]].sum() for i in range(len(Ns))])[:, None]
    return Surface(tier, Ns, Cs, hit, gpu_hit, load, int(T.sum()), np.array([int(a.sum()) for a in counted]))
