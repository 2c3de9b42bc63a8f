"""The trainer: determinism, exact resume, data parallelism, stability tooling, CLI errors."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gatedattn.cli
import gatedattn.train.checkpoint as ckpt_mod
import gatedattn.train.trainer as trainer_mod
from gatedattn import GatedLM
from gatedattn.analysis import loss_spikes
from gatedattn.data import TokenData, prepare
from gatedattn.infra.errors import ConfigError, GatedAttnError
from gatedattn.train import TrainConfig, lr_at, lr_schedule, parse_sets, settable_keys, sweep, train
from gatedattn.train.cli import main
from gatedattn.train.optim import build_optimizer, fusable, split_parameters

SRC = Path(__file__).resolve().parents[2] / "src"
WORDS = ("the cat sat on a mat while dogs ran over hills and birds sang in tall green trees near quiet "
         "rivers under a pale moon as old men told stories of ships and storms").split()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    texts = root / "texts"
    texts.mkdir()
    for i in range(40):
        (texts / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(300)) + "\n")
    out = root / "data"
    prepare([str(texts)], out, vocab_size=300, val_fraction=0.1, progress=False)
    return out


def make_cfg(data_dir, out, **kw) -> TrainConfig:
    base = dict(data_dir=str(data_dir), out_dir=str(out), preset="micro", variant="gated", seq_len=32,
                micro_batch=4, steps=6, warmup_steps=2, lr=3e-3, eval_batches=1, eval_every=0, ckpt_every=0,
                log_every=1, progress=False, tensorboard=False, dtype="fp32")
    return TrainConfig(**{**base, **kw})


def records(run: Path, kind: str | None = None) -> list[dict]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if kind is None or r["kind"] == kind]


def weights(run_or_dir: Path) -> dict[str, torch.Tensor]:
    return GatedLM.from_pretrained(run_or_dir).state_dict()


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def snapshot(path: Path) -> dict[str, tuple[int, int]]:
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*")}


# ---------------------------------------------------------------------------- config and schedule
def test_lr_schedule_by_value():
    kw = dict(lr=1.0, total_steps=11, warmup_steps=4, min_lr_ratio=0.1)
    assert [lr_at(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, **kw) == 1.0  # decay starts at the peak
    assert lr_at(7, **kw) == pytest.approx(0.55)  # half-way through the cosine: (1 + 0.1) / 2
    assert lr_at(10, **kw) == pytest.approx(0.1)  # the last update uses min_lr
    assert lr_at(5, **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 6)))
    assert lr_at(7, **kw, schedule="linear") == pytest.approx(0.55)
    assert lr_at(8, **kw, schedule="linear") == pytest.approx(0.1 + 0.9 * 2 / 6)
    assert lr_at(9, **kw, schedule="constant") == 1.0
    assert lr_at(0, lr=2.0, total_steps=1) == 2.0  # a one-step run without warm-up


def test_train_config_validation_names_field(tmp_path):
    good = dict(data_dir="d", out_dir="o")
    for bad, match in [
        (dict(variant="nope"), r"variant='nope'.*'gated'"),
        (dict(preset="huge"), r"preset='huge'.*'micro'"),
        (dict(lr=0.0), r"lr=0\.0"),
        (dict(micro_batch=0), r"micro_batch=0 must be >= 1"),
        (dict(steps=2.5), r"steps=2\.5"),
        (dict(betas=(0.9,)), r"betas"),
        (dict(optimizer="sgd"), r"optimizer='sgd'.*'adamw', 'muon'"),
        (dict(dtype="fp16"), r"dtype='fp16'.*'fp32', 'bf16'"),
        (dict(min_lr_ratio=2.0), r"min_lr_ratio=2\.0 must be <= 1"),
        (dict(seed=2**64), r"seed=18446744073709551616 must be < 9223372036854775808"),
        (dict(spike_window=10**20), r"spike_window=\d+ must be <= 1000000"),
        (dict(lr=float("nan")), r"lr=nan must be a finite number"),
        (dict(skip_nonfinite="yes"), r"skip_nonfinite='yes' must be true or false"),
        (dict(compile="yes"), r"compile='yes' is not allowed; choose one of 'auto', 'on', 'off'"),
        (dict(optimizer="muon", fsdp=True), r"muon.*fsdp"),
        (dict(model_overrides={"gate.colour": "red"}), r"unknown --set key 'gate.colour'"),
        (dict(data_dir=""), r"data_dir"),
    ]:
        with pytest.raises(ConfigError, match=match):
            TrainConfig(**{**good, **bad})
    cfg = TrainConfig(**good, max_tokens=10_000, seq_len=100, micro_batch=4, grad_accum=2)
    assert cfg.global_batch(3) == 24 and cfg.tokens_per_step(3) == 2400 and cfg.total_steps(3) == 5
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_set_keys_parse_by_type_and_reach_the_model():
    parsed = parse_sets(["lr=3e-3", "steps=1e3", "betas=0.8,0.9", "skip_nonfinite=false", "max_tokens=none",
                         "gate.activation=silu", "model.n_layers=3", "rope.theta=5e5", "attention.sink=yes"])
    fields = {k: v for k, v in parsed.items() if not k.startswith("model.")}
    model = {k: v for k, v in parsed.items() if k.startswith("model.")}
    assert fields == {"lr": 3e-3, "steps": 1000, "betas": (0.8, 0.9), "skip_nonfinite": False, "max_tokens": None}
    cfg = TrainConfig.from_sets({"data_dir": "d", "out_dir": "o", "variant": "gated", "preset": "micro"},
                                [f"{k}={v}" for k, v in [("gate.activation", "silu"), ("model.n_layers", "3"),
                                                          ("rope.theta", "5e5"), ("attention.sink", "yes")]])
    mc = cfg.model_config(vocab_size=300, bos_token_id=0, eos_token_id=1)
    assert (mc.n_layers, mc.attention.gate.activation, mc.attention.rope.theta, mc.attention.sink) == (3, "silu", 5e5, True)
    assert mc.max_seq_len == cfg.seq_len == mc.attention.rope.original_max_len
    assert model["model.n_layers"] == 3
    assert "lr" in settable_keys() and "model.gate.activation" in settable_keys() and "model_overrides" not in settable_keys()
    for bad, match in [("lrr=1", r"unknown --set key 'lrr' \(did you mean 'lr'\?\); valid keys: data_dir"),
                       ("lr=abc", "expected a number"), ("steps=1.5", "expected an integer"),
                       ("skip_nonfinite=maybe", "expected true or false"), ("lr", "expected KEY=VALUE"),
                       ("model.n_heads=4", "unknown --set key 'model.n_heads'")]:
        with pytest.raises(ConfigError, match=match):
            parse_sets([bad])


def test_parameter_split_for_muon_and_weight_decay():
    cfg = TrainConfig(data_dir="d", out_dir="o", preset="micro", variant="hyga-sink")
    model = GatedLM(cfg.model_config(vocab_size=300))
    parts = {k: {n for n, _ in v} for k, v in split_parameters(model).items()}
    every = {n for n, _ in model.named_parameters()}
    assert parts["matrix"] | parts["decay"] | parts["no_decay"] == every
    assert sum(map(len, parts.values())) == len(every)  # each parameter once (tied head counted once)
    assert "blocks.0.attn.qkv.q_proj.weight" in parts["matrix"] and "blocks.1.mlp.down_proj.weight" in parts["matrix"]
    assert "embed.weight" in parts["decay"] and "blocks.0.attn.gate.h.down.weight" in parts["decay"]  # 3-D
    assert {"blocks.0.attn.sink", "blocks.0.attn_norm.weight", "norm.weight"} <= parts["no_decay"]
    opt = build_optimizer(model, cfg.replace(optimizer="muon"))
    assert [type(o).__name__ for o in opt.optimizers] == ["Muon", "AdamW"]
    muon_ids = {id(p) for g in opt.optimizers[0].param_groups for p in g["params"]}
    assert muon_ids == {id(p) for n, p in model.named_parameters() if n in parts["matrix"]}
    adam_groups = opt.optimizers[1].param_groups
    assert [g["weight_decay"] for g in adam_groups] == [cfg.weight_decay, 0.0]


def test_adamw_runs_fused_where_it_can():
    cfg = TrainConfig(data_dir="d", out_dir="o", preset="micro", variant="gated")
    model = GatedLM(cfg.model_config(vocab_size=300))
    (adam,) = build_optimizer(model, cfg).optimizers
    assert adam.defaults["fused"] is True  # one kernel per step, not ~10 ops per parameter
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randint(0, 300, (2, 8)), targets=torch.randint(0, 300, (2, 8))).backward()
    adam.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()) if p.grad is not None)
    # where the fused step does not exist: parameters on two devices, or none at all
    assert fusable([torch.zeros(2), torch.zeros(2, device="meta")]) is None and fusable([]) is None
    assert fusable([torch.zeros(2, dtype=torch.bfloat16)]) is True


# ---------------------------------------------------------------------------- determinism, resume
def test_same_seed_same_losses_and_run_directory(data_dir, tmp_path):
    calls = []

    def hook(model, step, tokens):
        calls.append((step, tokens, model.training))
        return {"probe": float(step)}

    a = train(make_cfg(data_dir, tmp_path / "a", eval_every=3, ckpt_every=3), eval_hook=hook)
    b = train(make_cfg(data_dir, tmp_path / "b", eval_every=3, ckpt_every=3))
    c = train(make_cfg(data_dir, tmp_path / "c", seed=1))
    assert len(a.losses) == 6 and a.losses == b.losses
    assert c.losses != a.losses
    assert a.complete and not a.diverged and a.final_dir == str(tmp_path / "a" / "final")
    assert_same_weights(weights(tmp_path / "a" / "final"), weights(tmp_path / "b" / "final"))
    assert calls == [(0, 0, False), (3, 384, False), (6, 768, False)]  # step 0, every 3, final

    run = tmp_path / "a"
    train_recs, eval_recs = records(run, "train"), records(run, "eval")
    assert [r["step"] for r in train_recs] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in train_recs] == a.losses
    assert [r["lr"] for r in train_recs] == pytest.approx(lr_schedule(make_cfg(data_dir, run), 6))
    assert all(r["tokens"] == 128 * r["step"] and r["grad_norm"] > 0 and r["tokens_per_s"] > 0 for r in train_recs)
    assert [(r["step"], r["probe"]) for r in eval_recs] == [(0, 0.0), (3, 3.0), (6, 6.0)]
    assert eval_recs[-1]["val_loss"] == a.val_loss and eval_recs[-1]["val_ppl"] == pytest.approx(math.exp(a.val_loss))
    assert a.val_loss < eval_recs[0]["val_loss"]
    csv_lines = (run / "metrics.csv").read_text().splitlines()
    assert csv_lines[0].startswith("step,tokens,loss,lr,grad_norm") and csv_lines[0].endswith("probe")
    assert len(csv_lines) == 1 + 7  # steps 0..6, train and eval of a step in one row
    config = json.loads((run / "config.json").read_text())
    assert config["train"]["model"]["variant"] == "gated" and config["model"]["attention"]["gate"] is not None
    assert config["world_size"] == 1 and config["global_batch"] == 4 and config["data"]["vocab_size"] == 300
    version = json.loads((run / "code_version").read_text())
    assert set(version) == {"git_commit", "git_dirty", "gatedattn_version"}
    env = json.loads((run / "env.json").read_text())
    assert env["torch"] == torch.__version__ and env["device"] == "cpu" and env["hostname"]
    assert (run / "final" / "tokenizer.json").read_bytes() == (data_dir / "tokenizer.json").read_bytes()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] and summary["spikes"] == a.spikes and summary["steps"] == 6
    # checkpoints: GatedLM format, trainer state loads with weights_only, `latest` points at the newest
    ckpts = run / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step_00000006"
    assert sorted(p.name for p in ckpts.iterdir() if p.is_dir()) == ["step_00000003", "step_00000006"]
    assert_same_weights(weights(ckpts / "step_00000006"), weights(run / "final"))
    state = torch.load(ckpts / "step_00000003" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 3 and state["tokens"] == 384 and state["losses"] == a.losses[:3]


def test_data_order_depends_on_seed_and_step_only(data_dir, tmp_path, monkeypatch):
    seen: dict[str, list] = {}
    original = TokenData.train_batch

    def spy(self, step, rows, **kw):
        batch = original(self, step, rows, **kw)
        seen.setdefault(current, []).append((step, tuple(rows), batch.sum().item()))
        return batch

    monkeypatch.setattr(TokenData, "train_batch", spy)
    for current in ("baseline", "hyga-sink"):
        train(make_cfg(data_dir, tmp_path / current, variant=current, steps=3, grad_accum=2))
    assert seen["baseline"] == seen["hyga-sink"]
    assert [s[:2] for s in seen["baseline"]] == [(0, (0, 1, 2, 3)), (0, (4, 5, 6, 7)), (1, (0, 1, 2, 3)),
                                                 (1, (4, 5, 6, 7)), (2, (0, 1, 2, 3)), (2, (4, 5, 6, 7))]


def test_interrupted_then_resumed_equals_uninterrupted(data_dir, tmp_path):
    kw = dict(variant="hyga-sink", steps=8, grad_accum=2, ckpt_every=4, eval_every=2)
    whole = train(make_cfg(data_dir, tmp_path / "whole", **kw))

    def crash_at_6(model, step, tokens):
        if step == 6:
            raise KeyboardInterrupt  # a kill after step 6, two steps past the last checkpoint
        return {}

    run = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        train(make_cfg(data_dir, run, **kw), eval_hook=crash_at_6)
    assert [r["step"] for r in records(run, "train")] == [1, 2, 3, 4, 5, 6]
    assert not (run / "final").exists()
    resumed = train(make_cfg(data_dir, run, **kw), resume=True)
    assert resumed.losses == whole.losses  # exact, fp32
    assert [r["step"] for r in records(run, "train")] == list(range(1, 9))  # steps 5, 6 not duplicated
    assert [r["step"] for r in records(run, "eval")] == [0, 2, 4, 6, 8]
    assert [r["grad_norm"] for r in records(run, "train")] == [r["grad_norm"] for r in records(tmp_path / "whole", "train")]
    assert [r["val_loss"] for r in records(run, "eval")] == [r["val_loss"] for r in records(tmp_path / "whole", "eval")]
    assert_same_weights(weights(run / "final"), weights(tmp_path / "whole" / "final"))
    assert resumed.val_loss == whole.val_loss and resumed.tokens == whole.tokens


def test_stop_at_step_then_resume_equals_uninterrupted(data_dir, tmp_path):
    whole = train(make_cfg(data_dir, tmp_path / "whole", optimizer="muon", steps=6))
    run = tmp_path / "paused"
    part = train(make_cfg(data_dir, run, optimizer="muon", steps=6, stop_at_step=2))
    assert (part.steps, part.complete, part.final_dir) == (2, False, None)
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000002"
    rest = train(make_cfg(data_dir, run, optimizer="muon", steps=6), resume=True)
    assert rest.complete and rest.losses == whole.losses
    assert_same_weights(weights(run / "final"), weights(tmp_path / "whole" / "final"))
    again = train(make_cfg(data_dir, run, optimizer="muon", steps=6), resume=True)  # finished: a no-op
    assert again.losses == whole.losses and [r["step"] for r in records(run, "train")] == [1, 2, 3, 4, 5, 6]


def test_crash_while_writing_a_checkpoint_keeps_the_previous_one(data_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    original = ckpt_mod.atomic_torch_save

    def dies_on_step_4(path, obj):
        if obj["step"] == 4:
            Path(path).write_bytes(b"half a file")  # whatever a dying process leaves
            raise KeyboardInterrupt
        return original(path, obj)

    monkeypatch.setattr(ckpt_mod, "atomic_torch_save", dies_on_step_4)
    with pytest.raises(KeyboardInterrupt):
        train(make_cfg(data_dir, run, ckpt_every=2))
    ckpts = run / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step_00000002"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_00000002"]  # no temporary left
    monkeypatch.setattr(ckpt_mod, "atomic_torch_save", original)
    resumed = train(make_cfg(data_dir, run, ckpt_every=2), resume=True)
    assert resumed.losses == train(make_cfg(data_dir, tmp_path / "whole", ckpt_every=2)).losses


# ---------------------------------------------------------------------------- learning
def test_grad_accumulation_equals_one_big_batch(data_dir, tmp_path):
    a = train(make_cfg(data_dir, tmp_path / "a", micro_batch=4, grad_accum=2))
    b = train(make_cfg(data_dir, tmp_path / "b", micro_batch=8, grad_accum=1))
    assert a.tokens == b.tokens
    assert a.losses == pytest.approx(b.losses, abs=1e-5)
    wa, wb = weights(tmp_path / "a" / "final"), weights(tmp_path / "b" / "final")
    # Adam divides each gradient by its running scale, so where a gradient is near zero a
    # rounding-level difference between the two sums moves the update by a share of the LR
    # (3e-3): up to 2e-5 over 6 steps, depending on the process (the hash seed's ordering)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-4


def test_tiny_model_overfits_one_batch(data_dir, tmp_path):
    r = train(make_cfg(data_dir, tmp_path / "o", steps=40, lr=1e-2, warmup_steps=5, weight_decay=0.0,
                       min_lr_ratio=1.0, overfit_batches=1, log_every=10))
    assert r.losses[0] > 5.0 and r.losses[-1] < 1.0, r.losses[::5]


def test_bf16_and_muon_train(data_dir, tmp_path):
    fp32 = train(make_cfg(data_dir, tmp_path / "fp32", steps=4))
    bf16 = train(make_cfg(data_dir, tmp_path / "bf16", steps=4, dtype="bf16"))
    muon = train(make_cfg(data_dir, tmp_path / "muon", steps=4, optimizer="muon"))
    for r in (bf16, muon):
        assert r.complete and all(math.isfinite(x) for x in r.losses) and r.losses[-1] < r.losses[0]
    assert bf16.losses != fp32.losses and bf16.losses == pytest.approx(fp32.losses, abs=0.05)
    assert muon.losses[1:] != fp32.losses[1:]
    assert GatedLM.from_pretrained(muon.final_dir).embed.weight.dtype == torch.float32


# ---------------------------------------------------------------------------- stability tooling
def _perturb_loss(monkeypatch, at_call: int, factor: float) -> None:
    """Scale the loss (value and gradient) of the ``at_call``-th training micro-batch."""
    original, calls = trainer_mod.train_loss, []

    def perturbed(model, batch, fused):
        loss = original(model, batch, fused)
        calls.append(1)
        return loss * factor if len(calls) == at_call else loss

    monkeypatch.setattr(trainer_mod, "train_loss", perturbed)


def test_nonfinite_step_is_skipped_when_asked(data_dir, tmp_path, monkeypatch):
    _perturb_loss(monkeypatch, 3, math.nan)
    r = train(make_cfg(data_dir, tmp_path / "skip", skip_nonfinite=True))
    assert r.complete and not r.diverged and r.skipped_steps == 1
    assert math.isnan(r.losses[2]) and all(math.isfinite(x) for i, x in enumerate(r.losses) if i != 2)
    assert all(torch.isfinite(t).all() for t in weights(tmp_path / "skip" / "final").values())
    assert [(x["step"], x["kind"]) for x in records(tmp_path / "skip") if x["kind"] == "skipped"] == [(3, "skipped")]
    assert records(tmp_path / "skip", "train")[-1]["skipped_steps"] == 1
    assert 3 in r.spike_steps  # a non-finite loss also counts as a spike


def test_nonfinite_loss_stops_the_run_as_diverged(data_dir, tmp_path, monkeypatch):
    _perturb_loss(monkeypatch, 3, math.inf)
    r = train(make_cfg(data_dir, tmp_path / "div", steps=8, ckpt_every=2))
    assert r.diverged and r.diverged_step == 3 and not r.complete and r.final_dir is None
    assert "non-finite" in r.diverged_reason and len(r.losses) == 3
    assert not (tmp_path / "div" / "final").exists()
    assert (tmp_path / "div" / "checkpoints" / "latest").read_text().strip() == "step_00000003"
    summary = json.loads((tmp_path / "div" / "summary.json").read_text())
    assert summary["diverged"] and summary["diverged_step"] == 3
    assert records(tmp_path / "div")[-1]["kind"] == "diverged"
    monkeypatch.undo()  # resuming reports the divergence; it does not train again (which would not diverge now)
    again = train(make_cfg(data_dir, tmp_path / "div", steps=8, ckpt_every=2), resume=True)
    assert again.diverged and again.diverged_step == 3 and again.losses == r.losses
    assert [x["step"] for x in records(tmp_path / "div", "train")] == [1, 2, 3]


def test_loss_far_above_the_first_is_divergence(data_dir, tmp_path, monkeypatch):
    _perturb_loss(monkeypatch, 4, 3.0)
    r = train(make_cfg(data_dir, tmp_path / "big"))
    assert r.diverged and r.diverged_step == 4 and "diverge_factor" in r.diverged_reason


def test_spike_counter_matches_the_analysis_rule(data_dir, tmp_path, monkeypatch):
    _perturb_loss(monkeypatch, 5, 1.5)
    r = train(make_cfg(data_dir, tmp_path / "spiky", steps=8, spike_window=3, spike_margin=0.2))
    assert 5 in r.spike_steps and not r.diverged
    assert r.spike_steps == loss_spikes(r.losses, window=3, margin=0.2, steps=list(range(1, 9)))
    assert records(tmp_path / "spiky", "train")[-1]["spikes"] == r.spikes == len(r.spike_steps)


# ---------------------------------------------------------------------------- command line
def test_cli_train_resume_and_main_registration(data_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    argv = ["train", "--variant", "gated", "--preset", "micro", "--data", str(data_dir), "--out", str(out),
            "--set", "seq_len=32", "--set", "micro_batch=4", "--set", "steps=4", "--set", "progress=false",
            "--set", "eval_batches=1", "--set", "warmup_steps=1", "--set", "log_every=1"]
    assert main(argv) == 0
    line = capsys.readouterr().out
    assert "4/4 steps" in line and "final model in" in line
    assert main(argv + ["--resume", "--set", "steps=6", "--json"]) == 0  # extend the finished run
    result = json.loads(capsys.readouterr().out)
    assert result["steps"] == 6 and result["complete"]
    assert [r["step"] for r in records(out, "train")] == [1, 2, 3, 4, 5, 6]
    # the same subcommands through the package's main CLI
    mods = gatedattn.cli.SUBCOMMAND_MODULES
    if "gatedattn.train.cli" not in mods:
        monkeypatch.setattr(gatedattn.cli, "SUBCOMMAND_MODULES", (*mods, "gatedattn.train.cli"))
    assert gatedattn.cli.main(["train", "--data", str(data_dir), "--out", str(tmp_path / "x"), "--set", "lrr=1"]) == 2
    assert "did you mean 'lr'" in capsys.readouterr().err


def _bad_inputs(data_dir: Path, tmp: Path):
    no_tok = tmp / "no_tokenizer"
    no_tok.mkdir()
    for f in data_dir.iterdir():
        if f.name != "tokenizer.json":
            (no_tok / f.name).write_bytes(f.read_bytes())
    (tmp / "empty").mkdir()
    common = ["--preset", "micro", "--set", "seq_len=32", "--set", "micro_batch=4", "--set", "steps=2",
              "--set", "progress=false", "--set", "eval_batches=1"]
    return [
        ("missing data dir", ["--data", str(tmp / "nope")], "data directory not found"),
        ("empty data dir", ["--data", str(tmp / "empty")], "manifest.json: missing"),
        ("missing tokenizer", ["--data", str(no_tok)], "tokenizer.json: missing"),
        ("unknown variant", ["--data", str(data_dir), "--variant", "gatd"], "variant='gatd' is not allowed"),
        ("unknown preset", ["--data", str(data_dir), "--preset", "huge"], "preset='huge' is not allowed"),
        ("unknown key", ["--data", str(data_dir), "--set", "learning_rate=1"], "unknown --set key 'learning_rate'"),
        ("bad type", ["--data", str(data_dir), "--set", "steps=many"], "steps='many': expected an integer"),
        ("bad value", ["--data", str(data_dir), "--set", "dtype=fp8"], "dtype='fp8' is not allowed"),
        ("gate on a gateless variant", ["--data", str(data_dir), "--variant", "baseline", "--set", "gate.rank=4"],
         "has no gate"),
        ("seq_len beyond the data", ["--data", str(data_dir), "--set", "seq_len=100000"], "fewer than seq_len"),
    ], common


def test_bad_inputs_are_one_line_errors_leaving_no_files(data_dir, tmp_path, capsys):
    cases, common = _bad_inputs(data_dir, tmp_path)
    for name, args, message in cases:
        out = tmp_path / f"out-{name.replace(' ', '-')}"
        assert main(["train", *common, "--out", str(out), *args]) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("gatedattn train: error:") and message in err, (name, err)
        assert not out.exists(), name


def test_existing_or_incompatible_run_is_refused_untouched(data_dir, tmp_path, capsys):
    run = tmp_path / "run"
    train(make_cfg(data_dir, run, steps=4, ckpt_every=2, stop_at_step=2))
    before = snapshot(run)
    base = ["train", "--preset", "micro", "--data", str(data_dir), "--out", str(run), "--variant", "gated",
            "--set", "seq_len=32", "--set", "micro_batch=4", "--set", "steps=4", "--set", "warmup_steps=2",
            "--set", "lr=3e-3", "--set", "eval_batches=1", "--set", "progress=false", "--set", "dtype=fp32"]
    for extra, message in [
        (["--set", "lr=1e-2"], "holds a run with a different config (train.lr: 0.003 there, 0.01 here)"),
        ([], "already holds this run; pass --resume"),
        (["--resume", "--set", "seq_len=16"], "checkpoint step 2 has a different config (train.seq_len: 32 there, 16 here)"),
        (["--resume", "--variant", "baseline"], "train.model.variant: 'gated' there, 'baseline' here"),
        (["--resume", "--set", "micro_batch=2", "--set", "grad_accum=2"], "train.micro_batch"),
        (["--resume", "--set", "model.n_layers=3"], "different config (train.model.lm.n_layers"),
        (["--resume", "--set", "steps=1"], "warmup_steps=2 exceeds the 1 steps of the run"),
    ]:
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (extra, err)
        assert snapshot(run) == before, extra
    (run / "checkpoints" / "step_00000002" / "trainer_state.pt").write_bytes(b"garbage")
    before = snapshot(run)
    assert main(base + ["--resume"]) == 2
    assert "trainer_state.pt: sha256" in capsys.readouterr().err  # the checksum manifest catches it first
    assert snapshot(run) == before
    not_a_run = tmp_path / "elsewhere"
    not_a_run.mkdir()
    (not_a_run / "notes.txt").write_text("mine")
    assert main(["train", "--preset", "micro", "--data", str(data_dir), "--out", str(not_a_run)]) == 2
    assert "holds no run" in capsys.readouterr().err and sorted(os.listdir(not_a_run)) == ["notes.txt"]


def test_eval_hook_must_return_numbers(data_dir, tmp_path):
    with pytest.raises(GatedAttnError, match="eval_hook returned the key 'val_loss'"):
        train(make_cfg(data_dir, tmp_path / "h", steps=1), eval_hook=lambda m, s, t: {"val_loss": 1.0})
    with pytest.raises(GatedAttnError, match="not a number"):
        train(make_cfg(data_dir, tmp_path / "h2", steps=1), eval_hook=lambda m, s, t: {"x": "high"})


def test_sweep_grid_table_and_divergence(data_dir, tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["sweep", "--variants", "baseline,gated", "--lr", "3e-3,30", "--preset", "micro", "--data", str(data_dir),
            "--out", str(out), "--set", "seq_len=32", "--set", "micro_batch=4", "--set", "steps=6",
            "--set", "warmup_steps=1", "--set", "eval_batches=1", "--set", "progress=false",
            "--set", "diverge_factor=1.2"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    rows = json.loads((out / "sweep.json").read_text())["runs"]
    assert [(r["variant"], r["lr"]) for r in rows] == [("baseline", 3e-3), ("baseline", 30.0), ("gated", 3e-3), ("gated", 30.0)]
    assert [r["diverged"] for r in rows] == [False, True, False, True]
    assert all(r["status"] == ("diverged" if r["diverged"] else "done") for r in rows)
    evals = records(out / "baseline_lr0.003", "eval")
    assert rows[0]["steps"] == 6 and rows[0]["val_loss"] == evals[-1]["val_loss"] < evals[0]["val_loss"]
    assert (out / "baseline_lr0.003" / "final").is_dir() and not (out / "gated_lr30" / "final").exists()
    md = (out / "sweep.md").read_text()
    assert md == table and "| gated | 30 | 0 |" in md and "yes (step" in md
    assert "- baseline: largest stable lr 0.003; diverged at lr 30" in md
    assert main(argv) == 2 and "already holds this run" in capsys.readouterr().err
    assert main(argv[:1] + ["--variants", "baseline,nope"] + argv[3:]) == 2
    assert "variant='nope'" in capsys.readouterr().err
    assert main(argv + ["--resume"]) == 0  # finished runs: nothing to redo
    capsys.readouterr()
    untimed = lambda rs: [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")} for r in rs]  # noqa: E731
    assert untimed(json.loads((out / "sweep.json").read_text())["runs"]) == untimed(rows)


def test_sweep_python_api_with_seeds(data_dir, tmp_path):
    base = make_cfg(data_dir, tmp_path / "s", steps=2)
    rows = sweep(base, ["gated"], [1e-3], seeds=[0, 1])
    assert [Path(r["out_dir"]).name for r in rows] == ["gated_lr0.001_seed0", "gated_lr0.001_seed1"]
    assert rows[0]["final_loss"] != rows[1]["final_loss"]
    with pytest.raises(GatedAttnError, match="listed twice"):
        sweep(base, ["gated", "gated"], [1e-3])


# ---------------------------------------------------------------------------- torchrun
def _torchrun(args: list[str], module: str = "gatedattn.cli", timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    # --standalone: the rendezvous binds a port the OS picks (a port found free beforehand can be
    # taken by another test's processes before torchrun binds it)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", module, *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _dist_argv(data_dir, out, *sets):
    argv = ["train", "--variant", "hyga-sink", "--preset", "micro", "--data", str(data_dir), "--out", str(out)]
    for s in ("seq_len=32", "micro_batch=4", "steps=4", "warmup_steps=1", "lr=3e-3", "eval_every=2", "eval_batches=2",
              "ckpt_every=2", "log_every=1", "progress=false", "dtype=fp32", *sets):
        argv += ["--set", s]
    return argv


@pytest.mark.slow
def test_torchrun_ddp_matches_single_process_accumulation(data_dir, tmp_path):
    _torchrun(_dist_argv(data_dir, tmp_path / "ddp"), module="gatedattn.train.cli")  # the FSDP test: gatedattn.cli
    single = train(make_cfg(data_dir, tmp_path / "one", variant="hyga-sink", steps=4, grad_accum=2, warmup_steps=1,
                            eval_every=2, eval_batches=2, ckpt_every=2))
    ddp = records(tmp_path / "ddp", "train")
    assert [r["step"] for r in ddp] == [1, 2, 3, 4]
    assert [r["loss"] for r in ddp] == pytest.approx(single.losses, abs=1e-5)
    assert [r["val_loss"] for r in records(tmp_path / "ddp", "eval")] == pytest.approx(
        [r["val_loss"] for r in records(tmp_path / "one", "eval")], abs=1e-5)
    assert json.loads((tmp_path / "ddp" / "config.json").read_text())["global_batch"] == 8
    wd, ws = weights(tmp_path / "ddp" / "final"), weights(tmp_path / "one" / "final")
    assert max((wd[k] - ws[k]).abs().max().item() for k in wd) < 1e-5


@pytest.mark.slow
def test_torchrun_fsdp_stop_resume_matches_single_process(data_dir, tmp_path):
    run = tmp_path / "fsdp"
    _torchrun(_dist_argv(data_dir, run, "fsdp=true", "stop_at_step=2"))
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000002"
    _torchrun(_dist_argv(data_dir, run, "fsdp=true") + ["--resume"])
    single = train(make_cfg(data_dir, tmp_path / "one", variant="hyga-sink", steps=4, grad_accum=2, warmup_steps=1,
                            eval_every=2, eval_batches=2))
    fsdp = records(run, "train")
    assert [r["step"] for r in fsdp] == [1, 2, 3, 4]
    assert [r["loss"] for r in fsdp] == pytest.approx(single.losses, abs=1e-5)
    assert [r["grad_norm"] for r in fsdp] == pytest.approx([r["grad_norm"] for r in records(tmp_path / "one", "train")], abs=1e-5)
    wf, ws = weights(run / "final"), weights(tmp_path / "one" / "final")
    assert max((wf[k] - ws[k]).abs().max().item() for k in wf) < 1e-5


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile internals
def test_compiled_model_trains_like_eager(data_dir, tmp_path):
    """Inductor's kernels for the training step (forward and backward) and for the final
    no-grad evaluation (a graph of its own) give eager's losses and validation loss."""
    one_layer = {"n_layers": 1}  # inductor compiles a layer's kernels once; a second layer adds only time
    eager = train(make_cfg(data_dir, tmp_path / "eager", steps=3, model_overrides=one_layer))
    compiled = train(make_cfg(data_dir, tmp_path / "compiled", steps=3, compile=True, model_overrides=one_layer))
    assert compiled.complete and compiled.losses == pytest.approx(eager.losses, abs=1e-4)
    assert compiled.val_loss == pytest.approx(eager.val_loss, abs=1e-4)
    assert (tmp_path / "compiled" / "final" / "model.safetensors").is_file()


def test_tensorboard_event_files_hold_the_losses(data_dir, tmp_path):
    pytest.importorskip("tensorboard")  # a dependency: installed by scripts/setup.sh
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = train(make_cfg(data_dir, tmp_path / "tb", steps=3, tensorboard=True))
    events = EventAccumulator(str(tmp_path / "tb" / "tensorboard"))
    events.Reload()
    losses = [e.value for e in events.Scalars("train/loss")]
    assert losses == pytest.approx(result.losses, rel=1e-6)
    assert [e.step for e in events.Scalars("eval/val_loss")][0] == 0


def test_tensorboard_scalars_when_installed(data_dir, tmp_path, monkeypatch):
    import types

    written, opened = [], []

    class FakeWriter:
        def __init__(self, log_dir, purge_step=None):
            opened.append((Path(log_dir).name, purge_step))

        def add_scalar(self, tag, value, step):
            written.append((tag, step))

        def close(self):
            pass

    monkeypatch.setitem(sys.modules, "tensorboard", types.ModuleType("tensorboard"))
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    train(make_cfg(data_dir, tmp_path / "tb", steps=2, tensorboard=True, ckpt_every=1, stop_at_step=1))
    train(make_cfg(data_dir, tmp_path / "tb", steps=2, tensorboard=True, ckpt_every=1), resume=True)
    assert opened == [("tensorboard", None), ("tensorboard", 2)]
    assert ("train/loss", 1) in written and ("train/loss", 2) in written and ("eval/val_loss", 0) in written
    train(make_cfg(data_dir, tmp_path / "off", steps=1, tensorboard=False))
    assert len(opened) == 2
