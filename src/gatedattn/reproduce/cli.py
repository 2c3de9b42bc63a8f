"""``gatedattn reproduce``: the project's main job."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from typing import Any, Callable

from gatedattn.errors import ConfigError
from gatedattn.precision import DTYPES
from gatedattn.reproduce.calibration import CalibrationConfig, run_calibration
from gatedattn.reproduce.mechanism import MechanismConfig
from gatedattn.reproduce.mechanism_calibration import MechCalibrationConfig, run_mechanism_calibration
from gatedattn.reproduce.mechanism_report import run_study
from gatedattn.reproduce.runner import ReproduceConfig, reproduce, rewrite_report
from gatedattn.io import check_writable
from gatedattn.settings import apply_sets, help_text, parse_list


def _list_of(kind: type, flag: str):
    def parse(text: str) -> tuple:
        return tuple(parse_list(text, kind, flag))

    return parse


def _run_mechanism(args: argparse.Namespace) -> int:
    given = {"variants": args.variants, "seeds": args.seeds, "steps": args.steps, "seq_len": args.seq_len,
             "micro_batch": args.batch_size, "lr": args.lr, "workers": args.workers, "out_dir": args.out,
             "progress": not args.quiet}
    given = {k: v for k, v in given.items() if v is not None}
    cfg = MechanismConfig.quick(**given) if args.quick else MechanismConfig(**given)
    flags = {"variants": "--variants", "seeds": "--seeds", "steps": "--steps", "seq_len": "--seq-len",
             "micro_batch": "--batch-size", "lr": "--lr", "workers": "--workers", "out_dir": "--out"}
    cfg = apply_sets(cfg, args.set or [], flags)
    check_writable(cfg.out_dir, "--out", kind="dir")
    print(f"report: {run_study(cfg, command=_command())}")
    return 0


def _run_calibration(args: argparse.Namespace) -> int:
    given = {"levers": args.levers, "minutes_per_run": args.budget_minutes, "steps": args.steps,
             "data_dir": args.data, "out_dir": args.out, "base_sets": tuple(args.set or ()),
             "progress": not args.quiet}
    given = {k: v for k, v in given.items() if v is not None}
    cfg = CalibrationConfig.quick(**given) if args.quick else CalibrationConfig(**given)
    check_writable(cfg.out_dir, "--out", kind="dir")
    print(f"report: {run_calibration(cfg, command=_command())}")
    return 0


def _run_mechanism_calibration(args: argparse.Namespace) -> int:
    given = {"levers": args.levers, "steps": args.steps, "workers": args.workers, "out_dir": args.out,
             "progress": not args.quiet}
    given = {k: v for k, v in given.items() if v is not None}
    cfg = MechCalibrationConfig.quick(**given) if args.quick else MechCalibrationConfig(**given)
    check_writable(cfg.out_dir, "--out", kind="dir")
    print(f"report: {run_mechanism_calibration(cfg, command=_command())}")
    return 0


def _command() -> str | None:
    return "gatedattn " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] else None


def _default_out(args: argparse.Namespace) -> str | None:
    """Each study writes to a directory of its own unless --out says otherwise, so that one
    study's runs are never resumed as another's (None: the config's default)."""
    study = STUDIES[args.study or "main"]
    if not study.own_dir:
        return None
    return f"runs/reproduce-{study.name}" + ("-quick" if args.quick else "")


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The ``ReproduceConfig`` fields the flags give (a flag left out gives nothing)."""
    given = {
        "variants": args.variants, "seeds": args.seeds, "budget_minutes": args.budget_minutes,
        "steps": args.steps, "preset": args.preset, "seq_len": args.seq_len, "micro_batch": args.batch_size,
        "lr": args.lr, "lrs": args.lrs, "dtype": args.dtype, "data_dir": args.data, "out_dir": args.out or _default_out(args),
        "multiples": args.multiples, "study": args.study, "progress": not args.quiet,
        "ranks": args.ranks, "fold": tuple(args.fold) if args.fold else None,
    }
    given = {k: v for k, v in given.items() if v is not None}
    if args.no_mechanism:
        given["mechanism"] = None
    if args.budget_minutes is not None and args.steps is None:
        given["steps"] = None  # the budget decides the steps
    if args.steps is not None and args.budget_minutes is None:
        given["budget_minutes"] = None  # a fixed step count replaces the default budget
    return given


# ReproduceConfig keys a flag sets: a flag and --set may not both give a field
_FLAG_KEYS = {"variants": "--variants", "seeds": "--seeds", "budget_minutes": "--budget-minutes",
              "steps": "--steps", "train.model.size": "--preset", "train.seq_len": "--seq-len",
              "train.micro_batch": "--batch-size", "train.lr": "--lr", "lrs": "--lrs", "train.dtype": "--dtype",
              "multiples": "--multiples", "study": "--study", "ranks": "--ranks", "fold": "--fold"}


def _reproduce_config(args: argparse.Namespace) -> ReproduceConfig:
    """The ``ReproduceConfig`` of the main, lr and rank studies, from the flags and ``--set``."""
    given = _given(args)
    cfg = ReproduceConfig.quick(**given) if args.quick else ReproduceConfig(**given)
    # the run's place and data come from flags only
    flags = {"out_dir": "--out", "train.data_dir": "--data",
             **{k: f for k, f in _FLAG_KEYS.items() if getattr(args, f[2:].replace("-", "_"), None) is not None}}
    return apply_sets(cfg, args.set or [], flags)


def _run_reproduction(args: argparse.Namespace) -> int:
    cfg = _reproduce_config(args)
    if args.report_only:
        print(f"report: {rewrite_report(cfg.out_dir)}")
        return 0
    check_writable(cfg.out_dir, "--out", kind="dir")
    print(f"report: {reproduce(cfg, command=_command())}")
    return 0


@dataclass(frozen=True)
class Study:
    """One ``--study``: what it does (its help), the flags it takes besides --out, --quick
    and -q, and how it runs."""

    name: str
    help: str
    flags: tuple[str, ...]
    run: Callable[[argparse.Namespace], int]
    own_dir: bool = True  # its default --out is runs/reproduce-<name> (else its config's)


_REPRODUCTION_FLAGS = ("--variants", "--budget-minutes", "--steps", "--seeds", "--data", "--preset", "--seq-len",
                       "--batch-size", "--lr", "--lrs", "--ranks", "--fold", "--dtype", "--multiples", "--set",
                       "--report-only")
STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("main", "the main job: the mechanism study, then natural text", (*_REPRODUCTION_FLAGS, "--no-mechanism"),
          _run_reproduction, own_dir=False),
    Study("lr", "the learning-rate stability study", _REPRODUCTION_FLAGS, _run_reproduction),
    Study("rank", "the HyGA low-rank width sweep", _REPRODUCTION_FLAGS, _run_reproduction),
    Study("mechanism", "the Bigram-Backcopy mechanism study (attention sinks in one-head models, minutes on a CPU)",
          ("--variants", "--steps", "--seeds", "--seq-len", "--batch-size", "--lr", "--workers", "--set"),
          _run_mechanism),
    Study("calibrate", "the natural-text sink calibration (when the baseline's first-token sink forms, per lever)",
          ("--levers", "--budget-minutes", "--steps", "--data", "--set"), _run_calibration),
    Study("calibrate-mechanism", "the mechanism recipe's calibration (which recipe grows the full Bigram-Backcopy "
                                 "sink; the gate on every one)", ("--levers", "--steps", "--workers"),
          _run_mechanism_calibration),
)}
_ALWAYS = ("--study", "--out", "--quick", "--quiet")


def _check_flags(study: Study, args: argparse.Namespace) -> None:
    """Refuse, in one line, every flag given that the study does not take."""
    known = dict.fromkeys(f for s in STUDIES.values() for f in s.flags)  # every study flag, in order
    given = [f for f in known if getattr(args, f[2:].replace("-", "_"), None) not in (None, False)]
    unused = [f for f in given if f not in study.flags]
    if unused:
        takes = ", ".join(study.flags + _ALWAYS)
        raise ConfigError(f"{', '.join(unused)} do not apply to --study {study.name}; it takes {takes}")


def _run(args: argparse.Namespace) -> int:
    study = STUDIES[args.study or "main"]
    _check_flags(study, args)
    return study.run(args)


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
    p.add_argument("--out", help="output directory (default runs/reproduce, runs/reproduce-<study> for --study lr "
                                 "and rank; -quick appended with --quick)")
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
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="set any field of the reproduction or its training (repeatable; keys below)")
    p.add_argument("--no-mechanism", action="store_true",
                   help="the main job without its first part (the Bigram-Backcopy mechanism study): natural text only")
    p.add_argument("--report-only", action="store_true",
                   help="main, lr, rank: write report.md and the plots again from --out's results.json (no training; "
                        "the claims judged anew)")
    p.add_argument("--quick", action="store_true", help="a ~1 minute smoke run of the whole pipeline")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_run)
