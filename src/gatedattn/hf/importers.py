"""From a transformers ``config.json`` to a ``ModelConfig``, and its tensors to ours.

The part of import (and export) that both readers of a checkpoint use, directory and GGUF
file alike, beneath both (``gatedattn.hf.load`` for directories, ``gatedattn.hf.gguf``
for GGUF files, ``gatedattn.hf.export`` for the way back):

* ``IMPORTERS`` -- one ``Importer`` per ``model_type``, each with a ``plan``: the
  ``ModelConfig`` a config dict maps to, every field that changes the computation mapped
  or refused naming it (``importer_for``, ``plan_for``);
* ``hf_specs`` -- where each of our tensors lies in a transformers checkpoint
  (``Spec(split, join)``: one spec serves import and export), read by ``read_hf_state``;
* ``rope_from_hf``, ``hf_config_object`` and ``quiet_transformers``, shared with export
  and the transformers layer wrappers.
"""

from __future__ import annotations

import contextlib
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from gatedattn.layers.config import AttentionConfig, GateConfig, RopeConfig
from gatedattn.infra.errors import GatedAttnError
from gatedattn.hf.checkpoint import DictTensorSource, TensorSource
from gatedattn.hf.layouts import join_grouped, join_interleaved, split_grouped, split_interleaved
from gatedattn.models.lm import MODEL_TYPE, GatedLM, ModelConfig

# model types that look importable but are not (with the reason and what to do instead)
NOT_SUPPORTED = {
    "gpt_oss": "GPT-OSS has MoE MLPs and sliding-window layers, which GatedLM does not have; convert single "
               "attention layers with gatedattn.hf.attention_from_gpt_oss",
}

OFFICIAL_GATE_KEYS = ("elementwise_attn_output_gate", "headwise_attn_output_gate", "use_qk_norm", "qkv_bias")
_IGNORABLE = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


# --------------------------------------------------------------------------- config mapping
@dataclass(frozen=True)
class Plan:
    """What an importer decided: the model config, how ``q_proj`` is laid out
    (``plain``; ``grouped`` for the official gate layout; ``interleaved`` for Qwen3-Next)
    and whether RMSNorm weights are stored zero-centred (Qwen3-Next)."""

    cfg: ModelConfig
    q_layout: str = "plain"
    zero_centred_norms: bool = False


def _refuse(source: str, field: str, value: Any, why: str) -> GatedAttnError:
    return GatedAttnError(f"{source}: {field}={value!r} is not supported: {why}")


def hf_config_object(raw: dict[str, Any], source: str):
    """The transformers config object for ``raw`` (so defaults match transformers exactly)."""
    from transformers import CONFIG_MAPPING  # lazy: heavy (transformers)

    model_type = raw.get("model_type")
    try:
        cls = CONFIG_MAPPING[model_type]
    except KeyError:
        raise GatedAttnError(f"{source}: model_type={model_type!r} is unknown to transformers") from None
    try:
        with quiet_transformers():
            return cls.from_dict(dict(raw))
    except Exception as e:  # transformers' own validation: name the problem, one line
        raise GatedAttnError(f"{source}: invalid {model_type} config ({type(e).__name__}: {e})") from None


@contextlib.contextmanager
def quiet_transformers():
    """transformers' and torch's warnings, and transformers' progress bars, off while a
    config is parsed or a model read: a refusal is one line, and what matters is in it."""
    from transformers.utils import logging as hf_logging  # lazy: heavy (transformers)

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _number(source: str, field: str, value: Any) -> float:
    """``value`` as a finite positive number, or an error naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _refuse(source, field, value, "it must be a finite number > 0")
    return float(value)


def rope_from_hf(hf, head_dim: int, source: str, *, allow_partial: bool) -> RopeConfig:
    """``RopeConfig`` for a transformers config's ``rope_parameters``; refuses what
    ``gatedattn.layers.rope`` does not compute identically."""
    params = getattr(hf, "rope_parameters", None)
    if not isinstance(params, dict) or "rope_theta" not in params:
        raise _refuse(source, "rope_parameters", params, "expected one dict with rope_theta (per-layer-type RoPE is not supported)")
    theta = _number(source, "rope_parameters.rope_theta", params["rope_theta"])
    fraction = _number(source, "partial_rotary_factor",
                       params.get("partial_rotary_factor") or getattr(hf, "partial_rotary_factor", None) or 1.0)
    if fraction != 1.0 and not allow_partial:
        raise _refuse(source, "partial_rotary_factor", fraction,
                      "this architecture's transformers code rotates the whole head")
    rope_type = params.get("rope_type", params.get("type", "default"))
    max_len = int(getattr(hf, "max_position_embeddings", 2048) or 2048)
    if rope_type == "default":
        return RopeConfig(theta=theta, fraction=fraction, original_max_len=max_len)
    if rope_type == "linear":
        return RopeConfig(theta=theta, fraction=fraction, scaling="linear", factor=float(params["factor"]),
                          original_max_len=max_len)
    if rope_type == "yarn":
        return _yarn_from_hf(params, theta, fraction, max_len, source)
    raise _refuse(source, "rope_parameters.rope_type", rope_type,
                  "gatedattn implements default, linear and yarn RoPE (llama3, dynamic, longrope are not implemented)")


def _yarn_from_hf(params: dict, theta: float, fraction: float, max_len: int, source: str) -> RopeConfig:
    """``RopeConfig`` of a YaRN ``rope_parameters``; refuses the variants gatedattn does not compute."""
    factor = params.get("factor")
    original = int(params.get("original_max_position_embeddings") or max_len)
    factor = float(factor) if factor is not None else max_len / original
    if factor < 1.0:
        raise _refuse(source, "rope_parameters.factor", factor, "YaRN needs factor >= 1")
    for key in ("mscale", "mscale_all_dim"):
        if params.get(key):
            raise _refuse(source, f"rope_parameters.{key}", params[key], "YaRN mscale variants are not implemented")
    attention_factor = params.get("attention_factor")
    default_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    if attention_factor is not None and abs(float(attention_factor) - default_factor) > 1e-12:
        raise _refuse(source, "rope_parameters.attention_factor", attention_factor,
                      f"gatedattn's YaRN uses 0.1 ln(factor) + 1 = {default_factor:g}")
    if params.get("truncate", True) is False:
        raise _refuse(source, "rope_parameters.truncate", False,
                      "gatedattn's YaRN rounds the correction range (truncate=True)")
    return RopeConfig(theta=theta, fraction=fraction, scaling="yarn", factor=factor,
                      original_max_len=original, beta_fast=float(params.get("beta_fast") or 32.0),
                      beta_slow=float(params.get("beta_slow") or 1.0))


def _check_common(hf, source: str) -> None:
    act = getattr(hf, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise _refuse(source, "hidden_act", act, "GatedLM's MLP is SwiGLU with SiLU")
    layer_types = getattr(hf, "layer_types", None) or []
    other = [t for t in layer_types if t != "full_attention"]
    if other:
        raise _refuse(source, "layer_types", other[0],
                      "only full causal attention is implemented (sliding-window layers compute something else "
                      "once a sequence is longer than the window)")
    quant = getattr(hf, "quantization_config", None)
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else type(quant).__name__
        raise _refuse(source, "quantization_config", method, "quantized weights are not supported")


def _head_dim(hf) -> int:
    head_dim = getattr(hf, "head_dim", None)
    return int(head_dim) if head_dim else hf.hidden_size // hf.num_attention_heads


def _eos(hf) -> int | None:
    eos = getattr(hf, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return eos


def _model_config(hf, attention: AttentionConfig, variant: str) -> ModelConfig:
    return ModelConfig(
        vocab_size=hf.vocab_size, n_layers=hf.num_hidden_layers, attention=attention,
        ffn_dim=hf.intermediate_size, variant=variant,
        max_seq_len=int(getattr(hf, "max_position_embeddings", 2048) or 2048),
        tie_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        norm_eps=float(hf.rms_norm_eps), init_std=float(getattr(hf, "initializer_range", 0.02)),
        bos_token_id=getattr(hf, "bos_token_id", None), eos_token_id=_eos(hf),
    )


def _attention(hf, source: str, **fields: Any) -> AttentionConfig:
    head_dim = _head_dim(hf)
    return AttentionConfig(
        d_model=hf.hidden_size, n_heads=hf.num_attention_heads,
        n_kv_heads=hf.num_key_value_heads or hf.num_attention_heads, head_dim=head_dim,
        rope=rope_from_hf(hf, head_dim, source, allow_partial=False), norm_eps=float(hf.rms_norm_eps), **fields,
    )


def _plan_qwen3(raw: dict[str, Any], source: str) -> Plan:
    hf = hf_config_object(raw, source)
    _check_common(hf, source)
    official = any(key in raw for key in OFFICIAL_GATE_KEYS)
    if not official:
        bias = bool(hf.attention_bias)
        attn = _attention(hf, source, qk_norm=True, qkv_bias=bias, o_bias=bias)
        return Plan(_model_config(hf, attn, "baseline"), "plain")
    # the official gated-attention code (github.com/qiuzh20/gated_attention, modeling_qwen3.py):
    # biases follow qkv_bias (q, k, v and o), q/k norms follow use_qk_norm; attention_bias is unused
    elementwise = bool(raw.get("elementwise_attn_output_gate", False))
    headwise = bool(raw.get("headwise_attn_output_gate", False))
    if elementwise and headwise:
        raise _refuse(source, "elementwise_attn_output_gate", True,
                      "headwise_attn_output_gate is also true; a checkpoint has one gate")
    bias = bool(raw.get("qkv_bias", False))
    if bool(raw.get("attention_bias", False)) != bias:
        raise _refuse(source, "attention_bias", raw.get("attention_bias"),
                      f"the official gated-attention code ignores it and uses qkv_bias={bias}; "
                      f"make the two agree")
    gate = None
    if elementwise or headwise:
        gate = GateConfig(granularity="headwise" if headwise else "elementwise", bias=bias)
    attn = _attention(hf, source, qk_norm=bool(raw.get("use_qk_norm", True)), qkv_bias=bias, o_bias=bias,
                      gate=gate)
    variant = "gated-headwise" if headwise else "gated" if elementwise else "baseline"
    return Plan(_model_config(hf, attn, variant), "grouped" if gate else "plain")


def _plan_qwen3_next(raw: dict[str, Any], source: str) -> Plan:
    """A Qwen3-Next directory whose every layer is gated full attention with a dense MLP
    (what ``export_hf`` writes for a ``gated`` model); hybrid linear-attention or MoE
    models are refused naming the first such layer."""
    hf = hf_config_object(raw, source)
    n = hf.num_hidden_layers
    how = ("GatedLM has only softmax attention; convert single attention layers with "
           "gatedattn.hf.attention_from_qwen3_next")
    for i, kind in enumerate(list(hf.layer_types or [])[:n]):
        if kind != "full_attention":
            raise _refuse(source, f"layer_types[{i}]", kind, f"layer {i} is not full attention; {how}")
    dense = set(hf.mlp_only_layers or [])
    for i in range(n):
        if i not in dense and hf.num_experts > 0 and (i + 1) % hf.decoder_sparse_step == 0:
            raise _refuse(source, "mlp_only_layers", sorted(dense),
                          f"layer {i} has a MoE MLP (num_experts={hf.num_experts}), GatedLM's MLP is dense; {how}")
    _check_common(hf, source)
    bias = bool(hf.attention_bias)
    head_dim = _head_dim(hf)
    attn = AttentionConfig(
        d_model=hf.hidden_size, n_heads=hf.num_attention_heads, n_kv_heads=hf.num_key_value_heads,
        head_dim=head_dim, rope=rope_from_hf(hf, head_dim, source, allow_partial=True), qk_norm=True,
        qkv_bias=bias, o_bias=bias, norm_eps=float(hf.rms_norm_eps), gate=GateConfig(bias=bias),
    )
    return Plan(_model_config(hf, attn, "gated"), "interleaved", zero_centred_norms=True)


def _plan_llama(raw: dict[str, Any], source: str) -> Plan:
    hf = hf_config_object(raw, source)
    _check_common(hf, source)
    if getattr(hf, "mlp_bias", False):
        raise _refuse(source, "mlp_bias", True, "GatedLM's MLP has no biases")
    bias = bool(getattr(hf, "attention_bias", False))
    attn = _attention(hf, source, qk_norm=False, qkv_bias=bias, o_bias=bias)
    return Plan(_model_config(hf, attn, "baseline"), "plain")


def _plan_qwen2(raw: dict[str, Any], source: str) -> Plan:
    hf = hf_config_object(raw, source)
    _check_common(hf, source)
    attn = _attention(hf, source, qk_norm=False, qkv_bias=True, o_bias=False)
    return Plan(_model_config(hf, attn, "baseline"), "plain")


@dataclass(frozen=True)
class Importer:
    """How to import one ``model_type``: accepted ``architectures`` and a ``plan``
    (config -> ``Plan``); ``plan=None`` marks gatedattn's own format."""

    architectures: tuple[str, ...]
    plan: Callable[[dict[str, Any], str], Plan] | None


IMPORTERS: dict[str, Importer] = {
    MODEL_TYPE: Importer(("GatedLM",), None),
    "qwen3": Importer(("Qwen3ForCausalLM",), _plan_qwen3),
    "llama": Importer(("LlamaForCausalLM",), _plan_llama),
    "qwen2": Importer(("Qwen2ForCausalLM",), _plan_qwen2),
    "qwen3_next": Importer(("Qwen3NextForCausalLM",), _plan_qwen3_next),
}


def plan_for(directory: Path, raw: dict[str, Any]) -> tuple[Importer, str]:
    source = str(directory / "config.json")
    return importer_for(raw, source), source


def importer_for(raw: dict[str, Any], source: str) -> Importer:
    """The importer of a HF config dict (a ``config.json``'s, or the one transformers builds
    from a GGUF file), refusing unknown model types and architectures; ``source`` names it."""
    model_type = raw.get("model_type")
    if model_type in NOT_SUPPORTED:
        raise GatedAttnError(f"{source}: model_type={model_type!r} is not supported as a whole model: "
                             f"{NOT_SUPPORTED[model_type]}")
    importer = IMPORTERS.get(model_type)
    if importer is None:
        raise GatedAttnError(f"{source}: model_type={model_type!r} is not supported; supported: "
                             f"{', '.join(repr(k) for k in IMPORTERS)}")
    archs = raw.get("architectures") or []
    if archs and not any(a in importer.architectures for a in archs):
        raise GatedAttnError(f"{source}: architectures={archs!r} is not supported for model_type={model_type!r}; "
                             f"supported: {', '.join(importer.architectures)}")
    return importer


# --------------------------------------------------------------------------- weights
@dataclass(frozen=True)
class Spec:
    """One checkpoint tensor: its name, the GatedLM tensors it becomes, and for a tensor
    stored differently from ours the two conversions: ``split`` (checkpoint tensor ->
    our tensors, for import) and ``join`` (our tensors -> checkpoint tensor, for export)."""

    hf_name: str
    targets: tuple[str, ...]
    split: Callable[[torch.Tensor], tuple[torch.Tensor, ...]] | None = None
    join: Callable[..., torch.Tensor] | None = None


Q_LAYOUTS = ("plain", "grouped", "interleaved")


def hf_specs(cfg: ModelConfig, q_layout: str = "plain", *, zero_centred_norms: bool = False) -> list[Spec]:
    """The HF (Llama/Qwen naming) tensors of a model with config ``cfg``.

    ``q_layout`` says how ``q_proj`` holds the X-gate: ``plain`` (no gate), ``grouped``
    (official gated-attention layout) or ``interleaved`` (Qwen3-Next), see
    ``gatedattn.hf.layouts``. ``zero_centred_norms``: the checkpoint's RMSNorm weights
    are stored as ``w - 1`` (Qwen3-Next computes ``x_hat * (1 + w)``)."""
    if q_layout not in Q_LAYOUTS:
        raise ValueError(f"unknown q layout {q_layout!r}; choose one of {', '.join(Q_LAYOUTS)}")
    a = cfg.attention

    def norm(hf_name: str, target: str) -> Spec:
        if zero_centred_norms:
            return Spec(hf_name, (target,), split=lambda t: (t + 1.0,), join=lambda w: w - 1.0)
        return Spec(hf_name, (target,))

    specs = [Spec("model.embed_tokens.weight", ("embed.weight",)), norm("model.norm.weight", "norm.weight")]
    if not cfg.tie_embeddings:
        specs.append(Spec("lm_head.weight", ("lm_head.weight",)))
    for i in range(cfg.n_layers):
        h, o = f"model.layers.{i}.", f"blocks.{i}."
        specs += [norm(h + "input_layernorm.weight", o + "attn_norm.weight"),
                  norm(h + "post_attention_layernorm.weight", o + "mlp_norm.weight")]
        if a.qk_norm:
            specs += [norm(h + "self_attn.q_norm.weight", o + "attn.q_norm.weight"),
                      norm(h + "self_attn.k_norm.weight", o + "attn.k_norm.weight")]
        pairs = [("self_attn.o_proj.weight", "attn.o_proj.weight")]
        pairs += [(f"mlp.{p}.weight", f"mlp.{p}.weight") for p in ("gate_proj", "up_proj", "down_proj")]
        kinds = ("weight", "bias") if a.qkv_bias else ("weight",)
        for kind in kinds:
            pairs += [(f"self_attn.{p}.{kind}", f"attn.qkv.{p}.{kind}") for p in ("k_proj", "v_proj")]
        if a.o_bias:
            pairs.append(("self_attn.o_proj.bias", "attn.o_proj.bias"))
        specs += [Spec(h + src, (o + dst,)) for src, dst in pairs]
        for kind in kinds:
            q_name, q_target = h + f"self_attn.q_proj.{kind}", o + f"attn.qkv.q_proj.{kind}"
            if q_layout == "plain":
                specs.append(Spec(q_name, (q_target,)))
            else:
                split, join = _q_packing(a, q_layout)
                specs.append(Spec(q_name, (q_target, o + f"attn.gate.x.proj.{kind}"), split, join))
    return specs


def _q_packing(a: AttentionConfig, q_layout: str):
    """(split, join) of a ``q_proj`` that packs the X-gate in ``q_layout``."""
    H, Hkv, d = a.n_heads, a.n_kv_heads, a.head_dim
    width = 1 if a.gate.granularity == "headwise" else d
    # the layout functions are looked up at call time: tests swap in the wrong layout and watch the logits change
    if q_layout == "grouped":
        return (lambda t: split_grouped(t, H, Hkv, d, width)), (lambda q, g: join_grouped(q, g, H, Hkv, d, width))
    return (lambda t: split_interleaved(t, H, d, width)), (lambda q, g: join_interleaved(q, g, H, d, width))


def read_hf_state(directory: Path, plan: "Plan", expected: dict[str, torch.Tensor],
                  source: TensorSource | DictTensorSource | None = None) -> dict[str, torch.Tensor]:
    """GatedLM state dict from the HF-named tensors in ``directory`` (or in ``source``, e.g.
    a GGUF file's, which ``directory`` then names); strict both ways."""
    source = TensorSource(directory) if source is None else source
    cfg = plan.cfg
    state: dict[str, torch.Tensor] = {}
    for spec in hf_specs(cfg, plan.q_layout, zero_centred_norms=plan.zero_centred_norms):
        if spec.hf_name not in source.names:
            raise GatedAttnError(f"{directory}: tensor {spec.hf_name!r} is missing")
        shapes = [tuple(expected[t].shape) for t in spec.targets]
        want = (sum(s[0] for s in shapes), *shapes[0][1:])
        tensor = source.get(spec.hf_name)
        if tuple(tensor.shape) != want:
            raise GatedAttnError(f"{directory}: tensor {spec.hf_name!r} has shape {tuple(tensor.shape)}, "
                                 f"the config needs {want}")
        parts = spec.split(tensor) if spec.split is not None else (tensor,)
        state.update(zip(spec.targets, parts))
    ignorable = {"lm_head.weight"} if cfg.tie_embeddings else set()  # transformers ties it to the embedding too
    unexpected = [n for n in source.untaken() if n not in ignorable and not _IGNORABLE.search(n)]
    if unexpected:
        raise GatedAttnError(f"{directory}: unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected in "
                             f"all); the config does not account for it")
    return state


# the files of a model directory its manifest must list when it has one (weights are hashed as they are read);
# a tokenizer.json is checked when listed (one added by hand later is not)
