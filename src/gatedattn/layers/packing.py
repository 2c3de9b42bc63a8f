"""One product for several projections of one input, where their weights already lie
side by side in memory.

A layer's q, k and v projections (and a SwiGLU's gate and up projections) read the same
input. Computed as one matrix product over the stacked weights they cost one call and one
pass over the input instead of three (or two); in bf16 on a CPU with AMX that is about a
third less time for q/k/v at 1,024 positions, and fewer calls per decoding step.

Stacking the weights on every call would copy them, which costs more than it saves when
decoding reads each weight once per step. So the stacked product runs only where the
weights already are one tensor: ``models.casts.FrozenCasts`` lays out the casts of each
group of a module's :attr:`PACKED` projections as row blocks of one buffer. Everywhere
else (separate parameters, training, an adapter or a hook on a projection) the modules
are called one by one, as before. :func:`concat_linear` is the other form, for training:
the weights concatenated on every call, which autograd differentiates (an X-gate computed in
the query projection's product). :func:`plain_linear` says when a module's weight alone
says what it computes.

:func:`linear` is the product every fast path here runs (and ``apply_linear`` for a single
module): ``F.linear``, except for the few rows of a decoding step in bf16 on a CPU, which
run with the weight as the left operand.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gatedattn.ops.gate import _compute_dtype


def hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def plain_linear(module: nn.Module | None) -> bool:
    """An unwrapped, unhooked ``nn.Linear``, whose weight alone says what it computes (a
    fused path may then read the weight instead of calling the module; an adapter such as
    a LoRA layer wrapping it, or a hook, needs the module called)."""
    return type(module) is nn.Linear and not hooked(module)


FEW_ROWS = 256  # products of 2..FEW_ROWS input rows (decoding steps) run as W @ x^T in bf16 on a CPU


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``. A bf16 product of 2 to :data:`FEW_ROWS` rows on a CPU,
    with no gradient asked, runs as ``(weight @ x^T)^T`` instead: oneDNN then streams the
    weight as it lies rather than as the transposed operand of ``x @ weight^T``, which is
    faster for decoding-sized products (``docs/benchmarks/real-model.md``); at one row, from
    about 512 rows and in float32 the plain form is as fast or faster. The output is
    contiguous, as ``F.linear``'s."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if (1 < rows <= FEW_ROWS and x.device.type == "cpu" and _compute_dtype(x) == torch.bfloat16
            and not torch.compiler.is_compiling() and not _needs_grad(x, weight, bias)):
        x_KM = x.reshape(rows, x.shape[-1]).t()
        out_NM = torch.mm(weight, x_KM) if bias is None else torch.addmm(bias[:, None], weight, x_KM)
        return out_NM.t().contiguous().view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


def apply_linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``, through :func:`linear` where the module is a :func:`plain_linear`."""
    return linear(x, module.weight, module.bias) if plain_linear(module) else module(x)


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def concat_linear(x: torch.Tensor, first: nn.Linear, second: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """``first(x), second(x)`` as one matmul over their weights concatenated on this call
    (a copy, which autograd differentiates: the training path of an X-gate packed with q)."""
    weight = torch.cat((first.weight, second.weight))
    bias = None
    if first.bias is not None or second.bias is not None:
        bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features)
                          for m in (first, second)])
    return F.linear(x, weight, bias).split((first.out_features, second.out_features), dim=-1)


def stacked_weight(modules: Sequence[nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The weights of ``modules`` stacked by rows, and their biases, as one weight and one
    bias, when the weight exists without a copy; else None.

    That is when every module is a plain ``nn.Linear`` that no hook watches, all with
    biases or none, and their weights are contiguous matrices of one input width, dtype and
    device that lie one after another in one storage, and no gradient is asked of them
    (gradients off, or none of them requires one: the stacked view is not the parameters
    autograd knows)."""
    if torch.compiler.is_compiling():
        return None  # (data pointers are not traced; a compiled model's products are the compiler's)
    if len(modules) < 2 or not _adjacent(modules[0].weight, modules[1].weight):
        return None  # (the common case, separate parameters, refused first and cheaply: decoding calls this per layer)
    if not all(plain_linear(m) for m in modules):
        return None
    weights = [m.weight for m in modules]
    if _needs_grad(*weights):
        return None
    biases = [m.bias for m in modules]
    if any(b is None for b in biases) and not all(b is None for b in biases):
        return None
    if not _consecutive(weights):
        return None
    first = weights[0]
    weight = first.as_strided((sum(w.shape[0] for w in weights), first.shape[1]), (first.shape[1], 1))
    return weight, None if biases[0] is None else torch.cat(biases)


def _adjacent(before: torch.Tensor, after: torch.Tensor) -> bool:
    """``after``'s data starts where ``before``'s ends."""
    return after.data_ptr() == before.data_ptr() + before.numel() * before.element_size()


def _consecutive(weights: Sequence[torch.Tensor]) -> bool:
    """Contiguous matrices of one input width, dtype and device, each starting where the one
    before ends, in one storage: their stack by rows, laid out in memory already."""
    first = weights[0]
    if any(w.dtype != first.dtype or w.device != first.device or w.dim() != 2 or w.shape[1] != first.shape[1]
           or not w.is_contiguous() for w in weights):
        return False
    storage = first.untyped_storage().data_ptr()
    return all(after.untyped_storage().data_ptr() == storage and _adjacent(before, after)
               for before, after in zip(weights, weights[1:]))


def packed_linear(x: torch.Tensor, modules: Sequence[nn.Module]) -> list[torch.Tensor] | None:
    """``[m(x) for m in modules]`` as one product (views of its output), where
    :func:`stacked_weight` finds the stacked weight; else None (call the modules)."""
    stacked = stacked_weight(modules)
    if stacked is None:
        return None
    weight, bias = stacked
    return list(linear(x, weight, bias).split([m.out_features for m in modules], dim=-1))


def stack_rows(tensors: Sequence[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """``[t.to(dtype) for t in tensors]`` as consecutive row blocks of one new tensor (the
    layout :func:`stacked_weight` recognises); each returned tensor is a view of it."""
    buffer = torch.cat([t.detach().to(dtype) for t in tensors])
    return list(buffer.split([t.shape[0] for t in tensors]))
