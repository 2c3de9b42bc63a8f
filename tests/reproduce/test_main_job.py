"""The main job as a composition: its parts in the order of ``PARTS``, each a registered
study with its own config, run through one interface; no part is a base of its config."""

import dataclasses
import json
import warnings

import pytest

from gatedattn.cli import build_parser
from gatedattn.infra.errors import ConfigError
from gatedattn.reproduce import ReproduceConfig, TextConfig
from gatedattn.reproduce.cli import _check_flags, study_config
from gatedattn.reproduce.main_job import PARTS, keyed_part, reproduce, text_part_config
from gatedattn.reproduce.mechanism.config import MechanismConfig
from gatedattn.reproduce.part_results import PartResults, optional
from gatedattn.reproduce.pretrained.config import PretrainedConfig
from gatedattn.reproduce.studies import MAIN_PARTS, STUDIES


def _config(*argv):
    args = build_parser("reproduce").parse_args(["reproduce", *argv])
    _check_flags(STUDIES["main"], args)
    return study_config(STUDIES["main"], args)


def test_the_config_composes_its_parts_and_is_none_of_them():
    assert PARTS == ("mechanism", "pretrained", "text")
    assert not issubclass(ReproduceConfig, (TextConfig, MechanismConfig, PretrainedConfig))
    assert not isinstance(ReproduceConfig(), TextConfig)
    assert STUDIES["main"].parts == PARTS and list(MAIN_PARTS) == list(PARTS)
    for key in PARTS:  # each part is a study of its own, registered with the config its field holds
        assert key in STUDIES and ReproduceConfig.__dataclass_fields__[key]


def test_the_default_runs_mechanism_then_pretrained_and_with_text_adds_text_last():
    assert ReproduceConfig().parts() == ("mechanism", "pretrained") and ReproduceConfig().text is None
    assert _config().parts() == _config("--quick").parts() == ("mechanism", "pretrained")
    assert _config("--with-text").parts() == PARTS
    assert _config("--with-text").text == text_part_config() and text_part_config().budget_minutes == 11.0
    assert _config("--quick", "--with-text").text == TextConfig.quick()
    assert _config("--with-text", "--no-mechanism", "--no-pretrained").parts() == ("text",)


def test_text_flags_set_the_text_part():
    cfg = _config("--with-text", "--preset", "micro", "--variants", "baseline,gated", "--seq-len", "64",
                  "--batch-size", "2", "--budget-minutes", "3", "--no-mechanism", "-q")
    t = cfg.text
    assert (t.train.model.size, t.variants, t.train.seq_len, t.train.micro_batch, t.budget_minutes, t.steps) == \
        ("micro", ("baseline", "gated"), 64, 2, 3.0, None)
    assert not t.train.progress and cfg.mechanism is None
    assert _config("-q").text is None  # --quiet quiets the parts that run


def test_an_old_flat_set_key_reaches_the_text_part_with_a_warning():
    with pytest.warns(DeprecationWarning, match="--set train.device is now --set text.train.device"):
        cfg = _config("--with-text", "--set", "train.device=cpu", "--set", "text.compile=on")
    assert (cfg.text.train.device, cfg.text.compile) == ("cpu", "on")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new key warns of nothing
        assert _config("--with-text", "--set", "text.train.device=cpu").text.train.device == "cpu"
    with pytest.warns(DeprecationWarning, match="ReproduceConfig.natural_text moved to ReproduceConfig.text"):
        assert cfg.natural_text is True


@pytest.mark.parametrize("argv,match", [
    (["--set", "text.seeds=2"], "--set text.seeds applies to the text part, which this study runs only with "
                                "--with-text; add --with-text"),
    (["--preset", "micro"], "--preset applies to the text part, which this study runs only with --with-text"),
    (["--no-pretrained", "--model", "m.gguf"], "--model applies to the pretrained part, which --no-pretrained "
                                               "leaves out"),
    (["--no-mechanism", "--no-pretrained"], r"leaves every part out \(mechanism, pretrained, text all None\)"),
    (["--fold", "runs/lr"], "ReproduceConfig.fold joins studies to the natural-text claims, and text is None"),
])
def test_a_part_left_out_is_refused_at_config_time(argv, match):
    with pytest.raises(ConfigError, match=match):
        _config(*argv)


def test_a_part_of_the_wrong_kind_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="ReproduceConfig.text must be a TextConfig or None, got MechanismConfig"):
        ReproduceConfig(text=MechanismConfig())


def test_every_part_starts_before_any_runs_then_each_runs_in_order(tmp_path):
    """One interface for every part: each is started (its inputs checked) before any part
    trains, then run in the order given, its results recorded and judged."""
    calls = []

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Found(PartResults):
        PART = "test"
        value: int
        minutes: float | None = optional()
        judged: bool | None = optional()

    def part(key):
        def run(cfg, out):
            calls.append(("run", key, cfg))
            return Found(value=cfg)

        made = keyed_part(key, Found, run, lambda found: found.replace(judged=True),
                          lambda found, out, heading: [f"{heading} {key} {found.value}", ""])
        start = made.start

        def starting(cfg, out):
            calls.append(("start", key, cfg))
            return start(cfg, out)

        return dataclasses.replace(made, start=starting)

    report = reproduce("main", tmp_path, [(part("a"), 1), (part("b"), 2)], "gatedattn reproduce",
                       record={"out_dir": str(tmp_path), "natural_text": False})
    assert calls == [("start", "a", 1), ("start", "b", 2), ("run", "a", 1), ("run", "b", 2)]
    results = json.loads((tmp_path / "results.json").read_text())
    assert list(results) == ["study", "config", "a", "b", "meta"]
    assert results["config"] == {"out_dir": str(tmp_path), "natural_text": False}
    assert results["a"]["judged"] and results["b"]["value"] == 2 and results["a"]["minutes"] >= 0
    text = report.read_text()
    assert text.index("## Part 1: a 1") < text.index("## Part 2: b 2") < text.index("**Natural text:**")


def test_the_text_parts_budget_is_the_jobs_and_checked_like_the_text_studys(tmp_path, capsys):
    from gatedattn.cli import main

    assert _config().budget_minutes is None
    assert _config("--with-text", "--budget-minutes", "3").budget_minutes == 3.0
    out = tmp_path / "out"
    week = 7 * 24 * 60
    for argv in (["--study", "text"], ["--with-text", "--no-mechanism", "--no-pretrained"]):
        assert main(["reproduce", *argv, "--budget-minutes", str(week + 1), "--out", str(out)]) == 2
        assert "must be a finite number of minutes" in capsys.readouterr().err and not out.exists()
