"""A training step as a function, for whoever times steps (the studies' budget planners,
the reproduction's overhead rounds, ``bench``): the trainer's own ``train_step`` on a
fresh trainer, so that what is timed is what a run executes."""

from __future__ import annotations

from typing import Callable

from gatedattn.train.config import TrainConfig
from gatedattn.train.trainer import Trainer


def train_step_fn(cfg: TrainConfig, data) -> Callable[[], None]:
    """``cfg``'s training step on ``data`` (a ``TokenData``) as a function of no arguments;
    each call runs one more step of the same trainer (its first call pays for compiling
    when ``cfg.compile`` is on)."""
    trainer = Trainer(cfg, data)
    return trainer.train_step
