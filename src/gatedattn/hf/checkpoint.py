"""Reading a checkpoint directory: its ``config.json`` and its safetensors weights.

``TensorSource`` covers one ``model.safetensors`` file or a sharded checkpoint
(``model.safetensors.index.json`` plus shards). It reads tensor names from the file
headers up front and tensors on demand, and reports which names were never taken,
so an importer can refuse a checkpoint with tensors it does not understand. Every
problem (missing file, truncated or corrupt file, index naming a missing shard or a
tensor its shard lacks) is a ``GatedAttnError`` naming the file or the tensor.
``DictTensorSource`` offers the same interface for tensors already in memory (a GGUF
file's, dequantized).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.integrity import check_finite, verify_dir
from gatedattn.infra.io import read_json_object

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def read_config(directory: Path) -> dict[str, Any]:
    """The ``config.json`` of a model directory as a dict, checked against the directory's
    ``checksums.json`` when it has one (and then required to be listed there)."""
    if not directory.is_dir():
        raise GatedAttnError(f"{directory} is not a directory")
    if not (directory / CONFIG_FILE).is_file():
        raise GatedAttnError(f"{directory} is not a model directory: {CONFIG_FILE} is missing")
    verify_dir(directory, required=(CONFIG_FILE,), only=(CONFIG_FILE,))
    return read_json_object(directory / CONFIG_FILE)


class TensorSource:
    """The tensors of a safetensors checkpoint in ``directory``, read lazily.

    ``names`` is every tensor name; ``get(name)`` reads one tensor and marks it taken;
    ``untaken()`` lists the names never read.
    """

    def __init__(self, directory: Path):
        self.directory = directory
        single, index = directory / SINGLE_FILE, directory / INDEX_FILE
        if single.is_file():
            self._file_of = {name: single for name in self._header_names(single)}
        elif index.is_file():
            self._file_of = self._from_index(index)
        else:
            others = sorted(p.name for p in directory.glob("*.bin")) + sorted(p.name for p in directory.glob("*.pt"))
            hint = (f" (found {others[0]}: only safetensors weights are read; re-save the model with "
                    f"safe_serialization=True)") if others else ""
            raise GatedAttnError(f"{directory}: no weights: neither {SINGLE_FILE} nor {INDEX_FILE} exists{hint}")
        self.names = frozenset(self._file_of)
        self._taken: set[str] = set()
        self._handles: dict[Path, object] = {}

    @staticmethod
    def _open(path: Path):
        if not path.is_file():
            raise GatedAttnError(f"{path} is missing")
        # a directory with a manifest (convert / export_hf wrote it) must list the file, unchanged
        verify_dir(path.parent, required=(path.name,), only=(path.name,))
        try:
            return safe_open(str(path), framework="pt", device="cpu")
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise GatedAttnError(f"{path} is truncated or corrupt ({e})") from None

    def _header_names(self, path: Path) -> list[str]:
        with self._open(path) as f:
            return list(f.keys())

    def _from_index(self, index: Path) -> dict[str, Path]:
        verify_dir(index.parent, required=(index.name,), only=(index.name,))
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise GatedAttnError(f"{index} has no 'weight_map' object")
        file_of: dict[str, Path] = {}
        by_file: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or not shard or Path(shard).name != shard:
                raise GatedAttnError(f"{index}: weight_map[{name!r}] is {shard!r}; each entry must be the file name "
                                     f"of a shard in the same directory")
            by_file.setdefault(shard, []).append(name)
        for shard, names in by_file.items():
            path = self.directory / shard
            present = set(self._header_names(path))
            for name in names:
                if name not in present:
                    raise GatedAttnError(f"{index} puts tensor {name!r} in {shard}, which does not hold it")
                file_of[name] = path
        return file_of

    def get(self, name: str) -> torch.Tensor:
        if name not in self._file_of:
            raise GatedAttnError(f"{self.directory}: tensor {name!r} is missing")
        path = self._file_of[name]
        if path not in self._handles:
            self._handles[path] = self._open(path)
        try:
            tensor = self._handles[path].get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise GatedAttnError(f"{path}: tensor {name!r} cannot be read ({e})") from None
        check_finite({name: tensor}, path)  # floating point, no NaN or infinity
        self._taken.add(name)
        return tensor

    def untaken(self) -> list[str]:
        return sorted(self.names - self._taken)


class DictTensorSource:
    """Tensors already in memory (a GGUF file's, dequantized), with ``TensorSource``'s
    interface: ``names``, ``get(name)`` (checked finite, marked taken) and ``untaken()``;
    ``where`` names them in errors."""

    def __init__(self, tensors: dict[str, torch.Tensor], where: Path):
        self.directory = where
        self._tensors = tensors
        self.names = frozenset(tensors)
        self._taken: set[str] = set()

    def get(self, name: str) -> torch.Tensor:
        if name not in self._tensors:
            raise GatedAttnError(f"{self.directory}: tensor {name!r} is missing")
        tensor = self._tensors[name]
        check_finite({name: tensor}, self.directory)  # floating point, no NaN or infinity
        self._taken.add(name)
        return tensor

    def untaken(self) -> list[str]:
        return sorted(self.names - self._taken)
