"""The decoding hot path: one RoPE table per forward, no per-layer mask, the cache written
in place, the last position's logits only -- and the same tokens and logits as before."""

import collections

import pytest
import torch

from gatedattn import GatedAttnError
from gatedattn.layers.config import RopeConfig
from gatedattn.models.lm import GatedLM, ModelConfig
from op_counts import Ops


def micro(n_layers: int = 2, **fields) -> GatedLM:
    torch.manual_seed(0)
    return GatedLM(ModelConfig.from_preset("micro", vocab_size=50, **fields).replace(n_layers=n_layers)).eval()


def decode_step_ops(model: GatedLM) -> collections.Counter:
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    caches = model.new_cache(8)
    with torch.no_grad():
        model(ids[:, :5], caches=caches)
        ops = Ops()
        with ops:
            model(ids[:, 5:], caches=caches, logits_to_keep=1)
    return ops.count


def test_a_decoding_step_runs_a_bounded_number_of_ops_per_layer():
    two, four = decode_step_ops(micro(2)), decode_step_ops(micro(4))
    per_layer = (sum(four.values()) - sum(two.values())) / 2
    # a layer (qk-norm, GQA): 2 norms + 2 head norms (7 ops each: one norm reduction, four
    # ops on its (rows, 1) result, two products), 7 matmuls (t, mm, view, _unsafe_view), RoPE
    # on q and k (6 ops each), the cache (2 x 3 slice/copy), attention, SwiGLU, residual adds,
    # views and transposes: 97 ops (108 when each layer built its own RoPE table and causal
    # mask; 91 with F.rms_norm's 5-op norms, which cost twice as long on many rows)
    assert per_layer <= 97
    for count in (two, four):
        assert count["cos"] == count["sin"] == 1  # one RoPE table for every layer
        assert count["arange"] <= 1 and not {"le", "where", "scalar_tensor"} & set(count)  # no mask
    assert four["cat"] - two["cat"] == 2 * 2  # rotate-half of q and k only: the cache is written, not concatenated
    assert four["copy_"] - two["copy_"] == 2 * 2  # (this step's k and v, per layer)


def test_a_model_with_one_layer_on_another_rope_computes_two_tables():
    model = micro(3)
    with model.blocks[1].attn.with_rope(RopeConfig(scaling="ntk", factor=4.0)):
        count = decode_step_ops(model)
    assert count["cos"] == 2


@pytest.mark.parametrize("fields", [{}, {"attention_fields": {"sink": True}}, {"attention_fields": {"kv": "mla"}}])
def test_generate_gives_the_tokens_of_a_plain_decoding_loop(fields):
    model = micro(2, **fields)
    ids = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(1))
    out = model.generate(ids, 6, temperature=0)
    # the same decoding by hand: caches that concatenate, every position's logits
    caches, seq, step = model.new_cache(), ids, ids
    with torch.no_grad():
        for _ in range(6):
            nxt = model(step, caches=caches)[:, -1].float().argmax(-1)
            seq, step = torch.cat((seq, nxt[:, None]), dim=1), nxt[:, None]
        full = model(seq)
    assert torch.equal(out, seq)
    with torch.no_grad():
        last = model(seq, logits_to_keep=2)
    assert last.shape == (2, 2, 50)
    torch.testing.assert_close(last, full[:, -2:], rtol=0, atol=1e-6)


@pytest.mark.parametrize("bad", [-1, 1.0, True, None])
def test_a_bad_logits_to_keep_is_refused_naming_it(bad):
    with pytest.raises(GatedAttnError, match="logits_to_keep"):
        micro(1)(torch.zeros(1, 3, dtype=torch.long), logits_to_keep=bad)


def test_generate_under_cpu_bf16_autocast_reuses_its_cache():
    """Under autocast the cache holds bf16 keys and values while the residual stream is fp32:
    decoding must accept its own cache (the dtype check allows the autocast dtype)."""
    from gatedattn import GatedLM, ModelConfig
    from gatedattn.infra.errors import GatedAttnError

    torch.manual_seed(0)
    model = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=64)).eval()
    ids = torch.randint(0, 64, (1, 6))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.generate(ids, 4, temperature=0)
    assert out.shape == (1, 10)
    cache = model.new_cache()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids, caches=cache)
    with pytest.raises(GatedAttnError, match="filled with"):  # outside autocast the mismatch is refused
        model(ids[:, :1], torch.tensor([6]), caches=cache)
