"""The learnable sink under the mechanism study's recipe: how it is optimised, initialised,
differentiated on the fused path and compared with the other logits, and how the probe
reads its share of the attention."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from gatedattn.data.backcopy import FALLBACK_TEXT, BigramBackcopy
from gatedattn.infra.errors import ConfigError
from gatedattn.models.lm import GatedLM
from gatedattn.reproduce.mechanism.config import MechanismConfig
from gatedattn.reproduce.mechanism.probe import measure, query_classes
from gatedattn.reproduce.mechanism.run import train_config
from gatedattn.train.optim import build_optimizer


@pytest.fixture(scope="module")
def task():
    return BigramBackcopy.from_text(FALLBACK_TEXT, source="test passage")


def recipe_model(task, *, kernel=None, seed=0, d_model=16, seq_len=12):
    """The study's `sink` model (learned positions, LayerNorm with bias, q/k/v bias,
    N(0, 1) embeddings), narrow; its biases and norm parameters drawn away from their
    initial values so that every one of them takes part in the gradient."""
    cfg = MechanismConfig(d_model=d_model, seq_len=seq_len, progress=False)
    tc = train_config(cfg, Path("data"), Path("run"), "sink", 1, seed)
    recipe = tc.model if kernel is None else dataclasses.replace(tc.model, attention={**tc.model.attention,
                                                                                       "kernel": kernel})
    torch.manual_seed(seed)
    model = GatedLM(recipe.build(vocab_size=task.vocab_size, max_seq_len=seq_len, bos_token_id=task.bos_id))
    return cfg, tc, model


def perturb(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # biases, norm gains and shifts, the sink logit
                p.add_(0.3 * torch.randn(p.shape, generator=g))


def test_recipe_model_has_the_parts_it_claims(task):
    _, _, model = recipe_model(task)
    attn = model.blocks[0].attn
    assert model.pos_embed is not None and attn.rotary.rot_dim == 0
    assert isinstance(model.blocks[0].attn_norm, torch.nn.LayerNorm) and model.blocks[0].attn_norm.bias is not None
    assert all(m.bias is not None for m in (attn.qkv.q_proj, attn.qkv.k_proj, attn.qkv.v_proj))
    assert attn.cfg.resolved_kernel == "flash-lse"  # the fused path trains the study's sink on a CPU


def test_sink_starts_at_zero_in_the_no_decay_group_at_the_full_rate(task):
    cfg, tc, model = recipe_model(task)
    sink = model.blocks[0].attn.sink
    assert sink is not None and torch.equal(sink, torch.zeros_like(sink))
    opt = build_optimizer(model, tc)
    groups = [g for g in opt.param_groups if any(p is sink for p in g["params"])]
    assert len(groups) == 1
    group = groups[0]
    assert group["weight_decay"] == 0.0 and group["base_lr"] == cfg.lr
    assert all(g["base_lr"] == cfg.lr for g in opt.param_groups)  # no group's rate is scaled
    assert any(g["weight_decay"] == cfg.weight_decay for g in opt.param_groups)
    opt.set_lr_factor(1.0)
    batch = torch.as_tensor(task.sample(4, cfg.seq_len, seed=5))
    model.loss(batch).backward()
    grad = sink.grad.clone()
    assert grad.abs().item() > 0
    opt.step()
    # AdamW's first step: lr * g / (|g| + eps) against the gradient, and no decay
    torch.testing.assert_close(sink.detach(), -cfg.lr * grad / (grad.abs() + tc.eps), rtol=1e-5, atol=0)


def test_fused_sink_gradient_matches_a_float64_reference_model(task):
    """The whole recipe model, fused path in float32 against the reference path on the
    same weights in float64 (its softmax in float32): every parameter's gradient, the
    sink's above all."""
    _, _, fused = recipe_model(task)
    _, _, ref = recipe_model(task, kernel="reference")
    perturb(fused)
    ref.load_state_dict(fused.state_dict())
    ref.double()
    batch = torch.as_tensor(task.sample(6, 12, seed=7))
    fused.loss(batch).backward()
    ref.loss(batch).backward()
    ref_grads = dict(ref.named_parameters())
    for name, p in fused.named_parameters():
        g_ref = ref_grads[name].grad
        torch.testing.assert_close(p.grad.double(), g_ref, rtol=2e-4, atol=2e-6 * g_ref.abs().max().item(),
                                   msg=lambda m: f"{name}: {m}")
    assert fused.blocks[0].attn.sink.grad.abs().item() > 1e-5  # a gradient to compare, not zero


def test_sink_gradient_sign_and_size_match_finite_differences(task):
    """The fused path's d(loss)/d(sink) against central differences of the reference
    model in float64 (its softmax in float32, as the reference core computes it)."""
    _, _, model = recipe_model(task)
    perturb(model)
    with torch.no_grad():
        model.blocks[0].attn.sink.fill_(1.0)
    batch = torch.as_tensor(task.sample(6, 12, seed=8))
    ref = recipe_model(task, kernel="reference")[2]
    ref.load_state_dict(model.state_dict())
    ref.double()

    def loss(m):
        logits = m(batch[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())

    loss(model).backward()
    fused = model.blocks[0].attn.sink.grad.item()
    s = ref.blocks[0].attn.sink
    h = 1e-3
    with torch.no_grad():
        s.add_(h)
        up = loss(ref).item()
        s.sub_(2 * h)
        down = loss(ref).item()
    numeric = (up - down) / (2 * h)
    assert abs(numeric) > 1e-5
    assert fused == pytest.approx(numeric, rel=1e-2)  # float32 sums: the sign and size


class _Recorder(torch.nn.Module):
    """An attention core that keeps q, k, the sink and the scale it is called with, and
    answers with the reference core."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.seen = inner, {}

    def forward(self, q, k, v, sink=None, *, q_offset=0, scale=None, key_mask=None):
        self.seen = dict(q=q.detach().double(), k=k.detach().double(), sink=sink.detach().double(), scale=scale)
        return self.inner(q, k, v, sink, q_offset=q_offset, scale=scale)


def _sink_share_by_hand(seen):
    """p_sink = e^b / (e^b + sum_j<=i e^(scale q_i . k_j)): the sink logit against the
    scaled scores."""
    q, k, b, scale = seen["q"], seen["k"], seen["sink"], seen["scale"]
    scores = scale * q @ k.transpose(-1, -2)  # (B, H, T, T)
    T = scores.shape[-1]
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    return torch.sigmoid(b.view(1, -1, 1) - lse)  # (B, H, T)


@pytest.mark.parametrize("kernel", ["flash-lse", "reference"])
def test_sink_logit_meets_the_scaled_scores_and_the_probe_reads_its_share(task, kernel):
    _, _, model = recipe_model(task, kernel=kernel, d_model=16)
    perturb(model)
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.sink.fill_(1.2)
        attn.qkv.q_proj.weight.mul_(20.0)  # scores of a few units, so that the scale matters
    model.eval()
    batch = torch.as_tensor(task.sample(8, 12, seed=9))
    recorder = _Recorder(attn.core)
    with torch.no_grad(), attn.with_core(recorder):
        out_recorded = model(batch[:, :-1])
    assert recorder.seen["scale"] == pytest.approx(1 / math.sqrt(attn.cfg.qk_dim))
    share = _sink_share_by_hand(recorder.seen).mean(1)  # (B, T), head mean
    # the layer's own core (fused or reference) computes the same outputs
    with torch.no_grad():
        torch.testing.assert_close(model(batch[:, :-1]), out_recorded, rtol=1e-4, atol=1e-4)
    m = measure(model, batch, task)
    trig, ordi = query_classes(batch[:, :-1], task)
    assert m["sink_mass_ordinary"] == pytest.approx(float(share[ordi].mean()), rel=1e-5)
    assert m["sink_mass_trigger"] == pytest.approx(float(share[trig].mean()), rel=1e-5)
    assert 0.05 < m["sink_mass_ordinary"] < 0.95  # a share the check can tell apart from its mistakes
    # comparing the sink with unscaled scores would read another share
    unscaled = _sink_share_by_hand({**recorder.seen, "scale": 1.0}).mean(1)
    assert abs(float(unscaled[ordi].mean()) - m["sink_mass_ordinary"]) > 0.01
    assert m["sink_logit"] == pytest.approx(1.2)


def test_sink_init_starts_the_sink_arms_only(task):
    from gatedattn.reproduce.mechanism.run import LATER_RECIPE_FIELDS, recipe_of

    head_start = MechanismConfig(sink_init=3.0, progress=False)
    plain = MechanismConfig(progress=False)
    for variant in ("sink", "hyga-sink"):
        recipe = train_config(head_start, Path("d"), Path("r"), variant, 1, 0).model
        model = GatedLM(recipe.build(vocab_size=task.vocab_size, max_seq_len=65, bos_token_id=task.bos_id))
        assert model.blocks[0].attn.sink.tolist() == [3.0]
        assert recipe_of(head_start, variant) != recipe_of(plain, variant)
    for variant in ("baseline", "gated"):  # no sink: the same run under either recipe (reused)
        assert train_config(head_start, Path("d"), Path("r"), variant, 1, 0) == \
            train_config(plain, Path("d"), Path("r"), variant, 1, 0)
        assert recipe_of(head_start, variant) == recipe_of(plain, variant)
    # a run recorded before sink_init existed is the recipe's run at sink_init 0
    old = {k: v for k, v in recipe_of(plain, "sink").items() if k not in LATER_RECIPE_FIELDS}
    assert {**LATER_RECIPE_FIELDS, **old} == recipe_of(plain, "sink")
    assert "sinks start at logit 3" in head_start.describe() and "sinks start" not in plain.describe()


def test_the_mlp_lever_builds_a_two_matrix_mlp_and_keeps_older_runs(task):
    from gatedattn.reproduce.mechanism.run import LATER_RECIPE_FIELDS, recipe_of

    relu, plain = MechanismConfig(mlp="relu", progress=False), MechanismConfig(progress=False)
    model = GatedLM(train_config(relu, Path("d"), Path("r"), "sink", 1, 0).model.build(
        vocab_size=task.vocab_size, max_seq_len=65, bos_token_id=task.bos_id))
    assert isinstance(model.blocks[0].mlp.act, torch.nn.ReLU) and model.blocks[0].mlp.up_proj.bias is not None
    assert recipe_of(relu, "baseline") != recipe_of(plain, "baseline") and "ReLU MLP with biases" in relu.describe()
    # the default leaves the trainer's config as it was before the field, and a run recorded then is reused
    assert "mlp" not in train_config(plain, Path("d"), Path("r"), "baseline", 1, 0).model.lm
    old = {k: v for k, v in recipe_of(plain, "baseline").items() if k != "mlp"}
    assert {**LATER_RECIPE_FIELDS, **old} == recipe_of(plain, "baseline") and "MLP" not in plain.describe()


def test_the_mlp_width_lever_sets_the_hidden_width_and_keeps_older_runs(task):
    from gatedattn.reproduce.mechanism.run import LATER_RECIPE_FIELDS, recipe_of

    wide, plain = MechanismConfig(mlp_ratio=8, mlp="relu", progress=False), MechanismConfig(progress=False)
    model = GatedLM(train_config(wide, Path("d"), Path("r"), "baseline", 1, 0).model.build(
        vocab_size=task.vocab_size, max_seq_len=65, bos_token_id=task.bos_id))
    assert model.blocks[0].mlp.up_proj.weight.shape == (8 * 64, 64)
    default = GatedLM(train_config(plain, Path("d"), Path("r"), "baseline", 1, 0).model.build(
        vocab_size=task.vocab_size, max_seq_len=65, bos_token_id=task.bos_id))
    assert default.blocks[0].mlp.up_proj.weight.shape == (2 * 64, 64)  # the default is the toy preset's width
    assert "ffn_dim" not in train_config(plain, Path("d"), Path("r"), "baseline", 1, 0).model.lm
    assert recipe_of(wide, "baseline")["mlp_ratio"] == 8 and "MLP 8× d_model wide" in wide.describe()
    old = {k: v for k, v in recipe_of(plain, "baseline").items() if k != "mlp_ratio"}  # recorded before the field
    assert {**LATER_RECIPE_FIELDS, **old} == recipe_of(plain, "baseline") and "wide" not in plain.describe()
    with pytest.raises(ConfigError, match="mlp_ratio"):
        MechanismConfig(mlp_ratio=0)


def test_the_init_scale_lever_draws_the_weight_matrices_at_its_std(task):
    from gatedattn.reproduce.mechanism.run import LATER_RECIPE_FIELDS, recipe_of

    wide, plain = MechanismConfig(init_std=0.5, progress=False), MechanismConfig(progress=False)
    torch.manual_seed(0)
    model = GatedLM(train_config(wide, Path("d"), Path("r"), "baseline", 1, 0).model.build(
        vocab_size=task.vocab_size, max_seq_len=65, bos_token_id=task.bos_id))
    assert 0.45 < model.blocks[0].mlp.up_proj.weight.std().item() < 0.55
    assert 0.9 < model.embed.weight.std().item() < 1.1  # the embeddings keep embed_std
    assert "init_std" not in train_config(plain, Path("d"), Path("r"), "baseline", 1, 0).model.lm
    assert "weight matrices N(0, 0.5)" in wide.describe() and "weight matrices" not in plain.describe()
    old = {k: v for k, v in recipe_of(plain, "baseline").items() if k != "init_std"}
    assert {**LATER_RECIPE_FIELDS, **old} == recipe_of(plain, "baseline")
