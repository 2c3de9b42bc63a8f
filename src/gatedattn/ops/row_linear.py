"""Products of one or two input rows as a multiply and a sum, for compiled decoding on a CPU.

A decoding step multiplies one row per sequence by every weight of the model, so it costs
what reading the weights from memory costs. oneDNN's product of one row streams a weight at
about half the memory's speed (12 of 26 GB/s on a 2-core EPYC, bf16, a 76,800 x 576
weight); the same product written as ``(x[..., None, :] * W).sum(-1)`` and compiled by
inductor is one vectorised loop over the weight that reads it at the memory's speed. From
four rows that loop reads the weight once per row and the product wins again, hence
:data:`MAX_ROWS`. Eagerly the multiply would write out a (rows, N, K) tensor, so the form
is only for a graph being compiled (:class:`RowProducts`, entered by
``models.decode.static_step`` while it is traced). ``F.linear`` is the reference.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gatedattn.ops.gate import _compute_dtype

MAX_ROWS = 2  # products of at most this many input rows take the multiply-and-sum form


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` as a sum over the input width of float32 products, the
    output in the dtype the product runs in (autocast's where it is on, as ``F.linear``)."""
    dtype = _compute_dtype(x)
    out = (x.to(dtype).float().unsqueeze(-2) * weight.to(dtype).float()).sum(-1).to(dtype)
    return out if bias is None else out + bias.to(dtype)


def takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether :func:`row_linear` serves this product: at most :data:`MAX_ROWS` rows on a
    CPU, no gradient asked (the form is for decoding)."""
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    return 1 <= rows <= MAX_ROWS and x.device.type == "cpu" and weight.dim() == 2 and not grad


class RowProducts(TorchFunctionMode):
    """Within the ``with``: every ``F.linear`` (``nn.Linear`` and the modules wrapping one
    included) that :func:`takes` serves runs as :func:`row_linear`; the rest as it is."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            if takes(x, weight, bias):
                return row_linear(x, weight, bias)
        return func(*args, **kwargs)
