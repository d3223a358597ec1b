"""KV-cache memory budget: accelerator presets, blocks ↔ bytes ↔ GB, and the HBM capacity ``N`` in KV blocks.

This module turns a model (a Hugging Face ``config.json``, or a shipped preset) and a memory budget into the
HBM capacity ``N`` in KV blocks that the multi-turn conversation model (MCM, paper §2) takes as input. The
paper's App. E example is reproduced exactly::

    Qwen3-8B, BF16:  KV bytes/token = 2 × 36 × 8 × 128 × 2 = 147,456 B (= 144 KiB)
    block_size 128:  bytes/block    = 147,456 × 128 = 18,874,368 B (= 18 MiB)
    40 GB for KV:    N = ⌊40 · 2^30 / 18,874,368⌋ = ⌊2275.56⌋ = 2,275

**GB convention.** ``N = 2,275`` only comes out with binary units (40 GiB / 18 MiB); decimal units give
⌊40·10^9 / 18,874,368⌋ = 2,119 and the mixed reading 40/18 gives 2,222. Hence *in kvhit "GB" means GiB
(2^30 bytes)* unless a function is called with ``decimal=True`` (10^9 bytes). Accelerator HBM capacities
("80 GB", "141 GB", "192 GB") are likewise interpreted as GiB (HBM stacks are sized in powers of two).

The model side — KV bytes per token and per block — is :mod:`kvhit.plan.model_kv` (shapes read from configs and
presets by :mod:`kvhit.plan.model_config`); this module holds the accelerator presets, blocks ↔ bytes ↔ GB and the
per-GPU budget.

**Memory budget** (:func:`kv_budget_bytes`), mirroring vLLM's profiling::

    KV bytes per GPU = gpu_memory_utilization × HBM − weights / tp − reserve

with weights = ``num_parameters × weights_dtype bytes`` unless ``weights_bytes`` is given, and ``reserve`` an
allowance for activations, CUDA graphs and non-torch allocations (default :data:`DEFAULT_RESERVE_BYTES`).
:func:`kv_capacity_blocks` divides a per-GPU budget by the per-GPU bytes per block (as vLLM computes the
number of GPU blocks per worker) and returns ``N``.

Invariant: ``N = ⌊budget / bytes per block⌋`` (integer division for an integer budget), with one GB convention
(GiB unless ``decimal=True``); a budget that leaves nothing for the KV cache is refused.

Not modelled: the memory a process actually sees below the nominal HBM (pass vLLM's reported budget as
``kv_gb``); the reserve is a rule of thumb (:data:`DEFAULT_RESERVE_BYTES`), not a measurement.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvhit.plan.model_config import resolve_model
from kvhit.plan.model_kv import DEFAULT_BLOCK_SIZE, HardwareError, ModelKV, SlidingPolicy, _check_pos_int

__all__ = [
    "GIB",
    "GB_DECIMAL",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "DEFAULT_RESERVE_BYTES",
    "Accelerator",
    "ACCELERATORS",
    "get_accelerator",
    "list_accelerators",
    "blocks_from_bytes",
    "blocks_from_gb",
    "gb_from_blocks",
    "gb_to_bytes",
    "kv_budget_bytes",
    "kv_capacity_blocks",
]


GIB: int = 2**30
"""Bytes in one kvhit "GB" (binary GiB; see the module docstring for why)."""
GB_DECIMAL: int = 10**9
"""Bytes in one decimal GB (used with ``decimal=True``)."""
DEFAULT_GPU_MEMORY_UTILIZATION: float = 0.9
"""Fraction of HBM the serving engine may use (vLLM's ``--gpu-memory-utilization`` default)."""
DEFAULT_RESERVE_BYTES: int = 2 * GIB
"""Default allowance for peak activations, CUDA graphs and non-torch memory (NCCL, cuBLAS workspaces):
2 GiB, a rule of thumb for 8B–70B dense models at vLLM's default batched-token limits, not a measurement.
For exact numbers pass the value vLLM logs ("Available KV cache memory") as ``kv_gb``."""


def _check_nonneg_number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise HardwareError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


# --------------------------------------------------------------------------------------------------------
# Accelerators
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Accelerator:
    """An accelerator with its nominal HBM capacity ``hbm_bytes`` (the marketed "GB" read as GiB).

    The memory a process actually sees is slightly lower (e.g. an H100 80GB HBM3 typically reports
    81,559 MiB ≈ 79.6 GiB in nvidia-smi); for exact capacities pass the budget vLLM reports as ``kv_gb``.
    """

    name: str
    hbm_bytes: int
    vendor: str
    memory_type: str = ""
    notes: str = ""

    @property
    def hbm_gb(self) -> float:
        return self.hbm_bytes / GIB


ACCELERATORS: dict[str, Accelerator] = {
    a.name.lower(): a
    for a in (
        Accelerator("H100", 80 * GIB, "NVIDIA", "HBM3", "H100 SXM5 80 GB (the 94 GB H100 NVL is not this preset)"),
        Accelerator("H200", 141 * GIB, "NVIDIA", "HBM3e", "H200 141 GB as sold"),
        Accelerator(
            "B200",
            192 * GIB,
            "NVIDIA",
            "HBM3e",
            "assumed 192 GB HBM3e as sold; DGX B200 systems list 180 GB usable per GPU "
            "(use a custom Accelerator for that)",
        ),
        Accelerator("MI300X", 192 * GIB, "AMD", "HBM3", "MI300X 192 GB"),
        Accelerator("Ascend-910B2", 64 * GIB, "Huawei", "HBM2e", "the paper's prefiller NPU (App. E: ~64 GB)"),
    )
}
_ACCEL_ALIASES = {
    "h100-80gb": "h100",
    "h100-sxm": "h100",
    "h200-141gb": "h200",
    "b200-192gb": "b200",
    "mi300": "mi300x",
    "910b2": "ascend-910b2",
    "ascend910b2": "ascend-910b2",
    "ascend 910b2": "ascend-910b2",
    "ascend_910b2": "ascend-910b2",
}


def list_accelerators() -> list[str]:
    """Names of the accelerator presets (``--gpu``)."""
    return [a.name for a in ACCELERATORS.values()]


def get_accelerator(accel: Accelerator | str) -> Accelerator:
    """An :class:`Accelerator` preset by (case-insensitive) name, or the argument itself."""
    if isinstance(accel, Accelerator):
        return accel
    key = str(accel).strip().lower()
    key = _ACCEL_ALIASES.get(key, key)
    if key not in ACCELERATORS:
        raise HardwareError(f"unknown accelerator {accel!r}; available: {list_accelerators()}")
    return ACCELERATORS[key]


# --------------------------------------------------------------------------------------------------------
# Blocks ↔ bytes ↔ GB
# --------------------------------------------------------------------------------------------------------


def gb_to_bytes(gb: float, *, decimal: bool = False) -> int:
    """``gb`` kvhit-GB (GiB, 2^30 B) in bytes, or decimal GB (10^9 B) with ``decimal=True``; floored."""
    gb = _check_nonneg_number(gb, "gb")
    return int(math.floor(gb * (GB_DECIMAL if decimal else GIB)))


def blocks_from_bytes(budget_bytes: int, bytes_per_block: int) -> int:
    """HBM capacity ``N = ⌊budget_bytes / bytes_per_block⌋`` in blocks (exact integer arithmetic)."""
    budget = _check_nonneg_number(budget_bytes, "budget_bytes")
    bpb = _check_pos_int(bytes_per_block, "bytes_per_block")
    if isinstance(budget, int):
        return budget // bpb
    return int(math.floor(budget / bpb))


def blocks_from_gb(gb: float, bytes_per_block: int, *, decimal: bool = False) -> int:
    """``N = ⌊gb · 2^30 / bytes_per_block⌋`` (``decimal=True``: 10^9). 40 GB / 18 MiB blocks → 2,275."""
    return blocks_from_bytes(gb_to_bytes(gb, decimal=decimal), bytes_per_block)


def gb_from_blocks(n_blocks: int, bytes_per_block: int, *, decimal: bool = False) -> float:
    """Memory of ``n_blocks`` blocks in kvhit-GB (GiB; ``decimal=True`` for 10^9 B)."""
    n = _check_pos_int(n_blocks, "n_blocks", allow_zero=True)
    bpb = _check_pos_int(bytes_per_block, "bytes_per_block")
    return n * bpb / (GB_DECIMAL if decimal else GIB)


# --------------------------------------------------------------------------------------------------------
# Budgets and capacity
# --------------------------------------------------------------------------------------------------------


def kv_budget_bytes(
    accel: Accelerator | str,
    model: ModelKV | Mapping[str, Any] | os.PathLike[str] | str,
    *,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    tp: int = 1,
    weights_bytes: int | None = None,
    weights_dtype: str | None = None,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
) -> int:
    """Per-GPU bytes left for the KV cache: ``⌊u × HBM⌋ − weights / tp − reserve``.

    Args:
        accel: accelerator preset or name (``hbm_bytes`` is the nominal capacity, in GiB).
        model: model (preset name, config path/dict or :class:`ModelKV`).
        gpu_memory_utilization: fraction ``u`` of HBM the engine may use (default 0.9, vLLM's default).
        tp: tensor-parallel degree; weights are split evenly over the ``tp`` GPUs.
        weights_bytes: total (all-rank) weight bytes; default ``num_parameters × bytes(weights_dtype)``.
        weights_dtype: dtype of the weights for that default (default: the model's ``torch_dtype``).
        reserve_bytes: activations / CUDA graphs / non-torch allowance (default 2 GiB, see
            :data:`DEFAULT_RESERVE_BYTES`).

    Raises :class:`HardwareError` if the weights and reserve do not fit (budget ≤ 0).
    """
    acc = get_accelerator(accel)
    m = resolve_model(model)
    u = _check_nonneg_number(gpu_memory_utilization, "gpu_memory_utilization")
    if not 0 < u <= 1:
        raise HardwareError(f"gpu_memory_utilization must be in (0, 1], got {u}")
    tp = _check_pos_int(tp, "tp")
    reserve = _check_pos_int(reserve_bytes, "reserve_bytes", allow_zero=True)
    if weights_bytes is None:
        w = m.weights_bytes(weights_dtype, tp)
    else:
        w = -(-_check_pos_int(weights_bytes, "weights_bytes", allow_zero=True) // tp)
    budget = int(math.floor(u * acc.hbm_bytes)) - w - reserve
    if budget <= 0:
        raise HardwareError(
            f"no memory left for KV cache on {acc.name}: {u} × {acc.hbm_bytes / GIB:.1f} GiB − weights "
            f"{w / GIB:.2f} GiB/GPU − reserve {reserve / GIB:.2f} GiB = {budget / GIB:.2f} GiB (increase tp?)"
        )
    return budget


def kv_capacity_blocks(
    model: ModelKV | Mapping[str, Any] | os.PathLike[str] | str,
    accel: Accelerator | str | None = None,
    *,
    kv_gb: float | None = None,
    kv_bytes: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    dtype: str = "bf16",
    tp: int = 1,
    sliding: SlidingPolicy = "full",
    decimal: bool = False,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    weights_bytes: int | None = None,
    weights_dtype: str | None = None,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
) -> int:
    """HBM capacity ``N`` in KV blocks (the MCM's ``N``, paper §2) for one serving instance.

    Exactly one budget source: ``accel`` (budget from :func:`kv_budget_bytes`), ``kv_gb`` (per-GPU KV memory
    in GiB, or decimal GB with ``decimal=True``) or ``kv_bytes``. The budget is per GPU and is divided by the
    per-GPU bytes per block ``block_size × bytes_per_token(dtype, tp, sliding)``.

    Paper App. E: ``kv_capacity_blocks("Qwen3-8B", kv_gb=40)`` → 2,275.
    """
    given = sum(x is not None for x in (accel, kv_gb, kv_bytes))
    if given != 1:
        raise HardwareError(f"give exactly one of accel, kv_gb, kv_bytes (got {given})")
    m = resolve_model(model)
    bpb = m.bytes_per_block(block_size, dtype, tp, sliding=sliding)
    if kv_gb is not None:
        budget = gb_to_bytes(kv_gb, decimal=decimal)
    elif kv_bytes is not None:
        budget = _check_pos_int(kv_bytes, "kv_bytes", allow_zero=True)
    else:
        budget = kv_budget_bytes(
            accel,  # type: ignore[arg-type]
            m,
            gpu_memory_utilization=gpu_memory_utilization,
            tp=tp,
            weights_bytes=weights_bytes,
            weights_dtype=weights_dtype,
            reserve_bytes=reserve_bytes,
        )
    return blocks_from_bytes(budget, bpb)
