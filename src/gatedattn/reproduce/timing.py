"""Wall-time comparisons that carry their own noise estimate.

:func:`interleaved_times` runs several step functions in rounds, alternating their order
from round to round, so slow drifts of the machine (other processes, clock changes) fall
on every variant alike; the per-round samples let a claim estimate the noise of the
difference (see ``claims._overhead``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping


def interleaved_times(steps: Mapping[str, Callable[[], None]], *, rounds: int = 7, repeats: int = 3,
                      warmup: int = 2) -> dict[str, list[float]]:
    """Seconds per call of each function, one sample per round.

    Each function is first called ``warmup`` times; then, for each of ``rounds`` rounds,
    every function is timed over ``repeats`` back-to-back calls (the sample is their mean),
    in the given order on even rounds and reversed on odd ones."""
    if rounds < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"rounds and repeats must be >= 1 and warmup >= 0, got {rounds}, {repeats}, {warmup}")
    names = list(steps)
    for name in names:
        for _ in range(warmup):
            steps[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            for _ in range(repeats):
                steps[name]()
            samples[name].append((time.perf_counter() - t0) / repeats)
    return samples
