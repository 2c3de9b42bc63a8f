"""Windows for sink analysis: one document stretch each, the chosen first token, no separator.

A special token inside a window (a document separator such as EOS / ``<|endoftext|>``)
becomes a second sink and takes attention from position 0 (measured in SmolLM2-135M: it
took 0.21 of the attention and made F-Attn read 0.26 instead of 0.37).
So every window here is ``[first token] + seq_len`` consecutive tokens of ONE document
(or ``seq_len + 1`` of them when there is no first token), with no separator inside:

- :func:`document_windows` cuts the windows from token-id lists of single documents;
- :func:`tokenize_documents` turns texts into such lists with a model's own tokenizer;
- :func:`val_documents` gives the validation documents of a prepared data directory (its
  ``val.bin`` split at the EOS that follows every document), :func:`text_documents` the
  texts of ``.txt`` / ``.md`` / ``.jsonl`` inputs, :func:`model_tokenizer` the tokenizer
  of a model directory;
- :func:`resolve_first_token` turns ``auto`` / ``bos`` / ``none`` / an id into a
  :class:`FirstToken` for a model, refusing what the model cannot take; ``auto`` follows
  :func:`tokenizer_convention`, what the model's own tokenizer puts before text.

A window row is (seq_len + 1,) like a ``TokenData`` row: the model reads ``row[:-1]``
(seq_len positions) and predicts ``row[1:]``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gatedattn.data.corpus import input_source
from gatedattn.hf.gguf import gguf_file_of, read_header
from gatedattn.hf.load import model_tokenizer as hf_model_tokenizer
from gatedattn.infra.errors import GatedAttnError

__all__ = [
    "FIRST_TOKEN_MODES",
    "FirstToken",
    "document_windows",
    "model_tokenizer",
    "parse_first_token",
    "resolve_first_token",
    "stream_documents",
    "tokenizer_convention",
    "text_documents",
    "tokenize_documents",
    "val_documents",
]

FIRST_TOKEN_MODES = ("bos", "none", "id")
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


# --------------------------------------------------------------------------- first token


@dataclass(frozen=True)
class FirstToken:
    """The token at position 0 of every window: ``mode`` is ``bos`` (the model's own BOS),
    ``none`` (no special token: position 0 is an ordinary text token, ``id`` None) or
    ``id`` (a token id chosen by the user)."""

    mode: str
    id: int | None
    why: str | None = None  # how ``auto`` chose it (None: chosen by the user)

    def __post_init__(self) -> None:
        if self.mode not in FIRST_TOKEN_MODES:
            raise GatedAttnError(f"FirstToken.mode={self.mode!r}; choose one of {', '.join(FIRST_TOKEN_MODES)}")
        if (self.mode == "none") != (self.id is None):
            raise GatedAttnError(f"FirstToken.id={self.id!r} with mode {self.mode!r}: mode none has no id, "
                                 f"bos and id have one")

    def to_dict(self) -> dict[str, Any]:
        """``{"mode": ..., "id": ...}`` (JSON-ready), with ``why`` where ``auto`` chose it."""
        return {"mode": self.mode, "id": self.id, **({"why": self.why} if self.why else {})}


def parse_first_token(text: str | int) -> str | int:
    """``auto``, ``bos``, ``none`` or a token id >= 0 (the ``--first-token`` syntax); anything
    else is refused naming the allowed values."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        word = str(text).strip().lower()
        if word in ("auto", "bos", "none"):
            return word
        try:
            value = int(word)
        except ValueError:
            raise GatedAttnError(f"--first-token {text!r}: choose auto, bos, none or a token id (an integer >= 0)"
                                 ) from None
    if value < 0:
        raise GatedAttnError(f"--first-token {value}: a token id is an integer >= 0 (or choose auto, bos or none)")
    return value


@dataclass(frozen=True)
class Convention:
    """What a model's tokenizer puts before text when it encodes it: ``bos`` (a token id)
    or None (nothing: position 0 is the first text token), and where that was read."""

    bos: int | None
    why: str


def tokenizer_convention(model_path: str | os.PathLike | None, tokenizer: Any) -> Convention | None:
    """What the model's tokenizer adds before text (None where nothing says), read in order:

    1. a GGUF file's ``tokenizer.ggml.add_bos_token`` (llama.cpp's flag, with
       ``tokenizer.ggml.bos_token_id``);
    2. a directory's ``tokenizer_config.json`` ``add_bos_token`` (with its ``bos_token``);
    3. a model in gatedattn's own format: its BOS (``data prepare`` starts every sequence
       with it);
    4. the tokenizer itself: a probe text encoded with and without special tokens; the
       ids its template puts in front (a ``TemplateProcessing`` BOS), or none.
    """
    gguf = gguf_file_of(model_path) if model_path is not None and Path(model_path).exists() else None
    if gguf is not None:
        meta = read_header(gguf).metadata
        flag = meta.get("tokenizer.ggml.add_bos_token")
        if isinstance(flag, bool):
            bos = meta.get("tokenizer.ggml.bos_token_id")
            if not flag:
                return Convention(None, "the GGUF's tokenizer.ggml.add_bos_token is false")
            if bos is not None:
                return Convention(int(bos), "the GGUF's tokenizer.ggml.add_bos_token is true")
    elif model_path is not None:
        flag = _json_object(Path(model_path) / TOKENIZER_CONFIG_FILE).get("add_bos_token")
        if flag is False:
            return Convention(None, f"{TOKENIZER_CONFIG_FILE} sets add_bos_token false")
        if flag is True and tokenizer is not None:
            bos = tokenizer_bos(model_path, tokenizer)
            if bos is not None:
                return Convention(bos, f"{TOKENIZER_CONFIG_FILE} sets add_bos_token true")
    own = _gatedattn_bos(model_path)
    if own is not None:
        return Convention(own, "a gatedattn model: `data prepare` starts every training sequence with BOS")
    return _probe_convention(tokenizer)


def _gatedattn_bos(model_path: str | os.PathLike | None) -> int | None:
    """The BOS id of a model directory in gatedattn's own format (trained on data that
    starts every sequence with it), else None."""
    config = _json_object(Path(model_path) / "config.json") if model_path is not None else {}
    bos = config.get("bos_token_id") if config.get("model_type") == "gatedattn" else None
    return bos if isinstance(bos, int) and not isinstance(bos, bool) else None


def _json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; empty where there is no such file or it holds none."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


_PROBE = "The first words of a text."


def _probe_convention(tokenizer: Any) -> Convention | None:
    """What ``tokenizer`` (a ``tokenizers.Tokenizer`` or any object whose ``encode(text,
    add_special_tokens=...)`` gives ids or an object with ``.ids``) adds in front of text."""
    if tokenizer is None or not hasattr(tokenizer, "encode"):
        return None

    def ids(special: bool) -> list[int]:
        out = tokenizer.encode(_PROBE, add_special_tokens=special)
        return list(getattr(out, "ids", out))

    try:
        plain, special = ids(False), ids(True)
    except (TypeError, ValueError):
        return None
    n = len(special) - len(plain)
    if n == 0 and special == plain:
        return Convention(None, "the tokenizer adds no token before text")
    if n > 0 and special[n:n + len(plain)] == plain:
        return Convention(int(special[0]), f"the tokenizer's template puts token {special[0]} before text")
    return None


def resolve_first_token(spec: str | int, cfg: Any, *, tokenizer_bos: int | None = None,
                        convention: Convention | None = None) -> FirstToken:
    """The :class:`FirstToken` for ``spec`` (``auto``, ``bos``, ``none`` or an id, see
    :func:`parse_first_token`) and a model config ``cfg`` (``bos_token_id``, ``vocab_size``).

    ``auto`` follows ``convention`` (:func:`tokenizer_convention`): the model's BOS where its
    tokenizer adds one, else none; it is refused where nothing says. ``bos`` is
    ``cfg.bos_token_id``, else ``tokenizer_bos`` (the BOS the model's tokenizer names); a
    model with neither is refused, suggesting ``none`` or an id. An id must lie in the
    model's vocabulary.
    """
    spec = parse_first_token(spec)
    vocab = getattr(cfg, "vocab_size", None)
    why = None
    if spec == "auto":
        if convention is None:
            raise GatedAttnError("--first-token auto: the model's tokenizer does not say what it puts before text "
                                 "(no add_bos_token in its GGUF metadata or tokenizer_config.json, and no tokenizer "
                                 "to probe); choose --first-token bos, none or a token id")
        if convention.bos is None:
            return FirstToken("none", None, why=f"auto: {convention.why}")
        spec, why = convention.bos, f"auto: {convention.why}"
        mode, tid = "bos", int(spec)
    elif spec == "none":
        return FirstToken("none", None)
    elif spec == "bos":
        bos = getattr(cfg, "bos_token_id", None)
        bos = tokenizer_bos if bos is None else bos
        if bos is None:
            raise GatedAttnError("--first-token bos: the model has no bos_token_id (in its config or tokenizer); "
                                 "choose --first-token none (position 0 an ordinary token) or a token id")
        mode, tid = "bos", int(bos)
    else:
        mode, tid = "id", int(spec)
    if vocab is not None and not 0 <= tid < vocab:
        raise GatedAttnError(f"--first-token {tid}: outside the model's vocabulary [0, {vocab})")
    return FirstToken(mode, tid, why=why)


# --------------------------------------------------------------------------- documents


def stream_documents(stream: np.ndarray | Sequence[int], separator: int) -> list[np.ndarray]:
    """A token stream of documents each followed by ``separator`` (as ``val.bin``), cut into
    the documents (separators dropped; a last document without a separator is kept)."""
    ids = np.asarray(stream)
    cuts = np.flatnonzero(ids == separator)
    starts = np.concatenate(([0], cuts + 1))
    stops = np.concatenate((cuts, [len(ids)]))
    docs = [ids[a:b] for a, b in zip(starts.tolist(), stops.tolist(), strict=True)]
    if docs and docs[-1].size == 0:  # the stream ends with a separator
        docs.pop()
    return docs


def val_documents(data: Any) -> list[np.ndarray]:
    """The validation documents of a ``TokenData`` (a prepared data directory), in stream
    order: ``val.bin`` cut at the EOS that ``prepare`` writes after every document. The
    count is checked against the manifest (``val.documents``)."""
    docs = stream_documents(data.val, data.eos_id)
    want = data.manifest.val.documents
    if len(docs) != want:
        raise GatedAttnError(f"{data.data_dir}: val.bin holds {len(docs)} documents between EOS tokens "
                             f"(id {data.eos_id}) but manifest.json field 'val.documents' says {want}; "
                             f"prepare the data again")
    return docs


def text_documents(paths: Sequence[str | os.PathLike], *, text_field: str = "text") -> list[str]:
    """The non-empty texts of ``paths``, one per document: a ``.txt`` / ``.md`` file is one
    document, each line of a ``.jsonl`` one (its ``text_field``), a directory its files
    (as ``gatedattn data prepare`` reads inputs, :mod:`gatedattn.data.corpus`)."""
    if not paths:
        raise GatedAttnError("--text: give at least one .txt, .md or .jsonl file")
    texts = []
    for path in paths:
        source = input_source(path, text_field=text_field)
        found = [d.text for d in source.documents() if d.text.strip()]
        if not found:
            raise GatedAttnError(source.empty)
        texts += found
    return texts


def model_tokenizer(model_dir: str | os.PathLike):
    """The tokenizer of a model (a ``tokenizers.Tokenizer``): a directory's ``tokenizer.json``
    or a GGUF file's embedded tokenizer (``gatedattn.hf.load.model_tokenizer``)."""
    tokenizer = hf_model_tokenizer(model_dir)
    if tokenizer is None:
        raise GatedAttnError(f"{model_dir} has no tokenizer ({TOKENIZER_FILE}): --text needs the model's own "
                             f"tokenizer (or use --data with data prepared by it)")
    return tokenizer


def tokenizer_bos(model_dir: str | os.PathLike, tokenizer: Any) -> int | None:
    """The id of the ``bos_token`` that the model's ``tokenizer_config.json`` names (None
    when there is no such file or token)."""
    bos = _json_object(Path(model_dir) / TOKENIZER_CONFIG_FILE).get("bos_token")
    if isinstance(bos, dict):
        bos = bos.get("content")
    return tokenizer.token_to_id(bos) if isinstance(bos, str) else None


def tokenize_documents(tokenizer: Any, texts: Iterable[str]) -> list[list[int]]:
    """Token ids of each text, one list per text (an empty text gives ``[]``), with no
    special tokens added. Text that spells a special token (``<|endoftext|>``) is encoded
    as ordinary text, as ``prepare`` does, so no separator appears inside a document.

    ``tokenizer``: a ``tokenizers.Tokenizer`` (what :func:`model_tokenizer` returns), or
    any object whose ``encode(text, add_special_tokens=False)`` gives ids or an object
    with ``.ids`` (a transformers tokenizer).
    """
    texts = list(texts)
    if hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "encode_special_tokens"):
        saved = tokenizer.encode_special_tokens
        tokenizer.encode_special_tokens = True
        try:
            return [list(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
        finally:
            tokenizer.encode_special_tokens = saved
    out = []
    for text in texts:
        enc = tokenizer.encode(text, add_special_tokens=False)
        out.append([int(i) for i in getattr(enc, "ids", enc)])
    return out


# --------------------------------------------------------------------------- windows


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise GatedAttnError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _check_window_ids(first_token: Any, seed: Any) -> None:
    def is_int(v: Any) -> bool:
        return not isinstance(v, bool) and isinstance(v, (int, np.integer))

    if not is_int(seed) or seed < 0:
        raise GatedAttnError(f"seed must be an integer >= 0, got {seed!r}")
    if first_token is not None and (not is_int(first_token) or first_token < 0):
        raise GatedAttnError(f"first_token must be a token id >= 0 or None, got {first_token!r}")


def document_windows(
    docs: Sequence[Sequence[int]],
    seq_len: int,
    n_windows: int,
    first_token: int | None,
    *,
    seed: int = 0,
) -> torch.Tensor:
    """``n_windows`` analysis windows, a LongTensor (n_windows, seq_len + 1).

    ``docs``: the token ids of single documents (lists, arrays or tensors; no separator
    inside). Row ``r`` is ``[first_token] + seq_len`` consecutive tokens of one document,
    or, with ``first_token=None``, ``seq_len + 1`` of them (position 0 is then an ordinary
    text token). Every document gives the non-overlapping stretches ``[0, need)``,
    ``[need, 2 need)``, ... of the ``need`` tokens a window takes; documents shorter than
    ``need`` are skipped (never joined to others). When there are more stretches than
    windows asked, ``n_windows`` of them are drawn by ``seed`` (the raw output of
    ``PCG64(seed)``, stable across NumPy versions); rows follow document order. Fewer
    stretches than ``n_windows`` is refused, saying how many there are.
    """
    seq_len = _check_count("seq_len", seq_len)
    n_windows = _check_count("n_windows", n_windows)
    _check_window_ids(first_token, seed)
    need = seq_len if first_token is not None else seq_len + 1
    arrays = [np.asarray(d, dtype=np.int64).reshape(-1) for d in docs]
    stretches = [(j, k * need) for j, a in enumerate(arrays) for k in range(len(a) // need)]
    if len(stretches) < n_windows:
        tokens = sum(len(a) for a in arrays)
        short = sum(len(a) < need for a in arrays)
        raise GatedAttnError(
            f"not enough text for {n_windows} windows of {need} tokens from one document each: the "
            f"{len(arrays)} documents ({tokens} tokens; {short} shorter than {need}, skipped) give "
            f"{len(stretches)}; ask for fewer windows or a shorter seq_len, or give more text")
    if len(stretches) > n_windows:
        keys = np.random.PCG64(int(seed)).random_raw(len(stretches))
        chosen = np.sort(np.argsort(keys, kind="stable")[:n_windows])
        stretches = [stretches[i] for i in chosen.tolist()]
    rows = np.empty((n_windows, seq_len + 1), dtype=np.int64)
    text = rows[:, 1:] if first_token is not None else rows
    if first_token is not None:
        rows[:, 0] = int(first_token)
    for r, (j, start) in enumerate(stretches):
        text[r] = arrays[j][start:start + need]
    return torch.from_numpy(rows)
