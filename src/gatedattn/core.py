"""Attention cores: the swappable part of ``Attention`` that turns q, k, v into outputs.

``Attention.with_core(core)`` runs a layer with another core for the body of a ``with``;
the analysis uses it to read attention probabilities
(:class:`gatedattn.analysis.probe.ProbeCore`).
"""

from __future__ import annotations

from torch import nn

from gatedattn.ops import attention_flash_lse, attention_reference, attention_sdpa

KERNEL_FUNCTIONS = {
    "sdpa": attention_sdpa,
    "flash-lse": attention_flash_lse,
    "reference": attention_reference,
}


class AttentionCore(nn.Module):
    """q (B, H, Tq, Dqk), k (B, Hkv, Tk, Dqk), v (B, Hkv, Tk, Dv) -> (B, H, Tq, Dv)."""

    def __init__(self, kernel: str):
        super().__init__()
        self.kernel = kernel
        self.fn = KERNEL_FUNCTIONS[kernel]

    def forward(self, q, k, v, sink=None, *, q_offset: int = 0, scale: float | None = None, key_mask=None):
        """``key_mask`` (B, Tk), False for padded keys; a core that handles no padding may
        leave the argument out (``Attention`` passes it only for a padded batch)."""
        if key_mask is None:
            return self.fn(q, k, v, sink, q_offset=q_offset, scale=scale)
        return self.fn(q, k, v, sink, q_offset=q_offset, scale=scale, key_mask=key_mask)

    def extra_repr(self) -> str:
        return f"kernel={self.kernel!r}"
