"""RMSNorm computed in float32 whatever the input dtype (as Qwen3/Llama do under bf16;
float64 inputs in float64).

``rms_norm`` is the fast path: the mean square of each row comes from one
``torch.linalg.vector_norm`` (a single fused reduction), then two products. ``F.rms_norm``,
kept as ``rms_norm_reference``, runs on a CPU as separate ``pow``, ``mean`` (a ``sum`` and a
division), ``add``, ``rsqrt`` and two products (``tests/layers/test_norm.py`` compares the
two, values and gradients).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm_reference(x: torch.Tensor, normalized_shape: tuple[int, ...], weight: torch.Tensor | None,
                       eps: float | None) -> torch.Tensor:
    """The specification: ``F.rms_norm`` in float32 (float64 for float64 inputs), returned in
    ``x``'s dtype."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    w = weight.to(dtype) if weight is not None else None
    return F.rms_norm(x.to(dtype), normalized_shape, w, eps).to(x.dtype)


def rms_norm(x: torch.Tensor, normalized_shape: tuple[int, ...], weight: torch.Tensor | None,
             eps: float | None) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the trailing ``normalized_shape`` dims, in
    float32 (float64 for float64 inputs), returned in ``x``'s dtype; ``eps`` None is the
    machine epsilon of that dtype (as ``F.rms_norm``)."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(dtype)
    dims = tuple(range(-len(normalized_shape), 0))
    count = math.prod(normalized_shape)
    eps = torch.finfo(dtype).eps if eps is None else eps
    mean_square = torch.linalg.vector_norm(xf, dim=dims, keepdim=True).square() / count
    y = xf * torch.rsqrt(mean_square + eps)
    if weight is not None:
        w = weight.to(dtype)
        y = y * w if torch.is_grad_enabled() and (y.requires_grad or w.requires_grad) else y.mul_(w)
    return y.to(x.dtype)


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` that normalises in float32 and returns the input dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, tuple(self.normalized_shape), self.weight, self.eps)
