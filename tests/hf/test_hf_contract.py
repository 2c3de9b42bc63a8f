"""The transformers model contract of GatedAttnForCausalLM, in the ten attention layouts:
hidden states and attentions, the config's standard names, from_pretrained overrides, the
static cache and its 4-D masks, save_pretrained (code, generation config, shards),
return_dict=False, PEFT's auto loader. (Remote code that survives a re-save: in
test_hf_self_contained.py, whose interpreter without gatedattn loads it.)"""

import json
import warnings

import pytest
import torch

from gatedattn import GatedLM, ModelConfig
from gatedattn.infra.errors import ConfigError, GatedAttnError

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

from gatedattn.hf.register import register_auto  # noqa: E402

V = 60
LAYOUTS = {
    "baseline": ("baseline", None), "gated": ("gated", None), "gated-headwise": ("gated-headwise", None),
    "hyga": ("hyga", None), "hyga-lowrank": ("hyga-lowrank", None), "sink": ("sink", None),
    "hyga-sink": ("hyga-sink", None), "mla-baseline": ("baseline", {"kv": "mla"}),
    "mla-gated": ("gated", {"kv": "mla"}), "mla-hyga-sink": ("hyga-sink", {"kv": "mla"}),
}


def micro(layout: str, **fields) -> GatedLM:
    variant, attention_fields = LAYOUTS[layout]
    torch.manual_seed(0)
    model = GatedLM(ModelConfig.from_preset("micro", variant, vocab_size=V, max_seq_len=32,
                                            attention_fields=attention_fields, **fields))
    with torch.no_grad():  # sinks, gates and logits away from their initial values
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def loaded(tmp_path, layout: str = "gated", **kwargs):
    register_auto()
    micro(layout).save_pretrained(tmp_path / layout)
    return AutoModelForCausalLM.from_pretrained(tmp_path / layout, **kwargs)


def padded_batch():
    torch.manual_seed(1)
    ids = torch.randint(1, V, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0
    return ids, mask


# ----------------------------------------------------------------------------- hidden states, attentions
@pytest.mark.parametrize("layout", LAYOUTS)
def test_hidden_states_and_attentions_in_every_layout(tmp_path, layout):
    model = loaded(tmp_path, layout)
    ids, mask = padded_batch()
    with torch.no_grad():
        plain = model(ids, attention_mask=mask)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
            row = model(ids[1:, 3:], output_attentions=True)
    assert plain.hidden_states is None and plain.attentions is None
    # (the micro models run a fused kernel: attentions come from the reference path, said once)
    kernel = model.model.blocks[0].attn.core.kernel
    assert kernel in ("sdpa", "flash-lse")
    assert [str(w.message) for w in caught if "attention probabilities" in str(w.message)] == [
        f"GatedAttnForCausalLM: the {kernel} attention kernel does not return attention probabilities; with "
        "output_attentions=True every layer runs the reference kernel (explicit scores and softmax: slower, "
        "more memory); attn_implementation=\"eager\" runs it throughout"]
    torch.testing.assert_close(out.logits, plain.logits, atol=1e-5, rtol=1e-5)
    hs, lm = out.hidden_states, model.model
    assert len(hs) == model.config.num_hidden_layers + 1 and all(h.shape == (2, 7, 64) for h in hs)
    assert torch.equal(hs[0], lm.embed(ids))
    torch.testing.assert_close(lm.lm_head(hs[-1]), out.logits, atol=1e-5, rtol=0)  # after the final norm
    # (block 0 alone runs the fused kernel, the recorded pass the reference one)
    torch.testing.assert_close(hs[1], lm.blocks[0](hs[0], key_mask=mask.bool()), atol=1e-5, rtol=1e-5)
    heads = model.config.num_attention_heads
    assert len(out.attentions) == 2 and all(a.shape == (2, heads, 7, 7) for a in out.attentions)
    for a, alone in zip(out.attentions, row.attentions):
        assert torch.all(a.triu(1) == 0) and torch.all(a[1, :, 3:, :3] == 0)  # causal, padding unseen
        sums = a[0].sum(-1)
        if "sink" in layout:
            assert torch.all(sums < 1 - 1e-4)  # the sink takes the rest
        else:
            torch.testing.assert_close(sums, torch.ones_like(sums))
        torch.testing.assert_close(a[1, :, 3:, 3:], alone[0], atol=1e-5, rtol=0)


def test_baseline_hidden_states_and_attentions_equal_llamas(tmp_path):
    from gatedattn.hf import export_hf

    register_auto()
    lm = micro("baseline", qk_norm=False)
    lm.save_pretrained(tmp_path / "ours")
    export_hf(lm, tmp_path / "llama")
    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "ours")
    llama = AutoModelForCausalLM.from_pretrained(tmp_path / "llama", attn_implementation="eager")
    assert type(llama).__name__ == "LlamaForCausalLM"
    ids, mask = padded_batch()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = ours(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        b = llama(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert len(a.hidden_states) == len(b.hidden_states) == 3
    real = mask.bool()  # (padding positions: outputs nothing reads, computed differently)
    for x, y in zip(a.hidden_states, b.hidden_states):
        # rtol: float32 rounding (ours takes the mean square from one norm reduction, Llama
        # from pow and mean; both exact to about 1e-7 relative, at values near 14 here)
        torch.testing.assert_close(x[real], y[real], atol=1e-5, rtol=2e-6)
    for x, y in zip(a.attentions, b.attentions):
        torch.testing.assert_close(x[0], y[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(x[1, :, 3:], y[1, :, 3:], atol=1e-5, rtol=0)
    # selecting hidden states by index, as transformers does
    with torch.no_grad():
        picked = ours(ids, output_hidden_states=[0, -1]).hidden_states
        full = ours(ids, output_hidden_states=True).hidden_states
    assert len(picked) == 2 and torch.equal(picked[0], full[0]) and torch.equal(picked[1], full[-1])


def test_config_flags_and_return_dict_false(tmp_path):
    model = loaded(tmp_path, "hyga", output_hidden_states=True)
    ids, _ = padded_batch()
    with torch.no_grad():
        assert len(model(ids).hidden_states) == 3
        model.config.output_hidden_states = False
        out = model(ids, labels=ids, return_dict=False)
    assert type(out) is tuple and len(out) == 3  # loss, logits, cache (as LlamaForCausalLM)
    torch.testing.assert_close(out[1], model(ids).logits)
    model.config.return_dict = False
    assert type(model(ids, use_cache=False)) is tuple


# ----------------------------------------------------------------------------- config names
@pytest.mark.parametrize("layout", LAYOUTS)
def test_config_has_transformers_standard_names(tmp_path, layout):
    model = loaded(tmp_path, layout)
    c, cfg = model.config, model.model.cfg
    a = cfg.attention
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == \
        (a.d_model, a.n_heads, a.n_kv_heads, a.head_dim)
    assert (c.num_hidden_layers, c.intermediate_size, c.vocab_size, c.max_position_embeddings) == \
        (cfg.n_layers, cfg.ffn_dim, V, 32)
    assert (c.tie_word_embeddings, c.rms_norm_eps, c.rope_theta, c.use_cache) == \
        (cfg.tie_embeddings, cfg.norm_eps, a.rope.theta, True)
    c.rope_theta, c.max_position_embeddings, c.rms_norm_eps = 5e5, 64, 1e-5
    back = c.to_model_config()
    assert (back.attention.rope.theta, back.max_seq_len, back.norm_eps) == (5e5, 64, 1e-5)
    assert c.to_dict()["max_seq_len"] == 64 and "hidden_size" not in c.to_dict()
    with pytest.raises(ConfigError, match="num_attention_heads=3 .attention.n_heads.*divisible"):
        c.num_attention_heads = 3
    assert c.num_attention_heads == a.n_heads


# ----------------------------------------------------------------------------- from_pretrained
def test_from_pretrained_config_overrides_follow_transformers(tmp_path):
    register_auto()
    micro("sink").save_pretrained(tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m", use_cache=False, output_attentions=True,
                                                 torch_dtype=torch.bfloat16, max_position_embeddings=128)
    assert (model.config.use_cache, model.config.output_attentions) == (False, True)
    assert model.model.cfg.max_seq_len == 128 and model.dtype == torch.bfloat16
    assert model.name_or_path == str(tmp_path / "m")
    ids, _ = padded_batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model(ids)
    assert out.cache is None and len(out.attentions) == 2
    direct = type(model).from_pretrained(tmp_path / "m", dtype="float64", rope_theta=20000.0)
    assert direct.dtype == torch.float64 and direct.config.rope_theta == 20000.0
    with pytest.raises(GatedAttnError, match="argument 'not_a_field' is not supported"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "m", not_a_field=1)
    with pytest.raises(GatedAttnError, match="argument 'quantization_config' is not supported"):
        type(model).from_pretrained(tmp_path / "m", quantization_config={"bits": 4})
    with pytest.raises(GatedAttnError, match="tensor 'blocks.2."):  # the weights fix the depth
        AutoModelForCausalLM.from_pretrained(tmp_path / "m", num_hidden_layers=3)


# ----------------------------------------------------------------------------- static cache, 4-D masks
# the cache paths: grouped-query keys and values (sdpa; flash-lse with a sink), MLA's latent
@pytest.mark.parametrize("layout", ["baseline", "hyga-sink", "mla-baseline", "mla-hyga-sink"])
def test_static_cache_generates_what_the_dynamic_one_does(tmp_path, layout):
    from transformers.cache_utils import StaticCache

    model = loaded(tmp_path, layout)
    ids, mask = padded_batch()
    seen = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append((type(kw.get("cache")), kw["attention_mask"].dim())), with_kwargs=True)
    dynamic = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    seen.clear()
    static = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                            cache_implementation="static")
    hook.remove()
    assert seen and all(s == (StaticCache, 4) for s in seen)  # transformers' 4-D masks, read back
    assert torch.equal(static, dynamic)


@pytest.mark.parametrize("layout", ["baseline", "hyga-sink", "mla-baseline", "mla-hyga-sink"])
def test_compiled_static_cache_decoding_is_one_graph_with_the_dynamic_caches_tokens(tmp_path, layout):
    """transformers' compiled decoding (``compile_config``) over its static cache: the
    wrapper's step is traced whole once (``hf.static``: no count of cached positions read as
    a number, no mask pattern checked) and decodes the dynamic cache's tokens. Compiled by
    AOT autograd (seconds); inductor runs the same graph."""
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    model = loaded(tmp_path, layout)
    ids, mask = padded_batch()
    dynamic = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    config = CompileConfig(fullgraph=True, backend="aot_eager", mode="default")
    config._compile_all_devices = True  # transformers compiles only on accelerators unless asked
    dynamo.reset()
    counters.clear()
    compiled = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                              cache_implementation="static", compile_config=config)
    assert counters["stats"]["unique_graphs"] == 1 and counters["stats"]["calls_captured"] > 0  # one graph, 5 steps
    assert torch.equal(compiled, dynamic)


def test_4d_masks_other_than_causal_plus_padding_are_refused(tmp_path):
    model = loaded(tmp_path, "gated")
    ids, mask = padded_batch()
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    four_d = (causal[None] & mask.bool()[:, None, :])[:, None]
    with torch.no_grad():
        want = model(ids, attention_mask=mask).logits
        torch.testing.assert_close(model(ids, attention_mask=four_d).logits, want, atol=1e-6, rtol=0)
        additive = torch.zeros(2, 1, 7, 7).masked_fill(~four_d, torch.finfo(torch.float32).min)
        torch.testing.assert_close(model(ids, attention_mask=additive).logits, want, atol=1e-6, rtol=0)
        window = four_d & torch.ones(7, 7, dtype=torch.bool).triu(-2)
        with pytest.raises(GatedAttnError, match="another pattern: custom attention masks are not supported"):
            model(ids, attention_mask=window)
        with pytest.raises(GatedAttnError, match="holds other values: custom attention masks"):
            model(ids, attention_mask=additive.clamp_min(-5.0))  # a bias, not a mask
        with pytest.raises(GatedAttnError, match="got a 3-D one"):
            model(ids, attention_mask=four_d[:, 0])


# ----------------------------------------------------------------------------- save_pretrained
def test_save_pretrained_writes_code_generation_config_and_shards(tmp_path):
    model = loaded(tmp_path, "hyga-sink")
    model.generation_config.max_new_tokens = 7
    model.save_pretrained(tmp_path / "saved", max_shard_size="20KB")
    files = {p.name for p in (tmp_path / "saved").iterdir()}
    assert {"modeling_gatedattn.py", "configuration_gatedattn.py", "generation_config.json",
            "model.safetensors.index.json"} <= files and "model.safetensors" not in files
    index = json.loads((tmp_path / "saved" / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and shards <= files
    state = model.model.state_dict()
    for shard in shards:  # at most 20 kB, unless one tensor alone is larger
        names = [k for k, f in index["weight_map"].items() if f == shard]
        assert len(names) == 1 or sum(state[k].numel() * 4 for k in names) <= 20_000
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_gatedattn.GatedAttnForCausalLM"
    ids, _ = padded_batch()
    ours = GatedLM.from_pretrained(tmp_path / "saved")
    remote = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", trust_remote_code=True)
    assert remote.generation_config.max_new_tokens == 7
    with torch.no_grad():
        want = model(ids).logits
        assert torch.equal(ours(ids), want) and torch.equal(remote(ids).logits, want)
    model.save_pretrained(tmp_path / "saved")  # one file again: the shards do not survive
    assert sorted(p.name for p in (tmp_path / "saved").glob("model*.safetensors*")) == ["model.safetensors"]
    with torch.no_grad():
        assert torch.equal(GatedLM.from_pretrained(tmp_path / "saved")(ids), want)
    model.save_pretrained(tmp_path / "plain", save_code=False)
    assert "auto_map" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    assert not list((tmp_path / "plain").glob("*.py"))
    with pytest.raises(GatedAttnError, match="argument 'selfcontained' is not supported"):
        model.save_pretrained(tmp_path / "x", selfcontained=True)
    with pytest.raises(GatedAttnError, match="max_shard_size='lots' must be a positive number of bytes"):
        model.save_pretrained(tmp_path / "x", max_shard_size="lots")
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------------------------- PEFT, lm-eval
def test_peft_auto_class_finds_the_base_model(tmp_path):
    peft = pytest.importorskip("peft")
    model = loaded(tmp_path, "gated")
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
                                                         init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] \
        == str(tmp_path / "gated")
    again = peft.AutoPeftModelForCausalLM.from_pretrained(tmp_path / "adapter")
    ids, _ = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, lora(ids).logits, atol=1e-6, rtol=0)


def test_model_type_is_registered_as_a_causal_lm():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    register_auto()
    assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES["gatedattn"] == "GatedAttnForCausalLM"
