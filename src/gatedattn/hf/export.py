"""Export a gate-free ``GatedLM`` as a stock transformers checkpoint.

The architecture is the one stock transformers computes identically:

* q/k RMSNorm on -> ``Qwen3ForCausalLM`` (q/k/v/o biases all on or all off);
* no q/k norm, q/k/v bias without o bias -> ``Qwen2ForCausalLM``;
* no q/k norm otherwise -> ``LlamaForCausalLM`` (q/k/v/o biases all on or all off).

Anything else (a gate, a sink, a per-head output transform, MLA, partial RoPE, NTK
RoPE scaling, different norm epsilons) has no stock equivalent and raises
``GatedAttnError``; such models stay in gatedattn's format, which transformers loads
through ``gatedattn.hf.register_auto()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gatedattn.errors import GatedAttnError
from gatedattn.hf.checkpoint import CONFIG_FILE, SINGLE_FILE
from gatedattn.hf.load import hf_specs
from gatedattn.io import atomic_save_safetensors, atomic_write_json
from gatedattn.model import GatedLM, ModelConfig


def _why_not_exportable(cfg: ModelConfig) -> str | None:
    a = cfg.attention
    if a.gate is not None:
        return f"it has a gate (variant {cfg.variant!r}), which stock transformers models do not have"
    if a.sink:
        return "it has a learnable attention sink (AttentionConfig.sink=True)"
    if a.head_transform != "none":
        return f"AttentionConfig.head_transform={a.head_transform!r} has no stock equivalent"
    if a.kv != "gqa":
        return f"AttentionConfig.kv={a.kv!r}: only grouped-query attention exports"
    if a.rope.fraction != 1.0:
        return f"RopeConfig.fraction={a.rope.fraction}: stock Qwen3/Llama/Qwen2 rotate the whole head"
    if a.rope.scaling == "ntk":
        return "RopeConfig.scaling='ntk' (static NTK) has no transformers rope_type"
    if a.qk_norm and a.norm_eps != cfg.norm_eps:
        return (f"AttentionConfig.norm_eps={a.norm_eps} differs from ModelConfig.norm_eps={cfg.norm_eps}; "
                f"Qwen3 uses one rms_norm_eps")
    if a.qk_norm and a.qkv_bias != a.o_bias:
        return (f"qkv_bias={a.qkv_bias} with o_bias={a.o_bias}: Qwen3's attention_bias sets all four "
                f"projections' biases together")
    if not a.qk_norm and a.o_bias and not a.qkv_bias:
        return "o_bias=True without qkv_bias: Llama's attention_bias sets all four projections' biases together"
    return None


def _rope_parameters(cfg: ModelConfig) -> dict[str, Any]:
    r = cfg.attention.rope
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": r.theta}
    if r.scaling == "linear":
        params.update(rope_type="linear", factor=r.factor)
    elif r.scaling == "yarn" and r.factor > 1:
        params.update(rope_type="yarn", factor=r.factor, original_max_position_embeddings=r.original_max_len,
                      beta_fast=r.beta_fast, beta_slow=r.beta_slow, truncate=True)
    return params


def hf_config_for(cfg: ModelConfig):
    """The transformers config (Qwen3Config, Qwen2Config or LlamaConfig) equivalent to ``cfg``."""
    reason = _why_not_exportable(cfg)
    if reason is not None:
        raise GatedAttnError(f"cannot export to a stock transformers model: {reason}; "
                             f"save it in gatedattn format instead (loadable with AutoModelForCausalLM after "
                             f"gatedattn.hf.register_auto())")
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    a = cfg.attention
    common = dict(
        vocab_size=cfg.vocab_size, hidden_size=a.d_model, intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers, num_attention_heads=a.n_heads, num_key_value_heads=a.n_kv_heads,
        head_dim=a.head_dim, hidden_act="silu", max_position_embeddings=cfg.max_seq_len,
        initializer_range=cfg.init_std, rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters=_rope_parameters(cfg), bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
        attention_dropout=0.0,
    )
    try:
        if a.qk_norm:
            hf = Qwen3Config(**common, attention_bias=a.qkv_bias, use_sliding_window=False)
            arch = "Qwen3ForCausalLM"
        elif a.qkv_bias and not a.o_bias:
            hf = Qwen2Config(**common, use_sliding_window=False)
            arch = "Qwen2ForCausalLM"
        else:
            hf = LlamaConfig(**common, attention_bias=a.qkv_bias, mlp_bias=False)
            arch = "LlamaForCausalLM"
    except Exception as e:  # transformers' validation (e.g. hidden_size not divisible by heads)
        raise GatedAttnError(f"cannot export to a stock transformers model: {type(e).__name__}: {e}") from None
    hf.architectures = [arch]
    return hf


def export_hf(model: GatedLM, directory: str | Path) -> Path:
    """Write ``model`` as a stock transformers checkpoint (``config.json`` and
    ``model.safetensors``, HF tensor names) in ``directory``; each file is written
    atomically. Raises ``GatedAttnError`` before writing if the model has no stock form."""
    import json

    cfg = model.cfg
    hf = hf_config_for(cfg)
    ours = model.state_dict()
    hf.dtype = str(next(iter(ours.values())).dtype).removeprefix("torch.")
    tensors = {}
    for spec in hf_specs(cfg, "plain"):
        (target,) = spec.targets
        tensors[spec.hf_name] = ours[target]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_save_safetensors(directory / SINGLE_FILE, tensors, metadata={"format": "pt"})
    atomic_write_json(directory / CONFIG_FILE, json.loads(hf.to_json_string(use_diff=False)))
    return directory
