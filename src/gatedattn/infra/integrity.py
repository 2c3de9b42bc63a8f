"""File integrity: a checksum manifest beside every file the project saves, checked on load.

Every directory that gets a model, a checkpoint or token streams also gets
``checksums.json`` (``{"model.safetensors": "<sha256 hex>", ...}``), updated whenever a
file in it is written through :func:`record`. :func:`read_verified` reads a file once,
hashing while it reads, and refuses it when the manifest lists a different hash (one
flipped bit anywhere). Files from elsewhere (no manifest, or not listed) are read as
they are. :func:`check_finite` refuses weights holding NaN or infinity, and
:func:`tokenizer_fingerprint` identifies a tokenizer by what it does (vocabulary, merges,
added tokens), not by the bytes of its file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors.torch import save_file

from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.io import atomic_dir, atomic_write, atomic_write_text, loads_json
from gatedattn.infra.outputs import mark_output

CHECKSUMS = "checksums.json"
_CHUNK = 1 << 22


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _files_of(path: Path) -> list[Path]:
    """``path`` itself, or a directory's regular, non-hidden files (recursively, sorted)."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".")
                                                                        for part in p.relative_to(path).parts))


def content_id(path: str | os.PathLike, known: dict | None = None) -> dict[str, Any]:
    """What a file or a directory (a model) holds: ``sha256`` over its files' names and
    contents, and ``stat`` (names, sizes, modification times), which only spares the
    hashing where it equals ``known``'s (an earlier ``content_id`` of the same path). A
    model swapped in place changes ``sha256`` whatever its name, size or time."""
    path = Path(path)
    files = _files_of(path)
    stat = [[str(f.relative_to(path)) if f != path else f.name, f.stat().st_size, f.stat().st_mtime_ns]
            for f in files]
    if known and known.get("stat") == stat and isinstance(known.get("sha256"), str):
        return {"stat": stat, "sha256": known["sha256"]}
    h = hashlib.sha256()
    for (name, _, _), f in zip(stat, files):
        h.update(name.encode("utf-8", "surrogateescape") + b"\0" + bytes.fromhex(sha256_file(f)))
    return {"stat": stat, "sha256": h.hexdigest()}


def _manifest(directory: Path) -> dict[str, str]:
    path = directory / CHECKSUMS
    if not path.exists() and not path.is_symlink():
        return {}
    if not path.is_file():
        raise GatedAttnError(f"{path} is not a file; the directory is damaged (remove it only if you trust "
                             f"every file there)")
    try:
        data = loads_json(path.read_bytes(), path)
    except GatedAttnError as e:
        raise GatedAttnError(f"{e}; the directory is damaged") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise GatedAttnError(f"{path} must map file names to sha256 hex digests")
    return data


def has_manifest(directory: str | os.PathLike) -> bool:
    path = Path(directory) / CHECKSUMS
    return path.exists() or path.is_symlink()


def verify_dir(directory: str | os.PathLike, *, required: tuple[str, ...] = (), skip: tuple[str, ...] = (),
               only: tuple[str, ...] | None = None) -> None:
    """Check a directory against its ``checksums.json``: every listed file (or those of
    ``only``) present and unchanged, except ``skip`` (which its reader hashes itself), and
    every file of ``required`` that exists listed. A directory without a manifest (from
    elsewhere) passes."""
    directory = Path(directory)
    if not has_manifest(directory):
        return
    entries = _manifest(directory)
    if only is not None:
        entries = {k: v for k, v in entries.items() if k in only}
    for name in required:
        if (directory / name).exists() and name not in entries:
            raise GatedAttnError(f"{directory / name} is not listed in {directory / CHECKSUMS}; the directory "
                                 f"was changed after it was written")
    for name, digest in entries.items():
        if name in skip:
            continue
        path = directory / name
        if Path(name).name != name or not path.is_file():
            raise GatedAttnError(f"{directory / CHECKSUMS} lists {name!r}, which is missing; the directory is damaged")
        if sha256_file(path) != digest:
            raise GatedAttnError(f"{path}: sha256 differs from {CHECKSUMS}; the file is damaged or was replaced")


def record(path: str | os.PathLike, digest: str | None = None) -> None:
    """Enter ``path``'s sha256 (computed unless given) into its directory's manifest."""
    path = Path(path)
    record_files(path.parent, {path.name: digest or sha256_file(path)})


def record_files(directory: str | os.PathLike, digests: dict[str, str]) -> None:
    """Enter the sha256 of several files of ``directory`` (name -> digest) into its
    manifest in one write."""
    directory = Path(directory)
    entries = {**_manifest(directory), **digests}
    atomic_write_text(directory / CHECKSUMS, json.dumps(dict(sorted(entries.items())), indent=2) + "\n")


def expected_digest(path: str | os.PathLike) -> str | None:
    path = Path(path)
    return _manifest(path.parent).get(path.name)


def read_verified(path: str | os.PathLike) -> bytes:
    """The bytes of ``path``, hashed as they are read and checked against the manifest."""
    path = Path(path)
    expected = expected_digest(path)
    with open(path, "rb") as f:
        data = f.read()
    if expected is not None:
        got = hashlib.sha256(data).hexdigest()
        if got != expected:
            raise GatedAttnError(f"{path}: sha256 {got[:12]}… differs from {CHECKSUMS} ({expected[:12]}…); "
                                 f"the file is damaged")
    return data


def verify_file(path: str | os.PathLike) -> None:
    """Check ``path`` against its manifest without keeping its bytes (large files)."""
    path = Path(path)
    expected = expected_digest(path)
    if expected is not None and sha256_file(path) != expected:
        raise GatedAttnError(f"{path}: sha256 differs from {CHECKSUMS}; the file is damaged")


WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_dtypes(tensors: dict[str, Any], source: Any) -> None:
    """Refuse a state dict holding a tensor that is not floating point (integer, bool or
    quantized weights would be cast silently), naming the first such tensor."""
    for name, t in tensors.items():
        if t.dtype not in WEIGHT_DTYPES:
            allowed = ", ".join(str(d).removeprefix("torch.") for d in WEIGHT_DTYPES)
            raise GatedAttnError(f"{source}: tensor {name!r} has dtype {str(t.dtype).removeprefix('torch.')}; "
                                 f"weights must be one of {allowed} (quantized or integer weights are not supported)")


FINITE_CHUNK = 1 << 20  # elements checked at a time: isfinite's temporaries stay this small


def all_finite(t: torch.Tensor) -> bool:
    """Whether a floating tensor holds no NaN or infinity, checked ``FINITE_CHUNK`` elements at
    a time (``torch.isfinite`` of a whole tensor makes temporaries as large as it, the model's
    embedding among them, at the peak of a load)."""
    flat = t.reshape(-1)
    return all(bool(torch.isfinite(part).all()) for part in flat.split(FINITE_CHUNK))


def check_finite(tensors: dict[str, Any], source: Any) -> None:
    """Refuse a state dict holding a non-floating tensor (:func:`check_dtypes`) or NaN or
    infinity, naming the first such tensor."""
    check_dtypes(tensors, source)
    for name, t in tensors.items():
        if not all_finite(t):
            bad = int((~torch.isfinite(t)).sum())
            raise GatedAttnError(f"{source}: tensor {name!r} holds {bad} non-finite value(s) (NaN or infinity); "
                                 f"the weights are damaged or diverged")


def tokenizer_fingerprint(path: Any) -> str:
    """The sha256 of a tokenizer's model (type, vocabulary, merges) and added tokens, so two
    tokenizers that tokenize alike match whatever their formatting: ``path`` a
    ``tokenizer.json`` or a loaded ``tokenizers.Tokenizer`` (a GGUF file's, say)."""
    if hasattr(path, "to_str"):
        return _fingerprint(json.loads(path.to_str()))
    path = Path(path)
    if not path.is_file():
        raise GatedAttnError(f"{path}: missing")
    try:
        data = loads_json(path.read_bytes(), path)
    except GatedAttnError as e:
        raise GatedAttnError(f"{e} (not a valid tokenizer.json)") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise GatedAttnError(f"{path} is not a tokenizer.json: it has no 'model' object")
    return _fingerprint(data)


def _fingerprint(data: dict) -> str:
    model = data["model"]
    merges = model.get("merges")  # "a b" strings (older files) or [a, b] pairs (newer): one form
    if isinstance(merges, list):
        merges = [" ".join(m) if isinstance(m, list) else m for m in merges]
    key = {"type": model.get("type"), "vocab": model.get("vocab"), "merges": merges,
           "added_tokens": [(t.get("id"), t.get("content")) for t in data.get("added_tokens") or []
                            if isinstance(t, dict)]}
    return hashlib.sha256(json.dumps(key, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def check_tokenizer(path: str | os.PathLike, vocab_size: int | None = None, what: str = "tokenizer") -> Any:
    """Load a ``tokenizer.json`` (a tokenizers ``Tokenizer``); refuse one that does not
    load, has fewer than 2 tokens, or whose vocabulary differs from ``vocab_size``."""
    from tokenizers import Tokenizer  # lazy: heavy (tokenizers)

    path = Path(path)
    if not path.is_file():
        raise GatedAttnError(f"{what} {path}: missing")
    try:  # from its text: a path that is not UTF-8 cannot cross into the Rust reader
        tok = Tokenizer.from_str(path.read_bytes().decode("utf-8"))
    except Exception as e:  # the Rust error text is the useful part
        raise GatedAttnError(f"{what} {path} is not a valid tokenizer.json "
                             f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    n = tok.get_vocab_size(with_added_tokens=True)
    if n < 2:
        raise GatedAttnError(f"{what} {path} has {n} token(s); a language model needs at least 2")
    if vocab_size is not None and n != vocab_size:
        raise GatedAttnError(f"{what} {path} has {n} tokens, but the vocabulary is {vocab_size}")
    return tok


def atomic_save_safetensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None,
                            *, finite: bool = True) -> Path:
    """Write a safetensors file atomically and enter it in its directory's ``checksums.json``.
    What a load would refuse is refused here first: a tensor that is not floating point,
    and (``finite``, all but a diverged run's last checkpoint) NaN or infinity."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    check_finite(tensors, path) if finite else check_dtypes(tensors, path)
    path = atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata), size=tensor_bytes(tensors))
    record(path)
    return path


def tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in ``obj`` (nested dicts, lists and tuples): a lower bound
    on the size of a file holding it, known before it is written."""
    stack, total = [obj], 0
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            total += item.numel() * item.element_size()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> Path:
    """``torch.save`` atomically, entered in its directory's ``checksums.json``; the free
    space is checked first, and a full disk is one line naming the file."""
    path = atomic_write(path, lambda tmp: torch.save(obj, tmp), size=tensor_bytes(obj))
    record(path)
    return path


@contextlib.contextmanager
def atomic_model_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Write a model directory beside ``target`` and rename it into place, so a failure at
    any point leaves the old ``target`` whole::

        with atomic_model_dir(directory) as tmp:
            write config.json, model.safetensors (recorded in tmp's checksums.json)

    Files of an existing ``target`` that the new directory does not write (a tokenizer, a
    README) are carried over, with their ``checksums.json`` entries: only what is written
    anew is replaced."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise GatedAttnError(f"{target} exists and is not a directory")
    with atomic_dir(target) as tmp:
        yield tmp
        if target.is_dir():
            _carry_over(target, tmp)
        mark_output(tmp)




# a model's weights, one file or shards with their index: always written anew, never carried over
# (a model saved sharded over a single-file one, or the other way round, keeps no stale weights)
_WEIGHT_FILES = re.compile(r"model\.safetensors(\.index\.json)?|model-\d+-of-\d+\.safetensors")


def _carry_over(old: Path, new: Path) -> None:
    """Copy the entries of ``old`` that ``new`` lacks (other than weights) into ``new``;
    merge the manifests."""
    old_entries = _manifest(old)
    new_entries = _manifest(new)
    kept = {}
    for p in old.iterdir():
        if p.name == CHECKSUMS or (new / p.name).exists() or p.name.startswith(".gatedattn") \
                or _WEIGHT_FILES.fullmatch(p.name):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.copytree(p, new / p.name, symlinks=True)
        else:
            shutil.copy2(p, new / p.name, follow_symlinks=False)
        if p.name in old_entries:
            kept[p.name] = old_entries[p.name]
    if kept:
        merged = {**kept, **new_entries}
        atomic_write_text(new / CHECKSUMS, json.dumps(dict(sorted(merged.items())), indent=2) + "\n")
