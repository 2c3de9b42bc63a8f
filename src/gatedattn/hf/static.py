"""The HF wrapper's decoding step under ``torch.compile`` over transformers' static cache.

``generate(cache_implementation="static", compile_config=...)`` compiles the wrapper's
forward and calls it once per new token with a 4-D boolean mask (batch, 1, 1, cache length)
and a ``StaticCache``, whose layers keep the positions they have written as a tensor. The
eager path reads that count as a number and checks the mask's pattern; in a compiled step
both would stop the graph at every token. Here, as in ``models.decode``, the step reads no
number: each layer's keys and values go where the cache puts them and also into the
cache's last column, where the query stands for the causal rule (``length`` is the cache's
length less one), and the key mask is the mask's row without the query's own column (which
the query already sees at the last one). The last column is written again, for good, when
decoding reaches it.
"""

from __future__ import annotations

from typing import Any

import torch


class LatentAsKeys:
    """MLA through a transformers cache: the latent (B, T, r) and the shared RoPE key
    (B, T, 1, d) stored as one-head keys and values (``update``)."""

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def update_latent(self, latent: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        latent_all, k_rope_all = self.update(latent[:, None], k_rope.transpose(1, 2))
        return latent_all[:, 0], k_rope_all.transpose(1, 2)


class StaticLayerCache(LatentAsKeys):
    """One layer of a compileable transformers cache with the ``KVCache`` interface, for one
    query per row."""

    def __init__(self, cache: Any, layer_idx: int, capacity: int) -> None:
        self.cache, self.layer_idx, self.capacity = cache, layer_idx, capacity

    @property
    def length(self) -> int:
        return self.capacity - 1

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.cache.update(k, v, self.layer_idx)
        keys[:, :, -1:] = k.to(keys.dtype)
        values[:, :, -1:] = v.to(values.dtype)
        return keys, values


def takes_static_step(cache: Any, mask: Any, tokens: int) -> bool:
    """Whether this call is a compiled decoding step over a static cache that
    :func:`static_step_inputs` serves: one new token per row and the 4-D mask of the cache's length."""
    return (torch.compiler.is_compiling() and cache is not None and getattr(cache, "is_compileable", False)
            and tokens == 1 and isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[2] == 1)


def static_step_inputs(cache: Any, mask: torch.Tensor, position_ids: torch.Tensor | None,
                layers: int) -> tuple[list[StaticLayerCache], torch.Tensor, torch.Tensor]:
    """The layers' caches, the (batch, cache length) key mask and the positions (batch, 1)
    of a compiled decoding step (see the module's docstring)."""
    allowed = mask[:, 0, -1] if mask.dtype == torch.bool else mask[:, 0, -1] == 0  # (B, L)
    columns = torch.arange(allowed.shape[-1], device=allowed.device)
    own = (allowed.long() * columns).amax(-1, keepdim=True)  # the query's column: the last one it may see
    if position_ids is None:
        position_ids = allowed.long().sum(-1, keepdim=True) - 1  # its count of earlier tokens
    caches = [StaticLayerCache(cache, i, allowed.shape[-1]) for i in range(layers)]
    return caches, allowed & (columns != own), position_ids
