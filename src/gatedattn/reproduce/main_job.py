"""The main job's composition: its config (``ReproduceConfig``: the mechanism study, the
real-model study, and natural text where asked), the parts run in order into one output
directory, the studies run apart folded into its claims, the overhead timing rounds, and
the claims judged anew for ``--report-only``.

Natural text is left out of the default job: at the scale two CPU cores train in minutes
it judges almost none of its claims (a natural-text sink needs billions of tokens), so it
runs as ``--study text``, or here with ``--with-text``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Mapping

from gatedattn.infra.errors import ConfigError
from gatedattn.infra.io import atomic_write_json, json_safe, read_json_object
from gatedattn.infra.provenance import run_meta, say
from gatedattn.infra.settings import option
from gatedattn.reproduce.claims import judge_all
from gatedattn.reproduce.mechanism.config import MechanismConfig
from gatedattn.reproduce.pretrained.config import PretrainedConfig
from gatedattn.reproduce.registry import ALWAYS, Flag, Section
from gatedattn.reproduce.report import write_report
from gatedattn.reproduce.text.config import RUN_APART_FLAGS, TextConfig
from gatedattn.reproduce.text.run import start_study, study_meta, text_part

NAME = "main"  # the study's name in the registry


@dataclass(frozen=True)
class ReproduceConfig(TextConfig):
    """The main job: the Bigram-Backcopy mechanism study (``mechanism``), the real-model
    study (``pretrained``), then, with ``natural_text``, the natural-text study (the fields
    of :class:`TextConfig`); ``fold`` joins the results of learning-rate and rank studies
    run apart to its claims."""

    STUDY: ClassVar[str] = NAME

    out_dir: str = option("runs/reproduce", help="output directory")
    fold: tuple[str, ...] = option((), help="output directories of an lr or rank study whose results join this "
                                            "report's claims table (needs natural_text)")
    natural_text: bool = option(False, help="run the natural-text study as the last part (left out by default: on a "
                                            "CPU it trains too few tokens to judge its claims; --study text alone)")
    budget_minutes: float | None = option(11.0, gt=0, help="wall-clock budget of the natural-text part: time each "
                                                           "variant's training step first and fit the steps to it "
                                                           "(instead of steps)")
    mechanism: MechanismConfig | None = field(default_factory=MechanismConfig, metadata={
        "help": "the Bigram-Backcopy mechanism study that opens the main job (None: left out)",
        "exclude": ("out_dir", "progress")})
    pretrained: PretrainedConfig | None = field(default_factory=PretrainedConfig, metadata={
        "help": "the real-model study, the main job's second part (None: left out)",
        "exclude": ("out_dir", "progress")})

    def __post_init__(self) -> None:
        for name, kind in (("mechanism", MechanismConfig), ("pretrained", PretrainedConfig)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ConfigError(f"ReproduceConfig.{name} must be a {kind.__name__} or None, "
                                  f"got {type(value).__name__}")
        if self.mechanism is None and self.pretrained is None and not self.natural_text:
            raise ConfigError("ReproduceConfig leaves every part out (mechanism and pretrained None, natural_text "
                              "false): drop --no-mechanism or --no-pretrained, or add --with-text")
        if self.fold and not self.natural_text:
            raise ConfigError("ReproduceConfig.fold joins studies to the natural-text claims: give --with-text "
                              "(natural_text=true) with --fold")
        super().__post_init__()

    @classmethod
    def _quick_fields(cls) -> dict[str, Any]:
        return {"mechanism": MechanismConfig.quick(), "pretrained": PretrainedConfig.quick()}

    @classmethod
    def command(cls) -> str:
        return "gatedattn reproduce"


def reproduce(cfg: TextConfig, command: str | None = None, *, parts: Sequence[MainPart] = (),
              fold: tuple[str, ...] = (), foldable: Mapping[str, Section] = MappingProxyType({}),
              natural_text: bool = True) -> Path:
    """The main job's ``parts`` (each run into ``out``, its results under its key), then,
    with ``natural_text``, the natural-text study of ``cfg``, with the studies written in
    the directories ``fold`` joined to its claims; writes ``results.json`` and
    ``report.md``; returns the report's path. ``foldable``: the results key of each study
    that may be folded in, with its report section (from the study registry)."""
    started = time.time()
    folds = read_folds(fold, tuple(foldable))
    if natural_text:
        out, data_dir, data, results = start_study(cfg)
    else:
        out = Path(cfg.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        results = {"study": cfg.STUDY, "config": {"out_dir": cfg.out_dir, "natural_text": False}}
    for part in parts:
        part_started = time.time()
        say("reproduce", f"{part.key}: starting")
        results[part.key] = part.run(out)
        results[part.key].setdefault("minutes", (time.time() - part_started) / 60)
        say("reproduce", f"{part.key} done in {results[part.key]['minutes']:.1f} min")
        atomic_write_json(out / "results.json", json_safe(results))
    if natural_text:
        cfg = text_part(cfg, data_dir, data, out, results)
        fold_in(results, folds, tuple(foldable))
        results["meta"] = study_meta(cfg, data, command, started)
        results["claims"] = judge_all(results)
    else:
        results["meta"] = run_meta(command or cfg.command(), started)
    atomic_write_json(out / "results.json", json_safe(results))
    return write_report(results, out, sections=list(foldable.values()),
                        parts=[(p.key, p.section) for p in parts])


def rejudge(results: dict[str, Any], parts: Sequence[MainPart] = ()) -> dict[str, Any]:
    """``results`` with every claim judged anew by the current rules: each part's (those
    present), then the natural-text study's (for ``--report-only``)."""
    for part in parts:
        if results.get(part.key):
            part.judge(results[part.key])
    if results.get("variants"):
        results["claims"] = judge_all(results)
    return results


@dataclass(frozen=True)
class MainPart:
    """A part of the main job before natural text, declared by its study: its results key,
    ``run(out) -> results`` (None where only its report is written again), its report
    section ``section(results, out, heading) -> lines`` and ``judge(results)``, which judges
    its claims anew in place."""

    key: str
    run: Callable[[Path], dict[str, Any]] | None
    section: Callable[[dict, Path, str], list[str]]
    judge: Callable[[dict[str, Any]], Any]


def read_folds(dirs: tuple[str, ...], keys: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    """The results of each study directory to fold in (one that holds results under one
    of ``keys``), read and checked before anything trains."""
    folds = []
    for d in dirs:
        if not (Path(d) / "results.json").is_file():
            raise ConfigError(f"ReproduceConfig.fold: {d} has no results.json (give the --out of an lr or rank study)")
        other = read_json_object(Path(d) / "results.json")
        if not any(other.get(k) for k in keys):
            raise ConfigError(f"ReproduceConfig.fold: {d}/results.json holds no {' or '.join(keys)}")
        folds.append((d, other))
    return folds


def fold_in(results: dict[str, Any], folds: list[tuple[str, dict[str, Any]]], keys: tuple[str, ...]) -> None:
    """Join the results (under ``keys``) of each folded study to ``results`` (the claims
    table then judges them too); ``results["folded"]`` records each one's command."""
    for d, other in folds:
        found = [k for k in keys if other.get(k)]
        for key in found:
            results[key] = other[key]
        results.setdefault("folded", []).append(
            {"dir": str(d), "studies": found, "command": (other.get("meta") or {}).get("command"),
             "machine": (other.get("meta") or {}).get("machine")})


# the natural-text study's flags apply to the main job only with --with-text
FLAGS: dict[str, Flag] = {
    **{name: flag if name in ALWAYS else dataclasses.replace(flag, needs=("natural_text", "--with-text"))
       for name, flag in RUN_APART_FLAGS.items()},
    "--fold": Flag("fold", "join the lr or rank study written in DIR (its --out) to this report's claims "
                           "(repeatable)", repeat=True, metavar="DIR"),
    "--no-mechanism": Flag("mechanism", "the main job without its mechanism part (the Bigram-Backcopy study)",
                           value=None, switch=True),
    "--no-pretrained": Flag("pretrained", "the main job without its real-model part", value=None, switch=True),
    "--with-text": Flag("natural_text", "the main job with the natural-text study as its last part (--study text "
                                        "runs it alone)", value=True, switch=True),
    "--model": Flag("pretrained.model", "the real-model part's model: a .gguf file or a model directory (default: "
                                        "the bundled SmolLM2-135M-Instruct)"),
}
