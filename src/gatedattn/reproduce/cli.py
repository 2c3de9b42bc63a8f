"""``gatedattn reproduce``: the project's main job and its studies (see
:mod:`gatedattn.reproduce.studies` for the registry this command reads)."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from gatedattn.infra.errors import ConfigError
from gatedattn.infra.guard import study_output
from gatedattn.infra.precision import DTYPES
from gatedattn.reproduce.runner import ReproduceConfig
from gatedattn.reproduce.studies import ALWAYS, STUDIES, Study, rewrite
from gatedattn.infra.settings import apply_sets, help_text, parse_list, with_values


def _list_of(kind: type, flag: str):
    def parse(text: str) -> tuple:
        return tuple(parse_list(text, kind, flag))

    return parse


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
    at the key it sets, then ``--set`` items (a key a given flag sets, or an
    ``only_flag`` key, may not also come from ``--set``)."""
    values: dict[str, Any] = {}
    refused: dict[str, str] = {}
    for flag, spec in study.flags.items():
        given = getattr(args, _dest(flag), None)
        if spec.only_flag:
            refused[spec.key] = flag
        if not _is_given(given):
            continue
        values.update(dict.fromkeys(spec.clears))
        values[spec.key] = spec.value if spec.switch else tuple(given) if isinstance(given, list) else given
        refused[spec.key] = flag
    cfg = study.config.quick() if args.quick else study.config()
    cfg = with_values(cfg, values)
    return apply_sets(cfg, args.set or [], refused) if study.takes_sets else cfg


def _run(args: argparse.Namespace) -> int:
    study = STUDIES[args.study or "main"]
    _check_flags(study, args)
    cfg = study_config(study, args)
    if args.report_only:
        print(f"report: {rewrite(study, cfg.out_dir)}")
        return 0
    with study_output(cfg.out_dir, budget_minutes=getattr(cfg, "budget_minutes", None)):  # budget, lock, signals
        print(f"report: {study.run(cfg, _command())}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("reproduce", help="train baseline and gated variants alike and report the papers' claims",
                       description="Train each variant on the same data, in the same order, for the same tokens; "
                                   "analyse each; write report.md, plots and results.json.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=help_text(ReproduceConfig))
    p.add_argument("--variants", type=_list_of(str, "--variants"), help="comma-separated presets (default baseline,gated)")
    p.add_argument("--budget-minutes", type=float,
                   help="wall-clock budget (default 20): time each variant's step here first and fit the steps to it")
    p.add_argument("--steps", type=int, help="fixed training steps per run instead of a budget (--quick: 40)")
    p.add_argument("--seeds", type=int, help="seeds per variant (default 3; --quick: 1); with 2+ the report tests seed noise")
    p.add_argument("--data", help="prepared data directory (default: the bundled corpus, prepared once)")
    p.add_argument("--out", help="output directory (default runs/reproduce, runs/reproduce-<study> for the other "
                                 "studies; -quick appended with --quick)")
    p.add_argument("--preset", help="model size preset (default small)")
    p.add_argument("--seq-len", type=int, help="training context (default 256)")
    p.add_argument("--batch-size", type=int, help="sequences per step (default 16)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 1e-2)")
    p.add_argument("--lrs", type=_list_of(float, "--lrs"), help="learning-rate ladder for --study lr")
    p.add_argument("--ranks", type=_list_of(int, "--ranks"),
                   help="--study rank: hyga-lowrank inner widths d_int (default 8,16,32,64)")
    p.add_argument("--fold", action="append", metavar="DIR",
                   help="join the lr or rank study written in DIR (its --out) to this report's claims (repeatable)")
    p.add_argument("--dtype", choices=DTYPES,
                   help="auto (default): bf16 autocast where the device computes bf16 natively, else fp32")
    p.add_argument("--multiples", type=_list_of(int, "--multiples"), help="extrapolation lengths as multiples of the context (default 1,2,4,8)")
    p.add_argument("--study", choices=tuple(STUDIES),
                   help="; ".join(f"{s.name}: {s.help}" for s in STUDIES.values()) + " (default main)")
    p.add_argument("--levers", type=_list_of(str, "--levers"),
                   help="--study calibrate and calibrate-mechanism: levers to measure (default all; an unknown name "
                        "lists them)")
    p.add_argument("--workers", type=int, help="--study mechanism and calibrate-mechanism: runs trained at a time "
                                                "(default 2)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="set any field of the study's config (repeatable; "
                                                                       "the main job's keys below)")
    p.add_argument("--no-mechanism", action="store_true",
                   help="the main job without its mechanism part (the Bigram-Backcopy study)")
    p.add_argument("--no-pretrained", action="store_true",
                   help="the main job without its real-model part")
    p.add_argument("--model", help="--study pretrained (and the main job's real-model part): the model, a .gguf file or "
                                   "a model directory (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--first-token", help="--study pretrained: the first position, bos (the model's BOS, default), "
                                         "none (an ordinary text token) or a token id")
    p.add_argument("--report-only", action="store_true",
                   help="write report.md and the plots again from --out's results.json (no training; the claims "
                        "judged anew)")
    p.add_argument("--quick", action="store_true", help="a ~1 minute smoke run of the whole pipeline")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_run)
