"""The attention layer: projections, optional gates and sink, a swappable core
(docs/design.md sections 1-3: the gate positions, HyGA, the learnable sink).

Data flow for one layer (``X`` is the input after the pre-norm)::

    q, k, v = qkv(X)                      # gate at g4 / g3 / g2 scales q / k / v here
    q, k = rope(qk_norm(q), qk_norm(k))
    H = core(q, k, v, sink)               # (B, T, H, Dv), causal
    H = gate(head_transform(H), X)        # g1: X-gate, H-gate, C-gate (HyGA)
    Y = o_proj(H)                         # g5 gates Y

Two fusions keep the gate cheap in training. A full-rank X-gate at g1 or g4 is computed
in the query projection's matmul (``[q | gate] = X [W_q | W_gate]``, as Qwen3-Next packs
``q_proj``); the parameters stay separate modules. A g1 gate of the form
``H * sigmoid(logits)`` and ``o_proj`` run as one autograd function
(``ops.gated_linear``) that recomputes the scores in backward instead of keeping them.
The plain path runs whenever gradients are off or a hook watches the gate's scores or
``o_proj``, so analysis hooks see every score, and whenever a projection is not a plain
``nn.Linear`` (an adapter such as PEFT's LoRA wraps it), so the adapter is applied.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Iterator

import torch
from torch import nn

from gatedattn.layers.checks import check_attention_input
from gatedattn.layers.cache import KVCache
from gatedattn.layers.config import AttentionConfig, RopeConfig
from gatedattn.layers.core import AttentionCore
from gatedattn.infra.errors import GatedAttnError
from gatedattn.infra.sizes import check_layer_size
from gatedattn.layers.gates import Gate, HeadTransform
from gatedattn.layers.norm import RMSNorm
from gatedattn.layers.packing import apply_linear, concat_linear, hooked, packed_linear, plain_linear
from gatedattn.ops.gate import gated_linear
from gatedattn.layers.rope import RopeTables, Rotary, apply_rope

# index into (q, k, v) of the tensor that a projection-side gate scales
_PROJECTION_GATES = {"g4": 0, "g3": 1, "g2": 2}


class GQAProjection(nn.Module):
    """Separate q/k/v projections; ``n_kv_heads`` < ``n_heads`` is grouped-query attention.
    Where their weights lie stacked in one tensor (``layers.packing``) they run as one product."""

    PACKED = (("q_proj", "k_proj", "v_proj"),)  # the projections that may share one product

    def __init__(self, cfg: AttentionConfig):
        super().__init__()
        self.cfg = cfg
        H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, H * D, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, Hkv * D, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, Hkv * D, bias=cfg.qkv_bias)

    def forward(self, x_BTC: torch.Tensor, extra: nn.Linear | None = None):
        """q, k, v and, when ``extra`` is given, ``extra(X)`` from the same matmul as q."""
        B, T, _ = x_BTC.shape
        c = self.cfg
        extra_out = None
        qkv = packed_linear(x_BTC, (self.q_proj, self.k_proj, self.v_proj)) if extra is None else None
        if qkv is not None:
            q, k, v = qkv
        else:
            q, extra_out = (self.q_proj(x_BTC), None) if extra is None else concat_linear(x_BTC, self.q_proj, extra)
            k, v = self.k_proj(x_BTC), self.v_proj(x_BTC)
        q_BTHD = q.view(B, T, c.n_heads, c.head_dim)
        k_BTHD = k.view(B, T, c.n_kv_heads, c.head_dim)
        v_BTHD = v.view(B, T, c.n_kv_heads, c.head_dim)
        return q_BTHD, k_BTHD, v_BTHD, extra_out


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

    def query(self, x_BTC: torch.Tensor) -> torch.Tensor:
        """q (B, T, H, Dqk)."""
        B, T, _ = x_BTC.shape
        if self.cfg.mla.q_rank:
            q = self.q_b_proj(self.q_a_norm(self.q_a_proj(x_BTC)))
        else:
            q = self.q_proj(x_BTC)
        return q.view(B, T, self.cfg.n_heads, self.cfg.qk_dim)

    def latent(self, x_BTC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What decoding caches per token: the normalised latent (B, T, kv_rank) and the
        shared RoPE key part (B, T, 1, rope_dim), one "head" for all heads."""
        m = self.cfg.mla
        latent, k_rope_BTR = self.kv_a_proj(x_BTC).split((m.kv_rank, m.rope_dim), dim=-1)
        return self.kv_a_norm(latent), k_rope_BTR[:, :, None, :]

    def expand(self, latent_BTR: torch.Tensor, k_rope_BT1R: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head keys (B, T, H, rope_dim + head_dim) and values (B, T, H, Dv) from the latent."""
        B, T, _ = latent_BTR.shape
        c, H = self.cfg, self.cfg.n_heads
        kv = self.kv_b_proj(latent_BTR).view(B, T, H, c.head_dim + c.v_dim)
        k_nope, v_BTHD = kv.split((c.head_dim, c.v_dim), dim=-1)
        k_rope = k_rope_BT1R.expand(B, T, H, self.cfg.mla.rope_dim)
        return torch.cat((k_rope, k_nope), dim=-1), v_BTHD

    def forward(self, x_BTC: torch.Tensor, extra: nn.Linear | None = None):
        latent, k_rope = self.latent(x_BTC)
        k_BTHD, v_BTHD = self.expand(latent, k_rope)
        return self.query(x_BTC), k_BTHD, v_BTHD, None if extra is None else extra(x_BTC)


class Attention(nn.Module):
    """Causal self-attention for any ``AttentionConfig``.

    ``forward(x, positions=None, cache=None, key_mask=None)``: ``x`` (B, T, d_model) after
    the pre-norm; ``positions`` (T,) or (B, T) integer positions for RoPE (default:
    ``cache.length + arange(T)``); ``cache`` a ``KVCache`` that is extended in place;
    ``key_mask`` (B, cache.length + T) boolean, False for padding tokens, whose keys every
    query then ignores (None: no padding, today's unmasked kernels); ``rope`` the model's
    ``RopeTables`` of ``positions``, shared by its layers (None: this layer computes its
    own). Returns (B, T, d_model).
    """

    def __init__(self, cfg: AttentionConfig):
        super().__init__()
        device = torch.get_default_device()
        if device.type != "meta":  # the weights fit where they will be allocated, before any is
            check_layer_size(cfg, "Attention", device)
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
        self.sink = nn.Parameter(torch.full((H,), float(cfg.sink_init))) if cfg.sink else None
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
        key_mask: torch.Tensor | None = None,
        rope: RopeTables | None = None,
    ) -> torch.Tensor:
        check_attention_input(self.cfg, x, positions, cache, self.o_proj.weight.dtype)  # cheap: shapes and dtypes
        B, T, _ = x.shape
        offset = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(offset, offset + T, device=x.device)
        if positions.dim() == 1:
            positions = positions[None]  # (1, T)
        position = self.cfg.gate.position if self.gate is not None else None

        if cache is not None and self.caches_latent:
            q, k, v, x_gate = self._qkv_from_latent(x, positions, cache, rope)
        else:
            q, k, v, x_gate = self._qkv(x, positions, cache, rope)
        if key_mask is None:
            h = self.core(q, k, v, self.sink, q_offset=offset, scale=self.scale)
        else:
            if "key_mask" not in inspect.signature(self.core.forward).parameters:
                raise GatedAttnError(f"the attention core {type(self.core).__name__} takes no key_mask: run it on "
                                     f"batches without padding")
            h = self.core(q, k, v, self.sink, q_offset=offset, scale=self.scale, key_mask=key_mask)
        h_BTHD = self.head_transform(h.transpose(1, 2))
        if position == "g1" and self._fuse_gate_with_o_proj():
            logits = self.gate.logits(h_BTHD, x, x_gate)
            head_logits = self.gate.c.logits(h_BTHD) if self.gate.c is not None else None
            return gated_linear(h_BTHD, logits, self.o_proj.weight, self.o_proj.bias, head_logits)
        if position == "g1":
            h_BTHD = self.gate(h_BTHD, x, x_gate)
        y = apply_linear(self.o_proj, h_BTHD.reshape(B, T, -1))
        if position == "g5":
            y = self.gate(y[:, :, None, :], x)[:, :, 0, :]
        return y

    @property
    def caches_latent(self) -> bool:
        """MLA decoding caches the latent and the shared RoPE key, not per-head K/V; a g2/g3
        gate (which scales the expanded V/K by a score from each token's X) rules it out."""
        return self.cfg.kv == "mla" and (self.gate is None or self.cfg.gate.position not in ("g2", "g3"))

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype, rope: RopeTables | None):
        if rope is None:
            return self.rotary.cos_sin(positions, dtype)
        return rope.cos_sin(self.rotary, positions, dtype)

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache | None, rope: RopeTables | None = None):
        """q (B, H, T, Dqk), k and v (B, Hkv, Tk, D) after gates, norms, RoPE and the cache;
        and ``X W_gate`` when the X-gate was packed with the query projection."""
        position = self.cfg.gate.position if self.gate is not None else None
        # q (B,T,H,Dqk), k (B,T,Hkv,Dqk), v (B,T,Hkv,Dv); x_gate = X W_gate when packed with q
        *qkv, x_gate = self.qkv(x, self._packed_gate_proj())
        if position in _PROJECTION_GATES:
            i = _PROJECTION_GATES[position]
            qkv[i] = self.gate(qkv[i], x, x_gate)
        q, k, v = qkv
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = self._cos_sin(positions, q.dtype, rope)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        if cache is not None:
            k, v = cache.update(k, v)
        return q, k, v, x_gate

    def _qkv_from_latent(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                         rope: RopeTables | None = None):
        """MLA with a cache: append this step's latent and rotated RoPE key to the cache,
        then expand every cached position into per-head keys and values."""
        proj: MLAProjection = self.qkv
        q = proj.query(x)
        if self.gate is not None and self.cfg.gate.position == "g4":
            q = self.gate(q, x)
        latent, k_rope = proj.latent(x)  # (B, T, kv_rank), (B, T, 1, rope_dim)
        cos, sin = self._cos_sin(positions, q.dtype, rope)
        q, k_rope = apply_rope(q, cos, sin), apply_rope(k_rope, cos, sin)
        latent, k_rope = cache.update_latent(latent, k_rope)
        k, v = proj.expand(latent, k_rope)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None

    def _packed_gate_proj(self) -> nn.Linear | None:
        """The X-gate projection to compute in the query projection's matmul, if any."""
        g = self.gate
        if g is None or g.x is None or self.cfg.gate.position not in ("g1", "g4") or self.cfg.kv != "gqa":
            return None
        if not (plain_linear(self.qkv.q_proj) and plain_linear(g.x.linear)):
            return None  # e.g. a LoRA-wrapped projection: each module computes its own output
        return g.x.linear

    def _fuse_gate_with_o_proj(self) -> bool:
        """Run the g1 gate and o_proj as ``ops.gated_linear`` (training), unless hooks watch them."""
        return (torch.is_grad_enabled() and self.gate.is_sigmoid_product and plain_linear(self.o_proj)
                and not any(hooked(m) for m in (*self.gate.score_modules, self.o_proj)))

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
