"""Window attention with the first position kept, dropped or left as it is.

StreamingLLM's setting: each query sees only its last ``window`` keys; the first position
(the model's attention sink) is either added to every query's view (``first="keep"``),
hidden from every query but itself (``first="drop"``), or treated like any key
(``first="free"``). ``window=0`` is full causal attention, so ``first="drop"`` with
``window=0`` asks what the model loses when nothing may attend to position 0.

An optional learnable sink (a per-head logit ``b_h``, a key of value zero) joins the
softmax as in :func:`gatedattn.ops.reference.attention_reference`. The probabilities are
explicit (B, H, Tq, Tk): this is the reference form, for the analyses and studies that ask
for masks the fused kernels do not take.
"""

from __future__ import annotations

import math

import torch

FIRST_MODES = ("free", "keep", "drop")


def window_mask(tq: int, tk: int, q_offset: int, window: int, first: str, device: torch.device) -> torch.Tensor:
    """Boolean (Tq, Tk): True where query ``q_offset + i`` may see key ``j``."""
    if first not in FIRST_MODES:
        raise ValueError(f"first must be one of {', '.join(FIRST_MODES)}, got {first!r}")
    if window < 0:
        raise ValueError(f"window must be >= 0 (0: full causal attention), got {window}")
    q_pos = torch.arange(tq, device=device)[:, None] + q_offset
    k_pos = torch.arange(tk, device=device)[None, :]
    mask = k_pos <= q_pos
    if window:
        mask = mask & (q_pos - k_pos < window)
    if first == "keep":
        mask = mask | (k_pos == 0)
    elif first == "drop":
        mask = mask & ((k_pos != 0) | (q_pos == 0))  # position 0 still sees itself
    return mask


def window_probs(q: torch.Tensor, k: torch.Tensor, sink: torch.Tensor | None = None, *, window: int = 0,
                 first: str = "free", q_offset: int = 0, scale: float | None = None) -> torch.Tensor:
    """Attention probabilities (B, H, Tq, Tk) in float32 under :func:`window_mask`; rows sum
    to ``1 - p_sink`` with a sink. ``q`` (B, H, Tq, D), ``k`` (B, Hkv, Tk, D)."""
    n_heads, n_kv = q.shape[1], k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k = k.repeat_interleave(n_heads // n_kv, dim=1)  # (B, H, Tk, D)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale  # (B, H, Tq, Tk)
    mask = window_mask(q.shape[2], k.shape[2], q_offset, window, first, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sink is None:
        return torch.softmax(scores, dim=-1)
    sink_col = sink.float().view(1, n_heads, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat((scores, sink_col), dim=-1), dim=-1)[..., :-1]


def attention_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor | None = None, *,
                     window: int = 0, first: str = "free", q_offset: int = 0,
                     scale: float | None = None) -> torch.Tensor:
    """Attention output (B, H, Tq, Dv) under :func:`window_mask`."""
    probs = window_probs(q, k, sink, window=window, first=first, q_offset=q_offset, scale=scale)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)  # (B, H, Tk, Dv)
    return (probs @ v.float()).to(q.dtype)
