"""TrainConfig.compile: on/off/auto, and auto's decision on a run's first steps
(train/compile_auto.py)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from gatedattn import GatedLM
from gatedattn.data import TokenData
from gatedattn.infra.errors import ConfigError
from gatedattn.train import TrainConfig, train
from gatedattn.train import compile_auto
from gatedattn.train.compile_auto import CompileProbe
from gatedattn.train.trainer import Trainer
from test_train import data_dir, make_cfg  # noqa: F401  (the module's corpus fixture)


def test_compile_modes_and_the_boolean_form():
    assert TrainConfig().compile == "auto"
    assert TrainConfig(compile=True).compile == "on" and TrainConfig(compile=False).compile == "off"
    assert TrainConfig(compile="true").compile == "on"  # --set train.compile=true
    assert TrainConfig.from_dict({**TrainConfig().to_dict(), "compile": False}).compile == "off"  # an older run
    with pytest.raises(ConfigError, match=r"compile.*auto.*on.*off"):
        TrainConfig(compile="sometimes")


def _trainer(data_dir, tmp_path, steps=100) -> Trainer:
    return Trainer(make_cfg(data_dir, tmp_path, steps=steps, compile="auto"), TokenData(data_dir))


def test_auto_keeps_the_compiled_model_when_its_steps_are_faster(data_dir, tmp_path, monkeypatch):
    compiled = []
    monkeypatch.setattr(GatedLM, "compile", lambda self: compiled.append(self))
    trainer = _trainer(data_dir, tmp_path)
    probe = CompileProbe(trainer, probe_steps=2, min_run_s=10.0)
    assert [probe.after_step(s) for s in (3.0, 1.0, 1.0)] == [None] * 3  # eager: one warm-up, two timed
    assert trainer.compiled and compiled == [trainer.model]  # 100 steps x 1 s >= 10 s: try it
    modes = []
    for s in (20.0, 1.2, 0.5, 0.9, 0.5):  # compiling, then eager and compiled steps alternate
        modes.append(trainer.compiled)
        decision = probe.after_step(s)
    assert modes == [True, False, True, False, True]
    assert trainer.compiled and decision["compile"] is True
    assert (decision["eager_step_s"], decision["compiled_step_s"], decision["compile_s"]) == (1.0, 0.5, 19.5)
    assert "saves" in decision["reason"] and probe.after_step(0.1) is None  # settled: nothing changes after
    assert trainer.compiled


def test_auto_goes_back_to_eager_when_compiled_steps_are_not_faster(data_dir, tmp_path):
    trainer = _trainer(data_dir, tmp_path)
    probe = CompileProbe(trainer, probe_steps=2, min_run_s=10.0)
    for s in (3.0, 1.0, 1.0):
        probe.after_step(s)
    assert trainer.compiled and trainer.model._compiled_call_impl is not None  # nn.Module.compile, lazily
    decision = [probe.after_step(s) for s in (20.0, 1.0, 1.2, 1.0, 1.1)][-1]
    assert decision["compile"] is False and "would cost" in decision["reason"]
    assert not trainer.compiled and trainer.model._compiled_call_impl is None


def test_auto_stays_eager_on_a_run_too_short_to_pay_back_a_compile(data_dir, tmp_path):
    trainer = _trainer(data_dir, tmp_path)
    probe = CompileProbe(trainer, probe_steps=2, min_run_s=1000.0)
    decision = [probe.after_step(s) for s in (3.0, 1.0, 1.0)][-1]  # 100 steps x 1 s < 1000 s
    assert decision["compile"] is False and "too short" in decision["reason"] and not trainer.compiled
    few = CompileProbe(_trainer(data_dir, tmp_path, steps=8), probe_steps=2)
    assert few.decision["compile"] is False and "too few" in few.decision["reason"]
    sharded = _trainer(data_dir, tmp_path)
    sharded.cfg = sharded.cfg.replace(fsdp=True)  # (a Trainer builds FSDP only under torchrun)
    assert "fsdp: not probed" in CompileProbe(sharded).decision["reason"]


def test_train_with_auto_compiles_records_the_decision_and_trains_like_eager(data_dir, tmp_path, monkeypatch):
    """A whole run: auto compiles after its eager probe (the compile traced by dynamo alone,
    which is all the decision needs here) and says so in env.json and metrics.jsonl."""
    monkeypatch.setattr(compile_auto, "MIN_RUN_S", 0.0)
    monkeypatch.setattr(GatedLM, "compile", lambda self: nn.Module.compile(self, backend="eager"))
    monkeypatch.setattr(CompileProbe, "_compare", lambda self: self._settle(True, "kept for the test"))
    torch._dynamo.reset()
    auto = train(make_cfg(data_dir, tmp_path / "auto", steps=16, compile="auto"))
    eager = train(make_cfg(data_dir, tmp_path / "eager", steps=16, compile="off"))
    assert auto.complete and auto.losses == pytest.approx(eager.losses, abs=1e-4)
    env = json.loads((tmp_path / "auto" / "env.json").read_text())
    assert env["compile"] == {"mode": "auto", "compile": True, "step": 14, "reason": "kept for the test"}
    recs = [json.loads(line) for line in (tmp_path / "auto" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "compile"] == [14]
    assert json.loads((tmp_path / "eager" / "env.json").read_text())["compile"] == \
        {"mode": "off", "compile": False, "step": 0}


def test_a_short_auto_run_records_why_it_stayed_eager(data_dir, tmp_path):
    train(make_cfg(data_dir, tmp_path / "run", steps=6, compile="auto"))
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["compile"]["compile"] is False and "too few" in env["compile"]["reason"]


def test_the_eval_hook_runs_the_model_eagerly_and_analyze_works_on_a_compiled_run(data_dir, tmp_path, monkeypatch):
    """An analysis watches the model through hooks and per-call Python; on a compiled run
    the eval hook gets the model with its compiled call switched off, and the compiled
    call back after (the same function: nothing compiles again). The switching is the
    model's compiled call, whatever made it: dynamo alone traces it here (inductor's kernels
    are tested in test_train.py)."""
    from gatedattn.analysis.analyze import analyze

    monkeypatch.setattr(GatedLM, "compile", lambda self: nn.Module.compile(self, backend="eager"))
    torch._dynamo.reset()
    seen = []

    def hook(model, step, tokens):
        seen.append(model._compiled_call_impl)
        batch = torch.randint(1, 50, (2, 9), generator=torch.Generator().manual_seed(step))
        r = analyze(model, [batch])
        return {"m_act": r["m_act"], "f_attn": r["f_attn"]}

    trainer = Trainer(make_cfg(data_dir, tmp_path, steps=2, compile="on"), TokenData(data_dir), eval_hook=hook)
    compiled = trainer.model._compiled_call_impl
    assert compiled is not None
    rec = trainer.evaluate()
    assert seen == [None] and trainer.model._compiled_call_impl is compiled
    assert rec["m_act"] > 0 and 0 <= rec["f_attn"] <= 1
    with pytest.raises(RuntimeError, match="boom"), trainer.eager():
        raise RuntimeError("boom")
    assert trainer.model._compiled_call_impl is compiled  # back after an error too
