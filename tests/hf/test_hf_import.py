"""Importing HF checkpoints: Qwen3 / Llama / Qwen2 and the official gated-attention layout.

Every reference is a tiny random transformers model built here (no downloads), saved
to tmp_path with ``save_pretrained`` and imported from the directory.
"""

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb, repeat_kv

from gatedattn import GatedAttnError, RopeConfig
from gatedattn.hf import importers
from gatedattn.hf import load as hf_load
from gatedattn.hf import export_hf, load_model
from gatedattn.hf.layouts import join_grouped, join_interleaved, split_grouped, split_interleaved
from gatedattn.models.lm import GatedLM, ModelConfig
from hf_models import COMMON, V, make_hf, randomize  # noqa: F401  (shared with the train tests)


def logits(model, ids):
    with torch.no_grad():
        out = model(ids)
    return out.logits if hasattr(out, "logits") else out


# ----------------------------------------------------------------------------- stock families
FAMILIES = {
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, dict(head_dim=16)),
    "qwen3-bias-tied": (Qwen3ForCausalLM, Qwen3Config, dict(head_dim=8, attention_bias=True, tie_word_embeddings=True)),
    "llama": (LlamaForCausalLM, LlamaConfig, dict()),
    "llama-bias": (LlamaForCausalLM, LlamaConfig, dict(attention_bias=True, num_key_value_heads=1)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, dict()),
    "qwen2-tied": (Qwen2ForCausalLM, Qwen2Config, dict(tie_word_embeddings=True, rms_norm_eps=1e-5)),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_stock_logits_equal_transformers(tmp_path, family):
    cls, config_cls, fields = FAMILIES[family]
    ref, path = make_hf(cls, config_cls, tmp_path, **fields)
    ours = load_model(path)
    assert ours.cfg.variant == "baseline" and ours.cfg.attention.gate is None
    ids = torch.randint(0, V, (2, 13))
    a, b = logits(ref, ids), logits(ours, ids)
    assert a.abs().max() > 0.5  # not a degenerate comparison
    torch.testing.assert_close(b, a, atol=1e-4, rtol=0)
    cfg = ours.cfg.attention
    assert cfg.qk_norm == family.startswith("qwen3")
    assert cfg.qkv_bias == ("bias" in family or family.startswith("qwen2"))
    assert cfg.o_bias == ("bias" in family)
    assert ours.cfg.tie_embeddings == ("tied" in family)
    assert hf_load.load_config(path) == ours.cfg


@pytest.mark.parametrize("cls,config_cls,rope", [
    (Qwen3ForCausalLM, Qwen3Config, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                                     "rope_theta": 500.0}),
    (LlamaForCausalLM, LlamaConfig, {"rope_type": "linear", "factor": 3.0, "rope_theta": 1000.0}),
])
def test_rope_scaling_maps_exactly(tmp_path, cls, config_cls, rope):
    ref, path = make_hf(cls, config_cls, tmp_path, rope_parameters=rope, max_position_embeddings=64)
    ours = load_model(path)
    assert ours.cfg.attention.rope.scaling == rope["rope_type"]
    ids = torch.randint(0, V, (1, 40))  # well past the original length
    torch.testing.assert_close(logits(ours, ids), logits(ref, ids), atol=1e-4, rtol=0)


def test_old_style_rope_keys_load_like_transformers(tmp_path):
    _, path = make_hf(LlamaForCausalLM, LlamaConfig, tmp_path)
    raw = json.loads((path / "config.json").read_text())
    raw.pop("rope_parameters")
    raw.update(rope_theta=777.0, rope_scaling={"type": "linear", "factor": 2.0})
    (path / "config.json").write_text(json.dumps(raw))
    ref = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    ours = load_model(path)
    assert ours.cfg.attention.rope.theta == 777.0 and ours.cfg.attention.rope.factor == 2.0
    ids = torch.randint(0, V, (1, 20))
    torch.testing.assert_close(logits(ours, ids), logits(ref, ids), atol=1e-4, rtol=0)


def test_sharded_checkpoint_loads(tmp_path):
    ref, _ = make_hf(Qwen3ForCausalLM, Qwen3Config, tmp_path, head_dim=16)
    path = tmp_path / "sharded"
    ref.save_pretrained(path, max_shard_size="20KB")
    assert (path / "model.safetensors.index.json").is_file() and len(list(path.glob("*.safetensors"))) > 2
    ids = torch.randint(0, V, (2, 7))
    torch.testing.assert_close(logits(load_model(path), ids), logits(ref, ids), atol=1e-4, rtol=0)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[1]
    (path / victim).unlink()
    with pytest.raises(GatedAttnError, match=victim):
        load_model(path)


def test_imported_generation_cached_equals_uncached_and_transformers(tmp_path):
    ref, path = make_hf(Qwen3ForCausalLM, Qwen3Config, tmp_path, head_dim=16)
    ours = load_model(path)
    ids = torch.randint(0, V, (2, 5))
    cached = ours.generate(ids, 12, temperature=0)
    assert torch.equal(cached, ours.generate(ids, 12, temperature=0, use_cache=False))
    hf_tokens = ref.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(cached, hf_tokens)


# ----------------------------------------------------------------------------- official gated layout
class OfficialGatedQwen3Attention(nn.Module):
    """Independent reference for the official gated-attention Qwen3 attention
    (github.com/qiuzh20/gated_attention, modeling_qwen3.py), written out by hand:
    q_proj output viewed as (B, T, n_kv_heads, -1) holds per KV group the G query heads
    followed by their G gates; q/k/v/o biases follow ``qkv_bias``, q/k norms ``use_qk_norm``."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.H, self.Hkv, self.d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.headwise = bool(config.headwise_attn_output_gate)
        bias = config.qkv_bias
        width = self.H * self.d + self.H if self.headwise else self.H * self.d * 2
        self.q_proj = nn.Linear(config.hidden_size, width, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.Hkv * self.d, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.Hkv * self.d, bias=bias)
        self.o_proj = nn.Linear(self.H * self.d, config.hidden_size, bias=bias)
        self.use_qk_norm = config.use_qk_norm
        if self.use_qk_norm:
            self.q_norm = Qwen3RMSNorm(self.d, eps=config.rms_norm_eps)
            self.k_norm = Qwen3RMSNorm(self.d, eps=config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        B, T, _ = hidden_states.shape
        H, Hkv, d = self.H, self.Hkv, self.d
        G = H // Hkv
        q = self.q_proj(hidden_states).view(B, T, Hkv, -1)
        if self.headwise:
            q, gate = torch.split(q, [d * G, G], dim=-1)
            gate = gate.reshape(B, T, H, 1)
        else:
            q, gate = torch.split(q, [d * G, d * G], dim=-1)
            gate = gate.reshape(B, T, H, d)
        q = q.reshape(B, T, H, d).transpose(1, 2)
        k = self.k_proj(hidden_states).view(B, T, Hkv, d).transpose(1, 2)
        v = self.v_proj(hidden_states).view(B, T, Hkv, d).transpose(1, 2)
        if self.use_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = repeat_kv(k, G), repeat_kv(v, G)
        scores = q @ k.transpose(2, 3) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        out = (torch.softmax(scores.float(), dim=-1) @ v).transpose(1, 2)  # (B, T, H, d)
        out = out * torch.sigmoid(gate)
        return self.o_proj(out.reshape(B, T, H * d)), None


def make_official(tmp_path, *, headwise: bool, bias: bool, qk_norm: bool, n_kv: int = 2, name="official"):
    config = Qwen3Config(**{**COMMON, "num_key_value_heads": n_kv}, head_dim=16, attention_bias=bias,
                         elementwise_attn_output_gate=not headwise, headwise_attn_output_gate=headwise,
                         qkv_bias=bias, use_qk_norm=qk_norm)
    config._attn_implementation = "eager"
    model = Qwen3ForCausalLM(config)
    for i, layer in enumerate(model.model.layers):
        layer.self_attn = OfficialGatedQwen3Attention(config, i)
    randomize(model, scale=0.2)
    model.save_pretrained(tmp_path / name)
    return model, tmp_path / name


OFFICIAL = {"elementwise": dict(headwise=False, bias=True, qk_norm=True),
            "headwise": dict(headwise=True, bias=False, qk_norm=False)}


@pytest.mark.parametrize("kind", list(OFFICIAL))
def test_official_gated_checkpoint_matches_reference(tmp_path, kind):
    ref, path = make_official(tmp_path, **OFFICIAL[kind])
    q_rows = load_file(path / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"].shape[0]
    assert q_rows == (4 * 16 * 2 if kind == "elementwise" else 4 * 16 + 4)
    ours = load_model(path)
    assert ours.cfg.variant == ("gated" if kind == "elementwise" else "gated-headwise")
    assert ours.cfg.attention.gate.granularity == kind
    assert ours.cfg.attention.qk_norm == OFFICIAL[kind]["qk_norm"]
    ids = torch.randint(0, V, (2, 11))
    torch.testing.assert_close(logits(ours, ids), logits(ref, ids), atol=1e-4, rtol=0)
    # and it survives our own format
    ours.save_pretrained(tmp_path / "ours")
    assert torch.equal(logits(load_model(tmp_path / "ours"), ids), logits(ours, ids))


@pytest.mark.parametrize("kind", list(OFFICIAL))
def test_wrong_interleaved_reading_of_official_layout_is_caught(tmp_path, kind, monkeypatch):
    """Reading the KV-grouped layout as Qwen3-Next's per-head interleaving loads without
    any shape error but computes something else: the comparison above would catch it."""
    ref, path = make_official(tmp_path, **OFFICIAL[kind])
    ids = torch.randint(0, V, (2, 11))
    monkeypatch.setattr(importers, "split_grouped", lambda t, H, Hkv, d, w: split_interleaved(t, H, d, w))
    wrong = load_model(path)
    assert (logits(wrong, ids) - logits(ref, ids)).abs().max() > 1e-2


def test_layouts_coincide_only_without_gqa():
    d, w = 4, 4
    for H, Hkv in ((4, 4), (4, 2), (6, 1)):
        packed = torch.randn(H * (d + w), 3)
        g, i = split_grouped(packed, H, Hkv, d, w), split_interleaved(packed, H, d, w)
        same = all(torch.equal(a, b) for a, b in zip(g, i))
        assert same == (H == Hkv)
        assert torch.equal(join_grouped(*g, H, Hkv, d, w), packed)
        assert torch.equal(join_interleaved(*i, H, d, w), packed)
    # headwise (w = 1) and biases (1-D) too
    packed = torch.randn(4 * (d + 1))
    assert torch.equal(join_grouped(*split_grouped(packed, 4, 2, d, 1), 4, 2, d, 1), packed)


# ----------------------------------------------------------------------------- official layout: export
@pytest.mark.parametrize("kind", list(OFFICIAL))
def test_official_round_trip_is_bit_exact(tmp_path, kind):
    """official -> gatedattn -> official gives back the same tensors, bit for bit."""
    _, path = make_official(tmp_path, **OFFICIAL[kind])
    export_hf(load_model(path), tmp_path / "again", layout="official")
    before, after = load_file(path / "model.safetensors"), load_file(tmp_path / "again" / "model.safetensors")
    assert sorted(before) == sorted(after)
    for name in before:
        assert before[name].dtype == after[name].dtype and torch.equal(before[name], after[name]), name
    raw, again = (json.loads((p / "config.json").read_text()) for p in (path, tmp_path / "again"))
    for key in importers.OFFICIAL_GATE_KEYS + ("attention_bias", "num_key_value_heads", "head_dim"):
        assert again[key] == raw[key], key


@pytest.mark.parametrize("variant,n_kv", [("gated", 2), ("gated-headwise", 2), ("gated", 4), ("gated-headwise", 1)])
def test_gated_model_exports_to_the_official_layout(tmp_path, variant, n_kv):
    """Our gated models, written in the official layout, run in the reference official
    attention with the same logits (and load back bit-exactly)."""
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("micro", variant, vocab_size=V, tie_embeddings=False)
    model = randomize(GatedLM(cfg.replace(attention=cfg.attention.replace(n_kv_heads=n_kv))))
    export_hf(model, tmp_path / "official", layout="official")
    config = Qwen3Config.from_pretrained(tmp_path / "official")
    config._attn_implementation = "eager"
    ref = Qwen3ForCausalLM(config)
    for i, layer in enumerate(ref.model.layers):
        layer.self_attn = OfficialGatedQwen3Attention(config, i)
    missing, unexpected = ref.load_state_dict(load_file(tmp_path / "official" / "model.safetensors"), strict=False)
    assert not unexpected and missing == []
    ids = torch.randint(0, V, (2, 11))
    torch.testing.assert_close(logits(ref.eval(), ids), logits(model, ids), atol=1e-4, rtol=0)
    again = load_model(tmp_path / "official")
    assert again.cfg.attention == model.cfg.attention and torch.equal(logits(again, ids), logits(model, ids))


@pytest.mark.parametrize("variant,fields,message", [
    ("g1-silu", {}, "activation='silu'"),
    ("hyga", {}, "h_dim=|cross_head"),
    ("sink", {}, "no gate"),
    ("gated", {"rope": RopeConfig(fraction=0.5)}, "fraction=0.5"),
    ("gated", {"qkv_bias": True}, "qkv_bias"),
])
def test_official_export_refusals_write_nothing(tmp_path, variant, fields, message):
    cfg = ModelConfig.from_preset("micro", variant, vocab_size=V)
    model = GatedLM(cfg.replace(attention=cfg.attention.replace(**fields)))
    with pytest.raises(GatedAttnError, match=message) as err:
        export_hf(model, tmp_path / "out", layout="official")
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- refusals
def _write_config(path, **changes):
    raw = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    (path / "config.json").write_text(json.dumps(raw))


@pytest.mark.parametrize("changes,field", [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0, "layer_types": None}, "layer_types"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}, "rope_type"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}}, "rope_type"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0, "truncate": False,
                          "original_max_position_embeddings": 16}}, "truncate"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"elementwise_attn_output_gate": True, "headwise_attn_output_gate": True}, "elementwise_attn_output_gate"),
    ({"elementwise_attn_output_gate": True, "qkv_bias": False, "attention_bias": True}, "attention_bias"),
    ({"model_type": "bert"}, "model_type"),
    ({"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"]}, "layer 0 has a MoE MLP"),
    ({"architectures": ["Qwen3ForSequenceClassification"]}, "architectures"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
])
def test_unsupported_qwen3_config_fields_are_refused(tmp_path, changes, field):
    _, path = make_hf(Qwen3ForCausalLM, Qwen3Config, tmp_path, head_dim=16)
    _write_config(path, **changes)
    with pytest.raises(GatedAttnError, match=field):
        load_model(path)


@pytest.mark.parametrize("changes,field", [({"mlp_bias": True}, "mlp_bias"), ({"hidden_act": "relu"}, "hidden_act")])
def test_unsupported_llama_config_fields_are_refused(tmp_path, changes, field):
    _, path = make_hf(LlamaForCausalLM, LlamaConfig, tmp_path)
    _write_config(path, **changes)
    with pytest.raises(GatedAttnError, match=field):
        load_model(path)


def _edit_weights(path, edit):
    state = load_file(path / "model.safetensors")
    edit(state)
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    (path / "checksums.json").unlink(missing_ok=True)  # edited by hand: only the format checks apply


@pytest.mark.parametrize("edit,message", [
    (lambda s: s.pop("model.layers.1.self_attn.k_proj.weight"), "'model.layers.1.self_attn.k_proj.weight' is missing"),
    (lambda s: s.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(95, 64)}),
     r"'model.layers.0.mlp.up_proj.weight' has shape \(95, 64\)"),
    (lambda s: s.update({"model.layers.0.self_attn.extra.weight": torch.zeros(3)}),
     "unexpected tensor 'model.layers.0.self_attn.extra.weight'"),
    (lambda s: s.pop("lm_head.weight"), "'lm_head.weight' is missing"),
])
def test_mismatched_weights_are_refused_naming_the_tensor(tmp_path, edit, message):
    _, path = make_hf(Qwen3ForCausalLM, Qwen3Config, tmp_path, head_dim=16)
    _edit_weights(path, edit)
    with pytest.raises(GatedAttnError, match=message):
        load_model(path)


def test_official_layout_with_stock_q_proj_is_refused(tmp_path):
    """A gate flag on a checkpoint whose q_proj has no gate rows: a shape error, not a silent load."""
    _, path = make_hf(Qwen3ForCausalLM, Qwen3Config, tmp_path, head_dim=16)
    _write_config(path, elementwise_attn_output_gate=True)
    with pytest.raises(GatedAttnError, match=r"q_proj.weight' has shape \(64, 64\), the config needs \(128, 64\)"):
        load_model(path)


def test_truncated_and_missing_files_are_refused(tmp_path):
    _, path = make_hf(Qwen3ForCausalLM, Qwen3Config, tmp_path, head_dim=16)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(GatedAttnError, match="truncated or corrupt"):
        load_model(path)
    (path / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(GatedAttnError, match="truncated or corrupt"):
        load_model(path)
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(GatedAttnError, match="only safetensors"):
        load_model(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(GatedAttnError, match="not valid JSON"):
        load_model(path)
    with pytest.raises(GatedAttnError, match="config.json is missing"):
        load_model(tmp_path)


def test_own_format_loads_exactly_and_checks_tensors(tmp_path):
    model = GatedLM(ModelConfig.from_preset("micro", "hyga-sink", vocab_size=V))
    randomize(model)
    model.save_pretrained(tmp_path / "m")
    again = load_model(tmp_path / "m")
    ids = torch.randint(0, V, (2, 9))
    assert again.cfg == model.cfg and torch.equal(logits(again, ids), logits(model, ids))
    _edit_weights(tmp_path / "m", lambda s: s.pop("blocks.0.attn.gate.c.proj.weight"))
    with pytest.raises(GatedAttnError, match="blocks.0.attn.gate.c.proj.weight"):
        load_model(tmp_path / "m")
