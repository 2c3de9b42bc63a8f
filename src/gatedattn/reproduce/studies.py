"""The study registry: every ``gatedattn reproduce --study NAME``, declared once.

A study declares its name, its config dataclass (fields documented with ``option(help=...)``),
the command-line flags it takes (each flag sets one key of its config), ``run(cfg,
command) -> report path``, how its report is written again from its ``results.json``
(``--report-only``), its section in a report it is folded into, and the claims its results
settle. ``gatedattn reproduce`` and the main job's report read this table; nothing else
branches on a study's name. A new study is one module (its config, its training and its
report section) and one entry below.

The main job is a composition: the ``mechanism`` study, then the ``text`` study, in one
output directory and one report (its ``parts``); the studies with a ``key`` (lr, rank)
run apart and fold into the main report with ``--fold DIR``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from gatedattn.infra.errors import ConfigError
from gatedattn.infra.io import atomic_write_json, json_safe, read_json_object
from gatedattn.reproduce.calibration import CalibrationConfig, rewrite_calibration_report, run_calibration
from gatedattn.reproduce.lr_study import CLAIMS as LR_CLAIMS, KEY as LR_KEY, LrConfig, lr_section, run_lr, write_lr_report
from gatedattn.reproduce.mechanism import MechanismConfig, judge_depths
from gatedattn.reproduce.mechanism_calibration import MechCalibrationConfig, run_mechanism_calibration
from gatedattn.reproduce.mechanism_report import mechanism_part, run_study as run_mechanism, write_mechanism_report
from gatedattn.reproduce.rank_sweep import (
    CLAIMS as RANK_CLAIMS, KEY as RANK_KEY, RankConfig, rank_section, run_rank, write_rank_report,
)
from gatedattn.reproduce.report import Section, write_report
from gatedattn.reproduce.pretrained.config import PretrainedConfig
from gatedattn.reproduce.pretrained.report import pretrained_part
from gatedattn.reproduce.pretrained.study import NAME as PRETRAINED, rewrite_pretrained_report, run_pretrained
from gatedattn.reproduce.runner import (
    MainPart, ReproduceConfig, TextConfig, rejudge, reproduce, run_mechanism_part, run_pretrained_part,
)


@dataclass(frozen=True)
class Flag:
    """What one command-line flag sets in a study's config: ``key`` (dotted) to the flag's
    value, or to ``value`` where one is given (a switch); ``clears`` keys set to None with
    it (a field it replaces); an ``only_flag`` key may not be given by ``--set`` either."""

    key: str
    value: Any = None
    clears: tuple[str, ...] = ()
    only_flag: bool = False
    switch: bool = False


@dataclass(frozen=True)
class Study:
    name: str
    help: str
    config: type
    flags: Mapping[str, Flag]
    run: Callable[[Any, str | None], Path]  # trains, writes results.json and report.md; the report's path
    report: Callable[[dict[str, Any], Path], Path] | None = None  # report.md again from results.json
    key: str | None = None  # where its results sit in results.json, for folding into the main job
    section: Section | None = None  # its lines in a report it is folded into
    claims: tuple[str, ...] = ()  # the claims (keys of CLAIMS) its results settle
    parts: tuple[str, ...] = ()  # the registered studies it runs, in order
    takes_sets: bool = True  # --set KEY=VALUE changes its config

    def flag_names(self) -> tuple[str, ...]:
        """Every flag the study takes (besides --study, --out, --quick and --quiet)."""
        return (*(f for f in self.flags if f not in ALWAYS), *(("--set",) if self.takes_sets else ()),
                *(("--report-only",) if self.report else ()))


# the flags every natural-text study shares
_OUT, _QUIET = "--out", "--quiet"
ALWAYS = ("--study", _OUT, "--quick", _QUIET)
_TEXT_FLAGS = {
    "--budget-minutes": Flag("budget_minutes", clears=("steps",)), "--steps": Flag("steps", clears=("budget_minutes",)),
    "--seeds": Flag("seeds"), "--data": Flag("train.data_dir", only_flag=True), "--preset": Flag("train.model.size"),
    "--seq-len": Flag("train.seq_len"), "--batch-size": Flag("train.micro_batch"), "--lr": Flag("train.lr"),
    "--dtype": Flag("train.dtype"), "--multiples": Flag("multiples"), _OUT: Flag("out_dir", only_flag=True),
    _QUIET: Flag("train.progress", value=False, switch=True),
}
_RUN_APART = {"--variants": Flag("variants"), **_TEXT_FLAGS}


def _fold_sections() -> dict[str, Section]:
    return {s.key: s.section for s in STUDIES.values() if s.key and s.section}


def _main_parts(cfg: ReproduceConfig | None = None) -> list[MainPart]:
    """The main job's parts before natural text, in order (those its config leaves out
    left out; with no config, every one, for writing a report again)."""
    parts = [("mechanism", run_mechanism_part, mechanism_part), ("pretrained", run_pretrained_part, pretrained_part)]
    return [MainPart(key, functools.partial(run, getattr(cfg, key)) if cfg is not None else None, section)
            for key, run, section in parts if cfg is None or getattr(cfg, key) is not None]


def _run_main(cfg: ReproduceConfig, command: str | None) -> Path:
    return reproduce(cfg, command, parts=_main_parts(cfg), fold=cfg.fold, foldable=_fold_sections())


def _run_text(cfg: TextConfig, command: str | None) -> Path:
    return reproduce(cfg, command, foldable=_fold_sections())


def _text_report(results: dict[str, Any], out: Path) -> Path:
    return write_report(rejudge(results), out, sections=list(_fold_sections().values()),
                        parts=[(p.key, p.section) for p in _main_parts()])


def _mechanism_report(results: dict[str, Any], out: Path) -> Path:
    return write_mechanism_report(judge_depths(results), out)


STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("main", "the main job: the mechanism study, the real-model study, then natural text", ReproduceConfig,
          {**_RUN_APART, "--fold": Flag("fold"), "--no-mechanism": Flag("mechanism", value=None, switch=True),
           "--no-pretrained": Flag("pretrained", value=None, switch=True), "--model": Flag("pretrained.model")},
          _run_main, report=_text_report, parts=("mechanism", PRETRAINED, "text")),
    Study(PRETRAINED, "a real pretrained LM, frozen: its attention sink and massive activations, whether the sink "
                      "is needed, and whether a learnable sink or an output gate can take its job (default: the "
                      "bundled SmolLM2-135M-Instruct)", PretrainedConfig,
          {"--model": Flag("model"), "--steps": Flag("steps"), "--seeds": Flag("seeds"), "--seq-len": Flag("seq_len"),
           "--first-token": Flag("first_token"), _OUT: Flag("out_dir", only_flag=True),
           _QUIET: Flag("progress", value=False, switch=True)},
          run_pretrained, report=rewrite_pretrained_report),
    Study("text", "the natural-text study alone (the main job's second part)", TextConfig, _RUN_APART, _run_text,
          report=_text_report),
    Study("mechanism", "the Bigram-Backcopy mechanism study (attention sinks in one-head models, minutes on a CPU)",
          MechanismConfig,
          {"--variants": Flag("variants"), "--steps": Flag("steps"), "--seeds": Flag("seeds"),
           "--seq-len": Flag("seq_len"), "--batch-size": Flag("micro_batch"), "--lr": Flag("lr"),
           "--workers": Flag("workers"), _OUT: Flag("out_dir", only_flag=True),
           _QUIET: Flag("progress", value=False, switch=True)},
          run_mechanism, report=_mechanism_report),
    Study("lr", "the learning-rate stability study", LrConfig, {**_RUN_APART, "--lrs": Flag("lrs")}, run_lr,
          report=write_lr_report, key=LR_KEY, section=lr_section, claims=LR_CLAIMS),
    Study("rank", "the HyGA low-rank width sweep", RankConfig, {**_TEXT_FLAGS, "--ranks": Flag("ranks")}, run_rank,
          report=write_rank_report, key=RANK_KEY, section=rank_section, claims=RANK_CLAIMS),
    Study("calibrate", "the natural-text sink calibration (when the baseline's first-token sink forms, per lever)",
          CalibrationConfig,
          {"--levers": Flag("levers"), "--budget-minutes": Flag("minutes_per_run"), "--steps": Flag("steps"),
           "--data": Flag("data_dir"), "--set": Flag("base_sets"), _OUT: Flag("out_dir"),
           _QUIET: Flag("progress", value=False, switch=True)},
          run_calibration, report=rewrite_calibration_report, takes_sets=False),
    Study("calibrate-mechanism", "the mechanism recipe's calibration (which recipe grows the full Bigram-Backcopy "
                                 "sink; the gate on every one)", MechCalibrationConfig,
          {"--levers": Flag("levers"), "--steps": Flag("steps"), "--workers": Flag("workers"), _OUT: Flag("out_dir"),
           _QUIET: Flag("progress", value=False, switch=True)},
          run_mechanism_calibration, takes_sets=False),
)}

STUDY_OF_CONFIG = MappingProxyType({s.config: s for s in STUDIES.values()})


def run(cfg: Any, command: str | None = None) -> Path:
    """Run the study whose config ``cfg`` is; returns the path of its report."""
    study = STUDY_OF_CONFIG.get(type(cfg))
    if study is None:
        raise ConfigError(f"no study takes a {type(cfg).__name__}; the studies' configs are: "
                          f"{', '.join(c.__name__ for c in STUDY_OF_CONFIG)}")
    return study.run(cfg, command)


def rewrite(study: Study, out: str | Path) -> Path:
    """``--report-only``: ``report.md`` and its plots written again from ``out/results.json``,
    no training and no timing, every claim judged anew by the current rules (so a report
    regenerates after a change to the report or the rules)."""
    out = Path(out)
    path = out / "results.json"
    if study.report is None:
        raise ConfigError(f"--report-only does not apply to --study {study.name}")
    if not path.is_file():
        raise ConfigError(f"--report-only: {out} has no results.json (give the --out of a finished study)")
    results = read_json_object(path)
    # results.json written before results recorded their study: trust --study; a study whose
    # results the same report writer reads (main and text) is accepted
    wrote = results.get("study")
    if wrote is not None and (wrote not in STUDIES or STUDIES[wrote].report is not study.report):
        raise ConfigError(f"--report-only: {out} holds the results of --study {wrote}, not {study.name}; "
                          f"give --study {wrote}")
    try:
        report = study.report(results, out)
    except (KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"--report-only: {path} does not hold the results of --study {study.name} "
                          f"(missing {e})") from None
    atomic_write_json(path, json_safe(results))  # the claims as judged now
    return report

