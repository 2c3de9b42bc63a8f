"""Atomic file writes: a file is either the old version or the complete new one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import save_file


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


def atomic_save_safetensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> Path:
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    return atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write(path, lambda tmp: torch.save(obj, tmp))
