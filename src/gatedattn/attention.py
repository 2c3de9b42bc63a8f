"""The attention layer: projections, optional gates and sink, a swappable core.

Data flow for one layer (``X`` is the input after the pre-norm)::

    q, k, v = qkv(X)                      # gate at g4 / g3 / g2 scales q / k / v here
    q, k = rope(qk_norm(q), qk_norm(k))
    H = core(q, k, v, sink)               # (B, T, H, Dv), causal
    H = gate(head_transform(H), X)        # g1: X-gate, H-gate, C-gate (HyGA)
    Y = o_proj(H)                         # g5 gates Y
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import nn

from gatedattn.cache import KVCache
from gatedattn.config import AttentionConfig, RopeConfig
from gatedattn.core import AttentionCore
from gatedattn.gates import Gate, HeadTransform
from gatedattn.norm import RMSNorm
from gatedattn.rope import Rotary, apply_rope

# index into (q, k, v) of the tensor that a projection-side gate scales
_PROJECTION_GATES = {"g4": 0, "g3": 1, "g2": 2}


class GQAProjection(nn.Module):
    """Separate q/k/v projections; ``n_kv_heads`` < ``n_heads`` is grouped-query attention."""

    def __init__(self, cfg: AttentionConfig):
        super().__init__()
        self.cfg = cfg
        H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, H * D, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, Hkv * D, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, Hkv * D, bias=cfg.qkv_bias)

    def forward(self, x_BTC: torch.Tensor):
        B, T, _ = x_BTC.shape
        c = self.cfg
        q_BTHD = self.q_proj(x_BTC).view(B, T, c.n_heads, c.head_dim)
        k_BTHD = self.k_proj(x_BTC).view(B, T, c.n_kv_heads, c.head_dim)
        v_BTHD = self.v_proj(x_BTC).view(B, T, c.n_kv_heads, c.head_dim)
        return q_BTHD, k_BTHD, v_BTHD


class MLAProjection(nn.Module):
    """Multi-head latent attention (DeepSeek-V2) projections.

    Keys and values are expanded from a normalised latent of width ``kv_rank``; a
    ``rope_dim``-wide key part comes straight from X and is shared by all heads.
    Query/key channels are laid out ``[rope | nope]`` so RoPE rotates the first
    ``rope_dim`` channels, as for partial RoPE.
    """

    def __init__(self, cfg: AttentionConfig):
        super().__init__()
        self.cfg = cfg
        m, H = cfg.mla, cfg.n_heads
        if m.q_rank:
            self.q_a_proj = nn.Linear(cfg.d_model, m.q_rank, bias=False)
            self.q_a_norm = RMSNorm(m.q_rank, eps=cfg.norm_eps)
            self.q_b_proj = nn.Linear(m.q_rank, H * cfg.qk_dim, bias=False)
        else:
            self.q_proj = nn.Linear(cfg.d_model, H * cfg.qk_dim, bias=False)
        self.kv_a_proj = nn.Linear(cfg.d_model, m.kv_rank + m.rope_dim, bias=False)
        self.kv_a_norm = RMSNorm(m.kv_rank, eps=cfg.norm_eps)
        self.kv_b_proj = nn.Linear(m.kv_rank, H * (cfg.head_dim + cfg.v_dim), bias=False)

    def forward(self, x_BTC: torch.Tensor):
        B, T, _ = x_BTC.shape
        c, m, H = self.cfg, self.cfg.mla, self.cfg.n_heads
        if m.q_rank:
            q = self.q_b_proj(self.q_a_norm(self.q_a_proj(x_BTC)))
        else:
            q = self.q_proj(x_BTC)
        q_BTHD = q.view(B, T, H, c.qk_dim)
        latent, k_rope_BTR = self.kv_a_proj(x_BTC).split((m.kv_rank, m.rope_dim), dim=-1)
        kv = self.kv_b_proj(self.kv_a_norm(latent)).view(B, T, H, c.head_dim + c.v_dim)
        k_nope, v_BTHD = kv.split((c.head_dim, c.v_dim), dim=-1)
        k_rope = k_rope_BTR[:, :, None, :].expand(B, T, H, m.rope_dim)
        k_BTHD = torch.cat((k_rope, k_nope), dim=-1)
        return q_BTHD, k_BTHD, v_BTHD


class Attention(nn.Module):
    """Causal self-attention for any ``AttentionConfig``.

    ``forward(x, positions=None, cache=None)``: ``x`` (B, T, d_model) after the pre-norm;
    ``positions`` (T,) or (B, T) integer positions for RoPE (default: ``cache.length +
    arange(T)``); ``cache`` a ``KVCache`` that is extended in place. Returns (B, T, d_model).
    """

    def __init__(self, cfg: AttentionConfig):
        super().__init__()
        self.cfg = cfg
        H = cfg.n_heads
        self.qkv = MLAProjection(cfg) if cfg.kv == "mla" else GQAProjection(cfg)
        self.o_proj = nn.Linear(H * cfg.v_dim, cfg.d_model, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
        else:
            self.q_norm = self.k_norm = None
        rot_dim = cfg.mla.rope_dim if cfg.kv == "mla" else int(cfg.head_dim * cfg.rope.fraction)
        self.rotary = Rotary(cfg.rope, rot_dim)
        self.head_transform = HeadTransform(cfg.head_transform, cfg.v_dim, cfg.norm_eps)
        self.gate = self._make_gate(cfg)
        self.sink = nn.Parameter(torch.zeros(H)) if cfg.sink else None
        self.core = AttentionCore(cfg.resolved_kernel)
        self.scale = 1.0 / math.sqrt(cfg.qk_dim)

    @staticmethod
    def _make_gate(cfg: AttentionConfig) -> Gate | None:
        g = cfg.gate
        if g is None:
            return None
        groups, dim = {
            "g1": (cfg.n_heads, cfg.v_dim),
            "g2": (cfg.n_kv_heads, cfg.v_dim),
            "g3": (cfg.n_kv_heads, cfg.qk_dim),
            "g4": (cfg.n_heads, cfg.qk_dim),
            "g5": (1, cfg.d_model),
        }[g.position]
        return Gate(g, cfg.d_model, groups, dim)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        offset = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(offset, offset + T, device=x.device)
        if positions.dim() == 1:
            positions = positions[None]  # (1, T)
        position = self.cfg.gate.position if self.gate is not None else None

        qkv = list(self.qkv(x))  # q (B,T,H,Dqk), k (B,T,Hkv,Dqk), v (B,T,Hkv,Dv)
        if position in _PROJECTION_GATES:
            i = _PROJECTION_GATES[position]
            qkv[i] = self.gate(qkv[i], x)
        q, k, v = qkv
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = self.rotary.cos_sin(positions, q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        if cache is not None:
            k, v = cache.update(k, v)
        h = self.core(q, k, v, self.sink, q_offset=offset, scale=self.scale)
        h_BTHD = self.head_transform(h.transpose(1, 2))
        if position == "g1":
            h_BTHD = self.gate(h_BTHD, x)
        y = self.o_proj(h_BTHD.reshape(B, T, -1))
        if position == "g5":
            y = self.gate(y[:, :, None, :], x)[:, :, 0, :]
        return y

    # The analysis seam: run the layer with another core or RoPE for the body of a ``with``.
    @contextlib.contextmanager
    def with_core(self, core: nn.Module) -> Iterator[nn.Module]:
        """Compute attention with ``core`` (same call signature as ``AttentionCore``)
        within the body, e.g. one that also reports its probabilities; restored after."""
        saved = self.core
        self.core = core
        try:
            yield core
        finally:
            self.core = saved

    @contextlib.contextmanager
    def with_rope(self, rope: RopeConfig) -> Iterator[Rotary]:
        """Rotate queries and keys with ``rope`` (e.g. scaled for longer contexts) within
        the body; the layer's own RoPE returns after."""
        saved = self.rotary
        self.rotary = Rotary(rope, saved.rot_dim).to(saved.inv_freq.device)
        try:
            yield self.rotary
        finally:
            self.rotary = saved

    def extra_repr(self) -> str:
        c = self.cfg
        return f"heads={c.n_heads}, kv_heads={c.n_kv_heads}, head_dim={c.head_dim}, kv={c.kv!r}"
