"""The speed and memory targets of the gated layers, checked against one run's figures.

Each target is a ratio read from the results of one shape and a threshold; ``evaluate``
returns one row per (target, shape) with the measured ratio, its spread and a verdict.

A ratio of two timed workloads carries the noise of both: its spread is the two relative
interquartile ranges combined (``timing.ratio_spread``); memory and FLOP ratios are exact
(spread 0). The verdict is ``met`` or ``missed`` when the threshold lies outside
``measured x (1 +- spread)``, ``within noise`` when it lies inside (the run cannot tell),
and ``not measured`` where a workload the target needs was not run or its figure is
undefined. ``met`` keeps the bare comparison of the measured ratio (None when not measured).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable, NamedTuple

from gatedattn.bench.workloads import HF_QWEN3, HF_QWEN3_NEXT, OURS_QWEN3_NEXT
from gatedattn.infra.timing import ratio_spread

_OPS = {"<": operator.lt, "<=": operator.le, ">=": operator.ge}
MET, MISSED, WITHIN_NOISE, NOT_MEASURED = "met", "missed", "within noise", "not measured"
VERDICTS = (MET, MISSED, WITHIN_NOISE, NOT_MEASURED)


class Measured(NamedTuple):
    """A ratio and its spread (relative: 0.05 is 5 %)."""

    value: float
    spread: float


def _finite(x) -> float | None:
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _row(shape: dict, kind: str, name: str) -> dict | None:
    return shape.get(kind, {}).get(name)


def _get(shape: dict, kind: str, name: str, key: str) -> float | None:
    row = _row(shape, kind, name)
    return None if row is None else _finite(row.get(key))


def _spread(shape: dict, kind: str, name: str, key: str = "iqr_over_median") -> float | None:
    row = _row(shape, kind, name)
    return None if row is None else _finite(row.get(key, row.get("iqr_over_median")))


def _div(a: Measured | None, b: Measured | None) -> Measured | None:
    if a is None or b is None or b.value == 0:
        return None
    return Measured(a.value / b.value, ratio_spread(a.spread, b.spread))


def _timed(kind: str, name: str, key: str = "median_s") -> Callable[[dict], Measured | None]:
    """A timed figure of one workload with its spread (tokens/s of decoding have their own)."""
    def read(s: dict) -> Measured | None:
        value = _get(s, kind, name, key)
        spread = _spread(s, kind, name, "tokens_per_s_spread" if key == "tokens_per_s" else "iqr_over_median")
        return None if value is None or spread is None else Measured(value, spread)
    return read


def _timed_ratio(kind: str, a: str, b: str, key: str = "median_s") -> Callable[[dict], Measured | None]:
    return lambda s: _div(_timed(kind, a, key)(s), _timed(kind, b, key)(s))


def _exact(kind: str, name: str, key: str) -> Callable[[dict], Measured | None]:
    """A ratio that does not vary between runs (memory, FLOPs)."""
    def read(s: dict) -> Measured | None:
        value = _get(s, kind, name, key)
        return None if value is None else Measured(value, 0.0)
    return read


def verdict(value: float | None, spread: float | None, op: str, threshold: float) -> str:
    """``met`` / ``missed`` when the threshold lies outside ``value x (1 +- spread)``,
    ``within noise`` when inside, ``not measured`` without a value."""
    if value is None:
        return NOT_MEASURED
    if spread and abs(value - threshold) <= abs(value) * spread:
        return WITHIN_NOISE
    return MET if _OPS[op](value, threshold) else MISSED


@dataclass(frozen=True)
class Target:
    id: str
    description: str
    ratio: str  # what the measured number is
    op: str
    threshold: float
    measure: Callable[[dict], Measured | None]
    shapes: tuple[str, ...] | None = None  # None: every shape

    def check(self, shape_name: str, shape: dict) -> dict:
        m = self.measure(shape)
        value, spread = (None, None) if m is None else (_finite(m.value), m.spread)
        met = None if value is None else bool(_OPS[self.op](value, self.threshold))
        return {"id": self.id, "shape": shape_name, "description": self.description, "ratio": self.ratio,
                "measured": value, "spread": None if value is None else spread, "op": self.op,
                "threshold": self.threshold, "met": met,
                "verdict": verdict(value, spread, self.op, self.threshold)}


TARGETS = (
    Target("layer-vs-qwen3next", "our gated layer faster than transformers Qwen3NextAttention (fwd+bwd)",
           "time ours / HF", "<", 1.0, _timed_ratio("layer", OURS_QWEN3_NEXT, HF_QWEN3_NEXT)),
    Target("train-vs-qwen3", "our training step >= 1.15x transformers Qwen3ForCausalLM tokens/s",
           "tokens/s ours / HF", ">=", 1.15, _timed_ratio("train", "baseline", HF_QWEN3, "tokens_per_s")),
    Target("decode-vs-hf-generate", "our cached greedy decoding >= transformers generate tokens/s",
           "tokens/s ours / HF", ">=", 1.0, _timed_ratio("decode", "baseline", HF_QWEN3, "tokens_per_s")),
    Target("headwise-layer", "gated-headwise layer time <= 1.02x baseline", "time / baseline", "<=", 1.02,
           _timed_ratio("layer", "gated-headwise", "baseline")),
    Target("gated-vs-flops", "gated layer time <= 1.1x what its extra FLOPs predict",
           "(time / baseline) / (FLOPs / baseline)", "<=", 1.1,
           lambda s: _div(_timed_ratio("layer", "gated", "baseline")(s), _exact("layer", "gated", "flop_ratio")(s))),
    Target("hyga-lowrank-step", "hyga-lowrank training step time <= gated's", "step time hyga-lowrank / gated",
           "<=", 1.0, _timed_ratio("train", "hyga-lowrank", "gated")),
    Target("gated-train-memory", "gated peak training memory <= 1.08x baseline", "memory / baseline", "<=", 1.08,
           _exact("train", "gated", "memory_ratio")),
    Target("sink-long-time", "sink layer time at long context <= 1.05x baseline", "time / baseline", "<=", 1.05,
           _timed_ratio("layer", "sink", "baseline"), ("long",)),
    Target("sink-long-memory", "sink layer memory at long context within 5% of baseline", "memory / baseline",
           "<=", 1.05, _exact("layer", "sink", "memory_ratio"), ("long",)),
    Target("hyga-sink-long-time", "hyga-sink layer time at long context <= 1.05x baseline", "time / baseline",
           "<=", 1.05, _timed_ratio("layer", "hyga-sink", "baseline"), ("long",)),
    Target("hyga-sink-long-memory", "hyga-sink layer memory at long context within 5% of hyga (the same gates "
           "without the sink)", "memory hyga-sink / hyga", "<=", 1.05,
           lambda s: _div(_exact("layer", "hyga-sink", "memory_bytes")(s), _exact("layer", "hyga", "memory_bytes")(s)),
           ("long",)),
)


def evaluate(shapes: dict[str, dict]) -> list[dict]:
    """One row per target and shape it applies to, in the order of ``TARGETS``."""
    return [t.check(name, shape) for t in TARGETS for name, shape in shapes.items()
            if t.shapes is None or name in t.shapes]
