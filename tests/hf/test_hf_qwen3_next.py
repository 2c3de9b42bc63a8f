"""A `gated` model as a stock Qwen3-Next checkpoint, and back.

Stock transformers (``Qwen3NextForCausalLM``, no gatedattn code involved) must compute
the same logits and the same greedy generation; the reverse import reads both our
export and a Qwen3-Next model built by transformers itself.
"""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM

from gatedattn import GatedAttnError, RopeConfig
from gatedattn.hf import export_hf, load_model
from gatedattn.models.lm import GatedLM, ModelConfig

V = 97


def gated(n_kv=2, fraction=1.0, variant="gated", bias=False, **kw) -> GatedLM:
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("micro", variant, vocab_size=V, **kw)
    a = cfg.attention
    gate = a.gate.__class__(**{**a.gate.__dict__, "bias": bias}) if a.gate is not None else None
    a = a.replace(n_kv_heads=n_kv, rope=RopeConfig(fraction=fraction, original_max_len=cfg.max_seq_len),
                  qkv_bias=bias, o_bias=bias, gate=gate)
    model = GatedLM(cfg.replace(attention=a))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norms away from one, biases away from zero
    return model.eval()


def logits(model, ids):
    with torch.no_grad():
        out = model(ids)
    return out.logits if hasattr(out, "logits") else out


CASES = {"gqa": dict(n_kv=2), "mha": dict(n_kv=4), "gqa-partial-rope": dict(n_kv=2, fraction=0.25),
         "mha-partial-rope": dict(n_kv=4, fraction=0.5), "bias-untied": dict(bias=True, tie_embeddings=False)}


@pytest.mark.parametrize("case", list(CASES))
def test_gated_exports_as_stock_qwen3_next(tmp_path, case):
    model = gated(**CASES[case])
    export_hf(model, tmp_path / "q3n")
    config = json.loads((tmp_path / "q3n" / "config.json").read_text())
    n = model.cfg.n_layers
    assert config["architectures"] == ["Qwen3NextForCausalLM"] and config["model_type"] == "qwen3_next"
    assert config["layer_types"] == ["full_attention"] * n and config["mlp_only_layers"] == list(range(n))
    assert config["rope_parameters"]["partial_rotary_factor"] == CASES[case].get("fraction", 1.0)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "q3n", attn_implementation="eager").eval()
    assert type(hf) is Qwen3NextForCausalLM
    ids = torch.randint(0, V, (2, 13))
    ours, theirs = logits(model, ids), logits(hf, ids)
    assert ours.std() > 0.1  # not a degenerate comparison
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)
    prompt = ids[:1, :5]
    want = model.generate(prompt, 12, temperature=0)
    got = hf.generate(prompt, max_new_tokens=12, do_sample=False, min_new_tokens=12)
    assert torch.equal(got, want)
    # and back: the reverse import gives the same model
    again = load_model(tmp_path / "q3n")
    assert again.cfg.attention == model.cfg.attention and again.cfg.variant == "gated"
    torch.testing.assert_close(logits(again, ids), ours, atol=1e-6, rtol=0)


def test_norms_are_stored_zero_centred(tmp_path):
    """Qwen3-Next's RMSNorm computes x_hat * (1 + w): exporting our w unchanged would
    still load, but compute something else; the stored weights are w - 1."""
    from safetensors.torch import load_file

    model = gated()
    export_hf(model, tmp_path / "q3n")
    stored = load_file(tmp_path / "q3n" / "model.safetensors")
    for ours, theirs in (("norm.weight", "model.norm.weight"),
                         ("blocks.0.attn.q_norm.weight", "model.layers.0.self_attn.q_norm.weight")):
        torch.testing.assert_close(stored[theirs], model.state_dict()[ours] - 1)


def _config(**fields) -> Qwen3NextConfig:
    return Qwen3NextConfig(**{**dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16, intermediate_size=96,
                                     layer_types=["full_attention"] * 2, mlp_only_layers=[0, 1]), **fields})


def _stock_qwen3_next(**fields) -> Qwen3NextForCausalLM:
    config = _config(**fields)
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    model = Qwen3NextForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 * torch.randn_like(p))  # zero-centred norms far from zero too
    return model.eval()


@pytest.mark.parametrize("fields", [dict(), dict(partial_rotary_factor=0.25, num_key_value_heads=4)])
def test_stock_qwen3_next_imports_with_equal_logits(tmp_path, fields):
    hf = _stock_qwen3_next(**fields)
    hf.save_pretrained(tmp_path / "q3n")
    ours = load_model(tmp_path / "q3n")
    assert ours.cfg.attention.rope.fraction == fields.get("partial_rotary_factor", 0.25)
    ids = torch.randint(0, V, (2, 11))
    torch.testing.assert_close(logits(ours, ids), logits(hf, ids), atol=1e-4, rtol=0)


@pytest.mark.parametrize("fields,message", [
    (dict(layer_types=["full_attention", "linear_attention"]), r"layer_types\[1\]='linear_attention'.*layer 1"),
    (dict(layer_types=None), r"layer_types\[0\]='linear_attention'"),
    (dict(mlp_only_layers=[0], num_experts=4, num_experts_per_tok=2), r"layer 1 has a MoE MLP"),
])
def test_hybrid_and_moe_qwen3_next_are_refused_naming_the_layer(tmp_path, fields, message):
    config = _config(**fields)
    config.save_pretrained(tmp_path / "q3n")
    with pytest.raises(GatedAttnError, match=message) as err:
        load_model(tmp_path / "q3n")
    assert "\n" not in str(err.value)


REFUSED = {
    "baseline": (dict(variant="baseline"), "no gate"),
    "headwise": (dict(variant="gated-headwise"), "granularity='headwise'"),
    "g2": (dict(variant="g2-value"), "position='g2'"),
    "silu": (dict(variant="g1-silu"), "activation='silu'"),
    "ns-sigmoid": (dict(variant="g1-ns-sigmoid"), "activation='ns-sigmoid'"),
    "additive": (dict(variant="g1-additive-silu"), "activation='silu'|combine='add'"),
    "shared": (dict(variant="g1-shared"), "shared=True"),
    "static": (dict(variant="g1-static"), "source='static'"),
    "hyga": (dict(variant="hyga"), "h_dim=|cross_head"),
    "hyga-sink": (dict(variant="hyga-sink"), "h_dim=|cross_head|sink"),
    "lowrank": (dict(variant="hyga-lowrank"), "rank="),
    "no-qk-norm": (dict(qk_norm=False), "qk_norm=False"),
    "bias-mismatch": (dict(bias=True), "attention_bias"),
}


def _refused_model(case):
    kw, _ = REFUSED[case]
    if case == "bias-mismatch":
        model = gated(bias=True)
        a = model.cfg.attention
        return GatedLM(model.cfg.replace(attention=a.replace(o_bias=False)))
    return gated(**kw)


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_qwen3_next_cannot_express_is_refused_in_one_line(tmp_path, case):
    model = _refused_model(case)
    with pytest.raises(GatedAttnError, match=REFUSED[case][1]) as err:
        export_hf(model, tmp_path / "out", layout="qwen3-next")
    assert "\n" not in str(err.value) and "qwen3-next" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_mla_and_sink_are_refused(tmp_path):
    torch.manual_seed(0)
    mla = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=V, attention_fields={"kv": "mla"}))
    with pytest.raises(GatedAttnError, match="kv='mla'|qk_norm"):
        export_hf(mla, tmp_path / "out", layout="qwen3-next")
    model = gated()
    sink = GatedLM(model.cfg.replace(attention=model.cfg.attention.replace(sink=True)))
    with pytest.raises(GatedAttnError, match="sink"):
        export_hf(sink, tmp_path / "out", layout="qwen3-next")
    assert not (tmp_path / "out").exists()
