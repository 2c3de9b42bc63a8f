"""Export a ``GatedLM`` as a checkpoint other code reads without gatedattn.

Three target layouts (``LAYOUTS``), each for the models it expresses exactly:

* ``stock`` -- a gate-free model as stock transformers computes it:
  q/k RMSNorm on -> ``Qwen3ForCausalLM`` (q/k/v/o biases all on or all off);
  no q/k norm, q/k/v bias without o bias -> ``Qwen2ForCausalLM``;
  no q/k norm otherwise -> ``LlamaForCausalLM`` (q/k/v/o biases all on or all off).
* ``qwen3-next`` -- a ``gated`` model (G1 elementwise sigmoid head-specific gate from
  X, q/k norm) as a stock ``Qwen3NextForCausalLM``: every layer ``full_attention``,
  dense MLPs (``mlp_only_layers`` lists every layer), RMSNorm weights stored
  zero-centred (``w - 1``: Qwen3-Next computes ``x_hat * (1 + w)``), ``q_proj`` holding
  ``[q_h | gate_h]`` per head, ``partial_rotary_factor`` = ``RopeConfig.fraction``.
* ``official`` -- a ``gated`` / ``gated-headwise`` model as the paper's released
  checkpoints: a Qwen3 config with ``elementwise_attn_output_gate`` /
  ``headwise_attn_output_gate`` and the KV-grouped ``q_proj`` (see
  ``gatedattn.hf.layouts``). Stock transformers cannot run it (its ``q_proj`` is wider);
  the paper's modelling code and ``gatedattn.hf.load_model`` can.

``export_hf(model, dir)`` picks ``stock`` for a gate-free model and ``qwen3-next`` for
a gated one. Anything a layout cannot express (another gate position or activation,
a headwise gate in Qwen3-Next, sinks, MLA, HyGA gates, partial RoPE in Qwen3 ...) raises
a one-line ``GatedAttnError`` naming it, before anything is written; such models stay in
gatedattn's format (``gatedattn.hf.save_self_contained(model, dir)`` makes that loadable
with ``trust_remote_code=True`` where gatedattn is not installed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gatedattn.layers.config import GateConfig
from gatedattn.infra.errors import GatedAttnError
from gatedattn.hf.checkpoint import CONFIG_FILE, SINGLE_FILE
from gatedattn.hf.importers import hf_specs, quiet_transformers
from gatedattn.infra.integrity import atomic_model_dir, atomic_save_safetensors, record
from gatedattn.infra.io import atomic_write_json
from gatedattn.models.lm import GatedLM, ModelConfig

LAYOUTS = ("stock", "qwen3-next", "official")


# --------------------------------------------------------------------------- what each layout can express
def _gate_differences(gate: GateConfig, allowed_granularities: tuple[str, ...]) -> str | None:
    """Why ``gate`` is not the paper's G1 sigmoid gate from X (None when it is)."""
    want = GateConfig()
    for name in ("position", "activation", "combine", "source", "shared", "rank", "h_dim", "cross_head"):
        value = getattr(gate, name)
        if value != getattr(want, name):
            return f"GateConfig.{name}={value!r} (needs {getattr(want, name)!r}: a G1 sigmoid gate from X)"
    if gate.granularity not in allowed_granularities:
        return f"GateConfig.granularity={gate.granularity!r} (needs {' or '.join(map(repr, allowed_granularities))})"
    return None


def _common_differences(cfg: ModelConfig) -> str | None:
    a = cfg.attention
    if cfg.position_embedding != "none":
        return f"ModelConfig.position_embedding={cfg.position_embedding!r}: the targets have rotary positions only"
    if cfg.norm != "rms":
        return f"ModelConfig.norm={cfg.norm!r}: the targets use RMSNorm"
    if cfg.mlp != "swiglu":
        return f"ModelConfig.mlp={cfg.mlp!r}: the targets' MLP is SwiGLU"
    if a.sink:
        return "it has a learnable attention sink (AttentionConfig.sink=True)"
    if a.head_transform != "none":
        return f"AttentionConfig.head_transform={a.head_transform!r} has no equivalent"
    if a.kv != "gqa":
        return f"AttentionConfig.kv={a.kv!r}: only grouped-query attention exports"
    if a.rope.scaling == "ntk":
        return "RopeConfig.scaling='ntk' (static NTK) has no transformers rope_type"
    if a.qk_norm and a.norm_eps != cfg.norm_eps:
        return (f"AttentionConfig.norm_eps={a.norm_eps} differs from ModelConfig.norm_eps={cfg.norm_eps}; "
                f"the target uses one rms_norm_eps")
    return None


def _why_not_stock(cfg: ModelConfig) -> str | None:
    a = cfg.attention
    if a.gate is not None:
        return (f"it has a gate (variant {cfg.variant!r}), which stock Qwen3/Llama/Qwen2 do not have "
                f"(a 'gated' model exports as Qwen3-Next)")
    reason = _common_differences(cfg)
    if reason:
        return reason
    if a.rope.fraction != 1.0:
        return f"RopeConfig.fraction={a.rope.fraction}: stock Qwen3/Llama/Qwen2 rotate the whole head"
    if a.qk_norm and a.qkv_bias != a.o_bias:
        return (f"qkv_bias={a.qkv_bias} with o_bias={a.o_bias}: Qwen3's attention_bias sets all four "
                f"projections' biases together")
    if not a.qk_norm and a.o_bias and not a.qkv_bias:
        return "o_bias=True without qkv_bias: Llama's attention_bias sets all four projections' biases together"
    return None


def _why_not_qwen3_next(cfg: ModelConfig) -> str | None:
    a = cfg.attention
    if a.gate is None:
        return "it has no gate: every Qwen3-Next attention layer is gated (export gate-free models as stock)"
    reason = _gate_differences(a.gate, ("elementwise",)) or _common_differences(cfg)
    if reason:
        return reason
    if not a.qk_norm:
        return "AttentionConfig.qk_norm=False: Qwen3-Next always normalises q and k"
    if len({a.qkv_bias, a.o_bias, a.gate.bias}) > 1:
        return (f"qkv_bias={a.qkv_bias}, o_bias={a.o_bias}, gate bias={a.gate.bias}: Qwen3-Next's attention_bias "
                f"sets the q/gate, k, v and o biases together")
    return None


def _why_not_official(cfg: ModelConfig) -> str | None:
    a = cfg.attention
    if a.gate is None:
        return "it has no gate: the official layout is for gated models (export gate-free models as stock)"
    reason = _gate_differences(a.gate, ("elementwise", "headwise")) or _common_differences(cfg)
    if reason:
        return reason
    if a.rope.fraction != 1.0:
        return f"RopeConfig.fraction={a.rope.fraction}: the official (Qwen3) code rotates the whole head"
    if len({a.qkv_bias, a.o_bias, a.gate.bias}) > 1:
        return (f"qkv_bias={a.qkv_bias}, o_bias={a.o_bias}, gate bias={a.gate.bias}: the official code's qkv_bias "
                f"sets the q/gate, k, v and o biases together")
    return None


# --------------------------------------------------------------------------- configs
def _rope_parameters(cfg: ModelConfig, *, partial: bool = False) -> dict[str, Any]:
    r = cfg.attention.rope
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": r.theta}
    if r.scaling == "linear":
        params.update(rope_type="linear", factor=r.factor)
    elif r.scaling == "yarn" and r.factor > 1:
        params.update(rope_type="yarn", factor=r.factor, original_max_position_embeddings=r.original_max_len,
                      beta_fast=r.beta_fast, beta_slow=r.beta_slow, truncate=True)
    if partial:
        params["partial_rotary_factor"] = r.fraction
    return params


def _common_fields(cfg: ModelConfig, *, partial_rope: bool = False) -> dict[str, Any]:
    a = cfg.attention
    return dict(
        vocab_size=cfg.vocab_size, hidden_size=a.d_model, intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers, num_attention_heads=a.n_heads, num_key_value_heads=a.n_kv_heads,
        head_dim=a.head_dim, hidden_act="silu", max_position_embeddings=cfg.max_seq_len,
        initializer_range=cfg.init_std, rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters=_rope_parameters(cfg, partial=partial_rope), bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id, attention_dropout=0.0,
    )


def _stock_config(cfg: ModelConfig):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config  # lazy: heavy (transformers)

    a, common = cfg.attention, _common_fields(cfg)
    if a.qk_norm:
        return Qwen3Config(**common, attention_bias=a.qkv_bias, use_sliding_window=False), "Qwen3ForCausalLM"
    if a.qkv_bias and not a.o_bias:
        return Qwen2Config(**common, use_sliding_window=False), "Qwen2ForCausalLM"
    return LlamaConfig(**common, attention_bias=a.qkv_bias, mlp_bias=False), "LlamaForCausalLM"


def _qwen3_next_config(cfg: ModelConfig):
    from transformers import Qwen3NextConfig  # lazy: heavy (transformers)

    n = cfg.n_layers
    hf = Qwen3NextConfig(**_common_fields(cfg, partial_rope=True), attention_bias=cfg.attention.qkv_bias,
                         layer_types=["full_attention"] * n, mlp_only_layers=list(range(n)))
    return hf, "Qwen3NextForCausalLM"


def _official_config(cfg: ModelConfig):
    from transformers import Qwen3Config  # lazy: heavy (transformers)

    a = cfg.attention
    headwise = a.gate.granularity == "headwise"
    # the official code reads these four keys; attention_bias is unused there and kept equal to qkv_bias
    hf = Qwen3Config(**_common_fields(cfg), attention_bias=a.qkv_bias, use_sliding_window=False,
                     elementwise_attn_output_gate=not headwise, headwise_attn_output_gate=headwise,
                     qkv_bias=a.qkv_bias, use_qk_norm=a.qk_norm)
    return hf, "Qwen3ForCausalLM"


@dataclass(frozen=True)
class Layout:
    """One export target: what it cannot express, its config, its tensor layout."""

    name: str
    why_not: Callable[[ModelConfig], str | None]
    config: Callable[[ModelConfig], tuple[Any, str]]
    q_layout: str
    zero_centred_norms: bool = False


_LAYOUTS = {
    "stock": Layout("stock", _why_not_stock, _stock_config, "plain"),
    "qwen3-next": Layout("qwen3-next", _why_not_qwen3_next, _qwen3_next_config, "interleaved", True),
    "official": Layout("official", _why_not_official, _official_config, "grouped"),
}


def _layout(cfg: ModelConfig, layout: str | None) -> Layout:
    if layout is None:
        layout = "stock" if cfg.attention.gate is None else "qwen3-next"
    if layout not in _LAYOUTS:
        raise GatedAttnError(f"export layout {layout!r} is not allowed; choose one of {', '.join(LAYOUTS)}")
    return _LAYOUTS[layout]


def hf_config_for(cfg: ModelConfig, layout: str | None = None):
    """The transformers config equivalent to ``cfg`` in ``layout`` (default: ``stock``
    for a gate-free model, ``qwen3-next`` for a gated one); raises ``GatedAttnError``
    with the reason when the layout cannot express the model."""
    target = _layout(cfg, layout)
    reason = target.why_not(cfg)
    if reason is not None:
        raise GatedAttnError(f"cannot export to the {target.name} layout: {reason}; save it in gatedattn format "
                             f"instead: AutoModelForCausalLM loads that after `import gatedattn`, or anywhere with "
                             f"trust_remote_code=True once saved with gatedattn.hf.save_self_contained(model, dir) "
                             f"(convert --self-contained)")
    try:
        with quiet_transformers():
            hf, arch = target.config(cfg)
    except Exception as e:  # transformers' validation (e.g. hidden_size not divisible by heads)
        raise GatedAttnError(f"cannot export to the {target.name} layout: {type(e).__name__}: {e}") from None
    hf.architectures = [arch]
    return hf


def export_hf(model: GatedLM, directory: str | Path, layout: str | None = None) -> Path:
    """Write ``model`` as a transformers checkpoint (``config.json`` and
    ``model.safetensors``, HF tensor names) in ``layout`` (see ``LAYOUTS``; default
    ``stock`` for a gate-free model, ``qwen3-next`` for a gated one). The directory is
    written beside ``directory`` and renamed into place (other files already there are
    kept); a model the layout cannot express, or with weights a load would refuse (NaN,
    infinity), raises before anything is written."""
    cfg = model.cfg
    target = _layout(cfg, layout)
    hf = hf_config_for(cfg, target.name)
    ours = model.state_dict()
    hf.dtype = str(next(iter(ours.values())).dtype).removeprefix("torch.")
    tensors = {}
    for spec in hf_specs(cfg, target.q_layout, zero_centred_norms=target.zero_centred_norms):
        parts = [ours[t] for t in spec.targets]
        tensors[spec.hf_name] = (spec.join(*parts) if spec.join is not None else parts[0]).contiguous()
    directory = Path(directory)
    with atomic_model_dir(directory) as tmp:  # the old directory stays whole until the new one is complete
        atomic_save_safetensors(tmp / SINGLE_FILE, tensors, metadata={"format": "pt"})  # refuses NaN/inf
        record(atomic_write_json(tmp / CONFIG_FILE, json.loads(hf.to_json_string(use_diff=False))))
    return directory
