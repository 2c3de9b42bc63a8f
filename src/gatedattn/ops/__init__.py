"""Pure tensor functions for the attention core.

``reference`` is the readable specification; ``sdpa`` holds the fast paths. Both take
q (B, H, Tq, Dqk), k (B, Hkv, Tk, Dqk), v (B, Hkv, Tk, Dv), an optional per-head sink
logit (H,), and return the output (B, H, Tq, Dv). ``gate.gated_linear`` fuses the G1
sigmoid gate with the output projection; ``reference.gated_linear`` specifies it.
``lm_loss.linear_cross_entropy`` fuses the LM head with the next-token loss, chunk by
chunk; ``reference.linear_cross_entropy`` specifies it. Tests
compare every fast path with its reference forward and backward.
"""

from gatedattn.ops.gate import gated_linear
from gatedattn.ops.lm_loss import linear_cross_entropy
from gatedattn.ops.reference import attention_reference
from gatedattn.ops.sdpa import attention_flash_lse, attention_sdpa

__all__ = ["attention_reference", "attention_sdpa", "attention_flash_lse", "gated_linear", "linear_cross_entropy"]
