"""Host-tier capacity from a DRAM size, as each engine computes it (vLLM 0.33.0, LMCache 0.5.6).

``dram_bytes`` is the host memory given to the KV tier over all TP ranks; ``bytes_per_block_rank`` the KV bytes
of one GPU block on one rank (:meth:`kvhit.plan.model_kv.ModelKV.bytes_per_block` with ``tp``).

* native (``CPUOffloadingSpec``): ``cpu_bytes_to_use // round_up(bytes_per_block_rank · tp · bpc, alignment)``
  chunks — one chunk holds every rank's copy (:func:`kvhit.sim.tiers.native.cpu_chunks`);
* simple (``SimpleCPUOffloadConnector``): ``cpu_bytes_to_use / tp`` per rank, ``⌊per-rank bytes /
  bytes_per_block_rank⌋`` CPU blocks (``_derive_cpu_config``: GPU blocks scaled by the CPU/GPU byte ratio);
* LMCache: ``max_local_cpu_size`` is per rank; here ``dram_bytes / tp`` per rank and ``⌊per-rank bytes /
  (chunk_tokens · bytes_per_token_rank)⌋`` chunks (the allocator's alignment and fragmentation are ignored).

Invariant: the three agree to within rounding on the number of *tokens* a DRAM size holds (all store K and V
of every layer at the GPU's dtype); NOT modelled: pinned-memory registration limits, huge pages.
"""

from __future__ import annotations

from kvhit.sim.tiers.native import cpu_chunks

__all__ = ["host_units"]


def host_units(
    tier: str,
    dram_bytes: int,
    *,
    bytes_per_block_rank: int,
    block_size: int,
    tp: int = 1,
    blocks_per_chunk: int = 1,
    chunk_tokens: int = 256,
    alignment: int = 1,
) -> int:
    """Capacity of the host tier in its own unit (native/LMCache: chunks; simple: CPU blocks)."""
    if dram_bytes < 0 or bytes_per_block_rank < 1 or tp < 1:
        raise ValueError("dram_bytes >= 0, bytes_per_block_rank >= 1 and tp >= 1 required")
    if tier == "native":
        return cpu_chunks(
            int(dram_bytes), bytes_per_block_rank, world_size=tp, blocks_per_chunk=blocks_per_chunk, alignment=alignment
        )
    per_rank = int(dram_bytes) // tp
    if tier in ("simple", "simple-lazy"):
        return per_rank // bytes_per_block_rank
    if tier == "lmcache":
        if chunk_tokens % block_size:
            raise ValueError(f"chunk_tokens: expected a multiple of block_size={block_size}, got {chunk_tokens}")
        return per_rank // (bytes_per_block_rank * (chunk_tokens // block_size))
    raise ValueError(f"tier: expected one of ['lmcache', 'native', 'simple', 'simple-lazy'], got {tier!r}")
