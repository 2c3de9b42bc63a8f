"""Window attention with the first position kept, dropped or left as it is.

StreamingLLM's setting: each query sees only its last ``window`` keys; the first position
(the model's attention sink) is either added to every query's view (``first="keep"``),
hidden from every query but itself (``first="drop"``), or treated like any key
(``first="free"``). ``window=0`` is full causal attention, so ``first="drop"`` with
``window=0`` asks what the model loses when nothing may attend to position 0.

An optional learnable sink (a per-head logit ``b_h``, a key of value zero) joins the
softmax as in :func:`gatedattn.ops.reference.attention_reference`.

:func:`window_probs` and :func:`attention_window_reference` write the probabilities out
(B, H, Tq, Tk): the specification, and what the analyses that read probabilities use.
:func:`attention_window` computes the same output without writing the probabilities
out: full causal attention with the first position free runs on the fused kernel
(:func:`gatedattn.ops.sdpa.attention_flash_lse`); a window much shorter than the keys runs
block by block of ``window`` queries, each over the ``2 · window`` keys it can see (plus the
first position where it is kept): over 4,096 tokens at W 128, a sixteenth of the scores;
any other window runs on the fused kernel with the window as its mask
(:func:`gatedattn.ops.sdpa.attention_flash_masked`) where the device has one, in the
inputs' dtype (bf16 under autocast, as the model's own attention).
"""

from __future__ import annotations

import math

import torch

from gatedattn.ops.sdpa import attention_flash_lse, attention_flash_masked, takes_any_mask

FIRST_MODES = ("free", "keep", "drop")


def _check_mode(window: int, first: str) -> None:
    if first not in FIRST_MODES:
        raise ValueError(f"first must be one of {', '.join(FIRST_MODES)}, got {first!r}")
    if window < 0:
        raise ValueError(f"window must be >= 0 (0: full causal attention), got {window}")


def window_mask(tq: int, tk: int, q_offset: int, window: int, first: str, device: torch.device) -> torch.Tensor:
    """Boolean (Tq, Tk): True where query ``q_offset + i`` may see key ``j``."""
    _check_mode(window, first)
    return _visible(torch.arange(tq, device=device) + q_offset, torch.arange(tk, device=device), window, first)


def _visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int, first: str) -> torch.Tensor:
    """Boolean (Tq, Tk): True where the query at position ``q_pos[i]`` may see the key at
    position ``k_pos[j]`` (positions as 1-D tensors)."""
    q_pos, k_pos = q_pos[:, None], k_pos[None, :]
    mask = k_pos <= q_pos
    if window:
        mask = mask & (q_pos - k_pos < window)
    if first == "keep":
        mask = mask | (k_pos == 0)
    elif first == "drop":
        mask = mask & ((k_pos != 0) | (q_pos == 0))  # position 0 still sees itself
    return mask


def _masked_probs(q: torch.Tensor, k: torch.Tensor, sink: torch.Tensor | None, mask: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """Float32 probabilities (B, H, Tq, Tk) of ``q`` (B, H, Tq, D) over ``k`` (B, H, Tk, D)
    where ``mask`` (Tq, Tk) allows, the sink (H,) taking its share."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale  # (B, H, Tq, Tk)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sink is None:
        return torch.softmax(scores, dim=-1)
    sink_col = sink.float().view(1, q.shape[1], 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat((scores, sink_col), dim=-1), dim=-1)[..., :-1]


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def window_probs(q: torch.Tensor, k: torch.Tensor, sink: torch.Tensor | None = None, *, window: int = 0,
                 first: str = "free", q_offset: int = 0, scale: float | None = None) -> torch.Tensor:
    """Attention probabilities (B, H, Tq, Tk) in float32 under :func:`window_mask`; rows sum
    to ``1 - p_sink`` with a sink. ``q`` (B, H, Tq, D), ``k`` (B, Hkv, Tk, D)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, Tk, D)
    mask = window_mask(q.shape[2], k.shape[2], q_offset, window, first, q.device)
    return _masked_probs(q, k, sink, mask, _scale(q, scale))


def attention_window_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor | None = None,
                               *, window: int = 0, first: str = "free", q_offset: int = 0,
                               scale: float | None = None) -> torch.Tensor:
    """Attention output (B, H, Tq, Dv) under :func:`window_mask`, from the probabilities
    written out (the specification of :func:`attention_window`)."""
    probs = window_probs(q, k, sink, window=window, first=first, q_offset=q_offset, scale=scale)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)  # (B, H, Tk, Dv)
    return (probs @ v.float()).to(q.dtype)


def _blocked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor | None, window: int, first: str,
             q_offset: int, scale: float) -> torch.Tensor:
    """:func:`attention_window_reference` block by block of ``window`` queries: each block
    reads the keys from ``window - 1`` before its first query to its last (and the first
    position where it is kept), never the whole Tq × Tk matrix."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, Tk, D)
    positions = torch.arange(q_offset + q.shape[2], device=q.device)
    outs = []
    for s in range(0, q.shape[2], window):
        e = min(s + window, q.shape[2])
        lo, hi = max(0, q_offset + s - window + 1), q_offset + e  # the keys this block can see
        keys = positions[lo:hi]
        if first == "keep" and lo > 0:
            keys = torch.cat((positions[:1], keys))
        mask = _visible(positions[q_offset + s:q_offset + e], keys, window, first)
        probs = _masked_probs(q[:, :, s:e], k.index_select(2, keys), sink, mask, scale)  # (B, H, e - s, len(keys))
        outs.append(probs @ v.index_select(2, keys).float())
    return torch.cat(outs, dim=2).to(q.dtype)


def attention_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor | None = None, *,
                     window: int = 0, first: str = "free", q_offset: int = 0,
                     scale: float | None = None) -> torch.Tensor:
    """Attention output (B, H, Tq, Dv) under :func:`window_mask`: the fused kernel for full
    causal attention with the first position free, blocks of ``window`` queries where the
    keys are more than twice the window, the fused kernel with the window as its mask where
    the device has one and no cached prefix comes first, the probabilities written out
    otherwise."""
    _check_mode(window, first)
    if not window and first == "free":
        return attention_flash_lse(q, k, v, sink, q_offset=q_offset, scale=scale)
    if window and k.shape[2] > 2 * window:
        return _blocked(q, k, v, sink, window, first, q_offset, _scale(q, scale))
    if q_offset == 0 and takes_any_mask(q, k, v):
        visible = window_mask(q.shape[2], k.shape[2], 0, window, first, q.device)
        return attention_flash_masked(q, k, v, sink, visible, scale=scale)
    return attention_window_reference(q, k, v, sink, window=window, first=first, q_offset=q_offset, scale=scale)
