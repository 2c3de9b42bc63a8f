"""Reference attention: explicit scores, mask, softmax. The specification of every fast path.

A learnable sink is a key with logit ``b_h`` (the same for every query of head h) and
value zero: a logit column is concatenated, the softmax taken, the column dropped.

Padding: ``key_mask`` (B, Tk), True for a real token and False for padding, hides the
padded keys from every query (probability exactly zero, sink included: the softmax
denominator, and so the log-sum-exp the sink identity uses, runs over real keys only).
A padding query sees itself alone, so that its output -- which nothing reads -- stays
finite; a real query's own key is real, so the rule changes nothing for real tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def causal_mask(tq: int, tk: int, q_offset: int, device: torch.device) -> torch.Tensor:
    """Boolean (Tq, Tk) mask, True where query ``q_offset + i`` may see key ``j``."""
    q_pos = torch.arange(tq, device=device)[:, None] + q_offset
    k_pos = torch.arange(tk, device=device)[None, :]
    return k_pos <= q_pos


def visible_keys(tq: int, tk: int, q_offset: int, key_mask: torch.Tensor) -> torch.Tensor:
    """Boolean (B, 1, Tq, Tk) mask: causal, padded keys hidden (``key_mask`` (B, Tk), True
    for real tokens), except that each query sees its own key."""
    q_pos = torch.arange(tq, device=key_mask.device)[:, None] + q_offset
    k_pos = torch.arange(tk, device=key_mask.device)[None, :]
    own = k_pos == q_pos
    return ((k_pos <= q_pos) & (key_mask.bool()[:, None, :] | own))[:, None]


def check_key_mask(key_mask: torch.Tensor, k: torch.Tensor) -> None:
    if key_mask.dim() != 2 or key_mask.shape != (k.shape[0], k.shape[2]):
        raise ValueError(f"key_mask must be (batch, keys) = {(k.shape[0], k.shape[2])}, got {tuple(key_mask.shape)}")


def attention_probs_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    sink: torch.Tensor | None = None,
    *,
    q_offset: int = 0,
    scale: float | None = None,
    key_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention probabilities (B, H, Tq, Tk) in float32; rows sum to
    ``1 - p_sink`` when a sink is present. ``q`` is (B, H, Tq, D), ``k`` (B, Hkv, Tk, D);
    ``key_mask`` (B, Tk), False for padded keys."""
    n_heads, n_kv = q.shape[1], k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k = k.repeat_interleave(n_heads // n_kv, dim=1)  # (B, H, Tk, D)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale  # (B, H, Tq, Tk)
    if key_mask is None:
        mask = causal_mask(q.shape[2], k.shape[2], q_offset, q.device)
    else:
        check_key_mask(key_mask, k)
        mask = visible_keys(q.shape[2], k.shape[2], q_offset, key_mask)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sink is None:
        return torch.softmax(scores, dim=-1)
    sink_col = sink.float().view(1, n_heads, 1, 1).expand(*scores.shape[:-1], 1)
    probs = torch.softmax(torch.cat((scores, sink_col), dim=-1), dim=-1)
    return probs[..., :-1]  # drop the sink column: its value is zero


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sink: torch.Tensor | None = None,
    *,
    q_offset: int = 0,
    scale: float | None = None,
    key_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention output (B, H, Tq, Dv); query i sits at position ``q_offset + i``;
    ``key_mask`` (B, Tk), False for padded keys."""
    return attention_reference_with_probs(q, k, v, sink, q_offset=q_offset, scale=scale, key_mask=key_mask)[0]


def attention_reference_with_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sink: torch.Tensor | None = None,
    *,
    q_offset: int = 0,
    scale: float | None = None,
    key_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``attention_reference``'s output and the float32 probabilities (B, H, Tq, Tk) it
    weighs the values with (``attention_probs_reference``: without the sink's share)."""
    probs = attention_probs_reference(q, k, sink, q_offset=q_offset, scale=scale, key_mask=key_mask)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)  # (B, H, Tk, Dv)
    return (probs @ v.float()).to(q.dtype), probs


def gated_linear(y_BTHD: torch.Tensor, logits: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None = None, head_logits: torch.Tensor | None = None) -> torch.Tensor:
    """Specification of ``ops.gate.gated_linear``: sigmoid gate on each head's output (times
    a per-head sigmoid of ``head_logits`` (B, T, H, 1) when given), then the output
    projection. ``logits`` broadcasts against ``y`` (B, T, H, D)."""
    gated = y_BTHD * torch.sigmoid(logits.to(y_BTHD.dtype))
    if head_logits is not None:
        gated = gated * torch.sigmoid(head_logits.to(y_BTHD.dtype))
    return F.linear(gated.flatten(-2), weight, bias)


def linear_cross_entropy(h_NC: torch.Tensor, weight_VC: torch.Tensor, targets_N: torch.Tensor, *,
                         ignore_index: int = -100, reduction: str = "mean") -> torch.Tensor:
    """The LM head and the next-token loss as written everywhere: logits (N, V) in the
    matmul's dtype, their float32 copy (float64 stays), cross-entropy. The specification of
    ``ops.lm_loss.linear_cross_entropy``."""
    logits = F.linear(h_NC, weight_VC)
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets_N, ignore_index=ignore_index, reduction=reduction)
