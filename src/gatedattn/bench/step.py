"""Training steps for timing: the trainer's own ``Trainer.train_step``.

``step_trainer(model, batch, ...)`` builds a :class:`~gatedattn.train.trainer.Trainer` around a
given model (ours, or transformers' through :class:`LogitsOf`) that reads one fixed batch: so
every training-step figure of ``gatedattn bench`` is the trainer's step -- forward under the
precision's autocast, fp32 cross-entropy, backward, gradient clipping at 1.0 (the default
``TrainConfig.grad_clip``), the run's optimizer (``build_optimizer``), the non-finite and spike
bookkeeping -- for every model alike; only data loading is left out.
"""

from __future__ import annotations

import torch
from torch import nn

from gatedattn.infra.precision import Precision
from gatedattn.train import TrainConfig
from gatedattn.train.trainer import Trainer


class _OneBatch:
    """What the trainer reads from its data, reduced to one fixed (B, T+1) batch."""

    def __init__(self, batch: torch.Tensor, vocab_size: int):
        self.batch, self.vocab_size = batch, vocab_size
        self.bos_id = self.eos_id = None

    def train_batch(self, step: int, rows, *, global_batch: int, seq_len: int, seed: int) -> torch.Tensor:
        return self.batch


class LogitsOf(nn.Module):
    """A transformers causal LM as the trainer sees a model: ids (B, T) -> logits (B, T, V)."""

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.hf = hf_model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=ids, use_cache=False).logits


def step_trainer(model: nn.Module, batch: torch.Tensor, vocab_size: int, precision: Precision,
                 device: torch.device) -> Trainer:
    """A trainer of ``model`` (already on ``device``) whose every ``train_step`` reads ``batch``."""
    cfg = TrainConfig(seq_len=batch.shape[1] - 1, micro_batch=batch.shape[0], steps=1_000_000_000,
                      warmup_steps=10, dtype=precision.dtype, device=device.type, eval_every=0,
                      ckpt_every=0, progress=False, tensorboard=False,
                      compile="off")  # bench compiles the model itself (--compile)
    return Trainer(cfg, _OneBatch(batch.to(device), vocab_size), model=model)
