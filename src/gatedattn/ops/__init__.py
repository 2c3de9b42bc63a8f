"""Pure tensor functions for the attention core.

``reference`` is the readable specification; ``sdpa`` holds the fast paths. Both take
q (B, H, Tq, Dqk), k (B, Hkv, Tk, Dqk), v (B, Hkv, Tk, Dv), an optional per-head sink
logit (H,), and return the output (B, H, Tq, Dv). Tests compare them forward and backward.
"""

from gatedattn.ops.reference import attention_reference
from gatedattn.ops.sdpa import attention_flash_lse, attention_sdpa

__all__ = ["attention_reference", "attention_sdpa", "attention_flash_lse"]
