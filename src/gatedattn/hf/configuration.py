"""``ModelConfig`` as a transformers config (``model_type: gatedattn``).

Used by the Auto classes (``gatedattn.hf.auto``) and written, with them, beside the
weights of a self-contained checkpoint (``gatedattn.hf.bundle``).
"""

from __future__ import annotations

import dataclasses

from transformers import PreTrainedConfig

from gatedattn.model import MODEL_TYPE, ModelConfig


class GatedAttnHFConfig(PreTrainedConfig):
    """``ModelConfig`` as a transformers config; ``attention`` is the AttentionConfig dict."""

    model_type = MODEL_TYPE
    attribute_map = {"num_hidden_layers": "n_layers"}

    vocab_size: int | None = None
    n_layers: int | None = None
    attention: dict | None = None
    ffn_dim: int | None = None
    variant: str = "custom"
    max_seq_len: int = 2048
    tie_embeddings: bool = True
    norm_eps: float = 1e-6
    init_std: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    @classmethod
    def from_model_config(cls, cfg: ModelConfig) -> "GatedAttnHFConfig":
        data = dataclasses.asdict(cfg)
        return cls(**data, architectures=["GatedLM"])

    def to_model_config(self) -> ModelConfig:
        names = [f.name for f in dataclasses.fields(ModelConfig)]
        return ModelConfig.from_dict({name: getattr(self, name) for name in names})
