"""``kv``: KV bytes per token and per block of a model, and the block capacity N of a KV budget or accelerator.

Invariant: N = ⌊KV bytes / bytes per block⌋ (``kvhit.plan.hardware``; a "GB" is a GiB). NOT modelled: activation
memory beyond vLLM's ``gpu_memory_utilization`` and the fixed reserve of ``kvhit.plan.hardware.kv_budget_bytes``.
"""

from __future__ import annotations

from pydantic import Field

from kvhit.service.base import Request, Response
from kvhit.service.errors import InputError, translating

__all__ = ["KvRequest", "KvResponse", "kv", "HardwareFields"]


class HardwareFields(Request):
    """A model's KV layout on an accelerator or a KV budget."""

    model: str = Field("qwen3-8b", description="Model preset (`kvhit kv --list`) or a config.json path.")
    accelerator: str | None = Field(
        None, description="Accelerator preset (H100, H200, B200, MI300X, Ascend-910B2); default: none."
    )
    kv_gb: float | None = Field(
        None, gt=0, le=2**20, description="KV budget in GiB (2^30 bytes), instead of an accelerator; (0, 2^20]."
    )
    block_size: int = Field(128, ge=1, le=2**16, description="Tokens per KV block; 1–65,536.")
    dtype: str = Field("bf16", description="KV cache dtype: bf16 | fp16 | fp8 | fp32 | auto.")
    tp: int = Field(
        1, ge=1, le=4096, description="Tensor-parallel degree; must divide the KV heads (or be a multiple)."
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="With --gpu: fraction of accelerator memory vLLM may use; in (0, 1]; default 0.9."
    )

    FLAGS = {"accelerator": "--gpu", "dtype": "--kv-dtype", "kv_gb": "--kv-gb"}

    def check_one_budget(self) -> None:
        if self.accelerator is not None and self.kv_gb is not None:
            raise InputError("--gpu and --kv-gb: give one KV budget, not both")
        if self.gpu_memory_utilization is not None and self.accelerator is None:
            raise InputError("--gpu-memory-utilization: applies to --gpu (a --kv-gb budget is all KV)")

    def resolve(self):
        """The model and its KV bytes per block, each error naming the flag at fault."""
        from kvhit.plan import model_config

        with translating("--model"):
            m = model_config.resolve_model(self.model)
        try:
            bpb = m.bytes_per_block(self.block_size, self.dtype, self.tp)
        except ValueError as e:
            msg = str(e)
            flag = "--tp" if msg.startswith("tp") else "--kv-dtype" if "dtype" in msg else "--block-size"
            raise InputError(f"{flag}: {msg.removeprefix('tp: ')}") from None
        return m, bpb

    @property
    def util(self) -> float:
        return 0.9 if self.gpu_memory_utilization is None else self.gpu_memory_utilization


class KvRequest(HardwareFields):
    """The inputs of ``kvhit kv``, validated: each field's description states its unit, range and default."""

    dram_gb: float | None = Field(
        None,
        gt=0,
        le=2**20,
        description="DRAM for a host KV tier, GiB over all TP ranks, in (0, 2^20]: its capacity per engine; "
        "default: none.",
    )
    blocks_per_chunk: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="vLLM native offloading: GPU blocks per CPU chunk, 1–4096 (default 1; only with --dram-gb).",
    )
    chunk_tokens: int | None = Field(
        None, ge=1, le=2**20, description="LMCache chunk size in tokens, 1–2^20 (default 256; only with --dram-gb)."
    )

    FLAGS = {
        **HardwareFields.FLAGS,
        "dram_gb": "--dram-gb",
        "blocks_per_chunk": "--blocks-per-chunk",
        "chunk_tokens": "--chunk-tokens",
    }


class KvResponse(Response):
    """The answer of ``kvhit kv`` (``--json`` prints it; strict JSON, ``null`` where a number is undefined)."""

    model: str = Field(description="Model name.")
    bytes_per_token: int = Field(description="KV bytes per token on one GPU (bytes).")
    bytes_per_block: int = Field(description="KV bytes per block on one GPU (bytes).")
    block_size: int = Field(description="Tokens per block.")
    dtype: str = Field(description="KV cache dtype.")
    tp: int = Field(description="Tensor-parallel degree.")
    N: int | None = Field(None, description="Capacity in blocks (null without a budget).")
    kv_gib: float | None = Field(None, description="KV memory in GiB (null without a budget).")
    accelerator: str | None = Field(None, description="Accelerator or KV budget label.")
    host_tier: dict | None = Field(
        None,
        description="With --dram-gb: native_chunks (vLLM 0.33.0 CPUOffloadingSpec, all ranks in one chunk), "
        "simple_cpu_blocks (per rank: vLLM's num_cpu_blocks, one of them the CPU pool's null block), "
        "lmcache_chunks_per_rank (max_local_cpu_size = DRAM/TP per rank).",
    )


def kv(req: KvRequest) -> KvResponse:
    """``kvhit kv``: cross-field checks and output paths first, then the library; refused input raises
    :class:`~kvhit.service.errors.InputError` (one line naming the flag, file or field)."""
    from kvhit.plan.planner import capacity

    req.check_one_budget()
    m, _ = req.resolve()
    with translating("--kv-dtype"):
        out = KvResponse(
            model=m.name,
            bytes_per_token=m.bytes_per_token(req.dtype, req.tp),
            bytes_per_block=m.bytes_per_block(req.block_size, req.dtype, req.tp),
            block_size=req.block_size,
            dtype=req.dtype,
            tp=req.tp,
        )
    if req.accelerator is not None or req.kv_gb is not None:
        with translating("--gpu" if req.accelerator else "--kv-gb"):
            c = capacity(
                m,
                accelerator=req.accelerator,
                kv_gb=req.kv_gb,
                block_size=req.block_size,
                dtype=req.dtype,
                tp=req.tp,
                gpu_memory_utilization=req.util,
            )
        out.N, out.kv_gib, out.accelerator = c.N, c.kv_gib, c.accelerator
    if req.dram_gb is None:
        for k in ("blocks_per_chunk", "chunk_tokens"):
            if getattr(req, k) is not None:
                raise InputError(f"{req.flag(k)}: applies to a host tier, give --dram-gb (it would be ignored)")
    else:
        from kvhit.sim.tiers.sizing import host_units

        bpc = 1 if req.blocks_per_chunk is None else req.blocks_per_chunk
        ct = 256 if req.chunk_tokens is None else req.chunk_tokens
        if ct % req.block_size:
            raise InputError(f"--chunk-tokens: expected a multiple of --block-size {req.block_size}")
        dram = int(req.dram_gb * 2**30)
        common = {"bytes_per_block_rank": out.bytes_per_block, "block_size": req.block_size, "tp": req.tp}
        out.host_tier = {
            "dram_gib": req.dram_gb,
            "native_chunks": host_units("native", dram, blocks_per_chunk=bpc, **common),
            "native_chunk_tokens": bpc * req.block_size,
            "simple_cpu_blocks": host_units("simple", dram, **common),
            "lmcache_chunks_per_rank": host_units("lmcache", dram, chunk_tokens=ct, **common),
            "lmcache_chunk_tokens": ct,
            "lmcache_max_local_cpu_size_gib": req.dram_gb / req.tp,
        }
    return out


def list_presets() -> dict[str, list[str]]:
    """The model and accelerator presets ``kvhit kv --list`` prints."""
    from kvhit.plan import hardware, model_config

    return {"models": model_config.list_models(), "accelerators": hardware.list_accelerators()}
