"""models.casts.FrozenCasts: the model's own call under bf16 autocast to bf16 rounding
(bit-identical where no projections are stacked), casts made once and made again when a
weight changes, trained weights left alone, the model's own weights back after every call."""

import pytest
import torch

from gatedattn import GatedLM, ModelConfig
from gatedattn.models.casts import FrozenCasts


def _model(variant="gated", tie=True):
    torch.manual_seed(0)
    return GatedLM(ModelConfig.from_preset("micro", variant, vocab_size=61, tie_embeddings=tie)).eval()


def _close(a, b):
    """Equal to bf16 rounding: a stacked product may round its sums differently."""
    torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=0.05 * b.float().abs().max().item())


def test_the_models_own_call_under_autocast_and_without():
    for variant in ("baseline", "gated", "hyga-sink"):
        model = _model(variant)
        run = FrozenCasts(model)
        ids = torch.randint(0, 61, (2, 11))
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            _close(run(ids), model(ids))
            assert run.casts(torch.bfloat16)  # the casts were used
        with torch.no_grad():
            assert torch.equal(run(ids), model(ids))  # no autocast: the model itself
        assert model.embed.weight.dtype == torch.float32 and model.lm_head.weight is model.embed.weight


def test_casts_are_made_once_and_again_after_a_weight_changes():
    model = _model()
    run = FrozenCasts(model)
    ids = torch.randint(0, 61, (1, 7))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        first = run.casts(torch.bfloat16)
        assert run.casts(torch.bfloat16) is first
        with torch.no_grad():
            model.blocks[0].mlp.down_proj.weight.mul_(2)
        again = run.casts(torch.bfloat16)
        assert again is not first
        _close(run(ids), model(ids))


def test_weights_that_train_keep_their_dtype_and_get_gradients():
    model = _model().train()
    for p in model.parameters():
        p.requires_grad_(False)
    model.blocks[1].attn.o_proj.weight.requires_grad_(True)
    run = FrozenCasts(model)
    ids = torch.randint(0, 61, (2, 9))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        casts = run.casts(torch.bfloat16)
        assert "blocks.1.attn.o_proj.weight" not in casts and "blocks.0.attn.o_proj.weight" in casts
        loss = run(ids, targets=ids).float()
        ref = model(ids, targets=ids).float()
    _close(loss, ref)
    (g,) = torch.autograd.grad(loss, [model.blocks[1].attn.o_proj.weight])
    (g_ref,) = torch.autograd.grad(ref, [model.blocks[1].attn.o_proj.weight])
    assert g.dtype == torch.float32
    _close(g, g_ref)


def test_without_stacked_projections_the_outputs_are_bit_identical():
    model = GatedLM(ModelConfig.from_preset("micro", "baseline", vocab_size=61, mlp="relu")).eval()
    for block in model.blocks:  # one projection per group: nothing to stack
        block.attn.qkv.k_proj.register_forward_hook(lambda *a: None)
    ids = torch.randint(0, 61, (2, 11))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(FrozenCasts(model)(ids), model(ids))


def test_the_models_own_weights_are_back_after_a_call_and_after_an_error():
    model = _model()
    own = {n: p for n, p in model.named_parameters()}
    run = FrozenCasts(model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with run.applied() as inside:
            assert inside.blocks[0].mlp.down_proj.weight.dtype == torch.bfloat16
        with pytest.raises(RuntimeError, match="stop"):
            with run.applied():
                raise RuntimeError("stop")
        with pytest.raises(Exception):
            run(torch.full((1, 3), 10_000))  # out of the vocabulary: the call fails inside
    assert {n: p for n, p in model.named_parameters()} == own
    assert all(isinstance(p, torch.nn.Parameter) and p.dtype == torch.float32 for p in model.parameters())
    assert model.lm_head.weight is model.embed.weight
