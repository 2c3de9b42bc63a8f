"""The Python API's checks at its boundary: what ``Attention.forward``, a reused ``KVCache``,
``GatedLM.generate`` and ``from_pretrained``'s ``map_location`` get that they cannot use is
a ``GatedAttnError`` naming the argument and what is allowed, before any tensor work (an
assignment to a frozen config: ``infra.errors.refuse_assignment``).

The forward checks are on the hot path: a few comparisons of shapes and dtypes (Python
attributes, nothing that reads a tensor's values or synchronises a device).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gatedattn.infra.errors import GatedAttnError
from gatedattn.layers.cache import KVCache

ACTIVATION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ID_DTYPES = (torch.int64, torch.int32)


def _dtype(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def check_attention_input(cfg: Any, x: Any, positions: Any, cache: Any, weight_dtype: torch.dtype) -> None:
    """``x`` (B, T, d_model) floating, B and T at least 1; ``positions`` integer (T,) or
    (B or 1, T); ``cache`` a ``KVCache`` of this layer's shape, batch and dtype (or another
    object with its interface: ``length``, ``update``)."""
    _check_x(cfg, x, weight_dtype)
    if positions is not None:
        _check_positions(positions, x.shape[0], x.shape[1], tuple(x.shape))
    if cache is not None:
        if isinstance(cache, KVCache):
            check_cache(cfg, cache, x.shape[0], x.dtype)
        elif not (hasattr(cache, "length") and hasattr(cache, "update")):
            raise GatedAttnError(f"Attention.forward: cache is {type(cache).__name__}; allowed: a KVCache or None")


def _check_x(cfg: Any, x: Any, weight_dtype: torch.dtype) -> None:
    if not isinstance(x, torch.Tensor):
        raise GatedAttnError(f"Attention.forward: x must be a torch.Tensor of shape (B, T, {cfg.d_model}), "
                             f"got {type(x).__name__}")
    if x.dim() != 3 or x.shape[-1] != cfg.d_model:
        raise GatedAttnError(f"Attention.forward: x has shape {tuple(x.shape)}; allowed: (B, T, d_model={cfg.d_model})")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise GatedAttnError(f"Attention.forward: x has shape {tuple(x.shape)}; B and T must be at least 1")
    if x.dtype != weight_dtype and not (_autocasting() and x.dtype in ACTIVATION_DTYPES):
        allowed = ", ".join(dict.fromkeys(_dtype(d) for d in (weight_dtype, *ACTIVATION_DTYPES)))
        raise GatedAttnError(f"Attention.forward: x has dtype {_dtype(x.dtype)} and the layer's weights "
                             f"{_dtype(weight_dtype)}; allowed: {_dtype(weight_dtype)} (or, under torch.autocast, "
                             f"{allowed}): cast x or the layer")


def _check_positions(positions: Any, B: int, T: int, shape: tuple) -> None:
    if not isinstance(positions, torch.Tensor) or positions.dtype.is_floating_point \
            or positions.dtype.is_complex or positions.dtype == torch.bool:
        kind = _dtype(positions.dtype) if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise GatedAttnError(f"Attention.forward: positions is {kind}; allowed: an integer tensor (T,) or (B, T)")
    if positions.dim() not in (1, 2) or positions.shape[-1] != T or (
            positions.dim() == 2 and positions.shape[0] not in (1, B)):
        allowed = " or ".join(dict.fromkeys((f"({T},)", f"(1, {T})", f"({B}, {T})")))
        raise GatedAttnError(f"Attention.forward: positions has shape {tuple(positions.shape)}; allowed: "
                             f"{allowed} for x of shape {shape}")


def _autocasting() -> bool:
    """Whether an autocast region is active on the CPU or CUDA (then a cache holds the
    autocast dtype while the residual stream stays float32)."""
    return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")


def check_cache(cfg: Any, cache: Any, batch: int, dtype: torch.dtype) -> None:
    """A ``KVCache`` that already holds positions is reused only with the batch size, dtype
    and layer shape it was filled with (a cache of another layer or model is refused)."""
    held = cache.latent if cache.latent is not None else cache.k
    if held is None:
        return
    if held.shape[0] != batch:
        raise GatedAttnError(f"cache holds a batch of {held.shape[0]} sequences, this call has {batch}; allowed: "
                             f"the batch it was filled with (make a new cache with new_cache())")
    if held.dtype != dtype and not _autocasting():
        raise GatedAttnError(f"cache holds {_dtype(held.dtype)} tensors, this call's x is {_dtype(dtype)}; allowed: "
                             f"the dtype it was filled with (make a new cache)")
    if cfg.kv == "mla":
        rank = cfg.mla.kv_rank if cfg.mla is not None else None
        ok = (cache.latent is not None and (rank is None or cache.latent.shape[-1] == rank)
              or cache.latent is None and cache.k is not None and cache.k.shape[1] == cfg.n_heads)
    else:
        ok = cache.latent is None and cache.k is not None and cache.k.shape[1] == cfg.n_kv_heads \
            and cache.k.shape[-1] == cfg.qk_dim
    if not ok:
        shape = tuple(held.shape)
        raise GatedAttnError(f"cache holds tensors of shape {shape}, not of this layer (kv={cfg.kv!r}, "
                             f"n_kv_heads={cfg.n_kv_heads}, head_dim={cfg.head_dim}); allowed: a cache this "
                             f"layer filled (make a new cache with new_cache())")


def check_generate_args(ids: Any, max_new_tokens: Any, temperature: Any, top_k: Any) -> None:
    """``generate``'s arguments: ids an integer tensor (B, T) with B, T >= 1, a count of new
    tokens >= 0, a finite temperature >= 0, ``top_k`` None or >= 1."""
    if not isinstance(ids, torch.Tensor) or ids.dtype not in ID_DTYPES:
        kind = _dtype(ids.dtype) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise GatedAttnError(f"generate: ids is {kind}; allowed: an int64 or int32 tensor of token ids (B, T)")
    if ids.dim() != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
        raise GatedAttnError(f"generate: ids has shape {tuple(ids.shape)}; allowed: (B, T) with B and T at least 1 "
                             f"(an empty prompt has nothing to continue: start it with a BOS id)")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise GatedAttnError(f"generate: max_new_tokens={max_new_tokens!r}; allowed: an integer >= 0")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature < 0:
        raise GatedAttnError(f"generate: temperature={temperature!r}; allowed: 0 (greedy) or a finite number > 0")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise GatedAttnError(f"generate: top_k={top_k!r}; allowed: None or an integer >= 1")


def check_map_location(map_location: Any) -> torch.device:
    """A device that can hold weights and exists here: cpu, cuda[:N] (with a GPU), mps (on a Mac)."""
    try:
        device = torch.device(map_location)
    except (RuntimeError, TypeError):
        raise GatedAttnError(f"map_location={map_location!r} is not a device; allowed: 'cpu', 'cuda', 'cuda:N', "
                             f"'mps'") from None
    if device.type == "cpu":
        return device
    if device.type == "cuda" and torch.cuda.is_available() and (device.index is None
                                                                or device.index < torch.cuda.device_count()):
        return device
    if device.type == "mps" and getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return device
    why = "holds no data" if device.type == "meta" else "is not available here"
    raise GatedAttnError(f"map_location={map_location!r}: {device} {why}; allowed: 'cpu'"
                         + (", 'cuda' or 'cuda:N'" if torch.cuda.is_available() else ""))
