"""Prefill compute: FLOPs of computing (or of skipping, on a prefix-cache hit) a prompt's tokens, and GPU-seconds.

A prefix-cache hit of ``h`` tokens skips the forward pass of the prompt's first ``h`` positions (their K/V are
read from the cache). The FLOPs of positions ``a … b−1`` of one sequence are counted as the usual decoder
estimate (Kaplan et al. 2020, eq. 2.2 and Table 1: ``2·N`` per token for the matrix multiplies, plus the
attention scores)::

    F(a, b) = 2·P_lin·(b − a)  +  Σ_layers Σ_{i=a}^{b−1} 2·H·(d_qk + d_v)·ctx_ℓ(i),    ctx_ℓ(i) = i + 1  (full)
                                                                                         min(i + 1, W)  (sliding)

* ``P_lin`` — the parameters multiplied per token: every weight except the token embedding (a lookup) and the
  LM head (vLLM computes logits only at the last prompt position, ``compute_logits`` on the sampled index), for
  mixture-of-experts models the *active* experts only (``num_experts_per_tok`` routed + shared experts);
* the attention term — ``Q·Kᵀ`` (``2·H·d_qk`` per key) and ``A·V`` (``2·H·d_v`` per key) for each query
  position over its causal context; sliding-window layers see at most ``W`` keys. MLA (DeepSeek-V3) is counted
  in the non-absorbed prefill form: ``d_qk = qk_nope_head_dim + qk_rope_head_dim``, ``d_v = v_head_dim``.

Counted from the config for Llama / Qwen2 / Qwen3 / Mistral dense models, gpt-oss (``num_local_experts``,
``num_experts_per_tok``) and DeepSeek-V3 (MLA + MoE with ``first_k_dense_replace`` dense layers); for any other
architecture give ``active_params`` (the per-token non-embedding parameters). GPU-seconds are
``F / (peak × mfu)`` with ``peak`` the accelerator's dense BF16 peak (:data:`PEAK_BF16_TFLOPS`, vendor datasheet
values without 2:4 sparsity) and ``mfu`` the fraction of peak the prefill achieves — an *assumption* the caller
states (default :data:`DEFAULT_MFU`), not a measurement.

Invariant: FLOPs are non-negative, additive over disjoint position ranges (``F(0, T) = F(0, h) + F(h, T)``) and
exact integers for integer inputs (computed in Python ints / float64 sums of integers below 2^53 per term).
NOT modelled: norms, rotary embeddings, softmax and activation FLOPs (lower order), padding, tensor-parallel
communication, kernel efficiency (folded into ``mfu``), speculative-decoding heads.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from kvhit.plan import hardware, model_config, model_kv

__all__ = ["PEAK_BF16_TFLOPS", "DEFAULT_MFU", "ComputeError", "PrefillFlops", "prefill_flops", "peak_flops"]

DEFAULT_MFU: float = 0.5
"""Assumed fraction of the dense BF16 peak a long-prompt prefill achieves (an assumption, not a measurement)."""

#: Dense BF16 peak per accelerator, TFLOP/s, from the vendors' datasheets (without 2:4 sparsity): H100 SXM and
#: H200 989 (1,979 with sparsity), B200 2,250 (HGX B200), MI300X 1,307.4. The Ascend 910B2 has no preset (give
#: ``peak_tflops``).
PEAK_BF16_TFLOPS: dict[str, float] = {"h100": 989.0, "h200": 989.0, "b200": 2250.0, "mi300x": 1307.4}


class ComputeError(ValueError):
    """A model or accelerator whose prefill FLOPs or peak cannot be determined (one line, naming the input)."""


def peak_flops(accelerator: str | None, peak_tflops: float | None = None) -> float:
    """FLOP/s of one accelerator: ``peak_tflops`` when given, else the preset's dense BF16 peak."""
    if peak_tflops is not None:
        if not (math.isfinite(peak_tflops) and peak_tflops > 0):
            raise ComputeError(f"peak_tflops: expected a finite number > 0, got {peak_tflops!r}")
        return float(peak_tflops) * 1e12
    if accelerator is None:
        raise ComputeError("peak: give an accelerator or peak_tflops")
    a = hardware.get_accelerator(accelerator)
    v = PEAK_BF16_TFLOPS.get(a.name.lower())
    if v is None:
        raise ComputeError(f"accelerator {a.name}: no BF16 peak preset; give peak_tflops")
    return v * 1e12


def _raw_config(m: model_kv.ModelKV) -> dict[str, Any]:
    src = m.source
    if src.startswith("preset:"):
        fn = src.removeprefix("preset:")
        return json.loads(resources.files("kvhit").joinpath("data", "models", fn).read_text(encoding="utf-8"))
    path = src.split(" [")[0]
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    return raw


def _i(cfg: dict, key: str, default: int | None = None) -> int:
    v = cfg.get(key, default)
    if v is None or isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ComputeError(f"model config: field {key!r} missing or not a non-negative integer ({v!r})")
    return int(v)


def _linear_params(cfg: dict) -> tuple[int, int, int] | None:
    """``(P_lin, d_qk, d_v)`` from a config, or ``None`` for an architecture not counted here."""
    mt = str(cfg.get("model_type", "")).lower()
    h = _i(cfg, "hidden_size")
    L = _i(cfg, "num_hidden_layers")
    H = _i(cfg, "num_attention_heads")
    if mt in ("llama", "mistral", "qwen2", "qwen3") and not any(
        cfg.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts")
    ):
        kv = _i(cfg, "num_key_value_heads", H)
        d = int(cfg.get("head_dim") or h // H)
        inter = _i(cfg, "intermediate_size")
        attn = h * H * d + 2 * h * kv * d + H * d * h
        if mt == "qwen2" or cfg.get("attention_bias"):
            attn += H * d + 2 * kv * d
        return L * (attn + 3 * h * inter), d, d
    if mt == "gpt_oss":
        kv = _i(cfg, "num_key_value_heads", H)
        d = _i(cfg, "head_dim")
        inter = _i(cfg, "intermediate_size")
        E, k = _i(cfg, "num_local_experts"), _i(cfg, "num_experts_per_tok")
        attn = h * H * d + 2 * h * kv * d + H * d * h
        return L * (attn + h * E + k * 3 * h * inter), d, d
    if mt in ("deepseek_v3", "deepseek_v2"):
        ql = _i(cfg, "q_lora_rank")
        kl = _i(cfg, "kv_lora_rank")
        nope, rope, dv = _i(cfg, "qk_nope_head_dim"), _i(cfg, "qk_rope_head_dim"), _i(cfg, "v_head_dim")
        attn = h * ql + ql * H * (nope + rope) + h * (kl + rope) + kl * H * (nope + dv) + H * dv * h
        dense = _i(cfg, "first_k_dense_replace", 0)
        mi = _i(cfg, "moe_intermediate_size")
        E, k, shared = _i(cfg, "n_routed_experts"), _i(cfg, "num_experts_per_tok"), _i(cfg, "n_shared_experts", 0)
        moe = h * E + (k + shared) * 3 * h * mi
        mlp = dense * 3 * h * _i(cfg, "intermediate_size") + (L - dense) * moe
        return L * attn + mlp, nope + rope, dv
    return None


@dataclass(frozen=True)
class PrefillFlops:
    """The prefill FLOPs model of one model (see the module docstring); ``flops(a, b)`` per request arrays."""

    model: str
    linear_params: int  #: P_lin: parameters multiplied per prompt token
    heads: int
    d_qk: int
    d_v: int
    full_layers: int
    sliding_layers: int
    window: int | None
    source: str  #: "config" or "active_params"

    def per_token_linear(self) -> float:
        return 2.0 * self.linear_params

    def flops(self, a, b) -> np.ndarray:
        """FLOPs of positions ``a … b−1`` (arrays, ``0 ≤ a ≤ b``) of each sequence."""
        a = np.asarray(a, np.float64)
        b = np.asarray(b, np.float64)
        if np.any(a < 0) or np.any(b < a):
            raise ComputeError("flops: expected 0 <= a <= b")
        c = 2.0 * self.heads * (self.d_qk + self.d_v)
        full = (b * (b + 1) - a * (a + 1)) / 2.0  # Σ_{i=a}^{b-1} (i + 1)
        out = 2.0 * self.linear_params * (b - a) + c * self.full_layers * full
        if self.sliding_layers:
            W = float(self.window)
            # Σ min(i + 1, W) = Σ_{i<min(b,W)} (i+1) over the part below W, plus W per position at or above W
            lo, hi = np.minimum(a, W), np.minimum(b, W)
            tri = (hi * (hi + 1) - lo * (lo + 1)) / 2.0
            flat = W * (b - np.maximum(a, W)).clip(min=0)
            out = out + c * self.sliding_layers * (tri + flat)
        return out


def prefill_flops(model, active_params: int | None = None) -> PrefillFlops:
    """The prefill FLOPs model of ``model`` (a preset name, config path or :class:`~kvhit.plan.model_kv.ModelKV`).

    ``active_params`` overrides ``P_lin`` (required for architectures not counted from the config).
    """
    m = model_config.resolve_model(model)
    cfg = _raw_config(m)
    cfg = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg
    counted = None
    if cfg:
        try:
            counted = _linear_params(cfg)
        except ComputeError:
            counted = None
    H = m.num_attention_heads or m.num_kv_heads
    if counted is not None:
        p_lin, dqk, dv = counted
        src = "config"
    else:
        dqk = dv = m.head_dim
        p_lin, src = 0, "active_params"
    if active_params is not None:
        if isinstance(active_params, bool) or not isinstance(active_params, int) or active_params <= 0:
            raise ComputeError(f"active_params: expected a positive integer, got {active_params!r}")
        p_lin, src = int(active_params), "active_params"
    elif counted is None:
        raise ComputeError(
            f"model {m.name}: its per-token parameters are not counted from this config (dense Llama/Qwen/Mistral, "
            "gpt-oss and DeepSeek-V3 are); give active_params"
        )
    return PrefillFlops(
        model=m.name,
        linear_params=int(p_lin),
        heads=int(H),
        d_qk=int(dqk),
        d_v=int(dv),
        full_layers=m.num_full_layers,
        sliding_layers=m.num_sliding_layers,
        window=m.sliding_window,
        source=src,
    )
