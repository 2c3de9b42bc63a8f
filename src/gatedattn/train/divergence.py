"""When a training run counts as diverged: the one rule, for the trainer and for analysis.

A step diverges the run when

- its loss or gradient norm is non-finite (with ``skip_nonfinite`` the update is skipped
  instead, and only ``MAX_CONSECUTIVE_SKIPS`` such steps in a row diverge the run), or
- its loss, finite, exceeds ``diverge_factor`` times the first finite loss of the run.

:func:`step_reason` judges one step as the trainer sees it; :func:`first_divergence`
replays the rule over a recorded loss curve (no skipping).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MAX_CONSECUTIVE_SKIPS = 10  # this many non-finite steps in a row (skip_nonfinite) = diverged
DIVERGE_FACTOR = 2.0  # TrainConfig.diverge_factor's default


def step_reason(loss: float, grad_norm: float, *, first_loss: float | None, diverge_factor: float,
                skip_nonfinite: bool = False, consecutive_skipped: int = 0) -> str | None:
    """Why this step diverges the run, or None. ``first_loss`` is the first finite loss
    (this step's own when it is the first); ``consecutive_skipped`` counts this step."""
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        if not skip_nonfinite:
            return f"non-finite loss {loss} / grad norm {grad_norm}"
        if consecutive_skipped >= MAX_CONSECUTIVE_SKIPS:
            return f"{MAX_CONSECUTIVE_SKIPS} consecutive non-finite steps"
        return None
    if first_loss is not None and loss > diverge_factor * first_loss:
        return f"loss {loss:.4g} > diverge_factor {diverge_factor:g} x first loss {first_loss:.4g}"
    return None


def first_divergence(losses: Sequence[float], diverge_factor: float = DIVERGE_FACTOR) -> tuple[int, str] | None:
    """(index, reason) of the first step of ``losses`` that diverges the run, else None."""
    first: float | None = None
    for i, loss in enumerate(float(x) for x in losses):
        if first is None and math.isfinite(loss):
            first = loss
        reason = step_reason(loss, 0.0, first_loss=first, diverge_factor=diverge_factor)
        if reason is not None:
            return i, reason
    return None
