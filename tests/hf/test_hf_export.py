"""Export to stock transformers, the Auto classes for our format, and gate retrofit."""

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from gatedattn import GatedAttnError, RopeConfig
from gatedattn.hf import add_gates, export_hf, load_model, register_auto
from gatedattn.models.lm import GatedLM, ModelConfig
from gatedattn.layers.variants import VARIANTS

V = 97


def micro(variant="baseline", **kw) -> GatedLM:
    model = GatedLM(ModelConfig.from_preset("micro", variant, vocab_size=V, **kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.1 * torch.randn_like(p))  # norms away from one, biases away from zero
    return model.eval()


def logits(model, ids):
    with torch.no_grad():
        out = model(ids)
    return out.logits if hasattr(out, "logits") else out


# ----------------------------------------------------------------------------- export
EXPORTS = {
    "Qwen3ForCausalLM": dict(qk_norm=True, tie_embeddings=True),
    "Qwen3ForCausalLM-bias": dict(qk_norm=True, tie_embeddings=False, attention_fields={"qkv_bias": True, "o_bias": True}),
    "LlamaForCausalLM": dict(qk_norm=False, tie_embeddings=False),
    "LlamaForCausalLM-bias": dict(qk_norm=False, attention_fields={"qkv_bias": True, "o_bias": True}),
    "Qwen2ForCausalLM": dict(qk_norm=False, attention_fields={"qkv_bias": True}),
}


@pytest.mark.parametrize("arch", list(EXPORTS))
def test_export_loads_in_stock_transformers_with_identical_logits(tmp_path, arch):
    model = micro(**EXPORTS[arch])
    export_hf(model, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == [arch.split("-")[0]]
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    assert type(hf).__name__ == arch.split("-")[0]
    ids = torch.randint(0, V, (2, 12))
    torch.testing.assert_close(logits(hf, ids), logits(model, ids), atol=1e-5, rtol=0)
    again = load_model(tmp_path / "hf")  # and back: bit-exact
    assert again.cfg.attention == model.cfg.attention and torch.equal(logits(again, ids), logits(model, ids))


@pytest.mark.parametrize("rope", [RopeConfig(theta=500.0, scaling="yarn", factor=4.0, original_max_len=8),
                                  RopeConfig(theta=500.0, scaling="linear", factor=2.0)])
def test_export_rope_scaling(tmp_path, rope):
    model = micro(attention_fields={"rope": rope}, max_seq_len=64)
    export_hf(model, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    ids = torch.randint(0, V, (1, 48))
    torch.testing.assert_close(logits(hf, ids), logits(model, ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant,kw,message", [
    ("gated", {}, "gate"),
    ("sink", {}, "sink"),
    ("sdpa-rmsnorm", {}, "head_transform"),
    ("baseline", {"attention_fields": {"kv": "mla"}}, "kv='mla'"),
    ("baseline", {"attention_fields": {"rope": RopeConfig(fraction=0.5)}}, "fraction"),
    ("baseline", {"attention_fields": {"rope": RopeConfig(scaling="ntk", factor=2.0)}}, "ntk"),
    ("baseline", {"attention_fields": {"qkv_bias": True}}, "attention_bias"),
    ("baseline", {"norm": "layer"}, r"ModelConfig.norm='layer'"),
    ("baseline", {"position_embedding": "learned"}, r"ModelConfig.position_embedding='learned'"),
])
def test_export_refuses_what_stock_transformers_cannot_express(tmp_path, variant, kw, message):
    model = micro(variant, **kw)
    with pytest.raises(GatedAttnError, match=message) as err:
        export_hf(model, tmp_path / "hf", layout="stock")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "hf").exists()


# ----------------------------------------------------------------------------- Auto classes
@pytest.mark.parametrize("variant", ["gated", "hyga-sink", "mla"])
def test_auto_classes_load_and_generate_our_format(tmp_path, variant):
    register_auto()
    register_auto()  # idempotent
    if variant == "mla":  # decoding caches the latent, through transformers' cache too
        model = micro("gated", tie_embeddings=False, attention_fields={"kv": "mla"})
    else:
        model = micro(variant, tie_embeddings=False)
    model.save_pretrained(tmp_path / "m")
    assert type(AutoConfig.from_pretrained(tmp_path / "m")).__name__ == "GatedAttnHFConfig"
    wrapped = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert type(wrapped).__name__ == "GatedAttnForCausalLM"
    ids = torch.randint(0, V, (2, 6))
    assert torch.equal(logits(wrapped, ids), logits(model, ids))

    lengths = []
    hook = wrapped.model.register_forward_pre_hook(lambda mod, args, kw: lengths.append(args[0].shape[1]),
                                                   with_kwargs=True)
    cached = wrapped.generate(ids, max_new_tokens=8, do_sample=False)
    hook.remove()
    assert lengths == [6] + [1] * 7  # really incremental: one token per step after the prompt
    assert torch.equal(cached, wrapped.generate(ids, max_new_tokens=8, do_sample=False, use_cache=False))
    assert torch.equal(cached, model.generate(ids, 8, temperature=0))

    wrapped.save_pretrained(tmp_path / "again")  # stays in our format
    assert json.loads((tmp_path / "again" / "config.json").read_text())["model_type"] == "gatedattn"
    assert torch.equal(logits(GatedLM.from_pretrained(tmp_path / "again"), ids), logits(model, ids))


def test_auto_load_is_strict_and_refuses_custom_masks(tmp_path):
    register_auto()
    model = micro("gated")
    model.save_pretrained(tmp_path / "m")
    wrapped = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    ids = torch.randint(0, V, (2, 4))
    with pytest.raises(GatedAttnError, match="2-D attention_mask .* 4-D mask holds other values: custom"):
        wrapped(ids, attention_mask=torch.ones(2, 1, 4, 4))
    state = load_file(tmp_path / "m" / "model.safetensors")
    state.pop("blocks.1.attn.gate.x.proj.weight")
    save_file(state, tmp_path / "m" / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "m" / "checksums.json").unlink()  # edited by hand: only the format checks apply
    with pytest.raises(GatedAttnError, match="blocks.1.attn.gate.x.proj.weight"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "m")


# ----------------------------------------------------------------------------- retrofit
RETROFITTABLE = [name for name in VARIANTS if name not in ("baseline", "sdpa-rmsnorm", "sdpa-silu")]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    torch.manual_seed(1)
    config = Qwen3Config(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=96, attention_bias=True)
    hf = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("qwen3")
    hf.save_pretrained(path)
    return path


def test_a_retrofitted_sink_starts_at_a_small_measured_share_of_each_heads_attention(qwen3_dir):
    """At most SINK_SHARE of any calibration query's attention: near the identity, with a
    gradient Adam can move (a start at -30 is exact, but frozen)."""
    from gatedattn.hf.retrofit import SINK_SHARE
    from gatedattn.reproduce.pretrained.arms import head_stats

    ids = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(1))
    model = add_gates(load_model(qwen3_dir), "sink", init="identity", calibration=ids)
    shares = head_stats(model, ids, 0, "free")["sink"]  # the sink's mean probability per (layer, head)
    flat = [s for layer in shares for s in layer]  # the sink's mean share per head over the calibration queries
    assert max(flat) <= SINK_SHARE and min(flat) > SINK_SHARE / 100, flat  # at most the share, not vanishing
    fixed = add_gates(load_model(qwen3_dir), "sink", init="identity", sink_logit=-30.0)
    assert all(b.attn.sink.eq(-30).all() for b in fixed.blocks)  # a given logit starts every head there
    with pytest.raises(GatedAttnError, match="calibration must be integer token ids"):
        add_gates(load_model(qwen3_dir), "sink", calibration=ids.float())


@pytest.mark.parametrize("variant", RETROFITTABLE)
def test_identity_retrofit_keeps_logits_random_does_not(qwen3_dir, tmp_path, variant):
    ids = torch.randint(0, V, (2, 12))
    model = load_model(qwen3_dir)
    before = logits(model, ids)
    original = model.cfg.attention
    assert add_gates(model, variant, init="identity") is model
    preset, attn = VARIANTS[variant](64, 4, 2, 16), model.cfg.attention
    assert model.cfg.variant == variant and attn.sink == preset.sink
    assert attn.replace(gate=None, sink=False) == original  # everything else kept
    if preset.gate is not None:  # identity init may switch the gate bias on (SiLU gates)
        assert dataclasses.replace(attn.gate, bias=preset.gate.bias) == preset.gate
    new_params = [n for n, _ in model.named_parameters() if ".gate." in n or n.endswith(".sink")]
    assert new_params
    # a new sink starts at most at a 1e-3 share of a query's attention (trainable), the gates exactly
    torch.testing.assert_close(logits(model, ids), before, atol=1e-2 if attn.sink else 1e-5, rtol=0)

    model.save_pretrained(tmp_path / "retro")
    again = load_model(tmp_path / "retro")
    assert again.cfg == model.cfg and torch.equal(logits(again, ids), logits(model, ids))

    random = add_gates(load_model(qwen3_dir), variant, init="random")
    assert (logits(random, ids) - before).abs().max() > 1e-3


@pytest.mark.parametrize("variant", ["gated", "gated-headwise", "hyga", "g4-query"])
def test_identity_retrofit_gates_can_learn(qwen3_dir, variant):
    """Identity init leaves the gates in their responsive range: the zeroed gate projections
    get gradient at once (an inner ``down`` projection follows one step later, as in LoRA)."""
    model = add_gates(load_model(qwen3_dir), variant).train()
    model.loss(torch.randint(0, V, (2, 9))).backward()
    gate_grads = {n: p.grad.abs().max().item() for n, p in model.named_parameters()
                  if ".gate." in n and ".down." not in n}
    assert gate_grads and min(gate_grads.values()) > 0, gate_grads


def test_retrofit_refusals(qwen3_dir):
    model = load_model(qwen3_dir)
    for variant, message in (("baseline", "adds nothing"), ("sdpa-rmsnorm", "not a gate"),
                             ("nope", "unknown variant")):
        with pytest.raises(GatedAttnError, match=message):
            add_gates(model, variant)
    with pytest.raises(GatedAttnError, match="init='zeros'"):
        add_gates(model, "gated", init="zeros")
    add_gates(model, "gated")
    with pytest.raises(GatedAttnError, match="already has a gate"):
        add_gates(model, "hyga")
    with pytest.raises(GatedAttnError, match="gate"):
        export_hf(model, "/nonexistent/never-written")


def test_hf_config_mirrors_every_model_config_field():
    """GatedAttnHFConfig restates ModelConfig's fields for transformers; they must not drift."""
    import dataclasses

    from gatedattn.hf.auto import GatedAttnHFConfig
    from gatedattn.models.lm import GatedLM, ModelConfig

    cfg = ModelConfig.from_preset("micro", "hyga-sink", vocab_size=50, bos_token_id=1, eos_token_id=2)
    for f in dataclasses.fields(ModelConfig):
        assert hasattr(GatedAttnHFConfig(), f.name), f.name
    assert GatedAttnHFConfig.from_model_config(cfg).to_model_config() == cfg
    GatedLM(cfg)  # the round-tripped config builds


def test_save_pretrained_writes_a_generation_config_transformers_reads(tmp_path):
    from transformers import GenerationConfig

    from gatedattn.infra.integrity import verify_dir

    model = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=50, bos_token_id=1, eos_token_id=2))
    model.save_pretrained(tmp_path / "m")
    gen = GenerationConfig.from_pretrained(tmp_path / "m")
    assert (gen.bos_token_id, gen.eos_token_id, gen.pad_token_id) == (1, 2, 2)
    verify_dir(tmp_path / "m", required=("generation_config.json",))  # listed in its checksums.json
    bare = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=50))  # no special tokens: an empty one
    bare.save_pretrained(tmp_path / "bare")
    assert GenerationConfig.from_pretrained(tmp_path / "bare").eos_token_id is None
