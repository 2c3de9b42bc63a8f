"""Activation checkpointing (``TrainConfig.activation_checkpointing``, ``GatedLM.set_activation_checkpointing``):
the same gradients and losses as without, eager and compiled."""

import pytest
import torch

from gatedattn import GatedLM, ModelConfig
from gatedattn.data import TokenData
from gatedattn.infra.errors import ConfigError, GatedAttnError
from gatedattn.models.lm import Block
from gatedattn.infra.settings import apply_sets
from gatedattn.train.trainer import Trainer
from test_train import data_dir, make_cfg  # noqa: F401  (the module's corpus fixture)

V = 50


@pytest.mark.parametrize("variant", ["gated", "hyga-sink", "g2-value"])
@pytest.mark.parametrize("every", [1, 2])
def test_same_gradients_with_and_without(monkeypatch, variant, every):
    cfg = ModelConfig.from_preset("micro", variant, vocab_size=V, attention_fields={"d_model": 32})
    model = GatedLM(cfg.replace(n_layers=3))
    ids = torch.randint(0, V, (2, 9))
    mask = torch.tensor([[0, 0] + [1] * 7, [1] * 9])

    def grads():
        model.zero_grad()
        model(ids, attention_mask=mask).float().square().mean().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = grads()
    runs = []
    forward = Block.forward
    index = {id(b): i for i, b in enumerate(model.blocks)}
    monkeypatch.setattr(Block, "forward", lambda self, *a, **k: runs.append(index[id(self)]) or forward(self, *a, **k))
    model.set_activation_checkpointing(every)
    checkpointed = grads()
    recomputed = [i for i in range(3) if i % every == 0]
    assert sorted(runs) == sorted([0, 1, 2] + recomputed)  # the checkpointed blocks ran again in backward
    for name, g in plain.items():
        assert torch.allclose(g, checkpointed[name], atol=1e-6), name
    runs.clear()
    with torch.no_grad():
        model(ids)
    model.eval()
    model(ids).sum().backward()
    assert runs == [0, 1, 2, 0, 1, 2]  # no recomputation without gradients or in eval mode


def test_bad_values_are_refused(data_dir, tmp_path):  # noqa: F811
    model = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=V))
    for bad in (-1, 1.5, True):
        with pytest.raises(GatedAttnError, match="must be an int >= 0"):
            model.set_activation_checkpointing(bad)
    with pytest.raises(ConfigError, match="activation_checkpointing=-2 must be >= 0"):
        make_cfg(data_dir, tmp_path, activation_checkpointing=-2)


def _losses(data_dir, tmp_path, steps=2, **kw):  # noqa: F811
    cfg = make_cfg(data_dir, tmp_path, steps=steps, **kw)
    trainer = Trainer(cfg, TokenData(cfg.data_dir))
    losses = [trainer.train_step().loss for _ in range(steps)]
    return losses, trainer.model


def test_trainer_option_gives_the_same_losses(data_dir, tmp_path):  # noqa: F811
    plain, _ = _losses(data_dir, tmp_path / "plain")
    every, model = _losses(data_dir, tmp_path / "every", activation_checkpointing=1)
    assert model.checkpoint_every == 1
    assert every == pytest.approx(plain, abs=1e-6)
    assert apply_sets(make_cfg(data_dir, tmp_path), ["activation_checkpointing=2"]).activation_checkpointing == 2


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile internals
def test_compiled_model_gives_the_same_gradients():
    """Under torch.compile (dynamo and AOTAutograd, where checkpointing is traced; the
    ``aot_eager`` backend leaves out only inductor's code generation, which takes most of a
    compile's time) the checkpointed blocks give the eager gradients."""
    model = GatedLM(ModelConfig.from_preset("micro", "hyga-sink", vocab_size=V))
    eager = GatedLM(model.cfg)
    eager.load_state_dict(model.state_dict())
    model.set_activation_checkpointing(1)
    model.compile(backend="aot_eager")
    ids = torch.randint(0, V, (2, 8))
    for m in (model, eager):
        m(ids).float().square().mean().backward()
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name
