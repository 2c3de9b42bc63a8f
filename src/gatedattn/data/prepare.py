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

``prepare`` streams: it reads the inputs three times (count and hash the documents;
train the tokenizer; encode) and never holds the corpus in memory. It keeps 8 bytes per
document (the first 8 bytes of the hash below), the ids of the validation documents,
and one bucket of encoded documents at a time: encoded documents go to bucket files by
hash range, and each bucket is sorted and appended to its stream (an external sort), so
memory stays flat however large the input.

The split is stratified by source (each input path, each default-corpus package): a
document goes to val when it is among the ``round(val_fraction * n)`` documents of its
source (at least one, never all) with the smallest ``sha256(seed, document id)``. It
thus depends on the seed and the document ids only, not on NumPy versions or on the
reading order. The same hash orders the documents inside each stream. (Streaming
compares the hashes' first 64 bits; two different ids sharing them, odds about
n^2 / 2^65 for n documents, are reported as a repeated document.)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gatedattn.data.corpus import Document, Source, input_sources
from gatedattn.data.loader import FORMAT_VERSION, MANIFEST_FILE, Manifest, SplitInfo
from gatedattn.infra.outputs import check_data_output
from gatedattn.infra.io import (check_free_space, check_no_overlap, check_replaceable, check_writable, discard_dir,
                                disk_full_named, replace_dir, temp_dir_beside)
from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.integrity import tokenizer_fingerprint

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
# The largest --vocab-size accepted: beyond any language model's vocabulary, and far
# below what makes the BPE trainer try to allocate tens of GB and abort.
MAX_VOCAB = 1 << 20
_ENCODE_CHUNK_CHARS = 4 << 20
_BUCKET_BYTES = 64 << 20  # text bytes per bucket of the external sort
_MAX_BUCKETS = 256  # open files per split

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


def _check_enough(n: int) -> None:
    if n < 2:
        raise GatedAttnError(
            f"found {n} document; the train/validation split is by document and needs "
            "at least 2: give a directory of files, several files, or a .jsonl with one document per line"
        )


def split_documents(
    documents: Sequence[Document], *, val_fraction: float, seed: int
) -> tuple[list[Document], list[Document]]:
    """Split by document into (train, val), each ordered by ``sha256(seed, id)``.

    Per source with ``n >= 2`` documents, ``clamp(round(val_fraction * n), 1, n - 1)``
    go to val. If that gives none (every source has one document), one document of the
    whole corpus goes to val. Fewer than two documents is an error.
    """
    _check_enough(len(documents))
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


def _key64(seed: int, doc_id: str) -> int:
    """The first 64 bits of ``_doc_key``, as an integer that sorts the same way."""
    return int.from_bytes(_doc_key(seed, doc_id)[:8], "big")


@dataclass
class _Scan:
    """What the first pass learnt about one source."""

    source: Source
    keys: np.ndarray  # uint64 hash prefixes of the non-empty documents, sorted
    nbytes: int
    skipped: int
    val_threshold: int = -1  # a document goes to val iff its key <= this

    def is_val(self, key: int) -> bool:
        return key <= self.val_threshold


def _scan(sources: Sequence[Source], seed: int, progress: bool) -> list[_Scan]:
    """Pass 1: hash every document, count bytes and empty documents, per source."""
    sizes = [s.size for s in sources]
    total = sum(sizes) if all(x is not None for x in sizes) else None
    scans = []
    docs = 0
    with tqdm(total=total, desc="read", unit="B", unit_scale=True, file=sys.stderr, disable=not progress) as bar:
        for source in sources:
            keys, nbytes, skipped = array("Q"), 0, 0
            for doc in source.documents(bar.update):
                if not doc.text.strip():
                    skipped += 1
                    continue
                keys.append(_key64(seed, doc.id))
                nbytes += len(doc.text.encode("utf-8"))
                docs += 1
                if docs % 1000 == 0:
                    bar.set_postfix_str(f"{docs:,} documents", refresh=False)
            if not keys:
                raise GatedAttnError(source.empty)
            scans.append(_Scan(source, np.sort(np.frombuffer(keys, dtype=np.uint64)), nbytes, skipped))
        bar.set_postfix_str(f"{docs:,} documents")
    return scans


def _plan_split(scans: list[_Scan], val_fraction: float) -> None:
    """Set each source's val threshold exactly as ``split_documents`` chooses."""
    n_all = sum(len(s.keys) for s in scans)
    _check_enough(n_all)
    every = np.concatenate([s.keys for s in scans])
    if len(np.unique(every)) != n_all:
        raise GatedAttnError("a document appears twice (an input given twice, such as a file and a directory "
                             "holding it); give each input once")
    for scan in scans:
        n = len(scan.keys)
        if n >= 2:
            k = min(n - 1, max(1, round(val_fraction * n)))
            scan.val_threshold = int(scan.keys[k - 1])
    if all(s.val_threshold < 0 for s in scans):  # every source has one document: the first of all goes to val
        first = min(scans, key=lambda s: int(s.keys[0]))
        first.val_threshold = int(first.keys[0])


def _documents(scans: Sequence[_Scan], seed: int, on_bytes=None) -> Iterator[tuple[Document, int, bool]]:
    """(document, key, is_val) for every non-empty document, in reading order."""
    for scan in scans:
        for doc in scan.source.documents(on_bytes or (lambda n: None)):
            if doc.text.strip():
                key = _key64(seed, doc.id)
                yield doc, key, scan.is_val(key)


# --------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: Iterable[str], vocab_size: int, *, length: int | None = None, progress: bool = False):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts`` (any iterable;
    ``length``, its number of texts, only feeds the progress bar). The result does not
    depend on the order of the texts.

    Special tokens ``<|bos|>``, ``<|eos|>``, ``<|pad|>`` get ids 0, 1, 2. Any byte string
    encodes (256-byte initial alphabet) and decodes back exactly. The vocabulary may come
    out smaller than ``vocab_size`` on a small corpus.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # lazy: heavy (tokenizers)

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
    if length is None and isinstance(texts, Sequence):
        length = len(texts)
    tok.train_from_iterator(texts, trainer=trainer, length=length)
    return tok


def _find_token(tok, names: Sequence[str]) -> tuple[str, int] | None:
    for name in names:
        i = tok.token_to_id(name)
        if i is not None:
            return name, i
    return None


def load_tokenizer(path: str | os.PathLike):
    """Load a user's ``tokenizer.json``; it must define BOS and EOS tokens."""
    from tokenizers import Tokenizer  # lazy: heavy (tokenizers)

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


class _Buckets:
    """Encoded documents of one split, spread over bucket files by hash range; ``write``
    appends one document, ``merge`` writes the split's stream in hash order."""

    def __init__(self, directory: Path, name: str, n_buckets: int, dtype: np.dtype):
        self.paths = [directory / f".{name}.{i}.part" for i in range(n_buckets)]
        self.files = [open(p, "wb") for p in self.paths]
        self.n, self.dtype, self.documents = n_buckets, dtype, 0

    def write(self, key: int, ids: np.ndarray) -> None:
        f = self.files[(key * self.n) >> 64]
        f.write(np.array([key, ids.size], dtype=np.uint64).tobytes())
        f.write(ids.astype(self.dtype).tobytes())
        self.documents += 1

    def close(self) -> None:
        for f in self.files:
            f.close()

    def merge(self, path: Path) -> SplitInfo:
        """Each bucket sorted by key, appended to ``path``; bucket files removed."""
        self.close()
        h = hashlib.sha256()
        n_tokens = 0
        itemsize = self.dtype.itemsize
        # each bucket is removed once appended: the most the disk must hold beyond now is the largest one
        check_free_space(path, max((p.stat().st_size for p in self.paths), default=0))
        with open(path, "wb") as out:
            for bucket in self.paths:
                data = bucket.read_bytes()
                records, offset = [], 0
                while offset < len(data):
                    key, n = np.frombuffer(data, dtype=np.uint64, count=2, offset=offset).tolist()
                    start = offset + 16
                    offset = start + n * itemsize
                    records.append((key, start, offset))
                for _, start, stop in sorted(records):
                    chunk = data[start:stop]
                    out.write(chunk)
                    h.update(chunk)
                    n_tokens += (stop - start) // itemsize
                bucket.unlink()
        return SplitInfo(file=path.name, tokens=n_tokens, documents=self.documents, sha256=h.hexdigest())

    def discard(self) -> None:
        self.close()
        for p in self.paths:
            p.unlink(missing_ok=True)


def _encode_documents(tok, scans: Sequence[_Scan], seed: int, eos_id: int, dtype: np.dtype, directory: Path,
                      progress: bool) -> tuple[SplitInfo, SplitInfo, list[str]]:
    """Pass 3: encode every document (EOS after each) into ``train.bin`` / ``val.bin``,
    each in hash order; return both SplitInfos and the val ids in stream order."""
    text_bytes = sum(s.nbytes for s in scans)
    n_buckets = min(_MAX_BUCKETS, max(1, -(-text_bytes // _BUCKET_BYTES)))
    splits = {False: _Buckets(directory, "train", n_buckets, dtype), True: _Buckets(directory, "val", n_buckets, dtype)}
    val_ids: list[tuple[int, str]] = []
    limit = np.iinfo(dtype).max
    # the ids alone (tokenizers >= 0.21 can skip the offsets, which nothing here reads)
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def flush(batch: list[tuple[Document, int, bool]], bar) -> None:
        encodings = encode([d.text for d, _, _ in batch], add_special_tokens=False)
        for (doc, key, is_val), enc in zip(batch, encodings):
            ids = np.fromiter((*enc.ids, eos_id), dtype=np.int64, count=len(enc.ids) + 1)
            if ids.min() < 0 or ids.max() > limit:
                raise GatedAttnError(f"token id {int(ids.max())} does not fit {dtype.name}")
            splits[is_val].write(key, ids)
            if is_val:
                val_ids.append((key, doc.id))
        bar.update(sum(len(d.text.encode("utf-8")) for d, _, _ in batch))
        bar.set_postfix_str(f"{splits[False].documents + splits[True].documents:,} documents", refresh=False)

    try:
        with tqdm(total=text_bytes, desc="encode", unit="B", unit_scale=True, file=sys.stderr,
                  disable=not progress) as bar:
            batch: list[tuple[Document, int, bool]] = []
            chars = 0
            for item in _documents(scans, seed):
                batch.append(item)
                chars += len(item[0].text)
                if chars >= _ENCODE_CHUNK_CHARS:
                    flush(batch, bar)
                    batch, chars = [], 0
            if batch:
                flush(batch, bar)
        train = splits[False].merge(directory / "train.bin")
        val = splits[True].merge(directory / "val.bin")
    except BaseException:
        for buckets in splits.values():
            buckets.discard()
        raise
    return train, val, [doc_id for _, doc_id in sorted(val_ids)]


# --------------------------------------------------------------------------- output directory


def _check_out_dir(out: Path, overwrite: bool, inputs: Sequence[tuple[str, str | os.PathLike]] = ()) -> None:
    """``out`` can be written, overlaps no input, and is empty, or (``overwrite``) an
    earlier data directory: ``--force`` never replaces a directory that is not one."""
    check_writable(out, "--out", kind="dir")
    check_no_overlap(out, "--out", inputs)
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise GatedAttnError(f"--out {out} exists and is not empty; pass --force to replace it")
        check_replaceable(out, "--out", (MANIFEST_FILE,), "data directory")
        check_data_output(out, "--out")  # and nothing in it that prepare did not write


def _move_into_place(tmp: Path, out: Path, overwrite: bool, inputs: Sequence[tuple[str, str | os.PathLike]]) -> None:
    """Rename the finished ``tmp`` directory to ``out``, replacing ``out`` if allowed."""
    _check_out_dir(out, overwrite, inputs)
    replace_dir(tmp, out)


# --------------------------------------------------------------------------- prepare


def _check_settings(vocab_size: int, val_fraction: float, seed: int) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise GatedAttnError(f"vocab_size must be an integer in [{MIN_VOCAB}, {MAX_VOCAB}], got {vocab_size!r}")
    if not 0.0 < val_fraction < 1.0:
        raise GatedAttnError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise GatedAttnError(f"seed must be an integer >= 0, got {seed!r}")


def _fingerprint(path: Path) -> str:
    return tokenizer_fingerprint(path)


def _train_into(tmp: Path, scans, seed: int, vocab_size: int, n_train: int, progress: bool):
    """Train the BPE tokenizer on the train split and save it into ``tmp``."""
    t0 = time.perf_counter()
    _log(progress, f"training byte-level BPE (vocab {vocab_size}) on the train split")
    texts = (doc.text for doc, _, is_val in _documents(scans, seed) if not is_val)
    tok = train_tokenizer(texts, vocab_size, length=n_train, progress=progress and sys.stderr.isatty())
    tok.save(str(tmp / TOKENIZER_FILE))
    got = tok.get_vocab_size()
    _log(progress, f"trained tokenizer: {got} tokens in {time.perf_counter() - t0:.1f}s")
    if got < vocab_size:
        print(f"warning: the trained vocabulary has {got} tokens, fewer than the {vocab_size} asked "
              f"(--vocab-size): the train split is too small for more merges; the manifest records "
              f"{got}", file=sys.stderr, flush=True)
    return tok


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
    _check_settings(vocab_size, val_fraction, seed)
    if os.fspath(out_dir) == "":
        raise GatedAttnError("--out: an empty path; give the directory to write")
    out = Path(out_dir)
    overlap = [("--input", p) for p in inputs or ()] + ([("--tokenizer", tokenizer)] if tokenizer is not None else [])
    _check_out_dir(out, overwrite, overlap)
    user_tok = load_tokenizer(tokenizer) if tokenizer is not None else None

    t0 = time.perf_counter()
    sources = input_sources(inputs, default=default_corpus, text_field=text_field)
    scans = _scan(sources, seed, progress)
    n_docs, n_bytes = sum(len(s.keys) for s in scans), sum(s.nbytes for s in scans)
    description = ", ".join(
        f"{s.name} ({s.package} {s.version})" if s.kind == "package" else s.location for s in sources)
    _log(progress, f"read {n_docs:,} documents ({n_bytes / 1e6:.1f} MB) from {description} "
                   f"in {time.perf_counter() - t0:.1f}s")
    _plan_split(scans, val_fraction)
    n_val = sum(int((s.keys <= np.uint64(s.val_threshold)).sum()) if s.val_threshold >= 0 else 0 for s in scans)
    _log(progress, f"split: {n_docs - n_val:,} train / {n_val:,} val documents (seed {seed})")

    with disk_full_named(out):  # the tokenizer trainer's and numpy's words for a full disk: one line
        tmp = temp_dir_beside(out)  # a killed earlier run's temporaries are removed here
        try:
            if user_tok is None:
                tok = _train_into(tmp, scans, seed, vocab_size, n_docs - n_val, progress)
                origin = "trained"
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
            train_info, val_info, val_ids = _encode_documents(tok, scans, seed, eos_id, dtype, tmp, progress)
            tok_digest = _fingerprint(tmp / TOKENIZER_FILE)
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
                tokenizer_sha256=tok_digest,
                source=("default corpus: " if all(s.kind == "package" for s in sources) else "") + description,
                sources=[s.source.info(len(s.keys), s.nbytes).to_dict() for s in scans],
                seed=seed,
                val_fraction=val_fraction,
                train=train_info,
                val=val_info,
                val_document_ids=val_ids,
                skipped_empty_documents=sum(s.skipped for s in scans),
            )
            manifest.save(tmp / MANIFEST_FILE)
            _move_into_place(tmp, out, overwrite, overlap)
        except BaseException:
            discard_dir(tmp)
            raise
    _log(progress, f"wrote {out}: train {train_info.tokens:,} tokens ({train_info.documents:,} documents), "
                   f"val {val_info.tokens:,} tokens ({val_info.documents:,} documents), vocab {vocab}")
    return manifest
