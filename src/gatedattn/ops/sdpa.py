"""Fast attention cores.

``attention_sdpa`` calls ``F.scaled_dot_product_attention`` (any device, any backend).

``attention_flash_lse`` adds a learnable sink without a T x T matrix (docs/design.md section 3):
a fused kernel returns the output ``o`` and the log-sum-exp ``lse`` of each row; then
``o_sink = o * sigmoid(lse - b)``. Its backward is the fused kernel's backward run with
``o_sink`` and ``lse_total = logaddexp(lse, b)`` (the sink is a key whose value is zero),
and ``dL/db = -sum_rows p_sink * (dO . o_sink)`` with ``p_sink = sigmoid(b - lse)``.

Padding (``key_mask`` (B, Tk), False for padded keys; the rule is ``ops.reference``'s) is
an explicit boolean mask for ``F.scaled_dot_product_attention`` and an additive mask for
the CPU flash kernel, whose log-sum-exp then runs over the real keys only, as the sink
identity needs. Without ``key_mask`` every function runs exactly its unpadded code.

``attention_flash_masked`` runs any boolean mask (a window, the first position kept or
dropped) on the same kernel, the sink added the same way, where the kernel takes a mask
(``takes_any_mask``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gatedattn.ops.reference import attention_reference, causal_mask, check_key_mask, visible_keys


def grouped(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the keys have fewer heads than the queries (SDPA's ``enable_gqa``), as a
    Python bool also where the compiler traces the head counts symbolically (a branch on
    them settles it; ``bool()`` would leave a symbol that SDPA refuses)."""
    if q.shape[1] != k.shape[1]:
        return True
    return False


def attention_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sink: torch.Tensor | None = None,
    *,
    q_offset: int = 0,
    scale: float | None = None,
    key_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention through ``F.scaled_dot_product_attention``; no sink."""
    if sink is not None:
        raise ValueError("attention_sdpa has no sink; use attention_flash_lse")
    tq, tk = q.shape[2], k.shape[2]
    gqa = grouped(q, k)
    if key_mask is not None:
        check_key_mask(key_mask, k)
        mask = visible_keys(tq, tk, q_offset, key_mask)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    if q_offset == 0 and tq == tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    if tq == 1 and q_offset == tk - 1:
        # one decoding step: the query is the last position and sees every key, so no mask
        # is built (transformers' decoding passes none either; the kernel's output is the same)
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)
    # Queries after a cached prefix: the causal diagonal is shifted by q_offset.
    mask = causal_mask(tq, tk, q_offset, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


class _CPUFlash:
    """The CPU flash kernel: returns the log-sum-exp, its backward takes it back; it reads
    grouped KV heads (GQA) as they are."""

    grouped_kv = True
    takes_mask = True
    strided = True  # reads (B, H, T, D) views of (B, T, H, D) tensors; its output follows q's layout

    @staticmethod
    def forward(q, k, v, scale, mask=None):
        """``mask``: None (causal) or an additive (B, 1, T, T) mask in q's dtype."""
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, mask is None, attn_mask=mask, scale=scale)
        return o, lse, ()  # o (B, H, T, D) in q's dtype, lse (B, H, T) float32

    @staticmethod
    def backward(grad_o, q, k, v, o, lse, aux, scale, mask=None):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_o, q, k, v, o, lse, 0.0, mask is None, attn_mask=mask, scale=scale)


class _CUDAEfficient:
    """The CUDA memory-efficient kernel (fp32, fp16, bf16). Its log-sum-exp is (B, H, T')
    with T' >= T padded up to its block size; the rows past T are never read. KV heads
    are expanded for it (GQA). Padded batches take the reference path."""

    grouped_kv = False
    takes_mask = False
    strided = False

    @staticmethod
    def forward(q, k, v, scale):
        o, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, True, scale=scale)
        return o, lse, (seed, offset)

    @staticmethod
    def backward(grad_o, q, k, v, o, lse, aux, scale):
        seed, offset = aux
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            grad_o, q, k, v, None, o, lse, seed, offset, 0.0, [True, True, True, False], True, scale=scale)
        return dq, dk, dv


class _FlashSink(torch.autograd.Function):
    """Causal attention with a per-head sink on a fused kernel that returns the log-sum-exp
    (q: B, H, T, D; k, v: B, Hkv, T, D, Hkv = H unless the kernel reads grouped heads);
    ``mask`` None (causal) or an additive padding-and-causal mask for a kernel that takes one.

    It keeps for backward exactly what the kernel's own backward reads -- q, k, v, the
    output and one log-sum-exp -- as plain attention does: ``o_sink`` takes the place of
    ``o`` (written in the kernel output's memory layout, so that the layer's
    ``transpose(1, 2).reshape`` before ``o_proj`` stays a view and the projection saves the
    same storage), ``lse_total`` that of ``lse``, and ``p_sink = exp(b - lse_total)`` is
    recomputed in backward from them and the sink logits."""

    @staticmethod
    def forward(ctx, q, k, v, sink, scale, kernel, mask=None):
        o, lse, aux = kernel.forward(q, k, v, scale) if mask is None else kernel.forward(q, k, v, scale, mask)
        T = q.shape[2]
        b = sink.float().view(1, -1, 1)
        keep = torch.sigmoid(_rows(lse, T) - b)  # 1 - p_sink, (B, H, T)
        # in place on the kernel's fresh output: its (B, T, H, D) memory layout is kept, and
        # the product is taken in float32 and rounded once to o's dtype
        o_sink = o.mul_(keep[..., None])
        del o, keep
        lse_total = torch.logaddexp(lse, b.expand_as(lse))
        ctx.save_for_backward(q, k, v, o_sink, lse_total, sink, *aux)
        ctx.scale, ctx.kernel, ctx.mask = scale, kernel, mask
        return o_sink

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o_sink, lse_total, sink, *aux = ctx.saved_tensors
        grad_o = grad_o.contiguous()
        if ctx.mask is None:
            dq, dk, dv = ctx.kernel.backward(grad_o, q, k, v, o_sink, lse_total, aux, ctx.scale)
        else:
            dq, dk, dv = ctx.kernel.backward(grad_o, q, k, v, o_sink, lse_total, aux, ctx.scale, ctx.mask)
        p_sink = torch.exp(sink.float().view(1, -1, 1) - _rows(lse_total, q.shape[2]))  # sigmoid(b - lse), (B, H, T)
        d_sink = -(p_sink * (grad_o.float() * o_sink.float()).sum(-1)).sum(dim=(0, 2))  # (H,)
        return dq, dk, dv, d_sink.to(sink.dtype), None, None, None


def _rows(lse: torch.Tensor, T: int) -> torch.Tensor:
    """The first ``T`` rows of a log-sum-exp (B, H, T' >= T) that a kernel may pad."""
    return lse if lse.shape[-1] == T else lse[..., :T]


FUSED_LSE_KERNELS = {"cpu": _CPUFlash, "cuda": _CUDAEfficient}


def attention_flash_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sink: torch.Tensor | None = None,
    *,
    q_offset: int = 0,
    scale: float | None = None,
    key_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention with an optional per-head sink, using a fused kernel that returns
    the log-sum-exp (the CPU flash kernel, CUDA's memory-efficient kernel). Decoding after
    a cache prefix, other devices and padded batches on a kernel without a mask take the
    reference path (the score matrix of a few query rows is small)."""
    if sink is None:
        if key_mask is None:
            return attention_sdpa(q, k, v, q_offset=q_offset, scale=scale)
        return attention_sdpa(q, k, v, q_offset=q_offset, scale=scale, key_mask=key_mask)
    kernel = FUSED_LSE_KERNELS.get(q.device.type)
    if (kernel is None or q_offset != 0 or q.shape[2] != k.shape[2]
            or (key_mask is not None and not kernel.takes_mask)):
        if key_mask is None:
            return attention_reference(q, k, v, sink, q_offset=q_offset, scale=scale)
        return attention_reference(q, k, v, sink, q_offset=q_offset, scale=scale, key_mask=key_mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k.shape[1]
    if group > 1 and not kernel.grouped_kv:  # expand the KV heads for a kernel without GQA
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    dv = v.shape[-1]
    if dv != q.shape[-1]:  # the kernel needs equal head sizes (MLA): pad v with zeros
        v = F.pad(v, (0, q.shape[-1] - dv)) if dv < q.shape[-1] else v
        if dv > q.shape[-1]:
            pad = dv - q.shape[-1]
            q, k = F.pad(q, (0, pad)), F.pad(k, (0, pad))
    dtype = q.dtype
    if not q.dtype == k.dtype == v.dtype:
        dtype = torch.promote_types(q.dtype, torch.promote_types(k.dtype, v.dtype))
    q, k, v = (t.to(dtype) if kernel.strided else t.to(dtype).contiguous() for t in (q, k, v))
    if key_mask is None:
        out = _FlashSink.apply(q, k, v, sink, scale, kernel)
    else:
        check_key_mask(key_mask, k)
        visible = visible_keys(q.shape[2], k.shape[2], 0, key_mask)
        additive = torch.zeros(visible.shape, dtype=dtype, device=q.device).masked_fill_(~visible, float("-inf"))
        out = _FlashSink.apply(q, k, v, sink, scale, kernel, additive)
    return out if dv == out.shape[-1] else out[..., :dv]


def takes_any_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether :func:`attention_flash_masked` serves these inputs: a fused kernel on their
    device that takes a mask, queries and keys of one length (no cached prefix), equal
    head sizes."""
    kernel = FUSED_LSE_KERNELS.get(q.device.type)
    return (kernel is not None and kernel.takes_mask and q.shape[2] == k.shape[2]
            and q.shape[-1] == k.shape[-1] == v.shape[-1])


def attention_flash_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor | None,
                           visible: torch.Tensor, *, scale: float | None = None) -> torch.Tensor:
    """Attention (B, H, T, D) where ``visible`` (T, T), True where a query may see a key,
    allows, with an optional per-head sink, on the fused kernel with an additive mask
    (no probabilities written out). Every row must see at least one key. Only where
    :func:`takes_any_mask`; ``ops.window.attention_window_reference`` is the
    specification."""
    if not takes_any_mask(q, k, v):
        raise ValueError("attention_flash_masked needs a fused kernel that takes a mask, queries and keys of one "
                         "length and equal head sizes (see takes_any_mask)")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dtype = torch.promote_types(q.dtype, torch.promote_types(k.dtype, v.dtype))
    q, k, v = (t.to(dtype) for t in (q, k, v))
    if sink is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale,
                                              enable_gqa=grouped(q, k))
    kernel = FUSED_LSE_KERNELS[q.device.type]
    additive = torch.zeros(visible.shape, dtype=dtype, device=q.device).masked_fill_(~visible, float("-inf"))
    return _FlashSink.apply(q, k, v, sink, scale, kernel, additive[None, None])
