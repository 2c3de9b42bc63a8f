"""Old public paths keep working for one release, each with a DeprecationWarning that names
the new place (CHANGELOG.md lists them)."""

import importlib
import sys

import pytest


@pytest.mark.parametrize("old, new, name", [
    ("gatedattn.config", "gatedattn.layers.config", "AttentionConfig"),
    ("gatedattn.errors", "gatedattn.infra.errors", "ConfigError"),
    ("gatedattn.reproduce.mechanism_report", "gatedattn.reproduce.mechanism.report", "write_mechanism_report"),
    ("gatedattn.reproduce.mechanism_calibration", "gatedattn.reproduce.mechanism.calibration", "MechCalibrationConfig"),
    ("gatedattn.reproduce.mechanism_probe", "gatedattn.reproduce.mechanism.probe", "measure"),
])
def test_a_moved_module_warns_and_gives_the_same_objects(old, new, name, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize("old, new, name", [
    ("gatedattn.models.lm", "gatedattn.models.shards", "read_safetensors"),
    ("gatedattn.hf.load", "gatedattn.hf.importers", "hf_specs"),
    ("gatedattn.hf.load", "gatedattn.hf.importers", "IMPORTERS"),
    ("gatedattn.reproduce.mechanism", "gatedattn.reproduce.mechanism.config", "MechanismConfig"),
    ("gatedattn.reproduce.mechanism", "gatedattn.reproduce.mechanism.run", "run_part"),
    ("gatedattn.reproduce.mechanism", "gatedattn.reproduce.mechanism.summary", "strongest_layer"),
    ("gatedattn.reproduce.mechanism", "gatedattn.reproduce.mechanism.claims", "judge_depths"),
])
def test_a_moved_name_warns_and_is_the_same_object(old, new, name):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=f"{old}.{name} moved to {new}.{name}"):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        module.nothing  # noqa: B018


def test_the_old_mechanism_report_path_still_gives_run_study(monkeypatch):
    """``run_study`` lived in mechanism_report; it moved to mechanism.run, and the old path warns."""
    monkeypatch.delitem(sys.modules, "gatedattn.reproduce.mechanism_report", raising=False)
    with pytest.warns(DeprecationWarning, match="run_study to gatedattn.reproduce.mechanism.run"):
        module = importlib.import_module("gatedattn.reproduce.mechanism_report")
    assert module.run_study is importlib.import_module("gatedattn.reproduce.mechanism.run").run_study


def test_the_main_jobs_natural_text_is_read_from_its_text_part():
    """``ReproduceConfig.natural_text`` became the ``text`` part (None where left out)."""
    from gatedattn.reproduce import ReproduceConfig, TextConfig

    with pytest.warns(DeprecationWarning, match="ReproduceConfig.natural_text moved to ReproduceConfig.text"):
        assert ReproduceConfig().natural_text is False
    with pytest.warns(DeprecationWarning):
        assert ReproduceConfig(text=TextConfig.quick()).natural_text is True
