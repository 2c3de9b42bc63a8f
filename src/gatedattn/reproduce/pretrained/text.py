"""The study's text: the bundled corpus's documents, split by document as ``data prepare``
splits them (so training windows never come from a validation document), tokenized with
the model's own tokenizer, cut into windows of one document each after the first token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gatedattn.analysis.windows import document_windows, tokenize_documents
from gatedattn.data.corpus import default_corpus
from gatedattn.data.prepare import split_documents

VAL_FRACTION, SPLIT_SEED = 0.02, 0  # data prepare's defaults: the same validation documents


@dataclass
class StudyText:
    """Token-id documents of each split and the first token every window starts with
    (None: no special token, position 0 is text)."""

    train: list[list[int]]
    val: list[list[int]]
    first: int | None
    source: str

    def windows(self, split: str, seq_len: int, n: int, seed: int = 0) -> torch.Tensor:
        """(n, seq_len + 1) window rows of ``split``'s documents (one document stretch each):
        the model reads ``row[:-1]`` and predicts ``row[1:]``."""
        docs = self.train if split == "train" else self.val
        return document_windows(docs, seq_len, n, self.first, seed=seed)

    def long_window(self, length: int) -> torch.Tensor:
        """(1, length + 1): the start of the longest validation document (the streaming curve)."""
        return document_windows([max(self.val, key=len)], length, 1, self.first, seed=0)


def study_text(tokenizer, first: int | None) -> StudyText:
    """The bundled corpus split by document and tokenized with ``tokenizer`` (a
    ``tokenizers.Tokenizer``), without special tokens; ``first`` the first token's id."""
    corpus = default_corpus()
    train, val = split_documents(corpus.documents, val_fraction=VAL_FRACTION, seed=SPLIT_SEED)

    return StudyText(tokenize_documents(tokenizer, [d.text for d in train]),
                     tokenize_documents(tokenizer, [d.text for d in val]), first, corpus.description())
