"""Parquet and JSONL inputs, and the streaming prepare against an in-memory reference."""

from __future__ import annotations

import importlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gatedattn.data import TokenData, load_corpus, prepare, read_input, split_documents
from gatedattn.infra.errors import GatedAttnError

prepare_module = importlib.import_module("gatedattn.data.prepare")
corpus_module = importlib.import_module("gatedattn.data.corpus")

SMALL_VOCAB = 300


def texts(n: int) -> list[str | None]:
    out: list[str | None] = [f"Record {i}: {'the gate closes ' * (i % 6 + 1)}café {i}.\n" for i in range(n)]
    out[4] = "   "  # whitespace only: skipped and counted
    out[9] = None  # a null (Parquet) / a missing value is written as "" in JSONL
    return out


def write_jsonl(path: Path, values: list[str | None]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "body": v or ""}) + "\n" for i, v in enumerate(values)),
                    encoding="utf-8")
    return path


def write_parquet(path: Path, values: list[str | None], row_group_size: int = 7) -> Path:
    table = pa.table({"id": list(range(len(values))), "body": pa.array(values, type=pa.string())})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def documents_tokens(out: Path) -> Counter:
    """Every document's tokens (train and val together), as a multiset."""
    data = TokenData(out)
    docs: Counter = Counter()
    for stream in (data.train, data.val):
        s = np.asarray(stream).astype(np.int64)
        cuts = np.flatnonzero(s == data.eos_id)
        starts = np.concatenate([[0], cuts[:-1] + 1])
        docs.update(tuple(s[a:b].tolist()) for a, b in zip(starts, cuts))
    return docs


def test_parquet_gives_the_same_documents_and_tokens_as_jsonl(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_module, "PARQUET_BATCH_ROWS", 5)  # several batches per row group and across them
    values = texts(40)
    jsonl = write_jsonl(tmp_path / "docs.jsonl", values)
    parquet = write_parquet(tmp_path / "docs.parquet", values)
    from_jsonl, from_parquet = read_input(jsonl, text_field="body"), read_input(parquet, text_field="body")
    assert [d.text for d in from_parquet.documents] == [d.text for d in from_jsonl.documents]
    assert len(from_parquet.documents) == 38 and from_parquet.skipped_empty == from_jsonl.skipped_empty == 2
    assert from_parquet.documents[0].id == f"{parquet.as_posix()}:1"

    a = prepare([jsonl], tmp_path / "a", vocab_size=SMALL_VOCAB, text_field="body", progress=False)
    b = prepare([parquet], tmp_path / "b", tokenizer=tmp_path / "a" / "tokenizer.json", text_field="body",
                progress=False)
    assert documents_tokens(tmp_path / "b") == documents_tokens(tmp_path / "a")
    assert a.train.tokens + a.val.tokens == b.train.tokens + b.val.tokens
    assert (b.train.documents + b.val.documents, b.skipped_empty_documents) == (38, 2)
    assert b.sources[0]["kind"] == "parquet"


def test_a_folder_of_parquet_files_is_one_source(tmp_path):
    values = texts(30)
    folder = tmp_path / "dataset"
    (folder / "data").mkdir(parents=True)
    for i, part in enumerate((values[:8], values[8:20], values[20:])):
        write_parquet(folder / "data" / f"train-{i:05d}-of-00003.parquet", part)
    (folder / "README.md").write_text("a dataset card, not a document")
    corpus = read_input(folder, text_field="body")  # the card at the top is left out, with a word
    want = [v for v in values if v and v.strip()]
    assert [d.text for d in corpus.documents] == want
    assert corpus.sources[0].kind == "records-directory" and corpus.sources[0].documents == len(want)
    m = prepare([folder], tmp_path / "out", vocab_size=SMALL_VOCAB, text_field="body", progress=False)
    assert m.train.documents + m.val.documents == len(want)
    (folder / "data" / "notes.txt").write_text("a document among the records")  # not a card: refused, not dropped
    with pytest.raises(GatedAttnError, match="holds both"):
        read_input(folder, text_field="body")


@pytest.mark.parametrize("n_buckets_bytes", [1 << 30, 300])
def test_streaming_prepare_equals_in_memory_reference(tmp_path, monkeypatch, n_buckets_bytes):
    """The streamed split and the bucketed external sort give what splitting and
    encoding the whole corpus in memory gives (one bucket, and many)."""
    monkeypatch.setattr(prepare_module, "_BUCKET_BYTES", n_buckets_bytes)
    jsonl = write_jsonl(tmp_path / "docs.jsonl", texts(25))
    folder = tmp_path / "txt"
    folder.mkdir()
    for i in range(12):
        (folder / f"{i}.txt").write_text(f"Text file {i}. " * (i + 1))
    m = prepare([jsonl, folder], tmp_path / "out", vocab_size=SMALL_VOCAB, val_fraction=0.2, seed=5,
                text_field="body", progress=False)
    corpus = load_corpus([jsonl, folder], text_field="body")
    train, val = split_documents(corpus.documents, val_fraction=0.2, seed=5)
    assert m.val_document_ids == [d.id for d in val]
    data = TokenData(tmp_path / "out")
    tok = data.tokenizer()
    tok.encode_special_tokens = True
    for docs, stream in ((train, data.train), (val, data.val)):
        want = [i for d in docs for i in [*tok.encode(d.text, add_special_tokens=False).ids, data.eos_id]]
        assert np.asarray(stream).tolist() == want
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]  # no bucket files left


def test_parquet_problems_are_one_line_and_write_nothing(tmp_path):
    values = texts(12)
    no_column = write_parquet(tmp_path / "no_column.parquet", values)
    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": [1, 2, 3]}), numbers)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 this is not parquet")
    cases = [(no_column, "no column 'text' (columns: 'id', 'body'); choose the text column with --text-field"),
             (numbers, "column 'text' has type int64, not a string"),
             (broken, "not a readable Parquet file")]
    for path, message in cases:
        with pytest.raises(GatedAttnError) as err:
            prepare([path], tmp_path / "out", vocab_size=SMALL_VOCAB, progress=False)
        assert message in str(err.value) and "\n" not in str(err.value)
        assert not (tmp_path / "out").exists()


def test_small_vocabulary_warns_and_progress_counts_documents(tmp_path, capsys):
    jsonl = write_jsonl(tmp_path / "docs.jsonl", texts(20))
    m = prepare([jsonl], tmp_path / "out", vocab_size=512, text_field="body", progress=True)
    err = capsys.readouterr().err
    assert m.vocab_size < 512
    assert f"warning: the trained vocabulary has {m.vocab_size} tokens, fewer than the 512 asked" in err
    assert "read" in err and "18 documents" in err and "encode" in err
