"""``gatedattn reproduce``: the project's main job."""

from __future__ import annotations

import argparse
import shlex
import sys

from gatedattn.precision import DTYPES
from gatedattn.reproduce.runner import ReproduceConfig, reproduce
from gatedattn.settings import apply_sets, help_text, parse_list


def _list_of(kind: type, flag: str):
    def parse(text: str) -> tuple:
        return tuple(parse_list(text, kind, flag))

    return parse


def _run(args: argparse.Namespace) -> int:
    given = {
        "variants": args.variants, "seeds": args.seeds, "budget_minutes": args.budget_minutes,
        "steps": args.steps, "preset": args.preset, "seq_len": args.seq_len, "micro_batch": args.batch_size,
        "lr": args.lr, "lrs": args.lrs, "dtype": args.dtype, "data_dir": args.data, "out_dir": args.out,
        "multiples": args.multiples, "study": args.study, "progress": not args.quiet,
    }
    given = {k: v for k, v in given.items() if v is not None}
    if args.budget_minutes is not None and args.steps is None:
        given["steps"] = None  # the budget decides the steps
    cfg = ReproduceConfig.quick(**given) if args.quick else ReproduceConfig(**given)
    cfg = apply_sets(cfg, args.set or [])
    command = "gatedattn " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] else None
    report = reproduce(cfg, command=command)
    print(f"report: {report}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("reproduce", help="train baseline and gated variants alike and report the papers' claims",
                       description="Train each variant on the same data, in the same order, for the same tokens; "
                                   "analyse each; write report.md, plots and results.json.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=help_text(ReproduceConfig))
    p.add_argument("--variants", type=_list_of(str, "--variants"), help="comma-separated presets (default baseline,gated)")
    p.add_argument("--budget-minutes", type=float, help="wall-clock budget: time each variant here and fit the steps to it")
    p.add_argument("--steps", type=int, help="training steps per run (default 700; --quick 40)")
    p.add_argument("--seeds", type=int, help="seeds per variant (default 1); with 2+ the report tests seed noise")
    p.add_argument("--data", help="prepared data directory (default: the bundled corpus, prepared once)")
    p.add_argument("--out", help="output directory (default runs/reproduce)")
    p.add_argument("--preset", help="model size preset (default small)")
    p.add_argument("--seq-len", type=int, help="training context (default 256)")
    p.add_argument("--batch-size", type=int, help="sequences per step (default 16)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 3e-3)")
    p.add_argument("--lrs", type=_list_of(float, "--lrs"), help="learning-rate ladder for --study lr")
    p.add_argument("--dtype", choices=DTYPES,
                   help="auto (default): bf16 autocast where the device computes bf16 natively, else fp32")
    p.add_argument("--multiples", type=_list_of(int, "--multiples"), help="extrapolation lengths as multiples of the context (default 1,2,4,8)")
    p.add_argument("--study", choices=("main", "lr"), help="main (default) or the learning-rate stability study")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="set any field of the reproduction or its training (repeatable; keys below)")
    p.add_argument("--quick", action="store_true", help="a ~1 minute smoke run of the whole pipeline")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_run)
