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

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from gatedattn.errors import GatedAttnError
from gatedattn.io import atomic_write, atomic_write_text

CHECKSUMS = "checksums.json"
_CHUNK = 1 << 22


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _manifest(directory: Path) -> dict[str, str]:
    path = directory / CHECKSUMS
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GatedAttnError(f"{path} is not valid JSON ({e}); the directory is damaged") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise GatedAttnError(f"{path} must map file names to sha256 hex digests")
    return data


def record(path: str | os.PathLike, digest: str | None = None) -> None:
    """Enter ``path``'s sha256 (computed unless given) into its directory's manifest."""
    path = Path(path)
    entries = _manifest(path.parent)
    entries[path.name] = digest or sha256_file(path)
    atomic_write_text(path.parent / CHECKSUMS, json.dumps(dict(sorted(entries.items())), indent=2) + "\n")


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


def check_finite(tensors: dict[str, Any], source: Any) -> None:
    """Refuse a state dict holding NaN or infinity, naming the first such tensor."""
    for name, t in tensors.items():
        if torch.is_floating_point(t) and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise GatedAttnError(f"{source}: tensor {name!r} holds {bad} non-finite value(s) (NaN or infinity); "
                                 f"the weights are damaged or diverged")


def tokenizer_fingerprint(path: str | os.PathLike) -> str:
    """The sha256 of a ``tokenizer.json``'s model (type, vocabulary, merges) and added tokens,
    so two files that tokenize alike match whatever their formatting."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GatedAttnError(f"{path}: missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GatedAttnError(f"{path} is not a valid tokenizer.json ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise GatedAttnError(f"{path} is not a tokenizer.json: it has no 'model' object")
    model = data["model"]
    key = {"type": model.get("type"), "vocab": model.get("vocab"), "merges": model.get("merges"),
           "added_tokens": [(t.get("id"), t.get("content")) for t in data.get("added_tokens") or []
                            if isinstance(t, dict)]}
    return hashlib.sha256(json.dumps(key, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def check_tokenizer(path: str | os.PathLike, vocab_size: int | None = None, what: str = "tokenizer") -> Any:
    """Load a ``tokenizer.json`` (a tokenizers ``Tokenizer``); refuse one that does not
    load, has fewer than 2 tokens, or whose vocabulary differs from ``vocab_size``."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise GatedAttnError(f"{what} {path}: missing")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust error text is the useful part
        raise GatedAttnError(f"{what} {path} is not a valid tokenizer.json "
                             f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    n = tok.get_vocab_size(with_added_tokens=True)
    if n < 2:
        raise GatedAttnError(f"{what} {path} has {n} token(s); a language model needs at least 2")
    if vocab_size is not None and n != vocab_size:
        raise GatedAttnError(f"{what} {path} has {n} tokens, but the vocabulary is {vocab_size}")
    return tok


def atomic_save_safetensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> Path:
    """Write a safetensors file atomically and enter it in its directory's ``checksums.json``."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    path = atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))
    record(path)
    return path


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> Path:
    """``torch.save`` atomically, entered in its directory's ``checksums.json``."""
    path = atomic_write(path, lambda tmp: torch.save(obj, tmp))
    record(path)
    return path
