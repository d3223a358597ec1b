"""Reading a model's KV shape from a Hugging Face ``config.json``, and the shipped model presets.

:func:`model_from_config` builds a :class:`~kvhit.plan.model_kv.ModelKV` from a config (a path, a model
directory or a dict); :func:`get_model` / :func:`list_models` serve the presets in ``src/kvhit/data/models``;
:func:`resolve_model` accepts any of a :class:`~kvhit.plan.model_kv.ModelKV`, a config, a preset name or a path.

Which layers slide is read from the config, in this order: an explicit ``layer_types`` list
(``"full_attention"`` / ``"sliding_attention"``; Llama-4's ``"chunked_attention"`` is treated as sliding with
window ``attention_chunk_size``); Qwen2/Qwen3's ``use_sliding_window`` (layers with index ≥
``max_window_layers`` slide when it is true); Gemma-3's ``sliding_window_pattern`` ``p`` (layer ``i`` slides
unless ``(i + 1) % p == 0``); Gemma-2 (even layers slide); Mistral/Mixtral (all layers slide when
``sliding_window`` is set). Any other config with a non-null ``sliding_window`` raises
:class:`~kvhit.plan.model_kv.ModelConfigError` rather than guess.

Invariant: a config is read or refused — a missing or invalid required field raises
:class:`~kvhit.plan.model_kv.ModelConfigError` naming the field and the source, and sliding layers are never
guessed (a ``sliding_window`` with no rule saying which layers use it is refused).

Not modelled: parameter counts of MoE, MLA and multimodal configs (:func:`estimate_num_parameters` returns
``None``; store ``num_parameters`` or pass ``weights_bytes``).
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping
from importlib import resources
from typing import Any

from kvhit.plan.model_kv import HardwareError, ModelConfigError, ModelKV, dtype_bytes

__all__ = [
    "load_model_config",
    "model_from_config",
    "estimate_num_parameters",
    "list_models",
    "get_model",
    "resolve_model",
]


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
