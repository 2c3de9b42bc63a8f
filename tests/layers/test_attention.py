"""The attention layer: every preset, every KV layout, fast path against reference."""


import pytest
import torch

from gatedattn import VARIANTS, Attention, AttentionConfig, KVCache, MLAConfig

D_MODEL, HEADS = 32, 4
LAYOUTS = {
    "mha": dict(n_kv_heads=4),
    "gqa": dict(n_kv_heads=2),
    "mla": dict(kv="mla", mla=MLAConfig(kv_rank=12, rope_dim=4)),
}
CASES = [(v, l) for v in VARIANTS for l in LAYOUTS]


def make(variant, layout, **fields):
    cfg = VARIANTS[variant](D_MODEL, HEADS, **{**LAYOUTS[layout], **fields})
    return Attention(cfg)


def randomize_(module):
    """Non-trivial values for parameters that start at zero (sinks, static gates, biases)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if (p == 0).all():
                p.normal_(0, 0.5)
    return module


def as_reference(layer):
    ref = Attention(layer.cfg.replace(kernel="reference"))
    ref.load_state_dict(layer.state_dict())
    return ref


@pytest.mark.parametrize("variant,layout", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_backward_shape_and_causality(variant, layout, dtype):
    layer = randomize_(make(variant, layout)).to(dtype)
    x = torch.randn(2, 7, D_MODEL, dtype=dtype, requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape and y.dtype == dtype
    y.float().square().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())
    # causality: changing tokens from position 4 on leaves outputs before 4 unchanged
    x2 = x.detach().clone()
    x2[:, 4:] = torch.randn_like(x2[:, 4:])
    with torch.no_grad():
        y1, y2 = layer(x.detach()), layer(x2)
    torch.testing.assert_close(y1[:, :4], y2[:, :4], atol=0, rtol=0)
    assert not torch.allclose(y1[:, 4:], y2[:, 4:])


@pytest.mark.parametrize("variant,layout", CASES)
def test_fast_path_matches_reference(variant, layout):
    fast = randomize_(make(variant, layout))
    ref = as_reference(fast)
    x = torch.randn(2, 9, D_MODEL)
    x_f, x_r = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_f, y_r = fast(x_f), ref(x_r)
    torch.testing.assert_close(y_f, y_r, atol=1e-5, rtol=1e-5)
    dy = torch.randn_like(y_f)
    y_f.backward(dy)
    y_r.backward(dy)
    torch.testing.assert_close(x_f.grad, x_r.grad, atol=1e-5, rtol=1e-5)
    for (name, p_f), p_r in zip(fast.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p_f.grad, p_r.grad, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("variant,layout", CASES)
def test_kv_cache_decoding_equals_full_forward(variant, layout):
    layer = randomize_(make(variant, layout)).eval()
    x = torch.randn(2, 9, D_MODEL)
    with torch.no_grad():
        full = layer(x)
        for steps in ([4, 1, 1, 1, 1, 1], [2, 3, 4], [1] * 9):
            cache, outs, t = KVCache(), [], 0
            for n in steps:
                outs.append(layer(x[:, t : t + n], cache=cache))
                t += n
            assert cache.length == 9
            torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5)


def test_explicit_positions_equal_default():
    layer = make("gated", "gqa")
    x = torch.randn(2, 6, D_MODEL)
    torch.testing.assert_close(layer(x), layer(x, positions=torch.arange(6)))
    torch.testing.assert_close(layer(x), layer(x, positions=torch.arange(6).expand(2, 6)))
    # RoPE is relative: a shift changes nothing, a stretch does
    torch.testing.assert_close(layer(x), layer(x, positions=torch.arange(6) + 3), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(layer(x), layer(x, positions=torch.arange(6) * 2))


@pytest.mark.parametrize("variant", ["gated", "gated-headwise", "g2-value", "g3-key", "g4-query", "g5-dense", "g1-shared"])
def test_gate_forced_open_equals_baseline(variant):
    base = make("baseline", "gqa")
    gated = make(variant, "gqa", gate_fields={"bias": True})
    missing, _ = gated.load_state_dict(base.state_dict(), strict=False)
    assert all(name.startswith("gate.") for name in missing)
    with torch.no_grad():
        gated.gate.x.proj.weight.zero_()
        gated.gate.x.proj.bias.fill_(50.0)  # sigmoid(50) == 1 in float32
    x = torch.randn(2, 7, D_MODEL)
    torch.testing.assert_close(gated(x), base(x), atol=1e-6, rtol=1e-6)


def test_hyga_gates_forced_open_equal_baseline():
    base = make("baseline", "gqa")
    hyga = make("hyga", "gqa", gate_fields={"bias": True})
    hyga.load_state_dict(base.state_dict(), strict=False)
    with torch.no_grad():
        for name, p in hyga.gate.named_parameters():
            p.zero_()
        hyga.gate.x.proj.bias.fill_(60.0)
    # C-gate logits are zero -> sigmoid = 1/2 for every head: exactly half the baseline
    x = torch.randn(2, 7, D_MODEL)
    torch.testing.assert_close(hyga(x), 0.5 * base(x), atol=1e-6, rtol=1e-6)


def test_sink_to_minus_infinity_equals_no_sink():
    base = make("baseline", "gqa")
    sink = make("sink", "gqa")
    sink.load_state_dict(base.state_dict(), strict=False)
    with torch.no_grad():
        sink.sink.fill_(float("-inf"))
    x = torch.randn(2, 7, D_MODEL)
    torch.testing.assert_close(sink(x), base(x), atol=1e-6, rtol=1e-6)


def test_headwise_equals_elementwise_with_tied_scores():
    head = make("gated-headwise", "gqa")
    elem = make("gated", "gqa")
    elem.load_state_dict({k: v for k, v in head.state_dict().items() if not k.startswith("gate.")}, strict=False)
    d = elem.cfg.head_dim
    with torch.no_grad():  # headwise row h -> d identical rows for head h
        elem.gate.x.proj.weight.copy_(head.gate.x.proj.weight.repeat_interleave(d, dim=0))
    x = torch.randn(2, 7, D_MODEL)
    torch.testing.assert_close(elem(x), head(x), atol=1e-6, rtol=1e-6)


def test_hyga_gate_matches_per_head_formula():
    """H'_i = H_i * sigmoid(X W_i + SiLU(H_i W_i^d) W_i^u) * sigmoid(c_i), c = concat(H) W_c."""
    layer = randomize_(make("hyga", "gqa"))
    gate = layer.gate
    x = torch.randn(2, 5, D_MODEL)
    h = torch.randn(2, 5, HEADS, layer.cfg.head_dim)
    c = torch.sigmoid(h.reshape(2, 5, -1) @ gate.c.proj.weight.T)  # (B, T, H)
    xw = (x @ gate.x.proj.weight.T).view(2, 5, HEADS, -1)
    expected = torch.empty_like(h)
    for i in range(HEADS):
        hl = torch.nn.functional.silu(h[:, :, i] @ gate.h.down.weight[i]) @ gate.h.up.weight[i]
        expected[:, :, i] = h[:, :, i] * torch.sigmoid(xw[:, :, i] + hl) * c[:, :, i, None]
    torch.testing.assert_close(gate(h, x), expected, atol=1e-5, rtol=1e-5)


def test_hyga_ablations_are_one_gate_each():
    """``hyga-h``: H'_i = H_i * sigmoid(SiLU(H_i W_i^d) W_i^u), no X-gate, no C-gate;
    ``hyga-c``: H'_i = H_i * sigmoid(c_i), c = concat(H) W_c, no X-gate, no H-gate."""
    x = torch.randn(2, 5, D_MODEL)
    h_only, c_only = randomize_(make("hyga-h", "gqa")).gate, randomize_(make("hyga-c", "gqa")).gate
    assert h_only.x is None and h_only.c is None and c_only.x is None and c_only.h is None
    h = torch.randn(2, 5, HEADS, h_only.dim)
    expected = torch.empty_like(h)
    for i in range(HEADS):
        hl = torch.nn.functional.silu(h[:, :, i] @ h_only.h.down.weight[i]) @ h_only.h.up.weight[i]
        expected[:, :, i] = h[:, :, i] * torch.sigmoid(hl)
    torch.testing.assert_close(h_only(h, x), expected, atol=1e-5, rtol=1e-5)
    c = torch.sigmoid(h.reshape(2, 5, -1) @ c_only.c.proj.weight.T)
    torch.testing.assert_close(c_only(h, x), h * c[..., None], atol=1e-5, rtol=1e-5)
    assert isinstance(c_only.c.proj, torch.nn.Linear)  # the LoRA target the README names


def test_hyga_multiplicative_fusion_is_product_of_sigmoids():
    layer = randomize_(make("hyga-mulfusion", "mha"))
    gate = layer.gate
    gate.c = None  # isolate the fusion
    x, h = torch.randn(1, 3, D_MODEL), torch.randn(1, 3, HEADS, layer.cfg.head_dim)
    xl, hl = gate.x(x), gate.h(h)
    torch.testing.assert_close(gate(h, x), h * torch.sigmoid(xl) * torch.sigmoid(hl))


@pytest.mark.parametrize("variant,check", [
    ("g1-ns-sigmoid", lambda s: (s >= 0.5).all() and (s <= 1).all()),
    ("gated", lambda s: (s > 0).all() and (s < 1).all()),
    ("g1-silu", lambda s: (s < 0).any()),
])
def test_gate_activation_ranges(variant, check):
    layer = randomize_(make(variant, "mha"))
    seen = []
    layer.gate.score.register_forward_hook(lambda m, i, o: seen.append(o))
    layer(torch.randn(2, 5, D_MODEL) * 3)
    assert check(seen[0])


def test_static_gate_ignores_input():
    layer = randomize_(make("g1-static", "mha"))
    seen = []
    layer.gate.score.register_forward_hook(lambda m, i, o: seen.append(o))
    layer(torch.randn(1, 3, D_MODEL))
    layer(torch.randn(1, 3, D_MODEL))
    torch.testing.assert_close(seen[0], seen[1])


def test_additive_gate_adds():
    layer = randomize_(make("g1-additive-silu", "mha"))
    h, x = torch.randn(1, 3, HEADS, layer.cfg.head_dim), torch.randn(1, 3, D_MODEL)
    torch.testing.assert_close(layer.gate(h, x), h + torch.nn.functional.silu(layer.gate.x(x)))


def test_partial_rope_leaves_tail_channels_unrotated():
    cfg = AttentionConfig(d_model=32, n_heads=2, head_dim=16, rope=__import__("gatedattn").RopeConfig(fraction=0.25))
    layer = Attention(cfg)
    assert layer.rotary.rot_dim == 4
    from gatedattn.layers.rope import apply_rope
    x = torch.randn(1, 5, 2, 16)
    cos, sin = layer.rotary.cos_sin(torch.arange(5)[None], x.dtype)
    y = apply_rope(x, cos, sin)
    torch.testing.assert_close(y[..., 4:], x[..., 4:])
    torch.testing.assert_close(y[:, 0], x[:, 0])  # position 0 is not rotated
    assert not torch.allclose(y[:, 1:, :, :4], x[:, 1:, :, :4])


def test_mla_latent_is_low_rank():
    layer = make("baseline", "mla")
    x = torch.randn(1, 20, D_MODEL)
    _, k, v, _ = layer.qkv(x)
    # values of all heads come from a 12-wide latent: rank <= 12
    assert torch.linalg.matrix_rank(v.reshape(20, -1)) <= 12
    assert k.shape[-1] == layer.cfg.head_dim + 4


def test_sink_starts_at_sink_init_in_the_layer_and_the_model():
    from gatedattn.models.lm import GatedLM, ModelConfig

    cfg = ModelConfig.from_preset("micro", "sink", vocab_size=40, attention_fields={"sink_init": 2.5})
    model = GatedLM(cfg)
    for block in model.blocks:
        assert torch.equal(block.attn.sink, torch.full_like(block.attn.sink, 2.5))
    assert torch.equal(GatedLM(ModelConfig.from_preset("micro", "sink", vocab_size=40)).blocks[0].attn.sink,
                       torch.zeros(cfg.attention.n_heads))
    assert Attention(cfg.attention).sink.tolist() == [2.5] * cfg.attention.n_heads
