"""The real-model bench's frozen step is the real-model study's: sinks from the start layer up."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gatedattn import ConfigError
from gatedattn.bench.real_model import STUDY_START_LAYER, _frozen_step, frozen_start_layer, sink_arm
from gatedattn.infra.precision import resolve_dtype
from gatedattn.models.lm import GatedLM, ModelConfig


class Attended(TorchDispatchMode):
    """Counts the attention kernels (forward, backward) and the matmuls run in the ``with``."""

    def __init__(self):
        super().__init__()
        self.kernels = self.backward = self.mm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.kernels += name == "_scaled_dot_product_flash_attention_for_cpu"
        self.backward += name == "_scaled_dot_product_flash_attention_for_cpu_backward"
        self.mm += name == "mm"
        return func(*args, **(kwargs or {}))


def test_the_frozen_step_trains_the_sinks_of_the_upper_layers_only():
    torch.manual_seed(0)
    base = GatedLM(ModelConfig.from_preset("micro", vocab_size=50).replace(n_layers=3))
    before = {k: v.clone() for k, v in base.state_dict().items()}
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    model, sinks = sink_arm(base, 1)
    step = _frozen_step(model, sinks, ids, 1, resolve_dtype("fp32", "cpu"))
    seen = Attended()
    with seen:
        step()
    # blocks 1 and 2 run forward and backward, block 0 ran once before the steps
    assert (seen.kernels, seen.backward) == (2, 2)
    # forward: 7 projections per block and the head; backward: input gradients only (no
    # weight-gradient matmul), and none into the no-gradient stream entering block 1
    # through its q, k and v projections; the frozen head fused with the loss takes its
    # logits and the input's gradient in forward (two products) and none in backward
    assert seen.mm == (7 * 2 + 2) + (7 * 2 - 3)
    assert len(sinks) == 2 and all(p.shape == (4,) for p in sinks)
    assert all(p is model.blocks[i + 1].attn.sink for i, p in enumerate(sinks))
    assert all(float(p.detach().abs().max()) > 0 for p in sinks)  # moved from 0
    assert float(model.blocks[0].attn.sink.min()) < -1 and not model.blocks[0].attn.sink.requires_grad
    assert all(torch.equal(v, before[k]) for k, v in base.state_dict().items())  # the base model untouched


class WeightCasts(TorchDispatchMode):
    """Counts the dtype casts of the given weights run in the ``with``."""

    def __init__(self, weights):
        super().__init__()
        self.ptrs = {w.data_ptr() for w in weights}
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ == "_to_copy" and args[0].data_ptr() in self.ptrs:
            self.casts += 1
        return func(*args, **(kwargs or {}))


def test_under_autocast_the_frozen_weights_are_cast_once_for_every_step():
    """In bf16 the frozen step casts the frozen weights on its first step only (and runs
    each layer's q/k/v and gate/up as one product each over the stacked casts); the
    study's train_arm does the same."""
    from gatedattn.reproduce.pretrained.arms import train_arm

    torch.manual_seed(0)
    base = GatedLM(ModelConfig.from_preset("micro", vocab_size=50).replace(n_layers=3))
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    model, sinks = sink_arm(base, 1)
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    step = _frozen_step(model, sinks, ids, 1, resolve_dtype("bf16", "cpu"))
    with WeightCasts(weights) as first:
        step()
    with WeightCasts(weights) as second, Attended() as seen:
        step()
    assert first.casts >= len(weights) - 1 and second.casts == 0  # (the layers' below run before the steps)
    assert seen.mm == (4 * 2 + 2) + (4 * 2 - 1)  # q/k/v and gate/up stacked: 4 products a block
    assert all(float(p.detach().abs().max()) > 0 for p in sinks)
    hidden, targets = torch.randn(4, 8, base.cfg.attention.d_model), torch.randint(0, 50, (4, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16), WeightCasts(weights) as arm:
        train_arm(model, [{"params": sinks, "lr": 1e-2}], hidden, targets, torch.arange(4), steps=3, batch=2,
                  start=1, window=0, first="keep")
    assert arm.casts == first.casts  # once for the three steps


def test_the_start_layer_is_the_studys_within_the_depth():
    assert frozen_start_layer(30, None) == STUDY_START_LAYER == 3
    assert frozen_start_layer(2, None) == 1 and frozen_start_layer(30, 0) == 0
    for bad in (-1, 30, 1.5, True):
        with pytest.raises(ConfigError, match="frozen_start"):
            frozen_start_layer(30, bad)


def test_both_training_losses_score_the_same_positions_on_the_same_weights(tmp_path):
    from hf_models import make_hf
    from transformers import LlamaConfig, LlamaForCausalLM

    from gatedattn.bench.real_model import _our_loss, _their_loss
    from gatedattn.hf import load_model

    theirs, path = make_hf(LlamaForCausalLM, LlamaConfig, tmp_path, tie_word_embeddings=True)
    ours = load_model(path)
    ids = torch.randint(0, 100, (2, 17), generator=torch.Generator().manual_seed(0))
    a, b = _our_loss(ours, ids), _their_loss(theirs, ids)
    assert a.item() > 1.0  # a real loss, not a degenerate comparison
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
