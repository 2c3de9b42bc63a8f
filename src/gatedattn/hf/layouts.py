"""The two ways published checkpoints pack an output gate into ``q_proj`` (docs/design.md, "Packed gate layouts").

``gatedattn`` keeps the query projection and the X-gate projection apart:
``attn.qkv.q_proj`` (H*d rows, head-major) and ``attn.gate.x.proj`` (H*w rows,
head-major; ``w`` = d elementwise, 1 headwise). The functions below convert the rows
(weights) or entries (biases) of a packed ``q_proj`` to and from that pair.

* **grouped** -- the official gated-attention code (Qwen3 with
  ``elementwise_attn_output_gate`` / ``headwise_attn_output_gate``): the output
  viewed as ``(n_kv_heads, -1)`` holds, per KV group, the G query heads of that group
  followed by their G gates (G = H / n_kv_heads).
* **interleaved** -- Qwen3-Next / Qwen3.5: the output viewed as ``(H, 2d)`` is
  ``[q_h | gate_h]`` per head.

They coincide only when ``n_kv_heads == H``; reading one as the other silently
permutes queries and gates across heads.
"""

from __future__ import annotations

import torch


def split_grouped(packed: torch.Tensor, n_heads: int, n_kv_heads: int, head_dim: int,
                  gate_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Official layout -> (q rows (H*d, ...), gate rows (H*w, ...)); works on weights and biases."""
    G = n_heads // n_kv_heads
    rest = packed.shape[1:]
    grouped = packed.reshape(n_kv_heads, G * head_dim + G * gate_width, *rest)
    q = grouped[:, : G * head_dim].reshape(n_heads * head_dim, *rest)
    gate = grouped[:, G * head_dim:].reshape(n_heads * gate_width, *rest)
    return q.contiguous(), gate.contiguous()


def join_grouped(q: torch.Tensor, gate: torch.Tensor, n_heads: int, n_kv_heads: int, head_dim: int,
                 gate_width: int) -> torch.Tensor:
    """Inverse of ``split_grouped``."""
    G = n_heads // n_kv_heads
    rest = q.shape[1:]
    return torch.cat((q.reshape(n_kv_heads, G * head_dim, *rest),
                      gate.reshape(n_kv_heads, G * gate_width, *rest)), dim=1).reshape(-1, *rest)


def split_interleaved(packed: torch.Tensor, n_heads: int, head_dim: int,
                      gate_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-Next layout -> (q rows (H*d, ...), gate rows (H*w, ...))."""
    rest = packed.shape[1:]
    per_head = packed.reshape(n_heads, head_dim + gate_width, *rest)
    q = per_head[:, :head_dim].reshape(n_heads * head_dim, *rest)
    gate = per_head[:, head_dim:].reshape(n_heads * gate_width, *rest)
    return q.contiguous(), gate.contiguous()


def join_interleaved(q: torch.Tensor, gate: torch.Tensor, n_heads: int, head_dim: int,
                     gate_width: int) -> torch.Tensor:
    """Inverse of ``split_interleaved``."""
    rest = q.shape[1:]
    return torch.cat((q.reshape(n_heads, head_dim, *rest),
                      gate.reshape(n_heads, gate_width, *rest)), dim=1).reshape(-1, *rest)
