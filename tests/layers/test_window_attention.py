"""Window attention with the first position kept / dropped (gatedattn.ops.window, WindowCore):
the vectorised form against a per-query softmax written out, forward and backward."""

import math

import pytest
import torch

from gatedattn import GatedLM, ModelConfig
from gatedattn.layers.core import WindowCore
from gatedattn.ops.sdpa import attention_flash_masked
from gatedattn.ops.window import attention_window, attention_window_reference, window_mask


def _per_query(q, k, v, sink, window, first, scale):
    """Each query's visible keys listed by hand, one softmax per query (the specification)."""
    B, H, T, D = q.shape
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    v = v.repeat_interleave(H // v.shape[1], dim=1)
    out = torch.zeros(B, H, T, v.shape[-1], dtype=torch.float64)
    for i in range(T):
        keys = [j for j in range(i + 1) if not window or i - j < window]
        if first == "keep" and 0 not in keys:
            keys = [0] + keys
        if first == "drop" and i > 0:
            keys = [j for j in keys if j != 0]
        s = torch.einsum("bhd,bhkd->bhk", q[:, :, i].double(), k[:, :, keys].double()) * scale
        if sink is not None:
            s = torch.cat([s, sink.double().view(1, H, 1).expand(B, H, 1)], -1)
        p = torch.softmax(s, -1)[..., :len(keys)]
        out[:, :, i] = torch.einsum("bhk,bhkd->bhd", p, v[:, :, keys].double())
    return out


def test_window_mask_reads_as_documented():
    m = window_mask(5, 5, 0, 2, "free", torch.device("cpu"))
    assert m[4].tolist() == [False, False, False, True, True] and m[0].tolist() == [True] + [False] * 4
    keep = window_mask(5, 5, 0, 2, "keep", torch.device("cpu"))
    assert keep[4].tolist() == [True, False, False, True, True]
    drop = window_mask(5, 5, 0, 0, "drop", torch.device("cpu"))
    assert drop[0, 0] and not drop[1:, 0].any() and drop[4, 1:].all()
    with pytest.raises(ValueError, match="first must be one of free, keep, drop"):
        window_mask(3, 3, 0, 0, "both", torch.device("cpu"))


@pytest.mark.parametrize("first", ["free", "keep", "drop"])
@pytest.mark.parametrize("window", [0, 1, 3])
@pytest.mark.parametrize("with_sink", [False, True])
def test_attention_window_equals_a_per_query_softmax_forward_and_backward(first, window, with_sink):
    torch.manual_seed(0)
    B, H, Hkv, T, D = 2, 4, 2, 7, 8
    q = torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, Hkv, T, D, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, Hkv, T, D, dtype=torch.float64, requires_grad=True)
    sink = torch.randn(H, dtype=torch.float64, requires_grad=True) if with_sink else None
    scale = 1 / math.sqrt(D)
    fast = attention_window(q, k, v, sink, window=window, first=first, scale=scale)
    ref = _per_query(q, k, v, sink, window, first, scale)
    assert torch.allclose(fast.double(), ref, atol=1e-5)
    w = torch.randn_like(ref)
    inputs = [t for t in (q, k, v, sink) if t is not None]
    g_fast = torch.autograd.grad((fast.double() * w).sum(), inputs)
    g_ref = torch.autograd.grad((ref * w).sum(), inputs)
    for a, b in zip(g_fast, g_ref):
        assert torch.allclose(a, b, atol=1e-5)
    assert not torch.allclose(ref, _per_query(q, k, v, sink, window + 2, "keep" if first != "keep" else "drop",
                                              scale), atol=1e-3)  # the cases differ: the comparison is not degenerate


def test_window_core_with_full_causal_attention_is_the_model():
    torch.manual_seed(0)
    model = GatedLM(ModelConfig.from_preset("micro", "gated", vocab_size=50)).eval()
    ids = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        plain = model(ids)
        cores = [b.attn.with_core(WindowCore(0, "free")) for b in model.blocks]
        for c in cores:
            c.__enter__()
        try:
            windowed = model(ids)
        finally:
            for c in cores:
                c.__exit__(None, None, None)
    assert torch.allclose(plain, windowed, atol=1e-5)


def test_window_core_refuses_bad_arguments():
    for bad in (-1, 2**70, 1.5, True):  # 2**70 would overflow inside the mask
        with pytest.raises(ValueError, match=r"window must be an int in \[0, 2\*\*62\)"):
            WindowCore(bad)
    with pytest.raises(ValueError, match="first must be one of"):
        WindowCore(4, "left")


@pytest.mark.parametrize("first", ["free", "keep", "drop"])
@pytest.mark.parametrize("window", [0, 2, 5])
@pytest.mark.parametrize("with_sink", [False, True])
def test_attention_window_after_a_cached_prefix_is_the_last_rows_of_the_whole(first, window, with_sink):
    """Queries after a prefix (q_offset > 0, as in decoding) see what the same rows see in
    the whole sequence, on whichever path (fused, blocks, probabilities) each call takes."""
    torch.manual_seed(1)
    B, H, Hkv, T, D = 1, 4, 2, 23, 8
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, Hkv, T, D), torch.randn(B, Hkv, T, D)
    sink = torch.randn(H) if with_sink else None
    whole = attention_window(q, k, v, sink, window=window, first=first)
    for tail in (1, 4, 13):
        part = attention_window(q[:, :, -tail:], k, v, sink, window=window, first=first, q_offset=T - tail)
        assert torch.allclose(part, whole[:, :, -tail:], atol=1e-5), tail


@pytest.mark.parametrize("first", ["free", "keep", "drop"])
def test_blocks_equal_the_probabilities_written_out_on_a_long_sequence(first):
    """Blocks of W queries (a ragged last block, the first position kept in every block or
    dropped from the first) against the reference, forward and backward."""
    torch.manual_seed(2)
    B, H, Hkv, T, D, W = 2, 4, 1, 61, 8, 7
    q = torch.randn(B, H, T, D, requires_grad=True)
    k = torch.randn(B, Hkv, T, D, requires_grad=True)
    v = torch.randn(B, Hkv, T, D, requires_grad=True)
    sink = torch.randn(H, requires_grad=True)
    fast = attention_window(q, k, v, sink, window=W, first=first)
    ref = attention_window_reference(q, k, v, sink, window=W, first=first)
    assert torch.allclose(fast, ref, atol=1e-5)
    w = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad((fast * w).sum(), (q, k, v, sink)),
                    torch.autograd.grad((ref * w).sum(), (q, k, v, sink))):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("first,window", [("free", 9), ("keep", 9), ("drop", 9), ("keep", 0), ("drop", 0)])
@pytest.mark.parametrize("with_sink", [False, True])
def test_a_window_on_the_fused_kernel_equals_the_probabilities_written_out(first, window, with_sink, monkeypatch):
    """A window at least half the keys (the real-model study's W 128 over 256 tokens) runs
    on the fused kernel with the window as its mask: forward and backward as the
    reference, with grouped KV heads and the sink. (Full attention with the first position
    free is the model's own kernel.)"""
    import gatedattn.ops.window as window_ops

    calls = []
    monkeypatch.setattr(window_ops, "attention_flash_masked",
                        lambda *a, **kw: calls.append(1) or attention_flash_masked(*a, **kw))
    torch.manual_seed(3)
    B, H, Hkv, T, D = 2, 6, 2, 18, 8
    q = torch.randn(B, H, T, D, requires_grad=True)
    k = torch.randn(B, Hkv, T, D, requires_grad=True)
    v = torch.randn(B, Hkv, T, D, requires_grad=True)
    sink = torch.randn(H, requires_grad=True) if with_sink else None
    fast = window_ops.attention_window(q, k, v, sink, window=window, first=first)
    assert calls, "the fused path was not taken"
    ref = attention_window_reference(q, k, v, sink, window=window, first=first)
    assert torch.allclose(fast, ref, atol=1e-5)
    w = torch.randn_like(ref)
    inputs = [t for t in (q, k, v, sink) if t is not None]
    for a, b in zip(torch.autograd.grad((fast * w).sum(), inputs), torch.autograd.grad((ref * w).sum(), inputs)):
        assert torch.allclose(a, b, atol=1e-5)


def test_the_fused_window_keeps_bf16_inputs_in_bf16():
    """Under bf16 the fused window computes in bf16, as the model's own attention does,
    within bf16 rounding of the float32 reference."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 4, 16, 8) for _ in range(3))
    sink = torch.randn(4)
    out = attention_window(q.bfloat16(), k.bfloat16(), v.bfloat16(), sink, window=8, first="drop")
    assert out.dtype == torch.bfloat16
    ref = attention_window_reference(q, k, v, sink, window=8, first="drop")
    assert torch.allclose(out.float(), ref, atol=3e-2)


def test_attention_flash_masked_refuses_what_it_cannot_serve():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="takes_any_mask"):
        attention_flash_masked(q, torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), None,
                               torch.ones(4, 6, dtype=torch.bool))
