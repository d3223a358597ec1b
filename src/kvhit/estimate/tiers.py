"""Two-tier (HBM + DRAM) hit-ratio estimator: the engine-aware estimator of each tier, combined block by block.

Derivation: ``docs/estimators.md`` §5. Setting: a vLLM GPU prefix cache of ``N`` blocks (``b`` tokens) with a host
tier of ``C`` units behind it (:mod:`kvhit.sim.tiers`: vLLM 0.33.0 native offloading, chunks of ``bpc`` blocks;
SimpleCPUOffloadConnector eager, CPU blocks; LMCache 0.5.6, chunks of ``chunk_tokens``). The quantity is the
surface's (:func:`kvhit.sim.tiers.surface.hit_surface`): Σ (GPU + host hit tokens) / Σ prompt tokens over the
requests the GPU admits (sequential replay, token metric).

Facts used (from the tier modules' docstrings, i.e. the engines' code):

* a host load allocates what a recompute would, so the GPU's state and its hit ``g_r(N)`` are the single-tier
  ones (``tests/test_tiers.py::test_gpu_hits_equal_single_tier``): ``h_G(N)`` is the single-tier engine-aware
  estimator (:func:`kvhit.estimate.agentic.estimate_trace`, hit condition (A1): block ``i`` of an age segment
  is found iff ``N ≥ 1 + e + i + D(a)``);
* every tier writes every full prompt chunk of every request through (native: offered at the prefill, GPU-hit
  chunks included when nothing is loaded; LMCache: from its own hit on; simple eager: every confirmed full
  block), so the host sees the same stream of chunks as the GPU sees blocks: its displacement over an age ``a``
  is the same background ``D(a)`` counted in its own unit (full chunks only: no partial-block term ``e``);
* eviction order inside a request: vLLM native commits a finished request's chunks tail to head (head most
  recent, ``cpu/policies/lru.py``), as the GPU frees them, so host chunk ``k`` of a segment survives iff
  ``C ≥ 1 + k + D(a)`` (A1 with ``e = 0``), and there is no ``T − 1`` cap on the host side;
  LMCache touches the found prefix head-most-recent at lookup and *then* puts the new chunks (``OrderedDict``
  insertion: the newest put is most recent), so the ``F_src − l_src`` chunks its source request put sit above
  the found prefix: a found chunk's threshold is shifted by that number, and the put chunks are found iff the
  whole found prefix is (a step at ``D ≤ C − F_src``, entered as the ramp with the same mean threshold;
  :func:`_lmcache_segments`, ``l_src`` taken as the source's reusable run); SimpleCPUOffload eager keeps vLLM's
  ``T − 1`` cap on the CPU side.

**Union.** A prompt block is served if the GPU holds it or the host's consecutive run (from the GPU hit on for
native/simple, from token 0 for LMCache: the total is ``max(g, l)``) covers it. With one ``D(a)`` for both
tiers, block ``i``'s two conditions are thresholds on the same variable, ``D ≤ N − 1 − e − i`` and (chunk
``k ∋ i``) ``D ≤ C − 1 − k`` (in chunks), so the union is the weaker one. With ``bpc = 1`` the host's threshold
is the weaker for every block iff ``C ≥ N − e``, the GPU's iff ``C ≤ N − 1 − e`` (the eq. (21)
characteristic-time ordering of the two caches, block by block: a tier smaller than the GPU adds nothing — but
for the last block of a fully reused prompt that is a multiple of ``b``, which the GPU's ``T − 1`` cap leaves to
the native host). Summed over a request the dominant tier's count wins, so ``h = max(h_G(N), h_H(C))``. With
``bpc > 1`` the host serves whole chunks only, so beyond the last full chunk of the reusable run (the *tail*:
``[bpc·L_c, cap)``, ``L_c`` the reusable run in chunks) only the GPU can serve:

    h(N, C) = max(h_G(N), h_H(C) + h_G^tail(N))    (C ≥ 1),        h(N, 0) = h_G(N),

``h_G^tail`` = the GPU estimator restricted to the tail blocks (the same segments, started at ``bpc·L_c``;
0 when ``bpc = 1``). The max is taken request by request (expected hits per request, ``per_request=True``: exact
under one ``D`` per request). The host calls refuse no request (``rejection=False``); native's all-or-nothing store
is entered as a different host stream for ``C`` below the largest request (:func:`_all_or_nothing`). Every term is
non-decreasing in ``N`` (above ``N_min``), and in ``C`` wherever every request fits the host (below, the
all-or-nothing stream can break it, as it does in the simulator).

Admission: a request with ``⌈T/b⌉ > N`` is refused by the GPU and never reaches the host; as in the surface, the
ratio is over admitted requests (``mask`` of the estimator, per distinct admitted set below ``N_min``).

NOT modelled (biases, measured in ``benchmarks/tiers_accuracy.py``): native — GPU-hit chunks below a load are not
refreshed on the host (their recency is older than assumed), the joint law of the two displacements when they differ
(a request that stores nothing displaces the GPU, not the host), ARC, ``store_threshold``, decode chunks; simple
eager with ``simple_model="onedim"`` — the CPU's store-time recency (a GPU hit does not refresh the CPU copy) and
its head-first eviction inside a request (CPU blocks are freed in prefix order), both modelled by the default
``"recency"`` (:mod:`kvhit.estimate.tiers_simple`), and in both the GPU free-order change of the stores; LMCache —
resident chunks beyond a lookup miss are not touched, the one token not loaded when the whole prompt is found;
timing (holds).
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numba import njit

from kvhit.estimate.agentic import estimate_trace, law_tables
from kvhit.estimate.tiers_simple import estimate_simple_eager
from kvhit.workload.reuse import RequestReuse, request_reuse

__all__ = ["TierEstimate", "TierEstimateError", "estimate_tiers"]

TIERS = ("native", "lmcache", "simple")

#: build the GPU term's and the GPU tail's law tables together (:func:`kvhit.estimate.agentic.law_tables`: one Lévy
#: sweep per age for both; equal to rounding, ``tests/test_tiers_shared_tables.py``); False: each its own (the
#: reference)
SHARE_TAIL_TABLE = True


class TierEstimateError(ValueError):
    """Bad argument to the two-tier estimator (the message names the argument)."""


@dataclass(frozen=True)
class TierEstimate:
    """``hit[i, j]`` = estimated h(``hbm_blocks[i]``, ``host_units[j]``); ``gpu_hit[i]`` = h_G (no host tier);
    ``host_hit[i, j]`` = h_H(``host_units[j]``) over the requests admitted at ``hbm_blocks[i]``;
    ``infeasible[i]``: some request is larger than the GPU (refused; the ratio is over the admitted ones)."""

    tier: str
    hbm_blocks: np.ndarray
    host_units: np.ndarray
    blocks_per_chunk: int
    hit: np.ndarray
    gpu_hit: np.ndarray
    host_hit: np.ndarray
    infeasible: np.ndarray
    N_min: int
    elapsed_s: float


@njit(cache=True)
def _union_sums(G, H, tail):  # pragma: no cover
    """``out[i, j] = Σ_r max(G[r, i], H[r, j] + tail[r, i])``, summed over the requests in order: numpy's
    ``np.maximum(G[:, i:i+1], H + tail[:, i:i+1]).sum(axis=0)`` bit for bit when ``H`` has ≥ 2 columns (with one,
    numpy sums the contiguous column pairwise)."""
    n, nN = G.shape
    nC = H.shape[1]
    out = np.zeros((nN, nC))
    for i in range(nN):
        for r in range(n):
            gi = G[r, i]
            ti = tail[r, i]
            for j in range(nC):
                v = H[r, j] + ti
                out[i, j] += gi if gi >= v or gi != gi else v  # np.maximum: NaN wins
    return out


def _grid(x, name: str, lo: int) -> np.ndarray:
    a = np.atleast_1d(np.asarray(x))
    if a.ndim != 1 or a.size == 0 or a.dtype.kind not in "iu" or (a < lo).any():
        raise TierEstimateError(f"{name}: expected a non-empty 1-D sequence of integers >= {lo}")
    return a.astype(np.int64)


def _lmcache_segments(uc: RequestReuse) -> tuple[RequestReuse, np.ndarray]:
    """LMCache's put-after-touch order as threshold shifts (module docstring): each age segment is split at the
    source request's found prefix ``l`` (≈ its reusable run ``L_any``). A found chunk ``i < l`` sits below the
    ``F − l`` chunks the source put: shift ``F − l``. The put chunks ``[l, F)`` are found iff the whole found
    prefix is, i.e. iff ``D ≤ C − F`` for every one of them (a step); (A1) is a ramp, so the put part gets the
    shift whose ramp has the step's mean threshold over the part ``[a, e)``: ``F − (a + e + 1)/2``."""
    n = uc.n
    seg_req = np.repeat(np.arange(n, dtype=np.int64), np.diff(uc.seg_off))
    src = uc.seg_src
    s0, s1 = uc.seg_start, uc.seg_end
    has = src >= 0
    F = np.where(has, uc.full_blocks[np.maximum(src, 0)], 0)
    lf = np.where(has, uc.L_any[np.maximum(src, 0)], 0)
    cut = np.clip(lf, s0, s1)  # found part [s0, cut), put part [cut, s1)
    a_req = np.concatenate([seg_req, seg_req])
    a_s0 = np.concatenate([s0, cut])
    a_s1 = np.concatenate([cut, s1])
    a_src = np.concatenate([src, src])
    found_shift = np.maximum(F - lf, 0)
    put_shift = np.maximum(F - (cut + s1 + 1) // 2, 0)
    a_sh = np.concatenate([found_shift, put_shift])
    first = np.concatenate([np.ones(s0.shape[0], bool), np.zeros(s0.shape[0], bool)])
    keep = (a_s1 > a_s0) | (first & np.concatenate([s1 == s0, s1 == s0]))
    o = np.lexsort((a_s0, a_req))
    o = o[keep[o]]
    off = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(a_req[o], minlength=n), out=off[1:])
    split = replace(uc, seg_off=off, seg_start=a_s0[o], seg_end=a_s1[o], seg_src=a_src[o])
    return split, np.where(a_src[o] >= 0, a_sh[o], 0).astype(np.int64)


def _all_or_nothing(uc: RequestReuse, C: int) -> RequestReuse:
    """vLLM native's store is all-or-nothing (``CPUOffloadingManager.prepare_store`` returns ``None`` when it
    cannot free room for every offered chunk, the offered ones protected): a request offering more than ``C``
    chunks stores none. Its host footprint is then its found prefix only (loads are recorded and refreshed at
    finish), and the chunks it would have put are not on the host for later requests (their segments end at
    the request's found prefix). Offered = all full chunks (no load; a load offers fewer — not modelled)."""
    F = uc.full_blocks
    big = F > C
    if not big.any():
        return uc
    found = np.minimum(F, uc.L_any)
    src = uc.seg_src
    end = np.where((src >= 0) & big[np.maximum(src, 0)], np.minimum(uc.seg_end, found[np.maximum(src, 0)]), uc.seg_end)
    return replace(uc, full_blocks=np.where(big, found, F), seg_end=np.maximum(end, uc.seg_start))


def _admitted_sets(Ns, N_min: int, prompt_blocks, meas):
    """One estimator call per distinct admitted set: every N ≥ ``N_min`` admits every request, a smaller N those
    with at most N blocks. Yields ``(sel, mask)``: the capacities of one set and its request mask (``None``: all
    requests), restricted to the measured ones ``meas``; an empty mask is yielded too (the caller skips it)."""
    adm_key = np.minimum(Ns, N_min)
    for k in np.unique(adm_key):
        mask = None if k >= N_min else (prompt_blocks <= k)
        if meas is not None:
            mask = meas if mask is None else mask & meas
        yield adm_key == k, mask


def estimate_tiers(
    source: Any,
    hbm_blocks: Any,
    host_units: Any,
    *,
    tier: str = "native",
    blocks_per_chunk: int = 1,
    chunk_tokens: int = 256,
    engine: str = "vllm",
    lam0: float | None = None,
    measured: Any = None,
    simple_model: str = "recency",
    **kw: Any,
) -> TierEstimate:
    """Estimated h(HBM, DRAM) over ``hbm_blocks`` (GPU blocks) × ``host_units`` (native/LMCache: chunks; simple:
    CPU blocks); see the module docstring. ``source``: a ProductionTrace or a kvhit Trace (as
    :func:`~kvhit.estimate.agentic.estimate_trace`); ``lam0`` and ``kw`` go to that estimator. ``measured``: a
    boolean mask (arrival order) of the requests h counts, as ``hit_surface(measured=...)``; default all.
    ``simple_model`` (``tier="simple"``): ``"recency"`` (default, vLLM ≥ 0.24 only: the CPU's store-time recency,
    :mod:`kvhit.estimate.tiers_simple`; ``host_hit`` is then what the CPU adds to the GPU's hits) or ``"onedim"``
    (the one-displacement union below, kept for comparison)."""
    t0 = _time.perf_counter()
    if tier not in TIERS:
        raise TierEstimateError(f"tier: expected one of {list(TIERS)}, got {tier!r}")
    if simple_model not in ("recency", "onedim"):
        raise TierEstimateError(f"simple_model: expected 'recency' or 'onedim', got {simple_model!r}")
    Ns = _grid(hbm_blocks, "hbm_blocks", 1)
    Cs = _grid(host_units, "host_units", 0)
    u = source if isinstance(source, RequestReuse) else request_reuse(source)
    b = u.block_size
    meas = None if measured is None else np.asarray(measured, bool)
    if meas is not None and meas.shape != (u.n,):
        raise TierEstimateError(f"measured: expected one flag per request ({u.n}), got shape {meas.shape}")
    if tier == "simple" and simple_model == "recency" and engine == "vllm":
        _, host, _, _ = estimate_simple_eager(u, Ns, Cs, lam0=lam0, meas=meas, **kw)
        # the GPU term is the single-tier estimator itself (its own value grid), per distinct admitted set
        N_min = int(u.prompt_blocks.max()) if u.n else 0
        gpu = np.full(Ns.shape[0], np.nan)
        for sel, mask in _admitted_sets(Ns, N_min, u.prompt_blocks, meas):
            if mask is not None and not mask.any():
                continue
            gpu[sel] = estimate_trace(u, Ns[sel], engine=engine, lam0=lam0, mask=mask, **kw).h
        # the CPU term's own law grid differs from the GPU term's by ~1e-7: the sum is kept under the ceiling
        ceil = np.full(Ns.shape[0], np.nan)
        for i, N in enumerate(Ns):
            use = (u.prompt_blocks <= N) & (True if meas is None else meas)
            if use.any():
                ceil[i] = float(u.reusable[use].sum()) * b / float(u.prompt_tokens[use].sum())
        hit = np.minimum(gpu[:, None] + host, np.maximum(ceil, gpu)[:, None])
        return TierEstimate(
            tier=tier,
            hbm_blocks=Ns,
            host_units=Cs,
            blocks_per_chunk=1,
            hit=hit,
            gpu_hit=gpu,
            host_hit=host,
            infeasible=Ns < N_min,
            N_min=N_min,
            elapsed_s=_time.perf_counter() - t0,
        )
    if tier == "native":
        bpc = int(blocks_per_chunk)
        if bpc < 1:
            raise TierEstimateError(f"blocks_per_chunk: expected >= 1, got {blocks_per_chunk!r}")
    elif tier == "lmcache":
        if chunk_tokens < 1 or chunk_tokens % b:
            raise TierEstimateError(f"chunk_tokens: expected a positive multiple of the block size {b}")
        bpc = chunk_tokens // b
    else:
        bpc = 1
    uc = u if bpc == 1 else request_reuse(source, chunk_blocks=bpc)
    # the host tier's accounting: no partial block at its head; native has no T − 1 cap, simple keeps it
    cap_host = tier == "simple"
    shift = None
    if tier == "lmcache":
        uc, shift = _lmcache_segments(uc)
    # GPU tail: blocks beyond the host's reachable run (bpc·L_c), capped like the GPU
    run_c = uc.L_any  # the host's reusable run in chunks (leading chunks seen before)
    seg_req_b = np.repeat(np.arange(u.n, dtype=np.int64), np.diff(u.seg_off))
    u_tail = replace(u, seg_start=np.maximum(u.seg_start, bpc * run_c[seg_req_b])) if bpc > 1 else None
    R = u.prompt_blocks
    N_min = int(R.max()) if u.n else 0
    hit = np.zeros((Ns.shape[0], Cs.shape[0]))
    gpu = np.zeros(Ns.shape[0])
    host = np.zeros((Ns.shape[0], Cs.shape[0]))
    for sel, mask in _admitted_sets(Ns, N_min, R, meas):
        if mask is not None and not mask.any():
            gpu[sel] = np.nan
            hit[sel] = np.nan
            host[sel] = np.nan
            continue
        gkw = {"engine": engine, "lam0": lam0, "mask": mask, "per_request": True} | kw
        # the GPU term and its tail: the same conversations and value grid, so their law tables are filled by one
        # Lévy sweep per age (SHARE_TAIL_TABLE; equal to rounding to the tables built apart)
        tabs = (
            law_tables([(u, Ns[sel], gkw), (u_tail, Ns[sel], gkw)]) if u_tail is not None and SHARE_TAIL_TABLE else None
        )
        ge = estimate_trace(u, Ns[sel], **gkw, _table=None if tabs is None else tabs[0])
        g, G = ge.h, ge.per_request  # G[r, k]: expected GPU hit tokens of request r at Ns[sel][k]
        gpu[sel] = g
        den = float(u.prompt_tokens[mask].sum() if mask is not None else u.prompt_tokens.sum())
        pos = Cs > 0
        H = np.zeros((u.n, Cs.shape[0]))
        hkw = {
            "engine": "vllm",
            "lam0": lam0,
            "mask": mask,
            "head_partial": False,
            "cap_last": cap_host,
            "rejection": False,
            "per_request": True,
        }
        # native: a host smaller than some request's chunks sees a different stream (all-or-nothing stores)
        small = pos & (Cs < (int(uc.full_blocks.max()) if uc.n else 0)) if tier == "native" else np.zeros_like(pos)
        if (pos & ~small).any():
            H[:, pos & ~small] = estimate_trace(uc, Cs[pos & ~small], seg_shift=shift, **hkw, **kw).per_request
        for j in np.flatnonzero(small):
            H[:, j] = estimate_trace(_all_or_nothing(uc, int(Cs[j])), Cs[j : j + 1], **hkw, **kw).per_request[:, 0]
        host[sel] = H.sum(axis=0) / den
        tail = (
            estimate_trace(u_tail, Ns[sel], **gkw, _table=None if tabs is None else tabs[1]).per_request
            if u_tail is not None
            else np.zeros_like(G)
        )
        # the union request by request: the dominant tier's count (tail blocks only from the GPU)
        if H.shape[1] > 1:
            tot = _union_sums(G, H, tail) / den
        else:  # one host size: numpy sums a contiguous column pairwise; keep its bits
            tot = np.stack([np.maximum(G[:, i : i + 1], H + tail[:, i : i + 1]).sum(axis=0) for i in range(G.shape[1])])
            tot /= den
        for ii, i in enumerate(np.flatnonzero(sel)):
            hit[i] = np.where(pos, tot[ii], g[ii])
    return TierEstimate(
        tier=tier,
        hbm_blocks=Ns,
        host_units=Cs,
        blocks_per_chunk=bpc,
        hit=hit,
        gpu_hit=gpu,
        host_hit=host,
        infeasible=Ns < N_min,
        N_min=N_min,
        elapsed_s=_time.perf_counter() - t0,
    )
