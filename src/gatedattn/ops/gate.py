"""The G1 gate and the output projection as one autograd function (docs/design.md
section 3.1, "Gate and output projection in one function", gives the backward formulas).

``gated_linear(y, logits, W, b) = (y * sigmoid(logits)) @ W^T + b`` -- the paper's
multiplicative sigmoid gate on the SDPA output, followed by ``o_proj``. Written as
separate operations, autograd keeps the scores ``sigmoid(logits)`` and the gated product
``y * scores`` alive for the backward pass: two extra (B, T, H, D) tensors per layer. This
function keeps only ``y`` (which attention keeps anyway) and the logits, and recomputes
both in backward, where they cost one elementwise pass. ``logits`` may broadcast against
``y`` (headwise: (B, T, H, 1); head-shared: (B, T, 1, D); input-independent: (1, 1, H, D)).
``head_logits`` (B, T, H, 1), HyGA's cross-head C-gate, multiplies in a second sigmoid:
``y * sigmoid(logits) * sigmoid(head_logits)``.

``ops.reference.gated_linear`` is the plain specification; tests compare the two forward
and backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a matmul on ``t`` runs in here: the autocast dtype if autocast is on."""
    device_type = t.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return t.dtype


class _GatedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y_BTHD, logits, weight, bias, head_logits):
        dtype = _compute_dtype(y_BTHD)
        y, w = y_BTHD.to(dtype), weight.to(dtype)
        with torch.autocast(y.device.type, enabled=False):
            gated = y * _scores(logits.to(dtype), head_logits)
            out = F.linear(gated.flatten(-2), w, None if bias is None else bias.to(dtype))
        # A slice of a packed projection: keep only the slice alive. Under torch.compile the
        # graph's partitioner chooses what backward keeps, and the storage query would break
        # the graph (dynamo cannot trace it), leaving every gate to eager.
        if not torch.compiler.is_compiling() and \
                logits.untyped_storage().nbytes() > logits.numel() * logits.element_size():
            logits = logits.clone()
        ctx.save_for_backward(y, logits, w, head_logits)
        ctx.has_bias = bias is not None
        ctx.dtypes = (y_BTHD.dtype, logits.dtype, weight.dtype, None if head_logits is None else head_logits.dtype)
        return out

    @staticmethod
    def backward(ctx, dout_BTC):
        y, logits, w, head_logits = ctx.saved_tensors
        y_dtype, logits_dtype, weight_dtype, head_dtype = ctx.dtypes
        dout = dout_BTC.to(y.dtype)
        with torch.autocast(y.device.type, enabled=False):
            s = torch.sigmoid(logits.to(y.dtype))
            c = torch.sigmoid(head_logits.to(y.dtype)) if head_logits is not None else None
            scores = s if c is None else s * c
            gated = (y * scores).flatten(-2)  # recomputed: (B, T, H*D)
            dweight = dout.flatten(0, -2).T @ gated.flatten(0, -2)
            dbias = dout.flatten(0, -2).sum(0) if ctx.has_bias else None
            dgated = (dout @ w).view(y.shape)
            dy = dgated * scores
            dgated_y = dgated * y
            dlogits = (dgated_y * scores * (1 - s)).sum_to_size(logits.shape)
            dhead = None
            if c is not None:
                dhead = ((dgated_y * s).sum(-1, keepdim=True) * c * (1 - c)).sum_to_size(head_logits.shape)
        return (dy.to(y_dtype), dlogits.to(logits_dtype), dweight.to(weight_dtype),
                None if dbias is None else dbias.to(weight_dtype),
                None if dhead is None else dhead.to(head_dtype))


def _scores(logits: torch.Tensor, head_logits: torch.Tensor | None) -> torch.Tensor:
    s = torch.sigmoid(logits)
    return s if head_logits is None else s * torch.sigmoid(head_logits.to(s.dtype))


def gated_linear(y_BTHD: torch.Tensor, logits: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None = None, head_logits: torch.Tensor | None = None) -> torch.Tensor:
    """``(y * sigmoid(logits) [* sigmoid(head_logits)]).flatten(-2) @ weight.T + bias``:
    y (B, T, H, D) -> (B, T, C)."""
    return _GatedLinear.apply(y_BTHD, logits, weight, bias, head_logits)
