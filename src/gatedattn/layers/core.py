"""Attention cores: the swappable part of ``Attention`` that turns q, k, v into outputs.

``Attention.with_core(core)`` runs a layer with another core for the body of a ``with``;
the analysis uses it to read attention probabilities
(:class:`gatedattn.analysis.probe.ProbeCore`). ``ReferenceCore`` is the reference core that
also hands out the probabilities it computes (the transformers wrapper's ``"eager"``
attention, :mod:`gatedattn.hf.outputs`).
"""

from __future__ import annotations

from torch import nn

from gatedattn.ops import attention_flash_lse, attention_reference, attention_sdpa
from gatedattn.ops.reference import attention_reference_with_probs
from gatedattn.ops.window import FIRST_MODES, attention_window

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


class ReferenceCore(AttentionCore):
    """The ``reference`` core (explicit scores and softmax) that can also keep its
    probabilities: while ``probs`` is a list, each call appends the (B, H, Tq, Tk)
    probabilities it weighed the values with, in q's dtype (a learnable sink's share left
    out: rows sum to ``1 - p_sink``), as the same computation's intermediate and in the
    autograd graph. ``probs`` is None (keep nothing) unless a caller sets it."""

    def __init__(self, probs: list | None = None):
        super().__init__("reference")
        self.probs = probs

    def forward(self, q, k, v, sink=None, *, q_offset: int = 0, scale: float | None = None, key_mask=None):
        if self.probs is None:
            return super().forward(q, k, v, sink, q_offset=q_offset, scale=scale, key_mask=key_mask)
        out, probs = attention_reference_with_probs(q, k, v, sink, q_offset=q_offset, scale=scale, key_mask=key_mask)
        self.probs.append(probs.to(q.dtype))
        return out


class WindowCore(nn.Module):
    """A core for ``Attention.with_core``: each query sees its last ``window`` keys (0: all
    earlier keys), with the first position kept in every query's view, dropped from it, or
    left as any key (``first``: ``keep``, ``drop``, ``free``); see
    :mod:`gatedattn.ops.window`. The layer's learnable sink, when it has one, takes part."""

    def __init__(self, window: int = 0, first: str = "free"):
        super().__init__()
        if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window < 2**62:
            raise ValueError(f"window must be an int in [0, 2**62) (0: full causal attention), got {window!r}")
        if first not in FIRST_MODES:
            raise ValueError(f"first must be one of {', '.join(FIRST_MODES)}, got {first!r}")
        self.window, self.first = window, first

    def forward(self, q, k, v, sink=None, *, q_offset: int = 0, scale: float | None = None):
        return attention_window(q, k, v, sink, window=self.window, first=self.first, q_offset=q_offset, scale=scale)

    def extra_repr(self) -> str:
        return f"window={self.window}, first={self.first!r}"
