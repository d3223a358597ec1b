"""A model's KV-cache shape and its bytes per token and per block on one GPU.

:class:`ModelKV` is the KV-cache-relevant shape of a decoder model (layers, KV heads, head dim, MLA latent dims,
which layers slide); the shape comes from a Hugging Face ``config.json`` or a shipped preset
(:mod:`kvhit.plan.model_config`), and blocks ↔ GiB and the memory budget are :mod:`kvhit.plan.hardware`.

**KV bytes per token.** For a standard (MHA/GQA/MQA) attention layer the cache holds K and V::

    bytes/token/layer = 2 × kv_heads_per_rank × head_dim × dtype_bytes

with ``kv_heads_per_rank = ceil(num_key_value_heads / tp)`` (KV heads are sharded over the tensor-parallel
ranks; when ``num_key_value_heads < tp`` every rank keeps one replicated head, as vLLM does — vLLM
additionally requires ``num_key_value_heads % tp == 0`` or ``tp % num_key_value_heads == 0``, in which case
the ceil-division equals vLLM's ``max(1, heads // tp)``). For multi-head latent attention (MLA,
DeepSeek-V2/V3: ``kv_lora_rank`` and ``qk_rope_head_dim`` in the config) one compressed latent vector is
cached per token per layer, with no K/V factor 2 and replicated on every TP rank::

    bytes/token/layer (MLA) = (kv_lora_rank + qk_rope_head_dim) × dtype_bytes

**Sliding-window layers.** A sliding-window layer needs at most ``sliding_window`` tokens per sequence, so
:meth:`ModelKV.kv_bytes_per_token` reports the per-token bytes of full-attention layers and of sliding
layers separately (:class:`KVBytesPerToken`). The MCM counts a KV *block* as the cache of ``block_size``
token positions over all layers; for block accounting the ``sliding`` policy decides what a block costs:

* ``"full"`` (default, conservative): sliding layers are counted like full-attention layers. With prefix
  caching, vLLM's hybrid KV-cache manager may free the blocks of sliding layers that fall out of the window,
  but a prefix hit still needs the sliding layers' blocks of the last window, and freed blocks are reused
  independently of the full-attention blocks. Counting them as full gives an upper bound on bytes per block,
  hence a lower bound on ``N``; it is exact for models without sliding layers.
* ``"full_layers_only"`` (optimistic): only full-attention layers are charged per token; this is the
  asymptotic per-token cost for prefixes much longer than the window and an upper bound on ``N``. Use
  :meth:`ModelKV.sequence_kv_bytes` for the exact footprint of one sequence of ``n`` tokens
  (``full × n + sliding × min(n, sliding_window)``).

**KV dtype.** ``bf16``/``fp16`` = 2 bytes, ``fp8`` (e4m3/e5m2) = 1 byte, ``fp32`` = 4 bytes; ``"auto"``
uses the model's ``torch_dtype``.

Invariant: a :class:`ModelKV` is valid once built (positive layer/head/dim counts, one ``"full"`` or
``"sliding"`` entry per layer, a window when any layer slides, a known dtype); bytes per block =
``block_size × bytes_per_token`` exactly, and a ``tp`` vLLM refuses is refused.

Not modelled: quantization scales (e.g. vLLM's per-tensor fp8 scales, the packed ``fp8_ds_mla`` layout).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "ModelConfigError",
    "HardwareError",
    "KVBytesPerToken",
    "ModelKV",
    "dtype_bytes",
]


DEFAULT_BLOCK_SIZE: int = 128
"""Tokens per KV block (the paper's App. E setting; vLLM's CUDA default is 16)."""

SlidingPolicy = Literal["full", "full_layers_only"]
_SLIDING_POLICIES = ("full", "full_layers_only")


_DTYPE_BYTES: dict[str, int] = {
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "fp32": 4,
    "float32": 4,
    "float": 4,
}


class ModelConfigError(ValueError):
    """A model config is missing a field or has an invalid one; the message names the field and the source."""


class HardwareError(ValueError):
    """Invalid hardware / budget arguments (negative budget, unknown accelerator, bad dtype …)."""


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a KV or weight dtype (``bf16``/``fp16`` 2, ``fp8`` 1, ``fp32`` 4)."""
    if not isinstance(dtype, str):
        raise HardwareError(f"dtype must be a string, got {dtype!r}")
    key = dtype.strip().lower().removeprefix("torch.")
    if key not in _DTYPE_BYTES:
        raise HardwareError(f"unknown dtype {dtype!r}; expected one of {sorted(set(_DTYPE_BYTES))}")
    return _DTYPE_BYTES[key]


def _check_pos_int(value: Any, name: str, *, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise HardwareError(f"{name} must be an integer, got {value!r}")
    if value != int(value):
        raise HardwareError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < 0 or (value == 0 and not allow_zero):
        raise HardwareError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return value


# --------------------------------------------------------------------------------------------------------
# Model KV description
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVBytesPerToken:
    """Per-token KV bytes on one GPU, split by attention type.

    ``full``: bytes per token summed over full-attention layers (grows with every cached token).
    ``sliding``: bytes per token summed over sliding-window layers (a sequence holds at most
    ``sliding_window`` tokens of these). ``total = full + sliding`` is the conservative per-token cost.
    """

    full: int
    sliding: int
    sliding_window: int | None = None

    @property
    def total(self) -> int:
        return self.full + self.sliding


@dataclass(frozen=True)
class ModelKV:
    """KV-cache-relevant shape of a decoder model.

    Attributes:
        name: display name.
        num_layers: attention layers holding a KV cache (``num_hidden_layers``).
        num_kv_heads: KV heads per layer (``num_key_value_heads``; unused for MLA).
        head_dim: per-head dimension of K and V (unused for MLA).
        num_attention_heads: query heads (informational).
        kv_lora_rank, qk_rope_head_dim: MLA latent dims; both set ⇔ MLA.
        layer_types: per layer ``"full"`` or ``"sliding"`` (length ``num_layers``).
        sliding_window: tokens kept per sequence by sliding layers (``None`` if there are none).
        num_parameters: total parameter count (for the weights term of :func:`kv_budget_bytes`), or ``None``.
        torch_dtype: the checkpoint's dtype (used for ``dtype="auto"`` and as default weights dtype).
        source: where the description came from (file path, ``"<dict>"`` or ``"preset:<file>"``).
    """

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_attention_heads: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    num_parameters: int | None = None
    torch_dtype: str = "bf16"
    source: str = "<direct>"
    aliases: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"model {self.name!r} ({self.source})"
        for attr in ("num_layers", "num_kv_heads", "head_dim"):
            v = getattr(self, attr)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ModelConfigError(f"{where}: {attr} must be a positive integer, got {v!r}")
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ModelConfigError(f"{where}: MLA needs both kv_lora_rank and qk_rope_head_dim")
        for attr in ("kv_lora_rank", "qk_rope_head_dim"):
            v = getattr(self, attr)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise ModelConfigError(f"{where}: {attr} must be a positive integer, got {v!r}")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full",) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise ModelConfigError(
                f"{where}: layer_types has {len(self.layer_types)} entries but num_layers is {self.num_layers}"
            )
        bad = sorted({t for t in self.layer_types if t not in ("full", "sliding")})
        if bad:
            raise ModelConfigError(f"{where}: layer_types entries must be 'full' or 'sliding', got {bad}")
        if "sliding" in self.layer_types:
            w = self.sliding_window
            if isinstance(w, bool) or not isinstance(w, int) or w <= 0:
                raise ModelConfigError(f"{where}: sliding layers need a positive integer sliding_window, got {w!r}")
        if self.num_parameters is not None and (
            isinstance(self.num_parameters, bool)
            or not isinstance(self.num_parameters, int)
            or self.num_parameters <= 0
        ):
            raise ModelConfigError(f"{where}: num_parameters must be a positive integer, got {self.num_parameters!r}")
        dtype_bytes(self.torch_dtype)

    # ---- structure ----------------------------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def num_sliding_layers(self) -> int:
        return sum(t == "sliding" for t in self.layer_types)

    @property
    def num_full_layers(self) -> int:
        return self.num_layers - self.num_sliding_layers

    def _kv_dtype_bytes(self, dtype: str) -> int:
        if isinstance(dtype, str) and dtype.strip().lower() == "auto":
            return dtype_bytes(self.torch_dtype)
        return dtype_bytes(dtype)

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """KV heads on one tensor-parallel rank: ``num_kv_heads / tp``, or 1 (replicated) when ``tp`` is a multiple
        of the heads. Like vLLM (``get_num_kv_heads``: ``num_kv_heads % tp == 0`` or ``tp % num_kv_heads == 0``
        asserted), any other ``tp`` is refused — it is not a layout an engine can run."""
        tp = _check_pos_int(tp, "tp")
        h = self.num_kv_heads
        if h % tp != 0 and tp % h != 0:
            raise HardwareError(
                f"tp: {tp} does not divide the {h} KV heads of {self.name} (nor is it a multiple of them); "
                f"vLLM refuses this layout"
            )
        self._check_tp(tp)  # and the attention heads (a multiple of the KV heads may still exceed them)
        return max(1, h // tp)

    def _check_tp(self, tp: int) -> int:
        """``tp`` as vLLM accepts it: a positive integer dividing the attention heads (``ModelConfig.
        verify_with_parallel_config``: "Total number of attention heads must be divisible by tensor parallel
        size")."""
        tp = _check_pos_int(tp, "tp")
        a = self.num_attention_heads
        if a and a % tp != 0:
            raise HardwareError(
                f"tp: {tp} does not divide the {a} attention heads of {self.name}; vLLM refuses this layout"
            )
        return tp

    def bytes_per_token_per_layer(self, dtype: str = "bf16", tp: int = 1) -> int:
        """KV bytes one layer stores per token on one GPU (MLA latent, or ``2 × heads/rank × head_dim``)."""
        b = self._kv_dtype_bytes(dtype)
        if self.is_mla:
            self._check_tp(tp)
            return (self.kv_lora_rank + self.qk_rope_head_dim) * b  # type: ignore[operator]
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim * b

    def kv_bytes_per_token(self, dtype: str = "bf16", tp: int = 1) -> KVBytesPerToken:
        """Per-GPU KV bytes per token, split into full-attention and sliding-window layers."""
        per_layer = self.bytes_per_token_per_layer(dtype, tp)
        return KVBytesPerToken(
            full=per_layer * self.num_full_layers,
            sliding=per_layer * self.num_sliding_layers,
            sliding_window=self.sliding_window if self.num_sliding_layers else None,
        )

    def bytes_per_token(self, dtype: str = "bf16", tp: int = 1, *, sliding: SlidingPolicy = "full") -> int:
        """Per-GPU KV bytes per cached token position under a sliding-layer policy (see module docstring).

        ``sliding="full"`` (default) counts sliding layers like full ones (conservative; exact when the model
        has no sliding layers); ``"full_layers_only"`` charges only full-attention layers.
        """
        kv = self.kv_bytes_per_token(dtype, tp)
        if sliding == "full":
            return kv.total
        if sliding == "full_layers_only":
            if kv.full == 0:
                raise HardwareError(
                    f"model {self.name!r} has no full-attention layers; sliding='full_layers_only' would give 0 bytes"
                )
            return kv.full
        raise HardwareError(f"sliding must be one of {_SLIDING_POLICIES}, got {sliding!r}")

    def bytes_per_block(
        self,
        block_size: int = DEFAULT_BLOCK_SIZE,
        dtype: str = "bf16",
        tp: int = 1,
        *,
        sliding: SlidingPolicy = "full",
    ) -> int:
        """Per-GPU bytes of one KV block of ``block_size`` token positions over all layers.

        Qwen3-8B, bf16, block 128: 147,456 × 128 = 18,874,368 B (the paper's "18 MB", App. E).
        """
        block_size = _check_pos_int(block_size, "block_size")
        return block_size * self.bytes_per_token(dtype, tp, sliding=sliding)

    def sequence_kv_bytes(self, num_tokens: int, dtype: str = "bf16", tp: int = 1) -> int:
        """Exact per-GPU KV bytes of one sequence of ``num_tokens`` tokens (no block rounding):
        ``full × n + sliding × min(n, sliding_window)``."""
        n = _check_pos_int(num_tokens, "num_tokens", allow_zero=True)
        kv = self.kv_bytes_per_token(dtype, tp)
        w = kv.sliding_window if kv.sliding_window is not None else n
        return kv.full * n + kv.sliding * min(n, w)

    def weights_bytes(self, dtype: str | None = None, tp: int = 1) -> int:
        """Per-GPU weight bytes ``ceil(num_parameters × dtype_bytes / tp)`` (dtype: ``torch_dtype``)."""
        if self.num_parameters is None:
            raise ModelConfigError(
                f"model {self.name!r} ({self.source}): num_parameters is unknown; pass weights_bytes explicitly"
            )
        tp = _check_pos_int(tp, "tp")
        b = dtype_bytes(dtype if dtype is not None else self.torch_dtype)
        return -(-self.num_parameters * b // tp)
