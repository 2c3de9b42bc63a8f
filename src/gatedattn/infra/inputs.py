"""What an input may be, checked before anything reads it, and checked again once read.

Every option of the command line that names a file or directory to read (``--model``,
``--data``, ``--tokenizer``, ``--text``, ``--init-from``, ``convert --from``, ...) goes
through :func:`check_arguments` before its command starts:

- a FIFO, a device (``/dev/zero`` never ends, ``/dev/urandom`` neither), or a socket is
  refused before it is opened (a FIFO without a writer would block forever), and so is a
  loop of symbolic links; inside a directory input the same holds for the files it holds
  (a few levels deep, as model, data and run directories are laid out);
- a missing input (or one that cannot be looked at) is left to the command, whose message
  says what it expected there.

:func:`check_arguments` returns an :class:`InputStamps` of every regular file it saw (size,
modification time, inode); :meth:`InputStamps.check_unchanged` refuses, after the command,
an input that changed while the command read it (its results may mix two versions).
Each refusal is one line naming the option and the path.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from gatedattn.infra.errors import GatedAttnError

SCAN_DEPTH = 3  # RUN/checkpoints/step_N/FILE: the deepest file a command reads from a directory input
MAX_SCANNED = 10_000  # entries looked at in one directory input (a text corpus may hold many more)

Stamp = tuple[int, int, int]  # size, modification time (ns), inode


def mode_kind(mode: int) -> str | None:
    """``"a FIFO"``, ``"a device"`` or ``"a socket"`` for a file of ``st_mode`` ``mode``, else None."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return None


def _stat(path: str, where: str) -> os.stat_result | None:
    """``os.stat(path)`` (links followed; nothing opened), None where there is nothing to
    check (missing, a broken link, unreadable: the command says so); a loop of links is
    refused, ``where`` naming it."""
    try:
        return os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise GatedAttnError(f"{where} is a loop of symbolic links; point it at a file or directory") from None
        return None


def _refuse_special(st: os.stat_result, where: str) -> None:
    kind = mode_kind(st.st_mode)
    if kind is not None:
        raise GatedAttnError(f"{where} is {kind}, not a regular file or directory; give a file or directory "
                             f"(copy a stream to a file first)")


def _entries(directory: str) -> Iterator[str]:
    """The paths under ``directory`` down to :data:`SCAN_DEPTH` levels, at most :data:`MAX_SCANNED`."""
    seen = 0
    level = [directory]
    for _ in range(SCAN_DEPTH):
        below = []
        for d in level:
            try:
                with os.scandir(d) as it:
                    names = [e.path for e in it]
            except OSError:
                continue
            for path in names:
                seen += 1
                if seen > MAX_SCANNED:
                    return
                yield path
                try:
                    if os.path.isdir(path) and not os.path.islink(path):
                        below.append(path)
                except OSError:
                    continue
        level = below


@dataclass
class InputStamps:
    """The regular files of the checked inputs and their stamps when checked."""

    files: dict[str, tuple[str, Stamp]] = field(default_factory=dict)  # path -> (option, stamp)

    def add(self, path: str, option: str, st: os.stat_result) -> None:
        self.files.setdefault(path, (option, (st.st_size, st.st_mtime_ns, st.st_ino)))

    def check_unchanged(self) -> None:
        """Refuse an input file that was replaced, grew, shrank or was rewritten since it was checked."""
        for path, (option, then) in self.files.items():
            try:
                st = os.stat(path)
                now: Stamp | None = (st.st_size, st.st_mtime_ns, st.st_ino)
            except OSError:
                now = None
            if now != then:
                what = "was removed" if now is None else f"changed (size {then[0]:,} -> {now[0]:,} bytes, or its " \
                                                         f"modification time)"
                raise GatedAttnError(f"{option} {path} {what} while the command read it; its results may mix two "
                                     f"versions: run it again when the input no longer changes")


def check_input(path: str | os.PathLike | None, option: str, *, scan: bool = True,
                stamps: InputStamps | None = None) -> InputStamps:
    """Refuse ``path`` (the value of ``option``) when it is a FIFO, device, socket or loop
    of links, or, with ``scan``, a directory holding one; record its regular files in
    ``stamps`` (when given)."""
    if path is None or os.fspath(path) == "":
        return stamps
    path = os.fspath(path)
    st = _stat(path, f"{option} {path}")
    if st is None:
        return stamps
    _refuse_special(st, f"{option} {path}")
    if stat.S_ISREG(st.st_mode) and stamps is not None:
        stamps.add(path, option, st)
    elif stat.S_ISDIR(st.st_mode) and scan:
        for entry in _entries(path):
            where = f"{option} {path} holds {os.path.relpath(entry, path)}, which"
            est = _stat(entry, where)
            if est is None:
                continue
            _refuse_special(est, where)
            if stat.S_ISREG(est.st_mode) and stamps is not None:
                stamps.add(entry, option, est)
    return stamps


# A command's parser declares the options that name inputs with
# ``set_defaults(**input_options(("--model", "model"), ("--data", "data")))``: each
# option with the namespace attribute it sets. ``unscanned`` options are checked
# themselves but not the files of a directory they name (``data prepare --input`` walks
# its directories and skips anything but regular files); the files of ``written``
# options are not stamped (the command writes there: ``train --resume RUN_DIR``).
INPUT_OPTIONS = "input_options"


def input_options(*options: tuple[str, str], unscanned: Iterable[str] = (),
                  written: Iterable[str] = ()) -> dict[str, tuple[tuple[str, str, bool, bool], ...]]:
    """The ``set_defaults`` keywords that declare ``options`` as inputs (see :data:`INPUT_OPTIONS`)."""
    unscanned, written = set(unscanned), set(written)
    return {INPUT_OPTIONS: tuple((flag, dest, flag not in unscanned, flag not in written) for flag, dest in options)}


def _values(value) -> list:
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, (str, os.PathLike))]
    return [value] if isinstance(value, (str, os.PathLike)) else []


def check_arguments(args) -> InputStamps:
    """Every input that the parsed command line ``args`` (an ``argparse.Namespace``)
    declares, checked (:func:`check_input`) before the command runs; the stamps of their files."""
    stamps = InputStamps()
    for option, dest, scan, stamped in getattr(args, INPUT_OPTIONS, ()):
        for path in _values(getattr(args, dest, None)):
            check_input(path, option, scan=scan, stamps=stamps if stamped else None)
    return stamps
