"""``--first-token auto``: the first position follows what the model's own tokenizer puts
before text, read from tiny GGUF files of every supported architecture (written with
``gguf.GGUFWriter``) with ``tokenizer.ggml.add_bos_token`` true, false and absent, and from
model directories; ``analyze`` and the real-model study run end to end on each."""

import json

import pytest

from gatedattn.analysis.windows import _probe_convention, resolve_first_token, tokenizer_convention
from gatedattn.cli import main
from gatedattn.hf import load_config, model_tokenizer
from gatedattn.infra.errors import GatedAttnError

from test_hf_gguf import FAMILIES, V, tiny_hf, write_gguf  # tests/hf is on the path, as pytest runs it

BOS = V - 1  # the id the tiny files name as their BOS


def _file(tmp_path, family: str, add_bos: bool | None):
    def flag(writer):
        if add_bos is not None:
            writer.add_add_bos_token(add_bos)

    name = f"{family}-{'absent' if add_bos is None else add_bos}.gguf"
    return write_gguf(tmp_path / name, tiny_hf(family), extra=flag)


def _auto(path):
    tokenizer = model_tokenizer(path)
    return resolve_first_token("auto", load_config(path), convention=tokenizer_convention(path, tokenizer))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_auto_follows_the_gguf_add_bos_token_flag_of_every_architecture(tmp_path, family):
    with_bos = _auto(_file(tmp_path, family, True))
    assert (with_bos.mode, with_bos.id) == ("bos", BOS) and "add_bos_token is true" in with_bos.why
    without = _auto(_file(tmp_path, family, False))
    assert (without.mode, without.id) == ("none", None) and "add_bos_token is false" in without.why
    # no flag: what the embedded tokenizer itself does when it encodes text
    path = _file(tmp_path, family, None)
    unflagged = _auto(path)
    tokenizer = model_tokenizer(path)
    plain = tokenizer.encode("The first words", add_special_tokens=False).ids
    special = tokenizer.encode("The first words", add_special_tokens=True).ids
    assert unflagged.id == (special[0] if len(special) > len(plain) else None)


def test_bos_and_none_are_still_what_they_were(tmp_path):
    path = _file(tmp_path, "llama", False)
    cfg, tokenizer = load_config(path), model_tokenizer(path)
    convention = tokenizer_convention(path, tokenizer)
    assert resolve_first_token("none", cfg, convention=convention).mode == "none"
    bos = resolve_first_token("bos", cfg, tokenizer_bos=BOS, convention=convention)
    assert (bos.mode, bos.why) == ("bos", None)  # forced: the user's choice, whatever the tokenizer does


def test_auto_probes_a_tokenizer_template_and_refuses_where_nothing_says():
    from tokenizers import Tokenizer, models, processors

    tok = Tokenizer(models.WordLevel({"<s>": 0, "The": 1, "[UNK]": 2}, unk_token="[UNK]"))
    assert _probe_convention(tok).bos is None  # no template: nothing before text
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    assert _probe_convention(tok).bos == 0
    with pytest.raises(GatedAttnError, match="^--first-token auto: the model's tokenizer does not say"):
        resolve_first_token("auto", None, convention=tokenizer_convention(None, None))


def test_a_model_directorys_tokenizer_config_decides(tmp_path):
    from tokenizers import Tokenizer, models

    d = tmp_path / "m"
    d.mkdir()
    tok = Tokenizer(models.WordLevel({"<|bos|>": 0, "The": 1, "[UNK]": 2}, unk_token="[UNK]"))
    (d / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "bos_token": "<|bos|>"}))
    assert tokenizer_convention(d, tok).bos == 0
    (d / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False, "bos_token": "<|bos|>"}))
    assert tokenizer_convention(d, tok).bos is None


@pytest.mark.parametrize("add_bos", [True, False])
def test_analyze_uses_the_models_own_first_token_by_default(tmp_path, add_bos, capsys):
    path = _file(tmp_path, "qwen2", add_bos)
    text = tmp_path / "doc.txt"
    text.write_text("the sun is on the hill and the sea is in the sun. " * 40)
    assert main(["analyze", "--model", str(path), "--text", str(text), "--seq-len", "16", "--batches", "1",
                 "--batch-size", "2", "--json"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["first_token"]
    assert first["mode"] == ("bos" if add_bos else "none") and first["why"].startswith("auto: the GGUF's")
    assert main(["analyze", "--model", str(path), "--text", str(text), "--seq-len", "16", "--batches", "1",
                 "--batch-size", "2", "--json", "--first-token", "bos"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["first_token"]["mode"] == "bos"


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_real_model_study_runs_end_to_end_on_a_gguf_of_every_architecture(tmp_path, family, tiny_study_text,
                                                                              unrendered_plots):
    path = _file(tmp_path, family, family != "qwen2")  # Qwen2's convention: no BOS
    out = tmp_path / "study"
    assert main(["reproduce", "--study", "pretrained", "--quick", "--model", str(path), "--out", str(out), "-q",
                 "--set", "arms=sink,control"]) == 0
    part = json.loads((out / "results.json").read_text())["pretrained"]
    assert part["model"]["first_token"]["mode"] == ("none" if family == "qwen2" else "bos")
    assert part["model"]["layers"] == 2 and set(part["arms"]) == {"sink", "control"}
    assert {c["key"] for c in part["claims"]} >= {"lm-sink", "lm-window", "lm-sink-arm", "lm-streaming"}
    assert "auto: the GGUF's tokenizer.ggml.add_bos_token" in (out / "report.md").read_text()
