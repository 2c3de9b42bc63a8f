"""``ModelConfig`` as a transformers config (``model_type: gatedattn``).

Used by the Auto classes (``gatedattn.hf.auto``) and written, with them, beside the
weights of a self-contained checkpoint (``gatedattn.hf.bundle``). The class is generated
from ``ModelConfig``'s fields, so a field added there needs no edit here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers import PreTrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from gatedattn.infra.errors import ConfigError
from gatedattn.infra.fields import field_types
from gatedattn.layers.config import AttentionConfig
from gatedattn.models.lm import MODEL_TYPE, ModelConfig
from gatedattn.models.standard import HIDDEN_ACTS, check_standard_keys, split_standard_keys

# transformers' name -> ModelConfig field
STANDARD_ALIASES = {
    "num_hidden_layers": "n_layers", "intermediate_size": "ffn_dim", "max_position_embeddings": "max_seq_len",
    "tie_word_embeddings": "tie_embeddings", "rms_norm_eps": "norm_eps",
}
# transformers' name -> path of the value inside the ``attention`` dict
ATTENTION_NAMES = {
    "hidden_size": ("d_model",), "num_attention_heads": ("n_heads",), "num_key_value_heads": ("n_kv_heads",),
    "head_dim": ("head_dim",), "rope_theta": ("rope", "theta"),
}
# setting one of these re-derives a head_dim that followed them
_HEAD_SHAPE = ("d_model", "n_heads")


def _attention_property(name: str, path: tuple[str, ...]) -> property:
    """``config.<name>`` read from, and written into, ``config.attention`` at ``path``."""

    def get(self):
        value = self.attention
        for key in path:
            value = value[key] if isinstance(value, dict) else None
        return value

    def set_(self, value):
        if not isinstance(self.attention, dict):
            raise ConfigError(f"GatedAttnHFConfig.{name} is attention.{'.'.join(path)}; the config has no attention dict")
        changed = {**self.attention}
        inner = changed
        for key in path[:-1]:
            inner[key] = dict(inner[key])
            inner = inner[key]
        inner[path[-1]] = value
        if path[-1] in _HEAD_SHAPE and _follows_shape(self.attention):
            changed["head_dim"] = None  # derived again from the new shape, as a Llama config derives it
        try:
            checked = AttentionConfig.from_dict(changed)
        except ConfigError as e:
            raise ConfigError(f"GatedAttnHFConfig.{name}={value!r} (attention.{'.'.join(path)}): {e}") from None
        self.attention = dataclasses.asdict(checked)

    return property(get, set_, doc=f"transformers' name for attention.{'.'.join(path)}")


def _follows_shape(attention: dict) -> bool:
    """Whether ``head_dim`` is the one ``d_model / n_heads`` gives (not set apart from them)."""
    head_dim, d_model, n_heads = (attention.get(k) for k in ("head_dim", "d_model", "n_heads"))
    return head_dim is None or (isinstance(d_model, int) and isinstance(n_heads, int) and n_heads > 0
                                and head_dim * n_heads == d_model)


def _hidden_act_property() -> property:
    """``config.hidden_act``: transformers' name of the MLP's activation (``mlp``)."""
    mlps = {act: mlp for mlp, act in HIDDEN_ACTS.items()}

    def get(self):
        return HIDDEN_ACTS.get(self.mlp)

    def set_(self, value):
        if value not in mlps:
            raise ConfigError(f"GatedAttnHFConfig.hidden_act={value!r}: choose one of {', '.join(mlps)} "
                              f"(the MLP {', '.join(mlps.values())})")
        self.mlp = mlps[value]

    return property(get, set_, doc="transformers' name of the MLP's activation (mlp)")


class _ModelConfigBridge:
    """Conversion between ``ModelConfig`` and its transformers config."""

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> "GatedAttnHFConfig":
        """transformers' ``from_dict``, with a ``head_dim`` keyword applied after ``hidden_size``
        and ``num_attention_heads``, so that it is kept, not derived again from them."""
        if "head_dim" in kwargs:
            kwargs = {**{k: v for k, v in kwargs.items() if k != "head_dim"}, "head_dim": kwargs["head_dim"]}
        return super().from_dict(config_dict, **kwargs)

    def __post_init__(self, **kwargs):
        """The standard keys of a ``config.json`` (``models.standard``) are checked against the
        model's own fields, which they mirror, not set over them: a file where the two disagree
        is refused, naming the key."""
        rest, standard = split_standard_keys(kwargs)
        super().__post_init__(**rest)
        if standard and self.attention is None:
            raise ConfigError(f"GatedAttnHFConfig: {next(iter(standard))} given without the attention dict "
                              f"it mirrors")
        if self.attention is not None and (standard or self.pad_token_id is not None):
            check_standard_keys({**standard, "pad_token_id": self.pad_token_id}, self.to_model_config(),
                                "GatedAttnHFConfig")

    @classmethod
    def from_model_config(cls, cfg: ModelConfig) -> "GatedAttnHFConfig":
        data = dataclasses.asdict(cfg)
        return cls(**data, architectures=["GatedLM"])

    def to_model_config(self) -> ModelConfig:
        names = [f.name for f in dataclasses.fields(ModelConfig)]
        return ModelConfig.from_dict({name: getattr(self, name) for name in names})


def _hf_config_namespace() -> dict[str, Any]:
    """Class body of ``GatedAttnHFConfig``: one field per ``ModelConfig`` field (same name
    and default; ``attention`` as its dict; fields without a default default to None),
    plus ``pad_token_id``, ``use_cache`` and transformers' standard names."""
    hints = field_types(ModelConfig)
    annotations: dict[str, Any] = {}
    ns: dict[str, Any] = {
        "__module__": __name__, "__qualname__": "GatedAttnHFConfig",
        "__doc__": "``ModelConfig`` as a transformers config; ``attention`` is the AttentionConfig dict.",
        "model_type": MODEL_TYPE,
        # transformers-wide names that tools (lm-eval: the context it truncates to) read
        "attribute_map": dict(STANDARD_ALIASES),
        "__annotations__": annotations,
        **{name: _attention_property(name, path) for name, path in ATTENTION_NAMES.items()},
        "hidden_act": _hidden_act_property(),
    }
    for f in dataclasses.fields(ModelConfig):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        typ = dict if f.name == "attention" else hints[f.name]
        annotations[f.name] = typ | None if required else typ
        ns[f.name] = None if required else f.default
    annotations["pad_token_id"] = int | None
    ns["pad_token_id"] = None
    annotations["use_cache"] = bool
    ns["use_cache"] = True
    return ns


GatedAttnHFConfig = type("GatedAttnHFConfig", (_ModelConfigBridge, PreTrainedConfig), _hf_config_namespace())

# the model type is a causal LM (what tools such as lm-eval read to pick their causal-LM path),
# also where this module is a self-contained copy that nothing registers with the Auto classes
MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault(MODEL_TYPE, "GatedAttnForCausalLM")
