"""Reading a prepared data directory and cutting it into batches.

A data directory (written by :func:`gatedattn.data.prepare`) holds ``train.bin`` and
``val.bin`` (flat token streams, each document followed by EOS), ``tokenizer.json`` and
``manifest.json``. :class:`TokenData` memory-maps the streams and serves:

- ``train_batch(step, rows, ...)``: the global batch of a step is a pure function of
  ``(seed, step)``; ``rows`` picks a slice of it, so data-parallel ranks and gradient
  accumulation micro-batches split one global batch, and resuming needs only the step;
- ``val_batches(...)``: fixed, non-overlapping consecutive windows over the val stream.

Every row is ``[bos] + seq_len tokens``, so a model always sees BOS at position 0 (the
fixed first token that attention sinks form on; docs/design.md section 4).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.integrity import check_tokenizer, tokenizer_fingerprint
from gatedattn.infra.io import read_json_object, recover_missing

FORMAT = "gatedattn-tokens"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
DTYPES = ("uint16", "uint32")


@dataclass(frozen=True)
class SplitInfo:
    """One token stream: its file, token and document counts, and sha256 of the file."""

    file: str
    tokens: int
    documents: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """The contents of ``manifest.json``: everything needed to read and trust a data directory."""

    dtype: str
    vocab_size: int
    bos_id: int
    eos_id: int
    bos_token: str
    eos_token: str
    tokenizer_file: str
    tokenizer_origin: str  # "trained" or the path of the tokenizer.json the user gave
    source: str  # one-line description of the text sources
    seed: int
    val_fraction: float
    train: SplitInfo
    val: SplitInfo
    val_document_ids: list[str]  # in their order in val.bin
    pad_id: int | None = None
    # what the tokenizer tokenizes (gatedattn.infra.integrity.tokenizer_fingerprint); None in older manifests
    tokenizer_sha256: str | None = None
    sources: list[dict] = field(default_factory=list)
    skipped_empty_documents: int = 0
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (format fields first)."""
        d = asdict(self)
        head = {"format": d.pop("format"), "format_version": d.pop("format_version")}
        return head | d

    def save(self, path: str | os.PathLike) -> None:
        """Write the manifest as indented JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = MANIFEST_FILE) -> Manifest:
        """Validate a parsed manifest; errors name the missing or bad field."""
        if not isinstance(d, dict):
            raise GatedAttnError(f"{where}: expected a JSON object")
        if d.get("format") != FORMAT:
            raise GatedAttnError(f"{where}: field 'format' is {d.get('format')!r}, expected {FORMAT!r}")
        if d.get("format_version") != FORMAT_VERSION:
            raise GatedAttnError(
                f"{where}: format_version {d.get('format_version')!r} is not supported "
                f"(this gatedattn reads version {FORMAT_VERSION}); prepare the data again"
            )
        required = {
            "dtype": str, "vocab_size": int, "bos_id": int, "eos_id": int, "bos_token": str,
            "eos_token": str, "tokenizer_file": str, "tokenizer_origin": str, "source": str,
            "seed": int, "val_fraction": (int, float), "train": dict, "val": dict,
            "val_document_ids": list,
        }
        for key, typ in required.items():
            if key not in d:
                raise GatedAttnError(f"{where}: missing field {key!r}")
            if not isinstance(d[key], typ) or isinstance(d[key], bool):
                raise GatedAttnError(f"{where}: field {key!r} has the wrong type ({type(d[key]).__name__})")
        if d["dtype"] not in DTYPES:
            raise GatedAttnError(f"{where}: dtype {d['dtype']!r} is not one of {', '.join(DTYPES)}")
        splits = {}
        for name in ("train", "val"):
            s = d[name]
            for key, typ in (("file", str), ("tokens", int), ("documents", int), ("sha256", str)):
                if not isinstance(s.get(key), typ):
                    raise GatedAttnError(f"{where}: missing or bad field '{name}.{key}'")
            splits[name] = SplitInfo(s["file"], s["tokens"], s["documents"], s["sha256"])
        if d.get("tokenizer_sha256") is not None and not isinstance(d["tokenizer_sha256"], str):
            raise GatedAttnError(f"{where}: field 'tokenizer_sha256' must be a hex string")
        if d.get("pad_id") is not None and (not isinstance(d["pad_id"], int) or isinstance(d["pad_id"], bool)):
            raise GatedAttnError(f"{where}: field 'pad_id' must be an integer or null")
        for key in ("bos_id", "eos_id"):
            if not 0 <= d[key] < d["vocab_size"]:
                raise GatedAttnError(f"{where}: {key}={d[key]} is outside the vocabulary (size {d['vocab_size']})")
        return cls(
            dtype=d["dtype"], vocab_size=d["vocab_size"], bos_id=d["bos_id"], eos_id=d["eos_id"],
            bos_token=d["bos_token"], eos_token=d["eos_token"], tokenizer_file=d["tokenizer_file"],
            tokenizer_origin=d["tokenizer_origin"], source=d["source"], seed=d["seed"],
            val_fraction=float(d["val_fraction"]), train=splits["train"], val=splits["val"],
            val_document_ids=list(d["val_document_ids"]), pad_id=d.get("pad_id"),
            tokenizer_sha256=d.get("tokenizer_sha256"),
            sources=list(d.get("sources", [])),
            skipped_empty_documents=int(d.get("skipped_empty_documents", 0)),
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> Manifest:
        """Read and validate ``manifest.json``."""
        path = Path(path)
        if not path.is_file():
            raise GatedAttnError(f"{path}: missing (not a prepared data directory? run `gatedattn data prepare`)")
        return cls.from_dict(read_json_object(path), str(path))


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _hash_and_max(path: Path, dtype: np.dtype, chunk: int = 1 << 22) -> tuple[str, int | None]:
    """sha256 of a token stream and its largest token id (None when empty), in one read."""
    h = hashlib.sha256()
    top = None
    with open(path, "rb") as f:
        while block := f.read(chunk - chunk % dtype.itemsize):
            h.update(block)
            ids = np.frombuffer(block, dtype=dtype)
            if ids.size:
                m = int(ids.max())
                top = m if top is None else max(top, m)
    return h.hexdigest(), top


def _indices(rows: range | slice, n: int) -> range:
    """``rows`` as a range of row indices into a global batch of ``n`` rows."""
    if isinstance(rows, slice):
        return range(n)[rows]
    if isinstance(rows, range):
        if len(rows) and not (0 <= min(rows[0], rows[-1]) and max(rows[0], rows[-1]) < n):
            raise GatedAttnError(f"rows {rows} fall outside the global batch of {n} rows")
        return rows
    raise TypeError(f"rows must be a range or a slice, not {type(rows).__name__}")


class TokenData:
    """A prepared data directory: memory-mapped token streams, tokenizer and batching.

    ``verify=True`` also checks the sha256 of each stream against the manifest.
    """

    def __init__(self, data_dir: str | os.PathLike, *, verify: bool | tuple[str, ...] = False) -> None:
        """``verify``: True checks both streams and the tokenizer; a tuple of split names
        (``("val",)``) checks those streams and the tokenizer."""
        self.data_dir = Path(data_dir)
        recover_missing(self.data_dir)  # a killed replace's previous copy is put back first
        if not self.data_dir.is_dir():
            raise GatedAttnError(f"data directory not found: {self.data_dir}")
        self.manifest = Manifest.load(self.data_dir / MANIFEST_FILE)
        m = self.manifest
        tok_path = self.data_dir / m.tokenizer_file
        if not tok_path.is_file():
            raise GatedAttnError(f"{tok_path}: missing (named by manifest.json field 'tokenizer_file')")
        splits = ("train", "val") if verify is True else tuple(verify or ())
        self.train = self._open(m.train, "train", "train" in splits)
        self.val = self._open(m.val, "val", "val" in splits)
        self._tokenizer = None
        if verify:
            self.check_tokenizer()

    def check_tokenizer(self) -> None:
        """Load the tokenizer and check it against the manifest: the vocabulary size and
        (when recorded) what it tokenizes, so a damaged or swapped ``tokenizer.json`` is
        refused before a run copies it into its model."""
        path = self.data_dir / self.manifest.tokenizer_file
        check_tokenizer(path, self.vocab_size, what="data tokenizer")
        want = self.manifest.tokenizer_sha256
        if want is not None and tokenizer_fingerprint(path) != want:
            raise GatedAttnError(f"{path} is not the tokenizer the streams were encoded with (manifest.json field "
                                 f"'tokenizer_sha256'); it was replaced: restore it or prepare the data again")

    def _open(self, info: SplitInfo, name: str, verify: bool) -> np.ndarray:
        path = self.data_dir / info.file
        if not path.is_file():
            raise GatedAttnError(f"{path}: missing (named by manifest.json field '{name}.file')")
        dtype = np.dtype(self.manifest.dtype)
        expected = info.tokens * dtype.itemsize
        size = path.stat().st_size
        if size != expected:
            raise GatedAttnError(
                f"{path}: {size} bytes, but the manifest says {info.tokens} {dtype.name} tokens "
                f"({expected} bytes); prepare the data again"
            )
        if verify:
            digest, top = _hash_and_max(path, dtype)
            if digest != info.sha256:
                raise GatedAttnError(f"{path}: sha256 differs from manifest.json; the file changed since prepare")
            if top is not None and top >= self.manifest.vocab_size:
                raise GatedAttnError(f"{path}: token id {top} is outside the vocabulary of {self.manifest.vocab_size} "
                                     f"(manifest.json field 'vocab_size'); prepare the data again")
        if info.tokens == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r")

    def __repr__(self) -> str:
        return (f"TokenData({str(self.data_dir)!r}, vocab_size={self.vocab_size}, "
                f"train_tokens={self.train_tokens}, val_tokens={self.val_tokens})")

    # ------------------------------------------------------------------ metadata

    @property
    def vocab_size(self) -> int:
        return self.manifest.vocab_size

    @property
    def bos_id(self) -> int:
        return self.manifest.bos_id

    @property
    def eos_id(self) -> int:
        return self.manifest.eos_id

    @property
    def pad_id(self) -> int | None:
        return self.manifest.pad_id

    @property
    def train_tokens(self) -> int:
        return len(self.train)

    @property
    def val_tokens(self) -> int:
        return len(self.val)

    def tokenizer(self):
        """The ``tokenizers.Tokenizer`` the streams were encoded with (loaded once)."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer  # lazy: heavy (tokenizers)

            self._tokenizer = Tokenizer.from_file(str(self.data_dir / self.manifest.tokenizer_file))
        return self._tokenizer

    def decode(self, ids: Sequence[int] | np.ndarray | torch.Tensor, *, skip_special_tokens: bool = False) -> str:
        """Token ids back to text; special tokens (BOS, EOS) are kept unless told otherwise."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        elif isinstance(ids, np.ndarray):
            ids = ids.astype(np.int64).tolist()
        return self.tokenizer().decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ batches

    def train_offsets(self, step: int, *, global_batch: int, seq_len: int, seed: int) -> np.ndarray:
        """Start offsets (into the train stream) of the ``global_batch`` windows of ``step``.

        Drawn from the raw 64-bit output of ``PCG64(SeedSequence([seed, step]))``, which
        NumPy keeps stable across versions, reduced modulo the number of start positions.
        """
        for name, value in (("step", step), ("seed", seed)):
            if not isinstance(value, (int, np.integer)) or value < 0:
                raise GatedAttnError(f"{name} must be an integer >= 0, got {value!r}")
        for name, value in (("global_batch", global_batch), ("seq_len", seq_len)):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise GatedAttnError(f"{name} must be an integer >= 1, got {value!r}")
        starts = self.train_tokens - seq_len + 1
        if starts < 1:
            raise GatedAttnError(
                f"the train split has {self.train_tokens} tokens, fewer than seq_len={seq_len}"
            )
        raw = np.random.PCG64([int(seed), int(step)]).random_raw(int(global_batch))
        return (raw % np.uint64(starts)).astype(np.int64)

    def _rows(self, stream: np.ndarray, offsets: np.ndarray, seq_len: int) -> torch.Tensor:
        out = np.empty((len(offsets), seq_len + 1), dtype=np.int64)
        out[:, 0] = self.bos_id
        if len(offsets):
            out[:, 1:] = stream[offsets[:, None] + np.arange(seq_len)]
        return torch.from_numpy(out)

    def train_batch(
        self, step: int, rows: range | slice, *, global_batch: int, seq_len: int, seed: int
    ) -> torch.Tensor:
        """Rows ``rows`` of the global batch of ``step``: a LongTensor (len(rows), seq_len + 1).

        Row i is ``[bos] + train[off_i : off_i + seq_len]``; inputs are ``[:, :-1]``,
        targets ``[:, 1:]``. The global batch depends on ``(seed, step)`` only.
        """
        offsets = self.train_offsets(step, global_batch=global_batch, seq_len=seq_len, seed=seed)
        idx = _indices(rows, int(global_batch))
        return self._rows(self.train, offsets[np.asarray(idx, dtype=np.int64)], seq_len)

    def num_val_windows(self, seq_len: int) -> int:
        """How many non-overlapping windows of ``seq_len`` tokens the val stream holds."""
        if not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
            raise GatedAttnError(f"seq_len must be an integer >= 1, got {seq_len!r}")
        return self.val_tokens // int(seq_len)

    def val_batches(
        self, *, seq_len: int, batch_size: int, max_batches: int | None = None
    ) -> Iterator[torch.Tensor]:
        """Fixed validation batches: window j is ``[bos] + val[j*seq_len : (j+1)*seq_len]``.

        Windows are consecutive and non-overlapping, in order, ``batch_size`` per batch
        (the last batch may be smaller); the same every call. ``max_batches`` stops early.
        """
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise GatedAttnError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if max_batches is not None and max_batches < 1:
            raise GatedAttnError(f"max_batches must be >= 1 or None, got {max_batches!r}")
        n = self.num_val_windows(seq_len)
        if n == 0:
            raise GatedAttnError(
                f"the val split has {self.val_tokens} tokens, too few for one window of seq_len={seq_len}; "
                "use a shorter seq_len or prepare with a larger --val-fraction"
            )
        return self._val_iter(int(seq_len), int(batch_size), n, max_batches)

    def _val_iter(self, seq_len: int, batch_size: int, n: int, max_batches: int | None) -> Iterator[torch.Tensor]:
        for b, start in enumerate(range(0, n, batch_size)):
            if max_batches is not None and b >= max_batches:
                return
            windows = np.arange(start, min(start + batch_size, n), dtype=np.int64)
            yield self._rows(self.val, windows * seq_len, seq_len)
