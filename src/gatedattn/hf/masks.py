"""The 4-D attention masks transformers builds for its caches, read back as padding masks.

With a static cache, ``generate`` turns the 2-D padding mask into a 4-D one (batch, 1,
queries, cache length): boolean (True = may attend) or additive float (0 = may attend).
A ``GatedLM`` takes padding masks only, so ``padding_mask_of(mask, past, new)`` returns
the (batch, past + new) padding mask that the 4-D one is causal attention plus; a mask of
any other pattern (a custom attention pattern) is refused. Rows of padding queries are
not compared: their outputs are never read, and transformers fills them in its own ways.
"""

from __future__ import annotations

import torch

from gatedattn.infra.errors import GatedAttnError

WHAT = "GatedAttnForCausalLM takes a 2-D attention_mask (batch, past + new tokens; 1 = token, 0 = padding)"


def padding_mask_of(mask: torch.Tensor, batch: int, past: int, new: int) -> torch.Tensor:
    """The boolean (batch, past + new) padding mask of a 4-D causal-plus-padding mask."""
    keys = past + new
    if mask.dim() != 4 or mask.shape[0] != batch or mask.shape[1] != 1 or mask.shape[2] != new \
            or mask.shape[3] < keys:
        raise GatedAttnError(f"{WHAT} or a 4-D causal-plus-padding one of shape (batch={batch}, 1, new={new}, "
                             f">= past + new={keys}), got shape {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        allowed = mask[:, 0]  # (B, new, K)
    else:  # additive: 0 to attend, the dtype's minimum (or -inf) to hide; anything else is a bias
        allowed = mask[:, 0] == 0
        if not mask.dtype.is_floating_point or not bool((allowed | (mask[:, 0] <= torch.finfo(mask.dtype).min / 2)).all()):
            raise GatedAttnError(f"{WHAT} or a 4-D causal-plus-padding one (boolean, or additive with 0 and "
                                 f"-inf); this {mask.dtype} 4-D mask holds other values: custom attention masks "
                                 f"are not supported")
    padding = allowed[:, -1, :keys]  # the last query sees every earlier key that is a token
    q_pos = torch.arange(past, keys, device=mask.device)[:, None]
    k_pos = torch.arange(allowed.shape[-1], device=mask.device)[None, :]
    wanted = (k_pos <= q_pos)[None] & torch.nn.functional.pad(padding, (0, allowed.shape[-1] - keys))[:, None, :]
    real_query = padding[:, past:]  # (B, new)
    if not bool(((wanted == allowed) | ~real_query[..., None]).all()):
        raise GatedAttnError(f"{WHAT} or a 4-D one that is causal attention plus padding; this 4-D mask has "
                             f"another pattern: custom attention masks are not supported")
    return padding
