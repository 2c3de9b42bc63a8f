"""Weights cast once for many calls: what autocast casts on every call, kept between them.

Under bf16 autocast every ``nn.Linear`` casts its float32 weight to bf16 before the
product. Autocast keeps a cast only for one ``with`` block and only for weights that
require gradients, so a model that is analysed batch after batch, or a frozen model that
decodes token after token, casts all its matrices again on every call: on a CPU with
AMX bf16 products, those casts cost about a sixth of SmolLM2-135M's analysis forward.

``FrozenCasts(model)`` is called like the model. Where autocast is on with a dtype other
than the weights', it runs the model with every ``nn.Linear`` weight that this call will
not train (gradients off, or the weight frozen) replaced by its cast, made once and made
again only when a weight changes (its version counter moves). Autocast casts a tensor
that is already in its dtype to itself, so the products see the same bf16 numbers and the
outputs are bit-identical to the model's own call. Embeddings, norms and biases keep their
dtype (autocast does not cast an embedding lookup: a bf16 table would change the
residual stream's dtype). Without autocast it is the model's own call.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.func import functional_call


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


class FrozenCasts:
    """``model`` called with its untrained linear weights cast once per autocast dtype."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._weights = [(f"{name}.weight", m.weight) for name, m in model.named_modules()
                         if isinstance(m, nn.Linear) and isinstance(m.weight, nn.Parameter)]
        self._cached: tuple[tuple, dict[str, torch.Tensor]] | None = None  # (key, casts): one set at a time

    def casts(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The cast of every weight this call will not train (made again where one changed)."""
        grad = torch.is_grad_enabled()
        chosen = [(n, w) for n, w in self._weights if w.dtype != dtype and (not grad or not w.requires_grad)]
        key = (dtype, tuple((n, w._version) for n, w in chosen))
        if self._cached is None or self._cached[0] != key:
            self._cached = None  # the old casts' memory first
            with torch.no_grad():
                self._cached = (key, {n: w.detach().to(dtype) for n, w in chosen})
        return self._cached[1]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        first = next(self.model.parameters(), None)
        dtype = _autocast_dtype(first.device.type) if first is not None else None
        if dtype is None:
            return self.model(*args, **kwargs)
        casts = self.casts(dtype)
        if not casts:
            return self.model(*args, **kwargs)
        return functional_call(self.model, casts, args, kwargs, tie_weights=False, strict=False)
