"""Tiny random transformers models saved with ``save_pretrained``: the HF import tests' sources,
shared with the tests that start training from one (``tests/`` is on the path through its conftest)."""

import torch
from torch import nn

V = 100
COMMON = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, bos_token_id=None, eos_token_id=None)


def randomize(model: nn.Module, scale: float = 0.1) -> nn.Module:
    """Random weights everywhere, norms around one, so that every mapped tensor matters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(scale * torch.randn_like(p))
    return model.eval()


def make_hf(cls, config_cls, tmp_path, name="hf", **fields):
    config = config_cls(**{**COMMON, **fields})
    config._attn_implementation = "eager"
    model = randomize(cls(config))
    model.save_pretrained(tmp_path / name)
    return model, tmp_path / name
