"""Analysis windows: one document stretch each, the chosen first token, no separator inside;
``analyze --text`` / ``--data`` / ``--first-token`` on the command line."""

from __future__ import annotations

import json
import random
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import gatedattn.cli
from gatedattn.analysis import (
    FirstToken,
    analyze,
    document_windows,
    resolve_first_token,
    stream_documents,
    text_documents,
    tokenize_documents,
    val_documents,
)
from gatedattn.analysis.windows import parse_first_token, tokenizer_bos
from gatedattn.data import TokenData, prepare
from gatedattn.infra.errors import GatedAttnError
from gatedattn.models.lm import GatedLM, ModelConfig

WORDS = "the gate sink softmax token layer head query key value attention model loss".split()


def docs_by_range(lengths):
    """Document j holds the ids 1000 * (j + 1) + 0, 1, ...: a row's origin is readable."""
    return [list(range(1000 * (j + 1), 1000 * (j + 1) + n)) for j, n in enumerate(lengths)]


def origin(row):
    """(document, offset) of a run of consecutive ids from ``docs_by_range``; fails otherwise."""
    row = [int(t) for t in row]
    assert row == list(range(row[0], row[0] + len(row))), "not one consecutive stretch"
    return row[0] // 1000 - 1, row[0] % 1000


# --------------------------------------------------------------------------- document_windows


def test_every_window_is_the_first_token_and_one_document_stretch():
    docs = docs_by_range([40, 7, 33, 16, 3])
    w = document_windows(docs, seq_len=16, n_windows=5, first_token=2, seed=0)
    assert w.dtype == torch.long and w.shape == (5, 17)
    assert (w[:, 0] == 2).all()
    places = [origin(row[1:]) for row in w]
    # stretches start at multiples of 16 inside documents of >= 16 tokens; 7 and 3 are skipped
    assert all(doc in (0, 2, 3) and offset % 16 == 0 and offset + 16 <= len(docs[doc]) for doc, offset in places)
    assert sorted(places) == places  # in document order
    assert len(set(places)) == 5  # non-overlapping


def test_without_a_first_token_position_0_is_text():
    docs = docs_by_range([34, 17, 16])  # need 17 tokens: 2 + 1 + 0 stretches
    w = document_windows(docs, seq_len=16, n_windows=3, first_token=None)
    assert w.shape == (3, 17)
    assert [origin(row) for row in w] == [(0, 0), (0, 17), (1, 0)]


def test_documents_are_never_joined_and_too_little_text_is_refused_in_one_line():
    docs = docs_by_range([15, 15, 15, 20])  # 65 tokens, but one stretch of 16
    assert origin(document_windows(docs, 16, 1, 0)[0, 1:]) == (3, 0)
    with pytest.raises(GatedAttnError) as e:
        document_windows(docs, 16, 2, 0)
    msg = str(e.value)
    assert "\n" not in msg
    assert "2 windows of 16 tokens" in msg and "4 documents (65 tokens; 3 shorter than 16, skipped) give 1" in msg


def test_the_draw_is_seeded_and_takes_everything_when_exactly_enough():
    docs = docs_by_range([160, 160, 160])  # 30 stretches of 16
    a = document_windows(docs, 16, 6, 0, seed=0)
    assert torch.equal(a, document_windows(docs, 16, 6, 0, seed=0))
    draws = {tuple(origin(r[1:]) for r in document_windows(docs, 16, 6, 0, seed=s)) for s in range(4)}
    assert len(draws) > 1  # the seed picks the stretches
    every = document_windows(docs, 16, 30, 0, seed=5)
    assert [origin(r[1:]) for r in every] == [(j, 16 * k) for j in range(3) for k in range(10)]


def test_documents_may_be_lists_arrays_or_tensors():
    docs = [list(range(20)), np.arange(100, 120), torch.arange(200, 220)]
    w = document_windows(docs, 19, 3, None)
    assert w[:, 0].tolist() == [0, 100, 200]


@pytest.mark.parametrize("kwargs, match", [
    (dict(seq_len=0), "seq_len must be an integer >= 1"),
    (dict(n_windows=0), "n_windows must be an integer >= 1"),
    (dict(first_token=-1), "first_token must be a token id >= 0 or None"),
    (dict(seed=-2), "seed must be an integer >= 0"),
])
def test_bad_window_arguments_are_named(kwargs, match):
    args = dict(seq_len=4, n_windows=1, first_token=0) | kwargs
    seed = args.pop("seed", 0)
    with pytest.raises(GatedAttnError, match=match):
        document_windows(docs_by_range([10]), **args, seed=seed)


# --------------------------------------------------------------------------- documents


def test_stream_documents_cuts_at_the_separator():
    parts = stream_documents(np.array([5, 6, 1, 7, 1, 1, 8, 9]), 1)
    assert [p.tolist() for p in parts] == [[5, 6], [7], [], [8, 9]]
    assert [p.tolist() for p in stream_documents([5, 1], 1)] == [[5]]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    rng = random.Random(0)
    root = tmp_path_factory.mktemp("windows_data")
    src = root / "docs.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for i in range(30):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(60 + 5 * i))}) + "\n")
    out = root / "data"
    prepare([src], out, vocab_size=300, val_fraction=0.3, seed=0, progress=False)
    return out


@pytest.fixture(scope="module")
def data(data_dir):
    return TokenData(data_dir)


def test_val_documents_are_the_val_stream_between_eos(data):
    docs = val_documents(data)
    assert len(docs) == data.manifest.val.documents
    assert all(d.size and data.eos_id not in d for d in docs)
    assert np.concatenate([np.append(d, data.eos_id) for d in docs]).tolist() == data.val.tolist()
    fake = SimpleNamespace(val=data.val, eos_id=data.eos_id, data_dir=data.data_dir,
                           manifest=SimpleNamespace(val=SimpleNamespace(documents=len(docs) + 1)))
    with pytest.raises(GatedAttnError, match="'val.documents' says"):
        val_documents(fake)


def test_stream_windows_hold_separators_and_document_windows_none(data):
    """The reason for document windows: the val stream's windows cross document ends."""
    stream = torch.cat(list(data.val_batches(seq_len=32, batch_size=8)))
    assert (stream[:, 1:] == data.eos_id).any()
    docs = document_windows(val_documents(data), 32, 8, data.bos_id)
    assert not (docs[:, 1:] == data.eos_id).any() and not (docs[:, 1:] == data.bos_id).any()


def test_tokenize_documents_adds_nothing_and_encodes_special_text_as_text(data):
    tok = data.tokenizer()
    ids = tokenize_documents(tok, ["the gate", "", "a <|eos|> inside"])
    assert ids[0] == tok.encode("the gate", add_special_tokens=False).ids and ids[1] == []
    assert data.eos_id not in ids[2] and data.bos_id not in ids[0]
    assert tok.encode_special_tokens is False  # restored
    assert tok.encode("<|eos|>").ids == [data.eos_id]

    class EncodeOnly:  # a transformers-like tokenizer
        def encode(self, text, add_special_tokens=True):
            assert add_special_tokens is False
            return [len(w) for w in text.split()]

    assert tokenize_documents(EncodeOnly(), ["ab c", "dddd"]) == [[2, 1], [4]]


def test_text_documents_reads_txt_md_and_jsonl(tmp_path):
    (tmp_path / "a.txt").write_text("first document\n\nstill the first")
    (tmp_path / "b.md").write_text("# second")
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "third"}) + "\n" + json.dumps({"text": " "}) + "\n"
                                      + json.dumps({"text": "fourth"}) + "\n")
    texts = text_documents([tmp_path / "a.txt", tmp_path / "b.md", tmp_path / "c.jsonl"])
    assert texts == ["first document\n\nstill the first", "# second", "third", "fourth"]
    with pytest.raises(GatedAttnError, match="input not found"):
        text_documents([tmp_path / "missing.txt"])
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(GatedAttnError, match="empty"):
        text_documents([tmp_path / "empty.txt"])


# --------------------------------------------------------------------------- first token


def cfg(bos=None, vocab=50):
    return ModelConfig.from_preset("micro", "baseline", vocab_size=vocab, bos_token_id=bos)


def test_first_token_bos_none_and_id():
    assert resolve_first_token("bos", cfg(bos=3)) == FirstToken("bos", 3)
    assert resolve_first_token("bos", cfg(), tokenizer_bos=4) == FirstToken("bos", 4)
    assert resolve_first_token("none", cfg()) == FirstToken("none", None)
    assert resolve_first_token("7", cfg()) == FirstToken("id", 7) == resolve_first_token(7, cfg())
    assert FirstToken("id", 7).to_dict() == {"mode": "id", "id": 7}


@pytest.mark.parametrize("spec, kwargs, match", [
    ("bos", {}, "the model has no bos_token_id .* choose --first-token none .* or a token id"),
    ("50", {}, r"--first-token 50: outside the model's vocabulary \[0, 50\)"),
    ("-1", {}, "a token id is an integer >= 0"),
    ("first", {}, "choose auto, bos, none or a token id"),
])
def test_first_token_refusals_are_one_line(spec, kwargs, match):
    with pytest.raises(GatedAttnError, match=match) as e:
        resolve_first_token(spec, cfg(), **kwargs)
    assert "\n" not in str(e.value)


def test_first_token_mode_and_id_must_agree():
    with pytest.raises(GatedAttnError, match="FirstToken.mode='eos'"):
        FirstToken("eos", 1)
    with pytest.raises(GatedAttnError, match="mode none has no id"):
        FirstToken("none", 1)
    assert parse_first_token(" BOS ") == "bos"


def test_tokenizer_bos_reads_tokenizer_config(tmp_path, data):
    assert tokenizer_bos(tmp_path, data.tokenizer()) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": {"content": "<|eos|>"}}))
    assert tokenizer_bos(tmp_path, data.tokenizer()) == data.eos_id
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|bos|>"}))
    assert tokenizer_bos(tmp_path, data.tokenizer()) == data.bos_id


def test_analyze_records_the_first_token_and_checks_the_windows():
    model = GatedLM(cfg(bos=0))
    docs = docs_by_range([80, 80])
    docs = [[t % 49 + 1 for t in d] for d in docs]
    w = document_windows(docs, 16, 4, 0)
    r = analyze(model, [w], first_token=resolve_first_token("bos", model.cfg))
    assert r["first_token"] == {"mode": "bos", "id": 0} and r["windows"] == {"count": 4, "length": 16}
    assert analyze(model, [w])["first_token"] == {"mode": "unspecified", "id": 0}
    plain = document_windows(docs, 16, 4, None)
    assert analyze(model, [plain], first_token=FirstToken("none", None))["first_token"] == {"mode": "none", "id": None}
    assert analyze(model, [plain])["first_token"]["id"] is None  # the windows start with different tokens
    with pytest.raises(GatedAttnError, match="window 4 starts with token .*, not the first token 0 \\(bos\\)"):
        analyze(model, [w, plain], first_token=FirstToken("bos", 0))
    with pytest.raises(GatedAttnError, match="first_token must be a FirstToken"):
        analyze(model, [w], first_token={"mode": "bos", "id": 0})


# --------------------------------------------------------------------------- CLI


@pytest.fixture()
def cli(monkeypatch):
    modules = tuple(gatedattn.cli.SUBCOMMAND_MODULES)
    if "gatedattn.analysis.cli" not in modules:
        monkeypatch.setattr(gatedattn.cli, "SUBCOMMAND_MODULES", modules + ("gatedattn.analysis.cli",))
    return gatedattn.cli.main


def save_model(path, data, bos=True, tokenizer=True):
    torch.manual_seed(0)
    model = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=data.vocab_size, max_seq_len=16,
                                            bos_token_id=data.bos_id if bos else None))
    model_dir = model.save_pretrained(path)
    if tokenizer:
        shutil.copyfile(data.data_dir / "tokenizer.json", model_dir / "tokenizer.json")
    return model_dir


@pytest.fixture()
def texts(tmp_path):
    rng = random.Random(1)
    paths = []
    for i in range(3):
        p = tmp_path / f"doc{i}.txt"
        p.write_text(" ".join(rng.choice(WORDS) for _ in range(80)))
        paths.append(p)
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text("".join(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(80))}) + "\n"
                             for _ in range(2)))
    return [*paths, jsonl]


def run_json(cli, capsys, argv):
    assert cli([*argv, "--json", "--device", "cpu"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_cli_text_with_the_models_tokenizer(cli, capsys, tmp_path, data, texts):
    model_dir = save_model(tmp_path / "m", data)
    argv = ["analyze", "--model", str(model_dir), "--text", *map(str, texts), "--batches", "2", "--batch-size", "3"]
    r = run_json(cli, capsys, argv)
    assert r["first_token"] == {"mode": "bos", "id": data.bos_id, "why": "auto: a gatedattn model: `data prepare` starts every training sequence with BOS"}
    assert r["windows"] == {"count": 6, "length": 16, "source": "text", "text": [str(p) for p in texts],
                            "documents": 5, "seed": 0}
    assert r["data"] is None and r["n_tokens"] == 6 * 16
    # the same windows through the Python API
    tok = data.tokenizer()
    docs = tokenize_documents(tok, text_documents(texts))
    direct = analyze(GatedLM.from_pretrained(model_dir), document_windows(docs, 16, 6, data.bos_id).split(3))
    assert r["f_attn"] == direct["f_attn"] and r["val_loss"] == direct["val_loss"]

    r = run_json(cli, capsys, [*argv, "--first-token", "none", "--seed", "3"])
    assert r["first_token"] == {"mode": "none", "id": None} and r["windows"]["seed"] == 3
    r = run_json(cli, capsys, [*argv, "--first-token", "5"])
    assert r["first_token"] == {"mode": "id", "id": 5}
    assert cli([*argv, "--device", "cpu", "--first-token", "none"]) == 0
    text = capsys.readouterr().out
    assert "first token: no special token; 6 windows of 16 tokens" in text and "v0 drain" in text


def test_cli_data_windows_are_val_documents(cli, capsys, tmp_path, data, data_dir):
    model_dir = save_model(tmp_path / "m", data, tokenizer=False)
    r = run_json(cli, capsys, ["analyze", "--model", str(model_dir), "--data", str(data_dir), "--batches", "2",
                               "--batch-size", "2", "--seq-len", "12", "--seed", "1"])
    assert r["first_token"] == {"mode": "bos", "id": data.bos_id, "why": "auto: a gatedattn model: `data prepare` starts every training sequence with BOS"} and r["seq_len"] == 12
    assert r["windows"]["source"] == "data" and r["windows"]["documents"] == data.manifest.val.documents
    w = document_windows(val_documents(data), 12, 4, data.bos_id, seed=1)
    direct = analyze(GatedLM.from_pretrained(model_dir), w.split(2))
    assert r["val_loss"] == direct["val_loss"] and r["f_attn_per_head"] == direct["f_attn_per_head"]


def one_line_error(cli, capsys, argv):
    try:
        rc = cli([*argv, "--device", "cpu"])
    except SystemExit as e:  # argparse
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "Traceback" not in err
    return err.splitlines()[-1]


def test_cli_refusals_are_one_line(cli, capsys, tmp_path, data, data_dir, texts):
    model_dir = save_model(tmp_path / "m", data)
    no_bos = save_model(tmp_path / "no_bos", data, bos=False)
    no_tok = save_model(tmp_path / "no_tok", data, tokenizer=False)
    text = ["--text", *map(str, texts)]
    base = ["analyze", "--model", str(model_dir)]
    assert "choose auto, bos, none or a token id" in one_line_error(cli, capsys, [*base, *text, "--first-token", "x"])
    assert "outside the model's vocabulary" in one_line_error(cli, capsys,
                                                              [*base, *text, "--first-token", "100000"])
    assert "no bos_token_id" in one_line_error(cli, capsys, ["analyze", "--model", str(no_bos), *text, "--first-token",
                                                            "bos"])
    assert "has no tokenizer" in one_line_error(cli, capsys, ["analyze", "--model", str(no_tok), *text])
    assert "not enough text for 400 windows" in one_line_error(cli, capsys, [*base, *text, "--batches", "100"])
    assert "not allowed with argument" in one_line_error(cli, capsys, [*base, *text, "--data", str(data_dir)])
    assert "input not found" in one_line_error(cli, capsys, [*base, "--text", str(tmp_path / "nope.txt")])
