"""Chained block-hash streams for :func:`kvhit.sim.vllm.block.simulate_block`.

vLLM v1 identifies a full block by ``hash_block_tokens(parent_block_hash, block_token_ids,
extra_keys)`` (``vllm/v1/core/kv_cache_utils.py``): the hash is chained on the parent block's hash, so
one hash stands for the whole token prefix up to the end of that block, and only *full* blocks get one.
This module builds the CSR stream ``(hash_offsets, hashes)`` the simulator consumes:

* :func:`hashes_from_token_ids` – from real token ids (deterministic 64-bit chained hash computed in
  numba; no Python ``hash()``, identical across runs and processes);
* :func:`hashes_from_block_counts` – synthetic traces that only know the number of full blocks ``F``
  of each request of conversation ``c``: the ids are ``id(c, 0), ..., id(c, F - 1)``, an injective
  function of ``(c, i)``, optionally with the first ``s`` blocks shared by every conversation (a common
  system prompt).

For the PD-disaggregated prefiller, request ``r`` needs ``T_r // b`` hashes (its prompt); for the
colocated mode (paper Remark B.1) ``(T_r + response_r) // b`` (prompt + response).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from kvhit.sim.vllm.block import BlockSimError
from kvhit.workload.hashing import fmix64 as _fmix64

__all__ = ["hashes_from_token_ids", "hashes_from_block_counts", "block_id", "MAX_CONVERSATION_ID"]

_CONV_BITS = 40
_POS_BITS = 64 - _CONV_BITS
#: largest conversation id accepted by :func:`hashes_from_block_counts` (the next id is the shared prefix)
MAX_CONVERSATION_ID = (1 << _CONV_BITS) - 2
_SHARED_CONV = (1 << _CONV_BITS) - 1
_MAX_POS = (1 << _POS_BITS) - 1

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_ROOT = np.uint64(0x6B766869745F524F)  # "kvhit_RO": root of every chain (vLLM's NONE_HASH role)
_S33 = np.uint64(33)
_S31 = np.uint64(31)
_L31 = np.uint64(64 - 31)


@njit(cache=True)
def _token_chain_kernel(tok_off, tokens, b, roots, out_off):
    n = tok_off.shape[0] - 1
    out = np.empty(out_off[n], np.uint64)
    nb = np.uint64(b)
    for r in range(n):
        parent = roots[r]
        s = tok_off[r]
        k = out_off[r]
        for i in range(out_off[r + 1] - out_off[r]):
            acc = parent ^ (nb * _P4)
            for j in range(s + i * b, s + (i + 1) * b):
                acc ^= np.uint64(tokens[j]) * _P2
                acc = ((acc << _S31) | (acc >> _L31)) * _P1
            parent = _fmix64(acc ^ (parent >> _S33))
            out[k + i] = parent
    return out


@njit(cache=True)
def _count_ids_kernel(conv, full, s, seedmix, shared):
    n = conv.shape[0]
    off = np.zeros(n + 1, np.int64)
    for r in range(n):
        off[r + 1] = off[r] + full[r]
    out = np.empty(off[n], np.uint64)
    for r in range(n):
        c = np.uint64(conv[r])
        for i in range(full[r]):
            cc = shared if i < s else c
            out[off[r] + i] = _fmix64(((cc << np.uint64(_POS_BITS)) | np.uint64(i)) ^ seedmix)
    return off, out


def _seedmix(seed: int) -> np.uint64:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise BlockSimError(f"seed: expected an integer, got {seed!r}")
    return np.uint64(_fmix64(np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF) ^ _ROOT))


def block_id(conversation: int, position: int, seed: int = 0) -> int:
    """The id :func:`hashes_from_block_counts` gives block ``position`` of ``conversation`` (int64)."""
    if not 0 <= conversation <= _SHARED_CONV or not 0 <= position <= _MAX_POS:
        raise BlockSimError("block_id: conversation or position out of range")
    key = np.uint64((conversation << _POS_BITS) | position) ^ _seedmix(seed)
    return int(np.array([_fmix64(key)], np.uint64).view(np.int64)[0])


def hashes_from_block_counts(
    conversation_ids, full_blocks, *, shared_prefix_blocks: int = 0, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """CSR block-id stream for synthetic traces.

    Request ``r`` (conversation ``c = conversation_ids[r]``, ``F = full_blocks[r]`` full blocks) gets
    ``id(c, 0..F-1)`` where ``id(c, i) = fmix64(((c << 24) | i) ^ mix(seed))`` for ``i >=
    shared_prefix_blocks`` and ``id(SHARED, i)`` for ``i < shared_prefix_blocks`` (same ids for every
    conversation). ``fmix64`` is a bijection of 64-bit words, so the ids are injective in ``(c, i)``.
    Because turn ``j``'s prompt extends turn ``j-1``'s history, consecutive requests of a conversation
    share their leading ids exactly as chained hashes would.

    Returns ``(hash_offsets int64[n+1], hashes int64[...])``.
    """
    conv = np.asarray(conversation_ids)
    full = np.asarray(full_blocks)
    if conv.ndim != 1 or (conv.size and not np.issubdtype(conv.dtype, np.integer)):
        raise BlockSimError("conversation_ids: expected a 1-d integer array")
    if full.ndim != 1 or (full.size and not np.issubdtype(full.dtype, np.integer)):
        raise BlockSimError("full_blocks: expected a 1-d integer array")
    if conv.shape != full.shape:
        raise BlockSimError(f"full_blocks: shape {full.shape} differs from conversation_ids {conv.shape}")
    if conv.size and (conv.min() < 0 or conv.max() > MAX_CONVERSATION_ID):
        raise BlockSimError(f"conversation_ids: must be in [0, {MAX_CONVERSATION_ID}]")
    if full.size and (full.min() < 0 or full.max() > _MAX_POS + 1):
        raise BlockSimError(f"full_blocks: must be in [0, {_MAX_POS + 1}]")
    s = int(shared_prefix_blocks)
    if s < 0:
        raise BlockSimError("shared_prefix_blocks: must be >= 0")
    off, out = _count_ids_kernel(
        conv.astype(np.int64), full.astype(np.int64), s, _seedmix(seed), np.uint64(_SHARED_CONV)
    )
    return off, out.view(np.int64)


def hashes_from_token_ids(token_ids, block_size: int, *, extra_key=None) -> tuple[np.ndarray, np.ndarray]:
    """Chained hashes of every full block of every request's token sequence.

    ``token_ids`` is either a sequence of 1-d integer arrays (one per request: the whole history + new
    prompt, or prompt + response for the colocated mode) or a CSR pair ``(token_offsets, flat_tokens)``.
    Block ``i`` of a request hashes ``(hash of block i-1, tokens[i*b:(i+1)*b])`` with a 64-bit
    xxhash-style mixing (like vLLM's ``hash_block_tokens``); the chain starts from a fixed root mixed with
    ``extra_key`` (an int or one int per request, e.g. a LoRA id or cache salt; vLLM mixes such extra
    keys into the block hashes). A trailing partial block gets no hash. Collisions have probability
    about ``m^2 / 2^65`` for ``m`` distinct prefixes.

    Returns ``(hash_offsets int64[n+1], hashes int64[...])``.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int | np.integer) or block_size < 1:
        raise BlockSimError(f"block_size: expected a positive integer, got {block_size!r}")
    b = int(block_size)
    if isinstance(token_ids, tuple) and len(token_ids) == 2 and not np.isscalar(token_ids[0]):
        tok_off = np.asarray(token_ids[0])
        flat = np.asarray(token_ids[1])
        if tok_off.ndim != 1 or (tok_off.size and not np.issubdtype(tok_off.dtype, np.integer)):
            raise BlockSimError("token_ids: CSR offsets must be a 1-d integer array")
        tok_off = tok_off.astype(np.int64)
        if tok_off.size == 0 or tok_off[0] != 0 or tok_off[-1] != flat.shape[0] or np.any(np.diff(tok_off) < 0):
            raise BlockSimError("token_ids: CSR offsets must start at 0, be non-decreasing, end at len(tokens)")
    elif isinstance(token_ids, Sequence) or isinstance(token_ids, np.ndarray) and token_ids.dtype == object:
        arrs = [np.asarray(a) for a in token_ids]
        for k, a in enumerate(arrs):
            if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
                raise BlockSimError(f"token_ids[{k}]: expected a 1-d integer array")
        lens = np.array([a.shape[0] for a in arrs], np.int64)
        tok_off = np.zeros(len(arrs) + 1, np.int64)
        np.cumsum(lens, out=tok_off[1:])
        flat = np.concatenate(arrs) if arrs else np.zeros(0, np.int64)
    else:
        raise BlockSimError("token_ids: expected a sequence of arrays or a (offsets, tokens) pair")
    if flat.ndim != 1 or (flat.size and not np.issubdtype(flat.dtype, np.integer)):
        raise BlockSimError("token_ids: tokens must be integers")
    n = tok_off.shape[0] - 1
    if extra_key is None:
        ek = np.zeros(n, np.int64)
    else:
        ek = np.asarray(extra_key)
        if ek.size and not np.issubdtype(ek.dtype, np.integer):
            raise BlockSimError("extra_key: expected an int or an integer array")
        ek = np.broadcast_to(ek.astype(np.int64), (n,)) if ek.ndim == 0 else ek.astype(np.int64)
        if ek.shape != (n,):
            raise BlockSimError(f"extra_key: expected shape ({n},), got {ek.shape}")
    roots = _root_hashes(ek)
    counts = np.diff(tok_off) // b
    out_off = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=out_off[1:])
    out = _token_chain_kernel(tok_off, flat.astype(np.int64), b, roots, out_off)
    return out_off, out.view(np.int64)


@njit(cache=True)
def _roots_kernel(ek):
    out = np.empty(ek.shape[0], np.uint64)
    for r in range(ek.shape[0]):
        out[r] = _fmix64(_fmix64(np.uint64(ek[r]) + _P1) ^ _ROOT)
    return out


def _root_hashes(ek: np.ndarray) -> np.ndarray:
    return _roots_kernel(np.ascontiguousarray(ek, dtype=np.int64))
