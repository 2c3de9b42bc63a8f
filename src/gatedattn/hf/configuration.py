"""``ModelConfig`` as a transformers config (``model_type: gatedattn``).

Used by the Auto classes (``gatedattn.hf.auto``) and written, with them, beside the
weights of a self-contained checkpoint (``gatedattn.hf.bundle``). The class is generated
from ``ModelConfig``'s fields, so a field added there needs no edit here.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from typing import Any

from transformers import PreTrainedConfig

from gatedattn.models.lm import MODEL_TYPE, ModelConfig


class _ModelConfigBridge:
    """Conversion between ``ModelConfig`` and its transformers config."""

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
    plus ``pad_token_id``."""
    hints = typing.get_type_hints(ModelConfig)
    annotations: dict[str, Any] = {}
    ns: dict[str, Any] = {
        "__module__": __name__, "__qualname__": "GatedAttnHFConfig",
        "__doc__": "``ModelConfig`` as a transformers config; ``attention`` is the AttentionConfig dict.",
        "model_type": MODEL_TYPE,
        # transformers-wide names that tools (lm-eval: the context it truncates to) read
        "attribute_map": {"num_hidden_layers": "n_layers", "max_position_embeddings": "max_seq_len"},
        "__annotations__": annotations,
    }
    for f in dataclasses.fields(ModelConfig):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        typ = dict if f.name == "attention" else hints[f.name]
        annotations[f.name] = typ | None if required else typ
        ns[f.name] = None if required else f.default
    annotations["pad_token_id"] = int | None
    ns["pad_token_id"] = None
    return ns


GatedAttnHFConfig = type("GatedAttnHFConfig", (_ModelConfigBridge, PreTrainedConfig), _hf_config_namespace())


if __name__ == "gatedattn.hf.configuration":  # imported from the package (not as a self-contained copy):
    importlib.import_module("gatedattn.hf.auto")  # the Auto classes register themselves there
