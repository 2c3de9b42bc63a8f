"""The ``gatedattn`` command line.

Each subcommand lives beside the code it drives and registers itself through a
``register(subparsers)`` function that sets ``func`` on its parser. This file lists the
commands and their one-line help, imports only the module of the command being run (so
``gatedattn --help``, ``--version`` and a mistyped command answer without importing
PyTorch), and turns user errors into one-line messages.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import sys
import warnings

from gatedattn import __version__
from gatedattn.infra.errors import EXPECTED_ERRORS, Interrupted
from gatedattn.infra.inputs import check_arguments

# command -> (module whose register() adds it, one-line help shown by `gatedattn --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "variants": ("gatedattn.layers.variants", "list every attention preset with its parameters and FLOPs"),
    "data": ("gatedattn.data.cli", "prepare and inspect tokenized datasets"),
    "train": ("gatedattn.train.cli", "train a model with one attention variant"),
    "sweep": ("gatedattn.train.cli", "train a grid of variants x learning rates with identical data"),
    "analyze": ("gatedattn.analysis.cli",
                "measure a checkpoint: F-Attn, attention sinks, massive activations, gate scores, val loss"),
    "extrapolate": ("gatedattn.analysis.cli",
                    "validation loss at multiples of the training length, plain RoPE vs NTK / YaRN"),
    "generate": ("gatedattn.hf.cli", "sample text from a model directory (gatedattn or HF format), KV-cached"),
    "convert": ("gatedattn.hf.cli", "import a model directory, optionally add a gate, save it (atomically)"),
    "reproduce": ("gatedattn.reproduce.cli",
                  "train baseline and gated variants alike and report the papers' claims"),
    "bench": ("gatedattn.bench.cli",
              "time and size the attention variants against baseline and transformers, on this machine"),
}
SUBCOMMAND_MODULES = tuple(dict.fromkeys(module for module, _ in COMMANDS.values()))


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (the usage stays in --help)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


@contextlib.contextmanager
def _imports_frozen():
    """For a process that is the command line: its command's imports (PyTorch and what it
    brings, hundreds of thousands of objects that live as long as the process) with Python's
    cyclic garbage collector paused, then frozen out of its later scans (``gc.freeze``):
    otherwise full collections, while importing, during the command and at exit, walk them
    all again. Code that calls :func:`main` in its own process keeps its collector as it is."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``command`` (a key of COMMANDS) only that command's module is imported
    and registered, the others are listed by name and help alone."""
    parser = _Parser(
        prog="gatedattn",
        description="Gated softmax attention: variants, models, training and analysis.",
    )
    parser.add_argument("--version", action="version", version=f"gatedattn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if command in COMMANDS:
        importlib.import_module(COMMANDS[command][0]).register(sub)
    else:
        for name, (_, help_text) in COMMANDS.items():
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the first word that is not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _one_line(e: BaseException) -> str:
    """An expected failure as one line that names the file or field."""
    if isinstance(e, OSError) and e.filename is not None:
        text = f"{e.filename}: {e.strerror or type(e).__name__}"
    else:
        text = str(e) or type(e).__name__
    return " ".join(text.split())


def main(argv: list[str] | None = None) -> int:
    """Run one command. Expected failures (bad input, bad files, a full or read-only disk,
    an interrupt) end as one line on stderr and a non-zero status; only a bug in
    gatedattn shows a traceback."""
    own_process = argv is None  # the `gatedattn` command, `python -m gatedattn.cli`, torchrun's workers
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command(argv)
    try:
        with _imports_frozen() if own_process else contextlib.nullcontext():
            parser = build_parser(command)
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print("gatedattn: interrupted", file=sys.stderr)
        return 130
    name = f"gatedattn {args.command}"
    # Python warnings (transformers', torch's) are held while the command runs: shown after a
    # success, dropped after a failure, whose one line says what matters; gatedattn's own
    # deprecations (an old --set key) are among them
    with warnings.catch_warnings(record=True) as held:
        warnings.filterwarnings("default", category=DeprecationWarning, module="gatedattn")
        status = _run(args, name, Interrupted, EXPECTED_ERRORS)
    if status == 0:
        for w in held:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return status


def _interrupt_in(e: BaseException, interrupted: type) -> BaseException | None:
    """The interrupt (``Interrupted`` or ``KeyboardInterrupt``) behind ``e``, if any: an error
    raised while handling one (a second Ctrl-C inside an import, a reader that wrapped it)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, (interrupted, KeyboardInterrupt)):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _run(args: argparse.Namespace, name: str, interrupted: type, expected: tuple) -> int:
    try:
        inputs = check_arguments(args)  # no FIFO, device or loop of links is read
        status = int(args.func(args) or 0)
        if status == 0:
            inputs.check_unchanged()
        return status
    except BrokenPipeError:  # output piped into a reader that stopped early (e.g. `| head`)
        sys.stderr.close()
        return 0
    except BaseException as e:
        stop = _interrupt_in(e, interrupted)  # an interrupt that surfaced as another error is still one
        if stop is not None and not isinstance(e, SystemExit):
            print(f"{name}: {_one_line(stop) if isinstance(stop, interrupted) else 'interrupted'}", file=sys.stderr)
            return getattr(stop, "status", 130)
        if isinstance(e, expected):
            print(f"{name}: error: {_one_line(e)}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
