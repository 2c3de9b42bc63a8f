"""A model's weights as one safetensors file or as shards with an index.

``write_weights(dir, state, max_shard_bytes)`` writes ``model.safetensors``, or, when the
tensors exceed ``max_shard_bytes``, ``model-00001-of-0000N.safetensors`` ... plus
``model.safetensors.index.json`` (``{"metadata": {"total_size": bytes}, "weight_map":
{tensor: file}}``), the layout transformers writes and reads. Every file is entered in
the directory's ``checksums.json``. ``read_weights(dir)`` reads either layout back, each
file through ``read_safetensors`` (verified against the manifest as it is read).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load

from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.integrity import atomic_save_safetensors, check_finite, read_verified, record, verify_file
from gatedattn.infra.io import atomic_write_json, read_json_object

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size: int | str, name: str = "size") -> int:
    """Bytes of ``size``: an int, or a string such as ``"200MB"`` (decimal) or ``"1GiB"`` (binary)."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*", str(size), flags=re.I) if isinstance(size, str) else None
    if match is None or float(match[1]) <= 0:
        raise GatedAttnError(f"{name}={size!r} must be a positive number of bytes (an int, or a string "
                             f"such as '200MB' or '1GiB')")
    return int(float(match[1]) * _UNITS[(match[2] or "").upper()])


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def write_weights(directory: Path, state: dict[str, torch.Tensor], max_shard_bytes: int | None = None) -> None:
    """``state`` into ``directory``: one file, or shards of at most ``max_shard_bytes``
    (a tensor larger than that gets a shard of its own) and their index."""
    total = sum(_nbytes(t) for t in state.values())
    if max_shard_bytes is None or total <= max_shard_bytes:
        atomic_save_safetensors(directory / SINGLE_FILE, state, metadata={"format": "pt"})
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        if shards[-1] and size + _nbytes(tensor) > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += _nbytes(tensor)
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        atomic_save_safetensors(directory / file, shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    record(atomic_write_json(directory / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map}))


def read_safetensors(path: Path, map_location="cpu", *, finite: bool = True) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, checked against the directory's ``checksums.json``
    (hashed while read); a missing, truncated, corrupt or damaged file, or (``finite``) a
    tensor holding NaN or infinity, is a clear error."""
    path = Path(path)
    if not path.is_file():
        raise GatedAttnError(f"{path} is missing")
    try:
        state = load(read_verified(path))
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise GatedAttnError(f"{path} is truncated or corrupt ({e})") from None
    if finite:
        check_finite(state, path)
    return {k: v.to(map_location) for k, v in state.items()} if str(map_location) != "cpu" else state



def read_weights(directory: Path, map_location="cpu") -> dict[str, torch.Tensor]:
    """Every tensor of ``directory``'s ``model.safetensors`` or of its shards (through
    ``read_safetensors``: checksums verified, NaN and infinity refused)."""

    single, index = directory / SINGLE_FILE, directory / INDEX_FILE
    if single.is_file() and index.is_file():
        raise GatedAttnError(f"{directory} holds both {SINGLE_FILE} and {INDEX_FILE}; remove the stale one")
    if not index.is_file():
        return read_safetensors(single, map_location)
    verify_file(index)
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise GatedAttnError(f"{index} has no weight_map")
    state: dict[str, torch.Tensor] = {}
    for file in sorted(set(weight_map.values())):
        if not isinstance(file, str) or Path(file).name != file:
            raise GatedAttnError(f"{index} names the shard {file!r}, not a file name in {directory}")
        tensors = read_safetensors(directory / file, map_location)
        listed = {name for name, f in weight_map.items() if f == file}
        if set(tensors) != listed:
            odd = sorted(set(tensors) ^ listed)[0]
            raise GatedAttnError(f"{directory / file}: tensor {odd!r} is {'not listed for it in' if odd in tensors else 'missing, though listed in'} {index.name}")
        state.update(tensors)
    return state
