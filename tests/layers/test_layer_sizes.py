"""A layer whose sizes no machine holds is refused at its config or before its weights are
allocated, in one line naming the field, instead of an overflow or an allocator failure."""

import pytest
import torch

from gatedattn import VARIANTS, Attention
from gatedattn.infra.errors import ConfigError, GatedAttnError
from gatedattn.infra.sizes import MODEL_LIMITS, attention_params


@pytest.mark.parametrize("fields,field", [
    (dict(d_model=2**40, n_heads=8), "d_model"),
    (dict(d_model=64, n_heads=2**20), "n_heads"),
    (dict(d_model=64, n_heads=4, head_dim=2**20), "head_dim"),
])
def test_a_size_past_its_limit_is_refused_by_the_config_naming_it(fields, field):
    with pytest.raises(ConfigError, match=rf"^AttentionConfig\.{field}=\d+ is too large; allowed: 1 to "
                                          rf"{MODEL_LIMITS[field]:,}"):
        VARIANTS["gated"](**fields)


@pytest.mark.parametrize("fields", [dict(d_model=2**17, n_heads=8), dict(d_model=2**16, n_heads=256)])
def test_a_layer_larger_than_the_memory_is_refused_before_allocation(fields, monkeypatch):
    cfg = VARIANTS["gated"](**fields)  # within the limits: a config may describe it
    monkeypatch.setattr("gatedattn.infra.sizes.device_memory", lambda device="cpu": 8 << 30)
    with pytest.raises(GatedAttnError, match=r"^Attention: the layer \(d_model=\d+, .*\) needs at least [\d,.]+ GB "
                                             r"for its weights; this cpu has 8.0 GB available: a size is wrong$"):
        Attention(cfg)


def test_the_bound_is_what_the_layer_allocates_at_least():
    for cfg in (VARIANTS["baseline"](d_model=64, n_heads=4, n_kv_heads=2), VARIANTS["gated"](d_model=48, n_heads=6)):
        layer = Attention(cfg)
        assert attention_params(cfg) <= sum(p.numel() for p in layer.parameters())
        assert attention_params(cfg) >= sum(p.numel() for name, p in layer.named_parameters()
                                            if name.startswith(("qkv.", "o_proj.")) and p.dim() == 2)


def test_a_layer_on_the_meta_device_is_not_checked_against_memory(monkeypatch):
    monkeypatch.setattr("gatedattn.infra.sizes.device_memory", lambda device="cpu": 1)
    with torch.device("meta"):
        layer = Attention(VARIANTS["gated"](d_model=64, n_heads=4))
    assert layer.o_proj.weight.is_meta
