"""Weights cast once for many calls: what autocast casts on every call, kept between them.

Under bf16 autocast every ``nn.Linear`` casts its float32 weight to bf16 before the
product. Autocast keeps a cast only for one ``with`` block and only for weights that
require gradients, so a model that is analysed batch after batch, or a frozen model that
decodes token after token, casts all its matrices again on every call: on a CPU with
AMX bf16 products, those casts cost about a sixth of SmolLM2-135M's analysis forward.

``FrozenCasts(model)`` is called like the model. Where autocast is on with a dtype other
than the weights', it runs the model with every ``nn.Linear`` weight that this call will
not train (gradients off, or the weight frozen) replaced by its cast, made once and made
again only when a weight changes (its version counter moves); ``with
FrozenCasts(model).applied() as m:`` keeps them in place for a loop of calls (decoding
swaps them once, not at every step). The casts of a group of projections of one input (a
layer's q/k/v, a SwiGLU's gate and up: the modules' ``PACKED``) are laid out stacked in one
tensor, so that the group runs as one product (``layers.packing``). Autocast casts a tensor
already in its dtype to itself, so every product sees the same bf16 numbers: where nothing
is stacked the outputs are bit-identical to the model's own call, and a stacked product
may round its sums to bf16 differently (the logits then differ at bf16 rounding).
Embeddings, norms and biases keep their dtype (autocast does not cast an embedding lookup:
a bf16 table would change the residual stream's dtype). Without autocast it is the model's
own call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from gatedattn.layers.packing import stack_rows


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def _packed_groups(model: nn.Module) -> list[tuple[str, ...]]:
    """The weight names of every group of projections a module declares it may run as one
    product (its ``PACKED``: ``layers.packing``), where each is a plain ``nn.Linear``."""
    groups = []
    for prefix, module in model.named_modules():
        for group in getattr(module, "PACKED", ()):
            members = [getattr(module, name, None) for name in group]
            if all(type(m) is nn.Linear for m in members):
                groups.append(tuple(f"{prefix}.{name}.weight" if prefix else f"{name}.weight" for name in group))
    return groups


class FrozenCasts:
    """``model`` called with its untrained linear weights cast once per autocast dtype."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._modules = {f"{name}.weight": m for name, m in model.named_modules()
                         if isinstance(m, nn.Linear) and isinstance(m.weight, nn.Parameter)}
        self._groups = [g for g in _packed_groups(model) if all(n in self._modules for n in g)]
        self._cached: tuple[tuple, dict[str, torch.Tensor]] | None = None  # (key, casts): one set at a time

    def casts(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The cast of every weight this call will not train (made again where one changed);
        the casts of a group of projections that may run as one product (a layer's q/k/v, a
        SwiGLU's gate and up) lie stacked in one tensor (``layers.packing``)."""
        grad = torch.is_grad_enabled()
        chosen = {n: m.weight for n, m in self._modules.items()
                  if m.weight.dtype != dtype and (not grad or not m.weight.requires_grad)}
        key = (dtype, tuple((n, w._version) for n, w in chosen.items()))
        if self._cached is None or self._cached[0] != key:
            self._cached = None  # the old casts' memory first
            casts: dict[str, torch.Tensor] = {}
            with torch.no_grad():
                for group in self._groups:
                    if all(n in chosen for n in group):
                        casts.update(zip(group, stack_rows([chosen[n] for n in group], dtype)))
                casts.update({n: w.detach().to(dtype) for n, w in chosen.items() if n not in casts})
            self._cached = (key, casts)
        return self._cached[1]

    @contextlib.contextmanager
    def applied(self) -> Iterator[nn.Module]:
        """The model, with the casts of the autocast dtype in place of its weights for the
        body (its own weights back after, also after an error); the model itself where
        autocast is off or casts nothing. Under ``with`` for a loop of calls (decoding),
        the weights are swapped once, not at every call."""
        first = next(self.model.parameters(), None)
        dtype = _autocast_dtype(first.device.type) if first is not None else None
        casts = self.casts(dtype) if dtype is not None else {}
        saved = []
        try:
            for name, cast in casts.items():
                module = self._modules[name]
                saved.append((module, module._parameters["weight"]))
                module._parameters["weight"] = cast
            yield self.model
        finally:
            for module, weight in reversed(saved):
                module._parameters["weight"] = weight

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.applied() as model:
            return model(*args, **kwargs)
