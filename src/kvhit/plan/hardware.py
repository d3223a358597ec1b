"""KV-cache memory model: bytes per token from model configs, blocks ↔ GB, accelerator presets.

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

Which layers slide is read from the config, in this order: an explicit ``layer_types`` list
(``"full_attention"`` / ``"sliding_attention"``; Llama-4's ``"chunked_attention"`` is treated as sliding with
window ``attention_chunk_size``); Qwen2/Qwen3's ``use_sliding_window`` (layers with index ≥
``max_window_layers`` slide when it is true); Gemma-3's ``sliding_window_pattern`` ``p`` (layer ``i`` slides
unless ``(i + 1) % p == 0``); Gemma-2 (even layers slide); Mistral/Mixtral (all layers slide when
``sliding_window`` is set). Any other config with a non-null ``sliding_window`` raises
:class:`ModelConfigError` rather than guess.

**KV dtype.** ``bf16``/``fp16`` = 2 bytes, ``fp8`` (e4m3/e5m2) = 1 byte, ``fp32`` = 4 bytes; ``"auto"``
uses the model's ``torch_dtype``. Quantization scales (e.g. vLLM's per-tensor fp8 scales, the packed
``fp8_ds_mla`` layout) are not modelled.

**Memory budget** (:func:`kv_budget_bytes`), mirroring vLLM's profiling::

    KV bytes per GPU = gpu_memory_utilization × HBM − weights / tp − reserve

with weights = ``num_parameters × weights_dtype bytes`` unless ``weights_bytes`` is given, and ``reserve`` an
allowance for activations, CUDA graphs and non-torch allocations (default :data:`DEFAULT_RESERVE_BYTES`).
:func:`kv_capacity_blocks` divides a per-GPU budget by the per-GPU bytes per block (as vLLM computes the
number of GPU blocks per worker) and returns ``N``.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

__all__ = [
    "GIB",
    "GB_DECIMAL",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "DEFAULT_RESERVE_BYTES",
    "ModelConfigError",
    "HardwareError",
    "KVBytesPerToken",
    "ModelKV",
    "Accelerator",
    "ACCELERATORS",
    "dtype_bytes",
    "load_model_config",
    "model_from_config",
    "estimate_num_parameters",
    "list_models",
    "get_model",
    "resolve_model",
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
DEFAULT_BLOCK_SIZE: int = 128
"""Tokens per KV block (the paper's App. E setting; vLLM's CUDA default is 16)."""
DEFAULT_GPU_MEMORY_UTILIZATION: float = 0.9
"""Fraction of HBM the serving engine may use (vLLM's ``--gpu-memory-utilization`` default)."""
DEFAULT_RESERVE_BYTES: int = 2 * GIB
"""Default allowance for peak activations, CUDA graphs and non-torch memory (NCCL, cuBLAS workspaces):
2 GiB, a rule of thumb for 8B–70B dense models at vLLM's default batched-token limits, not a measurement.
For exact numbers pass the value vLLM logs ("Available KV cache memory") as ``kv_gb``."""

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


def _check_nonneg_number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise HardwareError(f"{name} must be a finite number >= 0, got {value!r}")
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


# --------------------------------------------------------------------------------------------------------
# Parsing Hugging Face config.json
# --------------------------------------------------------------------------------------------------------

_ALL_SLIDING_MODEL_TYPES = frozenset({"mistral", "mixtral"})


def _get_int(cfg: Mapping[str, Any], key: str, src: str, *, default: Any = ..., positive: bool = True) -> Any:
    if key not in cfg or cfg[key] is None:
        if default is ...:
            raise ModelConfigError(f"{src}: required field {key!r} is missing")
        return default
    v = cfg[key]
    if (
        isinstance(v, bool)
        or not isinstance(v, numbers.Real)
        or not math.isfinite(v)
        or v != int(v)
        or v < 0
        or (positive and v == 0)
    ):
        raise ModelConfigError(f"{src}: field {key!r} must be a positive integer, got {v!r}")
    if v > _MAX_CONFIG_INT:
        raise ModelConfigError(f"{src}: field {key!r} = {v!r} is implausibly large (> 2**40)")
    return int(v)


_MAX_CONFIG_INT = 2**40  #: no layer count, head count or dimension of a real model comes near this


def _layer_types(cfg: Mapping[str, Any], n_layers: int, src: str) -> tuple[tuple[str, ...], int | None]:
    """Per-layer ``"full"``/``"sliding"`` and the sliding window (rules: see the module docstring)."""
    window = cfg.get("sliding_window")
    model_type = str(cfg.get("model_type", "")).lower()

    lt = cfg.get("layer_types")
    if lt is not None:
        if not isinstance(lt, list | tuple) or len(lt) != n_layers:
            got = len(lt) if isinstance(lt, list | tuple) else type(lt).__name__
            raise ModelConfigError(f"{src}: field 'layer_types' must be a list of {n_layers} entries, got {got}")
        out: list[str] = []
        chunked = False
        for i, t in enumerate(lt):
            if t == "full_attention":
                out.append("full")
            elif t == "sliding_attention":
                out.append("sliding")
            elif t == "chunked_attention":
                out.append("sliding")
                chunked = True
            else:
                raise ModelConfigError(
                    f"{src}: field 'layer_types'[{i}] = {t!r} is not supported (expected 'full_attention', "
                    "'sliding_attention' or 'chunked_attention')"
                )
        if chunked:
            if "sliding_attention" in lt:
                raise ModelConfigError(f"{src}: field 'layer_types' mixes sliding and chunked attention")
            window = _get_int(cfg, "attention_chunk_size", src)
        elif "sliding" in out:
            window = _get_int(cfg, "sliding_window", src)
        else:
            window = None
        return tuple(out), window

    if "use_sliding_window" in cfg:  # Qwen2 / Qwen2.5 / Qwen3 style
        if not cfg["use_sliding_window"] or window is None:
            return ("full",) * n_layers, None
        window = _get_int(cfg, "sliding_window", src)
        mwl = _get_int(cfg, "max_window_layers", src, positive=False)
        return tuple("sliding" if i >= mwl else "full" for i in range(n_layers)), (window if mwl < n_layers else None)

    if window is None:
        return ("full",) * n_layers, None
    window = _get_int(cfg, "sliding_window", src)

    pattern = cfg.get("sliding_window_pattern")
    if pattern is not None:  # Gemma-3: every pattern-th layer is global
        p = _get_int(cfg, "sliding_window_pattern", src)
        types = tuple("full" if (i + 1) % p == 0 else "sliding" for i in range(n_layers))
        return types, (window if "sliding" in types else None)
    if model_type == "gemma2":  # Gemma-2: even layers slide, odd layers global
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(n_layers)), window
    if model_type in _ALL_SLIDING_MODEL_TYPES:
        return ("sliding",) * n_layers, window
    raise ModelConfigError(
        f"{src}: field 'sliding_window' = {window} is set but the config does not say which layers use it "
        "(no 'layer_types', 'use_sliding_window' or 'sliding_window_pattern'); add a 'layer_types' list"
    )


def estimate_num_parameters(config: Mapping[str, Any]) -> int | None:
    """Parameter count of a dense Llama/Qwen2/Qwen3/Mistral-style decoder from its config, else ``None``.

    Counts embeddings (+ untied LM head), q/k/v/o projections (+ Qwen2's q/k/v biases, Qwen3's q/k norms),
    the gated MLP (3 × hidden × intermediate), two RMSNorms per layer and the final norm. MoE, MLA and
    multimodal configs return ``None`` (store ``num_parameters`` or pass ``weights_bytes`` instead).
    """
    cfg = config.get("text_config", config) if "num_hidden_layers" not in config else config
    mt = str(cfg.get("model_type", "")).lower()
    if mt not in ("llama", "mistral", "qwen2", "qwen3") or cfg.get("kv_lora_rank") is not None:
        return None
    if any(cfg.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        return None
    try:
        h = int(cfg["hidden_size"])
        inter = int(cfg["intermediate_size"])
        n_layers = int(cfg["num_hidden_layers"])
        n_heads = int(cfg["num_attention_heads"])
        n_kv = int(cfg.get("num_key_value_heads") or n_heads)
        hd = int(cfg.get("head_dim") or h // n_heads)
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    q, kv = n_heads * hd, n_kv * hd
    attn = h * q + 2 * h * kv + q * h
    if mt == "qwen2" or cfg.get("attention_bias"):
        attn += q + 2 * kv + (h if cfg.get("attention_bias") and mt != "qwen2" else 0)
    if mt == "qwen3":
        attn += 2 * hd
    mlp = 3 * h * inter + (2 * inter + h if cfg.get("mlp_bias") else 0)
    per_layer = attn + mlp + 2 * h
    emb = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return n_layers * per_layer + h + emb


def _load_json(path: os.PathLike[str] | str) -> dict[str, Any]:
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, "config.json")
    try:
        with open(p, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError as e:
        raise ModelConfigError(f"{p}: config file not found") from e
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{p}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ModelConfigError(f"{p}: top level must be a JSON object")
    return data


def model_from_config(
    config: Mapping[str, Any] | os.PathLike[str] | str,
    *,
    name: str | None = None,
    num_parameters: int | None = None,
    source: str | None = None,
) -> ModelKV:
    """Build a :class:`ModelKV` from a Hugging Face ``config.json`` (a path, a model directory, or a dict).

    Fields read: ``num_hidden_layers``; ``num_key_value_heads`` (default ``num_attention_heads``);
    ``head_dim`` (default ``hidden_size / num_attention_heads``); MLA ``kv_lora_rank`` + ``qk_rope_head_dim``;
    sliding-window information (see the module docstring); ``torch_dtype``/``dtype``. Multimodal configs with
    a ``text_config`` are read from it. A ``_kvhit`` object (shipped presets) may supply ``name``,
    ``num_parameters`` and ``aliases``. Missing or invalid fields raise :class:`ModelConfigError` naming the
    field and the file.
    """
    if isinstance(config, Mapping):
        raw: Mapping[str, Any] = config
        src = source or "<dict>"
    elif isinstance(config, str | os.PathLike):
        raw = _load_json(config)
        src = source or os.fspath(config)
    else:
        raise ModelConfigError(f"config must be a mapping or a path, got {type(config).__name__}")

    meta = raw.get("_kvhit") or {}
    if not isinstance(meta, Mapping):
        raise ModelConfigError(f"{src}: field '_kvhit' must be an object")
    cfg: Mapping[str, Any] = raw
    if "num_hidden_layers" not in raw and isinstance(raw.get("text_config"), Mapping):
        cfg = raw["text_config"]
        src = f"{src} [text_config]"

    n_layers = _get_int(cfg, "num_hidden_layers", src)
    mla = cfg.get("kv_lora_rank") is not None
    if mla:
        kv_lora_rank = _get_int(cfg, "kv_lora_rank", src)
        qk_rope = _get_int(cfg, "qk_rope_head_dim", src)
        n_heads = _get_int(cfg, "num_attention_heads", src, default=None)
        n_kv = 1
        head_dim = kv_lora_rank + qk_rope
    else:
        kv_lora_rank = qk_rope = None
        if cfg.get("num_key_value_heads") is None and cfg.get("num_attention_heads") is None:
            raise ModelConfigError(f"{src}: required field 'num_key_value_heads' (or 'num_attention_heads') is missing")
        n_heads = _get_int(cfg, "num_attention_heads", src, default=None)
        n_kv = _get_int(cfg, "num_key_value_heads", src, default=n_heads)
        if cfg.get("head_dim") is not None:
            head_dim = _get_int(cfg, "head_dim", src)
        else:
            if n_heads is None:
                raise ModelConfigError(f"{src}: required field 'head_dim' (or 'num_attention_heads') is missing")
            if cfg.get("hidden_size") is None:
                raise ModelConfigError(f"{src}: required field 'head_dim' (or 'hidden_size') is missing")
            hidden = _get_int(cfg, "hidden_size", src)
            if hidden % n_heads:
                raise ModelConfigError(
                    f"{src}: field 'hidden_size' = {hidden} is not divisible by "
                    f"num_attention_heads = {n_heads}; give 'head_dim'"
                )
            head_dim = hidden // n_heads
        if n_heads is not None and n_heads % n_kv:
            raise ModelConfigError(
                f"{src}: field 'num_key_value_heads' = {n_kv} does not divide num_attention_heads = {n_heads}"
            )

    layer_types, window = _layer_types(cfg, n_layers, src)

    td = cfg.get("torch_dtype", cfg.get("dtype", raw.get("torch_dtype", "bfloat16"))) or "bfloat16"
    try:
        dtype_bytes(str(td))
    except HardwareError as e:
        raise ModelConfigError(f"{src}: field 'torch_dtype' = {td!r} is not a known dtype") from e

    if num_parameters is None:
        num_parameters = meta.get("num_parameters")
        if num_parameters is None:
            num_parameters = estimate_num_parameters(raw)
    aliases = tuple(str(a).lower() for a in meta.get("aliases", ()))
    disp = name or meta.get("name") or cfg.get("_name_or_path") or raw.get("_name_or_path")
    if not disp:
        disp = os.path.basename(os.path.dirname(src)) if src.endswith("config.json") else src
    return ModelKV(
        name=str(disp),
        num_layers=n_layers,
        num_kv_heads=n_kv,
        head_dim=head_dim,
        num_attention_heads=n_heads,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope,
        layer_types=layer_types,
        sliding_window=window,
        num_parameters=num_parameters,
        torch_dtype=str(td).lower().removeprefix("torch."),
        source=src,
        aliases=aliases,
    )


load_model_config = model_from_config
"""Alias of :func:`model_from_config`."""


# --------------------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------------------

_PRESETS: dict[str, ModelKV] | None = None


def _presets() -> dict[str, ModelKV]:
    global _PRESETS
    if _PRESETS is None:
        found: dict[str, ModelKV] = {}
        root = resources.files("kvhit").joinpath("data", "models")
        for entry in sorted(root.iterdir(), key=lambda e: e.name):
            if not entry.name.endswith(".json"):
                continue
            try:
                data = json.loads(entry.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise ModelConfigError(f"preset:{entry.name}: not valid JSON ({e})") from e
            found[entry.name.removesuffix(".json")] = model_from_config(data, source=f"preset:{entry.name}")
        _PRESETS = found
    return _PRESETS


def list_models() -> list[str]:
    """Names of the shipped model presets (``src/kvhit/data/models/*.json``)."""
    return [m.name for m in _presets().values()]


def get_model(name: str) -> ModelKV:
    """A shipped preset by name, file stem, Hugging Face repo id or alias (case-insensitive)."""
    key = str(name).strip().lower()
    for stem, m in _presets().items():
        if key in (stem, m.name.lower(), *m.aliases):
            return m
    raise ModelConfigError(f"unknown model preset {name!r}; available: {list_models()}")


def resolve_model(model: ModelKV | Mapping[str, Any] | os.PathLike[str] | str) -> ModelKV:
    """Accept a :class:`ModelKV`, a config dict, a preset name, or a path to a config.json / model dir."""
    if isinstance(model, ModelKV):
        return model
    if isinstance(model, Mapping):
        return model_from_config(model)
    if isinstance(model, str) and not os.path.exists(model):
        return get_model(model)
    if isinstance(model, str | os.PathLike):
        return model_from_config(model)
    raise ModelConfigError(f"cannot interpret model {model!r}")


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
