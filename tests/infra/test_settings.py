"""Every ``--set`` key of every command reaches what it names, and the grammar is shared."""

from __future__ import annotations

import dataclasses

import pytest

from gatedattn.cli import main
from gatedattn.infra.errors import ConfigError
from gatedattn.reproduce import ReproduceConfig, TextConfig
from gatedattn.infra.settings import apply_sets, help_text, settings
from gatedattn.train import TrainConfig

# One valid, non-default value per training key (relative to TrainConfig), as typed on the
# command line, and the value it must become. A key missing here fails the walk below.
TRAIN_VALUES = {
    "data_dir": ("d2", "d2"), "out_dir": ("o2", "o2"),
    "model.size": ("tiny", "tiny"), "model.variant": ("hyga", "hyga"),
    "model.n_layers": ("3", 3), "model.ffn_dim": ("100", 100), "model.max_seq_len": ("512", 512),
    "model.tie_embeddings": ("false", False), "model.norm_eps": ("1e-5", 1e-5), "model.init_std": ("0.03", 0.03),
    "model.d_model": ("96", 96), "model.embed_std": ("0.5", 0.5), "model.norm": ("layer", "layer"),
    "model.position_embedding": ("learned", "learned"), "model.mlp": ("relu", "relu"),
    "model.attention.kv": ("mla", "mla"), "model.attention.qk_norm": ("false", False),
    "model.attention.qkv_bias": ("true", True), "model.attention.o_bias": ("true", True),
    "model.attention.norm_eps": ("1e-5", 1e-5), "model.attention.head_transform": ("rmsnorm", "rmsnorm"),
    "model.attention.sink": ("true", True), "model.attention.kernel": ("reference", "reference"),
    "model.attention.sink_init": ("2.5", 2.5),
    "model.gate.position": ("g5", "g5"), "model.gate.granularity": ("headwise", "headwise"),
    "model.gate.shared": ("true", True), "model.gate.activation": ("silu", "silu"),
    "model.gate.combine": ("add", "add"), "model.gate.source": ("static", "static"),
    "model.gate.rank": ("8", 8), "model.gate.bias": ("true", True), "model.gate.h_dim": ("8", 8),
    "model.gate.fusion": ("multiply", "multiply"), "model.gate.cross_head": ("true", True),
    "model.rope.theta": ("5e5", 5e5), "model.rope.fraction": ("0.5", 0.5), "model.rope.scaling": ("yarn", "yarn"),
    "model.rope.factor": ("2", 2.0), "model.rope.original_max_len": ("128", 128),
    "model.rope.beta_fast": ("40", 40.0), "model.rope.beta_slow": ("2", 2.0),
    "seq_len": ("48", 48), "micro_batch": ("3", 3), "grad_accum": ("2", 2), "steps": ("7", 7),
    "max_tokens": ("1000", 1000), "lr": ("2e-3", 2e-3), "min_lr_ratio": ("0.5", 0.5), "warmup_steps": ("3", 3),
    "schedule": ("linear", "linear"), "weight_decay": ("0.01", 0.01), "betas": ("0.8,0.9", (0.8, 0.9)),
    "eps": ("1e-6", 1e-6), "grad_clip": ("0.5", 0.5), "optimizer": ("muon", "muon"),
    "muon_momentum": ("0.9", 0.9), "dtype": ("bf16", "bf16"), "compile": ("on", "on"), "device": ("cpu", "cpu"),
    "seed": ("5", 5), "eval_every": ("9", 9), "eval_batches": ("2", 2), "ckpt_every": ("11", 11),
    "keep_checkpoints": ("5", 5), "log_every": ("4", 4), "skip_nonfinite": ("true", True),
    "spike_margin": ("0.3", 0.3), "spike_window": ("20", 20), "diverge_factor": ("3", 3.0),
    "overfit_batches": ("2", 2), "stop_at_step": ("2", 2), "fsdp": ("true", True), "progress": ("false", False),
    "tensorboard": ("false", False), "activation_checkpointing": ("2", 2), "trainable": ("gates,sink", ("gates", "sink")),
    "save_code": ("false", False),
}
# keys whose value needs other files (a model to start from): tested where they are built (test_train_init_from)
TRAIN_SPECIAL = {"init_from"}
REPRODUCE_VALUES = {
    "text.variants": ("gated,hyga", ("gated", "hyga")), "text.seeds": ("2", 2), "text.budget_minutes": ("5", 5.0),
    "text.steps": ("none", None), "out_dir": ("r2", "r2"), "text.evals": ("3", 3),
    "text.analysis_sequences": ("16", 16), "text.multiples": ("1,3", (1, 3)),
    "fold": ("runs/lr,runs/rank", ("runs/lr", "runs/rank")), "text.min_steps": ("50", 50),
    "text.compile": ("off", "off"), "text.timing_rounds": ("4", 4),
    "mechanism.variants": ("baseline,sink", ("baseline", "sink")), "mechanism.depths": ("1,3", (1, 3)),
    "mechanism.deep_variants": ("baseline", ("baseline",)), "mechanism.seeds": ("2", 2), "mechanism.steps": ("77", 77),
    "mechanism.seq_len": ("32", 32), "mechanism.micro_batch": ("8", 8), "mechanism.d_model": ("128", 128),
    "mechanism.positions": ("rope", "rope"), "mechanism.norm": ("rms", "rms"), "mechanism.mlp": ("gelu", "gelu"), "mechanism.qkv_bias": ("false", False),
    "mechanism.tie_embeddings": ("true", True), "mechanism.embed_std": ("0.02", 0.02), "mechanism.init_std": ("0.07", 0.07), "mechanism.mlp_ratio": ("8", 8), "mechanism.lr": ("1e-3", 1e-3),
    "mechanism.schedule": ("cosine", "cosine"), "mechanism.warmup_steps": ("5", 5), "mechanism.beta2": ("0.95", 0.95),
    "mechanism.weight_decay": ("0.1", 0.1), "mechanism.grad_clip": ("1", 1.0),
    "mechanism.train_tokens": ("65536", 65536), "mechanism.n_chars": ("20", 20), "mechanism.n_triggers": ("2", 2),
    "mechanism.evals": ("4", 4), "mechanism.analysis_sequences": ("64", 64), "mechanism.workers": ("1", 1),
    "mechanism.deep_seeds": ("2", 2), "mechanism.sink_init": ("3", 3.0), "mechanism.task_family": ("random", "random"),
    "mechanism.trigger_share": ("0.1", 0.1), "mechanism.successors": ("3", 3), "mechanism.task_seed": ("4", 4),
    "pretrained.model": ("m.gguf", "m.gguf"), "pretrained.first_token": ("none", "none"),
    "pretrained.seq_len": ("128", 128), "pretrained.analysis_windows": ("3", 3), "pretrained.eval_windows": ("5", 5),
    "pretrained.windows": ("8,32", (8, 32)), "pretrained.window": ("16", 16), "pretrained.min_gap": ("0.5", 0.5),
    "pretrained.arms": ("sink,gate", ("sink", "gate")), "pretrained.seeds": ("3", 3), "pretrained.steps": ("7", 7),
    "pretrained.batch": ("2", 2), "pretrained.sink_lr": ("0.5", 0.5), "pretrained.gate_lr": ("0.02", 0.02),
    "pretrained.control_lr": ("0.01", 0.01), "pretrained.sink_layers_eps": ("0.4", 0.4),
    "pretrained.streaming_len": ("200", 200), "pretrained.truncate_layers": ("2", 2), "pretrained.threads": ("1", 1),
    "pretrained.continued_steps": ("3", 3), "pretrained.continued_lr": ("1e-5", 1e-5),
    "pretrained.dtype": ("bf16", "bf16"), "pretrained.stop_every": ("1", 1),
    "pretrained.stop_patience": ("2", 2), "pretrained.dev_windows": ("2", 2), "pretrained.stop_tol": ("0.01", 0.01),
    "pretrained.kept_tol": ("0.05", 0.05),
}
# a key that is only valid together with another setting
NEEDS = {"model.gate.rank": ["model.gate.source=input"], "model.rope.fraction": ["model.attention.kv=gqa"],
         "model.attention.sink_init": ["model.attention.sink=true"]}
REPRODUCE_NEEDS = {"text.budget_minutes": ["text.steps=none"], "text.steps": ["text.budget_minutes=5"]}
REPRODUCE_TRAIN_NEEDS = {"model.position_embedding": ["text.multiples=1"]}  # learned positions cannot extrapolate


def _model_target(model_cfg, path: tuple[str, ...]):
    """Where a ``model.*`` setting lands in the built ModelConfig."""
    group, name = path[1], path[-1]
    if group == "d_model":
        return model_cfg.d_model, None
    if group == "size":
        return model_cfg.n_layers, {"tiny": 4}["tiny"]
    if group == "variant":
        return model_cfg.variant, None
    owner = {"lm": model_cfg, "attention": model_cfg.attention, "gate": model_cfg.attention.gate,
             "rope": model_cfg.attention.rope}[group]
    return getattr(owner, name), None


def _check_train_key(cfg: TrainConfig, key: str, path: tuple[str, ...], expected) -> None:
    if path[0] != "model":
        assert getattr(cfg, path[0]) == expected, key  # the trainer reads TrainConfig's field
        return
    model_cfg = cfg.model_config(vocab_size=300)  # what the trainer builds
    got, special = _model_target(model_cfg, path)
    assert got == (special if special is not None else expected), (key, got)


def test_every_train_key_reaches_the_model_or_the_trainer():
    base = TrainConfig(preset="micro", variant="gated")
    known = [s for s in settings(TrainConfig) if s.key not in TRAIN_SPECIAL]
    assert {s.key for s in settings(TrainConfig)} == set(TRAIN_VALUES) | TRAIN_SPECIAL
    for s in known:
        text, expected = TRAIN_VALUES[s.key]
        cfg = apply_sets(base, [*NEEDS.get(s.key, []), f"{s.key}={text}"])
        assert s.help, f"{s.key} has no help text"
        _check_train_key(cfg, s.key, s.path, expected)
        # the short form (the last two parts, or the field name) means the same key where it is unique
        short = ".".join(s.key.split(".")[-2:])
        if sum(k.key.endswith("." + short) or k.key == short for k in known) == 1:
            assert apply_sets(base, [*NEEDS.get(s.key, []), f"{short}={text}"]) == cfg


def test_every_reproduce_key_reaches_the_reproduction_or_every_run():
    base = ReproduceConfig.quick(text=TextConfig.quick(preset="micro"))
    known = settings(ReproduceConfig)
    train_keys = {s.key for s in known if s.path[:2] == ("text", "train")}
    excluded = {"out_dir", "steps", "max_tokens", "seed", "eval_every", "ckpt_every", "stop_at_step", "model.variant", "compile",
                "init_from", "trainable"}
    assert train_keys == {f"text.train.{k}" for k in TRAIN_VALUES if k not in excluded}
    assert {s.key for s in known if s.path[:2] != ("text", "train")} == set(REPRODUCE_VALUES)
    for s in known:
        if s.path[:2] != ("text", "train"):
            text, expected = REPRODUCE_VALUES[s.key]
            cfg = apply_sets(base, [*REPRODUCE_NEEDS.get(s.key, []), f"{s.key}={text}"])
            owner = getattr(cfg, s.path[0]) if len(s.path) > 1 else cfg  # a part's config
            assert getattr(owner, s.path[-1]) == expected, s.key
            continue
        rel = s.key[len("text.train."):]
        text, expected = TRAIN_VALUES[rel]
        cfg = apply_sets(base, [*REPRODUCE_TRAIN_NEEDS.get(rel, []), *(f"text.train.{n}" for n in NEEDS.get(rel, [])),
                                f"{s.key}={text}"])
        variants = [v for v in ("baseline", "gated") if not (rel.startswith("model.gate.")) or v == "gated"]
        for v in variants:  # each run's TrainConfig carries it (gate settings: the gated runs)
            _check_train_key(cfg.text.train_config(v, 0, steps=40, out_dir="o"), s.key, s.path[2:], expected)


def test_the_main_jobs_old_flat_keys_reach_its_text_part_with_a_warning():
    base = ReproduceConfig.quick(text=TextConfig.quick(preset="micro"))
    for old, new, text in (("train.device", "text.train.device", "cpu"), ("compile", "text.compile", "on"),
                           ("seeds", "text.seeds", "2"), ("train.model.gate.activation",
                                                           "text.train.model.gate.activation", "silu")):
        with pytest.warns(DeprecationWarning, match=f"--set {old} is now --set {new} "):
            cfg = apply_sets(base, [f"{old}={text}"])
        assert cfg == apply_sets(base, [f"{new}={text}"]) != base, old
    assert cfg.text.train.model.gate["activation"] == "silu"


def test_gate_settings_reach_gated_runs_only_in_reproduce():
    with_text = ReproduceConfig.quick(text=TextConfig.quick())
    cfg = apply_sets(with_text, ["gate.activation=silu"]).text
    assert cfg.train_config("gated", 0, steps=10).model_config(300).attention.gate.activation == "silu"
    assert cfg.train_config("baseline", 0, steps=10).model_config(300).attention.gate is None
    with pytest.raises(ConfigError, match="GateConfig.activation='nope'"):
        apply_sets(with_text, ["gate.activation=nope"])


def test_the_same_grammar_and_errors_for_every_command(capsys):
    for root in (TrainConfig, ReproduceConfig):
        with pytest.raises(ConfigError, match=r"unknown --set key 'lrr' \(did you mean"):
            apply_sets(root(), ["lrr=1"])
        with pytest.raises(ConfigError, match="ambiguous.*norm_eps"):
            apply_sets(root(), ["norm_eps=1e-5"])
        with pytest.raises(ConfigError, match="expected KEY=VALUE"):
            apply_sets(root(), ["lr"])
        assert "gate.activation" in help_text(root) and "score function" in help_text(root)
    assert main(["reproduce", "--quick", "--set", "gate.colour=red"]) == 2
    assert "unknown --set key 'gate.colour'" in capsys.readouterr().err


def test_help_lists_every_key_with_its_help(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for s in settings(TrainConfig):
        assert s.key in out
    assert dataclasses.fields(TrainConfig)[0].metadata["help"] in out


def test_each_study_config_takes_its_own_keys():
    from gatedattn.reproduce import LrConfig, RankConfig

    assert apply_sets(LrConfig.quick(), ["lrs=1e-3,1e-2"]).lrs == (1e-3, 1e-2)
    assert apply_sets(RankConfig.quick(), ["ranks=4,8"]).ranks == (4, 8)
    with pytest.raises(ConfigError, match="unknown --set key 'lrs'"):
        apply_sets(RankConfig.quick(), ["lrs=1e-3"])
    with pytest.raises(ConfigError, match=r"variants='baseline' is not allowed; choose one of 'gated', 'hyga-lowrank'"):
        apply_sets(RankConfig.quick(), ["variants=baseline"])


@pytest.mark.parametrize("item,match", [
    ("model.norm_eps=nan", r"norm_eps=nan must be a finite number"),
    ("model.norm_eps=-1", r"norm_eps=-1.0 must be > 0"),
    ("model.init_std=-1", r"init_std=-1.0 must be > 0"),
    ("model.init_std=nan", r"init_std=nan must be a finite number"),
    ("rope.factor=nan", r"factor=nan must be a finite number"),
    ("rope.beta_slow=nan", r"beta_slow=nan must be a finite number"),
    ("rope.theta=inf", r"theta=inf must be a finite number"),
    ("attention.norm_eps=inf", r"norm_eps=inf must be a finite number"),
    ("gate.rank=nan", r"rank"),
])
def test_non_finite_and_out_of_range_model_values_are_refused_before_training(item, match):
    with pytest.raises(ConfigError, match=match):
        cfg = TrainConfig.from_sets({"preset": "micro", "variant": "hyga-lowrank"}, [item])
        cfg.model_config(300)  # the model's own config is built (and checked) before any training


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_budgets_are_refused_before_anything_is_written(value, tmp_path, capsys):
    from gatedattn.cli import main

    out = tmp_path / "out"
    for study in ("main", "lr", "calibrate"):
        assert main(["reproduce", "--study", study, f"--budget-minutes={value}", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "must be finite" in err, err
    assert not out.exists()
    with pytest.raises(ConfigError, match="must be finite"):
        apply_sets(ReproduceConfig(), [f"mechanism.lr={value}"])
