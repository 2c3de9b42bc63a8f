"""The data pipeline: text in, tokenized train/val streams and deterministic batches out.

- :func:`prepare` reads text (:mod:`~gatedattn.data.corpus`), trains a byte-level BPE
  tokenizer, and writes a data directory (``train.bin``, ``val.bin``, ``tokenizer.json``,
  ``manifest.json``).
- :class:`TokenData` reads it back: ``train_batch(step, rows, ...)`` and
  ``val_batches(...)``; every row starts with BOS.
"""

from gatedattn.data.corpus import (
    DEFAULT_CORPUS_PACKAGES,
    Corpus,
    Document,
    Source,
    SourceInfo,
    default_corpus,
    default_corpus_info,
    input_sources,
    load_corpus,
    read_input,
)
from gatedattn.data.loader import Manifest, SplitInfo, TokenData
from gatedattn.data.prepare import (
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    load_tokenizer,
    prepare,
    split_documents,
    train_tokenizer,
)

__all__ = [
    "BOS_TOKEN",
    "Corpus",
    "DEFAULT_CORPUS_PACKAGES",
    "Document",
    "EOS_TOKEN",
    "Manifest",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "Source",
    "SourceInfo",
    "SplitInfo",
    "TokenData",
    "default_corpus",
    "default_corpus_info",
    "input_sources",
    "load_corpus",
    "load_tokenizer",
    "prepare",
    "read_input",
    "split_documents",
    "train_tokenizer",
]
