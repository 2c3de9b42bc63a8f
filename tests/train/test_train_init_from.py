"""Continued pretraining: ``train --init-from MODEL`` (optionally retrofitting a gate with
``--variant``), frozen parameter groups (``--trainable``), exact resume, and the refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import gatedattn.cli
from gatedattn.data import TokenData
from gatedattn.infra.errors import ConfigError, GatedAttnError
from gatedattn.hf import add_gates, load_model
from gatedattn.models.lm import GatedLM, ModelConfig
from gatedattn.train import TrainConfig, build_optimizer, train
from gatedattn.train.cli import FLAG_KEYS
from gatedattn.train.optim import freeze, trainable_names
from gatedattn.train.sweep import grid
from gatedattn.train.trainer import Trainer, lm_loss
from test_train import assert_same_weights, data_dir, records, weights  # noqa: F401  (the module's corpus fixture)

SEQ, BATCH = 32, 4


def _randomize(model: GatedLM, seed: int) -> GatedLM:
    """Weights far from a fresh model's (std 0.1, norms around one), so that a loss
    computed with them cannot be a fresh model's."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1.0 + 0.2 * torch.randn(p.shape, generator=g)) if "norm" in name else
                    0.1 * torch.randn(p.shape, generator=g))
    return model


def save_model(directory: Path, data: TokenData, *, variant: str = "baseline", vocab_size: int | None = None,
               tokenizer: bool = True, max_seq_len: int = 64) -> Path:
    """A micro GatedLM saved as a run's final/ is: save_pretrained plus the data's tokenizer."""
    cfg = ModelConfig.from_preset("micro", variant, vocab_size=vocab_size or data.vocab_size, max_seq_len=max_seq_len,
                                  bos_token_id=data.bos_id, eos_token_id=data.eos_id)
    _randomize(GatedLM(cfg), seed=1).save_pretrained(directory)
    if tokenizer:
        shutil.copyfile(data.data_dir / "tokenizer.json", directory / "tokenizer.json")
    return directory


@pytest.fixture(scope="module")
def data(data_dir) -> TokenData:  # noqa: F811
    return TokenData(data_dir)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, data) -> Path:
    return save_model(tmp_path_factory.mktemp("init") / "model", data)


def first_batch(data: TokenData) -> torch.Tensor:
    """The rows of data step 0 (seed 0), as the trainer's first step reads them."""
    return data.train_batch(0, range(BATCH), global_batch=BATCH, seq_len=SEQ, seed=0)


def loss_on(model: GatedLM, batch: torch.Tensor) -> float:
    with torch.no_grad():
        return float(lm_loss(model(batch[:, :-1]), batch))


def argv(init, data_dir, out, *extra, steps: int = 3) -> list[str]:  # noqa: F811
    sets = dict(seq_len=SEQ, micro_batch=BATCH, steps=steps, warmup_steps=1, lr=3e-3, eval_batches=1, eval_every=0,
                ckpt_every=0, log_every=1, progress="false", tensorboard="false", dtype="fp32")
    return ["train", "--init-from", str(init), "--data", str(data_dir), "--out", str(out),
            *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")], *extra]


def cli(args: list[str], monkeypatch) -> int:
    mods = gatedattn.cli.SUBCOMMAND_MODULES
    if "gatedattn.train.cli" not in mods:
        monkeypatch.setattr(gatedattn.cli, "SUBCOMMAND_MODULES", (*mods, "gatedattn.train.cli"))
    return gatedattn.cli.main(args)


def losses(run: Path) -> list[float]:
    return [r["loss"] for r in records(run, "train")]


def init_cfg(data_dir, out, init, **kw) -> TrainConfig:  # noqa: F811
    base = dict(data_dir=str(data_dir), out_dir=str(out), init_from=str(init), seq_len=SEQ, micro_batch=BATCH,
                steps=4, warmup_steps=1, lr=3e-3, eval_batches=1, eval_every=0, ckpt_every=0, log_every=1,
                progress=False, tensorboard=False, dtype="fp32")
    return TrainConfig(**{**base, **kw})


# ---------------------------------------------------------------------------- the config
def test_config_fields_round_trip_and_stay_out_of_older_runs(tmp_path, model_dir):
    cfg = TrainConfig(data_dir="d", out_dir="o", init_from=tmp_path / "m", trainable="gates,blocks.*.attn.o_proj.*",
                      variant="gated")
    assert cfg.init_from == str(tmp_path / "m") and cfg.trainable == ("gates", "blocks.*.attn.o_proj.*")
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    plain = TrainConfig(data_dir="d", out_dir="o").to_dict()
    assert "init_from" not in plain and "trainable" not in plain  # a run recorded before the fields resumes
    assert FLAG_KEYS["init_from"] == "--init-from" and FLAG_KEYS["trainable"] == "--trainable"
    with pytest.raises(ConfigError, match="init_from=.*the model config is the init model's"):
        cfg.model_config(vocab_size=300)
    for bad, match in [
        (dict(trainable=("gates", "")), r"TrainConfig.trainable=\['gates', ''\] has an empty"),
        (dict(trainable=(1,)), r"TrainConfig.trainable=\(1,\) must be a list of group names \(gates, sink, all\)"),
        (dict(init_from=""), r"TrainConfig.init_from='' must be a non-empty path"),
        (dict(init_from="m", preset="small"), r"model.size='small' \(--preset\) conflicts with it"),
        (dict(init_from="m", model_overrides={"model.n_layers": 3}), r"model.n_layers=3 conflicts with it"),
        (dict(init_from="m", variant="gated", model_overrides={"gate.activation": "silu"}),
         r"model.gate.activation='silu' conflicts"),
        (dict(init_from="m", variant="sdpa-rmsnorm"), r"model.variant='sdpa-rmsnorm' is not a gate or sink to retrofit"),
    ]:
        with pytest.raises(ConfigError, match=match):
            TrainConfig(**{"data_dir": "d", "out_dir": "o", **bad})
    with pytest.raises(GatedAttnError, match="sweep .*init_from is not supported"):
        grid(TrainConfig(data_dir="d", out_dir="o", init_from=str(model_dir)), ["baseline"], [1e-3])


def test_trainable_groups_and_patterns_select_parameters():
    model = GatedLM(ModelConfig.from_preset("micro", "hyga-sink", vocab_size=300))
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    assert trainable_names(names, ["gates"]) == {n for n in names if ".gate." in n} != set()
    assert trainable_names(names, ["sink"]) == {f"blocks.{i}.attn.sink" for i in range(model.cfg.n_layers)}
    assert trainable_names(names, ["all"]) == set(names)
    assert trainable_names(names, ["blocks.*.attn.o_proj.*"]) == {n for n in names if n.endswith("attn.o_proj.weight")}
    trainable = freeze(model, ["lm_head.weight"])  # tied: the embedding trains under either name
    assert trainable == ["embed.weight", "lm_head.weight"] and model.embed.weight.requires_grad
    assert sum(p.requires_grad for p in model.parameters()) == 1
    with pytest.raises(ConfigError, match=r"'gate' matches no parameter of the model; give a group \(gates, sink, "
                                          r"all\) or an fnmatch pattern .* such as embed.weight, blocks.0."):
        trainable_names(names, ["gates", "gate"])


# ---------------------------------------------------------------------------- training from a model
def test_first_step_loss_is_the_loaded_models(data_dir, data, model_dir, tmp_path, monkeypatch):  # noqa: F811
    run = tmp_path / "run"
    assert cli(argv(model_dir, data_dir, run), monkeypatch) == 0
    batch = first_batch(data)
    loaded = load_model(model_dir)
    expected = loss_on(loaded, batch)
    fresh = loss_on(GatedLM(ModelConfig.from_preset("micro", vocab_size=data.vocab_size)), batch)
    assert abs(expected - fresh) > 0.1  # the saved weights are not a fresh model's
    assert losses(run)[0] == pytest.approx(expected, rel=1e-6, abs=0)
    config = json.loads((run / "config.json").read_text())
    assert config["train"]["init_from"] == str(model_dir) and config["model"] == loaded.cfg.to_dict()
    final = weights(run / "final")
    assert final.keys() == loaded.state_dict().keys()
    assert not torch.equal(final["blocks.0.mlp.down_proj.weight"], loaded.state_dict()["blocks.0.mlp.down_proj.weight"])


def test_retrofit_keeps_the_first_loss_and_trainable_gates_change_only_gates(data_dir, data, model_dir, tmp_path,  # noqa: F811
                                                                             monkeypatch):
    run = tmp_path / "gated"
    assert cli(argv(model_dir, data_dir, run, "--variant", "gated", "--trainable", "gates"), monkeypatch) == 0
    ungated = load_model(model_dir)
    assert losses(run)[0] == pytest.approx(loss_on(ungated, first_batch(data)), rel=1e-6, abs=0)
    before = add_gates(ungated, "gated", init="identity").state_dict()
    after = weights(run / "final")
    assert after.keys() == before.keys()
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    gates = {n for n in before if ".gate." in n}
    assert changed == gates and len(gates) == ungated.cfg.n_layers  # every gate trained, nothing else moved
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["attention"]["gate"] is not None and config["train"]["trainable"] == ["gates"]


def test_a_retrofitted_sink_trains(data_dir, data, model_dir, tmp_path, monkeypatch):  # noqa: F811
    run = tmp_path / "sink"
    assert cli(argv(model_dir, data_dir, run, "--variant", "sink", "--trainable", "sink"), monkeypatch) == 0
    start = add_gates(load_model(model_dir), "sink", init="identity").state_dict()
    after = weights(run / "final")
    sinks = [n for n in start if n.endswith(".attn.sink")]
    assert sinks and all(start[n].max() > -20 for n in sinks)  # a finite start, not -30
    moved = min((after[n] - start[n]).abs().max().item() for n in sinks)
    assert moved > 1e-4  # every layer's sink moved (at -30 its gradient, ~1e-16, moved nothing)
    assert {n for n in start if not torch.equal(start[n], after[n])} == set(sinks)


def test_frozen_parameters_get_no_gradient_and_no_optimizer_state(data_dir, data, model_dir, tmp_path):  # noqa: F811
    cfg = init_cfg(data_dir, tmp_path / "mem", model_dir, variant="hyga-sink", trainable=("sink", "blocks.*.attn.o_proj.*"))
    trainer = Trainer(cfg, data)  # in memory: loads and retrofits the model itself
    named = dict(trainer.model.named_parameters())
    chosen = {n for n in named if n.endswith(".attn.sink") or n.endswith(".attn.o_proj.weight")}
    assert set(trainer.trainable) == chosen and {n for n, p in named.items() if p.requires_grad} == chosen
    assert {id(p) for g in trainer.opt.param_groups for p in g["params"]} == {id(named[n]) for n in chosen}
    trainer._forward_backward(0)
    assert {n for n, p in named.items() if p.grad is not None} == chosen  # frozen: no gradient computed at all
    trainer.opt.zero_grad()
    stats = trainer.train_step()
    assert stats.step == 1 and all(p.grad is None for p in named.values())
    # Muon with every hidden matrix frozen: AdamW alone
    opt = build_optimizer(trainer.model, cfg.replace(optimizer="muon", trainable=("sink",)))
    assert [type(o).__name__ for o in opt.optimizers] == ["Muon", "AdamW"]  # (o_proj is still trainable here)
    freeze(trainer.model, ("sink",))
    opt = build_optimizer(trainer.model, cfg.replace(optimizer="muon"))
    assert [type(o).__name__ for o in opt.optimizers] == ["AdamW"]


def test_interrupted_then_resumed_equals_uninterrupted_without_the_init_model(data_dir, data, tmp_path,  # noqa: F811
                                                                              monkeypatch):
    init = save_model(tmp_path / "init", data)
    kw = dict(variant="gated", trainable=("gates", "blocks.1.*"), steps=6, ckpt_every=3, eval_every=2)
    whole = train(init_cfg(data_dir, tmp_path / "whole", init, **kw))

    def crash_at_4(model, step, tokens):
        if step == 4:
            raise KeyboardInterrupt  # a kill after step 4, one step past the last checkpoint
        return {}

    run = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        train(init_cfg(data_dir, run, init, **kw), eval_hook=crash_at_4)
    assert [r["step"] for r in records(run, "train")] == [1, 2, 3, 4]
    init.rename(tmp_path / "moved")  # the resumed run takes everything from its checkpoint
    assert cli(["train", "--resume", str(run)], monkeypatch) == 0
    assert losses(run) == whole.losses  # exact, fp32
    assert [r["step"] for r in records(run, "train")] == list(range(1, 7))
    assert_same_weights(weights(run / "final"), weights(tmp_path / "whole" / "final"))
    assert json.loads((run / "config.json").read_text())["model"] == \
        json.loads((tmp_path / "whole" / "config.json").read_text())["model"]


def test_from_a_hf_llama_directory(data_dir, data, tmp_path, monkeypatch):  # noqa: F811
    from hf_models import make_hf
    from transformers import LlamaConfig, LlamaForCausalLM

    _, hf_dir = make_hf(LlamaForCausalLM, LlamaConfig, tmp_path, vocab_size=data.vocab_size + 20)  # no tokenizer
    run = tmp_path / "run"
    assert cli(argv(hf_dir, data_dir, run, "--variant", "gated", steps=2), monkeypatch) == 0
    imported = load_model(hf_dir)
    assert losses(run)[0] == pytest.approx(loss_on(imported, first_batch(data)), rel=1e-5, abs=0)
    final = GatedLM.from_pretrained(run / "final")
    assert final.cfg == add_gates(imported, "gated", init="identity").cfg
    assert final.cfg.vocab_size == data.vocab_size + 20 and not final.cfg.tie_embeddings


# ---------------------------------------------------------------------------- refusals
def test_refusals_are_one_line_errors_before_any_work(data_dir, data, model_dir, tmp_path, capsys,  # noqa: F811
                                                      monkeypatch):
    other_tok = json.loads((data_dir / "tokenizer.json").read_text())
    vocab = other_tok["model"]["vocab"]
    first, second = list(vocab)[-2:]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # another tokenizer: two ids swapped
    other = tmp_path / "other-tokenizer"
    shutil.copytree(model_dir, other)
    (other / "tokenizer.json").write_text(json.dumps(other_tok))
    small = save_model(tmp_path / "small-vocab", data, vocab_size=data.vocab_size - 50, tokenizer=False)
    gated = save_model(tmp_path / "gated", data, variant="gated")
    (tmp_path / "empty").mkdir()
    cases = [
        ("preset", model_dir, ["--preset", "micro"], f"--preset micro conflicts with --init-from {model_dir}"),
        ("size key", model_dir, ["--set", "model.n_layers=3"], "model.n_layers=3 conflicts with it"),
        ("gate key", model_dir, ["--variant", "gated", "--set", "gate.activation=silu"],
         "model.gate.activation='silu' conflicts with it"),
        ("missing model", tmp_path / "nope", [], "is not a model gatedattn can load"),
        ("empty model dir", tmp_path / "empty", [], "is not a model gatedattn can load"),
        ("other tokenizer", other, [], "its tokenizer.json differs from the data's"),
        ("vocab too small", small, [], f"token ids up to {data.vocab_size - 1} would be out of range"),
        ("context too short", model_dir, ["--set", "seq_len=128"], "seq_len=128 is longer than the model's context"),
        ("no such group", model_dir, ["--trainable", "gates"], "'gates' matches no parameter of the model; give a "
                                                               "group (gates, sink, all)"),
        ("no such pattern", model_dir, ["--trainable", "blocks.*.attn.nope*"], "such as embed.weight, blocks.0."),
        ("trainable by --set", model_dir, ["--set", "trainable=sink"], "trainable is set by --trainable"),
        ("not a gate", model_dir, ["--variant", "sdpa-rmsnorm"], "is not a gate or sink to retrofit"),
        ("gated already", gated, ["--variant", "gated"], "cannot retrofit --variant gated: the model already has"),
    ]
    for name, init, extra, message in cases:
        out = tmp_path / f"out-{name.replace(' ', '-')}"
        assert cli(argv(init, data_dir, out, *extra), monkeypatch) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("gatedattn train: error:") and message in err, (name, err)
        assert not out.exists(), name
    # a resumed run keeps its model: another --init-from, --preset or --trainable is refused, the run untouched
    run = tmp_path / "paused"
    assert cli(argv(model_dir, data_dir, run, "--set", "stop_at_step=1"), monkeypatch) == 0
    capsys.readouterr()
    for extra, message in [(["--init-from", str(other)], "--init-from"), (["--preset", "micro"], "conflicts"),
                           (["--trainable", "all"], "--trainable all differs from the run's ''")]:
        assert cli(["train", "--resume", str(run), *extra], monkeypatch) == 2, extra
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (extra, err)
    assert [r["step"] for r in records(run, "train")] == [1]
