"""Attention cores: the swappable part of ``Attention`` that turns q, k, v into outputs.

``Attention.core`` is an ordinary field; analysis code swaps in ``ProbeCore`` to read
attention probabilities through a forward hook on ``ProbeCore.probs``.
"""

from __future__ import annotations

from torch import nn

from gatedattn.ops import attention_flash_lse, attention_reference, attention_sdpa
from gatedattn.ops.reference import attention_probs_reference

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

    def forward(self, q, k, v, sink=None, *, q_offset: int = 0, scale: float | None = None):
        return self.fn(q, k, v, sink, q_offset=q_offset, scale=scale)

    def extra_repr(self) -> str:
        return f"kernel={self.kernel!r}"


class ProbeCore(nn.Module):
    """The reference core with its probabilities (B, H, Tq, Tk) passed through
    ``self.probs`` (an identity module) so that a forward hook can read them."""

    def __init__(self):
        super().__init__()
        self.probs = nn.Identity()

    def forward(self, q, k, v, sink=None, *, q_offset: int = 0, scale: float | None = None):
        probs = self.probs(attention_probs_reference(q, k, sink, q_offset=q_offset, scale=scale))
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        return (probs @ v.float()).to(q.dtype)
