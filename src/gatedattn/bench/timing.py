"""Interleaved repeated timing and its summary (median and spread).

``interleaved_times`` runs every workload ``warmup`` times, then ``repeats`` rounds of
A, B, C, A, B, C, ... so slow drifts of the machine (other processes, clock changes,
thermal state) reach every workload alike instead of whichever ran last. ``summarize``
turns the times into a median and the interquartile range relative to that median,
the noise a reader should expect on any ratio built from them.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping


@dataclass(frozen=True)
class Summary:
    """Times of one workload: ``median``, quartiles ``q1`` / ``q3`` (seconds), ``n`` repeats."""

    median: float
    q1: float
    q3: float
    n: int

    @property
    def spread(self) -> float:
        """Interquartile range over the median (0 when every repeat took the same time)."""
        return (self.q3 - self.q1) / self.median if self.median > 0 else 0.0

    def to_dict(self) -> dict:
        return {"median_s": self.median, "q1_s": self.q1, "q3_s": self.q3, "n": self.n,
                "iqr_over_median": self.spread}


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(q1, median, q3) by linear interpolation between order statistics; one value gives
    three equal numbers."""
    if not values:
        raise ValueError("quartiles of no values")
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def summarize(times: list[float]) -> Summary:
    q1, med, q3 = quartiles(times)
    return Summary(median=med, q1=q1, q3=q3, n=len(times))


def interleaved_times(
    workloads: Mapping[str, Callable[[], object]],
    *,
    repeats: int,
    warmup: int = 1,
    sync: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds of each call of each workload, ``repeats`` per workload, taken in rounds
    (every workload once per round, in the mapping's order) after ``warmup`` untimed rounds.
    ``sync`` runs before reading the clock on both sides of a call (CUDA synchronisation)."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1")
    if warmup < 0:
        raise ValueError(f"warmup={warmup} must be >= 0")
    for _ in range(warmup):
        for fn in workloads.values():
            fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in workloads}
    for _ in range(repeats):
        for name, fn in workloads.items():
            sync()
            t0 = clock()
            fn()
            sync()
            times[name].append(clock() - t0)
    return times
