"""Single-layer equivalence: Qwen3-Next gated attention and GPT-OSS sink attention."""

import pytest
import torch
from transformers import GptOssConfig, Qwen3NextConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding

from gatedattn import GatedAttnError, KVCache
from gatedattn.hf import attention_from_gpt_oss, attention_from_qwen3_next

B, T, C = 2, 10, 64
SHAPE = dict(hidden_size=C, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=50)


def causal_mask(t: int) -> torch.Tensor:
    return torch.full((t, t), float("-inf")).triu(1)[None, None]  # additive, (1, 1, T, T)


def randomize(layer, scale=0.3):
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(scale * torch.randn_like(p))
    return layer.eval()


def hf_forward(layer, rotary, x):
    positions = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
    with torch.no_grad():
        return layer(x, rotary(x, positions), causal_mask(x.shape[1]))[0]


def check_incremental(ours, x):
    """Our layer with a KV cache, one token at a time, equals the full-sequence pass."""
    cache = KVCache()
    with torch.no_grad():
        steps = [ours(x[:, i:i + 1], cache=cache) for i in range(x.shape[1])]
        torch.testing.assert_close(torch.cat(steps, dim=1), ours(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fraction,bias", [(0.25, False), (0.5, True), (1.0, False)])
def test_qwen3_next_attention_layer_equivalence(fraction, bias):
    config = Qwen3NextConfig(**SHAPE, num_hidden_layers=1, attention_bias=bias, rms_norm_eps=1e-5,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "partial_rotary_factor": fraction})
    config._attn_implementation = "eager"
    layer = randomize(Qwen3NextAttention(config, 0))  # zero-centred norms get weights around 0, not 1
    ours = attention_from_qwen3_next(layer, config)
    assert ours.cfg.gate.granularity == "elementwise" and ours.cfg.qk_norm
    assert ours.rotary.rot_dim == int(16 * fraction)
    x = torch.randn(B, T, C)
    ref = hf_forward(layer, Qwen3NextRotaryEmbedding(config), x)
    with torch.no_grad():
        out = ours(x)
    assert ref.abs().max() > 1.0
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # the gate really is on: zeroing our gate projection changes the output
    with torch.no_grad():
        ours.gate.x.proj.weight.zero_()
        assert (ours(x) - ref).abs().max() > 1e-2
    check_incremental(attention_from_qwen3_next(layer, config), x)


def gpt_oss_config(**fields):
    fields = {"num_hidden_layers": 2, "layer_types": ["full_attention", "sliding_attention"],
              "num_local_experts": 2, "num_experts_per_tok": 1, "intermediate_size": 32,
              "rope_parameters": {"rope_type": "default", "rope_theta": 150000.0}, **fields}
    config = GptOssConfig(**SHAPE, **fields)
    config._attn_implementation = "eager"
    return config


@pytest.mark.parametrize("rope", [
    {"rope_type": "default", "rope_theta": 150000.0},
    {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
     "truncate": True, "original_max_position_embeddings": 4},
])
def test_gpt_oss_attention_layer_equivalence_with_sink(rope):
    config = gpt_oss_config(rope_parameters=rope, max_position_embeddings=64)
    layer = randomize(GptOssAttention(config, 0))
    with torch.no_grad():
        layer.sinks.copy_(torch.tensor([-1.0, 0.5, 2.0, 0.0]))  # nonzero, different per head
    ours = attention_from_gpt_oss(layer, config)
    assert ours.cfg.sink and ours.cfg.qkv_bias and ours.cfg.o_bias
    assert torch.equal(ours.sink, layer.sinks)
    x = torch.randn(B, T, C)
    ref = hf_forward(layer, GptOssRotaryEmbedding(config), x)
    with torch.no_grad():
        out = ours(x)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        ours.sink.zero_()  # the sink matters
        assert (ours(x) - ref).abs().max() > 1e-3
    check_incremental(attention_from_gpt_oss(layer, config), x)


def test_gpt_oss_sliding_and_untruncated_yarn_are_refused():
    config = gpt_oss_config()
    with pytest.raises(GatedAttnError, match=r"layer_types\[1\]='sliding_attention'"):
        attention_from_gpt_oss(GptOssAttention(config, 1), config)
    stock = GptOssConfig(**SHAPE, num_hidden_layers=2, layer_types=["full_attention"] * 2)  # default YaRN
    with pytest.raises(GatedAttnError, match="rope_parameters.truncate=False"):
        attention_from_gpt_oss(GptOssAttention(stock, 0), stock)


def test_qwen3_next_layer_with_wrong_q_proj_is_refused():
    config = Qwen3NextConfig(**SHAPE, num_hidden_layers=1)
    layer = Qwen3NextAttention(config, 0)
    layer.q_proj = torch.nn.Linear(C, 4 * 16, bias=False)  # no gate rows
    with pytest.raises(GatedAttnError, match="q_proj.weight has shape"):
        attention_from_qwen3_next(layer, config)
