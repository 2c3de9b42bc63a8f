"""Turning text into a data directory: tokenizer, train/val token streams, manifest.

``prepare`` reads documents (:mod:`gatedattn.data.corpus`), splits them by document
into train and validation, trains a byte-level BPE tokenizer on the train split (or
takes the user's ``tokenizer.json``), encodes both splits as flat streams with EOS
after every document, and writes::

    out_dir/train.bin       tokens, uint16 (ids < 65536) or uint32
    out_dir/val.bin
    out_dir/tokenizer.json
    out_dir/manifest.json   see gatedattn.data.loader.Manifest

Everything is written into a temporary directory beside ``out_dir`` and renamed into
place at the end, so a failure leaves no partial output.

The split is stratified by source (each input path, each default-corpus package): a
document goes to val when it is among the ``round(val_fraction * n)`` documents of its
source (at least one, never all) with the smallest ``sha256(seed, document id)``. It
thus depends on the seed and the document ids only, not on NumPy versions or on the
reading order. The same hash orders the documents inside each stream.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gatedattn.data.corpus import Corpus, Document, load_corpus
from gatedattn.data.loader import FORMAT_VERSION, MANIFEST_FILE, Manifest, SplitInfo
from gatedattn.io import replace_dir
from gatedattn.errors import GatedAttnError

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)
# Names accepted for BOS / EOS in a user's tokenizer.json, in order of preference.
BOS_NAMES = (BOS_TOKEN, "<s>", "<bos>", "<|begin_of_text|>", "<|startoftext|>", "<|endoftext|>")
EOS_NAMES = (EOS_TOKEN, "</s>", "<eos>", "<|end_of_text|>", "<|endoftext|>")
PAD_NAMES = (PAD_TOKEN, "<pad>", "[PAD]")
TOKENIZER_FILE = "tokenizer.json"
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)
_ENCODE_CHUNK_CHARS = 4 << 20

__all__ = [
    "BOS_TOKEN", "EOS_TOKEN", "PAD_TOKEN", "SPECIAL_TOKENS",
    "load_tokenizer", "prepare", "split_documents", "train_tokenizer",
]


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- split


def _doc_key(seed: int, doc_id: str) -> bytes:
    return hashlib.sha256(f"{seed}\0{doc_id}".encode("utf-8")).digest()


def split_documents(
    documents: Sequence[Document], *, val_fraction: float, seed: int
) -> tuple[list[Document], list[Document]]:
    """Split by document into (train, val), each ordered by ``sha256(seed, id)``.

    Per source with ``n >= 2`` documents, ``clamp(round(val_fraction * n), 1, n - 1)``
    go to val. If that gives none (every source has one document), one document of the
    whole corpus goes to val. Fewer than two documents is an error.
    """
    if len(documents) < 2:
        raise GatedAttnError(
            f"found {len(documents)} document; the train/validation split is by document and needs "
            "at least 2: give a directory of files, several files, or a .jsonl with one document per line"
        )
    ranked = sorted(documents, key=lambda d: _doc_key(seed, d.id))
    by_source: dict[str, list[Document]] = {}
    for doc in ranked:
        by_source.setdefault(doc.source, []).append(doc)
    val_ids: set[str] = set()
    for docs in by_source.values():
        n = len(docs)
        if n < 2:
            continue
        k = min(n - 1, max(1, round(val_fraction * n)))
        val_ids.update(d.id for d in docs[:k])
    if not val_ids:
        val_ids.add(ranked[0].id)
    train = [d for d in ranked if d.id not in val_ids]
    val = [d for d in ranked if d.id in val_ids]
    return train, val


# --------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: Sequence[str], vocab_size: int, *, progress: bool = False):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts``.

    Special tokens ``<|bos|>``, ``<|eos|>``, ``<|pad|>`` get ids 0, 1, 2. Any byte string
    encodes (256-byte initial alphabet) and decodes back exactly. The vocabulary may come
    out smaller than ``vocab_size`` on a small corpus.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def _find_token(tok, names: Sequence[str]) -> tuple[str, int] | None:
    for name in names:
        i = tok.token_to_id(name)
        if i is not None:
            return name, i
    return None


def load_tokenizer(path: str | os.PathLike):
    """Load a user's ``tokenizer.json``; it must define BOS and EOS tokens."""
    from tokenizers import Tokenizer

    p = Path(path)
    if not p.is_file():
        raise GatedAttnError(f"tokenizer file not found: {p}")
    try:
        tok = Tokenizer.from_file(str(p))
    except Exception as e:  # the Rust error text is the useful part
        raise GatedAttnError(f"{p}: not a tokenizers tokenizer.json ({str(e).splitlines()[0]})") from None
    missing = [what for what, names in (("BOS", BOS_NAMES), ("EOS", EOS_NAMES)) if _find_token(tok, names) is None]
    if missing:
        raise GatedAttnError(
            f"{p}: no {' or '.join(missing)} token; the tokenizer must define "
            f"{BOS_TOKEN} and {EOS_TOKEN} (or one of {', '.join(BOS_NAMES[1:])} / {', '.join(EOS_NAMES[1:])})"
        )
    return tok


# --------------------------------------------------------------------------- encoding


def _chunks(docs: Sequence[Document], max_chars: int) -> Iterable[list[Document]]:
    chunk: list[Document] = []
    size = 0
    for doc in docs:
        chunk.append(doc)
        size += len(doc.text)
        if size >= max_chars:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _encode_split(tok, docs: Sequence[Document], eos_id: int, dtype: np.dtype, path: Path,
                  desc: str, progress: bool) -> SplitInfo:
    """Encode ``docs`` (EOS after each) into ``path``; return its SplitInfo."""
    h = hashlib.sha256()
    n_tokens = 0
    total = sum(len(d.text.encode("utf-8")) for d in docs)
    with open(path, "wb") as f, tqdm(total=total, desc=desc, unit="B", unit_scale=True,
                                     file=sys.stderr, disable=not progress, leave=True) as bar:
        for chunk in _chunks(docs, _ENCODE_CHUNK_CHARS):
            encodings = tok.encode_batch([d.text for d in chunk], add_special_tokens=False)
            ids: list[int] = []
            for enc in encodings:
                ids.extend(enc.ids)
                ids.append(eos_id)
            arr = np.asarray(ids, dtype=np.int64)
            if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(dtype).max):
                raise GatedAttnError(f"token id {int(arr.max())} does not fit {dtype.name}")
            data = arr.astype(dtype).tobytes()
            f.write(data)
            h.update(data)
            n_tokens += arr.size
            bar.update(sum(len(d.text.encode("utf-8")) for d in chunk))
    return SplitInfo(file=path.name, tokens=n_tokens, documents=len(docs), sha256=h.hexdigest())


# --------------------------------------------------------------------------- output directory


def _check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise GatedAttnError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise GatedAttnError(f"--out {out} exists and is not empty; pass --force to replace it")


def _move_into_place(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished ``tmp`` directory to ``out``, replacing ``out`` if allowed."""
    _check_out_dir(out, overwrite)
    replace_dir(tmp, out)


# --------------------------------------------------------------------------- prepare


def prepare(
    inputs: Sequence[str | os.PathLike] | None,
    out_dir: str | os.PathLike,
    *,
    vocab_size: int = 4096,
    val_fraction: float = 0.02,
    seed: int = 0,
    tokenizer: str | os.PathLike | None = None,
    text_field: str = "text",
    default_corpus: bool | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Manifest:
    """Prepare a data directory from ``inputs`` (default corpus if none); return its manifest.

    ``tokenizer`` is a ``tokenizer.json`` to use instead of training one (``vocab_size``
    is then ignored). ``default_corpus=True`` adds the default corpus to the inputs.
    ``overwrite`` allows replacing a non-empty ``out_dir``. ``progress`` prints phases
    and progress bars to stderr.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not MIN_VOCAB <= vocab_size < 2**32:
        raise GatedAttnError(f"vocab_size must be an integer in [{MIN_VOCAB}, 2**32), got {vocab_size!r}")
    if not 0.0 < val_fraction < 1.0:
        raise GatedAttnError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise GatedAttnError(f"seed must be an integer >= 0, got {seed!r}")
    out = Path(out_dir)
    _check_out_dir(out, overwrite)
    user_tok = load_tokenizer(tokenizer) if tokenizer is not None else None

    t0 = time.perf_counter()
    corpus: Corpus = load_corpus(inputs, default=default_corpus, text_field=text_field)
    _log(progress, f"read {len(corpus.documents):,} documents ({corpus.bytes / 1e6:.1f} MB) "
                   f"from {corpus.description()} in {time.perf_counter() - t0:.1f}s")
    train_docs, val_docs = split_documents(corpus.documents, val_fraction=val_fraction, seed=seed)
    _log(progress, f"split: {len(train_docs):,} train / {len(val_docs):,} val documents (seed {seed})")

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the output should not be
        if user_tok is None:
            t0 = time.perf_counter()
            _log(progress, f"training byte-level BPE (vocab {vocab_size}) on the train split")
            tok = train_tokenizer([d.text for d in train_docs], vocab_size,
                                  progress=progress and sys.stderr.isatty())
            tok.save(str(tmp / TOKENIZER_FILE))
            origin = "trained"
            _log(progress, f"trained tokenizer: {tok.get_vocab_size()} tokens in {time.perf_counter() - t0:.1f}s")
        else:
            tok = user_tok
            shutil.copyfile(tokenizer, tmp / TOKENIZER_FILE)
            origin = str(tokenizer)
        bos_token, bos_id = _find_token(tok, BOS_NAMES)
        eos_token, eos_id = _find_token(tok, EOS_NAMES)
        pad = _find_token(tok, PAD_NAMES)
        vocab = tok.get_vocab_size(with_added_tokens=True)
        dtype = np.dtype(np.uint16 if vocab <= 1 << 16 else np.uint32)
        # Text that spells a special token ("<|eos|>") is encoded as ordinary text, so the
        # only special ids in a stream are the EOS separators written here.
        tok.encode_special_tokens = True
        train_info = _encode_split(tok, train_docs, eos_id, dtype, tmp / "train.bin", "encode train", progress)
        val_info = _encode_split(tok, val_docs, eos_id, dtype, tmp / "val.bin", "encode val", progress)
        manifest = Manifest(
            format_version=FORMAT_VERSION,
            dtype=dtype.name,
            vocab_size=vocab,
            bos_id=bos_id,
            eos_id=eos_id,
            pad_id=pad[1] if pad else None,
            bos_token=bos_token,
            eos_token=eos_token,
            tokenizer_file=TOKENIZER_FILE,
            tokenizer_origin=origin,
            source=("default corpus: " if corpus.sources and all(s.kind == "package" for s in corpus.sources)
                    else "") + corpus.description(),
            sources=[s.to_dict() for s in corpus.sources],
            seed=seed,
            val_fraction=val_fraction,
            train=train_info,
            val=val_info,
            val_document_ids=[d.id for d in val_docs],
            skipped_empty_documents=corpus.skipped_empty,
        )
        manifest.save(tmp / MANIFEST_FILE)
        _move_into_place(tmp, out, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _log(progress, f"wrote {out}: train {train_info.tokens:,} tokens ({train_info.documents:,} documents), "
                   f"val {val_info.tokens:,} tokens ({val_info.documents:,} documents), vocab {vocab}")
    return manifest
