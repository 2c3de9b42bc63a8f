"""Single transformers attention layers as equivalent ``gatedattn.Attention`` layers.

Whole Qwen3-Next and GPT-OSS models are not GatedLM-shaped (linear-attention and MoE
layers), but their softmax attention layers are members of the family:

* ``Qwen3NextAttention``: elementwise G1 sigmoid gate packed per head into ``q_proj``
  (``[q_h | gate_h]``, see ``gatedattn.hf.layouts``), zero-centred q/k RMSNorm
  (``x_hat * (1 + w)``, converted to ``w + 1``), partial RoPE;
* ``GptOssAttention``: a learnable per-head sink (``sinks`` (H,)), q/k/v/o biases.
  Sliding-window layers are refused (``Attention`` is full causal attention).
"""

from __future__ import annotations

import torch

from gatedattn.layers.attention import Attention
from gatedattn.layers.config import AttentionConfig, GateConfig
from gatedattn.infra.errors import GatedAttnError
from gatedattn.hf.layouts import split_interleaved
from gatedattn.hf.importers import rope_from_hf
from gatedattn.models.lm import check_state_dict


def _head_dim(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def _build(cfg: AttentionConfig, state: dict[str, torch.Tensor], source: str, like: torch.Tensor) -> Attention:
    layer = Attention(cfg)
    expected = layer.state_dict()
    check_state_dict(state, expected, source)
    layer.load_state_dict({k: v.detach().float() for k, v in state.items()})
    return layer.to(device=like.device, dtype=like.dtype).eval()


def _linear(module, state: dict[str, torch.Tensor], target: str) -> None:
    state[f"{target}.weight"] = module.weight
    if module.bias is not None:
        state[f"{target}.bias"] = module.bias


def attention_from_qwen3_next(hf_layer, hf_config) -> Attention:
    """A ``Qwen3NextAttention`` (with its ``Qwen3NextConfig``) as an ``Attention``
    computing the same outputs: ``Attention(x)`` equals ``hf_layer(x, ...)[0]`` with
    causal masking and the model's RoPE."""
    source = f"{type(hf_config).__name__} (layer {getattr(hf_layer, 'layer_idx', '?')})"
    H, Hkv, D = hf_config.num_attention_heads, hf_config.num_key_value_heads, _head_dim(hf_config)
    bias = bool(getattr(hf_config, "attention_bias", False))
    cfg = AttentionConfig(
        d_model=hf_config.hidden_size, n_heads=H, n_kv_heads=Hkv, head_dim=D,
        rope=rope_from_hf(hf_config, D, source, allow_partial=True), qk_norm=True,
        qkv_bias=bias, o_bias=bias, norm_eps=float(hf_config.rms_norm_eps),
        gate=GateConfig(position="g1", granularity="elementwise", activation="sigmoid", bias=bias),
    )
    want = (2 * H * D, hf_config.hidden_size)
    if tuple(hf_layer.q_proj.weight.shape) != want:
        raise GatedAttnError(f"{source}: q_proj.weight has shape {tuple(hf_layer.q_proj.weight.shape)}, "
                             f"a gated Qwen3-Next layer needs {want}")
    state: dict[str, torch.Tensor] = {}
    kinds = ("weight", "bias") if bias else ("weight",)
    for kind in kinds:
        q, gate = split_interleaved(getattr(hf_layer.q_proj, kind).detach(), H, D, D)
        state[f"qkv.q_proj.{kind}"], state[f"gate.x.proj.{kind}"] = q, gate
    _linear(hf_layer.k_proj, state, "qkv.k_proj")
    _linear(hf_layer.v_proj, state, "qkv.v_proj")
    _linear(hf_layer.o_proj, state, "o_proj")
    # Qwen3NextRMSNorm is zero-centred: x_hat * (1 + w); nn.RMSNorm computes x_hat * w
    state["q_norm.weight"] = hf_layer.q_norm.weight.detach().float() + 1.0
    state["k_norm.weight"] = hf_layer.k_norm.weight.detach().float() + 1.0
    return _build(cfg, {k: v.detach() for k, v in state.items()}, source, hf_layer.q_proj.weight)


def attention_from_gpt_oss(hf_layer, hf_config) -> Attention:
    """A full-attention ``GptOssAttention`` as an ``Attention`` with a learnable sink.
    Sliding-window layers raise ``GatedAttnError``."""
    idx = getattr(hf_layer, "layer_idx", "?")
    source = f"{type(hf_config).__name__} (layer {idx})"
    if getattr(hf_layer, "sliding_window", None) is not None:
        raise GatedAttnError(f"{source}: layer_types[{idx}]='sliding_attention' (sliding_window="
                             f"{hf_layer.sliding_window}) is not supported: Attention is full causal attention")
    H, Hkv, D = hf_config.num_attention_heads, hf_config.num_key_value_heads, _head_dim(hf_config)
    bias = bool(getattr(hf_config, "attention_bias", False))
    cfg = AttentionConfig(
        d_model=hf_config.hidden_size, n_heads=H, n_kv_heads=Hkv, head_dim=D,
        rope=rope_from_hf(hf_config, D, source, allow_partial=False), qk_norm=False,
        qkv_bias=bias, o_bias=bias, norm_eps=float(getattr(hf_config, "rms_norm_eps", 1e-6)), sink=True,
    )
    state: dict[str, torch.Tensor] = {"sink": hf_layer.sinks}
    for name in ("q_proj", "k_proj", "v_proj"):
        _linear(getattr(hf_layer, name), state, f"qkv.{name}")
    _linear(hf_layer.o_proj, state, "o_proj")
    return _build(cfg, {k: v.detach() for k, v in state.items()}, source, hf_layer.q_proj.weight)
