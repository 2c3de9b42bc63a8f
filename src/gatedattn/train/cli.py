"""``gatedattn train`` and ``gatedattn sweep``.

    gatedattn train --variant NAME --preset SIZE --data DIR --out DIR [--set KEY=VALUE ...] [--resume]
    gatedattn sweep --variants A,B --lr 1e-3,3e-3 [--seeds 0,1] --preset SIZE --data DIR --out DIR
                    [--set KEY=VALUE ...] [--resume]

Under ``torchrun`` the same commands train data-parallel. ``python -m gatedattn.train.cli``
runs these two subcommands on their own.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

from gatedattn.settings import help_text, parse_list
from gatedattn.train.config import TrainConfig


def _keys_epilog() -> str:
    return help_text(TrainConfig)


def _base(args) -> dict:
    return {"data_dir": args.data, "out_dir": args.out, "variant": getattr(args, "variant", "baseline"),
            "preset": args.preset}


def _summary_line(r) -> str:
    def f(x):
        return "–" if x is None else f"{x:.4f}"

    line = (f"{r.out_dir}: {r.steps}/{r.total_steps} steps, {r.tokens:,} tokens, loss {f(r.final_loss)}, "
            f"val loss {f(r.val_loss)}, spikes {r.spikes}, skipped {r.skipped_steps}, {r.tokens_per_s:,.0f} tok/s")
    if r.diverged:
        line += f"; DIVERGED at step {r.diverged_step} ({r.diverged_reason})"
    elif r.complete:
        line += f"; final model in {r.final_dir}"
    else:
        line += "; stopped early (continue with --resume)"
    return line


def _is_main() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0"


def _train(args) -> int:
    from gatedattn.io import json_safe
    from gatedattn.train.loop import train

    cfg = TrainConfig.from_sets(_base(args), args.set)
    result = train(cfg, resume=args.resume)
    if _is_main():
        print(json.dumps(json_safe(result.to_dict()), indent=2) if args.json else _summary_line(result))
    return 0


def _sweep(args) -> int:
    from gatedattn.train.sweep import SWEEP_MD, sweep

    variants = parse_list(args.variants, str, "--variants")
    lrs = parse_list(args.lr, float, "--lr")
    seeds = parse_list(args.seeds, int, "--seeds") if args.seeds else None
    base = TrainConfig.from_sets(_base(args) | {"variant": variants[0] if variants else "baseline"}, args.set)
    rows = sweep(base, variants, lrs, seeds, resume=args.resume)
    if _is_main():
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            from pathlib import Path

            print(Path(base.out_dir, SWEEP_MD).read_text(encoding="utf-8"), end="")
    return 0


def register(subparsers) -> None:
    """Add ``train`` and ``sweep`` to the ``gatedattn`` command line."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = subparsers.add_parser(
        "train", help="train a model with one attention variant", formatter_class=fmt, epilog=_keys_epilog(),
        description=textwrap.fill(
            "Train a GatedLM on a prepared data directory (gatedattn data prepare). Writes config.json, "
            "code_version, env.json, metrics.jsonl/.csv, summary.json, checkpoints/ and final/ into --out. "
            "Run under torchrun for data parallelism.", width=90),
    )
    p.add_argument("--variant", default="baseline", help="attention preset (gatedattn variants; default baseline)")
    _common(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_train)

    p = subparsers.add_parser(
        "sweep", help="train a grid of variants x learning rates with identical data", formatter_class=fmt,
        epilog=_keys_epilog(),
        description=textwrap.fill(
            "Train every variant at every learning rate (and seed), one run after another with the same data "
            "order, each in OUT/<variant>_lr<lr>; write OUT/sweep.json and OUT/sweep.md (final loss, spikes, "
            "divergence).", width=90),
    )
    _common(p)
    p.add_argument("--variants", required=True, metavar="A,B,...", help="comma-separated attention presets")
    p.add_argument("--lr", required=True, metavar="X,Y,...", help="comma-separated learning rates")
    p.add_argument("--seeds", metavar="S,T,...", help="comma-separated seeds (default: the seed setting)")
    p.add_argument("--json", action="store_true", help="print the rows of sweep.json")
    p.set_defaults(func=_sweep)


def _common(p) -> None:
    p.add_argument("--preset", default="tiny", help="model size: micro, tiny, small, base, medium (default tiny)")
    p.add_argument("--data", required=True, metavar="DIR", help="a directory written by `gatedattn data prepare`")
    p.add_argument("--out", required=True, metavar="DIR", help="the run directory")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="set a TrainConfig field or model key (repeatable; keys listed below)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --out (start afresh if there is none)")


def main(argv: list[str] | None = None) -> int:
    """``python -m gatedattn.train.cli train ...``, the same as ``gatedattn train ...``
    (a module path for ``torchrun -m``)."""
    from gatedattn.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
