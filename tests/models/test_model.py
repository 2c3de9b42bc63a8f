"""GatedLM: shapes, checkpoints, generation."""

import json

import pytest
import torch

from gatedattn import GatedAttnError
from gatedattn.layers.config import RopeConfig
from gatedattn.infra.errors import ConfigError
from gatedattn.models.lm import SIZE_PRESETS, GatedLM, ModelConfig


def micro(variant="gated", **kw):
    return GatedLM(ModelConfig.from_preset("micro", variant, vocab_size=97, **kw))


@pytest.mark.parametrize("variant", ["baseline", "gated", "hyga-sink", "g5-dense"])
def test_logits_shape_and_loss(variant):
    model = micro(variant)
    ids = torch.randint(0, 97, (2, 12))
    assert model(ids).shape == (2, 12, 97)
    loss = model.loss(torch.randint(0, 97, (2, 13)))
    assert abs(loss.item() - torch.log(torch.tensor(97.0)).item()) < 0.5  # near uniform at init
    loss.backward()


def test_size_presets_build():
    for size in ("micro", "tiny", "small"):
        cfg = ModelConfig.from_preset(size, "gated", vocab_size=4096)
        n_layers, d_model, *_ = SIZE_PRESETS[size]
        assert (cfg.n_layers, cfg.d_model) == (n_layers, d_model)
    mla = ModelConfig.from_preset("micro", "hyga", vocab_size=50, attention_fields={"kv": "mla"})
    GatedLM(mla)(torch.zeros(1, 3, dtype=torch.long))


@pytest.mark.parametrize("tie", [True, False])
def test_save_load_is_bit_exact(tmp_path, tie):
    model = micro("hyga-sink", tie_embeddings=tie)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path)
    from gatedattn.models.code import bundle_sources

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".gatedattn-output", "checksums.json", "config.json",
                                                                "generation_config.json", "model.safetensors",
                                                                *bundle_sources()])
    again = GatedLM.from_pretrained(tmp_path)
    assert again.cfg == model.cfg
    ids = torch.randint(0, 97, (2, 9))
    assert torch.equal(model(ids), again(ids))
    for (n, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), n


def test_cached_generation_equals_uncached():
    model = micro("hyga-sink")
    ids = torch.randint(0, 97, (3, 4))
    a = model.generate(ids, 10, temperature=0)
    b = model.generate(ids, 10, temperature=0, use_cache=False)
    assert a.shape == (3, 14) and torch.equal(a, b)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(model.generate(ids, 6, temperature=0.8, top_k=5, generator=g1),
                       model.generate(ids, 6, temperature=0.8, top_k=5, generator=g2, use_cache=False))


def test_corrupt_checkpoints_fail_clearly(tmp_path):
    model = micro()
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(GatedAttnError, match="differs from checksums.json; the file is damaged|the file is damaged"):
        GatedLM.from_pretrained(tmp_path)
    (tmp_path / "checksums.json").unlink()  # a file from elsewhere: the format checks still apply
    with pytest.raises(GatedAttnError, match="truncated or corrupt"):
        GatedLM.from_pretrained(tmp_path)
    from safetensors.torch import save_file
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file({k: v for k, v in state.items() if k != "blocks.1.attn.gate.x.proj.weight"}, str(weights))
    with pytest.raises(GatedAttnError, match="'blocks.1.attn.gate.x.proj.weight' is missing"):
        GatedLM.from_pretrained(tmp_path)
    save_file({**state, "blocks.0.mlp.up_proj.weight": torch.zeros(3, 3)}, str(weights))
    with pytest.raises(GatedAttnError, match=r"'blocks.0.mlp.up_proj.weight' has shape \(3, 3\)"):
        GatedLM.from_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "mamba"}))
    with pytest.raises(GatedAttnError, match="model_type='mamba'"):
        GatedLM.from_pretrained(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(GatedAttnError, match="config.json is missing"):
        GatedLM.from_pretrained(tmp_path)


# ------------------------------------------------------------------------------ GPT-2-style options
def gpt2_style(**kw):
    """Learned absolute positions and no rotation, LayerNorm with bias, untied N(0, 1) embeddings."""
    fields = dict(position_embedding="learned", norm="layer", tie_embeddings=False, embed_std=1.0, **kw)
    cfg = ModelConfig.from_preset("micro", "gated", vocab_size=97, max_seq_len=16,
                                  attention_fields={"rope": RopeConfig(fraction=0.0, original_max_len=16)})
    return GatedLM(cfg.replace(**fields))


def test_learned_positions_change_the_output_with_position_and_save_load(tmp_path):
    torch.manual_seed(0)
    model = gpt2_style()
    assert isinstance(model.blocks[0].attn_norm, torch.nn.LayerNorm) and model.blocks[0].attn_norm.bias is not None
    assert model.pos_embed.weight.shape == (16, 64)
    ids = torch.full((1, 4), 5)
    with torch.no_grad():
        logits = model(ids)
        model.pos_embed.weight.zero_()  # with no rotation, positions come from the table alone
        flat = model(ids)
    assert not torch.allclose(logits[0, 1], logits[0, 2]) and torch.allclose(flat[0, 1], flat[0, 2], atol=1e-5)
    model = gpt2_style()
    model.save_pretrained(tmp_path)
    again = GatedLM.from_pretrained(tmp_path)
    assert again.cfg == model.cfg and torch.equal(again(ids), model(ids))


def test_learned_positions_decode_with_the_cache_and_refuse_beyond_the_table():
    model = gpt2_style()
    ids = torch.randint(0, 97, (2, 5))
    assert torch.equal(model.generate(ids, 8, temperature=0), model.generate(ids, 8, temperature=0, use_cache=False))
    with pytest.raises(GatedAttnError, match=r"position 16 is beyond the learned position table.*max_seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_embedding_init_scale():
    torch.manual_seed(0)
    model = gpt2_style()
    assert model.embed.weight.std().item() == pytest.approx(1.0, rel=0.1)
    assert model.pos_embed.weight.std().item() == pytest.approx(1.0, rel=0.15)
    assert model.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.15)  # untied: the matrices' scale
    default = micro()
    assert default.embed.weight.std().item() == pytest.approx(0.02, rel=0.1) and default.pos_embed is None


@pytest.mark.parametrize("mlp", ["relu", "gelu"])
def test_a_two_matrix_mlp_with_biases_trains_saves_and_is_refused_by_export(tmp_path, mlp):
    from gatedattn.hf import export_hf
    from gatedattn.infra.sizes import model_params

    torch.manual_seed(0)
    model = micro("baseline", mlp=mlp)
    block = model.blocks[0].mlp
    assert not hasattr(block, "gate_proj") and block.up_proj.bias is not None and block.down_proj.bias is not None
    assert (block.up_proj.bias == 0).all()  # biases start at zero, as every bias of the model
    x = torch.randn(2, 3, 64)
    act = torch.relu if mlp == "relu" else (lambda t: torch.nn.functional.gelu(t, approximate="tanh"))
    torch.testing.assert_close(block(x), act(x @ block.up_proj.weight.T + block.up_proj.bias) @ block.down_proj.weight.T
                               + block.down_proj.bias)
    swiglu = micro("baseline")
    ffn, d = model.cfg.ffn_dim, model.cfg.d_model
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(swiglu) - n(model) == model.cfg.n_layers * (d * ffn - ffn - d)  # one matrix fewer, two biases more
    assert model_params(model.cfg) <= n(model)
    ids = torch.randint(0, 97, (2, 6))
    model.loss(ids).backward()
    assert block.up_proj.weight.grad is not None
    model.save_pretrained(tmp_path / "m")
    again = GatedLM.from_pretrained(tmp_path / "m")
    assert again.cfg.mlp == mlp and torch.equal(again(ids), model(ids))
    with pytest.raises(GatedAttnError, match=f"ModelConfig.mlp='{mlp}'.*SwiGLU"):
        export_hf(model, tmp_path / "hf")


def test_a_config_saved_before_the_mlp_field_reads_as_swiglu():
    data = ModelConfig.from_preset("micro", "baseline", vocab_size=97).to_dict()
    del data["mlp"]
    assert ModelConfig.from_dict(data).mlp == "swiglu"


@pytest.mark.parametrize("field,value,match", [
    ("mlp", "swish", r"ModelConfig.mlp='swish' is not allowed.*'swiglu', 'relu', 'gelu'"),
    ("norm", "batch", r"ModelConfig.norm='batch' is not allowed.*'rms', 'layer'"),
    ("position_embedding", "sinusoidal", r"position_embedding='sinusoidal' is not allowed.*'learned'"),
    ("embed_std", 0.0, r"ModelConfig.embed_std=0.0 must be > 0"),
])
def test_bad_model_options(field, value, match):
    cfg = ModelConfig.from_preset("micro", "baseline", vocab_size=97)
    with pytest.raises(ConfigError, match=match):
        cfg.replace(**{field: value})


def test_recipe_width_keeps_heads_and_mlp_ratio():
    from gatedattn.train.config import ModelRecipe

    cfg = ModelRecipe(size="toy", d_model=256).build(vocab_size=30, max_seq_len=64)
    assert (cfg.d_model, cfg.attention.n_heads, cfg.attention.head_dim, cfg.ffn_dim) == (256, 1, 256, 512)
    assert ModelRecipe(size="toy").to_dict() == ModelRecipe.from_dict(ModelRecipe(size="toy").to_dict()).to_dict()
    assert "d_model" not in ModelRecipe(size="toy").to_dict()  # written as before the field existed
    with pytest.raises(ConfigError, match=r"ModelRecipe.d_model=-1 must be a positive integer"):
        ModelRecipe(size="toy", d_model=-1)


@pytest.mark.parametrize("tie", [False, True])
def test_forward_with_targets_is_the_logits_loss_fused(tie):
    torch.manual_seed(0)
    model = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=97, tie_embeddings=tie))
    ids = torch.randint(0, 97, (2, 13))
    targets = torch.randint(0, 97, (2, 13))
    targets[0, :3] = -100  # ignored positions count in no mean
    fused = model(ids, targets=targets)
    fused_grads = torch.autograd.grad(fused, list(model.parameters()))
    logits = model(ids)
    keep = targets.flatten() != -100
    plain = torch.nn.functional.cross_entropy(logits.flatten(0, 1)[keep], targets.flatten()[keep])
    torch.testing.assert_close(fused, plain)
    for a, b in zip(fused_grads, torch.autograd.grad(plain, list(model.parameters()))):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    batch = torch.cat([ids, targets[:, -1:].clamp_min(0)], 1)
    torch.testing.assert_close(model.loss(batch), torch.nn.functional.cross_entropy(
        model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten()))


def test_forward_with_targets_runs_the_head_a_hook_or_adapter_watches():
    torch.manual_seed(0)
    model = GatedLM(ModelConfig.from_preset("micro", "baseline", vocab_size=53))
    ids, targets = torch.randint(0, 53, (2, 9)), torch.randint(0, 53, (2, 9))
    seen = []
    handle = model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    loss = model(ids, targets=targets)
    handle.remove()
    assert seen == [(2, 9, 53)]  # the hook saw the logits: the unfused path ran
    torch.testing.assert_close(loss, model(ids, targets=targets))
    with pytest.raises(GatedAttnError, match="targets must be integer token ids"):
        model(ids, targets=targets[:, :-1])
    with pytest.raises(GatedAttnError, match="targets must be integer token ids"):
        model(ids, targets=targets.float())


@pytest.mark.parametrize("variant,tie", [("gated", True), ("hyga-sink", False)])
def test_from_state_holds_the_given_tensors_themselves_and_matches_the_model(variant, tie):
    torch.manual_seed(3)
    source = micro(variant, tie_embeddings=tie)
    state = {k: v.clone() for k, v in source.state_dict().items()}
    state["embed.weight"] = state["embed.weight"].t().contiguous().t()  # a non-contiguous tensor is made contiguous
    built = GatedLM.from_state(source.cfg, state, "weights")
    assert all(not t.is_meta for t in [*built.parameters(), *built.buffers()])
    kept = "blocks.0.attn.o_proj.weight" if "blocks.0.attn.o_proj.weight" in state else next(iter(state))
    assert built.state_dict()[kept].data_ptr() == state[kept].data_ptr()  # not a copy
    assert built.embed.weight.is_contiguous() and (built.lm_head.weight is built.embed.weight) == tie
    for (name, mine), theirs in zip(built.named_buffers(), source.buffers()):
        torch.testing.assert_close(mine, theirs, msg=name)  # the RoPE frequencies made anew
    ids = torch.randint(0, 97, (2, 12))
    torch.testing.assert_close(built.eval()(ids), source.eval()(ids), atol=0, rtol=0)
    half = GatedLM.from_state(source.cfg, {k: v.half() for k, v in source.state_dict().items()}, "weights")
    assert {p.dtype for p in half.parameters()} == {torch.float32}  # the model's own dtype, as a copy would give


def test_from_state_refuses_a_missing_or_misshaped_tensor_naming_it():
    source = micro()
    state = source.state_dict()
    with pytest.raises(GatedAttnError, match=r"^weights: tensor 'norm.weight' is missing"):
        GatedLM.from_state(source.cfg, {k: v for k, v in state.items() if k != "norm.weight"}, "weights")
    with pytest.raises(GatedAttnError, match=r"tensor 'norm.weight' has shape \(3,\)"):
        GatedLM.from_state(source.cfg, {**state, "norm.weight": torch.ones(3)}, "weights")
