"""The fused gate paths against the plain ones: ``ops.gated_linear`` against its reference,
the [q | gate] packed projection and the fused g1 gate + o_proj inside ``Attention``
against the unfused layer, forward and backward; the memory the fusion saves; and the
MLA cache that holds the latent."""

import pytest
import torch

from gatedattn import VARIANTS, Attention, KVCache, MLAConfig
from gatedattn.ops import gated_linear
from gatedattn.ops import reference

B, T, H, D, C = 2, 7, 4, 8, 24


def saved_bytes(fn):
    """Bytes of the distinct storages autograd saves for backward while running ``fn``."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


@pytest.mark.parametrize("logit_shape", [(B, T, H, D), (B, T, H, 1), (B, T, 1, D), (1, 1, H, D)],
                         ids=["elementwise", "headwise", "shared", "static"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("cross_head", [False, True])
def test_gated_linear_matches_reference(logit_shape, bias, cross_head):
    g = torch.Generator().manual_seed(0)
    y = torch.randn(B, T, H, D, generator=g).transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    logits = torch.randn(logit_shape, generator=g, requires_grad=True)
    w = torch.randn(C, H * D, generator=g, requires_grad=True)
    b = torch.randn(C, generator=g, requires_grad=True) if bias else None
    c = torch.randn(B, T, H, 1, generator=g, requires_grad=True) if cross_head else None
    inputs = [t for t in (y, logits, w, b, c) if t is not None]
    dout = torch.randn(B, T, C, generator=g)
    fast = gated_linear(y, logits, w, b, c)
    ref = reference.gated_linear(y, logits, w, b, c)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    g_fast = torch.autograd.grad(fast, inputs, dout)
    g_ref = torch.autograd.grad(ref, inputs, dout)
    for a, r in zip(g_fast, g_ref):
        assert a.shape == r.shape
        torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-5)


def test_gated_linear_under_bf16_autocast():
    g = torch.Generator().manual_seed(1)
    y = torch.randn(B, T, H, D, generator=g, requires_grad=True)
    logits = torch.randn(B, T, H, D, generator=g, requires_grad=True)
    w = torch.randn(C, H * D, generator=g, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast = gated_linear(y, logits, w)
        ref = reference.gated_linear(y, logits, w)
    assert fast.dtype == torch.bfloat16
    torch.testing.assert_close(fast.float(), ref.float(), atol=5e-2, rtol=5e-2)
    fast.float().sum().backward()
    assert y.grad.dtype == logits.grad.dtype == w.grad.dtype == torch.float32


def test_gated_linear_saves_less_than_separate_ops():
    y = torch.randn(4, 64, H, D, requires_grad=True)
    logits = torch.randn(4, 64, H, D, requires_grad=True)
    w = torch.randn(C, H * D, requires_grad=True)
    _, fused = saved_bytes(lambda: gated_linear(y, logits, w))
    _, plain = saved_bytes(lambda: reference.gated_linear(y, logits, w))
    one = y.numel() * 4
    assert plain - fused >= one  # the scores and the gated product are not kept


FUSED = ["gated", "gated-headwise", "g1-shared", "g1-static", "g4-query", "hyga", "hyga-lowrank", "hyga-sink"]


def _layer(variant, **fields):
    torch.manual_seed(0)
    layer = Attention(VARIANTS[variant](32, 4, **{"n_kv_heads": 2, **fields}))
    with torch.no_grad():
        for p in layer.parameters():
            if (p == 0).all():
                p.normal_(0, 0.5)
    return layer


@pytest.mark.parametrize("variant", FUSED)
@pytest.mark.parametrize("qkv_bias", [False, True])
def test_fused_layer_equals_the_unfused_one(variant, qkv_bias):
    layer = _layer(variant, qkv_bias=qkv_bias)
    x = torch.randn(2, 9, 32)
    fused = layer(x)
    grads_fused = torch.autograd.grad(fused.square().sum(), list(layer.parameters()))
    # a hook on the gate's scores (as analysis registers) selects the plain path
    seen = []
    handles = [m.register_forward_hook(lambda m, i, o: seen.append(o)) for m in layer.gate.score_modules]
    plain = layer(x)
    grads_plain = torch.autograd.grad(plain.square().sum(), list(layer.parameters()))
    for h in handles:
        h.remove()
    assert len(seen) == len(handles), "the plain path must run every score module"
    torch.testing.assert_close(fused, plain, atol=1e-5, rtol=1e-5)
    for (name, _), a, b in zip(layer.named_parameters(), grads_fused, grads_plain):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)


def test_packed_projection_is_used_and_fusion_saves_memory(monkeypatch):
    layer = _layer("gated")
    x = torch.randn(2, 33, 32)
    calls = []
    monkeypatch.setattr(layer.gate.x.proj, "forward", lambda *a: calls.append(1))  # must not be called
    _, fused = saved_bytes(lambda: layer(x))
    assert not calls
    monkeypatch.undo()
    layer.o_proj.register_forward_hook(lambda m, i, o: None)  # forces the plain g1 path
    _, plain = saved_bytes(lambda: layer(x))
    assert plain - fused >= 2 * 33 * 4 * 8 * 4  # at least one (B, T, H, D) fp32 tensor fewer


def test_mla_cache_holds_the_latent_and_decodes_like_the_full_pass():
    mla = dict(kv="mla", mla=MLAConfig(kv_rank=12, rope_dim=4))
    for variant in ("baseline", "gated", "g2-value"):
        layer = _layer(variant, **{**mla, "n_kv_heads": 4}).eval()
        x = torch.randn(2, 6, 32)
        cache = KVCache()
        with torch.no_grad():
            full = layer(x)
            steps = torch.cat([layer(x[:, i:i + 1], cache=cache) for i in range(6)], dim=1)
        torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
        if variant == "g2-value":  # the value gate needs each token's X: per-head K/V cached
            assert cache.latent is None and cache.k.shape == (2, 4, 6, 12)
            continue
        assert cache.k is None and cache.latent.shape == (2, 6, 12) and cache.k_rope.shape == (2, 6, 1, 4)
        assert cache.nbytes() == 2 * 6 * (12 + 4) * 4
    cache.crop(3)
    assert cache.length == 3
