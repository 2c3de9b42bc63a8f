"""``attn_implementation`` of GatedAttnForCausalLM means what it says: "eager" runs every layer
on the reference core (which returns the attention weights itself), "sdpa" (the default) the
model's fused kernel, anything else is refused before weights are read; through
from_pretrained (this class's and the Auto classes'), the config, and set_attn_implementation.
It is a runtime choice: saving writes the same weights and config.json."""

import copy
import json
import warnings

import pytest
import torch

from gatedattn import GatedLM, ModelConfig
from gatedattn.infra.errors import ConfigError, GatedAttnError
from gatedattn.layers.core import AttentionCore, ReferenceCore
from gatedattn.layers.variants import VARIANTS
from gatedattn.ops import attention_reference

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, PreTrainedModel  # noqa: E402

from gatedattn.hf.auto import GatedAttnForCausalLM, GatedAttnHFConfig  # noqa: E402
from gatedattn.hf.register import register_auto  # noqa: E402

V = 60
# a gated layout, a sink one, and MLA with HyGA gates and a sink
LAYOUTS = {"gated": ("gated", None), "sink": ("sink", None), "mla-hyga-sink": ("hyga-sink", {"kv": "mla"})}
ALLOWED = 'choose "eager" .* or "sdpa"'


def micro(variant: str, attention_fields=None) -> GatedLM:
    torch.manual_seed(0)
    model = GatedLM(ModelConfig.from_preset("micro", variant, vocab_size=V, max_seq_len=32,
                                            attention_fields=attention_fields))
    with torch.no_grad():  # sinks, gates and logits away from their initial values
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """layout -> a saved directory of that micro model (written once for the module)."""
    root = tmp_path_factory.mktemp("attn-impl")
    for name, (variant, fields) in LAYOUTS.items():
        micro(variant, fields).save_pretrained(root / name)
    return {name: root / name for name in LAYOUTS}


@pytest.fixture(scope="module")
def loaded(saved):
    """layout -> (default model, eager model), both from the saved directory."""
    return {name: (GatedAttnForCausalLM.from_pretrained(path),
                   GatedAttnForCausalLM.from_pretrained(path, attn_implementation="eager"))
            for name, path in saved.items()}


def padded_batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, V, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0
    return ids, mask


def assert_eager(model) -> None:
    """Every layer's core is the reference core (the module, not only the config's word)."""
    assert model.config._attn_implementation == "eager"
    for block in model.model.blocks:
        core = block.attn.core
        assert isinstance(core, ReferenceCore) and core.kernel == "reference" and core.fn is attention_reference
        assert core.probs is None


def assert_fused(model) -> None:
    assert model.config._attn_implementation == "sdpa"
    for block in model.model.blocks:
        core = block.attn.core
        assert type(core) is AttentionCore and core.kernel == block.attn.cfg.resolved_kernel
        assert core.kernel in ("sdpa", "flash-lse")


# ----------------------------------------------------------------------------- what runs
@pytest.mark.parametrize("layout", LAYOUTS)
def test_eager_runs_the_reference_core_and_sdpa_is_the_default(saved, loaded, layout):
    default, eager = loaded[layout]
    assert_fused(default)
    assert_eager(eager)
    assert_fused(GatedAttnForCausalLM.from_pretrained(saved[layout], attn_implementation="sdpa"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_eager_gives_sdpa_logits_and_gradients(loaded, layout):
    ids, mask = padded_batch()
    runs = []
    for model in loaded[layout]:
        model.zero_grad()
        embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
        out = model(inputs_embeds=embeds, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
        out.loss.backward()
        q_proj = model.model.blocks[0].attn.qkv.q_proj.weight
        runs.append((out.logits.detach(), embeds.grad, q_proj.grad.clone()))
        model.zero_grad()
    (logits_s, embeds_s, q_s), (logits_e, embeds_e, q_e) = runs
    real = mask.bool()  # (padding positions: outputs nothing reads)
    torch.testing.assert_close(logits_e[real], logits_s[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(embeds_e, embeds_s, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(q_e, q_s, atol=1e-6, rtol=1e-4)
    assert embeds_s.abs().max() > 0 and q_s.abs().max() > 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_eager_attentions_come_from_its_own_core_without_a_warning(loaded, layout):
    default, eager = loaded[layout]
    ids, mask = padded_batch()
    calls = []  # forward hooks on eager's cores: they fire only if those very cores run
    hooks = [b.attn.core.register_forward_hook(lambda *_: calls.append(1)) for b in eager.model.blocks]
    default._warned_attentions = False
    try:
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = eager(ids, attention_mask=mask, output_attentions=True)
            assert caught == []
            ref = default(ids, attention_mask=mask, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    assert len(calls) == len(eager.model.blocks)
    assert_eager(eager)  # nothing swapped, nothing left recording
    kernel = default.model.blocks[0].attn.core.kernel
    assert [str(w.message) for w in caught] == [
        f"GatedAttnForCausalLM: the {kernel} attention kernel does not return attention probabilities; with "
        "output_attentions=True every layer runs the reference kernel (explicit scores and softmax: slower, "
        "more memory); attn_implementation=\"eager\" runs it throughout"]
    heads = eager.config.num_attention_heads
    assert len(out.attentions) == len(ref.attentions) == 2
    for a, r in zip(out.attentions, ref.attentions):
        assert a.shape == (2, heads, 7, 7)
        torch.testing.assert_close(a, r, atol=1e-7, rtol=0)
        assert torch.all(a.triu(1) == 0) and torch.all(a[1, :, 3:, :3] == 0)  # causal, padding unseen
        sums = a[0].sum(-1)
        if "sink" in layout:
            assert torch.all(sums < 1 - 1e-4)  # the sink takes the rest
        else:
            torch.testing.assert_close(sums, torch.ones_like(sums))


@pytest.mark.parametrize("layout", ["sink", "mla-hyga-sink"])
def test_eager_generates_what_sdpa_does(loaded, layout):
    default, eager = loaded[layout]
    ids, mask = padded_batch()
    for cache in (None, "static"):
        kw = {} if cache is None else {"cache_implementation": cache}
        a, b = (m.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, **kw)
                for m in (default, eager))
        assert torch.equal(a, b)


# every preset, and MLA with the gates that change its paths (g2/g3: no latent cache) and a sink
VARIANT_CASES = [(name, "gqa") for name in VARIANTS] + [
    (name, "mla") for name in ("baseline", "gated", "g2-value", "g3-key", "g4-query", "hyga-sink")]


@pytest.mark.parametrize(("variant", "kv"), VARIANT_CASES, ids=[f"{n}-{kv}" for n, kv in VARIANT_CASES])
def test_eager_in_every_variant(variant, kv):
    try:
        lm = micro(variant, {"kv": kv} if kv == "mla" else None)
    except ConfigError as e:
        pytest.skip(f"no such model: {e}")
    config = GatedAttnHFConfig.from_model_config(lm.cfg)
    config._attn_implementation = "eager"
    eager = GatedAttnForCausalLM(config, model=copy.deepcopy(lm)).eval()
    default = GatedAttnForCausalLM(GatedAttnHFConfig.from_model_config(lm.cfg), model=lm).eval()
    assert_eager(eager)
    assert_fused(default)
    ids, mask = padded_batch()
    with torch.no_grad():
        out = eager(ids, attention_mask=mask, output_attentions=True)
        plain = default(ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(out.logits[real], plain.logits[real], atol=1e-5, rtol=1e-5)
    for a in out.attentions:
        sums = a[0].sum(-1)
        if lm.cfg.attention.sink:
            assert torch.all(sums < 1 - 1e-4)
        else:
            torch.testing.assert_close(sums, torch.ones_like(sums))


# ----------------------------------------------------------------------------- refused values
@pytest.fixture(scope="module")
def corrupt(tmp_path_factory):
    """A saved directory whose weights file is garbage: reading it fails."""
    path = tmp_path_factory.mktemp("corrupt") / "m"
    micro("gated").save_pretrained(path)
    (path / "model.safetensors").write_bytes(b"not a safetensors file" * 10)
    return path


def test_the_corrupt_directory_fails_to_load(corrupt):
    with pytest.raises(Exception) as info:
        GatedAttnForCausalLM.from_pretrained(corrupt, attn_implementation="eager")
    assert "attn_implementation" not in str(info.value)


@pytest.mark.parametrize("value", ["flash_attention_2", "foo", "flex_attention"])
def test_other_values_are_refused_before_weights_are_read(corrupt, value):
    register_auto()
    for load in (GatedAttnForCausalLM.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(ConfigError, match=f"attn_implementation='{value}' is not supported; {ALLOWED}") as info:
            load(corrupt, attn_implementation=value)
        assert isinstance(info.value, (GatedAttnError, ValueError)) and "\n" not in str(info.value)


def test_other_values_are_refused_by_the_config_and_set_attn_implementation(loaded):
    model, _ = loaded["gated"]
    config = copy.deepcopy(model.config)
    config._attn_implementation = "flash_attention_2"
    with pytest.raises(ConfigError, match=f"attn_implementation='flash_attention_2' is not supported; {ALLOWED}"):
        GatedAttnForCausalLM(config)
    with pytest.raises(ConfigError, match=f"attn_implementation='foo' is not supported; {ALLOWED}"):
        model.set_attn_implementation("foo")
    assert_fused(model)  # unchanged


# ----------------------------------------------------------------------------- routes
def test_the_auto_classes_and_the_config_route(saved):
    register_auto()
    auto = AutoModelForCausalLM.from_pretrained(saved["sink"], attn_implementation="eager")
    assert type(auto).__name__ == "GatedAttnForCausalLM"
    assert_eager(auto)
    assert_fused(AutoModelForCausalLM.from_pretrained(saved["sink"]))
    assert_fused(AutoModelForCausalLM.from_pretrained(saved["sink"], attn_implementation="sdpa"))
    config = copy.deepcopy(auto.config)
    config._attn_implementation = "eager"
    assert_eager(GatedAttnForCausalLM(config))
    assert_eager(AutoModelForCausalLM.from_config(auto.config, attn_implementation="eager"))
    config._attn_implementation = None
    assert_fused(GatedAttnForCausalLM(config))


def test_set_attn_implementation_switches_the_cores(saved):
    if not hasattr(PreTrainedModel, "set_attn_implementation"):
        pytest.skip("this transformers has no set_attn_implementation")
    model = GatedAttnForCausalLM.from_pretrained(saved["sink"])
    ids, mask = padded_batch()
    with torch.no_grad():
        before = model(ids, attention_mask=mask).logits
        model.set_attn_implementation("eager")
        assert_eager(model)
        after = model(ids, attention_mask=mask).logits
        model.set_attn_implementation("sdpa")
        assert_fused(model)
        model.config._attn_implementation = "eager"  # set on the config, as transformers' own models read it
        model(ids)
        assert_eager(model)
    torch.testing.assert_close(after[mask.bool()], before[mask.bool()], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- saving
def test_saving_an_eager_model_writes_what_the_default_one_does(tmp_path, saved, loaded):
    default, eager = loaded["mla-hyga-sink"]
    default.save_pretrained(tmp_path / "default")
    eager.save_pretrained(tmp_path / "eager")
    written = [json.loads((tmp_path / d / "config.json").read_text()) for d in ("default", "eager")]
    assert written[0] == written[1]
    assert not any("attn_implementation" in key for key in written[1])
    original = json.loads((saved["mla-hyga-sink"] / "config.json").read_text())
    assert written[1]["attention"] == original["attention"]
    assert ((tmp_path / "default" / "model.safetensors").read_bytes()
            == (tmp_path / "eager" / "model.safetensors").read_bytes())
    assert_fused(GatedAttnForCausalLM.from_pretrained(tmp_path / "eager"))  # not saved
    assert_eager(eager)
