"""What an output may be, checked before any work: a regular file or a directory that the
project created for that purpose, never one of its inputs, a device, a FIFO or a socket,
and never a file or directory that another gatedattn output depends on.

- :func:`check_file_output`: a file output (``analyze --out``, ``extrapolate --plot``,
  ``bench --out``) overlaps no input, is not a special file, and does not replace a file
  of a model, data, checkpoint or run directory.
- :func:`check_model_output`: ``convert --force`` replaces only an earlier model
  directory whose every file its ``checksums.json`` lists, and never a training
  checkpoint (``RUN/checkpoints/step_*``) or a run's ``final/``.
- :func:`check_data_output`: ``data prepare --force`` replaces a data directory holding
  nothing but what ``prepare`` writes.
- :func:`check_study_output` / :func:`mark_study_output`: a study's ``--out`` (``reproduce``)
  is new, empty, or one that study wrote (it holds the marker file the study writes first).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Iterable

from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.inputs import mode_kind
from gatedattn.infra.io import LOCK_FILE, atomic_write_text, check_no_overlap, check_writable, loads_json

CHECKSUMS = "checksums.json"
DATA_FILES = ("manifest.json", "tokenizer.json", "train.bin", "val.bin")
RUN_FILES = ("config.json", "code_version", "env.json", "metrics.jsonl", "metrics.csv", "summary.json")
CHECKPOINT_FILES = ("trainer_state.pt", "checkpoint.json")
STUDY_MARKER = ".gatedattn-study"
OUTPUT_MARKER = ".gatedattn-output"  # in every model directory the project writes; what --force may replace


def mark_output(directory: str | os.PathLike) -> None:
    """Sign ``directory`` as written by gatedattn: :data:`OUTPUT_MARKER` with a random
    token (a ``checksums.json`` alone could be anyone's)."""
    atomic_write_text(Path(directory) / OUTPUT_MARKER,
                      json.dumps({"written_by": "gatedattn", "token": secrets.token_hex(16)}) + "\n")


def is_marked_output(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` holds the marker :func:`mark_output` writes."""
    try:
        data = json.loads((Path(directory) / OUTPUT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("written_by") == "gatedattn" and isinstance(data.get("token"), str)


def special_kind(path: str | os.PathLike) -> str | None:
    """``"a FIFO"``, ``"a device"`` or ``"a socket"`` for such a file (links followed), else None."""
    try:
        return mode_kind(os.stat(path).st_mode)
    except OSError:
        return None


_SPECIAL_TREES = ("/proc/", "/dev/", "/sys/")


def _special_link(path: str | os.PathLike) -> str | None:
    """``"a link to a special file (T)"`` where a hop of the link chain at ``path`` is under
    /proc, /dev or /sys (``/dev/stdout``, ``/proc/self/fd/1``: writing the output there
    would replace the link, not reach the stream), else None."""
    hop = Path(path)
    for _ in range(40):
        if not hop.is_symlink():
            return None
        target = Path(os.path.normpath(hop.parent / os.readlink(hop)))
        if str(target).startswith(_SPECIAL_TREES) or str(hop.absolute()).startswith(_SPECIAL_TREES):
            return f"a link to a special file ({target})"
        hop = target
    return None


def _listed(directory: Path) -> dict[str, str]:
    path = directory / CHECKSUMS
    if not path.is_file():
        return {}
    try:
        data = loads_json(path.read_bytes(), path)
    except (GatedAttnError, OSError):
        return {}
    return data if isinstance(data, dict) else {}


def owner_of(path: Path) -> str | None:
    """What gatedattn output the existing file ``path`` belongs to (its directory's manifest
    lists it, or it is a file of a data, checkpoint or run directory), else None."""
    d = path.parent
    if path.name == CHECKSUMS and (d / CHECKSUMS).is_file() or path.name in _listed(d):
        return f"the directory {d} (listed in its {CHECKSUMS})"
    if (d / "manifest.json").is_file() and path.name in DATA_FILES:
        return f"the data directory {d}"
    if any((d / n).is_file() for n in CHECKPOINT_FILES) and path.name in (*CHECKPOINT_FILES, "config.json"):
        return f"the checkpoint {d}"
    if (d / "config.json").is_file() and ((d / "checkpoints").is_dir() or (d / "code_version").is_file()) \
            and path.name in RUN_FILES:
        return f"the run directory {d}"
    return None


def check_file_output(path: str | os.PathLike, what: str,
                      inputs: Iterable[tuple[str, str | os.PathLike | None]] = ()) -> Path:
    """A file output ``path`` (option ``what``) that can be written, overlaps none of
    ``inputs``, is not a device, FIFO or socket, and replaces no file another gatedattn
    output depends on."""
    path = check_writable(path, what)
    kind = special_kind(path) or _special_link(path)
    if kind is not None:
        raise GatedAttnError(f"{what} {path} is {kind}, not a regular file; an output must be a regular file "
                             f"(choose a file name)")
    check_no_overlap(path, what, [(f, p) for f, p in inputs if p is not None])
    if path.is_file() or path.is_symlink():
        owner = owner_of(Path(os.path.realpath(path)))
        if owner is not None:
            raise GatedAttnError(f"{what} {path} is a file of {owner}; replacing it would damage that output "
                                 f"(choose another {what})")
    return path


def _foreign_files(out: Path) -> list[str]:
    """The entries of ``out`` its manifest does not list, hidden ones included (the project's
    own lock, marker and temporaries aside)."""
    listed = _listed(out)
    return sorted(p.name for p in out.iterdir()
                  if p.name not in listed and p.name not in (CHECKSUMS, LOCK_FILE, OUTPUT_MARKER)
                  and not (p.name.startswith(".") and p.name.endswith((".tmp", ".old"))))


def check_model_output(out: str | os.PathLike, what: str, kind: str = "model directory") -> None:
    """``--force`` over an existing non-empty ``out``: only an earlier ``kind`` that gatedattn
    wrote with every file listed in its ``checksums.json``; never a training checkpoint or a
    run's ``final/`` (a checkpoint replaced by a conversion no longer resumes)."""
    out = Path(out)
    if not out.is_dir() or not any(out.iterdir()):
        return
    real = Path(os.path.realpath(out))
    if any((real / n).is_file() for n in CHECKPOINT_FILES) or real.parent.name == "checkpoints":
        raise GatedAttnError(f"{what} {out} is a training checkpoint; --force never replaces one (choose a new "
                             f"directory)")
    run = real.parent
    if real.name == "final" and (run / "config.json").is_file() and (
            (run / "checkpoints").is_dir() or (run / "code_version").is_file()):
        raise GatedAttnError(f"{what} {out} is the final model of the run {run}; --force never replaces it "
                             f"(choose a new directory)")
    if not (real / CHECKSUMS).is_file() or not is_marked_output(real):
        missing = CHECKSUMS if not (real / CHECKSUMS).is_file() else OUTPUT_MARKER
        raise GatedAttnError(f"{what} {out} is not empty and is not a {kind} gatedattn wrote (no {missing}); "
                             f"--force replaces only such an output: choose a new or empty directory")
    foreign = _foreign_files(real)
    if foreign:
        raise GatedAttnError(f"{what} {out} holds {foreign[0]!r}, which gatedattn did not write (not in its "
                             f"{CHECKSUMS}); --force replaces only a {kind} gatedattn wrote: move the file or "
                             f"choose a new directory")


def check_data_output(out: str | os.PathLike, what: str) -> None:
    """``data prepare --force`` over an existing data directory: it may hold only the files
    ``prepare`` writes (:data:`DATA_FILES`), so that nothing of the user's goes with it."""
    out = Path(out)
    if not out.is_dir():
        return
    foreign = sorted(p.name for p in out.iterdir()
                     if p.name not in (*DATA_FILES, CHECKSUMS, LOCK_FILE) and not p.name.startswith("."))
    if foreign:
        raise GatedAttnError(f"{what} {out} holds {foreign[0]!r}, which data prepare did not write; --force "
                             f"replaces only a data directory prepare wrote: move the file or choose a new directory")


def _holds_anything(out: Path) -> bool:
    return any(p.name not in (LOCK_FILE, STUDY_MARKER)
               and not (p.name.startswith(".") and p.name.endswith((".tmp", ".old"))) for p in out.iterdir())


def check_study_output(out: str | os.PathLike, command: str, study: str | None = None) -> None:
    """A study's ``--out``: absent, empty, or one a gatedattn study wrote (it holds
    :data:`STUDY_MARKER`) and, where ``study`` is named, that same study (its marker, or
    for a marker written before markers named their study, its ``results.json``); a
    directory of the user's own files (a ``report.md`` of theirs) or another study's output
    is refused before anything is written."""
    out = Path(out)
    check_writable(out, "--out", kind="dir")
    if not out.is_dir() or not _holds_anything(out):
        return
    if not (out / STUDY_MARKER).is_file():
        raise GatedAttnError(f"--out {out} is not empty and is not a {command} output (no {STUDY_MARKER}); its "
                             f"files would be overwritten: choose a new or empty directory")
    wrote = _study_of(out)
    if study is not None and wrote is not None and wrote != study:
        raise GatedAttnError(f"--out {out} holds the output of --study {wrote}, not --study {study}; its files "
                             f"would be overwritten: choose a new or empty directory, or give --study {wrote}")


def _study_of(out: Path) -> str | None:
    """The study that wrote ``out``: its marker's, else its results.json's (None: unknown)."""
    for name, key in ((STUDY_MARKER, "study"), ("results.json", "study")):
        try:
            value = json.loads((out / name).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, str):
            return value
    return None


def unmark_study_output(out: str | os.PathLike) -> None:
    """Remove the marker of a study output that holds nothing else (a study that failed
    before its first result), so that its directory can go."""
    out = Path(out)
    if (out / STUDY_MARKER).is_file() and not _holds_anything(out):
        (out / STUDY_MARKER).unlink()


def mark_study_output(out: str | os.PathLike, command: str, study: str | None = None) -> None:
    """Record in ``out`` that ``command`` (``study``) writes it (before its first result)."""
    marker = Path(out) / STUDY_MARKER
    if not marker.is_file():
        atomic_write_text(marker, json.dumps({"command": command, **({"study": study} if study else {})}) + "\n")
