"""One training step, as the trainer takes it, for timing.

Forward under the precision's autocast, fp32 cross-entropy (the model's ``loss``),
backward, gradient clipping at 1.0 and the trainer's optimizer (``build_optimizer``).
Every training-step figure of ``gatedattn bench`` goes through ``train_step``, ours and
the transformers model's alike.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from gatedattn.precision import Precision
from gatedattn.train import TrainConfig, build_optimizer

GRAD_CLIP = 1.0


def bench_optimizer(model: nn.Module):
    """The optimizer ``gatedattn train`` builds with its default settings (AdamW)."""
    return build_optimizer(model, TrainConfig())


def train_step(model: nn.Module, loss_fn: Callable[[torch.Tensor], torch.Tensor], batch: torch.Tensor,
               optimizer, precision: Precision, device: torch.device) -> torch.Tensor:
    """One update of ``model`` on ``batch`` (B, T+1); ``loss_fn(batch)`` is the model's fp32
    next-token loss (possibly compiled). Returns the loss, detached."""
    with precision.autocast(device):
        loss = loss_fn(batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()
