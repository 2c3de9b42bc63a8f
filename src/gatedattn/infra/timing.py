"""Wall-time comparisons that carry their own noise estimate.

``interleaved_times`` times several workloads in rounds -- every workload once per round,
in the given order on even rounds and reversed on odd ones -- so slow drifts of the machine
(other processes, clock changes, thermal state) and the cost of running first or last in a
round reach every workload alike. The young garbage generations are collected before each
sample and the collector is off while it runs. ``summarize`` turns the samples into a median and the
interquartile range relative to that median: the noise a reader should expect on any
ratio built from them. ``gatedattn bench`` and the reproduction's overhead claim both use
it. ``times_until_steady`` keeps adding rounds until every workload's spread is under a
limit or a time budget is spent (``gatedattn bench``); ``ratio_spread`` is the spread of a
ratio of two medians.
"""

from __future__ import annotations

import gc
import math
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
    per_sample: int = 1,
    sync: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds per call of each workload: ``repeats`` samples per workload, taken in rounds
    after ``warmup`` untimed rounds; a sample is the mean of ``per_sample`` back-to-back
    calls. Odd rounds run the workloads in reverse order. ``sync`` runs before reading the
    clock on both sides of a sample (CUDA synchronisation)."""
    return times_until_steady(workloads, repeats=repeats, max_spread=None, time_cap_s=0.0, warmup=warmup,
                              per_sample=per_sample, sync=sync, clock=clock)


def times_until_steady(
    workloads: Mapping[str, Callable[[], object]],
    *,
    repeats: int,
    max_spread: float | None,
    time_cap_s: float,
    warmup: int = 1,
    per_sample: int = 1,
    sync: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """:func:`interleaved_times` that goes on past ``repeats`` rounds while some workload's
    spread (:attr:`Summary.spread`) is ``max_spread`` or more, until the timed rounds have
    taken ``time_cap_s`` seconds on ``clock`` (the round under way finishes). ``max_spread``
    None or ``time_cap_s`` 0 runs exactly ``repeats`` rounds."""
    if repeats < 1 or per_sample < 1:
        raise ValueError(f"repeats={repeats} and per_sample={per_sample} must be >= 1")
    if warmup < 0:
        raise ValueError(f"warmup={warmup} must be >= 0")
    if time_cap_s < 0 or (max_spread is not None and max_spread <= 0):
        raise ValueError(f"time_cap_s={time_cap_s} must be >= 0 and max_spread={max_spread} > 0 or None")
    names = list(workloads)
    for _ in range(warmup):
        for fn in workloads.values():
            fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in names}
    start, r = clock(), 0
    while True:
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(_sample(workloads[name], per_sample, sync, clock))
        r += 1
        if r < repeats:
            continue
        if max_spread is None or clock() - start >= time_cap_s:
            return times
        if all(summarize(t).spread < max_spread for t in times.values()):
            return times


def ratio_spread(a: float | None, b: float | None) -> float | None:
    """The spread of a ratio of two medians whose spreads are ``a`` and ``b`` (relative
    interquartile ranges, combined as independent errors); None when either is unknown."""
    if a is None or b is None:
        return None
    return math.hypot(a, b)


def median_times(workloads: Mapping[str, Callable[[], object]], *, repeats: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each workload over ``repeats`` interleaved rounds
    (:func:`interleaved_times`): load on the machine while timing moves every workload
    alike, and the median drops a burst."""
    samples = interleaved_times(workloads, repeats=repeats, warmup=warmup)
    return {name: statistics.median(s) for name, s in samples.items()}


def _sample(fn: Callable[[], object], calls: int, sync: Callable[[], None], clock: Callable[[], float]) -> float:
    # the young generations hold what the workload left; a full collection would walk the
    # whole heap (slow in a big process) for garbage that is not the workload's
    gc.collect(1)
    enabled = gc.isenabled()
    gc.disable()
    try:
        sync()
        t0 = clock()
        for _ in range(calls):
            fn()
        sync()
        return (clock() - t0) / calls
    finally:
        if enabled:
            gc.enable()
