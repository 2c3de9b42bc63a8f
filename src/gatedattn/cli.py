"""The ``gatedattn`` command line.

Each subcommand lives beside the code it drives and registers itself through a
``register(subparsers)`` function that sets ``func`` on its parser; this file only
lists those modules and turns user errors into one-line messages.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gatedattn.errors import GatedAttnError

SUBCOMMAND_MODULES = (
    "gatedattn.variants",
    "gatedattn.data.cli",
    "gatedattn.analysis.cli",
    "gatedattn.hf.cli",
    "gatedattn.train.cli",
    "gatedattn.reproduce.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gatedattn",
        description="Gated softmax attention: variants, models, training and analysis.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (GatedAttnError, ValueError, FileNotFoundError) as e:
        print(f"gatedattn {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gatedattn {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
