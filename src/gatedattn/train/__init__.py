"""Training: ``train(TrainConfig)`` for one run (single process or ``torchrun``), the
``Trainer`` whose ``train_step`` it repeats, ``sweep`` for a grid of variants x learning
rates, and the ``gatedattn train`` / ``sweep`` commands.

A run directory holds ``config.json``, ``code_version``, ``env.json``, ``metrics.jsonl``,
``metrics.csv``, ``summary.json``, ``checkpoints/`` and ``final/`` (a ``GatedLM``
directory with the tokenizer).
"""

from gatedattn.train.config import ModelRecipe, TrainConfig, parse_sets, settable_keys
from gatedattn.train.loop import TrainResult, train
from gatedattn.train.optim import build_optimizer, lr_at, lr_schedule
from gatedattn.train.sweep import sweep

__all__ = [
    "ModelRecipe",
    "TrainConfig",
    "TrainResult",
    "build_optimizer",
    "lr_at",
    "lr_schedule",
    "parse_sets",
    "settable_keys",
    "sweep",
    "train",
]
