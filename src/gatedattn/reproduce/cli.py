"""``gatedattn reproduce``: the project's main job and its studies (see
:mod:`gatedattn.reproduce.studies` for the registry this command reads)."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any

from gatedattn.data.prepare import MIN_VOCAB
from gatedattn.infra.device import model_device
from gatedattn.infra.errors import ConfigError, GatedAttnError
from gatedattn.infra.guard import study_output
from gatedattn.infra.inputs import input_options
from gatedattn.infra.io import read_json_object
from gatedattn.infra.sizes import check_training_size
from gatedattn.infra.settings import help_text, parse_sets, settings, with_values
from gatedattn.reproduce.registry import ALWAYS, QUIET_FLAG, Flag, Study
from gatedattn.reproduce.studies import STUDIES, rewrite
from gatedattn.train.config import TrainConfig

CLI_FLAGS = ("--study", "--set", "--report-only", "--quick")  # declared by the command itself


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def _is_given(value: Any) -> bool:
    """A flag left out reads None (False for a switch, [] for a list); 0 is a value."""
    return value is not None and value is not False and value != []


def _command() -> str | None:
    return "gatedattn " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] else None


def _given(args: argparse.Namespace) -> list[str]:
    """Every study flag given on the command line, in the order of the registry."""
    known = dict.fromkeys(f for s in STUDIES.values() for f in s.flag_names())
    return [f for f in known if _is_given(getattr(args, _dest(f), None))]


def _check_flags(study: Study, args: argparse.Namespace) -> None:
    """Refuse, in one line, every flag given that the study does not take."""
    unused = [f for f in _given(args) if f not in study.flag_names()]
    if unused:
        takes = ", ".join(study.flag_names() + ALWAYS)
        raise ConfigError(f"{', '.join(unused)} do not apply to --study {study.name}; it takes {takes}")


def study_config(study: Study, args: argparse.Namespace) -> Any:
    """The study's config: its defaults (or its ``quick`` run's), each given flag's value
    at the key it sets (a part switched on before the keys under it), then ``--set``
    items (a key a given flag sets, or an ``only_flag`` key, may not also come from
    ``--set``). A flag or ``--set`` key under a part of the study that is left out is
    refused, naming the flag that switches the part on; ``--quiet`` (which every study
    takes) quiets only the parts that run."""
    values: dict[str, Any] = {}
    refused: dict[str, str] = {}
    for flag, spec in study.flags.items():
        given = getattr(args, _dest(flag), None)
        if spec.only_flag:
            refused[spec.key] = flag
        if not _is_given(given):
            continue
        values.update(dict.fromkeys(spec.clears))
        values[spec.key] = _switch_value(spec, args.quick) if spec.switch else \
            tuple(given) if isinstance(given, list) else given
        refused[spec.key] = flag
    cfg = study.config.quick() if args.quick else study.config()
    left_out: dict[str, str] = {}  # flag -> the part it applies to, left out
    for flag, spec in study.flags.items():
        part = _part_left_out(study, spec.key, cfg, values)
        if part and _is_given(getattr(args, _dest(flag), None)):
            if flag in ALWAYS:
                values.pop(spec.key)
            else:
                left_out[flag] = part
    # built with those parts switched on, so that a bad value is named first, as where they run
    switched = {part: _switch_value(study.flags[on], args.quick)
                for part in left_out.values() if (on := _switch_on(study, part))}
    cfg = with_values(cfg, dict(sorted({**values, **switched}.items(), key=lambda kv: kv[0].count("."))))
    if left_out:
        raise ConfigError(_left_out(study, *next(iter(left_out.items()))))
    if not study.takes_sets:
        return cfg
    sets = {".".join(path): value for path, value in parse_sets(type(cfg), args.set or [], refused).items()}
    for key in sets:
        part = _part_left_out(study, key, cfg, {})
        if part:
            raise ConfigError(_left_out(study, f"--set {key}", part))
    return with_values(cfg, sets)


def _switch_value(spec: Flag, quick: bool) -> Any:
    """What a switch sets: its value, or the config its callable value makes (as a tree)."""
    if not callable(spec.value):
        return spec.value
    made = spec.value(quick)
    return made.to_dict() if hasattr(made, "to_dict") else made


def _part_left_out(study: Study, key: str, cfg: Any, values: dict[str, Any]) -> str | None:
    """The part of ``study`` that ``key`` lies under where it is left out (None in
    ``values``, else in ``cfg``); else None."""
    part, dot, _ = key.partition(".")
    if not dot or part not in study.parts:
        return None
    return part if values.get(part, getattr(cfg, part)) is None else None


def _switch_on(study: Study, part: str) -> str | None:
    """The flag that switches ``part`` on, if the study has one."""
    return next((flag for flag, spec in study.flags.items()
                 if spec.key == part and spec.switch and spec.value is not None), None)


def _left_out(study: Study, what: str, part: str) -> str:
    """The one-line refusal of ``what`` (a flag, or ``--set KEY``) under ``part``, left out."""
    on = _switch_on(study, part)
    if on:
        alone = f" (or use --study {part})" if part in STUDIES else ""
        return f"{what} applies to the {part} part, which this study runs only with {on}; add {on}{alone}"
    off = next((flag for flag, spec in study.flags.items() if spec.key == part and spec.switch), "this run")
    return f"{what} applies to the {part} part, which {off} leaves out"


def _run(args: argparse.Namespace) -> int:
    study = STUDIES[args.study or "main"]
    _check_flags(study, args)
    cfg = study_config(study, args)
    if args.report_only:
        print(f"report: {rewrite(study, cfg.out_dir)}")
        return 0
    check_training_sizes(cfg)  # before the data is prepared or anything trains
    with study_output(cfg.out_dir, budget_minutes=getattr(cfg, "budget_minutes", None),
                      study=study.name):  # budget, lock, another study's output refused, signals
        print(f"report: {study.run(cfg, _command())}")
    return 0


def _train_configs(obj: Any) -> list[Any]:
    """The ``TrainConfig`` recipes in the study config ``obj`` (its fields, walked)."""
    if isinstance(obj, TrainConfig):
        return [obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in _train_configs(getattr(obj, f.name))]
    return []


def _data_vocab(data_dir: str | None) -> int | None:
    """The vocabulary of a prepared data directory's manifest, where it can be read."""
    if not data_dir or not (Path(data_dir) / "manifest.json").is_file():
        return None
    try:
        vocab = read_json_object(Path(data_dir) / "manifest.json").get("vocab_size")
    except (GatedAttnError, OSError):
        return None
    return vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None


def check_training_sizes(cfg: Any) -> None:
    """Every training recipe of the study (``--batch-size``, ``--seq-len``, ``--preset``)
    against the memory of its device (``sizes.check_training_size``, with the vocabulary
    of ``--data``, or the smallest one ``data prepare`` makes when the data is not there
    yet), before any data is prepared or any run trains."""
    for train in _train_configs(cfg):
        if train.init_from is not None:
            continue
        model = train.model_config(_data_vocab(train.data_dir) or MIN_VOCAB)
        try:
            check_training_size(train, model, model_device(train.device))
        except GatedAttnError as e:
            raise GatedAttnError(f"--batch-size {train.micro_batch}, --seq-len {train.seq_len}, --preset "
                                 f"{train.model.size}: {e}") from None


def _kind(flag: Flag) -> tuple:
    """What must agree between flags of the same name in several studies."""
    return (getattr(flag.type, "kind", flag.type), flag.switch, flag.repeat, flag.choices)


def flag_help(flag: Flag, field_helps: dict[str, str]) -> str:
    """A flag's help: its own, else the help of the config field it sets (``field_helps``:
    the study's ``--set`` keys and their helps)."""
    return flag.help or field_helps.get(flag.key, "")


def study_arguments() -> dict[str, dict[str, Any]]:
    """Every flag of every registered study once, as ``add_argument`` keywords; where
    studies give a flag different helps, each study's is shown, named."""
    uses: dict[str, list[tuple[Study, Flag]]] = {}
    for study in STUDIES.values():
        for name, flag in study.flags.items():
            if name not in CLI_FLAGS:
                uses.setdefault(name, []).append((study, flag))
    arguments, field_helps = {}, {}
    for name, pairs in uses.items():
        kinds = {_kind(f) for _, f in pairs}
        if len(kinds) > 1:
            raise GatedAttnError(f"the studies declare {name} differently (type, switch, repeat or choices): "
                                 f"{', '.join(s.name for s, _ in pairs)}")
        flag = pairs[0][1]
        helps: dict[str, list[str]] = {}
        for study, f in pairs:
            if study.name not in field_helps:  # walked once per study, not once per flag
                field_helps[study.name] = {s.key: s.help for s in settings(study.config)}
            helps.setdefault(flag_help(f, field_helps[study.name]), []).append(study.name)
        text = next(iter(helps)) if len(helps) == 1 else "; ".join(
            f"--study {', '.join(names)}: {h}" for h, names in helps.items())
        if flag.switch:
            kw: dict[str, Any] = {"action": "store_true"}
        else:
            kw = {"action": "append" if flag.repeat else "store"}
            if flag.type is not None:
                kw["type"] = flag.type
            if flag.choices is not None:
                kw["choices"] = flag.choices
            if flag.metavar is not None:
                kw["metavar"] = flag.metavar
        arguments[name] = {**kw, "help": text.replace("%", "%%")}
    return arguments


def register(sub) -> None:
    p = sub.add_parser("reproduce", help="train baseline and gated variants alike and report the papers' claims",
                       description="Train each variant on the same data, in the same order, for the same tokens; "
                                   "analyse each; write report.md, plots and results.json. Each study declares its "
                                   "own flags; a flag a study does not take is refused.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=help_text(STUDIES["main"].config))
    p.add_argument("--study", choices=tuple(STUDIES),
                   help="; ".join(f"{s.name}: {s.help}" for s in STUDIES.values()) + " (default main)")
    for name, kw in study_arguments().items():
        p.add_argument(*(("-q", name) if name == QUIET_FLAG else (name,)), **kw)
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="set any field of the study's config (repeatable; "
                                                                       "the main job's keys below)")
    p.add_argument("--report-only", action="store_true",
                   help="write report.md and the plots again from --out's results.json (no training; the claims "
                        "judged anew)")
    p.add_argument("--quick", action="store_true", help="a ~1 minute smoke run of the whole pipeline")
    p.set_defaults(func=_run, **input_options(("--data", "data"), ("--model", "model"), ("--fold", "fold")))
