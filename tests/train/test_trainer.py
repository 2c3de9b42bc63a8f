"""The Trainer against the trainer it replaced: the same losses (to float32 rounding), and a run
directory written by the old code resumes to the old code's losses.

``tests/fixtures/legacy_losses.json`` and ``tests/fixtures/legacy_run`` were recorded with the
previous trainer (one 185-line loop, main at 1eed29b, which includes the fused gate
projection) on ``tests/fixtures/legacy_data``, by running ``train(TrainConfig(...))`` with the
configurations listed in the JSON file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from gatedattn.data import TokenData
from gatedattn.train import TrainConfig, train
from gatedattn.train.trainer import Trainer, TrainState
from test_train import make_cfg

LEGACY = Path(__file__).parents[1] / "fixtures"


@pytest.fixture
def data_dir() -> Path:
    """The prepared corpus the recordings were made on (``prepare`` output is not the
    same byte for byte across machines and paths, so it is kept, 76 kB)."""
    return LEGACY / "legacy_data"


def _legacy() -> dict:
    return json.loads((LEGACY / "legacy_losses.json").read_text())


def _close(hexes: list[str]):
    """The recorded losses, to within float32 rounding: recorded on an AVX-512 CPU, they
    differ in the last bits where other CPU kernels sum in another order, and the steps carry
    that on (AVX2 kernels: up to 4e-6 relative after six steps)."""
    return pytest.approx([float.fromhex(h) for h in hexes], rel=1e-4, abs=0)


@pytest.mark.parametrize("case", ["gated", "baseline_accum2", "hyga_sink_silu", "muon"])
def test_same_losses_as_the_previous_trainer(data_dir, tmp_path, case):
    rec = _legacy()[case]
    r = train(make_cfg(data_dir, tmp_path / case, **rec["config"]))
    assert r.losses == _close(rec["losses"])
    assert [r.val_loss] == _close([rec["val_loss"]])


def test_a_run_written_by_the_previous_trainer_resumes(data_dir, tmp_path):
    rec = _legacy()["legacy_resume"]
    run = tmp_path / "legacy_run"
    shutil.copytree(LEGACY / "legacy_run", run)
    old_config = json.loads((run / "config.json").read_text())
    assert "variant" in old_config["train"] and "model" not in old_config["train"]  # the flat, older form
    r = train(make_cfg(data_dir, run, **rec["config"]), resume=True)
    assert r.complete and r.losses == _close(rec["losses"])
    kinds = [json.loads(line)["kind"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "resume" in kinds


def test_a_changed_setting_still_refuses_the_old_run(data_dir, tmp_path):
    from gatedattn.infra.errors import GatedAttnError

    run = tmp_path / "legacy_run"
    shutil.copytree(LEGACY / "legacy_run", run)
    cfg = make_cfg(data_dir, run, **{**_legacy()["legacy_resume"]["config"], "variant": "gated"})
    with pytest.raises(GatedAttnError, match=r"train\.model\.variant: 'hyga-sink' there, 'gated' here"):
        train(cfg, resume=True)


def test_trainer_without_a_run_directory_steps_like_train(data_dir, tmp_path):
    """``Trainer(cfg, data)``: no output; its steps are the steps of a run."""
    cfg = make_cfg(data_dir, tmp_path / "run", steps=3)
    losses = train(cfg).losses
    bare = TrainConfig.from_dict({**cfg.to_dict(), "out_dir": None})
    trainer = Trainer(bare, TokenData(data_dir))
    stats = [trainer.train_step() for _ in range(3)]
    assert [s.loss for s in stats] == losses
    assert [s.step for s in stats] == [1, 2, 3] and trainer.state.tokens == 3 * 128
    assert all(s.seconds > 0 and s.diverged is None and not s.skipped for s in stats)
    assert not any(Path(p).exists() for p in [tmp_path / "none"])


def test_train_state_round_trips_and_ignores_extra_keys():
    st = TrainState(step=3, tokens=384, losses=[5.0, 4.0, 3.5], spike_steps=[2], diverged_reason=None)
    d = {**st.state_dict(), "optimizer": {}, "rng": {}}
    back = TrainState()
    back.load_state_dict(d)
    assert back == st
    back.losses.append(1.0)
    assert st.losses == [5.0, 4.0, 3.5]  # a copy, not the same list


def test_train_needs_both_directories(data_dir):
    from gatedattn.infra.errors import GatedAttnError

    with pytest.raises(GatedAttnError, match="TrainConfig.out_dir"):
        train(TrainConfig(data_dir=str(data_dir), preset="micro"))
    assert torch.get_num_threads() >= 1


def test_reproduction_trains_the_same_configs_as_before():
    """Each run of the default and the quick reproduction's natural-text part gets the
    TrainConfig the flat ReproduceConfig gave it (recorded before the config tree; data_dir
    aside, which was a placeholder then), once the two changes the sink calibration made to the recipe (q/k norm
    off, LR 1e-2) and the warm-up cap are undone: nothing else moved."""
    import dataclasses

    from gatedattn.reproduce import TextConfig
    from gatedattn.reproduce.main_job import text_part_config

    def before_calibration(cfg):
        model = dataclasses.replace(cfg.train.model, attention={})
        return dataclasses.replace(cfg, train=cfg.train.replace(lr=3e-3, model=model))

    recorded = json.loads((LEGACY / "legacy_reproduce_train_configs.json").read_text())
    configs = {"default": text_part_config().replace(steps=700, budget_minutes=None), "quick": text_part_config(quick=True),
               "quick_set": TextConfig.quick(grad_clip=0.5)}
    assert all(c.train.lr == 1e-2 and c.train.model.attention == {"qk_norm": False} for c in configs.values())
    configs = {k: before_calibration(c) for k, c in configs.items()}
    for key, old in recorded.items():
        name, run = key.split("/")
        cfg = configs[name]
        lr, variant = (1e-2, "gated") if run == "lr" else (None, run)
        steps = 40 if run == "lr" else cfg.steps
        new = cfg.train_config(variant, 0 if run == "lr" else 1, steps=steps, out_dir="OUT", lr=lr).to_dict()
        old = TrainConfig.from_dict(old).to_dict()
        new.pop("data_dir"), old.pop("data_dir")
        # the warm-up cap moved from a fifth to a tenth of the run (at most 10 % of it)
        assert new["warmup_steps"] == min(cfg.train.warmup_steps, max(steps // 10, 1)), key
        assert old["warmup_steps"] == min(cfg.train.warmup_steps, max(steps // 5, 1)), key
        new["warmup_steps"] = old["warmup_steps"]
        assert new == old, key
