"""File input and output: atomic writes (a file is either the old version or the complete
new one), JSON safety (one policy for non-finite numbers) and the JSON-lines reader."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from gatedattn.errors import GatedAttnError


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, fsync it, then
    rename it over ``path``. On any error the temporary file is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    return atomic_write(path, write)


def atomic_write_json(path: str | os.PathLike, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json_object(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object from ``path``; a missing file, bad JSON or a non-object is a
    ``GatedAttnError`` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise GatedAttnError(f"{path} is missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GatedAttnError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise GatedAttnError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def temp_dir_beside(target: str | os.PathLike) -> Path:
    """A new, empty hidden directory next to ``target`` (same filesystem, so a rename
    into place is atomic)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))


def replace_dir(new: str | os.PathLike, target: str | os.PathLike) -> None:
    """Rename the finished directory ``new`` to ``target``. An existing ``target`` is
    moved aside first, put back if the rename fails, and removed after it succeeds."""
    new, target = Path(new), Path(target)
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        os.replace(new, target)
        return
    aside = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".old"))
    os.replace(target, aside / "dir")
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(aside / "dir", target)
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, ±inf), which JSON cannot hold, as null;
    tuples become lists and keys strings. The one policy for every JSON file written."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (``metrics.jsonl``), one per line; a line that
    does not parse (the torn last line of a crash mid-write) is dropped. A missing file
    has none."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


def check_writable(path: str | os.PathLike, what: str, *, kind: str = "file", replace: bool = True) -> Path:
    """Check, before any work, that ``path`` can be written: ``kind`` ``"file"`` (a file
    there may be replaced when ``replace``) or ``"dir"`` (created if absent). The nearest
    existing parent must be a writable directory. A problem is a ``GatedAttnError`` naming
    ``what`` (the option, e.g. ``--out``) and the path. Creates nothing."""
    path = Path(path)
    if str(path) == "":
        raise GatedAttnError(f"{what}: an empty path")
    if path.exists() or path.is_symlink():
        if kind == "file" and path.is_dir():
            raise GatedAttnError(f"{what} {path} is a directory; give a file name")
        if kind == "file" and not replace:
            raise GatedAttnError(f"{what} {path} exists; choose a new name")
        if kind == "dir" and not path.is_dir():
            raise GatedAttnError(f"{what} {path} exists and is not a directory")
        if not os.access(path, os.W_OK) or (kind == "file" and not os.access(path.parent, os.W_OK)):
            raise GatedAttnError(f"{what} {path} is not writable")
        return path
    parent = path.absolute().parent
    while not parent.exists():
        if parent.is_symlink():  # a dangling link
            raise GatedAttnError(f"{what} {path}: {parent} is a broken link")
        parent = parent.parent
    if not parent.is_dir():
        raise GatedAttnError(f"{what} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise GatedAttnError(f"{what} {path}: {parent} is not writable")
    return path
