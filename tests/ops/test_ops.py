"""Fast attention cores against the reference, forward and backward (docs/design.md section 3)."""

import pytest
import torch

from gatedattn.ops import attention_flash_lse, attention_reference, attention_sdpa
from gatedattn.ops.reference import attention_probs_reference
from gatedattn.layers.variants import VARIANTS


def qkv(B=2, H=4, Hkv=2, T=9, D=8, Dv=None, dtype=torch.float32):
    Dv = Dv or D
    q = torch.randn(B, H, T, D, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Hkv, T, D, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Hkv, T, Dv, dtype=dtype, requires_grad=True)
    return q, k, v


def grads(fn, *inputs):
    out = fn(*inputs)
    dout = torch.randn_like(out, generator=torch.Generator().manual_seed(1))
    g = torch.autograd.grad(out, [t for t in inputs if t is not None and t.requires_grad], dout)
    return out, g


def sink_reference_by_hand(q, k, v, b):
    """Concatenate a logit column, softmax, drop it -- written independently of ops."""
    H, Hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(H // Hkv, 1)
    v = v.repeat_interleave(H // Hkv, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    T = q.shape[2]
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    col = b.view(1, H, 1, 1).expand(*s.shape[:3], 1)
    p = torch.softmax(torch.cat([s, col], -1), -1)[..., :T]
    return p @ v


@pytest.mark.parametrize("Hkv", [4, 2, 1])
def test_sdpa_matches_reference(Hkv):
    q, k, v = qkv(Hkv=Hkv)
    out_f, g_f = grads(attention_sdpa, q, k, v)
    out_r, g_r = grads(attention_reference, q, k, v)
    torch.testing.assert_close(out_f, out_r, atol=1e-5, rtol=1e-5)
    for a, b in zip(g_f, g_r):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("Hkv,Dv", [(4, 8), (2, 8), (1, 8), (4, 6), (2, 12)])
def test_flash_lse_sink_matches_concatenated_column(Hkv, Dv):
    q, k, v = qkv(Hkv=Hkv, Dv=Dv)
    b = torch.randn(4, requires_grad=True)
    out_f, g_f = grads(lambda *a: attention_flash_lse(*a[:3], a[3]), q, k, v, b)
    out_h, g_h = grads(sink_reference_by_hand, q, k, v, b)
    out_r, g_r = grads(lambda *a: attention_reference(*a[:3], a[3]), q, k, v, b)
    for out, g in ((out_f, g_f), (out_r, g_r)):
        torch.testing.assert_close(out, out_h, atol=1e-5, rtol=1e-5)
        for a, c in zip(g, g_h):  # dq, dk, dv and d(sink logit)
            torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-5)


def test_sink_gradient_formula():
    """dL/db = -sum_rows p_sink * (dO . O_sink), p_sink = sigmoid(b - lse)."""
    q, k, v = qkv(Hkv=4)
    b = torch.randn(4, requires_grad=True)
    out = attention_flash_lse(q, k, v, b)
    dout = torch.randn_like(out)
    (db,) = torch.autograd.grad(out, b, dout)
    s = (q @ k.transpose(-1, -2) / 8**0.5).masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p_sink = torch.sigmoid(b.view(1, 4, 1) - lse)
    expected = -(p_sink * (dout * out).sum(-1)).sum((0, 2))
    torch.testing.assert_close(db, expected.detach(), atol=1e-5, rtol=1e-5)


def test_sink_to_minus_infinity_is_no_sink():
    q, k, v = qkv()
    b = torch.full((4,), float("-inf"))
    torch.testing.assert_close(attention_flash_lse(q, k, v, b), attention_sdpa(q, k, v), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(attention_reference(q, k, v, b), attention_reference(q, k, v), atol=1e-6, rtol=1e-6)


def test_large_sink_takes_all_mass():
    q, k, v = qkv()
    out = attention_flash_lse(q, k, v, torch.full((4,), 1e4))
    assert out.abs().max() < 1e-6
    probs = attention_probs_reference(q, k, torch.full((4,), 1e4))
    assert probs.sum(-1).max() < 1e-6


def test_flash_lse_bf16_close_to_fp32():
    q, k, v = qkv()
    b = torch.randn(4, requires_grad=True)
    ref = attention_reference(q, k, v, b)
    out = attention_flash_lse(q.bfloat16(), k.bfloat16(), v.bfloat16(), b)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)
    out.float().sum().backward()
    assert torch.isfinite(b.grad).all()


def test_query_offset_matches_suffix_of_full():
    q, k, v = qkv(Hkv=2, T=10)
    full = attention_reference(q, k, v)
    for fn in (attention_sdpa, attention_reference, attention_flash_lse):
        part = fn(q[:, :, 6:], k, v, q_offset=6)
        torch.testing.assert_close(part, full[:, :, 6:], atol=1e-5, rtol=1e-5)
    b = torch.randn(4)
    full_s = attention_reference(q, k, v, b)
    torch.testing.assert_close(attention_flash_lse(q[:, :, 7:], k, v, b, q_offset=7), full_s[:, :, 7:], atol=1e-5, rtol=1e-5)


def test_sdpa_refuses_sink():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="no sink"):
        attention_sdpa(q, k, v, torch.zeros(4))


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("Hkv,Dv,T", [(4, 8, 9), (2, 8, 77), (1, 16, 130), (4, 6, 33), (2, 12, 64)])
def test_cuda_flash_lse_sink_matches_reference(dtype, tol, Hkv, Dv, T):
    """The CUDA fused path (memory-efficient kernel + the sink identity) against the plain
    reference on the same device, forward and backward, the sink-logit gradient included."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, T, 8 if Dv <= 8 else 16, generator=g)
    k = torch.randn(2, Hkv, T, q.shape[-1], generator=g)
    v = torch.randn(2, Hkv, T, Dv, generator=g)
    b = torch.randn(4, generator=g)
    dout = torch.randn(2, 4, T, Dv, generator=g)
    results = []
    for fn in (attention_flash_lse, attention_reference):
        ins = [t.cuda().to(dtype).requires_grad_() for t in (q, k, v)] + [b.cuda().requires_grad_()]
        out = fn(*ins[:3], ins[3])
        grads_ = torch.autograd.grad(out, ins, dout.cuda().to(out.dtype))
        results.append((out.float().cpu(), [x.float().cpu() for x in grads_]))
    (out_f, g_f), (out_r, g_r) = results
    torch.testing.assert_close(out_f, out_r, atol=tol, rtol=tol)
    for a, c in zip(g_f, g_r):
        torch.testing.assert_close(a, c, atol=tol * 10, rtol=tol * 10)


@cuda
def test_cuda_sink_path_uses_no_score_matrix():
    """At T = 4096 the fused sink path allocates far less than a T x T score matrix."""
    T = 4096
    q, k, v = (torch.randn(1, 4, T, 64, device="cuda", requires_grad=True) for _ in range(3))
    b = torch.zeros(4, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    attention_flash_lse(q, k, v, b).sum().backward()
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before < 4 * T * T * 4 // 4  # under a quarter of one fp32 T x T per head


def _layer_views(B=2, H=4, Hkv=2, T=9, D=8, gen=None):
    """q, k, v as the attention layer passes them: (B, H, T, D) views of (B, T, H, D) tensors."""
    g = gen or torch.Generator().manual_seed(3)
    q = torch.randn(B, T, H, D, generator=g).requires_grad_()
    k = torch.randn(B, T, Hkv, D, generator=g).requires_grad_()
    v = torch.randn(B, T, Hkv, D, generator=g).requires_grad_()
    return q, k, v


@pytest.mark.parametrize("padded", [False, True])
def test_flash_lse_sink_on_layer_views_matches_reference(padded):
    """The fused sink path on the layer's strided views, forward and backward (sink-logit
    gradient included) against the reference, with and without padding."""
    key_mask = torch.tensor([[True] * 9, [False] * 3 + [True] * 6]) if padded else None
    b = torch.randn(4, generator=torch.Generator().manual_seed(4))
    results = []
    for fn in (attention_flash_lse, attention_reference):
        q, k, v = _layer_views()
        sink = b.clone().requires_grad_()
        kw = {} if key_mask is None else {"key_mask": key_mask}
        out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sink, **kw)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
        results.append((out, torch.autograd.grad(out, (q, k, v, sink), dout)))
    (out_f, g_f), (out_r, g_r) = results
    torch.testing.assert_close(out_f, out_r, atol=1e-5, rtol=1e-5)
    for a, c in zip(g_f, g_r):
        torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sink_path_saves_what_plain_attention_saves(dtype):
    """The sink adds nothing to the memory kept for backward: the fused path saves the same
    bytes as plain SDPA (q, k, v, the output and one log-sum-exp), and its output has the
    kernel's (B, T, H, D) memory layout, so the layer's reshape before o_proj is a view."""
    from gatedattn.bench.memory import SavedTensorMeter

    saved, outs = [], []
    for sink in (None, torch.zeros(4, requires_grad=True)):
        q, k, v = (t.detach().to(dtype).requires_grad_() for t in _layer_views(T=64, D=16))
        with SavedTensorMeter(exclude=[] if sink is None else [sink]) as meter:
            out = attention_flash_lse(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sink)
            flat = out.transpose(1, 2).reshape(2, 64, -1)
        saved.append(meter.bytes)
        outs.append((out.stride(), flat.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()))
    assert saved[1] == saved[0]
    assert outs[1] == outs[0] == (outs[0][0], True)


def test_attention_layer_with_sink_keeps_baseline_memory():
    """A whole layer, forward + backward: the sink variant keeps as many bytes for backward
    as the baseline (the sink logits, a parameter, aside)."""
    from gatedattn.layers.attention import Attention
    from gatedattn.bench.memory import SavedTensorMeter
    from gatedattn.layers.variants import get_variant

    saved = {}
    for name in ("baseline", "sink", "hyga", "hyga-sink"):
        torch.manual_seed(0)
        layer = Attention(get_variant(name)(64, 4, 2, qk_norm=True))
        x = torch.randn(2, 48, 64, requires_grad=True)
        with SavedTensorMeter(exclude=list(layer.parameters())) as meter:
            layer(x).sum().backward()
        saved[name] = meter.bytes
    assert saved["sink"] == saved["baseline"]
    assert saved["hyga-sink"] == saved["hyga"]


def test_sink_layer_compiles_in_one_graph():
    """torch.compile traces the fused sink path whole (no graph break: ``bench --compile``
    and ``compile=true`` training keep it fused) and matches eager forward and backward."""
    from gatedattn.layers.attention import Attention
    from gatedattn.layers.variants import get_variant

    torch.manual_seed(0)
    layer = Attention(get_variant("sink")(32, 4, 2, qk_norm=True))
    with torch.no_grad():
        layer.sink.normal_()
    x = torch.randn(2, 16, 32, requires_grad=True)
    ref = layer(x)
    g_ref = torch.autograd.grad(ref.sum(), (x, layer.sink))
    torch._dynamo.reset()
    out = torch.compile(layer, backend="aot_eager", fullgraph=True)(x)
    g = torch.autograd.grad(out.sum(), (x, layer.sink))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for a, c in zip(g, g_ref):
        torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_model_compiles_in_one_graph(name):
    """A whole GatedLM of every variant traces without a graph break: a break (e.g. a
    storage query inside the gate's autograd function) would leave each layer's gate to
    eager and make ``compile=true`` slower than it should be."""
    from gatedattn import GatedLM
    from gatedattn.train.config import ModelRecipe

    x = torch.randint(0, 64, (2, 12))
    torch._dynamo.reset()
    model = GatedLM(ModelRecipe(variant=name, size="micro", lm={"n_layers": 1}).build(64, 32, 0))
    ref = model(x)
    out = torch.compile(model, backend="eager", fullgraph=True)(x)
    out.float().square().mean().backward()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
