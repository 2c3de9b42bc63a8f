"""Run a frozen model under window attention, with the first position kept or dropped.

:func:`attention_mode` swaps every layer's attention core for a
:class:`~gatedattn.layers.core.WindowCore` for the body of a ``with``. The arms train parameters
only in the layers from ``start`` up, so the layers below run once per window and mode
(:func:`prefix`) and training runs the rest (:func:`tail_losses`) from that cached
residual stream: same numbers as the whole model, at a fraction of the cost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from gatedattn.layers.core import WindowCore
from gatedattn.models.lm import GatedLM

# the two arms of every comparison: the first position kept in each query's window, or dropped from it
KEPT, DROPPED = "keep", "drop"


@contextlib.contextmanager
def attention_mode(model: GatedLM, window: int, first: str) -> Iterator[None]:
    """Every layer of ``model`` attends with ``WindowCore(window, first)`` within the body."""
    with contextlib.ExitStack() as stack:
        for block in model.blocks:
            stack.enter_context(block.attn.with_core(WindowCore(window, first)))
        yield


def prefix(model: GatedLM, inputs: Tensor, start: int, window: int, first: str, chunk: int = 4) -> Tensor:
    """The residual stream (N, T, C) entering block ``start`` for the inputs (N, T),
    without gradients, ``chunk`` windows at a time."""
    out = []
    with torch.no_grad(), attention_mode(model, window, first):
        for rows in inputs.split(chunk):
            x = model.embed(rows)
            for block in model.blocks[:start]:
                x = block(x)
            out.append(x)
    return torch.cat(out)


def tail_losses(model: GatedLM, hidden: Tensor, targets: Tensor, start: int, window: int, first: str) -> Tensor:
    """Mean next-token loss (N,) of each window, from the residual stream ``hidden``
    (N, T, C) entering block ``start``, against ``targets`` (N, T). Differentiable."""
    with attention_mode(model, window, first):
        x = hidden
        for block in model.blocks[start:]:
            x = block(x)
        h = model.norm(x)  # (N, T, C)
    return model.head_loss(h, targets, reduction="none").view(targets.shape).mean(-1)


def window_losses(model: GatedLM, rows: Tensor, window: int, first: str, chunk: int = 4) -> Tensor:
    """Mean next-token loss (N,) of each window row (N, T + 1) through the whole model
    (inputs ``rows[:, :-1]``, targets ``rows[:, 1:]``), without gradients."""
    with torch.no_grad():
        return torch.cat([tail_losses(model, prefix(model, part[:, :-1], 0, window, first), part[:, 1:], 0, window,
                                      first) for part in rows.split(chunk)])


def position_losses(model: GatedLM, row: Tensor, window: int, first: str) -> Tensor:
    """Next-token loss at every position (T,) of one long window row (1, T + 1)."""
    with torch.no_grad(), attention_mode(model, window, first):
        logits = model(row[:, :-1])[0]
    return F.cross_entropy(logits.float(), row[0, 1:], reduction="none")
