"""``config.json`` read as a plain JSON file, as a tool that never imports transformers reads it.

Every saved model carries transformers' standard keys beside its own fields; here they are
checked against the model's own fields (for every attention preset) and against the source
model's config (for every import layout), and a file where the two disagree is refused.
"""

import json
import shutil

import pytest
from transformers import (AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

import gatedattn.hf.register  # noqa: F401  (the Auto classes know model_type "gatedattn")
from gatedattn.hf import load_model
from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.integrity import record
from gatedattn.layers.config import RopeConfig
from gatedattn.layers.variants import VARIANTS
from gatedattn.models.lm import GatedLM, ModelConfig
from hf_models import make_hf
from test_hf_gguf import tiny_hf, write_gguf  # tests/hf is on the path, as pytest runs it
from test_hf_import import make_official
from test_hf_qwen3_next import _stock_qwen3_next

STANDARD = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers",
            "intermediate_size", "max_position_embeddings", "hidden_act", "rope_theta", "rope_parameters",
            "tie_word_embeddings", "rms_norm_eps", "pad_token_id", "bos_token_id", "eos_token_id")


def saved_json(model: GatedLM, path) -> dict:
    model.save_pretrained(path)
    return json.loads((path / "config.json").read_text())


def rewrite(path, **changes) -> None:
    """Change config.json's keys (None removes one) and record its new checksum, as a user's edit."""
    raw = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        raw.pop(key) if value is None else raw.__setitem__(key, value)
    (path / "config.json").write_text(json.dumps(raw))
    record(path / "config.json")


@pytest.fixture(scope="module")
def micro_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "micro"
    GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=100, eos_token_id=3)).save_pretrained(path)
    return path


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_preset_writes_the_standard_keys_its_fields_give(tmp_path, variant):
    j = saved_json(GatedLM(ModelConfig.from_preset("micro", variant, vocab_size=100, eos_token_id=7)), tmp_path / "m")
    a = j["attention"]
    assert set(STANDARD) <= set(j)
    assert (j["hidden_size"], j["num_attention_heads"], j["num_key_value_heads"], j["head_dim"]) == (
        a["d_model"], a["n_heads"], a["n_kv_heads"], a["head_dim"])
    assert (j["num_hidden_layers"], j["intermediate_size"], j["max_position_embeddings"]) == (
        j["n_layers"], j["ffn_dim"], j["max_seq_len"])
    assert j["hidden_act"] == "silu" and j["rms_norm_eps"] == j["norm_eps"]
    assert j["rope_theta"] == a["rope"]["theta"] == j["rope_parameters"]["rope_theta"]
    assert j["rope_parameters"]["rope_type"] == "default"
    assert j["tie_word_embeddings"] is j["tie_embeddings"]
    assert j["pad_token_id"] == j["eos_token_id"] == 7
    assert j["dtype"] == "float32"


@pytest.mark.parametrize("fields,act,norm_key", [
    (dict(mlp="gelu", norm="layer"), "gelu", "layer_norm_eps"),
    (dict(mlp="relu"), "relu", "rms_norm_eps"),
])
def test_the_mlp_and_norm_give_hidden_act_and_the_eps_key(tmp_path, fields, act, norm_key):
    j = saved_json(GatedLM(ModelConfig.from_preset("micro", "baseline", vocab_size=100, **fields)), tmp_path / "m")
    assert j["hidden_act"] == act and j[norm_key] == j["norm_eps"]
    assert not ({"rms_norm_eps", "layer_norm_eps"} - {norm_key}) & set(j)


@pytest.mark.parametrize("rope,expected", [
    (RopeConfig(theta=5e5, scaling="linear", factor=4.0, original_max_len=64),
     {"rope_type": "linear", "rope_theta": 5e5, "factor": 4.0, "original_max_position_embeddings": 64}),
    (RopeConfig(scaling="yarn", factor=2.0, original_max_len=32, beta_fast=16.0, beta_slow=2.0),
     {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0, "original_max_position_embeddings": 32,
      "beta_fast": 16.0, "beta_slow": 2.0}),
    (RopeConfig(fraction=0.5), {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
])
def test_rope_scaling_and_partial_rotation_are_written_as_rope_parameters(tmp_path, rope, expected):
    cfg = ModelConfig.from_preset("micro", "baseline", vocab_size=100, attention_fields={"rope": rope})
    assert saved_json(GatedLM(cfg), tmp_path / "m")["rope_parameters"] == expected


def _hf_source(kind, tmp_path):
    """(path to import, the source's transformers config) for each import layout."""
    if kind in ("llama", "qwen2", "qwen3"):
        classes = {"llama": (LlamaForCausalLM, LlamaConfig, {}), "qwen2": (Qwen2ForCausalLM, Qwen2Config, {}),
                   "qwen3": (Qwen3ForCausalLM, Qwen3Config, {"head_dim": 32})}[kind]
        model, path = make_hf(classes[0], classes[1], tmp_path, **classes[2], rope_parameters={
            "rope_type": "default", "rope_theta": 5e5}, max_position_embeddings=96, rms_norm_eps=1e-5)
        return path, model.config
    if kind == "gguf":
        model = tiny_hf("llama")
        write_gguf(tmp_path / "m.gguf", model)
        return tmp_path / "m.gguf", model.config
    if kind == "official-gated":
        model, path = make_official(tmp_path, headwise=True, bias=False, qk_norm=False)
        return path, model.config
    model = _stock_qwen3_next(partial_rotary_factor=0.25, num_key_value_heads=4)
    model.save_pretrained(tmp_path / "next")
    return tmp_path / "next", model.config


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "gguf", "official-gated", "qwen3-next"])
def test_an_imported_model_writes_its_sources_standard_keys(tmp_path, kind):
    source, hf = _hf_source(kind, tmp_path)
    j = saved_json(load_model(source), tmp_path / "converted")
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    assert {k: j[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                              "num_hidden_layers", "intermediate_size", "max_position_embeddings",
                              "tie_word_embeddings", "hidden_act")} == {
        "hidden_size": hf.hidden_size, "num_attention_heads": hf.num_attention_heads,
        "num_key_value_heads": hf.num_key_value_heads, "head_dim": head_dim,
        "num_hidden_layers": hf.num_hidden_layers, "intermediate_size": hf.intermediate_size,
        "max_position_embeddings": hf.max_position_embeddings, "tie_word_embeddings": hf.tie_word_embeddings,
        "hidden_act": hf.hidden_act}
    assert j["rms_norm_eps"] == pytest.approx(hf.rms_norm_eps, rel=1e-6)  # a GGUF file holds it as float32
    assert j["rope_theta"] == j["rope_parameters"]["rope_theta"] == hf.rope_parameters["rope_theta"]
    assert j["rope_parameters"].get("partial_rotary_factor", 1.0) == hf.rope_parameters.get(
        "partial_rotary_factor", getattr(hf, "partial_rotary_factor", 1.0))


@pytest.mark.parametrize("key,value", [
    ("hidden_size", 128), ("num_attention_heads", 8), ("num_key_value_heads", 4), ("head_dim", 32),
    ("num_hidden_layers", 3), ("intermediate_size", 100), ("max_position_embeddings", 512),
    ("hidden_act", "gelu"), ("rope_theta", 5e5), ("rope_parameters", {"rope_type": "linear", "rope_theta": 1e4}),
    ("tie_word_embeddings", False), ("rms_norm_eps", 1e-5), ("pad_token_id", 100),
])
def test_a_standard_key_that_disagrees_with_the_fields_is_refused_naming_it(micro_dir, tmp_path, key, value):
    path = tmp_path / "edited"
    shutil.copytree(micro_dir, path)
    rewrite(path, **{key: value})
    for load in (GatedLM.from_pretrained, load_model, AutoConfig.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(GatedAttnError, match=key):
            load(path)


def test_a_file_without_the_standard_keys_loads_the_same_model(micro_dir, tmp_path):
    path = tmp_path / "older"
    shutil.copytree(micro_dir, path)
    rewrite(path, **{key: None for key in STANDARD if key not in ("bos_token_id", "eos_token_id")})
    assert "hidden_size" not in json.loads((path / "config.json").read_text())
    assert GatedLM.from_pretrained(path).cfg == GatedLM.from_pretrained(micro_dir).cfg
    assert AutoConfig.from_pretrained(path).hidden_size == 64


def test_the_hf_config_reads_the_standard_names(micro_dir):
    config = AutoConfig.from_pretrained(micro_dir)
    j = json.loads((micro_dir / "config.json").read_text())
    assert [getattr(config, k) for k in ("hidden_size", "num_attention_heads", "head_dim", "num_hidden_layers",
                                         "intermediate_size", "hidden_act", "rope_theta", "tie_word_embeddings")] == [
        j[k] for k in ("hidden_size", "num_attention_heads", "head_dim", "num_hidden_layers", "intermediate_size",
                       "hidden_act", "rope_theta", "tie_word_embeddings")]
    config.hidden_act = "gelu"
    assert config.mlp == "gelu"
    with pytest.raises(GatedAttnError, match="hidden_act='tanh'.*silu"):
        config.hidden_act = "tanh"


def test_setting_the_width_or_heads_derives_head_dim_as_llama_does(micro_dir):
    llama = LlamaConfig(hidden_size=128, num_attention_heads=4)
    config = AutoConfig.from_pretrained(micro_dir, hidden_size=128)
    assert config.head_dim == llama.head_dim == 32
    config.num_attention_heads = 8
    assert config.head_dim == 16
    # a head_dim given beside them is kept, in whichever order the keywords come
    for kwargs in ({"hidden_size": 128, "head_dim": 16}, {"head_dim": 16, "hidden_size": 128}):
        assert AutoConfig.from_pretrained(micro_dir, **kwargs).head_dim == 16
    # a head_dim set apart from the shape stays when the shape changes
    config = AutoConfig.from_pretrained(micro_dir, head_dim=32)
    config.hidden_size = 128
    assert config.head_dim == 32
