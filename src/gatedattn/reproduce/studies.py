"""The study registry: every ``gatedattn reproduce --study NAME``, declared once.

A study declares its name, its config dataclass (fields documented with ``option(help=...)``),
the command-line flags it takes (each flag sets one key of its config), ``run(cfg,
command) -> report path``, how its report is written again from its ``results.json``
(``--report-only``), its section in a report it is folded into, and the claims its results
settle. ``gatedattn reproduce`` and the main job's report read this table; nothing else
branches on a study's name. A new study is one module (its config, its training and its
report section) and one entry below.

The main job is a composition: the ``mechanism`` study, the ``pretrained`` study and, with
``--with-text``, the ``text`` study, in one output directory and one report (its
``parts``, in the order of ``main_job.PARTS``, each declared in ``MAIN_PARTS``); the
studies with a ``key`` (lr, rank) run apart and fold into the main report's natural-text
claims with ``--fold DIR``.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

from gatedattn.infra.errors import ConfigError
from gatedattn.infra.io import atomic_write_json, json_safe, read_json_object
from gatedattn.reproduce import calibration, lr_study, main_job, rank_sweep
from gatedattn.reproduce.claims import judge_all
from gatedattn.reproduce.main_job import PARTS, MainPart, ReproduceConfig, keyed_part, rejudge, reproduce
from gatedattn.reproduce.mechanism import calibration as mechanism_calibration, config as mechanism_config
from gatedattn.reproduce.mechanism.claims import judge_depths
from gatedattn.reproduce.mechanism.report import mechanism_part, write_mechanism_report
from gatedattn.reproduce.mechanism.results import MechanismResults
from gatedattn.reproduce.mechanism.run import run_part as run_mechanism_part, run_study as run_mechanism
from gatedattn.reproduce.pretrained import config as pretrained_config
from gatedattn.reproduce.pretrained.report import pretrained_part
from gatedattn.reproduce.pretrained.results import PretrainedResults
from gatedattn.reproduce.pretrained import study as pretrained_study
from gatedattn.reproduce.pretrained.study import NAME as PRETRAINED, rewrite_pretrained_report, run_pretrained
from gatedattn.reproduce.registry import Section, Study
from gatedattn.reproduce.report import write_report
from gatedattn.reproduce.text import config as text_config
from gatedattn.reproduce.text.results import TextResults
from gatedattn.reproduce.text.run import start_part as start_text_part


def _fold_sections() -> dict[str, Section]:
    return {s.key: s.section for s in STUDIES.values() if s.key and s.section}


def _judge_text(results: dict[str, Any]) -> None:
    """The natural-text claims judged anew where the job trained it: the part's results
    (the body of ``results.json``) read through :class:`TextResults` and written back in
    place with the claims. The claims read the whole results, since the claims of the
    studies folded in (the lr and rank studies) are judged from their keys beside the
    part's."""
    if results.get("variants"):
        TextResults.from_results(results).replace(claims=judge_all(results)).merge_into(results)


# the main job's parts, each declared once; ``main_job.PARTS`` orders them
MAIN_PARTS: dict[str, MainPart] = {p.key: p for p in (
    keyed_part(mechanism_config.NAME, MechanismResults, run_mechanism_part, judge_depths, mechanism_part),
    keyed_part(PRETRAINED, PretrainedResults, pretrained_study.run_part, pretrained_study.judge_part,
               pretrained_part),
    MainPart(text_config.NAME, start_text_part, _judge_text),
)}


def _run_main(cfg: ReproduceConfig, command: str | None) -> Path:
    return reproduce(cfg.STUDY, Path(cfg.out_dir), [(MAIN_PARTS[key], getattr(cfg, key)) for key in cfg.parts()],
                     command or cfg.command(), record=cfg.record(), fold=cfg.fold, foldable=_fold_sections())


def _run_text(cfg: text_config.TextConfig, command: str | None) -> Path:
    return reproduce(cfg.STUDY, Path(cfg.out_dir), [(MAIN_PARTS[text_config.NAME], cfg)], command or cfg.command(),
                     foldable=_fold_sections())


def _text_report(results: dict[str, Any], out: Path) -> Path:
    parts = [MAIN_PARTS[key] for key in PARTS]
    return write_report(rejudge(results, parts), out, sections=list(_fold_sections().values()),
                        parts=[(p.key, p.section) for p in parts if p.section is not None])


def _mechanism_report(results: dict[str, Any], out: Path) -> Path:
    """The mechanism study's report written again, its claims judged anew; ``results``
    (what ``--report-only`` writes back) takes the claims as judged now."""
    judged = judge_depths(MechanismResults.from_dict(results))
    results.update(judged.to_dict())
    return write_mechanism_report(judged, out)


STUDIES: dict[str, Study] = {s.name: s for s in (
    Study(main_job.NAME, "the main job: the mechanism study and the real-model study (natural text with --with-text)",
          ReproduceConfig, main_job.FLAGS, _run_main, report=_text_report, parts=PARTS),
    Study(PRETRAINED, "a real pretrained LM, frozen: its attention sink and massive activations, whether the sink "
                      "is needed, and whether a learnable sink or an output gate can take its job (default: the "
                      "bundled SmolLM2-135M-Instruct)", pretrained_config.PretrainedConfig, pretrained_config.FLAGS,
          run_pretrained, report=rewrite_pretrained_report),
    Study(text_config.NAME, "the natural-text study alone (the main job's second part)", text_config.TextConfig,
          text_config.RUN_APART_FLAGS, _run_text, report=_text_report),
    Study(mechanism_config.NAME, "the Bigram-Backcopy mechanism study (attention sinks in one-head models, minutes "
                                 "on a CPU)", mechanism_config.MechanismConfig, mechanism_config.FLAGS, run_mechanism,
          report=_mechanism_report),
    Study(lr_study.NAME, "the learning-rate stability study", lr_study.LrConfig, lr_study.FLAGS, lr_study.run_lr,
          report=lr_study.write_lr_report, key=lr_study.KEY, section=lr_study.lr_section, claims=lr_study.CLAIMS),
    Study(rank_sweep.NAME, "the HyGA low-rank width sweep", rank_sweep.RankConfig, rank_sweep.FLAGS,
          rank_sweep.run_rank, report=rank_sweep.write_rank_report, key=rank_sweep.KEY,
          section=rank_sweep.rank_section, claims=rank_sweep.CLAIMS),
    Study("calibrate", "the natural-text sink calibration (when the baseline's first-token sink forms, per lever)",
          calibration.CalibrationConfig, calibration.FLAGS, calibration.run_calibration,
          report=calibration.rewrite_calibration_report, takes_sets=False),
    Study(mechanism_calibration.NAME, "the mechanism recipe's calibration (which recipe grows the full Bigram-Backcopy "
                                 "sink; the gate on every one)", mechanism_calibration.MechCalibrationConfig,
          mechanism_calibration.FLAGS, mechanism_calibration.run_mechanism_calibration, takes_sets=False),
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

