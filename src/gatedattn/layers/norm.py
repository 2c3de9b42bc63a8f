"""RMSNorm computed in float32 whatever the input dtype (as Qwen3/Llama do under bf16)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` that normalises in float32 and returns the input dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight.float() if self.weight is not None else None
        return F.rms_norm(x.float(), self.normalized_shape, weight, self.eps).to(x.dtype)
